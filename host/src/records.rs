//! The daemon's side of the host's per-pod records (spec section 2's
//! durable record, [`fixup_core::memory`]): every read and write of the
//! state directory runs off the async threads and is bounded by
//! [`RECORD_IO_TIMEOUT`], so a state directory on a hung file system never
//! stalls the work; what fails is logged, and the work goes on without it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fixup_core::facts::PodInput;
use fixup_core::memory::{MemoryStore, PodMemory, StoreError};
use tokio::sync::mpsc;

use crate::metrics::Metrics;

/// The longest a task waits for its pod's record to be read or kept.
pub(crate) const RECORD_IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Observations of the watch waiting to be noted, at most: past it the
/// state directory is far behind, and further ones are dropped (logged).
const OBSERVATIONS_QUEUED: usize = 10_000;

/// Run `io` on the blocking pool, bounded by [`RECORD_IO_TIMEOUT`]; `None`
/// when it failed or took too long (logged as `what` for `pod`, counted
/// as a record error of `op`).
async fn bounded<T: Send + 'static>(
    store: &Arc<MemoryStore>,
    metrics: &Metrics,
    pod: &str,
    (op, what): (&'static str, &'static str),
    io: impl FnOnce(&MemoryStore) -> Result<T, StoreError> + Send + 'static,
) -> Option<T> {
    let store = Arc::clone(store);
    let work = tokio::task::spawn_blocking(move || io(&store));
    let failed = match tokio::time::timeout(RECORD_IO_TIMEOUT, work).await {
        Ok(Ok(Ok(value))) => return Some(value),
        Ok(Ok(Err(e))) => e.to_string(),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!(
            "took longer than {RECORD_IO_TIMEOUT:?}; the work goes on without it (check the file system of the state directory)"
        ),
    };
    tracing::warn!(pod, "{what}: {failed}");
    metrics.record_error(op);
    None
}

/// The record of pod `uid` for its task: a new one when there is none or
/// it cannot be read (logged).
pub(crate) async fn recall(
    store: &Arc<MemoryStore>,
    metrics: &Metrics,
    pod: &str,
    uid: &str,
) -> PodMemory {
    let uid = uid.to_owned();
    bounded(
        store,
        metrics,
        pod,
        ("recall", "the pod's record is not used"),
        move |store| store.recall(&uid),
    )
    .await
    .unwrap_or_default()
}

/// Keep what the pod's task changed in its record.
pub(crate) async fn keep(
    store: &Arc<MemoryStore>,
    metrics: &Metrics,
    pod: &str,
    uid: &str,
    record: PodMemory,
) {
    let uid = uid.to_owned();
    bounded(
        store,
        metrics,
        pod,
        (
            "keep",
            "the pod's record was not kept (a retry or restart may give its fixup loop a whole budget again, or reach its wake verdict again)",
        ),
        move |store| store.keep_task(&uid, &record),
    )
    .await;
}

/// Notes what the watch sees of each pod in its record (hibernate
/// history, spec section 2), in the order seen, on one blocking thread.
#[derive(Debug, Clone)]
pub(crate) struct Observer {
    store: Arc<MemoryStore>,
    metrics: Arc<Metrics>,
    queue: mpsc::Sender<(PodInput, bool)>,
    dropped: Arc<AtomicU64>,
}

/// The longest annotation value an observation keeps: the values it reads
/// (a VM id, `hibernate`, the lifecycle) are short; a longer one matches
/// none of them, and is kept as a value that matches nothing.
const OBSERVED_VALUE_MAX: usize = 256;

/// The annotations the hibernate history reads, and nothing else, so a
/// queued observation is small whatever the pod carries.
fn observed(pod: &PodInput) -> PodInput {
    let annotations = [
        fixup_core::facts::annotations::VM_ID,
        fixup_core::facts::annotations::HIBERNATE,
        fixup_core::annotations::keys::LIFECYCLE_STATE,
    ]
    .into_iter()
    .filter_map(|key| {
        let value = pod.annotations.get(key)?;
        let value = if value.len() > OBSERVED_VALUE_MAX {
            "\u{fffd}".to_owned()
        } else {
            value.clone()
        };
        Some((key.to_owned(), value))
    })
    .collect();
    PodInput {
        name: pod.name.clone(),
        namespace: pod.namespace.clone(),
        uid: pod.uid.clone(),
        annotations,
        deleting: pod.deleting,
        resource_version: None,
    }
}

impl Observer {
    /// Start the thread that notes observations in `store`.
    pub(crate) fn start(store: Arc<MemoryStore>, metrics: Arc<Metrics>) -> Observer {
        let (queue, mut seen) = mpsc::channel::<(PodInput, bool)>(OBSERVATIONS_QUEUED);
        let noting = Arc::clone(&store);
        let counting = Arc::clone(&metrics);
        tokio::task::spawn_blocking(move || {
            while let Some((pod, live)) = seen.blocking_recv() {
                if let Err(e) = noting.observe(&pod, live) {
                    tracing::warn!(
                        pod = %pod.display_name(),
                        "the pod's hibernate history was not noted: {e}"
                    );
                    counting.record_error("observe");
                    // What was missed is unknown: a gap.
                    if let Some(uid) = pod.uid.as_deref() {
                        noting.gap(uid);
                    }
                }
            }
        });
        Observer {
            store,
            metrics,
            queue,
            dropped: Arc::default(),
        }
    }

    /// Note `pod` as seen (`live`: a watch event with no gap before it).
    /// When the state directory is so far behind that the queue is full,
    /// the observation is dropped and the pod's watch has a gap (its CH
    /// Windows VM waits the wake grace); the first drop and every 1000th
    /// after it are logged.
    pub(crate) fn observe(&self, pod: &PodInput, live: bool) {
        if self.queue.try_send((observed(pod), live)).is_err() {
            if let Some(uid) = pod.uid.as_deref() {
                self.store.gap(uid);
            }
            self.metrics.record_error("dropped");
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed);
            if dropped.is_multiple_of(1000) {
                tracing::warn!(
                    pod = %pod.display_name(),
                    dropped = dropped + 1,
                    "the hibernate history is {OBSERVATIONS_QUEUED} observations behind (the state directory is slow): this one is dropped, and the pod's watch counts as having a gap"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A record the store will not trust is not used, and is counted.
    #[tokio::test]
    async fn a_record_that_cannot_be_used_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::open(dir.path()).unwrap());
        let file = dir.path().join("u-1.json");
        std::fs::write(&file, b"{\"version\": 1}").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        let metrics = Metrics::new();
        let record = recall(&store, &metrics, "prod/demo-1", "u-1").await;
        assert_eq!(
            record.to_json().unwrap(),
            PodMemory::new().to_json().unwrap()
        );
        let text = metrics.encode();
        assert!(
            text.contains("cocoon_fixup_record_errors_total{op=\"recall\"} 1"),
            "{text}"
        );
        // A usable record is no error.
        std::fs::remove_file(&file).unwrap();
        recall(&store, &metrics, "prod/demo-1", "u-1").await;
        assert!(metrics.encode().contains("{op=\"recall\"} 1\n"));
    }
}
