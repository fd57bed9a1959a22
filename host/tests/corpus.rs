//! Hostile input, kept as fixtures under `tests/fixtures/corpus/`: every
//! value either is rejected with an error that names its field, or reaches
//! the guest inert. Inert is proven by running, not by reading.
//!
//! - `facts.json`: hostile pod annotations and `cocoon vm inspect` output
//!   (shell metacharacters, quotes, newlines, `%`, backslashes, unicode
//!   look-alikes, NUL, over-long values, VM ids that are paths, prefixes
//!   outside 1..=32, duplicate MACs, hundreds of NICs, malformed JSON).
//!   Each case goes through the real plan path (parse, observe, classify,
//!   validate, the real plugins, compose, render). A `reject` case must
//!   fail with an error that contains the field it names and that stays
//!   one bounded line (no raw newline, NUL or escape reaches a log or an
//!   event). An `inert` case's plan is run for real in a sandboxed guest
//!   ([`support::guest`]: stub `ip`, `systemctl`, `cloud-init`, a private
//!   `/etc`): the exec argv through the real `CocoonCli` and `fake-cocoon`
//!   (`"run": true`), and the hint script with `sh`, under dash and bash.
//!   The stubs must have recorded exactly the plan's run steps and the
//!   files must be exactly what the plan's write and remove steps make.
//! - `strings.json`: hostile strings put into plans built here (argv, file
//!   contents, file names, remove patterns, all under a temporary root);
//!   the same runs and the same comparison. NUL is refused by
//!   `Plan::check`, naming the field.

use crate::support;

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use base64::Engine as _;
use fixup_core::classify::Scenario;
use fixup_core::facts::{Observation, Overrides, PodInput, VmId, VmInspect};
use fixup_core::plan::{
    self, Dialect, Phase, Plan, PlanError, PlanLimits, ScriptHeader, Step, StepAction, WriteFile,
};
use fixup_core::planner::{ComposedPlan, Planner, PlannerOptions};
use fixup_host::cocoon::{Cocoon, ExitStatusKind};
use serde_json::{Value, json};
use support::guest::{Guest, Shell, assert_tree, expected_calls};

/// Generous for a fake that answers at once.
const EXEC_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest error line a hostile value may produce: every error shows a
/// value cut to 80 characters.
const ERROR_MAX: usize = 1024;

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/corpus")
        .join(name);
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Expands the fixture shorthands: `{"$repeat": s, "times": n}` and
/// `{"$nics": n, "static": true|false|"mixed", "bad_mac_at": i}`.
fn expand(value: &Value) -> Value {
    match value {
        Value::Object(map) if map.contains_key("$repeat") => {
            let unit = map["$repeat"].as_str().expect("$repeat is a string");
            let times = map["times"].as_u64().expect("times is a count") as usize;
            Value::String(unit.repeat(times))
        }
        Value::Object(map) if map.contains_key("$nics") => {
            let n = map["$nics"].as_u64().expect("$nics is a count") as usize;
            let bad = map.get("bad_mac_at").and_then(Value::as_u64);
            let nics = (0..n)
                .map(|i| {
                    let mac = if bad == Some(i as u64) {
                        "52:54:00:zz:00:00".to_owned()
                    } else {
                        format!("52:54:00:00:{:02x}:{:02x}", i / 256, i % 256 + 1)
                    };
                    let is_static = match &map["static"] {
                        Value::Bool(b) => *b,
                        _ => i % 2 == 0,
                    };
                    if is_static {
                        json!({"mac": mac, "tap": format!("tap{i}"), "network": {
                            "ip": format!("10.{}.{}.{}", i / 256, i % 256, 5),
                            "prefix": 24,
                            "gateway": format!("10.{}.{}.1", i / 256, i % 256)}})
                    } else {
                        json!({"mac": mac, "tap": format!("tap{i}")})
                    }
                })
                .collect();
            Value::Array(nics)
        }
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), expand(v))).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(expand).collect()),
        other => other.clone(),
    }
}

/// The planner with the real built-in plugins, built once; its cocoon
/// root is a directory of this test binary's own.
fn planner() -> &'static (Planner, PathBuf) {
    static PLANNER: OnceLock<(Planner, PathBuf)> = OnceLock::new();
    PLANNER.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("corpus-cocoon-root");
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        let options = PlannerOptions {
            cocoon_root: root.clone(),
            ..PlannerOptions::default()
        };
        let (planner, failures) = Planner::new(options).expect("the planner starts");
        assert!(failures.is_empty(), "{failures:?}");
        (planner, root)
    })
}

/// What a facts case says must happen.
#[derive(Debug)]
enum Expect {
    Reject(String),
    Inert,
    Untouched,
}

/// One facts case, built into the texts the plan path reads.
struct FactsCase {
    name: String,
    class: String,
    pod_json: String,
    inspect_json: String,
    source_image: Option<String>,
    overlay: bool,
    expect: Expect,
}

fn facts_cases() -> Vec<FactsCase> {
    let corpus = fixture("facts.json");
    let base = &corpus["base"];
    corpus["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|raw| {
            let case = expand(raw);
            let name = case["case"].as_str().unwrap().to_owned();
            let mut annotations = base["annotations"].as_object().unwrap().clone();
            if let Some(changes) = case.get("annotations").and_then(Value::as_object) {
                for (k, v) in changes {
                    if v.is_null() {
                        annotations.remove(k);
                    } else {
                        annotations.insert(k.clone(), v.clone());
                    }
                }
            }
            let pod_json = match case.get("pod_json") {
                Some(text) => text.as_str().unwrap().to_owned(),
                None => json!({
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "web-0", "namespace": "default", "uid": "u-1",
                        "annotations": annotations},
                })
                .to_string(),
            };
            let mut inspect = base["inspect"].clone();
            if let Some(id) = case.get("inspect_id") {
                match id {
                    Value::Null => {
                        inspect.as_object_mut().unwrap().remove("id");
                    }
                    id => inspect["id"] = id.clone(),
                }
            }
            if let Some(nics) = case.get("nics") {
                inspect["network_configs"] = nics.clone();
            }
            let inspect_json = match case.get("inspect_json") {
                Some(text) => text.as_str().unwrap().to_owned(),
                None => inspect.to_string(),
            };
            let expect = match &case["expect"] {
                Value::String(s) if s == "inert" => Expect::Inert,
                Value::String(s) if s == "untouched" => Expect::Untouched,
                Value::Object(o) => Expect::Reject(o["reject"].as_str().unwrap().to_owned()),
                other => panic!("case {name}: unknown expectation {other}"),
            };
            FactsCase {
                class: case["class"].as_str().unwrap().to_owned(),
                source_image: case
                    .get("source_image")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                overlay: case
                    .get("overlay")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                name,
                pod_json,
                inspect_json,
                expect,
            }
        })
        .collect()
}

/// The plan path, as `cocoon-fixup plan` and `Host` take it. `Ok(None)`:
/// no fixup needed.
fn plan_case(case: &FactsCase) -> Result<Option<ComposedPlan>, String> {
    let (planner, root) = planner();
    let pod = PodInput::from_json(&case.pod_json, "pod.json").map_err(|e| e.to_string())?;
    let vm = VmInspect::from_json(&case.inspect_json, "inspect.json").map_err(|e| e.to_string())?;
    let overrides = Overrides {
        boot: None,
        source_image: case.source_image.clone(),
    };
    // The hosts refuse a record whose id is not the annotated one before
    // anything is planned (the names are the binding tests' to check).
    if let fixup_core::binding::Verdict::Mismatch(
        m @ fixup_core::binding::Mismatch::IdDisagrees { .. },
    ) = fixup_core::decision::bind_record(&pod, &vm, Default::default())
    {
        return Err(m.to_string());
    }
    let obs = Observation::new(&pod, &vm, &overrides);
    if case.overlay {
        let id = VmId::parse(&obs.vm_id).expect("overlay cases have a valid id");
        let dir = root.join("run/cloudhypervisor").join(id.as_str());
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("overlay.qcow2"), b"").unwrap();
    }
    let outcome = planner.plan(&obs).map_err(|e| e.to_string())?;
    Ok(outcome.composed)
}

/// An error a hostile value caused: names the field, stays one bounded,
/// printable line.
fn check_rejection(error: &str, field: &str) -> Result<(), String> {
    if !error.contains(field) {
        return Err(format!("the error does not name {field:?}: {error}"));
    }
    if error.len() > ERROR_MAX {
        return Err(format!(
            "the error is {} bytes: {error:.200}...",
            error.len()
        ));
    }
    if let Some(c) = error.chars().find(|c| c.is_control()) {
        return Err(format!(
            "the error carries the raw control character {c:?}: {error:?}"
        ));
    }
    Ok(())
}

/// Run a composed plan in sandboxed guests (dash and bash): the exec argv
/// through the real CocoonCli, then the hint with `sh`.
async fn run_inert(composed: &ComposedPlan) -> Result<(), String> {
    let plan = &composed.plan;
    let hint = base64::engine::general_purpose::STANDARD
        .decode(&composed.hint)
        .map_err(|e| format!("the hint is not base64: {e}"))?;
    if hint != composed.script.as_bytes() {
        return Err("the hint does not decode to the script".into());
    }
    for shell in [Shell::Dash, Shell::Bash] {
        let guest = Guest::sandboxed(shell);
        run_exec(&guest, &composed.facts.id, &composed.exec, plan).await?;
        guest.restore();
        if plan.dialect == Dialect::PosixSh {
            run_hint(&guest, &composed.script, plan)?;
        }
    }
    Ok(())
}

/// The exec argv (`exec` with a fresh nonce) through `CocoonCli` and
/// `fake-cocoon`: it arrives intact, and what runs is exactly the plan.
async fn run_exec(guest: &Guest, vm: &VmId, exec: &[String], plan: &Plan) -> Result<(), String> {
    let nonce = plan::Nonce::generate().map_err(|e| e.to_string())?;
    let exec = &plan::exec_argv(plan, exec, &nonce);
    let out = guest
        .cocoon()
        .exec(vm, exec, EXEC_TIMEOUT)
        .await
        .map_err(|e| format!("exec: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status != ExitStatusKind::Code(0) {
        return Err(format!("exec {}: {stderr}", out.status));
    }
    let mut call = vec![
        "vm".to_owned(),
        "exec".to_owned(),
        vm.to_string(),
        "--".to_owned(),
    ];
    call.extend(exec.iter().cloned());
    let calls = guest.cocoon_calls();
    if calls != [call] {
        return Err(format!("cocoon got {calls:?}"));
    }
    if !plan::ran_to_completion(plan, &nonce, &out.stderr) {
        return Err(format!("no done marker with the exec's nonce: {stderr}"));
    }
    compare(guest, plan, "exec")
}

fn run_hint(guest: &Guest, script: &str, plan: &Plan) -> Result<(), String> {
    let out = guest.run_script(script);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "hint {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let done = format!("cocoon-fixup: all {} steps done", plan.steps.len());
    if stdout.trim_end() != done {
        return Err(format!("hint stdout {stdout:?}"));
    }
    compare(guest, plan, "hint")
}

fn compare(guest: &Guest, plan: &Plan, form: &str) -> Result<(), String> {
    let calls = guest.calls();
    let expected = expected_calls(plan);
    if calls != expected {
        return Err(format!(
            "{form}: the stubs recorded {calls:?}, the plan runs {expected:?}"
        ));
    }
    let found = guest.tree();
    let model = guest.expected_tree(plan);
    std::panic::catch_unwind(|| assert_tree(&found, &model, form)).map_err(|panic| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| format!("{form}: the files differ"))
    })
}

#[tokio::test]
async fn hostile_facts_are_rejected_naming_the_field_or_run_inert() {
    let cases = facts_cases();
    assert!(cases.len() >= 150, "the corpus has {} cases", cases.len());
    let real_hostname = fs::read("/etc/hostname").ok();
    let mut failures = Vec::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for case in &cases {
        let result = match (&case.expect, plan_case(case)) {
            (Expect::Reject(field), Err(error)) => check_rejection(&error, field),
            (Expect::Reject(field), Ok(_)) => {
                Err(format!("accepted; expected an error naming {field:?}"))
            }
            (Expect::Untouched, Ok(None)) => Ok(()),
            (Expect::Untouched, Ok(Some(c))) => Err(format!(
                "planned {} steps; expected no fixup",
                c.plan.steps.len()
            )),
            (Expect::Inert, Ok(Some(composed))) => run_inert(&composed).await,
            (Expect::Inert, Ok(None)) => Err("no fixup planned; expected one to run".into()),
            (_, Err(error)) => Err(format!("rejected: {error}")),
        };
        *counts
            .entry(match case.expect {
                Expect::Reject(_) => "rejected",
                Expect::Inert => "inert",
                Expect::Untouched => "untouched",
            })
            .or_default() += 1;
        if let Err(why) = result {
            failures.push(format!("{} ({}): {why}", case.name, case.class));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} corpus cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    eprintln!("corpus: {counts:?}");
    assert_eq!(
        fs::read("/etc/hostname").ok(),
        real_hostname,
        "the sandbox leaked: this machine's /etc/hostname changed"
    );
}

// ---- plans built here, with hostile strings everywhere ----

fn hostile_strings() -> Vec<(String, String)> {
    let corpus = fixture("strings.json");
    corpus["classes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|class| {
            let name = class["class"].as_str().unwrap().to_owned();
            class["strings"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |s| (name.clone(), expand(s).as_str().unwrap().to_owned()))
        })
        .collect()
}

fn step(description: &str, action: StepAction) -> Step {
    Step {
        description: description.to_owned(),
        phase: Phase::Configure,
        best_effort: false,
        action,
    }
}

fn strings(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

/// A file name made from `s`, when `s` can be one: no `/` (replaced), not
/// empty, `.` or `..`, short enough for any file system.
fn file_name(s: &str) -> Option<String> {
    let name = s.replace('/', "_");
    (!name.is_empty() && name != "." && name != ".." && name.len() <= 200).then_some(name)
}

/// The plan for one hostile string, under `guest`'s root, and the files
/// it finds in place.
fn string_plan(guest: &Guest, s: &str) -> Plan {
    let mut steps = vec![
        step(
            "pass it as an argument",
            StepAction::Run(strings(&["rec", s])),
        ),
        step(
            "pass it among others",
            StepAction::Run(strings(&["rec", "-", s, "", s, "--"])),
        ),
        step(
            "write it as content",
            StepAction::WriteFile(WriteFile {
                path: guest.path_in_root("content"),
                content: s.to_owned(),
                mode: Some(0o640),
                parents: false,
            }),
        ),
    ];
    if let Some(name) = file_name(s).filter(|n| !n.chars().any(char::is_control)) {
        steps.push(step(
            "write a file of that name",
            StepAction::WriteFile(WriteFile {
                path: guest.path_in_root(&format!("f-{name}")),
                content: format!("{s}\n"),
                mode: None,
                parents: false,
            }),
        ));
        // What the pattern must remove, and decoys it must not: a `?`,
        // `[` or `~` taken as syntax would match `a` in place of them.
        let decoy: String = name
            .chars()
            .map(|c| if c == '*' { c } else { 'a' })
            .collect();
        for seeded in [
            format!("del-{name}"),
            format!("del-{name}-1"),
            format!("del-{}-1", decoy.replace('*', "a")),
            format!("keep-{name}"),
        ] {
            guest.seed_file(&guest.path_in_root(&seeded), b"seeded\n", 0o644);
        }
        steps.push(step(
            "remove by a pattern made of it",
            StepAction::RemoveFiles(vec![guest.path_in_root(&format!("del-{name}*"))]),
        ));
    }
    Plan {
        dialect: Dialect::PosixSh,
        steps,
    }
}

#[tokio::test]
async fn hostile_strings_in_plans_reach_the_guest_byte_for_byte() {
    let corpus = hostile_strings();
    let vm = VmId::parse("vm-1").unwrap();
    let limits = PlanLimits::default();
    let mut failures = Vec::new();
    for (class, s) in &corpus {
        for shell in [Shell::Dash, Shell::Bash] {
            let mut guest = Guest::direct(shell);
            let plan = string_plan(&guest, s);
            guest.reseed();
            let context = format!("{class} {:.60?} under {shell:?}", s);
            if s.contains('\0') {
                match plan.check(&limits) {
                    Err(PlanError::Invalid { step: 1, field, .. })
                        if field.to_string() == "run[1]" => {}
                    other => failures.push(format!(
                        "{context}: check said {other:?}, not a NUL in run[1]"
                    )),
                }
                continue;
            }
            if let Err(e) = plan.check(&limits) {
                failures.push(format!("{context}: check refused it: {e}"));
                continue;
            }
            let exec = plan::render_exec(&plan);
            if let Err(why) = run_exec(&guest, &vm, &exec, &plan).await {
                failures.push(format!("{context}: {why}"));
            }
            guest.restore();
            let script = plan::render_script(
                &plan,
                &ScriptHeader {
                    title: vec![s.clone()],
                },
            );
            if let Err(why) = run_hint(&guest, &script, &plan) {
                failures.push(format!("{context}: {why}"));
            }
            // One run step alone is exec'd directly, without a shell.
            guest.restore();
            let direct = Plan {
                dialect: Dialect::PosixSh,
                steps: vec![step("alone", StepAction::Run(strings(&["rec", s, s])))],
            };
            let exec = plan::render_exec(&direct);
            if exec[0] != "rec" {
                failures.push(format!(
                    "{context}: one run step is not exec'd directly: {exec:?}"
                ));
            } else if let Err(why) = run_exec(&guest, &vm, &exec, &direct).await {
                failures.push(format!("{context}: direct: {why}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures over {} strings:\n{}",
        failures.len(),
        corpus.len(),
        failures.join("\n")
    );
}

/// NUL and control characters are refused where no shell word or path
/// could carry them, and the error names the step and the field.
#[test]
fn nul_and_control_characters_are_refused_naming_the_field() {
    let limits = PlanLimits::default();
    let write = |path: &str, content: &str| {
        StepAction::WriteFile(WriteFile {
            path: path.to_owned(),
            content: content.to_owned(),
            mode: None,
            parents: false,
        })
    };
    let cases: Vec<(StepAction, &str)> = vec![
        (
            StepAction::Run(strings(&["rec", "a\0b"])),
            "step 1 run[1]: contains a NUL byte",
        ),
        (
            StepAction::Run(strings(&["re\0c"])),
            "step 1 run[0]: contains a NUL byte",
        ),
        (
            write("/etc/x", "\0"),
            "step 1 write_file.content: contains a NUL byte",
        ),
        (
            write("/etc/x\0", ""),
            "step 1 write_file.path: contains a NUL byte",
        ),
        (
            write("/etc/x\ny", ""),
            "step 1 write_file.path: contains a control character",
        ),
        (
            write("/etc/\u{1b}[2J", ""),
            "step 1 write_file.path: contains a control character",
        ),
        (
            write("/etc/../shadow", ""),
            "step 1 write_file.path: has a `..` component",
        ),
        (
            write("etc/hostname", ""),
            "step 1 write_file.path: is not an absolute path",
        ),
        (
            StepAction::RemoveFiles(strings(&["/etc/a\0*"])),
            "step 1 remove_files[0]: contains a NUL byte",
        ),
        (
            StepAction::RemoveFiles(strings(&["/*/x"])),
            "step 1 remove_files[0]: has a `*` outside its last component",
        ),
        (
            StepAction::RemoveFiles(strings(&["/*"])),
            "step 1 remove_files[0]: needs at least two components",
        ),
    ];
    for (action, expected) in cases {
        let plan = Plan {
            dialect: Dialect::PosixSh,
            steps: vec![step("x", action)],
        };
        let error = plan.check(&limits).expect_err(expected).to_string();
        assert!(error.starts_with(expected), "{error}");
    }
    let mut plan = Plan {
        dialect: Dialect::PosixSh,
        steps: vec![step("x", StepAction::Run(strings(&["rec"])))],
    };
    plan.steps[0].description = "two\nlines".into();
    let error = plan.check(&limits).unwrap_err().to_string();
    assert!(
        error.starts_with("step 1 description: contains a control character"),
        "{error}"
    );
}

/// Windows plans cannot run here (no PowerShell); their exec argv still
/// goes through the real runner to a stub `powershell` intact.
#[tokio::test]
async fn the_windows_exec_reaches_powershell_intact() {
    let case = facts_cases()
        .into_iter()
        .find(|c| c.name == "windows-hostile-unused")
        .expect("the corpus has a Windows case");
    let composed = plan_case(&case).unwrap().expect("a Windows plan");
    assert_eq!(composed.plan.dialect, Dialect::PowerShell);
    assert_eq!(composed.exec[0], "powershell");
    let guest = Guest::sandboxed(Shell::Dash);
    run_exec(&guest, &composed.facts.id, &composed.exec, &composed.plan)
        .await
        .unwrap();
    assert_eq!(guest.calls(), expected_calls(&composed.plan));
}

/// Spec section 3's scenarios all appear among the inert cases, so every
/// built-in plugin's plan is run by the corpus.
#[test]
fn the_inert_cases_cover_every_fixup_scenario() {
    let mut seen = std::collections::BTreeSet::new();
    for case in facts_cases() {
        if let (Expect::Inert, Ok(Some(c))) = (&case.expect, plan_case(&case)) {
            for part in &c.parts {
                seen.insert(part.selection.scenario);
            }
        }
    }
    for scenario in [
        Scenario::Cloudimg,
        Scenario::OciNetworkd,
        Scenario::FcMac,
        Scenario::WindowsPnp,
    ] {
        assert!(
            seen.contains(&scenario),
            "no inert case plans {scenario}: {seen:?}"
        );
    }
}

/// The comparison is not vacuous: a run of one plan does not pass for
/// another that differs in one byte of content, one argument or one file.
#[tokio::test]
async fn the_guest_notices_any_difference_from_the_plan() {
    let vm = VmId::parse("vm-1").unwrap();
    let mut guest = Guest::direct(Shell::Dash);
    let plan = string_plan(&guest, "it's");
    guest.reseed();
    let exec = plan::render_exec(&plan);
    run_exec(&guest, &vm, &exec, &plan).await.unwrap();
    let mut content = plan.clone();
    if let StepAction::WriteFile(w) = &mut content.steps[2].action {
        w.content.push(' ');
    }
    let mut argv = plan.clone();
    if let StepAction::Run(words) = &mut argv.steps[0].action {
        words[1] = "its".into();
    }
    let mut fewer = plan.clone();
    fewer.steps.pop();
    for (what, other) in [("content", content), ("argv", argv), ("remove", fewer)] {
        assert!(
            compare(&guest, &other, what).is_err(),
            "{what}: a different plan passed"
        );
    }
}

// ---- findings of the corpus and the fuzzer, fixed ----

/// The issue asks that every hostile input is rejected with an error that
/// names its field; too many NICs names the count, not `network_configs`.
#[test]
fn too_many_nics_names_the_field() {
    let case = facts_cases()
        .into_iter()
        .find(|c| c.name == "nics-300")
        .expect("the corpus has the case");
    let error = plan_case(&case).expect_err("rejected");
    assert!(error.contains("network_configs"), "{error}");
}

/// Validation accepts up to `MAX_NICS` (48) NICs, and a Firecracker clone
/// with that many (3 link steps per NIC plus the networkd flavour) still
/// fits the default plan limit of 256 steps.
#[test]
fn a_firecracker_clone_with_the_most_nics_validation_accepts_can_be_planned() {
    let mut case = facts_cases()
        .into_iter()
        .find(|c| c.name == "nics-48-static")
        .expect("the corpus has the case");
    case.pod_json = case
        .pod_json
        .replace("\"cloud-hypervisor\"", "\"firecracker\"");
    assert!(case.pod_json.contains("firecracker"));
    let composed = plan_case(&case).expect("a plan").expect("a fixup");
    assert!(composed.plan.steps.len() > 48 * 3);
}

/// Found by the `facts` fuzz target: errors print the pod's
/// `namespace/name` as it is, so a name with a line break or an escape
/// sequence (possible in a pod file given to `cocoon-fixup plan`; the API
/// server refuses such names) splits the one-line error and reaches the
/// terminal raw, while every other value in an error is escaped.
#[test]
fn pod_names_are_escaped_in_errors() {
    let pod = json!({"metadata": {"name": "web\n0\u{1b}[2J", "namespace": "default", "annotations": {
        "cocoonset.cocoonstack.io/managed": "true",
        "vm.cocoonstack.io/name": "web-0",
        "vm.cocoonstack.io/id": "vm-a",
    }}});
    let pod = PodInput::from_json(&pod.to_string(), "pod.json").unwrap();
    let vm = VmInspect::from_json(
        r#"{"id": "vm-a", "network_configs": [{"mac": "not a mac"}]}"#,
        "vm.json",
    )
    .unwrap();
    let obs = Observation::new(&pod, &vm, &Overrides::default());
    let error = fixup_core::facts::VmFacts::validate(&obs, fixup_core::facts::ImageKind::Unknown)
        .expect_err("the MAC is no MAC")
        .to_string();
    assert!(error.contains("web"), "{error}");
    assert!(!error.chars().any(char::is_control), "{error:?}");
}
