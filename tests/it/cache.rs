//! The event-driven children cache against real ZooKeeper: what it saves and what it survives.

use std::time::Duration;

use zkq_testkit::*;

/// The sum of every `zkq_zookeeper_requests_total` series of one operation (any outcome).
fn zk_requests(metrics: &str, operation: &str) -> f64 {
    let prefix = format!("zkq_zookeeper_requests_total{{operation=\"{operation}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peeks_take_their_order_from_the_cache_not_from_a_child_list_read_each() {
    let zk = ZkServer::shared();
    let root = unique_root("peek-cache");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    // A take on the empty queue returns only after the cache read the queue once.
    let empty = zkq.take("p", "0s").await;
    assert_eq!(empty.status(), 204);
    let mut first = String::new();
    for i in 0..50 {
        let id = zkq.put_ok("p", format!("message {i}").as_bytes()).await;
        if i == 0 {
            first = id;
        }
    }
    let before = zk_requests(&zkq.metrics().await, "get_children");
    for _ in 0..20 {
        let response = zkq.http.get(zkq.url("/v1/queues/p/messages?limit=1")).send().await.expect("peek");
        assert_eq!(response.status(), 200);
        let peek: serde_json::Value = response.json().await.expect("json");
        let messages = peek["messages"].as_array().expect("messages");
        assert_eq!(messages.len(), 1, "{peek}");
        assert_eq!(messages[0]["message_id"], first.as_str(), "{peek}");
    }
    let after = zk_requests(&zkq.metrics().await, "get_children");
    println!("20 peeks with limit=1 on 50 messages: {} getChildren", after - before);
    assert!(after - before <= 2.0, "20 peeks cost {} getChildren", after - before);
    zkq.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_zookeeper_restart_a_put_by_another_client_wakes_a_waiting_take() {
    let zk = ZkServer::start();
    let root = unique_root("watch-restart");
    let zkq = TestZkq::start_ready(test_config(&zk, &root)).await;
    // Only a write creates a queue: open it with a put, then empty it.
    zkq.put_ok("w", b"open").await;
    assert_eq!(zkq.take_body("w", "5s").await.as_deref(), Some(b"open".as_slice()));
    assert_eq!(zkq.take("w", "0s").await.status(), 204, "the queue exists, empty, and its cache is live");
    zk.restart();
    zkq.wait_ready().await;
    // The take waits on the cache alone: only a tree-watch event can wake it.
    let waiting = {
        let (http, url) = (zkq.http.clone(), zkq.url("/v1/queues/w/take?wait=20s"));
        tokio::spawn(async move { http.post(url).send().await.expect("take") })
    };
    eventually(Duration::from_secs(20), "the take waits", || async {
        zkq.metrics().await.contains("zkq_waiting_takers{queue=\"w\"} 1")
    })
    .await;
    let direct = zk_client(&zk).await;
    let options = zookeeper_client::CreateMode::PersistentSequential.with_acls(zookeeper_client::Acls::anyone_all());
    let body = zkq::envelope::encode([b"from another client".as_slice()]);
    direct.create(&format!("{root}/queues/w/queue-"), &body, &options).await.expect("direct put");
    let response = waiting.await.expect("join");
    assert_eq!(response.status(), 200, "the direct put wakes the waiting take");
    assert_eq!(response.bytes().await.expect("body").as_ref(), b"from another client");
    zkq.stop().await;
}

/// Leases and acks `queue` on `zkq` with `consumers` clients until a lease answers 204.
async fn drain_with_leases(zkq: &TestZkq, queue: &str, consumers: usize) -> usize {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..consumers {
        let (http, lease_url, base) = (
            zkq.http.clone(),
            zkq.url(&format!("/v1/queues/{queue}/leases?wait=1s")),
            zkq.url(&format!("/v1/queues/{queue}/leases/")),
        );
        tasks.spawn(async move {
            let mut acked = 0;
            loop {
                let leased = http.post(&lease_url).send().await.expect("lease");
                if leased.status() == 204 {
                    return acked;
                }
                assert_eq!(leased.status(), 200);
                let receipt = leased.headers()["zkq-lease"].to_str().expect("receipt").to_owned();
                let ack = http.delete(format!("{base}{receipt}")).send().await.expect("ack");
                assert_eq!(ack.status(), 204);
                acked += 1;
            }
        });
    }
    tasks.join_all().await.into_iter().sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_draining_one_queue_with_leases_rarely_collide() {
    let zk = ZkServer::shared();
    let root = unique_root("two-drain");
    let [a, b] = TestZkq::fleet(test_config(zk, &root)).await;
    let total = 200;
    for i in 0..total {
        a.put_ok("d", format!("m{i}").as_bytes()).await;
    }
    let (on_a, on_b) = tokio::join!(drain_with_leases(&a, "d", 4), drain_with_leases(&b, "d", 4));
    assert_eq!(on_a + on_b, total, "every message acked once");
    let (ma, mb) = (a.metrics().await, b.metrics().await);
    let outcome = |text: &str, outcome: &str| -> f64 {
        let series = format!("zkq_claim_attempts_total{{outcome=\"{outcome}\",queue=\"d\"}}");
        let alt = format!("zkq_claim_attempts_total{{queue=\"d\",outcome=\"{outcome}\"}}");
        text.lines()
            .filter(|l| l.starts_with(&series) || l.starts_with(&alt))
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum()
    };
    let won = outcome(&ma, "won") + outcome(&mb, "won");
    let failed: f64 = ["lost", "gone", "locked"].iter().map(|o| outcome(&ma, o) + outcome(&mb, o)).sum();
    println!(
        "two sidecars, {total} messages: {on_a} + {on_b} acked, {won} claims won, {failed} failed ({:.3} per message)",
        failed / total as f64
    );
    assert_eq!(won, total as f64, "one won claim per message");
    assert!(failed / (total as f64) < 0.5, "{failed} failed claims for {total} messages");
    a.stop().await;
    b.stop().await;
}

/// A queue deeper than a default Java client can list is reported: `zkq_queue_children_bytes`
/// counts the child list as a getChildren reply, past Java's default `jute.maxbuffer` (1 MiB),
/// and zkq still serves the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_list_past_javas_default_limit_is_measured_and_still_served() {
    const JUTE_MAXBUFFER: usize = 0xfffff; // Java's default
    let zk = ZkServer::shared();
    let root = unique_root("deep-children");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let first = zkq.put_ok("deep", b"first").await;
    // Curator-style fifo items written straight to ZooKeeper, a transaction of 2,000 at a time,
    // until the child list is past the limit (about 52,000 names of 16 bytes).
    let client = zk_client(zk).await;
    let queue = format!("{root}/queues/deep");
    let envelope = [0u8, 0, 0, 1, 0, 0, 0, 1, b'x'];
    let options = zookeeper_client::CreateMode::PersistentSequential.with_acls(zookeeper_client::Acls::anyone_all());
    let mut expected = 4 + "queue-0000000000".len();
    let mut created = 1;
    while expected <= JUTE_MAXBUFFER {
        let mut writer = client.new_multi_writer();
        for _ in 0..2000 {
            writer.add_create(&format!("{queue}/queue-"), &envelope, &options).expect("create op");
        }
        let results = writer.commit().await.expect("a batch of items");
        created += results.len();
        expected += results.len() * (4 + "queue-0000000000".len());
    }
    let bytes =
        || async { metric_value(&zkq.metrics().await, "zkq_queue_children_bytes{queue=\"deep\"}").unwrap_or(0.0) };
    eventually(Duration::from_secs(60), "the gauge counts every child", || async { bytes().await == expected as f64 })
        .await;
    assert!(bytes().await > JUTE_MAXBUFFER as f64);
    let info: serde_json::Value =
        zkq.http.get(zkq.url("/v1/queues/deep")).send().await.expect("info").json().await.expect("json");
    assert_eq!(info["depth"], created as u64, "{info}");
    assert!(info["oldest_message_age_ms"].as_i64().is_some_and(|age| age >= 0), "{info}");
    assert_eq!(info["oldest_message_age_known"], true, "{info}");
    // A zkq that just started answers its first question about the deep queue with the head's
    // age, or says that it does not know it yet; never a null age that would mean "nothing waits".
    let fresh = TestZkq::start_ready(test_config(zk, &root)).await;
    let first_info: serde_json::Value =
        fresh.http.get(fresh.url("/v1/queues/deep")).send().await.expect("info").json().await.expect("json");
    let known = first_info["oldest_message_age_known"].as_bool().expect("a boolean");
    let age = first_info["oldest_message_age_ms"].as_i64();
    assert!(known == age.is_some(), "a deep queue's head is waiting: {first_info}");
    fresh.stop().await;
    // Deeper than Curator can read, still in order for zkq.
    let response = zkq.take("deep", "0s").await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["zkq-message-id"], first.as_str());
    zkq.stop().await;
}

/// A single consumer keeps Curator's order after a message it did not claim is deleted: by
/// zkq's own `DELETE …/messages/{id}`, or by a lone foreign consumer taking it straight from
/// ZooKeeper. Such a deletion raced no claim of ours; it used to switch the cache to a random
/// pick among the first candidates for 5 s (put 7, delete one, take 6: c-4, c-6, c-3, …).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_consumer_keeps_curators_order_after_a_delete_by_id_or_a_foreign_take() {
    let zk = ZkServer::shared();
    let root = unique_root("order-after-delete");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let api = zkq.client();
    let mut ids = Vec::new();
    for i in 0..7 {
        ids.push(zkq.put_ok("q", format!("c-{i}").as_bytes()).await);
    }
    // The cache holds all seven before the deletions.
    eventually(Duration::from_secs(10), "the cache sees the seven", || async {
        metric(&zkq.metrics().await, r#"zkq_queue_children{queue="q"}"#) == 7.0
    })
    .await;
    let deleted = api.send(reqwest::Method::DELETE, &format!("/v1/queues/q/messages/{}", ids[1]), None).await;
    assert_eq!(deleted.status, 204, "{}", deleted.text());
    // A foreign consumer takes c-3 from ZooKeeper itself.
    let direct = zk_client(zk).await;
    let mut children = children(&direct, &format!("{root}/queues/q")).await;
    children.sort();
    direct.delete(&format!("{root}/queues/q/{}", children[2]), None).await.expect("a foreign take of c-3");
    eventually(Duration::from_secs(10), "the cache sees both deletions", || async {
        metric(&zkq.metrics().await, r#"zkq_queue_children{queue="q"}"#) == 5.0
    })
    .await;
    let mut taken = Vec::new();
    while let Some(body) = zkq.take_body("q", "0s").await {
        taken.push(String::from_utf8(body).expect("utf-8"));
    }
    assert_eq!(taken, ["c-0", "c-2", "c-4", "c-5", "c-6"], "Curator's order");
}
