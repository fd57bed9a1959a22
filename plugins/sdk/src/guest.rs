//! What a plugin implements and what it may call back.
//!
//! The only capability a plugin has is [`log`]. Everything else it needs
//! arrives as [`VmFacts`]; everything it decides leaves as a [`Plan`].

use crate::{GuestPolicy, LogLevel, Plan, PlanError, PluginInfo, Scenario, VmFacts};

/// A plan plugin: pure logic from facts to steps.
///
/// Both functions run in a fresh sandbox for each call, so they cannot keep
/// state between calls and should not try. Hand the implementing type to
/// [`export_plugin!`](crate::export_plugin) to make it the component's
/// export.
pub trait Plugin {
    /// Name, version, contract and what the plugin serves. Must not fail;
    /// [`PluginInfo::new`] fills in the contract version.
    fn describe() -> PluginInfo;

    /// The plan for `scenario` on this VM. A scenario the plugin does not
    /// serve is [`PlanError::unsupported`].
    fn plan(scenario: Scenario, facts: &VmFacts) -> Result<Plan, PlanError>;

    /// What this plugin's plans may do in the guest: the files they may
    /// write and remove, the commands they may run, whether they may set
    /// modes beyond 0o755. The host refuses every plan that does more, and
    /// `cocoon-fixup plugin inspect` shows it to the operators who decide
    /// whether to load the plugin: declare the least the plans need.
    fn policy() -> GuestPolicy;
}

/// Records `message` in the host's log under the plugin's name.
///
/// The host keeps at most 16 KiB per call and drops the rest, so put the
/// important part first. Each message costs fuel by the byte, and a call
/// that logs more than 1,000 messages or 64 KiB fails: log what helps a
/// person, not every step. Natively (unit tests) the message goes to
/// stderr instead.
pub fn log(level: LogLevel, message: &str) {
    #[cfg(target_arch = "wasm32")]
    crate::bindings::cocoon::fixup::host::log(level, message);
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("[{level}] {message}");
}

/// The glue behind [`export_plugin!`](crate::export_plugin). Not part of
/// the API: only the macro's expansion may use it.
#[doc(hidden)]
pub mod __private {
    use crate::{GuestPolicy, LogLevel, Plan, PlanError, PluginInfo, Scenario, VmFacts};

    pub use crate::bindings::exports::cocoon::fixup::generator::Guest;

    use super::Plugin;

    pub fn describe<P: Plugin>() -> PluginInfo {
        install_panic_hook();
        P::describe()
    }

    pub fn plan<P: Plugin>(scenario: Scenario, facts: VmFacts) -> Result<Plan, PlanError> {
        install_panic_hook();
        P::plan(scenario, &facts)
    }

    pub fn policy<P: Plugin>() -> GuestPolicy {
        install_panic_hook();
        P::policy()
    }

    /// Sends a panic's message and location to the host's log at error
    /// level. On `wasm32` the panic then aborts and the call traps; the log
    /// line is how the host learns why.
    ///
    /// Called at the top of every export: the host may run a call in an
    /// instance that has never run one before, and after the first call
    /// installing again is a no-op.
    fn install_panic_hook() {
        static INSTALL: std::sync::Once = std::sync::Once::new();
        INSTALL.call_once(|| {
            std::panic::set_hook(Box::new(|info| {
                // The message first: the host may cut the line short.
                let message = info.payload_as_str().unwrap_or("(no message)");
                let line = match info.location() {
                    Some(at) => format!("plugin panicked: {message} (at {at})"),
                    None => format!("plugin panicked: {message}"),
                };
                super::log(LogLevel::Error, &line);
            }));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Natively the host import is a stub that panics; `log` must not reach
    /// it, or every plugin's unit tests would fail on their first log line.
    #[test]
    fn log_goes_to_stderr_natively() {
        for level in [
            LogLevel::Debug,
            LogLevel::Info,
            LogLevel::Warn,
            LogLevel::Error,
        ] {
            log(level, "native log line");
        }
    }
}
