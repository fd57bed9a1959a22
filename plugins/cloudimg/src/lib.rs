//! Plan plugin for cloud-image guests: make cloud-init configure the clone's
//! network again (spec section 4, cloudimg flavour).
//!
//! Upstream runs `cloud-init clean --logs --seed --configs network && ...`
//! as one shell line. Debian 12's cloud-init 22.4.2 has no `clean --configs`:
//! it exits 2, the `&&` chain skips the whole re-run, and because only the
//! last line's exit code counts the fixup is reported as a success while the
//! guest keeps the old instance id and network. This plan instead:
//!
//! - cleans without `--configs`, which every cloud-init version accepts;
//! - removes the network files `clean --configs network` would remove as a
//!   typed step of its own ([`CLOUD_INIT_NETWORK_FILES`]);
//! - runs each cloud-init stage as a separate required step, so any failure
//!   fails the attempt and the host's error names the stage.
//!
//! It prepares a parent (`prepare`) for the cloud images whose cloud-init
//! renders to systemd-networkd, as its fixup assumes: cloud-init's own
//! network file matches the parent's MAC, which a Cloud Hypervisor clone's
//! new NIC does not have, so the plan adds the file that matches that NIC
//! by its driver, and the one that keeps the parent's static NICs from it
//! ([`networkd::prepare`]). cloud-init is not run: the parent keeps its
//! instance and its network.

use cocoon_fixup_sdk::{
    GuestPolicy, Phase, Plan, PlanError, Plugin, PluginInfo, Scenario, Step, VmFacts, linux,
    networkd,
};

/// The plugin's name, as in its directory.
pub const NAME: &str = "cloudimg";

/// The files cloud-init generates for the network, as cloud-init's own
/// `clean --configs network` deletes them: `GEN_NET_CONFIG_FILES` in
/// canonical/cloud-init `cloudinit/cmd/clean.py`, with
/// `CLOUDINIT_NETPLAN_FILE` (`cloudinit/net/netplan.py`) spelled out. Every
/// entry names cloud-init in its file name, so no administrator's file is
/// touched. The networkd entry is also covered by
/// [`networkd::remove_stale`]; listing it again keeps this list a faithful
/// copy.
pub const CLOUD_INIT_NETWORK_FILES: [&str; 6] = [
    "/etc/netplan/50-cloud-init.yaml",
    "/etc/NetworkManager/conf.d/99-cloud-init.conf",
    "/etc/NetworkManager/conf.d/30-cloud-init-ip6-addr-gen-mode.conf",
    "/etc/NetworkManager/system-connections/cloud-init-*.nmconnection",
    "/etc/systemd/network/10-cloud-init-*.network",
    "/etc/network/interfaces.d/50-cloud-init.cfg",
];

/// The cloud-init commands of the plan, in order: what each does, and its
/// arguments after `cloud-init`.
const CLOUD_INIT_RUNS: [(&str, &[&str]); 4] = [
    (
        "forget the source VM's cloud-init state",
        &["clean", "--logs", "--seed"],
    ),
    ("run cloud-init's local stage", &["init", "--local"]),
    ("run cloud-init's network stage", &["init"]),
    (
        "run cloud-init's config modules",
        &["modules", "--mode=config"],
    ),
];

/// Re-runs cloud-init on a cloned cloud image.
#[derive(Debug)]
pub struct Cloudimg;

impl Plugin for Cloudimg {
    fn describe() -> PluginInfo {
        PluginInfo::new(
            NAME,
            env!("CARGO_PKG_VERSION"),
            "re-runs cloud-init on a cloned cloud image and restarts systemd-networkd",
            vec![Scenario::Cloudimg, Scenario::Prepare],
        )
    }

    /// The hostname, the page-cache knob, networkd's files and restart,
    /// cloud-init's generated network files, the four cloud-init
    /// commands, each with its exact arguments, and for `prepare`
    /// networkd's clone and parent files and reload.
    fn policy() -> GuestPolicy {
        linux::prelude_policy()
            .with(networkd::policy())
            .with(networkd::prepare_policy())
            .removes(CLOUD_INIT_NETWORK_FILES)
            .runs(
                CLOUD_INIT_RUNS
                    .iter()
                    .map(|(_, args)| std::iter::once("cloud-init").chain(args.iter().copied())),
            )
    }

    fn plan(scenario: Scenario, facts: &VmFacts) -> Result<Plan, PlanError> {
        match scenario {
            Scenario::Cloudimg => Ok(Plan::posix_sh(cloudimg_steps(facts))),
            Scenario::Prepare => Ok(Plan::posix_sh(networkd::prepare(&facts.nics))),
            other => cocoon_fixup_sdk::unsupported(NAME, other),
        }
    }
}

cocoon_fixup_sdk::export_plugin!(Cloudimg);

fn cloudimg_steps(facts: &VmFacts) -> Vec<Step> {
    let mut steps = linux::prelude(facts);
    steps.push(networkd::remove_stale());
    steps.push(Step::remove_files(
        "remove cloud-init's generated network configuration",
        Phase::Configure,
        CLOUD_INIT_NETWORK_FILES,
    ));
    steps.extend(
        CLOUD_INIT_RUNS
            .iter()
            .map(|(description, args)| cloud_init(description, args)),
    );
    steps.push(networkd::restart());
    steps
}

fn cloud_init(description: &str, args: &[&str]) -> Step {
    let argv = std::iter::once("cloud-init").chain(args.iter().copied());
    Step::run(description, Phase::Configure, argv)
}

#[cfg(test)]
mod tests {
    use cocoon_fixup_sdk::{
        Action, Backend, BootKind, CONTRACT_VERSION, Dialect, GuestOs, ImageKind, MacAddress, Nic,
        WriteFile,
    };
    use rstest::rstest;

    use super::*;

    fn facts() -> VmFacts {
        VmFacts {
            name: "ci-0".into(),
            id: "vm-ci-0".into(),
            backend: Backend::CloudHypervisor,
            os: GuestOs::Linux,
            image: ImageKind::Cloudimg,
            boot: BootKind::Clone,
            nics: vec![Nic {
                mac: MacAddress::new([0x52, 0x54, 0, 0, 0, 1]),
                static_ipv4: None,
            }],
            flavor: Some("ubuntu".into()),
        }
    }

    fn step(description: &str, phase: Phase, best_effort: bool, action: Action) -> Step {
        Step {
            description: description.into(),
            phase,
            best_effort,
            action,
        }
    }

    fn run(description: &str, argv: &[&str]) -> Step {
        let argv = argv.iter().map(|a| a.to_string()).collect();
        step(description, Phase::Configure, false, Action::Run(argv))
    }

    #[test]
    fn describe_names_the_plugin_and_its_scenario() {
        let info = Cloudimg::describe();
        assert_eq!(info.name, "cloudimg");
        assert_eq!(info.version, "0.1.0");
        assert_eq!(info.contract, CONTRACT_VERSION);
        assert_eq!(info.scenarios, vec![Scenario::Cloudimg, Scenario::Prepare]);
        assert!(info.flavors.is_empty());
        assert!(!info.summary.is_empty() && !info.summary.contains('\n'));
    }

    #[test]
    fn cloudimg_plan_reruns_cloud_init_step_by_step() {
        let expected = Plan {
            dialect: Dialect::PosixSh,
            steps: vec![
                step(
                    "drop the page cache",
                    Phase::Prepare,
                    true,
                    Action::WriteFile(WriteFile {
                        path: "/proc/sys/vm/drop_caches".into(),
                        content: "3\n".into(),
                        mode: None,
                        parents: false,
                    }),
                ),
                step(
                    "set the hostname to ci-0",
                    Phase::Prepare,
                    false,
                    Action::WriteFile(WriteFile {
                        path: "/etc/hostname".into(),
                        content: "ci-0\n".into(),
                        mode: Some(0o644),
                        parents: false,
                    }),
                ),
                step(
                    "remove stale systemd-networkd files",
                    Phase::Configure,
                    false,
                    Action::RemoveFiles(vec!["/etc/systemd/network/10-*.network".into()]),
                ),
                step(
                    "remove cloud-init's generated network configuration",
                    Phase::Configure,
                    false,
                    Action::RemoveFiles(vec![
                        "/etc/netplan/50-cloud-init.yaml".into(),
                        "/etc/NetworkManager/conf.d/99-cloud-init.conf".into(),
                        "/etc/NetworkManager/conf.d/30-cloud-init-ip6-addr-gen-mode.conf".into(),
                        "/etc/NetworkManager/system-connections/cloud-init-*.nmconnection".into(),
                        "/etc/systemd/network/10-cloud-init-*.network".into(),
                        "/etc/network/interfaces.d/50-cloud-init.cfg".into(),
                    ]),
                ),
                run(
                    "forget the source VM's cloud-init state",
                    &["cloud-init", "clean", "--logs", "--seed"],
                ),
                run(
                    "run cloud-init's local stage",
                    &["cloud-init", "init", "--local"],
                ),
                run("run cloud-init's network stage", &["cloud-init", "init"]),
                run(
                    "run cloud-init's config modules",
                    &["cloud-init", "modules", "--mode=config"],
                ),
                run(
                    "restart systemd-networkd",
                    &["systemctl", "restart", "systemd-networkd"],
                ),
            ],
        };
        assert_eq!(Cloudimg::plan(Scenario::Cloudimg, &facts()), Ok(expected));
    }

    #[test]
    fn no_cloud_init_step_uses_configs() {
        let plan = Cloudimg::plan(Scenario::Cloudimg, &facts()).unwrap();
        for step in &plan.steps {
            if let Action::Run(argv) = &step.action {
                assert!(!argv.iter().any(|a| a.starts_with("--configs")), "{step:?}");
            }
        }
    }

    /// A cloud-init parent is prepared without running cloud-init: the
    /// clone and parent files and a reload, nothing removed.
    #[test]
    fn prepare_adds_the_clone_file_and_runs_no_cloud_init() {
        let mut parent = facts();
        parent.boot = BootKind::Parent;
        let plan = Cloudimg::plan(Scenario::Prepare, &parent).expect("a plan");
        assert_eq!(plan, Plan::posix_sh(networkd::prepare(&parent.nics)));
        assert!(
            plan.steps.iter().all(|s| match &s.action {
                Action::Run(argv) => argv[0] != "cloud-init",
                Action::RemoveFiles(_) => false,
                _ => true,
            }),
            "{plan:?}"
        );
    }

    #[test]
    fn every_removed_cloud_init_file_is_named_after_cloud_init() {
        for path in CLOUD_INIT_NETWORK_FILES {
            let file = path.rsplit('/').next().unwrap();
            assert!(file.contains("cloud-init"), "{path}");
        }
    }

    #[rstest]
    #[case(Scenario::OciNetworkd)]
    #[case(Scenario::FcMac)]
    #[case(Scenario::WindowsPnp)]
    #[case(Scenario::DhcpRecovery)]
    fn other_scenarios_are_unsupported(#[case] scenario: Scenario) {
        assert_eq!(
            Cloudimg::plan(scenario, &facts()),
            Err(PlanError::Unsupported(format!(
                "plugin `cloudimg` does not serve scenario `{scenario}`"
            )))
        );
    }
}
