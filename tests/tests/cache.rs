//! The precompiled cache: hits after the first load, never stale, never
//! trusted when corrupt.

use fixup_host::plugin::cache::{ArtifactCache, CacheOutcome};
use fixup_host::plugin::{EngineOptions, PluginHost};

fn hostile() -> Vec<u8> {
    std::fs::read(env!("PLUGIN_HOSTILE")).expect("built")
}

fn sha(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

#[test]
fn second_load_hits_and_corruption_is_rebuilt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = PluginHost::new(EngineOptions::default()).expect("engine");
    let cache = ArtifactCache::new(dir.path().to_owned(), host.engine());
    let wasm = hostile();
    let digest = sha(&wasm);

    let (_, first) = cache
        .lookup(host.engine(), &wasm, &digest)
        .expect("compiles");
    assert_eq!(first, CacheOutcome::Miss);
    let (_, second) = cache.lookup(host.engine(), &wasm, &digest).expect("loads");
    assert_eq!(second, CacheOutcome::Hit);

    // Flip one byte in the middle of the artifact.
    let path = cache.entry_path(&digest);
    let mut artifact = std::fs::read(&path).expect("artifact written");
    let mid = artifact.len() / 2;
    artifact[mid] ^= 0xff;
    std::fs::write(&path, &artifact).expect("corrupt it");
    let (_, third) = cache
        .lookup(host.engine(), &wasm, &digest)
        .expect("rebuilds");
    assert_eq!(third, CacheOutcome::Rebuilt);
    let (_, fourth) = cache.lookup(host.engine(), &wasm, &digest).expect("loads");
    assert_eq!(fourth, CacheOutcome::Hit, "the rebuilt entry is good again");

    // Truncated to nothing.
    std::fs::write(&path, b"").expect("truncate");
    let (_, fifth) = cache
        .lookup(host.engine(), &wasm, &digest)
        .expect("rebuilds");
    assert_eq!(fifth, CacheOutcome::Rebuilt);
}

#[test]
fn a_changed_plugin_never_hits_the_old_entry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = PluginHost::new(EngineOptions::default()).expect("engine");
    let cache = ArtifactCache::new(dir.path().to_owned(), host.engine());
    let wasm = hostile();
    cache
        .lookup(host.engine(), &wasm, &sha(&wasm))
        .expect("compiles");
    // Append a custom section: a different, still valid component.
    let mut changed = wasm.clone();
    changed.extend_from_slice(&[0x00, 0x04, 0x01, b'x', 0xaa, 0xbb]);
    assert_ne!(sha(&changed), sha(&wasm));
    let (_, outcome) = cache
        .lookup(host.engine(), &changed, &sha(&changed))
        .expect("compiles");
    assert_eq!(outcome, CacheOutcome::Miss);
    assert_ne!(
        cache.entry_path(&sha(&changed)),
        cache.entry_path(&sha(&wasm))
    );
}

#[test]
fn the_host_loads_builtins_through_the_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = EngineOptions {
        cache_dir: Some(dir.path().to_owned()),
        ..EngineOptions::default()
    };
    let mut host = PluginHost::new(options.clone()).expect("engine");
    host.load_builtins().expect("built-ins compile");
    let entries = std::fs::read_dir(dir.path())
        .expect("cache dir")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
        })
        .count();
    assert_eq!(entries, 4, "one artifact per built-in");
    let mut again = PluginHost::new(options).expect("engine");
    again.load_builtins().expect("built-ins load from cache");
    assert_eq!(again.registry().plugins().len(), 4);
}
