//! What one exec of a plan left behind ([`ExecOutput`]), and what it means
//! ([`verdict`]): ran to completion, or the error line of the attempt,
//! naming the step that failed and the end of its stderr. Whoever runs the
//! exec (the daemon's `cocoon` runner, an embedder's own client) hands the
//! output here, so every caller judges an attempt the same way.

use std::fmt;

use crate::annotations::one_line;
use crate::plan::{Nonce, Plan, StderrTail, StepFailure, attribute_failure, ran_to_completion};

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExitStatusKind {
    /// It exited with this code. For `vm exec` it is the guest command's.
    Code(i32),
    /// It was killed by this signal (for example 9, SIGKILL).
    Signal(i32),
}

impl fmt::Display for ExitStatusKind {
    /// `exited 3` or `was killed by signal 9`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitStatusKind::Code(code) => write!(f, "exited {code}"),
            ExitStatusKind::Signal(signal) => write!(f, "was killed by signal {signal}"),
        }
    }
}

/// What a finished `cocoon` process left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub status: ExitStatusKind,
    /// The first bytes of stdout, as many as the runner keeps (64 KiB for
    /// `fixup-host`'s `CocoonCli`); the rest was read and dropped.
    pub stdout: Vec<u8>,
    /// The last bytes of stderr, as many as the runner keeps (64 KiB for
    /// `fixup-host`'s `CocoonCli`): the error and the markers are at the end.
    pub stderr: Vec<u8>,
    /// Earlier stderr bytes were dropped to keep the bound.
    pub stderr_cut: bool,
}

impl ExecOutput {
    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.status == ExitStatusKind::Code(0)
    }

    /// The exit code; `None` when a signal ended the process.
    pub fn code(&self) -> Option<i32> {
        match self.status {
            ExitStatusKind::Code(code) => Some(code),
            ExitStatusKind::Signal(_) => None,
        }
    }

    /// The end of stderr as an error carries it ([`StderrTail`], 2 KiB).
    pub fn stderr_tail(&self) -> StderrTail {
        let mut tail = StderrTail::new(&self.stderr);
        tail.cut |= self.stderr_cut;
        tail
    }
}

/// The verdict on one exec of `plan` under `nonce` (the nonce of that exec,
/// [`exec_argv`](crate::plan::exec_argv)): `Ok` when it exited 0 and its
/// stderr ends with the done marker of that nonce ([`ran_to_completion`]),
/// else the error as one line, naming the failed step. Marker lines with
/// another nonce or none are a guest program's output, not the script's.
pub fn verdict(plan: &Plan, nonce: &Nonce, out: &ExecOutput) -> Result<(), String> {
    if !out.success() {
        return Err(describe_failure(plan, nonce, out));
    }
    if ran_to_completion(plan, nonce, &out.stderr) {
        return Ok(());
    }
    Err(
        match attribute_failure(plan, nonce, out.code(), &out.stderr) {
            StepFailure::NotStarted { .. } => one_line(&format!(
                "the exec exited 0 but no step markers of this exec came back on stderr, so it cannot be told that the steps ran: check that `cocoon vm exec` passes the guest's stderr through; stderr: {}",
                out.stderr_tail()
            )),
            _ => format!(
                "{}; the script ended early with exit 0, so the steps after it did not run",
                describe_failure(plan, nonce, out)
            ),
        },
    )
}

/// The failed step ([`attribute_failure`]) as one line; a signal, which
/// leaves no exit code, is named with it.
fn describe_failure(plan: &Plan, nonce: &Nonce, out: &ExecOutput) -> String {
    let failure = attribute_failure(plan, nonce, out.code(), &out.stderr);
    let text = match out.code() {
        Some(_) => failure.to_string(),
        None => format!("cocoon vm exec {}: {failure}", out.status),
    };
    one_line(&text)
}
