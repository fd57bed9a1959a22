//! The plan path, end to end: observation -> classification -> image kind ->
//! validated facts -> plugin selection -> plugin calls -> composed plan ->
//! rendered exec argv and hint.
//!
//! [`Planner`] is built once (it owns the plugin engine) and called per VM.

use std::path::PathBuf;

use serde::Serialize;

use crate::binding::Verdict;
use crate::classify::{self, Decision, Fixup, Scenario};
use crate::facts::{FactError, ImageKind, Observation, VmFacts, VmId};
use crate::plan::{self, Plan, PlanError, ScriptHeader};
use crate::plugin::registry::NoPlugin;
use crate::plugin::{
    CallStats, EngineOptions, LoadError, LoadFailure, PluginError, PluginHost, Selection,
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
}

impl Default for PlannerOptions {
    fn default() -> Self {
        PlannerOptions {
            engine: EngineOptions::default(),
            cocoon_root: PathBuf::from(crate::probe::DEFAULT_COCOON_ROOT),
            plugin_dir: None,
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

    /// Render a checked, composed plan: the exec argv, and the hint script
    /// under a header naming the scenarios, the VM and each plugin's digest.
    pub fn render(
        facts: &VmFacts,
        scenarios: &[Scenario],
        parts: Vec<PlanPart>,
        plan: Plan,
    ) -> Self {
        let scenario_names: Vec<&str> = scenarios.iter().map(|s| s.as_str()).collect();
        let plugins: Vec<String> = parts
            .iter()
            .map(|p| {
                let plugin = &p.selection.plugin;
                format!(
                    "{} {} sha256:{}",
                    plugin.info.name,
                    plugin.info.version,
                    &plugin.sha256[..12]
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
        let script = plan::render_script(&plan, &header);
        let hint = plan::hint_base64(&script);
        let exec = plan::render_exec(&plan);
        ComposedPlan {
            facts: facts.clone(),
            parts,
            plan,
            exec,
            script,
            hint,
        }
    }
}

/// The answer for one VM.
#[derive(Debug, Clone)]
pub struct PlanOutcome {
    pub decision: Decision,
    /// The reported scenario; `None` when no fixup is needed.
    pub scenario: Option<Scenario>,
    pub image: ImageKind,
    /// `None` when no fixup is needed.
    pub composed: Option<ComposedPlan>,
}

/// Turns observations into plans. Build once, call per VM.
#[derive(Debug)]
pub struct Planner {
    plugins: PluginHost,
    cocoon_root: PathBuf,
}

impl Planner {
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
        let mut plugins = PluginHost::new(options.engine)?;
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
        Ok((
            Planner {
                plugins,
                cocoon_root: options.cocoon_root,
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
            return Ok(PlanOutcome {
                decision,
                scenario: None,
                image: ImageKind::Unknown,
                composed: None,
            });
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
        let mut parts = Vec::new();
        let mut plans = Vec::new();
        for &scenario in scenarios {
            let selection = registry.select(scenario, facts.flavor.as_ref())?;
            let (plan, stats) = self.plugins.plan(&selection.plugin, scenario, facts)?;
            parts.push(PlanPart {
                steps: plan.steps.len(),
                selection,
                stats,
            });
            plans.push(plan);
        }
        let names = || {
            parts
                .iter()
                .map(|p| p.selection.plugin.info.name.as_str())
                .collect::<Vec<_>>()
                .join(" + ")
        };
        let plan = plan::compose(plans).map_err(|source| PlannerError::Compose {
            plugins: names(),
            source,
        })?;
        plan.check(&self.plugins.limits().plan)
            .map_err(|source| PlannerError::Compose {
                plugins: names(),
                source,
            })?;
        let plugins = names();
        let composed = ComposedPlan::render(facts, scenarios, parts, plan);
        plan::check_rendered(&composed.plan, &composed.exec, &composed.hint)
            .map_err(|source| PlannerError::Compose { plugins, source })?;
        Ok(composed)
    }

    /// Cloudimg when the source image is an http(s) URL, else when the
    /// overlay exists under the cocoon root.
    fn image_kind(&self, obs: &Observation) -> Result<ImageKind, PlannerError> {
        let source = obs.source_image.as_deref();
        if classify::image_kind(source, false) == ImageKind::Cloudimg {
            return Ok(ImageKind::Cloudimg);
        }
        let id = VmId::parse(&obs.vm_id)?;
        let probe = OverlayProbe::open(&self.cocoon_root)?;
        Ok(classify::image_kind(source, probe.overlay_exists(&id)?))
    }
}

/// The `--output json` document (schema in the README).
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
