//! Rule 2 of spec section 2, "Recognising a hibernate wake": the stack's
//! own record of a wake, its events about the pod, as pure functions of
//! events the caller listed (events.k8s.io/v1, selected by the API server
//! with [`field_selectors`]).
//!
//! Upstream emits a Warning `HibernateSnapshotExists` when a create finds
//! a hibernate snapshot for the pod's VM name (before it pulls the
//! snapshot and clones), and a Normal `Woken` after an in-place wake's
//! clone. Anyone who may create events in the namespace can forge one
//! (the reporter and the time are only claims), so an event may only
//! ever take work away: it makes a clone a wake (no PnP for a CH Windows
//! guest, the wake wording), and it confirms the host's own hibernate
//! history; it never starts work in a VM that has none without it, and
//! never points the host at another VM. `deploy/wake-event-policy.yaml`
//! refuses these two reasons from anyone but the stack.

use std::time::Duration;

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

/// How far after the host's own clock an event may be dated and still
/// count: clocks of the API server's clients differ a little, but an event
/// dated further ahead was not written by a clock, and is no evidence.
pub const CLOCK_SKEW: Duration = Duration::from_secs(60);

/// The `reportingController` of the events the host writes (its field
/// manager too).
pub const REPORTER: &str = "cocoon-fixup";

/// The stack's event source: the `reportingController` of the wake events
/// vk-cocoon emits, and the one accepted reporter unless configured
/// otherwise (`--wake-event-reporter`).
pub const STACK_REPORTER: &str = "vk-cocoon";

/// The two kinds of wake event: (`reason`, `type`).
pub const WAKE_EVENTS: [(&str, &str); 2] = [
    (reasons::WOKEN, NORMAL),
    (reasons::HIBERNATE_SNAPSHOT_EXISTS, WARNING),
];

/// Why a reporter name cannot be one the host accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReporterError {
    #[error("a wake event reporter must not be empty")]
    Empty,
    #[error("wake event reporter {0:?}: cocoon-fixup's own events are never evidence of a wake")]
    Own(String),
    #[error(
        "wake event reporter {0:?}: at most 128 bytes of letters, digits and `.`, `_`, `-`, `:`, `/` (an event's reportingController)"
    )]
    Invalid(String),
}

/// Check a configured reporter name: what an event's `reportingController`
/// may hold (at most 128 bytes), limited to the characters a field
/// selector takes without escaping, and never `cocoon-fixup` itself.
pub fn check_reporter(name: &str) -> Result<(), ReporterError> {
    if name.is_empty() {
        return Err(ReporterError::Empty);
    }
    if name == REPORTER {
        return Err(ReporterError::Own(name.to_owned()));
    }
    let fits = name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':' | b'/'));
    if !fits {
        return Err(ReporterError::Invalid(name.to_owned()));
    }
    Ok(())
}

/// The field selectors (events.k8s.io/v1) that ask the API server for
/// exactly the events that can count for the pod `pod_uid`: one per kind
/// of wake event and accepted reporter. Events of other reasons, types or
/// reporters are never listed, so they cannot fill the listing. The pod
/// uid is one the API server assigned (a UUID); reporters passed
/// [`check_reporter`], so nothing needs escaping.
pub fn field_selectors(pod_uid: &str, reporters: &[String]) -> Vec<String> {
    WAKE_EVENTS
        .iter()
        .flat_map(|(reason, type_)| {
            reporters.iter().map(move |reporter| {
                format!(
                    "regarding.uid={pod_uid},reason={reason},type={type_},reportingController={reporter}"
                )
            })
        })
        .collect()
}

/// Whether `event` has every `field=value` of a field selector of
/// events.k8s.io/v1 over the fields [`field_selectors`] names
/// (`regarding.uid`, `reason`, `type`, `reportingController`), as the API
/// server selects: for the host's own stand-ins of it. Another field, or a
/// term that is no `field=value`, is refused with why, as the API server
/// refuses it.
pub fn selects(selector: &str, event: &StackEvent) -> Result<bool, String> {
    let mut all = true;
    for term in selector.split(',') {
        let (field, value) = term
            .split_once('=')
            .ok_or_else(|| format!("invalid field selector term {term:?}"))?;
        let have = match field {
            "regarding.uid" => &event.regarding_uid,
            "reason" => &event.reason,
            "type" => &event.type_,
            "reportingController" => &event.reporting_controller,
            other => return Err(format!("field label not supported: {other}")),
        };
        all &= have == value;
    }
    Ok(all)
}

/// What a host listed for [`field_selectors`]: every event each selector
/// selected, and whether a listing was cut short (more matched than the
/// host reads, [`LISTED_AT_MOST`] a selector). A cut listing may hide the
/// stack's own event behind others that match the same selector (only a
/// forger makes those): the decision then reads it as a witness where that
/// only takes work away.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listed {
    pub events: Vec<StackEvent>,
    pub truncated: bool,
}

/// The most events a host reads of one selector: the daemon's two pages of
/// 500. More than that about one pod, reason and reporter were forged.
pub const LISTED_AT_MOST: usize = 1000;

/// What makes an event the stack's witness of a wake of one VM of one pod
/// (spec section 2, rule 2).
///
/// Events are user input: anyone who may create events in the namespace
/// can write one with any reporter and any time. So an event counts only
/// when it is about this pod (`regarding.uid`), names an accepted reporter
/// (never `cocoon-fixup`), has a time, and that time is no earlier than
/// `window` before the VM record's `created_at` and no later than the
/// host's clock plus [`CLOCK_SKEW`]. Without the host's clock no event
/// counts: nothing then bounds a time set in the future. Even an event
/// that counts only ever takes work away (the decision never lets an
/// event start work in a VM that has none without it).
#[derive(Debug, Clone, Copy)]
pub struct Witness<'a> {
    /// The pod's `metadata.uid`.
    pub pod_uid: &'a str,
    /// The accepted reporters (`reportingController`).
    pub reporters: &'a [String],
    /// The VM record's `created_at`, in milliseconds since the Unix epoch.
    pub vm_created_unix_ms: Option<i64>,
    /// How long before `created_at` an event may be ([`WAKE_EVENT_WINDOW`]
    /// by default).
    pub window: Duration,
    /// The host's wall clock now, in milliseconds since the Unix epoch.
    pub now_unix_ms: Option<i64>,
}

impl Witness<'_> {
    fn counts(&self, event: &StackEvent) -> bool {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let (Some(newest), Some(now)) = (event.newest_unix_ms, self.now_unix_ms) else {
            return false;
        };
        !self.pod_uid.is_empty()
            && event.regarding_uid == self.pod_uid
            && event.reporting_controller != REPORTER
            && self.reporters.contains(&event.reporting_controller)
            && newest <= now.saturating_add(ms(CLOCK_SKEW))
            && self
                .vm_created_unix_ms
                .is_none_or(|created| newest >= created.saturating_sub(ms(self.window)))
    }

    /// Rule 2: some event is a Normal `Woken` or a Warning
    /// `HibernateSnapshotExists` that counts. Reasons and types compare
    /// exactly.
    ///
    /// When `created_at` is unknown, every such event that counts
    /// otherwise counts: the window keeps an event of an earlier VM of the
    /// pod from speaking for this one, and events expire (the API server's
    /// event TTL, one hour by default), which bounds how old one can be.
    pub fn says_wake(&self, events: &[StackEvent]) -> bool {
        events
            .iter()
            .any(|event| (is_woken(event) || is_snapshot_found(event)) && self.counts(event))
    }

    /// A Normal `Woken` that counts arrived: the wake happened in place
    /// ([`Evidence::Woken`](super::Evidence::Woken)). When this holds,
    /// [`says_wake`](Self::says_wake) holds too.
    pub fn woken(&self, events: &[StackEvent]) -> bool {
        events
            .iter()
            .any(|event| is_woken(event) && self.counts(event))
    }
}

fn is_woken(event: &StackEvent) -> bool {
    event.type_ == NORMAL && event.reason == reasons::WOKEN
}

fn is_snapshot_found(event: &StackEvent) -> bool {
    event.type_ == WARNING && event.reason == reasons::HIBERNATE_SNAPSHOT_EXISTS
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    const UID: &str = "0b7c-uid";
    /// The VM record's `created_at`.
    const CREATED: i64 = 1_800_000_000_000;
    const MINUTE: i64 = 60_000;
    /// The host's clock: ten minutes after `created_at`.
    const NOW: i64 = CREATED + 10 * MINUTE;

    fn reporters() -> Vec<String> {
        vec![STACK_REPORTER.to_owned()]
    }

    fn witness<'a>(reporters: &'a [String], created: Option<i64>, now: Option<i64>) -> Witness<'a> {
        Witness {
            pod_uid: UID,
            reporters,
            vm_created_unix_ms: created,
            window: WAKE_EVENT_WINDOW,
            now_unix_ms: now,
        }
    }

    fn event(reason: &str, type_: &str, newest: Option<i64>) -> StackEvent {
        StackEvent {
            reason: reason.into(),
            type_: type_.into(),
            reporting_controller: STACK_REPORTER.into(),
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
    #[case::another_reporter(StackEvent { reporting_controller: "kubelet".into(), ..woken() }, Some(CREATED), false, false)]
    #[case::no_reporter(StackEvent { reporting_controller: String::new(), ..woken() }, Some(CREATED), false, false)]
    #[case::reporter_is_compared_exactly(StackEvent { reporting_controller: "vk-cocoon2".into(), ..woken() }, Some(CREATED), false, false)]
    #[case::at_the_window_edge(event(reasons::WOKEN, NORMAL, Some(CREATED - 30 * MINUTE)), Some(CREATED), true, true)]
    #[case::too_old(event(reasons::WOKEN, NORMAL, Some(CREATED - 30 * MINUTE - 1)), Some(CREATED), false, false)]
    #[case::too_old_snapshot(event(reasons::HIBERNATE_SNAPSHOT_EXISTS, WARNING, Some(CREATED - 31 * MINUTE)), Some(CREATED), false, false)]
    #[case::no_time(event(reasons::WOKEN, NORMAL, None), Some(CREATED), false, false)]
    #[case::no_time_no_created_at(event(reasons::WOKEN, NORMAL, None), None, false, false)]
    #[case::old_without_created_at(event(reasons::WOKEN, NORMAL, Some(0)), None, true, true)]
    #[case::within_the_skew(event(reasons::WOKEN, NORMAL, Some(NOW + MINUTE)), Some(CREATED), true, true)]
    #[case::past_the_skew(event(reasons::WOKEN, NORMAL, Some(NOW + MINUTE + 1)), Some(CREATED), false, false)]
    #[case::dated_2099(
        event(reasons::WOKEN, NORMAL, Some(4_070_908_800_000)),
        Some(CREATED),
        false,
        false
    )]
    #[case::snapshot_in_the_future(event(reasons::HIBERNATE_SNAPSHOT_EXISTS, WARNING, Some(NOW + 2 * MINUTE)), None, false, false)]
    fn events(
        #[case] event: StackEvent,
        #[case] created: Option<i64>,
        #[case] wake: bool,
        #[case] ends_grace: bool,
    ) {
        let events = [event];
        let reporters = reporters();
        let witness = witness(&reporters, created, Some(NOW));
        assert_eq!(witness.says_wake(&events), wake, "says_wake");
        assert_eq!(witness.woken(&events), ends_grace, "woken");
    }

    #[test]
    fn without_the_hosts_clock_no_event_counts() {
        let reporters = reporters();
        let witness = witness(&reporters, Some(CREATED), None);
        assert!(!witness.says_wake(&[woken(), snapshot_found()]));
        assert!(!witness.woken(&[woken()]));
    }

    #[test]
    fn the_reporters_are_configuration() {
        let reporters = vec!["cocoon-operator".to_owned(), "vk-cocoon-eu".to_owned()];
        let witness = witness(&reporters, Some(CREATED), Some(NOW));
        assert!(!witness.says_wake(&[woken()]), "vk-cocoon is not listed");
        let eu = StackEvent {
            reporting_controller: "vk-cocoon-eu".into(),
            ..woken()
        };
        assert!(witness.says_wake(std::slice::from_ref(&eu)));
        assert!(witness.woken(&[eu]));
    }

    #[test]
    fn one_event_that_counts_is_enough_and_an_empty_uid_matches_nothing() {
        let reporters = reporters();
        let events = [
            StackEvent {
                regarding_uid: "other".into(),
                ..woken()
            },
            snapshot_found(),
        ];
        assert!(witness(&reporters, Some(CREATED), Some(NOW)).says_wake(&events));
        assert!(!witness(&reporters, Some(CREATED), Some(NOW)).says_wake(&[]));
        let unattributed = [StackEvent {
            regarding_uid: String::new(),
            ..woken()
        }];
        let blank = Witness {
            pod_uid: "",
            ..witness(&reporters, None, Some(NOW))
        };
        assert!(!blank.says_wake(&unattributed));
        assert!(!blank.woken(&unattributed));
    }

    #[test]
    fn the_window_is_a_parameter() {
        let reporters = reporters();
        let events = [event(reasons::WOKEN, NORMAL, Some(CREATED - 5 * MINUTE))];
        let narrow = Witness {
            window: Duration::from_secs(60),
            ..witness(&reporters, Some(CREATED), Some(NOW))
        };
        assert!(!narrow.says_wake(&events));
        let wide = Witness {
            window: Duration::from_secs(600),
            ..narrow
        };
        assert!(wide.says_wake(&events));
    }

    #[test]
    fn the_listing_asks_for_exactly_the_events_that_count() {
        let reporters = vec!["vk-cocoon".to_owned(), "vk-cocoon-eu".to_owned()];
        assert_eq!(
            field_selectors("u-1", &reporters),
            [
                "regarding.uid=u-1,reason=Woken,type=Normal,reportingController=vk-cocoon",
                "regarding.uid=u-1,reason=Woken,type=Normal,reportingController=vk-cocoon-eu",
                "regarding.uid=u-1,reason=HibernateSnapshotExists,type=Warning,reportingController=vk-cocoon",
                "regarding.uid=u-1,reason=HibernateSnapshotExists,type=Warning,reportingController=vk-cocoon-eu",
            ]
        );
    }

    #[rstest]
    #[case::stack("vk-cocoon", true)]
    #[case::domain_style("cocoonstack.io/vk-cocoon", true)]
    #[case::empty("", false)]
    #[case::own(REPORTER, false)]
    #[case::comma("vk,cocoon", false)]
    #[case::equals("vk=cocoon", false)]
    #[case::space("vk cocoon", false)]
    #[case::too_long(&"v".repeat(129), false)]
    #[case::longest(&"v".repeat(128), true)]
    fn reporters_are_checked(#[case] name: &str, #[case] ok: bool) {
        assert_eq!(check_reporter(name).is_ok(), ok, "{name:?}");
    }
}
