//! Contract 0.2.0 (`wit/0.2.0/`): 0.1.0 and a declared guest-side policy.

wasmtime::component::bindgen!({
    path: "../wit/0.2.0",
    world: "plugin",
});

pub const VERSION: &str = "0.2.0";

/// The one import with functions a plugin of this version is granted,
/// linked by [`link_log`](super::super::sandbox::link_log).
pub const HOST_IMPORT: &str = "cocoon:fixup/host@0.2.0";
