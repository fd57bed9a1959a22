//! The pod's events a capture keeps: the host's own reasons, newest first
//! and at most [`MAX_EVENTS`].

use serde::Serialize;
use serde_json::Value;

use fixup_core::annotations::reasons;
use fixup_core::facts::PodInput;
use fixup_core::memory::StackEvent;

use super::CaptureError;

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
