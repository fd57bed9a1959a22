//! The task op: the decision for one pod ([`fixup_core::decision::PodTask`],
//! or [`fixup_core::decision::PrepareTask`] for trigger `prepare`)
//! across the C ABI, as JSON. The embedder carries out each action (reads,
//! patches and events through its Kubernetes client, execs and inspects
//! through its `cocoon`, leases, sleeps) and reports what happened; the
//! library plans itself when the task asks for a plan, and decides
//! everything else. The daemon carries out the same task
//! (`fixup-host`'s executor), so an embedder gets the daemon's behaviour:
//! the conformance suite (`tests/conformance/`) is replayed through this
//! op too.
//!
//! # Actions (`{"action": ...}`)
//!
//! | action | fields | carry out, then report |
//! |---|---|---|
//! | `admit` | | wait for a turn if the embedder bounds pods worked on at once; `go` (or `cancelled`) |
//! | `release` | | give the turn back; `go` |
//! | `checkpoint` | | `cancelled` when shutting down, else `go` |
//! | `inspect` | `vm`, `timeout_ms` | `cocoon vm inspect --json`; `inspected` (the record as printed), `inspect_error` or `inspect_gone` |
//! | `other_pods` | `vm_name` | list every pod the embedder sees on its node (asked only for a VM named by the pod's `vm.cocoonstack.io/name` under `accept_annotated_vm_names`; the library checks that none claims `vm_name`); `other_pods` (an array of pods as `kubectl get pod -o json` prints them, metadata is enough, the asking pod among them: a list without it proves nothing) or `other_pods_error` (why the embedder cannot list them: nothing runs) |
//! | `wake_events` | `namespace`, `uid`, `field_selectors` | list the events in `namespace` (events.k8s.io/v1) once per field selector of `field_selectors` (each names `regarding.uid`, `reason`, `type` and `reportingController`: exactly the stack's `Woken` and `HibernateSnapshotExists` about the pod, so that no other event can fill the listing; the library checks each event again to recognise a hibernate wake, spec section 2); `events` (every listing's events together, as the API server prints them), `events_truncated` (the same, when a listing was cut short: more matched a selector than the embedder reads) or `events_error` (why they cannot be listed: the task goes on, with a warning) |
//! | `read` | | read the pod by namespace and name; `read` (the pod, or null when not found) or `read_error` |
//! | `patch` | `annotations` (value or null to remove), `uid`, `resource_version` (null: the uid precondition only) | merge-patch the annotations with `metadata.uid` (and `metadata.resourceVersion`) as preconditions; `patched` (the pod the API server answered with, or null), `changed` (the pod now, when the resource version no longer matched) or `patch_error` |
//! | `exec` | `vm`, `argv`, `timeout_ms`, `purpose` | `cocoon vm exec <vm> -- <argv>`; `ran` or `exec_error` (or `cancelled`) |
//! | `wait_lease` | `mac`, `until_ms` | wait until the MAC has a lease or the clock reaches `until_ms`; `lease` (the address or null), `lease_error` (why the lease file could not tell: still unreadable or no list of leases at `until_ms`; the task makes it a node error) (or `cancelled`) |
//! | `sleep` | `until_ms` | wait until the clock reaches `until_ms`; `go` (or `cancelled`) |
//! | `sac_open` | `vm`, `need`, `until_ms`, `total_ms` | call the library's console op on the task (`cf_console_open`; the `console_open` op): it opens the VM's serial console (`<cocoon root>/run/cloudhypervisor/<vm>/console.sock`), waits for `SAC>` and lists the interfaces until at least `need` are listed, keeping the console open in the task (spec section 10), and ends by `until_ms` (the pass's total deadline, `total_ms` long); its answer is the report: `sac_opened` (the interface numbers in the order listed) or `sac_open_error` (or `cancelled`) |
//! | `sac_set` | `net`, `ip`, `prefix`, `gateway` (or null), `until_ms`, `total_ms` | call the library's console op on the task (`cf_console_set`; the `console_set` op): on the task's open console, it sets the address on interface `net` and checks it took effect, in rounds, by `until_ms`; its answer is the report: `sac_set` (`true`) or `sac_set_error` (or `cancelled`) |
//! | `sac_close` | | nothing: the library closed the task's console when it handed this out; `go` |
//! | `tell` | `type`, `reason`, `message`, `event_action` | record the event on the pod (best effort; `event_action` is its events.k8s.io `action`); `go` |
//! | `note` | `level`, `message` | log it; `go` |
//! | `remember` | `record` | keep the record under the pod's uid (durably: a file written atomically), hand it back in the next task's `options_json` (`memory.record`), and drop it when the pod is gone; asked only of a task started with `memory`. The hibernate history in a record (spec section 2, rule 3) comes from the embedder's watch, which notes each pod it sees with the `observe` op (`cf_call`; Go `Planner.Observe`) into the same record: keep a `remember`'s record with the `merge` op (the stored record and this one), one `observe` or `merge` of a pod at a time, so neither loses the other's part; `go` |
//! | `finish` | `summary`, or `stop` (`kind`, `retryable`, `message`, `again`) | the task is over; after a stop whose `again` is not null (`after_ms`, `trigger`, `tries`), wait `after_ms` and start a task for the pod again with that `trigger` and `tries`: the library decides when and how a pod is tried again, the embedder only waits |
//!
//! Every report is an object with `now_ms`, the embedder's clock in
//! milliseconds since the task started, and one key: `go`, `cancelled`,
//! `inspected`, `inspect_error`, `inspect_gone` (the embedder knows the VM
//! does not exist: the task stops, `vm-gone`, not to be tried again),
//! `other_pods`, `other_pods_error`,
//! `events`, `events_truncated`, `events_error`, `read`,
//! `read_error`, `patched`,
//! `changed`, `patch_error`, `ran` (`{exit | signal, stderr, stdout,
//! stderr_cut}`), `exec_error`, `lease`, `lease_error`, `sac_opened`, `sac_open_error`,
//! `sac_set` or `sac_set_error`. A `read_error` or `patch_error` is
//! `{kind: "api" | "refused" | "gone", message}`. A `sac_open_error` or
//! `sac_set_error` is `{kind: "dial" | "enum" | "set" | "verify" |
//! "deadline" | "refused", ...}` with the fields of the console client's
//! error: `cause` (dial, set), `found` and `need` (enum), `net` (set,
//! verify), `ip` (verify), `step` and `total_ms` (deadline: the pass's
//! total deadline passed during that step, `dial`, `enum`, `set` or
//! `verify`, with `net` for the last two and `ip` for `verify`),
//! `message` (refused: a console path the host will not use).

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use fixup_core::annotations::EventType;
use fixup_core::decision::{
    Action, Guarded, InspectFailed, Note, PodError, PodTask, PrepareTask, RawSettings, Report,
    Settings, Steps, Trigger, os_nonces,
};
use fixup_core::exec::{ExecOutput, ExitStatusKind};
use fixup_core::facts::{PodInput, VmId, VmInspect};
use fixup_core::memory::{Listed, PodMemory, StackEvent};
use fixup_sac::{SacError, StaticNic, Step};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::ops::{Built, CfStatus, Failure};

/// The options of a task, `cf_task_start`'s `options_json`: why the host
/// handles the pod, and the apply path's numbers where they are not the
/// defaults (`settings`, in milliseconds: `retry_interval_ms`,
/// `retry_budget_ms`, `exec_timeout_ms`, `inspect_timeout_ms`,
/// `ip_wait_ms`, `renew_after_ms`, `renew_timeout_ms`,
/// `dhcp_recovery_after_ms`). The binding policy is the planner's
/// (`accept_legacy_vm_names`, `accept_annotated_vm_names`). `memory`: the
/// pod's record, for an embedder that keeps them.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskOptions {
    /// `event` (default), `startup` (resumed work is announced with
    /// `ResumedAfterRestart`) or `retry` (a node error is not told again).
    #[serde(default)]
    pub trigger: Option<String>,
    #[serde(default)]
    pub settings: RawSettings,
    /// For an embedder that keeps the pods' records (`remember`): the
    /// record the last task handed out for this pod uid, and the wall
    /// clock now. Absent: no record is kept, and each fixup loop's retry
    /// budget starts with its task.
    #[serde(default)]
    pub memory: Option<TaskMemory>,
    /// The wall clock now, in milliseconds since the Unix epoch, for an
    /// embedder that keeps no records (one that does gives it in
    /// `memory`): a wake event of the stack counts only when it is dated
    /// no later than this clock (spec section 2). Absent (and no
    /// `memory`): no event counts as evidence of a wake.
    #[serde(default)]
    pub now_unix_ms: Option<u64>,
    /// What the embedder knows of the pod's VM beyond its record: `boot`
    /// (`create`, `fork`, `wake`, `wake-in-place`, `resume`: how it booted
    /// the VM, evidence of a wake or of none), `source_image` (replaces the
    /// record's `config.image`) and `record_lacks` (`image`, `created_at`:
    /// facts its record does not give, which the task never guesses).
    #[serde(default)]
    pub knows: Option<fixup_core::decision::Knows>,
    /// How many times in a row the pod's tasks stopped before this one:
    /// the last stop's `again.tries` (0, the default, for a first try).
    /// The next stop's wait doubles with it.
    #[serde(default)]
    pub tries: u32,
}

/// The record a task starts with ([`TaskOptions::memory`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskMemory {
    /// The record as the last `remember` action gave it; null or absent
    /// when there is none yet. One that is not a record of this library's
    /// form (checked, not authenticated) starts the task on a new record
    /// (a gap), which `merge` then keeps in its place. The record can add
    /// work (a wake verdict makes a `mode=run` pod a wake): keep it where
    /// only the embedder can write it.
    #[serde(default)]
    pub record: Option<Value>,
    /// The wall clock now, in milliseconds since the Unix epoch.
    pub now_unix_ms: u64,
    /// The embedder has watched the pod without a gap since it first saw
    /// it without a lifecycle annotation (a restart or a re-list of its
    /// watch is a gap): then a CH Windows pod with no evidence of a wake
    /// is not held for the wake grace (spec section 2). Taken only beside
    /// a usable record, which noted the watch. Default false.
    #[serde(default)]
    pub watched_since_new: bool,
}

impl TaskMemory {
    /// The record given: `None` when there is none (null or absent), `Err`
    /// with why when it is not a record this library wrote.
    fn record(&self) -> Result<Option<PodMemory>, String> {
        match &self.record {
            None | Some(Value::Null) => Ok(None),
            Some(record) => PodMemory::from_json(record.to_string().as_bytes())
                .map(Some)
                .map_err(|e| e.to_string()),
        }
    }
}

impl TaskOptions {
    fn read(text: Option<&str>) -> Result<TaskOptions, Failure> {
        match text {
            None | Some("") => Ok(TaskOptions::default()),
            Some(text) => serde_json::from_str(text)
                .map_err(|e| Failure::invalid(format!("options_json: {e}"))),
        }
    }

    /// The trigger of a fixup, or `None` for a parent's preparation
    /// (`"prepare"`).
    fn trigger(&self) -> Result<Option<Trigger>, Failure> {
        Ok(Some(match self.trigger.as_deref() {
            None | Some("event") => Trigger::Event,
            Some("startup") => Trigger::Startup,
            Some("retry") => Trigger::Retry,
            Some("prepare") => return Ok(None),
            Some(other) => {
                return Err(Failure::invalid(format!(
                    "options_json: trigger {other:?}: use \"event\", \"startup\", \"retry\" or \"prepare\""
                )));
            }
        }))
    }

    /// The settings, through the one builder every host uses; the binding
    /// policy is the planner's.
    fn settings(&self, built: &Built) -> Result<Settings, Failure> {
        for (set, key) in [
            (
                self.settings.accept_legacy_vm_names,
                "accept_legacy_vm_names",
            ),
            (
                self.settings.accept_annotated_vm_names,
                "accept_annotated_vm_names",
            ),
        ] {
            if set {
                return Err(Failure::invalid(format!(
                    "options_json: settings.{key} is the planner's option (cf_planner_new)"
                )));
            }
        }
        let mut builder = self.settings.builder();
        builder.accept_legacy_vm_names = built.binding.accept_legacy_names;
        builder.accept_annotated_vm_names = built.binding.accept_annotated_names;
        builder
            .build()
            .map_err(|e| Failure::invalid(format!("options_json: settings: {e}")))
    }
}

/// A task in flight.
#[derive(Debug)]
pub struct Task {
    task: Box<dyn Steps + Send>,
    /// The last action handed out was `finish`: nothing more to do.
    over: bool,
    /// The console action the task awaits, as it handed it out: the only
    /// one the library's console ops carry out ([`crate::console`]).
    pub(crate) pending: Option<ConsoleAsk>,
    /// The task's serial console, from `sac_open` to `sac_close`.
    pub(crate) console: Option<crate::console::Console>,
    /// The embedder's clock at the last report.
    pub(crate) now: Duration,
    /// Set by a cancel (`cf_task_cancel`, the `task_cancel` op): the
    /// console op in flight, and any later one, ends `cancelled`.
    pub(crate) stop: Arc<AtomicBool>,
    /// The task's trigger (`None`: a preparation) and the stops in a row
    /// before it, for a stop's `again`.
    trigger: Option<Trigger>,
    tries: u32,
}

/// A console action of the task ([`Task::pending`]): the pass's deadline
/// `until` on the task's clock and its `total`.
#[derive(Debug, Clone)]
pub(crate) enum ConsoleAsk {
    Open {
        vm: VmId,
        need: usize,
        until: Duration,
        total: Duration,
    },
    Set {
        net: u32,
        nic: StaticNic,
        until: Duration,
        total: Duration,
    },
}

impl Task {
    fn new(task: Box<dyn Steps + Send>, trigger: Option<Trigger>, tries: u32) -> Task {
        Task {
            trigger,
            tries,
            task,
            over: false,
            pending: None,
            console: None,
            now: Duration::ZERO,
            stop: Arc::default(),
        }
    }

    /// The flag a cancel sets.
    pub(crate) fn stop_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stop)
    }
}

/// Start the task for a pod as read: the task and its first action.
pub fn start(built: &Built, pod: &[u8], options: Option<&str>) -> Result<(Task, String), Failure> {
    let options = TaskOptions::read(options)?;
    let pod = versioned(crate::ops::read_pod(pod)?, "pod_json").map_err(Failure::invalid)?;
    let settings = options.settings(built)?;
    let Some(trigger) = options.trigger()? else {
        // A preparation keeps no record: `memory` does not apply.
        let (task, first) = PrepareTask::start(pod, settings, os_nonces());
        let mut task = Task::new(Box::new(task), None, options.tries);
        let action = task.hand_out(built, first, Duration::ZERO)?;
        return Ok((task, action));
    };
    let (mut task, first) = PodTask::start(pod, trigger, settings, os_nonces());
    if let Some(now) = options.now_unix_ms {
        task.wall_clock(now);
    }
    if let Some(knows) = options.knows {
        task.told(knows);
    }
    if let Some(memory) = &options.memory {
        // A record that is not usable starts the task on a new one (its
        // history lost, which is a gap): the task's `remember` then
        // replaces the stored one through `merge`, with a warning.
        let (mut record, usable) = match memory.record() {
            Ok(Some(record)) => (record, true),
            Ok(None) | Err(_) => (PodMemory::new(), false),
        };
        record.set_watched_since_new(memory.watched_since_new && usable);
        task.remember(record, memory.now_unix_ms);
    }
    let mut task = Task::new(Box::new(task), Some(trigger), options.tries);
    let action = task.hand_out(built, first, Duration::ZERO)?;
    Ok((task, action))
}

/// The next action, given the report of the last one.
pub fn next(built: &Built, task: &mut Task, report: &str) -> Result<String, Failure> {
    if task.over {
        return Err(Failure::invalid(
            "the task is over (its last action was finish): free it",
        ));
    }
    let (now, mut report, lacks) = read_report(report)?;
    if !lacks.is_empty() && matches!(report, Report::Inspected(Ok(_))) {
        task.task.record_lacks(&lacks);
    }
    // An embedder's error names no pod: the task's is the one.
    if let Report::Read(Err(e)) | Report::Patched(Err(e)) = &mut report {
        name_the_pod(e, &task.task.pod().to_string());
    }
    let action = task
        .task
        .try_next(report, now)
        .map_err(|e| bad_report(e.to_string()))?;
    task.hand_out(built, action, now)
}

impl Task {
    /// Plan where the task asks (the library holds the planner), and hand
    /// out the first action for the embedder, as JSON.
    fn hand_out(
        &mut self,
        built: &Built,
        mut action: Action,
        now: Duration,
    ) -> Result<String, Failure> {
        while let Action::Plan(request) = action {
            let planned = {
                let _permit = built.permit();
                request.run(&built.planner)
            };
            action = self.task.next(Report::Planned(planned), now);
        }
        self.over = matches!(action, Action::Finish(_));
        self.now = now;
        self.pending = match &action {
            Action::SacOpen {
                vm,
                need,
                until,
                total,
            } => Some(ConsoleAsk::Open {
                vm: vm.clone(),
                need: *need,
                until: *until,
                total: *total,
            }),
            Action::SacSet {
                net,
                nic,
                until,
                total,
            } => Some(ConsoleAsk::Set {
                net: *net,
                nic: *nic,
                until: *until,
                total: *total,
            }),
            _ => None,
        };
        if matches!(action, Action::SacClose | Action::Finish(_)) {
            self.console = None;
        }
        let again = |stop: &fixup_core::decision::Stop| stop.again_json(self.trigger, self.tries);
        serde_json::to_string(&action_json(action, self.task.pod(), again))
            .map_err(|e| Failure::invalid(format!("cannot encode the action: {e}")))
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The action as JSON; `again` is a stop's `again` ([`fixup_core::decision::Stop::again_json`]).
fn action_json(
    action: Action,
    pod: &fixup_core::decision::PodRef,
    again: impl Fn(&fixup_core::decision::Stop) -> Value,
) -> Value {
    let uid = pod.uid.as_str();
    match action {
        Action::Admit => json!({"action": "admit"}),
        Action::Release => json!({"action": "release"}),
        Action::Checkpoint => json!({"action": "checkpoint"}),
        Action::Inspect { vm, timeout } => {
            json!({"action": "inspect", "vm": vm.as_str(), "timeout_ms": ms(timeout)})
        }
        Action::OtherPods { vm_name } => json!({"action": "other_pods", "vm_name": vm_name}),
        Action::WakeEvents { field_selectors } => json!({
            "action": "wake_events",
            "namespace": pod.namespace,
            "uid": pod.uid,
            "field_selectors": field_selectors,
        }),
        Action::Plan(_) => unreachable!("the library plans itself"),
        Action::Read => json!({"action": "read"}),
        Action::Patch {
            patch,
            unless_changed_from,
        } => json!({
            "action": "patch",
            "annotations": patch,
            "uid": uid,
            "resource_version": unless_changed_from.and_then(|from| from.resource_version),
        }),
        Action::Exec {
            vm,
            argv,
            timeout,
            purpose,
        } => json!({
            "action": "exec",
            "vm": vm.as_str(),
            "argv": argv,
            "timeout_ms": ms(timeout),
            "purpose": purpose,
        }),
        Action::WaitLease { mac, until } => {
            json!({"action": "wait_lease", "mac": mac.to_string(), "until_ms": ms(until)})
        }
        Action::Sleep { until } => json!({"action": "sleep", "until_ms": ms(until)}),
        Action::Tell(event) => json!({
            "action": "tell",
            "type": match event.kind {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            },
            "reason": event.reason,
            "message": event.message,
            "event_action": event.action(),
        }),
        Action::Note(note) => {
            let (level, message) = note_text(note);
            json!({"action": "note", "level": level, "message": message})
        }
        Action::SacOpen {
            vm,
            need,
            until,
            total,
        } => json!({
            "action": "sac_open",
            "vm": vm.as_str(),
            "need": need,
            "until_ms": ms(until),
            "total_ms": ms(total),
        }),
        Action::SacSet {
            net,
            nic,
            until,
            total,
        } => json!({
            "action": "sac_set",
            "net": net,
            "ip": nic.ip.to_string(),
            "prefix": nic.prefix,
            "gateway": nic.gateway.map(|g| g.to_string()),
            "until_ms": ms(until),
            "total_ms": ms(total),
        }),
        Action::SacClose => json!({"action": "sac_close"}),
        Action::Publish(intent) => fixup_core::decision::reports::publish_json(&intent, uid),
        Action::Remember(record) => json!({
            "action": "remember",
            "record": serde_json::to_value(&*record).expect("a record is JSON"),
        }),
        Action::Finish(Ok(summary)) => json!({"action": "finish", "summary": summary}),
        Action::Finish(Err(stop)) => json!({
            "action": "finish",
            "stop": {
                "kind": stop.kind(),
                "retryable": stop.is_retryable(),
                "message": stop.to_string(),
                "again": again(&stop),
            },
        }),
    }
}

fn note_text(note: Note) -> (&'static str, String) {
    match note {
        Note::Resumed(op) => ("info", format!("work resumed after a restart: op={op}")),
        Note::VmMismatch { expected, mismatch } => (
            "warn",
            format!("VM not used, nothing run: {mismatch} (expected VM name {expected})"),
        ),
        Note::NodeError { message, .. } => ("error", message),
        Note::PlanFailed { line } => ("warn", line),
        Note::Fixup {
            scenario,
            end,
            attempts,
        } => (
            "info",
            format!("fixup {scenario} {end} after {attempts} attempt(s)"),
        ),
        Note::IpWait { readiness, wake } => (
            "info",
            format!(
                "IP wait {readiness} ({})",
                if wake { "wake" } else { "clone" }
            ),
        ),
        Note::Sac(end) => ("info", format!("serial-console pass {end}")),
        Note::Warn(line) => ("warn", line),
    }
}

fn bad_report(message: impl Into<String>) -> Failure {
    Failure::new(
        CfStatus::CfInvalidArgument,
        format!("report_json: {}", message.into()),
    )
}

/// A pod as listed (another pod on the node: metadata is enough).
fn listed_pod(value: &Value) -> Result<PodInput, Failure> {
    PodInput::from_value(value, "report pod").map_err(|e| bad_report(e.to_string()))
}

/// The task's pod as read or written now.
fn pod_of(value: &Value) -> Result<PodInput, Failure> {
    versioned(listed_pod(value)?, "the report's pod").map_err(bad_report)
}

/// A pod the task works on carries `metadata.resourceVersion`, as the API
/// server always returns it: the task's writes are guarded by it, and a pod
/// without one would turn them into writes over whatever changed meanwhile.
fn versioned(pod: PodInput, what: &str) -> Result<PodInput, String> {
    match pod.resource_version.as_deref() {
        Some(v) if !v.is_empty() => Ok(pod),
        _ => Err(format!(
            "{what} has no metadata.resourceVersion: hand over the pod as the API server \
             returned it (the task's writes are guarded by that version)"
        )),
    }
}

/// The pod an API error is about, where the report left it out.
fn name_the_pod(e: &mut PodError, label: &str) {
    match e {
        PodError::Api { pod, .. } | PodError::Refused { pod, .. } if pod.is_empty() => {
            label.clone_into(pod);
        }
        _ => {}
    }
}

fn pod_error(value: &Value) -> Result<PodError, Failure> {
    let message = value["message"].as_str().unwrap_or_default().to_owned();
    Ok(match value["kind"].as_str() {
        Some("api") => PodError::Api {
            pod: String::new(),
            reason: message,
        },
        Some("refused") => PodError::Refused {
            pod: String::new(),
            reason: message,
        },
        Some("gone") => PodError::Gone { pod: message },
        _ => {
            return Err(bad_report(
                "an error's kind is \"api\", \"refused\" or \"gone\"",
            ));
        }
    })
}

/// A console client's error as an embedder reports it.
fn sac_error(value: &Value) -> Result<SacError, Failure> {
    let text = |key: &str| value[key].as_str().unwrap_or_default().to_owned();
    let number = |key: &str| {
        value[key]
            .as_u64()
            .ok_or_else(|| bad_report(format!("a console error of this kind has {key}")))
    };
    let net =
        || number("net").and_then(|n| u32::try_from(n).map_err(|_| bad_report("net out of range")));
    Ok(match value["kind"].as_str() {
        Some("dial") => SacError::Dial {
            cause: text("cause"),
        },
        Some("enum") => SacError::EnumExhausted {
            found: usize::try_from(number("found")?).unwrap_or(usize::MAX),
            need: usize::try_from(number("need")?).unwrap_or(usize::MAX),
        },
        Some("set") => SacError::SetIp {
            net: net()?,
            cause: text("cause"),
        },
        Some("verify") => SacError::VerifyExhausted {
            net: net()?,
            ip: text("ip")
                .parse()
                .map_err(|_| bad_report("a verify error's ip is a dotted-quad IPv4 address"))?,
        },
        Some("deadline") => SacError::Deadline {
            step: match value["step"].as_str() {
                Some("dial") => Step::Dial,
                Some("enum") => Step::Enum,
                Some("set") => Step::Set { net: net()? },
                Some("verify") => Step::Verify {
                    net: net()?,
                    ip: text("ip").parse().map_err(|_| {
                        bad_report("a verify step's ip is a dotted-quad IPv4 address")
                    })?,
                },
                _ => {
                    return Err(bad_report(
                        "a deadline's step is \"dial\", \"enum\", \"set\" or \"verify\"",
                    ));
                }
            },
            total: Duration::from_millis(number("total_ms")?),
        },
        Some("refused") => SacError::Refused {
            path: std::path::PathBuf::from("console.sock"),
            problem: text("message"),
            fix: "make it the VM's console socket",
        },
        _ => {
            return Err(bad_report(
                "a console error's kind is \"dial\", \"enum\", \"set\", \"verify\", \"deadline\" or \"refused\"",
            ));
        }
    })
}

/// A report's clock, what it says happened, and, beside `inspected`, the
/// facts the embedder's record lacks (`record_lacks`: a record built from
/// its own types).
pub(crate) fn read_report(
    text: &str,
) -> Result<(Duration, Report, Vec<fixup_core::decision::RecordFact>), Failure> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| bad_report(format!("not JSON: {e}")))?;
    let map = value
        .as_object()
        .ok_or_else(|| bad_report("not an object"))?;
    let now = map
        .get("now_ms")
        .and_then(Value::as_u64)
        .map(Duration::from_millis)
        .ok_or_else(|| bad_report("no now_ms: the embedder's clock since the task started"))?;
    // `record_lacks` goes beside `inspected`.
    let lacks = match (map.get("record_lacks"), map.contains_key("inspected")) {
        (Some(lacks), true) => serde_json::from_value(lacks.clone())
            .map_err(|e| bad_report(format!("record_lacks: {e}")))?,
        _ => Vec::new(),
    };
    let mut keys = map
        .keys()
        .filter(|k| *k != "now_ms" && !(*k == "record_lacks" && map.contains_key("inspected")));
    let (Some(key), None) = (keys.next(), keys.next()) else {
        return Err(bad_report(
            "one key besides now_ms (and record_lacks beside inspected): what happened",
        ));
    };
    let v = &map[key.as_str()];
    let report = match key.as_str() {
        "go" | "cancelled" if *v != Value::Bool(true) => {
            return Err(bad_report(format!("{key} is true")));
        }
        "go" => Report::Go,
        "cancelled" => Report::Cancelled,
        "inspected" => Report::Inspected(
            VmInspect::from_value(v, "inspected").map_err(|e| InspectFailed::Failed(e.to_string())),
        ),
        "inspect_error" => Report::Inspected(Err(InspectFailed::Failed(
            v.as_str().unwrap_or_default().to_owned(),
        ))),
        "inspect_gone" => match v.as_str().filter(|why| !why.trim().is_empty()) {
            Some(why) => Report::Inspected(Err(InspectFailed::Gone(why.to_owned()))),
            None => {
                return Err(bad_report(
                    "inspect_gone is the caller's own error, as text, saying the VM does not exist",
                ));
            }
        },
        "other_pods" => Report::OtherPods(Ok(v
            .as_array()
            .ok_or_else(|| bad_report("other_pods is an array of pods"))?
            .iter()
            .map(listed_pod)
            .collect::<Result<_, _>>()?)),
        "other_pods_error" => Report::OtherPods(Err(v.as_str().unwrap_or_default().to_owned())),
        "events" | "events_truncated" => Report::Events(Ok(Listed {
            events: v
                .as_array()
                .ok_or_else(|| bad_report(format!("{key} is an array of events")))?
                .iter()
                .map(StackEvent::from_value)
                .collect(),
            truncated: key == "events_truncated",
        })),
        "events_error" => Report::Events(Err(v.as_str().unwrap_or_default().to_owned())),
        "read" if v.is_null() => Report::Read(Ok(None)),
        "read" => Report::Read(Ok(Some(pod_of(v)?))),
        "read_error" => Report::Read(Err(pod_error(v)?)),
        "patched" if v.is_null() => Report::Patched(Ok(Guarded::Written(None))),
        "patched" => Report::Patched(Ok(Guarded::Written(Some(pod_of(v)?)))),
        "changed" => Report::Patched(Ok(Guarded::Changed(pod_of(v)?))),
        "patch_error" => Report::Patched(Err(pod_error(v)?)),
        "ran" => {
            let status = match (v["exit"].as_i64(), v["signal"].as_i64()) {
                (Some(code), None) => ExitStatusKind::Code(
                    i32::try_from(code).map_err(|_| bad_report("exit out of range"))?,
                ),
                (None, Some(signal)) => ExitStatusKind::Signal(
                    i32::try_from(signal).map_err(|_| bad_report("signal out of range"))?,
                ),
                _ => return Err(bad_report("ran has exit or signal")),
            };
            let text = |key: &str| v[key].as_str().unwrap_or_default().as_bytes().to_vec();
            Report::Ran(Ok(ExecOutput {
                status,
                stdout: text("stdout"),
                stderr: text("stderr"),
                stderr_cut: v["stderr_cut"].as_bool().unwrap_or(false),
            }))
        }
        "exec_error" => Report::Ran(Err(v.as_str().unwrap_or_default().to_owned())),
        "lease" if v.is_null() => Report::Lease(Ok(None)),
        "lease" => Report::Lease(Ok(Some(
            v.as_str()
                .and_then(|s| s.parse::<Ipv4Addr>().ok())
                .ok_or_else(|| bad_report("lease is a dotted-quad IPv4 address or null"))?,
        ))),
        "lease_error" => Report::Lease(Err(v
            .as_str()
            .filter(|why| !why.trim().is_empty())
            .ok_or_else(|| bad_report("lease_error is why the lease file could not tell"))?
            .to_owned())),
        "sac_opened" => Report::SacOpened(Ok(serde_json::from_value(v.clone())
            .map_err(|_| bad_report("sac_opened is the list of interface numbers"))?)),
        "sac_open_error" => Report::SacOpened(Err(sac_error(v)?)),
        "sac_set" if *v != Value::Bool(true) => return Err(bad_report("sac_set is true")),
        "sac_set" => Report::SacSet(Ok(())),
        "sac_set_error" => Report::SacSet(Err(sac_error(v)?)),
        other => return Err(bad_report(format!("unknown report {other:?}"))),
    };
    Ok((now, report, lacks))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use fixup_kit::conformance::{Ended, Scenario, Suite, World, answer, pod_json, task_options};

    use super::*;

    /// One scenario through the op, as an embedder drives it: JSON
    /// actions carried out against the world, JSON reports back.
    /// With `intents`, the embedder owns the lifecycle: the world
    /// publishes each change the task hands over.
    fn replay(built: &Built, scenario: &Scenario, intents: bool) -> (World, Ended) {
        let mut world = World::new(scenario);
        let pod = serde_json::to_vec(&pod_json(&world.first_read())).unwrap();
        let mut options = task_options(&world, scenario);
        if intents {
            options["settings"]["lifecycle_intents"] = json!(true);
        }
        let (mut task, mut action) = start(built, &pod, Some(&options.to_string())).unwrap();
        let mut now = Duration::ZERO;
        loop {
            let a: Value = serde_json::from_str(&action).unwrap();
            if intents && a["action"] == "patch" {
                for key in fixup_core::lifecycle::LIFECYCLE_KEYS {
                    assert!(
                        a["annotations"].get(key).is_none(),
                        "a write carries {key} though the embedder owns the lifecycle: {a}"
                    );
                }
            }
            let mut report = match answer(&mut world, &mut now, &a) {
                Ok(report) => report,
                Err(ended) => return (world, ended),
            };
            report["now_ms"] = json!(u64::try_from(now.as_millis()).unwrap());
            action = next(built, &mut task, &report.to_string()).unwrap();
        }
    }

    /// A planner with the built-in plugins over an empty cocoon root (kept
    /// while the planner is used).
    fn built_ins() -> (tempfile::TempDir, Built) {
        let root = tempfile::tempdir().unwrap();
        let options = json!({"cocoon_root": root.path(), "plugin_dir": "", "no_cache": true});
        let (built, _) = crate::ops::planner_new(&options.to_string()).unwrap();
        (root, built)
    }

    /// Every scenario file, replayed through the task op as an embedder
    /// drives it (with `intents`, one that owns the lifecycle). The
    /// binding policy is the planner's: one planner for each policy the
    /// scenarios ask for.
    fn replay_every_scenario(suite: Suite, intents: bool) {
        let root = suite.cocoon_root().to_owned();
        let mut planners = std::collections::BTreeMap::new();
        suite.each(|scenario| {
            let policy = (
                scenario.settings.accept_legacy_vm_names,
                scenario.settings.accept_annotated_vm_names,
            );
            let built = planners.entry(policy).or_insert_with(|| {
                let options = json!({
                    "cocoon_root": root,
                    "plugin_dir": "",
                    "no_cache": true,
                    "strict": true,
                    "accept_legacy_vm_names": policy.0,
                    "accept_annotated_vm_names": policy.1,
                });
                crate::ops::planner_new(&options.to_string()).unwrap().0
            });
            replay(built, scenario, intents)
        });
    }

    fn workspace() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    #[test]
    fn every_scenario_replays_through_the_task_op() {
        replay_every_scenario(Suite::load(&workspace()), false);
    }

    /// The same scenarios with the lifecycle handed to the embedder: what
    /// it publishes adds up to the same writes.
    #[test]
    fn every_scenario_replays_through_the_task_op_with_the_lifecycle_handed_over() {
        replay_every_scenario(Suite::load(&workspace()), true);
    }

    /// The embedder's own scenarios (its knowledge of the VM through the
    /// task option `knows`), in both lifecycle modes, and those of an
    /// embedder that owns the lifecycle with it handed over.
    #[test]
    fn every_embedder_scenario_replays_through_the_task_op() {
        for intents in [false, true] {
            replay_every_scenario(Suite::load_embedder(&workspace()), intents);
        }
        replay_every_scenario(Suite::load_owned(&workspace()), true);
    }

    /// The scenarios whose serial console takes time while the world
    /// changes (`tests/conformance-timed/`), replayed through the task op:
    /// the world's console answers with its clock, as for the decision.
    #[test]
    fn timed_console_scenarios_replay_through_the_task_op() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance-timed");
        let scenarios = Scenario::all(&dir).unwrap();
        assert!(!scenarios.is_empty());
        let (_root, built) = built_ins();
        for (path, scenario) in scenarios {
            for intents in [false, true] {
                let (world, ended) = replay(&built, &scenario, intents);
                if let Err(e) = scenario.check(&world, &ended) {
                    panic!(
                        "{} (lifecycle handed over: {intents}): {}\n{e}",
                        path.display(),
                        scenario.about
                    );
                }
            }
        }
    }

    /// A report that does not answer the last action is refused, and the
    /// task goes on as it was: the right report still works.
    #[test]
    fn a_report_that_does_not_answer_the_action_is_refused_and_the_task_lives() {
        let (_root, built) = built_ins();
        let pod = json!({"metadata": {"name": "demo-2", "namespace": "prod", "uid": "u-1",
            "resourceVersion": "7", "annotations": {"cocoonset.cocoonstack.io/managed": "true", "vm.cocoonstack.io/id": "vm-1"}}});
        let (mut task, first) = start(&built, pod.to_string().as_bytes(), None).unwrap();
        assert!(first.contains("\"admit\""), "{first}");
        let inspect = next(&built, &mut task, r#"{"now_ms": 0, "go": true}"#).unwrap();
        assert!(inspect.contains("\"inspect\""), "{inspect}");
        for wrong in [
            r#"{"now_ms": 0, "go": true}"#,
            r#"{"now_ms": 0, "cancelled": true}"#,
            r#"{"now_ms": 0, "lease": null}"#,
        ] {
            let e = next(&built, &mut task, wrong).unwrap_err();
            assert!(e.message.contains("does not answer"), "{}", e.message);
        }
        let again = next(
            &built,
            &mut task,
            r#"{"now_ms": 0, "inspect_error": "timed out"}"#,
        )
        .unwrap();
        assert!(
            again.contains("\"finish\"") && again.contains("\"inspect\""),
            "{again}"
        );
    }

    /// A stop says when and how to start the pod's next task: the
    /// embedder only waits and starts it with the trigger and tries given;
    /// a VM the embedder knows is gone is not tried again.
    #[test]
    fn a_stop_says_when_and_how_to_try_again() {
        let (_root, built) = built_ins();
        let pod = json!({"metadata": {"name": "demo-2", "namespace": "prod", "uid": "u-1",
            "resourceVersion": "7", "annotations": {"cocoonset.cocoonstack.io/managed": "true", "vm.cocoonstack.io/id": "vm-1"}}});
        let stop_after = |options: &str, failed: &str| -> Value {
            let (mut task, _) = start(&built, pod.to_string().as_bytes(), Some(options)).unwrap();
            next(&built, &mut task, r#"{"now_ms": 0, "go": true}"#).unwrap();
            let finish: Value =
                serde_json::from_str(&next(&built, &mut task, failed).unwrap()).unwrap();
            assert_eq!(finish["action"], "finish", "{finish}");
            finish["stop"].clone()
        };
        let failed = r#"{"now_ms": 0, "inspect_error": "timed out"}"#;
        let first = stop_after(r#"{"trigger": "startup"}"#, failed);
        assert_eq!(first["kind"], "inspect");
        assert_eq!(
            first["again"],
            json!({"after_ms": 1000, "trigger": "startup", "tries": 1})
        );
        let fourth = stop_after(r#"{"trigger": "startup", "tries": 3}"#, failed);
        assert_eq!(
            fourth["again"],
            json!({"after_ms": 8000, "trigger": "startup", "tries": 4})
        );
        let gone = stop_after("{}", r#"{"now_ms": 0, "inspect_gone": "no VM vm-1"}"#);
        assert_eq!(gone["kind"], "vm-gone");
        assert_eq!(gone["retryable"], false);
        assert_eq!(gone["again"], Value::Null);
    }

    /// The binding policy is the planner's: a task's settings may not
    /// widen it.
    #[test]
    fn a_task_cannot_accept_names_its_planner_does_not() {
        let (_root, built) = built_ins();
        let pod = json!({"metadata": {"name": "demo-2", "namespace": "prod", "uid": "u-1",
            "resourceVersion": "7"}});
        for key in ["accept_legacy_vm_names", "accept_annotated_vm_names"] {
            let options = json!({"settings": {key: true}});
            let e = start(
                &built,
                pod.to_string().as_bytes(),
                Some(&options.to_string()),
            )
            .unwrap_err();
            assert!(e.message.contains(key), "{}", e.message);
            assert!(e.message.contains("cf_planner_new"), "{}", e.message);
        }
    }

    /// The task's writes are guarded by the pod's resource version: a pod
    /// without one is refused where it enters, at the start and in every
    /// report that hands over a pod.
    #[test]
    fn a_pod_without_a_resource_version_is_refused() {
        let (_root, built) = built_ins();
        let bare = json!({"metadata": {"name": "demo-2", "namespace": "prod", "uid": "u-1",
            "annotations": {"cocoonset.cocoonstack.io/managed": "true"}}});
        for version in [None, Some("")] {
            let mut pod = bare.clone();
            if let Some(v) = version {
                pod["metadata"]["resourceVersion"] = json!(v);
            }
            let e = start(&built, pod.to_string().as_bytes(), None).unwrap_err();
            assert_eq!(e.status, CfStatus::CfInvalidArgument);
            assert!(e.message.contains("resourceVersion"), "{}", e.message);
        }
        for key in ["read", "changed", "patched"] {
            let report = json!({"now_ms": 1, key: bare});
            let e = read_report(&report.to_string()).unwrap_err();
            assert!(
                e.message.contains("resourceVersion"),
                "{key}: {}",
                e.message
            );
            let mut versioned = bare.clone();
            versioned["metadata"]["resourceVersion"] = json!("8");
            let report = json!({"now_ms": 1, key: versioned});
            assert!(read_report(&report.to_string()).is_ok(), "{key}");
        }
    }

    #[test]
    fn a_report_without_its_clock_or_with_two_answers_is_refused() {
        for (text, says) in [
            (r#"{"go": true}"#, "now_ms"),
            (r#"{"now_ms": 1, "go": true, "cancelled": true}"#, "one key"),
            (r#"{"now_ms": 1, "lease": "not an ip"}"#, "dotted-quad"),
            (
                r#"{"now_ms": 1, "read_error": {"kind": "other"}}"#,
                "\"api\"",
            ),
            ("[]", "not an object"),
            (r#"{"now_ms": 1, "go": false}"#, "go is true"),
            (r#"{"now_ms": 1, "other_pods": {}}"#, "array of pods"),
            (
                r#"{"now_ms": 1, "other_pods": [{"metadata": {}}]}"#,
                "metadata.name",
            ),
        ] {
            let e = read_report(text).unwrap_err();
            assert!(e.message.contains(says), "{text}: {}", e.message);
        }
    }
}
