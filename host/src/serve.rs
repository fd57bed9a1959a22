//! The node daemon behind `cocoon-fixup serve`.
//!
//! Watches the pods scheduled to one node (kube-runtime watcher, field
//! selector `spec.nodeName`), and runs [`Host::handle_uid`] for managed pods
//! with a VM that still have work: the first listing after start is startup
//! reconciliation (spec section 8), later events are new work. When the
//! host answers the check of an annotated VM name from the watch
//! ([`OtherPods::Watched`]), the watch keeps that copy of the node's pods. At most
//! `concurrency` pods hold a turn at once (the host's
//! [`HostConfig::fixups_in_flight`](crate::host::HostConfig::fixups_in_flight):
//! inspecting, planning, running the fixup; the wake grace, the
//! serial-console pass and the IP wait hold none), and a pod is never
//! worked on twice at the same time. SIGTERM or SIGINT cancels the shutdown token:
//! in-flight loops stop where they are and leave `post-clone-state=running`
//! for the next start. `/metrics` (Prometheus) and `/healthz` are served on
//! the metrics address, with a header-read and idle timeout, a lifetime and
//! a cap on every connection ([`ListenerLimits`]), because anyone who can
//! reach the address can open connections.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cocoon::Cocoon;
use fixup_core::decision::{Backoff, FixupEnd, Handled, Readiness, Summary, Trigger, has_work};
use fixup_core::lifecycle::HandsOff;
use fixup_core::memory::MemoryStore;

use crate::host::Host;
use crate::node_pods::{NodePods, OtherPods};
use crate::pods::PodApi;
use fixup_core::facts::{PodInput, annotations};

/// How long in-flight work may take to stop after SIGTERM before the
/// daemon exits anyway: 10 s.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr} for metrics: {reason}; pass another --metrics-addr")]
    Listen { addr: SocketAddr, reason: String },
}

/// Runs pods through the host, bounded and without duplicates.
///
/// Every pod event goes through the same table: an event that shows the
/// host has nothing more to do for a pod it is working on (hibernation
/// requested, lifecycle moved on, deletion started) stops that work, as
/// does the pod's deletion. Work offered while a stopped task is still
/// winding down is kept and run when it has.
#[derive(Debug)]
pub struct Dispatcher<C, P> {
    host: Arc<Host<C, P>>,
    permits: Arc<Semaphore>,
    /// Pod uid -> its work in flight.
    in_flight: Arc<Mutex<HashMap<String, Slot>>>,
    /// Pod uid -> the VM annotations (id, name) whose VM was not the pod's:
    /// the pod is not inspected again (nor its owner told again) until
    /// they change.
    mismatched: Arc<Mutex<HashMap<String, (String, String)>>>,
    shutdown: CancellationToken,
    tasks: JoinSet<()>,
}

/// One pod's work in flight.
#[derive(Debug)]
struct Slot {
    /// Stops this work.
    token: CancellationToken,
    /// Work offered after `token` was cancelled, to run once the stopped
    /// work has wound down.
    pending: Option<(Offered, Trigger)>,
}

/// What a pod's task keeps of the pod it was offered: where to read it,
/// its name for the log and the VM it named (for the mismatch memo). Not
/// the pod itself: each try reads it, and a task waiting holds little.
#[derive(Debug)]
struct Offered {
    namespace: String,
    name: String,
    label: String,
    pointer: (String, String),
}

impl Offered {
    fn new(pod: PodInput) -> Self {
        Offered {
            label: pod.display_name(),
            pointer: vm_pointer(&pod),
            namespace: pod.namespace,
            name: pod.name,
        }
    }
}

/// The annotations that point at a pod's VM.
fn vm_pointer(pod: &PodInput) -> (String, String) {
    (
        pod.annotation(annotations::VM_ID).to_owned(),
        pod.annotation(annotations::VM_NAME).to_owned(),
    )
}

impl<C: Cocoon, P: PodApi> Dispatcher<C, P> {
    /// At most `tasks` pods' tasks at once, whatever each is doing (the
    /// daemon sets no such bound: a task waits for a turn, the host's
    /// `fixups_in_flight`, only while it inspects, plans and runs the
    /// fixup).
    pub fn new(host: Arc<Host<C, P>>, tasks: usize, shutdown: CancellationToken) -> Self {
        Dispatcher {
            host,
            permits: Arc::new(Semaphore::new(tasks.clamp(1, Semaphore::MAX_PERMITS))),
            in_flight: Arc::default(),
            mismatched: Arc::default(),
            shutdown,
            tasks: JoinSet::new(),
        }
    }

    /// Pods being worked on now (their uids).
    pub fn in_flight(&self) -> usize {
        self.in_flight.lock().expect("in-flight lock").len()
    }

    /// Start work for `pod` unless it has none or is already in flight;
    /// stop work in flight when the table now says there is none.
    pub fn offer(&mut self, pod: PodInput, trigger: Trigger) {
        let Some(uid) = pod.uid.clone() else {
            return;
        };
        if !has_work(&pod) {
            self.stop(&uid);
            return;
        }
        {
            let mut mismatched = self.mismatched.lock().expect("mismatch lock");
            if mismatched.get(&uid) == Some(&vm_pointer(&pod)) {
                return;
            }
            mismatched.remove(&uid);
        }
        let token = {
            let mut in_flight = self.in_flight.lock().expect("in-flight lock");
            if let Some(slot) = in_flight.get_mut(&uid) {
                // The work in flight read the pod when it started; this
                // event may say more (a new VM id, a wake after a stop).
                // The latest is kept and looked at once the work is done:
                // for the host's own writes that costs one read.
                if !matches!(slot.pending, Some((_, Trigger::Startup))) {
                    slot.pending = Some((Offered::new(pod), trigger));
                }
                return;
            }
            let token = self.shutdown.child_token();
            in_flight.insert(
                uid.clone(),
                Slot {
                    token: token.clone(),
                    pending: None,
                },
            );
            token
        };
        let task = Task {
            host: self.host.clone(),
            permits: self.permits.clone(),
            in_flight: self.in_flight.clone(),
            mismatched: self.mismatched.clone(),
            shutdown: self.shutdown.clone(),
            uid,
        };
        self.tasks
            .spawn(task.run(Offered::new(pod), trigger, token));
        // Reap finished tasks so the set does not grow.
        while self.tasks.try_join_next().is_some() {}
    }

    /// Stop the work in flight for pod `uid`, if any, and drop work offered
    /// for later (the pod was deleted, or the stack took it over).
    pub fn stop(&self, uid: &str) {
        if let Some(slot) = self.in_flight.lock().expect("in-flight lock").get_mut(uid) {
            slot.token.cancel();
            slot.pending = None;
        }
    }

    /// The pod was deleted: stop its work and forget it.
    pub fn forget(&self, uid: &str) {
        self.stop(uid);
        self.mismatched.lock().expect("mismatch lock").remove(uid);
    }

    /// Wait for in-flight work, at most `timeout`.
    pub async fn drain(mut self, timeout: Duration) {
        let all = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(timeout, all).await.is_err() {
            tracing::warn!("in-flight work did not stop within {timeout:?}; exiting anyway");
        }
    }
}

/// One pod's task: its work, then any work offered while it wound down.
struct Task<C, P> {
    host: Arc<Host<C, P>>,
    permits: Arc<Semaphore>,
    in_flight: Arc<Mutex<HashMap<String, Slot>>>,
    mismatched: Arc<Mutex<HashMap<String, (String, String)>>>,
    shutdown: CancellationToken,
    uid: String,
}

/// Removes a pod's slot if its task ends without doing so (a panic), so
/// the pod can be worked on again.
struct SlotGuard<'a> {
    in_flight: &'a Mutex<HashMap<String, Slot>>,
    uid: &'a str,
    armed: bool,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        if self.armed
            && let Ok(mut in_flight) = self.in_flight.lock()
        {
            in_flight.remove(self.uid);
        }
    }
}

impl<C: Cocoon, P: PodApi> Task<C, P> {
    async fn run(self, mut pod: Offered, mut trigger: Trigger, mut token: CancellationToken) {
        let mut guard = SlotGuard {
            in_flight: &self.in_flight,
            uid: &self.uid,
            armed: true,
        };
        loop {
            let summary = self.work(&pod, trigger, &token).await;
            {
                let mut mismatched = self.mismatched.lock().expect("mismatch lock");
                match summary {
                    Some(s) if s.action == Handled::VmMismatch => {
                        mismatched.insert(self.uid.clone(), pod.pointer.clone());
                    }
                    Some(_) => {
                        mismatched.remove(&self.uid);
                    }
                    None => {}
                }
            }
            // Under one lock: take work offered meanwhile, or leave.
            let mut in_flight = self.in_flight.lock().expect("in-flight lock");
            let next = in_flight.get_mut(&self.uid).and_then(|slot| {
                let next = slot.pending.take()?;
                slot.token = self.shutdown.child_token();
                Some((next, slot.token.clone()))
            });
            match next {
                Some(((next_pod, next_trigger), next_token)) => {
                    (pod, trigger, token) = (next_pod, next_trigger, next_token);
                }
                None => {
                    in_flight.remove(&self.uid);
                    guard.armed = false;
                    return;
                }
            }
        }
    }

    /// Handle the pod, and again, when and as the stop says
    /// ([`Stop::again`]), while it stops before its work could run. `None`
    /// when it was stopped or gave up.
    async fn work(
        &self,
        pod: &Offered,
        mut trigger: Trigger,
        token: &CancellationToken,
    ) -> Option<Summary> {
        let label = &pod.label;
        let mut tries = 0;
        loop {
            let permit = tokio::select! {
                biased;
                () = token.cancelled() => return None,
                permit = self.permits.acquire() => permit.ok()?,
            };
            // Decide on the live pod, not the event's copy: a watch event
            // can arrive after the work it describes has finished.
            let result = self
                .host
                .handle_uid(&pod.namespace, &pod.name, &self.uid, trigger, token)
                .await;
            drop(permit);
            let stop = match result {
                Ok(summary) => {
                    tracing::info!(
                        pod = %label,
                        action = summary.action.as_str(),
                        hands_off = summary.hands_off.map(HandsOff::as_str),
                        fixup = summary.fixup.map(FixupEnd::as_str),
                        readiness = summary.readiness.map(Readiness::as_str),
                        attempts = summary.attempts,
                        "pod handled"
                    );
                    return Some(summary);
                }
                Err(stop) => stop,
            };
            let again = match stop.again(trigger, tries, Backoff::default()) {
                Some(again) if !token.is_cancelled() => again,
                _ => {
                    tracing::warn!(pod = %label, "{stop}");
                    return None;
                }
            };
            self.host.metrics().retry(&stop);
            tracing::warn!(pod = %label, "{stop}; trying again in {:?}", again.after);
            (trigger, tries) = (again.trigger, again.tries);
            tokio::select! {
                () = tokio::time::sleep(again.after) => {}
                () = token.cancelled() => return None,
            }
        }
    }
}

fn to_input(pod: PartialObjectMeta<Pod>) -> Option<PodInput> {
    match crate::kube::pod_input(pod.metadata) {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!("skipping a pod the watch returned: {e}");
            None
        }
    }
}

/// Watch the node's pods and dispatch work until `shutdown` is cancelled.
/// How many pods hold a turn at once is the host's (`--concurrency` sets
/// its `fixups_in_flight`).
pub async fn run<C: Cocoon, P: PodApi>(
    client: kube::Client,
    node: &str,
    host: Arc<Host<C, P>>,
    shutdown: CancellationToken,
) {
    let api: kube::Api<PartialObjectMeta<Pod>> = kube::Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    // Metadata only: annotations, uid and deletion are all the host reads,
    // so the API server sends neither spec nor status.
    let mut stream = watcher(api, config).default_backoff().boxed();
    let mut health = WatchHealth::new(host.metrics_handle());
    // The node's pods as the watch sees them, when the host answers the
    // check of an annotated VM name from them: kept before work is offered,
    // so a task sees the event that started it.
    let kept: Option<NodePods> = match host.other_pods() {
        OtherPods::Watched(node_pods) => Some(node_pods.clone()),
        OtherPods::Unseen { .. } | OtherPods::List { .. } => None,
    };
    let records = host.records().cloned();
    // The hibernate history of spec section 2: every pod on the node is
    // noted as the watch sees it, those left alone included (a macOS pod
    // not even that).
    let observer = records
        .clone()
        .map(|store| crate::records::Observer::start(store, host.metrics_handle()));
    let observe = |pod: &PodInput, live: bool| {
        if let Some(observer) = &observer
            && !fixup_core::facts::is_macos(pod.annotation(fixup_core::facts::annotations::OS))
        {
            observer.observe(pod, live);
        }
    };
    // The turn is the host's (its `fixups_in_flight`), held from a task's
    // admit to its release: a slow serial-console pass, a wake grace or an
    // IP wait never holds other pods back. Tasks themselves are one per
    // pod on the node.
    let mut dispatcher = Dispatcher::new(host, Semaphore::MAX_PERMITS, shutdown.clone());
    // The first listing after start is startup reconciliation; relists
    // after a watch restart are ordinary events.
    let mut started = false;
    // The uids of a listing under way: at its end, the records of pods
    // not in it are dropped.
    let mut listed = BTreeSet::new();
    let mut listed_from = SystemTime::now();
    loop {
        let quiet_at = health.failing_until;
        let event = tokio::select! {
            e = stream.next() => e,
            () = sleep_until_some(quiet_at) => {
                health.quiet();
                continue;
            }
            () = shutdown.cancelled() => break,
        };
        match event {
            Some(Ok(watcher::Event::InitApply(pod))) => {
                let trigger = if started {
                    Trigger::Event
                } else {
                    Trigger::Startup
                };
                if let Some(pod) = to_input(pod) {
                    if let Some(kept) = &kept {
                        kept.listed(&pod);
                    }
                    // A listing is a gap: what happened before it is unknown.
                    observe(&pod, false);
                    listed.extend(pod.uid.clone());
                    dispatcher.offer(pod, trigger);
                }
            }
            Some(Ok(watcher::Event::Apply(pod))) => {
                health.delivered();
                if let Some(pod) = to_input(pod) {
                    if let Some(kept) = &kept {
                        kept.changed(&pod);
                    }
                    observe(&pod, true);
                    dispatcher.offer(pod, Trigger::Event);
                }
            }
            Some(Ok(watcher::Event::InitDone)) => {
                health.listing_done();
                if let Some(kept) = &kept {
                    kept.listing_done();
                }
                if let Some(store) = &records {
                    forget_gone_pods(store, std::mem::take(&mut listed), listed_from);
                }
                if !started {
                    tracing::info!(node, "startup reconciliation dispatched; watching");
                }
                started = true;
            }
            Some(Ok(watcher::Event::Delete(pod))) => {
                health.delivered();
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    if let Some(kept) = &kept {
                        kept.deleted(uid);
                    }
                    dispatcher.forget(uid);
                    if let Some(store) = &records {
                        forget_pod(store, uid.to_owned());
                    }
                }
            }
            Some(Ok(watcher::Event::Init)) => {
                health.listing_started();
                if let Some(kept) = &kept {
                    kept.listing_started();
                }
                listed.clear();
                listed_from = SystemTime::now();
            }
            Some(Err(e)) => {
                health.failed(&e);
                tracing::warn!("pod watch: {e}; retrying with backoff");
            }
            None => break,
        }
    }
    dispatcher.drain(DRAIN_TIMEOUT).await;
}

/// How long the pod watch must go without an error, after one, to count
/// as streaming again when nothing else says so: 2 minutes. kube-runtime
/// resumes a broken watch from its last resource version, which sends no
/// new listing, and passes up no sign that it is back. A watch that keeps
/// failing errs at least every 90 s: kube-runtime's default backoff
/// (`.default_backoff()`: 0.8 s doubling to 30 s, plus up to as much
/// again of jitter) and the client's 30 s connect timeout.
pub const WATCH_ERROR_QUIET: Duration = Duration::from_secs(120);

/// Whether the pod watch has a complete listing and is streaming, as
/// `cocoon_fixup_watch_synced` says: not from the start until a listing
/// is complete, nor while the pods are listed again, nor after an error
/// until the watch lists again, delivers an event, or goes
/// [`WATCH_ERROR_QUIET`] without another error. Each error is also
/// counted, by kind.
struct WatchHealth {
    metrics: Arc<crate::metrics::Metrics>,
    /// A listing is complete and no other has begun.
    listed: bool,
    /// Until when the last error keeps the watch counted as not streaming.
    failing_until: Option<tokio::time::Instant>,
}

impl WatchHealth {
    fn new(metrics: Arc<crate::metrics::Metrics>) -> Self {
        let health = WatchHealth {
            metrics,
            listed: false,
            failing_until: None,
        };
        health.publish();
        health
    }

    fn listing_started(&mut self) {
        self.listed = false;
        self.publish();
    }

    /// A whole listing came through: the watch works.
    fn listing_done(&mut self) {
        self.listed = true;
        self.failing_until = None;
        self.publish();
    }

    /// An event came through the watch: it streams.
    fn delivered(&mut self) {
        if self.failing_until.take().is_some() {
            self.publish();
        }
    }

    fn failed(&mut self, error: &watcher::Error) {
        self.metrics.watch_error(error);
        self.failing_until = Some(tokio::time::Instant::now() + WATCH_ERROR_QUIET);
        self.publish();
    }

    /// [`WATCH_ERROR_QUIET`] passed since the last error.
    fn quiet(&mut self) {
        self.failing_until = None;
        self.publish();
    }

    fn publish(&self) {
        self.metrics
            .watch_synced(self.listed && self.failing_until.is_none());
    }
}

/// Sleep until `deadline`, or forever without one.
async fn sleep_until_some(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Drop the records of the pods not in `live` (the uids of a whole
/// listing of the node's pods, begun at `listed_from`), off the async
/// threads; a failure is logged, and the next listing tries again.
fn forget_gone_pods(store: &Arc<MemoryStore>, live: BTreeSet<String>, listed_from: SystemTime) {
    let store = Arc::clone(store);
    tokio::task::spawn_blocking(move || match store.retain(&live, listed_from) {
        Ok(0) => {}
        Ok(n) => tracing::debug!("dropped the records of {n} pod(s) that are gone"),
        Err(e) => tracing::warn!("cannot drop the records of pods that are gone: {e}"),
    });
}

/// Drop the record of a pod that was deleted.
fn forget_pod(store: &Arc<MemoryStore>, uid: String) {
    let store = Arc::clone(store);
    tokio::task::spawn_blocking(move || {
        if let Err(e) = store.forget(&uid) {
            tracing::warn!(
                pod_uid = uid,
                "cannot drop the record of a deleted pod: {e}"
            );
        }
    });
}

/// A client of the metrics listener must have sent a request's headers
/// within 5 s of the listener starting to wait for them. hyper starts this
/// timer whenever a connection waits for a request head: when it opens, and
/// after each response on a kept-alive connection. So it is the idle limit
/// too: a connection that sends nothing, or sits idle between requests, is
/// closed after 5 s (a longer idle limit could never fire). A head that
/// trickles in does not move the deadline. Set in [`ListenerLimits`].
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// A metrics connection is closed 30 s after it was accepted, whatever it
/// is doing: a client that keeps asking within the idle limit, sends a body
/// slowly, or does not read its response cannot hold a connection longer.
/// A scrape takes milliseconds. Set in [`ListenerLimits`].
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);

/// At most 64 metrics connections are open at once. A connection past the
/// cap is accepted and closed at once, so it holds a file descriptor only
/// for that moment and the connections already open (a scrape, the health
/// check) keep working. Prometheus and a health check need one or two. Set
/// in [`ListenerLimits`].
pub const MAX_CONNECTIONS: usize = 64;

/// How the metrics listener bounds its clients. The defaults are the
/// constants above and [`DRAIN_TIMEOUT`]; tests pass small values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    /// [`HEADER_READ_TIMEOUT`]: headers within this, and the idle limit.
    pub header_read: Duration,
    /// [`CONNECTION_LIFETIME`]: no connection lives longer.
    pub lifetime: Duration,
    /// [`MAX_CONNECTIONS`]: connections open at once; more are closed.
    pub max_connections: usize,
    /// [`DRAIN_TIMEOUT`]: after shutdown, responses in flight get this long
    /// to finish before their connections are dropped. Idle connections
    /// close at once.
    pub drain: Duration,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        ListenerLimits {
            header_read: HEADER_READ_TIMEOUT,
            lifetime: CONNECTION_LIFETIME,
            max_connections: MAX_CONNECTIONS,
            drain: DRAIN_TIMEOUT,
        }
    }
}

/// `/metrics` (OpenMetrics text) and `/healthz` (`ok`, then a line of
/// detail after a plugin reload was refused or rolled back).
pub fn metrics_router(metrics: Arc<crate::metrics::Metrics>) -> axum::Router {
    use axum::routing::get;
    let health = metrics.clone();
    axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move {
                    (
                        [(
                            http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        metrics.encode(),
                    )
                }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let health = health.clone();
                async move { health.health() }
            }),
        )
}

/// Serve `/metrics` and `/healthz` on `addr` within `limits` until
/// `shutdown`.
pub async fn metrics_server(
    addr: SocketAddr,
    metrics: Arc<crate::metrics::Metrics>,
    limits: ListenerLimits,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| ServeError::Listen {
            addr,
            reason: e.to_string(),
        })?;
    serve_http(listener, metrics_router(metrics), limits, shutdown).await;
    Ok(())
}

/// Serve `app` over HTTP/1 on `listener` until `shutdown`, within `limits`:
/// every connection has the header-read (and idle) timeout and the
/// lifetime, and at most `max_connections` are open at once; past the cap a
/// new connection is closed as soon as it is accepted. On shutdown the
/// listener is closed, idle connections close at once, and responses in
/// flight get `limits.drain` to finish.
pub async fn serve_http(
    mut listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: ListenerLimits,
    shutdown: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut connections = JoinSet::new();
    // Whether the last connection was refused: the cap being reached is
    // logged once, not for every refused connection.
    let mut refusing = false;
    loop {
        // axum's accept logs and waits out errors such as EMFILE.
        let (stream, peer) = tokio::select! {
            accepted = axum::serve::Listener::accept(&mut listener) => accepted,
            () = shutdown.cancelled() => break,
        };
        while connections.try_join_next().is_some() {}
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            if !refusing {
                tracing::warn!(
                    %peer,
                    cap = limits.max_connections,
                    "metrics listener: connection cap reached; closing new connections until one ends"
                );
            }
            refusing = true;
            drop(stream);
            continue;
        };
        refusing = false;
        connections.spawn(serve_connection(
            stream,
            app.clone(),
            limits,
            shutdown.clone(),
            permit,
        ));
    }
    drop(listener);
    let all = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(limits.drain, all).await.is_err() {
        tracing::warn!(
            "metrics listener: responses in flight did not finish within {:?}; dropping their connections",
            limits.drain
        );
    }
}

/// One connection, holding one of the cap's `permit`s until it closes.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    app: axum::Router,
    limits: ListenerLimits,
    shutdown: CancellationToken,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read);
    let service = hyper_util::service::TowerToHyperService::new(app);
    let served = async {
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let mut conn = std::pin::pin!(conn);
        tokio::select! {
            result = conn.as_mut() => return result,
            () = shutdown.cancelled() => {}
        }
        // Finish the response in flight, if any, then close.
        conn.as_mut().graceful_shutdown();
        conn.await
    };
    match tokio::time::timeout(limits.lifetime, served).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!("metrics connection closed: {e}"),
        Err(_) => tracing::debug!(
            "metrics connection closed at its lifetime of {:?}",
            limits.lifetime
        ),
    }
    drop(permit);
}

/// The process's open-file limit (`RLIMIT_NOFILE`); `None` is unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileLimit {
    pub soft: Option<u64>,
    pub hard: Option<u64>,
}

impl OpenFileLimit {
    fn now() -> Self {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        OpenFileLimit {
            soft: limit.current,
            hard: limit.maximum,
        }
    }
}

fn show_limit(limit: Option<u64>) -> String {
    limit.map_or_else(|| "unlimited".to_owned(), |n| n.to_string())
}

/// Raise the soft open-file limit to the hard one, log both, and return the
/// limit in force. The daemon's descriptors (`cocoon` pipes, watches, the
/// Kubernetes client, metrics connections) all count against the soft limit,
/// which is often 1024 while the hard one is far higher (systemd: 1024 and
/// 524288). Failing to raise it is logged, not fatal: the metrics listener's
/// cap ([`MAX_CONNECTIONS`]) keeps well inside the old limit.
pub fn raise_open_file_limit() -> OpenFileLimit {
    use rustix::process::{Resource, Rlimit, setrlimit};
    let before = OpenFileLimit::now();
    if before.soft != before.hard {
        let raised = Rlimit {
            current: before.hard,
            maximum: before.hard,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(
                soft = %show_limit(before.soft),
                hard = %show_limit(before.hard),
                "cannot raise the open-file soft limit to the hard limit: {e}; running with the soft limit (raise the hard limit, e.g. `LimitNOFILE=` in the systemd unit)"
            );
        }
    }
    let after = OpenFileLimit::now();
    if after.soft == before.soft {
        tracing::info!(
            soft = %show_limit(after.soft),
            hard = %show_limit(after.hard),
            "open-file limit"
        );
    } else {
        tracing::info!(
            from = %show_limit(before.soft),
            soft = %show_limit(after.soft),
            hard = %show_limit(after.hard),
            "open-file soft limit raised to the hard limit"
        );
    }
    after
}

/// A token cancelled on SIGTERM or SIGINT.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::warn!("cannot install signal handlers; stop with SIGKILL");
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: stopping; in-flight work stays `running` for the next start"),
            _ = int.recv() => tracing::info!("SIGINT: stopping"),
        }
        t.cancel();
    });
    token
}
