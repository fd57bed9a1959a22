//! The marker protocol between the exec script and [`attribute_failure`],
//! defined once here for both sides. The module docs of
//! [`plan`](super#marker-protocol) describe it.
//!
//! [`attribute_failure`]: super::attribute_failure

/// What every marker line starts with.
pub(super) const PREFIX: &str = "cocoon-fixup: ";

/// The marker written after the last step.
pub(super) const DONE: &str = "cocoon-fixup: done";

/// The marker written before step `n` of `total` runs.
pub(super) fn start(n: usize, total: usize) -> String {
    format!("{PREFIX}step {n}/{total} start")
}

/// The failure marker of step `n`, up to the exit code the script appends.
pub(super) fn failed_prefix(n: usize, total: usize) -> String {
    format!("{PREFIX}step {n}/{total} failed exit ")
}

/// The marker of a failed best-effort step, up to the exit code.
pub(super) fn ignored_prefix(n: usize, total: usize) -> String {
    format!("{PREFIX}step {n}/{total} ignored exit ")
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

/// Parse one line (without its `\n`); `None` when it is not a marker.
pub(super) fn parse(line: &[u8]) -> Option<Marker> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = std::str::from_utf8(line).ok()?;
    if line == DONE {
        return Some(Marker::Done);
    }
    let rest = line.strip_prefix(PREFIX)?.strip_prefix("step ")?;
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

    #[rstest]
    #[case(&start(3, 9), Some(Marker::Start { step: 3, total: 9 }))]
    #[case(&format!("{}2", failed_prefix(3, 9)), Some(Marker::Failed { step: 3, total: 9, code: 2 }))]
    #[case(&format!("{}127", ignored_prefix(1, 1)), Some(Marker::Ignored { step: 1, total: 1, code: 127 }))]
    #[case(&format!("{}-1073741510\r", failed_prefix(1, 2)), Some(Marker::Failed { step: 1, total: 2, code: -1073741510 }))]
    #[case(DONE, Some(Marker::Done))]
    #[case("cocoon-fixup: done\r", Some(Marker::Done))]
    #[case("cocoon-fixup: step 3/9 start ", None)]
    #[case(" cocoon-fixup: step 3/9 start", None)]
    #[case("cocoon-fixup: step +3/9 start", None)]
    #[case("cocoon-fixup: step 3/9 failed exit ", None)]
    #[case("cocoon-fixup: step 3/9 failed exit +2", None)]
    #[case("cocoon-fixup: step 3 start", None)]
    #[case("cocoon-fixup: step 3/9 finish", None)]
    #[case("error: cocoon-fixup: step 3/9 start", None)]
    fn parses_marker_lines(#[case] line: &str, #[case] marker: Option<Marker>) {
        assert_eq!(parse(line.as_bytes()), marker);
    }

    #[test]
    fn markers_fit_their_plan_only() {
        assert!(Marker::Start { step: 2, total: 2 }.fits(2));
        assert!(!Marker::Start { step: 3, total: 2 }.fits(2));
        assert!(!Marker::Start { step: 0, total: 2 }.fits(2));
        assert!(!Marker::Start { step: 1, total: 3 }.fits(2));
    }
}
