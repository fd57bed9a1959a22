//! Three nodes' daemons against one real kube-apiserver (docs/kubernetes.md,
//! "Several nodes"): `cocoon-fixup serve` for `node-a`, `node-b` and
//! `node-c`, three processes, each with the node's own identity
//! (`daemon-<node>.kubeconfig`: RBAC and the admission policies of
//! deploy/ as they ship), its own `fake-cocoon`, lease file and state
//! directory, and a lab of its own (`cocoon-kube-lab` on a fixed port,
//! with an audit log).
//!
//! **The scenarios, on a cluster.** Every conformance scenario
//! (`tests/conformance/*.json`) whose world a cluster can play in real
//! time is replayed once on each node: the pod created by the stack's
//! controller, the stack's events posted by the stack's identity before
//! the VM id is written (as vk-cocoon does), leases written and changes
//! made (annotations by the controller, a deletion, a deletion held by a
//! finalizer) once the daemon has done everything the scenario has it do
//! before that moment. Beside them, pods that are no clone at all. Then,
//! per pod, from the API server's audit log and the fake CLI's call log:
//! the daemon's writes and events are exactly the scenario's, in its
//! order; the execs as many; the annotations end as the scenario's
//! writes and changes leave them. A scenario the lab cannot play (a
//! record the host kept before, an API fault, a console, a shutdown, a
//! setting other than the daemons') is listed as left out, with why.
//!
//! **Isolation.** No daemon reads, writes or reports on a pod of another
//! node (the audit log, every request).
//!
//! **Faults.** A second wave of clones whose first attempt fails slowly;
//! while they are mid-loop, node-a's daemon is killed with SIGKILL and
//! started again, and the API server crashes (SIGKILL) and is started
//! again on the same etcd data (each daemon's watch then comes back to a
//! server whose watch cache starts after its last resourceVersion, and is
//! told `410 Gone`). Every pod still ends fixed, with one success and one `done`
//! write; the killed node's pods resume from their records.
//!
//! Real time throughout: the waits poll with a generous upper bound (a
//! safety net, not a timing assertion).

use crate::realkube::{apply, client_at, lab_binary, repo, yaml_documents};
use crate::support;

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fixup_core::binding::vm_name_for_pod;
use fixup_core::decision::has_work;
use fixup_core::facts::PodInput;
use fixup_core::facts::annotations;
use fixup_host::pods::{keys, reasons};
use fixup_kit::conformance;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use rustix::process::{Pid, Signal, kill_process};
use serde_json::{Map, Value, json};
use support::binary::cocoon_fixup;

const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];
const NAMESPACE: &str = "prod";
/// The daemons' `--retry-budget`: the exhaustion scenarios' own setting.
const RETRY_BUDGET_MS: u64 = 10_000;
/// Pods that are no clone, per node.
const PLAIN_PODS: usize = 30;
/// Wave two's clones per node.
const FAULT_PODS: usize = 8;
/// The longest any wait below may take before the test gives up.
const PATIENCE: Duration = Duration::from_secs(300);
/// How long an exec that a scenario's change lands in takes at least.
const STRETCHED_EXEC_MS: u64 = 3000;
/// A finalizer that holds a deleted pod, for a scenario's `deleting`.
const HOLD: &str = "cocoon-lab.cocoonstack.io/hold";

// ---------------------------------------------------------------------------
// The lab, as a process this test stops and starts

struct LabProcess {
    dir: PathBuf,
    audit: PathBuf,
    port: u16,
    log: PathBuf,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
}

impl LabProcess {
    /// Starts the lab on `dir` (kept), on `port` (0: a free one).
    fn start(binary: &Path, dir: &Path, port: u16, log: &Path) -> LabProcess {
        let audit = dir.join("audit.jsonl");
        let started = Instant::now();
        let mut child = Command::new(binary)
            .arg("--dir")
            .arg(dir)
            .arg("--port")
            .arg(port.to_string())
            .arg("--audit-log")
            .arg(&audit)
            .args(NODES.iter().flat_map(|n| ["--node", n]))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(
                fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log)
                    .unwrap(),
            )
            .spawn()
            .expect("cocoon-kube-lab starts");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let line = line.unwrap_or_default();
                if let Some(rest) = line.strip_prefix("ready ") {
                    let _ = tx.send(rest.split_whitespace().next().map(str::to_owned));
                    return;
                }
            }
            let _ = tx.send(None);
        });
        let url = rx.recv_timeout(Duration::from_secs(180)).ok().flatten();
        let Some(url) = url else {
            let _ = child.kill();
            panic!(
                "cocoon-kube-lab did not get ready; its log:\n{}",
                tail(log, 40)
            );
        };
        let port = url.rsplit(':').next().unwrap().parse().unwrap();
        eprintln!(
            "cocoon-kube-lab ready at {url} after {:.1?}",
            started.elapsed()
        );
        LabProcess {
            dir: dir.to_owned(),
            audit,
            port,
            log: log.to_owned(),
            child: Some(child),
            stdin,
        }
    }

    /// Stops the API server and etcd (their data stays), as a restart of
    /// the control plane would.
    fn stop(&mut self) {
        drop(self.stdin.take());
        if let Some(mut child) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// The API server and etcd die (SIGKILL: no goodbye to a watch, no
    /// last bookmark) and start again on the same data and port.
    fn crash_and_restart(&mut self, binary: &Path) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        drop(self.stdin.take());
        self.restart(binary);
    }

    fn restart(&mut self, binary: &Path) {
        self.stop();
        let again = LabProcess::start(binary, &self.dir, self.port, &self.log);
        assert_eq!(again.port, self.port);
        *self = again;
    }
}

impl Drop for LabProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// deploy/'s RBAC and both admission policies as they ship, the
/// namespace, and each identity able to do what the test needs of it.
async fn prepare(dir: &Path) {
    let admin = client_at(dir, "admin").await;
    for file in [
        "deploy/rbac.yaml",
        "deploy/admission-policy.yaml",
        "deploy/wake-event-policy.yaml",
    ] {
        for document in yaml_documents(file) {
            apply(&admin, &document).await.unwrap();
        }
    }
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap(),
        )
        .await
        .unwrap();
    // No controller manager: the `default` service account the
    // ServiceAccount admission plugin wants is made by hand.
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), NAMESPACE);
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap(),
        )
        .await
        .unwrap();
    // The wake-event policy is in force once a daemon's `Woken` is
    // refused (the daemon may create events; this reason is the stack's).
    let daemon = client_at(dir, &format!("daemon-{}", NODES[0])).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            Instant::now() < deadline,
            "the wake-event policy is not enforced after 60 s"
        );
        match post_event(&daemon, &probe_event("Woken")).await {
            Err(kube::Error::Api(status))
                if status.code == 403 && status.message.contains("ValidatingAdmissionPolicy") =>
            {
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    // The stack's own event source may; another reason is anyone's.
    let stack = client_at(dir, "vk-cocoon").await;
    post_event(&stack, &probe_event("Woken"))
        .await
        .expect("the stack reports Woken");
    post_event(&daemon, &probe_event("PostCloneSucceeded"))
        .await
        .expect("a daemon reports its own reasons");
}

fn probe_event(reason: &str) -> Value {
    json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"generateName": "probe-", "namespace": NAMESPACE},
        "eventTime": micro_now(),
        "reason": reason,
        "note": "probe",
        "type": "Normal",
        "action": "Probe",
        "reportingController": "vk-cocoon",
        "reportingInstance": "vk-cocoon-probe",
        "regarding": {"kind": "Pod", "apiVersion": "v1", "namespace": NAMESPACE, "name": "probe", "uid": "probe"},
    })
}

/// Now, as events.k8s.io/v1 wants an `eventTime` (six digits).
fn micro_now() -> Value {
    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        jiff::Timestamp::now(),
    ))
    .unwrap()
}

async fn post_event(client: &Client, event: &Value) -> Result<(), kube::Error> {
    let request = kube::core::Request::new(format!(
        "/apis/events.k8s.io/v1/namespaces/{NAMESPACE}/events"
    ))
    .create(&PostParams::default(), serde_json::to_vec(event).unwrap())
    .map_err(kube::Error::BuildRequest)?;
    client.request_text(request).await.map(drop)
}

// ---------------------------------------------------------------------------
// A node: its daemon, its fake cocoon, its lease file

struct Node {
    name: &'static str,
    dir: PathBuf,
    vms: Map<String, Value>,
    leases: Vec<Value>,
    daemon: Option<tokio::process::Child>,
    starts: usize,
}

impl Node {
    fn new(name: &'static str, root: &Path) -> Node {
        let dir = root.join(name);
        fs::create_dir_all(dir.join("plugins")).unwrap();
        fs::write(dir.join("config.toml"), "").unwrap();
        support::fake_cocoon_in(&dir);
        let node = Node {
            name,
            dir,
            vms: Map::new(),
            leases: Vec::new(),
            daemon: None,
            starts: 0,
        };
        node.write_vms();
        node.write_leases();
        node
    }

    fn write_vms(&self) {
        let scenario = json!({
            "log": self.dir.join("calls.jsonl"),
            "state_file": self.dir.join("execs"),
            "vms": self.vms,
        });
        atomic_write(&self.dir.join("scenario.json"), &scenario);
    }

    fn write_leases(&self) {
        atomic_write(&self.dir.join("leases.json"), &json!(self.leases));
    }

    fn start(&mut self, lab: &Path) {
        self.starts += 1;
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("daemon.log"))
            .unwrap();
        let daemon = cocoon_fixup(
            &self.dir,
            &lab.join(format!("daemon-{}.kubeconfig", self.name)),
            &["serve", "--node", self.name],
        )
        .arg("--state-dir")
        .arg(self.dir.join("state"))
        .args(["--retry-budget", &format!("{RETRY_BUDGET_MS}ms")])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("the daemon starts");
        self.daemon = Some(daemon);
    }

    fn kill(&mut self) {
        let daemon = self.daemon.take().expect("running");
        let pid = Pid::from_raw(i32::try_from(daemon.id().unwrap()).unwrap()).unwrap();
        kill_process(pid, Signal::KILL).unwrap();
        drop(daemon);
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// Waits until the daemon's `starts`-th run has listed its node.
    async fn until_watching(&self, starts: usize) {
        let start = Instant::now();
        while self
            .log()
            .matches("startup reconciliation dispatched")
            .count()
            < starts
        {
            assert!(
                start.elapsed() < PATIENCE,
                "{}'s daemon never started watching:\n{}",
                self.name,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A JSON merge patch of annotations: a string sets, `null` removes.
fn merge_patch(annotations: &mut Map<String, Value>, patch: &Value) {
    for (k, v) in patch.as_object().into_iter().flatten() {
        if v.is_null() {
            annotations.remove(k);
        } else {
            annotations.insert(k.clone(), v.clone());
        }
    }
}

fn atomic_write(path: &Path, value: &Value) {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, value.to_string()).unwrap();
    fs::rename(tmp, path).unwrap();
}

// ---------------------------------------------------------------------------
// What was seen: the audit log and the fake CLI's calls, read as they grow

/// One thing the daemon did to a pod, in the order the API server or the
/// fake CLI saw it.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Write(Value),
    Event { reason: String, note: String },
}

#[derive(Default)]
struct Observed {
    /// By pod name: the daemons' writes and events.
    by_pod: HashMap<String, Vec<Seen>>,
    /// By pod name: the daemons' reads of it.
    reads: HashMap<String, usize>,
    /// By VM id: inspects and execs.
    inspects: HashMap<String, usize>,
    execs: HashMap<String, usize>,
    /// A daemon's request about a pod of another node.
    trespasses: Vec<String>,
    /// Requests by user, verb and resource.
    requests: BTreeMap<(String, String, String), usize>,
}

struct Tail {
    path: PathBuf,
    offset: u64,
    partial: String,
}

impl Tail {
    fn new(path: PathBuf) -> Tail {
        Tail {
            path,
            offset: 0,
            partial: String::new(),
        }
    }

    /// The complete lines appended since the last call.
    fn lines(&mut self) -> Vec<String> {
        let Ok(mut file) = fs::File::open(&self.path) else {
            return Vec::new();
        };
        let mut text = String::new();
        file.seek(SeekFrom::Start(self.offset)).unwrap();
        self.offset += file.read_to_string(&mut text).unwrap() as u64;
        self.partial.push_str(&text);
        let Some(end) = self.partial.rfind('\n') else {
            return Vec::new();
        };
        let complete: String = self.partial.drain(..=end).collect();
        complete.lines().map(str::to_owned).collect()
    }
}

struct Watcher {
    audit: Tail,
    calls: Vec<Tail>,
    /// Pod name to its node, for the pods this test made.
    nodes: Arc<Mutex<HashMap<String, &'static str>>>,
    seen: Observed,
}

impl Watcher {
    fn poll(&mut self) {
        for line in self.audit.lines() {
            let Ok(entry) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            self.audit_entry(&entry);
        }
        for tail in &mut self.calls {
            for line in tail.lines() {
                let Ok(call) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let argv: Vec<&str> = call["argv"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                match argv.as_slice() {
                    ["vm", "exec", id, ..] => {
                        *self.seen.execs.entry((*id).to_owned()).or_default() += 1
                    }
                    ["vm", "inspect", rest @ ..] => {
                        if let Some(id) = rest.iter().find(|a| !a.starts_with('-')) {
                            *self.seen.inspects.entry((*id).to_owned()).or_default() += 1
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    fn audit_entry(&mut self, entry: &Value) {
        if entry["stage"] != "ResponseComplete" {
            return;
        }
        let user = entry["user"]["username"].as_str().unwrap_or_default();
        let verb = entry["verb"].as_str().unwrap_or_default();
        let resource = entry["objectRef"]["resource"].as_str().unwrap_or_default();
        let code = entry["responseStatus"]["code"].as_i64().unwrap_or(0);
        *self
            .seen
            .requests
            .entry((user.to_owned(), verb.to_owned(), resource.to_owned()))
            .or_default() += 1;
        let Some(node) = user.strip_prefix("cocoon-fixup:") else {
            return;
        };
        let nodes = self.nodes.lock().unwrap();
        let about = match resource {
            "pods" => entry["objectRef"]["name"].as_str(),
            "events" => entry["requestObject"]["regarding"]["name"].as_str(),
            _ => None,
        };
        if let Some(pod) = about
            && let Some(owner) = nodes.get(pod)
            && *owner != node
        {
            self.seen
                .trespasses
                .push(format!("{user} {verb} {resource} about {pod} of {owner}"));
        }
        drop(nodes);
        // A daemon lists and watches pods of its node only.
        let selector = format!("fieldSelector=spec.nodeName%3D{node}");
        let uri = entry["requestURI"].as_str().unwrap_or_default();
        let own_node = uri.split(['?', '&']).any(|part| part == selector);
        if resource == "pods" && matches!(verb, "list" | "watch") && !own_node {
            self.seen
                .trespasses
                .push(format!("{user} {verb} pods {}", entry["requestURI"]));
        }
        let ok = (200..300).contains(&code);
        match (resource, verb, about) {
            ("pods", "get", Some(pod)) => {
                *self.seen.reads.entry(pod.to_owned()).or_default() += 1;
            }
            ("pods", "patch", Some(pod)) if ok => {
                let annotations = entry["requestObject"]["metadata"]["annotations"].clone();
                self.seen
                    .by_pod
                    .entry(pod.to_owned())
                    .or_default()
                    .push(Seen::Write(annotations));
            }
            ("events", "create", Some(pod)) if ok => {
                let event = &entry["requestObject"];
                self.seen
                    .by_pod
                    .entry(pod.to_owned())
                    .or_default()
                    .push(Seen::Event {
                        reason: event["reason"].as_str().unwrap_or_default().to_owned(),
                        note: event["note"].as_str().unwrap_or_default().to_owned(),
                    });
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------
// A conformance scenario as one pod on one node

/// What the audit log shows as one of core's conformance steps, for
/// core's own matcher (`Expected::matches`, without times: the lab runs
/// in real time).
fn as_step(seen: &Seen) -> conformance::Seen {
    match seen {
        Seen::Write(patch) => conformance::Seen::Write {
            at_ms: 0,
            patch: patch
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.as_str().map(str::to_owned)))
                .collect(),
        },
        Seen::Event { reason, note } => conformance::Seen::Event {
            at_ms: 0,
            reason: reason.clone(),
            message: note.clone(),
        },
    }
}

/// Something the test does at a moment of the scenario.
#[derive(Debug, Clone)]
enum Timed {
    Lease(Value),
    Change(Value),
}

#[derive(Debug, Clone)]
struct Case {
    scenario: String,
    node: &'static str,
    name: String,
    /// What cocoon may be asked for the scenario's VM by: its ids over the
    /// pod's life, and its name.
    vm_ids: Vec<String>,
    vm: Option<(String, Value)>,
    annotations: Map<String, Value>,
    events: Vec<Value>,
    /// Leases there from the start.
    leases: Vec<Value>,
    timed: Vec<(u64, Timed)>,
    /// The trace's daemon-visible steps with their times, in order:
    /// (at_ms, kind: "inspect", "exec", "write", "event").
    trace: Vec<(u64, &'static str)>,
    /// The execs (by their place in the scenario's list) a change lands
    /// in.
    stretched: Vec<usize>,
    /// The trace's writes and events, untimed.
    expected: Vec<conformance::Expected>,
    /// A change ends the pod's work at this step of `expected`: the daemon
    /// stops work in flight when a watch event says the pod has none (the
    /// scenario's host, which reads the pod only between steps, may do a
    /// step more); from here on, `expected` may end sooner.
    stops_after: Option<usize>,
    execs: usize,
    deleted: bool,
    held: bool,
    /// The pod is being deleted from the start.
    deleting: bool,
}

/// Why a scenario cannot be played on the lab, or `None`.
fn left_out(scenario: &Value) -> Option<String> {
    let played = [
        "about", "expect", "pod", "vm", "execs", "leases", "changes", "events", "record",
        "settings",
    ];
    if let Some(key) = scenario
        .as_object()
        .unwrap()
        .keys()
        .find(|k| !played.contains(&k.as_str()))
    {
        return Some(format!("`{key}` (the lab has no such world)"));
    }
    if !scenario["record"].is_null() {
        return Some("a record the host kept before the scenario".into());
    }
    if scenario.get("record").is_none() {
        // A host without records: the daemon always keeps them.
        if scenario["vm"]["config"]["name"].is_null() {
            return Some("no VM name".into());
        }
    }
    if let Some(settings) = scenario["settings"].as_object()
        && settings
            .iter()
            .any(|(k, v)| k != "retry_budget_ms" || v.as_u64() != Some(RETRY_BUDGET_MS))
    {
        return Some(format!(
            "settings {} (the daemons run with a {RETRY_BUDGET_MS} ms budget only)",
            Value::Object(settings.clone())
        ));
    }
    if scenario["execs"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|e| e.get("error").is_some())
    {
        return Some("an exec that fails in the cocoon CLI itself".into());
    }
    for change in scenario["changes"].as_array().into_iter().flatten() {
        if change["recreated"] == true {
            return Some("a pod recreated under its name (a second task's work)".into());
        }
        if !change["annotations"][annotations::VM_ID].is_null() {
            return Some(
                "a new VM id (the daemon's watch starts a second task for it, past the scenario's one)"
                    .into(),
            );
        }
    }
    for event in scenario["events"].as_array().into_iter().flatten() {
        let keys: Vec<&String> = event.as_object().unwrap().keys().collect();
        if keys
            .iter()
            .any(|k| !["reason", "type", "reporting_controller"].contains(&k.as_str()))
        {
            return Some("an event with its own time or subject".into());
        }
    }
    let pod_annotations = &scenario["pod"]["metadata"]["annotations"];
    if pod_annotations[annotations::OS] == "windows"
        && scenario["vm"]["network_configs"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|nic| !nic["network"].is_null())
    {
        return Some(
            "a Windows static NIC: set over the VM's serial console, which the lab does not have"
                .into(),
        );
    }
    if scenario["expect"]["trace"].is_null() {
        return Some("no trace".into());
    }
    None
}

/// The scenario's names made this pod's own: the pod `name`, the VM name
/// derived from it, every `vm-<n>` id and every MAC.
fn localise(text: &str, scenario: &Value, name: &str, node: &str, index: usize) -> String {
    let pod = &scenario["pod"]["metadata"];
    let old_pod = pod["name"].as_str().unwrap_or("demo-2");
    let old_namespace = pod["namespace"].as_str().unwrap_or(NAMESPACE);
    let mut text = text.replace(
        &vm_name_for_pod(old_namespace, old_pod),
        &vm_name_for_pod(NAMESPACE, name),
    );
    text = text.replace(&format!("\"{old_pod}\""), &format!("\"{name}\""));
    text = text.replace(
        &format!("{old_namespace}/{old_pod}"),
        &format!("{NAMESPACE}/{name}"),
    );
    // Every MAC of the VM, in either case.
    for nic in scenario["vm"]["network_configs"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(mac) = nic["mac"].as_str()
            && mac.len() == 17
            && mac
                .split(':')
                .all(|b| b.len() == 2 && b.bytes().all(|c| c.is_ascii_hexdigit()))
        {
            let node_byte = NODES.iter().position(|n| *n == node).unwrap();
            let last = &mac[15..];
            // The first byte keeps what it says (a multicast MAC stays one).
            let first = &mac[..2];
            let new = format!(
                "{first}:54:{node_byte:02x}:{:02x}:{:02x}:{last}",
                index / 256,
                index % 256
            )
            .to_lowercase();
            text = text
                .replace(&mac.to_lowercase(), &new)
                .replace(&mac.to_uppercase(), &new.to_uppercase());
        }
    }
    // `vm-<digits>` as a whole word.
    let mut out = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let word_start = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'-');
        if word_start && text[i..].starts_with("vm-") {
            let digits = text[i + 3..].bytes().take_while(u8::is_ascii_digit).count();
            let after = text.as_bytes().get(i + 3 + digits).copied();
            if digits > 0 && !after.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'-') {
                out.push_str(&format!(
                    "vm-{node}-{index}-{}",
                    &text[i + 3..i + 3 + digits]
                ));
                i += 3 + digits;
                continue;
            }
        }
        let c = text[i..].chars().next().unwrap();
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// Whether `change` leaves the scenario's pod with no work for the host.
fn ends_work(scenario: &Value, change: &Value) -> bool {
    if change["deleted"] == true || change["deleting"] == true {
        return true;
    }
    let mut pod = scenario["pod"].clone();
    let annotations = pod["metadata"]["annotations"].as_object_mut().unwrap();
    for (k, v) in change["annotations"].as_object().into_iter().flatten() {
        if v.is_null() {
            annotations.remove(k);
        } else {
            annotations.insert(k.clone(), v.clone());
        }
    }
    PodInput::from_value(&pod, "scenario").is_ok_and(|pod| !has_work(&pod))
}

fn case(file: &Path, scenario: &Value, node: &'static str, index: usize) -> Case {
    let stem = file.file_stem().unwrap().to_str().unwrap().to_owned();
    // The scenario's own name stays in it: a name's length can matter
    // (a VM name too long to be a hostname).
    let old = scenario["pod"]["metadata"]["name"]
        .as_str()
        .unwrap_or("demo-2");
    let name = format!("c{index:03}-{node}-{old}");
    let text = localise(
        &fs::read_to_string(file).unwrap(),
        scenario,
        &name,
        node,
        index,
    );
    let s: Value = serde_json::from_str(&text).unwrap();
    let deleting = !s["pod"]["metadata"]["deletionTimestamp"].is_null();
    let annotations = s["pod"]["metadata"]["annotations"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let vm = s["vm"]["id"]
        .as_str()
        .map(|id| (id.to_owned(), s["vm"].clone()));
    let mut vm_ids: Vec<String> = vm.iter().map(|(id, _)| id.clone()).collect();
    // What cocoon is asked by: the id annotation, or the VM name for a
    // pod without one.
    for key in [annotations::VM_ID, annotations::VM_NAME] {
        if let Some(id) = annotations.get(key).and_then(Value::as_str)
            && !vm_ids.iter().any(|v| v == id)
        {
            vm_ids.push(id.to_owned());
        }
    }
    let mut leases = Vec::new();
    let mut timed = Vec::new();
    let lease_row =
        |l: &Value| json!({"mac": l["mac"], "ip": l["ip"], "expiry": "2100-01-01T00:00:00Z"});
    for lease in s["leases"].as_array().into_iter().flatten() {
        match lease["at_ms"].as_u64().unwrap_or(0) {
            0 => leases.push(lease_row(lease)),
            at => timed.push((at, Timed::Lease(lease_row(lease)))),
        }
    }
    let mut deleted = false;
    let mut held = false;
    for change in s["changes"].as_array().into_iter().flatten() {
        deleted |= change["deleted"] == true;
        held |= change["deleting"] == true;
        if let Some(id) = change["annotations"][annotations::VM_ID].as_str() {
            vm_ids.push(id.to_owned());
        }
        timed.push((
            change["at_ms"].as_u64().unwrap(),
            Timed::Change(change.clone()),
        ));
    }
    timed.sort_by_key(|(at, _)| *at);
    let mut trace = Vec::new();
    let mut expected = Vec::new();
    let mut execs = 0;
    let mut stops_after = None;
    let parsed: conformance::Scenario =
        serde_json::from_value(s.clone()).unwrap_or_else(|e| panic!("{stem}: {e}"));
    let mut stretched = Vec::new();
    for mut step in parsed.expect.trace {
        let at = step.at_ms.unwrap_or(0);
        if step.exec.is_some() {
            let takes = parsed.execs.get(execs).map_or(0, |e| e.takes_ms);
            if timed
                .iter()
                .any(|(t, timed)| matches!(timed, Timed::Change(_)) && *t >= at && *t < at + takes)
            {
                stretched.push(execs);
            }
        }
        if stops_after.is_none()
            && timed
                .iter()
                .any(|(t, timed)| *t <= at && matches!(timed, Timed::Change(c) if ends_work(&s, c)))
        {
            stops_after = Some(expected.len());
        }
        step.at_ms = None;
        if step.inspect.is_some() {
            trace.push((at, "inspect"));
        } else if step.exec.is_some() {
            trace.push((at, "exec"));
            execs += 1;
        } else if step.write.is_some() || step.prepared_by.is_some() {
            trace.push((at, "write"));
            expected.push(step);
        } else if step.event.is_some() {
            trace.push((at, "event"));
            expected.push(step);
        }
    }
    if stops_after.is_none()
        && timed
            .iter()
            .any(|(_, timed)| matches!(timed, Timed::Change(c) if ends_work(&s, c)))
    {
        stops_after = Some(expected.len());
    }
    Case {
        scenario: stem,
        node,
        name,
        vm_ids,
        vm,
        annotations,
        events: s["events"].as_array().cloned().unwrap_or_default(),
        leases,
        timed,
        trace,
        stretched,
        expected,
        stops_after,
        execs,
        deleted,
        held: held || deleting,
        deleting,
    }
}

/// The fake CLI's answers for the case's VM: its inspect, its execs in
/// order (a success past the list, as the scenarios say), those in
/// `stretched` taking at least [`STRETCHED_EXEC_MS`].
fn vm_answers(vm: &Value, execs: &[Value], stretched: &[usize]) -> Value {
    let mut script: Vec<Value> = execs
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let takes = e["takes_ms"].as_u64().unwrap_or(0);
            // An exec a change lands in takes long enough for the change
            // to land in it on a busy machine too (the test makes the
            // change once it has seen the exec start).
            let takes = if stretched.contains(&i) {
                takes.max(STRETCHED_EXEC_MS)
            } else {
                takes
            };
            let mut entry = json!({
                "exit": e["exit"].as_i64().unwrap_or(0),
                "stderr": e["stderr"].as_str().unwrap_or(""),
                "sleep_ms": takes,
            });
            if let Some(signal) = e["signal"].as_i64() {
                entry["signal"] = json!(signal);
            } else if entry["exit"] == 0 {
                entry["done"] = json!(true);
            }
            entry
        })
        .collect();
    script.push(json!({"exit": 0, "done": true}));
    json!({"exec": script, "inspect": {"json": vm}})
}

// ---------------------------------------------------------------------------
// Playing a case

struct Cluster {
    dir: PathBuf,
    nodes: Arc<Mutex<Vec<Node>>>,
    seen: Arc<Mutex<Observed>>,
}

impl Cluster {
    fn node_mut<R>(&self, name: &str, f: impl FnOnce(&mut Node) -> R) -> R {
        let mut nodes = self.nodes.lock().unwrap();
        f(nodes.iter_mut().find(|n| n.name == name).unwrap())
    }

    /// How far the daemon has come with `case`: counts per kind.
    fn progress(&self, case: &Case) -> BTreeMap<&'static str, usize> {
        let seen = self.seen.lock().unwrap();
        let mut counts = BTreeMap::new();
        counts.insert(
            "inspect",
            case.vm_ids
                .iter()
                .map(|id| seen.inspects.get(id).copied().unwrap_or(0))
                .sum(),
        );
        counts.insert(
            "exec",
            case.vm_ids
                .iter()
                .map(|id| seen.execs.get(id).copied().unwrap_or(0))
                .sum(),
        );
        let mine = seen.by_pod.get(&case.name).cloned().unwrap_or_default();
        counts.insert(
            "write",
            mine.iter().filter(|s| matches!(s, Seen::Write(_))).count(),
        );
        counts.insert(
            "event",
            mine.iter()
                .filter(|s| matches!(s, Seen::Event { .. }))
                .count(),
        );
        counts
    }

    /// Waits until the daemon has done every step the trace has before
    /// `at_ms`.
    async fn reach(&self, case: &Case, at_ms: u64) {
        let mut want: BTreeMap<&str, usize> = BTreeMap::new();
        for (at, kind) in &case.trace {
            if *at < at_ms {
                *want.entry(kind).or_default() += 1;
            }
        }
        let start = Instant::now();
        loop {
            let got = self.progress(case);
            if want
                .iter()
                .all(|(k, n)| got.get(k).copied().unwrap_or(0) >= *n)
            {
                return;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "{} ({}): the daemon never got to {at_ms} ms: wanted {want:?}, seen {got:?}",
                case.name,
                case.scenario
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn play(&self, case: Case) {
        let controller: Api<Pod> =
            Api::namespaced(client_at(&self.dir, "controller").await, NAMESPACE);
        let admin: Api<Pod> = Api::namespaced(client_at(&self.dir, "admin").await, NAMESPACE);
        // What the scenario has at its start must all be there before the
        // daemon can find the VM: with the VM's name alone it inspects by
        // name and starts. So the stack's events are posted before the
        // pod names its VM (by id or name), and a pod that is being
        // deleted from the start is created with no annotations at all
        // and gets them once its deletion is in.
        let mut first = case.annotations.clone();
        let late: serde_json::Map<String, Value> = if case.deleting {
            std::mem::take(&mut first)
        } else if case.events.is_empty() {
            serde_json::Map::new()
        } else {
            [annotations::VM_ID, annotations::VM_NAME]
                .into_iter()
                .filter_map(|key| first.remove_entry(key))
                .collect()
        };
        let mut object = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": case.name, "annotations": first},
            "spec": {"nodeName": case.node, "containers": [{"name": "c", "image": "example.invalid/c"}]},
        });
        if case.held {
            object["metadata"]["finalizers"] = json!([HOLD]);
        }
        let pod = controller
            .create(
                &PostParams::default(),
                &serde_json::from_value(object).unwrap(),
            )
            .await
            .unwrap_or_else(|e| panic!("the controller creates {}: {e}", case.name));
        let uid = pod.metadata.uid.clone().unwrap();
        if case.deleting {
            admin
                .delete(&case.name, &DeleteParams::default())
                .await
                .unwrap();
        }
        {
            let stack = client_at(&self.dir, "vk-cocoon").await;
            for event in &case.events {
                let body = json!({
                    "apiVersion": "events.k8s.io/v1",
                    "kind": "Event",
                    "metadata": {"generateName": format!("{}-", case.name), "namespace": NAMESPACE},
                    "eventTime": micro_now(),
                    "reason": event["reason"],
                    "note": "from the stack",
                    "type": event["type"],
                    "action": "Wake",
                    "reportingController": event["reporting_controller"].as_str().unwrap_or("vk-cocoon"),
                    "reportingInstance": "vk-cocoon-lab",
                    "regarding": {"kind": "Pod", "apiVersion": "v1", "namespace": NAMESPACE, "name": case.name, "uid": uid},
                });
                post_event(&stack, &body)
                    .await
                    .unwrap_or_else(|e| panic!("{}: the stack's event: {e}", case.name));
            }
            if !late.is_empty() {
                controller
                    .patch(
                        &case.name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"annotations": late}})),
                    )
                    .await
                    .unwrap();
            }
        }
        for (at, timed) in &case.timed {
            self.reach(&case, *at).await;
            match timed {
                Timed::Lease(row) => self.node_mut(case.node, |n| {
                    n.leases.push(row.clone());
                    n.write_leases();
                }),
                Timed::Change(change) => {
                    if change["deleted"] == true {
                        // No kubelet confirms a graceful deletion here.
                        admin
                            .delete(&case.name, &DeleteParams::default().grace_period(0))
                            .await
                            .unwrap();
                    }
                    if change["deleting"] == true {
                        admin
                            .delete(&case.name, &DeleteParams::default())
                            .await
                            .unwrap();
                    }
                    if let Some(set) = change["annotations"].as_object()
                        && !set.is_empty()
                    {
                        controller
                            .patch(
                                &case.name,
                                &PatchParams::default(),
                                &Patch::Merge(json!({"metadata": {"annotations": set}})),
                            )
                            .await
                            .unwrap_or_else(|e| panic!("{}: change: {e}", case.name));
                    }
                }
            }
        }
    }

    /// Whether the daemon has done all the case asks.
    fn settled(&self, case: &Case) -> bool {
        let got = self.progress(case);
        got["exec"] >= case.execs
            && got["write"] + got["event"] >= case.stops_after.unwrap_or(case.expected.len())
    }

    /// What differs from the scenario, or nothing.
    /// `before`: what the daemon had done about the pod when it was checked
    /// last; since then it may only have told a standing warning once
    /// more, and only where its daemon was `restarted`.
    async fn differences(
        &self,
        case: &Case,
        admin: &Api<Pod>,
        before: Option<&[Seen]>,
        restarted: bool,
    ) -> Vec<String> {
        let mut wrong = Vec::new();
        let mut seen = self
            .seen
            .lock()
            .unwrap()
            .by_pod
            .get(&case.name)
            .cloned()
            .unwrap_or_default();
        if let Some(before) = before {
            // A daemon started again tells a standing warning once more (it
            // keeps no record of having told a VM mismatch or a node
            // error): the very same event once again, and nothing else.
            let since = if seen.starts_with(before) {
                seen.split_off(before.len())
            } else {
                wrong.push(format!(
                    "what the daemon did changed since the last check:\n    then {before:?}\n    now  {seen:?}"
                ));
                Vec::new()
            };
            let mut again: Vec<&Seen> = Vec::new();
            for step in &since {
                let standing = matches!(step, Seen::Event { reason, .. }
                    if [reasons::VM_MISMATCH, reasons::NODE_ERROR].contains(&reason.as_str()));
                if !(restarted && standing && before.contains(step) && !again.contains(&step)) {
                    wrong.push(format!("done since the last check: {step:?}"));
                }
                again.push(step);
            }
        }
        let matches = |n: usize| {
            seen.len() == n
                && case.expected[..n]
                    .iter()
                    .zip(&seen)
                    .all(|(e, s)| e.matches(&as_step(s)))
        };
        let same = match case.stops_after {
            Some(from) => (from..=case.expected.len()).any(matches),
            None => matches(case.expected.len()),
        };
        if !same {
            wrong.push(format!(
                "writes and events:\n    expected {:?}\n    seen     {seen:?}",
                case.expected
            ));
        }
        let execs = self.progress(case)["exec"];
        if execs != case.execs {
            wrong.push(format!("{execs} execs, expected {}", case.execs));
        }
        match admin.get_opt(&case.name).await.unwrap() {
            None if case.deleted => {}
            None => wrong.push("the pod is gone".into()),
            Some(_) if case.deleted => wrong.push("the pod is still there".into()),
            Some(pod) => {
                // Nothing but the daemon's writes and the scenario's
                // changes touched the annotations, and the server applied
                // each merge patch as the daemon meant it.
                let mut want = case.annotations.clone();
                for (_, timed) in &case.timed {
                    if let Timed::Change(change) = timed {
                        merge_patch(&mut want, &change["annotations"]);
                    }
                }
                for step in &seen {
                    if let Seen::Write(patch) = step {
                        merge_patch(&mut want, patch);
                    }
                }
                let got: Map<String, Value> = pod
                    .metadata
                    .annotations
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect();
                if got != want {
                    wrong.push(format!(
                        "annotations:\n    expected {want:?}\n    got      {got:?}"
                    ));
                }
            }
        }
        wrong
    }
}

/// Creates its file when dropped (a panic included), so that no exec
/// waits on it after the test.
struct OpenGate(PathBuf);

impl Drop for OpenGate {
    fn drop(&mut self) {
        let _ = fs::write(&self.0, "");
    }
}

/// Sets its flag when dropped (a panic included).
struct StopOnDrop(Arc<Mutex<bool>>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Ok(mut stop) = self.0.lock() {
            *stop = true;
        }
    }
}

/// Polls the logs until `stop`.
fn watch_logs(mut watcher: Watcher, seen: Arc<Mutex<Observed>>, stop: Arc<Mutex<bool>>) {
    std::thread::spawn(move || {
        loop {
            watcher.poll();
            let new = std::mem::take(&mut watcher.seen);
            merge(&mut seen.lock().unwrap(), new);
            if *stop.lock().unwrap() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
}

/// `into` gains what `new` saw since.
fn merge(into: &mut Observed, new: Observed) {
    for (pod, steps) in new.by_pod {
        into.by_pod.entry(pod).or_default().extend(steps);
    }
    for (pod, n) in new.reads {
        *into.reads.entry(pod).or_default() += n;
    }
    for (id, n) in new.inspects {
        *into.inspects.entry(id).or_default() += n;
    }
    for (id, n) in new.execs {
        *into.execs.entry(id).or_default() += n;
    }
    into.trespasses.extend(new.trespasses);
    for (key, n) in new.requests {
        *into.requests.entry(key).or_default() += n;
    }
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_play_every_scenario_and_survive_the_faults_of_a_cluster() {
    let Some(binary) = lab_binary().unwrap_or_else(|e| panic!("{e}")) else {
        return;
    };
    // Kept after a failure, for its logs (the daemons', the lab's, the
    // audit log); removed after a success.
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("realkube-nodes-{}", std::process::id()));
    fs::create_dir_all(&root).unwrap();
    let lab_dir = root.join("lab");
    let lab_log = root.join("cocoon-kube-lab.log");
    eprintln!("logs in {}", root.display());
    let mut lab = LabProcess::start(&binary, &lab_dir, 0, &lab_log);
    prepare(&lab_dir).await;

    // The cases: every scenario the lab can play, once per node.
    let mut files: Vec<PathBuf> = fs::read_dir(repo().join("tests/conformance"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    let mut skipped = Vec::new();
    let mut index = 0;
    for file in &files {
        let scenario: Value = serde_json::from_str(&fs::read_to_string(file).unwrap()).unwrap();
        if let Some(why) = left_out(&scenario) {
            skipped.push(format!(
                "{}: {why}",
                file.file_stem().unwrap().to_string_lossy()
            ));
            continue;
        }
        for node in NODES {
            index += 1;
            cases.push(case(file, &scenario, node, index));
        }
    }
    eprintln!(
        "{} scenarios played on each of {} nodes; left out ({}):\n  {}",
        cases.len() / NODES.len(),
        NODES.len(),
        skipped.len(),
        skipped.join("\n  ")
    );
    assert!(
        cases.len() / NODES.len() >= 40,
        "too few scenarios playable: {}",
        cases.len() / NODES.len()
    );

    let pod_nodes: Arc<Mutex<HashMap<String, &'static str>>> = Arc::default();
    let mut nodes = Vec::new();
    for name in NODES {
        nodes.push(Node::new(name, &root));
    }
    for case in &cases {
        let node = nodes.iter_mut().find(|n| n.name == case.node).unwrap();
        let scenario: Value = serde_json::from_str(
            &fs::read_to_string(repo().join(format!("tests/conformance/{}.json", case.scenario)))
                .unwrap(),
        )
        .unwrap();
        if let Some((_, vm)) = &case.vm {
            let execs = scenario["execs"].as_array().cloned().unwrap_or_default();
            // cocoon answers with this VM whichever id it is asked for,
            // as the scenario's world does.
            for id in &case.vm_ids {
                node.vms
                    .insert(id.clone(), vm_answers(vm, &execs, &case.stretched));
            }
        }
        node.leases.extend(case.leases.iter().cloned());
        pod_nodes
            .lock()
            .unwrap()
            .insert(case.name.clone(), case.node);
    }
    for node in &mut nodes {
        node.write_vms();
        node.write_leases();
        node.start(&lab_dir);
    }
    // Each daemon has listed its (empty) node and watches: every pod
    // below is new to it, as the scenarios' pods are.
    for node in &nodes {
        node.until_watching(1).await;
    }
    let watcher = Watcher {
        audit: Tail::new(lab.audit.clone()),
        calls: nodes
            .iter()
            .map(|n| Tail::new(n.dir.join("calls.jsonl")))
            .collect(),
        nodes: pod_nodes.clone(),
        seen: Observed::default(),
    };
    let seen = Arc::new(Mutex::new(Observed::default()));
    let stop = Arc::new(Mutex::new(false));
    watch_logs(watcher, seen.clone(), stop.clone());
    // However the test ends, the log reader stops with it.
    let _stop_reading = StopOnDrop(stop.clone());
    let cluster = Arc::new(Cluster {
        dir: lab_dir.clone(),
        nodes: Arc::new(Mutex::new(nodes)),
        seen: seen.clone(),
    });

    // Plain pods: no clone, no work, on every node.
    let controller: Api<Pod> = Api::namespaced(client_at(&lab_dir, "controller").await, NAMESPACE);
    for node in NODES {
        for i in 0..PLAIN_PODS {
            let name = format!("plain-{i:02}-{node}");
            pod_nodes.lock().unwrap().insert(name.clone(), node);
            let object = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": {"app": "plain"}},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "example.invalid/c"}]},
            });
            controller
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(object).unwrap(),
                )
                .await
                .unwrap();
        }
    }

    // Every case at once, as a busy cluster would have them.
    let started = Instant::now();
    let mut plays = Vec::new();
    for case in cases.clone() {
        let cluster = cluster.clone();
        plays.push(tokio::spawn(async move { cluster.play(case).await }));
    }
    for play in plays {
        play.await.unwrap();
    }
    let deadline = Instant::now() + PATIENCE;
    while !cases.iter().all(|c| cluster.settled(c)) {
        if Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Quiet: anything more the daemons would do shows now.
    tokio::time::sleep(Duration::from_secs(5)).await;
    eprintln!(
        "{} pods ({} clones) settled after {:.1?}",
        cases.len() + PLAIN_PODS * NODES.len(),
        cases.len(),
        started.elapsed()
    );
    let first = check_first_wave(&cluster, &cases, None, &[], "").await;

    // Wave two: the faults.
    faults(&cluster, &mut lab, &binary, &pod_nodes).await;
    // After the faults the first wave is as it was: the killed daemon's
    // second run and every relist found its pods and did nothing more.
    check_first_wave(
        &cluster,
        &cases,
        Some(&first),
        &[NODES[0]],
        " after the faults",
    )
    .await;
    *stop.lock().unwrap() = true;
    let requests = seen.lock().unwrap().requests.clone();
    for ((user, verb, resource), n) in &requests {
        if user.starts_with("cocoon-fixup:") {
            eprintln!("{user} {verb} {resource}: {n}");
        }
    }
    let mut nodes = cluster.nodes.lock().unwrap();
    for node in nodes.iter_mut() {
        node.daemon.take();
    }
    drop(nodes);
    lab.stop();
    let _ = fs::remove_dir_all(&root);
}

/// Every case as its scenario says, the pods that are no clone untouched
/// (no read, no write, no event), and no daemon about another node's pod.
/// Returns what the daemons had done about each pod, for the next check
/// (`before`).
async fn check_first_wave(
    cluster: &Cluster,
    cases: &[Case],
    before: Option<&HashMap<String, Vec<Seen>>>,
    restarted: &[&str],
    when: &str,
) -> HashMap<String, Vec<Seen>> {
    let admin: Api<Pod> = Api::namespaced(client_at(&cluster.dir, "admin").await, NAMESPACE);
    let mut report = Vec::new();
    for case in cases {
        let last = before.map(|b| b.get(&case.name).map_or(&[][..], Vec::as_slice));
        let wrong = cluster
            .differences(case, &admin, last, restarted.contains(&case.node))
            .await;
        if !wrong.is_empty() {
            report.push(format!(
                "{} on {} ({}):\n  {}",
                case.scenario,
                case.node,
                case.name,
                wrong.join("\n  ")
            ));
        }
    }
    {
        let seen = cluster.seen.lock().unwrap();
        for node in NODES {
            for i in 0..PLAIN_PODS {
                let name = format!("plain-{i:02}-{node}");
                if let Some(steps) = seen.by_pod.get(&name) {
                    report.push(format!("{name}: no clone, yet {steps:?}"));
                }
                if let Some(reads) = seen.reads.get(&name) {
                    report.push(format!("{name}: no clone, yet read {reads} times"));
                }
            }
        }
        assert!(
            seen.trespasses.is_empty(),
            "{when}: a daemon touched another node's pod:\n{}",
            seen.trespasses.join("\n")
        );
    }
    if !report.is_empty() {
        let logs: Vec<String> = cluster
            .nodes
            .lock()
            .unwrap()
            .iter()
            .map(|n| {
                format!(
                    "--- {} daemon log (end)\n{}",
                    n.name,
                    last_lines(&n.log(), 40)
                )
            })
            .collect();
        panic!(
            "{} of {} cases differ from their scenarios{when}:\n{}\n{}",
            report.len(),
            cases.len(),
            report.join("\n"),
            logs.join("\n")
        );
    }
    cluster.seen.lock().unwrap().by_pod.clone()
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A static clone whose first attempt is held at `gate` and then fails.
fn slow_clone(name: &str, node: &'static str, index: usize, gate: &Path) -> (Value, Value, String) {
    let id = format!("vm-{node}-slow-{index}");
    let vm_name = vm_name_for_pod(NAMESPACE, name);
    let ip = format!(
        "10.9.{}.{}",
        NODES.iter().position(|n| *n == node).unwrap(),
        index + 2
    );
    let annotations = json!({
        annotations::MANAGED: "true",
        annotations::VM_ID: id,
        annotations::VM_NAME: vm_name,
        annotations::BACKEND: "cloud-hypervisor",
    });
    let vm = json!({
        "id": id,
        "config": {"name": vm_name, "image": "ghcr.io/cocoonstack/ubuntu:24.04"},
        "network_configs": [{"mac": format!("52:54:0f:00:{:02x}:{:02x}", NODES.iter().position(|n| *n == node).unwrap(), index), "network": {"ip": ip, "prefix": 24, "gateway": "10.9.0.1"}}],
    });
    let answers = json!({
        "exec": [
            {"exit": 1, "stderr": "networkd is not running", "gate": gate},
            {"exit": 0, "done": true, "sleep_ms": 1000},
        ],
        "inspect": {"json": vm},
    });
    (annotations, answers, ip)
}

async fn faults(
    cluster: &Cluster,
    lab: &mut LabProcess,
    binary: &Path,
    pod_nodes: &Arc<Mutex<HashMap<String, &'static str>>>,
) {
    let controller: Api<Pod> =
        Api::namespaced(client_at(&cluster.dir, "controller").await, NAMESPACE);
    // Every first attempt is held here until node-a's daemon is dead:
    // each of its clones is mid-loop when it dies, however slow the
    // machine. (Opened before the API server's restart, which the budget
    // of the attempt under way need not outlast; opened whatever happens.)
    let gate = cluster.dir.with_file_name("gate");
    let _open_at_the_end = OpenGate(gate.clone());
    let mut pods = Vec::new();
    for node in NODES {
        for i in 0..FAULT_PODS {
            let name = format!("slow-{i:02}-{node}");
            let (annotations, answers, ip) = slow_clone(&name, node, i, &gate);
            cluster.node_mut(node, |n| {
                n.vms.insert(
                    annotations[annotations::VM_ID].as_str().unwrap().to_owned(),
                    answers,
                );
                n.write_vms();
            });
            pod_nodes.lock().unwrap().insert(name.clone(), node);
            let object = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "annotations": annotations},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "example.invalid/c"}]},
            });
            controller
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(object).unwrap(),
                )
                .await
                .unwrap();
            pods.push((
                name,
                node,
                annotations[annotations::VM_ID].as_str().unwrap().to_owned(),
                ip,
            ));
        }
    }
    // Mid-loop everywhere: every clone's first attempt has started.
    let start = Instant::now();
    loop {
        let started = {
            let seen = cluster.seen.lock().unwrap();
            pods.iter()
                .all(|(_, _, id, _)| seen.execs.get(id).copied().unwrap_or(0) >= 1)
        };
        if started {
            break;
        }
        assert!(start.elapsed() < PATIENCE, "the slow clones never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // node-a's daemon dies mid-exec, and comes back.
    cluster.node_mut(NODES[0], Node::kill);
    fs::write(&gate, "").unwrap();
    cluster.node_mut(NODES[0], |n| n.start(&cluster.dir));
    // The control plane crashes and restarts on its data. Just before, a
    // write no daemon watches (a ConfigMap) moves the store on, so each
    // watch that comes back is behind the new server's watch cache.
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client_at(&cluster.dir, "admin").await, NAMESPACE);
    configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "before-the-crash"}})).unwrap(),
        )
        .await
        .unwrap();
    lab.crash_and_restart(binary);
    let start = Instant::now();
    let admin: Api<Pod> = Api::namespaced(client_at(&cluster.dir, "admin").await, NAMESPACE);
    loop {
        let mut done = 0;
        for (name, _, _, ip) in &pods {
            if let Ok(pod) = admin.get(name).await {
                let a = pod.metadata.annotations.unwrap_or_default();
                if a.get(keys::POST_CLONE_STATE).map(String::as_str) == Some("done")
                    && a.get(keys::LIFECYCLE_STATE).map(String::as_str) == Some("ready")
                    && a.get(keys::IP) == Some(ip)
                {
                    done += 1;
                }
            }
        }
        if done == pods.len() {
            break;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "{done} of {} slow clones fixed after the faults; node-a's log:\n{}",
            pods.len(),
            cluster.node_mut(NODES[0], |n| last_lines(&n.log(), 60))
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (by_pod, execs, trespasses) = {
        let seen = cluster.seen.lock().unwrap();
        (
            seen.by_pod.clone(),
            seen.execs.clone(),
            seen.trespasses.clone(),
        )
    };
    let mut wrong = Vec::new();
    for (name, node, id, _) in &pods {
        let steps = by_pod.get(name).cloned().unwrap_or_default();
        let done_writes = steps
            .iter()
            .filter(|s| matches!(s, Seen::Write(w) if w[keys::POST_CLONE_STATE] == "done"))
            .count();
        let successes = steps
            .iter()
            .filter(|s| matches!(s, Seen::Event { reason, .. } if reason == reasons::SUCCEEDED))
            .count();
        let execs = execs.get(id).copied().unwrap_or(0);
        if done_writes != 1 || successes != 1 || execs < 2 {
            wrong.push(format!(
                "{name} on {node}: {done_writes} done writes, {successes} successes, {execs} execs: {steps:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "after the faults:\n{}", wrong.join("\n"));
    assert!(
        trespasses.is_empty(),
        "a daemon touched another node's pod:\n{}",
        trespasses.join("\n")
    );
    // The killed daemon's pods were mid-loop (`running`): its second run
    // resumed them, and said so.
    for (name, node, _, _) in &pods {
        let resumed = by_pod.get(name).into_iter().flatten().any(|s| {
            matches!(s, Seen::Event { reason, note }
                if reason == "ResumedAfterRestart" && note == "op=post_clone")
        });
        assert_eq!(
            resumed,
            *node == NODES[0],
            "{name} on {node}: ResumedAfterRestart {resumed}"
        );
    }
    // A watch resumed from a resourceVersion the restarted server's watch
    // cache does not reach back to is told `410 Gone` (as an error event
    // in the stream, so the audit log shows a 200): the daemons that
    // were not restarted relist.
    let expired: Vec<String> = NODES[1..]
        .iter()
        .map(|node| {
            cluster.node_mut(node, |n| {
                n.log()
                    .lines()
                    .filter(|l| l.contains("pod watch") && l.contains("Expired"))
                    .count()
            })
        })
        .zip(&NODES[1..])
        .map(|(n, node)| format!("{node}: {n}"))
        .collect();
    eprintln!("watches told 410 Gone (Expired) after the restart: {expired:?}");
    assert!(
        expired.iter().all(|e| !e.ends_with(": 0")),
        "a daemon's watch was never told 410 Gone by the restarted server: {expired:?}"
    );
    // node-a's daemon started twice and its pods resumed from their
    // records: each had `running` before it died.
    assert_eq!(cluster.node_mut(NODES[0], |n| n.starts), 2);
}
