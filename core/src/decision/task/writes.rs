//! The writes decided from a read: each is decided again from the pod as
//! it is now, written with the pod's uid and resourceVersion as
//! preconditions, and its lifecycle change handed out once it landed.

use super::{
    Action, AfterSac, AnnotationPatch, DECIDE_ROUNDS, Duration, Event, Fixup, FixupEnd, Guarded,
    Ipv4Addr, Lifecycle, LifecycleIntent, Note, PodError, PodInput, PodTask, PostCloneState,
    Readiness, SacEnd, SacPass, Stage, Stop, VmId, Wait, annotations, exhausted_record,
    hint_base64, keys, lifecycle, messages, plan_failed_record, reasons, state_patch, unsettled,
};

/// What a write decided from a read is for.
#[derive(Debug)]
pub(super) enum Write {
    /// `running`, before the first attempt.
    Running(Box<Fixup>),
    /// `done` (and for a static first NIC the IP and `ready`).
    Done(Box<Fixup>),
    /// The failure record after the budget ran out; `summary` is its
    /// event's message.
    Exhausted { fixup: Box<Fixup>, summary: String },
    /// The failure record of a plan that could not be made.
    PlanFailed { vm: VmId, line: String },
    /// The IP and `ready`, or lifecycle `failed`, after the IP wait.
    Final(Box<Wait>),
    /// The failure record of a serial-console pass.
    SacFailed { vm: VmId, line: String },
}

impl Write {
    /// The VM the write is about.
    pub(super) fn vm(&self) -> &VmId {
        match self {
            Write::Running(fixup) | Write::Done(fixup) | Write::Exhausted { fixup, .. } => {
                &fixup.run.vm
            }
            Write::PlanFailed { vm, .. } | Write::SacFailed { vm, .. } => vm,
            Write::Final(wait) => &wait.facts.id,
        }
    }
}

/// Whether `pod` already holds everything `patch` writes (a removal: the
/// key is absent).
pub(super) fn holds(pod: &PodInput, patch: &AnnotationPatch) -> bool {
    patch
        .iter()
        .all(|(key, value)| pod.annotations.get(key) == value.as_ref())
}

impl PodTask {
    /// Whether the VM is a hibernate wake (spec section 2), by the pod's
    /// `restore-from-hibernate`: it stays on the pod, so work resumed after
    /// a restart keeps the wake's wording (spec section 6).
    pub(super) fn woken(&self) -> bool {
        self.wake
    }

    /// The read before a step in the guest (an attempt, the IP wait's
    /// nudge, a serial-console step): is the pod still ours, and the pod as
    /// read. API errors count as yes: a flaky API server must not stop the
    /// work; the uid precondition still guards writes, and every final
    /// write is decided from a read of its own.
    pub(super) fn ours_by_read(
        &mut self,
        result: Result<Option<PodInput>, PodError>,
        vm: &VmId,
        before: &str,
    ) -> (bool, Option<PodInput>) {
        match result {
            Ok(Some(current)) => (self.still_ours(&current, vm), Some(current)),
            Ok(None) => (false, None),
            Err(e) => {
                self.note(Note::Warn(format!(
                    "cannot check the pod before {before}: {e}"
                )));
                (true, None)
            }
        }
    }

    pub(super) fn still_ours(&self, current: &PodInput, vm: &VmId) -> bool {
        lifecycle::still_ours_knowing(current, &self.pod.uid, vm.as_str(), self.known())
    }

    /// What the task knows of the VM beyond the pod's annotations.
    pub(super) fn known(&self) -> lifecycle::Known {
        lifecycle::Known {
            wake: self.wake,
            foreign_marker: self.foreign_marker,
            remembered: self.remembered,
            lifted: self.lifted,
        }
    }

    /// The patch a write decides from `current`, or `None` for no write.
    pub(super) fn decide(&self, write: &Write, current: &PodInput) -> Option<AnnotationPatch> {
        match write {
            Write::Running(fixup) => self
                .still_ours(current, &fixup.run.vm)
                .then(|| state_patch(PostCloneState::Running)),
            // `done` records that the fixup ran in this VM, also on a pod
            // the stack has taken over meanwhile; never on a pod whose VM
            // id was re-pointed, which would send the next event's table
            // to the IP wait of a VM never fixed. The IP and `ready` only
            // for a pod still ours.
            Write::Done(fixup) => {
                let annotated = current.annotation(crate::facts::annotations::VM_ID);
                if !annotated.is_empty() && annotated != fixup.run.vm.as_str() {
                    return None;
                }
                let mut patch = state_patch(PostCloneState::Done);
                if let Some(ip) = fixup.ready_ip
                    && self.still_ours(current, &fixup.run.vm)
                {
                    patch.extend(annotations::ready_patch(&current.annotations, ip));
                }
                Some(patch)
            }
            Write::Exhausted { fixup, .. } => self.still_ours(current, &fixup.run.vm).then(|| {
                exhausted_record(
                    &current.annotations,
                    &hint_base64(&fixup.script),
                    fixup.scenario.as_str(),
                    fixup.run.errors.clone(),
                )
                .patch
            }),
            Write::PlanFailed { vm, line } => self
                .still_ours(current, vm)
                .then(|| plan_failed_record(&current.annotations, line)),
            Write::SacFailed { vm, line } => self.still_ours(current, vm).then(|| {
                let mut patch = state_patch(PostCloneState::Failed);
                patch.extend(
                    lifecycle::transition(&current.annotations, Lifecycle::Failed, line)
                        .unwrap_or_default(),
                );
                patch
            }),
            Write::Final(wait) => {
                if !self.still_ours(current, &wait.facts.id) {
                    return None;
                }
                match wait.ip {
                    Some(ip) => Some(annotations::ready_patch(&current.annotations, ip)),
                    // Nothing to write when failed is already recorded.
                    None => lifecycle::transition(
                        &current.annotations,
                        Lifecycle::Failed,
                        &messages::ip_wait_timeout(
                            &wait.facts.name,
                            self.settings.ready.budget,
                            self.woken(),
                        ),
                    ),
                }
            }
        }
    }

    /// Decide `write` from `current` (a read of the pod) and make it only
    /// while the pod is still as read; when it changed meanwhile, decide
    /// again from the pod as it is now (up to [`DECIDE_ROUNDS`] writes).
    /// This is how every final write of spec section 8 "reads the pod
    /// again".
    pub(super) fn write_from(&mut self, write: Write, current: PodInput, round: u32) -> Action {
        let (patch, intent) = match self.decide(&write, &current) {
            None => return self.decided(write, Decided::Skipped(current)),
            Some(patch) if self.settings.lifecycle_intents => LifecycleIntent::split(patch),
            Some(patch) => (patch, None),
        };
        if patch.is_empty() {
            // The lifecycle keys alone, which the embedder writes: decided
            // from this read, handed over, and taken as written.
            if let Some(intent) = intent {
                self.queue
                    .push_back(Action::Publish(intent.at(Some(&current))));
            }
            return self.decided(
                write,
                Decided::Written {
                    from: current,
                    answer: None,
                },
            );
        }
        self.stage = Stage::Writing {
            write,
            from: Box::new(current.clone()),
            patch: patch.clone(),
            intent,
            round,
        };
        Action::Patch {
            patch,
            unless_changed_from: Some(Box::new(current)),
        }
    }

    /// The pod as it is now, to decide `write` from: gone when deleted or
    /// another incarnation; a read that fails ends the task (nothing is
    /// assumed, nothing written, the caller tries again later).
    pub(super) fn read_for(
        &mut self,
        write: Write,
        result: Result<Option<PodInput>, PodError>,
    ) -> Action {
        let current = match result {
            Ok(current) => current.filter(|c| c.uid.as_deref() == Some(self.pod.uid.as_str())),
            Err(e) => return self.stop(Stop::Api(e)),
        };
        match current {
            Some(current) => self.write_from(write, current, 1),
            None => self.decided(write, Decided::Gone),
        }
    }

    pub(super) fn patched(
        &mut self,
        write: Write,
        from: PodInput,
        patch: &AnnotationPatch,
        intent: Option<LifecycleIntent>,
        round: u32,
        result: Result<Guarded, PodError>,
    ) -> Action {
        let landed = match &result {
            Ok(Guarded::Written(_)) => true,
            Ok(Guarded::Changed(current)) => {
                current.uid.as_deref() == Some(self.pod.uid.as_str()) && holds(current, patch)
            }
            Err(_) => false,
        };
        if landed && let Some(Some(state)) = patch.get(keys::POST_CLONE_STATE) {
            let vm = write.vm().clone();
            self.marked(&vm, &state.clone());
        }
        // The lifecycle change goes with the write it was decided with:
        // handed over once that landed, before anything that follows it.
        // A write found already made (its answer lost, or another writer)
        // comes with the pod as it is now: the change is decided again
        // from that (a pod that shows the change, or is no longer ours,
        // gets none).
        let handed = match &result {
            _ if !landed => None,
            Ok(Guarded::Written(answer)) => intent.map(|intent| intent.at(answer.as_ref())),
            Ok(Guarded::Changed(current)) if self.settings.lifecycle_intents => self
                .decide(&write, current)
                .and_then(|patch| LifecycleIntent::split(patch).1)
                .map(|intent| intent.at(Some(current))),
            _ => None,
        };
        if let Some(intent) = handed {
            self.queue.push_front(Action::Publish(intent));
        }
        match result {
            Ok(Guarded::Written(answer)) => self.decided(write, Decided::Written { from, answer }),
            // A write that landed while its answer was lost (a timeout, a
            // server error after the commit) is refused when tried again,
            // since it moved the version on: the pod then already holds it.
            // Another incarnation under the name: nothing more for it.
            Ok(Guarded::Changed(current))
                if current.uid.as_deref() != Some(self.pod.uid.as_str()) =>
            {
                self.decided(write, Decided::Gone)
            }
            Ok(Guarded::Changed(current)) if holds(&current, patch) => self.decided(
                write,
                Decided::Written {
                    from,
                    answer: Some(current),
                },
            ),
            Ok(Guarded::Changed(_)) if round >= DECIDE_ROUNDS => {
                self.decided(write, Decided::Unsettled)
            }
            Ok(Guarded::Changed(current)) => self.write_from(write, current, round + 1),
            Err(PodError::Gone { .. }) => self.decided(write, Decided::Gone),
            Err(e) => self.decided(write, Decided::Failed(e)),
        }
    }

    /// How a decided write ended, for what it was for.
    pub(super) fn decided(&mut self, write: Write, decided: Decided) -> Action {
        match write {
            Write::Running(mut fixup) => match decided {
                // The answer to the `running` write is a fresh read: the
                // first attempt needs no other.
                Decided::Written { from, answer } => {
                    fixup.fresh = answer;
                    self.start_budget(&mut fixup, &from);
                    self.loop_top(fixup)
                }
                Decided::Skipped(_) | Decided::Gone => self.fixup_over(&fixup, FixupEnd::Gone),
                // Nothing ran yet: the whole work is tried again later,
                // even after a refusal.
                Decided::Unsettled => self.stop(Stop::Api(unsettled(&self.pod))),
                Decided::Failed(error @ PodError::Refused { .. }) => {
                    self.stop(Stop::RunningRefused { error })
                }
                Decided::Failed(e) => self.stop(Stop::Api(e)),
            },
            Write::Done(fixup) => match decided {
                Decided::Written { from, .. } => {
                    let ready = fixup.ready_ip.map(|ip| {
                        if self.still_ours(&from, &fixup.run.vm) {
                            (Readiness::Ready, Some(ip))
                        } else {
                            (Readiness::Gone, None)
                        }
                    });
                    self.done_written(fixup, ready)
                }
                Decided::Skipped(_) | Decided::Gone => self.fixup_over(&fixup, FixupEnd::Gone),
                // A finished exec is never run again for want of a settled
                // read: `done` goes alone, and the IP wait decides the
                // ready write from its own read.
                Decided::Unsettled => self.done_alone(fixup),
                Decided::Failed(e) => self.stop(Stop::Api(e)),
            },
            Write::Exhausted { fixup, summary } => {
                let event = Event::warning(reasons::EXEC_EXHAUSTED, summary.clone());
                match decided {
                    Decided::Written { from, .. } => {
                        let record = exhausted_record(
                            &from.annotations,
                            &hint_base64(&fixup.script),
                            fixup.scenario.as_str(),
                            fixup.run.errors.clone(),
                        );
                        if let Some(e) = &record.hint_left_out {
                            self.note(Note::Warn(format!(
                                "the failure record was written without the hint: {e}"
                            )));
                        }
                        self.tell(event);
                        self.summary.errors = record.errors;
                        self.end_budget();
                        self.fixup_over(&fixup, FixupEnd::Exhausted)
                    }
                    Decided::Skipped(_) | Decided::Gone => self.fixup_over(&fixup, FixupEnd::Gone),
                    // Told even when the record cannot be written.
                    Decided::Unsettled => {
                        self.tell(event);
                        self.stop(Stop::Api(unsettled(&self.pod)))
                    }
                    Decided::Failed(e) => {
                        self.tell(event);
                        self.stop(Stop::Api(e))
                    }
                }
            }
            Write::PlanFailed { line, .. } => {
                let event = Event::warning(reasons::PLAN_FAILED, line);
                match decided {
                    Decided::Written { .. } => {
                        self.tell(event);
                        self.finish()
                    }
                    Decided::Skipped(_) | Decided::Gone => {
                        self.summary.fixup = Some(FixupEnd::Gone);
                        self.finish()
                    }
                    // Told even when the record cannot be written.
                    Decided::Unsettled => {
                        self.tell(event);
                        self.stop(Stop::Api(unsettled(&self.pod)))
                    }
                    Decided::Failed(e) => {
                        self.tell(event);
                        self.stop(Stop::Api(e))
                    }
                }
            }
            Write::SacFailed { line, .. } => {
                let event = Event::warning(
                    reasons::WINDOWS_STATIC_IP_FAILED,
                    format!("{}: {line}", self.op()),
                );
                match decided {
                    Decided::Written { .. } => {
                        self.tell(event);
                        self.sac_end(SacEnd::Failed)
                    }
                    Decided::Skipped(_) | Decided::Gone => self.sac_end(SacEnd::Gone),
                    // Told even when the record cannot be written.
                    Decided::Unsettled => {
                        self.tell(event);
                        self.stop(Stop::Api(unsettled(&self.pod)))
                    }
                    Decided::Failed(e) => {
                        self.tell(event);
                        self.stop(Stop::Api(e))
                    }
                }
            }
            Write::Final(wait) => {
                match decided {
                    Decided::Written { .. } => {}
                    Decided::Skipped(current) if self.still_ours(&current, &wait.facts.id) => {}
                    Decided::Skipped(_) | Decided::Gone => {
                        return self.readiness(Readiness::Gone, None);
                    }
                    Decided::Unsettled => return self.stop(Stop::Api(unsettled(&self.pod))),
                    Decided::Failed(e) => return self.stop(Stop::Api(e)),
                }
                match wait.ip {
                    Some(ip) => self.readiness(Readiness::Ready, Some(ip)),
                    None => {
                        let wake = self.woken();
                        let message = messages::ip_wait_timeout(
                            &wait.facts.name,
                            self.settings.ready.budget,
                            wake,
                        );
                        let reason = if wake {
                            reasons::WAKE_IP_WAIT_TIMEOUT
                        } else {
                            reasons::IP_WAIT_TIMEOUT
                        };
                        self.tell(Event::warning(reason, message));
                        self.readiness(Readiness::TimedOut, None)
                    }
                }
            }
        }
    }

    /// `done` is written: the serial-console pass when one is owed, else
    /// [`succeeded`](Self::succeeded).
    pub(super) fn done_written(
        &mut self,
        mut fixup: Box<Fixup>,
        ready: Option<(Readiness, Option<Ipv4Addr>)>,
    ) -> Action {
        match fixup.sac.take() {
            Some(nics) => {
                // The fixup is over and `done` has landed: it counts as
                // done whatever the pass after it does.
                self.fixup_done(&fixup);
                self.sac_start(SacPass {
                    vm: fixup.run.vm.clone(),
                    nics,
                    nets: None,
                    next: 0,
                    then: AfterSac::Succeeded(fixup),
                    until: Duration::ZERO,
                })
            }
            _ => self.succeeded(fixup, ready),
        }
    }
}

/// How a write decided from a read ended.
#[derive(Debug)]
pub(super) enum Decided {
    /// Written; `from` is the read it was decided from.
    Written {
        from: PodInput,
        answer: Option<PodInput>,
    },
    /// No write: the decision for the pod as it is was none.
    Skipped(PodInput),
    /// Deleted or replaced.
    Gone,
    /// The pod changed under each of [`DECIDE_ROUNDS`] writes.
    Unsettled,
    Failed(PodError),
}
