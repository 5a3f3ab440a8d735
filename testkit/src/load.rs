//! Workloads shared by fault tests and benchmarks: putters that confirm through outages, waiting
//! until everything confirmed was processed, restarts under load, numbered bodies.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::instance::TestZkq;
use crate::server::{ZkServer, children, zk_client};
use crate::wait::eventually;

/// Bodies confirmed with 201 by [`confirming_putters`].
pub type Confirmed = std::sync::Arc<Mutex<std::collections::HashSet<String>>>;

/// `putters` tasks each putting `per_putter` distinct bodies to `queue`, through outages: a 503
/// or a refused connection is retried, a 504 (outcome unknown) is neither counted nor resent.
pub fn confirming_putters(
    zkq: &TestZkq,
    queue: &str,
    putters: usize,
    per_putter: usize,
) -> (Confirmed, tokio::task::JoinSet<()>) {
    let confirmed: Confirmed = Default::default();
    let mut tasks = tokio::task::JoinSet::new();
    for p in 0..putters {
        let (http, url, confirmed) =
            (zkq.http.clone(), zkq.url(&format!("/v1/queues/{queue}/messages")), confirmed.clone());
        tasks.spawn(async move {
            for i in 0..per_putter {
                let body = format!("p{p}-{i}");
                loop {
                    match http.post(&url).body(body.clone()).send().await.map(|r| r.status().as_u16()) {
                        Ok(201) => {
                            confirmed.lock().expect("lock").insert(body);
                            break;
                        },
                        Ok(504) => break,
                        Ok(503) | Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                        Ok(other) => panic!("put answered {other}"),
                    }
                }
            }
        });
    }
    (confirmed, tasks)
}

/// Waits until every confirmed body is in `processed`; on timeout, panics with what is missing
/// and what ZooKeeper holds for the queue (its children and lock nodes).
pub async fn await_all_processed(
    zk: &ZkServer,
    root: &str,
    queue: &str,
    confirmed: &Confirmed,
    processed: &Mutex<Vec<String>>,
) {
    let expected = confirmed.lock().expect("lock").clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done: std::collections::HashSet<String> = processed.lock().expect("lock").iter().cloned().collect();
        if expected.is_subset(&done) {
            return;
        }
        if Instant::now() > deadline {
            let missing: Vec<&String> = expected.difference(&done).collect();
            let direct = zk_client(zk).await;
            panic!(
                "not processed: {missing:?}; queue: {:?}; locks: {:?}",
                children(&direct, &format!("{root}/queues/{queue}")).await,
                children(&direct, &format!("{root}/locks/{queue}")).await,
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Stops ZooKeeper for half a second and starts it again, `times` times, each after `progress`
/// holds; waits for zkq to be ready again each time.
pub async fn restart_zookeeper_during<F>(zk: &ZkServer, zkq: &TestZkq, times: usize, progress: F)
where
    F: Fn() -> bool,
{
    for _ in 0..times {
        eventually(Duration::from_secs(30), "progress", || std::future::ready(progress())).await;
        zk.stop();
        tokio::time::sleep(Duration::from_millis(500)).await;
        zk.restart();
        zkq.wait_ready().await;
    }
}

/// A distinct 100-byte body for message `i` (so exactly-once can be checked body by body).
pub fn body(i: usize) -> Vec<u8> {
    let mut body = format!("m{i:08}-").into_bytes();
    body.resize(100, b'x');
    body
}
