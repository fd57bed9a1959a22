//! The native baseline: the same plan without WebAssembly.
//!
//! [`plan`] is `Planner::plan` with one difference: where the planner
//! instantiates a plugin in a fresh sandbox and calls it through the
//! component model, this calls the plugin crate's `Plugin::plan` as plain
//! Rust (the plugin crates are also native rlibs), with SDK types built from
//! the same validated facts. Classification, the overlay probe, validation,
//! plugin selection, the per-plugin and whole-plan checks, composition and
//! rendering are the host's own functions, called the same way, so the
//! ratio between the two is the price of the sandbox.
//!
//! [`assert_same`] checks that both produce the same plan, exec argv,
//! script and hint; the benches call it in their setup.

use std::path::Path;

use cocoon_fixup_sdk as sdk;
use cocoon_fixup_sdk::Plugin as _;
use fixup_core::classify::{self, Scenario};
use fixup_core::facts::{self, ImageKind, Observation, VmFacts, VmId};
use fixup_core::plan::{self, Plan};
use fixup_core::planner::{ComposedPlan, PlanOutcome, PlanPart, Planner};
use fixup_core::plugin::CallStats;
use fixup_core::probe::OverlayProbe;

/// `Planner::plan`, with the plugins called natively.
pub fn plan(
    planner: &Planner,
    cocoon_root: &Path,
    obs: &Observation,
) -> anyhow::Result<PlanOutcome> {
    let decision = classify::classify(obs);
    if decision.fixup.is_none() {
        return Ok(PlanOutcome {
            decision,
            scenario: None,
            image: ImageKind::Unknown,
            composed: None,
        });
    }
    let image = if decision.needs_image_kind() {
        image_kind(cocoon_root, obs)?
    } else {
        ImageKind::Unknown
    };
    let facts = VmFacts::validate(obs, image)?;
    let scenarios = decision.scenarios(image);
    let composed = plan_scenarios(planner, &facts, &scenarios)?;
    Ok(PlanOutcome {
        decision,
        scenario: decision.scenario(image),
        image,
        composed: Some(composed),
    })
}

/// As `Planner::image_kind`: the URL, else the overlay probe.
fn image_kind(cocoon_root: &Path, obs: &Observation) -> anyhow::Result<ImageKind> {
    let source = obs.source_image.as_deref();
    if classify::image_kind(source, false) == ImageKind::Cloudimg {
        return Ok(ImageKind::Cloudimg);
    }
    let id = VmId::parse(&obs.vm_id)?;
    let probe = OverlayProbe::open(cocoon_root)?;
    Ok(classify::image_kind(source, probe.overlay_exists(&id)?))
}

/// As `Planner::plan_scenarios`, with native plugin calls.
pub fn plan_scenarios(
    planner: &Planner,
    facts: &VmFacts,
    scenarios: &[Scenario],
) -> anyhow::Result<ComposedPlan> {
    let host = planner.plugins();
    let limits = &host.limits().plan;
    let mut parts = Vec::new();
    let mut plans = Vec::new();
    for &scenario in scenarios {
        let selection = host.registry().select(scenario, facts.flavor.as_ref())?;
        let plan = call(&selection.plugin.info.name, scenario, facts)?;
        plan.check(limits)?;
        parts.push(PlanPart {
            steps: plan.steps.len(),
            selection,
            stats: CallStats::default(),
            fallback: None,
        });
        plans.push(plan);
    }
    let plan = plan::compose(plans)?;
    plan.check(limits)?;
    Ok(ComposedPlan::render(facts, scenarios, parts, plan))
}

/// One plugin's plan, called natively: the same conversion the host's
/// bindings do, without the canonical ABI and the sandbox.
pub fn call(plugin: &str, scenario: Scenario, facts: &VmFacts) -> anyhow::Result<Plan> {
    let facts = facts_to_sdk(facts);
    let scenario = scenario_to_sdk(scenario);
    let result = match plugin {
        "cloudimg" => fixup_plugin_cloudimg::Cloudimg::plan(scenario, &facts),
        "oci-networkd" => fixup_plugin_oci_networkd::OciNetworkd::plan(scenario, &facts),
        "fc-mac" => fixup_plugin_fc_mac::FcMac::plan(scenario, &facts),
        "windows-pnp" => fixup_plugin_windows_pnp::WindowsPnp::plan(scenario, &facts),
        other => anyhow::bail!("no native build of plugin {other}"),
    };
    match result {
        Ok(plan) => Ok(plan_from_sdk(plan)),
        Err(e) => anyhow::bail!("plugin {plugin} refused {scenario}: {e:?}"),
    }
}

/// Fail loudly when the native and the WebAssembly outcomes differ in
/// anything a user sees: the benchmark would compare different work.
pub fn assert_same(wasm: &PlanOutcome, native: &PlanOutcome) {
    assert_eq!(wasm.decision, native.decision, "decision");
    assert_eq!(wasm.scenario, native.scenario, "scenario");
    assert_eq!(wasm.image, native.image, "image kind");
    match (&wasm.composed, &native.composed) {
        (Some(w), Some(n)) => assert_same_composed(w, n),
        (None, None) => {}
        _ => panic!("one outcome has a plan and the other has none"),
    }
}

/// As [`assert_same`], for composed plans.
pub fn assert_same_composed(w: &ComposedPlan, n: &ComposedPlan) {
    assert_eq!(w.facts, n.facts, "facts");
    assert_eq!(w.plan, n.plan, "plan steps");
    assert_eq!(w.exec, n.exec, "exec argv");
    assert_eq!(w.script, n.script, "hint script");
    assert_eq!(w.hint, n.hint, "hint");
    let names = |c: &ComposedPlan| {
        c.parts
            .iter()
            .map(|p| p.selection.plugin.info.name.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(w), names(n), "plugins");
}

pub fn scenario_to_sdk(s: Scenario) -> sdk::Scenario {
    match s {
        Scenario::Cloudimg => sdk::Scenario::Cloudimg,
        Scenario::OciNetworkd => sdk::Scenario::OciNetworkd,
        Scenario::FcMac => sdk::Scenario::FcMac,
        Scenario::WindowsPnp => sdk::Scenario::WindowsPnp,
        Scenario::DhcpRecovery => sdk::Scenario::DhcpRecovery,
        Scenario::Prepare => sdk::Scenario::Prepare,
    }
}

fn ipv4_to_sdk(a: std::net::Ipv4Addr) -> sdk::Ipv4Address {
    sdk::Ipv4Address::new(a.octets())
}

/// Host facts as the SDK types a plugin receives.
pub fn facts_to_sdk(f: &VmFacts) -> sdk::VmFacts {
    sdk::VmFacts {
        name: f.name.as_str().to_owned(),
        id: f.id.as_str().to_owned(),
        backend: match f.backend {
            facts::Backend::CloudHypervisor => sdk::Backend::CloudHypervisor,
            facts::Backend::Firecracker => sdk::Backend::Firecracker,
        },
        os: match f.os {
            facts::GuestOs::Linux => sdk::GuestOs::Linux,
            facts::GuestOs::Windows => sdk::GuestOs::Windows,
            facts::GuestOs::Android => sdk::GuestOs::Android,
            facts::GuestOs::Unknown => sdk::GuestOs::Unknown,
        },
        image: match f.image {
            ImageKind::Cloudimg => sdk::ImageKind::Cloudimg,
            ImageKind::Oci => sdk::ImageKind::Oci,
            ImageKind::Unknown => sdk::ImageKind::Unknown,
        },
        boot: match f.boot {
            facts::BootKind::Clone => sdk::BootKind::Clone,
            facts::BootKind::Fork => sdk::BootKind::Fork,
            facts::BootKind::Wake => sdk::BootKind::Wake,
            facts::BootKind::Resumed => sdk::BootKind::Resumed,
            facts::BootKind::Parent => sdk::BootKind::Parent,
        },
        nics: f
            .nics
            .iter()
            .map(|n| sdk::Nic {
                mac: sdk::MacAddress::new(n.mac.0),
                static_ipv4: n.static_ipv4.map(|s| sdk::StaticIpv4 {
                    address: ipv4_to_sdk(s.address),
                    prefix: s.prefix,
                    gateway: s.gateway.map(ipv4_to_sdk),
                }),
            })
            .collect(),
        flavor: f.flavor.as_ref().map(|f| f.as_str().to_owned()),
    }
}

/// An SDK plan as the host's domain type.
pub fn plan_from_sdk(p: sdk::Plan) -> Plan {
    Plan {
        dialect: match p.dialect {
            sdk::Dialect::PosixSh => plan::Dialect::PosixSh,
            sdk::Dialect::Powershell => plan::Dialect::PowerShell,
        },
        steps: p
            .steps
            .into_iter()
            .map(|s| plan::Step {
                description: s.description,
                phase: match s.phase {
                    sdk::Phase::Prepare => plan::Phase::Prepare,
                    sdk::Phase::Link => plan::Phase::Link,
                    sdk::Phase::Configure => plan::Phase::Configure,
                },
                best_effort: s.best_effort,
                action: match s.action {
                    sdk::Action::Run(argv) => plan::StepAction::Run(argv),
                    sdk::Action::WriteFile(w) => plan::StepAction::WriteFile(plan::WriteFile {
                        path: w.path,
                        content: w.content,
                        mode: w.mode,
                        parents: w.parents,
                    }),
                    sdk::Action::RemoveFiles(paths) => plan::StepAction::RemoveFiles(paths),
                    sdk::Action::NameLink(l) => {
                        let o = l.mac.octets;
                        plan::StepAction::NameLink(plan::NameLink {
                            mac: facts::MacAddr([o.0, o.1, o.2, o.3, o.4, o.5]),
                            name: l.name,
                        })
                    }
                },
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::{self, Case};

    /// The baseline is only a baseline if it makes the same plans.
    #[test]
    fn native_and_wasm_plans_are_equal() {
        let root = tempfile::tempdir().unwrap();
        let planner = cases::planner(root.path(), None).unwrap();
        for case in Case::ALL {
            for i in [0, 7] {
                let obs = case.observation(i);
                let wasm = planner.plan(&obs).unwrap();
                let native = plan(&planner, root.path(), &obs).unwrap();
                assert_same(&wasm, &native);
                let parts = native.composed.unwrap().parts.len();
                assert_eq!(parts, if case == Case::FcMac { 2 } else { 1 });
            }
        }
    }
}
