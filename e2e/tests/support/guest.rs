//! One guest under QEMU: a qcow2 overlay on a cached image, booted
//! directly from the image's kernel inside the test's network namespace,
//! with a virtio-net NIC on the namespace's tap, the guest agent on a
//! virtio-serial socket, QMP on a unix socket and the serial console in a
//! file. TCG by default; `COCOON_FIXUP_E2E_ACCEL=kvm` uses KVM where it is
//! real hardware virtualisation.

use std::io::{BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use fixup_e2e::qga::{Agent, GuestExit};
use fixup_e2e::state::{QEMU_LOG, QGA_SOCKET, QMP_SOCKET, SERIAL_LOG};
use serde_json::{Value, json};

use super::images::Image;
use super::net::{Netns, run};

/// A guest command run by the harness (not by the product) gets this long.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

/// What to boot.
#[derive(Debug)]
pub struct Spec<'a> {
    pub image: &'a Image,
    /// The VM's state directory (`state::vm_dir`).
    pub dir: PathBuf,
    /// The overlay's file name: `overlay.qcow2` makes the host's disk probe
    /// see a cloud image.
    pub disk: &'static str,
    /// The MAC of the guest's NIC as QEMU presents it.
    pub mac: String,
    pub tap: &'static str,
    /// A NoCloud seed ISO on a SCSI CD (`cd0`), if any.
    pub seed: Option<PathBuf>,
    /// A snapshot restore: the overlay is made on the parent's frozen
    /// overlay (not on the image), and QEMU loads the parent's saved state
    /// from this file (`-incoming`) instead of booting. The command line
    /// is the parent's but for the disk and the NIC's MAC.
    pub restore: Option<&'a Snapshot>,
}

/// A parent saved for restores: its overlay, frozen, and its state
/// (memory and devices, migrated to a file while it was paused).
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub overlay: PathBuf,
    pub state: PathBuf,
    /// The NoCloud seed the parent booted with: a clone starts with the
    /// parent's devices, so with this medium in its CD drive.
    pub seed: Option<PathBuf>,
    /// The parent's address on its NIC when it was saved (X, or its lease).
    pub ip: String,
    /// What the parent's preparation wrote to `vm.cocoonstack.io/prepared`
    /// (`None`: not prepared).
    pub prepared: Option<String>,
}

/// A running guest; killed on drop if still running.
#[derive(Debug)]
pub struct Guest {
    child: Child,
    dir: PathBuf,
}

/// A NIC as `ip -j addr show` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub name: String,
    pub mac: String,
    pub ipv4: Vec<(Ipv4Addr, u8)>,
}

impl Link {
    pub fn has(&self, ip: &str, prefix: u8) -> bool {
        self.ipv4
            .iter()
            .any(|(a, p)| a.to_string() == ip && *p == prefix)
    }
}

impl Guest {
    pub fn boot(ns: &Netns, spec: &Spec<'_>) -> Result<Guest> {
        std::fs::create_dir_all(&spec.dir)?;
        let disk = spec.dir.join(spec.disk);
        let sock = spec.dir.join(QGA_SOCKET);
        if sock.as_os_str().len() > 100 {
            bail!(
                "socket path {} is too long for a unix socket: set COCOON_FIXUP_E2E_CACHE to a shorter directory",
                sock.display()
            );
        }
        if !disk.exists() {
            let (backing, format) = match spec.restore {
                Some(snapshot) => (snapshot.overlay.clone(), "qcow2"),
                None => (spec.image.rootfs(), "raw"),
            };
            run(Command::new("qemu-img")
                .args(["create", "-q", "-f", "qcow2", "-F", format, "-b"])
                .arg(backing)
                .arg(&disk))?;
        }
        let accel = std::env::var("COCOON_FIXUP_E2E_ACCEL").unwrap_or_default();
        let (accel, cpu) = match accel.as_str() {
            "kvm" => ("kvm", "host"),
            "" | "tcg" => ("tcg,thread=multi", "max"),
            other => bail!("COCOON_FIXUP_E2E_ACCEL={other}: use `tcg` (default) or `kvm`"),
        };
        let log = std::fs::File::create(spec.dir.join(QEMU_LOG))?;
        let mut cmd = ns.command("qemu-system-x86_64");
        cmd.args([
            "-name",
            "cocoon-fixup-e2e",
            "-no-user-config",
            "-nodefaults",
        ])
        .args(["-display", "none", "-machine", "q35", "-accel", accel])
        .args(["-cpu", cpu, "-smp", "1", "-m", "1024"])
        .arg("-kernel")
        .arg(spec.image.kernel())
        .arg("-initrd")
        .arg(spec.image.initrd())
        .args([
            "-append",
            "root=/dev/vda rw console=ttyS0 net.ifnames=0 panic=-1",
            "-no-reboot",
        ])
        .arg("-drive")
        .arg(format!(
            "file={},if=none,id=disk0,format=qcow2,cache=unsafe,discard=unmap",
            disk.display()
        ))
        .args(["-device", "virtio-blk-pci,drive=disk0"])
        .args(["-device", "virtio-rng-pci"])
        .arg("-netdev")
        .arg(format!(
            "tap,id=net0,ifname={},script=no,downscript=no",
            spec.tap
        ));
        // The NIC (`nic0` on netdev `net0`) sits behind a PCIe root port
        // (`rp1`, with `rp2` free), so it can be hot-swapped: on q35 the
        // root bus cannot unplug. A parent and its clones must agree.
        cmd.args([
            "-device",
            "pcie-root-port,id=rp1,chassis=1,slot=1,bus=pcie.0,addr=0x10",
            "-device",
            "pcie-root-port,id=rp2,chassis=2,slot=2,bus=pcie.0,addr=0x11",
        ])
        .arg("-device")
        .arg(format!(
            "virtio-net-pci,netdev=net0,mac={},id=nic0,bus=rp1",
            spec.mac
        ));
        cmd.args(["-device", "virtio-serial-pci,id=vser0"])
            .arg("-chardev")
            .arg(format!(
                "socket,id=qga0,path={},server=on,wait=off",
                sock.display()
            ))
            .args([
                "-device",
                "virtserialport,bus=vser0.0,chardev=qga0,name=org.qemu.guest_agent.0",
            ])
            .arg("-qmp")
            .arg(format!(
                "unix:{},server=on,wait=off",
                spec.dir.join(QMP_SOCKET).display()
            ))
            .arg("-serial")
            .arg(format!("file:{}", spec.dir.join(SERIAL_LOG).display()));
        if let Some(snapshot) = spec.restore {
            cmd.arg("-incoming")
                .arg(format!("exec:cat {}", snapshot.state.display()));
        }
        if let Some(seed) = &spec.seed {
            cmd.args(["-device", "virtio-scsi-pci,id=scsi0"])
                .arg("-drive")
                .arg(format!(
                    "file={},if=none,id=seed0,media=cdrom,format=raw,readonly=on",
                    seed.display()
                ))
                .args(["-device", "scsi-cd,bus=scsi0.0,drive=seed0,id=cd0"]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("cannot start qemu-system-x86_64")?;
        Ok(Guest {
            child,
            dir: spec.dir.clone(),
        })
    }

    /// Wait for the guest agent to answer (the guest has booted far
    /// enough for the host to exec into it).
    pub fn wait_agent(&mut self, within: Duration) -> Result<Duration> {
        let started = Instant::now();
        let sock = self.dir.join(QGA_SOCKET);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("QEMU exited during boot ({status}): {}", self.logs());
            }
            let left = within.saturating_sub(started.elapsed());
            if left.is_zero() {
                bail!(
                    "the guest agent did not answer within {within:?}: {}",
                    self.logs()
                );
            }
            if Agent::connect(&sock, left.min(Duration::from_secs(3))).is_ok() {
                return Ok(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The guest's wall clock set to the host's; how many seconds it was
    /// behind (negative: ahead). The agent's `guest-set-time`, or `date -s`
    /// where the agent cannot: it also writes the hardware clock with
    /// `hwclock`, which a minimal Debian 13 system lacks.
    pub fn set_clock(&self) -> Result<i64> {
        let before = self.check(&["date", "+%s"])?;
        if self.agent()?.set_time(Duration::from_secs(30)).is_err() {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            self.check(&[
                "date",
                "-u",
                "-s",
                &format!("@{}.{:03}", now.as_secs(), now.subsec_millis()),
            ])?;
        }
        let was: i64 = before.trim().parse().context("guest `date +%s`")?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        Ok(i64::try_from(now).unwrap_or(i64::MAX) - was)
    }

    /// A connection to the guest agent; its failure keeps the
    /// `AgentError` (the checks tell a harness failure from a finding by
    /// it).
    fn agent(&self) -> Result<Agent> {
        Agent::connect(&self.dir.join(QGA_SOCKET), Duration::from_secs(30))
            .map_err(|e| anyhow::Error::new(e).context(self.logs()))
    }

    /// Run argv in the guest through the agent (the harness's own checks).
    pub fn run(&self, argv: &[&str]) -> Result<GuestExit> {
        let (program, args) = argv.split_first().expect("a program");
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        Ok(self.agent()?.exec(program, &args, COMMAND_TIMEOUT)?)
    }

    /// Run argv and require exit 0; stdout as text.
    pub fn check(&self, argv: &[&str]) -> Result<String> {
        let exit = self.run(argv)?;
        if !exit.success() {
            bail!(
                "guest command {argv:?} exited {:?}: {}",
                exit.code,
                exit.stderr_text().trim()
            );
        }
        Ok(exit.stdout_text())
    }

    pub fn sh(&self, script: &str) -> Result<GuestExit> {
        self.run(&["sh", "-c", script])
    }

    pub fn read_file(&self, path: &str) -> Result<String> {
        self.check(&["cat", path])
    }

    /// Every NIC of the guest but loopback (`ip -j addr show`), read from
    /// inside the guest.
    pub fn nics(&self) -> Result<Vec<Link>> {
        let json = self.check(&["ip", "-j", "addr", "show"])?;
        let parsed: Value = serde_json::from_str(&json).context("ip -j addr output")?;
        let links = parsed.as_array().into_iter().flatten();
        Ok(links
            .filter(|entry| entry["link_type"] != "loopback")
            .map(|entry| {
                let ipv4 = entry["addr_info"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|a| a["family"] == "inet")
                    .filter_map(|a| {
                        let ip = a["local"].as_str()?.parse().ok()?;
                        let prefix = u8::try_from(a["prefixlen"].as_u64()?).ok()?;
                        Some((ip, prefix))
                    })
                    .collect();
                Link {
                    name: entry["ifname"].as_str().unwrap_or_default().to_owned(),
                    mac: entry["address"].as_str().unwrap_or_default().to_owned(),
                    ipv4,
                }
            })
            .collect())
    }

    /// The guest's one NIC, whatever its name (after Cloud Hypervisor's
    /// swap the new NIC may be `eth1`).
    pub fn nic(&self) -> Result<Link> {
        let mut nics = self.nics()?;
        match nics.len() {
            1 => Ok(nics.remove(0)),
            _ => bail!("expected one NIC in the guest, found {nics:?}"),
        }
    }

    pub fn qmp(&self) -> Result<Qmp> {
        Qmp::connect(&self.dir.join(QMP_SOCKET))
    }

    /// Save the running guest for restores: pause it, migrate its state to
    /// `state`, and stop QEMU (the disk is flushed and inactive once the
    /// migration completes). Its overlay and the state file are then made
    /// read-only: every clone restores from them.
    pub fn save(mut self, overlay: &Path, state: &Path, within: Duration) -> Result<Snapshot> {
        let mut qmp = self.qmp()?;
        qmp.execute("stop", json!({}))?;
        // `exec:` works on every QEMU the suite meets (`file:` needs 8.2).
        qmp.execute(
            "migrate",
            json!({"uri": format!("exec:cat > {}", state.display())}),
        )?;
        let started = Instant::now();
        loop {
            let status = qmp.execute("query-migrate", json!({}))?;
            match status["status"].as_str().unwrap_or_default() {
                "completed" => break,
                "failed" | "cancelled" => bail!("saving the parent failed: {status}"),
                _ if started.elapsed() > within => {
                    bail!("saving the parent took over {within:?}: {status}")
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        let _ = qmp.execute("quit", json!({}));
        let quit = Instant::now();
        while self.child.try_wait()?.is_none() {
            if quit.elapsed() > within {
                bail!("QEMU did not quit after the save");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for file in [overlay, state] {
            let mut perms = std::fs::metadata(file)
                .with_context(|| format!("saved parent file {}", file.display()))?
                .permissions();
            perms.set_readonly(true);
            std::fs::set_permissions(file, perms)?;
        }
        Ok(Snapshot {
            overlay: overlay.to_owned(),
            state: state.to_owned(),
            seed: None,
            ip: String::new(),
            prepared: None,
        })
    }

    /// Wait until a restore has loaded the saved state, then let the guest
    /// run (the parent was saved paused, so the clone comes up paused).
    /// `before_run` sees the loaded, still paused guest: the place for a
    /// hot-swap. How long the load took, and the QMP connection (events
    /// after the resume arrive on it).
    pub fn wait_restored(
        &mut self,
        within: Duration,
        before_run: impl FnOnce(&mut Qmp) -> Result<()>,
    ) -> Result<(Duration, Qmp)> {
        let started = Instant::now();
        let sock = self.dir.join(QMP_SOCKET);
        let mut qmp = loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("QEMU exited during the restore ({status}): {}", self.logs());
            }
            match Qmp::connect(&sock) {
                Ok(qmp) => break qmp,
                Err(_) if started.elapsed() < within => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e.context(self.logs())),
            }
        };
        loop {
            let status = qmp.execute("query-status", json!({}))?;
            match status["status"].as_str().unwrap_or_default() {
                "inmigrate" | "postmigrate" if started.elapsed() < within => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                "paused" | "prelaunch" => break,
                "running" => break,
                other => bail!(
                    "the restore did not load within {within:?} (status {other}): {}",
                    self.logs()
                ),
            }
        }
        let loaded = started.elapsed();
        before_run(&mut qmp)?;
        qmp.execute("cont", json!({}))?;
        Ok((loaded, qmp))
    }

    /// Power the guest off through the agent and wait for QEMU to exit;
    /// kill it after `within`.
    pub fn shutdown(mut self, within: Duration) -> Result<Duration> {
        let started = Instant::now();
        if let Ok(mut agent) = self.agent() {
            let _ = agent.shutdown();
        }
        while started.elapsed() < within {
            if self.child.try_wait()?.is_some() {
                return Ok(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        bail!("the guest did not power off within {within:?}; QEMU was killed")
    }

    /// The tail of the serial console and QEMU's own log, for errors.
    pub fn logs(&self) -> String {
        format!(
            "\n--- serial console (last lines of {}) ---\n{}\n--- qemu log ---\n{}",
            self.dir.join(SERIAL_LOG).display(),
            tail(&self.dir.join(SERIAL_LOG), 40),
            tail(&self.dir.join(QEMU_LOG), 10)
        )
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A QMP connection, capabilities negotiated.
#[derive(Debug)]
pub struct Qmp {
    out: UnixStream,
    reader: BufReader<UnixStream>,
    /// Events that arrived while a command waited for its reply.
    events: Vec<Value>,
}

impl Qmp {
    fn connect(path: &Path) -> Result<Qmp> {
        let out = UnixStream::connect(path)
            .with_context(|| format!("cannot connect to QMP at {}", path.display()))?;
        out.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut qmp = Qmp {
            reader: BufReader::new(out.try_clone()?),
            out,
            events: Vec::new(),
        };
        let greeting = qmp.read()?;
        if greeting.get("QMP").is_none() {
            bail!("not a QMP greeting: {greeting}");
        }
        qmp.execute("qmp_capabilities", json!({}))?;
        Ok(qmp)
    }

    fn read(&mut self) -> Result<Value> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            bail!("QMP closed the connection");
        }
        Ok(serde_json::from_str(&line)?)
    }

    /// Run a command; events that arrive meanwhile are kept for
    /// [`Qmp::wait_event`].
    pub fn execute(&mut self, command: &str, arguments: Value) -> Result<Value> {
        let request = json!({"execute": command, "arguments": arguments});
        writeln!(self.out, "{request}")?;
        loop {
            let reply = self.read()?;
            if let Some(error) = reply.get("error") {
                bail!("QMP {command} failed: {error}");
            }
            if let Some(value) = reply.get("return") {
                return Ok(value.clone());
            }
            if reply.get("event").is_some() {
                self.events.push(reply);
            }
        }
    }

    /// Wait for the first event `name` that `matches` (skipping others),
    /// for at most `within`; events kept by [`Qmp::execute`] come first.
    pub fn wait_event(
        &mut self,
        name: &str,
        matches: impl Fn(&Value) -> bool,
        within: Duration,
    ) -> Result<Value> {
        let wanted = |event: &Value| event["event"] == name && matches(event);
        if let Some(i) = self.events.iter().position(wanted) {
            return Ok(self.events.remove(i));
        }
        let started = Instant::now();
        loop {
            let mut line = String::new();
            match self.reader.read_line(&mut line) {
                Ok(0) => bail!("QMP closed the connection while waiting for {name}"),
                Ok(_) => {
                    let event: Value = serde_json::from_str(&line)?;
                    if wanted(&event) {
                        return Ok(event);
                    }
                }
                // The read timeout: look at the clock and read again.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e.into()),
            }
            if started.elapsed() >= within {
                bail!("no {name} event within {within:?}");
            }
        }
    }

    /// Cloud Hypervisor's NIC swap on a restored clone that is still
    /// paused, as cocoon does it: the parent's NIC (`nic0`) is unplugged
    /// and a new one with `mac` on `tap` is plugged behind the free root
    /// port, both queued before the guest runs again. The guest sees the
    /// new NIC before the old one is gone, so it is named `eth1`.
    /// [`Qmp::finish_swap`] completes it once the guest runs.
    pub fn swap_nic_paused(&mut self, tap: &str, mac: &str) -> Result<()> {
        self.execute("device_del", json!({"id": "nic0"}))?;
        self.execute(
            "netdev_add",
            json!({"type": "tap", "id": "net1", "ifname": tap, "script": "no", "downscript": "no"}),
        )?;
        self.execute(
            "device_add",
            json!({"driver": "virtio-net-pci", "id": "nic1", "netdev": "net1", "mac": mac, "bus": "rp2"}),
        )?;
        Ok(())
    }

    /// The end of [`Qmp::swap_nic_paused`]: the unplug completes once the
    /// guest runs and acknowledges it; then the old backend goes.
    pub fn finish_swap(&mut self) -> Result<()> {
        // The NIC's own event (its backend child's comes first, without a
        // device id).
        self.wait_event(
            "DEVICE_DELETED",
            |event| event["data"]["device"] == "nic0",
            Duration::from_secs(60),
        )?;
        self.execute("netdev_del", json!({"id": "net0"}))?;
        Ok(())
    }

    /// Swap the medium of CD `device` (its qdev id) for `file`, forcing
    /// the tray open even if the guest locked it.
    pub fn change_medium(&mut self, device: &str, file: &Path) -> Result<()> {
        self.execute(
            "blockdev-change-medium",
            json!({"id": device, "filename": file, "format": "raw",
                   "read-only-mode": "read-only", "force": true}),
        )?;
        Ok(())
    }
}
