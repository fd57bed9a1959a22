//! `cocoon-fixup capture` as a user runs it: from files and from a cluster
//! (the fake API server and `fake-cocoon`), cases that `plugin test` then
//! passes with the built-in plugins, one case per plugin call, a failed
//! pod's record in the context, and a VM that is not the pod's refused.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64::Engine as _;
use fixup_core::plugin::builtin::BUILTINS;
use fixup_kit as kit;
use serde_json::{Value, json};
use support::binary::cocoon_fixup;
use support::fake::fake_cocoon;
use support::fake_api::FakeApi;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn example(name: &str, file: &str) -> PathBuf {
    examples().join(name).join(file)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `cocoon-fixup capture ARGS` from files, with the examples' cocoon root
/// and no plugin directory.
fn capture(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cocoon-fixup"))
        .arg("capture")
        .args(args)
        .args(["--no-cache", "--cocoon-root"])
        .arg(examples().join("cocoon-root"))
        .env_remove("COCOON_FIXUP_PLUGIN_DIR")
        .env_remove("COCOON_FIXUP_CONFIG")
        .output()
        .expect("the binary runs")
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// The built-in plugin `name` as a `.wasm` file in `dir`, as a vendor has
/// a plugin on disk.
fn builtin_file(dir: &Path, name: &str) -> PathBuf {
    let (_, bytes) = BUILTINS
        .iter()
        .find(|(n, _)| *n == name)
        .expect("a built-in of that name");
    let path = dir.join(format!("{name}.wasm"));
    std::fs::write(&path, bytes).expect("write plugin");
    path
}

/// `cocoon-fixup plugin test PLUGIN CASE`.
fn plugin_test(plugin: &Path, case: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cocoon-fixup"))
        .args(["plugin", "test"])
        .arg(plugin)
        .arg(case)
        .arg("--no-cache")
        .env_remove("COCOON_FIXUP_PLUGIN_DIR")
        .output()
        .expect("the binary runs")
}

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(bytes)))
}

#[test]
fn a_static_oci_clone_becomes_a_case_the_builtin_passes() {
    let dir = tempfile::tempdir().unwrap();
    let out = capture(&[
        "--pod",
        path_str(&example("oci-static", "pod.json")),
        "--vm",
        path_str(&example("oci-static", "vm.json")),
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let case_json = json_of(&out.stdout);
    assert_eq!(case_json["scenario"], "oci-networkd");
    assert_eq!(case_json["facts"]["name"], "vk-apps-web-0-f8181b");
    assert_eq!(
        case_json["facts"]["nics"][0]["static_ipv4"]["address"],
        "10.88.4.21"
    );
    assert!(
        case_json["expect"]["plan"]["steps"]
            .as_array()
            .is_some_and(|s| !s.is_empty())
    );
    let context = &case_json["context"];
    assert_eq!(context["pod"]["name"], "web-0");
    assert_eq!(
        context["pod"]["uid"],
        "5b7e0c2a-6f1d-4e8b-9c3a-1f2d4e6a8b01"
    );
    assert_eq!(context["vm"]["id"], "vm-7f3a9c21");
    assert_eq!(context["rule"]["number"], 6);
    assert_eq!(context["plugin"]["name"], "oci-networkd");
    assert_eq!(context["plugin"]["source"], "built-in:oci-networkd");
    assert_eq!(context["plugin"]["sha256"].as_str().map(str::len), Some(64));
    assert!(
        context.get("field").is_none(),
        "nothing recorded: {context}"
    );
    assert!(
        context["captured"]["by"]
            .as_str()
            .is_some_and(|b| b.starts_with("cocoon-fixup ")),
        "{context}"
    );

    let case = dir.path().join("web-0.json");
    std::fs::write(&case, &out.stdout).unwrap();
    let loaded = kit::load_case(&case).expect("the case validates");
    assert_eq!(loaded.facts.nics.len(), 2);
    assert!(loaded.expect.is_some());
    assert_eq!(
        loaded.context.as_ref().and_then(|c| c.get("pod")),
        Some(&context["pod"])
    );

    let plugin = builtin_file(dir.path(), "oci-networkd");
    let tested = plugin_test(&plugin, &case);
    let report = text(&tested.stdout);
    assert_eq!(
        tested.status.code(),
        Some(0),
        "{report}{}",
        text(&tested.stderr)
    );
    assert!(report.contains("PASS    web-0"), "{report}");
    assert!(
        report.contains("context: captured from pod apps/web-0"),
        "{report}"
    );
    // Another plugin gives another plan: the case can fail.
    let other = builtin_file(dir.path(), "cloudimg");
    assert_eq!(plugin_test(&other, &case).status.code(), Some(1));
}

#[test]
fn a_firecracker_clone_is_two_cases_one_per_plugin_call() {
    let dir = tempfile::tempdir().unwrap();
    let pod = example("fc-dhcp", "pod.json");
    let vm = example("fc-dhcp", "vm.json");
    let files = ["--pod", path_str(&pod), "--vm", path_str(&vm)];

    let out = capture(&files);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(out.stdout.is_empty(), "nothing on stdout when refused");
    let stderr = text(&out.stderr);
    for needle in [
        "2 plugin calls",
        "fc-mac",
        "oci-networkd",
        "--output DIR",
        "--plugin NAME",
    ] {
        assert!(stderr.contains(needle), "{needle}: {stderr}");
    }

    // A new name without the trailing slash is refused, and not made a folder.
    let web = dir.path().join("web.json");
    let mut args = files.to_vec();
    args.extend(["--output", path_str(&web)]);
    let out = capture(&args);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("does not end with /"),
        "{}",
        text(&out.stderr)
    );
    assert!(!web.exists());

    let cases = dir.path().join("cases/");
    let mut args = files.to_vec();
    args.extend(["--output", path_str(&cases)]);
    let out = capture(&args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    // Again: the files exist, so it is refused without --force.
    let again = capture(&args);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again.stderr).contains("--force"),
        "{}",
        text(&again.stderr)
    );
    args.push("--force");
    assert!(capture(&args).status.success());
    let mut written: Vec<String> = std::fs::read_dir(&cases)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    assert_eq!(
        written,
        ["fc-mac-fc-mac.json", "oci-networkd-oci-networkd.json"]
    );
    for (plugin, file) in [
        ("fc-mac", "fc-mac-fc-mac.json"),
        ("oci-networkd", "oci-networkd-oci-networkd.json"),
    ] {
        let case = cases.join(file);
        let loaded = kit::load_case(&case).expect("valid case");
        let context = loaded.context.expect("context");
        assert_eq!(context["plugin"]["name"], plugin);
        assert_eq!(context["scenarios"], json!(["fc-mac", "oci-networkd"]));
        let tested = plugin_test(&builtin_file(dir.path(), plugin), &case);
        assert_eq!(tested.status.code(), Some(0), "{}", text(&tested.stdout));
    }

    let mut args = files.to_vec();
    args.extend(["--plugin", "fc-mac"]);
    let out = capture(&args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert_eq!(json_of(&out.stdout)["scenario"], "fc-mac");

    let mut args = files.to_vec();
    args.extend(["--plugin", "acme-net"]);
    let out = capture(&args);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("fc-mac (fc-mac), oci-networkd (oci-networkd)"));
}

/// The oci-static pod as it looks after a failed fixup: the failure record
/// with two attempts, and a hint whose header names an older plugin.
fn failed_pod() -> Value {
    let mut pod: Value =
        serde_json::from_str(&std::fs::read_to_string(example("oci-static", "pod.json")).unwrap())
            .unwrap();
    let script = "#!/bin/sh\n# cocoon-fixup oci-networkd plan for VM vk-apps-web-0-f8181b (id vm-7f3a9c21)\n# plugins: oci-networkd 0.0.9 sha256:0123456789ab\n# Paste into a root shell in the guest. Stops at the first failing step.\n(\necho hi\n)\n";
    let hint = base64::engine::general_purpose::STANDARD.encode(script);
    let annotations = pod["metadata"]["annotations"].as_object_mut().unwrap();
    for (key, value) in [
        ("vm.cocoonstack.io/post-clone-state", "failed"),
        (
            "vm.cocoonstack.io/post-clone-errors",
            "attempt 1: step 4/5 failed exit 1: networkctl: not found\nattempt 2: step 4/5 failed exit 1: networkctl: not found",
        ),
        ("vm.cocoonstack.io/post-clone-hint", &hint),
        ("vm.cocoonstack.io/lifecycle-state", "Failed"),
        (
            "vm.cocoonstack.io/lifecycle-state-message",
            "attempt 1: step 4/5 failed exit 1: networkctl: not found\nattempt 2: step 4/5 failed exit 1: networkctl: not found",
        ),
    ] {
        annotations.insert(key.into(), json!(value));
    }
    pod
}

fn event(uid: &str, name: &str, reason: &str, note: &str) -> Value {
    json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": format!("{name}.{reason}"), "namespace": "apps"},
        "eventTime": "2026-11-30T09:13:01.000000Z",
        "reason": reason, "type": "Warning", "note": note, "action": "PostCloneFixup",
        "reportingController": "cocoon-fixup", "reportingInstance": "cocoon-node-1",
        "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": "apps", "name": name, "uid": uid},
    })
}

/// `event` as someone other than the host reports it.
fn forged(mut event: Value) -> Value {
    event["reportingController"] = json!("someone-else");
    event
}

const UID: &str = "5b7e0c2a-6f1d-4e8b-9c3a-1f2d4e6a8b01";
const FALLBACK: &str = "plugin acme-net 2.0.1 (sha256:abcdef012345) failed for oci-networkd: plugin acme-net trapped: unreachable; planned with the built-in oci-networkd 0.1.0 instead (failure policy `fallback`)";

#[test]
fn a_failed_pod_carries_its_error_chain_and_the_plugins_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let pod = dir.path().join("pod.json");
    std::fs::write(&pod, failed_pod().to_string()).unwrap();
    let events = dir.path().join("events.json");
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [
        event(UID, "web-0", "PostClonePluginFallback", FALLBACK),
        event(UID, "web-0", "PostCloneExecAttemptFailed", "attempt 1: step 4/5 failed exit 1"),
        event(UID, "web-0", "Scheduled", "not the host's"),
        event("another-uid", "web-1", "PostCloneExecExhausted", "another pod's"),
        forged(event(UID, "web-0", "PostCloneExecExhausted", "forged")),
    ]});
    std::fs::write(&events, list.to_string()).unwrap();
    let case = dir.path().join("case.json");
    let out = capture(&[
        "--pod",
        path_str(&pod),
        "--vm",
        path_str(&example("oci-static", "vm.json")),
        "--events",
        path_str(&events),
        "--output",
        path_str(&case),
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    // The built-in has no file to hand `plugin test`: the note says so
    // rather than name one.
    let said = text(&out.stderr);
    assert!(said.contains("wrote "), "{said}");
    assert!(
        said.contains("oci-networkd is built in (there is no file to test)")
            && !said.contains(".wasm>"),
        "{said}"
    );
    let loaded = kit::load_case(&case).expect("valid case");
    let context = Value::Object(loaded.context.expect("context"));
    let field = &context["field"];
    assert_eq!(field["post_clone_state"], "failed");
    assert!(
        field["unverified"]
            .as_str()
            .is_some_and(|s| s.contains("anyone who may create events")),
        "{field}"
    );
    assert_eq!(
        field["errors"],
        json!([
            "attempt 1: step 4/5 failed exit 1: networkctl: not found",
            "attempt 2: step 4/5 failed exit 1: networkctl: not found"
        ])
    );
    assert_eq!(field["lifecycle_state"], "Failed");
    assert_eq!(context["daemon"], "parked: the fixup failed earlier");
    assert_eq!(context["composed"]["result"], "ok");
    assert_eq!(context["composed"]["fallbacks"], json!([]));
    assert!(context["limits"]["plan_max_steps"].as_u64().unwrap() > 0);
    assert_eq!(
        field["hint"]["plugins"],
        json!([{"name": "oci-networkd", "version": "0.0.9", "sha256": "0123456789ab", "from": "hint"}])
    );
    let reasons: Vec<&str> = field["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert_eq!(
        reasons,
        ["PostClonePluginFallback", "PostCloneExecAttemptFailed"]
    );
    let named: Vec<(String, String)> = field["plugins_named"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["version"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for expected in [
        ("oci-networkd", "0.0.9"),
        ("acme-net", "2.0.1"),
        ("oci-networkd", "0.1.0"),
    ] {
        assert!(
            named.contains(&(expected.0.to_owned(), expected.1.to_owned())),
            "{expected:?} in {named:?}"
        );
    }
    assert!(
        context["summary"]
            .as_str()
            .is_some_and(|s| s.contains("the pod records: failed, attempt 2:")),
        "{context}"
    );
    let tested = plugin_test(&builtin_file(dir.path(), "oci-networkd"), &case);
    assert_eq!(tested.status.code(), Some(0), "{}", text(&tested.stdout));
}

/// A capture from the cluster: `cocoon-fixup capture -n NS --pod NAME`
/// against the fake API server holding `pod`, `fake-cocoon` answering
/// inspect with `record`. Returns the output and the server.
async fn capture_online(
    pod: Value,
    record: Value,
    events: &[Value],
    extra: &[&str],
) -> (Output, FakeApi, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::os::unix::fs::symlink(fake_cocoon(), d.join("cocoon")).unwrap();
    let scenario = json!({"log": d.join("calls.jsonl"), "inspect": {"json": record}});
    std::fs::write(d.join("cocoon.json"), scenario.to_string()).unwrap();
    std::fs::create_dir(d.join("plugins")).unwrap();
    std::fs::write(d.join("config.toml"), "").unwrap();
    let namespace = pod["metadata"]["namespace"].as_str().unwrap().to_owned();
    let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
    let api = FakeApi::start(pod, false).await;
    for e in events {
        api.add_event(e.clone());
    }
    let out = cocoon_fixup(
        d,
        &api.kubeconfig(d),
        &[
            &["capture", "--namespace", &namespace, "--pod", &name],
            extra,
        ]
        .concat(),
    )
    .output()
    .await
    .expect("capture runs");
    (out, api, dir)
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The case without what differs between two captures of the same pod:
/// when and from where, and the summary that says so.
fn without_provenance(mut case: Value) -> Value {
    let context = case["context"].as_object_mut().expect("context");
    context.remove("captured");
    context.remove("summary");
    case
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_the_cluster_the_same_case_as_from_files() {
    let pod = failed_pod();
    let record = read_json(&example("oci-static", "vm.json"));
    let events = [
        event(UID, "web-0", "PostClonePluginFallback", FALLBACK),
        event(
            "another-uid",
            "web-1",
            "PostCloneExecExhausted",
            "another pod's",
        ),
        forged(event(UID, "web-0", "PostCloneExecExhausted", "forged")),
    ];
    let (out, api, dir) = capture_online(pod.clone(), record, &events, &[]).await;
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let online = json_of(&out.stdout);
    assert_eq!(online["context"]["captured"]["from"], "cluster");
    assert_eq!(
        online["context"]["field"]["events"]
            .as_array()
            .map(Vec::len),
        Some(1),
        "only this pod's: {}",
        online["context"]
    );
    api.with(|s| {
        assert!(
            s.patches.is_empty(),
            "capture writes nothing: {:?}",
            s.patches
        );
        assert!(s.unexpected.is_empty(), "{:?}", s.unexpected);
        let listed = s
            .requests
            .iter()
            .find(|r| r.method == "GET" && r.path.ends_with("/events"))
            .expect("the events were listed");
        assert!(listed.query.contains("regarding.uid"), "{}", listed.query);
        assert!(
            !s.requests.iter().any(|r| r.method == "POST"),
            "no event written"
        );
    });
    let calls = std::fs::read_to_string(dir.path().join("calls.jsonl")).unwrap();
    assert!(
        calls.contains(r#""argv":["vm","inspect","--json","vm-7f3a9c21"]"#),
        "{calls}"
    );

    // The same pod and VM from files, the events as kubectl lists them.
    let d = dir.path();
    std::fs::write(d.join("pod.json"), pod.to_string()).unwrap();
    std::fs::write(d.join("events.json"), json!({"items": events}).to_string()).unwrap();
    let offline = cocoon_fixup(
        d,
        &d.join("kubeconfig"),
        &[
            "capture",
            "--pod",
            path_str(&d.join("pod.json")),
            "--vm",
            path_str(&example("oci-static", "vm.json")),
            "--events",
            path_str(&d.join("events.json")),
        ],
    )
    .output()
    .await
    .expect("capture runs");
    assert!(
        offline.status.success(),
        "stderr: {}",
        text(&offline.stderr)
    );
    assert_eq!(
        without_provenance(json_of(&offline.stdout)),
        without_provenance(online)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_that_is_not_the_pods_is_refused() {
    let pod = read_json(&example("oci-static", "pod.json"));
    let mut record = read_json(&example("oci-static", "vm.json"));
    let other = fixup_core::binding::vm_name_for_pod("tenant-b", "db-0");
    record["config"]["name"] = json!(other);
    let (out, api, _dir) = capture_online(pod, record, &[], &[]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "no case: {}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("not this pod's VM"), "{stderr}");
    assert!(stderr.contains("the daemon runs nothing"), "{stderr}");
    api.with(|s| {
        assert!(s.patches.is_empty());
        assert!(!s.requests.iter().any(|r| r.method == "POST"));
    });
}

#[test]
fn help_and_bad_input() {
    let out = Command::new(env!("CARGO_BIN_EXE_cocoon-fixup"))
        .args(["capture", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = text(&out.stdout);
    for flag in [
        "--namespace",
        "--pod",
        "--vm",
        "--events",
        "--plugin",
        "--output",
        "--force",
        "plugin test",
        // The folder example ends with the slash that makes it a folder.
        "--output cases/",
        "--output DIR/",
    ] {
        assert!(help.contains(flag), "--help lists {flag}: {help}");
    }
    let out = capture(&["--pod", "web-0", "--events", "events.json"]);
    assert_eq!(out.status.code(), Some(2), "--events needs --vm");
    // (example, --events file, what the error says)
    let refused = [
        ("oci-static", Some("vm.json"), "`items`"),
        ("unmanaged", None, "leaves it alone (not-managed)"),
    ];
    for (name, events, needle) in refused {
        let (pod, vm) = (example(name, "pod.json"), example(name, "vm.json"));
        let mut args = vec!["--pod", path_str(&pod), "--vm", path_str(&vm)];
        let events = events.map(|file| example(name, file));
        if let Some(events) = &events {
            args.extend(["--events", path_str(events)]);
        }
        let out = capture(&args);
        assert_eq!(out.status.code(), Some(1), "{name}");
        let stderr = text(&out.stderr);
        assert!(stderr.starts_with("error: "), "{stderr}");
        assert!(stderr.contains(needle), "{name}: {stderr}");
    }
}

/// Work a restart interrupted (`post-clone-state: running`) is planned as
/// resumed work, as the daemon plans it; `--boot` overrides it.
#[test]
fn a_running_pod_is_captured_as_resumed_work() {
    let dir = tempfile::tempdir().unwrap();
    let mut pod = read_json(&example("oci-static", "pod.json"));
    pod["metadata"]["annotations"]["vm.cocoonstack.io/post-clone-state"] = json!("running");
    let file = dir.path().join("pod.json");
    std::fs::write(&file, pod.to_string()).unwrap();
    let vm = example("oci-static", "vm.json");
    let files = ["--pod", path_str(&file), "--vm", path_str(&vm)];
    let out = capture(&files);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let case = json_of(&out.stdout);
    assert_eq!(case["facts"]["boot"], "resumed");
    let why = case["context"]["boot_assumed"].as_str().unwrap();
    assert!(
        why.starts_with("resumed: post-clone-state is running"),
        "{why}"
    );
    let stderr = text(&out.stderr);
    assert_eq!(stderr.matches("note: boot resumed").count(), 1, "{stderr}");
    let mut args = files.to_vec();
    args.extend(["--boot", "clone"]);
    let out = capture(&args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let case = json_of(&out.stdout);
    assert_eq!(case["facts"]["boot"], "clone");
    assert_eq!(case["context"]["boot_assumed"], "clone: given with --boot");
    assert!(!text(&out.stderr).contains("note: boot"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_is_given_in_the_cluster_form_too() {
    let mut pod = read_json(&example("oci-static", "pod.json"));
    pod["metadata"]["annotations"]["vm.cocoonstack.io/post-clone-state"] = json!("running");
    let record = read_json(&example("oci-static", "vm.json"));
    let (out, _api, _dir) = capture_online(pod.clone(), record.clone(), &[], &[]).await;
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert_eq!(json_of(&out.stdout)["facts"]["boot"], "resumed");
    assert!(text(&out.stderr).contains("note: boot resumed"));
    let (out, _api, _dir) = capture_online(pod, record, &[], &["--boot", "clone"]).await;
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert_eq!(json_of(&out.stdout)["facts"]["boot"], "clone");
}

#[test]
fn a_case_file_escapes_control_and_bidi_characters() {
    let dir = tempfile::tempdir().unwrap();
    let mut pod = failed_pod();
    let errors = "attempt 1: \u{1b}[31mred\u{202e}txt.exe\u{9b}";
    pod["metadata"]["annotations"]["vm.cocoonstack.io/post-clone-errors"] = json!(errors);
    let file = dir.path().join("pod.json");
    std::fs::write(&file, pod.to_string()).unwrap();
    let case = dir.path().join("case.json");
    let vm = example("oci-static", "vm.json");
    let out = capture(&[
        "--pod",
        path_str(&file),
        "--vm",
        path_str(&vm),
        "--output",
        path_str(&case),
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let written = std::fs::read_to_string(&case).unwrap();
    for c in ['\u{1b}', '\u{202e}', '\u{9b}'] {
        assert!(!written.contains(c), "{c:?} escaped in {written}");
    }
    let loaded = kit::load_case(&case).expect("valid case");
    assert_eq!(loaded.context.unwrap()["field"]["errors"], json!([errors]));
}

#[test]
fn a_pod_the_daemon_leaves_alone_is_refused_unless_anyway() {
    let dir = tempfile::tempdir().unwrap();
    let mut pod = read_json(&example("oci-static", "pod.json"));
    pod["metadata"]["deletionTimestamp"] = json!("2026-12-01T10:00:00Z");
    let file = dir.path().join("pod.json");
    std::fs::write(&file, pod.to_string()).unwrap();
    let vm = example("oci-static", "vm.json");
    let files = ["--pod", path_str(&file), "--vm", path_str(&vm)];
    let out = capture(&files);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("leaves it alone (deleting)") && stderr.contains("--anyway"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());

    let mut args = files.to_vec();
    args.push("--anyway");
    let out = capture(&args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let case = json_of(&out.stdout);
    assert_eq!(case["context"]["daemon"], "nothing: deleting");
    assert_eq!(case["context"]["field"]["deleting"], true);

    // A parked (failed) pod is still captured without --anyway.
    let mut pod = read_json(&example("oci-static", "pod.json"));
    pod["metadata"]["annotations"]["vm.cocoonstack.io/post-clone-state"] = json!("failed");
    std::fs::write(&file, pod.to_string()).unwrap();
    let out = capture(&files);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let daemon = json_of(&out.stdout)["context"]["daemon"].clone();
    assert!(daemon.as_str().unwrap().starts_with("parked"), "{daemon}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_the_cluster_at_most_the_newest_200_events_are_kept() {
    let events: Vec<Value> = (0..205)
        .map(|i| {
            let mut e = event(UID, "web-0", "PostCloneExecAttemptFailed", &format!("n{i}"));
            e["eventTime"] = json!(format!("2026-11-30T09:{:02}:{:02}.000000Z", i / 60, i % 60));
            e
        })
        .collect();
    let record = read_json(&example("oci-static", "vm.json"));
    let (out, _api, _dir) = capture_online(failed_pod(), record, &events, &[]).await;
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let field = json_of(&out.stdout)["context"]["field"].clone();
    let kept = field["events"].as_array().unwrap();
    assert_eq!(kept.len(), 200);
    assert_eq!(kept[0]["message"], "n5", "the oldest are dropped");
    assert_eq!(field["events_truncated"], true);
}

#[test]
fn from_files_a_pod_that_names_no_vm_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut pod = read_json(&example("oci-static", "pod.json"));
    let annotations = pod["metadata"]["annotations"].as_object_mut().unwrap();
    annotations.remove("vm.cocoonstack.io/id");
    annotations.remove("vm.cocoonstack.io/name");
    let file = dir.path().join("pod.json");
    std::fs::write(&file, pod.to_string()).unwrap();
    let vm = example("oci-static", "vm.json");
    let out = capture(&["--pod", path_str(&file), "--vm", path_str(&vm)]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("names no VM"), "{stderr}");
    assert!(out.stdout.is_empty());
}

/// The stack's `Woken` event makes a Cloud Hypervisor Windows VM a wake
/// for capture as for the daemon (spec section 2, rule 2): no PnP case is
/// captured for it, since the daemon would run none. Without the event
/// (or with the host's own, or another pod's) it is a clone, and its
/// windows-pnp call is the case.
#[test]
fn the_stacks_wake_event_makes_capture_plan_a_wake() {
    let dir = tempfile::tempdir().unwrap();
    let uid = "7d93a1e5-4c2b-48f0-a6d7-e15b0c9f2a38";
    let woken = |controller: &str, about: &str| {
        json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "reason": "Woken",
            "type": "Normal",
            "reportingController": controller,
            "regarding": {"kind": "Pod", "uid": about, "name": "desk-0", "namespace": "desktops"},
            "eventTime": "2026-11-30T09:12:47.000000Z",
        })
    };
    let run = |items: Vec<Value>| {
        let events = dir.path().join("events.json");
        std::fs::write(&events, json!({"items": items}).to_string()).unwrap();
        capture(&[
            "--pod",
            path_str(&example("windows", "pod.json")),
            "--vm",
            path_str(&example("windows", "vm.json")),
            "--events",
            path_str(&events),
        ])
    };
    for not_a_wake in [
        vec![],
        vec![woken("cocoon-fixup", uid)],
        vec![woken("vk-cocoon", "another-uid")],
    ] {
        let out = run(not_a_wake.clone());
        assert!(
            out.status.success(),
            "{not_a_wake:?}: {}",
            text(&out.stderr)
        );
        assert_eq!(json_of(&out.stdout)["scenario"], "windows-pnp");
    }
    // As events.k8s.io/v1 lists it, and as `kubectl get events -o json`
    // prints it (core/v1).
    let core_v1 = json!({
        "apiVersion": "v1",
        "kind": "Event",
        "reason": "Woken",
        "type": "Normal",
        "reportingComponent": "vk-cocoon",
        "involvedObject": {"kind": "Pod", "uid": uid, "name": "desk-0", "namespace": "desktops"},
        "lastTimestamp": "2026-11-30T09:12:47Z",
    });
    for wake in [woken("vk-cocoon", uid), core_v1] {
        let out = run(vec![wake]);
        let said = text(&out.stderr);
        assert!(!out.status.success(), "a wake has no plugin call: {said}");
        assert!(
            said.contains("boot wake: the stack's Woken or HibernateSnapshotExists event"),
            "{said}"
        );
        assert!(said.contains("rule 3"), "{said}");
    }
}
