//! Contract 0.4.0 (`wit/0.4.0/`), the current one: 0.3.0, and the
//! `prepare` scenario with the `parent` boot kind. Its generated types are
//! the ones the rest of the host sees ([`super::wit`]); older versions'
//! types are converted to them at the boundary.

wasmtime::component::bindgen!({
    path: "../wit/0.4.0",
    world: "plugin",
});

pub const VERSION: &str = "0.4.0";

/// The one import with functions a plugin of this version is granted,
/// linked by [`link_log`](super::super::sandbox::link_log).
pub const HOST_IMPORT: &str = "cocoon:fixup/host@0.4.0";
