//! Why a task ended without an outcome, and when a host handles the pod
//! again: the one retry policy of the daemon and every embedder.

use std::time::Duration;

use serde::Serialize;

use super::{NodeError, PodError, RecordFact, Trigger};

/// How long a host waits between tries of a pod that stopped
/// ([`Stop::again`]): `first` after the first stop, doubling each stop in
/// a row up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    /// One second, doubling to a minute.
    fn default() -> Self {
        Backoff {
            first: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

/// When and how to handle a stopped pod again ([`Stop::again`]): wait
/// `after`, then start a task with `trigger`, telling it `tries`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Again {
    #[serde(rename = "after_ms", serialize_with = "serialize_ms")]
    pub after: Duration,
    pub trigger: Trigger,
    /// The stops in a row so far, this one counted: what the next try
    /// passes back as its own `tries`.
    pub tries: u32,
}

fn serialize_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Why a task ended without an outcome: tried again later, or not at all
/// ([`Stop::is_retryable`]).
#[derive(Debug, thiserror::Error)]
pub enum Stop {
    /// The pod could not be read: no pod by that name.
    #[error("pod {pod} not found: it was deleted, or the namespace or name is wrong")]
    NotFound { pod: String },
    #[error(
        "pod {pod} has no uid: it is not a live pod object (pass a pod read from the API server)"
    )]
    NoUid { pod: String },
    #[error(
        "pod {pod} names no VM yet (no {} or {} annotation): wait until cocoon has created it",
        crate::facts::annotations::VM_ID,
        crate::facts::annotations::VM_NAME
    )]
    NoVm { pod: String },
    /// `cocoon vm inspect` failed.
    #[error("pod {pod}: {message}")]
    Inspect { pod: String, message: String },
    /// The embedder's inspect said the VM does not exist (`inspect_gone`):
    /// this pod's VM is over, and its next VM is a new task. Not retried.
    #[error("pod {pod}: the VM is gone: {message}")]
    VmGone { pod: String, message: String },
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error(transparent)]
    Api(#[from] PodError),
    /// The API server refused the `running` write (401, 403, 422, an
    /// admission denial): nothing ran, and unlike another refusal the work
    /// is tried again with backoff, so the pod is never left `creating`
    /// with nothing in flight (spec section 8).
    #[error("the running write was refused, nothing ran, and it is tried again later: {error}")]
    RunningRefused { error: PodError },
    /// The VM record's name is the pod's annotated name, which binds only
    /// when no other pod on the node claims it, and the host could not
    /// list the node's pods: nothing ran. Tried again later (the daemon's
    /// view of its node may not be complete yet).
    #[error(
        "pod {pod}: the VM record is named {name:?}, as annotation {} says, which binds only when no other pod on the node claims that name, and the node's pods could not be listed: {reason}; nothing was run",
        crate::facts::annotations::VM_NAME
    )]
    Unproven {
        pod: String,
        name: String,
        reason: String,
    },
    /// The decision needs a fact of the VM record that the embedder said
    /// its record lacks ([`Knows::record_lacks`]), and nothing else gives
    /// it: nothing was run or written. Not retried: the embedder must give
    /// it.
    #[error("pod {pod}: the decision needs the VM record's {} ({why}), which the record given lacks; nothing was run: {hint}", fact.as_str())]
    MissingFact {
        pod: String,
        fact: RecordFact,
        why: &'static str,
        hint: &'static str,
    },
}

impl Stop {
    /// A short label: `not-found`, `no-uid`, `no-vm`, `inspect`,
    /// `vm-gone`, `unproven`, `missing-fact`, the node error's kind
    /// ([`NodeError::kind`]), `api`, `refused` or `gone`.
    pub fn kind(&self) -> &'static str {
        match self {
            Stop::NotFound { .. } => "not-found",
            Stop::VmGone { .. } => "vm-gone",
            Stop::NoUid { .. } => "no-uid",
            Stop::NoVm { .. } => "no-vm",
            Stop::Inspect { .. } => "inspect",
            Stop::Unproven { .. } => "unproven",
            Stop::MissingFact { .. } => "missing-fact",
            Stop::Node(e) => e.kind(),
            Stop::Api(PodError::Gone { .. }) => "gone",
            Stop::Api(PodError::Refused { .. }) | Stop::RunningRefused { .. } => "refused",
            Stop::Api(PodError::Api { .. }) => "api",
        }
    }

    /// Whether trying the same pod again later can succeed: cocoon, the
    /// API server and the node can recover; a pod without a uid, or that
    /// names no VM, cannot until it changes.
    pub fn is_retryable(&self) -> bool {
        match self {
            Stop::Inspect { .. }
            | Stop::Unproven { .. }
            | Stop::Node(_)
            | Stop::Api(PodError::Api { .. })
            | Stop::RunningRefused { .. } => true,
            Stop::NotFound { .. }
            | Stop::VmGone { .. }
            | Stop::NoUid { .. }
            | Stop::NoVm { .. }
            | Stop::MissingFact { .. }
            | Stop::Api(PodError::Refused { .. } | PodError::Gone { .. }) => false,
        }
    }

    /// Whether the node is at fault: the pod was told once
    /// (`PostCloneNodeError`, after `ResumedAfterRestart`) and waits.
    pub fn is_node_error(&self) -> bool {
        matches!(self, Stop::Node(_))
    }

    /// Whether the task stopped after the decision of spec section 8's
    /// table (where a startup announces resumed work): a read or write of
    /// the pod, a refused `running` write, or a node error of the fixup,
    /// the plan, the lease or the console. Before it: the pod's own
    /// rows, the inspect, the binding and an unusable VM record.
    pub fn after_the_table(&self) -> bool {
        match self {
            Stop::Api(_) | Stop::RunningRefused { .. } => true,
            Stop::Node(NodeError::BadRecord { .. }) => false,
            Stop::Node(_) => true,
            Stop::NotFound { .. }
            | Stop::NoUid { .. }
            | Stop::NoVm { .. }
            | Stop::Inspect { .. }
            | Stop::VmGone { .. }
            | Stop::Unproven { .. }
            | Stop::MissingFact { .. } => false,
        }
    }

    /// [`Stop::again`] with the default [`Backoff`], as JSON (the C
    /// library's `finish` and the conformance scenarios write it so): null
    /// when trying again cannot help. A task with no trigger, a parent's
    /// preparation, is tried again as one: its trigger reads `"prepare"`.
    pub fn again_json(&self, trigger: Option<Trigger>, tries: u32) -> serde_json::Value {
        let Some(again) = self.again(trigger.unwrap_or(Trigger::Event), tries, Backoff::default())
        else {
            return serde_json::Value::Null;
        };
        let mut value = serde_json::to_value(again).expect("an again is JSON");
        if trigger.is_none() {
            value["trigger"] = serde_json::Value::from("prepare");
        }
        value
    }

    /// When and how to handle the pod again after this stop, or `None`
    /// when trying again cannot help ([`Stop::is_retryable`]). `trigger`
    /// is the stopped task's, `tries` the stops in a row before this one.
    /// The wait doubles from `backoff.first` with each stop in a row, up
    /// to `backoff.max`.
    ///
    /// The trigger says what the next try still has to tell, from what
    /// this one told ([`Stop::after_the_table`]):
    /// - after a node error (told as `PostCloneNodeError`, unless the
    ///   trigger was already [`Trigger::Retry`]), [`Trigger::Retry`],
    ///   which tells it no more;
    /// - after any other stop past the table's decision, which a startup
    ///   announced with `ResumedAfterRestart`, a startup's next try is an
    ///   [`Trigger::Event`], which does not announce it again;
    /// - any other stop keeps its trigger: a startup that stopped before
    ///   its decision (an inspect that failed) still has its announcement
    ///   to make.
    ///
    /// One case does not fit: a startup whose VM record is unusable (a
    /// node error found before the table's decision) is tried again as a
    /// [`Trigger::Retry`], so its resumed work, if any, is not announced;
    /// the node error was, and it stays the only event.
    pub fn again(&self, trigger: Trigger, tries: u32, backoff: Backoff) -> Option<Again> {
        if !self.is_retryable() {
            return None;
        }
        let doublings = tries.min(31);
        let after = backoff
            .first
            .saturating_mul(1u32 << doublings)
            .min(backoff.max);
        let trigger = match trigger {
            _ if self.is_node_error() => Trigger::Retry,
            Trigger::Startup if self.after_the_table() => Trigger::Event,
            trigger => trigger,
        };
        Some(Again {
            after,
            trigger,
            tries: tries.saturating_add(1),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inspect() -> Stop {
        Stop::Inspect {
            pod: "default/web-0".into(),
            message: "cocoon vm inspect timed out".into(),
        }
    }

    fn node() -> Stop {
        Stop::Node(NodeError::Lease {
            pod: "default/web-0".into(),
            message: "the lease file cannot be read".into(),
        })
    }

    #[test]
    fn the_wait_doubles_with_each_stop_in_a_row_up_to_the_cap() {
        let backoff = Backoff::default();
        let mut tries = 0;
        let mut waits = Vec::new();
        for _ in 0..9 {
            let again = inspect()
                .again(Trigger::Event, tries, backoff)
                .expect("an inspect failure is tried again");
            assert_eq!(again.tries, tries + 1);
            waits.push(again.after.as_secs());
            tries = again.tries;
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        // Any number of stops in a row stays at the cap.
        let far = inspect().again(Trigger::Event, u32::MAX, backoff).unwrap();
        assert_eq!(far.after, backoff.max);
        assert_eq!(far.tries, u32::MAX);
    }

    fn api() -> Stop {
        Stop::Api(PodError::Api {
            pod: "default/web-0".into(),
            reason: "the API server did not answer".into(),
        })
    }

    fn refused() -> Stop {
        Stop::RunningRefused {
            error: PodError::Refused {
                pod: "default/web-0".into(),
                reason: "403".into(),
            },
        }
    }

    fn bad_record() -> Stop {
        Stop::Node(NodeError::BadRecord {
            pod: "default/web-0".into(),
            source: crate::facts::FactError::Missing {
                pod: None,
                field: "id".into(),
                fix: "f",
            },
        })
    }

    /// The next trigger for each stop after each trigger: what the next
    /// try still has to tell.
    #[test]
    fn the_next_try_tells_only_what_this_one_did_not() {
        use Trigger::{Event, Retry, Startup};
        let backoff = Backoff::default();
        let next = |stop: Stop, trigger| stop.again(trigger, 0, backoff).unwrap().trigger;
        // Told as PostCloneNodeError: never again, whenever it was found.
        for trigger in [Event, Startup, Retry] {
            assert_eq!(next(node(), trigger), Retry, "{trigger:?}");
            assert_eq!(next(bad_record(), trigger), Retry, "{trigger:?}");
        }
        // Past the table's decision a startup announced its resumed work:
        // the next try is an event's, which still tells a node error.
        for stop in [api, refused] {
            assert_eq!(next(stop(), Startup), Event);
            assert_eq!(next(stop(), Event), Event);
            assert_eq!(next(stop(), Retry), Retry);
        }
        // Before anything was told, the trigger is kept: a startup's
        // ResumedAfterRestart is still to be sent.
        for trigger in [Event, Startup, Retry] {
            assert_eq!(
                inspect().again(trigger, 3, backoff).unwrap().trigger,
                trigger
            );
        }
    }

    #[test]
    fn the_table_splits_the_stops_by_what_a_startup_told() {
        assert!(api().after_the_table());
        assert!(refused().after_the_table());
        assert!(node().after_the_table());
        assert!(!bad_record().after_the_table());
        assert!(!inspect().after_the_table());
    }

    #[test]
    fn a_stop_that_cannot_recover_is_not_tried_again() {
        let pod = || "default/web-0".to_owned();
        let stops = [
            Stop::NotFound { pod: pod() },
            Stop::NoUid { pod: pod() },
            Stop::NoVm { pod: pod() },
            Stop::VmGone {
                pod: pod(),
                message: "no such VM".into(),
            },
            Stop::MissingFact {
                pod: pod(),
                fact: RecordFact::Image,
                why: "w",
                hint: "h",
            },
            Stop::Api(PodError::Gone { pod: pod() }),
            Stop::Api(PodError::Refused {
                pod: pod(),
                reason: "403".into(),
            }),
        ];
        for stop in stops {
            assert!(!stop.is_retryable(), "{stop}");
            assert_eq!(
                stop.again(Trigger::Event, 0, Backoff::default()),
                None,
                "{stop}"
            );
        }
    }

    #[test]
    fn an_again_is_written_in_milliseconds() {
        let again = inspect()
            .again(Trigger::Startup, 1, Backoff::default())
            .unwrap();
        assert_eq!(
            serde_json::to_value(again).unwrap(),
            serde_json::json!({"after_ms": 2000, "trigger": "startup", "tries": 2})
        );
        assert_eq!(
            inspect().again_json(None, 0),
            serde_json::json!({"after_ms": 1000, "trigger": "prepare", "tries": 1})
        );
        let gone = Stop::NoVm {
            pod: "default/web-0".into(),
        };
        assert_eq!(
            gone.again_json(Some(Trigger::Event), 0),
            serde_json::Value::Null
        );
    }
}
