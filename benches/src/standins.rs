//! What the host talks to, in a process of its own: a fake Kubernetes API
//! server on loopback and a `cocoon` runner on a Unix socket.
//!
//! The storm and the `serve` run measure the host's process only: the pod
//! store, its events and the runner's per-VM records live here, in the
//! child `fixup-bench standins` starts, and the host reaches them the way a
//! daemon reaches the real ones: the real `kube` client over HTTP, and a
//! request per exec or inspect ([`RemoteCocoon`]).
//!
//! The API server serves what the host uses, for many pods: `GET` and
//! `PATCH` (merge patch of annotations under the `metadata.uid`
//! precondition and, when the patch has one, the `metadata.resourceVersion`
//! one; 409 otherwise) of `/api/v1/namespaces/<ns>/pods/<name>`,
//! `POST` of `events.k8s.io/v1` events (counted, not kept), and the list
//! and watch of `/api/v1/pods` (kube-runtime's watcher). Two routes are the
//! bench's own: `GET /bench/state` (counts, and every pod's annotations) and
//! `POST /bench/touch?count=N` (changes N idle pods, then makes the marker pod
//! need a fixup again; each change a `MODIFIED` watch event).
//!
//! The pods: `fixups` storm pods ([`Case::pod`], each a clone that needs a
//! fixup), then `idle` pods that need nothing (not managed by a stack), then
//! one marker pod, not managed until `touch` makes it a clone that needs a
//! fixup: when the host patches it, every event before it was handled.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use fixup_core::facts::{PodInput, VmId, VmInspect};
use fixup_host::cocoon::{Cocoon, CocoonError, ExecOutput, ExitStatusKind};
use http::{Method, StatusCode, Uri};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::broadcast;

use crate::cases::{Case, NAMESPACE};

/// The node every stand-in pod is scheduled to.
pub const NODE: &str = "bench-node";

/// How the stand-ins are set up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StandinsConfig {
    /// Clone pods that need a fixup ([`Case::cycle`]).
    pub fixups: usize,
    /// Pods that need nothing.
    pub idle: usize,
    /// How long an exec takes to answer.
    pub exec_delay_ms: u64,
    /// The first exec of every VM whose index is a multiple of this fails
    /// (0: none).
    pub fail_first_every: usize,
}

/// What `fixup-bench standins` prints on its first line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ready {
    /// `http://127.0.0.1:PORT`.
    pub api: String,
    /// The runner's Unix socket.
    pub socket: PathBuf,
    /// The stand-ins' process id, to read its memory.
    pub pid: u32,
}

/// What `GET /bench/state` answers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Observed {
    pub requests: u64,
    pub patches: u64,
    pub conflicts: u64,
    pub events: u64,
    /// Listings of a pod's events (the wake rule of spec section 2).
    pub event_lists: u64,
    pub execs: u64,
    pub inspects: u64,
    /// Watch streams open now.
    #[serde(default)]
    pub watchers: usize,
    /// The most execs that were running at once.
    #[serde(default)]
    pub most_execs_at_once: u64,
    /// Requests no route serves, as `METHOD path`.
    pub unexpected: Vec<String>,
    /// Every pod's annotations, by name (`GET /bench/state?annotations=1`).
    #[serde(default)]
    pub annotations: HashMap<String, HashMap<String, String>>,
}

/// The marker pod's name.
pub fn marker_name(config: &StandinsConfig) -> String {
    Case::OciNetworkd.pod_name(config.fixups + config.idle)
}

fn idle_name(i: usize) -> String {
    format!("idle-{i}")
}

/// `input` as the API server returns it.
pub fn pod_object(input: &PodInput) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": input.name,
            "namespace": input.namespace,
            "uid": input.uid,
            "resourceVersion": "1",
            "annotations": input.annotations,
            "labels": {"app": "bench"},
        },
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "vm", "image": "cocoon/vm"}],
        },
        "status": {"phase": "Running"},
    })
}

struct Api {
    pods: HashMap<String, Value>,
    order: Vec<String>,
    resource_version: u64,
    observed: Observed,
}

#[derive(Clone)]
struct Shared {
    api: Arc<Mutex<Api>>,
    changes: broadcast::Sender<Arc<String>>,
    config: Arc<StandinsConfig>,
    runner: Arc<Runner>,
}

/// The runner's per-VM records.
struct Runner {
    vms: HashMap<String, (String, bool)>,
    attempts: Mutex<HashMap<String, u32>>,
    delay: Duration,
    execs: AtomicU64,
    inspects: AtomicU64,
    running: AtomicU64,
    most_running: AtomicU64,
}

fn path_of(namespace: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/pods/{name}")
}

fn build(config: &StandinsConfig) -> (Api, Runner) {
    let mut api = Api {
        pods: HashMap::new(),
        order: Vec::new(),
        resource_version: 1,
        observed: Observed::default(),
    };
    let mut vms = HashMap::new();
    let add = |api: &mut Api, input: &PodInput| {
        let path = path_of(&input.namespace, &input.name);
        api.order.push(path.clone());
        api.pods.insert(path, pod_object(input));
    };
    for i in 0..config.fixups {
        let case = Case::cycle(i);
        add(&mut api, &case.pod(i));
        let fail_first = config.fail_first_every > 0 && i % config.fail_first_every == 0;
        vms.insert(case.vm_id(i), (case.inspect_json(i), fail_first));
    }
    for i in 0..config.idle {
        let input = PodInput {
            name: idle_name(i),
            namespace: NAMESPACE.to_owned(),
            uid: Some(format!("00000000-0000-4000-9000-{i:012}")),
            annotations: Default::default(),
            deleting: false,
            resource_version: None,
        };
        add(&mut api, &input);
    }
    let m = config.fixups + config.idle;
    let mut marker = Case::OciNetworkd.pod(m);
    marker.annotations.clear();
    add(&mut api, &marker);
    vms.insert(
        Case::OciNetworkd.vm_id(m),
        (Case::OciNetworkd.inspect_json(m), false),
    );
    let runner = Runner {
        vms,
        attempts: Mutex::new(HashMap::new()),
        delay: Duration::from_millis(config.exec_delay_ms),
        execs: AtomicU64::new(0),
        inspects: AtomicU64::new(0),
        running: AtomicU64::new(0),
        most_running: AtomicU64::new(0),
    };
    (api, runner)
}

/// Serve until stdin closes (the parent went away). Prints [`Ready`] as
/// one JSON line first.
pub fn run(config: StandinsConfig) -> anyhow::Result<()> {
    serve(
        config,
        |ready| {
            println!("{}", serde_json::to_string(&ready)?);
            Ok(())
        },
        async {
            let _ = tokio::task::spawn_blocking(|| {
                let mut sink = Vec::new();
                let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
            })
            .await;
        },
    )
}

/// Build the stand-ins on a runtime of their own, tell `ready`, serve
/// until `until` ends.
fn serve(
    config: StandinsConfig,
    ready: impl FnOnce(Ready) -> anyhow::Result<()>,
    until: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let scratch = tempfile::tempdir()?;
        let socket = scratch.path().join("cocoon.sock");
        let (api, runner) = build(&config);
        let (changes, _) = broadcast::channel(65536);
        let shared = Shared {
            api: Arc::new(Mutex::new(api)),
            changes,
            config: Arc::new(config),
            runner: Arc::new(runner),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = Router::new().fallback(handle).with_state(shared.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let unix = tokio::net::UnixListener::bind(&socket)?;
        let runner = shared.runner.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = unix.accept().await {
                tokio::spawn(answer(stream, runner.clone()));
            }
        });
        ready(Ready {
            api: format!("http://{addr}"),
            socket: socket.clone(),
            pid: std::process::id(),
        })?;
        until.await;
        Ok(())
    })
}

fn json_response(status: StatusCode, body: String) -> Response {
    (
        status,
        [(http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

fn status_body(code: u16, reason: &str, message: &str) -> String {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "code": code, "reason": reason, "message": message})
    .to_string()
}

fn param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|p| p.strip_prefix(key)?.strip_prefix('='))
}

/// Set `pod`'s resource version and annotations from `changes` (a null
/// removes), and tell the watchers.
fn modify(shared: &Shared, api: &mut Api, path: &str, changes: &Map<String, Value>) {
    api.resource_version += 1;
    let version = api.resource_version.to_string();
    let pod = api.pods.get_mut(path).expect("a known pod");
    let meta = pod["metadata"].as_object_mut().expect("metadata");
    meta.insert("resourceVersion".into(), json!(version));
    let annotations = meta
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .expect("annotations");
    for (k, v) in changes {
        if v.is_null() {
            annotations.remove(k);
        } else {
            annotations.insert(k.clone(), v.clone());
        }
    }
    // Watchers ask for metadata only (the host's does).
    let _ = shared.changes.send(Arc::new(format!(
        "{{\"type\":\"MODIFIED\",\"object\":{}}}\n",
        metadata_only(pod)
    )));
}

/// `pod` as `PartialObjectMetadata`, what the API server sends a client
/// that asks for metadata only.
fn metadata_only(pod: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": pod["metadata"]})
}

/// Whether the client asked for metadata only (the `Accept` header).
fn wants_metadata(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("as=PartialObjectMetadata"))
}

async fn handle(
    State(shared): State<Shared>,
    method: Method,
    uri: Uri,
    headers: http::HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path();
    let query = uri.query().unwrap_or("");
    let meta_only = wants_metadata(&headers);
    let shape = |pod: &Value| {
        if meta_only {
            metadata_only(pod).to_string()
        } else {
            pod.to_string()
        }
    };
    let mut api = shared.api.lock().expect("stand-in state");
    api.observed.requests += 1;
    // The host reads and writes pods' metadata only: a request for a whole
    // pod (or a list of them) is one it should not make.
    let pod_request = path == "/api/v1/pods" || api.pods.contains_key(path);
    if pod_request && !meta_only {
        api.observed
            .unexpected
            .push(format!("{method} {uri} without metadata-only Accept"));
    }
    match (&method, path) {
        (&Method::GET, p) if api.pods.contains_key(p) => {
            json_response(StatusCode::OK, shape(&api.pods[p]))
        }
        (&Method::PATCH, p) if api.pods.contains_key(p) => {
            let patch: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let uid = api.pods[p]["metadata"]["uid"].clone();
            if patch["metadata"]["uid"] != uid {
                api.observed.conflicts += 1;
                let message = format!(
                    "Precondition failed: UID in precondition: {}, UID in object meta: {uid}",
                    patch["metadata"]["uid"]
                );
                return json_response(StatusCode::CONFLICT, status_body(409, "Conflict", &message));
            }
            // A resourceVersion in the patch is a precondition too.
            let version = &patch["metadata"]["resourceVersion"];
            if !version.is_null() && *version != api.pods[p]["metadata"]["resourceVersion"] {
                api.observed.conflicts += 1;
                let message = "Operation cannot be fulfilled on pods: the object has been modified; please apply your changes to the latest version and try again";
                return json_response(StatusCode::CONFLICT, status_body(409, "Conflict", message));
            }
            api.observed.patches += 1;
            let changes = patch["metadata"]["annotations"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            modify(&shared, &mut api, p, &changes);
            json_response(StatusCode::OK, shape(&api.pods[p]))
        }
        // The events about a pod, for the wake rule: the stack wrote none.
        (&Method::GET, p) if p.starts_with("/apis/events.k8s.io/v1/namespaces/") => {
            api.observed.event_lists += 1;
            json_response(
                StatusCode::OK,
                json!({"apiVersion": "events.k8s.io/v1", "kind": "EventList", "metadata": {}, "items": []})
                    .to_string(),
            )
        }
        (&Method::POST, p) if p.starts_with("/apis/events.k8s.io/v1/namespaces/") => {
            api.observed.events += 1;
            let mut event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            event["metadata"]["name"] = json!(format!("event-{}", api.observed.events));
            json_response(StatusCode::CREATED, event.to_string())
        }
        (&Method::GET, "/api/v1/pods") if param(query, "watch") == Some("true") => {
            let rx = shared.changes.subscribe();
            drop(api);
            let stream = futures::stream::unfold(rx, |mut rx| async move {
                loop {
                    match rx.recv().await {
                        Ok(line) => {
                            return Some((
                                Ok::<_, Infallible>(Bytes::from(line.as_str().to_owned())),
                                rx,
                            ));
                        }
                        Err(broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            });
            Response::builder()
                .status(StatusCode::OK)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from_stream(stream))
                .expect("a response")
        }
        (&Method::GET, "/api/v1/pods") => {
            // Pages as the client asks (`limit`, `continue` = an offset).
            let limit = param(query, "limit")
                .and_then(|l| l.parse::<usize>().ok())
                .filter(|&l| l > 0)
                .unwrap_or(usize::MAX);
            let start = param(query, "continue")
                .and_then(|c| c.parse::<usize>().ok())
                .unwrap_or(0);
            let end = start.saturating_add(limit).min(api.order.len());
            let items: Vec<Value> = api.order[start.min(end)..end]
                .iter()
                .map(|p| {
                    if meta_only {
                        metadata_only(&api.pods[p])
                    } else {
                        api.pods[p].clone()
                    }
                })
                .collect();
            let mut metadata = json!({"resourceVersion": api.resource_version.to_string()});
            if end < api.order.len() {
                metadata["continue"] = json!(end.to_string());
            }
            let kind = if meta_only {
                json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList"})
            } else {
                json!({"apiVersion": "v1", "kind": "PodList"})
            };
            let list = json!({"apiVersion": kind["apiVersion"], "kind": kind["kind"], "metadata": metadata, "items": items});
            json_response(StatusCode::OK, list.to_string())
        }
        (&Method::GET, "/bench/state") => {
            let mut observed = api.observed.clone();
            observed.execs = shared.runner.execs.load(Ordering::Relaxed);
            observed.inspects = shared.runner.inspects.load(Ordering::Relaxed);
            observed.watchers = shared.changes.receiver_count();
            observed.most_execs_at_once = shared.runner.most_running.load(Ordering::Relaxed);
            if param(query, "annotations").is_some() {
                for pod in api.pods.values() {
                    let name = pod["metadata"]["name"].as_str().unwrap_or("").to_owned();
                    let annotations = pod["metadata"]["annotations"]
                        .as_object()
                        .map(|a| {
                            a.iter()
                                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                                .collect()
                        })
                        .unwrap_or_default();
                    observed.annotations.insert(name, annotations);
                }
            }
            json_response(
                StatusCode::OK,
                serde_json::to_string(&observed).expect("serializes"),
            )
        }
        (&Method::POST, "/bench/touch") => {
            let count = param(query, "count")
                .and_then(|c| c.parse::<usize>().ok())
                .unwrap_or(0)
                .min(shared.config.idle);
            for i in 0..count {
                let path = path_of(NAMESPACE, &idle_name(i));
                let mut changes = Map::new();
                changes.insert(
                    "bench/touched".into(),
                    json!(api.resource_version.to_string()),
                );
                modify(&shared, &mut api, &path, &changes);
            }
            // The marker becomes a clone that needs a fixup: its stack's
            // annotations, and none of the host's from an earlier fixup.
            let marker = Case::OciNetworkd.pod(shared.config.fixups + shared.config.idle);
            let mut changes: Map<String, Value> = marker
                .annotations
                .iter()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect();
            let path = path_of(&marker.namespace, &marker.name);
            if let Some(now) = api.pods[&path]["metadata"]["annotations"].as_object() {
                for key in now.keys() {
                    changes.entry(key.clone()).or_insert(Value::Null);
                }
            }
            modify(&shared, &mut api, &path, &changes);
            json_response(StatusCode::OK, json!({"touched": count}).to_string())
        }
        _ => {
            api.observed.unexpected.push(format!("{method} {uri}"));
            json_response(
                StatusCode::NOT_FOUND,
                status_body(404, "NotFound", &format!("{method} {path} is not served")),
            )
        }
    }
}

/// A request to the runner, one JSON line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum RunnerRequest {
    Exec { vm: String, argv: Vec<String> },
    Inspect { vm: String },
}

/// The runner's answer, one JSON line.
#[derive(Debug, Serialize, Deserialize)]
struct RunnerAnswer {
    /// Exit code, or `None` when there is no such VM.
    code: Option<i32>,
    /// Inspect JSON, or the exec's stderr.
    output: String,
}

/// What a failed first attempt prints on stderr.
const FAILED_STDERR: &str = "networkctl: link busy\n";

async fn answer(stream: tokio::net::UnixStream, runner: Arc<Runner>) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    if BufReader::new(read).read_line(&mut line).await.is_err() {
        return;
    }
    let answer = match serde_json::from_str::<RunnerRequest>(&line) {
        Ok(RunnerRequest::Inspect { vm }) => {
            runner.inspects.fetch_add(1, Ordering::Relaxed);
            match runner.vms.get(&vm) {
                Some((json, _)) => RunnerAnswer {
                    code: Some(0),
                    output: json.clone(),
                },
                None => RunnerAnswer {
                    code: None,
                    output: "no such VM".into(),
                },
            }
        }
        Ok(RunnerRequest::Exec { vm, argv }) => {
            runner.execs.fetch_add(1, Ordering::Relaxed);
            let attempt = {
                let mut attempts = runner.attempts.lock().expect("attempts");
                let n = attempts.entry(vm.clone()).or_default();
                *n += 1;
                *n
            };
            let running = runner.running.fetch_add(1, Ordering::SeqCst) + 1;
            runner.most_running.fetch_max(running, Ordering::SeqCst);
            tokio::time::sleep(runner.delay).await;
            runner.running.fetch_sub(1, Ordering::SeqCst);
            match runner.vms.get(&vm) {
                None => RunnerAnswer {
                    code: None,
                    output: "no such VM".into(),
                },
                Some((_, true)) if attempt == 1 => RunnerAnswer {
                    code: Some(1),
                    output: FAILED_STDERR.into(),
                },
                // A guest that ran the whole script ends with the done
                // marker under this exec's nonce.
                Some(_) => RunnerAnswer {
                    code: Some(0),
                    output: match fixup_core::plan::exec_nonce(&argv) {
                        Some(nonce) => format!("\n{}\n", fixup_core::plan::done_marker(&nonce)),
                        None => String::new(),
                    },
                },
            }
        }
        Err(e) => RunnerAnswer {
            code: None,
            output: format!("bad request: {e}"),
        },
    };
    let mut text = serde_json::to_string(&answer).expect("serializes");
    text.push('\n');
    let _ = write.write_all(text.as_bytes()).await;
}

/// The host's side of the runner: one connection per call to the
/// stand-ins' socket, as the real runner is one process per call.
#[derive(Debug, Clone)]
pub struct RemoteCocoon {
    socket: Arc<Path>,
}

impl RemoteCocoon {
    pub fn new(socket: &Path) -> Self {
        RemoteCocoon {
            socket: Arc::from(socket),
        }
    }

    /// `request`, answered within `timeout`.
    async fn ask_within(
        &self,
        request: &RunnerRequest,
        what: &str,
        timeout: Duration,
    ) -> Result<RunnerAnswer, CocoonError> {
        tokio::time::timeout(timeout, self.ask(request, what))
            .await
            .map_err(|_| CocoonError::Timeout {
                what: what.to_owned(),
                after: timeout,
            })?
    }

    async fn ask(&self, request: &RunnerRequest, what: &str) -> Result<RunnerAnswer, CocoonError> {
        let spawn = |e: std::io::Error| CocoonError::Spawn {
            program: self.socket.to_path_buf(),
            source_text: e.to_string(),
        };
        let stream = tokio::net::UnixStream::connect(&*self.socket)
            .await
            .map_err(spawn)?;
        let (read, mut write) = stream.into_split();
        let mut text = serde_json::to_string(request).expect("serializes");
        text.push('\n');
        write.write_all(text.as_bytes()).await.map_err(spawn)?;
        let mut line = String::new();
        BufReader::new(read)
            .read_line(&mut line)
            .await
            .map_err(spawn)?;
        serde_json::from_str(&line).map_err(|e| CocoonError::BadOutput {
            what: what.to_owned(),
            reason: e.to_string(),
        })
    }
}

impl Cocoon for RemoteCocoon {
    async fn exec(
        &self,
        vm: &VmId,
        argv: &[String],
        timeout: Duration,
    ) -> Result<ExecOutput, CocoonError> {
        let what = format!("cocoon vm exec {vm}");
        let request = RunnerRequest::Exec {
            vm: vm.as_str().to_owned(),
            argv: argv.to_vec(),
        };
        let answer = self.ask_within(&request, &what, timeout).await?;
        Ok(ExecOutput {
            status: ExitStatusKind::Code(answer.code.unwrap_or(1)),
            stdout: Vec::new(),
            stderr: answer.output.into_bytes(),
            stderr_cut: false,
        })
    }

    async fn inspect(&self, vm: &VmId, timeout: Duration) -> Result<VmInspect, CocoonError> {
        let what = format!("cocoon vm inspect {vm}");
        let request = RunnerRequest::Inspect {
            vm: vm.as_str().to_owned(),
        };
        let answer = self.ask_within(&request, &what, timeout).await?;
        if answer.code != Some(0) {
            return Err(CocoonError::Failed {
                what,
                status: ExitStatusKind::Code(1),
                stderr_tail: fixup_core::plan::StderrTail::new(answer.output.as_bytes()),
            });
        }
        VmInspect::from_json(&answer.output, "cocoon vm inspect").map_err(|e| {
            CocoonError::BadOutput {
                what,
                reason: e.to_string(),
            }
        })
    }
}

/// Where the stand-ins run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// A child process (`fixup-bench standins`, this executable): the
    /// measured process holds none of their memory.
    Process,
    /// A thread of this process, for tests (whose executable is not
    /// `fixup-bench`).
    Thread,
}

/// Running stand-ins; they stop when this is dropped.
#[derive(Debug)]
pub struct Standins {
    running: Running,
    pub ready: Ready,
}

#[derive(Debug)]
enum Running {
    Child(std::process::Child),
    Thread(
        Option<tokio::sync::oneshot::Sender<()>>,
        Option<std::thread::JoinHandle<anyhow::Result<()>>>,
    ),
}

impl Standins {
    /// Start the stand-ins with `config`, in `place`.
    pub fn start(config: &StandinsConfig, place: Place) -> anyhow::Result<Standins> {
        match place {
            Place::Process => Self::start_process(config),
            Place::Thread => Self::start_thread(config),
        }
    }

    fn start_thread(config: &StandinsConfig) -> anyhow::Result<Standins> {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let config = config.clone();
        let thread = std::thread::spawn(move || {
            serve(config, |ready| Ok(ready_tx.send(ready)?), async {
                let _ = stopped.await;
            })
        });
        let ready = ready_rx
            .recv()
            .map_err(|_| anyhow::anyhow!("the stand-ins thread did not start"))?;
        Ok(Standins {
            running: Running::Thread(Some(stop), Some(thread)),
            ready,
        })
    }

    fn start_process(config: &StandinsConfig) -> anyhow::Result<Standins> {
        let exe = std::env::current_exe()?;
        let mut child = std::process::Command::new(exe)
            .args([
                "standins",
                "--fixups",
                &config.fixups.to_string(),
                "--idle",
                &config.idle.to_string(),
                "--exec-delay-ms",
                &config.exec_delay_ms.to_string(),
                "--fail-first-every",
                &config.fail_first_every.to_string(),
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().expect("piped");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)?;
        let ready: Ready = serde_json::from_str(&line)
            .map_err(|e| anyhow::anyhow!("the stand-ins did not start ({e}): {line:?}"))?;
        Ok(Standins {
            running: Running::Child(child),
            ready,
        })
    }

    /// A `kube` client for the fake API server.
    pub fn client(&self) -> anyhow::Result<kube::Client> {
        let config = kube::Config::new(self.ready.api.parse()?);
        Ok(kube::Client::try_from(config)?)
    }

    /// What the stand-ins saw, optionally with every pod's annotations.
    pub async fn observed(
        &self,
        client: &kube::Client,
        annotations: bool,
    ) -> anyhow::Result<Observed> {
        let uri = if annotations {
            "/bench/state?annotations=1"
        } else {
            "/bench/state"
        };
        let request = http::Request::get(uri).body(Vec::new())?;
        Ok(serde_json::from_str(&client.request_text(request).await?)?)
    }

    /// Change `count` idle pods, then the marker (see the module docs).
    pub async fn touch(&self, client: &kube::Client, count: usize) -> anyhow::Result<()> {
        let request = http::Request::post(format!("/bench/touch?count={count}")).body(Vec::new())?;
        client.request_text(request).await?;
        Ok(())
    }

    /// The stand-ins' resident memory, KiB.
    pub fn rss_kib(&self) -> u64 {
        crate::process::status_kib_of(self.ready.pid, "VmRSS").unwrap_or(0)
    }
}

impl Drop for Standins {
    fn drop(&mut self) {
        match &mut self.running {
            Running::Child(child) => {
                drop(child.stdin.take());
                let _ = child.wait();
            }
            Running::Thread(stop, thread) => {
                if let Some(stop) = stop.take() {
                    let _ = stop.send(());
                }
                if let Some(thread) = thread.take() {
                    let _ = thread.join();
                }
            }
        }
    }
}
