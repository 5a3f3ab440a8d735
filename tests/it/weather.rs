//! Weather: a slow ZooKeeper, connections cut, a session coming back, a queue node that goes
//! away. Each is normal, and each request still gets the answer it would get on a calm day.

use std::time::{Duration, Instant};

use crate::harness::*;
use crate::proxy::{Fault, ZkProxy, op};

/// Bound on waiting for something that happens at once.
const SOON: Duration = Duration::from_secs(10);

/// A put's status and error code.
async fn put_answer(http: reqwest::Client, url: String, body: &'static [u8]) -> (u16, String) {
    let response = http.post(url).body(body).send().await.expect("put");
    let status = response.status().as_u16();
    let json: serde_json::Value = response.json().await.unwrap_or(serde_json::Value::Null);
    (status, json["code"].as_str().unwrap_or_default().to_owned())
}

fn spawn_put(zkq: &TestZkq, queue: &str, body: &'static [u8]) -> tokio::task::JoinHandle<(u16, String)> {
    let (http, url) = (zkq.http.clone(), zkq.url(&format!("/v1/queues/{queue}/messages")));
    tokio::spawn(put_answer(http, url, body))
}

async fn metric(zkq: &TestZkq, series: &str) -> f64 {
    metric_value(&zkq.metrics().await, series).unwrap_or(0.0)
}

/// Every message of `queue`, taken until the first 204.
async fn drain(zkq: &TestZkq, queue: &str) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(body) = zkq.take_body(queue, "0s").await {
        out.push(String::from_utf8_lossy(&body).into_owned());
    }
    out
}

/// Two puts, to different queues, travel in one transaction; one of them is nearly at its
/// deadline (it waited: for room under `max_items`, or here for a transaction while both slots
/// were busy) and ZooKeeper answers after that
/// deadline. The late put alone may answer 504; the other must get its 201, and each message is
/// stored once. Before, the transaction was bounded by the earliest deadline of its units, so
/// both answered 504 although both were stored (and a retry of the unkeyed put duplicated it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_late_for_its_deadline_does_not_make_the_other_puts_of_its_transaction_unknown() {
    let zk = ZkServer::shared();
    let root = unique_root("weather-late-unit");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let mut config = test_config(&proxy, &root);
    // Each hold below stops the connection's pings too: it must stay shorter than the time the
    // client waits for a sign of life (5 s), and the first shorter than the held puts' deadline.
    config.zookeeper.session_timeout = Duration::from_secs(20);
    config.zookeeper.request_timeout = Duration::from_secs(5);
    let request_timeout = config.zookeeper.request_timeout;
    let zkq = TestZkq::start_ready(config).await;
    for queue in ["busy", "late", "other"] {
        zkq.put_ok(queue, b"warm-up").await;
        assert_eq!(drain(&zkq, queue).await, ["warm-up"], "{queue} is open and empty");
    }

    // Both transaction slots busy: the first put is held at the proxy, the second behind it.
    let sent_before = metric(&zkq, "zkq_group_commit_units_count").await;
    let held = proxy.arm(op::CREATES, Fault::Hold);
    let mut busy = vec![spawn_put(&zkq, "busy", b"b1")];
    tokio::time::timeout(SOON, held.held()).await.expect("the first put reached the proxy");
    busy.push(spawn_put(&zkq, "busy", b"b2"));
    eventually(SOON, "two transactions in flight", || async {
        metric(&zkq, "zkq_group_commit_units_count").await >= sent_before + 2.0
    })
    .await;

    // The late put waits for a transaction while its deadline runs; the other comes later: what
    // makes the first one late is the time a scrape of /metrics takes while ZooKeeper does not
    // answer (its reads give up after 1 s).
    let late_started = Instant::now();
    let late = spawn_put(&zkq, "late", b"L");
    eventually(SOON, "the late put is waiting", || async {
        metric(&zkq, "zkq_puts_in_flight{queue=\"late\"}").await >= 1.0
    })
    .await;
    let other = spawn_put(&zkq, "other", b"N");
    eventually(SOON, "the other put is waiting", || async {
        metric(&zkq, "zkq_puts_in_flight{queue=\"other\"}").await >= 1.0
    })
    .await;

    // The next transaction carries both; ZooKeeper answers it after the late put's deadline.
    let multi = proxy.arm(&[op::MULTI], Fault::Hold);
    held.release_deliver();
    tokio::time::timeout(SOON, multi.held()).await.expect("the late and the other put travel in one transaction");
    let late = late.await.expect("join");
    let late_took = late_started.elapsed();
    assert!(
        late_took < request_timeout + Duration::from_secs(1),
        "the late put answers by its own deadline ({late_took:?}): {late:?}"
    );
    multi.release_deliver();
    let other = other.await.expect("join");

    assert_eq!(other, (201, String::new()), "the other put is stored and says so (the late one answered {late:?})");
    assert_eq!(late, (504, "outcome_unknown".to_owned()), "the late put's answer came after its deadline");
    for put in busy {
        assert_eq!(put.await.expect("join").0, 201, "the puts held in the first transactions");
    }
    assert_eq!(drain(&zkq, "other").await, ["N"], "stored once");
    assert_eq!(drain(&zkq, "late").await, ["L"], "applied once, although its caller was told 504");
    let mut busy_bodies = drain(&zkq, "busy").await;
    busy_bodies.sort();
    assert_eq!(busy_bodies, ["b1", "b2"]);
}

async fn take_answer(http: reqwest::Client, url: String) -> (u16, Vec<u8>) {
    let response = http.post(url).send().await.expect("take");
    let status = response.status().as_u16();
    (status, response.bytes().await.map(|b| b.to_vec()).unwrap_or_default())
}

fn spawn_take(zkq: &TestZkq, queue: &str, wait: &str) -> tokio::task::JoinHandle<(u16, Vec<u8>)> {
    let (http, url) = (zkq.http.clone(), zkq.url(&format!("/v1/queues/{queue}/take?wait={wait}")));
    tokio::spawn(take_answer(http, url))
}

/// A taker about to answer "empty" asks for a barrier (a `sync` of the queue path); that `sync`
/// is lost with its connection, and the session is back within milliseconds. The barrier must be
/// run again then: a long-poll receives the message put meanwhile, and a take without wait
/// answers 204 (the queue is empty, and zkq knows it) well before its deadline. Before, a failed
/// barrier was never asked again: both waited for their deadline and answered 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_barrier_lost_with_its_connection_is_run_again_once_the_session_is_back() {
    let zk = ZkServer::shared();
    let root = unique_root("weather-barrier");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let mut config = test_config(&proxy, &root);
    config.zookeeper.session_timeout = Duration::from_secs(20);
    let request_timeout = config.zookeeper.request_timeout;
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("q", b"warm-up").await;
    assert_eq!(drain(&zkq, "q").await, ["warm-up"], "the queue is open and empty");

    // A long-poll: its barrier's sync never reaches ZooKeeper, its connection is closed.
    let wait = Duration::from_secs(8);
    let connections = proxy.connections_accepted();
    let lost = proxy.arm(&[op::SYNC], Fault::DropBeforeSend);
    let started = Instant::now();
    let long_poll = spawn_take(&zkq, "q", &format!("{}s", wait.as_secs()));
    tokio::time::timeout(SOON, lost.fired()).await.expect("the barrier's sync reached the proxy");
    // zkq reconnects on its own (the same session); then a message arrives.
    eventually(SOON, "zkq reconnected", || async { proxy.connections_accepted() > connections }).await;
    zkq.wait_ready().await;
    zkq.put_ok("q", b"M").await;
    let (status, body) = long_poll.await.expect("join");
    let took = started.elapsed();
    assert_eq!(
        (status, String::from_utf8_lossy(&body).into_owned()),
        (200, "M".to_owned()),
        "the long-poll receives the message put after the session came back ({took:?})"
    );
    assert!(took < wait, "answered when the message came, not at the end of its wait ({took:?})");

    // A take without wait on the empty queue: its barrier is lost the same way.
    let syncs_before = proxy.count(op::SYNC);
    let lost = proxy.arm(&[op::SYNC], Fault::DropBeforeSend);
    let started = Instant::now();
    let take = spawn_take(&zkq, "q", "0s");
    tokio::time::timeout(SOON, lost.fired()).await.expect("the barrier's sync reached the proxy");
    let (status, body) = take.await.expect("join");
    let took = started.elapsed();
    assert_eq!(
        (status, String::from_utf8_lossy(&body).into_owned()),
        (204, String::new()),
        "empty, known from a barrier run once the session was back ({took:?})"
    );
    assert!(took < request_timeout, "answered once the session was back, not at the deadline ({took:?})");
    assert!(proxy.count(op::SYNC) > syncs_before, "the barrier that vouched for it reached ZooKeeper");
}
