//! Faults: the loop records each failure as an attempt error and goes on;
//! the Kubernetes side retries annotation writes without losing the error
//! chain or the hint, and never writes to another pod incarnation.
//!
//! - `cocoon` missing, not executable, hanging past its timeout, killed by
//!   a signal, printing garbage: the real `CocoonCli` runs `fake-cocoon`
//!   (tests/fake-cocoon) for every exec of the real fixup loop
//!   (`Host::handle_pod`, pods in memory, the VM record given), in real
//!   time with a short budget (50 ms between attempts, 3 s budget, 300 ms
//!   per exec). The
//!   first attempt meets the fault; the scenario then switches to success
//!   and the next attempt succeeds. No assertion depends on how long
//!   anything took, only on what was recorded.
//! - The Kubernetes API answering 409, 500, nothing (timeouts), or 404
//!   after the pod was deleted between a read and a patch: `Host::handle`
//!   over the real `kube` client against the tower-test mock API server
//!   (`support/mock_api.rs`), under paused time. `kube.rs` covers each
//!   answer for one request; here the same answers land in the middle of
//!   the flow, where the chain and the hint must survive the retries.

use crate::support;

use fixup_core::decision::FixupEnd;
use fixup_core::decision::Readiness;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use fixup_core::decision::RetryConfig;
use fixup_core::decision::{Summary, Trigger};
use fixup_core::exec::ExecOutput;
use fixup_core::facts::{VmId, VmInspect};
use fixup_core::planner::{Planner, PlannerOptions};
use fixup_host::cocoon::{Cocoon, CocoonCli, CocoonError};
use fixup_host::host::{Host, HostConfig};
use fixup_host::kube::REPORTER;
use fixup_host::metrics::Metrics;
use fixup_host::pods::{EventType, MemoryPods, PodRef, keys, reasons};
use fixup_host::ready::LeaseWatcher;
use fixup_host::serve::Dispatcher;
use rstest::rstest;
use serde_json::{Value, json};
use support::fake::fake_cocoon;
use support::mock_api::{Exchange, NODE, Scenario as Conversation, status};
use support::{Reply, ScriptedCocoon, UID, inspect, pod};
use tokio_util::sync::CancellationToken;

// ---- cocoon faults through the real runner ----

/// The VM of the record the host inspects ([`support::inspect`]).
const VM: &str = "vm-0123abcd";

/// The real `cocoon` runner for every exec, the record for the inspect:
/// the fault meets the fixup loop, not the look-up before it.
#[derive(Clone)]
struct ExecThrough {
    cli: CocoonCli,
    record: String,
}

impl Cocoon for ExecThrough {
    async fn exec(
        &self,
        vm: &VmId,
        argv: &[String],
        timeout: Duration,
    ) -> Result<ExecOutput, CocoonError> {
        self.cli.exec(vm, argv, timeout).await
    }

    async fn inspect(&self, _vm: &VmId, _timeout: Duration) -> Result<VmInspect, CocoonError> {
        Ok(VmInspect::from_json(&self.record, "cocoon vm inspect").expect("a record"))
    }
}

/// A planner with the built-ins over an empty cocoon root in `dir`, and a
/// lease watcher of a lease file there.
fn planner_and_leases(dir: &Path) -> (Planner, LeaseWatcher) {
    let root = dir.join("cocoon-root");
    fs::create_dir_all(&root).unwrap();
    let (planner, failures) = Planner::new(PlannerOptions {
        cocoon_root: root,
        ..PlannerOptions::default()
    })
    .unwrap();
    assert!(failures.is_empty());
    let leases = LeaseWatcher::new(dir.join("leases.json"), Duration::from_millis(20)).unwrap();
    (planner, leases)
}

/// The pod through the host, its execs through `rig`'s `cocoon`: a Cloud
/// Hypervisor clone with a static first NIC (the OCI networkd plan; the IP
/// and `ready` go with `done`).
async fn through_the_host(rig: &Rig, pods: &MemoryPods, retry: RetryConfig) -> Summary {
    let dir = tempfile::tempdir().unwrap();
    let (planner, leases) = planner_and_leases(dir.path());
    let cocoon = ExecThrough {
        cli: CocoonCli::new(&rig.program),
        record: inspect(&STATIC),
    };
    let host = Host::new(
        Arc::new(planner),
        cocoon,
        pods.clone(),
        Arc::new(leases),
        HostConfig {
            retry,
            ..HostConfig::default()
        },
        Arc::new(Metrics::new()),
    );
    host.handle(
        "default",
        "web-0",
        Trigger::Event,
        &CancellationToken::new(),
    )
    .await
    .expect("the pod was handled")
}

/// Short, in real time: many attempts fit in the budget, so a slow
/// machine still reaches the attempt that succeeds.
fn retry() -> RetryConfig {
    RetryConfig {
        interval: Duration::from_millis(50),
        budget: Duration::from_secs(3),
        exec_timeout: Duration::from_millis(300),
    }
}

/// How the `cocoon` binary is broken for the first attempt.
#[derive(Debug, Clone, Copy)]
enum Fault {
    Missing,
    NotExecutable,
    Hangs,
    KilledBySignal,
    PrintsGarbage,
}

/// A directory with `cocoon` (a wrapper that runs fake-cocoon with the
/// scenario next to it) and the fake's call log.
struct Rig {
    dir: tempfile::TempDir,
    program: PathBuf,
}

impl Rig {
    fn new(fault: Fault) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("cocoon");
        let first = match fault {
            Fault::Hangs => json!({ "hang": true }),
            Fault::KilledBySignal => json!({ "signal": 9, "stderr": "partial output" }),
            Fault::PrintsGarbage => json!({
                "stdout": "\u{0}\u{1b}[2J{not json",
                "stderr": "\ncocoon-fixup: step 1/99 failed exit 7\n\u{1b}[31mpanic: \u{fffd}\u{0}garbage\nline two\n",
                "exit": 3,
            }),
            // The binary itself is broken: the fake is never reached on
            // the first attempt.
            Fault::Missing | Fault::NotExecutable => json!({ "exit": 0, "done": true }),
        };
        let scenario = json!({
            "log": dir.path().join("calls.jsonl"),
            "state_file": dir.path().join("state"),
            "exec": [first, { "exit": 0, "done": true }],
        });
        fs::write(dir.path().join("scenario.json"), scenario.to_string()).unwrap();
        let rig = Rig { dir, program };
        match fault {
            Fault::Missing => {}
            Fault::NotExecutable => rig.install(0o644),
            _ => rig.install(0o755),
        }
        rig
    }

    /// Write the `cocoon` wrapper with `mode`.
    fn install(&self, mode: u32) {
        let tmp = self.dir.path().join("cocoon.tmp");
        fs::write(
            &tmp,
            format!(
                "#!/bin/sh\nFAKE_COCOON_SCENARIO='{}' exec '{}' \"$@\"\n",
                self.dir.path().join("scenario.json").display(),
                fake_cocoon().display()
            ),
        )
        .unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(mode)).unwrap();
        fs::rename(&tmp, &self.program).unwrap();
    }

    /// Make the binary work (for the faults of the binary itself).
    fn repair(&self) {
        self.install(0o755);
    }

    fn exec_calls(&self) -> usize {
        fs::read_to_string(self.dir.path().join("calls.jsonl"))
            .unwrap_or_default()
            .lines()
            .count()
    }
}

fn pod_ref() -> PodRef {
    PodRef {
        namespace: "default".into(),
        name: "web-0".into(),
        uid: UID.into(),
    }
}

fn attempt_events(pods: &MemoryPods) -> Vec<String> {
    pods.events()
        .into_iter()
        .filter(|(_, e)| e.reason == reasons::EXEC_ATTEMPT_FAILED)
        .map(|(p, e)| {
            assert_eq!(p, pod_ref(), "events are about this pod");
            assert_eq!(e.kind, EventType::Warning);
            e.message
        })
        .collect()
}

/// What the first attempt's error line must say, past `attempt 1: `.
fn expected_first_error(fault: Fault, program: &Path) -> Vec<String> {
    let program = program.display();
    match fault {
        Fault::Missing => vec![format!(
            "cannot run {program}: No such file or directory; install cocoon or pass --cocoon-bin"
        )],
        Fault::NotExecutable => vec![format!(
            "cannot run {program}: Permission denied; install cocoon or pass --cocoon-bin"
        )],
        Fault::Hangs => vec![format!(
            "cocoon vm exec {VM}: timed out after 300ms (killed); raise --exec-timeout or check the guest agent"
        )],
        Fault::KilledBySignal => vec![
            "cocoon vm exec was killed by signal 9:".into(),
            "partial output".into(),
        ],
        // The stray marker is of another plan size: not ours, so it is
        // output, and the exec failed before step 1 of 2 started.
        Fault::PrintsGarbage => vec![
            "exited 3".into(),
            "before the first step started".into(),
            "cocoon-fixup: step 1/99 failed exit 7".into(),
            "garbage | line two".into(),
        ],
    }
}

/// Guest stderr is untrusted text: it ends up in the attempt line, and so
/// in a Warning event, the `post-clone-errors` annotation and the log.
/// Facts errors escape control characters (`FactError` shows values with
/// `{:?}`); attempt errors pass ESC, NUL and lone CR through, so a guest
/// can put terminal escapes into `kubectl describe pod` and the host log.
#[tokio::test]
async fn guest_stderr_cannot_put_control_characters_into_events() {
    let rig = Rig::new(Fault::PrintsGarbage);
    let pods = MemoryPods::new();
    pods.insert(pod(&[]));
    through_the_host(&rig, &pods, retry()).await;
    for line in attempt_events(&pods) {
        assert!(!line.chars().any(char::is_control), "{line:?}");
    }
}

#[rstest]
#[case::missing(Fault::Missing)]
#[case::not_executable(Fault::NotExecutable)]
#[case::hangs_past_its_timeout(Fault::Hangs)]
#[case::killed_by_a_signal(Fault::KilledBySignal)]
#[case::prints_garbage(Fault::PrintsGarbage)]
#[tokio::test]
async fn a_broken_cocoon_is_an_attempt_error_and_the_loop_goes_on(#[case] fault: Fault) {
    let rig = Rig::new(fault);
    let pods = MemoryPods::new();
    pods.insert(pod(&[]));
    // The binary faults are repaired once the loop has told of attempt 1.
    let repair = async {
        if matches!(fault, Fault::Missing | Fault::NotExecutable) {
            while attempt_events(&pods).is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            rig.repair();
        }
    };
    let (summary, ()) = tokio::join!(through_the_host(&rig, &pods, retry()), repair);
    let events = attempt_events(&pods);
    assert_eq!(
        (summary.fixup, summary.readiness),
        (Some(FixupEnd::Done), Some(Readiness::Ready)),
        "expected a later attempt to succeed: {summary:?}; events {events:#?}"
    );
    let attempts = summary.attempts;
    assert_eq!(
        attempts as usize,
        events.len() + 1,
        "every failed attempt told: {events:#?}"
    );
    let first = events.first().expect("attempt 1 failed");
    assert!(first.starts_with("attempt 1: "), "{first}");
    for part in expected_first_error(fault, &rig.program) {
        assert!(first.contains(&part), "{first:?} lacks {part:?}");
    }
    assert!(!first.contains('\n'), "one line: {first:?}");
    for (i, line) in events.iter().enumerate() {
        assert!(line.starts_with(&format!("attempt {}: ", i + 1)), "{line}");
    }
    // The fake saw every attempt that reached it, the last one succeeding.
    let reached = match fault {
        Fault::Missing | Fault::NotExecutable => 1,
        _ => attempts as usize,
    };
    assert!(rig.exec_calls() >= reached, "{} calls", rig.exec_calls());
    let annotations = pods.annotations("default", "web-0").unwrap();
    assert_eq!(annotations[keys::POST_CLONE_STATE], "done");
    assert!(!annotations.contains_key(keys::POST_CLONE_ERRORS));
    let succeeded: Vec<String> = pods
        .events()
        .into_iter()
        .filter(|(_, e)| e.reason == reasons::SUCCEEDED)
        .map(|(_, e)| e.message)
        .collect();
    assert_eq!(
        succeeded,
        [format!(
            "kind=linux_static attempts={attempts} scenario=oci-networkd"
        )]
    );
}

/// A `cocoon` that stays broken exhausts the budget: every attempt is in
/// the chain, in order, and the pod is failed with the hint.
#[tokio::test]
async fn a_cocoon_that_never_answers_exhausts_the_budget_with_every_attempt_chained() {
    let rig = Rig::new(Fault::Hangs);
    fs::write(
        rig.dir.path().join("scenario.json"),
        json!({ "exec": [{ "hang": true }] }).to_string(),
    )
    .unwrap();
    let pods = MemoryPods::new();
    pods.insert(pod(&[]));
    let config = RetryConfig {
        interval: Duration::from_millis(50),
        budget: Duration::from_millis(900),
        exec_timeout: Duration::from_millis(200),
    };
    let summary = through_the_host(&rig, &pods, config).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Exhausted), "{summary:?}");
    let (attempts, errors) = (summary.attempts, summary.errors);
    assert!(attempts >= 2, "{errors:#?}");
    assert_eq!(errors, attempt_events(&pods));
    let annotations = pods.annotations("default", "web-0").unwrap();
    assert_eq!(annotations[keys::POST_CLONE_STATE], "failed");
    assert_eq!(annotations[keys::POST_CLONE_ERRORS], errors.join("\n"));
    // The hint is the plan as a script, base64.
    let hint = base64::engine::general_purpose::STANDARD
        .decode(&annotations[keys::POST_CLONE_HINT])
        .expect("the hint is base64");
    let hint = String::from_utf8(hint).expect("the hint is text");
    assert!(
        hint.starts_with("#!/bin/sh") && hint.contains("systemd-networkd"),
        "{hint}"
    );
    assert_eq!(annotations[keys::LIFECYCLE_STATE], "failed");
}

// ---- Kubernetes faults in the middle of the flow ----

const POD_PATH: &str = "/api/v1/namespaces/default/pods/web-0";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

/// stderr of an attempt whose step 4 (of 5) failed.
const STEP4_FAILED: &str = "\ncocoon-fixup: {nonce} step 1/5 start\n\ncocoon-fixup: {nonce} step 2/5 start\n\ncocoon-fixup: {nonce} step 3/5 start\n\ncocoon-fixup: {nonce} step 4/5 start\nprintf: /etc/systemd/network: Read-only file system\n\ncocoon-fixup: {nonce} step 4/5 failed exit 1\n";

const STATIC: [(&str, Option<&str>); 1] = [("52:54:00:aa:bb:01", Some("10.0.0.5/24"))];

fn line(n: u32) -> String {
    format!(
        "attempt {n}: step 4/5 \"write the static network file for 52:54:00:aa:bb:01\" exited 1: printf: /etc/systemd/network: Read-only file system"
    )
}

fn pod_json(uid: &str, annotations: &serde_json::Map<String, Value>, version: u64) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "namespace": "default",
            "uid": uid,
            "annotations": annotations,
            "resourceVersion": version.to_string(),
        },
        "spec": {"nodeName": NODE, "containers": []},
    })
}

/// The pod as the server holds it, and the conversation so far.
struct Server {
    uid: String,
    annotations: serde_json::Map<String, Value>,
    /// The pod's resource version now, and that of the host's latest read
    /// (its next PATCH carries it).
    version: u64,
    seen: u64,
    exchanges: Vec<Exchange>,
}

impl Server {
    fn new() -> Self {
        let annotations = pod(&[])
            .annotations
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        Server {
            uid: UID.into(),
            annotations,
            version: 11,
            seen: 0,
            exchanges: Vec::new(),
        }
    }

    fn get(mut self) -> Self {
        let answer = pod_json(&self.uid, &self.annotations, self.version);
        self.seen = self.version;
        self.exchanges
            .push(Exchange::get(POD_PATH).respond(200, answer));
        self
    }

    /// The body of a PATCH of `annotations`: our uid and the resource
    /// version of the host's latest read as preconditions.
    fn expected(&self, annotations: &Value) -> Value {
        json!({"metadata": {
            "uid": UID,
            "resourceVersion": self.seen.to_string(),
            "annotations": annotations,
        }})
    }

    /// A PATCH that must carry exactly `annotations` under our uid and the
    /// version read, answered `code` with `answer` (the pod changes only
    /// on 200, and a 200 is answered with the pod as the write left it,
    /// which the host may take as a read).
    fn patch(mut self, annotations: &Value, code: u16, answer: Value) -> Self {
        let expected = self.expected(annotations);
        if code == 200 {
            self.apply(annotations);
            self.seen = self.version;
        }
        let answer = if code == 200 {
            pod_json(&self.uid, &self.annotations, self.version)
        } else {
            answer
        };
        self.exchanges.push(
            Exchange::patch(POD_PATH)
                .body(move |_, body| assert_eq!(body, &expected, "the patch body"))
                .respond(code, answer),
        );
        self
    }

    /// The write of `annotations` lands: a null removes one; the
    /// version moves on.
    fn apply(&mut self, annotations: &Value) {
        for (k, v) in annotations.as_object().unwrap() {
            if v.is_null() {
                self.annotations.remove(k);
            } else {
                self.annotations.insert(k.clone(), v.clone());
            }
        }
        self.version += 1;
    }

    /// A PATCH that lands (the pod changes, its version moves on) but whose
    /// answer is lost: the server fails it with `500` after the commit.
    fn patch_landed_unanswered(mut self, annotations: &Value) -> Self {
        let expected = self.expected(annotations);
        self.apply(annotations);
        self.exchanges.push(
            Exchange::patch(POD_PATH)
                .body(move |_, body| assert_eq!(body, &expected, "the patch body"))
                .respond(500, unavailable()),
        );
        self
    }

    /// A PATCH that gets no answer: the client's request timeout fires.
    fn patch_unanswered(mut self, annotations: &Value) -> Self {
        let expected = self.expected(annotations);
        self.exchanges.push(
            Exchange::patch(POD_PATH)
                .body(move |_, body| assert_eq!(body, &expected, "the patch body"))
                .hang(),
        );
        self
    }

    fn event(mut self, reason: &'static str, note: String, code: u16) -> Self {
        self.exchanges.push(
            Exchange::post(EVENTS_PATH)
                .body(move |_, body| {
                    assert_eq!(body["reason"], reason);
                    assert_eq!(body["note"], note.as_str());
                    assert_eq!(
                        body["regarding"]["uid"], UID,
                        "events regard this incarnation"
                    );
                    assert_eq!(body["reportingController"], REPORTER);
                })
                .respond(
                    code,
                    if code < 300 {
                        json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                            "metadata": {"name": "web-0.1", "namespace": "default"}})
                    } else {
                        status(code, "InternalError", "etcdserver: leader changed")
                    },
                ),
        );
        self
    }

    /// The pod is deleted and recreated under its name.
    fn recreated(mut self, uid: &str) -> Self {
        uid.clone_into(&mut self.uid);
        self.version += 1;
        self
    }
}

fn conflict() -> Value {
    status(
        409,
        "Conflict",
        "Operation cannot be fulfilled on pods \"web-0\": the object has been modified",
    )
}

fn unavailable() -> Value {
    status(500, "InternalError", "etcdserver: request timed out")
}

fn gone() -> Value {
    status(404, "NotFound", "pods \"web-0\" not found")
}

/// Three attempts at 0, 3 and 6 s fit in 7 s.
fn exhausting() -> HostConfig {
    HostConfig {
        retry: RetryConfig {
            interval: Duration::from_secs(3),
            budget: Duration::from_secs(7),
            ..RetryConfig::default()
        },
        ..HostConfig::default()
    }
}

async fn play(
    server: Server,
    replies: Vec<Reply>,
    config: HostConfig,
) -> (Summary, ScriptedCocoon) {
    let dir = tempfile::tempdir().unwrap();
    let (planner, leases) = planner_and_leases(dir.path());
    let cocoon = ScriptedCocoon::new(replies, inspect(&STATIC));
    let summary = Conversation::new("kubernetes faults", server.exchanges)
        .run(|api| {
            let cocoon = cocoon.clone();
            async move {
                let host = Host::new(
                    Arc::new(planner),
                    cocoon,
                    api,
                    Arc::new(leases),
                    config,
                    Arc::new(Metrics::new()),
                );
                host.handle(
                    "default",
                    "web-0",
                    Trigger::Event,
                    &CancellationToken::new(),
                )
                .await
            }
        })
        .await
        .expect("the pod was handled");
    (summary, cocoon)
}

/// After a successful attempt with a static first NIC: `done`, the IP and
/// `ready` in one write.
fn done_and_ready() -> Value {
    json!({
        keys::POST_CLONE_STATE: "done",
        keys::IP: "10.0.0.5",
        keys::LIFECYCLE_STATE: "ready",
        keys::LIFECYCLE_MESSAGE: null,
        keys::LIFECYCLE_OBSERVED_GENERATION: "3",
    })
}

/// The exhaustion write as the host must send it, every time it is sent.
fn failed_patch(hint: &str) -> Value {
    let errors = [line(1), line(2), line(3)].join("\n");
    let message = errors.clone();
    json!({
        keys::POST_CLONE_STATE: "failed",
        keys::POST_CLONE_HINT: hint,
        keys::POST_CLONE_ERRORS: errors,
        keys::LIFECYCLE_STATE: "failed",
        keys::LIFECYCLE_MESSAGE: message,
        keys::LIFECYCLE_OBSERVED_GENERATION: "3",
    })
}

/// The hint the planner makes for the test pod (the exhaustion patch must
/// carry it byte for byte).
fn expected_hint() -> String {
    let dir = tempfile::tempdir().unwrap();
    let (planner, _) = Planner::new(PlannerOptions {
        cocoon_root: dir.path().to_owned(),
        ..PlannerOptions::default()
    })
    .unwrap();
    let pod = pod(&[]);
    let vm = fixup_core::facts::VmInspect::from_json(&inspect(&STATIC), "inspect").unwrap();
    let obs = fixup_core::facts::Observation::new(&pod, &vm, &Default::default());
    let hint = planner.plan(&obs).unwrap().composed.unwrap().hint;
    let script = base64::engine::general_purpose::STANDARD
        .decode(&hint)
        .unwrap();
    assert!(
        String::from_utf8(script)
            .unwrap()
            .contains("MACAddress=52:54:00:aa:bb:01")
    );
    hint
}

/// How the exhaustion write is answered before it gets through.
#[derive(Debug, Clone, Copy)]
enum Trouble {
    ServerErrorsTwice,
    ConflictWithOurUid,
    NoAnswer,
    EventsLostToo,
    /// The write lands but its answer is lost; tried again, it is refused
    /// (the version moved on), and the pod read then holds the record.
    LandedAnswerLost,
}

#[rstest]
#[case::server_errors_twice(Trouble::ServerErrorsTwice)]
#[case::conflict_with_our_uid(Trouble::ConflictWithOurUid)]
#[case::no_answer(Trouble::NoAnswer)]
#[case::events_lost_too(Trouble::EventsLostToo)]
#[case::landed_answer_lost(Trouble::LandedAnswerLost)]
#[tokio::test(start_paused = true)]
async fn the_exhaustion_write_survives_api_trouble_with_chain_and_hint_intact(
    #[case] trouble: Trouble,
) {
    let hint = expected_hint();
    let running = json!({ keys::POST_CLONE_STATE: "running" });
    let failed = failed_patch(&hint);
    let event_code = if matches!(trouble, Trouble::EventsLostToo) {
        500
    } else {
        201
    };
    // The answer to `running` is the read before attempt 1; attempts 2 and
    // 3 read the pod first.
    let mut server = Server::new().get().patch(&running, 200, Value::Null);
    for n in 1..=3 {
        if n > 1 {
            server = server.get();
        }
        server = server.event(reasons::EXEC_ATTEMPT_FAILED, line(n), event_code);
    }
    server = server.get();
    server = match trouble {
        Trouble::ServerErrorsTwice => {
            server
                .patch(&failed, 500, unavailable())
                .patch(&failed, 500, unavailable())
        }
        // The host reads the pod back: still our uid, so it is a race and
        // the write is retried.
        Trouble::ConflictWithOurUid => server.patch(&failed, 409, conflict()).get(),
        Trouble::NoAnswer => server.patch_unanswered(&failed),
        Trouble::EventsLostToo => server,
        Trouble::LandedAnswerLost => server
            .patch_landed_unanswered(&failed)
            .patch(&failed, 409, conflict())
            .get(),
    };
    let summary_line = format!("create: {}", [line(1), line(2), line(3)].join("\n"));
    // The write that lands, unless it already did.
    if !matches!(trouble, Trouble::LandedAnswerLost) {
        server = server.patch(&failed, 200, Value::Null);
    }
    let server = server.event(reasons::EXEC_EXHAUSTED, summary_line, event_code);
    let (summary, cocoon) = play(server, vec![Reply::Exit(1, STEP4_FAILED)], exhausting()).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Exhausted));
    assert_eq!(summary.errors, [line(1), line(2), line(3)]);
    assert_eq!(cocoon.calls().len(), 3);
}

/// A 409 on the `running` write while the pod still has our uid is a
/// race: the write is retried and the fixup runs.
#[tokio::test(start_paused = true)]
async fn a_conflict_on_the_running_write_is_retried_and_the_fixup_runs() {
    let running = json!({ keys::POST_CLONE_STATE: "running" });
    let server = Server::new()
        .get()
        .patch(&running, 409, conflict())
        // The live uid is ours and the pod is at the version read: a race,
        // so the write is retried.
        .get()
        .patch(&running, 500, unavailable())
        // The answer to the write that lands is the read before attempt 1.
        .patch(&running, 200, Value::Null)
        .patch(&done_and_ready(), 200, Value::Null)
        .event(
            reasons::SUCCEEDED,
            "kind=linux_static attempts=1 scenario=oci-networkd".into(),
            201,
        );
    let (summary, cocoon) = play(server, vec![Reply::Done], HostConfig::default()).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Done));
    assert_eq!(summary.readiness, Some(Readiness::Ready));
    assert_eq!(cocoon.calls().len(), 1);
}

/// The pod is deleted between the read before an attempt (for attempt 1:
/// the answer to the `running` write) and the write after it: the write
/// of `done` and `ready` gets 404, or 409 (the pod changed) and then the
/// read that follows finds no pod. The host stops; nothing more is sent
/// (the mock fails on any request it does not list).
#[rstest]
#[case::not_found(false)]
#[case::changed_then_not_found(true)]
#[tokio::test(start_paused = true)]
async fn a_pod_deleted_between_read_and_patch_stops_everything(#[case] changed_first: bool) {
    let running = json!({ keys::POST_CLONE_STATE: "running" });
    // Its answer is the read before attempt 1.
    let mut server = Server::new().get().patch(&running, 200, Value::Null);
    if changed_first {
        server = server.patch(&done_and_ready(), 409, conflict());
        server
            .exchanges
            .push(Exchange::get(POD_PATH).respond(404, gone()));
    } else {
        server = server.patch(&done_and_ready(), 404, gone());
    }
    let (summary, cocoon) = play(server, vec![Reply::Done], HostConfig::default()).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Gone));
    assert_eq!(summary.readiness, None);
    assert_eq!(cocoon.calls().len(), 1);
}

/// The pod is recreated (another uid) between the read before the
/// exhaustion write and the write: the 409 is checked against the live
/// uid, which is not ours, so nothing is written to the new pod.
#[tokio::test(start_paused = true)]
async fn a_pod_recreated_before_the_exhaustion_write_gets_nothing() {
    let hint = expected_hint();
    let running = json!({ keys::POST_CLONE_STATE: "running" });
    // The answer to `running` is the read before attempt 1; attempts 2 and
    // 3 read the pod first.
    let mut server = Server::new().get().patch(&running, 200, Value::Null);
    for n in 1..=3 {
        if n > 1 {
            server = server.get();
        }
        server = server.event(reasons::EXEC_ATTEMPT_FAILED, line(n), 201);
    }
    let server = server
        .get()
        .patch(&failed_patch(&hint), 409, conflict())
        .recreated("uid-2")
        .get();
    let (summary, cocoon) = play(server, vec![Reply::Exit(1, STEP4_FAILED)], exhausting()).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Gone));
    assert_eq!(cocoon.calls().len(), 3);
}

// ---- the watch redelivering an old state ----

/// The daemon's watch hands the dispatcher pod objects as they were when
/// the event was sent. An event still in flight when the work finished
/// (the MODIFIED event of the host's own `running` write, say) reaches
/// the dispatcher after the pod left the in-flight set; the dispatcher
/// judges the stale object (`has_work`: `post-clone-state=running`) and
/// `Host::handle_pod` decides from it, so the finished fixup runs again:
/// a second exec in the guest, `post-clone-state` written back to
/// `running` over `done`, and the ready write repeated. Seen for real
/// against `cocoon-fixup serve` with a fake API server that streams its
/// changes; here it is made deterministic with the dispatcher in process.
#[tokio::test(start_paused = true)]
async fn a_stale_watch_event_does_not_rerun_finished_work() {
    let dir = tempfile::tempdir().unwrap();
    let (planner, _) = Planner::new(PlannerOptions {
        cocoon_root: dir.path().to_owned(),
        ..PlannerOptions::default()
    })
    .unwrap();
    let leases =
        LeaseWatcher::new(dir.path().join("leases.json"), Duration::from_millis(50)).unwrap();
    let cocoon = ScriptedCocoon::new(vec![Reply::Done], inspect(&STATIC));
    let pods = MemoryPods::new();
    pods.insert(pod(&[]));
    let host = Arc::new(Host::new(
        Arc::new(planner),
        cocoon.clone(),
        pods.clone(),
        Arc::new(leases),
        HostConfig::default(),
        Arc::new(Metrics::new()),
    ));
    // The work runs to the end.
    let mut dispatcher = Dispatcher::new(host.clone(), 4, CancellationToken::new());
    dispatcher.offer(pod(&[]), Trigger::Event);
    dispatcher.drain(Duration::from_secs(600)).await;
    let after = pods.annotations("default", "web-0").unwrap();
    assert_eq!(after[keys::POST_CLONE_STATE], "done");
    assert_eq!(after[keys::LIFECYCLE_STATE], "ready");
    let writes = pods.patches().len();
    // Then the watch delivers the pod as the `running` write left it.
    let stale = pod(&[(keys::POST_CLONE_STATE, "running")]);
    let mut dispatcher = Dispatcher::new(host, 4, CancellationToken::new());
    dispatcher.offer(stale, Trigger::Event);
    dispatcher.drain(Duration::from_secs(600)).await;
    assert_eq!(cocoon.calls().len(), 1, "the fixup ran again in the guest");
    assert_eq!(
        pods.patches().len(),
        writes,
        "a finished pod was written again: {:#?}",
        &pods.patches()[writes..]
    );
}
