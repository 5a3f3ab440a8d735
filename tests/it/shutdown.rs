//! Graceful shutdown of the real binary: SIGTERM under load loses nothing.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zkq_testkit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_confirms_every_put_and_answers_waiters() {
    let zk = ZkServer::shared();
    let root = unique_root("sigterm");
    let zkq = ChildZkq::start(zk, &root, &[("ZKQ__SHUTDOWN__GRACE", "10s")]).await;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("client");
    let (api_url, admin_url) = (zkq.api.clone(), zkq.admin.clone());

    // Load: 16 putters in a loop, 4 takers long-polling an empty queue.
    let confirmed = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut putters = tokio::task::JoinSet::new();
    for p in 0..16 {
        let (http, url, confirmed) = (http.clone(), format!("{api_url}/v1/queues/load/messages"), confirmed.clone());
        putters.spawn(async move {
            for i in 0.. {
                let body = format!("p{p}-{i}");
                match http.post(&url).body(body.clone()).send().await {
                    Ok(r) if r.status() == 201 => confirmed.lock().expect("lock").push(body),
                    Ok(r) => assert!(r.status() == 503, "a put during shutdown answered {}", r.status()),
                    Err(_) => return, // listener closed
                }
            }
        });
    }
    let mut takers = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (http, url) = (http.clone(), format!("{api_url}/v1/queues/idle/take?wait=20s"));
        takers.spawn(async move {
            let started = Instant::now();
            let status = http.post(url).send().await.map(|r| r.status().as_u16()).unwrap_or(0);
            (status, started)
        });
    }
    eventually(Duration::from_secs(10), "load running", || async { confirmed.lock().expect("lock").len() > 50 }).await;
    // Two messages leased for 10 minutes, never acked.
    for body in ["leased-1", "leased-2"] {
        let put = http.post(format!("{api_url}/v1/queues/held/messages")).body(body).send().await.expect("put");
        assert_eq!(put.status(), 201);
        let leased = http.post(format!("{api_url}/v1/queues/held/leases?visibility=10m")).send().await.expect("lease");
        assert_eq!(leased.status(), 200);
    }

    let signalled = Instant::now();
    zkq.signal("TERM");
    // Not ready at once (503 while it still answers).
    eventually(Duration::from_secs(2), "readyz 503 after SIGTERM", || {
        let (http, url) = (http.clone(), format!("{admin_url}/readyz"));
        async move { http.get(url).send().await.map_or(true, |r| r.status() == 503) }
    })
    .await;
    while let Some(answer) = takers.join_next().await {
        let (status, _) = answer.expect("taker");
        assert!(status == 204 || status == 503 || status == 0, "a waiting take answered {status}");
    }
    assert!(signalled.elapsed() < Duration::from_secs(5), "waiters were answered promptly");
    let exit = zkq.wait().await;
    assert_eq!(exit.code(), Some(0), "clean exit");
    assert!(signalled.elapsed() < Duration::from_secs(12), "exited within the grace period");
    while putters.join_next().await.is_some() {}

    // The leases were released with the session: their messages are delivered again at once,
    // not after the 30 s session timeout.
    let mut config = test_config(zk, &root);
    config.log.level = "warn".into();
    let other = TestZkq::start_ready(config).await;
    let redelivered = Instant::now();
    for _ in 0..2 {
        let leased = other.http.post(other.url("/v1/queues/held/leases?wait=5s")).send().await.expect("lease");
        assert_eq!(leased.status(), 200, "a message leased at shutdown is delivered again");
        assert_eq!(leased.headers()["zkq-delivery-count"], "2");
    }
    assert!(redelivered.elapsed() < Duration::from_secs(5), "redelivered at once: {:?}", redelivered.elapsed());

    // Every put answered 201 is in ZooKeeper.
    let direct = zk_client(zk).await;
    let mut stored = HashSet::new();
    for name in children(&direct, &format!("{root}/queues/load")).await {
        let (data, _) = direct.get_data(&format!("{root}/queues/load/{name}")).await.expect("data");
        for item in zkq::envelope::decode(&data).expect("envelope") {
            stored.insert(String::from_utf8(item).expect("utf8"));
        }
    }
    let confirmed = confirmed.lock().expect("lock").clone();
    assert!(!confirmed.is_empty());
    for body in &confirmed {
        assert!(stored.contains(body), "{body} was confirmed with 201 but is not in ZooKeeper");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_zookeeper_outage_answers_waiting_long_polls_at_once() {
    let zk = ZkServer::start();
    let root = unique_root("sigterm-outage");
    let zkq = ChildZkq::start(&zk, &root, &[("ZKQ__SHUTDOWN__GRACE", "5s")]).await;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("client");
    let put = http.post(format!("{}/v1/queues/q/messages", zkq.api)).body("kept").send().await.expect("put");
    assert_eq!(put.status(), 201);
    zk.stop();
    eventually(Duration::from_secs(20), "readyz 503 while ZooKeeper is down", || {
        let (http, url) = (http.clone(), format!("{}/readyz", zkq.admin));
        async move { http.get(url).send().await.is_ok_and(|r| r.status() == 503) }
    })
    .await;
    // Long-polls that arrive during the outage: a take and a lease on a queue holding a message.
    let mut waiting = tokio::task::JoinSet::new();
    for route in ["take?wait=20s", "leases?wait=20s", "take?wait=20s"] {
        let (http, url) = (http.clone(), format!("{}/v1/queues/q/{route}", zkq.api));
        waiting.spawn(async move {
            let response = http.post(url).send().await.expect("an answer, not a dropped connection");
            let status = response.status().as_u16();
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            (status, body["code"].as_str().unwrap_or("").to_owned())
        });
    }
    eventually(Duration::from_secs(10), "three long-polls waiting", || {
        let (http, url) = (http.clone(), format!("{}/metrics", zkq.admin));
        async move {
            let Ok(response) = http.get(url).send().await else { return false };
            response.text().await.unwrap_or_default().contains("zkq_waiting_takers{queue=\"q\"} 3")
        }
    })
    .await;
    let signalled = Instant::now();
    zkq.signal("TERM");
    while let Some(answer) = waiting.join_next().await {
        let (status, code) = answer.expect("waiter");
        assert_eq!((status, code.as_str()), (503, "shutting_down"), "a long-poll during the outage");
    }
    assert!(signalled.elapsed() < Duration::from_secs(4), "answered at once, not at the end of the grace");
    assert_eq!(zkq.wait().await.code(), Some(0));
    // The message is still there.
    zk.restart();
    let direct = zk_client(&zk).await;
    assert_eq!(children(&direct, &format!("{root}/queues/q")).await.len(), 1);
}
