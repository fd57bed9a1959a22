//! A vendor plugin from a plugin directory: the example `nm-keyfile`
//! (`examples/plugins/nm-keyfile`, built from source by `build.rs` the way a
//! vendor builds it) replaces the built-in `oci-networkd` for the RHEL
//! family only, and the plan report says which plugin was chosen and why.

use std::path::Path;

use fixup_core::classify::Scenario;
use fixup_core::facts::{ImageKind, Observation, Overrides, PodInput, VmFacts, VmInspect};
use fixup_core::planner::{PlanOutcome, Planner, PlannerOptions};
use fixup_core::plugin::EngineOptions;
use fixup_kit::{self as kit, TestOptions};
use fixup_tests::{observation, pod_json, vm_json, workspace};
use rstest::rstest;
use serde_json::Value;
use tempfile::TempDir;

/// The file name the plugin is shipped under.
const SHIPPED: &str = "nm-keyfile.wasm";

/// A planner over the built-ins and a plugin directory holding only
/// nm-keyfile, with an empty cocoon root (no overlay: OCI unless the source
/// image says cloudimg). The directories live as long as the planner.
struct Node {
    planner: Planner,
    plugin_dir: TempDir,
    _cocoon_root: TempDir,
}

fn node() -> Node {
    let plugin_dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(env!("PLUGIN_NM_KEYFILE"), plugin_dir.path().join(SHIPPED))
        .expect("copy the built plugin");
    let cocoon_root = tempfile::tempdir().expect("tempdir");
    let options = PlannerOptions {
        cocoon_root: cocoon_root.path().to_owned(),
        plugin_dir: Some(plugin_dir.path().to_owned()),
        ..PlannerOptions::default()
    };
    let (planner, failures) = Planner::new(options).expect("planner starts");
    assert!(failures.is_empty(), "{failures:?}");
    Node {
        planner,
        plugin_dir,
        _cocoon_root: cocoon_root,
    }
}

fn report(outcome: &PlanOutcome, obs: &Observation) -> Value {
    serde_json::to_value(outcome.report(obs)).expect("serialises")
}

/// `(name, source, why)` of each plugin in the report, in plan order.
fn chosen(report: &Value) -> Vec<(String, String, String)> {
    report["plugins"]
        .as_array()
        .expect("plugins array")
        .iter()
        .map(|p| {
            let text = |key: &str| p[key].as_str().expect("string").to_owned();
            (text("name"), text("source"), text("why"))
        })
        .collect()
}

/// A managed Linux clone on `backend` with one static NIC, of `flavor`.
fn clone_observation(
    backend: &str,
    flavor: Option<&str>,
    source_image: Option<&str>,
) -> Observation {
    let mut annotations = vec![
        ("vm.cocoonstack.io/name", "db-0"),
        ("cocoonset.cocoonstack.io/managed", "true"),
        ("cocoonset.cocoonstack.io/os", "linux"),
        ("vm.cocoonstack.io/backend", backend),
    ];
    if let Some(f) = flavor {
        annotations.push(("vm.cocoonstack.io/guest-flavor", f));
    }
    let pod = PodInput::from_json(&pod_json(&annotations), "pod.json").expect("pod parses");
    let vm = VmInspect::from_json(
        &vm_json(
            "vm-5e1d0b7a",
            &[("52:54:00:5e:1d:01", Some("10.88.7.14/24"))],
        ),
        "vm.json",
    )
    .expect("vm parses");
    let overrides = Overrides {
        source_image: source_image.map(str::to_owned),
        ..Overrides::default()
    };
    Observation::new(&pod, &vm, &overrides)
}

#[test]
fn the_example_rhel_pod_gets_nm_keyfile_from_the_plugin_directory() {
    let node = node();
    let dir = workspace().join("examples/plugins/nm-keyfile/example");
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).expect("example file");
    let pod = PodInput::from_json(&read("pod.json"), "pod.json").expect("pod parses");
    let vm = VmInspect::from_json(&read("vm.json"), "vm.json").expect("vm parses");
    let obs = Observation::new(&pod, &vm, &Overrides::default());

    let outcome = node.planner.plan(&obs).expect("plans");
    let report = report(&outcome, &obs);
    assert_eq!(report["scenario"], "oci-networkd");
    assert_eq!(report["image"], "oci");

    let [(name, source, why)] = chosen(&report).try_into().expect("one plugin");
    assert_eq!(name, "nm-keyfile");
    assert_eq!(
        Path::new(&source),
        node.plugin_dir.path().join(SHIPPED),
        "the source is the file in the plugin directory"
    );
    assert!(why.contains("declares flavour `rhel`"), "{why}");
    assert!(
        why.contains("in place of the generic built-in:oci-networkd"),
        "{why}"
    );
    let plugin = &report["plugins"][0];
    assert_eq!(plugin["scenario"], "oci-networkd");
    assert_eq!(plugin["sha256"].as_str().map(str::len), Some(64));

    // The plan is the plugin's, through the host's checks and rendering.
    let steps = report["steps"].as_array().expect("steps");
    let keyfile = steps
        .iter()
        .find(|s| {
            s["write_file"]["path"]
                == "/etc/NetworkManager/system-connections/cocoon-5254005e1d01.nmconnection"
        })
        .expect("a keyfile for the static NIC");
    assert_eq!(keyfile["write_file"]["mode"], "0600");
    let content = keyfile["write_file"]["content"].as_str().expect("content");
    assert!(
        content.contains("mac-address=52:54:00:5e:1d:01\n"),
        "{content}"
    );
    assert!(
        content.contains("address1=10.88.7.14/24,10.88.7.1\n"),
        "{content}"
    );
    let runs: Vec<&Value> = steps.iter().filter_map(|s| s.get("run")).collect();
    assert_eq!(
        runs,
        [
            &serde_json::json!(["nmcli", "connection", "reload"]),
            &serde_json::json!([
                "nmcli",
                "--wait",
                "30",
                "connection",
                "up",
                "id",
                "cocoon-5254005e1d01"
            ]),
            &serde_json::json!([
                "nmcli",
                "--wait",
                "0",
                "connection",
                "up",
                "id",
                "cocoon-5254005e1d02"
            ]),
        ]
    );
    let script = report["script"].as_str().expect("script");
    assert!(script.contains("nm-keyfile 0.1.0 sha256:"), "{script}");
    assert!(!script.contains("systemd-networkd"), "{script}");
}

#[rstest]
#[case::rhel(Some("rhel"), "nm-keyfile", "declares flavour `rhel`")]
#[case::rocky(Some("rocky"), "nm-keyfile", "declares flavour `rocky`")]
#[case::fedora(Some("fedora"), "nm-keyfile", "declares flavour `fedora`")]
#[case::networkmanager(
    Some("networkmanager"),
    "nm-keyfile",
    "declares flavour `networkmanager`"
)]
#[case::ubuntu(Some("ubuntu"), "oci-networkd", "no plugin declares flavour `ubuntu`")]
#[case::no_flavour(None, "oci-networkd", "serves oci-networkd for any flavour")]
fn only_the_declared_flavours_leave_the_builtin(
    #[case] flavor: Option<&str>,
    #[case] plugin: &str,
    #[case] why_contains: &str,
) {
    let node = node();
    let obs = clone_observation("cloud-hypervisor", flavor, None);
    let outcome = node.planner.plan(&obs).expect("plans");
    let report = report(&outcome, &obs);
    assert_eq!(report["scenario"], "oci-networkd");
    let [(name, source, why)] = chosen(&report).try_into().expect("one plugin");
    assert_eq!(name, plugin);
    assert!(why.contains(why_contains), "{why}");
    if plugin == "oci-networkd" {
        assert_eq!(source, "built-in:oci-networkd");
    }
}

#[test]
fn a_rhel_cloudimg_guest_keeps_the_builtin_cloudimg() {
    let node = node();
    let obs = clone_observation(
        "cloud-hypervisor",
        Some("rhel"),
        Some("https://images.example/rhel-9.qcow2"),
    );
    let outcome = node.planner.plan(&obs).expect("plans");
    let report = report(&outcome, &obs);
    assert_eq!(report["scenario"], "cloudimg");
    let [(name, source, why)] = chosen(&report).try_into().expect("one plugin");
    assert_eq!(
        (name.as_str(), source.as_str()),
        ("cloudimg", "built-in:cloudimg")
    );
    assert!(why.contains("no plugin declares flavour `rhel`"), "{why}");
}

#[test]
fn a_rhel_firecracker_clone_composes_fc_mac_with_nm_keyfile() {
    let node = node();
    let obs = clone_observation("firecracker", Some("rhel"), None);
    let outcome = node.planner.plan(&obs).expect("plans");
    let names: Vec<String> = chosen(&report(&outcome, &obs))
        .into_iter()
        .map(|(name, _, _)| name)
        .collect();
    assert_eq!(names, ["fc-mac", "nm-keyfile"]);
}

#[rstest]
#[case::almalinux(Some("almalinux"), "nm-keyfile")]
#[case::networkmanager(Some("networkmanager"), "nm-keyfile")]
#[case::ubuntu(Some("ubuntu"), "oci-networkd")]
#[case::no_flavour(None, "oci-networkd")]
fn dhcp_recovery_follows_the_flavour_too(#[case] flavor: Option<&str>, #[case] plugin: &str) {
    let node = node();
    let obs = observation("db-0", flavor, &[("52:54:00:5e:1d:02", None)]);
    let facts = VmFacts::validate(&obs, ImageKind::Unknown).expect("facts");
    let composed = node
        .planner
        .plan_scenarios(&facts, &[Scenario::DhcpRecovery])
        .expect("plans");
    let [part] = composed.parts.as_slice() else {
        panic!("one plugin: {:?}", composed.parts);
    };
    assert_eq!(part.selection.plugin.info.name, plugin);
    let restarts = composed.script.contains("nmcli");
    assert_eq!(restarts, plugin == "nm-keyfile", "{}", composed.script);
}

/// The case files shipped with the example, through the same runner as
/// `cocoon-fixup plugin test`.
#[test]
fn nm_keyfile_passes_its_case_files() {
    let report = kit::test_plugin(
        kit::engine_options(&EngineOptions::default()),
        Path::new(env!("PLUGIN_NM_KEYFILE")),
        &workspace().join("examples/plugins/nm-keyfile/cases"),
        TestOptions::default(),
    )
    .expect("the kit runs");
    assert!(report.success(), "{report}");
    assert_eq!(report.plugin.name, "nm-keyfile");
    assert_eq!(report.passed, 4, "{report}");
}

/// The vendor path of docs/plugins.md, end to end: `plugin new` writes a
/// crate outside this workspace; its own `cargo test` passes; it builds for
/// wasm32-wasip2; its example case passes `plugin test`; and `plan` picks
/// it from a plugin directory for its flavour.
#[test]
fn a_plugin_from_the_template_builds_tests_and_is_picked() {
    let dir = TempDir::new().expect("tempdir");
    let sdk = fixup_kit::template::default_sdk_dir();
    let crate_dir = fixup_kit::template::new_plugin("acme-net", dir.path(), &sdk)
        .expect("the template writes a crate");
    // A target dir kept between runs, so a rerun costs seconds.
    let target = workspace().join("target").join("template-check");
    let cargo = |args: &[&str]| {
        let mut cmd = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()));
        cmd.args(args)
            .current_dir(&crate_dir)
            .env("CARGO_TARGET_DIR", &target);
        for var in [
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_BUILD_TARGET",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
        ] {
            cmd.env_remove(var);
        }
        let out = cmd.output().expect("cargo runs");
        assert!(
            out.status.success(),
            "cargo {args:?} in the generated crate failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    cargo(&["test", "--quiet"]);
    cargo(&["build", "--quiet", "--release", "--target", "wasm32-wasip2"]);
    let wasm = target.join("wasm32-wasip2/release/acme_net.wasm");

    let kit_report = kit::test_plugin(
        kit::engine_options(&EngineOptions::default()),
        &wasm,
        &crate_dir.join("cases"),
        TestOptions::default(),
    )
    .expect("the kit runs");
    assert!(kit_report.success(), "{kit_report}");
    assert_eq!(kit_report.passed, 1, "{kit_report}");

    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    std::fs::copy(&wasm, plugins.join("acme-net.wasm")).expect("ship it");
    let root = dir.path().join("cocoon-root");
    std::fs::create_dir_all(&root).expect("cocoon root");
    let (planner, failures) = Planner::new(PlannerOptions {
        cocoon_root: root,
        plugin_dir: Some(plugins),
        ..PlannerOptions::default()
    })
    .expect("planner");
    assert!(failures.is_empty(), "{failures:?}");
    let obs = observation(
        "web-0",
        Some("acme-net"),
        &[("52:54:00:12:34:56", Some("10.0.0.7/24"))],
    );
    let outcome = planner.plan(&obs).expect("plans");
    let chosen = chosen(&report(&outcome, &obs));
    assert_eq!(chosen[0].0, "acme-net", "{chosen:?}");
}

/// An all-DHCP Cloud Hypervisor clone (rule 7) of guest flavour `flavor`,
/// whose lease appears only once something re-runs DHCP (at 1 s after a
/// pass at 0, at 16 s after one at 15 s), with the recovery pass at
/// `pass_ms` and the message it is announced with.
fn all_dhcp_clone(flavor: &str, pass_ms: u64, message: &str) -> Value {
    let vm_name = fixup_core::binding::vm_name_for_pod("prod", "db-0");
    let mut case = serde_json::json!({
        "about": "an all-DHCP clone of a flavoured guest",
        "pod": {"metadata": {
            "name": "db-0", "namespace": "prod", "uid": "u-1",
            "annotations": {
                "cocoonset.cocoonstack.io/managed": "true",
                "vm.cocoonstack.io/id": "vm-1",
                "vm.cocoonstack.io/name": vm_name,
                "vm.cocoonstack.io/backend": "cloud-hypervisor",
                "cocoonset.cocoonstack.io/os": "linux",
                "vm.cocoonstack.io/guest-flavor": flavor,
            }
        }},
        "vm": {
            "id": "vm-1",
            "config": {"name": vm_name, "image": "ghcr.io/acme/rhel:9"},
            "network_configs": [{"mac": "52:54:00:aa:bb:01"}]
        },
        "leases": [{"mac": "52:54:00:aa:bb:01", "ip": "10.0.0.77", "at_ms": pass_ms + 1000}],
        "expect": {
            "result": {"action": "ip-wait", "rule": 7, "readiness": "ready", "ip": "10.0.0.77"},
            "trace": [
                {"at_ms": 0, "inspect": "vm-1"},
                {"at_ms": pass_ms, "event": "PostCloneDHCPRecovery", "message": message},
                {"at_ms": pass_ms, "exec": "recovery", "vm": "vm-1", "timeout_ms": 45000 - pass_ms},
                {"at_ms": pass_ms + 1000, "write": {
                    "vm.cocoonstack.io/ip": "10.0.0.77",
                    "vm.cocoonstack.io/lifecycle-state": "ready"
                }}
            ]
        }
    });
    if flavor == "rhel" && pass_ms > 0 {
        // The claimed flavour, but a hibernate wake: not a clone.
        case["pod"]["metadata"]["annotations"]["vm.cocoonstack.io/restore-from-hibernate"] =
            "true".into();
    }
    case
}

/// A plugin that declares a guest flavour for `dhcp-recovery` claims the
/// all-DHCP clones of that flavour: its recovery plan runs at once, not
/// after the 15 s a generic clone is given to get a lease by itself. A
/// flavour no plugin declares keeps the 15 s, and so does a woken VM of
/// the claimed flavour (not a clone).
#[test]
fn a_flavours_plugin_claims_all_dhcp_clones_and_repairs_them_at_once() {
    use fixup_kit::conformance::{Scenario as Case, replay};
    let node = node();
    let claimed = all_dhcp_clone(
        "rhel",
        0,
        "nm-keyfile claims all-DHCP clones of guest flavour rhel: re-running DHCP on 1 NIC(s) at once",
    );
    let unclaimed = all_dhcp_clone(
        "gentoo",
        15000,
        "no lease after 15s: re-running DHCP on 1 NIC(s)",
    );
    let woken = all_dhcp_clone(
        "rhel",
        15000,
        "no lease after 15s: re-running DHCP on 1 NIC(s)",
    );
    for case in [claimed, unclaimed, woken] {
        let case: Case = serde_json::from_value(case).expect("a scenario");
        let (world, ended) = replay(&case, &node.planner);
        case.check(&world, &ended)
            .unwrap_or_else(|e| panic!("{}: {e}", case.pod["metadata"]["annotations"]));
    }
}

/// The vendor plugin prepares the parents of its flavour (a lowest-priority
/// keyfile that matches any virtio NIC, with a DHCP client id from the MAC);
/// a parent of another flavour is prepared by the built-in, and a Windows
/// parent by none.
#[test]
fn a_flavours_plugin_prepares_its_parents() {
    use fixup_core::planner::Preparation;
    let node = node();
    let plan = |flavor: Option<&str>| {
        let obs = observation("web-0", flavor, &[("52:54:00:12:34:56", None)]);
        node.planner.plan_prepare(&obs).expect("plans")
    };
    let Preparation::Plan { composed, .. } = plan(Some("rhel")) else {
        panic!("a rhel parent is prepared");
    };
    assert_eq!(composed.plugins(), "nm-keyfile");
    assert_eq!(composed.facts.boot, fixup_core::facts::BootKind::Parent);
    assert!(
        composed.script.contains("cocoon_clone.nmconnection"),
        "{}",
        composed.script
    );
    assert!(
        composed.script.contains("dhcp-client-id=mac"),
        "{}",
        composed.script
    );
    let Preparation::Plan { composed, .. } = plan(Some("gentoo")) else {
        panic!("a parent of an undeclared flavour is prepared by the built-in");
    };
    assert_eq!(composed.plugins(), "oci-networkd");
    let mut windows = observation("desk-0", None, &[("52:54:00:12:34:57", None)]);
    windows.os = fixup_core::facts::GuestOs::Windows;
    assert!(matches!(
        node.planner.plan_prepare(&windows),
        Ok(Preparation::Nothing { .. })
    ));
}

/// A clone of a parent the claiming plugin prepared (the annotation names
/// it and its digest) gets its lease by itself: its recovery keeps the
/// 15 s, as a fallback. An annotation that names the plugin with another
/// digest proves nothing: the claim stands.
#[test]
fn a_clone_of_a_parent_its_plugin_prepared_is_not_claimed() {
    use fixup_core::decision::Prepared;
    use fixup_kit::conformance::{Scenario as Case, replay};
    let node = node();
    let plugin = node
        .planner
        .plugins()
        .registry()
        .plugins()
        .iter()
        .find(|p| p.info.name == "nm-keyfile")
        .expect("loaded")
        .clone();
    let prepared = |sha256: &str| {
        Prepared {
            plugin: "nm-keyfile".into(),
            version: plugin.info.version.clone(),
            sha256: sha256.into(),
        }
        .value()
    };
    let mut unclaimed = all_dhcp_clone(
        "rhel",
        15000,
        "no lease after 15s: re-running DHCP on 1 NIC(s)",
    );
    unclaimed["pod"]["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("vm.cocoonstack.io/restore-from-hibernate");
    unclaimed["pod"]["metadata"]["annotations"]["vm.cocoonstack.io/prepared"] =
        prepared(&plugin.sha256).into();
    let mut forged = all_dhcp_clone(
        "rhel",
        0,
        "nm-keyfile claims all-DHCP clones of guest flavour rhel: re-running DHCP on 1 NIC(s) at once",
    );
    forged["pod"]["metadata"]["annotations"]["vm.cocoonstack.io/prepared"] =
        prepared(&"0".repeat(64)).into();
    for case in [unclaimed, forged] {
        let case: Case = serde_json::from_value(case).expect("a scenario");
        let (world, ended) = replay(&case, &node.planner);
        case.check(&world, &ended)
            .unwrap_or_else(|e| panic!("{}: {e}", case.pod["metadata"]["annotations"]));
    }
}
