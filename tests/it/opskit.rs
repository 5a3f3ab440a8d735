//! The operations kit against the real thing: every PromQL expression of the Grafana dashboard
//! parses and returns data from a real Prometheus that scraped a zkq after a workload (puts,
//! takes, leases, acks, nacks, an expired lease, a dead letter), and the alert rules load and
//! evaluate there; the metrics the alerts need move as they should.

use std::process::{Command, Stdio};
use std::time::Duration;

use zkq::config::QueueKind;

use zkq_testkit::*;

/// Kills a child process when dropped.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A private Prometheus (Debian's package) scraping `target` every second and evaluating zkq's
/// rules file every second.
struct Prometheus {
    url: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
    _server: ChildGuard,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let dir = tempfile::Builder::new().prefix("zkq-prometheus-").tempdir().expect("temp dir");
        let rules = repo_file("helm/monitoring/zkq-alerts.yaml");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - '{}'\nscrape_configs:\n  \
             - job_name: zkq\n    static_configs:\n      - targets: ['{target}']\n",
            rules.display()
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).expect("config");
        let port = free_port();
        let mut command = Command::new("prometheus");
        command
            .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let server = spawn_supervised(command).expect("prometheus (Debian's package) starts");
        Prometheus {
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("client"),
            _dir: dir,
            _server: ChildGuard(server),
        }
    }

    /// The answer of `/api/v1/query` for `expr`, or `None` while Prometheus does not answer.
    async fn query(&self, expr: &str) -> Option<serde_json::Value> {
        let url = format!("{}/api/v1/query?query={}", self.url, percent_encode(expr));
        self.http.get(url).send().await.ok()?.json().await.ok()
    }

    async fn get(&self, path: &str) -> Option<serde_json::Value> {
        self.http.get(format!("{}{path}", self.url)).send().await.ok()?.json().await.ok()
    }
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Whether a query answer holds at least one sample with a finite value.
fn has_finite_sample(answer: &serde_json::Value) -> bool {
    answer["data"]["result"].as_array().is_some_and(|series| {
        series.iter().any(|s| s["value"][1].as_str().and_then(|v| v.parse::<f64>().ok()).is_some_and(f64::is_finite))
    })
}

/// Every query of the dashboard, with Grafana's variables replaced the way "All" does (`.*`) and
/// `$__rate_interval` by one minute: panel targets as they are, and each `label_values(SELECTOR,
/// LABEL)` variable as `count by (LABEL) (SELECTOR)`.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo_file("helm/monitoring/zkq-dashboard.json")).expect("dashboard file");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let substitute = |expr: &str| {
        expr.replace("$__rate_interval", "1m").replace("$namespace", ".*").replace("$job", ".*").replace("$queue", ".*")
    };
    let mut queries = Vec::new();
    fn panels(value: &serde_json::Value, out: &mut Vec<(String, String)>) {
        for panel in value.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push((format!("panel {:?} {}", panel["title"], target["refId"]), expr.to_owned()));
                }
            }
            panels(&panel["panels"], out);
        }
    }
    let mut raw = Vec::new();
    panels(&dashboard["panels"], &mut raw);
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"].as_str().or(variable["query"].as_str()).expect("a variable query");
        let inner = query.strip_prefix("label_values(").and_then(|q| q.strip_suffix(')')).expect("label_values");
        let (selector, label) = inner.rsplit_once(',').expect("label_values(SELECTOR, LABEL)");
        raw.push((format!("variable {}", variable["name"]), format!("count by ({}) ({selector})", label.trim())));
    }
    for (what, expr) in raw {
        queries.push((what, substitute(&expr)));
    }
    queries
}

#[test]
fn the_dashboard_queries_every_area_and_uses_only_all_compatible_variables() {
    let queries = dashboard_queries();
    assert!(queries.len() >= 25, "{queries:?}");
    for metric in [
        "zkq_queue_children{",
        "zkq_queue_oldest_message_age_seconds",
        "zkq_messages_put_total",
        "zkq_messages_taken_total",
        "zkq_messages_leased_total",
        "zkq_messages_acked_total",
        "zkq_leases_in_flight",
        "zkq_messages_dead_lettered_total",
        "zkq_http_request_duration_seconds_bucket",
        "zkq_zookeeper_requests_total",
        "zkq_zookeeper_connection_state",
    ] {
        assert!(queries.iter().any(|(_, q)| q.contains(metric)), "the dashboard shows no {metric}");
    }
    for (what, query) in &queries {
        assert!(!query.contains('$'), "{what}: an unreplaced variable in {query}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_expression_returns_data_from_a_real_prometheus_after_a_workload() {
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("opskit"));
    declare(&mut config, "work", QueueKind::Fifo, None, None);
    declare(&mut config, "poison", QueueKind::Fifo, None, None);
    if let Some(poison) = config.queues.get_mut("poison") {
        poison.max_deliveries = Some(1);
        poison.dead_letter = Some("poison.dlq".parse().expect("a valid name"));
    }
    declare(&mut config, "slow", QueueKind::Fifo, None, None);
    let zkq = TestZkq::start_ready(config).await;
    let prometheus = Prometheus::start(zkq.admin.trim_start_matches("http://"));
    eventually(Duration::from_secs(60), "Prometheus scrapes zkq", || async {
        prometheus.query("up{job=\"zkq\"} == 1").await.is_some_and(|a| has_finite_sample(&a))
    })
    .await;

    // The workload: puts and takes, a lease acked, a lease nacked and then dead-lettered
    // (max_deliveries = 1), a lease left to expire.
    for i in 0..20 {
        zkq.put_ok("work", format!("m{i}").as_bytes()).await;
    }
    for _ in 0..5 {
        assert!(zkq.take_body("work", "1s").await.is_some());
    }
    let lease = |queue: &'static str, visibility: &'static str| {
        let (http, url) =
            (zkq.http.clone(), zkq.url(&format!("/v1/queues/{queue}/leases?wait=1s&visibility={visibility}")));
        async move {
            let response = http.post(url).send().await.expect("lease");
            match response.status().as_u16() {
                200 => Some(response.headers()["zkq-lease"].to_str().expect("receipt").to_owned()),
                204 => None,
                other => panic!("lease from {queue}: {other}"),
            }
        }
    };
    let acked = lease("work", "30s").await.expect("a message to lease");
    let ack = zkq.http.delete(zkq.url(&format!("/v1/queues/work/leases/{acked}"))).send().await.expect("ack");
    assert_eq!(ack.status(), 204);
    zkq.put_ok("poison", b"fails every time").await;
    let first = lease("poison", "30s").await.expect("the poison message");
    let nack = zkq.http.post(zkq.url(&format!("/v1/queues/poison/leases/{first}/nack?mode=requeue"))).send();
    assert_eq!(nack.await.expect("nack").status(), 204);
    assert_eq!(lease("poison", "30s").await, None, "the second delivery goes to poison.dlq instead");
    assert_eq!(metric(&zkq.metrics().await, "zkq_messages_dead_lettered_total{queue=\"poison\"}"), 1.0);
    zkq.put_ok("slow", b"expires").await;
    assert!(lease("slow", "1s").await.is_some());
    eventually(Duration::from_secs(30), "the lease on slow expired", || async {
        metric(&zkq.metrics().await, "zkq_messages_expired_total{queue=\"slow\"}") >= 1.0
    })
    .await;

    // A trickle keeps every rate alive while the expressions are checked.
    let trickle = {
        let (http, put, take) =
            (zkq.http.clone(), zkq.url("/v1/queues/work/messages"), zkq.url("/v1/queues/work/take?wait=1s"));
        tokio::spawn(async move {
            loop {
                let _ = http.post(&put).body("trickle").send().await;
                let _ = http.post(&take).send().await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };

    let queries = dashboard_queries();
    for (what, expr) in &queries {
        let answer = prometheus.query(expr).await.expect("Prometheus answers");
        assert_eq!(answer["status"], "success", "{what}: `{expr}` does not parse or run: {answer}");
    }
    for (what, expr) in &queries {
        eventually(Duration::from_secs(60), &format!("{what}: `{expr}` returns data"), || async {
            prometheus.query(expr).await.is_some_and(|a| has_finite_sample(&a))
        })
        .await;
    }
    // The alert rules loaded and evaluate against real series without error.
    eventually(Duration::from_secs(30), "every alert rule evaluated with health ok", || async {
        let Some(rules) = prometheus.get("/api/v1/rules").await else { return false };
        let all: Vec<&serde_json::Value> = rules["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .collect();
        all.len() == 10 && all.iter().all(|r| r["health"] == "ok")
    })
    .await;
    // And the dead letter is an alert right away (its rule has no `for`).
    eventually(Duration::from_secs(30), "ZkqDeadLettersArriving fires for poison", || async {
        let Some(alerts) = prometheus.get("/api/v1/alerts").await else { return false };
        alerts["data"]["alerts"].as_array().into_iter().flatten().any(|a| {
            a["labels"]["alertname"] == "ZkqDeadLettersArriving"
                && a["labels"]["queue"] == "poison"
                && a["state"] == "firing"
        })
    })
    .await;
    trickle.abort();
}

/// The value of one series in a Prometheus text exposition; 0 when absent.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_message_age_grows_while_a_message_waits_and_drops_to_zero_when_taken() {
    let zk = ZkServer::shared();
    let zkq = TestZkq::start_ready(test_config(zk, &unique_root("oldest-age"))).await;
    zkq.put_ok("aging", b"first").await;
    zkq.put_ok("aging", b"second").await;
    let series = "zkq_queue_oldest_message_age_seconds{queue=\"aging\"}";
    eventually(Duration::from_secs(30), "the head's age is above a second", || async {
        metric(&zkq.metrics().await, series) >= 1.0
    })
    .await;
    let before = metric(&zkq.metrics().await, series);
    assert_eq!(zkq.take_body("aging", "1s").await.as_deref(), Some(&b"first"[..]));
    // The next head was put right after the first: its age is about as old, not reset.
    let after = metric(&zkq.metrics().await, series);
    assert!(after > 0.5 && after <= before + 5.0, "second head's age {after} (first was {before})");
    assert_eq!(zkq.take_body("aging", "1s").await.as_deref(), Some(&b"second"[..]));
    eventually(Duration::from_secs(10), "an empty queue has age 0", || async {
        metric(&zkq.metrics().await, series) == 0.0
    })
    .await;
    assert_eq!(metric(&zkq.metrics().await, "zkq_ready"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zkq_ready_says_what_readyz_says_through_a_zookeeper_outage() {
    let zk = ZkServer::start();
    let zkq = TestZkq::start_ready(test_config(&zk, &unique_root("ready-metric"))).await;
    assert_eq!(metric(&zkq.metrics().await, "zkq_ready"), 1.0);
    zk.stop();
    eventually(Duration::from_secs(30), "zkq_ready 0 while /readyz answers 503", || async {
        zkq.readyz().await.0 == 503 && metric(&zkq.metrics().await, "zkq_ready") == 0.0
    })
    .await;
    zk.restart();
    zkq.wait_ready().await;
    assert_eq!(metric(&zkq.metrics().await, "zkq_ready"), 1.0);
}
