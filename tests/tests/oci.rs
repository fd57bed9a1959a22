//! A plugin pinned by OCI reference in the configuration file: pushed to a
//! real registry on loopback, pulled into the store at start, verified,
//! and loaded like a plugin file, with the allow-list applied unchanged.
//! The vendor plugin `nm-keyfile` (flavour `networkmanager`) is the one
//! pushed, so it serves beside the built-ins. Skipped, with the reason
//! printed, only when `docker-registry` is not installed.

use std::path::Path;

use fixup_core::planner::Planner;
use fixup_core::plugin::{LoadError, PluginError};
use fixup_host::config::{ConfigArgs, Resolved};
use fixup_host::oci::{PluginRef, Registry, RegistryOptions};
use fixup_tests::observation;
use fixup_tests::registry::LocalRegistry;
use sha2::{Digest, Sha256};

/// Push nm-keyfile to `registry`; its pinned reference.
pub(crate) fn push_nm_keyfile(
    runtime: &tokio::runtime::Runtime,
    registry: &LocalRegistry,
) -> PluginRef {
    let wasm = std::fs::read(env!("PLUGIN_NM_KEYFILE")).expect("the built plugin");
    let tagged: PluginRef = format!("oci://{}/vendors/nm-keyfile:1.0", registry.host())
        .parse()
        .expect("reference");
    let options = RegistryOptions {
        plain_http: vec![registry.host().to_owned()],
        credentials: None,
    };
    runtime
        .block_on(Registry::new(&options).unwrap().push(&tagged, &wasm))
        .expect("pushed")
}

/// Settings from a configuration file that pins `reference`, with the
/// store and cocoon root under `dir`, `allowed` as the allow-list, and
/// `extra` (tables) after.
pub(crate) fn settings(
    dir: &Path,
    registry: &LocalRegistry,
    reference: &PluginRef,
    allowed: &str,
    extra: &str,
) -> Resolved {
    let config = dir.join("config.toml");
    std::fs::create_dir_all(dir.join("root")).expect("cocoon root");
    std::fs::write(
        &config,
        format!(
            "plugins = [\"{reference}\"]\noci_plain_http = [\"{}\"]\noci_store = \"{}\"\nallowed_plugins = [\"{allowed}\"]\ncocoon_root = \"{}\"\nno_cache = true\n{extra}",
            registry.host(),
            dir.join("oci").display(),
            dir.join("root").display(),
        ),
    )
    .expect("config");
    ConfigArgs::default()
        .resolve(Some(&config))
        .expect("resolves")
}

#[test]
fn a_pinned_reference_in_the_config_is_pulled_verified_and_loaded_under_the_allow_list() {
    let Some(registry) = LocalRegistry::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let reference = push_nm_keyfile(&runtime, &registry);
    let wasm_sha256 = hex::encode(Sha256::digest(
        std::fs::read(env!("PLUGIN_NM_KEYFILE")).expect("plugin"),
    ));
    let dir = tempfile::tempdir().expect("tempdir");

    let allowed = settings(dir.path(), &registry, &reference, &wasm_sha256, "");
    let files = runtime.block_on(allowed.pinned.files()).expect("pulled");
    let (planner, failures) =
        Planner::with_files(allowed.planner.clone(), &files).expect("planner");
    assert!(failures.is_empty(), "{failures:?}");
    let obs = observation(
        "db-0",
        Some("networkmanager"),
        &[("52:54:00:12:34:56", Some("10.0.0.7/24"))],
    );
    let outcome = planner.plan(&obs).expect("plans");
    let report = serde_json::to_value(outcome.report(&obs)).expect("report");
    assert_eq!(report["plugins"][0]["name"], "nm-keyfile", "{report}");
    assert_eq!(report["plugins"][0]["sha256"], wasm_sha256.as_str());
    assert_eq!(
        report["plugins"][0]["source"],
        files[0].display().to_string(),
        "loaded from the store"
    );

    // "Is my pinned plugin accepted on this node?": `plugin inspect` of
    // the store's file, and of a pulled copy of the same bytes, judges it
    // in its reference's place, never as a second file claiming what it
    // claims itself.
    let copy = dir.path().join("pulled.wasm");
    std::fs::copy(&files[0], &copy).expect("a copy");
    for file in [&files[0], &copy] {
        let out = std::process::Command::new(crate::serve_reload::binary::program())
            .args(["plugin", "inspect"])
            .arg(file)
            .arg("--config")
            .arg(dir.path().join("config.toml"))
            .env("HOME", dir.path())
            .output()
            .expect("inspect runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("verdict    accepted"),
            "{}: {stdout}{}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!stdout.contains("also serves"), "{stdout}");
    }

    // The same reference under an allow-list that does not name its wasm:
    // pulled and verified (it is in the store already), then refused.
    let other = "0".repeat(64);
    let refused = settings(dir.path(), &registry, &reference, &other, "");
    let files = runtime.block_on(refused.pinned.files()).expect("stored");
    let (_planner, failures) = Planner::with_files(refused.planner, &files).expect("planner");
    let [failure] = failures.as_slice() else {
        panic!("one failure: {failures:?}");
    };
    assert!(
        matches!(
            &failure.error,
            LoadError::Plugin(PluginError::NotAllowed { sha256, .. }) if *sha256 == wasm_sha256
        ),
        "{}",
        failure.error
    );
}
