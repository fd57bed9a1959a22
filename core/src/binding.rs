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
//! One kind of name cannot be derived: the retired cocoon-webhook named a
//! Deployment pod's VM after a slot of its own and wrote that name into
//! `vm.cocoonstack.io/name`. Such a name is trusted only when the operator
//! opts in ([`BindingPolicy::accept_annotated_names`]), and then only when
//! no other pod on the node claims it: [`bind`] says
//! [`Verdict::Unproven`], the host lists the other pods it sees on its
//! node, and [`settle`] decides from that list.
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
    /// Also accept a name that is not derived from the pod but is its
    /// `vm.cocoonstack.io/name` annotation (`--accept-annotated-vm-names`,
    /// off by default): the retired cocoon-webhook's Deployment slots. It
    /// trusts an annotation, so it is safe only where the admission policy
    /// (`deploy/admission-policy.yaml`) lets no one but the stack write
    /// it; the name must also begin with `vk-<pod namespace>-` and no
    /// other pod on the node may claim it ([`settle`]).
    pub accept_annotated_names: bool,
}

/// Which form of name the record carries (or, in a [`Claim`], by which
/// form another pod claims it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NameForm {
    /// Derived from the pod, hashed ([`vm_name_for_pod`]).
    Hashed,
    /// Derived from the pod, unhashed ([`legacy_vm_name_for_pod`]).
    Legacy,
    /// The pod's `vm.cocoonstack.io/name` annotation, not derived.
    Annotated,
}

impl NameForm {
    /// How a pod holds a name of this form, for messages.
    fn as_claim(self) -> &'static str {
        match self {
            NameForm::Hashed => "as the name derived from it",
            NameForm::Legacy => "as the legacy name derived from it",
            NameForm::Annotated => "in its vm.cocoonstack.io/name annotation",
        }
    }
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
    /// The record's name is the pod's `vm.cocoonstack.io/name` annotation
    /// and begins with `vk-<pod namespace>-`, but is not derived from the
    /// pod (a Deployment slot of the retired cocoon-webhook), and the
    /// policy does not accept annotated names. `name` is the pod's own
    /// annotation value.
    AnnotatedNotAccepted { name: String },
    /// The record's name is the pod's annotated name, which the policy
    /// accepts, but another pod on the node claims it too: `pod`
    /// (`<namespace>/<name>`), by `form`.
    AnnotatedClaimed {
        name: String,
        pod: String,
        form: NameForm,
    },
    /// The record's name is the pod's annotated name, which the policy
    /// accepts, but the pod that asks is not among the pods the host sees
    /// on its node: the list cannot show that no pod claims the name (the
    /// pod runs elsewhere, or the host's view of its node is stale).
    AnnotatedOffNode { name: String },
}

impl Mismatch {
    /// Whether the message names a VM or a pod that may be another pod's
    /// (its record's name or id, the pod that claims the name). Such
    /// messages go to the daemon's log, never to the pod that asked: a
    /// pod's events must not tell its owner which VMs or pods exist on the
    /// node. A name the pod's own annotation carries is the pod's to see.
    pub fn names_another_vm(&self) -> bool {
        matches!(
            self,
            Mismatch::OtherVm { .. }
                | Mismatch::AnnotationDisagrees { .. }
                | Mismatch::IdDisagrees { .. }
                | Mismatch::AnnotatedClaimed { .. }
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
                "the VM record has the legacy unhashed name {:?} (expected {:?}); it is accepted only where the node's operator accepts legacy names (--accept-legacy-vm-names; accept_legacy_vm_names in the configuration and the library's planner options; AcceptLegacyVMNames in the Go package)",
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
            Mismatch::AnnotatedNotAccepted { name } => write!(
                f,
                "the VM record is named {name:?}, as annotation {} says, but that name is not derived from the pod's namespace and name (the retired cocoon-webhook named a Deployment's VMs after slots so); such names bind only where the node's operator accepts them (--accept-annotated-vm-names, accept_annotated_vm_names, AcceptAnnotatedVMNames in Go), safe only with the admission policy (deploy/admission-policy.yaml) installed",
                annotations::VM_NAME,
            ),
            Mismatch::AnnotatedClaimed { name, pod, form } => write!(
                f,
                "the VM record is named {name:?}, as annotation {} says, but pod {} on this node claims that name too ({}), so it cannot be proven to be this pod's VM; find out why the stack gave both pods this name, then recreate the pod that should not have it through its controller",
                annotations::VM_NAME,
                escape_controls(pod),
                form.as_claim(),
            ),
            Mismatch::AnnotatedOffNode { name } => write!(
                f,
                "the VM record is named {name:?}, as annotation {} says, but this pod is not among the pods this host sees on its node, so no other pod's claim on that name can be ruled out; the pod must be bound to this node (spec.nodeName) and the host's node (serve's node name, run --node) must be the pod's",
                annotations::VM_NAME,
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
    /// The record's name is the pod's annotated name, which the policy
    /// accepts, but it binds only when no other pod on the node claims it:
    /// [`settle`] decides once the host has listed the other pods it sees.
    /// Until then nothing may run in it and no IP is published.
    Unproven { name: String },
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
            Verdict::Bound {
                name,
                form: NameForm::Annotated,
            } => write!(
                f,
                "bound: the VM record is named {}, as the pod's {} annotation says, accepted by policy, and no other pod on the node claims that name",
                escape_controls(name),
                annotations::VM_NAME,
            ),
            Verdict::Unproven { name } => write!(
                f,
                "not proven: the VM record is named {}, as the pod's {} annotation says, which --accept-annotated-vm-names accepts only when no other pod on the node claims that name; without a view of the node's pods that is not known here (`run` and `serve` check it)",
                escape_controls(name),
                annotations::VM_NAME,
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
///
/// A name not derived from the pod is an annotated name when it equals
/// that annotation and begins with `vk-<pod namespace>-`: a mismatch of
/// its own kind ([`Mismatch::AnnotatedNotAccepted`]) unless `policy`
/// accepts such names, and then [`Verdict::Unproven`] until [`settle`]
/// has checked the node's other pods.
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
        return bind_annotated(pod, record_name, expected, policy);
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

/// A record name that is neither derived form: an annotated name
/// ([`bind`]), or another pod's VM.
fn bind_annotated(
    pod: &PodInput,
    record_name: &str,
    expected: String,
    policy: BindingPolicy,
) -> Verdict {
    let annotated = pod.annotation(annotations::VM_NAME);
    let in_namespace = record_name
        .strip_prefix("vk-")
        .and_then(|rest| rest.strip_prefix(pod.namespace.as_str()))
        .is_some_and(|rest| rest.len() > 1 && rest.starts_with('-'));
    if annotated != record_name || !in_namespace {
        return Verdict::Mismatch(Mismatch::OtherVm {
            expected,
            record: record_name.to_owned(),
        });
    }
    let name = record_name.to_owned();
    if policy.accept_annotated_names {
        Verdict::Unproven { name }
    } else {
        Verdict::Mismatch(Mismatch::AnnotatedNotAccepted { name })
    }
}

/// Whether `other`, an entry of a node's pod list, is `pod`: by uid when
/// the pod has one (a pod of the same name but another uid is another
/// pod), else by namespace and name.
pub fn is_listed(pod: &PodInput, other: &PodInput) -> bool {
    match &pod.uid {
        Some(uid) => other.uid.as_ref() == Some(uid),
        None => other.namespace == pod.namespace && other.name == pod.name,
    }
}

/// Another pod's claim on a VM name ([`claim`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// `<namespace>/<name>` of the pod that claims it.
    pub pod: String,
    pub form: NameForm,
}

/// Which pod of `others` (the pods a host sees on its node, `pod` itself
/// among them or not) claims the VM name `name`: the first whose derived
/// name, hashed or legacy, is `name`, or whose `vm.cocoonstack.io/name`
/// annotation is. `pod` itself (by uid, or by namespace and name) claims
/// nothing here.
pub fn claim(pod: &PodInput, name: &str, others: &[PodInput]) -> Option<Claim> {
    others
        .iter()
        .filter(|other| {
            let same_uid = pod.uid.is_some() && other.uid == pod.uid;
            let same_name = other.namespace == pod.namespace && other.name == pod.name;
            !same_uid && !same_name
        })
        .find_map(|other| {
            let form = if vm_name_for_pod(&other.namespace, &other.name) == name {
                NameForm::Hashed
            } else if legacy_vm_name_for_pod(&other.namespace, &other.name) == name {
                NameForm::Legacy
            } else if other.annotation(annotations::VM_NAME) == name {
                NameForm::Annotated
            } else {
                return None;
            };
            Some(Claim {
                pod: format!("{}/{}", other.namespace, other.name),
                form,
            })
        })
}

/// The verdict on an annotated name that [`bind`] left
/// [`Verdict::Unproven`], from `others`, every pod the host sees on its
/// node: bound when `pod` itself is among them ([`is_listed`]: a list
/// that does not hold the asking pod is not the list of the node it runs
/// on) and none of the others claims `name` ([`claim`]).
pub fn settle(pod: &PodInput, name: &str, others: &[PodInput]) -> Verdict {
    if !others.iter().any(|other| is_listed(pod, other)) {
        return Verdict::Mismatch(Mismatch::AnnotatedOffNode {
            name: name.to_owned(),
        });
    }
    match claim(pod, name, others) {
        None => Verdict::Bound {
            name: name.to_owned(),
            form: NameForm::Annotated,
        },
        Some(Claim { pod, form }) => Verdict::Mismatch(Mismatch::AnnotatedClaimed {
            name: name.to_owned(),
            pod,
            form,
        }),
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
                ..BindingPolicy::default()
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

    /// A short label of a verdict, for the tables below.
    fn label(verdict: &Verdict) -> String {
        match verdict {
            Verdict::Bound { form, .. } => format!(
                "bound-{}",
                serde_json::to_value(form).unwrap().as_str().unwrap()
            ),
            Verdict::Unproven { .. } => "unproven".to_owned(),
            Verdict::Mismatch(Mismatch::AnnotatedClaimed { form, .. }) => format!(
                "claimed-{}",
                serde_json::to_value(form).unwrap().as_str().unwrap()
            ),
            Verdict::Mismatch(m) => serde_json::to_value(m).unwrap()["reason"]
                .as_str()
                .unwrap()
                .to_owned(),
        }
    }

    fn other(namespace: &str, name: &str, vm_name: Option<&str>) -> PodInput {
        PodInput {
            uid: Some(format!("u-{namespace}-{name}")),
            ..pod(namespace, name, vm_name)
        }
    }

    /// A retired cocoon-webhook Deployment slot: pod
    /// `prod/demo-7b7c9d9d5f-x2x4z` whose VM is `vk-prod-demo-1`. It binds
    /// only by the opt-in, only when the record's name is the annotation
    /// and begins with `vk-<namespace>-`, and only when no other pod on
    /// the node claims the name (by either derived form or by its
    /// annotation). `others` are the node's other pods: `(namespace,
    /// name, vm.cocoonstack.io/name)`.
    #[rstest]
    #[case::accepted("prod", Some("vk-prod-demo-1"), "vk-prod-demo-1", true, &[("prod", "web-0", None)], "bound-annotated")]
    #[case::accepted_with_no_other_pod("prod", Some("vk-prod-demo-1"), "vk-prod-demo-1", true, &[], "bound-annotated")]
    #[case::opt_in_off("prod", Some("vk-prod-demo-1"), "vk-prod-demo-1", false, &[], "annotated-not-accepted")]
    #[case::annotation_differs("prod", Some("vk-prod-demo-2"), "vk-prod-demo-1", true, &[], "other-vm")]
    #[case::annotation_absent("prod", None, "vk-prod-demo-1", true, &[], "other-vm")]
    #[case::another_namespaces_prefix("prod", Some("vk-staging-demo-1"), "vk-staging-demo-1", true, &[], "other-vm")]
    #[case::a_longer_namespace_is_another("prod", Some("vk-production-demo-1"), "vk-production-demo-1", true, &[], "other-vm")]
    #[case::nothing_after_the_prefix("prod", Some("vk-prod-"), "vk-prod-", true, &[], "other-vm")]
    #[case::another_form_without_opt_in_is_not_blamed_on_annotations("prod", Some("vk-prod-demo-1"), "vk-prod-demo-1", false, &[("prod", "demo-1", None)], "annotated-not-accepted")]
    #[case::claimed_as_a_legacy_name("prod", Some("vk-prod-demo-1"), "vk-prod-demo-1", true, &[("prod", "demo-1", None)], "claimed-legacy")]
    #[case::claimed_as_a_legacy_name_across_namespaces("prod", Some("vk-prod-demo-1"), "vk-prod-demo-1", true, &[("prod-demo", "1", None)], "claimed-legacy")]
    #[case::claimed_as_a_hashed_name("prod", Some("vk-prod-web-0-049175"), "vk-prod-web-0-049175", true, &[("prod", "web-0", None)], "claimed-hashed")]
    #[case::claimed_by_another_annotation("prod", Some("vk-prod-demo-1"), "vk-prod-demo-1", true, &[("prod", "demo-7b7c9d9d5f-q9w8e", Some("vk-prod-demo-1"))], "claimed-annotated")]
    #[case::its_own_entry_claims_nothing("prod", Some("vk-prod-demo-1"), "vk-prod-demo-1", true, &[("prod", "demo-7b7c9d9d5f-x2x4z", Some("vk-prod-demo-1"))], "bound-annotated")]
    fn annotated_names(
        #[case] namespace: &str,
        #[case] annotation: Option<&str>,
        #[case] record: &str,
        #[case] accept_annotated: bool,
        #[case] others: &[(&str, &str, Option<&str>)],
        #[case] expected: &str,
    ) {
        let asking = pod(namespace, "demo-7b7c9d9d5f-x2x4z", annotation);
        // The node's list holds the asking pod itself.
        let others: Vec<PodInput> = others
            .iter()
            .map(|(ns, name, vm)| other(ns, name, *vm))
            .chain([asking.clone()])
            .collect();
        let policy = BindingPolicy {
            accept_annotated_names: accept_annotated,
            ..BindingPolicy::default()
        };
        let verdict = match bind(&asking, record, policy) {
            Verdict::Unproven { name } => {
                assert_eq!(name, record);
                settle(&asking, &name, &others)
            }
            verdict => verdict,
        };
        assert_eq!(label(&verdict), expected, "{verdict}");
    }

    /// A list that does not hold the asking pod is another node's (or a
    /// stale view): it proves nothing, whatever it holds. A pod of the same
    /// name but another uid is not the asking pod.
    #[rstest]
    #[case::empty_list(&[], "annotated-off-node")]
    #[case::other_pods_only(&[("prod", "web-0", "u-2")], "annotated-off-node")]
    #[case::same_name_other_uid(&[("prod", "demo-7b7c9d9d5f-x2x4z", "u-old")], "annotated-off-node")]
    #[case::listed_by_uid(&[("prod", "demo-7b7c9d9d5f-x2x4z", "u")], "bound-annotated")]
    fn the_asking_pod_must_be_on_the_list(
        #[case] listed: &[(&str, &str, &str)],
        #[case] expected: &str,
    ) {
        let asking = pod("prod", "demo-7b7c9d9d5f-x2x4z", Some("vk-prod-demo-1"));
        let others: Vec<PodInput> = listed
            .iter()
            .map(|(ns, name, uid)| PodInput {
                uid: Some((*uid).to_owned()),
                ..other(ns, name, None)
            })
            .collect();
        let verdict = settle(&asking, "vk-prod-demo-1", &others);
        assert_eq!(label(&verdict), expected, "{verdict}");
        if let Verdict::Mismatch(m) = verdict {
            assert!(!m.names_another_vm());
            assert!(m.to_string().contains("not among the pods"), "{m}");
        }
    }

    #[test]
    fn the_hashed_name_in_the_table_is_the_stacks() {
        assert_eq!(vm_name_for_pod("prod", "web-0"), "vk-prod-web-0-049175");
    }

    /// The opt-in never widens the derived forms: a legacy name stays
    /// refused without its own opt-in, whatever the annotation says.
    #[test]
    fn the_annotated_opt_in_does_not_accept_legacy_names() {
        let legacy = legacy_vm_name_for_pod("prod", "demo-1");
        let verdict = bind(
            &pod("prod", "demo-1", Some(&legacy)),
            &legacy,
            BindingPolicy {
                accept_annotated_names: true,
                ..BindingPolicy::default()
            },
        );
        assert_eq!(label(&verdict), "legacy-not-accepted", "{verdict}");
    }

    /// What each mismatch of an annotated name tells: the name (the pod's
    /// own annotation) may be shown; the pod that claims it only in the
    /// operator's text; neither tells the owner to remove annotations.
    #[test]
    fn annotated_mismatches_name_only_the_pods_own_annotation() {
        let not_accepted = Mismatch::AnnotatedNotAccepted {
            name: "vk-prod-demo-1".into(),
        };
        assert!(!not_accepted.names_another_vm());
        let text = not_accepted.to_string();
        assert!(text.contains("--accept-annotated-vm-names"), "{text}");
        assert!(text.contains("admission policy"), "{text}");
        assert!(!text.contains("remove"), "{text}");
        let claimed = Mismatch::AnnotatedClaimed {
            name: "vk-prod-demo-1".into(),
            pod: "prod/demo-1".into(),
            form: NameForm::Legacy,
        };
        assert!(claimed.names_another_vm(), "it names the other pod");
        assert!(claimed.to_string().contains("prod/demo-1"));
    }
}
