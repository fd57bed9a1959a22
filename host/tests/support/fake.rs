//! Finding executables of other packages of this workspace from a test:
//! `fake-cocoon` (tests/fake-cocoon) from the host's tests, and
//! `cocoon-fixup` from the tests of another package (`binary.rs`).
//!
//! `CARGO_BIN_EXE_*` names only the binaries of the package under test.
//! The first caller for an executable runs `cargo build -p PACKAGE --bin
//! BIN --message-format=json` (the `cargo` that built these tests, on this
//! workspace's manifest) and takes the path from the compiler-artifact
//! message, which is right whatever the target directory or profile; the
//! build is a no-op when the binary is fresh. `FAKE_COCOON_BIN` names a
//! built `fake-cocoon` and skips the build. (`tests/cocoon.rs` does the
//! same.)

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

/// The path of the built `fake-cocoon` executable.
pub fn fake_cocoon() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| workspace_binary("fake-cocoon", "fake-cocoon", "FAKE_COCOON_BIN"))
}

/// The path of executable `bin` of workspace package `package`, built
/// first if it is not fresh; the environment variable `built` names one
/// already built instead.
pub fn workspace_binary(package: &str, bin: &str, built: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(built) {
        return path.into();
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let mut cargo = Command::new(env!("CARGO"));
    // What cargo set for this test process is no setting of the build:
    // some build scripts watch such variables (ring's, for one, watches
    // CARGO_MANIFEST_DIR), and a value seen here would make the next
    // ordinary build compile them and all that depends on them again.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_PKG_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "OUT_DIR",
            ]
            .contains(&key.as_ref())
        {
            cargo.env_remove(key.as_ref());
        }
    }
    let out = cargo
        .args(["build", "--quiet", "-p", package, "--bin", bin])
        .arg("--message-format=json-render-diagnostics")
        .arg("--manifest-path")
        .arg(&manifest)
        .stderr(Stdio::inherit())
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "`cargo build -p {package} --bin {bin}` failed ({}); see its errors above",
        out.status
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == bin)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo reported the {bin} executable"))
}
