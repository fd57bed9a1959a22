//! Guest truth: the host's real apply flow against real Debian guests
//! under QEMU, each clone a real snapshot restore. Each test is one
//! scenario of a cloned VM: the parent ran with MAC A and IP X (or a
//! lease) and was saved; the clone resumes from its memory, as cocoon's
//! does, and must end up on MAC B with IP Y (or its DHCP lease). Every
//! check reads the guest's real state: the NIC's MAC and addresses through
//! the guest agent (`ip -j addr`), files in the guest, dnsmasq's lease
//! (client id), and a ping from the namespace.
//!
//! Every scenario runs twice from the same snapshot: once with the host,
//! once with upstream's commands (spec Appendix A) through the same shim,
//! and prints both side by side: repaired or not, what the exec reported,
//! and the time from the restore to the ready intent.
//!
//! The tests are ignored in a plain `cargo test` (they need root, QEMU and
//! cached images, and take minutes): `just e2e` builds what is missing and
//! runs them with `--ignored`. Run with `--ignored` without the
//! prerequisites, a test fails with the command that fixes it.
//! docs/e2e.md has the details and the measured figures.

mod support;

use fixup_core::decision::FixupEnd;
use fixup_core::decision::Handled;
use fixup_core::decision::Readiness;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use base64::Engine as _;
use fixup_core::decision::RetryConfig;
use fixup_core::decision::Summary;
use fixup_e2e::state::Backend;
use fixup_host::host::HostConfig;
use fixup_host::pods::{keys, reasons};
use support::guest::{Guest, Link};
use support::net::{Dnsmasq, LeaseBridge};
use support::upstream::{self, Flavour};
use support::{
    BRIDGE, DHCP_RANGE, IP_Y, LINK_LIMIT, Lab, MAC_B, NicNet, PING_LIMIT, ParentNet, Rig,
    SHUTDOWN_LIMIT, seed,
};

/// Which flow repairs the clone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    /// The host: `Host::handle`, as a pod event triggers it.
    Ours,
    /// Upstream's script and waits (support/upstream.rs).
    Upstream,
}

impl Who {
    /// The lab's name: each side has its own namespace and state.
    fn lab(self, scenario: &str) -> String {
        match self {
            Who::Ours => scenario.to_owned(),
            Who::Upstream => format!("{scenario}-up"),
        }
    }

    /// The host's rig, built before the restore (as the node daemon runs
    /// before a clone appears), or none for upstream's flow.
    fn rig(self, lab: &Lab, config: HostConfig) -> Result<Option<Rig>> {
        match self {
            Who::Ours => lab.host(config).map(Some),
            Who::Upstream => Ok(None),
        }
    }

    /// The checks' verdict: for the host a failed check fails the test;
    /// for upstream it is the finding (not repaired, and why). A failure
    /// of the harness itself (the guest agent, I/O, bad JSON) is never a
    /// finding: it fails the test on either side.
    fn judge(self, scenario: &str, checks: Result<()>) -> Result<Result<(), String>> {
        match (self, checks) {
            (_, Ok(())) => Ok(Ok(())),
            (Who::Ours, Err(e)) => Err(e),
            (Who::Upstream, Err(e)) if harness_failure(&e) => Err(e),
            (Who::Upstream, Err(e)) => {
                eprintln!("e2e {scenario}: upstream left the guest broken: {e:#}");
                Ok(Err(format!("{e:#}")))
            }
        }
    }
}

/// What one flow did in one clone, for the side-by-side report.
#[derive(Debug)]
struct Side {
    who: Who,
    /// What the exec reported.
    exec: String,
    /// What the flow concluded (`ready <ip>`, `exhausted`, ...).
    verdict: String,
    /// The guest passed the scenario's checks afterwards; if not, the
    /// check that failed.
    repaired: bool,
    broken: Option<String>,
    /// From the restore to the ready intent (`None`: never ready).
    ready_after: Option<Duration>,
    timings: Vec<(String, Duration)>,
}

/// An error of the harness rather than a check that failed: the guest
/// agent could not be reached or timed out, or I/O failed.
fn harness_failure(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause.is::<fixup_e2e::qga::AgentError>()
            || cause.is::<std::io::Error>()
            || cause.is::<serde_json::Error>()
    })
}

/// What each flow is expected to do in a scenario.
#[derive(Debug, Clone, Copy)]
struct Expect {
    /// The host reports the pod ready (it always repairs the guest).
    ours_ready: bool,
    /// Upstream reports the pod ready.
    ready: bool,
    /// Upstream really repairs the guest.
    repaired: bool,
}

impl Expect {
    /// The host repairs and reports ready; upstream as given.
    fn upstream(ready: bool, repaired: bool) -> Expect {
        Expect {
            ours_ready: true,
            ready,
            repaired,
        }
    }
}

/// What a flow reported, before the checks.
struct Flow {
    exec: String,
    verdict: String,
    /// The IP it published.
    ip: Option<String>,
    ready_after: Option<Duration>,
}

/// Run the host over the lab's clone: the summary and the rig (its pod,
/// events and annotations) for the scenario's own assertions.
fn run_ours(lab: &mut Lab, rig: Option<Rig>) -> Result<(Flow, Summary, Rig)> {
    let rig = rig.context("the host's rig is built before the restore")?;
    let started = Instant::now();
    let summary = rig.handle()?;
    let took = started.elapsed();
    let ended = support::unix_ms();
    let ready_after = summary
        .is_ready()
        .then(|| lab.restore_to_ready(took))
        .flatten();
    let execs = support::shim_execs(&lab.root);
    record_flow(lab, took, &execs, ended, summary.fixup.is_some());
    let exec = match execs.as_slice() {
        [] => "no exec".to_owned(),
        [one] => format!("1 exec, {}", one.exit),
        more => format!(
            "{} execs, last {}",
            more.len(),
            more.last().map_or("", |e| e.exit.as_str())
        ),
    };
    let verdict = match (summary.fixup, summary.readiness, &summary.ip) {
        (Some(FixupEnd::Exhausted), ..) => format!("exhausted after {} attempts", summary.attempts),
        (_, Some(Readiness::Ready), Some(ip)) => format!("ready {ip}"),
        (fixup, readiness, _) => format!("{fixup:?} {readiness:?}"),
    };
    Ok((
        Flow {
            exec,
            verdict,
            ip: summary.ip.clone(),
            ready_after,
        },
        summary,
        rig,
    ))
}

/// Run upstream's flow over the lab's clone.
fn run_upstream(lab: &mut Lab, script: Option<&str>, first_nic: (&str, &NicNet)) -> Result<Flow> {
    let started = Instant::now();
    let run = upstream::run(lab, script, first_nic)?;
    let took = started.elapsed();
    let ended = support::unix_ms();
    let ready_after = run.ready().then(|| lab.restore_to_ready(took)).flatten();
    let execs = support::shim_execs(&lab.root);
    record_flow(lab, took, &execs, ended, script.is_some());
    Ok(Flow {
        exec: run.exec_line(),
        verdict: run.verdict,
        ip: run.ip,
        ready_after,
    })
}

/// The host's flow ended as a repair does: the fixup `done` for
/// `scenario` by classification rule `rule`, the pod ready, and, for a
/// static NIC, on `ip`.
fn repaired_by(summary: &Summary, scenario: &str, rule: u8, ip: Option<&str>) -> Result<()> {
    ensure!(
        summary.fixup == Some(FixupEnd::Done)
            && summary.scenario.map_or("none", |s| s.as_str()) == scenario
            && summary.rule == rule
            && summary.is_ready(),
        "{summary:?}"
    );
    if let Some(ip) = ip {
        ensure!(summary.ip.as_deref() == Some(ip), "{summary:?}");
    }
    Ok(())
}

/// Upstream's fixup of the clone's one NIC (MAC B, `nic`) with its
/// script for `flavour`, then its IP wait.
fn fix_upstream(lab: &mut Lab, nic: &NicNet, flavour: Flavour) -> Result<Flow> {
    let script = upstream::script(&lab.vm_name, lab.backend, &[(MAC_B, nic.clone())], flavour);
    run_upstream(lab, Some(&script), (MAC_B, nic))
}

/// The flow's timings: the fixup (from the start to the end of the last
/// `vm exec`), the plan's own time in the guest (the shim's `vm exec`
/// calls), and the IP wait after the fixup. Without a fixup (rule 7) it
/// is all IP wait, a DHCP recovery pass included.
fn record_flow(
    lab: &mut Lab,
    took: Duration,
    execs: &[support::ShimExec],
    ended: u128,
    fixup: bool,
) {
    let waited = match execs.last() {
        Some(last) if fixup => {
            Duration::from_millis(u64::try_from(ended.saturating_sub(last.ended_ms)).unwrap_or(0))
        }
        _ => took,
    };
    lab.record("fixup (host)", took.saturating_sub(waited));
    let in_guest: Duration = execs.iter().map(|e| e.took).sum();
    lab.record("plan in the guest", in_guest);
    lab.record("ip wait", waited);
}

/// A flow that published an IP published `ip` (the lease's, for DHCP).
fn published_is(flow: &Flow, ip: &str) -> Result<()> {
    if let Some(published) = &flow.ip {
        ensure!(
            published == ip,
            "the flow published {published}, the guest's address is {ip}"
        );
    }
    Ok(())
}

/// Finish one side: its timings and what it did.
fn side(lab: Lab, who: Who, flow: Flow, checks: Result<(), String>) -> Side {
    let mut timings = lab.finish();
    if let Some(ready) = flow.ready_after {
        timings.push(("restore to ready".to_owned(), ready));
    }
    Side {
        who,
        exec: flow.exec,
        verdict: flow.verdict,
        repaired: checks.is_ok(),
        broken: checks.err(),
        ready_after: flow.ready_after,
        timings,
    }
}

/// Print both sides and check upstream did what the spec says it does;
/// the host must have repaired the clone.
fn compare(scenario: &str, ours: &Side, theirs: &Side, expect: Expect) -> Result<()> {
    let row = |side: &Side| {
        let figure = |name: &str| {
            side.timings.iter().find(|(p, _)| p == name).map_or_else(
                || "-".to_owned(),
                |(_, d)| format!("{:.1}", d.as_secs_f64()),
            )
        };
        format!(
            "| `{scenario}` | {:?} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            side.who,
            match (&side.broken, side.repaired) {
                (_, true) => "yes".to_owned(),
                (Some(why), false) => format!(
                    "**no**: {}",
                    why.split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ")
                        .replace('|', "/")
                ),
                (None, false) => "**no**".to_owned(),
            },
            side.exec,
            side.verdict,
            side.ready_after
                .map_or_else(|| "never".to_owned(), |d| format!("{:.1}", d.as_secs_f64())),
            figure("restore (agent up)"),
            figure("hot-swap"),
            figure("fixup (host)"),
            figure("plan in the guest"),
            figure("ip wait"),
        )
    };
    let table = format!(
        "| scenario | flow | repaired | exec | verdict | restore to ready (s) | restore (s) | hot-swap (s) | fixup (s) | plan in guest (s) | ip wait (s) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n{}\n{}",
        row(ours),
        row(theirs)
    );
    let ping = if support::net::dhcp_ping_check() {
        " (dhcp ping check)"
    } else {
        ""
    };
    eprintln!("e2e {scenario} side by side{ping}:\n{table}");
    if let Ok(mut log) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(support::images::cache_dir().join("side-by-side.log"))
    {
        let _ = writeln!(log, "{} {scenario}{ping}\n{table}", jiff::Timestamp::now());
    }
    ensure!(
        ours.repaired && ours.ready_after.is_some() == expect.ours_ready,
        "{ours:?}"
    );
    ensure!(
        theirs.repaired == expect.repaired && theirs.ready_after.is_some() == expect.ready,
        "upstream was expected to {} and {} the guest: {theirs:?}",
        if expect.ready {
            "report ready"
        } else {
            "not report ready"
        },
        if expect.repaired {
            "repair"
        } else {
            "not repair"
        },
    );
    Ok(())
}

/// Poll the clone's NIC (every 250 ms, at most `within`) until `want`
/// holds; how long it took.
fn wait_nic(
    guest: &Guest,
    within: Duration,
    what: &str,
    want: impl Fn(&Link) -> bool,
) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let nic = guest.nic()?;
        if want(&nic) {
            return Ok(started.elapsed());
        }
        ensure!(
            started.elapsed() < within,
            "after {within:?}, the NIC is {nic:?}; expected {what}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The clone's NIC ends up on `mac` with `ip/prefix` and none of the
/// addresses in `gone`, and the namespace reaches `ip`.
///
/// The guest is polled: the host is done when `systemctl restart
/// systemd-networkd` has returned, and for a static NIC it reports the IP
/// at once (spec section 6), while networkd applies the address a moment
/// later.
fn assert_reachable(lab: &Lab, guest: &Guest, mac: &str, ip: &str, gone: &[&str]) -> Result<()> {
    let prefix = lab.image.golden.prefix;
    let what = format!("MAC {mac} with {ip}/{prefix} and none of {gone:?}");
    let settled = wait_nic(guest, LINK_LIMIT, &what, |link| {
        link.mac == mac
            && link.has(ip, prefix)
            && !link
                .ipv4
                .iter()
                .any(|(a, _)| gone.contains(&a.to_string().as_str()))
    })?;
    let took = lab.ns.ping(BRIDGE, ip.parse()?, PING_LIMIT)?;
    eprintln!(
        "e2e {}: {} on {mac} with {ip}/{prefix} {settled:.1?} after the flow finished; ping answered in {took:.1?}",
        lab.scenario,
        guest.nic()?.name,
    );
    Ok(())
}

fn shutdown(lab: &mut Lab, guest: Guest) -> Result<()> {
    let took = guest.shutdown(SHUTDOWN_LIMIT)?;
    lab.record("shutdown", took);
    Ok(())
}

/// The static file the product writes, byte for byte (spec section 4).
fn static_file(mac: &str, ip: &str, prefix: u8, gateway: &str) -> String {
    format!("[Match]\nMACAddress={mac}\n\n[Network]\nAddress={ip}/{prefix}\nGateway={gateway}\n")
}

/// What owns a guest's network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Manager {
    Networkd,
    NetworkManager,
}

/// A Cloud Hypervisor clone's state right after the NIC swap, as spec
/// section 1 says: the new NIC has MAC B and a new name (`eth1`: probed
/// while the old one was still there), the parent's configuration matches
/// nothing (networkd: `unmanaged`; NetworkManager: no connection), and it
/// has no address (X went with the old NIC).
fn assert_swapped_and_broken(guest: &Guest, manager: Manager) -> Result<()> {
    let nic = guest.nic()?;
    ensure!(
        nic.mac == MAC_B && nic.name == "eth1",
        "the swapped NIC must be a new eth1 on MAC B: {nic:?}"
    );
    // Wait until the network manager has looked at the new NIC, then
    // require that nothing matched it.
    let state = support::wait_for(LINK_LIMIT, "settled link state", || {
        let state = match manager {
            Manager::Networkd => {
                let out =
                    guest.check(&["networkctl", "list", "--no-legend", "--no-pager", &nic.name])?;
                out.split_whitespace().nth(4).unwrap_or_default().to_owned()
            }
            // Not known to NetworkManager yet (a non-zero exit), or known
            // but not taken over from udev yet (`unmanaged`): settling.
            Manager::NetworkManager => {
                let out =
                    guest.run(&["nmcli", "-g", "GENERAL.STATE", "device", "show", &nic.name])?;
                let state = out.stdout_text().trim().to_owned();
                if !out.success() || state.contains("unmanaged") {
                    String::new()
                } else {
                    state
                }
            }
        };
        let settling = matches!(
            state.as_str(),
            "" | "pending" | "initialized" | "configuring"
        ) || state.contains("connecting")
            || state.contains("unavailable");
        Ok((!settling).then_some(state))
    })?;
    let unmatched = match manager {
        Manager::Networkd => state == "unmanaged",
        Manager::NetworkManager => state.contains("disconnected"),
    };
    ensure!(
        unmatched,
        "the parent's configuration must match nothing on the new NIC: {} is {state}",
        nic.name
    );
    let nic = guest.nic()?;
    ensure!(
        nic.ipv4.is_empty(),
        "the clone's new NIC must have no address: {nic:?}"
    );
    eprintln!("the new NIC is {} (MAC B, {state}, no address)", nic.name);
    Ok(())
}

/// The clone's state right after the swap, before the flow: from an
/// unprepared parent, swapped and broken ([`assert_swapped_and_broken`]);
/// from a prepared one only swapped (the parent's clone file matches the
/// new NIC at once, so it may be getting a lease already).
fn assert_swapped(guest: &Guest, manager: Manager, prepared: bool) -> Result<()> {
    if !prepared {
        return assert_swapped_and_broken(guest, manager);
    }
    let nic = guest.nic()?;
    ensure!(
        nic.mac == MAC_B && nic.name == "eth1",
        "the swapped NIC must be a new eth1 on MAC B: {nic:?}"
    );
    Ok(())
}

/// Start a lab from `parent_net`'s snapshot, prepared or not.
fn parent_of(
    lab: &mut Lab,
    parent_net: ParentNet,
    prepared: bool,
) -> Result<support::guest::Snapshot> {
    if prepared {
        lab.snapshot_prepared_parent(parent_net)
    } else {
        lab.snapshot_parent(parent_net)
    }
}

/// The lab's name for a scenario, prepared or not.
fn named(scenario: &str, prepared: bool) -> String {
    if prepared {
        format!("{scenario}-p")
    } else {
        scenario.to_owned()
    }
}

/// Cloud Hypervisor clone of an OCI image, static IP: the parent's
/// MAC-matched file matches nothing on the clone, which has no address
/// until the oci-networkd plan writes a file for MAC B with IP Y.
fn oci_networkd_static_side(who: Who, prepared: bool) -> Result<Side> {
    let mut lab = Lab::new(
        &who.lab(&named("oci-static", prepared)),
        "bookworm",
        Backend::CloudHypervisor,
    )?;
    let golden = lab.image.golden.clone();
    let parent = parent_of(&mut lab, ParentNet::Static, prepared)?;
    let rig = who.rig(&lab, HostConfig::default())?;
    let guest = lab.restore(&parent, "rootfs.qcow2")?;
    assert_swapped(&guest, Manager::Networkd, prepared)?;
    guest.read_file(&support::networkd_file(&golden.mac))?;

    let nic = lab.static_y();
    lab.write_inspect(&[(MAC_B, nic.clone())])?;
    let flow = match who {
        Who::Ours => {
            let (flow, summary, rig) = run_ours(&mut lab, rig)?;
            repaired_by(&summary, "oci-networkd", 6, Some(IP_Y))?;
            ensure!(summary.attempts == 1, "{summary:?}");
            ensure!(rig.annotation(keys::POST_CLONE_STATE).as_deref() == Some("done"));
            ensure!(rig.annotation(keys::IP).as_deref() == Some(IP_Y));
            ensure!(
                support::shim_execs(&lab.root).len() == 1,
                "one vm exec per attempt"
            );
            flow
        }
        Who::Upstream => fix_upstream(&mut lab, &nic, Flavour::Networkd)?,
    };
    let checks = lab.timed("checks", |lab| -> Result<()> {
        assert_reachable(lab, &guest, MAC_B, IP_Y, &[&parent.ip])?;
        let file = guest.read_file(&support::networkd_file(MAC_B))?;
        ensure!(
            file == static_file(MAC_B, IP_Y, golden.prefix, &golden.gateway),
            "{file:?}"
        );
        let listed = guest.check(&["ls", "/etc/systemd/network"])?;
        let mut left: Vec<&str> = listed.split_whitespace().collect();
        left.sort_unstable();
        let own = format!("10-{}.network", MAC_B.replace(':', ""));
        let mut want = vec![own.as_str()];
        if prepared {
            want.extend(["99-cocoon-clone-parent.network", "99-cocoon-clone.network"]);
        }
        ensure!(
            left == want,
            "the parent's file must be gone (its prepared files stay): {listed}"
        );
        // The clone file never wins over the NIC's own: Y alone.
        let nic = guest.nic()?;
        ensure!(nic.ipv4.len() == 1, "only IP Y on the NIC: {nic:?}");
        ensure!(guest.read_file("/etc/hostname")? == format!("{}\n", lab.vm_name));
        Ok(())
    });
    let checks = who.judge(&lab.scenario, checks)?;
    shutdown(&mut lab, guest)?;
    Ok(side(lab, who, flow, checks))
}

#[test]
#[ignore = "boots real Debian guests under QEMU (root, minutes): run `just e2e`, see docs/e2e.md"]
fn oci_networkd_static() -> Result<()> {
    let ours = oci_networkd_static_side(Who::Ours, false)?;
    let theirs = oci_networkd_static_side(Who::Upstream, false)?;
    compare(
        "oci_networkd_static",
        &ours,
        &theirs,
        Expect::upstream(true, true),
    )
}

/// The same from a prepared parent: still one exec, still IP Y alone.
#[test]
#[ignore = "boots real Debian guests under QEMU (root, minutes): run `just e2e`, see docs/e2e.md"]
fn oci_networkd_static_prepared() -> Result<()> {
    let ours = oci_networkd_static_side(Who::Ours, true)?;
    let theirs = oci_networkd_static_side(Who::Upstream, true)?;
    compare(
        "oci_networkd_static_prepared",
        &ours,
        &theirs,
        Expect::upstream(true, true),
    )
}

/// A clone whose NIC is on DHCP, restored from a parent that held a lease
/// on MAC A. The lab's dnsmasq (fresh: it never saw the parent) and the
/// bridge to the cocoon-net lease file run before the restore.
struct DhcpLab {
    dnsmasq: Dnsmasq,
    _bridge: LeaseBridge,
}

impl DhcpLab {
    fn start(lab: &Lab) -> Result<DhcpLab> {
        let dnsmasq = Dnsmasq::start(&lab.ns, BRIDGE, DHCP_RANGE, &lab.root)?;
        let bridge = LeaseBridge::start(dnsmasq.lease_file.clone(), lab.root.join("leases.json"));
        Ok(DhcpLab {
            dnsmasq,
            _bridge: bridge,
        })
    }

    /// dnsmasq leased an address to MAC B with client id `01:<MAC B>`
    /// (`ClientIdentifier=mac`) and never one to the parent's MAC; the
    /// address.
    fn lease_for_b(&self, parent_mac: &str) -> Result<String> {
        let leases = self.dnsmasq.leases();
        let lease = leases
            .iter()
            .find(|l| l.mac == MAC_B)
            .with_context(|| format!("no lease for {MAC_B}: {leases:?}"))?;
        ensure!(
            lease.client_id == format!("01:{MAC_B}"),
            "ClientIdentifier=mac: {lease:?}"
        );
        ensure!(
            !leases.iter().any(|l| l.mac == parent_mac),
            "no lease for the parent's MAC: {leases:?}"
        );
        Ok(lease.ip.to_string())
    }
}

/// Cloud Hypervisor clone with every NIC on DHCP: classification needs no
/// fixup (rule 7), but the parent's file matches nothing, so no lease
/// comes. The host's DHCP safety net runs oci-networkd's `dhcp-recovery`
/// plan; upstream waits and fails.
fn oci_networkd_dhcp_side(who: Who, prepared: bool) -> Result<Side> {
    let mut lab = Lab::new(
        &who.lab(&named("oci-dhcp", prepared)),
        "bookworm",
        Backend::CloudHypervisor,
    )?;
    let golden = lab.image.golden.clone();
    let parent = parent_of(&mut lab, ParentNet::Dhcp, prepared)?;
    let dhcp = DhcpLab::start(&lab)?;
    let rig = who.rig(&lab, HostConfig::default())?;
    // The record is written before the restore: the host starts as soon
    // as the clone can be worked on, and nothing of the harness's own
    // checks runs in between (restore to ready is what a pod sees).
    lab.write_inspect(&[(MAC_B, NicNet::Dhcp)])?;
    let guest = lab.restore(&parent, "rootfs.qcow2")?;
    // The parent's DHCP file is there, for MAC A.
    guest.read_file(&support::networkd_file(&golden.mac))?;
    if !prepared {
        assert_swapped_and_broken(&guest, Manager::Networkd)?;
        ensure!(
            dhcp.dnsmasq.leases().is_empty(),
            "{:?}",
            dhcp.dnsmasq.leases()
        );
    }
    let flow = match who {
        Who::Ours => {
            let (flow, summary, rig) = run_ours(&mut lab, rig)?;
            ensure!(
                summary.action == Handled::IpWait && summary.rule == 7 && summary.fixup.is_none(),
                "{summary:?}"
            );
            ensure!(summary.is_ready(), "{summary:?}");
            ensure!(
                rig.annotation(keys::IP) == summary.ip,
                "{:?}",
                rig.annotation(keys::IP)
            );
            // Unprepared, the recovery pass repairs the clone; prepared,
            // the clone gets its lease by itself: no exec at all.
            let recoveries = usize::from(!prepared);
            ensure!(
                rig.events(reasons::DHCP_RECOVERY).len() == recoveries,
                "{:?}",
                rig.pods.events()
            );
            ensure!(
                support::shim_execs(&lab.root).len() == recoveries,
                "{} execs",
                support::shim_execs(&lab.root).len()
            );
            flow
        }
        // Rule 7: upstream runs nothing and waits for a lease.
        Who::Upstream => run_upstream(&mut lab, None, (MAC_B, &NicNet::Dhcp))?,
    };
    let checks = lab.timed("checks", |lab| -> Result<()> {
        let ip = dhcp.lease_for_b(&golden.mac)?;
        published_is(&flow, &ip)?;
        assert_reachable(lab, &guest, MAC_B, &ip, &[&parent.ip])
    });
    let checks = who.judge(&lab.scenario, checks)?;
    shutdown(&mut lab, guest)?;
    Ok(side(lab, who, flow, checks))
}

#[test]
#[ignore = "boots real Debian guests under QEMU (root, minutes): run `just e2e`, see docs/e2e.md"]
fn oci_networkd_dhcp() -> Result<()> {
    let ours = oci_networkd_dhcp_side(Who::Ours, false)?;
    let theirs = oci_networkd_dhcp_side(Who::Upstream, false)?;
    compare(
        "oci_networkd_dhcp",
        &ours,
        &theirs,
        Expect::upstream(false, false),
    )
}

/// An all-DHCP clone of a prepared parent: the parent's clone file matches
/// the new NIC, so the clone gets its lease by itself, under a client id
/// from its own MAC: ready with no exec, for the host and upstream alike.
#[test]
#[ignore = "boots real Debian guests under QEMU (root, minutes): run `just e2e`, see docs/e2e.md"]
fn oci_networkd_dhcp_prepared() -> Result<()> {
    let ours = oci_networkd_dhcp_side(Who::Ours, true)?;
    let theirs = oci_networkd_dhcp_side(Who::Upstream, true)?;
    compare(
        "oci_networkd_dhcp_prepared",
        &ours,
        &theirs,
        Expect::upstream(true, true),
    )
}

/// Two clones of one DHCP parent restored side by side, both handled by
/// the host at once: each must end with a lease of its own, under a DHCP
/// client identity from its own MAC (`01:<mac>`), never the one the
/// parent's machine id, which every clone shares, would give. Unprepared,
/// the host's recovery pass gets them there (one exec each, after 15 s);
/// prepared, they get there by themselves (no exec).
///
/// A prepared clone has its lease within a second of the NIC swap, before
/// a host's flow would begin; so that both hosts wait for a lease at once,
/// the DHCP server of a prepared run comes up only after both flows began
/// (and neither could have ended: no lease existed). Until then the lease
/// file says `null`, as cocoon-net's does when its lease table is empty.
fn two_dhcp_clones(prepared: bool) -> Result<()> {
    use support::CloneSlot;
    let scenario = named("two-dhcp", prepared);
    let mut lab = Lab::new(&scenario, "bookworm", Backend::CloudHypervisor)?;
    let golden = lab.image.golden.clone();
    let parent = parent_of(&mut lab, ParentNet::Dhcp, prepared)?;
    let mut dhcp = if prepared {
        std::fs::write(lab.root.join("leases.json"), "null\n")?;
        None
    } else {
        Some(DhcpLab::start(&lab)?)
    };
    let slots = [CloneSlot::FIRST, CloneSlot::SECOND];
    let mut rigs = Vec::new();
    for slot in &slots {
        rigs.push(lab.host_as(slot, HostConfig::default())?);
        lab.write_inspect_as(slot, &[(slot.mac, NicNet::Dhcp)])?;
    }
    let first = lab.restore_as(&parent, "rootfs.qcow2", &slots[0])?;
    let second = lab.restore_as(&parent, "rootfs.qcow2", &slots[1])?;
    let started = Instant::now();
    let summaries = std::thread::scope(|scope| {
        let handles: Vec<_> = rigs
            .iter()
            .map(|rig| scope.spawn(move || rig.handle()))
            .collect();
        let late = match dhcp {
            Some(_) => Ok(()),
            None => {
                std::thread::sleep(Duration::from_millis(500));
                if handles.iter().any(|h| h.is_finished()) {
                    Err(anyhow::anyhow!(
                        "a host's flow ended before any DHCP server ran"
                    ))
                } else {
                    DhcpLab::start(&lab).map(|started| dhcp = Some(started))
                }
            }
        };
        let summaries = handles
            .into_iter()
            .map(|h| h.join().expect("the host's thread"))
            .collect::<Result<Vec<Summary>>>();
        late.and(summaries)
    })?;
    let took = started.elapsed();
    lab.record("both flows", took);
    let dhcp = dhcp.expect("the DHCP server started");
    for (slot, summary) in slots.iter().zip(&summaries) {
        ensure!(
            summary.is_ready() && summary.action == Handled::IpWait,
            "{}: {summary:?}",
            slot.mac
        );
    }
    let execs = support::shim_execs(&lab.root).len();
    ensure!(
        execs == if prepared { 0 } else { 2 },
        "{execs} execs (prepared: {prepared})"
    );
    let leases = dhcp.dnsmasq.leases();
    let mut ips = Vec::new();
    for (((slot, guest), summary), rig) in slots
        .iter()
        .zip([&first, &second])
        .zip(&summaries)
        .zip(&rigs)
    {
        let lease = leases
            .iter()
            .find(|l| l.mac == slot.mac)
            .with_context(|| format!("no lease for {}: {leases:?}", slot.mac))?;
        eprintln!(
            "e2e {scenario}: {} leased {} under client id {}",
            slot.mac, lease.ip, lease.client_id
        );
        ensure!(
            lease.client_id == format!("01:{}", slot.mac),
            "a client id from the clone's own MAC: {lease:?}"
        );
        // The host published the lease's IP (prepared, a lease that came
        // while it waited: the server was not up when the flow began).
        ensure!(
            summary.ip.as_deref() == Some(lease.ip.to_string().as_str())
                && rig.annotation(keys::IP) == summary.ip,
            "{}: the host published the lease's IP: {summary:?}, annotation {:?}",
            slot.mac,
            rig.annotation(keys::IP)
        );
        assert_reachable(&lab, guest, slot.mac, &lease.ip.to_string(), &[&parent.ip])?;
        ips.push(lease.ip);
    }
    ensure!(ips[0] != ips[1], "two clones, two leases: {leases:?}");
    ensure!(
        !leases.iter().any(|l| l.mac == golden.mac),
        "no lease for the parent's MAC: {leases:?}"
    );
    shutdown(&mut lab, first)?;
    shutdown(&mut lab, second)?;
    lab.finish();
    Ok(())
}

#[test]
#[ignore = "boots real Debian guests under QEMU (root, minutes): run `just e2e`, see docs/e2e.md"]
fn two_dhcp_clones_at_once() -> Result<()> {
    two_dhcp_clones(false)
}

#[test]
#[ignore = "boots real Debian guests under QEMU (root, minutes): run `just e2e`, see docs/e2e.md"]
fn two_dhcp_clones_at_once_prepared() -> Result<()> {
    two_dhcp_clones(true)
}

/// Firecracker clone: the NIC keeps the parent's MAC A (the saved device
/// state wins over the MAC B cocoon gave it), so the parent's file matches
/// and the clone holds the parent's address. The fc-mac plan sets the
/// MAC to B, and oci-networkd's file moves it to IP Y (or a lease).
fn fc_mac_side(who: Who, scenario: &str, dhcp: bool, prepared: bool) -> Result<Side> {
    let mut lab = Lab::new(
        &who.lab(&named(scenario, prepared)),
        "bookworm",
        Backend::Firecracker,
    )?;
    let golden = lab.image.golden.clone();
    let parent = parent_of(
        &mut lab,
        if dhcp {
            ParentNet::Dhcp
        } else {
            ParentNet::Static
        },
        prepared,
    )?;
    let leases = dhcp.then(|| DhcpLab::start(&lab)).transpose()?;
    let rig = who.rig(&lab, HostConfig::default())?;
    let guest = lab.restore(&parent, "rootfs.qcow2")?;
    let before = guest.nic()?;
    ensure!(
        before.name == "eth0" && before.mac == golden.mac && before.has(&parent.ip, golden.prefix),
        "the restored clone must keep the parent's MAC and address: {before:?}"
    );
    guest.read_file(&support::networkd_file(&golden.mac))?;

    let nic = if dhcp { NicNet::Dhcp } else { lab.static_y() };
    lab.write_inspect(&[(MAC_B, nic.clone())])?;
    let flow = match who {
        Who::Ours => {
            let (flow, summary, rig) = run_ours(&mut lab, rig)?;
            ensure!(
                rig.annotation(keys::IP) == summary.ip,
                "{:?}",
                rig.annotation(keys::IP)
            );
            repaired_by(&summary, "fc-mac", 5, (!dhcp).then_some(IP_Y))?;
            flow
        }
        Who::Upstream => fix_upstream(&mut lab, &nic, Flavour::Networkd)?,
    };
    let checks = lab.timed("checks", |lab| -> Result<()> {
        let ip = match &leases {
            Some(leases) => leases.lease_for_b(&golden.mac)?,
            None => IP_Y.to_owned(),
        };
        published_is(&flow, &ip)?;
        // The parent's address must go: the clone held it until now.
        assert_reachable(lab, &guest, MAC_B, &ip, &[&parent.ip])?;
        let file = guest.read_file(&support::networkd_file(MAC_B))?;
        if !dhcp {
            ensure!(
                file == static_file(MAC_B, IP_Y, golden.prefix, &golden.gateway),
                "{file:?}"
            );
        }
        Ok(())
    });
    let checks = who.judge(&lab.scenario, checks)?;
    shutdown(&mut lab, guest)?;
    Ok(side(lab, who, flow, checks))
}

#[test]
#[ignore = "boots real Debian guests under QEMU (root, minutes): run `just e2e`, see docs/e2e.md"]
fn fc_mac_static() -> Result<()> {
    let ours = fc_mac_side(Who::Ours, "fc-static", false, false)?;
    let theirs = fc_mac_side(Who::Upstream, "fc-static", false, false)?;
    compare(
        "fc_mac_static",
        &ours,
        &theirs,
        Expect::upstream(true, true),
    )
}

/// The same from a prepared parent: the frozen MAC still needs its fixup.
#[test]
#[ignore = "boots real Debian guests under QEMU (root, minutes): run `just e2e`, see docs/e2e.md"]
fn fc_mac_static_prepared() -> Result<()> {
    let ours = fc_mac_side(Who::Ours, "fc-static", false, true)?;
    let theirs = fc_mac_side(Who::Upstream, "fc-static", false, true)?;
    compare(
        "fc_mac_static_prepared",
        &ours,
        &theirs,
        Expect::upstream(true, true),
    )
}

#[test]
#[ignore = "boots real Debian guests under QEMU (root, minutes): run `just e2e`, see docs/e2e.md"]
fn fc_mac_dhcp() -> Result<()> {
    let ours = fc_mac_side(Who::Ours, "fc-dhcp", true, false)?;
    let theirs = fc_mac_side(Who::Upstream, "fc-dhcp", true, false)?;
    compare("fc_mac_dhcp", &ours, &theirs, Expect::upstream(true, true))
}

/// A cloud-image clone, restored from a parent that cloud-init configured
/// (its NoCloud seed: instance `iid-parent`, MAC A, X). After Cloud
/// Hypervisor's NIC swap the clone is the same instance on a new NIC:
/// cloud-init does not run again, its network (keyed to MAC A) matches
/// nothing, and the clone has no address. The seed medium is swapped for
/// the clone's identity (QMP `blockdev-change-medium`), as cocoon gives a
/// clone its own, then the flow re-runs cloud-init.
fn cloudimg_side(
    who: Who,
    scenario: &str,
    image: &str,
    has_configs: bool,
    prepared: bool,
) -> Result<Side> {
    let mut lab = Lab::new(
        &who.lab(&named(scenario, prepared)),
        image,
        Backend::CloudHypervisor,
    )?;
    let golden = lab.image.golden.clone();
    let parent = parent_of(&mut lab, ParentNet::Cloud, prepared)?;
    // `overlay.qcow2` in the VM's directory: the host's disk probe makes
    // this a cloud image.
    let rig = who.rig(&lab, HostConfig::default())?;
    let guest = lab.restore(&parent, "overlay.qcow2")?;
    let help = guest.check(&["cloud-init", "clean", "--help"])?;
    ensure!(
        help.contains("--configs") == has_configs,
        "image {image}: `cloud-init clean --configs` support should be {has_configs}"
    );
    let iid = guest.read_file("/var/lib/cloud/data/instance-id")?;
    ensure!(iid.trim() == "iid-parent", "{iid}");
    assert_swapped(&guest, Manager::Networkd, prepared)?;

    let clone_iid = format!("iid-{}", lab.vm_name);
    let clone_seed = clone_seed(&lab, &clone_iid)?;
    lab.timed("seed swap", |_| -> Result<()> {
        guest.qmp()?.change_medium("cd0", &clone_seed)
    })?;
    let nic = lab.static_y();
    lab.write_inspect(&[(MAC_B, nic.clone())])?;
    let flow = match who {
        Who::Ours => {
            let (flow, summary, _rig) = run_ours(&mut lab, rig)?;
            repaired_by(&summary, "cloudimg", 6, Some(IP_Y))?;
            flow
        }
        Who::Upstream => fix_upstream(&mut lab, &nic, Flavour::Cloudimg)?,
    };
    let checks = lab.timed("checks", |lab| -> Result<()> {
        let iid = guest.read_file("/var/lib/cloud/data/instance-id")?;
        ensure!(
            iid.trim() == clone_iid,
            "cloud-init did not take the clone's seed: {iid}"
        );
        let rendered = guest.check(&[
            "sh",
            "-c",
            "cat /etc/systemd/network/10-cloud-init-*.network",
        ])?;
        ensure!(
            rendered.contains(&format!("MACAddress={MAC_B}"))
                && rendered.contains(&format!("Address={IP_Y}/{}", golden.prefix)),
            "{rendered}"
        );
        assert_reachable(lab, &guest, MAC_B, IP_Y, &[&parent.ip])
    });
    let checks = who.judge(&lab.scenario, checks)?;
    shutdown(&mut lab, guest)?;
    Ok(side(lab, who, flow, checks))
}

/// The clone's NoCloud seed: its instance id, hostname, MAC B and IP Y.
fn clone_seed(lab: &Lab, instance_id: &str) -> Result<PathBuf> {
    let golden = &lab.image.golden;
    let vm_dir = lab.vm_dir();
    std::fs::create_dir_all(&vm_dir)?;
    seed::write(
        &vm_dir,
        "seed-clone",
        &seed::Identity {
            instance_id,
            hostname: &lab.vm_name,
            mac: MAC_B,
            ip: IP_Y,
            prefix: golden.prefix,
            gateway: &golden.gateway,
        },
    )
}

/// Debian 13, cloud-init 25.x (its `clean` has `--configs`).
#[test]
#[ignore = "boots real Debian guests under QEMU (root, minutes): run `just e2e`, see docs/e2e.md"]
fn cloudimg_trixie() -> Result<()> {
    let ours = cloudimg_side(Who::Ours, "ci-trixie", "trixie-cloud", true, false)?;
    let theirs = cloudimg_side(Who::Upstream, "ci-trixie", "trixie-cloud", true, false)?;
    compare(
        "cloudimg_trixie",
        &ours,
        &theirs,
        Expect::upstream(true, true),
    )
}

/// The same from a parent the cloudimg plugin prepared: still repaired by
/// cloud-init's re-run, and only IP Y on the NIC.
#[test]
#[ignore = "boots real Debian guests under QEMU (root, minutes): run `just e2e`, see docs/e2e.md"]
fn cloudimg_trixie_prepared() -> Result<()> {
    let ours = cloudimg_side(Who::Ours, "ci-trixie", "trixie-cloud", true, true)?;
    let theirs = cloudimg_side(Who::Upstream, "ci-trixie", "trixie-cloud", true, true)?;
    compare(
        "cloudimg_trixie_prepared",
        &ours,
        &theirs,
        Expect::upstream(true, true),
    )
}

/// Debian 12, cloud-init 22.4.x: `clean` has no `--configs`, so upstream's
/// first cloud-init line fails and skips the re-run, while its last line
/// succeeds: upstream reports success and the guest stays broken (spec
/// section 4).
#[test]
#[ignore = "boots real Debian guests under QEMU (root, minutes): run `just e2e`, see docs/e2e.md"]
fn cloudimg_bookworm() -> Result<()> {
    let ours = cloudimg_side(Who::Ours, "ci-bookworm", "bookworm-cloud", false, false)?;
    let theirs = cloudimg_side(Who::Upstream, "ci-bookworm", "bookworm-cloud", false, false)?;
    compare(
        "cloudimg_bookworm",
        &ours,
        &theirs,
        Expect::upstream(true, false),
    )
}

/// The same from a parent the cloudimg plugin prepared (Debian 12): the
/// host still repairs it, while upstream still breaks it as above.
#[test]
#[ignore = "boots real Debian guests under QEMU (root, minutes): run `just e2e`, see docs/e2e.md"]
fn cloudimg_bookworm_prepared() -> Result<()> {
    let ours = cloudimg_side(Who::Ours, "ci-bookworm", "bookworm-cloud", false, true)?;
    let theirs = cloudimg_side(Who::Upstream, "ci-bookworm", "bookworm-cloud", false, true)?;
    compare(
        "cloudimg_bookworm_prepared",
        &ours,
        &theirs,
        Expect::upstream(true, false),
    )
}

/// A plan that cannot succeed (the networkd directory is immutable) with a
/// short budget: the host ends Failed with a hint, and once the cause is
/// fixed the hint pasted into the guest repairs it. Upstream's script
/// fails in its middle lines, succeeds in its last, and reports ready.
fn exhausted_side(who: Who) -> Result<Side> {
    let mut lab = Lab::new(&who.lab("exhausted"), "bookworm", Backend::CloudHypervisor)?;
    let golden = lab.image.golden.clone();
    let parent = lab.snapshot_parent(ParentNet::Static)?;
    let config = HostConfig {
        retry: RetryConfig {
            interval: Duration::from_secs(1),
            budget: Duration::from_secs(10),
            exec_timeout: Duration::from_secs(60),
        },
        ..HostConfig::default()
    };
    let rig = who.rig(&lab, config)?;
    let guest = lab.restore(&parent, "rootfs.qcow2")?;
    assert_swapped_and_broken(&guest, Manager::Networkd)?;
    guest.check(&["chattr", "+i", "/etc/systemd/network"])?;

    let nic = lab.static_y();
    lab.write_inspect(&[(MAC_B, nic.clone())])?;
    let flow = match who {
        Who::Ours => {
            let (mut flow, summary, rig) = run_ours(&mut lab, rig)?;
            exhausted_as_specified(&lab, &guest, &summary, &rig)?;
            let hint = rig
                .annotation(keys::POST_CLONE_HINT)
                .context("no hint annotation")?;
            let script =
                String::from_utf8(base64::engine::general_purpose::STANDARD.decode(hint)?)?;
            lab.timed("repair with the hint", |_| -> Result<()> {
                guest.check(&["chattr", "-i", "/etc/systemd/network"])?;
                let pasted = guest.sh(&script)?;
                ensure!(
                    pasted.success(),
                    "the hint failed: {:?} {}",
                    pasted.code,
                    pasted.stderr_text()
                );
                Ok(())
            })?;
            // Repaired by the operator, not by the flow: the pod stays
            // Failed (spec section 7).
            flow.ready_after = None;
            flow
        }
        Who::Upstream => fix_upstream(&mut lab, &nic, Flavour::Networkd)?,
    };
    let checks = lab.timed("checks", |lab| -> Result<()> {
        assert_reachable(lab, &guest, MAC_B, IP_Y, &[&parent.ip])?;
        let file = guest.read_file(&support::networkd_file(MAC_B))?;
        ensure!(
            file == static_file(MAC_B, IP_Y, golden.prefix, &golden.gateway),
            "{file:?}"
        );
        Ok(())
    });
    let checks = who.judge(&lab.scenario, checks)?;
    shutdown(&mut lab, guest)?;
    Ok(side(lab, who, flow, checks))
}

/// The host's exhaustion, as spec section 5 says it must look.
fn exhausted_as_specified(lab: &Lab, guest: &Guest, summary: &Summary, rig: &Rig) -> Result<()> {
    ensure!(
        summary.fixup == Some(FixupEnd::Exhausted) && summary.readiness.is_none(),
        "{summary:?}"
    );
    ensure!(summary.attempts >= 2, "{summary:?}");
    eprintln!(
        "e2e {}: exhausted after {} attempts; first error: {}",
        lab.scenario, summary.attempts, summary.errors[0]
    );
    ensure!(rig.annotation(keys::POST_CLONE_STATE).as_deref() == Some("failed"));
    ensure!(rig.annotation(keys::LIFECYCLE_STATE).as_deref() == Some("failed"));
    let errors = rig
        .annotation(keys::POST_CLONE_ERRORS)
        .context("no errors annotation")?;
    ensure!(
        errors.starts_with("attempt 1: ") && errors.contains("Operation not permitted"),
        "the error names the step and carries the guest's stderr: {errors}"
    );
    ensure!(
        rig.events(reasons::EXEC_ATTEMPT_FAILED).len() == summary.attempts as usize
            && rig.events(reasons::EXEC_EXHAUSTED).len() == 1,
        "{:?}",
        rig.pods.events()
    );
    ensure!(
        !guest.nic()?.has(IP_Y, lab.image.golden.prefix),
        "not repaired yet"
    );
    Ok(())
}

/// The host's verdict is `failed`, with a hint that repairs the guest by
/// hand; upstream's is `ready` on a broken guest.
#[test]
#[ignore = "boots real Debian guests under QEMU (root, minutes): run `just e2e`, see docs/e2e.md"]
fn exhausted_budget_hint_repairs() -> Result<()> {
    let ours = exhausted_side(Who::Ours)?;
    let theirs = exhausted_side(Who::Upstream)?;
    ensure!(
        ours.verdict.starts_with("exhausted") && ours.repaired,
        "{ours:?}"
    );
    eprintln!(
        "e2e exhausted: the host's pod is failed with a hint (the hint then repaired it); upstream: {} on a guest that is {}",
        theirs.verdict,
        if theirs.repaired {
            "repaired"
        } else {
            "broken"
        }
    );
    compare(
        "exhausted_budget_hint_repairs",
        &ours,
        &theirs,
        Expect {
            ours_ready: false,
            ready: true,
            repaired: false,
        },
    )
}

/// The vendor example in a real guest: a Debian clone whose network
/// NetworkManager owns, restored from a parent that NetworkManager put on
/// MAC A with X (its keyfile for MAC A). After Cloud Hypervisor's NIC swap
/// the keyfile matches nothing. The pod's flavour is `networkmanager`, so
/// the host plans with `examples/plugins/nm-keyfile`, loaded from a plugin
/// directory like any vendor's file; upstream writes networkd files.
fn nm_keyfile_side(who: Who) -> Result<Side> {
    let mut lab = Lab::new(
        &who.lab("nm-keyfile"),
        "bookworm-nm",
        Backend::CloudHypervisor,
    )?;
    let golden = lab.image.golden.clone();
    let parent = lab.snapshot_parent(ParentNet::NetworkManager)?;
    // The vendor plugin, from a plugin directory, for the pod's flavour.
    let plugins = lab.root.join("plugins");
    std::fs::create_dir_all(&plugins)?;
    std::fs::copy(env!("PLUGIN_NM_KEYFILE"), plugins.join("nm-keyfile.wasm")).with_context(
        || {
            format!(
                "copying {} into {}",
                env!("PLUGIN_NM_KEYFILE"),
                plugins.display()
            )
        },
    )?;
    lab.plugin_dir = Some(plugins);
    lab.flavor = Some("networkmanager");
    let rig = who.rig(&lab, HostConfig::default())?;
    let guest = lab.restore(&parent, "rootfs.qcow2")?;
    assert_swapped_and_broken(&guest, Manager::NetworkManager)?;
    let parent_keyfile = keyfile_path(&golden.mac);
    guest.check(&["test", "-f", &parent_keyfile])?;
    ensure!(
        !guest
            .run(&["systemctl", "is-active", "--quiet", "systemd-networkd"])?
            .success(),
        "networkd must not run in a NetworkManager guest"
    );

    let nic = lab.static_y();
    lab.write_inspect(&[(MAC_B, nic.clone())])?;
    let flow = match who {
        Who::Ours => {
            let (flow, summary, rig) = run_ours(&mut lab, rig)?;
            repaired_by(&summary, "oci-networkd", 6, Some(IP_Y))?;
            ensure!(
                rig.events(reasons::SUCCEEDED).len() == 1,
                "{:?}",
                rig.pods.events()
            );
            // The plan was the vendor plugin's: keyfiles and nmcli, no
            // networkd file.
            let calls = support::shim_calls(&lab.root);
            ensure!(
                calls.iter().any(|c| c.starts_with("exec ")
                    && c.contains("nmcli")
                    && c.contains(".nmconnection")
                    && !c.contains("systemd-networkd")),
                "{calls:?}"
            );
            flow
        }
        Who::Upstream => fix_upstream(&mut lab, &nic, Flavour::Networkd)?,
    };
    // Both flows are judged on the guest's network: reachable on MAC B
    // with Y, and owned by NetworkManager (a connection on the NIC, and no
    // second network manager started beside it). The files are checked
    // for the host's flow only: they are its plugin's.
    let checks = lab.timed("checks", |lab| -> Result<()> {
        assert_reachable(lab, &guest, MAC_B, IP_Y, &[&parent.ip])?;
        let nic = guest.nic()?.name;
        let connection =
            guest.check(&["nmcli", "-g", "GENERAL.CONNECTION", "device", "show", &nic])?;
        ensure!(
            !connection.trim().is_empty(),
            "NetworkManager has no connection on {nic}"
        );
        ensure!(
            !guest
                .run(&["systemctl", "is-active", "--quiet", "systemd-networkd"])?
                .success(),
            "a second network manager runs"
        );
        if who == Who::Upstream {
            return Ok(());
        }
        ensure!(
            connection.trim() == format!("cocoon-{}", MAC_B.replace(':', "")),
            "{connection}"
        );
        let keyfile = guest.read_file(&keyfile_path(MAC_B))?;
        ensure!(
            keyfile.contains(&format!("mac-address={MAC_B}"))
                && keyfile.contains(&format!(
                    "address1={IP_Y}/{},{}",
                    golden.prefix, golden.gateway
                )),
            "{keyfile}"
        );
        ensure!(
            !guest.run(&["test", "-e", &parent_keyfile])?.success(),
            "the parent's keyfile must be gone"
        );
        Ok(())
    });
    let checks = match who.judge(&lab.scenario, checks)? {
        Err(why) => Err(nm_finding(&guest, &parent_keyfile, why)?),
        ok => ok,
    };
    shutdown(&mut lab, guest)?;
    Ok(side(lab, who, flow, checks))
}

/// What a flow that did not repair the NetworkManager guest left behind:
/// who runs the network now, and whether the parent's keyfile is still
/// there.
fn nm_finding(guest: &Guest, parent_keyfile: &str, why: String) -> Result<String> {
    let systemctl = |verb: &str| -> Result<String> {
        let out = guest.run(&["systemctl", verb, "systemd-networkd.service"])?;
        Ok(out.stdout_text().trim().to_owned())
    };
    let (active, enabled) = (systemctl("is-active")?, systemctl("is-enabled")?);
    let parent = guest.run(&["test", "-e", parent_keyfile])?.success();
    Ok(format!(
        "{why}: systemd-networkd is {active} ({enabled}) beside NetworkManager; the parent's keyfile is {}",
        if parent { "still there" } else { "gone" }
    ))
}

/// The keyfile nm-keyfile writes for `mac`.
fn keyfile_path(mac: &str) -> String {
    format!(
        "/etc/NetworkManager/system-connections/cocoon-{}.nmconnection",
        mac.replace(':', "")
    )
}

#[test]
#[ignore = "boots real Debian guests under QEMU (root, minutes): run `just e2e`, see docs/e2e.md"]
fn nm_keyfile() -> Result<()> {
    let ours = nm_keyfile_side(Who::Ours)?;
    let theirs = nm_keyfile_side(Who::Upstream)?;
    compare("nm_keyfile", &ours, &theirs, Expect::upstream(true, false))
}
