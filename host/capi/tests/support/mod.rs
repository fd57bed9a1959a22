//! Where the tests find the crate and what cargo built.

use std::path::{Path, PathBuf};

pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// target/<profile>, where cargo put `libcocoon_fixup.a` and the
/// binaries: the test binary lives in its `deps/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_owned()
}
