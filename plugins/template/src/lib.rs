//! `{{name}}`: a cocoon-fixup plan plugin.
//!
//! Made from the cocoon-fixup plugin template. As generated it serves the
//! `oci-networkd` scenario for guests whose pod carries the annotation
//! `vm.cocoonstack.io/guest-flavor: {{name}}`: the usual Linux housekeeping,
//! one MAC-matched systemd-networkd file per NIC, a networkd restart and a
//! neighbour-cache flush. Change [`FLAVORS`], the scenarios and
//! [`{{type_name}}::plan`] to what your guests need; the vendor guide is
//! `docs/plugins.md` in cocoon-fixup.
//!
//! The plugin is pure logic: facts in, typed steps out. It runs in a
//! sandbox with no filesystem, environment, clock or randomness, and the
//! host quotes and renders every value, so nothing here builds shell text.

use cocoon_fixup_sdk::{
    GuestPolicy, LogLevel, Phase, Plan, PlanError, Plugin, PluginInfo, Scenario, Step, VmFacts,
    linux, log, networkd,
};

/// The plugin's name, as `plan` and `plugin inspect` show it.
pub const NAME: &str = "{{name}}";

/// The `vm.cocoonstack.io/guest-flavor` values this plugin serves. For these
/// flavours it replaces the built-in plugin of the same scenario; every other
/// guest keeps the built-in. An empty list claims every flavour, which
/// collides with the built-in's claim and is refused when the host loads it.
pub const FLAVORS: &[&str] = &["{{name}}"];

/// Drops the neighbour (ARP) entries the clone inherited.
const FLUSH_NEIGHBOURS: [&str; 4] = ["ip", "neigh", "flush", "all"];

/// Why a VM without NICs gets no plan.
const NO_NICS: &str = "the VM has no NIC to configure";

/// The plugin. It holds no state: the host runs every call in a fresh
/// sandbox.
#[derive(Debug)]
pub struct {{type_name}};

impl Plugin for {{type_name}} {
    fn describe() -> PluginInfo {
        PluginInfo::new(
            NAME,
            env!("CARGO_PKG_VERSION"),
            "writes MAC-matched systemd-networkd files, restarts networkd, flushes stale neighbours",
            vec![Scenario::OciNetworkd],
        )
        .with_flavors(FLAVORS.iter().copied())
    }

    /// Everything the plans may do in the guest, and nothing more: the
    /// host refuses a plan that steps outside it, and operators read it in
    /// `cocoon-fixup plugin inspect` before they load the plugin. When a
    /// plan gains a step, add what it needs here.
    fn policy() -> GuestPolicy {
        linux::prelude_policy()
            .with(networkd::policy())
            .runs([FLUSH_NEIGHBOURS])
    }

    fn plan(scenario: Scenario, facts: &VmFacts) -> Result<Plan, PlanError> {
        match scenario {
            Scenario::OciNetworkd => {
                if facts.nics.is_empty() {
                    return Err(PlanError::invalid_fact("nics", NO_NICS));
                }
                log(
                    LogLevel::Debug,
                    &format!("planning {} NIC(s) for {}", facts.nics.len(), facts.name),
                );
                let mut steps = linux::prelude(facts);
                steps.push(networkd::remove_stale());
                steps.extend(facts.nics.iter().map(networkd::file_for));
                steps.push(networkd::restart());
                // The clone inherited the source VM's ARP entries; dropping
                // them is hygiene, so a guest without `ip` still succeeds.
                steps.push(
                    Step::run(
                        "flush the neighbour cache",
                        Phase::Configure,
                        FLUSH_NEIGHBOURS,
                    )
                    .best_effort(),
                );
                Ok(Plan::posix_sh(steps))
            }
            other => cocoon_fixup_sdk::unsupported(NAME, other),
        }
    }
}

cocoon_fixup_sdk::export_plugin!({{type_name}});

#[cfg(test)]
mod tests {
    use cocoon_fixup_sdk::{
        Action, Backend, BootKind, CONTRACT_VERSION, GuestOs, ImageKind, Ipv4Address, MacAddress,
        Nic, StaticIpv4, WriteFile,
    };

    use super::*;

    const MAC: MacAddress = MacAddress::new([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);

    /// The plan for a clone of flavour [`NAME`] with `nics`.
    fn plan_for(scenario: Scenario, nics: Vec<Nic>) -> Result<Plan, PlanError> {
        let facts = VmFacts {
            name: "web-0".into(),
            id: "vm-0123abcd".into(),
            backend: Backend::CloudHypervisor,
            os: GuestOs::Linux,
            image: ImageKind::Oci,
            boot: BootKind::Clone,
            nics,
            flavor: Some(NAME.into()),
        };
        {{type_name}}::plan(scenario, &facts)
    }

    fn static_nic() -> Nic {
        Nic {
            mac: MAC,
            static_ipv4: Some(StaticIpv4 {
                address: Ipv4Address::new([10, 0, 0, 7]),
                prefix: 24,
                gateway: Some(Ipv4Address::new([10, 0, 0, 1])),
            }),
        }
    }

    #[test]
    fn describe_claims_its_flavours_only() {
        let info = {{type_name}}::describe();
        assert_eq!(info.name, NAME);
        assert_eq!(info.contract, CONTRACT_VERSION);
        assert_eq!(info.scenarios, vec![Scenario::OciNetworkd]);
        assert_eq!(info.flavors, FLAVORS);
    }

    #[test]
    fn a_static_nic_gets_its_networkd_file_then_the_restart() {
        let plan = plan_for(Scenario::OciNetworkd, vec![static_nic()]).expect("plans");
        let descriptions: Vec<&str> = plan.steps.iter().map(|s| s.description.as_str()).collect();
        assert_eq!(
            descriptions,
            [
                "drop the page cache",
                "set the hostname to web-0",
                "remove stale systemd-networkd files",
                "write the static network file for 52:54:00:12:34:56",
                "restart systemd-networkd",
                "flush the neighbour cache",
            ]
        );
        assert_eq!(
            plan.steps[3].action,
            Action::WriteFile(WriteFile {
                path: "/etc/systemd/network/10-525400123456.network".into(),
                content: "[Match]\nMACAddress=52:54:00:12:34:56\n\n[Network]\nAddress=10.0.0.7/24\nGateway=10.0.0.1\n".into(),
                mode: Some(0o644),
                parents: false,
            })
        );
        assert!(plan.steps[5].best_effort);
    }

    #[test]
    fn a_vm_without_nics_is_an_invalid_fact() {
        let expected = PlanError::invalid_fact("nics", NO_NICS);
        assert_eq!(plan_for(Scenario::OciNetworkd, Vec::new()), Err(expected));
    }

    #[test]
    fn other_scenarios_are_unsupported() {
        let expected = PlanError::unsupported(NAME, Scenario::Cloudimg);
        assert_eq!(
            plan_for(Scenario::Cloudimg, vec![static_nic()]),
            Err(expected)
        );
    }
}
