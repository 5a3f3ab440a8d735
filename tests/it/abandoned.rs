//! Clients that give up: a request whose client leaves while ZooKeeper is slow to answer must
//! still finish what it started and record it, and a retry must learn the truth.
//!
//! Each test holds the step's transaction at the fault proxy, lets the client leave (the
//! request is counted as `zkq_http_requests_total{status="499"}` once hyper dropped its
//! handler), then lets ZooKeeper answer.

use std::time::Duration;

use zkq::config::Config;

use zkq_testkit::proxy::{Fault, ZkProxy, op};
use zkq_testkit::*;

/// A generous bound for anything that should happen "soon" on a loaded 2-core machine.
const SOON: Duration = Duration::from_secs(30);

/// Config of the zkq behind the proxy: a long session, so a held request keeps the session.
fn config_via(proxy: &ZkProxy, root: &str) -> Config {
    let mut config = test_config(proxy, root);
    config.zookeeper.session_timeout = Duration::from_secs(20);
    config
}

/// Leases one message and answers its receipt.
async fn lease_one(zkq: &TestZkq, queue: &str) -> String {
    let leased = zkq.client().lease(queue, "wait=5s&visibility=60s").await;
    assert_eq!(leased.status, 200, "lease: {}", leased.code);
    leased.receipt
}

/// Requests abandoned by their client so far, by route (`status="499"`).
fn abandoned(zkq: &TestZkq, route: &str, method: &str) -> f64 {
    let series = format!("zkq_http_requests_total{{method=\"{method}\",route=\"{route}\",status=\"499\"}}");
    metric_value(&zkq.registered_metrics(), &series).unwrap_or(0.0)
}

/// Sends `request` with its ZooKeeper transaction held at the proxy, lets the client leave
/// once the transaction is held, waits until zkq saw the client go, then lets ZooKeeper answer.
async fn abandon_while_held(
    zkq: &TestZkq,
    proxy: &ZkProxy,
    request: reqwest::RequestBuilder,
    route: &str,
    method: &str,
) {
    abandon_while_op_held(zkq, proxy, &[op::MULTI], request, route, method).await;
}

/// As [`abandon_while_held`], holding the first request whose opcode is in `ops`.
async fn abandon_while_op_held(
    zkq: &TestZkq,
    proxy: &ZkProxy,
    ops: &[i32],
    request: reqwest::RequestBuilder,
    route: &str,
    method: &str,
) {
    let before = abandoned(zkq, route, method);
    let held = proxy.arm(ops, Fault::Hold);
    let client = tokio::spawn(async move { request.send().await });
    tokio::time::timeout(SOON, held.held()).await.expect("the step's transaction reached ZooKeeper");
    client.abort();
    let _ = client.await;
    eventually(SOON, "zkq saw the client leave", || async { abandoned(zkq, route, method) > before }).await;
    held.release_deliver();
}

async fn queue_children(zkq_root: &str, zk: &ZkServer, queue: &str) -> Vec<String> {
    let direct = zk_client(zk).await;
    children(&direct, &format!("{zkq_root}/queues/{queue}")).await
}

/// An ack whose client left while its transaction was in flight is applied and recorded: the
/// message and its lock are gone, `zkq_messages_acked_total` counts it, and the client's retry
/// with the same receipt answers 204 (not 409 `lease_lost` "will be delivered again").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_whose_client_left_is_applied_recorded_and_its_retry_answers_204() {
    let zk = ZkServer::shared();
    let root = unique_root("abandoned-ack");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let zkq = TestZkq::start_ready(config_via(&proxy, &root)).await;
    zkq.put_ok("q", b"M").await;
    let receipt = lease_one(&zkq, "q").await;

    let route = "/v1/queues/{queue}/leases/{lease}";
    let request = zkq.http.delete(zkq.url(&format!("/v1/queues/q/leases/{receipt}")));
    abandon_while_held(&zkq, &proxy, request, route, "DELETE").await;

    eventually(SOON, "the ack applied in ZooKeeper", || async { queue_children(&root, zk, "q").await.is_empty() })
        .await;
    eventually(SOON, "the ack was counted", || async {
        metric_value(&zkq.metrics().await, "zkq_messages_acked_total{queue=\"q\"}") == Some(1.0)
    })
    .await;
    let retry = zkq.http.delete(zkq.url(&format!("/v1/queues/q/leases/{receipt}"))).send().await.expect("retry");
    assert_eq!(retry.status().as_u16(), 204, "the retry of an applied ack: {:?}", retry.text().await);
    let direct = zk_client(zk).await;
    assert!(children(&direct, &format!("{root}/locks/q")).await.is_empty(), "no lock is left behind");
    assert_eq!(zkq.take("q", "0").await.status().as_u16(), 204, "the acked message never comes back");
}

/// A requeueing nack whose client left is applied once: the message is back exactly once, and
/// the retry answers 204.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_whose_client_left_is_applied_once_and_its_retry_answers_204() {
    let zk = ZkServer::shared();
    let root = unique_root("abandoned-nack");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let zkq = TestZkq::start_ready(config_via(&proxy, &root)).await;
    zkq.put_ok("q", b"M").await;
    let receipt = lease_one(&zkq, "q").await;

    let route = "/v1/queues/{queue}/leases/{lease}/nack";
    let request = zkq.http.post(zkq.url(&format!("/v1/queues/q/leases/{receipt}/nack?mode=requeue")));
    abandon_while_held(&zkq, &proxy, request, route, "POST").await;

    eventually(SOON, "the nack was counted", || async {
        metric_value(&zkq.metrics().await, "zkq_messages_nacked_total{mode=\"requeue\",queue=\"q\"}") == Some(1.0)
    })
    .await;
    let url = zkq.url(&format!("/v1/queues/q/leases/{receipt}/nack?mode=requeue"));
    let retry = zkq.http.post(url).send().await.expect("retry");
    assert_eq!(retry.status().as_u16(), 204, "the retry of an applied nack: {:?}", retry.text().await);
    assert_eq!(zkq.take_body("q", "5s").await.as_deref(), Some(&b"M"[..]), "the message is back");
    assert_eq!(zkq.take("q", "0").await.status().as_u16(), 204, "and only once");
}

/// A batch ack whose client left: each ack applies, and the retried batch answers 204 for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_ack_whose_client_left_is_applied_and_its_retry_answers_204_per_entry() {
    let zk = ZkServer::shared();
    let root = unique_root("abandoned-acks");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let zkq = TestZkq::start_ready(config_via(&proxy, &root)).await;
    zkq.put_ok("q", b"M").await;
    let receipt = lease_one(&zkq, "q").await;

    let body = serde_json::json!({ "leases": [receipt] });
    let request = zkq.http.post(zkq.url("/v1/queues/q/acks")).json(&body);
    abandon_while_held(&zkq, &proxy, request, "/v1/queues/{queue}/acks", "POST").await;

    eventually(SOON, "the ack applied in ZooKeeper", || async { queue_children(&root, zk, "q").await.is_empty() })
        .await;
    let retry = zkq.http.post(zkq.url("/v1/queues/q/acks")).json(&body).send().await.expect("retry");
    assert_eq!(retry.status().as_u16(), 200);
    let answer: serde_json::Value = retry.json().await.expect("json");
    assert_eq!(answer["results"][0]["status"], 204, "the retried entry of an applied ack: {answer}");
    eventually(SOON, "the ack was counted", || async {
        metric_value(&zkq.metrics().await, "zkq_messages_acked_total{queue=\"q\"}") == Some(1.0)
    })
    .await;
}

/// Puts whose client left while their transaction was in flight are stored, and recorded as
/// stored: `zkq_messages_put_total` counts their messages (a put is counted once ZooKeeper
/// applied it, not once someone reads the answer), and a keyed put is carried to its end, so
/// that its retry replays the stored message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_whose_client_left_are_stored_and_counted() {
    let zk = ZkServer::shared();
    let root = unique_root("abandoned-puts");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let zkq = TestZkq::start_ready(config_via(&proxy, &root)).await;
    let messages = serde_json::json!({ "messages": [{ "text": "a" }, { "text": "b" }] });
    let put_route = "/v1/queues/{queue}/messages";
    let batch_route = "/v1/queues/{queue}/batch";
    // (queue, request, route, messages stored, nodes stored). A lone put is a plain create.
    let cases = [
        ("one", zkq.http.post(zkq.url("/v1/queues/one/messages")).body("m"), put_route, 1.0, 1),
        ("batch", zkq.http.post(zkq.url("/v1/queues/batch/batch")).json(&messages), batch_route, 2.0, 2),
        (
            "multi",
            zkq.http.post(zkq.url("/v1/queues/multi/batch?format=curator-multi")).json(&messages),
            batch_route,
            2.0,
            1,
        ),
        (
            "keyed",
            zkq.http.post(zkq.url("/v1/queues/keyed/messages")).header("Idempotency-Key", "k").body("m"),
            put_route,
            1.0,
            1,
        ),
    ];
    // So that the keyed put's first transaction is its own, not a first try that finds the
    // directory of its key's record missing.
    prepare_idempotency_buckets(&zk_client(zk).await, &root, "keyed").await;
    for (queue, request, route, counted, nodes) in cases {
        // The queue's node (and its keys' directory) exists, so that the held request is the
        // put's own.
        let warm_up = zkq.http.post(zkq.url(&format!("/v1/queues/{queue}/messages")));
        let warm_up = warm_up.header("Idempotency-Key", "warm-up").body("first").send().await.expect("warm-up");
        assert_eq!(warm_up.status().as_u16(), 201);
        assert_eq!(zkq.take_body(queue, "5s").await.as_deref(), Some(&b"first"[..]));
        let series = format!("zkq_messages_put_total{{queue=\"{queue}\"}}");
        abandon_while_op_held(&zkq, &proxy, &[op::CREATE, op::CREATE2, op::MULTI], request, route, "POST").await;

        eventually(SOON, &format!("{queue}: the put is stored"), || async {
            queue_children(&root, zk, queue).await.len() == nodes
        })
        .await;
        eventually(SOON, &format!("{queue}: the put is counted"), || async {
            metric_value(&zkq.registered_metrics(), &series) == Some(1.0 + counted)
        })
        .await;
    }
    let retry = zkq.http.post(zkq.url("/v1/queues/keyed/messages")).header("Idempotency-Key", "k").body("m");
    let retry = retry.send().await.expect("retry");
    assert_eq!(retry.status().as_u16(), 201);
    assert_eq!(retry.headers().get("zkq-idempotent-replay").and_then(|v| v.to_str().ok()), Some("true"));
    assert_eq!(queue_children(&root, zk, "keyed").await.len(), 1, "the retry stored nothing more");
}

/// A keyed put whose client left before it sent anything (it waited for room in a full queue)
/// stops there: it holds nothing, and when room comes it stores nothing the client gave up on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_put_whose_client_left_while_it_waited_for_room_stores_nothing() {
    let zk = ZkServer::shared();
    let root = unique_root("abandoned-keyed-wait");
    let mut config = test_config(zk, &root);
    declare(&mut config, "full", zkq::config::QueueKind::Fifo, None, None);
    if let Some(queue) = config.queues.values_mut().next() {
        queue.max_items = Some(1);
    }
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("full", b"first").await;

    let url = zkq.url("/v1/queues/full/messages?wait=20s");
    let request = zkq.http.post(url).header("Idempotency-Key", "k").body("given up");
    let client = tokio::spawn(async move { request.send().await });
    let waiting = "zkq_puts_in_flight{queue=\"full\"}";
    eventually(SOON, "the keyed put waits for room", || async {
        metric_value(&zkq.registered_metrics(), waiting) == Some(1.0)
    })
    .await;
    client.abort();
    let _ = client.await;
    eventually(SOON, "zkq saw the client leave", || async {
        abandoned(&zkq, "/v1/queues/{queue}/messages", "POST") >= 1.0
    })
    .await;
    // Room comes right after the client left: the put must not take it.
    assert_eq!(zkq.take_body("full", "5s").await.as_deref(), Some(&b"first"[..]), "room now");
    eventually(SOON, "the keyed put is over", || async {
        metric_value(&zkq.registered_metrics(), waiting) == Some(0.0)
    })
    .await;
    assert_eq!(zkq.take("full", "0").await.status().as_u16(), 204, "the put its client gave up on was not stored");
}
