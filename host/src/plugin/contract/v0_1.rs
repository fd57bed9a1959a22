//! Contract 0.1.0 (`wit/0.1.0/`), frozen: plugins built against it are
//! still served, under [`GuestPolicy::contract_0_1_default`]. Its `types`
//! interface is 0.2.0's, so the generated types are shared.
//!
//! [`GuestPolicy::contract_0_1_default`]: crate::plan::policy::GuestPolicy::contract_0_1_default

use super::super::sandbox::CallState;

wasmtime::component::bindgen!({
    path: "../wit/0.1.0",
    world: "plugin",
    with: {
        "cocoon:fixup/types@0.1.0": super::v0_2::cocoon::fixup::types,
    },
});

pub const VERSION: &str = "0.1.0";

/// The one import with functions a plugin of this version is granted.
pub const HOST_IMPORT: &str = "cocoon:fixup/host@0.1.0";

impl cocoon::fixup::host::Host for CallState {
    fn log(&mut self, level: super::wit::LogLevel, message: String) {
        super::log(self, level, message);
    }
}

/// Add this version's `log` import to a linker.
pub fn add_host_to_linker(
    linker: &mut wasmtime::component::Linker<CallState>,
) -> wasmtime::Result<()> {
    Plugin::add_to_linker::<CallState, wasmtime::component::HasSelf<CallState>>(linker, |s| s)
}
