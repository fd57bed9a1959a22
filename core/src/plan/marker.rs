//! The marker protocol between the exec script and [`attribute_failure`],
//! defined once here for both sides. The module docs of
//! [`plan`](super#marker-protocol) describe it.
//!
//! A marker line is [`PREFIX`], the exec's [`Nonce`], a space, and an
//! event: `step <n>/<total> start`, `step <n>/<total> failed exit <code>`,
//! `step <n>/<total> ignored exit <code>` or `done`. The script writes the
//! prefix and the event from its text and the nonce from its argument.
//!
//! [`attribute_failure`]: super::attribute_failure

use super::Nonce;

/// What every marker line starts with.
pub(super) const PREFIX: &str = "cocoon-fixup: ";

/// The event of the marker written after the last step.
pub(super) const DONE: &str = "done";

/// The event of the marker written before step `n` of `total` runs.
pub(super) fn start(n: usize, total: usize) -> String {
    format!("step {n}/{total} start")
}

/// The event of step `n`'s failure marker, up to the exit code the script
/// appends.
pub(super) fn failed_prefix(n: usize, total: usize) -> String {
    format!("step {n}/{total} failed exit ")
}

/// The event of a failed best-effort step's marker, up to the exit code.
pub(super) fn ignored_prefix(n: usize, total: usize) -> String {
    format!("step {n}/{total} ignored exit ")
}

/// The whole marker line for `event` (without its line breaks), as the
/// exec script with `nonce` writes it.
pub(super) fn line(nonce: &Nonce, event: &str) -> String {
    format!("{PREFIX}{nonce} {event}")
}

/// A parsed marker line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Marker {
    Start {
        step: usize,
        total: usize,
    },
    Failed {
        step: usize,
        total: usize,
        code: i32,
    },
    Ignored {
        step: usize,
        total: usize,
        code: i32,
    },
    Done,
}

impl Marker {
    /// Whether the marker belongs to a plan of `total` steps.
    pub(super) fn fits(self, total: usize) -> bool {
        match self {
            Marker::Start { step, total: t }
            | Marker::Failed { step, total: t, .. }
            | Marker::Ignored { step, total: t, .. } => t == total && (1..=total).contains(&step),
            Marker::Done => true,
        }
    }
}

/// Parse one line (without its `\n`) of an exec whose nonce is `nonce`;
/// `None` when it is not a marker of that exec: a line with another nonce,
/// or none, is not.
pub(super) fn parse(line: &[u8], nonce: &Nonce) -> Option<Marker> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = std::str::from_utf8(line).ok()?;
    let event = line
        .strip_prefix(PREFIX)?
        .strip_prefix(nonce.as_str())?
        .strip_prefix(' ')?;
    if event == DONE {
        return Some(Marker::Done);
    }
    let rest = event.strip_prefix("step ")?;
    let (counts, event) = rest.split_once(' ')?;
    let (step, total) = counts.split_once('/')?;
    let (step, total) = (number(step)?, number(total)?);
    if event == "start" {
        return Some(Marker::Start { step, total });
    }
    if let Some(code) = event.strip_prefix("failed exit ") {
        let code = code_number(code)?;
        return Some(Marker::Failed { step, total, code });
    }
    let code = code_number(event.strip_prefix("ignored exit ")?)?;
    Some(Marker::Ignored { step, total, code })
}

/// A decimal number of plain digits (no sign, no spaces).
fn number(s: &str) -> Option<usize> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// An exit code: digits, with a `-` allowed (Windows codes read as i32).
fn code_number(s: &str) -> Option<i32> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    number(digits)?;
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    const N: &str = "0123456789abcdef0123456789abcdef";

    fn nonce() -> Nonce {
        Nonce::parse(N).unwrap()
    }

    fn ours(event: &str) -> String {
        line(&nonce(), event)
    }

    #[rstest]
    #[case(&ours(&start(3, 9)), Some(Marker::Start { step: 3, total: 9 }))]
    #[case(&ours(&format!("{}2", failed_prefix(3, 9))), Some(Marker::Failed { step: 3, total: 9, code: 2 }))]
    #[case(&ours(&format!("{}127", ignored_prefix(1, 1))), Some(Marker::Ignored { step: 1, total: 1, code: 127 }))]
    #[case(&ours(&format!("{}-1073741510\r", failed_prefix(1, 2))), Some(Marker::Failed { step: 1, total: 2, code: -1073741510 }))]
    #[case(&ours(DONE), Some(Marker::Done))]
    #[case(&format!("cocoon-fixup: {N} done\r"), Some(Marker::Done))]
    #[case(&format!("cocoon-fixup: {N} step 3/9 start "), None)]
    #[case(&format!(" cocoon-fixup: {N} step 3/9 start"), None)]
    #[case(&format!("cocoon-fixup: {N} step +3/9 start"), None)]
    #[case(&format!("cocoon-fixup: {N} step 3/9 failed exit "), None)]
    #[case(&format!("cocoon-fixup: {N} step 3/9 failed exit +2"), None)]
    #[case(&format!("cocoon-fixup: {N} step 3 start"), None)]
    #[case(&format!("cocoon-fixup: {N} step 3/9 finish"), None)]
    #[case(&format!("error: cocoon-fixup: {N} step 3/9 start"), None)]
    #[case(&format!("cocoon-fixup: {N}  done"), None)]
    #[case(&format!("cocoon-fixup: {N}done"), None)]
    // Without the exec's nonce a line is no marker, whatever it says.
    #[case::no_nonce("cocoon-fixup: done", None)]
    #[case::no_nonce_step("cocoon-fixup: step 3/9 failed exit 2", None)]
    #[case::empty_nonce("cocoon-fixup:  done", None)]
    #[case::other_nonce("cocoon-fixup: ffffffffffffffffffffffffffffffff done", None)]
    #[case::other_nonce_step("cocoon-fixup: 0123456789abcdef0123456789abcdee step 1/9 start", None)]
    #[case::nonce_prefix("cocoon-fixup: 0123456789abcdef done", None)]
    #[case::upper_case_nonce("cocoon-fixup: 0123456789ABCDEF0123456789ABCDEF done", None)]
    fn parses_marker_lines(#[case] line: &str, #[case] marker: Option<Marker>) {
        assert_eq!(parse(line.as_bytes(), &nonce()), marker);
    }

    #[test]
    fn a_marker_line_is_prefix_nonce_event() {
        assert_eq!(ours(DONE), format!("cocoon-fixup: {N} done"));
        assert_eq!(
            ours(&start(2, 5)),
            format!("cocoon-fixup: {N} step 2/5 start")
        );
    }

    #[test]
    fn markers_fit_their_plan_only() {
        assert!(Marker::Start { step: 2, total: 2 }.fits(2));
        assert!(!Marker::Start { step: 3, total: 2 }.fits(2));
        assert!(!Marker::Start { step: 0, total: 2 }.fits(2));
        assert!(!Marker::Start { step: 1, total: 3 }.fits(2));
    }
}
