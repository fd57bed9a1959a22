//! `cocoon-fixup serve` reloading a plugin file by itself: the real binary
//! and its own reload loop (`--plugin-reload-interval 100ms`), where
//! `reload.rs` drives the `Reloader` by hand.
//!
//! The daemon runs `serve --node n1` against the fake API server of the
//! host's tests (`host/tests/support/fake_api.rs`, included below with the
//! binary and `fake-cocoon` helpers), with the hostile test plugin in its
//! plugin directory and `fake-cocoon` as `cocoon`. The server keeps one
//! pod at a time; each phase puts a new pod in place of the last
//! ([`FakeApi::replace_pod`]), which the daemon hears of through its watch.
//!
//! Which plugin file planned a pod is read from the pod itself: every exec
//! in the guest fails, so each fixup ends exhausted and writes
//! `post-clone-hint`, the plan's script, whose header names each plugin
//! as `name version sha256:<first 12 hex digits>`. The hostile plugin's
//! versions are its bytes with a custom section appended: the same code,
//! another digest.
//!
//! 1. Version A serves the first pod.
//! 2. Version B replaces the file; once `/metrics` counts the swap, the
//!    second pod is planned with B.
//! 3. Bytes that are no plugin replace the file: the reload is refused
//!    (`/metrics`, `/healthz`'s detail line) and the third pod is still
//!    planned with B.
//! 4. Version A comes back: the reload succeeds and `/healthz` is plain
//!    `ok` again.
//!
//! Waits poll with a generous upper bound (a safety net, not a timing
//! assertion).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine as _;
use fixup_core::binding::vm_name_for_pod;
use fixup_host::pods::{keys, reasons};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Child;

#[allow(dead_code)]
#[path = "../../host/tests/support/binary.rs"]
pub(crate) mod binary;
#[allow(dead_code)]
#[path = "../../host/tests/support/fake.rs"]
pub(crate) mod fake;
#[allow(dead_code)]
#[path = "../../host/tests/support/fake_api.rs"]
pub(crate) mod fake_api;

use fake_api::FakeApi;

/// The longest any wait below may take before the test gives up.
const PATIENCE: Duration = Duration::from_secs(180);

/// The name of the custom section that tells the versions apart.
const VERSION_SECTION: &[u8] = b"cocoon-fixup-serve-reload";

/// `n` as unsigned LEB128, as the wasm binary format writes sizes.
fn leb128(mut n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// The hostile plugin with a custom section holding `tag` at its end.
pub(crate) fn hostile(tag: &str) -> Vec<u8> {
    let mut payload = leb128(VERSION_SECTION.len());
    payload.extend_from_slice(VERSION_SECTION);
    payload.extend_from_slice(tag.as_bytes());
    let mut bytes = fs::read(env!("PLUGIN_HOSTILE")).expect("the hostile plugin");
    bytes.push(0);
    bytes.extend(leb128(payload.len()));
    bytes.extend(payload);
    bytes
}

/// How a plan's script header names a plugin file's digest.
fn short_digest(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", &hex::encode(sha2::Sha256::digest(bytes))[..12])
}

/// A managed Linux clone on node `n1` that asks for the hostile plugin.
fn pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": format!("uid-{name}"),
            "annotations": {
                "vm.cocoonstack.io/name": vm_name_for_pod("default", name),
                "cocoonset.cocoonstack.io/managed": "true",
                "cocoonset.cocoonstack.io/os": "linux",
                "cocoonset.cocoonstack.io/generation": "1",
                "vm.cocoonstack.io/backend": "cloud-hypervisor",
                "vm.cocoonstack.io/guest-flavor": "hostile",
            },
        },
        "spec": {"nodeName": "n1", "containers": []},
    })
}

/// The pod of each phase, in order.
const PODS: [&str; 3] = ["web-a", "web-b", "web-c"];

pub(crate) struct Node {
    dir: tempfile::TempDir,
    api: FakeApi,
    /// The port of `/metrics` and `/healthz`.
    port: u16,
    _daemon: Child,
}

impl Node {
    /// `serve` with `plugin` as `plugins/hostile.wasm`, and `first` as the
    /// pod the server keeps.
    async fn start(plugin: &[u8], first: &str) -> Node {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir(dir.path().join("plugins")).expect("plugin dir");
        install(dir.path(), plugin);
        Self::start_in(dir, "", first).await
    }

    /// `serve` in `dir` (its plugin directory `plugins/` when there is
    /// one), with `config` in its configuration file, and `first` as the
    /// pod the server keeps.
    pub(crate) async fn start_in(dir: tempfile::TempDir, config: &str, first: &str) -> Node {
        let d = dir.path();
        fs::create_dir_all(d.join("plugins")).expect("plugin dir");
        // `fake-cocoon` reads its scenario from `<argv[0]>.json`.
        std::os::unix::fs::symlink(fake::fake_cocoon(), d.join("cocoon")).expect("cocoon");
        // Not empty: a reload refuses an empty configuration file (one
        // being rewritten in place).
        fs::write(
            d.join("config.toml"),
            format!("# flags set the rest\n{config}"),
        )
        .expect("config");
        guest_of(d, first);
        let api = FakeApi::start(pod(first), false).await;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let daemon = binary::cocoon_fixup(d, &api.kubeconfig(d), &["serve", "--node", "n1"])
            .args(["--plugin-reload-interval", "100ms"])
            .args(["--retry-interval", "50ms", "--retry-budget", "200ms"])
            .args(["--exec-timeout", "30s"])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(fs::File::create(d.join("daemon.log")).expect("log"))
            .spawn()
            .expect("the daemon starts");
        Node {
            dir,
            api,
            port,
            _daemon: daemon,
        }
    }

    fn install(&self, plugin: &[u8]) {
        install(self.dir.path(), plugin);
    }

    /// Put pod `name` in place of the one the server keeps, once the
    /// daemon watches (so it hears of it).
    async fn next_pod(&self, name: &str) {
        self.until("the daemon's pod watch", async |n| {
            (n.api.watches() > 0).then_some(())
        })
        .await;
        guest_of(self.dir.path(), name);
        self.api.replace_pod(pod(name));
    }

    /// What planned pod `name`, the `n`-th fixup of the daemon: the
    /// plugins its hint's header names (`hostile VERSION sha256:HEX12`),
    /// once the fixup ended exhausted.
    async fn planned_with(&self, name: &str, n: usize) -> String {
        let hint = self
            .until(&format!("the hint of {name}"), async |node| {
                let current = node.api.with(|s| s.pod["metadata"]["name"] == name);
                current.then(|| node.api.annotation(keys::POST_CLONE_HINT))?
            })
            .await;
        self.until(&format!("fixup {n} ({name}) to end"), async |node| {
            let ended = node
                .api
                .events()
                .iter()
                .filter(|(reason, _)| reason == reasons::EXEC_EXHAUSTED)
                .count();
            (ended >= n).then_some(())
        })
        .await;
        let script = base64::engine::general_purpose::STANDARD
            .decode(&hint)
            .map(|s| String::from_utf8_lossy(&s).into_owned())
            .expect("the hint is base64");
        script
            .lines()
            .find_map(|l| l.strip_prefix("# plugins: "))
            .unwrap_or_else(|| panic!("no plugins line in the hint of {name}:\n{script}"))
            .to_owned()
    }

    /// The body of `GET path` on the metrics listener; `None` while it
    /// does not answer.
    pub(crate) async fn get(&self, path: &str) -> Option<String> {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: node\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        (head.split(' ').nth(1) == Some("200")).then(|| body.to_owned())
    }

    /// `cocoon_fixup_plugin_reload_total{result}` now, once `/metrics`
    /// answers (0 before the first such reload).
    pub(crate) async fn reloads(&self, result: &str) -> u64 {
        let metrics = self
            .until("/metrics", async |n| n.get("/metrics").await)
            .await;
        let series = format!("cocoon_fixup_plugin_reload_total{{result=\"{result}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .map_or(0, |v| v.trim().parse().expect("a counter"))
    }

    /// Wait until `probe` gives a value, or fail with what the daemon
    /// logged.
    async fn until<T>(&self, what: &str, probe: impl AsyncFn(&Node) -> Option<T>) -> T {
        let start = Instant::now();
        loop {
            if let Some(value) = probe(self).await {
                return value;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "gave up waiting for {what}; daemon log:\n{}\nevents: {:#?}",
                fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default(),
                self.api.events()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Wait until `/metrics` counts `count` reloads with `result`.
    pub(crate) async fn until_reloads(&self, result: &str, count: u64) {
        self.until(&format!("{count} reloads {result}"), async |n| {
            (n.reloads(result).await >= count).then_some(())
        })
        .await;
    }
}

/// Put `plugin` in the plugin directory as `hostile.wasm` at once (written
/// beside it, then renamed), so the reload never reads half a file.
fn install(dir: &Path, plugin: &[u8]) {
    let staged = dir.join("hostile.wasm.new");
    fs::write(&staged, plugin).expect("plugin staged");
    fs::rename(&staged, dir.join("plugins/hostile.wasm")).expect("plugin installed");
}

/// `fake-cocoon`'s scenario for pod `pod`'s VM: inspect finds it (one
/// static NIC), and every exec in it fails.
fn guest_of(dir: &Path, pod: &str) {
    let scenario = json!({
        "log": dir.join("calls.jsonl"),
        "exec": [{"exit": 1, "stderr": "no network\n"}],
        "inspect": {"json": {"id": format!("vm-{pod}"), "config": {"name": vm_name_for_pod("default", pod)},
            "network_configs": [{"mac": "52:54:00:aa:bb:01", "tap": "tap0",
                "network": {"ip": "10.0.0.5", "prefix": 24, "gateway": "10.0.0.1"}}]}},
    });
    let staged: PathBuf = dir.join("cocoon.json.new");
    fs::write(&staged, scenario.to_string()).expect("scenario staged");
    fs::rename(&staged, dir.join("cocoon.json")).expect("scenario");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_plans_with_the_reloaded_plugin_and_keeps_it_when_a_reload_is_refused() {
    let (a, b) = (hostile("version-a"), hostile("version-b"));
    let (digest_a, digest_b) = (short_digest(&a), short_digest(&b));
    assert_ne!(digest_a, digest_b);
    let node = Node::start(&a, PODS[0]).await;

    // 1. The first pod: version A.
    let first = node.planned_with(PODS[0], 1).await;
    assert!(
        first.starts_with("hostile ") && first.ends_with(&format!(" {digest_a}")),
        "{first}"
    );
    assert_eq!(node.reloads("swapped").await, 0);

    // 2. Version B in the file; the swap counted, the next pod is B's.
    node.install(&b);
    node.until_reloads("swapped", 1).await;
    node.next_pod(PODS[1]).await;
    let second = node.planned_with(PODS[1], 2).await;
    assert_eq!(
        second,
        first.replace(&digest_a, &digest_b),
        "the same plugin, the new file"
    );
    assert_eq!(node.get("/healthz").await.as_deref(), Some("ok\n"));

    // 3. No plugin at all in the file: refused, B keeps serving.
    node.install(b"not a plugin, garbage");
    node.until_reloads("rejected", 1).await;
    let health = node.get("/healthz").await.expect("/healthz");
    let detail = health
        .strip_prefix("ok\n")
        .and_then(|d| d.strip_prefix("plugin reload refused: "))
        .unwrap_or_else(|| panic!("no refusal in /healthz: {health:?}"));
    assert!(detail.contains("hostile.wasm"), "{health}");
    node.next_pod(PODS[2]).await;
    let third = node.planned_with(PODS[2], 3).await;
    assert_eq!(third, second, "the refused file never served");
    assert_eq!(node.reloads("swapped").await, 1);
    assert_eq!(node.reloads("rejected").await, 1, "refused once");

    // 4. Version A back: the reload goes through and the detail is gone.
    node.install(&a);
    node.until_reloads("swapped", 2).await;
    assert_eq!(node.get("/healthz").await.as_deref(), Some("ok\n"));
    assert_eq!(node.reloads("rejected").await, 1);
    node.api
        .with(|s| assert!(s.unexpected.is_empty(), "{:?}", s.unexpected));
}
