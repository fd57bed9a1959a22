//! The Kubernetes side as the host needs it: read a pod, patch its
//! annotations under a uid precondition, record events.
//!
//! [`PodApi`] is the seam: [`crate::kube::KubeApi`] implements it with the
//! real `kube` client; [`MemoryPods`] keeps pods in memory for tests,
//! benchmarks and embedders without a cluster. The annotation keys, event
//! reasons and events are `fixup_core::annotations`'s, re-exported here.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use fixup_core::annotations::ANNOTATIONS_MAX;

use fixup_core::facts::PodInput;
use fixup_core::memory::{Listed, StackEvent};

pub use fixup_core::annotations::{
    AnnotationPatch, EVENT_MESSAGE_MAX, Event, EventType, cap_utf8, keys, reasons,
};

/// One incarnation of a pod, why a pod could not be read or written, and
/// how a conditional write ended: the decision's own types
/// ([`fixup_core::decision`]), which this seam answers in.
pub use fixup_core::decision::{Guarded, PodError, PodRef};

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

    /// [`patch_annotations`](Self::patch_annotations), and the pod as the
    /// write left it when the API server answered with it: a read as fresh
    /// as a GET, without one. `Ok(None)` when the answer carried no pod
    /// (the default, for implementations that do not read it); the caller
    /// then reads the pod itself when it needs to.
    fn patch_and_read(
        &self,
        pod: &PodRef,
        patch: &AnnotationPatch,
    ) -> impl Future<Output = Result<Option<PodInput>, PodError>> + Send {
        async move { self.patch_annotations(pod, patch).await.map(|()| None) }
    }

    /// [`patch_and_read`](Self::patch_and_read), only while the pod is
    /// still as `seen` (a read of it): the host decides what to write
    /// from a read, and a pod that changed since (hibernation requested,
    /// lifecycle moved on, deletion started) must not get a write decided
    /// from the older state. [`Guarded::Changed`] with the pod as it is
    /// now when it changed (nothing written); [`PodError::Gone`] when it
    /// was deleted or replaced.
    ///
    /// [`crate::kube::KubeApi`] makes the API server check: the patch
    /// carries `seen`'s `metadata.resourceVersion` as a precondition, so
    /// nothing can change between the check and the write, and no read is
    /// spent when nothing changed. The default, for implementations that
    /// keep no versions, reads the pod and writes when it equals `seen`
    /// ([`read_then_patch`]).
    fn patch_if_unchanged(
        &self,
        pod: &PodRef,
        patch: &AnnotationPatch,
        seen: &PodInput,
    ) -> impl Future<Output = Result<Guarded, PodError>> + Send {
        read_then_patch(self, pod, patch, seen)
    }

    /// Record an event about the pod. Best effort: callers log failures.
    fn event(
        &self,
        pod: &PodRef,
        event: &Event,
    ) -> impl Future<Output = Result<(), PodError>> + Send;

    /// Every pod scheduled to `node`, for the check of an annotated VM
    /// name ([`crate::node_pods::OtherPods::List`]). The default, for an
    /// implementation that cannot list: an error, so such a name is not
    /// proven and nothing runs.
    fn node_pods(
        &self,
        node: &str,
    ) -> impl Future<Output = Result<Vec<PodInput>, PodError>> + Send {
        let pod = format!("* on node {node:?}");
        async move {
            Err(PodError::Api {
                pod,
                reason: "this Kubernetes side cannot list a node's pods".into(),
            })
        }
    }

    /// The events in `pod`'s namespace (events.k8s.io/v1) that each of
    /// `field_selectors` selects, one listing per selector, together: the
    /// stack's own record of a hibernate wake about the pod (spec section
    /// 2, rule 2; the selectors name `regarding.uid`, `reason`, `type` and
    /// `reportingController`, [`fixup_core::memory::field_selectors`]). The
    /// default, for an implementation that cannot list: an error (the rule
    /// then finds nothing, with a warning).
    fn stack_events(
        &self,
        pod: &PodRef,
        field_selectors: &[String],
    ) -> impl Future<Output = Result<Listed, PodError>> + Send {
        let _ = field_selectors;
        let pod = pod.to_string();
        async move {
            Err(PodError::Api {
                pod,
                reason: "this Kubernetes side cannot list events".into(),
            })
        }
    }
}

/// [`PodApi::patch_if_unchanged`] for an implementation that cannot make
/// the write itself conditional: read the pod, and write when it is as
/// `seen` (same resource version when both have one, else the same
/// metadata). A change between this read and the write is not caught.
pub async fn read_then_patch<P: PodApi + ?Sized>(
    pods: &P,
    pod: &PodRef,
    patch: &AnnotationPatch,
    seen: &PodInput,
) -> Result<Guarded, PodError> {
    let gone = || PodError::Gone {
        pod: pod.to_string(),
    };
    let now = pods
        .get(&pod.namespace, &pod.name)
        .await?
        .ok_or_else(gone)?;
    if now.uid.as_deref() != Some(pod.uid.as_str()) {
        return Err(gone());
    }
    let unchanged = match (&now.resource_version, &seen.resource_version) {
        (Some(now), Some(seen)) => now == seen,
        // Without both versions, the same metadata.
        _ => {
            PodInput {
                resource_version: None,
                ..now.clone()
            } == PodInput {
                resource_version: None,
                ..seen.clone()
            }
        }
    };
    if !unchanged {
        return Ok(Guarded::Changed(now));
    }
    pods.patch_and_read(pod, patch).await.map(Guarded::Written)
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
    stack_events: Vec<StackEvent>,
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

    /// Add an event another reporter (the stack) recorded; the host's own
    /// events are listed too, as its reporter's.
    pub fn add_stack_event(&self, event: StackEvent) {
        self.inner
            .lock()
            .expect("memory pods lock")
            .stack_events
            .push(event);
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
        if total > ANNOTATIONS_MAX {
            return Err(PodError::Refused {
                pod: pod.to_string(),
                reason: format!(
                    "422: metadata.annotations: Too long: must have at most {} bytes",
                    ANNOTATIONS_MAX
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

    /// Every pod held: pods in memory are all on the one node.
    async fn node_pods(&self, _node: &str) -> Result<Vec<PodInput>, PodError> {
        let state = self.inner.lock().expect("memory pods lock");
        Ok(state.pods.values().cloned().collect())
    }

    async fn stack_events(
        &self,
        pod: &PodRef,
        field_selectors: &[String],
    ) -> Result<Listed, PodError> {
        let state = self.inner.lock().expect("memory pods lock");
        let own = state
            .events
            .iter()
            .filter(|(about, _)| about.uid == pod.uid)
            .map(|(about, event)| StackEvent {
                reason: event.reason.to_owned(),
                type_: match event.kind {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
                reporting_controller: fixup_core::memory::evidence::REPORTER.to_owned(),
                regarding_uid: about.uid.clone(),
                newest_unix_ms: None,
            });
        let events = own
            .chain(
                state
                    .stack_events
                    .iter()
                    .filter(|e| e.regarding_uid == pod.uid)
                    .cloned(),
            )
            .filter(|event| {
                field_selectors.iter().any(|selector| {
                    fixup_core::memory::evidence::selects(selector, event).unwrap_or(false)
                })
            })
            .collect();
        Ok(Listed {
            events,
            truncated: false,
        })
    }
}
