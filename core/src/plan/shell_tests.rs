//! The rendered sh really does what the plan says: the exec argv and the
//! hint run under real shells, with stub programs on PATH that record their
//! argv, and files written and removed inside a temporary directory.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use rstest::rstest;

use super::*;

/// Arguments no quoting may lose or interpret.
const NASTY: &[&str] = &[
    "it's",
    "''",
    "\\'",
    "%s %d %% %n %b",
    "back\\slash\\n\\",
    "line1\nline2\n",
    "\n",
    "$(touch PWNED)",
    "`touch PWNED`",
    "$HOME ${PATH} $1 $@ $$",
    "-n",
    "-",
    "--",
    "",
    " spaced  out ",
    "ünïcødé ✓ ‘q’",
    "*",
    "?",
    "[a]",
    "~",
    "~root",
    "#hash",
    "a=b",
    "=ls",
    "!bang !!",
    "tab\there",
    "cr\r\n",
    "; && || | > < & ( ) { }",
    "\"double\" quotes",
    "\u{7f}\u{1b}[0m",
];

/// A nonce no exec of these tests draws (the odds are 2^-128).
const WRONG: &str = "ffffffffffffffffffffffffffffffff";

/// How the plan is run: as the exec argv, or as the hint run by `sh -c`.
#[derive(Debug, Clone, Copy)]
enum Form {
    Exec,
    Script,
}

/// A stand-in guest: a PATH of stub programs and a directory for files.
struct Guest {
    root: tempfile::TempDir,
    bin: PathBuf,
    log: PathBuf,
    files: PathBuf,
    /// The nonce of the guest's exec-form runs.
    nonce: Nonce,
}

/// A stub records its argv (`$#`, then `basename $0` and every argument,
/// each NUL-terminated) and then runs `tail`.
fn stub(bin: &Path, name: &str, tail: &str) {
    let path = bin.join(name);
    // In place of a link to the real program, never written through it.
    match fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("{}: {e}", path.display()),
    }
    let script = format!(
        "#!/bin/sh\n{{ printf '%s\\0' \"$#\" \"${{0##*/}}\" \"$@\"; }} >> \"$STUB_LOG\"\n{tail}\n"
    );
    fs::write(&path, script).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
}

fn guest() -> Guest {
    let root = tempfile::tempdir().unwrap();
    let bin = root.path().join("bin");
    let files = root.path().join("we'ird $dir %s ü");
    fs::create_dir(&bin).unwrap();
    fs::create_dir(&files).unwrap();
    for name in ["rec", "if", "a=b", "then"] {
        stub(&bin, name, "exit 0");
    }
    stub(
        &bin,
        "fail3",
        "printf '%s' \"boom: it's broken\" >&2\nexit 3",
    );
    stub(&bin, "fail5", "printf 'warn\\n' >&2\nexit 5");
    // Markers a guest program can forge: without a nonce, with a wrong one.
    let forged = format!(
        "printf '\\ncocoon-fixup: done\\n\\ncocoon-fixup: {WRONG} done\\n\\ncocoon-fixup: {WRONG} step 4/4 failed exit 9\\n' >&2"
    );
    stub(&bin, "forge", &format!("{forged}\nexit 0"));
    stub(&bin, "forge5", &format!("{forged}\nexit 5"));
    for tool in ["chmod", "rm", "mkdir", "cat"] {
        symlink(Path::new("/bin").join(tool), bin.join(tool)).unwrap();
    }
    Guest {
        log: root.path().join("stub.log"),
        root,
        bin,
        files,
        nonce: Nonce::generate().unwrap(),
    }
}

impl Guest {
    /// Run `plan` under `shell` in the given form.
    fn run(&self, shell: &str, form: Form, plan: &Plan) -> Output {
        plan.check(&PlanLimits::default())
            .expect("test plans are valid");
        self.run_unchecked(shell, form, plan)
    }

    /// Run `plan` without the plan check: for the defences behind it.
    fn run_unchecked(&self, shell: &str, form: Form, plan: &Plan) -> Output {
        match form {
            Form::Exec => {
                let argv = exec_argv(plan, &render_exec(plan), &self.nonce);
                assert_eq!(argv[..2], ["sh", "-c"], "exec form of a multi-step plan");
                assert_eq!(argv[3..], ["sh", self.nonce.as_str()], "the nonce is $1");
                let args: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
                self.shell(shell, &args, None)
            }
            Form::Script => {
                let script = render_script(
                    plan,
                    &ScriptHeader {
                        title: vec!["test".into()],
                    },
                );
                self.shell(shell, &["-c", &script], None)
            }
        }
    }

    /// The exec's marker line for `event`, with the line break before it.
    fn marker(&self, event: &str) -> String {
        format!("\n{}\n", marker::line(&self.nonce, event))
    }

    fn shell(&self, shell: &str, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new(shell);
        cmd.args(args)
            .env_clear()
            .env("PATH", &self.bin)
            .env("STUB_LOG", &self.log)
            .current_dir(self.root.path())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        if let Some(input) = stdin {
            use std::io::Write as _;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            !self.root.path().join("PWNED").exists(),
            "a string was interpreted"
        );
        out
    }

    /// Every recorded call, argv[0] first.
    fn calls(&self) -> Vec<Vec<String>> {
        let Ok(log) = fs::read(&self.log) else {
            return Vec::new();
        };
        let mut items = log
            .split(|&b| b == 0)
            .map(|s| String::from_utf8(s.to_vec()).unwrap());
        let mut calls = Vec::new();
        while let Some(count) = items.next() {
            if count.is_empty() {
                break; // after the last terminator
            }
            let n: usize = count.parse().unwrap();
            calls.push(items.by_ref().take(n + 1).collect());
        }
        calls
    }

    fn path(&self, name: &str) -> String {
        self.files.join(name).to_str().unwrap().to_string()
    }
}

fn have(shell: &str) -> bool {
    let ok = Path::new(shell).exists();
    if !ok {
        eprintln!("{shell} is not installed: skipped");
    }
    ok
}

fn strings(words: &[&str]) -> Vec<String> {
    words.iter().map(|s| s.to_string()).collect()
}

fn run_step(argv: Vec<String>) -> Step {
    Step {
        description: format!("run {}", argv[0]),
        phase: Phase::Configure,
        best_effort: false,
        action: StepAction::Run(argv),
    }
}

fn write_step(path: String, content: &str, mode: Option<u32>) -> Step {
    Step {
        description: "write a file".into(),
        phase: Phase::Configure,
        best_effort: false,
        action: StepAction::WriteFile(WriteFile {
            path,
            content: content.into(),
            mode,
            parents: false,
        }),
    }
}

fn sh_plan(steps: Vec<Step>) -> Plan {
    Plan {
        dialect: Dialect::PosixSh,
        steps,
    }
}

fn code(out: &Output) -> Option<i32> {
    out.status.code()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[rstest]
fn runs_every_argv_exactly(
    #[values("/bin/sh", "/bin/bash")] shell: &str,
    #[values(Form::Exec, Form::Script)] form: Form,
) {
    if !have(shell) {
        return;
    }
    let g = guest();
    let mut nasty = strings(&["rec"]);
    nasty.extend(strings(NASTY));
    let argvs = vec![
        nasty,
        strings(&["rec"]),
        strings(&["rec", ""]),
        strings(&["if", "then", "fi"]),
        strings(&["then"]),
        strings(&["a=b", "c=d"]),
        strings(&["rec", "--mode=config", "/etc/hostname", "52:54:00:12:34:56"]),
    ];
    let plan = sh_plan(argvs.iter().cloned().map(run_step).collect());
    let out = g.run(shell, form, &plan);
    assert_eq!(code(&out), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(g.calls(), argvs);
    match form {
        Form::Exec => {
            assert!(stderr(&out).ends_with(&g.marker("done")));
            assert!(ran_to_completion(&plan, &g.nonce, &out.stderr));
        }
        Form::Script => assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "cocoon-fixup: all 7 steps done\n"
        ),
    }
}

#[rstest]
fn writes_files_byte_for_byte(
    #[values("/bin/sh", "/bin/bash")] shell: &str,
    #[values(Form::Exec, Form::Script)] form: Form,
) {
    if !have(shell) {
        return;
    }
    let g = guest();
    let keep = g.path("keep mode");
    fs::write(&keep, "old").unwrap();
    fs::set_permissions(&keep, fs::Permissions::from_mode(0o604)).unwrap();

    let mut steps = Vec::new();
    let mut expected = Vec::new();
    for (i, content) in NASTY.iter().enumerate() {
        let path = g.path(&format!("{i} it's %s $(x) `y` \\ ü * ?"));
        steps.push(write_step(path.clone(), content, Some(0o640)));
        expected.push((path, content.to_string(), 0o640));
    }
    let all = NASTY.join("|");
    for (name, mode) in [("setuid", 0o4751), ("private", 0o600), ("-dash", 0o644)] {
        let path = g.path(name);
        steps.push(write_step(path.clone(), &all, Some(mode)));
        expected.push((path, all.clone(), mode));
    }
    steps.push(write_step(keep.clone(), "new\n", None));
    expected.push((keep, "new\n".into(), 0o604));

    let out = g.run(shell, form, &sh_plan(steps));
    assert_eq!(code(&out), Some(0), "stderr: {}", stderr(&out));
    for (path, content, mode) in expected {
        assert_eq!(fs::read(&path).unwrap(), content.as_bytes(), "{path}");
        let got = fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(got, mode, "{path}: mode {got:o}");
    }
}

fn listing(dir: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if entry.file_type().unwrap().is_dir() {
            for inner in listing(&entry.path()) {
                names.insert(format!("{name}/{inner}"));
            }
        } else {
            names.insert(name);
        }
    }
    names
}

#[rstest]
fn removes_only_what_matches(
    #[values("/bin/sh", "/bin/bash")] shell: &str,
    #[values(Form::Exec, Form::Script)] form: Form,
) {
    if !have(shell) {
        return;
    }
    let g = guest();
    let sub = g.files.join("we'ird $d");
    fs::create_dir(&sub).unwrap();
    let present = [
        "10-a.network",
        "10-b.network",
        "10-.network",
        "10-*.network",
        "11-a.network",
        "10-a.netdev",
        "10-a.network.bak",
        "it's 10-q.network",
        "a?c",
        "abc",
        "[x]",
        "x",
        "we'ird $d/x1",
        "we'ird $d/x 2",
        "we'ird $d/y1",
        "keep-literal*",
    ];
    for name in present {
        fs::write(g.files.join(name), name).unwrap();
    }
    let patterns = vec![
        g.path("10-*.network"),
        g.path("a?c"),
        g.path("[x]"),
        g.path("we'ird $d/x*"),
        g.path("nothing-matches-*"),
        g.path("missing-literal"),
    ];
    let plan = sh_plan(vec![
        Step {
            description: "remove".into(),
            phase: Phase::Configure,
            best_effort: false,
            action: StepAction::RemoveFiles(patterns),
        },
        run_step(strings(&["rec", "after"])),
    ]);
    let out = g.run(shell, form, &plan);
    assert_eq!(code(&out), Some(0), "stderr: {}", stderr(&out));
    let expected: BTreeSet<String> = [
        "11-a.network",
        "10-a.netdev",
        "10-a.network.bak",
        "it's 10-q.network",
        "abc",
        "x",
        "we'ird $d/y1",
        "keep-literal*",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(listing(&g.files), expected);
}

fn failing_plan(best_effort: bool) -> Plan {
    let mut fail = run_step(strings(&["fail3", "arg"]));
    fail.description = "the failing one".into();
    fail.best_effort = best_effort;
    sh_plan(vec![
        run_step(strings(&["rec", "one"])),
        fail,
        run_step(strings(&["rec", "three"])),
    ])
}

#[rstest]
fn a_failing_step_stops_the_script(
    #[values("/bin/sh", "/bin/bash")] shell: &str,
    #[values(Form::Exec, Form::Script)] form: Form,
) {
    if !have(shell) {
        return;
    }
    let g = guest();
    let plan = failing_plan(false);
    let out = g.run(shell, form, &plan);
    assert_eq!(code(&out), Some(3), "stderr: {}", stderr(&out));
    assert_eq!(
        g.calls(),
        [strings(&["rec", "one"]), strings(&["fail3", "arg"])]
    );
    match form {
        Form::Exec => {
            let failure = attribute_failure(&plan, &g.nonce, code(&out), &out.stderr);
            assert_eq!(
                failure,
                StepFailure::Step {
                    step: 2,
                    total: 3,
                    description: "the failing one".into(),
                    exit_code: Some(3),
                    stderr: StderrTail {
                        text: "boom: it's broken".into(),
                        cut: false
                    },
                }
            );
            assert_eq!(
                failure.to_string(),
                "step 2/3 \"the failing one\" exited 3: boom: it's broken"
            );
        }
        Form::Script => {
            assert!(
                stderr(&out).ends_with("boom: it's broken\nstep 2/3 failed (exit 3), stopping\n"),
                "stderr: {}",
                stderr(&out)
            );
            assert!(out.stdout.is_empty());
        }
    }
}

#[rstest]
fn a_failing_best_effort_step_does_not(
    #[values("/bin/sh", "/bin/bash")] shell: &str,
    #[values(Form::Exec, Form::Script)] form: Form,
) {
    if !have(shell) {
        return;
    }
    let g = guest();
    let out = g.run(shell, form, &failing_plan(true));
    assert_eq!(code(&out), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(
        g.calls(),
        [
            strings(&["rec", "one"]),
            strings(&["fail3", "arg"]),
            strings(&["rec", "three"])
        ]
    );
    let err = stderr(&out);
    match form {
        Form::Exec => assert!(
            err.contains(&format!(
                "boom: it's broken{}",
                g.marker("step 2/3 ignored exit 3")
            )),
            "{err}"
        ),
        Form::Script => assert!(
            err.contains("step 2/3 failed (exit 3), ignored: best effort"),
            "{err}"
        ),
    }
}

fn missing_program(_: &Guest) -> Step {
    run_step(strings(&["no-such-program", "x"]))
}

fn unwritable(_: &Guest) -> Step {
    write_step("/nonexistent-dir/x/y".into(), "z", Some(0o644))
}

fn rm_of_a_directory(g: &Guest) -> Step {
    fs::create_dir(g.files.join("a-directory")).unwrap();
    Step {
        description: "remove a directory".into(),
        phase: Phase::Configure,
        best_effort: false,
        action: StepAction::RemoveFiles(vec![g.path("a-directory")]),
    }
}

#[rstest]
#[case::missing_program(missing_program, Some(127))]
#[case::unwritable(unwritable, None)]
#[case::rm_of_a_directory(rm_of_a_directory, None)]
fn every_kind_of_failure_is_attributed(
    #[values("/bin/sh", "/bin/bash")] shell: &str,
    #[case] failing: fn(&Guest) -> Step,
    #[case] expected_code: Option<i32>,
) {
    if !have(shell) {
        return;
    }
    let g = guest();
    let failing = failing(&g);
    let description = failing.description.clone();
    let plan = sh_plan(vec![
        run_step(strings(&["rec", "one"])),
        failing,
        run_step(strings(&["rec", "three"])),
    ]);
    let out = g.run(shell, Form::Exec, &plan);
    let exit = code(&out);
    assert_ne!(exit, Some(0));
    if expected_code.is_some() {
        assert_eq!(exit, expected_code);
    }
    assert_eq!(g.calls(), [strings(&["rec", "one"])]);
    let failure = attribute_failure(&plan, &g.nonce, exit, &out.stderr);
    let StepFailure::Step {
        step,
        description: named,
        exit_code,
        stderr: tail,
        ..
    } = &failure
    else {
        panic!("not attributed to a step: {failure}");
    };
    assert_eq!((*step, named, *exit_code), (2, &description, exit));
    assert!(
        !tail.text.trim().is_empty(),
        "the shell said why: {failure}"
    );
    assert!(!tail.text.contains("cocoon-fixup"), "{failure}");
}

#[rstest]
fn an_empty_plan_does_nothing(#[values(Form::Exec, Form::Script)] form: Form) {
    let g = guest();
    let plan = sh_plan(vec![]);
    let out = g.run("/bin/sh", form, &plan);
    assert_eq!(code(&out), Some(0), "stderr: {}", stderr(&out));
    assert!(g.calls().is_empty());
}

/// Pasted into an interactive root shell, a failing hint stops itself but
/// leaves that shell running.
#[rstest]
fn pasted_hint_does_not_end_the_shell(#[values("/bin/sh", "/bin/bash")] shell: &str) {
    if !have(shell) {
        return;
    }
    let g = guest();
    let hint = render_script(&failing_plan(false), &ScriptHeader::default());
    let pasted = format!("{hint}rec still-here \"$?\"\n");
    let out = g.shell(shell, &["-i"], Some(&pasted));
    assert_eq!(
        g.calls(),
        [
            strings(&["rec", "one"]),
            strings(&["fail3", "arg"]),
            strings(&["rec", "still-here", "3"])
        ],
        "stderr: {}",
        stderr(&out)
    );
}

/// A plan whose second step forges markers (the done marker without a
/// nonce and with a wrong one, a failure of step 4), then `last`.
fn forging_plan(forger: &str, last: Vec<String>) -> Plan {
    sh_plan(vec![
        run_step(strings(&["rec", "one"])),
        run_step(strings(&[forger])),
        run_step(last),
        run_step(strings(&["rec", "four"])),
    ])
}

/// A step that prints a done marker and then ends the script with exit 0
/// (`command exit 0`) does not make the attempt a success: without the
/// exec's nonce its lines are output, and the step that was running when
/// the script ended is named. The plan check refuses `command` as a
/// program; this is the defence behind it, so the plan runs unchecked.
#[rstest]
fn forged_done_markers_do_not_complete_an_exec(#[values("/bin/sh", "/bin/bash")] shell: &str) {
    if !have(shell) {
        return;
    }
    let g = guest();
    let plan = forging_plan("forge", strings(&["command", "exit", "0"]));
    assert!(plan.check(&PlanLimits::default()).is_err());
    let out = g.run_unchecked(shell, Form::Exec, &plan);
    assert_eq!(code(&out), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(g.calls(), [strings(&["rec", "one"]), strings(&["forge"])]);
    assert!(stderr(&out).contains(&format!("cocoon-fixup: {WRONG} done")));
    assert!(!ran_to_completion(&plan, &g.nonce, &out.stderr));
    let failure = attribute_failure(&plan, &g.nonce, Some(0), &out.stderr);
    assert_eq!(failure.step(), Some(3), "{failure}");
    assert!(
        matches!(failure, StepFailure::Interrupted { .. }),
        "{failure}"
    );

    // The same forgeries in a plan that does run to its end: the real done
    // marker, with the exec's nonce, counts.
    let plan = forging_plan("forge", strings(&["rec", "three"]));
    let g = guest();
    let out = g.run(shell, Form::Exec, &plan);
    assert_eq!(code(&out), Some(0), "stderr: {}", stderr(&out));
    assert!(ran_to_completion(&plan, &g.nonce, &out.stderr));
}

/// A failing step that prints a forged failure marker of a later step is
/// still the step blamed, and the forgery is part of its stderr.
#[rstest]
fn forged_failure_markers_do_not_move_the_blame(#[values("/bin/sh", "/bin/bash")] shell: &str) {
    if !have(shell) {
        return;
    }
    let g = guest();
    let plan = forging_plan("forge5", strings(&["rec", "three"]));
    let out = g.run(shell, Form::Exec, &plan);
    assert_eq!(code(&out), Some(5), "stderr: {}", stderr(&out));
    let failure = attribute_failure(&plan, &g.nonce, Some(5), &out.stderr);
    let StepFailure::Step {
        step,
        exit_code,
        stderr: tail,
        ..
    } = &failure
    else {
        panic!("not attributed to a step: {failure}");
    };
    assert_eq!((*step, *exit_code), (2, Some(5)));
    assert!(
        tail.text
            .contains(&format!("cocoon-fixup: {WRONG} step 4/4 failed exit 9")),
        "{failure}"
    );
}

#[rstest]
fn parents_creates_the_missing_directories(
    #[values("/bin/sh", "/bin/bash")] shell: &str,
    #[values(Form::Exec, Form::Script)] form: Form,
) {
    if !have(shell) {
        return;
    }
    let g = guest();
    let path = g.path("new 'dir' $x/-sub/interfaces");
    let mut step = write_step(path.clone(), "auto lo\n", Some(0o644));
    // Without it the missing directory fails the step.
    let out = g.run(shell, form, &sh_plan(vec![step.clone()]));
    assert_ne!(code(&out), Some(0), "stderr: {}", stderr(&out));
    assert!(!Path::new(&path).exists());
    let StepAction::WriteFile(w) = &mut step.action else {
        unreachable!()
    };
    w.parents = true;
    let out = g.run(shell, form, &sh_plan(vec![step.clone(), step]));
    assert_eq!(code(&out), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(fs::read(&path).unwrap(), b"auto lo\n");
    let dir = Path::new(&path).parent().unwrap();
    assert_eq!(
        fs::metadata(dir).unwrap().permissions().mode() & 0o777,
        0o755 & !umask()
    );
}

#[rstest]
fn parents_makes_no_group_or_other_writable_directory(
    #[values("/bin/sh", "/bin/bash")] shell: &str,
    #[values(Form::Exec, Form::Script)] form: Form,
    #[values(0o000, 0o077)] mask: u32,
) {
    if !have(shell) {
        return;
    }
    let g = guest();
    let path = g.path("top/sub/interfaces");
    let mut step = write_step(path.clone(), "x", None);
    let StepAction::WriteFile(w) = &mut step.action else {
        unreachable!()
    };
    w.parents = true;
    let plan = sh_plan(vec![step]);
    plan.check(&PlanLimits::default())
        .expect("test plans are valid");
    let out = run_under_umask(&g, shell, form, &plan, mask);
    assert_eq!(code(&out), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(fs::read(&path).unwrap(), b"x");
    for dir in ["top", "top/sub"] {
        let mode = fs::metadata(g.files.join(dir))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o777 & !(mask | 0o022), "{dir}: {mode:o}");
    }
}

/// A file is never created wider than its declared mode, whatever the
/// guest's umask: without a mode at most 0644 (group and other write
/// cleared), with one at most that mode even before its `chmod` (here a
/// `chmod` that does nothing, as one that has not run yet).
#[rstest]
fn files_are_never_created_wider_than_declared(
    #[values("/bin/sh", "/bin/bash")] shell: &str,
    #[values(Form::Exec, Form::Script)] form: Form,
    #[values(0o000, 0o077)] mask: u32,
) {
    if !have(shell) {
        return;
    }
    let g = guest();
    stub(&g.bin, "chmod", "exit 0");
    let plain = g.path("plain");
    let secret = g.path("secret");
    let plan = sh_plan(vec![
        write_step(plain.clone(), "x", None),
        write_step(secret.clone(), "y", Some(0o600)),
    ]);
    plan.check(&PlanLimits::default())
        .expect("test plans are valid");
    let out = run_under_umask(&g, shell, form, &plan, mask);
    assert_eq!(code(&out), Some(0), "stderr: {}", stderr(&out));
    let mode = |path: &str| fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&plain), 0o666 & !(mask | 0o022), "without a mode");
    assert_eq!(mode(&secret), 0o600 & !mask, "0600 before its chmod");
}

/// Run `plan` in `form` under `shell` with the umask `mask`.
fn run_under_umask(g: &Guest, shell: &str, form: Form, plan: &Plan, mask: u32) -> Output {
    let mut args: Vec<String> = match form {
        Form::Exec => exec_argv(plan, &render_exec(plan), &g.nonce)[1..].to_vec(),
        Form::Script => vec!["-c".into(), render_script(plan, &ScriptHeader::default())],
    };
    args[1] = format!("umask {mask:03o}\n{}", args[1]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    g.shell(shell, &args, None)
}

/// The process's umask (read by setting and restoring it).
fn umask() -> u32 {
    let out = Command::new("/bin/sh")
        .args(["-c", "umask"])
        .output()
        .unwrap();
    u32::from_str_radix(String::from_utf8_lossy(&out.stdout).trim(), 8).unwrap()
}

const MAC_A: [u8; 6] = [0x52, 0x54, 0, 0xaa, 0xbb, 0x01];
const MAC_B: [u8; 6] = [0x52, 0x54, 0, 0xaa, 0xbb, 0x02];

/// A fake `/sys/class/net`: one entry per `(name, mac, has a device)`.
fn fake_net(g: &Guest, entries: &[(&str, [u8; 6], bool)]) -> PathBuf {
    let net = g.root.path().join("sys-class-net");
    fs::create_dir(&net).unwrap();
    for (name, mac, device) in entries {
        let dir = net.join(name);
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("address"), format!("{}\n", MacAddr(*mac))).unwrap();
        if *device {
            fs::create_dir(dir.join("device")).unwrap();
        }
    }
    // `ip` records its argv and renames the entry on `link set dev A name B`.
    stub(
        &g.bin,
        "ip",
        &format!(
            "if [ \"$5\" = name ]; then /bin/mv \"{net}/$4\" \"{net}/$6\"; fi\nexit 0",
            net = net.display()
        ),
    );
    net
}

fn name_link_step(mac: [u8; 6], name: &str) -> Step {
    Step {
        description: format!("name {name}"),
        phase: Phase::Link,
        best_effort: false,
        action: StepAction::NameLink(NameLink {
            mac: MacAddr(mac),
            name: name.into(),
        }),
    }
}

impl Guest {
    /// Run `plan`, its sysfs directory replaced by `net`: the rendered
    /// text is the production text but for that one path.
    fn run_with_net(&self, shell: &str, form: Form, plan: &Plan, net: &Path) -> Output {
        plan.check(&PlanLimits::default())
            .expect("test plans are valid");
        let net = net.to_str().unwrap();
        assert!(is_bare_path(net), "{net} must need no quoting");
        let swap = |text: &str| {
            assert!(text.contains(render::SYS_CLASS_NET), "{text}");
            text.replace(render::SYS_CLASS_NET, net)
        };
        match form {
            Form::Exec => {
                let argv = exec_argv(plan, &render_exec(plan), &self.nonce);
                let script = swap(&argv[2]);
                self.shell(shell, &["-c", &script, "sh", self.nonce.as_str()], None)
            }
            Form::Script => {
                let script = swap(&render_script(plan, &ScriptHeader::default()));
                self.shell(shell, &["-c", &script], None)
            }
        }
    }
}

fn is_bare_path(path: &str) -> bool {
    path.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b))
}

fn ip_calls(g: &Guest) -> Vec<String> {
    g.calls().iter().map(|c| c[1..].join(" ")).collect()
}

#[rstest]
fn name_link_renames_the_nic_with_the_mac(
    #[values("/bin/sh", "/bin/bash")] shell: &str,
    #[values(Form::Exec, Form::Script)] form: Form,
) {
    if !have(shell) {
        return;
    }
    let g = guest();
    // A bond that shares the MAC sorts first; the NIC has a device.
    let net = fake_net(
        &g,
        &[
            ("bond0", MAC_A, false),
            ("ens3", MAC_A, true),
            ("ens4", MAC_B, true),
        ],
    );
    let plan = sh_plan(vec![name_link_step(MAC_A, "eth0")]);
    let out = g.run_with_net(shell, form, &plan, &net);
    assert_eq!(code(&out), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(
        ip_calls(&g),
        [
            "link set dev ens3 down",
            "link set dev ens3 name eth0",
            "link set dev eth0 up"
        ]
    );
    assert!(net.join("eth0").is_dir() && !net.join("ens3").exists());
    assert!(net.join("bond0").is_dir(), "the bond is left alone");
}

#[rstest]
fn name_link_brings_up_a_nic_that_has_the_name(
    #[values("/bin/sh", "/bin/bash")] shell: &str,
    #[values(Form::Exec, Form::Script)] form: Form,
) {
    if !have(shell) {
        return;
    }
    let g = guest();
    let net = fake_net(&g, &[("eth0", MAC_A, true), ("eth1", MAC_B, true)]);
    let plan = sh_plan(vec![
        name_link_step(MAC_A, "eth0"),
        name_link_step(MAC_B, "eth1"),
    ]);
    let out = g.run_with_net(shell, form, &plan, &net);
    assert_eq!(code(&out), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(
        ip_calls(&g),
        ["link set dev eth0 up", "link set dev eth1 up"]
    );
}

#[rstest]
fn name_link_names_two_nics_whose_names_are_swapped(
    #[values("/bin/sh", "/bin/bash")] shell: &str,
    #[values(Form::Exec, Form::Script)] form: Form,
) {
    if !have(shell) {
        return;
    }
    let g = guest();
    let net = fake_net(&g, &[("eth1", MAC_A, true), ("eth0", MAC_B, true)]);
    let plan = sh_plan(vec![
        name_link_step(MAC_A, "eth0"),
        name_link_step(MAC_B, "eth1"),
    ]);
    let out = g.run_with_net(shell, form, &plan, &net);
    assert_eq!(code(&out), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(
        ip_calls(&g),
        [
            "link set dev eth0 down",
            "link set dev eth0 name fx525400aabb02",
            "link set dev eth1 down",
            "link set dev eth1 name eth0",
            "link set dev eth0 up",
            "link set dev fx525400aabb02 down",
            "link set dev fx525400aabb02 name eth1",
            "link set dev eth1 up",
        ]
    );
    let address = |name: &str| fs::read_to_string(net.join(name).join("address")).unwrap();
    assert_eq!(address("eth0"), format!("{}\n", MacAddr(MAC_A)));
    assert_eq!(address("eth1"), format!("{}\n", MacAddr(MAC_B)));
    assert!(!net.join("fx525400aabb02").exists());
}

#[rstest]
fn name_link_brings_the_nic_back_up_when_the_rename_fails(
    #[values("/bin/sh", "/bin/bash")] shell: &str,
    #[values(Form::Exec, Form::Script)] form: Form,
) {
    if !have(shell) {
        return;
    }
    let g = guest();
    let net = fake_net(&g, &[("ens3", MAC_A, true)]);
    // An `ip` that refuses every rename with status 2.
    stub(
        &g.bin,
        "ip",
        "if [ \"$5\" = name ]; then exit 2; fi\nexit 0",
    );
    let plan = sh_plan(vec![
        name_link_step(MAC_A, "eth0"),
        run_step(strings(&["rec"])),
    ]);
    let out = g.run_with_net(shell, form, &plan, &net);
    assert_eq!(code(&out), Some(2), "stderr: {}", stderr(&out));
    assert_eq!(
        ip_calls(&g),
        [
            "link set dev ens3 down",
            "link set dev ens3 name eth0",
            "link set dev ens3 up"
        ]
    );
}

#[rstest]
#[case::name_taken(
    &[("ens3", MAC_A, true), ("eth0", MAC_B, true)],
    "cannot name ens3 (MAC 52:54:00:aa:bb:01) eth0: interface eth0 (MAC 52:54:00:aa:bb:02) already has that name"
)]
#[case::mac_absent(&[("ens4", MAC_B, true)], "no network interface has MAC 52:54:00:aa:bb:01")]
#[case::no_interfaces(&[], "no network interface has MAC 52:54:00:aa:bb:01")]
fn name_link_fails_saying_why(
    #[values("/bin/sh", "/bin/bash")] shell: &str,
    #[values(Form::Exec, Form::Script)] form: Form,
    #[case] entries: &[(&str, [u8; 6], bool)],
    #[case] message: &str,
) {
    if !have(shell) {
        return;
    }
    let g = guest();
    let net = fake_net(&g, entries);
    let plan = sh_plan(vec![
        name_link_step(MAC_A, "eth0"),
        run_step(strings(&["rec"])),
    ]);
    let out = g.run_with_net(shell, form, &plan, &net);
    assert_eq!(code(&out), Some(1), "stderr: {}", stderr(&out));
    assert!(stderr(&out).contains(message), "stderr: {}", stderr(&out));
    assert!(g.calls().is_empty(), "nothing ran: {:?}", g.calls());
}
