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

const FAILED_CLAIMS: &[&str] = &[
    r#"zkq_claim_attempts_total{outcome="lost",queue="q"}"#,
    r#"zkq_claim_attempts_total{outcome="gone",queue="q"}"#,
    r#"zkq_claim_attempts_total{outcome="locked",queue="q"}"#,
];
const FLEET_MEMBERS: &str = r#"zkq_queue_fleet_members{queue="q"}"#;

/// Lease consumers that ack what they get, until `stop`; what they got, in order.
fn lease_consumers(
    api: &Api,
    n: usize,
    stop: &tokio_util::sync::CancellationToken,
    acked: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> tokio::task::JoinSet<Vec<Vec<u8>>> {
    let mut consumers = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (api, stop, acked) = (api.clone(), stop.clone(), acked.clone());
        consumers.spawn(async move {
            let mut got = Vec::new();
            while !stop.is_cancelled() {
                let lease = tokio::select! {
                    lease = api.lease("q", "wait=1s") => lease,
                    _ = stop.cancelled() => break,
                };
                if lease.status != 200 {
                    continue;
                }
                assert_eq!(api.ack("q", &lease.receipt).await.status, 204, "a fresh lease is acked");
                got.push(lease.body.clone());
                acked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            got
        });
    }
    consumers
}

/// Four sidecars, each with two consumers waiting in a long-poll, and messages put one at a
/// time: each message is claimed by one sidecar, the one that owns it, instead of every
/// sidecar with a waiting consumer racing for it (2 to 3 failed claims per message at four
/// sidecars before). Every message is still delivered and acked exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_sidecars_with_waiting_consumers_claim_each_message_once_instead_of_racing() {
    const K: usize = 4;
    const N: usize = 40;
    let zk = ZkServer::shared();
    let root = unique_root("fleet-owners");
    let mut sidecars = Vec::new();
    for _ in 0..K {
        sidecars.push(TestZkq::start_ready(test_config(zk, &root)).await);
    }
    // The queue exists before the consumers wait on it.
    sidecars[0].put_ok("q", b"first").await;
    let stop = tokio_util::sync::CancellationToken::new();
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut consumers: Vec<_> = sidecars.iter().map(|s| lease_consumers(&s.client(), 2, &stop, &acked)).collect();
    eventually(Duration::from_secs(20), "every sidecar sees the four members", || async {
        let mut all = true;
        for sidecar in &sidecars {
            all &= metric(&sidecar.metrics().await, FLEET_MEMBERS) == K as f64;
        }
        all && acked.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    let failed_before = failed_claims(&sidecars).await;
    for i in 0..N {
        sidecars[i % K].put_ok("q", format!("m{i}").as_bytes()).await;
        eventually(Duration::from_secs(20), "the message is delivered and acked", || async {
            acked.load(std::sync::atomic::Ordering::SeqCst) == i + 2
        })
        .await;
    }
    stop.cancel();
    let mut bodies = Vec::new();
    for set in &mut consumers {
        while let Some(got) = set.join_next().await {
            bodies.extend(got.expect("a consumer"));
        }
    }
    bodies.sort();
    let mut want: Vec<Vec<u8>> = (0..N).map(|i| format!("m{i}").into_bytes()).chain([b"first".to_vec()]).collect();
    want.sort();
    assert_eq!(bodies, want, "every message delivered exactly once");
    let failed = failed_claims(&sidecars).await - failed_before;
    eprintln!("{failed} failed claims for {N} messages at {K} sidecars");
    assert!(failed <= (N / 4) as f64, "{failed} failed claims for {N} messages at {K} sidecars");
}

async fn failed_claims(sidecars: &[TestZkq]) -> f64 {
    let mut failed = 0.0;
    for sidecar in sidecars {
        let text = sidecar.metrics().await;
        failed += FAILED_CLAIMS.iter().map(|series| metric(&text, series)).sum::<f64>();
    }
    failed
}
