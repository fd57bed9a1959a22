//! Every bundled example through the real planner and the real built-in
//! components, against golden plans and scripts (`BLESS=1` rewrites them).

use std::path::Path;

use base64::Engine as _;
use fixup_core::facts::{BootKind, Observation, Overrides, PodInput, VmInspect};
use fixup_core::planner::{Planner, PlannerOptions};
use fixup_tests::{assert_golden, fixture, workspace};
use rstest::rstest;

fn observe(dir: &Path) -> Observation {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).expect("example file");
    let pod = PodInput::from_json(&read("pod.json"), "pod.json").expect("example pod parses");
    let vm = VmInspect::from_json(&read("vm.json"), "vm.json").expect("example vm parses");
    let mut overrides = Overrides::default();
    if let Ok(args) = std::fs::read_to_string(dir.join("args")) {
        let words: Vec<&str> = args.split_whitespace().collect();
        for pair in words.chunks(2) {
            match pair {
                ["--source-image", url] => overrides.source_image = Some((*url).to_owned()),
                ["--boot", "fork"] => overrides.boot = Some(BootKind::Fork),
                ["--boot", "wake"] => overrides.boot = Some(BootKind::Wake),
                ["--boot", "resumed"] => overrides.boot = Some(BootKind::Resumed),
                ["--boot", "clone"] => overrides.boot = Some(BootKind::Clone),
                other => panic!("unknown args in example: {other:?}"),
            }
        }
    }
    Observation::new(&pod, &vm, &overrides)
}

fn planner() -> Planner {
    let options = PlannerOptions {
        cocoon_root: workspace().join("examples/cocoon-root"),
        ..PlannerOptions::default()
    };
    let (planner, failures) = Planner::new(options).expect("planner starts");
    assert!(failures.is_empty());
    planner
}

#[rstest]
#[case::oci_static("oci-static", "oci-networkd")]
#[case::cloudimg_static("cloudimg-static", "cloudimg")]
#[case::cloudimg_overlay("cloudimg-overlay", "cloudimg")]
#[case::fc_dhcp("fc-dhcp", "fc-mac")]
#[case::windows("windows", "windows-pnp")]
#[case::no_fixup("no-fixup", "none")]
#[case::unmanaged("unmanaged", "none")]
fn example_plans_match_golden(#[case] name: &str, #[case] scenario: &str) {
    let dir = workspace().join("examples").join(name);
    let obs = observe(&dir);
    let outcome = planner().plan(&obs).expect("example plans");
    let mut report = serde_json::to_value(outcome.report(&obs)).expect("serialises");
    assert_eq!(report["scenario"], scenario);
    assert_eq!(report["needs_fixup"], scenario != "none");

    if let Some(composed) = &outcome.composed {
        // The hint is the script, base64 with the standard padded alphabet.
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(&composed.hint)
            .expect("hint is base64");
        assert_eq!(decoded, composed.script.as_bytes());
        let ext = if scenario == "windows-pnp" {
            "ps1"
        } else {
            "sh"
        };
        assert_golden(&fixture(&format!("golden/{name}.{ext}")), &composed.script);
    }
    // Digests, fuel and memory change with every plugin rebuild; the golden
    // file pins the behaviour, not the build.
    for p in report["plugins"].as_array_mut().expect("plugins array") {
        let p = p.as_object_mut().expect("plugin object");
        assert_eq!(p["sha256"].as_str().map(str::len), Some(64));
        for volatile in ["sha256", "fuel_used", "peak_memory_bytes"] {
            p.remove(volatile);
        }
    }
    if let Some(obj) = report.as_object_mut() {
        obj.remove("script");
        obj.remove("hint");
    }
    let pretty = serde_json::to_string_pretty(&report).expect("pretty") + "\n";
    assert_golden(&fixture(&format!("golden/{name}.json")), &pretty);
}

#[test]
fn firecracker_runs_mac_reapply_between_prepare_and_configure() {
    let obs = observe(&workspace().join("examples/fc-dhcp"));
    let outcome = planner().plan(&obs).expect("plans");
    let composed = outcome.composed.expect("fc needs a fixup");
    let names: Vec<&str> = composed
        .parts
        .iter()
        .map(|p| p.selection.plugin.info.name.as_str())
        .collect();
    assert_eq!(names, ["fc-mac", "oci-networkd"]);
    let phases: Vec<_> = composed.plan.steps.iter().map(|s| s.phase).collect();
    let mut sorted = phases.clone();
    sorted.sort();
    assert_eq!(phases, sorted, "steps are in phase order");
    let first_link = composed
        .plan
        .steps
        .iter()
        .position(|s| s.description.contains("eth0"))
        .expect("mac re-apply present");
    assert!(
        composed.plan.steps[..first_link]
            .iter()
            .any(|s| s.description.contains("hostname"))
    );
}
