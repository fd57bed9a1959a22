//! Builds the four built-in plugins for wasm32-wasip2 so the library can
//! embed them, with their sha256 (see `src/plugin/builtin.rs`).

use fixup_plugin_build::{PluginCrate, build_plugins, workspace_root};

const BUILTINS: [&str; 4] = ["cloudimg", "oci-networkd", "fc-mac", "windows-pnp"];

fn main() {
    let root = workspace_root();
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let plugins: Vec<(PluginCrate, &str)> = BUILTINS
        .iter()
        .map(|name| {
            (
                PluginCrate {
                    package: format!("fixup-plugin-{name}"),
                    dir: root.join("plugins").join(name),
                },
                *name,
            )
        })
        .collect();
    if let Err(e) = build_plugins(&root, &plugins, &out_dir) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    // Each plugin's sha256 beside it, so a start does not hash the bytes
    // the binary carries.
    for name in BUILTINS {
        let wasm = out_dir.join(format!("{name}.wasm"));
        let bytes = std::fs::read(&wasm).expect("the plugin just built");
        let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
        std::fs::write(out_dir.join(format!("{name}.sha256")), digest)
            .expect("OUT_DIR is writable");
    }
}
