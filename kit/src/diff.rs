//! Diffs and bless: what a plugin returned, held against what a case
//! expects.
//!
//! This module owns the comparison ([`Returned::matches`]), the readable
//! diff shown on a mismatch (normalised JSON, with multi-line texts diffed
//! by line), and the expectation written back: `--bless` rewriting a case
//! file's `expect` ([`bless`]) and a new case file's text ([`case_text`],
//! for `capture`).

use std::io::Write as _;
use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

use fixup_core::classify::Scenario;
use fixup_core::facts::VmFacts;
use fixup_core::plan::Plan;
use fixup_core::plugin::PluginError;

use super::case::{Case, ErrorKind, Expect, ExpectedError, RawFacts, join};

/// What the plugin returned for a case (a sandbox breach is kept apart).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Returned {
    Plan(Plan),
    Declined {
        kind: ErrorKind,
        field: Option<String>,
        reason: String,
    },
}

impl Returned {
    /// A plugin that declines (`unsupported`, `invalid-facts`); `None` for
    /// any other error, which is a breach of the sandbox or the host's.
    pub(super) fn declined(error: &PluginError) -> Option<Self> {
        match error {
            PluginError::Unsupported { reason, .. } => Some(Returned::Declined {
                kind: ErrorKind::Unsupported,
                field: None,
                reason: reason.clone(),
            }),
            PluginError::InvalidFact { field, reason, .. } => Some(Returned::Declined {
                kind: ErrorKind::InvalidFacts,
                field: Some(field.clone()),
                reason: reason.clone(),
            }),
            _ => None,
        }
    }

    pub(super) fn matches(&self, expect: &Expect) -> bool {
        match (expect, self) {
            (Expect::Plan(expected), Returned::Plan(plan)) => {
                serde_json::to_value(plan).is_ok_and(|actual| actual == *expected)
            }
            (
                Expect::Error(e),
                Returned::Declined {
                    kind,
                    field,
                    reason,
                },
            ) => {
                e.kind == *kind
                    && e.field.as_ref().is_none_or(|f| Some(f) == field.as_ref())
                    && e.reason_contains
                        .as_ref()
                        .is_none_or(|text| reason.contains(text.as_str()))
            }
            _ => false,
        }
    }

    /// The expectation `--bless` records for this result.
    pub(super) fn expectation(&self) -> ExpectOut<'_> {
        match self {
            Returned::Plan(plan) => ExpectOut::Plan(plan),
            Returned::Declined {
                kind,
                field,
                reason,
            } => ExpectOut::Error(ExpectedError {
                kind: *kind,
                field: field.clone(),
                reason_contains: Some(reason.clone()),
            }),
        }
    }
}

/// An expectation as written to a case file: `{"plan": ...}` or
/// `{"error": ...}`, the plan's keys in their natural order.
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum ExpectOut<'a> {
    Plan(&'a Plan),
    Error(ExpectedError),
}

#[derive(Debug, Serialize)]
struct CaseFileOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    scenario: &'a str,
    facts: &'a RawFacts,
    #[serde(skip_serializing_if = "Option::is_none")]
    expect: Option<&'a ExpectOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    context: Option<&'a Map<String, Value>>,
}

impl CaseFileOut<'_> {
    /// The file's text: pretty JSON, two-space indent, a final newline.
    fn text(&self) -> Result<String, serde_json::Error> {
        let mut text = serde_json::to_string_pretty(self)?;
        text.push('\n');
        Ok(text)
    }
}

/// Whether `error` is the plugin declining (`unsupported`,
/// `invalid-facts`), which a case can expect, rather than a breach.
pub fn is_refusal(error: &PluginError) -> bool {
    Returned::declined(error).is_some()
}

/// The text of a new case file, in the form `--bless` writes: `facts`
/// (validated, so `load_case` reads them back as the same facts), and the
/// plugin's result as `expect`, or no `expect` for a call that breached
/// the sandbox (`plugin test` then shows the breach). `context` is kept
/// as given.
pub fn case_text(
    description: Option<&str>,
    scenario: Scenario,
    facts: &VmFacts,
    result: &Result<Plan, PluginError>,
    context: Option<&Map<String, Value>>,
) -> Result<String, serde_json::Error> {
    let returned = match result {
        Ok(plan) => Some(Returned::Plan(plan.clone())),
        Err(error) => Returned::declined(error),
    };
    let expect = returned.as_ref().map(Returned::expectation);
    CaseFileOut {
        description,
        scenario: scenario.as_str(),
        facts: &RawFacts::of(facts),
        expect: expect.as_ref(),
        context,
    }
    .text()
}

/// Keys in the order the contract lists them (and `--bless` writes them);
/// keys not listed follow, alphabetically.
const KEY_ORDER: [&str; 16] = [
    "plan",
    "error",
    "kind",
    "field",
    "reason_contains",
    "dialect",
    "steps",
    "description",
    "phase",
    "best_effort",
    "run",
    "write_file",
    "remove_files",
    "path",
    "content",
    "mode",
];

/// Pretty JSON (two-space indent) with keys in [`KEY_ORDER`] and a final
/// newline. Both sides of a diff go through this, so only real differences
/// show, whatever the key order and spacing in the case file.
fn normalised(value: &impl Serialize) -> String {
    let value = serde_json::to_value(value).unwrap_or(Value::Null);
    let mut out = String::new();
    pretty(&value, 0, &mut out);
    out.push('\n');
    out
}

fn pretty(value: &Value, depth: usize, out: &mut String) {
    let pad = |out: &mut String, depth: usize| out.push_str(&"  ".repeat(depth));
    match value {
        Value::Object(map) if !map.is_empty() => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by_key(|k| {
                let rank = KEY_ORDER.iter().position(|o| o == k);
                (rank.unwrap_or(KEY_ORDER.len()), k.as_str())
            });
            out.push_str("{\n");
            for (i, key) in keys.iter().enumerate() {
                pad(out, depth + 1);
                out.push_str(&Value::String((*key).clone()).to_string());
                out.push_str(": ");
                pretty(&map[key.as_str()], depth + 1, out);
                out.push_str(if i + 1 < keys.len() { ",\n" } else { "\n" });
            }
            pad(out, depth);
            out.push('}');
        }
        Value::Array(items) if !items.is_empty() => {
            out.push_str("[\n");
            for (i, item) in items.iter().enumerate() {
                pad(out, depth + 1);
                pretty(item, depth + 1, out);
                out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
            }
            pad(out, depth);
            out.push(']');
        }
        scalar_or_empty => out.push_str(&scalar_or_empty.to_string()),
    }
}

fn expect_value(expect: &Expect) -> Value {
    match expect {
        Expect::Plan(plan) => serde_json::json!({ "plan": plan }),
        Expect::Error(e) => serde_json::json!({ "error": e }),
    }
}

pub(super) fn unified_diff(expected: &str, actual: &str, (old, new): (&str, &str)) -> String {
    similar::TextDiff::from_lines(expected, actual)
        .unified_diff()
        .context_radius(3)
        .header(old, new)
        .to_string()
}

/// The diff of `expect` against the actual result: the normalised JSON,
/// except that a string field that differs and holds several lines (a
/// file's `content`) is diffed by line under its path, after the JSON,
/// rather than shown as two long escaped strings.
pub(super) fn result_diff(expect: Option<&Expect>, actual: &ExpectOut<'_>) -> String {
    let mut actual = serde_json::to_value(actual).unwrap_or(Value::Null);
    let Some(expect) = expect else {
        return unified_diff("", &normalised(&actual), ("expected", "actual"));
    };
    let mut expected = expect_value(expect);
    let mut texts = Vec::new();
    take_multiline_texts(&mut expected, &mut actual, String::new(), &mut texts);
    let mut diff = unified_diff(
        &normalised(&expected),
        &normalised(&actual),
        ("expected", "actual"),
    );
    for (path, old, new) in texts {
        let (old_name, new_name) = (format!("expected {path}"), format!("actual {path}"));
        diff.push_str(&unified_diff(&old, &new, (&old_name, &new_name)));
    }
    diff
}

/// Walk `expected` and `actual` side by side (into arrays of the same
/// length only); where both hold a string at the same path, the strings
/// differ and either has a line break, replace both with one marker and
/// push `(path, expected, actual)`.
fn take_multiline_texts(
    expected: &mut Value,
    actual: &mut Value,
    path: String,
    out: &mut Vec<(String, String, String)>,
) {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (key, e) in e.iter_mut() {
                if let Some(a) = a.get_mut(key) {
                    take_multiline_texts(e, a, join(&path, key), out);
                }
            }
        }
        // Elements correspond only when the arrays are as long: with a
        // step added or dropped, pairing by index would diff unrelated
        // steps, so the escaped JSON stays.
        (Value::Array(e), Value::Array(a)) if e.len() == a.len() => {
            for (i, (e, a)) in e.iter_mut().zip(a.iter_mut()).enumerate() {
                take_multiline_texts(e, a, format!("{path}[{i}]"), out);
            }
        }
        (Value::String(e), Value::String(a))
            if e != a && (e.contains('\n') || a.contains('\n')) =>
        {
            let marker = format!("<text of several lines: see the line diff of {path} below>");
            let old = std::mem::replace(e, marker.clone());
            let new = std::mem::replace(a, marker);
            out.push((path, old, new));
        }
        _ => {}
    }
}

/// Write the case file back with a new `expect`, through a temporary file
/// renamed into place so an interrupted bless leaves the old file whole.
pub(super) fn bless(case: &Case, expect: &ExpectOut<'_>) -> std::io::Result<()> {
    let text = CaseFileOut {
        description: case.description.as_deref(),
        scenario: case.scenario.as_str(),
        facts: &case.raw_facts,
        expect: Some(expect),
        context: case.context.as_ref(),
    }
    .text()
    .map_err(std::io::Error::other)?;
    let dir = case
        .file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(text.as_bytes())?;
    tmp.persist(&case.file).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Strings are line-diffed only where array elements correspond: with
    /// a step added, the escaped JSON stays.
    #[test]
    fn multiline_texts_are_taken_only_from_arrays_of_one_length() {
        let step = |content: &str| serde_json::json!({"content": content});
        let mut expected = serde_json::json!({"steps": [step("a\nb")]});
        let mut actual = serde_json::json!({"steps": [step("a\nc")]});
        let mut texts = Vec::new();
        take_multiline_texts(&mut expected, &mut actual, String::new(), &mut texts);
        assert_eq!(texts.len(), 1, "{texts:?}");

        let mut expected = serde_json::json!({"steps": [step("a\nb")]});
        let mut actual = serde_json::json!({"steps": [step("x\ny"), step("a\nc")]});
        let mut texts = Vec::new();
        take_multiline_texts(&mut expected, &mut actual, String::new(), &mut texts);
        assert!(texts.is_empty(), "{texts:?}");
        assert_eq!(expected["steps"][0]["content"], "a\nb");
    }
}
