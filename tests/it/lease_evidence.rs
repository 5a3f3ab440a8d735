//! What a lease step's answer rests on: evidence that outlives the session, a remembered
//! completion that outlives its queue, and a lock that is ours by its creation, not its name.
//!
//! Each test places one fault deterministically (the fault proxy, a session expired while zkq
//! cannot reach ZooKeeper, another client's hand on the lock) and checks what a client sees: a
//! step that applied never answers 409 `lease_lost` ("delivered again"), and zkq never deletes
//! a lock it does not hold.

use std::time::Duration;

use zkq::config::Config;

use zkq_testkit::proxy::{Fault, ZkProxy, op};
use zkq_testkit::*;

/// A generous bound for anything that should happen "soon" on a loaded 2-core machine.
const SOON: Duration = Duration::from_secs(30);

/// ZooKeeper's SESSIONMOVED error code.
const SESSION_MOVED: i32 = -118;

/// Config of a zkq behind the proxy: a long session, so a dropped answer keeps the session.
fn config_via(proxy: &ZkProxy, root: &str) -> Config {
    let mut config = test_config(proxy, root);
    config.zookeeper.session_timeout = Duration::from_secs(20);
    config
}

struct Answer {
    status: u16,
    code: String,
    body: Vec<u8>,
    receipt: String,
}

async fn answer(response: reqwest::Response) -> Answer {
    let status = response.status().as_u16();
    let receipt = response.headers().get("zkq-lease").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let body = response.bytes().await.expect("body").to_vec();
    let code = if status >= 400 {
        serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|v| v["code"].as_str().map(str::to_owned))
    } else {
        None
    };
    Answer { status, code: code.unwrap_or_default(), body, receipt }
}

async fn lease(zkq: &TestZkq, queue: &str, query: &str) -> Answer {
    let url = zkq.url(&format!("/v1/queues/{queue}/leases?{query}"));
    answer(zkq.http.post(url).send().await.expect("lease request")).await
}

async fn ack(zkq: &TestZkq, queue: &str, receipt: &str) -> Answer {
    let url = zkq.url(&format!("/v1/queues/{queue}/leases/{receipt}"));
    answer(zkq.http.delete(url).send().await.expect("ack request")).await
}

async fn nack(zkq: &TestZkq, queue: &str, receipt: &str, query: &str) -> Answer {
    let url = zkq.url(&format!("/v1/queues/{queue}/leases/{receipt}/nack?{query}"));
    answer(zkq.http.post(url).send().await.expect("nack request")).await
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Leases one message (visibility 60 s) and checks its body.
async fn lease_expecting(zkq: &TestZkq, queue: &str, body: &str) -> String {
    let leased = lease(zkq, queue, "wait=5s&visibility=60s").await;
    assert_eq!((leased.status, text(&leased.body).as_str()), (200, body), "lease of {body}");
    leased.receipt
}

/// Takes from `zkq` until it answers 204; returns the bodies.
async fn drain(zkq: &TestZkq, queue: &str) -> Vec<String> {
    let mut got = Vec::new();
    loop {
        let taken = zkq.take(queue, "1s").await;
        match taken.status().as_u16() {
            200 => got.push(text(&taken.bytes().await.expect("body"))),
            204 => return got,
            other => panic!("take while draining answered {other}"),
        }
    }
}

/// The ephemeral owner of `path`, if it exists.
async fn owner(client: &zookeeper_client::Client, path: &str) -> Option<i64> {
    client.check_stat(path).await.expect("stat").map(|stat| stat.ephemeral_owner)
}

/// #3. An ack applies, its answer is lost, and zkq stays cut off until its session expired
/// (the lock that was the step's evidence died with it). The ack did remove the message: its
/// retry must answer 204, never 409 `lease_lost` ("delivered again").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_whose_answer_was_lost_and_whose_session_expired_answers_204_on_retry() {
    let zk = ZkServer::shared();
    let root = unique_root("evidence-expired");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let mut config = test_config(&proxy, &root);
    config.zookeeper.session_timeout = Duration::from_secs(4);
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("q", b"acked").await;
    zkq.put_ok("q", b"held").await;
    let acked = lease_expecting(&zkq, "q", "acked").await;
    let _held = lease_expecting(&zkq, "q", "held").await;
    let direct = zk_client(zk).await;
    let locks = format!("{root}/locks/q");
    let held_lock = children(&direct, &locks).await.into_iter().max().expect("the held message's lock");

    let lost = proxy.arm_then_refuse(&[op::MULTI], Fault::DropAnswer);
    let first = ack(&zkq, "q", &acked).await;
    assert!(lost.has_fired(), "the ack's transaction reached ZooKeeper ({} {})", first.status, first.code);
    assert!(matches!(first.status, 503 | 504), "first ack: {} {}", first.status, first.code);
    // The session expires while zkq cannot reach ZooKeeper: the other lease's lock goes with it.
    let held_path = format!("{locks}/{held_lock}");
    eventually(SOON, "zkq's session expired", || async { owner(&direct, &held_path).await.is_none() }).await;
    let before = zkq.running.as_ref().expect("running").session.status().generation;
    proxy.refuse(false);
    eventually(SOON, "zkq has a new session", || async {
        zkq.running.as_ref().expect("running").session.status().generation > before
    })
    .await;
    zkq.wait_ready().await;

    let retried = ack(&zkq, "q", &acked).await;
    assert_eq!(
        (retried.status, retried.code.as_str()),
        (204, ""),
        "the ack applied before the session expired: its retry must say so, not 409 lease_lost"
    );
    assert_eq!(ack(&zkq, "q", &acked).await.status, 204, "every retry answers alike");
    assert_eq!(drain(&zkq, "q").await, vec!["held".to_owned()], "the acked message is gone; the held one is back");
}

/// #7a. A nack with a delay keeps the lock until the delay ends; the client's retry of that nack
/// (its first answer lost on the way back) must answer 204 as the first did, not 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_delayed_nack_answers_as_the_first_did() {
    let zk = ZkServer::shared();
    let zkq = TestZkq::start_ready(test_config(zk, &unique_root("evidence-delayed-nack"))).await;
    zkq.put_ok("q", b"M").await;
    let receipt = lease_expecting(&zkq, "q", "M").await;
    let first = nack(&zkq, "q", &receipt, "mode=keep&delay=30s").await;
    assert_eq!((first.status, first.code.as_str()), (204, ""), "the delayed nack");
    let retried = nack(&zkq, "q", &receipt, "mode=keep&delay=30s").await;
    assert_eq!((retried.status, retried.code.as_str()), (204, ""), "its retry answers as it did");
    let other = ack(&zkq, "q", &receipt).await;
    assert_eq!((other.status, other.code.as_str()), (409, "lease_lost"), "another step of the nacked lease");
}

/// #7c. ZooKeeper answers an ack's transaction with SESSIONMOVED (the session lives on; the
/// request was not applied). zkq must resolve it by evidence, not forget the lease: the ack
/// answers 204, the message and the lock are gone (no orphan lock held until a restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_moved_answer_is_resolved_by_evidence_and_leaves_no_orphan_lock() {
    let zk = ZkServer::shared();
    let root = unique_root("evidence-moved");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let zkq = TestZkq::start_ready(config_via(&proxy, &root)).await;
    zkq.put_ok("q", b"M").await;
    let receipt = lease_expecting(&zkq, "q", "M").await;
    let moved = proxy.arm(&[op::MULTI], Fault::AnswerError(SESSION_MOVED));
    let acked = ack(&zkq, "q", &receipt).await;
    assert!(moved.has_fired(), "the ack's transaction was answered SESSIONMOVED");
    assert_eq!((acked.status, acked.code.as_str()), (204, ""), "resolved by evidence, then applied");
    let direct = zk_client(zk).await;
    assert!(children(&direct, &format!("{root}/locks/q")).await.is_empty(), "no lock left behind");
    assert!(drain(&zkq, "q").await.is_empty(), "the message was acked");
}

/// Replaces zkq's lock on the only leased message of `queue` the way a Curator lock-safe
/// consumer can: its guaranteed delete, retried in the background, removes the lock (whatever
/// its version), and when `relock`, a consumer then locks the message under the same name.
/// Returns the lock's path and the other client (whose session holds the new lock).
async fn replace_lock(zk: &ZkServer, root: &str, queue: &str, relock: bool) -> (String, zookeeper_client::Client) {
    let other = zk_client(zk).await;
    let dir = format!("{root}/locks/{queue}");
    let name = children(&other, &dir).await.into_iter().next().expect("zkq's lock");
    let path = format!("{dir}/{name}");
    other.delete(&path, None).await.expect("the retried guaranteed delete");
    if relock {
        let mode = zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
        other.create(&path, b"curator", &mode).await.expect("another consumer's lock");
    }
    (path, other)
}

/// #16. Another consumer holds the message under the same lock name after a retried delete
/// removed zkq's lock. zkq's ack must not delete that lock (nor the message): it answers 409
/// `lease_lost`, and the other consumer's lock and the message stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_never_deletes_a_lock_another_consumer_created_under_the_same_name() {
    let zk = ZkServer::shared();
    let root = unique_root("evidence-relocked");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    zkq.put_ok("q", b"M").await;
    let receipt = lease_expecting(&zkq, "q", "M").await;
    let (lock, other) = replace_lock(zk, &root, "q", true).await;
    let acked = ack(&zkq, "q", &receipt).await;
    assert_eq!((acked.status, acked.code.as_str()), (409, "lease_lost"), "the lease is not ours any more");
    assert_eq!(owner(&other, &lock).await, Some(other.session_id().0), "the other consumer's lock stays");
    let queue = children(&other, &format!("{root}/queues/q")).await;
    assert_eq!(queue.len(), 1, "the message stays for the consumer that holds it");
}

/// #16. The same, for a release (the visibility timeout passed): the reaper must not delete the
/// other consumer's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiry_never_deletes_a_lock_another_consumer_created_under_the_same_name() {
    let zk = ZkServer::shared();
    let root = unique_root("evidence-relocked-expiry");
    let zkq = TestZkq::start_ready(test_config(zk, &root)).await;
    zkq.put_ok("q", b"M").await;
    let leased = lease(&zkq, "q", "wait=5s&visibility=2s").await;
    assert_eq!(leased.status, 200);
    let (lock, other) = replace_lock(zk, &root, "q", true).await;
    eventually(SOON, "the lease expired", || async {
        zkq.metrics().await.contains("zkq_leases_in_flight{queue=\"q\"} 0")
    })
    .await;
    assert_eq!(owner(&other, &lock).await, Some(other.session_id().0), "the other consumer's lock stays");
}

/// #16. A retried delete removed zkq's lock; zkq's ack then fails for want of its lock and the
/// answer is lost. "Our lock is gone" must not be read as "our ack applied": the message is
/// still there, so the ack answers 409 `lease_lost` and the message is delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_ack_answer_is_not_judged_applied_because_someone_else_deleted_the_lock() {
    let zk = ZkServer::shared();
    let root = unique_root("evidence-lock-deleted");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let zkq = TestZkq::start_ready(config_via(&proxy, &root)).await;
    zkq.put_ok("q", b"M").await;
    let receipt = lease_expecting(&zkq, "q", "M").await;
    let _ = replace_lock(zk, &root, "q", false).await;
    let lost = proxy.arm(&[op::MULTI], Fault::DropAnswer);
    let acked = ack(&zkq, "q", &receipt).await;
    assert!(lost.has_fired(), "the ack's answer was lost");
    assert_eq!((acked.status, acked.code.as_str()), (409, "lease_lost"), "the ack did not apply");
    assert_eq!(drain(&zkq, "q").await, vec!["M".to_owned()], "the message is delivered again");
}

/// #7b. An ack applied but its client never saw the answer; the dynamic queue then closed idle.
/// The late retry must answer 204 (the remembered completion outlives the queue), not 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_retry_of_an_ack_after_its_dynamic_queue_closed_answers_204() {
    let zk = ZkServer::shared();
    let mut config = test_config(zk, &unique_root("evidence-idle-close"));
    config.queue_idle_close = Duration::from_secs(1);
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("dq", b"M").await;
    let receipt = lease_expecting(&zkq, "dq", "M").await;
    assert_eq!(ack(&zkq, "dq", &receipt).await.status, 204, "the ack (its answer lost to the client)");
    eventually(SOON, "the idle dynamic queue closed", || async { !zkq.metrics().await.contains("queue=\"dq\"") }).await;
    let retried = ack(&zkq, "dq", &receipt).await;
    assert_eq!((retried.status, retried.code.as_str()), (204, ""), "a late retry of an applied ack");
}

/// #7b, through a lost answer: the ack answers 504, its outcome is settled by zkq itself (the
/// reaper, at the lease's expiry), and the queue closes idle before the client retries. The
/// retry must answer 204, not 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_retry_of_a_504_ack_after_its_dynamic_queue_closed_answers_204() {
    let zk = ZkServer::shared();
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let mut config = config_via(&proxy, &unique_root("evidence-idle-close-504"));
    config.queue_idle_close = Duration::from_secs(1);
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("dq", b"M").await;
    let leased = lease(&zkq, "dq", "wait=5s&visibility=2s").await;
    assert_eq!(leased.status, 200);
    let lost = proxy.arm_then_refuse(&[op::MULTI], Fault::DropAnswer);
    let first = ack(&zkq, "dq", &leased.receipt).await;
    assert!(lost.has_fired(), "the ack's transaction reached ZooKeeper ({} {})", first.status, first.code);
    assert!(matches!(first.status, 503 | 504), "first ack: {} {}", first.status, first.code);
    proxy.refuse(false);
    eventually(SOON, "the idle dynamic queue closed", || async { !zkq.metrics().await.contains("queue=\"dq\"") }).await;
    let retried = ack(&zkq, "dq", &leased.receipt).await;
    assert_eq!((retried.status, retried.code.as_str()), (204, ""), "a late retry of an ack that applied");
    assert_eq!(zkq.take("dq", "0s").await.status().as_u16(), 204, "the message was acked");
}
