//! Listener slots: connections that hold a slot without a request in flight (a request head that
//! never ends, a connection that sends nothing) cannot keep probes and the app out.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use zkq_testkit::*;

/// The listener's open connections, read in process (a scrape would itself need a slot).
fn open_connections(zkq: &TestZkq, listener: &str) -> f64 {
    metric(&zkq.registered_metrics(), &format!("zkq_http_connections_open{{listener=\"{listener}\"}}"))
}

/// Fills every slot of `listener` with connections that sent a request line and one header and
/// stop there, waiting after each until zkq serves it; then opens as many again. Returns them
/// all: they must stay open for the rest of the test.
async fn hold_every_slot(zkq: &TestZkq, listener: &str, base: &str, max: usize) -> Vec<TcpStream> {
    let addr = base.trim_start_matches("http://").to_owned();
    let mut held = Vec::new();
    let start = open_connections(zkq, listener) as usize;
    for i in 1..=max {
        let mut stream = TcpStream::connect(&addr).await.expect("connect");
        stream.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n").await.expect("write");
        held.push(stream);
        let expected = (start + i).min(max) as f64;
        eventually(Duration::from_secs(10), &format!("{listener}: {expected} connections open"), || async {
            open_connections(zkq, listener) >= expected
        })
        .await;
    }
    // Every slot is held now; as many again beyond the limit.
    for _ in 0..max {
        let mut stream = TcpStream::connect(&addr).await.expect("connect");
        stream.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n").await.expect("write");
        held.push(stream);
    }
    held
}

/// A client with a fresh connection for every request, giving up after 3 s.
fn impatient_client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(3)).pool_max_idle_per_host(0).build().expect("client")
}

fn reclaimed(zkq: &TestZkq, listener: &str) -> f64 {
    metric_sum(
        &zkq.registered_metrics(),
        "zkq_http_connections_reclaimed_total",
        &[&format!("listener=\"{listener}\"")],
        &[],
    )
}

/// Twice `admin.max_connections` connections whose headers never end: `/livez` and `/readyz`
/// are still answered at once (a probe used to wait in the listen backlog until
/// `header_read_timeout` closed them; the kubelet gives up after 1 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_answered_while_slow_headers_hold_every_admin_slot() {
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("admin-slots"));
    config.admin.max_connections = 8;
    let zkq = TestZkq::start_ready(config).await;
    let held = hold_every_slot(&zkq, "admin", &zkq.admin, 8).await;
    let http = impatient_client();
    for probe in ["/livez", "/readyz"] {
        let started = std::time::Instant::now();
        let answer = http.get(format!("{}{probe}", zkq.admin)).send().await;
        let status = answer.map(|a| a.status().as_u16());
        println!("{probe} behind {} slow connections: {status:?} after {:?}", held.len(), started.elapsed());
        assert!(matches!(status, Ok(200)), "{probe} with every admin slot held: {status:?}");
    }
    assert!(reclaimed(&zkq, "admin") >= 1.0, "slots were reclaimed");
    assert!(open_connections(&zkq, "admin") <= 8.0, "never more than admin.max_connections served");
    drop(held);
}

/// Twice `api.max_connections` connections whose headers never end: a put and a take are still
/// answered at once, and a long-poll that was waiting all along gets its message (a request in
/// flight is never closed to free its slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_and_take_are_answered_while_slow_headers_hold_every_api_slot() {
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("api-slots"));
    config.api.max_connections = 8;
    let zkq = TestZkq::start_ready(config).await;
    let addr = zkq.api.trim_start_matches("http://").to_owned();
    let mut poll = TcpStream::connect(&addr).await.expect("connect");
    poll.write_all(b"POST /v1/queues/polled/take?wait=20s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        .await
        .expect("write");
    eventually(Duration::from_secs(10), "the long-poll waits", || async {
        metric(&zkq.registered_metrics(), "zkq_waiting_takers{queue=\"polled\"}") >= 1.0
    })
    .await;

    let held = hold_every_slot(&zkq, "api", &zkq.api, 8).await;
    let api = Api::new(impatient_client(), &zkq.api);
    let put = api.try_send(reqwest::Method::POST, "/v1/queues/work/messages", Some(b"work".to_vec())).await;
    let put = put.map(|a| a.status);
    assert!(matches!(put, Ok(201)), "put with every API slot held: {put:?}");
    let take = api.try_send(reqwest::Method::POST, "/v1/queues/work/take?wait=0s", None).await;
    let take = take.map(|a| (a.status, a.text()));
    assert!(matches!(&take, Ok((200, body)) if body == "work"), "take with every API slot held: {take:?}");

    // The long-poll was in flight all along: its connection still gets its answer.
    let put = api.try_send(reqwest::Method::POST, "/v1/queues/polled/messages", Some(b"for the poll".to_vec())).await;
    let put = put.map(|a| a.status);
    assert!(matches!(put, Ok(201)), "put for the long-poll: {put:?}");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        while !String::from_utf8_lossy(&answer).contains("for the poll") {
            match poll.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&answer);
    assert!(read.is_ok(), "no answer to the long-poll: {text:?}");
    assert!(text.starts_with("HTTP/1.1 200") && text.contains("for the poll"), "the long-poll was cut: {text:?}");
    assert!(reclaimed(&zkq, "api") >= 1.0, "slots were reclaimed");
    drop(held);
}

/// The SQS-compatible listener has the API's limits and its own slots: an SQS call is answered
/// with twice `api.max_connections` slow-header connections on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_calls_are_answered_while_slow_headers_hold_every_sqs_slot() {
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("sqs-slots"));
    config.api.max_connections = 8;
    config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
    let zkq = TestZkq::start_ready(config).await;
    let endpoint = format!("http://{}", zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("the SQS listener"));
    let held = hold_every_slot(&zkq, "sqs", &endpoint, 8).await;
    let answer = impatient_client()
        .post(&endpoint)
        .header("content-type", "application/x-amz-json-1.0")
        .header("x-amz-target", "AmazonSQS.ListQueues")
        .body("{}")
        .send()
        .await
        .map(|a| a.status().as_u16());
    assert!(matches!(answer, Ok(200)), "ListQueues with every SQS slot held: {answer:?}");
    assert!(reclaimed(&zkq, "sqs") >= 1.0, "slots were reclaimed");
    drop(held);
}
