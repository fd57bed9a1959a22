//! Binding's result and the wake evidence: the record bound to the pod,
//! the stack's events and the host's hibernate history read into a
//! verdict (spec section 2), and what the verdict leaves to do.

use super::{
    Action, Backend, Binds, BootKind, Duration, Evidence, GuestOs, HandsOff, Lifecycle,
    LifecycleIntent, Listed, NodeError, Note, Observation, Overrides, PodTask, PostCloneState,
    RecordFact, Row, Stage, Stop, Told, VmId, VmInspect, Witness, keys, lifecycle, observe,
    one_line,
};

/// A VM bound to the pod whose wake verdict is not reached yet (spec
/// section 2, rules 2 and the grace).
#[derive(Debug)]
pub(super) struct Recognising {
    pub(super) record: VmInspect,
    pub(super) vm: VmId,
    /// Finding nothing waits for the grace: the host's hibernate history
    /// waits for the stack's witness, and a CH+`windows` pod not watched
    /// without a gap since it was new for a `Woken` event.
    pub(super) grace: bool,
    /// The host's hibernate history says "a wake or a recreate" (rule 3):
    /// the stack's witness makes it a wake, none within the grace a
    /// recreate.
    pub(super) history: bool,
    /// The pod has no work unless the VM is a wake (`mode=run`): nothing
    /// but a witness may make it one.
    pub(super) not_cloned: bool,
    /// A listing of the events answered, at least once.
    pub(super) listed: bool,
    /// A listing was cut short: the stack's own event may be hidden.
    pub(super) truncated: bool,
    /// The grace's end on the task's clock.
    pub(super) until: Duration,
}

impl PodTask {
    /// The VM is the pod's: recognise a wake (spec section 2), then
    /// classify it.
    pub(super) fn bound(&mut self, record: VmInspect) -> Action {
        let vm = match crate::decision::vm_id(&observe(&self.seen, &record, &Overrides::default()))
        {
            Ok(vm) => vm,
            Err(_) if self.deferred.is_some() => {
                return self.leave(self.deferred.expect("checked"));
            }
            Err(source) => {
                let pod = self.summary.pod.clone();
                return self.node_error(NodeError::BadRecord { pod, source });
            }
        };
        // A `post-clone-state` the host wrote for an earlier VM of the pod
        // does not apply to this one.
        if let Some(memory) = &self.memory
            && !memory.record.marker_applies(&vm)
            && self
                .seen
                .annotations
                .remove(keys::POST_CLONE_STATE)
                .is_some()
        {
            self.foreign_marker = true;
            self.note(Note::Warn(format!(
                "the pod's {} was written for an earlier VM of the pod: not taken for {vm}",
                keys::POST_CLONE_STATE
            )));
        }
        // A `failed` marker of this VM parks the pod, as the annotations
        // said.
        if self.deferred == Some(Row::Parked) && !self.foreign_marker {
            self.republish_failed(&vm);
            return self.leave(Row::Parked);
        }
        // Spec section 7: a marker that vanished from this VM was removed
        // by someone (a failed hibernate removes it, and upstream then
        // lifts the pod back to `creating` on the same VM). The host's
        // record says what it was, and whether this VM's hibernation
        // failed; either only ever takes work away.
        if let Some(memory) = &self.memory
            && PostCloneState::parse(self.seen.annotation(keys::POST_CLONE_STATE)).is_none()
        {
            let record = &memory.record;
            self.lifted = record.lifted(&vm);
            self.remembered = record.marker_for(&vm).and_then(PostCloneState::parse);
            if self.lifted {
                self.note(Note::Warn(format!(
                    "the host saw the hibernation of {vm} fail and the pod lifted back to creating on the same VM: nothing is owed in its guest, at most the IP wait"
                )));
            } else if let Some(state) = self.remembered {
                self.note(Note::Warn(format!(
                    "the pod's {} was removed while its VM stayed {vm}: taken as {}, the last the host saw or wrote",
                    keys::POST_CLONE_STATE,
                    state.as_str()
                )));
            }
        }
        // Rule 1, then the verdict already reached for this VM, then the
        // host's history and the stack's events.
        if self.wake {
            return self.recognised(record, vm, Evidence::Annotation);
        }
        // A pod not cloned by its annotations has no work unless the VM is
        // a wake. Events are user input and may only ever take work away:
        // only the pod's annotation, or the host's own history witnessed
        // by the stack, makes such a pod's VM a wake.
        let not_cloned = self.deferred == Some(Row::Nothing(HandsOff::NotCloned));
        // The embedder's own word on how it booted the VM, fresher than
        // any verdict kept for it.
        if !not_cloned && let Some(by) = self.knows.boot.and_then(Told::evidence) {
            let history = self
                .memory
                .as_ref()
                .is_some_and(|memory| memory.record.history_says_wake(&vm));
            if history && !by.says_wake() {
                self.note(Note::Warn(format!(
                    "the embedder says it made {vm} anew, though the host saw the pod hibernate before it: taken at its word (a clone)"
                )));
            }
            return self.recognised(record, vm, by);
        }
        let (stored, history) = match &self.memory {
            Some(memory) => (
                memory.record.verdict_for(&vm).map(|verdict| verdict.by),
                memory.record.history_says_wake(&vm),
            ),
            None => (None, false),
        };
        match stored {
            // Events alone never gave work to a pod without it.
            Some(Evidence::Woken | Evidence::Events) if not_cloned => {}
            Some(by) if by.says_wake() => return self.recognised(record, vm, by),
            // A recreate was decided with the history known.
            Some(Evidence::Recreate) => return self.recognised(record, vm, Evidence::Recreate),
            // A verdict of no wake gives way to history noted since.
            Some(by) if !history => return self.recognised(record, vm, by),
            _ => {}
        }
        if not_cloned && !history {
            return self.leave(Row::Nothing(HandsOff::NotCloned));
        }
        // The host already knew this VM as the pod's (a marker of it, or
        // its failed hibernation): it is no new VM, so no wake.
        if (self.lifted || self.remembered.is_some()) && !history {
            return self.recognised(record, vm, Evidence::NoEvidence);
        }
        // Rule 2 needs the stack's events. History waits a grace for the
        // stack's witness (without one it is a recreate), and so does a
        // CH+`windows` pod the host has not watched since it was new (a
        // `Woken` may still come), from the first sight of this VM (kept
        // across restarts).
        let now = self.now;
        let grace = self.settings.wake.grace;
        let windows_ch = {
            let obs = observe(&self.seen, &record, &Overrides::default());
            obs.backend == Backend::CloudHypervisor
                && obs.backend_exact
                && obs.os == GuestOs::Windows
        };
        let (watched, until) = match &mut self.memory {
            Some(memory) => {
                let wall = memory.wall(now);
                let (seen, changed) = memory.record.first_seen(&vm, wall);
                let until_wall =
                    seen.saturating_add(u64::try_from(grace.as_millis()).unwrap_or(u64::MAX));
                // Never past a whole grace from now (a clock stepped back).
                let until = now + Duration::from_millis(until_wall.saturating_sub(wall)).min(grace);
                let watched = memory.record.watched_since_new();
                if changed {
                    self.keep_record();
                }
                (watched, until)
            }
            None => (false, now + grace),
        };
        // Events are judged by the record's `created_at`: without it an
        // old event would count.
        if self.knows.record_lacks.contains(&RecordFact::CreatedAt) {
            let pod = self.label();
            return self.stop(Stop::MissingFact {
                pod,
                fact: RecordFact::CreatedAt,
                why: "a stack event counts as evidence of a hibernate wake only near the VM's creation",
                hint: "give the record's created_at, or say how the VM was booted (create, fork, wake, wake in place); after the embedder's own restart, the verdict reached before is in the pod's kept record, so keep the records across restarts",
            });
        }
        // An embedder resuming after its own restart expects no `Woken`
        // still to come for a pod it watched; the history's grace for the
        // stack's witness stays (without one the VM is a recreate).
        let resumed = self.knows.boot == Some(Told::Resume);
        self.stage = Stage::Recognising(Box::new(Recognising {
            record,
            vm,
            grace: history || (windows_ch && !watched && !resumed),
            history,
            not_cloned,
            listed: false,
            truncated: false,
            until,
        }));
        self.wake_events()
    }

    /// List the stack's wake events about the pod: exactly those that can
    /// count (spec section 2), so that no other event can fill the listing.
    pub(super) fn wake_events(&self) -> Action {
        Action::WakeEvents {
            field_selectors: crate::memory::field_selectors(
                &self.pod.uid,
                &self.settings.wake.reporters,
            ),
        }
    }

    /// The stack's events about the pod came back (spec section 2, rule 2
    /// and the grace).
    pub(super) fn events(
        &mut self,
        mut wait: Recognising,
        answer: Result<Listed, String>,
    ) -> Action {
        let wake = self.settings.wake.clone();
        match answer {
            Ok(listed) => {
                wait.listed = true;
                wait.truncated |= listed.truncated;
                let witness = Witness {
                    pod_uid: &self.pod.uid,
                    reporters: &wake.reporters,
                    vm_created_unix_ms: wait.record.created_unix_ms,
                    window: wake.event_window,
                    now_unix_ms: self.wall_now(),
                };
                // With history, the stack's witness of either kind makes
                // the VM a wake in place (the pod kept its uid).
                if wait.history && witness.says_wake(&listed.events) {
                    return self.after_grace(wait, Evidence::History);
                }
                if witness.woken(&listed.events) {
                    return self.after_grace(wait, Evidence::Woken);
                }
                if witness.says_wake(&listed.events) {
                    return self.after_grace(wait, Evidence::Events);
                }
                if witness.now_unix_ms.is_none()
                    && !listed.events.is_empty()
                    && !std::mem::replace(&mut self.events_warned, true)
                {
                    self.note(Note::Warn(
                        "the host gave the decision no wall clock: no event of the stack can count as evidence of a wake".to_owned(),
                    ));
                }
            }
            Err(e) => {
                if !std::mem::replace(&mut self.events_warned, true) {
                    self.note(Note::Warn(format!(
                        "cannot list the pod's events to recognise a hibernate wake: {}; the VM is taken for a wake only by the pod's annotation or, for a pod with work, by the host's history (check `list` on events.k8s.io events in the host's RBAC)",
                        one_line(&e)
                    )));
                }
            }
        }
        // A cut listing will not show more by waiting.
        if wait.grace && self.now < wait.until && !wait.truncated {
            let until = (self.now + wake.poll).min(wait.until);
            // The grace does not hold a turn among the pods worked on at
            // once.
            self.release();
            self.stage = Stage::RecognisingSleep(Box::new(wait));
            return Action::Sleep { until };
        }
        // No witness. Where the stack's events could not be read, or a
        // listing was cut short, one may be hidden: for a pod with work
        // anyway the VM is then taken for the wake its history, or the
        // cut listing, suggests (a wake runs less in it, never more); a
        // pod with no work gets none, and nothing is kept, so that a later
        // task reads the events again.
        let blind = !wait.listed || wait.truncated;
        if wait.history && blind {
            if wait.not_cloned {
                return self.leave(Row::Nothing(HandsOff::NotCloned));
            }
            self.note(Note::Warn(format!(
                "the host's history says the pod's VM {} was woken or recreated, and the stack's events {}: taken for a wake, which runs less in it",
                wait.vm,
                if wait.listed { "were more than the host reads" } else { "could not be read" }
            )));
            return self.after_grace(wait, Evidence::History);
        }
        if wait.truncated && !wait.not_cloned {
            self.note(Note::Warn(format!(
                "more of the stack's wake events about the pod matched than the host reads (forged?): taken for a wake of {}, which runs less in it",
                wait.vm
            )));
            return self.after_grace(wait, Evidence::Events);
        }
        let by = match (wait.history, wait.grace) {
            (true, _) => {
                self.note(Note::Warn(format!(
                    "the host's history says the pod's VM {} was woken or recreated, and no witness of the stack came within the grace: a recreate, handled as a clone",
                    wait.vm
                )));
                Evidence::Recreate
            }
            (false, true) => Evidence::Grace,
            (false, false) => Evidence::NoEvidence,
        };
        self.after_grace(wait, by)
    }

    /// The events gave the verdict: take the turn again when the grace gave
    /// it back, then go on.
    pub(super) fn after_grace(&mut self, wait: Recognising, by: Evidence) -> Action {
        if !self.holds_turn {
            self.stage = Stage::Readmitting(Box::new((wait.record, wait.vm, by)));
            self.holds_turn = true;
            return Action::Admit;
        }
        self.recognised(wait.record, wait.vm, by)
    }

    /// The wake verdict for the VM is reached: keep it, then classify.
    pub(super) fn recognised(&mut self, record: VmInspect, vm: VmId, by: Evidence) -> Action {
        self.wake = by.says_wake();
        self.in_place = by.in_place();
        if let Some(memory) = &mut self.memory
            && memory.record.set_verdict(&vm, by)
        {
            self.keep_record();
        }
        self.classified(record, vm)
    }

    /// An embedder that owns the lifecycle, whose pod shows the `failed`
    /// marker this host wrote for this VM (its record says so) while the
    /// state is still empty or `creating` in the same generation, never
    /// published the failed state (its publish failed, or it lost it):
    /// hand it over again, from the error chain the pod keeps. A state the
    /// embedder moved on to a new generation is its own, and stays.
    pub(super) fn republish_failed(&mut self, vm: &VmId) {
        let ours = self.memory.as_ref().is_some_and(|memory| {
            memory.record.marker_vm() == Some(vm.as_str())
                && memory.record.marker_for(vm) == Some(PostCloneState::Failed.as_str())
        });
        if !self.settings.lifecycle_intents || !ours {
            return;
        }
        let annotations = &self.seen.annotations;
        let observed = annotations.get(keys::LIFECYCLE_OBSERVED_GENERATION);
        if observed.is_some() && observed != annotations.get(keys::GENERATION) {
            return;
        }
        let message = match annotations.get(keys::POST_CLONE_ERRORS) {
            Some(errors) if !errors.is_empty() => errors.clone(),
            _ => format!(
                "the post-clone fixup failed ({} failed)",
                keys::POST_CLONE_STATE
            ),
        };
        if let Some(patch) = lifecycle::transition(annotations, Lifecycle::Failed, &message)
            && let (_, Some(intent)) = LifecycleIntent::split(patch)
        {
            let intent = intent.at(Some(&self.seen));
            self.queue.push_back(Action::Publish(intent));
        }
    }

    /// The stop for a normal Linux clone whose image kind only the
    /// record's `config.image` can tell (no source image given, and on
    /// Firecracker no overlay on disk shows a cloudimg guest) when the
    /// embedder's record lacks it. On Cloud Hypervisor the overlay probe
    /// tells, as for every host.
    pub(super) fn image_unknown(&self, obs: &Observation) -> Option<Stop> {
        let lacks = self.knows.record_lacks.contains(&RecordFact::Image);
        let probe_tells = obs.backend == Backend::CloudHypervisor && obs.backend_exact;
        (lacks
            && obs.source_image.is_none()
            && obs.boot == Some(BootKind::Clone)
            && crate::facts::clone_from_dir(&obs.annotations).is_none()
            && obs.os != GuestOs::Windows
            && !probe_tells)
            .then(|| Stop::MissingFact {
                pod: self.label(),
                fact: RecordFact::Image,
                why: "it tells a cloudimg guest from an OCI one, and on this backend no file on disk does",
                hint: "give the record's config.image, or the snapshot's source image",
            })
    }
}
