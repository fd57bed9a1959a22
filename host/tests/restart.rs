//! The real daemon killed in the middle of a fixup, then started again:
//! the work resumes from `running` (spec sections 5 and 8).
//!
//! The `cocoon-fixup` binary runs `serve --node n1` as a child process
//! against a fake API server (`support/fake_api.rs`: one pod in memory,
//! GET/PATCH with the uid precondition, events, list and watch), with
//! `--cocoon-bin` pointing at `fake-cocoon` behind a wrapper that records
//! each invocation's pid. The first start finds the pod, writes
//! `post-clone-state=running` and hangs in `cocoon vm exec`. Then:
//!
//! - SIGKILL: nothing can run any more, so the pod must already be in the
//!   state a restart needs (`running`, nothing marked failed). The scenario
//!   switches to success, the daemon starts again, announces
//!   `ResumedAfterRestart` (`op=post_clone`), runs the fixup and the pod
//!   ends `done` with its IP and lifecycle `ready`.
//! - SIGTERM: the daemon stops cleanly (exit 0), leaving `running`.
//!
//! The fake server streams no watch events after the list: a stale event
//! delivered after the work finished would re-run it (a bug of its own,
//! `faults.rs`: `a_stale_watch_event_does_not_rerun_finished_work`).
//!
//! Waits poll the fake server's state with a generous upper bound (a
//! safety net, not a timing assertion).

use crate::support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use fixup_host::pods::{keys, reasons};
use rustix::process::{Pid, Signal, kill_process, kill_process_group};
use serde_json::{Value, json};
use support::binary::cocoon_fixup;
use support::fake::fake_cocoon;
use support::fake_api::FakeApi;
use support::vm_name;
use tokio::process::Child;

const UID: &str = "7d3f1c2a-5b6e-4f80-9a1b-2c3d4e5f6a7b";

/// The longest any wait below may take before the test gives up.
const PATIENCE: Duration = Duration::from_secs(120);

fn pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "namespace": "default",
            "uid": UID,
            "annotations": {
                "vm.cocoonstack.io/name": vm_name(),
                "vm.cocoonstack.io/id": "vm-restart",
                "cocoonset.cocoonstack.io/managed": "true",
                "cocoonset.cocoonstack.io/os": "linux",
                "cocoonset.cocoonstack.io/generation": "1",
                "vm.cocoonstack.io/backend": "cloud-hypervisor",
            },
        },
        "spec": {"nodeName": "n1", "containers": []},
    })
}

/// The fake `cocoon`: static NIC, so the IP is known at once.
fn scenario(dir: &Path, exec: Value) -> Value {
    json!({
        "log": dir.join("calls.jsonl"),
        "exec": [exec],
        "inspect": {"json": {"id": "vm-restart", "config": {"name": vm_name()}, "network_configs": [
            {"mac": "52:54:00:12:34:56", "tap": "tap0",
             "network": {"ip": "10.0.0.5", "prefix": 24, "gateway": "10.0.0.1"}}]}},
    })
}

struct Node {
    dir: tempfile::TempDir,
    api: FakeApi,
    kubeconfig: PathBuf,
}

impl Node {
    async fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let api = FakeApi::start(pod(), false).await;
        let kubeconfig = api.kubeconfig(dir.path());
        fs::create_dir(dir.path().join("plugins")).unwrap();
        fs::write(dir.path().join("config.toml"), "").unwrap();
        let wrapper = dir.path().join("cocoon");
        fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\necho $$ >> '{pids}'\nFAKE_COCOON_SCENARIO='{scenario}' exec '{fake}' \"$@\"\n",
                pids = dir.path().join("pids").display(),
                scenario = dir.path().join("scenario.json").display(),
                fake = fake_cocoon().display(),
            ),
        )
        .unwrap();
        fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
        let node = Node {
            dir,
            api,
            kubeconfig,
        };
        node.set_exec(json!({"hang": true}));
        node
    }

    fn set_exec(&self, exec: Value) {
        let tmp = self.dir.path().join("scenario.tmp");
        fs::write(&tmp, scenario(self.dir.path(), exec).to_string()).unwrap();
        fs::rename(tmp, self.dir.path().join("scenario.json")).unwrap();
    }

    /// `cocoon-fixup serve --node n1`, with everything pointed here and a
    /// clean environment.
    fn serve(&self) -> Child {
        let d = self.dir.path();
        cocoon_fixup(d, &self.kubeconfig, &["serve", "--node", "n1"])
            .args(["--retry-interval", "100ms", "--retry-budget", "10m"])
            .args(["--exec-timeout", "10m", "--metrics-addr", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(fs::File::create(d.join("daemon.log")).unwrap())
            .spawn()
            .expect("the daemon starts")
    }

    fn exec_calls(&self) -> usize {
        fs::read_to_string(self.dir.path().join("calls.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"exec_index\""))
            .count()
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    /// Wait until `done` says so, or fail with what the daemon logged.
    async fn until(&self, what: &str, done: impl Fn(&Node) -> bool) {
        let start = std::time::Instant::now();
        while !done(self) {
            assert!(
                start.elapsed() < PATIENCE,
                "gave up waiting for {what}; daemon log:\n{}\nevents: {:#?}",
                self.log(),
                self.api.events()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The daemon's `cocoon` children left hanging (a SIGKILLed daemon
    /// cannot kill them): killed by process group, which each leads.
    fn kill_leftover_cocoons(&self) {
        let pids = fs::read_to_string(self.dir.path().join("pids")).unwrap_or_default();
        for pid in pids.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
            if let Some(pid) = Pid::from_raw(pid) {
                let _ = kill_process_group(pid, Signal::KILL);
            }
        }
    }

    fn count(&self, reason: &str, note: &str) -> usize {
        self.api
            .events()
            .iter()
            .filter(|(r, n)| r == reason && n == note)
            .count()
    }

    /// Nothing in the pod or the events says the fixup failed.
    fn assert_not_failed(&self) {
        assert_eq!(
            self.api.annotation(keys::POST_CLONE_STATE).as_deref(),
            Some("running")
        );
        for key in [
            keys::POST_CLONE_ERRORS,
            keys::POST_CLONE_HINT,
            keys::LIFECYCLE_STATE,
        ] {
            assert_eq!(self.api.annotation(key), None, "{key} was written");
        }
        let events = self.api.events();
        assert!(
            !events
                .iter()
                .any(|(r, _)| r == reasons::EXEC_EXHAUSTED || r == reasons::EXEC_ATTEMPT_FAILED),
            "{events:#?}"
        );
    }
}

impl Drop for Node {
    /// A test that failed midway may leave a hung `cocoon` behind.
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.kill_leftover_cocoons();
        }
    }
}

/// Start the daemon and wait until it is in the middle of the fixup: the
/// pod says `running` and `cocoon vm exec` has started (and hangs).
async fn mid_fixup(node: &Node) -> Child {
    let daemon = node.serve();
    node.until("post-clone-state=running and a hung exec", |n| {
        n.api.annotation(keys::POST_CLONE_STATE).as_deref() == Some("running")
            && n.exec_calls() >= 1
    })
    .await;
    daemon
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_loop_then_restart_resumes_from_running() {
    let node = Node::new().await;
    let mut daemon = mid_fixup(&node).await;

    daemon.kill().await.expect("SIGKILL the daemon");
    let status = daemon.wait().await.unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    node.kill_leftover_cocoons();
    node.assert_not_failed();
    let resumed_before = node.count(reasons::RESUMED_AFTER_RESTART, "op=post_clone");

    node.set_exec(json!({"exit": 0, "done": true}));
    let mut daemon = node.serve();
    // `ready` goes with `done` for this static pod; the success event
    // follows the write, so both are waited for.
    node.until("lifecycle ready and the success event", |n| {
        n.api.annotation(keys::LIFECYCLE_STATE).as_deref() == Some("ready")
            && n.api.events().iter().any(|(r, _)| r == reasons::SUCCEEDED)
    })
    .await;
    assert_eq!(
        node.count(reasons::RESUMED_AFTER_RESTART, "op=post_clone"),
        resumed_before + 1,
        "the second start announces the resumed work: {:#?}",
        node.api.events()
    );
    assert_eq!(
        node.api.annotation(keys::POST_CLONE_STATE).as_deref(),
        Some("done")
    );
    assert_eq!(node.api.annotation(keys::IP).as_deref(), Some("10.0.0.5"));
    assert_eq!(
        node.count(
            reasons::SUCCEEDED,
            "kind=linux_static attempts=1 scenario=oci-networkd"
        ),
        1
    );
    assert_eq!(node.exec_calls(), 2, "the hung exec, then the resumed one");
    // Every write carried this pod's uid; none was refused.
    node.api.with(|s| {
        assert!(s.unexpected.is_empty(), "{:?}", s.unexpected);
        for (patch, code) in &s.patches {
            assert_eq!(patch["metadata"]["uid"], UID);
            assert_eq!(*code, 200);
        }
    });

    sigterm(&daemon);
    let status = daemon.wait().await.unwrap();
    assert!(status.success(), "{status}; log:\n{}", node.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_loop_exits_cleanly_and_leaves_running() {
    let node = Node::new().await;
    let mut daemon = mid_fixup(&node).await;
    sigterm(&daemon);
    let status = daemon.wait().await.unwrap();
    assert!(status.success(), "{status}; log:\n{}", node.log());
    node.assert_not_failed();
    node.api
        .with(|s| assert!(s.unexpected.is_empty(), "{:?}", s.unexpected));
}

/// A stop with systemd's default `KillMode=control-group` signals the
/// daemon's `cocoon` too, which may end before the daemon hears of the
/// stop: the exec ended by SIGTERM is no failed attempt, the work stays
/// `running`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_the_exec_first_then_the_daemon_leaves_running() {
    let node = Node::new().await;
    let mut daemon = mid_fixup(&node).await;
    let pids = fs::read_to_string(node.dir.path().join("pids")).unwrap();
    let cocoon = pids.lines().last().expect("the hung exec's pid");
    let cocoon = Pid::from_raw(cocoon.trim().parse().unwrap()).unwrap();
    // The daemon stopped, its `cocoon` ended by SIGTERM, then the
    // daemon's own SIGTERM: it wakes to both at once.
    let pid = Pid::from_raw(i32::try_from(daemon.id().unwrap()).unwrap()).unwrap();
    kill_process(pid, Signal::STOP).unwrap();
    kill_process(cocoon, Signal::TERM).unwrap();
    node.until("the exec's cocoon ended", |_| {
        fs::read_to_string(format!("/proc/{}/stat", cocoon.as_raw_nonzero())).map_or(true, |stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
    })
    .await;
    sigterm(&daemon);
    kill_process(pid, Signal::CONT).unwrap();
    let status = daemon.wait().await.unwrap();
    assert!(status.success(), "{status}; log:\n{}", node.log());
    node.assert_not_failed();
}

/// SIGTERM, as systemd stops the daemon.
fn sigterm(daemon: &Child) {
    let pid = daemon.id().expect("the daemon is running");
    let pid = Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
    kill_process(pid, Signal::TERM).unwrap();
}
