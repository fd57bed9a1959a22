//! Time and shutdown as parameters of a pass: every budget, interval and
//! size limit of spec section 10 in one [`Budgets`] value, and the [`StopCheck`]
//! check that ends a pass early.
//!
//! Production uses [`Budgets::default`], which holds exactly the spec's
//! numbers; tests pass millisecond budgets so that a 60-try enumeration
//! runs in well under a second.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// The budgets of one pass. [`Budgets::default`] is spec section 10; the
/// numbers are not configurable in production (no flag, no file), only
/// through this value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budgets {
    /// Connection tries, repeated within this budget: 60 s (upstream's
    /// dial deadline). A VM that just resumed may take a while to bring
    /// its console up.
    pub dial_total: Duration,
    /// Once connected, the first `SAC>` has its own budget: 60 s
    /// (upstream's second wait).
    pub prompt_total: Duration,
    /// One connection try: 5 s.
    pub connect_try: Duration,
    /// Pause after a failed connection try: 2 s.
    pub connect_retry: Duration,
    /// How long one empty line waits for `SAC>` before another is sent:
    /// 5 s.
    pub prompt_read: Duration,
    /// Before each command, whatever arrives within this window is read and
    /// thrown away, so stale console output is not taken for the answer:
    /// 200 ms.
    pub drain: Duration,
    /// How long one command waits for an answer containing `SAC>`: 5 s.
    pub answer: Duration,
    /// The longest answer kept: 64 KiB (65536 bytes). The guest writes the
    /// console, so a longer answer fails the command instead of growing
    /// memory.
    pub answer_max: usize,
    /// Enumeration tries (`i`) until enough interfaces are listed: 60. A
    /// try that gets no answer counts.
    pub enum_tries: u32,
    /// Pause between enumeration tries: 2 s.
    pub enum_interval: Duration,
    /// Set-and-check rounds per static NIC: 10.
    pub set_rounds: u32,
    /// Pause between set-and-check rounds: 2 s.
    pub set_interval: Duration,
    /// The longest stretch any wait or read runs without consulting the
    /// [`StopCheck`]: 100 ms, so a shutdown ends even a 60 s dial at once.
    pub stop_poll: Duration,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            dial_total: Duration::from_secs(60),
            prompt_total: Duration::from_secs(60),
            connect_try: Duration::from_secs(5),
            connect_retry: Duration::from_secs(2),
            prompt_read: Duration::from_secs(5),
            drain: Duration::from_millis(200),
            answer: Duration::from_secs(5),
            answer_max: 64 * 1024,
            enum_tries: 60,
            enum_interval: Duration::from_secs(2),
            set_rounds: 10,
            set_interval: Duration::from_secs(2),
            stop_poll: Duration::from_millis(100),
        }
    }
}

impl Budgets {
    /// [`Budgets::stop_poll`], never zero (a zero read timeout means "block
    /// forever" to the socket API).
    pub(crate) fn poll(&self) -> Duration {
        self.stop_poll.max(Duration::from_millis(1))
    }
}

/// The pass's total deadline: every step of it, every NIC included, ends
/// by `at` (spec section 10, better than upstream: upstream's own budgets
/// let a console that answers each line just in time hold the pass for
/// minutes). `total` is the whole span, for messages. A step that is cut
/// short by it fails as [`crate::SacError::Deadline`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    pub at: Instant,
    pub total: Duration,
}

impl Deadline {
    /// `left` from now, of a pass of `total`.
    pub fn after(left: Duration, total: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + left,
            total,
        }
    }
}

/// When to stop a pass early: a shutdown, or (when the caller folds it into
/// the check) the pod deleted or handed over, which spec section 8's table
/// decides. Consulted before the pass, between tries, before each set line,
/// and at least every [`Budgets::stop_poll`] during any wait.
#[derive(Clone, Default)]
pub struct StopCheck(Option<Arc<dyn Fn() -> bool + Send + Sync>>);

impl StopCheck {
    /// A check that never stops the pass.
    pub fn never() -> StopCheck {
        StopCheck(None)
    }

    /// Stops once `flag` is set.
    pub fn flag(flag: Arc<AtomicBool>) -> StopCheck {
        StopCheck::when(move || flag.load(Ordering::SeqCst))
    }

    /// Stops once `check` returns true. It is called often (at least every
    /// [`Budgets::stop_poll`]), so it must be cheap and must not block.
    pub fn when(check: impl Fn() -> bool + Send + Sync + 'static) -> StopCheck {
        StopCheck(Some(Arc::new(check)))
    }

    /// Whether the pass should stop now.
    pub fn is_set(&self) -> bool {
        self.0.as_ref().is_some_and(|check| check())
    }

    /// Sleeps for `span`, in slices of at most `poll`; false when the check
    /// said to stop before the span ended.
    pub(crate) fn sleep(&self, span: Duration, poll: Duration) -> bool {
        let end = Instant::now() + span;
        loop {
            if self.is_set() {
                return false;
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            thread::sleep(left.min(poll));
        }
    }
}

impl fmt::Debug for StopCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            None => f.write_str("StopCheck::never"),
            Some(_) => f.write_str("StopCheck::when(..)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_spec_numbers() {
        let b = Budgets::default();
        assert_eq!(b.dial_total, Duration::from_secs(60));
        assert_eq!(b.prompt_total, Duration::from_secs(60));
        assert_eq!(b.connect_try, Duration::from_secs(5));
        assert_eq!(b.connect_retry, Duration::from_secs(2));
        assert_eq!(b.prompt_read, Duration::from_secs(5));
        assert_eq!(b.drain, Duration::from_millis(200));
        assert_eq!(b.answer, Duration::from_secs(5));
        assert_eq!(b.answer_max, 65536);
        assert_eq!(b.enum_tries, 60);
        assert_eq!(b.enum_interval, Duration::from_secs(2));
        assert_eq!(b.set_rounds, 10);
        assert_eq!(b.set_interval, Duration::from_secs(2));
        assert_eq!(b.stop_poll, Duration::from_millis(100));
    }

    #[test]
    fn stop_flag_and_never() {
        let flag = Arc::new(AtomicBool::new(false));
        let stop = StopCheck::flag(flag.clone());
        assert!(!stop.is_set());
        flag.store(true, Ordering::SeqCst);
        assert!(stop.is_set());
        assert!(!StopCheck::never().is_set());
        assert!(!StopCheck::default().is_set());
    }

    #[test]
    fn sleep_reports_a_stop() {
        let stop = StopCheck::when(|| true);
        assert!(!stop.sleep(Duration::from_secs(60), Duration::from_millis(1)));
        assert!(StopCheck::never().sleep(Duration::from_millis(1), Duration::from_millis(1)));
    }

    #[test]
    fn poll_is_never_zero() {
        let b = Budgets {
            stop_poll: Duration::ZERO,
            ..Budgets::default()
        };
        assert_eq!(b.poll(), Duration::from_millis(1));
    }
}
