//! `capture` with a plugin file that does not plan: a refusal becomes the
//! case's expected error (and `plugin test` passes it), a breach leaves
//! the case without `expect` and the error in its context (and `plugin
//! test` fails it, showing the breach).

use std::path::Path;

use fixup_core::binding::vm_name_for_pod;
use fixup_core::facts::Overrides;
use fixup_core::planner::{Planner, PlannerOptions};
use fixup_core::plugin::EngineOptions;
use fixup_kit::capture::{self, CaptureInput, Source};
use fixup_kit::{self as kit, ErrorKind, Expect, Status, TestOptions};
use fixup_tests::{hostile_clone, hostile_vm_record};
use rstest::rstest;

/// The case `capture` makes of a hostile clone whose VM id asks for
/// `behaviour`, written to `dir`.
fn captured(dir: &Path, behaviour: &str) -> (capture::CapturedCase, std::path::PathBuf) {
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(env!("PLUGIN_HOSTILE"), plugins.join("hostile.wasm")).unwrap();
    let (planner, failures) = Planner::new(PlannerOptions {
        cocoon_root: dir.to_owned(),
        plugin_dir: Some(plugins),
        ..PlannerOptions::default()
    })
    .expect("planner");
    assert!(failures.is_empty(), "{failures:?}");
    let pod = hostile_clone("web-0");
    let record = hostile_vm_record(
        &vm_name_for_pod("default", "web-0"),
        &format!("hostile-{behaviour}"),
    );
    capture::bound_record(&pod, &record, Default::default()).expect("the pod's own VM");
    let input = CaptureInput {
        pod: &pod,
        vm: &record,
        overrides: &Overrides::default(),
        events: &[],
        events_truncated: false,
        stack_events: &[],
        wake: &fixup_core::decision::WakeConfig::default(),
        now_unix_ms: 1_764_583_200_000,
        source: Source::Cluster,
        at: "2026-12-01T10:00:00Z".into(),
        by: "cocoon-fixup test".into(),
        cocoon_root: dir,
        anyway: false,
    };
    let mut cases = capture::capture(&planner, &input).expect("captured");
    assert_eq!(cases.len(), 1);
    let case = cases.remove(0);
    assert_eq!(case.plugin, "hostile");
    let file = dir.join(case.file_name());
    std::fs::write(&file, &case.text).unwrap();
    (case, file)
}

#[rstest]
#[case::unsupported("decline", ErrorKind::Unsupported)]
#[case::invalid_facts("reject", ErrorKind::InvalidFacts)]
fn a_refusal_is_the_expected_error_and_plugin_test_passes_it(
    #[case] behaviour: &str,
    #[case] kind: ErrorKind,
) {
    let dir = tempfile::tempdir().unwrap();
    let (case, file) = captured(dir.path(), behaviour);
    assert_eq!(case.expect, "error");
    let loaded = kit::load_case(&file).expect("valid case");
    match &loaded.expect {
        Some(Expect::Error(e)) => assert_eq!(e.kind, kind),
        other => panic!("expected an error: {other:?}"),
    }
    let context = loaded.context.as_ref().unwrap();
    assert!(context.get("call_error").is_none());
    // The daemon's composed plan fails the same way, and says so.
    let composed = context["composed"]["result"].as_str().unwrap();
    assert_ne!(composed, "ok");
    assert!(composed.contains("hostile"), "{composed}");
    assert!(context["limits"]["fuel"].as_u64().unwrap() > 0);
    let report = kit::test_plugin(
        kit::engine_options(&EngineOptions::default()),
        Path::new(env!("PLUGIN_HOSTILE")),
        &file,
        TestOptions::default(),
    )
    .expect("the kit runs");
    assert!(report.success(), "{report}");
    assert_eq!(report.cases[0].status, Status::Pass);
}

#[test]
fn a_breach_leaves_no_expect_and_plugin_test_shows_it() {
    let dir = tempfile::tempdir().unwrap();
    let (case, file) = captured(dir.path(), "panic");
    assert_eq!(case.expect, "none");
    let loaded = kit::load_case(&file).expect("valid case");
    assert!(loaded.expect.is_none());
    let context = loaded.context.expect("context");
    let error = context["call_error"].as_str().expect("the breach");
    assert!(error.contains("panicked"), "{error}");
    let report = kit::test_plugin(
        kit::engine_options(&EngineOptions::default()),
        Path::new(env!("PLUGIN_HOSTILE")),
        &file,
        TestOptions {
            bless: true,
            ..TestOptions::default()
        },
    )
    .expect("the kit runs");
    assert!(!report.success(), "{report}");
    let message = report.cases[0].message.as_deref().unwrap_or("");
    assert!(message.contains("panicked"), "{message}");
}
