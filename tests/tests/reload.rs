//! `serve`'s plugin reload: a changed plugin file goes into service only
//! through the gate (it loads, links, and passes its own case files), a
//! call that planned keeps its plan, and a new version that fails where the
//! one it replaced succeeded is rolled back and quarantined.
//!
//! The reloader is driven by hand here (`reload`, `observe`) against a
//! real host, planner and plugin files; `serve`'s own loop adds the timer,
//! the settling of changed files and the outcome channel around the same
//! calls (`serve_reload.rs` runs it in the real binary).

use fixup_core::decision::FixupEnd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fixup_core::decision::RetryConfig;
use fixup_core::decision::{Summary, Trigger};
use fixup_core::planner::{Planner, PlannerOptions};
use fixup_core::plugin::quarantine::QuarantineFile;
use fixup_host::host::{FixupRecord, Host, HostConfig};
use fixup_host::metrics::Metrics;
use fixup_host::pods::MemoryPods;
use fixup_host::ready::LeaseWatcher;
use fixup_host::reload::{Build, Candidate, ReloadConfig, Reloader, cases_dir};
use fixup_tests::{Guest, hostile_clone_in};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

/// The hostile plugin's bytes with a custom section appended: the same
/// code, another file (another sha256), as a rebuilt version would be.
fn version(tag: &str) -> Vec<u8> {
    let mut bytes = std::fs::read(env!("PLUGIN_HOSTILE")).expect("hostile plugin");
    let name = b"cocoon-fixup-test-version";
    let mut section = vec![name.len() as u8];
    section.extend_from_slice(name);
    section.extend_from_slice(tag.as_bytes());
    assert!(section.len() < 128, "one LEB128 byte");
    bytes.push(0);
    bytes.push(section.len() as u8);
    bytes.extend_from_slice(&section);
    bytes
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// The quarantine file of a rig in `dir` (beside a cache key there).
fn quarantine_file(dir: &Path) -> QuarantineFile {
    QuarantineFile::beside_key(Some(&dir.join("state").join("cache.key"))).expect("a place")
}

struct Rig {
    host: Arc<Host<Guest, MemoryPods>>,
    reloader: Reloader<Guest, MemoryPods>,
    outcomes: UnboundedReceiver<FixupRecord>,
    guest: Guest,
    metrics: Arc<Metrics>,
    plugin: PathBuf,
    _dir: tempfile::TempDir,
}

/// A planner's options over `plugins`, compiled without a cache, probing
/// the empty cocoon root beside it.
fn options(plugins: &Path) -> PlannerOptions {
    let root = plugins.with_file_name("cocoon-root");
    std::fs::create_dir_all(&root).expect("cocoon root");
    let mut options = PlannerOptions {
        plugin_dir: Some(plugins.to_owned()),
        cocoon_root: root,
        ..PlannerOptions::default()
    };
    options.engine.cache_dir = None;
    options
}

/// A host serving the hostile plugin at version `v1` from a plugin
/// directory, its fixups reported, and a reloader over that directory
/// watching `watch_fixups` fixups after a reload.
fn rig(watch_fixups: u32) -> Rig {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    let plugin = plugins.join("hostile.wasm");
    std::fs::write(&plugin, version("v1")).expect("v1");
    let (planner, failures) = Planner::new(options(&plugins)).expect("planner");
    assert!(failures.is_empty(), "{failures:?}");
    let guest = Guest::new("hostile-benign");
    let leases = LeaseWatcher::new(dir.path().join("leases.json"), Duration::from_millis(20))
        .expect("lease watcher");
    let metrics = Arc::new(Metrics::new());
    let config = HostConfig {
        retry: RetryConfig {
            interval: Duration::from_millis(5),
            budget: Duration::from_millis(30),
            exec_timeout: Duration::from_secs(5),
        },
        ..HostConfig::default()
    };
    let host = Arc::new(Host::new(
        Arc::new(planner),
        guest.clone(),
        MemoryPods::new(),
        Arc::new(leases),
        config,
        metrics.clone(),
    ));
    let (sender, outcomes) = tokio::sync::mpsc::unbounded_channel();
    assert!(host.report_outcomes_to(sender));
    let build: Build = {
        let plugins = plugins.clone();
        Arc::new(move || {
            let engine = options(&plugins).engine;
            let (planner, failures) = Planner::new(options(&plugins)).map_err(|e| e.to_string())?;
            match failures.first() {
                Some(f) => Err(format!("{}: {}", f.path.display(), f.error)),
                None => Ok(Candidate { planner, engine }),
            }
        })
    };
    let reloader = Reloader::new(
        host.clone(),
        build,
        vec![plugins],
        ReloadConfig {
            interval: Duration::from_millis(20),
            watch_fixups,
            max_failure_ratio: 0.5,
            min_namespaces: 2,
        },
    )
    .with_quarantine_file(quarantine_file(dir.path()));
    Rig {
        host,
        reloader,
        outcomes,
        guest,
        metrics,
        plugin,
        _dir: dir,
    }
}

impl Rig {
    /// The digest of the hostile plugin in service.
    fn serving(&self) -> String {
        let planner = self.host.planner();
        let plugins = planner.plugins().registry().plugins();
        let hostile = plugins
            .iter()
            .find(|p| p.info.name == "hostile")
            .expect("hostile serves");
        hostile.sha256.clone()
    }

    /// Handle a new clone named `name` to its end, and hand its outcome to
    /// the reloader; the digest of the hostile plugin that planned it.
    async fn clone_pod(&mut self, name: &str) -> (Summary, String) {
        self.clone_pod_in("default", name).await
    }

    /// [`clone_pod`](Self::clone_pod) in `namespace`.
    async fn clone_pod_in(&mut self, namespace: &str, name: &str) -> (Summary, String) {
        self.host.pods().insert(hostile_clone_in(namespace, name));
        let summary = self
            .host
            .handle(namespace, name, Trigger::Event, &CancellationToken::new())
            .await
            .expect("handled");
        let record = self.outcomes.try_recv().expect("the fixup is reported");
        let used = record
            .plugins
            .iter()
            .find(|p| p.name == "hostile")
            .expect("planned by hostile")
            .sha256
            .clone();
        self.reloader.observe(record);
        (summary, used)
    }

    /// A pod the hostile plugin's v1 fixes (so v1 planned here), then v2
    /// written and reloaded into service: v2's digest.
    async fn v2_after_a_success(&mut self) -> String {
        let (summary, _) = self.clone_pod("good-0").await;
        assert_eq!(summary.fixup, Some(FixupEnd::Done));
        std::fs::write(&self.plugin, version("v2")).expect("v2");
        self.reloader.reload().await;
        let v2 = sha256(&version("v2"));
        assert_eq!(self.serving(), v2);
        v2
    }

    fn exposition(&self) -> String {
        self.metrics.encode()
    }
}

#[tokio::test]
async fn a_changed_plugin_serves_the_next_pod() {
    let mut rig = rig(10);
    let v1 = sha256(&version("v1"));
    let (before, used) = rig.clone_pod("before").await;
    assert_eq!(before.fixup, Some(FixupEnd::Done), "{before:?}");
    assert_eq!(used, v1);

    std::fs::write(&rig.plugin, version("v2")).expect("v2");
    rig.reloader.reload().await;
    let v2 = sha256(&version("v2"));
    assert_eq!(rig.serving(), v2);
    assert!(
        rig.exposition()
            .contains(r#"plugin_reload_total{result="swapped"} 1"#),
        "{}",
        rig.exposition()
    );

    let (after, used) = rig.clone_pod("after").await;
    assert_eq!(after.fixup, Some(FixupEnd::Done), "{after:?}");
    assert_eq!(used, v2);
    assert_eq!(rig.metrics.health(), "ok\n");
}

#[tokio::test]
async fn a_call_that_planned_keeps_its_plan_across_a_swap() {
    let mut rig = rig(10);
    let v1 = sha256(&version("v1"));
    // A second planner, with v2, ready to be swapped in.
    let plugins = rig.plugin.parent().expect("plugin dir").to_owned();
    std::fs::write(&rig.plugin, version("v2")).expect("v2");
    let (v2_planner, _) = Planner::new(options(&plugins)).expect("v2 planner");
    // The first attempt fails, and the swap happens while it runs: the
    // retry comes after the swap.
    rig.guest.fail_execs(true);
    let (host, guest) = (rig.host.clone(), rig.guest.clone());
    rig.guest.at_next_exec(move || {
        host.swap_planner(Arc::new(v2_planner));
        let again = guest.clone();
        guest.at_next_exec(move || again.fail_execs(false));
    });
    let (summary, used) = rig.clone_pod("across").await;
    assert_eq!(summary.fixup, Some(FixupEnd::Done), "{summary:?}");
    assert_eq!(summary.attempts, 2, "{summary:?}");
    assert_eq!(used, v1, "planned once, before the swap");
    assert!(
        rig.outcomes.try_recv().is_err(),
        "no second plan after the swap"
    );
    assert_eq!(rig.serving(), sha256(&version("v2")));
}

#[tokio::test]
async fn a_plugin_that_fails_the_gate_never_replaces_the_one_in_service() {
    let mut rig = rig(10);
    let v1 = sha256(&version("v1"));

    // Not a component at all.
    std::fs::write(&rig.plugin, b"not a plugin").expect("garbage");
    rig.reloader.reload().await;
    assert_eq!(rig.serving(), v1);
    assert!(rig.metrics.health().contains("plugin reload refused"));

    // A new version whose own case files fail.
    let cases = cases_dir(&rig.plugin);
    std::fs::create_dir_all(&cases).expect("cases dir");
    let case = |expect: &str| {
        format!(
            r#"{{"scenario": "oci-networkd",
                "facts": {{"name": "decline", "id": "vm-0123abcd", "backend": "cloud-hypervisor",
                          "os": "linux", "image": "oci", "boot": "clone",
                          "nics": [{{"mac": "52:54:00:aa:bb:01", "static_ipv4": null}}],
                          "flavor": "hostile"}},
                "expect": {expect}}}"#
        )
    };
    std::fs::write(
        cases.join("declines.json"),
        case(r#"{"plan": {"dialect": "posix-sh", "steps": []}}"#),
    )
    .expect("case");
    std::fs::write(&rig.plugin, version("v2")).expect("v2");
    rig.reloader.reload().await;
    assert_eq!(rig.serving(), v1, "a version whose cases fail is refused");
    let health = rig.metrics.health();
    assert!(
        health.contains("declines") && health.contains("case files"),
        "{health}"
    );
    assert!(
        rig.exposition()
            .contains(r#"plugin_reload_total{result="rejected"} 2"#),
        "{}",
        rig.exposition()
    );
    let (summary, used) = rig.clone_pod("still-v1").await;
    assert_eq!(summary.fixup, Some(FixupEnd::Done));
    assert_eq!(used, v1);

    // The case fixed: the same version passes the gate.
    std::fs::write(
        cases.join("declines.json"),
        case(r#"{"error": {"kind": "unsupported"}}"#),
    )
    .expect("case");
    rig.reloader.reload().await;
    assert_eq!(rig.serving(), sha256(&version("v2")));
    assert_eq!(rig.metrics.health(), "ok\n");
}

#[tokio::test]
async fn a_version_that_fails_where_its_predecessor_succeeded_is_rolled_back_and_quarantined() {
    let mut rig = rig(4);
    let v1 = sha256(&version("v1"));
    let v2 = rig.v2_after_a_success().await;

    // What the guest does is not the plugin's failure: exhausted fixups
    // do not count.
    rig.guest.fail_execs(true);
    for i in 0..3 {
        let (summary, used) = rig.clone_pod(&format!("guest-down-{i}")).await;
        assert_eq!(summary.fixup, Some(FixupEnd::Exhausted), "{summary:?}");
        assert_eq!(used, v2);
    }
    assert_eq!(rig.serving(), v2, "the guests failed, not the plugin");
    rig.guest.fail_execs(false);

    // A fresh watch: v3 declines the VMs it claimed (at most 2 of 4 may).
    std::fs::write(&rig.plugin, version("v3")).expect("v3");
    rig.reloader.reload().await;
    let v3 = sha256(&version("v3"));
    assert_eq!(rig.serving(), v3);
    rig.guest.set_id("hostile-decline");
    for (namespace, i) in [("tenant-a", 0), ("tenant-a", 1), ("tenant-b", 2)] {
        let (summary, used) = rig.clone_pod_in(namespace, &format!("bad-{i}")).await;
        assert_eq!(summary.fixup, Some(FixupEnd::PlanFailed), "{summary:?}");
        assert_eq!(used, v3);
    }
    assert_eq!(
        rig.serving(),
        v1,
        "the third failure of four, in a second namespace, rolls back to the set before the watch began"
    );
    let exposition = rig.exposition();
    assert!(
        exposition.contains(r#"plugin_rollbacks_total{plugin="hostile"} 1"#),
        "{exposition}"
    );
    let health = rig.metrics.health();
    assert!(
        health.contains("rolled back") && health.contains(&v3[..12]),
        "{health}"
    );

    // The next pod is planned by the version that came back.
    rig.guest.set_id("hostile-benign");
    let (summary, used) = rig.clone_pod("good-1").await;
    assert_eq!(summary.fixup, Some(FixupEnd::Done));
    assert_eq!(used, v1);

    // The same file is not loaded again, nor after a restart...
    rig.reloader.reload().await;
    assert_eq!(rig.serving(), v1);
    assert!(rig.metrics.health().contains("quarantined"));
    let file = quarantine_file(rig._dir.path());
    assert!(file.read().contains(&v3), "{}", file.path().display());
    let mut restarted = options(rig.plugin.parent().expect("plugin dir"));
    restarted.engine.quarantined = file.read();
    let (_, failures) = Planner::new(restarted).expect("planner");
    assert!(
        failures.len() == 1 && failures[0].error.to_string().contains("quarantined"),
        "{failures:?}"
    );
    // ...until it changes.
    std::fs::write(&rig.plugin, version("v4")).expect("v4");
    rig.reloader.reload().await;
    assert_eq!(rig.serving(), sha256(&version("v4")));
}

/// A reload that changes no plugin (the configuration or a trusted key
/// changed) ends a running watch without a rollback: the set before the
/// watch was accepted under what was there then, and a key removed since
/// may be the one that signed it. Failures of the new version then roll
/// nothing back.
#[tokio::test]
async fn a_reload_that_changes_no_plugin_ends_the_watch_without_a_rollback() {
    let mut rig = rig(4);
    std::fs::write(&rig.plugin, version("v3")).expect("v3");
    let (summary, _) = rig.clone_pod("good-0").await;
    assert_eq!(summary.fixup, Some(FixupEnd::Done));
    rig.reloader.reload().await;
    let v3 = sha256(&version("v3"));
    assert_eq!(rig.serving(), v3);
    // Nothing of the plugins changed: the watch ends.
    rig.reloader.reload().await;
    rig.guest.set_id("hostile-decline");
    for (namespace, i) in [("tenant-a", 0), ("tenant-a", 1), ("tenant-b", 2)] {
        let (summary, used) = rig.clone_pod_in(namespace, &format!("bad-{i}")).await;
        assert_eq!(summary.fixup, Some(FixupEnd::PlanFailed), "{summary:?}");
        assert_eq!(used, v3);
    }
    assert_eq!(rig.serving(), v3, "no rollback target is left");
    assert!(
        !rig.exposition().contains("plugin_rollbacks_total{"),
        "{}",
        rig.exposition()
    );
}

/// One namespace (a tenant who controls its pods' facts) cannot roll a
/// version back for everyone: its failures count for at most its share,
/// however many there are; failures in a second namespace do. The
/// quarantine that follows is listed with its namespaces, and released
/// with one call, after which the same file loads again.
#[tokio::test]
async fn one_namespace_cannot_roll_a_version_back_and_a_release_undoes_the_quarantine() {
    let mut rig = rig(8);
    let v1 = sha256(&version("v1"));
    let v2 = rig.v2_after_a_success().await;

    // 8 watched, 4 may fail; one namespace counts for at most 3 (half of
    // the 5 a rollback takes). Six failures in tenant-a: kept.
    rig.guest.set_id("hostile-decline");
    for i in 0..6 {
        let (summary, used) = rig.clone_pod_in("tenant-a", &format!("bad-{i}")).await;
        assert_eq!(summary.fixup, Some(FixupEnd::PlanFailed), "{summary:?}");
        assert_eq!(used, v2);
    }
    assert_eq!(rig.serving(), v2, "one namespace alone rolls nothing back");
    assert!(!rig.exposition().contains("plugin_rollbacks_total{"));

    // A second namespace's failure makes 3 + 1 of 5 counted: still kept;
    // its second, 3 + 2: rolled back.
    let (_, used) = rig.clone_pod_in("tenant-b", "bad-b0").await;
    assert_eq!(used, v2);
    assert_eq!(rig.serving(), v2);
    let (_, used) = rig.clone_pod_in("tenant-b", "bad-b1").await;
    assert_eq!(used, v2);
    assert_eq!(rig.serving(), v1, "two namespaces' failures roll it back");

    let file = quarantine_file(rig._dir.path());
    let entries = file.entries();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].0, v2);
    assert!(
        entries[0].1.contains("tenant-a") && entries[0].1.contains("tenant-b"),
        "{entries:?}"
    );
    rig.reloader.reload().await;
    assert_eq!(rig.serving(), v1, "quarantined");

    // Released: the same file loads at the next reload.
    assert!(file.release(&v2).expect("released"));
    assert!(!file.release(&v2).expect("read"), "released once");
    assert!(file.entries().is_empty());
    rig.guest.set_id("hostile-benign");
    rig.reloader.reload().await;
    assert_eq!(rig.serving(), v2, "the released version is back");
}

#[tokio::test]
async fn a_version_whose_predecessor_never_planned_here_is_kept() {
    let mut rig = rig(2);
    std::fs::write(&rig.plugin, version("v2")).expect("v2");
    rig.reloader.reload().await;
    let v2 = sha256(&version("v2"));
    assert_eq!(rig.serving(), v2);
    rig.guest.set_id("hostile-decline");
    for i in 0..3 {
        let (summary, _) = rig.clone_pod(&format!("bad-{i}")).await;
        assert_eq!(summary.fixup, Some(FixupEnd::PlanFailed));
    }
    assert_eq!(rig.serving(), v2, "nothing to compare with: no rollback");
    assert!(!rig.exposition().contains("plugin_rollbacks_total{"));
}

#[tokio::test]
async fn a_reload_does_not_drop_the_allow_list_in_force() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    std::fs::write(plugins.join("hostile.wasm"), version("v1")).expect("v1");
    let allowed = move |on: bool| {
        let mut options = options(&plugins);
        if on {
            options.engine.allowed_sha256 = Some([sha256(&version("v1"))].into());
        }
        options
    };
    let (planner, _) = Planner::new(allowed(true)).expect("planner");
    let allowed = Arc::new(allowed);
    let leases = LeaseWatcher::new(dir.path().join("leases.json"), Duration::from_millis(20))
        .expect("lease watcher");
    let host = Arc::new(Host::new(
        Arc::new(planner),
        Guest::new("hostile-benign"),
        MemoryPods::new(),
        Arc::new(leases),
        HostConfig::default(),
        Arc::new(Metrics::new()),
    ));
    let build: Build = Arc::new(move || {
        let options = allowed(false);
        let engine = options.engine.clone();
        let (planner, _) = Planner::new(options).map_err(|e| e.to_string())?;
        Ok(Candidate { planner, engine })
    });
    let mut reloader = Reloader::new(host.clone(), build, vec![], ReloadConfig::default());
    reloader.reload().await;
    assert!(host.planner().plugins().allow_list().is_some());
    let health = host.metrics().health();
    assert!(health.contains("allowed_plugins"), "{health}");
}

/// A watch that ends held back (every failure in one namespace) says so
/// on `/healthz`, not only in one log line, and never reports a pass.
#[tokio::test]
async fn a_watch_held_back_by_one_namespace_ends_visibly() {
    let mut rig = rig(4);
    let v2 = rig.v2_after_a_success().await;
    rig.guest.set_id("hostile-decline");
    for i in 0..4 {
        rig.clone_pod_in("tenant-a", &format!("bad-{i}")).await;
    }
    assert_eq!(rig.serving(), v2, "kept");
    let health = rig.metrics.health();
    assert!(health.contains("in namespaces tenant-a: kept"), "{health}");
}

/// `cocoon-fixup plugin quarantine` lists what rollbacks quarantined
/// beside the node's cache key, with their notes, and `--release` takes
/// one digest out with one command; a digest not listed, or not a digest,
/// is an error that says so.
#[test]
fn the_quarantine_is_listed_and_released_by_the_binary() {
    use std::process::Command;
    let dir = tempfile::tempdir().expect("tempdir");
    let key = dir.path().join("state").join("cache.key");
    let file = quarantine_file(dir.path());
    let v2 = sha256(&version("v2"));
    file.add(&v2, "hostile v2 rolled back: failed in tenant-a, tenant-b")
        .expect("quarantined");
    let quarantine = |args: &[&str]| {
        let out = Command::new(crate::serve_reload::binary::program())
            .env_clear()
            .env("HOME", dir.path())
            .args(["plugin", "quarantine", "--cache-key"])
            .arg(&key)
            .args(args)
            .output()
            .expect("run cocoon-fixup");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    let (code, stdout, stderr) = quarantine(&[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains(&v2) && stdout.contains("tenant-b"),
        "{stdout}"
    );
    assert!(stdout.contains("--release SHA256"), "{stdout}");
    let (code, stdout, _) = quarantine(&["--output", "json"]);
    assert_eq!(code, Some(0));
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(json["quarantined"][0]["sha256"], v2.as_str(), "{json}");

    let (code, stdout, stderr) = quarantine(&["--release", &v2.to_uppercase()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("released"), "{stdout}");
    assert!(file.read().is_empty(), "the line is gone");
    let (code, stdout, _) = quarantine(&[]);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("nothing is quarantined"), "{stdout}");

    let (code, _, stderr) = quarantine(&["--release", &v2]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("is not quarantined"), "{stderr}");
    let (code, _, stderr) = quarantine(&["--release", "v2"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("not a sha256 digest"), "{stderr}");
}
