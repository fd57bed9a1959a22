//! Constructors for what a plugin returns: steps, plans, errors, its
//! description.
//!
//! Every step starts out required (a failure fails the attempt);
//! [`Step::best_effort`] is the one way to relax that, so it stands out where
//! a plan uses it.

use crate::{
    Action, CONTRACT_VERSION, Dialect, InvalidFact, LinkName, MacAddress, Phase, Plan, PlanError,
    PluginInfo, Scenario, Step, WriteFile,
};

impl Step {
    /// Runs a program: `argv[0]` is looked up on the guest's PATH, and no
    /// argument is ever interpreted by a shell.
    pub fn run<S: Into<String>>(
        description: impl Into<String>,
        phase: Phase,
        argv: impl IntoIterator<Item = S>,
    ) -> Self {
        Self::required(
            description,
            phase,
            Action::Run(argv.into_iter().map(Into::into).collect()),
        )
    }

    /// Writes `content` byte for byte to the absolute `path`, replacing the
    /// file, then sets `mode` (octal permission bits) when given. Files under
    /// `/proc` and `/sys` need `None`. A missing parent directory fails the
    /// step: [`Step::with_parents`] creates them first.
    pub fn write_file(
        description: impl Into<String>,
        phase: Phase,
        path: impl Into<String>,
        content: impl Into<String>,
        mode: Option<u32>,
    ) -> Self {
        Self::required(
            description,
            phase,
            Action::WriteFile(WriteFile {
                path: path.into(),
                content: content.into(),
                mode,
                parents: false,
            }),
        )
    }

    /// Makes the NIC whose MAC is `mac` carry the interface name `name` and
    /// brings it up (phase `link`). The host renders it: it finds the NIC
    /// by its MAC, renames it if it has another name and sets it up, and
    /// fails the step if no interface has the MAC or another one has the
    /// name. `mac` must be one of the VM's NICs, and the policy's
    /// [`links`](crate::GuestPolicy::links) must allow `name`.
    ///
    /// The description names `name` only when it is a plain interface name
    /// (1 to 15 ASCII letters, digits, `-`, `_` or `.`, not starting with
    /// `-` or `.`), so the host's check of a bad name reports it as
    /// `name_link.name`, not as a bad description.
    pub fn name_link(mac: MacAddress, name: impl Into<String>) -> Self {
        let name = name.into();
        let description = if is_plain_interface_name(&name) {
            format!("name the NIC {mac} {name} and bring it up")
        } else {
            format!("name the NIC {mac} and bring it up")
        };
        Self::required(
            description,
            Phase::Link,
            Action::NameLink(LinkName { mac, name }),
        )
    }

    /// Makes a `write_file` step create the file's missing parent
    /// directories first (mode 0755 before umask). Any other step is
    /// returned unchanged.
    #[must_use]
    pub fn with_parents(mut self) -> Self {
        if let Action::WriteFile(w) = &mut self.action {
            w.parents = true;
        }
        self
    }

    /// Removes files if they exist. Each entry is an absolute path whose last
    /// component may contain `*` wildcards; nothing else is special.
    pub fn remove_files<S: Into<String>>(
        description: impl Into<String>,
        phase: Phase,
        paths: impl IntoIterator<Item = S>,
    ) -> Self {
        Self::required(
            description,
            phase,
            Action::RemoveFiles(paths.into_iter().map(Into::into).collect()),
        )
    }

    /// Marks the step best-effort: it may fail without failing the attempt.
    #[must_use]
    pub fn best_effort(mut self) -> Self {
        self.best_effort = true;
        self
    }

    fn required(description: impl Into<String>, phase: Phase, action: Action) -> Self {
        Self {
            description: description.into(),
            phase,
            best_effort: false,
            action,
        }
    }
}

impl Plan {
    /// A plan for a Linux guest; the host renders it as POSIX sh.
    pub fn posix_sh(steps: Vec<Step>) -> Self {
        Self {
            dialect: Dialect::PosixSh,
            steps,
        }
    }

    /// A plan for a Windows guest; the host renders it as PowerShell.
    pub fn powershell(steps: Vec<Step>) -> Self {
        Self {
            dialect: Dialect::Powershell,
            steps,
        }
    }
}

impl PlanError {
    /// `plugin` does not serve `scenario`.
    pub fn unsupported(plugin: &str, scenario: Scenario) -> Self {
        Self::Unsupported(format!(
            "plugin `{plugin}` does not serve scenario `{scenario}`"
        ))
    }

    /// The fact at `field` (a path into `vm-facts`, for example
    /// `nics[1].mac`) is outside what the plugin accepts, because `reason`.
    pub fn invalid_fact(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidFacts(InvalidFact {
            field: field.into(),
            reason: reason.into(),
        })
    }
}

/// `Err(PlanError::unsupported(plugin, scenario))`, for the catch-all arm of
/// a plugin's `match scenario`.
pub fn unsupported<T>(plugin: &str, scenario: Scenario) -> Result<T, PlanError> {
    Err(PlanError::unsupported(plugin, scenario))
}

impl PluginInfo {
    /// A description for the current contract ([`CONTRACT_VERSION`]) that
    /// serves any guest flavour; narrow it with [`PluginInfo::with_flavors`].
    /// `version` is the plugin's own semver, usually
    /// `env!("CARGO_PKG_VERSION")`.
    pub fn new(
        name: impl Into<String>,
        version: impl Into<String>,
        summary: impl Into<String>,
        scenarios: Vec<Scenario>,
    ) -> Self {
        Self {
            name: name.into(),
            version: version.into(),
            contract: CONTRACT_VERSION.to_owned(),
            summary: summary.into(),
            scenarios,
            flavors: Vec::new(),
        }
    }

    /// Serves only the listed guest flavours (the
    /// `vm.cocoonstack.io/guest-flavor` values).
    #[must_use]
    pub fn with_flavors<S: Into<String>>(mut self, flavors: impl IntoIterator<Item = S>) -> Self {
        self.flavors = flavors.into_iter().map(Into::into).collect();
        self
    }
}

/// A name the host's check takes as an interface name (see
/// [`Step::name_link`]).
fn is_plain_interface_name(name: &str) -> bool {
    (1..=15).contains(&name.len())
        && !name.starts_with(['-', '.'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_collects_argv_and_is_required() {
        let step = Step::run("say hi", Phase::Configure, ["echo", "hi there"]);
        assert_eq!(
            step,
            Step {
                description: "say hi".into(),
                phase: Phase::Configure,
                best_effort: false,
                action: Action::Run(vec!["echo".into(), "hi there".into()]),
            }
        );
    }

    #[test]
    fn write_file_keeps_content_and_mode() {
        let step = Step::write_file("write", Phase::Prepare, "/etc/x", "a'b%c\n", Some(0o600));
        assert_eq!(
            step,
            Step {
                description: "write".into(),
                phase: Phase::Prepare,
                best_effort: false,
                action: Action::WriteFile(WriteFile {
                    path: "/etc/x".into(),
                    content: "a'b%c\n".into(),
                    mode: Some(0o600),
                    parents: false,
                }),
            }
        );
    }

    #[test]
    fn with_parents_sets_the_flag_of_a_write_only() {
        let write = Step::write_file("w", Phase::Configure, "/etc/network/interfaces", "", None);
        let Action::WriteFile(w) = write.with_parents().action else {
            panic!("a write stays a write")
        };
        assert!(w.parents);
        let run = Step::run("r", Phase::Configure, ["true"]);
        assert_eq!(run.clone().with_parents(), run);
    }

    #[test]
    fn name_link_is_a_required_link_step() {
        let mac = MacAddress {
            octets: (0x52, 0x54, 0, 0xaa, 0xbb, 0x01),
        };
        let step = Step::name_link(mac, "eth0");
        assert_eq!(
            step,
            Step {
                description: "name the NIC 52:54:00:aa:bb:01 eth0 and bring it up".into(),
                phase: Phase::Link,
                best_effort: false,
                action: Action::NameLink(LinkName {
                    mac,
                    name: "eth0".into()
                }),
            }
        );
    }

    #[test]
    fn name_link_keeps_a_bad_name_out_of_the_description() {
        let mac = MacAddress {
            octets: (0x52, 0x54, 0, 0xaa, 0xbb, 0x01),
        };
        for bad in ["eth\n0", "", ".eth0", "-x", "abcdefghijklmnop", "eth 0"] {
            let step = Step::name_link(mac, bad);
            assert_eq!(
                step.description, "name the NIC 52:54:00:aa:bb:01 and bring it up",
                "{bad:?}"
            );
            assert_eq!(
                step.action,
                Action::NameLink(LinkName {
                    mac,
                    name: bad.into()
                })
            );
        }
    }

    #[test]
    fn remove_files_collects_paths() {
        let step = Step::remove_files("clean", Phase::Link, ["/a/1-*.x", "/b"]);
        assert_eq!(
            step.action,
            Action::RemoveFiles(vec!["/a/1-*.x".into(), "/b".into()])
        );
        assert_eq!(step.phase, Phase::Link);
        assert!(!step.best_effort);
    }

    #[test]
    fn best_effort_only_flips_the_flag() {
        let required = Step::run("maybe", Phase::Prepare, ["false"]);
        let relaxed = required.clone().best_effort();
        assert!(relaxed.best_effort);
        assert_eq!(
            Step {
                best_effort: false,
                ..relaxed
            },
            required
        );
    }

    #[test]
    fn plans_carry_their_dialect() {
        assert_eq!(Plan::posix_sh(Vec::new()).dialect, Dialect::PosixSh);
        assert_eq!(Plan::powershell(Vec::new()).dialect, Dialect::Powershell);
    }

    #[test]
    fn unsupported_names_plugin_and_scenario() {
        assert_eq!(
            PlanError::unsupported("fc-mac", Scenario::DhcpRecovery),
            PlanError::Unsupported(
                "plugin `fc-mac` does not serve scenario `dhcp-recovery`".into()
            )
        );
        assert_eq!(
            unsupported::<Plan>("x", Scenario::Cloudimg),
            Err(PlanError::unsupported("x", Scenario::Cloudimg))
        );
    }

    #[test]
    fn invalid_fact_carries_field_and_reason() {
        assert_eq!(
            PlanError::invalid_fact("nics[0].static-ipv4.prefix", "must be 0..=32"),
            PlanError::InvalidFacts(InvalidFact {
                field: "nics[0].static-ipv4.prefix".into(),
                reason: "must be 0..=32".into(),
            })
        );
    }

    #[test]
    fn plugin_info_fills_contract_and_any_flavor() {
        let info = PluginInfo::new("n", "1.2.3", "does n", vec![Scenario::FcMac]);
        assert_eq!(
            info,
            PluginInfo {
                name: "n".into(),
                version: "1.2.3".into(),
                contract: CONTRACT_VERSION.into(),
                summary: "does n".into(),
                scenarios: vec![Scenario::FcMac],
                flavors: Vec::new(),
            }
        );
        assert_eq!(info.with_flavors(["rhel"]).flavors, vec!["rhel".to_owned()]);
    }
}
