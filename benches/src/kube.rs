//! What a clone costs a real Kubernetes API server,
//! counted by the server itself: `fixup-bench kube`.
//!
//! The run starts `cocoon-kube-lab` (lab/kube: a real kube-apiserver with
//! etcd embedded, in one process) with its audit log on, applies deploy/'s
//! RBAC and both admission policies as they ship, and starts one
//! `cocoon-fixup serve` per node (`node-a`, `node-b`, `node-c` by default),
//! each with its node's daemon identity, its own `fake-cocoon` scripted per
//! VM, lease file and state directory, as host/tests/realkube_nodes.rs
//! does. Every VM of the run is in its node's script and every lease in its
//! node's lease file before the daemons start. Then, in this order:
//!
//! 1. **One clone at a time on an idle cluster**, per kind (a static clone,
//!    an all-DHCP clone whose lease is in the file at once, an exhaustion),
//!    `repeat` times, each on the next node. A window opens after a quiet
//!    [`QUIET`], the pod is created as the stack's controller, and the
//!    window closes [`SETTLE`] after the daemon's last lifecycle write.
//! 2. **Plain pods**: `clones` pods that are no clone, created as fast as
//!    the controller can (`in_flight` creates at once): what creating the
//!    pods costs with the daemons watching, and nothing else.
//! 3. **Clones**: `clones` static clones over the nodes, created the same
//!    way, until every one is ready.
//! 4. **Idle**: nothing, for the wall time of 3, the same daemons watching.
//! 5. **One request alone**, before the load (after 10 s of idle for its
//!    baseline) and after it: a wake-evidence listing as a daemon sends it
//!    and a GET of a pod, `price_requests` of each one at a time, for the
//!    price of each as the namespace's events grow.
//!
//! A window's figures: the delta of `apiserver_request_total` (read from
//! `/metrics` as admin) by verb and resource, the lab process's CPU time
//! (`process_cpu_seconds_total`: kube-apiserver and etcd together), its
//! peak resident memory (`VmHWM`, reset when the window opens), the
//! daemons' CPU time, and the audit log's requests in the window, each with
//! the identity that sent it. A daemon's requests are those of its identity
//! (`cocoon-fixup:<node>`); as a check, the metric's delta less every other
//! identity's requests must give the same counts. The harness learns that a
//! pod is done from the audit log (the daemon's write of
//! `lifecycle-state`), so its only requests in a window are its creates.
//! Watches are counted apart: a watch is counted when it ends, so a
//! daemon's watch that the server closes in a window (every few minutes)
//! is no cost of the clones in it.
//!
//! The fewest requests a kind needs are the writes and events of its
//! conformance scenario's trace (tests/conformance): the daemons run with
//! the exhaustion scenario's own retry budget (and a second for the real
//! time each attempt takes) so that its trace, four attempts, is what they
//! play.
//!
//! Nothing is timed against a goal. What is asserted is that what was
//! measured is what it claims to be: every clone ended as its kind ends
//! (done and ready with its IP, or failed), and no plain pod was written.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use fixup_core::annotations::{keys, reasons};
use fixup_core::binding::vm_name_for_pod;
use fixup_core::facts::annotations;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Config};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::process::{self, Machine};
use crate::report::{Table, human_ns, ratio};

/// Requests by `"VERB resource"`, the resource qualified by its group when
/// it has one and followed by its subresource (`"POST
/// events.k8s.io/events"`, `"PATCH pods/status"`), as
/// `apiserver_request_total` labels them.
pub type Counts = BTreeMap<String, u64>;

/// The namespace of every pod of the run.
pub const NAMESPACE: &str = "bench";
/// How long the cluster is left alone before a window opens.
pub const QUIET: Duration = Duration::from_secs(2);
/// How long a window stays open after the daemon's last lifecycle write,
/// for what it sends after it (an event, a read of its own write's watch
/// event).
pub const SETTLE: Duration = Duration::from_secs(3);
/// The longest any wait may take before the run gives up: a safety net,
/// not a timing assertion.
pub const PATIENCE: Duration = Duration::from_secs(900);
/// Added to the exhaustion scenario's retry budget for the daemons'
/// `--retry-budget`: the scenario's attempts start 3 s apart in its own
/// time, a real attempt takes time of its own (an exec, a read, an event)
/// before the 3 s begin, so its fourth attempt starts a little after 9 s;
/// with this second it still fits, and a fifth (at 12 s at the earliest)
/// does not.
const ATTEMPT_SLACK_MS: u64 = 1000;
/// A daemon's identity is this and its node's name.
const DAEMON_USER: &str = "cocoon-fixup:";

/// How the run is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeConfig {
    /// Clones of the load (and plain pods of its baseline): 1,000.
    pub clones: usize,
    /// Nodes, one daemon each: 3.
    pub nodes: usize,
    /// Clones per kind, one at a time: 3 (one on each node).
    pub repeat: usize,
    /// Creates the controller has in flight at once: 32.
    pub in_flight: usize,
    /// Requests of each kind, one at a time, for the prices of one request
    /// at the end: 50.
    pub price_requests: usize,
    /// `cocoon-kube-lab`.
    pub lab: PathBuf,
    /// `cocoon-fixup`.
    pub binary: PathBuf,
    /// `fake-cocoon`.
    pub fake_cocoon: PathBuf,
    /// Where the lab's data, the audit log and the daemons' logs go (kept);
    /// `None`: a temporary directory, removed at the end.
    pub work_dir: Option<PathBuf>,
}

/// One pod kind, and the conformance scenario whose trace is its
/// behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A static first NIC, one fixup exec that succeeds.
    Static,
    /// Every NIC on DHCP, the lease in the lease file from the start.
    Dhcp,
    /// A static first NIC, every exec fails until the budget is spent.
    Exhausted,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Static, Kind::Dhcp, Kind::Exhausted];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Static => "static",
            Kind::Dhcp => "dhcp",
            Kind::Exhausted => "exhausted",
        }
    }

    /// tests/conformance/<this>.json.
    pub fn scenario(self) -> &'static str {
        match self {
            Kind::Static => "fixup-static-oci-done",
            Kind::Dhcp => "ipwait-all-dhcp-lease",
            Kind::Exhausted => "fixup-exhausted",
        }
    }
}

/// A conformance scenario, read from tests/conformance.
pub fn scenario(name: &str) -> anyhow::Result<Value> {
    let path = workspace_root().join(format!("tests/conformance/{name}.json"));
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The fewest requests the scenario's behaviour needs: one pod write per
/// write of its trace, one event per event, keyed as the API server counts
/// the daemon's. The reads are not here: which reads a host makes is its
/// own choice (the watch already delivers the pod).
pub fn minimum(scenario: &Value) -> Counts {
    let mut out = Counts::new();
    for step in scenario["expect"]["trace"].as_array().into_iter().flatten() {
        if step.get("write").is_some() || step.get("prepared_by").is_some() {
            *out.entry("PATCH pods".into()).or_default() += 1;
        } else if step.get("event").is_some() {
            *out.entry("POST events.k8s.io/events".into()).or_default() += 1;
        }
    }
    out
}

/// The execs of the scenario's trace.
fn trace_execs(scenario: &Value) -> usize {
    scenario["expect"]["trace"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s.get("exec").is_some())
        .count()
}

// ---------------------------------------------------------------------------
// What the run reports

/// Everything the run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KubeResult {
    pub machine: Machine,
    /// The 1-minute load average when the run ended.
    pub load_at_end: f64,
    pub nodes: usize,
    /// The daemons' `--retry-budget` (the exhaustion scenario's, and
    /// `ATTEMPT_SLACK_MS`).
    pub retry_budget_ms: u64,
    pub kinds: Vec<KindResult>,
    pub load: LoadResult,
    /// One request alone: before the load (the kinds' events in the
    /// namespace), and after it (every clone's too).
    pub prices: Vec<Prices>,
}

/// One request alone: `requests` of each, one at a time, as admin, each
/// kind in a window of its own.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Prices {
    /// When: `before the load`, `after the load`.
    pub when: String,
    /// The pod the requests are about.
    pub pod: String,
    /// Events in the namespace when they were taken.
    pub events_in_namespace: u64,
    pub requests: usize,
    /// The lab's CPU time per request, above idle: a wake-evidence listing
    /// (a daemon's first selector, for a clone of the load, a page of
    /// [`fixup_host::kube::LIST_PAGE_SIZE`]) and a GET of a pod's metadata
    /// (what the daemon sends).
    pub list_cpu_ms: f64,
    pub get_cpu_ms: f64,
    /// The server's time answering each.
    pub list_serving_ms: f64,
    pub get_serving_ms: f64,
}

/// One kind, one clone at a time.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KindResult {
    pub kind: Kind,
    pub scenario: String,
    /// The trace's writes and events ([`minimum`]).
    pub minimum: Counts,
    /// The trace's execs; each run's execs are in [`KindRun::execs`].
    pub trace_execs: usize,
    pub runs: Vec<KindRun>,
}

/// One clone of a kind, in a window of its own.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KindRun {
    pub node: String,
    pub pod: String,
    /// The daemon's requests (its identity's, watches apart).
    pub daemon: Counts,
    /// The metric's delta of pods and events less every other identity's:
    /// equal to `daemon` unless something else sent requests.
    pub daemon_by_metric: Counts,
    /// The harness's own (the create).
    pub harness: Counts,
    /// Watches that ended in the window (anyone's).
    pub watches: u64,
    /// The rest of the metric's delta: the API server's own housekeeping.
    pub other: Counts,
    /// The daemon's requests in the order the API server answered them.
    pub sequence: Vec<String>,
    /// `cocoon vm exec` calls for the pod's VM.
    pub execs: usize,
    /// From the create to the daemon's last lifecycle write.
    pub wall_ms: f64,
}

/// The load: plain pods, clones, idle.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoadResult {
    pub clones: usize,
    pub in_flight: usize,
    pub plain: Phase,
    pub clone: Phase,
    pub idle: Phase,
    /// From the first create's arrival to the last clone's `ready` write,
    /// as the API server stamped them.
    pub clones_ready_ms: f64,
    /// From the first create sent to the last answered, as the harness saw.
    pub clones_created_ms: f64,
    pub plain_created_ms: f64,
    /// `PostCloneSucceeded` events the daemons posted in the clones'
    /// window (one per clone).
    pub success_events: u64,
}

/// One window of the load.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Phase {
    pub wall_ms: f64,
    /// `process_cpu_seconds_total` of the lab (kube-apiserver and etcd).
    pub cpu_s: f64,
    pub rss_before_kib: u64,
    /// `VmHWM` of the lab, reset when the window opened.
    pub peak_rss_kib: u64,
    pub rss_after_kib: u64,
    /// The daemons' CPU time, all of them.
    pub daemons_cpu_s: f64,
    /// The metric's delta, every identity, watches included.
    pub requests: Counts,
    /// The time the server spent answering them, by the same keys
    /// (`apiserver_request_duration_seconds_sum`'s delta; watches apart).
    pub serving_s: BTreeMap<String, f64>,
    /// The audit log's requests by who sent them: `daemons` (every node's
    /// identity), `controller`, `admin`, `apiserver` (its own loopback
    /// client) and `other`.
    pub by_identity: BTreeMap<String, Counts>,
}

// ---------------------------------------------------------------------------
// The run

/// Run it on a runtime of its own.
pub fn run(config: &KubeConfig) -> anyhow::Result<KubeResult> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(measure(config))
}

async fn measure(config: &KubeConfig) -> anyhow::Result<KubeResult> {
    anyhow::ensure!((1..=26).contains(&config.nodes), "--nodes must be 1 to 26");
    for (what, path, fix) in [
        (
            "cocoon-kube-lab",
            &config.lab,
            "`cd lab/kube && go build -trimpath -buildvcs=false -o ../../target/cocoon-kube-lab .`",
        ),
        (
            "cocoon-fixup",
            &config.binary,
            "`cargo build --release -p fixup-host --bin cocoon-fixup`",
        ),
        (
            "fake-cocoon",
            &config.fake_cocoon,
            "`cargo build --release -p fake-cocoon`",
        ),
    ] {
        anyhow::ensure!(
            path.is_file(),
            "{what} is missing at {}: build it with {fix} or pass its path",
            path.display()
        );
    }
    let machine = Machine::current();
    let scratch = tempfile::tempdir()?;
    let root = match &config.work_dir {
        Some(dir) => {
            fs::create_dir_all(dir)?;
            dir.clone()
        }
        None => scratch.path().to_owned(),
    };
    eprintln!(
        "kube bench: lab, audit log and daemon logs in {}",
        root.display()
    );
    let nodes: Vec<String> = (0..config.nodes)
        .map(|i| format!("node-{}", char::from(b'a' + i as u8)))
        .collect();
    let exhausted = scenario(Kind::Exhausted.scenario())?;
    let retry_budget_ms = exhausted["settings"]["retry_budget_ms"]
        .as_u64()
        .context("fixup-exhausted.json has no settings.retry_budget_ms")?
        + ATTEMPT_SLACK_MS;

    // Every pod of the run, its VM and its lease, known before the daemons
    // start.
    let mut kind_clones = Vec::new();
    for rep in 0..config.repeat {
        for (k, kind) in Kind::ALL.into_iter().enumerate() {
            kind_clones.push((
                kind,
                Clone::of_kind(kind, k, rep, &nodes[rep % nodes.len()]),
            ));
        }
    }
    let load: Vec<Clone> = (0..config.clones)
        .map(|i| Clone::load(i, &nodes[i % nodes.len()]))
        .collect();
    let plain: Vec<Clone> = (0..config.clones)
        .map(|i| Clone::plain(i, &nodes[i % nodes.len()]))
        .collect();

    let lab = Lab::start(
        &config.lab,
        &root.join("lab"),
        &nodes,
        &root.join("lab.log"),
    )?;
    let admin = client_at(&lab.dir, "admin").await?;
    let controller = client_at(&lab.dir, "controller").await?;
    prepare(&lab.dir, &admin, &nodes[0]).await?;

    let mut daemons = Vec::new();
    for name in &nodes {
        let vms: Vec<&Clone> = kind_clones
            .iter()
            .map(|(_, c)| c)
            .chain(&load)
            .filter(|c| &c.node == name)
            .collect();
        let mut daemon = Daemon::prepare(&root, name, &config.fake_cocoon, &vms)?;
        daemon.start(&config.binary, &lab.dir, retry_budget_ms)?;
        daemons.push(daemon);
    }
    let started = Instant::now();
    for daemon in &mut daemons {
        daemon.until_watching(PATIENCE)?;
    }
    eprintln!(
        "kube bench: {} daemons watching after {:.1?}",
        daemons.len(),
        started.elapsed()
    );

    let mut cluster = Cluster {
        admin: admin.clone(),
        controller: Api::namespaced(controller, NAMESPACE),
        audit: Tail::new(lab.audit.clone()),
        lab_pid: lab.pid,
        daemon_pids: daemons.iter().map(|d| d.pid).collect(),
    };

    // 1. One clone at a time.
    let mut kinds: Vec<KindResult> = Vec::new();
    for kind in Kind::ALL {
        let s = scenario(kind.scenario())?;
        kinds.push(KindResult {
            kind,
            scenario: kind.scenario().into(),
            minimum: minimum(&s),
            trace_execs: trace_execs(&s),
            runs: Vec::new(),
        });
    }
    for (kind, clone) in &kind_clones {
        let daemon = daemons.iter().find(|d| d.name == clone.node).unwrap();
        let execs_before = daemon.execs(&clone.vm_id);
        let run = cluster.one_clone(clone).await?;
        let run = KindRun {
            execs: daemon.execs(&clone.vm_id) - execs_before,
            ..run
        };
        eprintln!(
            "kube bench: {} on {}: {} daemon requests ({})",
            kind.name(),
            clone.node,
            run.daemon.values().sum::<u64>(),
            run.sequence.join(", ")
        );
        kinds
            .iter_mut()
            .find(|k| k.kind == *kind)
            .unwrap()
            .runs
            .push(run);
    }

    // One request alone, on the quiet cluster: its idle rate first.
    let quiet = cluster.idle(Duration::from_secs(10)).await?;
    let mut prices = Vec::new();
    if let Some((_, clone)) = kind_clones.first() {
        prices.push(
            cluster
                .prices(
                    "before the load",
                    config.price_requests.max(1),
                    rate(&quiet),
                    clone,
                )
                .await?,
        );
    }

    // 2-4. The load.
    let (plain_phase, plain_created, _, _) = cluster.wave(&plain, config.in_flight, false).await?;
    eprintln!(
        "kube bench: {} plain pods created in {:.1?}",
        plain.len(),
        plain_created
    );
    let (clone_phase, clones_created, clones_ready, success_events) =
        cluster.wave(&load, config.in_flight, true).await?;
    eprintln!(
        "kube bench: {} clones created in {:.1?}, all ready after {:.1?}",
        load.len(),
        clones_created,
        clones_ready
    );
    let idle_phase = cluster
        .idle(Duration::from_secs_f64(clone_phase.wall_ms / 1e3))
        .await?;
    if let Some(clone) = load.first() {
        prices.push(
            cluster
                .prices(
                    "after the load",
                    config.price_requests.max(1),
                    rate(&idle_phase),
                    clone,
                )
                .await?,
        );
    }

    // What was measured is what it claims to be.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    let listed = pods.list(&ListParams::default()).await?;
    let by_name: HashMap<String, BTreeMap<String, String>> = listed
        .items
        .into_iter()
        .map(|p| {
            (
                p.metadata.name.unwrap_or_default(),
                p.metadata.annotations.unwrap_or_default(),
            )
        })
        .collect();
    let mut wrong = Vec::new();
    for clone in kind_clones
        .iter()
        .map(|(_, c)| c)
        .chain(&load)
        .chain(&plain)
    {
        let annotations = by_name.get(&clone.name);
        if let Some(why) = clone.ended_wrong(annotations) {
            wrong.push(format!("{}: {why}", clone.name));
        }
    }
    anyhow::ensure!(
        wrong.is_empty(),
        "{} pods did not end as their kind ends:\n{}",
        wrong.len(),
        wrong
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    drop(daemons);
    drop(lab);
    Ok(KubeResult {
        machine,
        load_at_end: process::load_average(),
        nodes: config.nodes,
        retry_budget_ms,
        kinds,
        load: LoadResult {
            clones: config.clones,
            in_flight: config.in_flight,
            plain: plain_phase,
            clone: clone_phase,
            idle: idle_phase,
            clones_ready_ms: ms(clones_ready),
            clones_created_ms: ms(clones_created),
            plain_created_ms: ms(plain_created),
            success_events,
        },
        prices,
    })
}

/// deploy/'s RBAC and both admission policies as they ship, the namespace
/// and its `default` service account (no controller manager makes it),
/// and the wake-event policy in force (a daemon's `Woken` refused).
async fn prepare(dir: &Path, admin: &Client, node: &str) -> anyhow::Result<()> {
    for file in [
        "deploy/rbac.yaml",
        "deploy/admission-policy.yaml",
        "deploy/wake-event-policy.yaml",
    ] {
        let path = workspace_root().join(file);
        let text = fs::read_to_string(&path).with_context(|| format!("reading {file}"))?;
        let documents: Vec<Value> =
            serde_saphyr::from_multiple(&text).with_context(|| format!("parsing {file}"))?;
        for document in documents.iter().filter(|d| d.is_object()) {
            apply(admin, document)
                .await
                .with_context(|| format!("applying {file}"))?;
        }
    }
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?,
        )
        .await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), NAMESPACE);
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "default"}}))?,
        )
        .await?;
    let daemon = client_at(dir, &format!("daemon-{node}")).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the wake-event policy is not enforced after 60 s"
        );
        match post_probe_event(&daemon).await {
            Err(kube::Error::Api(status))
                if status.code == 403 && status.message.contains("ValidatingAdmissionPolicy") =>
            {
                return Ok(());
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// Server-side apply of one cluster-scoped document, as it is.
async fn apply(admin: &Client, document: &Value) -> anyhow::Result<()> {
    let api_version = document["apiVersion"].as_str().context("no apiVersion")?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(
        group,
        version,
        document["kind"].as_str().context("no kind")?,
    );
    let api: Api<DynamicObject> = Api::all_with(admin.clone(), &ApiResource::from_gvk(&gvk));
    let name = document["metadata"]["name"].as_str().context("no name")?;
    api.patch(
        name,
        &PatchParams::apply("fixup-bench").force(),
        &Patch::Apply(document),
    )
    .await
    .with_context(|| format!("{} {name}", gvk.kind))?;
    Ok(())
}

/// A `Woken` event from a daemon, which the wake-event policy refuses.
async fn post_probe_event(client: &Client) -> Result<(), kube::Error> {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    let event = json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"generateName": "probe-", "namespace": NAMESPACE},
        "eventTime": now,
        "reason": "Woken",
        "note": "probe",
        "type": "Normal",
        "action": "Probe",
        "reportingController": "vk-cocoon",
        "reportingInstance": "fixup-bench",
        "regarding": {"kind": "Pod", "apiVersion": "v1", "namespace": NAMESPACE, "name": "probe", "uid": "probe"},
    });
    let request = kube::core::Request::new(format!(
        "/apis/events.k8s.io/v1/namespaces/{NAMESPACE}/events"
    ))
    .create(&PostParams::default(), event.to_string().into_bytes())
    .map_err(kube::Error::BuildRequest)?;
    client.request_text(request).await.map(drop)
}

async fn client_at(dir: &Path, name: &str) -> anyhow::Result<Client> {
    let path = dir.join(format!("{name}.kubeconfig"));
    let kubeconfig =
        Kubeconfig::read_from(&path).with_context(|| format!("reading {}", path.display()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

// ---------------------------------------------------------------------------
// The pods

/// One pod of the run, its VM and how the VM answers.
#[derive(Debug, Clone)]
struct Clone {
    kind: Option<Kind>,
    name: String,
    node: String,
    vm_id: String,
    mac: String,
    /// The first NIC's static address, or DHCP.
    ip: Option<String>,
    /// The DHCP lease in the lease file.
    lease: Option<String>,
}

impl Clone {
    fn of_kind(kind: Kind, k: usize, rep: usize, node: &str) -> Clone {
        let name = format!("{}-{rep}", kind.name());
        let (ip, lease) = match kind {
            Kind::Static | Kind::Exhausted => (Some(format!("10.0.{rep}.{}", 5 + k)), None),
            Kind::Dhcp => (None, Some(format!("10.0.{rep}.77"))),
        };
        Clone {
            kind: Some(kind),
            vm_id: format!("vm-{name}"),
            mac: format!("52:54:00:{k:02x}:{:02x}:{:02x}", rep / 256, rep % 256),
            name,
            node: node.into(),
            ip,
            lease,
        }
    }

    fn load(i: usize, node: &str) -> Clone {
        let name = format!("clone-{i:05}");
        Clone {
            kind: Some(Kind::Static),
            vm_id: format!("vm-{name}"),
            mac: format!(
                "52:54:01:{:02x}:{:02x}:{:02x}",
                i >> 16,
                (i >> 8) & 255,
                i & 255
            ),
            ip: Some(format!("10.1.{}.{}", 1 + i / 250, 2 + i % 250)),
            lease: None,
            name,
            node: node.into(),
        }
    }

    fn plain(i: usize, node: &str) -> Clone {
        Clone {
            kind: None,
            name: format!("plain-{i:05}"),
            node: node.into(),
            vm_id: String::new(),
            mac: String::new(),
            ip: None,
            lease: None,
        }
    }

    /// The pod as the stack's controller creates it: with its VM (a plain
    /// pod: no annotation at all).
    fn pod(&self) -> anyhow::Result<Pod> {
        let mut metadata = json!({"name": self.name});
        if self.kind.is_some() {
            metadata["annotations"] = json!({
                annotations::MANAGED: "true",
                annotations::VM_ID: self.vm_id,
                annotations::VM_NAME: vm_name_for_pod(NAMESPACE, &self.name),
                annotations::BACKEND: "cloud-hypervisor",
            });
        }
        Ok(serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {"nodeName": self.node, "containers": [{"name": "c", "image": "example.invalid/c"}]},
        }))?)
    }

    /// `fake-cocoon`'s answers for the VM: its record, and every exec
    /// succeeding (the done marker) or failing with exit 1.
    fn answers(&self) -> Value {
        let mut nic = json!({"mac": self.mac});
        if let Some(ip) = &self.ip {
            let gateway = format!("{}.1", ip.rsplit_once('.').map_or("10.0.0", |(net, _)| net));
            let prefix = if ip.starts_with("10.1.") { 16 } else { 24 };
            nic["network"] = json!({"ip": ip, "prefix": prefix, "gateway": gateway});
        }
        let record = json!({
            "id": self.vm_id,
            "config": {"name": vm_name_for_pod(NAMESPACE, &self.name), "image": "ghcr.io/cocoonstack/ubuntu:24.04"},
            "network_configs": [nic],
        });
        let exec = if self.kind == Some(Kind::Exhausted) {
            json!([{"exit": 1}])
        } else {
            json!([{"exit": 0, "done": true}])
        };
        json!({"inspect": {"json": record}, "exec": exec})
    }

    /// Why the pod's annotations are not what its kind ends with, or
    /// `None`.
    fn ended_wrong(&self, annotations: Option<&BTreeMap<String, String>>) -> Option<String> {
        let Some(a) = annotations else {
            return Some("the pod is gone".into());
        };
        let get = |key: &str| a.get(key).map(String::as_str);
        let want: Vec<(&str, Option<&str>)> = match self.kind {
            None => vec![
                (keys::POST_CLONE_STATE, None),
                (keys::LIFECYCLE_STATE, None),
                (keys::IP, None),
            ],
            Some(Kind::Static) => vec![
                (keys::POST_CLONE_STATE, Some("done")),
                (keys::LIFECYCLE_STATE, Some("ready")),
                (keys::IP, self.ip.as_deref()),
            ],
            Some(Kind::Dhcp) => vec![
                (keys::POST_CLONE_STATE, None),
                (keys::LIFECYCLE_STATE, Some("ready")),
                (keys::IP, self.lease.as_deref()),
            ],
            Some(Kind::Exhausted) => vec![
                (keys::POST_CLONE_STATE, Some("failed")),
                (keys::LIFECYCLE_STATE, Some("failed")),
                (keys::IP, None),
            ],
        };
        let wrong: Vec<String> = want
            .into_iter()
            .filter(|(key, value)| get(key) != *value)
            .map(|(key, value)| format!("{key}={:?}, want {value:?}", get(key)))
            .collect();
        (!wrong.is_empty()).then(|| wrong.join(", "))
    }
}

// ---------------------------------------------------------------------------
// The lab and the daemons

/// `cocoon-kube-lab`, stopped (standard input closed) when dropped.
struct Lab {
    dir: PathBuf,
    audit: PathBuf,
    pid: u32,
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Lab {
    fn start(binary: &Path, dir: &Path, nodes: &[String], log: &Path) -> anyhow::Result<Lab> {
        fs::create_dir_all(dir)?;
        let audit = dir.join("audit.jsonl");
        let started = Instant::now();
        let mut child = Command::new(binary)
            .arg("--dir")
            .arg(dir)
            .arg("--audit-log")
            .arg(&audit)
            .args(nodes.iter().flat_map(|n| ["--node", n.as_str()]))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(fs::File::create(log)?)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let pid = child.id();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().context("the lab's stdout")?);
        // Read on a thread of its own, so that a lab that hangs before
        // `ready` is given up on.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let ready = stdout
                .lines()
                .map_while(Result::ok)
                .find(|line| line.starts_with("ready "));
            let _ = tx.send(ready);
        });
        let ready = rx.recv_timeout(Duration::from_secs(180)).ok().flatten();
        let lab = Lab {
            dir: dir.to_owned(),
            audit,
            pid,
            child,
            stdin,
        };
        match ready {
            Some(line) => {
                eprintln!(
                    "kube bench: cocoon-kube-lab {line} (after {:.1?})",
                    started.elapsed()
                );
                Ok(lab)
            }
            None => anyhow::bail!(
                "cocoon-kube-lab did not get ready; the end of its log ({}):\n{}",
                log.display(),
                last_lines(&fs::read_to_string(log).unwrap_or_default(), 30)
            ),
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One node's `cocoon-fixup serve`, killed when dropped.
struct Daemon {
    name: String,
    dir: PathBuf,
    pid: u32,
    child: Option<Child>,
}

impl Daemon {
    /// The node's directory: an empty config file and plugin directory,
    /// `fake-cocoon` behind a wrapper that names the node's script, the
    /// script (every VM of the node) and the lease file (every lease).
    fn prepare(
        root: &Path,
        name: &str,
        fake_cocoon: &Path,
        vms: &[&Clone],
    ) -> anyhow::Result<Daemon> {
        let dir = root.join(name);
        fs::create_dir_all(dir.join("plugins"))?;
        fs::write(dir.join("config.toml"), "")?;
        let wrapper = dir.join("cocoon");
        fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nFAKE_COCOON_SCENARIO='{}' exec '{}' \"$@\"\n",
                dir.join("scenario.json").display(),
                fake_cocoon.display(),
            ),
        )?;
        fs::set_permissions(
            &wrapper,
            <fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
        )?;
        let answers: Map<String, Value> =
            vms.iter().map(|c| (c.vm_id.clone(), c.answers())).collect();
        fs::write(
            dir.join("scenario.json"),
            json!({"log": dir.join("calls.jsonl"), "vms": answers}).to_string(),
        )?;
        let leases: Vec<Value> = vms
            .iter()
            .filter_map(|c| {
                let ip = c.lease.as_ref()?;
                Some(json!({"mac": c.mac, "ip": ip, "expiry": "2100-01-01T00:00:00Z"}))
            })
            .collect();
        fs::write(dir.join("leases.json"), json!(leases).to_string())?;
        Ok(Daemon {
            name: name.into(),
            dir,
            pid: 0,
            child: None,
        })
    }

    /// `cocoon-fixup serve` as host/tests/realkube_nodes.rs starts it: the
    /// node's own identity, directory, state and `--retry-budget`.
    fn start(&mut self, binary: &Path, lab: &Path, retry_budget_ms: u64) -> anyhow::Result<()> {
        let dir = &self.dir;
        let child = Command::new(binary)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", dir)
            .env(
                "KUBECONFIG",
                lab.join(format!("daemon-{}.kubeconfig", self.name)),
            )
            .env("COCOON_FIXUP_LOG", "info")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .args(["serve", "--node", &self.name])
            .arg("--cocoon-bin")
            .arg(dir.join("cocoon"))
            .arg("--cocoon-root")
            .arg(dir)
            .arg("--lease-file")
            .arg(dir.join("leases.json"))
            .arg("--plugin-dir")
            .arg(dir.join("plugins"))
            .arg("--cache-dir")
            .arg(dir.join("cache"))
            .arg("--cache-key")
            .arg(dir.join("cache.key"))
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(["--retry-budget", &format!("{retry_budget_ms}ms")])
            .args(["--metrics-addr", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.join("daemon.log"))?)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        self.pid = child.id();
        self.child = Some(child);
        Ok(())
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// Waits until the daemon has listed its node and watches it.
    fn until_watching(&mut self, within: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        while !self.log().contains("startup reconciliation dispatched") {
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                anyhow::bail!(
                    "{}'s daemon exited ({status}):\n{}",
                    self.name,
                    last_lines(&self.log(), 30)
                );
            }
            anyhow::ensure!(
                start.elapsed() < within,
                "{}'s daemon never started watching:\n{}",
                self.name,
                last_lines(&self.log(), 30)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// `cocoon vm exec` calls for `vm` so far (fake-cocoon's call log).
    fn execs(&self, vm: &str) -> usize {
        let log = fs::read_to_string(self.dir.join("calls.jsonl")).unwrap_or_default();
        log.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|call| {
                let argv = &call["argv"];
                argv[0] == "vm" && argv[1] == "exec" && argv[2] == vm
            })
            .count()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// ---------------------------------------------------------------------------
// Windows

/// What the harness uses while the run goes on.
struct Cluster {
    admin: Client,
    controller: Api<Pod>,
    audit: Tail,
    lab_pid: u32,
    daemon_pids: Vec<u32>,
}

/// An open window.
struct Window {
    before: Scrape,
    started: Instant,
    daemons_cpu: Duration,
    rss_before_kib: u64,
    seen: Vec<Seen>,
}

/// A closed one.
struct Closed {
    wall: Duration,
    cpu_s: f64,
    daemons_cpu: Duration,
    rss_before_kib: u64,
    peak_rss_kib: u64,
    rss_after_kib: u64,
    delta: Counts,
    serving_s: BTreeMap<String, f64>,
    seen: Vec<Seen>,
}

impl Cluster {
    async fn open(&mut self) -> anyhow::Result<Window> {
        tokio::time::sleep(QUIET).await;
        // The peak of this window only (best effort: a kernel that refuses
        // leaves the lab's whole-life peak).
        let _ = fs::write(format!("/proc/{}/clear_refs", self.lab_pid), "5");
        let before = scrape(&self.admin).await?;
        self.audit.lines();
        Ok(Window {
            before,
            started: Instant::now(),
            daemons_cpu: self.daemons_cpu(),
            rss_before_kib: process::status_kib_of(self.lab_pid, "VmRSS").unwrap_or(0),
            seen: Vec::new(),
        })
    }

    async fn close(&mut self, mut window: Window) -> anyhow::Result<Closed> {
        let after = scrape(&self.admin).await?;
        let wall = window.started.elapsed();
        self.poll(&mut window);
        Ok(Closed {
            wall,
            cpu_s: after.cpu_seconds - window.before.cpu_seconds,
            daemons_cpu: self.daemons_cpu().saturating_sub(window.daemons_cpu),
            rss_before_kib: window.rss_before_kib,
            peak_rss_kib: process::status_kib_of(self.lab_pid, "VmHWM").unwrap_or(0),
            rss_after_kib: process::status_kib_of(self.lab_pid, "VmRSS").unwrap_or(0),
            delta: minus(&after.requests, &window.before.requests),
            serving_s: after
                .serving_seconds
                .iter()
                .map(|(k, v)| {
                    let before = window.before.serving_seconds.get(k).copied().unwrap_or(0.0);
                    (k.clone(), v - before)
                })
                .filter(|(_, d)| *d > 0.0)
                .collect(),
            seen: window.seen,
        })
    }

    /// The audit log's new requests, into the window.
    fn poll(&mut self, window: &mut Window) {
        window
            .seen
            .extend(self.audit.lines().iter().filter_map(|l| Seen::parse(l)));
    }

    fn daemons_cpu(&self) -> Duration {
        self.daemon_pids.iter().map(|pid| cpu_of(*pid)).sum()
    }

    /// Waits until the daemons have written a final `lifecycle-state` on
    /// every pod of `names`; the time of the last such write as the API
    /// server stamped it.
    async fn until_ended(
        &mut self,
        window: &mut Window,
        names: &[String],
    ) -> anyhow::Result<Option<String>> {
        let mut left: HashSet<&str> = names.iter().map(String::as_str).collect();
        let mut last = None;
        let mut looked = 0;
        let start = Instant::now();
        loop {
            self.poll(window);
            for seen in &window.seen[looked..] {
                if seen.ends_work() && left.remove(seen.name.as_str()) {
                    last = Some(seen.done.clone());
                }
            }
            looked = window.seen.len();
            if left.is_empty() {
                return Ok(last);
            }
            anyhow::ensure!(
                start.elapsed() < PATIENCE,
                "{} of {} pods not finished after {PATIENCE:?}, e.g. {:?}",
                left.len(),
                names.len(),
                left.iter().take(5).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One clone created on an idle cluster, in a window of its own.
    async fn one_clone(&mut self, clone: &Clone) -> anyhow::Result<KindRun> {
        let mut window = self.open().await?;
        let created = Instant::now();
        self.controller
            .create(&PostParams::default(), &clone.pod()?)
            .await
            .with_context(|| format!("creating {}", clone.name))?;
        self.until_ended(&mut window, std::slice::from_ref(&clone.name))
            .await?;
        let wall = created.elapsed();
        tokio::time::sleep(SETTLE).await;
        let closed = self.close(window).await?;
        let mut daemon = Counts::new();
        let mut harness = Counts::new();
        let mut watches = 0;
        let mut sequence = Vec::new();
        for seen in &closed.seen {
            if seen.verb == "WATCH" {
                watches += 1;
            } else if seen.user.starts_with(DAEMON_USER) {
                *daemon.entry(seen.key.clone()).or_default() += 1;
                sequence.push(seen.describe());
            } else if pods_or_events(&seen.key) {
                *harness.entry(seen.key.clone()).or_default() += 1;
            }
        }
        let mut resources: Counts = closed
            .delta
            .iter()
            .filter(|(k, _)| pods_or_events(k) && !k.starts_with("WATCH "))
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        let other = closed
            .delta
            .iter()
            .filter(|(k, _)| !pods_or_events(k) && !k.starts_with("WATCH "))
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        resources = minus(&resources, &harness);
        // The server's own count and the audit log's must say the same,
        // or neither is worth printing.
        anyhow::ensure!(
            resources == daemon,
            "{}: the metric's delta less the harness's requests ({resources:?}) is not the audit log's count of the daemon's ({daemon:?})",
            clone.name
        );
        Ok(KindRun {
            node: clone.node.clone(),
            pod: clone.name.clone(),
            daemon,
            daemon_by_metric: resources,
            harness,
            watches,
            other,
            sequence,
            execs: 0,
            wall_ms: ms(wall),
        })
    }

    /// `pods` created as fast as the controller can, `in_flight` at once;
    /// for clones, until each has its final write. The phase, how long the
    /// creates took, for clones from the first create's arrival to the
    /// last `ready` write (the API server's stamps), and the success events
    /// the daemons posted.
    async fn wave(
        &mut self,
        pods: &[Clone],
        in_flight: usize,
        clones: bool,
    ) -> anyhow::Result<(Phase, Duration, Duration, u64)> {
        let objects: Vec<Pod> = pods.iter().map(Clone::pod).collect::<Result<_, _>>()?;
        let mut window = self.open().await?;
        let started = Instant::now();
        let api = self.controller.clone();
        let results: Vec<Result<Pod, kube::Error>> = futures::stream::iter(objects)
            .map(|pod| {
                let api = api.clone();
                async move { api.create(&PostParams::default(), &pod).await }
            })
            .buffer_unordered(in_flight.max(1))
            .collect()
            .await;
        let created = started.elapsed();
        if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
            anyhow::bail!("the controller could not create a pod: {e}");
        }
        let mut ready = Duration::ZERO;
        if clones {
            let names: Vec<String> = pods.iter().map(|p| p.name.clone()).collect();
            let last = self.until_ended(&mut window, &names).await?;
            let first = window
                .seen
                .iter()
                .filter(|s| s.verb == "POST" && s.key == "POST pods")
                .map(|s| s.received.clone())
                .min();
            if let (Some(first), Some(last)) = (first, last) {
                ready = stamp_difference(&first, &last).unwrap_or_default();
            }
        }
        tokio::time::sleep(SETTLE).await;
        let closed = self.close(window).await?;
        let successes = closed
            .seen
            .iter()
            .filter(|s| {
                s.user.starts_with(DAEMON_USER)
                    && s.key == "POST events.k8s.io/events"
                    && s.reason.as_deref() == Some(reasons::SUCCEEDED)
            })
            .count() as u64;
        Ok((phase(&closed), created, ready, successes))
    }

    /// One request alone, `n` times in turn: a wake-evidence listing for
    /// `clone`'s pod as the daemon sends it, then a GET of its metadata.
    async fn prices(
        &mut self,
        when: &str,
        n: usize,
        idle_rate: f64,
        clone: &Clone,
    ) -> anyhow::Result<Prices> {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), NAMESPACE);
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.admin.clone(), NAMESPACE);
        let uid = pods
            .get_metadata(&clone.name)
            .await?
            .metadata
            .uid
            .unwrap_or_default();
        let one = events
            .list_metadata(&ListParams::default().limit(1))
            .await?;
        let events_in_namespace = one.items.len() as u64
            + one
                .metadata
                .remaining_item_count
                .and_then(|n| u64::try_from(n).ok())
                .unwrap_or(0);
        let selector = fixup_core::memory::field_selectors(&uid, &["vk-cocoon".to_owned()])
            .into_iter()
            .next()
            .unwrap_or_default();
        let each = |closed: &Closed, key: &str| -> (f64, f64) {
            let cpu = closed.cpu_s - idle_rate * closed.wall.as_secs_f64();
            let serving = closed.serving_s.get(key).copied().unwrap_or(0.0);
            (cpu.max(0.0) / n as f64 * 1e3, serving / n as f64 * 1e3)
        };
        let window = self.open().await?;
        let params = ListParams::default()
            .fields(&selector)
            .limit(fixup_host::kube::LIST_PAGE_SIZE);
        for _ in 0..n {
            events.list(&params).await?;
        }
        let closed = self.close(window).await?;
        let (list_cpu_ms, list_serving_ms) = each(&closed, "LIST events.k8s.io/events");
        let window = self.open().await?;
        for _ in 0..n {
            pods.get_metadata(&clone.name).await?;
        }
        let closed = self.close(window).await?;
        let (get_cpu_ms, get_serving_ms) = each(&closed, "GET pods");
        Ok(Prices {
            when: when.into(),
            pod: clone.name.clone(),
            events_in_namespace,
            requests: n,
            list_cpu_ms,
            get_cpu_ms,
            list_serving_ms,
            get_serving_ms,
        })
    }

    /// Nothing for `wall`, in a window.
    async fn idle(&mut self, wall: Duration) -> anyhow::Result<Phase> {
        let window = self.open().await?;
        tokio::time::sleep(wall.saturating_sub(window.started.elapsed())).await;
        let closed = self.close(window).await?;
        Ok(phase(&closed))
    }
}

/// A window's CPU seconds per second of wall time.
fn rate(phase: &Phase) -> f64 {
    phase.cpu_s / (phase.wall_ms / 1e3).max(1e-9)
}

fn phase(closed: &Closed) -> Phase {
    let mut by_identity: BTreeMap<String, Counts> = BTreeMap::new();
    for seen in &closed.seen {
        *by_identity
            .entry(seen.identity().into())
            .or_default()
            .entry(seen.key.clone())
            .or_default() += 1;
    }
    Phase {
        wall_ms: ms(closed.wall),
        cpu_s: closed.cpu_s,
        rss_before_kib: closed.rss_before_kib,
        peak_rss_kib: closed.peak_rss_kib,
        rss_after_kib: closed.rss_after_kib,
        daemons_cpu_s: closed.daemons_cpu.as_secs_f64(),
        requests: closed.delta.clone(),
        serving_s: closed.serving_s.clone(),
        by_identity,
    }
}

/// Pods (any subresource) or events (core or events.k8s.io).
fn pods_or_events(key: &str) -> bool {
    let resource = key.split_once(' ').map_or("", |(_, r)| r);
    let mut segments = resource.split('/');
    let first = segments.next().unwrap_or("");
    first == "pods"
        || first == "events"
        || (first.contains('.') && segments.next() == Some("events"))
}

/// `a - b`, keys left with a count.
fn minus(a: &Counts, b: &Counts) -> Counts {
    a.iter()
        .filter_map(|(k, n)| {
            let d = n.saturating_sub(b.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// The time between two of the API server's RFC 3339 stamps.
fn stamp_difference(from: &str, to: &str) -> Option<Duration> {
    let from: k8s_openapi::jiff::Timestamp = from.parse().ok()?;
    let to: k8s_openapi::jiff::Timestamp = to.parse().ok()?;
    let nanos = to.as_nanosecond() - from.as_nanosecond();
    u64::try_from(nanos).ok().map(Duration::from_nanos)
}

/// A process's CPU time (user and system, all threads): `utime` and
/// `stime` of `/proc/PID/stat`, in clock ticks. Zero if it cannot be read.
fn cpu_of(pid: u32) -> Duration {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let ticks: u64 = stat
        .rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|t| t.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    let per_second = rustix::param::clock_ticks_per_second().max(1);
    Duration::from_secs_f64(ticks as f64 / per_second as f64)
}

// ---------------------------------------------------------------------------
// The API server's counts: its metrics and its audit log

/// What `/metrics` says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    /// `apiserver_request_total`, every code together; requests to URLs
    /// that are no resource (`/metrics`, `/healthz`) left out.
    pub requests: Counts,
    /// `apiserver_request_duration_seconds_sum` by the same keys: the time
    /// the server spent answering them (watches are not in it).
    pub serving_seconds: BTreeMap<String, f64>,
    pub cpu_seconds: f64,
    pub rss_bytes: f64,
}

async fn scrape(admin: &Client) -> anyhow::Result<Scrape> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = admin
        .request_text(request)
        .await
        .context("reading the API server's /metrics as admin")?;
    Ok(parse_metrics(&text))
}

/// The key of a request as the API server's metric labels it.
pub fn request_key(verb: &str, group: &str, resource: &str, subresource: &str) -> String {
    let mut key = format!("{verb} ");
    if !group.is_empty() {
        key.push_str(group);
        key.push('/');
    }
    key.push_str(resource);
    if !subresource.is_empty() {
        key.push('/');
        key.push_str(subresource);
    }
    key
}

pub fn parse_metrics(text: &str) -> Scrape {
    let mut out = Scrape::default();
    for line in text.lines() {
        let (series, value) = match line.rsplit_once(' ') {
            Some(pair) if !line.starts_with('#') => pair,
            _ => continue,
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, labels_of(rest.trim_end_matches('}'))),
            None => (series, BTreeMap::new()),
        };
        match name {
            "apiserver_request_total" => {
                let label = |k: &str| labels.get(k).map_or("", String::as_str);
                if label("resource").is_empty() {
                    continue;
                }
                let key = request_key(
                    label("verb"),
                    label("group"),
                    label("resource"),
                    label("subresource"),
                );
                *out.requests.entry(key).or_default() += value as u64;
            }
            "apiserver_request_duration_seconds_sum" => {
                let label = |k: &str| labels.get(k).map_or("", String::as_str);
                if label("resource").is_empty() {
                    continue;
                }
                let key = request_key(
                    label("verb"),
                    label("group"),
                    label("resource"),
                    label("subresource"),
                );
                *out.serving_seconds.entry(key).or_default() += value;
            }
            "process_cpu_seconds_total" => out.cpu_seconds = value,
            "process_resident_memory_bytes" => out.rss_bytes = value,
            _ => {}
        }
    }
    out
}

/// `a="x",b="y"` (values with `\"` and `\\` escapes).
fn labels_of(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, escaped)) = chars.next() {
                        value.push(if escaped == 'n' { '\n' } else { escaped });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.insert(key.trim_start_matches(',').trim().to_owned(), value);
        rest = &after[end..];
    }
    out
}

/// Reads a file as it grows, a complete line at a time.
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

    fn lines(&mut self) -> Vec<String> {
        let Ok(mut file) = fs::File::open(&self.path) else {
            return Vec::new();
        };
        let mut text = String::new();
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return Vec::new();
        }
        self.offset += file.read_to_string(&mut text).unwrap_or(0) as u64;
        self.partial.push_str(&text);
        let Some(end) = self.partial.rfind('\n') else {
            return Vec::new();
        };
        let complete: String = self.partial.drain(..=end).collect();
        complete.lines().map(str::to_owned).collect()
    }
}

/// One request of the audit log (stage `ResponseComplete`, about a
/// resource).
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub user: String,
    /// As the metric labels it ([`request_key`]).
    pub key: String,
    /// The metric's verb (`GET`, `LIST`, `WATCH`, `POST`, `PATCH`, ...).
    pub verb: String,
    pub name: String,
    pub uri: String,
    pub code: i64,
    /// `requestReceivedTimestamp`, `stageTimestamp`.
    pub received: String,
    pub done: String,
    /// A pod write's annotations (the audit policy keeps the bodies of
    /// writes to pods and events).
    pub annotations: Option<Map<String, Value>>,
    /// An event's reason.
    pub reason: Option<String>,
}

impl Seen {
    pub fn parse(line: &str) -> Option<Seen> {
        let entry: Value = serde_json::from_str(line).ok()?;
        if entry["stage"] != "ResponseComplete" {
            return None;
        }
        let object = &entry["objectRef"];
        let resource = object["resource"].as_str().filter(|r| !r.is_empty())?;
        let verb = match entry["verb"].as_str()? {
            "get" => "GET",
            "list" => "LIST",
            "watch" => "WATCH",
            "create" => "POST",
            "update" => "PUT",
            "patch" => "PATCH",
            "delete" | "deletecollection" => "DELETE",
            other => other,
        };
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let body = &entry["requestObject"];
        Some(Seen {
            user: text(&entry["user"]["username"]),
            key: request_key(
                verb,
                object["apiGroup"].as_str().unwrap_or(""),
                resource,
                object["subresource"].as_str().unwrap_or(""),
            ),
            verb: verb.into(),
            name: text(&object["name"]),
            uri: text(&entry["requestURI"]),
            code: entry["responseStatus"]["code"].as_i64().unwrap_or(0),
            received: text(&entry["requestReceivedTimestamp"]),
            done: text(&entry["stageTimestamp"]),
            annotations: body["metadata"]["annotations"].as_object().cloned(),
            reason: body["reason"].as_str().map(str::to_owned),
        })
    }

    /// A daemon's successful write of a final `lifecycle-state`.
    fn ends_work(&self) -> bool {
        self.user.starts_with(DAEMON_USER)
            && self.verb == "PATCH"
            && (200..300).contains(&self.code)
            && self
                .annotations
                .as_ref()
                .and_then(|a| a.get(keys::LIFECYCLE_STATE))
                .and_then(Value::as_str)
                .is_some_and(|s| s == "ready" || s == "failed")
    }

    /// Who sent it, as the load's table groups them.
    fn identity(&self) -> &'static str {
        match self.user.as_str() {
            u if u.starts_with(DAEMON_USER) => "daemons",
            "system:serviceaccount:cocoon-system:cocoon-operator" => "controller",
            "cocoon-lab-admin" => "admin",
            "system:apiserver" => "apiserver",
            _ => "other",
        }
    }

    /// One line for the request sequence: the key, what a write set (the
    /// annotation keys without their prefix, long values cut), an event's
    /// reason, a listing's field selector less the pod's uid, and a status
    /// that is no success.
    pub fn describe(&self) -> String {
        let mut out = self.key.clone();
        if let Some(annotations) = &self.annotations {
            let set: Vec<String> = annotations
                .iter()
                .map(|(k, v)| {
                    let k = k.rsplit('/').next().unwrap_or(k);
                    match v.as_str() {
                        None => format!("{k}=null"),
                        Some(v) if v.chars().count() > 12 => format!("{k}=…"),
                        Some(v) => format!("{k}={v}"),
                    }
                })
                .collect();
            let _ = write!(out, " {{{}}}", set.join(", "));
        }
        if let Some(reason) = &self.reason {
            let _ = write!(out, " {reason}");
        }
        if self.verb == "LIST"
            && let Some(selector) = query_param(&self.uri, "fieldSelector")
        {
            let kept: Vec<&str> = selector
                .split(',')
                .filter(|s| {
                    !s.starts_with("regarding.uid=") && !s.starts_with("involvedObject.uid=")
                })
                .collect();
            let _ = write!(out, " [{}]", kept.join(","));
        }
        if !(200..300).contains(&self.code) {
            let _ = write!(out, " -> {}", self.code);
        }
        out
    }
}

/// A query parameter of `uri`, percent-decoded.
fn query_param(uri: &str, name: &str) -> Option<String> {
    let (_, query) = uri.split_once('?')?;
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

// ---------------------------------------------------------------------------
// The report

/// The run as markdown: per kind, the requests beside the fewest the
/// behaviour needs (and, given the Go test's counts file, the Go
/// package's and that test's daemon's); then the load.
pub fn markdown(result: &KubeResult, go_counts: Option<&Value>) -> String {
    let mut out = String::new();
    let m = &result.machine;
    let _ = writeln!(
        out,
        "{} CPUs ({}), {:.1} GiB, kernel {}; load average {:.2} at the start, {:.2} at the end. Daemons: {} nodes, `--retry-budget {}ms` (the exhaustion scenario's 10 s and a second for the attempts' own time: its four attempts), the rest default.\n",
        m.cpus,
        m.cpu_model,
        m.memory_gib,
        m.kernel,
        m.load,
        result.load_at_end,
        result.nodes,
        result.retry_budget_ms
    );
    for kind in &result.kinds {
        let _ = writeln!(
            out,
            "#### {} (tests/conformance/{}.json)\n",
            kind.kind.name(),
            kind.scenario
        );
        let go = go_counts.and_then(|doc| doc["go"][kind.kind.name()].as_object());
        let go_daemon = go_counts.and_then(|doc| doc["daemon"][kind.kind.name()].as_object());
        let mut keys: Vec<String> = kind.minimum.keys().cloned().collect();
        for run in &kind.runs {
            keys.extend(run.daemon.keys().cloned());
        }
        for map in [go, go_daemon].into_iter().flatten() {
            keys.extend(map.keys().cloned());
        }
        keys.sort();
        keys.dedup();
        let mut header = vec![
            "request".to_owned(),
            "fewest the trace needs".to_owned(),
            format!("daemon (this run, {} clones)", kind.runs.len()),
        ];
        if go_counts.is_some() {
            header.push("daemon (Go test's run)".into());
            header.push("Go package (Go test)".into());
        }
        let header: Vec<&str> = header.iter().map(String::as_str).collect();
        let mut table = Table::new(&header);
        let range = |values: Vec<u64>| -> String {
            let (lo, hi) = (
                values.iter().min().copied().unwrap_or(0),
                values.iter().max().copied().unwrap_or(0),
            );
            if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}–{hi}")
            }
        };
        let of = |map: Option<&Map<String, Value>>, key: &str| -> String {
            map.map_or(String::new(), |m| {
                m.get(key).and_then(Value::as_u64).unwrap_or(0).to_string()
            })
        };
        let total = |map: Option<&Map<String, Value>>| -> String {
            map.map_or(String::new(), |m| {
                m.values()
                    .filter_map(Value::as_u64)
                    .sum::<u64>()
                    .to_string()
            })
        };
        for key in &keys {
            let mut row = vec![
                format!("`{key}`"),
                kind.minimum.get(key).copied().unwrap_or(0).to_string(),
                range(
                    kind.runs
                        .iter()
                        .map(|r| r.daemon.get(key).copied().unwrap_or(0))
                        .collect(),
                ),
            ];
            if go_counts.is_some() {
                row.push(of(go_daemon, key));
                row.push(of(go, key));
            }
            table.row(row);
        }
        let mut row = vec![
            "**total**".to_owned(),
            kind.minimum.values().sum::<u64>().to_string(),
            range(kind.runs.iter().map(|r| r.daemon.values().sum()).collect()),
        ];
        if go_counts.is_some() {
            row.push(total(go_daemon));
            row.push(total(go));
        }
        table.row(row);
        out.push_str(&table.render());
        let agree = kind.runs.iter().all(|r| r.daemon == r.daemon_by_metric);
        let _ = writeln!(
            out,
            "\nExecs: {} (the trace: {}). The metric's delta less the harness's requests {} the audit log's count of the daemon's.\n",
            kind.runs
                .iter()
                .map(|r| r.execs.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            kind.trace_execs,
            if agree { "equals" } else { "DIFFERS FROM" }
        );
        if let Some(run) = kind.runs.first() {
            let _ = writeln!(out, "The daemon's requests for `{}`, in order:\n", run.pod);
            for (i, line) in run.sequence.iter().enumerate() {
                let _ = writeln!(out, "{}. `{line}`", i + 1);
            }
            out.push('\n');
        }
    }

    let load = &result.load;
    let (plain, clone, idle) = (&load.plain, &load.clone, &load.idle);
    let n = load.clones.max(1) as f64;
    let _ = writeln!(
        out,
        "#### {} clones over {} nodes\n\nStatic clones, created by the controller with {} creates in flight; before them {} plain pods (no clone) created the same way; after them nothing for the clones' wall time. CPU is the lab process's (`process_cpu_seconds_total`: kube-apiserver and etcd in one process, the audit log on).\n",
        load.clones, result.nodes, load.in_flight, load.clones
    );
    let mut t = Table::new(&["figure", "clones", "plain pods", "idle"]);
    let secs = |s: f64| format!("{s:.2} s");
    let mib = |kib: u64| format!("{:.0} MiB", kib as f64 / 1024.0);
    t.row(vec![
        "window (wall, quiet and settle included)".into(),
        human_ns(clone.wall_ms * 1e6),
        human_ns(plain.wall_ms * 1e6),
        human_ns(idle.wall_ms * 1e6),
    ]);
    t.row(vec![
        "creates sent, first to last answered".into(),
        human_ns(load.clones_created_ms * 1e6),
        human_ns(load.plain_created_ms * 1e6),
        String::new(),
    ]);
    t.row(vec![
        "first create to last `ready` write (API server's stamps)".into(),
        human_ns(load.clones_ready_ms * 1e6),
        String::new(),
        String::new(),
    ]);
    t.row(vec![
        "API server CPU".into(),
        secs(clone.cpu_s),
        secs(plain.cpu_s),
        secs(idle.cpu_s),
    ]);
    let idle_rate = idle.cpu_s / (idle.wall_ms / 1e3).max(1e-9);
    let above = |p: &Phase| p.cpu_s - idle_rate * p.wall_ms / 1e3;
    t.row(vec![
        "API server CPU vs idle for the same wall time".into(),
        ratio(clone.cpu_s, idle_rate * clone.wall_ms / 1e3),
        ratio(plain.cpu_s, idle_rate * plain.wall_ms / 1e3),
        "1.0x".into(),
    ]);
    t.row(vec![
        "API server CPU above idle, per pod".into(),
        human_ns(above(clone) / n * 1e9),
        human_ns(above(plain) / n * 1e9),
        String::new(),
    ]);
    t.row(vec![
        "  clone vs plain pod".into(),
        ratio(above(clone), above(plain)),
        String::new(),
        String::new(),
    ]);
    t.row(vec![
        "API server resident: before, peak (VmHWM), after".into(),
        format!(
            "{}, {}, {}",
            mib(clone.rss_before_kib),
            mib(clone.peak_rss_kib),
            mib(clone.rss_after_kib)
        ),
        format!(
            "{}, {}, {}",
            mib(plain.rss_before_kib),
            mib(plain.peak_rss_kib),
            mib(plain.rss_after_kib)
        ),
        format!(
            "{}, {}, {}",
            mib(idle.rss_before_kib),
            mib(idle.peak_rss_kib),
            mib(idle.rss_after_kib)
        ),
    ]);
    t.row(vec![
        "the daemons' CPU (all nodes)".into(),
        secs(clone.daemons_cpu_s),
        secs(plain.daemons_cpu_s),
        secs(idle.daemons_cpu_s),
    ]);
    out.push_str(&t.render());

    let _ = writeln!(
        out,
        "\nRequests in the clones' window (`apiserver_request_total`), per clone, the time the server spent answering them (`apiserver_request_duration_seconds_sum`, concurrent requests overlap), and who sent them (the audit log):\n"
    );
    let identities = ["daemons", "controller", "admin", "apiserver", "other"];
    let mut header = vec!["request", "all (metric)", "per clone", "serving time"];
    header.extend(identities);
    let mut table = Table::new(&header);
    let mut keys: Vec<&String> = clone.requests.keys().collect();
    for counts in clone.by_identity.values() {
        keys.extend(counts.keys());
    }
    keys.sort();
    keys.dedup();
    let mut sums = vec![0u64; identities.len()];
    let mut all = 0;
    for key in keys {
        let total = clone.requests.get(key).copied().unwrap_or(0);
        all += total;
        let mut row = vec![
            format!("`{key}`"),
            total.to_string(),
            format!("{:.2}", total as f64 / n),
            clone
                .serving_s
                .get(key)
                .map_or(String::new(), |s| format!("{s:.2} s")),
        ];
        for (i, identity) in identities.iter().enumerate() {
            let c = clone
                .by_identity
                .get(*identity)
                .and_then(|c| c.get(key))
                .copied()
                .unwrap_or(0);
            sums[i] += c;
            row.push(if c == 0 { String::new() } else { c.to_string() });
        }
        table.row(row);
    }
    let mut row = vec![
        "**total**".into(),
        all.to_string(),
        format!("{:.2}", all as f64 / n),
        format!("{:.2} s", clone.serving_s.values().sum::<f64>()),
    ];
    row.extend(sums.iter().map(u64::to_string));
    table.row(row);
    out.push_str(&table.render());
    let daemons: u64 = clone.by_identity.get("daemons").map_or(0, |c| {
        c.iter()
            .filter(|(k, _)| !k.starts_with("WATCH "))
            .map(|(_, n)| n)
            .sum()
    });
    let _ = writeln!(
        out,
        "\nThe daemons' requests per clone, watches apart: {:.2}; `PostCloneSucceeded` events posted: {}. Plain pods' window: {} requests in all, {} of them the daemons'. Idle window: {} requests in all, {} of them the daemons'.",
        daemons as f64 / n,
        load.success_events,
        plain.requests.values().sum::<u64>(),
        plain
            .by_identity
            .get("daemons")
            .map_or(0, |c| c.values().sum::<u64>()),
        idle.requests.values().sum::<u64>(),
        idle.by_identity
            .get("daemons")
            .map_or(0, |c| c.values().sum::<u64>()),
    );
    let _ = writeln!(
        out,
        "\nOne request alone, one at a time as admin: a wake-evidence listing as the daemon sends it (its first selector, one page), and a GET of a pod's metadata; the lab's CPU per request above idle, and the server's time answering it.\n"
    );
    let mut t = Table::new(&[
        "when",
        "events in the namespace",
        "requests",
        "listing: CPU, serving",
        "GET: CPU, serving",
        "listing vs GET (CPU)",
    ]);
    for p in &result.prices {
        t.row(vec![
            format!("{} (`{}`)", p.when, p.pod),
            p.events_in_namespace.to_string(),
            p.requests.to_string(),
            format!("{:.2} ms, {:.2} ms", p.list_cpu_ms, p.list_serving_ms),
            format!("{:.2} ms, {:.2} ms", p.get_cpu_ms, p.get_serving_ms),
            ratio(p.list_cpu_ms, p.get_cpu_ms),
        ]);
    }
    out.push_str(&t.render());
    out
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_query_parameter_is_read_decoded() {
        let uri = "/apis/events.k8s.io/v1/namespaces/prod/events?fieldSelector=regarding.uid%3Du-1%2Creason%3DWoken&limit=500";
        assert_eq!(
            super::query_param(uri, "fieldSelector").as_deref(),
            Some("regarding.uid=u-1,reason=Woken")
        );
        assert_eq!(super::query_param(uri, "limit").as_deref(), Some("500"));
        assert_eq!(super::query_param(uri, "watch"), None);
    }

    use super::*;

    #[test]
    fn the_minimum_is_the_traces_writes_and_events() {
        for (kind, patches, events, execs) in [
            (Kind::Static, 2, 1, 1),
            (Kind::Dhcp, 1, 0, 0),
            (Kind::Exhausted, 2, 5, 4),
        ] {
            let s = scenario(kind.scenario()).unwrap();
            let min = minimum(&s);
            assert_eq!(
                min.get("PATCH pods").copied().unwrap_or(0),
                patches,
                "{kind:?}"
            );
            assert_eq!(
                min.get("POST events.k8s.io/events").copied().unwrap_or(0),
                events,
                "{kind:?}"
            );
            assert_eq!(trace_execs(&s), execs, "{kind:?}");
        }
    }

    #[test]
    fn reads_the_request_counter_and_the_process_figures() {
        let text = r#"# HELP apiserver_request_total x
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="GET",version="v1"} 12
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="GET",version="v1"} 1
apiserver_request_total{code="201",component="apiserver",dry_run="",group="events.k8s.io",resource="events",scope="namespace",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="",scope="",subresource="/metrics",verb="GET",version=""} 7
process_cpu_seconds_total 41.5
process_resident_memory_bytes 3.2e+08
"#;
        let scrape = parse_metrics(text);
        assert_eq!(
            scrape.requests,
            Counts::from([
                ("GET pods".into(), 13),
                ("POST events.k8s.io/events".into(), 3),
                ("PATCH pods/status".into(), 2),
            ])
        );
        assert_eq!(scrape.cpu_seconds, 41.5);
        assert_eq!(scrape.rss_bytes, 3.2e8);
    }

    #[test]
    fn reads_an_audit_entry_as_the_metric_labels_it() {
        let line = r#"{"kind":"Event","level":"Metadata","stage":"ResponseComplete","requestURI":"/apis/events.k8s.io/v1/namespaces/bench/events?fieldSelector=regarding.uid%3Du-1%2Creason%3DWoken%2Ctype%3DNormal&limit=500","verb":"list","user":{"username":"cocoon-fixup:node-a"},"objectRef":{"resource":"events","namespace":"bench","apiGroup":"events.k8s.io","apiVersion":"v1"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-01-01T00:00:00.000001Z","stageTimestamp":"2026-01-01T00:00:00.250001Z"}"#;
        let seen = Seen::parse(line).unwrap();
        assert_eq!(seen.key, "LIST events.k8s.io/events");
        assert_eq!(seen.identity(), "daemons");
        assert_eq!(
            seen.describe(),
            "LIST events.k8s.io/events [reason=Woken,type=Normal]"
        );
        assert_eq!(
            stamp_difference(&seen.received, &seen.done),
            Some(Duration::from_millis(250))
        );
        let write = r#"{"stage":"ResponseComplete","verb":"patch","user":{"username":"cocoon-fixup:node-b"},"objectRef":{"resource":"pods","name":"static-0"},"responseStatus":{"code":200},"requestObject":{"metadata":{"uid":"u","annotations":{"vm.cocoonstack.io/lifecycle-state":"ready","vm.cocoonstack.io/ip":"10.0.0.5"}}}}"#;
        let seen = Seen::parse(write).unwrap();
        assert!(seen.ends_work());
        assert_eq!(
            seen.describe(),
            "PATCH pods {ip=10.0.0.5, lifecycle-state=ready}"
        );
        assert!(Seen::parse(&write.replace("ResponseComplete", "RequestReceived")).is_none());
    }

    #[test]
    fn sorts_pods_and_events_from_the_rest() {
        for (key, yes) in [
            ("GET pods", true),
            ("PATCH pods/status", true),
            ("POST events.k8s.io/events", true),
            ("POST events", true),
            ("PUT coordination.k8s.io/leases", false),
            ("LIST namespaces", false),
        ] {
            assert_eq!(pods_or_events(key), yes, "{key}");
        }
    }
}
