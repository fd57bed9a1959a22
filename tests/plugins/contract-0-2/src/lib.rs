//! A test plugin built against the frozen contract 0.2.0 (`wit/0.2.0/`),
//! with bindings generated directly from it as a plugin of that time was
//! built: it declares a networkd policy and plans a networkd file and a
//! restart. Flavour `contract-0-2`. It keeps a plugin of 0.2.0 under test
//! now that the SDK builds against a later contract.
//!
//! Never ship it.

/// The one flavour it claims.
pub const FLAVOR: &str = "contract-0-2";

// The generated export glue needs `unsafe`: it is the ABI boundary.
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod bindings {
    wit_bindgen::generate!({ path: "../../../wit/0.2.0", world: "plugin" });

    use cocoon::fixup::policy::GuestPolicy;
    use cocoon::fixup::types::{
        Action, Dialect, Phase, Plan, PlanError, Scenario, Step, VmFacts, WriteFile,
    };
    use exports::cocoon::fixup::generator::{Guest, PluginInfo};

    const NETWORK_FILE: &str = "/etc/systemd/network/10-contract-0-2.network";
    const RESTART: [&str; 3] = ["systemctl", "restart", "systemd-networkd"];

    struct Contract02;

    impl Guest for Contract02 {
        fn describe() -> PluginInfo {
            PluginInfo {
                name: super::FLAVOR.into(),
                version: "0.2.0".into(),
                contract: "0.2.0".into(),
                summary: "a plugin of contract 0.2.0 with a declared policy".into(),
                scenarios: vec![Scenario::OciNetworkd],
                flavors: vec![super::FLAVOR.into()],
            }
        }

        fn policy() -> GuestPolicy {
            GuestPolicy {
                writes: vec![NETWORK_FILE.into()],
                removes: Vec::new(),
                runs: vec![RESTART.iter().map(|a| (*a).to_owned()).collect()],
                special_modes: false,
            }
        }

        fn plan(_scenario: Scenario, facts: VmFacts) -> Result<Plan, PlanError> {
            let o = facts.nics.first().map(|n| n.mac.octets).unwrap_or_default();
            let content = format!(
                "[Match]\nMACAddress={:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}\n\n[Network]\nDHCP=yes\n",
                o.0, o.1, o.2, o.3, o.4, o.5
            );
            let step = |description: &str, action| Step {
                description: description.into(),
                phase: Phase::Configure,
                best_effort: false,
                action,
            };
            Ok(Plan {
                dialect: Dialect::PosixSh,
                steps: vec![
                    step(
                        "write the network file",
                        Action::WriteFile(WriteFile {
                            path: NETWORK_FILE.into(),
                            content,
                            mode: Some(0o644),
                        }),
                    ),
                    step(
                        "restart systemd-networkd",
                        Action::Run(RESTART.iter().map(|a| (*a).to_owned()).collect()),
                    ),
                ],
            })
        }
    }

    export!(Contract02);
}
