//! Recognising a hibernate wake through the real daemon (spec section 2):
//! `cocoon-fixup serve` as a child process against the fake API server,
//! with `fake-cocoon` and a state directory of its own. A CH Windows VM
//! woken in place leaves nothing on the pod that says wake; the daemon
//! must recognise it from its own hibernate history (kept across a
//! restart) or from the stack's `Woken` event, and then run no PnP in the
//! guest (rule 3: the restored VM got a fresh NIC), only the IP wait. A
//! CH Windows pod with no evidence either way is held for the wake grace,
//! then fixed as a clone.
//!
//! Waits poll the fake server's state with a generous upper bound (a
//! safety net, not a timing assertion).

use crate::support;

use std::fs;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use fixup_host::pods::{keys, reasons};
use rustix::process::{Pid, Signal, kill_process};
use serde_json::{Map, Value, json};
use support::binary::cocoon_fixup;
use support::fake_api::FakeApi;
use support::vm_name;
use tokio::process::Child;

const UID: &str = "3c1e2b4a-9f0d-4e6b-8a7c-5d4e3f2a1b0c";
const MAC: &str = "52:54:00:77:88:99";

/// The longest any wait below may take before the test gives up.
const PATIENCE: Duration = Duration::from_secs(120);

/// A CH Windows pod of the stack, its VM `id` running and Ready.
fn pod(id: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "namespace": "default",
            "uid": UID,
            "annotations": {
                "vm.cocoonstack.io/name": vm_name(),
                "vm.cocoonstack.io/id": id,
                "cocoonset.cocoonstack.io/managed": "true",
                "cocoonset.cocoonstack.io/os": "windows",
                "vm.cocoonstack.io/backend": "cloud-hypervisor",
                "vm.cocoonstack.io/lifecycle-state": "ready",
            },
        },
        "spec": {"nodeName": "n1", "containers": []},
    })
}

struct Node {
    dir: tempfile::TempDir,
    api: FakeApi,
    kubeconfig: PathBuf,
}

impl Node {
    async fn new(pod: Value) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let api = FakeApi::start(pod, false).await;
        let kubeconfig = api.kubeconfig(dir.path());
        fs::create_dir(dir.path().join("plugins")).unwrap();
        fs::write(dir.path().join("config.toml"), "").unwrap();
        fs::write(dir.path().join("leases.json"), "[]").unwrap();
        support::fake_cocoon_in(dir.path());
        let node = Node {
            dir,
            api,
            kubeconfig,
        };
        node.vm("vm-1");
        node
    }

    /// cocoon's VM for the pod is `id` (one DHCP NIC); every exec works.
    fn vm(&self, id: &str) {
        let scenario = json!({
            "log": self.dir.path().join("calls.jsonl"),
            "exec": [{"exit": 0, "done": true}],
            "inspect": {"json": {"id": id, "config": {"name": vm_name()},
                "network_configs": [{"mac": MAC, "tap": "tap0"}]}},
        });
        let tmp = self.dir.path().join("scenario.tmp");
        fs::write(&tmp, scenario.to_string()).unwrap();
        fs::rename(tmp, self.dir.path().join("scenario.json")).unwrap();
    }

    /// cocoon-net gives the NIC its lease.
    fn lease(&self) {
        let rows = json!([{"mac": MAC, "ip": "10.0.0.9", "expiry": "2100-01-01T00:00:00Z"}]);
        let tmp = self.dir.path().join("leases.tmp");
        fs::write(&tmp, rows.to_string()).unwrap();
        fs::rename(tmp, self.dir.path().join("leases.json")).unwrap();
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn serve(&self, grace: &str) -> Child {
        let d = self.dir.path();
        cocoon_fixup(d, &self.kubeconfig, &["serve", "--node", "n1"])
            .arg("--state-dir")
            .arg(self.state_dir())
            .args(["--wake-grace", grace, "--metrics-addr", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(fs::File::create(d.join("daemon.log")).unwrap())
            .spawn()
            .expect("the daemon starts")
    }

    /// Execs the daemon ran in the guest.
    fn exec_calls(&self) -> usize {
        fs::read_to_string(self.dir.path().join("calls.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"exec_index\""))
            .count()
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    /// The daemon's record of the pod, as stored.
    fn record(&self) -> Value {
        fs::read(self.state_dir().join(format!("{UID}.json")))
            .map(|bytes| serde_json::from_slice(&bytes).unwrap())
            .unwrap_or(Value::Null)
    }

    async fn until(&self, what: &str, done: impl Fn(&Node) -> bool) {
        let start = std::time::Instant::now();
        while !done(self) {
            assert!(
                start.elapsed() < PATIENCE,
                "gave up waiting for {what}; daemon log:\n{}\nevents: {:#?}\nrecord: {}",
                self.log(),
                self.api.events(),
                self.record()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The stack hibernates the pod's VM: the request, then lifecycle
    /// `hibernating` and the id removed just before the VM, then
    /// `hibernated`.
    async fn hibernate(&self) {
        self.api.modify_pod(|a| {
            a.insert("vm.cocoonstack.io/hibernate".into(), json!("true"));
        });
        self.api.modify_pod(|a| {
            a.insert(keys::LIFECYCLE_STATE.into(), json!("hibernating"));
            a.remove("vm.cocoonstack.io/id");
            a.remove(keys::IP);
        });
        self.api.modify_pod(|a| {
            a.insert(keys::LIFECYCLE_STATE.into(), json!("hibernated"));
        });
    }

    /// The stack wakes the pod in place: the request cleared, lifecycle
    /// `creating`, the VM cloned again from its snapshot as `id`, and the
    /// new id written. Nothing says wake.
    fn wake(&self, id: &str) {
        self.vm(id);
        self.api.modify_pod(|a| {
            a.remove("vm.cocoonstack.io/hibernate");
            a.insert(keys::LIFECYCLE_STATE.into(), json!("creating"));
        });
        self.api.modify_pod(|a: &mut Map<String, Value>| {
            a.insert("vm.cocoonstack.io/id".into(), json!(id));
        });
    }

    fn ready_with_lease(&self) -> bool {
        self.api.annotation(keys::LIFECYCLE_STATE).as_deref() == Some("ready")
            && self.api.annotation(keys::IP).as_deref() == Some("10.0.0.9")
    }
}

fn sigterm(daemon: &Child) {
    let pid = daemon.id().expect("the daemon is running");
    let pid = Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
    kill_process(pid, Signal::TERM).unwrap();
}

async fn stop(node: &Node, mut daemon: Child) {
    sigterm(&daemon);
    let status = daemon.wait().await.unwrap();
    assert!(status.success(), "{status}; log:\n{}", node.log());
}

/// No PnP ran, nothing was marked, and no fixup was announced: the wake
/// got the IP wait alone.
fn assert_no_pnp(node: &Node) {
    assert_eq!(node.exec_calls(), 0, "no exec in a woken CH Windows VM");
    assert_eq!(node.api.annotation(keys::POST_CLONE_STATE), None);
    assert!(
        !node
            .api
            .events()
            .iter()
            .any(|(reason, _)| reason == reasons::SUCCEEDED),
        "{:#?}",
        node.api.events()
    );
}

/// The stack's `Woken` about the pod, as vk-cocoon reports it after a
/// wake in place.
fn woken_event() -> Value {
    json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "web-0.woken", "namespace": "default"},
        "eventTime": jiff::Timestamp::now().to_string(),
        "reason": "Woken",
        "note": "cloned from vk-default-web-0-hibernate",
        "type": "Normal",
        "reportingController": "vk-cocoon",
        "regarding": {"kind": "Pod", "namespace": "default", "name": "web-0", "uid": UID},
    })
}

/// The daemon sees the hibernation, is restarted while the pod is
/// hibernated, and meets the VM woken in place after the restart, with the
/// stack's `Woken` witnessing it: its durable history says wake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_in_place_is_recognised_by_history_across_a_restart() {
    let node = Node::new(pod("vm-1")).await;
    let daemon = node.serve("60s");
    node.until("a watch", |n| n.api.watches() >= 1).await;
    node.hibernate().await;
    node.until("the hibernation recorded", |n| {
        n.record()["hibernated"] == json!(true)
    })
    .await;
    stop(&node, daemon).await;
    assert_eq!(node.record()["last_vm"], "vm-1");

    node.wake("vm-2");
    node.api.add_event(woken_event());
    node.lease();
    // A grace of a minute: a VM taken for a clone would wait it out before
    // its PnP, and the pod would not be ready within the test's patience.
    let daemon = node.serve("60s");
    node.until("ready with the lease", Node::ready_with_lease)
        .await;
    assert_no_pnp(&node);
    let record = node.record();
    assert_eq!(record["verdict"]["vm"], "vm-2", "{record}");
    assert_eq!(record["verdict"]["by"], "history", "{record}");
    stop(&node, daemon).await;
}

/// The stack recreated the VM (its hibernate snapshot was gone) instead of
/// waking it: the daemon's history says "a wake or a recreate", no witness
/// of the stack comes within the grace, so the VM is the fresh clone it is
/// and gets its PnP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_without_the_stacks_witness_is_a_recreate_and_gets_pnp() {
    let node = Node::new(pod("vm-1")).await;
    let daemon = node.serve("200ms");
    node.until("a watch", |n| n.api.watches() >= 1).await;
    node.hibernate().await;
    node.until("the hibernation recorded", |n| {
        n.record()["hibernated"] == json!(true)
    })
    .await;
    node.wake("vm-2");
    node.lease();
    node.until("ready with the lease", Node::ready_with_lease)
        .await;
    assert!(node.exec_calls() >= 1, "PnP ran in the recreated VM");
    let record = node.record();
    assert_eq!(record["verdict"]["vm"], "vm-2", "{record}");
    assert_eq!(record["verdict"]["by"], "recreate", "{record}");
    stop(&node, daemon).await;
}

/// The stack's Normal event `Woken` about the pod says wake, on a pod
/// the daemon first sees mid-life (no history).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_in_place_is_recognised_by_the_stacks_woken_event() {
    let mut woken = pod("vm-2");
    woken["metadata"]["annotations"][keys::LIFECYCLE_STATE] = json!("creating");
    let node = Node::new(woken).await;
    node.vm("vm-2");
    node.lease();
    node.api.add_event(woken_event());
    let daemon = node.serve("60s");
    node.until("ready with the lease", Node::ready_with_lease)
        .await;
    assert_no_pnp(&node);
    assert_eq!(node.record()["verdict"]["by"], "woken");
    stop(&node, daemon).await;
}

/// With no evidence of a wake on a pod first seen mid-life, the daemon
/// holds the CH Windows pod for the grace, then fixes it as a clone (PnP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_evidence_the_grace_passes_and_the_clone_gets_its_pnp() {
    let mut clone = pod("vm-1");
    clone["metadata"]["annotations"][keys::LIFECYCLE_STATE] = json!("creating");
    let node = Node::new(clone).await;
    node.lease();
    let daemon = node.serve("200ms");
    node.until("ready with the lease", Node::ready_with_lease)
        .await;
    assert_eq!(node.exec_calls(), 1, "the PnP plan ran once");
    assert_eq!(
        node.api.annotation(keys::POST_CLONE_STATE).as_deref(),
        Some("done")
    );
    let record = node.record();
    assert_eq!(record["verdict"]["by"], "grace", "{record}");
    assert_eq!(record["marker_vm"], "vm-1", "{record}");
    stop(&node, daemon).await;
}
