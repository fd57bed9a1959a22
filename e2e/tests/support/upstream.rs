//! Upstream's flow, as the baseline the suite compares the host with
//! (spec Appendix A): one `sh -c` script per attempt through the same
//! `cocoon vm exec`, only the exit code of its last line counts, the
//! guest's output is thrown away; 3 s between attempts within 180 s; then
//! the IP wait (the first NIC's static IP at once, otherwise its MAC in
//! the lease file, 45 s, every 200 ms). Nothing here is a model for the
//! host's own rendering.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fixup_e2e::state::Backend;

use super::{Lab, NicNet};

/// Upstream's retry budget and the pause between attempts.
pub const BUDGET: Duration = Duration::from_secs(180);
pub const INTERVAL: Duration = Duration::from_secs(3);
/// Upstream's IP wait.
pub const IP_WAIT: Duration = Duration::from_secs(45);
const IP_POLL: Duration = Duration::from_millis(200);

/// The Linux network flavour upstream picks (spec section 2: a cloud
/// image by its overlay, otherwise OCI).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    Cloudimg,
    Networkd,
}

/// Upstream's Linux script, line by line as Appendix A renders it: lines
/// joined with one LF, no trailing LF, no `set -e`.
pub fn script(
    vm_name: &str,
    backend: Backend,
    nics: &[(&str, NicNet)],
    flavour: Flavour,
) -> String {
    let mut lines = vec![
        "echo 3 > /proc/sys/vm/drop_caches".to_owned(),
        format!("echo {vm_name} > /etc/hostname"),
    ];
    if backend == Backend::Firecracker {
        for (i, (mac, _)) in nics.iter().enumerate() {
            lines.push(format!(
                "ip link set dev eth{i} down && ip link set dev eth{i} address {mac} && ip link set dev eth{i} up"
            ));
        }
    }
    lines.push("rm -f /etc/systemd/network/10-*.network".to_owned());
    match flavour {
        Flavour::Cloudimg => {
            lines.push("cloud-init clean --logs --seed --configs network && cloud-init init --local && cloud-init init".to_owned());
            lines.push(
                "cloud-init modules --mode=config && systemctl restart systemd-networkd".to_owned(),
            );
        }
        Flavour::Networkd => {
            for (mac, net) in nics {
                let network = match net {
                    NicNet::Static {
                        ip,
                        prefix,
                        gateway,
                    } => format!("Address={ip}/{prefix}\\nGateway={gateway}\\n"),
                    NicNet::Dhcp => "DHCP=ipv4\\n\\n[DHCPv4]\\nClientIdentifier=mac\\n".to_owned(),
                };
                lines.push(format!(
                    "printf '[Match]\\nMACAddress={mac}\\n\\n[Network]\\n{network}' > /etc/systemd/network/10-{}.network",
                    mac.replace(':', "")
                ));
            }
            lines.push("systemctl restart systemd-networkd".to_owned());
        }
    }
    lines.join("\n")
}

/// What upstream's flow did and concluded.
#[derive(Debug, Clone)]
pub struct Run {
    /// Exit codes of the attempts (empty: no fixup ran; `None`: the exec
    /// outlived the budget and was killed).
    pub exits: Vec<Option<i32>>,
    /// `ready <ip>`, `exhausted`, or `ip wait timed out`.
    pub verdict: String,
    pub ip: Option<String>,
    /// The attempts, with their pauses.
    pub fixup: Duration,
    pub ip_wait: Duration,
}

impl Run {
    /// Upstream told Kubernetes the pod is ready.
    pub fn ready(&self) -> bool {
        self.ip.is_some()
    }

    /// What the exec reported, as the side-by-side table shows it.
    pub fn exec_line(&self) -> String {
        let code = |c: &Option<i32>| c.map_or_else(|| "timeout".to_owned(), |c| c.to_string());
        match self.exits.as_slice() {
            [] => "no exec (no fixup needed)".to_owned(),
            [one] => format!("1 exec, exit {}", code(one)),
            exits => format!(
                "{} execs, exits {}",
                exits.len(),
                exits.iter().map(code).collect::<Vec<_>>().join(",")
            ),
        }
    }
}

/// Run upstream's flow against the lab's clone: the script (when `fixup`),
/// retried as upstream retries, then upstream's IP wait for the first NIC.
pub fn run(lab: &Lab, fixup: Option<&str>, first_nic: (&str, &NicNet)) -> Result<Run> {
    let cocoon = lab.cocoon()?;
    let mut exits = Vec::new();
    let started = Instant::now();
    if let Some(script) = fixup {
        loop {
            let code = exec(
                &cocoon,
                &lab.vm_id,
                script,
                BUDGET.saturating_sub(started.elapsed()),
            )?;
            exits.push(code);
            if code == Some(0) {
                break;
            }
            if started.elapsed() + INTERVAL >= BUDGET {
                return Ok(Run {
                    exits,
                    verdict: "exhausted".to_owned(),
                    ip: None,
                    fixup: started.elapsed(),
                    ip_wait: Duration::ZERO,
                });
            }
            std::thread::sleep(INTERVAL);
        }
    }
    let fixup_took = started.elapsed();
    let waiting = Instant::now();
    let ip = match first_nic.1 {
        NicNet::Static { ip, .. } => Some(ip.clone()),
        NicNet::Dhcp => loop {
            if let Some(ip) = lease_for(&lab.root.join("leases.json"), first_nic.0) {
                break Some(ip);
            }
            if waiting.elapsed() >= IP_WAIT {
                break None;
            }
            std::thread::sleep(IP_POLL);
        },
    };
    Ok(Run {
        exits,
        verdict: match &ip {
            Some(ip) => format!("ready {ip}"),
            None => "ip wait timed out".to_owned(),
        },
        ip,
        fixup: fixup_took,
        ip_wait: waiting.elapsed(),
    })
}

/// One `cocoon vm exec <id> -- sh -c <script>`, its output thrown away,
/// killed when it outlives `within` (the budget left): its exit code, or
/// `None` when it was killed.
fn exec(cocoon: &Path, vm_id: &str, script: &str, within: Duration) -> Result<Option<i32>> {
    let mut child = Command::new(cocoon)
        .args(["vm", "exec", vm_id, "--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot run {}", cocoon.display()))?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status.code().unwrap_or(1)));
        }
        if started.elapsed() >= within {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The unexpired lease of `mac` (case-insensitive) in a cocoon-net lease
/// file, as upstream looks it up.
fn lease_for(file: &Path, mac: &str) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    let rows: Vec<serde_json::Value> = serde_json::from_str(&text).ok()?;
    let now = jiff::Timestamp::now();
    rows.iter()
        .filter(|row| {
            row["mac"]
                .as_str()
                .is_some_and(|m| m.eq_ignore_ascii_case(mac))
        })
        .filter(|row| {
            row["expiry"]
                .as_str()
                .and_then(|e| e.parse::<jiff::Timestamp>().ok())
                .is_some_and(|expiry| expiry > now)
        })
        .find_map(|row| row["ip"].as_str().map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_appendix_a() {
        let nics = [(
            "52:54:00:e2:e0:0b",
            NicNet::Static {
                ip: "10.213.7.20".into(),
                prefix: 24,
                gateway: "10.213.7.1".into(),
            },
        )];
        assert_eq!(
            script(
                "vk-e2e-x-abcdef",
                Backend::Firecracker,
                &nics,
                Flavour::Networkd
            ),
            "echo 3 > /proc/sys/vm/drop_caches\n\
             echo vk-e2e-x-abcdef > /etc/hostname\n\
             ip link set dev eth0 down && ip link set dev eth0 address 52:54:00:e2:e0:0b && ip link set dev eth0 up\n\
             rm -f /etc/systemd/network/10-*.network\n\
             printf '[Match]\\nMACAddress=52:54:00:e2:e0:0b\\n\\n[Network]\\nAddress=10.213.7.20/24\\nGateway=10.213.7.1\\n' > /etc/systemd/network/10-525400e2e00b.network\n\
             systemctl restart systemd-networkd"
        );
    }

    #[test]
    fn renders_appendix_a_for_dhcp_and_two_nics_on_cloud_hypervisor() {
        let nics = [
            ("52:54:00:AA:00:01", NicNet::Dhcp),
            (
                "52:54:00:aa:00:02",
                NicNet::Static {
                    ip: "10.0.0.5".into(),
                    prefix: 16,
                    gateway: "10.0.0.1".into(),
                },
            ),
        ];
        assert_eq!(
            script(
                "vk-a-b-123456",
                Backend::CloudHypervisor,
                &nics,
                Flavour::Networkd
            ),
            "echo 3 > /proc/sys/vm/drop_caches\n\
             echo vk-a-b-123456 > /etc/hostname\n\
             rm -f /etc/systemd/network/10-*.network\n\
             printf '[Match]\\nMACAddress=52:54:00:AA:00:01\\n\\n[Network]\\nDHCP=ipv4\\n\\n[DHCPv4]\\nClientIdentifier=mac\\n' > /etc/systemd/network/10-525400AA0001.network\n\
             printf '[Match]\\nMACAddress=52:54:00:aa:00:02\\n\\n[Network]\\nAddress=10.0.0.5/16\\nGateway=10.0.0.1\\n' > /etc/systemd/network/10-525400aa0002.network\n\
             systemctl restart systemd-networkd"
        );
    }

    #[test]
    fn renders_appendix_a_for_a_cloud_image_on_firecracker() {
        let nics = [
            ("52:54:00:aa:00:01", NicNet::Dhcp),
            ("52:54:00:aa:00:02", NicNet::Dhcp),
        ];
        assert_eq!(
            script(
                "vk-a-b-123456",
                Backend::Firecracker,
                &nics,
                Flavour::Cloudimg
            ),
            "echo 3 > /proc/sys/vm/drop_caches\n\
             echo vk-a-b-123456 > /etc/hostname\n\
             ip link set dev eth0 down && ip link set dev eth0 address 52:54:00:aa:00:01 && ip link set dev eth0 up\n\
             ip link set dev eth1 down && ip link set dev eth1 address 52:54:00:aa:00:02 && ip link set dev eth1 up\n\
             rm -f /etc/systemd/network/10-*.network\n\
             cloud-init clean --logs --seed --configs network && cloud-init init --local && cloud-init init\n\
             cloud-init modules --mode=config && systemctl restart systemd-networkd"
        );
    }
}
