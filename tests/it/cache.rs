//! The event-driven children cache against real ZooKeeper: what it saves and what it survives.

use std::time::Duration;

use crate::harness::*;

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
    assert_eq!(zkq.take("w", "0s").await.status(), 204, "the queue exists and its cache is live");
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
    let body = zkq::queue::envelope::encode([b"from another client".as_slice()]);
    direct.create(&format!("{root}/queues/w/queue-"), &body, &options).await.expect("direct put");
    let response = waiting.await.expect("join");
    assert_eq!(response.status(), 200, "the direct put wakes the waiting take");
    assert_eq!(response.bytes().await.expect("body").as_ref(), b"from another client");
    zkq.stop().await;
}
