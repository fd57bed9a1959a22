//! The plan as domain types, its limits, and its rendering.
//!
//! A plan is what plugins return: ordered, typed steps. This module owns
//! everything that turns it into text, so quoting is done once, here:
//!
//! - [`render_exec`]: the argv after `cocoon vm exec <id> --`, one exec per
//!   attempt, with step markers on stderr so a failure names its step;
//! - [`render_script`]: the hint a person pastes into the guest (POSIX sh
//!   that stops at the first failing step, or PowerShell);
//! - [`attribute_failure`]: reads the markers back out of a failed exec.

/// The shell a plan targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    PosixSh,
    PowerShell,
}

/// Where a step belongs when plans from several plugins are composed.
/// Ordered: prepare < link < configure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    Prepare,
    Link,
    Configure,
}

/// Write a file byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteFile {
    pub path: String,
    pub content: String,
    /// Permission bits to set after writing; `None` leaves them.
    pub mode: Option<u32>,
}

/// What a step does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Run a program; `argv[0]` is looked up on PATH.
    Run(Vec<String>),
    WriteFile(WriteFile),
    /// Remove files if they exist; `*` in the last component is a wildcard.
    RemoveFiles(Vec<String>),
}

/// One step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub description: String,
    pub phase: Phase,
    pub best_effort: bool,
    pub action: Action,
}

/// An ordered list of steps in one dialect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub dialect: Dialect,
    pub steps: Vec<Step>,
}
