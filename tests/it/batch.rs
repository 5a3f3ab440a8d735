//! Many messages per ZooKeeper request: group commit of concurrent puts.

use futures::StreamExt;

use zkq_testkit::*;

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
    let response = zkq.client().batch_put("q", "", &serde_json::json!({ "messages": messages })).await;
    assert_eq!(response.status, 201);
    let put: serde_json::Value = response.json();
    let ids: Vec<String> =
        put["message_ids"].as_array().expect("ids").iter().map(|v| v.as_str().expect("id").to_owned()).collect();
    assert_eq!(ids.len(), 11);
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted, "sequence numbers in the order of the request");
    let response = zkq.client().take("q", "max=8").await;
    assert_eq!(response.status, 200);
    let taken: serde_json::Value = response.json();
    let first: Vec<&serde_json::Value> = taken["messages"].as_array().expect("messages").iter().collect();
    assert_eq!(first.len(), 8);
    for (i, message) in first.iter().enumerate() {
        assert_eq!(message["message_id"], ids[i].as_str());
        assert_eq!(b64.decode(message["body"].as_str().expect("body")).expect("base64"), format!("m{i}").as_bytes());
    }
    let rest: serde_json::Value = zkq.client().take("q", "max=8").await.json();
    let rest = rest["messages"].as_array().expect("messages");
    assert_eq!(rest.len(), 3);
    assert_eq!(b64.decode(rest[2]["body"].as_str().expect("body")).expect("base64"), vec![0u8, 255, 10]);
    let empty = zkq.client().take("q", "max=8").await;
    assert_eq!(empty.status, 204);
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
        let got = {
            let a = zkq.client().batch_put("q", "", &body).await;
            (a.status, a.code)
        };
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
    assert_eq!(zkq.client().batch_put("q", "", &serde_json::json!({ "messages": messages })).await.status, 201);
    let response = zkq.client().lease("q", "max=5&visibility=60s").await;
    assert_eq!(response.status, 200);
    let leased: serde_json::Value = response.json();
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
    let response = zkq.client().batch_ack("q", &receipts).await;
    assert_eq!(response.status, 200);
    let acked: serde_json::Value = response.json();
    let statuses: Vec<u64> =
        acked["results"].as_array().expect("results").iter().map(|r| r["status"].as_u64().expect("status")).collect();
    assert_eq!(statuses, vec![204, 204, 204, 204, 204, 404], "{acked}");
    // The five are gone; the sixth message is still there.
    let client = zk_client(zk).await;
    assert_eq!(children(&client, &format!("{root}/queues/q")).await.len(), 1);
    // Acking the same receipts again (a client retrying a lost answer): each answers as the ack
    // that applied did, and nothing changes.
    let again = zkq
        .client()
        .send_json(reqwest::Method::POST, "/v1/queues/q/acks", &serde_json::json!({ "leases": &receipts[..5] }))
        .await;
    assert_eq!(again.status, 200);
    let again: serde_json::Value = again.json();
    assert!(again["results"].as_array().expect("results").iter().all(|r| r["status"] == 204), "{again}");
    assert_eq!(children(&client, &format!("{root}/queues/q")).await.len(), 1);
    // Another step on an acked lease is refused: the lease is over.
    let nack = zkq.client().nack("q", &receipts[0], "").await;
    assert_eq!(nack.status, 409, "a nack after the ack");
    zkq.stop().await;
}

/// The messages of a `?max=` take after the first are read in one multi-read and claimed in one
/// transaction, not one round trip pair per message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_of_many_claims_them_in_one_transaction() {
    use base64::Engine;
    let zk = ZkServer::shared();
    let root = unique_root("take-many-txn");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let messages: Vec<serde_json::Value> = (0..60).map(|i| serde_json::json!({"text": format!("m{i}")})).collect();
    assert_eq!(zkq.client().batch_put("q", "", &serde_json::json!({ "messages": messages })).await.status, 201);
    let calls = |text: &str, op: &str| {
        metric_value(text, &format!("zkq_zookeeper_requests_total{{operation=\"{op}\",outcome=\"ok\"}}")).unwrap_or(0.0)
    };
    // The put made the queue's node; the cache reads that node once when its creation event
    // comes (to see whether it carries a delete mark). That read is not the take's: wait for it
    // (under load it can come after the put's answer).
    eventually(std::time::Duration::from_secs(30), "the cache read the new queue node", || async {
        calls(&zkq.metrics().await, "get_data") >= 1.0
    })
    .await;
    let before = zkq.metrics().await;
    let response = zkq.client().take("q", "max=50").await;
    assert_eq!(response.status, 200);
    let after = zkq.metrics().await;
    let taken: serde_json::Value = response.json();
    let bodies: Vec<Vec<u8>> = taken["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| base64::engine::general_purpose::STANDARD.decode(m["body"].as_str().expect("body")).expect("base64"))
        .collect();
    let expected: Vec<Vec<u8>> = (0..50).map(|i| format!("m{i}").into_bytes()).collect();
    assert_eq!(bodies, expected, "the first 50, in order");
    // The first message: one read and one claim; the 49 others: one multi-read and one claim
    // (a flush of claim markers may add one more transaction).
    let reads = calls(&after, "get_data") - calls(&before, "get_data");
    let multi_reads = calls(&after, "multi_read") - calls(&before, "multi_read");
    let transactions = calls(&after, "multi") - calls(&before, "multi");
    assert_eq!((reads, multi_reads), (1.0, 1.0), "reads");
    assert!(transactions <= 3.0, "{transactions} transactions for 50 messages");
    let client = zk_client(zk).await;
    assert_eq!(children(&client, &format!("{root}/queues/q")).await.len(), 10);
    zkq.stop().await;
}

/// A `?max=` take whose candidates include one a consumer holds Curator's lock on (a Curator
/// lock-safe consumer, or a lease) takes the others in its transaction and leaves that one; it
/// is handed out once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_of_many_leaves_a_locked_message_and_takes_the_others() {
    use base64::Engine;
    let zk = ZkServer::shared();
    let root = unique_root("take-many-locked");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let messages: Vec<serde_json::Value> = (0..6).map(|i| serde_json::json!({"text": format!("m{i}")})).collect();
    let put = zkq.client().batch_put("q", "", &serde_json::json!({ "messages": messages })).await;
    let put: serde_json::Value = put.json();
    let ids: Vec<String> =
        put["message_ids"].as_array().expect("ids").iter().map(|v| v.as_str().expect("id").to_owned()).collect();
    // Another consumer holds the lock of the fourth message.
    let client = zk_client(zk).await;
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    for dir in [format!("{root}/locks"), format!("{root}/locks/q")] {
        let _ = client.create(&dir, &[], &options).await;
    }
    let lock = format!("{root}/locks/q/{}", ids[3]);
    let ephemeral = zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
    client.create(&lock, &[], &ephemeral).await.expect("lock held by another consumer");

    let body_of = |m: &serde_json::Value| {
        base64::engine::general_purpose::STANDARD.decode(m["body"].as_str().expect("body")).expect("base64")
    };
    let taken: serde_json::Value = zkq.client().take("q", "max=10").await.json();
    let mut bodies: Vec<Vec<u8>> = taken["messages"].as_array().expect("messages").iter().map(body_of).collect();
    bodies.sort();
    let expected: Vec<Vec<u8>> = [0, 1, 2, 4, 5].iter().map(|i| format!("m{i}").into_bytes()).collect();
    assert_eq!(bodies, expected, "every message but the locked one");
    assert_eq!(children(&client, &format!("{root}/queues/q")).await, vec![ids[3].clone()], "the locked one stays");
    client.delete(&lock, None).await.expect("the other consumer lets go");
    assert_eq!(zkq.take_body("q", "10s").await, Some(b"m3".to_vec()), "offered again once the lock is gone");
    zkq.stop().await;
}

/// Two zkq processes drain one queue with `?max=` takes at once: their batch claims collide
/// (a candidate the other took fails the transaction and is dropped), and every message is still
/// taken exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_zkqs_taking_many_at_once_take_every_message_exactly_once() {
    use base64::Engine;
    let zk = ZkServer::shared();
    let root = unique_root("take-many-race");
    let zkqs = [TestZkq::start_ready(test_config(zk, &root)).await, TestZkq::start_ready(test_config(zk, &root)).await];
    let total = 2000;
    for chunk in (0..total).collect::<Vec<_>>().chunks(100) {
        let messages: Vec<serde_json::Value> =
            chunk.iter().map(|i| serde_json::json!({"text": format!("m{i}")})).collect();
        let response = zkqs[0].client().batch_put("q", "", &serde_json::json!({ "messages": messages })).await;
        assert_eq!(response.status, 201);
    }
    // Both have the queue open and its candidates cached before the drain starts.
    for zkq in &zkqs {
        eventually(std::time::Duration::from_secs(10), "queue open", || async {
            let info: serde_json::Value =
                zkq.http.get(zkq.url("/v1/queues/q")).send().await.expect("info").json().await.expect("json");
            info["depth"] == total
        })
        .await;
    }
    let takers = zkqs.iter().flat_map(|zkq| (0..6).map(move |_| zkq)).map(|zkq| async move {
        let mut got = Vec::new();
        loop {
            let response = zkq.client().take("q", "max=20&wait=0s").await;
            match response.status {
                204 => return got,
                200 => {},
                other => panic!("take: {other}"),
            }
            let answer: serde_json::Value = response.json();
            for m in answer["messages"].as_array().expect("messages") {
                let body = base64::engine::general_purpose::STANDARD.decode(m["body"].as_str().expect("body"));
                got.push(String::from_utf8(body.expect("base64")).expect("utf-8"));
            }
        }
    });
    let mut bodies: Vec<String> = futures::future::join_all(takers).await.into_iter().flatten().collect();
    bodies.sort();
    let mut expected: Vec<String> = (0..total).map(|i| format!("m{i}")).collect();
    expected.sort();
    assert_eq!(bodies.len(), total, "messages taken");
    assert!(bodies == expected, "every message exactly once");
    let mut outcomes = Vec::new();
    for zkq in &zkqs {
        let text = zkq.metrics().await;
        for outcome in ["won", "lost", "gone", "locked"] {
            let series = format!("zkq_claim_attempts_total{{outcome=\"{outcome}\",queue=\"q\"}}");
            outcomes.push(format!("{outcome} {}", metric_value(&text, &series).unwrap_or(0.0)));
        }
    }
    println!("claim outcomes (zkq 1, zkq 2): {outcomes:?}");
    for zkq in zkqs {
        zkq.stop().await;
    }
}

/// The leases in a `?max=` answer: (message id, body, receipt, delivery count).
fn leased_of(answer: &serde_json::Value) -> Vec<(String, String, String, u64)> {
    use base64::Engine;
    answer["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            let body = base64::engine::general_purpose::STANDARD.decode(m["body"].as_str().expect("body"));
            (
                m["message_id"].as_str().expect("id").to_owned(),
                String::from_utf8(body.expect("base64")).expect("utf-8"),
                m["lease"].as_str().expect("receipt").to_owned(),
                m["delivery_count"].as_u64().expect("delivery count"),
            )
        })
        .collect()
}

/// Checks that `id`'s Curator lock exists with zkq's lease data (a claim id, on zkq's session)
/// and that its delivery count is `count`.
async fn assert_leased(client: &zookeeper_client::Client, root: &str, id: &str, count: u32) {
    let (data, stat) = client.get_data(&format!("{root}/locks/q/{id}")).await.expect("lock of a leased message");
    assert!(data.starts_with(b"zkq-"), "{id}: lock data {:?}", String::from_utf8_lossy(&data));
    assert_ne!(stat.ephemeral_owner, 0, "{id}: the lock is ephemeral");
    let (counted, _) = client.get_data(&format!("{root}/deliveries/q/{id}")).await.expect("delivery count");
    assert_eq!(counted, count.to_be_bytes().to_vec(), "{id}: delivery count");
}

/// The messages of a `?max=` lease after the first are read in one multi-read and leased in one
/// transaction (each with its own lock, version check and delivery count), not one transaction
/// per message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_many_claims_them_in_one_transaction() {
    let zk = ZkServer::shared();
    let root = unique_root("lease-many-txn");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let messages: Vec<serde_json::Value> = (0..60).map(|i| serde_json::json!({"text": format!("m{i}")})).collect();
    assert_eq!(zkq.client().batch_put("q", "", &serde_json::json!({ "messages": messages })).await.status, 201);
    // Every message was leased once before (and released), so each claim updates a count.
    let first = zkq.client().lease("q", "max=60&visibility=60s").await;
    let first: serde_json::Value = first.json();
    let receipts: Vec<String> = leased_of(&first).into_iter().map(|(_, _, receipt, _)| receipt).collect();
    assert_eq!(receipts.len(), 60);
    let nack = serde_json::json!({ "leases": receipts, "nack": {"mode": "keep"} });
    let released: serde_json::Value =
        zkq.client().send_json(reqwest::Method::POST, "/v1/queues/q/acks", &nack).await.json();
    assert!(released["results"].as_array().expect("results").iter().all(|r| r["status"] == 204), "{released}");
    let calls = |text: &str, op: &str| {
        metric_value(text, &format!("zkq_zookeeper_requests_total{{operation=\"{op}\",outcome=\"ok\"}}")).unwrap_or(0.0)
    };
    let client = zk_client(zk).await;
    eventually(std::time::Duration::from_secs(10), "the released messages offered again", || async {
        children(&client, &format!("{root}/locks/q")).await.is_empty()
    })
    .await;
    let before = zkq.metrics().await;
    let response = zkq.client().lease("q", "max=50&visibility=60s").await;
    assert_eq!(response.status, 200);
    let after = zkq.metrics().await;
    let leased = leased_of(&response.json());
    let bodies: Vec<&str> = leased.iter().map(|(_, body, _, _)| body.as_str()).collect();
    let expected: Vec<String> = (0..50).map(|i| format!("m{i}")).collect();
    assert_eq!(bodies, expected, "the first 50, in order");
    assert!(leased.iter().all(|(.., count)| *count == 2), "delivered twice each: {leased:?}");
    // The first message: one multi-read (item and count) and one claim; the 49 others: one
    // multi-read and one claim.
    let multi_reads = calls(&after, "multi_read") - calls(&before, "multi_read");
    let transactions = calls(&after, "multi") - calls(&before, "multi");
    assert_eq!(multi_reads, 2.0, "reads");
    assert!(transactions <= 3.0, "{transactions} transactions for 50 leases");
    for (id, ..) in &leased {
        assert_leased(&client, &root, id, 2).await;
    }
    assert_eq!(children(&client, &format!("{root}/locks/q")).await.len(), 50, "one lock per lease, no more");
    let receipts: Vec<&str> = leased.iter().map(|(_, _, receipt, _)| receipt.as_str()).collect();
    let acked = zkq.client().batch_ack("q", &receipts).await.json();
    assert!(acked["results"].as_array().expect("results").iter().all(|r| r["status"] == 204), "{acked}");
    assert_eq!(children(&client, &format!("{root}/queues/q")).await.len(), 10);
    zkq.stop().await;
}

/// A `?max=` lease whose candidates include one another consumer holds Curator's lock on leases
/// the others and leaves that one (its lock untouched); it is leased once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_many_skips_a_message_locked_by_another_consumer() {
    let zk = ZkServer::shared();
    let root = unique_root("lease-many-locked");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let messages: Vec<serde_json::Value> = (0..6).map(|i| serde_json::json!({"text": format!("m{i}")})).collect();
    let put = zkq.client().batch_put("q", "", &serde_json::json!({ "messages": messages })).await;
    let put: serde_json::Value = put.json();
    let ids: Vec<String> =
        put["message_ids"].as_array().expect("ids").iter().map(|v| v.as_str().expect("id").to_owned()).collect();
    // Another consumer holds the lock of the fourth message.
    let client = zk_client(zk).await;
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    for dir in [format!("{root}/locks"), format!("{root}/locks/q")] {
        let _ = client.create(&dir, &[], &options).await;
    }
    let lock = format!("{root}/locks/q/{}", ids[3]);
    let ephemeral = zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
    client.create(&lock, b"curator", &ephemeral).await.expect("lock held by another consumer");

    let response = zkq.client().lease("q", "max=10&visibility=60s").await;
    assert_eq!(response.status, 200);
    let leased = leased_of(&response.json());
    let mut bodies: Vec<&str> = leased.iter().map(|(_, body, _, _)| body.as_str()).collect();
    bodies.sort_unstable();
    assert_eq!(bodies, vec!["m0", "m1", "m2", "m4", "m5"], "every message but the locked one");
    for (id, ..) in &leased {
        assert_leased(&client, &root, id, 1).await;
    }
    let (data, _) = client.get_data(&lock).await.expect("the other consumer's lock");
    assert_eq!(data, b"curator".to_vec(), "the other consumer's lock is untouched");
    assert!(
        client.get_data(&format!("{root}/deliveries/q/{}", ids[3])).await.is_err(),
        "no delivery counted for the locked message"
    );
    client.delete(&lock, None).await.expect("the other consumer lets go");
    let again = zkq.http.post(zkq.url("/v1/queues/q/leases?max=10&wait=10s&visibility=60s")).send().await;
    let again = leased_of(&again.expect("lease").json().await.expect("json"));
    let bodies: Vec<&str> = again.iter().map(|(_, body, _, _)| body.as_str()).collect();
    assert_eq!(bodies, vec!["m3"], "leased once the lock is gone");
    assert_leased(&client, &root, &ids[3], 1).await;
    zkq.stop().await;
}

/// Two zkq processes drain one queue with `?max=` leases and batch acks at once: their batch
/// claims collide (a candidate the other locked fails the transaction and is dropped), and every
/// message is still leased exactly once, with a delivery count of 1, and acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_zkqs_leasing_many_at_once_lease_every_message_exactly_once() {
    let zk = ZkServer::shared();
    let root = unique_root("lease-many-race");
    let zkqs = [TestZkq::start_ready(test_config(zk, &root)).await, TestZkq::start_ready(test_config(zk, &root)).await];
    let total = 1000;
    for chunk in (0..total).collect::<Vec<_>>().chunks(100) {
        let messages: Vec<serde_json::Value> =
            chunk.iter().map(|i| serde_json::json!({"text": format!("m{i}")})).collect();
        let response = zkqs[0].client().batch_put("q", "", &serde_json::json!({ "messages": messages })).await;
        assert_eq!(response.status, 201);
    }
    for zkq in &zkqs {
        eventually(std::time::Duration::from_secs(10), "queue open", || async {
            let info: serde_json::Value =
                zkq.http.get(zkq.url("/v1/queues/q")).send().await.expect("info").json().await.expect("json");
            info["depth"] == total
        })
        .await;
    }
    let consumers = zkqs.iter().flat_map(|zkq| (0..6).map(move |_| zkq)).map(|zkq| async move {
        let mut got = Vec::new();
        loop {
            let url = zkq.url("/v1/queues/q/leases?max=20&wait=0s&visibility=60s");
            let response = zkq.http.post(url).send().await.expect("lease");
            match response.status().as_u16() {
                204 => return got,
                200 => {},
                other => panic!("lease: {other}"),
            }
            let leased = leased_of(&response.json().await.expect("json"));
            let receipts: Vec<&str> = leased.iter().map(|(_, _, receipt, _)| receipt.as_str()).collect();
            let acked = zkq.client().batch_ack("q", &receipts).await;
            let acked: serde_json::Value = acked.json();
            assert!(acked["results"].as_array().expect("results").iter().all(|r| r["status"] == 204), "{acked}");
            got.extend(leased.into_iter().map(|(_, body, _, count)| (body, count)));
        }
    });
    let got: Vec<(String, u64)> = futures::future::join_all(consumers).await.into_iter().flatten().collect();
    assert!(got.iter().all(|(_, count)| *count == 1), "no message was delivered twice");
    let mut bodies: Vec<String> = got.into_iter().map(|(body, _)| body).collect();
    bodies.sort();
    let mut expected: Vec<String> = (0..total).map(|i| format!("m{i}")).collect();
    expected.sort();
    assert_eq!(bodies.len(), total, "messages leased");
    assert!(bodies == expected, "every message exactly once");
    let client = zk_client(zk).await;
    assert!(children(&client, &format!("{root}/queues/q")).await.is_empty(), "every message acked");
    let mut outcomes = Vec::new();
    for zkq in &zkqs {
        let text = zkq.metrics().await;
        for outcome in ["won", "lost", "gone", "locked"] {
            let series = format!("zkq_claim_attempts_total{{outcome=\"{outcome}\",queue=\"q\"}}");
            outcomes.push(format!("{outcome} {}", metric_value(&text, &series).unwrap_or(0.0)));
        }
    }
    println!("claim outcomes (zkq 1, zkq 2): {outcomes:?}");
    for zkq in zkqs {
        zkq.stop().await;
    }
}

/// A `?max=` lease of Curator putMulti nodes leases every item in order, each under a lock of
/// its own: the batch's transaction splits a node it leases, as a lease of one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_many_splits_put_multi_nodes_and_leases_each_item() {
    let zk = ZkServer::shared();
    let root = unique_root("lease-many-multi");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let mut nodes = Vec::new();
    for range in [0..5, 5..7] {
        let messages: Vec<serde_json::Value> = range.map(|i| serde_json::json!({"text": format!("m{i}")})).collect();
        let put =
            zkq.client().batch_put("q", "format=curator-multi", &serde_json::json!({ "messages": messages })).await;
        let put = put.json();
        nodes.push(put["message_ids"][0].as_str().expect("id").to_owned());
    }
    let response = zkq.client().lease("q", "max=10&visibility=60s").await;
    assert_eq!(response.status, 200);
    let leased = leased_of(&response.json());
    let got: Vec<(String, String)> = leased.iter().map(|(id, body, ..)| (id.clone(), body.clone())).collect();
    let expected: Vec<(String, String)> = (0..7)
        .map(|i| {
            let id = match i {
                0 => nodes[0].clone(),
                1..5 => format!("{}-{i:04}", nodes[0]),
                5 => nodes[1].clone(),
                _ => format!("{}-{:04}", nodes[1], i - 5),
            };
            (id, format!("m{i}"))
        })
        .collect();
    assert_eq!(got, expected, "every item, in order, under its own name");
    let client = zk_client(zk).await;
    for (id, ..) in &leased {
        assert_leased(&client, &root, id, 1).await;
    }
    let receipts: Vec<&str> = leased.iter().map(|(_, _, receipt, _)| receipt.as_str()).collect();
    let acked = zkq.client().batch_ack("q", &receipts).await.json();
    assert!(acked["results"].as_array().expect("results").iter().all(|r| r["status"] == 204), "{acked}");
    assert!(children(&client, &format!("{root}/queues/q")).await.is_empty(), "every item acked");
    zkq.stop().await;
}
