//! Readiness after the fixup (spec section 6): the guest's IP from the
//! cocoon-net lease file, and the probe Kubernetes PodReady needs.
//!
//! - [`lookup_lease`] is a pure function from the lease file's bytes, a MAC
//!   and a wall-clock "now" to the live lease's IPv4 address.
//! - [`LeaseWatcher`] waits for a lease to appear. There is one per process,
//!   shared through an `Arc` by every pod waiting for its IP. It watches the
//!   lease file's directory with `notify`, so a new lease is seen within
//!   milliseconds, and polls as a safety net (default every 200 ms,
//!   [`DEFAULT_LEASE_POLL`], spec section 6; the caller passes the interval).
//! - [`probe`] is the reachability check behind PodReady: a TCP connect to the
//!   probe port when one is set, otherwise one ICMP echo.
//!
//! Two clocks are involved, on purpose. Deadlines and poll intervals are
//! `tokio::time`, so tests run them paused. Lease expiry is wall-clock time
//! written by another process, so it is compared with a [`WallClock`] that
//! tests can replace.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use notify::event::ModifyKind;
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::watch;
use tokio::time::Instant;

use fixup_core::facts::MacAddr;
use fixup_core::lease::{Lease, live_ip};

/// Where cocoon-net keeps its DHCP leases unless configured otherwise.
pub use fixup_core::lease::DEFAULT_LEASE_FILE;

/// The safety-net poll of the lease file (spec section 6: "poll every
/// 200 ms"). The caller passes the interval to [`LeaseWatcher::new`]; with
/// file notifications working, a new lease is usually seen much sooner.
pub const DEFAULT_LEASE_POLL: Duration = Duration::from_millis(200);

/// Why the lease file or the watcher's settings are unusable.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The content is JSON of another shape, or not JSON at all. Single rows
    /// that are malformed are skipped instead: one bad row must not hide
    /// every other VM's lease.
    #[error(
        "lease file is not a JSON array of {{mac, ip, expiry}} rows; check what cocoon-net writes to its lease file (default {DEFAULT_LEASE_FILE})"
    )]
    NotAnArray(#[source] serde_json::Error),
    /// The configured path has no file name to watch for.
    #[error(
        "lease file path {} names no file; configure the path of the cocoon-net lease file itself (default {DEFAULT_LEASE_FILE})",
        path.display()
    )]
    NoFileName { path: PathBuf },
    /// A zero poll interval would spin.
    #[error(
        "lease file poll interval is zero; configure a positive interval (default {} ms)",
        DEFAULT_LEASE_POLL.as_millis()
    )]
    ZeroPoll,
}

/// Looks `mac` up in the lease file's content ([`fixup_core::lease`]:
/// expired and malformed rows are skipped, the latest expiry wins; empty
/// content and `null` hold no lease); other content that is not a JSON
/// array is an error.
pub fn lookup_lease(
    json: &[u8],
    mac: &MacAddr,
    now: SystemTime,
) -> Result<Option<Ipv4Addr>, LeaseError> {
    fixup_core::lease::lookup(json, mac, now).map_err(LeaseError::NotAnArray)
}

fn parse_leases(json: &[u8]) -> Result<Vec<Lease>, LeaseError> {
    fixup_core::lease::parse(json).map_err(LeaseError::NotAnArray)
}

/// Wall-clock "now" for lease expiry. [`LeaseWatcher::new`] uses
/// [`SystemTime::now`]; tests pass a fixed time to
/// [`LeaseWatcher::with_clock`].
pub type WallClock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// Waits for leases in the cocoon-net lease file.
///
/// The watcher watches the file's parent directory, not the file:
/// cocoon-net may replace the file by renaming a new one over it, which a
/// watch on the old inode would never report. Events are filtered by file
/// name and bump a `watch` channel that every waiter listens to. A missing
/// directory or file is not an error: the watch is attached when the
/// directory appears (checked at each poll), and waiters keep polling. When
/// no file watcher can be created at all (inotify limits), the watcher
/// degrades to polling with a warning.
///
/// Concurrent waiters share reads: a waiter that wakes reuses a read that
/// started after it woke, so a burst of events costs one read, not one per
/// waiter.
pub struct LeaseWatcher {
    path: PathBuf,
    dir: PathBuf,
    poll: Duration,
    clock: WallClock,
    /// A generation counter, bumped by file events.
    changes: watch::Sender<u64>,
    /// `None` when no file watcher could be created: polling only.
    watcher: Option<Mutex<RecommendedWatcher>>,
    /// Whether the directory watch is in place; cleared by the event handler
    /// when the directory itself goes away.
    attached: Arc<AtomicBool>,
    snapshot: tokio::sync::Mutex<Option<Snapshot>>,
}

/// The last read of the lease file, shared by waiters.
#[derive(Debug)]
struct Snapshot {
    /// When the read started: it reflects every change before this instant.
    read_at: Instant,
    leases: Vec<Lease>,
    problem: Option<Problem>,
}

/// Why the last read yielded nothing usable, kept to log a problem once
/// rather than at every poll.
#[derive(Debug)]
struct Problem {
    message: String,
    since: Instant,
    warned: bool,
}

enum FileState {
    Missing,
    Leases(Vec<Lease>),
    Unusable(String),
}

impl LeaseWatcher {
    /// Watches `path` (normally [`DEFAULT_LEASE_FILE`]), polling every
    /// `poll` (normally [`DEFAULT_LEASE_POLL`]). Lease expiry is judged by
    /// the system clock.
    pub fn new(path: PathBuf, poll: Duration) -> Result<Self, LeaseError> {
        Self::with_clock(path, poll, Arc::new(SystemTime::now))
    }

    /// Like [`LeaseWatcher::new`], with `clock` deciding which leases have
    /// expired.
    pub fn with_clock(path: PathBuf, poll: Duration, clock: WallClock) -> Result<Self, LeaseError> {
        Self::build(path, poll, clock, true)
    }

    fn build(
        path: PathBuf,
        poll: Duration,
        clock: WallClock,
        use_notify: bool,
    ) -> Result<Self, LeaseError> {
        if poll.is_zero() {
            return Err(LeaseError::ZeroPoll);
        }
        // `absolute` touches no file system; events carry absolute paths.
        let path = std::path::absolute(&path).unwrap_or(path);
        let Some(name) = path.file_name().map(ToOwned::to_owned) else {
            return Err(LeaseError::NoFileName { path });
        };
        let dir = path
            .parent()
            .map_or_else(|| PathBuf::from("/"), Path::to_path_buf);
        let (changes, _) = watch::channel(0u64);
        let attached = Arc::new(AtomicBool::new(false));

        let watcher = if use_notify {
            let bump = changes.clone();
            let lost = Arc::clone(&attached);
            let watched_dir = dir.clone();
            let handler = move |event: notify::Result<notify::Event>| match event {
                Ok(event) => {
                    let dir_gone = matches!(
                        event.kind,
                        EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
                    ) && event.paths.contains(&watched_dir);
                    if dir_gone {
                        lost.store(false, Ordering::Release);
                    }
                    let ours = event
                        .paths
                        .iter()
                        .any(|p| p.file_name() == Some(name.as_os_str()));
                    if dir_gone || ours || event.need_rescan() {
                        bump.send_modify(|generation| *generation += 1);
                    }
                }
                Err(e) => {
                    tracing::debug!("lease file watch reported an error: {e}; rereading");
                    bump.send_modify(|generation| *generation += 1);
                }
            };
            match notify::recommended_watcher(handler) {
                Ok(watcher) => Some(Mutex::new(watcher)),
                Err(e) => {
                    tracing::warn!(
                        "cannot watch {} for changes: {e}; polling it every {} ms instead, so new leases are seen later: raise fs.inotify.max_user_instances",
                        path.display(),
                        poll.as_millis()
                    );
                    None
                }
            }
        } else {
            None
        };

        let this = LeaseWatcher {
            path,
            dir,
            poll,
            clock,
            changes,
            watcher,
            attached,
            snapshot: tokio::sync::Mutex::new(None),
        };
        this.ensure_watching();
        Ok(this)
    }

    /// The lease file being watched.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether file events are arriving. False while the directory is
    /// missing, or when the watcher fell back to polling.
    pub fn is_watching(&self) -> bool {
        self.watcher.is_some() && self.attached.load(Ordering::Acquire)
    }

    /// Waits until a live lease for `mac` is in the file, and returns its
    /// address; `Ok(None)` once `deadline` has passed with no live lease
    /// for it, or no file (spec section 6: the caller's budget, 45 s by
    /// default). The file is checked at once, then on every file event and
    /// at least every poll interval, and once more at the deadline.
    ///
    /// Unreadable or malformed content counts as "no lease yet" while the
    /// wait goes on (it is logged once it lasts a poll interval): the file
    /// may be mid-rewrite, and the lease may still come. When it is still
    /// unusable at the deadline, or the last read is still running one
    /// poll interval after it, the answer is `Err(why)`: nobody can tell
    /// whether the VM has a lease, and that is the node's fault, not the
    /// pod's.
    pub async fn wait_for(
        &self,
        mac: &MacAddr,
        deadline: Instant,
    ) -> Result<Option<Ipv4Addr>, String> {
        // Subscribing before the first read means a change during the read
        // wakes the select below at once.
        let mut changes = self.changes.subscribe();
        loop {
            self.ensure_watching();
            // A read that hangs (a stuck mount) must not hold the waiter far
            // past its deadline: the last check gets one poll interval.
            match tokio::time::timeout_at(deadline + self.poll, self.current(mac)).await {
                Ok((Some(ip), _)) => return Ok(Some(ip)),
                Ok((None, _)) if Instant::now() < deadline => {}
                Ok((None, None)) => return Ok(None),
                Ok((None, Some(problem))) => {
                    return Err(format!("lease file {}: {problem}", self.path.display()));
                }
                Err(_) => {
                    let why = format!(
                        "reading lease file {} did not finish {} ms (the poll interval) after the IP wait's deadline; check the file system it is on",
                        self.path.display(),
                        self.poll.as_millis()
                    );
                    tracing::warn!("{why}");
                    return Err(why);
                }
            }
            tokio::select! {
                // `self` owns the sender, so this cannot fail while we wait.
                _ = changes.changed() => {}
                () = tokio::time::sleep(self.poll) => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// Tell the watcher that the lease file changed: every wait rereads
    /// it at once. For a writer of the file that knows (a stand-in for
    /// cocoon-net; the file watch tells the daemon by itself).
    pub fn changed(&self) {
        self.changes.send_modify(|generation| *generation += 1);
    }

    /// Attaches the directory watch if it is not in place (the directory
    /// appeared, or was replaced).
    fn ensure_watching(&self) {
        let Some(watcher) = &self.watcher else {
            return;
        };
        if self.attached.load(Ordering::Acquire) {
            return;
        }
        let mut watcher = watcher.lock().unwrap_or_else(PoisonError::into_inner);
        if self.attached.load(Ordering::Acquire) {
            return;
        }
        match watcher.watch(&self.dir, RecursiveMode::NonRecursive) {
            Ok(()) => {
                self.attached.store(true, Ordering::Release);
                tracing::debug!(dir = %self.dir.display(), "watching the lease directory");
            }
            Err(e) => tracing::debug!(
                dir = %self.dir.display(),
                "cannot watch the lease directory yet ({e}); polling every {} ms and retrying",
                self.poll.as_millis()
            ),
        }
    }

    /// The live lease for `mac` in a read of the file that started after
    /// this call, and the file's problem when it has been unusable for at
    /// least a poll interval.
    async fn current(&self, mac: &MacAddr) -> (Option<Ipv4Addr>, Option<String>) {
        let asked = Instant::now();
        let mut snapshot = self.snapshot.lock().await;
        let fresh = snapshot.as_ref().is_some_and(|s| s.read_at > asked);
        if !fresh {
            let read_at = Instant::now();
            let state = read_lease_file(&self.path).await;
            let previous = snapshot.take().and_then(|s| s.problem);
            *snapshot = Some(self.record(read_at, state, previous));
        }
        let Some(snapshot) = snapshot.as_ref() else {
            return (None, None);
        };
        let lasting = snapshot
            .problem
            .as_ref()
            .filter(|p| p.warned)
            .map(|p| p.message.clone());
        (live_ip(&snapshot.leases, mac, (self.clock)()), lasting)
    }

    /// Turns a read into a snapshot, logging a problem once it has lasted a
    /// poll interval (an in-place rewrite is briefly half-written; that is
    /// not worth a warning).
    fn record(&self, read_at: Instant, state: FileState, previous: Option<Problem>) -> Snapshot {
        let path = self.path.display();
        let (leases, message) = match state {
            FileState::Leases(leases) => (leases, None),
            FileState::Missing => (Vec::new(), None),
            FileState::Unusable(message) => (Vec::new(), Some(message)),
        };
        let problem = match (message, previous) {
            (None, Some(old)) => {
                if old.warned {
                    tracing::info!("lease file {path} is usable again");
                }
                None
            }
            (None, None) => None,
            (Some(message), Some(old)) if old.message == message => {
                let warned = old.warned || read_at.duration_since(old.since) >= self.poll;
                if warned && !old.warned {
                    tracing::warn!("lease file {path}: {message}");
                }
                Some(Problem {
                    message,
                    since: old.since,
                    warned,
                })
            }
            (Some(message), _) => {
                tracing::debug!("lease file {path}: {message}");
                Some(Problem {
                    message,
                    since: read_at,
                    warned: false,
                })
            }
        };
        Snapshot {
            read_at,
            leases,
            problem,
        }
    }
}

impl fmt::Debug for LeaseWatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseWatcher")
            .field("path", &self.path)
            .field("poll", &self.poll)
            .field("watching", &self.is_watching())
            .finish_non_exhaustive()
    }
}

async fn read_lease_file(path: &Path) -> FileState {
    use fixup_core::lease::{FileRead, read_file};
    let owned = path.to_owned();
    let read = tokio::task::spawn_blocking(move || read_file(&owned))
        .await
        .unwrap_or_else(|e| FileRead::Unusable(format!("cannot read it: {e}")));
    match read {
        FileRead::Missing => FileState::Missing,
        FileRead::Bytes(bytes) => match parse_leases(&bytes) {
            Ok(leases) => FileState::Leases(leases),
            Err(e) => FileState::Unusable(error_chain(&e)),
        },
        FileRead::Unusable(message) => FileState::Unusable(message),
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    use std::fmt::Write as _;
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(text, " (cause: {cause})");
        source = cause.source();
    }
    text
}

/// What [`probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The TCP connect to the probe port succeeded.
    TcpConnected,
    /// The guest answered one ICMP echo.
    IcmpReply,
    /// The probe ran and failed; the text says how and what to check.
    Unreachable(String),
    /// The host may not send ICMP (no unprivileged ping sockets, no
    /// `CAP_NET_RAW`), so only the IP is known. Whether that is enough for
    /// PodReady is the embedder's decision.
    IpResolvedOnly,
}

impl ProbeOutcome {
    /// True when the guest answered: the probe PodReady needs (spec
    /// section 6). [`ProbeOutcome::IpResolvedOnly`] is not an answer.
    pub fn answered(&self) -> bool {
        matches!(self, ProbeOutcome::TcpConnected | ProbeOutcome::IcmpReply)
    }
}

/// Checks that the guest at `ip` answers: a TCP connect to `port` when one
/// is given (annotation `vm.cocoonstack.io/probe-port`), otherwise one ICMP
/// echo. The whole probe is bounded by `timeout`, which the caller passes
/// from its configuration. Nothing is retried here: the caller decides when
/// to probe again.
pub async fn probe(ip: Ipv4Addr, port: Option<u16>, timeout: Duration) -> ProbeOutcome {
    match port {
        Some(port) => tcp_probe(ip, port, timeout).await,
        None => icmp_probe(ip, timeout).await,
    }
}

async fn tcp_probe(ip: Ipv4Addr, port: u16, timeout: Duration) -> ProbeOutcome {
    let target = SocketAddrV4::new(ip, port);
    match tokio::time::timeout(timeout, TcpStream::connect(target)).await {
        Ok(Ok(_stream)) => ProbeOutcome::TcpConnected,
        Ok(Err(e)) => ProbeOutcome::Unreachable(format!(
            "tcp connect to {target}: {e}; check that the guest listens on port {port} (annotation vm.cocoonstack.io/probe-port)"
        )),
        Err(_) => ProbeOutcome::Unreachable(format!(
            "tcp connect to {target}: no answer within {}; check the guest's firewall and that it listens on port {port} (annotation vm.cocoonstack.io/probe-port)",
            fixup_core::annotations::messages::span(timeout)
        )),
    }
}

/// Sequence numbers for echo requests, so concurrent probes in this process
/// never take each other's replies.
static ICMP_SEQUENCE: AtomicU16 = AtomicU16::new(1);

/// Whether the "no ICMP privilege" warning was logged: it is a property of
/// the host, worth saying once, not once per pod.
static ICMP_DENIED_WARNED: AtomicBool = AtomicBool::new(false);

/// Marks our echo requests; a reply must echo it back.
const ICMP_PAYLOAD: &[u8] = b"cocoon-fixup probe";

const ICMP_ECHO_REQUEST: u8 = 8;
const ICMP_ECHO_REPLY: u8 = 0;

/// The kind of ICMP socket the host allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IcmpSocket {
    /// An unprivileged ping socket (`net.ipv4.ping_group_range`): the kernel
    /// owns the echo identifier and delivers only replies to it; reads hold
    /// the ICMP message alone.
    Datagram,
    /// A raw socket (`CAP_NET_RAW`): reads hold the IPv4 header too, and see
    /// every ICMP message from the peer.
    Raw,
}

async fn icmp_probe(ip: Ipv4Addr, timeout: Duration) -> ProbeOutcome {
    let (socket, kind) = match open_icmp_socket() {
        Ok(opened) => opened,
        Err(why) => {
            if !ICMP_DENIED_WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "cannot send ICMP echo ({why}); readiness probes without a probe port only resolve the IP: allow ping sockets with `sysctl net.ipv4.ping_group_range` or grant CAP_NET_RAW"
                );
            }
            return ProbeOutcome::IpResolvedOnly;
        }
    };
    let id = std::process::id() as u16;
    let sequence = ICMP_SEQUENCE.fetch_add(1, Ordering::Relaxed);
    let request = echo_request(id, sequence, ICMP_PAYLOAD);
    let exchange = async {
        socket.set_nonblocking(true)?;
        socket.connect(&SockAddr::from(SocketAddrV4::new(ip, 0)))?;
        // Tokio's datagram socket only issues send(2) and recv(2) on its
        // descriptor, which is what an ICMP socket needs; it never looks at
        // the protocol. This registers the socket with the reactor without
        // `unsafe` (the crate denies it).
        let socket = UdpSocket::from_std(std::net::UdpSocket::from(socket))?;
        socket.send(&request).await?;
        let mut buffer = [0u8; 1500];
        loop {
            let length = socket.recv(&mut buffer).await?;
            if is_echo_reply(&buffer[..length], kind, ip, id, sequence, ICMP_PAYLOAD) {
                return io::Result::Ok(());
            }
        }
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(())) => ProbeOutcome::IcmpReply,
        Ok(Err(e)) => ProbeOutcome::Unreachable(format!(
            "ICMP echo to {ip}: {e}; check the route to the guest, or set a probe port (annotation vm.cocoonstack.io/probe-port)"
        )),
        Err(_) => ProbeOutcome::Unreachable(format!(
            "no ICMP echo reply from {ip} within {}; check that the guest answers ping, or set a probe port (annotation vm.cocoonstack.io/probe-port)",
            fixup_core::annotations::messages::span(timeout)
        )),
    }
}

/// An unprivileged ping socket when the host allows one, else a raw socket.
fn open_icmp_socket() -> Result<(Socket, IcmpSocket), String> {
    let datagram = match Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::ICMPV4)) {
        Ok(socket) => return Ok((socket, IcmpSocket::Datagram)),
        Err(e) => e,
    };
    match Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4)) {
        Ok(socket) => Ok((socket, IcmpSocket::Raw)),
        Err(raw) => Err(format!("ping socket: {datagram}; raw socket: {raw}")),
    }
}

/// An ICMP echo request: type 8, code 0, checksum, identifier, sequence,
/// payload (RFC 792).
fn echo_request(id: u16, sequence: u16, payload: &[u8]) -> Vec<u8> {
    let mut packet = Vec::with_capacity(8 + payload.len());
    packet.extend_from_slice(&[ICMP_ECHO_REQUEST, 0, 0, 0]);
    packet.extend_from_slice(&id.to_be_bytes());
    packet.extend_from_slice(&sequence.to_be_bytes());
    packet.extend_from_slice(payload);
    let checksum = internet_checksum(&packet);
    packet[2..4].copy_from_slice(&checksum.to_be_bytes());
    packet
}

/// The RFC 1071 checksum: the ones' complement of the ones' complement sum
/// of 16-bit big-endian words, an odd last byte padded with zero.
fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|pair| {
            u32::from(u16::from_be_bytes([
                pair[0],
                pair.get(1).copied().unwrap_or(0),
            ]))
        })
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Whether `packet`, as read from a socket of `kind`, is the reply to our
/// request. A ping socket's identifier belongs to the kernel, which already
/// routed the reply to us by it; a raw socket sees all ICMP, so there the
/// sender and identifier are checked too.
fn is_echo_reply(
    packet: &[u8],
    kind: IcmpSocket,
    from: Ipv4Addr,
    id: u16,
    sequence: u16,
    payload: &[u8],
) -> bool {
    let icmp = match kind {
        IcmpSocket::Datagram => packet,
        IcmpSocket::Raw => {
            let Some(&first) = packet.first() else {
                return false;
            };
            let header = usize::from(first & 0x0f) * 4;
            if first >> 4 != 4
                || header < 20
                || packet.len() < header
                || packet[9] != 1
                || packet[12..16] != from.octets()
            {
                return false;
            }
            &packet[header..]
        }
    };
    icmp.len() >= 8
        && icmp[0] == ICMP_ECHO_REPLY
        && icmp[1] == 0
        && (kind == IcmpSocket::Datagram || icmp[4..6] == id.to_be_bytes())
        && icmp[6..8] == sequence.to_be_bytes()
        && &icmp[8..] == payload
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use std::fs;
    use std::time::UNIX_EPOCH;

    const MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0xab, 0xcd, 0xef]);
    const OTHER: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x00, 0x00, 0x01]);

    /// 2025-06-01T00:00:00Z: the fixed "now" of these tests.
    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_748_736_000)
    }

    fn ip(text: &str) -> Ipv4Addr {
        text.parse().unwrap()
    }

    #[rstest]
    #[case::lower_case(
        r#"[{"mac":"52:54:00:ab:cd:ef","ip":"10.0.0.5","expiry":"2025-06-01T01:00:00Z"}]"#,
        Some("10.0.0.5")
    )]
    #[case::upper_case(
        r#"[{"mac":"52:54:00:AB:CD:EF","ip":"10.0.0.5","expiry":"2025-06-01T01:00:00Z"}]"#,
        Some("10.0.0.5")
    )]
    #[case::offset_expiry(
        r#"[{"mac":"52:54:00:ab:cd:ef","ip":"10.0.0.5","expiry":"2025-06-01T02:00:00+01:00"}]"#,
        Some("10.0.0.5")
    )]
    #[case::other_mac(
        r#"[{"mac":"52:54:00:00:00:01","ip":"10.0.0.9","expiry":"2025-06-01T01:00:00Z"}]"#,
        None
    )]
    #[case::expired(
        r#"[{"mac":"52:54:00:ab:cd:ef","ip":"10.0.0.5","expiry":"2025-05-31T23:59:59Z"}]"#,
        None
    )]
    #[case::expires_exactly_now(
        r#"[{"mac":"52:54:00:ab:cd:ef","ip":"10.0.0.5","expiry":"2025-06-01T00:00:00Z"}]"#,
        None
    )]
    #[case::expired_and_live(
        r#"[{"mac":"52:54:00:ab:cd:ef","ip":"10.0.0.4","expiry":"2025-05-01T00:00:00Z"},
            {"mac":"52:54:00:ab:cd:ef","ip":"10.0.0.5","expiry":"2025-06-01T00:00:01Z"}]"#,
        Some("10.0.0.5")
    )]
    #[case::latest_expiry_wins(
        r#"[{"mac":"52:54:00:ab:cd:ef","ip":"10.0.0.7","expiry":"2025-06-02T00:00:00Z"},
            {"mac":"52:54:00:AB:CD:EF","ip":"10.0.0.5","expiry":"2025-06-01T01:00:00Z"}]"#,
        Some("10.0.0.7")
    )]
    #[case::tie_takes_later_row(
        r#"[{"mac":"52:54:00:ab:cd:ef","ip":"10.0.0.4","expiry":"2025-06-02T00:00:00Z"},
            {"mac":"52:54:00:ab:cd:ef","ip":"10.0.0.5","expiry":"2025-06-02T00:00:00Z"}]"#,
        Some("10.0.0.5")
    )]
    #[case::garbage_rows_skipped(
        r#"[42, "x", null, {}, {"mac":"52:54:00:ab:cd:ef"},
            {"mac":"not-a-mac","ip":"10.0.0.1","expiry":"2025-06-02T00:00:00Z"},
            {"mac":"52:54:00:ab:cd:ef","ip":"10.0.0.2","expiry":"tomorrow"},
            {"mac":"52:54:00:ab:cd:ef","ip":"10.0.0.3","expiry":"2025-06-02T00:00:00"},
            {"mac":"52:54:00:ab:cd:ef","ip":10,"expiry":"2025-06-02T00:00:00Z"},
            {"mac":"52:54:00:ab:cd:ef","ip":"10.0.0.5","expiry":"2025-06-01T01:00:00Z","extra":true}]"#,
        Some("10.0.0.5")
    )]
    #[case::ipv6_skipped(
        r#"[{"mac":"52:54:00:ab:cd:ef","ip":"fd00::5","expiry":"2025-06-02T00:00:00Z"}]"#,
        None
    )]
    #[case::invalid_ip_skipped(
        r#"[{"mac":"52:54:00:ab:cd:ef","ip":"10.0.0.256","expiry":"2025-06-02T00:00:00Z"}]"#,
        None
    )]
    #[case::ipv6_beside_ipv4(
        r#"[{"mac":"52:54:00:ab:cd:ef","ip":"fd00::5","expiry":"2025-06-03T00:00:00Z"},
            {"mac":"52:54:00:ab:cd:ef","ip":"10.0.0.5","expiry":"2025-06-02T00:00:00Z"}]"#,
        Some("10.0.0.5")
    )]
    #[case::empty_array("[]", None)]
    #[case::empty_content("", None)]
    #[case::whitespace_only(" \n", None)]
    #[case::null_when_cocoon_net_holds_no_lease("null\n", None)]
    fn lookup(#[case] json: &str, #[case] expected: Option<&str>) {
        let found = lookup_lease(json.as_bytes(), &MAC, now()).unwrap();
        assert_eq!(found, expected.map(ip));
    }

    #[rstest]
    #[case::object(
        r#"{"mac":"52:54:00:ab:cd:ef","ip":"10.0.0.5","expiry":"2025-06-02T00:00:00Z"}"#
    )]
    #[case::truncated(r#"[{"mac":"52:54:00:ab:cd:ef","ip":"#)]
    #[case::not_json("leases: none")]
    fn content_that_is_not_an_array_is_an_error(#[case] json: &str) {
        let error = lookup_lease(json.as_bytes(), &MAC, now()).unwrap_err();
        assert!(matches!(error, LeaseError::NotAnArray(_)), "{error:?}");
        assert!(error.to_string().contains("check what cocoon-net writes"));
    }

    #[rstest]
    #[case::empty(&[], 0xffff)]
    #[case::one_odd_byte(&[0x01], 0xfeff)]
    // RFC 1071 section 3's example words sum to 0xddf2.
    #[case::rfc_1071(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7], !0xddf2)]
    fn checksum(#[case] data: &[u8], #[case] expected: u16) {
        assert_eq!(internet_checksum(data), expected);
    }

    #[rstest]
    #[case::even_payload(b"abcd".as_slice())]
    #[case::odd_payload(b"abc".as_slice())]
    #[case::our_payload(ICMP_PAYLOAD)]
    fn echo_request_checksums_to_zero(#[case] payload: &[u8]) {
        let packet = echo_request(0x1234, 0xbeef, payload);
        assert_eq!(&packet[..2], &[8, 0]);
        assert_eq!(&packet[4..8], &[0x12, 0x34, 0xbe, 0xef]);
        assert_eq!(&packet[8..], payload);
        // Summing a packet that carries its checksum gives all ones.
        assert_eq!(internet_checksum(&packet), 0);
    }

    /// The reply to `echo_request(0x1234, 7, ICMP_PAYLOAD)`, with `edit`
    /// applied to the ICMP part, wrapped in an IPv4 header from `from`
    /// when `raw`.
    fn reply(raw: bool, from: [u8; 4], edit: impl Fn(&mut Vec<u8>)) -> Vec<u8> {
        let mut icmp = echo_request(0x1234, 7, ICMP_PAYLOAD);
        icmp[0] = ICMP_ECHO_REPLY;
        edit(&mut icmp);
        if !raw {
            return icmp;
        }
        let mut packet = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0];
        packet.extend_from_slice(&from);
        packet.extend_from_slice(&[127, 0, 0, 1]);
        packet.extend_from_slice(&icmp);
        packet
    }

    const LOOPBACK: [u8; 4] = [127, 0, 0, 1];

    #[rstest]
    #[case::datagram_reply(false, LOOPBACK, |_: &mut Vec<u8>| {}, true)]
    #[case::datagram_kernel_id(false, LOOPBACK, |p: &mut Vec<u8>| p[4] = 0x99, true)]
    #[case::datagram_request(false, LOOPBACK, |p: &mut Vec<u8>| p[0] = ICMP_ECHO_REQUEST, false)]
    #[case::datagram_other_sequence(false, LOOPBACK, |p: &mut Vec<u8>| p[7] = 8, false)]
    #[case::datagram_other_payload(false, LOOPBACK, |p: &mut Vec<u8>| p.push(0), false)]
    #[case::datagram_truncated(false, LOOPBACK, |p: &mut Vec<u8>| p.truncate(6), false)]
    #[case::raw_reply(true, LOOPBACK, |_: &mut Vec<u8>| {}, true)]
    #[case::raw_other_id(true, LOOPBACK, |p: &mut Vec<u8>| p[4] = 0x99, false)]
    #[case::raw_other_sender(true, [127, 0, 0, 2], |_: &mut Vec<u8>| {}, false)]
    #[case::raw_own_request(true, LOOPBACK, |p: &mut Vec<u8>| p[0] = ICMP_ECHO_REQUEST, false)]
    #[case::raw_unreachable(true, LOOPBACK, |p: &mut Vec<u8>| p[0] = 3, false)]
    fn matches_only_our_reply(
        #[case] raw: bool,
        #[case] from: [u8; 4],
        #[case] edit: fn(&mut Vec<u8>),
        #[case] expected: bool,
    ) {
        let kind = if raw {
            IcmpSocket::Raw
        } else {
            IcmpSocket::Datagram
        };
        let packet = reply(raw, from, edit);
        assert_eq!(
            is_echo_reply(&packet, kind, Ipv4Addr::LOCALHOST, 0x1234, 7, ICMP_PAYLOAD),
            expected
        );
    }

    fn lease_json(rows: &[(MacAddr, &str, &str)]) -> String {
        let rows: Vec<_> = rows
            .iter()
            .map(|(mac, ip, expiry)| serde_json::json!({"mac": mac.to_string(), "ip": ip, "expiry": expiry}))
            .collect();
        serde_json::Value::Array(rows).to_string()
    }

    /// A watcher that only polls, judging expiry by the fixed test clock.
    fn polling_watcher(path: PathBuf) -> LeaseWatcher {
        LeaseWatcher::build(path, DEFAULT_LEASE_POLL, Arc::new(now), false).unwrap()
    }

    /// Paused time: the poll loop alone finds a lease written while a waiter
    /// waits, and the 45 s spec budget passes in no real time; a file that
    /// was unusable meanwhile (a rewrite in place is briefly half-written)
    /// does not end the wait.
    #[rstest]
    #[case::missing_at_first(None)]
    #[case::half_written_at_first(Some("[{\"mac\": "))]
    #[tokio::test(start_paused = true)]
    async fn polling_finds_a_lease_written_later(#[case] first: Option<&str>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.json");
        if let Some(first) = first {
            fs::write(&path, first).unwrap();
        }
        let watcher = Arc::new(polling_watcher(path.clone()));
        let waiter = tokio::spawn({
            let watcher = Arc::clone(&watcher);
            async move {
                watcher
                    .wait_for(&MAC, Instant::now() + Duration::from_secs(45))
                    .await
            }
        });
        tokio::time::sleep(Duration::from_secs(10)).await;
        fs::write(
            &path,
            lease_json(&[(MAC, "10.0.0.5", "2025-06-01T01:00:00Z")]),
        )
        .unwrap();
        assert_eq!(waiter.await.unwrap(), Ok(Some(ip("10.0.0.5"))));
        assert!(!watcher.is_watching());
    }

    #[rstest]
    #[case::missing_file(None)]
    #[case::expired_lease(Some(lease_json(&[(MAC, "10.0.0.5", "2025-05-31T00:00:00Z")])))]
    #[case::other_mac_only(Some(lease_json(&[(OTHER, "10.0.0.5", "2025-06-02T00:00:00Z")])))]
    #[tokio::test(start_paused = true)]
    async fn no_live_lease_returns_none_at_the_deadline(#[case] content: Option<String>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.json");
        if let Some(content) = content {
            fs::write(&path, content).unwrap();
        }
        let watcher = polling_watcher(path);
        let deadline = Instant::now() + Duration::from_secs(45);
        assert_eq!(watcher.wait_for(&MAC, deadline).await, Ok(None));
        assert!(Instant::now() >= deadline);
    }

    /// A file that stays unusable through the wait is no answer about the
    /// lease: the wait ends in the file's problem, for the node's operator.
    #[rstest]
    #[case::not_an_array("{}", "not a JSON array")]
    #[case::not_json("cocoon-net was here", "not a JSON array")]
    #[tokio::test(start_paused = true)]
    async fn a_file_unusable_to_the_end_is_an_error_not_an_answer(
        #[case] content: &str,
        #[case] says: &str,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.json");
        fs::write(&path, content).unwrap();
        let watcher = polling_watcher(path.clone());
        let deadline = Instant::now() + Duration::from_secs(45);
        let why = watcher.wait_for(&MAC, deadline).await.unwrap_err();
        assert!(why.contains(says), "{why}");
        assert!(why.contains(&path.display().to_string()), "{why}");
    }

    #[rstest]
    #[case::no_file_name(PathBuf::from("/"), Duration::from_millis(200))]
    #[case::zero_poll(PathBuf::from("/tmp/leases.json"), Duration::ZERO)]
    fn bad_settings_are_refused(#[case] path: PathBuf, #[case] poll: Duration) {
        let error = LeaseWatcher::new(path, poll).unwrap_err();
        assert!(error.to_string().contains("default"), "{error}");
    }
}
