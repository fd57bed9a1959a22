//! A client for the QEMU guest agent (`qemu-ga`) on its virtio-serial
//! socket.
//!
//! The wire is newline-terminated JSON. A connection may inherit replies
//! meant for an earlier client (QEMU buffers what the guest wrote), so every
//! connection starts with `guest-sync-delimited`: a 0xFF byte makes the
//! agent drop any half-read request, the agent answers with a 0xFF byte
//! before the echo (everything received before it is dropped), and replies
//! are read until one echoes our random id. After that, replies come in
//! request order.
//!
//! `guest-exec` starts a command (`path` looked up in the guest's `PATH`,
//! `arg` the rest of argv, output captured); `guest-exec-status` is polled
//! every [`EXEC_POLL`] until it has exited. The socket accepts one client
//! at a time: hold an [`Agent`] only as long as one operation needs it.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde_json::{Value, json};

/// How often a running guest command is polled (100 ms): short next to
/// the seconds a command takes under emulation, long enough not to load
/// the agent.
pub const EXEC_POLL: Duration = Duration::from_millis(100);

/// How long one synchronisation attempt waits for its echo (3 s) while
/// [`Agent::wait`] waits for a booting guest.
pub const SYNC_TRY: Duration = Duration::from_secs(3);

/// What can go wrong talking to the agent. The I/O error, when there is
/// one, is part of the message.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(
        "cannot connect to the guest agent socket {}: {error}; check that the VM is running",
        path.display()
    )]
    Connect { path: PathBuf, error: String },
    #[error("guest agent socket {}: {error}", path.display())]
    Io { path: PathBuf, error: String },
    #[error(
        "guest agent at {} did not answer `{command}` within {after:?}; check the guest's serial log that qemu-guest-agent started",
        path.display()
    )]
    NoAnswer {
        path: PathBuf,
        command: String,
        after: Duration,
    },
    #[error("guest agent refused `{command}`: {class}: {desc}")]
    Refused {
        command: String,
        class: String,
        desc: String,
    },
    #[error("guest agent gave an unreadable reply to `{command}`: {reply}")]
    BadReply { command: String, reply: String },
    #[error("guest command `{program}` (guest pid {pid}) did not exit within {after:?}")]
    ExecTimeout {
        program: String,
        pid: i64,
        after: Duration,
    },
}

/// How a guest command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestExit {
    /// The exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl GuestExit {
    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// stdout as text (lossy).
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// stderr as text (lossy).
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// The exit status a CLI reports for it: the code, or 128 + the signal.
    pub fn cli_status(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => 1,
        }
    }
}

/// One synchronised connection to the guest agent.
#[derive(Debug)]
pub struct Agent {
    path: PathBuf,
    stream: UnixStream,
    /// Bytes read but not yet consumed as a reply line.
    pending: Vec<u8>,
    next_id: u64,
}

impl Agent {
    /// Connect and synchronise, within `timeout`.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Agent, AgentError> {
        let stream = UnixStream::connect(path).map_err(|e| AgentError::Connect {
            path: path.to_owned(),
            error: e.to_string(),
        })?;
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut agent = Agent {
            path: path.to_owned(),
            stream,
            pending: Vec::new(),
            // Random enough that a stale echo never matches.
            next_id: (seed ^ u64::from(std::process::id()) << 32) & 0x3FFF_FFFF_FFFF,
        };
        agent.sync(Instant::now() + timeout)?;
        Ok(agent)
    }

    /// Wait until the agent of a booting guest answers, or `timeout` has
    /// passed: the socket may not exist yet, and the agent starts late in
    /// the guest's boot.
    pub fn wait(path: &Path, timeout: Duration) -> Result<Agent, AgentError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match Agent::connect(path, left.min(SYNC_TRY)) {
                Ok(agent) => return Ok(agent),
                Err(e) if Instant::now() >= deadline => {
                    return Err(match e {
                        AgentError::NoAnswer { path, command, .. } => AgentError::NoAnswer {
                            path,
                            command,
                            after: timeout,
                        },
                        other => other,
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }

    /// Run `program` with `args` in the guest, output captured, and wait
    /// for it to exit, at most `timeout`.
    pub fn exec(
        &mut self,
        program: &str,
        args: &[String],
        timeout: Duration,
    ) -> Result<GuestExit, AgentError> {
        let deadline = Instant::now() + timeout;
        let started = self.command(
            "guest-exec",
            json!({"path": program, "arg": args, "capture-output": true}),
            deadline,
        )?;
        let pid = started["pid"]
            .as_i64()
            .ok_or_else(|| AgentError::BadReply {
                command: "guest-exec".into(),
                reply: started.to_string(),
            })?;
        loop {
            let status = self.command("guest-exec-status", json!({"pid": pid}), deadline)?;
            if status["exited"].as_bool() == Some(true) {
                return Ok(GuestExit {
                    code: status["exitcode"].as_i64().map(|c| c as i32),
                    signal: status["signal"].as_i64().map(|s| s as i32),
                    stdout: decode(&status["out-data"])?,
                    stderr: decode(&status["err-data"])?,
                });
            }
            if Instant::now() + EXEC_POLL >= deadline {
                return Err(AgentError::ExecTimeout {
                    program: program.to_owned(),
                    pid,
                    after: timeout,
                });
            }
            std::thread::sleep(EXEC_POLL);
        }
    }

    /// Set the guest's wall clock to the host's (`guest-set-time`, which
    /// also writes the hardware clock). A restored clone's clock resumes at
    /// the moment its parent was saved.
    pub fn set_time(&mut self, timeout: Duration) -> Result<(), AgentError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let nanos = i64::try_from(now.as_nanos()).unwrap_or(i64::MAX);
        self.command(
            "guest-set-time",
            json!({"time": nanos}),
            Instant::now() + timeout,
        )?;
        Ok(())
    }

    /// Ask the guest to power off. The agent sends no reply; the caller
    /// waits for QEMU to exit.
    pub fn shutdown(&mut self) -> Result<(), AgentError> {
        self.send(&json!({"execute": "guest-shutdown", "arguments": {"mode": "powerdown"}}))
    }

    fn sync(&mut self, deadline: Instant) -> Result<(), AgentError> {
        let id = self.next_id;
        self.next_id += 1;
        // 0xFF first: the agent drops whatever a former client left half-sent.
        self.write_all(&[0xFF])?;
        self.send(&json!({"execute": "guest-sync-delimited", "arguments": {"id": id}}))?;
        loop {
            let reply = self.read_reply("guest-sync-delimited", deadline)?;
            if reply.get("return").and_then(Value::as_u64) == Some(id) {
                return Ok(());
            }
        }
    }

    /// Send one command and return its `return` value.
    fn command(
        &mut self,
        execute: &str,
        arguments: Value,
        deadline: Instant,
    ) -> Result<Value, AgentError> {
        self.send(&json!({"execute": execute, "arguments": arguments}))?;
        let reply = self.read_reply(execute, deadline)?;
        if let Some(error) = reply.get("error") {
            return Err(AgentError::Refused {
                command: execute.to_owned(),
                class: error["class"].as_str().unwrap_or("?").to_owned(),
                desc: error["desc"].as_str().unwrap_or("?").to_owned(),
            });
        }
        reply
            .get("return")
            .cloned()
            .ok_or_else(|| AgentError::BadReply {
                command: execute.to_owned(),
                reply: reply.to_string(),
            })
    }

    fn send(&mut self, request: &Value) -> Result<(), AgentError> {
        let mut line = request.to_string().into_bytes();
        line.push(b'\n');
        self.write_all(&line)
    }

    fn write_all(&mut self, bytes: &[u8]) -> Result<(), AgentError> {
        self.stream.write_all(bytes).map_err(|e| self.io(e))
    }

    /// The next JSON reply, 0xFF bytes and blank lines skipped.
    fn read_reply(&mut self, command: &str, deadline: Instant) -> Result<Value, AgentError> {
        loop {
            while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                let text = String::from_utf8_lossy(&line);
                let text = text.trim();
                if text.is_empty() {
                    continue;
                }
                match serde_json::from_str::<Value>(text) {
                    Ok(value) => return Ok(value),
                    // A fragment of a reply from before our 0xFF: skip it.
                    Err(_) => continue,
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(AgentError::NoAnswer {
                    path: self.path.clone(),
                    command: command.to_owned(),
                    after: left,
                });
            }
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|e| self.io(e))?;
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    return Err(self.io(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "closed by QEMU",
                    )));
                }
                Ok(n) => {
                    self.pending.extend_from_slice(&chunk[..n]);
                    // The agent writes 0xFF just before a sync reply:
                    // whatever came before it is an earlier client's.
                    if let Some(at) = self.pending.iter().rposition(|&b| b == 0xFF) {
                        self.pending.drain(..=at);
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(AgentError::NoAnswer {
                        path: self.path.clone(),
                        command: command.to_owned(),
                        after: left,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io(e)),
            }
        }
    }

    fn io(&self, e: io::Error) -> AgentError {
        AgentError::Io {
            path: self.path.clone(),
            error: e.to_string(),
        }
    }
}

fn decode(field: &Value) -> Result<Vec<u8>, AgentError> {
    match field {
        Value::Null => Ok(Vec::new()),
        Value::String(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| AgentError::BadReply {
                command: "guest-exec-status".into(),
                reply: format!("output is not base64: {e}"),
            }),
        other => Err(AgentError::BadReply {
            command: "guest-exec-status".into(),
            reply: other.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixListener;

    /// A fake agent that answers a stale reply first, then the protocol.
    #[test]
    fn syncs_past_stale_replies_and_runs_a_command() {
        let dir = std::env::temp_dir().join(format!("fixup-e2e-qga-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("qga.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut out = stream.try_clone().unwrap();
            // Left over from an earlier client.
            out.write_all(b"{\"return\": {\"pid\": 1}}\n\xff{\"ret")
                .unwrap();
            let mut reader = BufReader::new(stream);
            let mut polls = 0;
            loop {
                let mut line = Vec::new();
                if reader.read_until(b'\n', &mut line).unwrap() == 0 {
                    return;
                }
                let line: Vec<u8> = line.into_iter().filter(|&b| b != 0xFF).collect();
                let request: Value = serde_json::from_slice(&line).unwrap();
                let reply = match request["execute"].as_str().unwrap() {
                    "guest-sync-delimited" => {
                        out.write_all(b"\xff").unwrap();
                        json!({"return": request["arguments"]["id"]})
                    }
                    "guest-exec" => {
                        assert_eq!(request["arguments"]["path"], "sh");
                        assert_eq!(request["arguments"]["arg"], json!(["-c", "exit 3"]));
                        json!({"return": {"pid": 42}})
                    }
                    "guest-exec-status" => {
                        polls += 1;
                        if polls < 2 {
                            json!({"return": {"exited": false}})
                        } else {
                            json!({"return": {"exited": true, "exitcode": 3,
                                "out-data": "aGk=", "err-data": "b29wcw=="}})
                        }
                    }
                    other => panic!("unexpected {other}"),
                };
                out.write_all(format!("{reply}\n").as_bytes()).unwrap();
            }
        });
        let mut agent = Agent::connect(&path, Duration::from_secs(5)).unwrap();
        let exit = agent
            .exec(
                "sh",
                &["-c".to_owned(), "exit 3".to_owned()],
                Duration::from_secs(5),
            )
            .unwrap();
        assert_eq!(exit.code, Some(3));
        assert_eq!(exit.stdout_text(), "hi");
        assert_eq!(exit.stderr_text(), "oops");
        assert_eq!(exit.cli_status(), 3);
        drop(agent);
        server.join().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
