//! A real OCI registry on loopback for tests: Debian's `docker-registry`
//! (the CNCF distribution registry), started on a free port with its
//! storage in a fresh folder, and stopped (killed, folder removed) when
//! dropped. Standard library only, so that the host crate's tests can use
//! this file too (`#[path]`).
//!
//! [`LocalRegistry::start`] returns `None`, after printing why, only when
//! the `docker-registry` binary is absent; CI installs it (`.ci/run`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where Debian installs the registry.
const BINARY: &str = "/usr/bin/docker-registry";
/// How long the registry may take to answer `GET /v2/` (about one second
/// on a quiet machine).
const READY_WITHIN: Duration = Duration::from_secs(30);

/// A running registry; killed when dropped.
#[derive(Debug)]
pub struct LocalRegistry {
    child: Child,
    dir: PathBuf,
    host: String,
}

impl LocalRegistry {
    /// Start one, or `None` (with the reason printed) when the binary is
    /// not installed; with `COCOON_FIXUP_REQUIRE_REGISTRY=1` (set by
    /// `.ci/run`) its absence fails the test instead.
    pub fn start() -> Option<Self> {
        if !Path::new(BINARY).is_file() {
            assert!(
                std::env::var_os("COCOON_FIXUP_REQUIRE_REGISTRY").is_none_or(|v| v != "1"),
                "{BINARY} is not installed and COCOON_FIXUP_REQUIRE_REGISTRY=1"
            );
            println!(
                "skipped: {BINARY} is not installed (`apt-get install -y --no-install-recommends docker-registry`; .ci/run does)"
            );
            return None;
        }
        let dir =
            std::env::temp_dir().join(format!("fixup-registry-{}-{}", std::process::id(), next()));
        std::fs::create_dir_all(dir.join("storage")).expect("registry folder");
        // A free port: bound by us, released, then taken by the registry.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let host = format!("127.0.0.1:{port}");
        let config = dir.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {host}\n",
                dir.join("storage").display()
            ),
        )
        .expect("registry config");
        let log = std::fs::File::create(dir.join("registry.log")).expect("registry log");
        let child = Command::new(BINARY)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        let mut registry = LocalRegistry { child, dir, host };
        registry.wait_ready();
        Some(registry)
    }

    /// `127.0.0.1:PORT`, as a reference names it.
    pub fn host(&self) -> &str {
        &self.host
    }

    fn wait_ready(&mut self) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("registry status") {
                panic!(
                    "docker-registry exited ({status}) before it answered: {}",
                    std::fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default()
                );
            }
            if get_status(&self.host, "/v2/") == Some(200) {
                return;
            }
            assert!(
                start.elapsed() < READY_WITHIN,
                "docker-registry did not answer GET /v2/ within {READY_WITHIN:?}: {}",
                std::fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stop it now (a registry that is down).
    pub fn stop(mut self) {
        self.kill();
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The status of a plain HTTP `GET path` on `host`, if it answers.
fn get_status(host: &str, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(host).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

fn next() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
