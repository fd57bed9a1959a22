//! Criterion's results, percentiles, and the markdown summary.
//!
//! Criterion writes one directory per benchmark under its output directory
//! (`$CRITERION_HOME`, else `$CARGO_TARGET_DIR/criterion`, else
//! `target/criterion`); each holds `new/benchmark.json` (the id) and
//! `new/estimates.json` (the statistics of the latest run). [`read_criterion`]
//! collects the median of each.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The value at percentile `p` (0..=100) of sorted `samples`, nearest rank.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median of `samples` (sorted or not).
pub fn median(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    percentile(&sorted, 50.0)
}

/// A named workload for [`interleaved`]: one call per iteration.
pub type Workload<'a> = (String, Box<dyn FnMut() + 'a>);

/// Per-iteration medians of several workloads measured in turns: each
/// round times `batch` iterations of every workload, starting with a
/// different one each round, and each workload's figure is the median over
/// `rounds`. On a shared machine, load that comes and goes then hits every
/// workload alike, so the ratios between them hold up better than between
/// benchmarks run one after the other.
pub fn interleaved(
    rounds: usize,
    batch: usize,
    work: &mut [Workload<'_>],
) -> Vec<(String, Duration)> {
    let n = work.len();
    let mut samples = vec![Vec::with_capacity(rounds); n];
    for round in 0..rounds {
        for k in 0..n {
            let i = (round + k) % n;
            let f = &mut work[i].1;
            let started = std::time::Instant::now();
            for _ in 0..batch {
                f();
            }
            samples[i].push(started.elapsed() / batch.max(1) as u32);
        }
    }
    work.iter()
        .zip(samples)
        .map(|((name, _), s)| (name.clone(), median(&s)))
        .collect()
}

/// One benchmark's latest result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    /// `group/function/value`, for example `plan/wasm/oci-networkd`.
    pub id: String,
    /// Median time per iteration, nanoseconds.
    pub median_ns: f64,
    /// The 95 % confidence interval of the median.
    pub median_low_ns: f64,
    pub median_high_ns: f64,
}

#[derive(Deserialize)]
struct BenchmarkJson {
    full_id: String,
}

#[derive(Deserialize)]
struct Estimate {
    point_estimate: f64,
    confidence_interval: Interval,
}

#[derive(Deserialize)]
struct Interval {
    lower_bound: f64,
    upper_bound: f64,
}

#[derive(Deserialize)]
struct EstimatesJson {
    median: Estimate,
}

/// Where criterion writes, as criterion decides it (without asking cargo).
pub fn criterion_dir(workspace: &Path) -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(target) => PathBuf::from(target).join("criterion"),
        None => workspace.join("target").join("criterion"),
    }
}

/// Every benchmark's latest median under `dir`, by id.
pub fn read_criterion(dir: &Path) -> anyhow::Result<BTreeMap<String, BenchResult>> {
    let mut results = BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if !path.is_dir() {
                continue;
            }
            if path.file_name().is_some_and(|n| n == "new") {
                if let Some(result) = read_one(&path)? {
                    results.insert(result.id.clone(), result);
                }
            } else if path
                .file_name()
                .is_none_or(|n| n != "base" && n != "report")
            {
                stack.push(path);
            }
        }
    }
    Ok(results)
}

fn read_one(new: &Path) -> anyhow::Result<Option<BenchResult>> {
    let (Ok(id), Ok(estimates)) = (
        std::fs::read_to_string(new.join("benchmark.json")),
        std::fs::read_to_string(new.join("estimates.json")),
    ) else {
        return Ok(None);
    };
    let id: BenchmarkJson = serde_json::from_str(&id)?;
    let estimates: EstimatesJson = serde_json::from_str(&estimates)?;
    Ok(Some(BenchResult {
        id: id.full_id,
        median_ns: estimates.median.point_estimate,
        median_low_ns: estimates.median.confidence_interval.lower_bound,
        median_high_ns: estimates.median.confidence_interval.upper_bound,
    }))
}

/// A duration for people: `850 ns`, `41.2 µs`, `3.10 ms`, `1.25 s`.
pub fn human_ns(ns: f64) -> String {
    if !ns.is_finite() {
        "n/a".to_owned()
    } else if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// `12.3x`, or `0.021x` below 0.1.
pub fn ratio(value: f64, baseline: f64) -> String {
    if baseline > 0.0 && value.is_finite() && baseline.is_finite() {
        let r = value / baseline;
        if r < 0.1 {
            format!("{r:.3}x")
        } else {
            format!("{r:.1}x")
        }
    } else {
        "n/a".to_owned()
    }
}

/// A markdown table.
#[derive(Debug, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|s| (*s).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) -> &mut Self {
        self.rows.push(cells);
        self
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        out.push_str(&line(&self.header));
        let _ = writeln!(out, "|{}", "---|".repeat(self.header.len()));
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

/// `met`, `MISSED` or `n/a` for a "lower is better" goal.
pub fn verdict(value: f64, goal: f64) -> &'static str {
    if !value.is_finite() {
        "n/a"
    } else if value <= goal {
        "met"
    } else {
        "MISSED"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<Duration> = (1..=200).map(Duration::from_millis).collect();
        assert_eq!(percentile(&samples, 50.0), Duration::from_millis(100));
        assert_eq!(percentile(&samples, 99.0), Duration::from_millis(198));
        assert_eq!(percentile(&samples, 100.0), Duration::from_millis(200));
        assert_eq!(percentile(&samples[..1], 99.0), Duration::from_millis(1));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
        assert_eq!(
            median(&[3, 1, 2].map(Duration::from_millis)),
            Duration::from_millis(2)
        );
    }

    #[test]
    fn reads_criterion_output() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("plan/wasm/oci-networkd/new");
        std::fs::create_dir_all(&new).unwrap();
        std::fs::write(
            new.join("benchmark.json"),
            r#"{"group_id":"plan","function_id":"wasm","value_str":"oci-networkd","throughput":null,"full_id":"plan/wasm/oci-networkd","directory_name":"plan/wasm/oci-networkd","title":"plan/wasm/oci-networkd"}"#,
        )
        .unwrap();
        std::fs::write(
            new.join("estimates.json"),
            r#"{"mean":{"confidence_interval":{"confidence_level":0.95,"lower_bound":1.0,"upper_bound":3.0},"point_estimate":2.0,"standard_error":0.1},"median":{"confidence_interval":{"confidence_level":0.95,"lower_bound":40000.0,"upper_bound":42000.0},"point_estimate":41000.0,"standard_error":0.1}}"#,
        )
        .unwrap();
        let results = read_criterion(dir.path()).unwrap();
        let r = &results["plan/wasm/oci-networkd"];
        assert_eq!(r.median_ns, 41000.0);
        assert_eq!(r.median_low_ns, 40000.0);
    }

    #[test]
    fn interleaved_runs_everything() {
        let mut a = 0;
        let mut b = 0;
        let results = interleaved(
            3,
            4,
            &mut [
                ("a".to_owned(), Box::new(|| a += 1)),
                ("b".to_owned(), Box::new(|| b += 2)),
            ],
        );
        assert_eq!(results.len(), 2);
        assert_eq!(results[1].0, "b");
        assert_eq!((a, b), (12, 24));
    }

    #[test]
    fn formats() {
        assert_eq!(human_ns(850.0), "850 ns");
        assert_eq!(human_ns(41_234.0), "41.2 µs");
        assert_eq!(human_ns(3_100_000.0), "3.10 ms");
        assert_eq!(ratio(30.0, 10.0), "3.0x");
        assert_eq!(ratio(6.8, 328.0), "0.021x");
        assert_eq!(verdict(3.0, 5.0), "met");
        assert_eq!(verdict(6.0, 5.0), "MISSED");
        let table = Table::new(&["a", "b"])
            .row(vec!["1".into(), "2".into()])
            .render();
        assert_eq!(table, "| a | b |\n|---|---|\n| 1 | 2 |\n");
    }
}
