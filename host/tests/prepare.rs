//! A parent's preparation (docs/behaviour.md section 11) through the real
//! `cocoon-fixup prepare` binary: a fake API server holding a running
//! parent pod, `fake-cocoon` answering inspect and the plan's exec.

use std::fs;
use std::path::Path;

use fixup_core::annotations::{keys, reasons};
use fixup_core::decision::Prepared;
use serde_json::{Value, json};

use crate::support::binary::cocoon_fixup;
use crate::support::fake::fake_cocoon;
use crate::support::fake_api::FakeApi;

const VM_ID: &str = "vm-9a7e0001";

fn pod(os: &str, lifecycle: &str) -> Value {
    let mut annotations = json!({
        "vm.cocoonstack.io/name": fixup_core::binding::vm_name_for_pod("apps", "web-parent"),
        "vm.cocoonstack.io/id": VM_ID,
        "cocoonset.cocoonstack.io/managed": "true",
        "vm.cocoonstack.io/backend": "cloud-hypervisor",
    });
    if !os.is_empty() {
        annotations["cocoonset.cocoonstack.io/os"] = json!(os);
    }
    if !lifecycle.is_empty() {
        annotations[keys::LIFECYCLE_STATE] = json!(lifecycle);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web-parent", "namespace": "apps",
            "uid": "5e1d0c2b-7a9f-4e3d-8c1b-2a3f4e5d6c7b", "annotations": annotations},
        "spec": {"nodeName": "n1", "containers": []},
    })
}

fn record() -> Value {
    json!({"id": VM_ID, "hypervisor": "cloud-hypervisor", "state": "running",
    "config": {"name": fixup_core::binding::vm_name_for_pod("apps", "web-parent"),
        "image": "ghcr.io/cocoonstack/ubuntu:24.04"},
    "network_configs": [{"mac": "52:54:00:9a:7e:01", "tap": "tap0"}]})
}

/// `cocoon-fixup prepare` for `pod`, each exec answered by `exec`: the exit
/// code, the JSON summary, the calls `cocoon` saw and the server.
async fn prepare(dir: &Path, pod: Value, exec: Value) -> (Option<i32>, Value, Vec<Value>, FakeApi) {
    std::os::unix::fs::symlink(fake_cocoon(), dir.join("cocoon")).unwrap();
    let scenario = json!({
        "log": dir.join("calls.jsonl"),
        "state_file": dir.join("state.count"),
        "exec": exec,
        "inspect": {"json": record()},
    });
    fs::write(dir.join("cocoon.json"), scenario.to_string()).unwrap();
    fs::create_dir(dir.join("plugins")).unwrap();
    fs::write(
        dir.join("config.toml"),
        "retry_interval = \"200ms\"\nretry_budget = \"1s\"\n",
    )
    .unwrap();
    let api = FakeApi::start(pod, false).await;
    let out = cocoon_fixup(
        dir,
        &api.kubeconfig(dir),
        &["prepare", "--namespace", "apps", "--pod", "web-parent"],
    )
    .output()
    .await
    .expect("prepare runs");
    let summary = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let calls = fs::read_to_string(dir.join("calls.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (out.status.code(), summary, calls, api)
}

fn execs(calls: &[Value]) -> Vec<String> {
    calls
        .iter()
        .filter(|c| c["argv"][0] == "vm" && c["argv"][1] == "exec")
        .map(|c| c["argv"].to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_is_prepared_and_says_by_which_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let (code, summary, calls, api) = prepare(
        dir.path(),
        pod("", "ready"),
        json!([{"exit": 0, "done": true}]),
    )
    .await;
    assert_eq!(code, Some(0), "{summary}");
    assert_eq!(summary["action"], "prepare", "{summary}");
    assert_eq!(summary["fixup"], "done", "{summary}");
    let execs = execs(&calls);
    assert_eq!(execs.len(), 1, "{execs:?}");
    assert!(
        execs[0].contains("99-cocoon-clone.network") && execs[0].contains("ClientIdentifier=mac"),
        "the exec writes the clone file: {}",
        execs[0]
    );
    // No negated MAC match (networkd ignores one), and an all-DHCP parent
    // has no static NIC to keep from the clone file.
    assert!(
        !execs[0].contains("MACAddress=!") && !execs[0].contains("99-cocoon-clone-parent"),
        "{}",
        execs[0]
    );
    let written = api.annotation(keys::PREPARED).expect("the pod says it");
    let prepared = Prepared::parse(&written).expect("a value a host writes");
    assert_eq!(prepared.plugin, "oci-networkd");
    assert_eq!(summary["prepared"], written.as_str(), "{summary}");
    assert_eq!(api.annotation(keys::POST_CLONE_STATE), None);
    assert_eq!(
        api.annotation(keys::LIFECYCLE_STATE).as_deref(),
        Some("ready"),
        "the parent's lifecycle is the stack's"
    );
    let events = api.events();
    assert_eq!(
        events.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(),
        [reasons::PREPARED],
        "{events:?}"
    );
}

/// Every attempt fails until the budget is spent: exit 2, nothing
/// written, one warning per attempt and one for the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preparation_that_never_takes_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (code, summary, calls, api) = prepare(
        dir.path(),
        pod("", ""),
        json!([{"exit": 1, "stderr": "networkctl: not found"}]),
    )
    .await;
    assert_eq!(code, Some(2), "{summary}");
    assert_eq!(summary["fixup"], "exhausted", "{summary}");
    let attempts = execs(&calls).len();
    assert!(attempts >= 2, "retried within the budget: {attempts}");
    assert_eq!(summary["attempts"], attempts, "{summary}");
    assert_eq!(api.annotation(keys::PREPARED), None);
    let reasons_seen: Vec<String> = api.events().into_iter().map(|(r, _)| r).collect();
    assert_eq!(
        reasons_seen.last().map(String::as_str),
        Some(reasons::PREPARE_FAILED),
        "{reasons_seen:?}"
    );
    assert_eq!(
        reasons_seen
            .iter()
            .filter(|r| *r == reasons::PREPARE_ATTEMPT_FAILED)
            .count(),
        attempts
    );
}

/// A Windows parent has nothing to prepare (exit 0, why in `errors`); a
/// hibernating one, or a failed one, is left alone (exit 4): none runs
/// anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_hibernating_and_failed_parents_run_nothing() {
    for (pod, want_code) in [
        (pod("windows", ""), 0),
        (pod("", "hibernating"), 4),
        (pod("", "failed"), 4),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (code, summary, calls, api) =
            prepare(dir.path(), pod, json!([{"exit": 0, "done": true}])).await;
        assert_eq!(code, Some(want_code), "{summary}");
        assert_eq!(summary["action"], "nothing", "{summary}");
        assert!(execs(&calls).is_empty(), "{calls:?}");
        assert_eq!(api.annotation(keys::PREPARED), None);
        assert!(api.events().is_empty());
    }
}

#[test]
fn help_explains_prepare() {
    let out = std::process::Command::new(crate::support::binary::program())
        .args(["prepare", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "vm.cocoonstack.io/prepared",
        "Exit codes",
        "harmless",
        "--pod",
    ] {
        assert!(help.contains(needle), "{needle}: {help}");
    }
}
