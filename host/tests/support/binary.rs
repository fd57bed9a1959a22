//! The real `cocoon-fixup` binary as a child process, for tests that run it
//! against the fake API server (`fake_api.rs`) and `fake-cocoon`.
//!
//! Shared with the tests crate (`tests/tests/serve_reload.rs` includes
//! this file and `fake.rs` by `#[path]`, as sibling modules).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;

use tokio::process::Command;

/// `cocoon-fixup --config DIR/config.toml ARGS...` with every path pointed
/// into `dir`: `cocoon` (the fake CLI, or a wrapper around it), the cocoon
/// root, `leases.json`, `plugins/`, `cache/`, the state directory `state/`
/// (by its environment variable); a clean environment with
/// `KUBECONFIG=kubeconfig` and `COCOON_FIXUP_LOG=info`; stdin closed; killed
/// when dropped. `args` is the subcommand and its own flags; more can be
/// added to the command.
pub fn cocoon_fixup(dir: &Path, kubeconfig: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(program());
    command
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir)
        .env("KUBECONFIG", kubeconfig)
        .env("COCOON_FIXUP_LOG", "info")
        // The pods' records stay in the test's directory, never in the
        // machine's (a test run as root would share /var/lib's).
        .env("COCOON_FIXUP_STATE_DIR", dir.join("state"))
        .arg("--config")
        .arg(dir.join("config.toml"))
        .args(args)
        .arg("--cocoon-bin")
        .arg(dir.join("cocoon"))
        .arg("--cocoon-root")
        .arg(dir)
        .arg("--lease-file")
        .arg(dir.join("leases.json"))
        .arg("--plugin-dir")
        .arg(dir.join("plugins"))
        .arg("--cache-dir")
        .arg(dir.join("cache"))
        .arg("--cache-key")
        .arg(dir.join("cache.key"))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// The `cocoon-fixup` executable: cargo's own for the host's tests (the
/// binary's package); for another package's tests, built on first use
/// (`super::fake::workspace_binary`), or the one `COCOON_FIXUP_BIN` names.
pub fn program() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| match option_env!("CARGO_BIN_EXE_cocoon-fixup") {
        Some(bin) => bin.into(),
        None => super::fake::workspace_binary("fixup-host", "cocoon-fixup", "COCOON_FIXUP_BIN"),
    })
}
