//! The conformance suite's format and its world: behaviour as data.
//!
//! A scenario file (`tests/conformance/*.json`, described in
//! `docs/conformance.md`) holds a pod, its VM record, what the world does
//! (exec outcomes in order, leases and when they appear, changes to the
//! pod over time, API faults, a shutdown) and what must happen: the
//! writes, events, execs and inspects, with their times, and how the work
//! ended. Every host that carries out [`PodTask`](fixup_core::decision::PodTask) replays
//! every file: [`replay`] here (the decision alone, the built-in
//! plugins), the daemon through its real executor against a mock API
//! server, the C library's op and the Go package through theirs. A change
//! in behaviour is a change in these files.
//!
//! [`World`] is the one simulation of cocoon, the API server and the
//! lease file that the replays share: each executor puts its own seam in
//! front of it (a mock API server, a fake `cocoon`, a lease watcher), so
//! they all meet the same world.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use base64::prelude::BASE64_STANDARD;
use serde::Deserialize;
use serde_json::Value;

use fixup_core::annotations::AnnotationPatch;
use fixup_core::decision::{
    Action, ExecPurpose, Guarded, PodError, PodTask, PrepareTask, RawSettings, Report, Steps, Stop,
    Summary, Trigger,
};
use fixup_core::exec::{ExecOutput, ExitStatusKind};
use fixup_core::facts::{MacAddr, PodInput, VmId, VmInspect};
use fixup_core::memory::{Listed, PodMemory, StackEvent};
use fixup_core::plan::{Nonce, done_marker, exec_nonce};
use fixup_core::planner::Planner;
use fixup_sac::SacError;
mod suite;
mod world;

pub use suite::{Suite, counting_nonces, replay, replay_owning};
pub use world::{UNUSABLE_LEASE_FILE, Waited, World, answer, ms, pod_json, task_options};

/// A scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// What the scenario is about, in one sentence.
    pub about: String,
    /// Why the host handles the pod: `event` (default), `startup`, `retry`.
    #[serde(default)]
    pub trigger: TriggerName,
    /// Settings that differ from the defaults.
    #[serde(default)]
    pub settings: RawSettings,
    /// The pod as the API server holds it when the task starts.
    pub pod: Value,
    /// `cocoon vm inspect --json` output for the VM the pod names.
    #[serde(default)]
    pub vm: Option<Value>,
    /// What the embedder knows of the VM beyond its record (only in an
    /// embedder's scenarios, `tests/conformance-embedder/`: the daemon
    /// knows only the record).
    #[serde(default)]
    pub knows: Option<fixup_core::decision::Knows>,
    /// `cocoon vm inspect` fails with this message instead.
    #[serde(default)]
    pub inspect_error: Option<String>,
    /// The other pods on the host's node (each as `pod` is given), which
    /// the host lists for an annotated VM name; absent: the host has no
    /// view of its node's pods.
    #[serde(default)]
    pub other_pods: Option<Vec<Value>>,
    /// The scenario's pod is not among the pods of the host's node (it
    /// runs on another node, or the host's view is stale).
    #[serde(default)]
    pub pod_off_node: bool,
    /// The cloudimg overlay exists in the cocoon root.
    #[serde(default)]
    pub overlay: bool,
    /// The outcome of each exec, in order (fixup attempts, the recovery
    /// pass and the renew nudge alike); past the list, every exec
    /// succeeds.
    #[serde(default)]
    pub execs: Vec<ExecScript>,
    /// Leases, and when they appear in the lease file.
    #[serde(default)]
    pub leases: Vec<LeaseScript>,
    /// The lease file holds no list of leases throughout (cocoon-net
    /// writes something else, or it cannot be read): no lease is found,
    /// and a wait that ends says why.
    #[serde(default)]
    pub lease_file_unusable: bool,
    /// Changes to the pod over time, made by others.
    #[serde(default)]
    pub changes: Vec<Change>,
    /// API requests that fail.
    #[serde(default)]
    pub faults: Vec<Fault>,
    /// The VM's serial console (spec section 10); absent: every step
    /// succeeds at once.
    #[serde(default)]
    pub sac: SacScript,
    /// The host shuts down at this time (ms).
    #[serde(default)]
    pub shutdown_at_ms: Option<u64>,
    /// The host's record of the pod when the task starts, as an earlier
    /// task kept it (`null`: the host keeps records and has none for the
    /// pod yet); absent: the host keeps no records, and each fixup loop's
    /// budget starts with its task.
    #[serde(default, deserialize_with = "present")]
    pub record: Option<Value>,
    /// The wall clock when the task starts, in milliseconds since the Unix
    /// epoch (what a kept budget is measured against).
    #[serde(default = "default_wall_start")]
    pub wall_start_ms: u64,
    /// The host's watch has seen the pod without a gap since it was new
    /// (kept in the host's memory only, beside `record`).
    #[serde(default)]
    pub watched_since_new: bool,
    /// The events about the pod the API server holds (events.k8s.io/v1),
    /// each from the time it is created.
    #[serde(default)]
    pub events: Vec<EventScript>,
    /// Listing the pod's events fails (no `list` on events, say).
    #[serde(default)]
    pub events_unreadable: bool,
    pub expect: Expect,
}

/// An event about the pod (or about another, by `regarding_uid`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventScript {
    pub reason: String,
    #[serde(rename = "type")]
    pub type_: String,
    /// `reportingController` (default: the stack's own, `vk-cocoon`).
    #[serde(default = "stack_controller")]
    pub reporting_controller: String,
    /// `regarding.uid` (default: the pod's).
    #[serde(default)]
    pub regarding_uid: Option<String>,
    /// When the event is created, on the task's clock (ms).
    #[serde(default)]
    pub at_ms: u64,
    /// Its newest occurrence, in ms since the Unix epoch (default: the
    /// wall clock when it is created).
    #[serde(default)]
    pub newest_unix_ms: Option<i64>,
    /// How many such events there are (default 1): a flood in one line.
    #[serde(default = "one_event")]
    pub count: usize,
}

fn one_event() -> usize {
    1
}

pub use fixup_core::memory::evidence::LISTED_AT_MOST;

fn stack_controller() -> String {
    "vk-cocoon".to_owned()
}

/// A key that is present, even as `null`, is `Some`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

fn default_wall_start() -> u64 {
    1_700_000_000_000
}

/// How the VM's serial console answers.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SacScript {
    /// The interfaces the console lists (default: 7, 8, ... one per NIC).
    #[serde(default)]
    pub nets: Option<Vec<u32>>,
    /// Opening the console (dial, prompt, listing) fails this way.
    #[serde(default)]
    pub open_error: Option<SacFault>,
    /// How long opening takes (ms).
    #[serde(default)]
    pub open_ms: u64,
    /// Each set in order; past the list every set takes effect at once.
    #[serde(default)]
    pub sets: Vec<SacSetScript>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SacSetScript {
    #[serde(default)]
    pub error: Option<SacFault>,
    #[serde(default)]
    pub takes_ms: u64,
}

/// A console failure: `dial`, `enum`, `set`, `verify` (the four of spec
/// section 10) or `refused` (a console path the host will not use).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SacFault {
    pub kind: SacFaultKind,
    #[serde(default)]
    pub cause: String,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum SacFaultKind {
    Dial,
    Enum,
    Set,
    Verify,
    Refused,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum TriggerName {
    #[default]
    Event,
    Startup,
    Retry,
    /// Not a fixup: the pod's VM is prepared as a parent
    /// ([`PrepareTask`](fixup_core::decision::PrepareTask)).
    Prepare,
}

impl TriggerName {
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerName::Event => "event",
            TriggerName::Startup => "startup",
            TriggerName::Retry => "retry",
            TriggerName::Prepare => "prepare",
        }
    }

    /// [`Stop::again`] for a task of this trigger after no stop in a row,
    /// as JSON: a preparation's is tried again as one (`"prepare"`).
    pub fn again(self, stop: &Stop) -> Value {
        stop.again_json(self.fixup(), 0)
    }

    /// The trigger of a fixup; `None` for a preparation.
    pub fn fixup(self) -> Option<Trigger> {
        match self {
            TriggerName::Event => Some(Trigger::Event),
            TriggerName::Startup => Some(Trigger::Startup),
            TriggerName::Retry => Some(Trigger::Retry),
            TriggerName::Prepare => None,
        }
    }
}

/// One exec's outcome.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecScript {
    /// The guest's exit code (default 0: the script ran to completion and
    /// wrote its done marker).
    #[serde(default)]
    pub exit: i32,
    /// `cocoon vm exec` was killed by this signal instead (`exit` is then
    /// not read; no done marker).
    #[serde(default)]
    pub signal: Option<i32>,
    /// What the exec wrote on stderr (besides the done marker of a
    /// successful one).
    #[serde(default)]
    pub stderr: String,
    /// `cocoon vm exec` itself fails with this message.
    #[serde(default)]
    pub error: Option<String>,
    /// How long the exec takes (ms); past its timeout it is stopped.
    #[serde(default)]
    pub takes_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseScript {
    pub mac: String,
    pub ip: Ipv4Addr,
    #[serde(default)]
    pub at_ms: u64,
}

/// A change to the pod by someone else, at a time.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Change {
    pub at_ms: u64,
    /// Annotations set (a string) or removed (null).
    #[serde(default)]
    pub annotations: BTreeMap<String, Option<String>>,
    /// The pod's deletion starts.
    #[serde(default)]
    pub deleting: bool,
    /// The pod is deleted.
    #[serde(default)]
    pub deleted: bool,
    /// The pod is deleted and created again under its name (a new uid).
    #[serde(default)]
    pub recreated: bool,
}

/// API requests that fail: the `nth` (1-based) request of its kind, and
/// the `count - 1` after it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    pub request: RequestKind,
    pub nth: u32,
    #[serde(default = "one")]
    pub count: u32,
    pub answer: FaultAnswer,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum RequestKind {
    Read,
    Patch,
    Event,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum FaultAnswer {
    /// The API server cannot be reached (after the client's retries).
    Unavailable,
    /// Refused for good (403).
    Refused,
}

impl SacFault {
    /// The console client's error for this fault, in a step that needed
    /// `need` interfaces or set `ip` on `net`.
    fn error(&self, need: usize, net: u32, ip: Ipv4Addr) -> SacError {
        let cause = self.cause.clone();
        match self.kind {
            SacFaultKind::Dial => SacError::Dial { cause },
            SacFaultKind::Enum => SacError::EnumExhausted { found: 0, need },
            SacFaultKind::Set => SacError::SetIp { net, cause },
            SacFaultKind::Verify => SacError::VerifyExhausted { net, ip },
            SacFaultKind::Refused => SacError::Refused {
                path: std::path::PathBuf::from("run/cloudhypervisor/console.sock"),
                problem: cause,
                fix: "make it the VM's console socket",
            },
        }
    }
}

/// What must happen.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// How the work ended: a subset of the summary's JSON (`action`,
    /// `fixup`, `attempts`, `readiness`, `ip`, `rule`, `scenario`,
    /// `hands_off`, `errors`), or `{"stop": kind, "retryable": bool}`.
    pub result: Value,
    /// What the host did that others see, in order.
    pub trace: Vec<Expected>,
    /// The fixup loop's budget in the host's record at the end: `null`
    /// for none, or an object whose keys (`vm`, `first_attempt_unix_ms`,
    /// `attempts`, `errors`) must hold those values; absent: not compared.
    #[serde(default, deserialize_with = "present")]
    pub budget: Option<Value>,
    /// The wake verdict in the host's record at the end: `null` for none,
    /// or an object whose keys (`vm`, `wake`, `by`) must hold those
    /// values; absent: not compared.
    #[serde(default, deserialize_with = "present")]
    pub verdict: Option<Value>,
    /// The VM the host's record says its last `post-clone-state` write was
    /// for (`null`: none); absent: not compared.
    #[serde(default, deserialize_with = "present")]
    pub marker_vm: Option<Value>,
}

/// One expected entry: exactly one of `inspect`, `write`, `exec`, `event`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expected {
    #[serde(default)]
    pub at_ms: Option<u64>,
    #[serde(default)]
    pub inspect: Option<String>,
    /// The annotations the write must carry (null: removed); other keys
    /// the write carries are not compared.
    #[serde(default)]
    pub write: Option<BTreeMap<String, Option<String>>>,
    /// Annotation keys the write must not touch at all (neither set nor
    /// removed).
    #[serde(default)]
    pub write_lacks: Vec<String>,
    /// Text the write's `post-clone-hint`, base64-decoded, contains.
    #[serde(default)]
    pub hint_has: Option<String>,
    /// The plugin the write's `vm.cocoonstack.io/prepared` names (its
    /// version and digest are the build's, so not compared); a write
    /// with only this given matches any other keys.
    #[serde(default)]
    pub prepared_by: Option<String>,
    #[serde(default)]
    pub exec: Option<ExecPurpose>,
    /// The VM an exec runs in.
    #[serde(default)]
    pub vm: Option<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub event: Option<String>,
    /// A serial-console step: `open` (with `vm`) or `set` (with `net` and
    /// `ip`).
    #[serde(default)]
    pub sac: Option<String>,
    #[serde(default)]
    pub net: Option<u32>,
    #[serde(default)]
    pub ip: Option<Ipv4Addr>,
    /// The event's message, exactly.
    #[serde(default)]
    pub message: Option<String>,
    /// Text the event's message contains.
    #[serde(default)]
    pub message_has: Option<String>,
    /// Text the event's message must not contain (another VM's name).
    #[serde(default)]
    pub message_lacks: Option<String>,
}

/// What the host did, as the world saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    Inspect {
        at_ms: u64,
        vm: String,
    },
    /// A write that landed.
    Write {
        at_ms: u64,
        patch: AnnotationPatch,
    },
    Exec {
        at_ms: u64,
        vm: String,
        purpose: ExecPurpose,
        timeout_ms: u64,
    },
    Event {
        at_ms: u64,
        reason: String,
        message: String,
    },
    SacOpen {
        at_ms: u64,
        vm: String,
    },
    SacSet {
        at_ms: u64,
        net: u32,
        ip: Ipv4Addr,
    },
}

impl std::fmt::Display for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Seen::Inspect { at_ms, vm } => write!(f, "{at_ms:>7} ms  inspect {vm}"),
            Seen::Write { at_ms, patch } => {
                write!(f, "{at_ms:>7} ms  write")?;
                for (k, v) in patch {
                    match v {
                        Some(v) if v.len() > 60 => write!(f, " {k}=<{} bytes>", v.len())?,
                        Some(v) => write!(f, " {k}={v:?}")?,
                        None => write!(f, " {k}=null")?,
                    }
                }
                Ok(())
            }
            Seen::Exec {
                at_ms,
                vm,
                purpose,
                timeout_ms,
            } => write!(
                f,
                "{at_ms:>7} ms  exec {purpose:?} in {vm} timeout {timeout_ms} ms"
            ),
            Seen::Event {
                at_ms,
                reason,
                message,
            } => write!(f, "{at_ms:>7} ms  event {reason}: {message}"),
            Seen::SacOpen { at_ms, vm } => write!(f, "{at_ms:>7} ms  sac open {vm}"),
            Seen::SacSet { at_ms, net, ip } => write!(f, "{at_ms:>7} ms  sac set net {net} {ip}"),
        }
    }
}

impl Expected {
    /// Whether `seen` is what this step expects (its time included,
    /// when it names one).
    pub fn matches(&self, seen: &Seen) -> bool {
        let at = match seen {
            Seen::Inspect { at_ms, .. }
            | Seen::Write { at_ms, .. }
            | Seen::Exec { at_ms, .. }
            | Seen::Event { at_ms, .. }
            | Seen::SacOpen { at_ms, .. }
            | Seen::SacSet { at_ms, .. } => *at_ms,
        };
        if self.at_ms.is_some_and(|t| t != at) {
            return false;
        }
        match seen {
            Seen::Inspect { vm, .. } => self.inspect.as_deref() == Some(vm.as_str()),
            Seen::Write { patch, .. } => {
                (self.write.is_some() || self.prepared_by.is_some())
                    && self
                        .write
                        .as_ref()
                        .is_none_or(|want| want.iter().all(|(k, v)| patch.get(k) == Some(v)))
                    && self.prepared_by.as_ref().is_none_or(|plugin| {
                        patch
                            .get(fixup_core::annotations::keys::PREPARED)
                            .and_then(|v| v.as_deref())
                            .and_then(fixup_core::decision::Prepared::parse)
                            .is_some_and(|p| p.plugin == *plugin)
                    })
                    && self.write_lacks.iter().all(|k| !patch.contains_key(k))
                    && self.hint_has.as_ref().is_none_or(|text| {
                        patch
                            .get(fixup_core::annotations::keys::POST_CLONE_HINT)
                            .and_then(|hint| hint.as_deref())
                            .and_then(|hint| BASE64_STANDARD.decode(hint).ok())
                            .is_some_and(|script| {
                                String::from_utf8_lossy(&script).contains(text.as_str())
                            })
                    })
            }
            Seen::Exec {
                vm,
                purpose,
                timeout_ms,
                ..
            } => {
                self.exec == Some(*purpose)
                    && self.vm.as_ref().is_none_or(|v| v == vm)
                    && self.timeout_ms.is_none_or(|t| t == *timeout_ms)
            }
            Seen::SacOpen { vm, .. } => {
                self.sac.as_deref() == Some("open") && self.vm.as_ref().is_none_or(|v| v == vm)
            }
            Seen::SacSet { net, ip, .. } => {
                self.sac.as_deref() == Some("set")
                    && self.net.is_none_or(|n| n == *net)
                    && self.ip.is_none_or(|i| i == *ip)
            }
            Seen::Event {
                reason, message, ..
            } => {
                self.event.as_deref() == Some(reason.as_str())
                    && self.message.as_ref().is_none_or(|m| m == message)
                    && self
                        .message_has
                        .as_ref()
                        .is_none_or(|m| message.contains(m.as_str()))
                    && self
                        .message_lacks
                        .as_ref()
                        .is_none_or(|m| !message.contains(m.as_str()))
            }
        }
    }
}

/// How a replay ended: the summary's JSON, or the stop's kind, whether
/// it is retryable and its `again` as the C library writes it (null when
/// trying again cannot help).
#[derive(Debug, Clone, PartialEq)]
pub enum Ended {
    Summary(Value),
    Stop {
        kind: &'static str,
        retryable: bool,
        again: Value,
    },
}

impl Ended {
    /// From the task's last action, for a task started with `trigger`
    /// after no stop in a row.
    pub fn of(result: &Result<Summary, Stop>, trigger: TriggerName) -> Ended {
        match result {
            Ok(summary) => {
                Ended::Summary(serde_json::to_value(summary).expect("a summary is JSON"))
            }
            Err(stop) => Ended::Stop {
                kind: stop.kind(),
                retryable: stop.is_retryable(),
                again: trigger.again(stop),
            },
        }
    }
}

impl Scenario {
    /// Read a scenario file.
    pub fn read(path: &Path) -> Result<Scenario, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Every scenario file in `dir`, sorted by name.
    pub fn all(dir: &Path) -> Result<Vec<(PathBuf, Scenario)>, String> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        paths
            .into_iter()
            .map(|p| Scenario::read(&p).map(|s| (p, s)))
            .collect()
    }

    /// The pod as the task starts with it.
    /// The scenario's settings (a value below its floor is a mistake in
    /// the file).
    pub fn settings(&self) -> fixup_core::decision::Settings {
        self.settings
            .builder()
            .build()
            .unwrap_or_else(|e| panic!("{}: {e}", self.about))
    }

    pub fn pod_input(&self) -> PodInput {
        PodInput::from_value(&self.pod, "pod").expect("a scenario's pod is a pod")
    }

    /// Check what a replay saw and how it ended against `expect`: `Err`
    /// with a readable account of the difference.
    pub fn check(&self, world: &World, ended: &Ended) -> Result<(), String> {
        let seen = &world.seen[..];
        let mut problems = Vec::new();
        let record = world.record.as_ref();
        let json = |value: Option<Value>| value.unwrap_or(Value::Null);
        for (what, want, got) in [
            (
                "budget",
                &self.expect.budget,
                json(
                    record
                        .and_then(|r| r.budget())
                        .map(|b| serde_json::to_value(b).expect("a budget is JSON")),
                ),
            ),
            (
                "verdict",
                &self.expect.verdict,
                json(
                    record
                        .and_then(|r| r.verdict())
                        .map(|v| serde_json::to_value(v).expect("a verdict is JSON")),
                ),
            ),
            (
                "marker_vm",
                &self.expect.marker_vm,
                json(record.and_then(|r| r.marker_vm()).map(Value::from)),
            ),
        ] {
            let Some(want) = want else { continue };
            let agrees = match (want, &got) {
                (Value::Object(want), Value::Object(got)) => {
                    want.iter().all(|(k, v)| got.get(k) == Some(v))
                }
                (want, got) => want == got,
            };
            if !agrees {
                problems.push(format!("the record's {what} is {got}, expected {want}"));
            }
        }
        match (&self.expect.result.get("stop"), ended) {
            (
                Some(kind),
                Ended::Stop {
                    kind: got,
                    retryable,
                    again,
                },
            ) => {
                if kind.as_str() != Some(got) {
                    problems.push(format!("stopped as {got}, expected {kind}"));
                }
                if let Some(r) = self.expect.result.get("retryable")
                    && r.as_bool() != Some(*retryable)
                {
                    problems.push(format!("retryable is {retryable}, expected {r}"));
                }
                if let Some(want) = self.expect.result.get("again")
                    && want != again
                {
                    problems.push(format!("again is {again}, expected {want}"));
                }
            }
            (None, Ended::Summary(summary)) => {
                for (key, want) in self.expect.result.as_object().into_iter().flatten() {
                    let got = summary.get(key).unwrap_or(&Value::Null);
                    if got != want {
                        problems.push(format!("result {key} is {got}, expected {want}"));
                    }
                }
            }
            (_, ended) => problems.push(format!(
                "ended as {ended:?}, expected {}",
                self.expect.result
            )),
        }
        let same = seen.len() == self.expect.trace.len()
            && seen
                .iter()
                .zip(&self.expect.trace)
                .all(|(s, e)| e.matches(s));
        if !same {
            let mut text = String::from("the trace differs; seen:\n");
            for (i, s) in seen.iter().enumerate() {
                let mark = match self.expect.trace.get(i) {
                    Some(e) if e.matches(s) => "   ",
                    _ => "!! ",
                };
                text.push_str(&format!("{mark}{s}\n"));
            }
            text.push_str("expected:\n");
            for e in &self.expect.trace {
                text.push_str(&format!("    {e:?}\n"));
            }
            problems.push(text);
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }
}
