//! Exactly-once through lost ZooKeeper answers: deterministic faults placed with the proxy
//! (`proxy.rs`) on one zkq's connection, and quorum loss on a three-server ensemble.
//!
//! Each test describes what a user must see: no message handed to two consumers, none lost, no
//! lock left behind that nobody holds, a retried ack that did apply answering 204.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use zkq::config::{Config, QueueKind};

use crate::ensemble::ZkEnsemble;
use zkq_testkit::proxy::{Fault, ZkProxy, op};
use zkq_testkit::*;

/// A generous bound for anything that should happen "soon" on a loaded 2-core machine.
const SOON: Duration = Duration::from_secs(30);

/// Config of the zkq behind the proxy: a long session, so a held request or a refused
/// reconnect of a few seconds keeps the same session (and its locks).
fn config_via(proxy: &ZkProxy, root: &str) -> Config {
    let mut config = test_config(proxy, root);
    config.zookeeper.session_timeout = Duration::from_secs(20);
    config
}

/// Now, in milliseconds since the epoch (what lease expiries are given in).
fn epoch_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Creates `path` and its parents (persistent, open ACL), ignoring those that exist.
async fn ensure_path(client: &zookeeper_client::Client, path: &str) {
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    client.mkdir(path, &options).await.expect("mkdir");
}

/// Puts, leases and acks one message through `direct` so the queue, lock and delivery
/// directories exist, then opens the queue in `faulty` (an empty take), so that none of their
/// creation is the write a fault is armed for, and `faulty` proposes no stale candidate.
async fn warm_up(faulty: &TestZkq, direct: &TestZkq, queue: &str) {
    direct.put_ok(queue, b"warm-up").await;
    let leased = direct.client().lease(queue, "wait=5s").await;
    assert_eq!((leased.status, text(&leased.body).as_str()), (200, "warm-up"), "warm-up lease");
    assert_eq!(direct.client().ack(queue, &leased.receipt).await.status, 204, "warm-up ack");
    assert_eq!(faulty.client().take(queue, "wait=0").await.status, 204, "the queue is open and empty");
}

/// The locks under `dir` with their owner sessions.
async fn locks_with_owners(client: &zookeeper_client::Client, dir: &str) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for name in children(client, dir).await {
        if let Ok(Some(stat)) = client.check_stat(&format!("{dir}/{name}")).await {
            out.push((name, stat.ephemeral_owner));
        }
    }
    out
}

/// Takes from every zkq until all answer 204; returns the bodies.
async fn drain(zkqs: &[&TestZkq], queue: &str) -> Vec<String> {
    let mut got = Vec::new();
    loop {
        let mut any = false;
        for zkq in zkqs {
            let taken = zkq.client().take(queue, "wait=1s").await;
            match taken.status {
                200 => {
                    got.push(text(&taken.body));
                    any = true;
                },
                204 => {},
                other => panic!("take while draining answered {other} {}", taken.code),
            }
        }
        if !any {
            return got;
        }
    }
}

/// How the other consumer gets the message while A's claim is held.
#[derive(Debug, Clone, Copy)]
enum Other {
    Takes,
    LeasesAndAcks,
}

/// a, b. Consumer A's take claim is held at the proxy; meanwhile consumer B (on another zkq)
/// gets the message, by a take or by a lease and its ack; then A's claim is applied-and-failed in
/// ZooKeeper with its answer lost. A must not conclude from the missing node that its claim
/// applied: it answers 204 after its wait (or 503/504), never 200 with the message B has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_whose_lost_claim_failed_does_not_return_a_message_another_consumer_got() {
    for other in [Other::Takes, Other::LeasesAndAcks] {
        let zk = ZkServer::shared();
        let root = unique_root("eo-take-other");
        let proxy = ZkProxy::start(&zk.connect_string()).await;
        let a = TestZkq::start_ready(config_via(&proxy, &root)).await;
        let b = TestZkq::start_ready(test_config(zk, &root)).await;
        warm_up(&a, &b, "q").await;
        b.put_ok("q", b"M").await;

        let held = proxy.arm(&[op::MULTI], Fault::Hold);
        let client = a.client();
        let take_a = tokio::spawn(async move { client.take("q", "wait=5s").await });
        tokio::time::timeout(SOON, held.held()).await.expect("A's claim reached the proxy");
        match other {
            Other::Takes => {
                let taken = b.client().take("q", "wait=5s").await;
                assert_eq!((taken.status, taken.text().as_str()), (200, "M"), "B takes M while A's claim is held");
            },
            Other::LeasesAndAcks => {
                let leased = b.client().lease("q", "wait=5s&visibility=30s").await;
                assert_eq!((leased.status, leased.text().as_str()), (200, "M"), "B leases M while A's claim is held");
                assert_eq!(b.client().ack("q", &leased.receipt).await.status, 204, "B acks M");
            },
        }
        held.release_drop_answer();

        let taken_a = take_a.await.expect("join");
        assert!(
            !(taken_a.status == 200 && taken_a.body == b"M"),
            "duplicate ({other:?}): A's take answered 200 with M although B got M (A's claim failed; its answer was lost)"
        );
        assert!(matches!(taken_a.status, 204 | 503 | 504), "A's take ({other:?}): {} {}", taken_a.status, taken_a.code);
    }
}

/// c. With two of three servers killed there is no quorum: a take and a lease must say so
/// (503 `zookeeper_unavailable` with `Retry-After`) within max(wait, request timeout) plus a
/// margin, not pretend the queue is empty. Once the servers are back every message is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quorum_take_and_lease_answer_503_not_an_empty_queue() {
    let ensemble = tokio::task::block_in_place(ZkEnsemble::start);
    let root = unique_root("eo-quorum");
    let config = test_config(&ensemble, &root);
    let request_timeout = config.zookeeper.request_timeout;
    let zkq = TestZkq::start_ready(config).await;
    let bodies: Vec<String> = (0..5).map(|i| format!("m{i}")).collect();
    for body in &bodies {
        zkq.put_ok("q", body.as_bytes()).await;
    }
    // A fencing token before the election that follows, to compare with one after it.
    let before = zkq.client().lease("q", "wait=5s&visibility=60s").await;
    assert_eq!(zkq.client().ack("q", &before.receipt).await.status, 204);
    let mut delivered = vec![before.text()];
    tokio::task::block_in_place(|| {
        ensemble.kill(0);
        ensemble.kill(1);
    });
    eventually(SOON, "zkq notices it has no ZooKeeper", || async { zkq.readyz().await.0 == 503 }).await;

    let wait = Duration::from_secs(1);
    let bound = wait.max(request_timeout) + Duration::from_secs(5);
    for what in ["take", "lease"] {
        let started = Instant::now();
        let got = match what {
            "take" => zkq.client().take("q", "wait=1s").await,
            _ => zkq.client().lease("q", "wait=1s").await,
        };
        let took = started.elapsed();
        assert_eq!(
            (got.status, got.code.as_str()),
            (503, "zookeeper_unavailable"),
            "{what} without quorum answered {} {:?} after {took:?}, as if the queue were empty",
            got.status,
            got.code
        );
        assert!(got.retry_after, "{what}: 503 without Retry-After");
        assert!(took <= bound, "{what} answered after {took:?} (bound {bound:?})");
    }

    tokio::task::block_in_place(|| {
        ensemble.restart(0);
        ensemble.restart(1);
        ensemble.wait_quorum();
    });
    zkq.wait_ready().await;
    // A lease under the new leader: a larger fencing token, of a later epoch (a token is
    // zxid × 1024 + place; a zxid's high 32 bits are the epoch).
    let after = zkq.client().lease("q", "wait=5s&visibility=60s").await;
    assert_eq!(after.status, 200);
    let (t1, t2) = (before.fencing_token.expect("token"), after.fencing_token.expect("token"));
    assert!(t2 > t1 && t2 >> 42 > t1 >> 42, "fencing tokens across an election: {t1} then {t2}");
    assert_eq!(zkq.client().ack("q", &after.receipt).await.status, 204);
    delivered.push(after.text());
    let mut got = drain(&[&zkq], "q").await;
    got.extend(delivered);
    got.sort();
    assert_eq!(got, bodies, "every message is still there, once");
}

/// d1. A lease whose lock-taking write is applied but whose answer is lost: whatever the lease
/// answers, no lock is left that the client does not hold a lease for (after the visibility of
/// any lease it got), and the message is delivered again exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_lock_answer_is_lost_leaves_no_untracked_lock() {
    let zk = ZkServer::shared();
    let root = unique_root("eo-lease-lost");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(config_via(&proxy, &root)).await;
    let b = TestZkq::start_ready(test_config(zk, &root)).await;
    warm_up(&a, &b, "q").await;
    b.put_ok("q", b"M").await;

    let lost = proxy.arm(&[op::CREATE, op::CREATE2, op::MULTI], Fault::DropAnswer);
    let leased = a.client().lease("q", "wait=5s&visibility=1s").await;
    assert!(lost.has_fired(), "the fault hit A's lock write (answered {} {})", leased.status, leased.code);
    assert!(leased.status != 200 || leased.body == b"M", "A's lease answered 200 with {:?}", text(&leased.body));
    // A lease granted on its lock's evidence has the fencing token of the transaction that made
    // the lock (a zxid is never 0).
    assert!(leased.status != 200 || leased.fencing_token.is_some_and(|t| t >= 1024), "{:?}", leased.fencing_token);
    let direct = zk_client(zk).await;
    let locks = format!("{root}/locks/q");
    await_no_locks(&direct, &locks, &a, "after A's lease (visibility 1s) ended").await;
    let again = b.client().take("q", "wait=5s").await;
    assert_eq!((again.status, text(&again.body).as_str()), (200, "M"), "M is delivered again");
    assert_eq!(drain(&[&a, &b], "q").await, Vec::<String>::new(), "M is delivered again exactly once");
}

/// d2. A lease's lock lands after another consumer took the message; the lease sees the message
/// gone and releases its lock, but that release is lost on the way. The lock (held by A's live
/// session, of a message that no longer exists) must not stay: today it stays forever and
/// counts as in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_a_message_taken_meanwhile_leaves_no_lock_when_its_release_is_lost() {
    let zk = ZkServer::shared();
    let root = unique_root("eo-lease-gone");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(config_via(&proxy, &root)).await;
    let b = TestZkq::start_ready(test_config(zk, &root)).await;
    warm_up(&a, &b, "q").await;
    b.put_ok("q", b"M").await;

    let held = proxy.arm(&[op::CREATE, op::CREATE2, op::MULTI], Fault::Hold);
    let client = a.client();
    let lease_a = tokio::spawn(async move { client.lease("q", "wait=3s&visibility=1s").await });
    tokio::time::timeout(SOON, held.held()).await.expect("A's lock write reached the proxy");
    let taken = b.client().take("q", "wait=5s").await;
    assert_eq!((taken.status, text(&taken.body).as_str()), (200, "M"), "B takes M while A's lock write is held");
    // The next write A sends (today: the delete of the lock it finds useless) never arrives.
    let _lost = proxy.arm(&[op::DELETE, op::MULTI], Fault::DropBeforeSend);
    held.release_deliver();
    let leased = lease_a.await.expect("join");
    assert_ne!(leased.status, 200, "A leased M although B took it: {:?}", text(&leased.body));
    proxy.disarm_all();

    let direct = zk_client(zk).await;
    await_no_locks(&direct, &format!("{root}/locks/q"), &a, "after B took M and A's lease ended").await;
}

/// Waits until `dir` holds no lock; on timeout panics with the locks, their owners and what
/// `GET /v1/queues/q` reports as in flight.
async fn await_no_locks(direct: &zookeeper_client::Client, dir: &str, zkq: &TestZkq, when: &str) {
    let deadline = Instant::now() + SOON;
    loop {
        let locks = locks_with_owners(direct, dir).await;
        if locks.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            let info: serde_json::Value =
                zkq.http.get(zkq.url("/v1/queues/q")).send().await.expect("info").json().await.unwrap_or_default();
            let session = zkq.running.as_ref().map(|r| r.session.status().session_id).unwrap_or_default();
            panic!(
                "a lock nobody holds a lease for stayed {SOON:?} {when}: {locks:?} (A's session {session:#x}); \
                 in_flight reported: {}",
                info["in_flight"]
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// e. A's lease expires; the reaper's release (delete of A's lock) applies but its answer is
/// lost and A cannot reconnect for a while; meanwhile B leases the message (a new lock, B's).
/// When A is back, its release must be settled by evidence, not retried blindly: B's lock stays,
/// and A cannot lease the message B holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_release_never_deletes_another_consumers_fresh_lock() {
    let zk = ZkServer::shared();
    let root = unique_root("eo-fence");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(config_via(&proxy, &root)).await;
    let b = TestZkq::start_ready(test_config(zk, &root)).await;
    warm_up(&a, &b, "q").await;
    b.put_ok("q", b"M").await;
    let direct = zk_client(zk).await;

    let leased = a.client().lease("q", "wait=5s&visibility=1s").await;
    assert_eq!((leased.status, text(&leased.body).as_str()), (200, "M"), "A leases M");
    let lock = format!("{root}/locks/q/{}", leased.id);
    assert!(direct.check_stat(&lock).await.expect("stat").is_some(), "A's lock is {lock}");
    let lost = proxy.arm_then_refuse(&[op::DELETE, op::MULTI], Fault::DropAnswer);
    tokio::time::timeout(SOON, lost.fired()).await.expect("A's release of the expired lease was sent");
    eventually(SOON, "A's lock is gone", || async { direct.check_stat(&lock).await.expect("stat").is_none() }).await;

    let leased_b = b.client().lease("q", "wait=5s&visibility=60s").await;
    assert_eq!((leased_b.status, text(&leased_b.body).as_str()), (200, "M"), "B leases M");
    let owner_b = direct.check_stat(&lock).await.expect("stat").expect("B's lock").ephemeral_owner;
    proxy.refuse(false);
    a.wait_ready().await;
    eventually(SOON, "A has no lease left", || async {
        a.metrics().await.contains("zkq_leases_in_flight{queue=\"q\"} 0")
    })
    .await;
    let owner = direct.check_stat(&lock).await.expect("stat").map(|s| s.ephemeral_owner);
    assert_eq!(
        owner,
        Some(owner_b),
        "B's lock on M must still be there, owned by B's session {owner_b:#x}: A's retried release deleted it"
    );
    let again = a.client().lease("q", "wait=1s").await;
    assert_eq!(again.status, 204, "A leased M while B holds it: {:?}", text(&again.body));
}

/// A zkq (A, behind `proxy`) and a direct one (B) on a Curator queue with a lock path, with the
/// lock directory in place.
async fn curator_queue_pair(zk: &ZkServer, proxy: &ZkProxy, root: &str) -> (TestZkq, TestZkq, String) {
    let path = format!("{root}/app/q");
    let locks = format!("{root}/app/locks");
    let direct = zk_client(zk).await;
    ensure_path(&direct, &locks).await;
    let mut config_a = config_via(proxy, root);
    let mut config_b = test_config(zk, root);
    declare(&mut config_a, "q", QueueKind::Fifo, Some(&path), Some(&locks));
    declare(&mut config_b, "q", QueueKind::Fifo, Some(&path), Some(&locks));
    let a = TestZkq::start_ready(config_a).await;
    let b = TestZkq::start_ready(config_b).await;
    (a, b, path)
}

/// f. A takes the first item of a Curator putMulti node; the claim applies (the node keeps "b"
/// and "c") but its answer is lost and A cannot reconnect; B takes "b" and "c", which deletes
/// the node. Every item must be delivered exactly once: "a" by A's take, or afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_claim_on_a_put_multi_node_loses_no_item() {
    let zk = ZkServer::shared();
    let root = unique_root("eo-multi-take");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let path = format!("{root}/app/q");
    Curator::run(zk, &["putmulti", "fifo", &path, "61", "62", "63"]).await;
    let (a, b, _) = curator_queue_pair(zk, &proxy, &root).await;

    let lost = proxy.arm_then_refuse(&[op::MULTI], Fault::DropAnswer);
    let client = a.client();
    let take_a = tokio::spawn(async move { client.take("q", "wait=2s").await });
    tokio::time::timeout(SOON, lost.fired()).await.expect("A's claim was sent");
    let mut seen: HashMap<String, u32> = HashMap::new();
    // B takes the other two (in either order: with another consumer at work, takers spread).
    for _ in 0..2 {
        let taken = b.client().take("q", "wait=5s").await;
        assert_eq!(taken.status, 200, "B takes one of b, c");
        let body = text(&taken.body);
        assert!(body == "b" || body == "c", "B took {body:?}");
        *seen.entry(body).or_default() += 1;
    }
    proxy.refuse(false);
    let taken_a = take_a.await.expect("join");
    if taken_a.status == 200 {
        assert_eq!(text(&taken_a.body), "a", "A's take");
        *seen.entry("a".to_owned()).or_default() += 1;
    }
    a.wait_ready().await;
    // A message whose claim outcome was unknown may come back a moment later.
    let deadline = Instant::now() + SOON;
    while !seen.contains_key("a") && Instant::now() < deadline {
        for zkq in [&a, &b] {
            let taken = zkq.client().take("q", "wait=1s").await;
            if taken.status == 200 {
                *seen.entry(text(&taken.body)).or_default() += 1;
            }
        }
    }
    for body in drain(&[&a, &b], "q").await {
        *seen.entry(body).or_default() += 1;
    }
    let expected: HashMap<String, u32> = ["a", "b", "c"].iter().map(|s| ((*s).to_owned(), 1)).collect();
    assert_eq!(seen, expected, "each item of the putMulti node delivered exactly once (A's take: {})", taken_a.status);
}

/// g. A leases "a" of a putMulti node ["a","b"]; the ack applies but its answer is lost and A
/// cannot reconnect until the ack has answered 503/504. Retrying the ack with the same receipt
/// must answer 204 (it did apply), and then "b" is delivered once and "a" never again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_ack_of_a_put_multi_item_that_applied_answers_204() {
    let zk = ZkServer::shared();
    let root = unique_root("eo-multi-ack");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let path = format!("{root}/app/q");
    Curator::run(zk, &["putmulti", "fifo", &path, "61", "62"]).await;
    let (a, b, _) = curator_queue_pair(zk, &proxy, &root).await;

    let leased = a.client().lease("q", "wait=5s&visibility=60s").await;
    assert_eq!((leased.status, text(&leased.body).as_str()), (200, "a"), "A leases a");
    let lost = proxy.arm_then_refuse(&[op::MULTI], Fault::DropAnswer);
    let first = a.client().ack("q", &leased.receipt).await;
    assert!(lost.has_fired(), "the ack's transaction was sent (ack answered {} {})", first.status, first.code);
    proxy.refuse(false);
    if first.status != 204 {
        assert!(matches!(first.status, 503 | 504), "first ack: {} {}", first.status, first.code);
        let deadline = Instant::now() + SOON;
        let retried = loop {
            let retried = a.client().ack("q", &leased.receipt).await;
            if !matches!(retried.status, 503 | 504) || Instant::now() > deadline {
                break retried;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(
            (retried.status, retried.code.as_str()),
            (204, ""),
            "the retried ack of an ack that applied must answer 204"
        );
    }
    let mut rest = drain(&[&a, &b], "q").await;
    rest.sort();
    assert_eq!(rest, ["b"], "b delivered once, a never again");
}

/// h. A's ack applies but its answer is lost and A cannot reconnect; the lease expires meanwhile,
/// so once A is back its reaper finds the ack applied and ends the lease before the client's
/// retry arrives. The retry must still answer 204 (that ack did apply), not 409, and the message
/// is never delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_ack_answers_204_after_the_reaper_found_that_it_applied() {
    let zk = ZkServer::shared();
    let root = unique_root("eo-ack-reaped");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(config_via(&proxy, &root)).await;
    let b = TestZkq::start_ready(test_config(zk, &root)).await;
    warm_up(&a, &b, "q").await;
    b.put_ok("q", b"M").await;

    let leased = a.client().lease("q", "wait=5s&visibility=1s").await;
    assert_eq!((leased.status, text(&leased.body).as_str()), (200, "M"), "A leases M");
    let lost = proxy.arm_then_refuse(&[op::MULTI], Fault::DropAnswer);
    let first = a.client().ack("q", &leased.receipt).await;
    assert!(lost.has_fired(), "the ack's transaction was sent (ack answered {} {})", first.status, first.code);
    assert!(matches!(first.status, 503 | 504), "first ack: {} {}", first.status, first.code);
    // Past the lease's expiry, A comes back and its reaper settles the lease by the evidence.
    let expires_at: i64 = leased.expiry.parse().expect("zkq-lease-expires-at");
    eventually(SOON, "the lease's expiry has passed", || async move { epoch_ms() > expires_at }).await;
    proxy.refuse(false);
    a.wait_ready().await;
    eventually(SOON, "A's reaper ended the lease", || async {
        a.metrics().await.contains("zkq_leases_in_flight{queue=\"q\"} 0")
    })
    .await;
    let retried = a.client().ack("q", &leased.receipt).await;
    assert_eq!(
        (retried.status, retried.code.as_str()),
        (204, ""),
        "the retried ack of an ack that applied must answer 204, even after the lease left the table"
    );
    let again = a.client().ack("q", &leased.receipt).await;
    assert_eq!(again.status, 204, "every retry answers alike");
    assert!(drain(&[&a, &b], "q").await.is_empty(), "M was acked: never delivered again");
}

/// Killing the server zkq is connected to: zkq moves to another server within the same session,
/// so readiness comes back without waiting for the session timeout and a lease taken before the
/// kill is acked afterwards. Prints how long `/readyz` answered 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_connected_server_keeps_the_session_and_its_leases() {
    let ensemble = tokio::task::block_in_place(ZkEnsemble::start);
    let root = unique_root("eo-kill");
    let mut config = test_config(&ensemble, &root);
    config.zookeeper.session_timeout = Duration::from_secs(20);
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("q", b"held").await;
    let leased = zkq.client().lease("q", "wait=5s&visibility=60s").await;
    assert_eq!(leased.status, 200);
    let handle = zkq.running.as_ref().expect("running").session.clone();
    let before = handle.status();
    let session = before.session_id;
    let server = ensemble.server_of_session(session).expect("the server of zkq's session");
    let mut status = handle.subscribe();
    let killed = Instant::now();
    tokio::task::block_in_place(|| ensemble.kill(server));
    // Reconnected: a new epoch, connected again.
    tokio::time::timeout(SOON, status.wait_for(|s| s.epoch > before.epoch && s.state.is_connected()))
        .await
        .expect("zkq reconnected")
        .expect("session alive");
    let not_ready = killed.elapsed();
    zkq.wait_ready().await;
    println!("killing the connected server: /readyz answered 503 for at most {not_ready:?}");
    assert!(not_ready < Duration::from_secs(15), "back before the 20 s session could expire: {not_ready:?}");
    let status = zkq.running.as_ref().expect("running").session.status();
    assert_eq!(status.session_id, session, "the same session, on another server");
    let acked = zkq.client().ack("q", &leased.receipt).await;
    assert_eq!((acked.status, acked.code.as_str()), (204, ""), "a lease survives a server kill");
    assert_eq!(zkq.client().take("q", "wait=0s").await.status, 204);
}

/// A take's claim applies just as its HTTP client gives up, so the message must be put back;
/// zkq is stopped at that very moment. Shutdown waits for the put-back before it closes the
/// session: once `stop` returns, the message is in ZooKeeper again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_the_put_back_of_a_message_whose_taker_left() {
    let zk = ZkServer::shared();
    let root = unique_root("eo-put-back");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let mut config = config_via(&proxy, &root);
    config.shutdown.grace = Duration::from_secs(30); // the proxy delays every reply, pings included
    let a = TestZkq::start_ready(config).await;
    let b = TestZkq::start_ready(test_config(zk, &root)).await;
    warm_up(&a, &b, "q").await;
    a.put_ok("q", b"precious").await;

    let held = proxy.arm(&[op::MULTI], Fault::Hold);
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(500)).build().expect("client");
    let url = a.url("/v1/queues/q/take?wait=5s");
    let gave_up = tokio::spawn(async move { impatient.post(url).send().await.is_err() });
    tokio::time::timeout(SOON, held.held()).await.expect("A's claim was sent");
    assert!(gave_up.await.expect("join"), "the HTTP client gave up while the claim was held");
    // The claim applies; its answer and the put-back's answer come back slowly.
    proxy.delay_replies(Duration::from_millis(300));
    held.release_deliver();
    assert!(a.stop().await, "shutdown finished within its grace");

    let direct = zk_client(zk).await;
    let queue = format!("{root}/queues/q");
    let mut bodies = Vec::new();
    for name in children(&direct, &queue).await {
        let (data, _) = direct.get_data(&format!("{queue}/{name}")).await.expect("data");
        bodies.extend(zkq::envelope::decode(&data).expect("envelope"));
    }
    assert_eq!(bodies, [b"precious".to_vec()], "the message was put back, once");
}

/// A DELETE of a message whose queue's lock directory is missing, while another client creates
/// that directory at that very moment, removes the message: it never answers 404 for a message
/// that exists. (The old code looked at the directory after its transaction failed and, finding
/// it there, called the message missing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_racing_the_lock_directorys_creation_removes_the_message() {
    let zk = ZkServer::shared();
    let root = unique_root("eo-delete-race");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(config_via(&proxy, &root)).await;
    let id = a.put_ok("q", b"doomed").await;
    let direct = zk_client(zk).await;
    let locks = format!("{root}/locks/q");
    // The queue's cache creates the directory when the queue opens; then it is removed by hand.
    eventually(SOON, "the lock directory exists", || async {
        direct.check_stat(&locks).await.ok().flatten().is_some()
    })
    .await;
    direct.delete(&locks, None).await.expect("the lock directory goes");
    // Hold whatever zkq sends after its failed transaction; meanwhile someone creates the directory.
    let held = proxy.arm(&[op::EXISTS, op::CREATE, op::CREATE2, op::CREATE_CONTAINER], Fault::Hold);
    let (http, url) = (a.http.clone(), a.url(&format!("/v1/queues/q/messages/{id}")));
    let delete = tokio::spawn(async move { http.delete(url).send().await.expect("delete").status().as_u16() });
    tokio::time::timeout(SOON, held.held()).await.expect("zkq looked at the directory");
    ensure_path(&direct, &locks).await;
    held.release_deliver();
    assert_eq!(delete.await.expect("join"), 204, "the message exists: it is removed, not reported missing");
    assert!(children(&direct, &format!("{root}/queues/q")).await.is_empty());
}

/// The (message id, body, receipt) of each lease in a `?max=` answer (none unless it is a 200).
async fn leased_many(response: reqwest::Response) -> (u16, Vec<(String, String, String)>) {
    use base64::Engine;
    let status = response.status().as_u16();
    if status != 200 {
        return (status, Vec::new());
    }
    let answer: serde_json::Value = response.json().await.expect("json");
    let leased = answer["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            let body = base64::engine::general_purpose::STANDARD.decode(m["body"].as_str().expect("body"));
            (
                m["message_id"].as_str().expect("id").to_owned(),
                text(&body.expect("base64")),
                m["lease"].as_str().expect("receipt").to_owned(),
            )
        })
        .collect();
    (status, leased)
}

/// Puts `bodies` through `direct` and waits until `faulty` proposes all of them.
async fn put_and_see(faulty: &TestZkq, direct: &TestZkq, bodies: &[&str]) {
    for body in bodies {
        direct.put_ok("q", body.as_bytes()).await;
    }
    eventually(SOON, "the faulty zkq sees every message", || async {
        let info: serde_json::Value =
            faulty.http.get(faulty.url("/v1/queues/q")).send().await.expect("info").json().await.expect("json");
        info["depth"] == bodies.len()
    })
    .await;
}

/// f1. The transaction that leases the messages of a `?max=` lease after the first applies but
/// its answer is lost: the lease settles it by its locks' evidence. Every lock left is the lock
/// of a lease the client got, and every message is delivered exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_many_whose_batch_answer_is_lost_hands_out_exactly_the_locked_messages() {
    let zk = ZkServer::shared();
    let root = unique_root("eo-lease-many-lost");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(config_via(&proxy, &root)).await;
    let b = TestZkq::start_ready(test_config(zk, &root)).await;
    warm_up(&a, &b, "q").await;
    let bodies = ["m0", "m1", "m2", "m3", "m4"];
    put_and_see(&a, &b, &bodies).await;

    // The first message's claim passes; the transaction of the four others applies, its answer lost.
    let _first = proxy.arm(&[op::MULTI], Fault::Pass);
    let lost = proxy.arm(&[op::MULTI], Fault::DropAnswer);
    let url = a.url("/v1/queues/q/leases?max=5&wait=5s&visibility=60s");
    let (status, leased) = leased_many(a.http.post(url).send().await.expect("lease")).await;
    assert!(lost.has_fired(), "the fault hit the batch's transaction (answered {status})");
    assert_eq!(status, 200, "the first message was leased before the fault");
    let mut leased_ids: Vec<String> = leased.iter().map(|(id, ..)| id.clone()).collect();
    leased_ids.sort();
    // Every lock is a lease the client holds (a claim that could not be settled in time is released).
    let direct = zk_client(zk).await;
    let locks = format!("{root}/locks/q");
    eventually(SOON, "the locks are exactly the leases handed out", || async {
        let mut held: Vec<String> = locks_with_owners(&direct, &locks).await.into_iter().map(|(n, _)| n).collect();
        held.sort();
        held == leased_ids
    })
    .await;
    let receipts: Vec<&str> = leased.iter().map(|(_, _, receipt)| receipt.as_str()).collect();
    let acked = a.http.post(a.url("/v1/queues/q/acks")).json(&serde_json::json!({ "leases": receipts })).send().await;
    let acked: serde_json::Value = acked.expect("acks").json().await.expect("json");
    assert!(acked["results"].as_array().expect("results").iter().all(|r| r["status"] == 204), "{acked}");
    let mut got: Vec<String> = leased.into_iter().map(|(_, body, _)| body).collect();
    got.extend(drain(&[&a, &b], "q").await);
    got.sort();
    assert_eq!(got, bodies, "every message exactly once");
}

/// f2. The transaction of a `?max=` lease's other messages is held while another zkq leases one
/// of them; it then fails in ZooKeeper at that message's lock, and its answer is lost. The lease
/// must learn from its own lock that nothing applied (not guess from the nodes), and never hand
/// out the message the other consumer holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_many_whose_lost_batch_failed_hands_out_no_message_another_consumer_holds() {
    let zk = ZkServer::shared();
    let root = unique_root("eo-lease-many-failed");
    let proxy = ZkProxy::start(&zk.connect_string()).await;
    let a = TestZkq::start_ready(config_via(&proxy, &root)).await;
    let b = TestZkq::start_ready(test_config(zk, &root)).await;
    warm_up(&a, &b, "q").await;
    let bodies = ["m0", "m1", "m2", "m3", "m4"];
    put_and_see(&a, &b, &bodies).await;

    let _first = proxy.arm(&[op::MULTI], Fault::Pass);
    let held = proxy.arm(&[op::MULTI], Fault::Hold);
    let (http, url) = (a.http.clone(), a.url("/v1/queues/q/leases?max=5&wait=5s&visibility=60s"));
    let lease_a = tokio::spawn(async move { leased_many(http.post(url).send().await.expect("lease")).await });
    tokio::time::timeout(SOON, held.held()).await.expect("A's batch transaction reached the proxy");
    // B leases the next message A has not locked yet (A holds the first).
    let by_b = b.client().lease("q", "wait=5s&visibility=60s").await;
    assert_eq!(by_b.status, 200, "B leases a message while A's batch is held");
    held.release_drop_answer();
    let (status, leased) = lease_a.await.expect("join");
    assert_eq!(status, 200, "A's first message was leased before the fault");
    assert!(
        leased.iter().all(|(id, ..)| *id != by_b.id),
        "duplicate: A handed out {} which B holds ({leased:?})",
        by_b.id
    );
    // Every lock is B's or a lease A handed out.
    let direct = zk_client(zk).await;
    let locks = format!("{root}/locks/q");
    let mut expected: Vec<String> = leased.iter().map(|(id, ..)| id.clone()).chain([by_b.id.clone()]).collect();
    expected.sort();
    eventually(SOON, "the locks are exactly the leases handed out", || async {
        let mut held: Vec<String> = locks_with_owners(&direct, &locks).await.into_iter().map(|(n, _)| n).collect();
        held.sort();
        held == expected
    })
    .await;
    for (_, _, receipt) in &leased {
        assert_eq!(a.client().ack("q", receipt).await.status, 204, "A acks its leases");
    }
    assert_eq!(b.client().ack("q", &by_b.receipt).await.status, 204, "B acks its lease");
    let mut got: Vec<String> = leased.into_iter().map(|(_, body, _)| body).collect();
    got.push(text(&by_b.body));
    got.extend(drain(&[&a, &b], "q").await);
    got.sort();
    assert_eq!(got, bodies, "every message exactly once");
}
