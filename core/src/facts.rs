//! VM facts: what the host knows about one cloned VM.
//!
//! Two stages, so that classification never depends on values it does not
//! use:
//!
//! 1. [`Observation`]: read leniently from a Pod (`kubectl get pod -o json`)
//!    and `cocoon vm inspect --json`. Annotations are interpreted exactly as
//!    spec section 2 says (backend, OS, boot kind); NIC values stay raw text.
//! 2. [`VmFacts`]: validated, typed values (RFC 1123 VM name, MACs, IPv4
//!    addresses, prefixes, gateways, flavour). Only these reach a plugin.
//!    Every error names the field and the offending value.
//!
//! Reading is lenient about *values* (a malformed MAC on a pod that needs no
//! fixup must not stop anything) but strict about *shapes*: a number where a
//! string belongs means the input is not what we think it is, and guessing
//! would classify the wrong VM.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fmt;
use std::net::Ipv4Addr;

use serde_json::{Map, Value};

/// Annotation keys read by the host (spec section 2). Other components of
/// the stack read the same keys: they are part of the contract.
pub mod annotations {
    pub const VM_NAME: &str = "vm.cocoonstack.io/name";
    pub const VM_ID: &str = "vm.cocoonstack.io/id";
    pub const BACKEND: &str = "vm.cocoonstack.io/backend";
    pub const OS: &str = "cocoonset.cocoonstack.io/os";
    pub const MANAGED: &str = "cocoonset.cocoonstack.io/managed";
    pub const MODE: &str = "cocoonset.cocoonstack.io/mode";
    pub const FORK_FROM: &str = "vm.cocoonstack.io/fork-from";
    pub const CLONE_FROM_DIR: &str = "vm.cocoonstack.io/clone-from-dir";
    pub const RESTORE_FROM_HIBERNATE: &str = "vm.cocoonstack.io/restore-from-hibernate";
    pub const GUEST_FLAVOR: &str = "vm.cocoonstack.io/guest-flavor";
    /// `"true"` while the stack hibernates the VM (spec section 8).
    pub const HIBERNATE: &str = "vm.cocoonstack.io/hibernate";
}

/// `text` with every control character (C0, DEL, C1: `\n`, `\r`,
/// `\u{1b}`, ...) and every invisible formatting character
/// ([`is_invisible_format`]: bidi overrides, zero-width characters) escaped,
/// so untrusted text stays one printable line that shows what it is in
/// messages, logs, annotations and events: a `\r` cannot rewrite a line, an
/// ESC cannot drive the terminal, a U+202E cannot reorder what a reviewer
/// sees.
pub fn escape_controls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || is_invisible_format(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Unicode formatting characters that change how text is shown without
/// being seen: bidi embeddings, overrides and isolates (U+202A..=U+202E,
/// U+2066..=U+2069, U+200E, U+200F, U+061C), zero-width characters
/// (U+200B..=U+200D, U+2060..=U+2064, U+FEFF), the soft hyphen, the
/// Mongolian vowel separator and interlinear annotation marks.
pub fn is_invisible_format(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{061C}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
    )
}

/// At most this many NICs per VM. A cocoon VM has a handful; the bound keeps
/// plan size and error messages small whatever the inspect output says. 48
/// is the most a Firecracker clone can have and still fit the default plan
/// limit of 256 steps: 2 prepare steps, 3 link steps per NIC, and the
/// networkd flavour's cleanup, one file per NIC and a restart
/// (2 + 3 x 48 + 1 + 48 + 1 = 196).
pub const MAX_NICS: usize = 48;

/// Longest VM id, in bytes. Cocoon ids are short; the bound keeps the id a
/// sane single path component below the cocoon root.
pub const MAX_VM_ID_LEN: usize = 128;

/// Longest RFC 1123 label, and so the longest flavour.
pub const MAX_LABEL_LEN: usize = 63;

/// Longest VM name: the longest the stack derives, `vk-`, a namespace (a
/// DNS label, 63 bytes), `-`, a pod name (a DNS subdomain, 253 bytes), `-`
/// and the 6-digit hash.
pub const MAX_VM_NAME_LEN: usize = 3 + 63 + 1 + 253 + 1 + 6;

/// Longest hostname the hostname step writes (spec section 4): the VM name
/// must be dot-separated RFC 1123 labels of at most this many bytes in all.
pub const MAX_HOSTNAME_LEN: usize = 63;

/// Where the guest reads its static hostname from: the file the hostname
/// step of a Linux plan writes the VM name to.
pub const HOSTNAME_PATH: &str = "/etc/hostname";

/// Offending values are shown escaped and cut to this many characters, so a
/// hostile or binary annotation cannot flood a log line or an event.
const SHOWN_CHARS: usize = 80;

/// The hypervisor behind the VM. Anything but exactly `firecracker` is
/// Cloud Hypervisor (spec section 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    CloudHypervisor,
    Firecracker,
}

impl Backend {
    /// Interprets the `vm.cocoonstack.io/backend` annotation: an empty or
    /// unknown value is Cloud Hypervisor, the stack's default.
    pub fn from_annotation(value: &str) -> Self {
        if value == "firecracker" {
            Backend::Firecracker
        } else {
            Backend::CloudHypervisor
        }
    }

    /// The annotation spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::CloudHypervisor => "cloud-hypervisor",
            Backend::Firecracker => "firecracker",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The guest OS. Only exactly `windows` is Windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GuestOs {
    Linux,
    Windows,
    Android,
    Unknown,
}

/// Whether the `cocoonset.cocoonstack.io/os` value names macOS: trimmed
/// of white space, then equal to `macos` under Unicode simple case folding
/// (spec section 2), as the stack matches it (`MacOS`, ` MACOS `, and
/// `macoſ` with U+017F LONG S, whose simple fold is `s`). Of the letters
/// of `macos` only `s` has a fold partner outside ASCII.
pub fn is_macos(value: &str) -> bool {
    let mut found = value.trim().chars();
    let same = "macos".chars().all(|want| {
        found
            .next()
            .is_some_and(|c| c.to_ascii_lowercase() == want || (want == 's' && c == '\u{17f}'))
    });
    same && found.next().is_none()
}

/// The `vm.cocoonstack.io/clone-from-dir` value that counts: trimmed of
/// white space (Unicode White_Space, as the stack trims it), blank is
/// absent (spec section 2).
pub fn clone_from_dir(pod_annotations: &BTreeMap<String, String>) -> Option<&str> {
    pod_annotations
        .get(annotations::CLONE_FROM_DIR)
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
}

impl GuestOs {
    /// Interprets the `cocoonset.cocoonstack.io/os` annotation. The match is
    /// exact (`Windows` is Unknown) because the rest of the stack compares
    /// the same way; a looser match here would fix up guests nobody else
    /// treats as Windows.
    pub fn from_annotation(value: &str) -> Self {
        match value {
            "linux" => GuestOs::Linux,
            "windows" => GuestOs::Windows,
            "android" => GuestOs::Android,
            _ => GuestOs::Unknown,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            GuestOs::Linux => "linux",
            GuestOs::Windows => "windows",
            GuestOs::Android => "android",
            GuestOs::Unknown => "unknown",
        }
    }
}

impl fmt::Display for GuestOs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the guest disk was made; decides the Linux network flavour only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageKind {
    Cloudimg,
    Oci,
    /// Not needed for this decision, so not probed.
    Unknown,
}

impl ImageKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ImageKind::Cloudimg => "cloudimg",
            ImageKind::Oci => "oci",
            ImageKind::Unknown => "unknown",
        }
    }
}

impl fmt::Display for ImageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a cloned VM came to run. A VM that was not cloned (mode `run`
/// without fork-from or clone-from-dir) has no boot kind: see
/// [`Observation::boot`]. [`BootKind::Parent`] is never derived either: it
/// is the facts of a running VM being prepared as a parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BootKind {
    Clone,
    Fork,
    Wake,
    Resumed,
    /// A running VM about to be snapshotted (the `prepare` scenario).
    Parent,
}

impl BootKind {
    /// Derives the boot kind from pod annotations (spec section 2), in
    /// upstream's order:
    ///
    /// - restore-from-hibernate exactly `"true"`: [`BootKind::Wake`], even
    ///   on a `mode=run` or forked pod;
    /// - clone-from-dir non-empty: [`BootKind::Clone`];
    /// - fork-from non-empty: [`BootKind::Fork`];
    /// - mode `run` (ASCII case-insensitive): not cloned, `None`;
    /// - otherwise [`BootKind::Clone`]: an empty or unknown mode is a clone,
    ///   the controller's default.
    ///
    /// [`BootKind::Resumed`] is never derived: only the caller knows that it
    /// is resuming work after a restart, and says so through [`Overrides`].
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Option<Self> {
        let get = |key: &str| annotations.get(key).map(String::as_str).unwrap_or("");
        if get(annotations::RESTORE_FROM_HIBERNATE) == "true" {
            Some(BootKind::Wake)
        } else if clone_from_dir(annotations).is_some() {
            Some(BootKind::Clone)
        } else if !get(annotations::FORK_FROM).is_empty() {
            Some(BootKind::Fork)
        } else if get(annotations::MODE).eq_ignore_ascii_case("run") {
            None
        } else {
            Some(BootKind::Clone)
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BootKind::Clone => "clone",
            BootKind::Fork => "fork",
            BootKind::Wake => "wake",
            BootKind::Resumed => "resumed",
            BootKind::Parent => "parent",
        }
    }
}

impl fmt::Display for BootKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One NIC as `cocoon vm inspect --json` lists it, values unvalidated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RawNic {
    pub mac: String,
    pub tap: String,
    /// Empty means DHCP.
    pub ip: String,
    pub prefix: Option<i64>,
    /// Empty means no gateway.
    pub gateway: String,
}

impl RawNic {
    /// A NIC is static when `network.ip` is non-empty (spec section 2).
    pub fn is_static(&self) -> bool {
        !self.ip.is_empty()
    }
}

/// Which input a reading error is about; its `Display` is the command whose
/// output the input must be, so the error can say what to pass instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InputKind {
    Pod,
    VmInspect,
}

impl fmt::Display for InputKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InputKind::Pod => "`kubectl get pod <name> -o json`",
            InputKind::VmInspect => "`cocoon vm inspect <id> --json`",
        })
    }
}

/// The parts of a Pod the host reads, as `kubectl get pod -o json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodInput {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`; empty when the JSON has none.
    pub namespace: String,
    /// `metadata.uid`: the pod incarnation. Writes back to the pod carry it
    /// as a precondition so they never land on a recreated pod.
    pub uid: Option<String>,
    /// `metadata.annotations`; absent or `null` reads as empty.
    pub annotations: BTreeMap<String, String>,
    /// `metadata.deletionTimestamp` is set: the pod is being deleted and
    /// nothing more is done for it (spec section 8).
    pub deleting: bool,
    /// `metadata.resourceVersion`: which version of the pod this is. A
    /// write decided from this read carries it as a precondition, so it
    /// lands only while the pod is still as read. `None` when the input
    /// has none (a pod file written by hand).
    pub resource_version: Option<String>,
}

impl PodInput {
    /// Parses `kubectl get pod <name> -o json` output. `input` names the
    /// text in errors (usually the file name).
    pub fn from_json(text: &str, input: &str) -> Result<Self, FactError> {
        let value = parse_json(text, input, InputKind::Pod)?;
        Self::from_value(&value, input)
    }

    /// Reads an already parsed Pod object.
    pub fn from_value(value: &Value, input: &str) -> Result<Self, FactError> {
        let r = Reader {
            input,
            kind: InputKind::Pod,
        };
        let root = r.object(Some(value), "top level")?;
        if let Some(kind) = r.opt_string(root, "kind", "kind")?
            && kind != "Pod"
        {
            return Err(FactError::NotAPod {
                input: input.to_owned(),
                kind: shown(&kind),
            });
        }
        let meta = r.object(root.get("metadata"), "metadata")?;
        let name = r.opt_string(meta, "name", "metadata.name")?;
        let name = match name {
            Some(name) if !name.is_empty() => name,
            _ => return Err(r.shape("metadata.name", "a non-empty string", got_missing(&name))),
        };
        let namespace = r
            .opt_string(meta, "namespace", "metadata.namespace")?
            .unwrap_or_default();
        let uid = r
            .opt_string(meta, "uid", "metadata.uid")?
            .filter(|uid| !uid.is_empty());
        let mut annotations = BTreeMap::new();
        if let Some(found) = present(meta.get("annotations")) {
            let map = r.object(Some(found), "metadata.annotations")?;
            for (key, value) in map {
                let path = format!("metadata.annotations[{key:?}]");
                match value {
                    Value::String(s) => {
                        annotations.insert(key.clone(), s.clone());
                    }
                    other => return Err(r.shape(&path, "a string", describe(other))),
                }
            }
        }
        let deleting = present(meta.get("deletionTimestamp")).is_some();
        // Only ever used as a write precondition: a pod file without a
        // usable one simply has none.
        let resource_version = meta
            .get("resourceVersion")
            .and_then(Value::as_str)
            .filter(|version| !version.is_empty())
            .map(str::to_owned);
        Ok(PodInput {
            name,
            namespace,
            uid,
            annotations,
            deleting,
            resource_version,
        })
    }

    /// `namespace/name`, or just the name when the namespace is unknown.
    /// `namespace/name` for messages, with control characters escaped: a
    /// pod file may carry a name the API server would refuse, and a message
    /// stays one printable line.
    pub fn display_name(&self) -> String {
        let raw = if self.namespace.is_empty() {
            self.name.clone()
        } else {
            format!("{}/{}", self.namespace, self.name)
        };
        escape_controls(&raw)
    }

    /// The annotation's value; empty when absent, because the spec treats
    /// absent and empty alike everywhere.
    pub fn annotation(&self, key: &str) -> &str {
        self.annotations.get(key).map(String::as_str).unwrap_or("")
    }
}

/// The parts of the VM record (`cocoon vm inspect --json`) the host reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VmInspect {
    /// `id`; empty when absent.
    pub id: String,
    /// `config.name`: the VM's name, which binds it to its pod (spec
    /// section 2); empty when absent.
    pub name: String,
    /// `config.image`: cocoon copies a snapshot's config into its clones,
    /// so on a normal clone this is the source image; empty when absent.
    pub image: String,
    /// `network_configs[]` in inspect order (the order FC's `eth<i>` follows).
    pub nics: Vec<RawNic>,
    /// `created_at` (RFC 3339), in milliseconds since the Unix epoch: when
    /// cocoon made this VM. `None` when absent or not an RFC 3339 time; it
    /// only places the stack's wake events near this VM (spec section 2).
    pub created_unix_ms: Option<i64>,
}

impl VmInspect {
    /// Parses `cocoon vm inspect --json` output. `input` names the text in
    /// errors (usually the file name).
    pub fn from_json(text: &str, input: &str) -> Result<Self, FactError> {
        let value = parse_json(text, input, InputKind::VmInspect)?;
        Self::from_value(&value, input)
    }

    /// Reads an already parsed inspect object. Absent and `null` optional
    /// fields read as empty; a field of the wrong JSON type is an error
    /// naming its path.
    pub fn from_value(value: &Value, input: &str) -> Result<Self, FactError> {
        let r = Reader {
            input,
            kind: InputKind::VmInspect,
        };
        let root = r.object(Some(value), "top level")?;
        let id = r.opt_string(root, "id", "id")?.unwrap_or_default();
        let (mut name, mut image) = (String::new(), String::new());
        if let Some(config) = present(root.get("config")) {
            let config = r.object(Some(config), "config")?;
            name = r
                .opt_string(config, "name", "config.name")?
                .unwrap_or_default();
            image = r
                .opt_string(config, "image", "config.image")?
                .unwrap_or_default();
        }
        let mut nics = Vec::new();
        if let Some(found) = present(root.get("network_configs")) {
            let Value::Array(items) = found else {
                return Err(r.shape("network_configs", "an array", describe(found)));
            };
            for (i, item) in items.iter().enumerate() {
                let path = format!("network_configs[{i}]");
                let nic = r.object(Some(item), &path)?;
                let mut raw = RawNic {
                    mac: r
                        .opt_string(nic, "mac", &format!("{path}.mac"))?
                        .unwrap_or_default(),
                    tap: r
                        .opt_string(nic, "tap", &format!("{path}.tap"))?
                        .unwrap_or_default(),
                    ..RawNic::default()
                };
                if let Some(network) = present(nic.get("network")) {
                    let net_path = format!("{path}.network");
                    let network = r.object(Some(network), &net_path)?;
                    raw.ip = r
                        .opt_string(network, "ip", &format!("{net_path}.ip"))?
                        .unwrap_or_default();
                    raw.gateway = r
                        .opt_string(network, "gateway", &format!("{net_path}.gateway"))?
                        .unwrap_or_default();
                    raw.prefix = r.opt_integer(network, "prefix", &format!("{net_path}.prefix"))?;
                }
                nics.push(raw);
            }
        }
        let created_unix_ms = root
            .get("created_at")
            .and_then(Value::as_str)
            .and_then(|text| text.parse::<jiff::Timestamp>().ok())
            .map(|at| at.as_millisecond());
        Ok(VmInspect {
            id,
            name,
            image,
            nics,
            created_unix_ms,
        })
    }
}

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
    fn parse_vm_id(&self) -> Result<VmId, FactError> {
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

/// A validated VM name, as the stack names VMs: 1..=[`MAX_VM_NAME_LEN`]
/// of ASCII letters, digits, `-`, `.` and `_`, starting and ending with a
/// letter or digit. Safe in messages, the hint and a plugin's facts; not
/// always a hostname (a long pod's hashed name is longer than one): only
/// the plans that write it as the guest's hostname need that
/// ([`hostname`](Self::hostname)), so a Windows plan never refuses it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VmName(String);

impl VmName {
    /// Validates a VM name.
    pub fn parse(value: &str) -> Result<Self, FactError> {
        parse_name(value, &Ctx::standalone("VM name"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as the guest's hostname (spec section 4, step 2):
    /// dot-separated RFC 1123 labels (`a-z`, `0-9`, `-`, each starting
    /// and ending with a letter or digit) of at most [`MAX_HOSTNAME_LEN`]
    /// bytes in all, so the legacy name of a dotted pod
    /// (`vk-default-web.v1-0`) is one. The error names the rule broken and
    /// what the stack must change.
    pub fn hostname(&self) -> Result<&str, FactError> {
        let name = self.as_str();
        let ctx = Ctx::standalone(
            "VM name (the VM record's config.name, which the plan writes to /etc/hostname)",
        );
        match hostname_rule(name) {
            Some(rule) => Err(ctx.invalid(name, rule, FIX_HOSTNAME)),
            None => Ok(name),
        }
    }
}

/// Check what a plan writes to [`HOSTNAME_PATH`] that is not the VM name
/// (a vendor plugin's own hostname): the same hostname rule as
/// [`VmName::hostname`], so no Linux plan writes a hostname the guest
/// cannot take.
pub fn check_written_hostname(written: &str) -> Result<(), FactError> {
    let ctx = Ctx::standalone("the hostname the plan writes to /etc/hostname");
    match hostname_rule(written) {
        Some(rule) => Err(ctx.invalid(
            written,
            rule,
            "the plugin that planned it must write the VM name, or a hostname of dot-separated RFC 1123 labels of at most 63 bytes; report it to the plugin's vendor",
        )),
        None => Ok(()),
    }
}

/// The hostname rule a value breaks, or `None`: dot-separated RFC 1123
/// labels (`a-z`, `0-9`, `-`, each starting and ending with a letter or
/// digit) of at most [`MAX_HOSTNAME_LEN`] bytes in all.
fn hostname_rule(name: &str) -> Option<&'static str> {
    if name.len() > MAX_HOSTNAME_LEN {
        Some("is longer than the 63 bytes a hostname may have")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.'))
    {
        Some("may only hold a-z, 0-9, '-' and '.' as a hostname")
    } else if name.split('.').any(str::is_empty) {
        Some("has an empty label (a dot at an end, or two in a row)")
    } else if name
        .split('.')
        .any(|label| label.starts_with('-') || label.ends_with('-'))
    {
        Some("has a label that starts or ends with '-'")
    } else {
        None
    }
}

impl fmt::Display for VmName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated cocoon VM id: safe as a single path component below the
/// cocoon root and as a `cocoon` argument (never starts with `-`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VmId(String);

impl VmId {
    /// Validates a VM id: 1..=128 of `A-Z`, `a-z`, `0-9`, `.`, `_`, `-`, not
    /// starting with `-` (it would read as an option) or `.` (hidden, `.`,
    /// `..`), and without `..` anywhere. No `/` can pass, so the id is always
    /// exactly one path component.
    pub fn parse(value: &str) -> Result<Self, FactError> {
        parse_id(value, &Ctx::standalone("VM id"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for VmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A unicast, non-zero MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// Parses six two-hex-digit groups separated by `:` (either case).
    /// Multicast (lowest bit of the first octet set, broadcast included) and
    /// all-zero addresses are refused: no NIC can own them, and a networkd
    /// `[Match]` on one would match nothing or too much.
    pub fn parse(value: &str) -> Result<Self, FactError> {
        parse_mac(value, &Ctx::standalone("MAC address"))
    }
}

impl fmt::Display for MacAddr {
    /// Lowercase, colon-separated: `52:54:00:12:34:56`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            o[0], o[1], o[2], o[3], o[4], o[5]
        )
    }
}

/// A static IPv4 configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StaticIpv4 {
    pub address: Ipv4Addr,
    /// 1..=32 (a record without one, or with 0, gives 24).
    pub prefix: u8,
    pub gateway: Option<Ipv4Addr>,
}

/// A validated NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Nic {
    pub mac: MacAddr,
    pub static_ipv4: Option<StaticIpv4>,
}

/// A validated guest flavour: 1..=63 of `a-z`, `0-9`, `-`, `.`, `_`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Flavor(String);

impl Flavor {
    /// Validates a flavour name. Flavours select vendor plugins and appear
    /// in messages and metrics labels, so they are kept short and plain.
    pub fn parse(value: &str) -> Result<Self, FactError> {
        parse_flavor(value, &Ctx::standalone("guest flavour"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Validated facts: the only form in which facts reach a plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmFacts {
    pub name: VmName,
    pub id: VmId,
    pub backend: Backend,
    pub os: GuestOs,
    pub image: ImageKind,
    pub boot: BootKind,
    pub nics: Vec<Nic>,
    pub flavor: Option<Flavor>,
}

impl VmFacts {
    /// Validates an observation for a fixup that is about to run. `image` is
    /// the probed image kind ([`ImageKind::Unknown`] when the scenario does
    /// not need it).
    ///
    /// Called only when classification asked for a fixup, so a VM that was
    /// not cloned is an error here. The first invalid value wins; every
    /// error names the pod, the field and the value.
    pub fn validate(obs: &Observation, image: ImageKind) -> Result<Self, FactError> {
        let Some(boot) = obs.boot else {
            return Err(FactError::NotCloned {
                pod: obs.pod.clone(),
            });
        };
        Self::validate_as(obs, image, boot)
    }

    /// Validates the observation of a running VM about to be snapshotted
    /// as a parent (the `prepare` scenario): as [`validate`](Self::validate)
    /// does, with boot kind [`BootKind::Parent`] whatever made the VM (a
    /// clone may itself become a parent).
    pub fn for_parent(obs: &Observation, image: ImageKind) -> Result<Self, FactError> {
        Self::validate_as(obs, image, BootKind::Parent)
    }

    fn validate_as(obs: &Observation, image: ImageKind, boot: BootKind) -> Result<Self, FactError> {
        let pod = Some(obs.pod.as_str());
        let name = parse_name(&obs.vm_name, &Ctx::in_pod(pod, obs.vm_name_from.field()))?;
        let id = obs.parse_vm_id()?;
        if obs.nics.len() > MAX_NICS {
            return Err(FactError::TooManyNics {
                pod: obs.pod.clone(),
                count: obs.nics.len(),
            });
        }
        let mut nics = Vec::with_capacity(obs.nics.len());
        let mut seen: BTreeMap<[u8; 6], usize> = BTreeMap::new();
        for (i, raw) in obs.nics.iter().enumerate() {
            let nic = validate_nic(pod, i, raw)?;
            match seen.entry(nic.mac.0) {
                Entry::Occupied(first) => {
                    return Err(FactError::DuplicateMac {
                        pod: obs.pod.clone(),
                        mac: nic.mac,
                        first: *first.get(),
                        second: i,
                    });
                }
                Entry::Vacant(slot) => {
                    slot.insert(i);
                }
            }
            nics.push(nic);
        }
        let flavor = obs
            .flavor
            .as_deref()
            .map(|f| {
                parse_flavor(
                    f,
                    &Ctx::in_pod(pod, format!("annotation {}", annotations::GUEST_FLAVOR)),
                )
            })
            .transpose()?;
        Ok(VmFacts {
            name,
            id,
            backend: obs.backend,
            os: obs.os,
            image,
            boot,
            nics,
            flavor,
        })
    }
}

/// How the IP wait finds the guest's address: the first NIC's static IP,
/// or its MAC's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WaitNic {
    Static(Ipv4Addr),
    Lease(MacAddr),
}

/// What the IP wait needs, and nothing more: the VM id, the first NIC and
/// the OS (spec section 2, "validate only what the path uses"). A pod that
/// needs no fixup is never failed over a fact only a plan would use (a VM
/// name that is no hostname, an odd MAC on a second NIC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitFacts {
    pub id: VmId,
    /// The VM's name as the record has it, escaped, for messages only.
    pub name: String,
    pub os: GuestOs,
    /// `None` when the VM has no NIC: there is no IP to wait for.
    pub first: Option<WaitNic>,
}

impl WaitFacts {
    /// Validates the id and the one value of the first NIC the wait reads.
    pub fn validate(obs: &Observation) -> Result<Self, FactError> {
        let pod = Some(obs.pod.as_str());
        let id = obs.parse_vm_id()?;
        let first = match obs.nics.first() {
            None => None,
            Some(raw) if raw.is_static() => Some(WaitNic::Static(
                raw.ip.parse::<Ipv4Addr>().map_err(|_| {
                    Ctx::in_pod(pod, "network_configs[0].network.ip".to_owned()).invalid(
                        &raw.ip,
                        "is not a dotted-quad IPv4 address",
                        FIX_NET,
                    )
                })?,
            )),
            Some(raw) => Some(WaitNic::Lease(parse_mac(
                &raw.mac,
                &Ctx::in_pod(pod, "network_configs[0].mac".to_owned()),
            )?)),
        };
        Ok(WaitFacts {
            id,
            name: escape_controls(&obs.vm_name),
            os: obs.os,
            first,
        })
    }

    /// The same view of facts already validated for a plan.
    pub fn from_facts(facts: &VmFacts) -> Self {
        WaitFacts {
            id: facts.id.clone(),
            name: facts.name.to_string(),
            os: facts.os,
            first: facts.nics.first().map(|nic| match nic.static_ipv4 {
                Some(s) => WaitNic::Static(s.address),
                None => WaitNic::Lease(nic.mac),
            }),
        }
    }
}

/// Why facts could not be read or validated. Every message is one line
/// that names the input or pod, the field and the value, and ends with what
/// to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FactError {
    /// The text is not JSON at all.
    #[error(
        "{input}: malformed JSON at line {line} column {column}: {reason}; pass the complete, unmodified output of {kind}"
    )]
    Json {
        input: String,
        kind: InputKind,
        line: usize,
        column: usize,
        reason: String,
    },
    /// A field has the wrong JSON type (or a required one is missing).
    #[error(
        "{input}: {path}: expected {expected}, got {found}; pass the unmodified output of {kind}"
    )]
    Shape {
        input: String,
        kind: InputKind,
        /// Field path, for example `network_configs[1].network.prefix`.
        path: String,
        expected: &'static str,
        /// The found value, escaped and cut.
        found: String,
    },
    /// The pod file holds some other object, typically a `List`.
    #[error("{input}: kind is {kind}, not \"Pod\"; pass one pod: `kubectl get pod <name> -o json`")]
    NotAPod { input: String, kind: String },
    /// Validation was asked for a VM that needs no fixup.
    #[error(
        "pod {pod}: not a cloned boot (mode run without fork-from or clone-from-dir), so no fixup applies; classify the pod before validating its facts"
    )]
    NotCloned { pod: String },
    /// A required value is absent or empty.
    #[error("{}{field} is missing or empty; {fix}", pod_prefix(pod))]
    Missing {
        pod: Option<String>,
        field: String,
        fix: &'static str,
    },
    /// A value breaks a rule.
    #[error("{}{field} {value}: {rule}; {fix}", pod_prefix(pod))]
    Invalid {
        pod: Option<String>,
        /// What the value is, for example `network_configs[1].mac`.
        field: String,
        /// The value, escaped and cut so control characters are visible.
        value: String,
        rule: &'static str,
        fix: &'static str,
    },
    /// Two NICs claim one MAC: one networkd `[Match]` would catch both.
    #[error(
        "pod {pod}: network_configs[{first}] and network_configs[{second}] both have MAC {mac}; give every NIC its own MAC in cocoon's network config"
    )]
    DuplicateMac {
        pod: String,
        mac: MacAddr,
        first: usize,
        second: usize,
    },
    #[error(
        "pod {pod}: network_configs: {count} NICs, more than the {max} a fixup handles; check the inspect output (a cocoon VM has a handful of NICs)",
        max = MAX_NICS
    )]
    TooManyNics { pod: String, count: usize },
}

fn pod_prefix(pod: &Option<String>) -> String {
    pod.as_ref()
        .map(|p| format!("pod {p}: "))
        .unwrap_or_default()
}

/// Shows a value escaped (`{:?}`, so control characters and quotes are
/// visible) and cut to [`SHOWN_CHARS`] characters.
pub(crate) fn shown(value: &str) -> String {
    match value.char_indices().nth(SHOWN_CHARS) {
        None => format!("{value:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &value[..cut], value.len()),
    }
}

/// Where a value being validated came from, for error messages.
struct Ctx<'a> {
    pod: Option<&'a str>,
    field: String,
}

impl<'a> Ctx<'a> {
    fn standalone(field: &str) -> Self {
        Ctx {
            pod: None,
            field: field.to_owned(),
        }
    }

    fn in_pod(pod: Option<&'a str>, field: String) -> Self {
        Ctx { pod, field }
    }

    fn missing(&self, fix: &'static str) -> FactError {
        FactError::Missing {
            pod: self.pod.map(str::to_owned),
            field: self.field.clone(),
            fix,
        }
    }

    fn invalid(&self, value: &str, rule: &'static str, fix: &'static str) -> FactError {
        self.invalid_shown(shown(value), rule, fix)
    }

    fn invalid_shown(&self, value: String, rule: &'static str, fix: &'static str) -> FactError {
        FactError::Invalid {
            pod: self.pod.map(str::to_owned),
            field: self.field.clone(),
            value,
            rule,
            fix,
        }
    }
}

const FIX_NAME: &str = "the stack names the VM after the pod's namespace and name, and cocoon keeps the name as config.name in `cocoon vm inspect <id> --json`: pass that output unmodified, or recreate the pod through its controller so that the stack names its VM";

const FIX_HOSTNAME: &str = "a Linux plan writes the VM name as the guest's hostname, which must be dot-separated RFC 1123 labels of at most 63 bytes in all (a Windows plan writes none); the stack names the VM after the pod's namespace and name, so the stack must give this pod a name that makes such a VM name: a shorter namespace or pod name (for a CocoonSet, a shorter CocoonSet name)";

fn parse_name(value: &str, ctx: &Ctx<'_>) -> Result<VmName, FactError> {
    if value.is_empty() {
        return Err(ctx.missing(FIX_NAME));
    }
    if value.len() > MAX_VM_NAME_LEN {
        return Err(ctx.invalid(value, "is longer than 327 bytes", FIX_NAME));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    {
        return Err(ctx.invalid(
            value,
            "may only hold ASCII letters, digits, '-', '.' and '_'",
            FIX_NAME,
        ));
    }
    if !value.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !value.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err(ctx.invalid(value, "must start and end with a letter or digit", FIX_NAME));
    }
    Ok(VmName(value.to_owned()))
}

const FIX_ID: &str =
    "check `id` in `cocoon vm inspect <id> --json` and annotation vm.cocoonstack.io/id";

fn parse_id(value: &str, ctx: &Ctx<'_>) -> Result<VmId, FactError> {
    if value.is_empty() {
        return Err(ctx.missing(FIX_ID));
    }
    if value.len() > MAX_VM_ID_LEN {
        return Err(ctx.invalid(value, "is longer than 128 characters", FIX_ID));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(ctx.invalid(
            value,
            "may only hold A-Z, a-z, 0-9, '.', '_' and '-' (one path component)",
            FIX_ID,
        ));
    }
    if value.starts_with('-') || value.starts_with('.') {
        return Err(ctx.invalid(value, "must not start with '-' or '.'", FIX_ID));
    }
    if value.contains("..") {
        return Err(ctx.invalid(value, "must not contain \"..\"", FIX_ID));
    }
    Ok(VmId(value.to_owned()))
}

const FIX_MAC: &str =
    "give the NIC a unicast MAC like 52:54:00:12:34:56 in cocoon's network config";

fn parse_mac(value: &str, ctx: &Ctx<'_>) -> Result<MacAddr, FactError> {
    if value.is_empty() {
        return Err(ctx.missing(FIX_MAC));
    }
    let Some(octets) = mac_octets(value) else {
        return Err(ctx.invalid(
            value,
            "is not six two-digit hex groups separated by ':'",
            FIX_MAC,
        ));
    };
    if octets[0] & 1 == 1 {
        return Err(ctx.invalid(value, "is a multicast address", FIX_MAC));
    }
    if octets == [0; 6] {
        return Err(ctx.invalid(value, "is all zeros", FIX_MAC));
    }
    Ok(MacAddr(octets))
}

fn mac_octets(value: &str) -> Option<[u8; 6]> {
    let mut groups = value.split(':');
    let mut octets = [0u8; 6];
    for octet in &mut octets {
        let group = groups.next()?;
        if group.len() != 2 || !group.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        *octet = u8::from_str_radix(group, 16).ok()?;
    }
    groups.next().is_none().then_some(octets)
}

const FIX_FLAVOR: &str = "use a flavour name like `ubuntu` (1..=63 of a-z, 0-9, '-', '.', '_'), or remove annotation vm.cocoonstack.io/guest-flavor";

fn parse_flavor(value: &str, ctx: &Ctx<'_>) -> Result<Flavor, FactError> {
    if value.is_empty() {
        return Err(ctx.missing(FIX_FLAVOR));
    }
    if value.len() > MAX_LABEL_LEN {
        return Err(ctx.invalid(value, "is longer than 63 characters", FIX_FLAVOR));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.' | b'_'))
    {
        return Err(ctx.invalid(
            value,
            "may only hold a-z, 0-9, '-', '.' and '_'",
            FIX_FLAVOR,
        ));
    }
    Ok(Flavor(value.to_owned()))
}

/// The prefix length of a static NIC whose record has none (or 0).
pub const DEFAULT_PREFIX: u8 = 24;

const FIX_NET: &str =
    "fix the NIC's network in cocoon's network config, or leave `ip` empty for DHCP";

fn validate_nic(pod: Option<&str>, i: usize, raw: &RawNic) -> Result<Nic, FactError> {
    let field = |name: &str| Ctx::in_pod(pod, format!("network_configs[{i}].{name}"));
    let mac = parse_mac(&raw.mac, &field("mac"))?;
    Ok(Nic {
        mac,
        static_ipv4: validate_static(pod, i, raw)?,
    })
}

/// A NIC's static values, `None` for DHCP (whose prefix and gateway mean
/// nothing and are not checked).
fn validate_static(
    pod: Option<&str>,
    i: usize,
    raw: &RawNic,
) -> Result<Option<StaticIpv4>, FactError> {
    let field = |name: &str| Ctx::in_pod(pod, format!("network_configs[{i}].{name}"));
    if !raw.is_static() {
        return Ok(None);
    }
    let ipv4 = |value: &str, ctx: &Ctx<'_>| {
        value
            .parse::<Ipv4Addr>()
            .map_err(|_| ctx.invalid(value, "is not a dotted-quad IPv4 address", FIX_NET))
    };
    let address = ipv4(&raw.ip, &field("network.ip"))?;
    let prefix_ctx = field("network.prefix");
    // cocoon leaves a 0 prefix out (`omitempty`), so absent and 0 both
    // mean unknown, taken as 24 as the stack's console pass takes it
    // (spec section 2); a present prefix must be a usable length.
    let prefix = match raw.prefix {
        None | Some(0) => DEFAULT_PREFIX,
        Some(p) => u8::try_from(p)
            .ok()
            .filter(|p| (1..=32).contains(p))
            .ok_or_else(|| prefix_ctx.invalid_shown(p.to_string(), "is outside 1..=32", FIX_NET))?,
    };
    let gateway = if raw.gateway.is_empty() {
        None
    } else {
        Some(ipv4(&raw.gateway, &field("network.gateway"))?)
    };
    Ok(Some(StaticIpv4 {
        address,
        prefix,
        gateway,
    }))
}

/// The static values of every NIC, in inspect order (`None` for DHCP),
/// validated: all the serial-console pass of spec section 10 reads besides
/// the VM id. MACs are not looked at.
pub fn static_nics(obs: &Observation) -> Result<Vec<Option<StaticIpv4>>, FactError> {
    let pod = Some(obs.pod.as_str());
    if obs.nics.len() > MAX_NICS {
        return Err(FactError::TooManyNics {
            pod: obs.pod.clone(),
            count: obs.nics.len(),
        });
    }
    obs.nics
        .iter()
        .enumerate()
        .map(|(i, raw)| validate_static(pod, i, raw))
        .collect()
}

/// Parses JSON, keeping serde_json's line and column in the error.
fn parse_json(text: &str, input: &str, kind: InputKind) -> Result<Value, FactError> {
    serde_json::from_str(text).map_err(|e| {
        let full = e.to_string();
        let position = format!(" at line {} column {}", e.line(), e.column());
        let reason = full.strip_suffix(&position).unwrap_or(&full).to_owned();
        FactError::Json {
            input: input.to_owned(),
            kind,
            line: e.line(),
            column: e.column(),
            reason,
        }
    })
}

/// `null` reads like an absent field: Go encoders print either.
fn present(value: Option<&Value>) -> Option<&Value> {
    value.filter(|v| !v.is_null())
}

/// How an unexpected JSON value is shown in a shape error.
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => shown(s),
        Value::Array(_) => "an array".to_owned(),
        Value::Object(_) => "an object".to_owned(),
    }
}

fn got_missing(found: &Option<String>) -> String {
    match found {
        None => "nothing".to_owned(),
        Some(s) => shown(s),
    }
}

/// Reads typed fields out of one input, naming it and the field path in
/// every error.
struct Reader<'a> {
    input: &'a str,
    kind: InputKind,
}

impl Reader<'_> {
    fn shape(&self, path: &str, expected: &'static str, found: String) -> FactError {
        FactError::Shape {
            input: self.input.to_owned(),
            kind: self.kind,
            path: path.to_owned(),
            expected,
            found,
        }
    }

    fn object<'v>(
        &self,
        value: Option<&'v Value>,
        path: &str,
    ) -> Result<&'v Map<String, Value>, FactError> {
        match value {
            Some(Value::Object(map)) => Ok(map),
            Some(other) => Err(self.shape(path, "an object", describe(other))),
            None => Err(self.shape(path, "an object", "nothing".to_owned())),
        }
    }

    fn opt_string(
        &self,
        map: &Map<String, Value>,
        key: &str,
        path: &str,
    ) -> Result<Option<String>, FactError> {
        match present(map.get(key)) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.shape(path, "a string", describe(other))),
        }
    }

    fn opt_integer(
        &self,
        map: &Map<String, Value>,
        key: &str,
        path: &str,
    ) -> Result<Option<i64>, FactError> {
        match present(map.get(key)) {
            None => Ok(None),
            Some(Value::Number(n)) if n.as_i64().is_some() => Ok(n.as_i64()),
            Some(other) => Err(self.shape(path, "an integer", describe(other))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde_json::json;

    fn pod_with(annotations: &[(&str, &str)]) -> PodInput {
        PodInput {
            name: "web-0".to_owned(),
            namespace: "default".to_owned(),
            uid: Some("u-1".to_owned()),
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            deleting: false,
            resource_version: None,
        }
    }

    fn nic(mac: &str, ip: &str, prefix: Option<i64>, gateway: &str) -> RawNic {
        RawNic {
            mac: mac.to_owned(),
            tap: "tap0".to_owned(),
            ip: ip.to_owned(),
            prefix,
            gateway: gateway.to_owned(),
        }
    }

    /// A managed, cloned Linux pod that validates, with the given NICs.
    fn observation(nics: Vec<RawNic>) -> Observation {
        let pod = pod_with(&[
            (annotations::MANAGED, "true"),
            (annotations::VM_NAME, "web-0"),
            (annotations::GUEST_FLAVOR, "ubuntu"),
        ]);
        let vm = VmInspect {
            id: "vm-1234".to_owned(),
            nics,
            ..VmInspect::default()
        };
        Observation::new(&pod, &vm, &Overrides::default())
    }

    #[test]
    fn reads_pod_json() {
        let text = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web-0",
                "namespace": "apps",
                "uid": "8f0c",
                "annotations": { "vm.cocoonstack.io/name": "web-0" }
            },
            "spec": {}
        })
        .to_string();
        let pod = PodInput::from_json(&text, "pod.json").unwrap();
        assert_eq!(pod.display_name(), "apps/web-0");
        assert_eq!(pod.uid.as_deref(), Some("8f0c"));
        assert_eq!(pod.annotation(annotations::VM_NAME), "web-0");
        assert_eq!(pod.annotation(annotations::OS), "");
    }

    #[test]
    fn reads_inspect_json() {
        let text = json!({
            "id": "vm-1",
            "network_configs": [
                { "mac": "52:54:00:00:00:01", "tap": "tap0",
                  "network": { "ip": "10.0.0.5", "prefix": 24, "gateway": "10.0.0.1" } },
                { "mac": "52:54:00:00:00:02", "tap": "tap1",
                  "network": { "ip": "", "gateway": "" } },
                { "mac": "52:54:00:00:00:03", "tap": "tap2", "network": null },
                { "mac": "52:54:00:00:00:04", "tap": "tap3" }
            ]
        })
        .to_string();
        let vm = VmInspect::from_json(&text, "vm.json").unwrap();
        assert_eq!(vm.id, "vm-1");
        assert_eq!(
            vm.nics[0],
            nic("52:54:00:00:00:01", "10.0.0.5", Some(24), "10.0.0.1")
        );
        assert!(
            vm.nics[1..]
                .iter()
                .all(|n| !n.is_static() && n.prefix.is_none())
        );
        assert_eq!(vm.nics[3].tap, "tap3");
    }

    #[test]
    fn inspect_without_nics_reads_empty() {
        let vm =
            VmInspect::from_json(r#"{"id":"vm-1","network_configs":null}"#, "vm.json").unwrap();
        assert!(vm.nics.is_empty());
        let vm = VmInspect::from_json(r#"{"id":"vm-1"}"#, "vm.json").unwrap();
        assert!(vm.nics.is_empty());
    }

    #[rstest]
    #[case::prefix_as_string(
        r#"{"id":"a","network_configs":[{"mac":"52:54:00:00:00:01"},{"mac":"52:54:00:00:00:02","network":{"ip":"10.0.0.2","prefix":"24"}}]}"#,
        "vm.json: network_configs[1].network.prefix: expected an integer, got \"24\"; pass the unmodified output of `cocoon vm inspect <id> --json`"
    )]
    #[case::prefix_as_float(
        r#"{"network_configs":[{"network":{"prefix":24.5}}]}"#,
        "vm.json: network_configs[0].network.prefix: expected an integer, got 24.5; pass the unmodified output of `cocoon vm inspect <id> --json`"
    )]
    #[case::mac_as_number(
        r#"{"network_configs":[{"mac":5}]}"#,
        "vm.json: network_configs[0].mac: expected a string, got 5; pass the unmodified output of `cocoon vm inspect <id> --json`"
    )]
    #[case::nics_as_object(
        r#"{"network_configs":{}}"#,
        "vm.json: network_configs: expected an array, got an object; pass the unmodified output of `cocoon vm inspect <id> --json`"
    )]
    #[case::top_level_array(
        r#"[]"#,
        "vm.json: top level: expected an object, got an array; pass the unmodified output of `cocoon vm inspect <id> --json`"
    )]
    #[case::malformed(
        "{\n  \"id\": \"a\",\n  \"network_configs\": [\n}",
        "vm.json: malformed JSON at line 4 column 1: expected value; pass the complete, unmodified output of `cocoon vm inspect <id> --json`"
    )]
    #[case::empty(
        "",
        "vm.json: malformed JSON at line 1 column 0: EOF while parsing a value; pass the complete, unmodified output of `cocoon vm inspect <id> --json`"
    )]
    fn inspect_errors_name_field_and_position(#[case] text: &str, #[case] expected: &str) {
        let err = VmInspect::from_json(text, "vm.json").unwrap_err();
        assert_eq!(err.to_string(), expected);
    }

    #[test]
    fn malformed_json_keeps_line_and_column() {
        let err = PodInput::from_json("{\n\n   x", "pod.json").unwrap_err();
        assert!(
            matches!(
                err,
                FactError::Json {
                    line: 3,
                    column: 4,
                    kind: InputKind::Pod,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[rstest]
    #[case::list(
        r#"{"kind":"List","items":[]}"#,
        "pod.json: kind is \"List\", not \"Pod\"; pass one pod: `kubectl get pod <name> -o json`"
    )]
    #[case::no_metadata(
        r#"{"kind":"Pod"}"#,
        "pod.json: metadata: expected an object, got nothing; pass the unmodified output of `kubectl get pod <name> -o json`"
    )]
    #[case::no_name(
        r#"{"metadata":{"name":""}}"#,
        "pod.json: metadata.name: expected a non-empty string, got \"\"; pass the unmodified output of `kubectl get pod <name> -o json`"
    )]
    #[case::annotation_not_string(
        r#"{"metadata":{"name":"p","annotations":{"cocoonset.cocoonstack.io/managed":true}}}"#,
        "pod.json: metadata.annotations[\"cocoonset.cocoonstack.io/managed\"]: expected a string, got true; pass the unmodified output of `kubectl get pod <name> -o json`"
    )]
    fn pod_errors_name_field(#[case] text: &str, #[case] expected: &str) {
        let err = PodInput::from_json(text, "pod.json").unwrap_err();
        assert_eq!(err.to_string(), expected);
    }

    #[rstest]
    #[case::empty_mode(&[], Some(BootKind::Clone))]
    #[case::clone(&[(annotations::MODE, "clone")], Some(BootKind::Clone))]
    #[case::unknown_mode(&[(annotations::MODE, "other")], Some(BootKind::Clone))]
    #[case::run(&[(annotations::MODE, "run")], None)]
    #[case::run_upper(&[(annotations::MODE, "RUN")], None)]
    #[case::run_mixed(&[(annotations::MODE, "Run")], None)]
    #[case::run_padded(&[(annotations::MODE, " run")], Some(BootKind::Clone))]
    #[case::run_fork(&[(annotations::MODE, "Run"), (annotations::FORK_FROM, "vm-a")], Some(BootKind::Fork))]
    #[case::run_dir(&[(annotations::MODE, "RUN"), (annotations::CLONE_FROM_DIR, "/snap")], Some(BootKind::Clone))]
    #[case::run_blank_dir(&[(annotations::MODE, "run"), (annotations::CLONE_FROM_DIR, " \t\u{a0}")], None)]
    #[case::run_padded_dir(&[(annotations::MODE, "run"), (annotations::CLONE_FROM_DIR, " /snap ")], Some(BootKind::Clone))]
    #[case::run_blank_fork(&[(annotations::MODE, "run"), (annotations::FORK_FROM, " ")], Some(BootKind::Fork))]
    #[case::dir_over_fork(&[(annotations::FORK_FROM, "vm-a"), (annotations::CLONE_FROM_DIR, "/snap")], Some(BootKind::Clone))]
    #[case::wake_over_dir(&[(annotations::CLONE_FROM_DIR, "/snap"), (annotations::RESTORE_FROM_HIBERNATE, "true")], Some(BootKind::Wake))]
    #[case::wake_over_fork(&[(annotations::FORK_FROM, "vm-a"), (annotations::RESTORE_FROM_HIBERNATE, "true")], Some(BootKind::Wake))]
    #[case::wake(&[(annotations::RESTORE_FROM_HIBERNATE, "true")], Some(BootKind::Wake))]
    #[case::wake_not_exact(&[(annotations::RESTORE_FROM_HIBERNATE, "True")], Some(BootKind::Clone))]
    #[case::run_wake(&[(annotations::MODE, "run"), (annotations::RESTORE_FROM_HIBERNATE, "true")], Some(BootKind::Wake))]
    #[case::run_wake_not_exact(&[(annotations::MODE, "run"), (annotations::RESTORE_FROM_HIBERNATE, "yes")], None)]
    fn boot_kind_from_annotations(
        #[case] annotations: &[(&str, &str)],
        #[case] expected: Option<BootKind>,
    ) {
        let pod = pod_with(annotations);
        assert_eq!(BootKind::from_annotations(&pod.annotations), expected);
    }

    #[rstest]
    #[case::keeps_derived(None, &[(annotations::MODE, "run")], None)]
    #[case::override_makes_cloned(Some(BootKind::Resumed), &[(annotations::MODE, "run")], Some(BootKind::Resumed))]
    #[case::override_replaces(Some(BootKind::Wake), &[], Some(BootKind::Wake))]
    fn boot_override(
        #[case] boot: Option<BootKind>,
        #[case] annotations: &[(&str, &str)],
        #[case] expected: Option<BootKind>,
    ) {
        let overrides = Overrides {
            boot,
            source_image: Some(String::new()),
        };
        let obs = Observation::new(&pod_with(annotations), &VmInspect::default(), &overrides);
        assert_eq!(obs.boot, expected);
        assert_eq!(obs.source_image, None, "an empty source image is unknown");
    }

    #[rstest]
    #[case::exact("macos", true)]
    #[case::mixed("MacOS", true)]
    #[case::padded(" MACOS \n", true)]
    #[case::long_s("maco\u{17f}", true)]
    #[case::long_s_upper("MACO\u{17f}", true)]
    #[case::empty("", false)]
    #[case::prefix("macosx", false)]
    #[case::inner_space("mac os", false)]
    #[case::kelvin_not_k("macos\u{212a}", false)]
    #[case::dotless("mac\u{f6}s", false)]
    fn macos_is_matched_trimmed_and_folded(#[case] value: &str, #[case] macos: bool) {
        assert_eq!(is_macos(value), macos, "{value:?}");
    }

    #[rstest]
    #[case::inspect_only("vm-1", "", Ok("vm-1"))]
    #[case::annotation_only("", "vm-2", Ok("vm-2"))]
    #[case::both_same("vm-1", "vm-1", Ok("vm-1"))]
    #[case::neither("", "", Ok(""))]
    #[case::differ_the_record_wins("vm-1", "vm-2", Ok("vm-1"))]
    fn vm_id_source(
        #[case] inspect: &str,
        #[case] annotated: &str,
        #[case] expected: Result<&str, &str>,
    ) {
        let pod = pod_with(&[(annotations::VM_ID, annotated)]);
        let vm = VmInspect {
            id: inspect.to_owned(),
            ..VmInspect::default()
        };
        let got: Result<String, String> =
            Ok(Observation::new(&pod, &vm, &Overrides::default()).vm_id);
        assert_eq!(got, expected.map(str::to_owned).map_err(str::to_owned));
    }

    #[test]
    fn observation_interprets_annotations_exactly() {
        let pod = pod_with(&[
            (annotations::MANAGED, "True"),
            (annotations::BACKEND, "Firecracker"),
            (annotations::OS, "Windows"),
            (annotations::GUEST_FLAVOR, ""),
        ]);
        let obs = Observation::new(&pod, &VmInspect::default(), &Overrides::default());
        assert!(!obs.managed);
        assert_eq!(obs.backend, Backend::CloudHypervisor);
        assert_eq!(obs.os, GuestOs::Unknown);
        assert_eq!(obs.flavor, None);
        assert_eq!(obs.pod, "default/web-0");
    }

    #[test]
    fn validates_static_and_dhcp_nics() {
        let obs = observation(vec![
            nic("52:54:00:AB:cd:01", "10.0.0.5", Some(24), "10.0.0.1"),
            nic("52:54:00:ab:cd:02", "192.168.1.9", Some(32), ""),
            nic("52:54:00:ab:cd:03", "", Some(99), "junk"),
        ]);
        let facts = VmFacts::validate(&obs, ImageKind::Oci).unwrap();
        assert_eq!(facts.name.as_str(), "web-0");
        assert_eq!(facts.id.as_str(), "vm-1234");
        assert_eq!(facts.boot, BootKind::Clone);
        assert_eq!(facts.image, ImageKind::Oci);
        assert_eq!(facts.flavor.as_ref().map(Flavor::as_str), Some("ubuntu"));
        assert_eq!(facts.nics[0].mac.to_string(), "52:54:00:ab:cd:01");
        assert_eq!(
            facts.nics[0].static_ipv4,
            Some(StaticIpv4 {
                address: Ipv4Addr::new(10, 0, 0, 5),
                prefix: 24,
                gateway: Some(Ipv4Addr::new(10, 0, 0, 1)),
            })
        );
        assert_eq!(facts.nics[1].static_ipv4.unwrap().gateway, None);
        assert_eq!(
            facts.nics[2].static_ipv4, None,
            "DHCP ignores prefix and gateway"
        );
    }

    const P: &str = "pod default/web-0: ";

    #[rstest]
    #[case::bad_mac(
        vec![nic("52:54:00:ab:cd", "", None, "")],
        "network_configs[0].mac \"52:54:00:ab:cd\": is not six two-digit hex groups separated by ':'; give the NIC a unicast MAC like 52:54:00:12:34:56 in cocoon's network config"
    )]
    #[case::empty_mac(
        vec![nic("", "", None, "")],
        "network_configs[0].mac is missing or empty; give the NIC a unicast MAC like 52:54:00:12:34:56 in cocoon's network config"
    )]
    #[case::multicast(
        vec![nic("01:00:5e:00:00:01", "", None, "")],
        "network_configs[0].mac \"01:00:5e:00:00:01\": is a multicast address; give the NIC a unicast MAC like 52:54:00:12:34:56 in cocoon's network config"
    )]
    #[case::bad_ip(
        vec![nic("52:54:00:00:00:01", "10.0.0.256", Some(24), "")],
        "network_configs[0].network.ip \"10.0.0.256\": is not a dotted-quad IPv4 address; fix the NIC's network in cocoon's network config, or leave `ip` empty for DHCP"
    )]
    #[case::prefix_too_big(
        vec![nic("52:54:00:00:00:01", "10.0.0.2", Some(33), "")],
        "network_configs[0].network.prefix 33: is outside 1..=32; fix the NIC's network in cocoon's network config, or leave `ip` empty for DHCP"
    )]
    #[case::prefix_negative(
        vec![nic("52:54:00:00:00:01", "10.0.0.2", Some(-1), "")],
        "network_configs[0].network.prefix -1: is outside 1..=32; fix the NIC's network in cocoon's network config, or leave `ip` empty for DHCP"
    )]
    #[case::bad_gateway(
        vec![nic("52:54:00:00:00:01", "10.0.0.2", Some(24), "10.0.0.1'; reboot")],
        "network_configs[0].network.gateway \"10.0.0.1'; reboot\": is not a dotted-quad IPv4 address; fix the NIC's network in cocoon's network config, or leave `ip` empty for DHCP"
    )]
    fn nic_errors(#[case] nics: Vec<RawNic>, #[case] expected: &str) {
        let err = VmFacts::validate(&observation(nics), ImageKind::Oci).unwrap_err();
        assert_eq!(err.to_string(), format!("{P}{expected}"));
    }

    #[rstest]
    #[case::missing(None, 24)]
    #[case::zero(Some(0), 24)]
    #[case::one(Some(1), 1)]
    #[case::thirty_two(Some(32), 32)]
    fn a_missing_or_zero_prefix_is_24(#[case] prefix: Option<i64>, #[case] expected: u8) {
        let facts = VmFacts::validate(
            &observation(vec![nic("52:54:00:00:00:01", "10.0.0.2", prefix, "")]),
            ImageKind::Oci,
        )
        .unwrap();
        let found = facts.nics[0].static_ipv4.as_ref().map(|s| s.prefix);
        assert_eq!(found, Some(expected));
    }

    #[test]
    fn duplicate_macs_name_both_nics() {
        let obs = observation(vec![
            nic("52:54:00:00:00:01", "", None, ""),
            nic("52:54:00:00:00:02", "", None, ""),
            nic("52:54:00:00:00:0A", "", None, ""),
            nic("52:54:00:00:00:0a", "", None, ""),
        ]);
        let err = VmFacts::validate(&obs, ImageKind::Oci).unwrap_err();
        assert_eq!(
            err.to_string(),
            "pod default/web-0: network_configs[2] and network_configs[3] both have MAC 52:54:00:00:00:0a; give every NIC its own MAC in cocoon's network config"
        );
    }

    #[test]
    fn too_many_nics() {
        let nics = (0..=MAX_NICS)
            .map(|i| nic(&format!("52:54:00:00:01:{:02x}", i), "", None, ""))
            .collect();
        let err = VmFacts::validate(&observation(nics), ImageKind::Oci).unwrap_err();
        assert!(
            matches!(err, FactError::TooManyNics { count, .. } if count == MAX_NICS + 1),
            "{err}"
        );
        let nics = (0..MAX_NICS)
            .map(|i| nic(&format!("52:54:00:00:01:{:02x}", i), "", None, ""))
            .collect();
        assert!(VmFacts::validate(&observation(nics), ImageKind::Oci).is_ok());
    }

    #[test]
    fn not_cloned_is_an_error() {
        let mut obs = observation(vec![]);
        obs.boot = None;
        let err = VmFacts::validate(&obs, ImageKind::Unknown).unwrap_err();
        assert_eq!(
            err,
            FactError::NotCloned {
                pod: "default/web-0".to_owned()
            }
        );
    }

    #[rstest]
    #[case::empty(
        "",
        "pod default/web-0: annotation vm.cocoonstack.io/name is missing or empty; the stack names the VM after the pod's namespace and name, and cocoon keeps the name as config.name in `cocoon vm inspect <id> --json`: pass that output unmodified, or recreate the pod through its controller so that the stack names its VM"
    )]
    #[case::shell(
        "web;reboot",
        "pod default/web-0: annotation vm.cocoonstack.io/name \"web;reboot\": may only hold ASCII letters, digits, '-', '.' and '_'; the stack names the VM after the pod's namespace and name, and cocoon keeps the name as config.name in `cocoon vm inspect <id> --json`: pass that output unmodified, or recreate the pod through its controller so that the stack names its VM"
    )]
    #[case::newline(
        "web\n0",
        "pod default/web-0: annotation vm.cocoonstack.io/name \"web\\n0\": may only hold ASCII letters, digits, '-', '.' and '_'; the stack names the VM after the pod's namespace and name, and cocoon keeps the name as config.name in `cocoon vm inspect <id> --json`: pass that output unmodified, or recreate the pod through its controller so that the stack names its VM"
    )]
    fn name_errors_in_pod(#[case] name: &str, #[case] expected: &str) {
        let mut obs = observation(vec![]);
        obs.vm_name = name.to_owned();
        let err = VmFacts::validate(&obs, ImageKind::Unknown).unwrap_err();
        assert_eq!(err.to_string(), expected);
    }

    #[test]
    fn id_error_in_pod_names_both_sources() {
        let mut obs = observation(vec![]);
        obs.vm_id = "../etc".to_owned();
        let err = VmFacts::validate(&obs, ImageKind::Unknown).unwrap_err();
        assert_eq!(
            err.to_string(),
            "pod default/web-0: VM id (inspect `id`, else annotation vm.cocoonstack.io/id) \"../etc\": may only hold A-Z, a-z, 0-9, '.', '_' and '-' (one path component); check `id` in `cocoon vm inspect <id> --json` and annotation vm.cocoonstack.io/id"
        );
    }

    #[test]
    fn flavor_error_in_pod() {
        let mut obs = observation(vec![]);
        obs.flavor = Some("Ubuntu".to_owned());
        let err = VmFacts::validate(&obs, ImageKind::Unknown).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("pod default/web-0: annotation vm.cocoonstack.io/guest-flavor \"Ubuntu\": may only hold"),
            "{err}"
        );
    }

    /// Which names are VM names, and which of them hostnames (spec
    /// section 4, step 2).
    #[rstest]
    #[case::simple("web-0", true, true)]
    #[case::single("a", true, true)]
    #[case::digits("0123", true, true)]
    #[case::max_hostname(&"a".repeat(63), true, true)]
    #[case::longer_than_a_hostname(&"a".repeat(64), true, false)]
    #[case::long_hashed(&format!("vk-prod-{}-496021", "a".repeat(60)), true, false)]
    #[case::max_len(&"a".repeat(MAX_VM_NAME_LEN), true, false)]
    #[case::too_long(&"a".repeat(MAX_VM_NAME_LEN + 1), false, false)]
    #[case::empty("", false, false)]
    #[case::upper("Web", true, false)]
    #[case::leading_dash("-web", false, false)]
    #[case::trailing_dash("web-", false, false)]
    #[case::legacy_dotted("vk-default-web.v1-0", true, true)]
    #[case::label_ends_with_dash("vk-default-web-.v1", true, false)]
    #[case::label_starts_with_dash("web.-v1", true, false)]
    #[case::empty_label("web..v1", true, false)]
    #[case::trailing_dot("web.", false, false)]
    #[case::underscore("web_0", true, false)]
    #[case::space("web 0", false, false)]
    #[case::quote("web'0", false, false)]
    #[case::non_ascii("wéb", false, false)]
    fn vm_names(#[case] value: &str, #[case] name: bool, #[case] hostname: bool) {
        let parsed = VmName::parse(value);
        assert_eq!(parsed.is_ok(), name, "{value:?}");
        assert_eq!(
            parsed.is_ok_and(|n| n.hostname().is_ok()),
            hostname,
            "{value:?}"
        );
    }

    /// A name that is no hostname says what the stack must change, never
    /// to set the name annotation (which only fails the binding).
    #[test]
    fn a_name_that_is_no_hostname_says_what_the_stack_must_change() {
        let long = format!("vk-prod-{}-496021", "a".repeat(60));
        let e = VmName::parse(&long)
            .unwrap()
            .hostname()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("is longer than the 63 bytes a hostname may have"),
            "{e}"
        );
        assert!(e.contains("the stack must give this pod a name"), "{e}");
        assert!(!e.contains("set annotation"), "{e}");
    }

    /// A bad name is named by where it came from: the VM record's name, or
    /// the annotation when the record has none.
    #[test]
    fn a_bad_name_error_names_its_source() {
        let long = format!("vk-prod-{}-496021", "a".repeat(MAX_VM_NAME_LEN));
        let pod = pod_with(&[
            (annotations::MANAGED, "true"),
            (annotations::VM_NAME, long.as_str()),
        ]);
        for (record_name, field) in [
            (long.as_str(), "the VM record's config.name"),
            ("", "annotation vm.cocoonstack.io/name"),
        ] {
            let vm = VmInspect {
                id: "vm-1".into(),
                name: record_name.to_owned(),
                ..VmInspect::default()
            };
            let obs = Observation::new(&pod, &vm, &Overrides::default());
            let e = VmFacts::validate(&obs, ImageKind::Oci)
                .unwrap_err()
                .to_string();
            assert!(e.contains(field), "{e}");
        }
    }

    #[rstest]
    #[case::simple("vm-1234", true)]
    #[case::mixed("Ab.C_d-9", true)]
    #[case::single_dot_inside("a.b", true)]
    #[case::max_len(&"a".repeat(128), true)]
    #[case::too_long(&"a".repeat(129), false)]
    #[case::empty("", false)]
    #[case::dotdot("..", false)]
    #[case::dot(".", false)]
    #[case::hidden(".a", false)]
    #[case::parent("../x", false)]
    #[case::inner_dotdot("a..b", false)]
    #[case::slash("a/b", false)]
    #[case::absolute("/abs", false)]
    #[case::option("-rf", false)]
    #[case::space("a b", false)]
    #[case::nul("a\0b", false)]
    fn vm_ids(#[case] value: &str, #[case] ok: bool) {
        assert_eq!(VmId::parse(value).is_ok(), ok, "{value:?}");
    }

    #[rstest]
    #[case::lower("52:54:00:12:34:56", Some([0x52, 0x54, 0, 0x12, 0x34, 0x56]))]
    #[case::upper("AA:BB:CC:DD:EE:FF", Some([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff]))]
    #[case::multicast("01:00:5e:00:00:01", None)]
    #[case::broadcast("ff:ff:ff:ff:ff:ff", None)]
    #[case::zero("00:00:00:00:00:00", None)]
    #[case::short("52:54:00:12:34", None)]
    #[case::long("52:54:00:12:34:56:78", None)]
    #[case::one_digit("52:54:0:12:34:56", None)]
    #[case::dashes("52-54-00-12-34-56", None)]
    #[case::plus("52:54:00:12:34:+5", None)]
    #[case::trailing_colon("52:54:00:12:34:56:", None)]
    #[case::non_hex("52:54:00:12:34:zz", None)]
    fn macs(#[case] value: &str, #[case] expected: Option<[u8; 6]>) {
        assert_eq!(
            MacAddr::parse(value).ok().map(|m| m.0),
            expected,
            "{value:?}"
        );
    }

    #[rstest]
    #[case::simple("ubuntu", true)]
    #[case::dotted("rhel-9.4_min", true)]
    #[case::max_len(&"a".repeat(63), true)]
    #[case::too_long(&"a".repeat(64), false)]
    #[case::empty("", false)]
    #[case::upper("Ubuntu", false)]
    #[case::slash("a/b", false)]
    fn flavors(#[case] value: &str, #[case] ok: bool) {
        assert_eq!(Flavor::parse(value).is_ok(), ok, "{value:?}");
    }

    #[test]
    fn standalone_errors_have_no_pod() {
        assert_eq!(
            Flavor::parse("").unwrap_err().to_string(),
            "guest flavour is missing or empty; use a flavour name like `ubuntu` (1..=63 of a-z, 0-9, '-', '.', '_'), or remove annotation vm.cocoonstack.io/guest-flavor"
        );
        assert_eq!(
            VmId::parse("-rf").unwrap_err().to_string(),
            "VM id \"-rf\": must not start with '-' or '.'; check `id` in `cocoon vm inspect <id> --json` and annotation vm.cocoonstack.io/id"
        );
    }

    #[test]
    fn long_values_are_cut_and_escaped() {
        let value = format!("{}\u{1b}[2J", "x".repeat(100));
        let err = VmName::parse(&value).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("VM name \"{}\"... (104 bytes): ", "x".repeat(80))),
            "{err}"
        );
        assert!(!err.contains('\u{1b}'));
        assert_eq!(shown("a\u{1b}"), "\"a\\u{1b}\"");
    }

    /// What a plan writes to /etc/hostname that is not the VM name must be
    /// a hostname too, whoever planned it.
    #[rstest::rstest]
    #[case::a_label("web-0", true)]
    #[case::dotted("web-0.local", true)]
    #[case::upper_case("Web-0", false)]
    #[case::carriage_return("web-0\r", false)]
    #[case::underscore("web_0", false)]
    #[case::too_long(&"a".repeat(64), false)]
    #[case::empty("", false)]
    fn a_written_hostname_is_checked(#[case] written: &str, #[case] ok: bool) {
        let result = check_written_hostname(written);
        assert_eq!(result.is_ok(), ok, "{written:?}: {result:?}");
        if let Err(e) = result {
            assert!(e.to_string().contains("/etc/hostname"), "{e}");
        }
    }
}
