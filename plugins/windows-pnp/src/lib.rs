//! Plan plugin for Windows guests: re-enumerate the network devices so the
//! clone's NICs come up cleanly (spec section 4, Windows plan).

use cocoon_fixup_sdk::{
    GuestPolicy, Phase, Plan, PlanError, Plugin, PluginInfo, Scenario, Step, VmFacts,
};

/// The plugin's name, as in its directory.
pub const NAME: &str = "windows-pnp";

/// Disables and re-enables every present network device. `-PresentOnly`
/// matters: ghost devices left by earlier MACs make `Disable-PnpDevice` fail
/// and abort the pipeline.
pub const SCRIPT: &str = "$x=Get-PnpDevice -Class Net -PresentOnly;$x|Disable-PnpDevice -Confirm:$false;$x|Enable-PnpDevice -Confirm:$false";

/// The one command of the plan: [`SCRIPT`] in a PowerShell without a
/// profile.
pub const COMMAND: [&str; 4] = ["powershell", "-nop", "-c", SCRIPT];

/// Re-enumerates a Windows guest's network devices.
#[derive(Debug)]
pub struct WindowsPnp;

impl Plugin for WindowsPnp {
    fn describe() -> PluginInfo {
        PluginInfo::new(
            NAME,
            env!("CARGO_PKG_VERSION"),
            "re-enumerates the present network devices of a Windows guest (Plug and Play)",
            vec![Scenario::WindowsPnp],
        )
    }

    /// [`COMMAND`], exactly: no file, no other program or script.
    fn policy() -> GuestPolicy {
        GuestPolicy::new().runs([COMMAND])
    }

    fn plan(scenario: Scenario, _facts: &VmFacts) -> Result<Plan, PlanError> {
        match scenario {
            Scenario::WindowsPnp => Ok(Plan::powershell(vec![Step::run(
                "re-enumerate present network devices (disable, then enable each)",
                Phase::Configure,
                COMMAND,
            )])),
            other => cocoon_fixup_sdk::unsupported(NAME, other),
        }
    }
}

cocoon_fixup_sdk::export_plugin!(WindowsPnp);

#[cfg(test)]
mod tests {
    use cocoon_fixup_sdk::{
        Action, Backend, BootKind, CONTRACT_VERSION, Dialect, GuestOs, ImageKind, MacAddress, Nic,
    };
    use rstest::rstest;

    use super::*;

    fn facts() -> VmFacts {
        VmFacts {
            name: "win-0".into(),
            id: "vm-win-0".into(),
            backend: Backend::CloudHypervisor,
            os: GuestOs::Windows,
            image: ImageKind::Unknown,
            boot: BootKind::Wake,
            nics: vec![Nic {
                mac: MacAddress::new([0x52, 0x54, 0, 0, 0, 9]),
                static_ipv4: None,
            }],
            flavor: None,
        }
    }

    #[test]
    fn describe_names_the_plugin_and_its_scenario() {
        let info = WindowsPnp::describe();
        assert_eq!(info.name, "windows-pnp");
        assert_eq!(info.version, "0.1.0");
        assert_eq!(info.contract, CONTRACT_VERSION);
        assert_eq!(info.scenarios, vec![Scenario::WindowsPnp]);
        assert!(info.flavors.is_empty());
        assert!(!info.summary.is_empty() && !info.summary.contains('\n'));
    }

    #[test]
    fn one_powershell_step_re_enumerates_present_devices() {
        let expected = Plan {
            dialect: Dialect::Powershell,
            steps: vec![Step {
                description: "re-enumerate present network devices (disable, then enable each)"
                    .into(),
                phase: Phase::Configure,
                best_effort: false,
                action: Action::Run(vec![
                    "powershell".into(),
                    "-nop".into(),
                    "-c".into(),
                    "$x=Get-PnpDevice -Class Net -PresentOnly;$x|Disable-PnpDevice -Confirm:$false;$x|Enable-PnpDevice -Confirm:$false".into(),
                ]),
            }],
        };
        assert_eq!(
            WindowsPnp::plan(Scenario::WindowsPnp, &facts()),
            Ok(expected)
        );
    }

    #[rstest]
    #[case(Scenario::Cloudimg)]
    #[case(Scenario::OciNetworkd)]
    #[case(Scenario::FcMac)]
    #[case(Scenario::DhcpRecovery)]
    fn other_scenarios_are_unsupported(#[case] scenario: Scenario) {
        assert_eq!(
            WindowsPnp::plan(scenario, &facts()),
            Err(PlanError::Unsupported(format!(
                "plugin `windows-pnp` does not serve scenario `{scenario}`"
            )))
        );
    }
}
