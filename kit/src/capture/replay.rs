//! The pod's task replayed on what was captured: the facts the daemon
//! planned from, and what it decided.

use std::time::Duration;

use fixup_core::annotations::keys;
use fixup_core::binding::BindingPolicy;
use fixup_core::decision::{
    self, Action, Handled, NonceSource, PodTask, Report, Settings, Summary, Trigger, WakeConfig,
};
use fixup_core::facts::{BootKind, Observation, Overrides, PodInput, VmInspect};
use fixup_core::lifecycle::HandsOff;
use fixup_core::memory::{Listed, StackEvent};

use super::{CaptureError, CaptureInput};

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
pub(super) fn assumed_why(
    pod: &PodInput,
    vm: &VmInspect,
    observed: &Observation,
) -> Option<String> {
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

pub(super) fn pod_says_wake(pod: &PodInput) -> bool {
    BootKind::from_annotations(&pod.annotations) == Some(BootKind::Wake)
}

/// What the daemon does with the pod and the observation it plans from
/// ([`replay`]): its handling in words (for the case's `context.daemon`),
/// the observation, and why its boot kind is not the annotations' own.
/// `--boot` replaces the boot kind; a pod the daemon leaves alone is
/// refused unless `anyway`, and then planned from its annotations.
pub(super) fn daemon_view(
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
