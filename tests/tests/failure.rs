//! A plugin's failure policy (`[plugin_failure]`): `fail` (the default)
//! fails the pod with the plugin's error; `fallback` plans with the
//! built-in that serves the scenario for any flavour, and the daemon says
//! so in a Warning event naming both plugins and in a metric.

use fixup_core::decision::FixupEnd;
use fixup_core::decision::Readiness;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fixup_core::classify::Scenario;
use fixup_core::decision::Trigger;
use fixup_core::planner::{FailurePolicy, Planner, PlannerError, PlannerOptions};
use fixup_core::plugin::{EngineOptions, Limits, Origin, PluginError};
use fixup_host::host::{Host, HostConfig};
use fixup_host::metrics::Metrics;
use fixup_host::pods::{MemoryPods, reasons};
use fixup_host::ready::LeaseWatcher;
use fixup_tests::facts;
use rstest::rstest;
use tokio_util::sync::CancellationToken;

const NIC: [(&str, Option<&str>); 1] = [("52:54:00:aa:bb:01", Some("10.0.0.5/24"))];

/// A planner with the built-ins and the hostile plugin (flavour `hostile`)
/// from a plugin directory, the hostile plugin's failure policy `policy`
/// (`None`: not configured). Small fuel and deadline, so a spin ends soon.
fn planner(policy: Option<FailurePolicy>) -> (Planner, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    std::fs::copy(env!("PLUGIN_HOSTILE"), plugins.join("hostile.wasm")).expect("copy");
    let failure: BTreeMap<String, FailurePolicy> = policy
        .map(|p| ("hostile".to_owned(), p))
        .into_iter()
        .collect();
    let (planner, failures) = Planner::new(PlannerOptions {
        engine: EngineOptions {
            limits: Limits {
                fuel: 20_000_000,
                deadline: Duration::from_millis(500),
                ..Limits::default()
            },
            ..EngineOptions::default()
        },
        cocoon_root: dir.path().to_owned(),
        plugin_dir: Some(plugins),
        failure,
    })
    .expect("planner");
    assert!(failures.is_empty(), "{failures:?}");
    (planner, dir)
}

fn is_builtin(origin: &Origin) -> bool {
    matches!(origin, Origin::BuiltIn(_))
}

/// Each way a plugin misbehaves, with the kind the fallback records.
#[rstest]
#[case::declines("decline", "unsupported")]
#[case::spins("spin", "fuel")]
#[case::balloons("balloon", "memory")]
#[case::panics("panic", "panic")]
#[case::reads_a_file("snoop-file", "denied-import")]
#[case::too_many_steps("wide", "bad-plan")]
fn a_plugin_with_the_fallback_policy_is_replaced_by_the_builtin(
    #[case] behaviour: &str,
    #[case] kind: &str,
) {
    let facts = facts(behaviour, Some("hostile"), &NIC);
    let (fallback, _dir) = planner(Some(FailurePolicy::Fallback));
    let composed = fallback
        .plan_scenarios(&facts, &[Scenario::OciNetworkd])
        .expect("the built-in plans in the failed plugin's place");
    let part = &composed.parts[0];
    let used = &part.selection.plugin;
    assert!(is_builtin(&used.origin), "{}", used.origin);
    assert_eq!(used.info.name, "oci-networkd");
    let record = part.fallback.as_ref().expect("the fallback is recorded");
    assert_eq!(record.failed.info.name, "hostile");
    assert_eq!(record.kind, kind, "{}", record.error);
    let message = record.message(Scenario::OciNetworkd, used);
    for needle in [
        "hostile",
        "oci-networkd",
        "fallback",
        &record.failed.info.version,
    ] {
        assert!(message.contains(needle), "{needle} in: {message}");
    }
    // The plan is exactly the built-in's for the same facts.
    let builtin = fallback
        .plugins()
        .registry()
        .select(Scenario::OciNetworkd, None)
        .expect("the generic plugin");
    let (plan, _) = fallback
        .plugins()
        .plan(&builtin.plugin, Scenario::OciNetworkd, &facts)
        .expect("the built-in plans");
    assert_eq!(composed.plan, plan);

    // Without the policy, or with `fail`, the pod fails with the error.
    for policy in [None, Some(FailurePolicy::Fail)] {
        let (fail, _dir) = planner(policy);
        let err = fail
            .plan_scenarios(&facts, &[Scenario::OciNetworkd])
            .expect_err("no fallback without the policy");
        assert!(
            matches!(&err, PlannerError::Plugin(e) if e.misbehaviour() == Some(kind)),
            "{policy:?}: {err}"
        );
    }
}

#[test]
fn a_plugin_that_rejects_the_facts_fails_the_pod_whatever_its_policy() {
    let (planner, _dir) = planner(Some(FailurePolicy::Fallback));
    let err = planner
        .plan_scenarios(
            &facts("reject", Some("hostile"), &NIC),
            &[Scenario::OciNetworkd],
        )
        .expect_err("the facts are wrong, not the plugin");
    assert!(
        matches!(&err, PlannerError::Plugin(PluginError::InvalidFact { plugin, .. }) if plugin == "hostile"),
        "{err}"
    );
}

#[test]
fn a_plugin_that_works_is_used_under_the_fallback_policy() {
    let (planner, _dir) = planner(Some(FailurePolicy::Fallback));
    let composed = planner
        .plan_scenarios(
            &facts("web-0", Some("hostile"), &NIC),
            &[Scenario::OciNetworkd],
        )
        .expect("plans");
    let part = &composed.parts[0];
    assert_eq!(part.selection.plugin.info.name, "hostile");
    assert!(part.fallback.is_none());
}

#[tokio::test]
async fn the_daemon_tells_of_a_fallback_in_a_warning_event_and_a_metric() {
    let (planner, dir) = planner(Some(FailurePolicy::Fallback));
    let pods = MemoryPods::new();
    pods.insert(fixup_tests::hostile_clone("web-0"));
    let guest = fixup_tests::Guest::new("hostile-decline");
    let leases = LeaseWatcher::new(dir.path().join("leases.json"), Duration::from_millis(20))
        .expect("lease watcher");
    let metrics = Arc::new(Metrics::new());
    let host = Host::new(
        Arc::new(planner),
        guest.clone(),
        pods,
        Arc::new(leases),
        HostConfig::default(),
        metrics.clone(),
    );
    let summary = host
        .handle(
            "default",
            "web-0",
            Trigger::Event,
            &CancellationToken::new(),
        )
        .await
        .expect("handled");
    assert_eq!(summary.fixup, Some(FixupEnd::Done), "{summary:?}");
    assert_eq!(summary.readiness, Some(Readiness::Ready), "{summary:?}");
    assert_eq!(guest.execs().len(), 1);

    let events = host.pods().events();
    let fallback: Vec<_> = events
        .iter()
        .filter(|(_, e)| e.reason == reasons::PLUGIN_FALLBACK)
        .collect();
    assert_eq!(fallback.len(), 1, "{events:?}");
    let message = &fallback[0].1.message;
    assert!(
        message.contains("plugin hostile") && message.contains("built-in oci-networkd"),
        "{message}"
    );
    let exposition = metrics.encode();
    assert!(
        exposition.contains(r#"plugin_fallbacks_total{plugin="hostile",kind="unsupported"} 1"#),
        "{exposition}"
    );
}
