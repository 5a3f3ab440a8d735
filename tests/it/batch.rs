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

async fn post_json(zkq: &TestZkq, path: &str, body: serde_json::Value) -> reqwest::Response {
    zkq.http.post(zkq.url(path)).json(&body).send().await.expect("request")
}

async fn error_code(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    let body: serde_json::Value = response.json().await.expect("json error");
    (status, body["code"].as_str().unwrap_or_default().to_owned())
}

/// A batch put stores every message in one transaction, in order; a take with `max` answers them
/// as JSON in the same order, text and bytes alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_put_and_a_take_of_many_round_trip_in_order() {
    use base64::Engine;
    let zk = ZkServer::shared();
    let root = unique_root("batch-put");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut messages: Vec<serde_json::Value> = (0..10).map(|i| serde_json::json!({"text": format!("m{i}")})).collect();
    messages.push(serde_json::json!({"body": b64.encode([0u8, 255, 10])}));
    let response = post_json(&zkq, "/v1/queues/q/batch", serde_json::json!({ "messages": messages })).await;
    assert_eq!(response.status(), 201);
    let put: serde_json::Value = response.json().await.expect("json");
    let ids: Vec<String> =
        put["message_ids"].as_array().expect("ids").iter().map(|v| v.as_str().expect("id").to_owned()).collect();
    assert_eq!(ids.len(), 11);
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted, "sequence numbers in the order of the request");
    let response = zkq.http.post(zkq.url("/v1/queues/q/take?max=8")).send().await.expect("take");
    assert_eq!(response.status(), 200);
    let taken: serde_json::Value = response.json().await.expect("json");
    let first: Vec<&serde_json::Value> = taken["messages"].as_array().expect("messages").iter().collect();
    assert_eq!(first.len(), 8);
    for (i, message) in first.iter().enumerate() {
        assert_eq!(message["message_id"], ids[i].as_str());
        assert_eq!(b64.decode(message["body"].as_str().expect("body")).expect("base64"), format!("m{i}").as_bytes());
    }
    let rest: serde_json::Value =
        zkq.http.post(zkq.url("/v1/queues/q/take?max=8")).send().await.expect("take").json().await.expect("json");
    let rest = rest["messages"].as_array().expect("messages");
    assert_eq!(rest.len(), 3);
    assert_eq!(b64.decode(rest[2]["body"].as_str().expect("body")).expect("base64"), vec![0u8, 255, 10]);
    let empty = zkq.http.post(zkq.url("/v1/queues/q/take?max=8")).send().await.expect("take");
    assert_eq!(empty.status(), 204);
    zkq.stop().await;
}

/// Bad batches get documented errors and store nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_batches_get_documented_errors_and_store_nothing() {
    let zk = ZkServer::shared();
    let root = unique_root("batch-errors");
    let mut config = test_config(zk, &root);
    config.api.max_batch = 5;
    config.api.max_batch_bytes = 2048;
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("q", b"only").await;
    let cases = [
        (serde_json::json!({"messages": []}), 400, "invalid_parameter"),
        (serde_json::json!({"messages": vec![serde_json::json!({"text": "x"}); 6]}), 400, "invalid_parameter"),
        (serde_json::json!({"messages": [{"text": "x", "body": "eA=="}]}), 400, "invalid_parameter"),
        (serde_json::json!({"messages": [{}]}), 400, "invalid_parameter"),
        (serde_json::json!({"messages": [{"body": "not base64!"}]}), 400, "invalid_parameter"),
        (
            serde_json::json!({"messages": [{"text": "x".repeat(1500)}, {"text": "y".repeat(1500)}]}),
            413,
            "payload_too_large",
        ),
        (serde_json::json!({"messages": [{"text": "x"}, {"text": "y", "priority": 3}]}), 409, "parameter_not_for_kind"),
        (serde_json::json!({"messages": [{"text": "x", "colour": "red"}]}), 400, "bad_request"),
    ];
    for (body, status, code) in cases {
        let got = error_code(post_json(&zkq, "/v1/queues/q/batch", body.clone()).await).await;
        assert_eq!(got, (status, code.to_owned()), "{body}");
    }
    for query in ["max=0", "max=6", "max=x"] {
        let response = zkq.http.post(zkq.url(&format!("/v1/queues/q/take?{query}"))).send().await.expect("take");
        assert_eq!(response.status(), 400, "{query}");
    }
    let client = zk_client(zk).await;
    assert_eq!(children(&client, &format!("{root}/queues/q")).await.len(), 1, "nothing stored by a bad batch");
    zkq.stop().await;
}

/// Leases of many come with a receipt each; one batch ack acks them, and a stale receipt in the
/// batch gets its own 404 without failing the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_many_and_a_batch_ack_answer_per_receipt() {
    let zk = ZkServer::shared();
    let root = unique_root("batch-ack");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let messages: Vec<serde_json::Value> = (0..6).map(|i| serde_json::json!({"text": format!("m{i}")})).collect();
    assert_eq!(post_json(&zkq, "/v1/queues/q/batch", serde_json::json!({ "messages": messages })).await.status(), 201);
    let response = zkq.http.post(zkq.url("/v1/queues/q/leases?max=5&visibility=60s")).send().await.expect("lease");
    assert_eq!(response.status(), 200);
    let leased: serde_json::Value = response.json().await.expect("json");
    let leased = leased["messages"].as_array().expect("messages").clone();
    assert_eq!(leased.len(), 5);
    let mut receipts: Vec<String> = leased
        .iter()
        .map(|m| {
            assert_eq!(m["delivery_count"], 1, "{m}");
            assert!(m["expires_at"].as_i64().is_some(), "{m}");
            m["lease"].as_str().expect("receipt").to_owned()
        })
        .collect();
    receipts.push("not-a-receipt".to_owned());
    let response = post_json(&zkq, "/v1/queues/q/acks", serde_json::json!({ "leases": receipts })).await;
    assert_eq!(response.status(), 200);
    let acked: serde_json::Value = response.json().await.expect("json");
    let statuses: Vec<u64> =
        acked["results"].as_array().expect("results").iter().map(|r| r["status"].as_u64().expect("status")).collect();
    assert_eq!(statuses, vec![204, 204, 204, 204, 204, 404], "{acked}");
    // The five are gone; the sixth message is still there.
    let client = zk_client(zk).await;
    assert_eq!(children(&client, &format!("{root}/queues/q")).await.len(), 1);
    // Acking the same receipts again: each 409 or 404, never a failure of the request.
    let again = post_json(&zkq, "/v1/queues/q/acks", serde_json::json!({ "leases": &receipts[..5] })).await;
    assert_eq!(again.status(), 200);
    let again: serde_json::Value = again.json().await.expect("json");
    assert!(again["results"].as_array().expect("results").iter().all(|r| r["status"] != 204), "{again}");
    zkq.stop().await;
}
