//! cocoon-net's lease file (`/var/lib/cocoon/net/leases.json`): a JSON
//! array of `{mac, ip, expiry}` rows, read for the IP wait of spec section
//! 6. Pure functions over the file's bytes, shared by the daemon's lease
//! watcher and the library's `lease` op.

use std::net::Ipv4Addr;
use std::time::{SystemTime, UNIX_EPOCH};

use jiff::Timestamp;

use crate::facts::MacAddr;

/// Where cocoon-net keeps its leases.
pub const DEFAULT_LEASE_FILE: &str = "/var/lib/cocoon/net/leases.json";

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
/// holds no lease; content that is not a JSON array is an error.
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
    let rows: Vec<serde_json::Value> = serde_json::from_slice(json)?;
    Ok(rows
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
