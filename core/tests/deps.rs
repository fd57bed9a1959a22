//! fixup-core is the plan path without the daemon: an embedder (the C
//! library `fixup-capi`, a Go caller through it) links it without an async
//! runtime, a Kubernetes client, an HTTP server, a file watcher or a
//! metrics registry. This test reads the normal dependency closure of both
//! crates, for every target, from `cargo tree` and fails when one of the
//! daemon's crates is in it. The tools around the decision (`fixup-kit`:
//! the plugin kit, capture, the template, the conformance replayer) stay
//! out of both too: the runtime carries only what runs.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// The daemon's crates and its tools' crate: they belong to `fixup-host`
/// and the CLI, never to the core or the C library.
const DAEMON_CRATES: [&str; 8] = [
    "fixup-kit",
    "tokio",
    "kube",
    "k8s-openapi",
    "axum",
    "hyper",
    "notify",
    "prometheus-client",
];

/// The names of the packages `package` needs to build and run (normal
/// dependencies, on any target; not dev- or build-dependencies), with
/// features resolved as when it is built alone.
fn normal_closure(package: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let out = Command::new(cargo)
        .args(["tree", "--manifest-path"])
        .arg(&manifest)
        .args([
            "-p", package, "-e", "normal", "--target", "all", "--prefix", "none", "--format", "{p}",
        ])
        .output()
        .expect("run `cargo tree`");
    assert!(
        out.status.success(),
        "`cargo tree -p {package}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("cargo tree prints UTF-8")
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

fn check(package: &str) {
    let closure = normal_closure(package);
    // The reading works: the crate itself and its plugin engine are there.
    assert!(
        closure.contains(package) && closure.contains("wasmtime"),
        "cargo tree's output was not read as expected: {closure:?}"
    );
    let found: Vec<&str> = DAEMON_CRATES
        .into_iter()
        .filter(|name| closure.contains(*name))
        .collect();
    assert!(
        found.is_empty(),
        "{package} depends on {found:?}, which belong to the daemon (fixup-host) or its tools: keep them out of its Cargo.toml, or find which dependency brings them in with `cargo tree -p {package} -e normal -i <crate>`"
    );
}

#[test]
fn the_daemon_crates_stay_out_of_the_core() {
    check("fixup-core");
}

/// The C library links the plan path and nothing of the daemon.
#[test]
fn the_daemon_crates_stay_out_of_the_c_library() {
    check("fixup-capi");
}
