//! `Host::handle` over the real `kube` client, against a tower-test mock
//! API server: the counterparts of `apply.rs` (which keeps pods in memory).
//!
//! Each test is a named scenario that lists the whole conversation the host
//! must have with the API server, in order: every GET of the pod, every
//! annotation PATCH with its exact body (merge-patch content type, the
//! `metadata.uid` precondition, every key and value, removals as `null`),
//! and every event POST with its reason, type and note. A request the
//! scenario does not list fails the test, and so does a listed request that
//! never came. GETs are answered with the pod as the earlier PATCHes (and
//! any other writer the scenario names) left it, and so are PATCHes, each
//! with its `metadata.resourceVersion`. Every PATCH the host makes is
//! decided from its latest read of the pod and carries that read's
//! resource version as a precondition; when another writer changed the pod
//! since (`meanwhile`), the PATCH is answered 409 and the host reads and
//! decides again (`patch_stale`). The host takes the answer to its
//! `running` write as the read before attempt 1; it GETs the pod instead
//! when that answer carries no usable pod (`patch_answering`).
//!
//! The cocoon side is the in-process `ScriptedCocoon`, so the retry budget
//! runs under paused tokio time; only the IP-wait timeout runs in real
//! (short) time, because the lease watcher reads a real file.

use crate::support;

use fixup_core::decision::FixupEnd;
use fixup_core::decision::Handled;
use fixup_core::decision::Readiness;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use fixup_core::decision::{ReadyConfig, RetryConfig};
use fixup_core::decision::{Stop, Summary, Trigger};
use fixup_core::facts::PodInput;
use fixup_core::planner::{Planner, PlannerOptions};
use fixup_host::host::{Host, HostConfig};
use fixup_host::kube::{REPORTER, RetryPolicy};
use fixup_host::metrics::Metrics;
use fixup_host::pods::{keys, reasons};
use fixup_host::ready::LeaseWatcher;
use serde_json::{Map, Value, json};
use support::mock_api::{Exchange, NODE, Scenario, status};
use support::{Call, Reply, ScriptedCocoon, UID, inspect, pod, vm_name};
use tokio_util::sync::CancellationToken;

const NAMESPACE: &str = "default";
const NAME: &str = "web-0";
const POD_PATH: &str = "/api/v1/namespaces/default/pods/web-0";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

const STATIC: [(&str, Option<&str>); 1] = [("52:54:00:aa:bb:01", Some("10.0.0.5/24"))];
const DHCP: [(&str, Option<&str>); 1] = [("52:54:00:AA:BB:02", None)];

/// stderr of an attempt whose step 4 (of 5) failed.
const STEP4_FAILED: &str = "\ncocoon-fixup: {nonce} step 1/5 start\n\ncocoon-fixup: {nonce} step 2/5 start\n\ncocoon-fixup: {nonce} step 3/5 start\n\ncocoon-fixup: {nonce} step 4/5 start\nprintf: /etc/systemd/network: Read-only file system\n\ncocoon-fixup: {nonce} step 4/5 failed exit 1\n";

// ---- the conversation: what the API server expects, step by step ----

/// The API server's side of a conversation about pod `default/web-0`.
struct Conversation {
    name: &'static str,
    /// The pod as the server holds it now; GETs answer with it.
    uid: String,
    annotations: BTreeMap<String, String>,
    /// Its resource version now.
    version: u64,
    /// The resource version of the host's latest read of the pod: its
    /// next PATCH carries it.
    seen: u64,
    exchanges: Vec<Exchange>,
    /// The conversation before its last step, for [`refused`](Self::refused).
    before_last: Option<Box<Conversation>>,
}

impl Conversation {
    fn new(name: &'static str, pod: &PodInput) -> Self {
        Conversation {
            name,
            uid: pod.uid.clone().expect("the test pod has a uid"),
            annotations: pod.annotations.clone(),
            version: 7,
            seen: 0,
            exchanges: Vec::new(),
            before_last: None,
        }
    }

    fn pod_json(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": NAME,
                "namespace": NAMESPACE,
                "uid": self.uid,
                "annotations": self.annotations,
                "resourceVersion": self.version.to_string(),
            },
            "spec": { "nodeName": NODE, "containers": [] },
        })
    }

    /// Add `exchange`; `before` is the conversation before this step
    /// (its state changes already made by the caller).
    fn step_from(mut self, before: Conversation, exchange: Exchange) -> Self {
        self.exchanges.push(exchange);
        self.before_last = Some(Box::new(before));
        self
    }

    fn step(self, exchange: Exchange) -> Self {
        let before = self.clone_state();
        self.step_from(before, exchange)
    }

    /// The pod's state and the host's view, without the exchanges.
    fn clone_state(&self) -> Conversation {
        Conversation {
            name: self.name,
            uid: self.uid.clone(),
            annotations: self.annotations.clone(),
            version: self.version,
            seen: self.seen,
            exchanges: Vec::new(),
            before_last: None,
        }
    }

    /// Another writer changes the pod's annotations before the next step.
    fn meanwhile(mut self, changes: &[(&str, &str)]) -> Self {
        for (k, v) in changes {
            self.annotations.insert((*k).to_owned(), (*v).to_owned());
        }
        self.version += 1;
        self
    }

    /// The pod is deleted and recreated under its name before the next step.
    fn recreated(mut self, uid: &str) -> Self {
        uid.clone_into(&mut self.uid);
        self.annotations = pod(&[]).annotations;
        self.version += 1;
        self
    }

    /// The host reads the pod.
    fn get(mut self) -> Self {
        let before = self.clone_state();
        let answer = self.pod_json();
        self.seen = self.version;
        self.step_from(
            before,
            Exchange::get(POD_PATH)
                .body(|_, body| assert_eq!(body, &Value::Null, "a GET has no body"))
                .respond(200, answer),
        )
    }

    /// The host reads the pod, which was deleted.
    fn get_not_found(self) -> Self {
        self.step(
            Exchange::get(POD_PATH)
                .respond(404, status(404, "NotFound", "pods \"web-0\" not found")),
        )
    }

    /// The host merge-patches exactly these annotations (`null` removes a
    /// key) under the uid precondition of the pod it was given and the
    /// resource version of its latest read. The answer is the pod as the
    /// write left it, which the host may take as a read.
    fn patch(self, annotations: Value) -> Self {
        self.patch_then(annotations, None)
    }

    /// As [`patch`](Self::patch), and the write lands the same, but the
    /// `200` answer is `answer` (say `{}`, or the metadata of another
    /// incarnation): no usable pod, so the host must not take it as a read.
    fn patch_answering(self, annotations: Value, answer: Value) -> Self {
        self.patch_then(annotations, Some(answer))
    }

    /// The host merge-patches these annotations, decided from a read the
    /// pod has changed since: the API server answers 409, and the host's
    /// read that follows gets the pod as it is now.
    fn patch_stale(self, annotations: Value) -> Self {
        let Value::Object(expected) = annotations else {
            panic!("annotations must be a JSON object");
        };
        assert_ne!(
            self.seen, self.version,
            "the pod did not change since the host read it"
        );
        let seen = self.seen;
        let modified = status(
            409,
            "Conflict",
            "Operation cannot be fulfilled on pods \"web-0\": the object has been modified; please apply your changes to the latest version and try again",
        );
        self.step(
            Exchange::patch(POD_PATH)
                .body(move |_, found| assert_patch(found, &expected, Some(seen)))
                .respond(409, modified),
        )
        .get()
    }

    /// The host merge-patches these annotations under the uid
    /// precondition alone (a write any state of the pod takes).
    fn patch_unguarded(mut self, annotations: Value) -> Self {
        let Value::Object(expected) = annotations else {
            panic!("annotations must be a JSON object");
        };
        let before = self.clone_state();
        self.apply(&expected);
        self.seen = self.version;
        let answer = self.pod_json();
        self.step_from(
            before,
            Exchange::patch(POD_PATH)
                .body(move |_, found| assert_patch(found, &expected, None))
                .respond(200, answer),
        )
    }

    /// The write of `annotations` lands: a null removes one; the
    /// version moves on.
    fn apply(&mut self, annotations: &serde_json::Map<String, Value>) {
        for (k, v) in annotations {
            match v {
                Value::String(v) => self.annotations.insert(k.clone(), v.clone()),
                Value::Null => self.annotations.remove(k),
                other => panic!("annotation {k} must be a string or null, not {other}"),
            };
        }
        self.version += 1;
    }

    /// A PATCH of `annotations` answered `200` with `answer`, or with the
    /// pod as the write left it when `None`.
    fn patch_then(mut self, annotations: Value, answer: Option<Value>) -> Self {
        let Value::Object(expected) = annotations else {
            panic!("annotations must be a JSON object");
        };
        let before = self.clone_state();
        assert_eq!(
            self.seen, self.version,
            "a write decided from a stale read: use patch_stale"
        );
        let seen = self.seen;
        self.apply(&expected);
        // Only an answer that is the pod is a read.
        if answer.is_none() {
            self.seen = self.version;
        }
        let answer = answer.unwrap_or_else(|| self.pod_json());
        self.step_from(
            before,
            Exchange::patch(POD_PATH)
                .body(move |_, found| assert_patch(found, &expected, Some(seen)))
                .respond(200, answer),
        )
    }

    /// The host merge-patches exactly the annotation keys `keys` under the
    /// uid and resource version preconditions; `check` asserts their
    /// values. The answer (which the host does not read) carries the pod as
    /// it was, at a new version.
    fn patch_with(
        mut self,
        keys: &[&str],
        check: impl FnOnce(&Map<String, Value>) + Send + 'static,
    ) -> Self {
        let mut expected: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
        expected.sort();
        let before = self.clone_state();
        let seen = self.seen;
        self.version += 1;
        let answer = self.pod_json();
        self.step_from(
            before,
            Exchange::patch(POD_PATH)
                .body(move |_, body| {
                    let annotations = &body["metadata"]["annotations"];
                    let Value::Object(annotations) = annotations.clone() else {
                        panic!("no annotations in {body}");
                    };
                    assert_eq!(
                        body,
                        &patch_body(annotations.clone(), seen),
                        "only uid, resource version and annotations"
                    );
                    let mut found: Vec<String> = annotations.keys().cloned().collect();
                    found.sort();
                    assert_eq!(found, expected, "annotation keys of the patch");
                    check(&annotations);
                })
                .respond(200, answer),
        )
    }

    /// The last request is answered with this error instead: what it
    /// changed (the pod, the host's read) is undone.
    fn refused(mut self, code: u16, body: Value) -> Self {
        let last = self.exchanges.pop().expect("a step to refuse");
        let before = *self.before_last.take().expect("a step to refuse");
        self.uid = before.uid;
        self.annotations = before.annotations;
        self.version = before.version;
        self.seen = before.seen;
        self.step(last.respond(code, body))
    }

    /// The host records a new event with exactly this note.
    fn event(self, kind: &'static str, reason: &'static str, note: &str) -> Self {
        let note = note.to_owned();
        self.event_with(kind, reason, move |found| assert_eq!(found, note))
    }

    /// The host records a new event; `check` asserts its note.
    fn event_with(
        self,
        kind: &'static str,
        reason: &'static str,
        check: impl FnOnce(&str) + Send + 'static,
    ) -> Self {
        self.step(
            Exchange::post(EVENTS_PATH)
                .body(move |_, body| {
                    assert_eq!(body["reason"], reason, "event {body}");
                    assert_eq!(body["type"], kind, "event {body}");
                    assert_eq!(body["action"], action_for(reason), "event {body}");
                    assert_eq!(body["reportingController"], REPORTER);
                    assert_eq!(body["reportingInstance"], NODE);
                    assert_eq!(body["metadata"]["namespace"], NAMESPACE);
                    assert_eq!(body["series"], Value::Null, "a new event, not a repeat");
                    assert_eq!(
                        body["regarding"],
                        json!({
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "namespace": NAMESPACE,
                            "name": NAME,
                            "uid": UID,
                        })
                    );
                    let note = body["note"].as_str().expect("every event has a note");
                    assert!(note.len() <= 512, "{} bytes: {note}", note.len());
                    check(note);
                })
                .respond(
                    201,
                    json!({
                        "apiVersion": "events.k8s.io/v1",
                        "kind": "Event",
                        "metadata": {"name": "web-0.1", "namespace": NAMESPACE},
                    }),
                ),
        )
    }

    fn into_scenario(self) -> Scenario {
        Scenario::new(self.name, self.exchanges)
    }
}

/// A merge patch as the host must send it: the uid precondition of the
/// pod it was given, the resource version of the read it decided from
/// (`None`: a write under the uid alone), and annotations that include
/// `expected` (a write that carries more keys than a conversation cares
/// about still passes it); nothing else.
fn assert_patch(found: &Value, expected: &Map<String, Value>, seen: Option<u64>) {
    let Some(metadata) = found["metadata"].as_object() else {
        panic!("no metadata in {found}");
    };
    let mut preconditions = json!({ "uid": UID });
    if let Some(seen) = seen {
        preconditions["resourceVersion"] = Value::from(seen.to_string());
    }
    let Value::Object(mut wanted) = preconditions else {
        unreachable!()
    };
    wanted.insert("annotations".into(), metadata["annotations"].clone());
    assert_eq!(
        found,
        &json!({ "metadata": wanted }),
        "only the preconditions and annotations"
    );
    let annotations = metadata["annotations"]
        .as_object()
        .unwrap_or_else(|| panic!("no annotations in {found}"));
    for (key, value) in expected {
        assert_eq!(
            annotations.get(key),
            Some(value),
            "annotation {key} of the patch {found}"
        );
    }
}

/// A merge patch as the host must send it: the uid precondition of the
/// pod it was given, the resource version of the read it decided from, and
/// the annotations; nothing else.
fn patch_body(annotations: Map<String, Value>, seen: u64) -> Value {
    json!({
        "metadata": {
            "uid": UID,
            "resourceVersion": seen.to_string(),
            "annotations": annotations,
        }
    })
}

/// The events.k8s.io `action` each reason is recorded under.
fn action_for(reason: &str) -> &'static str {
    match reason {
        reasons::EXEC_ATTEMPT_FAILED | reasons::SUCCEEDED | reasons::EXEC_EXHAUSTED => {
            "PostCloneFixup"
        }
        reasons::IP_WAIT_TIMEOUT | reasons::WAKE_IP_WAIT_TIMEOUT | reasons::DHCP_RECOVERY => {
            "ReadyWait"
        }
        reasons::RESUMED_AFTER_RESTART => "Resume",
        other => panic!("unexpected event reason {other}"),
    }
}

/// The ready write for the static NIC: the IP and the lifecycle triple.
fn ready_patch() -> Value {
    json!({
        keys::IP: "10.0.0.5",
        keys::LIFECYCLE_STATE: "ready",
        keys::LIFECYCLE_MESSAGE: null,
        keys::LIFECYCLE_OBSERVED_GENERATION: "3",
    })
}

/// After a successful attempt on a clone whose first NIC is static:
/// `done`, the IP and the lifecycle in one write (there is nothing to
/// wait for).
fn done_and_ready_patch() -> Value {
    let mut patch = ready_patch();
    patch[keys::POST_CLONE_STATE] = json!("done");
    patch
}

// ---- the host under test ----

struct Rig {
    planner: Arc<Planner>,
    cocoon: ScriptedCocoon,
    leases: Arc<LeaseWatcher>,
    config: HostConfig,
    _dir: tempfile::TempDir,
}

fn rig(replies: Vec<Reply>, nics: &[(&str, Option<&str>)], config: HostConfig) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cocoon-root");
    std::fs::create_dir_all(&root).unwrap();
    let options = PlannerOptions {
        cocoon_root: root,
        ..PlannerOptions::default()
    };
    let (planner, failures) = Planner::new(options).unwrap();
    assert!(failures.is_empty(), "{failures:?}");
    let leases = LeaseWatcher::new(dir.path().join("leases.json"), Duration::from_millis(20))
        .expect("lease watcher");
    Rig {
        planner: Arc::new(planner),
        cocoon: ScriptedCocoon::new(replies, inspect(nics)),
        leases: Arc::new(leases),
        config,
        _dir: dir,
    }
}

/// Fast API retries, so a conversation that goes wrong fails quickly even
/// in real time; none of the scenarios below needs a retry.
fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        tries: 2,
        first_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(10),
        request_timeout: Duration::from_secs(2),
    }
}

impl Rig {
    /// Run `Host::handle` for `default/web-0` against the conversation;
    /// returns the summary and every `vm exec` the host ran.
    async fn play(&self, conversation: Conversation, trigger: Trigger) -> (Summary, Vec<Call>) {
        let (result, calls) = self.try_play(conversation, trigger).await;
        (result.expect("the pod was handled"), calls)
    }

    /// As [`Rig::play`], keeping the host's error.
    async fn try_play(
        &self,
        conversation: Conversation,
        trigger: Trigger,
    ) -> (Result<Summary, Stop>, Vec<Call>) {
        let result: Result<Summary, Stop> = conversation
            .into_scenario()
            .run(|api| async move {
                let host = Host::new(
                    self.planner.clone(),
                    self.cocoon.clone(),
                    api.with_retry(fast_retry()),
                    self.leases.clone(),
                    self.config.clone(),
                    Arc::new(Metrics::new()),
                );
                // `host` (and its client) is dropped here, which ends the
                // conversation.
                host.handle(NAMESPACE, NAME, trigger, &CancellationToken::new())
                    .await
            })
            .await;
        (result, self.cocoon.calls())
    }
}

// ---- the scenarios ----

#[tokio::test(start_paused = true)]
async fn success_marks_running_then_done_and_ready_in_one_write() {
    let rig = rig(vec![Reply::Done], &STATIC, HostConfig::default());
    let conversation = Conversation::new("fixup succeeds at once, static NIC", &pod(&[]))
        .get()
        // Decided from that read: it lands only if the pod is unchanged.
        .patch(json!({ keys::POST_CLONE_STATE: "running" }))
        // Its answer is the read before attempt 1 and the one `done` and
        // `ready` are decided from: no GET.
        .patch(done_and_ready_patch())
        .event(
            "Normal",
            reasons::SUCCEEDED,
            "kind=linux_static attempts=1 scenario=oci-networkd",
        );
    let (summary, calls) = rig.play(conversation, Trigger::Event).await;
    assert_eq!(summary.action, Handled::Fixup);
    assert_eq!(summary.fixup, Some(FixupEnd::Done));
    assert_eq!(summary.attempts, 1);
    assert_eq!(summary.readiness, Some(Readiness::Ready));
    assert_eq!(summary.ip.as_deref(), Some("10.0.0.5"));
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].vm, "vm-0123abcd");
    assert_eq!(calls[0].argv[..2], ["sh", "-c"]);
}

#[tokio::test(start_paused = true)]
async fn exhaustion_chains_every_attempt_then_fails_the_pod() {
    // Attempts at 0, 3 and 6 s; a fourth would start at 9 s, past 7 s.
    let config = HostConfig {
        retry: RetryConfig {
            interval: Duration::from_secs(3),
            budget: Duration::from_secs(7),
            ..RetryConfig::default()
        },
        ..HostConfig::default()
    };
    let rig = rig(vec![Reply::Exit(1, STEP4_FAILED)], &STATIC, config);
    let line = |n: u32| {
        format!(
            "attempt {n}: step 4/5 \"write the static network file for 52:54:00:aa:bb:01\" exited 1: printf: /etc/systemd/network: Read-only file system"
        )
    };
    let errors = [line(1), line(2), line(3)].join("\n");
    let summary_line = format!("create: {errors}");
    let mut conversation = Conversation::new("three failed attempts exhaust 7 s", &pod(&[]))
        .get()
        // Its answer is the read before attempt 1.
        .patch(json!({ keys::POST_CLONE_STATE: "running" }));
    for n in 1..=3 {
        // Still this incarnation before each later attempt (a GET after
        // the retry interval); each failure is told.
        if n > 1 {
            conversation = conversation.get();
        }
        conversation = conversation.event("Warning", reasons::EXEC_ATTEMPT_FAILED, &line(n));
    }
    let message = errors.clone();
    let conversation = conversation
        // The lifecycle as it is before the failed write.
        .get()
        .patch_with(
            &[
                keys::POST_CLONE_STATE,
                keys::POST_CLONE_HINT,
                keys::POST_CLONE_ERRORS,
                keys::LIFECYCLE_STATE,
                keys::LIFECYCLE_MESSAGE,
                keys::LIFECYCLE_OBSERVED_GENERATION,
            ],
            move |a| {
                assert_eq!(a[keys::POST_CLONE_STATE], "failed");
                assert_eq!(a[keys::POST_CLONE_ERRORS], errors.as_str());
                assert_eq!(a[keys::LIFECYCLE_STATE], "failed");
                assert_eq!(a[keys::LIFECYCLE_MESSAGE], message.as_str());
                assert_eq!(a[keys::LIFECYCLE_OBSERVED_GENERATION], "3");
                let hint = a[keys::POST_CLONE_HINT].as_str().expect("a string hint");
                let script = base64::engine::general_purpose::STANDARD
                    .decode(hint)
                    .expect("the hint is standard, padded base64");
                let script = String::from_utf8(script).unwrap();
                assert!(script.starts_with("#!/bin/sh\n"), "{script}");
                assert!(script.contains("MACAddress=52:54:00:aa:bb:01"), "{script}");
                assert!(script.contains("Address=10.0.0.5/24"), "{script}");
            },
        )
        .event("Warning", reasons::EXEC_EXHAUSTED, &summary_line);
    let started = tokio::time::Instant::now();
    let (summary, calls) = rig.play(conversation, Trigger::Event).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Exhausted));
    assert_eq!(summary.attempts, 3);
    assert_eq!(summary.readiness, None, "no IP wait after a failed fixup");
    assert_eq!(summary.errors, [line(1), line(2), line(3)]);
    let offsets: Vec<u64> = calls.iter().map(|c| (c.at - started).as_secs()).collect();
    assert_eq!(offsets, [0, 3, 6]);
}

/// An all-DHCP Linux fork or hibernate wake that never gets a lease: the
/// safety net runs once, then the pod fails in the words of its boot (spec
/// section 6): `clone <vm>: ...` and `PostCloneIPWaitTimeout`, or `wake
/// <vm>: ...` and `WakeIPWaitTimeout`.
#[rstest::rstest]
#[case::fork(("vm.cocoonstack.io/fork-from", "web-src"), "clone", reasons::IP_WAIT_TIMEOUT)]
#[case::wake(
    ("vm.cocoonstack.io/restore-from-hibernate", "true"),
    "wake",
    reasons::WAKE_IP_WAIT_TIMEOUT
)]
#[tokio::test]
async fn no_lease_in_time_runs_dhcp_recovery_then_fails_the_pod(
    #[case] boot: (&str, &str),
    #[case] word: &str,
    #[case] reason: &'static str,
) {
    // Real time: the lease watcher reads a real (here: absent) lease file.
    let config = HostConfig {
        ready: ReadyConfig {
            budget: Duration::from_secs(2),
            dhcp_recovery_after: Duration::from_secs(1),
            ..ReadyConfig::default()
        },
        ..HostConfig::default()
    };
    let rig = rig(vec![Reply::Done], &DHCP, config);
    let cloned = pod(&[boot]);
    let message = format!("{word} {}: dhcp lease not observed within 2s", vm_name());
    let message = message.as_str();
    // An all-DHCP Linux VM needs no fixup (rule 7), so no post-clone
    // marker is written; after 1 s without a lease the safety net runs
    // once, then the wait goes on to the 2 s budget.
    let conversation = Conversation::new("all-DHCP VM, no lease ever", &cloned)
        .get()
        // Still this pod's, with work, before anything runs in the guest.
        .get()
        .event(
            "Normal",
            reasons::DHCP_RECOVERY,
            "no lease after 1s: re-running DHCP on 1 NIC(s)",
        )
        // The lifecycle as it is before the failed write.
        .get()
        .patch(json!({
            keys::LIFECYCLE_STATE: "failed",
            keys::LIFECYCLE_MESSAGE: message,
            keys::LIFECYCLE_OBSERVED_GENERATION: "3",
        }))
        .event("Warning", reason, message);
    let started = std::time::Instant::now();
    let (summary, calls) = rig.play(conversation, Trigger::Event).await;
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "the whole budget"
    );
    assert_eq!(summary.action, Handled::IpWait);
    assert_eq!(summary.rule, 7);
    assert_eq!(summary.fixup, None);
    assert_eq!(summary.readiness, Some(Readiness::TimedOut));
    assert_eq!(summary.ip, None);
    assert_eq!(calls.len(), 1, "exactly one recovery pass");
    let script = calls[0].argv.join(" ");
    assert!(
        script.contains("DHCP=ipv4") && script.contains("MACAddress=52:54:00:aa:bb:02"),
        "{script}"
    );
}

/// Another writer failed the pod while the attempt ran: the stack owns it
/// now (spec section 8). The write of `done` and `ready`, decided from the
/// read before the attempt, is refused as stale; decided again from the
/// pod as it is now, it is `done` alone: no IP, no lifecycle.
#[tokio::test(start_paused = true)]
async fn a_pod_failed_elsewhere_gets_no_ready_write() {
    let rig = rig(vec![Reply::Done], &STATIC, HostConfig::default());
    let conversation = Conversation::new("another writer failed the pod meanwhile", &pod(&[]))
        .get()
        // Its answer is the read before attempt 1.
        .patch(json!({ keys::POST_CLONE_STATE: "running" }))
        .meanwhile(&[
            (keys::LIFECYCLE_STATE, "failed"),
            (keys::LIFECYCLE_MESSAGE, "marked failed elsewhere"),
            (keys::LIFECYCLE_OBSERVED_GENERATION, "3"),
        ])
        .patch_stale(done_and_ready_patch())
        .patch(json!({ keys::POST_CLONE_STATE: "done" }))
        .event(
            "Normal",
            reasons::SUCCEEDED,
            "kind=linux_static attempts=1 scenario=oci-networkd",
        );
    let (summary, calls) = rig.play(conversation, Trigger::Event).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Done));
    assert_eq!(summary.readiness, Some(Readiness::Gone));
    assert_eq!(summary.ip, None);
    assert!(!summary.is_ready());
    assert_eq!(calls.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn startup_resumes_a_running_fixup() {
    let rig = rig(vec![Reply::Done], &STATIC, HostConfig::default());
    let running = pod(&[(keys::POST_CLONE_STATE, "running")]);
    let conversation = Conversation::new("restart with post-clone-state=running", &running)
        .get()
        .event("Normal", reasons::RESUMED_AFTER_RESTART, "op=post_clone")
        // Its answer is the read before attempt 1.
        .patch(json!({ keys::POST_CLONE_STATE: "running" }))
        .patch(done_and_ready_patch())
        .event(
            "Normal",
            reasons::SUCCEEDED,
            "kind=linux_static attempts=1 scenario=oci-networkd",
        );
    let (summary, calls) = rig.play(conversation, Trigger::Startup).await;
    assert_eq!(summary.action, Handled::Fixup);
    assert_eq!(summary.fixup, Some(FixupEnd::Done));
    assert_eq!(summary.readiness, Some(Readiness::Ready));
    assert_eq!(calls.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn startup_resumes_a_done_fixup_with_the_ip_wait_only() {
    let rig = rig(vec![Reply::Done], &STATIC, HostConfig::default());
    let done = pod(&[(keys::POST_CLONE_STATE, "done")]);
    let conversation = Conversation::new("restart with post-clone-state=done", &done)
        .get()
        .event("Normal", reasons::RESUMED_AFTER_RESTART, "op=ready_wait")
        .get()
        .patch(ready_patch());
    let (summary, calls) = rig.play(conversation, Trigger::Startup).await;
    assert_eq!(summary.action, Handled::IpWait);
    assert_eq!(summary.fixup, None);
    assert_eq!(summary.readiness, Some(Readiness::Ready));
    assert!(calls.is_empty(), "the fixup is not run again");
}

#[tokio::test(start_paused = true)]
async fn startup_leaves_a_failed_fixup_parked() {
    let rig = rig(vec![Reply::Done], &STATIC, HostConfig::default());
    let failed = pod(&[(keys::POST_CLONE_STATE, "failed")]);
    let conversation = Conversation::new("restart with post-clone-state=failed", &failed).get();
    let (summary, calls) = rig.play(conversation, Trigger::Startup).await;
    assert_eq!(summary.action, Handled::Parked);
    assert_eq!(summary.fixup, None);
    assert_eq!(summary.readiness, None);
    assert!(calls.is_empty(), "nothing runs in the guest");
}

#[tokio::test(start_paused = true)]
async fn a_conflict_from_a_new_incarnation_stops_before_any_exec() {
    let rig = rig(vec![Reply::Done], &STATIC, HostConfig::default());
    let conflict = status(
        409,
        "Conflict",
        &format!("Precondition failed: UID in precondition: {UID}, UID in object meta: uid-2"),
    );
    let conversation = Conversation::new("409 on running, the pod was recreated", &pod(&[]))
        .get()
        .patch(json!({ keys::POST_CLONE_STATE: "running" }))
        .refused(409, conflict)
        // The follow-up read that tells a race from a new incarnation.
        .recreated("uid-2")
        .get();
    let (summary, calls) = rig.play(conversation, Trigger::Event).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Gone));
    assert_eq!(summary.attempts, 0);
    assert_eq!(summary.readiness, None);
    assert!(calls.is_empty(), "no exec for a pod that is gone");
}

#[tokio::test(start_paused = true)]
async fn a_pod_deleted_between_attempts_stops_the_loop() {
    let rig = rig(
        vec![Reply::Exit(1, STEP4_FAILED)],
        &STATIC,
        HostConfig::default(),
    );
    let conversation = Conversation::new("pod deleted after attempt 1", &pod(&[]))
        .get()
        // Its answer is the read before attempt 1.
        .patch(json!({ keys::POST_CLONE_STATE: "running" }))
        .event_with("Warning", reasons::EXEC_ATTEMPT_FAILED, |note| {
            assert!(note.starts_with("attempt 1: step 4/5"), "{note}");
        })
        // The read before attempt 2 (after the retry interval) finds the
        // pod deleted.
        .get_not_found();
    let (summary, calls) = rig.play(conversation, Trigger::Event).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Gone));
    assert_eq!(summary.attempts, 1);
    assert_eq!(calls.len(), 1, "no attempt after the pod was deleted");
}

#[tokio::test(start_paused = true)]
async fn a_lost_event_does_not_stop_the_fixup() {
    let rig = rig(vec![Reply::Done], &STATIC, HostConfig::default());
    let conversation = Conversation::new("the success event is refused", &pod(&[]))
        .get()
        // Its answer is the read before attempt 1.
        .patch(json!({ keys::POST_CLONE_STATE: "running" }))
        .patch(done_and_ready_patch())
        .event(
            "Normal",
            reasons::SUCCEEDED,
            "kind=linux_static attempts=1 scenario=oci-networkd",
        )
        // Events are best effort: not retried, and nothing is undone.
        .refused(
            500,
            status(500, "InternalError", "etcdserver: request timed out"),
        );
    let (summary, _) = rig.play(conversation, Trigger::Event).await;
    assert_eq!(summary.readiness, Some(Readiness::Ready));
}

/// When the read before the ready write fails (after the client's
/// retries), the host cannot tell whether the pod is still its own: it
/// writes nothing (no IP next to a lifecycle left `creating`) and
/// returns an error the daemon retries.
#[tokio::test(start_paused = true)]
async fn a_failed_read_before_the_ready_write_writes_nothing_and_is_retried() {
    let rig = rig(vec![Reply::Done], &STATIC, HostConfig::default());
    let unavailable = || status(500, "InternalError", "etcdserver: request timed out");
    let done = pod(&[(keys::POST_CLONE_STATE, "done")]);
    let conversation = Conversation::new("the read before the ready write fails", &done)
        .get()
        .event("Normal", reasons::RESUMED_AFTER_RESTART, "op=ready_wait")
        // Both tries of the fast retry policy fail; nothing follows.
        .get()
        .refused(500, unavailable())
        .get()
        .refused(500, unavailable());
    let (result, calls) = rig.try_play(conversation, Trigger::Startup).await;
    let error = result.expect_err("no summary without the final read");
    assert!(error.is_retryable(), "{error}");
    assert_eq!(error.kind(), "api");
    assert!(calls.is_empty());
}

/// When the write of `done` (with the IP and `ready`) fails after the
/// client's retries, nothing is written and the error is one the daemon
/// retries: `post-clone-state` is still `running`, so the retry runs the
/// fixup again (plans are safe to run twice) rather than guessing.
#[tokio::test(start_paused = true)]
async fn a_failed_done_write_leaves_running_and_is_retried() {
    let rig = rig(vec![Reply::Done], &STATIC, HostConfig::default());
    let unavailable = || status(500, "InternalError", "etcdserver: request timed out");
    let conversation = Conversation::new("the done write fails", &pod(&[]))
        .get()
        .patch(json!({ keys::POST_CLONE_STATE: "running" }))
        .patch(done_and_ready_patch())
        .refused(500, unavailable())
        .patch(done_and_ready_patch())
        .refused(500, unavailable());
    let (result, calls) = rig.try_play(conversation, Trigger::Event).await;
    let error = result.expect_err("no summary without the done write");
    assert!(error.is_retryable(), "{error}");
    assert_eq!(error.kind(), "api");
    assert_eq!(calls.len(), 1);
}

/// The pod changes under every write of `done` and `ready` (another
/// writer touches it each time): after five rounds the host stops
/// deciding, writes `done` alone under the uid precondition (any state of
/// the pod takes it; the exec is never run again for want of a settled
/// read), and the IP wait decides the ready write from its own read.
#[tokio::test(start_paused = true)]
async fn a_pod_that_keeps_changing_gets_done_alone_then_the_ready_write() {
    let rig = rig(vec![Reply::Done], &STATIC, HostConfig::default());
    let mut conversation =
        Conversation::new("another writer touches the pod again and again", &pod(&[]))
            .get()
            .patch(json!({ keys::POST_CLONE_STATE: "running" }));
    for round in 1..=5 {
        let touched = round.to_string();
        conversation = conversation
            .meanwhile(&[("example.com/touched", touched.as_str())])
            .patch_stale(done_and_ready_patch());
    }
    let conversation = conversation
        .patch_unguarded(json!({ keys::POST_CLONE_STATE: "done" }))
        .event(
            "Normal",
            reasons::SUCCEEDED,
            "kind=linux_static attempts=1 scenario=oci-networkd",
        )
        // The IP wait's own read, then the ready write decided from it.
        .get()
        .patch(ready_patch());
    let (summary, calls) = rig.play(conversation, Trigger::Event).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Done));
    assert_eq!(summary.readiness, Some(Readiness::Ready));
    assert_eq!(summary.ip.as_deref(), Some("10.0.0.5"));
    assert_eq!(calls.len(), 1, "the exec ran once");
}

/// The pod was hibernated while cocoon was asked about its VM: the
/// `running` write, decided from the read before, is refused as stale,
/// and decided again from the pod as it is now it is no write at all.
/// Nothing runs in the guest.
#[tokio::test(start_paused = true)]
async fn a_pod_hibernated_before_the_running_write_gets_nothing() {
    let rig = rig(vec![Reply::Done], &STATIC, HostConfig::default());
    let conversation = Conversation::new("hibernation requested during the inspect", &pod(&[]))
        .get()
        .meanwhile(&[("vm.cocoonstack.io/hibernate", "true")])
        .patch_stale(json!({ keys::POST_CLONE_STATE: "running" }));
    let (summary, calls) = rig.play(conversation, Trigger::Event).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Gone));
    assert_eq!(summary.attempts, 0);
    assert!(
        calls.is_empty(),
        "nothing runs in a pod the stack took over"
    );
}

/// The answer to the `running` write carries no usable pod (the metadata
/// of another incarnation, which the host must not trust, or no pod at
/// all): the host falls back to the GET before attempt 1, as before it read
/// the answer, and the flow goes on to the write of `done` and `ready`.
#[rstest::rstest]
#[case::another_incarnation(json!({
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": NAME,
        "namespace": NAMESPACE,
        "uid": "uid-2",
        "annotations": { keys::POST_CLONE_STATE: "running" },
    },
}))]
#[case::no_pod(json!({}))]
#[tokio::test(start_paused = true)]
async fn a_running_answer_without_the_pod_falls_back_to_a_read_before_attempt_1(
    #[case] stranger: Value,
) {
    let rig = rig(vec![Reply::Done], &STATIC, HostConfig::default());
    let conversation = Conversation::new("the running answer is no read", &pod(&[]))
        .get()
        // Lands, but its answer is not this pod's.
        .patch_answering(json!({ keys::POST_CLONE_STATE: "running" }), stranger)
        // So the host reads the pod: still this incarnation before attempt 1.
        .get()
        .patch(done_and_ready_patch())
        .event(
            "Normal",
            reasons::SUCCEEDED,
            "kind=linux_static attempts=1 scenario=oci-networkd",
        );
    let (summary, calls) = rig.play(conversation, Trigger::Event).await;
    assert_eq!(summary.action, Handled::Fixup);
    assert_eq!(summary.fixup, Some(FixupEnd::Done));
    assert_eq!(summary.attempts, 1);
    assert_eq!(summary.readiness, Some(Readiness::Ready));
    assert_eq!(summary.ip.as_deref(), Some("10.0.0.5"));
    assert_eq!(calls.len(), 1);
}
