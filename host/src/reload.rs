//! Plugin reload for `serve`: a changed plugin set goes into service
//! without a restart, only after it passed the same gate as a start and
//! the plugins' own case files, and a new plugin version that fails where
//! its predecessor succeeded is rolled back.
//!
//! - **Watch.** The plugin directory and the configuration file are looked
//!   at every [`ReloadConfig::interval`] (names, sizes, modification and
//!   change times, inodes; `NAME.cases/` folders included). When anything
//!   changed and then stayed as it is for one more interval, a new planner
//!   is built from the configuration as it is now ([`Build`]), beside the
//!   one in service; if the files change again while it is built, it is
//!   dropped and built again once they settle.
//! - **Gate.** The new set is refused, and the one in service keeps
//!   serving, when a plugin file does not load (contract, allow-list,
//!   guest policy, conflicts), when a plugin's code does not link, when it
//!   would drop the allow-list in force (that takes a restart), when a
//!   plugin file has case files beside it (`acme.wasm` and `acme.cases/`,
//!   under the trust rules of plugin files, at most [`MAX_CASES`] files of
//!   at most [`MAX_CASE_BYTES`] each) and one of them fails, or when a
//!   changed file is the very version a rollback quarantined. A refusal is
//!   logged, counted (`plugin_reload_total{result="rejected"}`) and shown
//!   in `/healthz`'s detail until a reload succeeds.
//! - **Swap.** The gate passed, the new planner replaces the old one at
//!   once ([`Host::swap_planner`]). A call that already planned keeps its
//!   plan; the next plan is the new planner's.
//! - **Rollback.** For each new or changed plugin the first
//!   [`ReloadConfig::watch_fixups`] pods it plans for are watched (each pod
//!   once). A pod counts as a failure when the plugin misbehaved for it (a
//!   trap, a breach of a limit or its policy, `unsupported`; under the
//!   failure policy `fallback` as much as without it); what the guest then
//!   does with a plan is not counted, since a pod's owner controls the
//!   guest. When more than [`ReloadConfig::max_failure_ratio`] of them
//!   fail while the version it replaced had planned the same scenario
//!   since this daemon started, and the failures come from at least
//!   [`ReloadConfig::min_namespaces`] namespaces, each counting for at most
//!   its share (a pod's owner controls its facts: one tenant must not roll
//!   a version back for everyone), the planner in service before the watch
//!   began comes back, with a log line, `plugin_rollbacks_total` and
//!   `/healthz`'s detail, and the new file's digest is quarantined: the
//!   directory is not loaded again while that file is in it unchanged.
//!   Every reload since the watch began is undone, settings included; the
//!   other files come back with the next reload. The quarantine is kept in
//!   a file ([`QuarantineFile`]) and holds across restarts, until
//!   `cocoon-fixup plugin quarantine --release` removes a digest: the file
//!   is watched with the plugin files, so the change reloads the set. A
//!   watch lives in memory.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use crate::cocoon::Cocoon;
use crate::host::{FixupRecord, Host};
use crate::metrics::Metrics;
use crate::pods::PodApi;
use fixup_core::classify::Scenario;
use fixup_core::planner::Planner;
use fixup_core::plugin::quarantine::QuarantineFile;
use fixup_core::plugin::trusted::TrustedDir;
use fixup_core::plugin::{EngineOptions, LoadedPlugin, Origin};
use fixup_kit::{TestOptions, test_plugin};

/// How often the plugin directory and the configuration file are looked
/// at; `--plugin-reload-interval`, 0 turns reloading off.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(2);

/// Pods watched after a new plugin version goes into service;
/// `--plugin-rollback-after`.
pub const DEFAULT_WATCH_FIXUPS: u32 = 10;

/// The share of watched fixups that may fail before a new version is
/// rolled back; `--plugin-rollback-failure-ratio`.
pub const DEFAULT_MAX_FAILURE_RATIO: f64 = 0.5;

/// The fewest namespaces whose pods must fail for a rollback;
/// `--plugin-rollback-min-namespaces`.
pub const DEFAULT_MIN_NAMESPACES: u32 = 2;

/// How reloads and rollbacks behave.
#[derive(Debug, Clone, PartialEq)]
pub struct ReloadConfig {
    /// Zero: no reloading.
    pub interval: Duration,
    pub watch_fixups: u32,
    pub max_failure_ratio: f64,
    /// A rollback takes failures from at least this many namespaces, and
    /// each namespace counts for at most its share of them (module docs).
    pub min_namespaces: u32,
}

impl Default for ReloadConfig {
    fn default() -> Self {
        ReloadConfig {
            interval: DEFAULT_INTERVAL,
            watch_fixups: DEFAULT_WATCH_FIXUPS,
            max_failure_ratio: DEFAULT_MAX_FAILURE_RATIO,
            min_namespaces: DEFAULT_MIN_NAMESPACES,
        }
    }
}

/// The most case files a plugin's `NAME.cases/` may hold for the gate.
pub const MAX_CASES: usize = 256;

/// The largest case file the gate reads.
pub const MAX_CASE_BYTES: u64 = 1 << 20;

/// The longest reason `/healthz` and the log repeat from a refused reload.
const DETAIL_MAX: usize = 2048;

/// A planner built from the configuration on disk now, and the engine
/// options its plugins' case files are run with.
#[derive(Debug)]
pub struct Candidate {
    pub planner: Planner,
    pub engine: EngineOptions,
}

/// Builds a [`Candidate`]: reads the configuration, pulls what it pins,
/// loads every plugin. Any plugin file that does not load is an error (the
/// reload is refused), with the reasons. Runs on a blocking thread.
pub type Build = Arc<dyn Fn() -> Result<Candidate, String> + Send + Sync>;

/// What a path looked like: per file under it, its size, modification
/// time, inode and change time (a copy that keeps the size and the
/// modification time still gets a new change time).
type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>, u64, i64, i64)>;

fn fingerprint(paths: &[PathBuf]) -> Fingerprint {
    let mut seen = Vec::new();
    for path in paths {
        walk(path, 0, &mut seen);
    }
    seen.sort();
    seen
}

/// The plugin directory, its `*.cases/` folders, and the files in them.
fn walk(path: &Path, depth: u8, seen: &mut Fingerprint) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else {
        seen.push((path.to_owned(), 0, None, 0, 0, 0));
        return;
    };
    seen.push((
        path.to_owned(),
        meta.len(),
        meta.modified().ok(),
        meta.ino(),
        meta.ctime(),
        meta.ctime_nsec(),
    ));
    if meta.is_dir()
        && depth < 2
        && let Ok(entries) = std::fs::read_dir(path)
    {
        for entry in entries.flatten() {
            walk(&entry.path(), depth + 1, seen);
        }
    }
}

/// A plugin file's case folder: `acme.cases/` beside `acme.wasm`.
pub fn cases_dir(plugin: &Path) -> PathBuf {
    plugin.with_extension("cases")
}

/// The plugin files of `new` that `old` does not have at the same digest,
/// each with the digest of the file of that name `old` had, if any.
fn changed_files(old: &Planner, new: &Planner) -> Vec<(Arc<LoadedPlugin>, Option<String>)> {
    let files = |p: &Planner| -> BTreeMap<String, Arc<LoadedPlugin>> {
        p.plugins()
            .registry()
            .plugins()
            .iter()
            .filter(|p| matches!(p.origin, Origin::File(_)))
            .map(|p| (p.info.name.clone(), p.clone()))
            .collect()
    };
    let before = files(old);
    files(new)
        .into_values()
        .filter_map(|plugin| match before.get(&plugin.info.name) {
            Some(was) if was.sha256 == plugin.sha256 => None,
            Some(was) => Some((plugin, Some(was.sha256.clone()))),
            None => Some((plugin, None)),
        })
        .collect()
}

/// One new plugin version under watch.
#[derive(Debug)]
struct Watched {
    name: String,
    version: String,
    sha256: String,
    /// The digest of the version it replaced; `None` for a new plugin,
    /// which has nothing to roll back to.
    replaced: Option<String>,
    /// The pods counted (each once).
    pods: BTreeSet<String>,
    failed: u32,
    /// Its failures by the namespace of their pods.
    failed_in: BTreeMap<String, u32>,
    /// Whether it was said that its failures are too few namespaces'.
    held: bool,
    /// The scenarios of its failures (`None`: not known).
    failed_on: BTreeSet<Option<Scenario>>,
}

impl Watched {
    /// "plugin NAME VERSION (sha256 ...) failed for F of its first P pods".
    fn failures(&self) -> String {
        format!(
            "plugin {} {} (sha256 {}) failed for {} of its first {} pods",
            self.name,
            self.version,
            short(&self.sha256),
            self.failed,
            self.pods.len()
        )
    }

    /// The namespaces of its failures, joined by `, `.
    fn namespaces(&self) -> String {
        let namespaces: Vec<&str> = self.failed_in.keys().map(String::as_str).collect();
        namespaces.join(", ")
    }

    /// Whether its failures roll it back: more than `allowed` of them,
    /// counting each namespace's for at most `ceil((allowed + 1) /
    /// min_namespaces)`, from at least `min_namespaces` namespaces. So no
    /// namespace (a tenant, and every owner in it) makes up more than its
    /// share of a rollback.
    fn fails(&self, allowed: u32, min_namespaces: u32) -> bool {
        let min_namespaces = min_namespaces.max(1);
        let share = (allowed + 1).div_ceil(min_namespaces);
        let counted: u32 = self.failed_in.values().map(|&n| n.min(share)).sum();
        counted > allowed && self.failed_in.len() >= min_namespaces as usize
    }
}

/// The reload that put the watched versions in service.
#[derive(Debug)]
struct Watch {
    previous: Arc<Planner>,
    plugins: Vec<Watched>,
}

impl<C, P> std::fmt::Debug for Reloader<C, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("watched", &self.watched)
            .field("config", &self.config)
            .field("watch", &self.watch)
            .field("quarantine", &self.quarantine)
            .finish_non_exhaustive()
    }
}

/// Watches the plugin set and reloads it (see the module docs).
pub struct Reloader<C, P> {
    host: Arc<Host<C, P>>,
    metrics: Arc<Metrics>,
    build: Build,
    watched: Vec<PathBuf>,
    config: ReloadConfig,
    watch: Option<Watch>,
    /// Plugin digests a rollback took out of service.
    quarantine: BTreeSet<String>,
    /// Where they are kept across restarts; what it lists is read again
    /// before each reload, so a release is seen.
    quarantine_file: Option<QuarantineFile>,
    /// Digests quarantined here that the file could not record.
    unrecorded: BTreeSet<String>,
    /// Set when this reloader wrote the quarantine file itself: its own
    /// write is no change to reload for.
    wrote_quarantine: bool,
    /// `(plugin, digest, scenario)` of every plugin part that succeeded.
    succeeded: BTreeSet<(String, String, Option<Scenario>)>,
}

impl<C: Cocoon, P: PodApi> Reloader<C, P> {
    /// A reloader for `host`, looking at `watched` (the plugin directory
    /// and the configuration file).
    pub fn new(
        host: Arc<Host<C, P>>,
        build: Build,
        watched: Vec<PathBuf>,
        config: ReloadConfig,
    ) -> Self {
        Reloader {
            metrics: host.metrics_handle(),
            host,
            build,
            watched,
            config,
            watch: None,
            quarantine: BTreeSet::new(),
            quarantine_file: None,
            unrecorded: BTreeSet::new(),
            wrote_quarantine: false,
            succeeded: BTreeSet::new(),
        }
    }

    /// Keep quarantined digests in `file` too, and start from what it
    /// lists; the file is looked at like the plugin files, and a change to
    /// it (a release) reloads the set.
    pub fn with_quarantine_file(mut self, file: QuarantineFile) -> Self {
        self.quarantine = file.read();
        if !self.watched.contains(&file.path()) {
            self.watched.push(file.path());
        }
        self.quarantine_file = Some(file);
        self
    }

    /// Watch until `shutdown`. Fixup outcomes come from `outcomes` (the
    /// host's [`Host::report_outcomes_to`]).
    pub async fn run(
        mut self,
        mut outcomes: UnboundedReceiver<FixupRecord>,
        shutdown: CancellationToken,
    ) {
        if self.config.interval.is_zero() {
            return;
        }
        let mut seen = fingerprint(&self.watched);
        let mut settled = true;
        let mut tick = tokio::time::interval(self.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                Some(record) = outcomes.recv() => {
                    self.observe(record);
                    if std::mem::take(&mut self.wrote_quarantine)
                        && let Some(file) = &self.quarantine_file
                    {
                        // Only the quarantine file's own entry is taken as
                        // seen: any other change still reloads.
                        let path = file.path();
                        seen.retain(|entry| entry.0 != path);
                        seen.extend(fingerprint(std::slice::from_ref(&path)));
                        seen.sort();
                    }
                }
                _ = tick.tick() => {
                    let now = fingerprint(&self.watched);
                    if now != seen {
                        // Changed: wait until it stays as it is.
                        seen = now;
                        settled = false;
                    } else if !settled {
                        settled = true;
                        let reloaded = tokio::select! {
                            () = shutdown.cancelled() => break,
                            r = self.reload_unless_changed(&seen) => r,
                        };
                        if !reloaded {
                            // Changed while being built: build it again
                            // once it settles.
                            seen = fingerprint(&self.watched);
                            settled = false;
                        }
                    }
                }
            }
        }
    }

    /// Build, gate and swap in the plugin set on disk now.
    pub async fn reload(&mut self) {
        let now = fingerprint(&self.watched);
        self.reload_unless_changed(&now).await;
    }

    /// As [`reload`](Self::reload), but a set whose files no longer look
    /// like `expected` once it is built is dropped (`false`): it may have
    /// been read half-written.
    async fn reload_unless_changed(&mut self, expected: &Fingerprint) -> bool {
        if let Some(file) = &self.quarantine_file {
            match file.try_read() {
                Ok(listed) => self.quarantine = &listed | &self.unrecorded,
                // What was quarantined stays so: an unreadable file
                // releases nothing.
                Err(e) => tracing::warn!(
                    "quarantine file not read again, the digests quarantined so far stay so: {e}"
                ),
            }
        }
        let candidate = self.candidate().await;
        if fingerprint(&self.watched) != *expected {
            tracing::info!(
                "plugin files changed while being loaded; loading them again once they settle"
            );
            return false;
        }
        match candidate {
            Ok((planner, changed)) => self.swap(planner, changed),
            Err(reason) => {
                let reason = fixup_core::annotations::cap_utf8(
                    fixup_core::facts::escape_controls(&reason),
                    DETAIL_MAX,
                    "… [truncated]",
                );
                tracing::error!(
                    "plugin reload refused, the plugins in service keep serving: {reason}"
                );
                // The health detail first: whoever sees the count sees
                // the detail too.
                self.metrics
                    .set_health_detail(Some(format!("plugin reload refused: {reason}")));
                self.metrics.plugin_reload("rejected");
            }
        }
        true
    }

    /// The gate: a planner whose every file loaded and linked, that keeps
    /// the allow-list in force, no quarantined file among its changes, and
    /// every plugin file's case files passed.
    async fn candidate(
        &self,
    ) -> Result<(Planner, Vec<(Arc<LoadedPlugin>, Option<String>)>), String> {
        let build = self.build.clone();
        let Candidate { planner, engine } =
            tokio::task::spawn_blocking(move || build())
                .await
                .map_err(|e| format!("building the plugin set: {e}"))??;
        let planner = tokio::task::spawn_blocking(move || {
            let unlinked: Vec<String> = planner
                .plugins()
                .warm()
                .iter()
                .map(ToString::to_string)
                .collect();
            if unlinked.is_empty() {
                Ok(planner)
            } else {
                Err(unlinked.join("; "))
            }
        })
        .await
        .map_err(|e| format!("linking the plugin set: {e}"))??;
        let serving = self.host.planner();
        if serving.plugins().allow_list().is_some() && planner.plugins().allow_list().is_none() {
            return Err("the configuration no longer has `allowed_plugins`: a reload does not drop the allow-list in force (restart the daemon to do that); if the file was being written, write it to a temporary name and rename it into place".to_owned());
        }
        let changed = changed_files(&serving, &planner);
        for (plugin, _) in &changed {
            if self.quarantine.contains(&plugin.sha256) {
                return Err(format!(
                    "{} ({}, sha256 {}) was rolled back and is quarantined: replace the file with another version, or restore the previous one; `cocoon-fixup plugin quarantine --release {}` loads it again",
                    plugin.info.name, plugin.origin, plugin.sha256, plugin.sha256
                ));
            }
        }
        let files: Vec<Arc<LoadedPlugin>> = planner
            .plugins()
            .registry()
            .plugins()
            .iter()
            .filter(|p| matches!(p.origin, Origin::File(_)))
            .cloned()
            .collect();
        for plugin in files {
            run_cases(&plugin, &engine).await?;
        }
        Ok((planner, changed))
    }

    fn swap(&mut self, planner: Planner, changed: Vec<(Arc<LoadedPlugin>, Option<String>)>) {
        let previous = self.host.swap_planner(Arc::new(planner));
        let names: Vec<String> = changed
            .iter()
            .map(|(p, _)| {
                format!(
                    "{} {} (sha256 {})",
                    p.info.name,
                    p.info.version,
                    short(&p.sha256)
                )
            })
            .collect();
        tracing::info!(changed = %names.join(", "), "plugin set reloaded");
        self.metrics.set_health_detail(None);
        self.metrics.plugin_reload("swapped");
        if changed.is_empty() {
            // Something beside the plugin files changed (the
            // configuration, a trusted key): the set in service before a
            // running watch began was accepted under what was there then,
            // and is no longer a rollback target the node may return to
            // (a key removed since may be the one that signed it).
            if let Some(watch) = self.watch.take() {
                let names: Vec<&str> = watch.plugins.iter().map(|w| w.name.as_str()).collect();
                tracing::info!(
                    "the watch of {} ends without a rollback target: the reload changed the configuration or its keys, not the plugins",
                    names.join(", ")
                );
            }
            return;
        }
        if self.config.watch_fixups == 0 {
            return;
        }
        // A watch already running goes on: its rollback target stays the
        // set in service before it began, and a plugin that changed again
        // is watched afresh against the version that set had.
        let watch = self.watch.get_or_insert_with(|| Watch {
            previous,
            plugins: Vec::new(),
        });
        for (p, replaced) in changed {
            let replaced = match watch.plugins.iter().position(|w| w.name == p.info.name) {
                Some(i) => watch.plugins.remove(i).replaced,
                None => replaced,
            };
            watch.plugins.push(Watched {
                name: p.info.name.clone(),
                version: p.info.version.clone(),
                sha256: p.sha256.clone(),
                replaced,
                pods: BTreeSet::new(),
                failed: 0,
                failed_in: BTreeMap::new(),
                held: false,
                failed_on: BTreeSet::new(),
            });
        }
    }

    /// Count one pod's planning, and roll back a watched version that
    /// failed too often.
    pub fn observe(&mut self, record: FixupRecord) {
        for used in &record.plugins {
            if used.succeeded {
                self.succeeded
                    .insert((used.name.clone(), used.sha256.clone(), used.scenario));
            }
        }
        let Some(watch) = &mut self.watch else {
            return;
        };
        let allowed =
            (f64::from(self.config.watch_fixups) * self.config.max_failure_ratio).floor() as u32;
        let mut bad = None;
        for used in &record.plugins {
            let Some(w) = watch
                .plugins
                .iter_mut()
                .find(|w| w.name == used.name && w.sha256 == used.sha256)
            else {
                continue;
            };
            if !w.pods.insert(record.pod.clone()) {
                continue;
            }
            if !used.succeeded {
                w.failed += 1;
                *w.failed_in.entry(record.namespace.clone()).or_default() += 1;
                w.failed_on.insert(used.scenario);
            }
            if w.fails(allowed, self.config.min_namespaces) {
                if bad.is_none() {
                    bad = Some(w.name.clone());
                }
            } else if w.failed > allowed && !w.held {
                w.held = true;
                tracing::warn!(
                    plugin = %w.name,
                    "{}, but in namespaces {}: a rollback takes failures in at least {} namespaces, none counting for more than its share (--plugin-rollback-min-namespaces); kept",
                    w.failures(),
                    w.namespaces(),
                    self.config.min_namespaces
                );
            }
        }
        let watch_fixups = self.config.watch_fixups as usize;
        if let Some(name) = bad {
            let w = watch
                .plugins
                .iter()
                .find(|w| w.name == name)
                .expect("the bad version is watched");
            if succeeded_before(&self.succeeded, w) {
                self.roll_back(&name);
                return;
            }
            tracing::warn!(
                plugin = %w.name,
                "plugin {} {} failed for {} of its first {} pods, but the version it replaced never planned those scenarios here: kept",
                w.name, w.version, w.failed, w.pods.len()
            );
            let watch = self.watch.as_mut().expect("watching");
            watch.plugins.retain(|w| w.name != name);
        }
        let watch = self.watch.as_mut().expect("watching");
        let metrics = &self.metrics;
        let min_namespaces = self.config.min_namespaces;
        watch.plugins.retain(|w| {
            let done = w.pods.len() >= watch_fixups;
            if done && w.held {
                let message = format!(
                    "{}, in namespaces {}: kept, since a rollback takes failures in at least {min_namespaces} namespaces, none counting for more than its share (--plugin-rollback-min-namespaces)",
                    w.failures(),
                    w.namespaces()
                );
                tracing::warn!(plugin = %w.name, "{message}");
                metrics.set_health_detail(Some(cap_detail(&message)));
            } else if done {
                tracing::info!(plugin = %w.name, "plugin {} {} passed its first {} pods ({} failed)", w.name, w.version, w.pods.len(), w.failed);
            }
            !done
        });
        if watch.plugins.is_empty() {
            self.watch = None;
        }
    }

    fn roll_back(&mut self, name: &str) {
        let Some(watch) = self.watch.take() else {
            return;
        };
        let w = watch
            .plugins
            .iter()
            .find(|w| w.name == name)
            .expect("the bad version is watched");
        self.host.swap_planner(watch.previous.clone());
        self.quarantine.insert(w.sha256.clone());
        let when = jiff::Timestamp::now()
            .round(jiff::Unit::Second)
            .unwrap_or_else(|_| jiff::Timestamp::now());
        let comment = format!(
            "{} rolled back at {when}, in namespaces {}",
            w.failures(),
            w.namespaces()
        );
        if let Some(file) = &self.quarantine_file
            && let Err(e) = file
                .add(&w.sha256, &comment)
                .inspect(|()| self.wrote_quarantine = true)
        {
            self.unrecorded.insert(w.sha256.clone());
            tracing::error!(
                file = %file.path().display(),
                "cannot record the quarantine ({e}): after a restart the rolled-back file is loaded again unless it is replaced"
            );
        }
        let message = format!(
            "{} where the version it replaced (sha256 {}) had planned, in namespaces {}: rolled back to the plugin set in service before; the file is quarantined until it changes or `cocoon-fixup plugin quarantine --release {}` releases it",
            w.failures(),
            w.replaced.as_deref().map_or("?", short),
            w.namespaces(),
            w.sha256,
        );
        tracing::error!(plugin = %w.name, "{message}");
        self.metrics.plugin_rollback(&w.name);
        self.metrics.set_health_detail(Some(cap_detail(&message)));
    }
}

/// Run a plugin file's case files (`NAME.cases/` beside it), if it has
/// any, against the file: refused when the folder or a case file breaks the
/// trust rules of plugin files, there are more than [`MAX_CASES`], one is
/// larger than [`MAX_CASE_BYTES`], the file tested is not the one loaded,
/// or a case fails.
async fn run_cases(plugin: &LoadedPlugin, engine: &EngineOptions) -> Result<(), String> {
    let Origin::File(path) = &plugin.origin else {
        return Ok(());
    };
    let cases = cases_dir(path);
    if !cases.is_dir() {
        return Ok(());
    }
    let name = &plugin.info.name;
    let dir = TrustedDir::open(&cases).map_err(|e| format!("the case files of {name}: {e}"))?;
    let entries = dir
        .entries(".json")
        .map_err(|e| format!("the case files of {name}: {e}"))?;
    if entries.len() > MAX_CASES {
        return Err(format!(
            "{}: {} case files, more than the {MAX_CASES} a reload runs",
            cases.display(),
            entries.len()
        ));
    }
    for (file, _) in &entries {
        let (_, stat) = dir
            .open_file(file)
            .map_err(|e| format!("the case files of {name}: {e}"))?
            .ok_or_else(|| format!("{}: vanished", cases.join(file).display()))?;
        if u64::try_from(stat.st_size).unwrap_or(u64::MAX) > MAX_CASE_BYTES {
            return Err(format!(
                "{}: larger than the {MAX_CASE_BYTES} bytes a case file may have",
                cases.join(file).display()
            ));
        }
    }
    let (engine, file, folder) = (engine.clone(), path.clone(), cases.clone());
    let report = tokio::task::spawn_blocking(move || {
        test_plugin(engine, &file, &folder, TestOptions::default())
    })
    .await
    .map_err(|e| format!("running the case files of {name}: {e}"))?
    .map_err(|e| format!("the case files of {name}: {e}"))?;
    if report.plugin.sha256 != plugin.sha256 {
        return Err(format!(
            "{} changed while its case files ran",
            path.display()
        ));
    }
    if !report.success() {
        let first = report
            .cases
            .iter()
            .find(|c| c.status != fixup_kit::Status::Pass)
            .map(|c| {
                format!(
                    "{}: {}",
                    c.name,
                    c.message.as_deref().unwrap_or("does not match")
                )
            })
            .unwrap_or_default();
        return Err(format!(
            "{} {}: {} of {} case files in {} failed (first: {first})",
            plugin.info.name,
            plugin.info.version,
            report.failed,
            report.cases.len(),
            cases.display()
        ));
    }
    Ok(())
}

/// Whether the version `w` replaced succeeded here on a scenario `w`
/// failed on (any scenario, for a failure whose scenario is not known).
fn succeeded_before(succeeded: &BTreeSet<(String, String, Option<Scenario>)>, w: &Watched) -> bool {
    let Some(replaced) = &w.replaced else {
        return false;
    };
    succeeded.iter().any(|(name, sha, scenario)| {
        name == &w.name
            && sha == replaced
            && (w.failed_on.contains(&None) || w.failed_on.contains(scenario))
    })
}

/// A `/healthz` detail within [`DETAIL_MAX`].
fn cap_detail(text: &str) -> String {
    fixup_core::annotations::cap_utf8(
        fixup_core::facts::escape_controls(text),
        DETAIL_MAX,
        "… [truncated]",
    )
}

fn short(sha256: &str) -> &str {
    sha256.get(..12).unwrap_or(sha256)
}
