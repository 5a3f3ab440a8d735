//! Leases against real ZooKeeper and real Curator: ack, nack, extend, expiry, fencing,
//! crash redelivery, mixed consumers, dead letters.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use zkq::config::{QueueConfig, QueueKind};

use zkq_testkit::*;

struct Leased {
    status: u16,
    id: String,
    receipt: String,
    count: u32,
    body: Vec<u8>,
    headers: reqwest::header::HeaderMap,
}

async fn lease(zkq: &TestZkq, queue: &str, query: &str) -> Leased {
    let response =
        zkq.http.post(zkq.url(&format!("/v1/queues/{queue}/leases?{query}"))).send().await.expect("lease request");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let (id, receipt, count) = (text("zkq-message-id"), text("zkq-lease"), text("zkq-delivery-count"));
    let body = response.bytes().await.expect("body").to_vec();
    Leased { status, id, receipt, count: count.parse().unwrap_or(0), body, headers }
}

async fn ack(zkq: &TestZkq, queue: &str, receipt: &str) -> reqwest::Response {
    zkq.http.delete(zkq.url(&format!("/v1/queues/{queue}/leases/{receipt}"))).send().await.expect("ack")
}

async fn nack(zkq: &TestZkq, queue: &str, receipt: &str, query: &str) -> reqwest::Response {
    let url = zkq.url(&format!("/v1/queues/{queue}/leases/{receipt}/nack?{query}"));
    zkq.http.post(url).send().await.expect("nack")
}

async fn code(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    (status, body["code"].as_str().unwrap_or("").to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_holds_curators_lock_and_ack_removes_message_lock_and_count() {
    let zk = ZkServer::shared();
    let root = unique_root("lease-ack");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    zkq.put_ok("q", b"work").await;
    let leased = lease(&zkq, "q", "visibility=30s").await;
    assert_eq!(leased.status, 200);
    assert_eq!(leased.body, b"work");
    assert_eq!(leased.count, 1);
    assert_eq!(leased.receipt.len(), 48);
    let expires: i64 = leased.headers["zkq-lease-expires-at"].to_str().expect("ascii").parse().expect("ms");
    assert!(expires > zkq::now_epoch_ms() + 25_000);

    let direct = zk_client(zk).await;
    let lock = format!("{root}/locks/q/{}", leased.id);
    let stat = direct.check_stat(&lock).await.expect("stat").expect("Curator's lock node exists");
    assert_ne!(stat.ephemeral_owner, 0, "the lock is ephemeral");
    let info: serde_json::Value =
        zkq.http.get(zkq.url("/v1/queues/q")).send().await.expect("info").json().await.expect("json");
    assert_eq!(info["in_flight"], 1);
    // A plain take never removes a message someone holds.
    assert_eq!(zkq.take_body("q", "0").await, None);

    assert_eq!(ack(&zkq, "q", &leased.receipt).await.status(), 204);
    assert!(children(&direct, &format!("{root}/queues/q")).await.is_empty(), "message removed");
    assert!(children(&direct, &format!("{root}/locks/q")).await.is_empty(), "lock removed");
    assert!(children(&direct, &format!("{root}/deliveries/q")).await.is_empty(), "delivery count removed");
    // A second ack (a client retrying an answer it did not get) answers as the first did.
    assert_eq!(ack(&zkq, "q", &leased.receipt).await.status(), 204, "a repeated ack");
    let extend = zkq.url(&format!("/v1/queues/q/leases/{}/extend", leased.receipt));
    assert_eq!(code(zkq.http.post(extend).send().await.expect("extend")).await, (409, "lease_lost".to_owned()));
    assert_eq!(code(ack(&zkq, "q", "not-a-receipt").await).await, (404, "lease_not_found".to_owned()));
    let session = zkq.running.as_ref().expect("running").session.status().session_id;
    let unknown = format!("{:016x}{:032x}", session as u64, 12345u128);
    assert_eq!(code(ack(&zkq, "q", &unknown).await).await, (404, "lease_not_found".to_owned()));
    // Well-formed receipts this zkq never issued (another session, all zeros) are not found either.
    for never_issued in ["0".repeat(48), format!("{:016x}{:032x}", (session as u64) ^ 1, 12345u128)] {
        assert_eq!(code(ack(&zkq, "q", &never_issued).await).await, (404, "lease_not_found".to_owned()));
        let extend = zkq.http.post(zkq.url(&format!("/v1/queues/q/leases/{never_issued}/extend"))).send();
        assert_eq!(code(extend.await.expect("extend")).await, (404, "lease_not_found".to_owned()));
    }
    let metrics = zkq.metrics().await;
    assert!(metrics.contains("zkq_messages_leased_total{queue=\"q\"} 1"), "{metrics}");
    assert!(metrics.contains("zkq_messages_acked_total{queue=\"q\"} 1"));
    assert!(metrics.contains("zkq_leases_in_flight{queue=\"q\"} 0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_modes_requeue_keeping_kind_fields_delete_and_keep() {
    let zk = ZkServer::shared();
    let root = unique_root("nack");
    let mut config = test_config(zk, &root);
    declare(&mut config, "p", QueueKind::Priority, None, None);
    declare(&mut config, "i", QueueKind::Id, None, None);
    let zkq = TestZkq::start_ready(config).await;

    // requeue keeps the priority (Curator drops it) and counts the delivery.
    for (priority, body) in [(-5, "urgent"), (9, "later")] {
        let url = zkq.url(&format!("/v1/queues/p/messages?priority={priority}"));
        assert_eq!(zkq.http.post(url).body(body).send().await.expect("put").status(), 201);
    }
    let first = lease(&zkq, "p", "").await;
    assert_eq!(first.body, b"urgent");
    assert_eq!(nack(&zkq, "p", &first.receipt, "mode=requeue").await.status(), 204);
    let again = lease(&zkq, "p", "").await;
    assert_eq!(again.body, b"urgent", "still first: priority kept");
    assert_ne!(again.id, first.id, "re-created at the tail with a new sequence");
    assert!(again.id.starts_with("queue-0FFFFFFFB"), "{}", again.id);
    assert_eq!(again.headers["zkq-priority"], "-5");
    assert_eq!(again.count, 2, "delivery count survives the requeue");
    assert_eq!(code(ack(&zkq, "p", &first.receipt).await).await.0, 409, "a nacked receipt is spent");

    // delete removes it.
    assert_eq!(nack(&zkq, "p", &again.receipt, "mode=delete").await.status(), 204);
    let next = lease(&zkq, "p", "").await;
    assert_eq!(next.body, b"later");
    // keep releases the lock; the message keeps its place.
    assert_eq!(nack(&zkq, "p", &next.receipt, "mode=keep").await.status(), 204);
    let kept = lease(&zkq, "p", "").await;
    assert_eq!((kept.id.as_str(), kept.count), (next.id.as_str(), 2));
    assert_eq!(ack(&zkq, "p", &kept.receipt).await.status(), 204);

    // requeue keeps the id.
    let url = zkq.url("/v1/queues/i/messages?id=order-7");
    assert_eq!(zkq.http.post(url).body("x").send().await.expect("put").status(), 201);
    let first = lease(&zkq, "i", "").await;
    assert_eq!(nack(&zkq, "i", &first.receipt, "").await.status(), 204, "requeue is the default");
    let again = lease(&zkq, "i", "").await;
    assert_eq!(again.headers["zkq-id"], "order-7");
    assert_ne!(again.id, first.id);
    // delay postpones the next delivery.
    assert_eq!(nack(&zkq, "i", &again.receipt, "mode=keep&delay=1s").await.status(), 204);
    assert_eq!(lease(&zkq, "i", "").await.status, 204, "invisible during the delay");
    let started = Instant::now();
    let later = lease(&zkq, "i", "wait=10s").await;
    assert_eq!(later.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(500), "{:?}", started.elapsed());
    let metrics = zkq.metrics().await;
    assert!(metrics.contains("zkq_messages_nacked_total{mode=\"requeue\",queue=\"p\"} 1"), "{metrics}");
    assert!(metrics.contains("zkq_messages_nacked_total{mode=\"delete\",queue=\"p\"} 1"));
    assert!(metrics.contains("zkq_messages_nacked_total{mode=\"keep\",queue=\"p\"} 1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_redelivers_in_place_and_extend_keeps_it() {
    let zk = ZkServer::shared();
    let zkq = TestZkq::start_ready(test_config(zk, &unique_root("expiry"))).await;
    zkq.put_ok("q", b"first").await;
    zkq.put_ok("q", b"second").await;
    let held = lease(&zkq, "q", "visibility=2s").await;
    assert_eq!(held.body, b"first");
    // Neither acked nor extended: after 2 s it is delivered again, still ahead of "second".
    let again = lease(&zkq, "q", "wait=10s").await;
    assert_eq!(again.body, b"second", "while leased, the next one is handed out");
    let redelivered = lease(&zkq, "q", "wait=10s&visibility=1s").await;
    assert_eq!((redelivered.body.as_slice(), redelivered.count), (b"first".as_slice(), 2));
    assert_eq!(code(ack(&zkq, "q", &held.receipt).await).await, (409, "lease_lost".to_owned()));
    assert!(zkq.metrics().await.contains("zkq_messages_expired_total{queue=\"q\"} 1"));

    // Extending keeps it past the visibility it was leased with.
    let leased_until: i64 = redelivered.headers["zkq-lease-expires-at"].to_str().expect("ms").parse().expect("ms");
    for _ in 0..2 {
        let url = zkq.url(&format!("/v1/queues/q/leases/{}/extend?visibility=20s", redelivered.receipt));
        let response = zkq.http.post(url).send().await.expect("extend");
        assert_eq!(response.status(), 200);
        let body: serde_json::Value = response.json().await.expect("json");
        assert!(body["expires_at"].as_i64().expect("ms") > leased_until + 10_000);
    }
    eventually(Duration::from_secs(10), "the lease's first visibility has passed", || {
        std::future::ready(zkq::now_epoch_ms() > leased_until + 500)
    })
    .await;
    assert_eq!(lease(&zkq, "q", "").await.status, 204, "still held past its first visibility");
    assert_eq!(ack(&zkq, "q", &redelivered.receipt).await.status(), 204);
    assert_eq!(ack(&zkq, "q", &again.receipt).await.status(), 204);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_are_refused_after_the_session_is_lost_and_the_message_comes_back() {
    let zk = ZkServer::start();
    let config = test_config(&zk, &unique_root("fenced"));
    let session_timeout = config.zookeeper.session_timeout;
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("q", b"fenced").await;
    let held = lease(&zkq, "q", "visibility=10m").await;
    assert_eq!(held.status, 200);
    let before = zkq.running.as_ref().expect("running").session.status();
    zk.pause();
    tokio::time::sleep(session_timeout + Duration::from_secs(3)).await;
    zk.resume();
    eventually(Duration::from_secs(60), "a new session", || async {
        zkq.running.as_ref().expect("running").session.status().generation > before.generation
    })
    .await;
    zkq.wait_ready().await;
    assert_eq!(code(ack(&zkq, "q", &held.receipt).await).await, (409, "lease_lost".to_owned()));
    let extend = zkq.url(&format!("/v1/queues/q/leases/{}/extend", held.receipt));
    assert_eq!(code(zkq.http.post(extend).send().await.expect("extend")).await.0, 409);
    let again = lease(&zkq, "q", "wait=10s").await;
    assert_eq!((again.body.as_slice(), again.count), (b"fenced".as_slice(), 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_messages_come_back_after_zkq_is_killed() {
    let zk = ZkServer::shared();
    let root = unique_root("kill9");
    let child = ChildZkq::start(zk, &root, &[("ZKQ__ZOOKEEPER__SESSION_TIMEOUT", "4s")]).await;
    let (http, api) = (reqwest::Client::new(), child.api.clone());
    for i in 0..3 {
        let response = http.post(format!("{api}/v1/queues/q/messages")).body(format!("m{i}")).send().await;
        assert_eq!(response.expect("put").status(), 201);
    }
    for _ in 0..3 {
        let response = http.post(format!("{api}/v1/queues/q/leases?visibility=10m")).send().await;
        assert_eq!(response.expect("lease").status(), 200);
    }
    child.signal("KILL");
    child.wait().await;

    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let mut got = Vec::new();
    let started = Instant::now();
    while got.len() < 3 {
        let leased = lease(&zkq, "q", "wait=20s").await;
        assert_eq!(leased.status, 200, "redelivered within the session timeout");
        assert_eq!(leased.count, 2, "the delivery count survived the crash");
        got.push(String::from_utf8(leased.body).expect("utf8"));
        assert_eq!(ack(&zkq, "q", &leased.receipt).await.status(), 204);
    }
    got.sort();
    assert_eq!(got, ["m0", "m1", "m2"]);
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zkq_leases_and_curator_lock_safe_consumers_process_each_message_once() {
    let zk = ZkServer::shared();
    let root = unique_root("mixed");
    let path = format!("{root}/app/jobs");
    let locks = format!("{root}/app/locks");
    let mut config = test_config(zk, &root);
    declare(&mut config, "jobs", QueueKind::Fifo, Some(&path), Some(&locks));
    let zkq = TestZkq::start_ready(config).await;
    let total = 2000;
    let mut puts = tokio::task::JoinSet::new();
    for chunk in 0..16 {
        let (http, url) = (zkq.http.clone(), zkq.url("/v1/queues/jobs/messages"));
        puts.spawn(async move {
            for i in (chunk..total).step_by(16) {
                assert_eq!(http.post(&url).body(format!("job-{i}")).send().await.expect("put").status(), 201);
            }
        });
    }
    while let Some(r) = puts.join_next().await {
        r.expect("putter");
    }
    let curator = Curator::spawn(zk, &["consume", "fifo", &path, &total.to_string(), "10000", "--lock", &locks]);
    // Start zkq's consumers once Curator is consuming (its JVM takes a moment to start).
    let (first, curator) =
        tokio::task::spawn_blocking(move || (curator.next_line(Duration::from_secs(30)), curator)).await.expect("join");
    let first = first.expect("Curator consumed a first message");
    let mut consumers = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let (http, base) = (zkq.http.clone(), zkq.api.clone());
        consumers.spawn(async move {
            let mut done = Vec::new();
            loop {
                let response = http.post(format!("{base}/v1/queues/jobs/leases?wait=2s")).send().await.expect("lease");
                if response.status() == 204 {
                    return done;
                }
                assert_eq!(response.status(), 200);
                let receipt = response.headers()["zkq-lease"].to_str().expect("ascii").to_owned();
                let body = String::from_utf8(response.bytes().await.expect("body").to_vec()).expect("utf8");
                let acked = http.delete(format!("{base}/v1/queues/jobs/leases/{receipt}")).send().await.expect("ack");
                assert_eq!(acked.status(), 204);
                done.push(body);
            }
        });
    }
    let mut processed: HashMap<String, u32> = HashMap::new();
    let mut by_zkq = 0;
    while let Some(done) = consumers.join_next().await {
        for body in done.expect("consumer") {
            by_zkq += 1;
            *processed.entry(body).or_default() += 1;
        }
    }
    let mut lines = vec![first];
    lines.extend(curator.finish().await);
    let mut by_curator = 0;
    for line in lines.iter().filter(|l| !l.starts_with("DONE")) {
        by_curator += 1;
        let body = String::from_utf8(unhex(line)).expect("utf8");
        *processed.entry(body).or_default() += 1;
    }
    let twice: Vec<_> = processed.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "processed more than once: {twice:?}");
    assert_eq!(processed.len(), total, "every message processed (zkq {by_zkq}, Curator {by_curator})");
    assert!(by_zkq > 0 && by_curator > 0, "both consumers took part (zkq {by_zkq}, Curator {by_curator})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_move_to_the_dead_letter_queue_after_max_deliveries() {
    let zk = ZkServer::shared();
    let root = unique_root("dlq");
    let mut config = test_config(zk, &root);
    config.queues.insert(
        "poison".parse().expect("a valid name"),
        QueueConfig {
            kind: QueueKind::Fifo,
            path: None,
            lock_path: None,
            max_items: None,
            max_deliveries: Some(3),
            dead_letter: Some("poison-dlq".parse().expect("a valid name")),
            push: None,
            idempotency_window: None,
            grouped: false,
            sqs_binary_bodies: None,
            retention: None,
        },
    );
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("poison", b"bad apple").await;
    for delivery in 1..=3 {
        let leased = lease(&zkq, "poison", "").await;
        assert_eq!((leased.status, leased.count), (200, delivery));
        assert_eq!(nack(&zkq, "poison", &leased.receipt, "mode=keep").await.status(), 204);
    }
    assert_eq!(lease(&zkq, "poison", "").await.status, 204, "the 4th delivery moves it instead");
    assert!(zkq.metrics().await.contains("zkq_messages_dead_lettered_total{queue=\"poison\"} 1"));
    // Undecodable nodes go there too.
    let direct = zk_client(zk).await;
    let persistent = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    direct.create(&format!("{root}/queues/poison/queue-0000000099"), b"raw", &persistent).await.expect("raw node");
    // Once zkq sees the node (its watch fires), a lease attempt moves it and answers 204.
    eventually(Duration::from_secs(20), "the undecodable node moved to the dead-letter queue", || async {
        assert_eq!(lease(&zkq, "poison", "wait=1s").await.status, 204);
        children(&direct, &format!("{root}/queues/poison")).await.is_empty()
    })
    .await;
    // The dead-letter queue holds both, readable by Curator.
    let dlq = format!("{root}/queues/poison-dlq");
    let lines = Curator::run(zk, &["consume", "fifo", &dlq, "2", "15000"]).await;
    assert_eq!(lines, [hex(b"bad apple"), hex(b"raw"), "DONE 2".to_owned()]);
    assert!(children(&direct, &format!("{root}/deliveries/poison")).await.is_empty(), "no count left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simple_queues_cannot_lease() {
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("simple-lease"));
    declare(&mut config, "s", QueueKind::Simple, None, None);
    let zkq = TestZkq::start_ready(config).await;
    let response = zkq.http.post(zkq.url("/v1/queues/s/leases")).send().await.expect("lease");
    assert_eq!(code(response).await, (409, "parameter_not_for_kind".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_counts_of_messages_consumed_elsewhere_are_swept() {
    let zk = ZkServer::shared();
    let root = unique_root("sweep");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    zkq.put_ok("q", b"counted").await;
    let leased = lease(&zkq, "q", "").await;
    assert_eq!(nack(&zkq, "q", &leased.receipt, "mode=keep").await.status(), 204);
    zkq.stop().await;
    let direct = zk_client(zk).await;
    assert_eq!(children(&direct, &format!("{root}/deliveries/q")).await.len(), 1, "a count was kept");
    // Consumed by someone who knows nothing of counts (a Curator consumer).
    let lines = Curator::run(zk, &["consume", "fifo", &format!("{root}/queues/q"), "1", "15000"]).await;
    assert_eq!(lines, [hex(b"counted"), "DONE 1".to_owned()]);
    // The next zkq to open the queue sweeps the orphaned count.
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    assert_eq!(lease(&zkq, "q", "").await.status, 204);
    eventually(Duration::from_secs(10), "orphaned count removed", || async {
        children(&direct, &format!("{root}/deliveries/q")).await.is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_hand_out_curators_put_multi_items_one_by_one() {
    let zk = ZkServer::shared();
    let root = unique_root("lease-multi");
    let path = format!("{root}/app/q");
    let mut config = test_config(zk, &root);
    declare(&mut config, "q", QueueKind::Fifo, Some(&path), Some(&format!("{root}/app/locks")));
    Curator::run(zk, &["putmulti", "fifo", &path, "61", "62", "63"]).await;
    let zkq = TestZkq::start_ready(config).await;
    let mut got = Vec::new();
    for _ in 0..3 {
        let leased = lease(&zkq, "q", "").await;
        assert_eq!(leased.status, 200);
        got.push(hex(&leased.body));
        assert_eq!(ack(&zkq, "q", &leased.receipt).await.status(), 204);
    }
    assert_eq!(got, ["61", "62", "63"], "in order, each once");
    assert_eq!(lease(&zkq, "q", "").await.status, 204);
    let direct = zk_client(zk).await;
    assert!(children(&direct, &path).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_delete_of_a_put_multi_item_offers_the_remaining_items_at_once() {
    let zk = ZkServer::shared();
    let root = unique_root("lease-multi-nack");
    let path = format!("{root}/app/q");
    let mut config = test_config(zk, &root);
    declare(&mut config, "q", QueueKind::Fifo, Some(&path), Some(&format!("{root}/app/locks")));
    Curator::run(zk, &["putmulti", "fifo", &path, "61", "62", "63"]).await;
    let zkq = TestZkq::start_ready(config).await;
    let leased = lease(&zkq, "q", "").await;
    assert_eq!((leased.status, hex(&leased.body)), (200, "61".to_owned()));
    assert_eq!(nack(&zkq, "q", &leased.receipt, "mode=delete").await.status(), 204);
    // The node still holds the other two items: they are delivered now, in order, without
    // waiting for anything else to change in the queue.
    assert_eq!(zkq.take_body("q", "0s").await.map(|b| hex(&b)), Some("62".to_owned()));
    assert_eq!(zkq.take_body("q", "0s").await.map(|b| hex(&b)), Some("63".to_owned()));
    assert_eq!(zkq.take_body("q", "0s").await, None);
    let info: serde_json::Value =
        zkq.http.get(zkq.url("/v1/queues/q")).send().await.expect("info").json().await.expect("json");
    assert_eq!((info["depth"].as_i64(), info["in_flight"].as_i64()), (Some(0), Some(0)), "{info}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_with_delay_on_a_delay_queue_moves_the_delivery_time() {
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("requeue-delay"));
    declare(&mut config, "d", QueueKind::Delay, None, None);
    let zkq = TestZkq::start_ready(config).await;
    let url = zkq.url("/v1/queues/d/messages?deliver_at=1000");
    assert_eq!(zkq.http.post(url).body("retry me").send().await.expect("put").status(), 201);
    let first = lease(&zkq, "d", "").await;
    assert_eq!(first.headers["zkq-deliver-at"], "1000");
    let nacked_at = zkq::now_epoch_ms();
    assert_eq!(nack(&zkq, "d", &first.receipt, "mode=requeue&delay=1s").await.status(), 204);
    assert_eq!(lease(&zkq, "d", "").await.status, 204, "not due yet");
    let again = lease(&zkq, "d", "wait=10s").await;
    assert_eq!((again.status, again.body.as_slice(), again.count), (200, b"retry me".as_slice(), 2));
    let deliver_at: i64 = again.headers["zkq-deliver-at"].to_str().expect("ascii").parse().expect("ms");
    assert!(deliver_at >= nacked_at + 1000, "the new name carries the later time");
    assert!(zkq::now_epoch_ms() >= deliver_at);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_survive_a_zookeeper_restart_that_keeps_the_session() {
    let zk = ZkServer::start();
    let mut config = test_config(&zk, &unique_root("lease-restart"));
    config.zookeeper.session_timeout = Duration::from_secs(20);
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("q", b"kept").await;
    let held = lease(&zkq, "q", "visibility=5m").await;
    assert_eq!(held.status, 200);
    zk.stop();
    let (status, body) = code(ack(&zkq, "q", &held.receipt).await).await;
    assert!(status == 503 || status == 504, "no ZooKeeper: {status} {body}");
    zk.restart();
    zkq.wait_ready().await;
    // SUSPENDED then RECONNECTED: the same session, so the lock and the lease are still ours.
    assert_eq!(ack(&zkq, "q", &held.receipt).await.status(), 204);
    assert_eq!(lease(&zkq, "q", "").await.status, 204, "acked once, gone");
}

/// Puts and lease+ack consumers running while ZooKeeper restarts twice: every put answered 201 is
/// processed, and (the session surviving the restarts) none is processed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_or_doubled_across_zookeeper_restarts() {
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};

    let zk = ZkServer::start();
    let chaos_root = unique_root("chaos");
    let mut config = test_config(&zk, &chaos_root);
    config.zookeeper.session_timeout = Duration::from_secs(30);
    config.take.max_wait = Duration::from_secs(5);
    let zkq = TestZkq::start_ready(config).await;
    let (confirmed, mut putters) = confirming_putters(&zkq, "q", 4, 150);
    let processed = Arc::new(Mutex::new(Vec::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let mut consumers = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (http, base, processed, stop) = (zkq.http.clone(), zkq.api.clone(), processed.clone(), stop.clone());
        consumers.spawn(async move {
            while !stop.is_cancelled() {
                let Ok(response) = http.post(format!("{base}/v1/queues/q/leases?wait=1s")).send().await else {
                    continue;
                };
                if response.status() != 200 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                let receipt = response.headers()["zkq-lease"].to_str().expect("ascii").to_owned();
                let body = String::from_utf8(response.bytes().await.expect("body").to_vec()).expect("utf8");
                // Ack until it is done: a 503/504 keeps the lease, so the same receipt is retried.
                loop {
                    let acked = http.delete(format!("{base}/v1/queues/q/leases/{receipt}")).send().await;
                    match acked.map(|r| r.status().as_u16()) {
                        Ok(204) => {
                            processed.lock().expect("lock").push(body);
                            break;
                        },
                        Ok(409) => break, // lost: it will be delivered again
                        _ => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
            }
        });
    }
    restart_zookeeper_during(&zk, &zkq, 2, || processed.lock().expect("lock").len() > 50).await;
    while let Some(r) = putters.join_next().await {
        r.expect("putter");
    }
    await_all_processed(&zk, &chaos_root, "q", &confirmed, &processed).await;
    stop.cancel();
    while consumers.join_next().await.is_some() {}
    let processed = processed.lock().expect("lock").clone();
    let unique: HashSet<&String> = processed.iter().collect();
    assert_eq!(unique.len(), processed.len(), "a message was processed twice");
    let confirmed = confirmed.lock().expect("lock").len();
    assert!(confirmed > 500, "most puts were confirmed: {confirmed}");
}

/// `lease.max_per_queue` is a hard bound: long-polls that all arrived while no lease was out
/// cannot together lease more than it allows once messages come; the others answer 429
/// `too_many_leases` (each counts against the bound while it claims, not only when it arrives).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_per_queue_holds_for_long_polls_that_arrived_together() {
    const POLLS: usize = 6;
    let zk = ZkServer::shared();
    let root = unique_root("lease-bound");
    let mut config = test_config(zk, &root);
    config.lease.max_per_queue = 2;
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("q", b"warm-up").await;
    assert_eq!(zkq.take_body("q", "5s").await.as_deref(), Some(&b"warm-up"[..]), "the queue exists, empty");
    let polls: Vec<_> = (0..POLLS)
        .map(|_| {
            let (http, url) = (zkq.http.clone(), zkq.url("/v1/queues/q/leases?wait=20s&visibility=60s"));
            tokio::spawn(async move { http.post(url).send().await.expect("lease").status().as_u16() })
        })
        .collect();
    eventually(Duration::from_secs(30), "every long-poll waits", || async {
        metric_value(&zkq.metrics().await, "zkq_waiting_takers{queue=\"q\"}") == Some(POLLS as f64)
    })
    .await;
    for i in 0..POLLS {
        zkq.put_ok("q", format!("m{i}").as_bytes()).await;
    }
    let mut statuses = Vec::new();
    for poll in polls {
        statuses.push(poll.await.expect("join"));
    }
    statuses.sort_unstable();
    let leased = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(leased, 2, "at most lease.max_per_queue leases: {statuses:?}");
    assert!(statuses.iter().all(|s| *s == 200 || *s == 429), "the others answer 429: {statuses:?}");
    assert_eq!(metric_value(&zkq.metrics().await, "zkq_leases_in_flight{queue=\"q\"}"), Some(2.0));
    zkq.stop().await;
}

/// Fencing tokens: every lease carries one (the `zkq-fencing-token` header; the `fencing_token` of
/// each entry of a `?max=` answer), larger than that of every earlier lease, whichever zkq granted
/// it: a redelivery of the same message, another message, each message of one `?max=` answer. A
/// token is the claim's zxid × 1024 plus the message's place in that claim, so the message's
/// lock, created by the claim, tells the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lease_carries_a_fencing_token_larger_than_every_earlier_one() {
    let zk = ZkServer::shared();
    let root = unique_root("fencing");
    let [a, b] = TestZkq::fleet(test_config(zk, &root)).await;
    let direct = zk_client(zk).await;
    a.put_ok("q", b"m0").await;
    let lock_czxid = |id: String| {
        let direct = &direct;
        let path = format!("{root}/locks/q/{id}");
        async move { direct.get_data(&path).await.expect("the lease's lock").1.czxid }
    };

    let first = a.client().lease("q", "wait=5s&visibility=60s").await;
    assert_eq!(first.status, 200);
    let first_token = first.fencing_token.expect("a lease carries zkq-fencing-token");
    let czxid = u64::try_from(lock_czxid(first.id.clone()).await).expect("a zxid is positive");
    assert_eq!(first_token, czxid * 1024, "the claim's zxid, first place");

    // The same message again, after a nack that keeps its place, by the other zkq (the only
    // message: in a fleet each sidecar serves the messages it owns first).
    assert_eq!(a.client().nack("q", &first.receipt, "mode=keep").await.status, 204);
    let again = b.client().lease("q", "wait=5s&visibility=60s").await;
    assert_eq!((again.status, again.id.as_str()), (200, first.id.as_str()), "the kept message comes first");
    let again_token = again.fencing_token.expect("token");
    assert!(again_token > first_token, "a redelivery's token {again_token} is larger than {first_token}");
    for i in 1..5 {
        a.put_ok("q", format!("m{i}").as_bytes()).await;
    }

    // A `?max=` lease: each entry has its own token, increasing in the answer, all larger.
    let many = a.client().lease("q", "max=10&wait=5s&visibility=60s").await;
    assert_eq!(many.status, 200);
    let entries = many.json()["messages"].as_array().cloned().expect("messages");
    assert_eq!(entries.len(), 4, "{entries:?}");
    let tokens: Vec<u64> = entries
        .iter()
        .map(|entry| entry["fencing_token"].as_str().expect("a string").parse().expect("decimal"))
        .collect();
    let mut previous = again_token;
    for token in &tokens {
        assert!(*token > previous, "tokens grow: {again_token} then {tokens:?}");
        previous = *token;
    }
    // The entries after the first were claimed together: one zxid, consecutive places.
    let second_id = entries[1]["message_id"].as_str().expect("id").to_owned();
    let shared = u64::try_from(lock_czxid(second_id).await).expect("positive");
    assert_eq!(tokens[1..], [shared * 1024, shared * 1024 + 1, shared * 1024 + 2]);
}
