//! Prometheus metrics (spec section 9): fixups by scenario and result,
//! attempts per fixup, IP wait results, resumed work by op, plugin
//! execution time and fuel, plugin traps, the pod watch's errors and
//! whether it is synced.

use kube::runtime::watcher;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use fixup_core::classify::Scenario;
use fixup_core::decision::{PodError, Stop};
use fixup_core::planner::{Fallback, PlanOutcome, PlannerError};
use fixup_core::plugin::PluginError;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FixupLabels {
    scenario: String,
    result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IpWaitLabels {
    result: String,
    boot: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginLabels {
    plugin: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TrapLabels {
    plugin: String,
    kind: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The host's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    fixups: Family<FixupLabels, Counter>,
    attempts: Histogram,
    ip_waits: Family<IpWaitLabels, Counter>,
    sac_passes: Family<ResultLabels, Counter>,
    resumed: Family<OpLabels, Counter>,
    plugin_seconds: HistogramFamily<PluginLabels>,
    plugin_fuel: HistogramFamily<PluginLabels>,
    plugin_traps: Family<TrapLabels, Counter>,
    plugin_fallbacks: Family<TrapLabels, Counter>,
    plugin_reloads: Family<ResultLabels, Counter>,
    plugin_rollbacks: Family<PluginLabels, Counter>,
    /// What `/healthz` says beyond `ok`: the last plugin reload refused,
    /// or a rollback, until a reload succeeds.
    health: std::sync::Mutex<Option<String>>,
    vm_mismatches: Counter,
    node_errors: Family<KindLabels, Counter>,
    retries: Family<KindLabels, Counter>,
    record_errors: Family<OpLabels, Counter>,
    plugin_load_failures: Counter,
    watch_errors: Family<KindLabels, Counter>,
    watch_synced: Gauge,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

/// The `kind`s of `cocoon_fixup_watch_errors_total`, a closed set, each
/// exported from the start at 0 (so `increase()` sees the first error):
///
/// - `unauthorized`: the API server refused the credential (401), or the
///   client could not get one (a token file it cannot read, a failing
///   exec plugin);
/// - `forbidden`: RBAC refused `list` or `watch` on pods (403);
/// - `gone`: the watch's resource version expired (410); kube-runtime lists
///   the node's pods again. Now and then this is ordinary.
/// - `api`: another error status from the API server (5xx, 429, ...);
/// - `unreachable`: no answer: connection, TLS or transport failure;
/// - `other`: an answer that could not be read, a listing without a
///   resource version.
pub const WATCH_ERROR_KINDS: [&str; 6] = [
    "unauthorized",
    "forbidden",
    "gone",
    "api",
    "unreachable",
    "other",
];

/// The [`WATCH_ERROR_KINDS`] entry of a pod watch error.
fn watch_error_kind(error: &watcher::Error) -> &'static str {
    let status_kind = |code: u16| match code {
        401 => "unauthorized",
        403 => "forbidden",
        410 => "gone",
        _ => "api",
    };
    let client = match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => e,
        watcher::Error::WatchError(status) => return status_kind(status.code),
        watcher::Error::NoResourceVersion => return "other",
    };
    match client {
        kube::Error::Api(status) => status_kind(status.code),
        kube::Error::Auth(_) => "unauthorized",
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            "unreachable"
        }
        _ => "other",
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn seconds_histogram() -> Histogram {
    // 10 us .. ~0.3 s: plugin calls take tens of microseconds.
    Histogram::new(exponential_buckets(1e-5, 3.0, 10))
}

fn fuel_histogram() -> Histogram {
    // 1e3 .. ~2.6e8: the default limit is 2.5e8.
    Histogram::new(exponential_buckets(1e3, 4.0, 14))
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("cocoon_fixup");
        let fixups = Family::<FixupLabels, Counter>::default();
        registry.register(
            "fixups",
            "Fixup loops that ended, by scenario and result",
            fixups.clone(),
        );
        let attempts = Histogram::new([1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 40.0, 60.0]);
        registry.register(
            "fixup_attempts",
            "Attempts per finished fixup loop",
            attempts.clone(),
        );
        let ip_waits = Family::<IpWaitLabels, Counter>::default();
        registry.register(
            "ip_waits",
            "IP waits by result and boot (clone or wake)",
            ip_waits.clone(),
        );
        let sac_passes = Family::<ResultLabels, Counter>::default();
        registry.register(
            "sac_passes",
            "Windows static-IP passes over the serial console by result",
            sac_passes.clone(),
        );
        let resumed = Family::<OpLabels, Counter>::default();
        registry.register(
            "resumed",
            "Work resumed after a restart, by op",
            resumed.clone(),
        );
        let plugin_seconds: HistogramFamily<PluginLabels> =
            Family::new_with_constructor(seconds_histogram);
        registry.register(
            "plugin_call_seconds",
            "Plugin plan call time, including instantiation",
            plugin_seconds.clone(),
        );
        let plugin_fuel: HistogramFamily<PluginLabels> =
            Family::new_with_constructor(fuel_histogram);
        registry.register(
            "plugin_fuel",
            "Fuel used per plugin plan call",
            plugin_fuel.clone(),
        );
        let plugin_traps = Family::<TrapLabels, Counter>::default();
        registry.register(
            "plugin_traps",
            "Plugin calls that trapped or broke a limit, by kind",
            plugin_traps.clone(),
        );
        let plugin_fallbacks = Family::<TrapLabels, Counter>::default();
        registry.register(
            "plugin_fallbacks",
            "Plugin calls that failed and were replaced by the built-in (failure policy `fallback`), by the failed plugin and kind",
            plugin_fallbacks.clone(),
        );
        let plugin_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "plugin_reload",
            "Plugin set reloads by `serve`, by result (swapped, rejected)",
            plugin_reloads.clone(),
        );
        let plugin_rollbacks = Family::<PluginLabels, Counter>::default();
        registry.register(
            "plugin_rollbacks",
            "New plugin versions rolled back after failing where the version they replaced succeeded",
            plugin_rollbacks.clone(),
        );
        let vm_mismatches = Counter::default();
        registry.register(
            "vm_mismatches",
            "Pods whose annotations pointed at a VM that is not theirs (nothing was run)",
            vm_mismatches.clone(),
        );
        let node_errors = Family::<KindLabels, Counter>::default();
        registry.register(
            "node_errors",
            "Node configuration errors met while handling a pod (retried), by kind",
            node_errors.clone(),
        );
        let retries = Family::<KindLabels, Counter>::default();
        registry.register(
            "retries",
            "Pods handled again after a failure before the fixup loop, by the failure's kind",
            retries.clone(),
        );
        let record_errors = Family::<OpLabels, Counter>::default();
        registry.register(
            "record_errors",
            "Reads and writes of the pods' records in the state directory that failed or took too long, by op (recall, keep, observe; dropped: an observation left out because the state directory was too far behind); the work goes on without them",
            record_errors.clone(),
        );
        let plugin_load_failures = Counter::default();
        registry.register(
            "plugin_load_failures",
            "Plugin files that could not be loaded at start",
            plugin_load_failures.clone(),
        );
        let watch_errors = Family::<KindLabels, Counter>::default();
        registry.register(
            "watch_errors",
            "Errors of the watch of the node's pods, each retried after kube-runtime's default backoff (0.8 s doubling to 30 s, plus up to as much again of jitter), by kind: unauthorized (401, or no credential), forbidden (403), gone (410: the watch lists again), api (another API error), unreachable (no answer), other",
            watch_errors.clone(),
        );
        for kind in WATCH_ERROR_KINDS {
            drop(watch_errors.get_or_create(&KindLabels {
                kind: kind.to_owned(),
            }));
        }
        let watch_synced = Gauge::default();
        registry.register(
            "watch_synced",
            "1 while the watch of the node's pods has a complete listing and is streaming; 0 from the start until the first listing is complete, while the pods are listed again, and after a watch error until the watch has listed again, delivered an event, or gone 2 minutes without another error",
            watch_synced.clone(),
        );
        Metrics {
            registry,
            vm_mismatches,
            node_errors,
            retries,
            record_errors,
            plugin_load_failures,
            watch_errors,
            watch_synced,
            fixups,
            attempts,
            ip_waits,
            sac_passes,
            resumed,
            plugin_seconds,
            plugin_fuel,
            plugin_traps,
            plugin_fallbacks,
            plugin_reloads,
            plugin_rollbacks,
            health: std::sync::Mutex::new(None),
        }
    }

    /// Count a plugin reload: `swapped` or `rejected`.
    pub fn plugin_reload(&self, result: &str) {
        self.plugin_reloads
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
    }

    /// Count a rollback of plugin `name`.
    pub fn plugin_rollback(&self, name: &str) {
        self.plugin_rollbacks
            .get_or_create(&PluginLabels {
                plugin: name.to_owned(),
            })
            .inc();
    }

    /// Set (or, with `None`, clear) what `/healthz` says beyond `ok`.
    pub fn set_health_detail(&self, detail: Option<String>) {
        *self
            .health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = detail;
    }

    /// `/healthz`'s answer: `ok`, then the detail line if there is one.
    pub fn health(&self) -> String {
        let detail = self
            .health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        match detail {
            Some(detail) => format!("ok\n{}\n", fixup_core::facts::escape_controls(&detail)),
            None => "ok\n".to_owned(),
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    pub fn fixup(&self, scenario: Scenario, result: &str, attempts: u32) {
        self.fixups
            .get_or_create(&FixupLabels {
                scenario: scenario.as_str().to_owned(),
                result: result.to_owned(),
            })
            .inc();
        self.attempts.observe(f64::from(attempts));
    }

    /// An IP wait ended with `result`, for a `boot` of `clone` or `wake`.
    pub fn ip_wait(&self, result: &str, boot: &str) {
        self.ip_waits
            .get_or_create(&IpWaitLabels {
                result: result.to_owned(),
                boot: boot.to_owned(),
            })
            .inc();
    }

    pub fn sac(&self, result: &str) {
        self.sac_passes
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
    }

    pub fn resumed(&self, op: &str) {
        self.resumed
            .get_or_create(&OpLabels { op: op.to_owned() })
            .inc();
    }

    /// A read or write of a pod's record that failed (`recall`, `keep`,
    /// `observe`) or an observation dropped (`dropped`).
    pub fn record_error(&self, op: &str) {
        self.record_errors
            .get_or_create(&OpLabels { op: op.to_owned() })
            .inc();
    }

    pub fn vm_mismatch(&self) {
        self.vm_mismatches.inc();
    }

    pub fn node_error(&self, kind: &str) {
        self.node_errors
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// A pod handled again after `stop`, counted by [`retry_kind`].
    pub fn retry(&self, stop: &Stop) {
        self.retries
            .get_or_create(&KindLabels {
                kind: retry_kind(stop).to_owned(),
            })
            .inc();
    }

    /// Plugin files that failed to load at start.
    pub fn plugin_load_failures(&self, count: usize) {
        self.plugin_load_failures.inc_by(count as u64);
    }

    /// Count an error of the pod watch, by its [`WATCH_ERROR_KINDS`] kind.
    pub fn watch_error(&self, error: &watcher::Error) {
        self.watch_errors
            .get_or_create(&KindLabels {
                kind: watch_error_kind(error).to_owned(),
            })
            .inc();
    }

    /// Whether the pod watch has a complete listing and is streaming
    /// (`serve` decides; see `serve::WatchHealth`).
    pub fn watch_synced(&self, synced: bool) {
        self.watch_synced.set(i64::from(synced));
    }

    /// Record the plugin calls of a plan.
    pub fn plugin_calls(&self, outcome: &PlanOutcome) {
        for part in outcome.composed.iter().flat_map(|c| &c.parts) {
            let labels = PluginLabels {
                plugin: part.selection.plugin.info.name.clone(),
            };
            self.plugin_seconds
                .get_or_create(&labels)
                .observe(part.stats.duration.as_secs_f64());
            self.plugin_fuel
                .get_or_create(&labels)
                .observe(part.stats.fuel_used as f64);
        }
    }

    /// Count a plugin that failed and was replaced by the built-in.
    pub fn plugin_fallback(&self, fallback: &Fallback) {
        self.plugin_fallbacks
            .get_or_create(&TrapLabels {
                plugin: fallback.failed.info.name.clone(),
                kind: fallback.kind.to_owned(),
            })
            .inc();
    }

    /// Count a plugin trap or limit breach behind a planning error.
    pub fn plan_error(&self, error: &PlannerError) {
        let PlannerError::Plugin(e) = error else {
            return;
        };
        let (plugin, kind) = match e {
            PluginError::Denied { plugin, .. } => (plugin, "denied-import"),
            PluginError::Fuel { plugin, .. } => (plugin, "fuel"),
            PluginError::Deadline { plugin, .. } => (plugin, "deadline"),
            PluginError::Memory { plugin, .. } => (plugin, "memory"),
            PluginError::Panicked { plugin, .. } => (plugin, "panic"),
            PluginError::Trapped { plugin, .. } => (plugin, "trap"),
            PluginError::BadPlan { plugin, .. } => (plugin, "bad-plan"),
            _ => return,
        };
        self.plugin_traps
            .get_or_create(&TrapLabels {
                plugin: plugin.clone(),
                kind: kind.to_owned(),
            })
            .inc();
    }
}

/// The `kind` label of `cocoon_fixup_retries_total` for a stop: its
/// [`Stop::kind`], except that a failed `cocoon vm inspect` is `cocoon`
/// and a refusal is `api-refused`, the names the alert rules
/// (deploy/alerts.yaml) match.
pub fn retry_kind(stop: &Stop) -> &'static str {
    match stop {
        Stop::Inspect { .. } => "cocoon",
        Stop::RunningRefused { .. } | Stop::Api(PodError::Refused { .. }) => "api-refused",
        other => other.kind(),
    }
}
