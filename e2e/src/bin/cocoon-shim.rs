//! A `cocoon`-compatible CLI for the end-to-end suite, run by the host's
//! real `CocoonCli` (through a wrapper script that passes `--root`):
//!
//! ```text
//! cocoon-shim --root DIR vm exec <id> -- <argv...>
//! cocoon-shim --root DIR vm inspect --json <id>
//! ```
//!
//! - `vm exec` hands argv to the guest agent of VM `<id>` unchanged
//!   (`guest-exec` with path = argv[0], arg = argv[1..], output captured),
//!   writes the guest's stdout and stderr to its own, and exits with the
//!   guest command's exit code (128 + signal when a signal ended it). So
//!   the exact bytes the host sends are what the guest runs.
//! - `vm inspect --json` prints `<root>/run/<backend>/<id>/inspect.json`.
//! - Anything else, or a failure to reach the guest, exits 1 with a message
//!   on stderr, as cocoon does.
//!
//! Every call appends one line to `<root>/shim.log`: what was called, its
//! exit code, how long it took and when it ended.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use fixup_e2e::qga::Agent;
use fixup_e2e::state::{self, INSPECT_FILE, QGA_SOCKET, SHIM_LOG};

/// The longest a guest command may run (10 min). The host's own exec
/// timeout (`--exec-timeout`, 90 s) kills the shim long before; this only
/// bounds a shim started by hand.
const EXEC_LIMIT: Duration = Duration::from_secs(600);

/// How long the agent may take to answer the synchronisation (10 s).
const CONNECT_LIMIT: Duration = Duration::from_secs(10);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (root, rest) = match args.as_slice() {
        [flag, root, rest @ ..] if flag == "--root" => (PathBuf::from(root), rest),
        _ => return usage(),
    };
    let started = Instant::now();
    let (status, what) = match rest {
        [vm, exec, id, dashes, argv @ ..] if vm == "vm" && exec == "exec" && dashes == "--" => {
            (vm_exec(&root, id, argv), format!("exec {id} {argv:?}"))
        }
        [vm, inspect, json, id] if vm == "vm" && inspect == "inspect" && json == "--json" => {
            (vm_inspect(&root, id), format!("inspect {id}"))
        }
        _ => return usage(),
    };
    log(&root, &what, &status, started.elapsed());
    match status {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(message) => {
            eprintln!("cocoon: {message}");
            ExitCode::from(1)
        }
    }
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: cocoon-shim --root DIR vm exec <id> -- <argv...>\n       cocoon-shim --root DIR vm inspect --json <id>"
    );
    ExitCode::from(1)
}

fn vm_dir(root: &Path, id: &str) -> Result<PathBuf, String> {
    state::find_vm(root, id).ok_or_else(|| format!("vm {id:?} not found below {}", root.display()))
}

fn vm_exec(root: &Path, id: &str, argv: &[String]) -> Result<i32, String> {
    let dir = vm_dir(root, id)?;
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| "vm exec: no command after --".to_owned())?;
    let mut agent = Agent::connect(&dir.join(QGA_SOCKET), CONNECT_LIMIT)
        .map_err(|e| format!("vm exec {id}: {e}"))?;
    let exit = agent
        .exec(program, args, EXEC_LIMIT)
        .map_err(|e| format!("vm exec {id}: {e}"))?;
    // A closed pipe on our side is the caller's business, not the guest's.
    let _ = std::io::stdout().write_all(&exit.stdout);
    let _ = std::io::stderr().write_all(&exit.stderr);
    Ok(exit.cli_status())
}

fn vm_inspect(root: &Path, id: &str) -> Result<i32, String> {
    let file = vm_dir(root, id)?.join(INSPECT_FILE);
    let json =
        std::fs::read(&file).map_err(|e| format!("vm inspect {id}: {}: {e}", file.display()))?;
    let _ = std::io::stdout().write_all(&json);
    Ok(0)
}

fn log(root: &Path, what: &str, status: &Result<i32, String>, took: Duration) {
    let outcome = match status {
        Ok(code) => format!("exit {code}"),
        Err(e) => format!("error: {e}"),
    };
    // When it ended (Unix milliseconds) and how long it took (seconds):
    // the harness reads both to tell the guest's time from the host's.
    let ended = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let line = format!(
        "{what} -> {outcome} in {:.3}s at {ended}\n",
        took.as_secs_f64()
    );
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join(SHIM_LOG))
    {
        let _ = f.write_all(line.as_bytes());
    }
}
