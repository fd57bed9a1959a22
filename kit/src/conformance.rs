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
    Action, ExecPurpose, Guarded, PodError, PodTask, PrepareTask, Report, SettingsMs, Steps, Stop,
    Summary, Trigger,
};
use fixup_core::exec::{ExecOutput, ExitStatusKind};
use fixup_core::facts::{MacAddr, PodInput, VmId, VmInspect};
use fixup_core::memory::{Listed, PodMemory, StackEvent};
use fixup_core::plan::{Nonce, done_marker, exec_nonce};
use fixup_core::planner::Planner;
use fixup_sac::SacError;

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
    pub settings: SettingsMs,
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

/// How a replay ended: the summary's JSON, or the stop's kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Ended {
    Summary(Value),
    Stop { kind: &'static str, retryable: bool },
}

impl Ended {
    /// From the task's last action.
    pub fn of(result: &Result<Summary, Stop>) -> Ended {
        match result {
            Ok(summary) => {
                Ended::Summary(serde_json::to_value(summary).expect("a summary is JSON"))
            }
            Err(stop) => Ended::Stop {
                kind: stop.kind(),
                retryable: stop.is_retryable(),
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

/// The simulated cocoon, API server and lease file of a scenario.
#[derive(Debug)]
pub struct World {
    scenario: Scenario,
    /// The pod as the API server holds it now; `None` when deleted.
    pod: Option<PodInput>,
    version: u64,
    /// Changes not made yet, soonest first.
    changes: Vec<Change>,
    execs_done: usize,
    sac_sets_done: usize,
    requests: BTreeMap<&'static str, u32>,
    /// What the host did that others see.
    pub seen: Vec<Seen>,
    /// What the host told its operator (for a failing scenario's report).
    pub notes: Vec<String>,
    /// The host's record of the pod, as last kept; `None` when the host
    /// keeps no records ([`Scenario::record`]).
    pub record: Option<PodMemory>,
    /// The host's last request was a write that landed: a lifecycle
    /// change published now belongs to it ([`World::publish`]).
    just_wrote: bool,
}

/// The report (JSON, without `now_ms`) of a task-op action (JSON, as the
/// C library and the JSON ops hand it out) carried out against `world`
/// from `*now`, as an embedder would; `*now` moves to the action's end.
/// `None` for `finish`, with how the task ended. The C op's replay and the
/// Go package's (through `conformance-world`) both answer with it.
pub fn answer(world: &mut World, now: &mut Duration, action: &Value) -> Result<Value, Ended> {
    use fixup_core::decision::reports::{
        intent_from_json, pod_error_json, ran_json, sac_error_json,
    };
    use serde_json::json;
    let a = action;
    let str_of = |key: &str| a[key].as_str().unwrap_or_default().to_owned();
    let ms_of = |key: &str| Duration::from_millis(a[key].as_u64().expect("a time in ms"));
    let kind = str_of("action");
    let interruptible = matches!(
        kind.as_str(),
        "admit" | "checkpoint" | "exec" | "wait_lease" | "sleep" | "sac_open" | "sac_set"
    );
    fn waited<T>(waited: Waited<T>, report: impl FnOnce(T) -> Value) -> Value {
        match waited {
            Waited::Done(value) => report(value),
            Waited::Cancelled => json!({"cancelled": true}),
        }
    }
    if kind == "publish" {
        let intent = intent_from_json(a);
        world.publish(*now, &intent.patch());
        return Ok(json!({"go": true}));
    }
    world.not_publishing();
    if kind == "finish" {
        return Err(match a.get("stop") {
            Some(stop) => Ended::Stop {
                kind: Box::leak(
                    stop["kind"]
                        .as_str()
                        .expect("a stop has a kind")
                        .to_owned()
                        .into_boxed_str(),
                ),
                retryable: stop["retryable"].as_bool().expect("a stop says retryable"),
            },
            None => Ended::Summary(a["summary"].clone()),
        });
    }
    if interruptible && world.down(*now) {
        return Ok(json!({"cancelled": true}));
    }
    Ok(match kind.as_str() {
        "admit" | "release" | "checkpoint" | "note" | "sac_close" => json!({"go": true}),
        "remember" => {
            let record = a["record"].to_string();
            world.remember(PodMemory::from_json(record.as_bytes()).expect("a record"));
            json!({"go": true})
        }
        "sac_open" => {
            let need = usize::try_from(a["need"].as_u64().expect("need")).expect("need");
            let deadline = (ms_of("until_ms"), ms_of("total_ms"));
            waited(
                world.sac_open_until(now, &str_of("vm"), need, deadline),
                |result| match result {
                    Ok(nets) => json!({"sac_opened": nets}),
                    Err(e) => json!({"sac_open_error": sac_error_json(&e)}),
                },
            )
        }
        "sac_set" => {
            let net = u32::try_from(a["net"].as_u64().expect("net")).expect("net");
            let ip = str_of("ip").parse().expect("an address");
            let deadline = (ms_of("until_ms"), ms_of("total_ms"));
            waited(
                world.sac_set_until(now, net, ip, deadline),
                |result| match result {
                    Ok(()) => json!({"sac_set": true}),
                    Err(e) => json!({"sac_set_error": sac_error_json(&e)}),
                },
            )
        }
        "tell" => {
            let _ = world.event(*now, &str_of("reason"), &str_of("message"));
            json!({"go": true})
        }
        "inspect" => match world.inspect(*now, &VmId::parse(&str_of("vm")).expect("a VM id")) {
            Ok(_) => json!({"inspected": world.scenario.vm.clone().expect("a record")}),
            Err(e) => json!({"inspect_error": e}),
        },
        "wake_events" => match world.events_of(
            *now,
            &serde_json::from_value::<Vec<String>>(a["field_selectors"].clone())
                .expect("wake_events names its field selectors"),
        ) {
            Ok(listed) => {
                let events: Vec<Value> = listed.events.iter().map(StackEvent::to_value).collect();
                // A listing cut short says so under its own key.
                if listed.truncated {
                    json!({ "events_truncated": events })
                } else {
                    json!({ "events": events })
                }
            }
            Err(e) => json!({"events_error": e}),
        },
        "other_pods" => match world.other_pods() {
            Ok(pods) => json!({"other_pods": pods.iter().map(pod_json).collect::<Vec<_>>()}),
            Err(e) => json!({"other_pods_error": e}),
        },
        "read" => match world.read(*now) {
            Ok(pod) => json!({"read": pod.as_ref().map(pod_json)}),
            Err(e) => json!({"read_error": pod_error_json(&e)}),
        },
        "patch" => {
            let patch = serde_json::from_value(a["annotations"].clone()).expect("a patch");
            let version = a["resource_version"].as_str();
            match world.patch(*now, &str_of("uid"), &patch, version) {
                Ok(Guarded::Written(pod)) => json!({"patched": pod.as_ref().map(pod_json)}),
                Ok(Guarded::Changed(pod)) => json!({"changed": pod_json(&pod)}),
                Err(e) => json!({"patch_error": pod_error_json(&e)}),
            }
        }
        "exec" => {
            let argv: Vec<String> = serde_json::from_value(a["argv"].clone()).expect("an argv");
            let purpose: ExecPurpose = match a.get("purpose") {
                Some(purpose) => serde_json::from_value(purpose.clone()).expect("a purpose"),
                None => world.purpose_of(&argv),
            };
            let timeout = ms_of("timeout_ms");
            waited(
                world.exec_until(now, &str_of("vm"), purpose, &argv, timeout),
                |result| match result {
                    Ok(out) => json!({"ran": ran_json(&out)}),
                    Err(e) => json!({"exec_error": e}),
                },
            )
        }
        "sleep" => waited(
            world.sleep_until(now, ms_of("until_ms")),
            |()| json!({"go": true}),
        ),
        "wait_lease" => {
            let mac = MacAddr::parse(&str_of("mac")).expect("a MAC");
            waited(
                world.lease_until(now, &mac, ms_of("until_ms")),
                |found| match found {
                    Ok(ip) => json!({"lease": ip.map(|ip| ip.to_string())}),
                    Err(why) => json!({"lease_error": why}),
                },
            )
        }
        other => panic!("unknown action {other:?}"),
    })
}

/// The options a task of the C library's op (`cf_task_start`'s
/// `options_json`) starts with for `scenario` in `world`: its trigger, its
/// settings (the binding policy is the planner's, so not among them) and,
/// when the host keeps records, the record and the wall clock. Shared by
/// the C op's replay and `conformance-world`.
pub fn task_options(world: &World, scenario: &Scenario) -> Value {
    let mut options = serde_json::json!({
        "trigger": scenario.trigger.as_str(),
        "settings": SettingsMs {
            accept_legacy_vm_names: false,
            accept_annotated_vm_names: false,
            ..scenario.settings.clone()
        },
        "now_unix_ms": scenario.wall_start_ms,
    });
    if let Some(knows) = &scenario.knows {
        options["knows"] = serde_json::to_value(knows).expect("what the embedder knows is JSON");
    }
    if let Some((record, wall)) = world.start_record() {
        options["memory"] = serde_json::json!({
            "record": record,
            "now_unix_ms": wall,
            "watched_since_new": scenario.watched_since_new,
        });
    }
    options
}

/// Milliseconds of a duration, for traces.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl World {
    pub fn new(scenario: &Scenario) -> World {
        let mut pod = scenario.pod_input();
        pod.resource_version = Some("1".to_owned());
        let mut changes = scenario.changes.clone();
        changes.sort_by_key(|c| c.at_ms);
        World {
            scenario: scenario.clone(),
            pod: Some(pod),
            version: 1,
            changes,
            execs_done: 0,
            sac_sets_done: 0,
            requests: BTreeMap::new(),
            seen: Vec::new(),
            notes: Vec::new(),
            record: scenario.record.as_ref().map(|record| {
                let mut memory = match record {
                    Value::Null => PodMemory::new(),
                    record => PodMemory::from_json(record.to_string().as_bytes())
                        .expect("a scenario's record is a record"),
                };
                memory.set_watched_since_new(scenario.watched_since_new);
                memory
            }),
            just_wrote: false,
        }
    }

    /// The record and the wall clock a task starts with, when the host
    /// keeps records.
    pub fn start_record(&self) -> Option<(PodMemory, u64)> {
        let record = self.record.clone()?;
        Some((record, self.scenario.wall_start_ms))
    }

    /// The host kept `record`.
    pub fn remember(&mut self, record: PodMemory) {
        self.record = Some(record);
    }

    /// The pod as the host first read it (not counted as a request: an
    /// embedder may hand the task a pod it already holds).
    pub fn first_read(&self) -> PodInput {
        self.pod.clone().expect("the pod exists at the start")
    }

    /// Make every change due at `now`.
    pub fn advance(&mut self, now: Duration) {
        let now = ms(now);
        while self.changes.first().is_some_and(|c| c.at_ms <= now) {
            let change = self.changes.remove(0);
            let Some(pod) = self.pod.as_mut() else {
                continue;
            };
            for (k, v) in &change.annotations {
                match v {
                    Some(v) => pod.annotations.insert(k.clone(), v.clone()),
                    None => pod.annotations.remove(k),
                };
            }
            if change.deleting {
                pod.deleting = true;
            }
            if change.recreated {
                let uid = pod.uid.clone().unwrap_or_default();
                pod.uid = Some(format!("{uid}-again"));
                pod.annotations = self.scenario.pod_input().annotations;
                pod.deleting = false;
            }
            self.version += 1;
            pod.resource_version = Some(self.version.to_string());
            if change.deleted {
                self.pod = None;
            }
        }
    }

    fn fault(&mut self, kind: RequestKind) -> Option<PodError> {
        let key = match kind {
            RequestKind::Read => "read",
            RequestKind::Patch => "patch",
            RequestKind::Event => "event",
        };
        let n = self.requests.entry(key).or_default();
        *n += 1;
        let n = *n;
        let pod = self.label();
        self.scenario
            .faults
            .iter()
            .find(|f| f.request == kind && n >= f.nth && n < f.nth + f.count)
            .map(|f| match f.answer {
                FaultAnswer::Unavailable => PodError::Api {
                    pod,
                    reason: "the API server is unavailable".to_owned(),
                },
                FaultAnswer::Refused => PodError::Refused {
                    pod,
                    reason: "403 Forbidden".to_owned(),
                },
            })
    }

    fn label(&self) -> String {
        let pod = self.scenario.pod_input();
        format!("{}/{}", pod.namespace, pod.name)
    }

    /// The pod by name, now.
    pub fn read(&mut self, now: Duration) -> Result<Option<PodInput>, PodError> {
        self.advance(now);
        if let Some(e) = self.fault(RequestKind::Read) {
            return Err(e);
        }
        Ok(self.pod.clone())
    }

    /// A merge patch of annotations under the uid precondition of `uid`,
    /// and the `resource_version` one when given.
    pub fn patch(
        &mut self,
        now: Duration,
        uid: &str,
        patch: &AnnotationPatch,
        resource_version: Option<&str>,
    ) -> Result<Guarded, PodError> {
        self.advance(now);
        if let Some(e) = self.fault(RequestKind::Patch) {
            return Err(e);
        }
        let gone = PodError::Gone { pod: self.label() };
        let Some(pod) = self.pod.as_mut() else {
            return Err(gone);
        };
        if pod.uid.as_deref() != Some(uid) {
            return Err(gone);
        }
        if let Some(version) = resource_version
            && Some(version) != pod.resource_version.as_deref()
        {
            return Ok(Guarded::Changed(pod.clone()));
        }
        merge(pod, &mut self.version, patch);
        self.seen.push(Seen::Write {
            at_ms: ms(now),
            patch: patch.clone(),
        });
        self.just_wrote = true;
        Ok(Guarded::Written(Some(pod.clone())))
    }

    /// The embedder publishing a lifecycle change (`patch`: its keys), as
    /// an embedder that owns the lifecycle does: written as it is, without
    /// preconditions. Seen as part of the host's write it goes with when
    /// that write was the host's last request, else as a write of its own:
    /// so the same expected trace holds whoever writes the lifecycle.
    pub fn publish(&mut self, now: Duration, patch: &AnnotationPatch) {
        self.advance(now);
        let with_last = std::mem::take(&mut self.just_wrote);
        let Some(pod) = self.pod.as_mut() else {
            return;
        };
        merge(pod, &mut self.version, patch);
        match self.seen.last_mut() {
            Some(Seen::Write { patch: last, .. }) if with_last => last.extend(patch.clone()),
            _ => self.seen.push(Seen::Write {
                at_ms: ms(now),
                patch: patch.clone(),
            }),
        }
    }

    /// Any request but a publish: a lifecycle change published after it
    /// is a write of its own.
    pub fn not_publishing(&mut self) {
        self.just_wrote = false;
    }

    /// An event about the pod; a failure is the host's to log.
    pub fn event(&mut self, now: Duration, reason: &str, message: &str) -> Result<(), PodError> {
        self.advance(now);
        if let Some(e) = self.fault(RequestKind::Event) {
            return Err(e);
        }
        self.seen.push(Seen::Event {
            at_ms: ms(now),
            reason: reason.to_owned(),
            message: message.to_owned(),
        });
        Ok(())
    }

    /// What an exec is for, as a stand-in for `cocoon` that sees only the
    /// argv tells it: the renew nudge by its command, the recovery pass by
    /// the event told just before it, else a fixup attempt.
    pub fn purpose_of(&self, argv: &[String]) -> ExecPurpose {
        if self.scenario.trigger == TriggerName::Prepare {
            return ExecPurpose::Prepare;
        }
        // Written out, not taken from the decision: a change of the
        // nudge's argv must show in the replays.
        if argv == ["cmd", "/c", "ipconfig /renew"] {
            return ExecPurpose::Renew;
        }
        match self.seen.last() {
            Some(Seen::Event { reason, .. })
                if reason == fixup_core::annotations::reasons::DHCP_RECOVERY =>
            {
                ExecPurpose::Recovery
            }
            _ => ExecPurpose::Fixup,
        }
    }

    /// The pods the host sees on its node: the scenario's pod as it is
    /// now (a watch sees it too) unless `pod_off_node`, then `other_pods`;
    /// or why it sees none.
    pub fn other_pods(&self) -> Result<Vec<PodInput>, String> {
        let others = self
            .scenario
            .other_pods
            .as_ref()
            .ok_or_else(|| "the host has no view of its node's pods".to_owned())?;
        let mut pods: Vec<PodInput> = if self.scenario.pod_off_node {
            Vec::new()
        } else {
            self.pod.iter().cloned().collect()
        };
        for (i, pod) in others.iter().enumerate() {
            let input = format!("other_pods[{i}]");
            pods.push(PodInput::from_value(pod, &input).unwrap_or_else(|e| panic!("{e}")));
        }
        Ok(pods)
    }

    /// The events the API server holds at `now` that `selector` (a field
    /// selector of events.k8s.io/v1) selects, first created first and at
    /// most [`LISTED_AT_MOST`], and whether more matched; or why they
    /// cannot be listed.
    pub fn events(&self, now: Duration, selector: &str) -> Result<Listed, String> {
        if self.scenario.events_unreadable {
            return Err("events.k8s.io \"events\" is forbidden: cannot list resource \"events\" in the namespace".to_owned());
        }
        let now = ms(now);
        let wall = i64::try_from(self.scenario.wall_start_ms).unwrap_or(i64::MAX);
        let own = self
            .pod
            .as_ref()
            .and_then(|p| p.uid.clone())
            .unwrap_or_default();
        let mut listed = Vec::new();
        for e in self.scenario.events.iter().filter(|e| e.at_ms <= now) {
            let event = StackEvent {
                reason: e.reason.clone(),
                type_: e.type_.clone(),
                reporting_controller: e.reporting_controller.clone(),
                regarding_uid: e.regarding_uid.clone().unwrap_or_else(|| own.clone()),
                newest_unix_ms: Some(
                    e.newest_unix_ms
                        .unwrap_or(wall.saturating_add(i64::try_from(e.at_ms).unwrap_or(0))),
                ),
            };
            if fixup_core::memory::evidence::selects(selector, &event)? {
                listed.extend(std::iter::repeat_n(event, e.count));
            }
        }
        let truncated = listed.len() > LISTED_AT_MOST;
        listed.truncate(LISTED_AT_MOST);
        Ok(Listed {
            events: listed,
            truncated,
        })
    }

    /// Every listing of `selectors`, together, as a host reports them.
    pub fn events_of(&self, now: Duration, selectors: &[String]) -> Result<Listed, String> {
        let mut all = Listed::default();
        for selector in selectors {
            let listed = self.events(now, selector)?;
            all.events.extend(listed.events);
            all.truncated |= listed.truncated;
        }
        Ok(all)
    }

    /// `cocoon vm inspect`.
    pub fn inspect(&mut self, now: Duration, vm: &VmId) -> Result<VmInspect, String> {
        self.seen.push(Seen::Inspect {
            at_ms: ms(now),
            vm: vm.as_str().to_owned(),
        });
        if let Some(e) = &self.scenario.inspect_error {
            return Err(e.clone());
        }
        let record = self
            .scenario
            .vm
            .as_ref()
            .ok_or_else(|| format!("no VM {vm}"))?;
        VmInspect::from_value(record, "vm").map_err(|e| e.to_string())
    }

    /// `cocoon vm exec`: how long it takes (never past `timeout`) and its
    /// output. A successful exec of a script writes the done marker of
    /// the nonce its argv carries.
    pub fn exec(
        &mut self,
        now: Duration,
        vm: &str,
        purpose: ExecPurpose,
        argv: &[String],
        timeout: Duration,
    ) -> (Duration, Result<ExecOutput, String>) {
        self.seen.push(Seen::Exec {
            at_ms: ms(now),
            vm: vm.to_owned(),
            purpose,
            timeout_ms: ms(timeout),
        });
        let script = self
            .scenario
            .execs
            .get(self.execs_done)
            .cloned()
            .unwrap_or_default();
        self.execs_done += 1;
        let takes = Duration::from_millis(script.takes_ms);
        if takes > timeout {
            return (
                timeout,
                Err(format!("cocoon vm exec timed out after {}ms", ms(timeout))),
            );
        }
        if let Some(e) = script.error {
            return (takes, Err(e));
        }
        let mut stderr = script.stderr.into_bytes();
        let status = match script.signal {
            Some(signal) => ExitStatusKind::Signal(signal),
            None => ExitStatusKind::Code(script.exit),
        };
        if status == ExitStatusKind::Code(0)
            && let Some(nonce) = exec_nonce(argv)
        {
            stderr.extend(format!("\n{}\n", done_marker(&nonce)).bytes());
        }
        (
            takes,
            Ok(ExecOutput {
                status,
                stdout: Vec::new(),
                stderr,
                stderr_cut: false,
            }),
        )
    }

    /// Opening the VM's console at `*now`: the interfaces listed, or the
    /// scripted failure; the clock moves to its end, or to the shutdown
    /// that stops it, or to the pass's deadline `until` (of a pass of
    /// `total`), where a slower open fails as its dial.
    pub fn sac_open_until(
        &mut self,
        now: &mut Duration,
        vm: &str,
        need: usize,
        (until, total): (Duration, Duration),
    ) -> Waited<Result<Vec<u32>, SacError>> {
        self.seen.push(Seen::SacOpen {
            at_ms: ms(*now),
            vm: vm.to_owned(),
        });
        let script = self.scenario.sac.clone();
        let result = match &script.open_error {
            Some(fault) => Err(fault.error(need, 0, Ipv4Addr::UNSPECIFIED)),
            None => Ok(script
                .nets
                .unwrap_or_else(|| (7..).take(need).collect::<Vec<u32>>())),
        };
        let ends = *now + Duration::from_millis(script.open_ms);
        let step = fixup_sac::Step::Dial;
        self.until_deadline(now, ends, result, (until, total, step))
    }

    /// One set on the open console at `*now`, bounded by the pass's
    /// deadline as [`World::sac_open_until`] is (a slower set fails as
    /// its set line).
    pub fn sac_set_until(
        &mut self,
        now: &mut Duration,
        net: u32,
        ip: Ipv4Addr,
        (until, total): (Duration, Duration),
    ) -> Waited<Result<(), SacError>> {
        self.seen.push(Seen::SacSet {
            at_ms: ms(*now),
            net,
            ip,
        });
        let script = self
            .scenario
            .sac
            .sets
            .get(self.sac_sets_done)
            .cloned()
            .unwrap_or_default();
        self.sac_sets_done += 1;
        let result = match &script.error {
            Some(fault) => Err(fault.error(0, net, ip)),
            None => Ok(()),
        };
        let ends = *now + Duration::from_millis(script.takes_ms);
        let step = fixup_sac::Step::Set { net };
        self.until_deadline(now, ends, result, (until, total, step))
    }

    /// When `mac` has a lease at or after `now`, no later than `until`,
    /// and its address.
    pub fn lease(
        &self,
        mac: &MacAddr,
        now: Duration,
        until: Duration,
    ) -> Option<(Duration, Ipv4Addr)> {
        self.scenario
            .leases
            .iter()
            .filter(|l| MacAddr::parse(&l.mac).is_ok_and(|m| m == *mac))
            .map(|l| (Duration::from_millis(l.at_ms).max(now), l.ip))
            .filter(|(at, _)| *at <= until)
            .min_by_key(|(at, _)| *at)
    }

    /// When the host shuts down.
    pub fn shutdown_at(&self) -> Option<Duration> {
        self.scenario.shutdown_at_ms.map(Duration::from_millis)
    }
}

/// What a wait says of a lease file that is no list of leases
/// ([`Scenario::lease_file_unusable`]); the daemon's replay writes a file
/// that makes its watcher say so too.
pub const UNUSABLE_LEASE_FILE: &str = "lease file: not a JSON array of leases";

/// How a wait in the world ended.
#[derive(Debug)]
pub enum Waited<T> {
    Done(T),
    /// The host shut down first.
    Cancelled,
}

impl World {
    /// Whether the host has shut down by `now`.
    pub fn down(&self, now: Duration) -> bool {
        self.shutdown_at().is_some_and(|s| s <= now)
    }

    /// An exec that starts at `*now`; the clock moves to its end, or to
    /// the shutdown that stops it.
    pub fn exec_until(
        &mut self,
        now: &mut Duration,
        vm: &str,
        purpose: ExecPurpose,
        argv: &[String],
        timeout: Duration,
    ) -> Waited<Result<ExecOutput, String>> {
        let (takes, result) = self.exec(*now, vm, purpose, argv, timeout);
        self.until(now, *now + takes, result)
    }

    /// A sleep from `*now` until `until`.
    pub fn sleep_until(&self, now: &mut Duration, until: Duration) -> Waited<()> {
        self.until(now, until.max(*now), ())
    }

    /// A wait for `mac`'s lease from `*now` until `until`.
    pub fn lease_until(
        &self,
        now: &mut Duration,
        mac: &MacAddr,
        until: Duration,
    ) -> Waited<Result<Option<Ipv4Addr>, String>> {
        if self.scenario.lease_file_unusable {
            return self.until(now, until.max(*now), Err(UNUSABLE_LEASE_FILE.to_owned()));
        }
        let found = self.lease(mac, *now, until);
        let ends = found.map_or(until, |(at, _)| at).max(*now);
        self.until(now, ends, Ok(found.map(|(_, ip)| ip)))
    }

    /// [`World::until`] for a console step that the pass's deadline
    /// (`until`, of a pass of `total`) cuts short during `step`.
    fn until_deadline<T>(
        &self,
        now: &mut Duration,
        ends: Duration,
        value: Result<T, SacError>,
        (until, total, step): (Duration, Duration, fixup_sac::Step),
    ) -> Waited<Result<T, SacError>> {
        if ends <= until {
            return self.until(now, ends, value);
        }
        self.until(now, until, Err(SacError::Deadline { step, total }))
    }

    fn until<T>(&self, now: &mut Duration, ends: Duration, value: T) -> Waited<T> {
        match self.shutdown_at().filter(|s| *s < ends) {
            Some(s) => {
                *now = (*now).max(s);
                Waited::Cancelled
            }
            None => {
                *now = ends;
                Waited::Done(value)
            }
        }
    }
}

/// The pod as the API server sends it.
pub fn pod_json(pod: &PodInput) -> Value {
    let mut metadata = serde_json::json!({
        "name": pod.name,
        "namespace": pod.namespace,
        "uid": pod.uid,
        "annotations": pod.annotations,
        "resourceVersion": pod.resource_version,
    });
    if pod.deleting {
        metadata["deletionTimestamp"] = Value::from("2026-12-01T10:00:00Z");
    }
    serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": []}})
}

/// The suite as an executor's replay runs it: every scenario file, and a
/// cocoon root where each scenario's overlay exists while it is replayed.
#[derive(Debug)]
pub struct Suite {
    root: tempfile::TempDir,
    pub scenarios: Vec<(PathBuf, Scenario)>,
    failures: Vec<String>,
}

impl Suite {
    /// The files of `tests/conformance/` under `workspace`.
    pub fn load(workspace: &Path) -> Suite {
        let suite = Suite::load_dir(&workspace.join("tests/conformance"));
        assert!(
            suite.scenarios.len() >= 20,
            "{} scenarios",
            suite.scenarios.len()
        );
        suite
    }

    /// The files of `tests/conformance-embedder/` under `workspace`: what
    /// an embedder's own knowledge of the VM changes ([`Scenario::knows`]),
    /// which only the embedders' executors replay.
    pub fn load_embedder(workspace: &Path) -> Suite {
        let suite = Suite::load_dir(&workspace.join("tests/conformance-embedder"));
        assert!(!suite.scenarios.is_empty());
        suite
    }

    /// The files of `tests/conformance-owned/` under `workspace`: what
    /// only an embedder that owns the lifecycle sees (replayed with
    /// `lifecycle_intents` alone).
    pub fn load_owned(workspace: &Path) -> Suite {
        let suite = Suite::load_dir(&workspace.join("tests/conformance-owned"));
        assert!(!suite.scenarios.is_empty());
        suite
    }

    fn load_dir(dir: &Path) -> Suite {
        let scenarios = Scenario::all(dir).unwrap_or_else(|e| panic!("{e}"));
        Suite {
            root: tempfile::tempdir().expect("a temporary cocoon root"),
            scenarios,
            failures: Vec::new(),
        }
    }

    /// The cocoon root the planner must probe.
    pub fn cocoon_root(&self) -> &Path {
        self.root.path()
    }

    /// Make the scenario's overlay exist (when it has one) while `replay`
    /// runs, then check what it saw.
    pub fn overlay_path(&self, scenario: &Scenario) -> Option<PathBuf> {
        let id = scenario.vm.as_ref()?.get("id")?.as_str()?;
        scenario.overlay.then(|| {
            self.root
                .path()
                .join("run/cloudhypervisor")
                .join(id)
                .join("overlay.qcow2")
        })
    }

    /// Before a scenario's replay: its overlay, when it has one.
    pub fn prepare(&self, scenario: &Scenario) {
        if let Some(overlay) = self.overlay_path(scenario) {
            std::fs::create_dir_all(overlay.parent().expect("a directory")).unwrap();
            std::fs::write(overlay, b"").unwrap();
        }
    }

    /// After a scenario's replay: check what it saw, remove its overlay.
    pub fn finish(&mut self, index: usize, world: &World, ended: &Ended) {
        let (path, scenario) = &self.scenarios[index];
        if let Err(e) = scenario.check(world, ended) {
            self.failures.push(format!(
                "{}: {}\n{e}\nnotes: {:#?}",
                path.display(),
                scenario.about,
                world.notes
            ));
        }
        if let Some(overlay) = self.overlay_path(scenario) {
            std::fs::remove_file(overlay).unwrap();
        }
    }

    /// Replay every scenario with `replay` (its overlay made first, what it
    /// saw checked after), then [`assert_passed`](Self::assert_passed).
    /// `replay` returns the world it played against and how the task ended.
    pub fn each(mut self, mut replay: impl FnMut(&Scenario) -> (World, Ended)) {
        for i in 0..self.scenarios.len() {
            let scenario = self.scenarios[i].1.clone();
            self.prepare(&scenario);
            let (world, ended) = replay(&scenario);
            self.finish(i, &world, &ended);
        }
        self.assert_passed();
    }

    /// Panic with every scenario that did not replay as expected.
    pub fn assert_passed(&self) {
        assert!(self.failures.is_empty(), "{}", self.failures.join("\n\n"));
    }
}

/// Deterministic nonces for a replay: 1, 2, 3, ...
pub fn counting_nonces() -> fixup_core::decision::NonceSource {
    let mut n = 0u8;
    Box::new(move || {
        n = n.wrapping_add(1);
        let mut bytes = [0u8; 16];
        bytes[15] = n;
        Ok(Nonce::from_bytes(bytes))
    })
}

/// Merge `patch` into the pod's annotations as the API server does, and
/// move its version on.
fn merge(pod: &mut PodInput, version: &mut u64, patch: &AnnotationPatch) {
    for (k, v) in patch {
        match v {
            Some(v) => pod.annotations.insert(k.clone(), v.clone()),
            None => pod.annotations.remove(k),
        };
    }
    *version += 1;
    pod.resource_version = Some(version.to_string());
}

/// Replay `scenario` through the decision alone, with `planner` (whose
/// cocoon root holds the scenario's overlay, if any): what the world saw,
/// and how the task ended.
pub fn replay(scenario: &Scenario, planner: &Planner) -> (World, Ended) {
    replay_owning(scenario, planner, false)
}

/// [`replay`] with the lifecycle owned by the embedder when
/// `lifecycle_intents`: the world publishes each lifecycle change the task
/// hands over, and no write of the task may carry a lifecycle key.
pub fn replay_owning(
    scenario: &Scenario,
    planner: &Planner,
    lifecycle_intents: bool,
) -> (World, Ended) {
    let mut world = World::new(scenario);
    let mut settings = scenario.settings();
    settings.lifecycle_intents = lifecycle_intents;
    let (mut task, mut action): (Box<dyn Steps>, Action) = match scenario.trigger.fixup() {
        Some(trigger) => {
            let (mut task, action) =
                PodTask::start(world.first_read(), trigger, settings, counting_nonces());
            task.wall_clock(world.scenario.wall_start_ms);
            if let Some((record, wall)) = world.start_record() {
                task.remember(record, wall);
            }
            if let Some(knows) = &scenario.knows {
                task.told(knows.clone());
            }
            (Box::new(task), action)
        }
        None => {
            let (task, action) =
                PrepareTask::start(world.first_read(), settings, counting_nonces());
            (Box::new(task), action)
        }
    };
    let mut now = Duration::ZERO;
    let uid = task.pod().uid.clone();
    loop {
        if !matches!(action, Action::Publish(_)) {
            world.not_publishing();
        }
        let report = match action {
            Action::Finish(result) => return (world, Ended::of(&result)),
            Action::Publish(intent) => {
                world.publish(now, &intent.patch());
                Report::Go
            }
            a if a.interruptible() && world.down(now) => Report::Cancelled,
            Action::Note(note) => {
                world.notes.push(format!("{note:?}"));
                Report::Go
            }
            Action::Admit | Action::Release | Action::Checkpoint => Report::Go,
            Action::Tell(event) => {
                let _ = world.event(now, event.reason, &event.message);
                Report::Go
            }
            Action::Inspect { vm, .. } => {
                Report::Inspected(world.inspect(now, &vm).map_err(Into::into))
            }
            Action::OtherPods { .. } => Report::OtherPods(world.other_pods()),
            Action::WakeEvents { field_selectors } => {
                Report::Events(world.events_of(now, &field_selectors))
            }
            Action::Plan(request) => Report::Planned(request.run(planner)),
            Action::Read => Report::Read(world.read(now)),
            Action::Patch {
                patch,
                unless_changed_from,
            } => Report::Patched({
                assert!(
                    !lifecycle_intents
                        || fixup_core::lifecycle::LIFECYCLE_KEYS
                            .iter()
                            .all(|key| !patch.contains_key(*key)),
                    "a write of a task whose embedder owns the lifecycle carries a lifecycle key: {patch:?}"
                );
                world.patch(
                    now,
                    &uid,
                    &patch,
                    unless_changed_from
                        .as_deref()
                        .map(|from| from.resource_version.as_deref().unwrap_or("")),
                )
            }),
            Action::Exec {
                vm,
                argv,
                timeout,
                purpose,
            } => match world.exec_until(&mut now, vm.as_str(), purpose, &argv, timeout) {
                Waited::Done(result) => Report::Ran(result),
                Waited::Cancelled => Report::Cancelled,
            },
            Action::Sleep { until } => match world.sleep_until(&mut now, until) {
                Waited::Done(()) => Report::Go,
                Waited::Cancelled => Report::Cancelled,
            },
            Action::WaitLease { mac, until } => match world.lease_until(&mut now, &mac, until) {
                Waited::Done(found) => Report::Lease(found),
                Waited::Cancelled => Report::Cancelled,
            },
            Action::SacOpen {
                vm,
                need,
                until,
                total,
            } => match world.sac_open_until(&mut now, vm.as_str(), need, (until, total)) {
                Waited::Done(result) => Report::SacOpened(result),
                Waited::Cancelled => Report::Cancelled,
            },
            Action::SacSet {
                net,
                nic,
                until,
                total,
            } => match world.sac_set_until(&mut now, net, nic.ip, (until, total)) {
                Waited::Done(result) => Report::SacSet(result),
                Waited::Cancelled => Report::Cancelled,
            },
            Action::SacClose => Report::Go,
            Action::Remember(record) => {
                world.remember(*record);
                Report::Go
            }
        };
        action = task.next(report, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fixup_core::planner::PlannerOptions;

    /// Every scenario of `suite`, replayed through the decision alone with
    /// the built-in plugins (with `intents`, the lifecycle handed to the
    /// embedder).
    fn replay_every_scenario(suite: Suite, intents: bool) {
        let (planner, failures) = Planner::new(PlannerOptions {
            cocoon_root: suite.cocoon_root().to_owned(),
            ..PlannerOptions::default()
        })
        .unwrap();
        assert!(failures.is_empty(), "{failures:?}");
        suite.each(|scenario| replay_owning(scenario, &planner, intents));
    }

    fn workspace() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    /// The reference the other executors are held to.
    #[test]
    fn every_scenario_replays_through_the_decision() {
        replay_every_scenario(Suite::load(&workspace()), false);
    }

    /// The embedder's scenarios, in both lifecycle modes, and those of an
    /// embedder that owns the lifecycle with it handed over.
    #[test]
    fn every_embedder_scenario_replays_through_the_decision() {
        for intents in [false, true] {
            replay_every_scenario(Suite::load_embedder(&workspace()), intents);
        }
        replay_every_scenario(Suite::load_owned(&workspace()), true);
    }

    /// With the lifecycle owned by the embedder, the changes it is handed,
    /// published by it, add up to the same writes, in the same order, as
    /// the task's own writes of them.
    #[test]
    fn every_scenario_replays_with_the_lifecycle_handed_over() {
        replay_every_scenario(Suite::load(&workspace()), true);
    }

    /// Scenarios whose serial console takes time (`open_ms`, `takes_ms`
    /// with changes meanwhile), which only the executors with a clock in
    /// their console stand-in can replay: the decision here, and the C op
    /// (`host/capi/src/task.rs`,
    /// `timed_console_scenarios_replay_through_the_task_op`).
    #[test]
    fn timed_console_scenarios_replay_through_the_decision() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/conformance-timed");
        let scenarios = Scenario::all(&dir).unwrap();
        assert!(!scenarios.is_empty());
        let (planner, _) = Planner::new(PlannerOptions::default()).unwrap();
        for (path, scenario) in scenarios {
            for intents in [false, true] {
                let (world, ended) = replay_owning(&scenario, &planner, intents);
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

    /// A fixup that ended done is counted once, as `done` lands: a serial-
    /// console pass that fails after it does not take it back, and one
    /// that succeeds does not count it twice.
    #[rstest::rstest]
    #[case::pass_fails("sac-set-no-answer.json")]
    #[case::pass_succeeds("sac-windows-clone-static.json")]
    fn a_done_fixup_is_counted_once_whatever_the_pass_does(#[case] file: &str) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/conformance")
            .join(file);
        let scenario: Scenario = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let (planner, _) = Planner::new(PlannerOptions::default()).unwrap();
        let (world, _) = replay(&scenario, &planner);
        let counted: Vec<&String> = world
            .notes
            .iter()
            .filter(|n| n.starts_with("Fixup {"))
            .collect();
        assert_eq!(counted.len(), 1, "{:#?}", world.notes);
        assert!(counted[0].contains("end: Done"), "{counted:?}");
        assert!(
            world.notes.iter().any(|n| n.starts_with("Sac(")),
            "{:#?}",
            world.notes
        );
    }
}
