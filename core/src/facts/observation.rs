//! What was read from the pod, the record and the command line, before
//! validation.

use super::*;

/// Facts the command line supplies or overrides.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Overrides {
    /// Replaces the boot kind derived from annotations. `Some` always means
    /// cloned: the caller knows better (for example it is resuming work, or
    /// it saw the hibernate wake itself).
    pub boot: Option<BootKind>,
    /// The snapshot's recorded source image; only known on a normal clone
    /// from a snapshot. Empty reads as unknown.
    pub source_image: Option<String>,
}

/// What was read from the pod, the inspect output and the command line,
/// before validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// Pod namespace and name, for messages.
    pub pod: String,
    pub managed: bool,
    /// The VM record's `config.name`; the `vm.cocoonstack.io/name`
    /// annotation only when the record has none (a hand-written VM file).
    pub vm_name: String,
    /// Where `vm_name` came from, so an error names the right field.
    pub vm_name_from: NameSource,
    /// From inspect (`id`), else the `vm.cocoonstack.io/id` annotation.
    pub vm_id: String,
    pub backend: Backend,
    /// The backend annotation is exactly [`Backend::as_str`] of `backend`
    /// (an empty or unknown value is Cloud Hypervisor, but not *exactly*
    /// `cloud-hypervisor`: classification rule 3 needs the difference).
    pub backend_exact: bool,
    pub os: GuestOs,
    /// `None` when the VM was not cloned (classification rule 2).
    pub boot: Option<BootKind>,
    /// The snapshot's recorded source image, when known.
    pub source_image: Option<String>,
    /// The `vm.cocoonstack.io/guest-flavor` annotation, when non-empty.
    pub flavor: Option<String>,
    pub nics: Vec<RawNic>,
    /// All pod annotations, for later stages.
    pub annotations: BTreeMap<String, String>,
}

/// Where an observation's VM name came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NameSource {
    /// The VM record's `config.name` (the name the VM has).
    #[default]
    Record,
    /// The `vm.cocoonstack.io/name` annotation (the record had none).
    Annotation,
}

impl NameSource {
    /// The field an error about the name points at.
    pub fn field(self) -> String {
        match self {
            NameSource::Record => "VM name (the VM record's config.name)".to_owned(),
            NameSource::Annotation => format!("annotation {}", annotations::VM_NAME),
        }
    }
}

impl Observation {
    /// Combines the inputs, interpreting annotations per spec section 2.
    ///
    /// It proves nothing: whether `vm` is the pod's own VM (the ids agree,
    /// the names bind) is [`crate::decision::bind_record`]'s to say, and
    /// every host asks it first.
    pub fn new(pod: &PodInput, vm: &VmInspect, overrides: &Overrides) -> Self {
        let pod_name = pod.display_name();
        let annotated_id = pod.annotation(annotations::VM_ID);
        let vm_id = if vm.id.is_empty() {
            annotated_id
        } else {
            &vm.id
        };
        let flavor = pod.annotation(annotations::GUEST_FLAVOR);
        let (vm_name, vm_name_from) = match vm.name.as_str() {
            "" => (pod.annotation(annotations::VM_NAME), NameSource::Annotation),
            name => (name, NameSource::Record),
        };
        let backend_annotation = pod.annotation(annotations::BACKEND);
        let backend = Backend::from_annotation(backend_annotation);
        let boot = overrides
            .boot
            .or_else(|| BootKind::from_annotations(&pod.annotations));
        // The record's image is the snapshot's only on a normal clone from a
        // snapshot; a fork, a wake, a clone from a directory and resumed
        // work leave it unknown (spec section 2), and the disk probe decides.
        let recorded_image = (boot == Some(BootKind::Clone)
            && clone_from_dir(&pod.annotations).is_none())
        .then(|| vm.image.clone());
        Observation {
            pod: pod_name,
            managed: pod.annotation(annotations::MANAGED) == "true",
            vm_name: vm_name.to_owned(),
            vm_name_from,
            vm_id: vm_id.to_owned(),
            backend,
            backend_exact: backend_annotation == backend.as_str(),
            os: GuestOs::from_annotation(pod.annotation(annotations::OS)),
            boot,
            source_image: overrides
                .source_image
                .clone()
                .or(recorded_image)
                .filter(|image| !image.is_empty()),
            flavor: (!flavor.is_empty()).then(|| flavor.to_owned()),
            nics: vm.nics.clone(),
            annotations: pod.annotations.clone(),
        }
    }

    /// The VM id, validated; the error names where it came from.
    pub(crate) fn parse_vm_id(&self) -> Result<VmId, FactError> {
        parse_id(
            &self.vm_id,
            &Ctx::in_pod(
                Some(self.pod.as_str()),
                format!(
                    "VM id (inspect `id`, else annotation {})",
                    annotations::VM_ID
                ),
            ),
        )
    }

    /// Whether any NIC has a static IP (classification rule 6).
    pub fn has_static_nic(&self) -> bool {
        self.nics.iter().any(RawNic::is_static)
    }
}
