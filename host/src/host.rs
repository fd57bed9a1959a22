//! [`Host`]: what an embedding daemon builds once and calls per pod.
//!
//! One call, [`Host::handle`], takes a pod from its annotations to a ready
//! intent (or a clear failure): read the pod, decide from its annotations
//! whether the host has any business with it (spec section 8), inspect its
//! VM and prove the VM is the pod's own (spec section 2), classify, run the
//! fixup loop, wait for the IP. The cocoon CLI
//! and the Kubernetes side are traits ([`Cocoon`], [`PodApi`]), so an
//! embedder can supply its own.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fixup_core::binding::BindingPolicy;
use fixup_core::classify::Scenario;
use fixup_core::decision::{
    Action, Handled, PodTask, PrepareTask, ReadyConfig, RetryConfig, Settings, Stop, Summary,
    Trigger, WakeConfig, os_nonces,
};
use fixup_core::facts::PodInput;
use fixup_core::memory::{MemoryStore, PodMemory};
use fixup_core::planner::{PlanPart, Planner, PlannerError};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::apply::{Executor, HostParts};
use crate::cocoon::Cocoon;
use crate::console::{Console, SerialConsoles};
use crate::metrics::Metrics;
use crate::node_pods::OtherPods;
use crate::pods::PodApi;
use crate::ready::{LeaseWatcher, WallClock};

/// Timeouts, budgets and policies of the apply path, resolved once from
/// the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    pub retry: RetryConfig,
    pub ready: ReadyConfig,
    /// How a hibernate wake is recognised (spec section 2).
    pub wake: WakeConfig,
    /// Timeout for `cocoon vm inspect` (default 10 s, `--inspect-timeout`).
    pub inspect_timeout: Duration,
    /// The serial-console pass's total deadline (default 120 s,
    /// `--sac-deadline`).
    pub sac_deadline: Duration,
    /// Which VM names bind a VM to its pod (spec section 2).
    pub binding: BindingPolicy,
    /// Pods holding a turn at once (the decision's admit to its release:
    /// the inspect, the plan, the fixup loop; the wake grace, the
    /// serial-console pass and the IP wait do not count): more calls wait
    /// their turn after the gate, holding their read and little else; a pod
    /// the gate turns away never waits. Default [`DEFAULT_FIXUPS_IN_FLIGHT`].
    pub fixups_in_flight: usize,
}

/// Pods past the lifecycle gate and not yet through their fixup loop, at
/// once, by default. A storm of clones is read, planned and written a few
/// hundred at a time, so the host does not hold every plan at once while
/// they all wait for the API server; the rest wait at the door. See
/// BENCHMARKS.md (Findings, the clone storm of 10,000).
pub const DEFAULT_FIXUPS_IN_FLIGHT: usize = 256;

impl HostConfig {
    /// The settings of the decision ([`fixup_core::decision::SettingsBuilder`]
    /// makes them, for the config file and the CLI as for the C library),
    /// and how many pods are worked on at once.
    pub fn from_settings(settings: Settings, fixups_in_flight: usize) -> Self {
        HostConfig {
            retry: settings.retry,
            ready: settings.ready,
            wake: settings.wake,
            inspect_timeout: settings.inspect_timeout,
            sac_deadline: settings.sac_deadline,
            binding: settings.binding,
            fixups_in_flight,
        }
    }

    /// What the decision for each pod reads.
    pub fn settings(&self) -> Settings {
        Settings {
            retry: self.retry.clone(),
            ready: self.ready.clone(),
            wake: self.wake.clone(),
            inspect_timeout: self.inspect_timeout,
            sac_deadline: self.sac_deadline,
            binding: self.binding,
            lifecycle_intents: false,
        }
    }
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            retry: RetryConfig::default(),
            ready: ReadyConfig::default(),
            wake: WakeConfig::default(),
            inspect_timeout: Duration::from_secs(10),
            sac_deadline: fixup_core::decision::DEFAULT_SAC_DEADLINE,
            binding: BindingPolicy::default(),
            fixups_in_flight: DEFAULT_FIXUPS_IN_FLIGHT,
        }
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
    pub(crate) fn of_parts(parts: &[PlanPart]) -> Vec<PluginUse> {
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
    /// The pod's namespace: whose failures they are, for a rollback.
    pub namespace: String,
    pub plugins: Vec<PluginUse>,
}

impl FixupRecord {
    /// A plan that failed because a plugin file misbehaved (trap, limit,
    /// policy, `unsupported`): that plugin failed. Other plan errors (bad
    /// facts, no plugin) are no plugin's failure and are not reported.
    pub(crate) fn plan_failed(
        pod: &str,
        namespace: &str,
        planner: &Planner,
        error: &PlannerError,
    ) -> Option<Self> {
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
            namespace: namespace.to_owned(),
            plugins: vec![PluginUse {
                name: name.to_owned(),
                sha256: plugin.sha256.clone(),
                scenario,
                succeeded: false,
            }],
        })
    }
}

/// The wall clock, behind a `Debug` of its own.
struct Wall(WallClock);

impl std::fmt::Debug for Wall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WallClock")
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
    /// Where the node's other pods come from ([`Host::with_other_pods`]).
    other_pods: OtherPods,
    config: HostConfig,
    metrics: Arc<Metrics>,
    /// The VMs' serial consoles (spec section 10).
    console: Arc<dyn Console>,
    /// The host's records of its pods, when it keeps them
    /// ([`Host::with_records`]).
    records: Option<Arc<MemoryStore>>,
    /// The wall clock a task's record is kept by ([`Host::with_wall_clock`]).
    wall: Wall,
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
        let console = Arc::new(SerialConsoles {
            cocoon_root: planner.cocoon_root().to_owned(),
            budgets: fixup_sac::Budgets::default(),
        });
        Host {
            console,
            planning: Arc::new(Semaphore::new(slots.clamp(1, Semaphore::MAX_PERMITS))),
            admission: Arc::new(Semaphore::new(
                config.fixups_in_flight.clamp(1, Semaphore::MAX_PERMITS),
            )),
            planner: std::sync::RwLock::new(planner),
            outcomes: std::sync::OnceLock::new(),
            cocoon,
            pods,
            leases,
            other_pods: OtherPods::default(),
            config,
            metrics,
            records: None,
            wall: Wall(Arc::new(SystemTime::now)),
        }
    }

    /// Keep a record of each pod in `store` (spec section 2's durable
    /// record): the fixup loop's retry budget lives there, so attempts stop
    /// a budget after the first across task retries and restarts of the
    /// host (spec section 5). Without it each loop's budget starts with
    /// its task.
    pub fn with_records(mut self, store: Arc<MemoryStore>) -> Self {
        self.records = Some(store);
        self
    }

    /// Where the host keeps its pods' records, if it does.
    pub fn records(&self) -> Option<&Arc<MemoryStore>> {
        self.records.as_ref()
    }

    /// Read the wall clock from `clock` (a test's stand-in) for the
    /// records.
    pub fn with_wall_clock(mut self, clock: WallClock) -> Self {
        self.wall = Wall(clock);
        self
    }

    /// Where the host learns the other pods on its node, for the check of
    /// an annotated VM name (`--accept-annotated-vm-names`, spec section
    /// 2). Without it such a name is never proven and nothing runs in its
    /// VM.
    pub fn with_other_pods(mut self, other_pods: OtherPods) -> Self {
        self.other_pods = other_pods;
        self
    }

    /// Where the host learns the other pods on its node.
    pub fn other_pods(&self) -> &OtherPods {
        &self.other_pods
    }

    pub fn pods(&self) -> &P {
        &self.pods
    }

    /// Use `console` for the VMs' serial consoles instead of the sockets
    /// below the planner's cocoon root (a test's stand-in, or other
    /// budgets).
    pub fn with_console(mut self, console: Arc<dyn Console>) -> Self {
        self.console = console;
        self
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
    ) -> Result<Summary, Stop> {
        let pod = self.read(namespace, name).await?;
        self.handle_read(pod, trigger, shutdown).await
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
    ) -> Result<Summary, Stop> {
        let pod = self.read(namespace, name).await?;
        if pod.uid.as_deref() != Some(uid) {
            let mut summary = Summary::new(pod.display_name(), uid.to_owned());
            summary.action = Handled::Gone;
            return Ok(summary);
        }
        self.handle_read(pod, trigger, shutdown).await
    }

    /// The pod as it is now.
    async fn read(&self, namespace: &str, name: &str) -> Result<PodInput, Stop> {
        // On the heap: a call's future is not as large as a request's.
        Box::pin(self.pods.get(namespace, name))
            .await?
            .ok_or_else(|| Stop::NotFound {
                pod: format!("{namespace}/{name}"),
            })
    }

    /// As [`handle`](Self::handle), for a pod the caller already read:
    /// the decision of [`fixup_core::decision::PodTask`] for it, carried
    /// out ([`crate::apply`]).
    ///
    /// In short (the task's docs say it whole): the rows of spec section 8
    /// that need only the pod, without asking cocoon anything; one `cocoon
    /// vm inspect` and the binding of spec section 2 (a VM that is not
    /// this pod's gets nothing but a `PostCloneVMMismatch` event);
    /// classification and the rest of the table; the fixup loop, then the
    /// IP wait, each final write decided from a read of the pod.
    ///
    /// At most [`HostConfig::fixups_in_flight`] calls are past the first
    /// step and not yet through the fixup loop at once; the others wait
    /// (a pod the first step turns away never waits), and a call still
    /// waiting when `shutdown` is cancelled ends with action `shutdown`,
    /// having done nothing.
    pub async fn handle_pod(
        &self,
        pod: &PodInput,
        trigger: Trigger,
        shutdown: &CancellationToken,
    ) -> Result<Summary, Stop> {
        self.handle_read(pod.clone(), trigger, shutdown).await
    }

    /// [`handle_pod`](Self::handle_pod), for a read the call owns. A call
    /// waiting for its turn holds the read and little else: its task is
    /// started again once the turn is given (a task's start decides the
    /// same for the same pod, and never looks at the record), with the
    /// host's record read only then, and the executor, whose future takes
    /// kilobytes, is built on the heap only then. (An `async` block, not
    /// an `async fn`, whose future would hold the read twice.)
    #[allow(clippy::manual_async_fn)]
    fn handle_read<'s>(
        &'s self,
        pod: PodInput,
        trigger: Trigger,
        shutdown: &'s CancellationToken,
    ) -> impl Future<Output = Result<Summary, Stop>> + 's {
        async move {
            let since_epoch = (self.wall.0)()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis();
            let wall = u64::try_from(since_epoch).unwrap_or(u64::MAX);
            let (task, first) = self.start(pod.clone(), trigger, wall, None);
            if !matches!(first, Action::Admit) {
                return Box::pin(self.executor(shutdown).run(task, first)).await;
            }
            drop((task, first));
            // The task's clock runs from before its turn: the wait is on it.
            let origin = tokio::time::Instant::now();
            let turn = tokio::select! {
                permit = self.admission.acquire() => permit.ok(),
                () = shutdown.cancelled() => None,
            };
            // The record is read once the turn is given: a call waiting
            // holds none, and the record is as the last task left it.
            let record = match (&self.records, pod.uid.as_deref()) {
                (Some(store), Some(uid)) => Some(
                    Box::pin(crate::records::recall(
                        store,
                        &self.metrics,
                        &pod.display_name(),
                        uid,
                    ))
                    .await,
                ),
                _ => None,
            };
            let (task, first) = self.start(pod, trigger, wall, record);
            Box::pin(self.executor(shutdown).run_from(task, first, origin, turn)).await
        }
    }

    /// The pod's task, on the wall clock `wall` (milliseconds since the
    /// Unix epoch), which judges the stack's events (none dated after it
    /// counts) and, with the host's `record` of the pod, keeps the retry
    /// budget. (Not inlined in an async caller: a task borrowed there
    /// would take its room in the caller's future across every await.)
    fn start(
        &self,
        pod: PodInput,
        trigger: Trigger,
        wall: u64,
        record: Option<PodMemory>,
    ) -> (PodTask, Action) {
        let (mut task, first) = PodTask::start(pod, trigger, self.config.settings(), os_nonces());
        task.wall_clock(wall);
        if let Some(record) = record {
            task.remember(record, wall);
        }
        (task, first)
    }

    /// Prepare the pod's running VM to be cloned, before the stack
    /// snapshots it: the decision of [`fixup_core::decision::PrepareTask`]
    /// for the pod as it is now, carried out as a fixup is (the VM bound
    /// to the pod, the plan of the plugin that plans its clones' network
    /// scenario, the same exec path, markers and retry budget), ending
    /// with `vm.cocoonstack.io/prepared` on the pod when it took.
    pub async fn prepare(
        &self,
        namespace: &str,
        name: &str,
        shutdown: &CancellationToken,
    ) -> Result<Summary, Stop> {
        let pod = self.read(namespace, name).await?;
        self.prepare_pod(&pod, shutdown).await
    }

    /// As [`prepare`](Self::prepare), for a pod the caller already read.
    pub async fn prepare_pod(
        &self,
        pod: &PodInput,
        shutdown: &CancellationToken,
    ) -> Result<Summary, Stop> {
        let (task, first) = PrepareTask::start(pod.clone(), self.config.settings(), os_nonces());
        Box::pin(self.executor(shutdown).run(task, first)).await
    }

    /// An executor over this host's seams.
    fn executor<'a>(&'a self, shutdown: &'a CancellationToken) -> Executor<'a, C, P> {
        Executor {
            cocoon: &self.cocoon,
            pods: &self.pods,
            host: HostParts {
                console: &self.console,
                planner: &self.planner,
                planning: &self.planning,
                admission: &self.admission,
                outcomes: &self.outcomes,
                metrics: &self.metrics,
                leases: &self.leases,
                other_pods: &self.other_pods,
                records: self.records.as_ref(),
            },
            shutdown,
        }
    }
}
