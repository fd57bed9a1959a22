//! [`MemoryStore`]: the state directory that keeps each pod's
//! [`PodMemory`], one file per pod uid (`<uid>.json`), so that the record
//! outlives the host process (spec section 2: "written atomically under
//! the host's state directory, kept across restarts, dropped when the pod
//! is gone").
//!
//! What it promises:
//!
//! - **Trusted.** The directory passes [`TrustedDir`]'s rules (every
//!   directory on its path root's or the host user's, not writable by
//!   others, no link anywhere) and is created 0700 when missing; a record
//!   is read only if it is a regular file the host trusts, never through a
//!   link.
//! - **Atomic.** A record is written to a temporary file in the same
//!   directory (mode 0600), synced, renamed over the old one, and the
//!   directory synced: a reader, a crash or a power loss sees the old
//!   record or the new one, never a mix. Two saves of the same uid at once
//!   leave one of them whole.
//! - **Bounded.** A record is at most [`MAX_RECORD_BYTES`] (16 KiB) on
//!   disk and in memory when read; a pod uid is at most [`MAX_UID_BYTES`]
//!   (64) bytes of `[a-z0-9-]` and never a path; the directory keeps at
//!   most [`MAX_RECORDS`] (10,000, [`MemoryStore::with_max_records`])
//!   records.
//! - **Never trusted blindly.** A record that is corrupt, of another
//!   version or breaks the record's own bounds is logged and treated as
//!   absent ([`PodMemory::from_json`]); an oversize one is removed too.
//!
//! One host process uses a state directory at a time: it is per node, as
//! the host is.

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::ffi::OsString;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::FileType;

use super::{PodMemory, RecordError};
use crate::plugin::trusted::{TrustedDir, Untrusted, euid};

/// Where root keeps the records unless the caller names another
/// directory: beside the cache key (`/var/lib/cocoon-fixup/cache.key`).
/// Another user's default is `cocoon-fixup/state` under
/// `$XDG_STATE_HOME`, else under `~/.local/state` ([`default_state_dir`]).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/cocoon-fixup/state";

/// The most records the directory keeps, by default (one per pod on the
/// node, and a node runs far fewer pods): a bound on the disk a stream of
/// pod uids can take between two [`MemoryStore::retain`] runs. Set with
/// [`MemoryStore::with_max_records`].
pub const MAX_RECORDS: usize = 10_000;

/// The most bytes a record may take on disk. The record's own bounds keep
/// it under 10 KiB ([`PodMemory`]); a larger file is not the host's.
pub const MAX_RECORD_BYTES: usize = 16 * 1024;

/// The most bytes of a pod uid that names a record. Kubernetes writes a
/// 36-byte UUID.
pub const MAX_UID_BYTES: usize = 64;

/// A record's file name is `<uid>` and this.
const RECORD_SUFFIX: &str = ".json";

/// A record file's mode: the host's alone.
const RECORD_MODE: u32 = 0o600;

/// The default state directory for a user `euid` when `var` reads the
/// environment: [`DEFAULT_STATE_DIR`] for root; else
/// `$XDG_STATE_HOME/cocoon-fixup/state`, or
/// `~/.local/state/cocoon-fixup/state`, beside that user's default cache
/// key ([`crate::plugin::cache::default_paths`]). An empty variable counts
/// as unset; `None` when neither is set.
pub fn state_dir_for(euid: u32, var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    if euid == 0 {
        return Some(PathBuf::from(DEFAULT_STATE_DIR));
    }
    let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    set("XDG_STATE_HOME")
        .or_else(|| set("HOME").map(|home| home.join(".local/state")))
        .map(|dir| dir.join("cocoon-fixup").join("state"))
}

/// The default state directory for the user the host runs as
/// ([`state_dir_for`]).
pub fn default_state_dir() -> Option<PathBuf> {
    state_dir_for(euid(), |v| std::env::var_os(v))
}

/// Whether `uid` may name a record: 1 to [`MAX_UID_BYTES`] bytes of
/// `a-z`, `0-9` and `-`. Nothing else is ever made into a file name, so
/// no uid can leave the directory or name a temporary file.
pub fn valid_uid(uid: &str) -> bool {
    (1..=MAX_UID_BYTES).contains(&uid.len())
        && uid
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Why the state directory or a record cannot be used. The caller logs it
/// and goes on: a pod without its record is decided without history,
/// which the grace of spec section 2 covers.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state directory refused: {0}")]
    Dir(Untrusted),
    #[error(
        "pod uid {uid} cannot name a state record: a uid is 1 to {MAX_UID_BYTES} bytes of a-z, 0-9 and '-' (Kubernetes writes a UUID); pass the pod's metadata.uid"
    )]
    BadUid {
        /// The uid, escaped and cut for display.
        uid: String,
    },
    #[error(
        "state record {} is not one the host wrote ({why}), so it is not read: remove it, and the host writes the record anew",
        path.display()
    )]
    Record { path: PathBuf, why: String },
    #[error(
        "cannot {action} {}: {cause}; check that uid {euid} may write the state directory and its file system has room",
        path.display(),
        euid = euid()
    )]
    Io {
        action: &'static str,
        path: PathBuf,
        cause: io::Error,
    },
    #[error(
        "the state record of pod uid {uid} would take {bytes} bytes, over the {MAX_RECORD_BYTES} a record may take, so it is not saved and the pod is decided without its history: this is a bug in cocoon-fixup, please report it"
    )]
    TooLarge { uid: String, bytes: usize },
    #[error(
        "the state directory {} keeps {max} records already, its limit, so pod uid {uid} gets none and is decided without its history: remove the records of pods that are gone from it",
        path.display()
    )]
    Full {
        path: PathBuf,
        uid: String,
        max: usize,
    },
    #[error("pod uid {uid}: {cause}")]
    Encode { uid: String, cause: RecordError },
}

/// How many locks the read-modify-writes of records are spread over.
const UPDATE_LOCKS: usize = 64;

/// The state directory (see the module docs).
#[derive(Debug)]
pub struct MemoryStore {
    dir: TrustedDir,
    max_records: usize,
    /// Saves hold it shared; [`retain`](MemoryStore::retain) holds it
    /// alone, so the temporary files it finds are a crash's leftovers, not
    /// a save in flight.
    writes: RwLock<()>,
    /// Held while a new uid's record is counted and written, so that
    /// concurrent saves of new uids cannot pass the bound together.
    admit: Mutex<()>,
    /// The uids of pods known deleted ([`forget`](MemoryStore::forget)),
    /// oldest first, at most `max_records`: a save for one of them (a task
    /// still winding down) writes nothing, so a deleted pod's record is
    /// not made again. Kubernetes never reuses a uid.
    gone: Mutex<(VecDeque<String>, HashSet<String>)>,
    /// Held across each read-modify-write of a record
    /// ([`observe`](MemoryStore::observe), [`keep_task`](MemoryStore::keep_task)),
    /// so the watch and a pod's task never lose each other's changes: one
    /// of [`UPDATE_LOCKS`] by the uid, so pods do not wait for each other.
    updating: Vec<Mutex<()>>,
    /// The uids the host's watch has seen without a gap since they were
    /// new (kept in memory only: a restart is a gap).
    watched: Mutex<HashSet<String>>,
    /// The uids whose watch had a gap ([`gap`](MemoryStore::gap)): never
    /// watched since new again, even by an observation from before the
    /// gap that is noted after it.
    gapped: Mutex<HashSet<String>>,
}

/// What [`MemoryStore::read`] found.
#[derive(Debug)]
enum Found {
    Absent,
    /// Boxed: a record is much larger than the other answers.
    Record(Box<PodMemory>),
    /// Not a record this host reads: ignored.
    Unusable(RecordError),
    /// Larger than [`MAX_RECORD_BYTES`] (at least this many bytes).
    Oversize(u64),
}

impl MemoryStore {
    /// Open the state directory `dir` ([`DEFAULT_STATE_DIR`] or
    /// [`default_state_dir`] unless the caller names another), creating it
    /// and any missing parent with mode 0700. A directory that breaks
    /// [`TrustedDir`]'s rules is refused, naming the path and the fix.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        Ok(MemoryStore {
            dir: TrustedDir::create(dir).map_err(StoreError::Dir)?,
            max_records: MAX_RECORDS,
            writes: RwLock::new(()),
            admit: Mutex::new(()),
            gone: Mutex::default(),
            updating: (0..UPDATE_LOCKS).map(|_| Mutex::new(())).collect(),
            watched: Mutex::default(),
            gapped: Mutex::default(),
        })
    }

    /// Keep at most `max` records instead of [`MAX_RECORDS`].
    pub fn with_max_records(mut self, max: usize) -> Self {
        self.max_records = max;
        self
    }

    /// The directory's resolved path.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The record of `uid`; `None` when there is none, or when the file is
    /// not a record this host reads (corrupt, another version, out of
    /// bounds: logged as a warning and left for the next save to replace)
    /// or is larger than [`MAX_RECORD_BYTES`] (logged and removed). A
    /// record read is not watched since new: a restart is a gap.
    pub fn load(&self, uid: &str) -> Result<Option<PodMemory>, StoreError> {
        let name = record_name(uid)?;
        match self.read(&name)? {
            Found::Absent => Ok(None),
            Found::Record(memory) => Ok(Some(*memory)),
            Found::Unusable(e) => {
                tracing::warn!(path = %self.path().join(&name).display(), "{e}");
                Ok(None)
            }
            Found::Oversize(bytes) => {
                let path = self.path().join(&name);
                tracing::warn!(
                    path = %path.display(),
                    "the state record takes at least {bytes} bytes, over the {MAX_RECORD_BYTES} a record may take: removed, and written anew at the pod's next change"
                );
                self.dir.remove(&name).map_err(|cause| StoreError::Io {
                    action: "remove",
                    path,
                    cause,
                })?;
                Ok(None)
            }
        }
    }

    /// [`load`](Self::load) for a pod's task: a new record when there is
    /// none, marked watched since new when the host's watch says so.
    pub fn recall(&self, uid: &str) -> Result<PodMemory, StoreError> {
        let mut memory = self.load(uid)?.unwrap_or_default();
        memory.set_watched_since_new(self.is_watched(uid));
        Ok(memory)
    }

    /// The lock of `uid`'s record (see [`MemoryStore::updating`]).
    fn updating(&self, uid: &str) -> std::sync::MutexGuard<'_, ()> {
        let stripe = uid.bytes().fold(0usize, |h, b| {
            h.wrapping_mul(31).wrapping_add(usize::from(b))
        }) % UPDATE_LOCKS;
        self.updating[stripe]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the pod `uid` is known deleted.
    fn is_gone(&self, uid: &str) -> bool {
        self.gone
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .contains(uid)
    }

    /// The watch missed something of `uid` (an observation it could not
    /// note): it no longer counts as watched since new.
    pub fn gap(&self, uid: &str) {
        self.gapped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(uid.to_owned());
        self.watched
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
    }

    fn had_gap(&self, uid: &str) -> bool {
        self.gapped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(uid)
    }

    fn is_watched(&self, uid: &str) -> bool {
        self.watched
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(uid)
    }

    /// The host's watch saw `pod` ([`PodMemory::observe`]; `live`: a watch
    /// event with no gap before it). The record is read, changed and
    /// written under one lock; it is written only when something durable
    /// changed. A pod without a uid, or with one this store refuses, is
    /// not recorded.
    pub fn observe(&self, pod: &crate::facts::PodInput, live: bool) -> Result<(), StoreError> {
        let Some(uid) = pod.uid.as_deref().filter(|uid| !uid.is_empty()) else {
            return Ok(());
        };
        record_name(uid)?;
        let _updating = self.updating(uid);
        // A deleted pod is not noted again (a late event of it).
        if self.is_gone(uid) {
            return Ok(());
        }
        let (mut memory, stored) = match self.load(uid)? {
            Some(memory) => (memory, true),
            None => (PodMemory::new(), false),
        };
        // A pod seen before (a record, or watched since new) is not new
        // to the host: what the watch knows of it carries over.
        let watched = self.is_watched(uid);
        if stored || watched || self.had_gap(uid) {
            memory.set_watched_since_new(watched && !self.had_gap(uid));
        }
        let changed = memory.observe(pod, live);
        {
            let mut watched = self.watched.lock().unwrap_or_else(PoisonError::into_inner);
            if memory.watched_since_new() {
                watched.insert(uid.to_owned());
            } else {
                watched.remove(uid);
            }
        }
        if changed {
            self.save(uid, &memory)
        } else {
            Ok(())
        }
    }

    /// Keep what a pod's task changed in its copy of the record
    /// ([`PodMemory::take_task_parts`]) in the stored record, read and
    /// written under one lock with [`observe`](Self::observe).
    pub fn keep_task(&self, uid: &str, task: &PodMemory) -> Result<(), StoreError> {
        record_name(uid)?;
        let _updating = self.updating(uid);
        let mut memory = self.load(uid)?.unwrap_or_default();
        if memory.take_task_parts(task) {
            self.save(uid, &memory)
        } else {
            Ok(())
        }
    }

    /// Read the record file `name`, at most [`MAX_RECORD_BYTES`] of it.
    fn read(&self, name: &str) -> Result<Found, StoreError> {
        let path = self.path().join(name);
        let (file, stat) = match self.dir.open_file(name) {
            Ok(Some(found)) => found,
            Ok(None) => return Ok(Found::Absent),
            Err(Untrusted::Io { source, .. }) => {
                return Err(StoreError::Io {
                    action: "read",
                    path,
                    cause: source,
                });
            }
            Err(e) => {
                return Err(StoreError::Record {
                    why: refusal(&e),
                    path,
                });
            }
        };
        let size = u64::try_from(stat.st_size).unwrap_or(0);
        let limit = MAX_RECORD_BYTES as u64;
        if size > limit {
            return Ok(Found::Oversize(size));
        }
        let mut bytes = Vec::with_capacity(MAX_RECORD_BYTES);
        file.take(limit + 1)
            .read_to_end(&mut bytes)
            .map_err(|cause| StoreError::Io {
                action: "read",
                path,
                cause,
            })?;
        if bytes.len() > MAX_RECORD_BYTES {
            return Ok(Found::Oversize(bytes.len() as u64));
        }
        Ok(match PodMemory::from_json(&bytes) {
            Ok(memory) => Found::Record(Box::new(memory)),
            Err(e) => Found::Unusable(e),
        })
    }

    /// Write `memory` as the record of `uid`, atomically (see the module
    /// docs). A uid with no record yet is refused while the directory
    /// keeps its limit of records ([`StoreError::Full`]).
    pub fn save(&self, uid: &str, memory: &PodMemory) -> Result<(), StoreError> {
        let name = record_name(uid)?;
        let gone = self.is_gone(uid);
        // A deleted pod's record is not made again; a record with nothing
        // durable in it is no file at all.
        if gone || memory.is_empty() {
            let _writing = self.writes.read().unwrap_or_else(PoisonError::into_inner);
            return self.remove(uid);
        }
        let bytes = memory.to_json().map_err(|cause| StoreError::Encode {
            uid: uid.to_owned(),
            cause,
        })?;
        if bytes.len() > MAX_RECORD_BYTES {
            return Err(StoreError::TooLarge {
                uid: uid.to_owned(),
                bytes: bytes.len(),
            });
        }
        let _writing = self.writes.read().unwrap_or_else(PoisonError::into_inner);
        if self.exists(&name)? {
            return self.write(&name, &bytes);
        }
        let _admitting = self.admit.lock().unwrap_or_else(PoisonError::into_inner);
        if !self.exists(&name)? && self.record_names()?.len() >= self.max_records {
            return Err(StoreError::Full {
                path: self.path().to_owned(),
                uid: uid.to_owned(),
                max: self.max_records,
            });
        }
        self.write(&name, &bytes)
    }

    fn exists(&self, name: &str) -> Result<bool, StoreError> {
        self.dir.exists(name).map_err(|cause| StoreError::Io {
            action: "look up",
            path: self.path().join(name),
            cause,
        })
    }

    /// Put `bytes` in place as `name`, then sync the directory so the new
    /// name survives a power loss.
    fn write(&self, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let io = |action, cause| StoreError::Io {
            action,
            path: self.path().join(name),
            cause,
        };
        self.dir
            .write_file(name, bytes, RECORD_MODE)
            .map_err(|e| io("write", e))?;
        self.dir.sync().map_err(|e| io("sync the directory of", e))
    }

    /// The pod `uid` was deleted: remove its record, and write none for it
    /// from now on (a task of the pod may still be winding down).
    pub fn forget(&self, uid: &str) -> Result<(), StoreError> {
        record_name(uid)?;
        {
            let mut gone = self.gone.lock().unwrap_or_else(PoisonError::into_inner);
            if gone.1.insert(uid.to_owned()) {
                gone.0.push_back(uid.to_owned());
                while gone.0.len() > self.max_records.max(1) {
                    if let Some(oldest) = gone.0.pop_front() {
                        gone.1.remove(&oldest);
                    }
                }
            }
        }
        self.watched
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
        self.gapped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
        let _writing = self.writes.read().unwrap_or_else(PoisonError::into_inner);
        self.remove(uid)
    }

    /// Remove the record of `uid`, if there is one.
    pub fn remove(&self, uid: &str) -> Result<(), StoreError> {
        let name = record_name(uid)?;
        self.dir.remove(&name).map_err(|cause| StoreError::Io {
            action: "remove",
            path: self.path().join(&name),
            cause,
        })
    }

    /// The uids that have a record (a regular file named `<uid>.json` with
    /// a valid uid), sorted. Temporary files and any other entry are not
    /// records.
    pub fn uids(&self) -> Result<Vec<String>, StoreError> {
        Ok(self
            .record_names()?
            .into_iter()
            .filter(|(_, kind)| *kind == FileType::RegularFile)
            .map(|(uid, _)| uid)
            .collect())
    }

    /// Drop the records of pods that are gone: every record whose uid is
    /// not in `live` (the uids of a listing of the pods the host sees on
    /// its node, which began at `listed_from`) and that was last written
    /// before the listing began: a record written since may be a pod made
    /// after the listing's snapshot. Returns how many were dropped.
    /// Temporary files a crash left behind are removed too (not counted).
    pub fn retain(
        &self,
        live: &BTreeSet<String>,
        listed_from: SystemTime,
    ) -> Result<usize, StoreError> {
        self.watched
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|uid| live.contains(uid));
        self.gapped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|uid| live.contains(uid));
        let _alone = self.writes.write().unwrap_or_else(PoisonError::into_inner);
        let mut dropped = 0;
        for (uid, _) in self.record_names()? {
            if live.contains(&uid) || self.written_since(&uid, listed_from) {
                continue;
            }
            self.remove(&uid)?;
            dropped += 1;
        }
        for (name, _) in self.list(".tmp")? {
            if name.starts_with('.') && name.contains(".json.") {
                tracing::debug!(path = %self.path().join(&name).display(), "leftover temporary state record removed");
                self.dir.remove(&name).map_err(|cause| StoreError::Io {
                    action: "remove",
                    path: self.path().join(&name),
                    cause,
                })?;
            }
        }
        Ok(dropped)
    }

    /// Whether `uid`'s record was last written at or after `since` (an
    /// entry that is no trusted record file was not).
    fn written_since(&self, uid: &str, since: SystemTime) -> bool {
        let Ok(Some((_, stat))) = self.dir.open_file(&format!("{uid}{RECORD_SUFFIX}")) else {
            return false;
        };
        let (Ok(secs), Ok(nanos)) = (
            u64::try_from(stat.st_mtime),
            u32::try_from(stat.st_mtime_nsec),
        ) else {
            return false;
        };
        UNIX_EPOCH + Duration::new(secs, nanos) >= since
    }

    /// The entries named `<valid uid>.json`, any type, with their uids.
    fn record_names(&self) -> Result<Vec<(String, FileType)>, StoreError> {
        Ok(self
            .list(RECORD_SUFFIX)?
            .into_iter()
            .filter_map(|(name, kind)| {
                let uid = name.strip_suffix(RECORD_SUFFIX)?;
                valid_uid(uid).then(|| (uid.to_owned(), kind))
            })
            .collect())
    }

    fn list(&self, suffix: &str) -> Result<Vec<(String, FileType)>, StoreError> {
        self.dir.entries(suffix).map_err(|e| match e {
            Untrusted::Io { path, source } => StoreError::Io {
                action: "list",
                path,
                cause: source,
            },
            e => StoreError::Dir(e),
        })
    }
}

/// The file name of `uid`'s record, if `uid` is valid ([`valid_uid`]).
fn record_name(uid: &str) -> Result<String, StoreError> {
    if !valid_uid(uid) {
        return Err(StoreError::BadUid {
            uid: crate::facts::shown(uid),
        });
    }
    Ok(format!("{uid}{RECORD_SUFFIX}"))
}

/// Why a record file is refused, in a few words.
fn refusal(e: &Untrusted) -> String {
    match e {
        Untrusted::Symlink { .. } => "a symbolic link".to_owned(),
        Untrusted::Owner { owner, .. } => format!("owned by uid {owner}"),
        Untrusted::Writable { mode, .. } => {
            format!("writable by its group or others, mode {mode:04o}")
        }
        Untrusted::Kind { .. } => "not a regular file".to_owned(),
        Untrusted::TooLarge { size, .. } => format!("{size} bytes, too large"),
        Untrusted::Io { source, .. } => source.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use rstest::rstest;

    use super::*;
    use crate::facts::{PodInput, VmId, annotations};
    use crate::memory::Evidence;

    const UID: &str = "3f1d2c4b-9a8e-4f7d-b6c5-0a1b2c3d4e5f";

    fn store() -> (tempfile::TempDir, MemoryStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = MemoryStore::open(&dir.path().join("state")).unwrap();
        (dir, store)
    }

    fn memory(id: &str) -> PodMemory {
        let mut memory = PodMemory::new();
        let pod = PodInput {
            annotations: [(annotations::VM_ID.to_owned(), id.to_owned())].into(),
            ..PodInput::default()
        };
        memory.observe(&pod, true);
        memory
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    /// Counts the warnings logged on this thread while it is the default
    /// subscriber.
    struct Warnings(Arc<AtomicUsize>);

    impl tracing::Subscriber for Warnings {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            if *event.metadata().level() == tracing::Level::WARN {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// `f`'s result and the warnings it logged.
    fn warnings<T>(f: impl FnOnce() -> T) -> (T, usize) {
        let count = Arc::new(AtomicUsize::new(0));
        let out = tracing::subscriber::with_default(Warnings(count.clone()), f);
        (out, count.load(Ordering::Relaxed))
    }

    /// A pod of uid [`UID`] with these annotations.
    fn seen(pairs: &[(&str, &str)]) -> PodInput {
        PodInput {
            uid: Some(UID.to_owned()),
            annotations: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..PodInput::default()
        }
    }

    /// The watch's observations and a task's record meet in one file, and
    /// neither loses the other's changes: a task that kept its verdict
    /// from a copy read before a hibernation was noted does not undo the
    /// hibernation, and the watch does not undo the task's verdict.
    #[test]
    fn the_watch_and_a_task_keep_their_own_parts_of_one_record() {
        let (_tmp, store) = store();
        let lifecycle = crate::annotations::keys::LIFECYCLE_STATE;
        store
            .observe(&seen(&[(annotations::VM_ID, "vm-1")]), false)
            .unwrap();
        let mut task_copy = store.recall(UID).unwrap();
        store
            .observe(&seen(&[(lifecycle, "hibernated")]), true)
            .unwrap();
        let vm = VmId::parse("vm-1").unwrap();
        task_copy.set_verdict(&vm, Evidence::Grace);
        task_copy.set_marker(&vm, "done");
        task_copy.revise();
        // An older copy arriving late changes nothing.
        let mut older = task_copy.clone();
        older.set_verdict(&vm, Evidence::NoEvidence);
        task_copy.revise();
        store.keep_task(UID, &task_copy).unwrap();
        store.keep_task(UID, &older).unwrap();
        let kept = store.load(UID).unwrap().unwrap();
        assert!(kept.hibernated(), "the watch's hibernation stays");
        assert_eq!(kept.last_vm(), Some("vm-1"));
        assert_eq!(kept.verdict().map(|v| v.by), Some(Evidence::Grace));
        assert_eq!(kept.marker_vm(), Some("vm-1"));
        // The wake's new id: history says wake, and the task's parts stay.
        store
            .observe(&seen(&[(annotations::VM_ID, "vm-2")]), true)
            .unwrap();
        let kept = store.load(UID).unwrap().unwrap();
        assert_eq!(kept.wake_vm(), Some("vm-2"));
        assert!(kept.history_says_wake(&VmId::parse("vm-2").unwrap()));
        assert_eq!(kept.marker_vm(), Some("vm-1"));
    }

    /// Watched since new is the watch's memory only: a pod first seen live
    /// without a lifecycle is watched; a listing (a gap) ends it, and so
    /// does a restart (a new store over the same directory).
    #[test]
    fn watched_since_new_lasts_until_a_gap() {
        let (tmp, store) = store();
        let lifecycle = crate::annotations::keys::LIFECYCLE_STATE;
        store.observe(&seen(&[]), true).unwrap();
        assert!(store.recall(UID).unwrap().watched_since_new());
        store
            .observe(
                &seen(&[(lifecycle, "creating"), (annotations::VM_ID, "vm-1")]),
                true,
            )
            .unwrap();
        assert!(
            store.recall(UID).unwrap().watched_since_new(),
            "still no gap"
        );
        let restarted = MemoryStore::open(&tmp.path().join("state")).unwrap();
        assert!(
            !restarted.recall(UID).unwrap().watched_since_new(),
            "a restart is a gap"
        );
        store
            .observe(
                &seen(&[(lifecycle, "creating"), (annotations::VM_ID, "vm-1")]),
                false,
            )
            .unwrap();
        assert!(
            !store.recall(UID).unwrap().watched_since_new(),
            "a listing is a gap"
        );
        // A pod first seen mid-life is not watched since new.
        let (_other, fresh) = self::store();
        fresh
            .observe(&seen(&[(lifecycle, "creating")]), true)
            .unwrap();
        assert!(!fresh.recall(UID).unwrap().watched_since_new());
        // A deleted pod is forgotten, watched or not.
        store.forget(UID).unwrap();
        assert!(!store.recall(UID).unwrap().watched_since_new());
    }

    /// A gap noted before an earlier observation of the pod is (the
    /// queue of observations fell behind and dropped a later one) is not
    /// undone by that observation.
    #[test]
    fn a_gap_outlasts_an_earlier_observation_noted_after_it() {
        let (_tmp, store) = store();
        store.gap(UID);
        store.observe(&seen(&[]), true).unwrap();
        assert!(!store.recall(UID).unwrap().watched_since_new());
        store.observe(&seen(&[]), true).unwrap();
        assert!(!store.recall(UID).unwrap().watched_since_new());
    }

    #[test]
    fn a_record_round_trips_and_is_private() {
        let (_tmp, store) = store();
        assert!(store.load(UID).unwrap().is_none());
        let mut saved = memory("vm-a");
        saved.set_verdict(&VmId::parse("vm-a").unwrap(), Evidence::NoEvidence);
        store.save(UID, &saved).unwrap();
        let loaded = store.load(UID).unwrap().expect("saved");
        assert_eq!(loaded.to_json().unwrap(), saved.to_json().unwrap());
        assert!(saved.watched_since_new());
        assert!(!loaded.watched_since_new(), "a load is a gap");
        let file = store.path().join(format!("{UID}.json"));
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dir_mode = std::fs::metadata(store.path())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dir_mode, 0o700);
        assert_eq!(store.uids().unwrap(), [UID]);
        store.remove(UID).unwrap();
        store.remove(UID).unwrap();
        assert!(store.load(UID).unwrap().is_none());
    }

    #[test]
    fn saves_leave_no_temporary_file_and_replace_the_record_whole() {
        let (_tmp, store) = store();
        store.save(UID, &memory("vm-a")).unwrap();
        store.save(UID, &memory("vm-b")).unwrap();
        assert_eq!(names(store.path()), [format!("{UID}.json")]);
        assert_eq!(store.load(UID).unwrap().unwrap().last_vm(), Some("vm-b"));
    }

    /// Saves of the same uid and of others from many threads at once: each
    /// record is one whole save, and nothing else is left.
    #[test]
    fn concurrent_saves_leave_whole_records() {
        let (_tmp, store) = store();
        let store = Arc::new(store);
        let others = ["a-1", "a-2", "a-3", "a-4"];
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for i in 0..25 {
                        store.save(UID, &memory(&format!("vm-{t}-{i}"))).unwrap();
                        store.save(others[t % 4], &memory("vm-x")).unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let last = store.load(UID).unwrap().expect("one whole record");
        assert!(last.last_vm().unwrap().starts_with("vm-"), "{last:?}");
        let mut expected: Vec<String> = [UID]
            .iter()
            .chain(&others)
            .map(|u| format!("{u}.json"))
            .collect();
        expected.sort();
        assert_eq!(names(store.path()), expected);
    }

    #[test]
    fn a_crash_leftover_is_no_record_and_retain_cleans_it() {
        let (_tmp, store) = store();
        store.save(UID, &memory("vm-a")).unwrap();
        let leftover = store.path().join(format!(".{UID}.json.4242.0.tmp"));
        std::fs::write(&leftover, b"{\"version\":1,\"last_v").unwrap();
        let unrelated = store.path().join("notes.txt");
        std::fs::write(&unrelated, b"kept").unwrap();
        assert_eq!(store.uids().unwrap(), [UID]);
        let live = BTreeSet::from([UID.to_owned()]);
        assert_eq!(store.retain(&live, SystemTime::now()).unwrap(), 0);
        assert!(!leftover.exists());
        assert!(unrelated.exists(), "not the store's");
        assert!(store.load(UID).unwrap().is_some());
    }

    #[test]
    fn retain_drops_the_records_of_pods_that_are_gone() {
        let (_tmp, store) = store();
        for uid in ["a-1", "a-2", "a-3"] {
            store.save(uid, &memory("vm-a")).unwrap();
        }
        // Written a minute before a listing that began 30 s ago.
        let now = SystemTime::now();
        for uid in ["a-1", "a-2", "a-3"] {
            std::fs::File::options()
                .write(true)
                .open(store.path().join(format!("{uid}.json")))
                .unwrap()
                .set_modified(now - Duration::from_secs(60))
                .unwrap();
        }
        let listed_from = now - Duration::from_secs(30);
        // Written after the listing began: a pod made since, kept.
        store.save("a-4", &memory("vm-a")).unwrap();
        let live = BTreeSet::from(["a-2".to_owned(), "a-9".to_owned()]);
        assert_eq!(store.retain(&live, listed_from).unwrap(), 2);
        assert_eq!(store.uids().unwrap(), ["a-2", "a-4"]);
        assert_eq!(store.retain(&live, listed_from).unwrap(), 0);
        let later = now + Duration::from_secs(60);
        assert_eq!(store.retain(&live, later).unwrap(), 1);
        assert_eq!(store.uids().unwrap(), ["a-2"]);
    }

    #[rstest]
    #[case::not_json(b"{\"version\":1,".as_slice())]
    #[case::another_version(br#"{"version":7,"last_vm":"vm-a"}"#.as_slice())]
    #[case::out_of_bounds(br#"{"version":1,"last_vm":"../../etc"}"#.as_slice())]
    #[case::not_utf8(b"\xff\xfe".as_slice())]
    fn a_corrupt_record_is_absent_with_a_warning(#[case] bytes: &[u8]) {
        let (_tmp, store) = store();
        let file = store.path().join(format!("{UID}.json"));
        std::fs::write(&file, bytes).unwrap();
        assert!(matches!(
            store.read(&format!("{UID}.json")).unwrap(),
            Found::Unusable(_)
        ));
        let (loaded, warned) = warnings(|| store.load(UID));
        assert!(loaded.unwrap().is_none());
        assert_eq!(warned, 1);
        assert!(file.exists(), "left for the next save to replace");
        store.save(UID, &memory("vm-a")).unwrap();
        assert!(store.load(UID).unwrap().is_some());
    }

    #[test]
    fn an_oversize_record_is_refused_and_removed() {
        let (_tmp, store) = store();
        let file = store.path().join(format!("{UID}.json"));
        let mut text = br#"{"version":1,"pad":""#.to_vec();
        text.resize(MAX_RECORD_BYTES + 10, b'x');
        text.extend_from_slice(b"\"}");
        std::fs::write(&file, &text).unwrap();
        let (loaded, warned) = warnings(|| store.load(UID));
        assert!(loaded.unwrap().is_none());
        assert_eq!(warned, 1);
        assert!(!file.exists(), "removed");
    }

    #[rstest]
    #[case::dot_dot("../x")]
    #[case::slash("a/b")]
    #[case::upper_case("A")]
    #[case::empty("")]
    #[case::too_long(&"a".repeat(65))]
    #[case::a_hidden_name(".a")]
    #[case::nul("a\0b")]
    fn a_bad_uid_is_refused_and_never_a_path(#[case] uid: &str) {
        let (_tmp, store) = store();
        for err in [
            store.save(uid, &memory("vm-a")).unwrap_err(),
            store.load(uid).unwrap_err(),
            store.remove(uid).unwrap_err(),
        ] {
            assert!(matches!(err, StoreError::BadUid { .. }), "{err}");
            assert!(
                err.to_string().contains("pass the pod's metadata.uid"),
                "{err}"
            );
        }
        assert!(names(store.path()).is_empty());
    }

    #[test]
    fn the_longest_uid_is_fine() {
        let (_tmp, store) = store();
        let uid = "a".repeat(MAX_UID_BYTES);
        store.save(&uid, &memory("vm-a")).unwrap();
        assert_eq!(store.uids().unwrap(), [uid]);
    }

    #[test]
    fn an_untrusted_directory_is_refused_naming_it_and_the_fix() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = MemoryStore::open(&dir).unwrap_err();
        assert!(
            matches!(err, StoreError::Dir(Untrusted::Writable { .. })),
            "{err}"
        );
        let message = err.to_string();
        assert!(message.contains(&dir.display().to_string()), "{message}");
        assert!(message.contains("chmod go-w"), "{message}");
    }

    #[test]
    fn a_symlinked_record_is_refused_and_never_followed() {
        let (tmp, store) = store();
        let elsewhere = tmp.path().join("elsewhere.json");
        std::fs::write(&elsewhere, memory("vm-a").to_json().unwrap()).unwrap();
        let link = store.path().join(format!("{UID}.json"));
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let err = store.load(UID).unwrap_err();
        assert!(matches!(err, StoreError::Record { .. }), "{err}");
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert!(err.to_string().contains("remove it"), "{err}");
        assert!(store.uids().unwrap().is_empty(), "a link is no record");
        store.save(UID, &memory("vm-b")).unwrap();
        assert!(
            std::fs::symlink_metadata(&link).unwrap().is_file(),
            "replaced"
        );
        let untouched = std::fs::read(&elsewhere).unwrap();
        assert_eq!(untouched, memory("vm-a").to_json().unwrap());
    }

    #[test]
    fn a_record_others_may_write_is_refused() {
        let (_tmp, store) = store();
        store.save(UID, &memory("vm-a")).unwrap();
        let file = store.path().join(format!("{UID}.json"));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        let err = store.load(UID).unwrap_err();
        assert!(
            err.to_string().contains("writable by its group or others"),
            "{err}"
        );
    }

    #[test]
    fn new_uids_are_refused_beyond_the_bound_and_known_ones_still_saved() {
        let (_tmp, store) = store();
        let store = store.with_max_records(2);
        store.save("a-1", &memory("vm-a")).unwrap();
        store.save("a-2", &memory("vm-a")).unwrap();
        let err = store.save("a-3", &memory("vm-a")).unwrap_err();
        assert!(matches!(err, StoreError::Full { max: 2, .. }), "{err}");
        assert!(err.to_string().contains("pod uid a-3"), "{err}");
        store
            .save("a-2", &memory("vm-b"))
            .expect("a known uid is saved");
        store.remove("a-1").unwrap();
        store.save("a-3", &memory("vm-a")).expect("room again");
        assert_eq!(store.uids().unwrap(), ["a-2", "a-3"]);
    }

    #[test]
    fn the_default_bound_is_ten_thousand() {
        let (_tmp, store) = store();
        assert_eq!(store.max_records, MAX_RECORDS);
        assert_eq!(MAX_RECORDS, 10_000);
    }

    #[rstest]
    #[case::root(0, &[("HOME", "/root")], Some(DEFAULT_STATE_DIR))]
    #[case::xdg(1000, &[("XDG_STATE_HOME", "/x"), ("HOME", "/h")], Some("/x/cocoon-fixup/state"))]
    #[case::home(1000, &[("HOME", "/h")], Some("/h/.local/state/cocoon-fixup/state"))]
    #[case::empty_xdg_is_unset(1000, &[("XDG_STATE_HOME", ""), ("HOME", "/h")], Some("/h/.local/state/cocoon-fixup/state"))]
    #[case::nowhere(1000, &[], None)]
    fn default_state_dir_mirrors_the_cache_key(
        #[case] euid: u32,
        #[case] env: &[(&str, &str)],
        #[case] expected: Option<&str>,
    ) {
        let var = |name: &str| {
            env.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        };
        assert_eq!(state_dir_for(euid, var), expected.map(PathBuf::from));
        if let Some(state) = state_dir_for(euid, var) {
            let key = crate::plugin::cache::default_paths(
                crate::plugin::cache::CacheOwner::Node,
                euid,
                var,
            )
            .key
            .unwrap();
            assert_eq!(state.parent(), key.parent(), "beside the cache key");
        }
    }

    /// A deleted pod's record is removed and not made again by a task
    /// still winding down; a record with nothing durable is no file.
    #[test]
    fn a_forgotten_pod_gets_no_record_again_and_an_empty_one_is_no_file() {
        let (_dir, store) = store();
        store.save(UID, &memory("vm-a")).unwrap();
        assert_eq!(store.uids().unwrap(), [UID]);
        store.forget(UID).unwrap();
        assert!(store.uids().unwrap().is_empty());
        store.save(UID, &memory("vm-b")).unwrap();
        assert!(store.load(UID).unwrap().is_none(), "re-made after forget");
        let other = "0a1b2c3d-0000-4000-8000-000000000001";
        store.save(other, &memory("vm-c")).unwrap();
        assert_eq!(store.uids().unwrap(), [other]);
        store.save(other, &PodMemory::new()).unwrap();
        assert!(
            store.uids().unwrap().is_empty(),
            "an empty record stays a file"
        );
    }
}
