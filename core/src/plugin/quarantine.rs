//! [`QuarantineFile`]: the digests of plugin files a rollback took out of
//! service, kept beside the cache key so that they stay out across
//! restarts. Read like every other file the host trusts
//! ([`TrustedDir`]); a line that is no digest is ignored with a warning.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::trusted::TrustedDir;

/// The file that keeps the digests a rollback quarantined, one sha256 per
/// line (`#` starts a comment), beside the cache key
/// (`/var/lib/cocoon-fixup/quarantine` for root): a quarantined file stays
/// out of service across restarts, for `plan`, `run` and `serve` alike,
/// until it is replaced or released (`cocoon-fixup plugin quarantine
/// --release SHA256`, which removes its line; a running `serve` notices).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantineFile {
    dir: PathBuf,
}

/// The quarantine file's name in its directory.
pub const QUARANTINE_FILE: &str = "quarantine";

impl QuarantineFile {
    /// The quarantine file beside `key` (`--cache-key`), else beside the
    /// default cache key; `None` when there is no such place.
    pub fn beside_key(key: Option<&Path>) -> Option<Self> {
        let key = key
            .map(Path::to_owned)
            .or_else(super::cache::default_key_path)?;
        Some(QuarantineFile {
            dir: key.parent()?.to_owned(),
        })
    }

    /// The quarantine file in `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        QuarantineFile {
            dir: dir.to_owned(),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(QUARANTINE_FILE)
    }

    /// The digests listed. A missing file lists none; a file (or a
    /// directory above it) that breaks the trust rules, and a line that is
    /// no digest, are logged and ignored.
    pub fn read(&self) -> BTreeSet<String> {
        self.try_read().unwrap_or_else(|e| {
            tracing::warn!("quarantine file not used: {e}");
            BTreeSet::new()
        })
    }

    /// The digests listed; `Err` when the file (or a directory above it)
    /// breaks the trust rules or cannot be read, so a caller can keep what
    /// it had. Only a file (or directory) that does not exist lists none.
    pub fn try_read(&self) -> Result<BTreeSet<String>, String> {
        let bytes = match TrustedDir::open(&self.dir).and_then(|d| d.read_file(QUARANTINE_FILE)) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Ok(BTreeSet::new()),
            Err(e) if e.is_not_found() => return Ok(BTreeSet::new()),
            Err(e) => return Err(e.to_string()),
        };
        Ok(String::from_utf8_lossy(&bytes)
            .lines()
            .map(|line| line.split('#').next().unwrap_or("").trim())
            .filter(|line| !line.is_empty())
            .filter_map(|line| match super::parse_sha256(line) {
                Ok(digest) => Some(digest),
                Err(e) => {
                    tracing::warn!(
                        file = %self.path().display(),
                        "quarantine line ignored: {}",
                        crate::facts::escape_controls(&e)
                    );
                    None
                }
            })
            .collect())
    }

    /// Each listed digest with its line's comment (empty when none), in
    /// the file's order: what `plugin quarantine` shows.
    pub fn entries(&self) -> Vec<(String, String)> {
        let Ok(Some(bytes)) =
            TrustedDir::open(&self.dir).and_then(|d| d.read_file(QUARANTINE_FILE))
        else {
            return Vec::new();
        };
        let mut entries: Vec<(String, String)> = Vec::new();
        for line in String::from_utf8_lossy(&bytes).lines() {
            let (digest, comment) = line.split_once('#').unwrap_or((line, ""));
            if let Ok(digest) = super::parse_sha256(digest)
                && !entries.iter().any(|(d, _)| *d == digest)
            {
                let comment = crate::facts::escape_controls(comment.trim());
                entries.push((digest, comment));
            }
        }
        entries
    }

    /// Take `sha256` out of the quarantine (every line that lists it, the
    /// rest kept as written): `Ok(false)` when it was not listed.
    pub fn release(&self, sha256: &str) -> std::io::Result<bool> {
        let dir = TrustedDir::open(&self.dir).map_err(std::io::Error::other)?;
        let text = match dir.read_file(QUARANTINE_FILE) {
            Ok(Some(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
            Ok(None) => return Ok(false),
            Err(e) => return Err(std::io::Error::other(e)),
        };
        let lists = |line: &str| {
            let digest = line.split('#').next().unwrap_or("").trim();
            super::parse_sha256(digest).is_ok_and(|d| d == sha256)
        };
        if !text.lines().any(lists) {
            return Ok(false);
        }
        let kept: String = text
            .lines()
            .filter(|line| !lists(line))
            .map(|line| format!("{line}\n"))
            .collect();
        dir.write_file(QUARANTINE_FILE, kept.as_bytes(), 0o600)?;
        Ok(true)
    }

    /// Add `sha256` (with a comment saying which plugin and when).
    pub fn add(&self, sha256: &str, comment: &str) -> std::io::Result<()> {
        let dir = TrustedDir::create(&self.dir).map_err(std::io::Error::other)?;
        let mut text = match dir.read_file(QUARANTINE_FILE) {
            Ok(Some(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
            Ok(None) => String::new(),
            Err(e) => return Err(std::io::Error::other(e)),
        };
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        let comment = crate::facts::escape_controls(comment);
        text.push_str(&format!("{sha256}  # {comment}\n"));
        dir.write_file(QUARANTINE_FILE, text.as_bytes(), 0o600)
    }
}
