//! The plan path of cocoon-fixup: from a pod and its VM record to a
//! checked, rendered plan and the annotation values the fixup writes. No
//! async runtime, no Kubernetes client, no network: the CLI, the node
//! daemon (`fixup-host`) and an embedder through a C library all build on
//! this crate, and `tests/deps.rs` keeps the daemon's crates out of it.
//!
//! # Layout
//!
//! The plan path:
//!
//! - [`facts`]: pod and inspect input, validated VM facts.
//! - [`binding`]: whether a VM is the pod's own (spec section 2), pure.
//! - [`classify`]: facts to scenario, a pure function (spec section 3).
//! - [`probe`]: the qcow2 overlay probe, confined to the cocoon root.
//! - [`plugin`]: the only module that knows wasmtime: engine, loader, sandbox,
//!   bindings, authenticated precompiled cache, selection, and the
//!   ownership checks of the files it loads. The built-in plugins are built
//!   by `build.rs` and embedded.
//! - [`plan`]: the plan as domain types; checks; rendering to exec argv and
//!   hint scripts; attribution of a failed exec to its step.
//! - [`planner`]: the plan path end to end, and its JSON report.
//! - [`display`]: untrusted text made safe to print.
//!
//! What the fixup decides and writes, as pure functions:
//!
//! - [`decision`]: the one decision for one pod, as a state machine every
//!   host carries out (the daemon, `plan`, `capture`, the C library): what
//!   to do next, from what was observed; the apply path's settings.
//! - [`lifecycle`]: lifecycle stickiness and the decision table of spec
//!   section 8 (what to do with a pod, from its annotations).
//! - [`annotations`]: annotation keys, event reasons and messages, the error
//!   chain, the failure records and their size limits.
//! - [`exec`]: what one exec of a plan left behind, and whether it ran to
//!   completion.
//! - [`memory`]: the host's durable record of each pod uid (hibernate
//!   history, wake verdicts, the VM each marker was written for, the retry
//!   budget) in its state directory, and the wake evidence rules of spec
//!   section 2 that read it.
//!
//! The tools around the decision (the plugin kit, capture, the plugin
//! template and the conformance suite's replayer) are the `fixup-kit`
//! crate: the CLI and the tests use them, and this crate, which the C
//! library links, does not carry them.

pub mod annotations;
pub mod binding;
pub mod classify;
pub mod decision;
pub mod display;
pub mod exec;
pub mod facts;
pub mod lease;
pub mod lifecycle;
pub mod memory;
pub mod plan;
pub mod planner;
pub mod plugin;
pub mod probe;
