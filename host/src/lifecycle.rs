//! The lifecycle annotations (spec section 7) and startup reconciliation
//! (spec section 8): pure functions of a pod's annotations.
//!
//! Failed is sticky: within the same generation it can only be replaced by
//! `failed`, `creating` or `hibernating`. A probe success or a manual
//! repair never makes a Failed pod Ready; the only retry is recreating the
//! pod through its controller.

use std::collections::BTreeMap;
use std::fmt;

use crate::pods::{AnnotationPatch, keys};

/// `vm.cocoonstack.io/lifecycle-state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    Creating,
    Ready,
    Hibernating,
    Hibernated,
    Failed,
}

impl Lifecycle {
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Creating => "creating",
            Lifecycle::Ready => "ready",
            Lifecycle::Hibernating => "hibernating",
            Lifecycle::Hibernated => "hibernated",
            Lifecycle::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "creating" => Lifecycle::Creating,
            "ready" => Lifecycle::Ready,
            "hibernating" => Lifecycle::Hibernating,
            "hibernated" => Lifecycle::Hibernated,
            "failed" => Lifecycle::Failed,
            _ => return None,
        })
    }

    /// Ready, Failed and Hibernated end the host's work on a pod.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Lifecycle::Ready | Lifecycle::Failed | Lifecycle::Hibernated
        )
    }
}

impl fmt::Display for Lifecycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn current(annotations: &BTreeMap<String, String>) -> Option<Lifecycle> {
    annotations
        .get(keys::LIFECYCLE_STATE)
        .and_then(|s| Lifecycle::parse(s))
}

/// The patch that moves the pod to `to` with `message`, or `None` when
/// stickiness forbids it (the pod is Failed in its current generation and
/// `to` is Ready or Hibernated).
///
/// The message annotation is removed when `message` is empty; the observed
/// generation echoes `cocoonset.cocoonstack.io/generation` when the pod
/// has one.
pub fn transition(
    annotations: &BTreeMap<String, String>,
    to: Lifecycle,
    message: &str,
) -> Option<AnnotationPatch> {
    let generation = annotations.get(keys::GENERATION);
    let same_generation = annotations.get(keys::LIFECYCLE_OBSERVED_GENERATION) == generation;
    if current(annotations) == Some(Lifecycle::Failed)
        && same_generation
        && matches!(to, Lifecycle::Ready | Lifecycle::Hibernated)
    {
        return None;
    }
    let mut patch = AnnotationPatch::new();
    patch.insert(
        keys::LIFECYCLE_STATE.to_owned(),
        Some(to.as_str().to_owned()),
    );
    patch.insert(
        keys::LIFECYCLE_MESSAGE.to_owned(),
        (!message.is_empty()).then(|| message.to_owned()),
    );
    if let Some(generation) = generation {
        patch.insert(
            keys::LIFECYCLE_OBSERVED_GENERATION.to_owned(),
            Some(generation.clone()),
        );
    }
    Some(patch)
}

/// `vm.cocoonstack.io/post-clone-state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostCloneState {
    Running,
    Done,
    Failed,
}

impl PostCloneState {
    pub fn as_str(self) -> &'static str {
        match self {
            PostCloneState::Running => "running",
            PostCloneState::Done => "done",
            PostCloneState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => PostCloneState::Running,
            "done" => PostCloneState::Done,
            "failed" => PostCloneState::Failed,
            _ => return None,
        })
    }
}

/// What to do with a pod, decided from its persisted annotations only
/// (spec section 8). The same table serves a fresh pod (no markers yet)
/// and a pod found at startup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// Lifecycle already ready, failed or hibernated.
    Nothing,
    /// The fixup failed earlier: the work stays parked.
    Parked,
    /// Run the whole fixup loop (again).
    RunLoop,
    /// The fixup is done or not needed: wait for the IP only.
    IpWaitOnly,
}

impl Resume {
    /// The `op=` of the `ResumedAfterRestart` event, for work that resumes.
    pub fn op(self) -> Option<&'static str> {
        match self {
            Resume::RunLoop => Some("post_clone"),
            Resume::IpWaitOnly => Some("ready_wait"),
            Resume::Nothing | Resume::Parked => None,
        }
    }
}

/// Spec section 8, row by row.
pub fn resume(annotations: &BTreeMap<String, String>, fixup_needed: bool) -> Resume {
    if current(annotations).is_some_and(Lifecycle::is_terminal) {
        return Resume::Nothing;
    }
    match annotations
        .get(keys::POST_CLONE_STATE)
        .and_then(|s| PostCloneState::parse(s))
    {
        Some(PostCloneState::Failed) => Resume::Parked,
        Some(PostCloneState::Running) => Resume::RunLoop,
        Some(PostCloneState::Done) => Resume::IpWaitOnly,
        None if fixup_needed => Resume::RunLoop,
        None => Resume::IpWaitOnly,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const STATE: &str = keys::LIFECYCLE_STATE;
    const GEN: &str = keys::GENERATION;
    const OBSERVED: &str = keys::LIFECYCLE_OBSERVED_GENERATION;
    const PC: &str = keys::POST_CLONE_STATE;

    /// Spec section 8's table, row by row, plus the edges.
    #[rstest]
    #[case::ready_is_terminal(&[(STATE, "ready")], true, Resume::Nothing)]
    #[case::failed_is_terminal(&[(STATE, "failed"), (PC, "running")], true, Resume::Nothing)]
    #[case::hibernated_is_terminal(&[(STATE, "hibernated")], false, Resume::Nothing)]
    #[case::post_clone_failed_parks(&[(PC, "failed")], true, Resume::Parked)]
    #[case::post_clone_failed_parks_even_creating(&[(STATE, "creating"), (PC, "failed")], true, Resume::Parked)]
    #[case::running_reruns(&[(PC, "running")], true, Resume::RunLoop)]
    #[case::running_reruns_even_if_not_needed_now(&[(PC, "running")], false, Resume::RunLoop)]
    #[case::done_waits_for_ip(&[(PC, "done")], true, Resume::IpWaitOnly)]
    #[case::no_marker_needed(&[], true, Resume::RunLoop)]
    #[case::no_marker_not_needed(&[], false, Resume::IpWaitOnly)]
    #[case::creating_no_marker(&[(STATE, "creating")], true, Resume::RunLoop)]
    #[case::hibernating_is_not_terminal(&[(STATE, "hibernating"), (PC, "done")], true, Resume::IpWaitOnly)]
    #[case::unknown_marker_is_no_marker(&[(PC, "bogus")], false, Resume::IpWaitOnly)]
    #[case::unknown_lifecycle_is_not_terminal(&[(STATE, "Ready"), (PC, "running")], false, Resume::RunLoop)]
    fn resume_table(
        #[case] pairs: &[(&str, &str)],
        #[case] fixup_needed: bool,
        #[case] expected: Resume,
    ) {
        assert_eq!(resume(&ann(pairs), fixup_needed), expected);
    }

    #[rstest]
    #[case::ready_from_creating(&[(STATE, "creating")], Lifecycle::Ready, true)]
    #[case::failed_blocks_ready(&[(STATE, "failed")], Lifecycle::Ready, false)]
    #[case::failed_blocks_ready_same_gen(&[(STATE, "failed"), (GEN, "3"), (OBSERVED, "3")], Lifecycle::Ready, false)]
    #[case::failed_blocks_hibernated(&[(STATE, "failed")], Lifecycle::Hibernated, false)]
    #[case::failed_allows_failed(&[(STATE, "failed")], Lifecycle::Failed, true)]
    #[case::failed_allows_creating(&[(STATE, "failed")], Lifecycle::Creating, true)]
    #[case::failed_allows_hibernating(&[(STATE, "failed")], Lifecycle::Hibernating, true)]
    #[case::new_generation_unsticks(&[(STATE, "failed"), (GEN, "4"), (OBSERVED, "3")], Lifecycle::Ready, true)]
    fn stickiness(#[case] pairs: &[(&str, &str)], #[case] to: Lifecycle, #[case] allowed: bool) {
        assert_eq!(transition(&ann(pairs), to, "").is_some(), allowed);
    }

    #[test]
    fn transition_sets_the_triple_and_drops_an_empty_message() {
        let patch = transition(&ann(&[(GEN, "7")]), Lifecycle::Failed, "clone x: boom").unwrap();
        assert_eq!(patch[STATE], Some("failed".to_owned()));
        assert_eq!(
            patch[keys::LIFECYCLE_MESSAGE],
            Some("clone x: boom".to_owned())
        );
        assert_eq!(patch[OBSERVED], Some("7".to_owned()));
        let patch = transition(&ann(&[]), Lifecycle::Ready, "").unwrap();
        assert_eq!(
            patch[keys::LIFECYCLE_MESSAGE],
            None,
            "empty message removes the key"
        );
        assert!(
            !patch.contains_key(OBSERVED),
            "no generation, nothing to echo"
        );
    }

    #[test]
    fn ops_name_the_resumed_work() {
        assert_eq!(Resume::RunLoop.op(), Some("post_clone"));
        assert_eq!(Resume::IpWaitOnly.op(), Some("ready_wait"));
        assert_eq!(Resume::Parked.op(), None);
    }
}
