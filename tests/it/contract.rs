//! The API contract: the committed OpenAPI document is what the server serves; the docs UI works
//! offline; metrics are right after a scripted workload and pass promtool; a real Prometheus
//! scrapes them.

use std::process::{Command, Stdio};
use std::time::Duration;

use zkq_testkit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_openapi_is_what_the_server_serves() {
    let zk = ZkServer::shared();
    let zkq = TestZkq::start(test_config(zk, &unique_root("openapi"))).await;
    let served = zkq.http.get(zkq.url("/openapi.json")).send().await.expect("spec").text().await.expect("text");
    let committed_path = repo_file("openapi/openapi.json");
    if std::env::var_os("ZKQ_UPDATE_OPENAPI").is_some() {
        std::fs::write(&committed_path, &served).expect("rewrite openapi/openapi.json");
    }
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    assert!(
        committed == served,
        "openapi/openapi.json differs from the served document; run \
         `ZKQ_UPDATE_OPENAPI=1 cargo test --test it committed_openapi` and commit the result"
    );
    let spec: serde_json::Value = serde_json::from_str(&served).expect("valid JSON");
    assert_eq!(spec["openapi"], "3.1.0");
    for path in ["/v1/queues", "/v1/queues/{queue}", "/v1/queues/{queue}/messages", "/v1/queues/{queue}/take"] {
        assert!(spec["paths"].get(path).is_some(), "{path} missing from the spec");
    }
    let docs = zkq.http.get(zkq.url("/docs/")).send().await.expect("docs");
    assert_eq!(docs.status(), 200);
    let html = docs.text().await.expect("html");
    assert!(html.contains("swagger-ui"), "the vendored UI is served");
    assert!(!html.contains("https://"), "the docs page loads nothing from the internet");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_happened_and_pass_promtool() {
    let zk = ZkServer::shared();
    let zkq = TestZkq::start_ready(test_config(zk, &unique_root("metrics"))).await;
    for body in [b"a", b"b", b"c"] {
        zkq.put_ok("m", body).await;
    }
    assert!(zkq.take_body("m", "0").await.is_some());
    assert!(zkq.take_body("m", "0").await.is_some());
    assert_eq!(zkq.put("bad name", b"x").await.status(), 400);
    let text = zkq.metrics().await;
    let expect = [
        ("zkq_messages_put_total{queue=\"m\"}", 3.0),
        ("zkq_messages_taken_total{queue=\"m\"}", 2.0),
        ("zkq_puts_in_flight{queue=\"m\"}", 0.0),
        ("zkq_waiting_takers{queue=\"m\"}", 0.0),
        ("zkq_zookeeper_connection_state{state=\"connected\"}", 1.0),
        ("zkq_zookeeper_connection_state{state=\"suspended\"}", 0.0),
        ("zkq_zookeeper_connection_state{state=\"lost\"}", 0.0),
        ("zkq_zookeeper_connection_state{state=\"read_only\"}", 0.0),
        ("zkq_http_requests_total{method=\"POST\",route=\"/v1/queues/{queue}/messages\",status=\"201\"}", 3.0),
        ("zkq_http_requests_total{method=\"POST\",route=\"/v1/queues/{queue}/take\",status=\"200\"}", 2.0),
        ("zkq_http_requests_total{method=\"POST\",route=\"/v1/queues/{queue}/messages\",status=\"400\"}", 1.0),
        ("zkq_build_info{version=\"0.1.0\"}", 1.0),
    ];
    for (series, value) in expect {
        assert_eq!(metric_value(&text, series), Some(value), "{series} in\n{text}");
    }
    // lastChildCount: children at the last refresh; 1 message is left once a refresh happened.
    eventually(Duration::from_secs(5), "zkq_queue_children reflects a refresh", || async {
        let q = zkq.http.post(zkq.url("/v1/queues/m/take?wait=0")).send().await.expect("take");
        assert!(q.status() == 200 || q.status() == 204);
        metric_value(&zkq.metrics().await, "zkq_queue_children{queue=\"m\"}") == Some(0.0)
    })
    .await;
    assert!(
        metric_value(&text, "zkq_zookeeper_requests_total{operation=\"create\",outcome=\"ok\"}").unwrap_or(0.0) >= 3.0
    );

    promtool_accepts(&text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_zkq() {
    let zk = ZkServer::shared();
    let zkq = TestZkq::start_ready(test_config(zk, &unique_root("prometheus"))).await;
    zkq.put_ok("scraped", b"x").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let target = zkq.admin.trim_start_matches("http://").to_owned();
    let config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: zkq\n    static_configs:\n      - targets: ['{target}']\n"
    );
    std::fs::write(dir.path().join("prometheus.yml"), config).expect("config");
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
    let mut prometheus = Command::new("prometheus");
    prometheus
        .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _server = ChildGuard(prometheus.spawn().expect("prometheus (Debian's package) is installed"));
    let query = format!("http://127.0.0.1:{port}/api/v1/query?query=zkq_messages_put_total");
    let http = zkq.http.clone();
    eventually(Duration::from_secs(60), "Prometheus has scraped zkq", || {
        let (http, query) = (http.clone(), query.clone());
        async move {
            let Ok(response) = http.get(&query).send().await else { return false };
            let Ok(body) = response.json::<serde_json::Value>().await else { return false };
            body["data"]["result"]
                .as_array()
                .is_some_and(|r| r.iter().any(|s| s["metric"]["queue"] == "scraped" && s["value"][1] == "1"))
        }
    })
    .await;
}

/// Kills a child process when dropped.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// schemathesis (installed by scripts/test.sh into target/tools-venv) fuzzes a live zkq backed by
/// real ZooKeeper with every check: no server error, no response that contradicts the spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing_against_a_live_zkq() {
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("schemathesis"));
    config.take.max_wait = Duration::from_millis(200);
    let zkq = TestZkq::start_ready(config).await;
    let tool = std::env::var("ZKQ_SCHEMATHESIS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| repo_file("target/tools-venv/bin/schemathesis"));
    let spec = repo_file("openapi/openapi.json");
    let url = zkq.api.clone();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(&tool)
            .arg("--config-file")
            .arg(repo_file("tests/schemathesis/schemathesis.toml"))
            .arg("run")
            .arg(spec)
            .args(["--url", &url, "--checks", "all", "--max-examples", "60", "--seed", "1", "--no-color"])
            // The stateful phase is left out: schemathesis 4.32 infers a link from the peek to
            // DELETE .../messages that drops its required `id`, then flags the 400 as a
            // rejected valid request.
            .args(["--phases", "examples,coverage,fuzzing"])
            .env("SCHEMATHESIS_HOOKS", "")
            .output()
            .unwrap_or_else(|e| panic!("{} runs (scripts/test.sh installs it): {e}", tool.display()))
    })
    .await
    .expect("join");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "schemathesis found problems:\n{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_kept_or_made_and_echoed_on_both_listeners() {
    let zk = ZkServer::shared();
    let zkq = TestZkq::start_ready(test_config(zk, &unique_root("request-id"))).await;
    let put = zkq.http.post(zkq.url("/v1/queues/q/messages")).header("x-request-id", "app-42").body("x").send();
    let put = put.await.expect("put");
    assert_eq!(put.status(), 201);
    assert_eq!(put.headers()["x-request-id"], "app-42", "an incoming id is kept");
    let error = zkq.http.post(zkq.url("/v1/queues/q/take?wait=soon")).header("x-request-id", "app-43").send();
    assert_eq!(error.await.expect("take").headers()["x-request-id"], "app-43", "errors echo it too");
    let mut made = Vec::new();
    for url in [zkq.url("/v1/queues/q"), format!("{}/livez", zkq.admin)] {
        let response = zkq.http.get(url).send().await.expect("get");
        let id = response.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        assert_eq!(id.len(), 36, "a UUID is made when the client sends none: {id:?}");
        made.push(id);
    }
    assert_ne!(made[0], made[1]);
}

/// The batch handlers refuse an empty batch (400); the document says so, so a client (or
/// schemathesis) never takes `{"messages": []}` or `{"leases": []}` for a valid request.
#[test]
fn the_document_states_that_a_batch_holds_at_least_one_item() {
    let spec: serde_json::Value =
        serde_json::from_str(&zkq::openapi_json(&zkq::config::Config::default())).expect("JSON");
    for (schema, field) in [("BatchPutRequest", "messages"), ("BatchAckRequest", "leases")] {
        let property = &spec["components"]["schemas"][schema]["properties"][field];
        assert_eq!(property["minItems"], 1, "{schema}.{field}: {property}");
    }
}
