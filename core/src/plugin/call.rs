//! One call of a plugin export in a fresh Store under the call limits,
//! and the typed error a trap becomes.

use super::*;

/// Run one export in a fresh Store with the call limits, and turn a trap
/// into the typed error that says which limit or capability it hit. The
/// call traps `deadline_epochs` epochs from now ([`PluginHost::deadline`]).
pub(crate) fn call<R>(
    engine: &Engine,
    limits: &Limits,
    deadline_epochs: u64,
    plugin: &str,
    f: impl FnOnce(&mut Store<CallState>) -> wasmtime::Result<R>,
) -> Result<(R, CallStats), PluginError> {
    let started = std::time::Instant::now();
    let mut store = Store::new(engine, CallState::new(plugin, limits));
    store.limiter(|s| s);
    store.set_fuel(limits.fuel).map_err(engine_error)?;
    // What the host copies out of the guest at once (the returned plan,
    // one log message) stays within a few times the plan limits, however
    // many of the plan's strings point at the same guest bytes.
    store.set_hostcall_fuel(limits.hostcall_bytes());
    store.set_epoch_deadline(deadline_epochs);
    store.epoch_deadline_trap();
    let outcome = f(&mut store);
    let fuel_left = store.get_fuel().unwrap_or(0);
    let state = store.into_data();
    match outcome {
        Ok(value) => Ok((
            value,
            CallStats {
                duration: started.elapsed(),
                fuel_used: limits.fuel - fuel_left,
                peak_memory_bytes: state.peak_memory,
                logs: state.logs,
            },
        )),
        Err(e) => Err(trap_error(&e, &state, limits, plugin)),
    }
}

pub(crate) fn find<T: std::error::Error + Send + Sync + 'static>(
    e: &wasmtime::Error,
) -> Option<&T> {
    e.downcast_ref::<T>()
        .or_else(|| e.chain().find_map(|c| c.downcast_ref::<T>()))
}

/// Whether `e` is wasmtime running out of hostcall fuel
/// ([`Store::set_hostcall_fuel`]) while lifting values out of the guest.
/// wasmtime reports it with a private error type, so its message is the
/// only mark; `tests/tests/sandbox.rs` (`aliased_strings_*`) fails if that
/// message changes.
pub(crate) fn is_hostcall_fuel_exhausted(e: &wasmtime::Error) -> bool {
    const MARK: &str = "fuel allocated for hostcalls has been exhausted";
    e.chain().any(|c| c.to_string().contains(MARK))
}

pub(crate) fn trap_error(
    e: &wasmtime::Error,
    state: &CallState,
    limits: &Limits,
    plugin: &str,
) -> PluginError {
    let plugin = plugin.to_owned();
    if let Some(denied) = find::<DeniedImport>(e) {
        return PluginError::Denied {
            plugin,
            import: denied.import.clone(),
        };
    }
    if let Some(hit) = find::<MemoryLimitHit>(e) {
        return PluginError::Memory {
            plugin,
            desired: hit.desired,
            limit: hit.limit,
        };
    }
    if let Some(hit) = find::<LogFloodHit>(e) {
        return PluginError::LogFlood {
            plugin,
            what: hit.what,
            limit: hit.limit,
        };
    }
    if is_hostcall_fuel_exhausted(e) {
        return PluginError::TooMuchData {
            plugin,
            limit: limits.hostcall_bytes(),
        };
    }
    match find::<Trap>(e) {
        Some(Trap::OutOfFuel) => PluginError::Fuel {
            plugin,
            limit: limits.fuel,
        },
        Some(Trap::Interrupt) => PluginError::Deadline {
            plugin,
            limit: limits.deadline,
        },
        Some(Trap::UnreachableCodeReached) => match state.last_error() {
            Some(message) => PluginError::Panicked {
                plugin,
                message: message.to_owned(),
            },
            None => PluginError::Trapped {
                plugin,
                reason: "unreachable code reached (a panic or abort)".to_owned(),
            },
        },
        Some(trap) => PluginError::Trapped {
            plugin,
            reason: trap.to_string(),
        },
        None => PluginError::Trapped {
            plugin,
            reason: format!("{e:#}"),
        },
    }
}
