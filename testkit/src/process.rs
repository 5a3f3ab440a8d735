//! Processes and ports: children that die with the test process, free loopback ports, the
//! repository's files, the zkq binary, and what the kernel says about a process.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Root of the repository (where zkq's Cargo.toml is).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).expect("testkit/ lives in the repository")
}

/// The `zkq` binary of the build running this test or benchmark: cargo puts test and bench
/// executables in `deps/` beside it.
pub fn zkq_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the running executable");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<exe>");
    profile_dir.join("zkq")
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free loopback port")
}

/// Spawns children from one thread that lives as long as the process: PR_SET_PDEATHSIG fires
/// when the *thread* that forked exits, so spawning from short-lived test threads would kill
/// servers early. With it, every server dies with the test process, even on a panic or abort.
#[allow(unsafe_code, reason = "pre_exec(PR_SET_PDEATHSIG): no server outlives the test process")]
pub fn spawn_supervised(mut command: Command) -> std::io::Result<Child> {
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("child-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
                    unsafe {
                        command.pre_exec(|| {
                            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                                return Err(std::io::Error::last_os_error());
                            }
                            Ok(())
                        });
                    }
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("spawner thread starts");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    command.stdin(Stdio::null());
    sender.lock().expect("spawner lock").send((command, reply_tx)).expect("spawner alive");
    reply_rx.recv().expect("spawner answers")
}

/// Path of a file in the repository.
pub fn repo_file(relative: &str) -> PathBuf {
    repo_root().join(relative)
}

/// True if `path` exists.
pub fn exists(path: &Path) -> bool {
    path.exists()
}

/// A free `127.0.0.1:PORT` (bound and released: fine for tests on loopback).
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// `N` free `127.0.0.1:PORT`s, all different: each is held until every one is found (two
/// [`free_addr`] calls in a row can return the same port, which the kernel hands out again once
/// released; a zkq given it twice refuses its configuration).
pub fn free_addrs<const N: usize>() -> [String; N] {
    let held: Vec<TcpListener> =
        (0..N).map(|_| TcpListener::bind("127.0.0.1:0").expect("a free loopback port")).collect();
    std::array::from_fn(|i| {
        let port = held.get(i).and_then(|l| l.local_addr().ok()).map(|a| a.port()).expect("a bound port");
        format!("127.0.0.1:{port}")
    })
}

/// A free loopback port below the kernel's ephemeral range, so that no outgoing connection can
/// take it while its server is down (a restarted server must bind the same ports again).
pub fn stable_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next().and_then(|l| l.parse::<u16>().ok()))
        .unwrap_or(32768);
    let span = low.saturating_sub(10_000).max(1);
    // Start somewhere different in each test process; then walk the range.
    let start = u16::try_from(std::process::id() % u32::from(span)).unwrap_or(0);
    let _ = NEXT.compare_exchange(0, start, Ordering::SeqCst, Ordering::SeqCst);
    for _ in 0..span {
        let port = 10_000 + NEXT.fetch_add(1, Ordering::SeqCst) % span;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port between 10000 and {low}");
}

/// CPU time (user + system) a process has used so far, from `/proc/PID/stat`.
pub fn process_cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc stat");
    // Fields after the command name, which is in parentheses: utime and stime are 14 and 15.
    let after = stat.rsplit_once(") ").map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<u64> = after.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
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
#[allow(unsafe_code, reason = "getrlimit/setrlimit on a struct of our own")]
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
