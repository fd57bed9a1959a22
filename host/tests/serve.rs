//! The node daemon's dispatcher: which pods have work, no pod twice at
//! once, bounded concurrency, clean stop. (The kube-runtime watch feeding
//! it needs an API server; the dispatcher is what decides.)

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use fixup_core::decision::Trigger;
use fixup_core::decision::has_work;
use fixup_core::facts::PodInput;
use fixup_core::planner::{Planner, PlannerOptions};
use fixup_host::host::{Host, HostConfig};
use fixup_host::metrics::Metrics;
use fixup_host::pods::{MemoryPods, keys};
use fixup_host::ready::LeaseWatcher;
use fixup_host::serve::Dispatcher;
use rstest::rstest;
use support::{Reply, ScriptedCocoon, inspect, pod};
use tokio_util::sync::CancellationToken;

#[rstest]
#[case::fresh_clone(&[], true)]
#[case::unmanaged(&[("cocoonset.cocoonstack.io/managed", "")], false)]
#[case::no_vm_yet(&[("vm.cocoonstack.io/id", ""), ("vm.cocoonstack.io/name", "")], false)]
#[case::ready(&[(keys::LIFECYCLE_STATE, "ready")], false)]
#[case::failed(&[(keys::LIFECYCLE_STATE, "failed")], false)]
// The VM and the host's record settle these: a failed marker may be an
// earlier VM's, a run pod's VM may be a wake.
#[case::parked(&[(keys::POST_CLONE_STATE, "failed")], true)]
#[case::run_mode(&[("cocoonset.cocoonstack.io/mode", "run")], true)]
#[case::parked_ready(&[(keys::POST_CLONE_STATE, "failed"), (keys::LIFECYCLE_STATE, "failed")], false)]
#[case::resumable(&[(keys::POST_CLONE_STATE, "running")], true)]
#[case::ip_wait_left(&[(keys::POST_CLONE_STATE, "done")], true)]
fn which_pods_have_work(#[case] extra: &[(&str, &str)], #[case] expected: bool) {
    assert_eq!(has_work(&pod(extra)), expected);
}

fn named(name: &str, uid: &str) -> PodInput {
    let mut p = pod(&[]);
    p.name = name.into();
    p.uid = Some(uid.into());
    p
}

fn host(
    cocoon: ScriptedCocoon,
    pods: MemoryPods,
    dir: &tempfile::TempDir,
) -> Arc<Host<ScriptedCocoon, MemoryPods>> {
    Arc::new(host_with(cocoon, pods, dir, HostConfig::default()))
}

/// A host over `cocoon` and `pods` with the built-in plugins and `config`.
fn host_with<C: fixup_host::cocoon::Cocoon>(
    cocoon: C,
    pods: MemoryPods,
    dir: &tempfile::TempDir,
    config: HostConfig,
) -> Host<C, MemoryPods> {
    let options = PlannerOptions {
        cocoon_root: dir.path().to_owned(),
        ..PlannerOptions::default()
    };
    let (planner, _) = Planner::new(options).unwrap();
    let leases =
        LeaseWatcher::new(dir.path().join("leases.json"), Duration::from_millis(50)).unwrap();
    Host::new(
        Arc::new(planner),
        cocoon,
        pods,
        Arc::new(leases),
        config,
        Arc::new(Metrics::new()),
    )
}

#[tokio::test(start_paused = true)]
async fn one_pod_is_never_worked_on_twice_and_concurrency_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let cocoon = ScriptedCocoon::new(
        vec![Reply::Hang],
        inspect(&[("52:54:00:aa:bb:01", Some("10.0.0.5/24"))]),
    );
    let pods = MemoryPods::new();
    let (a, b) = (named("web-0", "uid-a"), named("web-1", "uid-b"));
    pods.insert(a.clone());
    pods.insert(b.clone());
    let shutdown = CancellationToken::new();
    let mut dispatcher = Dispatcher::new(
        host(cocoon.clone(), pods.clone(), &dir),
        1,
        shutdown.clone(),
    );
    // The same pod offered again while in flight (the host's own patches
    // cause such updates), and a second pod beyond the concurrency of 1.
    dispatcher.offer(a.clone(), Trigger::Startup);
    dispatcher.offer(a.clone(), Trigger::Event);
    dispatcher.offer(b.clone(), Trigger::Event);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        cocoon.calls().len(),
        1,
        "one exec: web-0 once, web-1 waits for a slot"
    );
    shutdown.cancel();
    dispatcher.drain(Duration::from_secs(10)).await;
    // Stopped, not failed: the work stays `running` for the next start.
    let a_state = pods.annotations("default", "web-0").unwrap();
    assert_eq!(
        a_state.get(keys::POST_CLONE_STATE).map(String::as_str),
        Some("running")
    );
    assert!(!a_state.contains_key(keys::POST_CLONE_ERRORS));
}

#[tokio::test(start_paused = true)]
async fn finished_pods_are_not_picked_up_again() {
    let dir = tempfile::tempdir().unwrap();
    let cocoon = ScriptedCocoon::new(
        vec![Reply::Done],
        inspect(&[("52:54:00:aa:bb:01", Some("10.0.0.5/24"))]),
    );
    let pods = MemoryPods::new();
    pods.insert(named("web-0", "uid-a"));
    let shutdown = CancellationToken::new();
    let mut dispatcher = Dispatcher::new(
        host(cocoon.clone(), pods.clone(), &dir),
        4,
        shutdown.clone(),
    );
    dispatcher.offer(named("web-0", "uid-a"), Trigger::Event);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The watch would now deliver the pod with the host's annotations.
    let mut updated = named("web-0", "uid-a");
    updated.annotations = pods.annotations("default", "web-0").unwrap();
    assert_eq!(
        updated
            .annotations
            .get(keys::LIFECYCLE_STATE)
            .map(String::as_str),
        Some("ready")
    );
    dispatcher.offer(updated, Trigger::Event);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(cocoon.calls().len(), 1);
    dispatcher.drain(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn metrics_and_health_are_served() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let metrics = Arc::new(Metrics::new());
    metrics.fixup(fixup_core::classify::Scenario::Cloudimg, "done", 2);
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(fixup_host::serve::metrics_server(
        addr,
        metrics,
        fixup_host::serve::ListenerLimits::default(),
        shutdown.clone(),
    ));
    let get = |path: &'static str| async move {
        for _ in 0..100 {
            if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
                s.write_all(
                    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                )
                .await
                .unwrap();
                let mut body = String::new();
                s.read_to_string(&mut body).await.unwrap();
                return body;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("metrics server did not come up on {addr}");
    };
    let health = get("/healthz").await;
    assert!(
        health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"),
        "{health}"
    );
    let text = get("/metrics").await;
    assert!(
        text.contains("cocoon_fixup_fixups_total{scenario=\"cloudimg\",result=\"done\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("cocoon_fixup_fixup_attempts_bucket"),
        "{text}"
    );
    shutdown.cancel();
    server.await.unwrap().unwrap();
}

/// cocoon for two pods' VMs: each VM id's record, and every exec runs
/// the whole script.
#[derive(Debug, Clone)]
struct TwoVms {
    records: Arc<std::collections::HashMap<String, String>>,
}

impl fixup_host::cocoon::Cocoon for TwoVms {
    async fn exec(
        &self,
        vm: &fixup_core::facts::VmId,
        argv: &[String],
        timeout: Duration,
    ) -> Result<fixup_host::cocoon::ExecOutput, fixup_host::cocoon::CocoonError> {
        let cocoon = ScriptedCocoon::new(vec![Reply::Done], self.records[vm.as_str()].clone());
        cocoon.exec(vm, argv, timeout).await
    }

    async fn inspect(
        &self,
        vm: &fixup_core::facts::VmId,
        timeout: Duration,
    ) -> Result<fixup_core::facts::VmInspect, fixup_host::cocoon::CocoonError> {
        let cocoon = ScriptedCocoon::new(vec![], self.records[vm.as_str()].clone());
        cocoon.inspect(vm, timeout).await
    }
}

/// A hostile Windows console: the open never gets its prompt, and holds
/// its (blocking) caller until the pass is stopped or its deadline comes.
#[derive(Debug, Clone, Default)]
struct StuckConsole(Arc<Stuck>);

#[derive(Debug, Default)]
struct Stuck {
    opened: std::sync::atomic::AtomicBool,
    returned: std::sync::atomic::AtomicBool,
}

impl fixup_host::console::Console for StuckConsole {
    fn open(
        &self,
        _vm: &fixup_core::facts::VmId,
        _need: usize,
        stop: fixup_sac::StopCheck,
        deadline: fixup_sac::Deadline,
    ) -> Result<(Vec<u32>, Box<dyn fixup_host::console::ConsoleSession>), fixup_sac::SacError> {
        use std::sync::atomic::Ordering::SeqCst;
        self.0.opened.store(true, SeqCst);
        while !stop.is_set() && std::time::Instant::now() < deadline.at {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.0.returned.store(true, SeqCst);
        Err(if stop.is_set() {
            fixup_sac::SacError::Stopped
        } else {
            fixup_sac::SacError::Deadline {
                step: fixup_sac::Step::Dial,
                total: deadline.total,
            }
        })
    }
}

/// `--concurrency 1` bounds the pods holding a turn, and the serial-console
/// pass holds none: a Linux clone is fixed and ready while a Windows
/// clone's console hangs in its pass; a shutdown then ends that pass at
/// once, the blocking console call included, with nothing marked failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_console_pass_holds_no_turn() {
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let win_name = fixup_core::binding::vm_name_for_pod("default", "win-0");
    let records = [
        (
            "vm-0123abcd".to_owned(),
            inspect(&[("52:54:00:aa:bb:01", Some("10.0.0.5/24"))]),
        ),
        (
            "vm-w1".to_owned(),
            serde_json::json!({"id": "vm-w1", "config": {"name": win_name},
                "network_configs": [{"mac": "52:54:00:aa:bb:02", "tap": "tap0",
                    "network": {"ip": "10.0.0.9", "prefix": 24, "gateway": "10.0.0.1"}}]})
            .to_string(),
        ),
    ];
    let cocoon = TwoVms {
        records: Arc::new(records.into_iter().collect()),
    };
    let pods = MemoryPods::new();
    let linux = named("web-0", "uid-linux");
    let mut windows = named("win-0", "uid-win");
    for (key, value) in [
        ("cocoonset.cocoonstack.io/os", "windows"),
        ("vm.cocoonstack.io/id", "vm-w1"),
        ("vm.cocoonstack.io/name", win_name.as_str()),
    ] {
        windows.annotations.insert(key.into(), value.into());
    }
    pods.insert(linux.clone());
    pods.insert(windows.clone());
    let mut config = HostConfig {
        fixups_in_flight: 1,
        ..HostConfig::default()
    };
    // No evidence of a wake either way: a short grace.
    config.wake.grace = Duration::from_millis(50);
    let console = StuckConsole::default();
    let seen = Arc::clone(&console.0);
    let host =
        Arc::new(host_with(cocoon, pods.clone(), &dir, config).with_console(Arc::new(console)));
    let shutdown = CancellationToken::new();
    let mut dispatcher = Dispatcher::new(host, 16, shutdown.clone());
    dispatcher.offer(windows, Trigger::Event);
    for _ in 0..3000 {
        if seen.opened.load(SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        seen.opened.load(SeqCst),
        "the Windows pass reached its console"
    );
    dispatcher.offer(linux, Trigger::Event);
    let mut ready = false;
    for _ in 0..3000 {
        let state = pods.annotations("default", "web-0").unwrap();
        if state.get(keys::LIFECYCLE_STATE).map(String::as_str) == Some("ready") {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(ready, "the Linux clone was held behind the console pass");
    assert!(
        !seen.returned.load(SeqCst),
        "the console pass was still under way"
    );
    shutdown.cancel();
    dispatcher.drain(Duration::from_secs(30)).await;
    // The task does not wait for it, but the blocking call sees the stop.
    for _ in 0..3000 {
        if seen.returned.load(SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(seen.returned.load(SeqCst), "the console call stopped");
    let windows = pods.annotations("default", "win-0").unwrap();
    assert_eq!(
        windows.get(keys::POST_CLONE_STATE).map(String::as_str),
        Some("done"),
        "a shutdown marks nothing failed"
    );
}

// ---- the pod watch's metrics ----

/// The value of `series` (name and labels, as rendered) in `metrics`.
fn sample(metrics: &Metrics, series: &str) -> f64 {
    let text = metrics.encode();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
}

fn watch_synced(metrics: &Metrics) -> f64 {
    sample(metrics, "cocoon_fixup_watch_synced")
}

fn watch_errors(metrics: &Metrics, kind: &str) -> f64 {
    sample(
        metrics,
        &format!("cocoon_fixup_watch_errors_total{{kind=\"{kind}\"}}"),
    )
}

type ApiHandle =
    tower_test::mock::Handle<http::Request<kube::client::Body>, http::Response<kube::client::Body>>;
type Respond = tower_test::mock::SendResponse<http::Response<kube::client::Body>>;

/// The watch's next request: a listing of the node's pods, or with
/// `watch` a watch from `resource_version`. Returns the handle to answer it.
async fn next_pod_request(
    api: &mut ApiHandle,
    watch: bool,
    resource_version: Option<&str>,
) -> Respond {
    // kube-runtime's backoff is at most 1.6 s here; paused time skips it.
    let (request, respond) = tokio::time::timeout(Duration::from_secs(60), api.next_request())
        .await
        .expect("the watch asked again within its backoff")
        .expect("the client is open");
    let uri = request.uri().clone();
    assert_eq!(uri.path(), "/api/v1/pods", "{uri}");
    let query: Vec<&str> = uri.query().unwrap_or("").split('&').collect();
    assert!(
        query.contains(&"fieldSelector=spec.nodeName%3Dnode-a"),
        "{uri}"
    );
    assert_eq!(query.contains(&"watch=true"), watch, "{uri}");
    if let Some(version) = resource_version {
        assert!(
            query.contains(&format!("resourceVersion={version}").as_str()),
            "{uri}"
        );
    }
    respond
}

fn api_answer(status: u16, body: &[u8]) -> http::Response<kube::client::Body> {
    http::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(kube::client::Body::from(body.to_vec()))
        .unwrap()
}

fn pod_list(resource_version: &str) -> http::Response<kube::client::Body> {
    let list = serde_json::json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadataList",
        "metadata": {"resourceVersion": resource_version},
        "items": [],
    });
    api_answer(200, &serde_json::to_vec(&list).unwrap())
}

/// A watch stream of `events`, one JSON line each, that then ends.
fn watch_stream(events: &[serde_json::Value]) -> http::Response<kube::client::Body> {
    let mut body = Vec::new();
    for event in events {
        body.extend(serde_json::to_vec(event).unwrap());
        body.push(b'\n');
    }
    api_answer(200, &body)
}

fn forbidden(verb: &str) -> http::Response<kube::client::Body> {
    let status = support::mock_api::status(
        403,
        "Forbidden",
        &format!(
            "pods is forbidden: User \"system:serviceaccount:cocoon:fixup\" cannot {verb} resource \"pods\" in API group \"\" at the cluster scope"
        ),
    );
    api_answer(403, &serde_json::to_vec(&status).unwrap())
}

/// `serve::run`'s watch against a mock API server, in paused time:
/// `cocoon_fixup_watch_synced` is 0 until a listing is complete and after
/// each error, and 1 again when the pods are listed again, when the watch
/// delivers an event, or once [`WATCH_ERROR_QUIET`] passed without
/// another error (a watch resumed from its resource version sends no new
/// listing); every error counts in `cocoon_fixup_watch_errors_total` by
/// kind. Each answer is checked when the watch next asks, by which time
/// the daemon has handled it.
///
/// [`WATCH_ERROR_QUIET`]: fixup_host::serve::WATCH_ERROR_QUIET
#[tokio::test(start_paused = true)]
async fn the_pod_watch_counts_its_errors_and_says_when_it_is_synced() {
    use fixup_host::metrics::WATCH_ERROR_KINDS;
    use fixup_host::serve::WATCH_ERROR_QUIET;

    let dir = tempfile::tempdir().unwrap();
    let cocoon = ScriptedCocoon::new(vec![], inspect(&[]));
    let host = host(cocoon, MemoryPods::new(), &dir);
    let metrics = host.metrics_handle();
    let (service, mut api) = tower_test::mock::pair();
    let shutdown = CancellationToken::new();
    let daemon = tokio::spawn(fixup_host::serve::run(
        kube::Client::new(service, "default"),
        "node-a",
        host,
        shutdown.clone(),
    ));

    // Every series is there from the start: the gauge at 0, each kind at 0.
    let respond = next_pod_request(&mut api, false, None).await;
    assert_eq!(watch_synced(&metrics), 0.0, "before the first listing");
    for kind in WATCH_ERROR_KINDS {
        assert_eq!(watch_errors(&metrics, kind), 0.0, "{kind}");
    }
    // RBAC refuses the listing; the watcher lists again after its backoff.
    respond.send_response(forbidden("list"));
    let respond = next_pod_request(&mut api, false, None).await;
    assert_eq!(watch_errors(&metrics, "forbidden"), 1.0);
    assert_eq!(watch_synced(&metrics), 0.0, "the listing was refused");
    respond.send_response(pod_list("7"));

    // Listed: synced. Then the watch itself is refused.
    let respond = next_pod_request(&mut api, true, Some("7")).await;
    assert_eq!(watch_synced(&metrics), 1.0, "listed, and the watch asked");
    respond.send_response(forbidden("watch"));
    let respond = next_pod_request(&mut api, true, Some("7")).await;
    assert_eq!(watch_errors(&metrics, "forbidden"), 2.0);
    assert_eq!(watch_synced(&metrics), 0.0, "the watch was refused");

    // The watch resumes from version 7 with no new listing; its first
    // event says it streams.
    let added = serde_json::json!({"type": "ADDED", "object": {
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": {"name": "web-0", "namespace": "default", "uid": "uid-a", "resourceVersion": "8"},
    }});
    respond.send_response(watch_stream(&[added]));
    let respond = next_pod_request(&mut api, true, Some("8")).await;
    assert_eq!(watch_synced(&metrics), 1.0, "an event came through");

    // The resource version expired: the watcher lists the pods again.
    let expired = serde_json::json!({"type": "ERROR", "object": support::mock_api::status(
        410,
        "Expired",
        "too old resource version: 8 (12)",
    )});
    respond.send_response(watch_stream(&[expired]));
    let respond = next_pod_request(&mut api, false, None).await;
    assert_eq!(watch_errors(&metrics, "gone"), 1.0);
    assert_eq!(watch_synced(&metrics), 0.0, "listing again");
    respond.send_response(pod_list("12"));
    let respond = next_pod_request(&mut api, true, Some("12")).await;
    assert_eq!(watch_synced(&metrics), 1.0, "listed again");

    // Refused once more, then the watch opens and stays quiet: synced
    // again once WATCH_ERROR_QUIET has passed since the error.
    respond.send_response(forbidden("watch"));
    let open = next_pod_request(&mut api, true, Some("12")).await;
    let refused_by = tokio::time::Instant::now();
    assert_eq!(watch_errors(&metrics, "forbidden"), 3.0);
    assert_eq!(watch_synced(&metrics), 0.0, "the watch was refused again");
    tokio::time::sleep_until(refused_by + WATCH_ERROR_QUIET - Duration::from_secs(5)).await;
    assert_eq!(
        watch_synced(&metrics),
        0.0,
        "not yet {WATCH_ERROR_QUIET:?} without an error"
    );
    tokio::time::sleep_until(refused_by + WATCH_ERROR_QUIET + Duration::from_secs(1)).await;
    assert_eq!(
        watch_synced(&metrics),
        1.0,
        "{WATCH_ERROR_QUIET:?} without an error"
    );
    for kind in ["unauthorized", "api", "unreachable", "other"] {
        assert_eq!(watch_errors(&metrics, kind), 0.0, "{kind}");
    }

    shutdown.cancel();
    daemon.await.unwrap();
    drop(open);
}

fn api_error(code: u16, reason: &str) -> kube::Error {
    kube::Error::Api(Box::new(
        kube::core::Status::failure("refused", reason).with_code(code),
    ))
}

fn io_error() -> std::io::Error {
    std::io::Error::from(std::io::ErrorKind::ConnectionRefused)
}

#[rstest]
#[case::credential_refused(
    kube::runtime::watcher::Error::WatchStartFailed(api_error(401, "Unauthorized")),
    "unauthorized"
)]
#[case::no_credential(
    kube::runtime::watcher::Error::InitialListFailed(kube::Error::Auth(
        kube::client::AuthError::UnrefreshableTokenResponse
    )),
    "unauthorized"
)]
#[case::rbac(
    kube::runtime::watcher::Error::InitialListFailed(api_error(403, "Forbidden")),
    "forbidden"
)]
#[case::rbac_in_stream(
    kube::runtime::watcher::Error::WatchError(Box::new(
        kube::core::Status::failure("refused", "Forbidden").with_code(403)
    )),
    "forbidden"
)]
#[case::expired(
    kube::runtime::watcher::Error::WatchError(Box::new(
        kube::core::Status::failure("too old resource version", "Expired").with_code(410)
    )),
    "gone"
)]
#[case::server_error(
    kube::runtime::watcher::Error::InitialListFailed(api_error(500, "InternalError")),
    "api"
)]
#[case::throttled(
    kube::runtime::watcher::Error::WatchStartFailed(api_error(429, "TooManyRequests")),
    "api"
)]
#[case::no_connection(
    kube::runtime::watcher::Error::WatchStartFailed(kube::Error::Service(Box::new(io_error()))),
    "unreachable"
)]
#[case::stream_broke(
    kube::runtime::watcher::Error::WatchFailed(kube::Error::ReadEvents(io_error())),
    "unreachable"
)]
#[case::unreadable(
    kube::runtime::watcher::Error::InitialListFailed(kube::Error::SerdeError(
        serde_json::from_str::<u8>("x").unwrap_err()
    )),
    "other"
)]
#[case::no_version(kube::runtime::watcher::Error::NoResourceVersion, "other")]
fn watch_errors_are_counted_by_kind(
    #[case] error: kube::runtime::watcher::Error,
    #[case] kind: &str,
) {
    let metrics = Metrics::new();
    metrics.watch_error(&error);
    for each in fixup_host::metrics::WATCH_ERROR_KINDS {
        let expected = if each == kind { 1.0 } else { 0.0 };
        assert_eq!(watch_errors(&metrics, each), expected, "{error}: {each}");
    }
}
