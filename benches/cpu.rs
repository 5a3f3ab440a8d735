//! CPU per request: zkq against the HTTP floor. Prints figures and ratios against targets,
//! asserts nothing about speed (only that every message came out exactly once).
//!
//! `cargo bench --bench cpu` (after `scripts/test.sh` installed ZooKeeper and the Curator jars; the
//! put figures need `wrk`, else the benchmark's own HTTP client drives them and says so).
//!
//! A sidecar's CPU per message is paid once per replica, so this benchmark measures it as the
//! operating system counts it (utime + stime of `/proc/PID/stat`, before and after each figure),
//! for three processes, each alone in its own process:
//! - **the floor**: this benchmark's executable started again as a child process
//!   (`ZKQ_BENCH_FLOOR_LISTEN`), an HTTP server on zkq's own stack and settings: the same runtime
//!   (tokio's multi-threaded runtime, one worker per core), the same allocator (jemalloc with its
//!   background thread), zkq's accept loop and connection watchdog (`zkq::serve`,
//!   the API listener's default limits) and an axum router, whose one handler reads the body and
//!   answers 201 with a small JSON body (the size of a put's answer). What zkq spends above it is
//!   zkq's own work: its middleware, the queue and ZooKeeper's client;
//! - **zkq**: the release binary as a child process, at its default log level, against a private
//!   ZooKeeper;
//! - **ZooKeeper**: the server's JVM.
//!
//! Figures: the floor under `wrk -t2 -c64` (100-byte POSTs) and under the drains' client (16
//! connections, this benchmark's HTTP client), and with one ZooKeeper read per request (through
//! zkq's own session: the cost of a round trip on zkq's stack); zkq's single puts under `wrk -t2 -c64` (distinct
//! 100-byte bodies); drains of 16 clients, single takes and lease+acks, and `?max=100`; put→take
//! latency with a waiting taker, and ZooKeeper's own write latency (one create at a time, its
//! floor); Curator 5.4.0's background put and consumers on the same server.
//! Then every target as a ratio of figures of this run, with "target met" or "NOT met", and each
//! zkq figure against its stack's floor (its HTTP requests at the floor's cost, its ZooKeeper
//! requests per message at the round trip's).
//!
//! Environment: `ZKQ_BENCH_SECONDS` (each timed load, default 10), `ZKQ_BENCH_SCALE` (drain
//! sizes, default 1.0: 20,000 messages, for zkq's drains and Curator's alike: Curator's consumer
//! reads the whole child list again after every change, so it is faster on a shorter queue), `ZKQ_BENCH_ZKQ=path/to/zkq` (the
//! binary to measure, e.g. a build with debug info), `ZKQ_BENCH_PERF=path/to/perf.data` (records
//! zkq with `perf record --call-graph dwarf` during the put load, or the figure
//! `ZKQ_BENCH_PERF_FIGURE` names: `take` or `lease` for the single drains; it stops after that
//! figure, whose CPU figures include the profiler's sampling).

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "benchmarks drive processes and HTTP directly and read their environment"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use zkq_testkit::*;

/// zkq's allocator, so that the floor allocates as zkq does.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Set in the floor's environment: the address it serves on.
const FLOOR_LISTEN: &str = "ZKQ_BENCH_FLOOR_LISTEN";

/// What the floor answers: a put's answer, in size and kind.
const FLOOR_ANSWER: &str = r#"{"queue":"floor","message_id":"qn-0000000000"}"#;

/// Set in the floor's environment for the floor with ZooKeeper reads: `connect|path|reads`,
/// the reads of `path` each request makes before it answers.
const FLOOR_ZK: &str = "ZKQ_BENCH_FLOOR_ZK";

fn main() {
    if let Ok(listen) = std::env::var(FLOOR_LISTEN) {
        serve_floor(&listen, std::env::var(FLOOR_ZK).ok().as_deref());
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(bench());
}

// ------------------------------------------------------------------ the floor

/// The floor server: zkq's runtime, allocator settings, accept loop and listener limits, one
/// axum handler. Runs until killed. With `zk` (`connect|path|reads`), the handler first reads
/// `path` `reads` times, one after the other, through zkq's own ZooKeeper session
/// (`zkq::ZkSession`, the `zookeeper-client` crate): the floor of a request that must ask
/// ZooKeeper.
fn serve_floor(listen: &str, zk: Option<&str>) {
    // As zkq's main: jemalloc's background thread, then the default multi-threaded runtime.
    let _ = tikv_jemalloc_ctl::background_thread::write(true);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("floor runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen).await.expect("the floor binds");
        let api = zkq::config::Config::default().api;
        let limits = zkq::ListenerLimits {
            max_connections: api.max_connections,
            header_read_timeout: api.header_read_timeout,
            idle_timeout: api.idle_timeout,
        };
        let stop = tokio_util::sync::CancellationToken::new();
        let router = match zk {
            None => axum::Router::new().fallback(floor_answer),
            Some(zk) => {
                let (reads, session) = floor_session(zk, stop.clone()).await;
                axum::Router::new().fallback(move |body: axum::body::Bytes| {
                    let (reads, session) = (reads.clone(), session.clone());
                    async move {
                        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                        let zk = session.connected(deadline).await.expect("the floor's session");
                        for path in reads.iter() {
                            std::hint::black_box(zk.get_data(path).await.expect("the floor reads"));
                        }
                        floor_answer(body).await
                    }
                })
            },
        };
        let metrics = std::sync::Arc::new(zkq::Metrics::new().expect("metrics"));
        zkq::serve(listener, router, limits, "api", metrics, stop).await.expect("the floor serves");
    });
}

/// The floor's ZooKeeper session (zkq's own, with its default settings) and the paths each
/// request reads, from `connect|path|reads`.
async fn floor_session(spec: &str, stop: tokio_util::sync::CancellationToken) -> (Arc<Vec<String>>, zkq::ZkSession) {
    let mut parts = spec.split('|');
    let (connect, path, reads) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
    let reads: usize = reads.parse().expect("reads per request");
    let defaults = zkq::config::Config::default().zookeeper;
    let settings = zkq::SessionSettings {
        connect: connect.to_owned(),
        session_timeout: defaults.session_timeout,
        request_timeout: defaults.request_timeout,
        auth_digest: None,
        sasl: None,
        tls: None,
        acl: zkq::NodeAcl::Open,
        reconnect_backoff_max: defaults.reconnect_backoff_max,
        jute_maxbuffer: defaults.jute_maxbuffer,
    };
    let metrics = Arc::new(zkq::Metrics::new().expect("metrics"));
    let (session, _task) = zkq::ZkSession::start(settings, metrics, stop).expect("the floor's session");
    (Arc::new(vec![path.to_owned(); reads]), session)
}

async fn floor_answer(body: axum::body::Bytes) -> axum::response::Response {
    use axum::response::IntoResponse;
    std::hint::black_box(body.len());
    (axum::http::StatusCode::CREATED, [(axum::http::header::CONTENT_TYPE, "application/json")], FLOOR_ANSWER)
        .into_response()
}

/// The floor as a child process of this benchmark.
struct Floor {
    child: std::process::Child,
    url: String,
}

impl Floor {
    async fn start() -> Floor {
        Floor::start_reading(None).await
    }

    /// The floor whose every request first reads `path` `reads` times from `zk`.
    async fn start_reading(zk: Option<(&ZkServer, &str, usize)>) -> Floor {
        let addr = free_addr();
        let mut command = Command::new(std::env::current_exe().expect("this executable"));
        command.env(FLOOR_LISTEN, &addr).stdout(Stdio::null());
        if let Some((zk, path, reads)) = zk {
            command.env(FLOOR_ZK, format!("{}|{path}|{reads}", zk.connect_string()));
        }
        let child = spawn_supervised(command).expect("the floor starts");
        eventually(Duration::from_secs(10), "the floor listens", || {
            std::future::ready(std::net::TcpStream::connect(&addr).is_ok())
        })
        .await;
        Floor { child, url: format!("http://{addr}") }
    }

    fn cpu(&self) -> Cpu {
        let pid = self.child.id();
        Cpu { server: process_cpu_time(pid), zookeeper: Duration::ZERO, switches: context_switches(pid) }
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ------------------------------------------------------------------ load

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn scaled(n: usize) -> usize {
    let scale: f64 = env_or("ZKQ_BENCH_SCALE", "1").parse().unwrap_or(1.0);
    ((n as f64) * scale).max(1.0) as usize
}

fn load_seconds() -> u64 {
    env_or("ZKQ_BENCH_SECONDS", "10").parse().unwrap_or(10)
}

/// What a timed load did: requests answered, how many of them not 2xx, and over what time.
#[derive(Debug, Clone, Copy)]
struct Loaded {
    requests: u64,
    failed: u64,
    took: Duration,
}

fn wrk_installed() -> bool {
    Command::new("wrk").arg("-v").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// wrk's script: POSTs of distinct 100-byte bodies (`{prefix}{thread}-{n}-xxx…`).
const WRK_SCRIPT: &str = r#"
local counter = 0
local threads = 0
function setup(thread)
  thread:set("id", threads)
  threads = threads + 1
end
function init(args)
  prefix = args[1] or "w"
end
function request()
  counter = counter + 1
  local body = string.format("%s%d-%010d-", prefix, id, counter)
  body = body .. string.rep("x", 100 - #body)
  return wrk.format("POST", nil, nil, body)
end
"#;

/// `wrk -t2 -c{connections} -d{seconds}s` POSTing distinct 100-byte bodies starting with `prefix`.
async fn wrk(url: &str, connections: usize, seconds: u64, prefix: &str) -> Loaded {
    let script = tempfile::Builder::new().suffix(".lua").tempfile().expect("script file");
    std::fs::write(script.path(), WRK_SCRIPT).expect("write script");
    let mut command = Command::new("wrk");
    command
        .args(["-t2", &format!("-c{connections}"), &format!("-d{seconds}s"), "--timeout", "30s", "-s"])
        .arg(script.path())
        .args([url, "--", prefix]);
    let output = tokio::task::spawn_blocking(move || command.output().expect("wrk runs")).await.expect("join");
    drop(script);
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "wrk failed: {text}{}", String::from_utf8_lossy(&output.stderr));
    // "  123456 requests in 10.00s, 12.34MB read" and, when some were, "  Non-2xx or 3xx responses: 12".
    let line = text.lines().find(|l| l.contains(" requests in ")).expect("wrk's summary line");
    let mut words = line.split_whitespace();
    let requests: u64 = words.next().and_then(|n| n.parse().ok()).expect("request count");
    let took = words.nth(2).and_then(|t| t.trim_end_matches(',').strip_suffix('s')).expect("duration");
    let took = match took.strip_suffix('m') {
        Some(ms) => Duration::from_secs_f64(ms.parse::<f64>().expect("ms") / 1000.0),
        None => Duration::from_secs_f64(took.parse().expect("seconds")),
    };
    let failed = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Non-2xx or 3xx responses:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    Loaded { requests, failed, took }
}

/// `clients` tasks of this benchmark's HTTP client POSTing to `url` for `seconds`; `body(n)` is
/// the n-th request's body.
async fn client_load(
    http: &reqwest::Client,
    url: &str,
    clients: usize,
    seconds: u64,
    body: impl Fn(usize) -> Vec<u8> + Send + Sync + 'static,
) -> Loaded {
    let (next, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicU64::new(0)));
    let body = Arc::new(body);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (http, url, next, failed, body) =
            (http.clone(), url.to_owned(), next.clone(), failed.clone(), body.clone());
        tasks.spawn(async move {
            while Instant::now() < deadline {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let status = http.post(&url).body(body(n)).send().await.expect("request").status();
                if !status.is_success() {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("client");
    }
    Loaded {
        requests: next.load(Ordering::Relaxed) as u64,
        failed: failed.load(Ordering::Relaxed),
        took: started.elapsed(),
    }
}

// ------------------------------------------------------------------ CPU

/// CPU time of the measured processes at one moment, and the server's context switches.
#[derive(Clone, Copy)]
struct Cpu {
    server: Duration,
    zookeeper: Duration,
    switches: u64,
}

/// Context switches (voluntary and not) of every thread of a process so far: each time one of
/// its threads went to sleep (a worker parking, a task woken on another thread) or was preempted.
fn context_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .filter_map(Result::ok)
        .map(|task| std::fs::read_to_string(task.path().join("status")).unwrap_or_default())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.starts_with("voluntary_ctxt_switches:") || l.starts_with("nonvoluntary_ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1).and_then(|n| n.parse::<u64>().ok()))
                .collect::<Vec<_>>()
        })
        .sum()
}

/// CPU per unit, in microseconds, of what two readings span.
fn micros_per(before: Duration, after: Duration, units: f64) -> f64 {
    after.saturating_sub(before).as_secs_f64() * 1e6 / units.max(1.0)
}

/// One figure: its rate and what each process spent per unit.
struct Figure {
    what: String,
    units: f64,
    took: Duration,
    /// Per unit (a message; a request for the floor), µs: the server measured (floor or zkq).
    server_us: f64,
    /// Per unit, µs: ZooKeeper's JVM (None for the floor).
    zookeeper_us: Option<f64>,
    /// HTTP requests per unit (lease+ack: 2 per message; `?max=100`: about 0.01).
    requests_per_unit: f64,
    /// Per unit: the server's context switches.
    switches: f64,
}

impl Figure {
    fn new(what: &str, units: f64, took: Duration, before: Cpu, after: Cpu, zookeeper: bool) -> Figure {
        Figure {
            what: what.to_owned(),
            units,
            took,
            server_us: micros_per(before.server, after.server, units),
            zookeeper_us: zookeeper.then(|| micros_per(before.zookeeper, after.zookeeper, units)),
            requests_per_unit: 1.0,
            switches: after.switches.saturating_sub(before.switches) as f64 / units.max(1.0),
        }
    }

    fn rate(&self) -> f64 {
        self.units / self.took.as_secs_f64()
    }

    fn print(&self) {
        let zookeeper = self.zookeeper_us.map_or_else(String::new, |us| format!(", ZooKeeper {us:.1} µs"));
        let per_request = if (self.requests_per_unit - 1.0).abs() > f64::EPSILON {
            format!(" ({:.1} µs per HTTP request)", self.server_us / self.requests_per_unit)
        } else {
            String::new()
        };
        println!(
            "{:<46} {:>8.0} in {:>5.2}s = {:>7.0}/s; CPU per unit: server {:.1} µs{per_request}{zookeeper}; \
             server context switches per unit {:.2}",
            self.what,
            self.units,
            self.took.as_secs_f64(),
            self.rate(),
            self.server_us,
            self.switches,
        );
    }
}

// ------------------------------------------------------------------ zkq

async fn scrape(http: &reqwest::Client, zkq: &ChildZkq) -> String {
    http.get(format!("{}/metrics", zkq.admin)).send().await.expect("metrics").text().await.expect("metrics text")
}

/// Every ZooKeeper request zkq made so far (`zkq_zookeeper_requests_total`, all operations).
fn zk_requests(text: &str) -> f64 {
    metric_sum(text, "zkq_zookeeper_requests_total", &[], &[])
}

fn of_queue(text: &str, name: &str, queue: &str) -> f64 {
    metric_sum(text, name, &[&format!("queue=\"{queue}\"")], &[])
}

/// Every drained body is one of the puts (its prefix), none twice, and at least every put answered
/// 201 (a put whose client left when the load stopped may be stored too).
fn assert_distinct_puts(what: &str, mut got: Vec<Vec<u8>>, prefix: &str, answered: usize) {
    assert!(got.iter().all(|b| b.len() == 100 && b.starts_with(prefix.as_bytes())), "{what}: only the puts' bodies");
    let drained = got.len();
    got.sort_unstable();
    got.dedup();
    assert_eq!(got.len(), drained, "{what}: no body twice");
    assert!(drained >= answered, "{what}: {drained} drained, {answered} answered 201");
}

/// put→take latency with a waiting taker (the put through one connection, the take through another).
/// put→take latency with a waiting taker over `rounds` rounds: its p50 and p99, and those of the
/// put's own answer (the put's part of it).
async fn latency(
    http: &reqwest::Client,
    zkq: &ChildZkq,
    rounds: usize,
) -> ((Duration, Duration), (Duration, Duration)) {
    let queue_url = |path: &str| format!("{}/v1/queues/lat{path}", zkq.api);
    // The queue must exist: a take from a dynamic queue whose node does not exist answers 204 at once.
    let put = http.post(queue_url("/messages")).body("open").send().await.expect("put");
    assert_eq!(put.status(), 201);
    let take = http.post(queue_url("/take?wait=0s")).send().await.expect("take");
    assert_eq!(take.status(), 200);
    let (mut latencies, mut puts) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for _ in 0..rounds {
        let (taker_http, url) = (http.clone(), queue_url("/take?wait=10s"));
        let taker = tokio::spawn(async move {
            let response = taker_http.post(&url).send().await.expect("take");
            assert_eq!(response.status(), 200);
            Instant::now()
        });
        loop {
            assert!(!taker.is_finished(), "the taker answered before any put");
            if scrape(http, zkq).await.contains("zkq_waiting_takers{queue=\"lat\"} 1") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let put_at = Instant::now();
        let put = http.post(queue_url("/messages")).body("ping").send().await.expect("put");
        assert_eq!(put.status(), 201);
        puts.push(put_at.elapsed());
        let got_at = taker.await.expect("taker");
        latencies.push(got_at.duration_since(put_at));
    }
    (percentiles(latencies), percentiles(puts))
}

/// The p50 and p99 of `latencies`.
fn percentiles(mut latencies: Vec<Duration>) -> (Duration, Duration) {
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p) as usize];
    (pct(0.5), pct(0.99))
}

/// ZooKeeper's own write latency, the floor of put→take (a put's create and a take's claim are
/// two writes in sequence): `rounds` creates of a 100-byte sequential node, one at a time,
/// through the client crate zkq uses.
async fn zk_write_latency(zk: &ZkServer, root: &str, rounds: usize) -> (Duration, Duration) {
    let client = zk_client(zk).await;
    let parent = format!("{root}-latency");
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    client.create(&parent, &[], &options).await.expect("the latency node");
    let sequential = zookeeper_client::CreateMode::PersistentSequential.with_acls(zookeeper_client::Acls::anyone_all());
    let mut latencies = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        client.create(&format!("{parent}/n-"), &[b'x'; 100], &sequential).await.expect("a create");
        latencies.push(start.elapsed());
    }
    percentiles(latencies)
}

/// Which figure `ZKQ_BENCH_PERF` profiles: `ZKQ_BENCH_PERF_FIGURE` = `put` (the default),
/// `take` (the single take drain) or `lease` (the single lease+ack drain); `None` without
/// `ZKQ_BENCH_PERF`.
fn perf_figure() -> Option<String> {
    std::env::var("ZKQ_BENCH_PERF").ok()?;
    Some(env_or("ZKQ_BENCH_PERF_FIGURE", "put"))
}

/// Samples zkq with `perf record` (when `ZKQ_BENCH_PERF` names an output file and `figure` is
/// the one to profile) for `seconds`, or until [`stop_perf`].
fn start_perf(pid: u32, figure: &str, seconds: Option<u64>) -> Option<std::process::Child> {
    if perf_figure().as_deref() != Some(figure) {
        return None;
    }
    let output = std::env::var("ZKQ_BENCH_PERF").ok()?;
    let mut command = Command::new("perf");
    command
        .args(["record", "-F", "499", "-e", "cpu-clock", "--call-graph", "dwarf,16384", "-o", &output, "-p"])
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(seconds) = seconds {
        command.args(["--", "sleep", &seconds.to_string()]);
    }
    Some(command.spawn().expect("perf record starts"))
}

/// Ends a profile [`start_perf`] started without a duration (perf writes its file on SIGINT)
/// and says where it is; true when there was one: the run stops after its figure.
fn stop_perf(perf: Option<std::process::Child>) -> bool {
    let Some(mut perf) = perf else { return false };
    let _ = Command::new("kill").args(["-INT", &perf.id().to_string()]).status();
    let _ = perf.wait();
    println!("\nprofile of zkq under this figure's load written to {}; a profiling run stops here", perf_output());
    true
}

fn perf_output() -> String {
    std::env::var("ZKQ_BENCH_PERF").unwrap_or_default()
}

/// The first `= X msg/s` figure of a CuratorTool bench line.
fn curator_rate(line: &str) -> f64 {
    line.split("= ").nth(1).and_then(|rest| rest.split(" msg/s").next()).and_then(|v| v.parse().ok()).unwrap_or(0.0)
}

/// A target on a rate: `value / base >= want`.
fn at_least(what: &str, value: f64, base: f64, want: f64) {
    let ratio = value / base;
    let verdict = if ratio >= want { "target met" } else { "NOT met" };
    println!("  {what:<62} {value:>8.0} / {base:>8.0} = {ratio:>6.2}x  (target >= {want}x)  {verdict}");
}

/// A target on CPU: `value / base <= want`.
fn at_most(what: &str, value: f64, base: f64, want: f64) {
    let ratio = value / base;
    let verdict = if ratio <= want { "target met" } else { "NOT met" };
    println!("  {what:<62} {value:>6.1} µs / {base:>5.1} µs = {ratio:>5.2}x  (target <= {want}x)  {verdict}");
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn bench() {
    let seconds = load_seconds();
    let use_wrk = wrk_installed();
    let http = bench_http();
    println!(
        "zkq CPU benchmark: CPU per request (utime+stime of /proc/PID/stat) of the HTTP floor, zkq and ZooKeeper;"
    );
    println!("one ZooKeeper 3.8 standalone on loopback, 100-byte messages, {seconds}s per timed load");
    if !use_wrk {
        println!(
            "wrk not found (install it with apt-get install wrk): the put loads use this benchmark's HTTP client instead"
        );
    }
    println!();

    // The floor: under wrk's 64 connections (the put load), then under the drains' 16 clients.
    let floor = Floor::start().await;
    let floor_url = format!("{}/v1/queues/floor/messages", floor.url);
    let put_load = async |url: &str, prefix: &str, secs: u64| {
        if use_wrk {
            wrk(url, 64, secs, prefix).await
        } else {
            let prefix = prefix.to_owned();
            client_load(&http, url, 64, secs, move |n| {
                let mut body = format!("{prefix}0-{n:010}-").into_bytes();
                body.resize(100, b'x');
                body
            })
            .await
        }
    };
    let driver = if use_wrk { "wrk -t2 -c64" } else { "64 clients" };
    put_load(&floor_url, "warm", 2).await;
    let before = floor.cpu();
    let loaded = put_load(&floor_url, "f", seconds).await;
    let after = floor.cpu();
    assert_eq!(loaded.failed, 0, "the floor answers 201");
    let floor64 = Figure::new(
        &format!("floor, {driver}, 100-byte POSTs"),
        loaded.requests as f64,
        loaded.took,
        before,
        after,
        false,
    );
    floor64.print();
    let before = floor.cpu();
    let loaded =
        client_load(&http, &format!("{}/v1/queues/floor/take?wait=0s", floor.url), 16, seconds, |_| Vec::new()).await;
    let after = floor.cpu();
    assert_eq!(loaded.failed, 0, "the floor answers 201");
    let floor16 = Figure::new(
        "floor, 16 clients (the drains' client)",
        loaded.requests as f64,
        loaded.took,
        before,
        after,
        false,
    );
    floor16.print();
    drop(floor);

    let zk = ZkServer::start();
    let root = unique_root("cpu");

    // The floor of a request that asks ZooKeeper once: each request reads a 100-byte node
    // through zkq's own session before it answers, under the drains' 16 clients. What it spends
    // above the floor is one ZooKeeper round trip in zkq's stack (the client's encoding and
    // decoding, its session task, the loopback TCP both ways, the wake-ups between tasks).
    let read_path = format!("{root}-floor-read");
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    zk_client(&zk).await.create(&read_path, &[b'x'; 100], &options).await.expect("the floor's node");
    let floor_zk = Floor::start_reading(Some((&zk, &read_path, 1))).await;
    let read_url = format!("{}/v1/queues/floor/take?wait=0s", floor_zk.url);
    client_load(&http, &read_url, 16, 1, |_| Vec::new()).await;
    let before = Cpu { zookeeper: zk.cpu_time(), ..floor_zk.cpu() };
    let loaded = client_load(&http, &read_url, 16, seconds, |_| Vec::new()).await;
    let after = Cpu { zookeeper: zk.cpu_time(), ..floor_zk.cpu() };
    assert_eq!(loaded.failed, 0, "the floor with a read answers 201");
    let floor_read = Figure::new(
        "floor + 1 ZooKeeper read per request, 16 clients",
        loaded.requests as f64,
        loaded.took,
        before,
        after,
        true,
    );
    floor_read.print();
    drop(floor_zk);
    let round_trip = (floor_read.server_us - floor16.server_us).max(0.0);
    println!("{:<46} {round_trip:.1} µs of the server's CPU (the two figures above)", "one ZooKeeper round trip:");
    let binary =
        std::env::var("ZKQ_BENCH_ZKQ").map(PathBuf::from).unwrap_or_else(|_| PathBuf::from(env!("CARGO_BIN_EXE_zkq")));
    // zkq at its default log level, as it runs in a pod.
    let default_level = zkq::config::Config::default().log.level;
    let env = [("ZKQ__LOG__LEVEL", default_level.as_str()), ("ZKQ__ZOOKEEPER__REQUEST_TIMEOUT", "20s")];
    let zkq = ChildZkq::start_binary(&binary, &zk, &root, &env).await;
    let api = Endpoint::child(&zkq);
    let cpu = || Cpu { server: zkq.cpu_time(), zookeeper: zk.cpu_time(), switches: context_switches(zkq.pid()) };
    println!("zkq: {} (pid {})", display(&binary), zkq.pid());

    // Single puts from 64 connections, after a warm-up (zkq's and the JVM's).
    put_load(&api.url("/v1/queues/warm/messages"), "warm", 3).await;
    let queue = "wput";
    let before_text = scrape(&http, &zkq).await;
    let perf = start_perf(zkq.pid(), "put", Some(seconds));
    let before = cpu();
    let loaded = put_load(&api.url(&format!("/v1/queues/{queue}/messages")), "p", seconds).await;
    let after = cpu();
    let profiled = perf.is_some();
    if let Some(mut perf) = perf {
        let _ = perf.wait();
    }
    eventually(Duration::from_secs(30), "every put answered", || async {
        metric_sum(&scrape(&http, &zkq).await, "zkq_puts_in_flight", &[], &[]) == 0.0
    })
    .await;
    let after_text = scrape(&http, &zkq).await;
    assert_eq!(loaded.failed, 0, "every put answered 201");
    let units = metric(&after_text, "zkq_group_commit_units_sum") - metric(&before_text, "zkq_group_commit_units_sum");
    let txns =
        metric(&after_text, "zkq_group_commit_units_count") - metric(&before_text, "zkq_group_commit_units_count");
    let counted = of_queue(&after_text, "zkq_messages_put_total", queue)
        - of_queue(&before_text, "zkq_messages_put_total", queue);
    let put_trips = (zk_requests(&after_text) - zk_requests(&before_text)) / counted.max(1.0);
    if profiled {
        let puts = Figure::new(&format!("zkq put, {driver}"), counted, loaded.took, before, after, true);
        puts.print();
        println!("\nprofile of zkq under the put load written to {}; a profiling run stops here", perf_output());
        return;
    }

    // The puts drained by takes of up to 100: every body once. The drain also counts what was
    // stored: a put whose client left when the load stopped (up to one per connection) is
    // stored, but not counted in zkq_messages_put_total (its handler was dropped).
    let before_drain = cpu();
    let (bodies, took) = drain_takes(&api, queue, 16, Some(100)).await;
    let after_drain = cpu();
    let stored = bodies.len();
    assert_distinct_puts("?max=100 take drain", bodies, "p", loaded.requests as usize);
    let puts = Figure::new(&format!("zkq put, {driver}"), stored as f64, loaded.took, before, after, true);
    puts.print();
    println!(
        "{:<46} {:.1} puts per ZooKeeper transaction (group commit); {} answered 201, {} stored, {} counted",
        "",
        units / txns.max(1.0),
        loaded.requests,
        stored,
        counted
    );
    let mut batch_take =
        Figure::new("zkq take drain, 16 takers, ?max=100", stored as f64, took, before_drain, after_drain, true);
    batch_take.requests_per_unit = 0.01;
    batch_take.print();

    // Single takes and lease+acks of 16 clients, and lease+acks of 100, each of its own queue.
    let n = scaled(20_000);
    let (take_range, lease_range, batch_lease_range) = (0..n, 1_000_000..1_000_000 + n, 2_000_000..2_000_000 + n);
    put_batches(
        &api,
        &[("stake", take_range.clone()), ("slease", lease_range.clone()), ("blease", batch_lease_range.clone())],
        100,
        8,
    )
    .await;
    let trips_before = zk_requests(&scrape(&http, &zkq).await);
    let perf = start_perf(zkq.pid(), "take", None);
    let before = cpu();
    let (bodies, took) = drain_takes(&api, "stake", 16, None).await;
    let after = cpu();
    let take_trips = (zk_requests(&scrape(&http, &zkq).await) - trips_before) / n as f64;
    assert_exactly_once("single take drain", bodies, take_range);
    let single_take = Figure::new("zkq take drain, 16 takers, single", n as f64, took, before, after, true);
    single_take.print();
    if stop_perf(perf) {
        return;
    }
    let trips_before = zk_requests(&scrape(&http, &zkq).await);
    let perf = start_perf(zkq.pid(), "lease", None);
    let before = cpu();
    let (bodies, took) = drain_leases(&api, "slease", 16, None).await;
    let after = cpu();
    let lease_trips = (zk_requests(&scrape(&http, &zkq).await) - trips_before) / n as f64;
    assert_exactly_once("single lease+ack drain", bodies, lease_range);
    let mut single_lease =
        Figure::new("zkq lease+ack drain, 16 consumers, single", n as f64, took, before, after, true);
    single_lease.requests_per_unit = 2.0;
    single_lease.print();
    if stop_perf(perf) {
        return;
    }
    let before = cpu();
    let (bodies, took) = drain_leases(&api, "blease", 16, Some(100)).await;
    let after = cpu();
    assert_exactly_once("?max=100 lease+ack drain", bodies, batch_lease_range);
    let mut batch_lease =
        Figure::new("zkq lease+ack drain, 16 consumers, ?max=100", n as f64, took, before, after, true);
    batch_lease.requests_per_unit = 0.02;
    batch_lease.print();

    let rounds = scaled(500);
    let before_rounds = scrape(&http, &zkq).await;
    let ((p50, p99), (put50, put99)) = latency(&http, &zkq, rounds).await;
    let after_rounds = scrape(&http, &zkq).await;
    println!(
        "zkq put->take latency, waiting taker:          p50 {:.2} ms, p99 {:.2} ms over {rounds} rounds \
         (the put's own answer: p50 {:.2} ms, p99 {:.2} ms)",
        ms(p50),
        ms(p99),
        ms(put50),
        ms(put99)
    );
    // The round trips of put->take (the put's create, the take's read and claim), as zkq timed
    // them during the rounds: those slower than 2.5 ms are ZooKeeper's part of the tail.
    let slow = ["create", "get_data", "multi"]
        .iter()
        .map(|op| {
            let count = |text: &str, bucket: Option<&str>| {
                let series = match bucket {
                    Some(le) => {
                        format!("zkq_zookeeper_request_duration_seconds_bucket{{operation=\"{op}\",le=\"{le}\"}}")
                    },
                    None => format!("zkq_zookeeper_request_duration_seconds_count{{operation=\"{op}\"}}"),
                };
                metric(text, &series)
            };
            let all = count(&after_rounds, None) - count(&before_rounds, None);
            let fast = count(&after_rounds, Some("0.0025")) - count(&before_rounds, Some("0.0025"));
            format!("{op} {:.0} of {all:.0}", all - fast)
        })
        .collect::<Vec<_>>()
        .join(", ");
    println!("{:<46} ZooKeeper requests of those rounds slower than 2.5 ms as zkq timed them: {slow}", "");
    let (write50, write99) = zk_write_latency(&zk, &root, rounds).await;
    println!(
        "ZooKeeper write latency, one create at a time: p50 {:.2} ms, p99 {:.2} ms over {rounds} rounds \
         (put->take makes two writes in sequence)",
        ms(write50),
        ms(write99)
    );

    // Curator's queues, filled through zkq (the same layout); then zkq stops, only Curator works.
    let nc = n;
    put_batches(&api, &[("cdrain", 5_000_000..5_000_000 + nc), ("clock", 6_000_000..6_000_000 + nc)], 100, 8).await;
    zkq.signal("TERM");
    let _ = zkq.wait().await;

    let curator = async |what: &str, args: &[&str], units: f64| {
        let before = zk.cpu_time();
        let out = Curator::run(&zk, args).await.join(" ");
        let zk_us = micros_per(before, zk.cpu_time(), units);
        println!("{what:<46} {out} ; ZooKeeper {zk_us:.1} µs per message");
        curator_rate(&out)
    };
    let curator_put = curator(
        "Curator put, background, 1 producer:",
        &["bench", "put-background", &format!("{root}/curator-bg"), &n.to_string(), "100"],
        n as f64,
    )
    .await;
    let direct = zk_client(&zk).await;
    let path = format!("{root}/queues/cdrain");
    let curator_drain = curator(
        "Curator drain, 1 consumer without lock:",
        &["bench", "drain", &path, &nc.to_string(), "900000"],
        nc as f64,
    )
    .await;
    assert!(children(&direct, &path).await.is_empty(), "Curator's drain took every message, once");
    let (path, lock) = (format!("{root}/queues/clock"), format!("{root}/locks/clock"));
    let curator_locked = curator(
        "Curator drain, 1 lock-safe consumer:",
        &["bench", "drain", &path, &nc.to_string(), "900000", "--lock", &lock],
        nc as f64,
    )
    .await;
    assert!(children(&direct, &path).await.is_empty(), "Curator's lock-safe drain took every message, once");

    println!("\ntargets (this run; ratios of the figures above):");
    at_most("zkq CPU per put (64 conns) vs the floor's per request (64 conns)", puts.server_us, floor64.server_us, 2.5);
    at_most(
        "zkq CPU per single take (16) vs the floor's per request (16)",
        single_take.server_us,
        floor16.server_us,
        4.0,
    );
    at_most(
        "zkq CPU per single lease+ack (16) vs the floor's per request (16)",
        single_lease.server_us,
        floor16.server_us,
        4.0,
    );
    at_least("single puts, 64 conns vs Curator background put", puts.rate(), curator_put, 1.5);
    at_least("take drain, single vs Curator consumer without lock", single_take.rate(), curator_drain, 10.0);
    at_least("lease+ack drain, single vs Curator lock-safe consumer", single_lease.rate(), curator_locked, 8.0);
    at_least("take drain, ?max=100 vs Curator consumer without lock", batch_take.rate(), curator_drain, 20.0);
    at_least("lease+ack drain, ?max=100 + batch ack vs Curator lock-safe", batch_lease.rate(), curator_locked, 20.0);
    let met = if p99 <= Duration::from_millis(5) { "target met" } else { "NOT met" };
    println!("  put->take latency p99 with a waiting taker: {:.2} ms (target <= 5 ms)  {met}", ms(p99));

    // What the stack alone costs for each figure's requests and round trips to ZooKeeper.
    println!(
        "\nzkq against its stack's floor: HTTP requests at the floor's cost, and the ZooKeeper requests zkq made \
         (zkq_zookeeper_requests_total) at the cost of the floor's read:"
    );
    let stack = |what: &str, zkq_us: f64, floor_us: f64, requests: f64, trips: f64| {
        let base = requests * floor_us + trips * round_trip;
        println!(
            "  {what:<22} {requests} requests + {trips:.2} ZooKeeper requests = {base:>6.1} µs; zkq {zkq_us:>6.1} µs = {:.2}x",
            zkq_us / base.max(f64::EPSILON)
        );
    };
    stack("put (64 conns)", puts.server_us, floor64.server_us, 1.0, put_trips);
    stack("single take (16)", single_take.server_us, floor16.server_us, 1.0, take_trips);
    stack("single lease+ack (16)", single_lease.server_us, floor16.server_us, 2.0, lease_trips);
}

fn display(path: &Path) -> String {
    path.display().to_string()
}
