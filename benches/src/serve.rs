//! `serve` with many pods on the node: the watch, the dispatcher and the
//! metrics, against the fake API server in [`crate::standins`].
//!
//! The node has `pods` pods that need nothing (not managed by a stack) and
//! one marker pod. The run, in this process (the stand-ins in a child):
//!
//! 1. the idle daemon: the planner (every plugin linked), the runtime, the
//!    `kube` client and the host built, nothing watched yet;
//! 2. `serve::run` starts: the watcher lists every pod on the node and
//!    offers each to the dispatcher, then opens its watch; the marker is
//!    then made a clone that needs a fixup, so when its fixup has written
//!    `done` and its IP, every pod listed before it was looked at;
//! 3. `events` of the idle pods change (one `MODIFIED` watch event each),
//!    then the marker needs a fixup again; when its fixup is written, every
//!    event was handled. CPU time over this phase, per event, is the cost of
//!    a watch event for a pod that needs nothing.
//!
//! Resident memory is read after each phase; the marker's own fixups are a
//! rounding error in it. The CPU time includes the bench's own polling of
//! the stand-ins (`GET /bench/state` every 5 ms, a few dozen requests over
//! the phase) and the marker's fixup: both small next to 10,000 events.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fixup_core::decision::{ReadyConfig, RetryConfig};
use fixup_host::host::{Host, HostConfig};
use fixup_host::kube::{KubeApi, REPORTER};
use fixup_host::metrics::Metrics;
use fixup_host::ready::{DEFAULT_LEASE_POLL, LeaseWatcher};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::cases;
use crate::process;
use crate::standins::{NODE, Observed, Place, RemoteCocoon, Standins, StandinsConfig};

/// How the run is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeConfig {
    /// Pods on the node that need nothing (10 000).
    pub pods: usize,
    /// Watch events in phase 3 (every idle pod changes once: 10 000).
    pub events: usize,
    pub cache_dir: Option<std::path::PathBuf>,
    pub place: Place,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            pods: 10_000,
            events: 10_000,
            cache_dir: None,
            place: Place::Process,
        }
    }
}

/// What the run cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServeResult {
    pub pods: usize,
    pub events: usize,
    /// The idle daemon before the watch starts.
    pub rss_idle_kib: u64,
    /// After the first listing was handled.
    pub rss_listed_kib: u64,
    /// After the watch events were handled.
    pub rss_after_events_kib: u64,
    pub peak_rss_kib: u64,
    /// From `serve::run` starting to the listing handled (the marker's
    /// fixup included).
    pub list_ms: f64,
    /// CPU time of the listing phase, all threads.
    pub list_cpu_ms: f64,
    /// From the first change to the last event handled.
    pub events_ms: f64,
    pub events_cpu_ms: f64,
    pub cpu_per_event_us: f64,
    /// Requests the fake API server answered in all, and patches among
    /// them (the marker's only).
    pub api_requests: u64,
    pub api_patches: u64,
    /// The stand-ins' own resident memory at the end (not the host's).
    pub standins_rss_kib: u64,
}

/// Run it on a runtime of its own.
pub fn run(config: &ServeConfig) -> anyhow::Result<ServeResult> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(serve(config))
}

async fn serve(config: &ServeConfig) -> anyhow::Result<ServeResult> {
    let scratch = tempfile::tempdir()?;
    let standins = Standins::start(
        &StandinsConfig {
            fixups: 0,
            idle: config.pods,
            exec_delay_ms: 1,
            fail_first_every: 0,
        },
        config.place,
    )?;
    let planner = cases::planner(scratch.path(), config.cache_dir.clone())?;
    let client = standins.client()?;
    let host = Arc::new(Host::new(
        Arc::new(planner),
        RemoteCocoon::new(&standins.ready.socket),
        KubeApi::new(client.clone(), REPORTER, Some(NODE.to_owned())),
        Arc::new(LeaseWatcher::new(
            scratch.path().join("leases.json"),
            DEFAULT_LEASE_POLL,
        )?),
        HostConfig {
            retry: RetryConfig {
                interval: Duration::from_millis(100),
                ..RetryConfig::default()
            },
            ready: ReadyConfig::default(),
            // The node's clones are new pods: no wake grace (the events
            // are still listed, one request a pod).
            wake: fixup_core::decision::WakeConfig {
                grace: Duration::ZERO,
                ..Default::default()
            },
            // `serve`'s default `--concurrency`: the pods holding a turn.
            fixups_in_flight: fixup_host::config::DEFAULT_CONCURRENCY,
            ..HostConfig::default()
        },
        Arc::new(Metrics::new()),
    ));
    let rss_idle_kib = process::rss_kib();

    let shutdown = CancellationToken::new();
    let cpu = process::cpu_time();
    let started = Instant::now();
    let daemon = tokio::spawn({
        let client = client.clone();
        let host = host.clone();
        let shutdown = shutdown.clone();
        async move {
            fixup_host::serve::run(client, NODE, host, shutdown).await;
        }
    });
    // The fake API server streams changes only to watches open when they
    // happen (it keeps no history to replay): the marker changes once the
    // listing is done and the watch is open.
    watch_open(&standins, &client).await?;
    standins.touch(&client, 0).await?;
    let listed = marker_written(&standins, &client, 0).await?;
    let list_ms = ms(started.elapsed());
    let list_cpu_ms = ms(process::cpu_time().saturating_sub(cpu));
    let rss_listed_kib = process::rss_kib();

    let cpu = process::cpu_time();
    let started = Instant::now();
    standins.touch(&client, config.events).await?;
    let observed = marker_written(&standins, &client, listed.patches).await?;
    let events_ms = ms(started.elapsed());
    let events_cpu = process::cpu_time().saturating_sub(cpu);
    let rss_after_events_kib = process::rss_kib();
    let peak_rss_kib = process::peak_rss_kib();
    anyhow::ensure!(
        observed.unexpected.is_empty(),
        "the host asked the fake API server for what it does not serve: {:?}",
        observed.unexpected
    );
    shutdown.cancel();
    daemon.await?;
    Ok(ServeResult {
        pods: config.pods,
        events: config.events,
        rss_idle_kib,
        rss_listed_kib,
        rss_after_events_kib,
        peak_rss_kib,
        list_ms,
        list_cpu_ms,
        events_ms,
        events_cpu_ms: ms(events_cpu),
        cpu_per_event_us: events_cpu.as_secs_f64() * 1e6 / (config.events + 1) as f64,
        api_requests: observed.requests,
        api_patches: observed.patches,
        standins_rss_kib: standins.rss_kib(),
    })
}

/// Wait until the host's watch is open.
async fn watch_open(standins: &Standins, client: &kube::Client) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while standins.observed(client, false).await?.watchers == 0 {
        anyhow::ensure!(Instant::now() < deadline, "the host never opened a watch");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// Wait until the marker's fixup has written its two patches (`running`,
/// then `done` with the IP and `ready`: its first NIC is static) after
/// `patches_before` patches in all: no other pod is ever patched.
async fn marker_written(
    standins: &Standins,
    client: &kube::Client,
    patches_before: u64,
) -> anyhow::Result<Observed> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let observed = standins.observed(client, false).await?;
        if observed.patches >= patches_before + 2 {
            return Ok(observed);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the marker pod was not fixed within 120 s: {observed:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small node: the listing and the events are handled, and only the
    /// marker is ever patched (no timing is checked).
    #[test]
    fn small_node_is_served() {
        let result = run(&ServeConfig {
            pods: 50,
            events: 50,
            cache_dir: None,
            place: Place::Thread,
        })
        .unwrap();
        // The marker's two fixups, two patches each: no idle pod was
        // written.
        assert_eq!(result.api_patches, 4, "{result:?}");
    }
}
