//! Carrying out the decision of [`fixup_core::decision`]: the daemon's
//! executor. [`Executor::run`] takes a [`PodTask`](fixup_core::decision::PodTask) (or a [`Steps`] of
//! another kind: a parent's preparation) and its first action,
//! does each action with the real seams (the `cocoon` runner, the
//! Kubernetes side, the lease watcher, the planner on tokio's blocking
//! pool) and reports back what happened, until the task finishes. It
//! decides nothing: when to retry, what to write, when to stop and what a
//! shutdown means are the task's.
//!
//! Time and shutdown are parameters: the task's clock is
//! [`tokio::time::Instant`] since the task started, so tests run 180 s of
//! retries in milliseconds under `tokio::time::pause()`, and every wait
//! (a turn, an exec, a sleep, a lease) is raced against a
//! [`CancellationToken`]. Every write carries the pod's uid precondition;
//! a write decided from a read also carries the read's resource version
//! ([`PodApi::patch_if_unchanged`]).

use std::sync::{Arc, OnceLock, RwLock};

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use fixup_core::decision::{
    Action, Guarded, InspectFailed, Note, PlanRequest, Planned, Report, Steps, Stop, Summary,
    is_node_error,
};
use fixup_core::facts::{PodInput, escape_controls};
use fixup_core::planner::{PlanPart, Planner, Preparation};

use crate::cocoon::{Cocoon, CocoonError};
use crate::console::{Console, ConsoleSession};
use crate::host::{FixupRecord, PluginUse};
use crate::metrics::Metrics;
use crate::node_pods::OtherPods;
use crate::pods::{Event, PodApi, PodRef};
use crate::ready::LeaseWatcher;
use fixup_core::memory::MemoryStore;

/// What the daemon's [`Host`](crate::host::Host) lends an executor besides
/// cocoon and the Kubernetes side: the turn among pods worked on at once,
/// the planner in service and its slots, where outcomes are reported, the
/// metrics, the lease watcher and where the node's other pods come from.
#[derive(Clone, Copy)]
pub(crate) struct HostParts<'a> {
    pub console: &'a Arc<dyn Console>,
    pub planner: &'a RwLock<Arc<Planner>>,
    pub planning: &'a Arc<Semaphore>,
    pub admission: &'a Semaphore,
    pub outcomes: &'a OnceLock<tokio::sync::mpsc::UnboundedSender<FixupRecord>>,
    pub metrics: &'a Metrics,
    pub leases: &'a LeaseWatcher,
    pub other_pods: &'a OtherPods,
    /// Where the pods' records are kept, when the host keeps them.
    pub records: Option<&'a Arc<MemoryStore>>,
}

/// Carries out one task.
pub(crate) struct Executor<'a, C, P> {
    pub cocoon: &'a C,
    pub pods: &'a P,
    pub host: HostParts<'a>,
    pub shutdown: &'a CancellationToken,
}

impl<'a, C: Cocoon, P: PodApi> Executor<'a, C, P> {
    /// Carry out `task` from `action` until it finishes.
    pub async fn run<T: Steps>(&self, task: T, action: Action) -> Result<Summary, Stop> {
        self.run_from(task, action, Instant::now(), None).await
    }

    /// [`run`](Self::run) on the task's clock from `origin`, with the turn
    /// of a first `Admit` already taken (`admitted`).
    pub async fn run_from<T: Steps>(
        &self,
        mut task: T,
        mut action: Action,
        origin: Instant,
        mut admitted: Option<SemaphorePermit<'a>>,
    ) -> Result<Summary, Stop> {
        let pod = task.pod().clone();
        // The turn among pods worked on at once, held from `Admit` to
        // `Release` (or the end).
        let mut turn = None;
        // The serial console opened last, from `SacOpen` to `SacClose`.
        let mut console: Option<Box<dyn ConsoleSession>> = None;
        loop {
            let report = if action.interruptible() && self.shutdown.is_cancelled() {
                Report::Cancelled
            } else {
                match action {
                    Action::Finish(result) => {
                        drop(turn);
                        return result;
                    }
                    Action::Admit => match admitted.take() {
                        Some(permit) => {
                            turn = Some(permit);
                            Report::Go
                        }
                        None => tokio::select! {
                            permit = self.host.admission.acquire() => {
                                turn = permit.ok();
                                Report::Go
                            }
                            () = self.shutdown.cancelled() => Report::Cancelled,
                        },
                    },
                    Action::Release => {
                        turn = None;
                        Report::Go
                    }
                    Action::Checkpoint => Report::Go,
                    Action::Inspect { vm, timeout } => {
                        match self.cocoon.inspect(&vm, timeout).await {
                            Ok(record) => Report::Inspected(Ok(record)),
                            Err(e) => Report::Inspected(Err(InspectFailed::Failed(e.to_string()))),
                        }
                    }
                    Action::WakeEvents { field_selectors } => Report::Events(
                        self.pods
                            .stack_events(&pod, &field_selectors)
                            .await
                            .map_err(|e| e.to_string()),
                    ),
                    Action::OtherPods { .. } => {
                        Report::OtherPods(other_pods(self.host.other_pods, self.pods).await)
                    }
                    Action::Plan(request) => Report::Planned(plan(self.host, &pod, *request).await),
                    Action::Read => Report::Read(self.pods.get(&pod.namespace, &pod.name).await),
                    Action::Patch {
                        patch,
                        unless_changed_from: Some(from),
                    } => Report::Patched(self.pods.patch_if_unchanged(&pod, &patch, &from).await),
                    Action::Patch {
                        patch,
                        unless_changed_from: None,
                    } => Report::Patched(
                        self.pods
                            .patch_annotations(&pod, &patch)
                            .await
                            .map(|()| Guarded::Written(None)),
                    ),
                    Action::Exec {
                        vm, argv, timeout, ..
                    } => tokio::select! {
                        out = self.cocoon.exec(&vm, &argv, timeout) => {
                            Report::Ran(out.map_err(|e| CocoonError::to_string(&e)))
                        }
                        () = self.shutdown.cancelled() => Report::Cancelled,
                    },
                    Action::WaitLease { mac, until } => {
                        let host = self.host;
                        tokio::select! {
                            ip = host.leases.wait_for(&mac, origin + until) => Report::Lease(ip),
                            () = self.shutdown.cancelled() => Report::Cancelled,
                        }
                    }
                    Action::Sleep { until } => tokio::select! {
                        () = tokio::time::sleep_until(origin + until) => Report::Go,
                        () = self.shutdown.cancelled() => Report::Cancelled,
                    },
                    Action::Tell(event) => {
                        emit(self.pods, &pod, &event).await;
                        Report::Go
                    }
                    // The daemon owns the lifecycle itself and never hands
                    // it over; were it asked to, it would publish the
                    // change as an embedder does.
                    Action::Publish(intent) => {
                        if let Err(e) = self.pods.patch_annotations(&pod, &intent.patch()).await {
                            tracing::warn!(pod = %pod, "the lifecycle change was not written: {e}");
                        }
                        Report::Go
                    }
                    Action::Note(note) => {
                        self.note(&pod, note);
                        Report::Go
                    }
                    Action::Remember(record) => {
                        let host = self.host;
                        if let Some(store) = host.records {
                            let label = pod.to_string();
                            crate::records::keep(store, host.metrics, &label, &pod.uid, *record)
                                .await;
                        }
                        Report::Go
                    }
                    Action::SacOpen {
                        vm,
                        need,
                        until,
                        total,
                    } => {
                        let host = self.host;
                        let opener = Arc::clone(host.console);
                        let stop = self.sac_stop();
                        let deadline = sac_deadline(origin, until, total);
                        let opened = tokio::task::spawn_blocking(move || {
                            opener.open(&vm, need, stop, deadline)
                        });
                        // The console sees the stop within 100 ms; the task
                        // does not wait even for that.
                        let opened = tokio::select! {
                            opened = opened => opened,
                            () = self.shutdown.cancelled() => Ok(Err(fixup_sac::SacError::Stopped)),
                        };
                        match opened {
                            Ok(Ok((nets, session))) => {
                                console = Some(session);
                                Report::SacOpened(Ok(nets))
                            }
                            Ok(Err(fixup_sac::SacError::Stopped)) => Report::Cancelled,
                            Ok(Err(e)) => Report::SacOpened(Err(e)),
                            Err(e) => Report::SacOpened(Err(fixup_sac::SacError::Dial {
                                cause: format!("the console task failed: {e}"),
                            })),
                        }
                    }
                    Action::SacSet {
                        net,
                        nic,
                        until,
                        total,
                    } => {
                        let mut session = console.take().expect("a set follows an open console");
                        let deadline = sac_deadline(origin, until, total);
                        let set = tokio::task::spawn_blocking(move || {
                            let result = session.set(net, &nic, deadline);
                            (session, result)
                        });
                        let set = tokio::select! {
                            set = set => Some(set),
                            () = self.shutdown.cancelled() => None,
                        };
                        match set {
                            // The session ends with its blocking call.
                            None => Report::Cancelled,
                            Some(Ok((session, result))) => {
                                console = Some(session);
                                match result {
                                    Err(fixup_sac::SacError::Stopped) => Report::Cancelled,
                                    result => Report::SacSet(result),
                                }
                            }
                            Some(Err(e)) => Report::SacSet(Err(fixup_sac::SacError::SetIp {
                                net,
                                cause: format!("the console task failed: {e}"),
                            })),
                        }
                    }
                    Action::SacClose => {
                        console = None;
                        Report::Go
                    }
                }
            };
            action = task.next(report, origin.elapsed());
        }
    }

    /// The console client's stop check: the host is shutting down, or the
    /// pod's work is stopped (the token is the pod's).
    fn sac_stop(&self) -> fixup_sac::StopCheck {
        let token = self.shutdown.clone();
        fixup_sac::StopCheck::when(move || token.is_cancelled())
    }

    /// What the task tells the operator: a log line, a metric.
    fn note(&self, pod: &PodRef, note: Note) {
        let m = self.host.metrics;
        match note {
            Note::Resumed(op) => {
                m.resumed(op);
            }
            Note::VmMismatch { expected, mismatch } => {
                tracing::warn!(pod = %pod, expected = %expected, "VM not used, nothing run: {mismatch}");
                m.vm_mismatch();
            }
            Note::NodeError { kind, message } => {
                tracing::error!(pod = %pod, "{message}");
                m.node_error(kind);
            }
            Note::PlanFailed { line } => tracing::warn!(pod = %pod, "{line}"),
            Note::Fixup {
                scenario,
                end,
                attempts,
            } => {
                m.fixup(scenario, end.as_str(), attempts);
            }
            Note::IpWait { readiness, wake } => {
                m.ip_wait(readiness.as_str(), if wake { "wake" } else { "clone" });
            }
            Note::Sac(end) => {
                tracing::info!(pod = %pod, "serial-console pass: {end}");
                m.sac(end.as_str());
            }
            Note::Warn(line) => tracing::warn!(pod = %pod, "{line}"),
        }
    }
}

/// The pass's total deadline `until` on the task's clock (since `origin`)
/// as the console client's [`fixup_sac::Deadline`].
fn sac_deadline(
    origin: Instant,
    until: std::time::Duration,
    total: std::time::Duration,
) -> fixup_sac::Deadline {
    fixup_sac::Deadline::after(until.saturating_sub(origin.elapsed()), total)
}

/// The pods on the node, for the decision to check an annotated VM name
/// against: the watched copy, or a listing from the API server.
async fn other_pods<P: PodApi>(source: &OtherPods, pods: &P) -> Result<Vec<PodInput>, String> {
    match source {
        OtherPods::Unseen { why } => Err(why.clone()),
        OtherPods::List { node } => pods.node_pods(node).await.map_err(|e| e.to_string()),
        OtherPods::Watched(node_pods) => node_pods.snapshot(),
    }
}

async fn emit<P: PodApi>(pods: &P, pod: &PodRef, event: &Event) {
    if let Err(e) = pods.event(pod, event).await {
        tracing::warn!(pod = %pod, reason = event.reason, "cannot record event: {e}");
    }
}

/// Plan on tokio's blocking pool with the planner in service, once one of
/// the engine's slots is free: the caller's task waits without holding an
/// async worker. What the plan tells the operator (plugin calls, fallbacks,
/// flavour notes, outcomes for a reload's watch) is reported here; what it
/// means for the pod is the task's.
async fn plan(host: HostParts<'_>, pod: &PodRef, request: PlanRequest) -> Planned {
    let planner = host
        .planner
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let permit = host
        .planning
        .clone()
        .acquire_owned()
        .await
        .expect("the planning semaphore is never closed");
    let task = tokio::task::spawn_blocking({
        let planner = planner.clone();
        move || {
            let _permit = permit;
            request.run(&planner)
        }
    });
    let planned = match task.await {
        Ok(planned) => planned,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Only a runtime shutting down cancels a blocking task, and it
        // drops this task with it.
        Err(e) => panic!("planning was cancelled: {e}"),
    };
    let record = |record: FixupRecord| {
        if let Some(sender) = host.outcomes.get() {
            let _ = sender.send(record);
        }
    };
    let parts = match &planned {
        Planned::Fixup(Ok(outcome)) => {
            host.metrics.plugin_calls(outcome);
            let parts = outcome.composed.as_ref().map_or(&[][..], |c| &c.parts[..]);
            if host.outcomes.get().is_some() && !parts.is_empty() {
                record(FixupRecord {
                    pod: pod.uid.clone(),
                    namespace: pod.namespace.clone(),
                    plugins: PluginUse::of_parts(parts),
                });
            }
            parts
        }
        Planned::Fixup(Err(e)) => {
            // A plugin past its deadline is a node error (the pod waits)
            // and still counted as that plugin's trap; as the node's, it
            // is not held against a version `serve` may roll back.
            host.metrics.plan_error(e);
            if !is_node_error(e)
                && let Some(r) = FixupRecord::plan_failed(&pod.uid, &pod.namespace, &planner, e)
            {
                record(r);
            }
            &[][..]
        }
        Planned::Recovery(Ok(composed)) => &composed.parts[..],
        Planned::Prepare(Ok(Preparation::Plan { composed, .. })) => &composed.parts[..],
        Planned::Recovery(Err(_)) | Planned::Prepare(_) => &[][..],
    };
    for part in parts {
        if let Some(fallback) = &part.fallback {
            let message = fallback.message(part.selection.scenario, &part.selection.plugin);
            tracing::warn!(pod = %pod, "{}", escape_controls(&message));
            host.metrics.plugin_fallback(fallback);
        }
    }
    flavor_notes(pod, &planner, parts);
    planned
}

/// Log, at debug level (the pod's owner chooses the annotation's text),
/// each part of a plan that the generic plugin planned although the VM
/// names a flavour, when some loaded plugin declares flavours for that
/// part's scenario: only there could a misspelt or unserved flavour have
/// changed the plan.
fn flavor_notes(pod: &PodRef, planner: &Planner, parts: &[PlanPart]) {
    for part in parts {
        if !planner.declares_flavors(part.selection.scenario) {
            continue;
        }
        if let Some(note) = part.unmatched_flavor() {
            tracing::debug!(pod = %pod, "{}", escape_controls(&note));
        }
    }
}
