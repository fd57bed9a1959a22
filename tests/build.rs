//! Builds the test-only plugins (under `tests/plugins/`) for wasm32-wasip2,
//! so `cargo test` needs no extra step. Their paths reach the tests as
//! `env!("PLUGIN_<NAME>")`.

use fixup_plugin_build::{PluginCrate, build_plugins, workspace_root};

const TEST_PLUGINS: [&str; 1] = ["hostile"];

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
    match build_plugins(&root, &plugins, &out_dir) {
        Ok(paths) => {
            for (name, path) in TEST_PLUGINS.iter().zip(paths) {
                let var = format!("PLUGIN_{}", name.to_uppercase().replace('-', "_"));
                println!("cargo:rustc-env={var}={}", path.display());
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
