//! Weather: a slow ZooKeeper, connections cut, a session coming back, a queue node that goes
//! away. Each is normal, and each request still gets the answer it would get on a calm day.

use std::time::{Duration, Instant};

use zkq_testkit::proxy::{Fault, ZkProxy, op};
use zkq_testkit::*;

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

fn mode(mode: zookeeper_client::CreateMode) -> zookeeper_client::CreateOptions<'static> {
    mode.with_acls(zookeeper_client::Acls::anyone_all())
}

async fn node_exists(client: &zookeeper_client::Client, path: &str) -> bool {
    client.check_stat(path).await.expect("exists").is_some()
}

/// Cuts zkq's connection and waits until its refresher read `queue` again.
async fn reconnect_and_reread(zkq: &TestZkq, proxy: &ZkProxy, queue: &str) {
    let series = format!("zkq_queue_children_reads_total{{queue=\"{queue}\"}}");
    let reads = metric(zkq, &series).await;
    proxy.cut();
    eventually(SOON, "the refresher read the queue again", || async { metric(zkq, &series).await > reads }).await;
}

/// A declared queue belongs to whoever made its node (Curator's `start()`, or a put): zkq does
/// not create it when it starts, nor bring it back once it is gone (deleted, or a Curator
/// container that ZooKeeper reaped when it emptied). Meanwhile a take answers 204 (after its
/// barrier) and a long-poll notices the node when a Curator producer makes it again. Before, the
/// refresher created the node at start, after every new session and after every read that found
/// it missing, as a persistent node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_queue_whose_node_is_gone_is_not_brought_back_and_its_return_is_noticed() {
    let zk = ZkServer::shared();
    let root = unique_root("weather-declared-gone");
    let app = format!("{root}-app");
    let path = format!("{app}/queues/d");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let mut config = test_config(&proxy, &root);
    config.zookeeper.session_timeout = Duration::from_secs(20);
    declare(&mut config, "d", zkq::config::QueueKind::Fifo, Some(&path), Some(&format!("{app}/locks/d")));
    let zkq = TestZkq::start_ready(config).await;
    let direct = zk_client(zk).await;

    eventually(SOON, "the first read of d", || async {
        metric(&zkq, "zkq_queue_children_reads_total{queue=\"d\"}").await >= 1.0
    })
    .await;
    assert!(!node_exists(&direct, &path).await, "zkq created the declared queue's node when it started");
    assert_eq!(zkq.take("d", "0s").await.status(), 204, "no node: nothing to deliver");
    assert!(!node_exists(&direct, &path).await, "a take created the node");

    // A Curator producer makes the queue (parents as containers, the queue node as `start()`
    // does) and puts a message: a long-poll waiting meanwhile receives it.
    let long_poll = spawn_take(&zkq, "d", "10s");
    eventually(SOON, "the long-poll waits", || async { metric(&zkq, "zkq_waiting_takers{queue=\"d\"}").await >= 1.0 })
        .await;
    for parent in [app.clone(), format!("{app}/queues")] {
        direct.create(&parent, b"", &mode(zookeeper_client::CreateMode::Container)).await.expect("parent");
    }
    direct.create(&path, b"127.0.0.1", &mode(zookeeper_client::CreateMode::Persistent)).await.expect("queue node");
    let item = zkq::envelope::encode([b"from Curator".as_slice()]);
    direct
        .create(&format!("{path}/queue-"), &item, &mode(zookeeper_client::CreateMode::PersistentSequential))
        .await
        .expect("item");
    let (status, body) = long_poll.await.expect("join");
    assert_eq!((status, String::from_utf8_lossy(&body).into_owned()), (200, "from Curator".to_owned()));

    // The node goes away; a reconnect and the reads after it do not bring it back.
    direct.delete(&path, None).await.expect("delete the empty queue node");
    reconnect_and_reread(&zkq, &proxy, "d").await;
    assert!(!node_exists(&direct, &path).await, "zkq brought the deleted queue node back");
    assert_eq!(zkq.take("d", "0s").await.status(), 204, "gone: nothing to deliver");
    assert!(!node_exists(&direct, &path).await, "a take brought the node back");

    // A put makes it again.
    zkq.put_ok("d", b"put").await;
    assert_eq!(drain(&zkq, "d").await, ["put"]);
}

/// Only a put creates a dynamic queue: once its node is deleted, zkq (which still has the queue
/// open) does not create it again on a reconnect; its takes answer 204; the next put does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_dynamic_queue_stays_deleted_until_the_next_put() {
    let zk = ZkServer::shared();
    let root = unique_root("weather-dynamic-gone");
    let path = format!("{root}/queues/q");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let mut config = test_config(&proxy, &root);
    config.zookeeper.session_timeout = Duration::from_secs(20);
    let zkq = TestZkq::start_ready(config).await;
    let direct = zk_client(zk).await;
    zkq.put_ok("q", b"first").await;
    assert_eq!(drain(&zkq, "q").await, ["first"]);

    direct.delete(&path, None).await.expect("delete the empty queue node");
    reconnect_and_reread(&zkq, &proxy, "q").await;
    assert!(!node_exists(&direct, &path).await, "zkq brought the deleted queue back");
    assert_eq!(zkq.take("q", "0s").await.status(), 204);
    assert!(!node_exists(&direct, &path).await, "a take brought the deleted queue back");

    zkq.put_ok("q", b"second").await;
    assert!(node_exists(&direct, &path).await, "a put creates the queue");
    assert_eq!(drain(&zkq, "q").await, ["second"]);
}

/// A Curator `SimpleDistributedQueue` keeps its directory as a container, which ZooKeeper
/// removes once it empties. zkq leaves it so: it does not bring a reaped directory back, and a
/// put that must make it again makes a container too (that ZooKeeper reaps again). Before, the
/// refresher made it again at the next read, persistent, and ZooKeeper never reaped it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_container_queue_node_stays_a_container() {
    let options =
        ServerOptions { jvm_args: vec!["-Dznode.container.checkIntervalMs=100".to_owned()], ..Default::default() };
    let zk = ZkServer::start_with(options);
    let root = unique_root("weather-container");
    let app = format!("{root}-app");
    let path = format!("{app}/sq");
    let direct = zk_client(&zk).await;
    for dir in [&app, &path] {
        direct.create(dir, b"", &mode(zookeeper_client::CreateMode::Container)).await.expect("Curator's directory");
    }
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let mut config = test_config(&proxy, &root);
    config.zookeeper.session_timeout = Duration::from_secs(20);
    declare(&mut config, "sq", zkq::config::QueueKind::Simple, Some(&path), None);
    let zkq = TestZkq::start_ready(config).await;

    for round in ["while Curator's container exists", "after it was reaped"] {
        zkq.put_ok("sq", round.as_bytes()).await;
        assert_eq!(drain(&zkq, "sq").await, [round]);
        eventually(SOON, &format!("ZooKeeper reaps the emptied container ({round})"), || async {
            !node_exists(&direct, &path).await
        })
        .await;
        reconnect_and_reread(&zkq, &proxy, "sq").await;
        assert!(!node_exists(&direct, &path).await, "zkq brought the reaped queue directory back ({round})");
        assert_eq!(zkq.take("sq", "0s").await.status(), 204);
    }
}
