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
mod error;
mod input;
mod observation;
mod validate;

pub use error::FactError;
pub use input::{InputKind, PodInput, RawNic, VmInspect};
pub use observation::{NameSource, Observation, Overrides};
pub(crate) use validate::shown;
use validate::{Ctx, parse_id, pod_prefix};
pub use validate::{
    DEFAULT_PREFIX, Flavor, MacAddr, Nic, StaticIpv4, VmFacts, VmId, VmName, WaitFacts, WaitNic,
    check_written_hostname, static_nics,
};

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
