//! The metrics listener's limits (`serve::serve_http`): connections past the
//! cap are closed and the ones inside it keep working, idle and slow
//! clients are disconnected, no connection outlives its lifetime, and
//! shutdown still stops the server. Also the open-file limit `serve` raises
//! at start.
//!
//! Everything runs on 127.0.0.1 under tokio's paused clock, so the limits
//! are virtual seconds and the tests assert what happened (answered,
//! closed, how many), never how long it took. On the current-thread
//! runtime the server finishes a step (a connection closed and its place
//! freed) before the client side sees it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fixup_host::metrics::Metrics;
use fixup_host::serve::{ListenerLimits, metrics_router, raise_open_file_limit, serve_http};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Far longer than any limit a test sets: a wait that reaches it means the
/// server never did what the test waits for.
const HANG: Duration = Duration::from_secs(24 * 3600);

/// Longer than a test runs: a limit that must not be the one that acts.
const NEVER: Duration = Duration::from_secs(7 * 24 * 3600);

struct Server {
    addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

async fn start(limits: ListenerLimits) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let app = metrics_router(Arc::new(Metrics::new()));
    let task = tokio::spawn(serve_http(listener, app, limits, shutdown.clone()));
    Server {
        addr,
        shutdown,
        task,
    }
}

impl Server {
    /// Cancel the shutdown token and wait for the server to return.
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(HANG, self.task)
            .await
            .expect("the server did not stop")
            .unwrap();
    }
}

fn limits(max_connections: usize, header_read: Duration, lifetime: Duration) -> ListenerLimits {
    ListenerLimits {
        header_read,
        lifetime,
        max_connections,
        ..ListenerLimits::default()
    }
}

const HEALTH: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n";

/// Read until the server closes the connection; what it sent before (a
/// reset after it closed counts as closed).
async fn until_closed(stream: &mut TcpStream) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(HANG, stream.read(&mut buf))
            .await
            .expect("the server never closed the connection");
        match read {
            Ok(0) | Err(_) => return String::from_utf8_lossy(&seen).into_owned(),
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

/// `GET /healthz` on a fresh connection that asks to be closed: the
/// response, empty when the server closed the connection without one.
async fn health(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    // A write can fail when the server has already closed the connection;
    // the read below then sees the close.
    let _ = stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
        .await;
    until_closed(&mut stream).await
}

fn answered(response: &str) -> bool {
    response.starts_with("HTTP/1.1 200") && response.ends_with("\r\n\r\nok\n")
}

async fn assert_health_answers(addr: SocketAddr) {
    let response = health(addr).await;
    assert!(answered(&response), "{response}");
}

/// One `GET /healthz` on a kept-alive connection: true when it was
/// answered, false when the server closed the connection instead.
async fn ask(stream: &mut TcpStream) -> bool {
    if stream.write_all(HEALTH).await.is_err() {
        return false;
    }
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(HANG, stream.read(&mut buf))
            .await
            .expect("the server neither answered nor closed");
        match read {
            Ok(0) | Err(_) => return false,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
        if answered(&String::from_utf8_lossy(&seen)) {
            return true;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn past_the_cap_connections_are_closed_and_health_answers_once_idle_ones_time_out() {
    let cap = 4;
    let server = start(limits(cap, Duration::from_secs(5), NEVER)).await;

    // The cap's worth of clients that connect and send nothing.
    let mut idle = Vec::new();
    for _ in 0..cap {
        idle.push(TcpStream::connect(server.addr).await.unwrap());
    }
    // Past the cap every new connection is closed unanswered.
    for _ in 0..3 {
        assert_eq!(health(server.addr).await, "", "a health check past the cap");
    }

    // The idle limit closes every idle connection, without a response.
    for stream in &mut idle {
        assert_eq!(until_closed(stream).await, "", "an idle connection");
    }
    // Their places are free again: health checks answer, more than the cap
    // of them one after another.
    for _ in 0..cap + 2 {
        assert_health_answers(server.addr).await;
    }
    server.stop().await;
}

#[tokio::test(start_paused = true)]
async fn connections_inside_the_cap_keep_working_while_others_are_refused() {
    let cap = 2;
    let server = start(limits(cap, Duration::from_secs(5), NEVER)).await;
    let mut first = TcpStream::connect(server.addr).await.unwrap();
    let mut second = TcpStream::connect(server.addr).await.unwrap();
    assert!(ask(&mut first).await);
    assert_eq!(health(server.addr).await, "", "a third connection");
    // Both connections inside the cap are still served, each kept alive.
    assert!(ask(&mut second).await);
    assert!(ask(&mut first).await);
    // A client that leaves frees its place.
    first.shutdown().await.unwrap();
    assert_eq!(until_closed(&mut first).await, "");
    assert_health_answers(server.addr).await;
    server.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_client_slower_than_the_header_read_timeout_is_disconnected() {
    let server = start(limits(4, Duration::from_secs(5), NEVER)).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\n")
        .await
        .unwrap();
    // One more header line every second, well inside the timeout each,
    // never finishing the head: the deadline does not move.
    let lines = 60;
    let mut sent = 0;
    for _ in 0..lines {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if stream.write_all(b"X-Slow: a\r\n").await.is_err() {
            break;
        }
        sent += 1;
    }
    assert!(
        sent < lines,
        "the server let the client send all {lines} header lines"
    );
    assert_eq!(
        until_closed(&mut stream).await,
        "",
        "no answer to a slow head"
    );
    // The server itself goes on.
    assert_health_answers(server.addr).await;
    server.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_kept_alive_connection_idle_between_requests_is_closed() {
    let server = start(limits(4, Duration::from_secs(5), NEVER)).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    assert!(ask(&mut stream).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(ask(&mut stream).await, "kept alive inside the idle limit");
    // Now the client asks nothing more.
    assert_eq!(until_closed(&mut stream).await, "");
    server.stop().await;
}

#[tokio::test(start_paused = true)]
async fn no_connection_outlives_its_lifetime() {
    let server = start(limits(4, Duration::from_secs(5), Duration::from_secs(30))).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    // A client that asks every 2 s never trips the idle limit.
    let most = 1000;
    let mut answers = 0;
    while answers < most && ask(&mut stream).await {
        answers += 1;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert!(answers >= 2, "kept alive for {answers} answers");
    assert!(
        answers < most,
        "the server answered {most} requests on one connection and never closed it"
    );
    server.stop().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_the_server_and_closes_its_idle_connections() {
    // No limit but shutdown itself closes these connections.
    let server = start(ListenerLimits {
        drain: NEVER,
        ..limits(4, NEVER, NEVER)
    })
    .await;
    assert_health_answers(server.addr).await;
    let mut kept = TcpStream::connect(server.addr).await.unwrap();
    assert!(ask(&mut kept).await);
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(TcpStream::connect(server.addr).await.unwrap());
    }

    let addr = server.addr;
    server.stop().await;
    assert_eq!(until_closed(&mut kept).await, "", "a kept-alive connection");
    for stream in &mut silent {
        assert_eq!(until_closed(stream).await, "", "a silent connection");
    }
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
}

#[test]
fn the_open_file_soft_limit_is_raised_to_the_hard_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    // Start from a low soft limit, as under systemd (1024), where the hard
    // limit allows it; 512 is still plenty for the other tests here.
    let hard = getrlimit(Resource::Nofile).maximum;
    let low = hard.map_or(512, |h| h.min(512));
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(low),
            maximum: hard,
        },
    )
    .unwrap();
    let limit = raise_open_file_limit();
    assert_eq!(limit.soft, hard);
    assert_eq!(limit.hard, hard);
    assert_eq!(getrlimit(Resource::Nofile).current, hard, "in force");
}
