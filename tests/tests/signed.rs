//! Signed plugins through the real planner and the real daemon, signed by
//! the real cosign (built from `lab/cosign`, `host/tests/support/cosign.rs`)
//! and served by a real registry on loopback:
//!
//! - the vendor plugin nm-keyfile, pushed and signed with the vendor's key,
//!   is pulled, verified against `[plugin_trust]`, loaded and plans; with
//!   the vendor's key removed from the policy, the same stored plugin is
//!   refused, naming the plugin, the reference, the key and what failed;
//! - `serve` started with a signed plugin pinned reloads its configuration
//!   when the vendor's key is removed, and refuses that reload (the set in
//!   service stays, `/healthz` says why), then takes the key back.
//!
//! Skipped loudly without cosign or the registry, unless `.ci/run`
//! requires them (`COCOON_FIXUP_REQUIRE_COSIGN`,
//! `COCOON_FIXUP_REQUIRE_REGISTRY`).

#[allow(dead_code)]
#[path = "../../host/tests/support/cosign.rs"]
mod cosign;
#[allow(dead_code)]
#[path = "../../host/tests/support/go_tool.rs"]
mod go_tool;

use std::path::Path;

use cosign::Cosign;
use fixup_core::planner::Planner;
use fixup_host::oci::{OciError, PluginRef, Registry, RegistryOptions};
use fixup_tests::observation;
use fixup_tests::registry::LocalRegistry;

use crate::oci::{push_nm_keyfile, settings};
use crate::serve_reload::{Node, hostile};

/// The trust rule of `registry`'s `vendors` repositories, with these keys.
fn trust(registry: &LocalRegistry, keys: &[String]) -> String {
    let keys: Vec<String> = keys.iter().map(|k| format!("\"{k}\"")).collect();
    format!(
        "[plugin_trust.\"{}/vendors\"]\nkeys = [{}]\n",
        registry.host(),
        keys.join(", ")
    )
}

/// cosign with a vendor's and another key pair, and a registry; `None`
/// when either is missing (said by each).
fn bench(dir: &Path) -> Option<(Cosign, LocalRegistry)> {
    let cosign = Cosign::new(dir)?;
    let registry = LocalRegistry::start()?;
    cosign.generate("vendor");
    cosign.generate("other");
    Some((cosign, registry))
}

#[test]
fn a_plugin_the_vendor_signed_with_cosign_loads_and_plans_and_is_refused_once_its_key_is_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some((cosign, registry)) = bench(dir.path()) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let reference = push_nm_keyfile(&runtime, &registry);
    cosign.sign("vendor", &reference.to_string(), &[]);
    let (vendor, other) = (cosign.public_key("vendor"), cosign.public_key("other"));
    let wasm = std::fs::read(env!("PLUGIN_NM_KEYFILE")).expect("plugin");
    let wasm_sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&wasm));

    let signed = settings(
        dir.path(),
        &registry,
        &reference,
        &wasm_sha256,
        &trust(&registry, &[other.clone(), vendor.clone()]),
    );
    let files = runtime
        .block_on(signed.pinned.verified_files())
        .expect("signed by the vendor");
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].signers.len(), 1, "{:?}", files[0].signers);
    assert_eq!(files[0].signers[0].key, vendor);
    let paths: Vec<_> = files.iter().map(|f| f.path.clone()).collect();
    let (planner, failures) = Planner::with_files(signed.planner.clone(), &paths).expect("planner");
    assert!(failures.is_empty(), "{failures:?}");
    let obs = observation(
        "db-0",
        Some("networkmanager"),
        &[("52:54:00:12:34:56", Some("10.0.0.7/24"))],
    );
    let report =
        serde_json::to_value(planner.plan(&obs).expect("plans").report(&obs)).expect("report");
    assert_eq!(report["plugins"][0]["name"], "nm-keyfile", "{report}");

    // The vendor's key removed; the plugin and its signature are in the
    // store, and the registry is gone: verified again, and refused.
    let refused = settings(
        dir.path(),
        &registry,
        &reference,
        &wasm_sha256,
        &trust(&registry, std::slice::from_ref(&other)),
    );
    registry.stop();
    let err = runtime
        .block_on(refused.pinned.files())
        .expect_err("refused");
    assert!(matches!(err, OciError::Signature(_)), "{err}");
    let text = err.to_string();
    for part in [
        "plugin `vendors/nm-keyfile`",
        &reference.to_string(),
        &other,
        "none of the 1 signature(s) found verifies with it",
        "asking the registry for newer signatures failed",
    ] {
        assert!(text.contains(part), "{part:?} in {text}");
    }
    assert!(!text.contains(&format!("key {vendor}")), "{text}");
}

/// `serve` with a signed plugin pinned: a key file replaced on disk, and a
/// configuration that no longer trusts the vendor's key, are each reloaded,
/// verified, and refused, and the set in service stays; with the key back,
/// the next reload goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_reload_whose_policy_no_longer_trusts_the_signer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some((cosign, registry)) = bench(dir.path()) else {
        return;
    };
    let host = registry.host().to_owned();
    let options = RegistryOptions {
        plain_http: vec![host.clone()],
        credentials: None,
    };
    let tagged: PluginRef = format!("oci://{host}/vendors/hostile:1")
        .parse()
        .expect("reference");
    let pinned = Registry::new(&options)
        .expect("client")
        .push(&tagged, &hostile("signed"))
        .await
        .expect("pushed");
    cosign.sign("vendor", &pinned.to_string(), &[]);
    let (vendor, other) = (cosign.public_key("vendor"), cosign.public_key("other"));
    let path = dir.path().to_owned();
    let config = |keys: &[String]| {
        format!(
            "plugins = [\"{pinned}\"]\noci_plain_http = [\"{host}\"]\noci_store = \"{}\"\n{}",
            path.join("oci").display(),
            trust(&registry, keys)
        )
    };
    // The configuration written whole, as an operator renames it into place.
    let rewrite = |keys: &[String]| {
        let staged = path.join("config.toml.new");
        std::fs::write(&staged, format!("# flags set the rest\n{}", config(keys))).expect("staged");
        std::fs::rename(&staged, path.join("config.toml")).expect("config");
    };
    let node = Node::start_in(dir, &config(std::slice::from_ref(&vendor)), "web-a").await;
    assert_eq!(node.reloads("rejected").await, 0, "the daemon is up");
    assert_eq!(node.get("/healthz").await.as_deref(), Some("ok\n"));

    // The key file is watched: replaced on disk by another key, with the
    // configuration untouched, it reloads the set, which is refused.
    let put_key = |from: &str| {
        let staged = path.join("vendor.pub.new");
        std::fs::copy(from, &staged).expect("staged key");
        std::fs::rename(&staged, &vendor).expect("key");
    };
    let vendor_saved = path.join("vendor.pub.saved");
    std::fs::copy(&vendor, &vendor_saved).expect("saved key");
    put_key(&other);
    node.until_reloads("rejected", 1).await;
    let health = node.get("/healthz").await.expect("/healthz");
    assert!(health.contains("plugin `vendors/hostile`"), "{health}");
    put_key(&vendor_saved.display().to_string());
    node.until_reloads("swapped", 1).await;
    assert_eq!(node.get("/healthz").await.as_deref(), Some("ok\n"));

    rewrite(std::slice::from_ref(&other));
    node.until_reloads("rejected", 2).await;
    let health = node.get("/healthz").await.expect("/healthz");
    for part in [
        "plugin reload refused",
        "plugin `vendors/hostile`",
        &pinned.to_string(),
        &other,
        "none of the 1 signature(s) found verifies with it",
    ] {
        assert!(health.contains(part), "{part:?} in {health}");
    }

    rewrite(&[vendor, other]);
    node.until_reloads("swapped", 2).await;
    assert_eq!(node.get("/healthz").await.as_deref(), Some("ok\n"));
}
