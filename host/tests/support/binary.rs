//! The real `cocoon-fixup` binary as a child process, for tests that run it
//! against the fake API server (`fake_api.rs`) and `fake-cocoon`.

use std::path::Path;
use std::process::Stdio;

use tokio::process::Command;

/// `cocoon-fixup --config DIR/config.toml ARGS...` with every path pointed
/// into `dir`: `cocoon` (the fake CLI, or a wrapper around it), the cocoon
/// root, `leases.json`, `plugins/`, `cache/`; a clean environment with
/// `KUBECONFIG=kubeconfig` and `COCOON_FIXUP_LOG=info`; stdin closed; killed
/// when dropped. `args` is the subcommand and its own flags; more can be
/// added to the command.
pub fn cocoon_fixup(dir: &Path, kubeconfig: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cocoon-fixup"));
    command
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir)
        .env("KUBECONFIG", kubeconfig)
        .env("COCOON_FIXUP_LOG", "info")
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
