//! The daemon's side of the host's per-pod records (spec section 2's
//! durable record, [`fixup_core::memory`]): every read and write of the
//! state directory runs off the async threads and is bounded by
//! [`RECORD_IO_TIMEOUT`], so a state directory on a hung file system never
//! stalls the work; what fails is logged, and the work goes on without it.

use std::sync::Arc;
use std::time::Duration;

use fixup_core::facts::PodInput;
use fixup_core::memory::{MemoryStore, PodMemory, StoreError};
use tokio::sync::mpsc;

/// The longest a task waits for its pod's record to be read or kept.
pub(crate) const RECORD_IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Observations of the watch waiting to be noted, at most: past it the
/// state directory is far behind, and further ones are dropped (logged).
const OBSERVATIONS_QUEUED: usize = 10_000;

/// Run `io` on the blocking pool, bounded by [`RECORD_IO_TIMEOUT`]; `None`
/// when it failed or took too long (logged as `what` for `pod`).
async fn bounded<T: Send + 'static>(
    store: &Arc<MemoryStore>,
    pod: &str,
    what: &'static str,
    io: impl FnOnce(&MemoryStore) -> Result<T, StoreError> + Send + 'static,
) -> Option<T> {
    let store = Arc::clone(store);
    let work = tokio::task::spawn_blocking(move || io(&store));
    match tokio::time::timeout(RECORD_IO_TIMEOUT, work).await {
        Ok(Ok(Ok(value))) => Some(value),
        Ok(Ok(Err(e))) => {
            tracing::warn!(pod, "{what}: {e}");
            None
        }
        Ok(Err(e)) => {
            tracing::warn!(pod, "{what}: {e}");
            None
        }
        Err(_) => {
            tracing::warn!(
                pod,
                "{what}: took longer than {RECORD_IO_TIMEOUT:?}; the work goes on without it (check the file system of the state directory)"
            );
            None
        }
    }
}

/// The record of pod `uid` for its task: a new one when there is none or
/// it cannot be read (logged).
pub(crate) async fn recall(store: &Arc<MemoryStore>, pod: &str, uid: &str) -> PodMemory {
    let uid = uid.to_owned();
    bounded(store, pod, "the pod's record is not used", move |store| {
        store.recall(&uid)
    })
    .await
    .unwrap_or_default()
}

/// Keep what the pod's task changed in its record.
pub(crate) async fn keep(store: &Arc<MemoryStore>, pod: &str, uid: &str, record: PodMemory) {
    let uid = uid.to_owned();
    bounded(
        store,
        pod,
        "the pod's record was not kept (a retry or restart may give its fixup loop a whole budget again, or reach its wake verdict again)",
        move |store| store.keep_task(&uid, &record),
    )
    .await;
}

/// Notes what the watch sees of each pod in its record (hibernate
/// history, spec section 2), in the order seen, on one blocking thread.
#[derive(Debug, Clone)]
pub(crate) struct Observer {
    queue: mpsc::Sender<(PodInput, bool)>,
}

impl Observer {
    /// Start the thread that notes observations in `store`.
    pub(crate) fn start(store: Arc<MemoryStore>) -> Observer {
        let (queue, mut seen) = mpsc::channel::<(PodInput, bool)>(OBSERVATIONS_QUEUED);
        tokio::task::spawn_blocking(move || {
            while let Some((pod, live)) = seen.blocking_recv() {
                if let Err(e) = store.observe(&pod, live) {
                    tracing::warn!(
                        pod = %pod.display_name(),
                        "the pod's hibernate history was not noted: {e}"
                    );
                }
            }
        });
        Observer { queue }
    }

    /// Note `pod` as seen (`live`: a watch event with no gap before it).
    pub(crate) fn observe(&self, pod: &PodInput, live: bool) {
        if let Err(e) = self.queue.try_send((pod.clone(), live)) {
            tracing::warn!(
                pod = %pod.display_name(),
                "the pod's hibernate history was not noted ({e}): the state directory is far behind"
            );
        }
    }
}
