//! The calls of the C ABI as safe Rust: JSON and bytes in, JSON out, or a
//! [`Failure`] with its [`CfStatus`]. `lib.rs` only moves bytes across the
//! boundary and catches panics.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use fixup_core::binding::{BindingPolicy, Mismatch, Verdict};
use fixup_core::facts::{BootKind, FactError, Overrides, PodInput, VmId, VmInspect};
use fixup_core::plan::policy::RawPolicy;
use fixup_core::planner::{OptionError, Planner, PlannerError, PlannerOptions, RawPlannerOptions};
use fixup_core::plugin::cache::default_cache_dir;
use fixup_core::plugin::{LoadError, PluginError};

/// What a call returns: `CF_OK` and a JSON document, or another status and
/// a message. A typed code the caller can switch on; the message is for
/// people and may change between versions.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CfStatus {
    /// Success: the output is the call's JSON document.
    CfOk = 0,
    /// The caller broke the contract: a null pointer, text that is not
    /// UTF-8, options, a request or a report that are not the documented
    /// JSON. A bug in the caller, never in the input data. (A planner used
    /// after it was freed is not detected: that is undefined behaviour.)
    CfInvalidArgument = 1,
    /// The pod is not what `kubectl get pod -o json` prints (malformed
    /// JSON, wrong shape, not a Pod).
    CfBadInput = 2,
    /// The pod and VM parse, but their facts do not hold together or do
    /// not validate (an id mismatch, a bad MAC or address, a bad flavour),
    /// or the pod is one no host plans for whatever its VM (a macOS pod).
    CfBadFacts = 3,
    /// The node is at fault, not the pod: the cocoon root cannot be probed,
    /// the plugin directory leaves the VM without a plugin (a contested
    /// claim, a file that did not load), the plugin engine could not be set
    /// up, or a plugin call ran past its wall-clock deadline (time is the
    /// node's: a looping plugin runs out of fuel instead). Retry later; do
    /// not fail the pod.
    CfNode = 4,
    /// No plugin serves the scenario and flavour. (When the plugin
    /// directory is to blame, a contested claim or a file that did not
    /// load, the answer is `CF_NODE` instead: the node's operator fixes it.)
    CfNoPlugin = 5,
    /// A plugin hit a sandbox limit: fuel, memory, log volume, or the bytes
    /// it may hand the host. (Its wall-clock deadline is `CF_NODE`.)
    CfPluginLimit = 6,
    /// A plugin planned what its guest policy (or the operator's narrowing)
    /// does not allow.
    CfPluginPolicy = 7,
    /// A plugin declined: it does not support the scenario here, or it
    /// rejected a fact.
    CfPluginDeclined = 8,
    /// A plugin failed otherwise: it trapped, panicked, called a denied
    /// import, or returned an unusable plan.
    CfPluginFailed = 9,
    /// The plugins' plans cannot be combined, or the combined plan breaks
    /// the plan limits or the rendered sizes.
    CfPlanRejected = 10,
    /// Building the planner failed: the engine, a plugin that does not load
    /// (in strict mode), a plugin directory that is not trusted.
    CfLoad = 11,
    /// The library panicked. The message carries the panic's text; please
    /// report it. Free the planner and build a new one before planning
    /// again.
    CfPanic = 12,
    /// The VM record is not the pod's own (spec section 2): nothing may run
    /// in it for this pod and no IP may be published. The message names
    /// both VMs, for the node's log; the event a task records on the pod
    /// never names the other VM.
    CfVmMismatch = 13,
    /// The VM record is not what `cocoon vm inspect --json` prints: the
    /// cocoon CLI (or its version) is at fault, not the pod; retry later,
    /// do not fail the pod.
    CfBadRecord = 14,
}

/// A call that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub status: CfStatus,
    pub message: String,
}

impl Failure {
    pub fn new(status: CfStatus, message: impl Into<String>) -> Self {
        Failure {
            status,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Failure::new(CfStatus::CfInvalidArgument, message)
    }
}

pub type Outcome = Result<String, Failure>;

fn to_json(value: &impl serde::Serialize) -> Outcome {
    serde_json::to_string(value)
        .map_err(|e| Failure::invalid(format!("cannot encode the answer as JSON: {e}")))
}

fn parse<'a, T: Deserialize<'a>>(what: &str, text: &'a str) -> Result<T, Failure> {
    serde_json::from_str(text).map_err(|e| Failure::invalid(format!("{what}: {e}")))
}

/// The options of [`cf_planner_new`](crate::cf_planner_new): the keys of
/// the configuration file that concern planning, with the same defaults.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Options {
    /// Directory of vendor plugins [default: /etc/cocoon-fixup/plugins,
    /// when it exists]. An empty string loads none.
    pub plugin_dir: Option<PathBuf>,
    /// Precompiled plugins [default: /var/cache/cocoon-fixup as root, else
    /// ~/.cache/cocoon-fixup].
    pub cache_dir: Option<PathBuf>,
    /// The cache's key [default: as the daemon's].
    pub cache_key: Option<PathBuf>,
    /// Compile plugins every time a planner is built.
    #[serde(default)]
    pub no_cache: bool,
    /// The cocoon root, for the overlay probe [default: /var/lib/cocoon].
    pub cocoon_root: Option<PathBuf>,
    /// cocoon-net's lease file, for the `lease` op [default:
    /// /var/lib/cocoon/net/leases.json].
    pub lease_file: Option<PathBuf>,
    pub plugin_fuel: Option<u64>,
    pub plugin_deadline_ms: Option<u64>,
    pub plugin_memory_mib: Option<u32>,
    pub plan_max_steps: Option<usize>,
    pub plan_max_bytes: Option<usize>,
    /// Concurrent plugin instances reserved [default: 64].
    pub slots: Option<u32>,
    /// sha256 digests of the plugin files that may load; empty: any.
    #[serde(default)]
    pub allowed_plugins: Vec<String>,
    /// The operator's narrowing of plugins' guest policies, by plugin name.
    #[serde(default)]
    pub plugin_policy: BTreeMap<String, RawPolicy>,
    /// What a plugin's misbehaviour does, by plugin name: `fail` (the
    /// default) or `fallback` (the built-in plans instead; the report's
    /// plugin entry carries `fallback`).
    #[serde(default)]
    pub plugin_failure: BTreeMap<String, String>,
    #[serde(default)]
    pub accept_legacy_vm_names: bool,
    /// A VM named by the pod's `vm.cocoonstack.io/name` though not derived
    /// from the pod binds (through the task op, when no other pod on the
    /// node claims the name): the retired cocoon-webhook's Deployment
    /// slots. Safe only where the admission policy is installed.
    #[serde(default)]
    pub accept_annotated_vm_names: bool,
    /// A plugin file that does not load fails the planner (as `plan`
    /// does); without it the others serve (as `serve` does) and the
    /// failures are listed.
    #[serde(default)]
    pub strict: bool,
}

/// A planner, the binding policy it plans under, and the permits that keep
/// plugin calls within the engine's instance slots.
#[derive(Debug)]
pub struct Built {
    pub planner: Planner,
    pub binding: BindingPolicy,
    /// cocoon-net's lease file.
    pub lease_file: PathBuf,
    permits: Permits,
}

impl Built {
    /// A permit for one plugin call: waits while every engine slot is busy.
    pub(crate) fn permit(&self) -> impl Drop + '_ {
        self.permits.acquire()
    }
}

/// One permit per engine slot: a caller with more threads than slots
/// waits for one instead of failing the pod on a full instance pool (the
/// daemon's semaphore, here without an async runtime).
#[derive(Debug)]
struct Permits {
    free: Mutex<u32>,
    freed: Condvar,
}

struct Permit<'a>(&'a Permits);

impl Permits {
    fn new(slots: u32) -> Self {
        Permits {
            free: Mutex::new(slots.max(1)),
            freed: Condvar::new(),
        }
    }

    fn acquire(&self) -> Permit<'_> {
        // A counter cannot be left half-updated: a poisoned lock is safe
        // to go on with.
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        while *free == 0 {
            free = self
                .freed
                .wait(free)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *free -= 1;
        Permit(self)
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.0.freed.notify_one();
    }
}

impl Options {
    fn planner_options(&self) -> Result<PlannerOptions, Failure> {
        RawPlannerOptions {
            fuel: self.plugin_fuel,
            memory_mib: self.plugin_memory_mib,
            deadline: self.plugin_deadline_ms.map(Duration::from_millis),
            plan_max_steps: self.plan_max_steps,
            plan_max_bytes: self.plan_max_bytes,
            cache_dir: if self.no_cache {
                None
            } else {
                self.cache_dir.clone().or_else(default_cache_dir)
            },
            cache_key: self.cache_key.clone(),
            slots: self.slots,
            allowed_plugins: self.allowed_plugins.clone(),
            plugin_policy: self.plugin_policy.clone(),
            plugin_failure: self.plugin_failure.clone(),
            plugin_dir: self.plugin_dir.clone(),
            cocoon_root: self.cocoon_root.clone(),
        }
        .build()
        .map_err(|e| match e {
            OptionError::PluginDir { .. } => Failure::new(CfStatus::CfLoad, e.to_string()),
            e => Failure::invalid(e.to_string()),
        })
    }
}

/// Build a planner from options JSON (`null` or `{}`: every default).
/// The JSON answer lists the plugin files that did not load (non-strict)
/// and warnings.
pub fn planner_new(options: &str) -> Result<(Built, String), Failure> {
    let options: Options = match options.trim() {
        "" | "null" => Options::default(),
        text => parse("options", text)?,
    };
    let planner_options = options.planner_options()?;
    let (planner, failures) = Planner::new(planner_options)
        .map_err(|e| Failure::new(CfStatus::CfLoad, format!("starting the plugin host: {e}")))?;
    // An embedding daemon plans many VMs: link every plugin now (see
    // `PluginHost::warm`), so a plugin whose code cannot be loaded is found
    // here, not at some VM's first plan. Like a plugin file that does not
    // load: an error in strict mode, else listed with the failures.
    let unlinked = planner.plugins().warm();
    if options.strict && !unlinked.is_empty() {
        let lines: Vec<String> = unlinked.iter().map(ToString::to_string).collect();
        return Err(Failure::new(
            CfStatus::CfLoad,
            format!("starting the plugin host: {}", lines.join("; ")),
        ));
    }
    if options.strict && !failures.is_empty() {
        let lines: Vec<String> = failures
            .iter()
            .map(|f| f.text(&f.path.display().to_string()))
            .collect();
        return Err(Failure::new(
            CfStatus::CfLoad,
            format!(
                "{} plugin(s) could not be loaded: fix or remove them: {}",
                lines.len(),
                lines.join("; ")
            ),
        ));
    }
    let warnings: Vec<String> = planner
        .plugins()
        .unused_narrowings()
        .into_iter()
        .map(|name| format!("plugin_policy.{name} narrows a plugin that is not loaded: check the name against `cocoon-fixup plugin inspect`"))
        .chain(unlinked.iter().map(ToString::to_string))
        .collect();
    let slots = planner.plugins().slots();
    let failures: Vec<Value> = failures
        .iter()
        .map(|f| json!({"path": f.path.display().to_string(), "error": f.error.to_string()}))
        .collect();
    let answer =
        to_json(&json!({"load_failures": failures, "warnings": warnings, "slots": slots}))?;
    let permits = Permits::new(slots);
    Ok((
        Built {
            planner,
            binding: BindingPolicy {
                accept_legacy_names: options.accept_legacy_vm_names,
                accept_annotated_names: options.accept_annotated_vm_names,
            },
            lease_file: options
                .lease_file
                .clone()
                .unwrap_or_else(|| PathBuf::from(fixup_core::lease::DEFAULT_LEASE_FILE)),
            permits,
        },
        answer,
    ))
}

/// The address leased to `mac` now in the planner's lease file:
/// `{"lease": ip or null}` (no file yet holds no lease), or
/// `{"lease_error": why}` when the file cannot tell (unreadable, not a
/// regular file, too large, not a list of leases). One look, read as the
/// daemon's watcher reads it, for an embedder that polls it through an IP
/// wait.
pub fn lease(built: &Built, mac: &str) -> Outcome {
    use fixup_core::lease::{FileRead, lookup, read_file};
    let mac = fixup_core::facts::MacAddr::parse(mac)
        .map_err(|e| Failure::invalid(format!("mac: {e}")))?;
    let path = &built.lease_file;
    let answer = match read_file(path) {
        FileRead::Missing => json!({"lease": null}),
        FileRead::Bytes(bytes) => match lookup(&bytes, &mac, std::time::SystemTime::now()) {
            Ok(ip) => json!({"lease": ip.map(|ip| ip.to_string())}),
            Err(e) => json!({"lease_error": format!(
                "lease file {}: not a JSON array of {{mac, ip, expiry}} rows ({e}); check what cocoon-net writes to it",
                path.display()
            )}),
        },
        FileRead::Unusable(why) => json!({"lease_error": format!(
            "lease file {}: {why}; check the planner's lease_file option",
            path.display()
        )}),
    };
    to_json(&answer)
}

/// The overrides of a plan call (`null`: none).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct OverridesJson {
    boot: Option<String>,
    source_image: Option<String>,
}

fn overrides(text: Option<&str>) -> Result<Overrides, Failure> {
    let raw: OverridesJson = match text.map(str::trim) {
        None | Some("" | "null") => OverridesJson::default(),
        Some(text) => parse("overrides", text)?,
    };
    let boot = match raw.boot.as_deref() {
        None | Some("") => None,
        Some("clone") => Some(BootKind::Clone),
        Some("fork") => Some(BootKind::Fork),
        Some("wake") => Some(BootKind::Wake),
        Some("resumed") => Some(BootKind::Resumed),
        Some(other) => {
            return Err(Failure::invalid(format!(
                "overrides.boot is {other:?}: use clone, fork, wake or resumed"
            )));
        }
    };
    Ok(Overrides {
        boot,
        source_image: raw.source_image,
    })
}

fn input_text<'a>(what: &str, bytes: &'a [u8]) -> Result<&'a str, Failure> {
    std::str::from_utf8(bytes)
        .map_err(|e| Failure::new(CfStatus::CfBadInput, format!("{what}: not UTF-8: {e}")))
}

fn plugin_status(e: &PluginError) -> CfStatus {
    match e {
        // The node, not the VM: retry once it is fixed or less loaded.
        e if e.is_node_config() => CfStatus::CfNode,
        PluginError::Fuel { .. }
        | PluginError::Memory { .. }
        | PluginError::LogFlood { .. }
        | PluginError::TooMuchData { .. } => CfStatus::CfPluginLimit,
        PluginError::Policy { .. } => CfStatus::CfPluginPolicy,
        PluginError::NotLoaded { .. }
        | PluginError::Engine { .. }
        | PluginError::Deadline { .. } => CfStatus::CfNode,
        PluginError::Unsupported { .. } | PluginError::InvalidFact { .. } => {
            CfStatus::CfPluginDeclined
        }
        PluginError::Untrusted(_)
        | PluginError::Read { .. }
        | PluginError::NotAComponent { .. }
        | PluginError::Compile { .. }
        | PluginError::ContractMismatch { .. }
        | PluginError::NotAPlugin { .. }
        | PluginError::Link { .. }
        | PluginError::BadPolicy { .. }
        | PluginError::NotAllowed { .. }
        | PluginError::Quarantined { .. } => CfStatus::CfLoad,
        PluginError::BadDescription { .. }
        | PluginError::Denied { .. }
        | PluginError::Panicked { .. }
        | PluginError::Trapped { .. }
        | PluginError::BadPlan { .. } => CfStatus::CfPluginFailed,
    }
}

fn planner_status(e: &PlannerError) -> CfStatus {
    match e {
        PlannerError::Facts(_) => CfStatus::CfBadFacts,
        PlannerError::Probe(_) => CfStatus::CfNode,
        PlannerError::NoPlugin(e) if e.is_node_config() => CfStatus::CfNode,
        PlannerError::NoPlugin(_) => CfStatus::CfNoPlugin,
        PlannerError::Plugin(e) => plugin_status(e),
        PlannerError::Compose { .. } => CfStatus::CfPlanRejected,
        PlannerError::Load(LoadError::Plugin(e)) => plugin_status(e),
        PlannerError::Load(LoadError::Conflict(_)) => CfStatus::CfLoad,
    }
}

fn bad_input(e: FactError) -> Failure {
    Failure::new(CfStatus::CfBadInput, e.to_string())
}

/// Whether the VM record is the pod's own, as the daemon checks it before
/// anything else ([`fixup_core::decision::bind_record`]). An annotated name
/// is not proven here (no view of the node's pods): `Ok` with
/// [`Verdict::Unproven`], which the caller must not take for bound.
fn bind_record(pod: &PodInput, vm: &VmInspect, policy: BindingPolicy) -> Result<Verdict, Mismatch> {
    match fixup_core::decision::bind_record(pod, vm, policy) {
        Verdict::Mismatch(m) => Err(m),
        verdict => Ok(verdict),
    }
}

pub(crate) fn read_pod(pod: &[u8]) -> Result<PodInput, Failure> {
    PodInput::from_json(input_text("pod", pod)?, "pod").map_err(bad_input)
}

fn read_record(vm: &[u8]) -> Result<VmInspect, Failure> {
    let text = std::str::from_utf8(vm)
        .map_err(|e| Failure::new(CfStatus::CfBadRecord, format!("vm: not UTF-8: {e}")))?;
    VmInspect::from_json(text, "vm").map_err(|e| Failure::new(CfStatus::CfBadRecord, e.to_string()))
}

/// Plan for a pod and its VM record: the report of `cocoon-fixup plan
/// --output json`, with the binding verdict. A VM that is not the pod's is refused before anything looks at
/// it (`CF_VM_MISMATCH`). Work the host left `running` is planned as
/// resumed work, as the daemon plans it (spec section 8: the source image
/// is not known, the disk probe decides), unless `overrides` says
/// otherwise.
pub fn plan(built: &Built, pod: &[u8], vm: &[u8], overrides_json: Option<&str>) -> Outcome {
    let overrides = overrides(overrides_json)?;
    let pod = read_pod(pod)?;
    let vm = read_record(vm)?;
    if let Some(why) = fixup_core::decision::never_planned(&pod) {
        return Err(Failure::new(
            CfStatus::CfBadFacts,
            format!("the pod is hands-off ({why}): nothing is planned or run for it"),
        ));
    }
    let verdict = bind_record(&pod, &vm, built.binding).map_err(|m| {
        Failure::new(
            CfStatus::CfVmMismatch,
            format!("not this pod's VM, nothing may run in it: {m}"),
        )
    })?;
    if !verdict.is_bound() {
        return Err(Failure::new(
            CfStatus::CfVmMismatch,
            format!(
                "{verdict}; nothing may run in it on this call's word: drive the pod with the task op (cf_task_start), which asks for the node's other pods"
            ),
        ));
    }
    // Work left `running` is planned as resumed work, as the daemon plans
    // it; a caller that knows the source image keeps it.
    let obs = fixup_core::decision::observe(&pod, &vm, &overrides);
    // An id cocoon never prints is the record's fault, not the pod's.
    VmId::parse(&obs.vm_id).map_err(|e| Failure::new(CfStatus::CfBadRecord, format!("vm: {e}")))?;
    let outcome = {
        let _permit = built.permits.acquire();
        built.planner.plan(&obs)
    }
    .map_err(|e| Failure::new(planner_status(&e), e.to_string()))?;
    let mut report = outcome.report(&obs);
    report.binding = Some(verdict);
    to_json(&report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(json: &str) -> Options {
        serde_json::from_str(json).expect("options JSON")
    }

    #[test]
    fn a_failure_policy_is_read_by_plugin_name() {
        let planner = options(r#"{"plugin_failure": {"acme-net": "fallback", "other": "fail"}}"#)
            .planner_options()
            .expect("valid options");
        assert_eq!(
            planner.failure["acme-net"],
            fixup_core::planner::FailurePolicy::Fallback
        );
        assert_eq!(
            planner.failure["other"],
            fixup_core::planner::FailurePolicy::Fail
        );
    }

    #[test]
    fn a_failure_policy_that_is_neither_fail_nor_fallback_is_refused() {
        let Err(failure) =
            options(r#"{"plugin_failure": {"acme-net": "retry"}}"#).planner_options()
        else {
            panic!("`retry` is no failure policy");
        };
        assert_eq!(failure.status, CfStatus::CfInvalidArgument);
        assert!(
            failure.message.contains("plugin_failure") && failure.message.contains("acme-net"),
            "{}",
            failure.message
        );
    }

    /// A macOS pod is hands-off: `cf_plan` refuses it before it looks at
    /// the VM, instead of planning it as Linux.
    #[test]
    fn a_macos_pod_is_not_planned() {
        let root = tempfile::tempdir().unwrap();
        let options =
            serde_json::json!({"cocoon_root": root.path(), "plugin_dir": "", "no_cache": true});
        let (built, _) = planner_new(&options.to_string()).unwrap();
        let examples =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/oci-static");
        let mut pod: Value =
            serde_json::from_slice(&std::fs::read(examples.join("pod.json")).unwrap()).unwrap();
        let vm = std::fs::read(examples.join("vm.json")).unwrap();
        assert!(plan(&built, pod.to_string().as_bytes(), &vm, None).is_ok());
        pod["metadata"]["annotations"]["cocoonset.cocoonstack.io/os"] = "macOS".into();
        let e = plan(&built, pod.to_string().as_bytes(), &vm, None).unwrap_err();
        assert_eq!(e.status, CfStatus::CfBadFacts);
        assert!(e.message.contains("hands-off (macos)"), "{}", e.message);
    }
}
