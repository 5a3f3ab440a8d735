//! What an `Idempotency-Key` costs a put: prints figures, asserts nothing about speed.
//!
//! `cargo bench --bench idempotency` (after `scripts/test.sh` installed ZooKeeper). Starts a private
//! ZooKeeper and zkq in-process and, in the same run, puts 100-byte messages without and with a
//! key (a new key per message), with 1 and 64 concurrent HTTP clients, alternating the two so
//! that both see the same machine; then puts the keyed messages again (replays). Prints the rate
//! and the ZooKeeper calls per put of each. `ZKQ_BENCH_SCALE=0.1` for a quick run;
//! `ZKQ_BENCH_ROUNDS` (default 2) alternations.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "benchmarks drive ZooKeeper and read their environment directly"
)]

use std::time::{Duration, Instant};

use zkq_testkit::*;

fn scaled(n: usize) -> usize {
    let scale: f64 = std::env::var("ZKQ_BENCH_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    ((n as f64) * scale).max(1.0) as usize
}

/// Puts `total` messages with `clients` concurrent clients; with `keys`, message `i` carries the
/// key `{keys}-{i}`. `replay`: every answer must be a replay.
async fn put_many(
    zkq: &TestZkq,
    queue: &str,
    total: usize,
    clients: usize,
    keys: Option<&str>,
    replay: bool,
) -> Duration {
    let body = vec![b'x'; 100];
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let (http, url, body) = (zkq.http.clone(), zkq.url(&format!("/v1/queues/{queue}/messages")), body.clone());
        let keys = keys.map(str::to_owned);
        tasks.spawn(async move {
            for i in (c..total).step_by(clients) {
                let mut request = http.post(&url).body(body.clone());
                if let Some(keys) = &keys {
                    request = request.header("Idempotency-Key", format!("{keys}-{i}"));
                }
                let response = request.send().await.expect("put");
                assert_eq!(response.status(), 201);
                assert_eq!(response.headers().contains_key("zkq-idempotent-replay"), replay);
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("putter");
    }
    started.elapsed()
}

/// ZooKeeper calls (every operation, every outcome) so far.
async fn zk_calls(zkq: &TestZkq) -> f64 {
    metric_sum(&zkq.metrics().await, "zkq_zookeeper_requests_total", &[], &[])
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let zk = ZkServer::start();
    let root = unique_root("bench-idem");
    let mut config = test_config(&zk, &root);
    config.zookeeper.request_timeout = Duration::from_secs(20);
    config.log.level = "warn".into();
    let zkq = TestZkq::start_ready(config).await;
    let rounds: usize = std::env::var("ZKQ_BENCH_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2);
    println!(
        "zkq idempotent put benchmark (ZooKeeper 3.8 standalone on loopback, 2 cores, zkq in-process, 100-byte messages)"
    );
    // Warm up: queues open, directories exist.
    put_many(&zkq, "plain", 100, 4, None, false).await;
    put_many(&zkq, "keyed", 100, 4, Some("warm"), false).await;

    for (clients, n) in [(1, scaled(2_000)), (64, scaled(20_000))] {
        let mut plain = (Duration::ZERO, 0.0, 0);
        let mut keyed = (Duration::ZERO, 0.0, 0);
        let mut replays = (Duration::ZERO, 0.0, 0);
        for round in 0..rounds {
            let keys = format!("c{clients}-r{round}");
            let before = zk_calls(&zkq).await;
            plain.0 += put_many(&zkq, "plain", n, clients, None, false).await;
            let middle = zk_calls(&zkq).await;
            keyed.0 += put_many(&zkq, "keyed", n, clients, Some(&keys), false).await;
            let after = zk_calls(&zkq).await;
            replays.0 += put_many(&zkq, "keyed", n, clients, Some(&keys), true).await;
            let last = zk_calls(&zkq).await;
            plain.1 += middle - before;
            keyed.1 += after - middle;
            replays.1 += last - after;
            plain.2 += n;
            keyed.2 += n;
            replays.2 += n;
        }
        for (what, (took, calls, count)) in [("no key", plain), ("new key", keyed), ("replay", replays)] {
            println!(
                "put, {clients:>2} client(s), {what:<8} {count} msgs in {:.2}s = {:>6.0} msg/s, {:.2} ZooKeeper calls per put",
                took.as_secs_f64(),
                count as f64 / took.as_secs_f64(),
                calls / count as f64
            );
        }
    }
    zkq.stop().await;
}
