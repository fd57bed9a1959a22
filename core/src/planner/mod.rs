//! The plan path, end to end: observation -> classification -> image kind ->
//! validated facts -> plugin selection -> plugin calls -> composed plan ->
//! rendered exec argv and hint.
//!
//! [`Planner`] is built once (it owns the plugin engine) and called per VM.

mod options;

pub use options::{MIN_DEADLINE, OptionError, RawPlannerOptions};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::binding::Verdict;
use crate::classify::{self, Classification, Fixup, Scenario};
use crate::facts::{FactError, GuestOs, ImageKind, Observation, VmFacts, VmId};
use crate::plan::{self, Plan, PlanError, PlanLimits, ScriptHeader};
use crate::plugin::registry::NoPlugin;
use crate::plugin::{
    Allocation, CallStats, EngineOptions, LoadError, LoadFailure, LoadedPlugin, Origin,
    PluginError, PluginHost, Selection,
};
use crate::probe::{OverlayProbe, ProbeError};

/// How a [`Planner`] is set up.
#[derive(Debug, Clone)]
pub struct PlannerOptions {
    pub engine: EngineOptions,
    /// The cocoon root for the overlay probe (default `/var/lib/cocoon`).
    pub cocoon_root: PathBuf,
    /// Vendor plugins to load after the built-ins, if any.
    pub plugin_dir: Option<PathBuf>,
    /// What happens when a plugin misbehaves for a VM it claimed, by plugin
    /// name; a plugin not named here fails the pod
    /// ([`FailurePolicy::Fail`]).
    pub failure: BTreeMap<String, FailurePolicy>,
}

/// What the host does when a plugin traps, breaches a limit or its policy,
/// or declines (`unsupported`) a VM it claimed
/// ([`PluginError::is_misbehaviour`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailurePolicy {
    /// No plan: the pod fails with the plugin's error (the default).
    #[default]
    Fail,
    /// Plan with the built-in that serves the scenario for any flavour,
    /// and say so (a Warning event naming both plugins). A plugin that
    /// rejects the facts (`invalid-facts`) still fails the pod: the facts
    /// are wrong, not the plugin.
    Fallback,
}

impl FailurePolicy {
    pub const NAMES: [&'static str; 2] = ["fail", "fallback"];

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "fail" => Some(FailurePolicy::Fail),
            "fallback" => Some(FailurePolicy::Fallback),
            _ => None,
        }
    }
}

impl Default for PlannerOptions {
    fn default() -> Self {
        PlannerOptions {
            engine: EngineOptions::default(),
            cocoon_root: PathBuf::from(crate::probe::DEFAULT_COCOON_ROOT),
            plugin_dir: None,
            failure: BTreeMap::new(),
        }
    }
}

/// Why no plan could be made.
#[derive(Debug, thiserror::Error)]
pub enum PlannerError {
    #[error(transparent)]
    Facts(#[from] FactError),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error(transparent)]
    NoPlugin(#[from] NoPlugin),
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error("the plans of {plugins} cannot be combined: {source}")]
    Compose {
        plugins: String,
        #[source]
        source: PlanError,
    },
    #[error("loading plugins: {0}")]
    Load(#[from] LoadError),
}

/// One plugin's part of a plan.
#[derive(Debug, Clone)]
pub struct PlanPart {
    pub selection: Selection,
    pub stats: CallStats,
    pub steps: usize,
    /// Set when the selected plugin failed and its failure policy put the
    /// built-in in its place: `selection` is then the built-in's.
    pub fallback: Option<Fallback>,
}

impl PlanPart {
    /// When the VM's guest-flavour annotation names a flavour that no
    /// plugin declares for this part's scenario: one line saying so and
    /// naming the plugin that planned it instead (the generic one). Not
    /// for `fc-mac`, generic by design (it re-applies MACs whatever the
    /// guest): a flavoured Firecracker clone is served by its generic
    /// part and its flavour's network part, and no vendor need claim
    /// `fc-mac`.
    pub fn unmatched_flavor(&self) -> Option<String> {
        if self.selection.scenario == Scenario::FcMac {
            return None;
        }
        let flavor = self.selection.unmatched_flavor.as_ref()?;
        let plugin = &self.selection.plugin;
        Some(format!(
            "annotation {} names flavour `{flavor}`, but no plugin serves `{flavor}` for {}: {} {} ({}), which serves any flavour, planned it instead; if a plugin of yours should serve it, check that it declares `{flavor}` for {} (`cocoon-fixup plugin inspect` lists its scenarios and flavours) and that it loaded",
            crate::facts::annotations::GUEST_FLAVOR,
            self.selection.scenario,
            plugin.info.name,
            plugin.info.version,
            plugin.origin,
            self.selection.scenario,
        ))
    }
}

/// A plugin that failed for a VM it claimed, replaced by a built-in
/// ([`FailurePolicy::Fallback`]).
#[derive(Debug, Clone)]
pub struct Fallback {
    /// The plugin that failed.
    pub failed: Arc<LoadedPlugin>,
    /// Why it failed.
    pub error: String,
    /// The kind of failure ([`PluginError::misbehaviour`]).
    pub kind: &'static str,
}

impl Fallback {
    /// One line for the Warning event and the log: both plugins, their
    /// versions and digests, and the failure.
    pub fn message(&self, scenario: Scenario, used: &LoadedPlugin) -> String {
        // The plugins first: the event's cap may cut the error, never who
        // planned in whose place.
        let error = crate::annotations::cap_utf8(self.error.clone(), 200, "… [truncated]");
        format!(
            "planned {scenario} with the built-in {} {} (sha256:{}) in place of plugin {} {} (sha256:{}), failure policy `fallback`: {error}",
            used.info.name,
            used.info.version,
            short_digest(&used.sha256),
            self.failed.info.name,
            self.failed.info.version,
            short_digest(&self.failed.sha256),
        )
    }
}

fn short_digest(sha256: &str) -> &str {
    sha256.get(..12).unwrap_or(sha256)
}

/// A plan composed from one or more plugins, rendered.
#[derive(Debug, Clone)]
pub struct ComposedPlan {
    pub facts: VmFacts,
    pub parts: Vec<PlanPart>,
    pub plan: Plan,
    /// The argv after `cocoon vm exec <id> --`, the same for every exec of
    /// the plan; each exec adds its own nonce ([`plan::exec_argv`]).
    pub exec: Vec<String>,
    /// The hint script a person can paste.
    pub script: String,
    /// `script`, base64 (standard alphabet, padded).
    pub hint: String,
}

impl ComposedPlan {
    /// The names of the plan's plugins, in plan order, joined by ` + `.
    pub fn plugins(&self) -> String {
        self.parts
            .iter()
            .map(|p| p.selection.plugin.info.name.as_str())
            .collect::<Vec<_>>()
            .join(" + ")
    }

    /// The plugin file that planned this for the VM's guest flavour because
    /// it declares that flavour (not a generic plugin, not a built-in in a
    /// failed plugin's place): its name. For a DHCP recovery plan this is
    /// the flavour's claim on all-DHCP clones, whose plan then runs at
    /// once (spec section 6).
    pub fn flavor_claim(&self) -> Option<&str> {
        let flavor = self.facts.flavor.as_ref()?;
        self.parts
            .iter()
            .find(|p| p.fallback.is_none() && p.selection.plugin.info.flavors.contains(flavor))
            .map(|p| p.selection.plugin.info.name.as_str())
    }

    /// Render a checked, composed plan: the exec argv, and the hint script
    /// under a header naming the scenarios, the VM and each plugin's digest.
    pub fn render(
        facts: &VmFacts,
        scenarios: &[Scenario],
        parts: Vec<PlanPart>,
        plan: Plan,
    ) -> Self {
        let plugins: Vec<&LoadedPlugin> = parts.iter().map(|p| &*p.selection.plugin).collect();
        let rendered = RenderedPlan::render(facts, scenarios, &plugins, plan);
        Self::of(facts, parts, rendered)
    }

    fn of(facts: &VmFacts, parts: Vec<PlanPart>, rendered: RenderedPlan) -> Self {
        ComposedPlan {
            facts: facts.clone(),
            parts,
            plan: rendered.plan,
            exec: rendered.exec,
            script: rendered.script,
            hint: rendered.hint,
        }
    }
}

/// A plan composed from the plans of its parts and rendered, as the node
/// would run it ([`compose_and_render`]).
#[derive(Debug, Clone)]
pub struct RenderedPlan {
    /// The steps of every part, in phase order.
    pub plan: Plan,
    /// The argv after `cocoon vm exec <id> --`.
    pub exec: Vec<String>,
    /// The hint script a person can paste.
    pub script: String,
    /// `script`, base64 (standard alphabet, padded).
    pub hint: String,
}

impl RenderedPlan {
    fn render(
        facts: &VmFacts,
        scenarios: &[Scenario],
        plugins: &[&LoadedPlugin],
        plan: Plan,
    ) -> Self {
        let script = hint_script(facts, scenarios, plugins, &plan);
        let hint = plan::hint_base64(&script);
        let exec = plan::render_exec(&plan);
        RenderedPlan {
            plan,
            exec,
            script,
            hint,
        }
    }
}

/// What the node does with the plans `plugins` returned for `scenarios`
/// (one each, in that order) before it runs anything: compose them in
/// phase order, check the whole against `limits`, render it, and check
/// the rendering (the hint's size, each exec argument and the command
/// line). The planner and `plugin test --render` both go through here, so
/// what the kit shows is what the node would run, or refuse.
pub fn compose_and_render(
    facts: &VmFacts,
    scenarios: &[Scenario],
    plugins: &[&LoadedPlugin],
    plans: Vec<Plan>,
    limits: &PlanLimits,
) -> Result<RenderedPlan, PlanError> {
    let plan = plan::compose(plans)?;
    plan.check(limits)?;
    let rendered = RenderedPlan::render(facts, scenarios, plugins, plan);
    plan::check_rendered(&rendered.plan, &rendered.exec, &rendered.hint)?;
    Ok(rendered)
}

/// The hint script of `plan`, made by `plugins` for `scenarios` of the VM
/// of `facts`: the plan's steps in its dialect, under a header naming the
/// scenarios, the VM and each plugin's digest.
pub fn hint_script(
    facts: &VmFacts,
    scenarios: &[Scenario],
    plugins: &[&LoadedPlugin],
    plan: &Plan,
) -> String {
    let scenario_names: Vec<&str> = scenarios.iter().map(|s| s.as_str()).collect();
    let plugins: Vec<String> = plugins
        .iter()
        .map(|plugin| {
            format!(
                "{} {} sha256:{}",
                plugin.info.name,
                plugin.info.version,
                short_digest(&plugin.sha256)
            )
        })
        .collect();
    let header = ScriptHeader {
        title: vec![
            format!(
                "cocoon-fixup {} plan for VM {} (id {})",
                scenario_names.join(" + "),
                facts.name,
                facts.id
            ),
            format!("plugins: {}", plugins.join(", ")),
        ],
    };
    plan::render_script(plan, &header)
}

/// The answer for one VM.
#[derive(Debug, Clone)]
pub struct PlanOutcome {
    pub decision: Classification,
    /// The reported scenario; `None` when no fixup is needed.
    pub scenario: Option<Scenario>,
    pub image: ImageKind,
    /// `None` when no fixup is needed.
    pub composed: Option<ComposedPlan>,
}

impl PlanOutcome {
    /// The outcome for `obs` when it needs no fixup (as
    /// [`Planner::plan`] classifies it); `None` when it needs one. Asks no
    /// plugin, so a caller answers such a VM without building a planner.
    pub fn without_fixup(obs: &Observation) -> Option<Self> {
        let decision = classify::classify(obs);
        decision.fixup.is_none().then(|| Self::nothing(decision))
    }

    /// The outcome of a `decision` that needs no fixup.
    fn nothing(decision: Classification) -> Self {
        PlanOutcome {
            decision,
            scenario: None,
            image: ImageKind::Unknown,
            composed: None,
        }
    }
}

/// What preparing a running VM as a parent comes to
/// ([`Planner::plan_prepare`]).
#[derive(Debug, Clone)]
pub enum Preparation {
    /// Nothing to prepare, and why.
    Nothing { reason: String },
    /// The plan, made by the plugin that plans the clones' `network`
    /// scenario.
    Plan {
        network: Scenario,
        image: ImageKind,
        composed: Box<ComposedPlan>,
    },
}

/// Turns observations into plans. Build once, call per VM.
#[derive(Debug)]
pub struct Planner {
    plugins: PluginHost,
    cocoon_root: PathBuf,
    failure: BTreeMap<String, FailurePolicy>,
}

impl Planner {
    /// The cocoon root this planner probes (the serial console lives
    /// below it too).
    pub fn cocoon_root(&self) -> &std::path::Path {
        &self.cocoon_root
    }

    /// Build the engine, load the built-ins and, if given, the plugin
    /// directory. Plugin-directory failures are returned beside the planner
    /// so the caller decides whether they are fatal.
    pub fn new(options: PlannerOptions) -> Result<(Self, Vec<LoadFailure>), PlannerError> {
        Self::with_files(options, &[])
    }

    /// [`new`](Self::new), then also the plugin files at `files` (the
    /// store's copies of pinned OCI references, for the host), each
    /// loaded as a file of the plugin directory is.
    pub fn with_files(
        options: PlannerOptions,
        files: &[PathBuf],
    ) -> Result<(Self, Vec<LoadFailure>), PlannerError> {
        Self::with_allocation(options, files, Allocation::Pooling)
    }

    /// [`with_files`](Self::with_files), the engine allocating plugin
    /// instances as `allocation` says ([`Allocation::OnDemand`] for a
    /// one-shot command that makes a few calls and exits).
    pub fn with_allocation(
        options: PlannerOptions,
        files: &[PathBuf],
        allocation: Allocation,
    ) -> Result<(Self, Vec<LoadFailure>), PlannerError> {
        let mut plugins = PluginHost::with_allocation(options.engine, allocation)?;
        plugins.load_builtins()?;
        let mut failures = match &options.plugin_dir {
            Some(dir) => plugins.load_dir(dir)?,
            None => Vec::new(),
        };
        failures.extend(plugins.load_files(files));
        for name in plugins.unused_narrowings() {
            tracing::warn!(
                plugin = %crate::facts::escape_controls(&name),
                "the configuration file narrows the guest policy of plugin_policy.{}, but no loaded plugin has that name: check the name against `cocoon-fixup plugin inspect`",
                crate::facts::escape_controls(&name)
            );
        }
        for name in options.failure.keys() {
            let loaded = plugins
                .registry()
                .plugins()
                .iter()
                .any(|p| p.info.name == *name && !matches!(p.origin, Origin::BuiltIn(_)));
            if !loaded {
                tracing::warn!(
                    plugin = %crate::facts::escape_controls(name),
                    "the configuration file sets plugin_failure.{} but no plugin file has that name (a built-in always fails the pod): check the name against `cocoon-fixup plugin inspect`",
                    crate::facts::escape_controls(name)
                );
            }
        }
        Ok((
            Planner {
                plugins,
                cocoon_root: options.cocoon_root,
                failure: options.failure,
            },
            failures,
        ))
    }

    pub fn plugins(&self) -> &PluginHost {
        &self.plugins
    }

    /// Classify, and plan when a fixup is needed.
    pub fn plan(&self, obs: &Observation) -> Result<PlanOutcome, PlannerError> {
        let decision = classify::classify(obs);
        let Some(fixup) = decision.fixup else {
            return Ok(PlanOutcome::nothing(decision));
        };
        let image = if decision.needs_image_kind() {
            self.image_kind(obs)?
        } else {
            ImageKind::Unknown
        };
        let facts = VmFacts::validate(obs, image)?;
        let scenarios: Vec<Scenario> = match fixup {
            Fixup::WindowsPnp => vec![Scenario::WindowsPnp],
            Fixup::FcMac => vec![Scenario::FcMac, classify::network_scenario(image)],
            Fixup::LinuxNetwork => vec![classify::network_scenario(image)],
        };
        let composed = self.plan_scenarios(&facts, &scenarios)?;
        Ok(PlanOutcome {
            decision,
            scenario: decision.scenario(image),
            image,
            composed: Some(composed),
        })
    }

    /// Plan exactly `scenarios` (composed in phase order) for validated
    /// facts: the DHCP recovery pass and the plugin test runner use this.
    pub fn plan_scenarios(
        &self,
        facts: &VmFacts,
        scenarios: &[Scenario],
    ) -> Result<ComposedPlan, PlannerError> {
        let registry = self.plugins.registry();
        let selections = scenarios
            .iter()
            .map(|&scenario| registry.select(scenario, facts.flavor.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        self.plan_selected(facts, scenarios, selections)
    }

    /// Plan a running VM's `prepare` scenario, before it is snapshotted as
    /// a parent: the plugin that would plan its clones' network scenario
    /// (by image kind and guest flavour, as [`plan`](Self::plan) selects)
    /// plans it, when it declares it. Windows guests and plugins that do
    /// not declare `prepare` (contract 0.3.0 and older among them) have
    /// nothing to prepare: their clones are repaired as they are today.
    pub fn plan_prepare(&self, obs: &Observation) -> Result<Preparation, PlannerError> {
        if obs.os == GuestOs::Windows {
            return Ok(Preparation::Nothing {
                reason: "a Windows guest has nothing to prepare: its clones re-enumerate the NIC (windows-pnp) as before".into(),
            });
        }
        let image = self.image_kind(obs)?;
        let facts = VmFacts::for_parent(obs, image)?;
        let network = classify::network_scenario(image);
        let serving = self
            .plugins
            .registry()
            .select(network, facts.flavor.as_ref())?;
        let plugin = &serving.plugin;
        if !plugin.info.scenarios.contains(&Scenario::Prepare) {
            return Ok(Preparation::Nothing {
                reason: format!(
                    "{} {} ({}) plans this guest's clones ({network}) and does not declare the prepare scenario: its clones are repaired as before",
                    plugin.info.name, plugin.info.version, plugin.origin
                ),
            });
        }
        let selection = Selection {
            reason: format!("{}; it declares prepare", serving.reason),
            scenario: Scenario::Prepare,
            ..serving
        };
        let composed = self.plan_selected(&facts, &[Scenario::Prepare], vec![selection])?;
        Ok(Preparation::Plan {
            network,
            image,
            composed: Box::new(composed),
        })
    }

    /// Plan each scenario with its selected plugin, in order, and compose
    /// and render the plans.
    fn plan_selected(
        &self,
        facts: &VmFacts,
        scenarios: &[Scenario],
        selections: Vec<Selection>,
    ) -> Result<ComposedPlan, PlannerError> {
        let mut parts = Vec::new();
        let mut plans = Vec::new();
        for (&scenario, selection) in scenarios.iter().zip(selections) {
            let (selection, (plan, stats), fallback) =
                match self.plugins.plan(&selection.plugin, scenario, facts) {
                    Ok(planned) => (selection, planned, None),
                    Err(error) => {
                        let Some((builtin, kind)) = self.fallback_for(&selection, &error) else {
                            return Err(error.into());
                        };
                        let planned = self.plugins.plan(&builtin.plugin, scenario, facts)?;
                        let fallback = Fallback {
                            failed: selection.plugin,
                            error: error.to_string(),
                            kind,
                        };
                        (builtin, planned, Some(fallback))
                    }
                };
            parts.push(PlanPart {
                steps: plan.steps.len(),
                selection,
                stats,
                fallback,
            });
            plans.push(plan);
        }
        // The VM name is checked as a hostname by the step that writes it
        // (spec section 4, step 2): a plan that writes no hostname (the
        // Windows plan) never refuses a name it does not use. Whatever
        // else a plan writes there must be a hostname too.
        for written in plans.iter().flat_map(Plan::hostnames_written) {
            if written == facts.name.as_str() {
                facts.name.hostname()?;
            } else {
                crate::facts::check_written_hostname(written)?;
            }
        }
        let plugins: Vec<&LoadedPlugin> = parts.iter().map(|p| &*p.selection.plugin).collect();
        let rendered = compose_and_render(
            facts,
            scenarios,
            &plugins,
            plans,
            &self.plugins.limits().plan,
        )
        .map_err(|source| PlannerError::Compose {
            plugins: plugins
                .iter()
                .map(|p| p.info.name.as_str())
                .collect::<Vec<_>>()
                .join(" + "),
            source,
        })?;
        let composed = ComposedPlan::of(facts, parts, rendered);
        Ok(composed)
    }

    /// Whether some loaded plugin declares flavours for `scenario`: only
    /// then can a VM's flavour change which plugin plans it.
    pub fn declares_flavors(&self, scenario: Scenario) -> bool {
        self.plugins
            .registry()
            .plugins()
            .iter()
            .any(|p| !p.info.flavors.is_empty() && p.info.scenarios.contains(&scenario))
    }

    /// The built-in that takes over from a plugin file that failed with
    /// `error`, when the plugin's failure policy says so and a built-in
    /// serves the scenario for any flavour; with the kind of failure.
    fn fallback_for(
        &self,
        selection: &Selection,
        error: &PluginError,
    ) -> Option<(Selection, &'static str)> {
        let failed = &selection.plugin;
        let kind = error.misbehaviour()?;
        if matches!(failed.origin, Origin::BuiltIn(_))
            || self.failure.get(&failed.info.name) != Some(&FailurePolicy::Fallback)
        {
            return None;
        }
        let generic = self
            .plugins
            .registry()
            .select(selection.scenario, None)
            .ok()?;
        if !matches!(generic.plugin.origin, Origin::BuiltIn(_)) {
            return None;
        }
        let selection = Selection {
            reason: format!(
                "{} failed and its failure policy is `fallback`: {}",
                failed.info.name, generic.reason
            ),
            ..generic
        };
        Some((selection, kind))
    }

    fn image_kind(&self, obs: &Observation) -> Result<ImageKind, PlannerError> {
        image_kind(obs, &self.cocoon_root)
    }
}

/// The image kind as every host finds it: cloudimg when the source image
/// is an http(s) URL (no disk is read), else when the qcow2 overlay exists
/// under `cocoon_root`, else OCI.
pub fn image_kind<E>(obs: &Observation, cocoon_root: &Path) -> Result<ImageKind, E>
where
    E: From<FactError> + From<ProbeError>,
{
    let source = obs.source_image.as_deref();
    if classify::source_is_cloudimg(source) {
        return Ok(ImageKind::Cloudimg);
    }
    let id = VmId::parse(&obs.vm_id)?;
    let probe = OverlayProbe::open(cocoon_root)?;
    Ok(classify::image_kind(source, probe.overlay_exists(&id)?))
}

/// The `--output json` document (schema in docs/cli.md).
#[derive(Debug, Serialize)]
pub struct PlanReport<'a> {
    pub pod: &'a str,
    pub vm: VmReport<'a>,
    pub needs_fixup: bool,
    pub scenario: &'static str,
    pub rule: u8,
    pub reason: String,
    pub image: &'static str,
    pub plugins: Vec<PluginReport<'a>>,
    /// The VM's guest flavour (annotation `vm.cocoonstack.io/guest-flavor`),
    /// `null` when it names none or no fixup is needed.
    pub flavor: Option<&'a str>,
    /// One entry per scenario for which no plugin declares that flavour,
    /// so the generic plugin planned it.
    pub flavor_unmatched: Vec<FlavorUnmatched<'a>>,
    pub dialect: Option<plan::Dialect>,
    pub steps: &'a [plan::Step],
    pub exec: &'a [String],
    pub script: Option<&'a str>,
    pub hint: Option<&'a str>,
    /// Whether the VM is the pod's own (spec section 2); set by callers
    /// that have the pod, absent from the JSON otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binding: Option<Verdict>,
}

/// A scenario planned by the generic plugin although the VM names a guest
/// flavour ([`PlanPart::unmatched_flavor`]).
#[derive(Debug, Serialize)]
pub struct FlavorUnmatched<'a> {
    pub flavor: &'a str,
    pub scenario: &'static str,
    /// The plugin that planned it instead, by name.
    pub planned_by: &'a str,
    /// Its source: `built-in:<name>` or the file path.
    pub source: String,
    /// The same in one sentence, with what to check.
    pub message: String,
}

#[derive(Debug, Serialize)]
pub struct VmReport<'a> {
    pub name: &'a str,
    pub id: &'a str,
}

#[derive(Debug, Serialize)]
pub struct PluginReport<'a> {
    pub name: &'a str,
    pub version: &'a str,
    pub sha256: &'a str,
    pub source: String,
    pub scenario: &'static str,
    pub why: &'a str,
    pub fuel_used: u64,
    pub peak_memory_bytes: usize,
    /// The plugin that was selected first and failed, when this built-in
    /// took its place ([`Fallback::message`]); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
}

impl PlanOutcome {
    /// The JSON view of this outcome.
    pub fn report<'a>(&'a self, obs: &'a Observation) -> PlanReport<'a> {
        let composed = self.composed.as_ref();
        PlanReport {
            pod: &obs.pod,
            vm: VmReport {
                name: &obs.vm_name,
                id: &obs.vm_id,
            },
            needs_fixup: self.decision.needs_fixup(),
            scenario: self.scenario.map_or("none", Scenario::as_str),
            rule: self.decision.rule.number(),
            reason: self.decision.rule.to_string(),
            image: match self.image {
                ImageKind::Cloudimg => "cloudimg",
                ImageKind::Oci => "oci",
                ImageKind::Unknown => "unknown",
            },
            plugins: composed
                .map_or(&[][..], |c| c.parts.as_slice())
                .iter()
                .map(|p| PluginReport {
                    name: &p.selection.plugin.info.name,
                    version: &p.selection.plugin.info.version,
                    sha256: &p.selection.plugin.sha256,
                    source: p.selection.plugin.origin.to_string(),
                    scenario: p.selection.scenario.as_str(),
                    why: &p.selection.reason,
                    fuel_used: p.stats.fuel_used,
                    peak_memory_bytes: p.stats.peak_memory_bytes,
                    fallback: p
                        .fallback
                        .as_ref()
                        .map(|f| f.message(p.selection.scenario, &p.selection.plugin)),
                })
                .collect(),
            flavor: composed.and_then(|c| c.facts.flavor.as_ref().map(|f| f.as_str())),
            flavor_unmatched: composed
                .map_or(&[][..], |c| c.parts.as_slice())
                .iter()
                .filter_map(|p| {
                    let flavor = p.selection.unmatched_flavor.as_ref()?;
                    Some(FlavorUnmatched {
                        flavor: flavor.as_str(),
                        scenario: p.selection.scenario.as_str(),
                        planned_by: &p.selection.plugin.info.name,
                        source: p.selection.plugin.origin.to_string(),
                        message: p.unmatched_flavor()?,
                    })
                })
                .collect(),
            dialect: composed.map(|c| c.plan.dialect),
            steps: composed.map_or(&[], |c| c.plan.steps.as_slice()),
            exec: composed.map_or(&[], |c| c.exec.as_slice()),
            script: composed.map(|c| c.script.as_str()),
            hint: composed.map(|c| c.hint.as_str()),
            binding: None,
        }
    }
}
