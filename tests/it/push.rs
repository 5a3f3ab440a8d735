//! Push delivery against real ZooKeeper and a real HTTP app: a small axum server inside the test
//! process on a free loopback port, whose answers each test scripts.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use zkq::config::{AppUrl, Config, PushConfig, QueueKind};

use zkq_testkit::*;

/// One request the app received.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    body: String,
    headers: HeaderMap,
    at: Instant,
    /// Earlier requests with the same body.
    attempt: usize,
}

impl Received {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
    }
}

type Answer = Arc<dyn Fn(Received) -> BoxFuture<'static, Response> + Send + Sync>;

/// The app: records every request, answers as the test says, counts requests in flight.
struct TestApp {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    most_in_flight: Arc<AtomicUsize>,
    server: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct AppState {
    received: Arc<Mutex<Vec<Received>>>,
    in_flight: Arc<AtomicUsize>,
    most_in_flight: Arc<AtomicUsize>,
    answer: Answer,
}

async fn handle(
    axum::extract::State(app): axum::extract::State<AppState>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let now_in_flight = app.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    app.most_in_flight.fetch_max(now_in_flight, Ordering::SeqCst);
    let received = {
        let mut all = app.received.lock().expect("lock");
        let body = String::from_utf8_lossy(&body).into_owned();
        let attempt = all.iter().filter(|r| r.body == body).count();
        let received = Received { path: uri.path().to_owned(), body, headers, at: Instant::now(), attempt };
        all.push(received.clone());
        received
    };
    let response = (app.answer)(received).await;
    app.in_flight.fetch_sub(1, Ordering::SeqCst);
    response
}

impl TestApp {
    async fn start(answer: impl Fn(Received) -> BoxFuture<'static, Response> + Send + Sync + 'static) -> TestApp {
        TestApp::start_on(0, answer).await
    }

    async fn start_on(
        port: u16,
        answer: impl Fn(Received) -> BoxFuture<'static, Response> + Send + Sync + 'static,
    ) -> TestApp {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.expect("app binds");
        let addr = listener.local_addr().expect("addr");
        let state = AppState {
            received: Arc::default(),
            in_flight: Arc::default(),
            most_in_flight: Arc::default(),
            answer: Arc::new(answer),
        };
        let (received, most_in_flight) = (state.received.clone(), state.most_in_flight.clone());
        let router = axum::Router::new().fallback(handle).with_state(state);
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        TestApp { addr, received, most_in_flight, server }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().expect("lock").clone()
    }

    fn bodies(&self) -> Vec<String> {
        self.received().into_iter().filter(|r| r.path != "/ready").map(|r| r.body).collect()
    }

    fn count(&self) -> usize {
        self.received.lock().expect("lock").len()
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn answer(status: u16) -> BoxFuture<'static, Response> {
    Box::pin(async move { StatusCode::from_u16(status).expect("status").into_response() })
}

fn answer_with(status: u16, headers: &[(&'static str, &str)], body: &str) -> BoxFuture<'static, Response> {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.insert(*name, value.parse().expect("header value"));
    }
    let body = body.to_owned();
    Box::pin(async move { (StatusCode::from_u16(status).expect("status"), map, body).into_response() })
}

/// A subscription with short, unjittered pauses, for tests.
fn push_to(url: &str) -> PushConfig {
    PushConfig {
        backoff_initial: Duration::from_millis(50),
        backoff_max: Duration::from_millis(500),
        backoff_jitter: 0.0,
        readiness_interval: Duration::from_millis(100),
        ..PushConfig::to(AppUrl::parse(url).expect("a push URL"))
    }
}

/// A test configuration declaring `queue` (fifo) with `push`.
fn config_pushing(zk: &ZkServer, root: &str, queue: &str, push: PushConfig) -> Config {
    let mut config = test_config(zk, root);
    config.log.level = "warn".into();
    declare(&mut config, queue, QueueKind::Fifo, None, None);
    config.queues.get_mut(queue).expect("declared").push = Some(push);
    config
}

/// The value of the first series of `metric` whose labels include every one of `labels`
/// (`name="value"` pairs, in any order); 0 when there is none.
fn metric(text: &str, metric: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .find(|(series, _)| {
            let (name, rest) = series.split_once('{').unwrap_or((series, ""));
            name == metric && labels.iter().all(|label| rest.contains(label))
        })
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0.0)
}

async fn deliveries(zkq: &TestZkq, queue: &str, outcome: &str) -> f64 {
    let text = zkq.metrics().await;
    metric(&text, "zkq_push_deliveries_total", &[&format!("queue=\"{queue}\""), &format!("outcome=\"{outcome}\"")])
}

/// Children of the queue node and of its lock directory.
async fn left_in_zookeeper(zk: &ZkServer, root: &str, queue: &str) -> (Vec<String>, Vec<String>) {
    let direct = zk_client(zk).await;
    (
        children(&direct, &format!("{root}/queues/{queue}")).await,
        children(&direct, &format!("{root}/locks/{queue}")).await,
    )
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_concurrency_one_messages_arrive_in_order_and_a_failure_is_retried_in_place() {
    let zk = ZkServer::shared();
    let root = unique_root("push-order");
    // m3 fails twice, m6 once, m8 twice (503, no Retry-After): each must come again before the
    // next message.
    let fails = |r: &Received| matches!((r.body.as_str(), r.attempt), ("m3" | "m8", 0 | 1) | ("m6", 0));
    let app = TestApp::start(move |r| answer(if fails(&r) { 503 } else { 200 })).await;
    let zkq = TestZkq::start_ready(config_pushing(zk, &root, "q", push_to(&app.url("/orders")))).await;
    let mut ids = HashMap::new();
    let put_from = zkq::now_epoch_ms();
    // m0 carries attributes and its producer's trace context, which its delivery forwards.
    let traced = zkq
        .http
        .post(zkq.url("/v1/queues/q/messages"))
        .header("traceparent", TRACEPARENT)
        .header("zkq-attributes", r#"{"tenant":{"type":"String","value":"acme"}}"#)
        .body("m0")
        .send()
        .await
        .expect("put");
    assert_eq!(traced.status(), 201);
    let traced: serde_json::Value = traced.json().await.expect("json");
    ids.insert("m0".to_owned(), traced["message_id"].as_str().expect("an id").to_owned());
    for i in 1..10 {
        let body = format!("m{i}");
        ids.insert(body.clone(), zkq.put_ok("q", body.as_bytes()).await);
    }
    let put_until = zkq::now_epoch_ms();
    eventually(Duration::from_secs(30), "ten messages acked", || async {
        deliveries(&zkq, "q", "success").await == 10.0
    })
    .await;
    let expected = ["m0", "m1", "m2", "m3", "m3", "m3", "m4", "m5", "m6", "m6", "m7", "m8", "m8", "m8", "m9"];
    assert_eq!(app.bodies(), expected, "Curator's order, each failed message retried in its place");
    assert_eq!(app.most_in_flight.load(Ordering::SeqCst), 1, "concurrency 1");
    assert_eq!(deliveries(&zkq, "q", "server_error").await, 5.0);
    assert_eq!(left_in_zookeeper(zk, &root, "q").await, (vec![], vec![]), "all acked: no message, no lock");

    // What the app is told about each delivery.
    let received = app.received();
    let first = &received[0];
    assert_eq!(first.header("zkq-message-id"), ids["m0"]);
    assert_eq!(first.header("zkq-queue"), "q");
    assert_eq!(first.header("zkq-delivery-count"), "1");
    let expires: i64 = first.header("zkq-lease-expires-at").parse().expect("epoch ms");
    let delivered_ms = zkq::now_epoch_ms();
    assert!(expires > delivered_ms - 60_000 && expires < delivered_ms + 31_000, "expiry {expires}");
    assert_eq!(first.header("content-type"), "application/octet-stream");
    assert_eq!(first.header("traceparent"), TRACEPARENT);
    assert_eq!(first.header("zkq-attributes"), r#"{"tenant":{"type":"String","value":"acme"}}"#);
    assert!(received[1].headers.get("traceparent").is_none(), "m1 was put without one");
    assert_eq!(first.header("ce-specversion"), "1.0");
    assert_eq!(first.header("ce-id"), ids["m0"]);
    assert_eq!(first.header("ce-source"), format!("{root}/queues/q"));
    assert_eq!(first.header("ce-type"), "zkq.message");
    // ce-time: when the message's node was created (its put), the same on every delivery.
    let ce_time_ms = |r: &Received| {
        let time = humantime::parse_rfc3339(r.header("ce-time")).expect("ce-time is RFC 3339");
        time.duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_millis() as i64
    };
    for r in &received {
        let at = ce_time_ms(r);
        assert!(at >= put_from && at <= put_until, "ce-time {at} of {} is its put's time", r.body);
    }
    // Every delivery (each attempt is a lease) has a larger fencing token than the one before,
    // also as a CloudEvents extension.
    let tokens: Vec<u64> =
        received.iter().map(|r| r.header("zkq-fencing-token").parse().expect("a fencing token")).collect();
    assert!(tokens.windows(2).all(|pair| pair[0] < pair[1]), "fencing tokens grow: {tokens:?}");
    assert!(received.iter().all(|r| r.header("ce-zkqfencingtoken") == r.header("zkq-fencing-token")));
    let retried: Vec<&Received> = received.iter().filter(|r| r.body == "m3").collect();
    assert_eq!(
        retried.iter().map(|r| r.header("zkq-delivery-count")).collect::<Vec<_>>(),
        ["1", "2", "3"],
        "every attempt is a delivery"
    );
    assert_eq!(retried[0].header("zkq-message-id"), retried[2].header("zkq-message-id"), "the same message");
    assert_eq!(
        retried.iter().map(|r| r.header("ce-time")).collect::<HashSet<_>>().len(),
        1,
        "one ce-id, one ce-time: {:?}",
        retried.iter().map(|r| r.header("ce-time")).collect::<Vec<_>>()
    );
    zkq.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_is_delivered_and_acked_once_and_concurrency_is_never_exceeded() {
    let zk = ZkServer::shared();
    let root = unique_root("push-once");
    const CONCURRENCY: usize = 8;
    const MESSAGES: usize = 120;
    // The first eight requests are held until all eight are in flight: concurrency is used.
    let all_in = Arc::new(tokio::sync::Semaphore::new(0));
    let app = TestApp::start({
        let all_in = all_in.clone();
        move |r| {
            let all_in = all_in.clone();
            Box::pin(async move {
                if r.attempt == 0 && r.body.as_str() < "b" {
                    // bodies "a0".."a7" (sorted before the "b…" ones)
                    all_in.add_permits(1);
                    all_in.acquire_many(CONCURRENCY as u32).await.expect("open").forget();
                    all_in.add_permits(CONCURRENCY);
                }
                StatusCode::OK.into_response()
            })
        }
    })
    .await;
    let push = PushConfig { concurrency: CONCURRENCY, ..push_to(&app.url("/work")) };
    let zkq = TestZkq::start_ready(config_pushing(zk, &root, "q", push)).await;
    let mut expected: Vec<String> = (0..CONCURRENCY).map(|i| format!("a{i}")).collect();
    expected.extend((0..MESSAGES - CONCURRENCY).map(|i| format!("b{i:03}")));
    for body in &expected {
        zkq.put_ok("q", body.as_bytes()).await;
    }
    eventually(Duration::from_secs(60), "every message acked", || async {
        deliveries(&zkq, "q", "success").await == MESSAGES as f64
    })
    .await;
    let mut bodies = app.bodies();
    bodies.sort();
    expected.sort();
    assert_eq!(bodies, expected, "each message delivered exactly once");
    assert_eq!(app.most_in_flight.load(Ordering::SeqCst), CONCURRENCY, "concurrency used, never exceeded");
    assert_eq!(left_in_zookeeper(zk, &root, "q").await, (vec![], vec![]));
    let direct = zk_client(zk).await;
    assert!(children(&direct, &format!("{root}/deliveries/q")).await.is_empty(), "delivery counts removed");
    let text = zkq.metrics().await;
    assert_eq!(metric(&text, "zkq_push_in_flight", &["queue=\"q\""]), 0.0);
    assert_eq!(metric(&text, "zkq_push_app_available", &["queue=\"q\""]), 1.0);
    assert_eq!(metric(&text, "zkq_push_delivery_duration_seconds_count", &["queue=\"q\""]), MESSAGES as f64);
    assert_eq!(metric(&text, "zkq_messages_acked_total", &["queue=\"q\""]), MESSAGES as f64);
    promtool_accepts(&text);
    zkq.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_retried_after_a_doubling_backoff_up_to_its_cap() {
    let zk = ZkServer::shared();
    let root = unique_root("push-backoff");
    // 500, 502, 404, 500, then 200.
    let app = TestApp::start(|r| answer([500, 502, 404, 500, 200][r.attempt.min(4)])).await;
    let push = PushConfig {
        backoff_initial: Duration::from_millis(200),
        backoff_max: Duration::from_millis(800),
        ..push_to(&app.url("/work"))
    };
    let zkq = TestZkq::start_ready(config_pushing(zk, &root, "q", push)).await;
    zkq.put_ok("q", b"flaky").await;
    eventually(Duration::from_secs(30), "acked at the fifth attempt", || async {
        deliveries(&zkq, "q", "success").await == 1.0
    })
    .await;
    let attempts = app.received();
    assert_eq!(attempts.len(), 5);
    let gaps: Vec<Duration> = attempts.windows(2).map(|w| w[1].at - w[0].at).collect();
    for (gap, expected_ms) in gaps.iter().zip([200, 400, 800, 800]) {
        let expected = Duration::from_millis(expected_ms);
        assert!(
            *gap >= expected && *gap < expected + Duration::from_secs(1),
            "gaps {gaps:?}: expected about {expected_ms} ms, doubling from backoff_initial to backoff_max"
        );
    }
    let counts: Vec<&str> = attempts.iter().map(|r| r.header("zkq-delivery-count")).collect();
    assert_eq!(counts, ["1", "2", "3", "4", "5"]);
    assert_eq!(deliveries(&zkq, "q", "server_error").await, 3.0);
    assert_eq!(deliveries(&zkq, "q", "rejected").await, 1.0);
    assert_eq!(left_in_zookeeper(zk, &root, "q").await, (vec![], vec![]));
    zkq.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_requests_with_retry_after_waits_that_long_and_a_timeout_is_retried() {
    let zk = ZkServer::shared();
    let root = unique_root("push-retry-after");
    let app = TestApp::start(|r| match (r.body.as_str(), r.attempt) {
        ("busy", 0) => answer_with(429, &[("retry-after", "2")], ""),
        ("stuck", 0) => Box::pin(std::future::pending()),
        _ => answer(200),
    })
    .await;
    // Without the app's Retry-After the next attempt would come after 50 ms; the app asks for
    // longer than backoff_max (500 ms), and gets it.
    let push = PushConfig { request_timeout: Duration::from_millis(500), ..push_to(&app.url("/work")) };
    let zkq = TestZkq::start_ready(config_pushing(zk, &root, "q", push)).await;
    zkq.put_ok("q", b"busy").await;
    zkq.put_ok("q", b"stuck").await;
    eventually(Duration::from_secs(30), "both acked", || async { deliveries(&zkq, "q", "success").await == 2.0 }).await;
    let received = app.received();
    let busy: Vec<&Received> = received.iter().filter(|r| r.body == "busy").collect();
    assert_eq!(busy.len(), 2);
    let gap = busy[1].at - busy[0].at;
    assert!(
        gap >= Duration::from_secs(2) && gap < Duration::from_secs(4),
        "Retry-After: 2 honoured although backoff_max is 500 ms: {gap:?}"
    );
    let stuck: Vec<&Received> = received.iter().filter(|r| r.body == "stuck").collect();
    assert_eq!(stuck.len(), 2, "a delivery the app did not answer in request_timeout is sent again");
    assert!(stuck[1].at - stuck[0].at >= Duration::from_millis(500));
    assert_eq!(deliveries(&zkq, "q", "retry_after").await, 1.0);
    assert_eq!(deliveries(&zkq, "q", "timeout").await, 1.0);
    zkq.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dapr_status_drop_deletes_and_retry_delivers_again() {
    let zk = ZkServer::shared();
    let root = unique_root("push-dapr");
    let json = [("content-type", "application/json")];
    let app = TestApp::start(move |r| match (r.body.as_str(), r.attempt) {
        ("drop", _) => answer_with(200, &json, r#"{"status": "DROP"}"#),
        ("retry", 0) => answer_with(200, &json, r#"{"status": "RETRY"}"#),
        _ => answer_with(200, &json, r#"{"status": "SUCCESS"}"#),
    })
    .await;
    let zkq = TestZkq::start_ready(config_pushing(zk, &root, "q", push_to(&app.url("/work")))).await;
    for body in ["first", "drop", "retry", "last"] {
        zkq.put_ok("q", body.as_bytes()).await;
    }
    eventually(Duration::from_secs(30), "all settled", || async {
        deliveries(&zkq, "q", "success").await == 3.0 && deliveries(&zkq, "q", "drop").await == 1.0
    })
    .await;
    assert_eq!(app.bodies(), ["first", "drop", "retry", "retry", "last"]);
    assert_eq!(deliveries(&zkq, "q", "retry").await, 1.0);
    let text = zkq.metrics().await;
    assert_eq!(metric(&text, "zkq_messages_nacked_total", &["queue=\"q\"", "mode=\"delete\""]), 1.0);
    assert_eq!(left_in_zookeeper(zk, &root, "q").await, (vec![], vec![]), "a dropped message is gone");
    zkq.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_app_keeps_refusing_moves_to_the_dead_letter_queue() {
    let zk = ZkServer::shared();
    let root = unique_root("push-poison");
    let app = TestApp::start(|r| answer(if r.body == "poison" { 400 } else { 200 })).await;
    let mut config = config_pushing(zk, &root, "q", push_to(&app.url("/work")));
    let queue = config.queues.get_mut("q").expect("declared");
    queue.max_deliveries = Some(3);
    queue.dead_letter = Some("q.dlq".parse().expect("a valid name"));
    let zkq = TestZkq::start_ready(config).await;
    for body in ["before", "poison", "after"] {
        zkq.put_ok("q", body.as_bytes()).await;
    }
    eventually(Duration::from_secs(30), "the others acked", || async { deliveries(&zkq, "q", "success").await == 2.0 })
        .await;
    assert_eq!(app.bodies(), ["before", "poison", "poison", "poison", "after"], "three deliveries, then no more");
    assert_eq!(deliveries(&zkq, "q", "rejected").await, 3.0);
    assert_eq!(zkq.take_body("q.dlq", "5s").await.as_deref(), Some(&b"poison"[..]), "in the dead-letter queue");
    assert_eq!(left_in_zookeeper(zk, &root, "q").await, (vec![], vec![]));
    zkq.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readiness_url_gates_deliveries_until_the_app_answers_it() {
    let zk = ZkServer::shared();
    let root = unique_root("push-ready");
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let app = TestApp::start({
        let ready = ready.clone();
        move |r| {
            if r.path == "/ready" { answer(if ready.load(Ordering::SeqCst) { 204 } else { 503 }) } else { answer(200) }
        }
    })
    .await;
    let push = PushConfig {
        readiness_url: Some(AppUrl::parse(&app.url("/ready")).expect("a URL")),
        ..push_to(&app.url("/work"))
    };
    let zkq = TestZkq::start_ready(config_pushing(zk, &root, "q", push)).await;
    zkq.put_ok("q", b"waits").await;
    let probes_down =
        || async { metric(&zkq.metrics().await, "zkq_push_app_probes_total", &["queue=\"q\"", "outcome=\"down\""]) };
    eventually(Duration::from_secs(30), "three readiness probes answered 503", || async { probes_down().await >= 3.0 })
        .await;
    assert!(app.bodies().is_empty(), "nothing delivered while the app is not ready");
    let text = zkq.metrics().await;
    assert_eq!(metric(&text, "zkq_messages_leased_total", &["queue=\"q\""]), 0.0, "not even leased");
    assert_eq!(metric(&text, "zkq_push_app_available", &["queue=\"q\""]), 0.0);
    ready.store(true, Ordering::SeqCst);
    eventually(Duration::from_secs(30), "delivered once ready", || async {
        deliveries(&zkq, "q", "success").await == 1.0
    })
    .await;
    assert_eq!(app.bodies(), ["waits"]);
    assert_eq!(metric(&zkq.metrics().await, "zkq_push_app_available", &["queue=\"q\""]), 1.0);
    zkq.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_longer_than_half_its_visibility_is_extended_while_the_request_is_open() {
    let zk = ZkServer::shared();
    let root = unique_root("push-extend");
    let finish = Arc::new(tokio::sync::Notify::new());
    let app = TestApp::start({
        let finish = finish.clone();
        move |_| {
            let finish = finish.clone();
            Box::pin(async move {
                finish.notified().await;
                StatusCode::OK.into_response()
            })
        }
    })
    .await;
    let push = PushConfig { visibility: Duration::from_secs(1), ..push_to(&app.url("/work")) };
    let zkq = TestZkq::start_ready(config_pushing(zk, &root, "q", push)).await;
    zkq.put_ok("q", b"long").await;
    // Three extensions: the app has held the request for about two visibilities.
    eventually(Duration::from_secs(30), "the lease extended three times", || async {
        metric(&zkq.metrics().await, "zkq_leases_extended_total", &["queue=\"q\""]) >= 3.0
    })
    .await;
    assert_eq!(zkq.take_body("q", "0").await, None, "still held: nobody else gets it");
    finish.notify_one();
    eventually(Duration::from_secs(30), "acked", || async { deliveries(&zkq, "q", "success").await == 1.0 }).await;
    assert_eq!(app.bodies(), ["long"], "delivered once");
    assert_eq!(left_in_zookeeper(zk, &root, "q").await, (vec![], vec![]));
    zkq.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_push_one_queue_to_two_apps_each_message_once() {
    let zk = ZkServer::shared();
    let root = unique_root("push-two");
    const MESSAGES: usize = 40;
    // The first app holds its first request until the second app has one: both get work.
    let second_got_one = Arc::new(tokio::sync::Notify::new());
    let held_one = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let first = TestApp::start({
        let second_got_one = second_got_one.clone();
        move |_| {
            let (second_got_one, hold) = (second_got_one.clone(), !held_one.swap(true, Ordering::SeqCst));
            Box::pin(async move {
                if hold {
                    second_got_one.notified().await;
                }
                StatusCode::OK.into_response()
            })
        }
    })
    .await;
    let notified_once = Arc::new(std::sync::Once::new());
    let second = TestApp::start({
        let (second_got_one, notified_once) = (second_got_one.clone(), notified_once.clone());
        move |_| {
            notified_once.call_once(|| second_got_one.notify_one());
            answer(200)
        }
    })
    .await;
    let one = TestZkq::start_ready(config_pushing(zk, &root, "q", push_to(&first.url("/a")))).await;
    let two = TestZkq::start_ready(config_pushing(zk, &root, "q", push_to(&second.url("/b")))).await;
    let mut expected: Vec<String> = (0..MESSAGES).map(|i| format!("m{i:02}")).collect();
    for body in &expected {
        one.put_ok("q", body.as_bytes()).await;
    }
    eventually(Duration::from_secs(60), "every message acked by one sidecar or the other", || async {
        deliveries(&one, "q", "success").await + deliveries(&two, "q", "success").await == MESSAGES as f64
    })
    .await;
    for zkq in [&one, &two] {
        assert_eq!(deliveries(zkq, "q", "timeout").await, 0.0, "no delivery needed a second attempt");
    }
    let (to_first, to_second) = (first.bodies(), second.bodies());
    assert!(!to_first.is_empty() && !to_second.is_empty(), "both apps got work: {to_first:?} {to_second:?}");
    let mut all: Vec<String> = to_first.into_iter().chain(to_second).collect();
    all.sort();
    expected.sort();
    assert_eq!(all, expected, "each message delivered to exactly one app, once");
    assert_eq!(left_in_zookeeper(zk, &root, "q").await, (vec![], vec![]));
    one.stop().await;
    two.stop().await;
}

/// A series of a child zkq's `/metrics` (see [`metric`]).
async fn child_metric(http: &reqwest::Client, child: &ChildZkq, name: &str, labels: &[&str]) -> f64 {
    let text = match http.get(format!("{}/metrics", child.admin)).send().await {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    metric(&text, name, labels)
}

/// The environment that declares `queue` with a push subscription in a child zkq.
fn push_env(queue: &str, settings: &[(&str, String)]) -> Vec<(String, String)> {
    settings
        .iter()
        .map(|(key, value)| (format!("ZKQ__QUEUES__{}__PUSH__{key}", queue.to_uppercase()), value.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_app_is_down_zkq_backs_off_leases_nothing_and_stays_idle_then_delivers_when_it_is_up() {
    let zk = ZkServer::shared();
    let root = unique_root("push-down");
    let port = free_port(); // nothing listens on it yet
    let env = push_env(
        "jobs",
        &[
            ("URL", format!("http://127.0.0.1:{port}/jobs")),
            ("CONCURRENCY", "4".into()),
            ("BACKOFF_INITIAL", "20ms".into()),
            ("BACKOFF_MAX", "200ms".into()),
        ],
    );
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let child = ChildZkq::start(zk, &root, &env).await;
    let http = reqwest::Client::new();
    for i in 0..5 {
        let put = http.post(format!("{}/v1/queues/jobs/messages", child.api)).body(format!("job{i}")).send().await;
        assert_eq!(put.expect("put").status(), 201);
    }
    let down = ["queue=\"jobs\"", "outcome=\"down\""];
    // Polls of /metrics cost zkq CPU too: look every quarter second, not every 50 ms.
    let wait_for_attempts = |at_least: f64| {
        let (http, child) = (&http, &child);
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while child_metric(http, child, "zkq_push_app_probes_total", &down).await < at_least {
                assert!(Instant::now() < deadline, "fewer than {at_least} connection attempts in 60 s");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    };
    // The backoff has reached its cap (20, 40, 80, 160, 200 ms…): measure from here.
    wait_for_attempts(6.0).await;
    let (cpu_before, wall_before) = (child.cpu_time(), Instant::now());
    let attempts_before = child_metric(&http, &child, "zkq_push_app_probes_total", &down).await;
    wait_for_attempts(attempts_before + 15.0).await;
    let (cpu, wall) = (child.cpu_time() - cpu_before, wall_before.elapsed());
    let attempts = child_metric(&http, &child, "zkq_push_app_probes_total", &down).await - attempts_before;
    let ratio = cpu.as_secs_f64() / wall.as_secs_f64();
    eprintln!("app down: {attempts} connection attempts in {wall:?}, zkq used {cpu:?} CPU ({:.1}%)", ratio * 100.0);
    assert!(ratio < 0.05, "zkq must wait, not spin, while the app is down: {cpu:?} CPU in {wall:?}");
    // Four workers, one probe at a time: about one attempt per pause (160-200 ms), not four.
    let per_second = attempts / wall.as_secs_f64();
    assert!(per_second < 8.0, "{per_second:.1} attempts/s with a 200 ms cap: one worker probes at a time");
    assert_eq!(
        child_metric(&http, &child, "zkq_messages_leased_total", &["queue=\"jobs\""]).await,
        0.0,
        "an app that is down costs no delivery"
    );
    assert_eq!(child_metric(&http, &child, "zkq_push_app_available", &["queue=\"jobs\""]).await, 0.0);

    let app = TestApp::start_on(port, |_| answer(200)).await;
    eventually(Duration::from_secs(30), "all five delivered once the app is up", || async {
        child_metric(&http, &child, "zkq_push_deliveries_total", &["queue=\"jobs\"", "outcome=\"success\""]).await
            == 5.0
    })
    .await;
    let mut bodies = app.bodies();
    bodies.sort();
    assert_eq!(bodies, ["job0", "job1", "job2", "job3", "job4"]);
    assert!(app.received().iter().all(|r| r.header("zkq-delivery-count") == "1"), "the first delivery of each");
    assert_eq!(child_metric(&http, &child, "zkq_push_app_available", &["queue=\"jobs\""]).await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_delivery_in_flight_finish_releases_the_one_still_open_and_leases_nothing_new() {
    let zk = ZkServer::shared();
    let root = unique_root("push-sigterm");
    let finish_first = Arc::new(tokio::sync::Notify::new());
    let app = TestApp::start({
        let finish_first = finish_first.clone();
        move |r| {
            let finish_first = finish_first.clone();
            Box::pin(async move {
                match r.body.as_str() {
                    "first" => finish_first.notified().await,
                    "second" => std::future::pending().await, // never answered
                    _ => {},
                }
                StatusCode::OK.into_response()
            })
        }
    })
    .await;
    let env = push_env("jobs", &[("URL", app.url("/jobs")), ("CONCURRENCY", "2".into())]);
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    // Deliveries in flight get 3 s (the grace but a reserve of a quarter); the rest is released.
    env.push(("ZKQ__SHUTDOWN__GRACE", "4s"));
    // A session timeout far beyond the test: a redelivery can only come from a release.
    env.push(("ZKQ__ZOOKEEPER__SESSION_TIMEOUT", "60s"));
    let child = ChildZkq::start(zk, &root, &env).await;
    let http = reqwest::Client::new();
    for body in ["first", "second", "third"] {
        let put = http.post(format!("{}/v1/queues/jobs/messages", child.api)).body(body).send().await;
        assert_eq!(put.expect("put").status(), 201);
    }
    eventually(Duration::from_secs(30), "two deliveries in flight", || async { app.count() == 2 }).await;
    let mut in_flight = app.bodies();
    in_flight.sort();
    assert_eq!(in_flight, ["first", "second"], "concurrency 2: the first two");

    let signalled = Instant::now();
    child.signal("TERM");
    eventually(Duration::from_secs(3), "not ready", || {
        let (http, url) = (http.clone(), format!("{}/readyz", child.admin));
        async move { http.get(url).send().await.map_or(true, |r| r.status() == 503) }
    })
    .await;
    // The app answers the first delivery during the drain: it is acked.
    finish_first.notify_one();
    let exit = child.wait().await;
    let took = signalled.elapsed();
    assert_eq!(exit.code(), Some(0));
    assert!(took >= Duration::from_millis(2900), "the open delivery had its 3 s: {took:?}");
    assert!(took < Duration::from_secs(5), "exited within shutdown.grace: {took:?}");
    assert_eq!(app.count(), 2, "nothing new was leased after SIGTERM");

    let direct = zk_client(zk).await;
    let left: Vec<Vec<u8>> = {
        let mut left = Vec::new();
        for name in children(&direct, &format!("{root}/queues/jobs")).await {
            let (data, _) = direct.get_data(&format!("{root}/queues/jobs/{name}")).await.expect("data");
            left.extend(zkq::envelope::decode(&data).expect("envelope"));
        }
        left
    };
    assert_eq!(left, [b"second".to_vec(), b"third".to_vec()], "the first was acked; the others are still there");
    assert!(children(&direct, &format!("{root}/locks/jobs")).await.is_empty(), "the open delivery was released");

    // Delivered again at once by another zkq, not after the session timeout.
    let mut config = test_config(zk, &root);
    config.log.level = "warn".into();
    let other = TestZkq::start_ready(config).await;
    let leased = other.http.post(other.url("/v1/queues/jobs/leases?wait=5s")).send().await.expect("lease");
    assert_eq!(leased.status(), 200);
    assert_eq!(leased.headers()["zkq-delivery-count"], "2", "the released delivery");
    assert_eq!(leased.bytes().await.expect("body"), "second");
    let leased = other.http.post(other.url("/v1/queues/jobs/leases?wait=5s")).send().await.expect("lease");
    assert_eq!(leased.headers()["zkq-delivery-count"], "1", "never leased before");
    assert_eq!(leased.bytes().await.expect("body"), "third");
    other.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grouped_queue_is_pushed_one_delivery_per_group_in_put_order_groups_at_once() {
    let zk = ZkServer::shared();
    let root = unique_root("push-groups");
    const GROUPS: usize = 10;
    const PER_GROUP: usize = 8;
    // The app notes a delivery of a group that arrives while another of that group is open, and
    // fails the first attempt of every third message (it is retried in place, first of its group).
    let open: Arc<Mutex<HashSet<String>>> = Arc::default();
    let overlaps: Arc<Mutex<Vec<String>>> = Arc::default();
    let app = TestApp::start({
        let (open, overlaps) = (open.clone(), overlaps.clone());
        move |r| {
            let (open, overlaps) = (open.clone(), overlaps.clone());
            Box::pin(async move {
                let (group, index) = r.body.split_once('-').expect("g-i");
                let index: usize = index.parse().expect("index");
                if !open.lock().expect("lock").insert(group.to_owned()) {
                    overlaps.lock().expect("lock").push(r.body.clone());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                open.lock().expect("lock").remove(group);
                let status = if r.attempt == 0 && index.is_multiple_of(3) { 500 } else { 200 };
                StatusCode::from_u16(status).expect("status").into_response()
            })
        }
    })
    .await;
    let push = PushConfig { concurrency: 8, ..push_to(&app.url("/work")) };
    let mut config = config_pushing(zk, &root, "q", push);
    config.queues.get_mut("q").expect("declared").grouped = true;
    let zkq = TestZkq::start_ready(config).await;
    let api = zkq.client();
    for index in 0..PER_GROUP {
        for group in 0..GROUPS {
            let put = api.put("q", &format!("group=g{group}"), format!("g{group}-{index}").as_bytes()).await;
            assert_eq!(put.status, 201);
        }
    }
    eventually(Duration::from_secs(60), "every message acked", || async {
        deliveries(&zkq, "q", "success").await == (GROUPS * PER_GROUP) as f64
    })
    .await;
    assert_eq!(*overlaps.lock().expect("lock"), Vec::<String>::new(), "two deliveries of one group at once");
    let mut by_group: HashMap<String, Vec<String>> = HashMap::new();
    for received in app.received() {
        let group = received.body.split_once('-').expect("g-i").0.to_owned();
        by_group.entry(group).or_default().push(received.body);
    }
    for (group, bodies) in by_group {
        let mut expected = Vec::new();
        for index in 0..PER_GROUP {
            let body = format!("{group}-{index}");
            // A failed first attempt is delivered again before anything after it.
            let times = if index.is_multiple_of(3) { 2 } else { 1 };
            expected.extend(std::iter::repeat_n(body, times));
        }
        assert_eq!(bodies, expected, "group {group}: put order, a failure retried in place");
    }
    assert!(app.most_in_flight.load(Ordering::SeqCst) > 1, "several groups are delivered at once");
    zkq.stop().await;
}
