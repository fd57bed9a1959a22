//! A test plugin whose plan's strings and lists all point at the same bytes
//! of its linear memory, for the host's memory tests. Never ship it.
//!
//! `plan` picks by the VM name in the facts:
//!
//! | name    | what it returns                                                  |
//! |---------|------------------------------------------------------------------|
//! | `alias` | [`ALIAS_STEPS`] steps, each running [`ALIAS_ARGS`] arguments; every description and argument is the same [`ALIAS_BYTES`] string, and every step the same argv list: about 80 KiB of guest memory that lifts to about 1 GiB on the host |
//! | other   | 2 steps, each `run ["sync"]` described `sync`, sharing one string and one argv list: small, valid, and within the default policy of contract 0.1.0 |
//!
//! Why by hand: wit-bindgen lowers each `String` of a returned value from
//! its own allocation, and a clone copies, so a plugin written with it
//! cannot make two strings share bytes. The canonical ABI can: a string or
//! list is an offset and a length, and nothing stops a guest from handing
//! the same offset out many times. This crate uses wit-bindgen only for the
//! component type (`generate!`, so the toolchain makes a component that
//! exports `cocoon:fixup/generator`) and writes the two exports itself, over
//! the canonical ABI layouts (wasm32: offsets and lengths are 4 bytes):
//!
//! - `plugin-info` (48 bytes): `name`, `version`, `contract`, `summary`
//!   (strings), `scenarios` (list of 1-byte enums), `flavors` (list of
//!   strings), each an (offset, length) pair;
//! - `result<plan, plan-error>` (24 bytes): the case byte (0 = ok) at 0, the
//!   plan at 4: `dialect` (1 byte) at 4, `steps` (offset, length) at 8;
//! - `step` (40 bytes): `description` at 0, `phase` at 8, `best-effort` at
//!   9, the `action` case byte (0 = run) at 12, its argv (offset, length) at
//!   16.
//!
//! The host's `other` test checks these layouts: it gets exactly the plan
//! described above.

/// Steps in the `alias` plan.
pub const ALIAS_STEPS: usize = 256;

/// Arguments in each `alias` step.
pub const ALIAS_ARGS: usize = 64;

/// Length of the one string every `alias` description and argument is.
pub const ALIAS_BYTES: usize = 64 << 10;

/// What the host would hold if it lifted the whole `alias` plan: every
/// description and argument copied, without the lists' own slots.
pub const ALIAS_LIFTED_BYTES: usize = ALIAS_STEPS * (1 + ALIAS_ARGS) * ALIAS_BYTES;

#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)] // hand-written canonical ABI exports
mod abi {
    wit_bindgen::generate!({ path: "../../../wit/0.1.0", world: "plugin" });

    use super::{ALIAS_ARGS, ALIAS_BYTES, ALIAS_STEPS};

    /// `scenario::oci-networkd`.
    const OCI_NETWORKD: u8 = 1;
    /// `phase::configure`.
    const CONFIGURE: u32 = 2;

    /// A string or list as the canonical ABI passes it.
    fn pair<T>(items: &[T]) -> [u32; 2] {
        [items.as_ptr() as u32, items.len() as u32]
    }

    /// Words that stay put for the rest of the call (the host reads them
    /// after the export returns; each call has a fresh instance).
    fn leak(words: Vec<u32>) -> &'static [u32] {
        Box::leak(words.into_boxed_slice())
    }

    #[unsafe(export_name = "cocoon:fixup/generator@0.1.0#describe")]
    extern "C" fn describe() -> *const u8 {
        wit_bindgen::rt::maybe_link_cabi_realloc();
        static SCENARIOS: [u8; 1] = [OCI_NETWORKD];
        let flavors = leak(pair(b"alias").to_vec());
        let fields = [
            pair(b"alias"),
            pair(b"0.1.0"),
            pair(b"0.1.0"),
            pair(b"returns a plan whose strings share guest memory"),
            pair(&SCENARIOS),
            [flavors.as_ptr() as u32, 1],
        ];
        leak(fields.concat()).as_ptr().cast()
    }

    #[unsafe(export_name = "cocoon:fixup/generator@0.1.0#plan")]
    #[allow(clippy::too_many_arguments)]
    extern "C" fn plan(
        _scenario: u32,
        name: *const u8,
        name_len: usize,
        _id: *const u8,
        _id_len: usize,
        _backend: u32,
        _os: u32,
        _image: u32,
        _boot: u32,
        _nics: *const u8,
        _nics_len: usize,
        _flavor_case: u32,
        _flavor: *const u8,
        _flavor_len: usize,
    ) -> *const u8 {
        // SAFETY: the host lowered the VM name there, through
        // `cabi_realloc`, for this call.
        let name = unsafe { std::slice::from_raw_parts(name, name_len) };
        let (steps, args, text): (usize, usize, &'static [u8]) = if name == b"alias" {
            (ALIAS_STEPS, ALIAS_ARGS, vec![b'a'; ALIAS_BYTES].leak())
        } else {
            (2, 1, b"sync")
        };
        let argv = leak(pair(text).repeat(args));
        let [text_at, text_len] = pair(text);
        let [argv_at, _] = pair(argv);
        let step = [
            text_at,
            text_len,
            CONFIGURE, // phase; best-effort (byte 9) false
            0,         // action: run
            argv_at,
            args as u32,
            0,
            0,
            0,
            0,
        ];
        let list = leak(step.repeat(steps));
        let result = [0, 0, list.as_ptr() as u32, steps as u32, 0, 0];
        leak(result.to_vec()).as_ptr().cast()
    }
}
