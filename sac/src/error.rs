//! What can go wrong in a SAC pass, and the Warning event each failure
//! asks for (spec section 10's failure table, event reasons of section 9).
//!
//! The four failures of the table keep the table's texts exactly: other
//! components of the stack read them. Two more errors are the caller's
//! input ([`SacError::Invalid`]) and a console path this crate will not use
//! ([`SacError::Refused`]); [`SacError::Stopped`] is not a failure at all.

use std::fmt;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

/// Event reasons of the SAC pass (spec section 9), all Warning.
pub mod reasons {
    /// No connection, or no `SAC>` prompt, within the dial budget.
    pub const DIAL_FAILED: &str = "PostCloneSACDialFailed";
    /// Too few interfaces listed after every enumeration try.
    pub const ENUM_FAILED: &str = "PostCloneSACEnumFailed";
    /// A set line got no answer.
    pub const SET_FAILED: &str = "PostCloneSACSetFailed";
    /// The address did not show after every set-and-check round.
    pub const VERIFY_FAILED: &str = "PostCloneSACVerifyFailed";
}

/// The step a pass was in when its total deadline passed
/// ([`SacError::Deadline`]): it decides the Warning event, as the step's
/// own failure would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Connecting, or waiting for the first `SAC>`.
    Dial,
    /// Listing the interfaces.
    Enum,
    /// Sending the set line for `net` (or about to).
    Set { net: u32 },
    /// Checking that `ip` shows for `net`, or pausing between rounds.
    Verify { net: u32, ip: Ipv4Addr },
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Dial => f.write_str("dial"),
            Step::Enum => f.write_str("enum"),
            Step::Set { net } => write!(f, "set ip net {net}"),
            Step::Verify { net, ip } => write!(f, "verify net {net} ip {ip}"),
        }
    }
}

/// A span as upstream prints one: Go's `time.Duration` notation (`45s`,
/// `1m30s`, `2m0s`, `1h0m0s`, `1.5s`, `500ms`, `0s`). The host's messages
/// all use it (`fixup_core::annotations::messages::span` is this).
pub(crate) struct Span(pub Duration);

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&go_duration(self.0))
    }
}

/// `d` in Go's `time.Duration` notation, as upstream prints durations.
pub fn go_duration(d: Duration) -> String {
    use std::fmt::Write as _;
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos < 1_000_000_000 {
        let (unit, scale) = match nanos {
            ..1_000 => ("ns", 1),
            1_000..1_000_000 => ("µs", 1_000),
            _ => ("ms", 1_000_000),
        };
        return format!("{}{unit}", decimal(nanos, scale));
    }
    let secs = d.as_secs();
    let mut out = String::new();
    if secs >= 3600 {
        let _ = write!(out, "{}h", secs / 3600);
    }
    if secs >= 60 {
        let _ = write!(out, "{}m", secs / 60 % 60);
    }
    let rest = u128::from(secs % 60) * 1_000_000_000 + u128::from(d.subsec_nanos());
    let _ = write!(out, "{}s", decimal(rest, 1_000_000_000));
    out
}

/// `value / scale` in decimal, without trailing zeros (`scale` a power of
/// ten).
fn decimal(value: u128, scale: u128) -> String {
    let (whole, fraction) = (value / scale, value % scale);
    if fraction == 0 {
        return whole.to_string();
    }
    let width = scale.ilog10() as usize;
    let digits = format!("{fraction:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// Why a SAC pass, or one step of it, ended without setting every address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SacError {
    /// No connection, or no `SAC>` prompt, within the dial budget
    /// ([`crate::Budgets::dial_total`], 60 s). `cause` names the last thing
    /// that went wrong and what to check.
    #[error("sac dial: {cause}")]
    Dial { cause: String },
    /// Fewer interfaces than the VM record has NICs after the last
    /// enumeration try ([`crate::Budgets::enum_tries`], 60). `found` is the
    /// count of the last answered listing (0 when none was answered).
    #[error("sac enum exhausted: found {found} need {need}")]
    EnumExhausted { found: usize, need: usize },
    /// The set line for `net` got no answer (no `SAC>` in time, an answer
    /// over the size limit, a closed socket). The pass ends at once.
    #[error("sac set ip net {net}: {cause}")]
    SetIp { net: u32, cause: String },
    /// `ip` was not listed for `net` after the last set-and-check round
    /// ([`crate::Budgets::set_rounds`], 10).
    #[error("sac verify exhausted: net {net} ip {ip} did not take effect")]
    VerifyExhausted { net: u32, ip: Ipv4Addr },
    /// The pass's total deadline ([`crate::Deadline`], every NIC included)
    /// passed during `step`: the pass fails with that step's event. A
    /// hostile guest that answers each line just in time cannot hold the
    /// host past it.
    #[error("sac {step}: {}", deadline_cause(*total))]
    Deadline { step: Step, total: Duration },
    /// The caller's input cannot be used (a VM id that is not one path
    /// component, a prefix outside 1..=32). Found before any byte is sent.
    #[error("sac invalid input: {problem}; {fix}")]
    Invalid { problem: String, fix: &'static str },
    /// The console path below the cocoon root is not one this crate
    /// connects to (a symbolic link on the way, something other than a
    /// socket at the end). Never retried: waiting does not fix it.
    #[error("sac console {} refused: {problem}; {fix}", path.display())]
    Refused {
        path: PathBuf,
        problem: String,
        fix: &'static str,
    },
    /// The stop check said to stop (a shutdown, the pod deleted or handed
    /// over). Not a failure: nothing is to be reported, and resumed work
    /// runs the pass again.
    #[error("sac pass stopped before it finished; it runs again when the work resumes")]
    Stopped,
}

/// The cause of a [`SacError::Deadline`].
fn deadline_cause(total: Duration) -> String {
    format!("the pass's total deadline of {} passed", Span(total))
}

impl SacError {
    /// Whether this ends the pass as a failure: everything but
    /// [`SacError::Stopped`].
    pub fn is_failure(&self) -> bool {
        !matches!(self, SacError::Stopped)
    }

    /// The Warning event reason for the four failures of spec section 10's
    /// table. `None` for [`SacError::Invalid`] and [`SacError::Refused`],
    /// which the caller reports as the bad input they are, and for
    /// [`SacError::Stopped`], which is not reported.
    pub fn event_reason(&self) -> Option<&'static str> {
        match self {
            SacError::Dial { .. } => Some(reasons::DIAL_FAILED),
            SacError::EnumExhausted { .. } => Some(reasons::ENUM_FAILED),
            SacError::SetIp { .. } => Some(reasons::SET_FAILED),
            SacError::VerifyExhausted { .. } => Some(reasons::VERIFY_FAILED),
            SacError::Deadline { step, .. } => Some(match step {
                Step::Dial => reasons::DIAL_FAILED,
                Step::Enum => reasons::ENUM_FAILED,
                Step::Set { .. } => reasons::SET_FAILED,
                Step::Verify { .. } => reasons::VERIFY_FAILED,
            }),
            SacError::Invalid { .. } | SacError::Refused { .. } | SacError::Stopped => None,
        }
    }

    /// The event message that goes with [`SacError::event_reason`], as the
    /// table says: the dial's cause, `net <n>: <cause>` for a set, the
    /// error itself otherwise. Not capped here: the event writer cuts every
    /// message to 512 bytes (spec section 9).
    pub fn event_message(&self) -> Option<String> {
        match self {
            SacError::Dial { cause } => Some(cause.clone()),
            SacError::SetIp { net, cause } => Some(format!("net {net}: {cause}")),
            SacError::Deadline { step, total } => Some(match step {
                Step::Dial => deadline_cause(*total),
                Step::Set { net } => format!("net {net}: {}", deadline_cause(*total)),
                Step::Enum | Step::Verify { .. } => self.to_string(),
            }),
            SacError::EnumExhausted { .. } | SacError::VerifyExhausted { .. } => {
                Some(self.to_string())
            }
            SacError::Invalid { .. } | SacError::Refused { .. } | SacError::Stopped => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::dial(
        SacError::Dial { cause: "no `SAC>` prompt".into() },
        "sac dial: no `SAC>` prompt",
        Some(("PostCloneSACDialFailed", "no `SAC>` prompt")),
    )]
    #[case::enumerate(
        SacError::EnumExhausted { found: 1, need: 2 },
        "sac enum exhausted: found 1 need 2",
        Some(("PostCloneSACEnumFailed", "sac enum exhausted: found 1 need 2")),
    )]
    #[case::set(
        SacError::SetIp { net: 7, cause: "the console closed".into() },
        "sac set ip net 7: the console closed",
        Some(("PostCloneSACSetFailed", "net 7: the console closed")),
    )]
    #[case::verify(
        SacError::VerifyExhausted { net: 9, ip: Ipv4Addr::new(10, 88, 0, 12) },
        "sac verify exhausted: net 9 ip 10.88.0.12 did not take effect",
        Some((
            "PostCloneSACVerifyFailed",
            "sac verify exhausted: net 9 ip 10.88.0.12 did not take effect",
        )),
    )]
    #[case::deadline_dial(
        SacError::Deadline { step: Step::Dial, total: Duration::from_secs(120) },
        "sac dial: the pass's total deadline of 2m0s passed",
        Some(("PostCloneSACDialFailed", "the pass's total deadline of 2m0s passed")),
    )]
    #[case::deadline_enum(
        SacError::Deadline { step: Step::Enum, total: Duration::from_millis(1500) },
        "sac enum: the pass's total deadline of 1.5s passed",
        Some(("PostCloneSACEnumFailed", "sac enum: the pass's total deadline of 1.5s passed")),
    )]
    #[case::deadline_set(
        SacError::Deadline { step: Step::Set { net: 7 }, total: Duration::from_secs(120) },
        "sac set ip net 7: the pass's total deadline of 2m0s passed",
        Some(("PostCloneSACSetFailed", "net 7: the pass's total deadline of 2m0s passed")),
    )]
    #[case::deadline_verify(
        SacError::Deadline {
            step: Step::Verify { net: 7, ip: Ipv4Addr::new(10, 0, 0, 5) },
            total: Duration::from_secs(120),
        },
        "sac verify net 7 ip 10.0.0.5: the pass's total deadline of 2m0s passed",
        Some((
            "PostCloneSACVerifyFailed",
            "sac verify net 7 ip 10.0.0.5: the pass's total deadline of 2m0s passed",
        )),
    )]
    #[case::invalid(
        SacError::Invalid { problem: "prefix 33 is outside 1..=32".into(), fix: "fix it" },
        "sac invalid input: prefix 33 is outside 1..=32; fix it",
        None
    )]
    #[case::refused(
        SacError::Refused { path: "/r/run".into(), problem: "is a symbolic link".into(), fix: "remove it" },
        "sac console /r/run refused: is a symbolic link; remove it",
        None
    )]
    #[case::stopped(
        SacError::Stopped,
        "sac pass stopped before it finished; it runs again when the work resumes",
        None
    )]
    fn texts_and_events(
        #[case] error: SacError,
        #[case] text: &str,
        #[case] event: Option<(&str, &str)>,
    ) {
        assert_eq!(error.to_string(), text);
        let got = error.event_reason().zip(error.event_message());
        assert_eq!(got.as_ref().map(|(r, m)| (*r, m.as_str())), event);
        assert_eq!(error.is_failure(), error != SacError::Stopped);
    }
}
