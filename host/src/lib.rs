//! cocoon-fixup: the post-clone guest network fixup host, the apply path
//! and the node daemon over the plan path of `fixup-core`.
//!
//! # Layout
//!
//! The plan path lives in `fixup-core` (`core/`), with no async runtime
//! and no Kubernetes client, so that an embedder can use it without the
//! daemon. This crate does not re-export it: code here names
//! `fixup_core::facts`, `fixup_core::planner` and so on where it means them,
//! so every path in `host/src` leads to this crate or says which it leaves for.
//!
//! The apply path:
//!
//! - [`cocoon`]: the one type that runs the `cocoon` CLI.
//! - [`console`]: the VM's serial console, for the Windows static-IP pass.
//! - [`pods`]: the Kubernetes seam (`PodApi`), pods in memory, and the
//!   events the host writes (the annotation keys and event reasons are
//!   `fixup_core::annotations`'s).
//! - [`kube`]: `PodApi` over the real `kube` client, uid preconditions, retries.
//! - [`apply`]: the executor: carries out each action of core's task
//!   (`fixup_core::decision`) for one pod.
//! - [`ready`]: the lease file, its watcher, the readiness probe.
//! - [`host`]: `Host`, what an embedder builds once and calls per pod.
//! - [`node_pods`]: the other pods on the node, for the check of an
//!   annotated VM name: the daemon's watched copy, or a listing.
//! - [`serve`]: the node daemon's watch, dispatcher and metrics endpoint.
//! - [`metrics`]: Prometheus metrics.
//! - [`config`]: flags > environment > file > defaults, resolved once.
//! - [`logging`]: the binary's log filter (`COCOON_FIXUP_LOG`) and colour.
//! - [`oci`]: plugins as OCI artifacts: push, pull by digest, the store of
//!   pinned plugins, and their cosign signatures checked against the trust
//!   policy (`oci::signature`).
//!
//! The binary (`src/bin/cocoon-fixup/`) only parses, calls these, prints the error once
//! and picks the exit code.

pub mod apply;
pub mod cocoon;
pub mod config;
pub mod console;
pub mod host;
pub mod kube;
pub mod logging;
pub mod metrics;
pub mod node_pods;
pub mod oci;
pub mod pods;
pub mod ready;
pub(crate) mod records;
pub mod reload;
pub mod serve;
