//! Message groups: within a group, one message in flight at a time and in put order, across
//! every sidecar; across groups, in parallel. What a user sees is checked from the consumers'
//! own log (when each delivery started and ended), never from zkq's state.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use zkq::config::{Config, QueueKind};

use zkq_testkit::*;

/// A generous bound for anything that should happen "soon" on a loaded 2-core machine.
const SOON: Duration = Duration::from_secs(60);

fn grouped_config(zk: &ZkServer, root: &str, queue: &str, kind: QueueKind) -> Config {
    let mut config = test_config(zk, root);
    declare(&mut config, queue, kind, None, None);
    if let Some(declared) = config.queues.get_mut(queue) {
        declared.grouped = true;
    }
    config
}

/// One delivery as its consumer saw it.
#[derive(Debug, Clone)]
struct Delivery {
    group: usize,
    index: usize,
    /// When the consumer sent the request that delivered it: zkq delivered it between this and
    /// `start`.
    sent: Instant,
    /// When the consumer had the message.
    start: Instant,
    /// When it let go of it: just before it sent its ack or nack (a take: at once).
    end: Instant,
    /// Acked or taken: the message is done.
    done: bool,
    consumer: String,
}

/// `g{group}-{index}` back to its numbers.
fn parse_body(body: &[u8]) -> (usize, usize) {
    let text = String::from_utf8_lossy(body);
    let (group, index) = text.trim_start_matches('g').split_once('-').expect("a body of this test");
    (group.parse().expect("group"), index.parse().expect("index"))
}

/// The messages of a `?max=` answer: group, index and lease receipt (none for a take). One answer
/// never holds two messages of a group.
fn batch_answer(json: &serde_json::Value) -> Vec<(usize, usize, Option<String>)> {
    let mut groups = HashSet::new();
    let mut messages = Vec::new();
    for message in json["messages"].as_array().expect("messages") {
        let body =
            base64::engine::general_purpose::STANDARD.decode(message["body"].as_str().expect("body")).expect("base64");
        let (group, index) = parse_body(&body);
        assert!(groups.insert(group), "one ?max= answer held two messages of group {group}");
        messages.push((group, index, message["lease"].as_str().map(str::to_owned)));
    }
    messages
}

/// What a consumer does with the next message it gets.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// Lease, then ack.
    Ack,
    /// `?max=` lease, then an ack each.
    Many,
    /// Lease, then nack (keep): delivered again, first of its group.
    Nack,
    /// Lease with a short visibility and walk away: it expires and is delivered again.
    Expire,
    /// Take: done as it arrives (a take is settled by its answer).
    Take,
    /// `?max=` take.
    TakeMany,
}

const MODES: [Mode; 6] = [Mode::Ack, Mode::Many, Mode::Nack, Mode::Expire, Mode::Take, Mode::TakeMany];

/// Set when a consumer's task panics (an assertion failed): the test stops waiting at once.
struct FailFast(Arc<AtomicBool>);

impl Drop for FailFast {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

/// One consumer's loop: until `stop`, one delivery (or batch) at a time in a mode drawn at random.
async fn consume(
    api: Api,
    queue: String,
    name: String,
    seed: u64,
    log: Arc<Mutex<Vec<Delivery>>>,
    (stop, failed): (Arc<tokio::sync::Notify>, Arc<AtomicBool>),
) {
    let _fail_fast = FailFast(failed);
    let mut rng = StdRng::seed_from_u64(seed);
    let stopped = stop.notified();
    tokio::pin!(stopped);
    loop {
        let mode = MODES[rng.random_range(0..MODES.len())];
        // Rarely fail on purpose, so that most of the run makes progress.
        let mode = match mode {
            Mode::Nack | Mode::Expire if rng.random_range(0..6) != 0 => Mode::Ack,
            other => other,
        };
        let work = async {
            let sent = Instant::now();
            let record = |group, index, start, done| Delivery {
                group,
                index,
                sent,
                start,
                end: Instant::now(),
                done,
                consumer: name.clone(),
            };
            match mode {
                Mode::Take => {
                    let taken = api.take(&queue, "wait=1s").await;
                    if taken.status == 204 {
                        return;
                    }
                    assert_eq!(taken.status, 200, "take: {}", taken.code);
                    let start = Instant::now();
                    let (group, index) = parse_body(&taken.body);
                    log.lock().expect("log").push(Delivery { end: start, ..record(group, index, start, true) });
                },
                Mode::TakeMany => {
                    let answer = api.take(&queue, "wait=1s&max=4").await;
                    if answer.status == 204 {
                        return;
                    }
                    assert_eq!(answer.status, 200, "?max= take: {}", answer.code);
                    let start = Instant::now();
                    for (group, index, _) in batch_answer(&answer.json()) {
                        log.lock().expect("log").push(Delivery { end: start, ..record(group, index, start, true) });
                    }
                },
                Mode::Many => {
                    let answer = api.lease(&queue, "wait=1s&max=4").await;
                    if answer.status == 204 {
                        return;
                    }
                    assert_eq!(answer.status, 200, "?max=: {}", answer.code);
                    let start = Instant::now();
                    for (group, index, receipt) in batch_answer(&answer.json()) {
                        let receipt = receipt.expect("a ?max= lease's receipt");
                        tokio::task::yield_now().await;
                        log.lock().expect("log").push(record(group, index, start, true));
                        let acked = api.ack(&queue, &receipt).await;
                        assert_eq!(acked.status, 204, "ack of a ?max= lease: {}", acked.code);
                    }
                },
                Mode::Ack | Mode::Nack | Mode::Expire => {
                    let visibility = if matches!(mode, Mode::Expire) { "1s" } else { "30s" };
                    let leased = api.lease(&queue, &format!("wait=1s&visibility={visibility}")).await;
                    if leased.status == 204 {
                        return;
                    }
                    assert_eq!(leased.status, 200, "lease: {}", leased.code);
                    let start = Instant::now();
                    let (group, index) = parse_body(&leased.body);
                    // "Processing".
                    tokio::time::sleep(Duration::from_millis(rng.random_range(0..5))).await;
                    match mode {
                        Mode::Expire => {
                            // Walked away: the message stays in flight until its lease expires, so
                            // its end is not known here; the next delivery proves it ended.
                            log.lock()
                                .expect("log")
                                .push(Delivery { end: start, ..record(group, index, start, false) });
                        },
                        Mode::Nack => {
                            log.lock().expect("log").push(record(group, index, start, false));
                            // No mode: on a grouped queue a nack keeps the message's place.
                            let nacked = api.nack(&queue, &leased.receipt, "").await;
                            assert_eq!(nacked.status, 204, "nack: {}", nacked.code);
                        },
                        _ => {
                            log.lock().expect("log").push(record(group, index, start, true));
                            let acked = api.ack(&queue, &leased.receipt).await;
                            assert_eq!(acked.status, 204, "ack: {}", acked.code);
                        },
                    }
                },
            }
        };
        tokio::select! {
            _ = work => {},
            _ = &mut stopped => return,
        }
    }
}

/// Checks the consumers' log: per group, every message done exactly once and in put order, and
/// no delivery of a group started before the one before it ended.
fn check(log: &[Delivery], groups: usize, per_group: usize) {
    let mut by_group: BTreeMap<usize, Vec<&Delivery>> = BTreeMap::new();
    for delivery in log {
        by_group.entry(delivery.group).or_default().push(delivery);
    }
    assert_eq!(by_group.len(), groups, "every group was delivered");
    for (group, mut deliveries) in by_group {
        deliveries.sort_by_key(|d| d.start);
        // zkq delivered each message somewhere between its request and its answer, so two
        // deliveries whose spans overlap may have come in either order: a consumer descheduled
        // between the end of its take's answer and reading the clock sees it late. Such a pair is
        // put in the order that agrees with the puts; only an order no timing explains fails.
        let mut done_order: Vec<&Delivery> = deliveries.iter().filter(|d| d.done).copied().collect();
        let mut swapped = true;
        while swapped {
            swapped = false;
            for i in 1..done_order.len() {
                let (x, y) = (done_order[i - 1], done_order[i]);
                if x.index > y.index && x.sent <= y.start && y.sent <= x.start {
                    done_order.swap(i - 1, i);
                    swapped = true;
                }
            }
        }
        let done: Vec<usize> = done_order.iter().map(|d| d.index).collect();
        assert_eq!(done, (0..per_group).collect::<Vec<_>>(), "group {group}: done in put order, each once");
        for pair in deliveries.windows(2) {
            let (before, after) = (pair[0], pair[1]);
            assert!(
                after.start >= before.end,
                "group {group}: message {} ({}) was delivered to {} while message {} was still with {}",
                after.index,
                if after.done { "done" } else { "failed" },
                after.consumer,
                before.index,
                before.consumer,
            );
            // A failed delivery comes back first of its group: the next delivery is the same message.
            if !before.done {
                assert_eq!(after.index, before.index, "group {group}: a failed message kept its place");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_sidecars_deliver_each_group_in_put_order_one_at_a_time() {
    let zk = ZkServer::shared();
    let root = unique_root("groups");
    let queue = "orders";
    let mut zkqs = Vec::new();
    for _ in 0..3 {
        zkqs.push(TestZkq::start(grouped_config(zk, &root, queue, QueueKind::Fifo)).await);
    }
    // 100 groups, puts interleaved across groups and sidecars (batches of 20 spread over groups).
    let (groups, per_group) = (100, 5);
    for index in 0..per_group {
        for chunk in 0..groups / 20 {
            let messages: Vec<serde_json::Value> = (chunk * 20..chunk * 20 + 20)
                .map(|group| serde_json::json!({ "text": format!("g{group}-{index}"), "group": format!("customer-{group}") }))
                .collect();
            let putter = &zkqs[(index + chunk) % zkqs.len()];
            let put = putter.client().batch_put(queue, "", &serde_json::json!({ "messages": messages })).await;
            assert_eq!(put.status, 201, "batch put: {}", put.text());
        }
    }
    let log = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(tokio::sync::Notify::new());
    let failed = Arc::new(AtomicBool::new(false));
    let mut consumers = tokio::task::JoinSet::new();
    for (z, zkq) in zkqs.iter().enumerate() {
        for c in 0..4 {
            let name = format!("zkq{z}/consumer{c}");
            let seed = (z * 10 + c) as u64;
            let signals = (stop.clone(), failed.clone());
            consumers.spawn(consume(zkq.client(), queue.to_owned(), name, seed, log.clone(), signals));
        }
    }
    let total = groups * per_group;
    eventually(SOON * 3, "every message is done (or a consumer failed)", || {
        let done = log.lock().expect("log").iter().filter(|d| d.done).count();
        let failed = failed.load(Ordering::SeqCst);
        async move { done >= total || failed }
    })
    .await;
    stop.notify_waiters();
    while let Some(joined) = consumers.join_next().await {
        joined.expect("a consumer panicked");
    }
    let log = log.lock().expect("log").clone();
    check(&log, groups, per_group);
    let failed = log.iter().filter(|d| !d.done).count();
    assert!(failed > 0, "the run nacked or abandoned some deliveries");
    for zkq in &zkqs {
        assert_eq!(zkq.client().take(queue, "wait=0").await.status, 204, "nothing is left");
    }
}

#[tokio::test]
async fn a_busy_group_holds_back_only_itself() {
    let zk = ZkServer::shared();
    let root = unique_root("groups-busy");
    let queue = "orders";
    let zkq = TestZkq::start(grouped_config(zk, &root, queue, QueueKind::Fifo)).await;
    let api = zkq.client();
    for (group, body) in [("a", "a0"), ("a", "a1"), ("b", "b0"), ("a", "a2"), ("b", "b1")] {
        assert_eq!(api.put(queue, &format!("group={group}"), body.as_bytes()).await.status, 201);
    }
    let a0 = api.lease(queue, "wait=5s").await;
    assert_eq!(a0.text(), "a0", "the first message in put order");
    let b0 = api.lease(queue, "wait=5s").await;
    assert_eq!(b0.text(), "b0", "a1 waits behind a0; b0 is delivered at once");
    assert_eq!(api.lease(queue, "wait=0").await.status, 204, "both groups are busy: nothing else is deliverable");
    let info = api.info(queue).await.json();
    assert_eq!(info["grouped"], true);
    assert_eq!(info["groups"]["groups"], 2);
    assert_eq!(info["groups"]["in_flight"], 2);
    assert_eq!(info["groups"]["blocked_messages"], 3);
    let metrics = zkq.metrics().await;
    assert_eq!(metric_value(&metrics, &format!("zkq_queue_groups_in_flight{{queue=\"{queue}\"}}")), Some(2.0));
    assert_eq!(metric_value(&metrics, &format!("zkq_queue_group_blocked_messages{{queue=\"{queue}\"}}")), Some(3.0));

    // A requeue to the tail would leave the group's order: refused, and the lease is still held.
    let requeue = api.nack(queue, &a0.receipt, "mode=requeue").await;
    assert_eq!((requeue.status, requeue.code.as_str()), (409, "parameter_not_for_kind"));
    // A nack without a mode keeps the message first of its group.
    assert_eq!(api.nack(queue, &a0.receipt, "").await.status, 204);
    let again = api.lease(queue, "wait=5s").await;
    assert_eq!((again.text().as_str(), again.deliveries), ("a0", Some(2)), "a0 again, not a1");
    assert_eq!(api.ack(queue, &again.receipt).await.status, 204);
    // A take settles at once; the group moves on.
    let taken = api.take(queue, "wait=5s").await;
    assert_eq!(taken.text(), "a1");
    let a2 = api.lease(queue, "wait=5s").await;
    assert_eq!(a2.text(), "a2", "a1 was taken, so a2 is next (b is still busy with b0)");
    assert_eq!(api.ack(queue, &b0.receipt).await.status, 204);
    assert_eq!(api.take(queue, "wait=5s").await.text(), "b1");
    assert_eq!(api.ack(queue, &a2.receipt).await.status, 204);
    assert_eq!(api.take(queue, "wait=0").await.status, 204);
}

#[tokio::test]
async fn an_expired_lease_keeps_its_place_and_poison_moves_the_group_on() {
    let zk = ZkServer::shared();
    let root = unique_root("groups-poison");
    let queue = "orders";
    let mut config = grouped_config(zk, &root, queue, QueueKind::Id);
    if let Some(declared) = config.queues.get_mut(queue) {
        declared.max_deliveries = Some(2);
        declared.dead_letter = Some("orders-dead".parse().expect("name"));
    }
    let zkq = TestZkq::start(config).await;
    let api = zkq.client();
    // On an id queue the id is the group; `group` may say it too.
    assert_eq!(api.put(queue, "id=c1", b"c1-0").await.status, 201);
    assert_eq!(api.put(queue, "group=c1", b"c1-1").await.status, 201);
    let differ = api.put(queue, "id=c1&group=c2", b"x").await;
    assert_eq!((differ.status, differ.code.as_str()), (400, "invalid_parameter"));
    for attempt in 1..=2 {
        let leased = api.lease(queue, "wait=5s&visibility=1s").await;
        assert_eq!((leased.text().as_str(), leased.deliveries), ("c1-0", Some(attempt)), "expired: first again");
    }
    // Past max_deliveries it moves to the dead-letter queue, and its group moves on.
    let next = api.lease(queue, "wait=10s").await;
    assert_eq!(next.text(), "c1-1");
    assert_eq!(api.ack(queue, &next.receipt).await.status, 204);
    assert_eq!(api.take("orders-dead", "wait=5s").await.text(), "c1-0");
}

#[tokio::test]
async fn group_is_refused_where_it_means_nothing() {
    let zk = ZkServer::shared();
    let root = unique_root("groups-refused");
    let mut config = grouped_config(zk, &root, "grouped", QueueKind::Fifo);
    declare(&mut config, "plain", QueueKind::Fifo, None, None);
    let zkq = TestZkq::start(config).await;
    let api = zkq.client();
    let plain = api.put("plain", "group=a", b"x").await;
    assert_eq!((plain.status, plain.code.as_str()), (409, "parameter_not_for_kind"));
    let id = api.put("grouped", "id=a", b"x").await;
    assert_eq!((id.status, id.code.as_str()), (409, "parameter_not_for_kind"), "a fifo queue has no id");
    let bad = api.put("grouped", "group=%01", b"x").await;
    assert_eq!(bad.status, 400, "{}", bad.text());
    let multi = serde_json::json!({ "messages": [{ "text": "x", "group": "a" }] });
    let refused = api.batch_put("grouped", "format=curator-multi", &multi).await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    // Ungrouped messages on a grouped queue wait for nothing.
    assert_eq!(api.put("grouped", "", b"u0").await.status, 201);
    assert_eq!(api.put("grouped", "", b"u1").await.status, 201);
    let u0 = api.lease("grouped", "wait=5s").await;
    assert_eq!(u0.text(), "u0");
    assert_eq!(api.take("grouped", "wait=5s").await.text(), "u1", "no group: not held back by u0");
    assert_eq!(api.ack("grouped", &u0.receipt).await.status, 204);
    assert_eq!(api.put("grouped", "", b"u2").await.status, 201);
    let requeue = api.lease("grouped", "wait=5s").await;
    assert_eq!(api.nack("grouped", &requeue.receipt, "mode=requeue").await.status, 204, "no group: requeue is fine");
    // No mode on a plain queue still requeues.
    assert_eq!(api.put("plain", "", b"p").await.status, 201);
    let p = api.lease("plain", "wait=5s").await;
    assert_eq!(api.nack("plain", &p.receipt, "").await.status, 204);
    let again = api.lease("plain", "wait=5s").await;
    assert_eq!(again.text(), "p");
    assert_ne!(again.id, p.id, "requeued: a new node at the tail");
}

/// One delivery under faults, as its consumer saw it.
#[derive(Debug, Clone)]
struct Held {
    group: usize,
    index: usize,
    start: Instant,
    /// Just before the first attempt of its ack or nack.
    end: Instant,
    /// Acked (204) or taken (200): done, and held until `end` at least.
    done: bool,
    /// The message's id, and how it was consumed.
    id: String,
    how: &'static str,
}

/// Puts `g{group}-{index}` to each of its groups in turn, each group in index order, until
/// `stop`. A 503 or a refused request is sent again (nothing reached ZooKeeper); a 504 is neither
/// confirmed nor sent again (stored or not, it was stored before the group's next put).
async fn group_putter(
    api: Api,
    groups: Vec<usize>,
    confirmed: Arc<Mutex<HashSet<(usize, usize)>>>,
    stop: Arc<AtomicBool>,
) {
    let mut next = vec![0usize; groups.len()];
    'puts: while !stop.load(Ordering::SeqCst) {
        for (slot, group) in groups.iter().enumerate() {
            let index = next[slot];
            next[slot] += 1;
            loop {
                let query = format!("group=customer-{group}");
                match api
                    .try_send(
                        reqwest::Method::POST,
                        &format!("/v1/queues/jobs/messages?{query}"),
                        Some(format!("g{group}-{index}").into_bytes()),
                    )
                    .await
                {
                    Ok(answer) if answer.status == 201 => {
                        confirmed.lock().expect("lock").insert((*group, index));
                        break;
                    },
                    Ok(answer) if answer.status == 503 => {
                        if stop.load(Ordering::SeqCst) {
                            break 'puts;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    },
                    Ok(answer) if answer.status == 504 => break,
                    Ok(answer) => panic!("put answered {} {}", answer.status, answer.code),
                    // The request may have reached zkq: its outcome is unknown, like a 504.
                    Err(_) => break,
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sends a lease step until it answers something other than 503/504 (for 20 s at most).
async fn settle(api: &Api, method: reqwest::Method, path: &str) -> u16 {
    let started = Instant::now();
    loop {
        match api.try_send(method.clone(), path, None).await.map(|a| a.status) {
            Ok(503 | 504) | Err(_) if started.elapsed() < Duration::from_secs(20) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            },
            Ok(status) => return status,
            Err(_) => return 0,
        }
    }
}

/// One of a faulty consumer's deliveries: body, lease receipt (none for a take), message id.
type Got = (Vec<u8>, Option<String>, String);

/// Leases or takes (one, or `?max=3`), acks or (now and then) nacks, until `stop`.
async fn faulty_consumer(api: Api, seed: u64, log: Arc<Mutex<Vec<Held>>>, stop: Arc<AtomicBool>) {
    let mut rng = StdRng::seed_from_u64(seed);
    while !stop.load(Ordering::SeqCst) {
        let take = rng.random_bool(0.3);
        let max = if rng.random_bool(0.3) { "&max=3" } else { "" };
        let path = if take {
            format!("/v1/queues/jobs/take?wait=1s{max}")
        } else {
            format!("/v1/queues/jobs/leases?wait=1s&visibility=5s{max}")
        };
        let Ok(answer) = api.try_send(reqwest::Method::POST, &path, None).await.filter_status(200) else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let start = Instant::now();
        let got: Vec<Got> = if max.is_empty() {
            vec![(answer.body.clone(), (!take).then(|| answer.receipt.clone()), answer.id.clone())]
        } else {
            answer.json()["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| {
                    let body = base64::engine::general_purpose::STANDARD
                        .decode(m["body"].as_str().unwrap_or(""))
                        .expect("base64");
                    let id = m["message_id"].as_str().unwrap_or("").to_owned();
                    (body, m["lease"].as_str().map(str::to_owned), id)
                })
                .collect()
        };
        for (body, receipt, id) in got {
            let (group, index) = parse_body(&body);
            let Some(receipt) = receipt else {
                // A take is done as it arrives.
                let how = if max.is_empty() { "take" } else { "take ?max=" };
                log.lock().expect("log").push(Held { group, index, start, end: start, done: true, id, how });
                continue;
            };
            let nack = rng.random_range(0..10) == 0;
            let end = Instant::now();
            let path = if nack {
                format!("/v1/queues/jobs/leases/{receipt}/nack")
            } else {
                format!("/v1/queues/jobs/leases/{receipt}")
            };
            let method = if nack { reqwest::Method::POST } else { reqwest::Method::DELETE };
            let status = settle(&api, method, &path).await;
            // 409 lease_lost (expired, session lost): delivered again; it proves nothing here.
            let done = !nack && status == 204;
            if nack || done {
                let how = match (nack, max.is_empty()) {
                    (true, _) => "lease, nack",
                    (false, true) => "lease, ack",
                    (false, false) => "lease ?max=, ack",
                };
                log.lock().expect("log").push(Held { group, index, start, end, done, id, how });
            }
        }
    }
}

trait FilterStatus {
    fn filter_status(self, status: u16) -> Result<Answer, ()>;
}

impl FilterStatus for Result<Answer, reqwest::Error> {
    fn filter_status(self, status: u16) -> Result<Answer, ()> {
        match self {
            Ok(answer) if answer.status == status => Ok(answer),
            _ => Err(()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_keep_their_order_through_server_kills_and_lost_answers() {
    let seed = std::env::var("ZKQ_CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    println!("groups under faults: seed {seed} (replay with ZKQ_CHAOS_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let ensemble = Arc::new(tokio::task::block_in_place(crate::ensemble::ZkEnsemble::start));
    let root = unique_root("groups-faults");
    let mut proxies = Vec::new();
    for i in 0..crate::ensemble::ZkEnsemble::SIZE {
        proxies.push(zkq_testkit::proxy::ZkProxy::start(&ensemble.address(i)).await);
    }
    let proxied: String = proxies.iter().map(|p| p.connect_string()).collect::<Vec<_>>().join(",");
    let env = [
        ("ZKQ__ZOOKEEPER__SESSION_TIMEOUT", "8s"),
        ("ZKQ__ZOOKEEPER__REQUEST_TIMEOUT", "3s"),
        ("ZKQ__ZOOKEEPER__RECONNECT_BACKOFF_MAX", "500ms"),
        ("ZKQ__QUEUES__JOBS__KIND", "fifo"),
        ("ZKQ__QUEUES__JOBS__GROUPED", "true"),
    ];
    let zkqs = [
        ChildZkq::start(&*ensemble, &root, &env).await,
        ChildZkq::start(&proxied, &root, &env).await,
        ChildZkq::start(&*ensemble, &root, &env).await,
    ];
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("http client");
    let apis: Vec<Api> = zkqs.iter().map(|z| Api::new(http.clone(), &z.api)).collect();
    let groups = 100;
    let confirmed: Arc<Mutex<HashSet<(usize, usize)>>> = Arc::default();
    let log: Arc<Mutex<Vec<Held>>> = Arc::default();
    let (stop_puts, stop_consumers) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let mut putters = tokio::task::JoinSet::new();
    for p in 0..4 {
        let mine: Vec<usize> = (p..groups).step_by(4).collect();
        putters.spawn(group_putter(apis[p % apis.len()].clone(), mine, confirmed.clone(), stop_puts.clone()));
    }
    let mut consumers = tokio::task::JoinSet::new();
    for (z, api) in apis.iter().enumerate() {
        for c in 0..3 {
            consumers.spawn(faulty_consumer(
                api.clone(),
                seed ^ (z * 8 + c) as u64,
                log.clone(),
                stop_consumers.clone(),
            ));
        }
    }
    let end = Instant::now() + Duration::from_secs(30);
    let mut down: Option<usize> = None;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1500..4000))).await;
        let e = ensemble.clone();
        match down.take() {
            Some(i) => tokio::task::spawn_blocking(move || {
                e.restart(i);
                e.wait_caught_up(i);
            })
            .await
            .expect("restart"),
            None => {
                let i = rng.random_range(0..crate::ensemble::ZkEnsemble::SIZE);
                tokio::task::spawn_blocking(move || e.kill(i)).await.expect("kill");
                down = Some(i);
            },
        }
        if rng.random_bool(0.5) {
            let proxy = &proxies[rng.random_range(0..proxies.len())];
            let fault = if rng.random_bool(0.7) {
                zkq_testkit::proxy::Fault::DropAnswer
            } else {
                zkq_testkit::proxy::Fault::DropBeforeSend
            };
            proxy.arm(zkq_testkit::proxy::op::WRITES, fault);
        }
    }
    for proxy in &proxies {
        proxy.disarm_all();
    }
    if let Some(i) = down {
        let e = ensemble.clone();
        tokio::task::spawn_blocking(move || e.restart(i)).await.expect("restart");
    }
    let e = ensemble.clone();
    tokio::task::spawn_blocking(move || e.wait_quorum()).await.expect("quorum");
    stop_puts.store(true, Ordering::SeqCst);
    while let Some(r) = putters.join_next().await {
        r.expect("putter");
    }
    let direct = zk_client(&*ensemble).await;
    let path = format!("{root}/queues/jobs");
    let confirmed = confirmed.lock().expect("lock").clone();
    eventually(Duration::from_secs(120), "every confirmed put is done and the queue is empty", || {
        let done: HashSet<(usize, usize)> =
            log.lock().expect("log").iter().filter(|d| d.done).map(|d| (d.group, d.index)).collect();
        let (direct, path, confirmed) = (&direct, &path, &confirmed);
        async move { confirmed.is_subset(&done) && children(direct, path).await.is_empty() }
    })
    .await;
    stop_consumers.store(true, Ordering::SeqCst);
    while let Some(r) = consumers.join_next().await {
        r.expect("consumer");
    }
    let log = log.lock().expect("log").clone();
    let mut by_group: BTreeMap<usize, Vec<&Held>> = BTreeMap::new();
    for held in &log {
        by_group.entry(held.group).or_default().push(held);
    }
    for (group, mut deliveries) in by_group {
        deliveries.sort_by_key(|d| d.start);
        let done: Vec<usize> = deliveries.iter().filter(|d| d.done).map(|d| d.index).collect();
        assert!(
            done.windows(2).all(|w| w[0] < w[1]),
            "seed {seed}: group {group} done out of put order or twice: {done:?}"
        );
        for (at, earlier) in deliveries.iter().enumerate() {
            for later in deliveries.iter().skip(at + 1) {
                assert!(
                    later.start >= earlier.end || !earlier.done,
                    "seed {seed}: group {group}: message {} ({}, {}) was delivered while message {} ({}, {}) was held",
                    later.index,
                    later.id,
                    later.how,
                    earlier.index,
                    earlier.id,
                    earlier.how
                );
            }
        }
    }
    println!("groups under faults: {} deliveries, {} confirmed puts", log.len(), confirmed.len());
}

#[tokio::test]
async fn dynamic_queues_are_grouped_when_the_configuration_says_so() {
    let zk = ZkServer::shared();
    let root = unique_root("groups-dynamic");
    let mut config = test_config(zk, &root);
    config.queues_dynamic_grouped = true;
    let zkq = TestZkq::start(config).await;
    let api = zkq.client();
    for (group, body) in [("a", "a0"), ("a", "a1"), ("b", "b0")] {
        assert_eq!(api.put("made-on-first-put", &format!("group={group}"), body.as_bytes()).await.status, 201);
    }
    let a0 = api.lease("made-on-first-put", "wait=5s").await;
    assert_eq!(a0.text(), "a0");
    assert_eq!(api.lease("made-on-first-put", "wait=5s").await.text(), "b0", "a1 waits behind a0");
    assert_eq!(api.info("made-on-first-put").await.json()["grouped"], true);
}

/// One lease as its consumer saw it: its fencing token, when the request was sent and when the
/// answer came.
struct Fenced {
    token: u64,
    sent: Instant,
    received: Instant,
}

/// Leases `?max=10` and acks them in one batch (each receipt again while its ack answers 503 or
/// 504: an election) until `stop`; returns each lease.
async fn fenced_consumer(api: Api, stop: Arc<AtomicBool>) -> Vec<Fenced> {
    let mut seen = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let sent = Instant::now();
        let answer = api.try_send(reqwest::Method::POST, "/v1/queues/jobs/leases?max=10&wait=1s", None).await;
        let received = Instant::now();
        let Ok(answer) = answer else { continue };
        match answer.status {
            200 => {},
            204 => continue,
            _ => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            },
        }
        let json = answer.json();
        let mut receipts = Vec::new();
        for message in json["messages"].as_array().into_iter().flatten() {
            let token = message["fencing_token"].as_str().and_then(|t| t.parse().ok()).expect("a fencing token");
            seen.push(Fenced { token, sent, received });
            receipts.push(message["lease"].as_str().unwrap_or("").to_owned());
        }
        let started = Instant::now();
        while !receipts.is_empty() && started.elapsed() < Duration::from_secs(30) {
            let acked = api.batch_ack("jobs", &receipts).await;
            if acked.status == 200 {
                let unsettled: Vec<String> = acked.json()["results"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|r| matches!(r["status"].as_u64(), Some(503 | 504)))
                    .filter_map(|r| r["lease"].as_str().map(str::to_owned))
                    .collect();
                receipts = unsettled;
            }
            if !receipts.is_empty() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_grow_over_ten_thousand_leases_across_three_sidecars_and_a_leader_failover() {
    let ensemble = Arc::new(tokio::task::block_in_place(crate::ensemble::ZkEnsemble::start));
    let root = unique_root("groups-fencing");
    let mut zkqs = Vec::new();
    for _ in 0..3 {
        let mut config = test_config(&*ensemble, &root);
        config.zookeeper.session_timeout = Duration::from_secs(10);
        config.api.max_batch = 1000;
        declare(&mut config, "jobs", QueueKind::Fifo, None, None);
        if let Some(jobs) = config.queues.get_mut("jobs") {
            jobs.grouped = true;
        }
        zkqs.push(TestZkq::start(config).await);
    }
    let total = 10_000;
    for chunk in 0..total / 500 {
        let messages: Vec<serde_json::Value> = (chunk * 500..chunk * 500 + 500)
            .map(|i| serde_json::json!({ "text": format!("g{}-{i}", i % 1000), "group": format!("g{}", i % 1000) }))
            .collect();
        let put = zkqs[chunk % 3].client().batch_put("jobs", "", &serde_json::json!({ "messages": messages })).await;
        assert_eq!(put.status, 201, "{}", put.text());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut consumers = tokio::task::JoinSet::new();
    for zkq in &zkqs {
        for _ in 0..2 {
            consumers.spawn(fenced_consumer(zkq.client(), stop.clone()));
        }
    }
    // A leader failover while the consumers lease.
    let acked = || async {
        let mut sum = 0.0;
        for zkq in &zkqs {
            sum += metric_value(&zkq.metrics().await, "zkq_messages_acked_total{queue=\"jobs\"}").unwrap_or(0.0);
        }
        sum
    };
    eventually(SOON, "a third of the messages are acked", || async { acked().await >= (total / 3) as f64 }).await;
    let e = ensemble.clone();
    let leader = tokio::task::spawn_blocking(move || {
        let leader = e.leader().expect("a leader");
        e.kill(leader);
        e.wait_quorum();
        leader
    })
    .await
    .expect("failover");
    // Drained: every message acked (a lease whose ack was lost expires and is leased again).
    let direct = zk_client(&*ensemble).await;
    let path = format!("{root}/queues/jobs");
    eventually(Duration::from_secs(180), "every message is acked", || async {
        children(&direct, &path).await.is_empty()
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let mut leases = Vec::new();
    while let Some(done) = consumers.join_next().await {
        leases.extend(done.expect("consumer"));
    }
    let e = ensemble.clone();
    tokio::task::spawn_blocking(move || e.restart(leader)).await.expect("restart");
    assert!(leases.len() >= total, "every message was leased ({} leases)", leases.len());
    let mut tokens: Vec<u64> = leases.iter().map(|l| l.token).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), leases.len(), "no two leases share a fencing token");
    let epochs: HashSet<u64> = tokens.iter().map(|t| t >> 42).collect();
    assert!(epochs.len() >= 2, "leases were granted before and after the election");
    // A lease asked for after another was answered has a larger token, whichever sidecar granted them.
    let mut by_received: Vec<&Fenced> = leases.iter().collect();
    by_received.sort_by_key(|l| l.received);
    let mut by_sent: Vec<&Fenced> = leases.iter().collect();
    by_sent.sort_by_key(|l| l.sent);
    let (mut before, mut largest_before) = (0, 0);
    for later in by_sent {
        while before < by_received.len() && by_received[before].received < later.sent {
            largest_before = largest_before.max(by_received[before].token);
            before += 1;
        }
        assert!(later.token > largest_before, "a later lease has a smaller fencing token");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_killed_holding_a_group_leaves_its_message_first_of_the_group() {
    let zk = ZkServer::shared();
    let root = unique_root("groups-kill");
    let env = [("ZKQ__ZOOKEEPER__SESSION_TIMEOUT", "4s"), ("ZKQ__QUEUES__JOBS__GROUPED", "true")];
    let doomed = ChildZkq::start(zk, &root, &env).await;
    let mut config = test_config(zk, &root);
    declare(&mut config, "jobs", QueueKind::Fifo, None, None);
    if let Some(jobs) = config.queues.get_mut("jobs") {
        jobs.grouped = true;
    }
    let survivor = TestZkq::start(config).await;
    let api = survivor.client();
    for body in ["a0", "a1"] {
        assert_eq!(api.put("jobs", "group=a", body.as_bytes()).await.status, 201);
    }
    let http = reqwest::Client::new();
    let held = Api::new(http, &doomed.api).lease("jobs", "wait=5s&visibility=60s").await;
    assert_eq!(held.text(), "a0");
    assert_eq!(api.lease("jobs", "wait=0").await.status, 204, "a1 waits while a0 is held");
    doomed.signal("KILL");
    // Its session ends (4 s), its lock with it: a0 again, first of its group, never a1 before it.
    let again = api.lease("jobs", "wait=20s").await;
    assert_eq!((again.text().as_str(), again.deliveries), ("a0", Some(2)));
    assert_eq!(api.ack("jobs", &again.receipt).await.status, 204);
    assert_eq!(api.lease("jobs", "wait=5s").await.text(), "a1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_id_queue_producers_ids_are_groups() {
    let zk = ZkServer::shared();
    let root = unique_root("groups-curator");
    let zkq = TestZkq::start(grouped_config(zk, &root, "orders", QueueKind::Id)).await;
    let path = format!("{root}/queues/orders");
    // Curator's DistributedIdQueue: two items with id "c1", then one with "c2".
    Curator::run(zk, &["put", "id", &path, "c1", &hex(b"c1-0"), &hex(b"c1-1")]).await;
    Curator::run(zk, &["put", "id", &path, "c2", &hex(b"c2-0")]).await;
    let api = zkq.client();
    let first = api.lease("orders", "wait=5s").await;
    assert_eq!(first.text(), "c1-0");
    assert_eq!(api.lease("orders", "wait=5s").await.text(), "c2-0", "c1-1 waits behind c1-0");
    assert_eq!(api.lease("orders", "wait=0").await.status, 204);
    assert_eq!(api.ack("orders", &first.receipt).await.status, 204);
    assert_eq!(api.take("orders", "wait=5s").await.text(), "c1-1");
}
