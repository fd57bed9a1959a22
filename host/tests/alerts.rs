//! `deploy/alerts.yaml`, the Prometheus alerting rules an operator
//! installs beside the daemon, tied to the daemon and to their runbook.
//!
//! - **promtool.** `promtool check rules deploy/alerts.yaml` and `promtool
//!   test rules deploy/alerts.test.yaml` pass: each alert fires on its
//!   series, with the labels and annotations expected, and stays quiet on
//!   the near misses. Without `promtool` on the PATH (Debian: `apt-get
//!   install prometheus`) this part says loudly that it was skipped, unless
//!   `COCOON_FIXUP_REQUIRE_PROMTOOL=1` (set by `.ci/run`) makes that a
//!   failure. The rest needs no promtool.
//! - **The metrics are the daemon's.** Every series selector in the rules'
//!   expressions names a series that the daemon's own registry
//!   ([`Metrics::encode`], what `/metrics` serves) renders, every label it
//!   matches on is one that series has, and every value it matches is one
//!   the code emits: the registry is fed the values from the code's own
//!   enums and error kinds ([`FixupEnd::as_str`], [`NodeError::kind`],
//!   [`fixup_host::metrics::retry_kind`], ...). A renamed metric, label or value breaks
//!   this test. `up` is Prometheus's own.
//! - **Every alert is complete.** A `severity`, a `summary` and a
//!   `description`, and a `runbook_url` `docs/alerts.md#<alert, lower
//!   case>` whose heading exists; its annotations use only labels the
//!   alert has; and `deploy/alerts.test.yaml` has a case where it fires and
//!   one where it must not.
//! - **The numbers follow the daemon's.** An alert on a condition that
//!   persists (a `for:` over an `increase()` window) has a window at least
//!   twice the longest the daemon waits between two tries of a pod (the
//!   retry backoff's cap, after an IP wait's whole budget), so the counter
//!   grows in every window while the condition lasts; a `for:` longer than
//!   the window, so one error alone never fires; and a `for:` past a
//!   fixup's whole retry budget. `CocoonFixupNotWatching`'s `for:` is at
//!   least twice the time one watch error holds its gauge at 0
//!   ([`WATCH_ERROR_QUIET`]), so an outage shorter than that never fires.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fixup_core::classify::Scenario;
use fixup_core::decision::{
    Backoff, FixupEnd, NodeError, PodError, Readiness, ReadyConfig, RetryConfig, SacEnd, Stop,
};
use fixup_core::facts::FactError;
use fixup_core::planner::PlannerError;
use fixup_core::plugin::PluginError;
use fixup_host::cocoon::CocoonError;
use fixup_host::metrics::Metrics;
use fixup_host::serve::WATCH_ERROR_QUIET;
use serde_json::Value;

const RULES: &str = "deploy/alerts.yaml";
const RULE_TESTS: &str = "deploy/alerts.test.yaml";
const RUNBOOK: &str = "docs/alerts.md";

/// Labels Prometheus gives every series of a target; not the daemon's.
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

/// Series Prometheus makes itself for a scrape target.
const PROMETHEUS_SERIES: [&str; 1] = ["up"];

const SEVERITIES: [&str; 2] = ["critical", "warning"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(relative: &str) -> String {
    let path = repo().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn yaml(relative: &str) -> Value {
    serde_saphyr::from_str::<Value>(&read(relative))
        .unwrap_or_else(|e| panic!("{relative} is not valid YAML: {e}"))
}

/// One alerting rule of `deploy/alerts.yaml`.
#[derive(Debug)]
struct Alert {
    name: String,
    expr: String,
    for_: Option<Duration>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

fn string_map(value: &Value, what: &str) -> BTreeMap<String, String> {
    let Some(map) = value.as_object() else {
        return BTreeMap::new();
    };
    map.iter()
        .map(|(k, v)| {
            let v = v
                .as_str()
                .unwrap_or_else(|| panic!("{what}: {k} is not a string: {v}"));
            (k.clone(), v.to_owned())
        })
        .collect()
}

fn alerts() -> Vec<Alert> {
    let rules = yaml(RULES);
    let groups = rules["groups"]
        .as_array()
        .unwrap_or_else(|| panic!("{RULES}: no `groups:` list"));
    let mut alerts = Vec::new();
    for group in groups {
        for rule in group["rules"].as_array().expect("a group's rules") {
            let name = rule["alert"]
                .as_str()
                .unwrap_or_else(|| panic!("{RULES}: a rule that is no alert: {rule}"))
                .to_owned();
            alerts.push(Alert {
                expr: rule["expr"].as_str().expect("an alert's expr").to_owned(),
                for_: rule["for"]
                    .as_str()
                    .map(|d| prometheus_duration(d).unwrap_or_else(|| panic!("{name}: for: {d}"))),
                labels: string_map(&rule["labels"], &name),
                annotations: string_map(&rule["annotations"], &name),
                name,
            });
        }
    }
    assert!(!alerts.is_empty(), "{RULES} has no alerts");
    alerts
}

/// A Prometheus duration as the rules write them: `90s`, `5m`, `1h30m`.
fn prometheus_duration(text: &str) -> Option<Duration> {
    let mut total = 0u64;
    let mut digits = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            _ => return None,
        };
        total += digits.parse::<u64>().ok()? * unit;
        digits.clear();
    }
    digits.is_empty().then_some(Duration::from_secs(total))
}

// ---- promtool ----

/// Whether promtool is here; `false` (said loudly) lets the test skip.
fn have_promtool() -> bool {
    match Command::new("promtool").arg("--version").output() {
        Ok(version) if version.status.success() => {
            let version = String::from_utf8_lossy(&version.stdout);
            eprintln!("{}", version.lines().next().unwrap_or_default());
            true
        }
        _ => {
            assert!(
                std::env::var_os("COCOON_FIXUP_REQUIRE_PROMTOOL").is_none_or(|v| v != "1"),
                "promtool is not on the PATH and COCOON_FIXUP_REQUIRE_PROMTOOL=1: install it (Debian: `apt-get install --no-install-recommends prometheus`)"
            );
            // Past the test harness, which shows a passing test's own output only
            // with --nocapture: a skip is said whatever the flags.
            let _ = writeln!(
                std::io::stderr(),
                "\n*** SKIPPED: the alerting rules' promtool checks (host/tests/alerts.rs) need promtool (Debian: `apt-get install --no-install-recommends prometheus`), which is not on the PATH. `.ci/run` installs it and requires them. ***\n"
            );
            false
        }
    }
}

/// `promtool <args>` in the repository root; panics with its output
/// unless it succeeds.
fn promtool(args: &[&str]) {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(repo())
        .output()
        .expect("promtool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "`promtool {}` failed ({}):\n{text}",
        args.join(" "),
        output.status
    );
}

#[test]
fn promtool_checks_the_rules_and_runs_their_tests() {
    if !have_promtool() {
        return;
    }
    promtool(&["check", "rules", RULES]);
    promtool(&["test", "rules", RULE_TESTS]);
}

// ---- the metrics are the daemon's ----

/// A registry fed every label value the rules match on, each as the code
/// makes it, and one of everything else the daemon counts.
fn fed_metrics() -> Metrics {
    let m = Metrics::new();
    for end in [FixupEnd::Done, FixupEnd::Exhausted] {
        m.fixup(Scenario::OciNetworkd, end.as_str(), 1);
    }
    for readiness in [
        Readiness::Ready,
        Readiness::TimedOut,
        Readiness::Shutdown,
        Readiness::Gone,
    ] {
        m.ip_wait(readiness.as_str(), "clone");
    }
    for end in [SacEnd::Set, SacEnd::Failed, SacEnd::Shutdown, SacEnd::Gone] {
        m.sac(end.as_str());
    }
    m.vm_mismatch();
    m.resumed("post_clone");
    let pod = || "apps/web-0".to_owned();
    let deadline = || PluginError::Deadline {
        plugin: "acme-net".into(),
        limit: Duration::from_secs(1),
    };
    let node_errors = [
        NodeError::Lease {
            pod: pod(),
            message: "the lease file is no list".into(),
        },
        NodeError::NoPlan { pod: pod() },
        NodeError::PluginCode {
            pod: pod(),
            source: deadline(),
        },
        NodeError::BadRecord {
            pod: pod(),
            source: FactError::Missing {
                pod: None,
                field: "id".into(),
                fix: "pass cocoon's record",
            },
        },
    ];
    for error in &node_errors {
        m.node_error(error.kind());
    }
    // `serve` counts a retry for each error that is retried, by its kind.
    let host_errors = [
        Stop::Api(PodError::Api {
            pod: pod(),
            reason: "connection refused".into(),
        }),
        Stop::RunningRefused {
            error: PodError::Refused {
                pod: pod(),
                reason: "403".into(),
            },
        },
        Stop::Unproven {
            pod: pod(),
            name: "vk-apps-web-0".into(),
            reason: "not listed yet".into(),
        },
        Stop::Inspect {
            pod: pod(),
            message: CocoonError::Timeout {
                what: "cocoon vm inspect".into(),
                after: Duration::from_secs(10),
            }
            .to_string(),
        },
    ];
    for error in host_errors.into_iter().chain(node_errors.map(Stop::Node)) {
        assert!(error.is_retryable(), "{error}");
        m.retry(&error);
    }
    for op in ["recall", "keep", "observe", "dropped"] {
        m.record_error(op);
    }
    for result in ["swapped", "rejected"] {
        // The values are literals at their one call site.
        let call = format!("plugin_reload(\"{result}\")");
        assert!(
            read("host/src/reload.rs").contains(&call),
            "host/src/reload.rs no longer calls {call}: the rules match result=\"{result}\""
        );
        m.plugin_reload(result);
    }
    m.plugin_rollback("acme-net");
    m.plugin_load_failures(1);
    m.plan_error(&PlannerError::Plugin(deadline()));
    // The pod watch's series need no feeding: `watch_synced` and every
    // kind of `watch_errors` are exported from the start, at 0
    // (host/tests/serve.rs, `the_pod_watch_counts_its_errors_...`).
    m
}

/// The metrics host/src/metrics.rs registers, as written there (without
/// the registry's `cocoon_fixup_` prefix): to tell a metric the test does
/// not feed from one that does not exist.
fn registered() -> Vec<String> {
    read("host/src/metrics.rs")
        .split("registry.register(")
        .skip(1)
        .filter_map(|call| call.split('"').nth(1).map(str::to_owned))
        .collect()
}

/// The names of the series each metric of a text exposition has, from
/// its `# TYPE` lines (a labelled family has none until it has a series).
fn families(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for family in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let (name, kind) = family.split_once(' ').expect("# TYPE name kind");
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            "gauge" | "unknown" => &[""],
            other => panic!("a metric of kind {other} ({name}): teach this test its series"),
        };
        names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    assert!(!names.is_empty(), "the registry renders no metric");
    names
}

/// A series the daemon serves: its name and labels.
type Series = (String, BTreeMap<String, String>);

/// The series of a text exposition, by name.
fn exposition(text: &str) -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
    let mut series: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, labels) = parse_series(line);
        series.entry(name).or_default().push(labels);
    }
    series
}

/// `name{a="x",b="y"} value` (the daemon's label values hold no `"`).
fn parse_series(line: &str) -> Series {
    let end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = line[..end].to_owned();
    let mut labels = BTreeMap::new();
    if line[end..].starts_with('{') {
        let close = line.find('}').expect("a closed label set");
        for pair in line[end + 1..close].split(',').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').expect("label=value");
            labels.insert(k.to_owned(), v.trim_matches('"').to_owned());
        }
    }
    (name, labels)
}

/// A label matcher of a selector: `kind!~"lease|cocoon"`.
#[derive(Debug)]
struct Matcher {
    label: String,
    op: String,
    value: String,
}

/// What an expression refers to: its series selectors and the labels of
/// its `by`/`on` clauses (the first `by` list apart, the alert's labels).
#[derive(Debug, Default)]
struct Refs {
    selectors: Vec<(String, Vec<Matcher>)>,
    grouping: BTreeSet<String>,
    first_by: Option<BTreeSet<String>>,
}

const KEYWORDS: [&str; 11] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "offset",
    "bool",
];

const AGGREGATIONS: [&str; 12] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
];

/// The selectors and grouping labels of a PromQL expression: a scanner for
/// the subset the rules use (no strings outside label matchers).
fn refs(expr: &str) -> Refs {
    let chars: Vec<char> = expr.chars().collect();
    let mut refs = Refs::default();
    let mut i = 0;
    let ident = |i: &mut usize| {
        let start = *i;
        while *i < chars.len()
            && (chars[*i].is_ascii_alphanumeric() || matches!(chars[*i], '_' | ':'))
        {
            *i += 1;
        }
        chars[start..*i].iter().collect::<String>()
    };
    let skip_space = |i: &mut usize| {
        while *i < chars.len() && chars[*i].is_whitespace() {
            *i += 1;
        }
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '[' {
            // A range or a subquery's duration.
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c.is_ascii_digit() {
            // A number, or a duration after `offset`.
            while i < chars.len() && chars[i].is_ascii_alphanumeric() {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' {
            let word = ident(&mut i);
            skip_space(&mut i);
            let next = chars.get(i).copied();
            if KEYWORDS.contains(&word.as_str()) {
                if matches!(
                    word.as_str(),
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                ) && next == Some('(')
                {
                    let close = i + chars[i..]
                        .iter()
                        .position(|&c| c == ')')
                        .expect("a closed list");
                    let list: BTreeSet<String> = chars[i + 1..close]
                        .iter()
                        .collect::<String>()
                        .split(',')
                        .map(|l| l.trim().to_owned())
                        .filter(|l| !l.is_empty())
                        .collect();
                    if word == "by" && refs.first_by.is_none() {
                        refs.first_by = Some(list.clone());
                    }
                    refs.grouping.extend(list);
                    i = close + 1;
                }
            } else if next == Some('(') || AGGREGATIONS.contains(&word.as_str()) {
                // A function or an aggregation (`sum by (job) (...)`).
            } else {
                let mut matchers = Vec::new();
                if next == Some('{') {
                    let close = i + chars[i..]
                        .iter()
                        .position(|&c| c == '}')
                        .expect("a closed selector");
                    let body: String = chars[i + 1..close].iter().collect();
                    matchers = parse_matchers(&body);
                    i = close + 1;
                }
                refs.selectors.push((word, matchers));
            }
        } else {
            i += 1;
        }
    }
    refs
}

fn parse_matchers(body: &str) -> Vec<Matcher> {
    body.split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(|m| {
            let at = m
                .find(['=', '!'])
                .unwrap_or_else(|| panic!("a matcher: {m}"));
            let rest = &m[at..];
            let op = ["=~", "!~", "!=", "="]
                .into_iter()
                .find(|op| rest.starts_with(op))
                .unwrap_or_else(|| panic!("a matcher's operator: {m}"));
            let value = rest[op.len()..].trim();
            assert!(
                value.len() >= 2 && value.starts_with('"') && value.ends_with('"'),
                "a quoted value: {m}"
            );
            Matcher {
                label: m[..at].trim().to_owned(),
                op: op.to_owned(),
                value: value[1..value.len() - 1].to_owned(),
            }
        })
        .collect()
}

#[test]
fn the_rules_select_only_what_the_daemon_exports() {
    let text = fed_metrics().encode();
    let served = exposition(&text);
    let families = families(&text);
    let registered = registered();
    for alert in alerts() {
        let refs = refs(&alert.expr);
        assert!(
            !refs.selectors.is_empty(),
            "{}: selects nothing",
            alert.name
        );
        let mut labels_here: BTreeSet<String> = TARGET_LABELS.map(str::to_owned).into();
        for (name, matchers) in &refs.selectors {
            if PROMETHEUS_SERIES.contains(&name.as_str()) {
                for m in matchers {
                    assert!(
                        TARGET_LABELS.contains(&m.label.as_str()),
                        "{}: {name} has only target labels, not {}",
                        alert.name,
                        m.label
                    );
                }
                continue;
            }
            assert!(
                families.contains(name),
                "{}: {name} is not a series the daemon serves{}",
                alert.name,
                if registered
                    .iter()
                    .any(|r| name.starts_with(&format!("cocoon_fixup_{r}")))
                {
                    ": feed its metric in fed_metrics()".to_owned()
                } else {
                    format!(
                        "; its metrics are {registered:?} (host/src/metrics.rs), served as {families:?}"
                    )
                }
            );
            let series = served.get(name).unwrap_or_else(|| {
                panic!(
                    "{}: {name} has no series here to check its labels against: feed it in fed_metrics()",
                    alert.name
                )
            });
            labels_here.extend(series.iter().flat_map(|s| s.keys().cloned()));
            for m in matchers {
                if TARGET_LABELS.contains(&m.label.as_str()) {
                    continue;
                }
                let values: BTreeSet<&str> = series
                    .iter()
                    .filter_map(|s| s.get(&m.label).map(String::as_str))
                    .collect();
                assert!(
                    !values.is_empty(),
                    "{}: {name} has no label {}",
                    alert.name,
                    m.label
                );
                let wanted: Vec<&str> = if m.op.ends_with('~') {
                    assert!(
                        m.value
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '|')),
                        "{}: only alternatives of plain values are checked here: {}",
                        alert.name,
                        m.value
                    );
                    m.value.split('|').collect()
                } else {
                    vec![m.value.as_str()]
                };
                for value in wanted {
                    assert!(
                        values.contains(value),
                        "{}: {name}{{{}{}\"{}\"}}: the daemon never gives {} the value {value:?}; it gives {values:?}",
                        alert.name,
                        m.label,
                        m.op,
                        m.value,
                        m.label
                    );
                }
            }
        }
        for label in &refs.grouping {
            assert!(
                labels_here.contains(label),
                "{}: groups by {label}, which none of its series has",
                alert.name
            );
        }
        // The alert's own labels: what its outermost `by` keeps, else its
        // series' labels.
        let alert_labels = refs.first_by.clone().unwrap_or(labels_here);
        for (key, text) in &alert.annotations {
            for label in template_labels(text) {
                assert!(
                    alert_labels.contains(&label),
                    "{}: annotation {key} uses $labels.{label}, which the alert does not have (it has {alert_labels:?})",
                    alert.name
                );
            }
        }
    }
}

/// The `$labels.NAME` a template uses.
fn template_labels(text: &str) -> Vec<String> {
    text.split("$labels.")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

// ---- every alert is complete ----

/// GitHub's anchor for a Markdown heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_has_its_labels_annotations_runbook_and_tests() {
    let runbook = read(RUNBOOK);
    let anchors: BTreeSet<String> = runbook
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect();
    let tests = yaml(RULE_TESTS);
    assert!(
        tests["rule_files"]
            .as_array()
            .is_some_and(|files| files.iter().any(|f| f == "alerts.yaml")),
        "{RULE_TESTS} does not load alerts.yaml"
    );
    // Alert name -> (cases where it fires, cases where nothing of it does).
    let mut cases: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for group in tests["tests"].as_array().expect("tests") {
        for case in group["alert_rule_test"].as_array().into_iter().flatten() {
            let name = case["alertname"].as_str().expect("alertname").to_owned();
            let fires = case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
            let entry = cases.entry(name).or_default();
            if fires {
                entry.0 += 1;
            } else {
                entry.1 += 1;
            }
        }
    }
    let alerts = alerts();
    let mut names = BTreeSet::new();
    for alert in &alerts {
        let name = &alert.name;
        assert!(names.insert(name.clone()), "{name} is defined twice");
        let severity = alert.labels.get("severity").map(String::as_str);
        assert!(
            severity.is_some_and(|s| SEVERITIES.contains(&s)),
            "{name}: severity {severity:?}, not one of {SEVERITIES:?}"
        );
        for key in ["summary", "description", "runbook_url"] {
            assert!(
                alert
                    .annotations
                    .get(key)
                    .is_some_and(|v| !v.trim().is_empty()),
                "{name}: no {key} annotation"
            );
        }
        let url = &alert.annotations["runbook_url"];
        let expected = format!("{RUNBOOK}#{}", name.to_lowercase());
        assert_eq!(url, &expected, "{name}: runbook_url");
        assert!(
            anchors.contains(&name.to_lowercase()),
            "{name}: {RUNBOOK} has no heading `{name}` for its runbook_url {url}"
        );
        let (fire, quiet) = cases.get(name).copied().unwrap_or_default();
        assert!(
            fire > 0 && quiet > 0,
            "{name}: {RULE_TESTS} has {fire} case(s) where it fires and {quiet} where it must not; it needs both"
        );
    }
    for name in cases.keys() {
        assert!(
            names.contains(name),
            "{RULE_TESTS} tests {name}, which is no alert"
        );
    }
}

// ---- the numbers follow the daemon's ----

/// The `[window]` of the first `increase(` in an expression.
fn increase_window(expr: &str) -> Option<Duration> {
    let rest = &expr[expr.find("increase(")?..];
    let open = rest.find('[')?;
    let close = rest[open..].find(']')? + open;
    prometheus_duration(&rest[open + 1..close])
}

#[test]
fn persistent_conditions_are_judged_against_the_daemons_retry_numbers() {
    // The longest a pod that keeps failing goes without adding to a
    // counter: the retry backoff's cap, after an IP wait's whole budget
    // (an unreadable lease file is found at the wait's end).
    let longest_gap = Backoff::default().max + ReadyConfig::default().budget;
    let budget = RetryConfig::default().budget;
    let mut persistent = 0;
    for alert in alerts() {
        let (Some(for_), Some(window)) = (alert.for_, increase_window(&alert.expr)) else {
            continue;
        };
        persistent += 1;
        let name = &alert.name;
        assert!(
            window >= 2 * longest_gap,
            "{name}: window {window:?} under twice the longest gap between two tries ({longest_gap:?})"
        );
        assert!(
            for_ > window,
            "{name}: for {for_:?} not over its window {window:?}: one error alone would fire it"
        );
        assert!(
            for_ >= budget,
            "{name}: for {for_:?} under a fixup's retry budget {budget:?}"
        );
    }
    assert!(
        persistent > 0,
        "no alert on a persisting condition was found"
    );
}

#[test]
fn not_watching_outlasts_what_one_watch_error_does() {
    // One watch error keeps `cocoon_fixup_watch_synced` at 0 for up to
    // WATCH_ERROR_QUIET after it, and a watch that keeps failing errs
    // again within it (kube-runtime's backoff, at most 60 s with jitter),
    // so the gauge stays 0 while it fails. An outage of d is d plus
    // WATCH_ERROR_QUIET at 0: one under WATCH_ERROR_QUIET must not fire.
    let alert = alerts()
        .into_iter()
        .find(|a| a.name == "CocoonFixupNotWatching")
        .expect("CocoonFixupNotWatching in the rules");
    assert!(
        alert.expr.contains("cocoon_fixup_watch_synced"),
        "{}",
        alert.expr
    );
    let for_ = alert.for_.expect("CocoonFixupNotWatching has a for:");
    assert!(
        for_ >= 2 * WATCH_ERROR_QUIET,
        "CocoonFixupNotWatching: for {for_:?} is under twice the {WATCH_ERROR_QUIET:?} one watch error holds the gauge at 0: an outage shorter than that would fire it"
    );
}

#[test]
fn the_scanner_reads_selectors_and_groupings() {
    let r = refs(
        r#"sum by (job, kind) (increase(cocoon_fixup_node_errors_total{kind!~"lease|cocoon"}[5m])) > 0 unless on (job) up{job="x"} offset 15m"#,
    );
    let names: Vec<&str> = r.selectors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["cocoon_fixup_node_errors_total", "up"]);
    let m = &r.selectors[0].1[0];
    assert_eq!(
        (m.label.as_str(), m.op.as_str(), m.value.as_str()),
        ("kind", "!~", "lease|cocoon")
    );
    assert_eq!(
        r.first_by,
        Some(["job".to_owned(), "kind".to_owned()].into())
    );
    assert!(r.grouping.contains("job") && r.grouping.contains("kind"));
    assert_eq!(
        prometheus_duration("1h30m"),
        Some(Duration::from_secs(5400))
    );
    assert_eq!(prometheus_duration("5x"), None);
    assert_eq!(anchor(" CocoonFixupDown"), "cocoonfixupdown");
}
