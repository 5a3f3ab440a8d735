//! Bounds of claims: claim markers judged by ZooKeeper's clock and settlements that stop before
//! a missing marker stops proving anything.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use zkq::config::Config;

use zkq_testkit::proxy::{Fault, ZkProxy, op};
use zkq_testkit::*;

/// A generous bound for anything that should happen "soon" on a loaded 2-core machine.
const SOON: Duration = Duration::from_secs(30);

fn epoch_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_millis() as i64
}

/// A configuration whose claim markers are stale after `age` (and whose requests time out
/// after a second, so that `age` may be short).
fn short_markers(zk: &(impl ConnectTarget + ?Sized), root: &str, age: Duration) -> Config {
    let mut config = test_config(zk, root);
    config.zookeeper.request_timeout = Duration::from_secs(1);
    config.zookeeper.session_timeout = Duration::from_secs(30);
    config.take.claim_marker_age = age;
    config
}

async fn node_exists(client: &zookeeper_client::Client, path: &str) -> bool {
    client.check_stat(path).await.expect("exists").is_some()
}

/// A marker whose creator's clock ran two hours behind (the time in its name is two hours old)
/// but that ZooKeeper created just now is not stale: the sweep judges its `ctime`. Once it is
/// older than the marker age by ZooKeeper's clock, it is swept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_named_two_hours_ago_but_created_now_is_not_swept_until_zookeeper_says_it_is_old() {
    let zk = ZkServer::shared();
    let root = unique_root("claims-skew");
    let direct = zk_client(zk).await;
    let persistent = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    direct.create(&root, &[], &persistent).await.expect("root");
    let dir = format!("{root}/claims");
    direct.create(&dir, &[], &persistent).await.expect("claims dir");
    let marker = format!("{dir}/c-{}-00000000000000ab-0", epoch_ms() - 2 * 3600 * 1000);
    direct.create(&marker, &[], &persistent).await.expect("marker");

    // The default age (an hour): the sweep at start looks at the marker (it writes the marker
    // directory to learn ZooKeeper's time) and keeps it.
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    eventually(SOON, "the sweep at start ran", || async {
        let version = direct.check_stat(&dir).await.expect("exists").map_or(0, |stat| stat.version);
        version >= 1 || !node_exists(&direct, &marker).await
    })
    .await;
    assert!(node_exists(&direct, &marker).await, "a marker ZooKeeper created just now was swept as stale");
    zkq.stop().await;

    // An age of two seconds: by ZooKeeper's clock it becomes stale, and is swept.
    let zkq = TestZkq::start_ready(short_markers(zk, &root, Duration::from_secs(2))).await;
    eventually(SOON, "the marker, two seconds old by ZooKeeper's clock, is swept", || async {
        !node_exists(&direct, &marker).await
    })
    .await;
    zkq.stop().await;
}

/// A put-back (of a message whose taker left) whose answer was lost, while zkq cannot reach
/// ZooKeeper for longer than the marker age: another zkq sweeps its marker meanwhile. The
/// put-back applied; zkq must not read the swept marker as "not applied" and store the message
/// a second time. It gives up, and counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_back_unsettled_past_the_marker_age_is_given_up_and_never_stored_twice() {
    let zk = ZkServer::shared();
    let root = unique_root("claims-putback");
    // Long enough that the held claim (its client leaving, zkq noticing) is settled well within
    // it on a loaded machine; short enough to be swept within the test's patience.
    let age = Duration::from_secs(10);
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(short_markers(&proxy, &root, age)).await;
    let b = TestZkq::start_ready(short_markers(zk, &root, age)).await;
    let direct = zk_client(zk).await;
    let queue = format!("{root}/queues/q");
    a.put_ok("q", b"M").await;

    // The take's claim is held at the proxy while its client leaves.
    let held = proxy.arm(&[op::MULTI], Fault::Hold);
    let request = a.http.post(a.url("/v1/queues/q/take?wait=5s"));
    let client = tokio::spawn(async move { request.send().await });
    tokio::time::timeout(SOON, held.held()).await.expect("the take's claim reached the proxy");
    client.abort();
    let _ = client.await;
    let series = "zkq_http_requests_total{method=\"POST\",route=\"/v1/queues/{queue}/take\",status=\"499\"}";
    eventually(SOON, "zkq saw the client leave", || async {
        metric_value(&a.registered_metrics(), series).unwrap_or(0.0) >= 1.0
    })
    .await;
    // The claim applies; the message is put back, and that answer is lost; no reconnection.
    // Aimed at the put-back's create of a sequential `queue-` node (its path ends there, and the
    // length of its data follows, a zero byte first): not the claim's marker delete, and not a
    // claim sent again after a slow machine let the held connection time out (its delete names
    // the whole node, `queue-0000000000`).
    let needle = format!("{queue}/queue-\u{0}");
    let put_back = proxy.arm_containing_then_refuse(&[op::MULTI], &needle, Fault::DropAnswer);
    held.release_deliver();
    tokio::time::timeout(SOON, put_back.fired()).await.expect("the put-back reached ZooKeeper");
    assert_eq!(children(&direct, &queue).await.len(), 1, "the dropped answer was the put-back's, which applied");

    // The other zkq sweeps every marker once ZooKeeper says it is older than the age.
    eventually(SOON, "the markers are swept", || async {
        children(&direct, &format!("{root}/claims")).await.is_empty()
    })
    .await;
    proxy.refuse(false);
    let given_up = "zkq_settlements_given_up_total{queue=\"q\"}";
    eventually(SOON, "the put-back is settled or given up", || async {
        metric_value(&a.metrics().await, given_up).unwrap_or(0.0) >= 1.0 || children(&direct, &queue).await.len() > 1
    })
    .await;
    assert_eq!(children(&direct, &queue).await.len(), 1, "the message was stored twice");
    assert_eq!(metric_value(&a.metrics().await, given_up), Some(1.0));
    a.stop().await;
    b.stop().await;
}

/// Leases one message from `zkq` and answers its delivery count.
async fn delivery_count_of_next_lease(zkq: &TestZkq, queue: &str) -> String {
    let response = zkq
        .http
        .post(zkq.url(&format!("/v1/queues/{queue}/leases?wait=5s&visibility=60s")))
        .send()
        .await
        .expect("lease");
    assert_eq!(response.status().as_u16(), 200, "lease");
    response.headers()["zkq-delivery-count"].to_str().expect("ascii").to_owned()
}

/// A lease whose client left while its claim was in flight: the claim applies and is released,
/// and the message, which no client received, is not counted as delivered: the next lease
/// hands it out as its first delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_client_left_before_it_was_handed_out_counts_no_delivery() {
    let zk = ZkServer::shared();
    let root = unique_root("claims-abandoned-lease");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let mut config = test_config(&proxy, &root);
    config.zookeeper.session_timeout = Duration::from_secs(20);
    let a = TestZkq::start_ready(config).await;
    let direct = zk_client(zk).await;
    a.put_ok("q", b"M").await;

    let held = proxy.arm(&[op::MULTI], Fault::Hold);
    let request = a.http.post(a.url("/v1/queues/q/leases?wait=5s&visibility=60s"));
    let client = tokio::spawn(async move { request.send().await });
    tokio::time::timeout(SOON, held.held()).await.expect("the lease's claim reached the proxy");
    client.abort();
    let _ = client.await;
    let series = "zkq_http_requests_total{method=\"POST\",route=\"/v1/queues/{queue}/leases\",status=\"499\"}";
    eventually(SOON, "zkq saw the client leave", || async {
        metric_value(&a.registered_metrics(), series).unwrap_or(0.0) >= 1.0
    })
    .await;
    held.release_deliver();
    // The claim applied (and was booked), then its lock was released.
    eventually(SOON, "the claim applied and its lock was released", || async {
        metric_value(&a.metrics().await, "zkq_messages_leased_total{queue=\"q\"}").unwrap_or(0.0) >= 1.0
            && children(&direct, &format!("{root}/locks/q")).await.is_empty()
    })
    .await;
    assert_eq!(delivery_count_of_next_lease(&a, "q").await, "1", "a lease no client received was counted");
    a.stop().await;
}

/// A lease's claim whose answer was lost while zkq could not reach ZooKeeper: it applied, and
/// is released later, once ZooKeeper answers. No client received the message: the next lease
/// (by another zkq) hands it out as its first delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_claim_released_after_a_lost_answer_counts_no_delivery() {
    let zk = ZkServer::shared();
    let root = unique_root("claims-unknown-lease");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let mut config = test_config(&proxy, &root);
    config.zookeeper.session_timeout = Duration::from_secs(20);
    config.zookeeper.request_timeout = Duration::from_secs(1);
    let a = TestZkq::start_ready(config).await;
    let b = TestZkq::start_ready(test_config(zk, &root)).await;
    let direct = zk_client(zk).await;
    b.put_ok("q", b"M").await;
    eventually(SOON, "A sees the message", || async {
        let response = a.http.get(a.url("/v1/queues/q")).send().await.expect("info");
        let info: serde_json::Value = response.json().await.unwrap_or_default();
        info["depth"].as_u64() == Some(1)
    })
    .await;
    // The directories a first claim creates, so that the claim is one transaction.
    let persistent = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    for dir in ["locks", "locks/q", "deliveries", "deliveries/q"] {
        let _ = direct.create(&format!("{root}/{dir}"), &[], &persistent).await;
    }

    let lost = proxy.arm_then_refuse(&[op::MULTI], Fault::DropAnswer);
    let response = a.http.post(a.url("/v1/queues/q/leases?wait=0s&visibility=60s")).send().await.expect("lease");
    assert!(lost.has_fired(), "the fault hit A's claim (answered {})", response.status());
    assert_ne!(response.status().as_u16(), 200, "A cannot know whether its claim applied");
    let locks = format!("{root}/locks/q");
    assert_eq!(children(&direct, &locks).await.len(), 1, "the claim applied: its lock is there");
    proxy.refuse(false);
    eventually(SOON, "A releases the lock of its unknown claim", || async {
        children(&direct, &locks).await.is_empty()
    })
    .await;
    assert_eq!(delivery_count_of_next_lease(&b, "q").await, "1", "a lease no client received was counted");
    a.stop().await;
    b.stop().await;
}

/// A `?max=` take reads about its byte budget of bodies from ZooKeeper, not every candidate's:
/// behind a small message wait 19 of 400 KB, and a take of up to 20 within a budget of 1 KiB
/// gets the small one and one large one (the budget is passed by the message that crosses it),
/// and ZooKeeper answers zkq one large message, not all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_take_reads_bodies_only_within_its_byte_budget() {
    let zk = ZkServer::start();
    let root = unique_root("claims-budget");
    let mut config = test_config(&zk, &root);
    config.api.max_message_bytes = 500_000;
    config.api.max_batch_bytes = 1024;
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("q", b"small").await;
    let large = vec![b'x'; 400_000];
    for _ in 0..19 {
        zkq.put_ok("q", &large).await;
    }
    eventually(SOON, "zkq sees the 20 messages", || async {
        let response = zkq.http.get(zkq.url("/v1/queues/q")).send().await.expect("info");
        let info: serde_json::Value = response.json().await.unwrap_or_default();
        info["depth"].as_u64() == Some(20)
    })
    .await;

    let response = zkq.http.post(zkq.url("/v1/queues/q/take?max=20&wait=0s")).send().await.expect("take");
    assert_eq!(response.status().as_u16(), 200, "take");
    let taken: serde_json::Value = response.json().await.expect("json");
    let messages = taken["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 2, "the small message and the one that crosses the budget");
    // Everything ZooKeeper answered this server's only client, zkq, since it started: the
    // small message, one large one, and small answers.
    let answered = zk.mntr("zk_response_bytes");
    assert!(answered > 400_000.0, "ZooKeeper counts the bytes it answers ({answered})");
    assert!(answered < 1_000_000.0, "ZooKeeper answered zkq {answered} bytes for a take of about 400 KB");
    zkq.stop().await;
}

/// ZooKeeper requests zkq made so far, by operation (`zkq_zookeeper_requests_total`).
fn zk_requests(metrics: &str) -> std::collections::BTreeMap<String, f64> {
    let mut requests = std::collections::BTreeMap::new();
    for line in metrics.lines().filter(|line| line.starts_with("zkq_zookeeper_requests_total{")) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let Some(operation) = series.split("operation=\"").nth(1).and_then(|rest| rest.split('"').next()) else {
            continue;
        };
        *requests.entry(operation.to_owned()).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    requests
}

/// Puts 100 small messages through `writer` (two batches of 50), then takes them with one
/// `?max=100` take through `taker`: the ZooKeeper requests the take made per message, by
/// operation, and in all.
async fn batch_take_requests(
    writer: &TestZkq,
    taker: &TestZkq,
    queue: &str,
) -> (std::collections::BTreeMap<String, f64>, f64) {
    for chunk in 0..2 {
        let messages: Vec<serde_json::Value> =
            (0..50).map(|n| serde_json::json!({ "text": format!("m{chunk}-{n}") })).collect();
        let response = writer
            .http
            .post(writer.url(&format!("/v1/queues/{queue}/batch")))
            .json(&serde_json::json!({ "messages": messages }))
            .send()
            .await
            .expect("batch put");
        assert_eq!(response.status().as_u16(), 201, "batch put");
    }
    eventually(SOON, "the taker sees the 100 messages", || async {
        let response = taker.http.get(taker.url(&format!("/v1/queues/{queue}"))).send().await.expect("info");
        let info: serde_json::Value = response.json().await.unwrap_or_default();
        info["depth"].as_u64() == Some(100)
    })
    .await;
    let before = zk_requests(&taker.metrics().await);
    let response =
        taker.http.post(taker.url(&format!("/v1/queues/{queue}/take?max=100&wait=0s"))).send().await.expect("take");
    assert_eq!(response.status().as_u16(), 200, "take");
    let taken: serde_json::Value = response.json().await.expect("json");
    let count = taken["messages"].as_array().expect("messages").len();
    assert_eq!(count, 100, "one take of up to 100 gets the 100 small messages");
    let after = zk_requests(&taker.metrics().await);
    let per_message: std::collections::BTreeMap<String, f64> = after
        .iter()
        .map(|(operation, n)| (operation.clone(), (n - before.get(operation).copied().unwrap_or(0.0)) / count as f64))
        .filter(|(_, per)| *per > 0.0)
        .collect();
    let total = per_message.values().sum();
    (per_message, total)
}

/// What the byte budget costs a `?max=100` take of 100 small messages (the default budget): the
/// sizes of messages this sidecar wrote are known, so it asks ZooKeeper for none (one read and
/// one transaction for the batch); the sizes of messages another sidecar wrote are asked, one
/// `exists` each, sent together. Prints the requests per message by operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_take_asks_zookeeper_only_for_sizes_it_does_not_know() {
    let zk = ZkServer::shared();
    let root = unique_root("claims-cost");
    let [a, b] = TestZkq::fleet(test_config(zk, &root)).await;

    let (own, own_total) = batch_take_requests(&a, &a, "own").await;
    eprintln!("ZooKeeper requests per message of a ?max=100 take of its own puts: {own_total:.2} ({own:?})");
    // The metrics scrape that reads the counters makes a few `exists` of its own (the queue
    // node, its records' directory): far from one per message.
    let own_exists = own.get("exists").copied().unwrap_or(0.0);
    assert!(own_exists < 0.1, "sizes of messages this sidecar wrote are asked again: {own:?}");
    assert!(own_total < 0.2, "{own_total:.2} ZooKeeper requests per message: {own:?}");

    let (foreign, foreign_total) = batch_take_requests(&b, &a, "foreign").await;
    eprintln!(
        "ZooKeeper requests per message of a ?max=100 take of another sidecar's puts: {foreign_total:.2} ({foreign:?})"
    );
    assert!(foreign_total < 1.2, "{foreign_total:.2} ZooKeeper requests per message: {foreign:?}");
    a.stop().await;
    b.stop().await;
}

/// The budget holds for messages another sidecar wrote, whose sizes this one asks: behind a
/// small message wait 19 of 400 KB put by sidecar B, and a take of up to 20 within 1 KiB on
/// sidecar A gets the small one and one large one, and ZooKeeper answers A about one large body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_take_of_another_sidecars_messages_reads_only_within_its_byte_budget() {
    let zk = ZkServer::start();
    let root = unique_root("claims-budget-foreign");
    let mut config = test_config(&zk, &root);
    config.api.max_message_bytes = 500_000;
    config.api.max_batch_bytes = 1024;
    let b = TestZkq::start_ready(config.clone()).await;
    b.put_ok("q", b"small").await;
    let large = vec![b'x'; 400_000];
    for _ in 0..19 {
        b.put_ok("q", &large).await;
    }
    b.stop().await;
    let before = zk.mntr("zk_response_bytes");
    let a = TestZkq::start_ready(config).await;
    eventually(SOON, "A sees the 20 messages", || async {
        let response = a.http.get(a.url("/v1/queues/q")).send().await.expect("info");
        let info: serde_json::Value = response.json().await.unwrap_or_default();
        info["depth"].as_u64() == Some(20)
    })
    .await;
    let response = a.http.post(a.url("/v1/queues/q/take?max=20&wait=0s")).send().await.expect("take");
    assert_eq!(response.status().as_u16(), 200, "take");
    let taken: serde_json::Value = response.json().await.expect("json");
    let messages = taken["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 2, "the small message and the one that crosses the budget");
    let answered = zk.mntr("zk_response_bytes") - before;
    assert!(answered > 400_000.0, "ZooKeeper counts the bytes it answers ({answered})");
    assert!(answered < 1_000_000.0, "ZooKeeper answered A {answered} bytes for a take of about 400 KB");
    a.stop().await;
}

/// Single takes and leases ready at the same time share their claims (`acquire/crew.rs`): 32
/// consumers each taking (or leasing, then acking) one message at a time from a queue of 640
/// make far fewer reads and transactions than messages, and every message comes out once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_single_claims_share_their_round_trips() {
    let zk = ZkServer::shared();
    let root = unique_root("claims-shared");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    for lease in [false, true] {
        let queue = if lease { "leased" } else { "taken" };
        let total = 640;
        for chunk in 0..total / 64 {
            let messages: Vec<serde_json::Value> =
                (0..64).map(|n| serde_json::json!({ "text": format!("m{}", chunk * 64 + n) })).collect();
            let put = zkq.client().batch_put(queue, "", &serde_json::json!({ "messages": messages })).await;
            assert_eq!(put.status, 201, "batch put: {}", put.text());
        }
        eventually(SOON, "zkq sees the messages", || async {
            let info: serde_json::Value = zkq
                .http
                .get(zkq.url(&format!("/v1/queues/{queue}")))
                .send()
                .await
                .expect("info")
                .json()
                .await
                .unwrap_or_default();
            info["depth"].as_u64() == Some(total as u64)
        })
        .await;
        let before = zk_requests(&zkq.metrics().await);
        let mut consumers = tokio::task::JoinSet::new();
        for _ in 0..32 {
            let api = zkq.client();
            consumers.spawn(async move {
                let mut bodies = Vec::new();
                loop {
                    let answer =
                        if lease { api.lease(queue, "wait=0s").await } else { api.take(queue, "wait=0s").await };
                    if answer.status == 204 {
                        return bodies;
                    }
                    assert_eq!(answer.status, 200, "{}", answer.code);
                    if lease {
                        assert_eq!(api.ack(queue, &answer.receipt).await.status, 204, "ack");
                    }
                    bodies.push(answer.text());
                }
            });
        }
        let mut bodies = Vec::new();
        while let Some(consumer) = consumers.join_next().await {
            bodies.extend(consumer.expect("consumer"));
        }
        bodies.sort();
        let mut expected: Vec<String> = (0..total).map(|n| format!("m{n}")).collect();
        expected.sort();
        assert_eq!(bodies, expected, "{queue}: every message once");
        let after = zk_requests(&zkq.metrics().await);
        let grew = |operation: &str| {
            after.get(operation).copied().unwrap_or(0.0) - before.get(operation).copied().unwrap_or(0.0)
        };
        let (reads, transactions) = (grew("multi_read") + grew("get_data"), grew("multi"));
        eprintln!("{queue}: {total} messages by 32 single consumers: {reads} reads, {transactions} transactions");
        // Alone, each claim would be one read and one transaction (and a lease's ack another).
        assert!(reads < total as f64 / 2.0, "{queue}: {reads} reads for {total} single claims");
        assert!(transactions < total as f64, "{queue}: {transactions} transactions for {total} single claims");
    }
    zkq.stop().await;
}
