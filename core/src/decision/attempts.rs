//! [`Attempts`]: one loop of attempts at a plan, the part a fixup
//! ([`PodTask`](super::PodTask)) and a preparation
//! ([`PrepareTask`](super::PrepareTask)) share: each attempt is one exec of
//! the plan under a fresh nonce, bounded by the exec timeout and what is
//! left of the budget; its verdict comes from the nonce's markers; a failed
//! attempt's line joins the error chain, and the next comes after the
//! interval unless that is past the budget. What a task tells and writes
//! around each step stays its own.

use std::time::Duration;

use super::settings::MIN_STEP;
use super::{Action, ExecPurpose};
use crate::annotations::{messages, one_line};
use crate::exec::{self, ExecOutput};
use crate::facts::VmId;
use crate::plan::{Nonce, Plan, exec_argv};

/// Where the nonce of each exec comes from: the operating system's
/// randomness in a host ([`Nonce::generate`]), a fixed sequence in a test.
pub type NonceSource = Box<dyn FnMut() -> Result<Nonce, String> + Send>;

/// The operating system's randomness, as every host draws nonces.
pub fn os_nonces() -> NonceSource {
    Box::new(|| Nonce::generate().map_err(|e| e.to_string()))
}

/// The attempts at one plan on one VM.
#[derive(Debug)]
pub(super) struct Attempts {
    pub(super) vm: VmId,
    plan: Plan,
    exec: Vec<String>,
    /// The budget's end on the task's clock.
    pub(super) deadline: Duration,
    /// Attempts begun, the one under way included.
    pub(super) count: u32,
    /// One line per failed attempt ([`messages::attempt_line`]).
    pub(super) errors: Vec<String>,
    /// The nonce of the attempt under way.
    nonce: Option<Nonce>,
    /// This is the loop's one attempt past its budget (spec section 8):
    /// when it fails, none follows.
    pub(super) last_chance: bool,
}

impl Attempts {
    /// No attempt yet; the deadline is set when the budget starts.
    pub(super) fn new(vm: VmId, plan: Plan, exec: Vec<String>) -> Attempts {
        Attempts {
            vm,
            plan,
            exec,
            deadline: Duration::ZERO,
            count: 0,
            errors: Vec::new(),
            nonce: None,
            last_chance: false,
        }
    }

    /// The budget ran out after an attempt (the first always runs).
    pub(super) fn spent(&self, now: Duration) -> bool {
        self.count > 0 && now >= self.deadline
    }

    /// Begin the next attempt: its exec, or the reason it cannot run (no
    /// nonce could be drawn; the attempt counts and fails with it).
    pub(super) fn begin(
        &mut self,
        now: Duration,
        exec_timeout: Duration,
        nonces: &mut NonceSource,
        purpose: ExecPurpose,
    ) -> Result<Action, String> {
        self.count += 1;
        let nonce = nonces().map_err(|e| one_line(&e))?;
        let argv = exec_argv(&self.plan, &self.exec, &nonce);
        self.nonce = Some(nonce);
        let timeout = exec_timeout
            .min(self.deadline.saturating_sub(now))
            .max(MIN_STEP);
        Ok(Action::Exec {
            vm: self.vm.clone(),
            argv,
            timeout,
            purpose,
        })
    }

    /// The verdict on the attempt under way, from what its exec reported.
    pub(super) fn verdict(&mut self, result: Result<ExecOutput, String>) -> Result<(), String> {
        let nonce = self.nonce.take().expect("an attempt has its nonce");
        match result {
            Ok(out) => exec::verdict(&self.plan, &nonce, &out),
            Err(e) => Err(one_line(&e)),
        }
    }

    /// The line that tells the attempt under way failed with `error`.
    pub(super) fn failure_line(&self, error: &str) -> String {
        messages::attempt_line(self.count, error)
    }

    /// A failed attempt's `line` joins the chain; when the next attempt
    /// is due, or `None` when that is past the budget.
    pub(super) fn failed(
        &mut self,
        line: String,
        now: Duration,
        interval: Duration,
    ) -> Option<Duration> {
        self.errors.push(line);
        let until = now + interval;
        (until < self.deadline && !self.last_chance).then_some(until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::ExitStatusKind;

    fn attempts() -> Attempts {
        let plan = Plan {
            dialect: crate::plan::Dialect::PosixSh,
            steps: Vec::new(),
        };
        let mut attempts = Attempts::new(VmId::parse("vm-1").unwrap(), plan, vec!["sh".into()]);
        attempts.deadline = Duration::from_secs(10);
        attempts
    }

    fn fixed() -> NonceSource {
        Box::new(|| Ok(Nonce::from_bytes([7; 16])))
    }

    #[test]
    fn an_attempt_is_bounded_by_what_is_left_of_the_budget() {
        let mut a = attempts();
        let mut nonces = fixed();
        let Ok(Action::Exec { timeout, vm, .. }) = a.begin(
            Duration::from_secs(8),
            Duration::from_secs(60),
            &mut nonces,
            ExecPurpose::Fixup,
        ) else {
            panic!("an exec")
        };
        assert_eq!(timeout, Duration::from_secs(2));
        assert_eq!(vm.as_str(), "vm-1");
        assert_eq!(a.count, 1);
    }

    #[test]
    fn no_nonce_counts_the_attempt_and_runs_nothing() {
        let mut a = attempts();
        let mut nonces: NonceSource = Box::new(|| Err("no\nrandomness".to_owned()));
        let answer = a.begin(
            Duration::ZERO,
            Duration::from_secs(60),
            &mut nonces,
            ExecPurpose::Prepare,
        );
        assert_eq!(answer.unwrap_err(), "no | randomness");
        assert_eq!(a.count, 1);
        assert!(!a.spent(Duration::from_secs(9)));
        assert!(a.spent(Duration::from_secs(10)));
    }

    #[test]
    fn an_exec_that_ran_nothing_of_the_plan_fails() {
        let mut a = attempts();
        let mut nonces = fixed();
        a.begin(
            Duration::ZERO,
            Duration::from_secs(60),
            &mut nonces,
            ExecPurpose::Fixup,
        )
        .unwrap();
        let out = ExecOutput {
            status: ExitStatusKind::Code(0),
            stdout: Vec::new(),
            stderr: Vec::new(),
            stderr_cut: false,
        };
        assert!(a.verdict(Ok(out)).is_err());
    }

    #[test]
    fn the_next_attempt_comes_only_inside_the_budget() {
        let mut a = attempts();
        let interval = Duration::from_secs(3);
        assert_eq!(
            a.failed("attempt 1: x".into(), Duration::from_secs(6), interval),
            Some(Duration::from_secs(9))
        );
        assert_eq!(
            a.failed("attempt 2: y".into(), Duration::from_secs(7), interval),
            None
        );
        assert_eq!(a.errors, ["attempt 1: x", "attempt 2: y"]);
    }

    #[test]
    fn no_attempt_follows_a_last_chance() {
        let mut a = attempts();
        a.last_chance = true;
        assert_eq!(
            a.failed(
                "attempt 9: x".into(),
                Duration::ZERO,
                Duration::from_secs(3)
            ),
            None
        );
    }
}
