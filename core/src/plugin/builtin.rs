//! The built-in plugins, compiled from `plugins/` by the build script and
//! embedded in the binary.

macro_rules! builtin {
    ($name:literal) => {
        (
            $name,
            include_bytes!(concat!(env!("OUT_DIR"), "/", $name, ".wasm")) as &[u8],
        )
    };
}

/// Name and component bytes of each built-in plugin, in load order.
pub const BUILTINS: [(&str, &[u8]); 4] = [
    builtin!("cloudimg"),
    builtin!("oci-networkd"),
    builtin!("fc-mac"),
    builtin!("windows-pnp"),
];
