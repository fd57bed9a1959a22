//! The rendered PowerShell says exactly what the plan says, checked by an
//! independent grammar: `tree-sitter-powershell` (MIT), as the sh rendering
//! is checked by brush-parser (`host/tests/props.rs`).
//!
//! Every rendered PowerShell plan (the exec script with its nonce argument,
//! and the hint) must parse without an error node, and every value the plan
//! carries (argv words, file paths and contents, removal patterns) must come
//! back as one verbatim (single-quoted) string, at its place in the command
//! of its step, unchanged after unquoting by PowerShell's rules:
//!
//! - inside `'...'` nothing expands (`$`, a backtick, `@(` are text), and a
//!   single-quote character followed by another one is one quote: the
//!   second is kept;
//! - PowerShell takes `'` and the typographic U+2018, U+2019, U+201A and
//!   U+201B alike as single-quote characters (language specification,
//!   2.3.5.2 String literals; the double quotes are `"`, U+201C, U+201D and
//!   U+201E).
//!
//! The grammar knows only the ASCII quotes, so it takes a typographic one
//! as text where PowerShell ends the string: the grammar is wrong here, and
//! the renderer (which doubles all five) right. So each script is parsed
//! twice: as rendered, where each value must unquote, by the rules above,
//! to itself; and with every typographic quote replaced by its ASCII
//! counterpart, which PowerShell reads the same way, so that the grammar
//! sees every quote PowerShell sees and must find the same literals.
//!
//! Around the steps the frame is checked too: the exec script is one
//! script block whose `param` takes `$nonce` and whose one argument is the
//! quoted nonce; its markers, in order, are the steps' start and failure
//! markers and the done marker, built from literal text, `$nonce` and
//! `$rc` only; the hint is one script block. Anywhere, a variable is one of
//! the frame's own, a `$(...)` never appears, and commands are the steps'
//! or the frame's.

use crate::support;

use fixup_core::plan::{
    self, Dialect, Nonce, Phase, Plan, PlanLimits, ScriptHeader, Step, StepAction, WriteFile,
};
use proptest::prelude::*;
use proptest::test_runner::Config;
use rstest::rstest;
use support::strategies;
use tree_sitter::{Node, Parser, Tree};

// ---- the parser side ----

fn parse(source: &str) -> Result<Tree, String> {
    let mut parser = Parser::new();
    parser
        .set_language(&tree_sitter_powershell::LANGUAGE.into())
        .map_err(|e| format!("the PowerShell grammar does not load: {e}"))?;
    let tree = parser
        .parse(source, None)
        .ok_or("the parser gave no tree")?;
    if let Some(bad) = first_error(tree.root_node()) {
        let at = bad.start_position();
        return Err(format!(
            "the script does not parse: {} at {}:{} {:?}",
            if bad.is_missing() { "missing" } else { "error" },
            at.row + 1,
            at.column + 1,
            &source[bad.byte_range()]
        ));
    }
    Ok(tree)
}

fn first_error(node: Node<'_>) -> Option<Node<'_>> {
    if node.is_error() || node.is_missing() {
        return Some(node);
    }
    if !node.has_error() {
        return None;
    }
    children(node).into_iter().find_map(first_error)
}

fn children(node: Node<'_>) -> Vec<Node<'_>> {
    let mut cursor = node.walk();
    node.children(&mut cursor).collect()
}

fn named(node: Node<'_>) -> Vec<Node<'_>> {
    let mut cursor = node.walk();
    node.named_children(&mut cursor).collect()
}

/// Every node below `node` (itself included), in document order.
fn descendants(node: Node<'_>) -> Vec<Node<'_>> {
    let mut out = vec![node];
    for child in children(node) {
        out.extend(descendants(child));
    }
    out
}

fn text<'s>(node: Node<'_>, source: &'s str) -> &'s str {
    &source[node.byte_range()]
}

fn is_single_quote(c: char) -> bool {
    matches!(c, '\'' | '\u{2018}' | '\u{2019}' | '\u{201A}' | '\u{201B}')
}

/// The script with each typographic quote replaced by the ASCII quote
/// PowerShell takes it for.
fn ascii_quotes(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '\u{2018}' | '\u{2019}' | '\u{201A}' | '\u{201B}' => '\'',
            '\u{201C}' | '\u{201D}' | '\u{201E}' => '"',
            c => c,
        })
        .collect()
}

/// A verbatim string's value by PowerShell's rules (see the module docs).
fn unquote(literal: &str) -> Result<String, String> {
    let mut chars = literal.chars().peekable();
    if !chars.next().is_some_and(is_single_quote) {
        return Err(format!("{literal:?} does not open with a single quote"));
    }
    let mut value = String::new();
    while let Some(c) = chars.next() {
        if !is_single_quote(c) {
            value.push(c);
            continue;
        }
        match chars.next() {
            Some(second) if is_single_quote(second) => value.push(second),
            None => return Ok(value),
            Some(_) => {
                return Err(format!(
                    "{literal:?}: PowerShell ends the string at a lone quote {c:?} inside it"
                ));
            }
        }
    }
    Err(format!("{literal:?} is not closed"))
}

/// Node kinds an expression passes through, each with exactly one child
/// and nothing else, on its way down to one literal.
const WRAPPERS: &[&str] = &[
    "command_name_expr",
    "argument_expression",
    "logical_argument_expression",
    "bitwise_argument_expression",
    "comparison_argument_expression",
    "additive_argument_expression",
    "multiplicative_argument_expression",
    "format_argument_expression",
    "range_argument_expression",
    "logical_expression",
    "bitwise_expression",
    "comparison_expression",
    "additive_expression",
    "multiplicative_expression",
    "format_expression",
    "range_expression",
    "array_literal_expression",
    "unary_expression",
    "string_literal",
];

/// The value of `node` when it is exactly one verbatim string: a chain of
/// single-child wrappers around one `'...'` token.
fn one_literal(node: Node<'_>, source: &str) -> Result<String, String> {
    let mut node = node;
    loop {
        if node.kind() == "verbatim_string_characters" {
            return unquote(text(node, source));
        }
        let inner = named(node);
        match inner.as_slice() {
            [child]
                if WRAPPERS.contains(&node.kind()) && child.byte_range() == node.byte_range() =>
            {
                node = *child
            }
            _ => {
                return Err(format!(
                    "not one verbatim string: {} {:?}",
                    node.kind(),
                    text(node, source)
                ));
            }
        }
    }
}

/// A plan's value as it must come back from a parse of `form` of the script.
fn expected(value: &str, ascii: bool) -> String {
    if ascii {
        ascii_quotes(value)
    } else {
        value.to_owned()
    }
}

/// A removal pattern as `Remove-Item -Path` reads it: a backtick escapes the
/// next character, `*` is the only wildcard left bare (`?`, `[` and `]` are
/// wildcards too, so a bare one means something the plan did not say).
fn wildcard_pattern(escaped: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = escaped.chars();
    while let Some(c) = chars.next() {
        match c {
            '`' => out.push(chars.next().ok_or("a pattern ends in a backtick")?),
            '?' | '[' | ']' => return Err(format!("a bare wildcard {c:?} in {escaped:?}")),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// What a step became: the values its command carries, in order.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    Run(Vec<String>),
    Write(String, String),
    Remove(Vec<String>),
}

impl Found {
    /// The step as it must be found in a parse of the plain (`ascii =
    /// false`) or the ASCII-quoted script.
    fn of(action: &StepAction, ascii: bool) -> Found {
        let e = |s: &String| expected(s, ascii);
        match action {
            StepAction::Run(argv) => Found::Run(argv.iter().map(e).collect()),
            StepAction::WriteFile(w) => Found::Write(e(&w.path), e(&w.content)),
            StepAction::RemoveFiles(p) => Found::Remove(p.iter().map(e).collect()),
            StepAction::NameLink(_) => unreachable!("a PowerShell plan cannot name a link"),
        }
    }
}

/// The steps' commands, in document order: `& '<program>' '<arg>'...`,
/// `[IO.File]::WriteAllText('<path>', '<content>')` and `Remove-Item ...
/// -Path '<pattern>', ...`; every other command must be the frame's own.
fn step_commands(root: Node<'_>, source: &str) -> Result<Vec<Found>, String> {
    let mut found = Vec::new();
    for node in descendants(root) {
        match node.kind() {
            "command" => {
                if let Some(step) = command(node, source)? {
                    found.push(step);
                }
            }
            "invokation_expression" if text(node, source).starts_with("[IO.File]::") => {
                found.push(write_all_text(node, source)?);
            }
            "sub_expression" => return Err(format!("a `$(...)`: {:?}", text(node, source))),
            "variable" => {
                let name = text(node, source);
                const FRAME: &[&str] = &[
                    "$nonce",
                    "$rc",
                    "$global:LASTEXITCODE",
                    "$LASTEXITCODE",
                    "$_",
                    "$ErrorActionPreference",
                ];
                if !FRAME.contains(&name) {
                    return Err(format!("a variable that is not the frame's: {name}"));
                }
            }
            _ => {}
        }
    }
    Ok(found)
}

/// A `command` node: a step's run or removal, `None` for the frame's own
/// (the script block that holds everything, `Write-Host`,
/// `Write-Warning`), an error for anything else.
fn command(node: Node<'_>, source: &str) -> Result<Option<Found>, String> {
    let parts = children(node);
    let name = parts
        .iter()
        .find(|n| matches!(n.kind(), "command_name" | "command_name_expr"))
        .ok_or_else(|| format!("a command without a name: {:?}", text(node, source)))?;
    let elements: Vec<Node<'_>> = parts
        .iter()
        .find(|n| n.kind() == "command_elements")
        .map(|e| {
            named(*e)
                .into_iter()
                .filter(|n| n.kind() != "command_argument_sep")
                .collect()
        })
        .unwrap_or_default();
    let invoked = parts
        .iter()
        .any(|n| n.kind() == "command_invokation_operator");
    if invoked && name.kind() == "command_name_expr" {
        if named(*name)
            .first()
            .is_some_and(|n| n.kind() == "script_block_expression")
        {
            return Ok(None); // the frame: `& { ... }`
        }
        let mut argv = vec![one_literal(*name, source)?];
        for element in elements {
            argv.push(one_literal(element, source)?);
        }
        return Ok(Some(Found::Run(argv)));
    }
    match text(*name, source) {
        "Write-Host" | "Write-Warning" => Ok(None),
        "Remove-Item" => {
            let words: Vec<&str> = elements.iter().map(|e| text(*e, source)).collect();
            let [force, action, silently, path, patterns] = elements.as_slice() else {
                return Err(format!("Remove-Item {words:?}"));
            };
            let flags = [force, action, silently, path].map(|n| text(*n, source));
            if flags != ["-Force", "-ErrorAction", "SilentlyContinue", "-Path"] {
                return Err(format!("Remove-Item {words:?}"));
            }
            // One pattern is one literal; several are one array, `a, b`.
            let list = match named(*patterns).as_slice() {
                [_, _, ..] if patterns.kind() == "array_literal_expression" => named(*patterns),
                _ => vec![*patterns],
            };
            let mut out = Vec::new();
            for p in list {
                out.push(wildcard_pattern(&one_literal(p, source)?)?);
            }
            Ok(Some(Found::Remove(out)))
        }
        other => Err(format!("a command that is no step's: {other:?}")),
    }
}

/// `[IO.File]::WriteAllText('<path>', '<content>')`.
fn write_all_text(node: Node<'_>, source: &str) -> Result<Found, String> {
    let whole = text(node, source);
    let parts = named(node);
    let [ty, member, args] = parts.as_slice() else {
        return Err(format!("not a write: {whole:?}"));
    };
    if text(*ty, source) != "[IO.File]" || text(*member, source) != "WriteAllText" {
        return Err(format!("not a write: {whole:?}"));
    }
    let list = named(*args);
    let [list] = list.as_slice() else {
        return Err(format!("write arguments {whole:?}"));
    };
    let values = named(*list);
    let [path, content] = values.as_slice() else {
        return Err(format!("a write of {} values: {whole:?}", values.len()));
    };
    Ok(Found::Write(
        one_literal(*path, source)?,
        one_literal(*content, source)?,
    ))
}

/// The steps' commands are exactly the plan's steps.
fn check_steps(plan: &Plan, root: Node<'_>, source: &str, ascii: bool) -> Result<(), String> {
    let found = step_commands(root, source)?;
    let want: Vec<Found> = plan
        .steps
        .iter()
        .map(|s| Found::of(&s.action, ascii))
        .collect();
    if found != want {
        return Err(format!(
            "the steps read back as {found:?}, the plan is {want:?}"
        ));
    }
    Ok(())
}

/// The one statement of a script: `& { ... } <args>`; returns the script
/// block and the arguments after it.
fn one_block<'t>(root: Node<'t>, source: &str) -> Result<(Node<'t>, Vec<Node<'t>>), String> {
    let statements: Vec<Node<'t>> = named(root)
        .into_iter()
        .flat_map(|n| {
            if n.kind() == "statement_list" {
                named(n)
            } else {
                vec![n]
            }
        })
        .filter(|n| n.kind() != "comment")
        .collect();
    let [statement] = statements.as_slice() else {
        return Err(format!("{} statements, not one block", statements.len()));
    };
    let command = descendants(*statement)
        .into_iter()
        .find(|n| n.kind() == "command")
        .ok_or("the statement is no command")?;
    let block = descendants(command)
        .into_iter()
        .find(|n| n.kind() == "script_block")
        .ok_or("the command runs no script block")?;
    if !text(command, source).starts_with("& {") || !text(command, source).contains('}') {
        return Err("not `& { ... }`".into());
    }
    let args = children(command)
        .into_iter()
        .find(|n| n.kind() == "command_elements")
        .map(|e| {
            named(e)
                .into_iter()
                .filter(|n| n.kind() != "command_argument_sep")
                .collect()
        })
        .unwrap_or_default();
    Ok((block, args))
}

/// The markers the exec script writes, in order, each as its parts joined:
/// literal text unquoted, variables by name (`cocoon-fixup: $nonce step 1/2
/// start`). A marker is `[Console]::Error.Write([Environment]::NewLine +
/// <literals and variables joined by +> + [Environment]::NewLine)`: one
/// write, line breaks included; the `WriteLine($_.ToString())` of a caught
/// error is not a marker.
fn markers(block: Node<'_>, source: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for node in descendants(block) {
        if node.kind() != "invokation_expression"
            || !text(node, source).starts_with("[Console]::Error.Write(")
        {
            continue;
        }
        let Some(args) = named(node)
            .into_iter()
            .find(|n| n.kind() == "argument_list")
        else {
            continue;
        };
        let whole = text(args, source);
        if whole == "($_.ToString())" {
            continue;
        }
        let leaves: Vec<Node<'_>> = descendants(args)
            .into_iter()
            .filter(|n| matches!(n.kind(), "verbatim_string_characters" | "variable"))
            .collect();
        let joined: Vec<&str> = leaves.iter().map(|n| text(*n, source)).collect();
        if whole
            != format!(
                "([Environment]::NewLine + {} + [Environment]::NewLine)",
                joined.join(" + ")
            )
        {
            return Err(format!(
                "a marker that is not literals and variables: {whole}"
            ));
        }
        let mut marker = String::new();
        for leaf in leaves {
            match leaf.kind() {
                "variable" => marker.push_str(text(leaf, source)),
                _ => marker.push_str(&unquote(text(leaf, source))?),
            }
        }
        out.push(marker);
    }
    Ok(out)
}

/// The exec script, as PowerShell runs it: the words after `-Command`
/// joined by spaces, the nonce last.
fn check_exec(plan: &Plan, argv: &[String], nonce: &Nonce) -> Result<(), String> {
    let [ps, no_profile, non_interactive, command, words @ ..] = argv else {
        return Err(format!("exec form {argv:?}"));
    };
    if [ps, no_profile, non_interactive, command]
        != ["powershell", "-NoProfile", "-NonInteractive", "-Command"]
        || words.len() != 2
    {
        return Err(format!("exec form {argv:?}"));
    }
    let joined = words.join(" ");
    for ascii in [false, true] {
        let source = if ascii {
            ascii_quotes(&joined)
        } else {
            joined.clone()
        };
        let tree = parse(&source)?;
        let root = tree.root_node();
        let (block, args) = one_block(root, &source)?;
        let [arg] = args.as_slice() else {
            return Err(format!("the block takes {} arguments", args.len()));
        };
        if one_literal(*arg, &source)? != nonce.as_str() {
            return Err(format!("the block's argument is {:?}", text(*arg, &source)));
        }
        let param = named(block)
            .into_iter()
            .find(|n| n.kind() == "param_block")
            .ok_or("the block has no param")?;
        if text(param, &source) != "param([string]$nonce)" {
            return Err(format!("param {:?}", text(param, &source)));
        }
        check_steps(plan, root, &source, ascii)?;
        let total = plan.steps.len();
        let mut want = Vec::new();
        for (i, step) in plan.steps.iter().enumerate() {
            let n = i + 1;
            want.push(format!("cocoon-fixup: $nonce step {n}/{total} start"));
            let kind = if step.best_effort {
                "ignored"
            } else {
                "failed"
            };
            want.push(format!(
                "cocoon-fixup: $nonce step {n}/{total} {kind} exit $rc"
            ));
        }
        want.push("cocoon-fixup: $nonce done".to_owned());
        let got = markers(block, &source)?;
        if got != want {
            return Err(format!("markers {got:?}, expected {want:?}"));
        }
        // A failing step ends the script with its code, a best-effort one
        // does not.
        let ifs: Vec<&str> = descendants(block)
            .into_iter()
            .filter(|n| n.kind() == "if_statement")
            .map(|n| text(n, &source))
            .collect();
        if ifs.len() != total {
            return Err(format!("{} failure handlers for {total} steps", ifs.len()));
        }
        for (step, handler) in plan.steps.iter().zip(&ifs) {
            if step.best_effort == handler.ends_with("; exit $rc }") {
                return Err(format!("handler {handler:?}"));
            }
        }
    }
    Ok(())
}

/// The hint: comments, then one script block with every step.
fn check_hint(plan: &Plan, script: &str) -> Result<(), String> {
    for ascii in [false, true] {
        let source = if ascii {
            ascii_quotes(script)
        } else {
            script.to_owned()
        };
        let tree = parse(&source)?;
        let root = tree.root_node();
        let (_, args) = one_block(root, &source)?;
        if !args.is_empty() {
            return Err("the hint's block takes arguments".into());
        }
        check_steps(plan, root, &source, ascii)?;
    }
    Ok(())
}

/// Both renderings of a PowerShell plan that passed `Plan::check`: one
/// run step (not best effort) is exec'd directly, as it is; any other
/// plan is the exec script.
fn check_rendered_ps(plan: &Plan) -> Result<(), String> {
    let nonce = Nonce::generate().map_err(|e| e.to_string())?;
    let exec = plan::render_exec(plan);
    let argv = plan::exec_argv(plan, &exec, &nonce);
    match plan.steps.as_slice() {
        [
            Step {
                best_effort: false,
                action: StepAction::Run(words),
                ..
            },
        ] => {
            if &argv != words {
                return Err(format!("direct form {argv:?}"));
            }
        }
        _ => check_exec(plan, &argv, &nonce).map_err(|e| format!("exec: {e}"))?,
    }
    let header = ScriptHeader {
        title: vec!["header ‘with’ $(quotes) and\nlines".into()],
    };
    check_hint(plan, &plan::render_script(plan, &header)).map_err(|e| format!("hint: {e}"))
}

// ---- strategies ----

/// Values no quoting may lose or interpret.
const HOSTILE: &[&str] = &[
    "it's",
    "'",
    "''",
    "'''",
    "‘",
    "’",
    "‚",
    "‛",
    "‘’‚‛'",
    "a‘b’c‚d‛e",
    "“",
    "”",
    "„",
    "\"",
    "“quoted” „low”",
    "$x",
    "${x}",
    "$(Stop-Computer)",
    "$null",
    "`",
    "``",
    "`n`0",
    "@(1,2)",
    "@{a=1}",
    "@'\nhere\n'@",
    "@\"\nhere\n\"@",
    "--%",
    "-Force",
    "#",
    "<#",
    "#>",
    "a\nb",
    "a\r\nb\r",
    "",
    " ",
    "ünï ✓ 😀",
    "[a]",
    "?",
    "*",
    "& ; | , ( ) { }",
    "a, b",
    "1kb",
    "0x10",
    "%PATH%",
    "\\\\server\\share",
];

/// Strings that stress quoting: arbitrary Unicode, PowerShell syntax, the
/// hostile list. No NUL (`Plan::check` refuses it).
fn text_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ -~\n]{0,24}",
        "['‘’‚‛\"“”„`$@(){}\\[\\]?*;&|<>#, \n-]{1,12}",
        prop::sample::select(HOSTILE).prop_map(str::to_owned),
        prop::collection::vec(prop::sample::select(HOSTILE), 1..4).prop_map(|v| v.concat()),
    ]
    .prop_map(|s| s.replace('\0', ""))
}

fn path() -> BoxedStrategy<String> {
    strategies::path(text_value().boxed())
}

fn pattern() -> BoxedStrategy<String> {
    strategies::pattern(text_value().boxed())
}

fn action() -> impl Strategy<Value = StepAction> {
    prop_oneof![
        (
            text_value().prop_filter("a program", |p| !p.is_empty()),
            prop::collection::vec(text_value(), 0..5)
        )
            .prop_map(|(program, args)| StepAction::Run(
                std::iter::once(program).chain(args).collect()
            )),
        (path(), text_value()).prop_map(|(path, content)| StepAction::WriteFile(WriteFile {
            path,
            content,
            mode: None,
            parents: false,
        })),
        prop::collection::vec(pattern(), 1..4).prop_map(StepAction::RemoveFiles),
    ]
}

fn description() -> impl Strategy<Value = String> {
    text_value().prop_map(|s| {
        let line: String = s.chars().filter(|c| !c.is_control()).take(60).collect();
        if line.is_empty() { "step".into() } else { line }
    })
}

fn ps_plan() -> impl Strategy<Value = Plan> {
    let step =
        (action(), any::<bool>(), description()).prop_map(|(action, best_effort, description)| {
            Step {
                description,
                phase: Phase::Configure,
                best_effort,
                action,
            }
        });
    prop::collection::vec(step, 0..6).prop_map(|steps| Plan {
        dialect: Dialect::PowerShell,
        steps,
    })
}

proptest! {
    #![proptest_config(Config { cases: 256, failure_persistence: None, ..Config::default() })]

    /// Arbitrary PowerShell plans with hostile strings: every plan that
    /// passes `Plan::check` renders to exactly itself, exec and hint.
    #[test]
    fn any_checked_powershell_plan_renders_exactly(plan in ps_plan()) {
        prop_assume!(plan.check(&PlanLimits::default()).is_ok());
        check_rendered_ps(&plan).map_err(TestCaseError::fail)?;
    }
}

// ---- tables ----

fn step(best_effort: bool, action: StepAction) -> Step {
    Step {
        description: "a step".into(),
        phase: Phase::Configure,
        best_effort,
        action,
    }
}

fn words(values: &[&str]) -> Vec<String> {
    values.iter().map(|s| s.to_string()).collect()
}

/// Every hostile value, in every place a value goes, in both kinds of
/// step (failing and best effort).
#[rstest]
fn every_hostile_value_renders_as_one_literal(#[values(false, true)] best_effort: bool) {
    let mut argv = words(&["prog"]);
    argv.extend(words(HOSTILE));
    let mut steps = vec![step(best_effort, StepAction::Run(argv))];
    for (i, value) in HOSTILE.iter().enumerate() {
        steps.push(step(best_effort, StepAction::Run(words(&[value, value]))).clone());
        // A PowerShell plan's paths hold no `\` and no `:` (Windows
        // separators, refused by the plan check); values keep them.
        let name: String = value
            .chars()
            .filter(|c| !c.is_control() && !matches!(c, '/' | '\\' | ':'))
            .collect();
        steps.push(step(
            best_effort,
            StepAction::WriteFile(WriteFile {
                path: format!("/dir/{i} {name}"),
                content: value.to_string(),
                mode: None,
                parents: false,
            }),
        ));
        steps.push(step(
            best_effort,
            StepAction::RemoveFiles(vec![format!("/dir/{i} {name}*"), format!("/dir/{name}x")]),
        ));
    }
    steps.retain(|s| !matches!(&s.action, StepAction::Run(argv) if argv[0].is_empty()));
    let plan = Plan {
        dialect: Dialect::PowerShell,
        steps,
    };
    plan.check(&PlanLimits::default()).expect("a valid plan");
    check_rendered_ps(&plan).unwrap();
}

/// The real Windows plan (the `windows-pnp` plugin's) is exec'd directly;
/// its hint renders exactly.
#[test]
fn the_windows_pnp_plan_renders_exactly() {
    let pnp = "$x=Get-PnpDevice -Class Net -PresentOnly;$x|Disable-PnpDevice -Confirm:$false;$x|Enable-PnpDevice -Confirm:$false";
    let plan = Plan {
        dialect: Dialect::PowerShell,
        steps: vec![step(
            false,
            StepAction::Run(words(&["powershell", "-nop", "-c", pnp])),
        )],
    };
    check_rendered_ps(&plan).unwrap();
    let mut best_effort = plan.clone();
    best_effort.steps[0].best_effort = true;
    check_rendered_ps(&best_effort).unwrap();
}

/// The check is not vacuous: scripts that a wrong renderer could make are
/// refused, each for its reason. The plan runs `it's` with the argument
/// `a,b`.
#[rstest]
#[case::ascii_quote_not_doubled("& 'it's' 'a,b'", "does not parse")]
#[case::smart_quote_not_doubled("& 'it’s' 'a,b'", "lone quote")]
#[case::double_quoted("& \"it's\" 'a,b'", "not one verbatim string")]
#[case::bare_word("& 'it''s' a,b", "not one verbatim string")]
#[case::two_values_as_one(
    "& 'it''s' 'a','b'",
    "not one verbatim string: array_literal_expression"
)]
#[case::variable("& 'it''s' $env:x", "not one verbatim string: variable")]
#[case::subexpression("& 'it''s' \"$(Stop-Computer)\"", "expandable_string_literal")]
#[case::another_command("& 'it''s' 'a,b'; Stop-Computer -Force", "no step's")]
#[case::another_step("& 'it''s' 'a,b'; & 'it''s' 'a,b'", "read back as")]
#[case::a_variable_elsewhere("& 'it''s' 'a,b'; $home", "not the frame's")]
#[case::a_subexpression_elsewhere("& 'it''s' 'a,b'; $(1)", "$(...)")]
fn wrong_renderings_are_refused(#[case] script: &str, #[case] why: &str) {
    let plan = Plan {
        dialect: Dialect::PowerShell,
        steps: vec![step(false, StepAction::Run(words(&["it's", "a,b"])))],
    };
    let right = "& 'it''s' 'a,b'";
    check_steps(&plan, parse(right).unwrap().root_node(), right, false).unwrap();
    let err = parse(script)
        .and_then(|tree| check_steps(&plan, tree.root_node(), script, false))
        .unwrap_err();
    assert!(err.contains(why), "{err}");
}

#[rstest]
#[case("'a'", Ok("a"))]
#[case("''", Ok(""))]
#[case("''''", Ok("'"))]
#[case("'‘‘'", Ok("‘"))]
#[case("'’‘'", Ok("‘"))]
#[case("'$x `n'", Ok("$x `n"))]
#[case("'a'b'", Err("lone quote"))]
#[case("'a", Err("not closed"))]
#[case("a'", Err("does not open"))]
fn unquoting_follows_powershell(#[case] literal: &str, #[case] value: Result<&str, &str>) {
    match (unquote(literal), value) {
        (Ok(got), Ok(want)) => assert_eq!(got, want),
        (Err(got), Err(want)) => assert!(got.contains(want), "{got}"),
        (got, want) => panic!("{literal}: {got:?}, expected {want:?}"),
    }
}
