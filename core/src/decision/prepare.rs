//! [`PrepareTask`]: making a running pod's VM safe to clone, before the
//! stack snapshots it as a parent (docs/behaviour.md section 11). It is a
//! state machine over the same [`Action`]s and [`Report`]s as
//! [`PodTask`](super::PodTask), so every host that carries out a fixup
//! carries out a preparation unchanged: the VM is bound to the pod as for a
//! fixup, the plugin that plans the clones' network scenario plans
//! `prepare`, and the plan runs under the same nonce markers, exec timeout
//! and retry budget. When it took, the pod is annotated
//! `vm.cocoonstack.io/prepared` with the plugin that prepared it; its
//! clones carry the annotation on so their decision knows.
//!
//! A preparation writes no lifecycle and no `post-clone-*` annotation: the
//! parent is not a clone, and failing to prepare it leaves it as it was
//! (its clones are repaired as before). Running it again is harmless: the
//! plugins' plans only write files and reload.

use std::collections::VecDeque;
use std::time::Duration;

use super::attempts::Attempts;
use super::{
    Action, ExecPurpose, FixupEnd, Guarded, Handled, Note, PlanRequest, Planned, PodError, PodRef,
    Report, Settings, Stop, Summary, observe,
};
use crate::annotations::{AnnotationPatch, Event, keys, one_line, reasons};
use crate::binding;
use crate::classify::Scenario;
use crate::exec::ExecOutput;
use crate::facts::{Overrides, PodInput, VmId, VmInspect, annotations};
use crate::lifecycle::HandsOff;
use crate::planner::{ComposedPlan, Preparation};

use super::attempts::NonceSource;
use super::skeleton::{Awaiting, Binds, Turns, WrongReport, mismatch_told, report_name};

/// What `vm.cocoonstack.io/prepared` says: the plugin that prepared the
/// parent, its version and its code's digest, `<name> <version>
/// sha256:<hex>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub plugin: String,
    pub version: String,
    pub sha256: String,
}

impl Prepared {
    /// The annotation's value.
    pub fn value(&self) -> String {
        format!("{} {} sha256:{}", self.plugin, self.version, self.sha256)
    }

    /// Reads the annotation's value; `None` unless it is the plugin's name
    /// (one word), its version (one or more words) and `sha256:` with 64
    /// lowercase hex digits, with no control character (a value a host
    /// wrote). It is user input: it proves nothing by itself.
    pub fn parse(value: &str) -> Option<Self> {
        if value.len() > 512 || value.chars().any(char::is_control) {
            return None;
        }
        let (plugin, rest) = value.split_once(' ')?;
        let (version, digest) = rest.rsplit_once(' ')?;
        let hex = digest.strip_prefix("sha256:")?;
        (!plugin.is_empty()
            && !version.trim().is_empty()
            && hex.len() == 64
            && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .then(|| Prepared {
            plugin: plugin.to_owned(),
            version: version.to_owned(),
            sha256: hex.to_owned(),
        })
    }
}

/// The preparation of one pod's VM, from the pod as read to how it ended.
pub struct PrepareTask {
    settings: Settings,
    pod: PodRef,
    seen: PodInput,
    summary: Summary,
    stage: Stage,
    queue: VecDeque<Action>,
    nonces: NonceSource,
    now: Duration,
    /// What answers the action handed out last.
    awaiting: Awaiting,
}

impl std::fmt::Debug for PrepareTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrepareTask")
            .field("pod", &self.pod)
            .field("stage", &self.stage.name())
            .finish_non_exhaustive()
    }
}

/// The attempts at the plan, and what the pod is annotated with when one
/// takes.
#[derive(Debug)]
struct Preparing {
    attempts: Attempts,
    prepared: Prepared,
    /// The plan's plugins, as told ([`ComposedPlan::plugins`]).
    plugins: String,
}

#[derive(Debug)]
enum Stage {
    Admitting,
    Inspecting,
    Binding(Box<VmInspect>),
    Planning(VmId),
    Checkpoint(Box<Preparing>),
    Attempting(Box<Preparing>),
    Sleeping(Box<Preparing>),
    /// Before a later attempt: is the pod still ours?
    Reading(Box<Preparing>),
    Annotating(Box<Preparing>),
    Over,
}

impl Stage {
    fn name(&self) -> &'static str {
        match self {
            Stage::Admitting => "admitting",
            Stage::Inspecting => "inspecting",
            Stage::Binding(_) => "binding",
            Stage::Planning(_) => "planning",
            Stage::Checkpoint(_) | Stage::Reading(_) => "before-attempt",
            Stage::Attempting(_) => "attempting",
            Stage::Sleeping(_) => "sleeping",
            Stage::Annotating(_) => "annotating",
            Stage::Over => "over",
        }
    }
}

/// Why a pod is not prepared whatever its VM: it is being deleted, it is
/// hibernating or hibernated (or asked to), it runs macOS (never
/// inspected), it is not a managed pod, or its own network is not settled:
/// its lifecycle is neither absent nor `ready`, or its own fixup is
/// running or failed (a half-repaired clone is no parent to snapshot, and
/// its fixup may be exec'ing in the guest right now).
fn hands_off(pod: &PodInput) -> Option<HandsOff> {
    let get = |key: &str| pod.annotation(key);
    let lifecycle = get(keys::LIFECYCLE_STATE);
    if pod.deleting {
        Some(HandsOff::Deleting)
    } else if get(annotations::HIBERNATE) == "true"
        || matches!(lifecycle, "hibernating" | "hibernated")
    {
        Some(HandsOff::HibernateRequested)
    } else if crate::facts::is_macos(get(annotations::OS)) {
        Some(HandsOff::Macos)
    } else if get(annotations::MANAGED) != "true" {
        Some(HandsOff::NotManaged)
    } else if !matches!(lifecycle, "" | "ready")
        || matches!(get(keys::POST_CLONE_STATE), "running" | "failed")
    {
        Some(HandsOff::NotSettled)
    } else {
        None
    }
}

/// Whether `now` (a read of the pod) is still the pod the preparation was
/// decided for: the same uid and VM id annotation, and not left alone
/// ([`hands_off`], told through `why`).
fn still_ours(seen: &PodInput, now: &PodInput, why: &mut Option<HandsOff>) -> bool {
    if now.uid != seen.uid
        || now.annotation(annotations::VM_ID) != seen.annotation(annotations::VM_ID)
    {
        return false;
    }
    *why = hands_off(now);
    why.is_none()
}

impl Binds for PrepareTask {
    fn seen(&self) -> &PodInput {
        &self.seen
    }
    fn settings(&self) -> &Settings {
        &self.settings
    }
    fn label(&self) -> String {
        self.summary.pod.clone()
    }
    fn stop(&mut self, stop: Stop) -> Action {
        PrepareTask::stop(self, stop)
    }
    fn mismatch(&mut self, mismatch: binding::Mismatch) -> Action {
        PrepareTask::mismatch(self, mismatch)
    }
    fn bound(&mut self, record: VmInspect) -> Action {
        PrepareTask::bound(self, record)
    }
    fn left_alone(&mut self) -> Option<Action> {
        None
    }
    fn await_record(&mut self) {
        self.stage = Stage::Inspecting;
    }
    fn await_other_pods(&mut self, record: VmInspect) {
        self.stage = Stage::Binding(Box::new(record));
    }
}

impl Turns for PrepareTask {
    fn turn_state(&mut self) -> (&mut Awaiting, &mut Duration, &mut VecDeque<Action>) {
        (&mut self.awaiting, &mut self.now, &mut self.queue)
    }

    fn advance_with(&mut self, report: Report) -> Action {
        let stage = std::mem::replace(&mut self.stage, Stage::Over);
        self.advance(stage, report)
    }
}

impl PrepareTask {
    /// The preparation of `pod` as read, and its first action.
    pub fn start(pod: PodInput, settings: Settings, nonces: NonceSource) -> (PrepareTask, Action) {
        let label = pod.display_name();
        let uid = pod.uid.clone().filter(|u| !u.is_empty());
        let mut task = PrepareTask {
            settings,
            pod: PodRef {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: uid.clone().unwrap_or_default(),
            },
            summary: Summary::new(label.clone(), uid.clone().unwrap_or_default()),
            seen: pod,
            stage: Stage::Admitting,
            queue: VecDeque::new(),
            nonces,
            now: Duration::ZERO,
            awaiting: Awaiting::Nothing,
        };
        task.summary.scenario = Some(Scenario::Prepare);
        let first = if uid.is_none() {
            task.stop(Stop::NoUid { pod: label })
        } else if let Some(why) = hands_off(&task.seen) {
            task.summary.hands_off = Some(why);
            task.finish()
        } else {
            Action::Admit
        };
        task.awaiting = Awaiting::of(&first);
        (task, first)
    }

    /// The pod this task is for.
    pub fn pod(&self) -> &PodRef {
        &self.pod
    }

    /// The next action, given the report of the last one; a report that
    /// does not answer the last action is a host's bug (it panics).
    pub fn next(&mut self, report: Report, now: Duration) -> Action {
        self.try_next(report, now)
            .unwrap_or_else(|wrong| panic!("{wrong}"))
    }

    /// [`next`](Self::next), with a report that does not answer the last
    /// action as an error and the task unchanged.
    pub fn try_next(&mut self, report: Report, now: Duration) -> Result<Action, WrongReport> {
        self.take_turn(report, now)
    }

    fn advance(&mut self, stage: Stage, report: Report) -> Action {
        match (stage, report) {
            (Stage::Admitting, Report::Go) => self.look_up(),
            (Stage::Admitting | Stage::Checkpoint(_), Report::Cancelled) => {
                self.ended(None, FixupEnd::Shutdown)
            }
            (Stage::Inspecting, Report::Inspected(result)) => self.inspected(result),
            (Stage::Binding(record), Report::OtherPods(answer)) => self.other_pods(*record, answer),
            (Stage::Planning(vm), Report::Planned(Planned::Prepare(result))) => {
                self.planned(vm, result)
            }
            (Stage::Checkpoint(attempts), Report::Go) => self.attempt(attempts),
            (Stage::Attempting(attempts), Report::Ran(result)) => self.attempted(attempts, result),
            (Stage::Attempting(attempts) | Stage::Sleeping(attempts), Report::Cancelled) => {
                self.ended(Some(&attempts), FixupEnd::Shutdown)
            }
            (Stage::Sleeping(attempts), Report::Go) => {
                self.stage = Stage::Reading(attempts);
                Action::Read
            }
            (Stage::Reading(attempts), Report::Read(read)) => match read {
                Ok(Some(pod)) => {
                    let mut why = None;
                    if still_ours(&self.seen, &pod, &mut why) {
                        self.checkpoint(attempts)
                    } else {
                        self.summary.hands_off = why;
                        self.ended(Some(&attempts), FixupEnd::Gone)
                    }
                }
                Ok(None) | Err(PodError::Gone { .. }) => {
                    self.ended(Some(&attempts), FixupEnd::Gone)
                }
                // The pod could not be read: nothing runs on a guess; the
                // caller tries again.
                Err(error) => {
                    self.fill(&attempts, FixupEnd::Gone);
                    self.stop(Stop::Api(error))
                }
            },
            (Stage::Annotating(attempts), Report::Patched(result)) => {
                self.annotated(attempts, result)
            }
            (stage, report) => unreachable!(
                "the {} stage of a preparation was given {}, which it never asks for",
                stage.name(),
                report_name(&report)
            ),
        }
    }

    fn finish(&mut self) -> Action {
        self.stage = Stage::Over;
        Action::Finish(Ok(self.summary.clone()))
    }

    fn stop(&mut self, stop: Stop) -> Action {
        self.stage = Stage::Over;
        Action::Finish(Err(stop))
    }

    fn tell(&mut self, event: Event) {
        self.queue.push_back(Action::Tell(event));
    }

    fn note(&mut self, note: Note) {
        self.queue.push_back(Action::Note(note));
    }

    fn mismatch(&mut self, mismatch: binding::Mismatch) -> Action {
        let (note, event) = mismatch_told(&mismatch, &self.pod);
        self.note(note);
        self.tell(event);
        self.summary.action = Handled::VmMismatch;
        self.summary.mismatch = Some(mismatch.to_string());
        self.finish()
    }

    /// The VM is the pod's: plan its preparation.
    fn bound(&mut self, record: VmInspect) -> Action {
        let obs = observe(&self.seen, &record, &Overrides::default());
        let vm = match super::vm_id(&obs) {
            Ok(vm) => vm,
            Err(source) => {
                let pod = self.summary.pod.clone();
                return self.stop(Stop::Node(super::NodeError::BadRecord { pod, source }));
            }
        };
        self.stage = Stage::Planning(vm);
        Action::Plan(Box::new(PlanRequest::Prepare(obs)))
    }

    fn planned(
        &mut self,
        vm: VmId,
        result: Result<Preparation, crate::planner::PlannerError>,
    ) -> Action {
        match result {
            Ok(Preparation::Nothing { reason }) => {
                self.summary.errors.push(reason);
                self.finish()
            }
            Ok(Preparation::Plan { composed, .. }) => {
                self.summary.action = Handled::Prepare;
                let part = &composed.parts[0].selection.plugin;
                let prepared = Prepared {
                    plugin: part.info.name.clone(),
                    version: part.info.version.clone(),
                    sha256: part.sha256.clone(),
                };
                let plugins = composed.plugins();
                let ComposedPlan { plan, exec, .. } = *composed;
                let mut attempts = Attempts::new(vm, plan, exec);
                attempts.deadline = self.now + self.settings.retry.budget;
                let attempts = Box::new(Preparing {
                    attempts,
                    prepared,
                    plugins,
                });
                // The pod as it is now, before anything runs: the read the
                // task started from may be old, and the turn may have been
                // long in coming.
                self.stage = Stage::Reading(attempts);
                Action::Read
            }
            Err(error) if super::is_node_error(&error) => {
                let error = super::node_error(self.summary.pod.clone(), error);
                self.note(Note::NodeError {
                    kind: error.kind(),
                    message: one_line(&error.to_string()),
                });
                self.stop(Stop::Node(error))
            }
            Err(error) => {
                let line = one_line(&error.to_string());
                self.summary.action = Handled::Prepare;
                self.summary.fixup = Some(FixupEnd::PlanFailed);
                self.summary.errors.push(line.clone());
                self.note(Note::PlanFailed { line: line.clone() });
                self.tell(Event::warning(
                    reasons::PREPARE_FAILED,
                    format!("no prepare plan could be made, nothing ran: {line}"),
                ));
                self.finish()
            }
        }
    }

    fn checkpoint(&mut self, attempts: Box<Preparing>) -> Action {
        self.stage = Stage::Checkpoint(attempts);
        Action::Checkpoint
    }

    /// One exec of the plan ([`Attempts::begin`]).
    fn attempt(&mut self, mut work: Box<Preparing>) -> Action {
        if work.attempts.spent(self.now) {
            return self.exhausted(work);
        }
        let exec_timeout = self.settings.retry.exec_timeout;
        match work.attempts.begin(
            self.now,
            exec_timeout,
            &mut self.nonces,
            ExecPurpose::Prepare,
        ) {
            Ok(exec) => {
                self.stage = Stage::Attempting(work);
                exec
            }
            Err(error) => self.attempt_failed(work, error),
        }
    }

    fn attempted(
        &mut self,
        mut work: Box<Preparing>,
        result: Result<ExecOutput, String>,
    ) -> Action {
        match work.attempts.verdict(result) {
            Ok(()) => {
                let value = work.prepared.value();
                self.summary.prepared = Some(value.clone());
                let patch = AnnotationPatch::from([(keys::PREPARED.to_owned(), Some(value))]);
                self.stage = Stage::Annotating(work);
                Action::Patch {
                    patch,
                    unless_changed_from: None,
                }
            }
            Err(error) => self.attempt_failed(work, error),
        }
    }

    fn attempt_failed(&mut self, mut work: Box<Preparing>, error: String) -> Action {
        let line = work.attempts.failure_line(&error);
        self.note(Note::Warn(format!("prepare {line}")));
        self.tell(Event::warning(
            reasons::PREPARE_ATTEMPT_FAILED,
            line.clone(),
        ));
        match work
            .attempts
            .failed(line, self.now, self.settings.retry.interval)
        {
            Some(until) => {
                self.stage = Stage::Sleeping(work);
                Action::Sleep { until }
            }
            None => self.exhausted(work),
        }
    }

    fn exhausted(&mut self, work: Box<Preparing>) -> Action {
        let last = work
            .attempts
            .errors
            .last()
            .map_or("no attempt ran", String::as_str);
        self.tell(Event::warning(
            reasons::PREPARE_FAILED,
            format!(
                "prepare ({}) failed after {} attempt(s); the parent is as it was and its clones are repaired as before: {last}",
                work.plugins, work.attempts.count
            ),
        ));
        self.ended(Some(&work), FixupEnd::Exhausted)
    }

    fn annotated(&mut self, attempts: Box<Preparing>, result: Result<Guarded, PodError>) -> Action {
        match result {
            Ok(_) => {
                let prepared = self.summary.prepared.clone().unwrap_or_default();
                self.tell(Event::normal(
                    reasons::PREPARED,
                    format!("attempts={} plugin={prepared}", attempts.attempts.count),
                ));
                self.ended(Some(&attempts), FixupEnd::Done)
            }
            Err(PodError::Gone { .. }) => self.ended(Some(&attempts), FixupEnd::Gone),
            // The guest is prepared but the pod does not say so: its clones
            // are repaired as before until a preparation that is told
            // (running it again is harmless).
            Err(error) => {
                self.summary.prepared = None;
                self.fill(&attempts, FixupEnd::Done);
                self.stop(Stop::Api(error))
            }
        }
    }

    fn fill(&mut self, work: &Preparing, end: FixupEnd) {
        self.summary.fixup = Some(end);
        self.summary.attempts = work.attempts.count;
        self.summary.errors = work.attempts.errors.clone();
    }

    fn ended(&mut self, attempts: Option<&Preparing>, end: FixupEnd) -> Action {
        match attempts {
            Some(attempts) => self.fill(attempts, end),
            None => self.summary.fixup = Some(end),
        }
        if end != FixupEnd::Done {
            self.summary.prepared = None;
        }
        self.note(Note::Fixup {
            scenario: Scenario::Prepare,
            end,
            attempts: self.summary.attempts,
        });
        self.finish()
    }
}

impl super::Steps for PrepareTask {
    fn pod(&self) -> &PodRef {
        PrepareTask::pod(self)
    }
    fn next(&mut self, report: Report, now: Duration) -> Action {
        PrepareTask::next(self, report, now)
    }
    fn try_next(&mut self, report: Report, now: Duration) -> Result<Action, WrongReport> {
        PrepareTask::try_next(self, report, now)
    }
}

#[cfg(test)]
mod tests {
    use super::Prepared;

    #[test]
    fn the_value_reads_back_whatever_the_version() {
        for version in ["0.1.0", "1.0 beta", "2024.1~rc"] {
            let written = Prepared {
                plugin: "oci-networkd".into(),
                version: version.into(),
                sha256: "ab".repeat(32),
            };
            assert_eq!(Prepared::parse(&written.value()), Some(written));
        }
        for bad in [
            "",
            "oci-networkd",
            "oci-networkd 0.1.0",
            "oci-networkd 0.1.0 sha256:AB",
            &format!("oci-networkd 0.1.0 sha256:{}", "AB".repeat(32)),
            &format!("oci-networkd 0.1.0 md5:{}", "ab".repeat(32)),
            &format!("oci-networkd\n0.1.0 sha256:{}", "ab".repeat(32)),
            &format!("oci-networkd  sha256:{}", "ab".repeat(32)),
        ] {
            assert_eq!(Prepared::parse(bad), None, "{bad:?}");
        }
    }
}
