//! A test plugin of the current contract for a guest whose ifupdown
//! (`/etc/network/interfaces`) matches interfaces by name, as on Alpine:
//! it names each NIC `eth0`, `eth1`, ... in inspect order with `name-link`
//! steps, writes the interfaces file with `parents`, and restarts
//! networking. Flavour `ifupdown`; the VM name picks the plan:
//!
//! | name      | plan                                                     |
//! |-----------|----------------------------------------------------------|
//! | `foreign` | names a NIC whose MAC is not the VM's                    |
//! | `wlan`    | names the first NIC `wlan0`, outside its `links`         |
//! | other     | the plan above, inside its policy                        |
//!
//! Never ship it.

use cocoon_fixup_sdk::{
    GuestPolicy, MacAddress, Phase, Plan, PlanError, Plugin, PluginInfo, Scenario, Step, VmFacts,
};

/// The plugin's name and the one flavour it claims.
pub const NAME: &str = "ifupdown";

/// The file ifupdown reads.
pub const INTERFACES: &str = "/etc/network/interfaces";

/// The interfaces file for `count` NICs named `eth0`, `eth1`, ...: the
/// loopback, then each NIC on DHCP.
pub fn interfaces(count: usize) -> String {
    let mut out = String::from("auto lo\niface lo inet loopback\n");
    for i in 0..count {
        out.push_str(&format!("\nauto eth{i}\niface eth{i} inet dhcp\n"));
    }
    out
}

/// A plugin for ifupdown guests.
#[derive(Debug)]
pub struct Ifupdown;

impl Plugin for Ifupdown {
    fn describe() -> PluginInfo {
        PluginInfo::new(
            NAME,
            env!("CARGO_PKG_VERSION"),
            "names NICs by MAC and writes /etc/network/interfaces, to test name-link",
            vec![Scenario::OciNetworkd],
        )
        .with_flavors([NAME])
    }

    fn policy() -> GuestPolicy {
        GuestPolicy::new()
            .links(["eth*"])
            .writes([INTERFACES])
            .runs([["rc-service", "networking", "restart"]])
    }

    fn plan(_scenario: Scenario, facts: &VmFacts) -> Result<Plan, PlanError> {
        let mut steps: Vec<Step> = match facts.name.as_str() {
            "foreign" => vec![Step::name_link(
                MacAddress {
                    octets: (0x02, 0, 0, 0, 0, 0x99),
                },
                "eth0",
            )],
            "wlan" => facts
                .nics
                .iter()
                .take(1)
                .map(|nic| Step::name_link(nic.mac, "wlan0"))
                .collect(),
            _ => facts
                .nics
                .iter()
                .enumerate()
                .map(|(i, nic)| Step::name_link(nic.mac, format!("eth{i}")))
                .collect(),
        };
        steps.push(
            Step::write_file(
                "write /etc/network/interfaces",
                Phase::Configure,
                INTERFACES,
                interfaces(facts.nics.len()),
                Some(0o644),
            )
            .with_parents(),
        );
        steps.push(Step::run(
            "restart networking",
            Phase::Configure,
            ["rc-service", "networking", "restart"],
        ));
        Ok(Plan::posix_sh(steps))
    }
}

cocoon_fixup_sdk::export_plugin!(Ifupdown);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_lists_each_nic_by_its_new_name() {
        assert_eq!(
            interfaces(2),
            "auto lo\niface lo inet loopback\n\nauto eth0\niface eth0 inet dhcp\n\nauto eth1\niface eth1 inet dhcp\n"
        );
    }
}
