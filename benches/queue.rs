//! Queue benchmark: prints figures, asserts nothing about speed.
//!
//! `cargo bench --bench queue` (after `scripts/test.sh` installed ZooKeeper and the Curator jars).
//! Starts a private ZooKeeper, runs zkq in-process and Curator's own producer and consumer
//! (through tests/java/CuratorTool) against the same server, and prints:
//! - put throughput with 1 and 64 concurrent HTTP clients (100-byte messages);
//! - drain of a 20,000-message queue by 16 concurrent takers, with getChildren calls per message;
//! - put→take latency p50/p99 with a waiting taker;
//! - Curator's single-producer put and single-consumer drain rates on the same server.
//!
//! Sizes can be scaled down with ZKQ_BENCH_SCALE=0.1 for a quick run.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "tests drive ZooKeeper and read their environment directly"
)]

#[path = "../tests/it/harness.rs"]
mod harness;
mod support;

use std::time::{Duration, Instant};

use harness::*;
use support::metric;

fn scaled(n: usize) -> usize {
    let scale: f64 = std::env::var("ZKQ_BENCH_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    ((n as f64) * scale).max(1.0) as usize
}

async fn put_many(zkq: &TestZkq, queue: &str, total: usize, clients: usize) -> Duration {
    let body = vec![b'x'; 100];
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let (http, url, body) = (zkq.http.clone(), zkq.url(&format!("/v1/queues/{queue}/messages")), body.clone());
        let share = total / clients + usize::from(c < total % clients);
        tasks.spawn(async move {
            for _ in 0..share {
                let status = http.post(&url).body(body.clone()).send().await.expect("put").status();
                assert_eq!(status, 201);
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("putter");
    }
    started.elapsed()
}

fn rate(n: usize, took: Duration) -> String {
    format!("{n} msgs in {:.2}s = {:.0} msg/s", took.as_secs_f64(), n as f64 / took.as_secs_f64())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let zk = ZkServer::start();
    let root = unique_root("bench");
    let mut config = test_config(&zk, &root);
    config.zookeeper.request_timeout = Duration::from_secs(20);
    config.log.level = "warn".into();
    let zkq = TestZkq::start_ready(config).await;
    println!("zkq queue benchmark (ZooKeeper 3.8 standalone on loopback, 2 cores, zkq in-process)");

    // Put throughput.
    let n1 = scaled(2_000);
    let took = put_many(&zkq, "put1", n1, 1).await;
    println!("put, 1 client:            {}", rate(n1, took));
    let n64 = scaled(20_000);
    let took = put_many(&zkq, "put64", n64, 64).await;
    println!("put, 64 clients:          {}", rate(n64, took));

    // Drain of a deep queue by 16 takers (the put64 queue is already full).
    let before = zkq.metrics().await;
    let started = Instant::now();
    let mut takers = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (http, url) = (zkq.http.clone(), zkq.url("/v1/queues/put64/take"));
        takers.spawn(async move {
            let mut n = 0usize;
            loop {
                let response = http.post(&url).send().await.expect("take");
                match response.status().as_u16() {
                    200 => n += 1,
                    204 => return n,
                    other => panic!("take: {other}"),
                }
            }
        });
    }
    let mut drained = 0;
    while let Some(n) = takers.join_next().await {
        drained += n.expect("taker");
    }
    let took = started.elapsed();
    let after = zkq.metrics().await;
    let reads = metric(&after, "zkq_zookeeper_requests_total{operation=\"get_children\",outcome=\"ok\"}")
        - metric(&before, "zkq_zookeeper_requests_total{operation=\"get_children\",outcome=\"ok\"}");
    let zk_calls: f64 = ["get_data", "delete", "create", "multi", "set_data"]
        .iter()
        .map(|op| {
            let series = format!("zkq_zookeeper_requests_total{{operation=\"{op}\",outcome=\"ok\"}}");
            metric(&after, &series) - metric(&before, &series)
        })
        .sum();
    assert_eq!(drained, n64, "every message drained once");
    println!(
        "drain, 16 takers:         {} ; getChildren calls: {reads} ({:.5} per message); other ZooKeeper calls per message: {:.2}",
        rate(drained, took),
        reads / drained as f64,
        zk_calls / drained as f64
    );

    // Lease+ack drain by 16 consumers.
    put_many(&zkq, "leases", n64, 64).await;
    let started = Instant::now();
    let mut consumers = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (http, base) = (zkq.http.clone(), zkq.api.clone());
        consumers.spawn(async move {
            let mut n = 0usize;
            loop {
                let response = http.post(format!("{base}/v1/queues/leases/leases")).send().await.expect("lease");
                if response.status() == 204 {
                    return n;
                }
                assert_eq!(response.status(), 200);
                let receipt = response.headers()["zkq-lease"].to_str().expect("ascii").to_owned();
                let acked = http.delete(format!("{base}/v1/queues/leases/leases/{receipt}")).send().await.expect("ack");
                assert_eq!(acked.status(), 204);
                n += 1;
            }
        });
    }
    let mut acked = 0;
    while let Some(n) = consumers.join_next().await {
        acked += n.expect("consumer");
    }
    assert_eq!(acked, n64, "every message leased and acked once");
    println!("lease+ack, 16 consumers:  {}", rate(acked, started.elapsed()));

    // put→take latency with a waiting taker.
    let rounds = scaled(500);
    let mut latencies = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let (http, url) = (zkq.http.clone(), zkq.url("/v1/queues/lat/take?wait=10s"));
        let taker = tokio::spawn(async move {
            let response = http.post(&url).send().await.expect("take");
            assert_eq!(response.status(), 200);
            Instant::now()
        });
        // Wait until the taker is registered, then put.
        loop {
            if zkq.metrics().await.contains("zkq_waiting_takers{queue=\"lat\"} 1") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let put_at = Instant::now();
        zkq.put_ok("lat", b"ping").await;
        let got_at = taker.await.expect("taker");
        latencies.push(got_at.duration_since(put_at));
    }
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p) as usize];
    println!(
        "put->take latency:        p50 {:.2} ms, p99 {:.2} ms over {rounds} rounds",
        pct(0.5).as_secs_f64() * 1000.0,
        pct(0.99).as_secs_f64() * 1000.0
    );

    // Curator on the same server.
    let path = format!("{root}/curator-bench");
    let out = Curator::run(&zk, &["bench", "put", &path, &n1.to_string(), "100"]).await;
    println!("Curator put, 1 producer:  {}", out.join(" "));
    // Fill a queue through zkq's fifo layout (identical to Curator's), then let Curator drain it.
    let mut drain_config = test_config(&zk, &root);
    drain_config.log.level = "warn".into();
    drain_config.zookeeper.request_timeout = Duration::from_secs(20);
    harness::declare(&mut drain_config, "cdrain", zkq::config::QueueKind::Fifo, Some(&format!("{root}/cdrain")), None);
    let filler = TestZkq::start_ready(drain_config).await;
    put_many(&filler, "cdrain", n64, 64).await;
    filler.stop().await;
    let out = Curator::run(&zk, &["bench", "drain", &format!("{root}/cdrain"), &n64.to_string(), "600000"]).await;
    println!("Curator drain, 1 consumer: {}", out.join(" "));
    let mut lock_config = test_config(&zk, &root);
    lock_config.log.level = "warn".into();
    lock_config.zookeeper.request_timeout = Duration::from_secs(20);
    harness::declare(
        &mut lock_config,
        "clock",
        zkq::config::QueueKind::Fifo,
        Some(&format!("{root}/clock")),
        Some(&format!("{root}/clock-locks")),
    );
    let filler = TestZkq::start_ready(lock_config).await;
    put_many(&filler, "clock", n64, 64).await;
    filler.stop().await;
    let out = Curator::run(
        &zk,
        &[
            "bench",
            "drain",
            &format!("{root}/clock"),
            &n64.to_string(),
            "900000",
            "--lock",
            &format!("{root}/clock-locks"),
        ],
    )
    .await;
    println!("Curator lock-safe drain, 1 consumer: {}", out.join(" "));
    zkq.stop().await;
}
