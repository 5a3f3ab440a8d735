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
    let [a, b] = TestZkq::fleet(test_config(zk, &root)).await;
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
    let [a, b] = TestZkq::fleet(test_config(zk, &root)).await;
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
    (at - zkq::now_epoch_ms()) / 1000
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

/// A refused `CreateQueue` leaves nothing behind: an attribute zkq cannot serve (`DelaySeconds`
/// 5), a value out of range, or a dead-letter queue that does not exist make no queue, so the
/// corrected retry makes it with its attributes (it answered `QueueAlreadyExists`: the node was
/// created before the attributes were checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_create_queue_leaves_nothing_and_the_corrected_retry_makes_the_queue() {
    let zk = ZkServer::shared();
    let root = unique_root("sqs-create-refused");
    let mut config = test_config(zk, &root);
    config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
    let zkq = TestZkq::start_ready(config).await;
    let endpoint = format!("http://{}", zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("bound"));
    let direct = zk_client(zk).await;
    let dlq = "arn:aws:sqs:us-east-1:000000000000:missing";
    let refused = [
        serde_json::json!({ "DelaySeconds": "901" }),
        serde_json::json!({ "VisibilityTimeout": "99999" }),
        serde_json::json!({ "RedrivePolicy": serde_json::json!({ "deadLetterTargetArn": dlq, "maxReceiveCount": 3 }).to_string() }),
    ];
    for (n, attributes) in refused.iter().enumerate() {
        let name = format!("refused-{n}");
        let create =
            sqs_call(&endpoint, "CreateQueue", serde_json::json!({ "QueueName": name, "Attributes": attributes }))
                .await;
        assert_eq!(create.0, 400, "{attributes}: {}", create.1);
        let kind = create.1["__type"].as_str().unwrap_or_default();
        assert!(
            kind.contains("InvalidAttributeValue") || kind.contains("InvalidParameterValue"),
            "{attributes}: {}",
            create.1
        );
        let found = sqs_call(&endpoint, "GetQueueUrl", serde_json::json!({ "QueueName": name })).await;
        assert_eq!(found.0, 400, "the refused create left queue {name} behind: {}", found.1);
        let node = direct.check_stat(&format!("{root}/queues/{name}")).await.expect("exists");
        assert!(node.is_none(), "the refused create left a node behind for {name}");
        let retry = sqs_call(
            &endpoint,
            "CreateQueue",
            serde_json::json!({ "QueueName": name, "Attributes": { "VisibilityTimeout": "45" } }),
        )
        .await;
        assert_eq!(retry.0, 200, "the corrected retry of {name}: {}", retry.1);
        let url = retry.1["QueueUrl"].as_str().expect("a url").to_owned();
        let attributes = sqs_call(
            &endpoint,
            "GetQueueAttributes",
            serde_json::json!({ "QueueUrl": url, "AttributeNames": ["VisibilityTimeout"] }),
        )
        .await;
        assert_eq!(attributes.1["Attributes"]["VisibilityTimeout"], "45", "{}", attributes.1);
    }
}

/// Two `CreateQueue` calls with different attributes on two sidecars at once: one makes the
/// queue, the other is told it exists with other attributes (`QueueAlreadyExists`), and the
/// queue has the winner's attributes on both sidecars. Both succeeded, each writing its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_concurrent_create_queue_calls_with_different_attributes_one_makes_the_queue() {
    let zk = ZkServer::shared();
    let root = unique_root("sqs-create-race");
    let start = || {
        let mut config = test_config(zk, &root);
        config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
        TestZkq::start_ready(config)
    };
    let (a, b) = (start().await, start().await);
    let endpoint = |zkq: &TestZkq| format!("http://{}", zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("bound"));
    let (ea, eb) = (endpoint(&a), endpoint(&b));
    for n in 0..8 {
        let name = format!("race-{n}");
        let create = |endpoint: String, seconds: &'static str| {
            let body = serde_json::json!({ "QueueName": name, "Attributes": { "VisibilityTimeout": seconds } });
            async move { sqs_call(&endpoint, "CreateQueue", body).await }
        };
        let (one, two) = tokio::join!(create(ea.clone(), "40"), create(eb.clone(), "50"));
        let winner = match (one.0, two.0) {
            (200, 400) => "40",
            (400, 200) => "50",
            other => panic!("{name}: one create makes the queue, the other is refused: {other:?} {} {}", one.1, two.1),
        };
        let loser = if winner == "40" { &two.1 } else { &one.1 };
        let kind = loser["__type"].as_str().unwrap_or_default();
        assert!(kind.ends_with("QueueNameExists") || kind.ends_with("QueueAlreadyExists"), "{loser}");
        for endpoint in [&ea, &eb] {
            let url = format!("{endpoint}/000000000000/{name}");
            let attributes = sqs_call(
                endpoint,
                "GetQueueAttributes",
                serde_json::json!({ "QueueUrl": url, "AttributeNames": ["VisibilityTimeout"] }),
            )
            .await;
            assert_eq!(attributes.1["Attributes"]["VisibilityTimeout"], winner, "{name}: {}", attributes.1);
        }
        // The same attributes again: the queue exists as asked, so it is no error.
        let again = create(ea.clone(), if winner == "40" { "40" } else { "50" }).await;
        assert_eq!(again.0, 200, "{}", again.1);
    }
}

/// A message put while a delete runs (the queue made anew by the put) is no part of the delete:
/// its lease keeps its lock, so its ack answers 204 and it is never delivered again, and its
/// idempotency record stays, so a retry of its put is answered as a duplicate. The delete judged
/// a child's age by the queue node's `cversion`, which counts deletions too and runs ahead of the
/// sequence ZooKeeper numbers children with: it deleted the new message (or, listed before it,
/// its lock, and the ack answered 409) and every idempotency record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_put_while_a_delete_runs_keeps_its_lock_and_its_idempotency_record() {
    use zkq_testkit::proxy::{Fault, ZkProxy, op};

    let zk = ZkServer::shared();
    let root = unique_root("catalog-put-during-delete");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    // The deleting sidecar is held at the proxy for a while: a long session and deadline.
    let mut held_config = test_config(&proxy, &root);
    held_config.zookeeper.session_timeout = Duration::from_secs(20);
    held_config.zookeeper.request_timeout = Duration::from_secs(20);
    let deleter = TestZkq::start_ready(held_config).await;
    let old = TestZkq::start_ready(test_config(zk, &root)).await;
    // The third has never opened the queue: its put reads the mark and makes the queue anew.
    let new = TestZkq::start_ready(test_config(zk, &root)).await;
    let queue = "made-anew-while-deleted";
    let keyed_put = |zkq: &TestZkq, key: &'static str, body: &'static str| {
        let request = zkq.http.post(zkq.url(&format!("/v1/queues/{queue}/messages"))).header("Idempotency-Key", key);
        async move { Answer::of(request.body(body).send().await.expect("put")).await }
    };

    // The old incarnation: messages put and taken (so the node's `cversion`, which counts the
    // deletions too, runs well ahead of its next sequence), one left, and a keyed one.
    let api = old.client();
    for i in 0..10 {
        assert_eq!(api.put(queue, "", format!("taken-{i}").as_bytes()).await.status, 201);
        assert_eq!(api.take(queue, "wait=0").await.status, 200);
    }
    assert_eq!(api.put(queue, "", b"left").await.status, 201);
    assert_eq!(keyed_put(&old, "old-key", "old keyed").await.status, 201);

    // The delete marks the queue, then stops at its next read of the queue's children.
    let held = proxy.arm_containing(&[op::GET_CHILDREN, op::GET_CHILDREN2], &format!("/queues/{queue}"), Fault::Hold);
    let deleting = {
        let api = deleter.client();
        tokio::spawn(async move { api.send(DELETE, &format!("/v1/queues/{queue}"), None).await })
    };
    tokio::time::timeout(Duration::from_secs(30), held.held()).await.expect("the delete read the queue's children");

    // Meanwhile a keyed put makes the queue anew, and its message is leased.
    let stored = keyed_put(&new, "new-key", "new").await;
    assert_eq!(stored.status, 201, "{}", stored.text());
    // The old incarnation's messages are still there until the delete removes them: they may
    // be leased first.
    let mut old_leases = Vec::new();
    let lease = loop {
        let lease = new.client().lease(queue, "wait=5s&visibility=60s").await;
        assert_eq!(lease.status, 200, "{}", lease.text());
        if lease.body == b"new" {
            break lease;
        }
        assert!(old_leases.len() < 2, "leased more than the old incarnation held: {}", lease.text());
        old_leases.push(lease);
    };

    held.release_deliver();
    let deleted = deleting.await.expect("the delete");
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    assert_eq!(deleted.json()["complete"], true, "{}", deleted.text());

    // The new message kept its lock: its ack deletes it, and nothing is delivered again.
    let acked = new.client().ack(queue, &lease.receipt).await;
    assert_eq!(acked.status, 204, "the ack of the message put while the delete ran: {}", acked.text());
    // The old incarnation's messages went with it, leased or not.
    for old in &old_leases {
        let stale = new.client().ack(queue, &old.receipt).await;
        assert_eq!(stale.status, 409, "the ack of a deleted message: {}", stale.text());
    }
    let again = new.client().lease(queue, "wait=0").await;
    assert_eq!(again.status, 204, "left after the ack: {}", again.text());
    // Its key is remembered: the retry is its duplicate, nothing is stored.
    let retried = keyed_put(&new, "new-key", "new").await;
    assert!(stored.json()["message_id"].is_string(), "{}", stored.text());
    assert_eq!(
        retried.json()["message_id"],
        stored.json()["message_id"],
        "the retry of the put made while the delete ran: {}",
        retried.text()
    );
    assert_eq!(new.client().lease(queue, "wait=0").await.status, 204, "the retry stored a second message");
    // The old incarnation's key is forgotten: a put with it stores anew.
    let reused = keyed_put(&old, "old-key", "old keyed").await;
    assert_eq!(reused.status, 201, "{}", reused.text());
    assert_eq!(new.client().lease(queue, "wait=5s").await.body, b"old keyed");
}

/// What the churn's consumers saw, shared between them.
#[derive(Default)]
struct Churn {
    /// Every body leased, each time it was leased.
    leased: Vec<String>,
    /// Bodies leased with a short visibility (their lease may expire and they come again).
    may_repeat: std::collections::HashSet<String>,
    /// Acks of a lease no delete ran across that were refused: its message was lost to a stale
    /// receipt or expiry of another incarnation.
    refused_without_delete: Vec<String>,
    /// Stale acks (after a delete had answered) that deleted something.
    stale_acked: Vec<String>,
}

/// Three sidecars share one dynamic queue while it is deleted and made anew (by puts) again and
/// again through any of them, with leases out on all three: some acked at once, some held across
/// a delete and acked afterwards with their stale receipt, some left to expire after it. No stale
/// receipt acks anything (no 204), no ack of a lease that no delete crossed is refused (nothing
/// of it was freed or deleted by a stale step), no message is leased again while held (also one
/// leased while a delete ran: a delete removed the locks of messages put after its mark while
/// it ran, judging their age by the queue node's `cversion`, which runs ahead of the sequence
/// ZooKeeper numbers children with), and afterwards nothing stays locked and one sidecar drains what
/// is left (its cache followed every message of every incarnation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_and_new_incarnations_under_leases_on_three_sidecars_never_ack_or_free_the_wrong_message() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    let zk = ZkServer::shared();
    let root = unique_root("catalog-churn");
    let sidecars = Arc::new(vec![
        TestZkq::start_ready(test_config(zk, &root)).await,
        TestZkq::start_ready(test_config(zk, &root)).await,
        TestZkq::start_ready(test_config(zk, &root)).await,
    ]);
    // Deletes started, and deletes answered: a lease granted at start count s and acked while
    // it is still s crossed no delete.
    let (started, answered) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Churn::default()));
    let put = Arc::new(AtomicUsize::new(0));

    let mut workers = tokio::task::JoinSet::new();
    for p in 0..2 {
        let (sidecars, stop, put) = (sidecars.clone(), stop.clone(), put.clone());
        workers.spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let api = sidecars[(p + i) % 3].client();
                if api.put("churn", "", format!("p{p}-{i}").as_bytes()).await.status == 201 {
                    put.fetch_add(1, Ordering::SeqCst);
                }
                i += 1;
            }
        });
    }
    for c in 0..6 {
        let (sidecars, stop, seen) = (sidecars.clone(), stop.clone(), seen.clone());
        let (started, answered) = (started.clone(), answered.clone());
        workers.spawn(async move {
            let api = sidecars[c % 3].client();
            let mut round = 0usize;
            while !stop.load(Ordering::SeqCst) {
                round += 1;
                let style = (c + round) % 4;
                // No delete runs when the lease is asked for (a message put while one runs
                // may be deleted with it, as documented), and none starts before it is granted.
                let before = started.load(Ordering::SeqCst);
                let quiet = answered.load(Ordering::SeqCst) == before;
                let visibility = if style == 3 { "1s" } else { "60s" };
                let lease = api.lease("churn", &format!("wait=1s&visibility={visibility}")).await;
                if lease.status != 200 {
                    continue;
                }
                // Granted before delete `before + 1` started, when none started meanwhile.
                let granted_before_next = quiet && started.load(Ordering::SeqCst) == before;
                let body = String::from_utf8_lossy(&lease.body).into_owned();
                {
                    let mut seen = seen.lock().expect("lock");
                    seen.leased.push(body.clone());
                    // A lease that may expire: its message comes again. One granted while a
                    // delete ran keeps its lock: its message is either the deleted
                    // incarnation's, deleted with it, or one put since, kept with its lock.
                    if style == 3 {
                        seen.may_repeat.insert(body.clone());
                    }
                }
                match style {
                    // Held until a delete answered, then acked with the stale receipt.
                    2 if granted_before_next => {
                        let waited = std::time::Instant::now();
                        while answered.load(Ordering::SeqCst) <= before
                            && !stop.load(Ordering::SeqCst)
                            && waited.elapsed() < Duration::from_secs(20)
                        {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        if answered.load(Ordering::SeqCst) > before {
                            let ack = api.ack("churn", &lease.receipt).await;
                            if ack.status == 204 {
                                seen.lock().expect("lock").stale_acked.push(body);
                            }
                        } else {
                            // No delete came: not stale, so acked as any.
                            api.ack("churn", &lease.receipt).await;
                        }
                    },
                    // Left to expire (after a delete, or not).
                    3 => {},
                    _ => {
                        let ack = api.ack("churn", &lease.receipt).await;
                        if ack.status != 204 && granted_before_next && started.load(Ordering::SeqCst) == before {
                            let what = format!("{body}: {} {}", ack.status, ack.text());
                            seen.lock().expect("lock").refused_without_delete.push(what);
                        }
                    },
                }
            }
        });
    }
    let mut last = 0;
    for d in 0..8 {
        // A delete once some messages went in since the last.
        eventually(Duration::from_secs(30), "puts between deletes", || async {
            put.load(Ordering::SeqCst) >= last + 20
        })
        .await;
        last = put.load(Ordering::SeqCst);
        started.fetch_add(1, Ordering::SeqCst);
        let deleted = sidecars[d % 3].client().send(DELETE, "/v1/queues/churn", None).await;
        assert!(matches!(deleted.status, 200 | 404), "delete {d}: {} {}", deleted.status, deleted.text());
        answered.fetch_add(1, Ordering::SeqCst);
    }
    eventually(Duration::from_secs(30), "puts after the last delete", || async {
        put.load(Ordering::SeqCst) >= last + 20
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    while let Some(worker) = workers.join_next().await {
        worker.expect("a worker");
    }
    // Every lease ends (acked, its message deleted, or expired): nothing stays locked, and what
    // is left drains. A lease ended here without its lock deleted would hold its message for
    // as long as its sidecar's session lives.
    let direct = zk_client(zk).await;
    let api = sidecars[0].client();
    eventually(Duration::from_secs(30), "the queue drains and no lock is left", || async {
        loop {
            let lease = api.lease("churn", "wait=0").await;
            if lease.status != 200 {
                break;
            }
            seen.lock().expect("lock").leased.push(String::from_utf8_lossy(&lease.body).into_owned());
            assert_eq!(api.ack("churn", &lease.receipt).await.status, 204);
        }
        let messages = direct.list_children(&format!("{root}/queues/churn")).await.expect("the queue's node");
        let locks = direct.list_children(&format!("{root}/locks/churn")).await.unwrap_or_default();
        messages.is_empty() && locks.is_empty()
    })
    .await;
    let seen = seen.lock().expect("lock");
    assert!(seen.stale_acked.is_empty(), "stale receipts acked: {:?}", seen.stale_acked);
    assert!(
        seen.refused_without_delete.is_empty(),
        "acks refused with no delete between: {:?}",
        seen.refused_without_delete
    );
    let mut counts = std::collections::HashMap::new();
    for body in &seen.leased {
        *counts.entry(body.as_str()).or_insert(0) += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(body, n)| **n > 1 && !seen.may_repeat.contains(**body)).collect();
    assert!(twice.is_empty(), "leased twice while held: {twice:?}");
    assert!(seen.leased.len() > 50, "the churn leased too little to say anything: {}", seen.leased.len());
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
