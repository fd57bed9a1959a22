//! The precompiled cache: hits after the first load, never stale, and
//! never trusted when an entry is corrupt, swapped in from another plugin,
//! made under another key or reached through a link, nor when the
//! directory or the key could be written by another user.
//!
//! These tests run as root (as CI does); the ones that hand a directory or
//! a file to another user need root for `chown` and say so when skipped.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use fixup_core::classify::Scenario;
use fixup_core::plugin::builtin::BUILTINS;
use fixup_core::plugin::cache::{ArtifactCache, CacheError, CacheOutcome, MAGIC};
use fixup_core::plugin::trusted::Untrusted;
use fixup_core::plugin::{Allocation, EngineOptions, PluginHost};
use fixup_tests::facts;

/// A uid no test machine gives to the user running the tests.
const OTHER_UID: u32 = 4242;

fn hostile() -> Vec<u8> {
    std::fs::read(env!("PLUGIN_HOSTILE")).expect("built")
}

/// The bytes of the built-in plugin `name`.
fn builtin(name: &str) -> &'static [u8] {
    BUILTINS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, bytes)| *bytes)
        .expect("a built-in of that name")
}

fn sha(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn is_root() -> bool {
    fixup_core::plugin::trusted::euid() == 0
}

/// A cache directory and a key file apart from it, in a private temporary
/// directory.
struct Place {
    root: tempfile::TempDir,
    cache: PathBuf,
    key: PathBuf,
}

fn place() -> Place {
    let root = tempfile::tempdir().expect("tempdir");
    let cache = root.path().join("cache");
    let key = root.path().join("keys").join("cache.key");
    Place { root, cache, key }
}

impl Place {
    fn open(&self, host: &PluginHost) -> Result<ArtifactCache, CacheError> {
        ArtifactCache::open(&self.cache, Some(&self.key), host.engine())
    }

    fn options(&self) -> EngineOptions {
        EngineOptions {
            cache_dir: Some(self.cache.clone()),
            cache_key: Some(self.key.clone()),
            ..EngineOptions::default()
        }
    }

    /// A first start: the built-ins (and, if asked, the hostile plugin)
    /// compiled and described into the cache; the host and the cache.
    fn first_start(&self, hostile: bool) -> (PluginHost, ArtifactCache) {
        let mut first = PluginHost::new(self.options()).expect("engine");
        first.load_builtins().expect("built-ins compile");
        if hostile {
            first
                .load_file(Path::new(env!("PLUGIN_HOSTILE")))
                .expect("hostile");
        }
        let cache = self.open(&first).expect("cache");
        (first, cache)
    }

    fn entries(&self) -> usize {
        std::fs::read_dir(&self.cache)
            .map(|dir| {
                dir.filter(|e| {
                    e.as_ref()
                        .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
                })
                .count()
            })
            .unwrap_or(0)
    }
}

fn engine() -> PluginHost {
    PluginHost::new(EngineOptions::default()).expect("engine")
}

/// A cache at `place` holding the entry of [`hostile`], compiled.
struct Compiled {
    host: PluginHost,
    cache: ArtifactCache,
    wasm: Vec<u8>,
    digest: String,
    /// The entry's file.
    path: PathBuf,
}

fn compiled(place: &Place) -> Compiled {
    let host = engine();
    let cache = place.open(&host).expect("cache");
    let wasm = hostile();
    let digest = sha(&wasm);
    cache
        .lookup(host.engine(), &wasm, &digest)
        .expect("compiles");
    let path = cache.entry_path(&digest);
    Compiled {
        host,
        cache,
        wasm,
        digest,
        path,
    }
}

#[test]
fn second_load_hits_and_corruption_is_rebuilt() {
    let place = place();
    let host = engine();
    let cache = place.open(&host).expect("cache");
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

/// A one-shot engine (no instance pool) has the same engine key as the
/// daemon's: it hits the entries the daemon wrote and its plugins plan the
/// same plans.
#[test]
fn an_on_demand_engine_shares_the_cache_and_plans_the_same() {
    let place = place();
    let nic = [("52:54:00:aa:bb:01", Some("10.0.0.5/24"))];
    let plan_of = |host: &PluginHost, scenario: Scenario| {
        let selection = host.registry().select(scenario, None).expect("a plugin");
        host.plan(&selection.plugin, scenario, &facts("web-0", None, &nic))
            .expect("plans")
            .0
    };
    let (first, cache) = place.first_start(false);
    let mut one_shot =
        PluginHost::with_allocation(place.options(), Allocation::OnDemand).expect("engine");
    let shared = place.open(&one_shot).expect("cache");
    assert_eq!(
        shared.entry_path("x"),
        cache.entry_path("x"),
        "the same engine key"
    );
    one_shot.load_builtins().expect("built-ins");
    assert_eq!(
        plan_of(&one_shot, Scenario::OciNetworkd),
        plan_of(&first, Scenario::OciNetworkd)
    );
    let (_, outcome) = shared
        .lookup(
            one_shot.engine(),
            builtin("cloudimg"),
            &sha(builtin("cloudimg")),
        )
        .expect("loads");
    assert_eq!(outcome, CacheOutcome::Hit);
    assert_eq!(place.entries(), 4, "nothing compiled again");
}

/// An entry holds the artifact from its first byte (so it can be mapped
/// and run in place), then the magic and the MAC: a change to the
/// trailer's MAC, to the magic, or a byte appended after it, is refused
/// and the entry compiled again.
#[test]
fn a_tampered_trailer_is_rebuilt() {
    let place = place();
    let Compiled {
        host,
        cache,
        wasm,
        digest,
        path,
    } = compiled(&place);
    let genuine = std::fs::read(&path).expect("entry");
    assert!(
        genuine.starts_with(b"\x7fELF"),
        "the artifact comes first, as wasmtime maps it"
    );
    let magic_at = genuine.len() - 32 - MAGIC.len();
    assert_eq!(&genuine[magic_at..magic_at + MAGIC.len()], MAGIC);

    /// What to change in a genuine entry.
    type Tamper = fn(&mut Vec<u8>, usize);
    let tampered: [(&str, Tamper); 4] = [
        ("the MAC's last byte", |e, _| *e.last_mut().unwrap() ^= 1),
        ("the magic", |e, magic_at| e[magic_at] ^= 1),
        ("a byte appended", |e, _| e.push(0)),
        ("the ELF header", |e, _| e[20] ^= 0x40),
    ];
    for (what, tamper) in tampered {
        let mut entry = genuine.clone();
        tamper(&mut entry, magic_at);
        std::fs::write(&path, &entry).expect("tamper");
        let (_, outcome) = cache
            .lookup(host.engine(), &wasm, &digest)
            .expect("rebuilds");
        assert_eq!(outcome, CacheOutcome::Rebuilt, "{what}");
        let (_, outcome) = cache.lookup(host.engine(), &wasm, &digest).expect("loads");
        assert_eq!(outcome, CacheOutcome::Hit, "{what}: rebuilt and good again");
    }
}

/// An entry of the earlier format (magic and MAC before the artifact,
/// named without `.v2`), even one authentic under the same key, is not
/// read: the plugin is compiled into the current format and the earlier
/// file removed. The same bytes under the current name are refused.
#[test]
fn an_entry_of_the_earlier_format_is_replaced() {
    let place = place();
    let Compiled {
        host,
        cache,
        wasm,
        digest,
        path,
    } = compiled(&place);
    let current = std::fs::read(&path).expect("entry");
    let (artifact, trailer) = current.split_at(current.len() - 32 - MAGIC.len());
    let mut old = b"cfxc\0v1\0".to_vec();
    old.extend_from_slice(&trailer[MAGIC.len()..]);
    old.extend_from_slice(artifact);
    let name = path.file_name().unwrap().to_str().unwrap();
    let earlier = path.with_file_name(name.replace(".v2.cwasm", ".cwasm"));
    assert_ne!(earlier, path);

    std::fs::write(&path, &old).expect("old format, current name");
    let (_, outcome) = cache
        .lookup(host.engine(), &wasm, &digest)
        .expect("rebuilds");
    assert_eq!(outcome, CacheOutcome::Rebuilt);
    assert_eq!(std::fs::read(&path).expect("entry"), current, "rewritten");

    std::fs::remove_file(&path).expect("remove");
    std::fs::write(&earlier, &old).expect("old format, old name");
    std::fs::write(earlier.with_extension("cwasm.sha256"), b"0").expect("checksum");
    let (_, outcome) = cache
        .lookup(host.engine(), &wasm, &digest)
        .expect("compiles");
    assert_eq!(outcome, CacheOutcome::Miss, "the earlier name is not read");
    assert_eq!(std::fs::read(&path).expect("entry"), current, "written");
    assert!(!earlier.exists(), "the earlier entry is removed");
    assert!(
        !earlier.with_extension("cwasm.sha256").exists(),
        "and its checksum file"
    );
}

/// A hit is mapped, not copied: the component loaded from the mapped
/// entry plans what the compiled one plans.
#[test]
fn a_mapped_entry_plans_as_the_compiled_plugin() {
    let place = place();
    let nic = [("52:54:00:aa:bb:01", Some("10.0.0.5/24"))];
    let plan_of = |host: &PluginHost| {
        let selection = host
            .registry()
            .select(Scenario::OciNetworkd, None)
            .expect("oci-networkd");
        host.plan(
            &selection.plugin,
            Scenario::OciNetworkd,
            &facts("web-0", None, &nic),
        )
        .expect("plans")
        .0
    };
    let (first, cache) = place.first_start(false);
    let compiled = plan_of(&first);
    let mut second = PluginHost::new(place.options()).expect("engine");
    second.load_builtins().expect("built-ins");
    let digest = sha(builtin("oci-networkd"));
    let (component, outcome) = cache
        .lookup(second.engine(), builtin("oci-networkd"), &digest)
        .expect("loads");
    assert_eq!(outcome, CacheOutcome::Hit);
    assert_eq!(plan_of(&second), compiled);
    // Mapped from the entry itself, not copied into anonymous memory.
    let entry = cache.entry_path(&digest);
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    assert!(
        maps.lines()
            .any(|l| l.ends_with(&*entry.to_string_lossy()) && l.contains("r-x")),
        "{} is not mapped executable:\n{maps}",
        entry.display()
    );
    drop(component);
}

#[test]
fn a_changed_plugin_never_hits_the_old_entry() {
    let place = place();
    let host = engine();
    let cache = place.open(&host).expect("cache");
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
    let place = place();
    let mut host = PluginHost::new(place.options()).expect("engine");
    assert!(host.cache().is_some(), "the cache is in use");
    host.load_builtins().expect("built-ins compile");
    assert_eq!(place.entries(), 4, "one artifact per built-in");
    let mut again = PluginHost::new(place.options()).expect("engine");
    again.load_builtins().expect("built-ins load from cache");
    assert_eq!(again.registry().plugins().len(), 4);
}

/// The info, policy and imports each registered plugin shows.
fn described(host: &PluginHost) -> Vec<String> {
    host.registry()
        .plugins()
        .iter()
        .map(|p| {
            format!(
                "{:?} {:?} {:?} {} {:?}",
                p.info,
                p.policy,
                p.imports,
                p.contract(),
                p.policy_source
            )
        })
        .collect()
}

/// A start from the cache registers every plugin from its describe record,
/// as the first start described it, and loads the code of a plugin only
/// when it is called; `warm` links the rest.
#[test]
fn a_cached_start_links_only_the_plugins_it_calls() {
    let place = place();
    let (first, cache) = place.first_start(false);
    for plugin in first.registry().plugins() {
        assert!(
            plugin.is_linked(),
            "described by a call: {}",
            plugin.info.name
        );
        assert!(
            cache.record_path(&plugin.sha256).is_file(),
            "{}",
            plugin.info.name
        );
    }

    let mut second = PluginHost::new(place.options()).expect("engine");
    second.load_builtins().expect("built-ins from the cache");
    assert_eq!(described(&second), described(&first));
    let linked = |host: &PluginHost| -> Vec<String> {
        host.registry()
            .plugins()
            .iter()
            .filter(|p| p.is_linked())
            .map(|p| p.info.name.clone())
            .collect()
    };
    assert!(linked(&second).is_empty(), "nothing linked before a call");
    let selection = second
        .registry()
        .select(Scenario::OciNetworkd, None)
        .expect("oci-networkd is served");
    let nic = [("52:54:00:aa:bb:01", Some("10.0.0.5/24"))];
    let facts = facts("web-0", None, &nic);
    let (from_record, _) = second
        .plan(&selection.plugin, Scenario::OciNetworkd, &facts)
        .expect("plans");
    assert_eq!(linked(&second), ["oci-networkd"]);
    let eager = first
        .registry()
        .select(Scenario::OciNetworkd, None)
        .expect("served");
    let (described_now, _) = first
        .plan(&eager.plugin, Scenario::OciNetworkd, &facts)
        .expect("plans");
    assert_eq!(from_record, described_now, "the same plan either way");
    assert!(second.warm().is_empty(), "every plugin links");
    assert_eq!(linked(&second).len(), 4);
}

/// A describe record changed on disk, copied from another plugin or made
/// under another key fails authentication: the plugin is described again
/// (by a call) and the record rewritten; what it says never reaches the
/// registry.
#[test]
fn a_forged_describe_record_is_not_believed() {
    let place = place();
    let (first, cache) = place.first_start(true);
    let networkd = builtin("oci-networkd");
    let networkd_record = cache.record_path(&sha(networkd));
    let cloudimg = builtin("cloudimg");
    let cloudimg_record = cache.record_path(&sha(cloudimg));
    let genuine = std::fs::read(&networkd_record).expect("record");

    // Another plugin's record, and one edited in place to claim a flavour.
    std::fs::copy(cache.record_path(&sha(&hostile())), &networkd_record).expect("swap");
    let edited = String::from_utf8_lossy(&std::fs::read(&cloudimg_record).expect("record"))
        .replace("\"flavors\":[]", "\"flavors\":[\"alpine\"]")
        .into_bytes();
    assert_ne!(edited, std::fs::read(&cloudimg_record).expect("record"));
    std::fs::write(&cloudimg_record, &edited).expect("edit");

    let mut second = PluginHost::new(place.options()).expect("engine");
    second.load_builtins().expect("built-ins");
    let mut expected = described(&first);
    expected.truncate(4);
    assert_eq!(
        described(&second),
        expected,
        "as the plugins describe themselves"
    );
    for name in ["oci-networkd", "cloudimg"] {
        let plugin = second
            .registry()
            .plugins()
            .iter()
            .find(|p| p.info.name == name)
            .expect("registered")
            .clone();
        assert!(plugin.is_linked(), "{name} was described by a call");
    }
    assert_eq!(
        std::fs::read(&networkd_record).expect("rewritten"),
        genuine,
        "the record is written again"
    );

    // Under another key every record fails: every plugin is described.
    let other = EngineOptions {
        cache_key: Some(place.root.path().join("other-keys").join("cache.key")),
        ..place.options()
    };
    let mut third = PluginHost::new(other).expect("engine");
    third.load_builtins().expect("built-ins");
    assert!(third.registry().plugins().iter().all(|p| p.is_linked()));
    assert_eq!(described(&third), expected);
}

/// A describe record as the host writes it, under the key at `key`:
/// `body` (JSON) for the plugin with digest `sha256`, beside `record`.
fn write_record(record: &Path, key: &Path, sha256: &str, body: &serde_json::Value) {
    use hmac::{Hmac, Mac};
    let name = record.file_name().unwrap().to_str().unwrap();
    let engine_key = name
        .strip_prefix(&format!("{sha256}-"))
        .and_then(|rest| rest.strip_suffix(".describe"))
        .expect("<sha256>-<engine key>.describe");
    let body = serde_json::to_vec(body).unwrap();
    let magic = b"cfxd\0v1\0";
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&std::fs::read(key).unwrap()).unwrap();
    for part in [
        magic.as_slice(),
        sha256.as_bytes(),
        b"\0",
        engine_key.as_bytes(),
        b"\0",
        &body,
    ] {
        mac.update(part);
    }
    let mut entry = magic.to_vec();
    entry.extend_from_slice(&mac.finalize().into_bytes());
    entry.extend_from_slice(&body);
    std::fs::write(record, entry).unwrap();
}

/// The JSON body of a record.
fn record_body(record: &Path) -> serde_json::Value {
    let entry = std::fs::read(record).unwrap();
    serde_json::from_slice(&entry[8 + 32..]).unwrap()
}

/// An authentic record the code does not match (written, say, by a host
/// that read contracts differently): the plugin is registered from it, its
/// code fails to load at its first call, and that is a node error naming
/// the cache files, not a plan failure; `warm` reports it.
#[test]
fn code_that_does_not_match_its_record_is_a_node_error() {
    let place = place();
    let (_, cache) = place.first_start(false);
    let networkd = builtin("oci-networkd");
    let record = cache.record_path(&sha(networkd));
    let mut body = record_body(&record);
    assert_eq!(body["contract"], "0.4.0");
    body["contract"] = "0.1.0".into();
    body["info_contract"] = "0.1.0".into();
    body["policy"] = serde_json::Value::Null;
    write_record(&record, &place.key, &sha(networkd), &body);

    let mut second = PluginHost::new(place.options()).expect("engine");
    second.load_builtins().expect("built-ins");
    let selection = second
        .registry()
        .select(Scenario::OciNetworkd, None)
        .expect("registered from the record");
    assert!(!selection.plugin.is_linked());
    let nic = [("52:54:00:aa:bb:01", Some("10.0.0.5/24"))];
    let err = second
        .plan(
            &selection.plugin,
            Scenario::OciNetworkd,
            &facts("web-0", None, &nic),
        )
        .expect_err("the code exports another contract");
    assert!(err.is_node_config(), "{err}");
    let text = err.to_string();
    assert!(text.contains("record says contract 0.1.0"), "{text}");
    assert!(
        text.contains(&sha(networkd)),
        "names the cache files: {text}"
    );
    let unlinked = second.warm();
    assert_eq!(unlinked.len(), 1, "{unlinked:?}");
    assert!(unlinked[0].is_node_config());
}

/// A record another host version wrote is not used: the plugin is
/// described again and the record rewritten for this version.
#[test]
fn a_record_from_another_host_version_is_described_again() {
    let place = place();
    let (_, cache) = place.first_start(false);
    let cloudimg = builtin("cloudimg");
    let record = cache.record_path(&sha(cloudimg));
    let genuine = record_body(&record);
    let mut older = genuine.clone();
    older["host"] = "0.0.1".into();
    older["summary"] = "from an older host".into();
    write_record(&record, &place.key, &sha(cloudimg), &older);

    let mut second = PluginHost::new(place.options()).expect("engine");
    second.load_builtins().expect("built-ins");
    let plugin = second
        .registry()
        .plugins()
        .iter()
        .find(|p| p.info.name == "cloudimg")
        .expect("registered")
        .clone();
    assert!(plugin.is_linked(), "described by a call");
    assert_ne!(plugin.info.summary, "from an older host");
    assert_eq!(record_body(&record), genuine, "rewritten by this version");
}

/// Another plugin's entry copied over a built-in's (what once made the
/// hostile plugin run as `built-in:oci-networkd`): its MAC names the other
/// plugin, so the entry is compiled again from the built-in's own bytes,
/// and the built-in plans its own plan.
#[test]
fn an_entry_swapped_in_from_another_plugin_is_rebuilt_and_the_builtin_plans_its_own_plan() {
    let place = place();
    let (first, cache) = place.first_start(true);
    let networkd = builtin("oci-networkd");
    let builtin_entry = cache.entry_path(&sha(networkd));
    let hostile_entry = cache.entry_path(&sha(&hostile()));
    std::fs::copy(&hostile_entry, &builtin_entry).expect("swap the entry");

    let mut second = PluginHost::new(place.options()).expect("engine");
    second.load_builtins().expect("built-ins");
    let selection = second
        .registry()
        .select(Scenario::OciNetworkd, None)
        .expect("the built-in still serves oci-networkd");
    assert_eq!(selection.plugin.info.name, "oci-networkd");
    let nic = [("52:54:00:aa:bb:01", Some("10.0.0.5/24"))];
    let (plan, _) = second
        .plan(
            &selection.plugin,
            Scenario::OciNetworkd,
            &facts("web-0", None, &nic),
        )
        .expect("plans");
    assert!(plan.steps.len() >= 4, "the networkd plan: {plan:?}");
    assert_ne!(
        std::fs::read(&builtin_entry).expect("entry"),
        std::fs::read(&hostile_entry).expect("entry"),
        "the swapped entry was replaced"
    );

    // The same swap seen by a lookup.
    std::fs::copy(&hostile_entry, &builtin_entry).expect("swap again");
    let (_, outcome) = cache
        .lookup(first.engine(), networkd, &sha(networkd))
        .expect("compiles");
    assert_eq!(outcome, CacheOutcome::Rebuilt);
}

#[test]
fn an_entry_made_under_another_key_is_rebuilt() {
    let place = place();
    let host = engine();
    let wasm = hostile();
    let cache = place.open(&host).expect("cache");
    cache
        .lookup(host.engine(), &wasm, &sha(&wasm))
        .expect("compiles");
    let other_key = place.root.path().join("other.key");
    let other = ArtifactCache::open(&place.cache, Some(&other_key), host.engine()).expect("cache");
    let (_, outcome) = other
        .lookup(host.engine(), &wasm, &sha(&wasm))
        .expect("compiles");
    assert_eq!(outcome, CacheOutcome::Rebuilt);
}

/// A cache directory others may write is never used, sticky bit or not:
/// the host warns, compiles, and writes nothing there.
#[test]
fn a_cache_directory_others_can_write_is_refused() {
    for mode in [0o777, 0o1777, 0o775] {
        let place = place();
        std::fs::create_dir(&place.cache).expect("mkdir");
        chmod(&place.cache, mode);
        let err = place.open(&engine()).expect_err("refused");
        assert!(
            matches!(&err, CacheError::Dir(Untrusted::Writable { path, .. }) if path.ends_with("cache")),
            "{mode:o}: {err}"
        );
        assert!(err.to_string().contains("chmod go-w"), "{err}");

        let mut host = PluginHost::new(place.options()).expect("engine");
        assert!(host.cache().is_none(), "{mode:o}: not used");
        host.load_builtins().expect("built-ins compile without it");
        assert_eq!(place.entries(), 0, "{mode:o}: nothing written there");
    }
}

#[test]
fn a_cache_directory_owned_by_another_user_is_refused() {
    if !is_root() {
        eprintln!("skipped: handing a directory to another user needs root");
        return;
    }
    let place = place();
    std::fs::create_dir(&place.cache).expect("mkdir");
    chmod(&place.cache, 0o700);
    std::os::unix::fs::chown(&place.cache, Some(OTHER_UID), None).expect("chown");
    let err = place.open(&engine()).expect_err("refused");
    assert!(
        matches!(
            err,
            CacheError::Dir(Untrusted::Owner {
                owner: OTHER_UID,
                ..
            })
        ),
        "{err}"
    );
    let mut host = PluginHost::new(place.options()).expect("engine");
    assert!(host.cache().is_none());
    host.load_builtins().expect("built-ins compile without it");
    assert_eq!(place.entries(), 0);
}

/// Every directory above the cache counts: one others may write is
/// refused, unless it is root's and sticky (`/tmp`), where nobody else can
/// rename or remove what is below it.
#[test]
fn a_cache_below_a_directory_others_can_write_is_refused_unless_it_is_roots_and_sticky() {
    let place = place();
    chmod(place.root.path(), 0o777);
    let err = place.open(&engine()).expect_err("refused");
    assert!(
        matches!(&err, CacheError::Dir(Untrusted::Writable { path, .. }) if path == &std::fs::canonicalize(place.root.path()).unwrap()),
        "{err}"
    );
    assert!(!place.cache.exists(), "nothing created below it");
    if is_root() {
        chmod(place.root.path(), 0o1777);
        place
            .open(&engine())
            .expect("a root-owned sticky parent is fine");
    }
}

/// An entry that is a link is replaced, never followed: not even a link to
/// a genuine entry under the same key is a hit.
#[test]
fn a_linked_entry_is_not_followed() {
    let place = place();
    let host = engine();
    let wasm = hostile();
    let digest = sha(&wasm);
    let genuine_dir = place.root.path().join("genuine");
    let genuine =
        ArtifactCache::open(&genuine_dir, Some(&place.key), host.engine()).expect("cache");
    genuine
        .lookup(host.engine(), &wasm, &digest)
        .expect("compiles");
    let target = genuine.entry_path(&digest);
    let before = std::fs::read(&target).expect("genuine entry");

    let cache = place.open(&host).expect("cache");
    let entry = cache.entry_path(&digest);
    std::os::unix::fs::symlink(&target, &entry).expect("link");
    let (_, outcome) = cache
        .lookup(host.engine(), &wasm, &digest)
        .expect("compiles");
    assert_eq!(outcome, CacheOutcome::Rebuilt);
    assert!(
        std::fs::symlink_metadata(&entry)
            .expect("entry")
            .file_type()
            .is_file(),
        "the link was replaced by a file"
    );
    assert_eq!(std::fs::read(&target).expect("target"), before, "untouched");
}

#[test]
fn the_key_is_made_0600_on_first_use_and_kept() {
    let place = place();
    let host = engine();
    let wasm = hostile();
    assert!(!place.key.exists());
    let cache = place.open(&host).expect("cache");
    let meta = std::fs::metadata(&place.key).expect("key made");
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    assert_eq!(meta.len(), 32);
    assert_eq!(meta.uid(), fixup_core::plugin::trusted::euid());
    let key_dir = place.key.parent().expect("dir");
    assert_eq!(
        std::fs::metadata(key_dir)
            .expect("dir")
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    let key = std::fs::read(&place.key).expect("key");
    cache
        .lookup(host.engine(), &wasm, &sha(&wasm))
        .expect("compiles");

    let again = place.open(&host).expect("cache");
    assert_eq!(std::fs::read(&place.key).expect("key"), key, "kept");
    let (_, outcome) = again
        .lookup(host.engine(), &wasm, &sha(&wasm))
        .expect("loads");
    assert_eq!(outcome, CacheOutcome::Hit, "the same key authenticates");
}

#[test]
fn a_key_others_may_read_is_refused() {
    let place = place();
    place.open(&engine()).expect("makes the key");
    chmod(&place.key, 0o644);
    let err = place.open(&engine()).expect_err("refused");
    assert!(
        matches!(&err, CacheError::KeyMode { mode: 0o644, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("chmod 600"), "{err}");
    let host = PluginHost::new(place.options()).expect("engine");
    assert!(host.cache().is_none(), "the cache is not used");
}

#[test]
fn a_key_owned_by_another_user_is_refused() {
    if !is_root() {
        eprintln!("skipped: handing a file to another user needs root");
        return;
    }
    let place = place();
    place.open(&engine()).expect("makes the key");
    std::os::unix::fs::chown(&place.key, Some(OTHER_UID), None).expect("chown");
    let err = place.open(&engine()).expect_err("refused");
    assert!(
        matches!(
            err,
            CacheError::Key(Untrusted::Owner {
                owner: OTHER_UID,
                ..
            })
        ),
        "{err}"
    );
}

#[test]
fn a_key_inside_the_cache_directory_is_refused() {
    let place = place();
    let key = place.cache.join("cache.key");
    let err =
        ArtifactCache::open(&place.cache, Some(&key), engine().engine()).expect_err("refused");
    assert!(matches!(err, CacheError::KeyInsideCache { .. }), "{err}");
    assert!(!key.exists(), "no key made there");
}
