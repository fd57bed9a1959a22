//! Plan plugins: the only module that knows wasmtime.
//!
//! One [`Engine`] (component model, fuel metering, pooling allocator) per
//! [`PluginHost`]. Each plugin file is read only from a place only root or
//! the host's user can write ([`trusted`]), compiled once (or loaded from
//! the authenticated precompiled [`cache`]), checked against the contract,
//! linked with the
//! host's `log` and nothing else (see [`sandbox`]), and kept as an
//! `InstancePre`. Every call gets a fresh Store with its own limits.
//! [`registry`] decides which plugin serves a scenario and flavour.
//!
//! With the cache, a plugin seen before is registered from its describe
//! record ([`cache`]) and its `InstancePre` is made at its first call, so
//! a one-shot `plan` loads the code of only the plugins it calls;
//! [`PluginHost::warm`] links every plugin up front, as the daemon does.

pub mod builtin;
pub mod cache;
pub mod contract;
mod features;
pub mod quarantine;
pub mod registry;
pub mod sandbox;
pub mod trusted;

mod call;
mod error;
mod load;

use call::call;
pub use error::PluginError;
use load::{
    CORE_MODULE_HEADER, DescribeRecord, HOST_VERSION, check_contract, denied_import_fix, describe,
    each_plugin_file, is_component, plugin_text, record_of,
};
pub use load::{
    LoadError, LoadFailure, PluginDir, check_plugin_dir, read_plugin_dir, read_trusted,
};

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, Trap};

use crate::classify::Scenario;
use crate::facts::{FactError, Flavor, VmFacts};
use crate::plan::policy::{Breach, GuestPolicy, PolicyError, PolicySource};
use crate::plan::{Plan, PlanError};

use cache::ArtifactCache;
use contract::{Contract, GENERATOR_EXPORT, Pre};
pub use registry::{Registry, Selection};
pub use sandbox::Limits;
use sandbox::{CallState, DeniedImport, LogFloodHit, MemoryLimitHit};
use trusted::{TrustedDir, Untrusted};

/// Plugin instances that may exist at once (one per concurrent call). The
/// pooling allocator reserves their slots up front. The daemon reserves
/// twice `--concurrency`, at least this many.
pub const DEFAULT_SLOTS: u32 = 64;

/// The plugin memory limit a configuration may set, MiB.
pub const MEMORY_MIB_RANGE: std::ops::RangeInclusive<u32> = 1..=4096;

/// A plugin digest as the allow-list takes it: 64 hex digits, any case,
/// surrounding blanks ignored; lowercase out.
pub fn parse_sha256(s: &str) -> Result<String, String> {
    let lower = s.trim().to_ascii_lowercase();
    if lower.len() == 64 && lower.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(lower)
    } else {
        Err(format!(
            "{s:?} is not a sha256 digest (64 hex digits, as `cocoon-fixup plugin inspect` prints it)"
        ))
    }
}

/// Vendor plugins are loaded from here when it exists and no other
/// directory is given (the daemon, the CLI and the C library agree).
pub const DEFAULT_PLUGIN_DIR: &str = "/etc/cocoon-fixup/plugins";

/// How often the engine's epoch advances: the granularity of every plugin
/// call's wall-clock deadline ([`Limits::deadline`]). A thread per
/// [`PluginHost`] ticks it from the host's first plugin call and stops
/// when the host is dropped, whatever its [`Allocation`].
pub const EPOCH_TICK: std::time::Duration = std::time::Duration::from_millis(10);

/// Advances an engine's epoch every [`EPOCH_TICK`] until dropped.
struct EpochTicker {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl EpochTicker {
    fn start(engine: &Engine) -> Result<Self, PluginError> {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let engine = engine.clone();
        let stopped = stop.clone();
        std::thread::Builder::new()
            .name("cocoon-fixup-epoch".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(EPOCH_TICK);
                    // A ticker dropped while asleep (one of two started at
                    // once) must not tick: it would cut a call's deadline.
                    if stopped.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    engine.increment_epoch();
                }
            })
            .map_err(engine_error)?;
        Ok(EpochTicker { stop })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Where a plugin came from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Origin {
    /// Embedded in the binary.
    BuiltIn(String),
    /// Loaded from a file (a plugin directory or a path given by the user).
    File(PathBuf),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::BuiltIn(name) => write!(f, "built-in:{name}"),
            Origin::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// What a plugin says it is (its `describe` export), validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub contract: String,
    pub summary: String,
    pub scenarios: Vec<Scenario>,
    /// Empty: serves any flavour.
    pub flavors: Vec<Flavor>,
}

/// A plugin ready to be called.
pub struct LoadedPlugin {
    pub info: PluginInfo,
    pub origin: Origin,
    /// Lowercase hex sha256 of the `.wasm` file.
    pub sha256: String,
    /// Every import of the component, granted or denied.
    pub imports: Vec<String>,
    /// What its plans may do in the guest, and where that comes from.
    pub policy: GuestPolicy,
    pub policy_source: PolicySource,
    /// The operator's narrowing from the configuration file, checked as
    /// well as [`LoadedPlugin::policy`].
    pub narrowing: Option<GuestPolicy>,
    contract: Contract,
    /// Linked at load, or at the first call when the plugin was registered
    /// from its describe record ([`Lazy`]).
    pre: OnceLock<Pre>,
    lazy: Option<Lazy>,
}

/// What a plugin registered from its describe record needs to be linked
/// at its first call.
struct Lazy {
    engine: Engine,
    cache: Arc<ArtifactCache>,
    wasm: Wasm,
    /// Held while linking, so two first calls link once.
    linking: Mutex<()>,
}

/// A plugin's component bytes: the binary's own, or a copy of a file's.
#[derive(Clone)]
enum Wasm {
    Static(&'static [u8]),
    Shared(Arc<[u8]>),
}

impl Wasm {
    fn bytes(&self) -> &[u8] {
        match self {
            Wasm::Static(b) => b,
            Wasm::Shared(b) => b,
        }
    }
}

impl fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("info", &self.info)
            .field("origin", &self.origin)
            .field("sha256", &self.sha256)
            .field("policy", &self.policy)
            .field("narrowing", &self.narrowing)
            .finish_non_exhaustive()
    }
}

/// What one call used, against the limits.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CallStats {
    /// Wall time of the call, instantiation included.
    pub duration: std::time::Duration,
    pub fuel_used: u64,
    pub peak_memory_bytes: usize,
    pub logs: Vec<sandbox::LogLine>,
}

/// How the engine is set up.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub limits: Limits,
    /// Directory for precompiled plugins; `None` compiles every start.
    pub cache_dir: Option<PathBuf>,
    /// The key that authenticates cache entries; `None` is
    /// [`cache::default_key_path`]. Created on first use.
    pub cache_key: Option<PathBuf>,
    /// Concurrent instances the pooling allocator reserves.
    pub slots: u32,
    /// When set, only plugin files whose sha256 (lowercase hex) is listed
    /// are loaded; every other file is refused before it is compiled.
    /// Built-in plugins are part of the binary and always trusted.
    pub allowed_sha256: Option<std::collections::BTreeSet<String>>,
    /// The operator's narrowing of plugins' guest policies, by plugin name
    /// (`[plugin_policy.NAME]` in the configuration file). A plan must fit
    /// both the plugin's policy and this.
    pub narrowing: std::collections::BTreeMap<String, GuestPolicy>,
    /// Plugin file digests a rollback took out of service (`serve`'s
    /// quarantine file): such a file is refused before it is compiled.
    pub quarantined: std::collections::BTreeSet<String>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            limits: Limits::default(),
            cache_dir: None,
            cache_key: None,
            slots: DEFAULT_SLOTS,
            allowed_sha256: None,
            narrowing: std::collections::BTreeMap::new(),
            quarantined: std::collections::BTreeSet::new(),
        }
    }
}

/// How the engine allocates plugin instances. Either way a call has the
/// same limits (its Store's limiter and fuel) and makes the same plan;
/// the setting is not part of the cache's engine key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Allocation {
    /// Slots reserved up front ([`EngineOptions::slots`]) and reused: the
    /// cheapest calls, for a process that makes many (the daemon, `run`,
    /// an embedder).
    #[default]
    Pooling,
    /// Memory mapped for each instance when it is made: no pool to set up,
    /// for a process that makes a few calls and exits (`plan`, `capture`).
    /// Its calls' deadlines are kept by the epoch ticker thread, as a
    /// pooling host's are.
    OnDemand,
}

/// The engine and the plugins it has loaded.
pub struct PluginHost {
    engine: Engine,
    /// Started at the first plugin call: a process that calls none (a
    /// `plan` that needs no fixup) starts no thread.
    ticker: OnceLock<EpochTicker>,
    limits: Limits,
    slots: u32,
    in_flight: std::sync::atomic::AtomicUsize,
    allowed_sha256: Option<std::collections::BTreeSet<String>>,
    narrowing: std::collections::BTreeMap<String, GuestPolicy>,
    quarantined: std::collections::BTreeSet<String>,
    cache: Option<Arc<ArtifactCache>>,
    registry: Registry,
}

impl fmt::Debug for PluginHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginHost")
            .field("limits", &self.limits)
            .field("cache", &self.cache)
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

fn engine_error(e: impl fmt::Display) -> PluginError {
    PluginError::Engine {
        reason: e.to_string(),
    }
}

impl PluginHost {
    /// Build the engine, with the pooling allocator. No plugin is loaded
    /// yet.
    pub fn new(options: EngineOptions) -> Result<Self, PluginError> {
        Self::with_allocation(options, Allocation::Pooling)
    }

    /// [`new`](Self::new), allocating instances as `allocation` says.
    pub fn with_allocation(
        options: EngineOptions,
        allocation: Allocation,
    ) -> Result<Self, PluginError> {
        let mut config = Config::new();
        // Every WebAssembly proposal the plugins do not use is off
        // (features.rs; SECURITY.md, "Plugins are sandboxed").
        features::configure(&mut config);
        config.consume_fuel(true);
        config.epoch_interruption(true);
        // Native unwind tables (`.eh_frame`) serve only outside unwinders
        // (a debugger, `perf`); wasmtime's own traps and backtraces do not
        // use them, and registering them cost a `plan` process about
        // 0.1 ms (BENCHMARKS.md). Outside unwinders stop at the first
        // plugin frame (`perf --call-graph fp` still walks through it).
        config.native_unwind_info(false);
        let slots = options.slots.max(1);
        if allocation == Allocation::Pooling {
            config.allocation_strategy(InstanceAllocationStrategy::Pooling(Self::pool(
                slots,
                &options.limits,
            )));
        }
        Self::finish(&config, options, slots)
    }

    /// The pool of [`Allocation::Pooling`]: `slots` instances.
    fn pool(slots: u32, limits: &Limits) -> PoolingAllocationConfig {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(slots)
            .total_core_instances(slots.saturating_mul(8))
            .total_memories(slots.saturating_mul(2))
            .total_tables(slots.saturating_mul(8))
            .max_memory_size(limits.memory_bytes)
            // Measured (BENCHMARKS.md): keeping linear memory resident makes
            // every slot's first call fault in and zero 2 MiB (0.7 ms);
            // unmapping it and keeping the small tables resident instead
            // costs 29 us a call instead of 43 us, and a cached start of
            // the four built-ins about 3.6 ms instead of 7 ms.
            .linear_memory_keep_resident(0)
            .table_keep_resident(64 << 10);
        pool
    }

    /// The engine of `config` and its cache.
    fn finish(config: &Config, options: EngineOptions, slots: u32) -> Result<Self, PluginError> {
        let engine = Engine::new(config).map_err(engine_error)?;
        // The cache is an optimisation: one that is refused is a warning,
        // and every plugin is compiled instead.
        let cache = options.cache_dir.as_deref().and_then(|dir| {
            ArtifactCache::open(dir, options.cache_key.as_deref(), &engine)
                .inspect_err(|e| {
                    if e.is_refusal() {
                        tracing::warn!("{e}; plugins are compiled at every start instead");
                    } else {
                        cache::warn_once(format_args!(
                            "{e}; plugins are compiled at every start instead"
                        ));
                    }
                })
                .ok()
                .map(Arc::new)
        });
        Ok(PluginHost {
            engine,
            ticker: OnceLock::new(),
            limits: options.limits,
            slots,
            in_flight: std::sync::atomic::AtomicUsize::new(0),
            allowed_sha256: options.allowed_sha256,
            narrowing: options.narrowing,
            quarantined: options.quarantined,
            cache,
            registry: Registry::default(),
        })
    }

    /// The next call's deadline in epochs from now, kept by the ticker
    /// thread, started unless it runs: whole ticks, rounded up, and one
    /// more, since the first tick comes anywhere within a tick of the
    /// Store's start: the call stops never before its deadline and at most
    /// two ticks after it.
    fn deadline(&self) -> Result<u64, PluginError> {
        self.start_ticker()?;
        let ticks = self
            .limits
            .deadline
            .as_nanos()
            .div_ceil(EPOCH_TICK.as_nanos())
            .saturating_add(1);
        Ok(u64::try_from(ticks).unwrap_or(u64::MAX))
    }

    /// Start the epoch ticker unless it runs. (Two threads may both start
    /// one; the one not kept is dropped, which stops it.)
    fn start_ticker(&self) -> Result<(), PluginError> {
        if self.ticker.get().is_none() {
            let _ = self.ticker.set(EpochTicker::start(&self.engine)?);
        }
        Ok(())
    }

    /// The engine, for callers that manage their own cache.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Plugin instances that may exist at once ([`EngineOptions::slots`]):
    /// callers that call from several threads keep at most this many calls
    /// in flight.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Plugin calls running right now, `describe` at load included.
    pub fn calls_in_flight(&self) -> usize {
        self.in_flight.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The plugin allow-list in force (sha256 digests); `None`: every
    /// plugin file loads.
    pub fn allow_list(&self) -> Option<&std::collections::BTreeSet<String>> {
        self.allowed_sha256.as_ref()
    }

    /// Names in the operator's narrowing that no loaded plugin has: a typo
    /// or a renamed plugin, so the narrowing is not in force.
    pub fn unused_narrowings(&self) -> Vec<String> {
        self.narrowing
            .keys()
            .filter(|name| {
                !self
                    .registry
                    .plugins()
                    .iter()
                    .any(|p| &p.info.name == *name)
            })
            .cloned()
            .collect()
    }

    /// The precompiled cache in use: `None` without `cache_dir`, or when it
    /// was refused (a warning said why).
    pub fn cache(&self) -> Option<&ArtifactCache> {
        self.cache.as_deref()
    }

    /// Link every registered plugin that was registered from its describe
    /// record and not called yet: a daemon does this at start, so its first
    /// plans pay nothing extra and a plugin whose code cannot be loaded is
    /// found before any VM needs it. Returns every failure (empty: all
    /// linked); a plugin that failed stays registered and its pods wait
    /// with a node error naming it.
    pub fn warm(&self) -> Vec<PluginError> {
        self.registry
            .plugins()
            .iter()
            .filter_map(|plugin| plugin.pre().err())
            .collect()
    }

    /// Load the four built-in plugins. They are compiled into the binary,
    /// so a failure here is a build defect.
    pub fn load_builtins(&mut self) -> Result<(), LoadError> {
        for ((name, bytes), sha256) in builtin::BUILTINS.iter().zip(builtin::BUILTIN_SHA256) {
            let origin = Origin::BuiltIn((*name).to_owned());
            let plugin = self.prepare_wasm(origin, bytes, || Wasm::Static(bytes), Some(sha256))?;
            self.registry.add(plugin)?;
        }
        Ok(())
    }

    /// Load every `*.wasm` file in `dir`, in name order. One bad file never
    /// stops the others: each failure is returned, the rest are loaded.
    ///
    /// The directory and every directory above it must be root's or the
    /// host's user's and not writable by others, and each file a regular
    /// file of theirs, not writable by others and not a link ([`trusted`]).
    /// A directory that breaks the rule is one failure, for the directory,
    /// and none of its files is read; a file that breaks it is that file's
    /// failure. A directory that cannot be read at all is an error.
    pub fn load_dir(&mut self, dir: &Path) -> Result<Vec<LoadFailure>, PluginError> {
        let mut failures = Vec::new();
        let refused = each_plugin_file(dir, |path, bytes| {
            let loaded = bytes
                .and_then(|bytes| self.prepare(Origin::File(path.clone()), &bytes))
                .map_err(LoadError::from)
                .and_then(|plugin| Ok(self.registry.add(plugin)?));
            if let Err(error) = loaded {
                failures.push(LoadFailure { path, error });
            }
        })?;
        if let Some(e) = refused {
            failures.push(LoadFailure {
                path: dir.to_owned(),
                error: PluginError::Untrusted(e).into(),
            });
        }
        self.note_failures(&failures);
        Ok(failures)
    }

    /// Load the plugin files at `paths`, in that order, each as a file of
    /// the plugin directory is: the same trust rules, allow-list and
    /// guest policy. One bad file never stops the others: each failure is
    /// returned, the rest are loaded.
    pub fn load_files(&mut self, paths: &[PathBuf]) -> Vec<LoadFailure> {
        let mut failures = Vec::new();
        for path in paths {
            let loaded = read_trusted(path)
                .and_then(|bytes| self.prepare(Origin::File(path.clone()), &bytes))
                .map_err(LoadError::from)
                .and_then(|plugin| Ok(self.registry.add(plugin)?));
            if let Err(error) = loaded {
                failures.push(LoadFailure {
                    path: path.clone(),
                    error,
                });
            }
        }
        self.note_failures(&failures);
        failures
    }

    /// Remember failed files for the registry's messages.
    fn note_failures(&mut self, failures: &[LoadFailure]) {
        self.registry.note_failures(
            failures
                .iter()
                .map(|f| crate::facts::escape_controls(&f.text(&f.path.display().to_string()))),
        );
    }

    /// Load one plugin file and register it.
    pub fn load_file(&mut self, path: &Path) -> Result<Arc<LoadedPlugin>, LoadError> {
        let plugin = self.inspect_file(path)?;
        Ok(self.registry.add(plugin)?)
    }

    /// Read, compile, check and describe a plugin file without registering
    /// it (for `plugin inspect` and `plugin test`), its code loaded and
    /// linked even when its describe record is cached. The file and the
    /// directories above it must pass the rules of [`trusted`], as in
    /// [`load_dir`](Self::load_dir).
    pub fn inspect_file(&self, path: &Path) -> Result<LoadedPlugin, PluginError> {
        let bytes = read_trusted(path)?;
        let plugin = self.prepare(Origin::File(path.to_owned()), &bytes)?;
        plugin.link()?;
        Ok(plugin)
    }

    /// Compile (or load from cache), check the contract, link and describe;
    /// or, when the cache holds the plugin's describe record, register it
    /// from that and leave loading its code to its first call.
    pub fn prepare(&self, origin: Origin, bytes: &[u8]) -> Result<LoadedPlugin, PluginError> {
        self.prepare_wasm(origin, bytes, || Wasm::Shared(Arc::from(bytes)), None)
    }

    /// [`prepare`](Self::prepare); `keep` gives bytes the plugin can keep
    /// for its first call (made only when it is registered from its
    /// describe record); `sha256` is the bytes' digest when it is known
    /// already (the built-ins').
    fn prepare_wasm(
        &self,
        origin: Origin,
        bytes: &[u8],
        keep: impl FnOnce() -> Wasm,
        sha256: Option<&str>,
    ) -> Result<LoadedPlugin, PluginError> {
        if !is_component(bytes) {
            let detail = if bytes.starts_with(CORE_MODULE_HEADER) {
                " (it is a core module)"
            } else {
                ""
            };
            return Err(PluginError::NotAComponent { origin, detail });
        }
        let sha256 = match sha256 {
            Some(known) => known.to_owned(),
            None => hex::encode(Sha256::digest(bytes)),
        };
        if let (Origin::File(_), Some(allowed)) = (&origin, &self.allowed_sha256)
            && !allowed.contains(&sha256)
        {
            return Err(PluginError::NotAllowed { origin, sha256 });
        }
        if matches!(origin, Origin::File(_)) && self.quarantined.contains(&sha256) {
            return Err(PluginError::Quarantined { origin, sha256 });
        }
        if let Some(cache) = &self.cache
            && let Some(record) = cache.record(&sha256)
        {
            match Self::from_record(&record) {
                Ok((contract, imports, described)) => {
                    let lazy = Lazy {
                        engine: self.engine.clone(),
                        cache: cache.clone(),
                        wasm: keep(),
                        linking: Mutex::new(()),
                    };
                    return self.loaded(
                        origin,
                        sha256,
                        contract,
                        imports,
                        described,
                        None,
                        Some(lazy),
                    );
                }
                // Authentic but not what this host accepts (written by
                // another version of it): describe again, as on a miss.
                Err(e) => tracing::info!(
                    plugin = %origin,
                    "describe record not used ({e}); describing the plugin again"
                ),
            }
        }
        let component = match &self.cache {
            Some(cache) => cache.load_or_compile(&self.engine, bytes, &sha256),
            None => Component::new(&self.engine, bytes),
        }
        .map_err(|e| PluginError::Compile {
            origin: origin.clone(),
            reason: features::compile_reason(bytes, &e),
        })?;
        let version = check_contract(&self.engine, &component, &origin)?;

        let imports: Vec<String> = component
            .component_type()
            .imports(&self.engine)
            .map(|(name, _)| name.to_owned())
            .collect();
        let link = |e: wasmtime::Error| PluginError::Link {
            origin: origin.clone(),
            reason: format!("{e:#}"),
        };
        let pre = contract::link(&self.engine, &component, version).map_err(link)?;

        let label = origin.to_string();
        let (described, _) = {
            let _in_flight = InFlight::enter(&self.in_flight);
            let deadline = self.deadline()?;
            call(&self.engine, &self.limits, deadline, &label, |store| {
                pre.describe(store)
            })?
        };
        let record = record_of(version, &imports, &described);
        let loaded = self.loaded(origin, sha256, version, imports, described, Some(pre), None)?;
        if let Some(cache) = &self.cache {
            cache.store_record(&loaded.sha256, &record);
        }
        Ok(loaded)
    }

    /// Parse a describe record: the contract version, the imports and what
    /// `describe` returned, validated again by [`loaded`](Self::loaded).
    fn from_record(record: &[u8]) -> Result<(Contract, Vec<String>, contract::Described), String> {
        let record: DescribeRecord = serde_json::from_slice(record).map_err(|e| e.to_string())?;
        if record.host != HOST_VERSION {
            return Err(format!(
                "written by cocoon-fixup {}, this is {HOST_VERSION}",
                record.host
            ));
        }
        let version = Contract::parse(&record.contract)
            .ok_or_else(|| format!("contract {} is not served", record.contract))?;
        let mut scenarios = Vec::new();
        for s in &record.scenarios {
            let scenario = Scenario::ALL
                .into_iter()
                .find(|known| known.as_str() == s)
                .ok_or_else(|| format!("unknown scenario {s:?}"))?;
            scenarios.push(contract::scenario_to_wit(scenario));
        }
        Ok((
            version,
            record.imports,
            contract::Described {
                info: contract::WitPluginInfo {
                    name: record.name,
                    version: record.version,
                    contract: record.info_contract,
                    summary: record.summary,
                    scenarios,
                    flavors: record.flavors,
                },
                policy: record.policy,
            },
        ))
    }

    /// Validate what a plugin described and make it a [`LoadedPlugin`].
    #[allow(clippy::too_many_arguments)]
    fn loaded(
        &self,
        origin: Origin,
        sha256: String,
        version: Contract,
        imports: Vec<String>,
        described: contract::Described,
        pre: Option<Pre>,
        lazy: Option<Lazy>,
    ) -> Result<LoadedPlugin, PluginError> {
        let info = describe(described.info, &origin, version)?;
        // A built-in's name is the built-in's: a file may carry it only
        // when it is that built-in's very component (`plugin test` of the
        // built-in), so nothing else is ever attributed to a built-in (its
        // hint, events, metrics, `[plugin_policy.*]` and
        // `[plugin_failure]` keys).
        if matches!(origin, Origin::File(_))
            && let Some(i) = builtin::BUILTINS.iter().position(|(n, _)| *n == info.name)
            && builtin::BUILTIN_SHA256[i] != sha256
        {
            return Err(PluginError::BadDescription {
                plugin: info.name.clone(),
                reason: format!(
                    "{} is the name of a built-in plugin, and built-in names are reserved: give the plugin a name of its own (for example acme-{})",
                    info.name, info.name
                ),
            });
        }
        let (policy, policy_source) = match described.policy {
            Some(raw) => (
                GuestPolicy::parse(&raw).map_err(|source| PluginError::BadPolicy {
                    plugin: info.name.clone(),
                    source,
                })?,
                PolicySource::Declared,
            ),
            None => (
                GuestPolicy::contract_0_1_default(),
                PolicySource::ContractDefault,
            ),
        };
        let narrowing = self.narrowing.get(&info.name).cloned();
        tracing::debug!(
            from = %origin,
            sha256 = %sha256,
            code = if lazy.is_some() { "at its first call" } else { "linked" },
            "plugin {} {} registered (contract {})",
            info.name,
            info.version,
            info.contract
        );
        Ok(LoadedPlugin {
            info,
            origin,
            sha256,
            imports,
            policy,
            policy_source,
            narrowing,
            contract: version,
            pre: pre.map(OnceLock::from).unwrap_or_default(),
            lazy,
        })
    }

    /// Ask `plugin` for the plan of `scenario`. The plan is checked against
    /// the plan limits before it is returned.
    pub fn plan(
        &self,
        plugin: &LoadedPlugin,
        scenario: Scenario,
        facts: &VmFacts,
    ) -> Result<(Plan, CallStats), PluginError> {
        let name = plugin.info.name.as_str();
        tracing::debug!(
            plugin = name,
            scenario = scenario.as_str(),
            "asking for a plan"
        );
        let wit_facts = contract::facts_to_wit(facts);
        let wit_scenario = contract::scenario_to_wit(scenario);
        let (result, stats) = {
            let _in_flight = InFlight::enter(&self.in_flight);
            let pre = plugin.pre()?;
            let deadline = self.deadline()?;
            call(&self.engine, &self.limits, deadline, name, |store| {
                pre.plan(store, wit_scenario, &wit_facts)
            })?
        };
        let plan = match result {
            Ok(plan) => contract::plan_from_wit(plan),
            Err(contract::wit::PlanError::Unsupported(reason)) => {
                return Err(PluginError::Unsupported {
                    plugin: name.to_owned(),
                    scenario,
                    reason: plugin_text(&reason),
                });
            }
            Err(contract::wit::PlanError::InvalidFacts(f)) => {
                return Err(PluginError::InvalidFact {
                    plugin: name.to_owned(),
                    field: plugin_text(&f.field),
                    reason: plugin_text(&f.reason),
                });
            }
        };
        plan.check(&self.limits.plan)
            .and_then(|()| plan.check_reviewable())
            .and_then(|()| plan.check_nics(facts))
            .map_err(|source| PluginError::BadPlan {
                plugin: name.to_owned(),
                source,
            })?;
        plugin.check_policy(&plan)?;
        Ok((plan, stats))
    }
}

impl LoadedPlugin {
    /// The contract version the plugin was built against.
    pub fn contract(&self) -> &'static str {
        self.contract.version()
    }

    /// The imports its contract grants (for `plugin inspect`).
    pub fn granted_imports(&self) -> Vec<String> {
        self.contract.granted_imports()
    }

    /// Load and link its code now if it was registered from its describe
    /// record (`plugin inspect` does, so a file whose code cannot be
    /// loaded is not reported as fine).
    pub fn link(&self) -> Result<(), PluginError> {
        self.pre().map(|_| ())
    }

    /// Whether its code is loaded and linked (at load, or by a first call).
    pub fn is_linked(&self) -> bool {
        self.pre.get().is_some()
    }

    /// The linked plugin: linked now, from the cache, if it was registered
    /// from its describe record and this is its first call.
    fn pre(&self) -> Result<&Pre, PluginError> {
        if let Some(pre) = self.pre.get() {
            return Ok(pre);
        }
        let Some(lazy) = &self.lazy else {
            return Err(PluginError::Link {
                origin: self.origin.clone(),
                reason: "neither linked nor loadable".to_owned(),
            });
        };
        let _linking = lazy.linking.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pre) = self.pre.get() {
            return Ok(pre);
        }
        let not_loaded = |reason: String| PluginError::NotLoaded {
            origin: self.origin.clone(),
            reason,
            cache_files: lazy.cache.dir().join(format!("{}-*", self.sha256)),
        };
        let component = lazy
            .cache
            .load_or_compile(&lazy.engine, lazy.wasm.bytes(), &self.sha256)
            .map_err(|e| not_loaded(format!("{e:#}")))?;
        // The record is the host's own (authenticated, and of this host
        // version), so this holds unless someone holding the key wrote the
        // cache; then the plugin is not called.
        let version = check_contract(&lazy.engine, &component, &self.origin)
            .map_err(|e| not_loaded(e.to_string()))?;
        if version != self.contract {
            return Err(not_loaded(format!(
                "its describe record says contract {} but it exports {version}",
                self.contract
            )));
        }
        let pre = contract::link(&lazy.engine, &component, version)
            .map_err(|e| not_loaded(format!("{e:#}")))?;
        Ok(self.pre.get_or_init(|| pre))
    }

    /// Check a plan against the plugin's policy and the operator's
    /// narrowing of it.
    pub fn check_policy(&self, plan: &Plan) -> Result<(), PluginError> {
        let breach = |by: String, breach: Breach| PluginError::Policy {
            plugin: self.info.name.clone(),
            by,
            breach,
        };
        self.policy
            .check(plan)
            .map_err(|b| breach(self.policy_source.to_string(), b))?;
        if let Some(narrowing) = &self.narrowing {
            narrowing.check(plan).map_err(|b| {
                breach(
                    format!(
                        "the operator's policy for it (plugin_policy.{} in the configuration file)",
                        self.info.name
                    ),
                    b,
                )
            })?;
        }
        Ok(())
    }
}

/// Counts one call in [`PluginHost::calls_in_flight`] while it lives.
struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> InFlight<'a> {
    fn enter(count: &'a std::sync::atomic::AtomicUsize) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        InFlight(count)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn info_with_flavor(flavor: &str) -> contract::WitPluginInfo {
        contract::WitPluginInfo {
            name: "acme-net".into(),
            version: "0.1.0".into(),
            contract: Contract::CURRENT.version().into(),
            summary: "a test".into(),
            scenarios: vec![contract::wit::Scenario::OciNetworkd],
            flavors: vec![flavor.into()],
        }
    }

    /// A bad flavour in `describe` is the plugin author's to fix: the
    /// advice is about the plugin's flavour list, not a pod annotation.
    #[test]
    fn a_bad_declared_flavour_gets_advice_for_the_plugin_author() {
        let origin = Origin::File(PathBuf::from("acme.wasm"));
        for (flavor, rule) in [
            ("Alpine", "may only hold a-z, 0-9, '-', '.' and '_'"),
            ("", "is empty"),
        ] {
            let err = describe(info_with_flavor(flavor), &origin, Contract::CURRENT)
                .expect_err("refused");
            let message = err.to_string();
            assert!(
                message.starts_with("plugin acme.wasm describes itself wrongly: flavour "),
                "{message}"
            );
            assert!(message.contains(rule), "{message}");
            assert!(
                message.contains("fix the flavours `describe` returns"),
                "{message}"
            );
            assert!(message.contains("`PluginInfo::with_flavors`"), "{message}");
            assert!(
                !message.contains("remove annotation"),
                "no advice meant for a pod: {message}"
            );
        }
        // The annotation's own error keeps the advice for annotations.
        let annotation = Flavor::parse("Alpine").expect_err("refused").to_string();
        assert!(
            annotation.contains("remove annotation vm.cocoonstack.io/guest-flavor"),
            "{annotation}"
        );
        assert!(describe(info_with_flavor("alpine"), &origin, Contract::CURRENT).is_ok());
        // A control character is escaped once, not twice.
        let message = describe(info_with_flavor("a\nb"), &origin, Contract::CURRENT)
            .expect_err("refused")
            .to_string();
        assert!(
            message.contains("flavour `a\\nb` in its flavour list"),
            "{message}"
        );
        assert!(!message.contains("\\\\"), "{message}");
    }

    /// A denied import's error says what to do, by the kind of import.
    #[test]
    fn a_denied_import_says_what_to_do() {
        for (import, fix) in [
            (
                "wasi:random/insecure-seed@0.2.6#insecure-seed",
                "instead of `HashMap`/`HashSet`",
            ),
            ("wasi:clocks/wall-clock@0.2.6#now", "do not read a clock"),
            (
                "wasi:cli/stdout@0.2.6#get-stdout",
                "`cocoon_fixup_sdk::log`",
            ),
            (
                "wasi:filesystem/preopens@0.2.6#get-directories",
                "take what differs per VM from the facts",
            ),
            (
                "wasi:http/outgoing-handler@0.2.6#handle",
                "drop the code or dependency that calls it (`cargo tree`",
            ),
        ] {
            let message = PluginError::Denied {
                plugin: "acme-net".into(),
                import: import.into(),
            }
            .to_string();
            assert!(message.contains(fix), "{import}: {message}");
        }
    }
}
