//! Queue benchmark: prints figures and ratios against targets, asserts nothing about speed.
//!
//! `cargo bench --bench queue` (after `scripts/test.sh` installed ZooKeeper and the Curator jars).
//! Starts one private ZooKeeper and, in one run against it, measures (100-byte messages):
//! - ZooKeeper's own ceiling through the client crate zkq uses: single creates with 128 in
//!   flight, and `multi`s of 100 creates;
//! - zkq (in-process, over HTTP): single puts from 1 and 64 clients, batch puts of 100 from 8
//!   clients, drains by 16 takers with single takes and with `?max=100`, lease+ack drains by 16
//!   consumers with single leases and acks and with `?max=100` leases and batch acks, and
//!   put→take latency with a waiting taker;
//! - Curator 5.4.0 (tests/java/CuratorTool): synchronous put, background put, consumer without
//!   lock, lock-safe consumer.
//!
//! Then it prints each target ratio with "target met" or "NOT met". Every drain checks that
//! each message body came out exactly once. ZKQ_BENCH_SCALE=0.1 runs everything 10× smaller.
//! `ZKQ_BENCH_BASELINE=path/to/older/zkq` also runs the `?max=100` take drain on that build and
//! on this one, both as child processes, so before and after are compared in one run.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "benchmarks drive ZooKeeper directly (its raw ceiling) and read their environment"
)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;
use zkq_testkit::*;
use zookeeper_client::{Acls, CreateMode};

fn scaled(n: usize) -> usize {
    let scale: f64 = std::env::var("ZKQ_BENCH_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    ((n as f64) * scale).max(1.0) as usize
}

fn per_second(n: usize, took: Duration) -> f64 {
    n as f64 / took.as_secs_f64()
}

fn rate(n: usize, took: Duration) -> String {
    format!("{n} in {:.2}s = {:.0}/s", took.as_secs_f64(), per_second(n, took))
}

/// The first `= X msg/s` figure of a CuratorTool bench line.
fn curator_rate(line: &str) -> f64 {
    line.split("= ").nth(1).and_then(|rest| rest.split(" msg/s").next()).and_then(|v| v.parse().ok()).unwrap_or(0.0)
}

// ------------------------------------------------------------------ ZooKeeper's raw ceiling

/// Nodes created under `{base}/p{n}`, at most 5,000 per parent (so a parent's child list stays
/// far below `jute.maxbuffer` for the cleanup).
const PER_PARENT: usize = 5_000;

async fn make_parents(client: &zookeeper_client::Client, base: &str, nodes: usize) {
    let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
    client.create(base, &[], &options).await.expect("raw base");
    for p in 0..nodes.div_ceil(PER_PARENT) {
        client.create(&format!("{base}/p{p}"), &[], &options).await.expect("raw parent");
    }
}

/// `n` single sequential creates of 100 bytes, `in_flight` at a time.
async fn raw_creates(client: &zookeeper_client::Client, base: &str, n: usize, in_flight: usize) -> Duration {
    make_parents(client, base, n).await;
    let data = vec![b'x'; 100];
    let options = CreateMode::PersistentSequential.with_acls(Acls::anyone_all());
    let prefixes: Vec<String> = (0..n.div_ceil(PER_PARENT)).map(|p| format!("{base}/p{p}/n-")).collect();
    let (data, options, prefixes) = (&data, &options, &prefixes);
    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(move |i| client.create(&prefixes[i / PER_PARENT], data, options))
        .buffer_unordered(in_flight)
        .for_each(|created| {
            created.expect("raw create");
            futures::future::ready(())
        })
        .await;
    started.elapsed()
}

/// `transactions` multis of `per_txn` sequential creates of 100 bytes, `in_flight` at a time.
async fn raw_multis(
    client: &zookeeper_client::Client,
    base: &str,
    transactions: usize,
    per_txn: usize,
    in_flight: usize,
) -> Duration {
    make_parents(client, base, transactions * per_txn).await;
    let data = vec![b'x'; 100];
    let options = CreateMode::PersistentSequential.with_acls(Acls::anyone_all());
    let prefixes: Vec<String> =
        (0..(transactions * per_txn).div_ceil(PER_PARENT)).map(|p| format!("{base}/p{p}/n-")).collect();
    let (data, options, prefixes) = (&data, &options, &prefixes);
    let started = Instant::now();
    futures::stream::iter(0..transactions)
        .map(move |t| {
            let mut writer = client.new_multi_writer();
            for _ in 0..per_txn {
                writer.add_create(&prefixes[t * per_txn / PER_PARENT], data, options).expect("add create");
            }
            writer.commit()
        })
        .buffer_unordered(in_flight)
        .for_each(|committed| {
            assert_eq!(committed.expect("raw multi").len(), per_txn);
            futures::future::ready(())
        })
        .await;
    started.elapsed()
}

/// Deletes what the raw measurements created (so later figures run on a small tree).
async fn raw_cleanup(client: &zookeeper_client::Client, base: &str) {
    let parents = client.list_children(base).await.unwrap_or_default();
    for parent in parents {
        let parent = format!("{base}/{parent}");
        let nodes = client.list_children(&parent).await.expect("raw children");
        let deletes = nodes.chunks(1000).map(|chunk| {
            let mut writer = client.new_multi_writer();
            for node in chunk {
                writer.add_delete(&format!("{parent}/{node}"), None).expect("add delete");
            }
            writer.commit()
        });
        futures::stream::iter(deletes)
            .buffer_unordered(4)
            .for_each(|r| {
                r.expect("raw delete");
                futures::future::ready(())
            })
            .await;
        client.delete(&parent, None).await.expect("delete raw parent");
    }
    client.delete(base, None).await.expect("delete raw base");
}

// ------------------------------------------------------------------ zkq over HTTP

/// ZooKeeper calls zkq made between two scrapes, by operation.
fn zk_calls(before: &str, after: &str) -> String {
    ["get_children", "get_data", "create", "delete", "multi", "set_data", "sync"]
        .iter()
        .filter_map(|op| {
            let series = format!("zkq_zookeeper_requests_total{{operation=\"{op}\",outcome=\"ok\"}}");
            let n = metric(after, &series) - metric(before, &series);
            (n > 0.0).then_some((op, n))
        })
        .map(|(op, n)| format!("{op} {n:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

async fn latency(zkq: &TestZkq, rounds: usize) -> (Duration, Duration) {
    // The queue must exist: a take from a dynamic queue whose node does not exist answers 204 at once.
    zkq.put_ok("lat", b"open").await;
    assert_eq!(zkq.take_body("lat", "0s").await.as_deref(), Some(b"open".as_slice()));
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
            assert!(!taker.is_finished(), "the taker answered before any put");
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
    (pct(0.5), pct(0.99))
}

/// One target line: `value / base = ratio× (target ≥ want×)` and whether it is met.
fn ratio_line(what: &str, value: f64, base: f64, want: f64) -> String {
    let ratio = value / base;
    let verdict = if ratio >= want { "target met" } else { "NOT met" };
    format!("  {what:<58} {value:>8.0} / {base:>8.0} = {ratio:>6.2}x  (target >= {want}x)  {verdict}")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let zk = ZkServer::start();
    let root = unique_root("bench");
    println!("zkq queue benchmark: one ZooKeeper 3.8 standalone on loopback, zkq in-process, Curator 5.4.0 beside,");
    println!("100-byte messages; figures in messages (or nodes) per second\n");

    // ZooKeeper's raw ceiling, through the client crate zkq uses (after a warm-up of the JVM).
    let direct = zk_client(&zk).await;
    raw_creates(&direct, &format!("{root}-raw-warmup"), scaled(20_000), 128).await;
    raw_cleanup(&direct, &format!("{root}-raw-warmup")).await;
    raw_multis(&direct, &format!("{root}-raw-warmup"), scaled(200), 100, 8).await;
    raw_cleanup(&direct, &format!("{root}-raw-warmup")).await;
    let raw_n = scaled(40_000);
    let took = raw_creates(&direct, &format!("{root}-raw-creates"), raw_n, 128).await;
    let raw_create = per_second(raw_n, took);
    println!("ZooKeeper create, 128 in flight:            {} nodes", rate(raw_n, took));
    let raw_txns = scaled(1_000);
    let took = raw_multis(&direct, &format!("{root}-raw-multi"), raw_txns, 100, 8).await;
    let raw_multi = per_second(raw_txns * 100, took);
    println!("ZooKeeper multi of 100 creates, 8 in flight: {} nodes", rate(raw_txns * 100, took));
    raw_cleanup(&direct, &format!("{root}-raw-creates")).await;
    raw_cleanup(&direct, &format!("{root}-raw-multi")).await;

    let mut config = test_config(&zk, &root);
    config.zookeeper.request_timeout = Duration::from_secs(20);
    config.log.level = "warn".into();
    let zkq = TestZkq::start_ready(config).await;
    let api = Endpoint::of(&zkq);

    // Single puts.
    let n1 = scaled(2_000);
    let took = put_singles(&api, "put1", 0..n1, 1).await;
    println!("zkq put, 1 client:                          {}", rate(n1, took));
    let n = scaled(20_000);
    let put64 = 1_000_000..1_000_000 + n;
    let took = put_singles(&api, "put64", put64.clone(), 64).await;
    let single_puts = per_second(n, took);
    println!("zkq put, 64 clients:                        {}", rate(n, took));

    // Batch puts of 100 from 8 clients, into the two queues the batch drains use.
    let (take_range, lease_range) = (2_000_000..2_000_000 + n, 3_000_000..3_000_000 + n);
    let before = zkq.metrics().await;
    let took = put_batches(&api, &[("btake", take_range.clone()), ("blease", lease_range.clone())], 100, 8).await;
    let after = zkq.metrics().await;
    let batch_puts = per_second(2 * n, took);
    println!(
        "zkq batch put of 100, 8 clients:            {} ; ZooKeeper calls: {}",
        rate(2 * n, took),
        zk_calls(&before, &after)
    );

    // Drains: single takes (the put64 queue), then takes of up to 100.
    let before = zkq.metrics().await;
    let (bodies, took) = drain_takes(&api, "put64", 16, None).await;
    let after = zkq.metrics().await;
    assert_exactly_once("single-take drain", bodies, put64);
    println!(
        "zkq take drain, 16 takers, single take:     {} ; ZooKeeper calls: {}",
        rate(n, took),
        zk_calls(&before, &after)
    );
    let before = zkq.metrics().await;
    let (bodies, took) = drain_takes(&api, "btake", 16, Some(100)).await;
    let after = zkq.metrics().await;
    assert_exactly_once("batch-take drain", bodies, take_range);
    let batch_take = per_second(n, took);
    println!(
        "zkq take drain, 16 takers, ?max=100:        {} ; ZooKeeper calls: {}",
        rate(n, took),
        zk_calls(&before, &after)
    );

    // Lease+ack drains: single (a queue filled by batch puts), then leases of 100 and batch acks.
    let single_lease = 4_000_000..4_000_000 + n;
    put_batches(&api, &[("slease", single_lease.clone())], 100, 8).await;
    let before = zkq.metrics().await;
    let (bodies, took) = drain_leases(&api, "slease", 16, None).await;
    let after = zkq.metrics().await;
    assert_exactly_once("single lease+ack drain", bodies, single_lease);
    println!(
        "zkq lease+ack drain, 16 consumers, single:  {} ; ZooKeeper calls: {}",
        rate(n, took),
        zk_calls(&before, &after)
    );
    let before = zkq.metrics().await;
    let (bodies, took) = drain_leases(&api, "blease", 16, Some(100)).await;
    let after = zkq.metrics().await;
    assert_exactly_once("batch lease+ack drain", bodies, lease_range);
    let batch_lease = per_second(n, took);
    println!(
        "zkq lease+ack drain, 16 consumers, ?max=100: {} ; ZooKeeper calls: {}",
        rate(n, took),
        zk_calls(&before, &after)
    );

    // put→take latency with a waiting taker.
    let rounds = scaled(500);
    let (p50, p99) = latency(&zkq, rounds).await;
    println!(
        "zkq put->take latency, waiting taker:       p50 {:.2} ms, p99 {:.2} ms over {rounds} rounds",
        ms(p50),
        ms(p99)
    );

    // Queues for Curator's consumers, filled through zkq (the same layout as Curator's), then
    // zkq stops so that only Curator works on them.
    let (cdrain, clock) = (5_000_000..5_000_000 + n, 6_000_000..6_000_000 + n);
    put_batches(&api, &[("cdrain", cdrain), ("clock", clock)], 100, 8).await;
    zkq.stop().await;

    // Before and after, in this run: another build and this one, both as child processes.
    if let Ok(baseline) = std::env::var("ZKQ_BENCH_BASELINE") {
        let builds = [("baseline", PathBuf::from(baseline)), ("this build", PathBuf::from(env!("CARGO_BIN_EXE_zkq")))];
        for (label, binary) in builds {
            let child = ChildZkq::start_binary(&binary, &zk, &unique_root("bench-build"), &[]).await;
            let api = Endpoint::child(&child);
            let range = 7_000_000..7_000_000 + n;
            put_batches(&api, &[("compare", range.clone())], 100, 8).await;
            let (bodies, took) = drain_takes(&api, "compare", 16, Some(100)).await;
            assert_exactly_once(&format!("{label}: batch-take drain"), bodies, range);
            println!(
                "{label:<10} (child process) take drain, 16 takers, ?max=100: {} ; {}",
                rate(n, took),
                binary.display()
            );
        }
    }

    // Curator on the same server.
    let out = Curator::run(&zk, &["bench", "put", &format!("{root}/curator-put"), &n1.to_string(), "100"]).await;
    println!("Curator put, synchronous, 1 producer:       {}", out.join(" "));
    let out =
        Curator::run(&zk, &["bench", "put-background", &format!("{root}/curator-bg"), &n.to_string(), "100"]).await;
    let curator_background = curator_rate(&out.join(" "));
    println!("Curator put, background, 1 producer:        {}", out.join(" "));
    let path = format!("{root}/queues/cdrain");
    let out = Curator::run(&zk, &["bench", "drain", &path, &n.to_string(), "900000"]).await;
    let curator_drain = curator_rate(&out.join(" "));
    println!("Curator drain, 1 consumer without lock:     {}", out.join(" "));
    assert!(children(&direct, &path).await.is_empty(), "Curator's drain took every message, once");
    let path = format!("{root}/queues/clock");
    let lock = format!("{root}/locks/clock");
    let out = Curator::run(&zk, &["bench", "drain", &path, &n.to_string(), "900000", "--lock", &lock]).await;
    let curator_locked = curator_rate(&out.join(" "));
    println!("Curator drain, 1 lock-safe consumer:        {}", out.join(" "));
    assert!(children(&direct, &path).await.is_empty(), "Curator's lock-safe drain took every message, once");

    println!("\ntargets (this run; ratios of the figures above):");
    println!(
        "{}",
        ratio_line("single puts, 64 clients vs Curator background put", single_puts, curator_background, 3.0)
    );
    println!(
        "{}",
        ratio_line("single puts, 64 clients vs ZooKeeper creates, 128 in flight", single_puts, raw_create, 0.5)
    );
    println!("{}", ratio_line("batch puts of 100 vs ZooKeeper multi of 100 creates", batch_puts, raw_multi, 0.5));
    println!(
        "{}",
        ratio_line("lease+ack drain, ?max=100 + batch ack vs Curator lock-safe", batch_lease, curator_locked, 20.0)
    );
    println!(
        "{}",
        ratio_line("take drain, ?max=100 vs Curator consumer without lock", batch_take, curator_drain, 20.0)
    );
    let met = |ok: bool| if ok { "target met" } else { "NOT met" };
    println!("  put->take latency p50 {:.2} ms (target <= 5 ms)  {}", ms(p50), met(p50 <= Duration::from_millis(5)));
    println!("  put->take latency p99 {:.2} ms (target <= 25 ms)  {}", ms(p99), met(p99 <= Duration::from_millis(25)));
}
