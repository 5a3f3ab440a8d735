//! Wire compatibility with the real Curator 5.4.0 recipes, both ways, per kind.

use std::time::Duration;

use zkq::config::QueueKind;

use zkq_testkit::*;

/// A zkq with one declared queue per kind at `{root}/c/{kind}`; fifo/priority/delay/id share
/// the lock path `{root}/c/locks-{kind}` only where `locked` says so.
async fn zkq_with_curator_paths(zk: &ZkServer, root: &str, locked: bool) -> TestZkq {
    let mut config = test_config(zk, root);
    for (name, kind) in [
        ("fifo", QueueKind::Fifo),
        ("priority", QueueKind::Priority),
        ("delay", QueueKind::Delay),
        ("id", QueueKind::Id),
        ("simple", QueueKind::Simple),
    ] {
        let path = format!("{root}/c/{name}");
        let lock = format!("{root}/c/locks-{name}");
        let lock = (locked && kind != QueueKind::Simple).then_some(lock.as_str());
        declare(&mut config, name, kind, Some(&path), lock);
    }
    TestZkq::start_ready(config).await
}

async fn drain(zkq: &TestZkq, queue: &str) -> Vec<String> {
    let mut got = Vec::new();
    while let Some(body) = zkq.take_body(queue, "1s").await {
        got.push(hex(&body));
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_put_by_curator_are_taken_by_zkq_in_curators_order() {
    let zk = ZkServer::shared();
    let root = unique_root("from-curator");
    let c = |kind: &str| format!("{root}/c/{kind}");
    let binary = hex(&(0..=255u8).collect::<Vec<_>>());

    Curator::run(zk, &["put", "fifo", &c("fifo"), "6869", "-", &binary]).await;
    Curator::run(zk, &["putmulti", "fifo", &c("fifo"), "61", "6263", "-"]).await;
    Curator::run(zk, &["put", "fifo", &c("fifo"), "7a"]).await;
    Curator::run(zk, &["put", "priority", &c("priority"), "5", "05"]).await;
    Curator::run(zk, &["put", "priority", &c("priority"), "-1", "ff"]).await;
    Curator::run(zk, &["putmulti", "priority", &c("priority"), "-3", "d1", "d2"]).await;
    Curator::run(zk, &["put", "priority", &c("priority"), "10", "0a"]).await;
    Curator::run(zk, &["put", "delay", &c("delay"), "4102444800000", "f0"]).await; // year 2100
    Curator::run(zk, &["put", "delay", &c("delay"), "1700000000000", "e0"]).await;
    Curator::run(zk, &["put", "id", &c("id"), "a/b|c", "01"]).await;
    Curator::run(zk, &["put", "id", &c("id"), "z", "02"]).await;
    Curator::run(zk, &["offer", "simple", &c("simple"), "73", "-", "7374"]).await;

    let zkq = zkq_with_curator_paths(zk, &root, false).await;
    assert_eq!(drain(&zkq, "fifo").await, ["6869", "-", binary.as_str(), "61", "6263", "-", "7a"]);
    assert_eq!(drain(&zkq, "priority").await, ["d1", "d2", "ff", "05", "0a"]);
    assert_eq!(drain(&zkq, "delay").await, ["e0"], "the year-2100 item is not due");
    let response = zkq.take("id", "1s").await;
    assert_eq!(response.headers()["zkq-id"], "a_b_c");
    assert_eq!(hex(&response.bytes().await.expect("body")), "01");
    assert_eq!(drain(&zkq, "id").await, ["02"]);
    assert_eq!(drain(&zkq, "simple").await, ["73", "-", "7374"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_put_by_zkq_are_consumed_by_curator_with_identical_bytes() {
    for locked in [false, true] {
        let zk = ZkServer::shared();
        let root = unique_root("to-curator");
        let zkq = zkq_with_curator_paths(zk, &root, locked).await;
        let bodies: Vec<Vec<u8>> = vec![b"one".to_vec(), Vec::new(), (0..=255u8).collect(), vec![0xA5; 4096]];
        for body in &bodies {
            zkq.put_ok("fifo", body).await;
            zkq.put_ok("simple", body).await;
        }
        for (priority, body) in [(7, "07"), (-2, "fe"), (3, "03")] {
            let url = zkq.url(&format!("/v1/queues/priority/messages?priority={priority}"));
            assert_eq!(zkq.http.post(url).body(unhex(body)).send().await.expect("put").status(), 201);
        }
        for (id, body) in [("x", "11"), ("y", "22")] {
            let url = zkq.url(&format!("/v1/queues/id/messages?id={id}"));
            assert_eq!(zkq.http.post(url).body(unhex(body)).send().await.expect("put").status(), 201);
        }
        let url = zkq.url("/v1/queues/delay/messages?delay=1s");
        assert_eq!(zkq.http.post(url).body(unhex("dd")).send().await.expect("put").status(), 201);

        let expected: Vec<String> = bodies.iter().map(|b| hex(b)).collect();
        let lock_args =
            |kind: &str| if locked { vec!["--lock".to_owned(), format!("{root}/c/locks-{kind}")] } else { vec![] };
        let consume = |kind: &'static str, count: usize| {
            let path = format!("{root}/c/{kind}");
            let mut args: Vec<String> = vec!["consume".into(), kind.into(), path, count.to_string(), "15000".into()];
            args.extend(lock_args(kind));
            async move {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                Curator::run(zk, &args).await
            }
        };
        let mut done = expected.clone();
        done.push(format!("DONE {}", expected.len()));
        assert_eq!(consume("fifo", expected.len()).await, done, "fifo, locked={locked}");
        assert_eq!(consume("priority", 3).await, ["fe", "03", "07", "DONE 3"], "locked={locked}");
        assert_eq!(consume("id", 2).await, ["11", "22", "DONE 2"], "locked={locked}");
        assert_eq!(consume("delay", 1).await, ["dd", "DONE 1"], "locked={locked}");
        let simple = Curator::run(zk, &["consume", "simple", &format!("{root}/c/simple"), "4", "15000"]).await;
        assert_eq!(simple, done, "simple");
        if locked {
            let direct = zk_client(zk).await;
            assert!(children(&direct, &format!("{root}/c/locks-fifo")).await.is_empty(), "no lock left behind");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zkq_take_never_removes_a_message_curator_holds_a_lock_on() {
    let zk = ZkServer::shared();
    let root = unique_root("respect-locks");
    let zkq = zkq_with_curator_paths(zk, &root, true).await;
    zkq.put_ok("fifo", b"held").await;
    zkq.put_ok("fifo", b"free").await;
    let path = format!("{root}/c/fifo");
    let lock = format!("{root}/c/locks-fifo");
    // Curator takes the head and holds its lock for 3 s while "processing" it.
    let consumer = Curator::spawn(zk, &["consume", "fifo", &path, "1", "20000", "--lock", &lock, "--hold-ms", "3000"]);
    let first = tokio::task::spawn_blocking(move || (consumer.next_line(Duration::from_secs(20)), consumer))
        .await
        .expect("join");
    let (line, consumer) = first;
    assert_eq!(line.as_deref(), Some(hex(b"held").as_str()), "Curator got the head");
    // zkq skips the locked head and hands out the next message; nothing else is there.
    assert_eq!(zkq.take_body("fifo", "0").await.as_deref(), Some(b"free".as_slice()));
    assert_eq!(zkq.take_body("fifo", "0").await, None);
    assert_eq!(consumer.finish().await, ["DONE 1"]);
    let direct = zk_client(zk).await;
    assert!(children(&direct, &path).await.is_empty(), "Curator consumed the held one, once");
}

/// An independent client (kazoo, from Debian) sees exactly Curator's layout: the envelope in the
/// queue node, and during a lease an EPHEMERAL lock owned by zkq's session; after the ack, nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_sees_curators_layout_and_zkqs_lock() {
    let zk = ZkServer::shared();
    let root = unique_root("kazoo");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let id = zkq.put_ok("q", b"hi").await;
    let script = r#"
import sys
from kazoo.client import KazooClient
hosts, root, mode = sys.argv[1], sys.argv[2], sys.argv[3]
zk = KazooClient(hosts=hosts)
zk.start()
for name in sorted(zk.get_children(root + "/queues/q")):
    data, _ = zk.get(root + "/queues/q/" + name)
    print("item", name, data.hex())
for name in sorted(zk.get_children(root + "/locks/q")):
    _, stat = zk.get(root + "/locks/q/" + name)
    print("lock", name, hex(stat.ephemeralOwner))
zk.stop()
"#;
    let run = |mode: &'static str| {
        let (hosts, root, script) = (zk.connect_string(), root.clone(), script.to_owned());
        tokio::task::spawn_blocking(move || {
            let output = std::process::Command::new("/usr/bin/python3")
                .args(["-c", &script, &hosts, &root, mode])
                .output()
                .expect("Debian's python3 with python3-kazoo");
            assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
            String::from_utf8_lossy(&output.stdout).lines().map(str::to_owned).collect::<Vec<_>>()
        })
    };
    assert_eq!(run("put").await.expect("join"), [format!("item {id} 000100010100000002686902")]);

    let leased = zkq.http.post(zkq.url("/v1/queues/q/leases")).send().await.expect("lease");
    let receipt = leased.headers()["zkq-lease"].to_str().expect("ascii").to_owned();
    let session = zkq.running.as_ref().expect("running").session.status().session_id;
    assert_eq!(
        run("lease").await.expect("join"),
        [format!("item {id} 000100010100000002686902"), format!("lock {id} {session:#x}")]
    );
    let acked = zkq.http.delete(zkq.url(&format!("/v1/queues/q/leases/{receipt}"))).send().await.expect("ack");
    assert_eq!(acked.status(), 204);
    assert!(run("acked").await.expect("join").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_multi_node_is_split_on_first_touch_into_nodes_curator_consumes_in_order() {
    let zk = ZkServer::shared();
    let root = unique_root("split");
    let (path, lock) = (format!("{root}/app/q"), format!("{root}/app/locks"));
    let mut config = test_config(zk, &root);
    declare(&mut config, "q", QueueKind::Fifo, Some(&path), Some(&lock));
    let items: Vec<String> = (0..40).map(|i| format!("{i:02x}")).collect();
    let mut args = vec!["putmulti".to_owned(), "fifo".to_owned(), path.clone()];
    args.extend(items.iter().cloned());
    Curator::run(zk, &args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    Curator::run(zk, &["put", "fifo", &path, "ff"]).await; // a later message: it stays last
    let direct = zk_client(zk).await;
    let before = children(&direct, &path).await;
    assert_eq!(before.len(), 2);

    let zkq = TestZkq::start_ready(config).await;
    assert_eq!(zkq.take_body("q", "5s").await.map(|b| hex(&b)), Some("00".to_owned()));
    // One transaction replaced the 40-item node by 39 single-item nodes right behind it.
    let mut after = children(&direct, &path).await;
    after.sort();
    assert_eq!(after.len(), 40, "{after:?}");
    assert_eq!(after[0], format!("{}-0001", before.iter().min().expect("node")));
    for name in &after[..39] {
        let (data, stat) = direct.get_data(&format!("{path}/{name}")).await.expect("split node");
        assert_eq!(zkq::envelope::decode(&data).expect("Curator's envelope").len(), 1, "{name}");
        assert_eq!(stat.version, 0, "written once");
    }
    // Curator (lock-safe) takes the rest in the original order, then the later message.
    let consumed = Curator::run(zk, &["consume", "fifo", &path, "40", "15000", "--lock", &lock]).await;
    let mut expected: Vec<String> = items[1..].iter().map(|i| i.to_uppercase()).collect();
    expected.push("FF".to_owned());
    expected.push("DONE 40".to_owned());
    let consumed: Vec<String> = consumed.iter().map(|l| l.to_uppercase()).collect();
    assert_eq!(consumed, expected);
}

/// `POST …/batch?format=curator-multi` writes ONE node in the envelope of Curator's `putMulti`
/// (fifo, priority and delay queues), which Curator's lock-safe consumer receives whole, in
/// order; zkq's own take of such a node hands out every message once, in order. Kind fields that
/// differ, and the kinds Curator has no putMulti for, are refused and store nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_multi_batch_is_one_node_that_curator_consumes_in_order() {
    use base64::Engine;
    let zk = ZkServer::shared();
    let root = unique_root("curator-multi");
    let zkq = zkq_with_curator_paths(zk, &root, true).await;
    let direct = zk_client(zk).await;
    let b64 = base64::engine::general_purpose::STANDARD;
    let batch = |queue: &str, messages: serde_json::Value| {
        let url = zkq.url(&format!("/v1/queues/{queue}/batch?format=curator-multi"));
        let request = zkq.http.post(url).json(&serde_json::json!({ "messages": messages }));
        async move { request.send().await.expect("batch put") }
    };
    let one_id = |put: serde_json::Value| -> String {
        let ids = put["message_ids"].as_array().expect("message_ids");
        assert_eq!(ids.len(), 1, "one node: {put}");
        ids[0].as_str().expect("id").to_owned()
    };

    // fifo: one node holding the three messages, byte for byte what Curator's putMulti writes.
    let fifo = batch("fifo", serde_json::json!([{"text": "a"}, {"text": "bc"}, {"body": ""}])).await;
    assert_eq!(fifo.status(), 201);
    let node = one_id(fifo.json().await.expect("json"));
    let path = format!("{root}/c/fifo");
    assert_eq!(children(&direct, &path).await, vec![node.clone()]);
    let (data, _) = direct.get_data(&format!("{path}/{node}")).await.expect("node");
    assert_eq!(hex(&data), "0001000101000000016101000000026263010000000002");
    // priority: one priority for the node, which Curator sorts ahead of a single put of priority 5.
    zkq.http.post(zkq.url("/v1/queues/priority/messages?priority=5")).body(vec![5u8]).send().await.expect("put");
    let messages =
        serde_json::json!([{"body": b64.encode([0xd1]), "priority": -3}, {"body": b64.encode([0xd2]), "priority": -3}]);
    assert_eq!(batch("priority", messages).await.status(), 201);
    // delay: one delivery time (in the past: due now).
    let messages = serde_json::json!([{"text": "e", "deliver_at": 1_700_000_000_000i64}, {"text": "f", "deliver_at": 1_700_000_000_000i64}]);
    assert_eq!(batch("delay", messages).await.status(), 201);
    assert_eq!(children(&direct, &format!("{root}/c/delay")).await.len(), 1, "one node");

    // Refused, storing nothing: kind fields that differ; kinds without putMulti; an unknown format.
    let refused = [
        (
            "priority",
            serde_json::json!([{"text": "x", "priority": 1}, {"text": "y", "priority": 2}]),
            400,
            "invalid_parameter",
        ),
        ("priority", serde_json::json!([{"text": "x", "priority": 1}, {"text": "y"}]), 400, "invalid_parameter"),
        ("delay", serde_json::json!([{"text": "x", "delay": "1h"}, {"text": "y"}]), 400, "invalid_parameter"),
        ("fifo", serde_json::json!([{"text": "x"}, {"text": "y", "priority": 1}]), 409, "parameter_not_for_kind"),
        ("id", serde_json::json!([{"text": "x", "id": "a"}, {"text": "y", "id": "a"}]), 409, "parameter_not_for_kind"),
        ("simple", serde_json::json!([{"text": "x"}]), 409, "parameter_not_for_kind"),
        // A key stands for one message; this node would hold two.
        ("fifo", serde_json::json!([{"text": "x", "idempotency_key": "k1"}, {"text": "y"}]), 400, "invalid_parameter"),
    ];
    for (queue, messages, status, code) in refused {
        let response = batch(queue, messages.clone()).await;
        assert_eq!(response.status(), status, "{queue} {messages}");
        let body: serde_json::Value = response.json().await.expect("json error");
        assert_eq!(body["code"], code, "{queue} {messages}: {body}");
    }
    let url = zkq.url("/v1/queues/fifo/batch?format=bogus");
    let response =
        zkq.http.post(url).json(&serde_json::json!({"messages": [{"text": "x"}]})).send().await.expect("put");
    assert_eq!(response.status(), 400);
    assert_eq!(children(&direct, &path).await.len(), 1, "nothing stored by a refused batch");
    for queue in ["id", "simple"] {
        assert!(children(&direct, &format!("{root}/c/{queue}")).await.is_empty(), "{queue}");
    }

    // Curator's lock-safe consumers receive each node's messages together, in order.
    let consume = |kind: &str, count: usize| {
        let args = [
            "consume".to_owned(),
            kind.to_owned(),
            format!("{root}/c/{kind}"),
            count.to_string(),
            "15000".to_owned(),
            "--lock".to_owned(),
            format!("{root}/c/locks-{kind}"),
        ];
        async move { Curator::run(zk, &args.iter().map(String::as_str).collect::<Vec<_>>()).await }
    };
    assert_eq!(consume("fifo", 3).await, ["61", "6263", "-", "DONE 3"]);
    assert_eq!(consume("priority", 3).await, ["d1", "d2", "05", "DONE 3"]);
    assert_eq!(consume("delay", 2).await, ["65", "66", "DONE 2"]);

    // zkq's own take of such a node: every message once, in order; the first under the node's
    // id, the others under the ids of the nodes the first take split off. (A queue no other
    // consumer touched: a zkq that just saw other consumers at work picks among the first
    // candidates at random.)
    // Two such nodes: the take's own transaction splits the second one too.
    let messages: Vec<serde_json::Value> = (0..5).map(|i| serde_json::json!({"text": format!("m{i}")})).collect();
    let response = batch("own", serde_json::Value::Array(messages)).await;
    let node = one_id(response.json().await.expect("json"));
    let messages: Vec<serde_json::Value> = (5..7).map(|i| serde_json::json!({"text": format!("m{i}")})).collect();
    let response = batch("own", serde_json::Value::Array(messages)).await;
    let second = one_id(response.json().await.expect("json"));
    let taken: serde_json::Value =
        zkq.http.post(zkq.url("/v1/queues/own/take?max=10")).send().await.expect("take").json().await.expect("json");
    let taken = taken["messages"].as_array().expect("messages");
    let got: Vec<(String, Vec<u8>)> = taken
        .iter()
        .map(|m| {
            let id = m["message_id"].as_str().expect("id").to_owned();
            (id, b64.decode(m["body"].as_str().expect("body")).expect("base64"))
        })
        .collect();
    let expected: Vec<(String, Vec<u8>)> = (0..7)
        .map(|i| {
            let id = match i {
                0 => node.clone(),
                1..5 => format!("{node}-{i:04}"),
                5 => second.clone(),
                _ => format!("{second}-{:04}", i - 5),
            };
            (id, format!("m{i}").into_bytes())
        })
        .collect();
    assert_eq!(got, expected);
    assert!(children(&direct, &format!("{root}/queues/own")).await.is_empty());
    zkq.stop().await;
}

/// Writes one node as Curator's `putMulti` does (`PERSISTENT_SEQUENTIAL` `{queue}/queue-`, the
/// items in Curator's envelope) and answers its name.
async fn put_multi_node(client: &zookeeper_client::Client, queue_path: &str, items: &[Vec<u8>]) -> String {
    let options = zookeeper_client::CreateMode::PersistentSequential.with_acls(zookeeper_client::Acls::anyone_all());
    let data = zkq::envelope::encode(items.iter().map(Vec::as_slice));
    let (_, sequence) = client.create(&format!("{queue_path}/queue-"), &data, &options).await.expect("create");
    format!("queue-{sequence}")
}

/// The 100-byte item `i` of a large putMulti node.
fn item(i: usize) -> Vec<u8> {
    format!("{i:0100}").into_bytes()
}

/// A Curator putMulti node of 8,000 × 100-byte items (840 KB, under ZooKeeper's 1 MiB) whose
/// split would be a 1.5 MB transaction: zkq makes it smaller in steps that each fit ZooKeeper's
/// request limit, then hands out every item once, in order, by takes and by leases, without its
/// connection ever being closed by the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_multi_node_too_large_to_split_in_one_transaction_is_consumed_in_order() {
    use base64::Engine;
    const ITEMS: usize = 8000;
    let zk = ZkServer::shared();
    let root = unique_root("huge-multi");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    zkq.put_ok("q", b"first").await;
    assert_eq!(zkq.take_body("q", "5s").await.as_deref(), Some(&b"first"[..]), "the queue exists and is empty");
    let client = zk_client(zk).await;
    let queue_path = format!("{root}/queues/q");
    let items: Vec<Vec<u8>> = (0..ITEMS).map(item).collect();
    put_multi_node(&client, &queue_path, &items[..ITEMS / 2]).await;
    put_multi_node(&client, &queue_path, &items[ITEMS / 2..]).await;
    let huge: Vec<Vec<u8>> = (ITEMS..2 * ITEMS).map(item).collect();
    put_multi_node(&client, &queue_path, &huge).await;

    // The first node by takes of many, the second by leases of many and batch acks, the third
    // (8,000 items in one node) by both.
    let mut got = Vec::new();
    while got.len() < 2 * ITEMS {
        let leasing = got.len() >= ITEMS / 2 && got.len() < ITEMS || got.len() >= ITEMS + ITEMS / 2;
        let verb = if leasing { "leases?max=100&visibility=60s&wait=5s" } else { "take?max=100&wait=5s" };
        let response = zkq.http.post(zkq.url(&format!("/v1/queues/q/{verb}"))).send().await.expect("consume");
        assert_eq!(response.status(), 200, "{verb} after {} items: {:?}", got.len(), response.text().await);
        let batch: serde_json::Value = response.json().await.expect("json");
        let messages = batch["messages"].as_array().expect("messages");
        assert!(!messages.is_empty(), "{batch}");
        let mut receipts = Vec::new();
        for message in messages {
            let body = base64::engine::general_purpose::STANDARD.decode(message["body"].as_str().expect("body"));
            got.push(String::from_utf8(body.expect("base64")).expect("ascii"));
            if let Some(receipt) = message["lease"].as_str() {
                receipts.push(receipt.to_owned());
            }
        }
        if !receipts.is_empty() {
            let acked = zkq.http.post(zkq.url("/v1/queues/q/acks")).json(&serde_json::json!({ "leases": receipts }));
            let acked: serde_json::Value = acked.send().await.expect("acks").json().await.expect("json");
            assert!(acked["results"].as_array().expect("results").iter().all(|r| r["status"] == 204), "{acked}");
        }
    }
    let expected: Vec<String> = (0..2 * ITEMS).map(|i| String::from_utf8(item(i)).expect("ascii")).collect();
    assert!(
        got == expected,
        "every item once, in put order ({} got, first difference at {:?})",
        got.len(),
        got.iter().zip(&expected).position(|(a, b)| a != b)
    );
    assert_eq!(zkq.take("q", "0").await.status(), 204, "nothing is left");
    let metrics = zkq.metrics().await;
    assert_eq!(metric_value(&metrics, "zkq_zookeeper_reconnects_total"), Some(0.0), "the connection was never lost");
    zkq.stop().await;
}

/// A delayed message of a plain fifo queue waits for zkq's consumers, but Curator's
/// `DistributedQueue` does not read delivery times: its consumer takes the message at once, after
/// the plain ones (docs/curator-format.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_takes_a_delayed_fifo_message_at_once_where_zkq_waits() {
    let zk = ZkServer::shared();
    let root = unique_root("fifo-delay-curator");
    let zkq = zkq_with_curator_paths(zk, &root, false).await;
    let api = zkq.client();
    assert_eq!(api.put("fifo", "delay=10m", &unhex("dd")).await.status, 201);
    assert_eq!(api.put("fifo", "", &unhex("aa")).await.status, 201);
    let first = api.take("fifo", "wait=0s").await;
    assert_eq!((first.status, hex(&first.body)), (200, "aa".to_owned()));
    assert_eq!(api.take("fifo", "wait=0s").await.status, 204, "zkq holds the delayed one back");
    let path = format!("{root}/c/fifo");
    let lines = Curator::run(zk, &["consume", "fifo", &path, "1", "15000"]).await;
    assert_eq!(lines, ["dd", "DONE 1"], "Curator takes it well before its time");
}
