//! The conformance suite (`tests/conformance/*.json`, docs/conformance.md)
//! replayed through the daemon's real executor: `Host::handle_pod` with
//! the real planner and built-in plugins, the real `kube` client
//! (`KubeApi`) against a tower-test mock API server that answers from the
//! scenario's world, a `cocoon` stand-in that answers from the same world,
//! and the real lease watcher over a lease file the world writes when a
//! lease appears. Time is tokio's, paused: a 180 s budget runs in
//! milliseconds, and every write, exec and event is seen at the time the
//! scenario expects.
//!
//! The same files are replayed through the decision alone
//! (`fixup_kit::conformance`) and through the C library's op,
//! so a behaviour the daemon gets differently from the others fails here.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use fixup_core::decision::PodError;
use fixup_core::facts::{VmId, VmInspect};
use fixup_core::memory::MemoryStore;
use fixup_core::planner::{Planner, PlannerOptions};
use fixup_host::cocoon::{Cocoon, CocoonError, ExecOutput};
use fixup_host::console::{Console, ConsoleSession};
use fixup_host::host::{Host, HostConfig};
use fixup_host::kube::{KubeApi, REPORTER, RetryPolicy};
use fixup_host::metrics::Metrics;
use fixup_host::node_pods::{NodePods, OtherPods};
use fixup_host::ready::{DEFAULT_LEASE_POLL, LeaseWatcher};
use fixup_kit::conformance::{Ended, Scenario, Suite, Waited, World, pod_json};
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

type Shared = Arc<Mutex<World>>;

/// The world's clock: tokio's (paused) time since the replay started.
#[derive(Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn now(self) -> Duration {
        self.0.elapsed()
    }
}

/// `cocoon` answering from the world.
struct WorldCocoon {
    world: Shared,
    clock: Clock,
}

impl Cocoon for WorldCocoon {
    async fn exec(
        &self,
        vm: &VmId,
        argv: &[String],
        timeout: Duration,
    ) -> Result<ExecOutput, CocoonError> {
        let (takes, result) = {
            let mut world = self.world.lock().unwrap();
            let purpose = world.purpose_of(argv);
            world.exec(self.clock.now(), vm.as_str(), purpose, argv, timeout)
        };
        tokio::time::sleep(takes).await;
        result.map_err(|reason| CocoonError::BadOutput {
            what: "cocoon vm exec".to_owned(),
            reason,
        })
    }

    async fn inspect(&self, vm: &VmId, _timeout: Duration) -> Result<VmInspect, CocoonError> {
        let result = self.world.lock().unwrap().inspect(self.clock.now(), vm);
        result.map_err(|reason| CocoonError::BadOutput {
            what: "cocoon vm inspect".to_owned(),
            reason,
        })
    }
}

/// The VMs' serial consoles answering from the world. Opening and each set
/// take no time here (the console client's own timing is tested in
/// fixup-sac and against the simulator).
#[derive(Clone)]
struct WorldConsole {
    world: Shared,
    clock: Clock,
}

impl std::fmt::Debug for WorldConsole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorldConsole")
    }
}

impl Console for WorldConsole {
    fn open(
        &self,
        vm: &VmId,
        need: usize,
        _stop: fixup_sac::StopCheck,
        deadline: fixup_sac::Deadline,
    ) -> Result<(Vec<u32>, Box<dyn ConsoleSession>), fixup_sac::SacError> {
        let mut now = self.clock.now();
        let until = task_clock(now, deadline);
        let opened = self
            .world
            .lock()
            .unwrap()
            .sac_open_until(&mut now, vm.as_str(), need, until);
        match opened {
            Waited::Done(result) => {
                result.map(|nets| (nets, Box::new(self.clone()) as Box<dyn ConsoleSession>))
            }
            Waited::Cancelled => Err(fixup_sac::SacError::Stopped),
        }
    }
}

impl ConsoleSession for WorldConsole {
    fn set(
        &mut self,
        net: u32,
        nic: &fixup_sac::StaticNic,
        deadline: fixup_sac::Deadline,
    ) -> Result<(), fixup_sac::SacError> {
        let mut now = self.clock.now();
        let until = task_clock(now, deadline);
        match self
            .world
            .lock()
            .unwrap()
            .sac_set_until(&mut now, net, nic.ip, until)
        {
            Waited::Done(result) => result,
            Waited::Cancelled => Err(fixup_sac::SacError::Stopped),
        }
    }
}

/// The pass's deadline on the world's clock (now `now`), and its total.
fn task_clock(
    now: std::time::Duration,
    deadline: fixup_sac::Deadline,
) -> (std::time::Duration, std::time::Duration) {
    let left = deadline
        .at
        .saturating_duration_since(std::time::Instant::now());
    (now + left, deadline.total)
}

fn status(code: u16, reason: &str) -> (StatusCode, Value) {
    (
        StatusCode::from_u16(code).unwrap(),
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": reason, "code": code}),
    )
}

fn error_answer(e: &PodError) -> (StatusCode, Value) {
    match e {
        PodError::Gone { .. } => status(404, "NotFound"),
        PodError::Refused { .. } => status(403, "Forbidden"),
        PodError::Api { .. } => status(503, "ServiceUnavailable"),
    }
}

/// The API server, answering from the world: the pod's GET and PATCH,
/// and event POSTs.
async fn serve_world(
    world: Shared,
    clock: Clock,
    pod_path: String,
    events_path: String,
    mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
) {
    while let Some((request, respond)) = handle.next_request().await {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.expect("request body");
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("a JSON body")
        };
        let now = clock.now();
        let mut world = world.lock().unwrap();
        let (code, answer) = match (&parts.method, parts.uri.path()) {
            (&Method::GET, path) if path == pod_path => match world.read(now) {
                Ok(Some(pod)) => (StatusCode::OK, pod_json(&pod)),
                Ok(None) => status(404, "NotFound"),
                Err(e) => error_answer(&e),
            },
            (&Method::PATCH, path) if path == pod_path => {
                let metadata = &body["metadata"];
                let uid = metadata["uid"].as_str().expect("every patch has a uid");
                let version = metadata["resourceVersion"].as_str();
                let patch = metadata["annotations"]
                    .as_object()
                    .map(|a| {
                        a.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().map(str::to_owned)))
                            .collect()
                    })
                    .unwrap_or_default();
                match world.patch(now, uid, &patch, version) {
                    Ok(fixup_core::decision::Guarded::Written(Some(pod))) => {
                        (StatusCode::OK, pod_json(&pod))
                    }
                    Ok(fixup_core::decision::Guarded::Written(None)) => (StatusCode::OK, json!({})),
                    Ok(fixup_core::decision::Guarded::Changed(_)) => status(409, "Conflict"),
                    Err(e) => error_answer(&e),
                }
            }
            (&Method::GET, path) if path == events_path => {
                // One listing per field selector, as the API server
                // selects (a field it cannot select by is refused).
                let query = parts.uri.query().unwrap_or_default();
                let selector = form_urlencoded::parse(query.as_bytes())
                    .find_map(|(key, value)| (key == "fieldSelector").then(|| value.into_owned()))
                    .expect("the host selects the events by a field selector");
                match world.events(now, &selector) {
                    // A listing the world cut short goes on, as the API
                    // server's pages do: the host reads its pages and
                    // stops, knowing more were left.
                    Ok(listed) => (
                        StatusCode::OK,
                        json!({
                            "apiVersion": "events.k8s.io/v1",
                            "kind": "EventList",
                            "metadata": if listed.truncated { json!({"continue": "more"}) } else { json!({}) },
                            "items": listed.events.iter().map(|e| {
                                let mut event = e.to_value();
                                event["metadata"] = json!({"name": "e", "namespace": "prod"});
                                event
                            }).collect::<Vec<_>>(),
                        }),
                    ),
                    Err(_) => status(403, "Forbidden"),
                }
            }
            (&Method::POST, path) if path == events_path => {
                let reason = body["reason"].as_str().unwrap_or_default();
                let note = body["note"].as_str().unwrap_or_default();
                match world.event(now, reason, note) {
                    Ok(()) => (StatusCode::CREATED, body.clone()),
                    Err(e) => error_answer(&e),
                }
            }
            (method, path) => panic!("the host asked {method} {path}, which nothing serves"),
        };
        drop(world);
        respond.send_response(
            Response::builder()
                .status(code)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                .unwrap(),
        );
    }
}

fn pod_uid(pod: &fixup_core::facts::PodInput) -> String {
    pod.uid.clone().expect("a scenario's pod has a uid")
}

/// Write the leases of `scenario` that have appeared by `at` into `file`,
/// as cocoon-net does, and tell the watcher.
fn write_leases(file: &Path, scenario: &Scenario, at: Duration) {
    let tmp = file.with_extension("tmp");
    if scenario.lease_file_unusable {
        std::fs::write(&tmp, b"{\"leases\": \"elsewhere\"}").unwrap();
        std::fs::rename(&tmp, file).unwrap();
        return;
    }
    let rows: Vec<Value> = scenario
        .leases
        .iter()
        .filter(|l| Duration::from_millis(l.at_ms) <= at)
        .map(|l| json!({"mac": l.mac, "ip": l.ip.to_string(), "expiry": "2100-01-01T00:00:00Z"}))
        .collect();
    std::fs::write(&tmp, serde_json::to_vec(&rows).unwrap()).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

async fn replay(scenario: &Scenario, planner: Arc<Planner>, lease_dir: &Path) -> (World, Ended) {
    let clock = Clock(Instant::now());
    let world: Shared = Arc::new(Mutex::new(World::new(scenario)));
    let pod = world.lock().unwrap().first_read();
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(serve_world(
        world.clone(),
        clock,
        format!("/api/v1/namespaces/{}/pods/{}", pod.namespace, pod.name),
        format!("/apis/events.k8s.io/v1/namespaces/{}/events", pod.namespace),
        handle,
    ));
    // One request per call: the world's faults are the calls'.
    let api = KubeApi::new(kube::Client::new(service, "default"), REPORTER, None).with_retry(
        RetryPolicy {
            tries: 1,
            ..RetryPolicy::default()
        },
    );
    let lease_file = lease_dir.join("leases.json");
    write_leases(&lease_file, scenario, Duration::ZERO);
    let leases = Arc::new(LeaseWatcher::new(lease_file.clone(), DEFAULT_LEASE_POLL).unwrap());
    let mut appearing: Vec<Duration> = scenario
        .leases
        .iter()
        .map(|l| Duration::from_millis(l.at_ms))
        .filter(|at| !at.is_zero())
        .collect();
    appearing.sort();
    let writer = tokio::spawn({
        let (leases, scenario, file) = (leases.clone(), scenario.clone(), lease_file.clone());
        async move {
            for at in appearing {
                tokio::time::sleep_until(clock.0 + at).await;
                write_leases(&file, &scenario, at);
                leases.changed();
            }
        }
    });
    let shutdown = CancellationToken::new();
    // A host already shutting down when the pod comes: no race with the
    // task's first step.
    if scenario.shutdown_at_ms == Some(0) {
        shutdown.cancel();
    }
    let stopper = scenario.shutdown_at_ms.map(|ms| {
        let token = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(clock.0 + Duration::from_millis(ms)).await;
            token.cancel();
        })
    });
    let config =
        HostConfig::from_settings(scenario.settings(), HostConfig::default().fixups_in_flight);
    // The node's pods as the daemon's watch keeps them: listed once, when
    // the world lets the host see them at all.
    let node_pods = NodePods::new();
    if let Ok(pods) = world.lock().unwrap().other_pods() {
        node_pods.listing_started();
        for pod in &pods {
            node_pods.listed(pod);
        }
        node_pods.listing_done();
    }
    let host = Host::new(
        planner,
        WorldCocoon {
            world: world.clone(),
            clock,
        },
        api,
        leases,
        config,
        Arc::new(Metrics::new()),
    )
    .with_console(Arc::new(WorldConsole {
        world: world.clone(),
        clock,
    }))
    .with_other_pods(OtherPods::Watched(node_pods));
    // The record the host keeps of the pod, in a state directory of its
    // own, read by the wall clock the scenario sets.
    let start_record = world.lock().unwrap().start_record();
    let records = start_record.map(|(record, wall)| {
        let store = Arc::new(MemoryStore::open(&lease_dir.join("state")).unwrap());
        if scenario.watched_since_new {
            // The watch saw the pod new: no lifecycle, no VM yet.
            let new = fixup_core::facts::PodInput {
                annotations: Default::default(),
                ..pod.clone()
            };
            store.observe(&new, true).unwrap();
        }
        store.save(&pod_uid(&pod), &record).unwrap();
        (store, wall)
    });
    // The scenario's wall clock, with or without records: the stack's
    // events are judged by it.
    let at = UNIX_EPOCH + Duration::from_millis(scenario.wall_start_ms);
    let host = host.with_wall_clock(Arc::new(move || at));
    let host = match &records {
        Some((store, _)) => host.with_records(store.clone()),
        None => host,
    };
    let result = match scenario.trigger.fixup() {
        Some(trigger) => host.handle_pod(&pod, trigger, &shutdown).await,
        None => host.prepare_pod(&pod, &shutdown).await,
    };
    drop(host);
    if let Some((store, _)) = records {
        let kept = store.load(&pod_uid(&pod)).unwrap().unwrap_or_default();
        world.lock().unwrap().remember(kept);
    }
    writer.abort();
    if let Some(stopper) = stopper {
        stopper.abort();
    }
    if let Err(e) = server.await {
        std::panic::resume_unwind(e.into_panic());
    }
    let world = Arc::try_unwrap(world)
        .expect("nothing holds the world after the replay")
        .into_inner()
        .unwrap();
    // A stop's `again` is what the daemon's dispatcher waits and tries
    // again with.
    (world, Ended::of(&result, scenario.trigger))
}

#[tokio::test(start_paused = true)]
async fn every_scenario_replays_through_the_daemon() {
    let mut suite = Suite::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    let (planner, failures) = Planner::new(PlannerOptions {
        cocoon_root: suite.cocoon_root().to_owned(),
        ..PlannerOptions::default()
    })
    .unwrap();
    assert!(failures.is_empty(), "{failures:?}");
    let planner = Arc::new(planner);
    for i in 0..suite.scenarios.len() {
        let scenario = suite.scenarios[i].1.clone();
        suite.prepare(&scenario);
        let leases = tempfile::tempdir().unwrap();
        let (world, ended) = replay(&scenario, planner.clone(), leases.path()).await;
        suite.finish(i, &world, &ended);
    }
    suite.assert_passed();
}
