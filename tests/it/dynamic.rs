//! Dynamic queues this sidecar has not opened yet, created by another sidecar: the first request
//! that finds one must neither answer from a lagging server's past nor break the cache it opens.

use std::time::Duration;

use zkq_testkit::proxy::{ZkProxy, op};
use zkq_testkit::*;

/// Many long-polls wait on sidecar A for a queue that does not exist yet; sidecar B creates it
/// with a put. Once A has opened the queue, its cache must keep seeing B's puts: each later put
/// answered 201 on B is taken at once on A (`wait=0`, vouched by a barrier). On ZooKeeper before
/// 3.9 (the shared test server is 3.8), a one-shot watch on the queue path dropped unfired would
/// remove the cache's persistent watch too (ZOOKEEPER-4466), and A would answer 204.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiters_for_a_queue_another_sidecar_creates_leave_its_cache_watching() {
    const WAITERS: usize = 40;
    let zk = ZkServer::shared();
    let root = unique_root("dyn-waiters");
    let [a, b] = TestZkq::fleet(test_config(zk, &root)).await;
    let port: u16 = zk.connect_string().rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
    for round in 0..3 {
        let queue = format!("fresh{round}");
        let waiters: Vec<_> = (0..WAITERS)
            .map(|_| {
                let (http, url) = (a.http.clone(), a.url(&format!("/v1/queues/{queue}/take?wait=20s")));
                tokio::spawn(async move { http.post(url).send().await.expect("take").status().as_u16() })
            })
            .collect();
        // The waiters are waiting on A: the queue path is watched (its exists watch).
        let path = format!("{root}/queues/{queue}");
        eventually(Duration::from_secs(30), "A's waiters watch the queue path", || async {
            four_letter(port, "wchp").is_some_and(|watches| watches.lines().any(|line| line == path))
        })
        .await;
        // One batch creates the queue and its messages in one request, so the waiters' 20 s
        // are not spent on 40 puts when the machine is loaded.
        let messages: Vec<serde_json::Value> =
            (0..WAITERS).map(|i| serde_json::json!({ "text": format!("{queue}-m{i}") })).collect();
        let response = b
            .http
            .post(b.url(&format!("/v1/queues/{queue}/batch")))
            .json(&serde_json::json!({ "messages": messages }))
            .send()
            .await
            .expect("batch put");
        assert_eq!(response.status().as_u16(), 201, "B's batch put");
        let mut statuses: Vec<u16> = Vec::new();
        for waiter in waiters {
            statuses.push(waiter.await.expect("join"));
        }
        assert!(statuses.iter().all(|s| *s == 200), "every waiter got a message: {statuses:?}");
        for i in 0..5 {
            b.put_ok(&queue, format!("{queue}-later{i}").as_bytes()).await;
            let taken = a.take_body(&queue, "0").await;
            assert_eq!(
                taken.as_deref(),
                Some(format!("{queue}-later{i}").as_bytes()),
                "a put answered 201 on B before A's take is taken by it (A's cache still sees B's puts)"
            );
        }
    }
}

/// "No such queue" is decided only after a `sync`: a take or lease on a queue this sidecar has
/// not opened reads its absence through a sync, so a lagging server cannot hide a queue another
/// sidecar created (with a put answered 201) before the request arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_absence_of_a_queue_not_open_here_is_read_after_a_sync() {
    let zk = ZkServer::shared();
    let root = unique_root("dyn-sync");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(test_config(&proxy, &root)).await;
    for (verb, query) in [("take", "wait=0"), ("leases", "wait=0"), ("take", "wait=1s")] {
        let syncs = proxy.count(op::SYNC);
        let response = a.http.post(a.url(&format!("/v1/queues/absent/{verb}?{query}"))).send().await.expect("request");
        assert_eq!(response.status(), 204, "{verb}?{query} on a queue nobody created");
        assert!(proxy.count(op::SYNC) > syncs, "{verb}?{query}: the absence was read without a sync");
    }
}
