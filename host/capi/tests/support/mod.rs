//! Where the tests find the crate and what cargo built. Each test binary
//! uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn repo() -> PathBuf {
    crate_dir().join("../..")
}

/// target/<profile>: the test binary lives in its `deps/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_owned()
}

/// target/<profile> with `libcocoon_fixup.a` and `.so`, the
/// `cocoon-fixup` binary and `conformance-world` of this checkout in it,
/// fresh.
///
/// `cargo test` builds this crate's library for its tests only as an rlib,
/// so the archive and the shared library are built here, once per test
/// binary, by `cargo build --workspace --lib --tests`: the same features
/// as `cargo test --workspace`, so after it nothing but the two libraries
/// is compiled (a narrower `cargo test -p fixup-capi` resolves features
/// differently and compiles more, once).
pub fn built() -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    let profile = profile_dir();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .args(["build", "--workspace", "--lib", "--tests"])
            .current_dir(repo());
        if profile.ends_with("release") {
            build.arg("--release");
        }
        let status = build.status().expect("running cargo");
        assert!(status.success(), "building libcocoon_fixup failed");
    });
    for file in [
        "libcocoon_fixup.a",
        "libcocoon_fixup.so",
        "cocoon-fixup",
        "conformance-world",
        "sac-sim",
    ] {
        assert!(
            profile.join(file).exists(),
            "{} is missing after the build",
            profile.join(file).display()
        );
    }
    profile
}

/// Whether the Go toolchain is here (its version said on stderr); without
/// it `false`, said loudly past the test harness's capture so that a skip
/// is never quiet, and a failure when `COCOON_FIXUP_REQUIRE_GO=1` (set by
/// `.ci/run`). `what` names the tests that need it.
pub fn have_go(what: &str) -> bool {
    use std::io::Write as _;
    match Command::new("go").arg("version").output() {
        Ok(version) if version.status.success() => {
            eprintln!("{}", String::from_utf8_lossy(&version.stdout).trim());
            true
        }
        _ => {
            assert!(
                std::env::var_os("COCOON_FIXUP_REQUIRE_GO").is_none_or(|v| v != "1"),
                "the Go toolchain is not installed and COCOON_FIXUP_REQUIRE_GO=1 (Go 1.19 or later; on Debian `apt-get install golang-go`)"
            );
            let _ = writeln!(
                std::io::stderr(),
                "\n*** SKIPPED: {what} need the Go toolchain (Go 1.19 or later; on Debian `apt-get install golang-go`), which is not installed. `.ci/run` installs it and requires them. ***\n"
            );
            false
        }
    }
}
