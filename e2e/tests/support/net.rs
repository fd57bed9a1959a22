//! The network a guest sees: a namespace the test creates, a bridge inside
//! it holding the gateway address with the guest's taps on it, optionally
//! dnsmasq on the bridge, and a bridge from dnsmasq's lease file to the cocoon-net
//! lease file the host watches. No traffic leaves the namespace.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Run a command to completion; fail with its stderr.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A network namespace, deleted (with whatever still runs in it) on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Create `name`, replacing a leftover of an interrupted run.
    pub fn create(name: &str) -> Result<Netns> {
        if Path::new("/run/netns").join(name).exists() {
            kill_pids_in(name);
            let _ = run(Command::new("ip").args(["netns", "del", name]));
        }
        run(Command::new("ip").args(["netns", "add", name]))?;
        let ns = Netns {
            name: name.to_owned(),
        };
        run(Command::new("ip").args(["-n", name, "link", "set", "lo", "up"]))?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A bridge `bridge` holding `host_cidr` (the guest network's
    /// gateway), with a tap for QEMU on it per name in `taps`. A clone
    /// starts on the first; Cloud Hypervisor's NIC swap plugs the new NIC
    /// into another while the old one still holds the first, as cocoon
    /// gives the new NIC a tap of its own.
    pub fn add_switch(&self, bridge: &str, host_cidr: &str, taps: &[&str]) -> Result<()> {
        let n = self.name.as_str();
        run(Command::new("ip").args(["-n", n, "link", "add", bridge, "type", "bridge"]))?;
        run(Command::new("ip").args(["-n", n, "addr", "add", host_cidr, "dev", bridge]))?;
        run(Command::new("ip").args(["-n", n, "link", "set", bridge, "up"]))?;
        for tap in taps {
            run(Command::new("ip").args(["-n", n, "tuntap", "add", "dev", tap, "mode", "tap"]))?;
            run(Command::new("ip").args(["-n", n, "link", "set", tap, "master", bridge, "up"]))?;
        }
        Ok(())
    }

    /// `program` to be run inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    /// Ping `ip` from the namespace until one echo comes back or `within`
    /// has passed. The neighbour table is flushed first: an entry left from
    /// before the fixup (another MAC, or a failed resolution) would make
    /// the first pings fail for reasons that are not the guest's.
    pub fn ping(&self, dev: &str, ip: Ipv4Addr, within: Duration) -> Result<Duration> {
        let started = Instant::now();
        run(Command::new("ip").args(["-n", &self.name, "neigh", "flush", "dev", dev]))?;
        let mut last = String::new();
        while started.elapsed() < within {
            let out = self
                .command("ping")
                .args(["-c", "1", "-W", "1", &ip.to_string()])
                .stdin(Stdio::null())
                .output()?;
            if out.status.success() {
                return Ok(started.elapsed());
            }
            last = String::from_utf8_lossy(&out.stdout).into_owned();
            std::thread::sleep(Duration::from_millis(300));
        }
        bail!(
            "no ping reply from {ip} in namespace {} within {within:?}; last: {}",
            self.name,
            last.trim()
        )
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        kill_pids_in(&self.name);
        let _ = run(Command::new("ip").args(["netns", "del", &self.name]));
    }
}

/// SIGKILL what still runs in our namespace (a QEMU or dnsmasq of ours
/// that a failed test left), by pid.
fn kill_pids_in(ns: &str) {
    if let Ok(pids) = run(Command::new("ip").args(["netns", "pids", ns])) {
        for pid in pids.split_whitespace() {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
        }
    }
}

/// Whether the lab's dnsmasq pings an address before it first offers it
/// (`COCOON_FIXUP_E2E_DHCP_PING=1`); off by default, as the stack's server.
pub fn dhcp_ping_check() -> bool {
    std::env::var_os("COCOON_FIXUP_E2E_DHCP_PING").is_some_and(|v| v == "1")
}

/// dnsmasq as the DHCP server on the namespace side of a tap.
#[derive(Debug)]
pub struct Dnsmasq {
    child: Child,
    pub lease_file: PathBuf,
    pub log_file: PathBuf,
}

impl Dnsmasq {
    /// Serve `range` ("first,last,netmask") on `dev`; files go to `dir`.
    pub fn start(ns: &Netns, dev: &str, range: &str, dir: &Path) -> Result<Dnsmasq> {
        let lease_file = dir.join("dnsmasq.leases");
        let log_file = dir.join("dnsmasq.log");
        std::fs::write(&lease_file, "")?;
        let mut command = ns.command("dnsmasq");
        // The stack's own DHCP server (cocoon-net's) offers an address
        // from its pool at once; dnsmasq's default is to ping an address
        // before it first offers it, about 3 s for every new client. The
        // lab serves as the stack does; COCOON_FIXUP_E2E_DHCP_PING=1
        // keeps dnsmasq's check, for a server that probes for conflicts.
        if !dhcp_ping_check() {
            command.arg("--no-ping");
        }
        let child = command
            .args([
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--port=0",
                "--bind-interfaces",
                "--user=root",
                "--group=root",
                "--dhcp-authoritative",
                "--log-dhcp",
            ])
            .arg(format!("--interface={dev}"))
            .arg(format!("--dhcp-range={range},1h"))
            .arg(format!("--dhcp-leasefile={}", lease_file.display()))
            .arg(format!("--log-facility={}", log_file.display()))
            .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start dnsmasq")?;
        let mut dnsmasq = Dnsmasq {
            child,
            lease_file,
            log_file,
        };
        // It binds at once or exits with its reason in the log.
        std::thread::sleep(Duration::from_millis(300));
        if let Some(status) = dnsmasq.child.try_wait()? {
            bail!(
                "dnsmasq exited at start ({status}): {}",
                std::fs::read_to_string(&dnsmasq.log_file).unwrap_or_default()
            );
        }
        Ok(dnsmasq)
    }

    /// dnsmasq's leases now.
    pub fn leases(&self) -> Vec<DnsmasqLease> {
        parse_dnsmasq_leases(&std::fs::read_to_string(&self.lease_file).unwrap_or_default())
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One line of dnsmasq's lease file:
/// `<expiry epoch> <mac> <ip> <hostname> <client-id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsmasqLease {
    pub expiry: i64,
    pub mac: String,
    pub ip: Ipv4Addr,
    pub client_id: String,
}

pub fn parse_dnsmasq_leases(text: &str) -> Vec<DnsmasqLease> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 5 {
                return None;
            }
            Some(DnsmasqLease {
                expiry: f[0].parse().ok()?,
                mac: f[1].to_ascii_lowercase(),
                ip: f[2].parse().ok()?,
                client_id: f[4].to_ascii_lowercase(),
            })
        })
        .collect()
}

/// Plays cocoon-net: copies dnsmasq's leases into the JSON lease file the
/// host's `LeaseWatcher` watches (`[{mac, ip, expiry}]`, RFC 3339 expiry;
/// `null` while there is none, as cocoon-net writes it), every 100 ms,
/// replacing the file by rename as cocoon-net does.
#[derive(Debug)]
pub struct LeaseBridge {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl LeaseBridge {
    pub fn start(from: PathBuf, to: PathBuf) -> LeaseBridge {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut last = None;
            while !flag.load(Ordering::Relaxed) {
                let text = std::fs::read_to_string(&from).unwrap_or_default();
                let json = leases_json(&parse_dnsmasq_leases(&text));
                if last.as_ref() != Some(&json) {
                    let tmp = to.with_extension("tmp");
                    if std::fs::write(&tmp, &json).is_ok() && std::fs::rename(&tmp, &to).is_ok() {
                        last = Some(json);
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        LeaseBridge {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for LeaseBridge {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn leases_json(leases: &[DnsmasqLease]) -> String {
    let rows: Vec<serde_json::Value> = leases
        .iter()
        .filter_map(|l| {
            let expiry = jiff::Timestamp::from_second(l.expiry).ok()?;
            Some(serde_json::json!({"mac": l.mac, "ip": l.ip.to_string(), "expiry": expiry.to_string()}))
        })
        .collect();
    // cocoon-net marshals its rows as a Go slice: with none, `null`.
    if rows.is_empty() {
        return "null".to_owned();
    }
    serde_json::Value::Array(rows).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dnsmasq_leases_become_cocoon_net_rows() {
        let text = "1764500000 fa:16:3e:00:00:01 10.213.7.150 e2e 01:fa:16:3e:00:00:01\nbroken\n";
        let leases = parse_dnsmasq_leases(text);
        assert_eq!(leases.len(), 1);
        assert_eq!(leases[0].client_id, "01:fa:16:3e:00:00:01");
        assert_eq!(
            leases_json(&leases),
            r#"[{"expiry":"2025-11-30T10:53:20Z","ip":"10.213.7.150","mac":"fa:16:3e:00:00:01"}]"#
        );
        assert_eq!(leases_json(&parse_dnsmasq_leases("broken\n")), "null");
    }
}
