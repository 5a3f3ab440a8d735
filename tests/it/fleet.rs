//! Many sidecars on one queue: what ZooKeeper spends on a sidecar must follow its own demand,
//! not the queue's traffic.

use std::time::Duration;

use zkq_testkit::*;

const WATCH_EVENTS: &str = r#"zkq_queue_watch_events_total{queue="q"}"#;

/// With `queues_watch_on_demand`, a sidecar that only puts holds no watch on the queue's children
/// and locks, so the queue's traffic sends it nothing; every sidecar that had touched a queue used to receive every event
/// of it. Its first taker brings the watch back before it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_that_only_puts_receives_no_event_of_the_queue_until_it_takes() {
    let zk = ZkServer::shared();
    let root = unique_root("fleet-producer");
    let on_demand = || {
        let mut config = test_config(zk, &root);
        config.queues_watch_on_demand = true;
        config
    };
    let [producer, consumer] = TestZkq::fleet(on_demand()).await;
    let (puts, leases) = (producer.client(), consumer.client());
    for i in 0..20 {
        assert_eq!(puts.put("q", "", format!("m{i}").as_bytes()).await.status, 201);
        let lease = leases.lease("q", "wait=5s").await;
        assert_eq!(lease.status, 200, "{}", lease.text());
        assert_eq!(leases.ack("q", &lease.receipt).await.status, 204);
    }
    // Every put after the first (which its first read found) and every ack reached the consumer
    // as events (the series counts them) ...
    assert!(metric(&consumer.metrics().await, WATCH_EVENTS) >= 39.0, "the consumer follows the queue");
    // ... and none reached the sidecar that only put.
    assert_eq!(metric(&producer.metrics().await, WATCH_EVENTS), 0.0, "the producer received the queue's events");

    // A take on the producer watches the queue again: it sees a put acknowledged elsewhere first.
    assert_eq!(leases.put("q", "", b"late").await.status, 201);
    assert_eq!(producer.take_body("q", "5s").await.as_deref(), Some(b"late".as_slice()));
    consumer.put_ok("q", b"later").await;
    eventually(Duration::from_secs(10), "the producer's cache follows the queue again", || async {
        metric(&producer.metrics().await, WATCH_EVENTS) > 0.0
    })
    .await;
    assert_eq!(producer.take_body("q", "5s").await.as_deref(), Some(b"later".as_slice()));
}

/// With `queues_watch_on_demand`, a sidecar that holds no watch on a queue still reports the age
/// of the message waiting at its head (from its last read of the child list), so an alert on a
/// queue nobody consumes fires wherever it is scraped; an emptied queue reports 0. It reported 0
/// while a message waited: the head of a snapshot events no longer kept current counted as none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_watching_on_demand_reports_the_age_of_a_message_nobody_consumes() {
    let zk = ZkServer::shared();
    let root = unique_root("fleet-unwatched-age");
    let on_demand = || {
        let mut config = test_config(zk, &root);
        config.queues_watch_on_demand = true;
        config
    };
    let producer = TestZkq::start_ready(on_demand()).await;
    producer.put_ok("q", b"waiting").await;
    let age = r#"zkq_queue_oldest_message_age_seconds{queue="q"}"#;
    eventually(Duration::from_secs(30), "the unwatched queue's head age is above a second", || async {
        metric(&producer.metrics().await, age) >= 1.0
    })
    .await;
    assert_eq!(metric(&producer.metrics().await, WATCH_EVENTS), 0.0, "the producer watched the queue");
    // Taken elsewhere: the emptied queue's age is 0 at the next scrape.
    let consumer = TestZkq::start_ready(on_demand()).await;
    assert_eq!(consumer.take_body("q", "5s").await.as_deref(), Some(&b"waiting"[..]));
    assert_eq!(metric(&producer.metrics().await, age), 0.0, "the age of an emptied queue");
}

const FAILED_CLAIMS: &[&str] = &[
    r#"zkq_claim_attempts_total{outcome="lost",queue="q"}"#,
    r#"zkq_claim_attempts_total{outcome="gone",queue="q"}"#,
    r#"zkq_claim_attempts_total{outcome="locked",queue="q"}"#,
];
const FLEET_MEMBERS: &str = r#"zkq_queue_fleet_members{queue="q"}"#;

/// Lease consumers that ack what they get, until `stop`; what they got, in order.
fn lease_consumers(
    api: &Api,
    n: usize,
    stop: &tokio_util::sync::CancellationToken,
    acked: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> tokio::task::JoinSet<Vec<Vec<u8>>> {
    lease_consumers_waiting(api, n, "1s", stop, acked)
}

/// Like [`lease_consumers`], each long-poll waiting `wait`.
fn lease_consumers_waiting(
    api: &Api,
    n: usize,
    wait: &str,
    stop: &tokio_util::sync::CancellationToken,
    acked: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> tokio::task::JoinSet<Vec<Vec<u8>>> {
    let mut consumers = tokio::task::JoinSet::new();
    let path = format!("/v1/queues/q/leases?wait={wait}");
    for _ in 0..n {
        let (api, stop, acked, path) = (api.clone(), stop.clone(), acked.clone(), path.clone());
        consumers.spawn(async move {
            let mut got = Vec::new();
            while !stop.is_cancelled() {
                let lease = tokio::select! {
                    lease = api.try_send(reqwest::Method::POST, &path, None) => lease,
                    _ = stop.cancelled() => break,
                };
                // No answer: its sidecar is gone (a test killed it).
                let Ok(lease) = lease else { break };
                if lease.status != 200 {
                    continue;
                }
                assert_eq!(api.ack("q", &lease.receipt).await.status, 204, "a fresh lease is acked");
                got.push(lease.body.clone());
                acked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            got
        });
    }
    consumers
}

/// Four sidecars, each with two consumers waiting in a long-poll, and messages put one at a
/// time: each message is claimed by one sidecar, the one that owns it, instead of every
/// sidecar with a waiting consumer racing for it (2 to 3 failed claims per message at four
/// sidecars before). Every message is still delivered and acked exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_sidecars_with_waiting_consumers_claim_each_message_once_instead_of_racing() {
    const K: usize = 4;
    const N: usize = 40;
    let zk = ZkServer::shared();
    let root = unique_root("fleet-owners");
    let sidecars: [TestZkq; K] = TestZkq::fleet(test_config(zk, &root)).await;
    // The queue exists before the consumers wait on it.
    sidecars[0].put_ok("q", b"first").await;
    let stop = tokio_util::sync::CancellationToken::new();
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut consumers: Vec<_> = sidecars.iter().map(|s| lease_consumers(&s.client(), 2, &stop, &acked)).collect();
    eventually(Duration::from_secs(20), "every sidecar sees the four members", || async {
        let mut all = true;
        for sidecar in &sidecars {
            all &= metric(&sidecar.metrics().await, FLEET_MEMBERS) == K as f64;
        }
        all && acked.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    let failed_before = failed_claims(&sidecars).await;
    for i in 0..N {
        sidecars[i % K].put_ok("q", format!("m{i}").as_bytes()).await;
        eventually(Duration::from_secs(20), "the message is delivered and acked", || async {
            acked.load(std::sync::atomic::Ordering::SeqCst) == i + 2
        })
        .await;
    }
    stop.cancel();
    let mut bodies = Vec::new();
    for set in &mut consumers {
        while let Some(got) = set.join_next().await {
            bodies.extend(got.expect("a consumer"));
        }
    }
    bodies.sort();
    let mut want: Vec<Vec<u8>> = (0..N).map(|i| format!("m{i}").into_bytes()).chain([b"first".to_vec()]).collect();
    want.sort();
    assert_eq!(bodies, want, "every message delivered exactly once");
    let failed = failed_claims(&sidecars).await - failed_before;
    eprintln!("{failed} failed claims for {N} messages at {K} sidecars");
    assert!(failed <= (N / 4) as f64, "{failed} failed claims for {N} messages at {K} sidecars");
}

const STANDBY: &str = r#"zkq_queue_fleet_standby{queue="q"}"#;
const WATCHED: &str = r#"zkq_queue_watched{queue="q"}"#;
const HELP_CALLS: &str = r#"zkq_queue_fleet_help_calls_total{queue="q"}"#;

/// Three sidecars with consumers waiting in long-polls and `queues_fleet_watchers = 1`: one
/// watches the queue and owns its messages, and the two standing by receive none of its events
/// (every sidecar with a waiting consumer received two per message before). When the watching
/// sidecar's consumers stop, the next message waits there unclaimed: it asks the fleet for help,
/// and a consumer standing by gets it long before its own wait ends. Exactly once throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_standing_by_receive_no_event_until_a_watching_member_asks_for_help() {
    const K: usize = 3;
    const N: usize = 20;
    // Its own server: ZooKeeper's count of the watches each new node triggers is the evidence.
    let zk = &ZkServer::start();
    let root = unique_root("fleet-standby");
    let mut config = test_config(zk, &root);
    config.queues_fleet_watchers = 1;
    let sidecars: [TestZkq; K] = TestZkq::fleet(config).await;
    sidecars[0].put_ok("q", b"first").await;
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stops: Vec<_> = (0..K).map(|_| tokio_util::sync::CancellationToken::new()).collect();
    let mut consumers: Vec<_> = sidecars
        .iter()
        .zip(&stops)
        .map(|(s, stop)| lease_consumers_waiting(&s.client(), 1, "60s", stop, &acked))
        .collect();
    eventually(Duration::from_secs(30), "one sidecar watches, two stand by and let go of the queue", || async {
        let mut watching = Vec::new();
        let mut settled = acked.load(std::sync::atomic::Ordering::SeqCst) == 1;
        for (i, sidecar) in sidecars.iter().enumerate() {
            let text = sidecar.metrics().await;
            settled &= metric(&text, FLEET_MEMBERS) == K as f64;
            if metric(&text, STANDBY) == 0.0 {
                watching.push(i);
            } else {
                settled &= metric(&text, WATCHED) == 0.0;
            }
        }
        settled && watching.len() == 1
    })
    .await;
    let mut watcher = None;
    for (i, sidecar) in sidecars.iter().enumerate() {
        if metric(&sidecar.metrics().await, STANDBY) == 0.0 {
            watcher = Some(i);
        }
    }
    let watcher = watcher.expect("one sidecar watches");
    let standbys: Vec<usize> = (0..K).filter(|i| *i != watcher).collect();
    let events_before: Vec<f64> = {
        let mut events = Vec::new();
        for i in &standbys {
            events.push(metric(&sidecars[*i].metrics().await, WATCH_EVENTS));
        }
        events
    };
    let triggered_before = zk.mntr("zk_sum_node_created_watch_count");
    for i in 0..N {
        sidecars[i % K].put_ok("q", format!("m{i}").as_bytes()).await;
        eventually(Duration::from_secs(20), "the message is delivered and acked", || async {
            acked.load(std::sync::atomic::Ordering::SeqCst) == i + 2
        })
        .await;
    }
    for (i, before) in standbys.iter().zip(&events_before) {
        let events = metric(&sidecars[*i].metrics().await, WATCH_EVENTS) - before;
        assert_eq!(events, 0.0, "sidecar {i}, standing by, received {events} events for {N} messages");
    }
    // And ZooKeeper agrees: each new message triggered the watch of one sidecar, not three. A
    // sidecar that had watched before it stood by kept its watch on the server (the client asked
    // to remove it while it still held another watch on the path) and was sent every event.
    let triggered = zk.mntr("zk_sum_node_created_watch_count") - triggered_before;
    assert!(triggered <= 1.5 * N as f64, "{triggered} watches triggered by {N} new messages");

    // The watching sidecar's consumers stop; it stays a member for a while, and the next
    // message waits there unclaimed until it asks for help.
    stops[watcher].cancel();
    let mut bodies = Vec::new();
    while let Some(got) = consumers[watcher].join_next().await {
        bodies.extend(got.expect("a consumer"));
    }
    sidecars[standbys[0]].put_ok("q", b"helped").await;
    eventually(Duration::from_secs(30), "a consumer standing by gets the message", || async {
        acked.load(std::sync::atomic::Ordering::SeqCst) == N + 2
    })
    .await;
    assert!(metric(&sidecars[watcher].metrics().await, HELP_CALLS) >= 1.0, "the watching sidecar asked for help");
    for stop in &stops {
        stop.cancel();
    }
    for set in &mut consumers {
        while let Some(got) = set.join_next().await {
            bodies.extend(got.expect("a consumer"));
        }
    }
    bodies.sort();
    let mut want: Vec<Vec<u8>> =
        (0..N).map(|i| format!("m{i}").into_bytes()).chain([b"first".to_vec(), b"helped".to_vec()]).collect();
    want.sort();
    assert_eq!(bodies, want, "every message delivered exactly once");
}

/// A consumer of a sidecar standing by reads the queue at the end of its wait and claims what it
/// found; when the first ones it tried cannot be delivered (here nodes another client wrote that
/// are not Curator envelopes, ahead of a message), it reads again and gets the message. It
/// answered 204 with the message waiting (a deep queue's consumers on members standing by took
/// that for an empty queue and stopped, and their sidecars' shares waited for the others' grace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_standing_by_does_not_answer_empty_while_a_message_waits_behind_undeliverable_nodes() {
    let zk = ZkServer::shared();
    let root = unique_root("fleet-standby-read");
    let mut config = test_config(zk, &root);
    config.queues_fleet_watchers = 1;
    let sidecars: [TestZkq; 2] = TestZkq::fleet(config).await;
    sidecars[0].put_ok("q", b"first").await;
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = tokio_util::sync::CancellationToken::new();
    let mut consumers: Vec<_> =
        sidecars.iter().map(|s| lease_consumers_waiting(&s.client(), 1, "60s", &stop, &acked)).collect();
    eventually(Duration::from_secs(30), "one sidecar watches, the other stands by", || async {
        let mut settled = acked.load(std::sync::atomic::Ordering::SeqCst) == 1;
        let mut standing_by = 0.0;
        for sidecar in &sidecars {
            let text = sidecar.metrics().await;
            settled &= metric(&text, FLEET_MEMBERS) == 2.0;
            standing_by += metric(&text, STANDBY);
        }
        settled && standing_by == 1.0
    })
    .await;
    let standby = if metric(&sidecars[0].metrics().await, STANDBY) == 1.0 { 0 } else { 1 };
    stop.cancel();
    for set in &mut consumers {
        while set.join_next().await.is_some() {}
    }
    // Four nodes no consumer can deliver, then a message; nobody else is waiting for it.
    let direct = zk_client(zk).await;
    let options = zookeeper_client::CreateMode::PersistentSequential.with_acls(zookeeper_client::Acls::anyone_all());
    for _ in 0..4 {
        direct.create(&format!("{root}/queues/q/queue-"), b"not an envelope", &options).await.expect("raw node");
    }
    sidecars[1 - standby].put_ok("q", b"wanted").await;
    let api = sidecars[standby].client();
    let lease = api.lease("q", "wait=100ms").await;
    assert_eq!(lease.status, 200, "the sidecar standing by answered {}: {}", lease.status, lease.text());
    assert_eq!(lease.body, b"wanted");
    assert_eq!(api.ack("q", &lease.receipt).await.status, 204);
}

/// Two sidecars, each with a consumer waiting in a long-poll, and a lease held past the other
/// member's grace: the other sidecar reads the lock instead of sending a claim that fails, and
/// each sidecar receives two events per message (its creation and its deletion), not five (the
/// lock's creation, write and deletion came on top while every sidecar watched the locks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_held_past_the_grace_costs_the_other_sidecar_no_claim_and_no_lock_events() {
    const N: usize = 6;
    let zk = ZkServer::shared();
    let root = unique_root("fleet-held");
    let sidecars =
        [TestZkq::start_ready(test_config(zk, &root)).await, TestZkq::start_ready(test_config(zk, &root)).await];
    sidecars[0].put_ok("q", b"first").await;
    assert_eq!(sidecars[1].take_body("q", "5s").await.as_deref(), Some(&b"first"[..]));
    let events_before =
        [metric(&sidecars[0].metrics().await, WATCH_EVENTS), metric(&sidecars[1].metrics().await, WATCH_EVENTS)];
    let failed_before = failed_claims(&sidecars).await;
    let waiting = r#"zkq_waiting_takers{queue="q"}"#;
    for i in 0..N {
        let polls: Vec<_> = sidecars
            .iter()
            .map(|s| {
                let api = s.client();
                tokio::spawn(async move { api.lease("q", "wait=2s").await })
            })
            .collect();
        eventually(Duration::from_secs(20), "both sidecars have a waiting consumer and see two members", || async {
            let mut ready = true;
            for sidecar in &sidecars {
                let text = sidecar.metrics().await;
                ready &= metric(&text, waiting) == 1.0 && metric(&text, FLEET_MEMBERS) == 2.0;
            }
            ready
        })
        .await;
        sidecars[i % 2].put_ok("q", format!("m{i}").as_bytes()).await;
        let mut answers = Vec::new();
        for (poll, sidecar) in polls.into_iter().zip(&sidecars) {
            answers.push((poll.await.expect("a poll"), sidecar));
        }
        // The lease is held until the other poll ended, two seconds after it began.
        let leased: Vec<_> = answers.iter().filter(|(a, _)| a.status == 200).collect();
        assert_eq!(
            leased.len(),
            1,
            "one sidecar leases m{i}: {:?}",
            answers.iter().map(|(a, _)| a.status).collect::<Vec<_>>()
        );
        let (lease, sidecar) = leased[0];
        assert_eq!(lease.body, format!("m{i}").into_bytes());
        assert_eq!(sidecar.client().ack("q", &lease.receipt).await.status, 204);
    }
    assert_eq!(failed_claims(&sidecars).await - failed_before, 0.0, "failed claims");
    for (sidecar, before) in sidecars.iter().zip(events_before) {
        let events = metric(&sidecar.metrics().await, WATCH_EVENTS) - before;
        assert!(events <= (2 * N + 2) as f64, "{events} events for {N} messages at one sidecar");
    }
}

async fn failed_claims(sidecars: &[TestZkq]) -> f64 {
    let mut failed = 0.0;
    for sidecar in sidecars {
        let text = sidecar.metrics().await;
        failed += FAILED_CLAIMS.iter().map(|series| metric(&text, series)).sum::<f64>();
    }
    failed
}

/// Takers that wait on dynamic queue `queue`, whose node does not exist yet, one after another;
/// then one put to it. Returns the packets ZooKeeper sent from the put until the first taker was
/// answered, and checks that it was that first taker, and that the others still wait.
async fn put_to_a_queue_not_made_yet(zk: &ZkServer, zkq: &TestZkq, queue: &str, takers: usize) -> f64 {
    let waiting = format!("zkq_waiting_takers{{queue=\"{queue}\"}}");
    // A first long-poll opens the queue here; once it answered, the queue's cache is read.
    assert_eq!(zkq.take(queue, "1s").await.status(), 204, "a queue not made yet is empty");
    let mut set = tokio::task::JoinSet::new();
    for i in 0..takers {
        let (http, url) = (zkq.http.clone(), zkq.url(&format!("/v1/queues/{queue}/take?wait=60s")));
        set.spawn(async move {
            let response = http.post(url).send().await.expect("take");
            (i, response.status().as_u16(), response.bytes().await.expect("body").to_vec())
        });
        // In line before the next one comes.
        eventually(Duration::from_secs(10), "the taker waits", || async {
            metric(&zkq.metrics().await, &waiting) == (i + 1) as f64
        })
        .await;
    }
    let packets_before = zk.mntr("zk_packets_sent");
    zkq.put_ok(queue, b"the only one").await;
    let first = set.join_next().await.expect("a taker").expect("the taker's task");
    let packets = zk.mntr("zk_packets_sent") - packets_before;
    assert_eq!(first, (0, 200, b"the only one".to_vec()), "the longest-waiting taker is served");
    assert_eq!(metric(&zkq.metrics().await, &waiting), (takers - 1) as f64, "one put wakes one taker");
    assert!(set.try_join_next().is_none(), "the others still wait");
    packets
}

/// 200 takers wait on a dynamic queue whose node does not exist yet. The put that makes it
/// wakes the one that has waited longest, and costs ZooKeeper what it costs with one taker
/// waiting: each waiter used to set its own watch and read again when the node appeared (about
/// 420 packets for one put), and the waiter served was whichever won that race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_takers_waiting_for_a_queue_not_made_yet_are_served_in_order_for_what_one_costs() {
    let zk = ZkServer::start();
    let root = unique_root("fleet-not-made-yet");
    let zkq = TestZkq::start_ready(test_config(&zk, &root)).await;
    // zkq's own directories exist, so both queues below cost their own nodes only.
    zkq.put_ok("made-first", b"x").await;
    let alone = put_to_a_queue_not_made_yet(&zk, &zkq, "one", 1).await;
    let crowd = put_to_a_queue_not_made_yet(&zk, &zkq, "crowd", 200).await;
    eprintln!("packets ZooKeeper sent for the put that makes a queue: {alone} with 1 taker waiting, {crowd} with 200");
    assert!(crowd <= alone + 3.0, "{crowd} packets with 200 takers waiting, {alone} with one");
}

/// Three sidecars (real processes) take from one queue; one is killed (`kill -9`), so its member
/// node stays until its session expires. Messages put afterwards, some owned by the dead member,
/// are still delivered by the others, once each: the next member in each message's order claims
/// it after one grace, well within the dead session's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_member_strands_nothing_its_messages_go_to_the_next_member() {
    const N: usize = 12;
    let zk = ZkServer::shared();
    let root = unique_root("fleet-kill");
    let env = [("ZKQ__ZOOKEEPER__SESSION_TIMEOUT", "6s")];
    let mut sidecars = Vec::new();
    for _ in 0..3 {
        sidecars.push(ChildZkq::start(zk, &root, &env).await);
    }
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("http client");
    let apis: Vec<Api> = sidecars.iter().map(|s| Api::new(http.clone(), &s.api)).collect();
    assert_eq!(apis[0].put("q", "", b"first").await.status, 201);
    let stop = tokio_util::sync::CancellationToken::new();
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut survivors: Vec<_> = apis[..2].iter().map(|api| lease_consumers(api, 2, &stop, &acked)).collect();
    let doomed = lease_consumers(&apis[2], 2, &stop, &acked);
    let members = |admin: String| {
        let http = http.clone();
        async move {
            let text = http.get(format!("{admin}/metrics")).send().await.ok()?.text().await.ok()?;
            metric_value(&text, FLEET_MEMBERS)
        }
    };
    eventually(Duration::from_secs(20), "every sidecar sees the three members", || async {
        let mut all = true;
        for sidecar in &sidecars {
            all &= members(sidecar.admin.clone()).await == Some(3.0);
        }
        all && acked.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    sidecars[2].signal("KILL");
    drop(doomed);
    for i in 0..N {
        assert_eq!(apis[i % 2].put("q", "", format!("m{i}").as_bytes()).await.status, 201);
        eventually(Duration::from_secs(20), "the message is delivered and acked by a survivor", || async {
            acked.load(std::sync::atomic::Ordering::SeqCst) == i + 2
        })
        .await;
    }
    stop.cancel();
    let mut bodies = Vec::new();
    for set in &mut survivors {
        while let Some(got) = set.join_next().await {
            bodies.extend(got.expect("a consumer"));
        }
    }
    let mut want: Vec<Vec<u8>> = (0..N).map(|i| format!("m{i}").into_bytes()).collect();
    bodies.retain(|b| b.as_slice() != b"first");
    bodies.sort();
    want.sort();
    assert_eq!(bodies, want, "every message put after the kill delivered once, by the survivors");
}

/// Sidecars pointed at an observer only (`zookeeper.connect` naming just the observer of a
/// three-server ensemble) serve a queue as usual: a put on one, leases acked on the other. Every
/// reply and watch event they get is sent by the observer; the voting servers send them nothing,
/// so the fan-out of a fleet's events can be moved off the servers that vote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_connected_to_an_observer_get_every_event_from_it_and_none_from_the_voters() {
    const N: usize = 20;
    let ensemble = tokio::task::block_in_place(crate::ensemble::ZkEnsemble::start_with_observer);
    let root = unique_root("fleet-observer");
    let observer = ensemble.observer_address();
    let [producer, consumer] = TestZkq::fleet(test_config(&observer, &root)).await;
    producer.put_ok("q", b"first").await;
    let stop = tokio_util::sync::CancellationToken::new();
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut consumers = lease_consumers(&consumer.client(), 2, &stop, &acked);
    eventually(Duration::from_secs(20), "the first message is acked", || async {
        acked.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    let sent = |port: u16| {
        four_letter(port, "mntr")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("zk_packets_sent").and_then(|v| v.trim().parse::<f64>().ok()))
            .unwrap_or(0.0)
    };
    let ports: Vec<u16> = (0..4).map(|i| ensemble.client_port(i)).collect();
    let before: Vec<f64> = ports.iter().map(|p| sent(*p)).collect();
    for i in 0..N {
        producer.put_ok("q", format!("m{i}").as_bytes()).await;
        eventually(Duration::from_secs(20), "the message is leased and acked", || async {
            acked.load(std::sync::atomic::Ordering::SeqCst) == i + 2
        })
        .await;
    }
    let after: Vec<f64> = ports.iter().map(|p| sent(*p)).collect();
    // What a `mntr` answer itself counts (ZooKeeper counts a four-letter answer as packets).
    let again: Vec<f64> = ports.iter().map(|p| sent(*p)).collect();
    stop.cancel();
    let mut bodies = Vec::new();
    while let Some(got) = consumers.join_next().await {
        bodies.extend(got.expect("a consumer"));
    }
    assert_eq!(bodies.len(), N + 1, "every message leased and acked once");
    let observer_sent = after[3] - before[3];
    assert!(observer_sent >= (N * 5) as f64, "the observer sent {observer_sent} packets for {N} messages");
    for voter in 0..3 {
        // Beside the answer to this test's own `mntr`, a voting server sent the sidecars nothing.
        let own_mntr = again[voter] - after[voter];
        assert_eq!(after[voter] - before[voter], own_mntr, "voting server {} sent packets to the sidecars", voter + 1);
    }
}

/// With `queues_watch_on_demand`, a sidecar that only put to a queue holds a stale snapshot of
/// it; its own next put must not make that message the first candidate. A take on that sidecar
/// used to answer the second message before the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_watching_on_demand_hands_out_its_own_puts_in_order() {
    let zk = ZkServer::shared();
    let root = unique_root("fleet-on-demand-order");
    let mut config = test_config(zk, &root);
    config.queues_watch_on_demand = true;
    let zkq = TestZkq::start_ready(config).await;
    zkq.put_ok("q", b"first").await;
    // The queue opened unwatched: its size is read once, and the snapshot is let go.
    eventually(Duration::from_secs(10), "the unwatched queue's size is read", || async {
        metric(&zkq.metrics().await, r#"zkq_queue_children_reads_total{queue="q"}"#) >= 1.0
    })
    .await;
    zkq.put_ok("q", b"second").await;
    assert_eq!(zkq.take_body("q", "5s").await.as_deref(), Some(b"first".as_slice()));
    assert_eq!(zkq.take_body("q", "5s").await.as_deref(), Some(b"second".as_slice()));
}
