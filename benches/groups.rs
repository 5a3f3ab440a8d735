//! Message groups: the drain rate of a grouped queue with 1, 10 and 1,000 groups beside the same
//! queue ungrouped, in one run. Prints figures; asserts only that every message was processed once
//! and, per group, in put order.
//!
//! `cargo bench --bench groups` (after `scripts/test.sh` installed ZooKeeper). Two real zkq
//! processes (this build's binary) serve one declared fifo queue on one private ZooKeeper; the
//! queue is filled through the first with `ZKQ_BENCH_MESSAGES` (default 3000) bodies of 100 bytes,
//! spread round-robin over the groups, then drained by 16 HTTP consumers (lease, then ack) spread
//! over both sidecars. With 1 group only one message is ever in flight, so that row measures one
//! lease's round trip; with 1,000 groups the consumers never wait for a group.
//!
//! Environment: `ZKQ_BENCH_MESSAGES`, `ZKQ_BENCH_GROUPS` (default `none,1,10,1000`; `none` is the
//! queue ungrouped).

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "benchmarks drive ZooKeeper and read their environment directly"
)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use zkq_testkit::*;

const CONSUMERS: usize = 16;
const SIDECARS: usize = 2;
const QUEUE: &str = "bench";

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// Puts `n` bodies through `api`; body `i` goes to group `i % groups` (no group when `None`).
async fn fill(http: &reqwest::Client, api: &str, n: usize, groups: Option<usize>) {
    let next = Arc::new(AtomicUsize::new(0));
    let mut putters = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let (http, api, next) = (http.clone(), api.to_owned(), next.clone());
        putters.spawn(async move {
            loop {
                // Putters run in parallel, so the put order of a group is the order ZooKeeper
                // stored its messages in (their sequence numbers), which the check below uses.
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return;
                }
                let query = groups.map(|g| format!("?group=g{}", i % g)).unwrap_or_default();
                let url = format!("{api}/v1/queues/{QUEUE}/messages{query}");
                let response = http.post(&url).body(body(i)).send().await.expect("put");
                assert_eq!(response.status(), 201, "put");
            }
        });
    }
    while let Some(r) = putters.join_next().await {
        r.expect("putter");
    }
}

/// One consumer: lease, ack, until a whole `wait=1s` finds nothing. Returns (message id, body) of
/// each message it acked, in the order it acked them, with the time of each ack.
async fn consume(http: reqwest::Client, api: String) -> Vec<(String, Vec<u8>, Instant)> {
    let mut processed = Vec::new();
    loop {
        let response = http.post(format!("{api}/v1/queues/{QUEUE}/leases?wait=1s")).send().await.expect("lease");
        match response.status().as_u16() {
            200 => {},
            204 => return processed,
            503 => continue,
            other => panic!("lease answered {other}"),
        }
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let (receipt, id) = (header("zkq-lease").expect("receipt"), header("zkq-message-id").expect("id"));
        let body = response.bytes().await.expect("body").to_vec();
        let at = Instant::now();
        let acked = http.delete(format!("{api}/v1/queues/{QUEUE}/leases/{receipt}")).send().await.expect("ack");
        if acked.status() == 204 {
            processed.push((id, body, at));
        }
    }
}

/// The sequence number at the end of a message id.
fn sequence(id: &str) -> u64 {
    id.rsplit(['|', '-']).next().and_then(|s| s.parse().ok()).unwrap_or(0)
}

struct Row {
    rate: f64,
    exactly_once: bool,
    in_order: bool,
}

async fn run(zk: &ZkServer, binary: &Path, n: usize, groups: Option<usize>) -> Row {
    let root = unique_root("groups-bench");
    let grouped = if groups.is_some() { "true" } else { "false" };
    let env = [("ZKQ__QUEUES__BENCH__KIND", "fifo"), ("ZKQ__QUEUES__BENCH__GROUPED", grouped)];
    let mut sidecars = Vec::new();
    for _ in 0..SIDECARS {
        sidecars.push(ChildZkq::start_binary(binary, zk, &root, &env).await);
    }
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("http client");
    fill(&http, &sidecars[0].api, n, groups).await;
    let started = Instant::now();
    let mut consumers = tokio::task::JoinSet::new();
    for c in 0..CONSUMERS {
        consumers.spawn(consume(http.clone(), sidecars[c % SIDECARS].api.clone()));
    }
    let mut acked = Vec::with_capacity(n);
    while let Some(done) = consumers.join_next().await {
        acked.extend(done.expect("consumer"));
    }
    let last = acked.iter().map(|(_, _, at)| *at).max().unwrap_or(started);
    let took = last.duration_since(started).as_secs_f64().max(1e-9);
    let mut counts: HashMap<&[u8], usize> = HashMap::new();
    for (_, b, _) in &acked {
        *counts.entry(b.as_slice()).or_default() += 1;
    }
    let exactly_once = acked.len() == n && (0..n).all(|i| counts.get(body(i).as_slice()) == Some(&1));
    // Per group, the acks came in the order ZooKeeper stored the messages.
    let mut by_group: HashMap<String, Vec<(Instant, u64)>> = HashMap::new();
    for (id, _, at) in &acked {
        let group = id.split('|').nth(1).unwrap_or("").to_owned();
        by_group.entry(group).or_default().push((*at, sequence(id)));
    }
    let in_order = groups.is_none()
        || by_group.values_mut().all(|acks| {
            acks.sort();
            acks.windows(2).all(|w| w[0].1 < w[1].1)
        });
    drop(sidecars);
    Row { rate: n as f64 / took, exactly_once, in_order }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    raise_open_files();
    let n: usize = env_or("ZKQ_BENCH_MESSAGES", "3000").parse().expect("ZKQ_BENCH_MESSAGES is a number");
    let rows: Vec<Option<usize>> =
        env_or("ZKQ_BENCH_GROUPS", "none,1,10,1000").split(',').map(|g| g.trim().parse().ok()).collect();
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_zkq"));
    let zk = ZkServer::start();
    println!(
        "zkq message groups benchmark: {n} messages of 100 B, {CONSUMERS} HTTP consumers (lease, ack) over \
         {SIDECARS} sidecars (ZooKeeper 3.8 standalone on loopback)"
    );
    println!(
        "\n{:<10} {:>9} {:>12} {:>12} {:>14}",
        "groups", "msg/s", "x ungrouped", "exactly-once", "order per group"
    );
    let mut ungrouped = None;
    for groups in rows {
        let row = run(&zk, &binary, n, groups).await;
        if groups.is_none() {
            ungrouped = Some(row.rate);
        }
        let ratio = ungrouped.map_or("-".to_owned(), |u| format!("{:.2}x", row.rate / u));
        println!(
            "{:<10} {:>9.0} {:>12} {:>12} {:>14}",
            groups.map_or("ungrouped".to_owned(), |g| g.to_string()),
            row.rate,
            ratio,
            if row.exactly_once { "yes" } else { "NO" },
            if row.in_order { "yes" } else { "NO" },
        );
        assert!(row.exactly_once, "every message processed exactly once");
        assert!(row.in_order, "each group acked in put order");
    }
}
