//! Naming the step that failed: the markers of a failed exec read back.

use std::fmt;

use super::marker::{self, Marker};
use super::render::direct_run;
use super::{Nonce, Plan};

/// Most bytes of stderr a [`StepFailure`] keeps (its tail), 2 KiB: enough
/// for the last error lines of a step, small enough for an annotation.
pub const STDERR_TAIL_MAX: usize = 2048;

/// The end of some stderr, at most [`STDERR_TAIL_MAX`] bytes, cut on a
/// UTF-8 character boundary and decoded lossily.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StderrTail {
    pub text: String,
    /// Earlier bytes were dropped.
    pub cut: bool,
}

impl StderrTail {
    /// The last [`STDERR_TAIL_MAX`] bytes of `bytes`, or fewer: a cut never
    /// starts inside a UTF-8 character.
    pub fn new(bytes: &[u8]) -> StderrTail {
        if bytes.len() <= STDERR_TAIL_MAX {
            return StderrTail {
                text: String::from_utf8_lossy(bytes).into_owned(),
                cut: false,
            };
        }
        let mut start = bytes.len() - STDERR_TAIL_MAX;
        // Skip the continuation bytes (0b10xx_xxxx) of a character whose
        // first byte was cut; at most three.
        for _ in 0..3 {
            if bytes[start] & 0xC0 == 0x80 {
                start += 1;
            }
        }
        StderrTail {
            text: String::from_utf8_lossy(&bytes[start..]).into_owned(),
            cut: true,
        }
    }
}

impl fmt::Display for StderrTail {
    /// The text without trailing whitespace, after a note when it was cut;
    /// `(no stderr)` when there is none.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.text.trim_end();
        match (text.is_empty(), self.cut) {
            (true, false) => f.write_str("(no stderr)"),
            (_, true) => write!(
                f,
                "[earlier stderr cut, last {STDERR_TAIL_MAX} bytes kept] {text}"
            ),
            (false, false) => f.write_str(text),
        }
    }
}

/// Which step a failed exec failed in, and what it printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepFailure {
    /// Step `step` (from 1) of `total` failed with `exit_code`; `stderr` is
    /// what it printed. `exit_code` is `None` only for a plan run directly
    /// (one run step) whose exec ended without an exit code.
    Step {
        step: usize,
        total: usize,
        description: String,
        exit_code: Option<i32>,
        stderr: StderrTail,
    },
    /// Step `step` started and no marker followed: the exec was cut off
    /// (killed, timed out, lost) while it ran. `exit_code` is the exec's.
    Interrupted {
        step: usize,
        total: usize,
        description: String,
        exit_code: Option<i32>,
        stderr: StderrTail,
    },
    /// Every step ran, yet the exec failed afterwards.
    AfterLastStep {
        total: usize,
        exit_code: Option<i32>,
        stderr: StderrTail,
    },
    /// No marker at all: the exec failed before the script started (the
    /// `cocoon` CLI could not reach the VM, or no shell ran). `stderr` is
    /// the tail of everything it printed.
    NotStarted {
        exit_code: Option<i32>,
        stderr: StderrTail,
    },
}

impl StepFailure {
    /// The failed step, counted from 1, when one is known.
    pub fn step(&self) -> Option<usize> {
        match self {
            StepFailure::Step { step, .. } | StepFailure::Interrupted { step, .. } => Some(*step),
            StepFailure::AfterLastStep { .. } | StepFailure::NotStarted { .. } => None,
        }
    }

    pub fn stderr(&self) -> &StderrTail {
        match self {
            StepFailure::Step { stderr, .. }
            | StepFailure::Interrupted { stderr, .. }
            | StepFailure::AfterLastStep { stderr, .. }
            | StepFailure::NotStarted { stderr, .. } => stderr,
        }
    }
}

struct Exit(Option<i32>);

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(code) => write!(f, "exited {code}"),
            None => f.write_str("ended without an exit code"),
        }
    }
}

impl fmt::Display for StepFailure {
    /// `step 5/9 "re-run cloud-init" exited 2: <stderr tail>`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepFailure::Step {
                step,
                total,
                description,
                exit_code,
                stderr,
            } => write!(
                f,
                "step {step}/{total} {description:?} {}: {stderr}",
                Exit(*exit_code)
            ),
            StepFailure::Interrupted {
                step,
                total,
                description,
                exit_code,
                stderr,
            } => write!(
                f,
                "step {step}/{total} {description:?} did not finish: the exec {}: {stderr}",
                Exit(*exit_code)
            ),
            StepFailure::AfterLastStep {
                total,
                exit_code,
                stderr,
            } => write!(
                f,
                "all {total} steps finished, then the exec {}: {stderr}",
                Exit(*exit_code)
            ),
            StepFailure::NotStarted { exit_code, stderr } => write!(
                f,
                "the exec {} before the first step started: {stderr}",
                Exit(*exit_code)
            ),
        }
    }
}

/// A failed attempt's error can carry the failure as its `#[source]`.
impl std::error::Error for StepFailure {}

/// Name the step a failed exec of [`exec_argv`](super::exec_argv)`(plan, _,
/// nonce)` failed in, from the exec's exit code (`None` when it had none)
/// and its stderr.
///
/// The last failure marker names the step; its stderr is what the step
/// printed after its start marker, markers removed. A plan run directly (one
/// run step) has no markers: step 1 is blamed, with all of stderr (so a
/// `cocoon` CLI failure there is blamed on the step too). Without a failure
/// marker, the last marker says how far the script got; with no marker at
/// all, the script never started. Only markers with this exec's `nonce`
/// and the plan's size are ours: any other marker-like line (a guest
/// program's forgery, an older exec's, another plan's) counts as stderr.
pub fn attribute_failure(
    plan: &Plan,
    nonce: &Nonce,
    exit_code: Option<i32>,
    stderr: &[u8],
) -> StepFailure {
    let total = plan.steps.len();
    let description = |step: usize| plan.steps[step - 1].description.clone();
    if direct_run(plan).is_some() {
        return StepFailure::Step {
            step: 1,
            total,
            description: description(1),
            exit_code,
            stderr: StderrTail::new(stderr),
        };
    }
    let found = find_markers(stderr, total, nonce);
    let failed = found
        .iter()
        .rposition(|m| matches!(m.marker, Marker::Failed { .. }));
    if let Some(f) = failed {
        let Marker::Failed { step, code, .. } = found[f].marker else {
            unreachable!("rposition found a failure marker");
        };
        // The step's output begins after its start marker.
        let from = found[..f]
            .iter()
            .rev()
            .find(|m| m.marker == Marker::Start { step, total })
            .map_or(0, |m| m.end);
        return StepFailure::Step {
            step,
            total,
            description: description(step),
            exit_code: Some(code),
            stderr: StderrTail::new(&unmarked(stderr, &found, from, found[f].start)),
        };
    }
    let Some(last) = found.last() else {
        return StepFailure::NotStarted {
            exit_code,
            stderr: StderrTail::new(stderr),
        };
    };
    let rest = StderrTail::new(&unmarked(stderr, &found, last.end, stderr.len()));
    match last.marker {
        Marker::Done => StepFailure::AfterLastStep {
            total,
            exit_code,
            stderr: rest,
        },
        Marker::Start { step, .. } | Marker::Ignored { step, .. } | Marker::Failed { step, .. } => {
            StepFailure::Interrupted {
                step,
                total,
                description: description(step),
                exit_code,
                stderr: rest,
            }
        }
    }
}

/// Whether an exec of [`exec_argv`](super::exec_argv)`(plan, _, nonce)`
/// ran the whole script: its last marker in `stderr` is the done marker
/// with this exec's `nonce`. A plan run directly (one run step) has no
/// markers, and its exit code alone says.
///
/// An exit code of 0 is not enough: a step that ends the script (`exit 0`
/// through `command`, `exec true`, a `kill` of its shell) would skip every
/// later step, other plugins' included, and look like success. Nor is a
/// done marker without the nonce: any guest program can print that line,
/// but none knew the nonce before the exec started.
pub fn ran_to_completion(plan: &Plan, nonce: &Nonce, stderr: &[u8]) -> bool {
    direct_run(plan).is_some()
        || find_markers(stderr, plan.steps.len(), nonce)
            .last()
            .is_some_and(|m| m.marker == Marker::Done)
}

/// A marker line found in stderr, with the byte range it takes: from the
/// line break written before it to the end of its own line break.
#[derive(Debug)]
struct Found {
    marker: Marker,
    start: usize,
    end: usize,
}

/// The markers of an exec with `nonce` of a plan of `total` steps, in
/// order.
fn find_markers(stderr: &[u8], total: usize, nonce: &Nonce) -> Vec<Found> {
    let mut found = Vec::new();
    let mut line_start = 0;
    while line_start <= stderr.len() {
        let rest = &stderr[line_start..];
        let (line, end) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&rest[..i], line_start + i + 1),
            None => (rest, stderr.len()),
        };
        if line.starts_with(marker::PREFIX.as_bytes())
            && let Some(m) = marker::parse(line, nonce)
            && m.fits(total)
        {
            // Claim the line break the script wrote before the marker
            // (`\r\n` from PowerShell), unless an earlier marker owns it.
            let floor = found.last().map_or(0, |f: &Found| f.end);
            let mut start = line_start;
            if start > floor && stderr[start - 1] == b'\n' {
                start -= 1;
                if start > floor && stderr[start - 1] == b'\r' {
                    start -= 1;
                }
            }
            found.push(Found {
                marker: m,
                start,
                end,
            });
        }
        if end == stderr.len() {
            break;
        }
        line_start = end;
    }
    found
}

/// The bytes of `stderr[from..to]` outside every marker's range.
fn unmarked(stderr: &[u8], found: &[Found], from: usize, to: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = from;
    for m in found.iter().filter(|m| m.end > from && m.start < to) {
        if m.start > at {
            out.extend_from_slice(&stderr[at..m.start]);
        }
        at = at.max(m.end);
    }
    if to > at {
        out.extend_from_slice(&stderr[at..to]);
    }
    out
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;
    use crate::plan::{Dialect, Phase, Step, StepAction};

    /// The exec's nonce in these tests.
    const N: &str = "0123456789abcdef0123456789abcdef";
    /// Another exec's nonce.
    const OTHER: &str = "fedcba9876543210fedcba9876543210";

    fn nonce() -> Nonce {
        Nonce::parse(N).unwrap()
    }

    /// `text` with each `@` replaced by the exec's nonce.
    fn ours(text: &str) -> String {
        text.replace('@', N)
    }

    fn attribute(plan: &Plan, exit_code: Option<i32>, stderr: &str) -> StepFailure {
        attribute_failure(plan, &nonce(), exit_code, ours(stderr).as_bytes())
    }

    fn completed(plan: &Plan, stderr: &str) -> bool {
        ran_to_completion(plan, &nonce(), ours(stderr).as_bytes())
    }

    fn plan(n: usize) -> Plan {
        Plan {
            dialect: Dialect::PosixSh,
            steps: (1..=n)
                .map(|i| Step {
                    description: format!("step number {i}"),
                    phase: Phase::Configure,
                    best_effort: false,
                    action: StepAction::Run(vec!["true".into()]),
                })
                .collect(),
        }
    }

    fn tail(text: &str) -> StderrTail {
        StderrTail {
            text: text.into(),
            cut: false,
        }
    }

    fn step_failure(step: usize, total: usize, code: i32, text: &str) -> StepFailure {
        StepFailure::Step {
            step,
            total,
            description: format!("step number {step}"),
            exit_code: Some(code),
            stderr: tail(text),
        }
    }

    #[rstest]
    #[case::no_trailing_newline(
        "\ncocoon-fixup: @ step 1/3 start\n\ncocoon-fixup: @ step 2/3 start\nboom\ncocoon-fixup: @ step 2/3 failed exit 3\n",
        step_failure(2, 3, 3, "boom")
    )]
    #[case::trailing_newline(
        "\ncocoon-fixup: @ step 1/3 start\nwarn\n\ncocoon-fixup: @ step 2/3 start\nline 1\nline 2\n\ncocoon-fixup: @ step 2/3 failed exit 2\n",
        step_failure(2, 3, 2, "line 1\nline 2\n")
    )]
    #[case::silent_step(
        "\ncocoon-fixup: @ step 1/3 start\n\ncocoon-fixup: @ step 1/3 failed exit 127\n",
        step_failure(1, 3, 127, "")
    )]
    #[case::after_ignored(
        "\ncocoon-fixup: @ step 1/3 start\nx\n\ncocoon-fixup: @ step 1/3 ignored exit 1\n\ncocoon-fixup: @ step 2/3 start\ny\ncocoon-fixup: @ step 2/3 failed exit 4\n",
        step_failure(2, 3, 4, "y")
    )]
    #[case::crlf(
        "\r\ncocoon-fixup: @ step 1/3 start\r\nbad thing\r\n\r\ncocoon-fixup: @ step 1/3 failed exit -1\r\n",
        step_failure(1, 3, -1, "bad thing\r\n")
    )]
    #[case::inline_lookalike(
        "\ncocoon-fixup: @ step 1/3 start\nsaid cocoon-fixup: @ step 3/3 failed exit 9\n\ncocoon-fixup: @ step 1/3 failed exit 5\n",
        step_failure(1, 3, 5, &ours("said cocoon-fixup: @ step 3/3 failed exit 9\n"))
    )]
    #[case::other_plans_marker(
        "\ncocoon-fixup: @ step 1/3 start\ncocoon-fixup: @ step 1/7 failed exit 9\n\ncocoon-fixup: @ step 1/3 failed exit 5\n",
        step_failure(1, 3, 5, &ours("cocoon-fixup: @ step 1/7 failed exit 9\n"))
    )]
    fn failure_marker_names_the_step(#[case] stderr: &str, #[case] expected: StepFailure) {
        assert_eq!(attribute(&plan(3), Some(9), stderr), expected);
    }

    /// A guest program that prints markers without this exec's nonce (none,
    /// an older exec's, a guess) cannot move the blame: its lines are the
    /// step's stderr.
    #[rstest]
    #[case::no_nonce("cocoon-fixup: step 3/3 failed exit 9\n")]
    #[case::other_nonce(&format!("cocoon-fixup: {OTHER} step 3/3 failed exit 9\n"))]
    #[case::empty_nonce("cocoon-fixup:  step 3/3 failed exit 9\n")]
    fn forged_failure_markers_are_stderr(#[case] forged: &str) {
        let stderr = format!(
            "\ncocoon-fixup: @ step 1/3 start\n\ncocoon-fixup: @ step 2/3 start\n\n{forged}\ncocoon-fixup: @ step 2/3 failed exit 5\n"
        );
        assert_eq!(
            attribute(&plan(3), Some(5), &stderr),
            step_failure(2, 3, 5, &format!("\n{forged}"))
        );
        // Forged markers alone: the script never started, as far as the
        // host can tell.
        let only = format!("\n{forged}\ncocoon-fixup: done\n");
        assert!(matches!(
            attribute(&plan(3), Some(5), &only),
            StepFailure::NotStarted { .. }
        ));
    }

    /// A done marker without this exec's nonce is no success: the step
    /// that was running when the script ended is named.
    #[rstest]
    #[case::no_nonce("cocoon-fixup: done")]
    #[case::other_nonce(&format!("cocoon-fixup: {OTHER} done"))]
    #[case::empty_nonce("cocoon-fixup:  done")]
    #[case::short_nonce("cocoon-fixup: 0123456789abcdef done")]
    fn forged_done_markers_do_not_complete(#[case] forged: &str) {
        let p = plan(3);
        let ended_early = format!(
            "\ncocoon-fixup: @ step 1/3 start\n\ncocoon-fixup: @ step 2/3 start\n\n{forged}\n"
        );
        assert!(!completed(&p, &ended_early));
        assert_eq!(
            attribute(&p, Some(0), &ended_early),
            StepFailure::Interrupted {
                step: 2,
                total: 3,
                description: "step number 2".into(),
                exit_code: Some(0),
                stderr: tail(&format!("\n{forged}\n")),
            }
        );
        assert!(!completed(&p, &format!("\n{forged}\n")));
        // The real one, with the exec's nonce, does complete; a forged one
        // after it does not undo that, and one before it does not matter.
        let real = format!(
            "\ncocoon-fixup: @ step 1/3 start\n{forged}\n\ncocoon-fixup: @ step 2/3 start\n\ncocoon-fixup: @ step 3/3 start\n\ncocoon-fixup: @ done\n"
        );
        assert!(completed(&p, &real));
        assert!(completed(&p, &format!("{real}{forged}\n")));
    }

    #[test]
    fn the_same_lines_with_another_execs_nonce_are_not_ours() {
        let stderr = "\ncocoon-fixup: @ step 1/2 start\n\ncocoon-fixup: @ step 2/2 start\n\ncocoon-fixup: @ done\n";
        let p = plan(2);
        assert!(completed(&p, stderr));
        let other = Nonce::parse(OTHER).unwrap();
        assert!(!ran_to_completion(&p, &other, ours(stderr).as_bytes()));
        assert!(matches!(
            attribute_failure(&p, &other, Some(1), ours(stderr).as_bytes()),
            StepFailure::NotStarted { .. }
        ));
    }

    #[test]
    fn no_markers_means_not_started() {
        let got = attribute(&plan(3), Some(1), "Error: vm abc not found\n");
        assert_eq!(
            got,
            StepFailure::NotStarted {
                exit_code: Some(1),
                stderr: tail("Error: vm abc not found\n")
            }
        );
        assert_eq!(
            got.to_string(),
            "the exec exited 1 before the first step started: Error: vm abc not found"
        );
        assert_eq!(got.step(), None);
    }

    #[test]
    fn a_started_step_without_end_was_interrupted() {
        let stderr = "\ncocoon-fixup: @ step 1/3 start\n\ncocoon-fixup: @ step 2/3 start\nwaiting";
        let got = attribute(&plan(3), None, stderr);
        assert_eq!(
            got,
            StepFailure::Interrupted {
                step: 2,
                total: 3,
                description: "step number 2".into(),
                exit_code: None,
                stderr: tail("waiting"),
            }
        );
        assert_eq!(
            got.to_string(),
            "step 2/3 \"step number 2\" did not finish: the exec ended without an exit code: waiting"
        );
    }

    #[test]
    fn failure_after_done_is_outside_the_steps() {
        let stderr =
            "\ncocoon-fixup: @ step 1/1 start\n\ncocoon-fixup: @ done\nexec: connection reset\n";
        let mut p = plan(1);
        p.steps[0].best_effort = true;
        let got = attribute(&p, Some(1), stderr);
        assert_eq!(
            got,
            StepFailure::AfterLastStep {
                total: 1,
                exit_code: Some(1),
                stderr: tail("exec: connection reset\n"),
            }
        );
    }

    #[test]
    fn direct_form_blames_step_one_with_all_stderr() {
        let got = attribute(&plan(1), Some(2), "Disable-PnpDevice: failed\n");
        assert_eq!(got, step_failure(1, 1, 2, "Disable-PnpDevice: failed\n"));
        assert_eq!(
            got.to_string(),
            "step 1/1 \"step number 1\" exited 2: Disable-PnpDevice: failed"
        );
        // It has no markers, so its exit code alone says.
        assert!(completed(&plan(1), ""));
    }

    #[test]
    fn display_matches_the_house_format() {
        let f = StepFailure::Step {
            step: 5,
            total: 9,
            description: "re-run cloud-init".into(),
            exit_code: Some(2),
            stderr: tail("error: unrecognized arguments: --configs\n"),
        };
        assert_eq!(
            f.to_string(),
            "step 5/9 \"re-run cloud-init\" exited 2: error: unrecognized arguments: --configs"
        );
        let quiet = step_failure(1, 2, 1, "");
        assert_eq!(
            quiet.to_string(),
            "step 1/2 \"step number 1\" exited 1: (no stderr)"
        );
    }

    #[test]
    fn tail_is_bounded_and_cut_on_a_char_boundary() {
        // 3-byte characters: 2048 is not a multiple of 3, so the cut lands
        // inside one.
        let long = "€".repeat(1000);
        let t = StderrTail::new(long.as_bytes());
        assert!(t.cut);
        assert!(t.text.len() <= STDERR_TAIL_MAX);
        assert!(t.text.chars().all(|c| c == '€'), "no replacement character");
        assert_eq!(t.text.len(), 2046);
        assert!(
            t.to_string()
                .starts_with("[earlier stderr cut, last 2048 bytes kept] €")
        );

        let exact = "x".repeat(STDERR_TAIL_MAX);
        assert_eq!(StderrTail::new(exact.as_bytes()), tail(&exact));

        let invalid = StderrTail::new(b"bad \xff byte");
        assert_eq!(invalid.text, "bad \u{fffd} byte");
    }

    #[test]
    fn tail_of_a_step_is_bounded_too() {
        let noise = "n".repeat(5000);
        let stderr = format!(
            "\ncocoon-fixup: @ step 1/2 start\n{noise}end\n\ncocoon-fixup: @ step 1/2 failed exit 1\n"
        );
        let got = attribute(&plan(2), Some(1), &stderr);
        let t = got.stderr();
        assert!(t.cut);
        assert_eq!(t.text.len(), STDERR_TAIL_MAX);
        assert!(t.text.ends_with("nnnend\n"));
        assert!(!t.text.contains("cocoon-fixup"));
    }
}
