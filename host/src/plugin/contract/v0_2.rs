//! Contract 0.2.0 (`wit/0.2.0/`): 0.1.0 and a declared guest-side policy.

use super::super::sandbox::CallState;

wasmtime::component::bindgen!({
    path: "../wit/0.2.0",
    world: "plugin",
});

pub const VERSION: &str = "0.2.0";

/// The one import with functions a plugin of this version is granted.
pub const HOST_IMPORT: &str = "cocoon:fixup/host@0.2.0";

impl cocoon::fixup::types::Host for CallState {}

impl cocoon::fixup::policy::Host for CallState {}

impl cocoon::fixup::host::Host for CallState {
    fn log(&mut self, level: cocoon::fixup::types::LogLevel, message: String) {
        super::log(self, level, message);
    }
}

/// Add this version's `log` import to a linker.
pub fn add_host_to_linker(
    linker: &mut wasmtime::component::Linker<CallState>,
) -> wasmtime::Result<()> {
    Plugin::add_to_linker::<CallState, wasmtime::component::HasSelf<CallState>>(linker, |s| s)
}
