//! The clone storm: many fixup flows at once through the real loop.
//!
//! Every flow is `Host::handle` on its own pod: read the pod, inspect the
//! VM, classify, plan (a fresh sandbox per plugin call), write
//! `post-clone-state=running`, exec, wait the retry interval where the first
//! attempt failed, try again, write `done`, record the event, and publish
//! the IP (static first NICs, so readiness is immediate). The pods cycle
//! through the four [`Case`]s.
//!
//! The host talks to [`crate::standins`] as a daemon talks to the real
//! ones: the real `kube` client ([`KubeApi`]) over loopback to the fake API
//! server, and a request per exec or inspect to the runner, which answers
//! after a delay and fails the first attempt of every fifth VM. The
//! stand-ins run in a child process, so the pods, their events and the
//! runner's records are not in the measured process; their memory is
//! reported apart.
//!
//! Windows VMs with a static NIC also get the serial-console pass; its
//! console answers at once, in process ([`InstantConsole`]): the console
//! client itself is tested in `fixup-sac`.
//!
//! Run it in a process of its own ([`crate::report`] does) so CPU time and
//! peak memory are the storm's and not a benchmark harness's.

use fixup_core::decision::FixupEnd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fixup_core::decision::Trigger;
use fixup_core::decision::{ReadyConfig, RetryConfig};
use fixup_host::console::{Console, ConsoleSession};
use fixup_host::host::{Host, HostConfig};
use fixup_host::kube::{KubeApi, REPORTER};
use fixup_host::metrics::Metrics;
use fixup_host::pods::{Event, PodApi, PodRef, keys, reasons};
use fixup_host::ready::{DEFAULT_LEASE_POLL, LeaseWatcher};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::cases::{self, Case, NAMESPACE};
use crate::process;
use crate::standins::{Place, RemoteCocoon, Standins, StandinsConfig};

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
    /// Where the stand-ins run: a child process to measure, a thread in
    /// tests.
    pub place: Place,
    /// [`HostConfig::fixups_in_flight`] (the host's default).
    pub fixups_in_flight: usize,
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
            place: Place::Process,
            fixups_in_flight: fixup_host::host::DEFAULT_FIXUPS_IN_FLIGHT,
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
    /// Of `cpu_ms`, the kernel's (system time): mostly the TCP of the API
    /// requests and the runner's socket.
    #[serde(default)]
    pub system_cpu_ms: f64,
    /// Resident memory with the planner, runtime and client set up, before
    /// the storm.
    pub rss_before_kib: u64,
    /// Resident memory after the storm.
    pub rss_after_kib: u64,
    /// The process's peak resident memory (`VmHWM`) from the start of the
    /// storm (reset then: setup not included).
    pub peak_rss_kib: u64,
    /// Time to build the planner (the four built-ins) in this process.
    pub planner_ms: f64,
    pub cache: bool,
    /// The peak above the idle process, per flow: what a flow in flight
    /// costs the host.
    pub bytes_per_flow: f64,
    /// Requests the fake API server answered, and of those, patches,
    /// events posted, listings of a pod's events (the wake rule) and
    /// patches refused as conflicts.
    pub api_requests: u64,
    pub api_patches: u64,
    pub api_events: u64,
    #[serde(default)]
    pub api_event_lists: u64,
    #[serde(default)]
    pub api_conflicts: u64,
    /// The stand-ins' own resident memory after the storm (not the host's).
    pub standins_rss_kib: u64,
    /// The most execs the runner saw running at once.
    pub most_execs_at_once: u64,
    /// After the storm, through the same client: one GET of each storm
    /// pod, and one event about each, all started at once like the flows;
    /// the host's CPU time per request. What the requests of a fixup cost
    /// at the least.
    pub cpu_per_get_us: f64,
    pub cpu_per_event_us: f64,
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
    // Every plugin linked before the first pod, as the daemon does.
    let planner = Arc::new(cases::planner(&cocoon_root, config.cache_dir.clone())?);
    let planner_ms = ms(started.elapsed());

    let standins = Standins::start(
        &StandinsConfig {
            fixups: config.fixups,
            idle: 0,
            exec_delay_ms: u64::try_from(config.exec_delay.as_millis()).unwrap_or(u64::MAX),
            fail_first_every: config.fail_first_every,
        },
        config.place,
    )?;
    let failed_first = (0..config.fixups)
        .filter(|i| config.fail_first_every > 0 && i % config.fail_first_every == 0)
        .count();
    let client = standins.client()?;
    let pods = KubeApi::new(
        client.clone(),
        REPORTER,
        Some(crate::standins::NODE.to_owned()),
    );
    let requests = pods.clone();
    let cocoon = RemoteCocoon::new(&standins.ready.socket);
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
        // The storm's clones are new pods: the Windows ones are not held
        // for the wake grace (the events are still listed, one request a
        // pod, as on a node).
        wake: fixup_core::decision::WakeConfig {
            grace: std::time::Duration::ZERO,
            ..Default::default()
        },
        fixups_in_flight: config.fixups_in_flight,
        ..HostConfig::default()
    };
    let host = Arc::new(
        Host::new(
            planner,
            cocoon,
            pods,
            leases,
            host_config,
            Arc::new(Metrics::new()),
        )
        .with_console(Arc::new(InstantConsole)),
    );
    let shutdown = CancellationToken::new();

    // The peak from here on is the storm's, not the set-up's (compiling
    // the plugins when there is no cache peaks higher).
    process::reset_peak_rss();
    let rss_before_kib = process::rss_kib();
    let cpu_before = process::cpu_time();
    let system_before = process::system_cpu_time();
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
    let system = process::system_cpu_time().saturating_sub(system_before);
    let rss_after_kib = process::rss_kib();
    let peak_rss_kib = process::peak_rss_kib();
    // The heap profile of the storm alone: the checks below read every pod
    // back and price the requests with as many tasks again, and their peak
    // would be the profile's.
    #[cfg(feature = "dhat-heap")]
    if std::env::var_os("FIXUP_BENCH_STORM_ONLY").is_some() {
        anyhow::bail!(
            "stopped after the storm (FIXUP_BENCH_STORM_ONLY): peak {peak_rss_kib} KiB, {rss_before_kib} KiB before it"
        );
    }
    let observed = standins.observed(&client, true).await?;
    anyhow::ensure!(
        observed.unexpected.is_empty(),
        "the host asked the fake API server for what it does not serve: {:?}",
        observed.unexpected
    );

    for (i, summary) in summaries.iter().enumerate() {
        let case = Case::cycle(i);
        anyhow::ensure!(
            summary.fixup == Some(FixupEnd::Done) && summary.is_ready(),
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
        let ip = observed
            .annotations
            .get(&case.pod_name(i))
            .and_then(|a| a.get(keys::IP).cloned());
        anyhow::ensure!(
            ip == Some(case.address(i).to_string()),
            "storm pod {i} published {ip:?}"
        );
    }
    let cpu_per_get_us = cpu_per_request(config.fixups, |i| {
        let pods = requests.clone();
        async move {
            let name = Case::cycle(i).pod_name(i);
            pods.get(NAMESPACE, &name).await.map(drop)
        }
    })
    .await?;
    let cpu_per_event_us = cpu_per_request(config.fixups, |i| {
        let pods = requests.clone();
        let summary = &summaries[i];
        let pod = PodRef {
            namespace: NAMESPACE.to_owned(),
            name: Case::cycle(i).pod_name(i),
            uid: summary.uid.clone(),
        };
        async move {
            let event = Event::normal(reasons::SUCCEEDED, "kind=oci-networkd attempts=1");
            pods.event(&pod, &event).await
        }
    })
    .await?;
    Ok(StormResult {
        fixups: config.fixups,
        exec_delay_ms: ms(config.exec_delay),
        retry_interval_ms: ms(config.retry_interval),
        failed_first,
        attempts: observed.execs,
        wall_ms: ms(wall),
        cpu_ms: ms(cpu),
        system_cpu_ms: ms(system),
        cpu_per_fixup_us: cpu.as_secs_f64() * 1e6 / config.fixups.max(1) as f64,
        rss_before_kib,
        rss_after_kib,
        peak_rss_kib,
        planner_ms,
        cache: config.cache_dir.is_some(),
        bytes_per_flow: peak_rss_kib.saturating_sub(rss_before_kib) as f64 * 1024.0
            / config.fixups.max(1) as f64,
        api_requests: observed.requests,
        api_patches: observed.patches,
        api_events: observed.events,
        api_event_lists: observed.event_lists,
        api_conflicts: observed.conflicts,
        standins_rss_kib: standins.rss_kib(),
        most_execs_at_once: observed.most_execs_at_once,
        cpu_per_get_us,
        cpu_per_event_us,
    })
}

/// `count` requests (`request(i)`), all started at once as tasks; the
/// process's CPU time per request, microseconds.
async fn cpu_per_request<F, Fut>(count: usize, request: F) -> anyhow::Result<f64>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), fixup_host::pods::PodError>> + Send + 'static,
{
    let cpu_before = process::cpu_time();
    let tasks: Vec<_> = (0..count).map(|i| tokio::spawn(request(i))).collect();
    for task in tasks {
        task.await??;
    }
    let cpu = process::cpu_time().saturating_sub(cpu_before);
    Ok(cpu.as_secs_f64() * 1e6 / count.max(1) as f64)
}

/// The size of what a flow in flight holds, bytes: the whole `Host::handle`
/// future (what each spawned task keeps until it ends) and the pieces it
/// awaits. Futures are built, measured and dropped, never polled.
pub fn future_sizes() -> anyhow::Result<std::collections::BTreeMap<&'static str, usize>> {
    use fixup_host::pods::AnnotationPatch;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let scratch = tempfile::tempdir()?;
        let planner = Arc::new(cases::planner(scratch.path(), None)?);
        let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse()?))?;
        let pods = KubeApi::new(client, REPORTER, None);
        let cocoon = RemoteCocoon::new(&scratch.path().join("sock"));
        let leases = Arc::new(LeaseWatcher::new(
            scratch.path().join("leases.json"),
            DEFAULT_LEASE_POLL,
        )?);
        let host = Host::new(
            planner,
            cocoon.clone(),
            pods.clone(),
            leases,
            HostConfig::default(),
            Arc::new(Metrics::new()),
        );
        let shutdown = CancellationToken::new();
        let pod = PodRef {
            namespace: NAMESPACE.into(),
            name: "p".into(),
            uid: "u".into(),
        };
        let patch = AnnotationPatch::default();
        let vm = fixup_core::facts::VmId::parse("vm-1")?;
        let mut sizes = std::collections::BTreeMap::new();
        sizes.insert(
            "Host::handle",
            std::mem::size_of_val(&host.handle(NAMESPACE, "p", Trigger::Event, &shutdown)),
        );
        sizes.insert(
            "KubeApi::get",
            std::mem::size_of_val(&pods.get(NAMESPACE, "p")),
        );
        sizes.insert(
            "KubeApi::patch_annotations",
            std::mem::size_of_val(&pods.patch_annotations(&pod, &patch)),
        );
        use fixup_host::cocoon::Cocoon;
        sizes.insert(
            "Cocoon::exec (stand-in)",
            std::mem::size_of_val(&cocoon.exec(&vm, &[], Duration::from_secs(1))),
        );
        Ok(sizes)
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
            place: Place::Thread,
            ..StormConfig::default()
        })
        .unwrap();
        assert_eq!(result.failed_first, 4);
        assert_eq!(result.attempts, 24);
        assert!(result.most_execs_at_once > 1, "the flows ran at once");
    }

    /// With room for three pods at once, no more than three execs ever run
    /// at once, and every flow still ends done and ready.
    #[test]
    fn the_host_works_on_at_most_fixups_in_flight_pods_at_once() {
        let result = run(&StormConfig {
            fixups: 20,
            exec_delay: Duration::from_millis(20),
            retry_interval: Duration::from_millis(5),
            place: Place::Thread,
            fixups_in_flight: 3,
            ..StormConfig::default()
        })
        .unwrap();
        assert_eq!(result.attempts, 24);
        assert!(
            (2..=3).contains(&result.most_execs_at_once),
            "at most 3 at once, and more than one: {result:?}"
        );
    }
}

/// A serial console that lists as many interfaces as asked and takes every
/// address at once.
#[derive(Debug)]
pub struct InstantConsole;

impl Console for InstantConsole {
    fn open(
        &self,
        _vm: &fixup_core::facts::VmId,
        need: usize,
        _stop: fixup_sac::StopCheck,
        _deadline: fixup_sac::Deadline,
    ) -> Result<(Vec<u32>, Box<dyn ConsoleSession>), fixup_sac::SacError> {
        let nets = (1..).take(need).collect();
        Ok((nets, Box::new(InstantConsole)))
    }
}

impl ConsoleSession for InstantConsole {
    fn set(
        &mut self,
        _net: u32,
        _nic: &fixup_sac::StaticNic,
        _deadline: fixup_sac::Deadline,
    ) -> Result<(), fixup_sac::SacError> {
        Ok(())
    }
}
