//! A test plugin built against the frozen contract 0.3.0 (`wit/0.3.0/`),
//! with bindings generated directly from it as a plugin of that time was
//! built: it declares a policy with `links`, and plans a `name-link` step,
//! a write with `parents` and a restart, so every 0.3.0 action converts
//! through the host. Flavour `contract-0-3`. It keeps a plugin of 0.3.0
//! under test now that the SDK builds against a later contract: it is
//! never asked to prepare.
//!
//! Never ship it.

/// The one flavour it claims.
pub const FLAVOR: &str = "contract-0-3";

// The generated export glue needs `unsafe`: it is the ABI boundary.
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod bindings {
    wit_bindgen::generate!({ path: "../../../wit/0.3.0", world: "plugin" });

    use cocoon::fixup::policy::GuestPolicy;
    use cocoon::fixup::types::{
        Action, Dialect, LinkName, Phase, Plan, PlanError, Scenario, Step, VmFacts, WriteFile,
    };
    use exports::cocoon::fixup::generator::{Guest, PluginInfo};

    const NETWORK_FILE: &str = "/etc/systemd/network/10-contract-0-3.network";
    const RESTART: [&str; 3] = ["systemctl", "restart", "systemd-networkd"];

    struct Contract03;

    impl Guest for Contract03 {
        fn describe() -> PluginInfo {
            PluginInfo {
                name: super::FLAVOR.into(),
                version: "0.3.0".into(),
                contract: "0.3.0".into(),
                summary: "a plugin of contract 0.3.0 with name-link and parents".into(),
                scenarios: vec![Scenario::OciNetworkd, Scenario::DhcpRecovery],
                flavors: vec![super::FLAVOR.into()],
            }
        }

        fn policy() -> GuestPolicy {
            GuestPolicy {
                writes: vec![NETWORK_FILE.into()],
                removes: Vec::new(),
                runs: vec![RESTART.iter().map(|a| (*a).to_owned()).collect()],
                special_modes: false,
                links: vec!["eth*".into()],
            }
        }

        fn plan(_scenario: Scenario, facts: VmFacts) -> Result<Plan, PlanError> {
            let Some(nic) = facts.nics.first() else {
                return Err(PlanError::Unsupported("no NIC".into()));
            };
            let o = nic.mac.octets;
            let content = format!(
                "[Match]\nMACAddress={:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}\n\n[Network]\nDHCP=yes\n",
                o.0, o.1, o.2, o.3, o.4, o.5
            );
            let step = |description: &str, phase, action| Step {
                description: description.into(),
                phase,
                best_effort: false,
                action,
            };
            Ok(Plan {
                dialect: Dialect::PosixSh,
                steps: vec![
                    step(
                        "name the first NIC eth0",
                        Phase::Link,
                        Action::NameLink(LinkName {
                            mac: nic.mac,
                            name: "eth0".into(),
                        }),
                    ),
                    step(
                        "write the network file",
                        Phase::Configure,
                        Action::WriteFile(WriteFile {
                            path: NETWORK_FILE.into(),
                            content,
                            mode: Some(0o644),
                            parents: true,
                        }),
                    ),
                    step(
                        "restart systemd-networkd",
                        Phase::Configure,
                        Action::Run(RESTART.iter().map(|a| (*a).to_owned()).collect()),
                    ),
                ],
            })
        }
    }

    export!(Contract03);
}
