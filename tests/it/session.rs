//! The supervised session against a real server: down at start, restart, pause past expiry.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zkq::{ConnectionState, SessionStatus};

use zkq_testkit::*;

/// Records every published status of a running zkq.
fn record_states(zkq: &TestZkq) -> Arc<Mutex<Vec<SessionStatus>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut rx = zkq.running.as_ref().expect("running").session.subscribe();
    let sink = seen.clone();
    tokio::spawn(async move {
        sink.lock().expect("lock").push(*rx.borrow_and_update());
        while rx.changed().await.is_ok() {
            sink.lock().expect("lock").push(*rx.borrow_and_update());
        }
    });
    seen
}

fn states(seen: &Arc<Mutex<Vec<SessionStatus>>>) -> Vec<ConnectionState> {
    seen.lock().expect("lock").iter().map(|s| s.state).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_with_zookeeper_down_and_becomes_ready_when_it_comes_up() {
    let zk = ZkServer::start();
    zk.stop();
    let zkq = TestZkq::start(test_config(&zk, &unique_root("down-at-start"))).await;

    let live = zkq.http.get(format!("{}/livez", zkq.admin)).send().await.expect("livez");
    assert_eq!(live.status(), 200, "/livez never depends on ZooKeeper");
    let (status, body) = zkq.readyz().await;
    assert_eq!(status, 503);
    assert_eq!(body["code"], "not_ready");
    assert!(body["message"].as_str().unwrap_or("").contains("connecting"), "{body}");

    // A request made for a client while ZooKeeper is down ends by its deadline with 503.
    let started = Instant::now();
    let response = zkq.put("q", b"x").await;
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    assert!(started.elapsed() < Duration::from_secs(6), "put waited {:?}", started.elapsed());

    zk.restart();
    zkq.wait_ready().await;
    assert_eq!(zkq.readyz().await.1["zookeeper"], "connected");
    let metrics = zkq.metrics().await;
    assert!(metrics.contains("zkq_zookeeper_connection_state{state=\"connected\"} 1"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_restart_suspends_then_reconnects_the_same_session() {
    let zk = ZkServer::start();
    let mut config = test_config(&zk, &unique_root("restart"));
    config.zookeeper.session_timeout = Duration::from_secs(20);
    let zkq = TestZkq::start_ready(config).await;
    let seen = record_states(&zkq);
    let session_before = zkq.running.as_ref().expect("running").session.status();

    zk.stop();
    eventually(Duration::from_secs(30), "SUSPENDED", || async { states(&seen).contains(&ConnectionState::Suspended) })
        .await;
    let (status, body) = zkq.readyz().await;
    assert_eq!(status, 503, "not ready while suspended");
    assert!(body["message"].as_str().unwrap_or("").contains("suspended"), "{body}");
    assert!(zkq.metrics().await.contains("zkq_zookeeper_connection_state{state=\"suspended\"} 1"));

    zk.restart();
    zkq.wait_ready().await;
    let after = zkq.running.as_ref().expect("running").session.status();
    assert_eq!(after.state, ConnectionState::Reconnected);
    assert_eq!(after.session_id, session_before.session_id, "same session after a reconnect");
    assert_eq!(after.generation, session_before.generation);
    let seq = states(&seen);
    let suspended = seq.iter().position(|s| *s == ConnectionState::Suspended).expect("suspended");
    let reconnected = seq.iter().rposition(|s| *s == ConnectionState::Reconnected).expect("reconnected");
    assert!(suspended < reconnected, "{seq:?}");
    assert!(!seq.contains(&ConnectionState::Lost), "{seq:?}");
    let metrics = zkq.metrics().await;
    assert!(metrics.contains("zkq_zookeeper_reconnects_total 1"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_past_session_timeout_loses_the_session_and_opens_a_new_one() {
    let zk = ZkServer::start();
    let config = test_config(&zk, &unique_root("expiry"));
    let session_timeout = config.zookeeper.session_timeout;
    let zkq = TestZkq::start_ready(config).await;
    let seen = record_states(&zkq);
    let before = zkq.running.as_ref().expect("running").session.status();

    zk.pause();
    eventually(Duration::from_secs(30), "SUSPENDED while paused", || async {
        states(&seen).contains(&ConnectionState::Suspended)
    })
    .await;
    assert_eq!(zkq.readyz().await.0, 503);
    // Stay frozen well past the session timeout so the server expires the session when it wakes.
    tokio::time::sleep(session_timeout + Duration::from_secs(3)).await;
    zk.resume();

    eventually(Duration::from_secs(60), "a new session", || async {
        let now = zkq.running.as_ref().expect("running").session.status();
        now.state == ConnectionState::Connected && now.generation > before.generation
    })
    .await;
    zkq.wait_ready().await;
    let after = zkq.running.as_ref().expect("running").session.status();
    assert_ne!(after.session_id, before.session_id, "a new session id");
    let seq = states(&seen);
    let lost = seq.iter().position(|s| *s == ConnectionState::Lost).expect("LOST seen");
    assert!(seq[lost..].contains(&ConnectionState::Connected), "{seq:?}");
    let metrics = zkq.metrics().await;
    assert!(metrics.contains("zkq_zookeeper_session_expirations_total 1"), "{metrics}");
    // Service works on the new session.
    zkq.put_ok("after-expiry", b"x").await;
    assert_eq!(zkq.take_body("after-expiry", "5s").await.as_deref(), Some(b"x".as_slice()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_an_unreachable_zookeeper_burns_no_cpu() {
    let zk = ZkServer::start();
    zk.stop();
    let zkq = ChildZkq::spawn(&zk, &unique_root("idle"), &[("ZKQ__ZOOKEEPER__RECONNECT_BACKOFF_MAX", "1s")]);
    let http = reqwest::Client::new();
    eventually(Duration::from_secs(30), "admin listener up", || {
        let (http, url) = (http.clone(), format!("{}/livez", zkq.admin));
        async move { http.get(url).send().await.is_ok_and(|r| r.status() == 200) }
    })
    .await;
    let before = zkq.cpu_time();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let used = zkq.cpu_time() - before;
    // Reconnect attempts with backoff cost milliseconds; a busy loop would use the whole 5 s.
    assert!(used < Duration::from_millis(500), "used {used:?} of CPU in 5 s while ZooKeeper was down");
    assert_eq!(http.get(format!("{}/readyz", zkq.admin)).send().await.expect("readyz").status(), 503);
    zk.restart();
    eventually(Duration::from_secs(30), "ready once ZooKeeper is up", || {
        let (http, url) = (http.clone(), format!("{}/readyz", zkq.admin));
        async move { http.get(url).send().await.is_ok_and(|r| r.status() == 200) }
    })
    .await;
}
