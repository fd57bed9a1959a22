//! The sandbox every plugin call runs in.
//!
//! The isolation contract:
//!
//! - **Compile once, a fresh Store per call.** Nothing a plugin does in one
//!   call (memory, globals, allocator state) is visible to the next: every
//!   call instantiates anew from a pre-linked `InstancePre`.
//! - **Deny by default.** The only import a plugin is granted is the host's
//!   bounded `log`. Every other import its toolchain pulled in (the 14 WASI
//!   interfaces of a std `wasm32-wasip2` build: filesystem, environment,
//!   clocks, random, sockets, stdio) is linked to a function that traps with
//!   [`DeniedImport`], so a plugin gets no filesystem, environment, network,
//!   clock or randomness, and a call that tries is reported by name.
//! - **Limits on every call**: CPU fuel, linear memory, log volume, and the
//!   size of the returned plan. Breaching one is a typed error naming the
//!   plugin and the limit; the engine keeps serving other calls.

use std::fmt;

use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Linker, LinkerInstance, ResourceType};
use wasmtime::{Engine, ResourceLimiter};

use crate::plan::PlanLimits;

/// Fuel for one plugin call: about 10 ms of guest work on a 2-core machine
/// of the kind this runs on (10^8 fuel stops an endless loop in about 4 ms).
/// A real plan costs well under 1 % of it. Set with `--plugin-fuel`.
pub const DEFAULT_FUEL: u64 = 250_000_000;

/// Linear memory a plugin instance may grow to: 16 MiB. A plan plugin needs
/// a few hundred KiB. Set with `--plugin-memory-mib`.
pub const DEFAULT_MEMORY_BYTES: usize = 16 << 20;

/// Log bytes kept per call (all messages together); the rest is dropped
/// with a note. Not configurable: the log is for diagnostics only.
pub const LOG_BYTES_PER_CALL: usize = 16 << 10;

/// Per-call limits. Defaults are the documented ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub fuel: u64,
    pub memory_bytes: usize,
    pub plan: PlanLimits,
    /// Wall-clock time one call may take, instantiation included
    /// ([`DEFAULT_DEADLINE`], `--plugin-deadline`). Fuel bounds the work a
    /// plugin does itself; this also bounds time spent in the host on its
    /// behalf (its `log` calls), to within one epoch tick
    /// ([`EPOCH_TICK`](super::EPOCH_TICK)).
    pub deadline: std::time::Duration,
}

/// A plugin call takes tens of microseconds; one that is still running
/// after 1 s is stopped (`--plugin-deadline`).
pub const DEFAULT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(1);

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fuel: DEFAULT_FUEL,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            deadline: DEFAULT_DEADLINE,
            plan: PlanLimits::default(),
        }
    }
}

/// The error a denied import traps with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeniedImport {
    /// `interface#function`, for example `wasi:filesystem/preopens@0.2.6#get-directories`.
    pub import: String,
}

impl fmt::Display for DeniedImport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "denied import `{}` was called", self.import)
    }
}

impl std::error::Error for DeniedImport {}

/// The error the memory limiter traps with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLimitHit {
    pub desired: usize,
    pub limit: usize,
}

impl fmt::Display for MemoryLimitHit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "linear memory would grow to {} bytes, limit {}",
            self.desired, self.limit
        )
    }
}

impl std::error::Error for MemoryLimitHit {}

/// One message a plugin logged during a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub level: tracing::Level,
    pub message: String,
}

/// What a Store holds for one call.
#[derive(Debug)]
pub struct CallState {
    /// The plugin's name, for the host log.
    pub plugin: String,
    memory_limit: usize,
    /// The largest linear memory the call reached, in bytes.
    pub peak_memory: usize,
    log_left: usize,
    /// Messages the plugin logged (bounded by [`LOG_BYTES_PER_CALL`]).
    pub logs: Vec<LogLine>,
    /// True when messages were dropped for the log bound.
    pub logs_truncated: bool,
}

impl CallState {
    pub fn new(plugin: &str, limits: &Limits) -> Self {
        CallState {
            plugin: plugin.to_owned(),
            memory_limit: limits.memory_bytes,
            peak_memory: 0,
            log_left: LOG_BYTES_PER_CALL,
            logs: Vec::new(),
            logs_truncated: false,
        }
    }

    /// Keep a log line within the per-call bound and forward it to tracing.
    pub fn log(&mut self, level: tracing::Level, message: String) {
        let mut message = message;
        if message.len() > self.log_left {
            let mut cut = self.log_left;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            self.logs_truncated = true;
        }
        if message.is_empty() {
            return;
        }
        self.log_left -= message.len();
        // A plugin's line stays one line that shows what it says: a `\n`
        // cannot forge a host log line, a `\r` or ESC cannot rewrite one.
        let message = crate::facts::escape_controls(&message);
        let plugin = self.plugin.as_str();
        match level {
            tracing::Level::ERROR => tracing::error!(plugin, "{message}"),
            tracing::Level::WARN => tracing::warn!(plugin, "{message}"),
            tracing::Level::INFO => tracing::info!(plugin, "{message}"),
            _ => tracing::debug!(plugin, "{message}"),
        }
        self.logs.push(LogLine { level, message });
    }

    /// The last error-level message: the SDK's panic hook logs the panic
    /// message there just before the guest aborts.
    pub fn last_error(&self) -> Option<&str> {
        self.logs
            .iter()
            .rev()
            .find(|l| l.level == tracing::Level::ERROR)
            .map(|l| l.message.as_str())
    }
}

impl ResourceLimiter for CallState {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            return Err(wasmtime::Error::new(MemoryLimitHit {
                desired,
                limit: self.memory_limit,
            }));
        }
        self.peak_memory = self.peak_memory.max(desired);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Tables hold function references; a plan plugin needs a few
        // hundred. 10 000 stops a table bomb long before it costs memory.
        Ok(desired <= 10_000)
    }
}

/// Link every import of `component` that the linker does not define yet to
/// a function that traps with [`DeniedImport`]. Resources get a host type
/// no plugin can construct.
pub fn deny_remaining_imports(
    engine: &Engine,
    linker: &mut Linker<CallState>,
    component: &Component,
    granted: &[&str],
) -> wasmtime::Result<()> {
    let ty = component.component_type();
    for (name, item) in ty.imports(engine) {
        if granted.contains(&name) {
            continue;
        }
        let mut root = linker.root();
        deny_item(engine, &mut root, name, &item.ty, None)?;
    }
    Ok(())
}

fn deny_item(
    engine: &Engine,
    linker: &mut LinkerInstance<'_, CallState>,
    name: &str,
    item: &ComponentItem,
    parent: Option<&str>,
) -> wasmtime::Result<()> {
    match item {
        ComponentItem::ComponentFunc(_) => {
            let import = match parent {
                Some(parent) => format!("{parent}#{name}"),
                None => name.to_owned(),
            };
            linker.func_new(name, move |_, _, _, _| {
                Err(wasmtime::Error::new(DeniedImport {
                    import: import.clone(),
                }))
            })
        }
        ComponentItem::ComponentInstance(instance) => {
            let mut inner = linker.instance(name)?;
            for (export, item) in instance.exports(engine) {
                deny_item(engine, &mut inner, export, &item.ty, Some(name))?;
            }
            Ok(())
        }
        ComponentItem::Resource(_) => {
            linker.resource(name, ResourceType::host::<DeniedResource>(), |_, _| Ok(()))
        }
        // Types need no definition; core modules and nested components
        // cannot be imported by a plugin built with the supported toolchain
        // and fail instantiation with wasmtime's own message.
        _ => Ok(()),
    }
}

/// The host type behind every denied resource import.
#[derive(Debug)]
struct DeniedResource;
