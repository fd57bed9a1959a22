//! Property tests: what the rendered sh says is exactly what the plan says.
//!
//! The rendered scripts are re-parsed by an independent POSIX/bash parser,
//! `brush-parser` (MIT; it keeps single-quoted multi-line words, escapes
//! and expansions apart, so a quoted `||` is never mistaken for the
//! operator). For every step the parsed command must be the plan's step,
//! compared like this:
//!
//! - run: one simple command, no assignment, no redirection; its words,
//!   unquoted, are the argv.
//! - write file: a subshell of `umask <mask>` (the bits the mode does not
//!   grant, four octal digits; `go-w` without a mode) `&& printf` with the
//!   words `%s` and the content, and one `>` redirection whose target,
//!   unquoted, is the path; when the step has a mode, then `&& chmod <mode
//!   as four or more octal digits> <path>`.
//! - remove files: `rm -f --` then one word per pattern; a pattern's `*`
//!   must come from unquoted text (a wildcard) and every other character
//!   from quoted text or from unquoted characters no shell treats
//!   specially, so the shell sees exactly the plan's pattern.
//!
//! A word may hold only literal text (unquoted plain characters, single
//! quotes, backslash escapes): any parameter, command or arithmetic
//! expansion, tilde or double quote in a step's word fails the property.
//! Around the steps the property checks the frame: the start marker
//! before each step and the `||` failure handler after it (exec form), or
//! the subshell and the closing `echo` (hint form).
//!
//! Inputs: arbitrary valid facts planned by the real built-in plugins
//! (names, MACs, IPs, prefixes, gateways, 0..8 NICs, flavours, both
//! backends, every Linux scenario); arbitrary plans with arbitrary strings
//! (no NUL) in argv, contents, paths and patterns. 256 cases each; a third
//! property runs 64 arbitrary plans under a real `sh` as a cross-check of
//! the parser.

use crate::support;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::OnceLock;

use brush_parser::ast::{
    AndOr, AndOrList, Command, CommandPrefixOrSuffixItem, CompoundCommand, IoFileRedirectKind,
    IoFileRedirectTarget, IoRedirect, Program, SimpleCommand,
};
use brush_parser::word::WordPiece;
use brush_parser::{Parser, ParserOptions};
use fixup_core::classify::Scenario;
use fixup_core::facts::{
    Backend, BootKind, Flavor, GuestOs, ImageKind, MacAddr, Nic, StaticIpv4, VmFacts, VmId, VmName,
};
use fixup_core::plan::{
    self, Dialect, Phase, Plan, PlanLimits, SH_SPECIAL_BUILTINS, ScriptHeader, Step, StepAction,
    WriteFile,
};
use fixup_core::planner::{Planner, PlannerOptions};
use proptest::prelude::*;
use proptest::test_runner::Config;
use support::guest::{Guest, Shell, assert_tree, expected_calls};
use support::strategies;

// ---- the parser side ----

fn options() -> ParserOptions {
    ParserOptions {
        posix_mode: true,
        sh_mode: true,
        enable_extended_globbing: false,
        ..ParserOptions::default()
    }
}

fn parse(script: &str) -> Result<Program, String> {
    Parser::new(std::io::Cursor::new(script.as_bytes()), &options())
        .parse_program()
        .map_err(|e| format!("the script does not parse: {e}"))
}

/// Characters no POSIX shell treats specially in an unquoted word.
fn plain(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c)
}

/// The value of a word that may hold only literal text. With `glob`, an
/// unquoted `*` stays a wildcard and is returned as `*`; a quoted `*`
/// would be a literal star, which no plan pattern can mean, and fails.
fn literal(word: &str, glob: bool) -> Result<String, String> {
    let pieces = brush_parser::word::parse(word, &options())
        .map_err(|e| format!("word {word:?} does not parse: {e}"))?;
    let mut out = String::new();
    for piece in pieces {
        match piece.piece {
            WordPiece::Text(text) => {
                if let Some(c) = text.chars().find(|c| !(plain(*c) || (glob && *c == '*'))) {
                    return Err(format!("unquoted {c:?} in word {word:?}"));
                }
                out.push_str(&text);
            }
            WordPiece::SingleQuotedText(text) => {
                if glob && text.contains('*') {
                    return Err(format!("a quoted `*` in pattern word {word:?}"));
                }
                out.push_str(&text);
            }
            WordPiece::EscapeSequence(escape) => {
                let c = escape
                    .strip_prefix('\\')
                    .ok_or_else(|| format!("escape {escape:?} in {word:?}"))?;
                if glob && c == "*" {
                    return Err(format!("an escaped `*` in pattern word {word:?}"));
                }
                out.push_str(c);
            }
            other => return Err(format!("{other:?} in word {word:?}: not literal text")),
        }
    }
    Ok(out)
}

/// One simple command, split into what matters.
#[derive(Debug, PartialEq, Eq)]
struct Invocation {
    /// Raw words as written (for the frame).
    raw: Vec<String>,
    assignments: usize,
    /// `(kind, raw target)`.
    redirects: Vec<(String, String)>,
}

fn invocation(cmd: &SimpleCommand) -> Invocation {
    let mut inv = Invocation {
        raw: Vec::new(),
        assignments: 0,
        redirects: Vec::new(),
    };
    // brush marks `A=b` as an assignment wherever it stands; after the
    // command word it is an ordinary argument (POSIX 2.9.1), so only the
    // prefix's count.
    let push = |item: &CommandPrefixOrSuffixItem, inv: &mut Invocation, prefix: bool| match item {
        CommandPrefixOrSuffixItem::Word(w) => inv.raw.push(w.value.clone()),
        CommandPrefixOrSuffixItem::AssignmentWord(..) if prefix => inv.assignments += 1,
        CommandPrefixOrSuffixItem::AssignmentWord(_, w) => inv.raw.push(w.value.clone()),
        CommandPrefixOrSuffixItem::IoRedirect(r) => inv.redirects.push(redirect(r)),
        CommandPrefixOrSuffixItem::ProcessSubstitution(..) => {
            inv.redirects.push(("<(...)".into(), String::new()))
        }
    };
    // The prefix comes before the command word, the suffix after it.
    if let Some(prefix) = &cmd.prefix {
        for item in &prefix.0 {
            push(item, &mut inv, true);
        }
    }
    if let Some(w) = &cmd.word_or_name {
        inv.raw.push(w.value.clone());
    }
    if let Some(suffix) = &cmd.suffix {
        for item in &suffix.0 {
            push(item, &mut inv, false);
        }
    }
    inv
}

fn redirect(r: &IoRedirect) -> (String, String) {
    match r {
        IoRedirect::File(fd, kind, target) => {
            let fd = fd.map(|f| f.to_string()).unwrap_or_default();
            let target = match target {
                IoFileRedirectTarget::Filename(w) | IoFileRedirectTarget::Duplicate(w) => {
                    w.value.clone()
                }
                IoFileRedirectTarget::Fd(fd) => fd.to_string(),
                IoFileRedirectTarget::ProcessSubstitution(..) => "<(...)".into(),
            };
            let kind = match kind {
                IoFileRedirectKind::Write => ">".to_owned(),
                other => other.to_string(),
            };
            (format!("{fd}{kind}"), target)
        }
        other => (other.to_string(), String::new()),
    }
}

/// A pipeline of one simple command, or an error naming what it is.
fn simple(pipeline: &brush_parser::ast::Pipeline) -> Result<&SimpleCommand, String> {
    match (
        pipeline.bang,
        pipeline.timed.is_some(),
        pipeline.seq.as_slice(),
    ) {
        (false, false, [Command::Simple(cmd)]) => Ok(cmd),
        _ => Err(format!("not one simple command: {pipeline}")),
    }
}

/// A simple command of a step, with whether it runs in a subshell.
type StepCommand<'a> = (&'a SimpleCommand, bool);

/// A pipeline's simple commands, each with whether it runs in a subshell:
/// one simple command, or a subshell whose one line is simple commands
/// joined by `&&` (a write under its umask).
fn commands_of(pipeline: &brush_parser::ast::Pipeline) -> Result<Vec<StepCommand<'_>>, String> {
    let (false, false, [Command::Compound(CompoundCommand::Subshell(sub), None)]) = (
        pipeline.bang,
        pipeline.timed.is_some(),
        pipeline.seq.as_slice(),
    ) else {
        return Ok(vec![(simple(pipeline)?, false)]);
    };
    let [item] = sub.list.0.as_slice() else {
        return Err(format!("a subshell of more than one line: {pipeline}"));
    };
    let mut out = vec![(simple(&item.0.first)?, true)];
    for next in &item.0.additional {
        match next {
            AndOr::And(p) => out.push((simple(p)?, true)),
            other => return Err(format!("unexpected `{other}` in a subshell")),
        }
    }
    Ok(out)
}

/// The step's commands (before `||`), each with whether it runs in a
/// subshell, and the handler after it.
fn split_step(
    list: &AndOrList,
) -> Result<(Vec<StepCommand<'_>>, &brush_parser::ast::Pipeline), String> {
    let mut commands = commands_of(&list.first)?;
    let mut handler = None;
    for (i, next) in list.additional.iter().enumerate() {
        match next {
            AndOr::And(p) if handler.is_none() => commands.extend(commands_of(p)?),
            AndOr::Or(p) if i + 1 == list.additional.len() => handler = Some(p),
            other => return Err(format!("unexpected `{other}` in the step line")),
        }
    }
    let handler = handler.ok_or("the step has no `||` handler")?;
    Ok((commands, handler))
}

/// The step's commands are exactly the plan's step.
fn check_step(step: &Step, commands: &[StepCommand<'_>]) -> Result<(), String> {
    let invs: Vec<Invocation> = commands.iter().map(|(c, _)| invocation(c)).collect();
    let in_subshell: Vec<bool> = commands.iter().map(|(_, sub)| *sub).collect();
    for inv in &invs {
        if inv.assignments != 0 {
            return Err(format!("an assignment in {inv:?}"));
        }
    }
    let words = |inv: &Invocation, glob_from: usize| -> Result<Vec<String>, String> {
        inv.raw
            .iter()
            .enumerate()
            .map(|(i, w)| literal(w, i >= glob_from))
            .collect()
    };
    match &step.action {
        StepAction::Run(argv) => {
            let ([inv], [false]) = (invs.as_slice(), in_subshell.as_slice()) else {
                return Err(format!("a run step became {} commands", invs.len()));
            };
            if !inv.redirects.is_empty() {
                return Err(format!("a run step has redirections {:?}", inv.redirects));
            }
            let got = words(inv, usize::MAX)?;
            if &got != argv {
                return Err(format!("argv {got:?}, plan {argv:?}"));
            }
        }
        StepAction::WriteFile(WriteFile {
            path,
            content,
            mode,
            parents: _,
        }) => {
            // `(umask <mask> && printf '%s' <content> > <path>)`, then
            // `chmod` with a mode.
            let expected: &[bool] = if mode.is_some() {
                &[true, true, false]
            } else {
                &[true, true]
            };
            if in_subshell != expected {
                return Err(format!(
                    "a write became {} commands (in a subshell: {in_subshell:?})",
                    invs.len()
                ));
            }
            let mask = match mode {
                Some(mode) => format!("{:04o}", 0o777 & !mode),
                None => "go-w".to_owned(),
            };
            let got = words(&invs[0], usize::MAX)?;
            if got != ["umask".to_owned(), mask.clone()] || !invs[0].redirects.is_empty() {
                return Err(format!("umask {got:?}, plan {mask}"));
            }
            let got = words(&invs[1], usize::MAX)?;
            let want = vec!["printf".to_owned(), "%s".to_owned(), content.clone()];
            if got != want {
                return Err(format!("write {got:?}, plan {want:?}"));
            }
            let [(kind, target)] = invs[1].redirects.as_slice() else {
                return Err(format!("write redirections {:?}", invs[1].redirects));
            };
            if kind != ">" || &literal(target, false)? != path {
                return Err(format!("write to {kind} {target:?}, plan {path:?}"));
            }
            if let Some(mode) = mode {
                let got = words(&invs[2], usize::MAX)?;
                let want = vec!["chmod".to_owned(), format!("{mode:04o}"), path.clone()];
                if got != want || !invs[2].redirects.is_empty() {
                    return Err(format!("chmod {got:?}, plan {want:?}"));
                }
            }
        }
        StepAction::RemoveFiles(patterns) => {
            let ([inv], [false]) = (invs.as_slice(), in_subshell.as_slice()) else {
                return Err(format!("a remove became {} commands", invs.len()));
            };
            let got = words(inv, 3)?;
            let mut want = vec!["rm".to_owned(), "-f".to_owned(), "--".to_owned()];
            want.extend(patterns.iter().cloned());
            if got != want || !inv.redirects.is_empty() {
                return Err(format!("remove {got:?}, plan {want:?}"));
            }
        }
        // A fixed script with two quoted values: the shell tests in core
        // run it; these properties do not generate it.
        StepAction::NameLink(_) => return Err("name_link steps are not generated here".to_owned()),
    }
    Ok(())
}

/// The `printf` format of the marker of `event`: the prefix, the nonce
/// (`%s`), the event and, with `code`, the exit code (`%s`).
fn marker_format(event: &str, code: bool) -> String {
    let code = if code { "%s" } else { "" };
    plan::sh_quote(&format!(r"\ncocoon-fixup: %s {event}{code}\n")).into_owned()
}

/// A marker line: `printf '\ncocoon-fixup: %s <event>\n' "$1" >&2`, the
/// nonce coming from the script's argument, never from its text.
fn check_marker(list: &AndOrList, event: &str) -> Result<(), String> {
    if !list.additional.is_empty() {
        return Err(format!("marker line {list}"));
    }
    let inv = invocation(simple(&list.first)?);
    let want = [
        "printf".to_owned(),
        marker_format(event, false),
        r#""$1""#.to_owned(),
    ];
    if inv.raw != want || inv.redirects != [(">&".to_owned(), "2".to_owned())] {
        return Err(format!("marker {inv:?}, expected {event:?}"));
    }
    Ok(())
}

/// The exec script (`sh -c` form) is the plan, step by step.
fn check_exec_script(plan: &Plan, script: &str) -> Result<(), String> {
    let program = parse(script)?;
    let items: Vec<&AndOrList> = program
        .complete_commands
        .iter()
        .flat_map(|c| c.0.iter())
        .map(|item| &item.0)
        .collect();
    let total = plan.steps.len();
    if items.len() != 2 * total + 1 {
        return Err(format!("{} command lines for {total} steps", items.len()));
    }
    for (i, step) in plan.steps.iter().enumerate() {
        let n = i + 1;
        check_marker(items[2 * i], &format!("step {n}/{total} start"))?;
        let (commands, handler) = split_step(items[2 * i + 1])?;
        check_step(step, &commands).map_err(|e| format!("step {n}: {e}"))?;
        let handler = handler.to_string();
        let marker = if step.best_effort {
            "ignored"
        } else {
            "failed"
        };
        let expected = format!(
            "printf {} \"$1\"",
            marker_format(&format!("step {n}/{total} {marker} exit "), true)
        );
        if !handler.contains(&expected) || step.best_effort == handler.contains("exit \"$rc\"") {
            return Err(format!("step {n}: handler {handler:?}"));
        }
    }
    check_marker(items[2 * total], "done")
}

/// The hint (`render_script`) is the plan, step by step, in a subshell.
fn check_hint(plan: &Plan, script: &str) -> Result<(), String> {
    let program = parse(script)?;
    let [list] = program.complete_commands.as_slice() else {
        return Err("the hint is not one subshell".into());
    };
    let [item] = list.0.as_slice() else {
        return Err("the hint is not one subshell".into());
    };
    let Command::Compound(CompoundCommand::Subshell(sub), None) =
        item.0.first.seq.first().ok_or("empty")?
    else {
        return Err(format!("the hint is not a subshell: {}", item.0));
    };
    let items: Vec<&AndOrList> = sub.list.0.iter().map(|i| &i.0).collect();
    let total = plan.steps.len();
    if items.len() != total + 1 {
        return Err(format!("{} command lines for {total} steps", items.len()));
    }
    for (i, step) in plan.steps.iter().enumerate() {
        let (commands, handler) = split_step(items[i])?;
        check_step(step, &commands).map_err(|e| format!("step {}: {e}", i + 1))?;
        let handler = handler.to_string();
        if !handler.contains(&format!("step {}/{total} failed", i + 1)) {
            return Err(format!("step {}: handler {handler:?}", i + 1));
        }
    }
    let last = invocation(simple(&items[total].first)?);
    let done = format!("'cocoon-fixup: all {total} steps done'");
    if last.raw != ["echo".to_owned(), done] {
        return Err(format!("the hint ends with {last:?}"));
    }
    Ok(())
}

fn check_rendered(plan: &Plan) -> Result<(), String> {
    let exec = plan::render_exec(plan);
    match plan.steps.as_slice() {
        [
            Step {
                best_effort: false,
                action: StepAction::Run(argv),
                ..
            },
        ] => {
            if &exec != argv {
                return Err(format!("direct form {exec:?}"));
            }
        }
        _ => {
            if exec.len() != 3 || exec[..2] != ["sh", "-c"] {
                return Err(format!("exec form {exec:?}"));
            }
            check_exec_script(plan, &exec[2]).map_err(|e| format!("exec: {e}"))?;
            let nonce = plan::Nonce::generate().map_err(|e| e.to_string())?;
            let argv = plan::exec_argv(plan, &exec, &nonce);
            if argv[..3] != exec[..] || argv[3..] != ["sh", nonce.as_str()] {
                return Err(format!("the nonce is not $1: {argv:?}"));
            }
        }
    }
    let title = vec!["header\nwith $(lines) and 'quotes'".to_owned()];
    check_hint(plan, &plan::render_script(plan, &ScriptHeader { title }))
        .map_err(|e| format!("hint: {e}"))
}

// ---- strategies ----

/// Strings that stress quoting: arbitrary unicode, shell syntax, or
/// nothing at all. No NUL (Plan::check refuses it).
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ -~\n\t]{0,24}",
        "['\"\\\\$`*?~#=%!;&|<>(){}\\[\\] \n]{1,8}",
        Just(String::new()),
    ]
    .prop_map(|s| s.replace('\0', ""))
}

fn path() -> BoxedStrategy<String> {
    strategies::path(text().boxed())
}

fn pattern() -> BoxedStrategy<String> {
    strategies::pattern(text().boxed())
}

fn action() -> impl Strategy<Value = StepAction> {
    prop_oneof![
        (
            text().prop_filter("a program", |p| !p.is_empty()
                && !SH_SPECIAL_BUILTINS.contains(&p.as_str())),
            prop::collection::vec(text(), 0..6)
        )
            .prop_map(|(program, args)| StepAction::Run(
                std::iter::once(program).chain(args).collect()
            )),
        (path(), text(), prop::option::of(0u32..=0o7777)).prop_map(|(path, content, mode)| {
            StepAction::WriteFile(WriteFile {
                path,
                content,
                mode,
                parents: false,
            })
        }),
        prop::collection::vec(pattern(), 1..4).prop_map(StepAction::RemoveFiles),
    ]
}

fn step_strategy(action: impl Strategy<Value = StepAction>) -> impl Strategy<Value = Step> {
    (action, any::<bool>(), "[a-z ]{1,20}").prop_map(|(action, best_effort, description)| Step {
        description,
        phase: Phase::Configure,
        best_effort,
        action,
    })
}

fn arbitrary_plan() -> impl Strategy<Value = Plan> {
    prop::collection::vec(step_strategy(action()), 0..8).prop_map(|steps| Plan {
        dialect: Dialect::PosixSh,
        steps,
    })
}

fn planner() -> &'static Planner {
    static PLANNER: OnceLock<Planner> = OnceLock::new();
    PLANNER.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("props-cocoon-root");
        std::fs::create_dir_all(&root).unwrap();
        let (planner, failures) = Planner::new(PlannerOptions {
            cocoon_root: root,
            ..PlannerOptions::default()
        })
        .expect("the planner starts");
        assert!(failures.is_empty(), "{failures:?}");
        planner
    })
}

fn nic() -> impl Strategy<Value = Nic> {
    (
        any::<[u8; 6]>(),
        prop::option::of((any::<u32>(), 0u8..=32, prop::option::of(any::<u32>()))),
    )
        .prop_map(|(mut mac, ip)| {
            mac[0] &= 0xfe;
            mac[5] |= 1;
            Nic {
                mac: MacAddr(mac),
                static_ipv4: ip.map(|(address, prefix, gateway)| StaticIpv4 {
                    address: Ipv4Addr::from(address),
                    prefix,
                    gateway: gateway.map(Ipv4Addr::from),
                }),
            }
        })
}

fn facts() -> impl Strategy<Value = VmFacts> {
    (
        "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?",
        "[A-Za-z0-9][A-Za-z0-9_-]{0,40}",
        prop::collection::vec(nic(), 0..8),
        prop::option::of("[a-z0-9._-]{1,20}"),
        any::<bool>(),
        any::<bool>(),
        prop::sample::select(vec![
            BootKind::Clone,
            BootKind::Fork,
            BootKind::Wake,
            BootKind::Resumed,
        ]),
    )
        .prop_map(
            |(name, id, mut nics, flavor, firecracker, cloudimg, boot)| {
                let mut seen = std::collections::BTreeSet::new();
                nics.retain(|n| seen.insert(n.mac.0));
                VmFacts {
                    name: VmName::parse(&name).expect("a valid name"),
                    id: VmId::parse(&id).expect("a valid id"),
                    backend: if firecracker {
                        Backend::Firecracker
                    } else {
                        Backend::CloudHypervisor
                    },
                    os: GuestOs::Linux,
                    image: if cloudimg {
                        ImageKind::Cloudimg
                    } else {
                        ImageKind::Oci
                    },
                    boot,
                    nics,
                    flavor: flavor.map(|f| Flavor::parse(&f).expect("a valid flavour")),
                }
            },
        )
}

fn scenarios(facts: &VmFacts) -> Vec<Scenario> {
    let network = match facts.image {
        ImageKind::Cloudimg => Scenario::Cloudimg,
        _ => Scenario::OciNetworkd,
    };
    match facts.backend {
        Backend::Firecracker => vec![Scenario::FcMac, network],
        Backend::CloudHypervisor => vec![network],
    }
}

proptest! {
    #![proptest_config(Config { cases: 256, failure_persistence: None, ..Config::default() })]

    /// Arbitrary valid facts, planned by the real plugins: the rendered
    /// exec script and hint re-parse to exactly the plan.
    #[test]
    fn plugin_plans_for_any_valid_facts_render_exactly(facts in facts()) {
        let mut all = vec![scenarios(&facts)];
        if facts.backend == Backend::CloudHypervisor && facts.image == ImageKind::Oci {
            all.push(vec![Scenario::DhcpRecovery]);
        }
        for scenarios in all {
            let composed = planner().plan_scenarios(&facts, &scenarios)
                .map_err(|e| TestCaseError::fail(format!("{scenarios:?}: {e}")))?;
            composed.plan.check(&PlanLimits::default()).unwrap();
            check_rendered(&composed.plan).map_err(TestCaseError::fail)?;
            prop_assert_eq!(&composed.exec, &plan::render_exec(&composed.plan));
        }
    }

    /// Arbitrary plans with arbitrary strings: every plan that passes
    /// `Plan::check` re-parses to exactly itself.
    #[test]
    fn any_checked_plan_renders_exactly(plan in arbitrary_plan()) {
        prop_assume!(plan.check(&PlanLimits::default()).is_ok());
        check_rendered(&plan).map_err(TestCaseError::fail)?;
    }
}

// ---- the cross-check: a real shell agrees with the parser ----

/// Where [`runnable_plan`] writes; replaced by the guest's root.
const ROOT: &str = "/@ROOT@";

/// A plan of `rec` runs with arbitrary arguments and writes with
/// arbitrary contents under [`ROOT`].
fn runnable_plan() -> impl Strategy<Value = Plan> {
    let run = prop::collection::vec(text(), 0..5)
        .prop_map(|args| StepAction::Run(std::iter::once("rec".to_owned()).chain(args).collect()));
    let write =
        (0usize..3, text(), prop::option::of(0o400u32..=0o777)).prop_map(|(i, content, mode)| {
            StepAction::WriteFile(WriteFile {
                path: format!("{ROOT}/file-{i}"),
                content,
                mode,
                parents: false,
            })
        });
    prop::collection::vec(step_strategy(prop_oneof![run, write]), 1..6).prop_map(|steps| Plan {
        dialect: Dialect::PosixSh,
        steps,
    })
}

proptest! {
    #![proptest_config(Config { cases: 64, failure_persistence: None, ..Config::default() })]

    /// The parser is not the only judge: the exec argv runs under a real
    /// dash or bash, and the stubs and files must show exactly the plan.
    #[test]
    fn a_real_shell_runs_exactly_what_the_parser_reads(mut plan in runnable_plan(), bash in any::<bool>()) {
        let mut guest = Guest::direct(if bash { Shell::Bash } else { Shell::Dash });
        let root = guest.root.to_str().unwrap().to_owned();
        for step in &mut plan.steps {
            if let StepAction::WriteFile(w) = &mut step.action {
                w.path = w.path.replace(ROOT, &root);
            }
        }
        guest.reseed();
        check_rendered(&plan).map_err(TestCaseError::fail)?;
        let nonce = plan::Nonce::generate().unwrap();
        let exec = plan::exec_argv(&plan, &plan::render_exec(&plan), &nonce);
        let out = guest.run(&exec.iter().map(String::as_str).collect::<Vec<_>>());
        prop_assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        prop_assert!(plan::ran_to_completion(&plan, &nonce, &out.stderr));
        prop_assert_eq!(guest.calls(), expected_calls(&plan));
        assert_tree(&guest.tree(), &guest.expected_tree(&plan), "exec");
    }
}

// ---- bash job specs ----

/// bash (the `sh` of RHEL-family guests) reads a command word that starts
/// with `%` as a job specification, quoted or not (`'%x'` runs `fg %x`),
/// so such a program would never run there while dash runs it. The plan
/// check refuses it, naming the field, so plan and guest never differ.
#[test]
fn a_program_starting_with_percent_is_refused() {
    let plan = Plan {
        dialect: Dialect::PosixSh,
        steps: vec![Step {
            description: "run a program named %rec".into(),
            phase: Phase::Configure,
            best_effort: false,
            action: StepAction::Run(vec!["%rec".into(), "arg".into()]),
        }],
    };
    let err = plan
        .check(&PlanLimits::default())
        .expect_err("a job spec is not a program");
    let message = err.to_string();
    assert!(
        message.contains("run[0]") && message.contains("%rec"),
        "{message}"
    );
}
