//! [`Host`]: what an embedding daemon builds once and calls per pod.
//!
//! One call, [`Host::handle`], takes a pod from its annotations to a ready
//! intent (or a clear failure): read the pod, inspect its VM, classify,
//! decide from the persisted annotations whether to run, resume or park
//! (spec section 8), run the fixup loop, wait for the IP. The cocoon CLI
//! and the Kubernetes side are traits ([`Cocoon`], [`PodApi`]), so an
//! embedder can supply its own.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::apply::{
    self, DhcpRecovery, FixupJob, FixupOutcome, ReadyConfig, ReadyOutcome, RetryConfig,
};
use crate::classify::{self, Rule, Scenario};
use crate::cocoon::{Cocoon, CocoonError};
use crate::facts::{
    BootKind, FactError, GuestOs, ImageKind, Observation, Overrides, PodInput, VmFacts, VmId,
    annotations,
};
use crate::lifecycle::{self, Lifecycle, PostCloneState, Resume};
use crate::metrics::Metrics;
use crate::planner::{Planner, PlannerError};
use crate::pods::{AnnotationPatch, Event, PodApi, PodError, PodRef, cap_utf8, keys, reasons};
use crate::ready::LeaseWatcher;

/// Timeouts and budgets of the apply path, resolved once from the
/// configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    pub retry: RetryConfig,
    pub ready: ReadyConfig,
    /// Timeout for `cocoon vm inspect` (default 10 s, `--inspect-timeout`).
    pub inspect_timeout: Duration,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            retry: RetryConfig::default(),
            ready: ReadyConfig::default(),
            inspect_timeout: Duration::from_secs(10),
        }
    }
}

/// Why [`Host::handle`] was called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A pod event (or a one-shot `run`).
    Event,
    /// Startup reconciliation: resumed work is announced with
    /// `ResumedAfterRestart`.
    Startup,
}

/// Why a pod could not be handled at all.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("pod {pod} not found: check the namespace and name")]
    NotFound { pod: String },
    #[error(
        "pod {pod} has no uid: it is not a live pod object (pass a pod read from the API server)"
    )]
    NoUid { pod: String },
    #[error(
        "pod {pod} names no VM yet (no {} or {} annotation): wait until cocoon has created it",
        annotations::VM_ID,
        annotations::VM_NAME
    )]
    NoVm { pod: String },
    #[error(transparent)]
    Facts(#[from] FactError),
    #[error("pod {pod}: {source}")]
    Cocoon {
        pod: String,
        #[source]
        source: CocoonError,
    },
    #[error(transparent)]
    Pods(#[from] PodError),
}

/// How one call ended, for logs, `run`'s JSON summary and metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub pod: String,
    pub uid: String,
    /// `nothing`, `parked`, `fixup` or `ip-wait`.
    pub action: &'static str,
    /// The classification rule (1..=7).
    pub rule: u8,
    /// The scenario, or `none`.
    pub scenario: &'static str,
    /// `done`, `exhausted`, `plan-failed`, `shutdown` or `gone`; absent
    /// when no fixup ran.
    pub fixup: Option<&'static str>,
    pub attempts: u32,
    /// `ready`, `ready-blocked` (Failed was sticky), `timed-out`,
    /// `shutdown` or `gone`; absent when no IP wait ran.
    pub readiness: Option<&'static str>,
    pub ip: Option<String>,
    /// The error chain of a failed fixup.
    pub errors: Vec<String>,
}

impl Summary {
    /// Ready intent published.
    pub fn is_ready(&self) -> bool {
        self.readiness == Some("ready")
    }
}

/// The host: planner, cocoon runner, Kubernetes side, lease watcher.
#[derive(Debug)]
pub struct Host<C, P> {
    planner: Arc<Planner>,
    cocoon: C,
    pods: P,
    leases: Arc<LeaseWatcher>,
    config: HostConfig,
    metrics: Arc<Metrics>,
}

impl<C: Cocoon, P: PodApi> Host<C, P> {
    pub fn new(
        planner: Arc<Planner>,
        cocoon: C,
        pods: P,
        leases: Arc<LeaseWatcher>,
        config: HostConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        Host {
            planner,
            cocoon,
            pods,
            leases,
            config,
            metrics,
        }
    }

    pub fn pods(&self) -> &P {
        &self.pods
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// A shared handle on the metrics, for the metrics server.
    pub fn metrics_handle(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Take one pod as far as it can go now.
    pub async fn handle(
        &self,
        namespace: &str,
        name: &str,
        trigger: Trigger,
        shutdown: &CancellationToken,
    ) -> Result<Summary, HostError> {
        let label = format!("{namespace}/{name}");
        let pod = self
            .pods
            .get(namespace, name)
            .await?
            .ok_or_else(|| HostError::NotFound { pod: label.clone() })?;
        self.handle_pod(&pod, trigger, shutdown).await
    }

    /// As [`handle`](Self::handle), for a pod the caller already read (the
    /// node daemon gets them from its watch).
    pub async fn handle_pod(
        &self,
        pod: &PodInput,
        trigger: Trigger,
        shutdown: &CancellationToken,
    ) -> Result<Summary, HostError> {
        let label = pod.display_name();
        let uid = pod
            .uid
            .clone()
            .filter(|u| !u.is_empty())
            .ok_or_else(|| HostError::NoUid { pod: label.clone() })?;
        let pod_ref = PodRef {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: uid.clone(),
        };
        let mut summary = Summary {
            pod: label.clone(),
            uid,
            action: "nothing",
            rule: 0,
            scenario: "none",
            fixup: None,
            attempts: 0,
            readiness: None,
            ip: None,
            errors: Vec::new(),
        };

        // Only the persisted annotations decide (spec section 8).
        let state = pod
            .annotations
            .get(keys::POST_CLONE_STATE)
            .and_then(|s| PostCloneState::parse(s));
        // Unmanaged pods are never touched (rule 1), not even read further.
        if pod.annotation(annotations::MANAGED) != "true" {
            summary.rule = Rule::NotManaged.number();
            return Ok(summary);
        }
        // Terminal and parked pods are decided by their annotations alone:
        // no need to ask cocoon about their VM.
        match lifecycle::resume(&pod.annotations, true) {
            Resume::Nothing => return Ok(summary),
            Resume::Parked => {
                summary.action = "parked";
                return Ok(summary);
            }
            Resume::RunLoop | Resume::IpWaitOnly => {}
        }
        let mut obs = self.observe(pod, &label, state).await?;
        let decision = classify::classify(&obs);
        summary.rule = decision.rule.number();
        if decision.needs_image_kind()
            && obs.boot == Some(BootKind::Clone)
            && pod.annotation(annotations::CLONE_FROM_DIR).is_empty()
            && obs.source_image.is_none()
        {
            let vm = VmId::parse(&obs.vm_id)?;
            obs.source_image = self
                .cocoon
                .source_image(&vm, self.config.inspect_timeout)
                .await
                .map_err(|source| HostError::Cocoon {
                    pod: label.clone(),
                    source,
                })?;
        }
        let resume = match lifecycle::resume(&pod.annotations, decision.needs_fixup()) {
            // `running` from an earlier start, but the facts no longer need
            // a fixup: only the IP wait is left.
            Resume::RunLoop if !decision.needs_fixup() => Resume::IpWaitOnly,
            other => other,
        };
        if trigger == Trigger::Startup
            && let Some(op) = resume.op()
        {
            self.metrics.resumed(op);
            self.emit(
                &pod_ref,
                Event::normal(reasons::RESUMED_AFTER_RESTART, format!("op={op}")),
            )
            .await;
        }
        match resume {
            Resume::Nothing => return Ok(summary),
            Resume::Parked => {
                summary.action = "parked";
                return Ok(summary);
            }
            Resume::RunLoop | Resume::IpWaitOnly => {}
        }
        let mut facts_for_wait = None;
        let mut ran_fixup = false;
        if resume == Resume::RunLoop && decision.needs_fixup() {
            summary.action = "fixup";
            ran_fixup = true;
            let outcome = match self.planner.plan(&obs) {
                Ok(o) => o,
                Err(e) => {
                    self.metrics.plan_error(&e);
                    return self
                        .plan_failed(&pod_ref, &pod.annotations, summary, &e)
                        .await;
                }
            };
            self.metrics.plugin_calls(&outcome);
            let scenario = outcome.scenario.unwrap_or(Scenario::OciNetworkd);
            summary.scenario = scenario.as_str();
            let composed = outcome
                .composed
                .expect("a decision that needs a fixup has a plan");
            let job = FixupJob {
                pod: &pod_ref,
                vm: &composed.facts.id,
                scenario,
                plan: &composed.plan,
                exec: &composed.exec,
                hint: &composed.hint,
                annotations: &pod.annotations,
            };
            let result =
                apply::run_fixup(&self.cocoon, &self.pods, job, &self.config.retry, shutdown)
                    .await?;
            match result {
                FixupOutcome::Done { attempts } => {
                    summary.fixup = Some("done");
                    summary.attempts = attempts;
                    self.metrics.fixup(scenario, "done", attempts);
                }
                FixupOutcome::Exhausted { attempts, errors } => {
                    summary.fixup = Some("exhausted");
                    summary.attempts = attempts;
                    summary.errors = errors;
                    self.metrics.fixup(scenario, "exhausted", attempts);
                    return Ok(summary);
                }
                FixupOutcome::Shutdown { attempts } => {
                    summary.fixup = Some("shutdown");
                    summary.attempts = attempts;
                    return Ok(summary);
                }
                FixupOutcome::Gone { attempts } => {
                    summary.fixup = Some("gone");
                    summary.attempts = attempts;
                    return Ok(summary);
                }
            }
            facts_for_wait = Some(composed.facts);
        } else {
            summary.action = "ip-wait";
        }

        let facts = match facts_for_wait {
            Some(f) => f,
            None => match VmFacts::validate(&obs, ImageKind::Unknown) {
                Ok(f) => f,
                Err(e) => {
                    let e = PlannerError::Facts(e);
                    return self
                        .plan_failed(&pod_ref, &pod.annotations, summary, &e)
                        .await;
                }
            },
        };
        // The DHCP safety net: a Linux clone that needed no fixup.
        let recovery =
            if !ran_fixup && decision.rule == Rule::AllDhcp && facts.os != GuestOs::Windows {
                match self
                    .planner
                    .plan_scenarios(&facts, &[Scenario::DhcpRecovery])
                {
                    Ok(c) => Some(DhcpRecovery {
                        plan: c.plan,
                        exec: c.exec,
                    }),
                    Err(e) => {
                        tracing::warn!(pod = %pod_ref, "no DHCP recovery plan: {e}");
                        None
                    }
                }
            } else {
                None
            };
        let ready = apply::wait_ready(
            &self.cocoon,
            &self.pods,
            &self.leases,
            &pod_ref,
            &facts,
            recovery.as_ref(),
            &self.config.ready,
            shutdown,
        )
        .await?;
        let (readiness, ip) = match ready {
            ReadyOutcome::Ready { ip, ready_blocked } => (
                if ready_blocked {
                    "ready-blocked"
                } else {
                    "ready"
                },
                Some(ip.to_string()),
            ),
            ReadyOutcome::TimedOut => ("timed-out", None),
            ReadyOutcome::Shutdown => ("shutdown", None),
            ReadyOutcome::Gone => ("gone", None),
        };
        self.metrics.ip_wait(readiness);
        summary.readiness = Some(readiness);
        summary.ip = ip;
        Ok(summary)
    }

    /// Read the VM and build the observation.
    async fn observe(
        &self,
        pod: &PodInput,
        label: &str,
        state: Option<PostCloneState>,
    ) -> Result<Observation, HostError> {
        let id = match pod.annotation(annotations::VM_ID) {
            "" => pod.annotation(annotations::VM_NAME),
            id => id,
        };
        if id.is_empty() {
            return Err(HostError::NoVm {
                pod: label.to_owned(),
            });
        }
        let vm_id = VmId::parse(id)?;
        let vm = self
            .cocoon
            .inspect(&vm_id, self.config.inspect_timeout)
            .await
            .map_err(|source| HostError::Cocoon {
                pod: label.to_owned(),
                source,
            })?;
        // Work resumed after a restart does not know its source image: the
        // disk probe decides (spec section 8).
        let boot = (state == Some(PostCloneState::Running)).then_some(BootKind::Resumed);
        let overrides = Overrides {
            boot,
            source_image: None,
        };
        Ok(Observation::new(pod, &vm, &overrides)?)
    }

    /// No plan could be made (bad facts, no plugin, a plugin failure): a
    /// retry cannot help, so the pod is marked failed like an exhausted
    /// fixup, without a hint.
    async fn plan_failed(
        &self,
        pod: &PodRef,
        current: &std::collections::BTreeMap<String, String>,
        mut summary: Summary,
        error: &PlannerError,
    ) -> Result<Summary, HostError> {
        let line = apply::one_line(&format!("no plan could be made: {error}"));
        let mut patch = AnnotationPatch::from([
            (
                keys::POST_CLONE_STATE.to_owned(),
                Some(PostCloneState::Failed.as_str().to_owned()),
            ),
            (
                keys::POST_CLONE_ERRORS.to_owned(),
                Some(apply::errors_annotation(std::slice::from_ref(&line))),
            ),
        ]);
        let message = cap_utf8(line.clone(), 1024, "… [truncated]");
        if let Some(lifecycle) = lifecycle::transition(current, Lifecycle::Failed, &message) {
            patch.extend(lifecycle);
        }
        if !apply::write(&self.pods, pod, &patch).await? {
            summary.fixup = Some("gone");
            return Ok(summary);
        }
        self.emit(pod, Event::warning(reasons::EXEC_EXHAUSTED, line.clone()))
            .await;
        summary.fixup = Some("plan-failed");
        summary.errors = vec![line];
        Ok(summary)
    }

    async fn emit(&self, pod: &PodRef, event: Event) {
        if let Err(e) = self.pods.event(pod, &event).await {
            tracing::warn!(pod = %pod, reason = event.reason, "cannot record event: {e}");
        }
    }
}
