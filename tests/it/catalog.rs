//! The queue catalog across sidecars: a deleted dynamic queue and the queue made anew under its
//! name never share a message name, a lease, a lock or a receipt, whichever sidecar holds them.

use std::time::Duration;

use zkq_testkit::*;

const DELETE: reqwest::Method = reqwest::Method::DELETE;

/// B leases the old message; the queue is deleted through A; "NEW" is put and leased through A;
/// B's client acks its old receipt. ZooKeeper numbers a recreated node's children from 0 again,
/// so "NEW" had the old message's name, and the stale ack deleted it (204) while its own lease
/// then answered 409: lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_receipt_of_a_deleted_queue_never_acks_the_message_of_the_queue_made_anew() {
    let zk = ZkServer::shared();
    let root = unique_root("stale-ack");
    let a = TestZkq::start_ready(test_config(zk, &root)).await;
    let b = TestZkq::start_ready(test_config(zk, &root)).await;
    let (api_a, api_b) = (a.client(), b.client());
    assert_eq!(api_a.put("q", "", b"OLD").await.status, 201);
    let old = api_b.lease("q", "wait=5s&visibility=60s").await;
    assert_eq!((old.status, old.body.as_slice()), (200, b"OLD".as_slice()));

    let deleted = api_a.send(DELETE, "/v1/queues/q", None).await;
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    assert_eq!(api_a.put("q", "", b"NEW").await.status, 201);
    let new = api_a.lease("q", "wait=5s&visibility=60s").await;
    assert_eq!((new.status, new.body.as_slice()), (200, b"NEW".as_slice()));

    let stale = api_b.ack("q", &old.receipt).await;
    assert!(
        matches!(stale.status, 404 | 409),
        "a receipt of the deleted queue is refused: {} {}",
        stale.status,
        stale.text()
    );
    assert_eq!(api_a.ack("q", &new.receipt).await.status, 204, "the new message's own lease still holds it");
    assert_eq!(api_a.info("q").await.json()["depth"], 0, "acked once, by its own lease");
}

/// The other half: B's old lease expires after the delete. Its reaper released the lock of the
/// message with the old name, which was the new message's lock, held by A's consumer, so the new
/// message was delivered a second time while A's consumer still held it. Now B ends the deleted
/// queue's leases when it sees the delete, and the new message stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_a_deleted_queue_that_expires_never_frees_a_message_of_the_queue_made_anew() {
    let zk = ZkServer::shared();
    let root = unique_root("stale-expiry");
    let a = TestZkq::start_ready(test_config(zk, &root)).await;
    let b = TestZkq::start_ready(test_config(zk, &root)).await;
    let (api_a, api_b) = (a.client(), b.client());
    assert_eq!(api_a.put("q", "", b"OLD").await.status, 201);
    let old = api_b.lease("q", "wait=5s&visibility=1s").await;
    assert_eq!(old.status, 200);

    assert_eq!(api_a.send(DELETE, "/v1/queues/q", None).await.status, 200);
    assert_eq!(api_a.put("q", "", b"NEW").await.status, 201);
    let new = api_a.lease("q", "wait=5s&visibility=60s").await;
    assert_eq!((new.status, new.body.as_slice()), (200, b"NEW".as_slice()));

    // B holds no lease of q any more (ended with the delete, or, before, expired and released).
    eventually(Duration::from_secs(30), "B's lease of the deleted queue is over", || async {
        metric(&b.metrics().await, r#"zkq_leases_in_flight{queue="q"}"#) == 0.0
    })
    .await;
    let again = api_b.lease("q", "wait=1s").await;
    assert_eq!(again.status, 204, "NEW is still held by A's consumer, not delivered again: {}", again.text());
    assert_eq!(api_a.ack("q", &new.receipt).await.status, 204);
}

/// A deleted queue keeps its node (marked, emptied), so its sequence goes on: the queue made
/// anew never hands out a name of the deleted one.
#[tokio::test]
async fn a_queue_made_anew_goes_on_numbering_where_the_deleted_one_stopped() {
    let zk = ZkServer::shared();
    let root = unique_root("renumber");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let api = zkq.client();
    let first = api.put("q", "", b"one").await.json()["message_id"].as_str().map(str::to_owned);
    assert_eq!(api.send(DELETE, "/v1/queues/q", None).await.status, 200);
    assert_eq!(api.info("q").await.status, 404, "deleted");
    let second = api.put("q", "", b"two").await.json()["message_id"].as_str().map(str::to_owned);
    assert!(first.is_some() && second.is_some() && first != second, "{first:?} then {second:?}");
    assert_eq!(zkq.take_body("q", "2s").await.as_deref(), Some(b"two".as_slice()));
}

/// Writes a dynamic queue's settings node as another ZooKeeper client (or an SQS `CreateQueue`
/// through another sidecar) would.
async fn write_settings(zk: &ZkServer, root: &str, queue: &str, settings: &[u8]) {
    let direct = zk_client(zk).await;
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    direct.mkdir(&format!("{root}/settings"), &options).await.expect("settings directory");
    direct.create(&format!("{root}/settings/{queue}"), settings, &options).await.expect("settings node");
}

/// The seconds from now until a lease's `zkq-lease-expires-at`.
fn expires_in_seconds(lease: &Answer) -> i64 {
    let at: i64 = lease.expiry.parse().expect("zkq-lease-expires-at");
    (at - zkq::types::now_epoch_ms()) / 1000
}

/// A sidecar opening a queue serves its first request with the queue's settings: the first
/// lease on a fresh sidecar of a queue whose settings say 600 s got the default 30 s, and slow
/// work was delivered twice after every restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_lease_on_a_sidecar_that_opens_a_queue_has_the_queues_own_visibility() {
    let zk = ZkServer::shared();
    let root = unique_root("settings-first");
    let a = TestZkq::start_ready(test_config(zk, &root)).await;
    for queue in ["q0", "q1", "q2"] {
        assert_eq!(a.client().put(queue, "", b"slow work").await.status, 201);
        write_settings(zk, &root, queue, br#"{"visibility_seconds": 600}"#).await;
    }
    // A sidecar that never had the queues open: its first request opens each.
    let b = TestZkq::start_ready(test_config(zk, &root)).await;
    for queue in ["q0", "q1", "q2"] {
        let lease = b.client().lease(queue, "wait=5s").await;
        assert_eq!(lease.status, 200, "{}", lease.text());
        let left = expires_in_seconds(&lease);
        assert!((500..=600).contains(&left), "{queue}'s first lease runs {left} s, not the queue's 600 s");
    }
}

/// A settings node another client wrote is checked as one a request writes: a visibility of
/// u64::MAX made every lease answer 500 (an `Instant` overflow); a queue named its own dead-letter
/// queue with a count of 0 made one lease do hundreds of move transactions. Now such a node is
/// refused and counted (the queue keeps the defaults), and waits are clamped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settings_node_another_client_wrote_is_validated_and_clamped() {
    let zk = ZkServer::shared();
    let root = unique_root("settings-foreign");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let api = zkq.client();
    // Written before the queue opens here: its first request is served with what they say.
    write_settings(zk, &root, "huge", br#"{"visibility_seconds": 18446744073709551615}"#).await;
    write_settings(zk, &root, "self", br#"{"dead_letter": "self", "max_deliveries": 0}"#).await;
    assert_eq!(api.put("huge", "", b"m").await.status, 201);
    let lease = api.lease("huge", "wait=5s").await;
    assert_eq!(lease.status, 200, "{}", lease.text());
    let left = expires_in_seconds(&lease);
    assert!((43_000..=43_200).contains(&left), "clamped to 12 hours: {left} s");

    assert_eq!(api.put("self", "", b"poison").await.status, 201);
    let lease = api.lease("self", "wait=5s&visibility=1s").await;
    assert_eq!((lease.status, lease.body.as_slice()), (200, b"poison".as_slice()), "{}", lease.text());
    assert!(metric(&zkq.metrics().await, "zkq_queue_settings_refused_total") >= 1.0, "the refused node is counted");
    assert_eq!(api.ack("self", &lease.receipt).await.status, 204);
}

/// One SQS JSON-protocol call to the listener at `endpoint`.
async fn sqs_call(endpoint: &str, target: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let response = reqwest::Client::new()
        .post(endpoint)
        .header("content-type", "application/x-amz-json-1.0")
        .header("x-amz-target", format!("AmazonSQS.{target}"))
        .body(body.to_string())
        .send()
        .await
        .expect("call");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(serde_json::Value::Null))
}

/// Through SQS on two sidecars: after `DeleteQueue` through A, B (which still has the queue open,
/// with a receive out) answers `NonExistentQueue` (`QueueDoesNotExist` in the JSON protocol) to a send and leaves the queue out of
/// `ListQueues` (a send recreated it before); once `CreateQueue` made it anew, B's receipt handle
/// of the deleted queue deletes nothing of the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sqs_a_deleted_queue_is_deleted_on_every_sidecar_until_created_anew() {
    let zk = ZkServer::shared();
    let root = unique_root("sqs-deleted");
    let start = || {
        let mut config = test_config(zk, &root);
        config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
        TestZkq::start_ready(config)
    };
    let (a, b) = (start().await, start().await);
    let endpoint = |zkq: &TestZkq| format!("http://{}", zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("bound"));
    let (ea, eb) = (endpoint(&a), endpoint(&b));
    let url = format!("{ea}/000000000000/orders");
    assert_eq!(sqs_call(&ea, "CreateQueue", serde_json::json!({ "QueueName": "orders" })).await.0, 200);
    let sent = sqs_call(&eb, "SendMessage", serde_json::json!({ "QueueUrl": url, "MessageBody": "OLD" })).await;
    assert_eq!(sent.0, 200, "{}", sent.1);
    let received = sqs_call(&eb, "ReceiveMessage", serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 5 })).await;
    let old_handle = received.1["Messages"][0]["ReceiptHandle"].as_str().expect("a message").to_owned();

    assert_eq!(sqs_call(&ea, "DeleteQueue", serde_json::json!({ "QueueUrl": url })).await.0, 200);
    let send = sqs_call(&eb, "SendMessage", serde_json::json!({ "QueueUrl": url, "MessageBody": "LOST" })).await;
    assert_eq!(send.0, 400, "a send to the deleted queue: {}", send.1);
    assert!(send.1["__type"].as_str().is_some_and(|t| t.ends_with("QueueDoesNotExist")), "{}", send.1);
    let listed = sqs_call(&eb, "ListQueues", serde_json::json!({})).await;
    assert!(!listed.1.to_string().contains("/orders"), "B lists the deleted queue: {}", listed.1);
    let found = sqs_call(&eb, "GetQueueUrl", serde_json::json!({ "QueueName": "orders" })).await;
    assert_eq!(found.0, 400, "{}", found.1);

    assert_eq!(sqs_call(&ea, "CreateQueue", serde_json::json!({ "QueueName": "orders" })).await.0, 200);
    let sent = sqs_call(&ea, "SendMessage", serde_json::json!({ "QueueUrl": url, "MessageBody": "NEW" })).await;
    assert_eq!(sent.0, 200, "{}", sent.1);
    let stale =
        sqs_call(&eb, "DeleteMessage", serde_json::json!({ "QueueUrl": url, "ReceiptHandle": old_handle })).await;
    assert_ne!(stale.0, 500, "{}", stale.1);
    let received = sqs_call(&ea, "ReceiveMessage", serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 5 })).await;
    assert_eq!(received.1["Messages"][0]["Body"], "NEW", "the new message is still there: {}", received.1);
}

/// A purge forgets the queue's deduplication ids, as SQS does: the same `MessageDeduplicationId`
/// with a new body after `PurgeQueue` is stored (it was taken for a duplicate and dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_forgets_the_queues_deduplication_ids() {
    let zk = ZkServer::shared();
    let root = unique_root("purge-dedup");
    let mut config = test_config(zk, &root);
    config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
    let zkq = TestZkq::start_ready(config).await;
    let endpoint = format!("http://{}", zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("bound"));
    let created = sqs_call(
        &endpoint,
        "CreateQueue",
        serde_json::json!({ "QueueName": "jobs.fifo", "Attributes": { "FifoQueue": "true" } }),
    )
    .await;
    assert_eq!(created.0, 200, "{}", created.1);
    let url = format!("{endpoint}/000000000000/jobs.fifo");
    let send = |body: &'static str| {
        let (endpoint, url) = (endpoint.clone(), url.clone());
        async move {
            let message = serde_json::json!({
                "QueueUrl": url, "MessageBody": body, "MessageGroupId": "g", "MessageDeduplicationId": "d-1",
            });
            sqs_call(&endpoint, "SendMessage", message).await
        }
    };
    assert_eq!(send("first").await.0, 200);
    assert_eq!(sqs_call(&endpoint, "PurgeQueue", serde_json::json!({ "QueueUrl": url })).await.0, 200);
    let again = send("second").await;
    assert_eq!(again.0, 200, "{}", again.1);
    let received =
        sqs_call(&endpoint, "ReceiveMessage", serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 5 })).await;
    assert_eq!(received.1["Messages"][0]["Body"], "second", "stored anew after the purge: {}", received.1);

    // zkq's own purge forgets its idempotency keys the same way.
    let api = zkq.client();
    let keyed = |body: &'static str| {
        zkq.http.post(zkq.url("/v1/queues/own/messages")).header("idempotency-key", "k").body(body).send()
    };
    assert_eq!(keyed("one").await.expect("put").status(), 201);
    assert_eq!(api.send(reqwest::Method::POST, "/v1/queues/own/purge", None).await.status, 200);
    let anew = keyed("two").await.expect("put");
    assert!(anew.headers().get("zkq-idempotent-replay").is_none(), "the key was forgotten");
    assert_eq!(zkq.take_body("own", "2s").await.as_deref(), Some(b"two".as_slice()));
}

/// A FIFO `SendMessageBatch` with two identical bodies (content-based deduplication) or two equal
/// deduplication ids stores each message once and answers every entry, as SQS does: every entry
/// failed, the distinct ones included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_batch_repeating_a_message_stores_it_once_and_the_rest_too() {
    let zk = ZkServer::shared();
    let root = unique_root("fifo-batch-dups");
    let mut config = test_config(zk, &root);
    config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
    let zkq = TestZkq::start_ready(config).await;
    let endpoint = format!("http://{}", zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("bound"));
    let attributes = serde_json::json!({ "FifoQueue": "true", "ContentBasedDeduplication": "true" });
    let created =
        sqs_call(&endpoint, "CreateQueue", serde_json::json!({ "QueueName": "b.fifo", "Attributes": attributes }))
            .await;
    assert_eq!(created.0, 200, "{}", created.1);
    let url = format!("{endpoint}/000000000000/b.fifo");
    let entries = serde_json::json!([
        { "Id": "a", "MessageBody": "same", "MessageGroupId": "g" },
        { "Id": "b", "MessageBody": "same", "MessageGroupId": "g" },
        { "Id": "c", "MessageBody": "other", "MessageGroupId": "g" },
        { "Id": "d", "MessageBody": "by-id", "MessageGroupId": "g", "MessageDeduplicationId": "x" },
        { "Id": "e", "MessageBody": "by-id", "MessageGroupId": "g", "MessageDeduplicationId": "x" },
    ]);
    let sent =
        sqs_call(&endpoint, "SendMessageBatch", serde_json::json!({ "QueueUrl": url, "Entries": entries })).await;
    assert_eq!(sent.0, 200, "{}", sent.1);
    let ok: Vec<&str> =
        sent.1["Successful"].as_array().map_or_else(Vec::new, |a| a.iter().filter_map(|e| e["Id"].as_str()).collect());
    assert_eq!(ok.len(), 5, "every entry succeeded: {}", sent.1);
    let id_of = |entry: &str| {
        sent.1["Successful"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["Id"] == entry))
            .map(|e| e["MessageId"].clone())
    };
    assert_eq!(id_of("a"), id_of("b"), "a duplicate answers the first one's MessageId");
    let mut bodies = Vec::new();
    for _ in 0..3 {
        let received =
            sqs_call(&endpoint, "ReceiveMessage", serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 2 })).await;
        let message = &received.1["Messages"][0];
        bodies.push(message["Body"].as_str().expect("a message").to_owned());
        let handle = message["ReceiptHandle"].clone();
        assert_eq!(
            sqs_call(&endpoint, "DeleteMessage", serde_json::json!({ "QueueUrl": url, "ReceiptHandle": handle }))
                .await
                .0,
            200
        );
    }
    assert_eq!(bodies, ["same", "other", "by-id"], "each stored once, in order");
    let empty =
        sqs_call(&endpoint, "ReceiveMessage", serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 1 })).await;
    assert!(empty.1["Messages"].is_null(), "nothing more: {}", empty.1);
}

/// SQS MessageIds are unique across queues and across a queue deleted and made anew (they were
/// node names: every queue's first message was `queue-0000000000`), and a receive on another
/// sidecar answers the id the send answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_message_ids_are_unique_across_queues_and_incarnations_and_the_same_on_every_sidecar() {
    let zk = ZkServer::shared();
    let root = unique_root("sqs-ids");
    let start = || {
        let mut config = test_config(zk, &root);
        config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
        TestZkq::start_ready(config)
    };
    let (a, b) = (start().await, start().await);
    let endpoint = |zkq: &TestZkq| format!("http://{}", zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("bound"));
    let (ea, eb) = (endpoint(&a), endpoint(&b));
    let send = |queue: &'static str| {
        let ea = ea.clone();
        async move {
            let url = format!("{ea}/000000000000/{queue}");
            let sent = sqs_call(&ea, "SendMessage", serde_json::json!({ "QueueUrl": url, "MessageBody": queue })).await;
            assert_eq!(sent.0, 200, "{}", sent.1);
            sent.1["MessageId"].as_str().expect("a MessageId").to_owned()
        }
    };
    for queue in ["one", "two"] {
        assert_eq!(sqs_call(&ea, "CreateQueue", serde_json::json!({ "QueueName": queue })).await.0, 200);
    }
    let (first, second) = (send("one").await, send("two").await);
    assert_ne!(first, second, "the first messages of two queues");
    assert!(first.len() == 36 && first.matches('-').count() == 4, "a UUID: {first}");
    let url = format!("{eb}/000000000000/one");
    let received = sqs_call(&eb, "ReceiveMessage", serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 5 })).await;
    assert_eq!(received.1["Messages"][0]["MessageId"], first.as_str(), "the same id on the receiving sidecar");

    let queue_url = format!("{ea}/000000000000/one");
    assert_eq!(sqs_call(&ea, "DeleteQueue", serde_json::json!({ "QueueUrl": queue_url })).await.0, 200);
    assert_eq!(sqs_call(&ea, "CreateQueue", serde_json::json!({ "QueueName": "one" })).await.0, 200);
    assert_ne!(send("one").await, first, "the queue made anew hands out a new id");
}

/// A tags node another client wrote that is not a JSON object of strings made `TagQueue`,
/// `UntagQueue` and `ListQueueTags` fail for ever, with no way through the API to repair it. Now
/// it is logged and counted, listed as no tags, and the next tag change writes over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tags_node_another_client_wrote_is_read_as_no_tags_and_the_next_change_repairs_it() {
    let zk = ZkServer::shared();
    let root = unique_root("tags-foreign");
    let mut config = test_config(zk, &root);
    config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
    let zkq = TestZkq::start_ready(config).await;
    let endpoint = format!("http://{}", zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("bound"));
    let url = format!("{endpoint}/000000000000/tagged");
    assert_eq!(sqs_call(&endpoint, "CreateQueue", serde_json::json!({ "QueueName": "tagged" })).await.0, 200);
    let direct = zk_client(zk).await;
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let node = format!("{root}/sqs/tags/tagged");
    direct.mkdir(&format!("{root}/sqs/tags"), &options).await.expect("tags directory");
    direct.create(&node, b"[1, 2]", &options).await.expect("a foreign tags node");

    let listed = sqs_call(&endpoint, "ListQueueTags", serde_json::json!({ "QueueUrl": url })).await;
    assert_eq!(listed.0, 200, "{}", listed.1);
    assert!(listed.1.get("Tags").is_none(), "read as no tags: {}", listed.1);
    let tagged =
        sqs_call(&endpoint, "TagQueue", serde_json::json!({ "QueueUrl": url, "Tags": { "team": "payments" } })).await;
    assert_eq!(tagged.0, 200, "{}", tagged.1);
    let listed = sqs_call(&endpoint, "ListQueueTags", serde_json::json!({ "QueueUrl": url })).await;
    assert_eq!(listed.1["Tags"], serde_json::json!({ "team": "payments" }), "{}", listed.1);

    direct.set_data(&node, b"{\"team\": 7}", None).await.expect("foreign again");
    let untagged =
        sqs_call(&endpoint, "UntagQueue", serde_json::json!({ "QueueUrl": url, "TagKeys": ["other"] })).await;
    assert_eq!(untagged.0, 200, "{}", untagged.1);
    let (data, _) = direct.get_data(&node).await.expect("the tags node");
    assert_eq!(data, b"{}", "written over with no tags");
    let metrics = zkq.metrics().await;
    assert_eq!(metric_value(&metrics, "zkq_foreign_nodes_total{node=\"tags\"}"), Some(3.0), "each read counted");
}
