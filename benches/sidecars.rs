//! Many sidecars on one queue: prints figures, asserts only exactly-once.
//!
//! `cargo bench --bench sidecars` (after `scripts/test.sh` installed ZooKeeper and the Curator jars).
//! For K = 1, 4, 8, 16 it starts K real zkq processes (this build's binary) on one private
//! ZooKeeper, all serving the same declared queue and lock path; fills the queue with distinct
//! 100-byte messages through zkq puts (64 clients on the first sidecar, Curator's single-item
//! node format); then drains it with 16 HTTP consumers spread round-robin over the sidecars, once
//! with lease+ack and once with take (`wait=1s`). Per K and mode it prints the drain rate, ZooKeeper
//! packets per message (`mntr` `zk_packets_received` over the drain), writes per message (zkq's
//! `zkq_zookeeper_requests_total` for create, delete, set_data and multi, any outcome), claim
//! conflicts per message (claim transactions that failed), and whether every body was processed
//! exactly once, and CPU per message (all K zkq processes together; the ZooKeeper server), which
//! shows whether a lower rate at larger K is work per message or the K processes sharing the
//! machine's cores. Then 8 Curator lock-safe consumers (8 sessions in one JVM) drain the same number
//! of messages from the same kind of queue, as the anchor.
//!
//! Before the drain, the trickle: the same K sidecars, two consumers per consuming sidecar each
//! waiting in a long-poll (`wait=2s`, a lease acked at once, or a take), and one producer putting
//! `ZKQ_BENCH_TRICKLE_MESSAGES` (default 200) messages at 20 msg/s round-robin over every sidecar;
//! once with every sidecar consuming and (leases) once with one of the K consuming. Per message it prints
//! ZooKeeper requests (zkq's `zkq_zookeeper_requests_total`), transactions ZooKeeper logged (the
//! advance of its zxid, failed claims included), packets ZooKeeper sent (`mntr` `zk_packets_sent`:
//! replies and watch events), failed claims, put→delivery p50 and p99, and exactly-once. With leases
//! and K ≥ 3 also the kill row: every sidecar consuming, and the last one killed -9 once half the
//! messages are put (session timeout 6 s); its p50/p99 are of the messages put after the kill.
//!
//! Environment: `ZKQ_BENCH_MESSAGES` (default 5000),
//! `ZKQ_BENCH_SIDECARS` (default `1,4,8,16`), `ZKQ_BENCH_MODES` (default `lease,take`),
//! `ZKQ_BENCH_SUITES` (default `trickle,drain`), `ZKQ_BENCH_CURATOR=0` (no Curator anchor: its
//! column reads NaN), `ZKQ_BENCH_FLEET_WATCHERS` (default 3, zkq's; e.g. 0: every sidecar
//! runs with `queues_fleet_watchers = 0`, every member watching), `ZKQ_BENCH_PER_SIDECAR=1` (after each drain row, each
//! sidecar's claims by outcome, whether it watches or stands by, and its calls for help; before each
//! trickle row, the survivors' claims that did not win by outcome and their failed claim transactions),
//! `ZKQ_BENCH_BASELINE=path/to/zkq` to run the same table for another build first (e.g. the
//! previous release), so before and after are compared in one run.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "benchmarks drive ZooKeeper and read their environment directly"
)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zkq_testkit::*;

const CONSUMERS: usize = 16;
const QUEUE: &str = "bench";
/// `queues_fleet_watchers`' default: the members that watch a queue, the others standing by.
const WATCHERS: usize = 3;

/// The members that watch a queue (`ZKQ_BENCH_FLEET_WATCHERS`, passed to every sidecar as
/// `queues_fleet_watchers` when it is not zkq's default; 0: every member watches).
fn fleet_watchers() -> usize {
    std::env::var("ZKQ_BENCH_FLEET_WATCHERS")
        .map_or(WATCHERS, |w| w.parse().expect("ZKQ_BENCH_FLEET_WATCHERS is a number"))
}

/// Whether each drain row is followed by one line per sidecar (`ZKQ_BENCH_PER_SIDECAR=1`).
fn per_sidecar() -> bool {
    env_or("ZKQ_BENCH_PER_SIDECAR", "0") == "1"
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Lease,
    Take,
}

struct Figures {
    rate: f64,
    packets: f64,
    writes: f64,
    conflicts: f64,
    exactly_once: String,
    /// CPU milliseconds per message: all K zkq processes together, and the ZooKeeper server.
    cpu: (f64, f64),
    outcomes: String,
}

async fn scrape(http: &reqwest::Client, sidecars: impl IntoIterator<Item = &ChildZkq>) -> String {
    let mut all = String::new();
    for sidecar in sidecars {
        let text = http.get(format!("{}/metrics", sidecar.admin)).send().await.expect("metrics");
        all.push_str(&text.text().await.expect("metrics text"));
        all.push('\n');
    }
    all
}

/// Fills the queue through the first sidecar with `n` distinct bodies.
async fn fill(http: &reqwest::Client, sidecar: &ChildZkq, n: usize) {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut putters = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (http, url, next) = (http.clone(), format!("{}/v1/queues/{QUEUE}/messages", sidecar.api), next.clone());
        putters.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return;
                }
                let status = http.post(&url).body(body(i)).send().await.expect("put").status();
                assert_eq!(status, 201, "put");
            }
        });
    }
    while let Some(r) = putters.join_next().await {
        r.expect("putter");
    }
}

/// One consumer: leases+acks (or takes) until the queue stays empty for a whole `wait=1s`.
/// Returns the processed bodies and when the last one was processed.
async fn consume(http: reqwest::Client, api: String, mode: Mode) -> (Vec<Vec<u8>>, Instant) {
    let mut processed = Vec::new();
    let mut last = Instant::now();
    loop {
        let url = match mode {
            Mode::Lease => format!("{api}/v1/queues/{QUEUE}/leases?wait=1s"),
            Mode::Take => format!("{api}/v1/queues/{QUEUE}/take?wait=1s"),
        };
        let response = http.post(&url).send().await.expect("consume");
        match response.status().as_u16() {
            200 => {},
            204 => return (processed, last),
            503 => continue,
            other => panic!("consume answered {other}"),
        }
        let receipt = response.headers().get("zkq-lease").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let body = response.bytes().await.expect("body").to_vec();
        if let Some(receipt) = receipt {
            let acked = http.delete(format!("{api}/v1/queues/{QUEUE}/leases/{receipt}")).send().await.expect("ack");
            if acked.status() != 204 {
                // Lost lease: the message will be delivered again; not counted as processed.
                continue;
            }
        }
        processed.push(body);
        last = Instant::now();
    }
}

async fn run_one(zk: &ZkServer, binary: &Path, k: usize, mode: Mode, n: usize) -> Figures {
    let root = unique_root("sidecars");
    let path = format!("{root}/queues/{QUEUE}");
    let lock_path = format!("{root}/locks/{QUEUE}");
    let watchers = fleet_watchers().to_string();
    let mut env = vec![
        ("ZKQ__QUEUES__BENCH__KIND", "fifo"),
        ("ZKQ__QUEUES__BENCH__PATH", path.as_str()),
        ("ZKQ__QUEUES__BENCH__LOCK_PATH", lock_path.as_str()),
        ("ZKQ__ZOOKEEPER__REQUEST_TIMEOUT", "20s"),
    ];
    if watchers != WATCHERS.to_string() {
        env.push(("ZKQ__QUEUES_FLEET_WATCHERS", watchers.as_str()));
    }
    let mut sidecars = Vec::with_capacity(k);
    for _ in 0..k {
        sidecars.push(ChildZkq::start_binary(binary, zk, &root, &env).await);
    }
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("http client");
    fill(&http, &sidecars[0], n).await;
    let before = scrape(&http, &sidecars).await;
    let packets_before = zk.mntr("zk_packets_received");
    let zkq_cpu = || sidecars.iter().map(ChildZkq::cpu_time).sum::<Duration>();
    let (zkq_cpu_before, zk_cpu_before) = (zkq_cpu(), zk.cpu_time());
    let started = Instant::now();
    let mut consumers = tokio::task::JoinSet::new();
    for c in 0..CONSUMERS {
        consumers.spawn(consume(http.clone(), sidecars[c % k].api.clone(), mode));
    }
    let mut bodies: Vec<Vec<u8>> = Vec::with_capacity(n);
    let mut last = started;
    while let Some(done) = consumers.join_next().await {
        let (processed, at) = done.expect("consumer");
        bodies.extend(processed);
        last = last.max(at);
    }
    let took = last.duration_since(started).as_secs_f64().max(1e-9);
    let packets = zk.mntr("zk_packets_received") - packets_before;
    let (zkq_cpu_ms, zk_cpu_ms) = (
        (zkq_cpu() - zkq_cpu_before).as_secs_f64() * 1000.0 / n as f64,
        (zk.cpu_time() - zk_cpu_before).as_secs_f64() * 1000.0 / n as f64,
    );
    let after = scrape(&http, &sidecars).await;
    let delta = |name: &str, with: &[&str], without: &[&str]| {
        metric_sum(&after, name, with, without) - metric_sum(&before, name, with, without)
    };
    let requests = "zkq_zookeeper_requests_total";
    let writes: f64 = ["create", "delete", "set_data", "multi\""]
        .iter()
        .map(|op| delta(requests, &[&format!("operation=\"{op}")], &[]))
        .sum();
    let conflicts = delta(requests, &["operation=\"multi\""], &["outcome=\"ok\""]);
    let mut counts: HashMap<Vec<u8>, usize> = HashMap::with_capacity(n);
    for b in &bodies {
        *counts.entry(b.clone()).or_default() += 1;
    }
    let missing = (0..n).filter(|i| !counts.contains_key(&body(*i))).count();
    let duplicated = counts.values().filter(|c| **c > 1).count();
    let exactly_once = if missing == 0 && duplicated == 0 && bodies.len() == n {
        "yes".to_owned()
    } else {
        format!("NO: {missing} missing, {duplicated} duplicated")
    };
    let outcomes = ["won", "lost", "gone", "locked"]
        .iter()
        .map(|o| {
            let v = delta("zkq_claim_attempts_total", &[&format!("outcome=\"{o}\"")], &[]);
            format!("{o} {:.2}", v / n as f64)
        })
        .collect::<Vec<_>>()
        .join(", ");
    let pruned = delta("zkq_queue_candidates_pruned_total", &[], &[]);
    let multi_ms = 1000.0 * delta("zkq_zookeeper_request_duration_seconds_sum", &["operation=\"multi\""], &[])
        / delta("zkq_zookeeper_request_duration_seconds_count", &["operation=\"multi\""], &[]).max(1.0);
    if per_sidecar() {
        // Where a fleet-wide figure comes from: claims over the whole run (fill included).
        for (i, sidecar) in sidecars.iter().enumerate() {
            let text = scrape(&http, std::iter::once(sidecar)).await;
            let claims = ["won", "lost", "gone", "locked"]
                .iter()
                .map(|o| {
                    format!(
                        "{o} {}",
                        metric_sum(&text, "zkq_claim_attempts_total", &[&format!("outcome=\"{o}\"")], &[])
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            let gauge = |name: &str| metric_sum(&text, name, &[], &[]);
            println!(
                "  sidecar {i}: claims {claims}; watched {}, standing by {}, calls for help {}",
                gauge("zkq_queue_watched"),
                gauge("zkq_queue_fleet_standby"),
                gauge("zkq_queue_fleet_help_calls_total"),
            );
        }
    }
    drop(sidecars);
    Figures {
        rate: n as f64 / took,
        packets: packets / n as f64,
        writes: writes / n as f64,
        conflicts: conflicts / n as f64,
        exactly_once,
        cpu: (zkq_cpu_ms, zk_cpu_ms),
        outcomes: format!("{outcomes}; pruned {:.2}; multi {multi_ms:.1} ms", pruned / n as f64),
    }
}

/// What one trickle run measured, per message.
struct Trickle {
    requests: f64,
    transactions: f64,
    packets_sent: f64,
    failed_claims: f64,
    p50_ms: f64,
    p99_ms: f64,
    exactly_once: String,
}

/// One trickle consumer: waits in long-polls until `stop`, and records when each body arrived
/// (a lease counts once acked).
async fn trickle_consumer(
    http: reqwest::Client,
    api: String,
    mode: Mode,
    stop: tokio_util::sync::CancellationToken,
) -> Consumed {
    let (mut got, mut unsure) = (Vec::new(), Vec::new());
    let url = match mode {
        Mode::Lease => format!("{api}/v1/queues/{QUEUE}/leases?wait=2s"),
        Mode::Take => format!("{api}/v1/queues/{QUEUE}/take?wait=2s"),
    };
    while !stop.is_cancelled() {
        let response = tokio::select! {
            r = http.post(&url).send() => r,
            _ = stop.cancelled() => break,
        };
        let response = match response {
            Ok(response) => response,
            // Its sidecar was killed (the kill row): nothing more to consume there.
            Err(e) if e.is_connect() => break,
            Err(_) => continue,
        };
        if response.status() != 200 {
            continue;
        }
        let at = Instant::now();
        let receipt = response.headers().get("zkq-lease").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let Ok(body) = response.bytes().await else { continue };
        if let Some(receipt) = receipt {
            match http.delete(format!("{api}/v1/queues/{QUEUE}/leases/{receipt}")).send().await {
                Ok(acked) if acked.status() == 204 => {},
                // No answer (its sidecar was killed): the ack may or may not have been applied.
                Err(_) => {
                    unsure.push(body.to_vec());
                    continue;
                },
                Ok(_) => continue,
            }
        }
        got.push((body.to_vec(), at));
    }
    Consumed { got, unsure }
}

/// What one trickle consumer processed: each body with when it arrived, and the bodies whose ack got
/// no answer.
struct Consumed {
    got: Vec<(Vec<u8>, Instant)>,
    unsure: Vec<Vec<u8>>,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// The session timeout of the kill row's sidecars: a killed sidecar's leases and fleet membership
/// end with its session.
const KILL_SESSION_TIMEOUT: &str = "6s";

/// K sidecars, `consuming` of them with two waiting consumers each, `n` messages put at 20 msg/s
/// round-robin over all K. With `kill`, the last sidecar (a consuming one) is killed -9 once half the
/// messages are put, the rest go round-robin over the others, and p50/p99 are of the messages put
/// after the kill; requests and failed claims are then the survivors' only.
async fn run_trickle(
    zk: &ZkServer,
    binary: &Path,
    k: usize,
    consuming: usize,
    mode: Mode,
    n: usize,
    kill: bool,
) -> Trickle {
    let root = unique_root("sidecars-trickle");
    let path = format!("{root}/queues/{QUEUE}");
    let lock_path = format!("{root}/locks/{QUEUE}");
    let watchers = fleet_watchers().to_string();
    let mut env = vec![
        ("ZKQ__QUEUES__BENCH__KIND", "fifo"),
        ("ZKQ__QUEUES__BENCH__PATH", path.as_str()),
        ("ZKQ__QUEUES__BENCH__LOCK_PATH", lock_path.as_str()),
    ];
    if watchers != WATCHERS.to_string() {
        env.push(("ZKQ__QUEUES_FLEET_WATCHERS", watchers.as_str()));
    }
    if kill {
        env.push(("ZKQ__ZOOKEEPER__SESSION_TIMEOUT", KILL_SESSION_TIMEOUT));
    }
    let mut sidecars = Vec::with_capacity(k);
    for _ in 0..k {
        sidecars.push(ChildZkq::start_binary(binary, zk, &root, &env).await);
    }
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("http client");
    // Every sidecar opens the queue (a producer-only one does with its first put).
    for sidecar in &sidecars {
        let url = format!("{}/v1/queues/{QUEUE}/messages", sidecar.api);
        assert_eq!(http.post(&url).body("warm-up").send().await.expect("put").status(), 201);
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let mut consumers = tokio::task::JoinSet::new();
    for sidecar in sidecars.iter().take(consuming) {
        for _ in 0..2 {
            consumers.spawn(trickle_consumer(http.clone(), sidecar.api.clone(), mode, stop.clone()));
        }
    }
    // The warm-up messages drained, the consumers' fleet known, and the members that stand by
    // no longer watching (builds without a fleet or a standby: 25 s).
    let settled = Instant::now();
    loop {
        let text = scrape(&http, &sidecars).await;
        let members = metric_sum(&text, "zkq_queue_fleet_members", &[], &[]);
        let children = metric_sum(&text, "zkq_queue_children", &[], &[]);
        // A build without fleets has no such series.
        let fleet_known =
            consuming == 1 || members == (consuming * consuming) as f64 || !text.contains("zkq_queue_fleet_members");
        let watching = metric_sum(&text, "zkq_queue_watched", &[], &[]);
        let watchers = match fleet_watchers() {
            0 => consuming,
            w => consuming.min(w),
        };
        let standby_settled = !text.contains("zkq_queue_watched") || watching <= watchers as f64;
        if (fleet_known && standby_settled && children == 0.0) || settled.elapsed() > Duration::from_secs(25) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let victim = kill.then(|| k - 1);
    // The sidecars counted: with a kill, the survivors (the victim's counters die with it).
    let counted: Vec<&ChildZkq> =
        sidecars.iter().enumerate().filter(|(i, _)| Some(*i) != victim).map(|(_, s)| s).collect();
    let before = scrape(&http, counted.iter().copied()).await;
    let (packets_before, zxid_before) = (zk.mntr("zk_packets_sent"), zk.zxid());
    let mut put_at: HashMap<Vec<u8>, Instant> = HashMap::with_capacity(n);
    let mut killed_at = None;
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    for i in 0..n {
        tick.tick().await;
        if killed_at.is_none()
            && i == n / 2
            && let Some(victim) = victim
        {
            sidecars[victim].signal("KILL");
            killed_at = Some(Instant::now());
        }
        let live = if killed_at.is_some() { counted[i % counted.len()] } else { &sidecars[i % k] };
        let url = format!("{}/v1/queues/{QUEUE}/messages", live.api);
        put_at.insert(body(i), Instant::now());
        assert_eq!(http.post(&url).body(body(i)).send().await.expect("put").status(), 201, "put");
    }
    // Until every message is delivered (or 30 s after the last put): the survivors see no message
    // left (a lease the victim held comes back when its session ends).
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let text = scrape(&http, counted.iter().copied()).await;
        let delivered = if victim.is_some() {
            metric_sum(&text, "zkq_queue_children", &[], &[]) == 0.0
        } else {
            let done = ["zkq_messages_acked_total", "zkq_messages_taken_total"]
                .iter()
                .map(|name| metric_sum(&text, name, &[], &[]) - metric_sum(&before, name, &[], &[]))
                .sum::<f64>();
            done >= n as f64
        };
        if delivered {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = scrape(&http, counted.iter().copied()).await;
    let (packets, zxids) = (zk.mntr("zk_packets_sent") - packets_before, zk.zxid() - zxid_before);
    stop.cancel();
    let (mut got, mut unsure) = (Vec::new(), std::collections::HashSet::new());
    while let Some(done) = consumers.join_next().await {
        let done = done.expect("consumer");
        got.extend(done.got);
        unsure.extend(done.unsure);
    }
    let delta = |name: &str, with: &[&str], without: &[&str]| {
        metric_sum(&after, name, with, without) - metric_sum(&before, name, with, without)
    };
    let failed = ["lost", "gone", "locked"]
        .iter()
        .map(|o| delta("zkq_claim_attempts_total", &[&format!("outcome=\"{o}\"")], &[]))
        .sum::<f64>();
    if per_sidecar() {
        let each = ["lost", "gone", "locked"]
            .iter()
            .map(|o| format!("{o} {}", delta("zkq_claim_attempts_total", &[&format!("outcome=\"{o}\"")], &[])))
            .collect::<Vec<_>>()
            .join(", ");
        let txns = delta("zkq_zookeeper_requests_total", &["operation=\"multi\""], &["outcome=\"ok\""]);
        println!("  claims that did not win: {each}; claim transactions that failed: {txns}");
    }
    let mut latencies = Vec::with_capacity(n);
    let mut counts: HashMap<Vec<u8>, usize> = HashMap::with_capacity(n);
    for (b, at) in &got {
        let Some(put) = put_at.get(b) else { continue }; // a warm-up message
        *counts.entry(b.clone()).or_default() += 1;
        if killed_at.is_none_or(|killed| *put >= killed) {
            latencies.push(at.saturating_duration_since(*put).as_secs_f64() * 1000.0);
        }
    }
    latencies.sort_by(f64::total_cmp);
    // A body whose ack got no answer may have been processed there (the kill came after the ack).
    let missing = (0..n).filter(|i| !counts.contains_key(&body(*i)) && !unsure.contains(&body(*i))).count();
    let duplicated = counts.values().filter(|c| **c > 1).count();
    let exactly_once = if missing == 0 && duplicated == 0 {
        "yes".to_owned()
    } else {
        format!("NO: {missing} missing, {duplicated} duplicated")
    };
    drop(sidecars);
    Trickle {
        requests: delta("zkq_zookeeper_requests_total", &[], &[]) / n as f64,
        transactions: zxids as f64 / n as f64,
        packets_sent: packets / n as f64,
        failed_claims: failed / n as f64,
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
        exactly_once,
    }
}

/// 8 Curator lock-safe consumers (8 sessions) drain `n` messages put through zkq.
async fn curator_anchor(zk: &ZkServer, binary: &Path, n: usize) -> (String, f64) {
    let root = unique_root("sidecars-curator");
    let path = format!("{root}/queues/{QUEUE}");
    let lock_path = format!("{root}/locks/{QUEUE}");
    let watchers = fleet_watchers().to_string();
    let mut env = vec![
        ("ZKQ__QUEUES__BENCH__KIND", "fifo"),
        ("ZKQ__QUEUES__BENCH__PATH", path.as_str()),
        ("ZKQ__QUEUES__BENCH__LOCK_PATH", lock_path.as_str()),
    ];
    if watchers != WATCHERS.to_string() {
        env.push(("ZKQ__QUEUES_FLEET_WATCHERS", watchers.as_str()));
    }
    let filler = ChildZkq::start_binary(binary, zk, &root, &env).await;
    let http = reqwest::Client::new();
    fill(&http, &filler, n).await;
    drop(filler);
    let packets_before = zk.mntr("zk_packets_received");
    let out = Curator::run(
        zk,
        &["bench", "drain", &path, &n.to_string(), "600000", "--lock", &lock_path, "--consumers", "8"],
    )
    .await;
    let packets = zk.mntr("zk_packets_received") - packets_before;
    (out.join(" "), packets / n as f64)
}

fn rate_of(curator: &str) -> f64 {
    curator.split(" = ").nth(1).and_then(|r| r.split_whitespace().next()).and_then(|r| r.parse().ok()).unwrap_or(0.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    raise_open_files();
    let n: usize = env_or("ZKQ_BENCH_MESSAGES", "5000").parse().expect("ZKQ_BENCH_MESSAGES is a number");
    let ks: Vec<usize> = env_or("ZKQ_BENCH_SIDECARS", "1,4,8,16")
        .split(',')
        .map(|k| k.trim().parse().expect("ZKQ_BENCH_SIDECARS: numbers"))
        .collect();
    let modes: Vec<Mode> = env_or("ZKQ_BENCH_MODES", "lease,take")
        .split(',')
        .map(|m| if m.trim() == "take" { Mode::Take } else { Mode::Lease })
        .collect();
    let this_build = PathBuf::from(env!("CARGO_BIN_EXE_zkq"));
    let mut builds = Vec::new();
    if let Ok(baseline) = std::env::var("ZKQ_BENCH_BASELINE") {
        builds.push(("baseline", PathBuf::from(baseline)));
    }
    builds.push(("this", this_build.clone()));
    for (label, binary) in &builds {
        println!("{label}: {}", binary.display());
    }

    let zk = ZkServer::start();
    let suites = env_or("ZKQ_BENCH_SUITES", "trickle,drain");
    if suites.contains("trickle") {
        let n: usize = env_or("ZKQ_BENCH_TRICKLE_MESSAGES", "200").parse().expect("ZKQ_BENCH_TRICKLE_MESSAGES");
        println!(
            "zkq sidecars trickle: {n} messages at 20 msg/s round-robin over K sidecars, two consumers waiting \
             (wait=2s) on each consuming sidecar; per message (ZooKeeper 3.8 standalone on loopback)"
        );
        println!(
            "(kill: every sidecar consuming with leases, the last one killed -9 once half the messages are put; \
             session timeout {KILL_SESSION_TIMEOUT}; p50/p99 of the messages put after the kill; requests and \
             failed claims of the survivors)"
        );
        println!(
            "\n{:<10} {:<6} {:>2} {:>9} {:>9} {:>9} {:>11} {:>9} {:>8} {:>8} {:>12}",
            "build",
            "mode",
            "K",
            "consuming",
            "requests",
            "txns",
            "packets out",
            "failed",
            "p50 ms",
            "p99 ms",
            "exactly-once"
        );
        for mode in &modes {
            for &k in &ks {
                // One of K consuming: with leases (what a producer-only pod costs does not depend on how its
                // neighbours consume).
                let consuming: Vec<usize> = if k == 1 || *mode == Mode::Take { vec![k] } else { vec![k, 1] };
                // With leases and K ≥ 3, also the kill row: every sidecar consuming, one killed halfway.
                let mut rows: Vec<(usize, bool)> = consuming.into_iter().map(|c| (c, false)).collect();
                if *mode == Mode::Lease && k >= 3 {
                    rows.push((k, true));
                }
                for (c, kill) in rows {
                    for (label, binary) in &builds {
                        let t = run_trickle(&zk, binary, k, c, *mode, n, kill).await;
                        println!(
                            "{:<10} {:<6} {:>2} {:>9} {:>9.2} {:>9.2} {:>11.2} {:>9.3} {:>8.1} {:>8.1} {:>12}",
                            label,
                            match (*mode, kill) {
                                (Mode::Lease, false) => "lease",
                                (Mode::Lease, true) => "kill",
                                (Mode::Take, _) => "take",
                            },
                            k,
                            c,
                            t.requests,
                            t.transactions,
                            t.packets_sent,
                            t.failed_claims,
                            t.p50_ms,
                            t.p99_ms,
                            t.exactly_once
                        );
                    }
                }
            }
        }
        println!();
    }
    if !suites.contains("drain") {
        return;
    }
    println!(
        "zkq sidecars benchmark: {n} messages of 100 B, {CONSUMERS} HTTP consumers round-robin over K sidecars, wait=1s \
         (ZooKeeper 3.8 standalone on loopback)"
    );
    let curator_rate = if env_or("ZKQ_BENCH_CURATOR", "1") == "0" {
        f64::NAN
    } else {
        let curator = curator_anchor(&zk, &this_build, n).await;
        println!("Curator, 8 lock-safe consumers: {} ; {:.1} packets/msg", curator.0, curator.1);
        rate_of(&curator.0)
    };
    // Builds alternate row by row, so that a busy moment of the shared machine hits both.
    println!(
        "\n{:<10} {:<6} {:>2} {:>9} {:>9} {:>11} {:>10} {:>10} {:>12} {:>16}  claim attempts per msg",
        "build",
        "mode",
        "K",
        "msg/s",
        "x Curator",
        "packets/msg",
        "writes/msg",
        "conflicts",
        "exactly-once",
        "CPU ms/msg zkq+zk"
    );
    for mode in &modes {
        for &k in &ks {
            for (label, binary) in &builds {
                let f = run_one(&zk, binary, k, *mode, n).await;
                println!(
                    "{:<10} {:<6} {:>2} {:>9.0} {:>8.1}x {:>11.2} {:>10.2} {:>10.3} {:>12} {:>7.3} + {:>6.3}  {}",
                    label,
                    if *mode == Mode::Lease { "lease" } else { "take" },
                    k,
                    f.rate,
                    f.rate / curator_rate,
                    f.packets,
                    f.writes,
                    f.conflicts,
                    f.exactly_once,
                    f.cpu.0,
                    f.cpu.1,
                    f.outcomes
                );
            }
        }
    }
}
