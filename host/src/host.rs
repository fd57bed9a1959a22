//! [`Host`]: what an embedding daemon builds once and calls per pod.
//!
//! One call, [`Host::handle`], takes a pod from its annotations to a ready
//! intent (or a clear failure): read the pod, decide from its annotations
//! whether the host has any business with it (spec section 8), inspect its
//! VM and prove the VM is the pod's own (spec section 2), classify, run the
//! fixup loop, wait for the IP. The cocoon CLI
//! and the Kubernetes side are traits ([`Cocoon`], [`PodApi`]), so an
//! embedder can supply its own.

use std::sync::Arc;
use std::time::Duration;

use fixup_core::annotations::{messages, plan_failed_record};
use serde::Serialize;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_util::sync::CancellationToken;

use crate::apply::{
    self, Decided, DhcpRecovery, FixupJob, FixupOutcome, ReadyConfig, ReadyOutcome, RetryConfig,
};
use fixup_core::binding::{self, BindingPolicy, Verdict};
use fixup_core::classify::{self, Rule, Scenario};
use crate::cocoon::{Cocoon, CocoonError};
use fixup_core::facts::{
    BootKind, FactError, GuestOs, ImageKind, Observation, Overrides, PodInput, VmFacts, VmId,
    VmInspect, WaitFacts, WaitNic, annotations, escape_controls,
};
use fixup_core::lifecycle::{self, Action, HandsOff, PostCloneState};
use crate::metrics::Metrics;
use fixup_core::planner::{ComposedPlan, PlanPart, Planner, PlannerError};
use fixup_core::plugin::registry::NoPlugin;
use crate::pods::{Event, PodApi, PodError, PodRef, reasons};
use fixup_core::probe::ProbeError;
use crate::ready::LeaseWatcher;

/// Timeouts, budgets and policies of the apply path, resolved once from
/// the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    pub retry: RetryConfig,
    pub ready: ReadyConfig,
    /// Timeout for `cocoon vm inspect` (default 10 s, `--inspect-timeout`).
    pub inspect_timeout: Duration,
    /// Which VM names bind a VM to its pod (spec section 2).
    pub binding: BindingPolicy,
    /// Pods worked on at once between the lifecycle gate and the end of
    /// their fixup loop (IP waits do not count): more calls wait their turn
    /// after the gate, holding their read and little else; a pod the gate
    /// turns away never waits. Default [`DEFAULT_FIXUPS_IN_FLIGHT`].
    pub fixups_in_flight: usize,
}

/// Pods past the lifecycle gate and not yet through their fixup loop, at
/// once, by default. A storm of clones is read, planned and written a few
/// hundred at a time, so the host does not hold every plan at once while
/// they all wait for the API server; the rest wait at the door. See
/// BENCHMARKS.md (Findings, the clone storm of 10,000).
pub const DEFAULT_FIXUPS_IN_FLIGHT: usize = 256;

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            retry: RetryConfig::default(),
            ready: ReadyConfig::default(),
            inspect_timeout: Duration::from_secs(10),
            binding: BindingPolicy::default(),
            fixups_in_flight: DEFAULT_FIXUPS_IN_FLIGHT,
        }
    }
}

/// Why [`Host::handle`] was called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// Why a pod could not be handled (yet).
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("pod {pod} not found: check the namespace and name")]
    NotFound { pod: String },
    #[error(
        "pod {pod} has no uid: it is not a live pod object (pass a pod read from the API server)"
    )]
    NoUid { pod: String },
    #[error(
        "pod {pod} names no VM yet (no {} or {} annotation): wait until cocoon has created it",
        annotations::VM_ID,
        annotations::VM_NAME
    )]
    NoVm { pod: String },
    #[error(transparent)]
    Facts(#[from] FactError),
    #[error("pod {pod}: {source}")]
    Cocoon {
        pod: String,
        #[source]
        source: CocoonError,
    },
    /// The disk probe cannot read the cocoon root: the node is set up
    /// wrong, not the pod. Reported and retried, never a pod failure.
    #[error("pod {pod}: node configuration: {source}")]
    Probe {
        pod: String,
        #[source]
        source: ProbeError,
    },
    /// The plugin directory leaves the pod's scenario and flavour without a
    /// plugin (a contested claim, a file that did not load): the node's
    /// operator must fix it. Reported and retried, never a pod failure.
    #[error("pod {pod}: node configuration: {source}")]
    Plugins {
        pod: String,
        #[source]
        source: NoPlugin,
    },
    /// A plugin registered from the cache whose code could not be loaded
    /// ([`PluginError::NotLoaded`](fixup_core::plugin::PluginError::NotLoaded)): the node's cache is at fault.
    /// Reported and retried, never a pod failure.
    #[error("pod {pod}: node configuration: {source}")]
    PluginCode {
        pod: String,
        #[source]
        source: fixup_core::plugin::PluginError,
    },
    #[error(transparent)]
    Pods(#[from] PodError),
}

impl HostError {
    /// Whether trying the same pod again later can succeed: cocoon, the
    /// API server and the node's mounts can recover; a pod that is gone or
    /// whose annotations do not parse cannot.
    pub fn is_retryable(&self) -> bool {
        match self {
            HostError::Cocoon { .. }
            | HostError::Probe { .. }
            | HostError::Plugins { .. }
            | HostError::PluginCode { .. } => true,
            HostError::Pods(PodError::Api { .. }) => true,
            HostError::NotFound { .. }
            | HostError::NoUid { .. }
            | HostError::NoVm { .. }
            | HostError::Facts(_)
            | HostError::Pods(PodError::Refused { .. } | PodError::Gone { .. }) => false,
        }
    }

    /// A short label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            HostError::NotFound { .. } => "not-found",
            HostError::NoUid { .. } => "no-uid",
            HostError::NoVm { .. } => "no-vm",
            HostError::Facts(_) => "facts",
            HostError::Cocoon { .. } => "cocoon",
            HostError::Probe { .. } => "probe",
            HostError::Plugins { .. } | HostError::PluginCode { .. } => "plugins",
            HostError::Pods(PodError::Api { .. }) => "api",
            HostError::Pods(PodError::Refused { .. }) => "api-refused",
            HostError::Pods(PodError::Gone { .. }) => "gone",
        }
    }
}

/// How one call ended, for logs, `run`'s JSON summary and metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub pod: String,
    pub uid: String,
    /// `nothing`, `parked`, `vm-mismatch`, `fixup`, `ip-wait`, `gone` (the
    /// pod was recreated under its name before the work started), or
    /// `shutdown` (the host shut down while the call waited for its turn).
    pub action: &'static str,
    /// Why nothing was done (`action` = `nothing`): `stack-owns`,
    /// `hibernate-requested`, `deleting`, `not-managed`, `not-cloned`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hands_off: Option<&'static str>,
    /// Why the VM is not this pod's (`action` = `vm-mismatch`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mismatch: Option<String>,
    /// The classification rule (1..=7); 0 when the VM was not classified.
    pub rule: u8,
    /// The scenario, or `none`.
    pub scenario: &'static str,
    /// `done`, `exhausted`, `plan-failed`, `shutdown` or `gone`; absent
    /// when no fixup ran.
    pub fixup: Option<&'static str>,
    pub attempts: u32,
    /// `ready`, `timed-out`, `shutdown` or `gone` (deleted, replaced, or
    /// taken over by the stack); absent when no IP wait ran.
    pub readiness: Option<&'static str>,
    pub ip: Option<String>,
    /// The error chain of a failed fixup.
    pub errors: Vec<String>,
}

impl Summary {
    fn new(pod: String, uid: String) -> Self {
        Summary {
            pod,
            uid,
            action: "nothing",
            hands_off: None,
            mismatch: None,
            rule: 0,
            scenario: "none",
            fixup: None,
            attempts: 0,
            readiness: None,
            ip: None,
            errors: Vec::new(),
        }
    }

    /// Ready intent published.
    pub fn is_ready(&self) -> bool {
        self.readiness == Some("ready")
    }

    /// Record an action that ends the call before any work.
    fn stop(mut self, action: Action) -> Self {
        match action {
            Action::Nothing(why) => {
                self.hands_off = Some(why.as_str());
                self.rule = match why {
                    HandsOff::NotManaged => Rule::NotManaged.number(),
                    HandsOff::NotCloned => Rule::NotCloned.number(),
                    _ => 0,
                };
            }
            Action::Parked => self.action = "parked",
            Action::RunLoop | Action::IpWaitOnly => {}
        }
        self
    }
}

/// One plugin's part in planning a fixup, for [`FixupRecord`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginUse {
    pub name: String,
    pub sha256: String,
    /// `None` when a plan failed and the plugin's error does not name the
    /// scenario.
    pub scenario: Option<Scenario>,
    /// Whether the plugin made its plan: false for a plugin that
    /// misbehaved (a trap, a breach, `unsupported`), whether the pod then
    /// failed or the built-in took its place.
    pub succeeded: bool,
}

impl PluginUse {
    /// The plugins of a plan: a plugin the built-in replaced failed, the
    /// others made their plans.
    fn of_parts(parts: &[PlanPart]) -> Vec<PluginUse> {
        let mut uses = Vec::new();
        for part in parts {
            let scenario = Some(part.selection.scenario);
            if let Some(fallback) = &part.fallback {
                uses.push(PluginUse {
                    name: fallback.failed.info.name.clone(),
                    sha256: fallback.failed.sha256.clone(),
                    scenario,
                    succeeded: false,
                });
            }
            let plugin = &part.selection.plugin;
            uses.push(PluginUse {
                name: plugin.info.name.clone(),
                sha256: plugin.sha256.clone(),
                scenario,
                succeeded: true,
            });
        }
        uses
    }
}

/// How the plugins did in planning one pod's fixup: reported to whoever
/// watches ([`Host::report_outcomes_to`]; a reload watches a new plugin
/// version's first pods and rolls back a version that fails where its
/// predecessor succeeded). A plugin's failure is its own misbehaviour only:
/// what the guest then does with the plan (an exhausted fixup) is not
/// counted against the plugin, since a pod's owner controls the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixupRecord {
    /// The pod's uid.
    pub pod: String,
    pub plugins: Vec<PluginUse>,
}

impl FixupRecord {
    /// A plan that failed because a plugin file misbehaved (trap, limit,
    /// policy, `unsupported`): that plugin failed. Other plan errors (bad
    /// facts, no plugin) are no plugin's failure and are not reported.
    fn plan_failed(pod: &str, planner: &Planner, error: &PlannerError) -> Option<Self> {
        let PlannerError::Plugin(e) = error else {
            return None;
        };
        let name = e.misbehaving_plugin()?;
        let plugin = planner
            .plugins()
            .registry()
            .plugins()
            .iter()
            .find(|p| p.info.name == name)?;
        let scenario = match e {
            fixup_core::plugin::PluginError::Unsupported { scenario, .. } => Some(*scenario),
            _ => None,
        };
        Some(FixupRecord {
            pod: pod.to_owned(),
            plugins: vec![PluginUse {
                name: name.to_owned(),
                sha256: plugin.sha256.clone(),
                scenario,
                succeeded: false,
            }],
        })
    }
}

/// What follows a fixup that succeeded.
enum AfterFixup {
    /// The IP wait, on these facts.
    Wait(VmFacts),
    /// Nothing: the IP wait needed no waiting and its outcome was written
    /// with `done`.
    Published(ReadyOutcome),
}

/// Log, at debug level (the pod's owner chooses the annotation's text),
/// each part of a plan that the generic plugin planned although the VM
/// names a flavour, when some loaded plugin declares flavours for that
/// part's scenario: only there could a misspelt or unserved flavour have
/// changed the plan (the `fc-mac` part of a Firecracker clone whose
/// flavour plugin serves only network scenarios is not noted).
fn flavor_notes(pod: &PodRef, planner: &Planner, parts: &[PlanPart]) {
    for part in parts {
        if !planner.declares_flavors(part.selection.scenario) {
            continue;
        }
        if let Some(note) = part.unmatched_flavor() {
            tracing::debug!(pod = %pod, "{}", escape_controls(&note));
        }
    }
}

/// The host: planner, cocoon runner, Kubernetes side, lease watcher.
///
/// Planning is synchronous (the plugin engine, the disk probe) and a plugin
/// call may take up to its deadline (1 s by default, `--plugin-deadline`),
/// so it never runs on the async workers: [`Host::handle`] hands it to
/// tokio's blocking pool, at most [`PluginHost::slots`] calls at once (the
/// engine's instance slots), and the watch, the metrics listener and the
/// other pods' loops go on meanwhile.
///
/// [`PluginHost::slots`]: fixup_core::plugin::PluginHost::slots
#[derive(Debug)]
pub struct Host<C, P> {
    /// The planner in service; a reload swaps it ([`Host::swap_planner`]).
    /// Each call plans with the planner in service when it plans.
    planner: std::sync::RwLock<Arc<Planner>>,
    /// Where each fixup's outcome is reported, when someone watches
    /// ([`Host::report_outcomes_to`]).
    outcomes: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<FixupRecord>>,
    /// Permits for planning on the blocking pool, one per engine slot.
    planning: Arc<Semaphore>,
    /// Permits for pods being worked on ([`HostConfig::fixups_in_flight`]).
    admission: Arc<Semaphore>,
    cocoon: C,
    pods: P,
    leases: Arc<LeaseWatcher>,
    config: HostConfig,
    metrics: Arc<Metrics>,
}

impl<C: Cocoon, P: PodApi> Host<C, P> {
    pub fn new(
        planner: Arc<Planner>,
        cocoon: C,
        pods: P,
        leases: Arc<LeaseWatcher>,
        config: HostConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        let slots = usize::try_from(planner.plugins().slots()).unwrap_or(usize::MAX);
        Host {
            planning: Arc::new(Semaphore::new(slots.clamp(1, Semaphore::MAX_PERMITS))),
            admission: Arc::new(Semaphore::new(
                config.fixups_in_flight.clamp(1, Semaphore::MAX_PERMITS),
            )),
            planner: std::sync::RwLock::new(planner),
            outcomes: std::sync::OnceLock::new(),
            cocoon,
            pods,
            leases,
            config,
            metrics,
        }
    }

    pub fn pods(&self) -> &P {
        &self.pods
    }

    /// The planner in service now.
    pub fn planner(&self) -> Arc<Planner> {
        self.planner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Put `planner` in service and return the one it replaces. Calls that
    /// already planned keep their plan; the next plan is `planner`'s.
    pub fn swap_planner(&self, planner: Arc<Planner>) -> Arc<Planner> {
        let mut serving = self
            .planner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        std::mem::replace(&mut *serving, planner)
    }

    /// Report every fixup's outcome ([`FixupRecord`]) to `sender` from now
    /// on; the first caller wins. A closed receiver is ignored.
    pub fn report_outcomes_to(
        &self,
        sender: tokio::sync::mpsc::UnboundedSender<FixupRecord>,
    ) -> bool {
        self.outcomes.set(sender).is_ok()
    }

    fn record(&self, record: FixupRecord) {
        if let Some(sender) = self.outcomes.get() {
            let _ = sender.send(record);
        }
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// A shared handle on the metrics, for the metrics server.
    pub fn metrics_handle(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Take one pod as far as it can go now.
    pub async fn handle(
        &self,
        namespace: &str,
        name: &str,
        trigger: Trigger,
        shutdown: &CancellationToken,
    ) -> Result<Summary, HostError> {
        let pod = self.read(namespace, name).await?;
        self.handle_pod(&pod, trigger, shutdown).await
    }

    /// Wait for a turn among [`HostConfig::fixups_in_flight`]; none when
    /// the host shuts down meanwhile.
    async fn admit(&self, shutdown: &CancellationToken) -> Option<SemaphorePermit<'_>> {
        tokio::select! {
            turn = self.admission.acquire() => turn.ok(),
            () = shutdown.cancelled() => None,
        }
    }

    /// As [`handle`](Self::handle), for one incarnation of the pod: when
    /// the pod by that name now has another uid (it was deleted and
    /// recreated), nothing is done for it here and the summary's action is
    /// `gone`. The daemon uses this, so that work started for one
    /// incarnation never runs for the next.
    pub async fn handle_uid(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        trigger: Trigger,
        shutdown: &CancellationToken,
    ) -> Result<Summary, HostError> {
        let pod = self.read(namespace, name).await?;
        if pod.uid.as_deref() != Some(uid) {
            let mut summary = Summary::new(pod.display_name(), uid.to_owned());
            summary.action = "gone";
            return Ok(summary);
        }
        self.handle_pod(&pod, trigger, shutdown).await
    }

    /// The pod as it is now.
    async fn read(&self, namespace: &str, name: &str) -> Result<PodInput, HostError> {
        self.pods
            .get(namespace, name)
            .await?
            .ok_or_else(|| HostError::NotFound {
                pod: format!("{namespace}/{name}"),
            })
    }

    /// As [`handle`](Self::handle), for a pod the caller already read.
    ///
    /// The steps, each of which may end the call:
    ///
    /// 1. the rows of spec section 8 that need only the pod
    ///    ([`lifecycle::gate`]): hands-off, deleting, unmanaged, not
    ///    cloned, parked. Nothing is asked of cocoon, nothing written.
    /// 2. one `cocoon vm inspect` of the VM the annotations point at, and
    ///    the binding of spec section 2 ([`binding::bind`]): a VM that is
    ///    not this pod's gets nothing but a `PostCloneVMMismatch` event.
    /// 3. classification and the rest of the table ([`lifecycle::decide`]).
    /// 4. the fixup loop, then the IP wait; each final write reads the pod
    ///    again and is skipped when the table says the host is done.
    ///
    /// At most [`HostConfig::fixups_in_flight`] calls are past step 1 and
    /// not yet through step 4's fixup loop at once; the others wait after
    /// step 1 (a pod step 1 turns away never waits), and a call still
    /// waiting when `shutdown` is cancelled ends with action `shutdown`,
    /// having done nothing.
    pub async fn handle_pod(
        &self,
        pod: &PodInput,
        trigger: Trigger,
        shutdown: &CancellationToken,
    ) -> Result<Summary, HostError> {
        let label = pod.display_name();
        let uid = pod
            .uid
            .clone()
            .filter(|u| !u.is_empty())
            .ok_or_else(|| HostError::NoUid { pod: label.clone() })?;
        let mut summary = Summary::new(label, uid);
        let marker = match lifecycle::gate(pod) {
            Ok(marker) => marker,
            Err(action) => return Ok(summary.stop(action)),
        };
        let Some(turn) = self.admit(shutdown).await else {
            summary.action = "shutdown";
            return Ok(summary);
        };
        // On the heap: a call waiting for its turn holds almost nothing.
        Box::pin(self.handle_admitted(pod, trigger, shutdown, marker, summary, turn)).await
    }

    async fn handle_admitted(
        &self,
        pod: &PodInput,
        trigger: Trigger,
        shutdown: &CancellationToken,
        marker: Option<PostCloneState>,
        mut summary: Summary,
        turn: SemaphorePermit<'_>,
    ) -> Result<Summary, HostError> {
        let label = summary.pod.clone();
        let pod_ref = PodRef {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: summary.uid.clone(),
        };
        let record = match self.inspect(pod, &label).await? {
            Ok(record) => record,
            Err(mismatch) => return Ok(self.mismatch(&pod_ref, mismatch, summary).await),
        };
        let annotated_id = pod.annotation(annotations::VM_ID);
        if !record.id.is_empty() && !annotated_id.is_empty() && record.id != annotated_id {
            let mismatch = binding::Mismatch::IdDisagrees {
                annotation: annotated_id.to_owned(),
                record: record.id.clone(),
            };
            return Ok(self.mismatch(&pod_ref, mismatch, summary).await);
        }
        if let Verdict::Mismatch(mismatch) = binding::bind(pod, &record.name, self.config.binding) {
            return Ok(self.mismatch(&pod_ref, mismatch, summary).await);
        }
        // Work resumed after a restart does not know its source image: the
        // disk probe decides (spec section 8).
        let overrides = Overrides {
            boot: (marker == Some(PostCloneState::Running)).then_some(BootKind::Resumed),
            source_image: None,
        };
        let obs = Observation::new(pod, &record, &overrides)?;
        let vm = VmId::parse(&obs.vm_id)?;
        let decision = classify::classify(&obs);
        summary.rule = decision.rule.number();
        let action = lifecycle::decide(pod, decision.needs_fixup());
        if trigger == Trigger::Startup
            && let Some(op) = action.op()
        {
            self.metrics.resumed(op);
            self.emit(
                &pod_ref,
                Event::normal(reasons::RESUMED_AFTER_RESTART, messages::resumed(op)),
            )
            .await;
        }
        let wait_facts = match action {
            Action::Nothing(_) | Action::Parked => return Ok(summary.stop(action)),
            Action::RunLoop => {
                summary.action = "fixup";
                match self
                    .fixup(pod, &pod_ref, &vm, &obs, trigger, &mut summary, shutdown)
                    .await?
                {
                    Some(AfterFixup::Wait(facts)) => WaitFacts::from_facts(&facts),
                    Some(AfterFixup::Published(ready)) => return Ok(self.readiness(summary, ready)),
                    None => return Ok(summary),
                }
            }
            Action::IpWaitOnly => {
                summary.action = "ip-wait";
                match WaitFacts::validate(&obs) {
                    Ok(facts) => facts,
                    Err(e) => {
                        let e = PlannerError::Facts(e);
                        return self.plan_failed(&pod_ref, &vm, summary, &e).await;
                    }
                }
            }
        };
        // An IP wait may take minutes: it does not hold a turn.
        drop(turn);
        // The DHCP safety net: a Linux clone that needed no fixup.
        let recovery = if action == Action::IpWaitOnly
            && decision.rule == Rule::AllDhcp
            && obs.os == GuestOs::Linux
        {
            self.recovery_plan(&pod_ref, &obs).await
        } else {
            None
        };
        let ready = apply::wait_ready(
            &self.cocoon,
            &self.pods,
            &self.leases,
            &pod_ref,
            &wait_facts,
            recovery.as_ref(),
            &self.config.ready,
            shutdown,
        )
        .await?;
        Ok(self.readiness(summary, ready))
    }

    /// The summary with how the IP wait ended, counted.
    fn readiness(&self, mut summary: Summary, ready: ReadyOutcome) -> Summary {
        let (readiness, ip) = match ready {
            ReadyOutcome::Ready { ip } => ("ready", Some(ip.to_string())),
            ReadyOutcome::TimedOut => ("timed-out", None),
            ReadyOutcome::Shutdown => ("shutdown", None),
            ReadyOutcome::Gone => ("gone", None),
        };
        self.metrics.ip_wait(readiness);
        summary.readiness = Some(readiness);
        summary.ip = ip;
        summary
    }

    /// Plan and run the fixup loop. `Ok(Some)` when it succeeded: the IP
    /// wait follows, or (a static first NIC) its outcome was written with
    /// `done`; `Ok(None)` when the call ends here (the summary says how).
    /// `seen` is the pod as read before the VM was inspected.
    #[allow(clippy::too_many_arguments)]
    async fn fixup(
        &self,
        seen: &PodInput,
        pod: &PodRef,
        vm: &VmId,
        obs: &Observation,
        trigger: Trigger,
        summary: &mut Summary,
        shutdown: &CancellationToken,
    ) -> Result<Option<AfterFixup>, HostError> {
        let planner = self.planner();
        let outcome = match self
            .plan_off_workers(planner.clone(), {
                let obs = obs.clone();
                move |planner| planner.plan(&obs)
            })
            .await
        {
            Ok(o) => o,
            Err(PlannerError::Probe(source)) => {
                let error = HostError::Probe {
                    pod: pod.to_string(),
                    source,
                };
                return Err(self.node_error(pod, trigger, error).await);
            }
            Err(PlannerError::NoPlugin(source)) if source.is_node_config() => {
                let error = HostError::Plugins {
                    pod: pod.to_string(),
                    source,
                };
                return Err(self.node_error(pod, trigger, error).await);
            }
            Err(PlannerError::Plugin(source)) if source.is_node_config() => {
                let error = HostError::PluginCode {
                    pod: pod.to_string(),
                    source,
                };
                return Err(self.node_error(pod, trigger, error).await);
            }
            Err(e) => {
                self.metrics.plan_error(&e);
                if let Some(record) = FixupRecord::plan_failed(&pod.uid, &planner, &e) {
                    self.record(record);
                }
                *summary = self.plan_failed(pod, vm, summary.clone(), &e).await?;
                return Ok(None);
            }
        };
        self.metrics.plugin_calls(&outcome);
        let scenario = outcome.scenario.unwrap_or(Scenario::OciNetworkd);
        summary.scenario = scenario.as_str();
        let composed = outcome
            .composed
            .expect("a decision that needs a fixup has a plan");
        self.fallbacks(pod, &composed.parts).await;
        // Once per plan, not per attempt: the retry loop below reuses it.
        flavor_notes(pod, &planner, &composed.parts);
        if self.outcomes.get().is_some() {
            self.record(FixupRecord {
                pod: pod.uid.clone(),
                plugins: PluginUse::of_parts(&composed.parts),
            });
        }
        // The hint is written only after the budget is spent, and only if
        // it fits then; say now that it would not.
        if let Err(e) =
            apply::check_hint_room(&obs.annotations, &composed.hint, &composed.plugins())
        {
            tracing::warn!(pod = %pod, error = %e, "the hint may not be stored");
        }
        // Keep what the loop uses, for as long as it runs: the hint is made
        // again from the script if the budget runs out, and the plugins'
        // call records are done with.
        let ComposedPlan {
            facts,
            plan,
            exec,
            script,
            ..
        } = composed;
        let ready_ip = match WaitFacts::from_facts(&facts).first {
            Some(WaitNic::Static(ip)) => Some(ip),
            _ => None,
        };
        let job = FixupJob {
            pod,
            seen,
            ready_ip,
            vm: &facts.id,
            scenario,
            plan: &plan,
            exec: &exec,
            script: &script,
        };
        let result =
            apply::run_fixup(&self.cocoon, &self.pods, job, &self.config.retry, shutdown).await?;
        let (label, attempts) = match result {
            FixupOutcome::Done { attempts, ready } => {
                summary.fixup = Some("done");
                summary.attempts = attempts;
                self.metrics.fixup(scenario, "done", attempts);
                return Ok(Some(match ready {
                    Some(ready) => AfterFixup::Published(ready),
                    None => AfterFixup::Wait(facts),
                }));
            }
            FixupOutcome::Exhausted { attempts, errors } => {
                summary.errors = errors;
                ("exhausted", attempts)
            }
            FixupOutcome::Shutdown { attempts } => ("shutdown", attempts),
            FixupOutcome::Gone { attempts } => ("gone", attempts),
        };
        summary.fixup = Some(label);
        summary.attempts = attempts;
        if label == "exhausted" {
            self.metrics.fixup(scenario, label, attempts);
        }
        Ok(None)
    }

    /// The DHCP recovery plan for an all-DHCP Linux clone, when one can be
    /// made; a clone whose facts do not validate for a plan simply waits
    /// without it.
    async fn recovery_plan(&self, pod: &PodRef, obs: &Observation) -> Option<DhcpRecovery> {
        let obs = obs.clone();
        let planner = self.planner();
        let planned = self
            .plan_off_workers(planner.clone(), move |planner| {
                VmFacts::validate(&obs, ImageKind::Unknown)
                    .map_err(PlannerError::from)
                    .and_then(|facts| planner.plan_scenarios(&facts, &[Scenario::DhcpRecovery]))
            })
            .await;
        match planned {
            Ok(c) => Some({
                self.fallbacks(pod, &c.parts).await;
                flavor_notes(pod, &planner, &c.parts);
                DhcpRecovery {
                    nics: c.facts.nics.len(),
                    plan: c.plan,
                    exec: c.exec,
                }
            }),
            Err(e) => {
                tracing::warn!(pod = %pod, "no DHCP recovery plan: {e}");
                None
            }
        }
    }

    /// Tell of every plugin in `parts` that failed and was replaced by the
    /// built-in (failure policy `fallback`): a log line, the metric, and a
    /// Warning event on the pod naming both plugins.
    async fn fallbacks(&self, pod: &PodRef, parts: &[PlanPart]) {
        for part in parts {
            let Some(fallback) = &part.fallback else {
                continue;
            };
            let message = fallback.message(part.selection.scenario, &part.selection.plugin);
            tracing::warn!(pod = %pod, "{}", escape_controls(&message));
            self.metrics.plugin_fallback(fallback);
            self.emit(pod, Event::warning(reasons::PLUGIN_FALLBACK, message))
                .await;
        }
    }

    /// Run `plan` on tokio's blocking pool once one of the engine's slots
    /// is free (see [`Host`]): the caller's task waits without holding an
    /// async worker.
    async fn plan_off_workers<T: Send + 'static>(
        &self,
        planner: Arc<Planner>,
        plan: impl FnOnce(&Planner) -> T + Send + 'static,
    ) -> T {
        let permit = self
            .planning
            .clone()
            .acquire_owned()
            .await
            .expect("the planning semaphore is never closed");
        let task = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            plan(&planner)
        });
        match task.await {
            Ok(value) => value,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Only a runtime shutting down cancels a blocking task, and it
            // drops this task with it.
            Err(e) => panic!("planning was cancelled: {e}"),
        }
    }

    /// Look up the VM the annotations point at. The id annotation (else the
    /// name annotation) is only where to look: [`binding::bind`] decides
    /// whether the record found is the pod's.
    ///
    /// An annotation that is no VM id or name is a mismatch (`Ok(Err)`):
    /// nothing can be looked up, and the pod's owner is told so.
    async fn inspect(
        &self,
        pod: &PodInput,
        label: &str,
    ) -> Result<Result<VmInspect, binding::Mismatch>, HostError> {
        let reference = match pod.annotation(annotations::VM_ID) {
            "" => pod.annotation(annotations::VM_NAME),
            id => id,
        };
        if reference.is_empty() {
            return Err(HostError::NoVm {
                pod: label.to_owned(),
            });
        }
        let Ok(vm) = VmId::parse(reference) else {
            return Ok(Err(binding::Mismatch::BadReference {
                reference: reference.to_owned(),
            }));
        };
        self.cocoon
            .inspect(&vm, self.config.inspect_timeout)
            .await
            .map(Ok)
            .map_err(|source| HostError::Cocoon {
                pod: label.to_owned(),
                source,
            })
    }

    /// The VM is not this pod's: nothing runs, nothing is written; a
    /// Warning event on the pod that asked, and a log line with both names.
    /// The event never names the other VM (its record's name or id): a
    /// pod's events must not tell its owner which VMs exist on the node.
    async fn mismatch(
        &self,
        pod: &PodRef,
        mismatch: binding::Mismatch,
        mut summary: Summary,
    ) -> Summary {
        let expected = binding::vm_name_for_pod(&pod.namespace, &pod.name);
        tracing::warn!(
            pod = %pod,
            expected = %escape_controls(&expected),
            "VM not used, nothing run: {mismatch}"
        );
        let told = messages::vm_mismatch(&mismatch, &pod.namespace, &pod.name);
        self.metrics.vm_mismatch();
        self.emit(pod, Event::warning(reasons::VM_MISMATCH, told))
            .await;
        summary.action = "vm-mismatch";
        summary.mismatch = Some(mismatch.to_string());
        summary
    }

    /// The node is set up wrong (the cocoon root cannot be probed, the
    /// plugin directory leaves the pod without a plugin): reported (a
    /// Warning event, once per pod and not on every retry; a metric; an
    /// error log) and returned for a retry. The pod is not failed.
    async fn node_error(&self, pod: &PodRef, trigger: Trigger, error: HostError) -> HostError {
        let fix = match error {
            HostError::Plugins { .. } => {
                "the fixup waits: fix the node's plugin directory, then restart cocoon-fixup"
            }
            HostError::PluginCode { .. } => "the fixup waits until the node's cache is fixed",
            _ => "the fixup waits, and is tried again, until the node is fixed",
        };
        let message = format!("{error}; {fix}");
        tracing::error!(pod = %pod, "{message}");
        self.metrics.node_error(error.kind());
        if trigger != Trigger::Retry {
            self.emit(pod, Event::warning(reasons::NODE_ERROR, message))
                .await;
        }
        error
    }

    /// No plan could be made (bad facts, no plugin, a plugin failure, a
    /// hint the pod's annotations could not hold): a retry cannot help, so
    /// the pod is marked failed like an exhausted fixup, without a hint,
    /// after reading it once more.
    async fn plan_failed(
        &self,
        pod: &PodRef,
        vm: &VmId,
        mut summary: Summary,
        error: &(dyn std::error::Error + Send + Sync),
    ) -> Result<Summary, HostError> {
        summary.fixup = Some("plan-failed");
        let line = messages::plan_failed(&error.to_string());
        summary.errors = vec![line.clone()];
        let Some(current) = apply::read_now(&self.pods, pod).await? else {
            summary.fixup = Some("gone");
            return Ok(summary);
        };
        let decided = apply::write_decided(&self.pods, pod, current, |current| {
            apply::still_ours(current, pod, vm)
                .then(|| plan_failed_record(&current.annotations, &line))
        })
        .await;
        let event = Event::warning(reasons::PLAN_FAILED, line);
        match decided {
            Ok(Decided::Written { .. }) => {}
            Ok(Decided::Skipped(_) | Decided::Gone) => {
                summary.fixup = Some("gone");
                return Ok(summary);
            }
            // Told even when the record cannot be written.
            Ok(Decided::Unsettled(_)) => {
                self.emit(pod, event).await;
                return Err(apply::unsettled(pod).into());
            }
            Err(e) => {
                self.emit(pod, event).await;
                return Err(e.into());
            }
        }
        self.emit(pod, event).await;
        Ok(summary)
    }

    async fn emit(&self, pod: &PodRef, event: Event) {
        if let Err(e) = self.pods.event(pod, &event).await {
            tracing::warn!(pod = %pod, reason = event.reason, "cannot record event: {e}");
        }
    }
}
