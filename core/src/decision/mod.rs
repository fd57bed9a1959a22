//! The one decision for one pod: what a host does next, from what it has
//! observed. Every host (the daemon's `run` and `serve`, `plan`,
//! `capture`, the C library and the Go package over it) carries out the
//! actions decided here and reports what happened; none decides.
//!
//! The shape is the controller runtime's: [`PodTask::start`] takes the pod
//! as read and returns the first [`Action`]; the host carries it out and
//! hands the result back as a [`Report`] to [`PodTask::next`], with the
//! time on its clock, and gets the next action, until
//! [`Action::Finish`]. Nothing here reads a clock, sleeps, draws random
//! numbers (nonces come from the [`NonceSource`] the host gives), or talks
//! to cocoon, Kubernetes or a plugin, so the whole loop is a table test:
//! see `tests/conformance/` and `docs/conformance.md`.
//!
//! What is decided here, once:
//!
//! - the lifecycle gate and the table of spec section 8
//!   ([`crate::lifecycle`]), binding the VM to the pod (spec section 2,
//!   [`locate`]), resumed work planned from the disk probe, classification
//!   (spec section 3);
//! - node errors (retried, never a pod failure) against plan failures
//!   (the pod is failed);
//! - the fixup loop of spec section 5 (the `running` write, the retry
//!   budget, each exec's timeout, the error chain, exhaustion, success)
//!   and the IP wait of spec section 6 (the Windows renew nudge, the DHCP
//!   recovery pass, the final write); their numbers are [`Settings`];
//! - every write decided from a read of the pod, and the read again when
//!   the pod changed under it;
//! - what a shutdown means at each point (nothing is marked failed).

mod attempts;
mod locate;
mod prepare;
pub mod reports;
mod settings;
mod skeleton;
mod stop;
mod task;

pub use crate::lifecycle::LifecycleIntent;
pub use attempts::{NonceSource, os_nonces};
pub use locate::{
    Lookup, bind_record, boot_override, has_work, lookup, never_planned, observe, vm_id,
};
pub use prepare::{PrepareTask, Prepared};
pub use settings::{
    DEFAULT_SAC_DEADLINE, RawSettings, ReadyConfig, RetryConfig, Settings, SettingsBuilder,
    WakeConfig,
};
pub use skeleton::WrongReport;
pub use stop::{Again, Backoff, Stop};
pub use task::{DECIDE_ROUNDS, PodTask};

use std::fmt;
use std::net::Ipv4Addr;
use std::time::Duration;

use serde::Serialize;

use crate::annotations::{AnnotationPatch, Event};
use crate::binding::Mismatch;
use crate::classify::Scenario;
use crate::exec::ExecOutput;
use crate::facts::{FactError, MacAddr, Observation, PodInput, VmFacts, VmId, VmInspect};
use crate::lifecycle::HandsOff;
use crate::memory::{Listed, PodMemory};
use crate::planner::{ComposedPlan, PlanOutcome, Planner, PlannerError, Preparation};
use crate::plugin::PluginError;
use crate::plugin::registry::NoPlugin;
use crate::probe::ProbeError;
use fixup_sac::{SacError, StaticNic};

/// One incarnation of a pod: a write for `uid` never lands on a pod that
/// was deleted and recreated under the same name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why a pod could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    /// The pod was deleted, or replaced by a new incarnation (another uid).
    /// Nothing more must be written for it.
    #[error("pod {pod} is gone (deleted, or recreated with another uid)")]
    Gone { pod: String },
    /// The API server could not be reached, or kept failing, after
    /// retries: a later try may get through.
    #[error("kubernetes API, pod {pod}: {reason}")]
    Api { pod: String, reason: String },
    /// The API server refused the request for good (401, 403, 422, ...):
    /// another try gets the same answer until someone changes the cluster.
    #[error("kubernetes API, pod {pod}: {reason}")]
    Refused { pod: String, reason: String },
}

/// How a conditional write ended, short of an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guarded {
    /// Written; the pod as the write left it when the API server said.
    Written(Option<PodInput>),
    /// Not written: the pod is no longer as it was read. This is the pod
    /// now, to decide again from.
    Changed(PodInput),
}

/// Why `cocoon vm inspect` gave no record ([`Report::Inspected`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InspectFailed {
    /// It failed (as one line): tried again later ([`Stop::Inspect`]).
    Failed(String),
    /// The host knows the VM does not exist (as one line): the pod's VM
    /// is over, and not tried again ([`Stop::VmGone`]).
    Gone(String),
}

impl From<String> for InspectFailed {
    fn from(message: String) -> Self {
        InspectFailed::Failed(message)
    }
}

/// Why the host was asked to handle the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Trigger {
    /// A pod event (or a one-shot `run`).
    Event,
    /// Startup reconciliation: resumed work is announced with
    /// `ResumedAfterRestart`.
    Startup,
    /// The daemon tries again after a failure before the loop: the node
    /// error that caused it is not announced again.
    Retry,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Event => "event",
            Trigger::Startup => "startup",
            Trigger::Retry => "retry",
        }
    }
}

/// What the host is asked to plan ([`PlanRequest::run`] does it).
#[derive(Debug, Clone)]
pub enum PlanRequest {
    /// The fixup of the pod's VM: [`Planner::plan`].
    Fixup(Observation),
    /// The DHCP recovery pass for an all-DHCP Linux clone:
    /// [`Planner::plan_scenarios`] for [`Scenario::DhcpRecovery`].
    Recovery(VmFacts),
    /// The preparation of a running parent: [`Planner::plan_prepare`].
    Prepare(Observation),
}

impl PlanRequest {
    /// Plan it with `planner`, as every host does.
    pub fn run(&self, planner: &Planner) -> Planned {
        match self {
            PlanRequest::Fixup(obs) => Planned::Fixup(planner.plan(obs)),
            PlanRequest::Recovery(facts) => {
                Planned::Recovery(planner.plan_scenarios(facts, &[Scenario::DhcpRecovery]))
            }
            PlanRequest::Prepare(obs) => Planned::Prepare(planner.plan_prepare(obs)),
        }
    }
}

/// A [`PlanRequest`]'s answer.
#[derive(Debug)]
pub enum Planned {
    Fixup(Result<PlanOutcome, PlannerError>),
    Recovery(Result<ComposedPlan, PlannerError>),
    Prepare(Result<Preparation, PlannerError>),
}

/// What an exec is for, so a host can log and count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExecPurpose {
    /// One attempt of the fixup plan.
    Fixup,
    /// The DHCP recovery pass of the IP wait.
    Recovery,
    /// The Windows `ipconfig /renew` nudge of the IP wait.
    Renew,
    /// One attempt of a parent's preparation ([`PrepareTask`]).
    Prepare,
}

/// The next thing a host does for the pod.
#[derive(Debug)]
pub enum Action {
    /// Wait for a turn among the pods worked on at once (the daemon's
    /// `fixups_in_flight`; a host without such a bound answers at once).
    /// Interruptible by shutdown. Report: [`Report::Go`].
    Admit,
    /// Give the turn back: the IP wait does not hold one. Report:
    /// [`Report::Go`].
    Release,
    /// Report [`Report::Cancelled`] when the host is shutting down, else
    /// [`Report::Go`]. Nothing is done.
    Checkpoint,
    /// `cocoon vm inspect <vm>`, bounded by `timeout`. Report:
    /// [`Report::Inspected`].
    Inspect { vm: VmId, timeout: Duration },
    /// List every pod the host sees on its node (the pod itself among
    /// them or not). Asked only when the VM record's name is the pod's
    /// annotated name `vm_name`, which binds only when no other pod claims
    /// it (spec section 2): the decision checks the list
    /// ([`crate::binding::settle`]), the host only answers. Report:
    /// [`Report::OtherPods`].
    OtherPods { vm_name: String },
    /// List the events in the pod's namespace (events.k8s.io/v1) that each
    /// of `field_selectors` selects, one listing per selector, and report
    /// them together: the stack's own record of a hibernate wake (spec
    /// section 2, rule 2). The selectors ask the API server for exactly the
    /// events that can count (`regarding.uid`, `reason`, `type` and
    /// `reportingController`: [`crate::memory::field_selectors`]), so that
    /// no other event can fill the listing; the decision checks each event
    /// again ([`crate::memory::Witness`]), the host only lists. Report:
    /// [`Report::Events`].
    WakeEvents { field_selectors: Vec<String> },
    /// Plan ([`PlanRequest::run`]), off any async worker. Report:
    /// [`Report::Planned`].
    Plan(Box<PlanRequest>),
    /// Read the pod by namespace and name. Report: [`Report::Read`].
    Read,
    /// Merge-patch the pod's annotations under the uid precondition and,
    /// when `unless_changed_from` is given, only while the pod is still as
    /// that read (its resource version). Report: [`Report::Patched`]
    /// (an unconditional write that lands is `Guarded::Written`).
    Patch {
        patch: AnnotationPatch,
        unless_changed_from: Option<Box<PodInput>>,
    },
    /// `cocoon vm exec <vm> -- <argv>`, bounded by `timeout`.
    /// Interruptible by shutdown. Report: [`Report::Ran`].
    Exec {
        vm: VmId,
        argv: Vec<String>,
        timeout: Duration,
        purpose: ExecPurpose,
    },
    /// Wait until `mac` has a lease or the clock reaches `until`.
    /// Interruptible by shutdown. Report: [`Report::Lease`].
    WaitLease { mac: MacAddr, until: Duration },
    /// Wait until the clock reaches `until`. Interruptible by shutdown.
    /// Report: [`Report::Go`].
    Sleep { until: Duration },
    /// Open the VM's serial console (spec section 10: the socket
    /// `<cocoon root>/run/cloudhypervisor/<vm>/console.sock`, confined to
    /// the cocoon root), wait for the `SAC>` prompt and list the guest's
    /// interfaces until at least `need` are listed, keeping the console
    /// open for the [`Action::SacSet`]s that follow ([`fixup_sac::Session`]
    /// does all of it). Interruptible by shutdown. Bounded by the pass's
    /// total deadline: the clock reaches `until` at the latest (`total` is
    /// the whole pass's span, for the message), and then the step in
    /// progress fails as [`SacError::Deadline`] (a dial or enum step).
    /// Report: [`Report::SacOpened`].
    SacOpen {
        vm: VmId,
        need: usize,
        until: Duration,
        total: Duration,
    },
    /// On the console opened last: set `nic`'s address on the guest's
    /// interface `net` and check that it took effect, in rounds
    /// ([`fixup_sac::Session::set_static`]). Interruptible by shutdown.
    /// Bounded by the pass's total deadline as [`Action::SacOpen`] is (a
    /// set or verify step). Report: [`Report::SacSet`].
    SacSet {
        net: u32,
        nic: StaticNic,
        until: Duration,
        total: Duration,
    },
    /// Close the console opened last, if any. Report: [`Report::Go`].
    SacClose,
    /// Record this event on the pod (best effort: a failure is logged).
    /// Report: [`Report::Go`].
    Tell(Event),
    /// Tell the host's operator (log, metrics). Report: [`Report::Go`].
    Note(Note),
    /// Keep this record of the pod durably, under the pod's uid, in place
    /// of the one given to [`PodTask::remember`] (best effort: a failure
    /// is logged). Asked only of a host that keeps records. Report:
    /// [`Report::Go`].
    Remember(Box<PodMemory>),
    /// Hand the change of the lifecycle keys to the embedder that owns
    /// them ([`Settings::lifecycle_intents`]), which publishes it before it
    /// reports. It comes right after the write it belongs to landed, or,
    /// for a change of those keys alone, right after the read it was
    /// decided from. Report: [`Report::Go`].
    Publish(LifecycleIntent),
    /// The task is over.
    Finish(Result<Summary, Stop>),
}

impl Action {
    /// Whether a host races this action against its shutdown and reports
    /// [`Report::Cancelled`] when shutdown comes first (or had come).
    pub fn interruptible(&self) -> bool {
        matches!(
            self,
            Action::Admit
                | Action::Checkpoint
                | Action::Exec { .. }
                | Action::WaitLease { .. }
                | Action::Sleep { .. }
                | Action::SacOpen { .. }
                | Action::SacSet { .. }
        )
    }
}

/// What the host saw when it carried out the last action.
#[derive(Debug)]
pub enum Report {
    /// Done (fire-and-forget actions, a turn granted, a sleep over).
    Go,
    /// The host is shutting down (only for interruptible actions).
    Cancelled,
    /// `cocoon vm inspect`'s record, or why there is none.
    Inspected(Result<VmInspect, InspectFailed>),
    /// The pods the host sees on its node, or why it has no such view (as
    /// one line): the annotated name is then not proven, and the task
    /// stops without running anything ([`Stop::Unproven`]).
    OtherPods(Result<Vec<PodInput>, String>),
    /// The events each selector selected, and whether a listing was cut
    /// short; or why they could not be listed (as one line): then rule 2
    /// finds nothing, and the task goes on with a warning.
    Events(Result<Listed, String>),
    Planned(Planned),
    Read(Result<Option<PodInput>, PodError>),
    Patched(Result<Guarded, PodError>),
    /// The exec's output, or why it could not run (as one line).
    Ran(Result<ExecOutput, String>),
    /// The lease's address, or `None` when the wait reached its end; or
    /// why the lease file could not tell (still unusable at the end: it
    /// cannot be read, or is not a list of leases).
    Lease(Result<Option<Ipv4Addr>, String>),
    /// The console is open: the guest's interface numbers, in the order
    /// listed; or why it could not be.
    SacOpened(Result<Vec<u32>, SacError>),
    /// The address took effect, or why it did not.
    SacSet(Result<(), SacError>),
}

/// What a host tells its operator (a log line, a metric).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// Work resumed after a restart, with its `op`.
    Resumed(&'static str),
    /// The VM is not this pod's: nothing run. `expected` is the name
    /// derived from the pod.
    VmMismatch { expected: String, mismatch: String },
    /// The node is set up wrong; the pod waits (`kind` as
    /// [`NodeError::kind`]).
    NodeError { kind: &'static str, message: String },
    /// No plan could be made for the pod (`kind` as the planner error's).
    PlanFailed { line: String },
    /// How the fixup loop ended (`Done` and `Exhausted` are counted).
    Fixup {
        scenario: Scenario,
        end: FixupEnd,
        attempts: u32,
    },
    /// How the IP wait ended, and whether the VM is a hibernate wake.
    IpWait { readiness: Readiness, wake: bool },
    /// How the serial-console pass ended.
    Sac(SacEnd),
    /// Something worth a warning in the log.
    Warn(String),
}

/// The node is at fault, not the pod: reported and retried.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("pod {pod}: node configuration: {source}")]
    Probe {
        pod: String,
        #[source]
        source: ProbeError,
    },
    #[error("pod {pod}: node configuration: {source}")]
    Plugins {
        pod: String,
        #[source]
        source: NoPlugin,
    },
    #[error("pod {pod}: node configuration: {source}")]
    PluginCode {
        pod: String,
        #[source]
        source: PluginError,
    },
    /// cocoon printed a record whose id is no VM id.
    #[error("pod {pod}: cocoon's VM record: {source}")]
    BadRecord {
        pod: String,
        #[source]
        source: FactError,
    },
    /// The planner made no plan for a VM classification says needs one: a
    /// fault of this host (its planner or a plugin registry that changed
    /// under it), never the pod's, so the pod is not failed for it.
    #[error(
        "pod {pod}: the planner made no plan for a VM that needs a fixup; report this as a cocoon-fixup bug"
    )]
    NoPlan { pod: String },
    /// The VM's console socket is not one the host connects to (a link
    /// on its path, something other than a socket): the node is set up
    /// wrong, not the pod.
    #[error("pod {pod}: node configuration: {source}")]
    Console {
        pod: String,
        #[source]
        source: SacError,
    },
    /// The lease file was still unusable when the IP wait ended (it cannot
    /// be read, or holds no JSON array of leases): whether the VM has a
    /// lease is unknown, and that is the node's fault, so the pod is not
    /// failed for an IP it may well have.
    #[error("pod {pod}: node configuration: {message}")]
    Lease { pod: String, message: String },
}

impl NodeError {
    /// A short label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            NodeError::Probe { .. } => "probe",
            NodeError::Plugins { .. } | NodeError::PluginCode { .. } => "plugins",
            NodeError::BadRecord { .. } => "cocoon",
            NodeError::NoPlan { .. } => "planner",
            NodeError::Console { .. } => "console",
            NodeError::Lease { .. } => "lease",
        }
    }

    /// What the operator does next, for the event.
    fn fix(&self) -> &'static str {
        match self {
            NodeError::Plugins { .. } => {
                "the fixup waits: fix the node's plugin directory, then restart cocoon-fixup"
            }
            NodeError::PluginCode {
                source: PluginError::NotLoaded { .. },
                ..
            } => "the fixup waits until the node's cache is fixed",
            NodeError::PluginCode {
                source: PluginError::Deadline { .. },
                ..
            } => {
                "the fixup waits and is tried again: a plugin that keeps running past its deadline needs a fixed version, or a longer --plugin-deadline on a loaded node"
            }
            NodeError::Lease { .. } => {
                "readiness waits, and is tried again, until cocoon-net's lease file can be read"
            }
            _ => "the fixup waits, and is tried again, until the node is fixed",
        }
    }
}

/// How the embedder that made the pod's VM booted it, as it knows it
/// itself: evidence of a wake (or of none) that needs neither the stack's
/// events nor the wake grace. Only an embedder says it, never the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Told {
    /// It cloned the VM from a snapshot just now.
    Create,
    /// It forked the VM from a running one just now.
    Fork,
    /// It restored the pod's hibernate snapshot into a new VM.
    Wake,
    /// It resumed the pod's hibernated VM in place.
    WakeInPlace,
    /// It found the VM running when it started (its own restart): nothing
    /// new about the boot, but no `Woken` event is still to come, so the
    /// grace does not wait.
    Resume,
}

impl Told {
    /// The verdict it gives, or `None` for [`Told::Resume`].
    pub fn evidence(self) -> Option<crate::memory::Evidence> {
        use crate::memory::Evidence;
        match self {
            Told::Create | Told::Fork => Some(Evidence::Told),
            Told::Wake => Some(Evidence::ToldWake),
            Told::WakeInPlace => Some(Evidence::ToldWakeInPlace),
            Told::Resume => None,
        }
    }

    /// The boot kind it gives the observation, or `None` for
    /// [`Told::Resume`].
    pub fn boot(self) -> Option<crate::facts::BootKind> {
        use crate::facts::BootKind;
        match self {
            Told::Create => Some(BootKind::Clone),
            Told::Fork => Some(BootKind::Fork),
            Told::Wake | Told::WakeInPlace => Some(BootKind::Wake),
            Told::Resume => None,
        }
    }
}

/// A fact of the VM record the embedder could not give (it built the
/// record from its own types): the decision never guesses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordFact {
    /// `config.image`: the snapshot's source image on a normal clone.
    Image,
    /// `created_at`: what a stack event's time is judged by.
    CreatedAt,
}

impl RecordFact {
    pub fn as_str(self) -> &'static str {
        match self {
            RecordFact::Image => "config.image",
            RecordFact::CreatedAt => "created_at",
        }
    }
}

/// What the embedder knows of the pod's VM beyond its record
/// ([`PodTask::told`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Knows {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<Told>,
    /// The snapshot's source image, which replaces the record's
    /// `config.image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_image: Option<String>,
    /// Facts its record of the VM lacks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub record_lacks: Vec<RecordFact>,
}

/// What the host did with the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Handled {
    /// Nothing: the table leaves the pod alone ([`Summary::hands_off`]).
    Nothing,
    /// The fixup failed earlier: the work stays parked.
    Parked,
    /// The VM is not this pod's: nothing ran.
    VmMismatch,
    /// The fixup loop ran (and then the IP wait, when it succeeded).
    Fixup,
    /// Only the IP wait ran.
    IpWait,
    /// The pod was recreated under its name before the work started.
    Gone,
    /// The host shut down while the call waited for its turn.
    Shutdown,
    /// A running parent's preparation ran ([`PrepareTask`]); `fixup` says
    /// how it ended.
    Prepare,
}

/// How the fixup loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FixupEnd {
    Done,
    Exhausted,
    PlanFailed,
    Shutdown,
    /// Deleted, replaced, or taken over by the stack: nothing more written.
    Gone,
}

/// How the serial-console pass ended (spec section 10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SacEnd {
    /// Every static address took effect.
    Set,
    /// The pass failed: the pod is failed (`WindowsStaticIPFailed`).
    Failed,
    Shutdown,
    /// Deleted, replaced, or taken over by the stack before it ended.
    Gone,
}

/// How the IP wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Readiness {
    Ready,
    TimedOut,
    Shutdown,
    /// Deleted, replaced, or taken over by the stack.
    Gone,
}

macro_rules! labels {
    ($ty:ident { $($variant:ident => $label:literal),* $(,)? }) => {
        impl $ty {
            /// The label in `run`'s JSON summary, logs and metrics.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $label),*
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

labels!(Handled {
    Nothing => "nothing",
    Parked => "parked",
    VmMismatch => "vm-mismatch",
    Fixup => "fixup",
    IpWait => "ip-wait",
    Gone => "gone",
    Shutdown => "shutdown",
    Prepare => "prepare",
});
labels!(FixupEnd {
    Done => "done",
    Exhausted => "exhausted",
    PlanFailed => "plan-failed",
    Shutdown => "shutdown",
    Gone => "gone",
});
labels!(SacEnd {
    Set => "set",
    Failed => "failed",
    Shutdown => "shutdown",
    Gone => "gone",
});
labels!(Readiness {
    Ready => "ready",
    TimedOut => "timed-out",
    Shutdown => "shutdown",
    Gone => "gone",
});

/// Whether a planner error is the node's fault (the cocoon root cannot be
/// probed, the plugin directory leaves the scenario without a plugin, a
/// cached plugin's code cannot be loaded): the pod waits and the work is
/// tried again; any other planner error fails the pod.
pub fn is_node_error(error: &PlannerError) -> bool {
    match error {
        PlannerError::Probe(_) => true,
        PlannerError::NoPlugin(e) => e.is_node_config(),
        PlannerError::Plugin(e) => e.is_node_config(),
        _ => false,
    }
}

/// A decision a host carries out one action at a time, reporting what
/// each did: [`PodTask`] (a pod's fixup) and [`PrepareTask`] (a parent's
/// preparation). A host's executor is written once over this.
pub trait Steps: fmt::Debug {
    /// The pod the decision is for.
    fn pod(&self) -> &PodRef;
    /// The next action, given the report of the last one and the host's
    /// clock since the task started (never going back).
    fn next(&mut self, report: Report, now: Duration) -> Action;
    /// [`next`](Self::next), refusing a report that does not answer the
    /// last action (the task is then unchanged).
    fn try_next(&mut self, report: Report, now: Duration) -> Result<Action, WrongReport>;
    /// The record about to be reported lacks these facts (the embedder
    /// built it from its own types): the decision never guesses them.
    fn record_lacks(&mut self, _lacks: &[RecordFact]) {}
}

/// A planner error [`is_node_error`] says is the node's, as the
/// [`NodeError`] a task stops with.
pub(crate) fn node_error(pod: String, error: PlannerError) -> NodeError {
    match error {
        PlannerError::Probe(source) => NodeError::Probe { pod, source },
        PlannerError::NoPlugin(source) => NodeError::Plugins { pod, source },
        PlannerError::Plugin(source) => NodeError::PluginCode { pod, source },
        e => unreachable!("not a node error: {e}"),
    }
}

/// How one task ended, for logs, `run`'s JSON summary and metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub pod: String,
    pub uid: String,
    pub action: Handled,
    /// Why nothing was done (`action` = `nothing`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hands_off: Option<HandsOff>,
    /// Why the VM is not this pod's (`action` = `vm-mismatch`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mismatch: Option<String>,
    /// The classification rule (1..=7); 0 when the VM was not classified.
    pub rule: u8,
    /// The scenario, or `none`.
    #[serde(serialize_with = "scenario_or_none")]
    pub scenario: Option<Scenario>,
    /// Absent when no fixup ran.
    pub fixup: Option<FixupEnd>,
    pub attempts: u32,
    /// Absent when no serial-console pass ran (spec section 10).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sac: Option<SacEnd>,
    /// Absent when no IP wait ran.
    pub readiness: Option<Readiness>,
    pub ip: Option<String>,
    /// The error chain of a failed fixup (of a preparation: its failed
    /// attempts, or why there was nothing to prepare).
    pub errors: Vec<String>,
    /// What a preparation wrote to `vm.cocoonstack.io/prepared` (absent
    /// for a fixup, and for a preparation that wrote nothing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prepared: Option<String>,
}

fn scenario_or_none<S: serde::Serializer>(
    scenario: &Option<Scenario>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(scenario.map_or("none", Scenario::as_str))
}

impl Summary {
    pub fn new(pod: String, uid: String) -> Self {
        Summary {
            pod,
            uid,
            action: Handled::Nothing,
            hands_off: None,
            mismatch: None,
            rule: 0,
            scenario: None,
            fixup: None,
            attempts: 0,
            sac: None,
            readiness: None,
            ip: None,
            errors: Vec::new(),
            prepared: None,
        }
    }

    /// Ready intent published.
    pub fn is_ready(&self) -> bool {
        self.readiness == Some(Readiness::Ready)
    }
}

/// The mismatch as the event tells it (never naming the other VM).
fn mismatch_event(mismatch: &Mismatch, pod: &PodRef) -> Event {
    Event::warning(
        crate::annotations::reasons::VM_MISMATCH,
        crate::annotations::messages::vm_mismatch(mismatch, &pod.namespace, &pod.name),
    )
}
