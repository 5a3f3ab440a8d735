//! The benchmarks' HTTP workloads: single and batch puts of numbered bodies, drains by take and by
//! lease+ack (single or `?max=`), and the check that every body came out exactly once. Each
//! drives one zkq's API, in this process or a child process ([`Endpoint`]).

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;

use crate::instance::{ChildZkq, TestZkq};
use crate::load::body;

/// Where a zkq's API is: in this process, or a child process.
#[derive(Clone)]
pub struct Endpoint {
    pub http: reqwest::Client,
    pub api: String,
}

impl Endpoint {
    /// The API of an in-process zkq, through its own client.
    pub fn of(zkq: &TestZkq) -> Endpoint {
        Endpoint { http: zkq.http.clone(), api: zkq.api.clone() }
    }

    /// The API of a child-process zkq.
    pub fn child(zkq: &ChildZkq) -> Endpoint {
        Endpoint { http: bench_http(), api: zkq.api.clone() }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.api)
    }
}

/// An HTTP client for benchmark load: long timeout, keep-alive.
pub fn bench_http() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("http client")
}

/// Single puts of the bodies `range` to `queue` from `clients` concurrent clients.
pub async fn put_singles(zkq: &Endpoint, queue: &str, range: Range<usize>, clients: usize) -> Duration {
    let next = Arc::new(AtomicUsize::new(range.start));
    let url = zkq.url(&format!("/v1/queues/{queue}/messages"));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (http, url, next, end) = (zkq.http.clone(), url.clone(), next.clone(), range.end);
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return;
                }
                let status = http.post(&url).body(body(i)).send().await.expect("put").status();
                assert_eq!(status, 201);
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("putter");
    }
    started.elapsed()
}

/// Batch puts (`per_batch` messages each) of the bodies of every `(queue, range)`, batches of the
/// queues interleaved, from `clients` concurrent clients.
pub async fn put_batches(
    zkq: &Endpoint,
    targets: &[(&str, Range<usize>)],
    per_batch: usize,
    clients: usize,
) -> Duration {
    let mut per_queue: Vec<Vec<(String, Range<usize>)>> = targets
        .iter()
        .map(|(queue, range)| {
            range
                .clone()
                .step_by(per_batch)
                .map(|start| ((*queue).to_owned(), start..(start + per_batch).min(range.end)))
                .collect()
        })
        .collect();
    let mut jobs = Vec::new();
    while per_queue.iter().any(|q| !q.is_empty()) {
        for queue in &mut per_queue {
            if !queue.is_empty() {
                jobs.push(queue.remove(0));
            }
        }
    }
    let jobs = Arc::new(jobs);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (http, base, jobs, next) = (zkq.http.clone(), zkq.api.clone(), jobs.clone(), next.clone());
        tasks.spawn(async move {
            loop {
                let Some((queue, range)) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) else { return };
                let messages: Vec<serde_json::Value> = range
                    .clone()
                    .map(|i| serde_json::json!({"text": String::from_utf8(body(i)).expect("ascii body")}))
                    .collect();
                let response = http
                    .post(format!("{base}/v1/queues/{queue}/batch"))
                    .json(&serde_json::json!({ "messages": messages }))
                    .send()
                    .await
                    .expect("batch put");
                assert_eq!(response.status(), 201);
                let answer: serde_json::Value = response.json().await.expect("json");
                assert_eq!(answer["message_ids"].as_array().map(Vec::len), Some(range.len()));
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("batch putter");
    }
    started.elapsed()
}

/// Bodies (and lease receipts) of a `?max=` answer.
fn delivered_bodies(answer: &serde_json::Value) -> Vec<(Vec<u8>, Option<String>)> {
    let b64 = base64::engine::general_purpose::STANDARD;
    answer["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            let bytes = b64.decode(m["body"].as_str().expect("body")).expect("base64");
            (bytes, m["lease"].as_str().map(str::to_owned))
        })
        .collect()
}

/// Drains `queue` with `takers` concurrent takers (`wait=0s`, each stops at its first 204);
/// `max` takes many per request. Answers every body taken.
pub async fn drain_takes(zkq: &Endpoint, queue: &str, takers: usize, max: Option<usize>) -> (Vec<Vec<u8>>, Duration) {
    let url = match max {
        Some(max) => zkq.url(&format!("/v1/queues/{queue}/take?wait=0s&max={max}")),
        None => zkq.url(&format!("/v1/queues/{queue}/take?wait=0s")),
    };
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..takers {
        let (http, url) = (zkq.http.clone(), url.clone());
        tasks.spawn(async move {
            let mut got = Vec::new();
            loop {
                let response = http.post(&url).send().await.expect("take");
                match (response.status().as_u16(), max) {
                    (200, None) => got.push(response.bytes().await.expect("body").to_vec()),
                    (200, Some(_)) => {
                        let answer: serde_json::Value = response.json().await.expect("json");
                        got.extend(delivered_bodies(&answer).into_iter().map(|(body, _)| body));
                    },
                    (204, _) => return got,
                    (other, _) => panic!("take: {other} {}", response.text().await.unwrap_or_default()),
                }
            }
        });
    }
    let mut bodies = Vec::new();
    while let Some(got) = tasks.join_next().await {
        bodies.extend(got.expect("taker"));
    }
    (bodies, started.elapsed())
}

/// Drains `queue` with `consumers` concurrent lease+ack consumers (`wait=0s`, each stops at its
/// first 204): single leases and acks, or with `max`, leases of many and one batch ack per lease.
pub async fn drain_leases(
    zkq: &Endpoint,
    queue: &str,
    consumers: usize,
    max: Option<usize>,
) -> (Vec<Vec<u8>>, Duration) {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..consumers {
        let (http, base, queue) = (zkq.http.clone(), zkq.api.clone(), queue.to_owned());
        tasks.spawn(async move {
            let mut got = Vec::new();
            let lease_url = match max {
                Some(max) => format!("{base}/v1/queues/{queue}/leases?wait=0s&visibility=60s&max={max}"),
                None => format!("{base}/v1/queues/{queue}/leases?wait=0s&visibility=60s"),
            };
            loop {
                let response = http.post(&lease_url).send().await.expect("lease");
                match response.status().as_u16() {
                    204 => return got,
                    200 => {},
                    other => panic!("lease: {other} {}", response.text().await.unwrap_or_default()),
                }
                if max.is_none() {
                    let receipt = response.headers()["zkq-lease"].to_str().expect("ascii").to_owned();
                    got.push(response.bytes().await.expect("body").to_vec());
                    let url = format!("{base}/v1/queues/{queue}/leases/{receipt}");
                    assert_eq!(http.delete(url).send().await.expect("ack").status(), 204);
                    continue;
                }
                let answer: serde_json::Value = response.json().await.expect("json");
                let (bodies, receipts): (Vec<_>, Vec<_>) = delivered_bodies(&answer).into_iter().unzip();
                let receipts: Vec<String> = receipts.into_iter().map(|r| r.expect("receipt")).collect();
                let acked = http
                    .post(format!("{base}/v1/queues/{queue}/acks"))
                    .json(&serde_json::json!({ "leases": receipts }))
                    .send()
                    .await
                    .expect("batch ack");
                assert_eq!(acked.status(), 200);
                let acked: serde_json::Value = acked.json().await.expect("json");
                let results = acked["results"].as_array().expect("results");
                assert_eq!(results.len(), receipts.len());
                assert!(results.iter().all(|r| r["status"] == 204), "every ack applied: {acked}");
                got.extend(bodies);
            }
        });
    }
    let mut bodies = Vec::new();
    while let Some(got) = tasks.join_next().await {
        bodies.extend(got.expect("consumer"));
    }
    (bodies, started.elapsed())
}

/// Every body of `range` came out exactly once.
pub fn assert_exactly_once(what: &str, got: Vec<Vec<u8>>, range: Range<usize>) {
    assert_exactly_these(what, got, range.map(body).collect());
}

/// Every body of `expected` came out exactly once, and nothing else.
pub fn assert_exactly_these(what: &str, mut got: Vec<Vec<u8>>, mut expected: Vec<Vec<u8>>) {
    got.sort_unstable();
    expected.sort_unstable();
    assert_eq!(got.len(), expected.len(), "{what}: messages drained");
    assert!(got == expected, "{what}: every body exactly once");
}
