//! The apply path through `Host` with pods in memory and a scripted,
//! in-process cocoon: the retry budget runs under paused tokio time, so
//! 180 s of retries take milliseconds. Timings asserted here are virtual
//! (the configured interval and budget), never machine speed.

use crate::support;

use fixup_core::decision::FixupEnd;
use fixup_core::decision::Handled;
use fixup_core::decision::Readiness;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use fixup_core::decision::{ReadyConfig, RetryConfig};
use fixup_core::decision::{Summary, Trigger};
use fixup_core::planner::{Planner, PlannerOptions};
use fixup_host::host::{Host, HostConfig};
use fixup_host::metrics::Metrics;
use fixup_host::pods::{EventType, MemoryPods, keys, reasons};
use fixup_host::ready::LeaseWatcher;
use support::{Reply, ScriptedCocoon, UID, inspect, pod, vm_name};
use tokio_util::sync::CancellationToken;

const STATIC: [(&str, Option<&str>); 1] = [("52:54:00:aa:bb:01", Some("10.0.0.5/24"))];

struct Rig {
    host: Arc<Host<ScriptedCocoon, MemoryPods>>,
    cocoon: ScriptedCocoon,
    pods: MemoryPods,
    _dir: tempfile::TempDir,
    lease_file: std::path::PathBuf,
}

fn rig(
    replies: Vec<Reply>,
    nics: &[(&str, Option<&str>)],
    extra: &[(&str, &str)],
    config: HostConfig,
) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cocoon-root");
    std::fs::create_dir_all(&root).unwrap();
    let options = PlannerOptions {
        cocoon_root: root,
        ..PlannerOptions::default()
    };
    let (planner, failures) = Planner::new(options).unwrap();
    assert!(failures.is_empty());
    let cocoon = ScriptedCocoon::new(replies, inspect(nics));
    let pods = MemoryPods::new();
    pods.insert(pod(extra));
    let lease_file = dir.path().join("leases.json");
    let leases = LeaseWatcher::new(lease_file.clone(), Duration::from_millis(20)).unwrap();
    let host = Host::new(
        Arc::new(planner),
        cocoon.clone(),
        pods.clone(),
        Arc::new(leases),
        config,
        Arc::new(Metrics::new()),
    );
    Rig {
        host: Arc::new(host),
        cocoon,
        pods,
        _dir: dir,
        lease_file,
    }
}

impl Rig {
    async fn handle(&self, trigger: Trigger, shutdown: &CancellationToken) -> Summary {
        self.host
            .handle("default", "web-0", trigger, shutdown)
            .await
            .unwrap()
    }

    fn annotation(&self, key: &str) -> Option<String> {
        self.pods
            .annotations("default", "web-0")
            .unwrap()
            .get(key)
            .cloned()
    }

    fn events(&self, reason: &str) -> Vec<String> {
        self.pods
            .events()
            .into_iter()
            .filter(|(_, e)| e.reason == reason)
            .map(|(_, e)| e.message)
            .collect()
    }
}

/// stderr of an attempt whose step 4 (of 5) failed.
const STEP4_FAILED: &str = "\ncocoon-fixup: {nonce} step 1/5 start\n\ncocoon-fixup: {nonce} step 2/5 start\n\ncocoon-fixup: {nonce} step 3/5 start\n\ncocoon-fixup: {nonce} step 4/5 start\nprintf: /etc/systemd/network: Read-only file system\n\ncocoon-fixup: {nonce} step 4/5 failed exit 1\n";

#[tokio::test(start_paused = true)]
async fn first_attempt_succeeds_then_ready() {
    let rig = rig(vec![Reply::Done], &STATIC, &[], HostConfig::default());
    let summary = rig.handle(Trigger::Event, &CancellationToken::new()).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Done));
    assert_eq!(summary.attempts, 1);
    assert_eq!(summary.readiness, Some(Readiness::Ready));
    assert_eq!(summary.ip.as_deref(), Some("10.0.0.5"));
    assert_eq!(
        rig.annotation(keys::POST_CLONE_STATE).as_deref(),
        Some("done")
    );
    assert_eq!(rig.annotation(keys::IP).as_deref(), Some("10.0.0.5"));
    assert_eq!(
        rig.annotation(keys::LIFECYCLE_STATE).as_deref(),
        Some("ready")
    );
    assert_eq!(
        rig.annotation(keys::LIFECYCLE_OBSERVED_GENERATION)
            .as_deref(),
        Some("3")
    );
    assert_eq!(
        rig.events(reasons::SUCCEEDED),
        ["kind=linux_static attempts=1 scenario=oci-networkd"]
    );
    // `running` is written before the first attempt.
    let patches = rig.pods.patches();
    assert_eq!(
        patches[0].1[keys::POST_CLONE_STATE].as_deref(),
        Some("running")
    );
    assert!(patches.iter().all(|(p, _)| p.uid == UID));
    let calls = rig.cocoon.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].vm, "vm-0123abcd");
    assert_eq!(calls[0].argv[..2], ["sh", "-c"]);
}

#[tokio::test(start_paused = true)]
async fn failed_attempts_are_chained_and_retried_every_interval() {
    let replies = vec![
        Reply::Exit(1, STEP4_FAILED),
        Reply::Signal(9),
        Reply::Spawn,
        Reply::Done,
    ];
    let rig = rig(replies, &STATIC, &[], HostConfig::default());
    let summary = rig.handle(Trigger::Event, &CancellationToken::new()).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Done));
    assert_eq!(summary.attempts, 4);
    let failed = rig.events(reasons::EXEC_ATTEMPT_FAILED);
    assert_eq!(failed.len(), 3);
    assert!(
        failed[0].starts_with("attempt 1: step 4/5"),
        "{}",
        failed[0]
    );
    assert!(
        failed[0].contains("Read-only file system"),
        "stderr tail kept: {}",
        failed[0]
    );
    assert!(
        failed[1].starts_with("attempt 2: ") && failed[1].contains("signal 9"),
        "{}",
        failed[1]
    );
    assert!(
        failed[2].starts_with("attempt 3: ") && failed[2].contains("--cocoon-bin"),
        "{}",
        failed[2]
    );
    let calls = rig.cocoon.calls();
    for pair in calls.windows(2) {
        assert_eq!(
            pair[1].at - pair[0].at,
            Duration::from_secs(3),
            "3 s between attempts"
        );
    }
    assert_eq!(
        rig.events(reasons::SUCCEEDED),
        ["kind=linux_static attempts=4 scenario=oci-networkd"]
    );
}

#[tokio::test(start_paused = true)]
async fn budget_exhaustion_marks_failed_with_hint_and_errors() {
    let rig = rig(
        vec![Reply::Exit(1, STEP4_FAILED)],
        &STATIC,
        &[],
        HostConfig::default(),
    );
    let started = tokio::time::Instant::now();
    let summary = rig.handle(Trigger::Event, &CancellationToken::new()).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Exhausted));
    // Attempts at 0, 3, ..., 177 s: the next would start at 180 s.
    assert_eq!(summary.attempts, 60);
    let calls = rig.cocoon.calls();
    assert_eq!(calls.last().unwrap().at - started, Duration::from_secs(177));
    assert_eq!(
        rig.annotation(keys::POST_CLONE_STATE).as_deref(),
        Some("failed")
    );
    let hint = rig.annotation(keys::POST_CLONE_HINT).expect("hint written");
    let script = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(hint)
            .unwrap(),
    )
    .unwrap();
    assert!(script.starts_with("#!/bin/sh"), "{script}");
    assert!(script.contains("MACAddress=52:54:00:aa:bb:01"));
    let errors = rig
        .annotation(keys::POST_CLONE_ERRORS)
        .expect("errors written");
    assert!(errors.len() <= 4096, "{} bytes", errors.len());
    assert!(
        errors.starts_with("[truncated: first "),
        "the cut is announced"
    );
    assert!(
        errors.ends_with("Read-only file system"),
        "newest attempt kept: {errors}"
    );
    assert!(errors.contains("\nattempt 60: step 4/5"));
    assert_eq!(
        rig.annotation(keys::LIFECYCLE_STATE).as_deref(),
        Some("failed")
    );
    // The lifecycle message is the chain, as upstream writes it; the
    // event is `create: <chain>`, both cut to keep the newest attempts.
    let message = rig.annotation(keys::LIFECYCLE_MESSAGE).unwrap();
    assert_eq!(
        Some(&message),
        rig.annotation(keys::POST_CLONE_ERRORS).as_ref()
    );
    assert_eq!(rig.events(reasons::EXEC_ATTEMPT_FAILED).len(), 60);
    let exhausted = rig.events(reasons::EXEC_EXHAUSTED);
    assert_eq!(exhausted.len(), 1);
    assert!(exhausted[0].len() <= 512);
    assert!(
        exhausted[0].starts_with("create: [truncated: first ")
            && exhausted[0].ends_with("Read-only file system"),
        "{}",
        exhausted[0]
    );
    assert_eq!(
        rig.annotation(keys::IP),
        None,
        "no IP wait after a failed fixup"
    );
    let warnings = rig
        .pods
        .events()
        .iter()
        .filter(|(_, e)| e.kind == EventType::Warning)
        .count();
    assert_eq!(warnings, 61);
}

#[tokio::test(start_paused = true)]
async fn shutdown_during_the_sleep_is_not_exhaustion() {
    let rig = rig(
        vec![Reply::Exit(1, STEP4_FAILED)],
        &STATIC,
        &[],
        HostConfig::default(),
    );
    let shutdown = CancellationToken::new();
    let cancel = shutdown.clone();
    tokio::spawn(async move {
        // After attempt 2 (at 3 s), inside the sleep before attempt 3.
        tokio::time::sleep(Duration::from_secs(4)).await;
        cancel.cancel();
    });
    let summary = rig.handle(Trigger::Event, &shutdown).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Shutdown));
    assert_eq!(summary.attempts, 2);
    assert_eq!(
        rig.annotation(keys::POST_CLONE_STATE).as_deref(),
        Some("running")
    );
    assert_eq!(rig.annotation(keys::POST_CLONE_HINT), None);
    assert_eq!(rig.annotation(keys::LIFECYCLE_STATE), None);
    assert!(rig.events(reasons::EXEC_EXHAUSTED).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_deleted_or_recreated_pod_stops_the_loop_and_is_never_written() {
    let rig = rig(
        vec![Reply::Exit(1, STEP4_FAILED)],
        &STATIC,
        &[],
        HostConfig::default(),
    );
    let pods = rig.pods.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        // Deleted and recreated under the same name: a new incarnation.
        pods.remove("default", "web-0");
        let mut again = pod(&[]);
        again.uid = Some("11111111-2222-3333-4444-555555555555".into());
        pods.insert(again);
    });
    let summary = rig.handle(Trigger::Event, &CancellationToken::new()).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Gone));
    assert_eq!(summary.attempts, 2);
    let annotations = rig.pods.annotations("default", "web-0").unwrap();
    assert!(
        !annotations.contains_key(keys::POST_CLONE_STATE),
        "nothing landed on the new pod"
    );
    assert!(rig.pods.patches().iter().all(|(p, _)| p.uid == UID));
}

#[rstest::rstest]
#[case::exec_timeout_inside_budget(Duration::from_secs(90), Duration::from_secs(90))]
#[case::never_past_the_budget(Duration::from_secs(600), Duration::from_secs(180))]
#[tokio::test(start_paused = true)]
async fn a_hung_exec_is_bounded(#[case] exec_timeout: Duration, #[case] first_timeout: Duration) {
    let config = HostConfig {
        retry: RetryConfig {
            exec_timeout,
            ..RetryConfig::default()
        },
        ..HostConfig::default()
    };
    let rig = rig(vec![Reply::Hang, Reply::Done], &STATIC, &[], config);
    let summary = rig.handle(Trigger::Event, &CancellationToken::new()).await;
    let calls = rig.cocoon.calls();
    assert_eq!(calls[0].timeout, first_timeout);
    let failed = rig.events(reasons::EXEC_ATTEMPT_FAILED);
    assert!(failed[0].contains("timed out"), "{}", failed[0]);
    if first_timeout < Duration::from_secs(180) {
        assert_eq!(summary.fixup, Some(FixupEnd::Done));
        assert_eq!(summary.attempts, 2);
        assert_eq!(
            calls[1].at - calls[0].at,
            first_timeout + Duration::from_secs(3)
        );
    } else {
        // The hung exec ate the whole budget: exhausted after one attempt.
        assert_eq!(summary.fixup, Some(FixupEnd::Exhausted));
        assert_eq!(summary.attempts, 1);
    }
}

#[rstest::rstest]
#[case::parked(&[(keys::POST_CLONE_STATE, "failed")], "parked", 0, None)]
#[case::terminal_ready(&[(keys::LIFECYCLE_STATE, "ready")], "nothing", 0, None)]
#[case::running_reruns(&[(keys::POST_CLONE_STATE, "running")], "fixup", 1, Some("op=post_clone"))]
#[case::done_waits(&[(keys::POST_CLONE_STATE, "done")], "ip-wait", 0, Some("op=ready_wait"))]
#[case::no_marker_runs(&[], "fixup", 1, Some("op=post_clone"))]
#[tokio::test(start_paused = true)]
async fn startup_follows_the_persisted_state(
    #[case] extra: &[(&str, &str)],
    #[case] action: &str,
    #[case] execs: usize,
    #[case] resumed: Option<&str>,
) {
    let rig = rig(vec![Reply::Done], &STATIC, extra, HostConfig::default());
    let summary = rig
        .handle(Trigger::Startup, &CancellationToken::new())
        .await;
    assert_eq!(summary.action.as_str(), action);
    assert_eq!(rig.cocoon.calls().len(), execs);
    let events = rig.events(reasons::RESUMED_AFTER_RESTART);
    assert_eq!(events.first().map(String::as_str), resumed);
    if action == "fixup" || action == "ip-wait" {
        assert_eq!(summary.readiness, Some(Readiness::Ready));
    }
}

#[tokio::test(start_paused = true)]
async fn unmanaged_pods_are_never_touched() {
    let rig = rig(
        vec![Reply::Done],
        &STATIC,
        &[("cocoonset.cocoonstack.io/managed", "false")],
        HostConfig::default(),
    );
    let summary = rig.handle(Trigger::Event, &CancellationToken::new()).await;
    assert_eq!(summary.action, Handled::Nothing);
    assert!(rig.cocoon.calls().is_empty());
    assert!(rig.pods.patches().is_empty());
    assert!(rig.pods.events().is_empty());
}

#[tokio::test(start_paused = true)]
async fn bad_facts_fail_the_pod_once_without_exec() {
    let rig = rig(
        vec![Reply::Done],
        &[("52:54:00:zz:bb:01;reboot", Some("10.0.0.5/24"))],
        &[],
        HostConfig::default(),
    );
    let summary = rig.handle(Trigger::Event, &CancellationToken::new()).await;
    assert_eq!(summary.fixup, Some(FixupEnd::PlanFailed));
    assert!(
        rig.cocoon.calls().is_empty(),
        "nothing runs for facts that fail validation"
    );
    assert_eq!(
        rig.annotation(keys::POST_CLONE_STATE).as_deref(),
        Some("failed")
    );
    assert_eq!(
        rig.annotation(keys::LIFECYCLE_STATE).as_deref(),
        Some("failed")
    );
    let errors = rig.annotation(keys::POST_CLONE_ERRORS).unwrap();
    assert!(errors.contains("network_configs[0].mac"), "{errors}");
    assert_eq!(
        rig.events(reasons::PLAN_FAILED).len(),
        1,
        "a plan failure is no exhausted exec"
    );
    assert!(rig.events(reasons::EXEC_EXHAUSTED).is_empty());
}

// ---- the IP wait, in real (short) time: the lease file is real ----

fn short_ready() -> HostConfig {
    HostConfig {
        ready: ReadyConfig {
            budget: Duration::from_secs(3),
            renew_after: Duration::from_millis(300),
            renew_timeout: Duration::from_secs(1),
            dhcp_recovery_after: Duration::from_millis(300),
            recovery_timeout: Duration::from_secs(1),
            ..ReadyConfig::default()
        },
        // These pods are clones the host saw new: no wake grace (its own
        // tests are the conformance scenarios `wake-grace-*`).
        wake: fixup_core::decision::WakeConfig {
            grace: Duration::ZERO,
            ..Default::default()
        },
        ..HostConfig::default()
    }
}

const DHCP: [(&str, Option<&str>); 1] = [("52:54:00:AA:BB:02", None)];

fn write_lease(path: &std::path::Path, mac: &str, ip: &str) {
    let lease = serde_json::json!([{"mac": mac, "ip": ip, "expiry": "2099-01-01T00:00:00Z"}]);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, lease.to_string()).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

/// Wait until the scripted cocoon has seen `n` execs (bounded).
async fn execs(cocoon: &ScriptedCocoon, n: usize) {
    for _ in 0..200 {
        if cocoon.calls().len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("expected {n} execs, saw {:?}", cocoon.calls());
}

#[tokio::test]
async fn an_all_dhcp_clone_gets_one_recovery_pass_then_its_lease() {
    let rig = rig(vec![Reply::Done], &DHCP, &[], short_ready());
    let (cocoon, lease_file) = (rig.cocoon.clone(), rig.lease_file.clone());
    tokio::spawn(async move {
        execs(&cocoon, 1).await;
        write_lease(&lease_file, "52:54:00:aa:bb:02", "10.0.0.77");
    });
    let summary = rig.handle(Trigger::Event, &CancellationToken::new()).await;
    assert_eq!(summary.action, Handled::IpWait);
    assert_eq!(summary.readiness, Some(Readiness::Ready));
    assert_eq!(summary.ip.as_deref(), Some("10.0.0.77"));
    let calls = rig.cocoon.calls();
    assert_eq!(calls.len(), 1, "exactly one recovery pass");
    let script = calls[0].argv.join(" ");
    assert!(
        script.contains("DHCP=ipv4") && script.contains("MACAddress=52:54:00:aa:bb:02"),
        "{script}"
    );
    assert_eq!(rig.events(reasons::DHCP_RECOVERY).len(), 1);
    assert_eq!(
        rig.annotation(keys::LIFECYCLE_STATE).as_deref(),
        Some("ready")
    );
}

#[tokio::test]
async fn windows_is_nudged_once_with_ipconfig_renew() {
    let extra = [("cocoonset.cocoonstack.io/os", "windows")];
    // The PnP fixup succeeds, then the nudge.
    let rig = rig(vec![Reply::Done, Reply::Done], &DHCP, &extra, short_ready());
    let (cocoon, lease_file) = (rig.cocoon.clone(), rig.lease_file.clone());
    tokio::spawn(async move {
        execs(&cocoon, 2).await;
        write_lease(&lease_file, "52:54:00:AA:BB:02", "10.0.0.78");
    });
    let summary = rig.handle(Trigger::Event, &CancellationToken::new()).await;
    assert_eq!(
        summary.scenario,
        Some(fixup_core::classify::Scenario::WindowsPnp)
    );
    assert_eq!(summary.readiness, Some(Readiness::Ready));
    let calls = rig.cocoon.calls();
    assert_eq!(calls[0].argv[0], "powershell");
    assert_eq!(calls[1].argv, ["cmd", "/c", "ipconfig /renew"]);
    assert!(calls[1].timeout <= Duration::from_secs(1));
}

#[tokio::test]
async fn no_lease_in_time_fails_with_the_spec_message() {
    let rig = rig(
        vec![Reply::Done],
        &DHCP,
        &[("vm.cocoonstack.io/fork-from", "web-src")],
        short_ready(),
    );
    let summary = rig.handle(Trigger::Event, &CancellationToken::new()).await;
    assert_eq!(summary.readiness, Some(Readiness::TimedOut));
    let message = format!("clone {}: dhcp lease not observed within 3s", vm_name());
    assert_eq!(
        rig.annotation(keys::LIFECYCLE_STATE).as_deref(),
        Some("failed")
    );
    assert_eq!(
        rig.annotation(keys::LIFECYCLE_MESSAGE).as_deref(),
        Some(message.as_str())
    );
    assert_eq!(rig.events(reasons::IP_WAIT_TIMEOUT), [message]);
}

#[tokio::test(start_paused = true)]
async fn a_pod_another_component_fails_is_left_alone() {
    // Another component marks the pod Failed while the fixup retries: the
    // stack owns the pod now (spec section 8), so the loop stops before its
    // next attempt and nothing more is written, not even the IP.
    let rig = rig(
        vec![Reply::Exit(1, STEP4_FAILED), Reply::Done],
        &STATIC,
        &[],
        HostConfig::default(),
    );
    let pods = rig.pods.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut failed = pod(&[]);
        failed.annotations = pods.annotations("default", "web-0").unwrap();
        failed
            .annotations
            .insert(keys::LIFECYCLE_STATE.into(), "failed".into());
        failed
            .annotations
            .insert(keys::LIFECYCLE_OBSERVED_GENERATION.into(), "3".into());
        pods.insert(failed);
    });
    let summary = rig.handle(Trigger::Event, &CancellationToken::new()).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Gone));
    assert_eq!(summary.attempts, 1, "no attempt after the stack took over");
    assert_eq!(rig.cocoon.calls().len(), 1);
    assert_eq!(rig.annotation(keys::IP), None);
    assert_eq!(
        rig.annotation(keys::LIFECYCLE_STATE).as_deref(),
        Some("failed")
    );
    assert_eq!(
        rig.annotation(keys::POST_CLONE_STATE).as_deref(),
        Some("running"),
        "the marker is the stack's to clear"
    );
}

/// A step that ends the script with exit 0 (`command exit 0`, `exec true`)
/// would skip every later step, other plugins' included: without the done
/// marker an exit 0 is a failed attempt, and the loop tries again.
#[tokio::test(start_paused = true)]
async fn exit_zero_before_the_last_step_is_a_failed_attempt() {
    const ENDED_EARLY: &str =
        "\ncocoon-fixup: {nonce} step 1/5 start\n\ncocoon-fixup: {nonce} step 2/5 start\n";
    let rig = rig(
        vec![Reply::Exit(0, ENDED_EARLY), Reply::Done],
        &STATIC,
        &[],
        HostConfig::default(),
    );
    let summary = rig.handle(Trigger::Event, &CancellationToken::new()).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Done));
    assert_eq!(summary.attempts, 2, "attempt 1 did not count as done");
    let failed = rig.events(reasons::EXEC_ATTEMPT_FAILED);
    assert_eq!(failed.len(), 1);
    assert!(
        failed[0].starts_with("attempt 1: step 2/5"),
        "{}",
        failed[0]
    );
    assert!(
        failed[0].contains("ended early with exit 0"),
        "{}",
        failed[0]
    );
}

/// A guest program can print the done marker (or a failure marker) as it
/// likes, but not with the nonce of an exec it did not see start: an exit 0
/// whose only done markers lack the exec's nonce is a failed attempt, and
/// a forged failure marker does not move the blame off the running step.
#[tokio::test(start_paused = true)]
async fn forged_markers_without_the_execs_nonce_do_not_count() {
    const NO_NONCE: &str = "\ncocoon-fixup: {nonce} step 1/5 start\n\ncocoon-fixup: {nonce} step 2/5 start\n\ncocoon-fixup: step 5/5 failed exit 9\n\ncocoon-fixup: done\n";
    const OLD_NONCE: &str = "\ncocoon-fixup: {nonce} step 1/5 start\n\ncocoon-fixup: {nonce} step 2/5 start\n\ncocoon-fixup: 0123456789abcdef0123456789abcdef step 5/5 failed exit 9\n\ncocoon-fixup: 0123456789abcdef0123456789abcdef done\n";
    let rig = rig(
        vec![
            Reply::Exit(0, NO_NONCE),
            Reply::Exit(0, OLD_NONCE),
            Reply::Done,
        ],
        &STATIC,
        &[],
        HostConfig::default(),
    );
    let summary = rig.handle(Trigger::Event, &CancellationToken::new()).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Done));
    assert_eq!(summary.attempts, 3, "the forged done markers did not count");
    let failed = rig.events(reasons::EXEC_ATTEMPT_FAILED);
    assert_eq!(failed.len(), 2);
    for (n, event) in failed.iter().enumerate() {
        assert!(
            event.starts_with(&format!("attempt {}: step 2/5", n + 1))
                && event.contains("did not finish")
                && event.contains("ended early with exit 0"),
            "{event}"
        );
    }

    // Every attempt ran the same script under a nonce of its own.
    let calls = rig.cocoon.calls();
    assert_eq!(calls.len(), 3);
    let nonces: Vec<_> = calls
        .iter()
        .map(|c| fixup_core::plan::exec_nonce(&c.argv).expect("a nonce in every exec"))
        .collect();
    assert!(nonces[0] != nonces[1] && nonces[1] != nonces[2] && nonces[0] != nonces[2]);
    for call in &calls {
        assert_eq!(call.argv[..3], calls[0].argv[..3], "one script for all");
        assert_eq!(call.argv[..2], ["sh", "-c"]);
        assert_eq!(call.argv[3], "sh");
        assert!(!call.argv[2].contains(call.argv[4].as_str()));
    }
}

/// A hint that the pod's annotations could not hold (here beside a large
/// `last-applied-configuration`) does not stop a fixup that may succeed.
#[tokio::test(start_paused = true)]
async fn a_hint_the_pods_annotations_cannot_hold_does_not_stop_the_fixup() {
    let applied = "x".repeat(fixup_core::annotations::ANNOTATIONS_MAX - 2048);
    let rig = rig(
        vec![Reply::Done],
        &STATIC,
        &[("kubectl.kubernetes.io/last-applied-configuration", &applied)],
        HostConfig::default(),
    );
    let summary = rig.handle(Trigger::Event, &CancellationToken::new()).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Done));
    assert_eq!(rig.cocoon.calls().len(), 1);
}

/// When such a fixup fails, the failure record goes without the hint and
/// says so: the pod is marked failed, the event is told, and no write is
/// refused for being too large.
#[tokio::test(start_paused = true)]
async fn an_exhausted_fixup_without_room_for_the_hint_is_recorded_without_it() {
    // The hint of this plan, from a pod with room.
    let roomy = rig(
        vec![Reply::Exit(1, "boom")],
        &STATIC,
        &[],
        HostConfig::default(),
    );
    roomy
        .handle(Trigger::Event, &CancellationToken::new())
        .await;
    let hint = roomy.annotation(keys::POST_CLONE_HINT).expect("a hint");
    let roomy_total: usize = roomy
        .pods
        .annotations("default", "web-0")
        .unwrap()
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    // With the hint, the record would be half a hint over the limit;
    // without it, half a hint under (less the note that says so).
    let key = "kubectl.kubernetes.io/last-applied-configuration";
    let applied = "x".repeat(
        fixup_core::annotations::ANNOTATIONS_MAX - key.len() - roomy_total + hint.len() / 2,
    );
    assert!(hint.len() > 1000, "the hint is large enough for this test");
    let rig = rig(
        vec![Reply::Exit(1, "boom")],
        &STATIC,
        &[(key, &applied)],
        HostConfig::default(),
    );
    let summary = rig.handle(Trigger::Event, &CancellationToken::new()).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Exhausted));
    assert_eq!(
        rig.annotation(keys::POST_CLONE_STATE).as_deref(),
        Some("failed")
    );
    assert_eq!(rig.annotation(keys::POST_CLONE_HINT), None);
    let errors = rig.annotation(keys::POST_CLONE_ERRORS).expect("errors");
    assert!(errors.contains("was left out"), "{errors}");
    assert_eq!(rig.events(reasons::EXEC_EXHAUSTED).len(), 1);
}

/// A pod whose own annotations leave no room even for the whole error
/// chain still gets its failure recorded, with the chain's newest part.
#[tokio::test(start_paused = true)]
async fn an_exhausted_fixup_on_a_full_pod_keeps_the_newest_errors() {
    let key = "kubectl.kubernetes.io/last-applied-configuration";
    let applied = "x".repeat(fixup_core::annotations::ANNOTATIONS_MAX - key.len() - 2500);
    let rig = rig(
        vec![Reply::Exit(1, "boom")],
        &STATIC,
        &[(key, &applied)],
        HostConfig::default(),
    );
    let summary = rig.handle(Trigger::Event, &CancellationToken::new()).await;
    assert_eq!(summary.fixup, Some(FixupEnd::Exhausted));
    assert_eq!(
        rig.annotation(keys::POST_CLONE_STATE).as_deref(),
        Some("failed")
    );
    let errors = rig.annotation(keys::POST_CLONE_ERRORS).expect("errors");
    assert!(errors.starts_with("[truncated: first "), "{errors}");
    assert_eq!(
        rig.annotation(keys::LIFECYCLE_MESSAGE),
        Some(errors.clone())
    );
    assert!(
        errors.ends_with("was left out: `cocoon-fixup plan` prints it"),
        "{errors}"
    );
    assert_eq!(rig.events(reasons::EXEC_EXHAUSTED).len(), 1);
}

/// With room for one pod at a time, a second call waits for its turn after
/// the lifecycle gate; shut down while it waits, it ends with action
/// `shutdown` having done nothing (no inspect, no exec, no write), and the
/// first call goes on with its turn until its own shutdown.
#[tokio::test(start_paused = true)]
async fn a_call_waiting_for_its_turn_does_nothing_when_shut_down() {
    let config = HostConfig {
        fixups_in_flight: 1,
        ..HostConfig::default()
    };
    let rig = rig(vec![Reply::Hang], &STATIC, &[], config);
    let (first_token, second_token) = (CancellationToken::new(), CancellationToken::new());
    let first = rig.handle(Trigger::Event, &first_token);
    let second = async {
        // The first call has its turn and hangs in its exec by now.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let patches_before = rig.pods.patches().len();
        let waiting = rig
            .host
            .handle("default", "web-0", Trigger::Event, &second_token);
        let shut_down = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            second_token.cancel();
        };
        let (summary, ()) = tokio::join!(waiting, shut_down);
        let patches_after = rig.pods.patches().len();
        first_token.cancel();
        (summary.unwrap(), patches_before, patches_after)
    };
    let (first, (second, patches_before, patches_after)) = tokio::join!(first, second);
    assert_eq!(second.action, Handled::Shutdown, "{second:?}");
    assert_eq!(second.fixup, None);
    assert_eq!(
        patches_after, patches_before,
        "the waiting call wrote nothing"
    );
    assert_eq!(
        rig.cocoon.calls().len(),
        1,
        "only the first call ran its exec"
    );
    assert_eq!(first.fixup, Some(FixupEnd::Shutdown));
}
