//! `cocoon-fixup capture`: a field pod made into `plugin test` cases, so a
//! vendor can reproduce what a node saw without the cluster.
//!
//! What a capture reads (the caller gets it: from the cluster and `cocoon`,
//! or from files): the pod, the VM record, and the pod's `PostClone*` and
//! `ResumedAfterRestart` events. What it trusts is what `plan` trusts: the
//! annotations say where to look and what kind of clone it is, and the VM
//! record must be the pod's own (spec section 2, [`bound_record`]) or
//! nothing is captured. It writes nothing to the cluster.
//!
//! # One case per plugin call
//!
//! A case file holds one scenario and runs against one plugin, and a plan
//! can be made by several calls (`fc-mac` then `oci-networkd` on
//! Firecracker): [`capture`] makes one [`CapturedCase`] per call, in plan
//! order. Each case's `expect` is that plugin's own result for the facts
//! (the plugin called alone, as `plugin test` calls it), so `plugin test
//! THAT_PLUGIN.wasm CASE` passes while nothing has changed:
//!
//! - a plan: `{"plan": ...}`;
//! - a refusal (`unsupported`, `invalid-facts`): `{"error": ...}`;
//! - a trap or a breached limit: no `expect` (`plugin test` then shows the
//!   breach), and the error in the context's `call_error`.
//!
//! The facts are the daemon's: a pod whose `post-clone-state` is `running`
//! (work that a restart interrupted) is planned as resumed work (boot kind
//! `resumed`, the source image unknown), as the daemon plans it, unless the
//! caller overrides the boot kind.
//!
//! An all-DHCP Linux clone needs no fixup plan; its one plugin call is the
//! DHCP recovery plan the daemon makes for it when no lease comes
//! (`dhcp-recovery`). A pod that needs no plugin call at all is refused.
//!
//! # The context
//!
//! Each case carries a `context` object (never compared by `plugin test`):
//!
//! - `summary`: one line, which `plugin test` prints;
//! - `captured`: `by` (cocoon-fixup and its version), `at` (RFC 3339),
//!   `from` (`cluster`, or the files read);
//! - `pod` (`namespace`, `name`, `uid`), `vm` (`name`, `id`);
//! - `rule` (`number`, `reason`), `image`, `scenarios` (every call of the
//!   pod's plan, in order), `plugin` (the one this case is for: `name`,
//!   `version`, `sha256`, `source`, `why`), `plugins` (every call's plugin);
//! - `call_error`, when the call trapped or breached a limit;
//! - `field`: what the pod recorded, when it recorded anything:
//!   `post_clone_state`, `errors` (the lines of
//!   `vm.cocoonstack.io/post-clone-errors`), `lifecycle_state`,
//!   `lifecycle_message`, `hint` (the header of the hint script: its
//!   `title` lines and the `plugins` it names), `events` (`type`, `reason`,
//!   `message`, `time`, `count`) and `plugins_named`: every plugin the hint
//!   and the events name with a version (`name`, `version`, `sha256` when
//!   given, possibly short, and `from`).
//!
//! All of it is the pod's own text and may carry anything; the JSON file is
//! data, and whoever prints it passes it through [`fixup_core::display`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use serde::Serialize;
use serde_json::{Map, Value, json};

use fixup_core::annotations::{keys, reasons};
use fixup_core::binding::{BindingPolicy, Mismatch, Verdict};
use fixup_core::classify::{self, Scenario};
use fixup_core::decision::{
    self, Action, Handled, Lookup, NonceSource, PodTask, Report, Settings, Summary, Trigger,
    WakeConfig,
};
use fixup_core::facts::{
    BootKind, FactError, ImageKind, Observation, Overrides, PodInput, VmFacts, VmId, VmInspect,
    annotations,
};
use fixup_core::lifecycle::HandsOff;
use fixup_core::memory::{Listed, StackEvent};
use fixup_core::planner::Planner;
use fixup_core::plugin::registry::NoPlugin;
use fixup_core::probe::ProbeError;

/// Why no case could be captured.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(
        "pod {pod} names no VM (no {} or {} annotation): there is nothing to capture until cocoon has created its VM",
        annotations::VM_ID,
        annotations::VM_NAME
    )]
    NoVm { pod: String },
    /// The VM is not the pod's (spec section 2): the daemon would run
    /// nothing in it, so there is no plan to capture.
    #[error("pod {pod}: not this pod's VM, so the daemon runs nothing in it: {mismatch}")]
    NotThePodsVm { pod: String, mismatch: Mismatch },
    #[error("pod {pod} needs no plugin call (rule {rule}: {reason}): there is no plan to capture")]
    NothingToPlan {
        pod: String,
        rule: u8,
        reason: &'static str,
    },
    /// The daemon would leave the pod alone (spec section 8).
    #[error(
        "pod {pod}: the daemon leaves it alone ({reason}), so there is no plan of its to capture; pass --anyway to capture it regardless"
    )]
    HandsOff { pod: String, reason: HandsOff },
    #[error(transparent)]
    Facts(#[from] FactError),
    #[error(
        "{0}; capture probes the cocoon root as the daemon does: run it on the pod's node, or pass --cocoon-root (or --source-image)"
    )]
    Probe(#[from] ProbeError),
    #[error(transparent)]
    NoPlugin(#[from] NoPlugin),
    #[error("{input}: {reason}; pass `kubectl get events -o json` output")]
    Events { input: String, reason: String },
    #[error("cannot write the case: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Output(String),
    #[error("cannot write {path}; check the path and its permissions")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The VM the annotations point at (the id annotation, else the name
/// annotation), as the daemon looks it up: only where to look, never proof
/// ([`bound_record`] decides).
pub fn vm_reference(pod: &PodInput) -> Result<VmId, CaptureError> {
    match decision::lookup(pod) {
        Lookup::Inspect(vm) => Ok(vm),
        Lookup::NoVm => Err(CaptureError::NoVm {
            pod: pod.display_name(),
        }),
        Lookup::Unusable(mismatch) => Err(CaptureError::NotThePodsVm {
            pod: pod.display_name(),
            mismatch,
        }),
    }
}

/// Check that `record` is the pod's own VM, as the daemon checks it before
/// it runs anything ([`decision::bind_record`]): the verdict, bound or
/// [`Verdict::Unproven`]. A capture has no view of the node's pods, so an
/// annotated name (`--accept-annotated-vm-names`) stays unproven: the
/// caller captures it and says so, never that it is bound.
pub fn bound_record(
    pod: &PodInput,
    record: &VmInspect,
    policy: BindingPolicy,
) -> Result<Verdict, CaptureError> {
    match decision::bind_record(pod, record, policy) {
        verdict @ (Verdict::Bound { .. } | Verdict::Unproven { .. }) => Ok(verdict),
        Verdict::Mismatch(mismatch) => Err(CaptureError::NotThePodsVm {
            pod: pod.display_name(),
            mismatch,
        }),
    }
}

/// One event of the pod, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodEvent {
    #[serde(rename = "type")]
    pub kind: String,
    pub reason: String,
    pub message: String,
    /// When it happened (RFC 3339), when the event says.
    pub time: Option<String>,
    /// How often it happened, when the event counts.
    pub count: Option<i64>,
}

/// The most host events a capture keeps (the newest).
pub const MAX_EVENTS: usize = 200;

/// Sort `events` oldest first and keep the newest [`MAX_EVENTS`]: `true`
/// when some were dropped.
pub fn keep_newest(events: &mut Vec<PodEvent>) -> bool {
    events.sort_by(|a, b| a.time.cmp(&b.time));
    let over = events.len().saturating_sub(MAX_EVENTS);
    events.drain(..over);
    over > 0
}

pub use fixup_core::memory::evidence::REPORTER;

/// Whether an event's reason is one the host writes: `PostClone*` or
/// `ResumedAfterRestart`. Capture keeps only these.
pub fn is_host_reason(reason: &str) -> bool {
    reason.starts_with("PostClone") || reason == reasons::RESUMED_AFTER_RESTART
}

/// The pod's events from `kubectl get events -o json` output (a list with
/// `items`, or an array), core/v1 or events.k8s.io/v1 alike: only events
/// about this pod (by uid, else by namespace and name) with a host reason
/// ([`is_host_reason`]), oldest first; and every event as the wake rule
/// reads it ([`StackEvent::from_value`], which reads both versions'
/// fields, so a `kubectl get events` listing makes a wake as the
/// daemon's own list does).
pub fn events_from_json(
    text: &str,
    input: &str,
    pod: &PodInput,
) -> Result<(Vec<PodEvent>, Vec<StackEvent>), CaptureError> {
    let bad = |reason: String| CaptureError::Events {
        input: input.to_owned(),
        reason,
    };
    let value: Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON ({e})")))?;
    let items = match &value {
        Value::Array(items) => items,
        Value::Object(list) => match list.get("items") {
            Some(Value::Array(items)) => items,
            _ => return Err(bad("an object without an `items` array".into())),
        },
        _ => return Err(bad("neither a list nor an array of events".into())),
    };
    Ok((
        events_of(items, pod),
        items.iter().map(StackEvent::from_value).collect(),
    ))
}

/// The events among `items` (Event objects as JSON, core/v1 or
/// events.k8s.io/v1) that are about `pod` (by uid, else by namespace and
/// name), have a host reason ([`is_host_reason`]) and name the host as
/// their reporting controller ([`REPORTER`]), oldest first. Anyone who may
/// create events can still forge one: they are the pod's record, not proof.
pub fn events_of(items: &[Value], pod: &PodInput) -> Vec<PodEvent> {
    let text_of =
        |v: &Value, key: &str| v.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
    let mut events = Vec::new();
    for item in items {
        let object = item
            .get("regarding")
            .or_else(|| item.get("involvedObject"))
            .unwrap_or(&Value::Null);
        let about_pod = match (object.get("uid").and_then(Value::as_str), &pod.uid) {
            (Some(uid), Some(pod_uid)) if !uid.is_empty() => uid == pod_uid,
            _ => {
                text_of(object, "name") == pod.name && text_of(object, "namespace") == pod.namespace
            }
        };
        let reason = text_of(item, "reason");
        // events.k8s.io/v1 `reportingController`; core/v1 `reportingComponent`.
        let by_host = ["reportingController", "reportingComponent"]
            .iter()
            .any(|k| text_of(item, k) == REPORTER);
        if !about_pod || !is_host_reason(&reason) || !by_host {
            continue;
        }
        let message = match text_of(item, "note") {
            note if !note.is_empty() => note,
            _ => text_of(item, "message"),
        };
        let time = [
            "eventTime",
            "lastTimestamp",
            "deprecatedLastTimestamp",
            "firstTimestamp",
        ]
        .iter()
        .map(|k| text_of(item, k))
        .find(|t| !t.is_empty());
        let count = ["count", "deprecatedCount"]
            .iter()
            .find_map(|k| item.get(*k).and_then(Value::as_i64))
            .or_else(|| item.pointer("/series/count").and_then(Value::as_i64));
        events.push(PodEvent {
            kind: text_of(item, "type"),
            reason,
            message,
            time,
            count,
        });
    }
    events.sort_by(|a, b| a.time.cmp(&b.time));
    events
}

/// A plugin named with its version in a hint header or an event: `NAME
/// VERSION sha256:DIGEST`, `NAME VERSION (sha256:DIGEST)`, or `built-in
/// NAME VERSION`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct PluginMention {
    pub name: String,
    pub version: String,
    /// As given; the hint header gives the first 12 hex digits.
    pub sha256: Option<String>,
    /// Where it was named: `hint`, or the event's reason.
    pub from: String,
}

fn is_plugin_name(word: &str) -> bool {
    !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Every plugin `text` names with a version (see [`PluginMention`]).
pub fn plugin_mentions(text: &str, from: &str) -> Vec<PluginMention> {
    let trim = |w: &str| {
        w.trim_matches(|c: char| matches!(c, '(' | ')' | ',' | ';' | ':'))
            .to_owned()
    };
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut found = Vec::new();
    for (i, window) in words.windows(2).enumerate() {
        let (name, version) = (trim(window[0]), trim(window[1]));
        if !is_plugin_name(&name) || !version.starts_with(|c: char| c.is_ascii_digit()) {
            continue;
        }
        let digest = words
            .get(i + 2)
            .map(|w| trim(w))
            .and_then(|w| w.strip_prefix("sha256:").map(str::to_owned))
            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_hexdigit()));
        let after_builtin = i > 0 && words[i - 1] == "built-in";
        if digest.is_some() || after_builtin {
            found.push(PluginMention {
                name,
                version,
                sha256: digest,
                from: from.to_owned(),
            });
        }
    }
    found
}

/// The header of a hint script (the base64 `post-clone-hint`): its leading
/// comment lines without `# ` (the shebang left out), and the plugins they
/// name. `None` when the annotation is not base64 of UTF-8 text.
fn hint_header(hint: &str) -> Option<(Vec<String>, Vec<PluginMention>)> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(hint.trim())
        .ok()?;
    let script = String::from_utf8(bytes).ok()?;
    let title: Vec<String> = script
        .lines()
        .filter(|l| !l.starts_with("#!"))
        .map_while(|l| l.strip_prefix('#'))
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    let plugins = title
        .iter()
        .filter_map(|l| l.strip_prefix("plugins:"))
        .flat_map(|l| plugin_mentions(l, "hint"))
        .collect();
    Some((title, plugins))
}

/// What the pod recorded of earlier work: the failure record, the hint's
/// header, the events, and the plugins they name. `None` when it recorded
/// nothing.
fn field_record(pod: &PodInput, events: &[PodEvent], events_truncated: bool) -> Option<Value> {
    let annotation = |key: &str| Some(pod.annotation(key)).filter(|v| !v.is_empty());
    let state = annotation(keys::POST_CLONE_STATE);
    let errors: Vec<&str> = annotation(keys::POST_CLONE_ERRORS)
        .map(|e| e.lines().filter(|l| !l.is_empty()).collect())
        .unwrap_or_default();
    let hint = annotation(keys::POST_CLONE_HINT);
    let lifecycle_state = annotation(keys::LIFECYCLE_STATE);
    if state.is_none()
        && errors.is_empty()
        && hint.is_none()
        && events.is_empty()
        && lifecycle_state.is_none()
        && !pod.deleting
    {
        return None;
    }
    let mut named = Vec::new();
    let hint = hint.map(|hint| match hint_header(hint) {
        Some((title, plugins)) => {
            named.extend(plugins.iter().cloned());
            json!({"title": title, "plugins": plugins})
        }
        None => json!({"unreadable": "the annotation is not base64 of a script"}),
    });
    for event in events {
        named.extend(plugin_mentions(&event.message, &event.reason));
    }
    let mut seen = std::collections::HashSet::new();
    named.retain(|m| seen.insert(m.clone()));
    Some(json!({
        "unverified": "the pod's annotations and events as read: written by the pod's owner or anyone who may create events, not checked",
        "post_clone_state": state,
        "errors": errors,
        "lifecycle_state": lifecycle_state,
        "deleting": pod.deleting,
        "lifecycle_message": annotation(keys::LIFECYCLE_MESSAGE),
        "hint": hint,
        "events": events,
        "events_truncated": events_truncated,
        "plugins_named": named,
    }))
}

/// Where the pod and its VM were read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// From the API server and `cocoon vm inspect`.
    Cluster,
    /// From files.
    Files {
        pod: PathBuf,
        vm: PathBuf,
        events: Option<PathBuf>,
    },
}

impl Source {
    fn json(&self) -> Value {
        match self {
            Source::Cluster => json!("cluster"),
            Source::Files { pod, vm, events } => json!({
                "pod": pod.display().to_string(),
                "vm": vm.display().to_string(),
                "events": events.as_ref().map(|e| e.display().to_string()),
            }),
        }
    }
}

/// What a capture is made from.
#[derive(Debug, Clone)]
pub struct CaptureInput<'a> {
    pub pod: &'a PodInput,
    /// The VM record, already checked with [`bound_record`].
    pub vm: &'a VmInspect,
    pub overrides: &'a Overrides,
    /// The pod's host events ([`is_host_reason`]).
    pub events: &'a [PodEvent],
    /// Whether events were left out ([`MAX_EVENTS`], a page limit).
    pub events_truncated: bool,
    /// Every event about the pod as the wake rule reads it (spec section
    /// 2, rule 2), and how it reads them (the window, the accepted
    /// reporters) at `now_unix_ms`: the stack's `Woken` or
    /// `HibernateSnapshotExists` makes a cloned VM a wake, as for the
    /// daemon.
    pub stack_events: &'a [StackEvent],
    pub wake: &'a WakeConfig,
    /// The capture's wall clock, in milliseconds since the Unix epoch.
    pub now_unix_ms: i64,
    pub source: Source,
    /// The capture time, RFC 3339.
    pub at: String,
    /// `cocoon-fixup <version>`.
    pub by: String,
    /// The cocoon root the overlay probe reads (the planner's).
    pub cocoon_root: &'a Path,
    /// Capture a pod the daemon would leave alone (recorded in
    /// `context.daemon`).
    pub anyway: bool,
}

/// One plugin call of the pod's plan, as a case.
#[derive(Debug, Clone)]
pub struct CapturedCase {
    pub plugin: String,
    /// The plugin's file; `None` for a built-in, which has none.
    pub file: Option<std::path::PathBuf>,
    pub scenario: Scenario,
    /// `plan`, `error` (the plugin declined) or `none` (it breached).
    pub expect: &'static str,
    /// The case file's text.
    pub text: String,
}

impl CapturedCase {
    /// `<plugin>-<scenario>.json`.
    pub fn file_name(&self) -> String {
        format!("{}-{}.json", self.plugin, self.scenario)
    }
}

/// What the daemon's decision makes of the pod ([`replay`]).
#[derive(Debug, Default)]
pub struct Replayed {
    /// The observation the task classified the VM from; `None` when it
    /// left the pod alone before it looked at the VM.
    pub observed: Option<Observation>,
    /// How the task ended, when it ended before it would plan, write, run
    /// or wait: left alone, parked, or stopped (the stop as one line).
    pub ended: Option<Result<Summary, String>>,
}

/// The daemon's decision for the pod, replayed on what was captured: the
/// pod's task ([`PodTask`], trigger `event`) runs with its look-ups
/// answered from the captured record and events (`stack_events`, read at
/// `now_unix_ms` by `wake`'s rules, the grace passing at once), until it
/// has classified the VM and would plan, write, run or wait, or ends.
/// The record was bound by the caller ([`bound_record`]): the replay takes
/// it as the pod's.
pub fn replay(
    pod: &PodInput,
    vm: &VmInspect,
    stack_events: &[StackEvent],
    wake: &WakeConfig,
    now_unix_ms: i64,
) -> Replayed {
    let settings = Settings {
        wake: wake.clone(),
        binding: BindingPolicy {
            accept_legacy_names: true,
            accept_annotated_names: true,
        },
        ..Settings::default()
    };
    // The replay runs nothing: its nonces are never used.
    let nonces: NonceSource = Box::new(|| Err("a replay runs nothing".to_owned()));
    let (mut task, mut action) = PodTask::start(pod.clone(), Trigger::Event, settings, nonces);
    task.keep_observed();
    task.wall_clock(u64::try_from(now_unix_ms).unwrap_or_default());
    let mut now = Duration::ZERO;
    let mut ended = None;
    loop {
        let report = match action {
            Action::Finish(result) => {
                ended = Some(result.map_err(|stop| stop.to_string()));
                break;
            }
            Action::Inspect { .. } => Report::Inspected(Ok(vm.clone())),
            Action::OtherPods { .. } => Report::OtherPods(Ok(vec![pod.clone()])),
            Action::WakeEvents { .. } => Report::Events(Ok(Listed {
                events: stack_events.to_vec(),
                truncated: false,
            })),
            Action::Sleep { until } => {
                now = now.max(until);
                Report::Go
            }
            Action::Admit
            | Action::Release
            | Action::Checkpoint
            | Action::Tell(_)
            | Action::Note(_)
            | Action::Remember(_)
            | Action::Publish(_) => Report::Go,
            // Past the decision capture replays: a plan, a write, an exec,
            // a wait.
            _ => break,
        };
        match task.try_next(report, now) {
            Ok(next) => action = next,
            Err(e) => {
                ended = Some(Err(format!("the replay was refused: {e}")));
                break;
            }
        }
    }
    Replayed {
        observed: task.observed().cloned(),
        ended,
    }
}

/// Why the daemon's observation has a boot kind the pod's annotations
/// alone do not give it, for the case's `boot_assumed`; `None` when they
/// agree.
fn assumed_why(pod: &PodInput, vm: &VmInspect, observed: &Observation) -> Option<String> {
    let plain = Observation::new(pod, vm, &Overrides::default()).boot;
    let running = decision::boot_override(pod, None).is_some();
    match observed.boot? {
        BootKind::Wake if pod_says_wake(pod) => running.then(|| {
            "wake: restore-from-hibernate is true, and the daemon resumes work left running on a woken VM as a wake (pass --boot to plan another kind)".to_owned()
        }),
        BootKind::Wake if plain != Some(BootKind::Wake) => Some(
            "wake: the stack's Woken or HibernateSnapshotExists event about the pod says the VM was woken, and the daemon takes it for a wake (pass --boot to plan another kind)".to_owned(),
        ),
        BootKind::Resumed if plain != Some(BootKind::Resumed) => Some(
            "resumed: post-clone-state is running, and a daemon that restarts mid-fixup resumes that work as resumed (pass --boot to plan another kind)".to_owned(),
        ),
        boot if Some(boot) != plain => Some(format!(
            "{boot}: as the daemon decides it (pass --boot to plan another kind)"
        )),
        _ => None,
    }
}

fn pod_says_wake(pod: &PodInput) -> bool {
    BootKind::from_annotations(&pod.annotations) == Some(BootKind::Wake)
}

/// What the daemon does with the pod and the observation it plans from
/// ([`replay`]): its handling in words (for the case's `context.daemon`),
/// the observation, and why its boot kind is not the annotations' own.
/// `--boot` replaces the boot kind; a pod the daemon leaves alone is
/// refused unless `anyway`, and then planned from its annotations.
fn daemon_view(
    input: &CaptureInput<'_>,
) -> Result<(String, Observation, Option<String>), CaptureError> {
    let pod = input.pod;
    let replay = |pod: &PodInput| {
        replay(
            pod,
            input.vm,
            input.stack_events,
            input.wake,
            input.now_unix_ms,
        )
    };
    // What the daemon does with the pod: its decision, replayed. A fixup
    // that failed marks the lifecycle `failed` too; the pod is parked,
    // which capture is for, so that mark alone does not make it the
    // stack's.
    let parked = pod.annotation(keys::POST_CLONE_STATE) == "failed"
        && pod
            .annotation(keys::LIFECYCLE_STATE)
            .eq_ignore_ascii_case("failed");
    let mut seen = pod.clone();
    if parked {
        seen.annotations.remove(keys::LIFECYCLE_STATE);
    }
    let mut replayed = replay(&seen);
    let daemon = match &replayed.ended {
        Some(Ok(summary)) if summary.action == Handled::Nothing => {
            let reason = summary.hands_off.unwrap_or(HandsOff::NotManaged);
            if !input.anyway {
                return Err(CaptureError::HandsOff {
                    pod: pod.display_name(),
                    reason,
                });
            }
            format!("nothing: {reason}")
        }
        Some(Ok(summary)) if summary.action == Handled::Parked => {
            // A fixup that failed is parked, which capture is for: the
            // plan is the one the daemon made for the pod before it failed.
            seen.annotations.remove(keys::POST_CLONE_STATE);
            replayed = replay(&seen);
            "parked: the fixup failed earlier".to_owned()
        }
        Some(Err(stop)) => format!("stopped: {stop}"),
        _ => "its work".to_owned(),
    };
    // `--boot` is the person's; else the daemon's observation, else (a pod
    // it leaves alone, captured anyway) the annotations'.
    let (obs, assumed) = match (input.overrides.boot, replayed.observed) {
        (Some(boot), _) => (
            Observation::new(pod, input.vm, input.overrides),
            Some(format!("{boot}: given with --boot")),
        ),
        (None, Some(mut observed)) => {
            if let Some(image) = &input.overrides.source_image {
                observed = Observation::new(
                    pod,
                    input.vm,
                    &Overrides {
                        boot: observed.boot,
                        source_image: Some(image.clone()),
                    },
                );
            }
            let why = assumed_why(pod, input.vm, &observed);
            (observed, why)
        }
        (None, None) => (Observation::new(pod, input.vm, input.overrides), None),
    };
    Ok((daemon, obs, assumed))
}

/// Why capture plans with a boot kind the pod's annotations alone do not
/// give (the daemon's wake evidence, work left `running`), as the
/// daemon's decision, replayed, has it; `None` when they agree or the
/// boot was given. Refused as [`capture`] refuses.
pub fn assumed_boot(input: &CaptureInput<'_>) -> Result<Option<String>, CaptureError> {
    if input.overrides.boot.is_some() {
        return Ok(None);
    }
    daemon_view(input).map(|(_, _, why)| why)
}

/// The pod's plugin calls, as cases (see the module documentation).
pub fn capture(
    planner: &Planner,
    input: &CaptureInput<'_>,
) -> Result<Vec<CapturedCase>, CaptureError> {
    let pod = input.pod;
    let (daemon, obs, assumed) = daemon_view(input)?;
    let decision = classify::classify(&obs);
    let (image, scenarios) = match decision.fixup {
        Some(_) => {
            let image = if decision.needs_image_kind() {
                fixup_core::planner::image_kind::<CaptureError>(&obs, input.cocoon_root)?
            } else {
                ImageKind::Unknown
            };
            (image, decision.scenarios(image))
        }
        None if decision.dhcp_recovery(obs.os) => {
            (ImageKind::Unknown, vec![Scenario::DhcpRecovery])
        }
        None => {
            return Err(CaptureError::NothingToPlan {
                pod: pod.display_name(),
                rule: decision.rule.number(),
                reason: decision.rule.reason(),
            });
        }
    };
    let facts = VmFacts::validate(&obs, image)?;
    let registry = planner.plugins().registry();
    let selections = scenarios
        .iter()
        .map(|&s| registry.select(s, facts.flavor.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    let plugins: Vec<Value> = selections
        .iter()
        .map(|s| {
            json!({
                "name": s.plugin.info.name,
                "version": s.plugin.info.version,
                "sha256": s.plugin.sha256,
                "source": s.plugin.origin.to_string(),
                "scenario": s.scenario.as_str(),
                "why": s.reason,
            })
        })
        .collect();
    // The plan as the daemon composes it: every call, the failure policy's
    // fallbacks, composition and the plan limits.
    let composed = match planner.plan_scenarios(&facts, &scenarios) {
        Ok(composed) => {
            let fallbacks: Vec<Value> = composed
                .parts
                .iter()
                .filter_map(|part| {
                    let fallback = part.fallback.as_ref()?;
                    let scenario = part.selection.scenario;
                    Some(json!({
                        "scenario": scenario.as_str(),
                        "kind": fallback.kind,
                        "message": fallback.message(scenario, &part.selection.plugin),
                    }))
                })
                .collect();
            json!({"result": "ok", "fallbacks": fallbacks})
        }
        Err(error) => json!({"result": error.to_string(), "fallbacks": []}),
    };
    let engine = planner.plugins().limits();
    let mut limits = serde_json::to_value(crate::LimitsReport::from(engine))?;
    if let Value::Object(limits) = &mut limits {
        let deadline = u64::try_from(engine.deadline.as_millis()).unwrap_or(u64::MAX);
        limits.insert("deadline_ms".into(), json!(deadline));
    }
    let field = field_record(pod, input.events, input.events_truncated);
    let failed = pod.annotation(keys::POST_CLONE_STATE) == "failed";
    let mut cases = Vec::new();
    for (selection, plugin) in selections.iter().zip(&plugins) {
        let scenario = selection.scenario;
        let result = planner
            .plugins()
            .plan(&selection.plugin, scenario, &facts)
            .map(|(plan, _)| plan);
        let breach = result
            .as_ref()
            .err()
            .filter(|e| !crate::is_refusal(e))
            .map(ToString::to_string);
        let name = &selection.plugin.info.name;
        let mut summary = format!(
            "captured from pod {} (uid {}), VM {} (id {}), at {} by {}: {scenario} by {name} {}",
            pod.display_name(),
            pod.uid.as_deref().unwrap_or("none"),
            facts.name,
            facts.id,
            input.at,
            input.by,
            selection.plugin.info.version,
        );
        if failed {
            let last = pod
                .annotation(keys::POST_CLONE_ERRORS)
                .lines()
                .rfind(|l| !l.is_empty())
                .unwrap_or("no error recorded");
            summary.push_str(&format!("; the pod records: failed, {last}"));
        }
        let mut context = Map::new();
        context.insert("summary".into(), json!(summary));
        context.insert(
            "captured".into(),
            json!({"by": input.by, "at": input.at, "from": input.source.json()}),
        );
        context.insert(
            "pod".into(),
            json!({"namespace": pod.namespace, "name": pod.name, "uid": pod.uid}),
        );
        context.insert(
            "vm".into(),
            json!({"name": facts.name.as_str(), "id": facts.id.as_str()}),
        );
        context.insert(
            "rule".into(),
            json!({"number": decision.rule.number(), "reason": decision.rule.reason()}),
        );
        context.insert("daemon".into(), json!(daemon));
        if let Some(why) = &assumed {
            context.insert("boot_assumed".into(), json!(why));
        }
        context.insert("image".into(), json!(image.as_str()));
        context.insert(
            "scenarios".into(),
            json!(scenarios.iter().map(|s| s.as_str()).collect::<Vec<_>>()),
        );
        context.insert("plugin".into(), plugin.clone());
        context.insert("plugins".into(), json!(plugins));
        context.insert("composed".into(), composed.clone());
        context.insert("limits".into(), limits.clone());
        if let Some(breach) = &breach {
            context.insert("call_error".into(), json!(breach));
        }
        if let Some(field) = &field {
            context.insert("field".into(), field.clone());
        }
        let description = format!(
            "{scenario} for pod {} ({})",
            pod.display_name(),
            if failed {
                "failed in the field"
            } else {
                "captured"
            }
        );
        // Escaped as for a terminal, so the file shows what it holds when
        // it is read with `cat` too.
        let text = fixup_core::display::terminal_json(&crate::case_text(
            Some(&description),
            scenario,
            &facts,
            &result,
            Some(&context),
        )?)
        .into_owned();
        cases.push(CapturedCase {
            plugin: name.clone(),
            file: match &selection.plugin.origin {
                fixup_core::plugin::Origin::File(path) => Some(path.clone()),
                _ => None,
            },
            scenario,
            expect: match (&result, &breach) {
                (Ok(_), _) => "plan",
                (Err(_), None) => "error",
                (Err(_), Some(_)) => "none",
            },
            text,
        });
    }
    Ok(cases)
}

/// Where each case goes: `None` for standard output.
pub type Placement = (CapturedCase, Option<PathBuf>);

/// Whether `path` names a folder: it ends with `/` (created when missing) or
/// is one already.
fn names_a_folder(path: &Path) -> bool {
    path.as_os_str().as_encoded_bytes().ends_with(b"/") || path.is_dir()
}

/// Pick the cases to write and where (see `capture --help`), checking every
/// target before any is written:
///
/// - `plugin`: only that plugin's cases (an error names the plugins there
///   are);
/// - `output` ending with `/`, or an existing folder: one
///   `<plugin>-<scenario>.json` per case in it (created when missing);
/// - one case: otherwise `output` is its file; without `output`, standard
///   output;
/// - several: anything but a folder is refused with the options that fix
///   it.
///
/// A target that exists already (a symbolic link included) is refused
/// unless `force`; a folder never is replaced.
pub fn place(
    cases: Vec<CapturedCase>,
    output: Option<&Path>,
    plugin: Option<&str>,
    force: bool,
) -> Result<Vec<Placement>, CaptureError> {
    let names: Vec<String> = cases
        .iter()
        .map(|c| format!("{} ({})", c.plugin, c.scenario))
        .collect();
    let cases = match plugin {
        None => cases,
        Some(wanted) => {
            let picked: Vec<CapturedCase> =
                cases.into_iter().filter(|c| c.plugin == wanted).collect();
            if picked.is_empty() {
                return Err(CaptureError::Output(format!(
                    "no plugin {wanted:?} plans for this pod; its plan is made by {}: pass one of those names to --plugin",
                    names.join(", ")
                )));
            }
            picked
        }
    };
    // Several cases left after --plugin are all that plugin's: only a
    // folder holds them.
    let fix = if plugin.is_some() {
        "pass --output DIR/ (a folder) for one case file each"
    } else {
        "pass --output DIR/ (a folder) for one case file each, or --plugin NAME for one"
    };
    let placed: Vec<Placement> = match (cases.len(), output) {
        (1, None) => cases.into_iter().map(|c| (c, None)).collect(),
        (_, Some(dir)) if names_a_folder(dir) => cases
            .into_iter()
            .map(|c| {
                let file = dir.join(c.file_name());
                (c, Some(file))
            })
            .collect(),
        (1, Some(path)) => cases
            .into_iter()
            .map(|c| (c, Some(path.to_owned())))
            .collect(),
        (n, Some(path)) => {
            let what = if path.symlink_metadata().is_ok() {
                "is a file"
            } else {
                "does not exist and does not end with / (a new folder must)"
            };
            return Err(CaptureError::Output(format!(
                "this pod's plan is made by {n} plugin calls ({}) and a case file holds one, but {} {what}: {fix}",
                names.join(", "),
                path.display()
            )));
        }
        (n, None) => {
            return Err(CaptureError::Output(format!(
                "this pod's plan is made by {n} plugin calls ({}) and a case file holds one: {fix}",
                names.join(", ")
            )));
        }
    };
    for path in placed.iter().filter_map(|(_, p)| p.as_deref()) {
        match path.symlink_metadata() {
            Ok(meta) if meta.is_dir() => {
                return Err(CaptureError::Output(format!(
                    "{} is a folder: a case is written to a file",
                    path.display()
                )));
            }
            Ok(_) if !force => {
                return Err(CaptureError::Output(format!(
                    "{} exists already: pass --force to replace it (nothing was written)",
                    path.display()
                )));
            }
            _ => {}
        }
    }
    if let Some(dir) = output.filter(|o| names_a_folder(o)) {
        std::fs::create_dir_all(dir).map_err(|source| CaptureError::Write {
            path: dir.to_owned(),
            source,
        })?;
    }
    Ok(placed)
}

/// Write each placed case to its file: to a new temporary file in the same
/// folder, then renamed into place, so a symbolic link there is replaced,
/// never followed; without `force` the rename refuses a file that appeared
/// since [`place`] checked. The cases for standard output are returned, in
/// order.
pub fn write(placed: &[Placement], force: bool) -> Result<Vec<&CapturedCase>, CaptureError> {
    let mut stdout = Vec::new();
    for (case, path) in placed {
        let Some(path) = path else {
            stdout.push(case);
            continue;
        };
        let failed = |source: std::io::Error| CaptureError::Write {
            path: path.clone(),
            source,
        };
        let folder = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let mut temp = tempfile::Builder::new()
            .prefix(".capture-")
            .tempfile_in(folder)
            .map_err(failed)?;
        std::io::Write::write_all(&mut temp, case.text.as_bytes()).map_err(failed)?;
        if force {
            temp.persist(path).map_err(|e| failed(e.error))?;
        } else {
            temp.persist_noclobber(path).map_err(|e| failed(e.error))?;
        }
    }
    Ok(stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rstest::rstest]
    #[case::hint_header(
        " fc-mac 0.1.0 sha256:0123456789ab, oci-networkd 0.2.0 sha256:ba9876543210",
        &[("fc-mac", "0.1.0", Some("0123456789ab")), ("oci-networkd", "0.2.0", Some("ba9876543210"))]
    )]
    #[case::fallback_event(
        "plugin acme 1.2.0 (sha256:abc123) failed for oci-networkd: plugin acme trapped: x; planned with the built-in oci-networkd 0.1.0 instead",
        &[("acme", "1.2.0", Some("abc123")), ("oci-networkd", "0.1.0", None)]
    )]
    #[case::no_versions("attempt 2: step 4/5 failed exit 1: plugin acme 3 times", &[])]
    #[case::not_a_digest("acme 1.0 sha256:not-hex", &[])]
    fn plugins_named_with_a_version(
        #[case] text: &str,
        #[case] expected: &[(&str, &str, Option<&str>)],
    ) {
        let found: Vec<(String, String, Option<String>)> = plugin_mentions(text, "x")
            .into_iter()
            .map(|m| (m.name, m.version, m.sha256))
            .collect();
        let expected: Vec<(String, String, Option<String>)> = expected
            .iter()
            .map(|(n, v, d)| ((*n).into(), (*v).into(), d.map(str::to_owned)))
            .collect();
        assert_eq!(found, expected);
    }

    /// The boot kind capture assumes, in the daemon's order: `--boot`,
    /// then a wake (annotation or the stack's event; a wake stays one for
    /// work left `running`), then `resumed` for work left `running`.
    #[rstest::rstest]
    #[case::nothing(false, false, false, None)]
    #[case::running(false, false, true, Some(BootKind::Resumed))]
    #[case::annotated_wake(true, false, false, None)]
    #[case::annotated_wake_running(true, false, true, Some(BootKind::Wake))]
    #[case::event_wake(false, true, false, Some(BootKind::Wake))]
    #[case::event_wake_running(false, true, true, Some(BootKind::Wake))]
    fn a_wake_comes_before_resumed_work(
        #[case] annotated: bool,
        #[case] event: bool,
        #[case] running: bool,
        #[case] expected: Option<BootKind>,
    ) {
        // A managed Cloud Hypervisor Linux clone with a DHCP NIC, as the
        // daemon's decision sees it.
        let mut pod = PodInput {
            name: "desk-0".into(),
            namespace: "desktops".into(),
            uid: Some("u-1".into()),
            ..PodInput::default()
        };
        let name = fixup_core::binding::vm_name_for_pod("desktops", "desk-0");
        for (key, value) in [
            (annotations::VM_ID, "vm-0123abcd"),
            (annotations::VM_NAME, name.as_str()),
            ("cocoonset.cocoonstack.io/managed", "true"),
            ("cocoonset.cocoonstack.io/os", "linux"),
            ("cocoonset.cocoonstack.io/generation", "3"),
            ("vm.cocoonstack.io/backend", "cloud-hypervisor"),
        ] {
            pod.annotations.insert(key.into(), value.into());
        }
        if annotated {
            pod.annotations
                .insert(annotations::RESTORE_FROM_HIBERNATE.into(), "true".into());
        }
        if running {
            pod.annotations
                .insert(keys::POST_CLONE_STATE.into(), "running".into());
        }
        let vm = VmInspect::from_json(
            &json!({"id": "vm-0123abcd", "config": {"name": name},
                "network_configs": [{"mac": "52:54:00:aa:bb:01", "tap": "tap0"}]})
            .to_string(),
            "cocoon vm inspect",
        )
        .unwrap();
        let events = [StackEvent {
            reason: "Woken".into(),
            type_: "Normal".into(),
            reporting_controller: "vk-cocoon".into(),
            regarding_uid: "u-1".into(),
            newest_unix_ms: Some(1_000),
        }];
        let events: &[StackEvent] = if event { &events } else { &[] };
        let replayed = replay(&pod, &vm, events, &WakeConfig::default(), 2_000);
        let observed = replayed
            .observed
            .expect("the daemon's decision classifies the VM");
        let why = assumed_why(&pod, &vm, &observed);
        assert_eq!(why.is_some(), expected.is_some(), "{why:?}");
        if let Some(expected) = expected {
            assert_eq!(observed.boot, Some(expected));
        }
    }

    fn case(plugin: &str, scenario: Scenario) -> CapturedCase {
        CapturedCase {
            plugin: plugin.into(),
            file: None,
            scenario,
            expect: "plan",
            text: "{}\n".into(),
        }
    }

    fn two() -> Vec<CapturedCase> {
        vec![
            case("fc-mac", Scenario::FcMac),
            case("oci-networkd", Scenario::OciNetworkd),
        ]
    }

    #[test]
    fn one_case_goes_to_stdout_or_the_file_several_need_a_folder_or_a_plugin() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("case.json");
        let one = || vec![case("oci-networkd", Scenario::OciNetworkd)];
        assert_eq!(place(one(), None, None, false).unwrap()[0].1, None);
        assert_eq!(
            place(one(), Some(&file), None, false).unwrap()[0].1,
            Some(file.clone())
        );
        let into_dir = place(one(), Some(dir.path()), None, false).unwrap();
        assert_eq!(
            into_dir[0].1,
            Some(dir.path().join("oci-networkd-oci-networkd.json"))
        );

        let err = place(two(), None, None, false).unwrap_err().to_string();
        assert!(
            err.contains("--output DIR") && err.contains("--plugin NAME"),
            "{err}"
        );
        std::fs::write(&file, "x").unwrap();
        let err = place(two(), Some(&file), None, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("is a file"), "{err}");
        let picked = place(two(), None, Some("fc-mac"), false).unwrap();
        assert_eq!(picked.len(), 1);
        assert_eq!(picked[0].0.scenario, Scenario::FcMac);
        let err = place(two(), None, Some("acme"), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("fc-mac (fc-mac), oci-networkd (oci-networkd)"),
            "{err}"
        );
    }

    #[test]
    fn a_trailing_slash_makes_a_folder_and_a_new_name_without_one_is_refused_for_several() {
        let dir = tempfile::tempdir().unwrap();
        // One case into a folder that does not exist yet.
        let cases = dir.path().join("cases/");
        let one = vec![case("oci-networkd", Scenario::OciNetworkd)];
        let placed = place(one, Some(&cases), None, false).unwrap();
        assert!(cases.is_dir(), "created");
        assert_eq!(
            placed[0].1.as_deref(),
            Some(cases.join("oci-networkd-oci-networkd.json").as_path())
        );
        // Several into a new name without the slash: refused, nothing made.
        let web = dir.path().join("web.json");
        let err = place(two(), Some(&web), None, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not end with /"), "{err}");
        assert!(!web.exists(), "no folder made");
        let each = place(two(), Some(&dir.path().join("new/")), None, false).unwrap();
        assert_eq!(
            each[1].1.as_deref(),
            Some(
                dir.path()
                    .join("new/oci-networkd-oci-networkd.json")
                    .as_path()
            )
        );
    }

    #[test]
    fn several_cases_of_one_plugin_suggest_only_a_folder() {
        let same = vec![
            case("oci-networkd", Scenario::OciNetworkd),
            case("oci-networkd", Scenario::FcMac),
        ];
        let err = place(same, None, Some("oci-networkd"), false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--output DIR/"), "{err}");
        assert!(!err.contains("--plugin NAME"), "{err}");
    }

    #[test]
    fn an_existing_target_is_refused_without_force_and_a_link_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, "keep").unwrap();
        let link = dir.path().join("case.json");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let one = || vec![case("oci-networkd", Scenario::OciNetworkd)];

        let err = place(one(), Some(&link), None, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--force"), "{err}");
        // A file that appears after the check is not replaced either.
        let placed = vec![(
            case("oci-networkd", Scenario::OciNetworkd),
            Some(link.clone()),
        )];
        assert!(write(&placed, false).is_err());
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "keep");

        let placed = place(one(), Some(&link), None, true).unwrap();
        write(&placed, true).unwrap();
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "keep");
        assert!(!link.symlink_metadata().unwrap().is_symlink(), "replaced");
        assert_eq!(std::fs::read_to_string(&link).unwrap(), "{}\n");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 2, "no temporary file left");
    }

    #[test]
    fn with_several_cases_every_target_is_checked_before_any_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let second = dir.path().join("oci-networkd-oci-networkd.json");
        std::fs::write(&second, "old").unwrap();
        let err = place(two(), Some(dir.path()), None, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("oci-networkd-oci-networkd.json exists"),
            "{err}"
        );
        assert!(!dir.path().join("fc-mac-fc-mac.json").exists());
        assert_eq!(std::fs::read_to_string(&second).unwrap(), "old");
    }

    #[test]
    fn a_write_error_names_its_cause_once() {
        let err = CaptureError::Write {
            path: "/x/case.json".into(),
            source: std::io::Error::other("disk on fire"),
        };
        // As `{:#}` shows an error: each link of the chain, joined.
        let mut shown = err.to_string();
        let mut cause = std::error::Error::source(&err);
        while let Some(c) = cause {
            shown = format!("{shown}: {c}");
            cause = c.source();
        }
        assert_eq!(shown.matches("disk on fire").count(), 1, "{shown}");
        assert!(shown.starts_with("cannot write /x/case.json"), "{shown}");
    }

    fn event_at(time: &str, reason: &str, message: &str) -> PodEvent {
        PodEvent {
            kind: "Warning".into(),
            reason: reason.into(),
            message: message.into(),
            time: Some(time.into()),
            count: None,
        }
    }

    #[test]
    fn the_newest_events_are_kept() {
        let mut events: Vec<PodEvent> = (0..MAX_EVENTS + 5)
            .rev()
            .map(|i| {
                event_at(
                    &format!("2026-12-01T10:{:02}:{:02}Z", i / 60, i % 60),
                    "PostCloneX",
                    "m",
                )
            })
            .collect();
        assert!(keep_newest(&mut events));
        assert_eq!(events.len(), MAX_EVENTS);
        assert_eq!(events[0].time.as_deref(), Some("2026-12-01T10:00:05Z"));
        let mut few = vec![
            event_at("b", "PostCloneX", "m"),
            event_at("a", "PostCloneX", "m"),
        ];
        assert!(!keep_newest(&mut few));
        assert_eq!(few[0].time.as_deref(), Some("a"));
    }

    #[test]
    fn plugins_named_are_listed_once_even_when_not_adjacent() {
        let fallback = "plugin acme 1.2.0 (sha256:abc123) failed for oci-networkd: x; planned with the built-in oci-networkd 0.1.0 instead";
        let other = "plugin other 2.0.0 (sha256:def456) failed";
        let events = [
            event_at("1", "PostClonePluginFallback", fallback),
            event_at("2", "PostClonePluginFallback", other),
            event_at("3", "PostClonePluginFallback", fallback),
        ];
        let field = field_record(&PodInput::default(), &events, true).expect("recorded");
        let named: Vec<&str> = field["plugins_named"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap())
            .collect();
        assert_eq!(named, ["acme", "oci-networkd", "other"]);
        assert_eq!(field["events_truncated"], true);
    }
}
