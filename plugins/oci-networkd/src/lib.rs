//! Plan plugin for OCI-image guests on systemd-networkd (spec section 4,
//! oci-networkd flavour), and the DHCP safety net (spec section 6).
//!
//! - `oci-networkd`: housekeeping, then one MAC-matched networkd file per
//!   NIC (static when the NIC has a static address, DHCP otherwise), then a
//!   networkd restart.
//! - `dhcp-recovery`: for a clone that needed no fixup but got no lease; a
//!   DHCP file for every NIC and a restart, without the housekeeping.
//! - `prepare`: for a parent before its snapshot; a DHCP file that matches
//!   a clone's new NIC by its driver, not by a MAC, a file that keeps the
//!   parent's static NICs from it, and a reload ([`networkd::prepare`]): an
//!   all-DHCP clone then comes up by itself.

use cocoon_fixup_sdk::{
    GuestPolicy, Nic, Plan, PlanError, Plugin, PluginInfo, Scenario, VmFacts, linux, networkd,
};

/// The plugin's name, as in its directory.
pub const NAME: &str = "oci-networkd";

/// Writes MAC-matched systemd-networkd files for every NIC.
#[derive(Debug)]
pub struct OciNetworkd;

impl Plugin for OciNetworkd {
    fn describe() -> PluginInfo {
        PluginInfo::new(
            NAME,
            env!("CARGO_PKG_VERSION"),
            "writes MAC-matched systemd-networkd files for every NIC and restarts networkd",
            vec![
                Scenario::OciNetworkd,
                Scenario::DhcpRecovery,
                Scenario::Prepare,
            ],
        )
    }

    /// The hostname, the page-cache knob, networkd's `10-*.network` files
    /// and networkd's restart, and for `prepare` its one file and reload:
    /// nothing else.
    fn policy() -> GuestPolicy {
        linux::prelude_policy()
            .with(networkd::policy())
            .with(networkd::prepare_policy())
    }

    fn plan(scenario: Scenario, facts: &VmFacts) -> Result<Plan, PlanError> {
        match scenario {
            Scenario::OciNetworkd => {
                check_prefixes(&facts.nics)?;
                let mut steps = linux::prelude(facts);
                steps.push(networkd::remove_stale());
                steps.extend(facts.nics.iter().map(networkd::file_for));
                steps.push(networkd::restart());
                Ok(Plan::posix_sh(steps))
            }
            Scenario::DhcpRecovery => {
                let mut steps = vec![networkd::remove_stale()];
                steps.extend(
                    facts
                        .nics
                        .iter()
                        .map(|nic| networkd::dhcp_file_for(&nic.mac)),
                );
                steps.push(networkd::restart());
                Ok(Plan::posix_sh(steps))
            }
            Scenario::Prepare => Ok(Plan::posix_sh(networkd::prepare(&facts.nics))),
            other => cocoon_fixup_sdk::unsupported(NAME, other),
        }
    }
}

cocoon_fixup_sdk::export_plugin!(OciNetworkd);

/// networkd rejects an `Address=` with a prefix over 32 and then leaves the
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
        Action, Backend, BootKind, CONTRACT_VERSION, Dialect, GuestOs, ImageKind, Ipv4Address,
        MacAddress, Phase, StaticIpv4, Step, WriteFile,
    };
    use rstest::rstest;

    use super::*;

    const MAC_A: MacAddress = MacAddress::new([0x52, 0x54, 0x00, 0x0A, 0x0B, 0x0C]);
    const MAC_B: MacAddress = MacAddress::new([0xFA, 0x16, 0x3E, 0x01, 0x02, 0x03]);

    fn facts(nics: Vec<Nic>) -> VmFacts {
        VmFacts {
            name: "oci-1".into(),
            id: "vm-oci-1".into(),
            backend: Backend::CloudHypervisor,
            os: GuestOs::Linux,
            image: ImageKind::Oci,
            boot: BootKind::Clone,
            nics,
            flavor: None,
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

    fn write(
        description: &str,
        phase: Phase,
        path: &str,
        content: &str,
        mode: Option<u32>,
    ) -> Step {
        Step {
            description: description.into(),
            phase,
            best_effort: false,
            action: Action::WriteFile(WriteFile {
                path: path.into(),
                content: content.into(),
                mode,
                parents: false,
            }),
        }
    }

    fn prelude() -> Vec<Step> {
        let mut drop_caches = write(
            "drop the page cache",
            Phase::Prepare,
            "/proc/sys/vm/drop_caches",
            "3\n",
            None,
        );
        drop_caches.best_effort = true;
        vec![
            drop_caches,
            write(
                "set the hostname to oci-1",
                Phase::Prepare,
                "/etc/hostname",
                "oci-1\n",
                Some(0o644),
            ),
        ]
    }

    fn remove_stale() -> Step {
        Step {
            description: "remove stale systemd-networkd files".into(),
            phase: Phase::Configure,
            best_effort: false,
            action: Action::RemoveFiles(vec!["/etc/systemd/network/10-*.network".into()]),
        }
    }

    fn restart() -> Step {
        Step {
            description: "restart systemd-networkd".into(),
            phase: Phase::Configure,
            best_effort: false,
            action: Action::Run(vec![
                "systemctl".into(),
                "restart".into(),
                "systemd-networkd".into(),
            ]),
        }
    }

    const DHCP_A: &str = "[Match]\nMACAddress=52:54:00:0a:0b:0c\n\n[Network]\nDHCP=ipv4\n\n[DHCPv4]\nClientIdentifier=mac\n";
    const DHCP_B: &str = "[Match]\nMACAddress=fa:16:3e:01:02:03\n\n[Network]\nDHCP=ipv4\n\n[DHCPv4]\nClientIdentifier=mac\n";
    const PATH_A: &str = "/etc/systemd/network/10-5254000a0b0c.network";
    const PATH_B: &str = "/etc/systemd/network/10-fa163e010203.network";

    fn dhcp_file_a() -> Step {
        write(
            "write the DHCP network file for 52:54:00:0a:0b:0c",
            Phase::Configure,
            PATH_A,
            DHCP_A,
            Some(0o644),
        )
    }

    fn dhcp_file_b() -> Step {
        write(
            "write the DHCP network file for fa:16:3e:01:02:03",
            Phase::Configure,
            PATH_B,
            DHCP_B,
            Some(0o644),
        )
    }

    #[test]
    fn describe_names_the_plugin_and_its_scenarios() {
        let info = OciNetworkd::describe();
        assert_eq!(info.name, "oci-networkd");
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
        assert!(info.flavors.is_empty());
        assert!(!info.summary.is_empty() && !info.summary.contains('\n'));
    }

    #[test]
    fn oci_networkd_writes_one_file_per_nic_in_inspect_order() {
        let nics = vec![static_nic(MAC_A, 24, Some([10, 1, 2, 1])), dhcp_nic(MAC_B)];
        let mut steps = prelude();
        steps.push(remove_stale());
        steps.push(write(
            "write the static network file for 52:54:00:0a:0b:0c",
            Phase::Configure,
            PATH_A,
            "[Match]\nMACAddress=52:54:00:0a:0b:0c\n\n[Network]\nAddress=10.1.2.3/24\nGateway=10.1.2.1\n",
            Some(0o644),
        ));
        steps.push(dhcp_file_b());
        steps.push(restart());
        assert_eq!(
            OciNetworkd::plan(Scenario::OciNetworkd, &facts(nics)),
            Ok(Plan {
                dialect: Dialect::PosixSh,
                steps,
            })
        );
    }

    #[test]
    fn static_nic_without_gateway_writes_no_gateway_line() {
        let plan = OciNetworkd::plan(
            Scenario::OciNetworkd,
            &facts(vec![static_nic(MAC_A, 16, None)]),
        )
        .unwrap();
        assert_eq!(
            plan.steps[3],
            write(
                "write the static network file for 52:54:00:0a:0b:0c",
                Phase::Configure,
                PATH_A,
                "[Match]\nMACAddress=52:54:00:0a:0b:0c\n\n[Network]\nAddress=10.1.2.3/16\n",
                Some(0o644),
            )
        );
    }

    #[test]
    fn oci_networkd_without_nics_still_restarts() {
        let mut steps = prelude();
        steps.push(remove_stale());
        steps.push(restart());
        assert_eq!(
            OciNetworkd::plan(Scenario::OciNetworkd, &facts(Vec::new())),
            Ok(Plan::posix_sh(steps))
        );
    }

    #[test]
    fn dhcp_recovery_puts_every_nic_on_dhcp_without_the_prelude() {
        let nics = vec![dhcp_nic(MAC_A), static_nic(MAC_B, 24, Some([10, 1, 2, 1]))];
        let expected = vec![remove_stale(), dhcp_file_a(), dhcp_file_b(), restart()];
        assert_eq!(
            OciNetworkd::plan(Scenario::DhcpRecovery, &facts(nics)),
            Ok(Plan::posix_sh(expected))
        );
    }

    /// A parent is prepared whatever its NICs: the clone file matches a
    /// clone's NIC by driver, a parent file keeps its static NICs from it,
    /// the parent's own files stay, and networkd reloads.
    #[rstest]
    #[case::dhcp(vec![dhcp_nic(MAC_A)])]
    #[case::static_and_dhcp(vec![static_nic(MAC_A, 24, None), dhcp_nic(MAC_B)])]
    #[case::none(Vec::new())]
    fn prepare_adds_the_clone_file_and_reloads(#[case] nics: Vec<Nic>) {
        let mut parent = facts(nics);
        parent.boot = BootKind::Parent;
        let plan = OciNetworkd::plan(Scenario::Prepare, &parent).expect("a plan");
        assert_eq!(
            plan,
            Plan::posix_sh(cocoon_fixup_sdk::networkd::prepare(&parent.nics))
        );
        assert!(
            plan.steps
                .iter()
                .all(|s| !matches!(s.action, Action::RemoveFiles(_))),
            "the parent's own files stay: {plan:?}"
        );
        // Inside the declared policy.
        let policy = OciNetworkd::policy();
        for file in [
            "/etc/systemd/network/99-cocoon-clone-parent.network",
            "/etc/systemd/network/99-cocoon-clone.network",
        ] {
            assert!(policy.writes.contains(&file.to_owned()), "{file}");
        }
        assert!(
            policy
                .runs
                .contains(&vec!["networkctl".to_owned(), "reload".to_owned()])
        );
    }

    #[rstest]
    #[case(0, true)]
    #[case(32, true)]
    #[case(33, false)]
    #[case(255, false)]
    fn prefix_must_be_at_most_32(#[case] prefix: u8, #[case] accepted: bool) {
        let nics = vec![dhcp_nic(MAC_A), static_nic(MAC_B, prefix, None)];
        let result = OciNetworkd::plan(Scenario::OciNetworkd, &facts(nics));
        if accepted {
            assert!(result.is_ok(), "{result:?}");
        } else {
            assert_eq!(
                result,
                Err(PlanError::invalid_fact(
                    "nics[1].static-ipv4.prefix",
                    format!("prefix {prefix} is outside 0..=32"),
                ))
            );
        }
    }

    #[rstest]
    #[case(Scenario::Cloudimg)]
    #[case(Scenario::FcMac)]
    #[case(Scenario::WindowsPnp)]
    fn other_scenarios_are_unsupported(#[case] scenario: Scenario) {
        assert_eq!(
            OciNetworkd::plan(scenario, &facts(Vec::new())),
            Err(PlanError::Unsupported(format!(
                "plugin `oci-networkd` does not serve scenario `{scenario}`"
            )))
        );
    }
}
