//! cocoon-fixup: the post-clone guest network fixup host.
//!
//! # Layout
//!
//! - [`facts`]: pod and inspect input, validated VM facts.
//! - [`classify`]: facts to scenario, a pure function (spec section 3).
//! - [`plan`]: the plan as domain types; rendering to exec argv and hint scripts.
//! - [`probe`]: the qcow2 overlay probe, confined to the cocoon root.
//! - [`plugin`]: the only module that knows wasmtime: engine, loader, sandbox,
//!   bindings, precompiled cache, selection.
//! - [`planner`]: the plan path end to end, and its JSON report.
//! - `cli` (binary only): the thin `cocoon-fixup` command line.

pub mod classify;
pub mod facts;
pub mod plan;
pub mod planner;
pub mod plugin;
pub mod probe;
