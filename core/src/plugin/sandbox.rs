//! The sandbox every plugin call runs in.
//!
//! The isolation contract:
//!
//! - **Compile once, a fresh Store per call.** Nothing a plugin does in one
//!   call (memory, globals, allocator state) is visible to the next: every
//!   call instantiates anew from a pre-linked `InstancePre`.
//! - **Deny by default.** The only import a plugin is granted is the host's
//!   bounded `log` ([`link_log`]). Every other import its toolchain pulled in (the 14 WASI
//!   interfaces of a std `wasm32-wasip2` build: filesystem, environment,
//!   clocks, random, sockets, stdio) is linked to a function that traps with
//!   [`DeniedImport`], so a plugin gets no filesystem, environment, network,
//!   clock or randomness, and a call that tries is reported by name.
//! - **Limits on every call**: CPU fuel, linear memory, log volume, the
//!   bytes the host copies out of the guest, and the size of the returned
//!   plan. Breaching one is a typed error naming the plugin and the limit;
//!   the engine keeps serving other calls.
//! - **The host's work on a plugin's behalf is paid for.** A `log` call
//!   costs fuel for the call and for every byte of its message, charged
//!   from the call's own fuel before the host copies anything, and a call
//!   may log at most [`LOG_MAX_MESSAGES`] messages and [`LOG_MAX_BYTES`]
//!   bytes ([`LogFloodHit`]). Everything the host lifts out of guest memory
//!   in one go (a returned plan, one log message) is bounded by
//!   [`Limits::hostcall_bytes`], derived from the plan limits: strings in a
//!   returned plan can all point at the same guest bytes, so the guest's
//!   memory limit does not bound what the host would hold.

use std::fmt;

use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Linker, LinkerInstance, ResourceType, WasmStr};
use wasmtime::{Engine, ResourceLimiter, StoreContextMut, Trap};

use super::contract::wit;

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

/// Messages one plugin call may log. The next `log` call traps with
/// [`LogFloodHit`]: a plan plugin logs a handful of lines, one that logs
/// in a loop is broken or hostile. Not configurable.
pub const LOG_MAX_MESSAGES: usize = 1_000;

/// Message bytes one plugin call may hand to `log`, all messages together,
/// kept or not: four times what is kept ([`LOG_BYTES_PER_CALL`]). The
/// message that goes past it traps with [`LogFloodHit`]. Not configurable.
pub const LOG_MAX_BYTES: usize = 64 << 10;

/// Fuel one `log` call costs before its message is read: more than the
/// host spends on a message it keeps (the escape, the tracing event, the
/// record; measured at 0.15 us a message without a log subscriber, a few
/// microseconds with one writing to a terminal), 25 000 fuel being 1 to 2 us
/// of guest work (250 000 000 fuel spin for 10 to 18 ms). The
/// [`LOG_MAX_MESSAGES`] calls a plugin may make cost a tenth of the default
/// budget ([`DEFAULT_FUEL`]).
pub const LOG_FUEL_PER_MESSAGE: u64 = 25_000;

/// Fuel per byte of a `log` message, kept or dropped: the host reads and
/// validates every byte it is handed and escapes the ones it keeps
/// (measured at about 0.5 ns a byte; 64 fuel is 3 to 6 ns of guest work).
/// [`LOG_MAX_BYTES`] cost about 4 million, under 2 % of the default budget.
pub const LOG_FUEL_PER_BYTE: u64 = 64;

/// Host bytes per plan step allowed for in [`Limits::hostcall_bytes`]
/// beyond the plan's text: the host's step record (under 100 bytes) and 16
/// argv entries or removal patterns (24 bytes each).
pub const HOSTCALL_BYTES_PER_STEP: usize = 512;

/// Per-call limits. Defaults are the documented ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub fuel: u64,
    pub memory_bytes: usize,
    pub plan: PlanLimits,
    /// Wall-clock time one call may take, instantiation included
    /// ([`DEFAULT_DEADLINE`], `--plugin-deadline`). Fuel bounds the work a
    /// plugin does itself; this also bounds time spent in the host on its
    /// behalf (its `log` calls). The engine's epoch ticker thread keeps
    /// it, in every host: a call stops never before its deadline and at
    /// most two epoch ticks ([`EPOCH_TICK`](super::EPOCH_TICK)) after it.
    /// A deadline under a millisecond is refused by the configuration.
    pub deadline: std::time::Duration,
}

/// A plugin call takes tens of microseconds; one that is still running
/// after 1 s is stopped (`--plugin-deadline`).
pub const DEFAULT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(1);

impl Limits {
    /// The most bytes the host copies out of a plugin in one go: a returned
    /// plan (its text and the host's records and list slots for it), a
    /// description, or one log message. Twice the plan's text limit plus
    /// [`HOSTCALL_BYTES_PER_STEP`] for each step it may have: 256 KiB with
    /// the default plan limits (`--plan-max-bytes`, `--plan-max-steps`), so
    /// any plan within them fits, and a plan whose strings all point at the
    /// same guest bytes stops after a few times the plan limit, not after
    /// wasmtime's default of 128 MiB. Set on every call's Store as its
    /// hostcall fuel; running out is [`PluginError::TooMuchData`](super::PluginError::TooMuchData).
    pub fn hostcall_bytes(&self) -> usize {
        self.plan
            .max_bytes
            .saturating_mul(2)
            .saturating_add(self.plan.max_steps.saturating_mul(HOSTCALL_BYTES_PER_STEP))
    }
}

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

/// The error a `log` call traps with when the call's log budget is spent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFloodHit {
    /// What ran out: `messages` or `bytes`.
    pub what: &'static str,
    /// Its limit: [`LOG_MAX_MESSAGES`] or [`LOG_MAX_BYTES`].
    pub limit: usize,
}

impl fmt::Display for LogFloodHit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "log budget spent: more than {} {} in one call",
            self.limit, self.what
        )
    }
}

impl std::error::Error for LogFloodHit {}

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
    /// `log` calls so far, against [`LOG_MAX_MESSAGES`].
    pub log_messages: usize,
    /// Message bytes handed to `log` so far, against [`LOG_MAX_BYTES`].
    pub log_bytes: usize,
    /// Fuel charged for `log` calls so far.
    pub log_fuel: u64,
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
            log_messages: 0,
            log_bytes: 0,
            log_fuel: 0,
            logs: Vec::new(),
            logs_truncated: false,
        }
    }

    /// Count a `log` call of `len` bytes against the call's log budget;
    /// the fuel it costs when it is within budget.
    fn admit_log(&mut self, len: usize) -> Result<u64, LogFloodHit> {
        self.log_messages += 1;
        if self.log_messages > LOG_MAX_MESSAGES {
            return Err(LogFloodHit {
                what: "messages",
                limit: LOG_MAX_MESSAGES,
            });
        }
        self.log_bytes = self.log_bytes.saturating_add(len);
        if self.log_bytes > LOG_MAX_BYTES {
            return Err(LogFloodHit {
                what: "bytes",
                limit: LOG_MAX_BYTES,
            });
        }
        let bytes = u64::try_from(len).unwrap_or(u64::MAX);
        Ok(LOG_FUEL_PER_MESSAGE.saturating_add(LOG_FUEL_PER_BYTE.saturating_mul(bytes)))
    }

    /// Keep a log line within the per-call bound and forward it to tracing.
    /// `message` is the part of the plugin's message that fits; `cut` says
    /// the rest was dropped.
    pub fn log(&mut self, level: tracing::Level, message: &str, cut: bool) {
        if cut {
            self.logs_truncated = true;
        }
        if message.is_empty() {
            return;
        }
        self.log_left = self.log_left.saturating_sub(message.len());
        // A plugin's line stays one line that shows what it says: a `\n`
        // cannot forge a host log line, a `\r` or ESC cannot rewrite one.
        let message = crate::facts::escape_controls(message);
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

/// Link the one granted import, `cocoon:fixup/host#log`, by hand rather
/// than through the generated bindings: the host function needs the Store
/// (its fuel), and takes the message as a [`WasmStr`] so that nothing is
/// copied before it is paid for.
///
/// Each call, in order: the message is located and checked as UTF-8 in
/// guest memory (its length bounded by the Store's hostcall fuel,
/// [`Limits::hostcall_bytes`]); it is counted against [`LOG_MAX_MESSAGES`]
/// and [`LOG_MAX_BYTES`] (past either, the call traps with [`LogFloodHit`]);
/// [`LOG_FUEL_PER_MESSAGE`] and [`LOG_FUEL_PER_BYTE`] for each byte are taken
/// from the Store's fuel (not enough left traps as out of fuel, as the
/// guest's own work would); only then is the part within
/// [`LOG_BYTES_PER_CALL`] copied and kept.
pub fn link_log(linker: &mut Linker<CallState>, import: &str) -> wasmtime::Result<()> {
    let mut host = linker.instance(import)?;
    host.func_wrap(
        "log",
        |mut store: StoreContextMut<'_, CallState>, (level, message): (wit::LogLevel, WasmStr)| {
            let len = message.to_str(&store)?.len();
            let cost = store
                .data_mut()
                .admit_log(len)
                .map_err(wasmtime::Error::new)?;
            let fuel = store.get_fuel()?;
            if fuel < cost {
                store.set_fuel(0)?;
                return Err(wasmtime::Error::new(Trap::OutOfFuel));
            }
            store.set_fuel(fuel - cost)?;
            store.data_mut().log_fuel += cost;
            let kept = {
                let text = message.to_str(&store)?;
                let room = store.data().log_left.min(text.len());
                text[..text.floor_char_boundary(room)].to_owned()
            };
            let level = match level {
                wit::LogLevel::Debug => tracing::Level::DEBUG,
                wit::LogLevel::Info => tracing::Level::INFO,
                wit::LogLevel::Warn => tracing::Level::WARN,
                wit::LogLevel::Error => tracing::Level::ERROR,
            };
            let cut = kept.len() < len;
            store.data_mut().log(level, &kept, cut);
            Ok(())
        },
    )
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
