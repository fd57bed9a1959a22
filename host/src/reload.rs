//! Plugin reload for `serve`: a changed plugin set goes into service
//! without a restart, only after it passed the same gate as a start and
//! the plugins' own case files, and a new plugin version that fails where
//! its predecessor succeeded is rolled back.
//!
//! - **Watch.** The plugin directory and the configuration file are looked
//!   at every [`ReloadConfig::interval`] (names, sizes, modification times;
//!   `NAME.cases/` folders included). When anything changed, a new planner
//!   is built from the configuration as it is now ([`Build`]), beside the
//!   one in service.
//! - **Gate.** The new set is refused, and the one in service keeps
//!   serving, when a plugin file does not load (contract, allow-list,
//!   guest policy, conflicts), when a plugin's code does not link, when a
//!   new or changed plugin file has case files beside it
//!   (`acme.wasm` and `acme.cases/`) and one of them fails, or when a file
//!   is the very version a rollback quarantined. A refusal is logged,
//!   counted (`plugin_reloads_total{result="rejected"}`) and shown in
//!   `/healthz`'s detail until a reload succeeds.
//! - **Swap.** The gate passed, the new planner replaces the old one at
//!   once ([`Host::swap_planner`]). A call that already planned keeps its
//!   plan; the next plan is the new planner's.
//! - **Rollback.** For each new or changed plugin the first
//!   [`ReloadConfig::watch_fixups`] fixups that use it are watched. When
//!   more than [`ReloadConfig::max_failure_ratio`] of them fail (an
//!   exhausted fixup, a plan the plugin could not make, the built-in
//!   taking its place) while the version it replaced had succeeded on the
//!   same scenario since this daemon started, the planner the reload
//!   replaced comes back, with a log line, `plugin_rollbacks_total` and
//!   `/healthz`'s detail, and the new file's digest is quarantined: the
//!   directory is not loaded again while that file is in it unchanged.
//!   The whole reload is undone; the other files it changed are loaded
//!   again at the next change.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use crate::classify::Scenario;
use crate::cocoon::Cocoon;
use crate::host::{FixupRecord, Host};
use crate::kit::{TestOptions, test_plugin};
use crate::metrics::Metrics;
use crate::planner::Planner;
use crate::plugin::{EngineOptions, LoadedPlugin, Origin};
use crate::pods::PodApi;

/// How often the plugin directory and the configuration file are looked
/// at; `--plugin-reload-interval`, 0 turns reloading off.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(2);

/// Fixups watched after a new plugin version goes into service;
/// `--plugin-rollback-after`.
pub const DEFAULT_WATCH_FIXUPS: u32 = 10;

/// The share of watched fixups that may fail before a new version is
/// rolled back; `--plugin-rollback-failure-ratio`.
pub const DEFAULT_MAX_FAILURE_RATIO: f64 = 0.5;

/// How reloads and rollbacks behave.
#[derive(Debug, Clone, PartialEq)]
pub struct ReloadConfig {
    /// Zero: no reloading.
    pub interval: Duration,
    pub watch_fixups: u32,
    pub max_failure_ratio: f64,
}

impl Default for ReloadConfig {
    fn default() -> Self {
        ReloadConfig {
            interval: DEFAULT_INTERVAL,
            watch_fixups: DEFAULT_WATCH_FIXUPS,
            max_failure_ratio: DEFAULT_MAX_FAILURE_RATIO,
        }
    }
}

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

/// What a path looked like: per file under it, its size and modification
/// time.
type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>)>;

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
    let Ok(meta) = std::fs::metadata(path) else {
        seen.push((path.to_owned(), 0, None));
        return;
    };
    seen.push((path.to_owned(), meta.len(), meta.modified().ok()));
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
    seen: u32,
    failed: u32,
    /// The scenarios of its failures (`None`: not known).
    failed_on: BTreeSet<Option<Scenario>>,
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
            succeeded: BTreeSet::new(),
        }
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
        let mut tick = tokio::time::interval(self.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                Some(record) = outcomes.recv() => self.observe(record),
                _ = tick.tick() => {
                    let now = fingerprint(&self.watched);
                    if now != seen {
                        seen = now;
                        self.reload().await;
                    }
                }
            }
        }
    }

    /// Build, gate and swap in the plugin set on disk now.
    pub async fn reload(&mut self) {
        match self.candidate().await {
            Ok((planner, changed)) => self.swap(planner, changed),
            Err(reason) => {
                tracing::error!(
                    "plugin reload refused, the plugins in service keep serving: {reason}"
                );
                self.metrics.plugin_reload("rejected");
                self.metrics
                    .set_health_detail(Some(format!("plugin reload refused: {reason}")));
            }
        }
    }

    /// The gate: a planner whose every file loaded and linked, no
    /// quarantined file among its changes, and every changed file's case
    /// files passed.
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
        let changed = changed_files(&self.host.planner(), &planner);
        for (plugin, _) in &changed {
            if self.quarantine.contains(&plugin.sha256) {
                return Err(format!(
                    "{} ({}, sha256 {}) was rolled back and is quarantined: replace the file with another version, or restore the previous one",
                    plugin.info.name, plugin.origin, plugin.sha256
                ));
            }
        }
        for (plugin, _) in &changed {
            let Origin::File(path) = &plugin.origin else {
                continue;
            };
            let cases = cases_dir(path);
            if !cases.is_dir() {
                continue;
            }
            let (engine, file, folder) = (engine.clone(), path.clone(), cases.clone());
            let report = tokio::task::spawn_blocking(move || {
                test_plugin(engine, &file, &folder, TestOptions::default())
            })
            .await
            .map_err(|e| format!("running the case files of {}: {e}", plugin.info.name))?
            .map_err(|e| format!("the case files of {}: {e}", plugin.info.name))?;
            if !report.success() {
                let first = report
                    .cases
                    .iter()
                    .find(|c| c.status != crate::kit::Status::Pass)
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
        self.metrics.plugin_reload("swapped");
        self.metrics.set_health_detail(None);
        let plugins: Vec<Watched> = changed
            .into_iter()
            .filter(|_| self.config.watch_fixups > 0)
            .map(|(p, replaced)| Watched {
                name: p.info.name.clone(),
                version: p.info.version.clone(),
                sha256: p.sha256.clone(),
                replaced,
                seen: 0,
                failed: 0,
                failed_on: BTreeSet::new(),
            })
            .collect();
        self.watch = (!plugins.is_empty()).then_some(Watch { previous, plugins });
    }

    /// Count one fixup's outcome, and roll back a watched version that
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
            w.seen += 1;
            if !used.succeeded {
                w.failed += 1;
                w.failed_on.insert(used.scenario);
            }
            if w.failed > allowed && bad.is_none() {
                bad = Some(w.name.clone());
            }
        }
        let watch_fixups = self.config.watch_fixups;
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
                "plugin {} {} failed {} of its first {} fixups, but the version it replaced never succeeded on those scenarios here: kept",
                w.name, w.version, w.failed, w.seen
            );
            let watch = self.watch.as_mut().expect("watching");
            watch.plugins.retain(|w| w.name != name);
        }
        let watch = self.watch.as_mut().expect("watching");
        watch.plugins.retain(|w| {
            let done = w.seen >= watch_fixups;
            if done {
                tracing::info!(plugin = %w.name, "plugin {} {} passed its first {} fixups ({} failed)", w.name, w.version, w.seen, w.failed);
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
        let message = format!(
            "plugin {} {} (sha256 {}) failed {} of its first {} fixups where the version it replaced (sha256 {}) had succeeded: rolled back to the previous plugin set; the file is quarantined until it changes",
            w.name,
            w.version,
            short(&w.sha256),
            w.failed,
            w.seen,
            w.replaced.as_deref().map_or("?", short),
        );
        tracing::error!(plugin = %w.name, "{message}");
        self.metrics.plugin_rollback(&w.name);
        self.metrics.set_health_detail(Some(message));
    }
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

fn short(sha256: &str) -> &str {
    sha256.get(..12).unwrap_or(sha256)
}
