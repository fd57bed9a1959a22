//! Benchmarks of cocoon-fixup: what a fixup costs, each figure next to a
//! baseline measured in the same run (issue 6).
//!
//! The criterion benches (`cargo bench -p fixup-bench`) measure plan
//! latency, engine settings and in-process cold start. The `fixup-bench`
//! binary measures what needs a process of its own (cold start from exec,
//! the clone storm's CPU time and peak memory, the readiness reaction) and
//! prints the summary table from both (`fixup-bench report`).
//!
//! Nothing here asserts a timing: the setup asserts that what is timed is
//! right (the native and the WebAssembly plans are equal, every storm pod
//! ends ready), and the numbers are reported against goals, not tested.
//!
//! # Layout
//!
//! - [`cases`]: the four plan scenarios as pods and VMs, and a planner.
//! - [`native`]: the native baseline: the plugin crates' `Plugin::plan`
//!   called as plain Rust, around the host's own classification,
//!   validation, composition, checks and rendering.
//! - [`engines`]: engine settings `EngineOptions` does not expose (instance
//!   allocator, fuel or epoch interruption, `InstancePre`), built from the
//!   host's own bindings and sandbox.
//! - [`cocoon`]: an in-process `Cocoon` that answers after a delay and fails
//!   chosen first attempts.
//! - [`standins`]: the fake API server and the runner in a process of their
//!   own, and the host's client of that runner.
//! - [`storm`]: the clone storm through `Host::handle`.
//! - [`serve`]: `serve` with many pods on the node, most needing nothing.
//! - [`ready`]: from a lease written by rename to the published IP.
//! - [`process`]: CPU time and memory of this process, machine facts.
//! - [`report`]: criterion's results, percentiles, the markdown summary.

pub mod cases;
pub mod cocoon;
pub mod engines;
pub mod kube;
pub mod native;
pub mod process;
pub mod ready;
pub mod report;
pub mod serve;
pub mod standins;
pub mod storm;
