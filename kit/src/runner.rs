//! The runner and its report: `plugin test`.
//!
//! This module owns running a plugin on case files ([`test_plugin`],
//! [`run_cases`]) through the real [`PluginHost`], one fresh Store per
//! case, and the [`TestReport`] it returns: each case's status, diff,
//! usage against the limits and logs, and the text `plugin test` prints.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use fixup_core::planner::compose_and_render;
use fixup_core::plugin::{EngineOptions, Limits, LoadedPlugin, Origin, PluginError, PluginHost};

use super::KitError;
use super::case::{Case, case_files, case_name, load_case};
use super::diff::{Returned, bless, result_diff};

/// `plugin test` options.
#[derive(Debug, Clone, Copy, Default)]
pub struct TestOptions {
    /// Rewrite `expect` in each case whose result differs (or that has none).
    pub bless: bool,
    /// Render each plan the plugin returns as the hint script `plan`
    /// prints ([`CaseReport::script`]).
    pub render: bool,
}

/// How a case ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The result matched `expect`.
    Pass,
    /// It did not, or the call breached the sandbox.
    Fail,
    /// `--bless` recorded the result as the new `expect`.
    Blessed,
    /// The case file is unusable (bad JSON, an invalid fact).
    Invalid,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Blessed => "BLESSED",
            Status::Invalid => "INVALID",
        }
    }
}

/// What one call used. `None` where the host did not report it: a call
/// that ends in an error reports no usage, except the fuel it ran out of.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Usage {
    pub fuel: Option<u64>,
    pub peak_memory_bytes: Option<usize>,
    pub plan_steps: Option<usize>,
    pub plan_bytes: Option<usize>,
    /// Wall time of the call, instantiation included, in milliseconds.
    pub wall_ms: f64,
}

/// A line the plugin logged during the call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogReport {
    pub level: String,
    pub message: String,
}

/// The result of one case.
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    pub name: String,
    pub file: String,
    pub description: Option<String>,
    pub scenario: Option<&'static str>,
    pub status: Status,
    /// Why it failed (or was blessed), one sentence.
    pub message: Option<String>,
    /// Unified diff of `expect` (as normalised JSON) against the actual
    /// result, when they differ.
    pub diff: Option<String>,
    pub usage: Option<Usage>,
    pub logs: Vec<LogReport>,
    /// The `summary` of the case's `context`, when it has one: where the
    /// case came from (`cocoon-fixup capture` writes it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// What the case asks that the host would never ask of this plugin
    /// (a flavour it does not serve); `plugin test` prints these on
    /// standard error.
    pub warnings: Vec<String>,
    /// With `--render`: the hint script of the returned plan, as `plan`
    /// prints it, in the plan's dialect.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// With `--render`, when there is no script: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_script: Option<String>,
}

/// The plugin a report is about.
#[derive(Debug, Clone, Serialize)]
pub struct PluginSummary {
    pub name: String,
    pub version: String,
    pub sha256: String,
    pub file: String,
}

/// The limits in force for every call.
#[derive(Debug, Clone, Serialize)]
pub struct LimitsReport {
    pub fuel: u64,
    pub memory_bytes: usize,
    pub plan_max_steps: usize,
    pub plan_max_bytes: usize,
}

impl From<&Limits> for LimitsReport {
    fn from(l: &Limits) -> Self {
        LimitsReport {
            fuel: l.fuel,
            memory_bytes: l.memory_bytes,
            plan_max_steps: l.plan.max_steps,
            plan_max_bytes: l.plan.max_bytes,
        }
    }
}

/// A case file's text for one line of the report: every control character
/// (line breaks included) and invisible formatting character escaped, and
/// the Unicode line and paragraph separators (U+2028, U+2029) too, so a
/// `description` or `context.summary` cannot start a line of its own that
/// looks like the report's.
fn one_line(text: &str) -> String {
    fixup_core::facts::escape_controls(text)
        .replace('\u{2028}', "\\u{2028}")
        .replace('\u{2029}', "\\u{2029}")
}

/// The result of `plugin test`: every case, and the counts.
#[derive(Debug, Clone, Serialize)]
pub struct TestReport {
    pub plugin: PluginSummary,
    pub limits: LimitsReport,
    pub cases: Vec<CaseReport>,
    /// Cases that passed, blessed ones included.
    pub passed: usize,
    /// Cases that failed, invalid case files included.
    pub failed: usize,
    pub blessed: usize,
}

impl TestReport {
    /// True when no case failed: the exit code is 0.
    pub fn success(&self) -> bool {
        self.failed == 0
    }
}

/// Load the plugin at `plugin` and run it on the cases at `cases` (a file
/// or a folder).
pub fn test_plugin(
    engine: EngineOptions,
    plugin: &Path,
    cases: &Path,
    options: TestOptions,
) -> Result<TestReport, KitError> {
    let files = case_files(cases)?;
    let host = PluginHost::new(engine)?;
    // A vendor tests the file in their own build tree, which a umask of
    // 002 leaves group-writable: the node's trust rules are `plugin
    // inspect`'s verdict, here only a warning.
    if let Err(e) = fixup_core::plugin::trusted::read_file(plugin)
        && !e.is_io()
    {
        tracing::warn!(
            "{e}; the host would refuse this file where it is (see `cocoon-fixup plugin inspect`)"
        );
    }
    let bytes = std::fs::read(plugin).map_err(|cause| PluginError::Read {
        path: plugin.to_owned(),
        cause,
    })?;
    let loaded = host.prepare(Origin::File(plugin.to_owned()), &bytes)?;
    Ok(run_cases(&host, &loaded, &files, options))
}

/// Run `plugin` on each case file, in order.
pub fn run_cases(
    host: &PluginHost,
    plugin: &LoadedPlugin,
    files: &[PathBuf],
    options: TestOptions,
) -> TestReport {
    let cases: Vec<CaseReport> = files
        .iter()
        .map(|file| run_case(host, plugin, file, options))
        .collect();
    let count = |s: Status| cases.iter().filter(|c| c.status == s).count();
    let blessed = count(Status::Blessed);
    TestReport {
        plugin: PluginSummary {
            name: plugin.info.name.clone(),
            version: plugin.info.version.clone(),
            sha256: plugin.sha256.clone(),
            file: plugin.origin.to_string(),
        },
        limits: host.limits().into(),
        passed: count(Status::Pass) + blessed,
        failed: count(Status::Fail) + count(Status::Invalid),
        blessed,
        cases,
    }
}

fn run_case(
    host: &PluginHost,
    plugin: &LoadedPlugin,
    file: &Path,
    options: TestOptions,
) -> CaseReport {
    let case = match load_case(file) {
        Ok(case) => case,
        Err(e) => {
            return CaseReport {
                name: case_name(file),
                file: file.display().to_string(),
                description: None,
                scenario: None,
                status: Status::Invalid,
                message: Some(e.to_string()),
                diff: None,
                usage: None,
                logs: Vec::new(),
                context: None,
                warnings: Vec::new(),
                script: None,
                no_script: options
                    .render
                    .then(|| "the case file is not valid".to_owned()),
            };
        }
    };
    let mut report = CaseReport {
        name: case.name.clone(),
        file: file.display().to_string(),
        description: case.description.clone(),
        scenario: Some(case.scenario.as_str()),
        status: Status::Fail,
        message: None,
        diff: None,
        usage: None,
        logs: Vec::new(),
        context: case
            .context
            .as_ref()
            .and_then(|c| c.get("summary"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        warnings: flavor_warning(plugin, &case).into_iter().collect(),
        script: None,
        no_script: None,
    };
    let started = Instant::now();
    let result = host.plan(plugin, case.scenario, &case.facts);
    let wall_ms = duration_ms(started.elapsed());
    let mut usage = Usage {
        fuel: None,
        peak_memory_bytes: None,
        plan_steps: None,
        plan_bytes: None,
        wall_ms,
    };
    let returned = match result {
        Ok((plan, stats)) => {
            usage.fuel = Some(stats.fuel_used);
            usage.peak_memory_bytes = Some(stats.peak_memory_bytes);
            usage.plan_steps = Some(plan.steps.len());
            usage.plan_bytes = Some(plan.text_bytes());
            report.logs = stats
                .logs
                .iter()
                .map(|l| LogReport {
                    level: l.level.as_str().to_ascii_lowercase(),
                    message: l.message.clone(),
                })
                .collect();
            Returned::Plan(plan)
        }
        Err(error) => match Returned::declined(&error) {
            Some(declined) => declined,
            None => {
                let breach = error;
                if let PluginError::Fuel { limit, .. } = &breach {
                    usage.fuel = Some(*limit);
                }
                report.usage = Some(usage);
                if options.render {
                    report.no_script = Some("the call failed (see above)".to_owned());
                }
                report.message = Some(match &breach {
                    PluginError::Policy { .. } => format!(
                        "{breach}; if the plan needs it, declare it in the plugin's `policy` (operators will see it in `plugin inspect`), otherwise drop the step"
                    ),
                    _ => breach.to_string(),
                });
                return report;
            }
        },
    };
    report.usage = Some(usage);
    // Why the node would refuse the plan once rendered: the case fails
    // whatever `expect` says, as the VM would get no fixup.
    let mut refused = None;
    if options.render {
        match &returned {
            Returned::Plan(plan) => match compose_and_render(
                &case.facts,
                &[case.scenario],
                &[plugin],
                vec![plan.clone()],
                &host.limits().plan,
            ) {
                Ok(rendered) => report.script = Some(rendered.script),
                Err(e) => {
                    let why = format!("the node would refuse it: {e}");
                    report.no_script = Some(why.clone());
                    refused = Some(why);
                }
            },
            Returned::Declined { kind, reason, .. } => {
                report.no_script = Some(format!(
                    "the plugin declined ({}: {reason}), so the host has nothing to run",
                    kind.as_str()
                ));
            }
        }
    }
    if let Some(expect) = &case.expect
        && returned.matches(expect)
    {
        report.status = match refused {
            None => Status::Pass,
            Some(why) => {
                report.message = Some(format!(
                    "the result is as expected, but {why}; fix the plugin's plan"
                ));
                Status::Fail
            }
        };
        return report;
    }
    let actual_expect = returned.expectation();
    report.diff = Some(result_diff(case.expect.as_ref(), &actual_expect));
    if options.bless {
        match bless(&case, &actual_expect) {
            Ok(()) => {
                report.status = Status::Blessed;
                report.message = Some(format!("wrote the actual result to {}", file.display()));
            }
            Err(e) => {
                report.message = Some(format!(
                    "cannot write {}: {e}; check that the file and its folder are writable",
                    file.display()
                ));
            }
        }
    } else if case.expect.is_none() {
        report.message = Some(
            "the case has no `expect` yet: check the result below, then run with --bless to record it"
                .to_owned(),
        );
    } else {
        report.message = Some(
            "the result differs from `expect`: fix the plugin, or run with --bless if the change is intended"
                .to_owned(),
        );
    }
    if let Some(why) = refused {
        report.status = Status::Fail;
        let message = report.message.take().unwrap_or_default();
        report.message = Some(format!("{message}; and {why}"));
    }
    report
}

/// A warning when the case's VM names a flavour this plugin does not
/// declare (or none, for a plugin that declares some): the host would
/// select another plugin for such a VM, so the case tests a call that
/// never happens on a node.
fn flavor_warning(plugin: &LoadedPlugin, case: &Case) -> Option<String> {
    let served = &plugin.info.flavors;
    if served.is_empty()
        || case
            .facts
            .flavor
            .as_ref()
            .is_some_and(|f| served.contains(f))
    {
        return None;
    }
    let served = served
        .iter()
        .map(|f| format!("`{f}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let asked = match &case.facts.flavor {
        Some(f) => format!("flavour `{f}`"),
        None => "no flavour (`facts.flavor` is null)".to_owned(),
    };
    Some(format!(
        "case {}: its VM has {asked}, but plugin {} serves only {served}: a node would never call it for this VM (the generic plugin plans it); set `facts.flavor` to one of those, or declare the flavour in the plugin's `describe`",
        fixup_core::facts::escape_controls(&case.name),
        plugin.info.name
    ))
}

/// The lines of `text` for a terminal, split on `\n` only, with each `\r`
/// written as `\r`: a line ending in CRLF stays distinct from one ending
/// in LF (`str::lines` would drop the `\r`).
fn shown_lines(text: &str) -> impl Iterator<Item = String> + '_ {
    text.strip_suffix('\n')
        .unwrap_or(text)
        .split('\n')
        .map(|line| line.replace('\r', "\\r"))
}

fn duration_ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `28380` as `28,380`.
pub(super) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `812 B`, `64 KiB`, `1.1 MiB`.
fn bytes(n: usize) -> String {
    let scaled = |unit: usize, name: &str| {
        let v = n as f64 / unit as f64;
        if n.is_multiple_of(unit) {
            format!("{} {name}", n / unit)
        } else {
            format!("{v:.1} {name}")
        }
    };
    if n >= 1 << 20 {
        scaled(1 << 20, "MiB")
    } else if n >= 1 << 10 {
        scaled(1 << 10, "KiB")
    } else {
        format!("{n} B")
    }
}

fn percent(used: u64, limit: u64) -> String {
    if limit == 0 {
        return "-".to_owned();
    }
    let p = used as f64 * 100.0 / limit as f64;
    if used > 0 && p < 0.01 {
        "<0.01%".to_owned()
    } else {
        format!("{p:.2}%")
    }
}

impl Usage {
    /// `fuel 28,380 / 250,000,000 (0.01%)  memory 1.1 MiB / 16 MiB  plan 6 steps / 256, 812 B / 64 KiB  time 1.3 ms`
    fn line(&self, limits: &LimitsReport) -> String {
        let mut parts = Vec::new();
        if let Some(fuel) = self.fuel {
            parts.push(format!(
                "fuel {} / {} ({})",
                thousands(fuel),
                thousands(limits.fuel),
                percent(fuel, limits.fuel)
            ));
        }
        if let Some(memory) = self.peak_memory_bytes {
            parts.push(format!(
                "memory {} / {}",
                bytes(memory),
                bytes(limits.memory_bytes)
            ));
        }
        if let (Some(steps), Some(size)) = (self.plan_steps, self.plan_bytes) {
            parts.push(format!(
                "plan {steps} step{} / {}, {} / {}",
                if steps == 1 { "" } else { "s" },
                limits.plan_max_steps,
                bytes(size),
                bytes(limits.plan_max_bytes)
            ));
        }
        parts.push(format!("time {:.1} ms", self.wall_ms));
        parts.join("  ")
    }
}

const INDENT: &str = "        ";

impl fmt::Display for TestReport {
    /// The text `plugin test` prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.plugin;
        let n = self.cases.len();
        writeln!(
            f,
            "{} {} (sha256 {}) from {}: {n} case{}",
            p.name,
            p.version,
            &p.sha256[..p.sha256.len().min(16)],
            p.file,
            if n == 1 { "" } else { "s" }
        )?;
        for case in &self.cases {
            write!(f, "{:<7} {}", case.status.label(), case.name)?;
            match (case.scenario, &case.description) {
                (Some(s), Some(d)) => writeln!(f, "  {s}: {}", one_line(d))?,
                (Some(s), None) => writeln!(f, "  {s}")?,
                _ => writeln!(f)?,
            }
            if let Some(context) = &case.context {
                writeln!(f, "{INDENT}context: {}", one_line(context))?;
            }
            if let Some(usage) = &case.usage {
                writeln!(f, "{INDENT}{}", usage.line(&self.limits))?;
            }
            if let Some(message) = &case.message {
                writeln!(f, "{INDENT}{message}")?;
            }
            if case.status != Status::Pass {
                for log in &case.logs {
                    writeln!(f, "{INDENT}log {}: {}", log.level, log.message)?;
                }
            }
            if let Some(diff) = &case.diff {
                for line in shown_lines(diff) {
                    writeln!(f, "{INDENT}{line}")?;
                }
            }
            if let Some(script) = &case.script {
                writeln!(f, "{INDENT}hint script:")?;
                for line in shown_lines(script) {
                    writeln!(f, "{INDENT}  {line}")?;
                }
            }
            if let Some(why) = &case.no_script {
                writeln!(f, "{INDENT}no script: {why}")?;
            }
        }
        write!(f, "{} passed, {} failed", self.passed, self.failed)?;
        if self.blessed > 0 {
            write!(f, " ({} blessed)", self.blessed)?;
        }
        writeln!(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::tests::case_with_context;
    use crate::diff::unified_diff;
    use crate::{Expect, engine_options};

    /// A CRLF line stays distinct from an LF line when shown.
    #[test]
    fn shown_lines_keep_a_carriage_return_visible() {
        let lines: Vec<String> = shown_lines("a\r\nb\n").collect();
        assert_eq!(lines, vec!["a\\r".to_owned(), "b".to_owned()]);
        let diff = unified_diff("x\r\ny\n", "x\ny\n", ("expected", "actual"));
        let shown: Vec<String> = shown_lines(&diff).collect();
        assert!(shown.contains(&"-x\\r".to_owned()), "{shown:?}");
        assert!(shown.contains(&"+x".to_owned()), "{shown:?}");
    }

    /// The built-in oci-networkd written to `dir` as a plugin file.
    fn builtin_networkd(dir: &Path) -> PathBuf {
        let (_, bytes) = fixup_core::plugin::builtin::BUILTINS
            .iter()
            .find(|(n, _)| *n == "oci-networkd")
            .unwrap();
        let plugin = dir.join("oci-networkd.wasm");
        std::fs::write(&plugin, bytes).unwrap();
        plugin
    }

    #[test]
    fn bless_keeps_the_context_and_the_report_shows_its_summary() {
        let dir = tempfile::tempdir().unwrap();
        let stale = serde_json::json!({"plan": {"dialect": "posix-sh", "steps": []}});
        let path = case_with_context(dir.path(), stale);
        let before = load_case(&path).unwrap().context;
        let plugin = builtin_networkd(dir.path());
        let engine = engine_options(&EngineOptions::default());
        let report = test_plugin(
            engine.clone(),
            &plugin,
            &path,
            TestOptions {
                bless: true,
                ..TestOptions::default()
            },
        )
        .expect("the kit runs");
        assert_eq!(report.cases[0].status, Status::Blessed, "{report}");
        let after = load_case(&path).expect("blessed case loads");
        assert_eq!(after.context, before, "bless keeps the context");
        assert!(matches!(after.expect, Some(Expect::Plan(_))));

        let rerun = test_plugin(engine, &plugin, &path, TestOptions::default()).unwrap();
        assert!(rerun.success(), "{rerun}");
        assert_eq!(
            rerun.cases[0].context.as_deref(),
            Some("captured from pod apps/web-0")
        );
        assert!(
            rerun
                .to_string()
                .contains("context: captured from pod apps/web-0"),
            "{rerun}"
        );
    }

    #[test]
    fn a_description_and_summary_print_on_one_line() {
        assert_eq!(
            one_line("a\nPASS b\r\u{2028}c\u{2029}d\u{202e}"),
            "a\\nPASS b\\r\\u{2028}c\\u{2029}d\\u{202e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = case_with_context(
            dir.path(),
            serde_json::json!({"plan": {"dialect": "posix-sh", "steps": []}}),
        );
        let mut case: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        case["description"] = "x\nPASS    forged.json".into();
        case["context"]["summary"] = "y\u{2028}PASS    forged2.json".into();
        std::fs::write(&path, case.to_string()).unwrap();
        let plugin = builtin_networkd(dir.path());
        let engine = engine_options(&EngineOptions::default());
        let report = test_plugin(engine, &plugin, &path, TestOptions::default()).unwrap();
        let shown = report.to_string();
        assert!(
            !shown.lines().any(|l| l.starts_with("PASS    forged")),
            "{shown}"
        );
        assert!(!shown.contains('\u{2028}'), "{shown}");
        assert!(shown.contains("x\\nPASS    forged.json"), "{shown}");
    }
}
