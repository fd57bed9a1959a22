//! The Kubernetes side as the host needs it: read a pod, patch its
//! annotations under a uid precondition, record events.
//!
//! [`PodApi`] is the seam: [`crate::kube::KubeApi`] implements it with the
//! real `kube` client; [`MemoryPods`] keeps pods in memory for tests,
//! benchmarks and embedders without a cluster. The annotation keys and
//! event reasons here are a contract: other components of the stack read
//! them.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};

use crate::facts::PodInput;

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
}

/// Event reasons (spec section 9).
pub mod reasons {
    pub const EXEC_ATTEMPT_FAILED: &str = "PostCloneExecAttemptFailed";
    pub const SUCCEEDED: &str = "PostCloneSucceeded";
    pub const EXEC_EXHAUSTED: &str = "PostCloneExecExhausted";
    pub const IP_WAIT_TIMEOUT: &str = "PostCloneIPWaitTimeout";
    pub const DHCP_RECOVERY: &str = "PostCloneDHCPRecovery";
    pub const RESUMED_AFTER_RESTART: &str = "ResumedAfterRestart";
    /// No plan could be made, no exec ran; the pod is failed without a hint.
    pub const PLAN_FAILED: &str = "PostClonePlanFailed";
    /// The VM the annotations point at is not the pod's (spec section 2).
    pub const VM_MISMATCH: &str = "PostCloneVMMismatch";
    /// Not in spec section 9: the node cannot be probed (the cocoon root is
    /// not readable). The work is retried, the pod is not failed.
    pub const NODE_ERROR: &str = "PostCloneNodeError";
}

/// Event messages are capped at this many bytes (spec section 9).
pub const EVENT_MESSAGE_MAX: usize = 512;

/// One incarnation of a pod: a write for `uid` never lands on a pod that
/// was deleted and recreated under the same name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

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

/// Why a pod could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    /// The pod was deleted, or replaced by a new incarnation (another uid).
    /// Nothing more must be written for it.
    #[error("pod {pod} is gone (deleted, or recreated with another uid)")]
    Gone { pod: String },
    /// The API server could not be reached, or kept failing, after
    /// retries: a later try may get through.
    #[error("kubernetes API, pod {pod}: {reason}")]
    Api { pod: String, reason: String },
    /// The API server refused the request for good (401, 403, 422, ...):
    /// another try gets the same answer until someone changes the cluster.
    #[error("kubernetes API, pod {pod}: {reason}")]
    Refused { pod: String, reason: String },
}

/// What the host needs from Kubernetes.
pub trait PodApi: Send + Sync + 'static {
    /// The pod as it is now, or `None` when it does not exist.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<PodInput>, PodError>> + Send;

    /// Merge-patch annotations, only while the pod still has `pod.uid`.
    /// Transient failures (conflicts, server errors, timeouts) are retried
    /// with backoff inside; [`PodError::Gone`] when the pod was deleted or
    /// replaced.
    fn patch_annotations(
        &self,
        pod: &PodRef,
        patch: &AnnotationPatch,
    ) -> impl Future<Output = Result<(), PodError>> + Send;

    /// Record an event about the pod. Best effort: callers log failures.
    fn event(
        &self,
        pod: &PodRef,
        event: &Event,
    ) -> impl Future<Output = Result<(), PodError>> + Send;
}

/// Pods kept in memory: for tests, benchmarks, the e2e harness, and
/// embedders that keep their own state. Honours the uid precondition like
/// the API server does.
#[derive(Debug, Clone, Default)]
pub struct MemoryPods {
    inner: Arc<Mutex<MemoryState>>,
}

#[derive(Debug, Default)]
struct MemoryState {
    pods: BTreeMap<(String, String), PodInput>,
    events: Vec<(PodRef, Event)>,
    patches: Vec<(PodRef, AnnotationPatch)>,
}

impl MemoryPods {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add or replace a pod.
    pub fn insert(&self, pod: PodInput) {
        let mut state = self.inner.lock().expect("memory pods lock");
        state
            .pods
            .insert((pod.namespace.clone(), pod.name.clone()), pod);
    }

    /// Delete a pod.
    pub fn remove(&self, namespace: &str, name: &str) {
        let mut state = self.inner.lock().expect("memory pods lock");
        state.pods.remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// The pod's current annotations.
    pub fn annotations(&self, namespace: &str, name: &str) -> Option<BTreeMap<String, String>> {
        let state = self.inner.lock().expect("memory pods lock");
        state
            .pods
            .get(&(namespace.to_owned(), name.to_owned()))
            .map(|p| p.annotations.clone())
    }

    /// Every event recorded so far, in order.
    pub fn events(&self) -> Vec<(PodRef, Event)> {
        self.inner.lock().expect("memory pods lock").events.clone()
    }

    /// Every patch that was applied, in order.
    pub fn patches(&self) -> Vec<(PodRef, AnnotationPatch)> {
        self.inner.lock().expect("memory pods lock").patches.clone()
    }
}

impl PodApi for MemoryPods {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<PodInput>, PodError> {
        let state = self.inner.lock().expect("memory pods lock");
        Ok(state
            .pods
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned())
    }

    async fn patch_annotations(
        &self,
        pod: &PodRef,
        patch: &AnnotationPatch,
    ) -> Result<(), PodError> {
        let mut state = self.inner.lock().expect("memory pods lock");
        let key = (pod.namespace.clone(), pod.name.clone());
        let current = match state.pods.get_mut(&key) {
            Some(p) if p.uid.as_deref() == Some(pod.uid.as_str()) => p,
            _ => {
                return Err(PodError::Gone {
                    pod: pod.to_string(),
                });
            }
        };
        let mut after = current.annotations.clone();
        for (k, v) in patch {
            match v {
                Some(v) => after.insert(k.clone(), v.clone()),
                None => after.remove(k),
            };
        }
        // The API server's limit on all of a pod's annotations.
        let total: usize = after.iter().map(|(k, v)| k.len() + v.len()).sum();
        if total > crate::apply::ANNOTATIONS_MAX {
            return Err(PodError::Refused {
                pod: pod.to_string(),
                reason: format!(
                    "422: metadata.annotations: Too long: must have at most {} bytes",
                    crate::apply::ANNOTATIONS_MAX
                ),
            });
        }
        current.annotations = after;
        state.patches.push((pod.clone(), patch.clone()));
        Ok(())
    }

    async fn event(&self, pod: &PodRef, event: &Event) -> Result<(), PodError> {
        let mut state = self.inner.lock().expect("memory pods lock");
        state.events.push((pod.clone(), event.clone()));
        Ok(())
    }
}
