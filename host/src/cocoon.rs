//! The one type that runs the `cocoon` CLI.
//!
//! [`Cocoon`] is the seam: [`CocoonCli`] runs the real binary (path
//! configurable, default `/usr/local/bin/cocoon`) with argv vectors and no
//! host shell; tests and embedders can supply their own.
//!
//! # What [`CocoonCli`] promises
//!
//! - argv vectors only, never a shell; stdin is `/dev/null`.
//! - Every call has a deadline, passed by the caller (see each method). On
//!   the deadline the child's whole process group is killed with SIGKILL:
//!   the child runs in a process group of its own, so a hung `cocoon` and
//!   everything it started die together, and nothing outlives the call.
//!   Dropping the call's future (shutdown) kills the group the same way.
//!   A descendant that leaves the group (`setsid`) is beyond reach; the
//!   real `cocoon` CLI has no reason to.
//! - stdout and stderr are read while the child runs, so a chatty child
//!   never blocks on a full pipe; both are bounded ([`STDOUT_MAX`] keeps the
//!   first bytes, [`STDERR_MAX`] the last, where the error is).
//! - The error keeps the exit status and a bounded stderr tail
//!   ([`StderrTail`]), and its message ends with what to do next.

use std::ffi::OsStr;
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

use fixup_core::facts::{FactError, VmId, VmInspect};
use fixup_core::plan::StderrTail;

/// Where the `cocoon` CLI is installed on a cocoon node (spec section 5);
/// the caller's configuration (`--cocoon-bin`) overrides it.
pub const DEFAULT_COCOON_BIN: &str = "/usr/local/bin/cocoon";

/// Timeout for `vm inspect` (default 10 s), configured by the caller: it
/// is the `timeout` argument of [`Cocoon::inspect`]. One inspect per pod
/// gives the whole VM record, the source image (`config.image`) included.
/// Inspect only reads cocoon's own state, so a slow one means cocoon
/// itself is stuck.
pub const DEFAULT_INSPECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Most bytes of stdout kept, 64 KiB: the first ones. Inspect output for
/// the largest VM the host handles ([`fixup_core::facts::MAX_NICS`] NICs) is a
/// fraction of it; a guest command's stdout is not used for decisions.
pub const STDOUT_MAX: usize = 64 * 1024;

/// Most bytes of stderr kept, 64 KiB: the last ones, because the error
/// (and the plan's failure marker) is at the end.
pub const STDERR_MAX: usize = 64 * 1024;

/// After a SIGKILL on timeout, wait at most this long (1 s, fixed) for the
/// child to be reaped. SIGKILL cannot be caught, so only a process stuck in
/// the kernel (uninterruptible sleep) takes longer; then the call returns
/// anyway and tokio reaps the child in the background when it dies.
const KILL_REAP_WAIT: Duration = Duration::from_secs(1);

/// Read buffer size for the pipes.
const CHUNK: usize = 8 * 1024;

pub use fixup_core::exec::{ExecOutput, ExitStatusKind};

/// How a process ended, as [`ExitStatusKind`]; `None` for stopped or
/// continued, which `wait` does not report.
fn exit_status_kind(status: ExitStatus) -> Option<ExitStatusKind> {
    match (status.code(), status.signal()) {
        (Some(code), _) => Some(ExitStatusKind::Code(code)),
        (None, Some(signal)) => Some(ExitStatusKind::Signal(signal)),
        (None, None) => None,
    }
}

/// Why a `cocoon` call gave no usable answer. `what` is the command, for
/// example `cocoon vm exec vm-1`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CocoonError {
    /// The binary could not be started: missing, not executable, not a
    /// program.
    #[error(
        "cannot run {}: {source_text}; install cocoon or pass --cocoon-bin",
        program.display()
    )]
    Spawn {
        program: PathBuf,
        /// The OS error, without its `(os error N)` suffix.
        source_text: String,
    },
    /// The call passed its deadline; its process group was killed.
    #[error(
        "{what}: timed out after {} (killed); {}",
        fixup_core::annotations::messages::span(*after),
        timeout_hint(what)
    )]
    Timeout { what: String, after: Duration },
    /// The command failed (non-zero exit or a signal) where success was
    /// required. `vm exec` never returns this: the guest's exit is the
    /// caller's to read.
    #[error(
        "{what} {status}: {stderr_tail}; check that the VM exists and that the command works when run by hand"
    )]
    Failed {
        what: String,
        status: ExitStatusKind,
        stderr_tail: StderrTail,
    },
    /// The command succeeded but printed something we cannot read.
    #[error(
        "{what}: unexpected output: {reason}; check that --cocoon-bin is a cocoon version this host supports"
    )]
    BadOutput { what: String, reason: String },
}

/// The next action for a timeout: exec has its own knob, and a slow exec
/// is usually the guest agent; everything else is cocoon itself.
fn timeout_hint(what: &str) -> &'static str {
    if what.starts_with("cocoon vm exec") {
        "raise --exec-timeout or check the guest agent"
    } else {
        "raise --inspect-timeout or check that cocoon responds when run by hand"
    }
}

/// What the host needs from cocoon.
pub trait Cocoon: Send + Sync + 'static {
    /// `cocoon vm exec <id> -- <argv...>`: run `argv` in the guest.
    ///
    /// Ok for ANY exit (code or signal): the caller reads the guest's exit
    /// code and the plan's stderr markers. Err only when it could not run
    /// ([`CocoonError::Spawn`]) or passed `timeout`
    /// ([`CocoonError::Timeout`]). The timeout is the caller's: the per-exec
    /// timeout inside the retry budget (spec section 5, `--exec-timeout`).
    fn exec(
        &self,
        vm: &VmId,
        argv: &[String],
        timeout: Duration,
    ) -> impl Future<Output = Result<ExecOutput, CocoonError>> + Send;

    /// `cocoon vm inspect --json <id>`, parsed with [`VmInspect`] (source
    /// label `cocoon vm inspect`). A non-zero exit is
    /// [`CocoonError::Failed`]; output that is not inspect JSON is
    /// [`CocoonError::BadOutput`]. `timeout` is the caller's
    /// ([`DEFAULT_INSPECT_TIMEOUT`] by default).
    fn inspect(
        &self,
        vm: &VmId,
        timeout: Duration,
    ) -> impl Future<Output = Result<VmInspect, CocoonError>> + Send;
}

/// Runs the real `cocoon` binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CocoonCli {
    program: PathBuf,
}

impl Default for CocoonCli {
    /// Runs [`DEFAULT_COCOON_BIN`].
    fn default() -> Self {
        CocoonCli::new(DEFAULT_COCOON_BIN)
    }
}

impl CocoonCli {
    /// Runs `program` (an absolute path, or a name looked up in `PATH`).
    pub fn new(program: impl Into<PathBuf>) -> Self {
        CocoonCli {
            program: program.into(),
        }
    }

    /// The binary this runs.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// `cocoon vm inspect --json <id>`: exit 0 and a JSON object, or an
    /// error.
    async fn inspect_json(&self, vm: &VmId, timeout: Duration) -> Result<Value, CocoonError> {
        let what = format!("cocoon vm inspect {vm}");
        let args: [&OsStr; 4] = [
            "vm".as_ref(),
            "inspect".as_ref(),
            "--json".as_ref(),
            vm.as_str().as_ref(),
        ];
        let run = self.run(&what, &args, timeout).await?;
        let out = run.output;
        if !out.success() {
            return Err(CocoonError::Failed {
                what,
                status: out.status,
                stderr_tail: out.stderr_tail(),
            });
        }
        if run.stdout_cut {
            return Err(CocoonError::BadOutput {
                what,
                reason: format!("more than {STDOUT_MAX} bytes on stdout"),
            });
        }
        serde_json::from_slice(&out.stdout).map_err(|e| CocoonError::BadOutput {
            what,
            reason: format!("not JSON: {e}"),
        })
    }

    /// Run `cocoon <args>` to completion or `timeout`, whichever is first.
    async fn run(
        &self,
        what: &str,
        args: &[&OsStr],
        timeout: Duration,
    ) -> Result<Finished, CocoonError> {
        let mut cmd = Command::new(&self.program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            // A group of its own, led by the child: on timeout the group
            // goes, grandchildren included.
            .process_group(0);
        let mut child = cmd.spawn().map_err(|e| CocoonError::Spawn {
            program: self.program.clone(),
            source_text: os_error_text(&e),
        })?;
        // Armed until the run ends: a timeout, or the caller dropping this
        // future (shutdown), kills the whole group.
        let mut group = GroupKill(child.id());
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let waited = tokio::time::timeout(timeout, async {
            tokio::join!(
                child.wait(),
                read_head(stdout, STDOUT_MAX),
                read_tail(stderr, STDERR_MAX),
            )
        })
        .await;
        let Ok((status, stdout, stderr)) = waited else {
            // The child, or something it started that still holds a pipe,
            // is hung.
            drop(group);
            let _ = child.start_kill();
            let _ = tokio::time::timeout(KILL_REAP_WAIT, child.wait()).await;
            return Err(CocoonError::Timeout {
                what: what.to_owned(),
                after: timeout,
            });
        };
        group.disarm();
        let bad = |reason: String| CocoonError::BadOutput {
            what: what.to_owned(),
            reason,
        };
        let status = status.map_err(|e| bad(format!("waiting for the process: {e}")))?;
        let status = exit_status_kind(status)
            .ok_or_else(|| bad(format!("exit status {status} has no code and no signal")))?;
        let (stdout, stdout_cut) = stdout.map_err(|e| bad(format!("reading stdout: {e}")))?;
        let (stderr, stderr_cut) = stderr.map_err(|e| bad(format!("reading stderr: {e}")))?;
        Ok(Finished {
            output: ExecOutput {
                status,
                stdout,
                stderr,
                stderr_cut,
            },
            stdout_cut,
        })
    }
}

impl Cocoon for CocoonCli {
    async fn exec(
        &self,
        vm: &VmId,
        argv: &[String],
        timeout: Duration,
    ) -> Result<ExecOutput, CocoonError> {
        let what = format!("cocoon vm exec {vm}");
        let mut args: Vec<&OsStr> = vec![
            "vm".as_ref(),
            "exec".as_ref(),
            vm.as_str().as_ref(),
            // The id cannot start with `-` (VmId), but argv can: everything
            // after `--` is the guest's.
            "--".as_ref(),
        ];
        args.extend(argv.iter().map(|a| OsStr::new(a.as_str())));
        Ok(self.run(&what, &args, timeout).await?.output)
    }

    async fn inspect(&self, vm: &VmId, timeout: Duration) -> Result<VmInspect, CocoonError> {
        let value = self.inspect_json(vm, timeout).await?;
        VmInspect::from_value(&value, "cocoon vm inspect").map_err(|e| CocoonError::BadOutput {
            what: format!("cocoon vm inspect {vm}"),
            reason: fact_reason(e),
        })
    }
}

/// A finished run: the output, and whether stdout was cut (only inspect
/// cares: cut JSON is no JSON).
struct Finished {
    output: ExecOutput,
    stdout_cut: bool,
}

/// SIGKILLs the child's process group when dropped while armed.
///
/// The group id is the child's pid (the child leads its own group). It
/// stays valid while any member lives, even after the leader was reaped,
/// and the kernel does not hand out a pid that is still in use as a group
/// id, so the signal cannot reach an unrelated process group. Best effort:
/// the group may be gone already (ESRCH); `kill_on_drop` on the leader
/// follows.
struct GroupKill(Option<u32>);

impl GroupKill {
    /// The run ended normally: nothing to kill.
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        let Some(pid) = self
            .0
            .take()
            .and_then(|group| i32::try_from(group).ok())
            .and_then(rustix::process::Pid::from_raw)
        else {
            return;
        };
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// `No such file or directory`, without ` (os error 2)`: the message is for
/// a person, and the path is already in it.
fn os_error_text(e: &io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_owned(),
        _ => text,
    }
}

/// A shape error without the file-oriented advice of [`FactError`] (the
/// output came from cocoon, not from a file the user passed).
fn fact_reason(e: FactError) -> String {
    match e {
        FactError::Shape {
            path,
            expected,
            found,
            ..
        } => format!("{path}: expected {expected}, got {found}"),
        other => other.to_string(),
    }
}

/// Read `pipe` to the end, keeping the first `max` bytes; `true` when more
/// came. Reading goes on past the bound so the writer never blocks.
async fn read_head<R: AsyncRead + Unpin>(
    pipe: Option<R>,
    max: usize,
) -> io::Result<(Vec<u8>, bool)> {
    let mut kept = Vec::new();
    let mut cut = false;
    let Some(mut pipe) = pipe else {
        return Ok((kept, cut));
    };
    let mut chunk = vec![0; CHUNK];
    loop {
        let n = pipe.read(&mut chunk).await?;
        if n == 0 {
            return Ok((kept, cut));
        }
        let room = max - kept.len();
        kept.extend_from_slice(&chunk[..n.min(room)]);
        cut |= n > room;
    }
}

/// Read `pipe` to the end, keeping the last `max` bytes; `true` when
/// earlier bytes were dropped. Memory stays under `2 * max`.
async fn read_tail<R: AsyncRead + Unpin>(
    pipe: Option<R>,
    max: usize,
) -> io::Result<(Vec<u8>, bool)> {
    let mut kept = Vec::new();
    let mut cut = false;
    let Some(mut pipe) = pipe else {
        return Ok((kept, cut));
    };
    let mut chunk = vec![0; CHUNK];
    loop {
        let n = pipe.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        kept.extend_from_slice(&chunk[..n]);
        if kept.len() >= 2 * max {
            kept.drain(..kept.len() - max);
            cut = true;
        }
    }
    if kept.len() > max {
        kept.drain(..kept.len() - max);
        cut = true;
    }
    Ok((kept, cut))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn vm(id: &str) -> VmId {
        VmId::parse(id).expect("valid id")
    }

    #[rstest]
    #[case::spawn(
        CocoonError::Spawn {
            program: DEFAULT_COCOON_BIN.into(),
            source_text: "No such file or directory".into(),
        },
        "cannot run /usr/local/bin/cocoon: No such file or directory; install cocoon or pass --cocoon-bin"
    )]
    #[case::exec_timeout(
        CocoonError::Timeout { what: "cocoon vm exec vm-1".into(), after: Duration::from_secs(20) },
        "cocoon vm exec vm-1: timed out after 20s (killed); raise --exec-timeout or check the guest agent"
    )]
    #[case::inspect_timeout(
        CocoonError::Timeout { what: "cocoon vm inspect vm-1".into(), after: Duration::from_millis(1500) },
        "cocoon vm inspect vm-1: timed out after 1.5s (killed); raise --inspect-timeout or check that cocoon responds when run by hand"
    )]
    #[case::failed(
        CocoonError::Failed {
            what: "cocoon vm inspect vm-1".into(),
            status: ExitStatusKind::Code(2),
            stderr_tail: StderrTail::new(b"Error: vm vm-1 not found\n"),
        },
        "cocoon vm inspect vm-1 exited 2: Error: vm vm-1 not found; check that the VM exists and that the command works when run by hand"
    )]
    #[case::failed_by_signal(
        CocoonError::Failed {
            what: "cocoon vm inspect vm-1".into(),
            status: ExitStatusKind::Signal(9),
            stderr_tail: StderrTail::default(),
        },
        "cocoon vm inspect vm-1 was killed by signal 9: (no stderr); check that the VM exists and that the command works when run by hand"
    )]
    #[case::bad_output(
        CocoonError::BadOutput { what: "cocoon vm inspect vm-1".into(), reason: "not JSON: expected value at line 1 column 1".into() },
        "cocoon vm inspect vm-1: unexpected output: not JSON: expected value at line 1 column 1; check that --cocoon-bin is a cocoon version this host supports"
    )]
    fn messages_end_with_the_next_action(#[case] error: CocoonError, #[case] expected: &str) {
        assert_eq!(error.to_string(), expected);
    }

    #[rstest]
    #[case::not_found(io::Error::from_raw_os_error(2), "No such file or directory")]
    #[case::denied(io::Error::from_raw_os_error(13), "Permission denied")]
    #[case::custom(io::Error::other("odd (thing)"), "odd (thing)")]
    fn os_error_text_drops_the_number(#[case] e: io::Error, #[case] expected: &str) {
        assert_eq!(os_error_text(&e), expected);
    }

    #[rstest]
    #[case::code_zero(ExitStatusKind::Code(0), true, Some(0))]
    #[case::code_three(ExitStatusKind::Code(3), false, Some(3))]
    #[case::signal(ExitStatusKind::Signal(9), false, None)]
    fn output_status(
        #[case] status: ExitStatusKind,
        #[case] success: bool,
        #[case] code: Option<i32>,
    ) {
        let out = ExecOutput {
            status,
            stdout: vec![],
            stderr: vec![],
            stderr_cut: false,
        };
        assert_eq!((out.success(), out.code()), (success, code));
    }

    #[test]
    fn the_tail_remembers_an_earlier_cut() {
        let out = ExecOutput {
            status: ExitStatusKind::Code(1),
            stdout: vec![],
            stderr: b"end\n".to_vec(),
            stderr_cut: true,
        };
        assert_eq!(
            out.stderr_tail(),
            StderrTail {
                text: "end\n".into(),
                cut: true
            }
        );
    }

    #[rstest]
    #[case::empty(0, 10, 0, false)]
    #[case::under(9, 10, 9, false)]
    #[case::exact(10, 10, 10, false)]
    #[case::over(11, 10, 10, true)]
    #[case::many_chunks(5 * CHUNK + 7, CHUNK + 3, CHUNK + 3, true)]
    #[tokio::test]
    async fn head_keeps_the_first_bytes(
        #[case] len: usize,
        #[case] max: usize,
        #[case] kept: usize,
        #[case] cut: bool,
    ) {
        let input: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let (got, got_cut) = read_head(Some(input.as_slice()), max).await.unwrap();
        assert_eq!(got, input[..kept]);
        assert_eq!(got_cut, cut);
    }

    #[rstest]
    #[case::empty(0, 10, 0, false)]
    #[case::under(9, 10, 9, false)]
    #[case::exact(10, 10, 10, false)]
    #[case::over(11, 10, 10, true)]
    #[case::many_chunks(5 * CHUNK + 7, CHUNK + 3, CHUNK + 3, true)]
    #[case::exactly_twice(2 * CHUNK, CHUNK, CHUNK, true)]
    #[tokio::test]
    async fn tail_keeps_the_last_bytes(
        #[case] len: usize,
        #[case] max: usize,
        #[case] kept: usize,
        #[case] cut: bool,
    ) {
        let input: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let (got, got_cut) = read_tail(Some(input.as_slice()), max).await.unwrap();
        assert_eq!(got, input[len - kept..]);
        assert_eq!(got_cut, cut);
    }

    #[tokio::test]
    async fn a_missing_pipe_reads_as_empty() {
        let none: Option<&[u8]> = None;
        assert_eq!(read_head(none, 4).await.unwrap(), (vec![], false));
        assert_eq!(read_tail(none, 4).await.unwrap(), (vec![], false));
    }

    #[test]
    fn default_runs_the_installed_binary() {
        assert_eq!(
            CocoonCli::default().program(),
            Path::new(DEFAULT_COCOON_BIN)
        );
        // The id is shown as is in messages.
        assert_eq!(
            format!("cocoon vm exec {}", vm("vm-1")),
            "cocoon vm exec vm-1"
        );
    }
}
