//! Memory of many waiting long-polls: prints figures, asserts nothing.
//!
//! `cargo bench --bench memory` (after `scripts/test.sh` installed ZooKeeper). It starts a private
//! ZooKeeper and the real zkq binary (this build's), with `take.max_wait = 10m` (so no take ends
//! while a loaded machine is still opening the others) and limits high enough for 10,000
//! connections, and prints the process's resident set (`VmRSS` of /proc/PID/status) when idle,
//! with 1,000 and with 10,000 takes waiting (`wait=10m` on an empty
//! queue, one connection each, opened by this process with its open-file limit raised to the hard
//! limit; the child inherits it), and a while after they all left.
//!
//! Environment: `ZKQ_BENCH_WAITERS` (default `1000,10000`), `ZKQ_BENCH_SETTLE` (seconds to wait
//! after the clients left before the last reading; default 60), `ZKQ_BENCH_BASELINE=path/to/zkq`
//! to print the same rows for another build first, so before and after are compared in one run.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "benchmarks drive ZooKeeper and read their environment directly"
)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use zkq_testkit::*;

const QUEUE: &str = "waiters";

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

async fn waiting(http: &reqwest::Client, zkq: &ChildZkq) -> f64 {
    let Ok(response) = http.get(format!("{}/metrics", zkq.admin)).send().await else { return -1.0 };
    let text = response.text().await.unwrap_or_default();
    metric_sum(&text, "zkq_waiting_takers", &[&format!("queue=\"{QUEUE}\"")], &[])
}

/// Opens `n` more connections, each sending one take with `wait=10m`, and waits until zkq
/// counts every one of them as a waiting taker.
async fn add_waiters(http: &reqwest::Client, zkq: &ChildZkq, streams: &mut Vec<TcpStream>, n: usize) {
    let addr = zkq.api.trim_start_matches("http://").to_owned();
    let request =
        format!("POST /v1/queues/{QUEUE}/take?wait=10m HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\n\r\n");
    for _ in 0..n {
        let mut stream = TcpStream::connect(&addr).await.expect("connect");
        stream.write_all(request.as_bytes()).await.expect("send take");
        streams.push(stream);
    }
    let want = streams.len() as f64;
    eventually(Duration::from_secs(600), "every take waiting", || async move { waiting(http, zkq).await >= want })
        .await;
}

async fn run(label: &str, binary: &Path, zk: &ZkServer, waiters: &[usize], settle: Duration) {
    let root = unique_root(&format!("memory-{label}"));
    let env = [
        ("ZKQ__TAKE__MAX_WAIT", "10m"),
        ("ZKQ__API__MAX_CONNECTIONS", "20000"),
        ("ZKQ__API__MAX_CONCURRENT_REQUESTS", "20000"),
    ];
    let zkq = ChildZkq::start_binary(binary, zk, &root, &env).await;
    let http = reqwest::Client::new();
    // Create and open the queue (its node, cache and metrics) before the idle reading: a put, then
    // a take of that message. (Takes of a queue without a node wait for the node, not as takers.)
    let put = http.post(format!("{}/v1/queues/{QUEUE}/messages", zkq.api)).body("x").send().await.expect("put");
    assert_eq!(put.status(), 201, "the put that creates the queue");
    let take = http.post(format!("{}/v1/queues/{QUEUE}/take?wait=10s", zkq.api)).send().await.expect("take");
    assert_eq!(take.status(), 200, "the take that empties the queue");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = rss_kib(zkq.pid());
    let mut row = vec![format!("idle {}", mib(idle))];
    let mut streams = Vec::new();
    let mut peak = idle;
    for &n in waiters {
        let started = Instant::now();
        let more = n - streams.len().min(n);
        add_waiters(&http, &zkq, &mut streams, more).await;
        let rss = rss_kib(zkq.pid());
        peak = peak.max(rss);
        let per = (rss.saturating_sub(idle)) as f64 * 1024.0 / n as f64 / 1024.0;
        row.push(format!(
            "{n} waiting {} ({per:.1} KiB each, {:.1}s to open)",
            mib(rss),
            started.elapsed().as_secs_f64()
        ));
    }
    drop(streams);
    eventually(Duration::from_secs(120), "every waiter gone", || async { waiting(&http, &zkq).await == 0.0 }).await;
    let gone = rss_kib(zkq.pid());
    tokio::time::sleep(settle).await;
    let settled = rss_kib(zkq.pid());
    row.push(format!("all left {}", mib(gone)));
    row.push(format!(
        "{}s later {} ({:.2}x idle)",
        settle.as_secs(),
        mib(settled),
        settled as f64 / idle.max(1) as f64
    ));
    println!("{label:>8}: {}", row.join(" | "));
    zkq.signal("TERM");
    let _ = zkq.wait().await;
}

#[tokio::main]
async fn main() {
    let limit = raise_open_files();
    let waiters: Vec<usize> =
        env_or("ZKQ_BENCH_WAITERS", "1000,10000").split(',').map(|n| n.trim().parse().expect("a count")).collect();
    let settle = Duration::from_secs(env_or("ZKQ_BENCH_SETTLE", "60").parse().expect("seconds"));
    let largest = waiters.iter().copied().max().unwrap_or(0) as u64;
    if limit < largest + 1000 {
        eprintln!("open-file limit {limit} is too low for {largest} connections");
        return;
    }
    println!("memory bench: take.max_wait=10m, waiters {waiters:?}, settle {}s (ZKQ_BENCH_SETTLE)", settle.as_secs());
    let zk = ZkServer::start();
    if let Ok(baseline) = std::env::var("ZKQ_BENCH_BASELINE") {
        run("baseline", &PathBuf::from(baseline), &zk, &waiters, settle).await;
    }
    run("this", Path::new(env!("CARGO_BIN_EXE_zkq")), &zk, &waiters, settle).await;
}
