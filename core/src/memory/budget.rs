//! [`Budget`]: the retry budget of one VM's fixup loop, kept in the pod's
//! record so that the loop stops 180 s after its first attempt (spec
//! section 5; `--retry-budget`, [`RetryConfig`]) whether the attempts ran
//! in one task, in a task retried after a node error, or across host
//! restarts, and so that the error chain of `post-clone-errors` keeps the
//! attempts made before a restart.
//!
//! The chain is bounded, so a record stays small whatever the guest
//! prints: at most [`MAX_ERROR_LINES`] lines, [`MAX_ERROR_BYTES`] bytes
//! joined, [`MAX_ERROR_LINE_BYTES`] bytes a line.
//!
//! [`RetryConfig`]: crate::decision::RetryConfig

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::annotations::{ERRORS_ANNOTATION_MAX, EVENT_MESSAGE_MAX, cap_utf8, one_line};
use crate::facts::VmId;

/// At most this many error lines are kept, the newest: 32 covers the
/// default budget's 3 s interval for most of its 180 s, and the annotation
/// (4096 bytes) shows the newest lines anyway.
pub const MAX_ERROR_LINES: usize = 32;

/// The kept lines joined with `\n` take at most this many bytes, the size
/// of `post-clone-errors` (4096, [`ERRORS_ANNOTATION_MAX`]): more could
/// never be shown. The oldest lines are dropped first.
pub const MAX_ERROR_BYTES: usize = ERRORS_ANNOTATION_MAX;

/// One line takes at most this many bytes, the cap of the
/// `PostCloneExecAttemptFailed` event that carries it (512,
/// [`EVENT_MESSAGE_MAX`]); a longer one is cut on a UTF-8 boundary and
/// ends with [`CUT_MARKER`].
pub const MAX_ERROR_LINE_BYTES: usize = EVENT_MESSAGE_MAX;

/// The end of a line that was cut (counted in its bytes).
pub const CUT_MARKER: &str = "… [truncated]";

/// The retry budget of one VM's fixup loop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    vm: String,
    first_attempt_unix_ms: u64,
    attempts: u32,
    #[serde(default)]
    errors: Vec<String>,
    /// The loop's one attempt past the budget is used up, or the loop was
    /// found exhausted: a loop resumed later gets no attempt more (spec
    /// section 8, [`reprieve`](Self::reprieve)).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    reprieved: bool,
}

impl Budget {
    /// A budget for `vm` whose first attempt starts at `now_unix_ms`.
    pub(super) fn new(vm: &VmId, now_unix_ms: u64) -> Self {
        Budget {
            vm: vm.as_str().to_owned(),
            first_attempt_unix_ms: now_unix_ms,
            attempts: 0,
            errors: Vec::new(),
            reprieved: false,
        }
    }

    /// The VM id whose loop this is.
    pub fn vm(&self) -> &str {
        &self.vm
    }

    /// When the first attempt started, in milliseconds since the Unix
    /// epoch (wall-clock time: a monotonic clock does not survive a
    /// restart).
    pub fn first_attempt_unix_ms(&self) -> u64 {
        self.first_attempt_unix_ms
    }

    /// The failed attempts so far: the next attempt is number
    /// `attempts() + 1`.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The error chain's lines kept, oldest first.
    pub fn errors(&self) -> &[String] {
        &self.errors
    }

    /// Time since the first attempt at `now_unix_ms`. A clock set back
    /// before the first attempt reads as no time passed: the loop then
    /// gets its whole budget again rather than none.
    pub fn elapsed(&self, now_unix_ms: u64) -> Duration {
        Duration::from_millis(now_unix_ms.saturating_sub(self.first_attempt_unix_ms))
    }

    /// What is left of `budget` (the configured retry budget, 180 s by
    /// default) at `now_unix_ms`; zero once it has passed, when no attempt
    /// starts any more.
    pub fn remaining(&self, now_unix_ms: u64, budget: Duration) -> Duration {
        budget.saturating_sub(self.elapsed(now_unix_ms))
    }

    /// Whether a resumed loop whose budget ran out may still make one
    /// attempt: upstream gives work it resumes a fresh budget, so a host
    /// that was down longer than what was left of the loop's budget (a
    /// reboot, an upgrade) must not fail the pod without trying (spec
    /// section 8). The stored budget is there so that a crash loop cannot
    /// retry forever, so the attempt past the budget is given once per
    /// loop: after it, or once the loop was found exhausted, this is
    /// false.
    pub fn may_reprieve(&self) -> bool {
        !self.reprieved
    }

    /// The one attempt past the budget is given (or the loop was found
    /// exhausted): no other follows. Returns whether the budget changed.
    pub fn reprieve(&mut self) -> bool {
        !std::mem::replace(&mut self.reprieved, true)
    }

    /// Record a failed attempt and its line of the error chain (`attempt
    /// <n>: <error>`, [`crate::annotations::messages::attempt_line`]).
    /// The line is kept as the chain keeps it (one printable line,
    /// [`one_line`]) and cut to [`MAX_ERROR_LINE_BYTES`]; the oldest lines
    /// are dropped while more than [`MAX_ERROR_LINES`] are kept or they
    /// take more than [`MAX_ERROR_BYTES`] joined. Returns the attempts
    /// made.
    pub fn add_attempt(&mut self, line: &str) -> u32 {
        self.attempts = self.attempts.saturating_add(1);
        self.errors
            .push(cap_utf8(one_line(line), MAX_ERROR_LINE_BYTES, CUT_MARKER));
        while self.errors.len() > MAX_ERROR_LINES || joined_len(&self.errors) > MAX_ERROR_BYTES {
            self.errors.remove(0);
        }
        self.attempts
    }

    /// The bounds [`add_attempt`](Self::add_attempt) keeps, checked on a
    /// stored budget; the answer says which one is broken.
    pub(super) fn check(&self) -> Result<(), String> {
        if self.errors.len() > MAX_ERROR_LINES {
            return Err(format!(
                "keeps {} error lines, over {MAX_ERROR_LINES}",
                self.errors.len()
            ));
        }
        if self.errors.len() > usize::try_from(self.attempts).unwrap_or(usize::MAX) {
            return Err(format!(
                "keeps {} error lines for {} attempts",
                self.errors.len(),
                self.attempts
            ));
        }
        if let Some(line) = self.errors.iter().find(|l| l.len() > MAX_ERROR_LINE_BYTES) {
            return Err(format!(
                "has an error line of {} bytes, over {MAX_ERROR_LINE_BYTES}",
                line.len()
            ));
        }
        if self.errors.iter().any(|l| l.chars().any(char::is_control)) {
            return Err("has an error line with a control character".to_owned());
        }
        let joined = joined_len(&self.errors);
        if joined > MAX_ERROR_BYTES {
            return Err(format!(
                "keeps {joined} bytes of errors, over {MAX_ERROR_BYTES}"
            ));
        }
        Ok(())
    }
}

/// The bytes of `lines` joined with `\n`.
fn joined_len(lines: &[String]) -> usize {
    lines.iter().map(String::len).sum::<usize>() + lines.len().saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    fn budget() -> Budget {
        Budget::new(&VmId::parse("vm-a").unwrap(), 10_000)
    }

    #[rstest]
    #[case::at_once(10_000, 180_000)]
    #[case::midway(100_000, 90_000)]
    #[case::at_the_end(190_000, 0)]
    #[case::long_after(10_000_000, 0)]
    #[case::clock_set_back(5_000, 180_000)]
    fn remaining(#[case] now: u64, #[case] left_ms: u64) {
        let left = budget().remaining(now, Duration::from_secs(180));
        assert_eq!(left, Duration::from_millis(left_ms));
    }

    /// The chain's bounds: lines cut on a character boundary with the
    /// marker, the oldest dropped by count and by bytes, each line made
    /// one printable line.
    #[rstest]
    #[case::short(1, "boom", 1, 4)]
    #[case::cut_on_a_char_boundary(1, &"é".repeat(400), 1, MAX_ERROR_LINE_BYTES)]
    #[case::newline_made_printable(1, "first\nsecond", 1, "first | second".len())]
    #[case::at_most_32_lines(40, "x", MAX_ERROR_LINES, 1)]
    #[case::at_most_4096_bytes(20, &"y".repeat(600), 7, MAX_ERROR_LINE_BYTES)]
    fn the_error_chain_is_bounded(
        #[case] attempts: u32,
        #[case] error: &str,
        #[case] kept: usize,
        #[case] last_line_bytes: usize,
    ) {
        let mut budget = budget();
        for n in 1..=attempts {
            assert_eq!(budget.add_attempt(error), n);
        }
        assert_eq!(budget.attempts(), attempts);
        assert_eq!(budget.errors().len(), kept);
        let last = budget.errors().last().unwrap();
        assert!(last.len() <= last_line_bytes, "{}", last.len());
        assert!(joined_len(budget.errors()) <= MAX_ERROR_BYTES);
        assert!(budget.check().is_ok());
        if error.len() > MAX_ERROR_LINE_BYTES {
            assert!(last.ends_with(CUT_MARKER), "{last}");
            assert!(
                last.len() > MAX_ERROR_LINE_BYTES - 4,
                "cut close to the cap"
            );
        }
    }

    #[test]
    fn the_attempt_past_the_budget_is_given_once() {
        let mut budget = budget();
        assert!(budget.may_reprieve());
        assert!(budget.reprieve());
        assert!(!budget.may_reprieve());
        assert!(!budget.reprieve(), "unchanged");
        let json = serde_json::to_string(&budget).unwrap();
        assert!(json.contains("\"reprieved\":true"), "{json}");
        let back: Budget = serde_json::from_str(&json).unwrap();
        assert!(!back.may_reprieve(), "kept across restarts");
        let fresh = serde_json::to_string(&Budget::new(&VmId::parse("vm-a").unwrap(), 1)).unwrap();
        assert!(!fresh.contains("reprieved"), "{fresh}");
    }

    #[test]
    fn the_newest_lines_are_kept() {
        let mut budget = budget();
        for n in 1..=40 {
            budget.add_attempt(&format!("attempt {n}: boom"));
        }
        assert_eq!(budget.errors().first().unwrap(), "attempt 9: boom");
        assert_eq!(budget.errors().last().unwrap(), "attempt 40: boom");
    }
}
