//! A test plugin built against the frozen contract 0.1.0 (`wit/0.1.0/`),
//! with bindings generated directly from it as a plugin of that time was
//! built. It cannot declare a guest policy, so the host holds it to the
//! default policy of 0.1.0. Flavour `legacy`; the VM name picks the plan:
//!
//! | name     | plan                                                  |
//! |----------|-------------------------------------------------------|
//! | `shadow` | writes `/etc/shadow`: outside the default policy       |
//! | `shell`  | runs `sh -c ...`: outside the default policy           |
//! | other    | a networkd file and a restart: inside it               |
//!
//! Never ship it.

/// The one flavour it claims.
pub const FLAVOR: &str = "legacy";

// The generated export glue needs `unsafe`: it is the ABI boundary.
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod bindings {
    wit_bindgen::generate!({ path: "../../../wit/0.1.0", world: "plugin" });

    use cocoon::fixup::types::{
        Action, Dialect, Phase, Plan, PlanError, Scenario, Step, VmFacts, WriteFile,
    };
    use exports::cocoon::fixup::generator::{Guest, PluginInfo};

    struct Legacy;

    fn step(description: &str, action: Action) -> Step {
        Step {
            description: description.into(),
            phase: Phase::Configure,
            best_effort: false,
            action,
        }
    }

    fn write(path: &str, content: &str) -> Action {
        Action::WriteFile(WriteFile {
            path: path.into(),
            content: content.into(),
            mode: Some(0o644),
        })
    }

    impl Guest for Legacy {
        fn describe() -> PluginInfo {
            PluginInfo {
                name: "legacy".into(),
                version: "0.1.0".into(),
                contract: "0.1.0".into(),
                summary: "a plugin of contract 0.1.0, under its default policy".into(),
                scenarios: vec![Scenario::OciNetworkd],
                flavors: vec![super::FLAVOR.into()],
            }
        }

        fn plan(_scenario: Scenario, facts: VmFacts) -> Result<Plan, PlanError> {
            let steps = match facts.name.as_str() {
                "shadow" => vec![step(
                    "write a password file",
                    write("/etc/shadow", "root::0:0:99999:7:::\n"),
                )],
                "shell" => vec![step(
                    "run a script",
                    Action::Run(vec!["sh".into(), "-c".into(), "true".into()]),
                )],
                _ => vec![
                    step(
                        "write the network file",
                        write(
                            "/etc/systemd/network/10-legacy.network",
                            "[Match]\nName=eth0\n\n[Network]\nDHCP=yes\n",
                        ),
                    ),
                    step(
                        "restart systemd-networkd",
                        Action::Run(vec![
                            "systemctl".into(),
                            "restart".into(),
                            "systemd-networkd".into(),
                        ]),
                    ),
                ],
            };
            Ok(Plan {
                dialect: Dialect::PosixSh,
                steps,
            })
        }
    }

    export!(Legacy);
}
