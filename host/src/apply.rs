//! Applying a plan: one `cocoon vm exec` per attempt within a retry budget,
//! the error chain, the annotations and events (spec section 5), then the
//! wait for the guest's IP (spec section 6).
//!
//! Time and shutdown are parameters: every wait is a `tokio::time` sleep
//! raced against a [`CancellationToken`], so tests run 180 s of retries in
//! milliseconds under `tokio::time::pause()`. Shutdown is never exhaustion:
//! nothing is marked failed and `post-clone-state` stays `running` for the
//! next start. A deleted or replaced pod stops the loop, and every write
//! carries the pod's uid precondition; a write decided from a read also
//! carries the read's resource version ([`write_decided`]), so it never
//! lands on a pod that changed after the decision.

use std::net::Ipv4Addr;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use fixup_core::annotations::{exhausted_record, messages, state_patch};
use fixup_core::exec;

use fixup_core::classify::Scenario;
use crate::cocoon::{Cocoon, CocoonError};
use fixup_core::facts::{GuestOs, MacAddr, PodInput, VmId, WaitFacts, WaitNic};
use fixup_core::lifecycle::{self, Lifecycle, PostCloneState};
use fixup_core::plan::{Nonce, Plan, exec_argv};
use crate::pods::{AnnotationPatch, Event, Guarded, PodApi, PodError, PodRef, keys, reasons};
use crate::ready::LeaseWatcher;

/// The annotation values the loop writes, and their limits: the plan
/// side's, re-exported for the daemon's callers.
pub use fixup_core::annotations::{
    ANNOTATIONS_MAX, ERRORS_ANNOTATION_MAX, FAILURE_MESSAGE_MAX, NoRoomForHint, check_hint_room,
    errors_annotation, one_line,
};

/// The retry budget (spec section 5). Defaults: first attempt at once, 3 s
/// between attempts, until 180 s after the first; each exec bounded by
/// 90 s and by what is left of the budget. Configured with
/// `--retry-interval`, `--retry-budget`, `--exec-timeout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryConfig {
    pub interval: Duration,
    pub budget: Duration,
    pub exec_timeout: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            interval: Duration::from_secs(3),
            budget: Duration::from_secs(180),
            exec_timeout: Duration::from_secs(90),
        }
    }
}

/// The IP wait (spec section 6). Defaults: 45 s budget, poll every 200 ms,
/// Windows renew nudge once after 30 s with a 20 s timeout, DHCP recovery
/// for an all-DHCP Linux clone after 15 s. Configured with `--ip-wait`,
/// `--renew-after`, `--renew-timeout`, `--dhcp-recovery-after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyConfig {
    pub budget: Duration,
    pub renew_after: Duration,
    pub renew_timeout: Duration,
    pub dhcp_recovery_after: Duration,
    /// Timeout of the DHCP recovery exec, like every plan exec (90 s,
    /// `--exec-timeout`), never past the IP budget.
    pub recovery_timeout: Duration,
}

impl Default for ReadyConfig {
    fn default() -> Self {
        ReadyConfig {
            budget: Duration::from_secs(45),
            renew_after: Duration::from_secs(30),
            renew_timeout: Duration::from_secs(20),
            dhcp_recovery_after: Duration::from_secs(15),
            recovery_timeout: RetryConfig::default().exec_timeout,
        }
    }
}

/// How a fixup loop ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FixupOutcome {
    /// An attempt succeeded; `post-clone-state` is `done`. `ready` is how
    /// the IP wait ended when it needed no waiting (a static first NIC,
    /// [`FixupJob::ready_ip`]: the IP and `ready` went with `done` in one
    /// write, or the pod was no longer the host's by then); `None` when
    /// the IP wait follows.
    Done {
        attempts: u32,
        ready: Option<ReadyOutcome>,
    },
    /// The budget ran out; the pod is marked failed with hint and errors.
    Exhausted { attempts: u32, errors: Vec<String> },
    /// The host is shutting down; `post-clone-state` stays `running`.
    Shutdown { attempts: u32 },
    /// The pod was deleted or replaced, or the stack took it over
    /// (hibernation, deletion, another VM): nothing more is written.
    Gone { attempts: u32 },
}

/// What one fixup needs.
#[derive(Debug, Clone, Copy)]
pub struct FixupJob<'a> {
    pub pod: &'a PodRef,
    /// The pod as read before the VM was inspected: the `running` write is
    /// decided from it, and lands only while the pod is still so.
    pub seen: &'a PodInput,
    pub vm: &'a VmId,
    pub scenario: Scenario,
    pub plan: &'a Plan,
    /// The argv after `cocoon vm exec <id> --` without a nonce: each
    /// attempt adds a fresh one ([`exec_argv`]).
    pub exec: &'a [String],
    /// The hint script; written base64 as the hint for the failed case.
    pub script: &'a str,
    /// The first NIC's static address, when it has one: the IP wait then
    /// has nothing to wait for, so the IP and lifecycle `ready` are
    /// written with `done` (spec section 6, "first NIC static").
    pub ready_ip: Option<Ipv4Addr>,
}

/// Run one exec of the plan; `Ok` on success, else the attempt's error as
/// one line.
async fn attempt<C: Cocoon>(
    cocoon: &C,
    job: &FixupJob<'_>,
    timeout: Duration,
) -> Result<(), String> {
    run_plan(cocoon, job.vm, job.plan, job.exec, timeout).await
}

/// One exec of `plan` (`exec` is its [`render_exec`](fixup_core::plan::render_exec)
/// argv) under a fresh [`Nonce`], judged by [`exec::verdict`]: `Ok` when it
/// ran to completion, else the error as one line, naming the failed step.
async fn run_plan<C: Cocoon>(
    cocoon: &C,
    vm: &VmId,
    plan: &Plan,
    exec: &[String],
    timeout: Duration,
) -> Result<(), String> {
    let nonce = Nonce::generate().map_err(|e| one_line(&e.to_string()))?;
    let argv = exec_argv(plan, exec, &nonce);
    match cocoon.exec(vm, &argv, timeout).await {
        Ok(out) => exec::verdict(plan, &nonce, &out),
        Err(e) => Err(one_line(&e.to_string())),
    }
}

async fn emit<P: PodApi>(pods: &P, pod: &PodRef, event: Event) {
    if let Err(e) = pods.event(pod, &event).await {
        tracing::warn!(pod = %pod, reason = event.reason, "cannot record event: {e}");
    }
}

/// Is `current` still the pod the host is working for, with work the host
/// owns? The same incarnation (uid), the decision table still open (not
/// hibernating, not deleting, lifecycle not moved on: spec section 8), and
/// no other VM id annotated than the one the host bound.
pub fn still_ours(current: &PodInput, pod: &PodRef, vm: &VmId) -> bool {
    lifecycle::still_ours(current, &pod.uid, vm.as_str())
}

/// Is the pod still ours before an attempt? API errors count as yes: a
/// flaky API server must not stop a fixup; the uid precondition still
/// guards writes, and the final write is decided from a read.
async fn still_there<P: PodApi>(pods: &P, pod: &PodRef, vm: &VmId) -> bool {
    ours_now(pods, pod, vm, None).await.0
}

/// Whether the pod is still ours, and the read that says so: `fresh` (what
/// a write just answered, nothing having waited since) when there is one,
/// else a read. An API error counts as yes, with no read (see
/// [`still_there`]).
async fn ours_now<P: PodApi>(
    pods: &P,
    pod: &PodRef,
    vm: &VmId,
    fresh: Option<PodInput>,
) -> (bool, Option<PodInput>) {
    let current = match fresh {
        Some(current) => current,
        None => match pods.get(&pod.namespace, &pod.name).await {
            Ok(Some(current)) => current,
            Ok(None) => return (false, None),
            Err(e) => {
                tracing::warn!(pod = %pod, "cannot check the pod before an attempt: {e}");
                return (true, None);
            }
        },
    };
    (still_ours(&current, pod, vm), Some(current))
}

/// The pod as it is now, to decide a write from; `Ok(None)` when it is
/// gone (deleted, or another incarnation under the name). A read that
/// fails (after the API client's own retries) is an error: nothing is
/// assumed, nothing is written, and the caller tries again later.
pub async fn read_now<P: PodApi>(pods: &P, pod: &PodRef) -> Result<Option<PodInput>, PodError> {
    Ok(pods
        .get(&pod.namespace, &pod.name)
        .await?
        .filter(|current| current.uid.as_deref() == Some(pod.uid.as_str())))
}

/// How a write decided from a read ended ([`write_decided`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// Written. `from` is the pod the write was decided from, unchanged up
    /// to the write; `answer` the pod as the write left it, when the API
    /// server said.
    Written {
        from: PodInput,
        answer: Option<PodInput>,
    },
    /// Nothing written: the decision for the pod as it is (`.0`) was no
    /// write.
    Skipped(PodInput),
    /// The pod was deleted or replaced: nothing more is written for it.
    Gone,
    /// Nothing written: the pod changed under each of [`DECIDE_ROUNDS`]
    /// writes in a row; `.0` is it as last read.
    Unsettled(PodInput),
}

/// How many times in a row [`write_decided`] decides again for a pod that
/// changed under its write before it gives up.
pub const DECIDE_ROUNDS: u32 = 5;

/// The error for [`Decided::Unsettled`] where the caller has no other
/// way: a transient API error, so the work is tried again later.
pub fn unsettled(pod: &PodRef) -> PodError {
    PodError::Api {
        pod: pod.to_string(),
        reason: format!(
            "the pod changed under each of {DECIDE_ROUNDS} writes in a row; the write is tried again later"
        ),
    }
}

/// Whether `pod` already holds everything `patch` writes (a removal: the
/// key is absent).
fn holds(pod: &PodInput, patch: &AnnotationPatch) -> bool {
    patch
        .iter()
        .all(|(key, value)| pod.annotations.get(key) == value.as_ref())
}

/// Decide a write from `current` (a read of the pod: `decide` returns
/// `None` for no write) and make it only while the pod is still as read
/// ([`PodApi::patch_if_unchanged`]); when it changed meanwhile, decide
/// again from the pod as it is now. This is how every final write of spec
/// section 8 "reads the pod again": the API server checks that the
/// decision's read is the pod's current state when the write lands.
pub async fn write_decided<P: PodApi>(
    pods: &P,
    pod: &PodRef,
    mut current: PodInput,
    mut decide: impl FnMut(&PodInput) -> Option<AnnotationPatch> + Send,
) -> Result<Decided, PodError> {
    for _ in 0..DECIDE_ROUNDS {
        let Some(patch) = decide(&current) else {
            return Ok(Decided::Skipped(current));
        };
        match pods.patch_if_unchanged(pod, &patch, &current).await {
            Ok(Guarded::Written(answer)) => {
                return Ok(Decided::Written {
                    from: current,
                    answer,
                });
            }
            // A write that landed while its answer was lost (a timeout,
            // a server error after the commit) is refused when tried
            // again, since it moved the version on: the pod then already
            // holds it.
            Ok(Guarded::Changed(now)) if holds(&now, &patch) => {
                return Ok(Decided::Written {
                    from: current,
                    answer: Some(now),
                });
            }
            Ok(Guarded::Changed(now)) => current = now,
            Err(PodError::Gone { .. }) => return Ok(Decided::Gone),
            Err(e) => return Err(e),
        }
    }
    Ok(Decided::Unsettled(current))
}

/// The IP and lifecycle `ready`, for a pod that is still ours: its
/// lifecycle is then empty or `creating`, so stickiness (spec section 7)
/// cannot forbid `ready`.
fn ready_patch(current: &PodInput, ip: Ipv4Addr) -> AnnotationPatch {
    let mut patch = AnnotationPatch::from([(keys::IP.to_owned(), Some(ip.to_string()))]);
    patch.extend(
        lifecycle::transition(&current.annotations, Lifecycle::Ready, "").unwrap_or_default(),
    );
    patch
}

/// The fixup loop of spec section 5.
pub async fn run_fixup<C: Cocoon, P: PodApi>(
    cocoon: &C,
    pods: &P,
    job: FixupJob<'_>,
    retry: &RetryConfig,
    shutdown: &CancellationToken,
) -> Result<FixupOutcome, PodError> {
    let pod = job.pod;
    if shutdown.is_cancelled() {
        return Ok(FixupOutcome::Shutdown { attempts: 0 });
    }
    // The pod may have been handed over while cocoon was asked about the
    // VM: `running` lands only on the pod as it was read, still ours.
    let running = write_decided(pods, pod, job.seen.clone(), |current| {
        still_ours(current, pod, job.vm).then(|| state_patch(PostCloneState::Running))
    })
    .await?;
    // The answer to the `running` write is a fresh read: the first attempt
    // needs no other.
    let mut fresh = match running {
        Decided::Written { answer, .. } => answer,
        Decided::Skipped(_) | Decided::Gone => return Ok(FixupOutcome::Gone { attempts: 0 }),
        // Nothing ran yet: the whole work is tried again later.
        Decided::Unsettled(_) => return Err(unsettled(pod)),
    };
    let start = Instant::now();
    let deadline = start + retry.budget;
    let mut errors = Vec::new();
    let mut attempts = 0u32;
    loop {
        if shutdown.is_cancelled() {
            return Ok(FixupOutcome::Shutdown { attempts });
        }
        let (ours, seen) = ours_now(pods, pod, job.vm, fresh.take()).await;
        if !ours {
            return Ok(FixupOutcome::Gone { attempts });
        }
        attempts += 1;
        let timeout = retry
            .exec_timeout
            .min(deadline.saturating_duration_since(Instant::now()))
            .max(Duration::from_millis(1));
        let result = tokio::select! {
            r = attempt(cocoon, &job, timeout) => r,
            () = shutdown.cancelled() => return Ok(FixupOutcome::Shutdown { attempts }),
        };
        match result {
            Ok(()) => return succeeded(pods, &job, attempts, seen).await,
            Err(error) => {
                let line = messages::attempt_line(attempts, &error);
                tracing::warn!(pod = %pod, "{line}");
                emit(
                    pods,
                    pod,
                    Event::warning(reasons::EXEC_ATTEMPT_FAILED, line.clone()),
                )
                .await;
                errors.push(line);
            }
        }
        if Instant::now() + retry.interval >= deadline {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep(retry.interval) => {}
            () = shutdown.cancelled() => return Ok(FixupOutcome::Shutdown { attempts }),
        }
    }
    exhausted(pods, &job, retry, attempts, errors).await
}

/// An attempt succeeded: `done`, and for a static first NIC the IP and
/// `ready` in the same write while the pod is still ours, decided from
/// `seen` (the read before the attempt). Without a read to decide from, or
/// when the pod keeps changing under the write, `done` goes alone (any
/// state of the pod takes it; the uid still guards it) and the IP wait
/// that follows decides the ready write from its own read: a finished
/// exec is never run again for want of a settled read.
async fn succeeded<P: PodApi>(
    pods: &P,
    job: &FixupJob<'_>,
    attempts: u32,
    seen: Option<PodInput>,
) -> Result<FixupOutcome, PodError> {
    let pod = job.pod;
    let decided = match seen {
        Some(current) => Some(
            write_decided(pods, pod, current, |current| {
                let mut patch = state_patch(PostCloneState::Done);
                if let Some(ip) = job.ready_ip
                    && still_ours(current, pod, job.vm)
                {
                    patch.extend(ready_patch(current, ip));
                }
                Some(patch)
            })
            .await?,
        ),
        None => None,
    };
    let ready = match decided {
        Some(Decided::Written { from, .. }) => job.ready_ip.map(|ip| {
            if still_ours(&from, pod, job.vm) {
                ReadyOutcome::Ready { ip }
            } else {
                ReadyOutcome::Gone
            }
        }),
        Some(Decided::Skipped(_) | Decided::Gone) => return Ok(FixupOutcome::Gone { attempts }),
        None | Some(Decided::Unsettled(_)) => {
            match pods
                .patch_annotations(pod, &state_patch(PostCloneState::Done))
                .await
            {
                Ok(()) => None,
                Err(PodError::Gone { .. }) => return Ok(FixupOutcome::Gone { attempts }),
                Err(e) => return Err(e),
            }
        }
    };
    emit(
        pods,
        pod,
        Event::normal(
            reasons::SUCCEEDED,
            messages::succeeded(job.scenario.as_str(), attempts),
        ),
    )
    .await;
    Ok(FixupOutcome::Done { attempts, ready })
}

async fn exhausted<P: PodApi>(
    pods: &P,
    job: &FixupJob<'_>,
    retry: &RetryConfig,
    attempts: u32,
    errors: Vec<String>,
) -> Result<FixupOutcome, PodError> {
    let pod = job.pod;
    let summary = messages::exhausted(job.scenario.as_str(), attempts, retry.budget, &errors);
    let Some(current) = read_now(pods, pod).await? else {
        return Ok(FixupOutcome::Gone { attempts });
    };
    // Annotations may have grown since the plan was made: without room
    // for the hint, the record goes without it and says so.
    let hint = fixup_core::plan::hint_base64(job.script);
    let mut record = None;
    let decided = write_decided(pods, pod, current, |current| {
        if !still_ours(current, pod, job.vm) {
            return None;
        }
        let made = exhausted_record(
            &current.annotations,
            &hint,
            job.scenario.as_str(),
            errors.clone(),
            &summary,
        );
        let patch = made.patch.clone();
        record = Some(made);
        Some(patch)
    })
    .await;
    let event = Event::warning(reasons::EXEC_EXHAUSTED, summary.clone());
    let record = match (decided, record) {
        (Ok(Decided::Written { .. }), Some(record)) => record,
        // Told even when the record cannot be written.
        (Ok(Decided::Unsettled(_)), _) => {
            emit(pods, pod, event).await;
            return Err(unsettled(pod));
        }
        (Err(e), _) => {
            emit(pods, pod, event).await;
            return Err(e);
        }
        (Ok(_), _) => return Ok(FixupOutcome::Gone { attempts }),
    };
    if let Some(e) = &record.hint_left_out {
        tracing::warn!(pod = %pod, error = %e, "the failure record was written without the hint");
    }
    emit(pods, pod, event).await;
    Ok(FixupOutcome::Exhausted {
        attempts,
        errors: record.errors,
    })
}

/// How an IP wait ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadyOutcome {
    /// The IP is published and the lifecycle is `ready`.
    Ready {
        ip: Ipv4Addr,
    },
    /// No IP in time: lifecycle Failed, `PostCloneIPWaitTimeout`.
    TimedOut,
    Shutdown,
    Gone,
}

/// A recovery pass the IP wait may run once: the DHCP plan and its exec
/// argv (without a nonce: each exec draws its own).
#[derive(Debug, Clone)]
pub struct DhcpRecovery {
    pub plan: Plan,
    pub exec: Vec<String>,
    /// The NICs the plan re-runs DHCP on, for the event.
    pub nics: usize,
}

/// Wait for the guest's IP and publish readiness (spec section 6).
///
/// - First NIC static: its configured IP, at once.
/// - Otherwise the primary MAC's lease, watched in the lease file.
/// - Windows: one `cmd /c ipconfig /renew` nudge after `renew_after`.
/// - A Linux clone that needed no fixup: one DHCP recovery pass after
///   `dhcp_recovery_after`, inside the same budget.
///
/// The final write is decided from a read of the pod after the wait and
/// lands only while the pod is still as read ([`write_decided`]): it is
/// skipped when the pod is no longer ours ([`still_ours`]), and a read that
/// fails is an error (nothing written; the caller retries), never a guess.
#[allow(clippy::too_many_arguments)]
pub async fn wait_ready<C: Cocoon, P: PodApi>(
    cocoon: &C,
    pods: &P,
    leases: &LeaseWatcher,
    pod: &PodRef,
    facts: &WaitFacts,
    recovery: Option<&DhcpRecovery>,
    config: &ReadyConfig,
    shutdown: &CancellationToken,
) -> Result<ReadyOutcome, PodError> {
    let start = Instant::now();
    let deadline = start + config.budget;
    let ip = match facts.first {
        Some(WaitNic::Static(address)) => Some(address),
        Some(WaitNic::Lease(mac)) => {
            tokio::select! {
                ip = wait_lease(cocoon, pods, leases, pod, facts, mac, recovery, config, start, deadline) => ip,
                () = shutdown.cancelled() => return Ok(ReadyOutcome::Shutdown),
            }
        }
        None => {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => None,
                () = shutdown.cancelled() => return Ok(ReadyOutcome::Shutdown),
            }
        }
    };
    let Some(current) = read_now(pods, pod).await? else {
        return Ok(ReadyOutcome::Gone);
    };
    let message = messages::ip_wait_timeout(&facts.name, config.budget);
    let decided = write_decided(pods, pod, current, |current| {
        if !still_ours(current, pod, &facts.id) {
            return None;
        }
        match ip {
            Some(ip) => Some(ready_patch(current, ip)),
            // Nothing to write when failed is already recorded.
            None => lifecycle::transition(&current.annotations, Lifecycle::Failed, &message),
        }
    })
    .await?;
    match decided {
        Decided::Written { .. } => {}
        Decided::Skipped(current) if still_ours(&current, pod, &facts.id) => {}
        Decided::Skipped(_) | Decided::Gone => return Ok(ReadyOutcome::Gone),
        Decided::Unsettled(_) => return Err(unsettled(pod)),
    }
    let outcome = match ip {
        Some(ip) => ReadyOutcome::Ready { ip },
        None => {
            emit(pods, pod, Event::warning(reasons::IP_WAIT_TIMEOUT, message)).await;
            ReadyOutcome::TimedOut
        }
    };
    Ok(outcome)
}

#[allow(clippy::too_many_arguments)]
async fn wait_lease<C: Cocoon, P: PodApi>(
    cocoon: &C,
    pods: &P,
    leases: &LeaseWatcher,
    pod: &PodRef,
    facts: &WaitFacts,
    mac: MacAddr,
    recovery: Option<&DhcpRecovery>,
    config: &ReadyConfig,
    start: Instant,
    deadline: Instant,
) -> Option<Ipv4Addr> {
    let windows = facts.os == GuestOs::Windows;
    let nudge_at = if windows {
        Some(start + config.renew_after)
    } else if recovery.is_some() {
        Some(start + config.dhcp_recovery_after)
    } else {
        None
    };
    if let Some(at) = nudge_at.filter(|at| *at < deadline) {
        if let Some(ip) = leases.wait_for(&mac, at).await {
            return Some(ip);
        }
        // Nothing runs in a guest the stack has taken over meanwhile (a
        // hibernation, a deletion): the final read then skips the write.
        if !still_there(pods, pod, &facts.id).await {
            return None;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if windows {
            let argv: Vec<String> = ["cmd", "/c", "ipconfig", "/renew"]
                .map(str::to_owned)
                .to_vec();
            let timeout = config.renew_timeout.min(left);
            if let Err(e) = exec_once(cocoon, &facts.id, &argv, timeout).await {
                tracing::warn!(pod = %pod, "ipconfig /renew nudge failed: {e}");
            }
        } else if let Some(recovery) = recovery {
            emit(
                pods,
                pod,
                Event::normal(
                    reasons::DHCP_RECOVERY,
                    messages::dhcp_recovery(config.dhcp_recovery_after, recovery.nics),
                ),
            )
            .await;
            let timeout = config
                .recovery_timeout
                .min(left)
                .max(Duration::from_millis(1));
            let pass = run_plan(cocoon, &facts.id, &recovery.plan, &recovery.exec, timeout);
            if let Err(e) = pass.await {
                tracing::warn!(pod = %pod, "DHCP recovery pass failed: {e}");
            }
        }
    }
    leases.wait_for(&mac, deadline).await
}

async fn exec_once<C: Cocoon>(
    cocoon: &C,
    vm: &VmId,
    argv: &[String],
    timeout: Duration,
) -> Result<(), String> {
    match cocoon
        .exec(vm, argv, timeout.max(Duration::from_millis(1)))
        .await
    {
        Ok(out) if out.success() => Ok(()),
        Ok(out) => Err(format!(
            "{}: {}",
            out.status,
            one_line(&String::from_utf8_lossy(&out.stderr))
        )),
        Err(e) => Err(CocoonError::to_string(&e)),
    }
}
