//! The Windows static-IP pass (spec section 10) through the real
//! `cocoon-fixup run` binary: a fake API server holding a Windows pod with
//! a static NIC, `fake-cocoon` answering inspect and the PnP exec, and the
//! SAC simulator (`fixup_sac::sim`) listening on the VM's console socket
//! below the cocoon root, as Cloud Hypervisor's console does.

use std::fs;
use std::path::Path;

use fixup_core::annotations::{keys, reasons};
use fixup_sac::sim::{Script, SetMode, Sim, SimNet, console_path_in};
use serde_json::{Value, json};

use crate::support::binary::cocoon_fixup;
use crate::support::fake::fake_cocoon;
use crate::support::fake_api::FakeApi;

const VM_ID: &str = "vm-5ac0ffee";

fn pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "win-0", "namespace": "prod",
            "uid": "0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f", "annotations": {
                "vm.cocoonstack.io/name": fixup_core::binding::vm_name_for_pod("prod", "win-0"),
                "vm.cocoonstack.io/id": VM_ID,
                "cocoonset.cocoonstack.io/managed": "true",
                "cocoonset.cocoonstack.io/os": "windows",
                "vm.cocoonstack.io/backend": "cloud-hypervisor",
            }},
        "spec": {"nodeName": "n1", "containers": []},
    })
}

/// A static first NIC (no prefix in the record: 24) and a DHCP second one.
fn record() -> Value {
    json!({"id": VM_ID, "hypervisor": "cloud-hypervisor", "state": "running",
    "config": {"name": fixup_core::binding::vm_name_for_pod("prod", "win-0"),
        "image": "ghcr.io/cocoonstack/windows:2022"},
    "network_configs": [
        {"mac": "52:54:00:5a:c0:01", "tap": "tap0",
            "network": {"ip": "10.88.0.12", "gateway": "10.88.0.1"}},
        {"mac": "52:54:00:5a:c0:02", "tap": "tap1"},
    ]})
}

/// `cocoon-fixup run` for the pod, with the console answering by `script`:
/// the exit code, what the console received, and the server.
async fn run(dir: &Path, script: Script) -> (Option<i32>, Vec<String>, FakeApi) {
    std::os::unix::fs::symlink(fake_cocoon(), dir.join("cocoon")).unwrap();
    let scenario = json!({
        "log": dir.join("calls.jsonl"),
        "exec": [{"exit": 0, "done": true}],
        "inspect": {"json": record()},
    });
    fs::write(dir.join("cocoon.json"), scenario.to_string()).unwrap();
    fs::create_dir(dir.join("plugins")).unwrap();
    fs::write(dir.join("config.toml"), "").unwrap();
    let console = Sim::start(console_path_in(dir, VM_ID).unwrap(), script).unwrap();
    let api = FakeApi::start(pod(), false).await;
    let out = cocoon_fixup(
        dir,
        &api.kubeconfig(dir),
        &["run", "--namespace", "prod", "--pod", "win-0"],
    )
    .output()
    .await
    .expect("run runs");
    let received = console.received();
    drop(console);
    (out.status.code(), received, api)
}

/// The guest's interfaces 7 (the first NIC) and 9 (the DHCP one), listed
/// in that order.
fn nets(first: SetMode) -> Script {
    Script::new()
        .net(SimNet::new(7, "169.254.10.2").set_mode(first))
        .net(SimNet::new(9, "10.88.1.40"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_static_address_is_set_over_the_console_then_published() {
    let dir = tempfile::tempdir().unwrap();
    let (code, received, api) = run(dir.path(), nets(SetMode::Takes)).await;
    assert_eq!(code, Some(0), "run succeeds");
    assert!(
        received.contains(&"i 7 10.88.0.12 255.255.255.0 10.88.0.1\r\n".to_owned()),
        "the first NIC's address on the first interface, a missing prefix as 24: {received:?}"
    );
    assert!(
        received.iter().all(|line| !line.starts_with("i 9 ")),
        "the DHCP NIC gets no set line: {received:?}"
    );
    assert_eq!(
        api.annotation(keys::POST_CLONE_STATE).as_deref(),
        Some("done")
    );
    assert_eq!(api.annotation(keys::IP).as_deref(), Some("10.88.0.12"));
    assert_eq!(
        api.annotation(keys::LIFECYCLE_STATE).as_deref(),
        Some("ready")
    );
    let events: Vec<String> = api.events().into_iter().map(|(r, _)| r).collect();
    assert!(
        events.contains(&reasons::SUCCEEDED.to_owned()),
        "{events:?}"
    );
}

/// A set line that gets no answer fails the pass at once: its own event,
/// then the pod failed with WindowsStaticIPFailed, no IP published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_without_an_answer_fails_the_pod() {
    let dir = tempfile::tempdir().unwrap();
    let (code, received, api) = run(dir.path(), nets(SetMode::NoAnswer)).await;
    assert_eq!(code, Some(2), "run reports a failed fixup");
    assert_eq!(
        received
            .iter()
            .filter(|line| line.starts_with("i 7 "))
            .count(),
        1,
        "no second round after a set without an answer: {received:?}"
    );
    assert_eq!(
        api.annotation(keys::POST_CLONE_STATE).as_deref(),
        Some("failed")
    );
    assert_eq!(
        api.annotation(keys::LIFECYCLE_STATE).as_deref(),
        Some("failed")
    );
    assert_eq!(api.annotation(keys::IP), None, "no IP published");
    let events = api.events();
    let reasons_seen: Vec<&str> = events.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        reasons_seen
            .iter()
            .filter(|r| **r != reasons::SUCCEEDED)
            .copied()
            .collect::<Vec<_>>(),
        [reasons::SET_FAILED, reasons::WINDOWS_STATIC_IP_FAILED],
        "{events:?}"
    );
    assert!(!reasons_seen.contains(&reasons::SUCCEEDED), "{events:?}");
    let (_, message) = &events[1];
    assert!(
        message.starts_with("create: sac set ip net 7: "),
        "{message}"
    );
}
