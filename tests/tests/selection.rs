//! Which plugin serves a VM: flavours, specificity, conflicts.

use std::path::Path;

use fixup_core::classify::Scenario;
use fixup_core::facts::Flavor;
use fixup_core::plugin::{EngineOptions, LoadError, Origin, PluginHost};

fn flavor(s: &str) -> Flavor {
    Flavor::parse(s).expect("valid flavour")
}

#[test]
fn a_flavoured_plugin_replaces_the_builtin_for_its_flavour_only() {
    let mut host = PluginHost::new(EngineOptions::default()).expect("engine");
    host.load_builtins().expect("built-ins");
    host.load_file(Path::new(env!("PLUGIN_HOSTILE")))
        .expect("hostile declares flavour `hostile`");
    let registry = host.registry();

    let chosen = registry
        .select(Scenario::OciNetworkd, Some(&flavor("hostile")))
        .expect("served");
    assert_eq!(chosen.plugin.info.name, "hostile");
    assert!(
        chosen.reason.contains("flavour `hostile`"),
        "{}",
        chosen.reason
    );
    assert!(
        chosen.reason.contains("built-in:oci-networkd"),
        "{}",
        chosen.reason
    );

    let generic = registry
        .select(Scenario::OciNetworkd, Some(&flavor("ubuntu")))
        .expect("served");
    assert_eq!(generic.plugin.info.name, "oci-networkd");
    assert!(
        generic
            .reason
            .contains("no plugin declares flavour `ubuntu`"),
        "{}",
        generic.reason
    );

    let none = registry
        .select(Scenario::OciNetworkd, None)
        .expect("served");
    assert_eq!(none.plugin.origin, Origin::BuiltIn("oci-networkd".into()));

    // The hostile plugin serves only oci-networkd: cloudimg stays built-in
    // even for its flavour.
    let cloud = registry
        .select(Scenario::Cloudimg, Some(&flavor("hostile")))
        .expect("served");
    assert_eq!(cloud.plugin.info.name, "cloudimg");
}

#[test]
/// Two files claiming the same thing (an upgrade that left the old file
/// behind) are a load error naming both, and the claim serves nobody: no
/// VM gets whichever file happened to load first. Everything else serves.
fn equal_claims_are_a_load_error_naming_both_files_and_serve_nobody() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bytes = std::fs::read(env!("PLUGIN_HOSTILE")).expect("built");
    std::fs::write(dir.path().join("a-hostile.wasm"), &bytes).expect("write");
    std::fs::write(dir.path().join("b-hostile.wasm"), &bytes).expect("write");
    std::fs::write(dir.path().join("c-broken.wasm"), b"not wasm").expect("write");
    let mut host = PluginHost::new(EngineOptions::default()).expect("engine");
    host.load_builtins().expect("built-ins");
    let failures = host.load_dir(dir.path()).expect("dir readable");
    assert_eq!(failures.len(), 2, "{failures:?}");
    let conflict = failures
        .iter()
        .find(|f| f.path.ends_with("b-hostile.wasm"))
        .expect("second copy refused");
    assert!(matches!(conflict.error, LoadError::Conflict(_)));
    let message = conflict.error.to_string();
    assert!(
        message.contains("a-hostile.wasm") && message.contains("b-hostile.wasm"),
        "{message}"
    );
    assert!(failures.iter().any(|f| f.path.ends_with("c-broken.wasm")));
    // The contested claim serves nobody, and says why.
    let refused = host
        .registry()
        .select(Scenario::OciNetworkd, Some(&flavor("hostile")))
        .expect_err("a contested claim is not served");
    let message = refused.to_string();
    for needle in [
        "a-hostile.wasm",
        "b-hostile.wasm",
        "c-broken.wasm",
        "remove one",
    ] {
        assert!(message.contains(needle), "{needle}: {message}");
    }
    // One bad file never stops the others: the built-ins still serve VMs
    // that ask for no flavour.
    let chosen = host
        .registry()
        .select(Scenario::OciNetworkd, None)
        .expect("served");
    assert_eq!(chosen.plugin.origin, Origin::BuiltIn("oci-networkd".into()));
    // A VM that asks for a flavour nobody declares is not given the generic
    // plan while a file did not load: that file may have been its plugin.
    let waits = host
        .registry()
        .select(Scenario::OciNetworkd, Some(&flavor("ubuntu")))
        .expect_err("not guessed");
    assert!(waits.is_node_config());
    assert!(waits.to_string().contains("did not load"), "{waits}");
}

#[test]
fn an_allow_list_refuses_every_other_plugin_file() {
    let bytes = std::fs::read(env!("PLUGIN_HOSTILE")).expect("built");
    let digest = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&bytes))
    };
    let other = "0".repeat(64);
    let options = |allowed: &[&str]| EngineOptions {
        allowed_sha256: Some(allowed.iter().map(|s| (*s).to_owned()).collect()),
        ..EngineOptions::default()
    };

    let mut strict = PluginHost::new(options(&[&other])).expect("engine");
    strict
        .load_builtins()
        .expect("built-ins are always trusted");
    let err = strict
        .load_file(Path::new(env!("PLUGIN_HOSTILE")))
        .expect_err("not on the list");
    let message = err.to_string();
    assert!(
        matches!(
            err,
            LoadError::Plugin(fixup_core::plugin::PluginError::NotAllowed { .. })
        ),
        "{err:?}"
    );
    assert!(message.contains(&digest), "names the digest: {message}");
    assert!(
        message.contains("--allow-plugin"),
        "says the fix: {message}"
    );

    let mut trusting = PluginHost::new(options(&[&other, &digest])).expect("engine");
    trusting
        .load_file(Path::new(env!("PLUGIN_HOSTILE")))
        .expect("listed digest loads");
}
