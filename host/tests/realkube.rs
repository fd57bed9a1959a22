//! The Kubernetes promises against a real kube-apiserver: `lab/kube`'s
//! `cocoon-kube-lab` (etcd and kube-apiserver v1.37 in one process, on
//! loopback, TLS, Node,RBAC authorization, the default admission chain;
//! docs/kubernetes.md), with `deploy/rbac.yaml` and
//! `deploy/admission-policy.yaml` applied as they ship (server-side
//! apply of each document, as `kubectl apply --server-side -f` does).
//!
//! - Least privilege both ways: a table of (identity, request, expected
//!   answer) sent for real, each refusal told apart by who refused it
//!   (RBAC's 403, the admission policy's 403, a 409).
//! - The daemon's own client ([`KubeApi`]) with a per-node daemon
//!   identity: its node's pods (field selector), the guarded merge patch
//!   (uid and resourceVersion preconditions: the real 409s), events, and
//!   the watch `serve` runs (metadata only, field selector).
//! - Which field selectors events.k8s.io/v1 accepts.
//! - The tenant (`edit` in tenant-a) cannot set, change or remove any key
//!   the host reads or writes, on create or update; the stack's controller
//!   (a service-account token from the TokenRequest API) can; the daemon
//!   only its keys; with `daemonNodePrefix` set, only on its node's pods.
//!
//! The lab is built with `go build` (modules from the module cache only:
//! `GOPROXY=off`) into the test's target folder, or taken from
//! `COCOON_FIXUP_KUBE_LAB`. Without Go or without the modules in the cache
//! these tests say loudly that they were skipped, and pass, unless
//! `COCOON_FIXUP_REQUIRE_KUBE=1` (set by `.ci/run`) makes that a failure.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use fixup_core::facts::annotations;
use fixup_core::memory::STACK_REPORTER;
use fixup_host::kube::{KubeApi, REPORTER, RetryPolicy};
use fixup_host::pods::{AnnotationPatch, Event, Guarded, PodApi, PodError, PodRef, keys, reasons};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::api::events::v1::Event as EventV1;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind, PartialObjectMeta};
use kube::runtime::watcher;
use kube::{Client, Config};
use serde_json::{Value, json};

use crate::support::go_tool::GoTool;

const NODE_A: &str = "node-a";
const NODE_B: &str = "node-b";
const TENANT_NS: &str = "tenant-a";
/// A namespace where a second copy of the policy, with
/// `daemonNodePrefix: 'cocoon-fixup:'`, applies too.
const PER_NODE_NS: &str = "per-node";
const PER_NODE_LABEL: &str = "cocoon-lab.cocoonstack.io/per-node";
const POLICY: &str = "cocoon-stack-annotations";

pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The lab's program: `COCOON_FIXUP_REQUIRE_KUBE=1` (set by `.ci/run`)
/// makes its absence a failure.
const LAB_TOOL: GoTool<'static> = GoTool {
    env: "COCOON_FIXUP_KUBE_LAB",
    require: "COCOON_FIXUP_REQUIRE_KUBE",
    tests: "the real kube-apiserver tests (host/tests/realkube.rs; docs/kubernetes.md)",
    module: "lab/kube",
    package: ".",
    output: "cocoon-kube-lab",
};

// ---------------------------------------------------------------------------
// The lab: built once, started once per test binary

struct Lab {
    dir: PathBuf,
    _child: Mutex<Child>,
    /// Held open: the lab exits when it reaches EOF, so when this test
    /// process ends, however it ends.
    _stdin: Mutex<ChildStdin>,
}

static LAB: OnceLock<Result<Option<Lab>, String>> = OnceLock::new();

/// The running lab with the deploy files applied, or `None` when skipped.
fn lab() -> Option<&'static Lab> {
    let lab = LAB.get_or_init(|| {
        // Its own thread and runtime: the tests' runtimes come and go.
        match std::thread::spawn(start_lab).join() {
            Ok(result) => result,
            Err(panic) => Err(panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "the lab's set-up panicked".into())),
        }
    });
    match lab {
        Ok(lab) => lab.as_ref(),
        Err(why) => panic!("the real kube-apiserver lab: {why}"),
    }
}

/// The lab's executable, built once per test process (`None`: skipped).
pub(crate) fn lab_binary() -> Result<Option<PathBuf>, String> {
    static BINARY: OnceLock<Result<Option<PathBuf>, String>> = OnceLock::new();
    BINARY.get_or_init(build_lab_binary).clone()
}

fn build_lab_binary() -> Result<Option<PathBuf>, String> {
    LAB_TOOL.build()
}

fn start_lab() -> Result<Option<Lab>, String> {
    let Some(binary) = lab_binary()? else {
        return Ok(None);
    };
    let dir = std::env::temp_dir().join(format!("cocoon-kube-lab-{}", std::process::id()));
    // The lab's log (kube-apiserver's and etcd's), kept after the run.
    let log_path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cocoon-kube-lab.log");
    let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut child = Command::new(&binary)
        .arg("--dir")
        .arg(&dir)
        .args(["--node", NODE_A, "--node", NODE_B, "--remove-dir-on-exit"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", binary.display()))?;
    let stdin = child.stdin.take().expect("piped");
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let tail = |log: &Path| {
        let mut text = String::new();
        let _ = std::fs::File::open(log).and_then(|mut f| f.read_to_string(&mut text));
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    };
    loop {
        match rx.recv_timeout(Duration::from_secs(180)) {
            Ok(line) if line.starts_with("ready ") => {
                eprintln!(
                    "cocoon-kube-lab: {line} (seen after {:.1?})",
                    started.elapsed()
                );
                break;
            }
            Ok(_) => {}
            Err(_) => {
                let _ = child.kill();
                return Err(format!(
                    "cocoon-kube-lab did not get ready; the end of {}:\n{}",
                    log_path.display(),
                    tail(&log_path)
                ));
            }
        }
    }
    let lab = Lab {
        dir,
        _child: Mutex::new(child),
        _stdin: Mutex::new(stdin),
    };
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    runtime.block_on(prepare(&lab))?;
    eprintln!(
        "the lab is ready with deploy/ applied after {:.1?}",
        started.elapsed()
    );
    Ok(Some(lab))
}

/// A client as `name`, from its kubeconfig (`admin`, `daemon-node-a`,
/// `cocoon-fixup`, `controller`, `tenant`, `vk-cocoon`).
async fn client(lab: &Lab, name: &str) -> Client {
    client_at(&lab.dir, name).await
}

/// A client as `name`, from its kubeconfig in a lab's folder `dir`.
pub(crate) async fn client_at(dir: &Path, name: &str) -> Client {
    let path = dir.join(format!("{name}.kubeconfig"));
    let kubeconfig = Kubeconfig::read_from(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    Client::try_from(config).unwrap_or_else(|e| panic!("{name}: {e}"))
}

pub(crate) fn yaml_documents(relative: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(repo().join(relative)).expect(relative);
    serde_saphyr::from_multiple::<Value>(&text).expect(relative)
}

/// Server-side apply of one cluster-scoped document, as it is.
pub(crate) async fn apply(admin: &Client, document: &Value) -> Result<(), String> {
    let (group, version) = match document["apiVersion"].as_str().unwrap().split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", document["apiVersion"].as_str().unwrap()),
    };
    let gvk = GroupVersionKind::gvk(group, version, document["kind"].as_str().unwrap());
    let api: Api<DynamicObject> = Api::all_with(admin.clone(), &ApiResource::from_gvk(&gvk));
    let name = document["metadata"]["name"].as_str().unwrap();
    api.patch(
        name,
        &PatchParams::apply("cocoon-kube-lab-tests").force(),
        &Patch::Apply(document),
    )
    .await
    .map(drop)
    .map_err(|e| format!("applying {} {name}: {e}", gvk.kind))
}

/// deploy/ applied; a namespace where a second copy of the policy with
/// the per-node opt-in applies too; both policies enforced.
async fn prepare(lab: &Lab) -> Result<(), String> {
    let admin = client(lab, "admin").await;
    for file in ["deploy/rbac.yaml", "deploy/admission-policy.yaml"] {
        for document in yaml_documents(file) {
            apply(&admin, &document).await?;
        }
    }
    // The operator's opt-in (deploy/README.md, "Each node only its own
    // pods"), as a second policy bound to one namespace so that the
    // shipped policy stays as it is for every other test.
    for document in yaml_documents("deploy/admission-policy.yaml") {
        let mut document = document;
        document["metadata"]["name"] = json!(format!("{POLICY}-per-node"));
        if document["kind"] == "ValidatingAdmissionPolicy" {
            let variables = document["spec"]["variables"].as_array_mut().unwrap();
            let prefix = variables
                .iter_mut()
                .find(|v| v["name"] == "daemonNodePrefix")
                .ok_or("the policy has no daemonNodePrefix")?;
            prefix["expression"] = json!("'cocoon-fixup:'");
        } else {
            document["spec"]["policyName"] = json!(format!("{POLICY}-per-node"));
            document["spec"]["matchResources"] =
                json!({"namespaceSelector": {"matchLabels": {PER_NODE_LABEL: "true"}}});
        }
        apply(&admin, &document).await?;
    }
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": PER_NODE_NS, "labels": {PER_NODE_LABEL: "true"}}}),
            )
            .unwrap(),
        )
        .await
        .map_err(|e| e.to_string())?;
    // No controller manager: the `default` service account the
    // ServiceAccount admission plugin wants is made by hand.
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(admin.clone(), PER_NODE_NS);
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap(),
        )
        .await
        .map_err(|e| e.to_string())?;
    // A policy is enforced once the API server's informer has it: probe
    // until a tenant's protected key is refused, in both namespaces.
    let tenant = client(lab, "tenant").await;
    let controller = client(lab, "controller").await;
    let probes = [
        (
            tenant.clone(),
            TENANT_NS,
            json!({annotations::VM_ID: "probe"}),
        ),
        (controller.clone(), PER_NODE_NS, json!({})),
    ];
    for (who, namespace, annotations) in probes {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if Instant::now() > deadline {
                return Err(format!(
                    "the policy is not enforced in {namespace} after 60 s"
                ));
            }
            let name = format!("probe-{}", unique());
            let pods: Api<Pod> = Api::namespaced(who.clone(), namespace);
            let created = pods
                .create(
                    &PostParams::default(),
                    &pod_object(&name, NODE_A, annotations.clone()),
                )
                .await;
            if namespace == TENANT_NS {
                match outcome(created) {
                    Outcome::Policy => break,
                    Outcome::Allowed => {
                        let _ = pods.delete(&name, &DeleteParams::default()).await;
                    }
                    // The authorizer's caches may lag the lab's bindings.
                    Outcome::Rbac => {}
                    other => return Err(format!("probing the policy: {other:?}")),
                }
            } else {
                // In the per-node namespace: the shared user may write
                // nothing once the per-node policy is in force.
                created.map_err(|e| e.to_string())?;
                let shared: Api<Pod> =
                    Api::namespaced(client(lab, "cocoon-fixup").await, namespace);
                let patch = json!({"metadata": {"annotations": {keys::POST_CLONE_STATE: "done"}}});
                match outcome(
                    shared
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await,
                ) {
                    Outcome::Policy => break,
                    Outcome::Allowed => {}
                    other => return Err(format!("probing the per-node policy: {other:?}")),
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn pod_object(name: &str, node: &str, annotations: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "web"}, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "containers": [{"name": "guest", "image": "example.invalid/guest:1"}],
        },
    }))
    .unwrap()
}

/// Every key under the stack's prefixes that the host reads (spec
/// section 2) or writes (`pods::keys`).
fn host_keys() -> Vec<&'static str> {
    vec![
        keys::POST_CLONE_STATE,
        keys::POST_CLONE_HINT,
        keys::POST_CLONE_ERRORS,
        keys::IP,
        keys::PROBE_PORT,
        keys::LIFECYCLE_STATE,
        keys::LIFECYCLE_MESSAGE,
        keys::LIFECYCLE_OBSERVED_GENERATION,
        keys::GENERATION,
        keys::PREPARED,
        annotations::VM_NAME,
        annotations::VM_ID,
        annotations::BACKEND,
        annotations::OS,
        annotations::MANAGED,
        annotations::MODE,
        annotations::FORK_FROM,
        annotations::CLONE_FROM_DIR,
        annotations::RESTORE_FROM_HIBERNATE,
        annotations::GUEST_FLAVOR,
        annotations::HIBERNATE,
    ]
}

/// The keys the daemon writes (the policy's `daemonKeys`).
fn daemon_keys() -> Vec<&'static str> {
    let mut keys = host_keys();
    keys.retain(|k| {
        k.starts_with("vm.cocoonstack.io/")
            && [
                keys::POST_CLONE_STATE,
                keys::POST_CLONE_HINT,
                keys::POST_CLONE_ERRORS,
                keys::IP,
                keys::LIFECYCLE_STATE,
                keys::LIFECYCLE_MESSAGE,
                keys::LIFECYCLE_OBSERVED_GENERATION,
                keys::PREPARED,
            ]
            .contains(k)
    });
    keys
}

/// A pod with every key the host reads or writes, created by the stack.
fn stack_annotations() -> Value {
    let mut map = serde_json::Map::new();
    for key in host_keys() {
        let value = match key {
            k if k == annotations::HIBERNATE => "false",
            k if k == annotations::MANAGED => "true",
            k if k == keys::IP => "10.0.0.5",
            _ => "stack",
        };
        map.insert(key.into(), json!(value));
    }
    map.insert("team.example.com/owner".into(), json!("alice"));
    Value::Object(map)
}

// ---------------------------------------------------------------------------
// Answers

/// Who answered what.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Allowed,
    /// 403 from the authorizer (RBAC, Node).
    Rbac,
    /// 403 from ValidatingAdmissionPolicy cocoon-stack-annotations.
    Policy,
    /// 403 from another admission plugin (NodeRestriction).
    Admission(String),
    Conflict,
    /// 422: the object is invalid (an immutable field changed).
    Invalid,
    Other(String),
}

fn outcome<T>(result: Result<T, kube::Error>) -> Outcome {
    match result {
        Ok(_) => Outcome::Allowed,
        Err(kube::Error::Api(status)) => {
            let message = &status.message;
            match status.code {
                403 if message.contains("ValidatingAdmissionPolicy") => Outcome::Policy,
                403 if message.contains(" cannot ") => Outcome::Rbac,
                403 => Outcome::Admission(message.clone()),
                409 => Outcome::Conflict,
                422 => Outcome::Invalid,
                code => Outcome::Other(format!("{code} {}: {message}", status.reason)),
            }
        }
        Err(other) => Outcome::Other(other.to_string()),
    }
}

/// One row of a table: sent for real, compared, printed.
struct Table {
    rows: Vec<(String, String, Outcome, Outcome)>,
}

impl Table {
    fn new() -> Self {
        Table { rows: Vec::new() }
    }

    fn row(&mut self, who: &str, what: &str, expected: Outcome, got: Outcome) {
        self.rows.push((who.into(), what.into(), expected, got));
    }

    /// Print every row; fail naming each one that differs.
    fn check(self, title: &str) {
        println!("\n{title}\n| identity | request | expected | real server |\n|---|---|---|---|");
        let mut wrong = Vec::new();
        for (who, what, expected, got) in &self.rows {
            let mark = if expected == got { "" } else { "  <-- DIFFERS" };
            println!("| {who} | {what} | {expected:?} | {got:?}{mark} |");
            if expected != got {
                wrong.push(format!("{who}: {what}: expected {expected:?}, got {got:?}"));
            }
        }
        assert!(wrong.is_empty(), "{title}:\n{}", wrong.join("\n"));
    }
}

/// A pod created by the controller (the stack), with `annotations`.
async fn stack_pod(lab: &Lab, namespace: &str, node: &str, annotations: Value) -> Pod {
    let controller: Api<Pod> = Api::namespaced(client(lab, "controller").await, namespace);
    let name = format!("web-{}", unique());
    controller
        .create(
            &PostParams::default(),
            &pod_object(&name, node, annotations),
        )
        .await
        .unwrap_or_else(|e| panic!("the controller creates {namespace}/{name}: {e}"))
}

fn merge(annotations: Value) -> Value {
    json!({"metadata": {"annotations": annotations}})
}

// ---------------------------------------------------------------------------
// Least privilege

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_identity_may_do_what_its_role_says_and_nothing_more() {
    let Some(lab) = lab() else { return };
    let pod = stack_pod(lab, TENANT_NS, NODE_A, json!({})).await;
    let name = pod.metadata.name.clone().unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    let version = pod.metadata.resource_version.clone().unwrap();
    let mut table = Table::new();
    use Outcome::*;

    for who in ["daemon-node-a", "cocoon-fixup"] {
        let c = client(lab, who).await;
        let pods: Api<Pod> = Api::namespaced(c.clone(), TENANT_NS);
        let all: Api<Pod> = Api::all(c.clone());
        let events: Api<EventV1> = Api::namespaced(c.clone(), TENANT_NS);
        let on_node = ListParams::default().fields(&format!("spec.nodeName={NODE_A}"));
        table.row(
            who,
            "get pods (metadata)",
            Allowed,
            outcome(pods.get_metadata(&name).await),
        );
        table.row(
            who,
            "list pods, all namespaces, spec.nodeName (metadata)",
            Allowed,
            outcome(all.list_metadata(&on_node).await),
        );
        let watch = WatchParams::default()
            .fields(&format!("spec.nodeName={NODE_A}"))
            .timeout(1);
        // RBAC cannot narrow reads to a node (deploy/rbac.yaml says so).
        table.row(
            who,
            "list pods, all namespaces, no field selector",
            Allowed,
            outcome(all.list_metadata(&ListParams::default()).await),
        );
        let watched = match all.watch_metadata(&watch, "0").await {
            Ok(stream) => outcome(stream.boxed().try_next().await),
            Err(e) => outcome::<()>(Err(e)),
        };
        table.row(
            who,
            "watch pods, all namespaces, spec.nodeName (metadata)",
            Allowed,
            watched,
        );
        let fresh = pods.get_metadata(&name).await.unwrap().metadata;
        let guarded = json!({"metadata": {"uid": uid, "resourceVersion": fresh.resource_version, "annotations": {keys::POST_CLONE_STATE: format!("by {who}")}}});
        table.row(
            who,
            "merge-patch pods, uid + resourceVersion preconditions",
            Allowed,
            outcome(
                pods.patch(&name, &PatchParams::default(), &Patch::Merge(&guarded))
                    .await,
            ),
        );
        let stale = json!({"metadata": {"uid": uid, "resourceVersion": version, "annotations": {keys::POST_CLONE_STATE: "stale"}}});
        table.row(
            who,
            "merge-patch pods, stale resourceVersion",
            Conflict,
            outcome(
                pods.patch(&name, &PatchParams::default(), &Patch::Merge(&stale))
                    .await,
            ),
        );
        let other_uid = json!({"metadata": {"uid": "00000000-0000-0000-0000-000000000000", "annotations": {keys::POST_CLONE_STATE: "other"}}});
        // Not 409: a merge patch carrying another uid changes an immutable
        // field, and the real server answers 422 Invalid ("metadata.uid:
        // field is immutable"). host/src/kube.rs and the stand-ins expect
        // 409 (reported to the lead; docs/kubernetes.md).
        table.row(
            who,
            "merge-patch pods, another uid",
            Invalid,
            outcome(
                pods.patch(&name, &PatchParams::default(), &Patch::Merge(&other_uid))
                    .await,
            ),
        );
        let event: EventV1 = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}.{}", unique()), "namespace": TENANT_NS},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": REPORTER, "reportingInstance": NODE_A,
            "action": "Fixup", "reason": reasons::SUCCEEDED, "type": "Normal",
            "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": TENANT_NS, "name": name, "uid": uid},
        })).unwrap();
        table.row(
            who,
            "create events.k8s.io/v1 events",
            Allowed,
            outcome(events.create(&PostParams::default(), &event).await),
        );
        table.row(
            who,
            "list events.k8s.io/v1 events, regarding.uid",
            Allowed,
            outcome(
                events
                    .list(&ListParams::default().fields(&format!("regarding.uid={uid}")))
                    .await,
            ),
        );
        let event_name = event.metadata.name.clone().unwrap();
        table.row(
            who,
            "get events.k8s.io/v1 events",
            Rbac,
            outcome(events.get(&event_name).await),
        );
        table.row(
            who,
            "patch events.k8s.io/v1 events",
            Rbac,
            outcome(
                events
                    .patch(
                        &event_name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"note": "x"})),
                    )
                    .await,
            ),
        );
        table.row(
            who,
            "delete events.k8s.io/v1 events",
            Rbac,
            outcome(events.delete(&event_name, &DeleteParams::default()).await),
        );
        let core_events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(c.clone(), TENANT_NS);
        table.row(who, "create core/v1 events", Rbac, outcome(core_events.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": format!("core-{}", unique())}, "involvedObject": {"kind": "Pod", "name": name, "namespace": TENANT_NS}, "reason": "X"})).unwrap()).await));
        table.row(
            who,
            "delete pods",
            Rbac,
            outcome(pods.delete(&name, &DeleteParams::default()).await),
        );
        table.row(
            who,
            "create pods",
            Rbac,
            outcome(
                pods.create(
                    &PostParams::default(),
                    &pod_object(&format!("x-{}", unique()), NODE_A, json!({})),
                )
                .await,
            ),
        );
        let mut whole = pods.get(&name).await.unwrap();
        whole
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::POST_CLONE_STATE.into(), "put".into());
        table.row(
            who,
            "update (PUT) pods",
            Rbac,
            outcome(pods.replace(&name, &PostParams::default(), &whole).await),
        );
        table.row(
            who,
            "patch pods/status",
            Rbac,
            outcome(
                pods.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(merge(json!({keys::POST_CLONE_STATE: "status"}))),
                )
                .await,
            ),
        );
        let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name}, "target": {"kind": "Node", "name": NODE_B}});
        let bound = c
            .request::<Value>(
                http::Request::post(format!(
                    "/api/v1/namespaces/{TENANT_NS}/pods/{name}/binding"
                ))
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&binding).unwrap())
                .unwrap(),
            )
            .await;
        table.row(who, "create pods/binding", Rbac, outcome(bound));
        let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": TENANT_NS}});
        let evicted = c
            .request::<Value>(
                http::Request::post(format!(
                    "/api/v1/namespaces/{TENANT_NS}/pods/{name}/eviction"
                ))
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&eviction).unwrap())
                .unwrap(),
            )
            .await;
        table.row(who, "create pods/eviction", Rbac, outcome(evicted));
        let secrets: Api<Secret> = Api::namespaced(c.clone(), TENANT_NS);
        table.row(
            who,
            "list secrets",
            Rbac,
            outcome(secrets.list(&ListParams::default()).await),
        );
        table.row(who, "get secrets", Rbac, outcome(secrets.get("any").await));
        let nodes: Api<Node> = Api::all(c.clone());
        table.row(
            who,
            "list nodes",
            Rbac,
            outcome(nodes.list(&ListParams::default()).await),
        );
    }

    // The tenant: `edit` in its namespace only.
    let tenant = client(lab, "tenant").await;
    let own: Api<Pod> = Api::namespaced(tenant.clone(), TENANT_NS);
    let tenant_pod = format!("tenant-{}", unique());
    table.row(
        "tenant",
        "create pods in tenant-a, no stack keys",
        Allowed,
        outcome(
            own.create(
                &PostParams::default(),
                &pod_object(
                    &tenant_pod,
                    NODE_A,
                    json!({"team.example.com/owner": "alice"}),
                ),
            )
            .await,
        ),
    );
    table.row(
        "tenant",
        "patch pods/status in tenant-a",
        Rbac,
        outcome(
            own.patch_status(
                &tenant_pod,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Running"}})),
            )
            .await,
        ),
    );
    let elsewhere: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    table.row(
        "tenant",
        "list pods in default",
        Rbac,
        outcome(elsewhere.list(&ListParams::default()).await),
    );
    table.row(
        "tenant",
        "create pods in default",
        Rbac,
        outcome(
            elsewhere
                .create(
                    &PostParams::default(),
                    &pod_object(&format!("t-{}", unique()), NODE_A, json!({})),
                )
                .await,
        ),
    );

    // The controller: the lab's stand-in for the operator's own RBAC.
    let controller: Api<Pod> = Api::namespaced(client(lab, "controller").await, TENANT_NS);
    table.row(
        "controller",
        "delete pods",
        Allowed,
        outcome(
            controller
                .delete(&tenant_pod, &DeleteParams::default())
                .await,
        ),
    );
    table.check("RBAC against the real server (deploy/rbac.yaml as shipped)");
}

// ---------------------------------------------------------------------------
// The daemon's own client

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemons_client_works_against_the_real_server() {
    let Some(lab) = lab() else { return };
    let mine = stack_pod(lab, TENANT_NS, NODE_A, stack_annotations()).await;
    let theirs = stack_pod(lab, TENANT_NS, NODE_B, stack_annotations()).await;
    let quick = RetryPolicy {
        tries: 2,
        first_delay: Duration::from_millis(50),
        max_delay: Duration::from_millis(50),
        request_timeout: Duration::from_secs(10),
    };
    let api = KubeApi::new(
        client(lab, "daemon-node-a").await,
        REPORTER,
        Some(NODE_A.into()),
    )
    .with_retry(quick);
    let name = mine.metadata.name.clone().unwrap();
    let pod = PodRef {
        namespace: TENANT_NS.into(),
        name: name.clone(),
        uid: mine.metadata.uid.clone().unwrap(),
    };

    // Its node's pods, and only those (field selector spec.nodeName).
    let listed = api.node_pods(NODE_A).await.expect("node_pods");
    assert!(listed.iter().any(|p| p.name == name), "{listed:?}");
    assert!(
        listed
            .iter()
            .all(|p| p.name != *theirs.metadata.name.as_ref().unwrap())
    );

    // A read, then a write guarded by it.
    let seen = api.get(TENANT_NS, &name).await.unwrap().expect("the pod");
    assert!(seen.resource_version.is_some());
    let done: AnnotationPatch = BTreeMap::from([
        (keys::POST_CLONE_STATE.to_owned(), Some("done".to_owned())),
        (keys::IP.to_owned(), Some("10.0.0.6".to_owned())),
        (keys::POST_CLONE_HINT.to_owned(), None),
    ]);
    let written = api
        .patch_if_unchanged(&pod, &done, &seen)
        .await
        .expect("written");
    let Guarded::Written(Some(after)) = written else {
        panic!("expected the write to land with the pod in the answer: {written:?}")
    };
    assert_eq!(after.annotations[keys::POST_CLONE_STATE], "done");
    assert!(!after.annotations.contains_key(keys::POST_CLONE_HINT));

    // The same read again is stale now: the real server's 409, and the
    // fresh read that comes with it.
    let again = api
        .patch_if_unchanged(&pod, &done, &seen)
        .await
        .expect("answered");
    match again {
        Guarded::Changed(now) => assert_eq!(now.resource_version, after.resource_version),
        other => panic!("a stale resourceVersion must be refused: {other:?}"),
    }

    // Another incarnation's uid: gone.
    let other = PodRef {
        uid: "00000000-0000-0000-0000-000000000000".into(),
        ..pod.clone()
    };
    // The real server refuses a merge patch carrying another uid with 422
    // ("metadata.uid: field is immutable"), not the 409 the tower-test
    // conversations answer: the client reads the live pod and says gone.
    match api.patch_annotations(&other, &done).await {
        Err(PodError::Gone { .. }) => {}
        other => panic!("another uid: expected Gone, got {other:?}"),
    }

    // A key it does not write: the admission policy's refusal, for good.
    let vm_id: AnnotationPatch =
        BTreeMap::from([(annotations::VM_ID.to_owned(), Some("vm-other".to_owned()))]);
    match api.patch_annotations(&pod, &vm_id).await {
        Err(PodError::Refused { reason, .. }) => {
            assert!(
                reason.contains(annotations::VM_ID) && reason.contains("ValidatingAdmissionPolicy"),
                "{reason}"
            )
        }
        other => panic!("the daemon may not write {}: {other:?}", annotations::VM_ID),
    }

    // Events: posted, then found by the lists the wake rule and `capture` make.
    api.event(&pod, &Event::normal(reasons::SUCCEEDED, "fixed up"))
        .await
        .expect("event");
    // The wake rule's listing (spec section 2, rule 2): the stack's own
    // wake events about the pod, posted here by the controller, found by
    // the field selectors the host makes, and nothing else.
    let selectors = fixup_core::memory::field_selectors(&pod.uid, &[STACK_REPORTER.to_owned()]);
    let controller: Api<EventV1> = Api::namespaced(client(lab, "controller").await, TENANT_NS);
    for selector in &selectors {
        let terms: BTreeMap<&str, &str> = selector
            .split(',')
            .filter_map(|t| t.split_once('='))
            .collect();
        let event: EventV1 = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}.wake{}", unique())},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": terms["reportingController"], "reportingInstance": "stack",
            "action": "Wake", "reason": terms["reason"], "type": terms["type"],
            "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": TENANT_NS, "name": name, "uid": pod.uid},
        }))
        .unwrap();
        controller
            .create(&PostParams::default(), &event)
            .await
            .expect("the stack's wake event");
    }
    let stack = api
        .stack_events(&pod, &selectors)
        .await
        .expect("stack_events");
    assert!(!stack.truncated, "{stack:?}");
    let stack = stack.events;
    assert_eq!(
        stack.len(),
        selectors.len(),
        "one wake event per selector: {stack:?}"
    );
    assert!(
        stack
            .iter()
            .all(|e| e.reporting_controller == STACK_REPORTER
                && e.regarding_uid == pod.uid
                && e.reason != reasons::SUCCEEDED),
        "{stack:?}"
    );
    // `capture`'s listing: the daemon's own events about the pod.
    let (own, truncated) = api.list_pod_events(&pod).await.expect("list_pod_events");
    assert!(
        !truncated
            && own
                .iter()
                .any(|e| e.reason == reasons::SUCCEEDED && e.message == "fixed up"),
        "{own:?}"
    );
}

/// The watch `serve` runs (host/src/serve.rs): metadata of all
/// namespaces' pods with `spec.nodeName=<node>`, as the daemon identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_watch_sees_its_nodes_pods_only() {
    let Some(lab) = lab() else { return };
    let mine = stack_pod(lab, TENANT_NS, NODE_A, json!({})).await;
    let theirs = stack_pod(lab, TENANT_NS, NODE_B, json!({})).await;
    let api: Api<PartialObjectMeta<Pod>> = Api::all(client(lab, "daemon-node-a").await);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={NODE_A}"));
    let mut stream = watcher::watcher(api, config).boxed();
    let mut names = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let event = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("the watch's initial list within 30 s")
            .expect("a stream that goes on")
            .expect("no watch error");
        match event {
            watcher::Event::InitApply(pod) | watcher::Event::Apply(pod) => {
                names.push(pod.metadata.name.unwrap())
            }
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    assert!(
        names.contains(mine.metadata.name.as_ref().unwrap()),
        "{names:?}"
    );
    assert!(
        !names.contains(theirs.metadata.name.as_ref().unwrap()),
        "{names:?}"
    );
}

/// Which field selectors the real server takes on events.k8s.io/v1 events
/// (the daemon lists with `regarding.uid` alone and filters the rest
/// itself). Printed as a table; each answer is pinned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_field_selectors_on_the_real_server() {
    let Some(lab) = lab() else { return };
    let pod = stack_pod(lab, TENANT_NS, NODE_A, json!({})).await;
    let name = pod.metadata.name.clone().unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    let api = KubeApi::new(
        client(lab, "daemon-node-a").await,
        REPORTER,
        Some(NODE_A.into()),
    );
    let pod_ref = PodRef {
        namespace: TENANT_NS.into(),
        name: name.clone(),
        uid: uid.clone(),
    };
    api.event(&pod_ref, &Event::warning(reasons::IP_WAIT_TIMEOUT, "no IP"))
        .await
        .expect("event");
    let events: Api<EventV1> = Api::namespaced(client(lab, "daemon-node-a").await, TENANT_NS);
    // (selector, matches our one event: Some(true/false), or refused: None)
    let cases: Vec<(String, Option<bool>)> = vec![
        (format!("regarding.uid={uid}"), Some(true)),
        (format!("regarding.name={name}"), Some(true)),
        ("regarding.kind=Pod".into(), Some(true)),
        (format!("regarding.namespace={TENANT_NS}"), Some(true)),
        (format!("reason={}", reasons::IP_WAIT_TIMEOUT), Some(true)),
        ("type=Warning".into(), Some(true)),
        ("type=Normal".into(), Some(false)),
        (format!("reportingController={REPORTER}"), Some(true)),
        (format!("reportingInstance={NODE_A}"), None),
        (format!("reportingComponent={REPORTER}"), None),
        (format!("involvedObject.uid={uid}"), None),
        ("action=PostClone".into(), None),
        (
            format!(
                "regarding.uid={uid},reason={},type=Warning,reportingController={REPORTER}",
                reasons::IP_WAIT_TIMEOUT
            ),
            Some(true),
        ),
        (
            format!(
                "regarding.uid={uid},reason={},type=Normal,reportingController={REPORTER}",
                reasons::IP_WAIT_TIMEOUT
            ),
            Some(false),
        ),
    ];
    println!(
        "\nevents.k8s.io/v1 field selectors on the real server\n| selector | answer |\n|---|---|"
    );
    let mut wrong = Vec::new();
    for (selector, expected) in cases {
        let got = match events.list(&ListParams::default().fields(&selector)).await {
            Ok(list) => Some(list.items.iter().any(|e| {
                e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid.as_str())
            })),
            Err(kube::Error::Api(status)) if status.code == 400 => {
                println!("| `{selector}` | refused: {} |", status.message);
                None
            }
            Err(e) => panic!("{selector}: {e}"),
        };
        if let Some(found) = got {
            println!(
                "| `{selector}` | accepted, {} our event |",
                if found { "finds" } else { "does not find" }
            );
        }
        if got != expected {
            wrong.push(format!("{selector}: expected {expected:?}, got {got:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

// ---------------------------------------------------------------------------
// The admission policy

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_cannot_touch_any_key_the_host_trusts_or_writes() {
    use Outcome::*;
    let Some(lab) = lab() else { return };
    let tenant: Api<Pod> = Api::namespaced(client(lab, "tenant").await, TENANT_NS);
    let mut table = Table::new();
    // Its own pod, without stack keys; and one the stack made with them.
    let plain = format!("tenant-{}", unique());
    tenant
        .create(
            &PostParams::default(),
            &pod_object(&plain, NODE_A, json!({"team.example.com/owner": "alice"})),
        )
        .await
        .expect("the tenant creates a pod without stack keys");
    let stacked = stack_pod(lab, TENANT_NS, NODE_A, stack_annotations()).await;
    let stacked = stacked.metadata.name.unwrap();
    let who = "tenant";
    for key in host_keys() {
        let created = tenant
            .create(
                &PostParams::default(),
                &pod_object(&format!("t-{}", unique()), NODE_A, json!({key: "x"})),
            )
            .await;
        table.row(who, &format!("create with {key}"), Policy, outcome(created));
        let set = tenant
            .patch(
                &plain,
                &PatchParams::default(),
                &Patch::Merge(merge(json!({key: "x"}))),
            )
            .await;
        table.row(who, &format!("set {key}"), Policy, outcome(set));
        let change = tenant
            .patch(
                &stacked,
                &PatchParams::default(),
                &Patch::Merge(merge(json!({key: "changed"}))),
            )
            .await;
        table.row(who, &format!("change {key}"), Policy, outcome(change));
        let remove = tenant
            .patch(
                &stacked,
                &PatchParams::default(),
                &Patch::Merge(merge(json!({key: null}))),
            )
            .await;
        table.row(who, &format!("remove {key}"), Policy, outcome(remove));
    }
    let lookalike = json!({"x.vm.cocoonstack.io/id": "1", "vm.cocoonstack.io.example.com/id": "1"});
    table.row(
        who,
        "create with look-alike keys",
        Allowed,
        outcome(
            tenant
                .create(
                    &PostParams::default(),
                    &pod_object(&format!("t-{}", unique()), NODE_A, lookalike),
                )
                .await,
        ),
    );
    table.row(
        who,
        "resend the stack's keys unchanged (merge patch)",
        Allowed,
        outcome(
            tenant
                .patch(
                    &stacked,
                    &PatchParams::default(),
                    &Patch::Merge(merge(stack_annotations())),
                )
                .await,
        ),
    );
    table.row(
        who,
        "change an unrelated annotation on the stack's pod",
        Allowed,
        outcome(
            tenant
                .patch(
                    &stacked,
                    &PatchParams::default(),
                    &Patch::Merge(merge(json!({"team.example.com/owner": "bob"}))),
                )
                .await,
        ),
    );
    table.row(
        who,
        "relabel the stack's pod",
        Allowed,
        outcome(
            tenant
                .patch(
                    &stacked,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"tier": "front"}}})),
                )
                .await,
        ),
    );
    let mut whole = tenant.get(&stacked).await.unwrap();
    whole
        .metadata
        .labels
        .get_or_insert_default()
        .insert("tier".into(), "back".into());
    table.row(
        who,
        "replace (PUT) the whole pod, keys as they are",
        Allowed,
        outcome(
            tenant
                .replace(&stacked, &PostParams::default(), &whole)
                .await,
        ),
    );
    let mut whole = tenant.get(&stacked).await.unwrap();
    whole
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(keys::IP.into(), "10.0.0.99".into());
    table.row(
        who,
        "replace (PUT) with another IP",
        Policy,
        outcome(
            tenant
                .replace(&stacked, &PostParams::default(), &whole)
                .await,
        ),
    );
    let apply = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": plain, "annotations": {keys::IP: "10.0.0.99"}}});
    table.row(
        who,
        "server-side apply with a stack key",
        Policy,
        outcome(
            tenant
                .patch(
                    &plain,
                    &PatchParams::apply("tenant").force(),
                    &Patch::Apply(&apply),
                )
                .await,
        ),
    );

    // The stack: every key, on create, change and removal.
    let controller: Api<Pod> = Api::namespaced(client(lab, "controller").await, TENANT_NS);
    let who = "controller";
    table.row(
        who,
        "create with every key",
        Allowed,
        outcome(
            controller
                .create(
                    &PostParams::default(),
                    &pod_object(&format!("c-{}", unique()), NODE_A, stack_annotations()),
                )
                .await,
        ),
    );
    for key in host_keys() {
        let changed = controller
            .patch(
                &stacked,
                &PatchParams::default(),
                &Patch::Merge(merge(json!({key: "by-the-stack"}))),
            )
            .await;
        table.row(who, &format!("change {key}"), Allowed, outcome(changed));
    }
    table.row(
        who,
        "remove every key",
        Allowed,
        outcome(
            controller
                .patch(
                    &stacked,
                    &PatchParams::default(),
                    &Patch::Merge(merge(
                        host_keys()
                            .into_iter()
                            .map(|k| (k.to_owned(), Value::Null))
                            .collect::<serde_json::Map<_, _>>()
                            .into(),
                    )),
                )
                .await,
        ),
    );

    // A kubelet-like node identity that is on allowedUsers: the Node
    // authorizer and NodeRestriction decide before the policy does.
    let vk: Api<Pod> = Api::namespaced(client(lab, "vk-cocoon").await, TENANT_NS);
    let on_vk = stack_pod(lab, TENANT_NS, "vk-cocoon", stack_annotations()).await;
    let on_vk = on_vk.metadata.name.unwrap();
    table.row(
        "vk-cocoon",
        "patch pods/status of its pod, lifecycle-state",
        Allowed,
        outcome(
            vk.patch_status(
                &on_vk,
                &PatchParams::default(),
                &Patch::Merge(merge(json!({keys::LIFECYCLE_STATE: "ready"}))),
            )
            .await,
        ),
    );
    table.row(
        "vk-cocoon",
        "patch its pod's annotations",
        Rbac,
        outcome(
            vk.patch(
                &on_vk,
                &PatchParams::default(),
                &Patch::Merge(merge(json!({keys::LIFECYCLE_STATE: "ready"}))),
            )
            .await,
        ),
    );
    table.check("ValidatingAdmissionPolicy cocoon-stack-annotations (as shipped) against the real server: tenant and stack");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_may_change_only_its_own_keys() {
    use Outcome::*;
    let Some(lab) = lab() else { return };
    let mut table = Table::new();
    for who in ["daemon-node-a", "cocoon-fixup"] {
        let pods: Api<Pod> = Api::namespaced(client(lab, who).await, TENANT_NS);
        // On another node's pod: without the opt-in, any daemon may.
        for node in [NODE_A, NODE_B] {
            let name = stack_pod(lab, TENANT_NS, node, stack_annotations())
                .await
                .metadata
                .name
                .unwrap();
            let mut patch = serde_json::Map::new();
            for key in daemon_keys() {
                patch.insert(key.into(), json!(format!("by {who}")));
            }
            table.row(
                who,
                &format!("write every daemonKey on a pod on {node}"),
                Allowed,
                outcome(
                    pods.patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(merge(patch.into())),
                    )
                    .await,
                ),
            );
            table.row(
                who,
                "remove post-clone-hint",
                Allowed,
                outcome(
                    pods.patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(merge(json!({keys::POST_CLONE_HINT: null}))),
                    )
                    .await,
                ),
            );
        }
        let name = stack_pod(lab, TENANT_NS, NODE_A, stack_annotations())
            .await
            .metadata
            .name
            .unwrap();
        for key in host_keys()
            .into_iter()
            .filter(|k| !daemon_keys().contains(k))
        {
            table.row(
                who,
                &format!("change {key}"),
                Policy,
                outcome(
                    pods.patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(merge(json!({key: "by-the-daemon"}))),
                    )
                    .await,
                ),
            );
        }
        let p = |v: Value| Patch::Merge(v);
        let params = PatchParams::default();
        table.row(
            who,
            "add an unrelated annotation",
            Policy,
            outcome(
                pods.patch(
                    &name,
                    &params,
                    &p(merge(json!({"team.example.com/cost-centre": "42"}))),
                )
                .await,
            ),
        );
        table.row(
            who,
            "remove an unrelated annotation",
            Policy,
            outcome(
                pods.patch(
                    &name,
                    &params,
                    &p(merge(json!({"team.example.com/owner": null}))),
                )
                .await,
            ),
        );
        table.row(
            who,
            "add a label",
            Policy,
            outcome(
                pods.patch(
                    &name,
                    &params,
                    &p(json!({"metadata": {"labels": {"tier": "x"}}})),
                )
                .await,
            ),
        );
        table.row(who, "its state and a label at once", Policy, outcome(pods.patch(&name, &params, &p(json!({"metadata": {"labels": {"app": "db"}, "annotations": {keys::POST_CLONE_STATE: "done"}}}))).await));
        table.row(who, "change a container image", Policy, outcome(pods.patch(&name, &params, &p(json!({"spec": {"containers": [{"name": "guest", "image": "example.invalid/evil:1"}]}}))).await));
        table.row(
            who,
            "add a finalizer",
            Policy,
            outcome(
                pods.patch(
                    &name,
                    &params,
                    &p(json!({"metadata": {"finalizers": ["example.com/hold"]}})),
                )
                .await,
            ),
        );
        table.row(who, "add an owner reference", Policy, outcome(pods.patch(&name, &params, &p(json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "00000000-0000-0000-0000-000000000002"}]}}))).await));
        table.row(who, "server-side apply of its state", Allowed, outcome(pods.patch(&name, &PatchParams::apply(REPORTER).force(), &Patch::Apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": {keys::POST_CLONE_STATE: "applied"}}}))).await));
    }

    // The per-node opt-in (a copy of the policy with daemonNodePrefix
    // 'cocoon-fixup:', bound to namespace per-node only).
    for (who, node, expected) in [
        ("daemon-node-a", NODE_A, Allowed),
        ("daemon-node-a", NODE_B, Policy),
        ("daemon-node-b", NODE_B, Allowed),
        ("daemon-node-b", NODE_A, Policy),
        ("cocoon-fixup", NODE_A, Policy),
    ] {
        let name = stack_pod(lab, PER_NODE_NS, node, stack_annotations())
            .await
            .metadata
            .name
            .unwrap();
        let pods: Api<Pod> = Api::namespaced(client(lab, who).await, PER_NODE_NS);
        table.row(
            who,
            &format!("daemonNodePrefix 'cocoon-fixup:': write its state on a pod on {node}"),
            expected,
            outcome(
                pods.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(merge(json!({keys::POST_CLONE_STATE: "done"}))),
                )
                .await,
            ),
        );
    }
    table.check(
        "ValidatingAdmissionPolicy cocoon-stack-annotations against the real server: the daemon",
    );
}
