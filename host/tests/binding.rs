//! Right pod, right VM, right moment: the host acts on a VM only when the
//! VM is the pod's own (spec section 2), and only while the decision table
//! of spec section 8 gives it work.
//!
//! One test (or table) per case, through `Host` with pods in memory and the
//! scripted `cocoon`, asserting what is run and what is written (nothing,
//! where nothing is due). The first four cases also run through the real
//! `cocoon-fixup run` binary against the fake API server and `fake-cocoon`
//! (`real_binary_*` at the end).

use crate::support;

use fixup_core::decision::FixupEnd;
use fixup_core::decision::Handled;
use fixup_core::decision::NodeError;
use fixup_core::decision::Readiness;
use fixup_core::lifecycle::HandsOff;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fixup_core::binding::{BindingPolicy, legacy_vm_name_for_pod, vm_name_for_pod};
use fixup_core::decision::{Stop, Summary, Trigger};
use fixup_core::facts::PodInput;
use fixup_core::planner::{Planner, PlannerOptions};
use fixup_host::host::{Host, HostConfig};
use fixup_host::metrics::Metrics;
use fixup_host::node_pods::OtherPods;
use fixup_host::pods::{
    AnnotationPatch, Event, EventType, MemoryPods, PodApi, PodError, PodRef, keys, reasons,
};
use fixup_host::ready::LeaseWatcher;
use fixup_host::serve::Dispatcher;
use serde_json::{Value, json};
use support::{Reply, ScriptedCocoon, pod};
use tokio_util::sync::CancellationToken;

const VM_ID: &str = "vm-0123abcd";
const STATIC_MAC: &str = "52:54:00:aa:bb:01";
const DHCP_MAC: &str = "52:54:00:aa:bb:02";

/// A VM record: `config.name`, `config.image`, NICs as `(mac, static IP)`.
fn record(name: &str, image: &str, nics: &[(&str, Option<&str>)]) -> String {
    let nics: Vec<Value> = nics
        .iter()
        .enumerate()
        .map(|(i, (mac, ip))| match ip {
            Some(ip) => json!({"mac": mac, "tap": format!("tap{i}"),
                "network": {"ip": ip, "prefix": 24, "gateway": "10.0.0.1"}}),
            None => json!({"mac": mac, "tap": format!("tap{i}")}),
        })
        .collect();
    json!({"id": VM_ID, "hypervisor": "cloud-hypervisor", "state": "running",
        "config": {"name": name, "image": image}, "network_configs": nics})
    .to_string()
}

/// A pod like `support::pod`, under another namespace and name, with its
/// VM name annotation set to `vm_name` (removed when empty).
fn pod_as(namespace: &str, name: &str, vm_name: &str, extra: &[(&str, &str)]) -> PodInput {
    let mut p = pod(extra);
    p.namespace = namespace.to_owned();
    p.name = name.to_owned();
    if vm_name.is_empty() {
        p.annotations.remove("vm.cocoonstack.io/name");
    } else {
        p.annotations
            .insert("vm.cocoonstack.io/name".into(), vm_name.into());
    }
    p
}

struct Rig {
    host: Arc<Host<ScriptedCocoon, MemoryPods>>,
    cocoon: ScriptedCocoon,
    pods: MemoryPods,
    lease_file: PathBuf,
    _dir: tempfile::TempDir,
}

struct Setup {
    replies: Vec<Reply>,
    record: String,
    pods: Vec<PodInput>,
    config: HostConfig,
    /// The cocoon root; `None` is an empty directory that exists.
    cocoon_root: Option<PathBuf>,
    plugin_dir: Option<PathBuf>,
    /// Where the host learns the node's other pods; `None`: nowhere.
    other_pods: Option<OtherPods>,
}

impl Setup {
    fn new(record: String, pods: Vec<PodInput>) -> Self {
        Setup {
            replies: vec![Reply::Done],
            record,
            pods,
            config: HostConfig::default(),
            cocoon_root: None,
            plugin_dir: None,
            other_pods: None,
        }
    }

    fn build(self) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let root = self.cocoon_root.unwrap_or_else(|| {
            let root = dir.path().join("cocoon-root");
            std::fs::create_dir_all(&root).unwrap();
            root
        });
        let (planner, _failures) = Planner::new(PlannerOptions {
            cocoon_root: root,
            plugin_dir: self.plugin_dir,
            ..PlannerOptions::default()
        })
        .unwrap();
        let cocoon = ScriptedCocoon::new(self.replies, self.record);
        let pods = MemoryPods::new();
        for p in self.pods {
            pods.insert(p);
        }
        let lease_file = dir.path().join("leases.json");
        let leases = LeaseWatcher::new(lease_file.clone(), Duration::from_millis(20)).unwrap();
        let host = Host::new(
            Arc::new(planner),
            cocoon.clone(),
            pods.clone(),
            Arc::new(leases),
            self.config,
            Arc::new(Metrics::new()),
        );
        let host = match self.other_pods {
            Some(other_pods) => host.with_other_pods(other_pods),
            None => host,
        };
        Rig {
            host: Arc::new(host),
            cocoon,
            pods,
            lease_file,
            _dir: dir,
        }
    }
}

impl Rig {
    async fn handle(&self, namespace: &str, name: &str) -> Result<Summary, Stop> {
        self.host
            .handle(namespace, name, Trigger::Event, &CancellationToken::new())
            .await
    }

    fn events(&self) -> Vec<(String, Event)> {
        self.pods
            .events()
            .into_iter()
            .map(|(p, e)| (p.to_string(), e))
            .collect()
    }

    fn annotation(&self, namespace: &str, name: &str, key: &str) -> Option<String> {
        self.pods
            .annotations(namespace, name)
            .unwrap()
            .get(key)
            .cloned()
    }

    fn write_lease(&self, mac: &str, ip: &str) {
        let lease = json!([{"mac": mac, "ip": ip, "expiry": "2099-01-01T00:00:00Z"}]);
        let tmp = self.lease_file.with_extension("tmp");
        std::fs::write(&tmp, lease.to_string()).unwrap();
        std::fs::rename(tmp, &self.lease_file).unwrap();
    }

    fn metrics(&self) -> String {
        self.host.metrics().encode()
    }
}

/// Nothing was run in any guest and nothing written to any pod.
fn assert_untouched(rig: &Rig) {
    assert!(rig.cocoon.calls().is_empty(), "{:?}", rig.cocoon.calls());
    assert!(rig.pods.patches().is_empty(), "{:?}", rig.pods.patches());
}

/// Short IP waits in real time (the lease watcher reads a real file).
fn short_ready() -> HostConfig {
    let mut config = HostConfig::default();
    config.ready.budget = Duration::from_secs(2);
    config.ready.renew_after = Duration::from_millis(300);
    config.ready.renew_timeout = Duration::from_millis(500);
    config.ready.dhcp_recovery_after = Duration::from_millis(300);
    config.ready.recovery_timeout = Duration::from_millis(500);
    config
}

// ---- 1. another tenant's VM ----

/// A pod in `tenant-a` that names, in its own annotations, the VM of a pod
/// in `tenant-b` gets nothing run and nothing published: one Warning event
/// on the pod that asked, naming the VM it should have, and not the other
/// tenant's (a pod's events must not tell which VMs exist on the node).
/// The victim is not touched.
#[rstest::rstest]
#[case::id_and_name(true, true)]
#[case::id_only(true, false)]
#[case::name_only(false, true)]
#[tokio::test(start_paused = true)]
async fn another_tenants_vm_gets_nothing(#[case] with_id: bool, #[case] with_name: bool) {
    let victim_name = vm_name_for_pod("tenant-b", "db-0");
    let victim = pod_as("tenant-b", "db-0", &victim_name, &[]);
    let mut attacker = pod_as(
        "tenant-a",
        "evil",
        if with_name { &victim_name } else { "" },
        &[],
    );
    if !with_id {
        attacker.annotations.remove("vm.cocoonstack.io/id");
    }
    let rig = Setup::new(
        record(&victim_name, "", &[(STATIC_MAC, Some("10.0.0.5"))]),
        vec![victim.clone(), attacker],
    )
    .build();
    let summary = rig.handle("tenant-a", "evil").await.unwrap();
    assert_eq!(summary.action, Handled::VmMismatch);
    assert_eq!(summary.readiness, None);
    assert_eq!(summary.ip, None);
    assert_untouched(&rig);
    let events = rig.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let (target, event) = &events[0];
    assert_eq!(target, "tenant-a/evil", "only the pod that asked is told");
    assert_eq!(event.reason, reasons::VM_MISMATCH);
    assert_eq!(event.kind, EventType::Warning);
    assert!(!event.message.contains(&victim_name), "{}", event.message);
    assert!(!event.message.contains("tenant-b"), "{}", event.message);
    assert!(
        event.message.contains(&vm_name_for_pod("tenant-a", "evil")),
        "{}",
        event.message
    );
    assert!(
        summary.mismatch.as_deref().unwrap().contains(&victim_name),
        "the operator's summary has both names"
    );
    assert_eq!(
        rig.pods.annotations("tenant-b", "db-0").unwrap(),
        victim.annotations
    );
    assert!(rig.metrics().contains("cocoon_fixup_vm_mismatches_total 1"));
}

/// The pod's own VM, found through the same annotations, is fixed up.
#[tokio::test(start_paused = true)]
async fn the_pods_own_vm_is_bound_and_fixed() {
    let name = vm_name_for_pod("tenant-a", "web-0");
    let rig = Setup::new(
        record(&name, "", &[(STATIC_MAC, Some("10.0.0.5"))]),
        vec![pod_as("tenant-a", "web-0", &name, &[])],
    )
    .build();
    let summary = rig.handle("tenant-a", "web-0").await.unwrap();
    assert_eq!(summary.fixup, Some(FixupEnd::Done));
    assert_eq!(summary.readiness, Some(Readiness::Ready));
    let calls = rig.cocoon.calls();
    assert_eq!(calls.len(), 1);
    assert!(
        calls[0].argv[2].contains(&format!("'{name}\n'")),
        "the hostname is the record's name"
    );
}

/// The legacy unhashed name binds only when the operator opts in.
#[rstest::rstest]
#[case::refused(false, "vm-mismatch")]
#[case::accepted(true, "fixup")]
#[tokio::test(start_paused = true)]
async fn a_legacy_name_binds_only_by_policy(#[case] accept: bool, #[case] action: &str) {
    let legacy = legacy_vm_name_for_pod("tenant-a", "web-0");
    let mut setup = Setup::new(
        record(&legacy, "", &[(STATIC_MAC, Some("10.0.0.5"))]),
        vec![pod_as("tenant-a", "web-0", "", &[])],
    );
    setup.config.binding = BindingPolicy {
        accept_legacy_names: accept,
        ..BindingPolicy::default()
    };
    let rig = setup.build();
    let summary = rig.handle("tenant-a", "web-0").await.unwrap();
    assert_eq!(summary.action.as_str(), action);
    assert_eq!(rig.cocoon.calls().len(), usize::from(accept));
}

/// The retired cocoon-webhook's Deployment slot: pod
/// `prod/demo-7b7c9d9d5f-x2x4z` annotated with, and its VM named,
/// `vk-prod-demo-1`. It binds only with `--accept-annotated-vm-names`,
/// only when the host can list the node's pods (here `run`'s listing,
/// `OtherPods::List`), and only when none of them claims the name. The
/// pod's owner is never told to remove their annotations for it, nor
/// which other pod claims the name.
#[rstest::rstest]
#[case::accepted(true, None, true, Some("fixup"))]
#[case::not_accepted(false, None, true, Some("vm-mismatch"))]
#[case::claimed_by_an_annotation(true, Some(("prod", "demo-7b7c9d9d5f-q9w8e", "vk-prod-demo-1")), true, Some("vm-mismatch"))]
#[case::claimed_as_a_derived_name(true, Some(("prod", "demo-1", "")), true, Some("vm-mismatch"))]
#[case::no_view_of_the_node(true, None, false, None)]
#[tokio::test(start_paused = true)]
async fn an_annotated_name_binds_only_by_policy_and_unclaimed(
    #[case] accept: bool,
    #[case] other: Option<(&str, &str, &str)>,
    #[case] listed: bool,
    #[case] action: Option<&str>,
) {
    const SLOT: &str = "vk-prod-demo-1";
    let mut pods = vec![pod_as("prod", "demo-7b7c9d9d5f-x2x4z", SLOT, &[])];
    pods.push(PodInput {
        uid: Some("uid-web-0".into()),
        ..pod_as("prod", "web-0", &vm_name_for_pod("prod", "web-0"), &[])
    });
    if let Some((namespace, name, vm_name)) = other {
        pods.push(PodInput {
            uid: Some(format!("uid-{name}")),
            ..pod_as(namespace, name, vm_name, &[])
        });
    }
    let mut setup = Setup::new(record(SLOT, "", &[(STATIC_MAC, Some("10.0.0.5"))]), pods);
    setup.config.binding = BindingPolicy {
        accept_annotated_names: accept,
        ..BindingPolicy::default()
    };
    if listed {
        setup.other_pods = Some(OtherPods::List { node: "n1".into() });
    }
    let rig = setup.build();
    let result = rig.handle("prod", "demo-7b7c9d9d5f-x2x4z").await;
    let Some(action) = action else {
        let error = result.unwrap_err();
        assert!(matches!(error, Stop::Unproven { .. }), "{error}");
        assert!(error.is_retryable());
        assert!(error.to_string().contains(SLOT), "{error}");
        assert_untouched(&rig);
        assert!(rig.events().is_empty(), "{:?}", rig.events());
        return;
    };
    let summary = result.unwrap();
    assert_eq!(summary.action.as_str(), action);
    if action == "fixup" {
        assert_eq!(summary.fixup, Some(FixupEnd::Done));
        let calls = rig.cocoon.calls();
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert!(
            calls[0].argv[2].contains(&format!("'{SLOT}\n'")),
            "the hostname is the record's name"
        );
        return;
    }
    assert_untouched(&rig);
    let events = rig.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let message = &events[0].1.message;
    assert_eq!(events[0].1.reason, reasons::VM_MISMATCH);
    assert!(
        !message.contains("remove"),
        "not blamed on annotations: {message}"
    );
    if let Some((namespace, name, _)) = other {
        // `demo-1` is part of the slot name, which the pod's own
        // annotation carries.
        if !SLOT.contains(name) {
            assert!(!message.contains(name), "{message}");
        }
        assert!(
            !message.contains(&format!("{namespace}/{name}")),
            "{message}"
        );
        assert!(
            summary.mismatch.as_deref().unwrap().contains(name),
            "the operator's summary names the pod that claims it"
        );
    } else {
        assert!(message.contains("--accept-annotated-vm-names"), "{message}");
    }
}

// ---- 2, 3 and 4: what the stack owns, and what is not a clone ----

/// Pods the table leaves alone: not even `cocoon vm inspect` runs, and
/// nothing is written or told.
#[rstest::rstest]
#[case::hibernating(&[(keys::LIFECYCLE_STATE, "hibernating"), ("vm.cocoonstack.io/hibernate", "true")], false, "stack-owns")]
#[case::hibernated(&[(keys::LIFECYCLE_STATE, "hibernated")], false, "stack-owns")]
#[case::hibernate_requested_while_creating(&[(keys::LIFECYCLE_STATE, "creating"), ("vm.cocoonstack.io/hibernate", "true")], false, "hibernate-requested")]
#[case::hibernate_requested_mid_fixup(&[(keys::POST_CLONE_STATE, "running"), ("vm.cocoonstack.io/hibernate", "true")], false, "hibernate-requested")]
#[case::deleting(&[], true, "deleting")]
#[case::deleting_mid_fixup(&[(keys::POST_CLONE_STATE, "running")], true, "deleting")]
#[case::unmanaged(&[("cocoonset.cocoonstack.io/managed", "false")], false, "not-managed")]
#[tokio::test(start_paused = true)]
async fn pods_the_host_leaves_alone(
    #[case] extra: &[(&str, &str)],
    #[case] deleting: bool,
    #[case] why: &str,
) {
    let mut p = pod(extra);
    p.deleting = deleting;
    let rig = Setup::new(
        record(&support::vm_name(), "", &[(STATIC_MAC, Some("10.0.0.5"))]),
        vec![p],
    )
    .build();
    let summary = rig.handle("default", "web-0").await.unwrap();
    assert_eq!(summary.action, Handled::Nothing);
    assert_eq!(summary.hands_off.map(HandsOff::as_str), Some(why));
    assert!(rig.cocoon.inspected().is_empty(), "no inspect");
    assert_untouched(&rig);
    assert!(rig.events().is_empty());
}

/// A pod in mode `run` is no clone, unless its VM is a hibernate wake
/// (spec section 2): its VM is looked up for the verdict, then nothing is
/// written or told.
#[rstest::rstest]
#[case::run_mode("run")]
#[case::run_mode_any_case("RUN")]
#[tokio::test(start_paused = true)]
async fn run_pods_have_their_vm_looked_up_and_are_left_alone(#[case] mode: &str) {
    let rig = Setup::new(
        record(&support::vm_name(), "", &[(STATIC_MAC, Some("10.0.0.5"))]),
        vec![pod(&[("cocoonset.cocoonstack.io/mode", mode)])],
    )
    .build();
    let summary = rig.handle("default", "web-0").await.unwrap();
    assert_eq!(summary.action, Handled::Nothing);
    assert_eq!(summary.hands_off.map(HandsOff::as_str), Some("not-cloned"));
    assert_eq!(rig.cocoon.inspected().len(), 1, "the VM is looked up");
    assert_untouched(&rig);
    assert!(rig.events().is_empty());
}

/// The stack hibernates the pod while the host waits for its IP: neither
/// the IP nor `ready` (lease found) nor `failed` (no lease in time) is
/// written over the stack's state.
#[rstest::rstest]
#[case::lease_arrives(true)]
#[case::no_lease(false)]
#[tokio::test]
async fn hibernation_during_the_ip_wait_is_never_overwritten(#[case] lease: bool) {
    let mut setup = Setup::new(
        record(&support::vm_name(), "", &[(DHCP_MAC, None)]),
        vec![pod(&[("vm.cocoonstack.io/fork-from", "vm-src")])],
    );
    setup.config = short_ready();
    let rig = Arc::new(setup.build());
    let stack = {
        let rig = rig.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut hibernating = pod(&[("vm.cocoonstack.io/fork-from", "vm-src")]);
            hibernating.annotations = rig.pods.annotations("default", "web-0").unwrap();
            hibernating
                .annotations
                .insert(keys::LIFECYCLE_STATE.into(), "hibernating".into());
            hibernating
                .annotations
                .insert("vm.cocoonstack.io/hibernate".into(), "true".into());
            rig.pods.insert(hibernating);
            if lease {
                rig.write_lease(DHCP_MAC, "10.0.0.77");
            }
        })
    };
    let summary = rig.handle("default", "web-0").await.unwrap();
    stack.await.unwrap();
    assert_eq!(summary.readiness, Some(Readiness::Gone));
    assert_eq!(rig.annotation("default", "web-0", keys::IP), None);
    assert_eq!(
        rig.annotation("default", "web-0", keys::LIFECYCLE_STATE)
            .as_deref(),
        Some("hibernating")
    );
    assert!(rig.pods.patches().is_empty(), "{:?}", rig.pods.patches());
    assert!(
        rig.cocoon.calls().is_empty(),
        "no DHCP recovery pass in a hibernating guest: {:?}",
        rig.cocoon.calls()
    );
}

/// Deletion starts while the fixup retries: the loop stops before its next
/// attempt and writes nothing more.
#[tokio::test(start_paused = true)]
async fn deletion_mid_loop_stops_it() {
    let mut setup = Setup::new(
        record(&support::vm_name(), "", &[(STATIC_MAC, Some("10.0.0.5"))]),
        vec![pod(&[])],
    );
    setup.replies = vec![Reply::Exit(1, "boom")];
    let rig = Arc::new(setup.build());
    let stack = {
        let rig = rig.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let mut deleting = pod(&[]);
            deleting.annotations = rig.pods.annotations("default", "web-0").unwrap();
            deleting.deleting = true;
            rig.pods.insert(deleting);
        })
    };
    let summary = rig.handle("default", "web-0").await.unwrap();
    stack.await.unwrap();
    assert_eq!(summary.fixup, Some(FixupEnd::Gone));
    assert_eq!(
        rig.cocoon.calls().len(),
        1,
        "no attempt after deletion began"
    );
    let patches = rig.pods.patches();
    assert_eq!(patches.len(), 1, "only `running`: {patches:?}");
}

// ---- 5. validate only what the path uses ----

/// Pods that need no fixup (rules 3 and 7) are never failed over a fact
/// only a plan would use: a VM name that is no hostname (over 63
/// characters), an odd MAC on a second NIC. The IP wait runs and the pod
/// becomes ready.
#[rstest::rstest]
#[case::rule7_long_name("a-pod-whose-name-is-long-enough-to-make-the-vm-name-no-hostname", &[])]
#[case::rule3_windows_wake("web-0", &[("cocoonset.cocoonstack.io/os", "windows"), ("vm.cocoonstack.io/restore-from-hibernate", "true")])]
#[tokio::test]
async fn facts_only_a_plan_uses_never_fail_a_pod_that_needs_none(
    #[case] name: &str,
    #[case] extra: &[(&str, &str)],
) {
    let vm_name = vm_name_for_pod("default", name);
    let mut setup = Setup::new(
        record(
            &vm_name,
            "",
            &[(DHCP_MAC, None), ("52:54:00:zz:00:01;odd", None)],
        ),
        vec![pod_as("default", name, &vm_name, extra)],
    );
    setup.config = short_ready();
    let rig = setup.build();
    rig.write_lease(DHCP_MAC, "10.0.0.42");
    let summary = rig.handle("default", name).await.unwrap();
    assert_eq!(summary.action, Handled::IpWait, "{summary:?}");
    assert_eq!(summary.readiness, Some(Readiness::Ready), "{summary:?}");
    assert_eq!(summary.ip.as_deref(), Some("10.0.0.42"));
    assert!(
        rig.events()
            .iter()
            .all(|(_, e)| e.kind == EventType::Normal),
        "{:?}",
        rig.events()
    );
}

// ---- 6. failures before the loop are retried, in serve ----

/// Pod API whose first `patch_failures` patches fail as an unreachable
/// API server would.
#[derive(Debug, Clone)]
struct Flaky {
    inner: MemoryPods,
    patch_failures: Arc<AtomicUsize>,
    get_failures_after: Arc<AtomicUsize>,
    /// The failing patches are refused (403, an admission denial), not
    /// unreachable.
    refuse: bool,
}

impl Flaky {
    /// Pods in memory whose first `patch_failures` patches fail, and whose
    /// reads fail once after `get_failures_after` more (usize::MAX: never).
    fn new(patch_failures: usize, get_failures_after: usize) -> Self {
        Flaky {
            inner: MemoryPods::new(),
            patch_failures: Arc::new(AtomicUsize::new(patch_failures)),
            get_failures_after: Arc::new(AtomicUsize::new(get_failures_after)),
            refuse: false,
        }
    }
}

impl PodApi for Flaky {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<PodInput>, PodError> {
        // `get_failures_after`: reads succeed this many more times, then
        // fail once (usize::MAX: never).
        let left = self.get_failures_after.load(Ordering::SeqCst);
        if left != usize::MAX {
            if left == 0 {
                self.get_failures_after.store(usize::MAX, Ordering::SeqCst);
                return Err(PodError::Api {
                    pod: format!("{namespace}/{name}"),
                    reason: "connection refused".into(),
                });
            }
            self.get_failures_after.store(left - 1, Ordering::SeqCst);
        }
        self.inner.get(namespace, name).await
    }

    async fn patch_annotations(
        &self,
        pod: &PodRef,
        patch: &AnnotationPatch,
    ) -> Result<(), PodError> {
        if self
            .patch_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(if self.refuse {
                PodError::Refused {
                    pod: pod.to_string(),
                    reason: "admission denied the request".into(),
                }
            } else {
                PodError::Api {
                    pod: pod.to_string(),
                    reason: "connection refused".into(),
                }
            });
        }
        self.inner.patch_annotations(pod, patch).await
    }

    async fn event(&self, pod: &PodRef, event: &Event) -> Result<(), PodError> {
        self.inner.event(pod, event).await
    }
}

fn flaky_host(
    cocoon: &ScriptedCocoon,
    pods: &Flaky,
    dir: &Path,
) -> Arc<Host<ScriptedCocoon, Flaky>> {
    let root = dir.join("cocoon-root");
    std::fs::create_dir_all(&root).unwrap();
    let (planner, _) = Planner::new(PlannerOptions {
        cocoon_root: root,
        ..PlannerOptions::default()
    })
    .unwrap();
    let leases = LeaseWatcher::new(dir.join("leases.json"), Duration::from_millis(20)).unwrap();
    Arc::new(Host::new(
        Arc::new(planner),
        cocoon.clone(),
        pods.clone(),
        Arc::new(leases),
        HostConfig::default(),
        Arc::new(Metrics::new()),
    ))
}

/// cocoon with the pod's VM, one static NIC, whose first exec answers
/// `reply`.
fn static_vm(reply: Reply) -> ScriptedCocoon {
    ScriptedCocoon::new(
        vec![reply],
        record(&support::vm_name(), "", &[(STATIC_MAC, Some("10.0.0.5"))]),
    )
}

/// An inspect timeout and a refused `running` write before the loop: the
/// daemon tries again with backoff, counts each retry, and the pod ends
/// ready; it is never left `creating` with no work in flight.
#[tokio::test(start_paused = true)]
async fn serve_retries_failures_before_the_loop() {
    let dir = tempfile::tempdir().unwrap();
    let cocoon = static_vm(Reply::Done);
    cocoon.fail_inspects(2);
    let pods = Flaky::new(1, usize::MAX);
    pods.inner.insert(pod(&[]));
    let host = flaky_host(&cocoon, &pods, dir.path());
    let mut dispatcher = Dispatcher::new(host.clone(), 4, CancellationToken::new());
    let started = tokio::time::Instant::now();
    dispatcher.offer(pod(&[]), Trigger::Event);
    dispatcher.drain(Duration::from_secs(600)).await;
    let after = pods.inner.annotations("default", "web-0").unwrap();
    assert_eq!(after[keys::LIFECYCLE_STATE], "ready");
    assert_eq!(after[keys::POST_CLONE_STATE], "done");
    assert_eq!(
        cocoon.inspected().len(),
        4,
        "two timeouts, one refusal, success"
    );
    assert_eq!(cocoon.calls().len(), 1);
    // 1 s, 2 s, then 4 s of backoff.
    assert_eq!(started.elapsed().as_secs(), 7);
    let metrics = host.metrics().encode();
    assert!(
        metrics.contains("cocoon_fixup_retries_total{kind=\"cocoon\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("cocoon_fixup_retries_total{kind=\"api\"} 1"),
        "{metrics}"
    );
}

/// Work resumed at startup whose `running` write is refused is tried
/// again with backoff until it lands, and `ResumedAfterRestart` is told
/// once, not at every retry.
#[tokio::test(start_paused = true)]
async fn a_refused_running_write_at_startup_is_retried_and_resumed_is_told_once() {
    let pods = Flaky {
        refuse: true,
        ..Flaky::new(2, usize::MAX)
    };
    let inspected = resumed_at_startup_past(pods).await;
    assert_eq!(inspected, 3, "two refusals, then the work");
}

/// Work resumed at startup whose `running` write fails (the API server
/// unreachable, after `ResumedAfterRestart` was told) is tried again as an
/// event's work: the announcement is made once.
#[tokio::test(start_paused = true)]
async fn a_failed_running_write_at_startup_is_retried_and_resumed_is_told_once() {
    let inspected = resumed_at_startup_past(Flaky::new(1, usize::MAX)).await;
    assert_eq!(inspected, 2, "a failed write, then the work");
}

/// Work left `running`, offered at startup to a daemon over `pods` whose
/// first writes fail: it ends done, `ResumedAfterRestart` told once. The
/// inspects it took.
async fn resumed_at_startup_past(pods: Flaky) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let cocoon = static_vm(Reply::Done);
    let running = [("vm.cocoonstack.io/post-clone-state", "running")];
    pods.inner.insert(pod(&running));
    let host = flaky_host(&cocoon, &pods, dir.path());
    let mut dispatcher = Dispatcher::new(host.clone(), 4, CancellationToken::new());
    dispatcher.offer(pod(&running), Trigger::Startup);
    dispatcher.drain(Duration::from_secs(600)).await;
    let after = pods.inner.annotations("default", "web-0").unwrap();
    assert_eq!(after[keys::POST_CLONE_STATE], "done");
    let reasons: Vec<&str> = pods.inner.events().iter().map(|(_, e)| e.reason).collect();
    let resumed = reasons
        .iter()
        .filter(|r| **r == "ResumedAfterRestart")
        .count();
    assert_eq!(resumed, 1, "{reasons:?}");
    cocoon.inspected().len()
}

/// A pod event that shows the stack took the pod over stops its work in
/// flight.
#[tokio::test(start_paused = true)]
async fn an_event_that_hands_the_pod_over_stops_its_work() {
    let dir = tempfile::tempdir().unwrap();
    let cocoon = static_vm(Reply::Hang);
    let pods = Flaky::new(0, usize::MAX);
    pods.inner.insert(pod(&[]));
    let host = flaky_host(&cocoon, &pods, dir.path());
    let mut dispatcher = Dispatcher::new(host, 4, CancellationToken::new());
    dispatcher.offer(pod(&[]), Trigger::Event);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(dispatcher.in_flight(), 1);
    assert_eq!(cocoon.calls().len(), 1, "attempt 1 hangs");
    dispatcher.offer(
        pod(&[("vm.cocoonstack.io/hibernate", "true")]),
        Trigger::Event,
    );
    dispatcher.drain(Duration::from_secs(1)).await;
    assert_eq!(cocoon.calls().len(), 1);
    let after = pods.inner.annotations("default", "web-0").unwrap();
    assert_eq!(
        after[keys::POST_CLONE_STATE],
        "running",
        "left for the stack"
    );
    assert!(!after.contains_key(keys::LIFECYCLE_STATE));
}

/// Work started for one incarnation of a pod never runs for the next: a
/// stale event for uid A, when the pod by that name is now uid B, does
/// nothing (not even an inspect).
#[tokio::test(start_paused = true)]
async fn serve_never_works_for_an_old_incarnation() {
    let dir = tempfile::tempdir().unwrap();
    let cocoon = static_vm(Reply::Done);
    let pods = Flaky::new(0, usize::MAX);
    let mut recreated = pod(&[]);
    recreated.uid = Some("uid-of-the-new-pod".into());
    pods.inner.insert(recreated);
    let host = flaky_host(&cocoon, &pods, dir.path());
    let mut dispatcher = Dispatcher::new(host, 4, CancellationToken::new());
    dispatcher.offer(pod(&[]), Trigger::Event);
    dispatcher.drain(Duration::from_secs(60)).await;
    assert!(cocoon.inspected().is_empty());
    assert!(pods.inner.patches().is_empty());
}

/// Hibernate, then wake, while the stopped work is still winding down:
/// the wake is kept and run once the old work has stopped.
#[tokio::test(start_paused = true)]
async fn work_offered_while_stopped_work_winds_down_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let cocoon = ScriptedCocoon::new(
        vec![Reply::Hang, Reply::Done],
        record(&support::vm_name(), "", &[(STATIC_MAC, Some("10.0.0.5"))]),
    );
    let pods = Flaky::new(0, usize::MAX);
    pods.inner.insert(pod(&[]));
    let host = flaky_host(&cocoon, &pods, dir.path());
    let mut dispatcher = Dispatcher::new(host, 4, CancellationToken::new());
    dispatcher.offer(pod(&[]), Trigger::Event);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(cocoon.calls().len(), 1, "attempt 1 hangs");
    // Both events arrive before the stopped task has wound down.
    dispatcher.offer(
        pod(&[("vm.cocoonstack.io/hibernate", "true")]),
        Trigger::Event,
    );
    dispatcher.offer(pod(&[]), Trigger::Event);
    dispatcher.drain(Duration::from_secs(600)).await;
    assert_eq!(cocoon.calls().len(), 2, "the kept work ran");
    let after = pods.inner.annotations("default", "web-0").unwrap();
    assert_eq!(after[keys::LIFECYCLE_STATE], "ready");
}

/// An event that arrives while the pod's work is in flight is looked at
/// once that work is done: here the stack moves the pod to another VM id
/// mid-loop; the loop stops (not its VM any more), and the kept event has
/// the new pointer inspected.
#[tokio::test(start_paused = true)]
async fn an_event_during_work_is_looked_at_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let cocoon = ScriptedCocoon::new(
        vec![Reply::Exit(1, "boom")],
        record(&support::vm_name(), "", &[(STATIC_MAC, Some("10.0.0.5"))]),
    );
    let pods = Flaky::new(0, usize::MAX);
    pods.inner.insert(pod(&[]));
    let host = flaky_host(&cocoon, &pods, dir.path());
    let mut dispatcher = Dispatcher::new(host, 4, CancellationToken::new());
    dispatcher.offer(pod(&[]), Trigger::Event);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(cocoon.calls().len(), 1, "attempt 1 failed, the loop sleeps");
    let mut moved = pods.inner.annotations("default", "web-0").unwrap();
    moved.insert("vm.cocoonstack.io/id".into(), "vm-moved".into());
    let mut moved_pod = pod(&[]);
    moved_pod.annotations = moved;
    pods.inner.insert(moved_pod.clone());
    dispatcher.offer(moved_pod, Trigger::Event);
    dispatcher.drain(Duration::from_secs(600)).await;
    assert_eq!(
        cocoon.calls().len(),
        1,
        "no attempt in a VM no longer the pod's"
    );
    assert_eq!(cocoon.inspected(), [VM_ID, "vm-moved"]);
    assert!(
        pods.inner
            .events()
            .iter()
            .any(|(_, e)| e.reason == reasons::VM_MISMATCH)
    );
}

/// A daemon restarted while cocoon is not up yet: the first inspect fails,
/// the retry still announces `ResumedAfterRestart`.
#[tokio::test(start_paused = true)]
async fn a_resumed_pod_is_announced_even_when_the_first_try_fails() {
    let dir = tempfile::tempdir().unwrap();
    let cocoon = static_vm(Reply::Done);
    cocoon.fail_inspects(1);
    let pods = Flaky::new(0, usize::MAX);
    let running = pod(&[(keys::POST_CLONE_STATE, "running")]);
    pods.inner.insert(running.clone());
    let host = flaky_host(&cocoon, &pods, dir.path());
    let mut dispatcher = Dispatcher::new(host, 4, CancellationToken::new());
    dispatcher.offer(running, Trigger::Startup);
    dispatcher.drain(Duration::from_secs(600)).await;
    let resumed: Vec<_> = pods
        .inner
        .events()
        .into_iter()
        .filter(|(_, e)| e.reason == reasons::RESUMED_AFTER_RESTART)
        .collect();
    assert_eq!(resumed.len(), 1, "{resumed:?}");
}

/// A request the API server refuses for good (403, 422) is not retried:
/// the work would only run again to be refused again.
#[tokio::test(start_paused = true)]
async fn a_refused_write_is_not_retried() {
    use fixup_host::pods::PodError;
    let error = Stop::Api(PodError::Refused {
        pod: "default/web-0".into(),
        reason: "403 Forbidden".into(),
    });
    assert!(!error.is_retryable());
    let error = Stop::Api(PodError::Api {
        pod: "default/web-0".into(),
        reason: "gave up after 5 tries".into(),
    });
    assert!(error.is_retryable());
}

/// A pod whose annotations point at a VM that is not its own is told once:
/// later events with the same annotations do not inspect again or emit
/// again; changed annotations are looked at afresh.
#[tokio::test(start_paused = true)]
async fn a_mismatch_is_told_once_per_pointer() {
    let dir = tempfile::tempdir().unwrap();
    let cocoon = ScriptedCocoon::new(
        vec![Reply::Done],
        record(
            &vm_name_for_pod("tenant-b", "db-0"),
            "",
            &[(STATIC_MAC, Some("10.0.0.5"))],
        ),
    );
    let pods = Flaky::new(0, usize::MAX);
    let evil = pod_as("default", "web-0", "", &[]);
    pods.inner.insert(evil.clone());
    let host = flaky_host(&cocoon, &pods, dir.path());
    let mut dispatcher = Dispatcher::new(host, 4, CancellationToken::new());
    for _ in 0..3 {
        dispatcher.offer(evil.clone(), Trigger::Event);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(cocoon.inspected().len(), 1);
    assert_eq!(pods.inner.events().len(), 1);
    let mut moved = evil.clone();
    moved
        .annotations
        .insert("vm.cocoonstack.io/id".into(), "vm-other".into());
    pods.inner.insert(moved.clone());
    dispatcher.offer(moved, Trigger::Event);
    dispatcher.drain(Duration::from_secs(60)).await;
    assert_eq!(cocoon.inspected().len(), 2);
    assert!(pods.inner.patches().is_empty());
}

/// Annotations that name no VM id, or an id the record found does not
/// have, are mismatches too: nothing runs, one Warning event.
#[rstest::rstest]
#[case::not_an_id(&[("vm.cocoonstack.io/id", "../../etc")], "no VM id or name")]
#[case::id_disagrees(&[("vm.cocoonstack.io/id", "vm-elsewhere")], "")]
#[tokio::test(start_paused = true)]
async fn unusable_vm_pointers_are_mismatches(#[case] extra: &[(&str, &str)], #[case] told: &str) {
    let rig = Setup::new(
        record(&support::vm_name(), "", &[(STATIC_MAC, Some("10.0.0.5"))]),
        vec![pod(extra)],
    )
    .build();
    let summary = rig.handle("default", "web-0").await.unwrap();
    assert_eq!(summary.action, Handled::VmMismatch);
    assert_untouched(&rig);
    let events = rig.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].1.reason, reasons::VM_MISMATCH);
    assert!(
        events[0].1.message.contains(told),
        "{}",
        events[0].1.message
    );
    assert!(
        !events[0].1.message.contains(VM_ID),
        "the record's id is not told: {}",
        events[0].1.message
    );
}

// ---- 7 and 8: boot-kind precedence, rule 3 needs exactly cloud-hypervisor ----

/// A Windows hibernate wake on exactly `cloud-hypervisor` needs the IP
/// wait only, even on a `mode=run`, forked or directory-cloned pod (the
/// wake comes first); on an empty or other backend the NIC was kept and
/// PnP runs.
#[rstest::rstest]
#[case::ch_wake(&[], 3)]
#[case::ch_wake_run_mode(&[("cocoonset.cocoonstack.io/mode", "run")], 3)]
#[case::ch_wake_fork(&[("vm.cocoonstack.io/fork-from", "vm-src")], 3)]
#[case::ch_wake_dir(&[("vm.cocoonstack.io/clone-from-dir", "/snap")], 3)]
#[case::empty_backend(&[("vm.cocoonstack.io/backend", "")], 4)]
#[case::other_backend(&[("vm.cocoonstack.io/backend", "Cloud-Hypervisor")], 4)]
#[tokio::test]
async fn windows_wakes(#[case] extra: &[(&str, &str)], #[case] rule: u8) {
    let mut annotations = vec![
        ("cocoonset.cocoonstack.io/os", "windows"),
        ("vm.cocoonstack.io/restore-from-hibernate", "true"),
    ];
    annotations.extend_from_slice(extra);
    let mut setup = Setup::new(
        record(&support::vm_name(), "", &[(DHCP_MAC, None)]),
        vec![pod(&annotations)],
    );
    setup.config = short_ready();
    let rig = setup.build();
    rig.write_lease(DHCP_MAC, "10.0.0.9");
    let summary = rig.handle("default", "web-0").await.unwrap();
    assert_eq!(summary.rule, rule, "{summary:?}");
    let ran: Vec<String> = rig
        .cocoon
        .calls()
        .iter()
        .map(|c| c.argv[0].clone())
        .collect();
    if rule == 3 {
        assert!(ran.is_empty(), "{ran:?}");
        assert_eq!(summary.action, Handled::IpWait);
    } else {
        assert_eq!(ran, ["powershell"]);
        assert_eq!(
            summary.scenario,
            Some(fixup_core::classify::Scenario::WindowsPnp)
        );
    }
    assert_eq!(summary.readiness, Some(Readiness::Ready));
}

// ---- 9. the probe cannot read the cocoon root ----

/// A cocoon root the daemon cannot read is a node configuration error:
/// reported (Warning event, metric) and returned for a retry; the pod is
/// not failed, and once the root is there the same pod is fixed.
#[tokio::test(start_paused = true)]
async fn an_unreadable_cocoon_root_is_a_node_error_not_a_pod_failure() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("not-mounted");
    let mut setup = Setup::new(
        record(&support::vm_name(), "", &[(STATIC_MAC, Some("10.0.0.5"))]),
        vec![pod(&[])],
    );
    setup.cocoon_root = Some(root.clone());
    let rig = setup.build();
    let error = rig.handle("default", "web-0").await.unwrap_err();
    assert!(
        matches!(error, Stop::Node(NodeError::Probe { .. })),
        "{error}"
    );
    assert!(error.is_retryable());
    assert_untouched(&rig);
    let events = rig.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].1.reason, reasons::NODE_ERROR);
    assert!(
        events[0].1.message.contains("not-mounted"),
        "{}",
        events[0].1.message
    );
    assert!(
        rig.metrics()
            .contains("cocoon_fixup_node_errors_total{kind=\"probe\"} 1")
    );
    std::fs::create_dir(&root).unwrap();
    let summary = rig.handle("default", "web-0").await.unwrap();
    assert_eq!(summary.fixup, Some(FixupEnd::Done));
    assert_eq!(summary.readiness, Some(Readiness::Ready));
}

// ---- 10. a plan failure is not an exhausted exec ----

#[tokio::test(start_paused = true)]
async fn a_plan_failure_emits_plan_failed_and_runs_nothing() {
    let rig = Setup::new(
        record(
            &support::vm_name(),
            "",
            &[(STATIC_MAC, Some("10.0.0.5")), (STATIC_MAC, None)],
        ),
        vec![pod(&[])],
    )
    .build();
    let summary = rig.handle("default", "web-0").await.unwrap();
    assert_eq!(summary.fixup, Some(FixupEnd::PlanFailed));
    assert!(rig.cocoon.calls().is_empty());
    let reasons: Vec<&str> = rig.events().iter().map(|(_, e)| e.reason).collect();
    assert_eq!(reasons, [reasons::PLAN_FAILED]);
    assert_eq!(
        rig.annotation("default", "web-0", keys::POST_CLONE_STATE)
            .as_deref(),
        Some("failed")
    );
    assert_eq!(
        rig.annotation("default", "web-0", keys::POST_CLONE_HINT),
        None,
        "no plan, no hint"
    );
}

// ---- 11. the source image is the record's, in one inspect ----

#[rstest::rstest]
#[case::clone_with_url(&[], "https://cloud-images.example/noble.img", "cloudimg")]
#[case::clone_with_oci(&[], "ghcr.io/acme/ubuntu:24.04", "oci-networkd")]
#[case::fork_ignores_it(&[("vm.cocoonstack.io/fork-from", "vm-src")], "https://cloud-images.example/noble.img", "oci-networkd")]
#[case::dir_ignores_it(&[("vm.cocoonstack.io/clone-from-dir", "/snap")], "https://cloud-images.example/noble.img", "oci-networkd")]
#[case::resumed_ignores_it(&[(keys::POST_CLONE_STATE, "running")], "https://cloud-images.example/noble.img", "oci-networkd")]
#[tokio::test(start_paused = true)]
async fn the_source_image_is_the_records_and_inspect_runs_once(
    #[case] extra: &[(&str, &str)],
    #[case] image: &str,
    #[case] scenario: &str,
) {
    let rig = Setup::new(
        record(
            &support::vm_name(),
            image,
            &[(STATIC_MAC, Some("10.0.0.5"))],
        ),
        vec![pod(extra)],
    )
    .build();
    let summary = rig.handle("default", "web-0").await.unwrap();
    assert_eq!(summary.scenario.map_or("none", |s| s.as_str()), scenario);
    assert_eq!(rig.cocoon.inspected(), [VM_ID], "one inspect per pod");
}

// ---- 12. the read before the done write fails ----

/// Nothing is written (no `done`, no IP next to a lifecycle left
/// `creating`): the error is retryable, and the retry, finding `running`,
/// runs the fixup again (nothing says it was done) and publishes the IP.
#[tokio::test(start_paused = true)]
async fn a_failed_read_before_the_done_write_is_retried_not_guessed() {
    let dir = tempfile::tempdir().unwrap();
    let cocoon = static_vm(Reply::Done);
    // Reads: the handle's own, the one the `running` write is decided
    // against (pods in memory keep no versions), the one before attempt 1
    // (the write answered no pod), then the one the write of `done` and
    // `ready` is decided against fails.
    let pods = Flaky::new(0, 3);
    pods.inner.insert(pod(&[]));
    let host = flaky_host(&cocoon, &pods, dir.path());
    let token = CancellationToken::new();
    let error = host
        .handle("default", "web-0", Trigger::Event, &token)
        .await
        .unwrap_err();
    assert!(error.is_retryable(), "{error}");
    let after = pods.inner.annotations("default", "web-0").unwrap();
    assert_eq!(after[keys::POST_CLONE_STATE], "running");
    assert!(!after.contains_key(keys::IP), "{after:?}");
    assert!(!after.contains_key(keys::LIFECYCLE_STATE), "{after:?}");
    let summary = host
        .handle("default", "web-0", Trigger::Event, &token)
        .await
        .unwrap();
    assert_eq!(summary.action, Handled::Fixup);
    assert_eq!(summary.readiness, Some(Readiness::Ready));
    assert_eq!(cocoon.calls().len(), 2, "the fixup ran again");
    let after = pods.inner.annotations("default", "web-0").unwrap();
    assert_eq!(after[keys::POST_CLONE_STATE], "done");
    assert_eq!(after[keys::IP], "10.0.0.5");
}

// ---- 13. the DHCP safety net: Linux only, bounded by the exec timeout ----

#[rstest::rstest]
#[case::linux("linux", 1)]
#[case::android("android", 0)]
#[case::unknown("plan9", 0)]
#[tokio::test]
async fn dhcp_recovery_is_for_linux_and_bounded_by_the_exec_timeout(
    #[case] os: &str,
    #[case] recoveries: usize,
) {
    let mut setup = Setup::new(
        record(&support::vm_name(), "", &[(DHCP_MAC, None)]),
        vec![pod(&[("cocoonset.cocoonstack.io/os", os)])],
    );
    setup.config = short_ready();
    setup.replies = vec![Reply::Hang];
    let rig = setup.build();
    let summary = rig.handle("default", "web-0").await.unwrap();
    assert_eq!(summary.readiness, Some(Readiness::TimedOut));
    let calls = rig.cocoon.calls();
    assert_eq!(calls.len(), recoveries, "{calls:?}");
    for call in calls {
        assert!(
            call.timeout <= Duration::from_millis(500),
            "bounded by the exec timeout, not the IP budget: {:?}",
            call.timeout
        );
    }
}

// ---- 14. a plugin file that does not load ----

/// A plugin file that does not load, and a second copy of a built-in
/// (refused: a built-in keeps its claims): the good plugins load, and pods
/// whose scenario and flavour have a plugin are served. A pod that asks for
/// a flavour no loaded plugin declares while a file did not load (that
/// file may have been its plugin) is not failed and not given the generic
/// plan: it waits, with one node error naming the files, until the
/// operator fixes the directory. (A claim two files contest:
/// `tests/tests/selection.rs`.)
#[tokio::test(start_paused = true)]
async fn a_plugin_file_that_does_not_load_fails_only_its_pods() {
    let plugins = tempfile::tempdir().unwrap();
    let (_, networkd) = fixup_core::plugin::builtin::BUILTINS
        .iter()
        .find(|(name, _)| *name == "oci-networkd")
        .unwrap();
    std::fs::write(plugins.path().join("networkd-copy.wasm"), networkd).unwrap();
    std::fs::write(plugins.path().join("junk.wasm"), b"not a component").unwrap();
    let rig = |extra: &[(&str, &str)]| {
        let mut setup = Setup::new(
            record(&support::vm_name(), "", &[(STATIC_MAC, Some("10.0.0.5"))]),
            vec![pod(extra)],
        );
        setup.plugin_dir = Some(plugins.path().to_owned());
        setup.build()
    };

    // Served: no flavour asked for, the built-in serves (the copy of it
    // did not switch it off).
    let served = rig(&[]);
    let summary = served.handle("default", "web-0").await.unwrap();
    assert_eq!(summary.fixup, Some(FixupEnd::Done), "{summary:?}");

    // Waits, clearly.
    let waits = rig(&[("vm.cocoonstack.io/guest-flavor", "rhel")]);
    let error = waits.handle("default", "web-0").await.unwrap_err();
    assert!(
        matches!(error, Stop::Node(NodeError::Plugins { .. })),
        "{error}"
    );
    assert!(error.is_retryable());
    assert!(waits.cocoon.calls().is_empty());
    assert!(waits.pods.patches().is_empty(), "not failed");
    let events = waits.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].1.reason, reasons::NODE_ERROR);
    for needle in ["junk.wasm", "networkd-copy.wasm", "rhel", "did not load"] {
        assert!(
            events[0].1.message.contains(needle),
            "{needle}: {}",
            events[0].1.message
        );
    }
    // A retry is not told again, but counted.
    let error = waits
        .host
        .handle(
            "default",
            "web-0",
            Trigger::Retry,
            &CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert!(error.is_retryable());
    assert_eq!(waits.events().len(), 1, "told once");
    assert!(
        waits
            .metrics()
            .contains("cocoon_fixup_node_errors_total{kind=\"plugins\"} 2"),
        "{}",
        waits.metrics()
    );
}

// ---- 1 to 4 through the real binary ----

mod real_binary {
    use super::*;
    use fixup_core::lifecycle::LIFECYCLE_KEYS;
    use serde_json::Map;
    use std::fs;
    use support::binary::cocoon_fixup;
    use support::fake::fake_cocoon;
    use support::fake_api::FakeApi;

    /// `cocoon-fixup run` for `namespace/name` against a fake API server
    /// holding `pod`, with `fake-cocoon` answering inspect with `vm_record`
    /// and every exec with success. Returns the exit code, the cocoon calls
    /// (argv after the program) and the server.
    async fn run(pod: Value, vm_record: Value) -> (Option<i32>, Vec<Vec<String>>, FakeApi) {
        let (code, calls, api, _) = run_with(pod, vm_record, &[], &[]).await;
        (code, calls, api)
    }

    /// [`run`] with `others` listed beside the pod as the node's other
    /// pods, and `flags` added to the command line; also returns stderr.
    async fn run_with(
        pod: Value,
        vm_record: Value,
        others: &[Value],
        flags: &[&str],
    ) -> (Option<i32>, Vec<Vec<String>>, FakeApi, String) {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::os::unix::fs::symlink(fake_cocoon(), d.join("cocoon")).unwrap();
        let scenario = json!({
            "log": d.join("calls.jsonl"),
            "exec": [{"exit": 0, "done": true}],
            "inspect": {"json": vm_record},
        });
        fs::write(d.join("cocoon.json"), scenario.to_string()).unwrap();
        fs::create_dir(d.join("plugins")).unwrap();
        fs::write(d.join("config.toml"), "").unwrap();
        let namespace = pod["metadata"]["namespace"].as_str().unwrap().to_owned();
        let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
        let api = FakeApi::start(pod, false).await;
        for other in others {
            api.add_other_pod(other.clone());
        }
        let out = cocoon_fixup(
            d,
            &api.kubeconfig(d),
            &["run", "--namespace", &namespace, "--pod", &name],
        )
        .args(flags)
        .output()
        .await
        .expect("run runs");
        let calls = cocoon_calls(d);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code(), calls, api, stderr)
    }

    /// A maintainer's own Go program (`tests/go-maintainer`, shaped as
    /// vk-cocoon: a runtime whose `Inspect` gives a typed VM without image
    /// or creation time and whose `Exec` streams, adapted with
    /// `cocoonfixup.StreamVM`; the pod over the API server's REST with
    /// net/http; the lifecycle keys owned by the program's own intent
    /// table; built with `CGO_ENABLED=0`, so the library is the `cocoon-fixup
    /// embed` child) writes what `cocoon-fixup run` writes, write by write,
    /// for each kind of pod the stack makes, a Firecracker clone whose
    /// snapshot's source image the program knows, a spent budget, a pod
    /// another writer changes under both, and a pod left `running` that
    /// the program resumes at its startup. Where `run` writes the
    /// lifecycle keys in one patch with the rest, the program writes the
    /// rest with the same preconditions and then, its own write, the
    /// lifecycle keys with the uid precondition only, after publishing the
    /// pod's status; the events, the `cocoon` calls and the pod at the end
    /// are the same, and the program's closing reconcile writes nothing.
    /// Skipped (loudly) without Go, unless `COCOON_FIXUP_REQUIRE_GO=1`.
    #[rstest::rstest]
    #[case::cocoonset_pod("prod", "demo-0", None, CLOUD_HYPERVISOR, Ending::Done)]
    #[case::webhook_deployment_pod(
        "prod",
        "demo-7b7c9d9d5f-x2x4z",
        Some("vk-prod-demo-1"),
        CLOUD_HYPERVISOR,
        Ending::Done
    )]
    #[case::plain_pod("default", "batch-0", None, CLOUD_HYPERVISOR, Ending::Done)]
    #[case::firecracker_with_its_source_image("prod", "demo-0", None, FIRECRACKER, Ending::Done)]
    #[case::budget_spent("prod", "demo-0", None, CLOUD_HYPERVISOR, Ending::Exhausted)]
    #[case::another_writer("prod", "demo-0", None, CLOUD_HYPERVISOR, Ending::Changed)]
    #[case::resumed_at_startup("prod", "demo-0", None, CLOUD_HYPERVISOR, Ending::Resumed)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_maintainers_go_program_writes_what_run_writes(
        #[case] namespace: &str,
        #[case] name: &str,
        #[case] slot: Option<&str>,
        #[case] backend: &str,
        #[case] ending: Ending,
    ) {
        let Some(program) = maintainer() else {
            return;
        };
        let vm_name = slot.map_or_else(|| vm_name_for_pod(namespace, name), str::to_owned);
        let mut annotations = base(&vm_name);
        annotations.insert("vm.cocoonstack.io/backend", json!(backend));
        let pod = pod_json(namespace, name, &annotations);
        // A pod on the node with no work, which the startup hands to the
        // library too, and the library leaves alone; listed as the API
        // server lists it, a pod of its own with its version.
        let others = match ending {
            Ending::Resumed => {
                let mut plain = pod_json("default", "plain-0", &BTreeMap::new());
                plain["metadata"]["uid"] = json!("0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9");
                plain["metadata"]["resourceVersion"] = json!("3");
                vec![plain]
            }
            _ => Vec::new(),
        };
        let exec = match ending {
            Ending::Exhausted => {
                json!([{"exit": 5, "stderr": "stand-in: No space left on device\n"}])
            }
            // The first exec is held until its start is stopped.
            Ending::Resumed => json!([{"gate": "never"}, {"exit": 0, "done": true}]),
            _ => json!([{"exit": 0, "done": true}]),
        };
        let cocoon = json!({"exec": exec, "inspect": {"json": vm_on(&vm_name, backend)}});
        let changes: &[usize] = match ending {
            Ending::Changed => &[0, 1],
            _ => &[],
        };
        // The interval as long as the budget: one attempt, whatever the
        // machine's speed.
        let mut run_flags: Vec<&str> = Vec::new();
        let mut go_flags: Vec<&str> = Vec::new();
        if ending == Ending::Exhausted {
            run_flags.extend(["--retry-budget", "1s", "--retry-interval", "1s"]);
            go_flags.extend(["-retry-budget", "1s", "-retry-interval", "1s"]);
        }
        if slot.is_some() {
            run_flags.extend(["--accept-annotated-vm-names", "--node", "n1"]);
            go_flags.extend(["-node", "n1", "-accept-annotated"]);
        }
        if backend == FIRECRACKER {
            go_flags.extend(["-source-image", FIRECRACKER_IMAGE]);
        }
        let one_pod = ["-namespace", namespace, "-pod", name, "-boot", "create"];

        let run_stage = Stage::new(&pod, &others, &cocoon, changes).await;
        let go_stage = Stage::new(&pod, &others, &cocoon, changes).await;
        if ending == Ending::Resumed {
            // Each side's first start is stopped in the guest: the pod is
            // left `running`, its record kept. `run` then runs it again as
            // any pod; the program starts again and reconciles its node.
            run_stage
                .stopped_in_the_exec(run_stage.run(&pod, &run_flags), 4)
                .await;
            let first: Vec<&str> = go_flags.iter().copied().chain(one_pod).collect();
            go_stage
                .stopped_in_the_exec(go_stage.program(program, &first), 0)
                .await;
            for stage in [&run_stage, &go_stage] {
                assert_eq!(
                    stage.api.annotation(keys::POST_CLONE_STATE).as_deref(),
                    Some("running")
                );
            }
            go_flags.extend(["-startup", "-node", "n1"]);
        } else {
            go_flags.extend(one_pod);
        }
        let command = run_stage.run(&pod, &run_flags);
        let by_run = run_stage.finish(command).await;
        assert_eq!(by_run.ok, ending != Ending::Exhausted, "{}", by_run.stderr);
        let command = go_stage.program(program, &go_flags);
        let by_go = go_stage.finish(command).await;
        assert!(by_go.ok, "{}{}", by_go.stdout, by_go.stderr);

        let (run_patches, run_events, run_pod) = written(&by_run.api);
        assert!(!run_patches.is_empty(), "run wrote nothing to compare");
        let (go_patches, mut go_events, go_pod) = written(&by_go.api);
        let lifecycle_writes = same_writes(&run_patches, &go_patches);
        if ending == Ending::Resumed {
            let resumed: Vec<usize> = (0..go_events.len())
                .filter(|&i| go_events[i]["reason"] == reasons::RESUMED_AFTER_RESTART)
                .collect();
            assert_eq!(
                resumed.len(),
                1,
                "the program's startup announces the resumed work once: {go_events:#?}"
            );
            go_events.remove(resumed[0]);
        }
        assert_eq!(go_events, run_events, "the Go program told otherwise");
        assert_eq!(
            without_nonces(by_go.calls.clone()),
            without_nonces(by_run.calls.clone()),
            "the Go program ran otherwise"
        );
        assert_eq!(go_pod, run_pod, "the pods differ at the end");
        for side in [&by_run, &by_go] {
            let unexpected = side.api.with(|s| s.unexpected.clone());
            assert!(unexpected.is_empty(), "unexpected requests: {unexpected:?}");
        }

        // The program's own lines: a status before each lifecycle write,
        // the last one as the pod ends; one pod run; nothing republished.
        let lines = by_go.lines();
        let statuses: Vec<&Value> = lines.iter().filter_map(|l| l.get("status")).collect();
        assert_eq!(statuses.len(), lifecycle_writes, "{lines:#?}");
        let last = statuses.last().expect("a status was published");
        assert_eq!(
            last["ready"],
            json!(run_pod[keys::LIFECYCLE_STATE] == "ready"),
            "{last}"
        );
        assert_eq!(last["podIP"], run_pod[keys::IP], "{last}");
        let runs: Vec<&Value> = lines.iter().filter(|l| l.get("pod").is_some()).collect();
        assert_eq!(runs.len(), 1, "{lines:#?}");
        assert_eq!(runs[0]["pod"], json!(format!("{namespace}/{name}")));
        assert_eq!(
            lines.last().map(|l| l["reconcile"]["republished"].clone()),
            Some(json!(0)),
            "the closing reconcile wrote nothing: {lines:#?}"
        );

        let lifecycle = run_pod[keys::LIFECYCLE_STATE].as_str();
        match ending {
            Ending::Done | Ending::Resumed => assert_eq!(lifecycle, Some("ready")),
            Ending::Exhausted => assert_eq!(lifecycle, Some("failed")),
            Ending::Changed => {
                assert_eq!(lifecycle, Some("ready"));
                assert!(
                    run_patches.iter().any(|p| p["status"] == 409),
                    "the other writer refused a write: {run_patches:#?}"
                );
            }
        }
    }

    /// The program never guesses a fact its runtime's typed record lacks:
    /// a Firecracker Linux clone needs the image (it tells a cloudimg guest
    /// from an OCI one, and no file on disk does), which vk-cocoon's typed
    /// VM drops. Without `-source-image` the program stops, says the fact
    /// is missing, runs nothing in the guest and writes nothing; `run`,
    /// reading the whole record, fixes the same VM. And a VM cocoon says
    /// does not exist stops the program as gone, not retryable, with
    /// nothing written either.
    #[rstest::rstest]
    #[case::the_image("missing-fact", true)]
    #[case::the_vm("vm-gone", false)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_maintainers_go_program_stops_on_what_its_runtime_lacks(
        #[case] kind: &str,
        #[case] vm_exists: bool,
    ) {
        let Some(program) = maintainer() else {
            return;
        };
        let vm_name = vm_name_for_pod("prod", "demo-0");
        let mut annotations = base(&vm_name);
        annotations.insert("vm.cocoonstack.io/backend", json!(FIRECRACKER));
        let pod = pod_json("prod", "demo-0", &annotations);
        let cocoon = if vm_exists {
            json!({"exec": [{"exit": 0, "done": true}],
                "inspect": {"json": vm_on(&vm_name, FIRECRACKER)}})
        } else {
            // No inspect: fake-cocoon says the VM is not found.
            json!({"exec": [{"exit": 0, "done": true}]})
        };

        if vm_exists {
            let stage = Stage::new(&pod, &[], &cocoon, &[]).await;
            let command = stage.run(&pod, &[]);
            let by_run = stage.finish(command).await;
            assert!(by_run.ok, "{}", by_run.stderr);
            assert_eq!(
                by_run.api.annotation(keys::LIFECYCLE_STATE).as_deref(),
                Some("ready")
            );
            assert!(
                by_run.calls.iter().any(|c| c[1] == "exec"),
                "run fixed the VM: {:?}",
                by_run.calls
            );
        }

        let flags = ["-namespace", "prod", "-pod", "demo-0", "-boot", "create"];
        let stage = Stage::new(&pod, &[], &cocoon, &[]).await;
        let command = stage.program(program, &flags);
        let by_go = stage.finish(command).await;
        assert!(!by_go.ok, "the program stopped: {}", by_go.stdout);
        let lines = by_go.lines();
        let stopped = lines
            .iter()
            .find_map(|l| l.get("stopped"))
            .unwrap_or_else(|| panic!("the program says it stopped: {lines:#?}"));
        assert_eq!(stopped["kind"], kind, "{stopped}");
        assert_eq!(stopped["retryable"], false, "{stopped}");
        if vm_exists {
            let message = stopped["message"].as_str().unwrap();
            assert!(message.contains("image"), "the fact is named: {message}");
        }
        assert!(
            by_go.calls.iter().all(|c| c[1] == "inspect"),
            "nothing ran in the guest: {:?}",
            by_go.calls
        );
        assert!(!by_go.calls.is_empty(), "the VM was inspected");
        let (patches, events, _) = written(&by_go.api);
        assert!(patches.is_empty(), "nothing written: {patches:#?}");
        assert!(events.is_empty(), "nothing told: {events:#?}");
        assert!(
            !lines.iter().any(|l| l.get("status").is_some()),
            "no status published: {lines:#?}"
        );
        let unexpected = by_go.api.with(|s| s.unexpected.clone());
        assert!(unexpected.is_empty(), "unexpected requests: {unexpected:?}");
    }

    const CLOUD_HYPERVISOR: &str = "cloud-hypervisor";
    const FIRECRACKER: &str = "firecracker";
    /// The image of the Firecracker clones' snapshot: an OCI image.
    const FIRECRACKER_IMAGE: &str = "ghcr.io/cocoonstack/cocoon/ubuntu:24.04";

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Ending {
        Done,
        Exhausted,
        /// Another writer changes the pod before the first two writes.
        Changed,
        /// Each side's first start is stopped in the guest, leaving the
        /// pod `running`; the program resumes it at its next start
        /// (`-startup`), `run` as it runs any pod.
        Resumed,
    }

    /// The record `cocoon vm inspect` prints for the comparison's VM on
    /// `backend`: on Firecracker with its snapshot's image.
    fn vm_on(name: &str, backend: &str) -> Value {
        let mut record = vm(name);
        record["hypervisor"] = json!(backend);
        if backend == FIRECRACKER {
            record["config"]["image"] = json!(FIRECRACKER_IMAGE);
        }
        record
    }

    /// One side of a maintainer comparison: whether its (last) start ended
    /// well, what it printed, its `cocoon` calls and the API server it
    /// wrote to.
    struct Side {
        ok: bool,
        stdout: String,
        stderr: String,
        calls: Vec<Vec<String>>,
        api: FakeApi,
    }

    impl Side {
        /// The program's JSON lines.
        fn lines(&self) -> Vec<Value> {
            self.stdout
                .lines()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
                .collect()
        }
    }

    /// The inputs of one side: a directory with `fake-cocoon` as `cocoon`
    /// playing `cocoon` (a scenario without its log; an exec's `gate` is
    /// a file name in the directory, never made), and a fake API server
    /// holding `pod` with `others` beside it on the node, another writer
    /// changing it before the patches `changes` counts.
    struct Stage {
        dir: tempfile::TempDir,
        api: FakeApi,
    }

    impl Stage {
        async fn new(pod: &Value, others: &[Value], cocoon: &Value, changes: &[usize]) -> Stage {
            let dir = tempfile::tempdir().unwrap();
            let d = dir.path();
            std::os::unix::fs::symlink(fake_cocoon(), d.join("cocoon")).unwrap();
            let mut scenario = cocoon.clone();
            scenario["log"] = json!(d.join("calls.jsonl"));
            scenario["state_file"] = json!(d.join("exec-count"));
            if let Some(entries) = scenario["exec"].as_array_mut() {
                for entry in entries {
                    if let Some(gate) = entry["gate"].as_str() {
                        entry["gate"] = json!(d.join(gate));
                    }
                }
            }
            fs::write(d.join("cocoon.json"), scenario.to_string()).unwrap();
            fs::create_dir(d.join("plugins")).unwrap();
            fs::write(d.join("config.toml"), "").unwrap();
            let api = FakeApi::start(pod.clone(), false).await;
            for other in others {
                api.add_other_pod(other.clone());
            }
            api.change_before_patches(changes);
            Stage { dir, api }
        }

        /// `cocoon-fixup run` for `pod` with `flags`.
        fn run(&self, pod: &Value, flags: &[&str]) -> tokio::process::Command {
            let d = self.dir.path();
            let namespace = pod["metadata"]["namespace"].as_str().unwrap();
            let name = pod["metadata"]["name"].as_str().unwrap();
            let mut run = cocoon_fixup(
                d,
                &self.api.kubeconfig(d),
                &["run", "--namespace", namespace, "--pod", name],
            );
            run.args(flags);
            run
        }

        /// The maintainer's program with `flags`, its records kept where
        /// `run` keeps its own.
        fn program(&self, program: &Path, flags: &[&str]) -> tokio::process::Command {
            let d = self.dir.path();
            let mut go = tokio::process::Command::new(program);
            go.arg("-server")
                .arg(self.api.url())
                .arg("-cocoon")
                .arg(d.join("cocoon"))
                .arg("-cocoon-root")
                .arg(d)
                .arg("-lease-file")
                .arg(d.join("leases.json"))
                .arg("-state-dir")
                .arg(d.join("state"))
                .args(flags)
                .env("COCOON_FIXUP_BIN", support::binary::program())
                .env("HOME", d)
                .kill_on_drop(true);
            go
        }

        /// Runs `command` to its end and gives the side as it is then.
        async fn finish(self, mut command: tokio::process::Command) -> Side {
            let out = command
                .stdin(std::process::Stdio::null())
                .output()
                .await
                .expect("the side runs");
            Side {
                ok: out.status.success(),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                calls: cocoon_calls(self.dir.path()),
                api: self.api,
            }
        }

        /// Starts `command` and stops it with SIGTERM, as systemd stops a
        /// service, once its first exec has started; it exits `exit`.
        async fn stopped_in_the_exec(&self, mut command: tokio::process::Command, exit: i32) {
            let mut child = command
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("the side starts");
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while !cocoon_calls(self.dir.path()).iter().any(|c| c[1] == "exec") {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no exec started within 60 s"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let pid = child.id().expect("the side runs");
            let pid = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
            rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
            let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
                .await
                .expect("the side stops within 60 s of SIGTERM")
                .unwrap();
            assert_eq!(status.code(), Some(exit), "stopped: {status}");
        }
    }

    /// A patch as [`written`] gives it, split into the rest of it and its
    /// lifecycle keys.
    fn split(patch: &Value) -> (Value, Map<String, Value>) {
        let mut rest = patch.clone();
        let mut lifecycle = Map::new();
        if let Some(annotations) = rest["annotations"].as_object_mut() {
            for key in LIFECYCLE_KEYS {
                if let Some(value) = annotations.remove(key) {
                    lifecycle.insert(key.to_owned(), value);
                }
            }
        }
        (rest, lifecycle)
    }

    /// Checks the program's patches against run's, write by write: for
    /// each of run's patches, the same patch without the lifecycle keys
    /// (unless nothing else is in it), then, when run's landed with
    /// lifecycle keys, the program's own write of exactly those keys with
    /// the uid precondition only; nothing else. Returns how many
    /// lifecycle writes the program made.
    fn same_writes(run: &[Value], go: &[Value]) -> usize {
        let mut written = go.iter();
        let mut lifecycle_writes = 0;
        let context = || format!("run wrote {run:#?}\nthe program wrote {go:#?}");
        for patch in run {
            let (rest, lifecycle) = split(patch);
            if rest["annotations"]
                .as_object()
                .is_none_or(|a| !a.is_empty())
            {
                let theirs = written.next();
                assert_eq!(theirs, Some(&rest), "the record write: {}", context());
            }
            if !lifecycle.is_empty() && patch["status"] == 200 {
                let theirs = written.next();
                let want = json!({"annotations": lifecycle, "uid": patch["uid"],
                    "resourceVersion": null, "status": 200});
                assert_eq!(theirs, Some(&want), "the lifecycle write: {}", context());
                lifecycle_writes += 1;
            }
        }
        assert_eq!(
            written.next(),
            None,
            "a write run did not make: {}",
            context()
        );
        lifecycle_writes
    }

    /// What a client wrote and told through the fake API server, without
    /// what is the client's own (event names and times, the reporting
    /// controller): every patch with its preconditions and status, every
    /// event, and the pod's annotations at the end.
    fn written(api: &FakeApi) -> (Vec<Value>, Vec<Value>, Value) {
        api.with(|s| {
            let patches = s
                .patches
                .iter()
                .map(|(patch, status)| {
                    json!({
                        "annotations": patch["metadata"]["annotations"],
                        "uid": patch["metadata"]["uid"],
                        "resourceVersion": patch["metadata"]["resourceVersion"],
                        "status": status,
                    })
                })
                .collect();
            let events = s
                .events
                .iter()
                .map(|e| {
                    json!({
                        "type": e["type"], "reason": e["reason"], "note": e["note"],
                        "action": e["action"], "regarding": e["regarding"],
                    })
                })
                .collect();
            (patches, events, s.pod["metadata"]["annotations"].clone())
        })
    }

    /// The `cocoon` calls fake-cocoon logged in `dir`.
    fn cocoon_calls(dir: &std::path::Path) -> Vec<Vec<String>> {
        fs::read_to_string(dir.join("calls.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                v["argv"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap().to_owned())
                    .collect()
            })
            .collect()
    }

    /// `calls` with each exec's nonce (a word of 32 hex digits) made one
    /// placeholder.
    fn without_nonces(calls: Vec<Vec<String>>) -> Vec<Vec<String>> {
        let nonce = |a: &str| {
            let bare = a.trim_matches('\'');
            bare.len() == 32 && bare.bytes().all(|b| b.is_ascii_hexdigit())
        };
        calls
            .into_iter()
            .map(|call| {
                call.into_iter()
                    .map(|a| if nonce(&a) { "<nonce>".to_owned() } else { a })
                    .collect()
            })
            .collect()
    }

    /// The maintainer's program, built once with `CGO_ENABLED=0`; `None`
    /// (said loudly) without Go.
    fn maintainer() -> Option<&'static std::path::Path> {
        static BUILT: std::sync::OnceLock<Option<(tempfile::TempDir, std::path::PathBuf)>> =
            std::sync::OnceLock::new();
        BUILT
            .get_or_init(|| {
                let dir = tempfile::tempdir().unwrap();
                let program = dir.path().join("maintainer");
                let built = std::process::Command::new("go")
                    .args(["build", "-o"])
                    .arg(&program)
                    .arg(".")
                    .current_dir(
                        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/go-maintainer"),
                    )
                    .env("CGO_ENABLED", "0")
                    .env("GOPROXY", "off")
                    .output();
                match built {
                    Ok(out) if out.status.success() => Some((dir, program)),
                    Ok(out) => panic!(
                        "building tests/go-maintainer failed:\n{}",
                        String::from_utf8_lossy(&out.stderr)
                    ),
                    Err(_) => {
                        assert!(
                            std::env::var_os("COCOON_FIXUP_REQUIRE_GO").is_none_or(|v| v != "1"),
                            "the Go toolchain is not installed and COCOON_FIXUP_REQUIRE_GO=1"
                        );
                        eprintln!(
                            "\n*** SKIPPED: the maintainer's Go program needs the Go toolchain (Go 1.19 or later; on Debian `apt-get install golang-go`). ***\n"
                        );
                        None
                    }
                }
            })
            .as_ref()
            .map(|(_, program)| program.as_path())
    }

    fn pod_json(namespace: &str, name: &str, annotations: &BTreeMap<&str, Value>) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                "uid": "5f0c3a1e-8b7d-4c2a-9e1f-0a2b3c4d5e6f", "annotations": annotations},
            "spec": {"nodeName": "n1", "containers": []},
        })
    }

    fn base(vm_name: &str) -> BTreeMap<&'static str, Value> {
        BTreeMap::from([
            ("vm.cocoonstack.io/name", json!(vm_name)),
            ("vm.cocoonstack.io/id", json!(VM_ID)),
            ("cocoonset.cocoonstack.io/managed", json!("true")),
            ("cocoonset.cocoonstack.io/os", json!("linux")),
            ("cocoonset.cocoonstack.io/generation", json!("1")),
            ("vm.cocoonstack.io/backend", json!("cloud-hypervisor")),
        ])
    }

    fn vm(name: &str) -> Value {
        serde_json::from_str(&record(name, "", &[(STATIC_MAC, Some("10.0.0.5"))])).unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn another_tenants_vm() {
        let victim = vm_name_for_pod("tenant-b", "db-0");
        let (code, calls, api) =
            run(pod_json("tenant-a", "evil", &base(&victim)), vm(&victim)).await;
        assert_eq!(code, Some(5), "exit code 5: not this pod's VM");
        assert_eq!(calls, [["vm", "inspect", "--json", VM_ID]], "no exec");
        api.with(|s| assert!(s.patches.is_empty(), "{:?}", s.patches));
        let events = api.events();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].0, reasons::VM_MISMATCH);
        assert!(!events[0].1.contains(&victim), "{}", events[0].1);
        assert_eq!(api.annotation(keys::IP), None);
    }

    /// `run` with `--accept-annotated-vm-names` and the pod's node: the
    /// retired webhook's slot name binds when no pod the API server lists
    /// on that node claims it; another pod carrying the same annotation
    /// keeps it from binding; without the flag, or without the node, it
    /// never binds, and nothing but the event (none without the node) is
    /// written.
    #[rstest::rstest]
    #[case::bound(&["--accept-annotated-vm-names", "--node", "n1"], false, Some(0))]
    #[case::not_accepted(&["--node", "n1"], false, Some(5))]
    #[case::claimed(&["--accept-annotated-vm-names", "--node", "n1"], true, Some(5))]
    #[case::no_node(&["--accept-annotated-vm-names"], false, Some(1))]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_annotated_name(
        #[case] flags: &[&str],
        #[case] claimed: bool,
        #[case] code: Option<i32>,
    ) {
        const SLOT: &str = "vk-prod-demo-1";
        let other = |name: &str, uid: &str, vm_name: &str| {
            let mut pod = pod_json(
                "prod",
                name,
                &BTreeMap::from([("vm.cocoonstack.io/name", json!(vm_name))]),
            );
            pod["metadata"]["uid"] = json!(uid);
            pod
        };
        let mut others = vec![other(
            "web-0",
            "uid-web-0",
            &vm_name_for_pod("prod", "web-0"),
        )];
        if claimed {
            others.push(other("demo-7b7c9d9d5f-q9w8e", "uid-q9w8e", SLOT));
        }
        let (got, calls, api, stderr) = run_with(
            pod_json("prod", "demo-7b7c9d9d5f-x2x4z", &base(SLOT)),
            vm(SLOT),
            &others,
            flags,
        )
        .await;
        assert_eq!(got, code, "{stderr}");
        let listed = api.with(|s| {
            s.requests.iter().any(|r| {
                r.path == "/api/v1/pods" && percent_decoded(&r.query).contains("spec.nodeName=n1")
            })
        });
        assert_eq!(
            listed,
            flags.contains(&"--accept-annotated-vm-names") && flags.contains(&"--node"),
            "the node's pods are listed only to check an accepted annotated name"
        );
        let events = api.events();
        match code {
            Some(0) => {
                assert_eq!(calls.len(), 2, "inspect, then one exec: {calls:?}");
                assert_eq!(
                    api.annotation(keys::LIFECYCLE_STATE).as_deref(),
                    Some("ready")
                );
            }
            Some(5) => {
                assert_eq!(calls, [["vm", "inspect", "--json", VM_ID]], "no exec");
                api.with(|s| assert!(s.patches.is_empty(), "{:?}", s.patches));
                assert_eq!(events.len(), 1, "{events:?}");
                assert_eq!(events[0].0, reasons::VM_MISMATCH);
                assert!(!events[0].1.contains("remove"), "{}", events[0].1);
                assert!(!events[0].1.contains("q9w8e"), "{}", events[0].1);
            }
            _ => {
                assert!(stderr.contains("--node"), "{stderr}");
                assert_eq!(calls, [["vm", "inspect", "--json", VM_ID]], "no exec");
                api.with(|s| assert!(s.patches.is_empty(), "{:?}", s.patches));
                assert!(events.is_empty(), "{events:?}");
            }
        }
    }

    /// `serve --accept-annotated-vm-names`: the daemon answers from the
    /// pods its watch keeps, so the slot name binds once the watch has
    /// listed the node (a try before that is not proven, and tried again),
    /// and another pod on the node carrying the same annotation keeps it
    /// from binding.
    #[rstest::rstest]
    #[case::bound(false)]
    #[case::claimed(true)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serve_checks_an_annotated_name_against_the_pods_it_watches(#[case] claimed: bool) {
        const SLOT: &str = "vk-prod-demo-1";
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::os::unix::fs::symlink(fake_cocoon(), d.join("cocoon")).unwrap();
        let scenario = json!({"exec": [{"exit": 0, "done": true}], "inspect": {"json": vm(SLOT)}});
        fs::write(d.join("cocoon.json"), scenario.to_string()).unwrap();
        fs::create_dir(d.join("plugins")).unwrap();
        fs::write(d.join("config.toml"), "accept_annotated_vm_names = true\n").unwrap();
        let api = FakeApi::start(
            pod_json("prod", "demo-7b7c9d9d5f-x2x4z", &base(SLOT)),
            false,
        )
        .await;
        if claimed {
            let mut other = pod_json(
                "prod",
                "demo-7b7c9d9d5f-q9w8e",
                &BTreeMap::from([("vm.cocoonstack.io/name", json!(SLOT))]),
            );
            other["metadata"]["uid"] = json!("uid-q9w8e");
            api.add_other_pod(other);
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = d.join("serve.log");
        let mut daemon = cocoon_fixup(d, &api.kubeconfig(d), &["serve", "--node", "n1"])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .stdout(std::process::Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("the daemon starts");
        let started = std::time::Instant::now();
        let done = || {
            if claimed {
                !api.events().is_empty()
            } else {
                api.annotation(keys::LIFECYCLE_STATE).as_deref() == Some("ready")
            }
        };
        while !done() {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "nothing happened; log:\n{}",
                fs::read_to_string(&log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        daemon.start_kill().unwrap();
        daemon.wait().await.unwrap();
        let log = fs::read_to_string(&log).unwrap();
        assert!(log.contains("--accept-annotated-vm-names is on"), "{log}");
        if claimed {
            let events = api.events();
            assert_eq!(events[0].0, reasons::VM_MISMATCH, "{events:?}");
            assert!(!events[0].1.contains("q9w8e"), "{}", events[0].1);
            api.with(|s| assert!(s.patches.is_empty(), "{:?}", s.patches));
            assert!(
                log.contains("demo-7b7c9d9d5f-q9w8e"),
                "the log names the pod that claims it: {log}"
            );
        }
    }

    /// A query string with its `%XX` escapes decoded (enough for field
    /// selectors).
    fn percent_decoded(query: &str) -> String {
        query.replace("%3D", "=").replace("%2C", ",")
    }

    #[rstest::rstest]
    #[case::hibernating(&[(keys::LIFECYCLE_STATE, json!("hibernating")), ("vm.cocoonstack.io/hibernate", json!("true"))], false)]
    #[case::deleting(&[], true)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn left_alone(#[case] extra: &[(&str, Value)], #[case] deleting: bool) {
        let name = vm_name_for_pod("default", "web-0");
        let mut annotations = base(&name);
        annotations.extend(extra.iter().cloned());
        let mut pod = pod_json("default", "web-0", &annotations);
        if deleting {
            pod["metadata"]["deletionTimestamp"] = json!("2026-12-01T10:00:00Z");
        }
        let before = pod["metadata"]["annotations"].clone();
        let (code, calls, api) = run(pod, vm(&name)).await;
        assert_eq!(code, Some(0));
        assert!(calls.is_empty(), "cocoon is not even asked: {calls:?}");
        api.with(|s| {
            assert!(s.patches.is_empty(), "{:?}", s.patches);
            assert!(s.events.is_empty(), "{:?}", s.events);
            assert_eq!(s.pod["metadata"]["annotations"], before);
        });
    }

    /// A pod in mode `run`: its VM is looked up (it may be a wake), the
    /// pod's events are listed for the verdict, and nothing is written or
    /// told.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_pod_that_is_no_wake_is_left_alone() {
        let name = vm_name_for_pod("default", "web-0");
        let mut annotations = base(&name);
        annotations.insert("cocoonset.cocoonstack.io/mode", json!("run"));
        let pod = pod_json("default", "web-0", &annotations);
        let before = pod["metadata"]["annotations"].clone();
        let (code, calls, api) = run(pod, vm(&name)).await;
        assert_eq!(code, Some(0));
        assert!(
            calls
                .iter()
                .all(|call| call.get(1).map(String::as_str) == Some("inspect")),
            "only inspect: {calls:?}"
        );
        api.with(|s| {
            assert!(s.patches.is_empty(), "{:?}", s.patches);
            assert!(s.events.is_empty(), "{:?}", s.events);
            assert_eq!(s.pod["metadata"]["annotations"], before);
        });
    }

    /// `serve` with a plugin file that does not load: it starts anyway,
    /// says so in its log and its metrics, serves the pod with the plugins
    /// that loaded, and `plugin inspect` says why the file was refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serve_reports_a_plugin_that_does_not_load_and_serves() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::os::unix::fs::symlink(fake_cocoon(), d.join("cocoon")).unwrap();
        let name = vm_name_for_pod("default", "web-0");
        let scenario = json!({"exec": [{"exit": 0, "done": true}], "inspect": {"json": vm(&name)}});
        fs::write(d.join("cocoon.json"), scenario.to_string()).unwrap();
        fs::create_dir(d.join("plugins")).unwrap();
        fs::write(d.join("plugins/junk.wasm"), b"not a component").unwrap();
        fs::write(d.join("config.toml"), "").unwrap();
        let api = FakeApi::start(pod_json("default", "web-0", &base(&name)), false).await;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = d.join("serve.log");
        let mut daemon = cocoon_fixup(d, &api.kubeconfig(d), &["serve", "--node", "n1"])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .stdout(std::process::Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("the daemon starts");
        let started = std::time::Instant::now();
        while api.annotation(keys::LIFECYCLE_STATE).as_deref() != Some("ready") {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "no fixup; log:\n{}",
                fs::read_to_string(&log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let metrics = {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("metrics listener");
            stream
                .write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut body = String::new();
            stream.read_to_string(&mut body).await.unwrap();
            body
        };
        daemon.start_kill().unwrap();
        daemon.wait().await.unwrap();
        let log = fs::read_to_string(&log).unwrap();
        assert!(
            log.contains("plugin not loaded") && log.contains("junk.wasm"),
            "{log}"
        );
        assert!(
            metrics.contains("cocoon_fixup_plugin_load_failures_total 1"),
            "{metrics}"
        );
        let inspect = std::process::Command::new(env!("CARGO_BIN_EXE_cocoon-fixup"))
            .args(["plugin", "inspect"])
            .arg(d.join("plugins/junk.wasm"))
            .arg("--cache-dir")
            .arg(d.join("cache"))
            .output()
            .unwrap();
        assert_eq!(inspect.status.code(), Some(1));
        let said = String::from_utf8_lossy(&inspect.stdout);
        assert!(said.contains("refused"), "{said}");
    }

    /// The control: the pod's own VM is fixed up by the same binary.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_pods_own_vm() {
        let name = vm_name_for_pod("default", "web-0");
        let (code, calls, api) = run(pod_json("default", "web-0", &base(&name)), vm(&name)).await;
        assert_eq!(code, Some(0));
        assert_eq!(calls.len(), 2, "inspect, then one exec: {calls:?}");
        assert_eq!(calls[1][..3], ["vm", "exec", VM_ID]);
        assert_eq!(api.annotation(keys::IP).as_deref(), Some("10.0.0.5"));
        assert_eq!(
            api.annotation(keys::LIFECYCLE_STATE).as_deref(),
            Some("ready")
        );
    }
}
