//! Hardening: no node in ZooKeeper and no HTTP request can wedge, bloat or mislead zkq.

use std::time::{Duration, Instant};

use futures::StreamExt;
use zkq::config::QueueKind;

use zkq_testkit::*;

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
    let envelope = zkq::envelope::encode([b"from elsewhere".as_slice()]);
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

/// Series lines (not comments) in a `/metrics` answer, but the ZooKeeper request series: their
/// `operation` label is a fixed set, and background tasks (sweepers) may add one of its values
/// at any time, whatever the requests.
fn series_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with("zkq_zookeeper_request"))
}

fn series_count(text: &str) -> usize {
    series_lines(text).count()
}

/// Methods and paths are free text: as metric labels they must map onto fixed sets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_methods_and_paths_do_not_grow_the_metric_series() {
    let zk = ZkServer::shared();
    let zkq = TestZkq::start_ready(test_config(zk, &unique_root("series"))).await;
    let send = |base: String, method: String, path: String| {
        let http = zkq.http.clone();
        async move {
            let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method token");
            http.request(method, format!("{base}{path}")).send().await.expect("request").status().as_u16()
        }
    };
    // One of each kind first, so every label value the flood can produce exists already.
    for base in [zkq.api.clone(), zkq.admin.clone()] {
        for (method, path) in
            [("MWARM", "/livez"), ("MWARM", "/nowhere"), ("GET", "/nowhere/else"), ("MWARM", "/v1/queues/warm")]
        {
            send(base.clone(), method.to_owned(), path.to_owned()).await;
        }
    }
    zkq.metrics().await; // the scrape's own series
    let before_text = zkq.metrics().await;
    let before = series_count(&before_text);
    let per_kind = 1500;
    for base in [zkq.api.clone(), zkq.admin.clone()] {
        let requests = (0..per_kind).flat_map(|i| {
            [
                (format!("M{i:06}"), "/livez".to_owned()),
                (format!("M{i:06}"), format!("/v1/queues/{i}")),
                ("GET".to_owned(), format!("/no/such/{i}")),
            ]
        });
        let statuses: Vec<u16> =
            futures::stream::iter(requests.map(|(m, p)| send(base.clone(), m, p))).buffer_unordered(16).collect().await;
        assert!(statuses.iter().all(|s| *s == 404 || *s == 405), "only 404/405 expected");
    }
    let after_text = zkq.metrics().await;
    let after = series_count(&after_text);
    let names = |text: &str| -> std::collections::BTreeSet<String> {
        series_lines(text).filter_map(|l| l.rsplit_once(' ')).map(|(n, _)| n.to_owned()).collect()
    };
    let added: Vec<String> = names(&after_text).difference(&names(&before_text)).take(10).cloned().collect();
    println!("metric series: {before} before, {after} after {} requests with distinct methods and paths", 6 * per_kind);
    assert_eq!(before, after, "the flood must not add series; some added: {added:#?}");
}

/// Characters ZooKeeper refuses are bad input (400), not a ZooKeeper failure (502).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn characters_zookeeper_refuses_and_far_delays_are_bad_input() {
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("refused-chars"));
    declare(&mut config, "ids", QueueKind::Id, None, None);
    declare(&mut config, "later", QueueKind::Delay, None, None);
    let zkq = TestZkq::start_ready(config).await;
    let expect_400 = |response: reqwest::Response, what: &'static str| async move {
        let status = response.status().as_u16();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        assert_eq!((status, body["code"].as_str()), (400, Some("invalid_parameter")), "{what}: {body}");
    };
    for id in ["%EE%80%80", "%01", "%C2%85", "%EF%BF%B0", "%F0%9F%98%80"] {
        let put = zkq.http.post(zkq.url(&format!("/v1/queues/ids/messages?id=a{id}b"))).body("x").send().await;
        expect_400(put.expect("put"), "put with a refused id").await;
        let remove = zkq.http.delete(zkq.url(&format!("/v1/queues/ids/messages?id=a{id}b"))).send().await;
        expect_400(remove.expect("remove by id"), "remove by a refused id").await;
        let remove =
            zkq.http.delete(zkq.url(&format!("/v1/queues/ids/messages/queue-|a{id}b|0000000000"))).send().await;
        expect_400(remove.expect("remove"), "remove a message id with a refused character").await;
    }
    let put = zkq.http.post(zkq.url("/v1/queues/ids/messages?id=caf%C3%A9%20%E2%82%AC")).body("ok").send().await;
    assert_eq!(put.expect("put").status(), 201, "ordinary non-ASCII ids are fine");

    let far = zkq::now_epoch_ms() + 31 * 24 * 3600 * 1000;
    let put = zkq.http.post(zkq.url("/v1/queues/later/messages?delay=744h")).body("x").send().await;
    expect_400(put.expect("put"), "delay of 31 days").await;
    let put = zkq.http.post(zkq.url(&format!("/v1/queues/later/messages?deliver_at={far}"))).body("x").send().await;
    expect_400(put.expect("put"), "deliver_at in 31 days").await;
    let put = zkq.http.post(zkq.url("/v1/queues/later/messages?delay=719h")).body("x").send().await;
    assert_eq!(put.expect("put").status(), 201, "within 30 days");
}

/// A declared path with a character ZooKeeper refuses stops zkq at startup, naming the key.
#[test]
fn declared_paths_with_refused_characters_exit_64() {
    for (section, key) in [("queues.q", "path"), ("queues.q", "lock_path"), ("counters.c", "path")] {
        let file = std::env::temp_dir().join(format!("zkq-refused-{}.toml", uuid::Uuid::new_v4().simple()));
        std::fs::write(&file, format!("[{section}]\n{key} = \"/app/x\\uE000\"\n")).expect("write config");
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_zkq"))
            .arg("--config")
            .arg(&file)
            .arg("check-config")
            .output()
            .expect("runs");
        let _ = std::fs::remove_file(&file);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{section}.{key}: {stderr}");
        assert!(stderr.contains(&format!("{section}.{key}")) && stderr.contains("U+E000"), "{stderr}");
    }
}

/// Sends raw bytes and returns what the server answered until it closed or `until` appeared.
async fn raw_exchange(addr: &str, request: &[u8], until: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await;
        match read {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
        }
        if String::from_utf8_lossy(&answer).contains(until) {
            break;
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// A body declared too large is refused before the client uploads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_with_an_oversized_length_gets_413_at_once() {
    let zk = ZkServer::shared();
    let config = test_config(zk, &unique_root("expect"));
    let max = config.api.max_message_bytes;
    let zkq = TestZkq::start_ready(config).await;
    let addr = zkq.api.trim_start_matches("http://").to_owned();
    let request = format!(
        "POST /v1/queues/q/messages HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        max + 1
    );
    let answer = raw_exchange(&addr, request.as_bytes(), "}").await;
    let status_line = answer.lines().next().unwrap_or("");
    assert!(status_line.starts_with("HTTP/1.1 413"), "expected an immediate 413, got {answer:?}");
    assert!(answer.contains("\"code\":\"payload_too_large\""), "{answer}");
}

/// Counter answers: no 500 when unconditional sets race, no silent wrap, only JSON objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_writes_race_overflow_and_odd_bodies_answer_documented_errors() {
    let zk = ZkServer::shared();
    let zkq = TestZkq::start_ready(test_config(zk, &unique_root("counter-edges"))).await;
    let url = zkq.url("/v1/counters/c");
    let writers = (0..8).map(|w| {
        let (http, url) = (zkq.http.clone(), url.clone());
        async move {
            let mut statuses = Vec::new();
            for i in 0..40 {
                let response = http
                    .put(&url)
                    .header("If-Match", "*")
                    .json(&serde_json::json!({"value": w * 1000 + i}))
                    .send()
                    .await
                    .expect("set");
                let status = response.status().as_u16();
                if status != 200 {
                    statuses.push((status, response.text().await.unwrap_or_default()));
                }
            }
            statuses
        }
    });
    let failures: Vec<(u16, String)> = futures::future::join_all(writers).await.into_iter().flatten().collect();
    assert!(
        failures.iter().all(|(status, body)| *status == 409 && body.contains("\"contention\"")),
        "racing unconditional sets: {failures:?}"
    );

    let set = zkq.http.put(&url).json(&serde_json::json!({"value": i32::MAX})).send().await.expect("set");
    assert_eq!(set.status(), 200);
    let add = zkq.http.post(format!("{url}/add")).json(&serde_json::json!({"delta": 1})).send().await.expect("add");
    let status = add.status().as_u16();
    let body: serde_json::Value = add.json().await.expect("json");
    assert_eq!((status, body["code"].as_str()), (409, Some("counter_overflow")), "{body}");
    let read: serde_json::Value = zkq.http.get(&url).send().await.expect("get").json().await.expect("json");
    assert_eq!(read["value"], i32::MAX, "nothing written");

    for body in ["[1]", "1", "\"x\"", "null"] {
        let add = zkq
            .http
            .post(format!("{url}/add"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("add");
        assert_eq!(add.status(), 400, "body {body}");
    }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Slow and idle connections on both listeners neither starve `/livez` and the API nor grow memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_connections_do_not_starve_or_bloat_zkq() {
    use tokio::io::AsyncWriteExt;
    let zk = ZkServer::shared();
    let env = [
        ("ZKQ__API__HEADER_READ_TIMEOUT", "2s"),
        ("ZKQ__ADMIN__HEADER_READ_TIMEOUT", "2s"),
        ("ZKQ__API__IDLE_TIMEOUT", "2s"),
        ("ZKQ__ADMIN__IDLE_TIMEOUT", "2s"),
        ("ZKQ__API__MAX_CONNECTIONS", "256"),
        ("ZKQ__ADMIN__MAX_CONNECTIONS", "64"),
    ];
    let zkq = ChildZkq::start(zk, &unique_root("slowloris"), &env).await;
    let pid = zkq.pid();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("client");
    let before = rss_kib(pid);
    let per_listener = 1000;
    let mut held = Vec::new();
    for base in [&zkq.api, &zkq.admin] {
        let addr = base.trim_start_matches("http://").to_owned();
        for i in 0..per_listener {
            let Ok(mut stream) = tokio::net::TcpStream::connect(&addr).await else { continue };
            // Half send one header line and stop (slowloris), half send nothing (idle).
            if i % 2 == 0 {
                let _ = stream.write_all(b"GET /livez HTTP/1.1\r\nX-Slow: 1\r\n").await;
            }
            held.push(stream);
        }
    }
    let during = rss_kib(pid);
    let started = Instant::now();
    let livez = http.get(format!("{}/livez", zkq.admin)).send().await.expect("livez");
    let livez_took = started.elapsed();
    let started = Instant::now();
    let api = http.get(format!("{}/v1/queues", zkq.api)).send().await.expect("api");
    let api_took = started.elapsed();
    println!(
        "{} slow/idle connections ({} per listener): RSS {before} KiB before, {during} KiB during; \
         /livez answered in {livez_took:?}, GET /v1/queues in {api_took:?}",
        held.len(),
        per_listener
    );
    assert_eq!(livez.status(), 200);
    assert_eq!(api.status(), 200);
    assert!(livez_took < Duration::from_secs(10), "/livez starved for {livez_took:?}");
    assert!(api_took < Duration::from_secs(10), "the API starved for {api_took:?}");
    assert!(during < before + 64 * 1024, "RSS grew from {before} KiB to {during} KiB");
    // The server ends a connection whose headers do not arrive in time (else it holds it forever).
    use tokio::io::AsyncReadExt;
    let mut slow = held.swap_remove(0);
    let mut buf = [0u8; 512];
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match slow.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {},
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "a slowloris connection was still open after 20 s");
}

/// The backlog gauge shows the depth at every scrape, and a declared queue's series exist at 0
/// before anything happened to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_gauge_shows_the_depth_and_declared_series_start_at_zero() {
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("backlog"));
    declare(&mut config, "declared", QueueKind::Fifo, None, None);
    let zkq = TestZkq::start_ready(config).await;
    let fresh = zkq.metrics().await;
    for series in [
        "zkq_messages_put_total",
        "zkq_messages_taken_total",
        "zkq_messages_leased_total",
        "zkq_messages_acked_total",
        "zkq_messages_expired_total",
        "zkq_messages_dead_lettered_total",
        "zkq_leases_extended_total",
        "zkq_leases_in_flight",
        "zkq_waiting_takers",
        "zkq_puts_in_flight",
        "zkq_undecodable_messages_total",
        "zkq_put_outcome_unknown_total",
    ] {
        let line = format!("{series}{{queue=\"declared\"}}");
        assert_eq!(metric_value(&fresh, &line), Some(0.0), "{line} missing on a fresh zkq");
    }
    for mode in ["requeue", "delete", "keep"] {
        let line = format!("zkq_messages_nacked_total{{mode=\"{mode}\",queue=\"declared\"}}");
        assert_eq!(metric_value(&fresh, &line), Some(0.0), "{line} missing on a fresh zkq");
    }

    for i in 0..5 {
        zkq.put_ok("backlog", format!("m{i}").as_bytes()).await;
        zkq.put_ok("declared", b"x").await;
    }
    let text = zkq.metrics().await;
    assert_eq!(metric_value(&text, "zkq_queue_children{queue=\"backlog\"}"), Some(5.0), "5 puts, no takes");
    assert_eq!(metric_value(&text, "zkq_queue_children{queue=\"declared\"}"), Some(5.0), "5 puts, no takes");
    // A message put by someone else shows at the next scrape too.
    let direct = zk_client(zk).await;
    let info: serde_json::Value =
        zkq.http.get(zkq.url("/v1/queues/backlog")).send().await.expect("info").json().await.expect("json");
    let path = info["path"].as_str().expect("path").to_owned();
    let sequential = zookeeper_client::CreateMode::PersistentSequential.with_acls(zookeeper_client::Acls::anyone_all());
    let envelope = zkq::envelope::encode([b"elsewhere".as_slice()]);
    direct.create(&format!("{path}/queue-"), &envelope, &sequential).await.expect("put elsewhere");
    assert_eq!(metric_value(&zkq.metrics().await, "zkq_queue_children{queue=\"backlog\"}"), Some(6.0));
}

/// A queue cannot have more than `lease.max_per_queue` leases out: the next one is told to retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_beyond_max_per_queue_answer_429_too_many_leases() {
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("max-leases"));
    config.lease.max_per_queue = 2;
    let zkq = TestZkq::start_ready(config).await;
    for i in 0..3 {
        zkq.put_ok("q", format!("m{i}").as_bytes()).await;
    }
    let lease = || zkq.http.post(zkq.url("/v1/queues/q/leases?visibility=5m")).send();
    let first = lease().await.expect("lease");
    assert_eq!(first.status(), 200);
    let receipt = first.headers()["zkq-lease"].to_str().expect("ascii").to_owned();
    assert_eq!(lease().await.expect("lease").status(), 200);
    let third = lease().await.expect("lease");
    assert_eq!(third.status(), 429);
    assert!(third.headers().get("retry-after").is_some(), "429 carries Retry-After");
    let body: serde_json::Value = third.json().await.expect("json");
    assert_eq!(body["code"], "too_many_leases", "{body}");
    let acked = zkq.http.delete(zkq.url(&format!("/v1/queues/q/leases/{receipt}"))).send().await.expect("ack");
    assert_eq!(acked.status(), 204);
    assert_eq!(lease().await.expect("lease").status(), 200, "room again after an ack");
}

/// A peek stops at `api.max_peek_bytes` of bodies, but always shows the first message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peek_stops_at_max_peek_bytes_and_always_shows_one_message() {
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("peek-bytes"));
    config.api.max_peek_bytes = 250_000;
    let zkq = TestZkq::start_ready(config).await;
    for i in 0..5u8 {
        zkq.put_ok("big", &vec![b'a' + i; 100_000]).await;
    }
    zkq.put_ok("huge", &vec![b'h'; 400_000]).await;
    zkq.put_ok("huge", b"small").await;
    let peek = |queue: &'static str| {
        let url = zkq.url(&format!("/v1/queues/{queue}/messages?limit=100"));
        let http = zkq.http.clone();
        async move {
            let response = http.get(url).send().await.expect("peek");
            assert_eq!(response.status(), 200);
            let body: serde_json::Value = response.json().await.expect("json");
            body["messages"]
                .as_array()
                .expect("messages")
                .iter()
                .map(|m| m["size"].as_u64().unwrap_or(0))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(peek("big").await, [100_000, 100_000], "two bodies fit 250,000 bytes, a third would not");
    assert_eq!(peek("huge").await, [400_000], "the first message is shown even when it alone passes the budget");
}

/// More requests at once than `api.max_concurrent_requests` are shed with 503 `overloaded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_max_concurrent_requests_answer_503_overloaded() {
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("overloaded"));
    config.api.max_concurrent_requests = 4;
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("q", b"opens the queue").await;
    assert!(zkq.take_body("q", "0s").await.is_some());
    let polls: Vec<_> = (0..6)
        .map(|_| {
            let (http, url) = (zkq.http.clone(), zkq.url("/v1/queues/q/take?wait=15s"));
            tokio::spawn(async move {
                let response = http.post(url).send().await.expect("take");
                let status = response.status().as_u16();
                let retry_after = response.headers().get("retry-after").is_some();
                let body: serde_json::Value = response.json().await.unwrap_or_default();
                (status, retry_after, body["code"].as_str().unwrap_or("").to_owned())
            })
        })
        .collect();
    // The two shed at once answer long before the four waiting long-polls.
    let mut answers = Vec::new();
    for poll in polls {
        answers.push(poll.await.expect("join"));
    }
    let shed: Vec<_> = answers.iter().filter(|(status, _, _)| *status == 503).collect();
    assert_eq!(shed.len(), 2, "{answers:?}");
    assert!(shed.iter().all(|(_, retry_after, code)| *retry_after && code == "overloaded"), "{answers:?}");
    assert_eq!(answers.iter().filter(|(status, _, _)| *status == 204).count(), 4, "{answers:?}");
}

/// Reads, takes and lease steps of unknown names create nothing and take no dynamic-queue slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_unknown_names_create_nothing_and_take_no_slot() {
    let zk = ZkServer::shared();
    let root = unique_root("junk-reads");
    let mut config = test_config(zk, &root);
    config.max_dynamic_queues = 3;
    let zkq = TestZkq::start_ready(config).await;
    let bogus = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let requests = (0..1000).map(|i| {
        let (method, path, expected) = match i % 10 {
            0 => ("GET", format!("/v1/queues/junk{i}"), 404),
            1 => ("GET", format!("/v1/queues/junk{i}/messages"), 404),
            2 => ("DELETE", format!("/v1/queues/junk{i}/messages/queue-0000000001"), 404),
            3 => ("DELETE", format!("/v1/queues/junk{i}/leases/{bogus}"), 404),
            4 => ("POST", format!("/v1/queues/junk{i}/leases/{bogus}/nack"), 404),
            5 => ("POST", format!("/v1/queues/junk{i}/leases/{bogus}/extend"), 404),
            6 => ("GET", format!("/v1/counters/junk{i}"), 404),
            7 => ("POST", format!("/v1/queues/junk{i}/take?wait=0s"), 204),
            8 => ("POST", format!("/v1/queues/junk{i}/leases?wait=0s"), 204),
            _ => ("DELETE", format!("/v1/queues/junk{i}/messages?id=x"), 404),
        };
        let (http, url) = (zkq.http.clone(), zkq.url(&path));
        async move {
            let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
            let status = http.request(method, url).send().await.expect("request").status().as_u16();
            (path, status, expected)
        }
    });
    let answers: Vec<(String, u16, u16)> = futures::stream::iter(requests).buffer_unordered(16).collect().await;
    let wrong: Vec<_> = answers.iter().filter(|(_, status, expected)| status != expected).take(5).collect();
    assert!(wrong.is_empty(), "unexpected answers: {wrong:?}");

    let direct = zk_client(zk).await;
    for dir in ["queues", "locks", "counters", "deliveries"] {
        let created = children(&direct, &format!("{root}/{dir}")).await;
        assert!(created.is_empty(), "junk reads created {root}/{dir}/{created:?}");
    }
    let listed: serde_json::Value =
        zkq.http.get(zkq.url("/v1/queues")).send().await.expect("list").json().await.expect("json");
    assert_eq!(listed["queues"].as_array().map(Vec::len), Some(0), "{listed}");
    // Every slot is still free.
    zkq.put_ok("real1", b"x").await;
    zkq.put_ok("real2", b"x").await;

    // A taker of a queue nobody created yet waits for it, and gets the first message put to it
    // elsewhere (a Curator producer, another sidecar: here straight to ZooKeeper).
    let exists_calls =
        |text: &str| metric_value(text, "zkq_zookeeper_requests_total{operation=\"exists\",outcome=\"ok\"}");
    let before = exists_calls(&zkq.metrics().await);
    let waiting = {
        let (http, url) = (zkq.http.clone(), zkq.url("/v1/queues/later/take?wait=20s"));
        tokio::spawn(async move {
            let response = http.post(url).send().await.expect("take");
            (response.status().as_u16(), response.bytes().await.expect("body"))
        })
    };
    eventually(Duration::from_secs(10), "the taker watches for the queue node", || async {
        exists_calls(&zkq.metrics().await) > before
    })
    .await;
    let persistent = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    direct.create(&format!("{root}/queues/later"), b"", &persistent).await.expect("queue node");
    let sequential = zookeeper_client::CreateMode::PersistentSequential.with_acls(zookeeper_client::Acls::anyone_all());
    let envelope = zkq::envelope::encode([b"from elsewhere".as_slice()]);
    direct.create(&format!("{root}/queues/later/queue-"), &envelope, &sequential).await.expect("put elsewhere");
    let (status, body) = waiting.await.expect("join");
    assert_eq!((status, body.as_ref()), (200, b"from elsewhere".as_slice()));
    // real1, real2 and later hold the three slots.
    assert_eq!(zkq.put("real3", b"x").await.status(), 404, "max_dynamic_queues = 3");
}

/// An idle dynamic queue is closed (its slot released) but never while a lease is out, and the
/// next request opens it again with its messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_dynamic_queues_close_and_reopen_on_the_next_put() {
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("idle-close"));
    config.max_dynamic_queues = 2;
    config.queue_idle_close = Duration::from_secs(1);
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("held", b"leased").await;
    zkq.put_ok("held", b"waiting").await;
    let leased = zkq.http.post(zkq.url("/v1/queues/held/leases?visibility=5m")).send().await.expect("lease");
    assert_eq!(leased.status(), 200);
    let receipt = leased.headers()["zkq-lease"].to_str().expect("ascii").to_owned();
    zkq.put_ok("idle", b"stays in ZooKeeper").await;
    assert_eq!(zkq.put("third", b"x").await.status(), 404, "both slots in use");
    // `idle` is closed once unused for a second, which frees its slot; `held` has a lease out.
    eventually(Duration::from_secs(30), "the idle queue's slot is released", || async {
        zkq.put("third", b"x").await.status() == 201
    })
    .await;
    let acked = zkq.http.delete(zkq.url(&format!("/v1/queues/held/leases/{receipt}"))).send().await.expect("ack");
    assert_eq!(acked.status(), 204, "a queue with a lease out is never closed");
    let text = zkq.metrics().await;
    assert!(!text.contains("queue=\"idle\""), "a closed queue's series are dropped");
    // Reopened transparently: its message is still there.
    eventually(Duration::from_secs(30), "a slot for the idle queue", || async {
        zkq.put("idle", b"second").await.status() == 201
    })
    .await;
    assert_eq!(zkq.take_body("idle", "5s").await.as_deref(), Some(b"stays in ZooKeeper".as_slice()));
    assert_eq!(zkq.take_body("idle", "5s").await.as_deref(), Some(b"second".as_slice()));
}

/// Waits until the server closes `stream` (EOF or error); how long that took, or None after `limit`.
async fn closed_within(stream: &mut tokio::net::TcpStream, limit: Duration) -> Option<Duration> {
    use tokio::io::AsyncReadExt;
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return started.elapsed(),
                Ok(_) => {},
            }
        }
    })
    .await
    .ok()
}

/// A connection that never sends a byte, and a keep-alive connection idle after its response,
/// are closed after `idle_timeout`; a long-poll longer than that is not cut; a request head that
/// trickles in is closed after `header_read_timeout` from its first byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_idle_connections_close_after_idle_timeout_but_long_polls_do_not() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("idle-conns"));
    config.api.idle_timeout = Duration::from_secs(2);
    config.admin.idle_timeout = Duration::from_secs(2);
    config.api.header_read_timeout = Duration::from_secs(4);
    config.admin.header_read_timeout = Duration::from_secs(4);
    // Well beyond the idle timeout: hyper's own header timer (if it were used) would fire at 4 s.
    config.take.max_wait = Duration::from_secs(6);
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("q", b"opens the queue").await;
    assert!(zkq.take_body("q", "0s").await.is_some());
    for base in [&zkq.api, &zkq.admin] {
        let addr = base.trim_start_matches("http://").to_owned();
        let mut silent = tokio::net::TcpStream::connect(&addr).await.expect("connect");
        let mut idle = tokio::net::TcpStream::connect(&addr).await.expect("connect");
        idle.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        let mut slow = tokio::net::TcpStream::connect(&addr).await.expect("connect");
        slow.write_all(b"GET /livez HTTP/1.1\r\nX-Slow: 1\r\n").await.expect("write");
        let limit = Duration::from_secs(30);
        let (silent_closed, idle_closed, slow_closed) = tokio::join!(
            closed_within(&mut silent, limit),
            closed_within(&mut idle, limit),
            closed_within(&mut slow, limit)
        );
        println!(
            "{base}: silent closed after {silent_closed:?}, idle keep-alive after {idle_closed:?}, \
             slow head after {slow_closed:?}"
        );
        let within = |t: Option<Duration>, low: u64, high: u64| {
            t.is_some_and(|t| t >= Duration::from_millis(low) && t < Duration::from_millis(high))
        };
        assert!(within(silent_closed, 1500, 3900), "silent: {silent_closed:?} (idle_timeout 2s)");
        assert!(within(idle_closed, 1500, 3900), "idle keep-alive: {idle_closed:?} (idle_timeout 2s)");
        assert!(within(slow_closed, 3500, 20_000), "slow head: {slow_closed:?} (header_read_timeout 4s)");
    }
    // A long-poll of 6 s on a connection idle-limited to 2 s gets its answer.
    let addr = zkq.api.trim_start_matches("http://").to_owned();
    let mut poll = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    poll.write_all(b"POST /v1/queues/q/take?wait=6s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        .await
        .expect("write");
    let started = Instant::now();
    let mut answer = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(30), poll.read(&mut answer)).await;
    let text = String::from_utf8_lossy(read.ok().and_then(Result::ok).map_or(&[][..], |n| &answer[..n])).into_owned();
    assert!(text.starts_with("HTTP/1.1 204"), "the long-poll was cut after {:?}: {text:?}", started.elapsed());
    assert!(started.elapsed() >= Duration::from_millis(5500), "answered after {:?}", started.elapsed());
}

/// A node that is not a Curator envelope, put between refreshes into a queue with a dead-letter
/// queue, is moved there promptly without any client request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_nodes_move_to_the_dead_letter_queue_without_a_request() {
    let zk = ZkServer::shared();
    let root = unique_root("prompt-dlq");
    let mut config = test_config(zk, &root);
    config.queues.insert(
        "src".parse().expect("a valid name"),
        zkq::config::QueueConfig {
            kind: QueueKind::Fifo,
            path: None,
            lock_path: None,
            max_items: None,
            max_deliveries: None,
            dead_letter: Some("src-dlq".parse().expect("a valid name")),
            push: None,
            idempotency_window: None,
            grouped: false,
            sqs_binary_bodies: None,
            retention: None,
        },
    );
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("src", b"good").await;
    let direct = zk_client(zk).await;
    let queue = format!("{root}/queues/src");
    eventually(Duration::from_secs(10), "the queue node exists", || async {
        direct.check_stat(&queue).await.ok().flatten().is_some()
    })
    .await;
    let sequential = zookeeper_client::CreateMode::PersistentSequential.with_acls(zookeeper_client::Acls::anyone_all());
    direct.create(&format!("{queue}/queue-"), b"raw bytes", &sequential).await.expect("raw node");
    eventually(Duration::from_secs(30), "the undecodable node is moved to the dead-letter queue", || async {
        children(&direct, &queue).await.len() == 1
            && children(&direct, &format!("{root}/queues/src-dlq")).await.len() == 1
    })
    .await;
    assert!(zkq.metrics().await.contains("zkq_messages_dead_lettered_total{queue=\"src\"} 1"));
    let lines = Curator::run(zk, &["consume", "fifo", &format!("{root}/queues/src-dlq"), "1", "15000"]).await;
    assert_eq!(lines, [hex(b"raw bytes"), "DONE 1".to_owned()], "readable by Curator");
    assert_eq!(zkq.take_body("src", "0s").await.as_deref(), Some(b"good".as_slice()), "the good message stays");
}

/// Figures: the memory of 10,000 idle connections and how fast `/livez` answers meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_connections_cost_little_memory_and_do_not_slow_livez() {
    let wanted: usize = 10_000;
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed; the child inherits it.
    #[allow(unsafe_code)]
    let raised = unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && {
            limit.rlim_cur = limit.rlim_max.min(65_536);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0
        }
    };
    // Both ends of each connection live on this machine: the test's and zkq's descriptors.
    let connections =
        if raised { wanted.min(usize::try_from(limit.rlim_cur).unwrap_or(0).saturating_sub(500)) } else { 500 };
    if connections < wanted {
        println!("NOTE: open-file limit {} allows only {connections} connections", limit.rlim_cur);
    }
    let zk = ZkServer::shared();
    let env = [("ZKQ__API__MAX_CONNECTIONS", "20000"), ("ZKQ__API__IDLE_TIMEOUT", "10m")];
    let zkq = ChildZkq::start(zk, &unique_root("ten-thousand"), &env).await;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("client");
    let before = rss_kib(zkq.pid());
    let addr = zkq.api.trim_start_matches("http://").to_owned();
    let mut held = Vec::with_capacity(connections);
    while held.len() < connections {
        match tokio::net::TcpStream::connect(&addr).await {
            Ok(stream) => held.push(stream),
            Err(err) => panic!("connection {} refused: {err}", held.len()),
        }
    }
    // Every connection accepted and watched: zkq's descriptors grow by the number held.
    let open_fds = || std::fs::read_dir(format!("/proc/{}/fd", zkq.pid())).map_or(0, Iterator::count);
    eventually(Duration::from_secs(60), "zkq accepted every connection", || {
        std::future::ready(open_fds() >= connections)
    })
    .await;
    let during = rss_kib(zkq.pid());
    let mut livez = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let response = http.get(format!("{}/livez", zkq.admin)).send().await.expect("livez");
        assert_eq!(response.status(), 200);
        livez.push(started.elapsed());
    }
    let slowest = livez.iter().max().copied().unwrap_or_default();
    println!(
        "FIGURES: {} idle connections: zkq RSS {before} KiB before, {during} KiB with them ({} bytes per \
         connection); /livez answered in {livez:?}",
        held.len(),
        (during.saturating_sub(before) * 1024) / u64::try_from(held.len().max(1)).unwrap_or(1)
    );
    assert!(slowest < Duration::from_secs(5), "/livez took {slowest:?}");
    assert!(during < before + 256 * 1024, "RSS grew from {before} KiB to {during} KiB");
}

/// A client that sends its headers and then trickles its body is answered 408
/// `request_timeout` after `api.body_read_timeout`: it no longer holds a connection and one of
/// the `api.max_concurrent_requests` permits for ever, and nothing it half-sent is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_is_answered_408_and_frees_its_permit() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("trickle"));
    config.api.max_concurrent_requests = 2;
    config.api.body_read_timeout = Duration::from_secs(2);
    let zkq = TestZkq::start_ready(config).await;
    let addr = zkq.api.trim_start_matches("http://").to_owned();
    let tricklers: Vec<_> = (0..2)
        .map(|_| {
            let addr = addr.clone();
            tokio::spawn(async move {
                let stream = tokio::net::TcpStream::connect(&addr).await.expect("connect");
                let (mut read, mut write) = stream.into_split();
                let head = "POST /v1/queues/q/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n";
                write.write_all(head.as_bytes()).await.expect("head");
                // One byte at a time, each well within any idle timeout: the body never ends.
                let trickle = async move {
                    while write.write_all(b"x").await.is_ok() {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    // Closed by zkq: the answer decides.
                    std::future::pending::<()>().await;
                };
                let answer = async move {
                    let mut answer = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !String::from_utf8_lossy(&answer).contains('}') {
                        match read.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => answer.extend_from_slice(&buf[..n]),
                        }
                    }
                    String::from_utf8_lossy(&answer).into_owned()
                };
                tokio::select! {
                    answer = answer => Some(answer),
                    () = trickle => None,
                    () = tokio::time::sleep(Duration::from_secs(30)) => None,
                }
            })
        })
        .collect();
    let info = zkq.url("/v1/queues/q");
    for trickler in tricklers {
        let answer = trickler.await.expect("join").expect("an answer to the trickled request");
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("\"code\":\"request_timeout\""), "{answer}");
    }
    // They held both permits; those are free again, and nothing they half-sent was stored.
    eventually(Duration::from_secs(20), "requests to be served again", || {
        let (http, info) = (zkq.http.clone(), info.clone());
        async move { http.get(info).send().await.is_ok_and(|r| r.status() != 503) }
    })
    .await;
    assert_eq!(zkq.take("q", "0s").await.status(), 204);
}

/// An answer given with the request's body left unread (413: declared too large) says
/// `Connection: close`: hyper closes such a connection once it answered, and a pooled client
/// that was not told would send its next request on it and see that request fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_refused_unread_is_answered_with_connection_close_and_the_next_request_is_served() {
    let zk = ZkServer::shared();
    let config = test_config(zk, &unique_root("close-413"));
    let max = config.api.max_message_bytes;
    let zkq = TestZkq::start_ready(config).await;
    for _ in 0..10 {
        let refused = zkq.put("q", &vec![0u8; max + 1]).await;
        assert_eq!(refused.status(), 413);
        let connection = refused.headers().get("connection").and_then(|v| v.to_str().ok()).map(str::to_owned);
        assert_eq!(connection.as_deref(), Some("close"), "413 with the body unread");
        // The same pooled client, at once.
        assert_eq!(zkq.take("q", "0").await.status(), 204);
    }
}
