//! The clone storm: many fixup flows at once through the real loop.
//!
//! Every flow is `Host::handle` on its own pod: read the pod from
//! `MemoryPods`, inspect the VM, classify, plan (a fresh sandbox per plugin
//! call), write `post-clone-state=running`, exec through [`BenchCocoon`]
//! (which answers after a delay and fails the first attempt of every fifth
//! VM), wait the retry interval, try again, write `done`, record the event,
//! and publish the IP (static first NICs, so readiness is immediate). The
//! pods cycle through the four [`Case`]s.
//!
//! Run it in a process of its own ([`crate::report`] does) so CPU time and
//! peak memory are the storm's and not a benchmark harness's.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fixup_host::apply::{ReadyConfig, RetryConfig};
use fixup_host::host::{Host, HostConfig, Trigger};
use fixup_host::metrics::Metrics;
use fixup_host::pods::{MemoryPods, keys};
use fixup_host::ready::{DEFAULT_LEASE_POLL, LeaseWatcher};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::cases::{self, Case, NAMESPACE};
use crate::cocoon::BenchCocoonBuilder;
use crate::process;

/// How the storm is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StormConfig {
    /// Flows started at once (1 000).
    pub fixups: usize,
    /// How long the runner takes to answer an exec (3 ms).
    pub exec_delay: Duration,
    /// The first attempt of every VM whose index is a multiple of this
    /// fails (5: a fifth of first attempts).
    pub fail_first_every: usize,
    /// The wait between attempts (100 ms instead of the default 3 s, so the
    /// run ends quickly; the budget stays 180 s).
    pub retry_interval: Duration,
    /// The precompiled-plugin cache, warm as on a daemon's second start;
    /// `None` compiles the plugins in this process first.
    pub cache_dir: Option<PathBuf>,
    /// Tokio worker threads (`None`: one per core, the default).
    pub workers: Option<usize>,
}

impl Default for StormConfig {
    fn default() -> Self {
        StormConfig {
            fixups: 1000,
            exec_delay: Duration::from_millis(3),
            fail_first_every: 5,
            retry_interval: Duration::from_millis(100),
            cache_dir: None,
            workers: None,
        }
    }
}

/// What the storm cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StormResult {
    pub fixups: usize,
    pub exec_delay_ms: f64,
    pub retry_interval_ms: f64,
    /// Flows whose first attempt failed.
    pub failed_first: usize,
    /// Execs run, every flow together.
    pub attempts: u64,
    /// From the first spawn to the last flow's end.
    pub wall_ms: f64,
    /// Process CPU time (user + system, every thread) during the storm.
    pub cpu_ms: f64,
    pub cpu_per_fixup_us: f64,
    /// Resident memory with the planner, runtime and pods set up, before
    /// the storm.
    pub rss_before_kib: u64,
    /// Resident memory after the storm.
    pub rss_after_kib: u64,
    /// The process's peak resident memory (`VmHWM`, `ru_maxrss`), whole
    /// life: setup included.
    pub peak_rss_kib: u64,
    /// Time to build the planner (the four built-ins) in this process.
    pub planner_ms: f64,
    pub cache: bool,
}

/// Run the storm on a runtime of its own. Fails if any flow does not end
/// with its fixup done and its IP published.
pub fn run(config: &StormConfig) -> anyhow::Result<StormResult> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(workers) = config.workers {
        builder.worker_threads(workers);
    }
    builder.build()?.block_on(storm(config))
}

async fn storm(config: &StormConfig) -> anyhow::Result<StormResult> {
    let scratch = tempfile::tempdir()?;
    let cocoon_root = scratch.path().join("cocoon-root");
    std::fs::create_dir(&cocoon_root)?;
    let started = Instant::now();
    let planner = Arc::new(cases::planner(&cocoon_root, config.cache_dir.clone())?);
    let planner_ms = ms(started.elapsed());

    let pods = MemoryPods::new();
    let mut runner = BenchCocoonBuilder::default();
    let mut failed_first = 0;
    for i in 0..config.fixups {
        let case = Case::cycle(i);
        pods.insert(case.pod(i));
        let fail_first = config.fail_first_every > 0 && i % config.fail_first_every == 0;
        failed_first += usize::from(fail_first);
        runner.vm(case.vm_id(i), case.inspect_json(i), fail_first);
    }
    let cocoon = runner.build(config.exec_delay);
    let leases = Arc::new(LeaseWatcher::new(
        scratch.path().join("leases.json"),
        DEFAULT_LEASE_POLL,
    )?);
    let host_config = HostConfig {
        retry: RetryConfig {
            interval: config.retry_interval,
            ..RetryConfig::default()
        },
        ready: ReadyConfig::default(),
        ..HostConfig::default()
    };
    let host = Arc::new(Host::new(
        planner,
        cocoon.clone(),
        pods.clone(),
        leases,
        host_config,
        Arc::new(Metrics::new()),
    ));
    let shutdown = CancellationToken::new();

    let rss_before_kib = process::rss_kib();
    let cpu_before = process::cpu_time();
    let started = Instant::now();
    let tasks: Vec<_> = (0..config.fixups)
        .map(|i| {
            let host = host.clone();
            let shutdown = shutdown.clone();
            let name = Case::cycle(i).pod_name(i);
            tokio::spawn(async move {
                host.handle(NAMESPACE, &name, Trigger::Event, &shutdown)
                    .await
            })
        })
        .collect();
    let mut summaries = Vec::with_capacity(tasks.len());
    for task in tasks {
        summaries.push(task.await??);
    }
    let wall = started.elapsed();
    let cpu = process::cpu_time().saturating_sub(cpu_before);
    let rss_after_kib = process::rss_kib();

    for (i, summary) in summaries.iter().enumerate() {
        let case = Case::cycle(i);
        anyhow::ensure!(
            summary.fixup == Some("done") && summary.is_ready(),
            "storm pod {i} did not end done and ready: {summary:?}"
        );
        let expected_attempts = if i % config.fail_first_every.max(1) == 0 {
            2
        } else {
            1
        };
        anyhow::ensure!(
            config.fail_first_every == 0 || summary.attempts == expected_attempts,
            "storm pod {i} took {} attempts, expected {expected_attempts}",
            summary.attempts
        );
        let ip = pods
            .annotations(NAMESPACE, &case.pod_name(i))
            .and_then(|a| a.get(keys::IP).cloned());
        anyhow::ensure!(
            ip == Some(case.address(i).to_string()),
            "storm pod {i} published {ip:?}"
        );
    }
    Ok(StormResult {
        fixups: config.fixups,
        exec_delay_ms: ms(config.exec_delay),
        retry_interval_ms: ms(config.retry_interval),
        failed_first,
        attempts: cocoon.attempts(),
        wall_ms: ms(wall),
        cpu_ms: ms(cpu),
        cpu_per_fixup_us: cpu.as_secs_f64() * 1e6 / config.fixups.max(1) as f64,
        rss_before_kib,
        rss_after_kib,
        peak_rss_kib: process::peak_rss_kib(),
        planner_ms,
        cache: config.cache_dir.is_some(),
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small storm ends with every flow done and ready, and the retries
    /// where they were asked for (no timing is checked).
    #[test]
    fn small_storm_completes() {
        let result = run(&StormConfig {
            fixups: 20,
            exec_delay: Duration::from_millis(1),
            retry_interval: Duration::from_millis(5),
            ..StormConfig::default()
        })
        .unwrap();
        assert_eq!(result.failed_first, 4);
        assert_eq!(result.attempts, 24);
    }
}
