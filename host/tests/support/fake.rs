//! Finding the `fake-cocoon` binary (tests/fake-cocoon) from a host test.
//!
//! `fake-cocoon` is a binary of another package, so `CARGO_BIN_EXE_*` does
//! not name it. The first caller runs `cargo build -p fake-cocoon
//! --message-format=json` (the `cargo` that built these tests, on this
//! workspace's manifest) and takes the path from the compiler-artifact
//! message, which is right whatever the target directory or profile; the
//! build is a no-op when the binary is fresh. `FAKE_COCOON_BIN` names a
//! built binary and skips the build. (`tests/cocoon.rs` does the same.)

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

/// The path of the built `fake-cocoon` executable.
pub fn fake_cocoon() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("FAKE_COCOON_BIN") {
            return bin.into();
        }
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
        let out = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "fake-cocoon"])
            .arg("--message-format=json-render-diagnostics")
            .arg("--manifest-path")
            .arg(&manifest)
            .stderr(Stdio::inherit())
            .output()
            .expect("cargo runs");
        assert!(
            out.status.success(),
            "`cargo build -p fake-cocoon` failed ({}); see its errors above",
            out.status
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "fake-cocoon")
            .find_map(|m| m["executable"].as_str().map(PathBuf::from))
            .expect("cargo reported the fake-cocoon executable")
    })
}
