//! Directories and files the host trusts: the plugin directory and its
//! plugin files, the precompiled cache and its key.
//!
//! A file the host runs, or deserializes as native code, must be one that
//! only root or the user the host runs as could have written. The rules:
//!
//! - **Every directory on the way** (the path is resolved once, symlinks
//!   included, then walked from `/` by file descriptor, each step opened
//!   without following a link) is owned by root or the effective user and
//!   not writable by its group or others. One exception: a directory owned
//!   by root with the sticky bit (`/tmp`, mode 1777) may be writable by
//!   everyone, because there only an entry's owner may rename or remove it,
//!   and the next step down is checked to be root's or the effective
//!   user's: nobody else can swap it.
//! - **The directory itself** passes the same rule without the sticky
//!   exception: a world-writable directory lets anyone add or replace a
//!   file, sticky or not.
//! - **Each file** is opened relative to the directory's descriptor without
//!   following a link (`O_NOFOLLOW`: a symlink is refused, not followed),
//!   must be a regular file, owned by root or the effective user, and not
//!   writable by its group or others.
//!
//! A refusal names the path and says how to fix it.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

/// Group- and other-write permission bits.
const GROUP_OR_OTHER_WRITE: u32 = 0o022;
/// The sticky bit.
const STICKY: u32 = 0o1000;

/// Why a directory or file is not trusted.
#[derive(Debug, thiserror::Error)]
pub enum Untrusted {
    #[error(
        "{} is owned by uid {owner}, not by root or uid {euid} that cocoon-fixup runs as, so another user controls it: check what is in it, then `chown {euid} {}` if it is yours, else use another path",
        path.display(),
        path.display()
    )]
    Owner {
        path: PathBuf,
        owner: u32,
        euid: u32,
    },
    #[error(
        "{} is writable by its group or by others (mode {mode:04o}), so another user could change what is in it: run `chmod go-w {}`",
        path.display(),
        path.display()
    )]
    Writable { path: PathBuf, mode: u32 },
    #[error(
        "{} is a symbolic link, and links are not followed here (not even in the middle of a path): give the path it points to, or put the file or directory itself there",
        path.display()
    )]
    Symlink { path: PathBuf },
    #[error("{} is not a {expected}", path.display())]
    Kind {
        path: PathBuf,
        expected: &'static str,
    },
    #[error(
        "{} holds {size} bytes, more than the {max} such a file may hold: it is not read",
        path.display()
    )]
    TooLarge { path: PathBuf, size: u64, max: u64 },
    #[error("cannot check {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl Untrusted {
    /// The path the refusal is about.
    pub fn path(&self) -> &Path {
        match self {
            Untrusted::Owner { path, .. }
            | Untrusted::Writable { path, .. }
            | Untrusted::Symlink { path }
            | Untrusted::Kind { path, .. }
            | Untrusted::TooLarge { path, .. }
            | Untrusted::Io { path, .. } => path,
        }
    }

    /// Whether this is a plain I/O failure (a path that does not exist, no
    /// permission) rather than a refusal.
    pub fn is_io(&self) -> bool {
        matches!(self, Untrusted::Io { .. })
    }

    /// Whether this is a path that does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Untrusted::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// The user the host runs as.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

fn trusted_owner(uid: u32) -> bool {
    uid == 0 || uid == euid()
}

fn io_error(path: &Path, e: impl Into<io::Error>) -> Untrusted {
    Untrusted::Io {
        path: path.to_owned(),
        source: e.into(),
    }
}

/// `path` made absolute against the working directory (whose path the
/// kernel reports resolved), refusing `..`: with links refused too, the
/// path walked is the path meant.
fn absolute(path: &Path) -> Result<PathBuf, Untrusted> {
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(io_error(
            path,
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "the path has a `..` component: give it without one",
            ),
        ));
    }
    if path.is_absolute() {
        return Ok(path.to_owned());
    }
    Ok(std::env::current_dir()
        .map_err(|e| io_error(path, e))?
        .join(path))
}

/// A directory whose whole path passed the rules above, held open: every
/// entry is looked up relative to it.
#[derive(Debug)]
pub struct TrustedDir {
    path: PathBuf,
    fd: OwnedFd,
}

/// How a directory on the way is checked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    /// An ancestor: the sticky exception applies.
    Ancestor,
    /// The directory itself.
    Target,
}

fn check_dir(path: &Path, stat: &Stat, step: Step) -> Result<(), Untrusted> {
    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        return Err(Untrusted::Kind {
            path: path.to_owned(),
            expected: "directory",
        });
    }
    if !trusted_owner(stat.st_uid) {
        return Err(Untrusted::Owner {
            path: path.to_owned(),
            owner: stat.st_uid,
            euid: euid(),
        });
    }
    let mode = stat.st_mode & 0o7777;
    let sticky_root = step == Step::Ancestor && mode & STICKY != 0 && stat.st_uid == 0;
    if mode & GROUP_OR_OTHER_WRITE != 0 && !sticky_root {
        return Err(Untrusted::Writable {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(())
}

/// Open `name` in `dir` as a directory, without following a link.
fn open_dir_at(dir: impl AsFd, name: &OsStr, path: &Path) -> Result<OwnedFd, Untrusted> {
    let dir = dir.as_fd();
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::LOOP => Untrusted::Symlink {
            path: path.to_owned(),
        },
        // With O_DIRECTORY, Linux reports a link as "not a directory".
        Errno::NOTDIR
            if rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink) =>
        {
            Untrusted::Symlink {
                path: path.to_owned(),
            }
        }
        Errno::NOTDIR => Untrusted::Kind {
            path: path.to_owned(),
            expected: "directory",
        },
        e => io_error(path, e),
    })
}

impl TrustedDir {
    /// Open the directory at `path` if it and every directory above it
    /// pass the rules of this module. The path is walked as written, from
    /// `/`: a symbolic link anywhere on it is refused, never resolved, so
    /// no link in a directory nobody checked can choose what is trusted.
    pub fn open(path: &Path) -> Result<Self, Untrusted> {
        Self::walk(&absolute(path)?, false)
    }

    /// As [`open`](Self::open), creating the directory and any missing
    /// parents with mode 0700 first. Existing directories are checked
    /// before anything is created in them.
    pub fn create(path: &Path) -> Result<Self, Untrusted> {
        Self::walk(&absolute(path)?, true)
    }

    /// Walk `real` (absolute, resolved) from `/`, checking each directory;
    /// with `create`, missing directories are made 0700 on the way.
    fn walk(real: &Path, create: bool) -> Result<Self, Untrusted> {
        let root = Path::new("/");
        let mut fd = open_dir_at(CWD, root.as_os_str(), root)?;
        let mut here = root.to_path_buf();
        let names: Vec<&OsStr> = real
            .components()
            .filter_map(|c| match c {
                Component::Normal(name) => Some(name),
                _ => None,
            })
            .collect();
        let step = |i: usize| {
            if i == names.len() {
                Step::Target
            } else {
                Step::Ancestor
            }
        };
        let stat = rustix::fs::fstat(&fd).map_err(|e| io_error(&here, e))?;
        check_dir(&here, &stat, step(0))?;
        for (i, name) in names.iter().enumerate() {
            here.push(name);
            if create {
                match rustix::fs::mkdirat(&fd, *name, Mode::from_raw_mode(0o700)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(io_error(&here, e)),
                }
            }
            fd = open_dir_at(&fd, name, &here)?;
            let stat = rustix::fs::fstat(&fd).map_err(|e| io_error(&here, e))?;
            check_dir(&here, &stat, step(i + 1))?;
        }
        Ok(TrustedDir { path: here, fd })
    }

    /// The directory's resolved path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory's owner.
    pub fn owner(&self) -> Result<u32, Untrusted> {
        let stat = rustix::fs::fstat(&self.fd).map_err(|e| io_error(&self.path, e))?;
        Ok(stat.st_uid)
    }

    /// Open the file `name` in this directory for reading, without
    /// following a link; `None` when there is no such entry. The file must
    /// be a regular file the host trusts ([`Untrusted`] otherwise).
    pub fn open_file(&self, name: &str) -> Result<Option<(File, Stat)>, Untrusted> {
        let path = self.path.join(name);
        let fd = match rustix::fs::openat(
            &self.fd,
            name,
            // Non-blocking: a FIFO planted under a plugin's name must not
            // hang the loader before its type is checked.
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(Errno::LOOP) => return Err(Untrusted::Symlink { path }),
            Err(e) => return Err(io_error(&path, e)),
        };
        let stat = rustix::fs::fstat(&fd).map_err(|e| io_error(&path, e))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(Untrusted::Kind {
                path,
                expected: "regular file",
            });
        }
        if !trusted_owner(stat.st_uid) {
            return Err(Untrusted::Owner {
                path,
                owner: stat.st_uid,
                euid: euid(),
            });
        }
        let mode = stat.st_mode & 0o7777;
        if mode & GROUP_OR_OTHER_WRITE != 0 {
            return Err(Untrusted::Writable { path, mode });
        }
        Ok(Some((File::from(fd), stat)))
    }

    /// The bytes of the file `name` ([`open_file`](Self::open_file)).
    pub fn read_file(&self, name: &str) -> Result<Option<Vec<u8>>, Untrusted> {
        let Some((mut file, stat)) = self.open_file(name)? else {
            return Ok(None);
        };
        let mut bytes = Vec::with_capacity(usize::try_from(stat.st_size).unwrap_or(0));
        file.read_to_end(&mut bytes)
            .map_err(|e| io_error(&self.path.join(name), e))?;
        Ok(Some(bytes))
    }

    /// As [`read_file`](Self::read_file), refusing a file of more than
    /// `max` bytes before reading it, and reading no more than `max` bytes
    /// even if it grows meanwhile.
    pub fn read_file_bounded(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>, Untrusted> {
        let Some((file, stat)) = self.open_file(name)? else {
            return Ok(None);
        };
        let path = || self.path.join(name);
        let size = u64::try_from(stat.st_size).unwrap_or(u64::MAX);
        if size > max {
            return Err(Untrusted::TooLarge {
                path: path(),
                size,
                max,
            });
        }
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        file.take(max.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| io_error(&path(), e))?;
        if bytes.len() as u64 > max {
            return Err(Untrusted::TooLarge {
                path: path(),
                size: bytes.len() as u64,
                max,
            });
        }
        Ok(Some(bytes))
    }

    /// The names of the entries whose names end in `suffix`, sorted, with
    /// their types as the directory lists them (a link is listed as a
    /// link).
    pub fn entries(&self, suffix: &str) -> Result<Vec<(String, FileType)>, Untrusted> {
        let dir = rustix::fs::Dir::read_from(&self.fd).map_err(|e| io_error(&self.path, e))?;
        let mut found = Vec::new();
        for entry in dir {
            let entry = entry.map_err(|e| io_error(&self.path, e))?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            // A name that is not UTF-8 cannot end in the suffix as text;
            // it is not a plugin file.
            if let Some(name) = name.to_str()
                && name.ends_with(suffix)
                && name.len() > suffix.len()
            {
                found.push((name.to_owned(), entry.file_type()));
            }
        }
        found.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(found)
    }

    /// Write `bytes` to a new temporary file for `name` in this directory
    /// (created exclusively, never through a link, with `mode`), synced;
    /// its name, for the caller to put in place. Removed again on failure.
    fn write_temp(&self, name: &str, bytes: &[u8], mode: u32) -> io::Result<String> {
        let temp = format!(".{name}.{}.{}.tmp", std::process::id(), unique());
        let fd = rustix::fs::openat(
            &self.fd,
            temp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )?;
        let written = (|| {
            // The mode given at creation is narrowed by the umask; set it.
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
            let mut file = File::from(fd);
            file.write_all(bytes)?;
            file.sync_all()
        })();
        match written {
            Ok(()) => Ok(temp),
            Err(e) => {
                let _ = rustix::fs::unlinkat(&self.fd, temp.as_str(), AtFlags::empty());
                Err(e)
            }
        }
    }

    /// Write `bytes` as `name` in this directory: into a new temporary file
    /// ([`write_temp`](Self::write_temp)), then renamed over `name` (which
    /// replaces a link rather than following it).
    pub fn write_file(&self, name: &str, bytes: &[u8], mode: u32) -> io::Result<()> {
        let temp = self.write_temp(name, bytes, mode)?;
        rustix::fs::renameat(&self.fd, temp.as_str(), &self.fd, name).map_err(|e| {
            let _ = rustix::fs::unlinkat(&self.fd, temp.as_str(), AtFlags::empty());
            io::Error::from(e)
        })
    }

    /// Create `name` holding `bytes` with `mode`, only if no entry of that
    /// name exists (`Ok(false)` then). Never through a link, and never
    /// half-written: the content goes to a temporary file first, which is
    /// then hard-linked as `name` (refused if `name` exists), so a reader
    /// sees the whole file or none.
    pub fn create_file(&self, name: &str, bytes: &[u8], mode: u32) -> io::Result<bool> {
        let temp = self.write_temp(name, bytes, mode)?;
        let linked =
            match rustix::fs::linkat(&self.fd, temp.as_str(), &self.fd, name, AtFlags::empty()) {
                Ok(()) => Ok(true),
                Err(Errno::EXIST) => Ok(false),
                Err(e) => Err(io::Error::from(e)),
            };
        let _ = rustix::fs::unlinkat(&self.fd, temp.as_str(), AtFlags::empty());
        linked
    }

    /// Whether an entry `name` exists in this directory, of any type (a
    /// link is looked at, not followed).
    pub fn exists(&self, name: &str) -> io::Result<bool> {
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Flush the directory's entries to disk (`fsync` of the directory):
    /// a file renamed into it by [`write_file`](Self::write_file) is then
    /// there after a power loss, not only after a crash of the process.
    pub fn sync(&self) -> io::Result<()> {
        rustix::fs::fsync(&self.fd).map_err(io::Error::from)
    }

    /// Remove the entry `name` if it exists (a link is removed, not
    /// followed).
    pub fn remove(&self, name: &str) -> io::Result<()> {
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// A number no other temporary file of this process has used.
fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Read the plugin file at `path`: its directory (and every one above)
/// and the file itself must pass the rules of this module.
pub fn read_file(path: &Path) -> Result<Vec<u8>, Untrusted> {
    read_file_bounded(path, u64::MAX)
}

/// As [`read_file`], refusing a file of more than `max` bytes
/// ([`TrustedDir::read_file_bounded`]).
pub fn read_file_bounded(path: &Path, max: u64) -> Result<Vec<u8>, Untrusted> {
    let (dir, name) = match (path.parent(), path.file_name().and_then(OsStr::to_str)) {
        (Some(dir), Some(name)) => (
            if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            },
            name,
        ),
        _ => {
            return Err(Untrusted::Kind {
                path: path.to_owned(),
                expected: "file",
            });
        }
    };
    let dir = TrustedDir::open(dir)?;
    dir.read_file_bounded(name, max)?.ok_or_else(|| {
        io_error(
            path,
            io::Error::new(io::ErrorKind::NotFound, "no such file"),
        )
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_private_directory_under_sticky_tmp_is_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let trusted = TrustedDir::open(dir.path()).unwrap();
        assert_eq!(trusted.path(), std::fs::canonicalize(dir.path()).unwrap());
    }

    /// A link anywhere on the path is refused, never resolved: a link in a
    /// directory nobody checked must not choose the directory trusted.
    #[test]
    fn a_link_on_the_path_is_refused_and_so_is_dot_dot() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir_all(real.join("cache")).unwrap();
        chmod(&real, 0o700);
        chmod(&real.join("cache"), 0o700);
        std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
        TrustedDir::open(&real.join("cache")).expect("the real path is trusted");
        for via_link in [dir.path().join("link"), dir.path().join("link/cache")] {
            let err = TrustedDir::open(&via_link).unwrap_err();
            assert!(
                matches!(&err, Untrusted::Symlink { path } if path == &dir.path().join("link")),
                "{}: {err}",
                via_link.display()
            );
            let err = TrustedDir::create(&via_link.join("new")).unwrap_err();
            assert!(matches!(err, Untrusted::Symlink { .. }), "{err}");
        }
        assert!(
            !real.join("cache/new").exists(),
            "nothing created through the link"
        );
        let err = TrustedDir::open(&real.join("cache/../cache")).unwrap_err();
        assert!(err.to_string().contains("`..`"), "{err}");
    }

    #[test]
    fn a_world_writable_directory_is_refused_even_with_the_sticky_bit() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o777, 0o1777, 0o770] {
            chmod(dir.path(), mode);
            let err = TrustedDir::open(dir.path()).unwrap_err();
            assert!(matches!(err, Untrusted::Writable { .. }), "{mode:o}: {err}");
            assert!(err.to_string().contains("chmod go-w"), "{err}");
        }
    }

    #[test]
    fn an_ancestor_writable_by_others_is_refused_unless_sticky_and_roots() {
        let dir = tempfile::tempdir().unwrap();
        let inner = dir.path().join("inner");
        std::fs::create_dir(&inner).unwrap();
        chmod(&inner, 0o700);
        chmod(dir.path(), 0o777);
        let err = TrustedDir::open(&inner).unwrap_err();
        assert!(
            matches!(&err, Untrusted::Writable { path, .. } if path == &std::fs::canonicalize(dir.path()).unwrap()),
            "{err}"
        );
        if euid() == 0 {
            chmod(dir.path(), 0o1777);
            TrustedDir::open(&inner).expect("a sticky ancestor owned by root is fine");
        }
    }

    #[test]
    fn create_makes_private_directories_below_a_checked_parent() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b");
        let trusted = TrustedDir::create(&deep).unwrap();
        for path in [dir.path().join("a"), deep.clone()] {
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", path.display());
        }
        assert!(trusted.path().ends_with("a/b"));
        chmod(dir.path(), 0o777);
        assert!(matches!(
            TrustedDir::create(&dir.path().join("c")),
            Err(Untrusted::Writable { .. })
        ));
        assert!(!dir.path().join("c").exists(), "nothing made under it");
    }

    #[test]
    fn files_are_never_read_through_a_link_nor_when_others_may_write_them() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("real"), b"data").unwrap();
        std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("link")).unwrap();
        std::fs::write(dir.path().join("open"), b"data").unwrap();
        chmod(&dir.path().join("open"), 0o666);
        let trusted = TrustedDir::open(dir.path()).unwrap();
        assert_eq!(trusted.read_file("real").unwrap().unwrap(), b"data");
        assert!(trusted.read_file("missing").unwrap().is_none());
        assert!(matches!(
            trusted.read_file("link"),
            Err(Untrusted::Symlink { .. })
        ));
        assert!(matches!(
            trusted.read_file("open"),
            Err(Untrusted::Writable { .. })
        ));
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        assert!(matches!(
            trusted.read_file("sub"),
            Err(Untrusted::Kind { .. })
        ));
    }

    #[test]
    fn exists_looks_at_a_link_without_following_it() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(dir.path().join("missing"), dir.path().join("dangling"))
            .unwrap();
        let trusted = TrustedDir::open(dir.path()).unwrap();
        assert!(trusted.exists("dangling").unwrap());
        assert!(!trusted.exists("missing").unwrap());
        trusted.write_file("file", b"x", 0o600).unwrap();
        trusted.sync().unwrap();
        assert!(trusted.exists("file").unwrap());
    }

    #[test]
    fn writes_replace_a_link_instead_of_following_it() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let target = elsewhere.path().join("target");
        std::fs::write(&target, b"untouched").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("entry")).unwrap();
        let trusted = TrustedDir::open(dir.path()).unwrap();
        trusted.write_file("entry", b"new", 0o600).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"untouched");
        let meta = std::fs::symlink_metadata(dir.path().join("entry")).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(!trusted.create_file("entry", b"again", 0o600).unwrap());
        assert_eq!(trusted.entries("y").unwrap().len(), 1, "no temporary left");
    }
}
