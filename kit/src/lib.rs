//! The tools around the decision, for plugin vendors and the tests; the
//! runtime (`fixup-core`) and the C library do not carry them.
//!
//! - The plugin kit: what a plugin author runs before shipping a plugin
//!   (below).
//! - [`capture`]: `capture`, a field pod made into `plugin test` cases.
//! - [`template`]: `plugin new`, a plugin crate from `plugins/template/`.
//! - [`conformance`]: the conformance suite's scenarios and the world
//!   that answers a task's actions from one, which every host's replay
//!   (the daemon's, the C op's, Go's) shares.
//!
//! # The plugin kit
//!
//! - [`run_cases`] (`cocoon-fixup plugin test PLUGIN.wasm CASES`) calls a
//!   plugin once per case file through the real
//!   [`PluginHost`](fixup_core::plugin::PluginHost): the same
//!   sandbox and the same per-call limits as production, a fresh Store for
//!   every case. It compares the result with the case's expectation, shows
//!   a unified diff on a mismatch, reports what each call used against the
//!   limits, and with `--bless` writes the actual results back.
//! - [`Inspector`] (`cocoon-fixup plugin inspect PLUGIN.wasm`) says what a
//!   plugin file is (name, version, contract, digest, scenarios, flavours,
//!   imports) and whether the host would load it, and if not, why and what
//!   to change. A file that does not load is still described as far as the
//!   host got.
//!
//! The kit compiles plugins without the on-disk cache: a plugin under
//! development changes with every build, and an entry per build would only
//! pile up.
//!
//! # Layout
//!
//! - `case`: the case-file format; finding, reading and validating case
//!   files ([`Case`], [`load_case`], [`CaseError`]).
//! - `diff`: a plugin's result against a case's expectation: the match,
//!   the readable diff, and the expectation written back (`--bless`,
//!   [`case_text`]).
//! - `runner`: `plugin test`: running the cases ([`test_plugin`]) and the
//!   [`TestReport`].
//! - `inspect`: `plugin inspect`: the [`Inspector`] and its
//!   [`Inspection`].
//!
//! What the kit as a whole shares stays here: the engine options it runs
//! plugins with ([`engine_options`]) and why it could not run at all
//! ([`KitError`]).

pub mod capture;
mod case;
pub mod conformance;
mod diff;
mod inspect;
mod runner;
pub mod template;

use std::path::PathBuf;

use fixup_core::plugin::{EngineOptions, LoadError, PluginError};

pub use case::{Case, CaseError, ErrorKind, Expect, ExpectedError, case_files, load_case};
pub use diff::{case_text, is_refusal};
pub use inspect::{
    Access, DirectoryProblem, DirectoryReport, Format, ImportReport, Inspection, Inspector,
    PolicyReport,
};
pub use runner::{
    CaseReport, LimitsReport, LogReport, PluginSummary, Status, TestOptions, TestReport, Usage,
    run_cases, test_plugin,
};

/// Instances the kit's engine reserves. The kit makes one call at a time;
/// the pooling allocator's reservation does not need to be the daemon's.
const KIT_SLOTS: u32 = 4;

/// The engine options the kit runs plugins with: the resolved options
/// (limits, plugin allow-list and cache as configured, so `--plugin-fuel`,
/// `--cache-dir` and friends apply; the command line resolves the cache
/// to the person's own) with a small instance pool.
pub fn engine_options(resolved: &EngineOptions) -> EngineOptions {
    EngineOptions {
        slots: KIT_SLOTS,
        ..resolved.clone()
    }
}

/// Why the kit could not run at all (as opposed to a case that failed).
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    #[error(
        "cannot read cases at {path}: {reason}; pass a case file or a folder of `*.json` case files"
    )]
    Cases { path: PathBuf, reason: String },
    #[error(
        "{path} holds no `*.json` case files: write one (the format is in docs/plugins.md, \"5. Testing\")"
    )]
    NoCases { path: PathBuf },
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error("the built-in plugins do not load ({0}): this binary is broken, rebuild it")]
    BuiltIns(LoadError),
}
