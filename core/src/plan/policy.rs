//! Guest-side policy: what a plugin's plans may do inside the guest.
//!
//! A plugin of contract 0.2.0 or later declares a [`GuestPolicy`] (the `policy`
//! export); a plugin of contract 0.1.0, which cannot, gets
//! [`GuestPolicy::contract_0_1_default`]. The operator may narrow either per
//! plugin in the configuration file. Every plan a plugin returns is checked
//! against both ([`GuestPolicy::check`]) before anything renders or runs it:
//! a step outside them fails the plan with a [`Breach`] naming the step and
//! the rule.
//!
//! # Patterns
//!
//! A path pattern is an absolute, normalised path. Its components are
//! literal, except that `*` matches any run of characters other than `/`
//! within one component, and a last component of `**` matches one or more
//! further components. Nothing else is special.
//!
//! A `remove-files` entry may itself end in a component with `*`. It is
//! allowed when the entry, its `*` taken as an ordinary character, matches a
//! pattern. That is sound: a pattern never matches a `*` literally, so the
//! entry's `*` was matched by a pattern `*` (which also matches whatever the
//! guest's shell expands it to, `/` never being part of the expansion) or
//! by a `**`.
//!
//! # Runs
//!
//! A run rule is an argument vector matched element by element and exactly,
//! except that a last element `*` matches any further arguments (none
//! included). `["systemctl", "restart", "systemd-networkd"]` allows that one
//! command; `["cloud-init", "*"]` allows cloud-init with any arguments.
//!
//! # Links
//!
//! A link pattern is an interface name in which `*` matches any run of
//! characters: `eth*` allows a `name-link` step to name a NIC `eth0` or
//! `eth10`. The MAC of such a step is not the policy's business: it must be
//! one of the VM's own NICs whatever the policy ([`Plan::check_nics`]).
//!
//! A run step that renames an interface (an `ip` command with a `name` or
//! `altname` argument, whatever the run rule that allows it) is held to the
//! same patterns: the new name must match one, so a contract 0.1.0 plugin
//! under its default (no links) renames nothing. Names the guest gives a
//! meaning of their own ([`RESERVED_LINK_NAMES`]: `lo`, `all`, `default`,
//! `bonding_masters`) are never a target, whatever the patterns.
//!
//! [`Plan::check_nics`]: super::Plan::check_nics

use std::fmt;

use serde::Serialize;

use super::check::{IFNAME_MAX, check_path, visible_line};
use super::{Plan, Problem, StepAction};

/// Entries a policy may list, per kind. A real policy needs a handful.
pub const MAX_RULES: usize = 64;
/// Elements of one run rule.
pub const MAX_RUN_ARGS: usize = 64;
/// Bytes of one pattern or run element.
pub const MAX_RULE_BYTES: usize = 4096;

/// Interface names no step may give a NIC, whatever the links patterns:
/// the loopback (which firewalls trust by name) and names the kernel's
/// sysctl and bonding directories hold for themselves.
pub const RESERVED_LINK_NAMES: &[&str] = &["lo", "all", "default", "bonding_masters"];

/// The name `argv` gives an interface when it is an `ip` command that
/// renames one (`... name NEW` or `... altname NEW`, anywhere after the
/// program), however the program is spelled (`ip`, `/sbin/ip`).
pub fn ip_rename_target(argv: &[String]) -> Option<&str> {
    let program = argv.first()?;
    if program.rsplit('/').next() != Some("ip") {
        return None;
    }
    argv.windows(2)
        .skip(1)
        .find(|pair| pair[0] == "name" || pair[0] == "altname")
        .map(|pair| pair[1].as_str())
}

/// Mode bits a `write-file` may set without [`GuestPolicy::special_modes`].
pub const PLAIN_MODE_BITS: u32 = 0o755;

/// A path pattern (see the module docs), checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct PathPattern(String);

impl PathPattern {
    pub fn parse(text: &str) -> Result<Self, Problem> {
        check_path(text)?;
        visible_line(text)?;
        if text.len() > MAX_RULE_BYTES {
            return Err(Problem::RuleTooLong {
                len: text.len(),
                max: MAX_RULE_BYTES,
            });
        }
        let components: Vec<&str> = text[1..].split('/').collect();
        let (_, dirs) = components.split_last().expect("split yields one at least");
        if dirs.contains(&"**") {
            return Err(Problem::DeepWildcardNotLast);
        }
        if components.iter().any(|c| *c != "**" && c.contains("**")) {
            return Err(Problem::DeepWildcardNotAlone);
        }
        Ok(PathPattern(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Does the path (or a remove entry, its `*` taken literally) match?
    /// Both are checked absolute and normalised paths.
    pub fn matches(&self, path: &str) -> bool {
        let (Some(pattern), Some(path)) = (self.0.strip_prefix('/'), path.strip_prefix('/')) else {
            return false;
        };
        let mut pattern = pattern.split('/');
        let mut path = path.split('/');
        loop {
            match (pattern.next(), path.next()) {
                (Some("**"), Some(_)) => return true,
                (Some(p), Some(c)) if component_matches(p, c) => {}
                (None, None) => return true,
                _ => return false,
            }
        }
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One component against one pattern component: `*` matches any run of
/// characters, everything else itself.
fn component_matches(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().expect("split yields one at least");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// An interface name pattern (see the module docs), checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct LinkPattern(String);

impl LinkPattern {
    pub fn parse(text: &str) -> Result<Self, Problem> {
        let fixed = text.bytes().filter(|b| *b != b'*').count();
        let reason = if text.is_empty() {
            "it is empty"
        } else if !text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'*'))
        {
            "it has a character other than a letter, a digit, `-`, `_`, `.` or `*`"
        } else if text.starts_with('-') {
            "it starts with `-`, and no interface name does"
        } else if text.starts_with('.') {
            "it starts with `.`, and no interface name does"
        } else if fixed > IFNAME_MAX {
            "it has more than 15 characters besides `*`, so no interface name matches it"
        } else {
            return Ok(LinkPattern(text.to_owned()));
        };
        Err(Problem::LinkPattern(reason))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn matches(&self, name: &str) -> bool {
        component_matches(&self.0, name)
    }
}

impl fmt::Display for LinkPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One run rule (see the module docs), checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct RunRule(Vec<String>);

impl RunRule {
    pub fn parse(argv: &[String]) -> Result<Self, Problem> {
        // `["*"]` alone allows every command; `*` as the program of a
        // longer rule means nothing.
        if argv.is_empty() || argv[0].is_empty() || (argv[0] == "*" && argv.len() > 1) {
            return Err(Problem::EmptyProgram);
        }
        if argv.len() > MAX_RUN_ARGS {
            return Err(Problem::RuleTooLong {
                len: argv.len(),
                max: MAX_RUN_ARGS,
            });
        }
        for arg in argv {
            if arg.len() > MAX_RULE_BYTES {
                return Err(Problem::RuleTooLong {
                    len: arg.len(),
                    max: MAX_RULE_BYTES,
                });
            }
            if arg.contains('\0') {
                return Err(Problem::Nul);
            }
            visible_line(arg)?;
        }
        Ok(RunRule(argv.to_vec()))
    }

    pub fn argv(&self) -> &[String] {
        &self.0
    }

    /// Whether a trailing `*` leaves the arguments open.
    pub fn open_ended(&self) -> bool {
        self.0.last().is_some_and(|a| a == "*")
    }

    pub fn matches(&self, argv: &[String]) -> bool {
        if self.open_ended() {
            let fixed = &self.0[..self.0.len() - 1];
            argv.len() >= fixed.len() && argv[..fixed.len()] == *fixed
        } else {
            argv == self.0.as_slice()
        }
    }

    /// A rule that leaves arguments open to a program that is not known
    /// to stay within bounds with any arguments: the host cannot tell what
    /// such a program does (a shell, `dhclient -sf SCRIPT`, `systemctl
    /// start debug-shell`, ...), so the rule bounds nothing. Shown as a
    /// warning by `plugin inspect`. Exact rules are never flagged: the
    /// whole command is there to read.
    pub fn is_unbounded(&self) -> bool {
        if !self.open_ended() {
            return false;
        }
        let fixed = &self.0[..self.0.len() - 1];
        let Some((program, args)) = fixed.split_first() else {
            return true;
        };
        // The program by name, or by its absolute path in a directory of
        // root's PATH (`/usr/sbin/ip`).
        let named = |name: &str| {
            program == name
                || ROOT_PATH
                    .iter()
                    .any(|dir| program.strip_prefix(dir).is_some_and(|rest| rest == name))
        };
        !BOUNDED_OPEN_PREFIXES.iter().any(|prefix| {
            named(prefix[0])
                && args.len() >= prefix.len() - 1
                && args.iter().zip(prefix[1..].iter()).all(|(a, b)| a == b)
        })
    }
}

/// Commands whose remaining arguments cannot make them run other code or
/// touch files: an open rule that starts with one of these is not flagged.
const BOUNDED_OPEN_PREFIXES: &[&[&str]] = &[
    &["ip", "link", "set"],
    &["ip", "address", "add"],
    &["ip", "address", "del"],
    &["ip", "address", "flush"],
    &["ip", "addr", "add"],
    &["ip", "addr", "del"],
    &["ip", "addr", "flush"],
    &["ip", "route", "add"],
    &["ip", "route", "del"],
    &["ip", "route", "replace"],
    &["ip", "neigh", "flush"],
    &["nmcli", "--wait"],
    &["nmcli", "connection", "up"],
    &["nmcli", "connection", "down"],
    &["networkctl", "reload"],
    &["networkctl", "reconfigure"],
];

/// Where a written file can run code as root or let someone log in: a
/// write pattern that can match this file, or anything below this
/// directory (a trailing `/`), is warned about ([`GuestPolicy::warnings`]).
/// Windows locations are compared without regard to case, as the guest
/// resolves them.
pub const WRITE_SENSITIVE: &[&str] = &[
    // Accounts, credentials and who may be root.
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/passwd",
    "/etc/group",
    "/etc/sudoers",
    "/etc/sudoers.d/",
    "/etc/pam.d/",
    "/etc/security/",
    "/etc/ssh/",
    "/root/",
    "/home/",
    // Code run at login, at boot, on a schedule, by a service manager.
    "/etc/profile",
    "/etc/profile.d/",
    "/etc/bash.bashrc",
    "/etc/environment",
    "/etc/rc.local",
    "/etc/rc.d/",
    "/etc/init.d/",
    "/etc/init/",
    "/etc/inittab",
    "/etc/crontab",
    "/etc/cron.d/",
    "/etc/cron.hourly/",
    "/etc/cron.daily/",
    "/etc/cron.weekly/",
    "/etc/cron.monthly/",
    "/var/spool/cron/",
    "/etc/systemd/system/",
    "/etc/systemd/user/",
    "/etc/systemd/system.conf",
    "/run/systemd/system/",
    "/lib/systemd/",
    "/usr/lib/systemd/",
    "/etc/xdg/autostart/",
    "/etc/cloud/",
    // Code run by the network stack, or by device and kernel events.
    "/etc/NetworkManager/dispatcher.d/",
    "/etc/network/interfaces",
    "/etc/network/interfaces.d/",
    "/etc/network/if-up.d/",
    "/etc/network/if-down.d/",
    "/etc/network/if-pre-up.d/",
    "/etc/network/if-post-down.d/",
    "/etc/networkd-dispatcher/",
    "/etc/dhcp/",
    "/etc/sysconfig/network-scripts/",
    "/etc/sysconfig/network/",
    "/etc/wicked/",
    "/etc/udev/",
    "/lib/udev/",
    "/usr/lib/udev/",
    "/etc/sysctl.conf",
    "/etc/sysctl.d/",
    "/usr/lib/sysctl.d/",
    "/proc/sys/kernel/",
    "/etc/modprobe.d/",
    "/lib/modprobe.d/",
    "/usr/lib/modprobe.d/",
    "/etc/ld.so.preload",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d/",
    // Programs and libraries (root's PATH among them) and the kernel.
    "/bin/",
    "/sbin/",
    "/usr/bin/",
    "/usr/sbin/",
    "/usr/local/bin/",
    "/usr/local/sbin/",
    "/lib/",
    "/lib64/",
    "/usr/lib/",
    "/usr/lib64/",
    "/usr/local/lib/",
    "/boot/",
    // Windows: the system, and programs run at logon.
    "/Windows/",
    "/ProgramData/Microsoft/Windows/Start Menu/",
    "/Users/",
];

/// What a removed file can turn back on (logins, root's sessions): a
/// remove pattern that can match it, or anything below a directory (a
/// trailing `/`), is warned about.
pub const REMOVE_SENSITIVE: &[&str] = &[
    "/etc/nologin",
    "/etc/ssh/",
    "/etc/pam.d/",
    "/etc/security/",
    "/etc/sudoers.d/",
    "/etc/shadow",
    "/etc/passwd",
    "/root/",
    "/home/",
];

/// Directories on root's PATH: a write pattern that covers one can place a
/// program there that a run step naming a bare program would run.
const ROOT_PATH: &[&str] = &[
    "/usr/local/sbin/",
    "/usr/local/bin/",
    "/usr/sbin/",
    "/usr/bin/",
    "/sbin/",
    "/bin/",
];

/// Whether `pattern` can match the file `location`, or (a location ending
/// in `/`) any path below that directory. Windows locations compare
/// without regard to case.
fn can_cover(pattern: &PathPattern, location: &str) -> bool {
    let windows = ["/Windows/", "/ProgramData/", "/Users/"]
        .iter()
        .any(|w| location.starts_with(w));
    let fold = |s: &str| {
        if windows {
            s.to_ascii_lowercase()
        } else {
            s.to_owned()
        }
    };
    let (pattern_text, location) = (fold(pattern.as_str()), fold(location));
    let Some(dir) = location.strip_suffix('/') else {
        return PathPattern(pattern_text).matches(&location);
    };
    let (Some(pattern), Some(dir)) = (pattern_text.strip_prefix('/'), dir.strip_prefix('/')) else {
        return false;
    };
    let mut pattern = pattern.split('/');
    for c in dir.split('/') {
        match pattern.next() {
            Some("**") => return true,
            Some(p) if component_matches(p, c) => {}
            _ => return false,
        }
    }
    // Something below the directory: any further component matches some
    // name.
    pattern.next().is_some()
}

impl fmt::Display for RunRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, arg) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            let simple = !arg.is_empty()
                && arg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=:@,+*".contains(&b));
            if simple {
                f.write_str(arg)?;
            } else {
                write!(f, "{:?}", crate::facts::escape_controls(arg))?;
            }
        }
        Ok(())
    }
}

/// What a plugin's plans may do in the guest.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct GuestPolicy {
    pub writes: Vec<PathPattern>,
    pub removes: Vec<PathPattern>,
    pub runs: Vec<RunRule>,
    pub special_modes: bool,
    /// Interface names `name-link` steps may give (contract 0.3.0).
    pub links: Vec<LinkPattern>,
}

/// A policy as declared, before it is checked: from a plugin or the
/// configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    #[serde(default)]
    pub writes: Vec<String>,
    #[serde(default)]
    pub removes: Vec<String>,
    #[serde(default)]
    pub runs: Vec<Vec<String>>,
    #[serde(default)]
    pub special_modes: bool,
    #[serde(default)]
    pub links: Vec<String>,
}

/// A policy entry that is not well formed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct PolicyError {
    /// `writes[2]`, `runs[0]` and so on.
    pub field: String,
    pub problem: Problem,
}

impl GuestPolicy {
    /// Check every entry of a declared policy.
    pub fn parse(raw: &RawPolicy) -> Result<Self, PolicyError> {
        fn patterns(kind: &str, list: &[String]) -> Result<Vec<PathPattern>, PolicyError> {
            too_many(kind, list.len())?;
            list.iter()
                .enumerate()
                .map(|(i, p)| {
                    PathPattern::parse(p).map_err(|problem| PolicyError {
                        field: format!("{kind}[{i}]"),
                        problem,
                    })
                })
                .collect()
        }
        fn too_many(kind: &str, len: usize) -> Result<(), PolicyError> {
            if len > MAX_RULES {
                return Err(PolicyError {
                    field: kind.to_owned(),
                    problem: Problem::RuleTooLong {
                        len,
                        max: MAX_RULES,
                    },
                });
            }
            Ok(())
        }
        too_many("runs", raw.runs.len())?;
        let runs = raw
            .runs
            .iter()
            .enumerate()
            .map(|(i, argv)| {
                RunRule::parse(argv).map_err(|problem| PolicyError {
                    field: format!("runs[{i}]"),
                    problem,
                })
            })
            .collect::<Result<_, _>>()?;
        too_many("links", raw.links.len())?;
        let links = raw
            .links
            .iter()
            .enumerate()
            .map(|(i, p)| {
                LinkPattern::parse(p).map_err(|problem| PolicyError {
                    field: format!("links[{i}]"),
                    problem,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(GuestPolicy {
            writes: patterns("writes", &raw.writes)?,
            removes: patterns("removes", &raw.removes)?,
            runs,
            special_modes: raw.special_modes,
            links,
        })
    }

    /// The policy of a plugin built against contract 0.1.0, which cannot
    /// declare one: what the plugins of that time did, and nothing a
    /// program could stretch into running other code. Writes: networkd's
    /// `10-*.network` files, NetworkManager keyfiles, netplan YAML, the
    /// hostname and the page-cache knob; removes: the same and cloud-init's
    /// generated network files; runs: the networkd restart, the four
    /// cloud-init stages with their exact arguments, `ip link set dev ...`,
    /// `nmcli connection reload`, `nmcli --wait ...`, `netplan apply` and
    /// `netplan generate`, `sync`, and the Windows re-enumeration command;
    /// modes within 0o755.
    pub fn contract_0_1_default() -> Self {
        const CONFIG: &[&str] = &[
            "/etc/systemd/network/10-*.network",
            "/etc/NetworkManager/system-connections/*.nmconnection",
            "/etc/netplan/*.yaml",
        ];
        const WRITES_ALSO: &[&str] = &["/etc/hostname", "/proc/sys/vm/drop_caches"];
        const REMOVES_ALSO: &[&str] = &[
            "/etc/NetworkManager/conf.d/99-cloud-init.conf",
            "/etc/NetworkManager/conf.d/30-cloud-init-ip6-addr-gen-mode.conf",
            "/etc/network/interfaces.d/50-cloud-init.cfg",
        ];
        const WINDOWS_PNP: &str = "$x=Get-PnpDevice -Class Net -PresentOnly;$x|Disable-PnpDevice -Confirm:$false;$x|Enable-PnpDevice -Confirm:$false";
        const RUNS: &[&[&str]] = &[
            &["systemctl", "restart", "systemd-networkd"],
            &["cloud-init", "clean", "--logs", "--seed"],
            &["cloud-init", "init", "--local"],
            &["cloud-init", "init"],
            &["cloud-init", "modules", "--mode=config"],
            &["ip", "link", "set", "dev", "*"],
            &["nmcli", "connection", "reload"],
            &["nmcli", "--wait", "*"],
            &["netplan", "apply"],
            &["netplan", "generate"],
            &["sync"],
            &["powershell", "-nop", "-c", WINDOWS_PNP],
        ];
        let strings = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let raw = RawPolicy {
            writes: strings(&[CONFIG, WRITES_ALSO].concat()),
            removes: strings(&[CONFIG, REMOVES_ALSO].concat()),
            runs: RUNS.iter().map(|argv| strings(argv)).collect(),
            special_modes: false,
            links: Vec::new(),
        };
        GuestPolicy::parse(&raw).expect("the built-in default policy is well formed")
    }

    /// The first step of `plan` this policy does not allow.
    pub fn check(&self, plan: &Plan) -> Result<(), Breach> {
        for (i, step) in plan.steps.iter().enumerate() {
            let breach = |rule: Rule| Breach { step: i + 1, rule };
            match &step.action {
                StepAction::Run(argv) => {
                    if !self.runs.iter().any(|r| r.matches(argv)) {
                        return Err(breach(Rule::Run(argv.clone())));
                    }
                    if let Some(name) = ip_rename_target(argv)
                        && !self.may_name(name)
                    {
                        return Err(breach(Rule::Rename(name.to_owned())));
                    }
                }
                // `parents` creates only ancestors of the allowed path.
                StepAction::WriteFile(w) => {
                    if !self.writes.iter().any(|p| p.matches(&w.path)) {
                        return Err(breach(Rule::Write(w.path.clone())));
                    }
                    if let Some(mode) = w.mode
                        && mode & !PLAIN_MODE_BITS != 0
                        && !self.special_modes
                    {
                        return Err(breach(Rule::Mode {
                            path: w.path.clone(),
                            mode,
                        }));
                    }
                }
                StepAction::RemoveFiles(entries) => {
                    for entry in entries {
                        if !self.removes.iter().any(|p| p.matches(entry)) {
                            return Err(breach(Rule::Remove(entry.clone())));
                        }
                    }
                }
                StepAction::NameLink(l) => {
                    if !self.may_name(&l.name) {
                        return Err(breach(Rule::Link {
                            mac: l.mac.to_string(),
                            name: l.name.clone(),
                        }));
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether a step may give an interface `name`: a links pattern
    /// matches it, and it is no reserved name.
    fn may_name(&self, name: &str) -> bool {
        !RESERVED_LINK_NAMES.contains(&name) && self.links.iter().any(|p| p.matches(name))
    }

    /// Run rules that leave arguments open to a program not known to stay
    /// within bounds ([`RunRule::is_unbounded`]).
    pub fn unbounded_runs(&self) -> impl Iterator<Item = &RunRule> {
        self.runs.iter().filter(|r| r.is_unbounded())
    }

    /// What a reviewer must look at twice, one sentence each: open run
    /// rules of unbounded programs, write or remove patterns that cover a
    /// file through which a plugin could run code or log in, and links
    /// patterns that start with `*` (so they allow names of any prefix,
    /// such as a name the guest's firewall trusts).
    pub fn warnings(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .unbounded_runs()
            .map(|rule| {
                format!(
                    "`{rule}` leaves the arguments open: the host cannot bound what that program does with them, so this rule may run any code in the guest"
                )
            })
            .collect();
        for (kind, patterns, sensitive, why) in [
            (
                "write",
                &self.writes,
                WRITE_SENSITIVE,
                "through such a file a plugin can run code as root or let someone log in",
            ),
            (
                "remove",
                &self.removes,
                REMOVE_SENSITIVE,
                "removing such a file can turn logins or root's access back on",
            ),
        ] {
            for pattern in patterns {
                if let Some(location) = sensitive.iter().find(|l| can_cover(pattern, l)) {
                    out.push(format!(
                        "{kind} pattern {pattern} covers {}: {why}",
                        shown_location(location)
                    ));
                }
            }
        }
        // A bounded rule's program is only the guest's own while no write
        // can put another in its place: by name, anywhere on root's PATH;
        // by absolute path, that file.
        for rule in self
            .runs
            .iter()
            .filter(|r| r.open_ended() && !r.is_unbounded())
        {
            let program = &rule.argv()[0];
            let replaceable = if program.starts_with('/') {
                self.writes
                    .iter()
                    .any(|w| can_cover(w, program))
                    .then(|| program.clone())
            } else {
                ROOT_PATH
                    .iter()
                    .find(|dir| self.writes.iter().any(|w| can_cover(w, dir)))
                    .map(|dir| format!("{}, on root's PATH", shown_location(dir)))
            };
            if let Some(place) = replaceable {
                out.push(format!(
                    "`{rule}` is bounded only while `{program}` is the guest's own program, and a write pattern covers {place}: a plugin may put a program of its own there and run it as root through this rule; name the program by an absolute path no write covers, or drop the write"
                ));
            }
        }
        for pattern in self.links.iter().filter(|p| p.as_str().starts_with('*')) {
            out.push(format!(
                "links pattern {pattern} matches any name ending in its fixed part: a plugin may give the VM's NIC a name the guest trusts by name (a firewall zone's interface, wg0, docker0), which changes how its traffic is treated"
            ));
        }
        out
    }
}

/// A location as a warning names it: a directory as "anything below".
fn shown_location(location: &str) -> String {
    match location.strip_suffix('/') {
        Some(dir) => format!("files below {dir}"),
        None => location.to_owned(),
    }
}

/// Where a plugin's policy comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicySource {
    /// The plugin declared it (contract 0.2.0 and later).
    Declared,
    /// The plugin's contract cannot declare one: the host's default for it.
    ContractDefault,
}

impl fmt::Display for PolicySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PolicySource::Declared => "its declared policy",
            PolicySource::ContractDefault => "the default policy of its contract version",
        })
    }
}

/// A step a policy does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("step {step} {rule}")]
pub struct Breach {
    /// Counts from 1.
    pub step: usize,
    pub rule: Rule,
}

/// What the step wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    Run(Vec<String>),
    Write(String),
    Remove(String),
    Mode {
        path: String,
        mode: u32,
    },
    Link {
        mac: String,
        name: String,
    },
    /// A run step renames an interface to this name.
    Rename(String),
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |s: &str| crate::facts::escape_controls(&s[..s.floor_char_boundary(200)]);
        match self {
            Rule::Run(argv) => {
                let shown_argv = RunRule(argv.iter().take(8).map(|a| shown(a)).collect());
                let more = if argv.len() > 8 { " ..." } else { "" };
                write!(f, "runs `{shown_argv}{more}`, which no run rule allows")
            }
            Rule::Write(path) => write!(f, "writes {}, which no write pattern allows", shown(path)),
            Rule::Remove(entry) => {
                write!(
                    f,
                    "removes {}, which no remove pattern allows",
                    shown(entry)
                )
            }
            Rule::Mode { path, mode } => write!(
                f,
                "sets mode {mode:04o} on {}, beyond 0755, without special-modes",
                shown(path)
            ),
            Rule::Link { mac, name } if RESERVED_LINK_NAMES.contains(&name.as_str()) => write!(
                f,
                "names the NIC {mac} {}, a name the guest reserves, which no step may give",
                shown(name)
            ),
            Rule::Link { mac, name } => write!(
                f,
                "names the NIC {mac} {}, which no links pattern allows",
                shown(name)
            ),
            Rule::Rename(name) if RESERVED_LINK_NAMES.contains(&name.as_str()) => write!(
                f,
                "renames an interface to {}, a name the guest reserves, which no step may give",
                shown(name)
            ),
            Rule::Rename(name) => write!(
                f,
                "renames an interface to {}, which no links pattern allows",
                shown(name)
            ),
        }
    }
}

impl fmt::Display for GuestPolicy {
    /// One entry per line under its kind, indented, for `plugin inspect`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list<T: fmt::Display>(
            f: &mut fmt::Formatter<'_>,
            kind: &str,
            items: &[T],
        ) -> fmt::Result {
            if items.is_empty() {
                return writeln!(f, "  {kind:<8} (none)");
            }
            for (i, item) in items.iter().enumerate() {
                writeln!(f, "  {:<8} {item}", if i == 0 { kind } else { "" })?;
            }
            Ok(())
        }
        list(f, "writes", &self.writes)?;
        list(f, "removes", &self.removes)?;
        list(f, "runs", &self.runs)?;
        list(f, "links", &self.links)?;
        let modes = if self.special_modes {
            "any (special-modes)"
        } else {
            "within 0755"
        };
        writeln!(f, "  {:<8} {modes}", "modes")
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;
    use crate::plan::{Dialect, Phase, Step, WriteFile};

    fn pattern(p: &str) -> PathPattern {
        PathPattern::parse(p).unwrap()
    }

    #[rstest]
    #[case("/etc/hostname", "/etc/hostname", true)]
    #[case("/etc/hostname", "/etc/hostnamex", false)]
    #[case("/etc/systemd/network/*", "/etc/systemd/network/10-a.network", true)]
    #[case("/etc/systemd/network/*", "/etc/systemd/network/a/b", false)]
    #[case("/etc/systemd/network/*", "/etc/systemd/network", false)]
    #[case(
        "/etc/systemd/network/10-*.network",
        "/etc/systemd/network/10-a.network",
        true
    )]
    #[case(
        "/etc/systemd/network/10-*.network",
        "/etc/systemd/network/10-.network",
        true
    )]
    #[case(
        "/etc/systemd/network/10-*.network",
        "/etc/systemd/network/10.network",
        false
    )]
    #[case(
        "/etc/systemd/network/10-*.network",
        "/etc/systemd/network/20-a.network",
        false
    )]
    #[case("/etc/a*b*c", "/etc/abc", true)]
    #[case("/etc/a*b*c", "/etc/aXbYbZc", true)]
    #[case("/etc/a*b*c", "/etc/acb", false)]
    #[case("/etc/*ab*ab", "/etc/ab", false)]
    #[case("/etc/*ab*ab", "/etc/abab", true)]
    #[case("/etc/netplan/**", "/etc/netplan/a", true)]
    #[case("/etc/netplan/**", "/etc/netplan/a/b/c", true)]
    #[case("/etc/netplan/**", "/etc/netplan", false)]
    #[case("/etc/netplan/**", "/etc/netplanx/a", false)]
    #[case("/etc/*/x", "/etc/a/x", true)]
    #[case("/etc/*/x", "/etc/a/b/x", false)]
    fn patterns_match(#[case] p: &str, #[case] path: &str, #[case] matches: bool) {
        assert_eq!(pattern(p).matches(path), matches, "{p} vs {path}");
    }

    /// A remove entry's `*` is taken literally; a match means every
    /// expansion matches too. Checked here by expanding the entry's `*`
    /// into several strings without `/`.
    #[rstest]
    #[case(
        "/etc/systemd/network/*.network",
        "/etc/systemd/network/10-*.network",
        true
    )]
    #[case(
        "/etc/systemd/network/10-*.network",
        "/etc/systemd/network/*.network",
        false
    )]
    #[case("/etc/systemd/network/10-*", "/etc/systemd/network/10-*.network", true)]
    #[case("/etc/systemd/network/10-a*", "/etc/systemd/network/10-*", false)]
    #[case("/etc/netplan/**", "/etc/netplan/*", true)]
    #[case("/etc/x?", "/etc/x*", false)]
    fn remove_entries_match_soundly(#[case] p: &str, #[case] entry: &str, #[case] allowed: bool) {
        let p = pattern(p);
        assert_eq!(p.matches(entry), allowed, "{p} vs {entry}");
        if allowed {
            for fill in ["", "a", "10-b.network", "x*y", "**"] {
                let expanded = entry.replace('*', fill);
                assert!(
                    p.matches(&expanded),
                    "{p} allowed {entry} but not {expanded}"
                );
            }
        }
    }

    #[rstest]
    #[case("etc/x", Problem::NotAbsolute)]
    #[case("/etc/../shadow", Problem::ParentComponent)]
    #[case("/etc//x", Problem::NotNormalised)]
    #[case("/etc/**/x", Problem::DeepWildcardNotLast)]
    #[case("/etc/a**", Problem::DeepWildcardNotAlone)]
    #[case("/etc/\u{202e}x", Problem::FormatChar)]
    #[case("/etc/\rx", Problem::ControlChar)]
    fn bad_patterns_are_refused(#[case] p: &str, #[case] problem: Problem) {
        assert_eq!(PathPattern::parse(p), Err(problem));
    }

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[rstest]
    #[case(&["systemctl", "restart", "systemd-networkd"], &["systemctl", "restart", "systemd-networkd"], true)]
    #[case(&["systemctl", "restart", "systemd-networkd"], &["systemctl", "restart", "systemd-networkd", "sshd"], false)]
    #[case(&["systemctl", "restart", "systemd-networkd"], &["systemctl", "restart"], false)]
    #[case(&["cloud-init", "*"], &["cloud-init"], true)]
    #[case(&["cloud-init", "*"], &["cloud-init", "init", "--local"], true)]
    #[case(&["cloud-init", "*"], &["cloud-initx"], false)]
    #[case(&["ip", "link", "set", "*"], &["ip", "netns", "exec", "x", "sh"], false)]
    #[case(&["echo", "a*"], &["echo", "abc"], false)]
    #[case(&["echo", "a*"], &["echo", "a*"], true)]
    fn run_rules_match(#[case] rule: &[&str], #[case] run: &[&str], #[case] matches: bool) {
        let rule = RunRule::parse(&argv(rule)).unwrap();
        assert_eq!(rule.matches(&argv(run)), matches, "{rule} vs {run:?}");
    }

    #[rstest]
    #[case(&["sh", "*"], true)]
    #[case(&["/bin/bash", "*"], true)]
    #[case(&["python3.11", "*"], true)]
    #[case(&["PowerShell.exe", "-c", "*"], true)]
    #[case(&["powershell", "-nop", "-c", "Get-NetAdapter"], false)]
    #[case(&["systemctl", "restart", "*"], true)]
    #[case(&["dhclient", "*"], true)]
    #[case(&["udevadm", "*"], true)]
    #[case(&["cloud-init", "*"], true)]
    #[case(&["stdbuf", "*"], true)]
    #[case(&["sh"], false)]
    #[case(&["ip", "*"], true)]
    #[case(&["ip", "netns", "*"], true)]
    #[case(&["ip", "-s", "*"], true)]
    #[case(&["ip", "link", "*"], true)]
    #[case(&["ip", "link", "set", "*"], false)]
    #[case(&["ip", "link", "set", "dev", "*"], false)]
    #[case(&["nmcli", "--wait", "*"], false)]
    fn unbounded_rules_are_recognised(#[case] rule: &[&str], #[case] unbounded: bool) {
        assert_eq!(
            RunRule::parse(&argv(rule)).unwrap().is_unbounded(),
            unbounded
        );
    }

    #[test]
    fn run_rules_need_a_program() {
        assert_eq!(RunRule::parse(&[]), Err(Problem::EmptyProgram));
        assert_eq!(
            RunRule::parse(&argv(&["*", "x"])),
            Err(Problem::EmptyProgram)
        );
        let anything = RunRule::parse(&argv(&["*"])).unwrap();
        assert!(anything.matches(&argv(&["curl", "x"])) && anything.is_unbounded());
        assert_eq!(
            RunRule::parse(&argv(&["x", "a\u{1b}[2J"])),
            Err(Problem::ControlChar)
        );
    }

    fn plan(steps: Vec<StepAction>) -> Plan {
        Plan {
            dialect: Dialect::PosixSh,
            steps: steps
                .into_iter()
                .map(|action| Step {
                    description: "step".into(),
                    phase: Phase::Configure,
                    best_effort: false,
                    action,
                })
                .collect(),
        }
    }

    fn write(path: &str, mode: Option<u32>) -> StepAction {
        StepAction::WriteFile(WriteFile {
            path: path.into(),
            content: "x".into(),
            mode,
            parents: false,
        })
    }

    fn with_parents(action: StepAction) -> StepAction {
        match action {
            StepAction::WriteFile(w) => StepAction::WriteFile(WriteFile { parents: true, ..w }),
            other => other,
        }
    }

    const MAC: crate::facts::MacAddr = crate::facts::MacAddr([0x52, 0x54, 0, 0xaa, 0xbb, 0x01]);

    fn name_link(name: &str) -> StepAction {
        StepAction::NameLink(crate::plan::NameLink {
            mac: MAC,
            name: name.into(),
        })
    }

    fn networkd_policy() -> GuestPolicy {
        GuestPolicy::parse(&RawPolicy {
            writes: argv(&["/etc/systemd/network/10-*.network", "/etc/hostname"]),
            removes: argv(&["/etc/systemd/network/10-*.network"]),
            runs: vec![argv(&["systemctl", "restart", "systemd-networkd"])],
            special_modes: false,
            links: argv(&["eth*", "lan"]),
        })
        .unwrap()
    }

    #[rstest]
    #[case(write("/etc/shadow", Some(0o644)), Rule::Write("/etc/shadow".into()))]
    #[case(write("/root/.ssh/authorized_keys", None), Rule::Write("/root/.ssh/authorized_keys".into()))]
    #[case(write("/etc/hostname", Some(0o4777)), Rule::Mode { path: "/etc/hostname".into(), mode: 0o4777 })]
    #[case(write("/etc/hostname", Some(0o666)), Rule::Mode { path: "/etc/hostname".into(), mode: 0o666 })]
    #[case(StepAction::RemoveFiles(argv(&["/etc/*"])), Rule::Remove("/etc/*".into()))]
    #[case(StepAction::RemoveFiles(argv(&["/etc/systemd/network/10-*.network", "/etc/systemd/network/*"])), Rule::Remove("/etc/systemd/network/*".into()))]
    #[case(StepAction::Run(argv(&["curl", "http://x"])), Rule::Run(argv(&["curl", "http://x"])))]
    #[case(StepAction::Run(argv(&["systemctl", "restart", "sshd"])), Rule::Run(argv(&["systemctl", "restart", "sshd"])))]
    #[case(with_parents(write("/etc/shadow", Some(0o644))), Rule::Write("/etc/shadow".into()))]
    #[case(with_parents(write("/etc/systemd/network/x/10-a.network", None)), Rule::Write("/etc/systemd/network/x/10-a.network".into()))]
    #[case(name_link("wlan0"), Rule::Link { mac: MAC.to_string(), name: "wlan0".into() })]
    #[case(name_link("lan0"), Rule::Link { mac: MAC.to_string(), name: "lan0".into() })]
    #[case(name_link("xeth0"), Rule::Link { mac: MAC.to_string(), name: "xeth0".into() })]
    fn breaches_name_step_and_rule(#[case] bad: StepAction, #[case] rule: Rule) {
        let ok = write("/etc/hostname", Some(0o644));
        let err = networkd_policy().check(&plan(vec![ok, bad])).unwrap_err();
        assert_eq!(err, Breach { step: 2, rule });
    }

    #[rstest]
    #[case(write("/etc/systemd/network/10-a.network", Some(0o644)))]
    #[case(write("/etc/hostname", Some(0o600)))]
    #[case(write("/etc/hostname", Some(0o755)))]
    #[case(write("/etc/hostname", None))]
    #[case(StepAction::RemoveFiles(argv(&["/etc/systemd/network/10-*.network"])))]
    #[case(StepAction::Run(argv(&["systemctl", "restart", "systemd-networkd"])))]
    #[case(with_parents(write("/etc/systemd/network/10-a.network", Some(0o644))))]
    #[case(name_link("eth0"))]
    #[case(name_link("eth"))]
    #[case(name_link("lan"))]
    fn allowed_steps_pass(#[case] action: StepAction) {
        networkd_policy().check(&plan(vec![action])).unwrap();
    }

    /// A rename by a run step is held to the links patterns however the
    /// rule that lets the command run is spelled, and a reserved name is
    /// never a target: not by a rename, not by `name-link`, not under `*`.
    #[rstest]
    #[case(&["ip", "link", "set", "dev", "eth0", "name", "lo"], Some("lo"))]
    #[case(&["ip", "link", "set", "dev", "lo", "name", "lo0"], Some("lo0"))]
    #[case(&["ip", "link", "set", "dev", "eth0", "name", "wg0"], Some("wg0"))]
    #[case(&["/sbin/ip", "link", "set", "dev", "eth0", "name", "wg0"], Some("wg0"))]
    #[case(&["ip", "link", "set", "dev", "eth0", "up", "name", "wg0"], Some("wg0"))]
    #[case(&["ip", "link", "property", "add", "dev", "eth0", "altname", "lo"], Some("lo"))]
    #[case(&["ip", "link", "set", "dev", "eth0", "name", "eth1"], None)]
    #[case(&["ip", "link", "set", "dev", "eth0", "address", "52:54:00:aa:bb:01"], None)]
    #[case(&["ip", "link", "set", "dev", "eth0", "up"], None)]
    fn renames_are_held_to_links(#[case] command: &[&str], #[case] refused: Option<&str>) {
        let mut policy = networkd_policy();
        policy.runs = vec![
            RunRule::parse(&argv(&["ip", "link", "*"])).unwrap(),
            RunRule::parse(&argv(&["/sbin/ip", "*"])).unwrap(),
        ];
        let got = policy.check(&plan(vec![StepAction::Run(argv(command))]));
        match refused {
            None => got.unwrap(),
            Some(name) => assert_eq!(
                got.unwrap_err(),
                Breach {
                    step: 1,
                    rule: Rule::Rename(name.into())
                }
            ),
        }
        // The contract 0.1.0 default (links: none) renames nothing.
        if let [_, "link", "set", "dev", ..] = command
            && command.contains(&"name")
            && command[0] == "ip"
        {
            let got = GuestPolicy::contract_0_1_default()
                .check(&plan(vec![StepAction::Run(argv(command))]));
            assert!(
                matches!(
                    got,
                    Err(Breach {
                        rule: Rule::Rename(_),
                        ..
                    })
                ),
                "{got:?}"
            );
        }
    }

    #[test]
    fn reserved_names_are_never_given() {
        let mut policy = networkd_policy();
        policy.links = vec![LinkPattern::parse("*").unwrap()];
        for name in RESERVED_LINK_NAMES {
            let err = policy.check(&plan(vec![name_link(name)])).unwrap_err();
            assert!(
                err.to_string().contains("a name the guest reserves"),
                "{err}"
            );
        }
        policy.check(&plan(vec![name_link("eth0")])).unwrap();
    }

    #[test]
    fn without_links_no_link_may_be_named() {
        let mut policy = networkd_policy();
        policy.links.clear();
        let err = policy.check(&plan(vec![name_link("eth0")])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "step 1 names the NIC 52:54:00:aa:bb:01 eth0, which no links pattern allows"
        );
        assert!(
            GuestPolicy::contract_0_1_default()
                .check(&plan(vec![name_link("eth0")]))
                .is_err()
        );
    }

    #[rstest]
    #[case("eth*", Ok(()))]
    #[case("*", Ok(()))]
    #[case("en*s*", Ok(()))]
    #[case("abcdefghijklmno*", Ok(()))]
    #[case("", Err("it is empty"))]
    #[case(
        "eth/*",
        Err("it has a character other than a letter, a digit, `-`, `_`, `.` or `*`")
    )]
    #[case(
        "eth 0",
        Err("it has a character other than a letter, a digit, `-`, `_`, `.` or `*`")
    )]
    #[case("-*", Err("it starts with `-`, and no interface name does"))]
    #[case(".*", Err("it starts with `.`, and no interface name does"))]
    #[case(
        "abcdefghijklmnop",
        Err("it has more than 15 characters besides `*`, so no interface name matches it")
    )]
    fn link_patterns_are_checked(#[case] text: &str, #[case] expected: Result<(), &'static str>) {
        assert_eq!(
            LinkPattern::parse(text).map(|_| ()),
            expected.map_err(Problem::LinkPattern)
        );
        let raw = RawPolicy {
            links: argv(&["eth*", text]),
            ..RawPolicy::default()
        };
        match GuestPolicy::parse(&raw) {
            Ok(policy) => assert_eq!(policy.links[1].as_str(), text),
            Err(e) => assert!(
                e.to_string()
                    .starts_with("links[1]: is not an interface name pattern"),
                "{e}"
            ),
        }
    }

    #[test]
    fn links_are_listed_for_inspect() {
        let text = networkd_policy().to_string();
        assert!(text.contains("  links    eth*\n           lan\n"), "{text}");
        let json = serde_json::to_value(networkd_policy()).unwrap();
        assert_eq!(json["links"], serde_json::json!(["eth*", "lan"]));
        // A policy without links, from a configuration file or a record
        // written before the field, reads back with none.
        let raw: RawPolicy = serde_json::from_str(r#"{"writes":["/etc/hostname"]}"#).unwrap();
        assert!(raw.links.is_empty());
    }

    #[test]
    fn special_modes_allow_any_mode() {
        let mut policy = networkd_policy();
        policy.special_modes = true;
        policy
            .check(&plan(vec![write("/etc/hostname", Some(0o4777))]))
            .unwrap();
    }

    #[test]
    fn the_0_1_default_refuses_credentials_and_interpreters() {
        let policy = GuestPolicy::contract_0_1_default();
        for bad in [
            write("/etc/shadow", Some(0o644)),
            write("/root/.ssh/authorized_keys", Some(0o600)),
            write("/etc/systemd/network/x", Some(0o4777)),
            StepAction::RemoveFiles(argv(&["/etc/*"])),
            StepAction::Run(argv(&["sh", "-c", "curl x | sh"])),
            StepAction::Run(argv(&["ip", "netns", "exec", "x", "sh"])),
        ] {
            assert!(policy.check(&plan(vec![bad.clone()])).is_err(), "{bad:?}");
        }
        policy
            .check(&plan(vec![
                write(
                    "/etc/NetworkManager/system-connections/a.nmconnection",
                    Some(0o600),
                ),
                StepAction::RemoveFiles(argv(&["/etc/systemd/network/10-*.network"])),
                StepAction::Run(argv(&["nmcli", "connection", "reload"])),
            ]))
            .unwrap();
        assert!(policy.warnings().is_empty(), "{:?}", policy.warnings());
        // What the 0.1.0 built-ins did still passes, Windows included.
        let windows = Plan {
            dialect: Dialect::PowerShell,
            ..plan(vec![StepAction::Run(argv(&[
                "powershell",
                "-nop",
                "-c",
                "$x=Get-PnpDevice -Class Net -PresentOnly;$x|Disable-PnpDevice -Confirm:$false;$x|Enable-PnpDevice -Confirm:$false",
            ]))])
        };
        policy.check(&windows).unwrap();
        for escape in [
            &[
                "dhclient",
                "-sf",
                "/etc/systemd/network/10-x.network",
                "eth0",
            ][..],
            &["ifup", "-i", "/etc/x", "eth0"],
            &["udevadm", "lock", "--device=/dev/vda", "sh"],
            &["systemctl", "restart", "debug-shell"],
            &[
                "cloud-init",
                "-f",
                "/etc/netplan/x.yaml",
                "single",
                "--name",
                "bootcmd",
            ],
        ] {
            assert!(
                policy
                    .check(&plan(vec![StepAction::Run(argv(escape))]))
                    .is_err(),
                "{escape:?}"
            );
        }
    }

    #[test]
    fn warnings_name_open_programs_and_sensitive_patterns() {
        let policy = GuestPolicy::parse(&RawPolicy {
            writes: argv(&["/etc/**", "/etc/systemd/network/10-*.network"]),
            removes: argv(&["/root/**"]),
            runs: vec![argv(&["dhclient", "*"]), argv(&["ip", "link", "set", "*"])],
            special_modes: false,
            links: Vec::new(),
        })
        .unwrap();
        let warnings = policy.warnings();
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(warnings[0].starts_with("`dhclient *` leaves the arguments open"));
        assert!(warnings[1].starts_with("write pattern /etc/** covers /etc/shadow"));
        assert!(
            warnings[2].starts_with("remove pattern /root/** covers files below /root"),
            "{}",
            warnings[2]
        );
        assert!(networkd_policy().warnings().is_empty());
    }

    /// Warnings go by what a pattern can cover (a directory's files, a
    /// `*` standing for a directory, Windows paths in any case), not by
    /// sample file names.
    #[rstest]
    #[case::cron_d("/etc/cron.d/*")]
    #[case::sudoers_d("/etc/sudoers.d/*")]
    #[case::unit("/etc/systemd/system/*.service")]
    #[case::wants("/etc/systemd/system/multi-user.target.wants/*")]
    #[case::profile_d("/etc/profile.d/*.sh")]
    #[case::nm_dispatcher("/etc/NetworkManager/dispatcher.d/*")]
    #[case::if_up("/etc/network/if-up.d/*")]
    #[case::dhclient_hook("/etc/dhcp/dhclient-exit-hooks.d/*")]
    #[case::init_d("/etc/init.d/*")]
    #[case::networkd_dispatcher("/etc/networkd-dispatcher/routable.d/*")]
    #[case::interfaces_d("/etc/network/interfaces.d/*")]
    #[case::wicked_ifcfg("/etc/sysconfig/network/ifcfg-*")]
    #[case::redhat_ifcfg("/etc/sysconfig/network-scripts/ifcfg-*")]
    #[case::udev_rules("/etc/udev/rules.d/*.rules")]
    #[case::sysctl_d("/etc/sysctl.d/*.conf")]
    #[case::kernel_knob("/proc/sys/kernel/*")]
    #[case::modprobe_d("/etc/modprobe.d/*.conf")]
    #[case::sshd_config_d("/etc/ssh/sshd_config.d/*.conf")]
    #[case::rc_local("/etc/rc.local")]
    #[case::crontabs("/var/spool/cron/crontabs/*")]
    #[case::bashrc("/root/.bashrc")]
    #[case::group("/etc/group")]
    #[case::system32_lower("/windows/system32/*")]
    #[case::system32_upper("/WINDOWS/System32/drivers/*")]
    #[case::any_etc_dir("/etc/*/cocoon")]
    #[case::path_program("/usr/local/bin/ip")]
    fn writes_that_can_run_code_are_warned_about(#[case] pattern: &str) {
        let policy = GuestPolicy::parse(&RawPolicy {
            writes: argv(&[pattern]),
            ..RawPolicy::default()
        })
        .unwrap();
        let warnings = policy.warnings();
        assert_eq!(warnings.len(), 1, "{pattern}: {warnings:?}");
        assert!(
            warnings[0].starts_with(&format!("write pattern {pattern} covers ")),
            "{warnings:?}"
        );
    }

    #[rstest]
    #[case::sshd_config_d("/etc/ssh/sshd_config.d/*.conf")]
    #[case::nologin("/etc/nologin")]
    fn removes_that_turn_logins_on_are_warned_about(#[case] pattern: &str) {
        let policy = GuestPolicy::parse(&RawPolicy {
            removes: argv(&[pattern]),
            ..RawPolicy::default()
        })
        .unwrap();
        let warnings = policy.warnings();
        assert_eq!(warnings.len(), 1, "{pattern}: {warnings:?}");
        assert!(
            warnings[0].starts_with(&format!("remove pattern {pattern} covers ")),
            "{warnings:?}"
        );
    }

    /// What the built-ins and the contract 0.1.0 default need draws no
    /// warning.
    #[test]
    fn network_configuration_is_not_warned_about() {
        assert_eq!(
            GuestPolicy::contract_0_1_default().warnings(),
            Vec::<String>::new()
        );
        let policy = GuestPolicy::parse(&RawPolicy {
            writes: argv(&[
                "/etc/systemd/network/10-*.network",
                "/etc/NetworkManager/system-connections/*.nmconnection",
                "/etc/netplan/*.yaml",
                "/etc/hostname",
                "/proc/sys/vm/drop_caches",
                "/proc/sys/net/ipv4/conf/*/arp_notify",
            ]),
            removes: argv(&["/etc/network/interfaces.d/50-cloud-init.cfg"]),
            runs: vec![argv(&["ip", "link", "set", "dev", "*"])],
            ..RawPolicy::default()
        })
        .unwrap();
        assert_eq!(policy.warnings(), Vec::<String>::new());
    }

    /// A bounded rule whose program is found through PATH is flagged once
    /// a write pattern covers a directory on root's PATH; by absolute path
    /// only when a write covers that file.
    #[test]
    fn a_bounded_rule_is_flagged_when_its_program_can_be_replaced() {
        let policy = GuestPolicy::parse(&RawPolicy {
            writes: argv(&["/usr/local/bin/ip"]),
            runs: vec![
                argv(&["ip", "link", "set", "*"]),
                argv(&["/usr/sbin/ip", "addr", "add", "*"]),
            ],
            ..RawPolicy::default()
        })
        .unwrap();
        let warnings = policy.warnings();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[1].starts_with(
                "`ip link set *` is bounded only while `ip` is the guest's own program"
            ),
            "{warnings:?}"
        );
        // By an absolute path, bounded, until a write covers that file.
        let covered = GuestPolicy::parse(&RawPolicy {
            writes: argv(&["/usr/sbin/*"]),
            runs: vec![argv(&["/usr/sbin/ip", "addr", "add", "*"])],
            ..RawPolicy::default()
        })
        .unwrap();
        let warnings = covered.warnings();
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("a write pattern covers /usr/sbin/ip:")),
            "{warnings:?}"
        );
    }

    #[test]
    fn warnings_name_catch_all_link_patterns() {
        let policy = GuestPolicy::parse(&RawPolicy {
            links: argv(&["eth*", "*", "*0", "lan", "en*s*"]),
            ..RawPolicy::default()
        })
        .unwrap();
        let warnings = policy.warnings();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].starts_with("links pattern * matches any name"));
        assert!(warnings[1].starts_with("links pattern *0 matches any name"));
        assert!(warnings[0].contains("wg0"), "{}", warnings[0]);
    }

    #[test]
    fn policies_have_bounded_size() {
        let raw = RawPolicy {
            writes: vec!["/etc/x".into(); MAX_RULES + 1],
            ..RawPolicy::default()
        };
        let err = GuestPolicy::parse(&raw).unwrap_err();
        assert_eq!(err.field, "writes");
    }

    #[test]
    fn display_lists_one_entry_per_line() {
        let shown = networkd_policy().to_string();
        assert_eq!(
            shown,
            "  writes   /etc/systemd/network/10-*.network\n           /etc/hostname\n  removes  /etc/systemd/network/10-*.network\n  runs     systemctl restart systemd-networkd\n  links    eth*\n           lan\n  modes    within 0755\n"
        );
        assert!(
            GuestPolicy::default()
                .to_string()
                .contains("  writes   (none)\n")
        );
    }

    #[test]
    fn breaches_escape_what_they_show() {
        let rule = Rule::Write("/etc/\u{202e}x".into());
        assert!(rule.to_string().contains("\\u{202e}"), "{rule}");
        let run = Rule::Run(argv(&["a\u{1b}b"]));
        assert!(!run.to_string().contains('\u{1b}'), "{run}");
    }
}
