//! [`PodTask`]: the decision for one pod as a state machine. Each
//! `next` takes the report of the last action and the host's clock, and
//! returns the next action; fire-and-forget actions (events, notes,
//! giving the turn back) are queued and handed out first.
//!
//! This module holds the task, its stages and the rows of the table that
//! need only the pod; each idea after that has its own module: binding's
//! result and the wake evidence (`evidence`), the fixup loop (`fixup`),
//! the writes decided from a read (`writes`), the serial-console pass
//! (`sac`) and the IP wait (`wait`). The turn and the binding steps it
//! shares with a preparation are in [`super::skeleton`].

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::Duration;

use super::attempts::{Attempts, NonceSource};
use super::settings::MIN_STEP;
use super::{
    Action, ExecPurpose, FixupEnd, Guarded, Handled, Knows, Lookup, NodeError, Note, PlanRequest,
    Planned, PodError, PodRef, Readiness, RecordFact, Report, SacEnd, Settings, Stop, Summary,
    Told, Trigger, lookup, observe,
};
use crate::annotations::{
    self, AnnotationPatch, Event, check_hint_room, exhausted_record, keys, messages, one_line,
    plan_failed_record, reasons, state_patch,
};
use crate::binding;
use crate::classify::{self, Rule, Scenario};
use crate::exec::{self, ExecOutput, ExitStatusKind};
use crate::facts::{
    Backend, BootKind, GuestOs, ImageKind, Observation, Overrides, PodInput, StaticIpv4, VmFacts,
    VmId, VmInspect, WaitFacts, WaitNic, static_nics,
};
use crate::lifecycle::{self, HandsOff, Lifecycle, LifecycleIntent, PostCloneState, Row};
use crate::memory::{Evidence, Listed, PodMemory, Witness};
use crate::plan::{Nonce, Plan, exec_argv, hint_base64};
use crate::planner::{ComposedPlan, PlannerError};
use fixup_sac::{Nic as SacNic, SacError, StaticNic};

mod evidence;
mod fixup;
mod sac;
mod wait;
mod writes;

use super::skeleton::{Awaiting, Binds, Turns, WrongReport, mismatch_told};
use evidence::Recognising;
use fixup::Fixup;
use sac::{AfterSac, SacPass, sac_nics};
use wait::{Recovery, Wait};
use writes::Write;

/// How many times in a row a write decided from a read is decided again
/// for a pod that changed under it before the task gives up (the work is
/// then tried again later).
pub const DECIDE_ROUNDS: u32 = 5;

/// Signals a service stop sends (SIGHUP, SIGINT, SIGTERM): an exec ended
/// by one waits [`TERMINATION_GRACE`] for the host's own shutdown before
/// its attempt counts as failed.
pub const TERMINATION_SIGNALS: [i32; 3] = [1, 2, 15];

/// How long an exec ended by a termination signal waits for the host's
/// shutdown.
pub const TERMINATION_GRACE: Duration = Duration::from_secs(1);

/// The decision for one pod, from the pod as read to how the work ended.
pub struct PodTask {
    settings: Settings,
    trigger: Trigger,
    pod: PodRef,
    /// The pod as first read: the `running` write is decided from it.
    seen: PodInput,
    summary: Summary,
    stage: Stage,
    queue: VecDeque<Action>,
    nonces: NonceSource,
    /// The host's clock at the last report.
    now: Duration,
    /// The host's record of the pod, when it keeps one
    /// ([`PodTask::remember`]).
    memory: Option<Memory>,
    /// The observation the VM was classified from, when kept
    /// ([`PodTask::observed`]).
    keep_observed: bool,
    observed: Option<Box<Observation>>,
    /// What answers the action handed out last.
    awaiting: Awaiting,
    /// The VM is a hibernate wake (spec section 2): by the pod's
    /// `restore-from-hibernate` until the decision's verdict.
    wake: bool,
    /// The wake happened in place ([`Evidence::in_place`]).
    in_place: bool,
    /// The pod's `post-clone-state` was written for another VM of the pod.
    foreign_marker: bool,
    /// The pod shows no `post-clone-state` for its VM, and the host's
    /// record holds the last one seen or written for it (spec section 7).
    remembered: Option<PostCloneState>,
    /// The pod shows no `post-clone-state`, and the host saw its VM's
    /// hibernation fail: upstream lifted the pod back to `creating` on the
    /// same VM, and nothing is owed in its guest (spec section 7).
    lifted: bool,
    /// The wall clock at the task's start, in milliseconds since the Unix
    /// epoch, when the host gave it ([`PodTask::remember`],
    /// [`PodTask::wall_clock`]): what an event's time is judged by.
    wall_start: Option<u64>,
    /// The row the pod's annotations gave, which only its VM and the
    /// host's record may change ([`lifecycle::provisional`]): the pod is
    /// left alone by it, quietly, unless they do.
    deferred: Option<Row>,
    /// A warning about the stack's events (they cannot be listed, or the
    /// host gave no wall clock to judge them by) was noted in this task:
    /// the grace lists them every second, and one warning is enough.
    events_warned: bool,
    /// The task holds a turn among the pods worked on at once: an `Admit`
    /// was handed out and no `Release` since. A turn is given back once,
    /// however many waits follow ([`release`](Self::release)).
    holds_turn: bool,
    /// What the embedder knows of the VM beyond its record
    /// ([`told`](Self::told)).
    knows: Knows,
}

/// The host's record of the pod, and the wall clock at the task's start.
struct Memory {
    record: PodMemory,
    start_unix_ms: u64,
}

impl Memory {
    /// The wall clock at the task's time `now`, in milliseconds since the
    /// Unix epoch.
    fn wall(&self, now: Duration) -> u64 {
        self.start_unix_ms
            .saturating_add(u64::try_from(now.as_millis()).unwrap_or(u64::MAX))
    }
}
impl Turns for PodTask {
    fn turn_state(&mut self) -> (&mut Awaiting, &mut Duration, &mut VecDeque<Action>) {
        (&mut self.awaiting, &mut self.now, &mut self.queue)
    }

    fn advance_with(&mut self, report: Report) -> Action {
        let stage = std::mem::replace(&mut self.stage, Stage::Over);
        self.advance(stage, report)
    }
}

impl Binds for PodTask {
    fn seen(&self) -> &PodInput {
        &self.seen
    }
    fn settings(&self) -> &super::Settings {
        &self.settings
    }
    fn label(&self) -> String {
        self.summary.pod.clone()
    }
    fn stop(&mut self, stop: Stop) -> Action {
        PodTask::stop(self, stop)
    }
    fn mismatch(&mut self, mismatch: binding::Mismatch) -> Action {
        PodTask::mismatch(self, mismatch)
    }
    fn bound(&mut self, record: VmInspect) -> Action {
        PodTask::bound(self, record)
    }
    fn left_alone(&mut self) -> Option<Action> {
        self.deferred.map(|row| self.leave(row))
    }
    fn await_record(&mut self) {
        self.stage = Stage::Inspecting;
    }
    fn await_other_pods(&mut self, record: VmInspect) {
        self.stage = Stage::Binding(Box::new(record));
    }
}

impl std::fmt::Debug for PodTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodTask")
            .field("pod", &self.pod)
            .field("stage", &self.stage.name())
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
enum Stage {
    Admitting,
    Inspecting,
    /// The record's annotated name waits for the node's other pods.
    Binding(Box<VmInspect>),
    /// The wake verdict waits for the stack's events about the pod.
    Recognising(Box<Recognising>),
    /// The wake grace: the events are listed again after this sleep.
    RecognisingSleep(Box<Recognising>),
    /// The verdict is reached after the grace: the turn again.
    Readmitting(Box<(VmInspect, VmId, Evidence)>),
    PlanningFixup {
        obs: Box<Observation>,
        vm: VmId,
    },
    PlanningRecovery(Box<Wait>),
    /// A read to decide `Write` from.
    ReadingFor(Write),
    /// A write decided from `from`, the `round`th try.
    Writing {
        write: Write,
        from: Box<PodInput>,
        patch: AnnotationPatch,
        /// The change of the lifecycle keys decided with `patch`, handed
        /// to the embedder once `patch` landed.
        intent: Option<LifecycleIntent>,
        round: u32,
    },
    /// `done` alone, without a read to decide from.
    DoneAlone(Box<Fixup>),
    /// Before the `running` write: shutdown?
    BeforeRunning(Box<Fixup>),
    /// Before an attempt: shutdown?
    LoopCheckpoint(Box<Fixup>),
    /// Before an attempt: is the pod still ours?
    LoopRead(Box<Fixup>),
    Attempting(Box<Fixup>),
    /// The attempt's exec was ended by a termination signal: a shutdown
    /// that sent it is waited for before the attempt counts as failed.
    Terminated(Box<Fixup>, String),
    Sleeping(Box<Fixup>),
    /// The IP wait: the lease before the nudge.
    WaitFirst(Box<Wait>),
    /// The IP wait: is the pod still ours before the nudge?
    WaitCheck(Box<Wait>),
    /// The IP wait: shutdown, before the nudge is told and run?
    WaitCheckpoint(Box<Wait>),
    WaitNudge(Box<Wait>),
    /// The IP wait: the lease until the end (or the sleep without a NIC).
    WaitLast(Box<Wait>),
    /// The serial-console pass: is the pod still ours (before the console
    /// is opened, and before each address is set)?
    SacCheck(Box<SacPass>),
    SacOpening(Box<SacPass>),
    SacSetting(Box<SacPass>),
    Over,
}

impl Stage {
    fn name(&self) -> &'static str {
        match self {
            Stage::Admitting => "admitting",
            Stage::Inspecting => "inspecting",
            Stage::Binding(_) => "binding",
            Stage::Recognising(_) | Stage::RecognisingSleep(_) | Stage::Readmitting(_) => {
                "recognising-wake"
            }
            Stage::PlanningFixup { .. } => "planning",
            Stage::PlanningRecovery(_) => "planning-recovery",
            Stage::ReadingFor(_) => "reading",
            Stage::Writing { .. } => "writing",
            Stage::DoneAlone(_) => "writing-done",
            Stage::BeforeRunning(_) => "before-running",
            Stage::LoopCheckpoint(_) | Stage::LoopRead(_) => "before-attempt",
            Stage::Attempting(_) | Stage::Terminated(..) => "attempting",
            Stage::Sleeping(_) => "sleeping",
            Stage::WaitFirst(_)
            | Stage::WaitCheck(_)
            | Stage::WaitCheckpoint(_)
            | Stage::WaitNudge(_)
            | Stage::WaitLast(_) => "ip-wait",
            Stage::SacCheck(_) | Stage::SacOpening(_) | Stage::SacSetting(_) => "sac",
            Stage::Over => "over",
        }
    }
}

/// The error for a write the pod kept changing under: a transient API
/// error, so the work is tried again later.
fn unsettled(pod: &PodRef) -> PodError {
    PodError::Api {
        pod: pod.to_string(),
        reason: format!(
            "the pod changed under each of {DECIDE_ROUNDS} writes in a row; the write is tried again later"
        ),
    }
}

impl PodTask {
    /// The task for `pod` as read, and its first action.
    pub fn start(
        pod: PodInput,
        trigger: Trigger,
        settings: Settings,
        nonces: NonceSource,
    ) -> (PodTask, Action) {
        let label = pod.display_name();
        let uid = pod.uid.clone().filter(|u| !u.is_empty());
        let mut task = PodTask {
            settings,
            trigger,
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
            memory: None,
            keep_observed: false,
            observed: None,
            awaiting: Awaiting::Nothing,
            wake: false,
            in_place: false,
            foreign_marker: false,
            remembered: None,
            lifted: false,
            wall_start: None,
            deferred: None,
            events_warned: false,
            holds_turn: false,
            knows: Knows::default(),
        };
        task.wake = task
            .seen
            .annotation(crate::facts::annotations::RESTORE_FROM_HIBERNATE)
            == "true";
        let first = if uid.is_none() {
            task.stop(Stop::NoUid { pod: label })
        } else {
            match lifecycle::gate(&task.seen) {
                // A row the VM and the host's record may change waits for
                // them: the pod's VM is looked up first.
                Err(row)
                    if lifecycle::provisional(row)
                        && !matches!(lookup(&task.seen), Lookup::NoVm) =>
                {
                    task.deferred = Some(row);
                    Action::Admit
                }
                Err(row) => task.leave(row),
                Ok(_) => Action::Admit,
            }
        };
        task.holds_turn = matches!(first, Action::Admit);
        task.awaiting = Awaiting::of(&first);
        (task, first)
    }

    /// Give the task the host's record of the pod (read when the task
    /// starts; [`PodMemory::new`] when there is none) and the wall clock
    /// then, in milliseconds since the Unix epoch. The fixup loop's retry
    /// budget is kept in it, so the loop stops a budget after its first
    /// attempt across task retries and host restarts (spec section 5);
    /// the task hands out [`Action::Remember`] whenever the record
    /// changes. A host that keeps no record does not call this: each
    /// loop's budget then starts with its task.
    pub fn remember(&mut self, record: PodMemory, start_unix_ms: u64) {
        self.memory = Some(Memory {
            record,
            start_unix_ms,
        });
        self.wall_start = Some(start_unix_ms);
    }

    /// Tell the task what the embedder knows of the pod's VM beyond its
    /// record: how it booted it (evidence of a wake, or of none, that needs
    /// neither the stack's events nor the grace; never over the pod's own
    /// `restore-from-hibernate`, and never for a pod its annotations say
    /// was not cloned), the snapshot's source image, and which facts its
    /// record lacks (the task stops with [`Stop::MissingFact`] rather than
    /// guess one it needs).
    pub fn told(&mut self, knows: Knows) {
        self.knows = knows;
    }

    /// The record about to be reported lacks `lacks` (besides what
    /// [`told`](Self::told) said): an embedder whose record of the VM is
    /// built from its own types says so with each record it reports.
    pub fn record_lacks(&mut self, lacks: &[RecordFact]) {
        for fact in lacks {
            if !self.knows.record_lacks.contains(fact) {
                self.knows.record_lacks.push(*fact);
            }
        }
    }

    /// Give the task the wall clock at its start, in milliseconds since
    /// the Unix epoch, for a host that keeps no record (one that does
    /// gives it with [`remember`](Self::remember)). An event of the stack
    /// counts as evidence of a wake only when its time is no later than
    /// this clock (spec section 2): without it, no event counts.
    pub fn wall_clock(&mut self, start_unix_ms: u64) {
        self.wall_start = Some(start_unix_ms);
    }

    /// The wall clock at the task's time `now`, when the host gave it.
    fn wall_now(&self) -> Option<i64> {
        let start = i64::try_from(self.wall_start?).ok()?;
        Some(start.saturating_add(i64::try_from(self.now.as_millis()).unwrap_or(i64::MAX)))
    }

    /// The pod this task is for.
    pub fn pod(&self) -> &PodRef {
        &self.pod
    }

    /// Keep the observation the task classifies the pod's VM from, for
    /// [`PodTask::observed`] (a host that only carries the task out has no
    /// use for it, and a task does not hold a copy unless asked).
    pub fn keep_observed(&mut self) {
        self.keep_observed = true;
    }

    /// The observation the task classified the pod's VM from, once it
    /// has, when asked to keep it ([`PodTask::keep_observed`]): the record
    /// as bound, with the boot kind the evidence gave it (a wake, work
    /// resumed, what the embedder said). `None` before, and for a pod the
    /// task left alone without looking at its VM. `capture` replays the
    /// task for it, so that a captured case is planned from what the
    /// daemon decides, not from a decision of its own.
    pub fn observed(&self) -> Option<&Observation> {
        self.observed.as_deref()
    }

    /// The summary so far (final once [`Action::Finish`] was returned).
    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    /// The next action, given the report of the last one and the host's
    /// clock (any origin, the same for the whole task).
    ///
    /// # Panics
    ///
    /// When the report does not answer the last action (a host bug; a
    /// host that takes reports from elsewhere uses [`try_next`](Self::try_next)).
    pub fn next(&mut self, report: Report, now: Duration) -> Action {
        self.try_next(report, now).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`next`](Self::next), refusing a report that does not answer the
    /// last action (the task is then unchanged).
    pub fn try_next(&mut self, report: Report, now: Duration) -> Result<Action, WrongReport> {
        self.take_turn(report, now)
    }

    /// Give the turn back, when the task holds one (once: a pass, a grace
    /// and a wait in a row release it once).
    fn release(&mut self) {
        if std::mem::replace(&mut self.holds_turn, false) {
            self.queue.push_back(Action::Release);
        }
    }

    fn tell(&mut self, event: Event) {
        self.queue.push_back(Action::Tell(event));
    }

    fn note(&mut self, note: Note) {
        self.queue.push_back(Action::Note(note));
    }

    fn finish(&mut self) -> Action {
        self.stage = Stage::Over;
        Action::Finish(Ok(self.summary.clone()))
    }

    fn stop(&mut self, stop: Stop) -> Action {
        self.stage = Stage::Over;
        Action::Finish(Err(stop))
    }

    /// A row of the table that leaves the pod alone (or parked).
    fn leave(&mut self, row: Row) -> Action {
        match row {
            Row::Nothing(why) => {
                self.summary.hands_off = Some(why);
                self.summary.rule = match why {
                    HandsOff::NotManaged => Rule::NotManaged.number(),
                    HandsOff::NotCloned => Rule::NotCloned.number(),
                    _ => 0,
                };
            }
            Row::Parked => self.summary.action = Handled::Parked,
            Row::RunLoop | Row::IpWaitOnly => {}
        }
        self.finish()
    }

    fn advance(&mut self, stage: Stage, report: Report) -> Action {
        match (stage, report) {
            (stage, Report::Cancelled) => self.cancelled(stage),
            (Stage::Admitting, Report::Go) => self.look_up(),
            (Stage::Inspecting, Report::Inspected(result)) => self.inspected(result),
            (Stage::Binding(record), Report::OtherPods(answer)) => self.other_pods(*record, answer),
            (Stage::Recognising(wait), Report::Events(answer)) => self.events(*wait, answer),
            (Stage::Readmitting(verdict), Report::Go) => {
                let (record, vm, by) = *verdict;
                self.recognised(record, vm, by)
            }
            (Stage::RecognisingSleep(wait), Report::Go) => {
                self.stage = Stage::Recognising(wait);
                self.wake_events()
            }
            (Stage::PlanningFixup { obs, vm }, Report::Planned(Planned::Fixup(result))) => {
                self.planned(*obs, vm, result)
            }
            (Stage::PlanningRecovery(mut wait), Report::Planned(Planned::Recovery(result))) => {
                match result {
                    Ok(composed) => {
                        self.fallback_events(&composed);
                        // A clone of a parent the claiming plugin prepared
                        // gets its lease by itself: the pass keeps its
                        // 15 s, as a fallback only.
                        let prepared = super::Prepared::parse(self.seen.annotation(keys::PREPARED));
                        let prepared_by = |plugin: &str| {
                            prepared.as_ref().is_some_and(|p| {
                                composed.parts.iter().any(|part| {
                                    let used = &part.selection.plugin;
                                    used.info.name == plugin
                                        && used.info.name == p.plugin
                                        && used.sha256 == p.sha256
                                })
                            })
                        };
                        wait.recovery = Some(Recovery {
                            claimed_by: composed
                                .flavor_claim()
                                .zip(composed.facts.flavor.as_ref())
                                .map(|(plugin, flavor)| {
                                    (plugin.to_owned(), flavor.as_str().to_owned())
                                })
                                .filter(|(plugin, _)| wait.claimable && !prepared_by(plugin)),
                            nics: composed.facts.nics.len(),
                            plan: composed.plan,
                            exec: composed.exec,
                        });
                    }
                    Err(e) => self.note(Note::Warn(format!("no DHCP recovery plan: {e}"))),
                }
                self.wait(wait)
            }
            (Stage::ReadingFor(write), Report::Read(result)) => self.read_for(write, result),
            (
                Stage::Writing {
                    write,
                    from,
                    patch,
                    intent,
                    round,
                },
                Report::Patched(result),
            ) => self.patched(write, *from, &patch, intent, round, result),
            (Stage::DoneAlone(fixup), Report::Patched(result)) => match result {
                Ok(_) => {
                    self.marked(&fixup.run.vm.clone(), PostCloneState::Done.as_str());
                    self.done_written(fixup, None)
                }
                Err(PodError::Gone { .. }) => self.fixup_over(&fixup, FixupEnd::Gone),
                Err(e) => self.stop(Stop::Api(e)),
            },
            (Stage::BeforeRunning(fixup), Report::Go) => {
                let seen = self.seen.clone();
                self.write_from(Write::Running(fixup), seen, 1)
            }
            (Stage::LoopCheckpoint(mut fixup), Report::Go) => match fixup.fresh.take() {
                Some(current) => {
                    let ours = self.still_ours(&current, &fixup.run.vm);
                    self.attempt(fixup, ours, Some(current))
                }
                None => {
                    self.stage = Stage::LoopRead(fixup);
                    Action::Read
                }
            },
            (Stage::LoopRead(fixup), Report::Read(result)) => {
                let (ours, seen) = self.ours_by_read(result, &fixup.run.vm, "an attempt");
                self.attempt(fixup, ours, seen)
            }
            (Stage::Attempting(fixup), Report::Ran(result)) => self.attempted(fixup, result),
            (Stage::Terminated(fixup, error), Report::Go) => self.attempt_failed(fixup, error),
            (Stage::Sleeping(fixup), Report::Go) => self.loop_top(fixup),
            // A file that stayed unusable until the nudge, or the end,
            // says nothing of the lease: nothing is nudged in the guest for
            // it, and the work waits for the node.
            (Stage::WaitFirst(_) | Stage::WaitLast(_), Report::Lease(Err(message))) => {
                let pod = self.summary.pod.clone();
                self.node_error(NodeError::Lease { pod, message })
            }
            (Stage::WaitFirst(wait), Report::Lease(Ok(found))) => match found {
                Some(ip) => self.wait_over(wait, Some(ip)),
                None => {
                    self.stage = Stage::WaitCheck(wait);
                    Action::Read
                }
            },
            (Stage::WaitCheck(wait), Report::Read(result)) => {
                let (ours, _) = self.ours_by_read(result, &wait.facts.id, "an attempt");
                if ours {
                    // A shutdown during the read: nothing is told or run.
                    self.stage = Stage::WaitCheckpoint(wait);
                    Action::Checkpoint
                } else {
                    // Nothing runs in a guest the stack has taken over
                    // meanwhile; the final read then skips the write.
                    self.wait_over(wait, None)
                }
            }
            (Stage::WaitCheckpoint(wait), Report::Go) => self.nudge(wait),
            (Stage::WaitNudge(mut wait), Report::Ran(result)) => {
                let failed = match (&wait.recovery, wait.nonce.take()) {
                    (Some(recovery), Some(nonce)) => match result {
                        Ok(out) => exec::verdict(&recovery.plan, &nonce, &out).err(),
                        Err(e) => Some(one_line(&e)),
                    }
                    .map(|e| format!("DHCP recovery pass failed: {e}")),
                    _ => match result {
                        Ok(out) if out.success() => None,
                        Ok(out) => Some(format!(
                            "{}: {}",
                            out.status,
                            one_line(&String::from_utf8_lossy(&out.stderr))
                        )),
                        Err(e) => Some(e),
                    }
                    .map(|e| format!("ipconfig /renew nudge failed: {e}")),
                };
                if let Some(line) = failed {
                    self.note(Note::Warn(line));
                }
                self.wait_last(wait)
            }
            (Stage::WaitLast(wait), Report::Lease(Ok(found))) => self.wait_over(wait, found),
            (Stage::SacCheck(pass), Report::Read(result)) => {
                let (ours, _) = self.ours_by_read(result, &pass.vm, "the serial-console pass");
                if ours {
                    self.sac_step(pass)
                } else {
                    self.sac_over(pass.then, SacEnd::Gone)
                }
            }
            (Stage::SacOpening(mut pass), Report::SacOpened(result)) => match result {
                Ok(nets) => {
                    pass.nets = Some(nets);
                    self.sac_next(pass)
                }
                Err(error) => self.sac_error(*pass, error),
            },
            (Stage::SacSetting(mut pass), Report::SacSet(result)) => match result {
                Ok(()) => {
                    pass.next += 1;
                    self.sac_next(pass)
                }
                Err(error) => self.sac_error(*pass, error),
            },
            (Stage::WaitLast(wait), Report::Go) => self.wait_over(wait, None),
            (stage, report) => panic!(
                "a host answered {report:?} in stage {}: carry out the action the task returned",
                stage.name()
            ),
        }
    }

    /// Shutdown interrupted the action of `stage`: nothing is marked
    /// failed; `running` stays for the next start.
    fn cancelled(&mut self, stage: Stage) -> Action {
        match stage {
            Stage::Admitting | Stage::RecognisingSleep(_) | Stage::Readmitting(_) => {
                self.summary.action = Handled::Shutdown;
                self.finish()
            }
            Stage::BeforeRunning(fixup)
            | Stage::LoopCheckpoint(fixup)
            | Stage::Attempting(fixup)
            | Stage::Terminated(fixup, _)
            | Stage::Sleeping(fixup) => self.fixup_over(&fixup, FixupEnd::Shutdown),
            Stage::WaitFirst(_)
            | Stage::WaitCheckpoint(_)
            | Stage::WaitNudge(_)
            | Stage::WaitLast(_) => self.readiness(Readiness::Shutdown, None),
            // Nothing is written; resumed work runs the pass again.
            Stage::SacOpening(pass) | Stage::SacSetting(pass) => {
                self.sac_over(pass.then, SacEnd::Shutdown)
            }
            stage => panic!(
                "a host reported a shutdown in stage {}: only interruptible actions are cancelled",
                stage.name()
            ),
        }
    }

    /// The VM is not this pod's: nothing runs, nothing is written; a
    /// Warning event on the pod that asked, and a note with both names.
    /// The event never names the other VM.
    fn mismatch(&mut self, mismatch: binding::Mismatch) -> Action {
        // A pod the host would leave alone is told nothing.
        if let Some(row) = self.deferred {
            return self.leave(row);
        }
        let (note, event) = mismatch_told(&mismatch, &self.pod);
        self.note(note);
        self.tell(event);
        self.summary.action = Handled::VmMismatch;
        self.summary.mismatch = Some(mismatch.to_string());
        self.finish()
    }

    /// The node is set up wrong: reported (a Warning event, once per pod
    /// and not on every retry; a note) and stopped for a retry. The pod
    /// is not failed.
    fn node_error(&mut self, error: NodeError) -> Action {
        let message = format!("{error}; {}", error.fix());
        self.note(Note::NodeError {
            kind: error.kind(),
            message: message.clone(),
        });
        if self.trigger != Trigger::Retry {
            self.tell(Event::warning(reasons::NODE_ERROR, message));
        }
        self.stop(Stop::Node(error))
    }
}

impl super::Steps for PodTask {
    fn pod(&self) -> &PodRef {
        PodTask::pod(self)
    }
    fn next(&mut self, report: Report, now: Duration) -> Action {
        PodTask::next(self, report, now)
    }
    fn try_next(&mut self, report: Report, now: Duration) -> Result<Action, WrongReport> {
        PodTask::try_next(self, report, now)
    }
    fn record_lacks(&mut self, lacks: &[RecordFact]) {
        PodTask::record_lacks(self, lacks);
    }
}
