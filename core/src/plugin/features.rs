//! The WebAssembly features the plugin engine accepts.
//!
//! A plan plugin is a `wasm32-wasip2` component making one synchronous call
//! on one thread. The engine switches off, explicitly, every proposal the
//! plugins (the four built-ins, the test plugins, the example vendor
//! plugin) do not use, so that a plugin using one is refused when it is
//! compiled, naming the plugin and the feature
//! ([`PluginError::Compile`](super::PluginError::Compile)), and never
//! reaches code this build of wasmtime does not carry: it is built without
//! its `gc`, `threads` and `component-model-async` cargo features, and
//! 48.0.8 could abort a host built so on plugins using some of them
//! (GHSA-rc4p-x33f-vpr2, GHSA-2674-w29h-wqvj). SECURITY.md, "Plugins are
//! sandboxed", lists them.
//!
//! Kept on, as wasmtime has them by default: the WebAssembly 2.0 set
//! (mutable globals, sign extension, non-trapping float-to-int, multi-value,
//! bulk memory, reference types: rustc's `wasm32` targets emit bulk memory
//! and reference types by default, the latter for `call_indirect`'s table
//! encoding), SIMD (deterministic; a vendor may build with `simd128`), tail
//! calls, extended constant expressions and multi-memory (finished
//! WebAssembly 3.0 features that need no runtime support this build lacks),
//! and the component model itself.

use wasmtime::wasmparser::{Validator, WasmFeatures};

/// Switch off every proposal the plugins do not use. Some switches have
/// a `Config::wasm_*` method only with a wasmtime cargo feature this build
/// leaves out (named below); those are switched off by their flag, with
/// `Config::wasm_features`, which every build has.
pub(super) fn configure(config: &mut wasmtime::Config) {
    // Threads: shared memories and atomic instructions. A plugin call runs
    // on one thread. (`wasm_threads` needs the `threads` cargo feature.)
    config.wasm_features(WasmFeatures::THREADS, false);
    // Shared tables, globals and functions, and the thread built-ins.
    config.wasm_shared_everything_threads(false);
    // GC: struct, array and i31 types. This build has no garbage collector
    // (no `gc` cargo feature); GC_TYPES is the flag for its reference types.
    config.wasm_gc(false);
    config.wasm_features(WasmFeatures::GC_TYPES, false);
    // Typed function references (`call_ref`, non-null references): their
    // type checks need the `gc` cargo feature, as does
    // `wasm_function_references`.
    config.wasm_features(WasmFeatures::FUNCTION_REFERENCES, false);
    // Exceptions, and their legacy encoding: Rust plugins abort on a panic
    // and throw nothing. (`wasm_exceptions` needs the `gc` cargo feature;
    // `wasm_legacy_exceptions` is internal to wasmtime.)
    config.wasm_features(
        WasmFeatures::EXCEPTIONS | WasmFeatures::LEGACY_EXCEPTIONS,
        false,
    );
    // Stack switching: a plugin call is one synchronous call.
    config.wasm_stack_switching(false);
    // Component-model async (async lifts and lowers, streams, futures,
    // tasks, threads) and error-context: plugin calls are synchronous.
    // (Their switches need the `component-model-async` cargo feature.)
    config.wasm_features(
        WasmFeatures::CM_ASYNC
            | WasmFeatures::CM_ASYNC_STACKFUL
            | WasmFeatures::CM_MORE_ASYNC_BUILTINS
            | WasmFeatures::CM_THREADING,
        false,
    );
    config.wasm_component_model_error_context(false);
    // GC and 64-bit memories in the component model: the contract passes
    // its values through a 32-bit linear memory.
    config.wasm_component_model_gc(false);
    config.wasm_component_model_memory64(false);
    // Component-model types the contract does not use: maps, fixed-length
    // lists, `implements` names. Off by default; said here so an upgrade
    // that turns one on does not turn it on here.
    config.wasm_component_model_map(false);
    config.wasm_component_model_fixed_length_lists(false);
    config.wasm_component_model_implements(false);
    // Wide arithmetic (128-bit add, sub and multiply): no plugin uses it.
    config.wasm_wide_arithmetic(false);
    // 64-bit memories: plugins are `wasm32`, and the memory limit and the
    // pooling allocator's slots are sized for 32-bit memories.
    config.wasm_memory64(false);
    // Custom page sizes: memory is counted in 64 KiB pages.
    config.wasm_custom_page_sizes(false);
    // Relaxed SIMD: its results may differ between x86-64 and aarch64, and a
    // plan must not depend on the node's CPU. No plugin uses it.
    config.wasm_relaxed_simd(false);
}

/// The proposals [`configure`] switches off, as a refusal names them:
/// each with the flags a plugin using it needs (its own and those it
/// builds on), core proposals first, each before any that builds on it.
const SWITCHED_OFF: [(&str, WasmFeatures); 16] = [
    (
        "threads (shared memory, atomic instructions)",
        WasmFeatures::THREADS,
    ),
    (
        "shared-everything threads",
        WasmFeatures::THREADS.union(WasmFeatures::SHARED_EVERYTHING_THREADS),
    ),
    (
        "typed function references",
        WasmFeatures::FUNCTION_REFERENCES,
    ),
    (
        "garbage collection (GC struct, array or i31 types)",
        WasmFeatures::GC
            .union(WasmFeatures::GC_TYPES)
            .union(WasmFeatures::FUNCTION_REFERENCES),
    ),
    (
        "exceptions",
        WasmFeatures::EXCEPTIONS.union(WasmFeatures::LEGACY_EXCEPTIONS),
    ),
    (
        "stack switching",
        WasmFeatures::STACK_SWITCHING
            .union(WasmFeatures::EXCEPTIONS)
            .union(WasmFeatures::FUNCTION_REFERENCES),
    ),
    ("wide arithmetic", WasmFeatures::WIDE_ARITHMETIC),
    ("64-bit memory (memory64)", WasmFeatures::MEMORY64),
    ("custom page sizes", WasmFeatures::CUSTOM_PAGE_SIZES),
    ("relaxed SIMD", WasmFeatures::RELAXED_SIMD),
    (
        "component-model async",
        WasmFeatures::CM_ASYNC
            .union(WasmFeatures::CM_ASYNC_STACKFUL)
            .union(WasmFeatures::CM_MORE_ASYNC_BUILTINS)
            .union(WasmFeatures::CM_THREADING)
            .union(WasmFeatures::CM_ERROR_CONTEXT),
    ),
    (
        "component-model GC",
        WasmFeatures::CM_GC
            .union(WasmFeatures::GC)
            .union(WasmFeatures::GC_TYPES)
            .union(WasmFeatures::FUNCTION_REFERENCES),
    ),
    (
        "component-model 64-bit memory",
        WasmFeatures::CM64.union(WasmFeatures::MEMORY64),
    ),
    ("component-model maps", WasmFeatures::CM_MAP),
    (
        "component-model fixed-length lists",
        WasmFeatures::CM_FIXED_LENGTH_LISTS,
    ),
    ("component-model `implements`", WasmFeatures::CM_IMPLEMENTS),
];

/// Every flag [`configure`] switches off.
fn all_switched_off() -> WasmFeatures {
    SWITCHED_OFF
        .iter()
        .fold(WasmFeatures::empty(), |all, (_, flags)| all | *flags)
}

/// The reason a component did not compile, for
/// [`PluginError::Compile`](super::PluginError::Compile): wasmtime's
/// error, preceded, when the component is valid WebAssembly that uses a
/// proposal this host switches off, by which. Only a refused component
/// pays for the second look.
pub(super) fn compile_reason(bytes: &[u8], error: &wasmtime::Error) -> String {
    let reason = format!("{error:#}");
    match switched_off_in(bytes) {
        Some(Some(feature)) => format!(
            "it uses {feature}, a WebAssembly feature this host does not support ({reason})"
        ),
        Some(None) => {
            format!("it uses WebAssembly features this host does not support ({reason})")
        }
        None => reason,
    }
}

/// Which switched-off proposal `bytes` use: `None` when they are not
/// valid WebAssembly with every proposal on, or are valid with those
/// switched off (they were refused for another reason); `Some(None)` when
/// no one proposal alone would let them through.
fn switched_off_in(bytes: &[u8]) -> Option<Option<&'static str>> {
    let off = all_switched_off();
    let kept = WasmFeatures::all().difference(off);
    let check = |features| Validator::new_with_features(features).validate_all(bytes);
    let refusal = check(kept).err()?;
    check(kept | off).ok()?;
    // The validator usually says which flag it missed; otherwise the first
    // proposal that, switched on alone, lets the component through.
    let named = match refusal.missing_wasm_feature() {
        Some(missing) if !missing.is_empty() => SWITCHED_OFF
            .iter()
            .find(|(_, flags)| flags.contains(missing)),
        _ => None,
    };
    Some(
        named
            .or_else(|| {
                SWITCHED_OFF
                    .iter()
                    .find(|(_, flags)| check(kept | *flags).is_ok())
            })
            .map(|(name, _)| *name),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `configure` and the table agree: an engine configured by it does
    /// not have what the table names (it is built, so the switches are a
    /// set the engine accepts).
    #[test]
    fn the_switched_off_features_make_a_valid_engine() {
        let mut config = wasmtime::Config::new();
        configure(&mut config);
        wasmtime::Engine::new(&config).expect("the engine accepts the switches");
        assert!(all_switched_off().contains(WasmFeatures::THREADS | WasmFeatures::GC));
    }

    /// A component of one core module: its header, then `sections`.
    fn component(sections: &[u8]) -> Vec<u8> {
        let mut module = b"\0asm\x01\0\0\0".to_vec();
        module.extend_from_slice(sections);
        let mut component = b"\0asm\x0d\0\x01\0\x01".to_vec();
        component.push(u8::try_from(module.len()).expect("one LEB128 byte"));
        component.extend(module);
        component
    }

    /// The engine refuses a shared memory, naming the plugin and the
    /// feature; the same component with no shared memory gets further.
    #[test]
    fn a_shared_memory_is_refused_naming_the_feature() {
        let host =
            super::super::PluginHost::new(super::super::EngineOptions::default()).expect("engine");
        let origin = super::super::Origin::File("/x/shared.wasm".into());
        let err = host
            .prepare(origin.clone(), &component(b"\x05\x04\x01\x03\x01\x01"))
            .expect_err("refused");
        assert!(
            err.to_string().starts_with(
                "/x/shared.wasm could not be compiled: it uses threads (shared memory, \
                 atomic instructions), a WebAssembly feature this host does not support ("
            ),
            "{err}"
        );
        let err = host
            .prepare(origin, &component(b"\x05\x04\x01\x01\x01\x01"))
            .expect_err("not a plugin");
        assert!(!err.to_string().contains("does not support"), "{err}");
    }

    #[rstest::rstest]
    #[case::gc_struct(
        b"\x01\x03\x01\x5f\x00",
        "garbage collection (GC struct, array or i31 types)"
    )]
    #[case::exceptions(b"\x01\x04\x01\x60\x00\x00\x0d\x03\x01\x00\x00", "exceptions")]
    #[case::memory64(b"\x05\x03\x01\x04\x01", "64-bit memory (memory64)")]
    #[case::custom_page_size(b"\x05\x04\x01\x08\x01\x00", "custom page sizes")]
    fn each_switched_off_feature_is_named(#[case] sections: &[u8], #[case] name: &str) {
        assert_eq!(switched_off_in(&component(sections)), Some(Some(name)));
    }

    #[test]
    fn a_component_that_does_not_parse_is_not_diagnosed() {
        assert_eq!(switched_off_in(b"\0asm\x0d\0\x01\0garbage"), None);
    }
}
