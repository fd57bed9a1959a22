//! [`PodTask`]: the decision for one pod as a state machine. Each
//! `next` takes the report of the last action and the host's clock, and
//! returns the next action; fire-and-forget actions (events, notes,
//! giving the turn back) are queued and handed out first.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::Duration;

use super::attempts::Attempts;
use super::settings::MIN_STEP;
use super::{
    Action, ExecPurpose, FixupEnd, Guarded, Handled, InspectFailed, Knows, Lookup, NodeError, Note,
    PlanRequest, Planned, PodError, PodRef, Readiness, RecordFact, Report, SacEnd, Settings, Stop,
    Summary, Told, Trigger, lookup, mismatch_event, observe,
};
use crate::annotations::{
    self, AnnotationPatch, Event, check_hint_room, exhausted_record, keys, messages, one_line,
    plan_failed_record, reasons, state_patch,
};
use crate::binding::{self, Verdict};
use crate::classify::{self, Rule, Scenario};
use crate::exec::{self, ExecOutput, ExitStatusKind};
use crate::facts::{
    Backend, BootKind, GuestOs, ImageKind, Observation, Overrides, PodInput, StaticIpv4, VmFacts,
    VmId, VmInspect, WaitFacts, WaitNic, escape_controls, static_nics,
};
use crate::lifecycle::{self, Action as Row, HandsOff, Lifecycle, LifecycleIntent, PostCloneState};
use crate::memory::{Evidence, Listed, PodMemory, Witness};
use crate::plan::{Nonce, Plan, exec_argv, hint_base64};
use crate::planner::{ComposedPlan, PlannerError};
use fixup_sac::{Nic as SacNic, SacError, StaticNic};

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

/// Where the nonce of each exec comes from: the operating system's
/// randomness in a host ([`Nonce::generate`]), a fixed sequence in a test.
pub type NonceSource = Box<dyn FnMut() -> Result<Nonce, String> + Send>;

/// The operating system's randomness, as every host draws nonces.
pub fn os_nonces() -> NonceSource {
    Box::new(|| Nonce::generate().map_err(|e| e.to_string()))
}

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
    /// The task ends when the fixup loop does ([`PodTask::for_plan`]).
    fixup_only: bool,
    /// The host's record of the pod, when it keeps one
    /// ([`PodTask::remember`]).
    memory: Option<Memory>,
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

impl Turns for PodTask {
    fn turn_state(&mut self) -> (&mut Awaiting, &mut Duration, &mut VecDeque<Action>) {
        (&mut self.awaiting, &mut self.now, &mut self.queue)
    }

    fn advance_with(&mut self, report: Report) -> Action {
        let stage = std::mem::replace(&mut self.stage, Stage::Over);
        self.advance(stage, report)
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

impl std::fmt::Debug for PodTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodTask")
            .field("pod", &self.pod)
            .field("stage", &self.stage.name())
            .finish_non_exhaustive()
    }
}

/// The fixup loop's state (spec section 5).
#[derive(Debug)]
struct Fixup {
    /// The VM, the plan and its attempts ([`Attempts`]).
    run: Attempts,
    scenario: Scenario,
    /// What the IP wait after success reads; `None` when the task ends
    /// with the loop ([`PodTask::for_plan`]).
    wait: Option<WaitFacts>,
    script: String,
    /// The first NIC's static address: the IP and `ready` go with `done`
    /// (not when a serial-console pass comes first).
    ready_ip: Option<Ipv4Addr>,
    /// The NICs of a Windows VM with a static one: the serial-console pass
    /// of spec section 10 follows `done` (`None`: no pass).
    sac: Option<Vec<SacNic>>,
    /// The read the next decision is made from: the `running` write's
    /// answer for the first attempt, the read before each later one.
    fresh: Option<PodInput>,
    /// The read before the attempt under way (`None` when the read failed).
    seen: Option<PodInput>,
}

impl Fixup {
    /// A loop that has not started: no attempt, no deadline yet (it is set
    /// when `running` is written).
    fn new(
        vm: VmId,
        scenario: Scenario,
        wait: Option<WaitFacts>,
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

/// A VM bound to the pod whose wake verdict is not reached yet (spec
/// section 2, rules 2 and the grace).
#[derive(Debug)]
struct Recognising {
    record: VmInspect,
    vm: VmId,
    /// Finding nothing waits for the grace: the host's hibernate history
    /// waits for the stack's witness, and a CH+`windows` pod not watched
    /// without a gap since it was new for a `Woken` event.
    grace: bool,
    /// The host's hibernate history says "a wake or a recreate" (rule 3):
    /// the stack's witness makes it a wake, none within the grace a
    /// recreate.
    history: bool,
    /// The pod has no work unless the VM is a wake (`mode=run`): nothing
    /// but a witness may make it one.
    not_cloned: bool,
    /// A listing of the events answered, at least once.
    listed: bool,
    /// A listing was cut short: the stack's own event may be hidden.
    truncated: bool,
    /// The grace's end on the task's clock.
    until: Duration,
}

/// The serial-console pass (spec section 10).
#[derive(Debug)]
struct SacPass {
    vm: VmId,
    nics: Vec<SacNic>,
    /// The guest's interfaces, once the console is open.
    nets: Option<Vec<u32>>,
    /// The next NIC (by position) to look at.
    next: usize,
    then: AfterSac,
    /// The pass's total deadline on the task's clock (spec section 10),
    /// set when the pass starts ([`PodTask::sac_start`]).
    until: Duration,
}

/// What comes after a serial-console pass that set every address.
#[derive(Debug)]
enum AfterSac {
    /// `PostCloneSucceeded`, then the IP wait (spec section 5).
    Succeeded(Box<Fixup>),
    /// The IP wait.
    Wait(Box<Wait>),
}

/// The DHCP recovery pass the IP wait may run once.
#[derive(Debug)]
struct Recovery {
    plan: Plan,
    exec: Vec<String>,
    nics: usize,
    /// The plugin that claims the VM's guest flavour for the recovery plan
    /// ([`ComposedPlan::flavor_claim`]), and the flavour: the pass then
    /// runs at once.
    ///
    /// [`ComposedPlan::flavor_claim`]: crate::planner::ComposedPlan::flavor_claim
    claimed_by: Option<(String, String)>,
}

/// The IP wait's state (spec section 6).
#[derive(Debug)]
struct Wait {
    facts: WaitFacts,
    recovery: Option<Recovery>,
    start: Duration,
    deadline: Duration,
    ip: Option<Ipv4Addr>,
    nonce: Option<Nonce>,
    /// A clone or a fork: a flavour's plugin may claim its recovery
    /// ([`Recovery::claimed_by`]); a wake or resumed work keeps the wait.
    claimable: bool,
}

/// What a write decided from a read is for.
#[derive(Debug)]
enum Write {
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
    fn vm(&self) -> &VmId {
        match self {
            Write::Running(fixup) | Write::Done(fixup) | Write::Exhausted { fixup, .. } => {
                &fixup.run.vm
            }
            Write::PlanFailed { vm, .. } | Write::SacFailed { vm, .. } => vm,
            Write::Final(wait) => &wait.facts.id,
        }
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

/// Whether `pod` already holds everything `patch` writes (a removal: the
/// key is absent).
fn holds(pod: &PodInput, patch: &AnnotationPatch) -> bool {
    patch
        .iter()
        .all(|(key, value)| pod.annotations.get(key) == value.as_ref())
}

/// The NICs the serial-console pass works on, when one of them is static
/// (a VM with only DHCP NICs gets no pass).
fn sac_nics(statics: &[Option<StaticIpv4>]) -> Option<Vec<SacNic>> {
    statics.iter().any(Option::is_some).then(|| {
        statics
            .iter()
            .map(|s| match s {
                Some(s) => SacNic::Static(StaticNic {
                    ip: s.address,
                    prefix: Some(s.prefix),
                    gateway: s.gateway,
                }),
                None => SacNic::Dhcp,
            })
            .collect()
    })
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
            fixup_only: false,
            memory: None,
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

    /// The task for a plan already made (by an embedder that planned
    /// itself, or a test): the fixup loop of spec section 5 from the
    /// `running` write on, decided from `pod` as read, and nothing after
    /// it: the caller waits for the IP itself. `vm` must be the VM the plan
    /// was made for and bound to the pod.
    #[allow(clippy::too_many_arguments)]
    pub fn for_plan(
        pod: PodInput,
        vm: VmId,
        scenario: Scenario,
        ready_ip: Option<Ipv4Addr>,
        plan: Plan,
        exec: Vec<String>,
        script: String,
        settings: Settings,
        nonces: NonceSource,
    ) -> (PodTask, Action) {
        let (mut task, first) = PodTask::start(pod, Trigger::Event, settings, nonces);
        if !matches!(first, Action::Admit) {
            return (task, first);
        }
        task.summary.action = Handled::Fixup;
        task.summary.scenario = Some(scenario);
        task.fixup_only = true;
        // The caller holds no turn of the task's: it never handed one out.
        task.holds_turn = false;
        task.stage =
            Stage::BeforeRunning(Fixup::new(vm, scenario, None, plan, exec, script, ready_ip));
        task.awaiting = Awaiting::GoOrCancelled;
        (task, Action::Checkpoint)
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

    /// The VM is the pod's: recognise a wake (spec section 2), then
    /// classify it.
    fn bound(&mut self, record: VmInspect) -> Action {
        let vm = match super::vm_id(&observe(&self.seen, &record, &Overrides::default())) {
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
    fn wake_events(&self) -> Action {
        Action::WakeEvents {
            field_selectors: crate::memory::field_selectors(
                &self.pod.uid,
                &self.settings.wake.reporters,
            ),
        }
    }

    /// The stack's events about the pod came back (spec section 2, rule 2
    /// and the grace).
    fn events(&mut self, mut wait: Recognising, answer: Result<Listed, String>) -> Action {
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
    fn after_grace(&mut self, wait: Recognising, by: Evidence) -> Action {
        if !self.holds_turn {
            self.stage = Stage::Readmitting(Box::new((wait.record, wait.vm, by)));
            self.holds_turn = true;
            return Action::Admit;
        }
        self.recognised(wait.record, wait.vm, by)
    }

    /// The wake verdict for the VM is reached: keep it, then classify.
    fn recognised(&mut self, record: VmInspect, vm: VmId, by: Evidence) -> Action {
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
    fn republish_failed(&mut self, vm: &VmId) {
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
    fn image_unknown(&self, obs: &Observation) -> Option<Stop> {
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

    /// The VM is the pod's and its wake verdict reached: classify it and
    /// go on by the table.
    fn classified(&mut self, record: VmInspect, vm: VmId) -> Action {
        let overrides = Overrides {
            boot: if self.wake {
                Some(BootKind::Wake)
            } else {
                self.knows.boot.and_then(Told::boot)
            },
            source_image: self.knows.source_image.clone(),
        };
        let obs = observe(&self.seen, &record, &overrides);
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
    fn planned(
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
        let mut fixup = Fixup::new(vm, scenario, Some(wait), plan, exec, script, ready_ip);
        fixup.sac = sac;
        self.stage = Stage::BeforeRunning(fixup);
        Action::Checkpoint
    }

    /// Each plugin of the plan that failed and was replaced by the
    /// built-in (failure policy `fallback`): a Warning event naming both.
    fn fallback_events(&mut self, composed: &ComposedPlan) {
        for part in &composed.parts {
            if let Some(fallback) = &part.fallback {
                let message = fallback.message(part.selection.scenario, &part.selection.plugin);
                self.tell(Event::warning(reasons::PLUGIN_FALLBACK, message));
            }
        }
    }

    /// A plan could not be made: a node error (the pod waits) or a plan
    /// failure (the pod is failed).
    fn plan_error(&mut self, vm: VmId, error: PlannerError) -> Action {
        if !super::is_node_error(&error) {
            return self.plan_failed(vm, &error);
        }
        let error = super::node_error(self.summary.pod.clone(), error);
        self.node_error(error)
    }

    /// No plan could be made (bad facts, no plugin, a plugin failure): a
    /// retry cannot help, so the pod is marked failed like an exhausted
    /// fixup, without a hint, after reading it once more.
    fn plan_failed(&mut self, vm: VmId, error: &dyn std::error::Error) -> Action {
        self.summary.fixup = Some(FixupEnd::PlanFailed);
        let line = messages::plan_failed(&error.to_string());
        self.summary.errors = vec![line.clone()];
        self.note(Note::PlanFailed { line: line.clone() });
        self.stage = Stage::ReadingFor(Write::PlanFailed { vm, line });
        Action::Read
    }

    /// Whether the VM is a hibernate wake (spec section 2), by the pod's
    /// `restore-from-hibernate`: it stays on the pod, so work resumed after
    /// a restart keeps the wake's wording (spec section 6).
    fn woken(&self) -> bool {
        self.wake
    }

    /// The read before a step in the guest (an attempt, the IP wait's
    /// nudge, a serial-console step): is the pod still ours, and the pod as
    /// read. API errors count as yes: a flaky API server must not stop the
    /// work; the uid precondition still guards writes, and every final
    /// write is decided from a read of its own.
    fn ours_by_read(
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

    fn still_ours(&self, current: &PodInput, vm: &VmId) -> bool {
        lifecycle::still_ours_knowing(current, &self.pod.uid, vm.as_str(), self.known())
    }

    /// What the task knows of the VM beyond the pod's annotations.
    fn known(&self) -> lifecycle::Known {
        lifecycle::Known {
            wake: self.wake,
            foreign_marker: self.foreign_marker,
            remembered: self.remembered,
            lifted: self.lifted,
        }
    }

    /// The patch a write decides from `current`, or `None` for no write.
    fn decide(&self, write: &Write, current: &PodInput) -> Option<AnnotationPatch> {
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
    fn write_from(&mut self, write: Write, current: PodInput, round: u32) -> Action {
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
    fn read_for(&mut self, write: Write, result: Result<Option<PodInput>, PodError>) -> Action {
        let current = match result {
            Ok(current) => current.filter(|c| c.uid.as_deref() == Some(self.pod.uid.as_str())),
            Err(e) => return self.stop(Stop::Api(e)),
        };
        match current {
            Some(current) => self.write_from(write, current, 1),
            None => self.decided(write, Decided::Gone),
        }
    }

    fn patched(
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
    fn decided(&mut self, write: Write, decided: Decided) -> Action {
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
    fn done_written(
        &mut self,
        mut fixup: Box<Fixup>,
        ready: Option<(Readiness, Option<Ipv4Addr>)>,
    ) -> Action {
        match fixup.sac.take() {
            Some(nics) if !self.fixup_only => {
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

    /// Start the serial-console pass: its total deadline starts now, and
    /// the pass holds no turn among the pods worked on at once (a console
    /// may take up to the deadline; nothing after the pass needs a turn:
    /// its failure record, `PostCloneSucceeded`, the IP wait and the final
    /// write hold none). Then: is the pod still ours?
    fn sac_start(&mut self, mut pass: SacPass) -> Action {
        pass.until = self.now + self.settings.sac_deadline;
        self.release();
        self.stage = Stage::SacCheck(Box::new(pass));
        Action::Read
    }

    /// The pod is still ours: open the console, or set the next address,
    /// each bounded by what is left of the pass's deadline; past it, the
    /// step about to start fails.
    fn sac_step(&mut self, pass: Box<SacPass>) -> Action {
        let (until, total) = (pass.until, self.settings.sac_deadline);
        match &pass.nets {
            None if self.now >= until => {
                let step = fixup_sac::Step::Dial;
                self.sac_error(*pass, SacError::Deadline { step, total })
            }
            None => {
                let (vm, need) = (pass.vm.clone(), pass.nics.len());
                self.stage = Stage::SacOpening(pass);
                Action::SacOpen {
                    vm,
                    need,
                    until,
                    total,
                }
            }
            Some(nets) => {
                let i = pass.next;
                let (Some(&net), Some(&SacNic::Static(nic))) = (nets.get(i), pass.nics.get(i))
                else {
                    unreachable!("sac_next stops at a static NIC with an interface");
                };
                if self.now >= until {
                    let step = fixup_sac::Step::Set { net };
                    return self.sac_error(*pass, SacError::Deadline { step, total });
                }
                self.stage = Stage::SacSetting(pass);
                Action::SacSet {
                    net,
                    nic,
                    until,
                    total,
                }
            }
        }
    }

    /// The next static NIC, checked for first; the pass is over after the
    /// last.
    fn sac_next(&mut self, mut pass: Box<SacPass>) -> Action {
        let nets = pass.nets.as_ref().map_or(0, Vec::len);
        while pass.next < pass.nics.len() && !matches!(pass.nics[pass.next], SacNic::Static(_)) {
            pass.next += 1;
        }
        if pass.next >= pass.nics.len() {
            return self.sac_over(pass.then, SacEnd::Set);
        }
        if pass.next >= nets {
            // The console listed fewer interfaces than it said: as if the
            // listing had come up short.
            let error = SacError::EnumExhausted {
                found: nets,
                need: pass.nics.len(),
            };
            return self.sac_error(*pass, error);
        }
        self.stage = Stage::SacCheck(pass);
        Action::Read
    }

    /// A step of the pass failed: its own event, then the failure record;
    /// a console path the host will not use is the node's fault; a stop
    /// is a shutdown.
    fn sac_error(&mut self, pass: SacPass, error: SacError) -> Action {
        if error == SacError::Stopped {
            return self.sac_over(pass.then, SacEnd::Shutdown);
        }
        self.queue.push_back(Action::SacClose);
        if let (Some(reason), Some(message)) = (error.event_reason(), error.event_message()) {
            self.tell(Event::warning(reason, message));
            let line = error.to_string();
            self.note(Note::Warn(format!("serial-console pass failed: {line}")));
            self.stage = Stage::ReadingFor(Write::SacFailed { vm: pass.vm, line });
            return Action::Read;
        }
        let pod = self.summary.pod.clone();
        self.node_error(NodeError::Console { pod, source: error })
    }

    /// The pass ended short of a failure: every address set (then what
    /// comes after it), or the pod gone or the host shutting down (nothing
    /// is written; resumed work runs the pass again).
    fn sac_over(&mut self, then: AfterSac, end: SacEnd) -> Action {
        // Closing a console that was never opened does nothing.
        self.queue.push_back(Action::SacClose);
        if end != SacEnd::Set {
            return self.sac_end(end);
        }
        self.note(Note::Sac(end));
        self.summary.sac = Some(end);
        match then {
            // The turn was given back when the pass started.
            AfterSac::Succeeded(fixup) => self.succeeded(fixup, None),
            AfterSac::Wait(wait) => self.wait(wait),
        }
    }

    /// The task ends with the pass.
    fn sac_end(&mut self, end: SacEnd) -> Action {
        self.note(Note::Sac(end));
        self.summary.sac = Some(end);
        self.finish()
    }

    fn readiness(&mut self, readiness: Readiness, ip: Option<Ipv4Addr>) -> Action {
        self.note(Note::IpWait {
            readiness,
            wake: self.wake,
        });
        self.summary.readiness = Some(readiness);
        self.summary.ip = ip.map(|ip| ip.to_string());
        self.finish()
    }

    /// The fixup ended done: in the summary, and noted once (the pass of
    /// spec section 10 may come between `done` and the success event).
    fn fixup_done(&mut self, fixup: &Fixup) {
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

    fn fixup_over(&mut self, fixup: &Fixup, end: FixupEnd) -> Action {
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
    fn start_budget(&mut self, fixup: &mut Fixup, from: &PodInput) {
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
    fn end_budget(&mut self) {
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
    fn marked(&mut self, vm: &VmId, state: &str) {
        if let Some(memory) = &mut self.memory
            && memory.record.set_marker(vm, state)
        {
            self.keep_record();
        }
    }

    /// Hand the record, as it is now, to the host to keep.
    fn keep_record(&mut self) {
        if let Some(memory) = &mut self.memory {
            memory.record.revise();
            let record = Box::new(memory.record.clone());
            self.queue.push_back(Action::Remember(record));
        }
    }

    /// The top of the loop: a shutdown check, then the check of the pod.
    fn loop_top(&mut self, fixup: Box<Fixup>) -> Action {
        self.stage = Stage::LoopCheckpoint(fixup);
        Action::Checkpoint
    }

    /// One attempt, when the pod is still ours ([`Attempts::begin`]).
    fn attempt(&mut self, mut fixup: Box<Fixup>, ours: bool, seen: Option<PodInput>) -> Action {
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

    fn attempted(&mut self, mut fixup: Box<Fixup>, result: Result<ExecOutput, String>) -> Action {
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
    fn attempt_failed(&mut self, mut fixup: Box<Fixup>, error: String) -> Action {
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
    fn op(&self) -> &'static str {
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
    fn exhaust(&mut self, fixup: Box<Fixup>) -> Action {
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
    fn done_alone(&mut self, fixup: Box<Fixup>) -> Action {
        self.stage = Stage::DoneAlone(fixup);
        Action::Patch {
            patch: state_patch(PostCloneState::Done),
            unless_changed_from: None,
        }
    }

    /// `done` is written: `PostCloneSucceeded`, then the IP wait, unless
    /// `ready` says how it ended already (a static first NIC: the IP and
    /// `ready` went with `done`).
    fn succeeded(
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
        let Some(facts) = fixup.wait.filter(|_| !self.fixup_only) else {
            return self.finish();
        };
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

    /// Start the IP wait (spec section 6).
    ///
    /// - First NIC static: its configured IP, at once.
    /// - Otherwise the primary MAC's lease.
    /// - Windows: one `cmd /c ipconfig /renew` nudge after `renew_after`.
    /// - A Linux clone that needed no fixup: one DHCP recovery pass after
    ///   `dhcp_recovery_after`, inside the same budget.
    fn wait(&mut self, mut wait: Box<Wait>) -> Action {
        wait.start = self.now;
        wait.deadline = self.now + self.settings.ready.budget;
        match wait.facts.first {
            Some(WaitNic::Static(address)) => self.wait_over(wait, Some(address)),
            None => {
                let until = wait.deadline;
                self.stage = Stage::WaitLast(wait);
                Action::Sleep { until }
            }
            Some(WaitNic::Lease(mac)) => {
                let nudge_at = if wait.facts.os == GuestOs::Windows {
                    self.settings
                        .ready
                        .renew
                        .then(|| wait.start + self.settings.ready.renew_after)
                } else if let Some(recovery) = &wait.recovery {
                    // A flavour's plugin that claims the clone knows its
                    // network files match the parent's NIC: no 15 s wait
                    // for a lease that cannot come.
                    match recovery.claimed_by {
                        Some(_) => Some(wait.start),
                        None => Some(wait.start + self.settings.ready.dhcp_recovery_after),
                    }
                } else {
                    None
                };
                match nudge_at.filter(|at| *at < wait.deadline) {
                    Some(until) => {
                        self.stage = Stage::WaitFirst(wait);
                        Action::WaitLease { mac, until }
                    }
                    None => self.wait_last(wait),
                }
            }
        }
    }

    /// The nudge: the Windows renew, or the DHCP recovery pass.
    fn nudge(&mut self, mut wait: Box<Wait>) -> Action {
        let left = wait.deadline.saturating_sub(self.now);
        let vm = wait.facts.id.clone();
        if wait.facts.os == GuestOs::Windows {
            // Three arguments, as the stack passes them: `cmd /c` runs the
            // one string whether the guest agent quotes each argument
            // (cmd then strips the outer quotes: `ipconfig /renew` names no
            // executable) or joins them with spaces.
            let argv = ["cmd", "/c", "ipconfig /renew"].map(str::to_owned).to_vec();
            let timeout = self.settings.ready.renew_timeout.min(left).max(MIN_STEP);
            self.stage = Stage::WaitNudge(wait);
            return Action::Exec {
                vm,
                argv,
                timeout,
                purpose: ExecPurpose::Renew,
            };
        }
        let Some(recovery) = &wait.recovery else {
            return self.wait_last(wait);
        };
        let message = match &recovery.claimed_by {
            Some((plugin, flavor)) => {
                messages::dhcp_recovery_claimed(plugin, flavor, recovery.nics)
            }
            None => messages::dhcp_recovery(self.settings.ready.dhcp_recovery_after, recovery.nics),
        };
        self.tell(Event::normal(reasons::DHCP_RECOVERY, message));
        let nonce = match (self.nonces)() {
            Ok(nonce) => nonce,
            Err(e) => {
                self.note(Note::Warn(format!("DHCP recovery pass failed: {e}")));
                return self.wait_last(wait);
            }
        };
        let argv = exec_argv(&recovery.plan, &recovery.exec, &nonce);
        wait.nonce = Some(nonce);
        let timeout = self.settings.ready.recovery_timeout.min(left).max(MIN_STEP);
        self.stage = Stage::WaitNudge(wait);
        Action::Exec {
            vm,
            argv,
            timeout,
            purpose: ExecPurpose::Recovery,
        }
    }

    /// The lease until the end of the budget.
    fn wait_last(&mut self, wait: Box<Wait>) -> Action {
        let until = wait.deadline;
        let Some(WaitNic::Lease(mac)) = wait.facts.first else {
            unreachable!("only a lease is waited for");
        };
        self.stage = Stage::WaitLast(wait);
        Action::WaitLease { mac, until }
    }

    /// The wait is over: the final write is decided from a read of the
    /// pod and lands only while the pod is still as read.
    fn wait_over(&mut self, mut wait: Box<Wait>, ip: Option<Ipv4Addr>) -> Action {
        wait.ip = ip;
        self.stage = Stage::ReadingFor(Write::Final(wait));
        Action::Read
    }
}

/// How a write decided from a read ended.
#[derive(Debug)]
enum Decided {
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
