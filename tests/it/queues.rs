//! The queue API against real ZooKeeper: round trips, errors, long-polls, concurrency, outages.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use zkq::config::QueueKind;

use zkq_testkit::*;

async fn json(response: reqwest::Response) -> serde_json::Value {
    response.json().await.expect("json body")
}

async fn assert_error(response: reqwest::Response, status: u16, code: &str) {
    assert_eq!(response.status().as_u16(), status, "expected {status} {code}");
    let content_type = response.headers().get("content-type").map(|v| v.to_str().unwrap_or("").to_owned());
    assert_eq!(content_type.as_deref(), Some("application/json"));
    let body = json(response).await;
    assert_eq!(body["code"], code, "{body}");
    assert!(!body["message"].as_str().unwrap_or("").is_empty(), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_round_trips_bytes_and_kind_fields() {
    let zk = ZkServer::shared();
    let root = unique_root("roundtrip");
    let mut config = test_config(zk, &root);
    for (name, kind) in [
        ("f", QueueKind::Fifo),
        ("p", QueueKind::Priority),
        ("d", QueueKind::Delay),
        ("i", QueueKind::Id),
        ("s", QueueKind::Simple),
    ] {
        declare(&mut config, name, kind, None, None);
    }
    let max = config.api.max_message_bytes;
    let zkq = TestZkq::start_ready(config).await;
    let binary: Vec<u8> = (0..=255u8).collect();
    let largest = vec![0xA5u8; max];
    for queue in ["f", "s"] {
        for body in [b"".as_slice(), b"hello".as_slice(), binary.as_slice(), largest.as_slice()] {
            let id = zkq.put_ok(queue, body).await;
            let response = zkq.take(queue, "2s").await;
            assert_eq!(response.status(), 200);
            assert_eq!(response.headers()["zkq-message-id"], id.as_str());
            assert_eq!(response.bytes().await.expect("body").as_ref(), body, "queue {queue}");
        }
    }
    let put = zkq.http.post(zkq.url("/v1/queues/p/messages?priority=-7")).body("neg").send().await.expect("put");
    let id = json(put).await["message_id"].as_str().expect("id").to_owned();
    assert!(id.starts_with("queue-0FFFFFFF9"), "{id}");
    let taken = zkq.take("p", "2s").await;
    assert_eq!(taken.headers()["zkq-priority"], "-7");

    zkq.http.post(zkq.url("/v1/queues/i/messages?id=a/b")).body("x").send().await.expect("put");
    let taken = zkq.take("i", "2s").await;
    assert_eq!(taken.headers()["zkq-id"], "a_b");
    assert!(taken.headers()["zkq-message-id"].to_str().expect("ascii").starts_with("queue-|a_b|"));

    zkq.http.post(zkq.url("/v1/queues/d/messages?deliver_at=1000")).body("due").send().await.expect("put");
    let taken = zkq.take("d", "2s").await;
    assert_eq!(taken.headers()["zkq-deliver-at"], "1000");
    assert_eq!(taken.bytes().await.expect("body").as_ref(), b"due");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_get_documented_json_errors() {
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("errors"));
    declare(&mut config, "ids", QueueKind::Id, None, None);
    config.queues.insert(
        "tiny".parse().expect("a valid name"),
        zkq::config::QueueConfig {
            kind: QueueKind::Fifo,
            path: None,
            lock_path: None,
            max_items: Some(1),
            max_deliveries: None,
            dead_letter: None,
            push: None,
            idempotency_window: None,
            grouped: false,
            sqs_binary_bodies: None,
            retention: None,
        },
    );
    config.take.max_wait = Duration::from_secs(1);
    let max = config.api.max_message_bytes;
    let zkq = TestZkq::start_ready(config).await;
    let post = |path: &str| zkq.http.post(zkq.url(path));

    assert_error(zkq.put("bad%20name", b"x").await, 400, "invalid_queue_name").await;
    assert_error(zkq.put(&"x".repeat(201), b"x").await, 400, "invalid_queue_name").await;
    for trick in ["/v1/queues/%2E%2E/messages", "/v1/queues/..%2Fzookeeper/messages", "/v1/queues/a%00b/messages"] {
        let (status, body) = raw_request(&zkq.api, "POST", trick).await;
        assert_eq!((status, body["code"].as_str()), (400, Some("invalid_queue_name")), "{trick}: {body}");
    }
    // Every route that names a queue refuses a bad name alike, saying which name and why.
    for (method, path) in [
        ("POST", "/v1/queues/a%20b/take"),
        ("GET", "/v1/queues/a%20b/messages"),
        ("GET", "/v1/queues/a%20b"),
        ("POST", "/v1/queues/a%20b/batch"),
        ("POST", "/v1/queues/a%20b/leases"),
        ("DELETE", "/v1/queues/a%20b/leases/r1"),
        ("POST", "/v1/queues/a%20b/acks"),
    ] {
        let (status, body) = raw_request(&zkq.api, method, path).await;
        let expected =
            (400, Some("invalid_queue_name"), Some(r#"queue name "a b" may contain only A-Z a-z 0-9 . _ -"#));
        assert_eq!((status, body["code"].as_str(), body["message"].as_str()), expected, "{method} {path}");
    }
    assert_error(post("/v1/queues/f/messages?priority=1").send().await.expect("r"), 409, "parameter_not_for_kind")
        .await;
    assert_error(post("/v1/queues/f/messages?priority=abc").send().await.expect("r"), 400, "invalid_parameter").await;
    assert_error(post("/v1/queues/ids/messages").send().await.expect("r"), 409, "parameter_not_for_kind").await;
    assert_error(zkq.put("f", &vec![0u8; max + 1]).await, 413, "payload_too_large").await;
    assert_error(post("/v1/queues/f/take?wait=soon").send().await.expect("r"), 400, "invalid_parameter").await;
    assert_error(post("/v1/queues/f/take?wait=1d").send().await.expect("r"), 400, "invalid_parameter").await;
    // A wait beyond take.max_wait is cut to it (documented), not refused.
    let started = Instant::now();
    let capped = post("/v1/queues/f/take?wait=1h").send().await.expect("r");
    assert_eq!(capped.status(), 204);
    assert!(started.elapsed() < Duration::from_secs(15), "cut to 1 s, not an hour: {:?}", started.elapsed());
    let peek = zkq.http.get(zkq.url("/v1/queues/f/messages?limit=0")).send().await.expect("r");
    assert_error(peek, 400, "invalid_parameter").await;
    // A queue that exists (a put made it) but holds no such message.
    assert_eq!(zkq.put("f", b"x").await.status(), 201);
    let missing = zkq.http.delete(zkq.url("/v1/queues/f/messages/queue-0000000099")).send().await.expect("r");
    assert_error(missing, 404, "message_not_found").await;
    let sneaky = zkq.http.delete(zkq.url("/v1/queues/f/messages/..%2F..%2Fzookeeper")).send().await.expect("r");
    assert_error(sneaky, 404, "message_not_found").await;
    assert_error(zkq.http.get(zkq.url("/nope")).send().await.expect("r"), 404, "not_found").await;
    assert_error(zkq.http.put(zkq.url("/v1/queues/f/take")).send().await.expect("r"), 405, "method_not_allowed").await;

    // max_items: the second put waits for room, then 429 with Retry-After.
    zkq.put_ok("tiny", b"1").await;
    let started = Instant::now();
    let full = post("/v1/queues/tiny/messages?wait=300ms").body("2").send().await.expect("r");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(full.headers().contains_key("retry-after"));
    assert_error(full, 429, "queue_full").await;

    // Static queues only.
    let mut config = test_config(zk, &unique_root("static"));
    config.queues_dynamic = false;
    declare(&mut config, "known", QueueKind::Fifo, None, None);
    let strict = TestZkq::start_ready(config).await;
    assert_error(strict.put("unknown", b"x").await, 404, "queue_not_found").await;
    assert_eq!(strict.put("known", b"x").await.status(), 201);
}

/// A single consumer keeps Curator's order after zkq's own `DELETE …/messages/{id}` and after a
/// lone foreign consumer removed a message: neither raced a claim of its own. (Every
/// deletion of a candidate used to make its takers pick at random for 5 s: `c-4, c-6, c-3, …`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_consumer_keeps_curators_order_after_deletes_it_did_not_race() {
    let zk = ZkServer::shared();
    let root = unique_root("order-after-delete");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let api = zkq.client();
    let mut ids = Vec::new();
    for i in 0..12 {
        let put = api.put("q", "", format!("c-{i}").as_bytes()).await;
        assert_eq!(put.status, 201);
        ids.push(put.json()["message_id"].as_str().expect("id").to_owned());
    }
    // zkq's own deletes by id, then a foreign consumer (a direct client, as Curator's would)
    // removes a message further back, which the cache prunes from its event.
    for id in [&ids[1], &ids[4]] {
        let by_id = api.send(reqwest::Method::DELETE, &format!("/v1/queues/q/messages/{id}"), None).await;
        assert_eq!(by_id.status, 204, "{}", by_id.text());
    }
    let direct = zk_client(zk).await;
    direct.delete(&format!("{root}/queues/q/{}", ids[10]), None).await.expect("a foreign take");
    let mut order = Vec::new();
    for _ in 0..9 {
        let taken = api.take("q", "wait=5s").await;
        assert_eq!(taken.status, 200);
        order.push(taken.text());
    }
    let expected: Vec<String> = [0, 2, 3, 5, 6, 7, 8, 9, 11].iter().map(|i| format!("c-{i}")).collect();
    assert_eq!(order, expected, "a single consumer takes in Curator's order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_taker_sees_curator_order_per_kind() {
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("order"));
    declare(&mut config, "p", QueueKind::Priority, None, None);
    declare(&mut config, "d", QueueKind::Delay, None, None);
    let zkq = TestZkq::start_ready(config).await;
    for (priority, body) in [(5, "five"), (-1, "minus-one"), (10, "ten"), (5, "five-again"), (i32::MIN, "min")] {
        let url = zkq.url(&format!("/v1/queues/p/messages?priority={priority}"));
        assert_eq!(zkq.http.post(url).body(body).send().await.expect("put").status(), 201);
    }
    let mut got = Vec::new();
    while let Some(body) = zkq.take_body("p", "0").await {
        got.push(String::from_utf8(body).expect("utf8"));
    }
    assert_eq!(got, ["min", "minus-one", "five", "five-again", "ten"]);

    // Delay: by delivery time numerically; not before it is due.
    let now = zkq::now_epoch_ms();
    for (at, body) in [(now - 1000, "past-b"), (0x1_0000_0000_i64, "past-a"), (now + 1500, "soon")] {
        let url = zkq.url(&format!("/v1/queues/d/messages?deliver_at={at}"));
        assert_eq!(zkq.http.post(url).body(body).send().await.expect("put").status(), 201);
    }
    assert_eq!(zkq.take_body("d", "0").await.as_deref(), Some(b"past-a".as_slice()));
    assert_eq!(zkq.take_body("d", "0").await.as_deref(), Some(b"past-b".as_slice()));
    assert_eq!(zkq.take_body("d", "0").await, None, "not due yet");
    let started = Instant::now();
    assert_eq!(zkq.take_body("d", "10s").await.as_deref(), Some(b"soon".as_slice()));
    assert!(zkq::now_epoch_ms() >= now + 1500, "delivered early after {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_put_wakes_exactly_one_of_200_waiters() {
    let zk = ZkServer::shared();
    let zkq = TestZkq::start_ready(test_config(zk, &unique_root("herd"))).await;
    zkq.put_ok("q", b"warmup").await;
    assert_eq!(zkq.take_body("q", "0").await.as_deref(), Some(b"warmup".as_slice()));

    let mut waiters = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let http = zkq.http.clone();
        let url = zkq.url("/v1/queues/q/take?wait=20s");
        waiters.spawn(async move { http.post(url).send().await.map(|r| r.status().as_u16()) });
    }
    eventually(Duration::from_secs(20), "200 waiters registered", || async {
        zkq.metrics().await.contains("zkq_waiting_takers{queue=\"q\"} 200")
    })
    .await;
    zkq.put_ok("q", b"only").await;
    let first = tokio::time::timeout(Duration::from_secs(10), waiters.join_next()).await.expect("one answer");
    assert_eq!(first.expect("a waiter").expect("joined").expect("http"), 200);
    // Nobody else is answered: the other 199 are still waiting.
    eventually(Duration::from_secs(10), "199 still waiting", || async {
        zkq.metrics().await.contains("zkq_waiting_takers{queue=\"q\"} 199")
    })
    .await;
    assert!(tokio::time::timeout(Duration::from_millis(500), waiters.join_next()).await.is_err());
    let info = json(zkq.http.get(zkq.url("/v1/queues/q")).send().await.expect("info")).await;
    assert_eq!(info["waiting_takers"], 199);
    waiters.abort_all();
    eventually(Duration::from_secs(10), "cancelled waiters are gone", || async {
        zkq.metrics().await.contains("zkq_waiting_takers{queue=\"q\"} 0")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taker_that_leaves_removes_nothing() {
    let zk = ZkServer::shared();
    let zkq = TestZkq::start_ready(test_config(zk, &unique_root("leaver"))).await;
    zkq.put_ok("q", b"opens the queue").await;
    assert!(zkq.take_body("q", "0").await.is_some());
    let short = reqwest::Client::builder().timeout(Duration::from_millis(300)).build().expect("client");
    let gone = short.post(zkq.url("/v1/queues/q/take?wait=10s")).send().await;
    assert!(gone.is_err(), "the client gave up");
    eventually(Duration::from_secs(10), "waiter removed", || async {
        zkq.metrics().await.contains("zkq_waiting_takers{queue=\"q\"} 0")
    })
    .await;
    zkq.put_ok("q", b"keep me").await;
    let peek = json(zkq.http.get(zkq.url("/v1/queues/q/messages")).send().await.expect("peek")).await;
    assert_eq!(peek["messages"].as_array().map(Vec::len), Some(1), "{peek}");
    assert_eq!(zkq.take_body("q", "0").await.as_deref(), Some(b"keep me".as_slice()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_under_load_deliver_each_message_once() {
    let zk = ZkServer::shared();
    let root = unique_root("exactly-once");
    let [a, b] = TestZkq::fleet(test_config(zk, &root)).await;
    let total = 400;
    let mut puts = tokio::task::JoinSet::new();
    for i in 0..total {
        let (http, url) =
            (a.http.clone(), if i % 2 == 0 { a.url("/v1/queues/q/messages") } else { b.url("/v1/queues/q/messages") });
        puts.spawn(async move { http.post(url).body(format!("m{i}")).send().await.expect("put").status().as_u16() });
    }
    // Takers stop at the first 204 after every put was answered (a 204 then means empty).
    let puts_done = Arc::new(AtomicBool::new(false));
    let mut takers = tokio::task::JoinSet::new();
    for t in 0..8 {
        let zkq_url = if t % 2 == 0 { a.url("/v1/queues/q/take?wait=1s") } else { b.url("/v1/queues/q/take?wait=1s") };
        let (http, puts_done) = (a.http.clone(), puts_done.clone());
        takers.spawn(async move {
            let mut got = Vec::new();
            loop {
                let done_before = puts_done.load(Ordering::SeqCst);
                let response = http.post(&zkq_url).send().await.expect("take");
                match response.status().as_u16() {
                    200 => got.push(String::from_utf8(response.bytes().await.expect("b").to_vec()).expect("utf8")),
                    204 if done_before => return got,
                    204 => {},
                    other => panic!("take answered {other}"),
                }
            }
        });
    }
    while let Some(status) = puts.join_next().await {
        assert_eq!(status.expect("put task"), 201);
    }
    puts_done.store(true, Ordering::SeqCst);
    let mut seen = HashSet::new();
    let mut count = 0;
    while let Some(got) = takers.join_next().await {
        for body in got.expect("taker") {
            count += 1;
            assert!(seen.insert(body.clone()), "{body} delivered twice");
        }
    }
    assert_eq!(count, total, "every message delivered exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_takers_are_served_after_a_zookeeper_restart() {
    let zk = ZkServer::start();
    let root = unique_root("restart-takers");
    let mut config = test_config(&zk, &root);
    config.zookeeper.session_timeout = Duration::from_secs(20);
    config.take.max_wait = Duration::from_secs(60);
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("q", b"warm").await;
    zkq.take_body("q", "0").await;
    let mut takers = tokio::task::JoinSet::new();
    for _ in 0..3 {
        let (http, url) = (zkq.http.clone(), zkq.url("/v1/queues/q/take?wait=45s"));
        takers.spawn(async move { http.post(url).send().await.expect("take").status().as_u16() });
    }
    eventually(Duration::from_secs(10), "3 waiting", || async {
        zkq.metrics().await.contains("zkq_waiting_takers{queue=\"q\"} 3")
    })
    .await;
    zk.stop();
    zk.restart();
    zkq.wait_ready().await;
    // Another client puts while zkq's watch must have been re-armed.
    let direct = zk_client(&zk).await;
    for body in ["a", "b", "c"] {
        let data = zkq::envelope::encode([body.as_bytes()]);
        direct
            .create(
                &format!("{root}/queues/q/queue-"),
                &data,
                &zookeeper_client::CreateMode::PersistentSequential.with_acls(zookeeper_client::Acls::anyone_all()),
            )
            .await
            .expect("direct put");
    }
    let mut served = 0;
    while let Some(status) = tokio::time::timeout(Duration::from_secs(30), takers.join_next()).await.expect("answered")
    {
        assert_eq!(status.expect("taker"), 200);
        served += 1;
    }
    assert_eq!(served, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_and_undecodable_nodes_are_skipped_never_deleted() {
    let zk = ZkServer::shared();
    let root = unique_root("foreign");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    zkq.put_ok("q", b"first").await;
    let direct = zk_client(zk).await;
    let persistent = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    direct.create(&format!("{root}/queues/q/foreign-node"), b"x", &persistent).await.expect("foreign");
    direct
        .create(&format!("{root}/queues/q/queue-0000000000x"), b"raw, not an envelope", &persistent)
        .await
        .expect("raw");
    zkq.put_ok("q", b"second").await;
    assert_eq!(zkq.take_body("q", "0").await.as_deref(), Some(b"first".as_slice()));
    assert_eq!(zkq.take_body("q", "0").await.as_deref(), Some(b"second".as_slice()));
    assert_eq!(zkq.take_body("q", "0").await, None);
    assert_eq!(children(&direct, &format!("{root}/queues/q")).await, ["foreign-node", "queue-0000000000x"]);
    assert!(zkq.metrics().await.contains("zkq_undecodable_messages_total{queue=\"q\"} 1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_by_message_id_and_by_id() {
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("remove"));
    declare(&mut config, "ids", QueueKind::Id, None, None);
    let zkq = TestZkq::start_ready(config).await;
    let id = zkq.put_ok("f", b"gone").await;
    zkq.put_ok("f", b"stays").await;
    let deleted = zkq.http.delete(zkq.url(&format!("/v1/queues/f/messages/{id}"))).send().await.expect("delete");
    assert_eq!(deleted.status(), 204);
    assert_eq!(zkq.take_body("f", "0").await.as_deref(), Some(b"stays".as_slice()));
    for (id, body) in [("a/b", "1"), ("a/b", "2"), ("c", "3")] {
        let url = zkq.url(&format!("/v1/queues/ids/messages?id={id}"));
        assert_eq!(zkq.http.post(url).body(body).send().await.expect("put").status(), 201);
    }
    let removed = zkq.http.delete(zkq.url("/v1/queues/ids/messages?id=a/b")).send().await.expect("remove");
    assert_eq!(json(removed).await["removed"], 2);
    assert_eq!(zkq.take_body("ids", "0").await.as_deref(), Some(b"3".as_slice()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_whose_answer_is_lost_says_outcome_unknown_not_created() {
    let zk = ZkServer::start();
    let zkq = TestZkq::start_ready(test_config(&zk, &unique_root("outcome"))).await;
    zkq.put_ok("q", b"before").await;
    // The server freezes after the request is sent: zkq cannot know whether it was applied.
    zk.pause();
    let response = zkq.put("q", b"in doubt").await;
    zk.resume();
    assert_error(response, 504, "outcome_unknown").await;
    assert!(zkq.metrics().await.contains("zkq_put_outcome_unknown_total{queue=\"q\"} 1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_listing_describes_declared_and_dynamic_queues() {
    let zk = ZkServer::shared();
    let root = unique_root("listing");
    let mut config = test_config(zk, &root);
    declare(&mut config, "declared", QueueKind::Priority, Some(&format!("{root}/app/q")), None);
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("dynamic", b"1").await;
    zkq.put_ok("dynamic", b"2").await;
    let list = json(zkq.http.get(zkq.url("/v1/queues")).send().await.expect("list")).await;
    let queues = list["queues"].as_array().expect("array");
    let names: Vec<&str> = queues.iter().filter_map(|q| q["name"].as_str()).collect();
    assert_eq!(names, ["declared", "dynamic"]);
    assert_eq!(queues[0]["kind"], "priority");
    assert_eq!(queues[0]["path"], format!("{root}/app/q"));
    assert_eq!(queues[0]["lock_path"], serde_json::Value::Null);
    assert_eq!(queues[1]["kind"], "fifo");
    assert_eq!(queues[1]["depth"], 2);
    assert_eq!(queues[1]["lock_path"], format!("{root}/locks/dynamic"));
    assert!(queues[1]["oldest_message_age_ms"].as_i64().is_some_and(|age| age >= 0));
}

/// `?all=true` lists every queue under the root, also those this zkq never opened (another
/// sidecar's, a Curator producer's), and opens or creates nothing doing so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_all_shows_every_queue_under_the_root_without_opening_or_creating_anything() {
    let zk = ZkServer::shared();
    let root = unique_root("listing-all");
    let other = TestZkq::start_ready(test_config(zk, &root)).await;
    other.put_ok("from-zkq", b"1").await;
    other.put_ok("from-zkq", b"2").await;
    Curator::run(zk, &["put", "fifo", &format!("{root}/queues/from-curator"), "6869"]).await;

    let mut config = test_config(zk, &root);
    declare(&mut config, "declared", QueueKind::Priority, Some(&format!("{root}/app/q")), None);
    let zkq = TestZkq::start_ready(config).await;
    let opened = json(zkq.http.get(zkq.url("/v1/queues")).send().await.expect("list")).await;
    let names = |list: &serde_json::Value| -> Vec<String> {
        list["queues"].as_array().expect("array").iter().filter_map(|q| q["name"].as_str().map(str::to_owned)).collect()
    };
    assert_eq!(names(&opened), ["declared"], "without all: only what this zkq has open");

    let direct = zk_client(zk).await;
    let mut dirs_before = Vec::new();
    for dir in ["queues", "locks", "deliveries"] {
        dirs_before.push(children(&direct, &format!("{root}/{dir}")).await);
    }
    let all = json(zkq.http.get(zkq.url("/v1/queues?all=true")).send().await.expect("list all")).await;
    assert_eq!(names(&all), ["declared", "from-curator", "from-zkq"], "{all}");
    assert_eq!(all["omitted"], 0);
    let by_name = |name: &str| all["queues"].as_array().and_then(|q| q.iter().find(|q| q["name"] == name)).cloned();
    let from_zkq = by_name("from-zkq").expect("from-zkq");
    assert_eq!(from_zkq["depth"], 2);
    assert_eq!(from_zkq["kind"], "fifo");
    assert_eq!(from_zkq["declared"], false);
    assert_eq!(from_zkq["waiting_takers"], 0);
    assert!(from_zkq["oldest_message_age_ms"].as_i64().is_some_and(|age| age >= 0), "{from_zkq}");
    assert_eq!(by_name("from-curator").expect("from-curator")["depth"], 1);
    assert_eq!(by_name("declared").expect("declared")["kind"], "priority");

    let opened = json(zkq.http.get(zkq.url("/v1/queues")).send().await.expect("list")).await;
    assert_eq!(names(&opened), ["declared"], "listing all opened no queue");
    let mut dirs_after = Vec::new();
    for dir in ["queues", "locks", "deliveries"] {
        dirs_after.push(children(&direct, &format!("{root}/{dir}")).await);
    }
    assert_eq!(dirs_after, dirs_before, "listing all created nothing");

    let refused = zkq.http.get(zkq.url("/v1/queues?all=maybe")).send().await.expect("list");
    assert_error(refused, 400, "invalid_parameter").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_credentials_open_acl_protected_queues_and_their_absence_is_a_clear_error() {
    let zk = ZkServer::shared();
    let root = unique_root("acl");
    let script = r#"
import sys
from kazoo.client import KazooClient
from kazoo.security import make_digest_acl
zk = KazooClient(hosts=sys.argv[1], auth_data=[("digest", "app:s3cret")])
zk.start()
acl = [make_digest_acl("app", "s3cret", all=True)]
zk.create(sys.argv[2], b"")
zk.create(sys.argv[2] + "/secure", b"", acl=acl)
zk.create(sys.argv[2] + "/secure/jobs", b"", acl=acl)
zk.create(sys.argv[2] + "/secure/locks", b"", acl=acl)
zk.stop()
"#;
    let (hosts, path) = (zk.connect_string(), root.clone());
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("/usr/bin/python3").args(["-c", script, &hosts, &path]).output()
    })
    .await
    .expect("join")
    .expect("Debian's python3 with python3-kazoo");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));

    let configure = |auth: Option<&str>| {
        let mut config = test_config(zk, &root);
        declare(
            &mut config,
            "jobs",
            QueueKind::Fifo,
            Some(&format!("{root}/secure/jobs")),
            Some(&format!("{root}/secure/locks")),
        );
        config.zookeeper.auth_digest = auth.map(zkq::config::Secret::new);
        config
    };
    let authorised = TestZkq::start_ready(configure(Some("app:s3cret"))).await;
    authorised.put_ok("jobs", b"secret work").await;
    assert_eq!(authorised.take_body("jobs", "2s").await.as_deref(), Some(b"secret work".as_slice()));

    let anonymous = TestZkq::start_ready(configure(None)).await;
    let response = anonymous.put("jobs", b"x").await;
    assert_eq!(response.status(), 502);
    let body: serde_json::Value = response.json().await.expect("json");
    assert_eq!(body["code"], "zookeeper_refused");
    assert!(body["message"].as_str().unwrap_or("").contains("auth_digest"), "{body}");
}

/// Puts and takes running while ZooKeeper restarts twice: every put answered 201 is taken, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takes_lose_nothing_across_zookeeper_restarts() {
    use std::sync::{Arc, Mutex};

    let zk = ZkServer::start();
    let chaos_root = unique_root("take-chaos");
    let mut config = test_config(&zk, &chaos_root);
    config.zookeeper.session_timeout = Duration::from_secs(30);
    let zkq = TestZkq::start_ready(config).await;
    let (confirmed, mut putters) = confirming_putters(&zkq, "q", 4, 150);
    let taken = Arc::new(Mutex::new(Vec::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let mut takers = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (http, url, taken, stop) =
            (zkq.http.clone(), zkq.url("/v1/queues/q/take?wait=1s"), taken.clone(), stop.clone());
        takers.spawn(async move {
            while !stop.is_cancelled() {
                match http.post(&url).send().await {
                    Ok(r) if r.status() == 200 => {
                        let body = String::from_utf8(r.bytes().await.expect("body").to_vec()).expect("utf8");
                        taken.lock().expect("lock").push(body);
                    },
                    _ => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
    }
    restart_zookeeper_during(&zk, &zkq, 2, || taken.lock().expect("lock").len() > 50).await;
    while let Some(r) = putters.join_next().await {
        r.expect("putter");
    }
    await_all_processed(&zk, &chaos_root, "q", &confirmed, &taken).await;
    stop.cancel();
    while takers.join_next().await.is_some() {}
    let taken = taken.lock().expect("lock").clone();
    let unique: HashSet<&String> = taken.iter().collect();
    assert_eq!(unique.len(), taken.len(), "a message was taken twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_look_at_a_deep_queue_after_a_start_knows_the_age_of_its_head() {
    let zk = ZkServer::shared();
    let root = unique_root("first-info");
    let direct = zk_client(zk).await;
    let path = format!("{root}/queues/deep");
    let persistent = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let sequential = zookeeper_client::CreateMode::PersistentSequential.with_acls(zookeeper_client::Acls::anyone_all());
    direct.mkdir(&path, &persistent).await.expect("queue node");
    let body = zkq::envelope::encode([b"old".as_slice()]);
    for _ in 0..500 {
        direct.create(&format!("{path}/queue-"), &body, &sequential).await.expect("message");
    }
    // A fresh zkq that never saw this queue: its first look opens it.
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let info = json(zkq.http.get(zkq.url("/v1/queues/deep")).send().await.expect("info")).await;
    assert_eq!(info["depth"], 500, "{info}");
    assert!(info["oldest_message_age_ms"].as_i64().is_some_and(|age| age >= 0), "the head's age is known: {info}");
}

/// A 204 means empty: a message another sidecar acknowledged before the take arrived is taken
/// by a take that does not wait, every time, although it reaches this sidecar only as a
/// ZooKeeper event. (Each miss would be a consumer that stops early, "drained" but not empty.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_without_wait_sees_every_put_acknowledged_before_it() {
    let zk = ZkServer::shared();
    let root = unique_root("no-false-empty");
    let [taker, producer] = TestZkq::fleet(test_config(zk, &root)).await;
    // The taker's cache is live (it has read the queue once) before the race starts.
    assert_eq!(taker.take("q", "0s").await.status(), 204);
    for i in 0..300 {
        let body = format!("message {i}");
        producer.put_ok("q", body.as_bytes()).await;
        let taken = taker.take_body("q", "0s").await;
        assert_eq!(taken.as_deref(), Some(body.as_bytes()), "put {i} was acknowledged, then the take said empty");
    }
    // And 204 still answers an empty queue at once.
    assert_eq!(taker.take("q", "0s").await.status(), 204);
    taker.stop().await;
    producer.stop().await;
}

/// "Drain until the first 204" takes every message: 16 takers with `wait=0s`, each stopping at
/// its first 204, on a queue another sidecar has just filled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_stops_at_the_first_204_takes_every_message() {
    let zk = ZkServer::shared();
    let root = unique_root("drain-to-204");
    let taker = std::sync::Arc::new(TestZkq::start_ready(test_config(zk, &root)).await);
    let producer = TestZkq::start_ready(test_config(zk, &root)).await;
    assert_eq!(taker.take("q", "0s").await.status(), 204);
    let total = 1000;
    use futures::StreamExt;
    futures::stream::iter(0..total)
        .map(|i| {
            let producer = &producer;
            async move { producer.put_ok("q", format!("m{i}").as_bytes()).await }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let mut drains = Vec::new();
    for _ in 0..16 {
        let taker = taker.clone();
        drains.push(tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(body) = taker.take_body("q", "0s").await {
                got.push(body);
            }
            got
        }));
    }
    let mut taken = Vec::new();
    for drain in drains {
        taken.extend(drain.await.expect("drain"));
    }
    taken.sort();
    taken.dedup();
    assert_eq!(taken.len(), total, "a drain that stops at the first 204 left messages behind");
    producer.stop().await;
    if let Ok(taker) = std::sync::Arc::try_unwrap(taker) {
        taker.stop().await;
    }
}

#[tokio::test]
async fn a_purge_removes_every_message_but_those_a_consumer_holds_and_foreign_nodes() {
    let zk = ZkServer::shared();
    let root = unique_root("purge");
    let zkq = TestZkq::start(test_config(zk, &root)).await;
    let api = zkq.client();
    let messages: Vec<serde_json::Value> = (0..150).map(|i| serde_json::json!({ "text": format!("m{i}") })).collect();
    assert_eq!(api.batch_put("jobs", "", &serde_json::json!({ "messages": messages[..100] })).await.status, 201);
    assert_eq!(api.batch_put("jobs", "", &serde_json::json!({ "messages": messages[100..] })).await.status, 201);
    let held = api.lease("jobs", "wait=5s").await;
    assert_eq!(held.status, 200);
    let direct = zk_client(zk).await;
    let foreign = format!("{root}/queues/jobs/not-a-message");
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    direct.create(&foreign, b"x", &options).await.expect("a foreign node");
    let purged = api.send(reqwest::Method::POST, "/v1/queues/jobs/purge", None).await;
    assert_eq!(purged.status, 200, "{}", purged.text());
    assert_eq!(purged.json(), serde_json::json!({ "queue": "jobs", "removed": 149, "complete": true }));
    let left = children(&direct, &format!("{root}/queues/jobs")).await;
    assert_eq!(left.len(), 2, "the held message and the foreign node: {left:?}");
    assert_eq!(api.take("jobs", "wait=0").await.status, 204, "nothing else to take");
    assert_eq!(api.ack("jobs", &held.receipt).await.status, 204, "the held lease still acks");
    let missing = api.send(reqwest::Method::POST, "/v1/queues/never-made/purge", None).await;
    assert_eq!(missing.status, 404);
}

#[tokio::test]
async fn a_deleted_queue_leaves_nothing_in_zookeeper_and_a_retried_key_stores_anew() {
    let zk = ZkServer::shared();
    let root = unique_root("delete-queue");
    let mut config = test_config(zk, &root);
    declare(&mut config, "declared", QueueKind::Fifo, None, None);
    let zkq = TestZkq::start(config).await;
    let api = zkq.client();
    let messages: Vec<serde_json::Value> = (0..1200).map(|i| serde_json::json!({ "text": format!("m{i}") })).collect();
    for chunk in messages.chunks(100) {
        assert_eq!(api.batch_put("doomed", "", &serde_json::json!({ "messages": chunk })).await.status, 201);
    }
    let keyed = zkq.http.post(zkq.url("/v1/queues/doomed/messages")).header("idempotency-key", "k1").body("once");
    assert_eq!(keyed.send().await.expect("put").status(), 201);
    let held = api.lease("doomed", "wait=5s").await;
    assert_eq!(held.status, 200);

    let deleted = api.send(reqwest::Method::DELETE, "/v1/queues/doomed", None).await;
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    assert_eq!(deleted.json(), serde_json::json!({ "queue": "doomed", "removed": 1201, "complete": true }));
    let direct = zk_client(zk).await;
    let left = children(&direct, &format!("{root}/idempotency")).await;
    assert!(!left.contains(&"doomed".to_owned()), "idempotency/doomed is still there: {left:?}");
    // The queue's node, lock directory and delivery counts' directory stay, empty, so the
    // queue's numbering goes on (and a delete removes only what its incarnation numbered); the
    // node says the queue was deleted.
    for dir in ["queues", "locks", "deliveries"] {
        let left = children(&direct, &format!("{root}/{dir}/doomed")).await;
        assert!(left.is_empty(), "{dir}/doomed still has {left:?}");
    }
    let (mark, _) = direct.get_data(&format!("{root}/queues/doomed")).await.expect("the kept node");
    assert_eq!(mark, br#"{"zkq":"queue deleted"}"#, "the deleted queue's mark");
    assert_eq!(api.info("doomed").await.status, 404, "the queue is gone");
    // Over: 409 `lease_lost` while the queue is still open here, 404 once it closed.
    let stale = api.ack("doomed", &held.receipt).await;
    assert!(matches!(stale.status, 404 | 409), "a lease on a deleted queue is over: {} {}", stale.status, stale.text());
    assert_eq!(api.send(reqwest::Method::DELETE, "/v1/queues/doomed", None).await.status, 404);

    // A put creates it anew, and an idempotency key of the deleted queue stores again.
    let again = zkq.http.post(zkq.url("/v1/queues/doomed/messages")).header("idempotency-key", "k1").body("anew");
    let again = again.send().await.expect("put");
    assert_eq!(again.status(), 201);
    assert!(again.headers().get("zkq-idempotent-replay").is_none(), "a key of the deleted queue replayed");
    assert_eq!(zkq.take_body("doomed", "2s").await.as_deref(), Some(b"anew".as_slice()));

    let declared = api.send(reqwest::Method::DELETE, "/v1/queues/declared", None).await;
    assert_eq!(declared.status, 409);
    assert_eq!(declared.json()["code"], "queue_declared");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attributes_and_a_traceparent_travel_with_a_message_and_curator_sees_the_body_alone() {
    const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let zk = ZkServer::shared();
    let root = unique_root("annex");
    let mut config = test_config(zk, &root);
    declare(&mut config, "bare", QueueKind::Simple, None, None);
    let zkq = TestZkq::start(config).await;
    let api = zkq.client();
    let attributes = serde_json::json!({
        "city": { "type": "String", "value": "Zürich 🚋" },
        "n": { "type": "Number.int", "value": "42" },
        "raw": { "type": "Binary", "value": "AAEC/w==" },
    });
    let put = |queue: &str, body: &'static str, headers: &[(&'static str, String)]| {
        let mut request = zkq.http.post(zkq.url(&format!("/v1/queues/{queue}/messages"))).body(body);
        for (name, value) in headers {
            request = request.header(*name, value.as_str());
        }
        request.send()
    };
    let both = [("zkq-attributes", attributes.to_string()), ("traceparent", TRACE.to_owned())];
    assert_eq!(put("jobs", "one", &both).await.expect("put").status(), 201);
    let taken = zkq.take("jobs", "2s").await;
    assert_eq!(taken.headers()["traceparent"], TRACE);
    let shown: serde_json::Value =
        serde_json::from_slice(taken.headers()["zkq-attributes"].as_bytes()).expect("the header is JSON");
    assert_eq!(shown, attributes, "non-ASCII text crosses the header as \\u escapes");
    assert_eq!(taken.bytes().await.expect("body").as_ref(), b"one");

    // A batch message carries them as fields, and a `?max=` lease answers with them.
    let batch = serde_json::json!({ "messages": [
        { "text": "two", "attributes": attributes, "traceparent": TRACE },
        { "text": "three" },
    ]});
    assert_eq!(api.batch_put("jobs", "", &batch).await.status, 201);
    let leased = api.lease("jobs", "max=2&wait=2s").await;
    let leased = leased.json();
    assert_eq!(leased["messages"][0]["attributes"], attributes);
    assert_eq!(leased["messages"][0]["traceparent"], TRACE);
    assert!(leased["messages"][1].get("attributes").is_none() && leased["messages"][1].get("traceparent").is_none());
    // Requeued, the message keeps them.
    let receipt = leased["messages"][0]["lease"].as_str().expect("a receipt").to_owned();
    assert_eq!(api.nack("jobs", &receipt, "mode=requeue").await.status, 204);
    let again = zkq.take("jobs", "2s").await;
    assert_eq!(again.headers()["traceparent"], TRACE);

    // A Curator consumer of the same queue reads the body alone.
    assert_eq!(put("jobs", "for curator", &both).await.expect("put").status(), 201);
    let path = format!("{root}/queues/jobs");
    let locks = format!("{root}/locks/jobs");
    let consumed = Curator::run(zk, &["consume", "fifo", &path, "1", "30000", "--lock", &locks]).await;
    assert_eq!(consumed.first().map(|line| unhex(line)), Some(b"for curator".to_vec()), "{consumed:?}");

    // Bad ones are refused with what is wrong, and store nothing.
    for (name, value, code) in [
        ("traceparent", "00-abc-def-01", "invalid_parameter"),
        ("traceparent", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "invalid_parameter"),
        ("zkq-attributes", "not json", "invalid_parameter"),
        ("zkq-attributes", r#"{"raw":{"type":"Binary","value":"%%"}}"#, "invalid_parameter"),
        ("zkq-attributes", r#"{"AWS.x":{"type":"String","value":"v"}}"#, "invalid_parameter"),
        ("zkq-attributes", r#"{"d":{"type":"Date","value":"v"}}"#, "invalid_parameter"),
    ] {
        let refused = Answer::of(put("jobs", "bad", &[(name, value.to_owned())]).await.expect("put")).await;
        assert_eq!((refused.status, refused.code.as_str()), (400, code), "{name}: {value}");
    }
    let refused = Answer::of(put("bare", "x", &[("traceparent", TRACE.to_owned())]).await.expect("put")).await;
    assert_eq!((refused.status, refused.code.as_str()), (409, "parameter_not_for_kind"));
    assert_eq!(zkq.take("jobs", "0s").await.status(), 204, "nothing refused was stored");
}

/// A plain fifo queue takes a delivery time as a delay queue does: the message waits, named as a
/// delay queue names it, while the messages put without one are taken; a grouped queue, whose
/// names hold the group, refuses one. Before, a delay on a fifo queue was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_queue_holds_a_delayed_message_back_until_it_is_due() {
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("fifo-delay"));
    declare(&mut config, "f", QueueKind::Fifo, None, None);
    declare(&mut config, "g", QueueKind::Fifo, None, None);
    if let Some(grouped) = config.queues.get_mut("g") {
        grouped.grouped = true;
    }
    let zkq = TestZkq::start_ready(config).await;
    let api = zkq.client();
    let put_at = Instant::now();
    let later = api.put("f", "delay=3s", b"later").await;
    assert_eq!(later.status, 201, "{}", later.text());
    let later_id = later.json()["message_id"].as_str().expect("an id").to_owned();
    assert!(later_id.starts_with("queue-|"), "named as a delay queue names it: {later_id}");
    assert_eq!(api.put("f", "", b"now").await.status, 201);

    let first = api.take("f", "wait=0s").await;
    assert_eq!((first.status, first.body.as_slice()), (200, b"now".as_slice()), "{}", first.text());
    let early = api.take("f", "wait=0s").await;
    assert_eq!(early.status, 204, "not due yet: {}", early.text());
    let due = api.take("f", "wait=20s").await;
    assert_eq!((due.status, due.body.as_slice(), due.id.as_str()), (200, b"later".as_slice(), later_id.as_str()));
    assert!(put_at.elapsed() >= Duration::from_secs(3), "taken after {:?}", put_at.elapsed());

    let grouped = api.put("g", "delay=3s&group=a", b"x").await;
    assert_eq!((grouped.status, grouped.code.as_str()), (409, "parameter_not_for_kind"), "{}", grouped.text());
}

/// A message older than its queue's `retention` is deleted by the sweep and never delivered; one
/// a consumer holds is not deleted under it, and its ack still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_past_retention_are_deleted_but_never_from_under_a_consumer() {
    let zk = ZkServer::shared();
    let root = unique_root("retention");
    let mut config = test_config(zk, &root);
    declare(&mut config, "kept", QueueKind::Fifo, None, None);
    if let Some(queue) = config.queues.get_mut("kept") {
        queue.retention = Some(Duration::from_secs(2));
    }
    let zkq = TestZkq::start_ready(config).await;
    let api = zkq.client();
    assert_eq!(api.put("kept", "", b"held").await.status, 201);
    let held = api.lease("kept", "wait=5s&visibility=60s").await;
    assert_eq!((held.status, held.body.as_slice()), (200, b"held".as_slice()), "{}", held.text());
    let old = api.put("kept", "", b"old").await;
    assert_eq!(old.status, 201);

    let direct = zk_client(zk).await;
    let path = format!("{root}/queues/kept");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = children(&direct, &path).await;
        if left.len() == 1 {
            assert_eq!(left, std::slice::from_ref(&held.id), "the held message stays");
            break;
        }
        assert!(Instant::now() < deadline, "the old message was not deleted: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metrics = zkq.metrics().await;
    assert!(metrics.contains("zkq_messages_past_retention_total{queue=\"kept\"} 1"), "{metrics}");
    assert_eq!(api.take("kept", "wait=0s").await.status, 204, "nothing past retention is delivered");
    assert_eq!(api.ack("kept", &held.receipt).await.status, 204, "the held message's ack works");
    assert_eq!(api.put("kept", "", b"fresh").await.status, 201);
    let fresh = api.take("kept", "wait=5s").await;
    assert_eq!((fresh.status, fresh.body.as_slice()), (200, b"fresh".as_slice()));
}
