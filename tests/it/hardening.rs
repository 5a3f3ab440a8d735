//! Hardening: no node in ZooKeeper and no HTTP request can wedge, bloat or mislead zkq.

use std::time::{Duration, Instant};

use zkq::config::QueueKind;

use crate::harness::*;

/// A child whose name has a multi-byte character right after `queue-` used to panic the
/// priority parser inside the cache refresher: takes then waited 10 s and answered 204.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_non_ascii_child_does_not_wedge_a_priority_queue() {
    let zk = ZkServer::shared();
    let root = unique_root("foreign-utf8");
    let mut config = test_config(zk, &root);
    declare(&mut config, "p", QueueKind::Priority, None, None);
    let direct = zk_client(zk).await;
    let persistent = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    for path in
        [root.clone(), format!("{root}/queues"), format!("{root}/queues/p"), format!("{root}/queues/p/queue-é0000000")]
    {
        direct.create(&path, b"foreign", &persistent).await.expect("create");
    }
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("p", b"before").await;

    let started = Instant::now();
    assert_eq!(zkq.take_body("p", "0s").await.as_deref(), Some(b"before".as_slice()));
    let took = started.elapsed();
    println!("take with wait=0s next to the foreign node answered in {took:?}");
    assert!(took < Duration::from_secs(5), "take with wait=0s took {took:?}");

    let peek = zkq.http.get(zkq.url("/v1/queues/p/messages?limit=10")).send().await.expect("peek");
    assert_eq!(peek.status(), 200, "peek next to a foreign node");

    for (priority, body) in [(5, "five"), (-3, "minus three"), (0, "zero")] {
        let put = zkq
            .http
            .post(zkq.url(&format!("/v1/queues/p/messages?priority={priority}")))
            .body(body)
            .send()
            .await
            .expect("put");
        assert_eq!(put.status(), 201);
    }
    for expected in ["minus three", "zero", "five"] {
        let started = Instant::now();
        assert_eq!(zkq.take_body("p", "0s").await.as_deref(), Some(expected.as_bytes()));
        assert!(started.elapsed() < Duration::from_secs(5), "take took {:?}", started.elapsed());
    }
    // A message only the refresher can see: written by another producer, straight to ZooKeeper.
    let sequential = zookeeper_client::CreateMode::PersistentSequential.with_acls(zookeeper_client::Acls::anyone_all());
    let envelope = zkq::queue::envelope::encode([b"from elsewhere".as_slice()]);
    direct.create(&format!("{root}/queues/p/queue-100000001"), &envelope, &sequential).await.expect("put elsewhere");
    let started = Instant::now();
    assert_eq!(zkq.take_body("p", "2s").await.as_deref(), Some(b"from elsewhere".as_slice()));
    println!("a message put elsewhere was taken after {:?}", started.elapsed());
    assert_eq!(zkq.take_body("p", "0s").await, None);
    let remaining = children(&direct, &format!("{root}/queues/p")).await;
    assert_eq!(remaining, ["queue-é0000000"], "takes skip the node and leave it in place");
    // Asked for by name, it is removed like any other queue- node.
    let deleted = zkq.http.delete(zkq.url("/v1/queues/p/messages/queue-%C3%A90000000")).send().await.expect("delete");
    assert_eq!(deleted.status(), 204, "{}", deleted.text().await.unwrap_or_default());
    assert!(children(&direct, &format!("{root}/queues/p")).await.is_empty());
    assert!(zkq.metrics().await.contains("zkq_background_task_restarts_total{task=\"cache_refresher\"} 0"));
}
