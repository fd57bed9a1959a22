//! The lifecycle annotations (spec section 7) and the decision table of
//! spec section 8 ([`decide_knowing`]): pure functions of a pod.
//!
//! Failed is sticky: within the same generation it can only be replaced by
//! `failed`, `creating` or `hibernating`. A probe success or a manual
//! repair never makes a Failed pod Ready; the only retry is recreating the
//! pod through its controller.

use std::collections::BTreeMap;
use std::fmt;

use crate::annotations::{AnnotationPatch, keys};
use crate::facts::{BootKind, PodInput, annotations};

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

/// The keys an embedder that owns the lifecycle writes itself
/// ([`crate::decision::Settings::lifecycle_intents`]): the state, its
/// message, the observed generation and the IP.
pub const LIFECYCLE_KEYS: [&str; 4] = [
    keys::LIFECYCLE_STATE,
    keys::LIFECYCLE_MESSAGE,
    keys::LIFECYCLE_OBSERVED_GENERATION,
    keys::IP,
];

/// A change of the lifecycle keys handed to the embedder that owns them
/// instead of written: exactly the facts the write of those keys would
/// carry ([`LifecycleIntent::patch`] gives that write back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleIntent {
    /// The new `lifecycle-state`; `None` when the state stays (stickiness
    /// kept a Failed pod failed, and only its IP is published).
    pub state: Option<Lifecycle>,
    /// The state's message; `None` clears it. Only with a state.
    pub message: Option<String>,
    /// The generation the state was decided for
    /// (`lifecycle-observed-generation`), when the pod has one.
    pub observed_generation: Option<String>,
    /// The address to publish (`vm.cocoonstack.io/ip`).
    pub ip: Option<String>,
    /// The pod's `metadata.resourceVersion` the change was decided for
    /// (the one its write left, or the read it was decided from), when
    /// known: an embedder that publishes under it as a precondition never
    /// writes over a change it has not seen.
    pub version: Option<String>,
}

impl LifecycleIntent {
    /// Split `patch` into the rest of it and the intent of its lifecycle
    /// keys (`None` when it has none).
    pub fn split(mut patch: AnnotationPatch) -> (AnnotationPatch, Option<LifecycleIntent>) {
        let mut take = |key: &str| patch.remove(key);
        let state = take(keys::LIFECYCLE_STATE);
        let message = take(keys::LIFECYCLE_MESSAGE);
        let generation = take(keys::LIFECYCLE_OBSERVED_GENERATION);
        let ip = take(keys::IP);
        if state.is_none() && message.is_none() && generation.is_none() && ip.is_none() {
            return (patch, None);
        }
        let intent = LifecycleIntent {
            state: state.flatten().as_deref().and_then(Lifecycle::parse),
            message: message.flatten(),
            observed_generation: generation.flatten(),
            ip: ip.flatten(),
            version: None,
        };
        (patch, Some(intent))
    }

    /// The write of the lifecycle keys this intent stands for.
    pub fn patch(&self) -> AnnotationPatch {
        let mut patch = AnnotationPatch::new();
        if let Some(state) = self.state {
            patch.insert(
                keys::LIFECYCLE_STATE.to_owned(),
                Some(state.as_str().to_owned()),
            );
            patch.insert(keys::LIFECYCLE_MESSAGE.to_owned(), self.message.clone());
        }
        if let Some(generation) = &self.observed_generation {
            patch.insert(
                keys::LIFECYCLE_OBSERVED_GENERATION.to_owned(),
                Some(generation.clone()),
            );
        }
        if let Some(ip) = &self.ip {
            patch.insert(keys::IP.to_owned(), Some(ip.clone()));
        }
        patch
    }

    /// The intent decided for `pod` as the API server holds it (its
    /// version), or for no known version.
    pub fn at(self, pod: Option<&PodInput>) -> LifecycleIntent {
        LifecycleIntent {
            version: pod.and_then(|pod| pod.resource_version.clone()),
            ..self
        }
    }

    /// Whether the pod is ready by it.
    pub fn ready(&self) -> bool {
        self.state == Some(Lifecycle::Ready)
    }
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

/// Why the host leaves a pod alone (the "nothing" rows of spec section 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HandsOff {
    /// The lifecycle is set and is not `creating`: the stack owns the pod
    /// now (`ready`, `failed`, `hibernating`, `hibernated`, or a value this
    /// host does not know).
    StackOwns,
    /// `vm.cocoonstack.io/hibernate` is `"true"`.
    HibernateRequested,
    /// `metadata.deletionTimestamp` is set.
    Deleting,
    /// `cocoonset.cocoonstack.io/os` is `macos` (trimmed, any case): the
    /// stack runs such guests outside cocoon; nothing is read, run, written
    /// or told.
    Macos,
    /// Not managed (classification rule 1): never touched.
    NotManaged,
    /// Not a cloned boot (classification rule 2): nothing to repair.
    NotCloned,
    /// Only a parent's preparation: the pod's own network is not settled
    /// (its fixup is running or failed, or its lifecycle is neither absent
    /// nor `ready`), so it is no parent to snapshot yet.
    NotSettled,
}

impl HandsOff {
    /// For logs and `run`'s summary.
    pub fn as_str(self) -> &'static str {
        match self {
            HandsOff::StackOwns => "stack-owns",
            HandsOff::HibernateRequested => "hibernate-requested",
            HandsOff::Deleting => "deleting",
            HandsOff::Macos => "macos",
            HandsOff::NotManaged => "not-managed",
            HandsOff::NotCloned => "not-cloned",
            HandsOff::NotSettled => "not-settled",
        }
    }
}

impl fmt::Display for HandsOff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A row of spec section 8's table: what to do with a pod. The same table decides
/// at startup and for every pod event, and once more before the final
/// `ready` or `failed` write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Row {
    /// Leave the pod alone: no inspect, no exec, no write, no IP wait.
    Nothing(HandsOff),
    /// The fixup failed earlier: the work stays parked.
    Parked,
    /// Run the whole fixup loop (again).
    RunLoop,
    /// The fixup is done or not needed: wait for the IP only.
    IpWaitOnly,
}

impl Row {
    /// The `op=` of the `ResumedAfterRestart` event, for work that resumes.
    pub fn op(self) -> Option<&'static str> {
        match self {
            Row::RunLoop => Some("post_clone"),
            Row::IpWaitOnly => Some("ready_wait"),
            Row::Nothing(_) | Row::Parked => None,
        }
    }

    /// Whether there is work for the host.
    pub fn has_work(self) -> bool {
        matches!(self, Row::RunLoop | Row::IpWaitOnly)
    }
}

/// The rows of the table that need nothing but the pod: `Err` with the
/// action when they decide, else `Ok` with the `post-clone-state` marker
/// (if any) for the rows that also need to know whether a fixup is due.
///
/// Cheap (annotations only), so the daemon can run it on every watch event
/// and the host before it asks cocoon anything.
pub fn gate(pod: &PodInput) -> Result<Option<PostCloneState>, Row> {
    gate_knowing(pod, Known::default())
}

/// What the decision knows of a pod beyond its annotations once its VM is
/// bound (spec sections 2 and 7), from the host's own record:
///
/// - `wake`: the VM is a hibernate wake;
/// - `foreign_marker`: the pod's `post-clone-state` was written for
///   another VM of the pod, which makes it no marker of this VM;
/// - `remembered`: the pod shows no `post-clone-state`, and the record
///   holds the last one seen or written for this VM (someone removed it:
///   a failed hibernate does), which is taken in its place;
/// - `lifted`: the pod shows no `post-clone-state`, and the host saw this
///   VM's hibernation fail: upstream lifted the pod back to `creating` on
///   the same VM, and nothing is owed in its guest (at most the IP wait).
///
/// The record is the host's own (the daemon's store, or an embedder's,
/// kept where only it can write), never user input: a wake verdict in it
/// can make a `mode=run` pod a wake, so whoever can write the record can
/// start that work. The daemon keeps its store in its state directory;
/// an embedder must keep its records as private.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Known {
    pub wake: bool,
    pub foreign_marker: bool,
    pub remembered: Option<PostCloneState>,
    pub lifted: bool,
}

/// The rows [`gate`] decides from the annotations that the VM and the
/// host's record may still change: a pod not cloned by its annotations may
/// be a wake (a wake is a wake even on a `mode=run` pod), and a `failed`
/// marker may be an earlier VM's.
pub fn provisional(row: Row) -> bool {
    matches!(row, Row::Nothing(HandsOff::NotCloned) | Row::Parked)
}

/// [`gate`], knowing `known`.
pub fn gate_knowing(pod: &PodInput, known: Known) -> Result<Option<PostCloneState>, Row> {
    let get = |key: &str| pod.annotation(key);
    if !matches!(get(keys::LIFECYCLE_STATE), "" | "creating") {
        return Err(Row::Nothing(HandsOff::StackOwns));
    }
    if get(annotations::HIBERNATE) == "true" {
        return Err(Row::Nothing(HandsOff::HibernateRequested));
    }
    if pod.deleting {
        return Err(Row::Nothing(HandsOff::Deleting));
    }
    if crate::facts::is_macos(get(annotations::OS)) {
        return Err(Row::Nothing(HandsOff::Macos));
    }
    if get(annotations::MANAGED) != "true" {
        return Err(Row::Nothing(HandsOff::NotManaged));
    }
    if !known.wake && BootKind::from_annotations(&pod.annotations).is_none() {
        return Err(Row::Nothing(HandsOff::NotCloned));
    }
    let marker = if known.foreign_marker {
        None
    } else {
        PostCloneState::parse(get(keys::POST_CLONE_STATE))
    }
    .or(known.remembered);
    match marker {
        Some(PostCloneState::Failed) => Err(Row::Parked),
        marker => Ok(marker),
    }
}

/// Is `current` (the pod as read again) still the pod the host is working
/// for, knowing `known` of the VM? The same incarnation (`uid`), the
/// decision table still open (not hibernating, not deleting, the
/// lifecycle not moved on, not parked), and no other VM id annotated than
/// `vm_id`, the one the host bound. Read before the `running` write,
/// before each attempt, and before every final write: when it says no,
/// nothing more is written.
pub fn still_ours_knowing(current: &PodInput, uid: &str, vm_id: &str, known: Known) -> bool {
    let annotated = current.annotation(annotations::VM_ID);
    current.uid.as_deref() == Some(uid)
        && gate_knowing(current, known).is_ok()
        && (annotated.is_empty() || annotated == vm_id)
}

/// Spec section 8, row by row, knowing `known` of the VM. `fixup_needed`
/// is classification's answer for the VM (only the last rows read it).
///
/// `running` with facts that no longer need a fixup (the VM's NICs changed
/// while the host was down) leaves only the IP wait: there is no plan to
/// run.
pub fn decide_knowing(pod: &PodInput, fixup_needed: bool, known: Known) -> Row {
    match gate_knowing(pod, known) {
        Err(action) => action,
        Ok(_) if known.lifted => Row::IpWaitOnly,
        Ok(Some(PostCloneState::Done)) => Row::IpWaitOnly,
        Ok(Some(PostCloneState::Running) | None) if fixup_needed => Row::RunLoop,
        Ok(_) => Row::IpWaitOnly,
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

    const HIB: &str = annotations::HIBERNATE;
    const MANAGED: (&str, &str) = (annotations::MANAGED, "true");

    fn pod(pairs: &[(&str, &str)], deleting: bool) -> PodInput {
        PodInput {
            name: "web-0".into(),
            namespace: "default".into(),
            uid: Some("u".into()),
            annotations: ann(pairs),
            deleting,
            resource_version: None,
        }
    }

    use HandsOff::{Deleting, HibernateRequested, NotCloned, NotManaged, StackOwns};
    use Row::{IpWaitOnly, Nothing, Parked, RunLoop};

    /// Spec section 8's table, row by row, plus the edges.
    #[rstest]
    #[case::ready_is_the_stacks(&[MANAGED, (STATE, "ready")], false, true, Nothing(StackOwns))]
    #[case::failed_is_the_stacks(&[MANAGED, (STATE, "failed"), (PC, "running")], false, true, Nothing(StackOwns))]
    #[case::hibernated_is_the_stacks(&[MANAGED, (STATE, "hibernated")], false, false, Nothing(StackOwns))]
    #[case::hibernating_is_the_stacks(&[MANAGED, (STATE, "hibernating"), (PC, "done")], false, true, Nothing(StackOwns))]
    #[case::unknown_lifecycle_is_the_stacks(&[MANAGED, (STATE, "Ready"), (PC, "running")], false, false, Nothing(StackOwns))]
    #[case::hibernate_requested(&[MANAGED, (HIB, "true"), (PC, "running")], false, true, Nothing(HibernateRequested))]
    #[case::hibernate_requested_while_creating(&[MANAGED, (STATE, "creating"), (HIB, "true")], false, true, Nothing(HibernateRequested))]
    #[case::hibernate_not_exact(&[MANAGED, (HIB, "True")], false, true, RunLoop)]
    #[case::deleting(&[MANAGED, (PC, "running")], true, true, Nothing(Deleting))]
    #[case::deleting_done(&[MANAGED, (PC, "done")], true, false, Nothing(Deleting))]
    #[case::unmanaged(&[(PC, "running")], false, true, Nothing(NotManaged))]
    #[case::run_mode(&[MANAGED, (annotations::MODE, "run")], false, true, Nothing(NotCloned))]
    #[case::run_mode_upper(&[MANAGED, (annotations::MODE, "RUN")], false, false, Nothing(NotCloned))]
    #[case::run_mode_wake_is_cloned(&[MANAGED, (annotations::MODE, "run"), (annotations::RESTORE_FROM_HIBERNATE, "true")], false, true, RunLoop)]
    #[case::run_mode_fork_is_cloned(&[MANAGED, (annotations::MODE, "run"), (annotations::FORK_FROM, "vm-a")], false, false, IpWaitOnly)]
    #[case::post_clone_failed_parks(&[MANAGED, (PC, "failed")], false, true, Parked)]
    #[case::post_clone_failed_parks_even_creating(&[MANAGED, (STATE, "creating"), (PC, "failed")], false, true, Parked)]
    #[case::running_reruns(&[MANAGED, (PC, "running")], false, true, RunLoop)]
    #[case::running_but_not_needed_now(&[MANAGED, (PC, "running")], false, false, IpWaitOnly)]
    #[case::done_waits_for_ip(&[MANAGED, (PC, "done")], false, true, IpWaitOnly)]
    #[case::no_marker_needed(&[MANAGED], false, true, RunLoop)]
    #[case::no_marker_not_needed(&[MANAGED], false, false, IpWaitOnly)]
    #[case::creating_no_marker(&[MANAGED, (STATE, "creating")], false, true, RunLoop)]
    #[case::unknown_marker_is_no_marker(&[MANAGED, (PC, "bogus")], false, false, IpWaitOnly)]
    fn decision_table(
        #[case] pairs: &[(&str, &str)],
        #[case] deleting: bool,
        #[case] fixup_needed: bool,
        #[case] expected: Row,
    ) {
        assert_eq!(
            decide_knowing(&pod(pairs, deleting), fixup_needed, Known::default()),
            expected
        );
        // The gate agrees: it decides exactly the rows that need no facts.
        match gate(&pod(pairs, deleting)) {
            Err(action) => assert_eq!(action, expected),
            Ok(_) => assert!(expected.has_work()),
        }
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

    /// Spec section 7: what the host's record knows of the VM when the pod
    /// shows no marker.
    #[rstest]
    #[case::nothing_known(Known::default(), true, RunLoop)]
    #[case::remembered_done(Known { remembered: Some(PostCloneState::Done), ..Known::default() }, true, IpWaitOnly)]
    #[case::remembered_failed(Known { remembered: Some(PostCloneState::Failed), ..Known::default() }, true, Parked)]
    #[case::remembered_running(Known { remembered: Some(PostCloneState::Running), ..Known::default() }, true, RunLoop)]
    #[case::lifted(Known { lifted: true, ..Known::default() }, true, IpWaitOnly)]
    #[case::lifted_over_a_running_marker(Known { lifted: true, remembered: Some(PostCloneState::Running), ..Known::default() }, true, IpWaitOnly)]
    #[case::lifted_not_needed(Known { lifted: true, ..Known::default() }, false, IpWaitOnly)]
    fn the_record_fills_a_removed_marker(
        #[case] known: Known,
        #[case] fixup_needed: bool,
        #[case] expected: Row,
    ) {
        let pod = pod(&[MANAGED, (STATE, "creating")], false);
        assert_eq!(decide_knowing(&pod, fixup_needed, known), expected);
        // Nor does it ever give work to a pod the table leaves alone.
        let ready = self::pod(&[MANAGED, (STATE, "ready")], false);
        assert_eq!(
            decide_knowing(&ready, fixup_needed, known),
            Nothing(StackOwns)
        );
    }

    #[test]
    fn ops_name_the_resumed_work() {
        assert_eq!(RunLoop.op(), Some("post_clone"));
        assert_eq!(IpWaitOnly.op(), Some("ready_wait"));
        assert_eq!(Parked.op(), None);
        assert_eq!(Nothing(Deleting).op(), None);
    }

    /// Every lifecycle write the task makes splits into the rest and an
    /// intent that gives the same keys back; a write without them has
    /// none; stickiness leaves an IP alone in the intent.
    #[test]
    fn an_intent_carries_exactly_the_lifecycle_keys_of_its_write() {
        let pod = ann(&[(keys::GENERATION, "4"), (keys::LIFECYCLE_STATE, "creating")]);
        let mut failed = crate::annotations::state_patch(PostCloneState::Failed);
        failed.extend(transition(&pod, Lifecycle::Failed, "it broke").unwrap());
        let ready = crate::annotations::ready_patch(&pod, "10.0.0.5".parse().unwrap());
        let sticky = ann(&[(keys::LIFECYCLE_STATE, "failed")]);
        let ip_only = crate::annotations::ready_patch(&sticky, "10.0.0.6".parse().unwrap());
        for patch in [failed.clone(), ready, ip_only.clone()] {
            let (rest, intent) = LifecycleIntent::split(patch.clone());
            let intent = intent.expect("a lifecycle write has an intent");
            assert!(LIFECYCLE_KEYS.iter().all(|k| !rest.contains_key(*k)));
            let mut back = rest;
            back.extend(intent.patch());
            assert_eq!(back, patch);
        }
        let (_, intent) = LifecycleIntent::split(failed);
        let intent = intent.unwrap();
        assert_eq!(intent.state, Some(Lifecycle::Failed));
        assert_eq!(intent.message.as_deref(), Some("it broke"));
        assert_eq!(intent.observed_generation.as_deref(), Some("4"));
        assert!(!intent.ready());
        let (_, intent) = LifecycleIntent::split(ip_only);
        let intent = intent.unwrap();
        assert_eq!(
            (intent.state, intent.ip.as_deref()),
            (None, Some("10.0.0.6"))
        );
        let running = crate::annotations::state_patch(PostCloneState::Running);
        assert_eq!(LifecycleIntent::split(running.clone()), (running, None));
    }
}
