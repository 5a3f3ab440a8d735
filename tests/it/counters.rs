//! Shared counters against real ZooKeeper and Curator's SharedCount.

use std::time::{Duration, Instant};

use crate::ensemble::ZkEnsemble;
use zkq_testkit::*;

/// Declares counters: a read of a declared counter creates its seed (as Curator's `start()`),
/// while a read of an undeclared one that does not exist is 404 and creates nothing.
fn with_counters(mut config: zkq::config::Config, names: &[&str]) -> zkq::config::Config {
    for name in names {
        config
            .counters
            .insert(name.parse().expect("a valid counter name"), zkq::config::CounterConfig { path: None, seed: 0 });
    }
    config
}

async fn counter(zkq: &TestZkq, name: &str) -> (u16, serde_json::Value, Option<String>) {
    let response = zkq.http.get(zkq.url(&format!("/v1/counters/{name}"))).send().await.expect("get");
    let status = response.status().as_u16();
    let etag = response.headers().get("etag").and_then(|v| v.to_str().ok()).map(str::to_owned);
    (status, response.json().await.unwrap_or_default(), etag)
}

async fn set(zkq: &TestZkq, name: &str, value: i32, if_match: Option<&str>) -> (u16, serde_json::Value) {
    let mut request = zkq.http.put(zkq.url(&format!("/v1/counters/{name}"))).json(&serde_json::json!({"value": value}));
    if let Some(etag) = if_match {
        request = request.header("if-match", etag);
    }
    let response = request.send().await.expect("set");
    (response.status().as_u16(), response.json().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zkq_and_curator_shared_count_see_each_others_values() {
    let zk = ZkServer::shared();
    let root = unique_root("counters");
    let zkq = TestZkq::start_ready(with_counters(test_config(zk, &root), &["hits"])).await;
    let path = format!("{root}/counters/hits");

    let (status, body, _) = counter(&zkq, "unknown").await;
    assert_eq!((status, body["code"].as_str()), (404, Some("counter_not_found")), "a read creates nothing");
    for name in ["a%20b", &"x".repeat(201)] {
        let (status, body, _) = counter(&zkq, name).await;
        assert_eq!((status, body["code"].as_str()), (400, Some("invalid_name")), "{name}: {body}");
        assert_eq!(set(&zkq, name, 1, None).await.0, 400, "{name}");
    }
    // Sent as written (a URL library would resolve the dot segment).
    let (status, body) = zkq_testkit::raw_request(&zkq.api, "GET", "/v1/counters/%2E%2E").await;
    assert_eq!(
        (status, body["code"].as_str(), body["message"].as_str()),
        (400, Some("invalid_name"), Some(r#"counter name ".." must not be . or .."#))
    );
    let (status, body, etag) = counter(&zkq, "hits").await;
    assert_eq!((status, body["value"].as_i64(), body["version"].as_i64()), (200, Some(0), Some(0)), "seeded with 0");
    assert_eq!(etag.as_deref(), Some("\"0\""));
    assert_eq!(set(&zkq, "hits", -2, None).await.0, 200);
    assert_eq!(Curator::run(zk, &["count", "get", &path]).await, ["-2 1"], "Curator reads zkq's value");
    let direct = zk_client(zk).await;
    assert_eq!(direct.get_data(&path).await.expect("data").0, [0xff, 0xff, 0xff, 0xfe], "4-byte big-endian");

    Curator::run(zk, &["count", "set", &path, "258"]).await;
    let (_, body, etag) = counter(&zkq, "hits").await;
    assert_eq!((body["value"].as_i64(), body["version"].as_i64()), (Some(258), Some(2)), "zkq reads Curator's value");
    assert_eq!(etag.as_deref(), Some("\"2\""));
    assert_eq!(Curator::run(zk, &["count", "tryset", &path, "7"]).await, ["true"], "Curator CAS after zkq's writes");
    assert_eq!(counter(&zkq, "hits").await.1["value"], 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_set_refuses_a_stale_version_and_the_minus_one_version() {
    let zk = ZkServer::shared();
    let zkq = TestZkq::start_ready(with_counters(test_config(zk, &unique_root("cas")), &["c"])).await;
    let (_, _, etag) = counter(&zkq, "c").await;
    let etag = etag.expect("etag");
    let (status, body) = set(&zkq, "c", 5, Some(&etag)).await;
    assert_eq!((status, body["value"].as_i64(), body["version"].as_i64()), (200, Some(5), Some(1)));
    let (status, body) = set(&zkq, "c", 6, Some(&etag)).await;
    assert_eq!(status, 412, "stale If-Match");
    assert_eq!(
        (body["code"].as_str(), body["value"].as_i64(), body["version"].as_i64()),
        (Some("version_mismatch"), Some(5), Some(1))
    );
    // Version -1 means "any version" to ZooKeeper: refused, as Curator refuses it.
    let (status, body) = set(&zkq, "c", 9, Some("\"-1\"")).await;
    assert_eq!((status, body["code"].as_str()), (409, Some("version_overflow")));
    assert_eq!(counter(&zkq, "c").await.1["value"], 5, "unchanged");
    let (status, body) = set(&zkq, "c", 9, Some("seven")).await;
    assert_eq!((status, body["code"].as_str()), (400, Some("invalid_parameter")));
    let wrong_type =
        zkq.http.put(zkq.url("/v1/counters/c")).body("{\"value\": 1}").send().await.expect("no content type");
    assert_eq!(wrong_type.status(), 415);
    let bad_json = zkq.http.put(zkq.url("/v1/counters/c")).json(&serde_json::json!({"value": "x"})).send().await;
    assert_eq!(bad_json.expect("bad json").status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_are_atomic() {
    let zk = ZkServer::shared();
    let zkq = TestZkq::start_ready(with_counters(test_config(zk, &unique_root("adds")), &["n"])).await;
    let start = counter(&zkq, "n").await.1["value"].as_i64().expect("value");
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (http, url) = (zkq.http.clone(), zkq.url("/v1/counters/n/add"));
        clients.spawn(async move {
            for _ in 0..100 {
                let response = http.post(&url).json(&serde_json::json!({"delta": 1})).send().await.expect("add");
                assert_eq!(response.status(), 200, "{}", response.text().await.unwrap_or_default());
            }
        });
    }
    while let Some(r) = clients.join_next().await {
        r.expect("client");
    }
    assert_eq!(counter(&zkq, "n").await.1["value"].as_i64(), Some(start + 800));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_wakes_on_a_curator_set_count() {
    let zk = ZkServer::shared();
    let root = unique_root("counter-poll");
    let zkq = TestZkq::start_ready(with_counters(test_config(zk, &root), &["flag"])).await;
    let (_, body, _) = counter(&zkq, "flag").await;
    let version = body["version"].as_i64().expect("version");
    let mut waiters = tokio::task::JoinSet::new();
    for _ in 0..5 {
        let (http, url) = (zkq.http.clone(), zkq.url(&format!("/v1/counters/flag?wait=15s&after_version={version}")));
        waiters.spawn(async move {
            let started = Instant::now();
            let body: serde_json::Value = http.get(url).send().await.expect("poll").json().await.expect("json");
            (body, started.elapsed())
        });
    }
    eventually(Duration::from_secs(20), "five polls waiting", || async {
        zkq.metrics().await.contains("zkq_shared_count_polls_waiting 5")
    })
    .await;
    Curator::run(zk, &["count", "set", &format!("{root}/counters/flag"), "42"]).await;
    while let Some(result) = waiters.join_next().await {
        let (body, took) = result.expect("waiter");
        assert_eq!(body["value"], 42);
        assert!(took < Duration::from_secs(14), "woken by the change, not the timeout: {took:?}");
    }
    // Without a change, the poll ends at its deadline with the same version.
    let started = Instant::now();
    let url = zkq.url("/v1/counters/flag?wait=500ms&after_version=1");
    let body: serde_json::Value = zkq.http.get(url).send().await.expect("poll").json().await.expect("json");
    assert_eq!(body["version"], 1);
    assert!(started.elapsed() >= Duration::from_millis(450));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_that_is_not_four_bytes_is_reported_never_overwritten() {
    let zk = ZkServer::shared();
    let root = unique_root("corrupt");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let direct = zk_client(zk).await;
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    direct.create(&root, b"", &options).await.expect("root");
    direct.create(&format!("{root}/counters"), b"", &options).await.expect("dir");
    direct.create(&format!("{root}/counters/text"), b"hello", &options).await.expect("node");
    let (status, body, _) = counter(&zkq, "text").await;
    assert_eq!((status, body["code"].as_str()), (409, Some("counter_not_an_int")));
    assert_eq!(set(&zkq, "text", 1, None).await.0, 409);
    let add = zkq.http.post(zkq.url("/v1/counters/text/add")).json(&serde_json::json!({"delta": 1})).send().await;
    assert_eq!(add.expect("add").status(), 409);
    assert_eq!(direct.get_data(&format!("{root}/counters/text")).await.expect("data").0, b"hello");
    assert!(zkq.metrics().await.contains("zkq_counter_operations_total{operation=\"set\",outcome=\"refused\"} 1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_answers_shutting_down_at_once_when_shutdown_starts() {
    let zk = ZkServer::shared();
    let mut config = with_counters(test_config(zk, &unique_root("counter-drain")), &["c"]);
    config.shutdown.grace = Duration::from_secs(10);
    let mut zkq = TestZkq::start_ready(config).await;
    let version = counter(&zkq, "c").await.1["version"].as_i64().expect("version");
    let (http, url) = (zkq.http.clone(), zkq.url(&format!("/v1/counters/c?wait=20s&after_version={version}")));
    let poll = tokio::spawn(async move {
        let response = http.get(url).send().await.expect("an answer, not a dropped connection");
        let status = response.status().as_u16();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        (status, body["code"].as_str().unwrap_or("").to_owned())
    });
    eventually(Duration::from_secs(10), "the long-poll waiting", || async {
        zkq.metrics().await.contains("zkq_shared_count_polls_waiting 1")
    })
    .await;

    let running = zkq.running.take().expect("running");
    let signalled = Instant::now();
    let stopped = tokio::spawn(running.stop());
    let answer = tokio::time::timeout(Duration::from_secs(3), poll).await;
    let (status, code) = answer.expect("the long-poll answered within 3 s of shutdown, not at its wait").expect("poll");
    assert_eq!((status, code.as_str()), (503, "shutting_down"));
    let in_time = stopped.await.expect("shutdown");
    assert!(in_time, "shutdown finished within its grace");
    assert!(signalled.elapsed() < Duration::from_secs(5), "shutdown took {:?} of a 10 s grace", signalled.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_after_a_version_never_answer_an_older_one_from_a_lagging_follower() {
    let ensemble = tokio::task::block_in_place(ZkEnsemble::start_with_quorum_links);
    let leader = ensemble.leader().expect("a leader");
    let follower = (0..ZkEnsemble::SIZE).find(|i| *i != leader).expect("a follower");
    let root = unique_root("counter-lag");
    let path = format!("{root}/counters/c");
    // zkq talks to the follower only; the test writes through the leader.
    let mut config = with_counters(test_config(&ensemble.address(follower), &root), &["c"]);
    // The held link also holds the follower's session reports to the leader.
    config.zookeeper.session_timeout = Duration::from_secs(30);
    let zkq = TestZkq::start_ready(config).await;
    let (status, body) = set(&zkq, "c", 1, None).await;
    assert_eq!((status, body["version"].as_i64()), (200, Some(1)));
    let direct = zk_client(&ensemble.address(leader)).await;

    // Version 2 is committed by the leader and the other follower; zkq's follower lags at 1.
    tokio::task::block_in_place(|| ensemble.hold_commits_to(follower));
    let stat = direct.set_data(&path, &2i32.to_be_bytes(), None).await.expect("set through the leader");
    assert_eq!(stat.version, 2);
    assert_eq!(counter(&zkq, "c").await.1["version"], 1, "the follower lags (the test's premise)");
    // A read by a client that saw version 2 cannot be answered from the lagging follower: its
    // `sync` waits for the leader, which the held link keeps from answering.
    let response = zkq.http.get(zkq.url("/v1/counters/c?after_version=2")).send().await.expect("read");
    let status = response.status().as_u16();
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    assert_eq!((status, body["code"].as_str()), (503, Some("zookeeper_unavailable")), "not version 1: {body}");

    // A client that saw version 2 elsewhere long-polls for what comes after it.
    let (http, url) = (zkq.http.clone(), zkq.url("/v1/counters/c?wait=20s&after_version=2"));
    let poll = tokio::spawn(async move {
        let response = http.get(url).send().await.expect("poll");
        (response.status().as_u16(), response.json::<serde_json::Value>().await.unwrap_or_default())
    });
    eventually(Duration::from_secs(10), "the long-poll waiting (or answered)", || async {
        poll.is_finished() || zkq.metrics().await.contains("zkq_shared_count_polls_waiting 1")
    })
    .await;
    if !poll.is_finished() {
        let stat = direct.set_data(&path, &3i32.to_be_bytes(), None).await.expect("set through the leader");
        assert_eq!(stat.version, 3);
    }
    tokio::task::block_in_place(|| ensemble.release_commits_to(follower));
    let (status, body) = poll.await.expect("poll");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["value"].as_i64(), body["version"].as_i64()),
        (Some(3), Some(3)),
        "a long-poll after version 2 answered an older version from the lagging follower"
    );
    // Once caught up, a plain read sees the latest version.
    assert_eq!(counter(&zkq, "c").await.1["version"], 3);
}
