//! The other pods on the host's node, as the decision asks for them
//! ([`Action::OtherPods`](fixup_core::decision::Action::OtherPods)): a VM
//! named by its pod's `vm.cocoonstack.io/name` though not derived from the
//! pod binds only when no other pod on the node claims the name (spec
//! section 2, `--accept-annotated-vm-names`). The decision checks the list
//! ([`fixup_core::binding::settle`]); this module only answers.
//!
//! [`OtherPods`] says where a host gets the list: the daemon's watch keeps
//! [`NodePods`] up to date, `run` lists the node's pods from the API server
//! when asked, and a host with neither answers that it cannot tell (nothing
//! then runs in such a VM).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use fixup_core::facts::PodInput;

/// Where a host learns the other pods on its node.
#[derive(Debug, Clone)]
pub enum OtherPods {
    /// Nowhere: an annotated VM name is never proven, for the reason
    /// given (the default of [`Host`](crate::host::Host), for an embedder
    /// that has not said).
    Unseen { why: String },
    /// List the pods on `node` from the API server when asked
    /// ([`PodApi::node_pods`](crate::pods::PodApi::node_pods)): `run`.
    List { node: String },
    /// The pods the daemon's watch keeps ([`NodePods`]): `serve`.
    Watched(NodePods),
}

impl Default for OtherPods {
    fn default() -> Self {
        OtherPods::Unseen {
            why: "this host was given no view of its node's pods (Host::with_other_pods)".into(),
        }
    }
}

/// The pods scheduled to the node, as the daemon's pod watch last listed
/// and changed them, by uid. Cheap to clone: one shared map.
///
/// Bounded by the pods on the node: the watch's listing fills it, its
/// changes keep it, a deletion removes the pod, and a new listing (after
/// the watch had to start over) replaces it whole, so a pod deleted while
/// the watch was away does not stay. Until the first listing is complete
/// it answers that it cannot tell; while a later listing is under way it
/// answers with the old pods and the listed ones together, which can only
/// find more claims, never fewer.
#[derive(Debug, Clone, Default)]
pub struct NodePods {
    inner: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    pods: HashMap<String, PodInput>,
    /// The listing under way, when one is.
    listing: Option<HashMap<String, PodInput>>,
    /// A listing has been completed.
    listed: bool,
}

impl NodePods {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A map cannot be left half-updated by a panic elsewhere.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The watch starts listing the node's pods (again).
    pub fn listing_started(&self) {
        self.state().listing = Some(HashMap::new());
    }

    /// A pod of the listing under way.
    pub fn listed(&self, pod: &PodInput) {
        let Some(uid) = pod.uid.clone() else {
            return;
        };
        let mut state = self.state();
        match state.listing.as_mut() {
            Some(listing) => {
                listing.insert(uid, pod.clone());
            }
            // A listing that was not announced: take the pod as a change.
            None => {
                state.pods.insert(uid, pod.clone());
            }
        }
    }

    /// The listing is complete: it replaces what was kept.
    pub fn listing_done(&self) {
        let mut state = self.state();
        if let Some(listing) = state.listing.take() {
            state.pods = listing;
        }
        state.listed = true;
    }

    /// A pod was added or changed.
    pub fn changed(&self, pod: &PodInput) {
        if let Some(uid) = pod.uid.clone() {
            self.state().pods.insert(uid, pod.clone());
        }
    }

    /// The pod with this uid was deleted.
    pub fn deleted(&self, uid: &str) {
        let mut state = self.state();
        state.pods.remove(uid);
        if let Some(listing) = state.listing.as_mut() {
            listing.remove(uid);
        }
    }

    /// Every pod kept now (during a listing: the old ones and the listed
    /// ones), or why the answer is not known yet.
    pub fn snapshot(&self) -> Result<Vec<PodInput>, String> {
        let state = self.state();
        if !state.listed {
            return Err(
                "the daemon has not finished listing its node's pods yet; it tries again".into(),
            );
        }
        let mut pods: Vec<PodInput> = state.pods.values().cloned().collect();
        if let Some(listing) = &state.listing {
            pods.extend(
                listing
                    .iter()
                    .filter(|(uid, _)| !state.pods.contains_key(*uid))
                    .map(|(_, pod)| pod.clone()),
            );
        }
        Ok(pods)
    }

    /// How many pods are kept (the listing under way not counted).
    pub fn len(&self) -> usize {
        self.state().pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, vm_name: &str) -> PodInput {
        PodInput {
            name: format!("pod-{uid}"),
            namespace: "prod".into(),
            uid: Some(uid.into()),
            annotations: [("vm.cocoonstack.io/name".to_owned(), vm_name.to_owned())].into(),
            ..PodInput::default()
        }
    }

    fn names(pods: &NodePods) -> Vec<String> {
        let mut names: Vec<String> = pods
            .snapshot()
            .unwrap()
            .into_iter()
            .map(|p| format!("{}={}", p.name, p.annotation("vm.cocoonstack.io/name")))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn nothing_is_known_before_the_first_listing_is_done() {
        let pods = NodePods::new();
        pods.listing_started();
        pods.listed(&pod("a", "vk-prod-a"));
        assert!(pods.snapshot().is_err());
        pods.listing_done();
        assert_eq!(names(&pods), ["pod-a=vk-prod-a"]);
    }

    #[test]
    fn changes_and_deletions_keep_it_current() {
        let pods = NodePods::new();
        pods.listing_started();
        pods.listing_done();
        pods.changed(&pod("a", "vk-prod-a"));
        pods.changed(&pod("b", "vk-prod-b"));
        pods.changed(&pod("a", "vk-prod-a2"));
        pods.deleted("b");
        assert_eq!(names(&pods), ["pod-a=vk-prod-a2"]);
        assert_eq!(pods.len(), 1);
    }

    /// A new listing drops the pods deleted while the watch was away; while
    /// it is under way, the old and the listed pods answer together.
    #[test]
    fn a_new_listing_replaces_what_was_kept() {
        let pods = NodePods::new();
        pods.listing_started();
        pods.listed(&pod("gone", "vk-prod-gone"));
        pods.listed(&pod("kept", "vk-prod-kept"));
        pods.listing_done();
        pods.listing_started();
        pods.listed(&pod("kept", "vk-prod-kept"));
        pods.listed(&pod("new", "vk-prod-new"));
        assert_eq!(
            names(&pods),
            [
                "pod-gone=vk-prod-gone",
                "pod-kept=vk-prod-kept",
                "pod-new=vk-prod-new"
            ]
        );
        pods.listing_done();
        assert_eq!(
            names(&pods),
            ["pod-kept=vk-prod-kept", "pod-new=vk-prod-new"]
        );
    }
}
