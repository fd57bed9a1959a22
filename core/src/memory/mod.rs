//! The host's memory of each pod it watches: what the pod's annotations
//! no longer show, kept per pod uid so that a restart of the host forgets
//! none of it (spec section 2, "Recognising a hibernate wake", and the
//! host's own durable record that spec section 8 decides with).
//!
//! For each pod uid the record keeps the last VM id the host saw on the
//! pod, whether a hibernation was recorded since, which VM came from a
//! wake, the verdict reached for the current VM (so resumed work keeps
//! it), the VM the host's last `post-clone-state` write was for, and the
//! fixup loop's retry budget (so it ends 180 s after the first attempt
//! across task retries and host restarts, spec section 5).
//!
//! - this module: [`PodMemory`], one pod's record, and its rules as pure
//!   functions: no I/O, no clock read (times are parameters).
//! - [`budget`]: the retry budget of one VM and its bounded error chain.
//! - [`evidence`]: rule 2, the stack's own events, as a pure function.
//! - [`store`]: the state directory, one file per pod uid, written
//!   atomically.
//!
//! The decision ([`crate::decision`]) reads and changes its parts (the
//! verdict, the marker's VM, the budget, when a VM was first seen) through
//! [`crate::decision::PodTask::remember`]; the daemon's watch notes the
//! rest ([`PodMemory::observe`]), each under the store's lock for the pod.

use serde::{Deserialize, Serialize};

use crate::annotations::keys;
use crate::facts::{PodInput, VmId, annotations};
use crate::lifecycle::Lifecycle;

pub mod budget;
pub mod evidence;
pub mod store;

pub use budget::Budget;
pub use evidence::{
    CLOCK_SKEW, LISTED_AT_MOST, Listed, ReporterError, STACK_REPORTER, StackEvent,
    WAKE_EVENT_WINDOW, Witness, check_reporter, field_selectors,
};
pub use store::{DEFAULT_STATE_DIR, MAX_RECORDS, MemoryStore, StoreError, default_state_dir};

/// How upstream's lifecycle message of a failed hibernate begins (spec
/// section 7).
pub const HIBERNATE_FAILED_PREFIX: &str = "hibernate: ";

/// The version of the record's file format. A record of another version
/// is ignored on load (and written anew as this one): a downgraded host
/// forgets a newer host's records rather than misread them.
pub const RECORD_VERSION: u32 = 1;

/// What a wake verdict rests on (spec section 2, rules 1 to 3 and the
/// grace that follows them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Evidence {
    /// Rule 1: `restore-from-hibernate` is exactly `"true"`. A wake.
    Annotation,
    /// Rule 2: a `Woken` event of the stack ([`woken_event_seen`]): an
    /// in-place wake. A wake.
    Woken,
    /// Rule 2: a `HibernateSnapshotExists` event of the stack
    /// ([`events_say_wake`]): a create that restored the hibernate
    /// snapshot. A wake.
    Events,
    /// Rule 3: the host's hibernate history
    /// ([`PodMemory::history_says_wake`]), witnessed by the stack's own
    /// event (rule 2): history alone says "a wake or a recreate". A wake.
    History,
    /// Rules 1 to 3 found nothing and the pod needed no wait (not a
    /// CH+`windows` pod, or one watched without a gap since it was new).
    /// Not a wake.
    NoEvidence,
    /// Rules 1 to 3 found nothing and the grace passed without a `Woken`
    /// event. Not a wake.
    Grace,
    /// The host's hibernate history says the pod got a new VM after a
    /// hibernation, but no witness of the stack (rule 1 or 2) came within
    /// the grace: upstream recreated the VM from the base snapshot (the
    /// hibernate snapshot was gone), a fresh clone. Not a wake.
    Recreate,
    /// The embedder that made the VM said it cloned or forked it just now
    /// ([`crate::decision::Told`]). Not a wake.
    Told,
    /// The embedder said it restored the pod's hibernate snapshot into a
    /// new VM. A wake.
    ToldWake,
    /// The embedder said it resumed the pod's hibernated VM in place. A
    /// wake, in place.
    ToldWakeInPlace,
}

impl Evidence {
    /// Whether this evidence makes the VM a wake: rules 1 to 3 do; finding
    /// nothing, at once or after the grace, does not.
    pub fn says_wake(self) -> bool {
        matches!(
            self,
            Evidence::Annotation
                | Evidence::Woken
                | Evidence::Events
                | Evidence::History
                | Evidence::ToldWake
                | Evidence::ToldWakeInPlace
        )
    }

    /// Whether the wake happened in place (the stack's `update`, spec
    /// section 10): the pod kept its uid across the hibernation, as the
    /// stack's `Woken` event or the host's own hibernate history show.
    pub fn in_place(self) -> bool {
        matches!(
            self,
            Evidence::Woken | Evidence::History | Evidence::ToldWakeInPlace
        )
    }
}

/// The wake verdict the decision reached for one VM of the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeVerdict {
    /// The VM id the verdict is about.
    pub vm: String,
    /// Whether the VM is a wake; always [`Evidence::says_wake`] of `by`
    /// (a record where it is not is refused on load).
    pub wake: bool,
    /// What the verdict rests on.
    pub by: Evidence,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The last `post-clone-state` the host saw on the pod or wrote, and the
/// VM it is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkerSeen {
    /// The VM id the marker is for.
    pub vm: String,
    /// `running`, `done` or `failed`.
    pub state: String,
}

/// When the decision first saw a VM bound to the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmSeen {
    /// The VM id.
    pub vm: String,
    /// Milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
}

/// Why a stored record is not used. Each is a warning: the record is
/// treated as absent, and the host writes it anew at its next change.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(
        "the state record is not a record this host reads ({0}): ignored, and written anew at the pod's next change"
    )]
    Malformed(serde_json::Error),
    #[error(
        "the state record has no version: ignored, and written anew as version {RECORD_VERSION} at the pod's next change"
    )]
    NoVersion,
    #[error(
        "the state record has version {found}, and this host reads version {RECORD_VERSION}: ignored, and written anew as version {RECORD_VERSION} at the pod's next change (a downgraded host forgets a newer host's records)"
    )]
    Version { found: u32 },
    #[error("the state record's {field} {why}: ignored, and written anew at the pod's next change")]
    Invalid { field: &'static str, why: String },
    #[error("cannot encode the state record: {0}; this is a bug in cocoon-fixup, please report it")]
    Encode(serde_json::Error),
}

/// The host's record of one pod uid (see the module docs).
///
/// Every VM id in it is a valid [`VmId`] (at most 128 bytes) and the
/// budget's error chain is bounded ([`budget`]), so a record serialises to
/// well under the 16 KiB a stored record may take
/// ([`store::MAX_RECORD_BYTES`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodMemory {
    /// Always [`RECORD_VERSION`] in memory; checked on load.
    version: u32,
    /// The last VM id the host saw annotated on the pod
    /// (`vm.cocoonstack.io/id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_vm: Option<String>,
    /// A hibernation was recorded since `last_vm` was seen.
    #[serde(default)]
    hibernated: bool,
    /// The VM id history says came from a wake (rule 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wake_vm: Option<String>,
    /// The verdict the decision reached, for the VM it names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    verdict: Option<WakeVerdict>,
    /// The VM id the host's last `post-clone-state` write was for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    marker_vm: Option<String>,
    /// The last `post-clone-state` the host saw on the pod (while its VM
    /// id stayed the same) or wrote, and the VM it is for: a marker that
    /// vanished from the same VM was removed by someone (a failed
    /// hibernate removes it, spec section 7), and is what the host knows
    /// of that VM's fixup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    marker: Option<MarkerSeen>,
    /// The VM whose hibernation the host saw fail (lifecycle `failed` with
    /// a message that begins `hibernate: `): upstream lifts such a pod back
    /// to `creating` and `ready` on the same VM, and nothing is owed in
    /// its guest (spec section 7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hibernate_failed_vm: Option<String>,
    /// The fixup loop's retry budget, for the VM it names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    budget: Option<Budget>,
    /// When the decision first saw the VM it names bound to the pod: the
    /// wake grace of spec section 2 runs from then, across restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    vm_seen: Option<VmSeen>,
    /// How many times tasks changed their parts of the record: a task's
    /// copy is kept only when it is newer than what is stored
    /// ([`take_task_parts`](Self::take_task_parts)), so a late write of an
    /// older copy never undoes a newer one.
    #[serde(default, skip_serializing_if = "is_zero")]
    revision: u64,
    /// The host has watched the pod without a gap since it first saw it
    /// without a lifecycle annotation. Not durable: a record read from disk
    /// has it cleared, because a restart of the host is a gap.
    #[serde(skip)]
    watched_since_new: bool,
    /// The record was made by [`PodMemory::new`] and has observed nothing
    /// yet: its first observation is the host's first sight of the pod.
    /// Not durable (a record read from disk is not new).
    #[serde(skip)]
    fresh: bool,
}

impl Default for PodMemory {
    fn default() -> Self {
        Self::new()
    }
}

impl PodMemory {
    /// The record of a pod uid the host has no record of: its first
    /// [`observe`](Self::observe) is the host's first sight of the pod.
    pub fn new() -> Self {
        PodMemory {
            version: RECORD_VERSION,
            last_vm: None,
            hibernated: false,
            wake_vm: None,
            verdict: None,
            marker_vm: None,
            marker: None,
            hibernate_failed_vm: None,
            budget: None,
            vm_seen: None,
            revision: 0,
            watched_since_new: false,
            fresh: true,
        }
    }

    /// The last VM id the host saw annotated on the pod.
    pub fn last_vm(&self) -> Option<&str> {
        self.last_vm.as_deref()
    }

    /// Whether a hibernation was recorded since [`last_vm`](Self::last_vm)
    /// was seen.
    pub fn hibernated(&self) -> bool {
        self.hibernated
    }

    /// The VM id history says came from a wake.
    pub fn wake_vm(&self) -> Option<&str> {
        self.wake_vm.as_deref()
    }

    /// The marker's VM: the VM id the host's last `post-clone-state` write
    /// was for.
    pub fn marker_vm(&self) -> Option<&str> {
        self.marker_vm.as_deref()
    }

    /// The last marker the host saw or wrote, whichever VM it is for.
    pub fn marker(&self) -> Option<&MarkerSeen> {
        self.marker.as_ref()
    }

    /// The VM whose hibernation the host last saw fail.
    pub fn hibernate_failed_vm(&self) -> Option<&str> {
        self.hibernate_failed_vm.as_deref()
    }

    /// What the record knows of `vm`'s fixup beyond the pod's annotations:
    /// the last marker seen or written for it, and whether its
    /// hibernation was seen failing (spec section 7).
    pub fn marker_for(&self, vm: &VmId) -> Option<&str> {
        self.marker
            .as_ref()
            .filter(|m| m.vm == vm.as_str())
            .map(|m| m.state.as_str())
    }

    /// Whether the host saw `vm`'s hibernation fail: a pod at `creating`
    /// on that same VM was lifted by upstream, not cloned (spec section 7).
    pub fn lifted(&self, vm: &VmId) -> bool {
        self.hibernate_failed_vm.as_deref() == Some(vm.as_str())
    }

    /// The stored verdict, whichever VM it is for.
    pub fn verdict(&self) -> Option<&WakeVerdict> {
        self.verdict.as_ref()
    }

    /// The stored budget, whichever VM it is for.
    pub fn budget(&self) -> Option<&Budget> {
        self.budget.as_ref()
    }

    /// Whether the host has watched the pod without a gap since it first
    /// saw it without a lifecycle annotation: then it would have seen a
    /// hibernation, and a CH+`windows` pod with no evidence of a wake is
    /// classified at once instead of after the grace (spec section 2).
    pub fn watched_since_new(&self) -> bool {
        self.watched_since_new
    }

    /// The watch had a gap (a re-list): what happened to the pod meanwhile
    /// is unknown, so it no longer counts as watched since new.
    pub fn gap(&mut self) {
        self.watched_since_new = false;
    }

    /// Note what `pod` shows, for rule 3 of spec section 2; `live` says
    /// the observation is a watch event with no gap in the watch before it
    /// (not the initial list, not a re-list). Returns whether anything
    /// durable changed (then the caller saves the record).
    ///
    /// In order:
    ///
    /// 1. The first observation of a [`new`](Self::new) record that is
    ///    `live` and shows no lifecycle (absent or empty: upstream's create
    ///    writes `creating` first) starts [`watched_since_new`]; an
    ///    observation that is not `live` ends it.
    /// 2. A VM id annotation (`vm.cocoonstack.io/id`) that is a valid
    ///    [`VmId`] and differs from [`last_vm`] (or the first one seen)
    ///    becomes `last_vm` and clears `hibernated`; if a hibernation was
    ///    recorded (and this observation does not itself show one, see 4),
    ///    the id is the VM a wake made, and becomes [`wake_vm`]. The same
    ///    id seen again with a hibernation recorded, in an observation that
    ///    does not show one, is the old id kept or restored by a
    ///    hibernation that failed: `hibernated` clears. An id that is not a
    ///    valid [`VmId`] names no VM the host could bind, and changes
    ///    nothing here.
    /// 3. `wake_vm` is replaced only by another wake, so a VM's wake stays
    ///    known for resumed work whatever id the pod shows meanwhile.
    /// 4. A hibernation is recorded when the lifecycle
    ///    (`vm.cocoonstack.io/lifecycle-state`) is exactly `hibernated`, or
    ///    when `vm.cocoonstack.io/hibernate` is exactly `"true"` or the
    ///    lifecycle exactly `hibernating` and the pod has no VM id left
    ///    (upstream removes the id just before it removes the VM; a
    ///    hibernation that fails keeps or restores the old id and records
    ///    nothing). It is noted after the id of the same observation: a
    ///    pod that shows `hibernated` beside an id is hibernating that VM,
    ///    so the hibernation comes after it.
    ///
    /// Comparisons are exact and untrimmed (spec section 2, input
    /// normalisation); absent and empty annotations are alike.
    ///
    /// [`watched_since_new`]: Self::watched_since_new
    /// [`last_vm`]: Self::last_vm
    /// [`wake_vm`]: Self::wake_vm
    pub fn observe(&mut self, pod: &PodInput, live: bool) -> bool {
        let lifecycle = pod.annotation(keys::LIFECYCLE_STATE);
        let first = std::mem::take(&mut self.fresh);
        if !live {
            self.watched_since_new = false;
        } else if first && lifecycle.is_empty() {
            self.watched_since_new = true;
        }

        let before = (
            self.last_vm.clone(),
            self.hibernated,
            self.wake_vm.clone(),
            self.marker.clone(),
            self.hibernate_failed_vm.clone(),
        );
        let id = pod.annotation(annotations::VM_ID);
        let id_before = self.last_vm.clone();
        let hibernation = lifecycle == Lifecycle::Hibernated.as_str()
            || ((pod.annotation(annotations::HIBERNATE) == "true"
                || lifecycle == Lifecycle::Hibernating.as_str())
                && id.is_empty());
        if let Ok(id) = VmId::parse(id) {
            if self.last_vm.as_deref() != Some(id.as_str()) {
                if self.hibernated && !hibernation {
                    self.wake_vm = Some(id.as_str().to_owned());
                }
                self.hibernated = false;
                self.last_vm = Some(id.as_str().to_owned());
            } else if !hibernation {
                self.hibernated = false;
            }
        }
        if hibernation {
            self.hibernated = true;
        }
        if let Ok(id) = VmId::parse(id) {
            // A marker speaks for the VM only when the pod showed the same
            // id before: upstream removes the marker before it writes a
            // new VM's id, so a marker beside a new id is the old VM's
            // (its removal failed). Nor for a VM the host wrote another
            // VM's marker after.
            let state = pod.annotation(keys::POST_CLONE_STATE);
            if crate::lifecycle::PostCloneState::parse(state).is_some()
                && id_before.as_deref() == Some(id.as_str())
                && self.marker_vm.as_deref().is_none_or(|m| m == id.as_str())
            {
                self.marker = Some(MarkerSeen {
                    vm: id.as_str().to_owned(),
                    state: state.to_owned(),
                });
            }
        }
        if lifecycle == Lifecycle::Failed.as_str()
            && pod
                .annotation(keys::LIFECYCLE_MESSAGE)
                .starts_with(HIBERNATE_FAILED_PREFIX)
        {
            let vm = VmId::parse(id)
                .ok()
                .map(|id| id.as_str().to_owned())
                .or_else(|| self.last_vm.clone());
            if vm.is_some() {
                self.hibernate_failed_vm = vm;
            }
        }
        before
            != (
                self.last_vm.clone(),
                self.hibernated,
                self.wake_vm.clone(),
                self.marker.clone(),
                self.hibernate_failed_vm.clone(),
            )
    }

    /// Rule 3 of spec section 2: history says `vm` came from a wake. True
    /// when `vm` is the [`wake_vm`](Self::wake_vm) the pod showed after a
    /// recorded hibernation, or when a hibernation is recorded and `vm` is
    /// not the [`last_vm`](Self::last_vm) it came after (the VM bound by
    /// name before the pod shows its id; with no id ever seen, any VM).
    pub fn history_says_wake(&self, vm: &VmId) -> bool {
        let vm = Some(vm.as_str());
        self.wake_vm.as_deref() == vm || (self.hibernated && self.last_vm.as_deref() != vm)
    }

    /// The stored verdict if it is about `vm`; a verdict about another VM
    /// of the pod says nothing about this one.
    pub fn verdict_for(&self, vm: &VmId) -> Option<&WakeVerdict> {
        self.verdict.as_ref().filter(|v| v.vm == vm.as_str())
    }

    /// Keep the verdict the decision reached for `vm` (wake or not follows
    /// from `by`: [`Evidence::says_wake`]), replacing any other. Returns
    /// whether the record changed (then it is saved).
    pub fn set_verdict(&mut self, vm: &VmId, by: Evidence) -> bool {
        let verdict = WakeVerdict {
            vm: vm.as_str().to_owned(),
            wake: by.says_wake(),
            by,
        };
        if self.verdict.as_ref() == Some(&verdict) {
            return false;
        }
        self.verdict = Some(verdict);
        true
    }

    /// Note that the host wrote `post-clone-state` = `state` for `vm`.
    /// Returns whether the record changed (then it is saved).
    pub fn set_marker(&mut self, vm: &VmId, state: &str) -> bool {
        let marker = Some(MarkerSeen {
            vm: vm.as_str().to_owned(),
            state: state.to_owned(),
        });
        if self.marker_vm.as_deref() == Some(vm.as_str()) && self.marker == marker {
            return false;
        }
        self.marker_vm = Some(vm.as_str().to_owned());
        self.marker = marker;
        true
    }

    /// Whether the pod's `post-clone-state` may be taken as `vm`'s: true
    /// when the record does not know which VM it was written for, or knows
    /// it was `vm`; false when the host's record says it wrote it for
    /// another VM (spec section 2: such a marker does not apply to a woken
    /// VM; upstream removes it when a wake starts, and this covers a
    /// removal that failed).
    pub fn marker_applies(&self, vm: &VmId) -> bool {
        self.marker_vm
            .as_deref()
            .is_none_or(|marker| marker == vm.as_str())
    }

    /// The retry budget of `vm`'s fixup loop: the stored one if it is
    /// `vm`'s (resumed work keeps its first attempt's time and its
    /// attempts), else a new one starting at `now_unix_ms`, which drops a
    /// budget kept for another VM. The caller saves the record after
    /// [`Budget::add_attempt`].
    pub fn start_or_resume(&mut self, vm: &VmId, now_unix_ms: u64) -> &mut Budget {
        let budget = match self.budget.take() {
            Some(budget) if budget.vm() == vm.as_str() => budget,
            _ => Budget::new(vm, now_unix_ms),
        };
        self.budget.insert(budget)
    }

    /// When the decision first saw `vm` bound to the pod: the stored time
    /// if the record's VM is `vm`, else `now_unix_ms`, kept (replacing
    /// another VM's). Returns the time and whether the record changed.
    pub fn first_seen(&mut self, vm: &VmId, now_unix_ms: u64) -> (u64, bool) {
        match &self.vm_seen {
            Some(seen) if seen.vm == vm.as_str() => (seen.at_unix_ms, false),
            _ => {
                self.vm_seen = Some(VmSeen {
                    vm: vm.as_str().to_owned(),
                    at_unix_ms: now_unix_ms,
                });
                (now_unix_ms, true)
            }
        }
    }

    /// Take from `task` (a copy of this record a pod's task changed) what
    /// the task keeps: the verdict, the marker's VM, the budget and the
    /// time a VM was first seen; what the host's watch keeps (the last VM
    /// id, the hibernation, the woken VM) stays as it is here, so neither
    /// loses the other's changes.
    ///
    /// A copy that is not newer than the record ([`revise`](Self::revise))
    /// is an older write arriving late: nothing is taken. Returns whether
    /// anything was.
    pub fn take_task_parts(&mut self, task: &PodMemory) -> bool {
        if task.revision <= self.revision {
            return false;
        }
        self.verdict.clone_from(&task.verdict);
        self.marker_vm.clone_from(&task.marker_vm);
        if task.marker.is_some() {
            self.marker.clone_from(&task.marker);
        }
        self.budget.clone_from(&task.budget);
        self.vm_seen.clone_from(&task.vm_seen);
        self.revision = task.revision;
        true
    }

    /// A task changed its copy of the record: the copy is now newer than
    /// the one it was read from.
    pub fn revise(&mut self) {
        self.revision = self.revision.saturating_add(1);
    }

    /// Say whether the host's watch has seen the pod without a gap since
    /// it was new (the watch keeps this in memory: it is never stored).
    /// The record is then no longer the host's first sight of the pod.
    pub fn set_watched_since_new(&mut self, watched: bool) {
        self.watched_since_new = watched;
        self.fresh = false;
    }

    /// The stored budget if it is `vm`'s.
    pub fn budget_for(&self, vm: &VmId) -> Option<&Budget> {
        self.budget.as_ref().filter(|b| b.vm() == vm.as_str())
    }

    /// The stored budget if it is `vm`'s, to change.
    pub fn budget_mut_for(&mut self, vm: &VmId) -> Option<&mut Budget> {
        self.budget.as_mut().filter(|b| b.vm() == vm.as_str())
    }

    /// The loop ended (success, exhaustion, or work the decision dropped):
    /// forget its budget. Returns whether the record changed.
    pub fn end_budget(&mut self) -> bool {
        self.budget.take().is_some()
    }

    /// Whether the record keeps nothing durable (no VM seen, no
    /// hibernation, verdict, marker or budget): such a record is no file.
    pub fn is_empty(&self) -> bool {
        self.last_vm.is_none()
            && !self.hibernated
            && self.wake_vm.is_none()
            && self.verdict.is_none()
            && self.marker_vm.is_none()
            && self.marker.is_none()
            && self.hibernate_failed_vm.is_none()
            && self.budget.is_none()
            && self.vm_seen.is_none()
    }

    /// The record as stored: compact JSON.
    pub fn to_json(&self) -> Result<Vec<u8>, RecordError> {
        serde_json::to_vec(self).map_err(RecordError::Encode)
    }

    /// A stored record, checked: its version must be [`RECORD_VERSION`],
    /// every VM id valid, the verdict consistent and the budget within its
    /// bounds. Nothing in it is trusted until it passes. The record read
    /// is not new and not watched since new: a restart is a gap.
    pub fn from_json(bytes: &[u8]) -> Result<Self, RecordError> {
        /// The version alone, so that another version's shape is never
        /// parsed as this one's.
        #[derive(Deserialize)]
        struct Head {
            version: Option<u32>,
        }
        let head: Head = serde_json::from_slice(bytes).map_err(RecordError::Malformed)?;
        match head.version {
            Some(RECORD_VERSION) => {}
            Some(found) => return Err(RecordError::Version { found }),
            None => return Err(RecordError::NoVersion),
        }
        let memory: PodMemory = serde_json::from_slice(bytes).map_err(RecordError::Malformed)?;
        memory.check()?;
        Ok(memory)
    }

    /// The invariants [`from_json`](Self::from_json) checks.
    fn check(&self) -> Result<(), RecordError> {
        let id = |field: &'static str, value: Option<&str>| match value {
            Some(value) => VmId::parse(value)
                .map(drop)
                .map_err(|e| RecordError::Invalid {
                    field,
                    why: format!("is not a VM id ({e})"),
                }),
            None => Ok(()),
        };
        id("last_vm", self.last_vm.as_deref())?;
        id("wake_vm", self.wake_vm.as_deref())?;
        id("marker_vm", self.marker_vm.as_deref())?;
        id("hibernate_failed_vm", self.hibernate_failed_vm.as_deref())?;
        if let Some(marker) = &self.marker {
            id("marker.vm", Some(&marker.vm))?;
            if crate::lifecycle::PostCloneState::parse(&marker.state).is_none() {
                return Err(RecordError::Invalid {
                    field: "marker.state",
                    why: format!("is {:?}, not running, done or failed", marker.state),
                });
            }
        }
        if let Some(verdict) = &self.verdict {
            id("verdict.vm", Some(&verdict.vm))?;
            if verdict.wake != verdict.by.says_wake() {
                return Err(RecordError::Invalid {
                    field: "verdict",
                    why: format!(
                        "says wake={} by {:?}, which says the opposite",
                        verdict.wake, verdict.by
                    ),
                });
            }
        }
        if let Some(seen) = &self.vm_seen {
            id("vm_seen.vm", Some(&seen.vm))?;
        }
        if let Some(budget) = &self.budget {
            id("budget.vm", Some(budget.vm()))?;
            budget.check().map_err(|why| RecordError::Invalid {
                field: "budget",
                why,
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rstest::rstest;

    use super::*;

    /// A pod whose annotations are `spec`: `,`-separated `key=value`
    /// pairs, nothing trimmed, with the keys `id` (`vm.cocoonstack.io/id`),
    /// `hib` (`vm.cocoonstack.io/hibernate`) and `lc` (the lifecycle).
    fn pod(spec: &str) -> PodInput {
        let annotations = spec
            .split(',')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (key, value) = pair.split_once('=').expect("key=value");
                let key = match key {
                    "id" => annotations::VM_ID,
                    "hib" => annotations::HIBERNATE,
                    "lc" => keys::LIFECYCLE_STATE,
                    "msg" => keys::LIFECYCLE_MESSAGE,
                    "pcs" => keys::POST_CLONE_STATE,
                    other => panic!("unknown key {other}"),
                };
                (key.to_owned(), value.to_owned())
            })
            .collect::<BTreeMap<_, _>>();
        PodInput {
            name: "agent-0".into(),
            namespace: "prod".into(),
            uid: Some("0b7c-uid".into()),
            annotations,
            deleting: false,
            resource_version: None,
        }
    }

    fn vm(id: &str) -> VmId {
        VmId::parse(id).unwrap()
    }

    /// A record that has seen `history`, each observation live.
    fn after(history: &[&str]) -> PodMemory {
        let mut memory = PodMemory::new();
        for seen in history {
            memory.observe(&pod(seen), true);
        }
        memory
    }

    /// Rule 3's recording rules, observation by observation: what the
    /// record holds after the pod showed each annotation set in turn.
    #[rstest]
    #[case::first_id(&["id=vm-a"], Some("vm-a"), false, None)]
    #[case::hibernate_requested_id_still_there_records_nothing(
        &["id=vm-a", "id=vm-a,hib=true"], Some("vm-a"), false, None)]
    #[case::hibernating_id_still_there_records_nothing(
        &["id=vm-a", "id=vm-a,lc=hibernating"], Some("vm-a"), false, None)]
    #[case::hibernate_requested_id_gone(
        &["id=vm-a", "hib=true"], Some("vm-a"), true, None)]
    #[case::hibernating_id_gone(
        &["id=vm-a", "lc=hibernating"], Some("vm-a"), true, None)]
    #[case::hibernated_lifecycle_even_with_the_id(
        &["id=vm-a", "id=vm-a,lc=hibernated"], Some("vm-a"), true, None)]
    #[case::hibernated_lifecycle(
        &["id=vm-a", "lc=hibernated"], Some("vm-a"), true, None)]
    #[case::hibernate_not_exactly_true(
        &["id=vm-a", "hib=True"], Some("vm-a"), false, None)]
    #[case::hibernate_with_white_space(
        &["id=vm-a", "hib= true"], Some("vm-a"), false, None)]
    #[case::lifecycle_not_exact(
        &["id=vm-a", "lc=Hibernated"], Some("vm-a"), false, None)]
    #[case::id_removed_then_a_new_id_is_a_wake(
        &["id=vm-a", "hib=true", "lc=hibernated", "lc=creating", "id=vm-b,lc=creating"],
        Some("vm-b"), false, Some("vm-b"))]
    #[case::same_id_back_after_a_failed_hibernation(
        &["id=vm-a", "hib=true", "id=vm-a,hib=true"], Some("vm-a"), false, None)]
    #[case::then_a_new_id_is_no_wake(
        &["id=vm-a", "hib=true", "id=vm-a", "id=vm-b"], Some("vm-b"), false, None)]
    #[case::new_id_without_hibernation_is_no_wake(
        &["id=vm-a", "id=vm-b"], Some("vm-b"), false, None)]
    #[case::first_seen_hibernated_then_any_id_is_a_wake(
        &["lc=hibernated", "id=vm-b"], Some("vm-b"), false, Some("vm-b"))]
    #[case::a_new_id_shown_hibernated_is_the_vm_hibernating(
        &["id=vm-a", "hib=true", "id=vm-b,lc=hibernated"], Some("vm-b"), true, None)]
    #[case::the_wake_stays_through_a_later_id(
        &["id=vm-a", "hib=true", "id=vm-b", "id=vm-c"], Some("vm-c"), false, Some("vm-b"))]
    #[case::an_invalid_id_is_no_vm(
        &["id=vm-a", "id=../etc"], Some("vm-a"), false, None)]
    #[case::an_invalid_id_is_still_an_id_left(
        &["id=vm-a", "id=-x,hib=true"], Some("vm-a"), false, None)]
    fn observations_record_hibernations_and_wakes(
        #[case] history: &[&str],
        #[case] last_vm: Option<&str>,
        #[case] hibernated: bool,
        #[case] wake_vm: Option<&str>,
    ) {
        let memory = after(history);
        assert_eq!(memory.last_vm(), last_vm, "last_vm");
        assert_eq!(memory.hibernated(), hibernated, "hibernated");
        assert_eq!(memory.wake_vm(), wake_vm, "wake_vm");
    }

    #[test]
    fn observe_says_whether_anything_durable_changed() {
        let mut memory = PodMemory::new();
        assert!(!memory.observe(&pod(""), true), "nothing durable");
        assert!(memory.observe(&pod("id=vm-a"), true));
        assert!(!memory.observe(&pod("id=vm-a,lc=ready"), true));
        assert!(memory.observe(&pod("hib=true"), true));
        assert!(!memory.observe(&pod("lc=hibernated"), true));
        assert!(memory.observe(&pod("id=vm-b"), true));
        assert!(!memory.observe(&pod("id=vm-b"), true));
    }

    /// Spec section 7: the last marker seen for a VM, and the VM whose
    /// hibernation failed, as the watch notes them.
    #[rstest]
    #[case::a_marker_of_the_vm_it_shows(&["id=vm-a", "id=vm-a,pcs=done"], Some(("vm-a", "done")), None)]
    #[case::the_latest_marker(&["id=vm-a", "id=vm-a,pcs=running", "id=vm-a,pcs=failed"], Some(("vm-a", "failed")), None)]
    #[case::not_at_first_sight(&["id=vm-a,pcs=done"], None, None)]
    #[case::not_beside_a_new_id(&["id=vm-a", "id=vm-b,pcs=done"], None, None)]
    #[case::an_unknown_marker_is_none(&["id=vm-a", "id=vm-a,pcs=bogus"], None, None)]
    #[case::kept_when_the_marker_goes(&["id=vm-a", "id=vm-a,pcs=done", "id=vm-a"], Some(("vm-a", "done")), None)]
    #[case::a_failed_hibernate(
        &["id=vm-a", "id=vm-a,pcs=done", "id=vm-a,lc=failed,msg=hibernate: push failed"],
        Some(("vm-a", "done")), Some("vm-a"))]
    #[case::a_failed_hibernate_without_the_id(
        &["id=vm-a", "lc=failed,msg=hibernate: snapshot failed"], None, Some("vm-a"))]
    #[case::another_failure_is_no_hibernate(
        &["id=vm-a", "id=vm-a,lc=failed,msg=clone vk-x: dhcp lease not observed within 45s"], None, None)]
    #[case::the_prefix_is_exact(&["id=vm-a", "id=vm-a,lc=failed,msg=Hibernate: x"], None, None)]
    #[case::a_hibernate_message_on_another_state(&["id=vm-a", "id=vm-a,lc=creating,msg=hibernate: x"], None, None)]
    fn observations_note_markers_and_failed_hibernates(
        #[case] history: &[&str],
        #[case] marker: Option<(&str, &str)>,
        #[case] hibernate_failed: Option<&str>,
    ) {
        let memory = after(history);
        assert_eq!(
            memory.marker().map(|m| (m.vm.as_str(), m.state.as_str())),
            marker
        );
        assert_eq!(memory.hibernate_failed_vm(), hibernate_failed);
        if let Some(failed) = hibernate_failed {
            assert!(memory.lifted(&vm(failed)));
            assert!(!memory.lifted(&vm("vm-other")));
        }
    }

    #[test]
    fn a_marker_of_another_vm_the_host_wrote_is_not_taken_for_this_one() {
        let mut memory = after(&["id=vm-b"]);
        memory.set_marker(&vm("vm-a"), "done");
        memory.observe(&pod("id=vm-b,pcs=done"), true);
        assert_eq!(memory.marker_for(&vm("vm-b")), None);
        assert_eq!(memory.marker_for(&vm("vm-a")), Some("done"));
    }

    /// Rule 3 as the decision asks it, for the VM bound to the pod.
    #[rstest]
    #[case::no_history(&["id=vm-a"], "vm-a", false)]
    #[case::recorded_wake(&["id=vm-a", "hib=true", "id=vm-b"], "vm-b", true)]
    #[case::the_old_vm_is_no_wake(&["id=vm-a", "hib=true", "id=vm-b"], "vm-a", false)]
    #[case::bound_by_name_before_the_id_shows(&["id=vm-a", "hib=true", "lc=creating"], "vm-b", true)]
    #[case::the_hibernating_vm_itself(&["id=vm-a", "hib=true"], "vm-a", false)]
    #[case::failed_hibernation(&["id=vm-a", "hib=true", "id=vm-a"], "vm-a", false)]
    #[case::hibernated_before_any_id(&["lc=hibernated"], "vm-b", true)]
    fn history_says_wake(#[case] history: &[&str], #[case] bound: &str, #[case] wake: bool) {
        assert_eq!(after(history).history_says_wake(&vm(bound)), wake);
    }

    /// Watched since new: only a live first sight without a lifecycle
    /// starts it; anything that is not live, or a re-list, ends it.
    #[rstest]
    #[case::new_pod_live(&[(true, "")], true)]
    #[case::new_pod_empty_lifecycle(&[(true, "lc=")], true)]
    #[case::first_seen_creating(&[(true, "lc=creating")], false)]
    #[case::first_seen_in_a_list(&[(false, "")], false)]
    #[case::stays_while_live(&[(true, ""), (true, "lc=creating"), (true, "id=vm-a,lc=ready")], true)]
    #[case::a_list_ends_it(&[(true, ""), (false, "lc=creating")], false)]
    #[case::not_started_by_a_later_empty_lifecycle(&[(false, ""), (true, "")], false)]
    fn watched_since_new(#[case] seen: &[(bool, &str)], #[case] watched: bool) {
        let mut memory = PodMemory::new();
        for (live, spec) in seen {
            memory.observe(&pod(spec), *live);
        }
        assert_eq!(memory.watched_since_new(), watched);
    }

    #[test]
    fn a_gap_ends_watched_since_new() {
        let mut memory = PodMemory::new();
        memory.observe(&pod(""), true);
        assert!(memory.watched_since_new());
        memory.gap();
        assert!(!memory.watched_since_new());
        memory.observe(&pod(""), true);
        assert!(!memory.watched_since_new(), "only a first sight starts it");
    }

    #[test]
    fn a_record_read_back_is_not_watched_since_new_nor_new() {
        let mut memory = PodMemory::new();
        memory.observe(&pod(""), true);
        memory.observe(&pod("id=vm-a"), true);
        assert!(memory.watched_since_new());
        let mut read = PodMemory::from_json(&memory.to_json().unwrap()).unwrap();
        assert!(!read.watched_since_new());
        assert_eq!(read.last_vm(), Some("vm-a"));
        read.observe(&pod("id=vm-a"), true);
        assert!(!read.watched_since_new(), "a read record is not new");
    }

    #[rstest]
    #[case::annotation(Evidence::Annotation, true)]
    #[case::events(Evidence::Events, true)]
    #[case::history(Evidence::History, true)]
    #[case::no_evidence(Evidence::NoEvidence, false)]
    #[case::grace(Evidence::Grace, false)]
    fn verdicts_are_kept_for_their_vm(#[case] by: Evidence, #[case] wake: bool) {
        let mut memory = PodMemory::new();
        assert!(memory.verdict_for(&vm("vm-a")).is_none());
        assert!(memory.set_verdict(&vm("vm-a"), by));
        assert!(!memory.set_verdict(&vm("vm-a"), by), "unchanged");
        let verdict = memory.verdict_for(&vm("vm-a")).unwrap();
        assert_eq!((verdict.wake, verdict.by), (wake, by));
        assert!(memory.verdict_for(&vm("vm-b")).is_none(), "another VM's");
        let read = PodMemory::from_json(&memory.to_json().unwrap()).unwrap();
        assert_eq!(read.verdict_for(&vm("vm-a")), Some(verdict));
        assert!(memory.set_verdict(&vm("vm-b"), Evidence::History));
        assert!(memory.verdict_for(&vm("vm-a")).is_none(), "replaced");
    }

    #[rstest]
    #[case::unknown(None, "vm-a", true)]
    #[case::this_vm(Some("vm-a"), "vm-a", true)]
    #[case::an_earlier_vm(Some("vm-a"), "vm-b", false)]
    fn marker_applies(#[case] written_for: Option<&str>, #[case] now: &str, #[case] applies: bool) {
        let mut memory = PodMemory::new();
        if let Some(written_for) = written_for {
            assert!(memory.set_marker(&vm(written_for), "done"));
            assert!(!memory.set_marker(&vm(written_for), "done"), "unchanged");
        }
        assert_eq!(memory.marker_applies(&vm(now)), applies);
    }

    #[test]
    fn a_budget_resumes_for_its_vm_and_is_dropped_for_another() {
        let mut memory = PodMemory::new();
        let a = vm("vm-a");
        memory
            .start_or_resume(&a, 1_000)
            .add_attempt("attempt 1: boom");
        let resumed = memory.start_or_resume(&a, 50_000);
        assert_eq!(resumed.first_attempt_unix_ms(), 1_000, "kept");
        assert_eq!(resumed.attempts(), 1);
        let read = PodMemory::from_json(&memory.to_json().unwrap()).unwrap();
        assert_eq!(read.budget_for(&a), memory.budget_for(&a), "durable");

        let b = vm("vm-b");
        assert!(memory.budget_for(&b).is_none());
        let fresh = memory.start_or_resume(&b, 90_000);
        assert_eq!(
            (fresh.vm(), fresh.first_attempt_unix_ms(), fresh.attempts()),
            ("vm-b", 90_000, 0)
        );
        assert!(fresh.errors().is_empty());
        assert!(memory.budget_for(&a).is_none(), "vm-a's budget dropped");
        assert!(memory.end_budget());
        assert!(!memory.end_budget());
    }

    #[rstest]
    #[case::not_json(r#"{"version":1,"#, "not a record")]
    #[case::no_version(r#"{"last_vm":"vm-a"}"#, "no version")]
    #[case::other_version(r#"{"version":2,"last_vm":["a"]}"#, "version 2")]
    #[case::version_of_the_wrong_type(r#"{"version":"1"}"#, "not a record")]
    #[case::bad_vm_id(r#"{"version":1,"last_vm":"../x"}"#, "last_vm is not a VM id")]
    #[case::long_vm_id(&format!(r#"{{"version":1,"marker_vm":"{}"}}"#, "a".repeat(129)), "marker_vm is not a VM id")]
    #[case::inconsistent_verdict(
        r#"{"version":1,"verdict":{"vm":"vm-a","wake":true,"by":"grace"}}"#,
        "verdict says wake=true"
    )]
    #[case::unknown_evidence(
        r#"{"version":1,"verdict":{"vm":"vm-a","wake":true,"by":"rumour"}}"#,
        "not a record"
    )]
    #[case::too_many_errors(
        &format!(r#"{{"version":1,"budget":{{"vm":"vm-a","first_attempt_unix_ms":1,"attempts":40,"errors":{}}}}}"#,
            serde_json::to_string(&vec!["x"; 33]).unwrap()),
        "budget")]
    #[case::more_errors_than_attempts(
        r#"{"version":1,"budget":{"vm":"vm-a","first_attempt_unix_ms":1,"attempts":0,"errors":["x"]}}"#,
        "budget")]
    fn a_record_that_is_not_ours_is_refused(#[case] text: &str, #[case] says: &str) {
        let err = PodMemory::from_json(text.as_bytes()).unwrap_err();
        assert!(err.to_string().contains(says), "{err}");
        assert!(err.to_string().contains("written anew"), "{err}");
    }

    #[test]
    fn unknown_fields_of_this_version_are_ignored() {
        let read = PodMemory::from_json(br#"{"version":1,"last_vm":"vm-a","later":true}"#).unwrap();
        assert_eq!(read.last_vm(), Some("vm-a"));
    }

    /// The largest record the rules allow fits the store's 16 KiB with
    /// room to spare: every VM id at its 128-byte limit, the error chain
    /// full of characters JSON escapes.
    #[test]
    fn the_largest_record_fits_a_store_record() {
        let long = vm(&"v".repeat(crate::facts::MAX_VM_ID_LEN));
        let mut memory = PodMemory::new();
        memory.observe(&pod(&format!("id={long}")), true);
        memory.observe(&pod("hib=true"), true);
        memory.observe(&pod(&format!("id={}", "w".repeat(128))), true);
        memory.set_verdict(&long, Evidence::NoEvidence);
        memory.set_marker(&long, "running");
        memory.observe(
            &PodInput {
                annotations: [
                    (keys::LIFECYCLE_STATE.to_owned(), "failed".to_owned()),
                    (annotations::VM_ID.to_owned(), long.as_str().to_owned()),
                    (
                        keys::LIFECYCLE_MESSAGE.to_owned(),
                        format!("hibernate: {}", "x".repeat(4000)),
                    ),
                ]
                .into(),
                ..pod("")
            },
            true,
        );
        assert!(memory.lifted(&long));
        let budget = memory.start_or_resume(&long, u64::MAX);
        for _ in 0..100 {
            budget.add_attempt(&"\"\\".repeat(1000));
        }
        let json = memory.to_json().unwrap();
        assert!(json.len() <= store::MAX_RECORD_BYTES, "{}", json.len());
        assert!(json.len() < 10 * 1024, "{}", json.len());
        PodMemory::from_json(&json).expect("reads back");
    }
}
