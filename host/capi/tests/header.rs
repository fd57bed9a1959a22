//! The checked-in C headers (`include/cocoon_fixup.h`, which C callers
//! include, and the Go module's own copy, `go/cocoonfixup/include/`, so a
//! vendored Go build finds it) are what cbindgen makes of the library
//! now. `BLESS=1` rewrites them.

use std::path::{Path, PathBuf};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fresh_header() -> String {
    let dir = crate_dir();
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .with_src(dir.join("src/ops.rs"))
        .generate()
        .expect("cbindgen parses the crate")
        .write(&mut out);
    String::from_utf8(out).expect("the header is UTF-8")
}

fn check(path: &Path, fresh: &str) {
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(path, fresh).unwrap();
        return;
    }
    let current = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        current == fresh,
        "{} is stale: the library's C ABI changed. Regenerate it with `BLESS=1 cargo test -p fixup-capi --test header` and review the diff.",
        path.display()
    );
}

#[test]
fn the_checked_in_headers_are_fresh() {
    let fresh = fresh_header();
    for gone in ["cf_decide", "cf_attempt", "cf_verdict", "cf_values"] {
        assert!(
            !fresh.contains(&format!("CfStatus {gone}(")),
            "{gone} is declared in the header: the task is the one way to embed"
        );
    }
    for symbol in [
        "cf_abi_version",
        "cf_planner_new",
        "cf_planner_free",
        "cf_plan",
        "cf_task_start",
        "cf_task_next",
        "cf_task_cancel",
        "cf_task_free",
        "cf_console_open",
        "cf_console_set",
        "cf_string_free",
        "cf_call",
        "CF_OK",
        "CF_PANIC",
        "CF_ABI_VERSION",
    ] {
        assert!(fresh.contains(symbol), "{symbol} is missing from\n{fresh}");
    }
    check(&crate_dir().join("include/cocoon_fixup.h"), &fresh);
    check(
        &crate_dir().join("../../go/cocoonfixup/include/cocoon_fixup.h"),
        &fresh,
    );
}
