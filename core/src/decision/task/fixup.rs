//! The fixup loop (spec section 5): the plan for the classified VM, each
//! attempt under the retry budget, and how the loop ends.

use super::{
    Action, AfterSac, Attempts, BootKind, ComposedPlan, Duration, Event, ExecOutput, ExecPurpose,
    ExitStatusKind, FixupEnd, GuestOs, Handled, ImageKind, Ipv4Addr, NodeError, Note, Observation,
    Overrides, Plan, PlanRequest, PlannerError, PodInput, PodTask, PostCloneState, Readiness, Row,
    SacNic, SacPass, Scenario, Stage, TERMINATION_GRACE, TERMINATION_SIGNALS, Told, Trigger,
    VmFacts, VmId, VmInspect, Wait, WaitFacts, WaitNic, Write, check_hint_room, classify, keys,
    lifecycle, messages, observe, reasons, sac_nics, state_patch, static_nics,
};

/// The fixup loop's state (spec section 5).
#[derive(Debug)]
pub(super) struct Fixup {
    /// The VM, the plan and its attempts ([`Attempts`]).
    pub(super) run: Attempts,
    pub(super) scenario: Scenario,
    /// What the IP wait after success reads.
    pub(super) wait: WaitFacts,
    pub(super) script: String,
    /// The first NIC's static address: the IP and `ready` go with `done`
    /// (not when a serial-console pass comes first).
    pub(super) ready_ip: Option<Ipv4Addr>,
    /// The NICs of a Windows VM with a static one: the serial-console pass
    /// of spec section 10 follows `done` (`None`: no pass).
    pub(super) sac: Option<Vec<SacNic>>,
    /// The read the next decision is made from: the `running` write's
    /// answer for the first attempt, the read before each later one.
    pub(super) fresh: Option<PodInput>,
    /// The read before the attempt under way (`None` when the read failed).
    pub(super) seen: Option<PodInput>,
}

impl Fixup {
    /// A loop that has not started: no attempt, no deadline yet (it is set
    /// when `running` is written).
    pub(super) fn new(
        vm: VmId,
        scenario: Scenario,
        wait: WaitFacts,
        plan: Plan,
        exec: Vec<String>,
        script: String,
        ready_ip: Option<Ipv4Addr>,
    ) -> Box<Fixup> {
        Box::new(Fixup {
            run: Attempts::new(vm, plan, exec),
            scenario,
            wait,
            script,
            ready_ip,
            sac: None,
            fresh: None,
            seen: None,
        })
    }
}

impl PodTask {
    /// The VM is the pod's and its wake verdict reached: classify it and
    /// go on by the table.
    pub(super) fn classified(&mut self, record: VmInspect, vm: VmId) -> Action {
        let overrides = Overrides {
            boot: if self.wake {
                Some(BootKind::Wake)
            } else {
                self.knows.boot.and_then(Told::boot)
            },
            source_image: self.knows.source_image.clone(),
        };
        let obs = observe(&self.seen, &record, &overrides);
        if self.keep_observed {
            self.observed = Some(Box::new(obs.clone()));
        }
        if let Some(stop) = self.image_unknown(&obs) {
            return self.stop(stop);
        }
        let decision = classify::classify(&obs);
        self.summary.rule = decision.rule.number();
        let row = lifecycle::decide_knowing(&self.seen, decision.needs_fixup(), self.known());
        if self.trigger == Trigger::Startup
            && let Some(op) = row.op()
        {
            self.note(Note::Resumed(op));
            self.tell(Event::normal(
                reasons::RESUMED_AFTER_RESTART,
                messages::resumed(op),
            ));
        }
        match row {
            Row::Nothing(_) | Row::Parked => self.leave(row),
            Row::RunLoop => {
                self.summary.action = Handled::Fixup;
                self.stage = Stage::PlanningFixup {
                    obs: Box::new(obs.clone()),
                    vm,
                };
                Action::Plan(Box::new(PlanRequest::Fixup(obs)))
            }
            Row::IpWaitOnly => {
                self.summary.action = Handled::IpWait;
                let facts = match WaitFacts::validate(&obs) {
                    Ok(facts) => facts,
                    Err(e) => return self.plan_failed(vm, &PlannerError::Facts(e)),
                };
                let wait = Box::new(Wait {
                    facts,
                    recovery: None,
                    start: Duration::ZERO,
                    deadline: Duration::ZERO,
                    ip: None,
                    nonce: None,
                    claimable: matches!(obs.boot, Some(BootKind::Clone | BootKind::Fork)),
                });
                // A Windows VM with a static NIC gets its addresses over
                // the serial console before the wait (spec section 10);
                // not a lifted hibernate's, whose addresses were set before
                // (spec section 7: nothing is owed in its guest).
                if obs.os == GuestOs::Windows && !self.lifted {
                    match static_nics(&obs) {
                        Ok(nics) => {
                            if let Some(nics) = sac_nics(&nics) {
                                return self.sac_start(SacPass {
                                    vm,
                                    nics,
                                    nets: None,
                                    next: 0,
                                    then: AfterSac::Wait(wait),
                                    until: Duration::ZERO,
                                });
                            }
                        }
                        Err(e) => return self.plan_failed(vm, &PlannerError::Facts(e)),
                    }
                }
                // An IP wait may take minutes: it does not hold a turn.
                self.release();
                // The DHCP safety net: a Linux clone that needed no fixup
                // (not a lifted hibernate's VM, which was no clone).
                if decision.dhcp_recovery(obs.os)
                    && !self.lifted
                    && self.settings.ready.dhcp_recovery
                {
                    match VmFacts::validate(&obs, ImageKind::Unknown) {
                        Ok(facts) => {
                            self.stage = Stage::PlanningRecovery(wait);
                            return Action::Plan(Box::new(PlanRequest::Recovery(facts)));
                        }
                        // A clone whose facts do not validate for a plan
                        // simply waits without it.
                        Err(e) => self.note(Note::Warn(format!("no DHCP recovery plan: {e}"))),
                    }
                }
                self.wait(wait)
            }
        }
    }

    /// The fixup's plan came back.
    pub(super) fn planned(
        &mut self,
        obs: Observation,
        vm: VmId,
        result: Result<crate::planner::PlanOutcome, PlannerError>,
    ) -> Action {
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(e) => return self.plan_error(vm, e),
        };
        let scenario = outcome.scenario.unwrap_or(Scenario::OciNetworkd);
        self.summary.scenario = Some(scenario);
        let Some(composed) = outcome.composed else {
            // The planner found no fixup where classification found one:
            // the host's fault, never the pod's.
            let pod = self.summary.pod.clone();
            return self.node_error(NodeError::NoPlan { pod });
        };
        self.fallback_events(&composed);
        // The hint is written only after the budget is spent, and only if
        // it fits then; say now that it would not.
        if let Err(e) = check_hint_room(&obs.annotations, &composed.hint, &composed.plugins()) {
            self.note(Note::Warn(format!("the hint may not be stored: {e}")));
        }
        let ComposedPlan {
            facts,
            plan,
            exec,
            script,
            ..
        } = composed;
        let wait = WaitFacts::from_facts(&facts);
        let sac = if facts.os == GuestOs::Windows {
            let statics: Vec<_> = facts.nics.iter().map(|n| n.static_ipv4).collect();
            sac_nics(&statics)
        } else {
            None
        };
        // The address is published only once the guest has it: after the
        // serial-console pass when one is owed.
        let ready_ip = match wait.first {
            Some(WaitNic::Static(ip)) if sac.is_none() => Some(ip),
            _ => None,
        };
        let mut fixup = Fixup::new(vm, scenario, wait, plan, exec, script, ready_ip);
        fixup.sac = sac;
        self.stage = Stage::BeforeRunning(fixup);
        Action::Checkpoint
    }

    /// Each plugin of the plan that failed and was replaced by the
    /// built-in (failure policy `fallback`): a Warning event naming both.
    pub(super) fn fallback_events(&mut self, composed: &ComposedPlan) {
        for part in &composed.parts {
            if let Some(fallback) = &part.fallback {
                let message = fallback.message(part.selection.scenario, &part.selection.plugin);
                self.tell(Event::warning(reasons::PLUGIN_FALLBACK, message));
            }
        }
    }

    /// A plan could not be made: a node error (the pod waits) or a plan
    /// failure (the pod is failed).
    pub(super) fn plan_error(&mut self, vm: VmId, error: PlannerError) -> Action {
        if !crate::decision::is_node_error(&error) {
            return self.plan_failed(vm, &error);
        }
        let error = crate::decision::node_error(self.summary.pod.clone(), error);
        self.node_error(error)
    }

    /// No plan could be made (bad facts, no plugin, a plugin failure): a
    /// retry cannot help, so the pod is marked failed like an exhausted
    /// fixup, without a hint, after reading it once more.
    pub(super) fn plan_failed(&mut self, vm: VmId, error: &dyn std::error::Error) -> Action {
        self.summary.fixup = Some(FixupEnd::PlanFailed);
        let line = messages::plan_failed(&error.to_string());
        self.summary.errors = vec![line.clone()];
        self.note(Note::PlanFailed { line: line.clone() });
        self.stage = Stage::ReadingFor(Write::PlanFailed { vm, line });
        Action::Read
    }

    /// The fixup ended done: in the summary, and noted once (the pass of
    /// spec section 10 may come between `done` and the success event).
    pub(super) fn fixup_done(&mut self, fixup: &Fixup) {
        if self.summary.fixup == Some(FixupEnd::Done) {
            return;
        }
        self.summary.fixup = Some(FixupEnd::Done);
        self.summary.attempts = fixup.run.count;
        self.note(Note::Fixup {
            scenario: fixup.scenario,
            end: FixupEnd::Done,
            attempts: fixup.run.count,
        });
    }

    pub(super) fn fixup_over(&mut self, fixup: &Fixup, end: FixupEnd) -> Action {
        self.summary.fixup = Some(end);
        self.summary.attempts = fixup.run.count;
        if matches!(end, FixupEnd::Done | FixupEnd::Exhausted) {
            self.note(Note::Fixup {
                scenario: fixup.scenario,
                end,
                attempts: fixup.run.count,
            });
        }
        self.finish()
    }

    /// The loop's retry budget, as `running` lands (spec section 5:
    /// attempts stop a budget after the first). A host that keeps a record
    /// of the pod keeps the budget there: when the pod shows the loop under
    /// way (`running`, as read for the write) and the record holds this
    /// VM's budget, the loop goes on with its first attempt's time, its
    /// attempts and its error chain, so neither a task retried after a
    /// failed write nor a restart of the host gets a fresh budget; any
    /// other loop starts a new one. Without a record, the budget starts
    /// now.
    pub(super) fn start_budget(&mut self, fixup: &mut Fixup, from: &PodInput) {
        let budget = self.settings.retry.budget;
        let now = self.now;
        let Some(memory) = &mut self.memory else {
            fixup.run.deadline = now + budget;
            return;
        };
        let wall = memory.wall(now);
        // A budget runs from the first attempt: one kept with no attempt
        // made (the host stopped between `running` and the first exec)
        // starts again now. A `running` removed from the same VM, that the
        // record remembers (spec section 7), is the loop under way too.
        let shown = PostCloneState::parse(from.annotation(keys::POST_CLONE_STATE));
        let resumed = shown.or(self.remembered) == Some(PostCloneState::Running)
            && memory
                .record
                .budget_for(&fixup.run.vm)
                .is_some_and(|b| b.attempts() > 0);
        if !resumed {
            memory.record.end_budget();
        }
        let kept = memory.record.start_or_resume(&fixup.run.vm, wall);
        fixup.run.count = kept.attempts();
        fixup.run.errors = kept.errors().to_vec();
        let remaining = kept.remaining(wall, budget);
        fixup.run.deadline = now + remaining;
        // Spec section 8: a resumed loop whose budget ran out while the
        // host was away (a reboot, an upgrade), or has less left than one
        // retry interval, still gets one real attempt, with a whole exec
        // timeout; once per loop, so that a crash loop cannot retry
        // forever.
        if resumed && remaining < self.settings.retry.interval && kept.reprieve() {
            fixup.run.last_chance = true;
            fixup.run.deadline = now + self.settings.retry.exec_timeout.min(budget);
            self.note(Note::Warn(format!(
                "the fixup's budget of {} ran out, or nearly, while the host was away: one more attempt with a whole exec timeout, the last",
                messages::span(budget)
            )));
        }
        self.keep_record();
    }

    /// The loop is over: an attempt succeeded, or the failure record
    /// landed. Its budget is forgotten, so a loop started again later
    /// gets a whole one. A loop stopped otherwise (a shutdown, the pod no
    /// longer the host's, a write that failed) keeps it: only a loop
    /// resumed on the same VM with `running` on the pod takes it up.
    pub(super) fn end_budget(&mut self) {
        if self
            .memory
            .as_mut()
            .is_some_and(|memory| memory.record.end_budget())
        {
            self.keep_record();
        }
    }

    /// A `post-clone-state` = `state` for `vm` landed on the pod: the
    /// record keeps which VM the marker is for (spec section 2) and what
    /// it said (spec section 7).
    pub(super) fn marked(&mut self, vm: &VmId, state: &str) {
        if let Some(memory) = &mut self.memory
            && memory.record.set_marker(vm, state)
        {
            self.keep_record();
        }
    }

    /// Hand the record, as it is now, to the host to keep.
    pub(super) fn keep_record(&mut self) {
        if let Some(memory) = &mut self.memory {
            memory.record.revise();
            let record = Box::new(memory.record.clone());
            self.queue.push_back(Action::Remember(record));
        }
    }

    /// The top of the loop: a shutdown check, then the check of the pod.
    pub(super) fn loop_top(&mut self, fixup: Box<Fixup>) -> Action {
        self.stage = Stage::LoopCheckpoint(fixup);
        Action::Checkpoint
    }

    /// One attempt, when the pod is still ours ([`Attempts::begin`]).
    pub(super) fn attempt(
        &mut self,
        mut fixup: Box<Fixup>,
        ours: bool,
        seen: Option<PodInput>,
    ) -> Action {
        if !ours {
            return self.fixup_over(&fixup, FixupEnd::Gone);
        }
        // The budget may have run out while the last failure was told.
        if fixup.run.spent(self.now) {
            return self.exhaust(fixup);
        }
        fixup.seen = seen;
        let exec_timeout = self.settings.retry.exec_timeout;
        match fixup
            .run
            .begin(self.now, exec_timeout, &mut self.nonces, ExecPurpose::Fixup)
        {
            Ok(exec) => {
                self.stage = Stage::Attempting(fixup);
                exec
            }
            // No nonce, no exec: the attempt fails with the reason.
            Err(error) => self.attempt_failed(fixup, error),
        }
    }

    pub(super) fn attempted(
        &mut self,
        mut fixup: Box<Fixup>,
        result: Result<ExecOutput, String>,
    ) -> Action {
        let terminated = matches!(
            &result,
            Ok(out) if matches!(out.status, ExitStatusKind::Signal(s) if TERMINATION_SIGNALS.contains(&s))
        );
        match fixup.run.verdict(result) {
            Ok(()) => {
                // The fixup took: a `done` write that fails is tried again
                // with the loop, which runs it once more on a whole budget.
                self.end_budget();
                let seen = fixup.seen.take();
                match seen {
                    Some(current) => self.write_from(Write::Done(fixup), current, 1),
                    None => self.done_alone(fixup),
                }
            }
            // A service stop signals the whole service, the exec's
            // `cocoon` with the host: the host may hear of it a moment
            // after the exec ended. A shutdown in that moment leaves the
            // work `running`, as one during the exec does.
            Err(error) if terminated => {
                let until = (self.now + TERMINATION_GRACE).min(fixup.run.deadline.max(self.now));
                self.stage = Stage::Terminated(fixup, error);
                Action::Sleep { until }
            }
            Err(error) => self.attempt_failed(fixup, error),
        }
    }

    /// An attempt failed: its line joins the error chain and is told; the
    /// next attempt comes after the interval, unless that is past the
    /// budget.
    pub(super) fn attempt_failed(&mut self, mut fixup: Box<Fixup>, error: String) -> Action {
        let line = fixup.run.failure_line(&error);
        self.note(Note::Warn(line.clone()));
        self.tell(Event::warning(reasons::EXEC_ATTEMPT_FAILED, line.clone()));
        if let Some(memory) = &mut self.memory {
            let wall = memory.wall(self.now);
            memory
                .record
                .start_or_resume(&fixup.run.vm, wall)
                .add_attempt(&line);
            self.keep_record();
        }
        match fixup
            .run
            .failed(line, self.now, self.settings.retry.interval)
        {
            Some(until) => {
                self.stage = Stage::Sleeping(fixup);
                Action::Sleep { until }
            }
            None => self.exhaust(fixup),
        }
    }

    /// Upstream's op of the work, in the messages of a failure
    /// (`<op>: <error>`): work the host took up where it had left it (a
    /// marker of its own on the pod) is `reconcile`, whatever brought the
    /// pod to it; an in-place wake is `update`; a pod's first VM (a restore
    /// by `restore-from-hibernate` included) is `create`.
    pub(super) fn op(&self) -> &'static str {
        let resumed = matches!(
            PostCloneState::parse(self.seen.annotation(keys::POST_CLONE_STATE)),
            Some(PostCloneState::Running | PostCloneState::Done)
        );
        if resumed {
            "reconcile"
        } else if self.in_place {
            "update"
        } else {
            "create"
        }
    }

    /// The budget is spent: the failure record, decided from a read. A
    /// loop resumed later (the write failed) gets no attempt past the
    /// budget: it only writes the record.
    pub(super) fn exhaust(&mut self, fixup: Box<Fixup>) -> Action {
        if let Some(memory) = &mut self.memory
            && memory
                .record
                .budget_mut_for(&fixup.run.vm)
                .is_some_and(crate::memory::Budget::reprieve)
        {
            self.keep_record();
        }
        let summary = messages::exhausted(self.op(), &fixup.run.errors);
        self.stage = Stage::ReadingFor(Write::Exhausted { fixup, summary });
        Action::Read
    }

    /// `done` with nothing to decide it from: any state of the pod takes
    /// it (the uid still guards it).
    pub(super) fn done_alone(&mut self, fixup: Box<Fixup>) -> Action {
        self.stage = Stage::DoneAlone(fixup);
        Action::Patch {
            patch: state_patch(PostCloneState::Done),
            unless_changed_from: None,
        }
    }

    /// `done` is written: `PostCloneSucceeded`, then the IP wait, unless
    /// `ready` says how it ended already (a static first NIC: the IP and
    /// `ready` went with `done`).
    pub(super) fn succeeded(
        &mut self,
        fixup: Box<Fixup>,
        ready: Option<(Readiness, Option<Ipv4Addr>)>,
    ) -> Action {
        self.tell(Event::normal(
            reasons::SUCCEEDED,
            messages::succeeded(fixup.scenario, fixup.run.count),
        ));
        self.fixup_done(&fixup);
        if let Some((readiness, ip)) = ready {
            return self.readiness(readiness, ip);
        }
        let facts = fixup.wait;
        // An IP wait may take minutes: it does not hold a turn.
        self.release();
        let wait = Box::new(Wait {
            facts,
            recovery: None,
            start: Duration::ZERO,
            deadline: Duration::ZERO,
            ip: None,
            nonce: None,
            claimable: false,
        });
        self.wait(wait)
    }
}
