//! Message move tasks across sidecars: a cancel from another sidecar stops the task before it
//! answers, a task never writes over another task's node, a destination that could store a
//! message twice is refused, and a node another client left at `{root}/moves/{source}` does not
//! block the source for ever.

use std::time::Duration;

use zkq_testkit::*;

const GET: reqwest::Method = reqwest::Method::GET;
const POST: reqwest::Method = reqwest::Method::POST;

/// One SQS JSON-protocol call to the listener at `endpoint`.
async fn sqs_call(endpoint: &str, target: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let response = reqwest::Client::new()
        .post(endpoint)
        .header("content-type", "application/x-amz-json-1.0")
        .header("x-amz-target", format!("AmazonSQS.{target}"))
        .body(body.to_string())
        .send()
        .await
        .expect("call");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(serde_json::Value::Null))
}

fn arn(queue: &str) -> String {
    format!("arn:aws:sqs:us-east-1:000000000000:{queue}")
}

fn sqs_endpoint(zkq: &TestZkq) -> String {
    format!("http://{}", zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("the SQS listener is bound"))
}

/// A configuration with the SQS listener and two fifo queues, `orders` and `orders-dlq`.
fn configure(zk: &ZkServer, root: &str) -> zkq::config::Config {
    let mut config = test_config(zk, root);
    config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
    declare(&mut config, "orders", zkq::config::QueueKind::Fifo, None, None);
    declare(&mut config, "orders-dlq", zkq::config::QueueKind::Fifo, None, None);
    config
}

async fn put_dead(api: &Api, count: usize) {
    let messages: Vec<serde_json::Value> =
        (0..count).map(|i| serde_json::json!({ "text": format!("dead {i}") })).collect();
    for chunk in messages.chunks(100) {
        let put = api.batch_put("orders-dlq", "", &serde_json::json!({ "messages": chunk })).await;
        assert_eq!(put.status, 201, "{}", put.text());
    }
}

/// The task `handle` as `zkq` lists it, or null.
async fn listed_task(zkq: &TestZkq, handle: &str) -> serde_json::Value {
    let listed = zkq.client().send(GET, "/v1/queues/orders-dlq/redrive", None).await.json();
    listed["tasks"].as_array().into_iter().flatten().find(|t| t["handle"] == handle).cloned().unwrap_or_default()
}

/// The task `handle` as `zkq` lists it, once it is no longer running.
async fn ended_task(zkq: &TestZkq, handle: &str) -> serde_json::Value {
    eventually(Duration::from_secs(60), &format!("task {handle} ended"), || async {
        let task = listed_task(zkq, handle).await;
        !task.is_null() && task["status"] != "RUNNING"
    })
    .await;
    listed_task(zkq, handle).await
}

/// Every body left in `queue`, taken.
async fn drain(api: &Api, queue: &str) -> Vec<String> {
    let mut bodies = Vec::new();
    loop {
        let taken = api.take(queue, "max=100&wait=0").await;
        if taken.status != 200 {
            return bodies;
        }
        for message in taken.json()["messages"].as_array().cloned().unwrap_or_default() {
            bodies.push(message["body"].as_str().unwrap_or_default().to_owned());
        }
    }
}

/// A task started on A and cancelled through B before it first wrote its counts: the cancel
/// answered `moved: 0`, the task went on moving beside the task B started next for the same
/// source (it wrote over that task's node, whose version was its own), and ended `COMPLETED`.
/// Now the cancel answers once the task has stopped, with what it moved, and nothing moves after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_cancelled_from_another_sidecar_stops_before_the_cancel_answers_and_the_next_runs_alone() {
    let zk = ZkServer::shared();
    let root = unique_root("redrive-cancel");
    let (a, b) = (TestZkq::start_ready(configure(zk, &root)).await, TestZkq::start_ready(configure(zk, &root)).await);
    let (ea, eb) = (sqs_endpoint(&a), sqs_endpoint(&b));
    let api = a.client();
    put_dead(&api, 400).await;
    let start = |endpoint: String, rate: u32| async move {
        let input = serde_json::json!({ "SourceArn": arn("orders-dlq"), "DestinationArn": arn("orders"),
            "MaxNumberOfMessagesPerSecond": rate });
        let (status, started) = sqs_call(&endpoint, "StartMessageMoveTask", input).await;
        assert_eq!(status, 200, "{started}");
        started["TaskHandle"].as_str().expect("a handle").to_owned()
    };

    let first = start(ea.clone(), 20).await;
    let (status, cancelled) = sqs_call(&eb, "CancelMessageMoveTask", serde_json::json!({ "TaskHandle": first })).await;
    assert_eq!(status, 200, "{cancelled}");
    let answered = cancelled["ApproximateNumberOfMessagesMoved"].as_u64().expect("a count");
    let stored_at_cancel = api.info("orders").await.json()["depth"].as_u64().expect("a depth");
    let second = start(eb.clone(), 500).await;

    let second_task = ended_task(&b, &second).await;
    let first_task = ended_task(&a, &first).await;
    assert_eq!(first_task["status"], "CANCELLED", "{first_task}");
    assert_eq!(
        first_task["moved"].as_u64(),
        Some(stored_at_cancel),
        "the cancelled task moved after the cancel answered"
    );
    assert_eq!(answered, stored_at_cancel, "the cancel answers what the task moved");
    assert_eq!(second_task["status"], "COMPLETED", "{second_task}");
    assert_eq!(second_task["moved"].as_u64(), Some(400 - stored_at_cancel), "{second_task}");

    let bodies = drain(&api, "orders").await;
    let unique: std::collections::HashSet<&String> = bodies.iter().collect();
    assert_eq!((bodies.len(), unique.len()), (400, 400), "each dead letter moved once");
    assert!(drain(&api, "orders-dlq").await.is_empty());
}

/// A destination whose idempotency window ends before a moved message could be moved again
/// (its 60 s lease expired) would store it twice: such a task is refused at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_whose_idempotency_window_could_forget_a_move_is_refused() {
    let zk = ZkServer::shared();
    let root = unique_root("redrive-window");
    let mut config = configure(zk, &root);
    config.queues.get_mut("orders").expect("declared").idempotency_window = Some(Duration::from_secs(120));
    let zkq = TestZkq::start_ready(config).await;
    let api = zkq.client();
    put_dead(&api, 1).await;
    let refused =
        api.send_json(POST, "/v1/queues/orders-dlq/redrive", &serde_json::json!({ "destination": "orders" })).await;
    assert_eq!((refused.status, refused.code.as_str()), (400, "invalid_parameter"), "{}", refused.text());
    assert!(refused.text().contains("idempotency window"), "{}", refused.text());
    let input = serde_json::json!({ "SourceArn": arn("orders-dlq"), "DestinationArn": arn("orders") });
    let (status, refused) = sqs_call(&sqs_endpoint(&zkq), "StartMessageMoveTask", input).await;
    assert_eq!(
        (status, refused["__type"].as_str()),
        (400, Some("com.amazonaws.sqs#InvalidParameterValueException")),
        "{refused}"
    );
    assert_eq!(drain(&api, "orders-dlq").await.len(), 1, "nothing moved");
}

/// A node another client wrote at `{root}/moves/orders-dlq` (not a task's) answered every
/// `StartMessageMoveTask` "a task is already running", and no cancel could clear it. Now the next
/// start replaces it, logged and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_node_at_a_sources_moves_node_is_replaced_by_the_next_task() {
    let zk = ZkServer::shared();
    let root = unique_root("redrive-foreign");
    let zkq = TestZkq::start_ready(configure(zk, &root)).await;
    let api = zkq.client();
    put_dead(&api, 5).await;
    let direct = zk_client(zk).await;
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    direct.mkdir(&format!("{root}/moves"), &options).await.expect("moves directory");
    direct.create(&format!("{root}/moves/orders-dlq"), b"\x00not a task", &options).await.expect("a foreign node");

    let input = serde_json::json!({ "SourceArn": arn("orders-dlq"), "DestinationArn": arn("orders") });
    let (status, started) = sqs_call(&sqs_endpoint(&zkq), "StartMessageMoveTask", input).await;
    assert_eq!(status, 200, "{started}");
    let handle = started["TaskHandle"].as_str().expect("a handle").to_owned();
    assert_eq!(ended_task(&zkq, &handle).await["status"], "COMPLETED");
    assert_eq!(drain(&api, "orders").await.len(), 5, "every message moved");
    let metrics = zkq.metrics().await;
    assert_eq!(metric_value(&metrics, "zkq_foreign_nodes_total{node=\"move_task\"}"), Some(1.0), "counted once");
}
