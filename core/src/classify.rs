//! Classification: which clones need a guest fixup, and which scenario.
//!
//! A pure function of the [`Observation`] (spec section 3): the first
//! matching rule wins. Cloudimg vs OCI never decides *whether* a fixup runs,
//! only which Linux network flavour is used; that needs the image kind,
//! which the caller probes only when [`Classification::needs_image_kind`] says so.

use std::fmt;

use crate::facts::{Backend, BootKind, GuestOs, ImageKind, Observation};

/// The scenarios the host asks plugins to plan (the WIT `scenario` enum).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scenario {
    Cloudimg,
    OciNetworkd,
    FcMac,
    WindowsPnp,
    DhcpRecovery,
    /// A running parent made safe to clone before its snapshot (contract
    /// 0.4.0). Planned by the plugin chosen for the guest's network
    /// scenario, never selected by itself ([`Scenario::is_companion`]).
    Prepare,
}

impl Scenario {
    pub const ALL: [Scenario; 6] = [
        Scenario::Cloudimg,
        Scenario::OciNetworkd,
        Scenario::FcMac,
        Scenario::WindowsPnp,
        Scenario::DhcpRecovery,
        Scenario::Prepare,
    ];

    /// The name used in JSON output, plugin cases and the WIT contract.
    pub fn as_str(self) -> &'static str {
        match self {
            Scenario::Cloudimg => "cloudimg",
            Scenario::OciNetworkd => "oci-networkd",
            Scenario::FcMac => "fc-mac",
            Scenario::WindowsPnp => "windows-pnp",
            Scenario::DhcpRecovery => "dhcp-recovery",
            Scenario::Prepare => "prepare",
        }
    }

    /// A scenario no plugin is selected for by itself: the plugin chosen
    /// for the guest's network scenario plans it, when it declares it
    /// (`prepare`). Declaring it claims nothing, so any number of plugins
    /// may.
    pub fn is_companion(self) -> bool {
        self == Scenario::Prepare
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The rows of the classification table (spec section 3), in the order they
/// are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    NotManaged,
    NotCloned,
    WindowsHibernateWake,
    Windows,
    Firecracker,
    StaticNic,
    AllDhcp,
}

impl Rule {
    pub const ALL: [Rule; 7] = [
        Rule::NotManaged,
        Rule::NotCloned,
        Rule::WindowsHibernateWake,
        Rule::Windows,
        Rule::Firecracker,
        Rule::StaticNic,
        Rule::AllDhcp,
    ];

    /// The row number in spec section 3, 1..=7, so reports and logs can be
    /// checked against the table.
    pub fn number(self) -> u8 {
        match self {
            Rule::NotManaged => 1,
            Rule::NotCloned => 2,
            Rule::WindowsHibernateWake => 3,
            Rule::Windows => 4,
            Rule::Firecracker => 5,
            Rule::StaticNic => 6,
            Rule::AllDhcp => 7,
        }
    }

    /// The fixup this row asks for, if any.
    pub fn fixup(self) -> Option<Fixup> {
        match self {
            Rule::NotManaged | Rule::NotCloned | Rule::WindowsHibernateWake | Rule::AllDhcp => None,
            Rule::Windows => Some(Fixup::WindowsPnp),
            Rule::Firecracker => Some(Fixup::FcMac),
            Rule::StaticNic => Some(Fixup::LinuxNetwork),
        }
    }

    /// Why this row matched, for a person reading the report.
    pub fn reason(self) -> &'static str {
        match self {
            Rule::NotManaged => {
                "pod is not managed (cocoonset.cocoonstack.io/managed is not \"true\"): never touched"
            }
            Rule::NotCloned => "not a cloned boot (mode run without fork-from or clone-from-dir)",
            Rule::WindowsHibernateWake => {
                "Cloud Hypervisor Windows hibernate wake: the restored VM gets a fresh NIC, IP wait only"
            }
            Rule::Windows => "Windows guest: its NICs must be re-enumerated",
            Rule::Firecracker => "Firecracker: the guest keeps the snapshot's MAC and IP",
            Rule::StaticNic => "a NIC has a static IP the guest still holds from the snapshot",
            Rule::AllDhcp => "every NIC is on DHCP (or there are none): IP wait only",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

/// The kinds of guest fixup classification can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fixup {
    /// Re-enumerate network devices with Plug and Play.
    WindowsPnp,
    /// Re-apply each NIC's MAC, then the Linux network flavour.
    FcMac,
    /// The Linux network flavour (cloudimg or oci-networkd) alone.
    LinuxNetwork,
}

/// The outcome of [`classify`]: the matching row and the fixup it asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Classification {
    pub rule: Rule,
    pub fixup: Option<Fixup>,
}

impl Classification {
    /// The decision for a row; the row alone decides the fixup.
    pub fn from_rule(rule: Rule) -> Self {
        Classification {
            rule,
            fixup: rule.fixup(),
        }
    }

    pub fn needs_fixup(self) -> bool {
        self.fixup.is_some()
    }

    /// Whether the IP wait gets the DHCP safety net, the recovery pass of
    /// spec section 6: a Linux clone that needed no fixup because every
    /// NIC is on DHCP.
    pub fn dhcp_recovery(self, os: GuestOs) -> bool {
        self.rule == Rule::AllDhcp && os == GuestOs::Linux
    }

    /// Whether the image kind must be known (and so perhaps probed on disk):
    /// only fixups that run the Linux network flavour need it.
    pub fn needs_image_kind(self) -> bool {
        matches!(self.fixup, Some(Fixup::FcMac | Fixup::LinuxNetwork))
    }

    /// The scenario reported for this decision (events, metrics, JSON
    /// output): `fc-mac` for Firecracker even though the network flavour
    /// follows it, `windows-pnp`, or the network flavour for `image`.
    /// `None` when no fixup runs.
    pub fn scenario(self, image: ImageKind) -> Option<Scenario> {
        self.fixup.map(|fixup| match fixup {
            Fixup::WindowsPnp => Scenario::WindowsPnp,
            Fixup::FcMac => Scenario::FcMac,
            Fixup::LinuxNetwork => network_scenario(image),
        })
    }

    /// Every scenario whose plan runs, in order: `fc-mac` is followed by the
    /// network flavour (spec section 3, row 5). Empty when no fixup runs.
    pub fn scenarios(self, image: ImageKind) -> Vec<Scenario> {
        match self.fixup {
            None => Vec::new(),
            Some(Fixup::WindowsPnp) => vec![Scenario::WindowsPnp],
            Some(Fixup::FcMac) => vec![Scenario::FcMac, network_scenario(image)],
            Some(Fixup::LinuxNetwork) => vec![network_scenario(image)],
        }
    }
}

/// Classifies an observation: the first matching row of spec section 3.
///
/// Image kind plays no part: it never decides *whether* a fixup runs.
pub fn classify(obs: &Observation) -> Classification {
    let rule = if !obs.managed {
        Rule::NotManaged
    } else if obs.boot.is_none() {
        Rule::NotCloned
    } else if obs.backend == Backend::CloudHypervisor
        && obs.backend_exact
        && obs.os == GuestOs::Windows
        && obs.boot == Some(BootKind::Wake)
    {
        Rule::WindowsHibernateWake
    } else if obs.os == GuestOs::Windows {
        Rule::Windows
    } else if obs.backend == Backend::Firecracker {
        Rule::Firecracker
    } else if obs.has_static_nic() {
        Rule::StaticNic
    } else {
        Rule::AllDhcp
    };
    Classification::from_rule(rule)
}

/// The Linux network flavour for an image kind. An unknown image gets
/// oci-networkd: it needs nothing from the image but systemd-networkd,
/// while cloudimg needs cloud-init and its seed.
pub fn network_scenario(image: ImageKind) -> Scenario {
    match image {
        ImageKind::Cloudimg => Scenario::Cloudimg,
        ImageKind::Oci | ImageKind::Unknown => Scenario::OciNetworkd,
    }
}

/// Whether the snapshot's source image alone marks a cloudimg guest: it
/// starts with exactly `http://` or `https://` (case-sensitive, spec
/// section 2). When it does, the disk probe can be skipped.
pub fn source_is_cloudimg(source_image: Option<&str>) -> bool {
    source_image.is_some_and(|s| s.starts_with("http://") || s.starts_with("https://"))
}

/// The image kind: cloudimg when the source image is a URL or the qcow2
/// overlay exists (either is enough), else OCI.
pub fn image_kind(source_image: Option<&str>, overlay_exists: bool) -> ImageKind {
    if source_is_cloudimg(source_image) || overlay_exists {
        ImageKind::Cloudimg
    } else {
        ImageKind::Oci
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::annotations::{
        BACKEND, CLONE_FROM_DIR, FORK_FROM, MANAGED, MODE, OS, RESTORE_FROM_HIBERNATE,
    };
    use crate::facts::{Overrides, PodInput, RawNic, VmFacts, VmInspect};
    use rstest::rstest;
    use std::path::{Path, PathBuf};

    const M: (&str, &str) = (MANAGED, "true");
    const FC: (&str, &str) = (BACKEND, "firecracker");
    const CH: (&str, &str) = (BACKEND, "cloud-hypervisor");
    const WIN: (&str, &str) = (OS, "windows");
    const LINUX: (&str, &str) = (OS, "linux");
    const WAKE: (&str, &str) = (RESTORE_FROM_HIBERNATE, "true");

    /// `nics` is one letter per NIC: `s` static, `d` DHCP.
    fn observation(annotations: &[(&str, &str)], nics: &str) -> Observation {
        let pod = PodInput {
            name: "web-0".to_owned(),
            namespace: "default".to_owned(),
            uid: None,
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            deleting: false,
            resource_version: None,
        };
        let vm = VmInspect {
            id: "vm-1".to_owned(),
            name: "vk-default-web-0-000000".to_owned(),
            image: String::new(),
            nics: nics
                .chars()
                .enumerate()
                .map(|(i, kind)| RawNic {
                    mac: format!("52:54:00:00:00:{i:02x}"),
                    tap: format!("tap{i}"),
                    ip: if kind == 's' {
                        format!("10.0.0.{}", i + 2)
                    } else {
                        String::new()
                    },
                    prefix: (kind == 's').then_some(24),
                    gateway: String::new(),
                })
                .collect(),
            created_unix_ms: None,
        };
        Observation::new(&pod, &vm, &Overrides::default())
    }

    #[rstest]
    // Rule 1: only exactly "true" is managed.
    #[case::unmanaged(&[LINUX, (BACKEND, "firecracker")], "s", Rule::NotManaged)]
    #[case::managed_false(&[(MANAGED, "false"), WIN], "d", Rule::NotManaged)]
    #[case::managed_capital(&[(MANAGED, "True"), WIN], "s", Rule::NotManaged)]
    #[case::managed_empty(&[(MANAGED, ""), FC], "s", Rule::NotManaged)]
    // Rule 2: mode run, any case, without fork-from or clone-from-dir.
    #[case::run(&[M, (MODE, "run"), FC], "s", Rule::NotCloned)]
    #[case::run_upper(&[M, (MODE, "RUN"), WIN], "d", Rule::NotCloned)]
    #[case::run_mixed(&[M, (MODE, "Run")], "s", Rule::NotCloned)]
    #[case::run_hibernate_linux(&[M, (MODE, "run"), WAKE, LINUX], "d", Rule::AllDhcp)]
    #[case::run_upper_fork(&[M, (MODE, "RUN"), (FORK_FROM, "vm-src")], "s", Rule::StaticNic)]
    #[case::run_mixed_fork(&[M, (MODE, "Run"), (FORK_FROM, "vm-src")], "d", Rule::AllDhcp)]
    #[case::run_clone_dir(&[M, (MODE, "Run"), (CLONE_FROM_DIR, "/snap/a")], "s", Rule::StaticNic)]
    #[case::run_upper_clone_dir_fc(&[M, (MODE, "RUN"), (CLONE_FROM_DIR, "/snap/a"), FC], "", Rule::Firecracker)]
    #[case::empty_mode(&[M, (MODE, "")], "s", Rule::StaticNic)]
    #[case::no_mode(&[M], "s", Rule::StaticNic)]
    // Rule 3: CH Windows wake only.
    #[case::ch_windows_wake(&[M, CH, WIN, WAKE], "d", Rule::WindowsHibernateWake)]
    // Upstream drops the NIC before hibernating only for exactly
    // `cloud-hypervisor`: an empty or unknown backend keeps it, needs PnP.
    #[case::default_backend_windows_wake(&[M, WIN, WAKE], "s", Rule::Windows)]
    #[case::empty_backend_windows_wake(&[M, (BACKEND, ""), WIN, WAKE], "d", Rule::Windows)]
    #[case::unknown_backend_windows_wake(&[M, (BACKEND, "qemu"), WIN, WAKE], "d", Rule::Windows)]
    #[case::capital_backend_windows_wake(&[M, (BACKEND, "Cloud-Hypervisor"), WIN, WAKE], "d", Rule::Windows)]
    // A wake is a wake whatever else the pod says: it comes first.
    #[case::ch_windows_wake_beats_fork(&[M, CH, WIN, WAKE, (FORK_FROM, "vm-src")], "d", Rule::WindowsHibernateWake)]
    #[case::ch_windows_wake_beats_dir(&[M, CH, WIN, WAKE, (CLONE_FROM_DIR, "/snap/a")], "d", Rule::WindowsHibernateWake)]
    #[case::ch_windows_wake_beats_run(&[M, CH, WIN, WAKE, (MODE, "run")], "d", Rule::WindowsHibernateWake)]
    #[case::ch_windows_wake_not_exact(&[M, CH, WIN, (RESTORE_FROM_HIBERNATE, "yes")], "d", Rule::Windows)]
    // Rule 4: Windows, any backend, any NICs.
    #[case::ch_windows_clone(&[M, CH, WIN, (MODE, "clone")], "d", Rule::Windows)]
    #[case::windows_no_nics(&[M, WIN], "", Rule::Windows)]
    #[case::windows_static(&[M, WIN], "s", Rule::Windows)]
    #[case::fc_windows(&[M, FC, WIN], "d", Rule::Windows)]
    #[case::fc_windows_wake(&[M, FC, WIN, WAKE], "d", Rule::Windows)]
    #[case::windows_capital_w(&[M, CH, (OS, "Windows")], "d", Rule::AllDhcp)]
    #[case::windows_capital_w_static(&[M, CH, (OS, "Windows")], "s", Rule::StaticNic)]
    // Rule 5: Firecracker, even with no or only DHCP NICs.
    #[case::fc_dhcp(&[M, FC, LINUX], "dd", Rule::Firecracker)]
    #[case::fc_no_nics(&[M, FC], "", Rule::Firecracker)]
    #[case::fc_wake(&[M, FC, LINUX, WAKE], "s", Rule::Firecracker)]
    #[case::fc_android(&[M, FC, (OS, "android")], "d", Rule::Firecracker)]
    #[case::fc_capital(&[M, (BACKEND, "Firecracker")], "d", Rule::AllDhcp)]
    // Rule 6: any static NIC.
    #[case::static_only(&[M, CH, LINUX], "s", Rule::StaticNic)]
    #[case::mixed_static_first(&[M, CH, LINUX], "sd", Rule::StaticNic)]
    #[case::mixed_static_last(&[M, CH, LINUX], "dds", Rule::StaticNic)]
    #[case::empty_backend(&[M, (BACKEND, "")], "s", Rule::StaticNic)]
    #[case::unknown_backend(&[M, (BACKEND, "qemu")], "ds", Rule::StaticNic)]
    #[case::linux_wake(&[M, CH, LINUX, WAKE], "s", Rule::StaticNic)]
    #[case::fork(&[M, (FORK_FROM, "vm-src")], "s", Rule::StaticNic)]
    // Rule 7: otherwise.
    #[case::all_dhcp(&[M, CH, LINUX], "dd", Rule::AllDhcp)]
    #[case::no_nics(&[M, CH, LINUX], "", Rule::AllDhcp)]
    #[case::unknown_backend_dhcp(&[M, (BACKEND, "qemu")], "d", Rule::AllDhcp)]
    #[case::linux_wake_dhcp(&[M, LINUX, WAKE], "d", Rule::AllDhcp)]
    fn rules(#[case] annotations: &[(&str, &str)], #[case] nics: &str, #[case] expected: Rule) {
        let decision = classify(&observation(annotations, nics));
        assert_eq!(decision.rule, expected);
        assert_eq!(decision, Classification::from_rule(expected));
    }

    #[rstest]
    #[case::wake_override_on_clone(&[M, CH, WIN], Some(BootKind::Wake), Rule::WindowsHibernateWake)]
    #[case::resumed_on_run(&[M, (MODE, "run")], Some(BootKind::Resumed), Rule::StaticNic)]
    #[case::clone_override_on_wake(&[M, CH, WIN, WAKE], Some(BootKind::Clone), Rule::Windows)]
    fn boot_overrides(
        #[case] annotations: &[(&str, &str)],
        #[case] boot: Option<BootKind>,
        #[case] expected: Rule,
    ) {
        let mut obs = observation(annotations, "s");
        obs.boot = boot;
        assert_eq!(classify(&obs).rule, expected);
    }

    #[rstest]
    #[case::not_managed(Rule::NotManaged, 1, None, false)]
    #[case::not_cloned(Rule::NotCloned, 2, None, false)]
    #[case::windows_wake(Rule::WindowsHibernateWake, 3, None, false)]
    #[case::windows(Rule::Windows, 4, Some(Fixup::WindowsPnp), false)]
    #[case::firecracker(Rule::Firecracker, 5, Some(Fixup::FcMac), true)]
    #[case::static_nic(Rule::StaticNic, 6, Some(Fixup::LinuxNetwork), true)]
    #[case::all_dhcp(Rule::AllDhcp, 7, None, false)]
    fn rule_rows(
        #[case] rule: Rule,
        #[case] number: u8,
        #[case] fixup: Option<Fixup>,
        #[case] needs_image: bool,
    ) {
        let decision = Classification::from_rule(rule);
        assert_eq!(rule.number(), number);
        assert_eq!(Rule::ALL[usize::from(number) - 1], rule);
        assert_eq!(decision.fixup, fixup);
        assert_eq!(decision.needs_fixup(), fixup.is_some());
        assert_eq!(decision.needs_image_kind(), needs_image);
        assert!(!rule.to_string().is_empty());
    }

    #[rstest]
    #[case::windows(Rule::Windows, ImageKind::Unknown, Some(Scenario::WindowsPnp), &[Scenario::WindowsPnp])]
    #[case::fc_oci(Rule::Firecracker, ImageKind::Oci, Some(Scenario::FcMac), &[Scenario::FcMac, Scenario::OciNetworkd])]
    #[case::fc_cloudimg(Rule::Firecracker, ImageKind::Cloudimg, Some(Scenario::FcMac), &[Scenario::FcMac, Scenario::Cloudimg])]
    #[case::static_cloudimg(Rule::StaticNic, ImageKind::Cloudimg, Some(Scenario::Cloudimg), &[Scenario::Cloudimg])]
    #[case::static_oci(Rule::StaticNic, ImageKind::Oci, Some(Scenario::OciNetworkd), &[Scenario::OciNetworkd])]
    #[case::static_unknown(Rule::StaticNic, ImageKind::Unknown, Some(Scenario::OciNetworkd), &[Scenario::OciNetworkd])]
    #[case::all_dhcp(Rule::AllDhcp, ImageKind::Cloudimg, None, &[])]
    fn scenarios(
        #[case] rule: Rule,
        #[case] image: ImageKind,
        #[case] reported: Option<Scenario>,
        #[case] all: &[Scenario],
    ) {
        let decision = Classification::from_rule(rule);
        assert_eq!(decision.scenario(image), reported);
        assert_eq!(decision.scenarios(image), all);
    }

    #[rstest]
    #[case::https(
        Some("https://cloud-images.ubuntu.com/noble.img"),
        false,
        ImageKind::Cloudimg
    )]
    #[case::http(
        Some("http://mirror.local/debian-12.qcow2"),
        false,
        ImageKind::Cloudimg
    )]
    #[case::https_upper(
        Some("HTTPS://cloud-images.ubuntu.com/noble.img"),
        false,
        ImageKind::Oci
    )]
    #[case::http_mixed(Some("Http://mirror.local/a.img"), false, ImageKind::Oci)]
    #[case::leading_space(Some(" https://a/b.img"), false, ImageKind::Oci)]
    #[case::oci_ref(Some("ghcr.io/cocoonstack/ubuntu:24.04"), false, ImageKind::Oci)]
    #[case::overlay_only(None, true, ImageKind::Cloudimg)]
    #[case::oci_ref_with_overlay(
        Some("ghcr.io/cocoonstack/ubuntu:24.04"),
        true,
        ImageKind::Cloudimg
    )]
    #[case::url_and_overlay(Some("https://a/b.img"), true, ImageKind::Cloudimg)]
    #[case::neither(None, false, ImageKind::Oci)]
    #[case::empty(Some(""), false, ImageKind::Oci)]
    fn image_kinds(
        #[case] source_image: Option<&str>,
        #[case] overlay_exists: bool,
        #[case] expected: ImageKind,
    ) {
        assert_eq!(image_kind(source_image, overlay_exists), expected);
    }

    fn examples_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
    }

    /// The `--source-image` value from an example's `args` file, if any.
    fn source_image_arg(dir: &Path) -> Option<String> {
        let args = std::fs::read_to_string(dir.join("args")).ok()?;
        let mut words = args.split_whitespace();
        words.find(|w| *w == "--source-image")?;
        words.next().map(str::to_owned)
    }

    /// Every example classifies as examples/README.md says; the ones that
    /// need a fixup also validate. The image kind comes from `args` and the
    /// overlay probe against `examples/cocoon-root`.
    #[rstest]
    #[case::oci_static("oci-static", Rule::StaticNic, Some(Scenario::OciNetworkd))]
    #[case::cloudimg_static("cloudimg-static", Rule::StaticNic, Some(Scenario::Cloudimg))]
    #[case::cloudimg_overlay("cloudimg-overlay", Rule::StaticNic, Some(Scenario::Cloudimg))]
    #[case::fc_dhcp("fc-dhcp", Rule::Firecracker, Some(Scenario::FcMac))]
    #[case::windows("windows", Rule::Windows, Some(Scenario::WindowsPnp))]
    #[case::no_fixup("no-fixup", Rule::AllDhcp, None)]
    #[case::unmanaged("unmanaged", Rule::NotManaged, None)]
    fn examples(#[case] name: &str, #[case] rule: Rule, #[case] scenario: Option<Scenario>) {
        let dir = examples_dir().join(name);
        let read = |file: &str| {
            std::fs::read_to_string(dir.join(file))
                .unwrap_or_else(|e| panic!("{}: {e}", dir.join(file).display()))
        };
        let pod = PodInput::from_json(&read("pod.json"), "pod.json").unwrap();
        let vm = VmInspect::from_json(&read("vm.json"), "vm.json").unwrap();
        let overrides = Overrides {
            boot: None,
            source_image: source_image_arg(&dir),
        };
        let obs = Observation::new(&pod, &vm, &overrides);
        let decision = classify(&obs);
        assert_eq!(decision.rule, rule, "{name}");
        let image = if decision.needs_image_kind() {
            let probe =
                crate::probe::OverlayProbe::open(examples_dir().join("cocoon-root")).unwrap();
            let id = crate::facts::VmId::parse(&obs.vm_id).unwrap();
            image_kind(
                obs.source_image.as_deref(),
                probe.overlay_exists(&id).unwrap(),
            )
        } else {
            ImageKind::Unknown
        };
        assert_eq!(decision.scenario(image), scenario, "{name}");
        if decision.needs_fixup() {
            VmFacts::validate(&obs, image).unwrap();
        }
        let readme = std::fs::read_to_string(examples_dir().join("README.md")).unwrap();
        assert!(
            readme.contains(&format!("`{name}`")),
            "README.md lists {name}"
        );
    }

    /// A new example folder must get a row in the table above.
    #[test]
    fn every_example_is_tested() {
        let mut found: Vec<String> = std::fs::read_dir(examples_dir())
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.path().join("pod.json").is_file())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        found.sort();
        assert_eq!(
            found,
            [
                "cloudimg-overlay",
                "cloudimg-static",
                "fc-dhcp",
                "no-fixup",
                "oci-static",
                "unmanaged",
                "windows"
            ]
        );
    }
}
