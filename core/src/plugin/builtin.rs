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

macro_rules! digest {
    ($name:literal) => {
        include_str!(concat!(env!("OUT_DIR"), "/", $name, ".sha256"))
    };
}

/// The sha256 (lowercase hex) of each of [`BUILTINS`], in the same order,
/// computed by the build script: a start does not hash them again.
pub const BUILTIN_SHA256: [&str; 4] = [
    digest!("cloudimg"),
    digest!("oci-networkd"),
    digest!("fc-mac"),
    digest!("windows-pnp"),
];

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;

    #[test]
    fn the_recorded_digests_are_the_bytes_digests() {
        for ((name, bytes), digest) in BUILTINS.iter().zip(BUILTIN_SHA256) {
            assert_eq!(hex::encode(Sha256::digest(bytes)), digest, "{name}");
        }
    }
}
