//! The node daemon behind `cocoon-fixup serve`.
//!
//! Watches the pods scheduled to one node (kube-runtime watcher, field
//! selector `spec.nodeName`), and runs [`Host::handle_pod`] for managed pods
//! with a VM that still have work: the first listing after start is startup
//! reconciliation (spec section 8), later events are new work. At most
//! `concurrency` pods are worked on at once, and a pod is never worked on
//! twice at the same time. SIGTERM or SIGINT cancels the shutdown token:
//! in-flight loops stop where they are and leave `post-clone-state=running`
//! for the next start. `/metrics` (Prometheus) and `/healthz` are served on
//! the metrics address.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cocoon::Cocoon;
use crate::facts::{PodInput, annotations};
use crate::host::{Host, Trigger};
use crate::lifecycle;
use crate::pods::PodApi;

/// How long in-flight work may take to stop after SIGTERM before the
/// daemon exits anyway: 10 s.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr} for metrics: {reason}; pass another --metrics-addr")]
    Listen { addr: SocketAddr, reason: String },
}

/// Is there anything to do for this pod? Cheap: the rows of spec section
/// 8's table that need only the pod ([`lifecycle::gate`]), plus a VM to look
/// up, so updates caused by the host's own patches cost nothing.
pub fn has_work(pod: &PodInput) -> bool {
    let names_a_vm = !pod.annotation(annotations::VM_ID).is_empty()
        || !pod.annotation(annotations::VM_NAME).is_empty();
    names_a_vm && lifecycle::gate(pod).is_ok()
}

/// How a pod whose handling failed before its work could run (cocoon did
/// not answer, the API server was unreachable, the node's cocoon root could
/// not be probed) is tried again: after `first` (1 s), doubling, never more
/// than `max` (60 s) apart, for as long as the pod still has work. The pod
/// is never left `creating` without work in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            first: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

/// Runs pods through the host, bounded and without duplicates.
///
/// Every pod event goes through the same table: an event that shows the
/// host has nothing more to do for a pod it is working on (hibernation
/// requested, lifecycle moved on, deletion started) stops that work, as
/// does the pod's deletion.
#[derive(Debug)]
pub struct Dispatcher<C, P> {
    host: Arc<Host<C, P>>,
    permits: Arc<Semaphore>,
    /// Pod uid -> the token that stops its work.
    in_flight: Arc<Mutex<HashMap<String, CancellationToken>>>,
    shutdown: CancellationToken,
    backoff: Backoff,
    tasks: JoinSet<()>,
}

impl<C: Cocoon, P: PodApi> Dispatcher<C, P> {
    pub fn new(host: Arc<Host<C, P>>, concurrency: usize, shutdown: CancellationToken) -> Self {
        Dispatcher {
            host,
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
            in_flight: Arc::default(),
            shutdown,
            backoff: Backoff::default(),
            tasks: JoinSet::new(),
        }
    }

    /// Replace the retry backoff.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
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
        let token = {
            let mut in_flight = self.in_flight.lock().expect("in-flight lock");
            if in_flight.contains_key(&uid) {
                return;
            }
            let token = self.shutdown.child_token();
            in_flight.insert(uid.clone(), token.clone());
            token
        };
        let host = self.host.clone();
        let permits = self.permits.clone();
        let in_flight = self.in_flight.clone();
        let backoff = self.backoff;
        self.tasks.spawn(async move {
            work(host, permits, &pod, trigger, &token, backoff).await;
            in_flight.lock().expect("in-flight lock").remove(&uid);
        });
        // Reap finished tasks so the set does not grow.
        while self.tasks.try_join_next().is_some() {}
    }

    /// Stop the work in flight for pod `uid`, if any (the pod was deleted,
    /// or the stack took it over).
    pub fn stop(&self, uid: &str) {
        if let Some(token) = self.in_flight.lock().expect("in-flight lock").get(uid) {
            token.cancel();
        }
    }

    /// Wait for in-flight work, at most `timeout`.
    pub async fn drain(mut self, timeout: Duration) {
        let all = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(timeout, all).await.is_err() {
            tracing::warn!("in-flight work did not stop within {timeout:?}; exiting anyway");
        }
    }
}

/// One pod's work: handle it, and handle it again with backoff while it
/// fails before its work could run.
async fn work<C: Cocoon, P: PodApi>(
    host: Arc<Host<C, P>>,
    permits: Arc<Semaphore>,
    pod: &PodInput,
    mut trigger: Trigger,
    token: &CancellationToken,
    backoff: Backoff,
) {
    let label = pod.display_name();
    let mut delay = backoff.first;
    loop {
        let Ok(permit) = permits.acquire().await else {
            return;
        };
        // Decide on the live pod, not the event's copy: a watch event can
        // arrive after the work it describes has finished.
        let result = host.handle(&pod.namespace, &pod.name, trigger, token).await;
        drop(permit);
        match result {
            Ok(summary) => {
                tracing::info!(
                    pod = %label,
                    action = summary.action,
                    hands_off = summary.hands_off,
                    fixup = summary.fixup,
                    readiness = summary.readiness,
                    attempts = summary.attempts,
                    "pod handled"
                );
                return;
            }
            Err(e) if e.is_retryable() && !token.is_cancelled() => {
                host.metrics().retry(e.kind());
                tracing::warn!(pod = %label, "{e}; trying again in {delay:?}");
            }
            Err(e) => {
                tracing::warn!(pod = %label, "{e}");
                return;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = token.cancelled() => return,
        }
        delay = (delay * 2).min(backoff.max);
        // `ResumedAfterRestart` is announced once, not on every retry.
        trigger = Trigger::Event;
    }
}

fn to_input(pod: &Pod) -> Option<PodInput> {
    let value = serde_json::to_value(pod).ok()?;
    match PodInput::from_value(&value, "kubernetes watch") {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!("skipping a pod the watch returned: {e}");
            None
        }
    }
}

/// Watch the node's pods and dispatch work until `shutdown` is cancelled.
pub async fn run<C: Cocoon, P: PodApi>(
    client: kube::Client,
    node: &str,
    host: Arc<Host<C, P>>,
    concurrency: usize,
    shutdown: CancellationToken,
) {
    let api: kube::Api<Pod> = kube::Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = watcher(api, config).default_backoff().boxed();
    let mut dispatcher = Dispatcher::new(host, concurrency, shutdown.clone());
    // The first listing after start is startup reconciliation; relists
    // after a watch restart are ordinary events.
    let mut started = false;
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            () = shutdown.cancelled() => break,
        };
        match event {
            Some(Ok(watcher::Event::InitApply(pod))) => {
                let trigger = if started {
                    Trigger::Event
                } else {
                    Trigger::Startup
                };
                if let Some(pod) = to_input(&pod) {
                    dispatcher.offer(pod, trigger);
                }
            }
            Some(Ok(watcher::Event::Apply(pod))) => {
                if let Some(pod) = to_input(&pod) {
                    dispatcher.offer(pod, Trigger::Event);
                }
            }
            Some(Ok(watcher::Event::InitDone)) => {
                if !started {
                    tracing::info!(node, "startup reconciliation dispatched; watching");
                }
                started = true;
            }
            Some(Ok(watcher::Event::Delete(pod))) => {
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    dispatcher.stop(uid);
                }
            }
            Some(Ok(watcher::Event::Init)) => {}
            Some(Err(e)) => tracing::warn!("pod watch: {e}; retrying with backoff"),
            None => break,
        }
    }
    dispatcher.drain(DRAIN_TIMEOUT).await;
}

/// Serve `/metrics` and `/healthz` until `shutdown`.
pub async fn metrics_server(
    addr: SocketAddr,
    metrics: Arc<crate::metrics::Metrics>,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    use axum::routing::get;
    let app = axum::Router::new()
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
        .route("/healthz", get(|| async { "ok\n" }));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| ServeError::Listen {
            addr,
            reason: e.to_string(),
        })?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .map_err(|e| ServeError::Listen {
            addr,
            reason: e.to_string(),
        })
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
