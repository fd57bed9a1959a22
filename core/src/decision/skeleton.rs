//! What every decision shares ([`PodTask`](super::PodTask),
//! [`PrepareTask`](super::PrepareTask)): the turn (which report answers
//! which action, a clock that never goes back, queued fire-and-forget
//! actions handed out first) and binding a VM record to the pod.

use std::collections::VecDeque;
use std::time::Duration;

use super::{Action, InspectFailed, Lookup, Note, PodRef, Report, Stop, lookup, mismatch_event};
use crate::annotations::{Event, one_line};
use crate::binding::{self, Verdict};
use crate::facts::{PodInput, VmInspect, escape_controls};

/// The reports that answer an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Awaiting {
    Go,
    GoOrCancelled,
    Inspected,
    OtherPods,
    Events,
    Planned,
    Read,
    Patched,
    RanOrCancelled,
    LeaseOrCancelled,
    SacOpenedOrCancelled,
    SacSetOrCancelled,
    /// The task is over.
    Nothing,
}

impl Awaiting {
    pub(super) fn of(action: &Action) -> Awaiting {
        match action {
            Action::Release
            | Action::Tell(_)
            | Action::Note(_)
            | Action::Remember(_)
            | Action::Publish(_)
            | Action::SacClose => Awaiting::Go,
            Action::Admit | Action::Checkpoint | Action::Sleep { .. } => Awaiting::GoOrCancelled,
            Action::Inspect { .. } => Awaiting::Inspected,
            Action::OtherPods { .. } => Awaiting::OtherPods,
            Action::WakeEvents { .. } => Awaiting::Events,
            Action::Plan(_) => Awaiting::Planned,
            Action::Read => Awaiting::Read,
            Action::Patch { .. } => Awaiting::Patched,
            Action::Exec { .. } => Awaiting::RanOrCancelled,
            Action::WaitLease { .. } => Awaiting::LeaseOrCancelled,
            Action::SacOpen { .. } => Awaiting::SacOpenedOrCancelled,
            Action::SacSet { .. } => Awaiting::SacSetOrCancelled,
            Action::Finish(_) => Awaiting::Nothing,
        }
    }

    pub(super) fn accepts(self, report: &Report) -> bool {
        matches!(
            (self, report),
            (Awaiting::Go | Awaiting::GoOrCancelled, Report::Go)
                | (
                    Awaiting::GoOrCancelled
                        | Awaiting::RanOrCancelled
                        | Awaiting::LeaseOrCancelled
                        | Awaiting::SacOpenedOrCancelled
                        | Awaiting::SacSetOrCancelled,
                    Report::Cancelled,
                )
                | (Awaiting::Inspected, Report::Inspected(_))
                | (Awaiting::OtherPods, Report::OtherPods(_))
                | (Awaiting::Events, Report::Events(_))
                | (Awaiting::Planned, Report::Planned(_))
                | (Awaiting::Read, Report::Read(_))
                | (Awaiting::Patched, Report::Patched(_))
                | (Awaiting::RanOrCancelled, Report::Ran(_))
                | (Awaiting::LeaseOrCancelled, Report::Lease(_))
                | (Awaiting::SacOpenedOrCancelled, Report::SacOpened(_))
                | (Awaiting::SacSetOrCancelled, Report::SacSet(_))
        )
    }
}

/// A decision's turn, the same for every decision ([`PodTask`],
/// [`PrepareTask`](super::PrepareTask)): the report must answer the action
/// handed out last and the clock must not go back; a queued
/// fire-and-forget action (an event, a note) is handed out first, else the
/// decision advances, and what it queued on the way goes before its
/// question.
pub(super) trait Turns {
    /// What answers the last action, the clock at the last report, and the
    /// queued fire-and-forget actions.
    fn turn_state(&mut self) -> (&mut Awaiting, &mut Duration, &mut VecDeque<Action>);

    /// The next action of the decision's stage, given the report.
    fn advance_with(&mut self, report: Report) -> Action;

    fn take_turn(&mut self, report: Report, now: Duration) -> Result<Action, WrongReport> {
        let (awaiting, last, queue) = self.turn_state();
        if !awaiting.accepts(&report) {
            return Err(WrongReport::Unanswered {
                wants: format!("{awaiting:?}").to_lowercase(),
                got: report_name(&report).to_owned(),
            });
        }
        if now < *last {
            return Err(WrongReport::ClockBack {
                last_ms: last.as_millis(),
                now_ms: now.as_millis(),
            });
        }
        *last = now;
        // A fire-and-forget action was carried out.
        if let Some(queued) = queue.pop_front() {
            *awaiting = Awaiting::of(&queued);
            return Ok(queued);
        }
        let action = self.advance_with(report);
        let (awaiting, _, queue) = self.turn_state();
        let action = if queue.is_empty() {
            action
        } else {
            // Events and notes first, then the question.
            queue.push_back(action);
            queue.pop_front().expect("not empty")
        };
        *awaiting = Awaiting::of(&action);
        Ok(action)
    }
}

/// What the node's other pods, or why the host has none, say of the
/// record's annotated `name` ([`binding::settle`]): the verdict (bound or
/// a mismatch), or why it is not proven.
pub(super) fn settled(
    pod: &PodInput,
    name: &str,
    answer: Result<Vec<PodInput>, String>,
) -> Result<Verdict, String> {
    match answer {
        Ok(others) => match binding::settle(pod, name, &others) {
            Verdict::Unproven { .. } => Err("the check did not settle".to_owned()),
            // `settle` proves or refuses; were it ever to do neither,
            // nothing would run.
            verdict => Ok(verdict),
        },
        Err(reason) => Err(reason),
    }
}

/// How a VM that is not the pod's is told: a note with the name the pod
/// derives, and a Warning event on the pod that never names the other VM.
pub(super) fn mismatch_told(mismatch: &binding::Mismatch, pod: &PodRef) -> (Note, Event) {
    let expected = binding::vm_name_for_pod(&pod.namespace, &pod.name);
    (
        Note::VmMismatch {
            expected: escape_controls(&expected),
            mismatch: mismatch.to_string(),
        },
        mismatch_event(mismatch, pod),
    )
}

/// The steps from a pod's VM reference to a VM bound to it, the same for
/// every decision: look the VM up and inspect it (no reference: nothing to
/// do yet), bind the record to the pod (spec section 2), listing the
/// node's other pods for an annotated name. A decision supplies what
/// happens on each way out.
pub(super) trait Binds {
    fn seen(&self) -> &PodInput;
    fn settings(&self) -> &super::Settings;
    /// The pod as `namespace/name`, for stops.
    fn label(&self) -> String;
    fn stop(&mut self, stop: Stop) -> Action;
    /// The VM is not the pod's.
    fn mismatch(&mut self, mismatch: binding::Mismatch) -> Action;
    /// The VM is the pod's.
    fn bound(&mut self, record: VmInspect) -> Action;
    /// Where a VM that could not be inspected or proven leaves a pod the
    /// decision would have left alone anyway, if so.
    fn left_alone(&mut self) -> Option<Action>;
    /// Wait for `cocoon vm inspect`'s record.
    fn await_record(&mut self);
    /// Wait for the node's other pods, for `record`'s annotated name.
    fn await_other_pods(&mut self, record: VmInspect);

    /// Look the pod's VM up.
    fn look_up(&mut self) -> Action {
        match lookup(self.seen()) {
            Lookup::NoVm => {
                let pod = self.label();
                self.stop(Stop::NoVm { pod })
            }
            Lookup::Unusable(mismatch) => self.mismatch(mismatch),
            Lookup::Inspect(vm) => {
                self.await_record();
                Action::Inspect {
                    vm,
                    timeout: self.settings().inspect_timeout,
                }
            }
        }
    }

    /// `cocoon vm inspect` answered: bind the record to the pod.
    fn inspected(&mut self, result: Result<VmInspect, InspectFailed>) -> Action {
        let record = match result {
            Ok(record) => record,
            Err(failed) => {
                if let Some(action) = self.left_alone() {
                    return action;
                }
                let pod = self.label();
                return self.stop(match failed {
                    InspectFailed::Failed(message) => Stop::Inspect { pod, message },
                    InspectFailed::Gone(message) => Stop::VmGone { pod, message },
                });
            }
        };
        match super::bind_record(self.seen(), &record, self.settings().binding) {
            Verdict::Bound { .. } => self.bound(record),
            Verdict::Mismatch(mismatch) => self.mismatch(mismatch),
            Verdict::Unproven { name } => {
                self.await_other_pods(record);
                Action::OtherPods { vm_name: name }
            }
        }
    }

    /// The node's other pods came back for an annotated name: bound when
    /// none claims it ([`binding::settle`]).
    fn other_pods(&mut self, record: VmInspect, answer: Result<Vec<PodInput>, String>) -> Action {
        let name = record.name.clone();
        let reason = match settled(self.seen(), &name, answer) {
            Ok(Verdict::Mismatch(mismatch)) => return self.mismatch(mismatch),
            Ok(_) => return self.bound(record),
            Err(reason) => reason,
        };
        if let Some(action) = self.left_alone() {
            return action;
        }
        let pod = self.label();
        self.stop(Stop::Unproven {
            pod,
            name,
            reason: one_line(&reason),
        })
    }
}

/// A report the task refuses: the task is left as it was, waiting for the
/// right one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WrongReport {
    /// It does not answer the action handed out last.
    #[error(
        "the report {got} does not answer the last action (it wants {wants}): carry out the action the task returned and report what it did"
    )]
    Unanswered { wants: String, got: String },
    /// Its clock is behind the last report's: the budgets are measured on
    /// a clock that never goes back (a monotonic one, not the wall clock).
    #[error(
        "the report's clock ({now_ms} ms) is behind the last report's ({last_ms} ms): report a monotonic clock, the same for the whole task"
    )]
    ClockBack { last_ms: u128, now_ms: u128 },
}

pub(super) fn report_name(report: &Report) -> &'static str {
    match report {
        Report::Go => "go",
        Report::Cancelled => "cancelled",
        Report::Inspected(_) => "inspected",
        Report::OtherPods(_) => "other-pods",
        Report::Events(_) => "events",
        Report::Planned(_) => "planned",
        Report::Read(_) => "read",
        Report::Patched(_) => "patched",
        Report::Ran(_) => "ran",
        Report::Lease(_) => "lease",
        Report::SacOpened(_) => "sac-opened",
        Report::SacSet(_) => "sac-set",
    }
}
