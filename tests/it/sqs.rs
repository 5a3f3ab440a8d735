//! The SQS-compatible API with real AWS clients: boto3 of today (the JSON protocol),
//! Debian's boto3 1.26 / botocore 1.29 (the query protocol), each running the same producer and
//! consumer session (`tests/sqs/client.py`) against a zkq; Debian's AWS CLI; the bridge to
//! zkq's own API; and Celery workers with zkq as their broker.

use std::path::PathBuf;
use std::time::{Duration, Instant};
use zkq_testkit::*;

/// The Python with boto3 of today (installed by scripts/test.sh), and Debian's.
fn pythons() -> [(PathBuf, &'static str); 2] {
    let venv = std::env::var_os("ZKQ_BOTO3_PYTHON")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/tools-venv/bin/python"), PathBuf::from);
    [(venv, "json"), (PathBuf::from("/usr/bin/python3"), "query")]
}

async fn zkq_with_sqs(root: &str) -> (TestZkq, String) {
    let mut config = test_config(ZkServer::shared(), root);
    config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
    let zkq = TestZkq::start(config).await;
    let addr = zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("the SQS listener is bound");
    (zkq, format!("http://{addr}"))
}

async fn run_client(python: PathBuf, endpoint: String, queue: String, protocol: &str) -> std::process::Output {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sqs/client.py");
    let protocol = protocol.to_owned();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(&python)
            .arg(script)
            .args([endpoint, queue, protocol])
            .output()
            .unwrap_or_else(|err| panic!("{} runs: {err}", python.display()))
    })
    .await
    .expect("join")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boto3_runs_every_served_action_in_both_wire_protocols() {
    let root = unique_root("sqs-boto3");
    let (_zkq, endpoint) = zkq_with_sqs(&root).await;
    for (python, protocol) in pythons() {
        let queue = format!("orders-{protocol}");
        let output = run_client(python, endpoint.clone(), queue, protocol).await;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let checks: usize =
            stdout.strip_prefix("ok ").and_then(|rest| rest.split(' ').next()?.parse().ok()).unwrap_or(0);
        assert!(
            output.status.success() && checks >= 40,
            "{protocol}: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_cross_between_the_sqs_api_and_zkqs_own() {
    let root = unique_root("sqs-bridge");
    let (zkq, endpoint) = zkq_with_sqs(&root).await;
    let api = zkq.client();
    assert_eq!(api.put("bridge", "", b"from zkq").await.status, 201);
    let http = reqwest::Client::new();
    let call = |target: &'static str, body: serde_json::Value| {
        http.post(&endpoint)
            .header("content-type", "application/x-amz-json-1.0")
            .header("x-amz-target", format!("AmazonSQS.{target}"))
            .body(body.to_string())
            .send()
    };
    let url = format!("{endpoint}/000000000000/bridge");
    let received =
        call("ReceiveMessage", serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 5 })).await.expect("receive");
    assert_eq!(received.status(), 200);
    let json: serde_json::Value = received.json().await.expect("json");
    assert_eq!(json["Messages"][0]["Body"], "from zkq");
    let receipt = json["Messages"][0]["ReceiptHandle"].as_str().expect("receipt").to_owned();
    // The receipt handle is zkq's lease: zkq's own ack settles it.
    assert_eq!(api.ack("bridge", &receipt).await.status, 204);
    let sent =
        call("SendMessage", serde_json::json!({ "QueueUrl": url, "MessageBody": "from SQS" })).await.expect("send");
    assert_eq!(sent.status(), 200);
    assert_eq!(api.take("bridge", "wait=5s").await.text(), "from SQS");
    // A body that is not UTF-8 (a Curator producer's bytes) is delivered base64-encoded.
    assert_eq!(api.put("bridge", "", &[0xff, 0x00, 0x01]).await.status, 201);
    let received =
        call("ReceiveMessage", serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 5 })).await.expect("receive");
    let json: serde_json::Value = received.json().await.expect("json");
    assert_eq!(json["Messages"][0]["Body"], "/wAB");
    // An unknown target answers SQS's error, in the JSON protocol's shape.
    let unknown = call("Frobnicate", serde_json::json!({})).await.expect("send");
    assert_eq!(unknown.status(), 400);
    assert_eq!(unknown.headers().get("x-amzn-query-error").and_then(|v| v.to_str().ok()), Some("InvalidAction;Sender"));
    let metrics = zkq.metrics().await;
    assert_eq!(metric_value(&metrics, "zkq_sqs_requests_total{action=\"other\",code=\"InvalidAction\"}"), Some(1.0));
    assert_eq!(metric_value(&metrics, "zkq_sqs_requests_total{action=\"ReceiveMessage\",code=\"ok\"}"), Some(2.0));
}

/// Runs Debian's AWS CLI (`/usr/bin/aws`, installed by scripts/test.sh) with `args`, signing with
/// `key` (key id, secret); its output.
async fn aws_cli_as(endpoint: &str, (key_id, secret): (&str, &str), args: &[&str]) -> std::process::Output {
    let mut command = std::process::Command::new("/usr/bin/aws");
    command
        .args(["--endpoint-url", endpoint, "--output", "json", "sqs"])
        .args(args)
        .env("AWS_ACCESS_KEY_ID", key_id)
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_MAX_ATTEMPTS", "1")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null");
    tokio::task::spawn_blocking(move || command.output().expect("aws runs")).await.expect("join")
}

/// Runs Debian's AWS CLI with `args`; its JSON output.
async fn aws_cli(endpoint: &str, args: &[&str]) -> serde_json::Value {
    let output = aws_cli_as(endpoint, ("any", "any"), args).await;
    assert!(
        output.status.success(),
        "aws sqs {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_cli_sends_receives_and_deletes() {
    let root = unique_root("sqs-cli");
    let (_zkq, endpoint) = zkq_with_sqs(&root).await;
    let url =
        aws_cli(&endpoint, &["create-queue", "--queue-name", "cli"]).await["QueueUrl"].as_str().map(str::to_owned);
    let url = url.expect("a queue URL");
    let sent = aws_cli(&endpoint, &["send-message", "--queue-url", &url, "--message-body", "hi"]).await;
    assert_eq!(sent["MD5OfMessageBody"], "49f68a5c8493ec2c0bf489821c21fc3b");
    let received = aws_cli(&endpoint, &["receive-message", "--queue-url", &url, "--wait-time-seconds", "5"]).await;
    assert_eq!(received["Messages"][0]["Body"], "hi");
    let receipt = received["Messages"][0]["ReceiptHandle"].as_str().expect("receipt").to_owned();
    aws_cli(&endpoint, &["delete-message", "--queue-url", &url, "--receipt-handle", &receipt]).await;
    let attributes =
        aws_cli(&endpoint, &["get-queue-attributes", "--queue-url", &url, "--attribute-names", "All"]).await;
    assert_eq!(attributes["Attributes"]["ApproximateNumberOfMessages"], "0");
    assert_eq!(attributes["Attributes"]["ApproximateNumberOfMessagesNotVisible"], "0");
}

/// Runs `tests/sqs/bridge.py` with today's boto3; its output lines.
async fn bridge(args: Vec<String>) -> Vec<String> {
    let [(python, _), _] = pythons();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sqs/bridge.py");
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&python).arg(script).args(args).output().expect("python runs")
    })
    .await
    .expect("join");
    assert!(output.status.success(), "bridge.py: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).lines().map(str::to_owned).collect()
}

/// Each of `expected` is in `got` exactly once, and nothing else is; a failure names what differs.
fn assert_exactly_once(got: &[String], expected: &[String], what: &str) {
    let mut counts: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for body in got {
        *counts.entry(body.as_str()).or_default() += 1;
    }
    let missing: Vec<&String> = expected.iter().filter(|b| !counts.contains_key(b.as_str())).collect();
    let twice: Vec<(&&str, &usize)> = counts.iter().filter(|(_, n)| **n > 1).collect();
    let expected: std::collections::HashSet<&str> = expected.iter().map(String::as_str).collect();
    let extra: Vec<&&str> = counts.keys().filter(|b| !expected.contains(**b)).collect();
    assert!(
        missing.is_empty() && twice.is_empty() && extra.is_empty(),
        "{what}: {} missing (first {:?}), {} more than once (first {:?}), {} never sent (first {:?})",
        missing.len(),
        missing.iter().take(5).collect::<Vec<_>>(),
        twice.len(),
        twice.iter().take(5).collect::<Vec<_>>(),
        extra.len(),
        extra.iter().take(5).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_cross_between_curator_and_an_sqs_sdk_each_way() {
    let zk = ZkServer::shared();
    let root = unique_root("sqs-curator");
    let (zkq, endpoint) = zkq_with_sqs(&root).await;
    let (path, locks) = (format!("{root}/queues/bridge"), format!("{root}/locks/bridge"));
    // Curator → SQS: 5,000 single-item nodes and 5,000 items in putMulti nodes of 500.
    let bodies: Vec<String> = (0..10_000).map(|i| format!("curator-{i}")).collect();
    let hexes: Vec<String> = bodies.iter().map(|b| hex(b.as_bytes())).collect();
    let mut args: Vec<&str> = vec!["put", "fifo", &path];
    args.extend(hexes[..5000].iter().map(String::as_str));
    Curator::run(zk, &args).await;
    for chunk in hexes[5000..].chunks(500) {
        let mut args: Vec<&str> = vec!["putmulti", "fifo", &path];
        args.extend(chunk.iter().map(String::as_str));
        Curator::run(zk, &args).await;
    }
    let received = bridge(vec!["drain".into(), endpoint.clone(), "bridge".into(), "10000".into()]).await;
    assert_exactly_once(&received, &bodies, "Curator → SQS");
    // SQS → Curator: 10,000 through SendMessageBatch, consumed by a Curator lock-safe consumer.
    bridge(vec!["send".into(), endpoint.clone(), "bridge".into(), "10000".into(), "sqs-".into()]).await;
    // It answers once it has all 10,000; the long deadline only bounds a failure.
    let consumed = Curator::run(zk, &["consume", "fifo", &path, "10000", "600000", "--lock", &locks]).await;
    let got: Vec<String> = consumed
        .iter()
        .filter(|line| !line.starts_with("DONE") && !line.is_empty())
        .map(|line| String::from_utf8_lossy(&unhex(line.strip_prefix("EXTRA ").unwrap_or(line))).into_owned())
        .collect();
    let expected: Vec<String> = (0..10_000).map(|i| format!("sqs-{i}")).collect();
    assert_exactly_once(&got, &expected, "SQS → Curator");
    assert_eq!(zkq.client().take("bridge", "wait=0").await.status, 204);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_javascript_sdk_which_checks_every_md5_sends_and_receives() {
    let root = unique_root("sqs-js");
    let (_zkq, endpoint) = zkq_with_sqs(&root).await;
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // Beside its node_modules (scripts/test.sh installs them there), so that its imports resolve.
    let script = manifest.join("target/sqs-js/client.mjs");
    std::fs::copy(manifest.join("tests/sqs/js/client.mjs"), &script).expect("the SDK is installed in target/sqs-js");
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("node").arg(script).args([endpoint.as_str(), "js"]).output().expect("node runs")
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.starts_with("ok "),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_queue_lists_its_sources_and_its_source_shows_its_redrive_policy() {
    let root = unique_root("sqs-dlq");
    let mut config = test_config(ZkServer::shared(), &root);
    config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
    declare(&mut config, "jobs", zkq::config::QueueKind::Fifo, None, None);
    declare(&mut config, "jobs-dead", zkq::config::QueueKind::Fifo, None, None);
    if let Some(jobs) = config.queues.get_mut("jobs") {
        jobs.dead_letter = Some("jobs-dead".parse().expect("name"));
        jobs.max_deliveries = Some(3);
    }
    let zkq = TestZkq::start(config).await;
    let endpoint = format!("http://{}", zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("bound"));
    let http = reqwest::Client::new();
    let call = |target: &'static str, body: serde_json::Value| {
        http.post(&endpoint)
            .header("content-type", "application/x-amz-json-1.0")
            .header("x-amz-target", format!("AmazonSQS.{target}"))
            .body(body.to_string())
            .send()
    };
    let url = |queue: &str| format!("{endpoint}/000000000000/{queue}");
    let sources: serde_json::Value =
        call("ListDeadLetterSourceQueues", serde_json::json!({ "QueueUrl": url("jobs-dead") }))
            .await
            .expect("call")
            .json()
            .await
            .expect("json");
    assert_eq!(sources, serde_json::json!({ "queueUrls": [url("jobs")] }));
    let attributes: serde_json::Value =
        call("GetQueueAttributes", serde_json::json!({ "QueueUrl": url("jobs"), "AttributeNames": ["RedrivePolicy"] }))
            .await
            .expect("call")
            .json()
            .await
            .expect("json");
    let policy: serde_json::Value =
        serde_json::from_str(attributes["Attributes"]["RedrivePolicy"].as_str().expect("a policy")).expect("JSON");
    assert_eq!(
        policy,
        serde_json::json!({ "deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:jobs-dead", "maxReceiveCount": 3 })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attributes_stay_with_their_message_and_curator_sees_the_body_alone() {
    let zk = ZkServer::shared();
    let root = unique_root("sqs-attributes");
    let (zkq, endpoint) = zkq_with_sqs(&root).await;
    let http = reqwest::Client::new();
    let call = |target: &'static str, body: serde_json::Value| {
        http.post(&endpoint)
            .header("content-type", "application/x-amz-json-1.0")
            .header("x-amz-target", format!("AmazonSQS.{target}"))
            .body(body.to_string())
            .send()
    };
    let url = call("CreateQueue", serde_json::json!({ "QueueName": "attrs" })).await.expect("create");
    let url: serde_json::Value = url.json().await.expect("json");
    let url = url["QueueUrl"].as_str().expect("a URL").to_owned();
    let attributes = serde_json::json!({ "trace": { "DataType": "String", "StringValue": "t-1" } });
    let send = |body: &'static str| {
        call(
            "SendMessage",
            serde_json::json!({ "QueueUrl": url, "MessageBody": body, "MessageAttributes": attributes }),
        )
    };
    assert_eq!(send("for curator").await.expect("send").status(), 200);
    // A Curator lock-safe consumer reads Curator's envelope and stops at its end: the body alone.
    let path = format!("{root}/queues/attrs");
    let locks = format!("{root}/locks/attrs");
    let consumed = Curator::run(zk, &["consume", "fifo", &path, "1", "30000", "--lock", &locks]).await;
    assert_eq!(consumed.first().map(|line| unhex(line)), Some(b"for curator".to_vec()), "{consumed:?}");
    // Requeued by zkq's own API, the message keeps its attributes.
    assert_eq!(send("requeued").await.expect("send").status(), 200);
    let api = zkq.client();
    let leased = api.lease("attrs", "wait=5s").await;
    assert_eq!(leased.text(), "requeued");
    assert_eq!(api.nack("attrs", &leased.receipt, "mode=requeue").await.status, 204);
    let received = call(
        "ReceiveMessage",
        serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 5, "MessageAttributeNames": ["All"] }),
    )
    .await
    .expect("receive");
    let received: serde_json::Value = received.json().await.expect("json");
    assert_eq!(received["Messages"][0]["Body"], "requeued");
    assert_eq!(received["Messages"][0]["MessageAttributes"], attributes);
}

/// The README's SQS example (a boto3 producer, then the AWS CLI's receive), as written there, against
/// a live zkq, so the front door cannot rot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_sqs_example_works_as_written() {
    let root = unique_root("sqs-readme");
    let (_zkq, endpoint) = zkq_with_sqs(&root).await;
    let readme = std::fs::read_to_string(repo_file("README.md")).expect("README");
    let section = readme.split("## Using it").nth(1).and_then(|s| s.split("\n## ").next()).expect("Using it");
    let python = section.split("```python").nth(1).and_then(|b| b.split("```").next()).expect("a python block");
    let cli = section
        .split("```sh")
        .filter_map(|b| b.split("```").next())
        .find(|b| b.contains(" aws --endpoint-url "))
        .expect("a sh block with the AWS CLI");
    let here = endpoint.trim_start_matches("http://").to_owned();
    let [(interpreter, _), _] = pythons();
    let script = format!("import boto3\n{}", python.replace("127.0.0.1:9324", &here));
    let produced = tokio::task::spawn_blocking(move || {
        std::process::Command::new(interpreter).args(["-c", &script]).output().expect("python runs")
    })
    .await
    .expect("join");
    assert!(produced.status.success(), "{}", String::from_utf8_lossy(&produced.stderr));
    let command = cli.trim().replace("127.0.0.1:9324", &here).replacen(
        " aws --endpoint-url ",
        " /usr/bin/aws --output json --endpoint-url ",
        1,
    );
    let received = tokio::task::spawn_blocking(move || {
        std::process::Command::new("sh")
            .args(["-c", &command])
            .env("AWS_ACCESS_KEY_ID", "any")
            .env("AWS_SECRET_ACCESS_KEY", "any")
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_CONFIG_FILE", "/dev/null")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
            .output()
            .expect("sh runs")
    })
    .await
    .expect("join");
    assert!(received.status.success(), "{}", String::from_utf8_lossy(&received.stderr));
    let json: serde_json::Value = serde_json::from_slice(&received.stdout).expect("JSON");
    assert_eq!(json["Messages"][0]["Body"], "hello");
}

/// Runs a client script to its end; it must succeed and print `ok N checks`.
async fn runs_ok(mut command: std::process::Command, what: &str) {
    let output = tokio::task::spawn_blocking(move || command.output().expect("the client runs")).await.expect("join");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.starts_with("ok "),
        "{what}: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// With `api.token_file` guarding the API, the SQS listener verifies AWS Signature Version 4 with
/// the configured key pair: boto3 in both protocols, the JavaScript SDK and the AWS CLI work when
/// they sign with it; a wrong secret, another key id and an unsigned request are refused with
/// SQS's codes, and store nothing. zkq's own API still asks for its token.
/// A zkq whose API asks for a token and whose SQS listener verifies signatures made with
/// `(key_id, secret)`; its SQS endpoint.
async fn zkq_with_key_pair(root: &str, (key_id, secret): (&str, &str)) -> (TestZkq, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (token_file, secret_file) = (dir.path().join("token"), dir.path().join("sqs-secret"));
    std::fs::write(&token_file, "api-token-0123456789\n").expect("write");
    std::fs::write(&secret_file, format!("{secret}\n")).expect("write");
    let mut config = test_config(ZkServer::shared(), root);
    config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
    config.api.token_file = Some(token_file);
    config.sqs.access_key_id = Some(key_id.to_owned());
    config.sqs.secret_access_key_file = Some(secret_file);
    let zkq = TestZkq::start(config).await;
    let addr = zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("the SQS listener is bound");
    (zkq, format!("http://{addr}"), dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_key_pair_configured_only_requests_signed_with_it_are_served() {
    let (key_id, secret) = ("AKIAZKQTEST0001", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYzkqEXAMPLE");
    let (zkq, endpoint, _dir) = zkq_with_key_pair(&unique_root("sqs-signed"), (key_id, secret)).await;

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sqs/signed.py");
    for (python, protocol) in pythons() {
        let mut command = std::process::Command::new(&python);
        command.arg(&script).args([endpoint.as_str(), protocol, key_id, secret]);
        runs_ok(command, protocol).await;
    }

    let listed = aws_cli_as(&endpoint, (key_id, secret), &["list-queues", "--queue-name-prefix", "signed-"]).await;
    assert!(listed.status.success(), "the CLI signs with the key pair: {}", String::from_utf8_lossy(&listed.stderr));
    let wrong = aws_cli_as(&endpoint, (key_id, "not-the-secret"), &["list-queues"]).await;
    assert!(!wrong.status.success());
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("SignatureDoesNotMatch"),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );

    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let js = manifest.join("target/sqs-js/signed-client.mjs");
    std::fs::copy(manifest.join("tests/sqs/js/client.mjs"), &js).expect("the SDK is installed in target/sqs-js");
    let mut command = std::process::Command::new("node");
    command.arg(js).args([endpoint.as_str(), "signed-js"]).env("ZKQ_SQS_KEY_ID", key_id).env("ZKQ_SQS_SECRET", secret);
    runs_ok(command, "the JavaScript SDK").await;

    // zkq's own API is still guarded by its token.
    let put = zkq.http.post(zkq.url("/v1/queues/signed-json/messages")).body("x").send().await.expect("put");
    assert_eq!(put.status(), 401, "the API asks for its token");
    let refused = metric_value(
        &zkq.registered_metrics(),
        "zkq_sqs_requests_total{action=\"other\",code=\"SignatureDoesNotMatch\"}",
    );
    assert!(refused.unwrap_or(0.0) >= 5.0, "refusals are counted: {refused:?}");
}

/// A JSON-protocol request as botocore signs it (`tests/sqs/capture.py`), over every header
/// (`full`) or over `host` and `x-amz-date` alone (`narrow`): what a listener on the pod network
/// could capture.
async fn captured(endpoint: &str, key: (&str, &str), action: &str, input: serde_json::Value, mode: &str) -> Captured {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sqs/capture.py");
    let mut command = std::process::Command::new("/usr/bin/python3");
    command.arg(script).args([endpoint, key.0, key.1, action, &input.to_string(), mode]);
    let output = tokio::task::spawn_blocking(move || command.output().expect("python3 runs")).await.expect("join");
    assert!(output.status.success(), "capture.py: {}", String::from_utf8_lossy(&output.stderr));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let headers = json["headers"]
        .as_object()
        .expect("headers")
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.as_str().unwrap_or_default().to_owned()))
        .collect();
    Captured { endpoint: endpoint.to_owned(), headers, body: json["body"].as_str().unwrap_or_default().to_owned() }
}

struct Captured {
    endpoint: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Captured {
    /// Sends the request again, with `X-Amz-Target` naming `action` instead (if given); the
    /// status and the error code (`__type` without its namespace) or the answer.
    async fn send(&self, action: Option<&str>) -> (u16, serde_json::Value) {
        let mut request = reqwest::Client::new().post(format!("{}/", self.endpoint)).body(self.body.clone());
        for (name, value) in &self.headers {
            let value = match action {
                Some(action) if name == "x-amz-target" => format!("AmazonSQS.{action}"),
                _ => value.clone(),
            };
            request = request.header(name, value);
        }
        let answer = request.send().await.expect("sent");
        (answer.status().as_u16(), answer.json().await.unwrap_or_default())
    }
}

/// A signed SendMessage captured on the network and sent again with its `X-Amz-Target` changed to
/// `PurgeQueue` or `DeleteQueue` is refused: signed as SDKs sign it, its signature no longer
/// matches; signed over `host` and `x-amz-date` alone, it is refused for not signing the action.
/// The queue and its message are still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_signed_request_cannot_be_turned_into_another_action() {
    let key = ("AKIAZKQTEST0002", "retarget/K7MDENG+bPxRfiCYzkqEXAMPLE");
    let (_zkq, endpoint, _dir) = zkq_with_key_pair(&unique_root("sqs-retarget"), key).await;
    let create = captured(&endpoint, key, "CreateQueue", serde_json::json!({"QueueName": "retarget"}), "full").await;
    let (status, created) = create.send(None).await;
    assert_eq!(status, 200, "{created}");
    let url = created["QueueUrl"].as_str().expect("a queue URL").to_owned();
    let send = serde_json::json!({"QueueUrl": url, "MessageBody": "kept"});
    let full = captured(&endpoint, key, "SendMessage", send.clone(), "full").await;
    assert_eq!(full.send(None).await.0, 200, "the SDK-signed request is served");
    let narrow = captured(&endpoint, key, "SendMessage", send, "narrow").await;
    for action in ["PurgeQueue", "DeleteQueue"] {
        let (status, answer) = full.send(Some(action)).await;
        assert_eq!((status, answer["__type"].as_str()), (403, Some("com.amazonaws.sqs#SignatureDoesNotMatch")));
        let (status, answer) = narrow.send(Some(action)).await;
        assert_eq!(
            (status, answer["__type"].as_str()),
            (400, Some("com.amazonaws.sqs#IncompleteSignature")),
            "{action} in a request that signs only host and x-amz-date: {answer}"
        );
        assert!(answer["message"].as_str().unwrap_or_default().contains("x-amz-target"), "{answer}");
    }
    let (status, answer) = narrow.send(None).await;
    assert_eq!(status, 400, "unchanged, it is refused too: {answer}");
    let receive = serde_json::json!({"QueueUrl": url, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 1});
    let (status, received) = captured(&endpoint, key, "ReceiveMessage", receive, "full").await.send(None).await;
    assert_eq!(status, 200, "{received}");
    let bodies: Vec<&str> =
        received["Messages"].as_array().into_iter().flatten().filter_map(|m| m["Body"].as_str()).collect();
    assert_eq!(bodies, ["kept"], "the queue and its message are still there");
}

/// The Rust AWS SDK's session passes against a listener that verifies signatures (the pair it
/// signs with, `any`/`any`, is configured): it signs every header zkq requires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_aws_sdk_signs_every_header_zkq_requires() {
    let (_zkq, endpoint, _dir) = zkq_with_key_pair(&unique_root("sqs-rust-signed"), ("any", "any")).await;
    run_rust_client(endpoint, "rust-signed").await;
}

/// Bodies a Curator producer may write that are not SQS text: bytes that are not UTF-8, and UTF-8
/// with a character SQS refuses. A queue hands them out base64-encoded (the default), or, set to
/// `refuse`, never hands them out through SQS: released at once, they go to the dead-letter queue
/// past `max_deliveries`, unaltered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_not_sqs_text_is_base64_encoded_or_refused_as_its_queue_says() {
    let root = unique_root("sqs-binary");
    let mut config = test_config(ZkServer::shared(), &root);
    config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
    for name in ["encoded", "refusing", "dead"] {
        declare(&mut config, name, zkq::config::QueueKind::Fifo, None, None);
    }
    let refusing = config.queues.get_mut("refusing").expect("declared");
    refusing.sqs_binary_bodies = Some(zkq::config::BinaryBodies::Refuse);
    refusing.max_deliveries = Some(2);
    refusing.dead_letter = Some("dead".parse().expect("a name"));
    let zkq = TestZkq::start(config).await;
    let endpoint = format!("http://{}", zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("the SQS listener"));
    let api = zkq.client();
    let bodies: [&[u8]; 3] = [b"\xff\xfe binary", b"a bell \x07", b"plain text"];
    let http = reqwest::Client::new();
    let receive = |queue: &'static str| {
        let url = format!("{endpoint}/000000000000/{queue}");
        let request = http
            .post(&endpoint)
            .header("content-type", "application/x-amz-json-1.0")
            .header("x-amz-target", "AmazonSQS.ReceiveMessage")
            .body(serde_json::json!({ "QueueUrl": url, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 1 }).to_string());
        async move {
            let answer: serde_json::Value = request.send().await.expect("receive").json().await.expect("json");
            let messages = answer["Messages"].as_array().cloned().unwrap_or_default();
            messages.iter().map(|m| m["Body"].as_str().unwrap_or_default().to_owned()).collect::<Vec<_>>()
        }
    };
    for queue in ["encoded", "refusing"] {
        for body in bodies {
            assert_eq!(api.put(queue, "", body).await.status, 201);
        }
    }
    let b64 = |bytes: &[u8]| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(bytes)
    };
    let mut encoded = receive("encoded").await;
    encoded.sort();
    let mut expected = vec![b64(bodies[0]), b64(bodies[1]), "plain text".to_owned()];
    expected.sort();
    assert_eq!(encoded, expected, "base64 for what is not SQS text, the text itself otherwise");

    assert_eq!(receive("refusing").await, ["plain text"], "only SQS text is handed out");
    let mut dead: Vec<Vec<u8>> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while dead.len() < 2 {
        assert!(std::time::Instant::now() < deadline, "the refused bodies never reached the dead-letter queue");
        assert_eq!(receive("refusing").await, Vec::<String>::new(), "a refused body was handed out");
        loop {
            let taken = api.take("dead", "wait=0").await;
            if taken.status != 200 {
                break;
            }
            dead.push(taken.body);
        }
    }
    dead.sort();
    assert_eq!(dead, [bodies[1].to_vec(), bodies[0].to_vec()], "moved unaltered");
    let refused = metric(&zkq.metrics().await, "zkq_sqs_refused_bodies_total");
    assert!(refused >= 4.0, "each refusal is counted (two bodies, two deliveries each): {refused}");
}

/// A refused body (`sqs_binary_bodies = "refuse"`) on a queue without a dead-letter queue does
/// not end the long-poll: the receive goes on waiting and hands out the text message put
/// meanwhile, leasing the refused one once, never again while it waits; and refusals do not
/// count deliveries (zkq's own API then leases it as its first delivery).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_body_neither_ends_the_long_poll_nor_counts_deliveries() {
    let root = unique_root("sqs-refuse-wait");
    let mut config = test_config(ZkServer::shared(), &root);
    config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
    declare(&mut config, "refusing", zkq::config::QueueKind::Fifo, None, None);
    config.queues.get_mut("refusing").expect("declared").sqs_binary_bodies = Some(zkq::config::BinaryBodies::Refuse);
    let zkq = TestZkq::start(config).await;
    let endpoint = format!("http://{}", zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("the SQS listener"));
    let api = zkq.client();
    assert_eq!(api.put("refusing", "", b"\xff\xfe binary").await.status, 201);
    let url = format!("{endpoint}/000000000000/refusing");
    let request = reqwest::Client::new()
        .post(&endpoint)
        .header("content-type", "application/x-amz-json-1.0")
        .header("x-amz-target", "AmazonSQS.ReceiveMessage")
        .body(serde_json::json!({ "QueueUrl": url, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 20 }).to_string());
    let receive = tokio::spawn(async move {
        let answer: serde_json::Value = request.send().await.expect("receive").json().await.expect("json");
        let messages = answer["Messages"].as_array().cloned().unwrap_or_default();
        messages.iter().map(|m| m["Body"].as_str().unwrap_or_default().to_owned()).collect::<Vec<_>>()
    });
    let refused = || async { metric(&zkq.metrics().await, "zkq_sqs_refused_bodies_total") };
    eventually(Duration::from_secs(10), "the receive met the refused body", || async { refused().await >= 1.0 }).await;
    assert!(!receive.is_finished(), "the long-poll ended when it met the refused body");
    assert_eq!(api.put("refusing", "", b"text").await.status, 201);
    let received = receive.await.expect("the receive");
    assert_eq!(received, ["text"], "the long-poll waited on and handed out the text message");
    assert_eq!(refused().await, 1.0, "the refused body was leased once while the long-poll waited");
    let leased = zkq.http.post(zkq.url("/v1/queues/refusing/leases")).send().await.expect("lease");
    assert_eq!(leased.status(), 200);
    let count = leased.headers().get("zkq-delivery-count").and_then(|v| v.to_str().ok()).map(str::to_owned);
    assert_eq!(leased.bytes().await.expect("body").as_ref(), b"\xff\xfe binary");
    assert_eq!(count.as_deref(), Some("1"), "a refusal is not a delivery");
}

/// Real Celery workers (`celery[sqs]`: kombu's SQS transport, its long polls through pycurl) take
/// 200 tasks from zkq, sent by a Celery producer (`tests/sqs/celery_worker.py`); one worker stops
/// midway, handing back what it held. Each task runs once; zkq ends with nothing waiting or in
/// flight, every message put and acknowledged once, and every call kombu made answered without an
/// error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_celery_worker_runs_every_task_once_with_zkq_as_its_broker() {
    let root = unique_root("sqs-celery");
    let mut config = test_config(ZkServer::shared(), &root);
    config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
    // kombu's CreateQueue sends its `visibility_timeout`, which becomes the queue's: a worker
    // stopped with a message it did not hand back leaves it for 60 s (kombu's default is 1,800).
    let visibility = 60;
    let zkq = TestZkq::start(config).await;
    let endpoint = format!("http://{}", zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("bound"));
    let [(python, _), _] = pythons();
    let mut command = std::process::Command::new(python);
    command.arg(repo_file("tests/sqs/celery_worker.py")).args([&endpoint, "tasks", "200", &visibility.to_string()]);
    let output = tokio::task::spawn_blocking(move || command.output().expect("python runs")).await.expect("join");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.trim() == "ok 200",
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // zkq's own view: nothing left, nothing doubled; kombu was refused nothing.
    let (_, attributes) = sqs_json(
        &endpoint,
        "GetQueueAttributes",
        serde_json::json!({ "QueueUrl": format!("{endpoint}/000000000000/tasks"), "AttributeNames": ["VisibilityTimeout"] }),
    )
    .await;
    assert_eq!(attributes["Attributes"]["VisibilityTimeout"], "60", "kombu's CreateQueue set the queue's");
    let info = zkq.client().info("tasks").await.json();
    assert_eq!((info["depth"].as_i64(), info["in_flight"].as_i64()), (Some(0), Some(0)), "{info}");
    let metrics = zkq.metrics().await;
    let count = |series: &str| metric_value(&metrics, series).unwrap_or(0.0);
    assert_eq!(count("zkq_messages_put_total{queue=\"tasks\"}"), 200.0);
    assert_eq!(count("zkq_messages_acked_total{queue=\"tasks\"}"), 200.0);
    assert_eq!(count("zkq_sqs_requests_total{action=\"SendMessage\",code=\"ok\"}"), 200.0);
    assert_eq!(count("zkq_sqs_requests_total{action=\"DeleteMessage\",code=\"ok\"}"), 200.0);
    let calls: Vec<&str> = metrics.lines().filter(|l| l.starts_with("zkq_sqs_requests_total{")).collect();
    assert!(calls.iter().all(|l| l.contains("code=\"ok\"")), "kombu's calls were all served: {calls:#?}");
}

/// An SQS call in the JSON protocol, its status and answer.
async fn sqs_json(endpoint: &str, action: &str, input: serde_json::Value) -> (u16, serde_json::Value) {
    let answer = reqwest::Client::new()
        .post(endpoint)
        .header("content-type", "application/x-amz-json-1.0")
        .header("x-amz-target", format!("AmazonSQS.{action}"))
        .body(input.to_string())
        .send()
        .await
        .expect("an SQS call");
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or_default())
}

/// Dead letters moved back by a message move task, started through zkq's own API and through
/// SQS's, listed and cancelled from another sidecar: every message ends in exactly one of the two
/// queues, with its attributes and trace context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_move_task_moves_dead_letters_back_once_and_another_sidecar_cancels_it() {
    const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let zk = ZkServer::shared();
    let root = unique_root("sqs-redrive");
    let configure = || {
        let mut config = test_config(zk, &root);
        config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
        declare(&mut config, "orders", zkq::config::QueueKind::Fifo, None, None);
        declare(&mut config, "orders-dlq", zkq::config::QueueKind::Fifo, None, None);
        let orders = config.queues.get_mut("orders").expect("declared");
        orders.max_deliveries = Some(3);
        orders.dead_letter = Some("orders-dlq".parse().expect("a name"));
        config
    };
    let (one, other) = (TestZkq::start(configure()).await, TestZkq::start(configure()).await);
    let sqs_of = |zkq: &TestZkq| format!("http://{}", zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("bound"));
    let (api, other_sqs) = (one.client(), sqs_of(&other));
    let dlq_arn = "arn:aws:sqs:us-east-1:000000000000:orders-dlq";
    let put_dead = |range: std::ops::Range<usize>| {
        let messages: Vec<serde_json::Value> = range
            .map(|i| {
                serde_json::json!({ "text": format!("dead {i}"), "traceparent": TRACE,
                    "attributes": { "n": { "type": "Number", "value": i.to_string() } } })
            })
            .collect();
        messages
    };
    for chunk in put_dead(0..300).chunks(100) {
        assert_eq!(api.batch_put("orders-dlq", "", &serde_json::json!({ "messages": chunk })).await.status, 201);
    }

    // zkq's own API: the destination is implied (orders declares orders-dlq its dead letter).
    let started = api
        .send_json(
            reqwest::Method::POST,
            "/v1/queues/orders-dlq/redrive",
            &serde_json::json!({ "max_per_second": 500 }),
        )
        .await;
    assert_eq!(started.status, 202, "{}", started.text());
    assert_eq!(
        (started.json()["destination"].as_str(), started.json()["to_move"].as_u64()),
        (Some("orders"), Some(300))
    );
    eventually(Duration::from_secs(60), "the task completed", || async {
        let listed = api.send(reqwest::Method::GET, "/v1/queues/orders-dlq/redrive", None).await.json();
        listed["tasks"][0]["status"] == "COMPLETED"
    })
    .await;
    let listed = api.send(reqwest::Method::GET, "/v1/queues/orders-dlq/redrive", None).await.json();
    let moved: u64 = listed["tasks"].as_array().expect("tasks").iter().filter_map(|t| t["moved"].as_u64()).sum();
    assert_eq!(moved, 300, "{listed}");
    let mut back = 0;
    loop {
        let leased = api.lease("orders", "max=100&wait=0").await;
        if leased.status != 200 {
            break;
        }
        let messages = leased.json()["messages"].as_array().cloned().unwrap_or_default();
        assert!(messages.iter().all(|m| m["traceparent"] == TRACE && m["attributes"]["n"]["type"] == "Number"));
        let receipts: Vec<String> = messages.iter().filter_map(|m| m["lease"].as_str().map(str::to_owned)).collect();
        assert_eq!(api.batch_ack("orders", &receipts).await.status, 200);
        back += messages.len();
    }
    assert_eq!(back, 300, "every dead letter is back in orders, once");
    assert_eq!(api.take("orders-dlq", "wait=0").await.status, 204, "nothing left behind");

    // The SQS API, slowly, cancelled by the other sidecar, which lists the task from its node.
    for chunk in put_dead(300..800).chunks(100) {
        assert_eq!(api.batch_put("orders-dlq", "", &serde_json::json!({ "messages": chunk })).await.status, 201);
    }
    let one_sqs = sqs_of(&one);
    let (status, started) = sqs_json(
        &one_sqs,
        "StartMessageMoveTask",
        serde_json::json!({ "SourceArn": dlq_arn, "DestinationArn": "arn:aws:sqs:us-east-1:000000000000:orders", "MaxNumberOfMessagesPerSecond": 20 }),
    )
    .await;
    assert_eq!(status, 200, "{started}");
    let handle = started["TaskHandle"].as_str().expect("a handle").to_owned();
    // One task per queue on the ensemble: the other sidecar cannot start a second.
    let again =
        other.client().send_json(reqwest::Method::POST, "/v1/queues/orders-dlq/redrive", &serde_json::json!({})).await;
    assert_eq!((again.status, again.code.as_str()), (409, "move_task_running"), "{}", again.text());
    let (_, listed) = sqs_json(&other_sqs, "ListMessageMoveTasks", serde_json::json!({ "SourceArn": dlq_arn })).await;
    assert_eq!(listed["Results"][0]["Status"], "RUNNING", "{listed}");
    assert_eq!(listed["Results"][0]["TaskHandle"], handle.as_str());
    let (status, cancelled) =
        sqs_json(&other_sqs, "CancelMessageMoveTask", serde_json::json!({ "TaskHandle": handle })).await;
    assert_eq!(status, 200, "{cancelled}");
    eventually(Duration::from_secs(30), "the task stopped", || async {
        let (_, listed) = sqs_json(&one_sqs, "ListMessageMoveTasks", serde_json::json!({ "SourceArn": dlq_arn })).await;
        listed["Results"][0]["Status"] == "CANCELLED"
    })
    .await;
    let (status, stale) =
        sqs_json(&other_sqs, "CancelMessageMoveTask", serde_json::json!({ "TaskHandle": handle })).await;
    assert_eq!((status, stale["__type"].as_str()), (400, Some("com.amazonaws.sqs#ResourceNotFoundException")));
    // Every message is in exactly one of the queues.
    let mut bodies = Vec::new();
    for queue in ["orders", "orders-dlq"] {
        loop {
            let taken = api.take(queue, "max=100&wait=0").await;
            if taken.status != 200 {
                break;
            }
            for m in taken.json()["messages"].as_array().cloned().unwrap_or_default() {
                let body = m["body"].as_str().unwrap_or_default().to_owned();
                bodies.push(body);
            }
        }
    }
    let unique: std::collections::HashSet<&String> = bodies.iter().collect();
    assert_eq!((bodies.len(), unique.len()), (500, 500), "each of the 500 once, in one queue or the other");

    // The query protocol starts and cancels one too.
    for chunk in put_dead(800..850).chunks(50) {
        assert_eq!(api.batch_put("orders-dlq", "", &serde_json::json!({ "messages": chunk })).await.status, 201);
    }
    let query = |body: String| {
        let request = reqwest::Client::new()
            .post(&one_sqs)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("Version=2012-11-05&{body}"));
        async move { request.send().await.expect("a query call").text().await.expect("text") }
    };
    let started = query(format!(
        "Action=StartMessageMoveTask&SourceArn={}&MaxNumberOfMessagesPerSecond=1",
        dlq_arn.replace(':', "%3A")
    ))
    .await;
    let handle = started.split("<TaskHandle>").nth(1).and_then(|rest| rest.split("</TaskHandle>").next());
    let handle = handle.unwrap_or_else(|| panic!("a TaskHandle in {started}")).to_owned();
    let cancelled = query(format!("Action=CancelMessageMoveTask&TaskHandle={}", handle.replace(':', "%3A"))).await;
    assert!(cancelled.contains("<CancelMessageMoveTaskResult><ApproximateNumberOfMessagesMoved>"), "{cancelled}");
    eventually(Duration::from_secs(10), "no task runs for the queue", || async {
        let none = api.send(reqwest::Method::DELETE, "/v1/queues/orders-dlq/redrive", None).await;
        (none.status, none.code.as_str()) == (404, "move_task_not_found")
    })
    .await;

    // A queue that is no queue's dead letter needs a destination; an unknown source is not found.
    let (status, refused) = sqs_json(
        &one_sqs,
        "StartMessageMoveTask",
        serde_json::json!({ "SourceArn": "arn:aws:sqs:us-east-1:000000000000:orders" }),
    )
    .await;
    assert_eq!(
        (status, refused["__type"].as_str()),
        (400, Some("com.amazonaws.sqs#InvalidParameterValueException")),
        "{refused}"
    );
    let (status, refused) = sqs_json(&one_sqs, "StartMessageMoveTask", serde_json::json!({ "SourceArn": "arn:aws:sqs:us-east-1:000000000000:never", "DestinationArn": "arn:aws:sqs:us-east-1:000000000000:orders" })).await;
    assert_eq!(
        (status, refused["__type"].as_str()),
        (400, Some("com.amazonaws.sqs#ResourceNotFoundException")),
        "{refused}"
    );
}

/// A dynamic queue's settings set through one sidecar's SQS API are served by another's: its
/// `GetQueueAttributes`, its leases' default visibility (zkq's own API too) and its redrive policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queues_settings_set_through_one_sidecar_are_served_by_every_sidecar() {
    let root = unique_root("sqs-settings");
    let (one, one_sqs) = zkq_with_sqs(&root).await;
    let (other, other_sqs) = zkq_with_sqs(&root).await;
    let url = |queue: &str| format!("{one_sqs}/000000000000/{queue}");
    for queue in ["jobs", "jobs-dlq"] {
        assert_eq!(sqs_json(&one_sqs, "CreateQueue", serde_json::json!({ "QueueName": queue })).await.0, 200);
    }
    // The other sidecar has the queue open before the settings change, and follows it.
    assert_eq!(other.client().put("jobs", "", b"first").await.status, 201);
    let policy = serde_json::json!({ "deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:jobs-dlq", "maxReceiveCount": 2 });
    let (status, answer) = sqs_json(
        &one_sqs,
        "SetQueueAttributes",
        serde_json::json!({ "QueueUrl": url("jobs"), "Attributes": { "VisibilityTimeout": "7", "RedrivePolicy": policy.to_string() } }),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    eventually(Duration::from_secs(10), "the other sidecar serves the new settings", || async {
        let (_, got) = sqs_json(
            &other_sqs,
            "GetQueueAttributes",
            serde_json::json!({ "QueueUrl": url("jobs"), "AttributeNames": ["All"] }),
        )
        .await;
        got["Attributes"]["VisibilityTimeout"] == "7"
            && serde_json::from_str::<serde_json::Value>(got["Attributes"]["RedrivePolicy"].as_str().unwrap_or("null"))
                .ok()
                == Some(policy.clone())
    })
    .await;
    // Its own API's lease without `visibility` lasts the queue's 7 s.
    let api = other.client();
    let before = zkq::now_epoch_ms();
    let leased = api.lease("jobs", "wait=2s").await;
    assert_eq!(leased.status, 200);
    let expires: i64 = leased.expiry.parse().expect("epoch ms");
    assert!((before + 6_000..=zkq::now_epoch_ms() + 7_000).contains(&expires), "a 7 s lease: {}", expires - before);
    // Past two deliveries the message moves to the dead-letter queue, on this sidecar too.
    assert_eq!(api.nack("jobs", &leased.receipt, "mode=keep").await.status, 204);
    let second = api.lease("jobs", "wait=2s").await;
    assert_eq!(api.nack("jobs", &second.receipt, "mode=keep").await.status, 204);
    assert_eq!(api.lease("jobs", "wait=0").await.status, 204, "a third delivery is a move");
    assert_eq!(api.take("jobs-dlq", "wait=2s").await.body, b"first");
    drop(one);
}

/// `CreatedTimestamp` and `LastModifiedTimestamp` come from ZooKeeper's clock, so every sidecar
/// answers the same: the queue's creation, then its settings' last change; a queue deleted and
/// made anew starts again. Asked for alone, each is answered (the call failed
/// `InvalidAttributeName`); a name SQS knows that the queue does not have is left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_timestamps_are_the_queues_own_on_every_sidecar() {
    let root = unique_root("sqs-timestamps");
    let (_one, one_sqs) = zkq_with_sqs(&root).await;
    let (_other, other_sqs) = zkq_with_sqs(&root).await;
    let url = format!("{one_sqs}/000000000000/stamped");
    let seconds = || zkq::now_epoch_ms() / 1000;
    let stamps = |endpoint: String| {
        let url = url.clone();
        async move {
            let (status, got) = sqs_json(
                &endpoint,
                "GetQueueAttributes",
                serde_json::json!({ "QueueUrl": url, "AttributeNames": ["CreatedTimestamp", "LastModifiedTimestamp"] }),
            )
            .await;
            assert_eq!(status, 200, "{got}");
            let stamp = |key: &str| got["Attributes"][key].as_str().and_then(|v| v.parse::<i64>().ok()).expect(key);
            (stamp("CreatedTimestamp"), stamp("LastModifiedTimestamp"))
        }
    };
    let before = seconds();
    assert_eq!(sqs_json(&one_sqs, "CreateQueue", serde_json::json!({ "QueueName": "stamped" })).await.0, 200);
    let (created, modified) = stamps(one_sqs.clone()).await;
    assert!((before - 1..=seconds() + 1).contains(&created), "created {created}, asked at {before}");
    assert_eq!(modified, created, "a new queue was last modified when it was created");
    assert_eq!(stamps(other_sqs.clone()).await, (created, modified), "the other sidecar answers the same");

    // Settings changed later: the last modification moves, the creation stays.
    let changed_after = seconds();
    while seconds() == changed_after {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let set = sqs_json(
        &one_sqs,
        "SetQueueAttributes",
        serde_json::json!({ "QueueUrl": url, "Attributes": { "VisibilityTimeout": "9" } }),
    )
    .await;
    assert_eq!(set.0, 200, "{}", set.1);
    let (created_now, modified_now) = stamps(other_sqs.clone()).await;
    assert_eq!(created_now, created);
    assert!(modified_now > created, "modified {modified_now}, created {created}");

    let (status, got) = sqs_json(
        &other_sqs,
        "GetQueueAttributes",
        serde_json::json!({ "QueueUrl": url, "AttributeNames": ["KmsMasterKeyId"] }),
    )
    .await;
    assert_eq!(status, 200, "{got}");
    assert!(got.get("Attributes").is_none_or(|a| a.as_object().is_some_and(|a| a.is_empty())), "{got}");

    // Deleted and made anew: a new creation.
    assert_eq!(sqs_json(&one_sqs, "DeleteQueue", serde_json::json!({ "QueueUrl": url })).await.0, 200);
    let recreated_after = seconds();
    while seconds() == recreated_after {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(sqs_json(&one_sqs, "CreateQueue", serde_json::json!({ "QueueName": "stamped" })).await.0, 200);
    let (again, modified_again) = stamps(other_sqs).await;
    assert!(again > modified_now, "made anew at {again}, after {modified_now}");
    assert_eq!(modified_again, again);
}

/// `AddPermission` and `RemovePermission` write the queue's `Policy` statements as SQS does, from
/// either protocol and either sidecar, and refuse what SQS refuses in its words. Both answered
/// `UnsupportedOperation`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_are_statements_of_the_queues_policy_on_every_sidecar() {
    let root = unique_root("sqs-permissions");
    let (_one, one_sqs) = zkq_with_sqs(&root).await;
    let (_other, other_sqs) = zkq_with_sqs(&root).await;
    let url = format!("{one_sqs}/000000000000/shared");
    let arn = "arn:aws:sqs:us-east-1:000000000000:shared";
    assert_eq!(sqs_json(&one_sqs, "CreateQueue", serde_json::json!({ "QueueName": "shared" })).await.0, 200);
    let added = sqs_json(
        &one_sqs,
        "AddPermission",
        serde_json::json!({ "QueueUrl": url, "Label": "everything", "AWSAccountIds": ["111111111111"], "Actions": ["*"] }),
    )
    .await;
    assert_eq!(added.0, 200, "{}", added.1);
    let (status, xml) = sqs_query(
        &other_sqs,
        "AddPermission",
        &[
            ("QueueUrl", &url),
            ("Label", "send-only"),
            ("AWSAccountId.1", "222222222222"),
            ("AWSAccountId.2", "333333333333"),
            ("ActionName.1", "SendMessage"),
            ("ActionName.2", "GetQueueUrl"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{xml}");
    let policy = || async {
        let (status, got) = sqs_json(
            &other_sqs,
            "GetQueueAttributes",
            serde_json::json!({ "QueueUrl": url, "AttributeNames": ["Policy"] }),
        )
        .await;
        assert_eq!(status, 200, "{got}");
        serde_json::from_str::<serde_json::Value>(got["Attributes"]["Policy"].as_str().expect("a policy"))
            .expect("the policy is JSON")
    };
    let got = policy().await;
    assert_eq!(got["Version"], "2012-10-17");
    assert_eq!(got["Id"], format!("{arn}/SQSDefaultPolicy"));
    assert_eq!(
        got["Statement"],
        serde_json::json!([
            { "Sid": "everything", "Effect": "Allow", "Principal": { "AWS": "arn:aws:iam::111111111111:root" },
              "Action": "SQS:*", "Resource": arn },
            { "Sid": "send-only", "Effect": "Allow",
              "Principal": { "AWS": ["arn:aws:iam::222222222222:root", "arn:aws:iam::333333333333:root"] },
              "Action": ["SQS:SendMessage", "SQS:GetQueueUrl"], "Resource": arn },
        ])
    );

    let refused = |input: serde_json::Value| {
        let endpoint = one_sqs.clone();
        async move { sqs_json(&endpoint, "AddPermission", input).await }
    };
    let again = refused(
        serde_json::json!({ "QueueUrl": url, "Label": "everything", "AWSAccountIds": ["111111111111"], "Actions": ["*"] }),
    )
    .await;
    assert_eq!(
        (again.0, again.1["message"].as_str()),
        (400, Some("Value everything for parameter Label is invalid. Reason: Already exists.")),
        "{}",
        again.1
    );
    let owner_only = refused(serde_json::json!({ "QueueUrl": url, "Label": "x", "AWSAccountIds": ["111111111111"], "Actions": ["RemovePermission"] })).await;
    assert_eq!(
        owner_only.1["message"],
        "Value SQS:RemovePermission for parameter ActionName is invalid. Reason: Only the queue owner is allowed to invoke this action."
    );
    let no_actions =
        refused(serde_json::json!({ "QueueUrl": url, "Label": "x", "AWSAccountIds": ["111111111111"], "Actions": [] }))
            .await;
    assert_eq!(
        (no_actions.0, no_actions.1["__type"].as_str()),
        (400, Some("com.amazonaws.sqs#MissingRequiredParameterException"))
    );
    let no_accounts =
        refused(serde_json::json!({ "QueueUrl": url, "Label": "x", "AWSAccountIds": [], "Actions": ["SendMessage"] }))
            .await;
    assert_eq!(no_accounts.1["message"], "Value [] for parameter PrincipalId is invalid. Reason: Unable to verify.");
    let eight = [
        "ChangeMessageVisibility",
        "DeleteMessage",
        "GetQueueAttributes",
        "GetQueueUrl",
        "ListDeadLetterSourceQueues",
        "PurgeQueue",
        "ReceiveMessage",
        "SendMessage",
    ];
    let too_many = refused(
        serde_json::json!({ "QueueUrl": url, "Label": "x", "AWSAccountIds": ["111111111111"], "Actions": eight }),
    )
    .await;
    assert_eq!(
        (too_many.0, too_many.1["message"].as_str()),
        (403, Some("8 Actions were found, maximum allowed is 7."))
    );

    // Removed through the other sidecar; then the label is gone.
    let removed =
        sqs_json(&other_sqs, "RemovePermission", serde_json::json!({ "QueueUrl": url, "Label": "everything" })).await;
    assert_eq!(removed.0, 200, "{}", removed.1);
    let got = policy().await;
    assert_eq!(
        got["Statement"].as_array().map(|s| s.iter().map(|s| s["Sid"].clone()).collect::<Vec<_>>()),
        Some(vec![serde_json::json!("send-only")])
    );
    let missing =
        sqs_json(&one_sqs, "RemovePermission", serde_json::json!({ "QueueUrl": url, "Label": "everything" })).await;
    assert_eq!(
        (missing.0, missing.1["message"].as_str()),
        (400, Some("Value everything for parameter Label is invalid. Reason: can't find label on existing policy."))
    );
}

/// The Rust AWS SDK (`aws-sdk-sqs`, built by scripts/test.sh from `tests/sqs/rust`) runs a producer
/// and consumer session: queues, sends with attributes, receives, a hand-back, batch deletes,
/// purge and delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_aws_sdk_sends_receives_and_deletes() {
    let root = unique_root("sqs-rust");
    let (_zkq, endpoint) = zkq_with_sqs(&root).await;
    run_rust_client(endpoint, "rust-orders").await;
}

/// Runs the Rust SDK's session (`tests/sqs/rust`) against `endpoint` on `queue`; it must pass.
async fn run_rust_client(endpoint: String, queue: &'static str) {
    let client = std::env::var_os("ZKQ_SQS_RUST_CLIENT")
        .map_or_else(|| repo_file("target/sqs-rust/debug/zkq-sqs-rust-client"), std::path::PathBuf::from);
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&client)
            .args([endpoint.as_str(), queue])
            .output()
            .unwrap_or_else(|err| panic!("{} runs (scripts/test.sh builds it): {err}", client.display()))
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let checks: usize = stdout.trim().strip_prefix("ok ").and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(output.status.success() && checks >= 13, "{stdout}{}", String::from_utf8_lossy(&output.stderr));
}

/// Peak resident set size of a process in KiB (`VmHWM` of /proc/PID/status): what a request
/// made the process hold at its worst, even if it was freed since.
fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

/// A query-protocol body of about 1 MiB made of multi-part parameter names (52,000 parameters,
/// `0.b.c.d.e.f.g.h=&1.b.c.…`), three at once, is refused with an SQS error without zkq's memory
/// growing by more than a few MiB; SQS's largest legitimate request, a batch of 10 entries with 10
/// message attributes each, is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_query_body_is_refused_before_it_costs_memory_and_a_large_batch_still_works() {
    let sqs = zkq_testkit::process::free_addr();
    let zkq =
        ChildZkq::start(ZkServer::shared(), &unique_root("sqs-hostile"), &[("ZKQ__SQS__LISTEN", sqs.as_str())]).await;
    let endpoint = format!("http://{sqs}");
    let http = reqwest::Client::new();
    let form = |body: String| {
        http.post(format!("{endpoint}/"))
            .header("content-type", "application/x-www-form-urlencoded; charset=utf-8")
            .body(body)
            .send()
    };
    let created = form("Action=CreateQueue&QueueName=hostile".to_owned()).await.expect("create");
    assert_eq!(created.status(), 200);
    let url = format!("http://{sqs}/000000000000/hostile");

    let mut hostile = format!("Action=SendMessage&QueueUrl={url}&MessageBody=x");
    let mut i = 0;
    while hostile.len() < 1_000_000 - 32 {
        hostile.push_str(&format!("&{i}.b.c.d.e.f.g.h="));
        i += 1;
    }
    let before = peak_rss_kib(zkq.pid());
    let answers = futures::future::join_all((0..3).map(|_| form(hostile.clone())))
        .await
        .into_iter()
        .map(|a| a.expect("answered"));
    for answer in answers {
        let status = answer.status().as_u16();
        let text = answer.text().await.unwrap_or_default();
        assert_eq!(status, 400, "{text}");
        assert!(text.contains("<Code>InvalidParameterValue</Code>") && text.contains("parameters"), "{text}");
    }
    let after = peak_rss_kib(zkq.pid());
    println!("3 hostile bodies of {} parameters each: peak RSS {before} KiB before, {after} KiB after", i + 3);
    assert!(after < before + 8 * 1024, "peak RSS grew from {before} KiB to {after} KiB");

    let mut batch = vec!["Action=SendMessageBatch".to_owned(), format!("QueueUrl={url}")];
    for e in 1..=10 {
        let entry = format!("SendMessageBatchRequestEntry.{e}");
        batch.push(format!("{entry}.Id=e{e}&{entry}.MessageBody=body{e}"));
        for a in 1..=10 {
            let attribute = format!("{entry}.MessageAttribute.{a}");
            batch.push(format!(
                "{attribute}.Name=n{a}&{attribute}.Value.DataType=String&{attribute}.Value.StringValue=v{a}"
            ));
        }
    }
    let sent = form(batch.join("&")).await.expect("batch");
    let status = sent.status().as_u16();
    let text = sent.text().await.unwrap_or_default();
    assert_eq!(status, 200, "{text}");
    assert_eq!(text.matches("<SendMessageBatchResultEntry>").count(), 10, "{text}");
    let received = form(format!(
        "Action=ReceiveMessage&QueueUrl={url}&MaxNumberOfMessages=10&MessageAttributeName.1=All&WaitTimeSeconds=1"
    ))
    .await
    .expect("receive");
    let text = received.text().await.unwrap_or_default();
    assert!(text.matches("<MessageAttribute>").count() >= 10, "the attributes came back: {text}");
}

/// Runs `tests/sqs/refusals.py` with `python` in `mode`; it must succeed.
async fn refusals(python: PathBuf, protocol: &str, endpoint: &str, mode: &[&str]) {
    let mut command = std::process::Command::new(python);
    command
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sqs/refusals.py"))
        .args([endpoint, protocol])
        .args(mode)
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null");
    runs_ok(command, &format!("refusals.py {protocol} {mode:?}")).await;
}

/// A request too large for SQS is refused in the request's protocol with SQS's code, which
/// botocore does not retry: a message over `api.max_message_bytes` (read by the action), and a
/// request over what the listener reads (refused before its body is read: 413 in zkq's own shape
/// before, which SDKs took for a server error and retried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_too_large_answers_sqs_errors_that_sdks_do_not_retry() {
    let mut config = test_config(ZkServer::shared(), &unique_root("sqs-large"));
    config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
    // The listener reads at most 4/3 of 1,024 bytes and 1 KiB per message of a batch of 10: 11,608.
    config.api.max_message_bytes = 1000;
    config.api.max_batch_bytes = 1024;
    config.api.max_batch = 10;
    let zkq = TestZkq::start(config).await;
    let addr = zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("the SQS listener is bound");
    let endpoint = format!("http://{addr}");
    for (python, protocol) in pythons() {
        refusals(python, protocol, &endpoint, &["too-large", "1000", "65536"]).await;
    }
    let metrics = zkq.registered_metrics();
    let count = |labels: &str| metric(&metrics, &format!("zkq_sqs_requests_total{{{labels}}}"));
    // Both protocols' messages over the limit, and the JSON protocol's request over the listener's.
    assert_eq!(count("action=\"SendMessage\",code=\"InvalidParameterValue\""), 3.0, "{metrics}");
    // The query protocol's requests over the listener's limit: their action is in the unread body.
    assert_eq!(count("action=\"other\",code=\"InvalidParameterValue\""), 2.0, "{metrics}");
    assert_eq!(count("action=\"SendMessageBatch\",code=\"AWS.SimpleQueueService.BatchRequestTooLong\""), 1.0);
}

/// With the SQS listener's `api.max_concurrent_requests` held by long-polls, a further request is
/// shed as SQS throttles (403 `RequestThrottled`, `Retry-After`), which botocore retries; zkq's
/// own API sheds its own requests as it always did (503 `overloaded`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_shed_for_load_answers_sqs_throttling_and_the_api_its_own_error() {
    let mut config = test_config(ZkServer::shared(), &unique_root("sqs-shed"));
    config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
    config.api.max_concurrent_requests = 2;
    let zkq = TestZkq::start_ready(config).await;
    let addr = zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("the SQS listener is bound");
    let endpoint = format!("http://{addr}");
    let (status, created) = sqs_json(&endpoint, "CreateQueue", serde_json::json!({ "QueueName": "held" })).await;
    assert_eq!(status, 200, "{created}");
    let url = created["QueueUrl"].as_str().expect("a queue URL").to_owned();
    let waiting = |queue: &'static str, n: usize| {
        let series = format!("zkq_waiting_takers{{queue=\"{queue}\"}} {n}");
        let zkq = &zkq;
        move || {
            let series = series.clone();
            async move { zkq.registered_metrics().lines().any(|line| line == series) }
        }
    };

    let polls: Vec<_> = (0..2)
        .map(|_| {
            let (endpoint, url) = (endpoint.clone(), url.clone());
            tokio::spawn(async move {
                sqs_json(&endpoint, "ReceiveMessage", serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 20 }))
                    .await
            })
        })
        .collect();
    eventually(Duration::from_secs(20), "two ReceiveMessage long-polls wait", waiting("held", 2)).await;
    for (python, protocol) in pythons() {
        refusals(python, protocol, &endpoint, &["throttled", &url]).await;
    }
    let metrics = zkq.registered_metrics();
    let count = |labels: &str| metric(&metrics, &format!("zkq_sqs_requests_total{{{labels}}}"));
    // Each SendMessage and its one retry; the query protocol's action is in the unread body.
    assert_eq!(count("action=\"SendMessage\",code=\"RequestThrottled\""), 2.0, "{metrics}");
    assert_eq!(count("action=\"other\",code=\"RequestThrottled\""), 2.0, "{metrics}");
    // zkq's own API has permits of its own: its puts end the long-polls.
    assert_eq!(zkq.put("held", b"one").await.status(), 201);
    assert_eq!(zkq.put("held", b"two").await.status(), 201);
    for poll in polls {
        let (status, received) = poll.await.expect("join");
        assert_eq!((status, received["Messages"].as_array().map(Vec::len)), (200, Some(1)), "{received}");
    }

    // zkq's own API, with its permits held, answers as it always did.
    zkq.put_ok("native", b"opens the queue").await;
    assert!(zkq.take_body("native", "0s").await.is_some());
    let takes: Vec<_> = (0..2)
        .map(|_| {
            let (http, url) = (zkq.http.clone(), zkq.url("/v1/queues/native/take?wait=20s"));
            tokio::spawn(async move { http.post(url).send().await.expect("take").status().as_u16() })
        })
        .collect();
    eventually(Duration::from_secs(20), "two takes wait", waiting("native", 2)).await;
    let shed = zkq.put("native", b"shed").await;
    assert_eq!(shed.status(), 503);
    assert_eq!(shed.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    let body: serde_json::Value = shed.json().await.expect("JSON");
    assert_eq!(body["code"], "overloaded", "{body}");
    let native_url = url.replace("/held", "/native");
    for body in ["one", "two"] {
        let (status, sent) =
            sqs_json(&endpoint, "SendMessage", serde_json::json!({ "QueueUrl": native_url, "MessageBody": body }))
                .await;
        assert_eq!(status, 200, "{sent}");
    }
    for take in takes {
        assert_eq!(take.await.expect("join"), 200);
    }
}

/// Sends `request` (a head, and maybe part of a body) on a new connection to `addr`; what zkq
/// answers, read until it closes the connection.
async fn raw_answer(addr: &str, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "zkq neither answered nor closed: {}", String::from_utf8_lossy(&answer));
    String::from_utf8_lossy(&answer).to_ascii_lowercase()
}

/// What the guard refuses before an action runs comes in the request's protocol with SQS's code:
/// a body that does not arrive within `api.body_read_timeout` (`RequestTimeout`), a request a web
/// browser sent for another site's page (`AccessDenied`), a body of undeclared length larger than
/// the listener reads (`InvalidParameterValue`, a batch `BatchRequestTooLong`); each counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_before_the_action_answer_in_the_requests_protocol() {
    let mut config = test_config(ZkServer::shared(), &unique_root("sqs-refused"));
    config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
    config.api.body_read_timeout = Duration::from_secs(1);
    config.api.max_message_bytes = 1000;
    config.api.max_batch_bytes = 1024;
    config.api.max_batch = 10;
    let zkq = TestZkq::start(config).await;
    let addr = zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("the SQS listener is bound").to_string();
    let json = |action: &str| {
        format!(
            "POST / HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-amz-json-1.0\r\n\
             X-Amz-Target: AmazonSQS.{action}\r\n"
        )
    };
    let query = format!("POST / HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\n");

    // A body that stops halfway.
    let answer =
        raw_answer(&addr, format!("{}Content-Length: 100\r\n\r\n{{\"QueueUrl\"", json("SendMessage")).as_bytes()).await;
    assert!(answer.starts_with("http/1.1 400"), "{answer}");
    assert!(answer.contains("x-amzn-query-error: requesttimeout;sender"), "{answer}");
    assert!(answer.contains("\"__type\":\"com.amazonaws.sqs#requesttimeout\""), "{answer}");
    let answer = raw_answer(&addr, format!("{query}Content-Length: 100\r\n\r\nAction=Send").as_bytes()).await;
    assert!(answer.starts_with("http/1.1 400"), "{answer}");
    assert!(answer.contains("<errorresponse") && answer.contains("<code>requesttimeout</code>"), "{answer}");

    // A body of undeclared length, larger than the listener reads.
    let chunked = |head: &str| {
        let chunk = "x".repeat(20_000);
        format!("{head}Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n", chunk.len())
    };
    let answer = raw_answer(&addr, chunked(&json("SendMessageBatch")).as_bytes()).await;
    assert!(answer.starts_with("http/1.1 400"), "{answer}");
    assert!(answer.contains("x-amzn-query-error: aws.simplequeueservice.batchrequesttoolong;sender"), "{answer}");
    let answer = raw_answer(&addr, chunked(&query).as_bytes()).await;
    assert!(answer.starts_with("http/1.1 400"), "{answer}");
    assert!(answer.contains("<code>invalidparametervalue</code>"), "{answer}");

    // A web page of another site.
    let browser = "Sec-Fetch-Site: cross-site\r\nContent-Length: 2\r\nConnection: close\r\n\r\n";
    let answer = raw_answer(&addr, format!("{}{browser}{{}}", json("ListQueues")).as_bytes()).await;
    assert!(answer.starts_with("http/1.1 403"), "{answer}");
    assert!(answer.contains("x-amzn-query-error: accessdenied;sender"), "{answer}");
    let answer = raw_answer(&addr, format!("{query}{browser}{{}}").as_bytes()).await;
    assert!(answer.starts_with("http/1.1 403") && answer.contains("<code>accessdenied</code>"), "{answer}");

    let metrics = zkq.registered_metrics();
    let count = |labels: &str| metric(&metrics, &format!("zkq_sqs_requests_total{{{labels}}}"));
    assert_eq!(count("action=\"SendMessage\",code=\"RequestTimeout\""), 1.0, "{metrics}");
    assert_eq!(count("action=\"other\",code=\"RequestTimeout\""), 1.0, "{metrics}");
    assert_eq!(count("action=\"SendMessageBatch\",code=\"AWS.SimpleQueueService.BatchRequestTooLong\""), 1.0);
    assert_eq!(count("action=\"other\",code=\"InvalidParameterValue\""), 1.0, "{metrics}");
    assert_eq!(count("action=\"ListQueues\",code=\"AccessDenied\""), 1.0, "{metrics}");
    assert_eq!(count("action=\"other\",code=\"AccessDenied\""), 1.0, "{metrics}");
}

/// SQS reads a boolean attribute in any case: `FifoQueue` and `ContentBasedDeduplication` given as
/// `True` and `TRUE` make a FIFO queue with content-based deduplication, in both protocols, and a
/// `CreateQueue` of it again with `False` is told it exists with other attributes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boolean_attributes_are_read_in_any_case_in_both_protocols() {
    let (_zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-booleans")).await;
    let attributes = serde_json::json!({ "FifoQueue": "True", "ContentBasedDeduplication": "TRUE" });
    let created =
        sqs_json(&endpoint, "CreateQueue", serde_json::json!({ "QueueName": "json.fifo", "Attributes": attributes }))
            .await;
    assert_eq!(created.0, 200, "{}", created.1);
    let query = reqwest::Client::new()
        .post(&endpoint)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(
            "Version=2012-11-05&Action=CreateQueue&QueueName=query.fifo&Attribute.1.Name=FifoQueue&\
             Attribute.1.Value=True&Attribute.2.Name=ContentBasedDeduplication&Attribute.2.Value=tRuE",
        )
        .send()
        .await
        .expect("a query call");
    let (status, text) = (query.status().as_u16(), query.text().await.expect("text"));
    assert_eq!(status, 200, "{text}");
    for name in ["json.fifo", "query.fifo"] {
        let url = format!("{endpoint}/000000000000/{name}");
        let got = sqs_json(
            &endpoint,
            "GetQueueAttributes",
            serde_json::json!({ "QueueUrl": url, "AttributeNames": ["FifoQueue", "ContentBasedDeduplication"] }),
        )
        .await;
        assert_eq!(got.1["Attributes"]["FifoQueue"], "true", "{name}: {}", got.1);
        assert_eq!(got.1["Attributes"]["ContentBasedDeduplication"], "true", "{name}: {}", got.1);
        // Deduplicated by content, with no MessageDeduplicationId: the second send answers the
        // first one's MessageId.
        let mut ids = Vec::new();
        for _ in 0..2 {
            let sent = sqs_json(
                &endpoint,
                "SendMessage",
                serde_json::json!({ "QueueUrl": url, "MessageBody": "once", "MessageGroupId": "g" }),
            )
            .await;
            assert_eq!(sent.0, 200, "{name}: {}", sent.1);
            ids.push(sent.1["MessageId"].as_str().expect("a MessageId").to_owned());
        }
        assert_eq!(ids[0], ids[1], "{name}: one message");
    }
    let again = serde_json::json!({ "FifoQueue": "TRUE", "ContentBasedDeduplication": "False" });
    let refused =
        sqs_json(&endpoint, "CreateQueue", serde_json::json!({ "QueueName": "json.fifo", "Attributes": again })).await;
    assert_eq!(refused.0, 400, "{}", refused.1);
    assert!(refused.1["__type"].as_str().is_some_and(|t| t.contains("QueueNameExists")), "{}", refused.1);
    // Anything but a boolean is refused as a value, and no queue is made.
    for (name, attributes) in [
        ("tru", serde_json::json!({ "FifoQueue": "tru" })),
        ("yes.fifo", serde_json::json!({ "FifoQueue": "true", "ContentBasedDeduplication": "yes" })),
    ] {
        let refused =
            sqs_json(&endpoint, "CreateQueue", serde_json::json!({ "QueueName": name, "Attributes": attributes }))
                .await;
        assert_eq!(refused.0, 400, "{}", refused.1);
        assert!(refused.1["__type"].as_str().is_some_and(|t| t.ends_with("#InvalidAttributeValue")), "{}", refused.1);
        let url = format!("{endpoint}/000000000000/{name}");
        let looked = sqs_json(&endpoint, "GetQueueUrl", serde_json::json!({ "QueueName": name })).await;
        assert_eq!(looked.0, 400, "{url} was not made: {}", looked.1);
    }
}

/// Makes queue `name` with `attributes` through the JSON protocol (it must succeed); its URL.
async fn create_queue(endpoint: &str, name: &str, attributes: serde_json::Value) -> String {
    let made =
        sqs_json(endpoint, "CreateQueue", serde_json::json!({ "QueueName": name, "Attributes": attributes })).await;
    assert_eq!(made.0, 200, "CreateQueue {name}: {}", made.1);
    format!("{endpoint}/000000000000/{name}")
}

/// `text` percent-encoded as SigV4 and SQS's forms encode it.
fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An SQS call in the query protocol (form-encoded `params`), its status and its body.
async fn sqs_query(endpoint: &str, action: &str, params: &[(&str, &str)]) -> (u16, String) {
    let encode = url_encode;
    let mut form = format!("Action={action}&Version=2012-11-05");
    for (name, value) in params {
        form.push_str(&format!("&{}={}", encode(name), encode(value)));
    }
    let answer = reqwest::Client::new()
        .post(endpoint)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .expect("an SQS call");
    let status = answer.status().as_u16();
    (status, answer.text().await.expect("a body"))
}

/// The text of the first `<tag>` in an XML answer, unescaped.
fn xml_text(xml: &str, tag: &str) -> String {
    let open = format!("<{tag}>");
    let text = xml.split(&open).nth(1).and_then(|rest| rest.split(&format!("</{tag}>")).next()).unwrap_or_default();
    text.replace("&quot;", "\"").replace("&apos;", "'").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
}

/// Errors say what SQS says, word for word, in both protocols: clients and SQS applications match
/// on these messages (a missing queue, a bad receipt handle, an unknown attribute, a missing
/// parameter, an attribute name SQS refuses, an empty batch, a batch entry's bad handle).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_carry_sqss_own_words_in_both_protocols() {
    let (_zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-words")).await;
    let plain = create_queue(&endpoint, "plain", serde_json::json!({})).await;
    let fifo = create_queue(&endpoint, "words.fifo", serde_json::json!({ "FifoQueue": "true" })).await;
    let bad_name = "The message attribute name 'öther' is invalid. Attribute name can contain A-Z, a-z, 0-9, \
                    underscore (_), hyphen (-), and period (.) characters.";
    let long_key = "k".repeat(129);
    /// An action, its JSON input and its query parameters, the code in each protocol, the message.
    type Case<'a> = (&'a str, serde_json::Value, Vec<(&'a str, &'a str)>, (&'a str, &'a str), &'a str);
    let cases: Vec<Case> = vec![
        (
            "GetQueueUrl",
            serde_json::json!({ "QueueName": "nope" }),
            vec![("QueueName", "nope")],
            ("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"),
            "The specified queue does not exist.",
        ),
        (
            "DeleteMessage",
            serde_json::json!({ "QueueUrl": plain, "ReceiptHandle": "not-a-handle" }),
            vec![("QueueUrl", &plain), ("ReceiptHandle", "not-a-handle")],
            ("ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid"),
            "The input receipt handle is invalid.",
        ),
        (
            "GetQueueAttributes",
            serde_json::json!({ "QueueUrl": plain, "AttributeNames": ["not-existing"] }),
            vec![("QueueUrl", &plain), ("AttributeName.1", "not-existing")],
            ("InvalidAttributeName", "InvalidAttributeName"),
            "Unknown Attribute not-existing.",
        ),
        (
            "SendMessage",
            serde_json::json!({ "QueueUrl": fifo, "MessageBody": "x", "MessageDeduplicationId": "d" }),
            vec![("QueueUrl", &fifo), ("MessageBody", "x"), ("MessageDeduplicationId", "d")],
            ("MissingRequiredParameterException", "MissingParameter"),
            "The request must contain the parameter MessageGroupId.",
        ),
        (
            "SendMessage",
            serde_json::json!({ "QueueUrl": plain, "MessageBody": "x",
                "MessageAttributes": { "öther": { "DataType": "String", "StringValue": "v" } } }),
            vec![
                ("QueueUrl", &plain),
                ("MessageBody", "x"),
                ("MessageAttribute.1.Name", "öther"),
                ("MessageAttribute.1.Value.DataType", "String"),
                ("MessageAttribute.1.Value.StringValue", "v"),
            ],
            ("InvalidParameterValueException", "InvalidParameterValue"),
            bad_name,
        ),
        (
            "DeleteMessageBatch",
            serde_json::json!({ "QueueUrl": plain, "Entries": [] }),
            vec![("QueueUrl", &plain)],
            ("EmptyBatchRequest", "AWS.SimpleQueueService.EmptyBatchRequest"),
            "There should be at least one DeleteMessageBatchRequestEntry in the request.",
        ),
        (
            "UntagQueue",
            serde_json::json!({ "QueueUrl": plain, "TagKeys": [long_key] }),
            vec![("QueueUrl", &plain), ("TagKey.1", &long_key)],
            ("InvalidParameterValueException", "InvalidParameterValue"),
            "Tag keys must be between 1 and 128 characters in length.",
        ),
    ];
    for (action, json, query, (shape, code), message) in cases {
        let (status, answer) = sqs_json(&endpoint, action, json).await;
        assert_eq!(status, 400, "{action} (JSON): {answer}");
        assert!(answer["__type"].as_str().is_some_and(|t| t.ends_with(&format!("#{shape}"))), "{action}: {answer}");
        assert_eq!(answer["message"], message, "{action} (JSON): {answer}");
        let (status, xml) = sqs_query(&endpoint, action, &query).await;
        assert_eq!(status, 400, "{action} (query): {xml}");
        // The query protocol words a missing queue as SQS's WSDL-era API does.
        let message =
            if action == "GetQueueUrl" { "The specified queue does not exist for this wsdl version." } else { message };
        assert_eq!((xml_text(&xml, "Code").as_str(), xml_text(&xml, "Message").as_str()), (code, message), "{xml}");
    }
    let many: serde_json::Map<String, serde_json::Value> = (0..51).map(|i| (format!("k{i}"), "v".into())).collect();
    let (status, answer) =
        sqs_json(&endpoint, "TagQueue", serde_json::json!({ "QueueUrl": plain, "Tags": many })).await;
    assert_eq!((status, answer["message"].as_str()), (400, Some("Too many tags added for queue plain.")), "{answer}");
    // A batch entry's bad handle fails that entry, naming the handle, as SQS's do.
    let entries = serde_json::json!([{ "Id": "a", "ReceiptHandle": "fake-1" }]);
    let (status, answer) =
        sqs_json(&endpoint, "DeleteMessageBatch", serde_json::json!({ "QueueUrl": plain, "Entries": entries })).await;
    assert_eq!(status, 200, "{answer}");
    let failed = &answer["Failed"][0];
    assert_eq!(failed["Code"], "ReceiptHandleIsInvalid", "{answer}");
    assert_eq!(failed["Message"], "The input receipt handle \"fake-1\" is not a valid receipt handle.", "{answer}");
    let (status, xml) = sqs_query(
        &endpoint,
        "DeleteMessageBatch",
        &[
            ("QueueUrl", &plain),
            ("DeleteMessageBatchRequestEntry.1.Id", "a"),
            ("DeleteMessageBatchRequestEntry.1.ReceiptHandle", "fake-1"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{xml}");
    assert_eq!(
        xml_text(&xml, "Message"),
        "The input receipt handle \"fake-1\" is not a valid receipt handle.",
        "{xml}"
    );
}

/// A FIFO queue's messages carry a `SequenceNumber`, as SQS's do: in the `SendMessage` and
/// `SendMessageBatch` answers (both protocols) and in the received message's attributes, the same
/// number, growing with each message; a received message says its `MessageDeduplicationId` and
/// its `SenderId` (the listener's account).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_messages_carry_growing_sequence_numbers_their_deduplication_ids_and_a_sender() {
    let (_zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-sequence")).await;
    let url = create_queue(&endpoint, "seq.fifo", serde_json::json!({ "FifoQueue": "true" })).await;
    let mut sent = Vec::new();
    let one = sqs_json(
        &endpoint,
        "SendMessage",
        serde_json::json!({ "QueueUrl": url, "MessageBody": "a", "MessageGroupId": "g", "MessageDeduplicationId": "1" }),
    )
    .await;
    sent.push(one.1["SequenceNumber"].as_str().unwrap_or_else(|| panic!("a SequenceNumber: {}", one.1)).to_owned());
    let (status, xml) = sqs_query(
        &endpoint,
        "SendMessage",
        &[("QueueUrl", &url), ("MessageBody", "b"), ("MessageGroupId", "g"), ("MessageDeduplicationId", "2")],
    )
    .await;
    assert_eq!(status, 200, "{xml}");
    sent.push(xml_text(&xml, "SequenceNumber"));
    let entries = serde_json::json!([
        { "Id": "c", "MessageBody": "c", "MessageGroupId": "g", "MessageDeduplicationId": "3" },
        { "Id": "d", "MessageBody": "d", "MessageGroupId": "g", "MessageDeduplicationId": "4" },
    ]);
    let batch =
        sqs_json(&endpoint, "SendMessageBatch", serde_json::json!({ "QueueUrl": url, "Entries": entries })).await;
    for id in ["c", "d"] {
        let entry = batch.1["Successful"].as_array().and_then(|a| a.iter().find(|e| e["Id"] == id));
        let number = entry.and_then(|e| e["SequenceNumber"].as_str());
        sent.push(number.unwrap_or_else(|| panic!("entry {id} has a SequenceNumber: {}", batch.1)).to_owned());
    }
    let numbers: Vec<u128> = sent.iter().map(|n| n.parse().unwrap_or_else(|_| panic!("a number: {n}"))).collect();
    assert!(numbers.windows(2).all(|w| w[0] < w[1]), "growing: {sent:?}");
    // Received in order (one group), each with the number its send answered.
    for expected in &sent {
        let received = sqs_json(
            &endpoint,
            "ReceiveMessage",
            serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 5,
                "MessageSystemAttributeNames": ["SequenceNumber", "SenderId", "MessageDeduplicationId"] }),
        )
        .await;
        let message = &received.1["Messages"][0];
        assert_eq!(message["Attributes"]["SequenceNumber"], expected.as_str(), "{}", received.1);
        let body = message["Body"].as_str().expect("a body");
        let dedup = ["a", "b", "c", "d"].iter().position(|b| *b == body).map(|i| (i + 1).to_string());
        assert_eq!(message["Attributes"]["MessageDeduplicationId"].as_str(), dedup.as_deref(), "{}", received.1);
        assert_eq!(message["Attributes"]["SenderId"], "000000000000", "{}", received.1);
        let handle = message["ReceiptHandle"].clone();
        let deleted =
            sqs_json(&endpoint, "DeleteMessage", serde_json::json!({ "QueueUrl": url, "ReceiptHandle": handle })).await;
        assert_eq!(deleted.0, 200, "{}", deleted.1);
    }
}

/// `CreateQueue` reads attribute names around stray spaces (`"VisibilityTimeout "` sets the
/// visibility) and refuses `FifoQueue=true` for a name without `.fifo` as SQS does
/// (`InvalidParameterValue`, in SQS's words), in both protocols.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_queue_reads_names_around_spaces_and_refuses_a_fifo_without_its_suffix() {
    let (_zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-create-names")).await;
    let attributes = serde_json::json!({ "VisibilityTimeout ": "7" });
    let created =
        sqs_json(&endpoint, "CreateQueue", serde_json::json!({ "QueueName": "spaced", "Attributes": attributes }))
            .await;
    assert_eq!(created.0, 200, "{}", created.1);
    let (status, xml) = sqs_query(
        &endpoint,
        "CreateQueue",
        &[("QueueName", "spaced-q"), ("Attribute.1.Name", " VisibilityTimeout"), ("Attribute.1.Value", "9")],
    )
    .await;
    assert_eq!(status, 200, "{xml}");
    for (name, seconds) in [("spaced", "7"), ("spaced-q", "9")] {
        let url = format!("{endpoint}/000000000000/{name}");
        let got = sqs_json(
            &endpoint,
            "GetQueueAttributes",
            serde_json::json!({ "QueueUrl": url, "AttributeNames": ["VisibilityTimeout"] }),
        )
        .await;
        assert_eq!(got.1["Attributes"]["VisibilityTimeout"], seconds, "{name}: {}", got.1);
    }
    let words = "The name of a FIFO queue can only include alphanumeric characters, hyphens, or underscores, must \
                 end with .fifo suffix and be 1 to 80 in length.";
    let refused = sqs_json(
        &endpoint,
        "CreateQueue",
        serde_json::json!({ "QueueName": "not-fifo", "Attributes": { "FifoQueue": "true" } }),
    )
    .await;
    assert_eq!(refused.0, 400, "{}", refused.1);
    assert_eq!(refused.1["message"], words, "{}", refused.1);
    let (status, xml) = sqs_query(
        &endpoint,
        "CreateQueue",
        &[("QueueName", "not-fifo"), ("Attribute.1.Name", "FifoQueue"), ("Attribute.1.Value", "true")],
    )
    .await;
    assert_eq!(
        (status, xml_text(&xml, "Code").as_str(), xml_text(&xml, "Message").as_str()),
        (400, "InvalidParameterValue", words)
    );
    let listed = sqs_json(&endpoint, "GetQueueUrl", serde_json::json!({ "QueueName": "not-fifo" })).await;
    assert_eq!(listed.0, 400, "the refused queue was not made: {}", listed.1);
}

/// On a FIFO queue a batch entry without `MessageGroupId`, or without `MessageDeduplicationId`
/// where the queue does not deduplicate by content, refuses the whole batch, as SQS does (nothing
/// is stored); a FIFO queue's dead-letter queue must be a FIFO queue, and a standard queue's a
/// standard one. Both protocols.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_batches_missing_a_group_or_deduplication_id_and_mixed_dead_letter_queues_are_refused() {
    let (_zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-fifo-refusals")).await;
    let url = create_queue(&endpoint, "f.fifo", serde_json::json!({ "FifoQueue": "true" })).await;
    create_queue(&endpoint, "plain-dlq", serde_json::json!({ "FifoQueue": "false" })).await;
    let no_group = serde_json::json!([
        { "Id": "a", "MessageBody": "a", "MessageGroupId": "g", "MessageDeduplicationId": "1" },
        { "Id": "b", "MessageBody": "b", "MessageDeduplicationId": "2" },
    ]);
    let refused =
        sqs_json(&endpoint, "SendMessageBatch", serde_json::json!({ "QueueUrl": url, "Entries": no_group })).await;
    assert_eq!(refused.0, 400, "{}", refused.1);
    assert_eq!(refused.1["message"], "The request must contain the parameter MessageGroupId.", "{}", refused.1);
    let (status, xml) = sqs_query(
        &endpoint,
        "SendMessageBatch",
        &[
            ("QueueUrl", &url),
            ("SendMessageBatchRequestEntry.1.Id", "a"),
            ("SendMessageBatchRequestEntry.1.MessageBody", "a"),
            ("SendMessageBatchRequestEntry.1.MessageGroupId", "g"),
            ("SendMessageBatchRequestEntry.2.Id", "b"),
            ("SendMessageBatchRequestEntry.2.MessageBody", "b"),
            ("SendMessageBatchRequestEntry.2.MessageGroupId", "g"),
            ("SendMessageBatchRequestEntry.2.MessageDeduplicationId", "2"),
        ],
    )
    .await;
    assert_eq!(status, 400, "{xml}");
    assert_eq!(
        xml_text(&xml, "Message"),
        "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided explicitly",
        "{xml}"
    );
    let depth = sqs_json(
        &endpoint,
        "GetQueueAttributes",
        serde_json::json!({ "QueueUrl": url, "AttributeNames": ["ApproximateNumberOfMessages"] }),
    )
    .await;
    assert_eq!(depth.1["Attributes"]["ApproximateNumberOfMessages"], "0", "nothing was stored: {}", depth.1);

    // Dead letters stay within their type of queue.
    let policy = |target: &str| {
        serde_json::json!({ "deadLetterTargetArn": format!("arn:aws:sqs:us-east-1:000000000000:{target}"),
            "maxReceiveCount": 2 })
        .to_string()
    };
    let mixed = sqs_json(
        &endpoint,
        "CreateQueue",
        serde_json::json!({ "QueueName": "g.fifo", "Attributes": { "FifoQueue": "true", "RedrivePolicy": policy("plain-dlq") } }),
    )
    .await;
    assert_eq!(mixed.0, 400, "a FIFO queue with a standard dead-letter queue: {}", mixed.1);
    let standard_policy = policy("f.fifo");
    let (status, xml) = sqs_query(
        &endpoint,
        "CreateQueue",
        &[("QueueName", "s"), ("Attribute.1.Name", "RedrivePolicy"), ("Attribute.1.Value", &standard_policy)],
    )
    .await;
    assert_eq!((status, xml_text(&xml, "Code").as_str()), (400, "InvalidParameterValue"), "{xml}");
    let same = sqs_json(
        &endpoint,
        "CreateQueue",
        serde_json::json!({ "QueueName": "h.fifo", "Attributes": { "FifoQueue": "true", "RedrivePolicy": policy("f.fifo") } }),
    )
    .await;
    assert_eq!(same.0, 200, "a FIFO queue with a FIFO dead-letter queue: {}", same.1);
}

/// `AWSTraceHeader` (SQS's one message system attribute, an AWS X-Ray trace header) is kept as the
/// message's W3C `traceparent`: received back as it was sent, in both protocols; zkq's own API
/// delivers the same trace as `traceparent`, and a message put there with a `traceparent` is
/// received over SQS with its `AWSTraceHeader`. A header that is not X-Ray's is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_trace_headers_travel_as_the_messages_traceparent() {
    let (zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-trace")).await;
    let url = create_queue(&endpoint, "traced", serde_json::json!({})).await;
    let xray = "Root=1-3152b799-8954dae64eda91bc9a23a7e8;Parent=7fa8c0f79203be72;Sampled=1";
    let w3c = "00-3152b7998954dae64eda91bc9a23a7e8-7fa8c0f79203be72-01";
    let sent = sqs_json(
        &endpoint,
        "SendMessage",
        serde_json::json!({ "QueueUrl": url, "MessageBody": "json",
            "MessageSystemAttributes": { "AWSTraceHeader": { "DataType": "String", "StringValue": xray } } }),
    )
    .await;
    assert_eq!(sent.0, 200, "{}", sent.1);
    let (status, xml) = sqs_query(
        &endpoint,
        "SendMessage",
        &[
            ("QueueUrl", &url),
            ("MessageBody", "query"),
            ("MessageSystemAttribute.1.Name", "AWSTraceHeader"),
            ("MessageSystemAttribute.1.Value.DataType", "String"),
            ("MessageSystemAttribute.1.Value.StringValue", xray),
        ],
    )
    .await;
    assert_eq!(status, 200, "{xml}");
    // zkq's own API delivers the first with its traceparent...
    let taken = zkq.http.post(zkq.url("/v1/queues/traced/take?wait=5s")).send().await.expect("take");
    assert_eq!(taken.headers().get("traceparent").and_then(|v| v.to_str().ok()), Some(w3c));
    assert_eq!(taken.bytes().await.expect("body").as_ref(), b"json");
    // ...SQS the second with its AWSTraceHeader, and one put with a traceparent likewise.
    let put = zkq
        .http
        .post(zkq.url("/v1/queues/traced/messages"))
        .header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
        .body("native")
        .send()
        .await
        .expect("put");
    assert_eq!(put.status(), 201);
    for (body, header) in
        [("query", xray), ("native", "Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=0")]
    {
        let received = sqs_json(
            &endpoint,
            "ReceiveMessage",
            serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 5, "MessageSystemAttributeNames": ["All"] }),
        )
        .await;
        let message = &received.1["Messages"][0];
        assert_eq!(
            (message["Body"].as_str(), message["Attributes"]["AWSTraceHeader"].as_str()),
            (Some(body), Some(header))
        );
        let handle = message["ReceiptHandle"].clone();
        let deleted =
            sqs_json(&endpoint, "DeleteMessage", serde_json::json!({ "QueueUrl": url, "ReceiptHandle": handle })).await;
        assert_eq!(deleted.0, 200, "{}", deleted.1);
    }
    let refused = sqs_json(
        &endpoint,
        "SendMessage",
        serde_json::json!({ "QueueUrl": url, "MessageBody": "x",
            "MessageSystemAttributes": { "AWSTraceHeader": { "DataType": "String", "StringValue": "Root=nope" } } }),
    )
    .await;
    assert_eq!(
        (refused.0, refused.1["__type"].as_str().map(|t| t.ends_with("#InvalidParameterValueException"))),
        (400, Some(true))
    );
}

/// A dynamic queue keeps the `Policy` it is given (stored and answered, not enforced), in both
/// protocols; an empty one removes it, and one that is not a JSON object is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_keeps_its_policy_and_an_empty_one_removes_it() {
    let (_zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-policy")).await;
    let policy = serde_json::json!({ "Version": "2012-10-17", "Id": "test",
        "Statement": [{ "Effect": "Allow", "Principal": "*", "Action": "*" }] });
    let url = create_queue(&endpoint, "guarded", serde_json::json!({ "Policy": policy.to_string() })).await;
    let (status, xml) =
        sqs_query(&endpoint, "GetQueueAttributes", &[("QueueUrl", &url), ("AttributeName.1", "Policy")]).await;
    assert_eq!(status, 200, "{xml}");
    let kept: serde_json::Value = serde_json::from_str(&xml_text(&xml, "Value")).expect("JSON");
    assert_eq!(kept, policy, "{xml}");
    let (status, xml) = sqs_query(
        &endpoint,
        "SetQueueAttributes",
        &[("QueueUrl", &url), ("Attribute.1.Name", "Policy"), ("Attribute.1.Value", "")],
    )
    .await;
    assert_eq!(status, 200, "{xml}");
    let all =
        sqs_json(&endpoint, "GetQueueAttributes", serde_json::json!({ "QueueUrl": url, "AttributeNames": ["All"] }))
            .await;
    assert!(all.1["Attributes"].get("Policy").is_none(), "removed: {}", all.1);
    let refused = sqs_json(
        &endpoint,
        "SetQueueAttributes",
        serde_json::json!({ "QueueUrl": url, "Attributes": { "Policy": "not json" } }),
    )
    .await;
    assert_eq!(refused.0, 400, "{}", refused.1);
    assert!(refused.1["__type"].as_str().is_some_and(|t| t.ends_with("#InvalidAttributeValue")), "{}", refused.1);
}

/// A dynamic queue's `MaximumMessageSize` (1,024 bytes up to `api.max_message_bytes`) bounds what
/// an SQS send puts, body and attributes, as SQS counts them; in both protocols.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queues_maximum_message_size_bounds_its_sends() {
    let (_zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-max-size")).await;
    let url = create_queue(&endpoint, "small", serde_json::json!({ "MaximumMessageSize": "2048" })).await;
    let (status, xml) =
        sqs_query(&endpoint, "GetQueueAttributes", &[("QueueUrl", &url), ("AttributeName.1", "MaximumMessageSize")])
            .await;
    assert_eq!((status, xml_text(&xml, "Value").as_str()), (200, "2048"), "{xml}");
    let fits =
        sqs_json(&endpoint, "SendMessage", serde_json::json!({ "QueueUrl": url, "MessageBody": "a".repeat(2048) }))
            .await;
    assert_eq!(fits.0, 200, "{}", fits.1);
    let words = "One or more parameters are invalid. Reason: Message must be shorter than 2048 bytes.";
    let long =
        sqs_json(&endpoint, "SendMessage", serde_json::json!({ "QueueUrl": url, "MessageBody": "a".repeat(2049) }))
            .await;
    assert_eq!((long.0, long.1["message"].as_str()), (400, Some(words)), "{}", long.1);
    // Attributes count: 2,040 bytes of body and an attribute of 4 + 6 + 1 bytes.
    let body = "b".repeat(2040);
    let (status, xml) = sqs_query(
        &endpoint,
        "SendMessage",
        &[
            ("QueueUrl", &url),
            ("MessageBody", &body),
            ("MessageAttribute.1.Name", "name"),
            ("MessageAttribute.1.Value.DataType", "String"),
            ("MessageAttribute.1.Value.StringValue", "v"),
        ],
    )
    .await;
    assert_eq!((status, xml_text(&xml, "Message").as_str()), (400, words), "{xml}");
    for bad in ["1023", "1048577000"] {
        let refused = sqs_json(
            &endpoint,
            "SetQueueAttributes",
            serde_json::json!({ "QueueUrl": url, "Attributes": { "MaximumMessageSize": bad } }),
        )
        .await;
        assert_eq!(refused.0, 400, "{bad}: {}", refused.1);
        assert!(refused.1["__type"].as_str().is_some_and(|t| t.ends_with("#InvalidAttributeValue")), "{}", refused.1);
    }
}

/// A receive with `VisibilityTimeout=0` leaves the message visible at once, as SQS does: the next
/// receive (the other protocol), which does not wait, gets it again, its receive count grown, and
/// deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_with_visibility_zero_leaves_the_message_visible_at_once() {
    let (_zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-visibility-zero")).await;
    let url = create_queue(&endpoint, "peek", serde_json::json!({})).await;
    let sent = sqs_json(&endpoint, "SendMessage", serde_json::json!({ "QueueUrl": url, "MessageBody": "again" })).await;
    assert_eq!(sent.0, 200, "{}", sent.1);
    let first = sqs_json(
        &endpoint,
        "ReceiveMessage",
        serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 5, "VisibilityTimeout": 0, "AttributeNames": ["All"] }),
    )
    .await;
    let message = &first.1["Messages"][0];
    assert_eq!(
        (message["Body"].as_str(), message["Attributes"]["ApproximateReceiveCount"].as_str()),
        (Some("again"), Some("1"))
    );
    let (status, xml) = sqs_query(
        &endpoint,
        "ReceiveMessage",
        &[("QueueUrl", &url), ("WaitTimeSeconds", "0"), ("AttributeName.1", "ApproximateReceiveCount")],
    )
    .await;
    assert_eq!(status, 200, "{xml}");
    assert_eq!(xml_text(&xml, "MessageId"), message["MessageId"].as_str().expect("an id"), "the same message: {xml}");
    assert!(xml.contains("<Name>ApproximateReceiveCount</Name><Value>2</Value>"), "received twice: {xml}");
    let handle = xml_text(&xml, "ReceiptHandle");
    let deleted =
        sqs_json(&endpoint, "DeleteMessage", serde_json::json!({ "QueueUrl": url, "ReceiptHandle": handle })).await;
    assert_eq!(deleted.0, 200, "{}", deleted.1);
    let depth = sqs_json(
        &endpoint,
        "GetQueueAttributes",
        serde_json::json!({ "QueueUrl": url, "AttributeNames": ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"] }),
    )
    .await;
    assert_eq!(depth.1["Attributes"]["ApproximateNumberOfMessages"], "0", "{}", depth.1);
    assert_eq!(depth.1["Attributes"]["ApproximateNumberOfMessagesNotVisible"], "0", "{}", depth.1);

    // A queue whose own VisibilityTimeout is 0 does the same for a receive that says none (it
    // leased the message for a second, so a receive right after found nothing).
    let url = create_queue(&endpoint, "peek-all", serde_json::json!({ "VisibilityTimeout": "0" })).await;
    let sent = sqs_json(&endpoint, "SendMessage", serde_json::json!({ "QueueUrl": url, "MessageBody": "seen" })).await;
    assert_eq!(sent.0, 200, "{}", sent.1);
    let receive = serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 0 });
    let first = sqs_json(&endpoint, "ReceiveMessage", receive.clone()).await;
    let again = sqs_json(&endpoint, "ReceiveMessage", receive).await;
    assert_eq!(first.1["Messages"][0]["Body"], "seen", "{}", first.1);
    assert_eq!(again.1["Messages"][0]["Body"], "seen", "visible again at once: {}", again.1);
}

/// `DeleteMessage` with the receipt handle of a lease that ended deletes the message, as SQS
/// deletes by an old handle, and again is no error; but an old handle never takes a message from
/// under the consumer that holds it now: that call succeeds and the message stays that consumer's.
/// An old handle was refused (`InvalidParameterValue`, "the receipt handle has expired").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_receipt_handle_deletes_its_message_unless_another_consumer_holds_it() {
    let (_zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-old-receipt")).await;
    let url = create_queue(&endpoint, "old", serde_json::json!({})).await;
    let receive = |visibility: i64| {
        let (endpoint, url) = (endpoint.clone(), url.clone());
        async move {
            let got = sqs_json(
                &endpoint,
                "ReceiveMessage",
                serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 5, "VisibilityTimeout": visibility }),
            )
            .await;
            assert_eq!(got.0, 200, "{}", got.1);
            got.1["Messages"][0]["ReceiptHandle"].as_str().map(str::to_owned)
        }
    };
    let delete = |handle: String| {
        let (endpoint, url) = (endpoint.clone(), url.clone());
        async move {
            sqs_json(&endpoint, "DeleteMessage", serde_json::json!({ "QueueUrl": url, "ReceiptHandle": handle })).await
        }
    };
    let depth = || {
        let (endpoint, url) = (endpoint.clone(), url.clone());
        async move {
            let got = sqs_json(
                &endpoint,
                "GetQueueAttributes",
                serde_json::json!({ "QueueUrl": url, "AttributeNames": ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"] }),
            )
            .await;
            let count = |key: &str| got.1["Attributes"][key].as_str().and_then(|v| v.parse::<u32>().ok()).expect(key);
            (count("ApproximateNumberOfMessages"), count("ApproximateNumberOfMessagesNotVisible"))
        }
    };
    let send = |body: &'static str| {
        let (endpoint, url) = (endpoint.clone(), url.clone());
        async move {
            let sent =
                sqs_json(&endpoint, "SendMessage", serde_json::json!({ "QueueUrl": url, "MessageBody": body })).await;
            assert_eq!(sent.0, 200, "{}", sent.1);
        }
    };

    // Received twice, visible at once each time: the first handle deletes it.
    send("one").await;
    let first = receive(0).await.expect("received");
    let second = receive(0).await.expect("received again");
    assert_ne!(first, second);
    let deleted = delete(first.clone()).await;
    assert_eq!(deleted.0, 200, "an old handle deletes: {}", deleted.1);
    assert_eq!(depth().await, (0, 0), "the message is gone");
    assert_eq!(delete(first).await.0, 200, "deleting again succeeds");
    assert_eq!(delete(second).await.0, 200, "and the other old handle too");

    // Held by a consumer now: the old handle succeeds and leaves it to that consumer.
    send("two").await;
    let old = receive(0).await.expect("received");
    let held = receive(60).await.expect("received and held");
    assert_eq!(delete(old).await.0, 200);
    assert_eq!(depth().await, (0, 1), "the holder keeps the message");
    assert_eq!(delete(held).await.0, 200, "its holder deletes it");
    assert_eq!(depth().await, (0, 0));

    // A handle this listener never issued is still invalid.
    let unknown = delete("0".repeat(48)).await;
    assert_eq!(unknown.1["__type"], "com.amazonaws.sqs#ReceiptHandleIsInvalid", "{}", unknown.1);
}

/// `MessageAttributeNames` filters as SQS's do: `All`, `*` and `.*` take every attribute, `prefix.*`
/// every attribute whose name starts with the prefix (`Hel.*` takes `Hello` and `Help.Me`, not
/// `Other`), names take themselves, and names no attribute has (or SQS refuses) take nothing, in
/// both protocols.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attribute_name_filters_take_what_sqss_take() {
    let (_zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-prefix")).await;
    let url = create_queue(&endpoint, "prefixed", serde_json::json!({ "VisibilityTimeout": "0" })).await;
    let attribute = serde_json::json!({ "DataType": "String", "StringValue": "v" });
    let sent = sqs_json(
        &endpoint,
        "SendMessage",
        serde_json::json!({ "QueueUrl": url, "MessageBody": "m",
            "MessageAttributes": { "Hello": attribute, "Help.Me": attribute, "Other": attribute } }),
    )
    .await;
    assert_eq!(sent.0, 200, "{}", sent.1);
    let every = ["Hello", "Help.Me", "Other"];
    let cases: [(&[&str], &[&str]); 10] = [
        (&[], &[]),
        (&["All"], &every),
        (&["*"], &every),
        (&[".*"], &every),
        (&["Foo", "Help"], &[]),
        (&["Hello", "Other"], &["Hello", "Other"]),
        (&["Foo", "Hello"], &["Hello"]),
        (&["Hel.*"], &["Hello", "Help.Me"]),
        (&["AWS."], &[]),
        (&["..foo"], &[]),
    ];
    for (filter, expected) in cases {
        let received = sqs_json(
            &endpoint,
            "ReceiveMessage",
            serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 5, "MessageAttributeNames": filter }),
        )
        .await;
        assert_eq!(received.0, 200, "{filter:?}: {}", received.1);
        assert_eq!(received.1["Messages"][0]["Body"], "m", "{filter:?}: {}", received.1);
        let names: Vec<&String> =
            received.1["Messages"][0]["MessageAttributes"].as_object().map(|a| a.keys().collect()).unwrap_or_default();
        assert_eq!(names, expected, "{filter:?} (JSON): {}", received.1);
        let mut params = vec![("QueueUrl".to_owned(), url.clone()), ("WaitTimeSeconds".to_owned(), "5".to_owned())];
        params.extend(
            filter.iter().enumerate().map(|(i, n)| (format!("MessageAttributeName.{}", i + 1), (*n).to_owned())),
        );
        let params: Vec<(&str, &str)> = params.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let (status, xml) = sqs_query(&endpoint, "ReceiveMessage", &params).await;
        assert_eq!(status, 200, "{xml}");
        assert!(xml.contains("<Body>m</Body>"), "{filter:?}: {xml}");
        for name in every {
            let listed = xml.contains(&format!("<Name>{name}</Name>"));
            assert_eq!(listed, expected.contains(&name), "{filter:?} (query) and {name}: {xml}");
        }
    }
}

/// A standard queue's `DelaySeconds` (the queue's, or a message's own, which wins) holds a message
/// back, counted in `ApproximateNumberOfMessagesDelayed`; a FIFO queue refuses a message's own
/// delay in SQS's words. `MessageRetentionPeriod` (four days unless `CreateQueue` says otherwise,
/// 60 s to 14 days) and the KMS attributes are the queue's, answered on every call. Before, a
/// delay, a retention or a KMS key made `CreateQueue` fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delays_retention_and_kms_keys_are_the_queues_attributes() {
    let (_zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-delay")).await;
    let url = create_queue(&endpoint, "later", serde_json::json!({ "DelaySeconds": "6" })).await;
    let attributes = |names: serde_json::Value| {
        let (endpoint, url) = (endpoint.clone(), url.clone());
        async move {
            let got = sqs_json(
                &endpoint,
                "GetQueueAttributes",
                serde_json::json!({ "QueueUrl": url, "AttributeNames": names }),
            )
            .await;
            assert_eq!(got.0, 200, "{}", got.1);
            got.1["Attributes"].clone()
        }
    };
    let got = attributes(serde_json::json!(["DelaySeconds", "MessageRetentionPeriod"])).await;
    assert_eq!((got["DelaySeconds"].as_str(), got["MessageRetentionPeriod"].as_str()), (Some("6"), Some("345600")));

    let sent_at = Instant::now();
    let sent =
        sqs_json(&endpoint, "SendMessage", serde_json::json!({ "QueueUrl": url, "MessageBody": "queued" })).await;
    assert_eq!(sent.0, 200, "{}", sent.1);
    let (status, xml) =
        sqs_query(&endpoint, "SendMessage", &[("QueueUrl", &url), ("MessageBody", "now"), ("DelaySeconds", "0")]).await;
    assert_eq!(status, 200, "{xml}");
    let receive = serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 5, "MaxNumberOfMessages": 10 });
    let first = sqs_json(&endpoint, "ReceiveMessage", receive.clone()).await;
    let bodies: Vec<&str> =
        first.1["Messages"].as_array().into_iter().flatten().filter_map(|m| m["Body"].as_str()).collect();
    assert_eq!(bodies, ["now"], "the queue's delay held one back: {}", first.1);
    if sent_at.elapsed() < Duration::from_secs(5) {
        let got = attributes(serde_json::json!(["ApproximateNumberOfMessagesDelayed"])).await;
        assert_eq!(got["ApproximateNumberOfMessagesDelayed"], "1", "{got}");
    }
    let receive = serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 20 });
    let due = sqs_json(&endpoint, "ReceiveMessage", receive).await;
    assert_eq!(due.1["Messages"][0]["Body"], "queued", "{}", due.1);
    assert!(sent_at.elapsed() >= Duration::from_secs(6), "delivered after {:?}", sent_at.elapsed());

    let set = sqs_json(
        &endpoint,
        "SetQueueAttributes",
        serde_json::json!({ "QueueUrl": url, "Attributes": {
            "MessageRetentionPeriod": "60", "KmsMasterKeyId": "alias/aws/sqs", "KmsDataKeyReusePeriodSeconds": "600"
        } }),
    )
    .await;
    assert_eq!(set.0, 200, "{}", set.1);
    let got = attributes(serde_json::json!(["All"])).await;
    assert_eq!(
        (
            got["MessageRetentionPeriod"].as_str(),
            got["KmsMasterKeyId"].as_str(),
            got["KmsDataKeyReusePeriodSeconds"].as_str()
        ),
        (Some("60"), Some("alias/aws/sqs"), Some("600")),
        "{got}"
    );
    for (key, value) in
        [("MessageRetentionPeriod", "59"), ("MessageRetentionPeriod", "1209601"), ("DelaySeconds", "901")]
    {
        let (status, xml) = sqs_query(
            &endpoint,
            "SetQueueAttributes",
            &[("QueueUrl", &url), ("Attribute.1.Name", key), ("Attribute.1.Value", value)],
        )
        .await;
        assert_eq!((status, xml_text(&xml, "Code").as_str()), (400, "InvalidAttributeValue"), "{key} {value}: {xml}");
    }

    let fifo = create_queue(&endpoint, "later.fifo", serde_json::json!({ "FifoQueue": "true" })).await;
    let refused = sqs_json(
        &endpoint,
        "SendMessage",
        serde_json::json!({ "QueueUrl": fifo, "MessageBody": "x", "MessageGroupId": "g", "MessageDeduplicationId": "d",
            "DelaySeconds": 5 }),
    )
    .await;
    assert_eq!(refused.0, 400, "{}", refused.1);
    assert_eq!(
        refused.1["message"],
        "Value 5 for parameter DelaySeconds is invalid. Reason: The request include parameter that is not valid for \
         this queue type.",
        "{}",
        refused.1
    );
}

/// A send that repeats a FIFO queue's deduplication id within the window is accepted and not
/// delivered, whatever its body, as SQS does: in a batch and across sends, in both protocols, with
/// the first message's `MessageId`. Before, another body under a used id was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_deduplication_id_drops_the_message_whatever_its_body() {
    let (_zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-dedup-body")).await;
    let url = create_queue(&endpoint, "once.fifo", serde_json::json!({ "FifoQueue": "true" })).await;
    let send = |body: &'static str, group: &'static str| serde_json::json!({ "QueueUrl": url, "MessageBody": body, "MessageGroupId": group, "MessageDeduplicationId": "d" });
    let first = sqs_json(&endpoint, "SendMessage", send("first", "1")).await;
    assert_eq!(first.0, 200, "{}", first.1);
    let again = sqs_json(&endpoint, "SendMessage", send("second", "2")).await;
    assert_eq!((again.0, &again.1["MessageId"]), (200, &first.1["MessageId"]), "{}", again.1);
    let (status, xml) = sqs_query(
        &endpoint,
        "SendMessage",
        &[("QueueUrl", &url), ("MessageBody", "third"), ("MessageGroupId", "3"), ("MessageDeduplicationId", "d")],
    )
    .await;
    assert_eq!((status, xml_text(&xml, "MessageId")), (200, first.1["MessageId"].as_str().unwrap_or("?").to_owned()));
    let batch = sqs_json(
        &endpoint,
        "SendMessageBatch",
        serde_json::json!({ "QueueUrl": url, "Entries": [
            { "Id": "a", "MessageBody": "a", "MessageGroupId": "g", "MessageDeduplicationId": "e" },
            { "Id": "b", "MessageBody": "b", "MessageGroupId": "g", "MessageDeduplicationId": "e" },
        ] }),
    )
    .await;
    assert_eq!(batch.0, 200, "{}", batch.1);
    let ids: Vec<&serde_json::Value> =
        batch.1["Successful"].as_array().into_iter().flatten().map(|entry| &entry["MessageId"]).collect();
    assert_eq!(ids.len(), 2, "both accepted: {}", batch.1);
    assert_eq!(ids[0], ids[1], "one message: {}", batch.1);
    let receive = serde_json::json!({ "QueueUrl": url, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 1 });
    let mut bodies = Vec::new();
    for _ in 0..3 {
        let got = sqs_json(&endpoint, "ReceiveMessage", receive.clone()).await;
        for message in got.1["Messages"].as_array().into_iter().flatten() {
            bodies.push(message["Body"].as_str().unwrap_or_default().to_owned());
            let handle = &message["ReceiptHandle"];
            let deleted =
                sqs_json(&endpoint, "DeleteMessage", serde_json::json!({ "QueueUrl": url, "ReceiptHandle": handle }))
                    .await;
            assert_eq!(deleted.0, 200, "{}", deleted.1);
        }
    }
    bodies.sort();
    assert_eq!(bodies, ["a", "first"], "each id stored once");
}

/// High-throughput FIFO: under `DeduplicationScope` = `messageGroup` a deduplication id is its
/// message group's, so one id in two groups is two messages, and `FifoThroughputLimit` =
/// `perMessageGroupId` is kept and answered; SQS's rules on the two are kept. Before, both were
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_throughput_fifo_queue_deduplicates_within_each_message_group() {
    let (_zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-dedup-scope")).await;
    let attributes = serde_json::json!({
        "FifoQueue": "true", "DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId"
    });
    let url = create_queue(&endpoint, "fast.fifo", attributes).await;
    let got =
        sqs_json(&endpoint, "GetQueueAttributes", serde_json::json!({ "QueueUrl": url, "AttributeNames": ["All"] }))
            .await;
    assert_eq!(
        (got.1["Attributes"]["DeduplicationScope"].as_str(), got.1["Attributes"]["FifoThroughputLimit"].as_str()),
        (Some("messageGroup"), Some("perMessageGroupId")),
        "{}",
        got.1
    );
    let send = |body: &'static str, group: &'static str| serde_json::json!({ "QueueUrl": url, "MessageBody": body, "MessageGroupId": group, "MessageDeduplicationId": "d" });
    let one = sqs_json(&endpoint, "SendMessage", send("one", "1")).await;
    let two = sqs_json(&endpoint, "SendMessage", send("two", "2")).await;
    let again = sqs_json(&endpoint, "SendMessage", send("again", "1")).await;
    assert_ne!(one.1["MessageId"], two.1["MessageId"], "two groups, two messages: {} {}", one.1, two.1);
    assert_eq!(again.1["MessageId"], one.1["MessageId"], "the same group: a duplicate: {}", again.1);
    let receive = serde_json::json!({ "QueueUrl": url, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 1,
        "MessageSystemAttributeNames": ["MessageDeduplicationId"] });
    let got = sqs_json(&endpoint, "ReceiveMessage", receive).await;
    let mut bodies: Vec<(&str, &str)> = got.1["Messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| Some((m["Body"].as_str()?, m["Attributes"]["MessageDeduplicationId"].as_str()?)))
        .collect();
    bodies.sort();
    assert_eq!(bodies, [("one", "d"), ("two", "d")], "{}", got.1);

    let refused = sqs_json(
        &endpoint,
        "CreateQueue",
        serde_json::json!({ "QueueName": "half.fifo", "Attributes": {
            "FifoQueue": "true", "FifoThroughputLimit": "perMessageGroupId" } }),
    )
    .await;
    assert_eq!(
        (refused.0, refused.1["__type"].as_str().unwrap_or_default().ends_with("InvalidAttributeValue")),
        (400, true),
        "{}",
        refused.1
    );
    let standard = sqs_json(
        &endpoint,
        "CreateQueue",
        serde_json::json!({ "QueueName": "plain", "Attributes": { "DeduplicationScope": "messageGroup" } }),
    )
    .await;
    assert_eq!(standard.0, 400, "a standard queue has no deduplication scope: {}", standard.1);
}

/// `PurgeQueue` deletes the messages in flight too, as SQS does: a FIFO group a received message
/// held is free for the next message at once, and the purged message's receipt deletes nothing.
/// Before, a held message stayed and kept its group blocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_queue_deletes_messages_in_flight_too() {
    let (_zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-purge-held")).await;
    let url = create_queue(&endpoint, "purged.fifo", serde_json::json!({ "FifoQueue": "true" })).await;
    let send = |body: &'static str| serde_json::json!({ "QueueUrl": url, "MessageBody": body, "MessageGroupId": "g", "MessageDeduplicationId": body });
    assert_eq!(sqs_json(&endpoint, "SendMessage", send("first")).await.0, 200);
    let receive = serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 5 });
    let held = sqs_json(&endpoint, "ReceiveMessage", receive.clone()).await;
    assert_eq!(held.1["Messages"][0]["Body"], "first", "{}", held.1);
    let (status, xml) = sqs_query(&endpoint, "PurgeQueue", &[("QueueUrl", &url)]).await;
    assert_eq!(status, 200, "{xml}");
    let depth = sqs_json(
        &endpoint,
        "GetQueueAttributes",
        serde_json::json!({ "QueueUrl": url, "AttributeNames": ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"] }),
    )
    .await;
    assert_eq!(depth.1["Attributes"]["ApproximateNumberOfMessagesNotVisible"], "0", "{}", depth.1);
    assert_eq!(sqs_json(&endpoint, "SendMessage", send("second")).await.0, 200);
    let next = sqs_json(&endpoint, "ReceiveMessage", receive).await;
    assert_eq!(next.1["Messages"][0]["Body"], "second", "the group is free: {}", next.1);
    let handle = &held.1["Messages"][0]["ReceiptHandle"];
    let deleted =
        sqs_json(&endpoint, "DeleteMessage", serde_json::json!({ "QueueUrl": url, "ReceiptHandle": handle })).await;
    assert_eq!(deleted.0, 200, "as SQS, a purged message's receipt is no error: {}", deleted.1);
    let depth = sqs_json(
        &endpoint,
        "GetQueueAttributes",
        serde_json::json!({ "QueueUrl": url, "AttributeNames": ["ApproximateNumberOfMessagesNotVisible"] }),
    )
    .await;
    assert_eq!(
        depth.1["Attributes"]["ApproximateNumberOfMessagesNotVisible"], "1",
        "the second stays held: {}",
        depth.1
    );
}

/// `ChangeMessageVisibility` with an old receipt handle of a message received again since changes
/// the visibility of the message in flight, as SQS allows; once nobody holds it, the old handle
/// answers `MessageNotInflight`. Before, the old handle always answered `MessageNotInflight`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_receipt_changes_the_visibility_of_its_message_in_flight_again() {
    let (_zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-old-visibility")).await;
    let url = create_queue(&endpoint, "again", serde_json::json!({ "VisibilityTimeout": "1" })).await;
    assert_eq!(
        sqs_json(&endpoint, "SendMessage", serde_json::json!({ "QueueUrl": url, "MessageBody": "m" })).await.0,
        200
    );
    let receive = serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 20 });
    let first = sqs_json(&endpoint, "ReceiveMessage", receive.clone()).await;
    let old = first.1["Messages"][0]["ReceiptHandle"].clone();
    let second = sqs_json(&endpoint, "ReceiveMessage", receive).await;
    assert_eq!(second.1["Messages"][0]["Body"], "m", "visible again after a second: {}", second.1);
    let (status, xml) = sqs_query(
        &endpoint,
        "ChangeMessageVisibility",
        &[("QueueUrl", &url), ("ReceiptHandle", old.as_str().unwrap_or_default()), ("VisibilityTimeout", "100")],
    )
    .await;
    assert_eq!(status, 200, "{xml}");
    let none =
        sqs_json(&endpoint, "ReceiveMessage", serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 3 })).await;
    assert!(none.1.get("Messages").is_none_or(|m| m.as_array().is_some_and(Vec::is_empty)), "held 100 s: {}", none.1);
    let handle = &second.1["Messages"][0]["ReceiptHandle"];
    let deleted =
        sqs_json(&endpoint, "DeleteMessage", serde_json::json!({ "QueueUrl": url, "ReceiptHandle": handle })).await;
    assert_eq!(deleted.0, 200, "{}", deleted.1);
    let after = sqs_json(
        &endpoint,
        "ChangeMessageVisibility",
        serde_json::json!({ "QueueUrl": url, "ReceiptHandle": old, "VisibilityTimeout": 10 }),
    )
    .await;
    assert_eq!(after.0, 400, "{}", after.1);
    assert!(after.1["__type"].as_str().unwrap_or_default().contains("MessageNotInflight"), "{}", after.1);
}

/// One FIFO receive hands several messages of one group, in the group's order, as SQS does; the
/// group stays held until each of them is done, so no other receive gets any message of it
/// meanwhile. zkq's own `?max=` still holds one message per group. Before, a receive held at most
/// one message per group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_receive_hands_several_messages_of_a_group_in_order() {
    let (zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-group-batch")).await;
    let url = create_queue(&endpoint, "orders.fifo", serde_json::json!({ "FifoQueue": "true" })).await;
    let entries: Vec<serde_json::Value> = [("a1", "a"), ("b1", "b"), ("a2", "a"), ("a3", "a")]
        .iter()
        .map(|(body, group)| {
            serde_json::json!({ "Id": body, "MessageBody": body, "MessageGroupId": group, "MessageDeduplicationId": body })
        })
        .collect();
    let sent =
        sqs_json(&endpoint, "SendMessageBatch", serde_json::json!({ "QueueUrl": url, "Entries": entries })).await;
    assert_eq!(sent.0, 200, "{}", sent.1);
    let bodies = |answer: &serde_json::Value| -> Vec<String> {
        answer["Messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["Body"].as_str().map(str::to_owned))
            .collect()
    };
    let receive = serde_json::json!({ "QueueUrl": url, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 2 });
    let first = sqs_json(&endpoint, "ReceiveMessage", receive.clone()).await;
    let got = bodies(&first.1);
    let group_a: Vec<&String> = got.iter().filter(|b| b.starts_with('a')).collect();
    assert_eq!(group_a, ["a1", "a2", "a3"], "group a in order, in one receive: {}", first.1);
    assert!(got.contains(&"b1".to_owned()), "{}", first.1);
    let none =
        sqs_json(&endpoint, "ReceiveMessage", serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 0 })).await;
    assert!(bodies(&none.1).is_empty(), "every group is held: {}", none.1);
    // a1 done, a2 and a3 given back: the group goes on from a2.
    let handle = |body: &str| {
        first.1["Messages"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["Body"] == body)
            .map(|m| m["ReceiptHandle"].clone())
    };
    let done =
        sqs_json(&endpoint, "DeleteMessage", serde_json::json!({ "QueueUrl": url, "ReceiptHandle": handle("a1") }))
            .await;
    assert_eq!(done.0, 200, "{}", done.1);
    for body in ["a3", "a2"] {
        let back = sqs_json(
            &endpoint,
            "ChangeMessageVisibility",
            serde_json::json!({ "QueueUrl": url, "ReceiptHandle": handle(body), "VisibilityTimeout": 0 }),
        )
        .await;
        assert_eq!(back.0, 200, "{}", back.1);
    }
    let again = sqs_json(&endpoint, "ReceiveMessage", receive).await;
    assert_eq!(bodies(&again.1), ["a2", "a3"], "{}", again.1);

    // zkq's own ?max= lease still holds one message per group.
    let api = zkq.client();
    for (body, group) in [("x1", "x"), ("x2", "x")] {
        assert_eq!(api.put("orders.fifo", &format!("group={group}"), body.as_bytes()).await.status, 201);
    }
    let native = api.lease("orders.fifo", "wait=1s&max=10").await;
    let held: Vec<serde_json::Value> = native.json()["messages"].as_array().cloned().unwrap_or_default();
    assert_eq!(held.len(), 1, "one of group x: {}", native.text());
}

/// A queue's `MessageRetentionPeriod` deletes a message once its node is older, on a dynamic
/// queue too (its settings node says it): the message is no longer counted nor received, and
/// `zkq_messages_past_retention_total` counts it. Before, the attribute was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_older_than_the_queues_retention_period_is_deleted() {
    let (zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-retention")).await;
    let url = create_queue(&endpoint, "brief", serde_json::json!({ "MessageRetentionPeriod": "60" })).await;
    let sent = sqs_json(&endpoint, "SendMessage", serde_json::json!({ "QueueUrl": url, "MessageBody": "old" })).await;
    assert_eq!(sent.0, 200, "{}", sent.1);
    let sent_at = Instant::now();
    let depth = || {
        let (endpoint, url) = (endpoint.clone(), url.clone());
        async move {
            let got = sqs_json(
                &endpoint,
                "GetQueueAttributes",
                serde_json::json!({ "QueueUrl": url, "AttributeNames": ["ApproximateNumberOfMessages"] }),
            )
            .await;
            got.1["Attributes"]["ApproximateNumberOfMessages"].as_str().unwrap_or("?").to_owned()
        }
    };
    assert_eq!(depth().await, "1");
    // Deleted within a quarter of the period after it passed (the sweep's pace).
    while depth().await != "0" {
        assert!(sent_at.elapsed() < Duration::from_secs(120), "still there after {:?}", sent_at.elapsed());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(sent_at.elapsed() >= Duration::from_secs(59), "deleted after {:?}", sent_at.elapsed());
    let none =
        sqs_json(&endpoint, "ReceiveMessage", serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 0 })).await;
    assert!(none.1.get("Messages").is_none_or(|m| m.as_array().is_some_and(Vec::is_empty)), "{}", none.1);
    let metrics = zkq.metrics().await;
    assert!(metrics.contains("zkq_messages_past_retention_total{queue=\"brief\"} 1"), "{metrics}");
}

/// With servers that read requests of 4 MiB (`-Djute.maxbuffer`) and `zookeeper.jute_maxbuffer`
/// set to match, SQS's own limits hold: a queue's `MaximumMessageSize` is 1,048,576, a message of
/// that size is stored and received whole, one byte more is refused in SQS's words, and a batch is
/// refused whole once its entries pass 1,048,576 bytes together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_servers_that_read_larger_requests_sqs_takes_messages_of_a_mebibyte() {
    const MIB: usize = 1024 * 1024;
    let zk = ZkServer::start_with(ServerOptions {
        jvm_args: vec!["-Djute.maxbuffer=4194304".to_owned()],
        ..ServerOptions::default()
    });
    let mut config = test_config(&zk, &unique_root("sqs-mebibyte"));
    config.sqs.listen = Some("127.0.0.1:0".parse().expect("addr"));
    config.zookeeper.jute_maxbuffer = 4 * MIB;
    config.api.max_message_bytes = MIB;
    config.api.max_batch_bytes = MIB;
    let zkq = TestZkq::start_ready(config).await;
    let addr = zkq.running.as_ref().and_then(|r| r.sqs_addr).expect("the SQS listener is bound");
    let endpoint = format!("http://{addr}");
    let (status, created) = sqs_json(&endpoint, "CreateQueue", serde_json::json!({ "QueueName": "big" })).await;
    assert_eq!(status, 200, "{created}");
    let url = created["QueueUrl"].as_str().expect("a queue URL").to_owned();
    let (_, attributes) = sqs_json(
        &endpoint,
        "GetQueueAttributes",
        serde_json::json!({ "QueueUrl": url, "AttributeNames": ["MaximumMessageSize"] }),
    )
    .await;
    assert_eq!(attributes["Attributes"]["MaximumMessageSize"], "1048576", "{attributes}");

    let body = "m".repeat(MIB);
    let (status, sent) =
        sqs_json(&endpoint, "SendMessage", serde_json::json!({ "QueueUrl": url, "MessageBody": body })).await;
    assert_eq!(status, 200, "{sent}");
    assert_eq!(sent["MD5OfMessageBody"], format!("{:x}", md5::compute(&body)), "{sent}");
    let (status, received) = sqs_json(
        &endpoint,
        "ReceiveMessage",
        serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 5, "MaxNumberOfMessages": 10 }),
    )
    .await;
    assert_eq!(status, 200);
    let messages = received["Messages"].as_array().expect("one message received");
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0]["Body"].as_str().map(str::len), Some(MIB), "the body whole");
    assert_eq!(messages[0]["MD5OfBody"], sent["MD5OfMessageBody"]);

    let over = "m".repeat(MIB + 1);
    let (status, refused) =
        sqs_json(&endpoint, "SendMessage", serde_json::json!({ "QueueUrl": url, "MessageBody": over })).await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(
        refused["message"], "One or more parameters are invalid. Reason: Message must be shorter than 1048576 bytes.",
        "{refused}"
    );

    let half = "h".repeat(MIB / 2);
    let entries =
        |first: &str| serde_json::json!([{ "Id": "a", "MessageBody": first }, { "Id": "b", "MessageBody": half }]);
    let half_and_one = format!("{half}+");
    let (status, refused) = sqs_json(
        &endpoint,
        "SendMessageBatch",
        serde_json::json!({ "QueueUrl": url, "Entries": entries(&half_and_one) }),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["__type"], "com.amazonaws.sqs#BatchRequestTooLong", "{refused}");
    assert_eq!(
        refused["message"], "Batch requests cannot be longer than 1048576 bytes. You have sent 1048577 bytes.",
        "{refused}"
    );
    let (status, stored) =
        sqs_json(&endpoint, "SendMessageBatch", serde_json::json!({ "QueueUrl": url, "Entries": entries(&half) }))
            .await;
    assert_eq!(status, 200, "{stored}");
    assert_eq!(stored["Successful"].as_array().map(Vec::len), Some(2), "{stored}");
}

/// A GET of `url` with `params` in its query string (and `accept`, when given), as SQS's query
/// protocol allows a queue's URL to be addressed: its status, content type and body.
async fn sqs_get(url: &str, params: &[(&str, &str)], accept: Option<&str>) -> (u16, String, String) {
    let query: Vec<String> =
        params.iter().map(|(name, value)| format!("{}={}", url_encode(name), url_encode(value))).collect();
    let target = if query.is_empty() { url.to_owned() } else { format!("{url}?{}", query.join("&")) };
    let mut request = reqwest::Client::new().get(target);
    if let Some(accept) = accept {
        request = request.header("accept", accept);
    }
    let answer = request.send().await.expect("an SQS call");
    let status = answer.status().as_u16();
    let content_type =
        answer.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    (status, content_type, answer.text().await.expect("a body"))
}

/// A queue's URL is an endpoint of the query protocol, as in SQS: a request sent there acts on
/// that queue without a `QueueUrl` parameter (one given wins), actions that name no queue are not
/// valid there, a request without an `Action` answers 404 `UnknownOperationException`, and a
/// client that accepts JSON gets the XML answer's tree in JSON. A JSON-protocol client that uses
/// the queue's URL as its endpoint is served as at the root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_url_is_an_endpoint_of_the_query_protocol() {
    let (_zkq, endpoint) = zkq_with_sqs(&unique_root("sqs-addressed")).await;
    let url = create_queue(&endpoint, "addressed", serde_json::json!({})).await;
    let other = create_queue(&endpoint, "elsewhere", serde_json::json!({})).await;

    let (status, _, sent) = sqs_get(&url, &[("Action", "SendMessage"), ("MessageBody", "foobar")], None).await;
    assert_eq!(status, 200, "{sent}");
    assert!(sent.contains("<SendMessageResponse"), "{sent}");
    let (status, _, empty) = sqs_get(&other, &[("Action", "ReceiveMessage")], None).await;
    assert_eq!(status, 200, "{empty}");
    assert!(empty.contains("<ReceiveMessageResult/>") && !empty.contains("foobar"), "{empty}");
    let receive = [("Action", "ReceiveMessage"), ("VisibilityTimeout", "0"), ("WaitTimeSeconds", "5")];
    let (status, _, received) = sqs_get(&url, &receive, None).await;
    assert_eq!(status, 200, "{received}");
    assert_eq!(xml_text(&received, "Body"), "foobar", "{received}");

    // A QueueUrl parameter names the queue, wherever the request was sent.
    let arn = [("Action", "GetQueueAttributes"), ("AttributeName.1", "QueueArn")];
    let (_, _, own) = sqs_get(&url, &arn, None).await;
    assert!(xml_text(&own, "Value").ends_with(":addressed"), "{own}");
    let (_, _, named) = sqs_get(&url, &[arn[0], arn[1], ("QueueUrl", other.as_str())], None).await;
    assert!(xml_text(&named, "Value").ends_with(":elsewhere"), "{named}");
    let (status, _, found) = sqs_get(&url, &[("Action", "GetQueueUrl"), ("QueueName", "elsewhere")], None).await;
    assert_eq!((status, xml_text(&found, "QueueUrl")), (200, other.clone()), "{found}");

    // What SQS refuses at a queue's URL, in its words.
    for action in ["CreateQueue", "ListQueues", "FooBar"] {
        let (status, _, refused) = sqs_get(&url, &[("Action", action), ("QueueName", "made-here")], None).await;
        assert_eq!(status, 400, "{action}: {refused}");
        assert_eq!(xml_text(&refused, "Code"), "InvalidAction", "{refused}");
        assert_eq!(xml_text(&refused, "Type"), "Sender", "{refused}");
        assert_eq!(xml_text(&refused, "Message"), format!("The action {action} is not valid for this endpoint."));
    }
    let (status, _, missing) = sqs_get(&url, &[("Action", "SendMessage")], None).await;
    assert_eq!((status, xml_text(&missing, "Code")), (400, "MissingParameter".to_owned()), "{missing}");
    assert_eq!(xml_text(&missing, "Message"), "The request must contain the parameter MessageBody.");
    for accept in [None, Some("application/json")] {
        let (status, _, unnamed) = sqs_get(&url, &[], accept).await;
        assert_eq!(status, 404, "{accept:?}: {unnamed}");
        assert!(unnamed.contains("<UnknownOperationException"), "{accept:?}: {unnamed}");
    }

    // Accept: application/json: the same answers, as JSON.
    let json = Some("application/json");
    let (status, content_type, attributes) =
        sqs_get(&url, &[("Action", "GetQueueAttributes"), ("AttributeName.1", "All")], json).await;
    assert_eq!((status, content_type.as_str()), (200, "application/json"), "{attributes}");
    let doc: serde_json::Value = serde_json::from_str(&attributes).expect("a JSON answer");
    let listed = doc["GetQueueAttributesResponse"]["GetQueueAttributesResult"]["Attributes"].as_array();
    let found = listed.and_then(|all| all.iter().find(|a| a["Name"] == "QueueArn")).map(|a| a["Value"].clone());
    assert!(found.as_ref().and_then(|v| v.as_str()).is_some_and(|v| v.ends_with(":addressed")), "{doc}");
    assert!(doc["GetQueueAttributesResponse"]["ResponseMetadata"]["RequestId"].is_string(), "{doc}");
    let (status, _, received) = sqs_get(&url, &receive, json).await;
    let doc: serde_json::Value = serde_json::from_str(&received).expect("a JSON answer");
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["ReceiveMessageResponse"]["ReceiveMessageResult"]["Messages"][0]["Body"], "foobar", "{doc}");
    let (status, _, refused) = sqs_get(&url, &[("Action", "ListQueues")], json).await;
    let doc: serde_json::Value = serde_json::from_str(&refused).expect("a JSON error");
    assert_eq!(status, 400, "{doc}");
    assert_eq!(doc["Error"]["Code"], "InvalidAction", "{doc}");
    assert_eq!(doc["Error"]["Message"], "The action ListQueues is not valid for this endpoint.", "{doc}");

    // The JSON protocol sent to the queue's URL (as some SDKs do) is served as at the root.
    let (status, doc) =
        sqs_json(&url, "ReceiveMessage", serde_json::json!({ "QueueUrl": url, "WaitTimeSeconds": 5 })).await;
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["Messages"][0]["Body"], "foobar", "{doc}");

    // DeleteQueue at the queue's URL deletes it; later requests there find no queue.
    let (status, _, deleted) = sqs_get(&url, &[("Action", "DeleteQueue")], None).await;
    assert_eq!(status, 200, "{deleted}");
    assert!(deleted.contains("<DeleteQueueResponse"), "{deleted}");
    let (status, _, gone) = sqs_get(&url, &arn, None).await;
    assert_eq!(
        (status, xml_text(&gone, "Code")),
        (400, "AWS.SimpleQueueService.NonExistentQueue".to_owned()),
        "{gone}"
    );
}
