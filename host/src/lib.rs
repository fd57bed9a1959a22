//! cocoon-fixup: the post-clone guest network fixup host.
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
//!   ownership checks of the files it loads.
//! - [`plan`]: the plan as domain types; rendering to exec argv and hint scripts.
//! - [`planner`]: the plan path end to end, and its JSON report.
//!
//! The apply path:
//!
//! - [`cocoon`]: the one type that runs the `cocoon` CLI.
//! - [`pods`]: the Kubernetes seam (`PodApi`), annotation keys, event
//!   reasons, pods in memory.
//! - [`kube`]: `PodApi` over the real `kube` client, uid preconditions, retries.
//! - [`lifecycle`]: lifecycle stickiness and the decision table of spec
//!   section 8 (what to do with a pod, from its annotations), pure.
//! - [`apply`]: the fixup loop within its budget, and the IP wait.
//! - [`ready`]: the lease file, its watcher, the readiness probe.
//! - [`host`]: `Host`, what an embedder builds once and calls per pod.
//! - [`serve`]: the node daemon's watch, dispatcher and metrics endpoint.
//! - [`metrics`]: Prometheus metrics.
//! - [`config`]: flags > environment > file > defaults, resolved once.
//!
//! For plugin vendors:
//!
//! - [`template`]: `plugin new`, a plugin crate from `plugins/template/`.
//! - [`kit`]: `plugin test` (case files in, diffs and usage out) and
//!   `plugin inspect` (what a plugin file is, and whether the host takes it).
//!
//! The binary (`src/main.rs`) only parses, calls these, prints the error once
//! and picks the exit code.

pub mod apply;
pub mod binding;
pub mod classify;
pub mod cocoon;
pub mod config;
pub mod display;
pub mod facts;
pub mod host;
pub mod kit;
pub mod kube;
pub mod lifecycle;
pub mod metrics;
pub mod plan;
pub mod planner;
pub mod plugin;
pub mod pods;
pub mod probe;
pub mod ready;
pub mod serve;
pub mod template;
