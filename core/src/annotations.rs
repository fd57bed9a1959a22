//! The annotation values and events the fixup writes (spec sections 5-9),
//! as pure functions: the keys and event reasons, the error chain of
//! `post-clone-errors` (4096 bytes, cut on a UTF-8 boundary, the cut
//! announced), the event message cap (512 bytes), the failure records of an
//! exhausted fixup and of a plan that could not be made, and the room check
//! that keeps them within the API server's 256 KiB for all of a pod's
//! annotations.
//!
//! The daemon's loop (`fixup-host`'s `apply`) and an embedder's own loop
//! write the same values because both take them from here. The keys and
//! event reasons are a contract: other components of the stack read them.

use std::collections::BTreeMap;

use crate::lifecycle::{self, Lifecycle, PostCloneState};

/// Annotation keys the host writes (spec sections 5-7).
pub mod keys {
    pub const POST_CLONE_STATE: &str = "vm.cocoonstack.io/post-clone-state";
    pub const POST_CLONE_HINT: &str = "vm.cocoonstack.io/post-clone-hint";
    pub const POST_CLONE_ERRORS: &str = "vm.cocoonstack.io/post-clone-errors";
    pub const IP: &str = "vm.cocoonstack.io/ip";
    pub const PROBE_PORT: &str = "vm.cocoonstack.io/probe-port";
    pub const LIFECYCLE_STATE: &str = "vm.cocoonstack.io/lifecycle-state";
    pub const LIFECYCLE_MESSAGE: &str = "vm.cocoonstack.io/lifecycle-state-message";
    pub const LIFECYCLE_OBSERVED_GENERATION: &str =
        "vm.cocoonstack.io/lifecycle-observed-generation";
    pub const GENERATION: &str = "cocoonset.cocoonstack.io/generation";
    /// On a parent: the plugin that prepared its VM to be cloned,
    /// `<name> <version> sha256:<hex>` (docs/behaviour.md section 11); its
    /// clones carry it on.
    pub const PREPARED: &str = "vm.cocoonstack.io/prepared";
}

/// Event reasons (spec section 9).
pub mod reasons {
    pub const EXEC_ATTEMPT_FAILED: &str = "PostCloneExecAttemptFailed";
    pub const SUCCEEDED: &str = "PostCloneSucceeded";
    pub const EXEC_EXHAUSTED: &str = "PostCloneExecExhausted";
    pub const IP_WAIT_TIMEOUT: &str = "PostCloneIPWaitTimeout";
    /// The IP wait of a hibernate wake timed out (spec section 6).
    pub const WAKE_IP_WAIT_TIMEOUT: &str = "WakeIPWaitTimeout";
    pub const DHCP_RECOVERY: &str = "PostCloneDHCPRecovery";
    pub const RESUMED_AFTER_RESTART: &str = "ResumedAfterRestart";
    /// No plan could be made, no exec ran; the pod is failed without a hint.
    pub const PLAN_FAILED: &str = "PostClonePlanFailed";
    /// The VM the annotations point at is not the pod's (spec section 2).
    pub const VM_MISMATCH: &str = "PostCloneVMMismatch";
    /// Not in spec section 9: the node cannot be probed (the cocoon root is
    /// not readable). The work is retried, the pod is not failed.
    pub const NODE_ERROR: &str = "PostCloneNodeError";
    /// Not in spec section 9: a plugin file failed for the pod and its
    /// failure policy put the built-in in its place (the message names
    /// both, with versions and the failure).
    pub const PLUGIN_FALLBACK: &str = "PostClonePluginFallback";
    /// The serial-console pass of a Windows VM with a static NIC failed
    /// (spec section 10; the step's own event comes first:
    /// [`fixup_sac::reasons`]). The pod is failed.
    pub const WINDOWS_STATIC_IP_FAILED: &str = "WindowsStaticIPFailed";
    pub use fixup_sac::reasons::{DIAL_FAILED, ENUM_FAILED, SET_FAILED, VERIFY_FAILED};
    /// A parent's preparation took and the pod says so (docs/behaviour.md
    /// section 11).
    pub const PREPARED: &str = "ParentPrepared";
    /// One attempt of a parent's preparation failed.
    pub const PREPARE_ATTEMPT_FAILED: &str = "ParentPrepareAttemptFailed";
    /// A parent's preparation did not take: the parent is as it was.
    pub const PREPARE_FAILED: &str = "ParentPrepareFailed";
}

/// Event messages are capped at this many bytes (spec section 9).
pub const EVENT_MESSAGE_MAX: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// A Kubernetes event about a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventType,
    pub reason: &'static str,
    /// At most [`EVENT_MESSAGE_MAX`] bytes; [`Event::new`] cuts it.
    pub message: String,
}

impl Event {
    pub fn normal(reason: &'static str, message: impl Into<String>) -> Self {
        Self::new(EventType::Normal, reason, message)
    }

    pub fn warning(reason: &'static str, message: impl Into<String>) -> Self {
        Self::new(EventType::Warning, reason, message)
    }

    pub fn new(kind: EventType, reason: &'static str, message: impl Into<String>) -> Self {
        Event {
            kind,
            reason,
            message: cap_utf8(message.into(), EVENT_MESSAGE_MAX, "… [truncated]"),
        }
    }

    /// The event's `action` (events.k8s.io/v1): what the host was doing
    /// when it happened. Every host writes the same one.
    pub fn action(&self) -> &'static str {
        match self.reason {
            reasons::EXEC_ATTEMPT_FAILED
            | reasons::SUCCEEDED
            | reasons::EXEC_EXHAUSTED
            | reasons::PLAN_FAILED
            | reasons::NODE_ERROR => "PostCloneFixup",
            reasons::VM_MISMATCH => "BindVM",
            reasons::IP_WAIT_TIMEOUT | reasons::WAKE_IP_WAIT_TIMEOUT | reasons::DHCP_RECOVERY => {
                "ReadyWait"
            }
            reasons::RESUMED_AFTER_RESTART => "Resume",
            reasons::DIAL_FAILED
            | reasons::ENUM_FAILED
            | reasons::SET_FAILED
            | reasons::VERIFY_FAILED
            | reasons::WINDOWS_STATIC_IP_FAILED => "WindowsStaticIP",
            reasons::PREPARED | reasons::PREPARE_ATTEMPT_FAILED | reasons::PREPARE_FAILED => {
                "PrepareParent"
            }
            other => other,
        }
    }
}

/// Cut `text` to at most `max` bytes on a UTF-8 boundary; when it is cut,
/// end it with `marker` (which counts towards `max`).
pub fn cap_utf8(mut text: String, max: usize, marker: &str) -> String {
    if text.len() <= max {
        return text;
    }
    let keep = max.saturating_sub(marker.len());
    text.truncate(text.floor_char_boundary(keep));
    if marker.len() <= max {
        text.push_str(marker);
    }
    text
}

/// Annotation changes: `Some(value)` sets a key, `None` removes it.
pub type AnnotationPatch = BTreeMap<String, Option<String>>;

/// `vm.cocoonstack.io/post-clone-errors` holds at most this many bytes.
pub const ERRORS_ANNOTATION_MAX: usize = 4096;

/// `vm.cocoonstack.io/lifecycle-state-message` of a failed fixup holds at
/// most this many bytes (cut on a UTF-8 boundary, saying so): an exhausted
/// fixup's message is its whole error chain, as upstream writes it
/// (cocoon-operator copies it into its own events).
pub const FAILURE_MESSAGE_MAX: usize = ERRORS_ANNOTATION_MAX;

/// The most bytes the API server takes for all of a pod's annotations
/// together, keys and values counted (256 KiB, Kubernetes'
/// `TotalAnnotationSizeLimitB`): the failure record of an exhausted fixup,
/// hint included, must fit in it beside the pod's other annotations.
pub const ANNOTATIONS_MAX: usize = 256 * 1024;

/// The failure record of a plan, hint included, would not fit in the pod's
/// annotations. The fixup runs anyway (it may well succeed); if it fails,
/// the record is written without the hint, and the error chain says so.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the hint of the plan of {plugins} is {hint} bytes of base64; with the pod's other annotations and the rest of the failure record (post-clone-state, post-clone-errors of up to {ERRORS_ANNOTATION_MAX} bytes, lifecycle Failed) the pod's annotations would take {total} bytes, over the {max} the API server allows for all of them: if the fixup fails, the hint is left out (`cocoon-fixup plan` prints it); make the plan's text shorter, or remove large annotations from the pod"
)]
pub struct NoRoomForHint {
    /// The plugins whose plan it is, joined by ` + `.
    pub plugins: String,
    /// The hint's bytes (base64).
    pub hint: usize,
    /// All annotations' bytes (keys and values) after the largest failure
    /// record.
    pub total: usize,
    pub max: usize,
}

/// Check, before anything runs, that the failure record of an exhausted
/// fixup fits in the pod's annotations (`annotations`, as read): the
/// record with `hint` (the base64 hint), the longest error chain
/// ([`ERRORS_ANNOTATION_MAX`]) and the longest lifecycle message
/// ([`FAILURE_MESSAGE_MAX`]), keys and values counted as the API server
/// counts them against [`ANNOTATIONS_MAX`]. `plugins` names the plan's
/// plugins for the error. [`MAX_HINT`](crate::plan::MAX_HINT) bounds the
/// hint alone when the plan is made; this bounds it on the pod it is for.
pub fn check_hint_room(
    annotations: &BTreeMap<String, String>,
    hint: &str,
    plugins: &str,
) -> Result<(), NoRoomForHint> {
    let record = failure_record(
        annotations,
        hint,
        "e".repeat(ERRORS_ANNOTATION_MAX),
        &"m".repeat(FAILURE_MESSAGE_MAX),
    );
    let total = annotations_after(annotations, &record);
    if total > ANNOTATIONS_MAX {
        return Err(NoRoomForHint {
            plugins: plugins.to_owned(),
            hint: hint.len(),
            total,
            max: ANNOTATIONS_MAX,
        });
    }
    Ok(())
}

/// The bytes of all annotations (keys and values, as the API server counts
/// them) once `patch` is applied to `current`.
pub fn annotations_after(current: &BTreeMap<String, String>, patch: &AnnotationPatch) -> usize {
    let mut total: usize = current
        .iter()
        .filter(|(k, _)| !patch.contains_key(*k))
        .map(|(k, v)| k.len() + v.len())
        .sum();
    for (key, value) in patch {
        if let Some(value) = value {
            total += key.len() + value.len();
        }
    }
    total
}

/// The patch an exhausted fixup writes over `current` (the pod's
/// annotations as read just before): `post-clone-state=failed`, the hint,
/// the error chain, and lifecycle Failed with `message` when stickiness
/// allows it.
pub fn failure_record(
    current: &BTreeMap<String, String>,
    hint: &str,
    errors: String,
    message: &str,
) -> AnnotationPatch {
    let mut patch = state_patch(PostCloneState::Failed);
    // An empty hint is one that did not fit: remove a stale one.
    let hint = (!hint.is_empty()).then(|| hint.to_owned());
    patch.insert(keys::POST_CLONE_HINT.to_owned(), hint);
    patch.insert(keys::POST_CLONE_ERRORS.to_owned(), Some(errors));
    if let Some(lifecycle) = lifecycle::transition(current, Lifecycle::Failed, message) {
        patch.extend(lifecycle);
    }
    patch
}

/// The record an exhausted fixup writes: the patch over `current` (the
/// pod's annotations as read just before the write), and the error chain
/// as it ends up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExhaustedRecord {
    pub patch: AnnotationPatch,
    /// The attempts' errors, and a last line when the hint was left out.
    pub errors: Vec<String>,
    /// Why the hint was left out, when it was ([`check_hint_room`]).
    pub hint_left_out: Option<NoRoomForHint>,
}

/// The failure record of an exhausted fixup (spec section 5) over
/// `current`: `post-clone-state=failed`, the hint, the error chain of
/// `errors` ([`errors_annotation`]) and lifecycle Failed with that same
/// chain as its message (upstream's form, at most [`FAILURE_MESSAGE_MAX`]
/// bytes). `label` names the plan's plugins (or scenario) in the hint's
/// error. Without room for the hint in the pod's annotations the record
/// goes without it and the chain says so; when even that is too large (the
/// pod's own annotations fill nearly all of [`ANNOTATIONS_MAX`]), the
/// chain keeps its newest part, as much as fits.
pub fn exhausted_record(
    current: &BTreeMap<String, String>,
    hint: &str,
    label: &str,
    mut errors: Vec<String>,
) -> ExhaustedRecord {
    let (hint, hint_left_out) = match check_hint_room(current, hint, label) {
        Ok(()) => (hint, None),
        Err(e) => {
            errors.push(format!(
                "the hint ({} bytes) does not fit in the pod's annotations ({ANNOTATIONS_MAX} bytes for all of them) and was left out: `cocoon-fixup plan` prints it",
                hint.len()
            ));
            ("", Some(e))
        }
    };
    let chain = errors_annotation(&errors);
    let mut patch = failure_record(current, hint, chain.clone(), &chain);
    let excess = annotations_after(current, &patch).saturating_sub(ANNOTATIONS_MAX);
    if excess > 0 {
        // The chain is written twice (errors and message): each gives up
        // half the excess, and room for the marker.
        let max = chain.len().saturating_sub(excess.div_ceil(2) + 64);
        let chain = keep_newest(errors.join("\n"), max);
        patch = failure_record(current, hint, chain.clone(), &chain);
    }
    ExhaustedRecord {
        patch,
        errors,
        hint_left_out,
    }
}

/// The record of a pod for which no plan could be made (`line` is the
/// error as one line, [`one_line`]): `post-clone-state=failed`, the error
/// chain of that one line, and lifecycle Failed when stickiness allows it.
/// No hint: there is no plan to hint at.
pub fn plan_failed_record(current: &BTreeMap<String, String>, line: &str) -> AnnotationPatch {
    let mut patch = AnnotationPatch::from([
        (
            keys::POST_CLONE_STATE.to_owned(),
            Some(PostCloneState::Failed.as_str().to_owned()),
        ),
        (
            keys::POST_CLONE_ERRORS.to_owned(),
            Some(errors_annotation(&[line.to_owned()])),
        ),
    ]);
    let message = cap_utf8(line.to_owned(), FAILURE_MESSAGE_MAX, "… [truncated]");
    if let Some(lifecycle) = lifecycle::transition(current, Lifecycle::Failed, &message) {
        patch.extend(lifecycle);
    }
    patch
}

/// Error chain lines are one line each: newlines inside become ` | `, and
/// any other control character (guest stderr can carry ESC, NUL, CR) is
/// escaped, so annotations and events stay printable.
pub fn one_line(text: &str) -> String {
    let joined = text
        .trim()
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ");
    crate::facts::escape_controls(&joined)
}

/// The joined error chain, at most [`ERRORS_ANNOTATION_MAX`] bytes, cut on a
/// UTF-8 boundary, keeping the newest attempts and saying that it cut
/// ([`keep_newest`]).
pub fn errors_annotation(errors: &[String]) -> String {
    keep_newest(errors.join("\n"), ERRORS_ANNOTATION_MAX)
}

/// `text` in at most `max` bytes: when longer, its newest (last) bytes,
/// cut on a UTF-8 boundary and led by `[truncated: first <n> bytes
/// dropped]` and a newline. The error chain's truncation, wherever a chain
/// is shown (`post-clone-errors`, the exhaustion's event and lifecycle
/// message).
pub fn keep_newest(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let dropped_prefix = |dropped: usize| format!("[truncated: first {dropped} bytes dropped]\n");
    // The marker's length depends on the number it carries; a 20-digit
    // bound keeps the result within the limit.
    let room = max.saturating_sub(dropped_prefix(usize::MAX).len());
    let start = text.ceil_char_boundary(text.len() - room);
    format!("{}{}", dropped_prefix(start), &text[start..])
}

/// The texts of the fixup loop's error chain and events (spec sections 5,
/// 6 and 9). The daemon and an embedder's loop both take them from here.
pub mod messages {
    use std::time::Duration;

    use crate::classify::Scenario;

    /// A duration in messages, events and annotations, in Go's
    /// `time.Duration` notation as upstream prints it: `45s`, `1m30s`,
    /// `2m0s`, `1h0m0s`, `1.5s`, `500ms`, `0s`.
    pub fn span(d: Duration) -> String {
        fixup_sac::go_duration(d)
    }

    /// One attempt's line in the error chain and its
    /// `PostCloneExecAttemptFailed` event: `attempt 2: <error>`.
    pub fn attempt_line(attempt: u32, error: &str) -> String {
        format!("attempt {attempt}: {error}")
    }

    /// Upstream's kind of fixup for a scenario, in `PostCloneSucceeded`:
    /// `windows` (PnP), `linux_fc` (Firecracker) or `linux_static` (every
    /// other Linux plan: cloudimg, oci-networkd, and so every vendor
    /// plugin's plan, which serves one of these scenarios for its guest
    /// flavour).
    pub fn kind(scenario: Scenario) -> &'static str {
        match scenario {
            Scenario::WindowsPnp => "windows",
            Scenario::FcMac => "linux_fc",
            Scenario::Cloudimg
            | Scenario::OciNetworkd
            | Scenario::DhcpRecovery
            | Scenario::Prepare => "linux_static",
        }
    }

    /// The `PostCloneSucceeded` event: upstream's `kind=<kind>
    /// attempts=<n>`, then the host's own scenario, `scenario=<name>`.
    pub fn succeeded(scenario: Scenario, attempts: u32) -> String {
        format!(
            "kind={} attempts={attempts} scenario={scenario}",
            kind(scenario)
        )
    }

    /// The `PostCloneExecExhausted` event: upstream's `<op>: <joined error
    /// chain>`, where `op` is `create`, `update` or `reconcile`, within
    /// [`EVENT_MESSAGE_MAX`](super::EVENT_MESSAGE_MAX) bytes: a longer
    /// chain keeps its newest bytes and says it was cut
    /// ([`keep_newest`](super::keep_newest)). The failure record's
    /// lifecycle message is the chain itself
    /// ([`exhausted_record`](super::exhausted_record)).
    pub fn exhausted(op: &str, errors: &[String]) -> String {
        let prefix = format!("{op}: ");
        let room = super::EVENT_MESSAGE_MAX.saturating_sub(prefix.len());
        prefix + &super::keep_newest(errors.join("\n"), room)
    }

    /// The `PostCloneIPWaitTimeout` event and lifecycle message.
    pub fn ip_wait_timeout(vm_name: &str, budget: Duration, wake: bool) -> String {
        format!(
            "{} {vm_name}: dhcp lease not observed within {}",
            if wake { "wake" } else { "clone" },
            span(budget)
        )
    }

    /// The error-chain line, lifecycle message and `PostClonePlanFailed`
    /// event of a pod for which no plan could be made.
    pub fn plan_failed(error: &str) -> String {
        super::one_line(&format!("no plan could be made: {error}"))
    }

    /// The `PostCloneVMMismatch` event for a pod whose VM is not its own
    /// (spec section 2). It never names the other VM (its record's name or
    /// id) nor another pod: a pod's events must not tell its owner which
    /// VMs or pods exist on the node. A name the pod's own annotation
    /// carries may be shown, and a name that is simply of another form
    /// (an annotated name) is not blamed on the pod's annotations.
    pub fn vm_mismatch(mismatch: &crate::binding::Mismatch, namespace: &str, pod: &str) -> String {
        use crate::binding::Mismatch;
        use crate::facts::annotations;
        if let Mismatch::AnnotatedClaimed { name, .. } = mismatch {
            format!(
                "VM not used: the VM record is named {name:?}, as annotation {} says, but another pod on this node claims that name too, so it cannot be proven to be this pod's VM; nothing was run and no IP is published; ask the node's operator to find out why the stack gave two pods this name",
                annotations::VM_NAME,
            )
        } else if mismatch.names_another_vm() {
            let expected = crate::binding::vm_name_for_pod(namespace, pod);
            format!(
                "the VM that annotations {} and {} point at is not this pod's VM (its name must be {expected:?}): nothing was run and no IP is published; the stack writes those annotations: remove them from the pod (and its template), or recreate the pod through its controller",
                annotations::VM_ID,
                annotations::VM_NAME,
            )
        } else {
            format!("VM not used: {mismatch}; nothing was run and no IP is published")
        }
    }

    /// The `ResumedAfterRestart` event of work picked up again after a
    /// restart: `op=post_clone` or `op=ready_wait`.
    pub fn resumed(op: &str) -> String {
        format!("op={op}")
    }

    /// The `PostCloneDHCPRecovery` event.
    pub fn dhcp_recovery(after: Duration, nics: usize) -> String {
        format!(
            "no lease after {}: re-running DHCP on {nics} NIC(s)",
            span(after)
        )
    }

    /// The DHCP recovery pass run at once, because the plugin of the VM's
    /// guest flavour claims all-DHCP clones of it.
    pub fn dhcp_recovery_claimed(plugin: &str, flavor: &str, nics: usize) -> String {
        format!(
            "{plugin} claims all-DHCP clones of guest flavour {flavor}: re-running DHCP on {nics} NIC(s) at once"
        )
    }
}

/// The IP and lifecycle `ready` (spec section 6), for a pod that is still
/// the host's: its lifecycle is then empty or `creating`, so stickiness
/// (spec section 7) cannot forbid `ready`.
pub fn ready_patch(current: &BTreeMap<String, String>, ip: std::net::Ipv4Addr) -> AnnotationPatch {
    let mut patch = AnnotationPatch::from([(keys::IP.to_owned(), Some(ip.to_string()))]);
    patch.extend(lifecycle::transition(current, Lifecycle::Ready, "").unwrap_or_default());
    patch
}

/// The patch that sets `post-clone-state` to `state`.
pub fn state_patch(state: PostCloneState) -> AnnotationPatch {
    AnnotationPatch::from([(
        keys::POST_CLONE_STATE.to_owned(),
        Some(state.as_str().to_owned()),
    )])
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// The bytes of the largest failure record over an empty pod, keys
    /// included, besides the hint's value: what the room check adds.
    fn record_without_hint() -> usize {
        let record = failure_record(
            &BTreeMap::new(),
            "",
            "e".repeat(ERRORS_ANNOTATION_MAX),
            &"m".repeat(FAILURE_MESSAGE_MAX),
        );
        record
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, String::len))
            .sum()
    }

    #[test]
    fn the_record_counts_every_key_and_the_longest_values() {
        let fixed = record_without_hint();
        let keys = [
            keys::POST_CLONE_STATE,
            keys::POST_CLONE_HINT,
            keys::POST_CLONE_ERRORS,
            keys::LIFECYCLE_STATE,
            keys::LIFECYCLE_MESSAGE,
        ];
        let key_bytes: usize = keys.iter().map(|k| k.len()).sum();
        assert_eq!(
            fixed,
            key_bytes + "failed".len() * 2 + ERRORS_ANNOTATION_MAX + FAILURE_MESSAGE_MAX
        );
    }

    /// All of the pod's annotations after the record, keys and values, may
    /// take exactly 256 KiB and not a byte more.
    #[test]
    fn the_hint_fits_up_to_the_pods_annotation_budget_exactly() {
        let filler_key = "example.com/big";
        let hint = "QUJD".repeat(1000);
        let room = ANNOTATIONS_MAX - record_without_hint() - hint.len() - filler_key.len();
        let pod = annotations(&[(filler_key, &"x".repeat(room))]);
        assert_eq!(check_hint_room(&pod, &hint, "acme"), Ok(()));
        let pod = annotations(&[(filler_key, &"x".repeat(room + 1))]);
        let err = check_hint_room(&pod, &hint, "acme").unwrap_err();
        assert_eq!(
            err,
            NoRoomForHint {
                plugins: "acme".into(),
                hint: 4000,
                total: ANNOTATIONS_MAX + 1,
                max: ANNOTATIONS_MAX,
            }
        );
        let message = err.to_string();
        assert!(
            message.starts_with("the hint of the plan of acme is 4000 bytes of base64")
                && message.contains("262145 bytes, over the 262144"),
            "{message}"
        );
    }

    /// What the record replaces is not counted twice: a pod that already
    /// carries a state, an old hint or a long lifecycle message has them
    /// overwritten.
    #[test]
    fn replaced_annotations_are_counted_once() {
        let hint = "h".repeat(100 * 1024);
        let old = "o".repeat(155 * 1024);
        let pod = annotations(&[
            (keys::POST_CLONE_HINT, &old),
            (keys::POST_CLONE_STATE, "running"),
            (keys::LIFECYCLE_MESSAGE, "creating"),
        ]);
        assert_eq!(check_hint_room(&pod, &hint, "acme"), Ok(()));
        // The same bytes under another key do count.
        let pod = annotations(&[("example.com/old", &old)]);
        assert!(check_hint_room(&pod, &hint, "acme").is_err());
    }

    /// The largest hint the planner lets through (MAX_HINT, 128 KiB of
    /// base64) fits on a pod whose other annotations are ordinary.
    #[test]
    fn a_hint_of_max_hint_fits_beside_ordinary_annotations() {
        let hint = "A".repeat(crate::plan::MAX_HINT);
        let pod = annotations(&[
            ("vm.cocoonstack.io/name", "vk-default-web-0-abcdef"),
            ("vm.cocoonstack.io/id", "vm-0123abcd"),
            ("cocoonset.cocoonstack.io/generation", "3"),
            (
                "kubectl.kubernetes.io/last-applied-configuration",
                &"{}".repeat(8 * 1024),
            ),
        ]);
        assert_eq!(check_hint_room(&pod, &hint, "acme"), Ok(()));
    }

    /// The error chain keeps its newest bytes within 4096, cuts on a
    /// character boundary and says how much it dropped.
    #[test]
    fn the_error_chain_is_cut_on_a_char_boundary_and_says_so() {
        let errors: Vec<String> = (1..=200)
            .map(|n| format!("attempt {n}: é{}", "x".repeat(40)))
            .collect();
        let chain = errors_annotation(&errors);
        assert!(chain.len() <= ERRORS_ANNOTATION_MAX, "{}", chain.len());
        assert!(chain.starts_with("[truncated: first "), "{chain}");
        assert!(chain.ends_with(errors.last().unwrap()));
        let short = vec!["attempt 1: boom".to_owned()];
        assert_eq!(errors_annotation(&short), "attempt 1: boom");
    }

    /// Without room for the hint, the exhausted record goes without it and
    /// its chain says why; with room, the hint is written.
    #[test]
    fn an_exhausted_record_without_room_leaves_the_hint_out() {
        let errors = vec!["attempt 1: exited 1".to_owned()];
        let hint = "QUJD".repeat(100);
        let record = exhausted_record(&BTreeMap::new(), &hint, "acme", errors.clone());
        assert_eq!(record.hint_left_out, None);
        assert_eq!(record.errors, errors);
        assert_eq!(record.patch[keys::POST_CLONE_HINT], Some(hint.clone()));
        assert_eq!(
            record.patch[keys::POST_CLONE_STATE].as_deref(),
            Some("failed")
        );

        let full = annotations(&[("example.com/big", &"x".repeat(ANNOTATIONS_MAX - 1000))]);
        let record = exhausted_record(&full, &hint, "acme", errors);
        assert!(record.hint_left_out.is_some());
        assert_eq!(record.patch[keys::POST_CLONE_HINT], None);
        assert!(record.errors[1].starts_with("the hint (400 bytes) does not fit"));
        assert!(annotations_after(&full, &record.patch) <= ANNOTATIONS_MAX);
    }

    /// Durations print as Go's `time.Duration.String` prints them.
    #[rstest::rstest]
    #[case::zero(Duration::ZERO, "0s")]
    #[case::nanos(Duration::from_nanos(1), "1ns")]
    #[case::micros(Duration::from_nanos(1_500), "1.5µs")]
    #[case::millis(Duration::from_millis(200), "200ms")]
    #[case::half_second(Duration::from_millis(500), "500ms")]
    #[case::millis_fraction(Duration::from_micros(1_250), "1.25ms")]
    #[case::second(Duration::from_secs(1), "1s")]
    #[case::second_and_a_half(Duration::from_millis(1500), "1.5s")]
    #[case::ip_wait(Duration::from_secs(45), "45s")]
    #[case::minute_and_a_half(Duration::from_secs(90), "1m30s")]
    #[case::two_minutes(Duration::from_secs(120), "2m0s")]
    #[case::retry_budget(Duration::from_secs(180), "3m0s")]
    #[case::hour(Duration::from_secs(3600), "1h0m0s")]
    #[case::mixed(Duration::from_millis(3_661_500), "1h1m1.5s")]
    #[case::hundred_hours(Duration::from_secs(360_000), "100h0m0s")]
    #[case::nanos_past_a_minute(Duration::new(61, 1), "1m1.000000001s")]
    fn durations_print_as_go_prints_them(#[case] d: Duration, #[case] go: &str) {
        assert_eq!(messages::span(d), go);
    }

    /// `PostCloneSucceeded` carries upstream's kind, then the scenario.
    #[test]
    fn success_names_upstreams_kind() {
        use crate::classify::Scenario;
        for (scenario, kind) in [
            (Scenario::WindowsPnp, "windows"),
            (Scenario::FcMac, "linux_fc"),
            (Scenario::OciNetworkd, "linux_static"),
            (Scenario::Cloudimg, "linux_static"),
        ] {
            assert_eq!(
                messages::succeeded(scenario, 2),
                format!("kind={kind} attempts=2 scenario={scenario}")
            );
        }
    }

    /// The exhaustion event is `<op>: <chain>` within 512 bytes, keeping
    /// the newest attempts; the lifecycle message is the chain within
    /// 4096 bytes; neither splits a character, and both say they cut.
    #[test]
    fn exhaustion_shows_the_chain_as_upstream_does() {
        let short = vec!["attempt 1: a".to_owned(), "attempt 2: b".to_owned()];
        assert_eq!(
            messages::exhausted("update", &short),
            "update: attempt 1: a\nattempt 2: b"
        );
        let long: Vec<String> = (1..=60)
            .map(|n| format!("attempt {n}: é{}", "x".repeat(80)))
            .collect();
        let event = messages::exhausted("create", &long);
        assert!(event.len() <= EVENT_MESSAGE_MAX, "{}", event.len());
        assert!(event.starts_with("create: [truncated: first "), "{event}");
        assert!(event.ends_with(long.last().unwrap()), "{event}");
        let record = exhausted_record(&BTreeMap::new(), "", "acme", long.clone());
        let message = record.patch[keys::LIFECYCLE_MESSAGE].clone().unwrap();
        assert_eq!(
            Some(&message),
            record.patch[keys::POST_CLONE_ERRORS].as_ref()
        );
        assert!(message.len() <= FAILURE_MESSAGE_MAX, "{}", message.len());
        assert!(message.starts_with("[truncated: first "), "{message}");
        assert!(message.ends_with(long.last().unwrap()));
    }

    /// A plan that could not be made is recorded as failed with its one
    /// line, and no hint is touched.
    #[test]
    fn a_plan_failed_record_has_the_line_and_no_hint() {
        let patch = plan_failed_record(&BTreeMap::new(), "no plan could be made: no plugin");
        assert_eq!(patch[keys::POST_CLONE_STATE].as_deref(), Some("failed"));
        assert_eq!(
            patch[keys::POST_CLONE_ERRORS].as_deref(),
            Some("no plan could be made: no plugin")
        );
        assert!(!patch.contains_key(keys::POST_CLONE_HINT));
    }
}
