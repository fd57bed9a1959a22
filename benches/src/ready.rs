//! Readiness reaction: from a lease appearing in the lease file to the
//! ready intent being published.
//!
//! Each run starts `Host::handle` on a fresh all-DHCP Linux clone (no fixup
//! is needed, so the flow goes straight to the IP wait on the process's one
//! shared `LeaseWatcher`), waits a few milliseconds (varied, so the write
//! does not line up with the 200 ms safety-net poll), then writes the lease
//! file the way cocoon-net does: a new file renamed over the old one. The
//! clock starts just before the rename and stops when the
//! `vm.cocoonstack.io/ip` patch reaches the pod store ([`TimedPods`] records
//! that instant, then applies it to `MemoryPods`).

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fixup_core::decision::ReadyConfig as HostReadyConfig;
use fixup_core::decision::Trigger;
use fixup_core::facts::PodInput;
use fixup_host::host::{Host, HostConfig};
use fixup_host::metrics::Metrics;
use fixup_host::pods::{AnnotationPatch, Event, MemoryPods, PodApi, PodError, PodRef, keys};
use fixup_host::ready::{DEFAULT_LEASE_POLL, LeaseWatcher};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::cases::{self, Case, NAMESPACE};
use crate::cocoon::BenchCocoonBuilder;
use crate::report::percentile;

/// `MemoryPods` that notes when each pod's IP patch arrived.
#[derive(Debug, Clone, Default)]
pub struct TimedPods {
    pub inner: MemoryPods,
    published: Arc<Mutex<HashMap<String, Instant>>>,
}

impl TimedPods {
    /// When the IP of pod `name` was published.
    pub fn published(&self, name: &str) -> Option<Instant> {
        self.published.lock().expect("lock").get(name).copied()
    }
}

impl PodApi for TimedPods {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<PodInput>, PodError> {
        self.inner.get(namespace, name).await
    }

    async fn patch_annotations(
        &self,
        pod: &PodRef,
        patch: &AnnotationPatch,
    ) -> Result<(), PodError> {
        self.inner.patch_annotations(pod, patch).await?;
        if patch.contains_key(keys::IP) {
            let at = Instant::now();
            self.published
                .lock()
                .expect("lock")
                .insert(pod.name.clone(), at);
        }
        Ok(())
    }

    async fn event(&self, pod: &PodRef, event: &Event) -> Result<(), PodError> {
        self.inner.event(pod, event).await
    }
}

/// How the runs are set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyRunConfig {
    pub runs: usize,
    /// The lease file's safety-net poll (default 200 ms).
    pub poll: Duration,
    pub cache_dir: Option<PathBuf>,
}

impl Default for ReadyRunConfig {
    fn default() -> Self {
        ReadyRunConfig {
            runs: 200,
            poll: DEFAULT_LEASE_POLL,
            cache_dir: None,
        }
    }
}

/// Lease-to-ready latencies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadyResult {
    pub runs: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub min_ms: f64,
    /// Whether file events were arriving (else only the poll saw leases).
    pub watching: bool,
    pub poll_ms: f64,
}

/// Run the readiness measurement on a runtime of its own.
pub fn run(config: &ReadyRunConfig) -> anyhow::Result<ReadyResult> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(measure(config))
}

/// A readiness pod: an all-DHCP Linux clone on Cloud Hypervisor.
fn pod(i: usize) -> (PodInput, String, String) {
    let mut pod = Case::OciNetworkd.pod(i);
    pod.name = format!("ready-{i}");
    let vm_name = fixup_core::binding::vm_name_for_pod(&pod.namespace, &pod.name);
    pod.annotations
        .insert("vm.cocoonstack.io/name".to_owned(), vm_name.clone());
    let id = format!("vm-ready{i:06}");
    pod.annotations
        .insert("vm.cocoonstack.io/id".to_owned(), id.clone());
    pod.uid = Some(format!("00000000-0000-4000-9000-{i:012}"));
    let mac = cases::mac(Case::OciNetworkd, i, 2);
    let inspect =
        serde_json::json!({"id": id, "config": {"name": vm_name}, "network_configs": [{"mac": mac, "tap": "tap0"}]})
            .to_string();
    (pod, id, inspect)
}

fn lease_ip(i: usize) -> String {
    format!("10.89.{}.{}", i / 250, i % 250 + 2)
}

/// Write `rows` to `path` as cocoon-net does: a new file, renamed over the
/// old one. Returns the instant just before the rename.
fn write_leases(path: &Path, rows: &[serde_json::Value]) -> anyhow::Result<Instant> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(serde_json::to_string(rows)?.as_bytes())?;
    tmp.flush()?;
    let at = Instant::now();
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(at)
}

async fn measure(config: &ReadyRunConfig) -> anyhow::Result<ReadyResult> {
    let scratch = tempfile::tempdir()?;
    let cocoon_root = scratch.path().join("cocoon-root");
    std::fs::create_dir(&cocoon_root)?;
    let lease_dir = scratch.path().join("net");
    std::fs::create_dir(&lease_dir)?;
    let lease_file = lease_dir.join("leases.json");
    write_leases(&lease_file, &[])?;

    let planner = Arc::new(cases::planner(&cocoon_root, config.cache_dir.clone())?);
    let pods = TimedPods::default();
    let mut runner = BenchCocoonBuilder::default();
    let mut macs = Vec::with_capacity(config.runs);
    for i in 0..config.runs {
        let (pod, id, inspect) = pod(i);
        pods.inner.insert(pod);
        runner.vm(id, inspect, false);
        macs.push(cases::mac(Case::OciNetworkd, i, 2));
    }
    let leases = Arc::new(LeaseWatcher::new(lease_file.clone(), config.poll)?);
    let host = Arc::new(Host::new(
        planner,
        runner.build(Duration::from_millis(1)),
        pods.clone(),
        leases.clone(),
        HostConfig {
            ready: HostReadyConfig::default(),
            ..HostConfig::default()
        },
        Arc::new(Metrics::new()),
    ));
    let shutdown = CancellationToken::new();
    let mut rows = Vec::new();
    let mut samples = Vec::with_capacity(config.runs);
    let mut watching = true;
    for (i, mac) in macs.iter().enumerate() {
        let name = format!("ready-{i}");
        let flow = {
            let host = host.clone();
            let shutdown = shutdown.clone();
            let name = name.clone();
            tokio::spawn(async move {
                host.handle(NAMESPACE, &name, Trigger::Event, &shutdown)
                    .await
            })
        };
        // 5..=24 ms, varied so the rename lands anywhere in the poll period.
        tokio::time::sleep(Duration::from_millis(5 + (i as u64 * 7) % 20)).await;
        watching &= leases.is_watching();
        rows.push(serde_json::json!({
            "mac": mac, "ip": lease_ip(i), "expiry": "2099-01-01T00:00:00Z",
        }));
        let written = write_leases(&lease_file, &rows)?;
        let summary = flow.await??;
        anyhow::ensure!(
            summary.is_ready() && summary.ip.as_deref() == Some(lease_ip(i).as_str()),
            "readiness pod {i} did not end ready with its lease: {summary:?}"
        );
        let published = pods
            .published(&name)
            .ok_or_else(|| anyhow::anyhow!("no IP patch recorded for {name}"))?;
        samples.push(published.saturating_duration_since(written));
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    samples.sort();
    Ok(ReadyResult {
        runs: samples.len(),
        p50_ms: ms(percentile(&samples, 50.0)),
        p90_ms: ms(percentile(&samples, 90.0)),
        p99_ms: ms(percentile(&samples, 99.0)),
        max_ms: ms(*samples.last().unwrap_or(&Duration::ZERO)),
        min_ms: ms(*samples.first().unwrap_or(&Duration::ZERO)),
        watching,
        poll_ms: ms(config.poll),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A few runs end ready with the written lease (no timing is checked).
    #[test]
    fn a_few_runs_end_ready() {
        let result = run(&ReadyRunConfig {
            runs: 3,
            ..ReadyRunConfig::default()
        })
        .unwrap();
        assert_eq!(result.runs, 3);
        assert!(result.min_ms <= result.p50_ms && result.p50_ms <= result.max_ms);
    }
}
