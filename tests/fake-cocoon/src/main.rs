//! `fake-cocoon`: a scripted stand-in for the `cocoon` CLI.
//!
//! Tests point the host's cocoon runner at this binary instead of
//! `/usr/local/bin/cocoon`, so the real process handling (argv, pipes,
//! exit codes, signals, timeouts, process groups) is exercised without a VM.
//!
//! # Commands
//!
//! - `vm exec <id> -- <argv...>`: plays the next `exec` entry.
//! - `vm inspect --json <id>` (or `vm inspect <id> --json`): plays `inspect`.
//!
//! Anything else exits 1 with `Error: ...` on stderr, as the real CLI does
//! for its own failures; so does an `exec` without `--` or without argv.
//!
//! # Scenario
//!
//! A JSON file named by the environment variable `FAKE_COCOON_SCENARIO`;
//! when it is unset, `<argv[0]>.json` (so a test can symlink the binary into
//! its own directory, next to its own scenario, and run it without touching
//! the environment of a shared test process). Every field is optional:
//!
//! ```json
//! {
//!   "state_file": "/tmp/t/state",
//!   "log": "/tmp/t/calls.jsonl",
//!   "exec": [
//!     { "stdout": "text", "stderr": "text", "exit": 3 },
//!     { "signal": 9 },
//!     { "hang": true, "pid_file": "/tmp/t/child.pid" },
//!     { "run": true }
//!   ],
//!   "inspect": { "json": { "id": "vm-1" }, "stderr": "text", "exit": 0 }
//! }
//! ```
//!
//! - `state_file`: the number of `exec` calls so far, persisted across
//!   invocations (created when missing). Without it every call is the
//!   first.
//! - `log`: one JSON line is appended per invocation:
//!   `{"program": argv[0], "argv": [arguments after argv[0]]}`, plus
//!   `"exec_index"` for an exec.
//! - `exec`: entry `i` plays the `i`-th exec call (from 0); the last entry
//!   repeats. An entry first waits until the file `gate` exists (a test
//!   holds the exec there until it has done what it must do meanwhile;
//!   the wait ends with exit 1 when the caller goes away, or after five
//!   minutes),
//!   sleeps `sleep_ms` (a guest that takes its time), writes `stdout` and
//!   `stderr` (verbatim), then does the first that applies of:
//!   - `"hang": true`: sleep forever. With `"pid_file"`, first start a
//!     `sleep 1000` child (same process group and stdio) and write its pid
//!     there (atomically), so a test can check that a timeout killed the
//!     whole group.
//!   - `"signal": n`: die by signal `n` (the process replaces itself with
//!     `sh -c 'kill -n $$'`, keeping its pid).
//!   - `"run": true`: replace itself with the guest argv, run locally
//!     (`argv[0]` looked up in `PATH`, same stdio, so the same exit code or
//!     signal): the plan's real `sh -c SCRIPT` runs against stub commands.
//!   - otherwise, with `"done": true`, write the plan's done marker to
//!     stderr with the nonce the exec argv carries as its last word
//!     (`sh -c SCRIPT sh NONCE`, or `'NONCE'` after a PowerShell script):
//!     a guest that ran every step of the script; without it an exit 0 is
//!     a script a step ended early. An argv without a nonce (a plan run
//!     directly has no markers) gets no marker. Then exit with `exit`
//!     (default 0).
//! - `inspect`: writes `json` (serialised on one line) or `raw` (verbatim)
//!   to stdout, then `stderr`, then exits with `exit` (default 0).
//!   `"hang": true` sleeps forever instead. Without `inspect`, the call
//!   fails like an unknown VM: `Error: vm <id> not found`, exit 1.
//! - `vms`: per-VM answers, `{"<id>": {"exec": [...], "inspect": {...}}}`,
//!   for a scenario with many VMs (a node's worth of pods). A VM listed
//!   here is answered from its own entry only (a field it lacks is
//!   absent, not the top level's), and its exec count is kept in
//!   `<state_file>.<id>`, so VMs do not share a sequence; a VM not listed
//!   is answered from the top level.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::process::CommandExt;
use std::process::{self, Command};
use std::thread;
use std::time::Duration;

use serde_json::{Value, json};

/// What the done marker a plan's exec script writes after its last step
/// starts with, before the exec's nonce (core/src/plan/marker.rs); written
/// here rather than linked, so this stand-in stays a plain binary without
/// the host library.
const MARKER_PREFIX: &str = "cocoon-fixup: ";

/// The nonce an exec argv carries: its last word, 32 lowercase hex digits,
/// single-quoted after a PowerShell script.
fn exec_nonce<'a>(argv: &[&'a str]) -> Option<&'a str> {
    let last = *argv.last()?;
    let bare = last
        .strip_prefix('\'')
        .and_then(|s| s.strip_suffix('\''))
        .unwrap_or(last);
    let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    (bare.len() == 32 && bare.bytes().all(hex)).then_some(bare)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let program = args.first().cloned().unwrap_or_default();
    let scenario = load_scenario(&program).unwrap_or_else(|e| fail(&e));
    let rest: Vec<&str> = args.iter().skip(1).map(String::as_str).collect();
    let scenario = match rest.as_slice() {
        ["vm", "exec", id, ..] => for_vm(scenario, id),
        ["vm", "inspect", flags @ ..] => match flags.iter().find(|a| !a.starts_with('-')) {
            Some(id) => for_vm(scenario, id),
            None => scenario,
        },
        _ => scenario,
    };
    match rest.as_slice() {
        ["vm", "exec", id, "--", argv @ ..] if !argv.is_empty() => {
            exec(&scenario, &program, &rest, id, argv)
        }
        ["vm", "exec", ..] => {
            log(&scenario, &program, &rest, None);
            fail("usage: cocoon vm exec <id> -- <argv...>")
        }
        ["vm", "inspect", flags @ ..] => {
            log(&scenario, &program, &rest, None);
            let ids: Vec<&&str> = flags.iter().filter(|a| !a.starts_with('-')).collect();
            match (flags.contains(&"--json"), ids.as_slice()) {
                (true, [id]) => inspect(&scenario, id),
                _ => fail("usage: cocoon vm inspect --json <id>"),
            }
        }
        _ => {
            log(&scenario, &program, &rest, None);
            fail(&format!("unknown command: {}", rest.join(" ")))
        }
    }
}

fn load_scenario(program: &str) -> Result<Value, String> {
    let path = std::env::var("FAKE_COCOON_SCENARIO").unwrap_or_else(|_| format!("{program}.json"));
    let text = fs::read_to_string(&path).map_err(|e| {
        format!("fake-cocoon: cannot read scenario {path}: {e}; set FAKE_COCOON_SCENARIO")
    })?;
    serde_json::from_str(&text).map_err(|e| format!("fake-cocoon: scenario {path}: {e}"))
}

/// The scenario as VM `id` sees it: its own entry in `vms`, with the
/// top level's `log` and its own exec counter, or the whole scenario.
fn for_vm(scenario: Value, id: &str) -> Value {
    let Some(own) = scenario["vms"].get(id) else {
        return scenario;
    };
    let mut view = json!({
        "exec": own["exec"].clone(),
        "inspect": own["inspect"].clone(),
        "log": scenario["log"].clone(),
    });
    if let Some(state) = scenario["state_file"].as_str() {
        view["state_file"] = json!(format!("{state}.{id}"));
    }
    view
}

fn exec(scenario: &Value, program: &str, rest: &[&str], id: &str, argv: &[&str]) -> ! {
    let entries = scenario["exec"].as_array().cloned().unwrap_or_default();
    let Some(last) = entries.len().checked_sub(1) else {
        log(scenario, program, rest, None);
        fail(&format!("vm {id}: the scenario has no exec entries"))
    };
    let index = next_exec_index(scenario);
    log(scenario, program, rest, Some(index));
    let entry = &entries[index.min(last)];
    if let Some(gate) = entry["gate"].as_str() {
        wait_for_gate(gate);
    }
    if let Some(ms) = entry["sleep_ms"].as_u64() {
        thread::sleep(Duration::from_millis(ms));
    }
    write_outputs(entry);

    if entry["hang"] == true {
        if let Some(pid_file) = entry["pid_file"].as_str() {
            let mut child = Command::new("sleep")
                .arg("1000")
                .spawn()
                .unwrap_or_else(|e| fail(&format!("fake-cocoon: cannot start sleep: {e}")));
            let tmp = format!("{pid_file}.tmp");
            fs::write(&tmp, child.id().to_string())
                .and_then(|()| fs::rename(&tmp, pid_file))
                .unwrap_or_else(|e| fail(&format!("fake-cocoon: {pid_file}: {e}")));
            // Blocks for as long as the child sleeps: the hang is the wait.
            let _ = child.wait();
        }
        hang()
    }
    if let Some(signal) = entry["signal"].as_i64() {
        let e = Command::new("sh")
            .arg("-c")
            .arg(format!("kill -{signal} $$; exit 125"))
            .exec();
        fail(&format!("fake-cocoon: cannot run sh: {e}"))
    }
    if entry["run"] == true {
        let e = Command::new(argv[0]).args(&argv[1..]).exec();
        eprintln!("fake-cocoon: cannot run {}: {e}", argv[0]);
        process::exit(127)
    }
    if entry["done"] == true
        && let Some(nonce) = exec_nonce(argv)
    {
        let mut stderr = io::stderr().lock();
        let _ = writeln!(stderr, "\n{MARKER_PREFIX}{nonce} done");
    }
    process::exit(exit_code(entry))
}

fn inspect(scenario: &Value, id: &str) -> ! {
    let entry = &scenario["inspect"];
    if entry.is_null() {
        fail(&format!("vm {id} not found"))
    }
    if entry["hang"] == true {
        hang()
    }
    let mut stdout = io::stdout().lock();
    let written = match (&entry["json"], entry["raw"].as_str()) {
        (Value::Null, Some(raw)) => stdout.write_all(raw.as_bytes()),
        (Value::Null, None) => Ok(()),
        (json, _) => writeln!(stdout, "{json}"),
    };
    written
        .and_then(|()| stdout.flush())
        .unwrap_or_else(|e| fail(&format!("fake-cocoon: stdout: {e}")));
    drop(stdout);
    write_stderr(entry);
    process::exit(exit_code(entry))
}

/// Bump the exec counter in `state_file` and return its old value.
fn next_exec_index(scenario: &Value) -> usize {
    let Some(path) = scenario["state_file"].as_str() else {
        return 0;
    };
    let count = match fs::read_to_string(path) {
        Ok(text) => text.trim().parse::<usize>().unwrap_or(0),
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
        Err(e) => fail(&format!("fake-cocoon: state file {path}: {e}")),
    };
    fs::write(path, (count + 1).to_string())
        .unwrap_or_else(|e| fail(&format!("fake-cocoon: state file {path}: {e}")));
    count
}

fn log(scenario: &Value, program: &str, rest: &[&str], exec_index: Option<usize>) {
    let Some(path) = scenario["log"].as_str() else {
        return;
    };
    let mut line = json!({ "program": program, "argv": rest });
    if let Some(index) = exec_index {
        line["exec_index"] = json!(index);
    }
    let mut text = line.to_string();
    text.push('\n');
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .unwrap_or_else(|e| fail(&format!("fake-cocoon: log {path}: {e}")));
}

fn write_outputs(entry: &Value) {
    if let Some(text) = entry["stdout"].as_str() {
        let mut stdout = io::stdout().lock();
        stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
            .unwrap_or_else(|e| fail(&format!("fake-cocoon: stdout: {e}")));
    }
    write_stderr(entry);
}

fn write_stderr(entry: &Value) {
    if let Some(text) = entry["stderr"].as_str() {
        let mut stderr = io::stderr().lock();
        // Nowhere to report a failure to write stderr.
        let _ = stderr.write_all(text.as_bytes());
    }
}

fn exit_code(entry: &Value) -> i32 {
    entry["exit"]
        .as_i64()
        .and_then(|code| i32::try_from(code).ok())
        .unwrap_or(0)
}

/// Waits until `gate` exists; gives up (exit 1) when the process that ran
/// it goes away, or after [`GATE_PATIENCE`], so that a test that failed
/// before opening it leaves nothing running.
fn wait_for_gate(gate: &str) {
    let parent = std::os::unix::process::parent_id();
    let started = std::time::Instant::now();
    while !std::path::Path::new(gate).exists() {
        if std::os::unix::process::parent_id() != parent {
            fail(&format!(
                "fake-cocoon: the caller went away before {gate} existed"
            ))
        }
        if started.elapsed() > GATE_PATIENCE {
            fail(&format!("fake-cocoon: {gate} never existed"))
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// How long an exec waits for its gate at most.
const GATE_PATIENCE: Duration = Duration::from_secs(300);

fn hang() -> ! {
    loop {
        thread::sleep(Duration::from_secs(3600));
    }
}

/// Exit 1 with `Error: <message>`, like the real CLI's own failures.
fn fail(message: &str) -> ! {
    eprintln!("Error: {message}");
    process::exit(1)
}
