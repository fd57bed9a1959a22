//! Engine settings the host's `EngineOptions` does not expose, measured on
//! the plugin call alone (fresh Store, instantiation, the `plan` export,
//! conversion to the host's plan, the plan check).
//!
//! `PluginHost::new` fixes them: the pooling allocator (64 slots, 2 MiB of
//! linear memory kept resident), fuel metering, calls through an
//! `InstancePre`. A [`VariantEngine`] builds the same sandbox (the host's
//! bindings, its `CallState` limiter, its deny-by-default linker) with one
//! setting changed, so each variant's cost can be set against the shipped
//! one and against the native call in the same run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use fixup_core::classify::Scenario;
use fixup_core::facts::VmFacts;
use fixup_core::plan::Plan;
use fixup_core::plugin::builtin::BUILTINS;
use fixup_core::plugin::contract::v0_4::{HOST_IMPORT, Plugin, PluginPre};
use fixup_core::plugin::contract::{self as bindings};
use fixup_core::plugin::sandbox::{self, CallState, Limits};
use fixup_core::plugin::{DEFAULT_SLOTS, EngineOptions};
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};

/// Where instances get their memory and tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocator {
    /// Slots reserved up front and reused (the host's choice), keeping this
    /// many bytes of each linear memory (`linear_memory_keep_resident`) and
    /// of each table (`table_keep_resident`) resident between instances:
    /// reset with memset instead of `madvise(MADV_DONTNEED)`.
    Pooling {
        keep_resident: usize,
        table_keep_resident: usize,
    },
    /// mmap and munmap per instance.
    OnDemand,
}

/// How a runaway plugin is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    /// Fuel metering (the host's choice): deterministic, counts every
    /// instruction.
    Fuel,
    /// Epoch interruption: a ticker thread bumps the engine's epoch every
    /// [`EPOCH_TICK`]; a call may run [`EPOCH_DEADLINE_TICKS`] ticks.
    Epoch,
    /// Nothing: not acceptable in production (an endless loop would hold a
    /// worker forever); measured as the floor.
    Unbounded,
}

/// The epoch ticker's period.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);
/// Ticks a call may run under epoch interruption: 1 s. The deadline is
/// wall-clock time, so it must allow for the thread being preempted: with
/// 10 ms (what the default fuel buys) calls on a loaded two-core machine
/// were interrupted spuriously. Its value does not change the cost of a
/// call, only when a runaway one is stopped.
pub const EPOCH_DEADLINE_TICKS: u64 = 100;

/// The host's `linear_memory_keep_resident`.
pub const HOST_KEEP_RESIDENT: usize = 2 << 20;

/// Table bytes kept resident in the `-tables` variant: more than the tables
/// of a plan plugin's core instances hold.
pub const TABLE_KEEP_RESIDENT: usize = 64 << 10;

/// One engine configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    pub allocator: Allocator,
    pub interrupt: Interrupt,
    /// Instantiate from a pre-linked `InstancePre` (the host's choice), or
    /// through the `Linker` at every call.
    pub instance_pre: bool,
}

impl Variant {
    /// What `PluginHost::new` builds.
    pub const SHIPPED: Variant = Variant {
        allocator: Allocator::Pooling {
            keep_resident: HOST_KEEP_RESIDENT,
            table_keep_resident: 0,
        },
        interrupt: Interrupt::Fuel,
        instance_pre: true,
    };

    /// Every variant the benches measure: the shipped one, then one setting
    /// changed at a time, then the on-demand allocator with epochs.
    pub const ALL: [Variant; 9] = [
        Variant::SHIPPED,
        Variant {
            interrupt: Interrupt::Epoch,
            ..Variant::SHIPPED
        },
        Variant {
            interrupt: Interrupt::Unbounded,
            ..Variant::SHIPPED
        },
        Variant {
            allocator: Allocator::Pooling {
                keep_resident: 0,
                table_keep_resident: 0,
            },
            ..Variant::SHIPPED
        },
        Variant {
            allocator: Allocator::Pooling {
                keep_resident: HOST_KEEP_RESIDENT,
                table_keep_resident: TABLE_KEEP_RESIDENT,
            },
            ..Variant::SHIPPED
        },
        Variant {
            allocator: Allocator::Pooling {
                keep_resident: 0,
                table_keep_resident: TABLE_KEEP_RESIDENT,
            },
            ..Variant::SHIPPED
        },
        Variant {
            instance_pre: false,
            ..Variant::SHIPPED
        },
        Variant {
            allocator: Allocator::OnDemand,
            ..Variant::SHIPPED
        },
        Variant {
            allocator: Allocator::OnDemand,
            interrupt: Interrupt::Epoch,
            instance_pre: true,
        },
    ];

    /// A benchmark id: `pooling+fuel+pre`, `on-demand+epoch+pre`,
    /// `pooling0k+fuel+pre` (no linear memory kept resident),
    /// `pooling-tables64k+fuel+pre` (tables kept resident too),
    /// `pooling+fuel+linker`.
    pub fn label(&self) -> String {
        let allocator = match self.allocator {
            Allocator::Pooling {
                keep_resident,
                table_keep_resident,
            } => {
                let memory = if keep_resident == HOST_KEEP_RESIDENT {
                    String::new()
                } else {
                    format!("{}k", keep_resident >> 10)
                };
                let tables = if table_keep_resident == 0 {
                    String::new()
                } else {
                    format!("-tables{}k", table_keep_resident >> 10)
                };
                format!("pooling{memory}{tables}")
            }
            Allocator::OnDemand => "on-demand".to_owned(),
        };
        let interrupt = match self.interrupt {
            Interrupt::Fuel => "fuel",
            Interrupt::Epoch => "epoch",
            Interrupt::Unbounded => "unbounded",
        };
        let pre = if self.instance_pre { "pre" } else { "linker" };
        format!("{allocator}+{interrupt}+{pre}")
    }

    fn config(&self, limits: &Limits) -> Config {
        let mut config = Config::new();
        config.consume_fuel(self.interrupt == Interrupt::Fuel);
        config.epoch_interruption(self.interrupt == Interrupt::Epoch);
        // As `PluginHost::new`: no native unwind tables.
        config.native_unwind_info(false);
        match self.allocator {
            Allocator::Pooling {
                keep_resident,
                table_keep_resident,
            } => {
                // As `PluginHost::new`, but for the resident size.
                let slots = DEFAULT_SLOTS;
                let mut pool = PoolingAllocationConfig::default();
                pool.total_component_instances(slots)
                    .total_core_instances(slots * 8)
                    .total_memories(slots * 2)
                    .total_tables(slots * 8)
                    .max_memory_size(limits.memory_bytes)
                    .linear_memory_keep_resident(keep_resident)
                    .table_keep_resident(table_keep_resident);
                config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
            }
            Allocator::OnDemand => {
                config.allocation_strategy(InstanceAllocationStrategy::OnDemand);
            }
        }
        config
    }
}

/// Bumps an engine's epoch until dropped.
#[derive(Debug)]
struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    fn start(engine: Engine) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(EPOCH_TICK);
                engine.increment_epoch();
            }
        });
        Ticker {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One built-in plugin compiled and linked under a [`Variant`].
pub struct VariantEngine {
    variant: Variant,
    limits: Limits,
    engine: Engine,
    component: Component,
    linker: Linker<CallState>,
    pre: PluginPre<CallState>,
    name: String,
    _ticker: Option<Ticker>,
}

impl std::fmt::Debug for VariantEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VariantEngine")
            .field("variant", &self.variant)
            .field("plugin", &self.name)
            .finish_non_exhaustive()
    }
}

fn wasm_error(e: wasmtime::Error) -> anyhow::Error {
    anyhow::anyhow!("{e:#}")
}

impl VariantEngine {
    /// Compile and link the built-in `plugin` (for example `oci-networkd`)
    /// under `variant`, with the host's default limits.
    pub fn new(variant: Variant, plugin: &str) -> anyhow::Result<Self> {
        let limits = EngineOptions::default().limits;
        let engine = Engine::new(&variant.config(&limits)).map_err(wasm_error)?;
        let bytes = BUILTINS
            .iter()
            .find(|(name, _)| *name == plugin)
            .map(|(_, bytes)| *bytes)
            .ok_or_else(|| anyhow::anyhow!("no built-in plugin {plugin}"))?;
        let component = Component::new(&engine, bytes).map_err(wasm_error)?;
        let mut linker = Linker::<CallState>::new(&engine);
        sandbox::link_log(&mut linker, HOST_IMPORT).map_err(wasm_error)?;
        sandbox::deny_remaining_imports(&engine, &mut linker, &component, &[HOST_IMPORT])
            .map_err(wasm_error)?;
        let pre = PluginPre::new(linker.instantiate_pre(&component).map_err(wasm_error)?)
            .map_err(wasm_error)?;
        let ticker = (variant.interrupt == Interrupt::Epoch).then(|| Ticker::start(engine.clone()));
        Ok(VariantEngine {
            variant,
            limits,
            engine,
            component,
            linker,
            pre,
            name: plugin.to_owned(),
            _ticker: ticker,
        })
    }

    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// One call: a fresh Store with the call limits, instantiation, the
    /// `plan` export, conversion and the plan check, as
    /// `PluginHost::plan` does it.
    pub fn plan(&self, scenario: Scenario, facts: &VmFacts) -> anyhow::Result<Plan> {
        let wit_facts = bindings::facts_to_wit(facts);
        let wit_scenario = bindings::scenario_to_wit(scenario);
        let mut store = Store::new(&self.engine, CallState::new(&self.name, &self.limits));
        store.limiter(|s| s);
        match self.variant.interrupt {
            Interrupt::Fuel => store.set_fuel(self.limits.fuel).map_err(wasm_error)?,
            Interrupt::Epoch => store.set_epoch_deadline(EPOCH_DEADLINE_TICKS),
            Interrupt::Unbounded => {}
        }
        let plugin = if self.variant.instance_pre {
            self.pre.instantiate(&mut store).map_err(wasm_error)?
        } else {
            Plugin::instantiate(&mut store, &self.component, &self.linker).map_err(wasm_error)?
        };
        let result = plugin
            .cocoon_fixup_generator()
            .call_plan(&mut store, wit_scenario, &wit_facts)
            .map_err(wasm_error)?;
        let plan = match result {
            Ok(plan) => bindings::plan_from_wit(plan),
            Err(e) => anyhow::bail!("plugin {} refused {scenario}: {e:?}", self.name),
        };
        plan.check(&self.limits.plan)?;
        Ok(plan)
    }
}

/// The variants whose start-up [`start_from_cache`] is measured: the
/// shipped settings, no linear memory kept resident, and that with tables
/// kept resident.
pub const START_VARIANTS: [Variant; 3] = [Variant::SHIPPED, Variant::ALL[3], Variant::ALL[5]];

/// A start-up under `variant`, as `PluginHost::load_builtins` does it with
/// a cache: a new engine, then for each built-in its sha256, the
/// precompiled artifact from `cache_dir` (verified, deserialized; written
/// first if missing), the deny-by-default linker, the `InstancePre`, and
/// one `describe` call in a fresh Store. Returns the engine, so dropping it
/// is not timed with the start.
pub fn start_from_cache(variant: Variant, cache_dir: &std::path::Path) -> anyhow::Result<Engine> {
    use fixup_core::plugin::cache::ArtifactCache;
    use sha2::{Digest, Sha256};

    let limits = EngineOptions::default().limits;
    let engine = Engine::new(&variant.config(&limits)).map_err(wasm_error)?;
    let cache = ArtifactCache::open(
        cache_dir,
        Some(&crate::cases::cache_key(cache_dir)),
        &engine,
    )?;
    for (name, bytes) in BUILTINS {
        let sha256 = hex::encode(Sha256::digest(bytes));
        let component = cache
            .load_or_compile(&engine, bytes, &sha256)
            .map_err(wasm_error)?;
        let mut linker = Linker::<CallState>::new(&engine);
        sandbox::link_log(&mut linker, HOST_IMPORT).map_err(wasm_error)?;
        sandbox::deny_remaining_imports(&engine, &mut linker, &component, &[HOST_IMPORT])
            .map_err(wasm_error)?;
        let pre = PluginPre::new(linker.instantiate_pre(&component).map_err(wasm_error)?)
            .map_err(wasm_error)?;
        let mut store = Store::new(&engine, CallState::new(name, &limits));
        store.limiter(|s| s);
        if variant.interrupt == Interrupt::Fuel {
            store.set_fuel(limits.fuel).map_err(wasm_error)?;
        }
        if variant.interrupt == Interrupt::Epoch {
            store.set_epoch_deadline(EPOCH_DEADLINE_TICKS);
        }
        let plugin = pre.instantiate(&mut store).map_err(wasm_error)?;
        let info = plugin
            .cocoon_fixup_generator()
            .call_describe(&mut store)
            .map_err(wasm_error)?;
        anyhow::ensure!(
            info.name == *name,
            "{name} describes itself as {}",
            info.name
        );
    }
    Ok(engine)
}

/// The first and the second call of a freshly built engine, `runs` times:
/// medians of each. The first call gets a pool slot no instance has used
/// (as every `describe` call at start-up does); the second reuses it (as
/// every plan call in a running daemon does).
pub fn first_and_second_call(
    variant: Variant,
    runs: usize,
) -> anyhow::Result<(std::time::Duration, std::time::Duration)> {
    use fixup_core::facts::ImageKind;

    let obs = crate::cases::Case::OciNetworkd.observation(0);
    let facts = VmFacts::validate(&obs, ImageKind::Oci)?;
    let (mut first, mut second) = (Vec::new(), Vec::new());
    for _ in 0..runs.max(1) {
        let engine = VariantEngine::new(variant, "oci-networkd")?;
        for samples in [&mut first, &mut second] {
            let started = std::time::Instant::now();
            engine.plan(Scenario::OciNetworkd, &facts)?;
            samples.push(started.elapsed());
        }
    }
    Ok((
        crate::report::median(&first),
        crate::report::median(&second),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::Case;
    use fixup_core::facts::ImageKind;

    #[test]
    fn every_variant_makes_the_native_plan() {
        let obs = Case::OciNetworkd.observation(0);
        let facts = VmFacts::validate(&obs, ImageKind::Oci).unwrap();
        let native = crate::native::call("oci-networkd", Scenario::OciNetworkd, &facts).unwrap();
        for variant in Variant::ALL {
            let engine = VariantEngine::new(variant, "oci-networkd").unwrap();
            for _ in 0..3 {
                let plan = engine.plan(Scenario::OciNetworkd, &facts).unwrap();
                assert_eq!(plan, native, "{}", variant.label());
            }
        }
    }

    #[test]
    fn starts_from_a_cache() {
        // The cache and its key's directory both inside one temporary
        // directory, removed with it.
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        for variant in [Variant::SHIPPED, Variant::ALL[3]] {
            start_from_cache(variant, &cache).unwrap();
            start_from_cache(variant, &cache).unwrap();
        }
    }

    #[test]
    fn labels_are_unique() {
        let labels: std::collections::BTreeSet<String> =
            Variant::ALL.iter().map(Variant::label).collect();
        assert_eq!(labels.len(), Variant::ALL.len());
    }
}
