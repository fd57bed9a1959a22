//! The plugin kit (`plugin test`, `plugin inspect`) on real `.wasm` files:
//! the built-ins written out of the binary, the hostile test plugin, and
//! files that are not plugins at all.

use std::path::{Path, PathBuf};

use fixup_core::plan::policy::PolicySource;
use fixup_core::plugin::builtin::BUILTINS;
use fixup_core::plugin::sandbox::DEFAULT_FUEL;
use fixup_core::plugin::{EngineOptions, PluginError};
use fixup_kit::{
    self as kit, Access, Format, Inspector, KitError, Status, TestOptions, TestReport,
};
use fixup_tests::workspace;
use rstest::rstest;

/// The engine options `plugin test` and `plugin inspect` use by default.
fn engine() -> EngineOptions {
    kit::engine_options(&EngineOptions::default())
}

/// Write the built-in plugin `name` to `dir` as a `.wasm` file, as a vendor
/// would have it on disk.
fn builtin_file(dir: &Path, name: &str) -> PathBuf {
    let (_, bytes) = BUILTINS
        .iter()
        .find(|(n, _)| *n == name)
        .expect("a built-in of that name");
    let path = dir.join(format!("{name}.wasm"));
    std::fs::write(&path, bytes).expect("write plugin file");
    path
}

fn cases_of(plugin: &str) -> PathBuf {
    workspace().join("plugins").join(plugin).join("cases")
}

fn test(plugin: &Path, cases: &Path, bless: bool) -> TestReport {
    kit::test_plugin(
        engine(),
        plugin,
        cases,
        TestOptions {
            bless,
            ..TestOptions::default()
        },
    )
    .expect("the kit runs")
}

#[rstest]
#[case::cloudimg("cloudimg")]
#[case::oci_networkd("oci-networkd")]
#[case::fc_mac("fc-mac")]
#[case::windows_pnp("windows-pnp")]
fn each_builtin_passes_its_cases(#[case] name: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = builtin_file(dir.path(), name);
    let report = test(&plugin, &cases_of(name), false);
    assert!(report.success(), "{report}");
    assert!(report.cases.len() >= 3, "at least three cases: {report}");
    assert_eq!(report.passed, report.cases.len());
    assert_eq!(report.plugin.name, name);
    for case in &report.cases {
        assert_eq!(case.status, Status::Pass, "{report}");
        assert!(case.diff.is_none());
        let usage = case.usage.as_ref().expect("usage reported");
        assert!(usage.wall_ms > 0.0);
    }
    assert!(
        report
            .cases
            .iter()
            .any(|c| c.name.starts_with("unsupported-")),
        "each plugin has an unsupported-scenario case"
    );
    let text = report.to_string();
    assert!(text.ends_with(&format!("{} passed, 0 failed\n", report.cases.len())));
    assert!(
        text.contains(" / 250,000,000 ("),
        "fuel against the limit: {text}"
    );
    assert!(
        text.contains(" / 16 MiB"),
        "memory against the limit: {text}"
    );
    assert!(
        text.contains(" / 256, "),
        "plan steps against the limit: {text}"
    );
    assert!(
        text.contains(" / 64 KiB"),
        "plan size against the limit: {text}"
    );
}

#[test]
fn a_wrong_expectation_fails_with_a_diff_and_bless_fixes_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = builtin_file(dir.path(), "oci-networkd");
    let committed = cases_of("oci-networkd").join("static-gateway.json");
    let original = std::fs::read_to_string(&committed).expect("committed case");
    let case = dir.path().join("static-gateway.json");
    let wrong = original.replace(r"Gateway=10.0.0.1\n", r"Gateway=10.0.0.254\n");
    assert_ne!(wrong, original, "the case has the gateway line to break");
    std::fs::write(&case, &wrong).expect("write case");

    let report = test(&plugin, &case, false);
    assert!(!report.success());
    assert_eq!((report.passed, report.failed), (0, 1));
    let result = &report.cases[0];
    assert_eq!(result.status, Status::Fail);
    let diff = result.diff.as_deref().expect("a diff");
    let removed: Vec<&str> = diff.lines().filter(|l| l.starts_with('-')).collect();
    let added: Vec<&str> = diff.lines().filter(|l| l.starts_with('+')).collect();
    // The file content differs by one line: a line diff of the content
    // under its path, not two escaped JSON strings.
    assert_eq!(removed.len(), 2, "--- header and one line: {diff}");
    assert_eq!(added.len(), 2, "+++ header and one line: {diff}");
    assert!(
        removed[0].starts_with("--- expected plan.steps[")
            && removed[0].ends_with("].write_file.content"),
        "{diff}"
    );
    assert_eq!(removed[1], "-Gateway=10.0.0.254", "{diff}");
    assert_eq!(added[1], "+Gateway=10.0.0.1", "{diff}");
    assert!(
        diff.contains("\n Address=10.0.0.5/24\n"),
        "context lines: {diff}"
    );
    assert!(!diff.contains(r"\n"), "no escaped string: {diff}");
    let text = report.to_string();
    assert!(text.contains("FAIL    static-gateway"), "{text}");
    assert!(
        text.contains("--bless"),
        "the failure says how to accept: {text}"
    );
    assert!(text.ends_with("0 passed, 1 failed\n"), "{text}");

    let blessed = test(&plugin, &case, true);
    assert!(blessed.success(), "{blessed}");
    assert_eq!(blessed.cases[0].status, Status::Blessed);
    assert_eq!(blessed.blessed, 1);
    assert!(
        blessed.cases[0].diff.as_deref() == Some(diff),
        "bless shows what changed"
    );
    let rewritten = std::fs::read_to_string(&case).expect("blessed case");
    assert_eq!(
        rewritten, original,
        "bless writes the committed form back: same keys, order and layout"
    );

    let rerun = test(&plugin, &case, false);
    assert!(rerun.success(), "{rerun}");
    assert_eq!(rerun.cases[0].status, Status::Pass);
}

/// A case for the hostile plugin: its VM name picks the misbehaviour.
fn hostile_case(dir: &Path, behaviour: &str) -> PathBuf {
    let case = serde_json::json!({
        "description": format!("the hostile plugin's {behaviour}"),
        "scenario": "oci-networkd",
        "facts": {
            "name": behaviour, "id": "vm-1", "backend": "cloud-hypervisor",
            "os": "linux", "image": "oci", "boot": "clone",
            "nics": [{"mac": "52:54:00:aa:bb:01", "static_ipv4": null}],
            "flavor": "hostile"
        },
        "expect": {"plan": {"dialect": "posix-sh", "steps": []}}
    });
    let path = dir.join(format!("{behaviour}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&case).expect("json")).expect("write");
    path
}

#[rstest]
#[case::endless_loop(
    "spin",
    "ran out of CPU fuel (limit 250000000, set with --plugin-fuel)"
)]
#[case::panic("panic", "panicked: hostile plugin panicked on purpose")]
#[case::reads_a_file("snoop-file", "which the sandbox denies")]
#[case::too_many_steps("wide", "256")]
fn a_sandbox_breach_fails_the_case_and_cannot_be_blessed(
    #[case] behaviour: &str,
    #[case] expected: &str,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let case = hostile_case(dir.path(), behaviour);
    let before = std::fs::read_to_string(&case).expect("case");
    let plugin = Path::new(env!("PLUGIN_HOSTILE"));
    for bless in [false, true] {
        let report = test(plugin, &case, bless);
        assert!(!report.success());
        let result = &report.cases[0];
        assert_eq!(result.status, Status::Fail, "{report}");
        let message = result.message.as_deref().expect("a message");
        assert!(message.contains("plugin hostile"), "{message}");
        assert!(message.contains(expected), "{message}");
        assert!(result.diff.is_none(), "a breach has nothing to diff");
        if behaviour == "spin" {
            let usage = result.usage.as_ref().expect("usage");
            assert_eq!(usage.fuel, Some(DEFAULT_FUEL), "all the fuel was used");
            assert!(report.to_string().contains("(100.00%)"), "{report}");
        }
    }
    assert_eq!(
        std::fs::read_to_string(&case).expect("case"),
        before,
        "bless leaves a breaching case alone"
    );
}

#[test]
fn the_configured_limits_apply() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = builtin_file(dir.path(), "oci-networkd");
    let mut options = EngineOptions::default();
    options.limits.fuel = 1_000;
    let err = kit::test_plugin(
        kit::engine_options(&options),
        &plugin,
        &cases_of("oci-networkd"),
        TestOptions::default(),
    )
    .expect_err("1000 fuel is too little even for `describe`");
    assert!(
        matches!(
            err,
            KitError::Plugin(PluginError::Fuel { limit: 1_000, .. })
        ),
        "{err}"
    );
}

#[rstest]
#[case::multicast_mac(
    r#""nics": [{"mac": "01:00:5e:00:00:01", "static_ipv4": null}]"#,
    "facts.nics[0].mac: MAC address \"01:00:5e:00:00:01\": is a multicast address"
)]
#[case::prefix(
    r#""nics": [{"mac": "52:54:00:00:00:01", "static_ipv4": {"address": "10.0.0.2", "prefix": 33, "gateway": null}}]"#,
    "facts.nics[0].static_ipv4.prefix: expected a prefix length 1..=32, got 33"
)]
#[case::gateway(
    r#""nics": [{"mac": "52:54:00:00:00:01", "static_ipv4": {"address": "10.0.0.2", "prefix": 24, "gateway": "10.0.0.1; reboot"}}]"#,
    "facts.nics[0].static_ipv4.gateway: \"10.0.0.1; reboot\" is not a dotted-quad IPv4 address"
)]
#[case::duplicate_mac(
    r#""nics": [{"mac": "52:54:00:00:00:01"}, {"mac": "52:54:00:00:00:01"}]"#,
    "facts.nics[1].mac: 52:54:00:00:00:01 is also the MAC of nics[0]"
)]
#[case::misspelt_key(
    r#""nics": [], "flavour": "rhel""#,
    "facts.flavour: unknown key; expected one of name, id, backend, os, image, boot, nics, flavor"
)]
#[case::bad_flavor(
    r#""nics": [], "flavor": "RHEL""#,
    "facts.flavor: guest flavour \"RHEL\""
)]
fn an_invalid_case_names_the_file_and_the_field(#[case] nics: &str, #[case] expected: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = builtin_file(dir.path(), "oci-networkd");
    let case = dir.path().join("bad.json");
    let text = format!(
        r#"{{"scenario": "oci-networkd", "facts": {{"name": "web-0", "id": "vm-1",
            "backend": "cloud-hypervisor", "os": "linux", "image": "oci", "boot": "clone", {nics}}}}}"#
    );
    std::fs::write(&case, text).expect("write case");
    let report = test(&plugin, dir.path(), false);
    assert!(!report.success());
    let result = &report.cases[0];
    assert_eq!(result.status, Status::Invalid);
    assert!(result.usage.is_none(), "the plugin never ran");
    let message = result.message.as_deref().expect("message");
    assert_eq!(
        message.split_once(": ").map(|(file, _)| file),
        Some(case.display().to_string().as_str()),
        "names the file first: {message}"
    );
    assert!(message.contains(expected), "{message}");
    assert!(report.to_string().contains("INVALID bad"));
}

#[test]
fn expected_errors_match_by_kind_field_and_text() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = builtin_file(dir.path(), "fc-mac");
    let write = |name: &str, expect: serde_json::Value| {
        let case = serde_json::json!({
            "scenario": "cloudimg",
            "facts": {"name": "fc-0", "id": "vm-1", "backend": "firecracker", "os": "linux",
                      "image": "oci", "boot": "clone", "nics": []},
            "expect": expect,
        });
        std::fs::write(dir.path().join(name), case.to_string()).expect("write");
    };
    write(
        "a-loose.json",
        serde_json::json!({"error": {"kind": "unsupported"}}),
    );
    write(
        "b-text.json",
        serde_json::json!({"error": {"kind": "unsupported", "reason_contains": "does not serve scenario `cloudimg`"}}),
    );
    write(
        "c-wrong-text.json",
        serde_json::json!({"error": {"kind": "unsupported", "reason_contains": "nope"}}),
    );
    write(
        "d-wrong-kind.json",
        serde_json::json!({"error": {"kind": "invalid-facts", "field": "nics"}}),
    );
    std::fs::write(dir.path().join("notes.txt"), "not a case").expect("write");
    let report = test(&plugin, dir.path(), false);
    let statuses: Vec<(&str, Status)> = report
        .cases
        .iter()
        .map(|c| (c.name.as_str(), c.status))
        .collect();
    assert_eq!(
        statuses,
        [
            ("a-loose", Status::Pass),
            ("b-text", Status::Pass),
            ("c-wrong-text", Status::Fail),
            ("d-wrong-kind", Status::Fail),
        ],
        "every *.json in name order, nothing else"
    );
    let diff = report.cases[2].diff.as_deref().expect("diff");
    assert!(diff.contains(r#"-    "reason_contains": "nope""#), "{diff}");
    assert!(
        diff.contains(
            r#"+    "reason_contains": "plugin `fc-mac` does not serve scenario `cloudimg`""#
        ),
        "{diff}"
    );
}

#[test]
fn a_case_without_expect_fails_until_blessed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = builtin_file(dir.path(), "windows-pnp");
    let case = dir.path().join("new.json");
    std::fs::write(
        &case,
        r#"{"scenario": "windows-pnp", "facts": {"name": "win-0", "id": "vm-1",
            "backend": "cloud-hypervisor", "os": "windows", "image": "unknown",
            "boot": "clone", "nics": [{"mac": "52:54:00:77:00:01"}]}}"#,
    )
    .expect("write");
    let report = test(&plugin, &case, false);
    assert_eq!(report.cases[0].status, Status::Fail);
    assert!(
        report.cases[0]
            .message
            .as_deref()
            .is_some_and(|m| m.contains("no `expect` yet")),
        "{report}"
    );
    assert!(test(&plugin, &case, true).success());
    let blessed: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&case).expect("read")).expect("json");
    assert_eq!(blessed["expect"]["plan"]["dialect"], "powershell");
    assert_eq!(
        blessed["facts"]["nics"][0]["static_ipv4"],
        serde_json::Value::Null,
        "bless writes the optional keys out"
    );
    assert!(test(&plugin, &case, false).success());
}

#[test]
fn json_output_is_the_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = builtin_file(dir.path(), "fc-mac");
    let report = test(&plugin, &cases_of("fc-mac"), false);
    let json = serde_json::to_value(&report).expect("serialises");
    assert_eq!(json["plugin"]["name"], "fc-mac");
    assert_eq!(json["limits"]["fuel"], DEFAULT_FUEL);
    assert_eq!(json["failed"], 0);
    let two = json["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["name"] == "two-nics")
        .expect("the two-NIC case");
    assert_eq!(two["status"], "pass");
    assert_eq!(two["usage"]["plan_steps"], 6);
    assert!(two["usage"]["fuel"].as_u64().is_some_and(|f| f > 0));
}

#[test]
fn missing_cases_are_an_error_with_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = builtin_file(dir.path(), "fc-mac");
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let err = kit::test_plugin(engine(), &plugin, &empty, TestOptions::default()).unwrap_err();
    assert!(matches!(err, KitError::NoCases { .. }), "{err}");
    let err = kit::test_plugin(
        engine(),
        &plugin,
        &dir.path().join("nowhere"),
        TestOptions::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("pass a case file or a folder of `*.json` case files"),
        "{err}"
    );
}

fn inspector() -> Inspector {
    Inspector::new(engine(), None).expect("inspector starts")
}

/// Each built-in, written to a file, is described in full; the node
/// refuses such a copy (it claims what the built-in claims), and the
/// verdict says it is the built-in itself.
#[test]
fn inspect_describes_each_builtin_and_refuses_a_copy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inspector = inspector();
    for (name, bytes) in BUILTINS {
        let path = builtin_file(dir.path(), name);
        let found = inspector.inspect(&path);
        assert!(!found.accepted, "{found}");
        assert!(
            found
                .verdict
                .starts_with(&format!("refused: it is built-in:{name} itself")),
            "{found}"
        );
        assert_eq!(found.name.as_deref(), Some(name));
        assert_eq!(found.contract.as_deref(), Some("cocoon:fixup@0.4.0"));
        assert_eq!(found.size_bytes, Some(bytes.len() as u64));
        assert_eq!(found.format, Format::Component);
        assert!(!found.scenarios.is_empty());
        let host = found
            .imports
            .iter()
            .find(|i| i.name == "cocoon:fixup/host@0.4.0")
            .expect("imports the host log");
        assert_eq!(host.access, Access::Granted);
        let wasi: Vec<_> = found
            .imports
            .iter()
            .filter(|i| i.name.starts_with("wasi:"))
            .collect();
        assert!(!wasi.is_empty(), "a std build imports WASI: {found}");
        assert!(wasi.iter().all(|i| i.access == Access::Denied), "{found}");
        let text = found.to_string();
        assert!(text.contains("cocoon:fixup/host@0.4.0"), "{text}");
        let policy = found.policy.as_ref().expect("a loaded plugin has a policy");
        assert_eq!(policy.source, PolicySource::Declared, "{name}");
        assert!(policy.warnings.is_empty(), "{name}: {text}");
        assert!(!policy.policy.special_modes, "{name}");
        assert!(
            text.contains("policy     declared by the plugin\n"),
            "{text}"
        );
        assert!(text.contains("  granted\n"), "{text}");
        assert!(text.contains("  denied (traps)\n"), "{text}");
        assert!(
            text.contains("\nverdict    refused: it is built-in:"),
            "{text}"
        );
    }
}

#[test]
fn inspect_shows_flavours() {
    let found = inspector().inspect(Path::new(env!("PLUGIN_HOSTILE")));
    assert!(found.accepted, "{found}");
    assert_eq!(found.flavors, ["hostile"]);
    assert!(found.to_string().contains("flavours   hostile\n"));
}

#[rstest]
#[case::core_module(b"\0asm\x01\0\0\0" as &[u8], Format::CoreModule, "(it is a core module)")]
#[case::junk(b"#!/bin/sh\necho hi\n" as &[u8], Format::NotWasm, "is not a WebAssembly component")]
#[case::broken_component(b"\0asm\x0d\0\x01\0garbage" as &[u8], Format::Component, "could not be compiled")]
fn inspect_refuses_what_is_not_a_plugin_and_says_the_fix(
    #[case] bytes: &[u8],
    #[case] format: Format,
    #[case] why: &str,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("thing.wasm");
    std::fs::write(&path, bytes).expect("write");
    let found = inspector().inspect(&path);
    assert!(!found.accepted);
    assert_eq!(found.format, format);
    assert_eq!(found.size_bytes, Some(bytes.len() as u64));
    assert!(found.sha256.is_some(), "what is known is shown");
    assert!(found.name.is_none());
    assert!(found.verdict.starts_with("refused: "), "{found}");
    assert!(found.verdict.contains(why), "{found}");
    assert!(
        found.verdict.contains("cargo build --target wasm32-wasip2")
            || found.verdict.contains("rebuild the plugin"),
        "the refusal ends with the fix: {found}"
    );
    let text = found.to_string();
    assert!(text.contains("sha256     "), "{text}");
    assert!(text.contains("\nverdict    refused: "), "{text}");
}

/// `plugin inspect` judges where the file lies as the host does: a file
/// others may write, or a link, is refused with the reason, though what
/// the file is is still shown.
#[test]
fn inspect_refuses_a_file_the_host_would_not_trust() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let inspector = inspector();
    let path = hostile_in(dir.path(), "hostile.wasm");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let found = inspector.inspect(&path);
    assert!(!found.accepted, "{found}");
    assert!(found.verdict.contains("chmod go-w"), "{found}");
    assert_eq!(found.name.as_deref(), Some("hostile"), "still described");

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let link = dir.path().join("link.wasm");
    std::os::unix::fs::symlink(&path, &link).expect("symlink");
    let found = inspector.inspect(&link);
    assert!(!found.accepted, "{found}");
    assert!(found.verdict.contains("symbolic link"), "{found}");
    assert!(inspector.inspect(&path).accepted);
}

/// The hostile test plugin (flavour `hostile`) copied into `dir` as `name`.
fn hostile_in(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::copy(env!("PLUGIN_HOSTILE"), &path).expect("copy plugin");
    path
}

/// A plugin directory with two files claiming the same flavour (an
/// upgrade that left the old file behind): `plan` refuses to start with
/// it, so inspecting either file refuses it and names the other, in both
/// name orders, and says the directory does not load.
#[rstest]
#[case::old_first("a-hostile-old.wasm", "b-hostile-new.wasm")]
#[case::old_last("z-hostile-old.wasm", "b-hostile-new.wasm")]
fn inspect_refuses_a_file_whose_flavour_another_file_claims(#[case] old: &str, #[case] new: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = hostile_in(dir.path(), old);
    let new = hostile_in(dir.path(), new);
    let inspector = Inspector::new(engine(), Some(dir.path())).expect("inspector starts");
    for (inspected, other) in [(&old, &new), (&new, &old)] {
        let found = inspector.inspect(inspected);
        assert!(!found.accepted, "{found}");
        assert!(!found.success(), "{found}");
        assert!(found.verdict.starts_with("refused: "), "{found}");
        assert!(
            found.verdict.contains(&format!(
                "{} also serves oci-networkd for flavour `hostile`",
                other.display()
            )),
            "names the other file and the claim: {found}"
        );
        // The earlier file in name order keeps its other claims; the
        // later one is refused whole.
        let (kept, lost) = if other < inspected {
            (other.display().to_string(), "this file".to_owned())
        } else {
            ("this file".to_owned(), other.display().to_string())
        };
        assert!(
            found.verdict.contains(&format!(
                "{kept} loads first and keeps its other claims, {lost} does not load and serves none of its claims"
            )),
            "{found}"
        );
        assert!(found.verdict.contains("remove one of them"), "{found}");
        assert!(!found.verdict.contains("remove the old file"), "{found}");
        let directory = found.directory.as_ref().expect("a directory report");
        assert!(!directory.loads, "{found}");
        assert!(!directory.copy);
        assert_eq!(directory.file_as, inspected.display().to_string());
        let text = found.to_string();
        assert!(text.contains("does not load as a whole"), "{text}");
    }
}

/// A file outside the plugin directory is judged as the copy a vendor
/// would put there: beside an old file claiming its flavour it is refused
/// naming that file; under the old file's name it replaces it and is
/// accepted.
#[test]
fn inspect_judges_a_file_outside_the_directory_as_its_copy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let build = tempfile::tempdir().expect("tempdir");
    let old = hostile_in(dir.path(), "hostile-0.1.wasm");
    let candidate = hostile_in(build.path(), "hostile-0.2.wasm");
    let inspector = Inspector::new(engine(), Some(dir.path())).expect("inspector starts");
    let found = inspector.inspect(&candidate);
    assert!(!found.accepted, "{found}");
    assert!(
        found.verdict.contains(&old.display().to_string()),
        "{found}"
    );
    let directory = found.directory.as_ref().expect("a directory report");
    assert!(directory.copy && !directory.replaces, "{found}");
    assert_eq!(
        directory.file_as,
        dir.path().join("hostile-0.2.wasm").display().to_string()
    );

    let same_name = hostile_in(build.path(), "hostile-0.1.wasm");
    let found = inspector.inspect(&same_name);
    assert!(found.success(), "{found}");
    assert_eq!(found.verdict, "accepted");
    let directory = found.directory.as_ref().expect("a directory report");
    assert!(directory.copy && directory.replaces && directory.loads);
    assert!(
        found.to_string().contains("replacing the file there"),
        "{found}"
    );
}

/// Another file that does not load leaves the inspected file accepted by
/// itself, but the directory does not load as a whole: `plan` refuses to
/// start, `run` and a starting `serve` skip that file, a running `serve`
/// refuses the reload. The exit code is 1 (`success` false beside
/// `accepted` true) and the other file is named with its error, in text
/// and JSON.
#[test]
fn inspect_says_when_another_file_breaks_the_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = hostile_in(dir.path(), "hostile.wasm");
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"not a component").expect("write");
    let found = Inspector::new(engine(), Some(dir.path()))
        .expect("inspector starts")
        .inspect(&plugin);
    assert!(found.accepted, "{found}");
    assert!(!found.success(), "{found}");
    for needle in [
        "accepted by itself",
        "does not load as a whole",
        "`plan` refuses to start",
        "`run` and a starting `serve` skip them",
        "a running `serve` refuses to reload until they are fixed",
        "does not run the `NAME.cases/` gate",
    ] {
        assert!(found.verdict.contains(needle), "{needle}: {found}");
    }
    let directory = found.directory.as_ref().expect("a directory report");
    assert!(!directory.loads);
    assert_eq!(directory.problems.len(), 1, "{found}");
    assert_eq!(directory.problems[0].file, junk.display().to_string());
    assert!(
        directory.problems[0]
            .error
            .contains("not a WebAssembly component"),
        "{found}"
    );
    let text = found.to_string();
    assert!(
        text.contains(&format!("fails: {}: ", junk.display())),
        "{text}"
    );
    let json = serde_json::to_value(&found).expect("serialises");
    assert_eq!(json["accepted"], true);
    assert_eq!(json["success"], false);
    assert_eq!(json["directory"]["loads"], false);
    assert_eq!(
        json["directory"]["problems"][0]["file"],
        junk.display().to_string()
    );
}

/// A clean directory: every file loads, each inspected file is accepted.
#[test]
fn inspect_accepts_a_file_of_a_clean_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hostile = hostile_in(dir.path(), "hostile.wasm");
    let keyfile = dir.path().join("nm-keyfile.wasm");
    std::fs::copy(env!("PLUGIN_NM_KEYFILE"), &keyfile).expect("copy");
    let inspector = Inspector::new(engine(), Some(dir.path())).expect("inspector starts");
    for path in [&hostile, &keyfile] {
        let found = inspector.inspect(path);
        assert!(found.success(), "{found}");
        assert_eq!(found.verdict, "accepted");
        let directory = found.directory.as_ref().expect("a directory report");
        assert!(directory.loads && directory.problems.is_empty(), "{found}");
        assert!(found.to_string().contains("every file loads"), "{found}");
    }
}

/// `--render` prints after each case the hint script `plan` would print
/// for the plan (the same renderer, header and dialect), or why there is
/// none; `--output json` carries it as `script`.
#[test]
fn render_shows_the_hint_script_of_each_case_or_why_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = builtin_file(dir.path(), "oci-networkd");
    let cases = cases_of("oci-networkd");
    let options = TestOptions {
        render: true,
        ..TestOptions::default()
    };
    let report = kit::test_plugin(engine(), &plugin, &cases, options).expect("the kit runs");
    assert!(report.success(), "{report}");

    let recovery = report
        .cases
        .iter()
        .find(|c| c.name == "dhcp-recovery-two-nics")
        .expect("the dhcp-recovery case");
    let script = recovery.script.as_deref().expect("a script");
    let case = kit::load_case(&cases.join("dhcp-recovery-two-nics.json")).expect("case");
    let (planner, failures) =
        fixup_core::planner::Planner::new(fixup_core::planner::PlannerOptions {
            engine: engine(),
            ..Default::default()
        })
        .expect("planner");
    assert!(failures.is_empty());
    let planned = planner
        .plan_scenarios(&case.facts, &[fixup_core::classify::Scenario::DhcpRecovery])
        .expect("the host plans it");
    assert_eq!(script, planned.script, "the script `plan` renders");
    assert!(
        script.contains("dhcp-recovery plan for VM web-3 (id vm-web-3)"),
        "{script}"
    );

    let declined = report
        .cases
        .iter()
        .find(|c| c.name == "unsupported-fc-mac")
        .expect("the unsupported case");
    assert!(declined.script.is_none());
    let why = declined.no_script.as_deref().expect("why no script");
    assert!(why.contains("declined (unsupported: "), "{why}");

    let text = report.to_string();
    assert!(text.contains("        hint script:\n"), "{text}");
    assert!(text.contains("no script: the plugin declined"), "{text}");
    let json = serde_json::to_value(&report).expect("serialises");
    let rendered = json["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["name"] == "dhcp-recovery-two-nics")
        .expect("case");
    assert_eq!(rendered["script"], planned.script);

    let plain = test(&plugin, &cases, false);
    let json = serde_json::to_value(&plain).expect("serialises");
    assert!(json["cases"][0].get("script").is_none(), "{json}");
    assert!(!plain.to_string().contains("hint script:"));
}

/// A case whose VM names a flavour the plugin does not serve tests a call
/// no node makes: `plugin test` warns, naming the case, its flavour and
/// the plugin's flavours. A served flavour, or a plugin serving any
/// flavour, gets no warning.
#[test]
fn a_case_for_a_flavour_the_plugin_does_not_serve_is_warned_about() {
    let dir = tempfile::tempdir().expect("tempdir");
    let served = hostile_case(dir.path(), "benign");
    let mut case: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&served).expect("case")).expect("json");
    case["facts"]["flavor"] = "ubuntu".into();
    let other = dir.path().join("ubuntu.json");
    std::fs::write(&other, case.to_string()).expect("write");
    let report = test(Path::new(env!("PLUGIN_HOSTILE")), dir.path(), false);
    let by_name = |name: &str| {
        report
            .cases
            .iter()
            .find(|c| c.name == name)
            .expect("the case")
    };
    assert!(by_name("benign").warnings.is_empty(), "{report}");
    let warnings = &by_name("ubuntu").warnings;
    assert_eq!(warnings.len(), 1, "{report}");
    for needle in [
        "case ubuntu:",
        "flavour `ubuntu`",
        "plugin hostile serves only `hostile`",
    ] {
        assert!(warnings[0].contains(needle), "{needle}: {}", warnings[0]);
    }
    let json = serde_json::to_value(&report).expect("serialises");
    assert!(json["cases"][1]["warnings"][0].is_string(), "{json}");

    // A case name (its file name) with a line break is escaped.
    let odd = tempfile::tempdir().expect("tempdir");
    std::fs::write(odd.path().join("two\nlines.json"), case.to_string()).expect("write");
    let report = test(Path::new(env!("PLUGIN_HOSTILE")), odd.path(), false);
    let warning = &report.cases[0].warnings[0];
    assert!(warning.starts_with("case two\\nlines: "), "{warning}");

    let builtin = builtin_file(dir.path(), "oci-networkd");
    let generic = test(&builtin, &cases_of("oci-networkd"), false);
    assert!(generic.cases.iter().all(|c| c.warnings.is_empty()));
}

/// A plugin calling an import the host does not grant fails its case with
/// the guide's fix: drop what pulls the import in.
#[test]
fn a_denied_import_fails_with_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let case = hostile_case(dir.path(), "smuggle");
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&case).expect("case")).expect("json");
    value["facts"]["flavor"] = "smuggle".into();
    std::fs::write(&case, value.to_string()).expect("write");
    let report = test(Path::new(env!("PLUGIN_EXTRA_IMPORT")), &case, false);
    let message = report.cases[0].message.as_deref().expect("a message");
    assert!(message.contains("which the sandbox denies"), "{message}");
    assert!(
        message.contains("drop the code or dependency that calls it"),
        "{message}"
    );
    assert!(message.contains("docs/plugins.md"), "{message}");
}

/// `--render` goes through the node's own composition and checks: the
/// steps come out in phase order whatever order the plugin returned them
/// in, and a plan the node would refuse once rendered (an exec argument
/// over the kernel's limit) has no script and fails the case.
#[test]
fn render_composes_and_checks_the_plan_as_the_node_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    hostile_case(dir.path(), "disorder");
    hostile_case(dir.path(), "quotes");
    let options = TestOptions {
        render: true,
        ..TestOptions::default()
    };
    let report = kit::test_plugin(
        engine(),
        Path::new(env!("PLUGIN_HOSTILE")),
        dir.path(),
        options,
    )
    .expect("the kit runs");
    let by_name = |name: &str| {
        report
            .cases
            .iter()
            .find(|c| c.name == name)
            .expect("the case")
    };
    let disorder = by_name("disorder");
    let script = disorder.script.as_deref().expect("a script");
    let prepare = script.find("prepare first").expect("the prepare step");
    let configure = script.find("configure second").expect("the configure step");
    assert!(prepare < configure, "phase order: {script}");

    let quotes = by_name("quotes");
    assert_eq!(quotes.status, kit::Status::Fail, "{report}");
    assert!(quotes.script.is_none());
    let why = quotes.no_script.as_deref().expect("why no script");
    assert!(why.starts_with("the node would refuse it: "), "{why}");
    assert!(
        report
            .to_string()
            .contains("no script: the node would refuse it: "),
        "{report}"
    );
}

/// The store's files of pinned references load after the directory, as
/// the node loads them: a pinned file claiming the inspected file's
/// flavour is named (it loads later, so it is the one refused whole),
/// and references the store does not hold are listed as not checked.
#[test]
fn inspect_loads_the_pinned_files_after_the_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = tempfile::tempdir().expect("tempdir");
    let plugin = hostile_in(dir.path(), "hostile.wasm");
    let pinned = hostile_in(store.path(), "sha256-0123.wasm");
    let unchecked = "oci://registry.example/acme/net@sha256:abc".to_owned();
    let inspector = Inspector::new(engine(), Some(dir.path()))
        .expect("inspector starts")
        .with_pinned(vec![pinned.clone()], vec![unchecked.clone()]);
    let found = inspector.inspect(&plugin);
    assert!(!found.accepted, "{found}");
    assert!(
        found.verdict.contains(&format!(
            "{} also serves oci-networkd for flavour `hostile`: this file loads first",
            pinned.display()
        )),
        "{found}"
    );
    assert_eq!(found.pinned, vec![pinned.display().to_string()]);
    assert_eq!(found.pinned_unchecked, vec![unchecked]);
    let text = found.to_string();
    assert!(text.contains("pinned references not checked: 1"), "{text}");

    let alone = Inspector::new(engine(), Some(dir.path()))
        .expect("inspector starts")
        .inspect(&plugin);
    assert!(alone.success(), "{alone}");
}

/// The node reads only `*.wasm` files: a file under another name (left
/// behind as `.old`) is refused as not loaded, and the directory is
/// judged without it, in the directory or as a copy from elsewhere.
#[test]
fn inspect_says_the_node_does_not_load_a_file_not_named_wasm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let build = tempfile::tempdir().expect("tempdir");
    hostile_in(dir.path(), "hostile.wasm");
    let old = hostile_in(dir.path(), "hostile.wasm.old");
    let outside = hostile_in(build.path(), "hostile.wasm.old");
    let inspector = Inspector::new(engine(), Some(dir.path())).expect("inspector starts");
    for path in [&old, &outside] {
        let found = inspector.inspect(path);
        assert!(!found.accepted && !found.success(), "{found}");
        assert!(
            found
                .verdict
                .contains("the node does not load this file (its name does not end in `.wasm`)"),
            "{found}"
        );
        // Judged without it, the directory loads: no shared claim.
        let directory = found.directory.as_ref().expect("a directory report");
        assert!(directory.loads && directory.problems.is_empty(), "{found}");
        assert!(!found.verdict.contains("also serves"), "{found}");
    }
}

/// The daemon notes an unserved flavour only for a scenario some loaded
/// plugin declares flavours for: `nm-keyfile` serves the network and DHCP
/// recovery scenarios, so a Firecracker clone's `fc-mac` part is not one.
#[test]
fn flavours_are_declared_only_for_the_scenarios_a_flavoured_plugin_serves() {
    use fixup_core::classify::Scenario;
    use fixup_core::planner::{Planner, PlannerOptions};
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        env!("PLUGIN_NM_KEYFILE"),
        dir.path().join("nm-keyfile.wasm"),
    )
    .expect("copy");
    let (planner, failures) = Planner::new(PlannerOptions {
        engine: engine(),
        plugin_dir: Some(dir.path().to_owned()),
        ..Default::default()
    })
    .expect("planner");
    assert!(failures.is_empty());
    assert!(planner.declares_flavors(Scenario::OciNetworkd));
    assert!(planner.declares_flavors(Scenario::DhcpRecovery));
    assert!(!planner.declares_flavors(Scenario::FcMac));
    let (plain, _) = Planner::new(PlannerOptions {
        engine: engine(),
        ..Default::default()
    })
    .expect("planner");
    assert!(!plain.declares_flavors(Scenario::OciNetworkd));
}
