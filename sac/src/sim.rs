//! A SAC simulator for tests (feature `sim`): a thread that listens on a
//! real Unix socket and answers as the console of a Windows guest does, by
//! a [`Script`].
//!
//! It answers an empty line with the `SAC>` prompt, `i` with the interface
//! listing in SAC's format (CR LF line ends), and `i <net> <ip> <mask>
//! <gateway>` by changing that interface's address, then `SAC>`. Each line
//! is echoed first, as a terminal would. The script can delay interfaces,
//! make a set not take, leave lines unanswered, close the connection,
//! flood the console, add unsolicited output and slow every answer; the
//! handle records every line received, byte for byte.
//!
//! ```no_run
//! # use fixup_sac::sim::{Script, Sim, SimNet, console_path_in};
//! let root = std::path::Path::new("/tmp/root");
//! let path = console_path_in(root, "vm-a").unwrap();
//! let sim = Sim::start(&path, Script::new().net(SimNet::new(7, "10.88.0.12"))).unwrap();
//! // ... run a pass against `root` and `vm-a` ...
//! assert_eq!(sim.received()[0], "\r\n");
//! ```

use std::collections::HashMap;
use std::fs;
use std::io::{self, ErrorKind, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// How long the simulator's reads, writes and accepts wait before looking
/// at its stop flag again: 5 ms.
const TICK: Duration = Duration::from_millis(5);

/// Creates `<root>/run/cloudhypervisor/<vm id>/` and returns the console
/// socket's path in it, where [`Sim::start`] can listen. Unix socket paths
/// hold at most 107 bytes: keep `root` short.
pub fn console_path_in(root: &Path, vm_id: &str) -> io::Result<PathBuf> {
    let dir = root.join("run/cloudhypervisor").join(vm_id);
    fs::create_dir_all(&dir)?;
    Ok(dir.join(crate::console::CONSOLE_SOCKET))
}

/// When an empty line gets the `SAC>` prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptMode {
    /// Every empty line.
    Immediate,
    /// The first `n` empty lines get no answer, the later ones the prompt.
    AfterEmptyLines(u32),
    /// No empty line ever gets an answer.
    Never,
}

/// A kind of line, for behaviours that apply to one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// The empty line.
    Prompt,
    /// `i`.
    Query,
    /// `i <net> <ip> <mask> <gateway>`.
    Set,
}

/// What a set line for an interface does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetMode {
    /// The address changes at once.
    Takes,
    /// Acknowledged, but the address never changes.
    Never,
    /// Acknowledged each time; the address changes with the `n`-th set
    /// line for this interface.
    OnRound(u32),
    /// No answer at all: no acknowledgement, no `SAC>`.
    NoAnswer,
}

/// One interface of the simulated guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimNet {
    net: u32,
    ip: String,
    subnet: String,
    gateway: String,
    ipv6: Option<String>,
    visible_after: u32,
    set: SetMode,
}

impl SimNet {
    /// Interface `net` holding `ip`/24 without a gateway, listed from the
    /// first `i`, taking every set at once.
    pub fn new(net: u32, ip: &str) -> SimNet {
        SimNet {
            net,
            ip: ip.to_owned(),
            subnet: "255.255.255.0".to_owned(),
            gateway: String::new(),
            ipv6: None,
            visible_after: 0,
            set: SetMode::Takes,
        }
    }

    pub fn subnet(mut self, subnet: &str) -> SimNet {
        self.subnet = subnet.to_owned();
        self
    }

    pub fn gateway(mut self, gateway: &str) -> SimNet {
        self.gateway = gateway.to_owned();
        self
    }

    /// Also list an IPv6 address for this interface (its own line).
    pub fn ipv6(mut self, address: &str) -> SimNet {
        self.ipv6 = Some(address.to_owned());
        self
    }

    /// Leave the interface out of the first `queries` listings.
    pub fn visible_after(mut self, queries: u32) -> SimNet {
        self.visible_after = queries;
        self
    }

    pub fn set_mode(mut self, mode: SetMode) -> SimNet {
        self.set = mode;
        self
    }
}

/// How the simulated console behaves. [`Script::new`]: prompt on every
/// empty line, echo on, no interfaces, nothing unusual.
#[derive(Debug, Clone)]
pub struct Script {
    prompt: PromptMode,
    nets: Vec<SimNet>,
    echo: bool,
    close_after_lines: Option<usize>,
    flood: Option<(Command, usize)>,
    noise_before: Vec<u8>,
    noise_after: Option<(Duration, Vec<u8>)>,
    delay: Duration,
}

impl Default for Script {
    fn default() -> Self {
        Script::new()
    }
}

impl Script {
    pub fn new() -> Script {
        Script {
            prompt: PromptMode::Immediate,
            nets: Vec::new(),
            echo: true,
            close_after_lines: None,
            flood: None,
            noise_before: Vec::new(),
            noise_after: None,
            delay: Duration::ZERO,
        }
    }

    pub fn prompt(mut self, mode: PromptMode) -> Script {
        self.prompt = mode;
        self
    }

    /// Adds an interface; listings show them in the order added.
    pub fn net(mut self, net: SimNet) -> Script {
        self.nets.push(net);
        self
    }

    /// Whether each line is echoed before its answer (default on).
    pub fn echo(mut self, on: bool) -> Script {
        self.echo = on;
        self
    }

    /// Close the connection on receiving the `n`-th line (counting from 1,
    /// over all connections), without answering it.
    pub fn close_after_lines(mut self, n: usize) -> Script {
        self.close_after_lines = Some(n);
        self
    }

    /// Answer every line of kind `on` with `bytes` of output that never
    /// holds `SAC>`.
    pub fn flood(mut self, on: Command, bytes: usize) -> Script {
        self.flood = Some((on, bytes));
        self
    }

    /// Write `text` before every answer (after the echo), as unsolicited
    /// console output would come.
    pub fn noise_before(mut self, text: &str) -> Script {
        self.noise_before = text.as_bytes().to_vec();
        self
    }

    /// Write `text` `after` each answer, unasked: stale output the next
    /// command must not take for its answer.
    pub fn noise_after(mut self, after: Duration, text: &str) -> Script {
        self.noise_after = Some((after, text.as_bytes().to_vec()));
        self
    }

    /// Wait `delay` before answering each line.
    pub fn delay(mut self, delay: Duration) -> Script {
        self.delay = delay;
        self
    }
}

/// What the simulator saw and holds, shared with the handle.
#[derive(Debug, Default)]
struct Shared {
    received: Vec<String>,
    raw: Vec<u8>,
    queries: u32,
    empty_lines: u32,
    sets: HashMap<u32, u32>,
    connections: usize,
    nets: Vec<SimNet>,
}

/// A running simulator. Dropping it (or [`Sim::stop`]) stops the thread
/// and removes the socket.
#[derive(Debug)]
pub struct Sim {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    shared: Arc<Mutex<Shared>>,
    thread: Option<JoinHandle<()>>,
}

impl Sim {
    /// Listens on `path` (which must not exist yet) and serves one
    /// connection at a time by `script`.
    pub fn start(path: impl AsRef<Path>, script: Script) -> io::Result<Sim> {
        let path = path.as_ref().to_path_buf();
        let listener = UnixListener::bind(&path)?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Mutex::new(Shared {
            nets: script.nets.clone(),
            ..Shared::default()
        }));
        let server = Server {
            script,
            stop: stop.clone(),
            shared: shared.clone(),
            lines: 0,
        };
        let thread = thread::Builder::new()
            .name("sac-sim".to_owned())
            .spawn(move || server.run(&listener))?;
        Ok(Sim {
            path,
            stop,
            shared,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every line received so far, each with its line end as sent (for
    /// example `"i\r\n"`), over all connections.
    pub fn received(&self) -> Vec<String> {
        self.lock().received.clone()
    }

    /// Every byte received so far, unterminated lines included.
    pub fn raw(&self) -> Vec<u8> {
        self.lock().raw.clone()
    }

    /// How many `i` lines (listings) were received.
    pub fn queries(&self) -> u32 {
        self.lock().queries
    }

    /// How many set lines for `net` were received.
    pub fn sets(&self, net: u32) -> u32 {
        self.lock().sets.get(&net).copied().unwrap_or(0)
    }

    /// The IPv4 address interface `net` holds now.
    pub fn address(&self, net: u32) -> Option<String> {
        let shared = self.lock();
        shared
            .nets
            .iter()
            .find(|n| n.net == net)
            .map(|n| n.ip.clone())
    }

    /// How many connections were accepted.
    pub fn connections(&self) -> usize {
        self.lock().connections
    }

    /// Stops the thread and removes the socket.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = fs::remove_file(&self.path);
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The thread's side.
struct Server {
    script: Script,
    stop: Arc<AtomicBool>,
    shared: Arc<Mutex<Shared>>,
    /// Lines received over all connections.
    lines: usize,
}

/// What to write back for one line.
enum Answer {
    Text(Vec<u8>),
    Silent,
    Flood(usize),
}

impl Server {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn run(mut self, listener: &UnixListener) {
        while !self.stopped() {
            match listener.accept() {
                Ok((stream, _)) => {
                    self.lock().connections += 1;
                    // A connection ends by the client, a write error, the
                    // script or a stop; the next one is served after it.
                    let _ = self.serve(stream);
                }
                Err(_) => thread::sleep(TICK),
            }
        }
    }

    fn serve(&mut self, mut stream: UnixStream) -> io::Result<()> {
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(TICK))?;
        stream.set_write_timeout(Some(TICK))?;
        let mut pending = Vec::new();
        let mut chunk = [0u8; 4096];
        while !self.stopped() {
            let n = match stream.read(&mut chunk) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if is_idle(&e) => continue,
                Err(e) => return Err(e),
            };
            self.lock().raw.extend_from_slice(&chunk[..n]);
            pending.extend_from_slice(&chunk[..n]);
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                self.lock()
                    .received
                    .push(String::from_utf8_lossy(&line).into_owned());
                self.lines += 1;
                if self.script.close_after_lines == Some(self.lines) {
                    let _ = stream.shutdown(Shutdown::Both);
                    return Ok(());
                }
                self.reply(&mut stream, &line)?;
            }
        }
        Ok(())
    }

    fn reply(&mut self, stream: &mut UnixStream, line: &[u8]) -> io::Result<()> {
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end_matches(['\r', '\n']);
        if !self.pause(self.script.delay) {
            return Ok(());
        }
        if self.script.echo {
            self.write(stream, format!("{text}\r\n").as_bytes())?;
        }
        match self.answer(text) {
            Answer::Silent => Ok(()),
            Answer::Flood(bytes) => self.flood(stream, bytes),
            Answer::Text(answer) => {
                let mut out = self.script.noise_before.clone();
                out.extend_from_slice(&answer);
                self.write(stream, &out)?;
                if let Some((after, noise)) = self.script.noise_after.clone()
                    && self.pause(after)
                {
                    self.write(stream, &noise)?;
                }
                Ok(())
            }
        }
    }

    fn answer(&mut self, text: &str) -> Answer {
        let command = match text {
            "" => Command::Prompt,
            "i" => Command::Query,
            _ if text.starts_with("i ") => Command::Set,
            _ => return Answer::Text(b"Unknown command.\r\n\r\nSAC>".to_vec()),
        };
        let flood = match self.script.flood {
            Some((on, bytes)) if on == command => Some(bytes),
            _ => None,
        };
        match command {
            Command::Prompt => {
                let mut shared = self.lock();
                shared.empty_lines += 1;
                let empty = shared.empty_lines;
                drop(shared);
                if let Some(bytes) = flood {
                    return Answer::Flood(bytes);
                }
                match self.script.prompt {
                    PromptMode::Immediate => Answer::Text(b"\r\nSAC>".to_vec()),
                    PromptMode::AfterEmptyLines(n) if empty > n => {
                        Answer::Text(b"\r\nSAC>".to_vec())
                    }
                    PromptMode::AfterEmptyLines(_) | PromptMode::Never => Answer::Silent,
                }
            }
            Command::Query => {
                let mut shared = self.lock();
                shared.queries += 1;
                if let Some(bytes) = flood {
                    return Answer::Flood(bytes);
                }
                Answer::Text(listing(&shared.nets, shared.queries))
            }
            Command::Set => {
                if let Some(bytes) = flood {
                    return Answer::Flood(bytes);
                }
                self.set(&text[2..])
            }
        }
    }

    /// `<net> <ip> <mask> <gateway>`, the gateway possibly empty.
    fn set(&mut self, fields: &str) -> Answer {
        let fields: Vec<&str> = fields.split(' ').collect();
        let [net, ip, mask, gateway] = fields[..] else {
            return Answer::Text(
                b"The command needs a net number, an address, a mask and a gateway.\r\n\r\nSAC>"
                    .to_vec(),
            );
        };
        let Ok(net) = net.parse::<u32>() else {
            return Answer::Text(b"The net number is not a number.\r\n\r\nSAC>".to_vec());
        };
        let mut shared = self.lock();
        let round = {
            let count = shared.sets.entry(net).or_insert(0);
            *count += 1;
            *count
        };
        let Some(iface) = shared.nets.iter_mut().find(|n| n.net == net) else {
            return Answer::Text(format!("No interface {net}.\r\n\r\nSAC>").into_bytes());
        };
        let takes = match iface.set {
            SetMode::Takes => true,
            SetMode::Never => false,
            SetMode::OnRound(n) => round >= n,
            SetMode::NoAnswer => return Answer::Silent,
        };
        if takes {
            iface.ip = ip.to_owned();
            iface.subnet = mask.to_owned();
            iface.gateway = gateway.to_owned();
        }
        Answer::Text(format!("Interface {net} takes the new address.\r\n\r\nSAC>").into_bytes())
    }

    fn flood(&self, stream: &mut UnixStream, bytes: usize) -> io::Result<()> {
        let line = b"EVENT: the console is busy, the console is busy\r\n";
        let block: Vec<u8> = line.iter().copied().cycle().take(8192).collect();
        let mut left = bytes;
        while left > 0 {
            let n = left.min(block.len());
            self.write(stream, &block[..n])?;
            left -= n;
        }
        Ok(())
    }

    /// Writes all of `bytes`, giving up when stopped or when the client is
    /// gone.
    fn write(&self, stream: &mut UnixStream, bytes: &[u8]) -> io::Result<()> {
        let mut at = 0;
        while at < bytes.len() {
            if self.stopped() {
                return Err(io::Error::new(ErrorKind::Interrupted, "simulator stopped"));
            }
            match stream.write(&bytes[at..]) {
                Ok(n) => at += n,
                Err(e) if is_idle(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Sleeps `span` in ticks; false when stopped meanwhile.
    fn pause(&self, span: Duration) -> bool {
        let mut left = span;
        while !left.is_zero() {
            if self.stopped() {
                return false;
            }
            let step = left.min(TICK);
            thread::sleep(step);
            left -= step;
        }
        !self.stopped()
    }
}

fn is_idle(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

/// SAC's listing as the `query`-th `i` sees it: each visible interface's
/// IPv4 line, then its IPv6 line, then the prompt.
fn listing(nets: &[SimNet], query: u32) -> Vec<u8> {
    let mut out = String::new();
    for n in nets.iter().filter(|n| query > n.visible_after) {
        out.push_str(&format!(
            "Net: {}, Ip={}  Subnet={}  Gateway={}\r\n",
            n.net, n.ip, n.subnet, n.gateway
        ));
        if let Some(v6) = &n.ipv6 {
            out.push_str(&format!("Net: {}, Ip={v6}\r\n", n.net));
        }
    }
    out.push_str("\r\nSAC>");
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_format() {
        let nets = [
            SimNet::new(7, "10.88.0.12")
                .gateway("10.88.0.1")
                .ipv6("fe80::1c2d:3eff:fe4f:5061"),
            SimNet::new(9, "169.254.10.3").subnet("255.255.0.0"),
            SimNet::new(11, "10.0.0.5").visible_after(1),
        ];
        assert_eq!(
            String::from_utf8(listing(&nets, 1)).unwrap(),
            "Net: 7, Ip=10.88.0.12  Subnet=255.255.255.0  Gateway=10.88.0.1\r\n\
             Net: 7, Ip=fe80::1c2d:3eff:fe4f:5061\r\n\
             Net: 9, Ip=169.254.10.3  Subnet=255.255.0.0  Gateway=\r\n\
             \r\nSAC>"
        );
        assert!(
            String::from_utf8(listing(&nets, 2))
                .unwrap()
                .contains("Net: 11, Ip=10.0.0.5")
        );
    }
}
