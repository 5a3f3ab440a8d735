//! Idempotent puts: a put retried with the same `Idempotency-Key` stores one message, through
//! lost answers (placed with the proxy), a crash between the put's two steps, concurrent puts on
//! two zkq processes, and the window's end; records are swept once expired.

use std::collections::HashSet;
use std::time::Duration;

use zkq::config::{Config, QueueKind};

use zkq_testkit::proxy::{Fault, ZkProxy, op};
use zkq_testkit::*;

/// A generous bound for anything that should happen "soon" on a loaded 2-core machine.
const SOON: Duration = Duration::from_secs(30);

/// What a put answered.
#[derive(Debug)]
struct Put {
    status: u16,
    /// `message_id` of a 201 (`None` when it was null).
    id: Option<String>,
    replay: bool,
    code: String,
}

async fn answer(response: reqwest::Response) -> Put {
    let status = response.status().as_u16();
    let replay = response.headers().get("zkq-idempotent-replay").is_some_and(|v| v == "true");
    let json: serde_json::Value = response.json().await.unwrap_or_default();
    Put {
        status,
        id: json["message_id"].as_str().map(str::to_owned),
        replay,
        code: json["code"].as_str().unwrap_or_default().to_owned(),
    }
}

async fn keyed_put(http: &reqwest::Client, api: &str, queue: &str, key: &str, body: &[u8]) -> Put {
    let url = format!("{api}/v1/queues/{queue}/messages");
    answer(http.post(url).header("Idempotency-Key", key).body(body.to_vec()).send().await.expect("put")).await
}

/// The bodies of the messages in `path`, sorted.
async fn stored(direct: &zookeeper_client::Client, path: &str) -> Vec<String> {
    let mut bodies = Vec::new();
    for name in children(direct, path).await {
        let (data, _) = direct.get_data(&format!("{path}/{name}")).await.expect("data");
        for body in zkq::envelope::decode(&data).expect("envelope") {
            bodies.push(String::from_utf8_lossy(&body).into_owned());
        }
    }
    bodies.sort();
    bodies
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1.0)
}

/// Config of the zkq behind the proxy: a long session, so a dropped connection comes back to the
/// same session.
fn config_via(proxy: &ZkProxy, root: &str) -> Config {
    let mut config = test_config(proxy, root);
    config.zookeeper.session_timeout = Duration::from_secs(20);
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_put_with_its_key_stores_one_message_and_another_body_is_refused() {
    let zk = ZkServer::shared();
    let root = unique_root("idem-basic");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let first = keyed_put(&zkq.http, &zkq.api, "q", "order-42", b"pay 10").await;
    assert_eq!((first.status, first.replay), (201, false), "{first:?}");
    let id = first.id.clone().expect("a message id");
    let again = keyed_put(&zkq.http, &zkq.api, "q", "order-42", b"pay 10").await;
    assert_eq!((again.status, again.replay, again.id.as_deref()), (201, true, Some(id.as_str())), "{again:?}");
    let other = keyed_put(&zkq.http, &zkq.api, "q", "order-42", b"pay 20").await;
    assert_eq!((other.status, other.code.as_str()), (409, "idempotency_key_reused"), "{other:?}");
    // Another key, and no key at all, store new messages.
    let second = keyed_put(&zkq.http, &zkq.api, "q", "order-43", b"pay 10").await;
    assert_eq!((second.status, second.replay), (201, false));
    assert_ne!(second.id, first.id);
    zkq.put_ok("q", b"no key").await;

    let direct = zk_client(zk).await;
    assert_eq!(stored(&direct, &format!("{root}/queues/q")).await, ["no key", "pay 10", "pay 10"]);
    let text = zkq.metrics().await;
    assert_eq!(metric(&text, "zkq_idempotent_replays_total{queue=\"q\"}"), 1.0);
    assert_eq!(metric(&text, "zkq_idempotent_conflicts_total{queue=\"q\"}"), 1.0);
    assert_eq!(metric(&text, "zkq_idempotency_records{queue=\"q\"}"), 2.0);
    assert_eq!(metric(&text, "zkq_messages_put_total{queue=\"q\"}"), 3.0);
    // The replay answers from the record, which names the message.
    let record = children(&direct, &format!("{root}/idempotency/q/keys")).await;
    assert_eq!(record.len(), 2, "one record per key: {record:?}");
}

/// On a full queue (`max_items`), a retry of a put that was stored is a replay at once: it does not
/// wait for room, nor answer 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_on_a_full_queue_answers_at_once() {
    let zk = ZkServer::shared();
    let root = unique_root("idem-full");
    let mut config = test_config(zk, &root);
    declare(&mut config, "tiny", QueueKind::Fifo, None, None);
    config.queues.get_mut("tiny").expect("declared").max_items = Some(1);
    let zkq = TestZkq::start_ready(config).await;
    let first = keyed_put(&zkq.http, &zkq.api, "tiny", "k", b"M").await;
    assert_eq!((first.status, first.replay), (201, false));
    let full = keyed_put(&zkq.http, &zkq.api, "tiny", "other", b"N").await;
    assert_eq!((full.status, full.code.as_str()), (429, "queue_full"), "the queue is full: {full:?}");
    let replay = keyed_put(&zkq.http, &zkq.api, "tiny", "k", b"M").await;
    assert_eq!((replay.status, replay.replay, &replay.id), (201, true, &first.id), "a replay, not 429");
    let conflict = keyed_put(&zkq.http, &zkq.api, "tiny", "k", b"other body").await;
    assert_eq!((conflict.status, conflict.code.as_str()), (409, "idempotency_key_reused"));
    let batch = batch_put(&zkq.http, &zkq.api, "tiny", &[("M", Some("k"))]).await;
    assert_eq!((batch.status, &batch.replayed[..], &batch.ids[0]), (201, &[true][..], &first.id), "{batch:?}");
    // With one new message, the batch needs room for it.
    let more = batch_put(&zkq.http, &zkq.api, "tiny", &[("M", Some("k")), ("N", Some("n"))]).await;
    assert_eq!((more.status, more.code.as_str()), (429, "queue_full"), "{more:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_idempotency_keys_are_refused_with_400_and_store_nothing() {
    let zk = ZkServer::shared();
    let root = unique_root("idem-bad");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let url = zkq.url("/v1/queues/q/messages");
    let long = "k".repeat(201);
    let bad: [&[u8]; 5] = [b"", long.as_bytes(), b"with space", b"caf\xc3\xa9", b"tab\there"];
    for key in bad {
        let value = reqwest::header::HeaderValue::from_bytes(key).expect("a header value");
        let response = zkq.http.post(&url).header("Idempotency-Key", value).body("x").send().await.expect("put");
        assert_eq!(response.headers()["content-type"], "application/json");
        let put = answer(response).await;
        assert_eq!((put.status, put.code.as_str()), (400, "invalid_parameter"), "key {key:?}: {put:?}");
    }
    let twice = zkq
        .http
        .post(&url)
        .header("Idempotency-Key", "a")
        .header("Idempotency-Key", "b")
        .body("x")
        .send()
        .await
        .expect("put");
    assert_eq!(answer(twice).await.status, 400, "two keys");
    let direct = zk_client(zk).await;
    assert!(children(&direct, &format!("{root}/queues/q")).await.is_empty(), "nothing stored");
    let longest = "~".repeat(200);
    assert_eq!(keyed_put(&zkq.http, &zkq.api, "q", &longest, b"x").await.status, 201, "200 bytes is fine");
}

/// The put's transaction applies but its answer is lost: zkq settles it by the record (after a
/// sync) and answers 201 with the message it stored, never 504; a retry with the same key is a
/// replay, and ZooKeeper holds the message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_put_whose_answer_is_lost_is_settled_and_its_retry_stores_nothing() {
    let zk = ZkServer::shared();
    let root = unique_root("idem-lost");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(config_via(&proxy, &root)).await;
    let b = TestZkq::start_ready(test_config(zk, &root)).await;
    assert_eq!(keyed_put(&a.http, &a.api, "q", "warm-up", b"w").await.status, 201, "directories exist");
    let direct = zk_client(zk).await;
    prepare_idempotency_buckets(&direct, &root, "q").await;

    let lost = proxy.arm(&[op::MULTI], Fault::DropAnswer);
    let put = keyed_put(&a.http, &a.api, "q", "k", b"M").await;
    assert!(lost.has_fired(), "the put's transaction was sent and its answer dropped");
    assert_eq!((put.status, put.replay), (201, false), "settled, not reported: {put:?}");
    let id = put.id.clone().expect("the message is still there, so its name is found");
    for zkq in [&a, &b] {
        let retry = keyed_put(&zkq.http, &zkq.api, "q", "k", b"M").await;
        assert_eq!((retry.status, retry.replay, retry.id.as_deref()), (201, true, Some(id.as_str())), "{retry:?}");
    }
    assert_eq!(stored(&direct, &format!("{root}/queues/q")).await, ["M", "w"], "M is stored once");
    assert_eq!(metric(&a.metrics().await, "zkq_put_outcome_unknown_total{queue=\"q\"}"), 0.0);
}

/// As above, but zkq cannot reach ZooKeeper again within the request's time: the put answers 504
/// `outcome_unknown`, as a put without a key does. The client's retry with the same key, once
/// ZooKeeper is back, answers the message the first put stored: one message, not two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_504_keyed_put_retried_with_its_key_stores_one_message() {
    let zk = ZkServer::shared();
    let root = unique_root("idem-504");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(config_via(&proxy, &root)).await;
    assert_eq!(keyed_put(&a.http, &a.api, "q", "warm-up", b"w").await.status, 201);
    let direct = zk_client(zk).await;
    prepare_idempotency_buckets(&direct, &root, "q").await;

    let lost = proxy.arm_then_refuse(&[op::MULTI], Fault::DropAnswer);
    let put = keyed_put(&a.http, &a.api, "q", "k", b"M").await;
    assert!(lost.has_fired());
    assert_eq!((put.status, put.code.as_str()), (504, "outcome_unknown"), "{put:?}");
    assert_eq!(metric(&a.metrics().await, "zkq_put_outcome_unknown_total{queue=\"q\"}"), 1.0);
    proxy.refuse(false);
    a.wait_ready().await;
    let retry = keyed_put(&a.http, &a.api, "q", "k", b"M").await;
    assert_eq!((retry.status, retry.replay), (201, true), "the first put had stored it: {retry:?}");
    let queue = format!("{root}/queues/q");
    assert_eq!(stored(&direct, &queue).await, ["M", "w"], "M is stored once");
    let names = children(&direct, &queue).await;
    assert!(retry.id.as_ref().is_some_and(|id| names.contains(id)), "the replay names M: {retry:?} {names:?}");
}

/// The put's transaction never reaches ZooKeeper: the record says so, and zkq sends it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_put_whose_request_was_lost_is_sent_again_once() {
    let zk = ZkServer::shared();
    let root = unique_root("idem-unsent");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(config_via(&proxy, &root)).await;
    assert_eq!(keyed_put(&a.http, &a.api, "q", "warm-up", b"w").await.status, 201);
    let direct = zk_client(zk).await;
    prepare_idempotency_buckets(&direct, &root, "q").await;

    let lost = proxy.arm(&[op::MULTI], Fault::DropBeforeSend);
    let put = keyed_put(&a.http, &a.api, "q", "k", b"M").await;
    assert!(lost.has_fired());
    assert_eq!((put.status, put.replay), (201, false), "{put:?}");
    assert!(put.id.is_some());
    let retry = keyed_put(&a.http, &a.api, "q", "k", b"M").await;
    assert_eq!((retry.status, retry.replay, retry.id), (201, true, put.id));
    assert_eq!(stored(&direct, &format!("{root}/queues/q")).await, ["M", "w"]);
}

/// A put answers only once its record names its message: the write of the name is lost (the
/// connection drops before it reaches ZooKeeper), zkq writes it again after reconnecting and then
/// answers 201. So a replay after the message was consumed still answers the original id (before,
/// the put answered first and a lost name write left the record without it: `null`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_answers_once_its_record_names_the_message_so_a_replay_after_it_was_consumed_names_it() {
    let zk = ZkServer::shared();
    let root = unique_root("idem-named");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(config_via(&proxy, &root)).await;
    let b = TestZkq::start_ready(test_config(zk, &root)).await;
    assert_eq!(keyed_put(&a.http, &a.api, "q", "warm-up", b"w").await.status, 201);
    let direct = zk_client(zk).await;
    eventually(SOON, "the warm-up's name is written", || async {
        recorded_names(&direct, &root, "q").await.iter().all(Option::is_some)
    })
    .await;

    let dropped = proxy.arm(&[op::SET_DATA], Fault::DropBeforeSend);
    let put = keyed_put(&a.http, &a.api, "q", "k", b"M").await;
    assert_eq!((put.status, put.replay), (201, false), "{put:?}");
    assert!(dropped.has_fired(), "the first write of the name was lost before the put answered");
    let id = put.id.clone().expect("the put knows its name");
    assert!(recorded_names(&direct, &root, "q").await.contains(&Some(id.clone())), "the record names it");
    let queue = format!("{root}/queues/q");
    direct.delete(&format!("{queue}/{id}"), None).await.expect("consumed");
    for zkq in [&a, &b] {
        let replay = keyed_put(&zkq.http, &zkq.api, "q", "k", b"M").await;
        assert_eq!((replay.status, replay.replay, replay.id.as_deref()), (201, true, Some(id.as_str())), "{replay:?}");
    }
    assert_eq!(stored(&direct, &queue).await, ["w"], "nothing stored again");
}

/// zkq stores the message and its record, then cannot reach ZooKeeper again to write the
/// message's name into the record (as if it died there): the put does not answer 201 (it could
/// not promise the id to a replay) but 504. A replay through another zkq finds the message by the
/// record's zxid and records its name; when the message is consumed before anyone learned its
/// name, a replay still stores nothing and says its name is unknown (null).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_without_its_message_name_is_resolved_by_the_transactions_zxid() {
    let zk = ZkServer::shared();
    let root = unique_root("idem-zxid");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(config_via(&proxy, &root)).await;
    let b = TestZkq::start_ready(test_config(zk, &root)).await;
    for i in 0..5 {
        b.put_ok("q", format!("filler-{i}").as_bytes()).await; // the search has neighbours
    }
    let direct = zk_client(zk).await;
    let queue = format!("{root}/queues/q");

    let before = children(&direct, &queue).await;
    let dropped = proxy.arm_then_refuse(&[op::SET_DATA], Fault::DropBeforeSend);
    let put = keyed_put(&a.http, &a.api, "q", "k1", b"M1").await;
    assert!(dropped.has_fired(), "the write of the name was sent, and never arrived");
    assert_eq!((put.status, put.code.as_str()), (504, "outcome_unknown"), "stored, but not named: {put:?}");
    let added: Vec<String> = children(&direct, &queue).await.into_iter().filter(|n| !before.contains(n)).collect();
    assert_eq!(added.len(), 1, "the message was stored: {added:?}");
    let id = added[0].clone();
    b.put_ok("q", b"after").await;
    let keys = format!("{root}/idempotency/q/keys");
    let record = |direct: &zookeeper_client::Client| {
        let keys = keys.clone();
        let direct = direct.clone();
        async move {
            let names = children(&direct, &keys).await;
            assert_eq!(names.len(), 1, "{names:?}");
            let (data, _) = direct.get_data(&format!("{keys}/{}", names[0])).await.expect("record");
            serde_json::from_slice::<serde_json::Value>(&data).expect("JSON record")
        }
    };
    assert!(record(&direct).await["message_id"].is_null(), "the record does not name the message");
    let replay = keyed_put(&b.http, &b.api, "q", "k1", b"M1").await;
    assert_eq!((replay.status, replay.replay, replay.id.as_deref()), (201, true, Some(id.as_str())), "{replay:?}");
    assert_eq!(record(&direct).await["message_id"], id.as_str(), "the replay recorded the name it found");

    // Now the message is consumed before anyone learns its name.
    proxy.refuse(false);
    a.wait_ready().await;
    let before = children(&direct, &queue).await;
    let dropped = proxy.arm_then_refuse(&[op::SET_DATA], Fault::DropBeforeSend);
    let put = keyed_put(&a.http, &a.api, "q", "k2", b"M2").await;
    assert!(dropped.has_fired(), "the write of the name was dropped");
    assert_eq!(put.status, 504, "{put:?}");
    let added: Vec<String> = children(&direct, &queue).await.into_iter().filter(|n| !before.contains(n)).collect();
    assert_eq!(added.len(), 1, "{added:?}");
    direct.delete(&format!("{queue}/{}", added[0]), None).await.expect("consumed");
    let replay = keyed_put(&b.http, &b.api, "q", "k2", b"M2").await;
    assert_eq!((replay.status, replay.replay, replay.id), (201, true, None), "stored, its name gone with it");
    assert_eq!(children(&direct, &queue).await, before, "nothing new stored");
}

/// A replay's read of the key's record is lost (the connection drops before it reaches ZooKeeper):
/// nothing was written, so zkq reads again once reconnected and answers the replay, not 504. When
/// it cannot reconnect within the request's time it answers 503 `zookeeper_unavailable` (nothing
/// was stored), never 504; the retry, once ZooKeeper is back, replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_whose_read_is_lost_reads_again_and_answers_503_not_504_when_it_cannot() {
    let zk = ZkServer::shared();
    let root = unique_root("idem-read-lost");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(config_via(&proxy, &root)).await;
    let first = keyed_put(&a.http, &a.api, "q", "k", b"M").await;
    assert_eq!(first.status, 201);

    // A replay sends its unit, which ZooKeeper refuses (the key's record exists); zkq then syncs
    // and reads the record.
    let lost = proxy.arm(&[op::SYNC], Fault::DropBeforeSend);
    let replay = keyed_put(&a.http, &a.api, "q", "k", b"M").await;
    assert!(lost.has_fired(), "the replay's sync was lost");
    assert_eq!((replay.status, replay.replay, &replay.id), (201, true, &first.id), "read again: {replay:?}");

    // For a second after a replay the queue's keyed puts read their records first: this replay
    // reads at once. ZooKeeper cannot be reached again within the request's time.
    let lost = proxy.arm_then_refuse(&[op::SYNC, op::GET_DATA], Fault::DropBeforeSend);
    let started = std::time::Instant::now();
    let replay = keyed_put(&a.http, &a.api, "q", "k", b"M").await;
    assert!(lost.has_fired());
    assert_eq!((replay.status, replay.code.as_str()), (503, "zookeeper_unavailable"), "{replay:?}");
    assert!(started.elapsed() >= Duration::from_secs(3), "it tried until the request's deadline");
    assert_eq!(metric(&a.metrics().await, "zkq_put_outcome_unknown_total{queue=\"q\"}"), 0.0, "no 504");
    proxy.refuse(false);
    a.wait_ready().await;
    let replay = keyed_put(&a.http, &a.api, "q", "k", b"M").await;
    assert_eq!((replay.status, replay.replay, &replay.id), (201, true, &first.id), "{replay:?}");
    let direct = zk_client(zk).await;
    assert_eq!(stored(&direct, &format!("{root}/queues/q")).await, ["M"]);
}

/// The put's answer is lost, and so is the `sync` that begins settling it: zkq keeps asking once
/// reconnected, finds its record and answers 201 with its message, not 504.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_whose_settling_read_is_lost_too_is_settled_after_reconnecting() {
    let zk = ZkServer::shared();
    let root = unique_root("idem-settle-twice");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(config_via(&proxy, &root)).await;
    assert_eq!(keyed_put(&a.http, &a.api, "q", "warm-up", b"w").await.status, 201);
    let direct = zk_client(zk).await;
    prepare_idempotency_buckets(&direct, &root, "q").await;

    let lost = proxy.arm(&[op::MULTI], Fault::DropAnswer);
    let sync_lost = proxy.arm(&[op::SYNC], Fault::DropBeforeSend);
    let put = keyed_put(&a.http, &a.api, "q", "k", b"M").await;
    assert!(lost.has_fired() && sync_lost.has_fired(), "the answer and then the settling sync were lost");
    assert_eq!((put.status, put.replay), (201, false), "settled: {put:?}");
    let id = put.id.clone().expect("its message");
    assert_eq!(body_of(&direct, &format!("{root}/queues/q"), &id).await, "M");
    let retry = keyed_put(&a.http, &a.api, "q", "k", b"M").await;
    assert_eq!((retry.status, retry.replay, retry.id.as_deref()), (201, true, Some(id.as_str())));
    assert_eq!(stored(&direct, &format!("{root}/queues/q")).await, ["M", "w"]);
    assert_eq!(metric(&a.metrics().await, "zkq_put_outcome_unknown_total{queue=\"q\"}"), 0.0);
}

/// Records of queues no zkq has open (a dynamic queue nobody uses any more) are swept too: at
/// start, each zkq looks at every queue under `{root}/idempotency` it does not have open and
/// deletes its expired records with their index entries; live records stay. Two zkqs starting at
/// once do this side by side without harm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_records_of_queues_nobody_opens_are_swept_at_start() {
    let zk = ZkServer::shared();
    let root = unique_root("idem-orphans");
    let direct = zk_client(zk).await;
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let now = zkq::now_epoch_ms();
    let mut live = Vec::new();
    for (queue, records) in [("ghost", 70), ("other.ghost", 3)] {
        for i in 0..records {
            // Most expired a minute ago; every tenth lives for another ten minutes.
            let expires_at = if i % 10 == 9 { now + 600_000 } else { now - 60_000 - i * 1000 };
            let bucket = format!("{:015}", (expires_at / 1000 + 1) * 1000);
            let hash = format!("{i:032x}");
            let record = serde_json::json!({
                "v": 1, "key": format!("key-{i}"), "fingerprint": "f", "expires_at": expires_at,
                "bucket": bucket, "token": "t", "content": "c", "copy": 0, "copies": 1,
            });
            let dir = format!("{root}/idempotency/{queue}");
            let keys = format!("{dir}/keys/{hash}");
            direct.mkdir(&keys, &options).await.expect("record");
            direct.set_data(&keys, record.to_string().as_bytes(), None).await.expect("record data");
            direct.mkdir(&format!("{dir}/expiry/{bucket}/{hash}"), &options).await.expect("entry");
            if expires_at > now {
                live.push((queue, hash));
            }
        }
    }
    let [first, second] = TestZkq::fleet(test_config(zk, &root)).await;
    for queue in ["ghost", "other.ghost"] {
        let kept: Vec<String> = live.iter().filter(|(q, _)| *q == queue).map(|(_, hash)| hash.clone()).collect();
        let keys = format!("{root}/idempotency/{queue}/keys");
        eventually(SOON, &format!("the expired records of {queue} are swept"), || async {
            children(&direct, &keys).await == kept
        })
        .await;
        let expiry = format!("{root}/idempotency/{queue}/expiry");
        let buckets = usize::from(!kept.is_empty()); // the live ones share one second
        eventually(SOON, &format!("only the live bucket of {queue} is left"), || async {
            children(&direct, &expiry).await.len() == buckets
        })
        .await;
    }
    for zkq in [&first, &second] {
        let listed: serde_json::Value =
            zkq.http.get(zkq.url("/v1/queues")).send().await.expect("list").json().await.expect("json");
        assert!(!listed.to_string().contains("ghost"), "sweeping opens no queue: {listed}");
    }
}

/// Two zkqs receive the same key at once: exactly one stores the message, the other answers its
/// id as a replay. First placed deterministically (A's transaction held while B's applies, then
/// A's delivered, then A's answer also lost), then a burst through a real second process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_puts_with_one_key_on_two_zkqs_store_one_message() {
    let zk = ZkServer::shared();
    let root = unique_root("idem-race");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(config_via(&proxy, &root)).await;
    let b = TestZkq::start_ready(test_config(zk, &root)).await;
    assert_eq!(keyed_put(&a.http, &a.api, "q", "warm-up", b"w").await.status, 201);
    let direct = zk_client(zk).await;
    prepare_idempotency_buckets(&direct, &root, "q").await;

    for (key, release_dropping_answer) in [("held", false), ("held-and-lost", true)] {
        let held = proxy.arm(&[op::MULTI], Fault::Hold);
        let (http, api) = (a.http.clone(), a.api.clone());
        let put_a = tokio::spawn(async move { keyed_put(&http, &api, "q", key, b"M").await });
        tokio::time::timeout(SOON, held.held()).await.expect("A's transaction reached the proxy");
        let put_b = keyed_put(&b.http, &b.api, "q", key, b"M").await;
        assert_eq!((put_b.status, put_b.replay), (201, false), "B stores it: {put_b:?}");
        if release_dropping_answer {
            held.release_drop_answer();
        } else {
            held.release_deliver();
        }
        let put_a = put_a.await.expect("join");
        assert_eq!((put_a.status, put_a.replay, &put_a.id), (201, true, &put_b.id), "{key}: A replays B's message");
    }
    assert_eq!(stored(&direct, &format!("{root}/queues/q")).await, ["M", "M", "w"]);

    let child = ChildZkq::start(zk, &root, &[]).await;
    let http = reqwest::Client::new();
    let mut puts = tokio::task::JoinSet::new();
    for i in 0..20 {
        for api in [b.api.clone(), child.api.clone()] {
            let http = http.clone();
            puts.spawn(async move { (i, keyed_put(&http, &api, "burst", &format!("key-{i}"), b"B").await) });
        }
    }
    let mut answers: Vec<Vec<Put>> = (0..20).map(|_| Vec::new()).collect();
    while let Some(joined) = puts.join_next().await {
        let (i, put) = joined.expect("join");
        assert_eq!(put.status, 201, "key-{i}: {put:?}");
        answers[i].push(put);
    }
    for (i, pair) in answers.iter().enumerate() {
        assert_eq!(pair.iter().filter(|p| !p.replay).count(), 1, "key-{i}: one put stored it: {pair:?}");
        assert!(pair[0].id.is_some() && pair[0].id == pair[1].id, "key-{i}: both answer its id: {pair:?}");
    }
    let ids: HashSet<&Option<String>> = answers.iter().map(|pair| &pair[0].id).collect();
    assert_eq!(ids.len(), 20);
    assert_eq!(children(&direct, &format!("{root}/queues/burst")).await.len(), 20, "one message per key");
}

/// Past the window a key is free again: a put with it stores a new message. Records past their
/// window are swept (with their index), and the gauge follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_window_a_key_stores_a_new_message_and_expired_records_are_swept() {
    let zk = ZkServer::shared();
    let root = unique_root("idem-window");
    let mut config = test_config(zk, &root);
    declare(&mut config, "q", QueueKind::Fifo, None, None);
    config.queues.get_mut("q").expect("declared").idempotency_window = Some(Duration::from_secs(10));
    let zkq = TestZkq::start_ready(config).await;
    let first = keyed_put(&zkq.http, &zkq.api, "q", "k", b"M").await;
    assert_eq!((first.status, first.replay), (201, false));
    let once = keyed_put(&zkq.http, &zkq.api, "q", "once", b"O").await;
    assert_eq!(once.status, 201);
    // Within the window: replays (the window may pass during this loop; then a new message).
    let renewed = std::sync::Mutex::new(None);
    eventually(SOON, "a put with the key stores a new message once the window passed", || async {
        let put = keyed_put(&zkq.http, &zkq.api, "q", "k", b"M").await;
        assert_eq!(put.status, 201, "{put:?}");
        if put.replay {
            assert_eq!(put.id, first.id, "a replay answers the first message");
            false
        } else {
            *renewed.lock().expect("lock") = put.id;
            true
        }
    })
    .await;
    let renewed = renewed.into_inner().expect("lock");
    assert!(renewed.is_some() && renewed != first.id, "a new message: {renewed:?} after {:?}", first.id);

    let direct = zk_client(zk).await;
    let keys = format!("{root}/idempotency/q/keys");
    eventually(SOON, "the record of `once` and then the renewed one are swept", || async {
        children(&direct, &keys).await.is_empty()
    })
    .await;
    eventually(SOON, "every expiry bucket is gone", || async {
        children(&direct, &format!("{root}/idempotency/q/expiry")).await.is_empty()
    })
    .await;
    let text = zkq.metrics().await;
    // `once` and the renewed `k`; the first `k` too if it was swept before the put renewed it.
    let swept = metric(&text, "zkq_idempotency_records_swept_total{queue=\"q\"}");
    assert!(swept == 2.0 || swept == 3.0, "swept {swept}");
    assert_eq!(metric(&text, "zkq_idempotency_records{queue=\"q\"}"), 0.0);
    assert_eq!(stored(&direct, &format!("{root}/queues/q")).await, ["M", "M", "O"], "Curator's view: the messages");
}

/// What a batch put answered.
#[derive(Debug)]
struct Batch {
    status: u16,
    ids: Vec<Option<String>>,
    replayed: Vec<bool>,
    /// `zkq-idempotent-replay: true`: every message was a replay.
    replay_header: bool,
    code: String,
    message: String,
}

/// A batch put of `(body, key)` pairs (`None`: no key).
async fn batch_put(http: &reqwest::Client, api: &str, queue: &str, messages: &[(&str, Option<&str>)]) -> Batch {
    let messages: Vec<serde_json::Value> = messages
        .iter()
        .map(|(text, key)| match key {
            Some(key) => serde_json::json!({"text": text, "idempotency_key": key}),
            None => serde_json::json!({"text": text}),
        })
        .collect();
    let url = format!("{api}/v1/queues/{queue}/batch");
    let response = http.post(url).json(&serde_json::json!({ "messages": messages })).send().await.expect("batch");
    let status = response.status().as_u16();
    let replay_header = response.headers().get("zkq-idempotent-replay").is_some_and(|v| v == "true");
    let json: serde_json::Value = response.json().await.unwrap_or_default();
    let list = |field: &str| json[field].as_array().cloned().unwrap_or_default();
    Batch {
        status,
        ids: list("message_ids").iter().map(|id| id.as_str().map(str::to_owned)).collect(),
        replayed: list("replayed").iter().map(|r| r.as_bool().expect("a boolean")).collect(),
        replay_header,
        code: json["code"].as_str().unwrap_or_default().to_owned(),
        message: json["message"].as_str().unwrap_or_default().to_owned(),
    }
}

/// The body of message `id` in `queue` (a path).
async fn body_of(direct: &zookeeper_client::Client, queue: &str, id: &str) -> String {
    let (data, _) = direct.get_data(&format!("{queue}/{id}")).await.expect("the message is there");
    let bodies = zkq::envelope::decode(&data).expect("envelope");
    assert_eq!(bodies.len(), 1);
    String::from_utf8_lossy(&bodies[0]).into_owned()
}

/// The message names the records of `queue` hold (`None` for a record without one yet).
async fn recorded_names(direct: &zookeeper_client::Client, root: &str, queue: &str) -> Vec<Option<String>> {
    let keys = format!("{root}/idempotency/{queue}/keys");
    let mut names = Vec::new();
    for record in children(direct, &keys).await {
        let (data, _) = direct.get_data(&format!("{keys}/{record}")).await.expect("record");
        let record: serde_json::Value = serde_json::from_slice(&data).expect("JSON record");
        names.push(record["message_id"].as_str().map(str::to_owned));
    }
    names.sort();
    names
}

/// A keyed batch (two identical bodies under two keys, and a third body) is stored, but the answer
/// of its transaction is lost: zkq settles it by a record and finds each message's name among the
/// nodes that transaction created, the identical two by their order. Retried through either zkq,
/// the batch is all replays with the same ids, and each message is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_batch_whose_answer_is_lost_is_settled_and_its_retry_stores_each_message_once() {
    let zk = ZkServer::shared();
    let root = unique_root("idem-batch-lost");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(config_via(&proxy, &root)).await;
    let b = TestZkq::start_ready(test_config(zk, &root)).await;
    assert_eq!(keyed_put(&a.http, &a.api, "q", "warm-up", b"w").await.status, 201, "directories exist");
    let direct = zk_client(zk).await;
    prepare_idempotency_buckets(&direct, &root, "q").await;
    // Names are written best effort: one in flight when the connection drops is left to replays.
    eventually(SOON, "the warm-up's name is written", || async {
        recorded_names(&direct, &root, "q").await.iter().all(Option::is_some)
    })
    .await;
    let batch = [("same", Some("k1")), ("same", Some("k2")), ("other", Some("k3"))];

    let lost = proxy.arm(&[op::MULTI], Fault::DropAnswer);
    let put = batch_put(&a.http, &a.api, "q", &batch).await;
    assert!(lost.has_fired(), "the batch's transaction was sent and its answer dropped");
    assert_eq!((put.status, &put.replayed[..], put.replay_header), (201, &[false; 3][..], false), "{put:?}");
    let ids: Vec<String> = put.ids.iter().map(|id| id.clone().expect("every name is found")).collect();
    assert!(ids[0] < ids[1], "the identical two in the order given: {ids:?}");
    let queue = format!("{root}/queues/q");
    for (id, (body, _)) in ids.iter().zip(&batch) {
        assert_eq!(&body_of(&direct, &queue, id).await, body, "{id} is the message given as {body}");
    }
    for zkq in [&a, &b] {
        let retry = batch_put(&zkq.http, &zkq.api, "q", &batch).await;
        assert_eq!((retry.status, &retry.replayed[..], retry.replay_header), (201, &[true; 3][..], true), "{retry:?}");
        assert_eq!(retry.ids, put.ids, "the retry answers the first batch's messages");
    }
    assert_eq!(stored(&direct, &queue).await, ["other", "same", "same", "w"], "each message stored once");
    assert_eq!(metric(&a.metrics().await, "zkq_put_outcome_unknown_total{queue=\"q\"}"), 0.0);
    eventually(SOON, "every record names its message", || async {
        recorded_names(&direct, &root, "q").await.iter().all(Option::is_some)
    })
    .await;
    let names = recorded_names(&direct, &root, "q").await;
    assert_eq!(names.len(), 4, "the warm-up's record and one per key: {names:?}");
    for id in ids {
        assert!(names.contains(&Some(id.clone())), "{id} recorded: {names:?}");
    }
}

/// A batch whose keys are partly new, partly seen: the seen ones are replays (their earlier ids,
/// `replayed: true`), the new ones and those without a key are stored, in one transaction. A key
/// reused with another body refuses the whole batch and stores nothing (the new key in it stays
/// free); a key twice in one batch, or a bad one, is 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_mixing_new_and_replayed_keys_stores_only_the_new_messages() {
    let zk = ZkServer::shared();
    let root = unique_root("idem-batch-mixed");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let (http, api) = (&zkq.http, zkq.api.as_str());
    let a = keyed_put(http, api, "q", "a", b"A").await;
    assert_eq!((a.status, a.replay), (201, false));

    let mixed = batch_put(http, api, "q", &[("A", Some("a")), ("B", Some("b")), ("P", None)]).await;
    assert_eq!((mixed.status, &mixed.replayed[..], mixed.replay_header), (201, &[true, false, false][..], false));
    assert_eq!(mixed.ids[0], a.id, "the replay answers the single put's message");
    assert!(mixed.ids.iter().all(Option::is_some) && mixed.ids[1] != mixed.ids[2] && mixed.ids[1] != a.id);

    let replays = batch_put(http, api, "q", &[("B", Some("b")), ("A", Some("a"))]).await;
    assert_eq!((replays.status, &replays.replayed[..], replays.replay_header), (201, &[true, true][..], true));
    assert_eq!(replays.ids, [mixed.ids[1].clone(), a.id.clone()]);
    let single = keyed_put(http, api, "q", "b", b"B").await;
    assert_eq!((single.status, single.replay, &single.id), (201, true, &mixed.ids[1]), "a single put replays it too");

    let reused = batch_put(http, api, "q", &[("C", Some("c")), ("B changed", Some("b"))]).await;
    assert_eq!((reused.status, reused.code.as_str()), (409, "idempotency_key_reused"), "{reused:?}");
    assert!(reused.message.starts_with("messages[1]"), "names the message: {}", reused.message);
    let c = keyed_put(http, api, "q", "c", b"C").await;
    assert_eq!((c.status, c.replay), (201, false), "the refused batch stored nothing, not even c's record");

    let twice = batch_put(http, api, "q", &[("D", Some("d")), ("D", Some("d"))]).await;
    assert_eq!((twice.status, twice.code.as_str()), (400, "invalid_parameter"), "{twice:?}");
    let bad = batch_put(http, api, "q", &[("E", Some("with space"))]).await;
    assert_eq!((bad.status, bad.code.as_str()), (400, "invalid_parameter"), "{bad:?}");
    assert!(bad.message.starts_with("messages[0].idempotency_key"), "{}", bad.message);

    let direct = zk_client(zk).await;
    assert_eq!(stored(&direct, &format!("{root}/queues/q")).await, ["A", "B", "C", "P"]);
    let text = zkq.metrics().await;
    assert_eq!(metric(&text, "zkq_idempotent_replays_total{queue=\"q\"}"), 4.0);
    assert_eq!(metric(&text, "zkq_idempotent_conflicts_total{queue=\"q\"}"), 1.0);
    assert_eq!(metric(&text, "zkq_messages_put_total{queue=\"q\"}"), 4.0);
}

/// Keyed puts in flight together go through group commit like any put: they share transactions,
/// each gets its own message, each record names its own message, and retried all at once they
/// are all replays of their own messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_puts_in_flight_together_share_transactions_and_replay_their_own_messages() {
    use futures::StreamExt;
    let zk = ZkServer::shared();
    let root = unique_root("idem-group");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    assert_eq!(keyed_put(&zkq.http, &zkq.api, "q", "warm-up", b"w").await.status, 201);
    let direct = zk_client(zk).await;
    prepare_idempotency_buckets(&direct, &root, "q").await;
    let units = |text: &str, part: &str| metric_value(text, &format!("zkq_group_commit_units_{part}")).unwrap_or(0.0);
    let before = zkq.metrics().await;
    let puts = 200;
    let put_all = || {
        futures::stream::iter(0..puts)
            .map(|i| {
                let zkq = &zkq;
                async move { keyed_put(&zkq.http, &zkq.api, "q", &format!("key-{i}"), format!("m{i}").as_bytes()).await }
            })
            .buffered(64)
            .collect::<Vec<Put>>()
    };
    let first = put_all().await;
    let after = zkq.metrics().await;
    let (transactions, sent) =
        (units(&after, "count") - units(&before, "count"), units(&after, "sum") - units(&before, "sum"));
    assert!(sent >= puts as f64, "every keyed put went through group commit: {sent} units");
    assert!(transactions < sent, "64 keyed puts in flight never shared a transaction ({transactions} for {sent})");
    let queue = format!("{root}/queues/q");
    for (i, put) in first.iter().enumerate() {
        assert_eq!((put.status, put.replay), (201, false), "{put:?}");
        let id = put.id.as_ref().expect("an id");
        assert_eq!(body_of(&direct, &queue, id).await, format!("m{i}"), "put {i} answers its own message");
    }
    let again = put_all().await;
    for (put, retry) in first.iter().zip(&again) {
        assert_eq!((retry.status, retry.replay, &retry.id), (201, true, &put.id), "{retry:?}");
    }
    assert_eq!(children(&direct, &queue).await.len(), puts + 1, "one message per key");
    let mut ids: Vec<Option<String>> = first.into_iter().map(|put| put.id).collect();
    eventually(SOON, "every record names its message", || async {
        recorded_names(&direct, &root, "q").await.iter().all(Option::is_some)
    })
    .await;
    let names = recorded_names(&direct, &root, "q").await;
    ids.retain(|id| !names.contains(id));
    assert!(ids.is_empty(), "records name their own messages; not named: {ids:?}");
}

/// Several keyed puts share one transaction, and its answer is lost: each is settled by its own
/// record and answers its own message, found by content among the nodes of that transaction;
/// three puts of an identical body under different keys by their order in it. Placed: the first put's transaction is held, the second one queued behind it on the
/// connection, the rest wait in group commit and go together, and the answer of that transaction
/// is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_puts_sharing_a_transaction_whose_answer_is_lost_each_answer_their_own_message() {
    let zk = ZkServer::shared();
    let root = unique_root("idem-shared-lost");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(config_via(&proxy, &root)).await;
    let b = TestZkq::start_ready(test_config(zk, &root)).await;
    assert_eq!(keyed_put(&a.http, &a.api, "q", "warm-up", b"w").await.status, 201);
    let direct = zk_client(zk).await;
    prepare_idempotency_buckets(&direct, &root, "q").await;
    eventually(SOON, "the warm-up's name is written", || async {
        recorded_names(&direct, &root, "q").await.iter().all(Option::is_some)
    })
    .await;
    let gauge = |text: &str, name: &str| metric_value(text, name).unwrap_or(0.0);
    let transactions = |text: &str| gauge(text, "zkq_group_commit_units_count");
    let sent_before = transactions(&a.metrics().await);

    let held = proxy.arm(&[op::MULTI], Fault::Hold);
    let _second = proxy.arm(&[op::MULTI], Fault::Pass);
    let lost = proxy.arm(&[op::MULTI], Fault::DropAnswer);
    let bodies = ["first", "second", "same", "same", "same", "x", "y", "z"];
    let mut puts = tokio::task::JoinSet::new();
    for (i, body) in bodies.iter().enumerate() {
        let (http, api, body) = (a.http.clone(), a.api.clone(), body.to_string());
        puts.spawn(async move { (i, keyed_put(&http, &api, "q", &format!("key-{i}"), body.as_bytes()).await) });
        match i {
            0 => tokio::time::timeout(SOON, held.held()).await.expect("the first transaction is held"),
            1 => {
                eventually(SOON, "the second transaction is sent", || async {
                    transactions(&a.registered_metrics()) >= sent_before + 2.0
                })
                .await
            },
            _ => {},
        }
    }
    eventually(SOON, "every put waits in group commit", || async {
        gauge(&a.registered_metrics(), "zkq_puts_in_flight{queue=\"q\"}") >= bodies.len() as f64
    })
    .await;
    held.release_deliver();
    let mut answers: Vec<Option<Put>> = (0..bodies.len()).map(|_| None).collect();
    while let Some(joined) = puts.join_next().await {
        let (i, put) = joined.expect("join");
        answers[i] = Some(put);
    }
    assert!(lost.has_fired(), "the shared transaction's answer was dropped");
    let queue = format!("{root}/queues/q");
    let mut stored_ids = Vec::new();
    for (i, put) in answers.iter().enumerate() {
        let put = put.as_ref().expect("answered");
        // Units sent on the dropped connection after the lost one may answer 503 (never sent).
        assert!(put.status == 201 || (put.status == 503 && i >= 2), "put {i}: {put:?}");
        if put.status == 201 {
            assert!(!put.replay, "{put:?}");
            let id = put.id.clone().unwrap_or_else(|| panic!("put {i} ({}) has its name: {put:?}", bodies[i]));
            assert_eq!(body_of(&direct, &queue, &id).await, bodies[i], "put {i} answers its own message");
            stored_ids.push(id);
        }
    }
    stored_ids.sort();
    stored_ids.dedup();
    assert_eq!(stored_ids.len(), answers.iter().flatten().filter(|p| p.status == 201).count(), "distinct ids");
    assert_eq!(metric(&a.metrics().await, "zkq_put_outcome_unknown_total{queue=\"q\"}"), 0.0, "none reported 504");
    // Retried through the other zkq: every message once.
    for (i, body) in bodies.iter().enumerate() {
        let retry = keyed_put(&b.http, &b.api, "q", &format!("key-{i}"), body.as_bytes()).await;
        assert_eq!(retry.status, 201, "{retry:?}");
        if let Some(Put { status: 201, id, .. }) = &answers[i] {
            assert_eq!((retry.replay, &retry.id), (true, id), "put {i} was stored");
        }
    }
    let mut expected: Vec<&str> = bodies.to_vec();
    expected.push("w");
    expected.sort();
    assert_eq!(stored(&direct, &queue).await, expected, "each key's message once");
}

/// `multi` calls to ZooKeeper so far, every outcome.
fn multis(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("zkq_zookeeper_requests_total{") && l.contains("operation=\"multi\""))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// Retries come in bursts: once a put found its key used, the queue's keyed puts read their
/// records first for a while, so the rest of a burst of retries is answered by reads instead of
/// each sending a transaction that ZooKeeper refuses (in a shared transaction, each refusal costs
/// the others a round trip).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_replay_the_retries_that_follow_are_answered_by_reads() {
    use futures::StreamExt;
    let zk = ZkServer::shared();
    let root = unique_root("idem-burst");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    let (http, api) = (&zkq.http, zkq.api.as_str());
    let keys = 20;
    let mut ids = Vec::new();
    for i in 0..keys {
        let put = keyed_put(http, api, "q", &format!("key-{i}"), format!("m{i}").as_bytes()).await;
        assert_eq!((put.status, put.replay), (201, false));
        ids.push(put.id);
    }
    let direct = zk_client(zk).await;
    eventually(SOON, "every record names its message", || async {
        recorded_names(&direct, &root, "q").await.iter().all(Option::is_some)
    })
    .await;
    let before = multis(&zkq.metrics().await);
    let first = keyed_put(http, api, "q", "key-0", b"m0").await;
    assert_eq!((first.status, first.replay, &first.id), (201, true, &ids[0]));
    let burst: Vec<Put> = futures::stream::iter(1..keys)
        .map(|i| async move { keyed_put(http, api, "q", &format!("key-{i}"), format!("m{i}").as_bytes()).await })
        .buffered(keys)
        .collect()
        .await;
    for (put, id) in burst.iter().zip(&ids[1..]) {
        assert_eq!((put.status, put.replay, &put.id), (201, true, id), "{put:?}");
    }
    let sent = multis(&zkq.metrics().await) - before;
    assert_eq!(sent, 1.0, "only the first retry sent a transaction (refused); the burst was answered by reads");
    assert_eq!(children(&direct, &format!("{root}/queues/q")).await.len(), keys);
}

/// Idempotency records make a batch's transaction larger than its bodies: a keyed batch that would
/// pass ZooKeeper's request limit is refused with 413 before anything is sent, and stores nothing;
/// the same messages without keys, and a smaller keyed batch, are stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_batch_too_large_for_one_transaction_is_413_and_stores_nothing() {
    let zk = ZkServer::shared();
    let root = unique_root("idem-batch-size");
    let mut config = test_config(zk, &root);
    config.api.max_batch = 1000;
    let zkq = TestZkq::start_ready(config).await;
    let (http, api) = (&zkq.http, zkq.api.as_str());
    let body = "b".repeat(400);
    let keys: Vec<String> = (0..1000).map(|i| format!("{i:0>200}")).collect();
    let keyed: Vec<(&str, Option<&str>)> = keys.iter().map(|key| (body.as_str(), Some(key.as_str()))).collect();
    let refused = batch_put(http, api, "q", &keyed).await;
    assert_eq!((refused.status, refused.code.as_str()), (413, "payload_too_large"), "{refused:?}");
    // The answer gives the transaction's encoded size and the limit it passes.
    let size: usize = refused
        .message
        .split_once("transaction of ")
        .and_then(|(_, rest)| rest.split_once(" bytes"))
        .and_then(|(size, _)| size.parse().ok())
        .unwrap_or_else(|| panic!("no size in {:?}", refused.message));
    let limit = zkq::max_request_bytes(zkq::config::Config::default().zookeeper.jute_maxbuffer);
    assert!(refused.message.contains(&format!("request limit of {limit}")), "{}", refused.message);
    assert!(size > limit, "{}", refused.message);
    let direct = zk_client(zk).await;
    assert!(children(&direct, &format!("{root}/queues/q")).await.is_empty(), "nothing stored");
    assert!(children(&direct, &format!("{root}/idempotency/q/keys")).await.is_empty(), "no record");

    let plain: Vec<(&str, Option<&str>)> = keyed.iter().map(|(body, _)| (*body, None)).collect();
    assert_eq!(batch_put(http, api, "q", &plain).await.status, 201, "without keys it fits");
    let stored_keyed = batch_put(http, api, "q", &keyed[..300]).await;
    assert_eq!((stored_keyed.status, stored_keyed.ids.len()), (201, 300), "{:?}", stored_keyed.code);
    assert_eq!(children(&direct, &format!("{root}/queues/q")).await.len(), 1300);
}
