//! The plan as domain types, its limits, and its rendering.
//!
//! A plan is what plugins return: ordered, typed steps. This module owns
//! everything that turns it into text, so quoting is done once, here:
//!
//! - [`Plan::check`]: limits and structural rules, applied to every plan a
//!   plugin returns before anything renders it;
//! - [`compose`]: several plugins' plans in one, ordered by [`Phase`];
//! - [`render_exec`]: the argv after `cocoon vm exec <id> --`, one exec per
//!   attempt, with step markers on stderr so a failure names its step;
//!   [`exec_argv`] adds each exec's [`Nonce`] to it;
//! - [`render_script`]: the hint a person pastes into the guest (POSIX sh
//!   or PowerShell) that stops at the first failing step;
//! - [`attribute_failure`]: reads the markers back out of a failed exec.
//!
//! The rendering functions assume a plan that passed [`Plan::check`]; they
//! never fail, and they quote every string so that it reaches the guest
//! byte for byte, whatever it contains.
//!
//! # JSON
//!
//! The types serialise (for `--json` output) as the WIT contract names them:
//!
//! ```json
//! {"dialect": "posix-sh", "steps": [
//!   {"description": "Write the hostname", "phase": "prepare", "best_effort": false,
//!    "write_file": {"path": "/etc/hostname", "content": "vm-1\n", "mode": "0644"}},
//!   {"description": "Restart networkd", "phase": "configure", "best_effort": false,
//!    "run": ["systemctl", "restart", "systemd-networkd"]},
//!   {"description": "Remove stale files", "phase": "configure", "best_effort": false,
//!    "remove_files": ["/etc/systemd/network/10-*.network"]},
//!   {"description": "Name the primary NIC", "phase": "link", "best_effort": false,
//!    "name_link": {"mac": "52:54:00:12:34:56", "name": "eth0"}}
//! ]}
//! ```
//!
//! `dialect` is `posix-sh` or `powershell`; `phase` is `prepare`, `link` or
//! `configure`; a step carries exactly one of `run`, `write_file`,
//! `remove_files` and `name_link`; `mode` is an octal string of at least
//! four digits (`"0644"`), or `null` when the step leaves the mode alone; a
//! write that creates missing parent directories carries `"parents": true`
//! (absent means false); a MAC is lowercase and colon-separated.
//!
//! The same JSON reads back ([`Plan`] is `Deserialize`, unknown fields
//! refused), so an embedder can hand a reported plan back for an attempt;
//! a plan read back is unchecked until [`Plan::check`] says otherwise.
//!
//! # Marker protocol
//!
//! The script of [`render_exec`] writes marker lines to stderr, and
//! [`attribute_failure`] reads them back. Each marker is a line of its own,
//! written with a line break before it (so the stderr of a step that does
//! not end its last line cannot glue onto it) and one after it:
//!
//! ```text
//! cocoon-fixup: <nonce> step <n>/<total> start               before step n runs
//! cocoon-fixup: <nonce> step <n>/<total> failed exit <code>  step n failed; the script exits <code>
//! cocoon-fixup: <nonce> step <n>/<total> ignored exit <code> best-effort step n failed; the script goes on
//! cocoon-fixup: <nonce> done                                  every step ran
//! ```
//!
//! `<nonce>` is the exec's [`Nonce`]: 32 lowercase hex digits (128 bits
//! from the OS random number generator), drawn for each exec and passed to
//! the script as an argument by [`exec_argv`] (`sh -c <script> sh <nonce>`,
//! or the PowerShell script block's argument), never written into the
//! script's text: no guest program knows it before the exec starts, and the
//! rendered script is one text for every exec of a plan. A marker-like line
//! with another nonce or none (a guest program's forgery) is ordinary
//! stderr, and an exit 0 without the done marker of the exec's nonce is a
//! failed attempt ([`ran_to_completion`]).
//!
//! `<n>` counts from 1; `<code>` is the step's exit status, never 0. A
//! trailing `\r` is ignored (PowerShell on Windows ends lines with `\r\n`).
//! Markers whose `<total>` is not the plan's are not ours and count as
//! output. A plan rendered in the direct form (one run step, see
//! [`render_exec`]) has no markers and takes no nonce. The hint
//! ([`render_script`]) writes no markers either: a person reads it, and it
//! runs by hand with no argument.

mod attribute;
mod check;
mod marker;
mod nonce;
pub mod policy;
mod render;
#[cfg(test)]
mod shell_tests;

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::facts::MacAddr;

pub use attribute::{
    STDERR_TAIL_MAX, StderrTail, StepFailure, attribute_failure, ran_to_completion,
};
pub use check::{
    DESCRIPTION_MAX, Field, IFNAME_MAX, MAX_EXEC_ARG, MAX_HINT, MAX_WINDOWS_COMMAND_LINE,
    PlanError, PlanLimits, Problem, SH_SPECIAL_BUILTINS, check_interface_name, check_rendered,
    windows_command_line_len,
};
pub use nonce::{NONCE_HEX_LEN, Nonce, NonceError};
pub use render::{
    ScriptHeader, done_marker, exec_argv, exec_nonce, hint_base64, ps_quote, render_exec,
    render_script, sh_quote, sh_words,
};

/// The shell a plan targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dialect {
    #[serde(rename = "posix-sh")]
    PosixSh,
    #[serde(rename = "powershell")]
    PowerShell,
}

impl Dialect {
    /// The name used in JSON output and the WIT contract.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::PosixSh => "posix-sh",
            Dialect::PowerShell => "powershell",
        }
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a step belongs when plans from several plugins are composed.
/// Ordered: prepare < link < configure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Prepare,
    Link,
    Configure,
}

impl Phase {
    /// The name used in JSON output and the WIT contract.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Prepare => "prepare",
            Phase::Link => "link",
            Phase::Configure => "configure",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Write a file byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteFile {
    pub path: String,
    pub content: String,
    /// Permission bits to set after writing; `None` leaves them (files
    /// under /proc). Serialised as an octal string such as `"0644"`, or
    /// `null`. PowerShell plans ignore it: Windows has no mode bits.
    #[serde(
        serialize_with = "serialize_mode",
        deserialize_with = "deserialize_mode"
    )]
    pub mode: Option<u32>,
    /// Create missing parent directories first (`mkdir -p`); without it a
    /// missing parent fails the step. Serialised only when true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub parents: bool,
}

/// Give the NIC whose MAC is `mac` the interface name `name` and bring it
/// up (contract 0.3.0 `name-link`). [`Plan::check`] requires a valid Linux
/// interface name and a POSIX sh plan; [`Plan::check_nics`] requires one of
/// the VM's own MACs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameLink {
    #[serde(serialize_with = "serialize_mac", deserialize_with = "deserialize_mac")]
    pub mac: MacAddr,
    pub name: String,
}

/// What a step does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepAction {
    /// Run a program; `argv[0]` is looked up on PATH.
    Run(Vec<String>),
    WriteFile(WriteFile),
    /// Remove files if they exist; `*` in the last component is a wildcard.
    RemoveFiles(Vec<String>),
    NameLink(NameLink),
}

/// One step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub description: String,
    pub phase: Phase,
    pub best_effort: bool,
    /// Serialised flat: the step object carries one of `run`, `write_file`,
    /// `remove_files` and `name_link`.
    #[serde(flatten)]
    pub action: StepAction,
}

/// An ordered list of steps in one dialect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub dialect: Dialect,
    pub steps: Vec<Step>,
}

impl Plan {
    /// What the plan's steps write to
    /// [`HOSTNAME_PATH`](crate::facts::HOSTNAME_PATH), one trailing newline
    /// taken off each: the hostname step (spec section 4, step 2) writes
    /// the VM name, which must then be a hostname, and anything else
    /// written there must be one too.
    pub fn hostnames_written(&self) -> impl Iterator<Item = &str> {
        self.steps.iter().filter_map(|step| match &step.action {
            StepAction::WriteFile(w) if w.path == crate::facts::HOSTNAME_PATH => {
                Some(w.content.strip_suffix('\n').unwrap_or(&w.content))
            }
            _ => None,
        })
    }

    /// The total length in bytes of every string in the plan: descriptions,
    /// argv, paths, file contents, remove patterns and interface names
    /// (with 17 for each MAC, as written). This is what
    /// [`PlanLimits::max_bytes`] bounds.
    pub fn text_bytes(&self) -> usize {
        self.steps.iter().map(Step::text_bytes).sum()
    }
}

impl Step {
    /// The total length in bytes of the step's strings (see
    /// [`Plan::text_bytes`]).
    pub fn text_bytes(&self) -> usize {
        let action = match &self.action {
            StepAction::Run(argv) => argv.iter().map(String::len).sum(),
            StepAction::WriteFile(w) => w.path.len() + w.content.len(),
            StepAction::RemoveFiles(paths) => paths.iter().map(String::len).sum(),
            StepAction::NameLink(l) => MAC_TEXT_LEN + l.name.len(),
        };
        self.description.len() + action
    }
}

/// Compose the plans of several plugins into one: the steps of every part
/// in order, then stably sorted by [`Phase`], so each part keeps its own
/// order within a phase. A Firecracker clone runs `fc-mac` (link steps)
/// with a network flavour (prepare and configure steps): the flavour's
/// prepare steps run first, then the MAC repair, then the configuration.
///
/// All parts must share a dialect. The result is not checked: run
/// [`Plan::check`] on it, since the limits apply to the whole.
pub fn compose(parts: Vec<Plan>) -> Result<Plan, PlanError> {
    let mut parts = parts.into_iter();
    let first = parts.next().ok_or(PlanError::NothingToCompose)?;
    let dialect = first.dialect;
    let mut steps = first.steps;
    for (i, part) in parts.enumerate() {
        if part.dialect != dialect {
            return Err(PlanError::MixedDialects {
                part: i + 2,
                expected: dialect,
                found: part.dialect,
            });
        }
        steps.extend(part.steps);
    }
    // `sort_by_key` is stable.
    steps.sort_by_key(|s| s.phase);
    Ok(Plan { dialect, steps })
}

/// Bytes of a MAC as text: `52:54:00:12:34:56`.
const MAC_TEXT_LEN: usize = 17;

fn serialize_mac<S: Serializer>(mac: &MacAddr, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(mac)
}

fn deserialize_mac<'de, D: Deserializer<'de>>(d: D) -> Result<MacAddr, D::Error> {
    let text = String::deserialize(d)?;
    MacAddr::parse(&text).map_err(serde::de::Error::custom)
}

/// A mode as the octal string `chmod` takes: at least four digits.
fn format_mode(mode: u32) -> String {
    format!("{mode:04o}")
}

fn serialize_mode<S: Serializer>(mode: &Option<u32>, s: S) -> Result<S::Ok, S::Error> {
    match mode {
        Some(m) => s.serialize_str(&format_mode(*m)),
        None => s.serialize_none(),
    }
}

/// The octal string of [`format_mode`] back to bits: four to six octal
/// digits, nothing else.
fn deserialize_mode<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    let Some(text) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    let octal = (4..=6).contains(&text.len()) && text.bytes().all(|b| matches!(b, b'0'..=b'7'));
    match octal.then(|| u32::from_str_radix(&text, 8)) {
        Some(Ok(mode)) => Ok(Some(mode)),
        _ => Err(serde::de::Error::custom(format!(
            "mode {text:?} is not an octal string such as \"0644\""
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_serialises_as_the_contract_names_it() {
        let plan = Plan {
            dialect: Dialect::PosixSh,
            steps: vec![
                Step {
                    description: "Drop the page cache".into(),
                    phase: Phase::Prepare,
                    best_effort: true,
                    action: StepAction::WriteFile(WriteFile {
                        path: "/proc/sys/vm/drop_caches".into(),
                        content: "3\n".into(),
                        mode: None,
                        parents: false,
                    }),
                },
                Step {
                    description: "Write the hostname".into(),
                    phase: Phase::Prepare,
                    best_effort: false,
                    action: StepAction::WriteFile(WriteFile {
                        path: "/etc/hostname".into(),
                        content: "vm-1\n".into(),
                        mode: Some(0o644),
                        parents: false,
                    }),
                },
                Step {
                    description: "Set the MAC".into(),
                    phase: Phase::Link,
                    best_effort: false,
                    action: StepAction::Run(vec!["ip".into(), "link".into()]),
                },
                Step {
                    description: "Remove stale files".into(),
                    phase: Phase::Configure,
                    best_effort: false,
                    action: StepAction::RemoveFiles(vec![
                        "/etc/systemd/network/10-*.network".into(),
                    ]),
                },
            ],
        };
        let json = serde_json::to_string(&plan).unwrap();
        assert_eq!(
            json,
            concat!(
                r#"{"dialect":"posix-sh","steps":["#,
                r#"{"description":"Drop the page cache","phase":"prepare","best_effort":true,"#,
                r#""write_file":{"path":"/proc/sys/vm/drop_caches","content":"3\n","mode":null}},"#,
                r#"{"description":"Write the hostname","phase":"prepare","best_effort":false,"#,
                r#""write_file":{"path":"/etc/hostname","content":"vm-1\n","mode":"0644"}},"#,
                r#"{"description":"Set the MAC","phase":"link","best_effort":false,"#,
                r#""run":["ip","link"]},"#,
                r#"{"description":"Remove stale files","phase":"configure","best_effort":false,"#,
                r#""remove_files":["/etc/systemd/network/10-*.network"]}]}"#,
            )
        );
        let ps = serde_json::to_string(&Dialect::PowerShell).unwrap();
        assert_eq!(ps, r#""powershell""#);
        // It reads back to the same plan.
        let back: Plan = serde_json::from_str(&json).unwrap();
        assert_eq!(back, plan);
    }

    #[test]
    fn name_link_and_parents_serialise_and_read_back() {
        let plan = Plan {
            dialect: Dialect::PosixSh,
            steps: vec![
                Step {
                    description: "Name the NIC".into(),
                    phase: Phase::Link,
                    best_effort: false,
                    action: StepAction::NameLink(NameLink {
                        mac: MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x56]),
                        name: "eth0".into(),
                    }),
                },
                Step {
                    description: "Write interfaces".into(),
                    phase: Phase::Configure,
                    best_effort: false,
                    action: StepAction::WriteFile(WriteFile {
                        path: "/etc/network/interfaces".into(),
                        content: "auto lo\n".into(),
                        mode: Some(0o644),
                        parents: true,
                    }),
                },
            ],
        };
        let json = serde_json::to_string(&plan).unwrap();
        assert_eq!(
            json,
            concat!(
                r#"{"dialect":"posix-sh","steps":["#,
                r#"{"description":"Name the NIC","phase":"link","best_effort":false,"#,
                r#""name_link":{"mac":"52:54:00:12:34:56","name":"eth0"}},"#,
                r#"{"description":"Write interfaces","phase":"configure","best_effort":false,"#,
                r#""write_file":{"path":"/etc/network/interfaces","content":"auto lo\n","mode":"0644","parents":true}}]}"#,
            )
        );
        let back: Plan = serde_json::from_str(&json).unwrap();
        assert_eq!(back, plan);
        assert_eq!(plan.text_bytes(), 12 + 17 + 4 + 16 + 23 + 8);
        // A MAC no NIC can have is refused on the way back in.
        let multicast = json.replace("52:54:00:12:34:56", "01:00:5e:00:00:01");
        assert!(serde_json::from_str::<Plan>(&multicast).is_err());
    }

    /// A plan read back refuses what it cannot mean: bad modes, unknown
    /// fields, a step with no action.
    #[test]
    fn plans_read_back_strictly() {
        let step = |write: &str| {
            format!(
                r#"{{"dialect":"posix-sh","steps":[{{"description":"d","phase":"prepare","best_effort":false,"write_file":{write}}}]}}"#
            )
        };
        let read = |json: &str| serde_json::from_str::<Plan>(json);
        let ok = read(&step(r#"{"path":"/a","content":"","mode":"4755"}"#)).unwrap();
        let StepAction::WriteFile(w) = &ok.steps[0].action else {
            panic!("{ok:?}")
        };
        assert_eq!(w.mode, Some(0o4755));
        for mode in [r#""644""#, r#""0648""#, r#""+0644""#, "420", r#""0o644""#] {
            let err = read(&step(&format!(
                r#"{{"path":"/a","content":"","mode":{mode}}}"#
            )));
            assert!(err.is_err(), "{mode} was taken");
        }
        assert!(
            read(&step(
                r#"{"path":"/a","content":"","mode":null,"owner":"x"}"#
            ))
            .is_err()
        );
        assert!(read(r#"{"dialect":"posix-sh","steps":[],"extra":1}"#).is_err());
        assert!(read(r#"{"dialect":"posix-sh","steps":[{"description":"d","phase":"prepare","best_effort":false}]}"#).is_err());
        assert!(read(r#"{"dialect":"bash","steps":[]}"#).is_err());
    }

    fn tagged(tag: &str, phase: Phase) -> Step {
        Step {
            description: tag.into(),
            phase,
            best_effort: false,
            action: StepAction::Run(vec!["true".into()]),
        }
    }

    fn tags(plan: &Plan) -> Vec<&str> {
        plan.steps.iter().map(|s| s.description.as_str()).collect()
    }

    #[test]
    fn compose_orders_by_phase_and_keeps_each_parts_order() {
        use Phase::*;
        let fc_mac = Plan {
            dialect: Dialect::PosixSh,
            steps: vec![
                tagged("mac0-down", Link),
                tagged("mac0-set", Link),
                tagged("mac0-up", Link),
            ],
        };
        let flavour = Plan {
            dialect: Dialect::PosixSh,
            steps: vec![
                tagged("cache", Prepare),
                tagged("hostname", Prepare),
                tagged("rm", Configure),
                tagged("write", Configure),
                tagged("restart", Configure),
            ],
        };
        let extra = Plan {
            dialect: Dialect::PosixSh,
            steps: vec![
                tagged("late", Configure),
                tagged("early", Prepare),
                tagged("mid", Link),
            ],
        };
        let plan = compose(vec![fc_mac, flavour, extra]).unwrap();
        assert_eq!(plan.dialect, Dialect::PosixSh);
        assert_eq!(
            tags(&plan),
            [
                "cache",
                "hostname",
                "early",
                "mac0-down",
                "mac0-set",
                "mac0-up",
                "mid",
                "rm",
                "write",
                "restart",
                "late",
            ]
        );
    }

    #[test]
    fn compose_of_one_plan_sorts_it() {
        use Phase::*;
        let only = Plan {
            dialect: Dialect::PowerShell,
            steps: vec![tagged("b", Configure), tagged("a", Prepare)],
        };
        let plan = compose(vec![only]).unwrap();
        assert_eq!(plan.dialect, Dialect::PowerShell);
        assert_eq!(tags(&plan), ["a", "b"]);
    }

    #[test]
    fn compose_refuses_mixed_dialects_and_nothing() {
        let sh = Plan {
            dialect: Dialect::PosixSh,
            steps: vec![],
        };
        let ps = Plan {
            dialect: Dialect::PowerShell,
            steps: vec![],
        };
        let err = compose(vec![sh.clone(), sh, ps]).unwrap_err();
        assert_eq!(
            err,
            PlanError::MixedDialects {
                part: 3,
                expected: Dialect::PosixSh,
                found: Dialect::PowerShell
            }
        );
        assert_eq!(
            err.to_string(),
            "plan 3 is powershell but plan 1 is posix-sh: compose plans of one dialect"
        );
        assert_eq!(compose(vec![]), Err(PlanError::NothingToCompose));
    }

    #[test]
    fn mode_is_four_octal_digits_or_more() {
        assert_eq!(format_mode(0o644), "0644");
        assert_eq!(format_mode(0o4755), "4755");
        assert_eq!(format_mode(0), "0000");
    }

    #[test]
    fn text_bytes_counts_every_string() {
        let plan = Plan {
            dialect: Dialect::PosixSh,
            steps: vec![
                Step {
                    description: "ab".into(),
                    phase: Phase::Prepare,
                    best_effort: false,
                    action: StepAction::Run(vec!["ip".into(), "ü".into()]),
                },
                Step {
                    description: "c".into(),
                    phase: Phase::Prepare,
                    best_effort: false,
                    action: StepAction::WriteFile(WriteFile {
                        path: "/x".into(),
                        content: "yyy".into(),
                        mode: Some(0o600),
                        parents: false,
                    }),
                },
                Step {
                    description: "d".into(),
                    phase: Phase::Prepare,
                    best_effort: false,
                    action: StepAction::RemoveFiles(vec!["/a/b".into(), "/c/*".into()]),
                },
            ],
        };
        assert_eq!(plan.text_bytes(), (2 + 2 + 2) + (1 + 2 + 3) + (1 + 4 + 4));
    }
}
