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

use std::collections::HashSet;
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
use crate::lifecycle::{self, Resume};
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

/// Is there anything to do for this pod? Cheap: annotations only, so
/// updates caused by the host's own patches cost nothing.
pub fn has_work(pod: &PodInput) -> bool {
    if pod.annotation(annotations::MANAGED) != "true" {
        return false;
    }
    if pod.annotation(annotations::VM_ID).is_empty()
        && pod.annotation(annotations::VM_NAME).is_empty()
    {
        return false;
    }
    !matches!(
        lifecycle::resume(&pod.annotations, true),
        Resume::Nothing | Resume::Parked
    )
}

/// Runs pods through the host, bounded and without duplicates.
#[derive(Debug)]
pub struct Dispatcher<C, P> {
    host: Arc<Host<C, P>>,
    permits: Arc<Semaphore>,
    in_flight: Arc<Mutex<HashSet<String>>>,
    shutdown: CancellationToken,
    tasks: JoinSet<()>,
}

impl<C: Cocoon, P: PodApi> Dispatcher<C, P> {
    pub fn new(host: Arc<Host<C, P>>, concurrency: usize, shutdown: CancellationToken) -> Self {
        Dispatcher {
            host,
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
            in_flight: Arc::default(),
            shutdown,
            tasks: JoinSet::new(),
        }
    }

    /// Start work for `pod` unless it has none or is already in flight.
    pub fn offer(&mut self, pod: PodInput, trigger: Trigger) {
        let Some(uid) = pod.uid.clone().filter(|_| has_work(&pod)) else {
            return;
        };
        if !self
            .in_flight
            .lock()
            .expect("in-flight lock")
            .insert(uid.clone())
        {
            return;
        }
        let host = self.host.clone();
        let permits = self.permits.clone();
        let in_flight = self.in_flight.clone();
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            let label = pod.display_name();
            if let Ok(_permit) = permits.acquire_owned().await {
                // Decide on the live pod, not the event's copy: a watch event
                // can arrive after the work it describes has finished.
                match host
                    .handle(&pod.namespace, &pod.name, trigger, &shutdown)
                    .await
                {
                    Ok(summary) => tracing::info!(
                        pod = %label,
                        action = summary.action,
                        fixup = summary.fixup,
                        readiness = summary.readiness,
                        attempts = summary.attempts,
                        "pod handled"
                    ),
                    Err(e) => tracing::warn!(pod = %label, "{e}"),
                }
            }
            in_flight.lock().expect("in-flight lock").remove(&uid);
        });
        // Reap finished tasks so the set does not grow.
        while self.tasks.try_join_next().is_some() {}
    }

    /// Wait for in-flight work, at most `timeout`.
    pub async fn drain(mut self, timeout: Duration) {
        let all = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(timeout, all).await.is_err() {
            tracing::warn!("in-flight work did not stop within {timeout:?}; exiting anyway");
        }
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
            Some(Ok(watcher::Event::Init | watcher::Event::Delete(_))) => {}
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
