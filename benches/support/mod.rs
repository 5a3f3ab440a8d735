//! Helpers shared by the benchmarks: Prometheus text parsing and reading figures from processes.

#![allow(dead_code)] // not every benchmark uses every helper

/// The value of one exact series (`name{labels}`) in Prometheus text; 0 when absent.
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The sum of every series of `name` whose labels contain all of `with` (e.g. `operation="multi"`)
/// and none of `without`.
pub fn metric_sum(text: &str, name: &str, with: &[&str], without: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter(|l| with.iter().all(|w| l.contains(w)) && !without.iter().any(|w| l.contains(w)))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// Resident set size of a process in KiB (`VmRSS` of /proc/PID/status); 0 if unreadable.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

/// Raises this process's open-file limit to its hard limit (benchmarks open thousands of sockets).
#[allow(unsafe_code)]
pub fn raise_open_files() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed to them.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
            return 0;
        }
    }
    limit.rlim_cur
}

/// A distinct 100-byte body for message `i` (so exactly-once can be checked body by body).
pub fn body(i: usize) -> Vec<u8> {
    let mut body = format!("m{i:08}-").into_bytes();
    body.resize(100, b'x');
    body
}
