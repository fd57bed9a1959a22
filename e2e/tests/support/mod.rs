//! The harness: a [`Lab`] per scenario plays cocoon and the node around
//! one cloned guest, and builds the real host over it.
//!
//! - The stand-in cocoon root is `<cache>/runs/<scenario>/`; the VM lives
//!   in `run/<backend>/<vm id>/` below it (disk overlay, agent and QMP
//!   sockets, serial log, `inspect.json`), and is left there after the run
//!   for a post-mortem.
//! - The network is a namespace of the scenario's own with a bridge `br0`
//!   (the guest network's gateway) and two taps on it: `tap0`, where a
//!   clone's NIC starts, and `tap1`, where Cloud Hypervisor's NIC swap
//!   plugs the new one.
//! - The clone is restored from a parent snapshot made once per image and
//!   kind of parent ([`Lab::snapshot_parent`], [`Lab::restore`]).
//! - The host is `fixup_host::host::Host` with the real `Planner` and
//!   built-in plugins, the real `CocoonCli` pointed at
//!   `<root>/bin/cocoon` (a wrapper that runs `cocoon-shim --root <root>`),
//!   `MemoryPods` holding the pod, and a `LeaseWatcher` on
//!   `<root>/leases.json`.

#![allow(dead_code)]

pub mod guest;
pub mod images;
pub mod net;
pub mod seed;
pub mod upstream;

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fixup_core::decision::{Summary, Trigger};
use fixup_core::facts::PodInput;
use fixup_core::planner::{Planner, PlannerOptions};
use fixup_core::plugin::EngineOptions;
use fixup_e2e::state::{self, Backend, INSPECT_FILE};
use fixup_host::cocoon::CocoonCli;
use fixup_host::host::{Host, HostConfig};
use fixup_host::metrics::Metrics;
use fixup_host::pods::MemoryPods;
use fixup_host::ready::{DEFAULT_LEASE_POLL, LeaseWatcher};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use guest::{Guest, Snapshot, Spec};
use images::Image;
use net::Netns;

/// The bridge in each scenario's namespace: it holds the gateway address,
/// the guests' taps are its ports, dnsmasq serves on it.
pub const BRIDGE: &str = "br0";
/// The tap a guest's NIC starts on, inside its scenario's namespace.
pub const TAP: &str = "tap0";
/// The tap Cloud Hypervisor's NIC swap plugs the clone's new NIC into.
pub const TAP_NEW: &str = "tap1";
/// The clone's MAC ("MAC B"): what cocoon gave the clone's NIC.
pub const MAC_B: &str = "52:54:00:e2:e0:0b";
/// A second clone of the same parent, restored beside the first: its MAC
/// ("MAC C") and its two taps (where its NIC starts, where the swap plugs
/// the new one).
pub const MAC_C: &str = "52:54:00:e2:e0:0c";
pub const TAP_2: &str = "tap2";
pub const TAP_2_NEW: &str = "tap3";
/// The clone's static address ("IP Y"); the parent's ("IP X") and the
/// gateway come from the image (`image.json`).
pub const IP_Y: &str = "10.213.7.20";
/// dnsmasq's pool in the DHCP scenarios.
pub const DHCP_RANGE: &str = "10.213.7.100,10.213.7.199,255.255.255.0";
/// The pool of a DHCP parent's own dnsmasq: apart from the clones' pool,
/// so the parent's lease can never be the clone's by chance.
pub const PARENT_DHCP_RANGE: &str = "10.213.7.200,10.213.7.249,255.255.255.0";
/// The pod's namespace in `MemoryPods`.
pub const POD_NAMESPACE: &str = "e2e";
pub const POD_UID: &str = "5d0c7a10-e2e0-4c1e-9f00-000000000001";
/// A prepared parent's pod, uid and VM id, in its own cocoon root.
pub const PARENT_POD: &str = "e2e-parent";
pub const PARENT_UID: &str = "5d0c7a10-e2e0-4c1e-9f00-0000000000a0";
pub const PARENT_VM: &str = "vm-parent";
/// The annotation a prepared parent gets and its clones carry.
pub const PREPARED_KEY: &str = fixup_core::annotations::keys::PREPARED;

/// Boot to a responding guest agent: measured 13-45 s under TCG; the
/// bound leaves room for a machine busy compiling.
pub const BOOT_LIMIT: Duration = Duration::from_secs(300);
/// The guest's NIC settling on its new address after the host is done:
/// well under a second measured.
pub const LINK_LIMIT: Duration = Duration::from_secs(30);
/// Ping after a fixup: the first echo usually answers within a second.
pub const PING_LIMIT: Duration = Duration::from_secs(30);
/// Power-off through the agent: 2-3 s measured.
pub const SHUTDOWN_LIMIT: Duration = Duration::from_secs(60);

/// A NIC as cocoon reports it in `vm inspect --json`.
#[derive(Debug, Clone)]
pub enum NicNet {
    Static {
        ip: String,
        prefix: u8,
        gateway: String,
    },
    Dhcp,
}

/// What a parent snapshot was made from: the image's files (by inode,
/// size and modification time, so a rebuilt image never meets an old
/// snapshot), the accelerator, the QEMU version and [`SNAPSHOT_RECIPE`].
fn snapshot_stamp(image: &Image, parent: ParentNet) -> Result<String> {
    use std::os::unix::fs::MetadataExt as _;
    let mut stamp = String::new();
    for file in [image.rootfs(), image.kernel(), image.initrd()] {
        let meta =
            std::fs::metadata(&file).with_context(|| format!("image file {}", file.display()))?;
        stamp += &format!(
            "{} {} {} {}\n",
            file.display(),
            meta.ino(),
            meta.size(),
            meta.mtime()
        );
    }
    let qemu = std::process::Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .context("qemu-system-x86_64 --version")?;
    let version = String::from_utf8_lossy(&qemu.stdout);
    stamp += &format!(
        "parent {parent:?}\n{}\naccel {}\n{}\n{SNAPSHOT_RECIPE}\n",
        parent.setup(&image.golden),
        std::env::var("COCOON_FIXUP_E2E_ACCEL").unwrap_or_default(),
        version.lines().next().unwrap_or_default()
    );
    Ok(stamp)
}

/// Wait until a booting guest's agent answers and systemd has finished
/// starting (the agent starts early; the checks need networkd and, on
/// cloud images, cloud-init's first run to have finished): how long the
/// agent took.
fn wait_booted(scenario: &str, guest: &mut Guest) -> Result<Duration> {
    let agent = guest.wait_agent(BOOT_LIMIT)?;
    let state = guest.run(&["systemctl", "is-system-running", "--wait"])?;
    let state = state.stdout_text();
    let state = state.trim();
    if state != "running" {
        let failed = guest.run(&["systemctl", "--failed", "--no-legend", "--plain"])?;
        eprintln!(
            "e2e {scenario}: guest is {state}; failed units: {}",
            failed.stdout_text().trim()
        );
    }
    anyhow::ensure!(
        matches!(state, "running" | "degraded"),
        "the guest did not finish booting: {state}{}",
        guest.logs()
    );
    Ok(agent)
}

/// What the parent snapshots are made with: bump it when the QEMU command
/// line of `guest::Guest::boot` changes, since a clone must be started with
/// its parent's devices.
pub const SNAPSHOT_RECIPE: &str =
    "q35, virtio-net behind pcie-root-port rp1, rp2 free, tap0 on bridge br0; v2";

/// How the parent of a snapshot had its network configured when it was
/// saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParentNet {
    /// The image's own networkd file: MAC A with the static address X.
    Static,
    /// A networkd file for MAC A on DHCP (`ClientIdentifier=mac`), holding
    /// a lease from the parent's own dnsmasq.
    Dhcp,
    /// A cloud image: its NoCloud seed (`iid-parent`, MAC A, X) on a CD,
    /// and cloud-init's first boot done.
    Cloud,
    /// A NetworkManager image: its keyfile for MAC A with X.
    NetworkManager,
}

impl ParentNet {
    /// What the parent is configured with beyond the image, for the
    /// snapshot's stamp: a change makes a new parent.
    fn setup(self, golden: &images::Golden) -> String {
        match self {
            ParentNet::Dhcp => format!("{PARENT_DHCP_RANGE}\n{}", dhcp_file(&golden.mac)),
            ParentNet::Cloud => format!("{:?}", parent_identity(golden)),
            ParentNet::Static | ParentNet::NetworkManager => String::new(),
        }
    }

    /// A short name, for the namespace of a prepared parent (names are
    /// bounded).
    fn short_name(self) -> &'static str {
        match self {
            ParentNet::Static => "s-prep",
            ParentNet::Dhcp => "d-prep",
            ParentNet::Cloud => "c-prep",
            ParentNet::NetworkManager => "n-prep",
        }
    }

    fn dir_name(self) -> &'static str {
        match self {
            ParentNet::Static => "static",
            ParentNet::Dhcp => "dhcp",
            ParentNet::Cloud => "cloud",
            ParentNet::NetworkManager => "nm",
        }
    }
}

/// One scenario's world: image, namespace, stand-in cocoon root, timings.
#[derive(Debug)]
pub struct Lab {
    pub scenario: String,
    pub image: Image,
    pub root: PathBuf,
    pub ns: Netns,
    pub backend: Backend,
    pub vm_id: String,
    /// The pod's name; the VM's name is derived from it, as the stack does.
    pub pod_name: String,
    pub vm_name: String,
    /// Vendor plugins the host loads (`--plugin-dir`), if any.
    pub plugin_dir: Option<PathBuf>,
    /// The pod's `vm.cocoonstack.io/guest-flavor`, if any.
    pub flavor: Option<&'static str>,
    /// The pod's `vm.cocoonstack.io/prepared`: the clone's parent was
    /// prepared ([`Lab::snapshot_prepared_parent`]).
    pub prepared: Option<String>,
    started: Instant,
    /// How long the clone's restore took, from starting QEMU to a clone
    /// the host can work on (agent up, NIC swapped).
    restored_in: Option<Duration>,
    timings: Vec<(String, Duration)>,
}

impl Lab {
    /// Take the suite's locks, check prerequisites, reset
    /// `<cache>/runs/<scenario>`, create the namespace with its bridge and
    /// taps.
    pub fn new(scenario: &str, image: &str, backend: Backend) -> Result<Lab> {
        suite_locks(scenario)?;
        let image = images::require(image)?;
        let root = images::cache_dir().join("runs").join(scenario);
        if root.exists() {
            std::fs::remove_dir_all(&root)
                .with_context(|| format!("cannot clear {}", root.display()))?;
        }
        std::fs::create_dir_all(root.join("bin"))?;
        let ns = Netns::create(&format!("cfe2e-{scenario}"))?;
        let gateway = format!("{}/{}", image.golden.gateway, image.golden.prefix);
        ns.add_switch(BRIDGE, &gateway, &[TAP, TAP_NEW, TAP_2, TAP_2_NEW])?;
        eprintln!(
            "e2e {scenario}: image {} (Debian {}{}), state in {}",
            image.name,
            image.release,
            if image.cloud_init.is_empty() {
                String::new()
            } else {
                format!(", cloud-init {}", image.cloud_init)
            },
            root.display()
        );
        Ok(Lab {
            scenario: scenario.to_owned(),
            image,
            root,
            ns,
            backend,
            vm_id: format!("vm-{scenario}"),
            pod_name: format!("e2e-{scenario}"),
            vm_name: fixup_core::binding::vm_name_for_pod(
                POD_NAMESPACE,
                &format!("e2e-{scenario}"),
            ),
            plugin_dir: None,
            flavor: None,
            prepared: None,
            started: Instant::now(),
            restored_in: None,
            timings: Vec::new(),
        })
    }

    pub fn vm_dir(&self) -> PathBuf {
        state::vm_dir(&self.root, self.backend, &self.vm_id)
    }

    /// Record how long `f` took under `phase`.
    pub fn timed<T>(&mut self, phase: &'static str, f: impl FnOnce(&mut Self) -> T) -> T {
        let t = Instant::now();
        let out = f(self);
        self.timings.push((phase.to_owned(), t.elapsed()));
        out
    }

    pub fn record(&mut self, phase: &str, took: Duration) {
        self.timings.push((phase.to_owned(), took));
    }

    /// A guest of the image in `dir` on `disk` (an overlay), NIC on `mac`
    /// and `tap0`: a parent's boot, or with `restore` set, a clone's.
    fn spec(&self, dir: PathBuf, disk: &'static str, mac: &str) -> Spec<'_> {
        Spec {
            image: &self.image,
            dir,
            disk,
            mac: mac.to_owned(),
            tap: TAP,
            seed: None,
            restore: None,
        }
    }

    /// Boot the parent on the image's MAC A, configure its network as
    /// `net` says, let it settle, and save it for restores (spec section
    /// 1: a clone resumes from its parent's memory, not from a cold boot).
    ///
    /// The snapshot is cached per image and kind of parent
    /// (`<cache>/snapshots/<image>/<kind>/`) and shared by every scenario
    /// that restores it; it is made again when the image's files, the
    /// accelerator, QEMU, the parent's setup or [`SNAPSHOT_RECIPE`]
    /// change. The parent runs in a namespace of its own
    /// (`cfe2e-p-<image>-<kind>`, with its own dnsmasq for a DHCP parent),
    /// so no scenario's network remembers it.
    pub fn snapshot_parent(&mut self, net: ParentNet) -> Result<Snapshot> {
        self.snapshot_parent_as(net, false)
    }

    /// [`snapshot_parent`](Self::snapshot_parent), the parent prepared
    /// before it is saved, as vk-cocoon prepares a CocoonSet's parent: the
    /// host's real `prepare` over the running parent (twice, to show it is
    /// harmless), which must leave the parent serving its own address.
    /// The clones of the lab carry the annotation the preparation wrote
    /// ([`Lab::prepared`]).
    pub fn snapshot_prepared_parent(&mut self, net: ParentNet) -> Result<Snapshot> {
        let snapshot = self.snapshot_parent_as(net, true)?;
        self.prepared.clone_from(&snapshot.prepared);
        Ok(snapshot)
    }

    fn snapshot_parent_as(&mut self, net: ParentNet, prepared: bool) -> Result<Snapshot> {
        let snapshots = images::cache_dir().join("snapshots");
        let kind = if prepared {
            format!("{}-prepared", net.dir_name())
        } else {
            net.dir_name().to_owned()
        };
        let dir = snapshots.join(&self.image.name).join(&kind);
        let source_image = match net {
            ParentNet::Cloud => "https://cloud.debian.org/images/cloud/e2e.qcow2",
            _ => "ghcr.io/cocoonstack/e2e:bookworm",
        };
        // What the preparation runs is part of what the snapshot is made
        // from: a changed plan makes a new parent.
        let plan = if prepared {
            let rig = self.parent_rig(
                &dir_for_plan(&snapshots, &self.image.name, &kind)?,
                &format!("{}-{}-plan", self.image.name, net.short_name()),
                &self.image.golden,
                net == ParentNet::Dhcp,
                source_image,
            )?;
            format!(
                "{}\nbooted again after the preparation\n",
                rig.prepare_script()?
            )
        } else {
            String::new()
        };
        let stamp = dir.join("ready");
        std::fs::create_dir_all(&snapshots)?;
        // One run at a time makes or uses a snapshot.
        let lock_file = snapshots.join(format!("{}-{kind}.lock", self.image.name));
        let lock = std::fs::File::create(&lock_file)
            .with_context(|| format!("cannot create {}", lock_file.display()))?;
        lock.lock()?;
        let want = format!("{}{plan}", snapshot_stamp(&self.image, net)?);
        let seed_file = dir.join("seed-parent.iso");
        let mut snapshot = Snapshot {
            overlay: dir.join("parent.qcow2"),
            state: dir.join("state.mig"),
            seed: (net == ParentNet::Cloud).then(|| seed_file.clone()),
            ip: String::new(),
            prepared: None,
        };
        if std::fs::read_to_string(&stamp).is_ok_and(|s| s == want)
            && snapshot.overlay.exists()
            && snapshot.state.exists()
        {
            snapshot.ip = std::fs::read_to_string(dir.join("parent-ip"))
                .with_context(|| format!("the cached parent in {}", dir.display()))?;
            if prepared {
                snapshot.prepared = Some(
                    std::fs::read_to_string(dir.join("prepared"))
                        .with_context(|| format!("the cached parent in {}", dir.display()))?,
                );
            }
            if let Some(seed) = &snapshot.seed {
                anyhow::ensure!(
                    seed.is_file(),
                    "the cached parent's seed {} is missing",
                    seed.display()
                );
            }
            eprintln!(
                "e2e {}: restoring the cached parent snapshot in {}",
                self.scenario,
                dir.display()
            );
            return Ok(snapshot);
        }
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("cannot clear {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir)?;
        let golden = self.image.golden.clone();
        let ns = Netns::create(&format!(
            "cfe2e-p-{}-{}",
            self.image.name,
            if prepared {
                net.short_name()
            } else {
                net.dir_name()
            }
        ))?;
        ns.add_switch(
            BRIDGE,
            &format!("{}/{}", golden.gateway, golden.prefix),
            &[TAP, TAP_NEW],
        )?;
        let dnsmasq = match net {
            ParentNet::Dhcp => Some(net::Dnsmasq::start(&ns, BRIDGE, PARENT_DHCP_RANGE, &dir)?),
            _ => None,
        };
        if net == ParentNet::Cloud {
            seed::write(&dir, "seed-parent", &parent_identity(&golden))?;
        }
        let spec = Spec {
            seed: snapshot.seed.clone(),
            ..self.spec(dir.clone(), "parent.qcow2", &golden.mac)
        };
        let started = Instant::now();
        let mut guest = Guest::boot(&ns, &spec)?;
        wait_booted(&self.scenario, &mut guest)?;
        if net == ParentNet::Cloud {
            cloud_init_done(&guest)?;
        }
        let mut ip = golden.ip.clone();
        if net == ParentNet::Dhcp {
            // What the fixup writes for a DHCP NIC, for the parent's MAC.
            let wrote = guest.sh(&format!(
                "printf '%s' '{}' > {} && systemctl restart systemd-networkd",
                dhcp_file(&golden.mac),
                networkd_file(&golden.mac),
            ))?;
            anyhow::ensure!(
                wrote.success(),
                "the DHCP parent's file: {}",
                wrote.stderr_text()
            );
            let lease = wait_for(LINK_LIMIT, "the parent's DHCP lease", || {
                let link = guest.nic()?;
                let leased = link.ipv4.iter().find(|(a, _)| a.octets()[3] >= 200);
                Ok(leased
                    .filter(|_| !link.has(&golden.ip, golden.prefix))
                    .map(|(a, _)| a.to_string()))
            })?;
            ip = lease;
        }
        wait_for(LINK_LIMIT, "the parent's MAC A with its address", || {
            let link = guest.nic()?;
            Ok((link.mac == golden.mac && link.has(&ip, golden.prefix)).then_some(()))
        })?;
        self.timings
            .push(("parent boot".to_owned(), started.elapsed()));
        let mut written = None;
        if prepared {
            let preparing = Instant::now();
            let rig = self.parent_rig(
                &dir,
                &format!("{}-{}", self.image.name, net.short_name()),
                &golden,
                net == ParentNet::Dhcp,
                source_image,
            )?;
            for round in 1..=2 {
                let summary = rig.prepare()?;
                anyhow::ensure!(
                    summary.fixup == Some(fixup_core::decision::FixupEnd::Done)
                        && summary.prepared.is_some(),
                    "preparing the parent (round {round}): {summary:?}"
                );
                written = summary.prepared;
            }
            self.timings
                .push(("prepare (twice)".to_owned(), preparing.elapsed()));
            // A prepared parent still boots as it was: powered off and
            // booted again from its disk, the prepared files in place, it must
            // serve its own network (checked below). The snapshot is then
            // taken of the parent that booted prepared.
            let rebooting = Instant::now();
            guest.shutdown(SHUTDOWN_LIMIT)?;
            let again = Spec {
                seed: snapshot.seed.clone(),
                ..self.spec(dir.clone(), "parent.qcow2", &golden.mac)
            };
            guest = Guest::boot(&ns, &again)?;
            drop(again);
            wait_booted(&self.scenario, &mut guest)?;
            if net == ParentNet::Cloud {
                cloud_init_done(&guest)?;
            }
            self.timings.push((
                "the prepared parent's second boot".to_owned(),
                rebooting.elapsed(),
            ));
            // A prepared parent still serves its own network.
            wait_for(
                LINK_LIMIT,
                "the prepared parent keeps MAC A and its address",
                || {
                    let link = guest.nic()?;
                    Ok((link.mac == golden.mac && link.has(&ip, golden.prefix)).then_some(()))
                },
            )?;
            let renewed = guest.run(&["networkctl", "renew", "eth0"])?;
            anyhow::ensure!(
                renewed.success() || net != ParentNet::Dhcp,
                "the prepared parent renews its lease: {}",
                renewed.stderr_text()
            );
            wait_for(
                LINK_LIMIT,
                "the prepared parent's address after a renew",
                || {
                    let link = guest.nic()?;
                    Ok(link.has(&ip, golden.prefix).then_some(()))
                },
            )?;
            // Its NIC is configured by its own `10-` file (the image's, or
            // cloud-init's), never a prepared one, and networkd took every
            // line of the prepared files.
            let status = guest.check(&["networkctl", "status", "--no-pager", "eth0"])?;
            let file = status
                .lines()
                .find_map(|l| l.trim_start().strip_prefix("Network File:"))
                .map(str::trim)
                .unwrap_or_default();
            anyhow::ensure!(
                file.starts_with("/etc/systemd/network/10-"),
                "the prepared parent's NIC keeps its own file: {status}"
            );
            let journal = guest.check(&[
                "journalctl",
                "-b",
                "-u",
                "systemd-networkd",
                "--no-pager",
                "-o",
                "cat",
            ])?;
            anyhow::ensure!(
                journal.lines().any(|l| l.contains("eth0")),
                "networkd's journal of this boot tells of eth0: {journal}"
            );
            let rejected: Vec<&str> = journal
                .lines()
                .filter(|l| {
                    let l = l.to_lowercase();
                    l.contains("99-cocoon-clone") && (l.contains("ignor") || l.contains("invalid"))
                })
                .collect();
            anyhow::ensure!(
                rejected.is_empty(),
                "networkd ignored lines of the prepared files: {rejected:?}"
            );
        }
        let saving = Instant::now();
        let saved = guest.save(&snapshot.overlay, &snapshot.state, SHUTDOWN_LIMIT)?;
        self.timings.push(("save".to_owned(), saving.elapsed()));
        drop(dnsmasq);
        std::fs::write(dir.join("parent-ip"), &ip)?;
        if let Some(value) = &written {
            std::fs::write(dir.join("prepared"), value)?;
        }
        std::fs::write(&stamp, want)?;
        Ok(Snapshot {
            ip,
            seed: snapshot.seed,
            prepared: written,
            ..saved
        })
    }

    /// Restore a clone of `snapshot` as cocoon does right after a clone,
    /// and wait for its guest agent:
    ///
    /// - Firecracker: the NIC is presented with MAC B, which the saved
    ///   device state overrides (the guest keeps MAC A).
    /// - Cloud Hypervisor: while the restored clone is still paused, its
    ///   NIC is unplugged and a new one with MAC B is plugged on its own
    ///   tap; then it runs. The new NIC comes up as `eth1`.
    pub fn restore(&mut self, snapshot: &Snapshot, disk: &'static str) -> Result<Guest> {
        self.restore_as(snapshot, disk, &CloneSlot::FIRST)
    }

    /// [`restore`](Self::restore) for `clone`: the lab's own, or a second
    /// one beside it ([`CloneSlot::SECOND`]).
    pub fn restore_as(
        &mut self,
        snapshot: &Snapshot,
        disk: &'static str,
        clone: &CloneSlot,
    ) -> Result<Guest> {
        let golden_mac = self.image.golden.mac.clone();
        let firecracker = self.backend == Backend::Firecracker;
        let started = Instant::now();
        let spec = Spec {
            restore: Some(snapshot),
            seed: snapshot.seed.clone(),
            tap: clone.tap,
            ..self.spec(
                self.clone_dir(clone),
                disk,
                if firecracker { clone.mac } else { &golden_mac },
            )
        };
        let mut guest = Guest::boot(&self.ns, &spec)?;
        let (loaded, mut qmp) = guest.wait_restored(BOOT_LIMIT, |qmp| {
            if firecracker {
                Ok(())
            } else {
                qmp.swap_nic_paused(clone.tap_new, clone.mac)
            }
        })?;
        let running = Instant::now();
        guest.wait_agent(BOOT_LIMIT)?;
        self.timings
            .push(("restore (state loaded)".to_owned(), loaded));
        self.timings
            .push(("restore (agent up)".to_owned(), started.elapsed()));
        if !firecracker {
            qmp.finish_swap()?;
            drop(qmp);
            wait_for(LINK_LIMIT, "the new NIC with the clone's MAC alone", || {
                let nics = guest.nics()?;
                Ok((nics.len() == 1 && nics[0].mac == clone.mac).then_some(()))
            })?;
            self.timings
                .push(("hot-swap".to_owned(), running.elapsed()));
        }
        self.restored_in = Some(started.elapsed());
        // The clock resumes at the parent's save; set it, as a platform
        // does after a restore, so that logs and lease times are today's.
        let behind = guest.set_clock()?;
        eprintln!(
            "e2e {}: the clone's clock was {behind} s behind; set",
            self.scenario
        );
        Ok(guest)
    }

    /// "Restore to ready": the restore (QEMU start to a clone the host
    /// can work on) plus the flow's own time until it reported the IP.
    /// The harness's checks in between are not counted.
    pub fn restore_to_ready(&self, flow: Duration) -> Option<Duration> {
        self.restored_in.map(|r| r + flow)
    }

    /// The state directory of `clone`'s VM.
    pub fn clone_dir(&self, clone: &CloneSlot) -> PathBuf {
        state::vm_dir(&self.root, self.backend, &clone.vm_id(self))
    }

    /// What `cocoon vm inspect --json` prints for the clone.
    pub fn write_inspect(&self, nics: &[(&str, NicNet)]) -> Result<()> {
        self.write_inspect_as(&CloneSlot::FIRST, nics)
    }

    /// [`write_inspect`](Self::write_inspect) for `clone`.
    pub fn write_inspect_as(&self, clone: &CloneSlot, nics: &[(&str, NicNet)]) -> Result<()> {
        let nics: Vec<serde_json::Value> = nics
            .iter()
            .map(|(mac, net)| match net {
                NicNet::Static {
                    ip,
                    prefix,
                    gateway,
                } => json!({"mac": mac, "tap": TAP,
                    "network": {"ip": ip, "prefix": prefix, "gateway": gateway}}),
                NicNet::Dhcp => json!({"mac": mac, "tap": TAP}),
            })
            .collect();
        let inspect = json!({
            "id": clone.vm_id(self),
            "state": "running",
            "hypervisor": self.backend.annotation(),
            "config": {"name": clone.vm_name(self)},
            "network_configs": nics,
        });
        std::fs::create_dir_all(self.clone_dir(clone))?;
        std::fs::write(
            self.clone_dir(clone).join(INSPECT_FILE),
            serde_json::to_vec_pretty(&inspect)?,
        )?;
        Ok(())
    }

    /// The clone's static NIC: MAC B on IP Y in the image's subnet.
    pub fn static_y(&self) -> NicNet {
        NicNet::Static {
            ip: IP_Y.to_owned(),
            prefix: self.image.golden.prefix,
            gateway: self.image.golden.gateway.clone(),
        }
    }

    /// `<root>/bin/cocoon`: the stand-in `cocoon` CLI (a wrapper that runs
    /// `cocoon-shim --root <root>`).
    pub fn cocoon(&self) -> Result<PathBuf> {
        cocoon_wrapper(&self.root)
    }

    /// The host as the node daemon builds it, over this lab.
    pub fn host(&self, config: HostConfig) -> Result<Rig> {
        self.host_as(&CloneSlot::FIRST, config)
    }

    /// [`host`](Self::host) for `clone`'s pod.
    pub fn host_as(&self, clone: &CloneSlot, config: HostConfig) -> Result<Rig> {
        let mut pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": clone.pod_name(self),
                "namespace": POD_NAMESPACE,
                "uid": clone.uid,
                "annotations": {
                    "cocoonset.cocoonstack.io/managed": "true",
                    "cocoonset.cocoonstack.io/mode": "clone",
                    "cocoonset.cocoonstack.io/os": "linux",
                    "cocoonset.cocoonstack.io/generation": "1",
                    "vm.cocoonstack.io/name": clone.vm_name(self),
                    "vm.cocoonstack.io/id": clone.vm_id(self),
                    "vm.cocoonstack.io/backend": self.backend.annotation(),
                },
            },
            "spec": {"nodeName": "e2e-node"},
        });
        if let Some(flavor) = self.flavor {
            pod["metadata"]["annotations"]["vm.cocoonstack.io/guest-flavor"] = json!(flavor);
        }
        // A clone of a prepared parent carries the parent's annotation, as
        // the stack copies it onto the clones of a prepared snapshot.
        if let Some(prepared) = &self.prepared {
            pod["metadata"]["annotations"][PREPARED_KEY] = json!(prepared);
        }
        rig(&self.root, pod, self.plugin_dir.clone(), config)
    }

    /// The host over a running parent whose state directory is `dir`, as
    /// vk-cocoon builds it to prepare the parent before its snapshot: a
    /// cocoon root `dir/root` of its own whose VM [`PARENT_VM`] is `dir`,
    /// the parent's pod (managed, not a clone, the lab's guest flavour) in
    /// `MemoryPods`, and the VM's record as cocoon describes it: its one
    /// NIC on MAC A, static (the image's address X) unless `dhcp`.
    fn parent_rig(
        &self,
        dir: &Path,
        name: &str,
        golden: &images::Golden,
        dhcp: bool,
        source_image: &str,
    ) -> Result<Rig> {
        let mac = golden.mac.as_str();
        // The VM's directory is a real one (the host's disk probe refuses
        // a path through a link); only the agent's socket is linked to
        // the running parent's. The root is short (`<cache>/pr/<name>`):
        // a socket's path is bounded.
        let root = images::cache_dir().join("pr").join(name);
        if root.exists() {
            std::fs::remove_dir_all(&root)
                .with_context(|| format!("cannot clear {}", root.display()))?;
        }
        let vm = state::vm_dir(&root, Backend::CloudHypervisor, PARENT_VM);
        std::fs::create_dir_all(&vm)?;
        let socket = vm.join(state::QGA_SOCKET);
        if socket.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(dir.join(state::QGA_SOCKET), &socket)?;
        }
        std::fs::create_dir_all(root.join("bin"))?;
        let name = fixup_core::binding::vm_name_for_pod(POD_NAMESPACE, PARENT_POD);
        let inspect = json!({
            "id": PARENT_VM,
            "state": "running",
            "hypervisor": Backend::CloudHypervisor.annotation(),
            "config": {"name": name, "image": source_image},
            "network_configs": [if dhcp {
                json!({"mac": mac, "tap": TAP})
            } else {
                json!({"mac": mac, "tap": TAP, "network": {
                    "ip": golden.ip, "prefix": golden.prefix, "gateway": golden.gateway}})
            }],
        });
        std::fs::write(vm.join(INSPECT_FILE), serde_json::to_vec_pretty(&inspect)?)?;
        let mut pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": PARENT_POD,
                "namespace": POD_NAMESPACE,
                "uid": PARENT_UID,
                "annotations": {
                    "cocoonset.cocoonstack.io/managed": "true",
                    "cocoonset.cocoonstack.io/os": "linux",
                    "vm.cocoonstack.io/name": name,
                    "vm.cocoonstack.io/id": PARENT_VM,
                    "vm.cocoonstack.io/backend": Backend::CloudHypervisor.annotation(),
                    "vm.cocoonstack.io/lifecycle-state": "ready",
                },
            },
            "spec": {"nodeName": "e2e-node"},
        });
        if let Some(flavor) = self.flavor {
            pod["metadata"]["annotations"]["vm.cocoonstack.io/guest-flavor"] = json!(flavor);
        }
        let mut rig = rig(&root, pod, self.plugin_dir.clone(), HostConfig::default())?;
        rig.pod_name = PARENT_POD.to_owned();
        Ok(rig)
    }

    /// Print the timings (and append them to `<cache>/timings.log`); they
    /// are also returned, for the side-by-side report.
    pub fn finish(mut self) -> Vec<(String, Duration)> {
        self.timings
            .push(("total".to_owned(), self.started.elapsed()));
        let accel = std::env::var("COCOON_FIXUP_E2E_ACCEL").unwrap_or_else(|_| "tcg".into());
        let ping = if net::dhcp_ping_check() {
            ", dhcp ping check"
        } else {
            ""
        };
        let line = format!(
            "e2e {} ({}, {accel}{ping}): {}",
            self.scenario,
            self.image.name,
            self.timings
                .iter()
                .map(|(p, d)| format!("{p} {:.1}s", d.as_secs_f64()))
                .collect::<Vec<_>>()
                .join(", ")
        );
        eprintln!("{line}");
        if let Ok(mut log) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(images::cache_dir().join("timings.log"))
        {
            let now = jiff::Timestamp::now();
            let _ = writeln!(log, "{now} {line}");
        }
        self.timings
    }
}

/// One clone of a lab: its MAC and taps, and its pod and VM by suffix.
#[derive(Debug, Clone, Copy)]
pub struct CloneSlot {
    pub mac: &'static str,
    pub tap: &'static str,
    pub tap_new: &'static str,
    /// Appended to the lab's pod name and VM id ("" for the first).
    pub suffix: &'static str,
    pub uid: &'static str,
}

impl CloneSlot {
    /// The lab's own clone: MAC B on `tap0`, swapped onto `tap1`.
    pub const FIRST: CloneSlot = CloneSlot {
        mac: MAC_B,
        tap: TAP,
        tap_new: TAP_NEW,
        suffix: "",
        uid: POD_UID,
    };
    /// A second clone of the same parent beside it: MAC C on `tap2`,
    /// swapped onto `tap3`.
    pub const SECOND: CloneSlot = CloneSlot {
        mac: MAC_C,
        tap: TAP_2,
        tap_new: TAP_2_NEW,
        suffix: "-2",
        uid: "5d0c7a10-e2e0-4c1e-9f00-000000000002",
    };

    pub fn pod_name(&self, lab: &Lab) -> String {
        format!("{}{}", lab.pod_name, self.suffix)
    }

    pub fn vm_id(&self, lab: &Lab) -> String {
        format!("{}{}", lab.vm_id, self.suffix)
    }

    pub fn vm_name(&self, lab: &Lab) -> String {
        fixup_core::binding::vm_name_for_pod(POD_NAMESPACE, &self.pod_name(lab))
    }
}

/// The host over a lab, and the pod it handles.
#[derive(Debug)]
pub struct Rig {
    pub host: Host<CocoonCli, MemoryPods>,
    pub pods: MemoryPods,
    runtime: tokio::runtime::Runtime,
    pod_name: String,
}

impl Rig {
    /// `Host::handle` for the pod, as an event would trigger it.
    pub fn handle(&self) -> Result<Summary> {
        let shutdown = CancellationToken::new();
        Ok(self.runtime.block_on(self.host.handle(
            POD_NAMESPACE,
            &self.pod_name,
            Trigger::Event,
            &shutdown,
        ))?)
    }

    /// `Host::prepare` for the pod, as vk-cocoon calls it before a
    /// snapshot.
    pub fn prepare(&self) -> Result<Summary> {
        let shutdown = CancellationToken::new();
        Ok(self
            .runtime
            .block_on(self.host.prepare(POD_NAMESPACE, &self.pod_name, &shutdown))?)
    }

    /// The hint script of the pod's preparation plan (what runs in the
    /// guest), planned without running anything.
    pub fn prepare_script(&self) -> Result<String> {
        use fixup_core::planner::Preparation;
        use fixup_host::pods::PodApi as _;
        let pod = self
            .runtime
            .block_on(self.pods.get(POD_NAMESPACE, &self.pod_name))?
            .context("the parent's pod")?;
        let root = self.host.planner().cocoon_root().to_owned();
        let record = std::fs::read_to_string(
            state::vm_dir(&root, Backend::CloudHypervisor, PARENT_VM).join(INSPECT_FILE),
        )?;
        let record = fixup_core::facts::VmInspect::from_json(&record, "inspect.json")?;
        let obs = fixup_core::facts::Observation::new(&pod, &record, &Default::default());
        Ok(match self.host.planner().plan_prepare(&obs)? {
            Preparation::Plan { composed, .. } => composed.script,
            Preparation::Nothing { reason } => anyhow::bail!("nothing to prepare: {reason}"),
        })
    }

    pub fn annotation(&self, key: &str) -> Option<String> {
        self.pods
            .annotations(POD_NAMESPACE, &self.pod_name)
            .and_then(|a| a.get(key).cloned())
    }

    /// Messages of the events with `reason`, in order.
    pub fn events(&self, reason: &str) -> Vec<String> {
        self.pods
            .events()
            .into_iter()
            .filter(|(_, e)| e.reason == reason)
            .map(|(_, e)| e.message)
            .collect()
    }
}

/// The networkd file name the product writes for `mac`.
pub fn networkd_file(mac: &str) -> String {
    format!("/etc/systemd/network/10-{}.network", mac.replace(':', ""))
}

/// Lines of the shim's log: one per `cocoon` call the host made.
pub fn shim_calls(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join(state::SHIM_LOG))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Poll `probe` (every 250 ms, at most `within`) until it returns a value.
pub fn wait_for<T>(
    within: Duration,
    what: &str,
    mut probe: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let started = Instant::now();
    loop {
        if let Some(value) = probe()? {
            return Ok(value);
        }
        anyhow::ensure!(started.elapsed() < within, "no {what} within {within:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// cloud-init's boot stages finished without errors (`status --wait`:
/// 0 done, 2 done with warnings).
pub fn cloud_init_done(guest: &Guest) -> Result<()> {
    let status = guest.run(&["cloud-init", "status", "--wait", "--long"])?;
    anyhow::ensure!(
        matches!(status.code, Some(0 | 2)),
        "cloud-init failed in the guest (exit {:?}): {}",
        status.code,
        status.stdout_text()
    );
    Ok(())
}

/// One `vm exec` the host (or upstream's flow) made, from the shim's log.
#[derive(Debug, Clone)]
pub struct ShimExec {
    pub exit: String,
    pub took: Duration,
    /// When it ended, Unix milliseconds.
    pub ended_ms: u128,
}

/// The `vm exec` calls in the shim's log, in order.
pub fn shim_execs(root: &Path) -> Vec<ShimExec> {
    shim_calls(root)
        .iter()
        .filter(|l| l.starts_with("exec "))
        .filter_map(|line| {
            let (_, tail) = line.rsplit_once(" -> ")?;
            let (exit, rest) = tail.rsplit_once(" in ")?;
            let (took, at) = rest.split_once("s at ")?;
            Some(ShimExec {
                exit: exit.to_owned(),
                took: Duration::from_secs_f64(took.parse().ok()?),
                ended_ms: at.trim().parse().ok()?,
            })
        })
        .collect()
}

/// Now, in Unix milliseconds.
pub fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// The cloud parent's NoCloud identity: instance `iid-parent`, MAC A, X.
fn parent_identity(golden: &images::Golden) -> seed::Identity<'_> {
    seed::Identity {
        instance_id: "iid-parent",
        hostname: "e2e-parent",
        mac: &golden.mac,
        ip: &golden.ip,
        prefix: golden.prefix,
        gateway: &golden.gateway,
    }
}

/// The networkd file of a DHCP parent: what the fixup writes for a DHCP
/// NIC, for MAC A.
fn dhcp_file(mac: &str) -> String {
    format!("[Match]\nMACAddress={mac}\n\n[Network]\nDHCP=ipv4\n\n[DHCPv4]\nClientIdentifier=mac\n")
}

/// The suite's locks, taken by the first [`Lab`] and held until the test
/// process exits: `<cache>/.suite.lock` exclusively (another run of the
/// suite waits: scenarios share namespaces, run directories and parent
/// snapshots) and `<cache>/.build.lock` shared (`images.sh` takes it
/// exclusively while it builds, so no image or snapshot changes under a
/// run).
fn suite_locks(scenario: &str) -> Result<()> {
    static HELD: std::sync::Mutex<Option<[std::fs::File; 2]>> = std::sync::Mutex::new(None);
    let mut held = HELD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if held.is_none() {
        *held = Some(take_suite_locks(scenario)?);
    }
    Ok(())
}

fn take_suite_locks(scenario: &str) -> Result<[std::fs::File; 2]> {
    let cache = images::cache_dir();
    let open = |name: &str| -> Result<std::fs::File> {
        let path = cache.join(name);
        std::fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))
    };
    let suite = open(".suite.lock")?;
    if suite.try_lock().is_err() {
        eprintln!(
            "e2e {scenario}: another run of the suite holds {}; waiting",
            cache.join(".suite.lock").display()
        );
        suite.lock()?;
    }
    let build = open(".build.lock")?;
    if build.try_lock_shared().is_err() {
        eprintln!("e2e {scenario}: images.sh is building images; waiting");
        build.lock_shared()?;
    }
    Ok([suite, build])
}

/// `<root>/bin/cocoon`: the stand-in `cocoon` CLI (a wrapper that runs
/// `cocoon-shim --root <root>`).
fn cocoon_wrapper(root: &Path) -> Result<PathBuf> {
    let shim = root.join("bin").join("cocoon");
    if !shim.exists() {
        let mut script = std::fs::File::create(&shim)?;
        write!(
            script,
            "#!/bin/sh\nexec '{}' --root '{}' \"$@\"\n",
            env!("CARGO_BIN_EXE_cocoon-shim"),
            root.display()
        )?;
        drop(script);
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(shim)
}

/// The host as the node daemon builds it over the cocoon root `root`,
/// with `pod` in `MemoryPods`.
fn rig(
    root: &Path,
    pod: serde_json::Value,
    plugin_dir: Option<PathBuf>,
    config: HostConfig,
) -> Result<Rig> {
    let name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let pod = PodInput::from_json(&pod.to_string(), "e2e pod")?;
    let pods = MemoryPods::new();
    pods.insert(pod);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let _entered = runtime.enter();
    let options = PlannerOptions {
        cocoon_root: root.to_owned(),
        engine: EngineOptions {
            cache_dir: Some(images::cache_dir().join("plugin-cache")),
            cache_key: Some(images::cache_dir().join("plugin-cache.key")),
            ..EngineOptions::default()
        },
        plugin_dir,
        ..PlannerOptions::default()
    };
    let (planner, failures) = Planner::new(options)?;
    anyhow::ensure!(failures.is_empty(), "plugins failed to load: {failures:?}");
    let leases = LeaseWatcher::new(root.join("leases.json"), DEFAULT_LEASE_POLL)?;
    let host = Host::new(
        Arc::new(planner),
        CocoonCli::new(&cocoon_wrapper(root)?),
        pods.clone(),
        Arc::new(leases),
        config,
        Arc::new(Metrics::new()),
    );
    Ok(Rig {
        host,
        pods,
        runtime,
        pod_name: name,
    })
}

/// A directory to plan a parent's preparation in before its snapshot
/// directory is known to be kept: `<snapshots>/<image>/<kind>.plan`.
fn dir_for_plan(snapshots: &Path, image: &str, kind: &str) -> Result<PathBuf> {
    let dir = snapshots.join(image).join(format!("{kind}.plan"));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
