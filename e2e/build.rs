//! Builds the example vendor plugin `nm-keyfile` (examples/plugins/, its
//! own workspace) for wasm32-wasip2, the way a vendor builds it: the
//! NetworkManager scenario loads it from a plugin directory. Its path
//! reaches the tests as `env!("PLUGIN_NM_KEYFILE")`.

use fixup_plugin_build::{PluginCrate, build_external_plugin, workspace_root};

fn main() {
    let root = workspace_root();
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let plugin = PluginCrate {
        package: "nm-keyfile".to_owned(),
        dir: root.join("examples/plugins/nm-keyfile"),
    };
    match build_external_plugin(&root, &plugin, "nm-keyfile", &out_dir) {
        Ok(path) => println!("cargo:rustc-env=PLUGIN_NM_KEYFILE={}", path.display()),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
