//! Contract 0.1.0 (`wit/0.1.0/`), frozen: plugins built against it are
//! still served, under [`GuestPolicy::contract_0_1_default`]. Its `types`
//! interface is 0.2.0's, so the generated types are shared.
//!
//! [`GuestPolicy::contract_0_1_default`]: crate::plan::policy::GuestPolicy::contract_0_1_default

wasmtime::component::bindgen!({
    path: "../wit/0.1.0",
    world: "plugin",
    with: {
        "cocoon:fixup/types@0.1.0": super::v0_2::cocoon::fixup::types,
    },
});

pub const VERSION: &str = "0.1.0";

/// The one import with functions a plugin of this version is granted,
/// linked by [`link_log`](super::super::sandbox::link_log).
pub const HOST_IMPORT: &str = "cocoon:fixup/host@0.1.0";
