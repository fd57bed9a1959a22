//! `nm-keyfile`: NetworkManager keyfiles for RHEL-family guests and any
//! other guest whose network NetworkManager owns.
//!
//! An example of a vendor plugin, made from the cocoon-fixup plugin template
//! and shipped as a file for the plugin directory, not built into the host.
//! It serves the guest flavours in [`FLAVORS`] (the pod annotation
//! `vm.cocoonstack.io/guest-flavor`); for them it replaces the built-in
//! `oci-networkd`, whose systemd-networkd files a NetworkManager guest never
//! reads. Every other guest keeps the built-in.
//!
//! - `oci-networkd`: the Linux housekeeping, then one MAC-matched keyfile per
//!   NIC (static when the NIC has a static address, DHCP otherwise), then
//!   `nmcli connection reload` and one `nmcli connection up` per NIC.
//! - `dhcp-recovery`: for a clone that needed no fixup but got no lease; a
//!   DHCP keyfile for every NIC, the reload and the activations, without the
//!   housekeeping.
//! - `prepare`: for a parent before its snapshot; a keyfile that a clone's
//!   new NIC matches by driver, and the reload ([`keyfile::prepare`]): an
//!   all-DHCP clone then comes up by itself.
//!
//! [`keyfile`] has the file format and why these commands.
//!
//! # Layout
//!
//! - [`keyfile`]: keyfile paths, contents and the `nmcli` steps.
//! - [`uuid`]: name-based connection UUIDs (no randomness in the sandbox).

pub mod keyfile;
pub mod uuid;

use cocoon_fixup_sdk::{
    GuestPolicy, Nic, Plan, PlanError, Plugin, PluginInfo, Scenario, VmFacts, linux,
};

/// The plugin's name, as `plan` and `plugin inspect` show it.
pub const NAME: &str = "nm-keyfile";

/// The `vm.cocoonstack.io/guest-flavor` values this plugin serves: the
/// RHEL family, which configures its network with NetworkManager keyfiles
/// (the default since RHEL 9 and Fedora 33), and `networkmanager` for any
/// other Linux guest whose network NetworkManager owns (a Debian or Ubuntu
/// image built that way).
pub const FLAVORS: &[&str] = &[
    "rhel",
    "centos",
    "rocky",
    "almalinux",
    "fedora",
    "networkmanager",
];

/// Writes MAC-matched NetworkManager keyfiles for every NIC.
#[derive(Debug)]
pub struct NmKeyfile;

impl Plugin for NmKeyfile {
    fn describe() -> PluginInfo {
        PluginInfo::new(
            NAME,
            env!("CARGO_PKG_VERSION"),
            "writes MAC-matched NetworkManager keyfiles for every NIC and activates them",
            vec![
                Scenario::OciNetworkd,
                Scenario::DhcpRecovery,
                Scenario::Prepare,
            ],
        )
        .with_flavors(FLAVORS.iter().copied())
    }

    /// The hostname, the page-cache knob, this plugin's own keyfiles and
    /// two `nmcli connection` commands.
    fn policy() -> GuestPolicy {
        linux::prelude_policy().with(keyfile::policy())
    }

    fn plan(scenario: Scenario, facts: &VmFacts) -> Result<Plan, PlanError> {
        match scenario {
            Scenario::OciNetworkd => {
                check_prefixes(&facts.nics)?;
                let mut steps = linux::prelude(facts);
                steps.push(keyfile::remove_stale());
                steps.extend(facts.nics.iter().map(keyfile::file_for));
                steps.push(keyfile::reload());
                steps.extend(facts.nics.iter().map(keyfile::up));
                Ok(Plan::posix_sh(steps))
            }
            Scenario::DhcpRecovery => {
                let mut steps = vec![keyfile::remove_stale()];
                steps.extend(
                    facts
                        .nics
                        .iter()
                        .map(|nic| keyfile::dhcp_file_for(&nic.mac)),
                );
                steps.push(keyfile::reload());
                steps.extend(facts.nics.iter().map(|nic| keyfile::dhcp_up(&nic.mac)));
                Ok(Plan::posix_sh(steps))
            }
            Scenario::Prepare => Ok(Plan::posix_sh(keyfile::prepare(
                &facts.nics.iter().map(|nic| nic.mac).collect::<Vec<_>>(),
            ))),
            other => cocoon_fixup_sdk::unsupported(NAME, other),
        }
    }
}

cocoon_fixup_sdk::export_plugin!(NmKeyfile);

/// NetworkManager refuses a keyfile whose prefix is over 32 and leaves the
/// NIC unconfigured. The host validates prefixes already; checking again
/// costs nothing and turns a silent guest failure into a named fact.
fn check_prefixes(nics: &[Nic]) -> Result<(), PlanError> {
    for (i, nic) in nics.iter().enumerate() {
        if let Some(ipv4) = &nic.static_ipv4
            && ipv4.prefix > 32
        {
            return Err(PlanError::invalid_fact(
                format!("nics[{i}].static-ipv4.prefix"),
                format!("prefix {} is outside 0..=32", ipv4.prefix),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use cocoon_fixup_sdk::{
        Action, Backend, BootKind, CONTRACT_VERSION, GuestOs, ImageKind, Ipv4Address, MacAddress,
        Phase, StaticIpv4, Step, WriteFile,
    };

    use super::*;

    const MAC_A: MacAddress = MacAddress::new([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
    const MAC_B: MacAddress = MacAddress::new([0xFA, 0x16, 0x3E, 0x01, 0x02, 0x03]);
    const UUID_A: &str = "77d97f31-00fb-587b-b091-12340076b20a";
    const UUID_B: &str = "ae059d46-40fb-5bb0-873d-e84bd8e3c6aa";
    const PATH_A: &str = "/etc/NetworkManager/system-connections/cocoon-525400123456.nmconnection";
    const PATH_B: &str = "/etc/NetworkManager/system-connections/cocoon-fa163e010203.nmconnection";

    fn facts(nics: Vec<Nic>) -> VmFacts {
        VmFacts {
            name: "db-0".into(),
            id: "vm-0123abcd".into(),
            backend: Backend::CloudHypervisor,
            os: GuestOs::Linux,
            image: ImageKind::Oci,
            boot: BootKind::Clone,
            nics,
            flavor: Some("rhel".into()),
        }
    }

    fn static_nic(mac: MacAddress, prefix: u8, gateway: Option<[u8; 4]>) -> Nic {
        Nic {
            mac,
            static_ipv4: Some(StaticIpv4 {
                address: Ipv4Address::new([10, 1, 2, 3]),
                prefix,
                gateway: gateway.map(Ipv4Address::new),
            }),
        }
    }

    fn dhcp_nic(mac: MacAddress) -> Nic {
        Nic {
            mac,
            static_ipv4: None,
        }
    }

    fn write(description: &str, path: &str, content: &str) -> Step {
        Step {
            description: description.into(),
            phase: Phase::Configure,
            best_effort: false,
            action: Action::WriteFile(WriteFile {
                path: path.into(),
                content: content.into(),
                mode: Some(0o600),
                parents: false,
            }),
        }
    }

    fn run(description: &str, argv: &[&str]) -> Step {
        Step {
            description: description.into(),
            phase: Phase::Configure,
            best_effort: false,
            action: Action::Run(argv.iter().map(|&a| a.into()).collect()),
        }
    }

    fn remove_stale() -> Step {
        Step {
            description: "remove stale cocoon NetworkManager keyfiles".into(),
            phase: Phase::Configure,
            best_effort: false,
            action: Action::RemoveFiles(vec![
                "/etc/NetworkManager/system-connections/cocoon-*.nmconnection".into(),
            ]),
        }
    }

    fn reload() -> Step {
        run(
            "reload NetworkManager connection files",
            &["nmcli", "connection", "reload"],
        )
    }

    fn static_keyfile_a(address1: &str) -> String {
        format!(
            "[connection]\nid=cocoon-525400123456\nuuid={UUID_A}\ntype=ethernet\nautoconnect=true\nautoconnect-priority=100\n\n[ethernet]\nmac-address=52:54:00:12:34:56\n\n[ipv4]\nmethod=manual\naddress1={address1}\n\n[ipv6]\nmethod=ignore\n"
        )
    }

    fn dhcp_keyfile_a() -> String {
        format!(
            "[connection]\nid=cocoon-525400123456\nuuid={UUID_A}\ntype=ethernet\nautoconnect=true\nautoconnect-priority=100\n\n[ethernet]\nmac-address=52:54:00:12:34:56\n\n[ipv4]\nmethod=auto\ndhcp-client-id=mac\n\n[ipv6]\nmethod=ignore\n"
        )
    }

    fn dhcp_keyfile_b() -> String {
        format!(
            "[connection]\nid=cocoon-fa163e010203\nuuid={UUID_B}\ntype=ethernet\nautoconnect=true\nautoconnect-priority=100\n\n[ethernet]\nmac-address=fa:16:3e:01:02:03\n\n[ipv4]\nmethod=auto\ndhcp-client-id=mac\n\n[ipv6]\nmethod=ignore\n"
        )
    }

    #[test]
    fn describe_claims_the_rhel_family_for_two_scenarios() {
        let info = NmKeyfile::describe();
        assert_eq!(info.name, "nm-keyfile");
        assert_eq!(info.version, "0.1.0");
        assert_eq!(info.contract, CONTRACT_VERSION);
        assert_eq!(
            info.scenarios,
            vec![
                Scenario::OciNetworkd,
                Scenario::DhcpRecovery,
                Scenario::Prepare
            ]
        );
        assert_eq!(
            info.flavors,
            [
                "rhel",
                "centos",
                "rocky",
                "almalinux",
                "fedora",
                "networkmanager"
            ]
        );
    }

    #[test]
    fn oci_networkd_writes_keyfiles_reloads_then_activates_each_nic() {
        let nics = vec![static_nic(MAC_A, 24, Some([10, 1, 2, 1])), dhcp_nic(MAC_B)];
        let mut expected = linux::prelude(&facts(Vec::new()));
        expected.extend([
            remove_stale(),
            write(
                "write the static NetworkManager keyfile for 52:54:00:12:34:56",
                PATH_A,
                &static_keyfile_a("10.1.2.3/24,10.1.2.1"),
            ),
            write(
                "write the DHCP NetworkManager keyfile for fa:16:3e:01:02:03",
                PATH_B,
                &dhcp_keyfile_b(),
            ),
            reload(),
            run(
                "activate cocoon-525400123456 on 52:54:00:12:34:56",
                &[
                    "nmcli",
                    "--wait",
                    "30",
                    "connection",
                    "up",
                    "id",
                    "cocoon-525400123456",
                ],
            ),
            run(
                "start DHCP with cocoon-fa163e010203 on fa:16:3e:01:02:03",
                &[
                    "nmcli",
                    "--wait",
                    "0",
                    "connection",
                    "up",
                    "id",
                    "cocoon-fa163e010203",
                ],
            ),
        ]);
        assert_eq!(
            NmKeyfile::plan(Scenario::OciNetworkd, &facts(nics)),
            Ok(Plan::posix_sh(expected))
        );
    }

    #[test]
    fn the_prelude_is_the_sdks() {
        let plan = NmKeyfile::plan(Scenario::OciNetworkd, &facts(Vec::new())).expect("plans");
        let descriptions: Vec<&str> = plan.steps.iter().map(|s| s.description.as_str()).collect();
        assert_eq!(
            descriptions,
            [
                "drop the page cache",
                "set the hostname to db-0",
                "remove stale cocoon NetworkManager keyfiles",
                "reload NetworkManager connection files",
            ]
        );
    }

    #[test]
    fn a_static_nic_without_gateway_writes_only_the_address() {
        let plan = NmKeyfile::plan(
            Scenario::OciNetworkd,
            &facts(vec![static_nic(MAC_A, 16, None)]),
        )
        .expect("plans");
        assert_eq!(
            plan.steps[3],
            write(
                "write the static NetworkManager keyfile for 52:54:00:12:34:56",
                PATH_A,
                &static_keyfile_a("10.1.2.3/16"),
            )
        );
    }

    #[test]
    fn dhcp_recovery_puts_every_nic_on_dhcp_without_the_prelude() {
        let nics = vec![static_nic(MAC_A, 24, Some([10, 1, 2, 1])), dhcp_nic(MAC_B)];
        let expected = vec![
            remove_stale(),
            write(
                "write the DHCP NetworkManager keyfile for 52:54:00:12:34:56",
                PATH_A,
                &dhcp_keyfile_a(),
            ),
            write(
                "write the DHCP NetworkManager keyfile for fa:16:3e:01:02:03",
                PATH_B,
                &dhcp_keyfile_b(),
            ),
            reload(),
            run(
                "start DHCP with cocoon-525400123456 on 52:54:00:12:34:56",
                &[
                    "nmcli",
                    "--wait",
                    "0",
                    "connection",
                    "up",
                    "id",
                    "cocoon-525400123456",
                ],
            ),
            run(
                "start DHCP with cocoon-fa163e010203 on fa:16:3e:01:02:03",
                &[
                    "nmcli",
                    "--wait",
                    "0",
                    "connection",
                    "up",
                    "id",
                    "cocoon-fa163e010203",
                ],
            ),
        ];
        assert_eq!(
            NmKeyfile::plan(Scenario::DhcpRecovery, &facts(nics)),
            Ok(Plan::posix_sh(expected))
        );
    }

    #[test]
    fn the_same_mac_gets_the_same_connection_on_every_run() {
        let once = keyfile::content(&MAC_A, None);
        assert_eq!(once, keyfile::content(&MAC_A, None));
        assert_ne!(
            keyfile::connection_uuid(&MAC_A),
            keyfile::connection_uuid(&MAC_B)
        );
    }

    /// A parent is prepared with one keyfile that matches any virtio NIC
    /// by driver, never a MAC, below every other profile, and a reload;
    /// the same every time.
    #[test]
    fn prepare_writes_a_keyfile_matched_by_driver_and_reloads() {
        let mut parent = facts(vec![dhcp_nic(MAC_A)]);
        parent.boot = BootKind::Parent;
        let plan = NmKeyfile::plan(Scenario::Prepare, &parent).expect("a plan");
        assert_eq!(plan.steps.len(), 2);
        let Action::WriteFile(w) = &plan.steps[0].action else {
            panic!("{plan:?}")
        };
        assert_eq!(
            w.path,
            "/etc/NetworkManager/system-connections/cocoon_clone.nmconnection"
        );
        // Outside `cocoon-*.nmconnection`: a clone's fixup keeps it.
        assert!(!w.path.contains("/cocoon-"), "{}", w.path);
        assert_eq!(w.mode, Some(0o600));
        for line in [
            "\n[match]\ndriver=virtio_net\n",
            "\nmulti-connect=3\n",
            "\nautoconnect-priority=-100\n",
            "\nmethod=auto\ndhcp-client-id=mac\n",
        ] {
            assert!(w.content.contains(line), "{line:?} in {}", w.content);
        }
        assert!(
            w.content.contains(&format!("\nmac-address-blacklist={MAC_A};\n")),
            "never the parent's own NIC: {}",
            w.content
        );
        assert_eq!(
            plan.steps[1].action,
            Action::Run(vec!["nmcli".into(), "connection".into(), "reload".into()])
        );
        assert_eq!(NmKeyfile::plan(Scenario::Prepare, &parent), Ok(plan));
        // Inside the declared policy, which is unchanged.
        let p = NmKeyfile::policy();
        assert!(p.writes.contains(&keyfile::STALE_GLOB.to_owned()));
    }

    #[test]
    fn a_prefix_over_32_is_an_invalid_fact() {
        let nics = vec![dhcp_nic(MAC_A), static_nic(MAC_B, 33, None)];
        assert_eq!(
            NmKeyfile::plan(Scenario::OciNetworkd, &facts(nics)),
            Err(PlanError::invalid_fact(
                "nics[1].static-ipv4.prefix",
                "prefix 33 is outside 0..=32",
            ))
        );
    }

    #[test]
    fn other_scenarios_are_unsupported() {
        for scenario in [Scenario::Cloudimg, Scenario::FcMac, Scenario::WindowsPnp] {
            assert_eq!(
                NmKeyfile::plan(scenario, &facts(Vec::new())),
                Err(PlanError::Unsupported(format!(
                    "plugin `nm-keyfile` does not serve scenario `{scenario}`"
                )))
            );
        }
    }
}
