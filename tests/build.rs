//! Builds the plugins the tests load from files, for wasm32-wasip2, so
//! `cargo test` needs no extra step: the test-only plugins under
//! `tests/plugins/` (workspace members) and the example vendor plugins under
//! `examples/plugins/` (each its own workspace, built the way a vendor builds
//! it). Their paths reach the tests as `env!("PLUGIN_<NAME>")`, for example
//! `PLUGIN_HOSTILE` and `PLUGIN_NM_KEYFILE`.

use std::path::Path;

use fixup_plugin_build::{PluginCrate, build_external_plugin, build_plugins, workspace_root};

/// Test-only plugins: `hostile` misbehaves on request; `alias` returns a
/// plan whose strings share guest memory; `legacy`, `contract-0-2` and
/// `contract-0-3` are built against the frozen contracts 0.1.0, 0.2.0 and
/// 0.3.0; `overreach` plans
/// past its declared guest policy; `ifupdown` names NICs (`name-link`) and
/// writes with `parents`; the others are refused by the host in one
/// specific way each (see their crate docs).
const TEST_PLUGINS: [&str; 10] = [
    "hostile",
    "alias",
    "describe-trap",
    "future-contract",
    "extra-import",
    "legacy",
    "overreach",
    "contract-0-2",
    "contract-0-3",
    "ifupdown",
];

/// Example vendor plugins: `(package, folder under the workspace)`.
const EXAMPLE_PLUGINS: [(&str, &str); 1] = [("nm-keyfile", "examples/plugins/nm-keyfile")];

fn env_var(name: &str, path: &Path) {
    let var = format!("PLUGIN_{}", name.to_uppercase().replace('-', "_"));
    println!("cargo:rustc-env={var}={}", path.display());
}

fn main() {
    let root = workspace_root();
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let plugins: Vec<(PluginCrate, &str)> = TEST_PLUGINS
        .iter()
        .map(|name| {
            (
                PluginCrate {
                    package: format!("fixup-plugin-{name}"),
                    dir: root.join("tests/plugins").join(name),
                },
                *name,
            )
        })
        .collect();
    // Some of them carry their own WIT (another contract version; an extra
    // import): rebuild when it changes.
    for name in TEST_PLUGINS {
        let wit = root.join("tests/plugins").join(name).join("wit");
        if wit.is_dir() {
            println!("cargo:rerun-if-changed={}", wit.display());
        }
    }
    // A plugin the host refuses at load for a WebAssembly feature it
    // switches off (relaxed SIMD; core/src/plugin/features.rs), built as the
    // others are.
    let refused = [(
        PluginCrate {
            package: "fixup-plugin-relaxed-simd".to_owned(),
            dir: root.join("tests/plugins/relaxed-simd"),
        },
        "relaxed-simd",
    )];
    let built = build_plugins(&root, &plugins, &out_dir).and_then(|paths| {
        for (name, path) in TEST_PLUGINS.iter().zip(paths) {
            env_var(name, &path);
        }
        for (package, dir) in EXAMPLE_PLUGINS {
            let plugin = PluginCrate {
                package: package.to_owned(),
                dir: root.join(dir),
            };
            let path = build_external_plugin(&root, &plugin, package, &out_dir)?;
            env_var(package, &path);
        }
        let paths = build_plugins(&root, &refused, &out_dir)?;
        for ((_, name), path) in refused.iter().zip(paths) {
            env_var(name, &path);
        }
        Ok(())
    });
    if let Err(e) = built {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
