//! Finding a pod's VM and proving it is the pod's own (spec section 2),
//! and the facts the pod is planned from (spec section 8): the steps every
//! host takes before anything is planned, written once. The daemon's task
//! ([`super::PodTask`]), `plan`, `capture` and the C library call these.

use crate::annotations::keys;
use crate::binding::{self, BindingPolicy, Mismatch, Verdict};
use crate::facts::{
    BootKind, FactError, Observation, Overrides, PodInput, VmId, VmInspect, annotations,
};
use crate::lifecycle::{HandsOff, PostCloneState};

/// Where to look for the pod's VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// `cocoon vm inspect` this reference: the id annotation, else the name
    /// annotation. Only where to look, never proof ([`bind_record`]).
    Inspect(VmId),
    /// The pod names no VM yet (neither annotation): cocoon has not made it.
    NoVm,
    /// The annotation is no VM id or name: nothing can be looked up, and
    /// the pod's owner is told so as a mismatch.
    Unusable(Mismatch),
}

/// The VM reference of a pod: the id annotation, else the name annotation.
pub fn lookup(pod: &PodInput) -> Lookup {
    let reference = match pod.annotation(annotations::VM_ID) {
        "" => pod.annotation(annotations::VM_NAME),
        id => id,
    };
    if reference.is_empty() {
        return Lookup::NoVm;
    }
    match VmId::parse(reference) {
        Ok(vm) => Lookup::Inspect(vm),
        Err(_) => Lookup::Unusable(Mismatch::BadReference {
            reference: reference.to_owned(),
        }),
    }
}

/// Whether the pod may have work: it names a VM (an unusable reference
/// too: its owner is told) and the rows of spec section 8's table that
/// need only the pod do not leave it alone ([`crate::lifecycle::gate`]),
/// or leave it alone only until its VM is known
/// ([`crate::lifecycle::provisional`]: a wake of a `mode=run` pod, a
/// `failed` marker of an earlier VM).
/// Cheap, for a watcher to filter events with, so updates caused by a
/// host's own patches cost nothing; the task decides the rest.
pub fn has_work(pod: &PodInput) -> bool {
    !matches!(lookup(pod), Lookup::NoVm)
        && match crate::lifecycle::gate(pod) {
            Ok(_) => true,
            // Only the VM and the host's record settle these rows.
            Err(row) => crate::lifecycle::provisional(row),
        }
}

/// Why no host plans for the pod, whatever its VM: a `macos` pod is
/// hands-off (spec section 8: not even inspected), so `plan` and the C
/// library's `cf_plan` refuse it, as the task leaves it alone.
pub fn never_planned(pod: &PodInput) -> Option<HandsOff> {
    crate::facts::is_macos(pod.annotation(annotations::OS)).then_some(HandsOff::Macos)
}

/// Whether `record` is the pod's own VM: an unusable reference points
/// nowhere; the record's id must agree with the id annotation; then the
/// names ([`binding::bind`]). Every host checks this before anything runs
/// in the VM or its IP is published.
pub fn bind_record(pod: &PodInput, record: &VmInspect, policy: BindingPolicy) -> Verdict {
    if let Lookup::Unusable(mismatch) = lookup(pod) {
        return Verdict::Mismatch(mismatch);
    }
    let annotated = pod.annotation(annotations::VM_ID);
    if !record.id.is_empty() && !annotated.is_empty() && record.id != annotated {
        return Verdict::Mismatch(Mismatch::IdDisagrees {
            annotation: annotated.to_owned(),
            record: record.id.clone(),
        });
    }
    binding::bind(pod, &record.name, policy)
}

/// The boot kind a host plans with when the caller names none: work the
/// host left `running` (a restart interrupted it) is resumed work, whose
/// source image is unknown, so the disk probe decides (spec section 8).
pub fn boot_override(pod: &PodInput, given: Option<BootKind>) -> Option<BootKind> {
    given.or_else(|| {
        (PostCloneState::parse(pod.annotation(keys::POST_CLONE_STATE))
            == Some(PostCloneState::Running))
        .then_some(BootKind::Resumed)
    })
}

/// The observation a pod and its bound VM record are planned from, with
/// [`boot_override`] applied to `overrides`.
pub fn observe(pod: &PodInput, record: &VmInspect, overrides: &Overrides) -> Observation {
    let overrides = Overrides {
        boot: boot_override(pod, overrides.boot),
        source_image: overrides.source_image.clone(),
    };
    Observation::new(pod, record, &overrides)
}

/// The VM id the host acts on: the record's, else the annotation's. A
/// record whose id is no VM id is cocoon's fault, not the pod's: a node
/// error, tried again (spec section 8: a failure before the loop starts
/// is retried, never left without work in flight).
pub fn vm_id(obs: &Observation) -> Result<VmId, FactError> {
    VmId::parse(&obs.vm_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn pod(annotations: &[(&str, &str)]) -> PodInput {
        PodInput {
            namespace: "prod".into(),
            name: "demo-2".into(),
            uid: Some("u1".into()),
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
            ..PodInput::default()
        }
    }

    #[test]
    fn the_id_annotation_is_looked_up_before_the_name() {
        let p = pod(&[(annotations::VM_ID, "vm-1"), (annotations::VM_NAME, "vk-x")]);
        assert_eq!(lookup(&p), Lookup::Inspect(VmId::parse("vm-1").unwrap()));
        let p = pod(&[(annotations::VM_NAME, "vk-x")]);
        assert_eq!(lookup(&p), Lookup::Inspect(VmId::parse("vk-x").unwrap()));
        assert_eq!(lookup(&pod(&[])), Lookup::NoVm);
        assert!(matches!(
            lookup(&pod(&[(annotations::VM_ID, "../x")])),
            Lookup::Unusable(Mismatch::BadReference { .. })
        ));
    }

    #[test]
    fn a_record_whose_id_disagrees_is_not_the_pods() {
        let p = pod(&[(annotations::VM_ID, "vm-1")]);
        let record = VmInspect {
            id: "vm-2".into(),
            name: binding::vm_name_for_pod("prod", "demo-2"),
            ..VmInspect::default()
        };
        assert!(matches!(
            bind_record(&p, &record, BindingPolicy::default()),
            Verdict::Mismatch(Mismatch::IdDisagrees { .. })
        ));
        let record = VmInspect {
            id: "vm-1".into(),
            ..record
        };
        assert!(bind_record(&p, &record, BindingPolicy::default()).is_bound());
    }

    #[test]
    fn running_work_is_resumed_unless_the_caller_says_otherwise() {
        let p = pod(&[(keys::POST_CLONE_STATE, "running")]);
        assert_eq!(boot_override(&p, None), Some(BootKind::Resumed));
        assert_eq!(
            boot_override(&p, Some(BootKind::Fork)),
            Some(BootKind::Fork)
        );
        let p = pod(&[(keys::POST_CLONE_STATE, "done")]);
        assert_eq!(boot_override(&p, None), None);
    }
}
