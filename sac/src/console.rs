//! Reaching the console: the [`Transport`] a pass talks over, the [`Dial`]
//! seam that makes one, and [`ConsoleSocket`], the Cloud Hypervisor serial
//! console at `<cocoon root>/run/cloudhypervisor/<vm id>/console.sock`,
//! confined to the cocoon root (spec section 10, "Channel").
//!
//! # Confinement
//!
//! The VM id is first checked to be exactly one path component, by the
//! rules the disk probe uses (spec section 2): 1..=128 of `A-Z a-z 0-9 . _
//! -`, not starting with `-` or `.`, no `..`. Then every try walks the path
//! with directory descriptors:
//!
//! 1. The root is opened as given (it is the operator's choice and may be a
//!    link itself).
//! 2. `run`, `cloudhypervisor` and `<vm id>` are each opened relative to the
//!    one before with `O_DIRECTORY | O_NOFOLLOW`, so a symbolic link at any
//!    of them fails the open instead of being followed. A rename after an
//!    open changes nothing: the descriptor stays on the directory that was
//!    checked.
//! 3. `console.sock` is opened in the VM's directory with `O_PATH |
//!    O_NOFOLLOW` (a descriptor of the entry itself, never followed) and
//!    looked at with `fstat`: anything but a socket (a link, a file, a
//!    directory) is refused.
//! 4. The connection goes to `/proc/self/fd/<socket entry fd>`. The kernel
//!    resolves that to the inode the descriptor holds, the socket checked
//!    in step 3, without looking any name up again: replacing the entry
//!    after step 3 does not change where the connection goes. The path is
//!    also short whatever the root's length, so `sockaddr_un`'s 108-byte
//!    limit never bites.
//!
//! A missing entry is worth another try (Cloud Hypervisor creates the
//! socket as the VM starts); a link or a non-socket is not, and ends the
//! pass with [`SacError::Refused`].

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use rustix::net::{AddressFamily, SendFlags, SocketAddrUnix, SocketFlags, SocketType};

use crate::{SacError, StopCheck};

/// Where, below the cocoon root, cocoon keeps Cloud Hypervisor VM state.
const RUN_DIRS: [&str; 2] = ["run", "cloudhypervisor"];

/// The console socket's name in a VM's state directory.
pub const CONSOLE_SOCKET: &str = "console.sock";

/// The longest VM id (spec section 2), as the disk probe takes it.
pub const MAX_VM_ID_LEN: usize = 128;

/// How often a connect to a listener whose queue is full is tried again
/// within one try: 20 ms. Also the longest stretch without consulting the
/// stop check while connecting.
const CONNECT_POLL: Duration = Duration::from_millis(20);

const FIX_ID: &str =
    "check `id` in `cocoon vm inspect <id> --json` and annotation vm.cocoonstack.io/id";
const FIX_PROC: &str =
    "mount /proc in the host's mount namespace (the host reaches the console through it)";
const FIX_ROOT: &str = "pass the right directory with `--cocoon-root` (default /var/lib/cocoon)";
const FIX_LINK: &str = "cocoon's VM state holds no links: remove the link, and point `--cocoon-root` at the real directory if the state was moved";
const FIX_NOT_DIR: &str = "remove it; cocoon recreates the VM's state directory";
const FIX_NOT_SOCKET: &str = "check that Cloud Hypervisor serves this VM's serial console on that socket, and remove whatever else is there";

/// A byte stream to the console. Reads must honour
/// [`Transport::set_read_timeout`], so that no wait outlasts its budget
/// and the stop check is consulted in between.
pub trait Transport: Read + Write + Send {
    /// How long each following read may wait for data (never zero). A read
    /// that times out fails with [`io::ErrorKind::WouldBlock`] or
    /// [`io::ErrorKind::TimedOut`]; `Ok(0)` means the console closed.
    fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()>;
}

/// For tests and tools that hold a plain std stream. Its writes can raise
/// SIGPIPE in a program that does not ignore it; [`ConsoleSocket`]'s
/// connections cannot.
impl Transport for UnixStream {
    fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        UnixStream::set_read_timeout(self, Some(timeout))
    }
}

/// Why one connection try failed.
#[derive(Debug)]
pub enum DialError {
    /// Worth another try after [`crate::Budgets::connect_retry`]: nothing
    /// listens yet, the socket or its directory does not exist yet, the
    /// listener's queue stayed full. The text is the cause for messages.
    Retry(String),
    /// Not worth another try: the pass ends with this error.
    Refused(SacError),
    /// The stop check said to stop during the try.
    Stopped,
}

/// Makes connections to the console: [`ConsoleSocket`] in production, any
/// closure `FnMut(Duration) -> io::Result<T>` over a [`Transport`] `T` in
/// tests (an `Err` is then worth another try).
pub trait Dial {
    /// One try, taking at most `within`; a try that waits consults `stop`
    /// in between.
    fn dial(&mut self, within: Duration, stop: &StopCheck)
    -> Result<Box<dyn Transport>, DialError>;

    /// What is dialled, for messages.
    fn describe(&self) -> String {
        "the console".to_owned()
    }
}

impl<F, T> Dial for F
where
    F: FnMut(Duration) -> io::Result<T>,
    T: Transport + 'static,
{
    fn dial(
        &mut self,
        within: Duration,
        _stop: &StopCheck,
    ) -> Result<Box<dyn Transport>, DialError> {
        match self(within) {
            Ok(transport) => Ok(Box::new(transport)),
            Err(e) => Err(DialError::Retry(e.to_string())),
        }
    }
}

/// The serial console of one Cloud Hypervisor VM below a cocoon root. See
/// the module docs for how it stays inside the root.
#[derive(Debug, Clone)]
pub struct ConsoleSocket {
    root: PathBuf,
    vm_id: String,
}

impl ConsoleSocket {
    /// The console of `vm_id` below `cocoon_root`. Only the id is checked
    /// here ([`SacError::Invalid`] for one that is not a single path
    /// component); the path is checked on every connection try.
    pub fn new(cocoon_root: impl Into<PathBuf>, vm_id: &str) -> Result<ConsoleSocket, SacError> {
        check_vm_id(vm_id)?;
        Ok(ConsoleSocket {
            root: cocoon_root.into(),
            vm_id: vm_id.to_owned(),
        })
    }

    /// The socket's path, for messages; never opened as a whole.
    pub fn path(&self) -> PathBuf {
        self.root
            .join(RUN_DIRS[0])
            .join(RUN_DIRS[1])
            .join(&self.vm_id)
            .join(CONSOLE_SOCKET)
    }

    /// Steps 1 and 2 of the module docs: the VM's state directory, no link
    /// followed below the root.
    fn open_vm_dir(&self) -> Result<OwnedFd, DialError> {
        let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let mut dir = rustix::fs::open(&self.root, dir_flags, Mode::empty()).map_err(|e| {
            DialError::Refused(SacError::Refused {
                path: self.root.clone(),
                problem: format!("cannot open the cocoon root: {}", io::Error::from(e)),
                fix: FIX_ROOT,
            })
        })?;
        let mut path = self.root.clone();
        for name in [RUN_DIRS[0], RUN_DIRS[1], self.vm_id.as_str()] {
            path.push(name);
            dir = match rustix::fs::openat(&dir, name, dir_flags | OFlags::NOFOLLOW, Mode::empty())
            {
                Ok(next) => next,
                // The entry is there but is a link (LOOP) or no
                // directory (NOTDIR): say which. Should it have become a
                // directory meanwhile, the next try will see.
                Err(e @ (Errno::LOOP | Errno::NOTDIR)) => {
                    let kind = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)
                        .map(|st| FileType::from_raw_mode(st.st_mode));
                    return Err(match kind {
                        Ok(kind) if kind != FileType::Directory => {
                            refuse(kind, FileType::Directory, &path)
                        }
                        _ => retry(&path, e),
                    });
                }
                Err(e) => return Err(retry(&path, e)),
            };
        }
        Ok(dir)
    }

    /// Steps 1 to 4 of the module docs.
    fn connect(&self, within: Duration, stop: &StopCheck) -> Result<ConsoleStream, DialError> {
        let dir = self.open_vm_dir()?;
        let path = self.path();
        let entry = socket_entry(&dir, &path)?;
        connect_entry(&entry, &path, within, stop)
    }
}

/// Step 3 of the module docs: a descriptor of the VM directory's
/// `console.sock` entry itself, refused unless it is a socket.
fn socket_entry(dir: &OwnedFd, path: &Path) -> Result<OwnedFd, DialError> {
    let entry = rustix::fs::openat(
        dir,
        CONSOLE_SOCKET,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| retry(path, e))?;
    match rustix::fs::fstat(&entry) {
        Ok(st) => match FileType::from_raw_mode(st.st_mode) {
            FileType::Socket => Ok(entry),
            kind => Err(refuse(kind, FileType::Socket, path)),
        },
        Err(e) => Err(retry(path, e)),
    }
}

/// Step 4 of the module docs: a non-blocking connect to the socket
/// `entry` holds, tried again every [`CONNECT_POLL`] while the listener's
/// queue is full, for at most `within`.
fn connect_entry(
    entry: &OwnedFd,
    path: &Path,
    within: Duration,
    stop: &StopCheck,
) -> Result<ConsoleStream, DialError> {
    let via = format!("/proc/self/fd/{}", entry.as_raw_fd());
    // The descriptor's own path exists whenever /proc is mounted: without
    // it no connection can be confined, and no retry helps.
    if !Path::new(&via).exists() {
        return Err(DialError::Refused(SacError::Refused {
            path: path.to_owned(),
            problem: "cannot be reached through /proc/self/fd, so the checked socket cannot be connected to without looking its name up again".to_owned(),
            fix: FIX_PROC,
        }));
    }
    let addr = SocketAddrUnix::new(via.as_str()).map_err(|e| retry(path, e))?;
    let socket = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
    .map_err(|e| retry(path, e))?;
    let end = Instant::now() + within;
    loop {
        match rustix::net::connect(&socket, &addr) {
            Ok(()) => break,
            Err(Errno::AGAIN | Errno::INTR) if Instant::now() < end => {
                if stop.is_set() {
                    return Err(DialError::Stopped);
                }
                thread::sleep(CONNECT_POLL.min(end.saturating_duration_since(Instant::now())));
            }
            Err(e) => return Err(retry(path, e)),
        }
    }
    let stream = UnixStream::from(socket);
    // Reads are bounded by read timeouts from here on.
    stream
        .set_nonblocking(false)
        .map_err(|e| DialError::Retry(format!("{}: {e}", path.display())))?;
    Ok(ConsoleStream(stream))
}

impl Dial for ConsoleSocket {
    fn dial(
        &mut self,
        within: Duration,
        stop: &StopCheck,
    ) -> Result<Box<dyn Transport>, DialError> {
        self.connect(within, stop)
            .map(|stream| Box::new(stream) as Box<dyn Transport>)
    }

    fn describe(&self) -> String {
        self.path().display().to_string()
    }
}

fn retry(path: &Path, e: Errno) -> DialError {
    DialError::Retry(format!("{}: {}", path.display(), io::Error::from(e)))
}

/// Refuses `path` for being a `kind` where a `want` (a directory or a
/// socket) belongs.
fn refuse(kind: FileType, want: FileType, path: &Path) -> DialError {
    let (problem, fix) = match (kind, want) {
        (FileType::Symlink, _) => ("is a symbolic link".to_owned(), FIX_LINK),
        (kind, FileType::Directory) => (
            format!("is {}, not a directory", describe_kind(kind)),
            FIX_NOT_DIR,
        ),
        (kind, _) => (
            format!("is {}, not a socket", describe_kind(kind)),
            FIX_NOT_SOCKET,
        ),
    };
    DialError::Refused(SacError::Refused {
        path: path.to_path_buf(),
        problem,
        fix,
    })
}

fn describe_kind(kind: FileType) -> &'static str {
    match kind {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "of an unknown kind",
    }
}

/// The VM id rules of the disk probe (spec section 2), repeated here so
/// that this crate stands on its own.
fn check_vm_id(id: &str) -> Result<(), SacError> {
    let problem = if id.is_empty() {
        "is empty"
    } else if id.len() > MAX_VM_ID_LEN {
        "is longer than 128 bytes"
    } else if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        "may only hold A-Z, a-z, 0-9, '.', '_' and '-' (one path component)"
    } else if id.starts_with(['-', '.']) {
        "must not start with '-' or '.'"
    } else if id.contains("..") {
        "must not contain \"..\""
    } else {
        return Ok(());
    };
    let shown: String = id.chars().take(64).collect();
    let more = if shown.len() < id.len() { "…" } else { "" };
    Err(SacError::Invalid {
        problem: format!("VM id {shown:?}{more} {problem}"),
        fix: FIX_ID,
    })
}

/// The production transport: a connected Unix stream whose writes never
/// raise SIGPIPE (`MSG_NOSIGNAL`), so a console that closes under the
/// pass is an error, not a dead process, whatever the embedding program
/// does with signals.
#[derive(Debug)]
struct ConsoleStream(UnixStream);

impl Read for ConsoleStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for ConsoleStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        rustix::net::send(&self.0, buf, SendFlags::NOSIGNAL).map_err(io::Error::from)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Transport for ConsoleStream {
    fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        self.0.set_read_timeout(Some(timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    /// The entry checked is the socket connected to: replacing
    /// `console.sock` after the check, with a link to another listener or
    /// another socket, does not move the connection.
    #[rstest]
    #[case::by_a_link(true)]
    #[case::by_another_socket(false)]
    fn a_replaced_entry_does_not_move_the_connection(#[case] link: bool) {
        use std::os::unix::net::UnixListener;
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join(CONSOLE_SOCKET);
        let checked = UnixListener::bind(&sock).unwrap();
        let vm_dir = rustix::fs::open(
            dir.path(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let entry = socket_entry(&vm_dir, &sock).unwrap();
        // Someone swaps the entry between the check and the connect.
        let other_path = dir.path().join("other.sock");
        let other = UnixListener::bind(&other_path).unwrap();
        std::fs::rename(&sock, dir.path().join("moved.sock")).unwrap();
        if link {
            std::os::unix::fs::symlink(&other_path, &sock).unwrap();
        } else {
            std::fs::rename(&other_path, &sock).unwrap();
        }
        checked.set_nonblocking(true).unwrap();
        other.set_nonblocking(true).unwrap();
        connect_entry(&entry, &sock, Duration::from_secs(1), &StopCheck::never()).unwrap();
        assert!(
            checked.accept().is_ok(),
            "the checked socket got the connection"
        );
        assert!(other.accept().is_err(), "the replacement got nothing");
    }

    #[test]
    fn a_link_entry_is_refused_not_followed() {
        use std::os::unix::net::UnixListener;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real.sock");
        let _listener = UnixListener::bind(&target).unwrap();
        let sock = dir.path().join(CONSOLE_SOCKET);
        std::os::unix::fs::symlink(&target, &sock).unwrap();
        let vm_dir = rustix::fs::open(
            dir.path(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let err = socket_entry(&vm_dir, &sock).unwrap_err();
        assert!(matches!(err, DialError::Refused(_)), "{err:?}");
    }

    #[rstest]
    #[case::empty("", "is empty")]
    #[case::slash("/", "may only hold")]
    #[case::absolute("/abs", "may only hold")]
    #[case::nested("a/b", "may only hold")]
    #[case::parent("../x", "may only hold")]
    #[case::dotdot("..", "must not start with")]
    #[case::dot(".", "must not start with")]
    #[case::hidden(".vm", "must not start with")]
    #[case::option("-rf", "must not start with")]
    #[case::inner_dotdot("a..b", "must not contain")]
    #[case::nul("a\0b", "may only hold")]
    #[case::space("a b", "may only hold")]
    #[case::newline("a\nb", "may only hold")]
    #[case::non_ascii("vm-é", "may only hold")]
    #[case::too_long(&"a".repeat(129), "is longer than 128 bytes")]
    fn bad_vm_ids(#[case] id: &str, #[case] problem: &str) {
        let err = ConsoleSocket::new("/var/lib/cocoon", id).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, SacError::Invalid { .. }), "{err:?}");
        assert!(text.contains(problem), "{text}");
        assert!(text.ends_with(FIX_ID), "{text}");
        assert!(!text.contains('\0') && !text.contains('\n'), "{text:?}");
    }

    #[rstest]
    #[case::plain("vm-a")]
    #[case::uuid("0f8e2c1a-5b6d-4e7f-8a9b-0c1d2e3f4a5b")]
    #[case::dots_and_underscores("a.b_c")]
    #[case::longest(&"a".repeat(128))]
    fn good_vm_ids(#[case] id: &str) {
        let console = ConsoleSocket::new("/var/lib/cocoon", id).unwrap();
        assert_eq!(
            console.path(),
            Path::new("/var/lib/cocoon/run/cloudhypervisor")
                .join(id)
                .join("console.sock")
        );
    }
}
