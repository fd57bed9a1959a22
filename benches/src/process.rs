//! This process's CPU time and memory, and the machine it runs on.
//!
//! CPU time is `CLOCK_PROCESS_CPUTIME_ID`: user plus system time of every
//! thread, in nanoseconds (what `getrusage(RUSAGE_SELF)` splits into
//! `ru_utime` and `ru_stime`, without its microsecond rounding). Peak memory
//! is `VmHWM` from `/proc/self/status`, the resident high-water mark that
//! `getrusage` reports as `ru_maxrss`.

use std::time::Duration;

use rustix::time::{ClockId, clock_gettime};
use serde::{Deserialize, Serialize};

/// CPU time this process has used so far, all threads.
pub fn cpu_time() -> Duration {
    let t = clock_gettime(ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// System (kernel) CPU time this process has used so far, all threads:
/// `stime` of `/proc/self/stat`, in clock ticks (10 ms on most kernels, so
/// meaningful over runs of seconds). Zero if it cannot be read.
pub fn system_cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (which is in parentheses and may
    // hold spaces): state is field 3, stime field 15.
    let ticks = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(12))
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(0);
    let per_second = rustix::param::clock_ticks_per_second().max(1);
    Duration::from_secs_f64(ticks as f64 / per_second as f64)
}

/// A `kB` field of `/proc/self/status` (`VmHWM`, `VmRSS`, ...), in KiB.
pub fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status_field(&status, field)
}

/// A `kB` field of another process's `/proc/PID/status`, in KiB.
pub fn status_kib_of(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status_field(&status, field)
}

fn status_field(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.trim().strip_suffix("kB")?.trim().parse().ok()
    })
}

/// Peak resident memory of this process so far, in KiB.
pub fn peak_rss_kib() -> u64 {
    status_kib("VmHWM").unwrap_or(0)
}

/// Reset this process's peak resident memory (`VmHWM`) to what is
/// resident now (`/proc/self/clear_refs`, value 5). Best effort: a kernel
/// that refuses leaves the whole-life peak.
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Resident memory of this process now, in KiB.
pub fn rss_kib() -> u64 {
    status_kib("VmRSS").unwrap_or(0)
}

/// What the numbers were measured on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub kernel: String,
    /// The 1-minute load average when the measurement started: above about
    /// 0.5 on two cores, someone else was busy and the figures are noisy.
    pub load: f64,
}

impl Machine {
    pub fn current() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map_or_else(|| "unknown".to_owned(), |(_, v)| v.trim().to_owned());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_gib =
            status_field(&meminfo, "MemTotal").map_or(0.0, |kib| kib as f64 / (1 << 20) as f64);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned());
        Machine {
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            cpu_model,
            memory_gib,
            kernel,
            load: load_average(),
        }
    }
}

/// The 1-minute load average.
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_kib_fields() {
        let status = "Name:\tx\nVmHWM:\t   51200 kB\nVmRSS:\t    1024 kB\n";
        assert_eq!(status_field(status, "VmHWM"), Some(51200));
        assert_eq!(status_field(status, "VmRSS"), Some(1024));
        assert_eq!(status_field(status, "VmSwap"), None);
        assert!(peak_rss_kib() >= rss_kib());
    }

    #[test]
    fn cpu_time_advances() {
        let before = cpu_time();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i * i));
        }
        assert!(cpu_time() > before, "{x}");
    }
}
