//! Rule 2 of spec section 2, "Recognising a hibernate wake": the stack's
//! own record of a wake, its events about the pod, as pure functions of
//! events the caller listed (events.k8s.io/v1, selected by
//! `regarding.uid`).
//!
//! Upstream emits a Warning `HibernateSnapshotExists` when a create finds
//! a hibernate snapshot for the pod's VM name (before it pulls the
//! snapshot and clones), and a Normal `Woken` after an in-place wake's
//! clone. Anyone who may create events in the namespace can forge one; a
//! forgery can only make the forger's own clone a wake (less runs in its
//! own VM), never point the host at another VM.

use std::time::Duration;

use crate::capture::REPORTER;

/// How long before the VM record's `created_at` a wake event may be and
/// still speak for the VM: 30 minutes, the spec's default; the caller
/// passes the configured window to [`events_say_wake`].
pub const WAKE_EVENT_WINDOW: Duration = Duration::from_secs(30 * 60);

/// The event reasons of upstream's wakes.
pub mod reasons {
    /// Normal: an in-place wake cloned the VM from its hibernate snapshot.
    pub const WOKEN: &str = "Woken";
    /// Warning: a create found a hibernate snapshot for the pod's VM.
    pub const HIBERNATE_SNAPSHOT_EXISTS: &str = "HibernateSnapshotExists";
}

/// An event's `type` for [`StackEvent::type_`].
pub const NORMAL: &str = "Normal";
/// An event's `type` for [`StackEvent::type_`].
pub const WARNING: &str = "Warning";

/// The parts of an event the rule reads, as the API server has them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StackEvent {
    /// `reason`.
    pub reason: String,
    /// `type`: `Normal` or `Warning`.
    pub type_: String,
    /// `reportingController`.
    pub reporting_controller: String,
    /// `regarding.uid`.
    pub regarding_uid: String,
    /// The newest occurrence, in milliseconds since the Unix epoch: the
    /// series' `lastObservedTime` when the event has a series, else
    /// `eventTime` (else the deprecated timestamps the API server still
    /// fills for core/v1 writers); `None` when it has none.
    pub newest_unix_ms: Option<i64>,
}

impl StackEvent {
    /// An Event as the API server prints it (JSON), events.k8s.io/v1 or
    /// core/v1 (what `kubectl get events -o json` prints): the fields the
    /// rule reads, each absent or of another type read as empty (a time
    /// that is no RFC 3339 time as none). The pod is `regarding.uid`, else
    /// `involvedObject.uid`; the reporter `reportingController`, else
    /// `reportingComponent`. The newest occurrence is
    /// `series.lastObservedTime`, else `eventTime`, else
    /// `deprecatedLastTimestamp`, else `lastTimestamp`, else
    /// `metadata.creationTimestamp`.
    pub fn from_value(event: &serde_json::Value) -> StackEvent {
        let text = |pointer: &str| {
            event
                .pointer(pointer)
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let either = |first: &str, second: &str| match text(first) {
            value if value.is_empty() => text(second),
            value => value,
        };
        let time = |pointer: &str| {
            event
                .pointer(pointer)
                .and_then(serde_json::Value::as_str)
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .map(|t| t.as_millisecond())
        };
        StackEvent {
            reason: text("/reason"),
            type_: text("/type"),
            reporting_controller: either("/reportingController", "/reportingComponent"),
            regarding_uid: either("/regarding/uid", "/involvedObject/uid"),
            newest_unix_ms: time("/series/lastObservedTime")
                .or_else(|| time("/eventTime"))
                .or_else(|| time("/deprecatedLastTimestamp"))
                .or_else(|| time("/lastTimestamp"))
                .or_else(|| time("/metadata/creationTimestamp")),
        }
    }

    /// The event as the API server prints it, with what
    /// [`from_value`](Self::from_value) reads (the time as `eventTime`).
    pub fn to_value(&self) -> serde_json::Value {
        let mut event = serde_json::json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "reason": self.reason,
            "type": self.type_,
            "reportingController": self.reporting_controller,
            "regarding": {"kind": "Pod", "uid": self.regarding_uid},
        });
        if let Some(at) = self
            .newest_unix_ms
            .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        {
            event["eventTime"] = serde_json::Value::String(at.to_string());
        }
        event
    }
}

/// Whether `event` is about the pod `pod_uid`, not the host's own, and
/// recent enough: its newest occurrence no earlier than `window` before
/// the VM record's `created_at`.
fn counts(
    event: &StackEvent,
    pod_uid: &str,
    vm_created_unix_ms: Option<i64>,
    window: Duration,
) -> bool {
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    !pod_uid.is_empty()
        && event.regarding_uid == pod_uid
        && event.reporting_controller != REPORTER
        && event.newest_unix_ms.is_some_and(|newest| {
            vm_created_unix_ms.is_none_or(|created| newest >= created.saturating_sub(window_ms))
        })
}

fn is_woken(event: &StackEvent) -> bool {
    event.type_ == NORMAL && event.reason == reasons::WOKEN
}

fn is_snapshot_found(event: &StackEvent) -> bool {
    event.type_ == WARNING && event.reason == reasons::HIBERNATE_SNAPSHOT_EXISTS
}

/// Rule 2: some event about the pod (`regarding.uid` = `pod_uid`) is a
/// Normal `Woken` or a Warning `HibernateSnapshotExists`, not reported by
/// `cocoon-fixup`, whose newest occurrence is no earlier than `window`
/// ([`WAKE_EVENT_WINDOW`] by default) before the VM record's `created_at`
/// (`vm_created_unix_ms`). Reasons and types compare exactly. An event
/// without a time does not count: nothing places it near this VM.
///
/// When `created_at` is unknown (`None`), every such event with a time
/// counts. The window is there to keep an event of an earlier VM of the
/// pod from speaking for this one, and an earlier VM's wake event still
/// points the right way: upstream gives a pod uid a new VM only by
/// restoring it from its hibernate snapshot, or afresh when that snapshot
/// was deleted, which rule 3 takes for a wake too. The pod's first VM has
/// no such event unless it was forged, and a forgery only affects the
/// forger's own pod. Events also expire (the API server's event TTL, one
/// hour by default), which bounds how old one can be.
pub fn events_say_wake(
    events: &[StackEvent],
    pod_uid: &str,
    vm_created_unix_ms: Option<i64>,
    window: Duration,
) -> bool {
    events.iter().any(|event| {
        (is_woken(event) || is_snapshot_found(event))
            && counts(event, pod_uid, vm_created_unix_ms, window)
    })
}

/// The grace of spec section 2 ends early: a Normal `Woken` about the pod
/// arrived, with the same conditions as [`events_say_wake`] (not the
/// host's own, a time, within `window` of `created_at`). When this holds,
/// `events_say_wake` holds too; the VM is then a wake by
/// [`Evidence::Woken`](super::Evidence::Woken), an in-place one.
pub fn woken_event_seen(
    events: &[StackEvent],
    pod_uid: &str,
    vm_created_unix_ms: Option<i64>,
    window: Duration,
) -> bool {
    events
        .iter()
        .any(|event| is_woken(event) && counts(event, pod_uid, vm_created_unix_ms, window))
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    const UID: &str = "0b7c-uid";
    /// The VM record's `created_at`.
    const CREATED: i64 = 1_800_000_000_000;
    const MINUTE: i64 = 60_000;

    fn event(reason: &str, type_: &str, newest: Option<i64>) -> StackEvent {
        StackEvent {
            reason: reason.into(),
            type_: type_.into(),
            reporting_controller: "vk-cocoon".into(),
            regarding_uid: UID.into(),
            newest_unix_ms: newest,
        }
    }

    fn woken() -> StackEvent {
        event(reasons::WOKEN, NORMAL, Some(CREATED + MINUTE))
    }

    fn snapshot_found() -> StackEvent {
        event(
            reasons::HIBERNATE_SNAPSHOT_EXISTS,
            WARNING,
            Some(CREATED - MINUTE),
        )
    }

    /// Which events make rule 2 hold, and which end the grace.
    #[rstest]
    #[case::woken(woken(), Some(CREATED), true, true)]
    #[case::snapshot_exists(snapshot_found(), Some(CREATED), true, false)]
    #[case::wrong_uid(StackEvent { regarding_uid: "other".into(), ..woken() }, Some(CREATED), false, false)]
    #[case::woken_as_a_warning(StackEvent { type_: WARNING.into(), ..woken() }, Some(CREATED), false, false)]
    #[case::snapshot_exists_as_normal(StackEvent { type_: NORMAL.into(), ..snapshot_found() }, Some(CREATED), false, false)]
    #[case::type_not_exact(StackEvent { type_: "normal".into(), ..woken() }, Some(CREATED), false, false)]
    #[case::reason_not_exact(StackEvent { reason: "woken".into(), ..woken() }, Some(CREATED), false, false)]
    #[case::another_reason(event("Started", NORMAL, Some(CREATED)), Some(CREATED), false, false)]
    #[case::reported_by_cocoon_fixup(StackEvent { reporting_controller: REPORTER.into(), ..woken() }, Some(CREATED), false, false)]
    #[case::reporter_is_compared_exactly(StackEvent { reporting_controller: "cocoon-fixup2".into(), ..woken() }, Some(CREATED), true, true)]
    #[case::at_the_window_edge(event(reasons::WOKEN, NORMAL, Some(CREATED - 30 * MINUTE)), Some(CREATED), true, true)]
    #[case::too_old(event(reasons::WOKEN, NORMAL, Some(CREATED - 30 * MINUTE - 1)), Some(CREATED), false, false)]
    #[case::too_old_snapshot(event(reasons::HIBERNATE_SNAPSHOT_EXISTS, WARNING, Some(CREATED - 31 * MINUTE)), Some(CREATED), false, false)]
    #[case::no_time(event(reasons::WOKEN, NORMAL, None), Some(CREATED), false, false)]
    #[case::no_time_no_created_at(event(reasons::WOKEN, NORMAL, None), None, false, false)]
    #[case::old_without_created_at(event(reasons::WOKEN, NORMAL, Some(0)), None, true, true)]
    fn events(
        #[case] event: StackEvent,
        #[case] created: Option<i64>,
        #[case] wake: bool,
        #[case] ends_grace: bool,
    ) {
        let events = [event];
        assert_eq!(
            events_say_wake(&events, UID, created, WAKE_EVENT_WINDOW),
            wake,
            "events_say_wake"
        );
        assert_eq!(
            woken_event_seen(&events, UID, created, WAKE_EVENT_WINDOW),
            ends_grace,
            "woken_event_seen"
        );
    }

    #[test]
    fn one_event_that_counts_is_enough_and_an_empty_uid_matches_nothing() {
        let events = [
            StackEvent {
                regarding_uid: "other".into(),
                ..woken()
            },
            snapshot_found(),
        ];
        assert!(events_say_wake(
            &events,
            UID,
            Some(CREATED),
            WAKE_EVENT_WINDOW
        ));
        assert!(!events_say_wake(&[], UID, Some(CREATED), WAKE_EVENT_WINDOW));
        let unattributed = [StackEvent {
            regarding_uid: String::new(),
            ..woken()
        }];
        assert!(!events_say_wake(&unattributed, "", None, WAKE_EVENT_WINDOW));
        assert!(!woken_event_seen(
            &unattributed,
            "",
            None,
            WAKE_EVENT_WINDOW
        ));
    }

    #[test]
    fn the_window_is_a_parameter() {
        let events = [event(reasons::WOKEN, NORMAL, Some(CREATED - 5 * MINUTE))];
        assert!(!events_say_wake(
            &events,
            UID,
            Some(CREATED),
            Duration::from_secs(60)
        ));
        assert!(events_say_wake(
            &events,
            UID,
            Some(CREATED),
            Duration::from_secs(600)
        ));
    }
}
