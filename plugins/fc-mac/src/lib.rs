//! Plan plugin for Firecracker clones: re-apply each NIC's MAC (spec
//! section 4, step 3).
//!
//! Firecracker freezes the guest MAC in the saved vmstate, so a clone's NICs
//! keep the source VM's MACs. The device itself is unchanged, which makes
//! this the one place where a NIC is addressed by name: NIC `i` in inspect
//! order is `eth<i>` in the guest. The plan has link-phase steps only; the
//! host composes it with a network flavour's plan (prepare, link, configure).

use cocoon_fixup_sdk::{
    GuestPolicy, Nic, Phase, Plan, PlanError, Plugin, PluginInfo, Scenario, Step, VmFacts,
};

/// The plugin's name, as in its directory.
pub const NAME: &str = "fc-mac";

/// Re-applies the MACs of a Firecracker clone.
#[derive(Debug)]
pub struct FcMac;

impl Plugin for FcMac {
    fn describe() -> PluginInfo {
        PluginInfo::new(
            NAME,
            env!("CARGO_PKG_VERSION"),
            "re-applies each NIC's MAC address on a Firecracker clone (link phase only)",
            vec![Scenario::FcMac],
        )
    }

    /// `ip link set dev ...` and nothing else: no file, no other program.
    fn policy() -> GuestPolicy {
        GuestPolicy::new().runs([["ip", "link", "set", "dev", "*"]])
    }

    fn plan(scenario: Scenario, facts: &VmFacts) -> Result<Plan, PlanError> {
        match scenario {
            Scenario::FcMac => Ok(Plan::posix_sh(
                facts
                    .nics
                    .iter()
                    .enumerate()
                    .flat_map(reapply_mac)
                    .collect(),
            )),
            other => cocoon_fixup_sdk::unsupported(NAME, other),
        }
    }
}

cocoon_fixup_sdk::export_plugin!(FcMac);

/// Down, set the address, up: the kernel refuses a new MAC on a running
/// link for most drivers.
fn reapply_mac((index, nic): (usize, &Nic)) -> [Step; 3] {
    let dev = format!("eth{index}");
    let mac = nic.mac.to_string();
    let link = |description: String, tail: &[&str]| {
        let argv = ["ip", "link", "set", "dev", dev.as_str()]
            .into_iter()
            .chain(tail.iter().copied());
        Step::run(description, Phase::Link, argv)
    };
    [
        link(format!("take {dev} down"), &["down"]),
        link(format!("set the MAC of {dev} to {mac}"), &["address", &mac]),
        link(format!("bring {dev} up"), &["up"]),
    ]
}

#[cfg(test)]
mod tests {
    use cocoon_fixup_sdk::{
        Action, Backend, BootKind, CONTRACT_VERSION, Dialect, GuestOs, ImageKind, Ipv4Address,
        MacAddress, StaticIpv4,
    };
    use rstest::rstest;

    use super::*;

    fn facts(nics: Vec<Nic>) -> VmFacts {
        VmFacts {
            name: "fc-0".into(),
            id: "vm-fc-0".into(),
            backend: Backend::Firecracker,
            os: GuestOs::Linux,
            image: ImageKind::Oci,
            boot: BootKind::Clone,
            nics,
            flavor: None,
        }
    }

    fn link(description: &str, argv: &[&str]) -> Step {
        Step {
            description: description.into(),
            phase: Phase::Link,
            best_effort: false,
            action: Action::Run(argv.iter().map(|a| a.to_string()).collect()),
        }
    }

    #[test]
    fn describe_names_the_plugin_and_its_scenario() {
        let info = FcMac::describe();
        assert_eq!(info.name, "fc-mac");
        assert_eq!(info.version, "0.1.0");
        assert_eq!(info.contract, CONTRACT_VERSION);
        assert_eq!(info.scenarios, vec![Scenario::FcMac]);
        assert!(info.flavors.is_empty());
        assert!(!info.summary.is_empty() && !info.summary.contains('\n'));
    }

    #[test]
    fn each_nic_goes_down_gets_its_mac_and_comes_up_in_inspect_order() {
        let nics = vec![
            Nic {
                mac: MacAddress::new([0x02, 0xFC, 0x00, 0x00, 0x00, 0x01]),
                static_ipv4: Some(StaticIpv4 {
                    address: Ipv4Address::new([172, 16, 0, 2]),
                    prefix: 24,
                    gateway: None,
                }),
            },
            Nic {
                mac: MacAddress::new([0x02, 0xFC, 0x00, 0x00, 0x00, 0xAB]),
                static_ipv4: None,
            },
        ];
        let expected = Plan {
            dialect: Dialect::PosixSh,
            steps: vec![
                link(
                    "take eth0 down",
                    &["ip", "link", "set", "dev", "eth0", "down"],
                ),
                link(
                    "set the MAC of eth0 to 02:fc:00:00:00:01",
                    &[
                        "ip",
                        "link",
                        "set",
                        "dev",
                        "eth0",
                        "address",
                        "02:fc:00:00:00:01",
                    ],
                ),
                link("bring eth0 up", &["ip", "link", "set", "dev", "eth0", "up"]),
                link(
                    "take eth1 down",
                    &["ip", "link", "set", "dev", "eth1", "down"],
                ),
                link(
                    "set the MAC of eth1 to 02:fc:00:00:00:ab",
                    &[
                        "ip",
                        "link",
                        "set",
                        "dev",
                        "eth1",
                        "address",
                        "02:fc:00:00:00:ab",
                    ],
                ),
                link("bring eth1 up", &["ip", "link", "set", "dev", "eth1", "up"]),
            ],
        };
        assert_eq!(FcMac::plan(Scenario::FcMac, &facts(nics)), Ok(expected));
    }

    #[test]
    fn no_nics_gives_an_empty_plan() {
        assert_eq!(
            FcMac::plan(Scenario::FcMac, &facts(Vec::new())),
            Ok(Plan::posix_sh(Vec::new()))
        );
    }

    #[rstest]
    #[case(Scenario::Cloudimg)]
    #[case(Scenario::OciNetworkd)]
    #[case(Scenario::WindowsPnp)]
    #[case(Scenario::DhcpRecovery)]
    fn other_scenarios_are_unsupported(#[case] scenario: Scenario) {
        assert_eq!(
            FcMac::plan(scenario, &facts(Vec::new())),
            Err(PlanError::Unsupported(format!(
                "plugin `fc-mac` does not serve scenario `{scenario}`"
            )))
        );
    }
}
