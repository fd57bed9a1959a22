//! The real [`CocoonCli`] against `fake-cocoon` (tests/fake-cocoon): exit
//! codes, signals, timeouts that kill the whole process group, spawn
//! failures, bounded output and inspect parsing, through real processes.
//!
//! # Finding the fake
//!
//! `fake-cocoon` is a binary of another package, so `CARGO_BIN_EXE_*` does
//! not name it. The first test that needs it runs
//! `cargo build -p fake-cocoon --message-format=json` (the `cargo` that
//! built these tests, on this workspace's manifest) and takes the path from
//! the `executable` field of the compiler-artifact message: that is right
//! whatever `CARGO_TARGET_DIR`, `--target-dir` in config or build profile
//! says, and the build is a no-op when the binary is fresh. Set
//! `FAKE_COCOON_BIN` to a built binary to skip the build.
//!
//! Each test symlinks the fake into its own temporary directory as
//! `cocoon`, next to `cocoon.json` (its scenario), so tests running in
//! parallel never share process environment.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fixup_core::facts::{RawNic, VmId, VmInspect};
use fixup_core::plan::{STDERR_TAIL_MAX, StderrTail};
use fixup_host::cocoon::{
    Cocoon, CocoonCli, CocoonError, ExecOutput, ExitStatusKind, STDERR_MAX, STDOUT_MAX,
};
use rstest::rstest;
use serde_json::{Value, json};
use tempfile::TempDir;

/// Generous for a fake that answers at once, short enough for a test.
const TIMEOUT: Duration = Duration::from_secs(5);

fn fake_cocoon() -> &'static Path {
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

/// One scripted `cocoon` in its own directory.
struct Fake {
    dir: TempDir,
}

impl Fake {
    /// A fake playing `scenario`.
    fn new(scenario: Value) -> Fake {
        Fake::with(|_| scenario)
    }

    /// A fake playing the scenario `make` returns for its directory, with
    /// `log` and `state_file` set to files in that directory.
    fn with(make: impl FnOnce(&Path) -> Value) -> Fake {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut scenario = make(dir.path());
        scenario["log"] = json!(dir.path().join("calls.jsonl"));
        scenario["state_file"] = json!(dir.path().join("state"));
        fs::write(dir.path().join("cocoon.json"), scenario.to_string()).expect("scenario");
        std::os::unix::fs::symlink(fake_cocoon(), dir.path().join("cocoon")).expect("symlink");
        Fake { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn cli(&self) -> CocoonCli {
        CocoonCli::new(self.path("cocoon"))
    }

    /// The argv of every call so far (after the program name).
    fn calls(&self) -> Vec<Vec<String>> {
        let text = fs::read_to_string(self.path("calls.jsonl")).unwrap_or_default();
        text.lines()
            .map(|line| {
                let call: Value = serde_json::from_str(line).expect("log line is JSON");
                serde_json::from_value(call["argv"].clone()).expect("argv is strings")
            })
            .collect()
    }
}

fn vm() -> VmId {
    VmId::parse("vm-1").expect("valid id")
}

fn strings(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

fn exec_call(argv: &[&str]) -> Vec<String> {
    let mut call = strings(&["vm", "exec", "vm-1", "--"]);
    call.extend(strings(argv));
    call
}

fn output(status: ExitStatusKind, stdout: &str, stderr: &str) -> ExecOutput {
    ExecOutput {
        status,
        stdout: stdout.into(),
        stderr: stderr.into(),
        stderr_cut: false,
    }
}

#[rstest]
#[case::success(
    json!({ "exit": 0, "stdout": "out\n", "stderr": "err\n" }),
    &["true"],
    output(ExitStatusKind::Code(0), "out\n", "err\n")
)]
#[case::guest_exit_code(
    json!({ "exit": 3, "stderr": "boom\n" }),
    &["false"],
    output(ExitStatusKind::Code(3), "", "boom\n")
)]
#[case::killed_by_a_signal(
    json!({ "signal": 9, "stdout": "partial" }),
    &["sleep", "5"],
    output(ExitStatusKind::Signal(9), "partial", "")
)]
#[case::run_for_real(
    json!({ "run": true }),
    &["sh", "-c", "echo hi >&2; exit 4"],
    output(ExitStatusKind::Code(4), "", "hi\n")
)]
#[case::guest_argv_that_looks_like_flags(
    json!({ "run": true }),
    &["sh", "-c", "printf '%s|' \"$@\"", "sh", "--json", "-x", ""],
    output(ExitStatusKind::Code(0), "--json|-x||", "")
)]
#[tokio::test]
async fn exec_is_ok_for_any_exit(
    #[case] entry: Value,
    #[case] argv: &[&str],
    #[case] expected: ExecOutput,
) {
    let fake = Fake::new(json!({ "exec": [entry] }));
    let got = fake.cli().exec(&vm(), &strings(argv), TIMEOUT).await;
    assert_eq!(got, Ok(expected));
    assert_eq!(fake.calls(), vec![exec_call(argv)]);
}

#[tokio::test]
async fn exec_entries_play_in_order_and_the_last_repeats() {
    let fake = Fake::new(json!({ "exec": [
        { "exit": 1, "stderr": "not yet\n" },
        { "exit": 0 },
    ] }));
    let cli = fake.cli();
    let mut codes = Vec::new();
    for _ in 0..3 {
        let out = cli.exec(&vm(), &strings(&["true"]), TIMEOUT).await;
        codes.push(out.expect("exec runs").code());
    }
    assert_eq!(codes, [Some(1), Some(0), Some(0)]);
    assert_eq!(fake.calls().len(), 3);
}

/// `line 000000\nline 000001\n...`, cut to `len` bytes: every position is
/// recognisable, so a wrong window shows.
fn numbered(len: usize) -> String {
    let mut text = String::with_capacity(len + 12);
    let mut i = 0;
    while text.len() < len {
        text.push_str(&format!("line {i:06}\n"));
        i += 1;
    }
    text.truncate(len);
    text
}

#[rstest]
#[case::small(100, 100)]
#[case::exactly_the_bounds(STDOUT_MAX, STDERR_MAX)]
#[case::chatty_stderr(10, 3 * STDERR_MAX + 5)]
#[case::chatty_stdout(3 * STDOUT_MAX + 5, 10)]
#[case::chatty_both(3 * STDOUT_MAX + 1, 3 * STDERR_MAX + 1)]
#[tokio::test]
async fn output_is_bounded_and_read_while_the_child_runs(
    #[case] stdout_len: usize,
    #[case] stderr_len: usize,
) {
    // Far more than a pipe buffer (64 KiB on Linux): a runner that read
    // only after `wait` would deadlock and time out here.
    let stdout = numbered(stdout_len);
    let stderr = numbered(stderr_len);
    let fake = Fake::new(json!({ "exec": [{ "exit": 7, "stdout": stdout, "stderr": stderr }] }));
    let got = fake
        .cli()
        .exec(&vm(), &strings(&["true"]), TIMEOUT)
        .await
        .expect("exec runs");
    let head = stdout_len.min(STDOUT_MAX);
    let tail = stderr_len.min(STDERR_MAX);
    assert_eq!(got.status, ExitStatusKind::Code(7));
    assert_eq!(got.stdout, stdout.as_bytes()[..head], "the first bytes");
    assert_eq!(
        got.stderr,
        stderr.as_bytes()[stderr_len - tail..],
        "the last bytes"
    );
    assert_eq!(got.stderr_cut, stderr_len > STDERR_MAX);
    // The tail an error carries is smaller still (2 KiB).
    assert_eq!(got.stderr_tail().cut, stderr_len > STDERR_TAIL_MAX);
}

/// Whether `pid` is still a live `sleep`: gone, a zombie waiting for its
/// reaper, or a reused pid all count as dead.
fn sleep_alive(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) state ...`; comm may hold spaces and parentheses.
    let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
        return false;
    };
    let comm = &stat[open + 1..close];
    let state = stat[close + 1..].split_whitespace().next().unwrap_or("");
    comm == "sleep" && state != "Z" && state != "X"
}

/// SIGKILLs the pid when dropped, so a failing test leaks no `sleep 1000`.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if sleep_alive(self.0)
            && let Some(pid) = i32::try_from(self.0)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

/// How a hung exec ends.
#[derive(Debug, Clone, Copy)]
enum Ending {
    /// Its own timeout passes.
    Timeout,
    /// The caller drops the call (host shutdown) before that.
    Dropped,
}

#[rstest]
#[case::by_its_timeout(Ending::Timeout)]
#[case::by_dropping_the_call(Ending::Dropped)]
#[tokio::test]
async fn a_hung_exec_ends_with_its_whole_process_group(#[case] ending: Ending) {
    let fake = Fake::with(
        |dir| json!({ "exec": [{ "hang": true, "pid_file": dir.join("child.pid"), "stderr": "waiting\n" }] }),
    );
    let pid_file = fake.path("child.pid");
    let cli = fake.cli();
    let argv = strings(&["sleep", "1000"]);
    match ending {
        Ending::Timeout => {
            // Long enough for the fake to start its child and write the
            // pid file even on a loaded machine.
            let timeout = Duration::from_secs(5);
            let got = cli.exec(&vm(), &argv, timeout).await;
            assert_eq!(
                got,
                Err(CocoonError::Timeout {
                    what: "cocoon vm exec vm-1".into(),
                    after: timeout,
                })
            );
            assert_eq!(
                got.unwrap_err().to_string(),
                "cocoon vm exec vm-1: timed out after 5s (killed); raise --exec-timeout or check the guest agent"
            );
        }
        Ending::Dropped => {
            // Dropped once the fake's child runs (its pid file is there).
            let id = vm();
            let call = cli.exec(&id, &argv, Duration::from_secs(60));
            tokio::pin!(call);
            let started = Instant::now();
            while !pid_file.exists() {
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "the fake never wrote its child's pid"
                );
                tokio::select! {
                    got = &mut call => panic!("the hung exec returned: {got:?}"),
                    () = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
        }
    }

    let pid: u32 = fs::read_to_string(&pid_file)
        .expect("the fake wrote its child's pid before the timeout")
        .trim()
        .parse()
        .expect("a pid");
    let _guard = KillOnDrop(pid);
    // SIGKILL is delivered at once, but the exit itself is asynchronous:
    // give it a moment (not a measurement: the loop ends when it is gone).
    let deadline = Instant::now() + Duration::from_secs(2);
    while sleep_alive(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !sleep_alive(pid),
        "the fake's child `sleep` (pid {pid}) survived the timeout"
    );
}

#[derive(Debug, Clone, Copy)]
enum BadProgram {
    Missing,
    NotExecutable,
    Directory,
}

#[rstest]
#[case::missing(BadProgram::Missing, "No such file or directory")]
#[case::not_executable(BadProgram::NotExecutable, "Permission denied")]
#[case::directory(BadProgram::Directory, "Permission denied")]
#[tokio::test]
async fn a_program_that_cannot_run_is_a_spawn_error(
    #[case] kind: BadProgram,
    #[case] os_text: &str,
) {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = dir.path().join("cocoon");
    match kind {
        BadProgram::Missing => {}
        BadProgram::NotExecutable => {
            fs::write(&program, "#!/bin/sh\nexit 0\n").expect("write");
            fs::set_permissions(&program, fs::Permissions::from_mode(0o644)).expect("chmod");
        }
        BadProgram::Directory => fs::create_dir(&program).expect("mkdir"),
    }
    let cli = CocoonCli::new(&program);
    let expected = CocoonError::Spawn {
        program: program.clone(),
        source_text: os_text.into(),
    };
    assert_eq!(
        cli.exec(&vm(), &strings(&["true"]), TIMEOUT).await,
        Err(expected.clone())
    );
    assert_eq!(cli.inspect(&vm(), TIMEOUT).await, Err(expected.clone()));
    assert_eq!(
        expected.to_string(),
        format!(
            "cannot run {}: {os_text}; install cocoon or pass --cocoon-bin",
            program.display()
        )
    );
}

/// A VM record as `cocoon vm inspect --json` prints it (spec section 2).
fn inspect_json(image: Value) -> Value {
    json!({
        "id": "vm-1",
        "hypervisor": "cloud-hypervisor",
        "state": "running",
        "created_at": "2026-11-30T09:12:46.5+08:00",
        "config": { "name": "vk-default-web-0-0f1e2d", "cpu": 2, "memory": 1073741824, "image": image },
        "network_configs": [
            {
                "mac": "52:54:00:aa:bb:01",
                "tap": "tap0",
                "network": { "ip": "10.0.0.5", "prefix": 24, "gateway": "10.0.0.1" }
            },
            { "mac": "52:54:00:aa:bb:02", "tap": "tap1" }
        ]
    })
}

#[tokio::test]
async fn inspect_parses_the_nics() {
    let fake = Fake::new(json!({ "inspect": { "json": inspect_json(json!("")) } }));
    let got = fake.cli().inspect(&vm(), TIMEOUT).await;
    let expected = VmInspect {
        id: "vm-1".into(),
        name: "vk-default-web-0-0f1e2d".into(),
        image: String::new(),
        nics: vec![
            RawNic {
                mac: "52:54:00:aa:bb:01".into(),
                tap: "tap0".into(),
                ip: "10.0.0.5".into(),
                prefix: Some(24),
                gateway: "10.0.0.1".into(),
            },
            RawNic {
                mac: "52:54:00:aa:bb:02".into(),
                tap: "tap1".into(),
                ..RawNic::default()
            },
        ],
        // Go prints the time in cocoon's zone: the offset counts.
        created_unix_ms: Some(1_796_001_166_500),
    };
    assert_eq!(got, Ok(expected));
    assert_eq!(
        fake.calls(),
        vec![strings(&["vm", "inspect", "--json", "vm-1"])]
    );
}

/// The source image is the record's `config.image` (cocoon copies a
/// snapshot's config into its clones), read by the one inspect.
#[rstest]
#[case::url(
    json!("https://cloud-images.example/noble.img"),
    "https://cloud-images.example/noble.img"
)]
#[case::oci(json!("ghcr.io/acme/ubuntu:24.04"), "ghcr.io/acme/ubuntu:24.04")]
#[case::empty(json!(""), "")]
#[case::null(Value::Null, "")]
#[tokio::test]
async fn the_source_image_is_the_records_config_image(
    #[case] image: Value,
    #[case] expected: &str,
) {
    let fake = Fake::new(json!({ "inspect": { "json": inspect_json(image) } }));
    let got = fake.cli().inspect(&vm(), TIMEOUT).await.expect("inspect");
    assert_eq!(got.image, expected);
    assert_eq!(fake.calls().len(), 1, "one inspect gives the whole record");
}

#[tokio::test]
async fn a_record_without_config_reads_as_unnamed() {
    let fake = Fake::new(json!({ "inspect": { "json": { "id": "vm-1" } } }));
    let got = fake.cli().inspect(&vm(), TIMEOUT).await.expect("inspect");
    assert_eq!((got.name.as_str(), got.image.as_str()), ("", ""));
}

#[rstest]
#[case::image_not_a_string(json!({"id": "vm-1", "config": {"image": 42}}), "config.image")]
#[case::name_not_a_string(json!({"id": "vm-1", "config": {"name": ["vk-a"]}}), "config.name")]
#[case::config_not_an_object(json!({"id": "vm-1", "config": "vk-a"}), "config")]
#[tokio::test]
async fn a_record_of_the_wrong_shape_names_the_field(#[case] record: Value, #[case] field: &str) {
    let fake = Fake::new(json!({ "inspect": { "json": record } }));
    let err = fake.cli().inspect(&vm(), TIMEOUT).await.unwrap_err();
    assert!(
        matches!(&err, CocoonError::BadOutput { reason, .. } if reason.contains(field)),
        "{err}"
    );
}

fn failed(status: ExitStatusKind, stderr: &str) -> CocoonError {
    CocoonError::Failed {
        what: "cocoon vm inspect vm-1".into(),
        status,
        stderr_tail: StderrTail::new(stderr.as_bytes()),
    }
}

fn bad_output(reason: &str) -> CocoonError {
    CocoonError::BadOutput {
        what: "cocoon vm inspect vm-1".into(),
        reason: reason.into(),
    }
}

#[rstest]
#[case::garbage(
    json!({ "raw": "garbage" }),
    bad_output("not JSON: expected value at line 1 column 1")
)]
#[case::empty_stdout(
    json!({ "raw": "" }),
    bad_output("not JSON: EOF while parsing a value at line 1 column 0")
)]
#[case::cut_off_stdout(
    json!({ "raw": format!("{{\"id\":\"{}\"}}", "x".repeat(STDOUT_MAX)) }),
    bad_output(&format!("more than {STDOUT_MAX} bytes on stdout"))
)]
#[case::non_zero_exit(
    json!({ "exit": 2, "stderr": "Error: vm vm-1 not found\n" }),
    failed(ExitStatusKind::Code(2), "Error: vm vm-1 not found\n")
)]
#[case::non_zero_exit_despite_json(
    json!({ "exit": 1, "json": { "id": "vm-1" }, "stderr": "Error: partial state\n" }),
    failed(ExitStatusKind::Code(1), "Error: partial state\n")
)]
#[case::unknown_vm(
    Value::Null,
    failed(ExitStatusKind::Code(1), "Error: vm vm-1 not found\n")
)]
#[case::hung(
    json!({ "hang": true }),
    CocoonError::Timeout { what: "cocoon vm inspect vm-1".into(), after: Duration::from_millis(300) }
)]
#[tokio::test]
async fn inspect_errors(#[case] entry: Value, #[case] expected: CocoonError) {
    let fake = Fake::new(json!({ "inspect": entry }));
    let cli = fake.cli();
    let timeout = match expected {
        CocoonError::Timeout { after, .. } => after,
        _ => TIMEOUT,
    };
    assert_eq!(cli.inspect(&vm(), timeout).await, Err(expected));
}

#[tokio::test]
async fn inspect_json_of_the_wrong_shape_names_the_field() {
    let fake = Fake::new(json!({ "inspect": { "json": { "id": "vm-1", "network_configs": 5 } } }));
    let err = fake.cli().inspect(&vm(), TIMEOUT).await.unwrap_err();
    let CocoonError::BadOutput { what, reason } = &err else {
        panic!("expected BadOutput, got {err:?}");
    };
    assert_eq!(what, "cocoon vm inspect vm-1");
    assert!(
        reason.starts_with("network_configs: expected an array, got "),
        "{reason}"
    );
    assert!(
        err.to_string()
            .ends_with("; check that --cocoon-bin is a cocoon version this host supports"),
        "{err}"
    );
}

#[tokio::test]
async fn inspect_failure_message_carries_the_stderr_tail() {
    let fake =
        Fake::new(json!({ "inspect": { "exit": 2, "stderr": "Error: vm vm-1 not found\n" } }));
    let err = fake.cli().inspect(&vm(), TIMEOUT).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "cocoon vm inspect vm-1 exited 2: Error: vm vm-1 not found; check that the VM exists and that the command works when run by hand"
    );
}
