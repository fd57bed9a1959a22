//! A small fake Kubernetes API server on 127.0.0.1, for tests that run the
//! real `cocoon-fixup` binary as a child process.
//!
//! It keeps one pod in memory and serves what the binary uses:
//!
//! - `GET /api/v1/namespaces/<ns>/pods/<name>`: the pod (404 for others);
//! - `PATCH` of the same path: a JSON merge patch of `metadata.annotations`
//!   with the `metadata.uid` precondition, and the `metadata.resourceVersion`
//!   one when the patch has it, answered as the real API server answers
//!   (host/tests/realkube.rs): 422 Invalid for another uid (an immutable
//!   field), 409 Conflict for another version;
//! - `POST /apis/events.k8s.io/v1/namespaces/<ns>/events`: recorded;
//! - `GET` of the same path: the recorded events of that namespace (and
//!   those a test added, [`FakeApi::add_event`]) as an `EventList`, only
//!   those matching a `fieldSelector` of `regarding.uid=`,
//!   `regarding.name=`, `reason=`, `type=` and `reportingController=` terms
//!   when one is given;
//! - `GET /api/v1/pods` (kube-runtime's watcher, `run`'s listing of the
//!   node's pods): the list, the pod and the other pods a test added
//!   ([`FakeApi::add_other_pod`]), and with
//!   `watch=true` a newline-delimited JSON watch stream, kept open. The
//!   pod's changes are streamed only when asked ([`FakeApi::start`]): a
//!   watch event that arrives after the daemon finished the work re-runs
//!   it (see `faults.rs`, `a_stale_watch_event_does_not_rerun_finished_work`),
//!   which a test of something else must not trip over.
//! - [`FakeApi::replace_pod`]: another pod in place of the one kept, told
//!   to open watches as the deletion of the one and the creation of the
//!   other, so a daemon that runs meets a second pod.
//!
//! Anything else is answered 404 and recorded, so a test can assert that
//! nothing unexpected was asked. [`FakeApi::kubeconfig`] writes a
//! kubeconfig that points a client at the server without credentials.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{Method, StatusCode, Uri};
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

/// What the server holds and saw.
#[derive(Debug, Default)]
pub struct ApiState {
    /// The pod, as the API server would return it.
    pub pod: Value,
    resource_version: u64,
    /// Every event body POSTed, in order.
    pub events: Vec<Value>,
    /// Every PATCH body, in order, with the status it got.
    pub patches: Vec<(Value, u16)>,
    /// Other pods on the node: listed beside the pod, never served alone
    /// or changed.
    pub others: Vec<Value>,
    /// Requests no route serves.
    pub unexpected: Vec<String>,
    /// Every request, in order, served or not.
    pub requests: Vec<Request>,
    /// Another writer changes the pod just before the PATCHes of these
    /// indexes (from 0) arrive ([`FakeApi::change_before_patches`]).
    change_before: Vec<usize>,
}

/// One request as the server received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// The query string without the `?`, empty when there is none.
    pub query: String,
}

#[derive(Clone)]
struct Shared {
    state: Arc<Mutex<ApiState>>,
    changes: broadcast::Sender<Value>,
    stream_changes: bool,
}

/// A running fake API server; it stops when dropped.
#[derive(Debug)]
pub struct FakeApi {
    pub addr: SocketAddr,
    state: Arc<Mutex<ApiState>>,
    changes: broadcast::Sender<Value>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeApi {
    /// Serve `pod` (a Pod object; `metadata.resourceVersion` is managed
    /// here) on an ephemeral port of 127.0.0.1. With `stream_changes`,
    /// every accepted PATCH is sent to open watches as `MODIFIED`.
    pub async fn start(pod: Value, stream_changes: bool) -> FakeApi {
        let state = Arc::new(Mutex::new(ApiState {
            pod,
            resource_version: 1,
            ..ApiState::default()
        }));
        state.lock().unwrap().stamp();
        let (changes, _) = broadcast::channel(64);
        let shared = Shared {
            state: state.clone(),
            changes: changes.clone(),
            stream_changes,
        };
        let app = Router::new().fallback(handle).with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("fake API server");
        });
        FakeApi {
            addr,
            state,
            changes,
            server,
        }
    }

    /// The server's base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig for this server, written into `dir`.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            self.addr
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Read the state.
    pub fn with<T>(&self, f: impl FnOnce(&ApiState) -> T) -> T {
        f(&self.state.lock().unwrap())
    }

    /// Keep `pod` (a Pod object, another name or uid) instead of the pod
    /// kept now, as if that one were deleted and `pod` created: each gets
    /// its own new `resourceVersion`, and open watches are sent `DELETED`
    /// of the one, then `ADDED` of the other, whether or not the server
    /// streams its changes ([`FakeApi::start`]). A watch opened later
    /// lists `pod` only. Wait for [`FakeApi::watches`] first when the
    /// daemon must hear of it before it relists.
    pub fn replace_pod(&self, pod: Value) {
        let mut state = self.state.lock().unwrap();
        let mut gone = std::mem::replace(&mut state.pod, pod);
        state.resource_version += 1;
        gone["metadata"]["resourceVersion"] = json!(state.resource_version.to_string());
        state.resource_version += 1;
        state.stamp();
        // Sent while the state is locked: a watch opening now subscribes
        // either before both or after the list that holds `pod`.
        let _ = self
            .changes
            .send(json!({"type": "DELETED", "object": gone}));
        let _ = self
            .changes
            .send(json!({"type": "ADDED", "object": state.pod.clone()}));
    }

    /// Change the pod as another client would (the stack's hibernation or
    /// wake): `change` edits its annotations, the pod gets a new
    /// `resourceVersion`, and open watches are sent `MODIFIED`, whether or
    /// not the server streams its own changes ([`FakeApi::start`]).
    pub fn modify_pod(&self, change: impl FnOnce(&mut Map<String, Value>)) {
        let mut state = self.state.lock().unwrap();
        let annotations = state.pod["metadata"]
            .as_object_mut()
            .unwrap()
            .entry("annotations")
            .or_insert_with(|| Value::Object(Map::new()));
        change(annotations.as_object_mut().unwrap());
        state.resource_version += 1;
        state.stamp();
        let _ = self
            .changes
            .send(json!({"type": "MODIFIED", "object": state.pod.clone()}));
    }

    /// How many watches are open now (kept open until the client goes
    /// away; one that went away may count until its stream is dropped).
    pub fn watches(&self) -> usize {
        self.changes.receiver_count()
    }

    /// One annotation of the pod now.
    pub fn annotation(&self, key: &str) -> Option<String> {
        self.with(|s| {
            s.pod["metadata"]["annotations"][key]
                .as_str()
                .map(str::to_owned)
        })
    }

    /// Another writer changes the pod just before each PATCH whose index
    /// (from 0, refused ones counted) is in `at`: an annotation
    /// `example.com/other-writer` with the index, and a new
    /// `resourceVersion`, so a write decided from an earlier read is
    /// refused as the API server refuses it.
    pub fn change_before_patches(&self, at: &[usize]) {
        self.state.lock().unwrap().change_before = at.to_vec();
    }

    /// Add a pod to the list of the node's pods (another name and uid).
    pub fn add_other_pod(&self, pod: Value) {
        self.state.lock().unwrap().others.push(pod);
    }

    /// Add an event, as if some reporter had created it.
    pub fn add_event(&self, event: Value) {
        self.state.lock().unwrap().events.push(event);
    }

    /// `(reason, note)` of every event so far.
    pub fn events(&self) -> Vec<(String, String)> {
        self.with(|s| {
            s.events
                .iter()
                .map(|e| {
                    (
                        e["reason"].as_str().unwrap_or("").to_owned(),
                        e["note"].as_str().unwrap_or("").to_owned(),
                    )
                })
                .collect()
        })
    }
}

impl ApiState {
    fn stamp(&mut self) {
        self.pod["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
    }

    fn pod_path(&self) -> String {
        format!(
            "/api/v1/namespaces/{}/pods/{}",
            self.pod["metadata"]["namespace"].as_str().unwrap_or(""),
            self.pod["metadata"]["name"].as_str().unwrap_or("")
        )
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "code": code, "reason": reason, "message": message})
}

async fn handle(State(shared): State<Shared>, method: Method, uri: Uri, body: Bytes) -> Response {
    let path = uri.path().to_owned();
    let query = uri.query().unwrap_or("").to_owned();
    let watch = query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1");
    let mut state = shared.state.lock().unwrap();
    state.requests.push(Request {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
    });
    let pod_path = state.pod_path();
    match (&method, path.as_str()) {
        (&Method::GET, p) if p == pod_path => json_response(StatusCode::OK, &state.pod),
        (&Method::PATCH, p) if p == pod_path => {
            let patch: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let index = state.patches.len();
            if state.change_before.contains(&index) {
                state.pod["metadata"]["annotations"]["example.com/other-writer"] =
                    json!(index.to_string());
                state.resource_version += 1;
                state.stamp();
            }
            let uid = state.pod["metadata"]["uid"].clone();
            if patch["metadata"]["uid"] != uid {
                state.patches.push((patch.clone(), 422));
                let message = format!(
                    "Pod {} is invalid: metadata.uid: Invalid value: {}: field is immutable",
                    state.pod["metadata"]["name"], patch["metadata"]["uid"]
                );
                return json_response(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    &status_body(422, "Invalid", &message),
                );
            }
            // A resourceVersion in the patch is a precondition too, as the
            // API server applies it.
            let version = &patch["metadata"]["resourceVersion"];
            if !version.is_null() && *version != state.pod["metadata"]["resourceVersion"] {
                state.patches.push((patch.clone(), 409));
                let message = format!(
                    "Operation cannot be fulfilled on pods {}: the object has been modified; please apply your changes to the latest version and try again",
                    state.pod["metadata"]["name"]
                );
                return json_response(
                    StatusCode::CONFLICT,
                    &status_body(409, "Conflict", &message),
                );
            }
            let annotations = state.pod["metadata"]
                .as_object_mut()
                .unwrap()
                .entry("annotations")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(changes) = patch["metadata"]["annotations"].as_object() {
                let annotations = annotations.as_object_mut().unwrap();
                for (k, v) in changes {
                    if v.is_null() {
                        annotations.remove(k);
                    } else {
                        annotations.insert(k.clone(), v.clone());
                    }
                }
            }
            state.resource_version += 1;
            state.stamp();
            state.patches.push((patch, 200));
            if shared.stream_changes {
                let _ = shared
                    .changes
                    .send(json!({"type": "MODIFIED", "object": state.pod.clone()}));
            }
            json_response(StatusCode::OK, &state.pod)
        }
        (&Method::POST, p) if p.starts_with("/apis/events.k8s.io/v1/namespaces/") => {
            let mut event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let n = state.events.len();
            event["metadata"]["name"] = json!(format!("event-{n}"));
            state.events.push(event.clone());
            json_response(StatusCode::CREATED, &event)
        }
        (&Method::GET, p) if p.starts_with("/apis/events.k8s.io/v1/namespaces/") => {
            let namespace = p
                .trim_start_matches("/apis/events.k8s.io/v1/namespaces/")
                .trim_end_matches("/events");
            let selector = query
                .split('&')
                .find_map(|p| p.strip_prefix("fieldSelector="))
                .map(percent_decoded)
                .unwrap_or_default();
            let items: Vec<Value> = state
                .events
                .iter()
                .filter(|e| e["regarding"]["namespace"] == namespace)
                .filter(|e| {
                    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
                        match term.split_once('=') {
                            Some(("regarding.uid", uid)) => e["regarding"]["uid"] == uid,
                            Some(("regarding.name", name)) => e["regarding"]["name"] == name,
                            Some(("reason", reason)) => e["reason"] == reason,
                            Some(("type", type_)) => e["type"] == type_,
                            Some(("reportingController", by)) => e["reportingController"] == by,
                            _ => false,
                        }
                    })
                })
                .cloned()
                .collect();
            let list = json!({
                "apiVersion": "events.k8s.io/v1",
                "kind": "EventList",
                "metadata": {"resourceVersion": state.resource_version.to_string()},
                "items": items,
            });
            json_response(StatusCode::OK, &list)
        }
        (&Method::GET, "/api/v1/pods") if watch => {
            let rx = shared.changes.subscribe();
            drop(state);
            // The changes after the list, one JSON object per line; the
            // stream stays open until the client goes away.
            let stream = futures::stream::unfold(rx, |mut rx| async move {
                loop {
                    match rx.recv().await {
                        Ok(change) => {
                            let mut line = change.to_string();
                            line.push('\n');
                            return Some((Ok::<_, Infallible>(Bytes::from(line)), rx));
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
                .unwrap()
        }
        (&Method::GET, "/api/v1/pods") => {
            let list = json!({
                "apiVersion": "v1",
                "kind": "PodList",
                "metadata": {"resourceVersion": state.resource_version.to_string()},
                "items": std::iter::once(state.pod.clone())
                    .chain(state.others.iter().cloned())
                    .collect::<Vec<_>>(),
            });
            json_response(StatusCode::OK, &list)
        }
        _ => {
            state.unexpected.push(format!("{method} {uri}"));
            json_response(
                StatusCode::NOT_FOUND,
                &status_body(404, "NotFound", &format!("{method} {path} is not served")),
            )
        }
    }
}

/// A query value with its `%XX` escapes (and `+`) decoded.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
