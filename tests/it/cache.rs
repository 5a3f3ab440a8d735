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
