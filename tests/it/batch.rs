//! Many messages per ZooKeeper request: group commit of concurrent puts.

use futures::StreamExt;

use crate::harness::*;

fn histogram(text: &str, name: &str, part: &str) -> f64 {
    metric_value(text, &format!("{name}_{part}")).unwrap_or(0.0)
}

/// Puts in flight together share transactions, and each still gets its own node, sequence number
/// and 201; a put refused on its own (its queue node was deleted under it) does not fail the puts
/// it shared a transaction with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_puts_share_transactions_and_each_gets_its_own_message() {
    let zk = ZkServer::shared();
    let root = unique_root("group-commit");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    zkq.put_ok("gone", b"first").await;
    // Another client deletes the queue node (and its message) under zkq.
    let client = zk_client(zk).await;
    for child in children(&client, &format!("{root}/queues/gone")).await {
        client.delete(&format!("{root}/queues/gone/{child}"), None).await.expect("delete item");
    }
    client.delete(&format!("{root}/queues/gone"), None).await.expect("delete queue node");
    let before = zkq.metrics().await;
    let puts = 400;
    let ids: Vec<(String, String)> = futures::stream::iter(0..puts)
        .map(|i| {
            let zkq = &zkq;
            async move {
                let queue = if i == puts / 2 { "gone" } else { "busy" };
                (queue.to_owned(), zkq.put_ok(queue, format!("m{i}").as_bytes()).await)
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let mut busy: Vec<&String> = ids.iter().filter(|(q, _)| q == "busy").map(|(_, id)| id).collect();
    busy.sort();
    busy.dedup();
    assert_eq!(busy.len(), puts - 1, "every put its own message id");
    let on_zookeeper = children(&client, &format!("{root}/queues/busy")).await;
    assert_eq!(on_zookeeper.len(), puts - 1, "every acknowledged put is a node");
    assert_eq!(children(&client, &format!("{root}/queues/gone")).await.len(), 1, "the refused put retried alone");
    let after = zkq.metrics().await;
    let transactions =
        histogram(&after, "zkq_group_commit_units", "count") - histogram(&before, "zkq_group_commit_units", "count");
    let units =
        histogram(&after, "zkq_group_commit_units", "sum") - histogram(&before, "zkq_group_commit_units", "sum");
    println!("{puts} puts, 64 in flight: {units} units in {transactions} transactions");
    assert!(units >= puts as f64, "every put went through group commit: {units}");
    assert!(transactions < units, "64 puts in flight never shared a transaction ({transactions} for {units})");
    zkq.stop().await;
}
