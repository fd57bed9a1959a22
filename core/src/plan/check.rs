//! Limits and structural rules for plans, and the errors that name a
//! broken rule.
//!
//! Every plan a plugin returns passes [`Plan::check`] before anything
//! renders or runs it. The rules keep the rendered text unambiguous (no NUL
//! bytes, one-line descriptions, normalised absolute paths) and keep a
//! plugin from removing more than it could mean to (no `rm` at the root, no
//! wildcard outside the last path component).

use std::fmt;

use crate::facts::{MacAddr, VmFacts, is_invisible_format};

use super::{Dialect, NameLink, Nonce, Plan, Step, StepAction, WriteFile};

/// Most bytes a step description may have: it is one line of a comment in
/// the hint and of the error a failed step produces.
pub const DESCRIPTION_MAX: usize = 200;

/// POSIX special built-ins, and the regular built-ins of dash and bash
/// that run other built-ins or change the shell for later steps. The shell
/// finds them before it searches PATH, and they change the script around
/// the step (`exit`, `exec`, `set`, `trap`, `eval`, `command exit 0`,
/// `alias`, `umask 0`), so a POSIX sh plan may not run one as a program.
/// A plugin that truly means one writes `sh -c ...`.
pub const SH_SPECIAL_BUILTINS: &[&str] = &[
    "break", ":", "continue", ".", "eval", "exec", "exit", "export", "readonly", "return", "set",
    "shift", "times", "trap", "unset", "command", "builtin", "alias", "unalias", "hash", "enable",
    "source", "umask", "ulimit", "cd", "local", "declare", "typeset", "shopt",
];

/// Size limits for one plan. They bound what a plugin can make the host
/// render and send to the guest; both apply to the composed plan too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanLimits {
    /// Most steps in a plan. Default 256.
    pub max_steps: usize,
    /// Most bytes of text in a plan, counted by [`Plan::text_bytes`].
    /// Default 64 KiB. The rendered exec script is larger: sh quoting can
    /// grow a string to two and a half times (alternating `'`), and each
    /// step adds about 150 bytes of markers. The script is one argv string,
    /// and Linux caps one at 128 KiB (`MAX_ARG_STRLEN`): keep this limit
    /// well below that.
    pub max_bytes: usize,
}

impl Default for PlanLimits {
    fn default() -> Self {
        PlanLimits {
            max_steps: 256,
            max_bytes: 64 * 1024,
        }
    }
}

/// The longest single exec argument Linux accepts, in bytes, without its
/// terminating NUL: `MAX_ARG_STRLEN` is 32 pages of 4 KiB, NUL included.
pub const MAX_EXEC_ARG: usize = 32 * 4096 - 1;

/// The longest hint (`vm.cocoonstack.io/post-clone-hint`, base64) the host
/// writes: half of the 256 KiB the API server allows for all of a pod's
/// annotations together, so the pod's other annotations (the error chain,
/// the stack's own, `kubectl apply`'s copy of the object) keep the rest.
pub const MAX_HINT: usize = 128 * 1024;

/// The longest command line Windows starts a process with, in UTF-16 code
/// units, without its terminating NUL: `CreateProcess` takes at most
/// 32,767 with it. A PowerShell plan's exec reaches the guest as one
/// command line (see [`windows_command_line_len`]).
pub const MAX_WINDOWS_COMMAND_LINE: usize = 32_767 - 1;

/// Room counted for the program on a Windows command line, in UTF-16 code
/// units: the guest agent may put the program's resolved path there, up to
/// `MAX_PATH` (260), instead of `powershell`.
const WINDOWS_PROGRAM_ROOM: usize = 260;

/// Check what a plan renders to, before anything runs: each exec argument
/// within [`MAX_EXEC_ARG`] (the host's `cocoon` gets the argv through
/// `execve` on Linux, whatever the guest), a PowerShell plan's command line
/// within [`MAX_WINDOWS_COMMAND_LINE`], the hint within [`MAX_HINT`]. A plan
/// within [`PlanLimits`] can still break these: quoting grows text (64 KiB
/// of `a'` renders to about 160 KiB in sh and 96 KiB in PowerShell).
///
/// `exec` is [`render_exec`](super::render_exec)`(plan)`; the argv checked
/// is what one exec runs, the nonce included ([`exec_argv`](super::exec_argv)).
pub fn check_rendered(plan: &Plan, exec: &[String], hint: &str) -> Result<(), PlanError> {
    let argv = super::exec_argv(plan, exec, &Nonce::from_bytes([0; 16]));
    if let Some((arg, long)) = argv
        .iter()
        .enumerate()
        .find(|(_, a)| a.len() > MAX_EXEC_ARG)
    {
        return Err(PlanError::ExecArgTooLong {
            arg,
            bytes: long.len(),
            max: MAX_EXEC_ARG,
        });
    }
    if plan.dialect == Dialect::PowerShell {
        let units = windows_command_line_len(&argv);
        if units > MAX_WINDOWS_COMMAND_LINE {
            return Err(PlanError::CommandLineTooLong {
                units,
                max: MAX_WINDOWS_COMMAND_LINE,
            });
        }
    }
    if hint.len() > MAX_HINT {
        return Err(PlanError::HintTooLarge {
            bytes: hint.len(),
            max: MAX_HINT,
        });
    }
    Ok(())
}

/// The length, in UTF-16 code units, of the Windows command line an argv
/// becomes: the words joined by spaces, each quoted by the convention that
/// `CommandLineToArgvW` and the C runtime read back (as the guest agent's
/// spawn writes it), and the program counted as at least
/// [`WINDOWS_PROGRAM_ROOM`].
///
/// A word is counted in double quotes when it is empty or holds a space, a
/// tab, a line break or a `"` (some quote only for blanks: this is the
/// longer count); a `"` inside is written `\"`, and the backslashes right
/// before a `"` or before the closing quote are doubled. PowerShell's
/// `-Command` takes the script as one such word (no `-EncodedCommand`,
/// which would grow it to 8/3 of its length in base64 of UTF-16).
pub fn windows_command_line_len(argv: &[String]) -> usize {
    let words: usize = argv
        .iter()
        .enumerate()
        .map(|(i, word)| {
            let len = windows_quoted_len(word);
            if i == 0 {
                len.max(WINDOWS_PROGRAM_ROOM)
            } else {
                len
            }
        })
        .sum();
    words + argv.len().saturating_sub(1)
}

fn windows_quoted_len(word: &str) -> usize {
    let quoted = word.is_empty() || word.contains([' ', '\t', '\n', '\u{b}', '"']);
    let mut len = 0;
    let mut backslashes = 0;
    for c in word.chars() {
        match c {
            '\\' => {
                backslashes += 1;
                len += 1;
            }
            // The run of backslashes doubled, then `\"`.
            '"' => {
                len += backslashes + 2;
                backslashes = 0;
            }
            c => {
                backslashes = 0;
                len += c.len_utf16();
            }
        }
    }
    if quoted {
        // The closing quote doubles a run of backslashes before it.
        len += 2 + backslashes;
    }
    len
}

/// A plan that breaks a limit or a structural rule, or plans that cannot
/// be composed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(
        "plan has {steps} steps, over the limit of {max}: plan fewer steps, or raise the limit with --plan-max-steps (`plan_max_steps` in the configuration file)"
    )]
    TooManySteps { steps: usize, max: usize },
    #[error(
        "plan has {bytes} bytes of text, over the limit of {max}: plan less text, or raise the limit with --plan-max-bytes (`plan_max_bytes` in the configuration file)"
    )]
    TooLarge { bytes: usize, max: usize },
    /// `step` counts from 1.
    #[error("step {step} {field}: {problem}")]
    Invalid {
        step: usize,
        field: Field,
        problem: Problem,
    },
    #[error("no plans to compose: pass at least one")]
    NothingToCompose,
    /// A rendered exec argument the kernel would refuse (E2BIG): every
    /// attempt would fail. `arg` counts from 0 (`sh`, `-c`, the script).
    #[error(
        "the rendered exec argument {arg} is {bytes} bytes, over the kernel's limit of {max} for one argument (MAX_ARG_STRLEN): no attempt could run; make the plan's text shorter (quoting grows text with quotes in it up to 2.5 times)"
    )]
    ExecArgTooLong {
        arg: usize,
        bytes: usize,
        max: usize,
    },
    /// The PowerShell exec would not fit on a Windows command line
    /// (`CreateProcess`): every attempt would fail.
    #[error(
        "the rendered exec is a Windows command line of {units} UTF-16 code units, over the limit of {max} (CreateProcess takes 32767 with the NUL; room is kept for the program's path): no attempt could run; make the plan's text shorter (PowerShell doubles quotes, the command line escapes `\"`)"
    )]
    CommandLineTooLong { units: usize, max: usize },
    /// The hint would not fit in the pod's annotations.
    #[error(
        "the hint (the plan as a script, base64) is {bytes} bytes, over the limit of {max} that leaves the rest of the pod's 256 KiB annotation budget to its other annotations; make the plan's text shorter"
    )]
    HintTooLarge { bytes: usize, max: usize },
    /// `part` counts from 1; part 1 sets the dialect.
    #[error("plan {part} is {found} but plan 1 is {expected}: compose plans of one dialect")]
    MixedDialects {
        part: usize,
        expected: Dialect,
        found: Dialect,
    },
}

/// Which field of a step broke a rule. Displays as the JSON path within
/// the step (`run[0]`, `write_file.path`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Description,
    /// The whole argv of a `run` step.
    Run,
    /// One argv entry, counted from 0 (`run[0]` is the program).
    Arg(usize),
    Path,
    Content,
    Mode,
    /// The whole list of a `remove_files` step.
    RemoveFiles,
    /// One pattern of a `remove_files` step, counted from 0.
    Pattern(usize),
    /// The whole of a `name_link` step.
    NameLink,
    LinkMac,
    LinkName,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Description => f.write_str("description"),
            Field::Run => f.write_str("run"),
            Field::Arg(i) => write!(f, "run[{i}]"),
            Field::Path => f.write_str("write_file.path"),
            Field::Content => f.write_str("write_file.content"),
            Field::Mode => f.write_str("write_file.mode"),
            Field::RemoveFiles => f.write_str("remove_files"),
            Field::Pattern(i) => write!(f, "remove_files[{i}]"),
            Field::NameLink => f.write_str("name_link"),
            Field::LinkMac => f.write_str("name_link.mac"),
            Field::LinkName => f.write_str("name_link.name"),
        }
    }
}

/// The structural rule a field breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("contains a NUL byte, which no argv or shell word can carry")]
    Nul,
    #[error("contains a control character (line break, tab or similar)")]
    ControlChar,
    #[error(
        "contains a control character other than a line break or a tab (a carriage return, ESC or similar), which could hide text from a reviewer"
    )]
    ContentControlChar,
    #[error(
        "contains an invisible formatting character (a bidi override, a zero-width character), which could hide text from a reviewer"
    )]
    FormatChar,
    #[error("is empty: say in one line what the step does")]
    EmptyDescription,
    #[error("is {len} bytes, over the limit of {max}: shorten it")]
    DescriptionTooLong { len: usize, max: usize },
    #[error("is empty: give the program and its arguments")]
    EmptyArgv,
    #[error("is empty: name the program to run")]
    EmptyProgram,
    #[error("`{0}` is a shell special built-in, not a program; run `sh -c` if it is meant")]
    ShellBuiltin(String),
    #[error(
        "`{0}` starts with `%`, which bash (the `sh` of RHEL-family guests) takes as a job to resume, quoted or not; rename the program or run it by its absolute path"
    )]
    JobSpec(String),
    #[error("lists no paths")]
    NoPaths,
    #[error("is not an absolute path (it must start with `/`)")]
    NotAbsolute,
    #[error("has a `..` component")]
    ParentComponent,
    #[error("is not normalised: it has an empty or `.` component (`//`, `/./` or a trailing `/`)")]
    NotNormalised,
    #[error("has a `*` outside its last component")]
    WildcardNotLast,
    #[error("needs at least two components (`/dir/name`): nothing is removed at the root")]
    TooShallow,
    #[error("{0:o} (octal) is not a permission mode: the most is 7777")]
    ModeOutOfRange(u32),
    #[error("has {len} entries or bytes, over the limit of {max}")]
    RuleTooLong { len: usize, max: usize },
    #[error(
        "contains a backslash, which Windows takes as a separator (so `..\\` could climb out of a directory)"
    )]
    Backslash,
    #[error("contains `:`, which Windows takes as a drive or stream separator")]
    Colon,
    #[error("its last component can match `.` or `..` in some shells (dash expands `.*` to both)")]
    DotGlob,
    #[error("has a `**` component that is not the last one")]
    DeepWildcardNotLast,
    #[error("has `**` inside a component: `**` must be a whole, last component")]
    DeepWildcardNotAlone,
    #[error(
        "is not a Linux interface name: {0}; use 1 to 15 bytes of ASCII letters, digits, `-`, `_` and `.`, not starting with `-` or `.` (for example `eth0`)"
    )]
    InterfaceName(&'static str),
    #[error(
        "is in phase {0}: a name_link step must be in phase link, where it runs after fc-mac has restored the MACs"
    )]
    NameLinkPhase(super::Phase),
    #[error(
        "is only rendered for POSIX sh plans: a PowerShell plan cannot name a link; rename a Windows adapter with a run step (`Rename-NetAdapter`) the policy allows"
    )]
    NameLinkPowerShell,
    #[error(
        "{0} is not one of the VM's NICs: a plan may only name the VM's own NICs (vm-facts.nics)"
    )]
    ForeignMac(MacAddr),
    #[error(
        "is not an interface name pattern: {0}; use letters, digits, `-`, `_`, `.` and `*`, not starting with `-` or `.`, at most 15 besides `*` (for example `eth*`)"
    )]
    LinkPattern(&'static str),
}

impl Plan {
    /// Check the plan against `limits` and the structural rules:
    ///
    /// - at most `limits.max_steps` steps and `limits.max_bytes` bytes of
    ///   text;
    /// - no NUL byte in any string;
    /// - a description is one non-empty line of at most [`DESCRIPTION_MAX`]
    ///   bytes with no control characters;
    /// - a run has a non-empty argv whose `argv[0]` is non-empty (and, in a
    ///   POSIX sh plan, not one of [`SH_SPECIAL_BUILTINS`]);
    /// - a path is absolute and normalised, with no `..`, `.` or empty
    ///   component and no control characters (Windows paths are not
    ///   accepted yet: no plugin writes files on Windows);
    /// - a remove pattern also has at least two components and `*` only in
    ///   its last one, and a remove step lists at least one pattern;
    /// - a mode is at most `0o7777`;
    /// - a `name_link` step is in a POSIX sh plan, in phase link, and its
    ///   name is a valid Linux interface name ([`check_interface_name`]).
    ///
    /// An empty plan passes: it has nothing to do. Whether a `name_link`
    /// step's MAC is the VM's is [`Plan::check_nics`]'s question.
    pub fn check(&self, limits: &PlanLimits) -> Result<(), PlanError> {
        if self.steps.len() > limits.max_steps {
            return Err(PlanError::TooManySteps {
                steps: self.steps.len(),
                max: limits.max_steps,
            });
        }
        let bytes = self.text_bytes();
        if bytes > limits.max_bytes {
            return Err(PlanError::TooLarge {
                bytes,
                max: limits.max_bytes,
            });
        }
        for (i, step) in self.steps.iter().enumerate() {
            check_step(self.dialect, step).map_err(|(field, problem)| PlanError::Invalid {
                step: i + 1,
                field,
                problem,
            })?;
        }
        Ok(())
    }

    /// Whether every `name_link` step names one of the VM's own NICs: a
    /// plugin's plan may rename nothing else in the guest.
    pub fn check_nics(&self, facts: &VmFacts) -> Result<(), PlanError> {
        for (i, step) in self.steps.iter().enumerate() {
            if let StepAction::NameLink(NameLink { mac, .. }) = &step.action
                && !facts.nics.iter().any(|n| n.mac == *mac)
            {
                return Err(PlanError::Invalid {
                    step: i + 1,
                    field: Field::LinkMac,
                    problem: Problem::ForeignMac(*mac),
                });
            }
        }
        Ok(())
    }

    /// Whether a person reviewing the plan sees what runs: no control
    /// character in a description, an argv entry, a path or a removal
    /// pattern, and none but line breaks and tabs in file contents; no
    /// invisible formatting character (bidi override, zero-width) anywhere.
    /// A `\r` or ESC could hide a step in `plan`'s output, a U+202E could
    /// reorder it. Every plugin's plan must pass this as well as
    /// [`Plan::check`]; the renderer still quotes whatever it is given.
    pub fn check_reviewable(&self) -> Result<(), PlanError> {
        for (i, step) in self.steps.iter().enumerate() {
            check_reviewable_step(step).map_err(|(field, problem)| PlanError::Invalid {
                step: i + 1,
                field,
                problem,
            })?;
        }
        Ok(())
    }
}

fn check_reviewable_step(step: &Step) -> Result<(), Broken> {
    visible_line(&step.description).map_err(|p| (Field::Description, p))?;
    match &step.action {
        StepAction::Run(argv) => {
            for (i, arg) in argv.iter().enumerate() {
                visible_line(arg).map_err(|p| (Field::Arg(i), p))?;
            }
        }
        StepAction::WriteFile(w) => {
            visible_line(&w.path).map_err(|p| (Field::Path, p))?;
            visible_text(&w.content).map_err(|p| (Field::Content, p))?;
        }
        StepAction::RemoveFiles(patterns) => {
            for (i, pattern) in patterns.iter().enumerate() {
                visible_line(pattern).map_err(|p| (Field::Pattern(i), p))?;
            }
        }
        StepAction::NameLink(l) => visible_line(&l.name).map_err(|p| (Field::LinkName, p))?,
    }
    Ok(())
}

/// One line that shows what it says: no control character at all, no
/// invisible formatting character.
pub(super) fn visible_line(s: &str) -> Result<(), Problem> {
    if s.chars().any(char::is_control) {
        return Err(Problem::ControlChar);
    }
    if s.chars().any(is_invisible_format) {
        return Err(Problem::FormatChar);
    }
    Ok(())
}

/// Text that shows what it says over several lines: line breaks and tabs
/// are the only controls.
pub(super) fn visible_text(s: &str) -> Result<(), Problem> {
    if s.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return Err(Problem::ContentControlChar);
    }
    if s.chars().any(is_invisible_format) {
        return Err(Problem::FormatChar);
    }
    Ok(())
}

type Broken = (Field, Problem);

fn check_step(dialect: Dialect, step: &Step) -> Result<(), Broken> {
    check_description(&step.description).map_err(|p| (Field::Description, p))?;
    match &step.action {
        StepAction::Run(argv) => check_argv(dialect, argv),
        StepAction::WriteFile(w) => check_write(dialect, w),
        StepAction::RemoveFiles(patterns) => check_patterns(dialect, patterns),
        StepAction::NameLink(l) => {
            if dialect != Dialect::PosixSh {
                return Err((Field::NameLink, Problem::NameLinkPowerShell));
            }
            if step.phase != super::Phase::Link {
                return Err((Field::NameLink, Problem::NameLinkPhase(step.phase)));
            }
            check_interface_name(&l.name).map_err(|p| (Field::LinkName, p))
        }
    }
}

/// The longest Linux interface name, in bytes (`IFNAMSIZ` less its NUL).
pub const IFNAME_MAX: usize = 15;

/// A name Linux takes for an interface and every tool reads back as one:
/// 1 to [`IFNAME_MAX`] bytes of ASCII letters, digits, `-`, `_` and `.`,
/// not starting with `-` (a tool would read an option) or `.` (the shell's
/// `/sys/class/net/*` skips such names, and `.` and `..` are directories
/// there). The kernel also
/// allows other bytes but `/`, `:` and white space; they are refused here
/// so the name reads the same in every shell and configuration file.
pub fn check_interface_name(name: &str) -> Result<(), Problem> {
    no_nul(name)?;
    let reason = if name.is_empty() {
        "it is empty"
    } else if name.len() > IFNAME_MAX {
        "it is longer than 15 bytes"
    } else if name.starts_with('.') {
        "it starts with `.`, and `/sys/class/net/*` does not list such a name"
    } else if name.starts_with('-') {
        "it starts with `-`"
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        "it has a character other than a letter, a digit, `-`, `_` or `.`"
    } else {
        return Ok(());
    };
    Err(Problem::InterfaceName(reason))
}

fn check_description(d: &str) -> Result<(), Problem> {
    no_nul(d)?;
    if d.is_empty() {
        return Err(Problem::EmptyDescription);
    }
    if d.chars().any(char::is_control) {
        return Err(Problem::ControlChar);
    }
    if d.len() > DESCRIPTION_MAX {
        return Err(Problem::DescriptionTooLong {
            len: d.len(),
            max: DESCRIPTION_MAX,
        });
    }
    Ok(())
}

fn check_argv(dialect: Dialect, argv: &[String]) -> Result<(), Broken> {
    let Some(program) = argv.first() else {
        return Err((Field::Run, Problem::EmptyArgv));
    };
    for (i, arg) in argv.iter().enumerate() {
        no_nul(arg).map_err(|p| (Field::Arg(i), p))?;
    }
    if program.is_empty() {
        return Err((Field::Arg(0), Problem::EmptyProgram));
    }
    if dialect == Dialect::PosixSh && SH_SPECIAL_BUILTINS.contains(&program.as_str()) {
        return Err((Field::Arg(0), Problem::ShellBuiltin(program.clone())));
    }
    if dialect == Dialect::PosixSh && program.starts_with('%') {
        return Err((Field::Arg(0), Problem::JobSpec(program.clone())));
    }
    Ok(())
}

fn check_write(dialect: Dialect, w: &WriteFile) -> Result<(), Broken> {
    check_path(&w.path)
        .and_then(|()| check_dialect_path(dialect, &w.path))
        .map_err(|p| (Field::Path, p))?;
    no_nul(&w.content).map_err(|p| (Field::Content, p))?;
    match w.mode {
        Some(m) if m > 0o7777 => Err((Field::Mode, Problem::ModeOutOfRange(m))),
        _ => Ok(()),
    }
}

fn check_patterns(dialect: Dialect, patterns: &[String]) -> Result<(), Broken> {
    if patterns.is_empty() {
        return Err((Field::RemoveFiles, Problem::NoPaths));
    }
    for (i, pattern) in patterns.iter().enumerate() {
        check_pattern(pattern)
            .and_then(|()| check_dialect_path(dialect, pattern))
            .map_err(|p| (Field::Pattern(i), p))?;
    }
    Ok(())
}

/// Windows also takes a backslash as a separator (so `..` then a
/// backslash climbs) and `:` as a drive or stream separator: a PowerShell
/// plan's paths have neither. On Linux both are ordinary characters.
fn check_dialect_path(dialect: Dialect, path: &str) -> Result<(), Problem> {
    if dialect == Dialect::PowerShell {
        if path.contains('\\') {
            return Err(Problem::Backslash);
        }
        if path.contains(':') {
            return Err(Problem::Colon);
        }
    }
    Ok(())
}

fn check_pattern(pattern: &str) -> Result<(), Problem> {
    check_path(pattern)?;
    // check_path guarantees a leading `/` and no empty component.
    let components: Vec<&str> = pattern[1..].split('/').collect();
    if components.len() < 2 {
        return Err(Problem::TooShallow);
    }
    let (last, dirs) = components.split_last().expect("at least two components");
    if dirs.iter().any(|c| c.contains('*')) {
        return Err(Problem::WildcardNotLast);
    }
    // dash expands `.*` to `.` and `..` as well.
    if last.contains('*') && last.starts_with('.') && last.chars().all(|c| c == '.' || c == '*') {
        return Err(Problem::DotGlob);
    }
    Ok(())
}

pub(super) fn check_path(path: &str) -> Result<(), Problem> {
    no_nul(path)?;
    if path.chars().any(char::is_control) {
        return Err(Problem::ControlChar);
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(Problem::NotAbsolute);
    };
    for component in rest.split('/') {
        match component {
            ".." => return Err(Problem::ParentComponent),
            "" | "." => return Err(Problem::NotNormalised),
            _ => {}
        }
    }
    Ok(())
}

fn no_nul(s: &str) -> Result<(), Problem> {
    if s.contains('\0') {
        Err(Problem::Nul)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;
    use crate::plan::Phase;

    /// A step in phase configure, or link for a `name_link` step.
    fn step(action: StepAction) -> Step {
        let phase = if matches!(action, StepAction::NameLink(_)) {
            Phase::Link
        } else {
            Phase::Configure
        };
        Step {
            description: "do it".into(),
            phase,
            best_effort: false,
            action,
        }
    }

    fn run(argv: &[&str]) -> StepAction {
        StepAction::Run(argv.iter().map(|s| s.to_string()).collect())
    }

    fn write(path: &str, content: &str, mode: Option<u32>) -> StepAction {
        StepAction::WriteFile(WriteFile {
            path: path.into(),
            content: content.into(),
            mode,
            parents: false,
        })
    }

    fn name_link(mac: [u8; 6], name: &str) -> StepAction {
        StepAction::NameLink(NameLink {
            mac: MacAddr(mac),
            name: name.into(),
        })
    }

    const MAC: [u8; 6] = [0x52, 0x54, 0, 0xaa, 0xbb, 0x01];

    fn remove(patterns: &[&str]) -> StepAction {
        StepAction::RemoveFiles(patterns.iter().map(|s| s.to_string()).collect())
    }

    /// 64 KiB of `a'` is within the plan limits, but its exec script is
    /// over the kernel's per-argument limit and its hint over the hint
    /// limit: both are caught before anything runs.
    #[test]
    fn quoting_growth_is_caught_after_rendering() {
        let content = "a'".repeat(32 * 1024 - 64);
        let p = plan(vec![step(write("/etc/x", &content, Some(0o644)))]);
        p.check(&PlanLimits::default())
            .expect("within the plan limits");
        let exec = crate::plan::render_exec(&p);
        let script = crate::plan::render_script(&p, &crate::plan::ScriptHeader { title: vec![] });
        let hint = crate::plan::hint_base64(&script);
        assert!(matches!(
            check_rendered(&p, &exec, &hint),
            Err(PlanError::ExecArgTooLong { arg: 2, bytes, max: MAX_EXEC_ARG }) if bytes > MAX_EXEC_ARG
        ));
        let short = vec!["sh".to_owned(), "-c".to_owned(), "true".to_owned()];
        assert!(matches!(
            check_rendered(&p, &short, &hint),
            Err(PlanError::HintTooLarge { bytes, max: MAX_HINT }) if bytes > MAX_HINT
        ));
        // The same plan with plain text renders within both.
        let plain = plan(vec![step(write(
            "/etc/x",
            &"a".repeat(60 * 1024),
            Some(0o644),
        ))]);
        let script =
            crate::plan::render_script(&plain, &crate::plan::ScriptHeader { title: vec![] });
        check_rendered(
            &plain,
            &crate::plan::render_exec(&plain),
            &crate::plan::hint_base64(&script),
        )
        .expect("plain text fits");
    }

    /// The hint is stored base64: 4 bytes for every 3 of the script. A
    /// script under MAX_HINT whose base64 is over it is refused.
    #[test]
    fn the_hint_limit_counts_the_base64() {
        let p = plan(vec![step(write("/etc/x", &"'".repeat(50 * 1024), None))]);
        p.check(&PlanLimits::default()).unwrap();
        let script = crate::plan::render_script(&p, &crate::plan::ScriptHeader::default());
        let hint = crate::plan::hint_base64(&script);
        assert!(script.len() < MAX_HINT && hint.len() > MAX_HINT);
        assert_eq!(hint.len(), script.len().div_ceil(3) * 4);
        assert_eq!(
            check_rendered(&p, &crate::plan::render_exec(&p), &hint),
            Err(PlanError::HintTooLarge {
                bytes: hint.len(),
                max: MAX_HINT
            })
        );
    }

    #[rstest]
    #[case::plain("abc", 3)]
    #[case::empty("", 2)]
    #[case::space("a b", 5)]
    #[case::tab("a\tb", 5)]
    #[case::line_break("a\nb", 5)]
    #[case::quote(r#"a"b"#, 6)]
    #[case::backslashes_alone(r"a\b\", 4)]
    #[case::backslash_before_quote(r#"a\"b"#, 8)]
    #[case::backslash_before_closing_quote(r"a b\", 7)]
    #[case::astral("😀", 2)]
    #[case::bmp("ü‘", 2)]
    fn windows_words_are_counted_quoted_in_utf16(#[case] word: &str, #[case] units: usize) {
        assert_eq!(windows_quoted_len(word), units, "{word:?}");
    }

    #[test]
    fn a_windows_command_line_is_its_words_and_the_spaces_between() {
        let argv: Vec<String> = ["powershell", "-c", "a b"].map(String::from).to_vec();
        // The program counts as the path the agent may put in its place.
        assert_eq!(windows_command_line_len(&argv), 260 + 1 + 2 + 1 + 5);
        let long = "p".repeat(300);
        assert_eq!(windows_command_line_len(&[long]), 300);
        assert_eq!(windows_command_line_len(&[]), 0);
    }

    fn ps_write(content: &str) -> Plan {
        Plan {
            dialect: Dialect::PowerShell,
            steps: vec![step(write("/ProgramData/x", content, None))],
        }
    }

    fn check_ps(p: &Plan) -> Result<(), PlanError> {
        let script = crate::plan::render_script(p, &crate::plan::ScriptHeader::default());
        check_rendered(
            p,
            &crate::plan::render_exec(p),
            &crate::plan::hint_base64(&script),
        )
    }

    /// A PowerShell plan's exec is one Windows command line: at most 32,766
    /// UTF-16 code units with the nonce and the quoting, exactly.
    #[test]
    fn a_powershell_exec_must_fit_a_windows_command_line() {
        let argv = |p: &Plan| {
            let nonce = crate::plan::Nonce::generate().unwrap();
            crate::plan::exec_argv(p, &crate::plan::render_exec(p), &nonce)
        };
        let base = windows_command_line_len(&argv(&ps_write("")));
        let room = MAX_WINDOWS_COMMAND_LINE - base;
        let at = ps_write(&"a".repeat(room));
        assert_eq!(
            windows_command_line_len(&argv(&at)),
            MAX_WINDOWS_COMMAND_LINE
        );
        at.check(&PlanLimits::default()).unwrap();
        assert_eq!(check_ps(&at), Ok(()));
        let over = ps_write(&"a".repeat(room + 1));
        let err = check_ps(&over).unwrap_err();
        assert_eq!(
            err,
            PlanError::CommandLineTooLong {
                units: MAX_WINDOWS_COMMAND_LINE + 1,
                max: MAX_WINDOWS_COMMAND_LINE
            }
        );
        assert!(err.to_string().contains("32767"), "{err}");

        // Quotes grow it: PowerShell doubles `'`, the command line escapes
        // `"`, and a non-BMP character takes two code units. Each of these
        // is within the plan limits and the kernel's, not within Windows'.
        for grown in ["'", "\"", "😀"] {
            let p = ps_write(&grown.repeat(room / 2 + 1));
            p.check(&PlanLimits::default()).unwrap();
            assert!(
                matches!(check_ps(&p), Err(PlanError::CommandLineTooLong { .. })),
                "{grown}"
            );
        }
        // A POSIX sh plan of the same size is no Windows command line.
        let mut sh = ps_write(&"'".repeat(room));
        sh.dialect = Dialect::PosixSh;
        sh.steps[0].action = write("/etc/x", &"'".repeat(room), None);
        assert_eq!(check_ps(&sh), Ok(()));
    }

    /// What a reviewer could not see is refused in plugin plans.
    #[rstest]
    #[case::cr_arg(run(&["curl", "x\rsafe"]), Field::Arg(1), Problem::ControlChar)]
    #[case::esc_arg(run(&["echo", "\u{1b}[2K"]), Field::Arg(1), Problem::ControlChar)]
    #[case::newline_arg(run(&["sh", "-c", "true\ncurl x | sh"]), Field::Arg(2), Problem::ControlChar)]
    #[case::bidi_arg(run(&["echo", "abc\u{202E}cba"]), Field::Arg(1), Problem::FormatChar)]
    #[case::zero_width_program(run(&["ls\u{200B}", "/"]), Field::Arg(0), Problem::FormatChar)]
    #[case::bidi_path(write("/etc/x\u{2066}", "", None), Field::Path, Problem::FormatChar)]
    #[case::cr_content(
        write("/etc/x", "a\r\nb", None),
        Field::Content,
        Problem::ContentControlChar
    )]
    #[case::esc_content(
        write("/etc/x", "\u{1b}]0;x\u{7}", None),
        Field::Content,
        Problem::ContentControlChar
    )]
    #[case::bidi_content(
        write("/etc/x", "a\u{202E}b", None),
        Field::Content,
        Problem::FormatChar
    )]
    #[case::bidi_pattern(remove(&["/etc/x/\u{202E}*"]), Field::Pattern(0), Problem::FormatChar)]
    fn unreviewable_steps_are_refused(
        #[case] action: StepAction,
        #[case] field: Field,
        #[case] problem: Problem,
    ) {
        assert_eq!(
            plan(vec![step(action)]).check_reviewable(),
            invalid(1, field, problem)
        );
    }

    #[test]
    fn line_breaks_and_tabs_in_file_contents_are_reviewable() {
        let ok = plan(vec![step(write(
            "/etc/x",
            "[Match]\n\tMAC=1\n",
            Some(0o644),
        ))]);
        assert_eq!(ok.check_reviewable(), Ok(()));
        let mut bidi = step(run(&["true"]));
        bidi.description = "set the hostname\u{202E}".into();
        assert_eq!(
            plan(vec![bidi]).check_reviewable(),
            invalid(1, Field::Description, Problem::FormatChar)
        );
    }

    fn plan(steps: Vec<Step>) -> Plan {
        Plan {
            dialect: Dialect::PosixSh,
            steps,
        }
    }

    fn invalid(step: usize, field: Field, problem: Problem) -> Result<(), PlanError> {
        Err(PlanError::Invalid {
            step,
            field,
            problem,
        })
    }

    #[rstest]
    #[case::run(run(&["ip", "link", "set", "dev", "eth0", "up"]))]
    #[case::run_with_nasty_args(run(&["printf", "%s", "it's\n$(x)", "", "-"]))]
    #[case::path_program(run(&["/usr/sbin/ip"]))]
    #[case::write(write("/etc/hostname", "vm-1\n", Some(0o644)))]
    #[case::write_no_mode(write("/proc/sys/vm/drop_caches", "3", None))]
    #[case::write_empty(write("/etc/x", "", Some(0o7777)))]
    #[case::write_one_component(write("/x", "", None))]
    #[case::remove_glob(remove(&["/etc/systemd/network/10-*.network"]))]
    #[case::remove_star(remove(&["/tmp/*"]))]
    #[case::remove_literal(remove(&["/etc/a b/it's", "/etc/c"]))]
    #[case::name_link(name_link(MAC, "eth0"))]
    #[case::name_link_longest(name_link(MAC, "abcdefghij-_.15"))]
    #[case::name_link_dots(name_link(MAC, "a..."))]
    #[case::name_link_vlan(name_link(MAC, "eth0.100"))]
    fn valid_steps_pass(#[case] action: StepAction) {
        assert_eq!(
            plan(vec![step(action)]).check(&PlanLimits::default()),
            Ok(())
        );
    }

    #[rstest]
    #[case::empty_argv(run(&[]), Field::Run, Problem::EmptyArgv)]
    #[case::empty_program(run(&["", "x"]), Field::Arg(0), Problem::EmptyProgram)]
    #[case::nul_arg(run(&["ip", "a\0b"]), Field::Arg(1), Problem::Nul)]
    #[case::builtin_exit(run(&["exit", "0"]), Field::Arg(0), Problem::ShellBuiltin("exit".into()))]
    #[case::builtin_dot(run(&[".", "/x"]), Field::Arg(0), Problem::ShellBuiltin(".".into()))]
    #[case::job_spec(run(&["%rec", "arg"]), Field::Arg(0), Problem::JobSpec("%rec".into()))]
    #[case::relative(write("etc/hostname", "", None), Field::Path, Problem::NotAbsolute)]
    #[case::empty_path(write("", "", None), Field::Path, Problem::NotAbsolute)]
    #[case::root(write("/", "", None), Field::Path, Problem::NotNormalised)]
    #[case::dotdot(write("/etc/../x", "", None), Field::Path, Problem::ParentComponent)]
    #[case::dot(write("/etc/./x", "", None), Field::Path, Problem::NotNormalised)]
    #[case::double_slash(write("/etc//x", "", None), Field::Path, Problem::NotNormalised)]
    #[case::trailing_slash(write("/etc/x/", "", None), Field::Path, Problem::NotNormalised)]
    #[case::newline_path(write("/etc/x\ny", "", None), Field::Path, Problem::ControlChar)]
    #[case::nul_path(write("/etc/x\0", "", None), Field::Path, Problem::Nul)]
    #[case::nul_content(write("/etc/x", "a\0", None), Field::Content, Problem::Nul)]
    #[case::mode(
        write("/etc/x", "", Some(0o10000)),
        Field::Mode,
        Problem::ModeOutOfRange(0o10000)
    )]
    #[case::no_patterns(remove(&[]), Field::RemoveFiles, Problem::NoPaths)]
    #[case::rm_root(remove(&["/"]), Field::Pattern(0), Problem::NotNormalised)]
    #[case::rm_root_glob(remove(&["/*"]), Field::Pattern(0), Problem::TooShallow)]
    #[case::rm_root_pattern(remove(&["/etc/a", "/e*c"]), Field::Pattern(1), Problem::TooShallow)]
    #[case::rm_one_component(remove(&["/etc"]), Field::Pattern(0), Problem::TooShallow)]
    #[case::rm_glob_dir(remove(&["/etc/*/x"]), Field::Pattern(0), Problem::WildcardNotLast)]
    #[case::rm_glob_dir2(remove(&["/e*/x/y"]), Field::Pattern(0), Problem::WildcardNotLast)]
    #[case::rm_dotdot(remove(&["/etc/../*"]), Field::Pattern(0), Problem::ParentComponent)]
    #[case::rm_relative(remove(&["etc/*"]), Field::Pattern(0), Problem::NotAbsolute)]
    #[case::link_empty(
        name_link(MAC, ""),
        Field::LinkName,
        Problem::InterfaceName("it is empty")
    )]
    #[case::link_16_bytes(
        name_link(MAC, "abcdefghijklmnop"),
        Field::LinkName,
        Problem::InterfaceName("it is longer than 15 bytes")
    )]
    #[case::link_dot(name_link(MAC, "."), Field::LinkName, LEADING_DOT)]
    #[case::link_dotdot(name_link(MAC, ".."), Field::LinkName, LEADING_DOT)]
    #[case::link_leading_dot(name_link(MAC, ".eth0"), Field::LinkName, LEADING_DOT)]
    #[case::link_dash(
        name_link(MAC, "-eth0"),
        Field::LinkName,
        Problem::InterfaceName("it starts with `-`")
    )]
    #[case::link_slash(name_link(MAC, "eth/0"), Field::LinkName, BAD_CHAR)]
    #[case::link_space(name_link(MAC, "eth 0"), Field::LinkName, BAD_CHAR)]
    #[case::link_colon(name_link(MAC, "eth0:1"), Field::LinkName, BAD_CHAR)]
    #[case::link_quote(name_link(MAC, "e'th"), Field::LinkName, BAD_CHAR)]
    #[case::link_newline(name_link(MAC, "eth0\n"), Field::LinkName, BAD_CHAR)]
    #[case::link_unicode(name_link(MAC, "ethü"), Field::LinkName, BAD_CHAR)]
    #[case::link_nul(name_link(MAC, "eth\0"), Field::LinkName, Problem::Nul)]
    fn broken_steps_name_field_and_problem(
        #[case] action: StepAction,
        #[case] field: Field,
        #[case] problem: Problem,
    ) {
        let p = plan(vec![step(run(&["true"])), step(action)]);
        assert_eq!(p.check(&PlanLimits::default()), invalid(2, field, problem));
    }

    #[rstest]
    #[case::empty("", Problem::EmptyDescription)]
    #[case::newline("two\nlines", Problem::ControlChar)]
    #[case::carriage_return("x\r", Problem::ControlChar)]
    #[case::tab("a\tb", Problem::ControlChar)]
    #[case::c1("a\u{85}b", Problem::ControlChar)]
    #[case::nul("a\0", Problem::Nul)]
    #[case::long(&"x".repeat(201), Problem::DescriptionTooLong { len: 201, max: 200 })]
    fn broken_descriptions(#[case] description: &str, #[case] problem: Problem) {
        let mut s = step(run(&["true"]));
        s.description = description.into();
        assert_eq!(
            plan(vec![s]).check(&PlanLimits::default()),
            invalid(1, Field::Description, problem)
        );
    }

    const LEADING_DOT: Problem = Problem::InterfaceName(
        "it starts with `.`, and `/sys/class/net/*` does not list such a name",
    );

    #[rstest]
    fn name_link_steps_run_in_phase_link(#[values(Phase::Prepare, Phase::Configure)] phase: Phase) {
        let mut s = step(name_link(MAC, "eth0"));
        assert_eq!(plan(vec![s.clone()]).check(&PlanLimits::default()), Ok(()));
        s.phase = phase;
        assert_eq!(
            plan(vec![s]).check(&PlanLimits::default()),
            invalid(1, Field::NameLink, Problem::NameLinkPhase(phase))
        );
    }

    const BAD_CHAR: Problem =
        Problem::InterfaceName("it has a character other than a letter, a digit, `-`, `_` or `.`");

    #[test]
    fn powershell_plans_cannot_name_links() {
        let ps = Plan {
            dialect: Dialect::PowerShell,
            steps: vec![step(name_link(MAC, "eth0"))],
        };
        assert_eq!(
            ps.check(&PlanLimits::default()),
            invalid(1, Field::NameLink, Problem::NameLinkPowerShell)
        );
        let message = ps.check(&PlanLimits::default()).unwrap_err().to_string();
        assert!(message.contains("Rename-NetAdapter"), "{message}");
    }

    #[test]
    fn a_plan_may_name_only_the_vms_own_nics() {
        use crate::facts::{Backend, BootKind, GuestOs, ImageKind, Nic, VmId, VmName};
        let facts = VmFacts {
            name: VmName::parse("web-0").unwrap(),
            id: VmId::parse("vm-0123").unwrap(),
            backend: Backend::CloudHypervisor,
            os: GuestOs::Linux,
            image: ImageKind::Oci,
            boot: BootKind::Clone,
            nics: [MAC, [2, 0, 0, 0, 0, 2]]
                .map(|m| Nic {
                    mac: MacAddr(m),
                    static_ipv4: None,
                })
                .to_vec(),
            flavor: None,
        };
        let own = plan(vec![
            step(name_link(MAC, "eth0")),
            step(name_link([2, 0, 0, 0, 0, 2], "eth1")),
        ]);
        assert_eq!(own.check_nics(&facts), Ok(()));
        let foreign = plan(vec![
            step(name_link(MAC, "eth0")),
            step(name_link([2, 0, 0, 0, 0, 9], "eth1")),
        ]);
        assert_eq!(
            foreign.check_nics(&facts),
            invalid(
                2,
                Field::LinkMac,
                Problem::ForeignMac(MacAddr([2, 0, 0, 0, 0, 9]))
            )
        );
        assert_eq!(
            foreign.check_nics(&facts).unwrap_err().to_string(),
            "step 2 name_link.mac: 02:00:00:00:00:09 is not one of the VM's NICs: a plan may only name the VM's own NICs (vm-facts.nics)"
        );
    }

    #[test]
    fn description_of_exactly_200_bytes_passes() {
        let mut s = step(run(&["true"]));
        s.description = "é".repeat(100);
        assert_eq!(plan(vec![s]).check(&PlanLimits::default()), Ok(()));
    }

    #[test]
    fn paths_windows_could_read_differently_are_refused() {
        let ps = |action: StepAction| Plan {
            dialect: Dialect::PowerShell,
            steps: vec![step(action)],
        };
        let limits = PlanLimits::default();
        for (action, field, problem) in [
            (
                write("/ProgramData/acme/..\\..\\Windows\\x.dll", "x", None),
                Field::Path,
                Problem::Backslash,
            ),
            (
                write("/ProgramData/acme/x.txt:stream", "x", None),
                Field::Path,
                Problem::Colon,
            ),
            (
                remove(&["/ProgramData/C:*"]),
                Field::Pattern(0),
                Problem::Colon,
            ),
        ] {
            assert_eq!(
                ps(action).check(&limits),
                Err(PlanError::Invalid {
                    step: 1,
                    field,
                    problem
                })
            );
        }
        // Both are ordinary characters on Linux.
        plan(vec![step(write("/etc/a:b\\c", "x", None))])
            .check(&limits)
            .unwrap();
    }

    #[rstest]
    #[case("/etc/x/.*")]
    #[case("/etc/x/..*")]
    #[case("/etc/x/*.")]
    fn globs_that_match_dot_or_dot_dot_are_refused(#[case] pattern: &str) {
        let err = plan(vec![step(remove(&[pattern]))]).check(&PlanLimits::default());
        let dot = pattern.rsplit('/').next().unwrap().starts_with('.');
        assert_eq!(err.is_err(), dot, "{pattern}: {err:?}");
    }

    #[test]
    fn powershell_plans_may_name_sh_builtins() {
        let p = Plan {
            dialect: Dialect::PowerShell,
            steps: vec![step(run(&["exit"]))],
        };
        assert_eq!(p.check(&PlanLimits::default()), Ok(()));
    }

    #[test]
    fn step_limit_is_inclusive() {
        let limits = PlanLimits {
            max_steps: 3,
            ..PlanLimits::default()
        };
        let at = plan(vec![step(run(&["true"])); 3]);
        assert_eq!(at.check(&limits), Ok(()));
        let over = plan(vec![step(run(&["true"])); 4]);
        let err = over.check(&limits).unwrap_err();
        assert_eq!(err, PlanError::TooManySteps { steps: 4, max: 3 });
        assert_eq!(
            err.to_string(),
            "plan has 4 steps, over the limit of 3: plan fewer steps, or raise the limit with --plan-max-steps (`plan_max_steps` in the configuration file)"
        );
    }

    #[test]
    fn default_limits() {
        let limits = PlanLimits::default();
        assert_eq!((limits.max_steps, limits.max_bytes), (256, 65536));
        assert!(plan(vec![step(run(&["true"])); 256]).check(&limits).is_ok());
        assert!(
            plan(vec![step(run(&["true"])); 257])
                .check(&limits)
                .is_err()
        );
    }

    #[test]
    fn byte_limit_is_inclusive() {
        let limits = PlanLimits::default();
        // "do it" (5) + "/etc/x" (6) + content.
        let content = "y".repeat(65536 - 11);
        let at = plan(vec![step(write("/etc/x", &content, None))]);
        assert_eq!(at.text_bytes(), 65536);
        assert_eq!(at.check(&limits), Ok(()));
        let over = plan(vec![step(write("/etc/x", &format!("{content}y"), None))]);
        let err = over.check(&limits).unwrap_err();
        assert_eq!(
            err,
            PlanError::TooLarge {
                bytes: 65537,
                max: 65536
            }
        );
        assert_eq!(
            err.to_string(),
            "plan has 65537 bytes of text, over the limit of 65536: plan less text, or raise the limit with --plan-max-bytes (`plan_max_bytes` in the configuration file)"
        );
    }

    #[rstest]
    #[case(
        invalid(3, Field::Arg(0), Problem::EmptyProgram),
        "step 3 run[0]: is empty: name the program to run"
    )]
    #[case(
        invalid(1, Field::Pattern(2), Problem::WildcardNotLast),
        "step 1 remove_files[2]: has a `*` outside its last component"
    )]
    #[case(
        invalid(2, Field::Mode, Problem::ModeOutOfRange(0o10000)),
        "step 2 write_file.mode: 10000 (octal) is not a permission mode: the most is 7777"
    )]
    #[case(
        invalid(4, Field::Description, Problem::DescriptionTooLong { len: 201, max: 200 }),
        "step 4 description: is 201 bytes, over the limit of 200: shorten it"
    )]
    fn messages_say_what_and_where(#[case] err: Result<(), PlanError>, #[case] message: &str) {
        assert_eq!(err.unwrap_err().to_string(), message);
    }
}
