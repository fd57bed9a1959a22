//! One connection to SAC and the protocol of spec section 10 over it:
//! [`Session::open`] connects and waits for the prompt, then
//! [`Session::enumerate`] lists the interfaces and [`Session::set_static`]
//! sets and checks one address. The steps are separate so that a caller
//! can look at its pod between them; [`crate::run_pass`] runs them all.
//!
//! Every wait is bounded by a [`Budgets`] value and sliced into pieces of
//! at most [`Budgets::stop_poll`], with the [`StopCheck`] check consulted
//! between the pieces.

use std::fmt;
use std::io::{self, ErrorKind};
use std::time::{Duration, Instant};

use crate::console::{Dial, DialError, Transport};
use crate::error::Step;
use crate::line::Line;
use crate::listing::{interfaces, listings, lists};
use crate::transcript::{Exchange, Reply, Transcript};
use crate::{Budgets, Deadline, SacError, StaticNic, StopCheck};

/// What marks a finished answer, and a ready console.
const PROMPT: &[u8] = b"SAC>";

/// Bytes read from the console at a time.
const CHUNK: usize = 4096;

/// The cause when the console went away.
const CLOSED: &str = "the console closed the connection";

/// An open console with SAC at its prompt. Dropping it closes the
/// connection.
pub struct Session {
    conn: Box<dyn Transport>,
    budgets: Budgets,
    stop: StopCheck,
    /// The pass's total deadline, if the caller gave one.
    deadline: Option<Deadline>,
    transcript: Transcript,
    /// Set once a read saw the end of the stream or a read or write failed:
    /// every later command fails at once.
    closed: bool,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("budgets", &self.budgets)
            .field("closed", &self.closed)
            .field("exchanges", &self.transcript.entries().count())
            .finish_non_exhaustive()
    }
}

/// Why a command got no answer.
enum Fail {
    Stopped,
    /// The pass's total deadline passed.
    OutOfTime,
    NoAnswer(String),
}

/// How waiting for the first prompt ended.
enum PromptEnd {
    Ready,
    /// The dial budget ran out on an open connection.
    OutOfTime,
    Closed(String),
    Stopped,
    /// The pass's total deadline passed.
    PassOver,
}

impl Session {
    /// Connects through `dial` and waits for `SAC>` (spec section 10,
    /// steps 1 and 2), without a total deadline: [`Session::open_until`].
    pub fn open(
        dial: &mut dyn Dial,
        budgets: &Budgets,
        stop: StopCheck,
    ) -> Result<Session, SacError> {
        Session::open_until(dial, budgets, stop, None)
    }

    /// Connects through `dial` and waits for `SAC>` (spec section 10,
    /// steps 1 and 2). Connection tries run within [`Budgets::dial_total`]
    /// (60 s): each has [`Budgets::connect_try`] (5 s) and a failed one is
    /// repeated after [`Budgets::connect_retry`] (2 s). Once connected, the
    /// prompt has its own [`Budgets::prompt_total`] (60 s): an empty line
    /// is sent every [`Budgets::prompt_read`] (5 s) until an answer holds
    /// `SAC>`. A connection that closes while waiting is dialled again,
    /// while the dial budget lasts.
    ///
    /// `stop` and `deadline` (the pass's total deadline) stay with the
    /// session and bound every later step; past the deadline a step fails
    /// with [`SacError::Deadline`].
    pub fn open_until(
        dial: &mut dyn Dial,
        budgets: &Budgets,
        stop: StopCheck,
        deadline: Option<Deadline>,
    ) -> Result<Session, SacError> {
        let dial_end = Instant::now() + budgets.dial_total;
        let over = |at: Instant| deadline.is_some_and(|d| at >= d.at);
        let cut = |at: Instant| deadline.map_or(at, |d| at.min(d.at));
        let out_of_time = || SacError::Deadline {
            step: Step::Dial,
            total: deadline.map_or(Duration::ZERO, |d| d.total),
        };
        let mut transcript = Transcript::default();
        let mut tries = 0u32;
        let mut empty_lines = 0u32;
        let mut cause = None;
        let mut out_of_time_at_prompt = false;
        loop {
            if stop.is_set() {
                return Err(SacError::Stopped);
            }
            let now = Instant::now();
            if over(now) {
                return Err(out_of_time());
            }
            let left = cut(dial_end).saturating_duration_since(now);
            if left.is_zero() {
                break;
            }
            tries += 1;
            match dial.dial(budgets.connect_try.min(left), &stop) {
                Ok(conn) => {
                    let mut session = Session {
                        conn,
                        budgets: budgets.clone(),
                        stop: stop.clone(),
                        deadline,
                        transcript: std::mem::take(&mut transcript),
                        closed: false,
                    };
                    let prompt_end = Instant::now() + budgets.prompt_total;
                    match session.await_prompt(prompt_end, &mut empty_lines) {
                        PromptEnd::Ready => return Ok(session),
                        PromptEnd::Stopped => return Err(SacError::Stopped),
                        PromptEnd::PassOver => return Err(out_of_time()),
                        PromptEnd::OutOfTime => {
                            out_of_time_at_prompt = true;
                            break;
                        }
                        PromptEnd::Closed(why) => {
                            cause = Some(format!("{}: {why}", dial.describe()));
                            transcript = session.transcript;
                        }
                    }
                }
                Err(DialError::Retry(why)) => {
                    cause = Some(format!("cannot connect to {}: {why}", dial.describe()));
                }
                Err(DialError::Refused(error)) => return Err(error),
                Err(DialError::Stopped) => return Err(SacError::Stopped),
            }
            let pause = budgets
                .connect_retry
                .min(cut(dial_end).saturating_duration_since(Instant::now()));
            if !stop.sleep(pause, budgets.poll()) {
                return Err(SacError::Stopped);
            }
        }
        if over(Instant::now()) {
            return Err(out_of_time());
        }
        let cause = match cause {
            Some(cause) if !out_of_time_at_prompt => format!(
                "{cause} ({tries} tries in {}); check that the VM is running and that Cloud Hypervisor serves its serial console on that socket",
                crate::go_duration(budgets.dial_total)
            ),
            _ => {
                format!(
                    "no `SAC>` prompt from {} within {} ({empty_lines} empty lines sent); check that the guest runs Windows with the Special Administration Console enabled on its serial port (EMS)",
                    dial.describe(),
                    crate::go_duration(budgets.prompt_total)
                )
            }
        };
        Err(SacError::Dial { cause })
    }

    /// Replaces the pass's total deadline for the steps that follow (each
    /// console action of a task carries it).
    pub fn set_deadline(&mut self, deadline: Option<Deadline>) {
        self.deadline = deadline;
    }

    /// Lists the guest's interfaces (spec section 10, step 4): sends `i`
    /// until at least `need` (the VM record's NIC count, static and DHCP
    /// alike) are listed, at most [`Budgets::enum_tries`] (60) times,
    /// [`Budgets::enum_interval`] (2 s) apart. A try without an answer
    /// counts; once the console has closed, no later try can be answered,
    /// so the remaining ones are not waited out.
    ///
    /// Returns the net numbers in order of first appearance, without
    /// repeats: position `i` belongs to the record's NIC `i`.
    pub fn enumerate(&mut self, need: usize) -> Result<Vec<u32>, SacError> {
        let mut found = Vec::new();
        for attempt in 1..=self.budgets.enum_tries {
            if attempt > 1 {
                self.pause(self.budgets.enum_interval, Step::Enum)?;
            }
            self.check(Step::Enum)?;
            match self.command(&Line::query()) {
                Ok(answer) => {
                    found = interfaces(&listings(&answer));
                    if found.len() >= need {
                        return Ok(found);
                    }
                }
                Err(Fail::Stopped) => return Err(SacError::Stopped),
                Err(Fail::OutOfTime) => return Err(self.out_of_time(Step::Enum)),
                Err(Fail::NoAnswer(_)) if self.closed => break,
                Err(Fail::NoAnswer(_)) => {}
            }
        }
        Err(SacError::EnumExhausted {
            found: found.len(),
            need,
        })
    }

    /// Sets `nic`'s address on interface `net` and checks that it took
    /// effect (spec section 10, steps 6 and 7): `i <net> <ip> <mask>
    /// <gateway>`, then `i`, until one listing pairs `net` with exactly
    /// `nic.ip`; at most [`Budgets::set_rounds`] (10) rounds,
    /// [`Budgets::set_interval`] (2 s) apart. A set line without an answer
    /// ends the pass at once ([`SacError::SetIp`]); a check without one
    /// only costs its round.
    ///
    /// The stop check is consulted before each set line. An invalid
    /// prefix is refused before anything is sent.
    pub fn set_static(&mut self, net: u32, nic: &StaticNic) -> Result<(), SacError> {
        let set = Line::set(net, nic.ip, nic.mask()?, nic.gateway);
        let ip = nic.ip.to_string();
        let verify = Step::Verify { net, ip: nic.ip };
        for round in 1..=self.budgets.set_rounds {
            if round > 1 {
                self.pause(self.budgets.set_interval, verify)?;
            }
            self.check(Step::Set { net })?;
            match self.command(&set) {
                Ok(_) => {}
                Err(Fail::Stopped) => return Err(SacError::Stopped),
                Err(Fail::OutOfTime) => return Err(self.out_of_time(Step::Set { net })),
                Err(Fail::NoAnswer(cause)) => return Err(SacError::SetIp { net, cause }),
            }
            match self.command(&Line::query()) {
                Ok(answer) if lists(&listings(&answer), net, &ip) => return Ok(()),
                Ok(_) | Err(Fail::NoAnswer(_)) => {}
                Err(Fail::Stopped) => return Err(SacError::Stopped),
                Err(Fail::OutOfTime) => return Err(self.out_of_time(verify)),
            }
        }
        Err(SacError::VerifyExhausted { net, ip: nic.ip })
    }

    /// The exchanges so far (bounded: [`crate::TRANSCRIPT_MAX`]).
    pub fn transcript(&self) -> &Transcript {
        &self.transcript
    }

    /// Closes the connection and keeps the exchanges.
    pub fn into_transcript(self) -> Transcript {
        self.transcript
    }

    /// Whether the pass's total deadline has passed.
    fn over(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d.at)
    }

    fn out_of_time(&self, step: Step) -> SacError {
        SacError::Deadline {
            step,
            total: self.deadline.map_or(Duration::ZERO, |d| d.total),
        }
    }

    /// Before a step: a stop, or the pass's deadline passed during `step`.
    fn check(&self, step: Step) -> Result<(), SacError> {
        if self.stop.is_set() {
            Err(SacError::Stopped)
        } else if self.over() {
            Err(self.out_of_time(step))
        } else {
            Ok(())
        }
    }

    /// Pauses for `span`, never past the pass's deadline (then it is over
    /// during `step`).
    fn pause(&self, span: Duration, step: Step) -> Result<(), SacError> {
        let span = match self.deadline {
            Some(d) => span.min(d.at.saturating_duration_since(Instant::now())),
            None => span,
        };
        if !self.stop.sleep(span, self.budgets.poll()) {
            return Err(SacError::Stopped);
        }
        self.check(step)
    }

    /// Step 2: empty lines until `SAC>` shows, or `deadline`; `sent`
    /// counts the lines.
    fn await_prompt(&mut self, deadline: Instant, sent: &mut u32) -> PromptEnd {
        let line = Line::prompt();
        loop {
            let now = Instant::now();
            if now >= deadline {
                return PromptEnd::OutOfTime;
            }
            let until = deadline.min(now + self.budgets.prompt_read);
            *sent += 1;
            let outcome = match self.send(&line) {
                Ok(()) => self.scan_for_prompt(until),
                Err(fail) => Err(fail),
            };
            let reply = match &outcome {
                Ok(Some(bytes)) => Reply::Answered { bytes: *bytes },
                Ok(None) => Reply::NoAnswer {
                    cause: format!("no `SAC>` within {}", crate::go_duration(until - now)),
                },
                Err(Fail::NoAnswer(cause)) => Reply::NoAnswer {
                    cause: cause.clone(),
                },
                Err(Fail::Stopped) => return PromptEnd::Stopped,
                Err(Fail::OutOfTime) => return PromptEnd::PassOver,
            };
            self.transcript.push(Exchange {
                line: String::new(),
                reply,
            });
            match outcome {
                Ok(Some(_)) => return PromptEnd::Ready,
                Ok(None) => {}
                Err(Fail::NoAnswer(cause)) => return PromptEnd::Closed(cause),
                Err(Fail::Stopped) => return PromptEnd::Stopped,
                Err(Fail::OutOfTime) => return PromptEnd::PassOver,
            }
        }
    }

    /// Reads until `SAC>` shows (the byte count read) or `until` (`None`).
    /// Keeps only the last bytes of what was read, so a flood costs no
    /// memory.
    fn scan_for_prompt(&mut self, until: Instant) -> Result<Option<usize>, Fail> {
        let mut chunk = [0u8; CHUNK];
        let mut window: Vec<u8> = Vec::with_capacity(CHUNK + PROMPT.len());
        let mut total = 0usize;
        while Instant::now() < until {
            let n = self.read_some(&mut chunk, until)?;
            total = total.saturating_add(n);
            let keep = window.len().min(PROMPT.len() - 1);
            window.drain(..window.len() - keep);
            window.extend_from_slice(&chunk[..n]);
            if find(&window, PROMPT).is_some() {
                return Ok(Some(total));
            }
        }
        Ok(None)
    }

    /// Step 3: drain, send, collect the answer up to `SAC>`; the exchange
    /// goes into the transcript.
    fn command(&mut self, line: &Line) -> Result<Vec<u8>, Fail> {
        let outcome = self.exchange(line);
        let reply = match &outcome {
            Ok(answer) => Reply::Answered {
                bytes: answer.len(),
            },
            Err(Fail::NoAnswer(cause)) => Reply::NoAnswer {
                cause: cause.clone(),
            },
            Err(Fail::Stopped) => Reply::NoAnswer {
                cause: "stopped".to_owned(),
            },
            Err(Fail::OutOfTime) => Reply::NoAnswer {
                cause: "the pass's total deadline passed".to_owned(),
            },
        };
        self.transcript.push(Exchange {
            line: line.as_str().to_owned(),
            reply,
        });
        outcome
    }

    fn exchange(&mut self, line: &Line) -> Result<Vec<u8>, Fail> {
        if self.closed {
            return Err(Fail::NoAnswer(CLOSED.to_owned()));
        }
        self.drain()?;
        self.send(line)?;
        self.read_answer()
    }

    /// Reads and throws away whatever arrives within [`Budgets::drain`]
    /// (200 ms), so stale output is not taken for the next answer.
    fn drain(&mut self) -> Result<(), Fail> {
        let until = Instant::now() + self.budgets.drain;
        let mut chunk = [0u8; CHUNK];
        while Instant::now() < until {
            self.read_some(&mut chunk, until)?;
        }
        Ok(())
    }

    fn send(&mut self, line: &Line) -> Result<(), Fail> {
        let written = self
            .conn
            .write_all(&line.wire())
            .and_then(|()| self.conn.flush());
        written.map_err(|e| self.broken(&e, "write"))
    }

    /// The answer: what was read up to and including the first `SAC>`,
    /// within [`Budgets::answer`] (5 s) and [`Budgets::answer_max`]
    /// (64 KiB). Bytes after that `SAC>` are not the answer; the next
    /// command's drain takes them.
    fn read_answer(&mut self) -> Result<Vec<u8>, Fail> {
        let max = self.budgets.answer_max;
        let until = Instant::now() + self.budgets.answer;
        let mut answer = Vec::new();
        let mut chunk = [0u8; CHUNK];
        while Instant::now() < until {
            let n = self.read_some(&mut chunk, until)?;
            if n == 0 {
                continue;
            }
            let from = answer.len().saturating_sub(PROMPT.len() - 1);
            let take = n.min(max - answer.len());
            answer.extend_from_slice(&chunk[..take]);
            if let Some(at) = find(&answer[from..], PROMPT) {
                answer.truncate(from + at + PROMPT.len());
                return Ok(answer);
            }
            if answer.len() >= max {
                return Err(Fail::NoAnswer(format!(
                    "the answer grew past {max} bytes without `SAC>`"
                )));
            }
        }
        Err(Fail::NoAnswer(format!(
            "no `SAC>` answer within {}",
            crate::go_duration(self.budgets.answer)
        )))
    }

    /// One read of at most [`Budgets::stop_poll`] and no later than
    /// `until`: the bytes read, 0 when none came. The end of the stream or
    /// a read error closes the session.
    fn read_some(&mut self, chunk: &mut [u8], until: Instant) -> Result<usize, Fail> {
        if self.stop.is_set() {
            return Err(Fail::Stopped);
        }
        let until = match self.deadline {
            Some(d) if Instant::now() >= d.at => return Err(Fail::OutOfTime),
            Some(d) => until.min(d.at),
            None => until,
        };
        let wait = until
            .saturating_duration_since(Instant::now())
            .min(self.budgets.poll())
            .max(Duration::from_millis(1));
        if let Err(e) = self.conn.set_read_timeout(wait) {
            return Err(self.broken(&e, "read"));
        }
        match self.conn.read(chunk) {
            Ok(0) => {
                self.closed = true;
                Err(Fail::NoAnswer(CLOSED.to_owned()))
            }
            Ok(n) => Ok(n),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                Ok(0)
            }
            Err(e) => Err(self.broken(&e, "read")),
        }
    }

    /// A failed read or write: the session is closed from now on.
    fn broken(&mut self, e: &io::Error, what: &str) -> Fail {
        self.closed = true;
        match e.kind() {
            ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::NotConnected => {
                Fail::NoAnswer(CLOSED.to_owned())
            }
            _ => Fail::NoAnswer(format!("console {what} failed: {e}")),
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Nic, run_pass};
    use std::collections::VecDeque;
    use std::io::{Read, Write};
    use std::net::Ipv4Addr;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::thread;

    fn fast() -> Budgets {
        Budgets {
            dial_total: Duration::from_secs(2),
            connect_try: Duration::from_millis(100),
            connect_retry: Duration::from_millis(1),
            prompt_read: Duration::from_millis(50),
            drain: Duration::ZERO,
            answer: Duration::from_millis(200),
            enum_interval: Duration::from_millis(1),
            set_interval: Duration::from_millis(1),
            stop_poll: Duration::from_millis(5),
            ..Budgets::default()
        }
    }

    /// A console in memory: each complete line written is answered by
    /// `answer`; everything written is kept.
    struct Scripted {
        answer: fn(&str) -> &'static str,
        line: Vec<u8>,
        out: VecDeque<u8>,
        written: Arc<Mutex<Vec<u8>>>,
        timeout: Duration,
    }

    impl Read for Scripted {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.out.is_empty() {
                thread::sleep(self.timeout);
                return Err(ErrorKind::WouldBlock.into());
            }
            let n = buf.len().min(self.out.len());
            for (slot, byte) in buf.iter_mut().zip(self.out.drain(..n)) {
                *slot = byte;
            }
            Ok(n)
        }
    }

    impl Write for Scripted {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.written.lock().unwrap().extend_from_slice(buf);
            for &b in buf {
                self.line.push(b);
                if b == b'\n' {
                    let line = String::from_utf8(std::mem::take(&mut self.line)).unwrap();
                    let reply = (self.answer)(line.trim_end_matches("\r\n"));
                    self.out.extend(reply.as_bytes());
                }
            }
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Transport for Scripted {
        fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()> {
            self.timeout = timeout;
            Ok(())
        }
    }

    #[test]
    fn a_pass_over_any_transport() {
        let written = Arc::new(Mutex::new(Vec::new()));
        let dials = Arc::new(AtomicUsize::new(0));
        let mut dial = {
            let written = written.clone();
            let dials = dials.clone();
            move |_within: Duration| {
                // The first try finds nothing listening.
                if dials.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err(io::Error::from(ErrorKind::ConnectionRefused));
                }
                Ok(Scripted {
                    answer: |line| match line {
                        "" => "\r\nSAC>",
                        "i" => "Net: 2, Ip=10.0.0.9\r\nNet: 5, Ip=10.0.1.7\r\nSAC>",
                        _ => "SAC>",
                    },
                    line: Vec::new(),
                    out: VecDeque::new(),
                    written: written.clone(),
                    timeout: Duration::from_millis(1),
                })
            }
        };
        let nics = [
            Nic::Dhcp,
            Nic::Static(StaticNic {
                ip: Ipv4Addr::new(10, 0, 1, 7),
                prefix: Some(20),
                gateway: None,
            }),
        ];
        let pass = run_pass(&mut dial, &nics, &fast(), StopCheck::never());
        assert_eq!(pass.result, Ok(vec![2, 5]));
        assert_eq!(dials.load(Ordering::SeqCst), 2);
        assert_eq!(
            String::from_utf8(written.lock().unwrap().clone()).unwrap(),
            "\r\ni\r\ni 5 10.0.1.7 255.255.240.0 \r\ni\r\n"
        );
    }

    fn scripted(answer: fn(&str) -> &'static str) -> Scripted {
        Scripted {
            answer,
            line: Vec::new(),
            out: VecDeque::new(),
            written: Arc::default(),
            timeout: Duration::from_millis(1),
        }
    }

    #[test]
    fn bytes_after_the_prompt_are_not_the_answer() {
        let mut dial = |_within: Duration| {
            Ok(scripted(|line| match line {
                "" => "\r\nSAC>",
                _ => "Net: 2, Ip=10.0.0.9\r\nSAC>Net: 9, Ip=10.0.0.8\r\nSAC>",
            }))
        };
        let mut session = Session::open(&mut dial, &fast(), StopCheck::never()).unwrap();
        assert_eq!(session.enumerate(1), Ok(vec![2]));
        let answered = session.transcript().entries().last().unwrap().reply.clone();
        assert_eq!(
            answered,
            Reply::Answered {
                bytes: "Net: 2, Ip=10.0.0.9\r\nSAC>".len()
            }
        );
    }

    /// Output that never ends and never holds `SAC>` after the first
    /// prompt; counts what was read from it.
    struct Flood {
        read: Arc<AtomicUsize>,
    }

    impl Read for Flood {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let start = self.read.fetch_add(buf.len(), Ordering::SeqCst);
            for (i, slot) in buf.iter_mut().enumerate() {
                *slot = if start + i < PROMPT.len() {
                    PROMPT[start + i]
                } else {
                    b'x'
                };
            }
            Ok(buf.len())
        }
    }

    impl Write for Flood {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Transport for Flood {
        fn set_read_timeout(&mut self, _timeout: Duration) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_flood_is_read_no_further_than_the_limit() {
        let read = Arc::new(AtomicUsize::new(0));
        let mut dial = {
            let read = read.clone();
            move |_within: Duration| Ok(Flood { read: read.clone() })
        };
        let budgets = Budgets {
            answer: Duration::from_secs(60),
            ..fast()
        };
        let mut session = Session::open(&mut dial, &budgets, StopCheck::never()).unwrap();
        let after_prompt = read.load(Ordering::SeqCst);
        let nic = StaticNic {
            ip: Ipv4Addr::new(10, 0, 0, 5),
            prefix: None,
            gateway: None,
        };
        assert_eq!(
            session.set_static(1, &nic),
            Err(SacError::SetIp {
                net: 1,
                cause: "the answer grew past 65536 bytes without `SAC>`".into()
            })
        );
        assert_eq!(read.load(Ordering::SeqCst) - after_prompt, 64 * 1024);
    }

    /// The pass's total deadline ends the open of a console that never
    /// shows the prompt (long before the 60 s of the prompt's own budget),
    /// and a set whose console answers too slowly, as that step's failure.
    #[test]
    fn the_total_deadline_ends_each_step() {
        let total = Duration::from_millis(150);
        let dial = &mut |_within: Duration| Ok(scripted(|_| ""));
        let started = Instant::now();
        let err = Session::open_until(
            dial,
            &Budgets::default(),
            StopCheck::never(),
            Some(Deadline::after(total, total)),
        )
        .unwrap_err();
        assert_eq!(
            err,
            SacError::Deadline {
                step: Step::Dial,
                total
            }
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        // Every set line is answered, but the address never shows: the
        // rounds run into the deadline while checking.
        let dial = &mut |_within: Duration| {
            Ok(scripted(|line| match line {
                "" => "\r\nSAC>",
                _ => "Net: 2, Ip=10.0.0.9\r\nSAC>",
            }))
        };
        let budgets = Budgets {
            set_interval: Duration::from_millis(40),
            ..fast()
        };
        let mut session = Session::open_until(
            dial,
            &budgets,
            StopCheck::never(),
            Some(Deadline::after(total, total)),
        )
        .unwrap();
        let nic = StaticNic {
            ip: Ipv4Addr::new(10, 0, 0, 5),
            prefix: None,
            gateway: None,
        };
        let err = session.set_static(2, &nic).unwrap_err();
        assert_eq!(
            err,
            SacError::Deadline {
                step: Step::Verify { net: 2, ip: nic.ip },
                total
            }
        );
        // Past the deadline, the next set fails before a line is sent.
        let sent = session.transcript().entries().count();
        assert_eq!(
            session.set_static(2, &nic),
            Err(SacError::Deadline {
                step: Step::Set { net: 2 },
                total
            })
        );
        assert_eq!(session.transcript().entries().count(), sent);
    }

    #[test]
    fn a_stop_ends_the_prompt_wait_of_a_silent_console() {
        let dial = &mut |_within: Duration| Ok(scripted(|_| ""));
        let calls = Arc::new(AtomicUsize::new(0));
        let stop = {
            let calls = calls.clone();
            StopCheck::when(move || calls.fetch_add(1, Ordering::SeqCst) >= 3)
        };
        let err = Session::open(dial, &Budgets::default(), stop).unwrap_err();
        assert_eq!(err, SacError::Stopped);
    }
}
