//! cocoon-net's lease file (`/var/lib/cocoon/net/leases.json`): a JSON
//! array of `{mac, ip, expiry}` rows (`null` when its lease table is
//! empty), read for the IP wait of spec section 6. Pure functions over the file's bytes, shared by the daemon's lease
//! watcher and the library's `lease` op.

use std::net::Ipv4Addr;
use std::time::{SystemTime, UNIX_EPOCH};

use jiff::Timestamp;

use crate::facts::MacAddr;

/// Where cocoon-net keeps its leases.
pub const DEFAULT_LEASE_FILE: &str = "/var/lib/cocoon/net/leases.json";

/// The longest lease file read: cocoon-net's holds a row per VM of the
/// node, well under this.
pub const FILE_MAX_BYTES: u64 = 16 << 20;

/// What one look at the lease file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileRead {
    /// No file (yet): no lease.
    Missing,
    /// The file's content, at most [`FILE_MAX_BYTES`].
    Bytes(Vec<u8>),
    /// The file cannot tell: why, for the operator.
    Unusable(String),
}

/// One bounded look at the lease file at `path`: opened without blocking
/// (a FIFO put there cannot hold the caller) and never as a controlling
/// terminal, read only when the opened
/// file is a regular one, and never past [`FILE_MAX_BYTES`]. Shared by
/// the daemon's watcher and the library's `lease` op, so that both read
/// the file alike.
pub fn read_file(path: &std::path::Path) -> FileRead {
    use rustix::fs::{FileType, Mode, OFlags};
    use std::io::Read as _;
    let opened = rustix::fs::open(
        path,
        // NOCTTY: a terminal put there never becomes the daemon's.
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    );
    let fd = match opened {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return FileRead::Missing,
        Err(e) => {
            return FileRead::Unusable(format!(
                "cannot read it: {}; check that this process may read it",
                std::io::Error::from(e)
            ));
        }
    };
    match rustix::fs::fstat(&fd) {
        Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile => {}
        Ok(_) => {
            return FileRead::Unusable(
                "it is not a regular file, so it was not read; check what is at that path".into(),
            );
        }
        Err(e) => {
            return FileRead::Unusable(format!("cannot read it: {}", std::io::Error::from(e)));
        }
    }
    let mut bytes = Vec::new();
    if let Err(e) = std::fs::File::from(fd)
        .take(FILE_MAX_BYTES + 1)
        .read_to_end(&mut bytes)
    {
        return FileRead::Unusable(format!("cannot read it: {e}"));
    }
    if bytes.len() as u64 > FILE_MAX_BYTES {
        return FileRead::Unusable(format!(
            "larger than {FILE_MAX_BYTES} bytes, so it was not read; check what writes it"
        ));
    }
    FileRead::Bytes(bytes)
}

/// One usable row of the lease file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    mac: MacAddr,
    ip: Ipv4Addr,
    expiry: Timestamp,
}

/// A row as written; every field is checked before it becomes a [`Lease`].
#[derive(Debug, serde::Deserialize)]
struct RawLease {
    mac: String,
    ip: String,
    expiry: String,
}

/// Looks `mac` up in the lease file's content.
///
/// The MAC matches in either case. A row whose expiry is at or before `now`
/// is ignored. A row that is malformed (missing field, bad MAC, an address
/// that is not IPv4, an expiry that is not RFC 3339) is skipped with a debug
/// log. When several live rows match, the latest expiry wins (on a tie, the
/// later row). Empty content (cocoon-net may be rewriting the file in place)
/// and `null` (what cocoon-net writes when it holds no lease) hold no
/// lease; other content that is not a JSON array is an error.
pub fn lookup(
    json: &[u8],
    mac: &MacAddr,
    now: SystemTime,
) -> Result<Option<Ipv4Addr>, serde_json::Error> {
    Ok(live_ip(&parse(json)?, mac, now))
}

/// The usable rows of the lease file's content (malformed rows skipped).
pub fn parse(json: &[u8]) -> Result<Vec<Lease>, serde_json::Error> {
    if json.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    // cocoon-net writes `null` when it holds no lease at all.
    let rows: Option<Vec<serde_json::Value>> = serde_json::from_slice(json)?;
    Ok(rows
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .filter_map(|(index, row)| match parse_row(row) {
            Ok(lease) => Some(lease),
            Err(why) => {
                tracing::debug!(row = index, "lease row skipped: {why}");
                None
            }
        })
        .collect())
}

fn parse_row(row: serde_json::Value) -> Result<Lease, String> {
    let raw: RawLease = serde_json::from_value(row).map_err(|e| e.to_string())?;
    let mac = MacAddr::parse(&raw.mac).map_err(|e| e.to_string())?;
    let ip = raw
        .ip
        .parse::<Ipv4Addr>()
        .map_err(|_| format!("ip {:?} is not an IPv4 address", raw.ip))?;
    let expiry = raw
        .expiry
        .parse::<Timestamp>()
        .map_err(|e| format!("expiry {:?} is not an RFC 3339 time: {e}", raw.expiry))?;
    Ok(Lease { mac, ip, expiry })
}

/// The address leased to `mac` at `now` among `leases`, if any.
pub fn live_ip(leases: &[Lease], mac: &MacAddr, now: SystemTime) -> Option<Ipv4Addr> {
    let now = nanos_since_epoch(now);
    leases
        .iter()
        .filter(|lease| lease.mac == *mac && lease.expiry.as_nanosecond() > now)
        .max_by_key(|lease| lease.expiry)
        .map(|lease| lease.ip)
}

/// Nanoseconds since the Unix epoch, negative before it, saturating far out.
fn nanos_since_epoch(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(after) => i128::try_from(after.as_nanos()).unwrap_or(i128::MAX),
        Err(before) => i128::try_from(before.duration().as_nanos()).map_or(i128::MIN, |n| -n),
    }
}

#[cfg(test)]
mod file_tests {
    use super::*;

    #[test]
    fn null_holds_no_lease_and_nothing_else_passes_for_it() {
        assert_eq!(parse(b"null\n").unwrap(), Vec::new());
        for content in ["null x", "nul", "true", "1", "\"x\"", "{}", "[null] x"] {
            assert!(parse(content.as_bytes()).is_err(), "{content}");
        }
    }

    #[test]
    fn a_look_at_the_file_is_bounded_and_never_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.json");
        assert_eq!(read_file(&path), FileRead::Missing);

        std::fs::write(&path, b"[]").unwrap();
        assert_eq!(read_file(&path), FileRead::Bytes(b"[]".to_vec()));

        // A file one byte past the bound (sparse) is not read.
        std::fs::File::create(&path)
            .unwrap()
            .set_len(FILE_MAX_BYTES + 1)
            .unwrap();
        assert!(
            matches!(read_file(&path), FileRead::Unusable(m) if m.contains("larger than")),
            "too large"
        );

        // A FIFO would block a plain open until a writer came.
        std::fs::remove_file(&path).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert!(
            matches!(read_file(&path), FileRead::Unusable(m) if m.contains("not a regular file")),
            "a FIFO"
        );

        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert!(
            matches!(read_file(&path), FileRead::Unusable(_)),
            "a directory"
        );
    }
}
