//! The lease watcher against a real directory with real file events, and
//! the readiness probe against loopback only (never any other address).
//!
//! These run in real time: file events come from the kernel. Deadlines are
//! generous where a lease is expected (the test passes in milliseconds) and
//! short where none is; no test asserts on elapsed time.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use fixup_core::facts::MacAddr;
use fixup_host::ready::{DEFAULT_LEASE_POLL, LeaseWatcher, ProbeOutcome, WallClock, probe};
use rstest::rstest;
use tokio::time::Instant;

const MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0xab, 0xcd, 0xef]);
const OTHER: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x00, 0x00, 0x01]);

/// Where a lease is expected: long enough never to be the reason a test
/// fails on a loaded machine.
const EXPECT_LEASE: Duration = Duration::from_secs(30);
/// Where no lease is expected.
const EXPECT_NONE: Duration = Duration::from_millis(300);

/// A poll so slow that only a file event can deliver a lease in time.
const EVENTS_ONLY: Duration = Duration::from_secs(3600);

/// The fixed "now" for lease expiry: 2025-06-01T00:00:00Z.
fn clock() -> WallClock {
    Arc::new(|| UNIX_EPOCH + Duration::from_secs(1_748_736_000))
}

const LIVE: &str = "2025-06-01T01:00:00Z";
const EXPIRED: &str = "2025-05-31T23:00:00Z";

fn leases(rows: &[(MacAddr, &str, &str)]) -> String {
    let rows: Vec<_> = rows
        .iter()
        .map(|(mac, ip, expiry)| {
            serde_json::json!({"mac": mac.to_string().to_uppercase(), "ip": ip, "expiry": expiry})
        })
        .collect();
    serde_json::Value::Array(rows).to_string()
}

#[derive(Debug, Clone, Copy)]
enum Writer {
    /// Truncate and write the file itself.
    InPlace,
    /// Write a temporary file beside it and rename it over the lease file,
    /// as a careful writer (cocoon-net) may do.
    RenameOver,
}

fn write(path: &Path, content: &str, writer: Writer) {
    match writer {
        Writer::InPlace => fs::write(path, content).unwrap(),
        Writer::RenameOver => {
            let staging = path.with_extension("json.tmp");
            fs::write(&staging, content).unwrap();
            fs::rename(&staging, path).unwrap();
        }
    }
}

fn watcher(path: PathBuf, poll: Duration) -> Arc<LeaseWatcher> {
    Arc::new(LeaseWatcher::with_clock(path, poll, clock()).unwrap())
}

fn spawn_waiter(
    watcher: &Arc<LeaseWatcher>,
    mac: MacAddr,
    within: Duration,
) -> tokio::task::JoinHandle<Result<Option<Ipv4Addr>, String>> {
    let watcher = Arc::clone(watcher);
    let deadline = Instant::now() + within;
    tokio::spawn(async move { watcher.wait_for(&mac, deadline).await })
}

/// Lets spawned waiters make their first check before the file changes.
/// Not a threshold: a late waiter still passes, it just tests less.
async fn let_waiters_start() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

#[rstest]
#[tokio::test]
async fn waiter_sees_a_lease_written_after_it_started(
    #[values(Writer::InPlace, Writer::RenameOver)] writer: Writer,
    #[values(false, true)] file_existed: bool,
    #[values(EVENTS_ONLY, DEFAULT_LEASE_POLL)] poll: Duration,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.json");
    if file_existed {
        fs::write(&path, leases(&[(OTHER, "10.0.0.9", LIVE)])).unwrap();
    }
    let watcher = watcher(path.clone(), poll);
    assert!(
        watcher.is_watching(),
        "file events unavailable: {watcher:?}"
    );
    let waiter = spawn_waiter(&watcher, MAC, EXPECT_LEASE);
    let_waiters_start().await;

    write(
        &path,
        &leases(&[(OTHER, "10.0.0.9", LIVE), (MAC, "10.0.0.5", LIVE)]),
        writer,
    );
    assert_eq!(waiter.await.unwrap(), Ok(Some(Ipv4Addr::new(10, 0, 0, 5))));
}

#[tokio::test]
async fn a_lease_already_present_is_returned_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.json");
    fs::write(&path, leases(&[(MAC, "10.0.0.5", LIVE)])).unwrap();
    let watcher = watcher(path, EVENTS_ONLY);
    let deadline = Instant::now() + EXPECT_LEASE;
    assert_eq!(
        watcher.wait_for(&MAC, deadline).await,
        Ok(Some(Ipv4Addr::new(10, 0, 0, 5)))
    );
}

#[rstest]
#[case::missing_file(None)]
#[case::expired(Some(leases(&[(MAC, "10.0.0.5", EXPIRED)])))]
#[case::other_mac(Some(leases(&[(OTHER, "10.0.0.5", LIVE)])))]
#[tokio::test]
async fn no_live_lease_means_none_at_the_deadline(#[case] content: Option<String>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.json");
    if let Some(content) = content {
        fs::write(&path, content).unwrap();
    }
    let watcher = watcher(path, DEFAULT_LEASE_POLL);
    let deadline = Instant::now() + EXPECT_NONE;
    assert_eq!(watcher.wait_for(&MAC, deadline).await, Ok(None));
}

#[tokio::test]
async fn an_expired_lease_is_ignored_until_a_live_one_comes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.json");
    fs::write(&path, leases(&[(MAC, "10.0.0.4", EXPIRED)])).unwrap();
    let watcher = watcher(path.clone(), EVENTS_ONLY);
    let waiter = spawn_waiter(&watcher, MAC, EXPECT_LEASE);
    let_waiters_start().await;

    write(
        &path,
        &leases(&[(MAC, "10.0.0.4", EXPIRED), (MAC, "10.0.0.5", LIVE)]),
        Writer::RenameOver,
    );
    assert_eq!(waiter.await.unwrap(), Ok(Some(Ipv4Addr::new(10, 0, 0, 5))));
}

#[tokio::test]
async fn many_waiters_share_one_watcher() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.json");
    let watcher = watcher(path.clone(), DEFAULT_LEASE_POLL);
    let macs: Vec<MacAddr> = (1..=8).map(|i| MacAddr([0x52, 0x54, 0, 0, 1, i])).collect();
    let waiters: Vec<_> = (0..64)
        .map(|i| {
            let mac = macs[i % macs.len()];
            (mac, spawn_waiter(&watcher, mac, EXPECT_LEASE))
        })
        .collect();
    let absent = spawn_waiter(&watcher, OTHER, EXPECT_NONE);
    let_waiters_start().await;

    let ips: Vec<String> = macs
        .iter()
        .map(|mac| format!("10.1.0.{}", mac.0[5]))
        .collect();
    let rows: Vec<_> = macs
        .iter()
        .zip(&ips)
        .map(|(mac, ip)| (*mac, ip.as_str(), LIVE))
        .collect();
    write(&path, &leases(&rows), Writer::RenameOver);

    for (mac, waiter) in waiters {
        assert_eq!(
            waiter.await.unwrap(),
            Ok(Some(Ipv4Addr::new(10, 1, 0, mac.0[5]))),
            "waiter for {mac}"
        );
    }
    assert_eq!(absent.await.unwrap(), Ok(None));
}

#[tokio::test]
async fn a_missing_directory_is_watched_once_it_appears() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("net");
    let path = dir.join("leases.json");
    let watcher = watcher(path.clone(), DEFAULT_LEASE_POLL);
    assert!(!watcher.is_watching());
    let waiter = spawn_waiter(&watcher, MAC, EXPECT_LEASE);
    let_waiters_start().await;

    fs::create_dir(&dir).unwrap();
    write(
        &path,
        &leases(&[(MAC, "10.0.0.5", LIVE)]),
        Writer::RenameOver,
    );
    assert_eq!(waiter.await.unwrap(), Ok(Some(Ipv4Addr::new(10, 0, 0, 5))));
    assert!(watcher.is_watching());
}

/// The process builds its one watcher before the runtime starts.
#[test]
fn new_needs_no_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let watcher = LeaseWatcher::new(dir.path().join("leases.json"), DEFAULT_LEASE_POLL).unwrap();
    assert!(watcher.is_watching(), "{watcher:?}");
}

const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn tcp_probe_connects_to_a_listener() {
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let outcome = probe(Ipv4Addr::LOCALHOST, Some(port), PROBE_TIMEOUT).await;
    assert_eq!(outcome, ProbeOutcome::TcpConnected);
    assert!(outcome.answered());
}

#[tokio::test]
async fn tcp_probe_to_a_closed_port_is_unreachable() {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let outcome = probe(Ipv4Addr::LOCALHOST, Some(port), PROBE_TIMEOUT).await;
    let ProbeOutcome::Unreachable(message) = &outcome else {
        panic!("expected Unreachable, got {outcome:?}");
    };
    assert!(
        message.contains("vm.cocoonstack.io/probe-port"),
        "{message}"
    );
    assert!(!outcome.answered());
}

/// The machine may or may not let this process send ICMP; both answers are
/// right, anything else is not.
#[tokio::test]
async fn icmp_probe_of_loopback_replies_or_lacks_privilege() {
    let outcome = probe(Ipv4Addr::LOCALHOST, None, PROBE_TIMEOUT).await;
    assert!(
        matches!(
            outcome,
            ProbeOutcome::IcmpReply | ProbeOutcome::IpResolvedOnly
        ),
        "{outcome:?}"
    );
}
