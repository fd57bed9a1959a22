//! Rendering a plan to text: the exec argv and the pasteable hint, in POSIX
//! sh and PowerShell. All quoting in the host happens here.
//!
//! # POSIX sh
//!
//! Every word is single-quoted (`'` becomes `'\''`) unless it consists only
//! of characters no shell treats specially (`ip`, `eth0`, `--mode=config`,
//! `/etc/hostname` stay bare for readability). A file is written with
//! `printf '%s' '<content>' > <path>`, so its content reaches the file byte
//! for byte: no escape, `%`, `$` or trailing newline is interpreted or lost.
//! A remove pattern quotes its literal parts and leaves each `*` bare, so
//! `*` is the only wildcard (with sh rules: it does not match a leading
//! `.`); a pattern that matches nothing stays literal and `rm -f` ignores it.
//! A write with `parents` runs `mkdir -p -- <parent>` first, in a subshell
//! whose umask also clears group and other write (`umask go-w`): the
//! directories it creates get 0755 less the umask. The file itself is
//! written in a subshell whose umask clears every permission bit its mode
//! does not grant (`umask 0133` for 0644; without a mode, `umask go-w`),
//! then `chmod`ed to its mode: it is never created wider than declared.
//!
//! A `name_link` step is a fixed subshell with three values, the MAC, the
//! name and the MACs of all the plan's `name_link` steps, set as quoted
//! variables: it looks for the interface under `/sys/class/net` whose
//! `address` is the MAC (an entry with a `device` link first, so a bond,
//! bridge or VLAN that shares the MAC is not taken for the NIC), fails with
//! a message on stderr if there is none, and otherwise renames it with `ip
//! link set dev CUR down`, `ip link set dev CUR name NAME` (skipped when it
//! has the name) and brings it up with `ip link set dev NAME up`. If a
//! failed rename leaves it down, it is brought back up before the step
//! fails. If another interface has the name already, the step fails naming
//! both, unless another `name_link` step of the plan names that
//! interface's MAC: then it is moved aside first (down, renamed to
//! `fx` and its MAC's twelve hex digits, 14 bytes), so two NICs whose names
//! are swapped can be named, each by its own step.
//!
//! The output is POSIX sh; the tests run it under dash and bash.
//!
//! # PowerShell
//!
//! Every word is single-quoted, each single-quote character doubled
//! (PowerShell also takes the typographic quotes U+2018..U+201B as single
//! quotes). `Remove-Item -Path` treats `[`, `]` and `?` as wildcards too, so
//! the literal parts of a pattern escape them with a backtick. Windows has
//! no mode bits: a write step's mode is ignored; `parents` is `New-Item
//! -ItemType Directory -Force` on the parent first. A `name_link` step is
//! refused in a PowerShell plan by [`Plan::check`], so it is never rendered
//! here (a plan that skipped the check gets a step that throws). Windows
//! PowerShell 5.1
//! passes arguments to native programs through its own command-line
//! quoting, which mangles arguments with embedded `"` and drops empty ones;
//! the Windows plan today is one direct `powershell -nop -c` run, which
//! avoids it. The exec script is one script block, `& { param([string]$nonce)
//! ... }`, and PowerShell appends the quoted nonce after it as its argument
//! ([`exec_argv`]). Both forms are parsed back by an independent PowerShell
//! grammar in the tests (`host/tests/ps_props.rs`): every value is one verbatim
//! string that unquotes to itself.

use std::borrow::Cow;
use std::fmt::Write as _;

use base64::Engine as _;

use crate::facts::MacAddr;

use super::{Dialect, NameLink, Nonce, Plan, Step, StepAction, WriteFile, format_mode, marker};

/// The lines that open a hint script, one comment line each (for example
/// the pod, the VM and the scenario). Line breaks and other control
/// characters cannot break out of the comment: a line is split at line
/// breaks and other control characters become spaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScriptHeader {
    pub title: Vec<String>,
}

/// Quote `word` as one POSIX sh word (an argument, not a command name).
///
/// Words made only of ASCII letters, digits and `_-./=:,+@%` stay bare
/// (unless they start with `=`, which zsh expands); everything else is
/// single-quoted, with `'` written as `\'` between quoted runs (`it's`
/// becomes `'it'\''s'`). The empty word is `''`.
pub fn sh_quote(word: &str) -> Cow<'_, str> {
    if is_bare_sh(word) {
        Cow::Borrowed(word)
    } else {
        Cow::Owned(single_quote_sh(word))
    }
}

/// An argv as one sh command line, for people (logs, `--dry-run`): each
/// word quoted by [`sh_quote`], the first as a command name (an `=` or a
/// reserved word is quoted too), joined by spaces.
pub fn sh_words(argv: &[String]) -> String {
    let mut out = String::new();
    for (i, word) in argv.iter().enumerate() {
        if i == 0 {
            out.push_str(&sh_command_word(word));
        } else {
            out.push(' ');
            out.push_str(&sh_quote(word));
        }
    }
    out
}

/// Quote `word` as one PowerShell single-quoted string: always quoted,
/// every single-quote character doubled.
pub fn ps_quote(word: &str) -> String {
    let mut out = String::with_capacity(word.len() + 2);
    out.push('\'');
    for c in word.chars() {
        if is_ps_single_quote(c) {
            out.push(c);
        }
        out.push(c);
    }
    out.push('\'');
    out
}

/// The standard, padded base64 of the hint script: the value of the
/// `vm.cocoonstack.io/post-clone-hint` annotation.
pub fn hint_base64(script: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(script)
}

/// The argv to run after `cocoon vm exec <id> --`, without the exec's
/// nonce: one exec runs the whole plan, and [`exec_argv`] adds the nonce
/// of each exec.
///
/// A plan of exactly one step that runs a program (and is not best effort)
/// is that program's argv unchanged: the Windows plan becomes the spec's
/// `powershell -nop -c <script>`. Any other plan becomes `sh -c <script>`
/// or `powershell -NoProfile -NonInteractive -Command <script>`, where the
/// script runs every step in order and writes the
/// [markers](super#marker-protocol) to stderr: a start marker before each step, a
/// failure marker with the exit code when a step fails. A failing step
/// stops the script with its exit code; a failing best-effort step writes
/// an "ignored" marker and the script goes on.
///
/// The script reads the nonce from its argument, so its text is the same
/// for every exec of the plan, whichever pod or attempt it is for.
pub fn render_exec(plan: &Plan) -> Vec<String> {
    if let Some(argv) = direct_run(plan) {
        return argv.to_vec();
    }
    match plan.dialect {
        Dialect::PosixSh => vec!["sh".into(), "-c".into(), sh_exec_script(plan)],
        Dialect::PowerShell => vec![
            "powershell".into(),
            "-NoProfile".into(),
            "-NonInteractive".into(),
            "-Command".into(),
            ps_exec_script(plan),
        ],
    }
}

/// The argv of one exec of `plan`: `exec` (what [`render_exec`] made of
/// `plan`) with the exec's `nonce` added where its script reads it.
///
/// - POSIX sh: `sh -c <script> sh <nonce>`: `sh` is the script's `$0`
///   (the name in the shell's own error messages), the nonce its `$1`.
/// - PowerShell: `powershell ... -Command <script> '<nonce>'`. PowerShell
///   joins the words after `-Command` with spaces into one command, and the
///   script is one script block, `& { param([string]$nonce) ... }`, so the
///   quoted nonce becomes its argument.
/// - The direct form (one run step) has no markers: `exec` unchanged.
pub fn exec_argv(plan: &Plan, exec: &[String], nonce: &Nonce) -> Vec<String> {
    let mut argv = exec.to_vec();
    if direct_run(plan).is_none() {
        match plan.dialect {
            Dialect::PosixSh => argv.extend(["sh".to_owned(), nonce.to_string()]),
            Dialect::PowerShell => argv.push(ps_quote(nonce.as_str())),
        }
    }
    argv
}

/// The nonce an argv of [`exec_argv`] carries (its last word), for
/// stand-ins of a guest (tests, benchmarks) that write markers as the
/// script would; `None` when the last word is no nonce.
pub fn exec_nonce(argv: &[String]) -> Option<Nonce> {
    let last = argv.last()?;
    let bare = last
        .strip_prefix('\'')
        .and_then(|s| s.strip_suffix('\''))
        .unwrap_or(last);
    Nonce::parse(bare)
}

/// The done marker line of an exec with `nonce` (without the line breaks
/// the script writes around it), for stand-ins of a guest that ran the
/// whole script.
pub fn done_marker(nonce: &Nonce) -> String {
    marker::line(nonce, marker::DONE)
}

/// The plan as a script a person pastes into the guest (or saves and runs):
/// the `post-clone-hint`. It stops at the first failing step with a message
/// naming the step, and reports a failing best-effort step but goes on.
///
/// POSIX sh: the steps run in a subshell, so pasting it into an interactive
/// root shell does not log that shell out when a step fails; as a file it
/// exits with the failing step's status. PowerShell: the steps run in a
/// script block with `$ErrorActionPreference = 'Stop'`, and a failure
/// throws: `exit` would close the console the script was pasted into.
pub fn render_script(plan: &Plan, header: &ScriptHeader) -> String {
    match plan.dialect {
        Dialect::PosixSh => sh_script(plan, header),
        Dialect::PowerShell => ps_script(plan, header),
    }
}

/// The argv of a plan rendered in the direct form (see [`render_exec`]).
pub(super) fn direct_run(plan: &Plan) -> Option<&[String]> {
    match plan.steps.as_slice() {
        [
            Step {
                best_effort: false,
                action: StepAction::Run(argv),
                ..
            },
        ] => Some(argv),
        _ => None,
    }
}

// ---------------------------------------------------------------- POSIX sh

fn is_bare_sh(word: &str) -> bool {
    !word.is_empty()
        && !word.starts_with('=')
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-./=:,+@%".contains(&b))
}

/// `word` in single quotes, each `'` written as `\'` between quoted runs;
/// no empty `''` pair except for the empty word itself.
fn single_quote_sh(word: &str) -> String {
    if word.is_empty() {
        return "''".into();
    }
    let mut out = String::with_capacity(word.len() + 2);
    for (i, run) in word.split('\'').enumerate() {
        if i > 0 {
            out.push_str(r"\'");
        }
        if !run.is_empty() {
            out.push('\'');
            out.push_str(run);
            out.push('\'');
        }
    }
    out
}

/// Words the shell reads as syntax in command position. Quoting one makes
/// it a plain command name.
const SH_RESERVED: [&str; 19] = [
    "case", "do", "done", "elif", "else", "esac", "fi", "for", "if", "in", "then", "until",
    "while", "function", "select", "time", "coproc", "[[", "]]",
];

/// Quote `word` for command position: an `=` would make it an assignment
/// and a reserved word would be syntax.
fn sh_command_word(word: &str) -> Cow<'_, str> {
    if word.contains('=') || SH_RESERVED.contains(&word) {
        Cow::Owned(single_quote_sh(word))
    } else {
        sh_quote(word)
    }
}

/// A remove pattern: literal parts quoted, each `*` bare.
fn sh_pattern(pattern: &str) -> String {
    let mut out = String::new();
    for (i, part) in pattern.split('*').enumerate() {
        if i > 0 {
            out.push('*');
        }
        if !part.is_empty() {
            out.push_str(&sh_quote(part));
        }
    }
    out
}

/// The directory of a checked absolute path: `None` for a file at the root.
fn parent_dir(path: &str) -> Option<&str> {
    path.rfind('/').filter(|at| *at > 0).map(|at| &path[..at])
}

/// Where Linux lists the network interfaces, one entry per name with its
/// `address` file: the directory a `name_link` step searches.
pub(super) const SYS_CLASS_NET: &str = "/sys/class/net";

/// The MACs of the plan's `name_link` steps, in plan order, each once.
fn name_link_macs(plan: &Plan) -> Vec<MacAddr> {
    let mut macs = Vec::new();
    for step in &plan.steps {
        if let StepAction::NameLink(link) = &step.action
            && !macs.contains(&link.mac)
        {
            macs.push(link.mac);
        }
    }
    macs
}

/// A `name_link` step as one subshell (see the module docs); `links` are
/// the MACs every `name_link` step of the plan names.
fn sh_name_link(link: &NameLink, links: &[MacAddr]) -> String {
    let mac = link.mac.to_string();
    let links = links
        .iter()
        .map(MacAddr::to_string)
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        r#"(mac={mac} name={name} links={links} cur=
for d in {net}/*; do
  [ "$(cat "$d/address" 2>/dev/null)" = "$mac" ] || continue
  if [ -e "$d/device" ]; then cur=${{d##*/}}; break; fi
  [ -n "$cur" ] || cur=${{d##*/}}
done
if [ -z "$cur" ]; then printf 'no network interface has MAC %s\n' "$mac" >&2; exit 1; fi
if [ "$cur" != "$name" ]; then
  if [ -e {net}/"$name" ]; then
    held=$(cat {net}/"$name"/address 2>/dev/null)
    case " $links " in *" $held "*) [ "$held" != "$mac" ] ;; *) false ;; esac || {{ printf 'cannot name %s (MAC %s) %s: interface %s (MAC %s) already has that name\n' "$cur" "$mac" "$name" "$name" "$held" >&2; exit 1; }}
    aside=fx; IFS=:; for b in $held; do aside=$aside$b; done; unset IFS
    if [ -e {net}/"$aside" ]; then printf 'cannot move %s (MAC %s) aside: interface %s exists\n' "$name" "$held" "$aside" >&2; exit 1; fi
    ip link set dev "$name" down && ip link set dev "$name" name "$aside" || {{ rc=$?; ip link set dev "$name" up; exit "$rc"; }}
  fi
  ip link set dev "$cur" down && ip link set dev "$cur" name "$name" || {{ rc=$?; ip link set dev "$cur" up; exit "$rc"; }}
fi
ip link set dev "$name" up)"#,
        mac = sh_quote(&mac),
        name = sh_quote(&link.name),
        links = sh_quote(&links),
        net = SYS_CLASS_NET,
    )
}

/// One step's command, without any failure handling; `links` as for
/// [`sh_name_link`].
fn sh_command(action: &StepAction, links: &[MacAddr]) -> String {
    match action {
        StepAction::Run(argv) => sh_words(argv),
        StepAction::WriteFile(WriteFile {
            path,
            content,
            mode,
            parents,
        }) => {
            let mkdir = match parent_dir(path) {
                // Under the umask with group and other write added: 0755
                // less the umask, even where the umask is looser.
                Some(dir) if *parents => {
                    format!("(umask go-w && mkdir -p -- {}) && ", sh_quote(dir))
                }
                _ => String::new(),
            };
            let path = sh_quote(path);
            // Created under a umask that clears every permission bit the
            // mode does not grant (without a mode, group and other
            // write), so a loose umask in the guest never leaves the file
            // wider than declared, not even until the chmod.
            let umask = match mode {
                Some(mode) => format_mode(0o777 & !*mode),
                None => "go-w".to_owned(),
            };
            let mut out = format!(
                "{mkdir}(umask {umask} && printf '%s' {} > {path})",
                sh_quote(content)
            );
            if let Some(mode) = mode {
                let _ = write!(out, " && chmod {} {path}", format_mode(*mode));
            }
            out
        }
        StepAction::RemoveFiles(patterns) => {
            let mut out = String::from("rm -f --");
            for p in patterns {
                out.push(' ');
                out.push_str(&sh_pattern(p));
            }
            out
        }
        StepAction::NameLink(link) => sh_name_link(link, links),
    }
}

/// Append the `printf` that writes the marker of `event` to stderr as a
/// line of its own (a line break before it): the prefix, the exec's nonce
/// (`$1`, see [`exec_argv`]), the event and, with `code_var`, that
/// variable (the exit code). The prefix and event are part of the format,
/// escaped for it. (Written in place: a plan renders two per step.)
fn push_sh_marker(out: &mut String, event: &str, code_var: Option<&str>) {
    let mut format = String::with_capacity(marker::PREFIX.len() + event.len() + 12);
    format.push_str("\\n");
    push_printf_literal(&mut format, marker::PREFIX);
    format.push_str("%s ");
    push_printf_literal(&mut format, event);
    if code_var.is_some() {
        format.push_str("%s");
    }
    format.push_str("\\n");
    out.push_str("printf ");
    out.push_str(&sh_quote(&format));
    out.push_str(r#" "$1""#);
    if let Some(var) = code_var {
        out.push_str(" \"");
        out.push_str(var);
        out.push('"');
    }
    out.push_str(" >&2");
}

/// Append `text` as literal text in a `printf` format: `\` and `%`
/// escaped.
fn push_printf_literal(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str(r"\\"),
            '%' => out.push_str("%%"),
            c => out.push(c),
        }
    }
}

fn sh_exec_script(plan: &Plan) -> String {
    let total = plan.steps.len();
    let links = name_link_macs(plan);
    let mut out = String::new();
    for (i, step) in plan.steps.iter().enumerate() {
        let n = i + 1;
        let command = sh_command(&step.action, &links);
        push_sh_marker(&mut out, &marker::start(n, total), None);
        out.push('\n');
        out.push_str(&command);
        out.push_str(" || ");
        if step.best_effort {
            // `$?` is expanded before printf runs: the step's status.
            push_sh_marker(&mut out, &marker::ignored_prefix(n, total), Some("$?"));
        } else {
            // After `||` the status is never 0, so the exit code is too.
            out.push_str("{ rc=$?; ");
            push_sh_marker(&mut out, &marker::failed_prefix(n, total), Some("$rc"));
            out.push_str("; exit \"$rc\"; }");
        }
        out.push('\n');
    }
    push_sh_marker(&mut out, marker::DONE, None);
    out.push('\n');
    out
}

fn sh_script(plan: &Plan, header: &ScriptHeader) -> String {
    let total = plan.steps.len();
    let mut out = String::from("#!/bin/sh\n");
    push_comments(&mut out, &header.title);
    out.push_str("# Paste into a root shell in the guest. Stops at the first failing step.\n");
    out.push_str("(\n");
    let links = name_link_macs(plan);
    for (i, step) in plan.steps.iter().enumerate() {
        let n = i + 1;
        push_step_comment(&mut out, n, total, step);
        let command = sh_command(&step.action, &links);
        if step.best_effort {
            let _ = writeln!(
                out,
                r#"{command} || printf '\nstep {n}/{total} failed (exit %s), ignored: best effort\n' "$?" >&2"#
            );
        } else {
            let _ = writeln!(
                out,
                r#"{command} || {{ rc=$?; printf '\nstep {n}/{total} failed (exit %s), stopping\n' "$rc" >&2; exit "$rc"; }}"#
            );
        }
    }
    let _ = writeln!(out, "echo 'cocoon-fixup: all {total} steps done'");
    out.push_str(")\n");
    out
}

// -------------------------------------------------------------- PowerShell

fn is_ps_single_quote(c: char) -> bool {
    matches!(c, '\'' | '\u{2018}' | '\u{2019}' | '\u{201A}' | '\u{201B}')
}

/// A remove pattern for `Remove-Item -Path`: the wildcard characters other
/// than `*` (and the escape character itself) escaped with a backtick.
fn ps_pattern(pattern: &str) -> String {
    let mut escaped = String::with_capacity(pattern.len());
    for c in pattern.chars() {
        if matches!(c, '`' | '[' | ']' | '?') {
            escaped.push('`');
        }
        escaped.push(c);
    }
    ps_quote(&escaped)
}

fn ps_command(action: &StepAction) -> String {
    match action {
        StepAction::Run(argv) => {
            let mut out = String::from("&");
            for w in argv {
                out.push(' ');
                out.push_str(&ps_quote(w));
            }
            out
        }
        StepAction::WriteFile(WriteFile {
            path,
            content,
            parents,
            ..
        }) => {
            let mkdir = match parent_dir(path) {
                Some(dir) if *parents => format!(
                    "$null = New-Item -ItemType Directory -Force -Path {}; ",
                    ps_quote(dir)
                ),
                _ => String::new(),
            };
            format!(
                "{mkdir}[IO.File]::WriteAllText({}, {})",
                ps_quote(path),
                ps_quote(content)
            )
        }
        StepAction::NameLink(_) => {
            "throw 'name_link is not rendered for PowerShell plans'".to_owned()
        }
        StepAction::RemoveFiles(patterns) => {
            let paths: Vec<String> = patterns.iter().map(|p| ps_pattern(p)).collect();
            format!(
                "Remove-Item -Force -ErrorAction SilentlyContinue -Path {}",
                paths.join(", ")
            )
        }
    }
}

/// A marker line on stderr, with a line break before it: the prefix, the
/// exec's nonce (`$nonce`, the script block's argument), the event and,
/// with `code_var`, that variable (the exit code).
fn ps_marker(event: &str, code_var: Option<&str>) -> String {
    let mut line = format!(
        "{} + $nonce + {}",
        ps_quote(marker::PREFIX),
        ps_quote(&format!(" {event}"))
    );
    if let Some(var) = code_var {
        let _ = write!(line, " + {var}");
    }
    // One write, line breaks included, so no other output can land
    // between the break and the marker.
    format!("[Console]::Error.Write([Environment]::NewLine + {line} + [Environment]::NewLine)")
}

/// The exec script: one script block, `& { param([string]$nonce) ... }`,
/// that takes the exec's nonce as its argument (see [`exec_argv`]). It
/// ends with the block's `}` and no line break, so the nonce PowerShell
/// appends after a space is on the same line: the block's argument, not a
/// statement of its own. `exit` inside the block ends PowerShell with
/// that code.
///
/// `$ErrorActionPreference` stays `Continue`: under `Stop`, Windows
/// PowerShell turns a native program's stderr line into a terminating
/// error when its stderr is redirected, as it is under exec. Each step
/// runs in `try`, so an exception or a missing program counts as exit
/// code 1.
fn ps_exec_script(plan: &Plan) -> String {
    let total = plan.steps.len();
    let mut out = String::from("& {\nparam([string]$nonce)\n");
    for (i, step) in plan.steps.iter().enumerate() {
        let n = i + 1;
        let body = match &step.action {
            StepAction::Run(_) => format!(
                "$global:LASTEXITCODE = 0; {}; $rc = [int]$global:LASTEXITCODE",
                ps_command(&step.action)
            ),
            other => ps_command(other),
        };
        let _ = writeln!(out, "{}", ps_marker(&marker::start(n, total), None));
        let _ = writeln!(
            out,
            "$rc = 0; try {{ {body} }} catch {{ [Console]::Error.WriteLine($_.ToString()); $rc = 1 }}"
        );
        if step.best_effort {
            let ignored = ps_marker(&marker::ignored_prefix(n, total), Some("$rc"));
            let _ = writeln!(out, "if ($rc -ne 0) {{ {ignored} }}");
        } else {
            let failed = ps_marker(&marker::failed_prefix(n, total), Some("$rc"));
            let _ = writeln!(out, "if ($rc -ne 0) {{ {failed}; exit $rc }}");
        }
    }
    let _ = writeln!(out, "{}", ps_marker(marker::DONE, None));
    out.push_str("exit 0\n}");
    out
}

fn ps_script(plan: &Plan, header: &ScriptHeader) -> String {
    let total = plan.steps.len();
    let mut out = String::new();
    push_comments(&mut out, &header.title);
    out.push_str(
        "# Paste into an elevated PowerShell in the guest. Stops at the first failing step.\n",
    );
    out.push_str("& {\n$ErrorActionPreference = 'Stop'\n$global:LASTEXITCODE = 0\n");
    for (i, step) in plan.steps.iter().enumerate() {
        let n = i + 1;
        push_step_comment(&mut out, n, total, step);
        let command = ps_command(&step.action);
        let is_run = matches!(step.action, StepAction::Run(_));
        match (step.best_effort, is_run) {
            (false, true) => {
                let _ = writeln!(
                    out,
                    "{command}\nif ($LASTEXITCODE -ne 0) {{ throw \"step {n}/{total} failed with exit code $LASTEXITCODE\" }}"
                );
            }
            (false, false) => {
                let _ = writeln!(out, "{command}");
            }
            (true, true) => {
                let _ = writeln!(
                    out,
                    "try {{ {command}; if ($LASTEXITCODE -ne 0) {{ throw \"exit code $LASTEXITCODE\" }} }} catch {{ Write-Warning \"step {n}/{total} failed, ignored (best effort): $_\"; $global:LASTEXITCODE = 0 }}"
                );
            }
            (true, false) => {
                let _ = writeln!(
                    out,
                    "try {{ {command} }} catch {{ Write-Warning \"step {n}/{total} failed, ignored (best effort): $_\" }}"
                );
            }
        }
    }
    let _ = writeln!(out, "Write-Host 'cocoon-fixup: all {total} steps done'");
    out.push_str("}\n");
    out
}

// ------------------------------------------------------------------ shared

/// `text` as `#` comment lines: split at line breaks, other control
/// characters replaced by spaces. Both dialects use `#` line comments.
fn push_comments(out: &mut String, lines: &[String]) {
    for line in lines {
        for part in line.split(['\n', '\r']) {
            let clean: String = part
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            let clean = clean.trim_end();
            if clean.is_empty() {
                out.push_str("#\n");
            } else {
                let _ = writeln!(out, "# {clean}");
            }
        }
    }
}

fn push_step_comment(out: &mut String, n: usize, total: usize, step: &Step) {
    let suffix = if step.best_effort {
        " (best effort)"
    } else {
        ""
    };
    push_comments(out, &[format!("{n}/{total}: {}{suffix}", step.description)]);
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;
    use crate::plan::Phase;

    fn step(description: &str, best_effort: bool, action: StepAction) -> Step {
        Step {
            description: description.into(),
            phase: Phase::Configure,
            best_effort,
            action,
        }
    }

    fn strings(words: &[&str]) -> Vec<String> {
        words.iter().map(|s| s.to_string()).collect()
    }

    fn linux_plan() -> Plan {
        Plan {
            dialect: Dialect::PosixSh,
            steps: vec![
                step(
                    "Drop the page cache",
                    true,
                    StepAction::WriteFile(WriteFile {
                        path: "/proc/sys/vm/drop_caches".into(),
                        content: "3\n".into(),
                        mode: None,
                        parents: false,
                    }),
                ),
                step(
                    "Write the hostname",
                    false,
                    StepAction::WriteFile(WriteFile {
                        path: "/etc/hostname".into(),
                        content: "vm-1\n".into(),
                        mode: Some(0o644),
                        parents: false,
                    }),
                ),
                step(
                    "Remove stale networkd files",
                    false,
                    StepAction::RemoveFiles(strings(&["/etc/systemd/network/10-*.network"])),
                ),
                step(
                    "Re-run cloud-init modules",
                    false,
                    StepAction::Run(strings(&["cloud-init", "modules", "--mode=config"])),
                ),
            ],
        }
    }

    #[rstest]
    #[case::bare("ip", "ip")]
    #[case::bare_option("--mode=config", "--mode=config")]
    #[case::bare_path("/etc/hostname", "/etc/hostname")]
    #[case::bare_mac("52:54:00:12:34:56", "52:54:00:12:34:56")]
    #[case::bare_cidr("10.0.0.2/24", "10.0.0.2/24")]
    #[case::leading_dash("-n", "-n")]
    #[case::percent("%s", "%s")]
    #[case::empty("", "''")]
    #[case::space("a b", "'a b'")]
    #[case::single_quote("it's", r"'it'\''s'")]
    #[case::only_quotes("''", r"\'\'")]
    #[case::quote_ends("'a'", r"\''a'\'")]
    #[case::newline("a\nb\n", "'a\nb\n'")]
    #[case::backslash(r"a\nb\", r"'a\nb\'")]
    #[case::dollar("$HOME", "'$HOME'")]
    #[case::command_substitution("$(reboot)", "'$(reboot)'")]
    #[case::backticks("`id`", "'`id`'")]
    #[case::glob("*", "'*'")]
    #[case::tilde("~root", "'~root'")]
    #[case::hash("#x", "'#x'")]
    #[case::leading_equals("=ls", "'=ls'")]
    #[case::bang("!!", "'!!'")]
    #[case::semicolon("a;b", "'a;b'")]
    #[case::unicode("ünï ✓", "'ünï ✓'")]
    #[case::unicode_word("ü", "'ü'")]
    fn sh_quoting(#[case] word: &str, #[case] quoted: &str) {
        assert_eq!(sh_quote(word), quoted);
    }

    #[rstest]
    #[case::plain("ip", "ip")]
    #[case::assignment("a=b", "'a=b'")]
    #[case::reserved("if", "'if'")]
    #[case::reserved_done("done", "'done'")]
    fn sh_command_words(#[case] word: &str, #[case] quoted: &str) {
        assert_eq!(sh_command_word(word), quoted);
    }

    #[rstest]
    #[case::plain("ip", "'ip'")]
    #[case::empty("", "''")]
    #[case::single_quote("it's", "'it''s'")]
    #[case::typographic("‘a’ ‚b‛", "'‘‘a’’ ‚‚b‛‛'")]
    #[case::dollar_backtick("$x `n \"q\"", "'$x `n \"q\"'")]
    #[case::newline("a\r\nb", "'a\r\nb'")]
    #[case::percent_backslash(r"%PATH% \\srv", r"'%PATH% \\srv'")]
    fn ps_quoting(#[case] word: &str, #[case] quoted: &str) {
        assert_eq!(ps_quote(word), quoted);
    }

    #[rstest]
    #[case::glob(
        "/etc/systemd/network/10-*.network",
        "/etc/systemd/network/10-*.network"
    )]
    #[case::star_only("/tmp/*", "/tmp/*")]
    #[case::two_stars("/a b/*x*", "'/a b/'*x*")]
    #[case::quote_and_star("/it's/*'*", r"'/it'\''s/'*\'*")]
    #[case::literal_question("/x/a?[b]", "'/x/a?[b]'")]
    #[case::no_star("/x/y", "/x/y")]
    fn sh_patterns(#[case] pattern: &str, #[case] rendered: &str) {
        assert_eq!(sh_pattern(pattern), rendered);
    }

    #[test]
    fn sh_words_quote_an_argv() {
        assert_eq!(
            sh_words(&strings(&["sh", "-c", "echo 'hi'"])),
            r"sh -c 'echo '\''hi'\'"
        );
        assert_eq!(sh_words(&strings(&["if", "a=b"])), "'if' a=b");
        assert_eq!(sh_words(&[]), "");
    }

    #[test]
    fn ps_patterns_escape_other_wildcards() {
        assert_eq!(ps_pattern("C:/x/a?[b]`*.txt"), "'C:/x/a`?`[b`]``*.txt'");
        assert_eq!(ps_pattern("/x/it's*"), "'/x/it''s*'");
    }

    #[rstest]
    #[case::run(
        StepAction::Run(strings(&["ip", "link", "set", "dev", "eth0", "address", "52:54:00:12:34:56"])),
        "ip link set dev eth0 address 52:54:00:12:34:56"
    )]
    #[case::run_nasty(
        StepAction::Run(strings(&["echo", "it's", "", "$(x)"])),
        r"echo 'it'\''s' '' '$(x)'"
    )]
    #[case::write_mode(
        StepAction::WriteFile(WriteFile { path: "/etc/hostname".into(), content: "vm-1\n".into(), mode: Some(0o644), parents: false }),
        "(umask 0133 && printf '%s' 'vm-1\n' > /etc/hostname) && chmod 0644 /etc/hostname"
    )]
    #[case::write_no_mode(
        StepAction::WriteFile(WriteFile { path: "/proc/sys/vm/drop_caches".into(), content: "3".into(), mode: None, parents: false }),
        "(umask go-w && printf '%s' 3 > /proc/sys/vm/drop_caches)"
    )]
    #[case::write_nasty(
        StepAction::WriteFile(WriteFile { path: "/etc/a b".into(), content: "%d 'x'".into(), mode: Some(0o600), parents: false }),
        r"(umask 0177 && printf '%s' '%d '\''x'\' > '/etc/a b') && chmod 0600 '/etc/a b'"
    )]
    #[case::remove(
        StepAction::RemoveFiles(strings(&["/etc/systemd/network/10-*.network", "/etc/x y"])),
        "rm -f -- /etc/systemd/network/10-*.network '/etc/x y'"
    )]
    #[case::write_parents(
        StepAction::WriteFile(WriteFile { path: "/etc/network/it's/interfaces".into(), content: "x".into(), mode: Some(0o644), parents: true }),
        r#"(umask go-w && mkdir -p -- '/etc/network/it'\''s') && (umask 0133 && printf '%s' x > '/etc/network/it'\''s/interfaces') && chmod 0644 '/etc/network/it'\''s/interfaces'"#
    )]
    #[case::write_parents_at_the_root(
        StepAction::WriteFile(WriteFile { path: "/x".into(), content: "".into(), mode: None, parents: true }),
        "(umask go-w && printf '%s' '' > /x)"
    )]
    fn sh_commands(#[case] action: StepAction, #[case] rendered: &str) {
        assert_eq!(sh_command(&action, &[]), rendered);
    }

    #[test]
    fn sh_name_link_sets_the_three_values_and_nothing_else_varies() {
        let mac = crate::facts::MacAddr([0x52, 0x54, 0, 0xaa, 0xbb, 0x01]);
        let other_mac = crate::facts::MacAddr([0x52, 0x54, 0, 0xaa, 0xbb, 0x02]);
        let link = |name: &str| NameLink {
            mac,
            name: name.into(),
        };
        let eth0 = sh_command(&StepAction::NameLink(link("eth0")), &[mac, other_mac]);
        let expected = r#"(mac=52:54:00:aa:bb:01 name=eth0 links='52:54:00:aa:bb:01 52:54:00:aa:bb:02' cur=
for d in /sys/class/net/*; do
  [ "$(cat "$d/address" 2>/dev/null)" = "$mac" ] || continue
  if [ -e "$d/device" ]; then cur=${d##*/}; break; fi
  [ -n "$cur" ] || cur=${d##*/}
done
if [ -z "$cur" ]; then printf 'no network interface has MAC %s\n' "$mac" >&2; exit 1; fi
if [ "$cur" != "$name" ]; then
  if [ -e /sys/class/net/"$name" ]; then
    held=$(cat /sys/class/net/"$name"/address 2>/dev/null)
    case " $links " in *" $held "*) [ "$held" != "$mac" ] ;; *) false ;; esac || { printf 'cannot name %s (MAC %s) %s: interface %s (MAC %s) already has that name\n' "$cur" "$mac" "$name" "$name" "$held" >&2; exit 1; }
    aside=fx; IFS=:; for b in $held; do aside=$aside$b; done; unset IFS
    if [ -e /sys/class/net/"$aside" ]; then printf 'cannot move %s (MAC %s) aside: interface %s exists\n' "$name" "$held" "$aside" >&2; exit 1; fi
    ip link set dev "$name" down && ip link set dev "$name" name "$aside" || { rc=$?; ip link set dev "$name" up; exit "$rc"; }
  fi
  ip link set dev "$cur" down && ip link set dev "$cur" name "$name" || { rc=$?; ip link set dev "$cur" up; exit "$rc"; }
fi
ip link set dev "$name" up)"#;
        assert_eq!(eth0, expected);
        // Another name or plan changes only the first line.
        let other = sh_command(&StepAction::NameLink(link("lan_1.2")), &[mac]);
        assert_eq!(
            other.replacen(
                "name=lan_1.2 links=52:54:00:aa:bb:01 ",
                "name=eth0 links='52:54:00:aa:bb:01 52:54:00:aa:bb:02' ",
                1
            ),
            expected
        );
    }

    #[test]
    fn ps_parents_creates_the_directory_first() {
        let write = StepAction::WriteFile(WriteFile {
            path: "/ProgramData/acme/it's.txt".into(),
            content: "x".into(),
            mode: None,
            parents: true,
        });
        assert_eq!(
            ps_command(&write),
            "$null = New-Item -ItemType Directory -Force -Path '/ProgramData/acme'; [IO.File]::WriteAllText('/ProgramData/acme/it''s.txt', 'x')"
        );
    }

    #[test]
    fn sh_hint_golden() {
        let header = ScriptHeader {
            title: vec![
                "cocoon-fixup post-clone plan for pod default/web-0".into(),
                "scenario cloudimg\nsecond line\twith a tab".into(),
            ],
        };
        let expected = r#"#!/bin/sh
# cocoon-fixup post-clone plan for pod default/web-0
# scenario cloudimg
# second line with a tab
# Paste into a root shell in the guest. Stops at the first failing step.
(
# 1/4: Drop the page cache (best effort)
(umask go-w && printf '%s' '3
' > /proc/sys/vm/drop_caches) || printf '\nstep 1/4 failed (exit %s), ignored: best effort\n' "$?" >&2
# 2/4: Write the hostname
(umask 0133 && printf '%s' 'vm-1
' > /etc/hostname) && chmod 0644 /etc/hostname || { rc=$?; printf '\nstep 2/4 failed (exit %s), stopping\n' "$rc" >&2; exit "$rc"; }
# 3/4: Remove stale networkd files
rm -f -- /etc/systemd/network/10-*.network || { rc=$?; printf '\nstep 3/4 failed (exit %s), stopping\n' "$rc" >&2; exit "$rc"; }
# 4/4: Re-run cloud-init modules
cloud-init modules --mode=config || { rc=$?; printf '\nstep 4/4 failed (exit %s), stopping\n' "$rc" >&2; exit "$rc"; }
echo 'cocoon-fixup: all 4 steps done'
)
"#;
        assert_eq!(render_script(&linux_plan(), &header), expected);
    }

    #[test]
    fn sh_exec_golden() {
        let argv = render_exec(&linux_plan());
        assert_eq!(argv[..2], ["sh", "-c"]);
        assert_eq!(argv.len(), 3);
        let expected = r#"printf '\ncocoon-fixup: %s step 1/4 start\n' "$1" >&2
(umask go-w && printf '%s' '3
' > /proc/sys/vm/drop_caches) || printf '\ncocoon-fixup: %s step 1/4 ignored exit %s\n' "$1" "$?" >&2
printf '\ncocoon-fixup: %s step 2/4 start\n' "$1" >&2
(umask 0133 && printf '%s' 'vm-1
' > /etc/hostname) && chmod 0644 /etc/hostname || { rc=$?; printf '\ncocoon-fixup: %s step 2/4 failed exit %s\n' "$1" "$rc" >&2; exit "$rc"; }
printf '\ncocoon-fixup: %s step 3/4 start\n' "$1" >&2
rm -f -- /etc/systemd/network/10-*.network || { rc=$?; printf '\ncocoon-fixup: %s step 3/4 failed exit %s\n' "$1" "$rc" >&2; exit "$rc"; }
printf '\ncocoon-fixup: %s step 4/4 start\n' "$1" >&2
cloud-init modules --mode=config || { rc=$?; printf '\ncocoon-fixup: %s step 4/4 failed exit %s\n' "$1" "$rc" >&2; exit "$rc"; }
printf '\ncocoon-fixup: %s done\n' "$1" >&2
"#;
        assert_eq!(argv[2], expected);
    }

    const NONCE: &str = "0123456789abcdef0123456789abcdef";

    /// Each exec adds its nonce where the script reads it; the script's
    /// text is the same for every exec.
    #[test]
    fn the_nonce_is_an_argument_not_script_text() {
        let nonce = Nonce::parse(NONCE).unwrap();
        let other = Nonce::generate().unwrap();
        let plan = linux_plan();
        let exec = render_exec(&plan);
        let argv = exec_argv(&plan, &exec, &nonce);
        assert_eq!(argv[..3], exec[..]);
        assert_eq!(argv[3..], ["sh", NONCE]);
        assert_eq!(exec_nonce(&argv), Some(nonce));
        assert_eq!(exec_argv(&plan, &exec, &other)[..3], exec[..]);
        assert!(!exec[2].contains(NONCE));

        let plan = mixed_windows_plan();
        let exec = render_exec(&plan);
        let argv = exec_argv(&plan, &exec, &nonce);
        assert_eq!(argv[..5], exec[..]);
        assert_eq!(argv[5..], [format!("'{NONCE}'")]);
        assert_eq!(exec_nonce(&argv), Some(nonce));
        assert!(exec[4].ends_with("\n}"), "no line break after the block");

        // The direct form has no markers and takes no nonce.
        let plan = windows_plan();
        let exec = render_exec(&plan);
        assert_eq!(exec_argv(&plan, &exec, &nonce), exec);
        assert_eq!(exec_nonce(&exec), None);
        assert_eq!(done_marker(&nonce), format!("cocoon-fixup: {NONCE} done"));
    }

    const PNP: &str = "$x=Get-PnpDevice -Class Net -PresentOnly;$x|Disable-PnpDevice -Confirm:$false;$x|Enable-PnpDevice -Confirm:$false";

    fn windows_plan() -> Plan {
        Plan {
            dialect: Dialect::PowerShell,
            steps: vec![step(
                "Re-enumerate network devices",
                false,
                StepAction::Run(strings(&["powershell", "-nop", "-c", PNP])),
            )],
        }
    }

    #[test]
    fn one_run_step_is_exec_directly() {
        assert_eq!(
            render_exec(&windows_plan()),
            strings(&["powershell", "-nop", "-c", PNP])
        );
        let linux = Plan {
            dialect: Dialect::PosixSh,
            steps: vec![step("x", false, StepAction::Run(strings(&["ip", "a b"])))],
        };
        assert_eq!(render_exec(&linux), strings(&["ip", "a b"]));
    }

    #[test]
    fn one_best_effort_or_non_run_step_is_a_script() {
        let mut plan = windows_plan();
        plan.steps[0].best_effort = true;
        assert_eq!(
            render_exec(&plan)[0..4],
            ["powershell", "-NoProfile", "-NonInteractive", "-Command"]
        );
        let write = Plan {
            dialect: Dialect::PosixSh,
            steps: vec![step(
                "x",
                false,
                StepAction::WriteFile(WriteFile {
                    path: "/x".into(),
                    content: String::new(),
                    mode: None,
                    parents: false,
                }),
            )],
        };
        assert_eq!(render_exec(&write)[0..2], ["sh", "-c"]);
    }

    #[test]
    fn ps_hint_golden() {
        let header = ScriptHeader {
            title: vec!["cocoon-fixup post-clone plan for pod default/win-0".into()],
        };
        let expected = r#"# cocoon-fixup post-clone plan for pod default/win-0
# Paste into an elevated PowerShell in the guest. Stops at the first failing step.
& {
$ErrorActionPreference = 'Stop'
$global:LASTEXITCODE = 0
# 1/1: Re-enumerate network devices
& 'powershell' '-nop' '-c' '$x=Get-PnpDevice -Class Net -PresentOnly;$x|Disable-PnpDevice -Confirm:$false;$x|Enable-PnpDevice -Confirm:$false'
if ($LASTEXITCODE -ne 0) { throw "step 1/1 failed with exit code $LASTEXITCODE" }
Write-Host 'cocoon-fixup: all 1 steps done'
}
"#;
        assert_eq!(render_script(&windows_plan(), &header), expected);
    }

    fn mixed_windows_plan() -> Plan {
        Plan {
            dialect: Dialect::PowerShell,
            steps: vec![
                step(
                    "Flush DNS",
                    true,
                    StepAction::Run(strings(&["ipconfig", "/flushdns"])),
                ),
                step(
                    "Write it's config",
                    false,
                    StepAction::WriteFile(WriteFile {
                        path: "/ProgramData/x/it's.txt".into(),
                        content: "a 'b'\r\n".into(),
                        mode: Some(0o644),
                        parents: false,
                    }),
                ),
                step(
                    "Remove logs",
                    true,
                    StepAction::RemoveFiles(strings(&[
                        "/ProgramData/x/[1]*.log",
                        "/ProgramData/y/z",
                    ])),
                ),
                step(
                    "Renew",
                    false,
                    StepAction::Run(strings(&["ipconfig", "/renew"])),
                ),
            ],
        }
    }

    #[test]
    fn ps_hint_golden_every_kind_of_step() {
        let expected = "# Paste into an elevated PowerShell in the guest. Stops at the first failing step.
& {
$ErrorActionPreference = 'Stop'
$global:LASTEXITCODE = 0
# 1/4: Flush DNS (best effort)
try { & 'ipconfig' '/flushdns'; if ($LASTEXITCODE -ne 0) { throw \"exit code $LASTEXITCODE\" } } catch { Write-Warning \"step 1/4 failed, ignored (best effort): $_\"; $global:LASTEXITCODE = 0 }
# 2/4: Write it's config
[IO.File]::WriteAllText('/ProgramData/x/it''s.txt', 'a ''b''\r\n')
# 3/4: Remove logs (best effort)
try { Remove-Item -Force -ErrorAction SilentlyContinue -Path '/ProgramData/x/`[1`]*.log', '/ProgramData/y/z' } catch { Write-Warning \"step 3/4 failed, ignored (best effort): $_\" }
# 4/4: Renew
& 'ipconfig' '/renew'
if ($LASTEXITCODE -ne 0) { throw \"step 4/4 failed with exit code $LASTEXITCODE\" }
Write-Host 'cocoon-fixup: all 4 steps done'
}
";
        assert_eq!(
            render_script(&mixed_windows_plan(), &ScriptHeader::default()),
            expected
        );
    }

    #[test]
    fn ps_exec_golden() {
        let argv = render_exec(&mixed_windows_plan());
        assert_eq!(
            argv[..4],
            ["powershell", "-NoProfile", "-NonInteractive", "-Command"]
        );
        let expected = "& {
param([string]$nonce)
[Console]::Error.Write([Environment]::NewLine + 'cocoon-fixup: ' + $nonce + ' step 1/4 start' + [Environment]::NewLine)
$rc = 0; try { $global:LASTEXITCODE = 0; & 'ipconfig' '/flushdns'; $rc = [int]$global:LASTEXITCODE } catch { [Console]::Error.WriteLine($_.ToString()); $rc = 1 }
if ($rc -ne 0) { [Console]::Error.Write([Environment]::NewLine + 'cocoon-fixup: ' + $nonce + ' step 1/4 ignored exit ' + $rc + [Environment]::NewLine) }
[Console]::Error.Write([Environment]::NewLine + 'cocoon-fixup: ' + $nonce + ' step 2/4 start' + [Environment]::NewLine)
$rc = 0; try { [IO.File]::WriteAllText('/ProgramData/x/it''s.txt', 'a ''b''\r\n') } catch { [Console]::Error.WriteLine($_.ToString()); $rc = 1 }
if ($rc -ne 0) { [Console]::Error.Write([Environment]::NewLine + 'cocoon-fixup: ' + $nonce + ' step 2/4 failed exit ' + $rc + [Environment]::NewLine); exit $rc }
[Console]::Error.Write([Environment]::NewLine + 'cocoon-fixup: ' + $nonce + ' step 3/4 start' + [Environment]::NewLine)
$rc = 0; try { Remove-Item -Force -ErrorAction SilentlyContinue -Path '/ProgramData/x/`[1`]*.log', '/ProgramData/y/z' } catch { [Console]::Error.WriteLine($_.ToString()); $rc = 1 }
if ($rc -ne 0) { [Console]::Error.Write([Environment]::NewLine + 'cocoon-fixup: ' + $nonce + ' step 3/4 ignored exit ' + $rc + [Environment]::NewLine) }
[Console]::Error.Write([Environment]::NewLine + 'cocoon-fixup: ' + $nonce + ' step 4/4 start' + [Environment]::NewLine)
$rc = 0; try { $global:LASTEXITCODE = 0; & 'ipconfig' '/renew'; $rc = [int]$global:LASTEXITCODE } catch { [Console]::Error.WriteLine($_.ToString()); $rc = 1 }
if ($rc -ne 0) { [Console]::Error.Write([Environment]::NewLine + 'cocoon-fixup: ' + $nonce + ' step 4/4 failed exit ' + $rc + [Environment]::NewLine); exit $rc }
[Console]::Error.Write([Environment]::NewLine + 'cocoon-fixup: ' + $nonce + ' done' + [Environment]::NewLine)
exit 0
}";
        assert_eq!(argv[4], expected);
    }

    #[test]
    fn comments_cannot_break_out() {
        let mut plan = linux_plan();
        plan.steps.truncate(1);
        plan.steps[0].description = "evil\nrm -rf /\r\u{85}x".into();
        let header = ScriptHeader {
            title: vec!["a\n\nb\u{1b}[31m".into()],
        };
        let script = render_script(&plan, &header);
        for line in script.lines() {
            assert!(
                line.starts_with('#')
                    || line.starts_with("(umask go-w && printf")
                    || line.starts_with("' >")
                    || ["(", ")"].contains(&line)
                    || line.starts_with("echo"),
                "unexpected line {line:?}"
            );
        }
        assert!(script.contains("# a\n#\n# b [31m\n"));
        assert!(script.contains("# 1/1: evil\n# rm -rf /\n#  x (best effort)\n"));
    }

    #[test]
    fn hint_is_standard_padded_base64() {
        assert_eq!(hint_base64("ab"), "YWI=");
        assert_eq!(hint_base64("#!/bin/sh\n?>"), "IyEvYmluL3NoCj8+");
        assert_eq!(hint_base64(""), "");
    }
}
