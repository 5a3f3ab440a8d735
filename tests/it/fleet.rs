//! Many sidecars on one queue: what ZooKeeper spends on a sidecar must follow its own demand,
//! not the queue's traffic.

use std::time::Duration;

use zkq_testkit::*;

const WATCH_EVENTS: &str = r#"zkq_queue_watch_events_total{queue="q"}"#;

/// With `queues_watch_on_demand`, a sidecar that only puts holds no watch on the queue's children
/// and locks, so the queue's traffic sends it nothing; every sidecar that had touched a queue used to receive every event
/// of it. Its first taker brings the watch back before it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_that_only_puts_receives_no_event_of_the_queue_until_it_takes() {
    let zk = ZkServer::shared();
    let root = unique_root("fleet-producer");
    let on_demand = || {
        let mut config = test_config(zk, &root);
        config.queues_watch_on_demand = true;
        config
    };
    let producer = TestZkq::start_ready(on_demand()).await;
    let consumer = TestZkq::start_ready(on_demand()).await;
    let (puts, leases) = (producer.client(), consumer.client());
    for i in 0..20 {
        assert_eq!(puts.put("q", "", format!("m{i}").as_bytes()).await.status, 201);
        let lease = leases.lease("q", "wait=5s").await;
        assert_eq!(lease.status, 200, "{}", lease.text());
        assert_eq!(leases.ack("q", &lease.receipt).await.status, 204);
    }
    // Every put, lock and ack reached the consumer as events (the series counts them) ...
    assert!(metric(&consumer.metrics().await, WATCH_EVENTS) >= 60.0, "the consumer follows the queue");
    // ... and none reached the sidecar that only put.
    assert_eq!(metric(&producer.metrics().await, WATCH_EVENTS), 0.0, "the producer received the queue's events");

    // A take on the producer watches the queue again: it sees a put acknowledged elsewhere first.
    assert_eq!(leases.put("q", "", b"late").await.status, 201);
    assert_eq!(producer.take_body("q", "5s").await.as_deref(), Some(b"late".as_slice()));
    consumer.put_ok("q", b"later").await;
    eventually(Duration::from_secs(10), "the producer's cache follows the queue again", || async {
        metric(&producer.metrics().await, WATCH_EVENTS) > 0.0
    })
    .await;
    assert_eq!(producer.take_body("q", "5s").await.as_deref(), Some(b"later".as_slice()));
}
