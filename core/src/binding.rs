//! Binding a pod to its VM (spec section 2): the proof that the VM the host
//! is about to act on belongs to the pod that asked.
//!
//! Pod annotations are user input: anyone who may create or patch a pod can
//! write any `vm.cocoonstack.io/*` value, including another tenant's VM id.
//! So an annotation only says where to *look*; what proves the VM is this
//! pod's is the VM record itself. The stack names every VM after its pod
//! ([`vm_name_for_pod`]), and cocoon keeps that name in the record's
//! `config.name`, which no pod can write. Before anything runs in a VM, or
//! its IP is published on a pod, [`bind`] must say [`Verdict::Bound`].
//!
//! Pure functions, no I/O: the host, `run`, `serve`, `plan` and embedders
//! all ask the same question the same way.

use std::fmt;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::facts::{PodInput, annotations, escape_controls};

/// The VM name the stack derives for a pod, newest form:
/// `vk-<namespace>-<pod name with dots as dashes>-<hash>`, where `<hash>`
/// is the first 3 bytes of sha256(`<namespace>/<pod name>`) as 6 lowercase
/// hex digits. The hash keeps names of different pods apart even where the
/// dashes would make them collide (`a-b`/`c` and `a`/`b-c`).
pub fn vm_name_for_pod(namespace: &str, pod: &str) -> String {
    let digest = Sha256::digest(format!("{namespace}/{pod}").as_bytes());
    format!(
        "vk-{namespace}-{}-{}",
        pod.replace('.', "-"),
        hex::encode(&digest[..3])
    )
}

/// The older, unhashed form `vk-<namespace>-<pod name>`. It is ambiguous:
/// pod `b-c` in namespace `a` and pod `c` in namespace `a-b` get the same
/// name, so it is accepted only when the operator opts in
/// ([`BindingPolicy::accept_legacy_names`]).
pub fn legacy_vm_name_for_pod(namespace: &str, pod: &str) -> String {
    format!("vk-{namespace}-{pod}")
}

/// The next action for a pod whose annotations point at the wrong VM.
const FIX: &str = "the stack writes vm.cocoonstack.io/id and vm.cocoonstack.io/name: remove them from the pod (and its template), or recreate the pod through its controller";

/// What the operator allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BindingPolicy {
    /// Also accept the unhashed legacy name (`--accept-legacy-vm-names`,
    /// off by default): for VMs created before the stack hashed names.
    pub accept_legacy_names: bool,
}

/// Which form of the derived name the record carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NameForm {
    Hashed,
    Legacy,
}

/// Why a VM is not the pod's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "kebab-case")]
pub enum Mismatch {
    /// The pod has no namespace (a hand-written pod file), so no name can
    /// be derived.
    NoNamespace,
    /// The record carries no `config.name`.
    RecordUnnamed,
    /// The record's name is not the name derived from the pod.
    OtherVm { expected: String, record: String },
    /// The record's name is the legacy form, which the policy does not
    /// accept.
    LegacyNotAccepted { expected: String, record: String },
    /// The `vm.cocoonstack.io/name` annotation names another VM than the
    /// record.
    AnnotationDisagrees { annotation: String, record: String },
    /// The annotations name no VM that can be looked up (not a valid VM
    /// id or name).
    BadReference { reference: String },
    /// The record found has another id than the `vm.cocoonstack.io/id`
    /// annotation.
    IdDisagrees { annotation: String, record: String },
}

impl Mismatch {
    /// Whether the message names a VM that may be another pod's (its
    /// record's name or id). Such messages go to the daemon's log, never
    /// to the pod that asked: a pod's events must not tell its owner which
    /// VMs exist on the node.
    pub fn names_another_vm(&self) -> bool {
        matches!(
            self,
            Mismatch::OtherVm { .. }
                | Mismatch::AnnotationDisagrees { .. }
                | Mismatch::IdDisagrees { .. }
        )
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `{:?}` quotes the value and escapes control characters, so a
        // hostile name stays one printable line.
        match self {
            Mismatch::NoNamespace => f.write_str(
                "the pod has no namespace, so its VM name cannot be derived; pass the pod as `kubectl get pod <name> -o json` prints it",
            ),
            Mismatch::RecordUnnamed => f.write_str(
                "the VM record has no config.name, so it cannot be proven to be this pod's VM; pass the unmodified output of `cocoon vm inspect --json <id>`",
            ),
            Mismatch::OtherVm { expected, record } => write!(
                f,
                "the VM record is named {record:?}, but this pod's VM must be named {expected:?}: the annotations point at another pod's VM; {FIX}"
            ),
            Mismatch::LegacyNotAccepted { expected, record } => write!(
                f,
                "the VM record has the legacy unhashed name {:?} (expected {:?}); it is accepted only with --accept-legacy-vm-names",
                record,
                expected
            ),
            Mismatch::AnnotationDisagrees { annotation, record } => write!(
                f,
                "annotation {} says {annotation:?} but the VM record is named {record:?}; {FIX}",
                annotations::VM_NAME,
            ),
            Mismatch::BadReference { reference } => write!(
                f,
                "the annotations name {reference:?}, which is no VM id or name; {FIX}"
            ),
            Mismatch::IdDisagrees { annotation, record } => write!(
                f,
                "annotation {} says {annotation:?} but the VM record found has id {record:?}; {FIX}",
                annotations::VM_ID,
            ),
        }
    }
}

/// The answer of [`bind`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "kebab-case")]
pub enum Verdict {
    /// The VM is the pod's: its record carries the derived name.
    Bound { name: String, form: NameForm },
    /// It is not: nothing may run in it for this pod, no IP is published.
    Mismatch(Mismatch),
}

impl Verdict {
    pub fn is_bound(&self) -> bool {
        matches!(self, Verdict::Bound { .. })
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Bound {
                name,
                form: NameForm::Hashed,
            } => write!(
                f,
                "bound: the VM record is named {}, derived from the pod",
                escape_controls(name)
            ),
            Verdict::Bound {
                name,
                form: NameForm::Legacy,
            } => write!(
                f,
                "bound: the VM record has the legacy name {}, accepted by policy",
                escape_controls(name)
            ),
            Verdict::Mismatch(m) => write!(f, "not this pod's VM: {m}"),
        }
    }
}

/// Is the VM whose record is named `record_name` the VM of `pod`?
///
/// The record's name must be the name derived from the pod's own namespace
/// and name (the legacy form only when `policy` allows it), and the
/// `vm.cocoonstack.io/name` annotation, when set, must agree with the
/// record. A VM id annotation proves nothing and is not consulted.
pub fn bind(pod: &PodInput, record_name: &str, policy: BindingPolicy) -> Verdict {
    if pod.namespace.is_empty() {
        return Verdict::Mismatch(Mismatch::NoNamespace);
    }
    if record_name.is_empty() {
        return Verdict::Mismatch(Mismatch::RecordUnnamed);
    }
    let expected = vm_name_for_pod(&pod.namespace, &pod.name);
    let form = if record_name == expected {
        NameForm::Hashed
    } else if record_name == legacy_vm_name_for_pod(&pod.namespace, &pod.name) {
        if !policy.accept_legacy_names {
            return Verdict::Mismatch(Mismatch::LegacyNotAccepted {
                expected,
                record: record_name.to_owned(),
            });
        }
        NameForm::Legacy
    } else {
        return Verdict::Mismatch(Mismatch::OtherVm {
            expected,
            record: record_name.to_owned(),
        });
    };
    let annotated = pod.annotation(annotations::VM_NAME);
    if !annotated.is_empty() && annotated != record_name {
        return Verdict::Mismatch(Mismatch::AnnotationDisagrees {
            annotation: annotated.to_owned(),
            record: record_name.to_owned(),
        });
    }
    Verdict::Bound {
        name: record_name.to_owned(),
        form,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn pod(namespace: &str, name: &str, vm_name: Option<&str>) -> PodInput {
        PodInput {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            uid: Some("u".to_owned()),
            annotations: vm_name
                .map(|n| (annotations::VM_NAME.to_owned(), n.to_owned()))
                .into_iter()
                .collect(),
            deleting: false,
            resource_version: None,
        }
    }

    /// Fixed values, computed with `printf '<ns>/<pod>' | sha256sum`, so a
    /// change of the formula cannot pass by changing both sides.
    #[rstest]
    #[case::plain("default", "pod-x", "vk-default-pod-x-cd01a5")]
    #[case::dots_become_dashes("prod", "web.v2", "vk-prod-web-v2-ff5854")]
    fn derived_names_follow_the_stack(
        #[case] namespace: &str,
        #[case] pod: &str,
        #[case] expected: &str,
    ) {
        assert_eq!(vm_name_for_pod(namespace, pod), expected);
    }

    #[test]
    fn the_legacy_form_is_unhashed() {
        assert_eq!(legacy_vm_name_for_pod("prod", "toolbox"), "vk-prod-toolbox");
    }

    #[test]
    fn the_hash_tells_apart_what_the_dashes_join() {
        assert_eq!(
            legacy_vm_name_for_pod("a-b", "c"),
            legacy_vm_name_for_pod("a", "b-c")
        );
        assert_ne!(vm_name_for_pod("a-b", "c"), vm_name_for_pod("a", "b-c"));
    }

    #[rstest]
    #[case::hashed("tenant-a", "web-0", None, None, false, true)]
    #[case::hashed_with_agreeing_annotation("tenant-a", "web-0", Some("same"), None, false, true)]
    #[case::other_tenants_vm("tenant-a", "web-0", None, Some(("tenant-b", "web-0")), false, false)]
    #[case::other_pods_vm("tenant-a", "web-0", None, Some(("tenant-a", "web-1")), false, false)]
    #[case::legacy_refused("tenant-a", "web-0", None, Some(("legacy", "")), false, false)]
    #[case::legacy_accepted("tenant-a", "web-0", None, Some(("legacy", "")), true, true)]
    #[case::annotation_disagrees(
        "tenant-a",
        "web-0",
        Some("vk-tenant-b-web-0-abcdef"),
        None,
        false,
        false
    )]
    #[case::no_namespace("", "web-0", None, None, false, false)]
    fn verdicts(
        #[case] namespace: &str,
        #[case] name: &str,
        #[case] annotation: Option<&str>,
        #[case] record_of: Option<(&str, &str)>,
        #[case] accept_legacy: bool,
        #[case] bound: bool,
    ) {
        let record = match record_of {
            None => vm_name_for_pod(namespace, name),
            Some(("legacy", _)) => legacy_vm_name_for_pod(namespace, name),
            Some((ns, pod)) => vm_name_for_pod(ns, pod),
        };
        let annotation = annotation.map(|a| if a == "same" { record.as_str() } else { a });
        let verdict = bind(
            &pod(namespace, name, annotation),
            &record,
            BindingPolicy {
                accept_legacy_names: accept_legacy,
            },
        );
        assert_eq!(verdict.is_bound(), bound, "{verdict}");
    }

    #[test]
    fn an_unnamed_record_proves_nothing() {
        let verdict = bind(&pod("ns", "p", None), "", BindingPolicy::default());
        assert_eq!(verdict, Verdict::Mismatch(Mismatch::RecordUnnamed));
    }

    #[test]
    fn messages_name_both_vms_escaped() {
        let verdict = bind(
            &pod("tenant-a", "web-0", None),
            "vk-tenant-b\u{1b}[2J",
            BindingPolicy::default(),
        );
        let text = verdict.to_string();
        assert!(
            text.contains(&vm_name_for_pod("tenant-a", "web-0")),
            "{text}"
        );
        assert!(text.contains(r"vk-tenant-b\u{1b}[2J"), "{text}");
        assert!(!text.contains('\u{1b}'));
    }
}
