//! Shared counters, compatible with Curator's `SharedCount`: the node's data is a 4-byte
//! big-endian two's-complement int, the version is the node's data version, and a
//! compare-and-set is `setData(path, value, expectedVersion)`.
//!
//! Long-polls share one data watch per counter per process, however many clients wait.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::supervise::{self, Task};
use crate::types::{Backoff, CounterName, Layout};
use crate::zk::{NodeMode, WatchEvent, Zk, ZkError, ZkSession};

/// How many compare-and-set attempts an `add` makes before giving up with `Contention`.
pub(crate) const ADD_ATTEMPTS: u32 = 64;

/// A counter's value and the data version it was read at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Versioned {
    pub value: i32,
    pub version: i32,
}

/// Why a counter operation failed. The wording is the domain's; `http/` picks the status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CounterError {
    #[error("counter {0:?} is not declared and dynamic counters are disabled (counters_dynamic = false)")]
    UnknownCounter(CounterName),
    /// A dynamic counter whose node does not exist: nobody has set it yet.
    #[error("counter {0:?} does not exist: nothing set it yet (a set or an add creates it)")]
    NoSuchCounter(CounterName),
    #[error("this zkq already serves {0} dynamic counters; declare the counter")]
    TooManyCounters(usize),
    /// The node does not hold 4 bytes: not a SharedCount; never overwritten.
    #[error("the counter node holds {len} bytes, not a 4-byte SharedCount int; it was left untouched")]
    NotAnInt { len: usize },
    /// Compare-and-set against a version that changed.
    #[error("the counter is at version {} (value {})", .0.version, .0.value)]
    VersionMismatch(Versioned),
    /// The expected version is -1, which ZooKeeper reads as "any version" (ZOOKEEPER-4743);
    /// refused, as Curator does.
    #[error(
        "the counter's version overflowed to -1, which ZooKeeper treats as \"any version\"; compare-and-set is refused (as Curator does); use an unconditional set"
    )]
    VersionOverflow,
    /// `add` or `set` lost the compare-and-set race too many times.
    #[error("too many concurrent writers: every compare-and-set of this write lost; retry")]
    Contention,
    /// The sum does not fit a 32-bit int (SharedCount's type); nothing was written.
    #[error("{value} + {delta} does not fit the counter's 32-bit int; nothing was written")]
    Overflow { value: i32, delta: i32 },
    /// zkq is draining: a long-poll answers at once instead of holding the shutdown.
    #[error("zkq is shutting down; retry on another instance")]
    ShuttingDown,
    #[error(transparent)]
    Zk(ZkError),
}

impl From<ZkError> for CounterError {
    fn from(err: ZkError) -> Self {
        CounterError::Zk(err)
    }
}

/// Curator's `SharedCount.toBytes`.
pub(crate) fn encode(value: i32) -> [u8; 4] {
    value.to_be_bytes()
}

/// Curator's `SharedCount.fromBytes`, but strict: anything but 4 bytes is an error.
pub(crate) fn decode(data: &[u8]) -> Result<i32, CounterError> {
    let bytes: [u8; 4] = data.try_into().map_err(|_| CounterError::NotAnInt { len: data.len() })?;
    Ok(i32::from_be_bytes(bytes))
}

/// One counter: its path, seed, and the shared watch that feeds long-polls.
pub(crate) struct Counter {
    pub name: CounterName,
    pub path: String,
    pub seed: i32,
    session: ZkSession,
    /// The latest value seen by the watch task (None until read, or if the data is not an int).
    latest: watch::Sender<Option<Versioned>>,
    watching: Mutex<bool>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl Counter {
    /// Reads the counter: at once, or (with `after_version` and a non-zero `wait`) once its
    /// version is newer than `after_version`. Never answers a version older than `after_version`
    /// that a `sync` did not confirm. Counted in `zkq_counter_operations_total{operation="get"}`.
    pub(crate) async fn fetch(
        self: &Arc<Self>,
        after_version: Option<i32>,
        wait: Duration,
    ) -> Result<Versioned, CounterError> {
        let result = match after_version {
            Some(after) if !wait.is_zero() => self.wait_for_change(after, wait).await,
            Some(after) => self.get_at_least(after).await,
            None => self.get().await,
        };
        self.record("get", &result);
        result
    }

    /// Sets the counter; with `expected` a compare-and-set against that version (one no znode
    /// can have never matches). Counted as `set` or `compare_and_set`.
    pub(crate) async fn write(&self, expected: Option<i64>, value: i32) -> Result<Versioned, CounterError> {
        let result = match expected.map(i32::try_from) {
            Some(Ok(version)) => self.compare_and_set(version, value).await,
            Some(Err(_)) => self.get().await.and_then(|current| Err(CounterError::VersionMismatch(current))),
            None => self.set(value).await,
        };
        self.record(if expected.is_some() { "compare_and_set" } else { "set" }, &result);
        result
    }

    /// Adds `delta` atomically. Counted as `add`.
    pub(crate) async fn add(&self, delta: i32) -> Result<Versioned, CounterError> {
        let result = self.add_with_retries(delta).await;
        self.record("add", &result);
        result
    }

    fn record(&self, operation: &'static str, result: &Result<Versioned, CounterError>) {
        let outcome = match result {
            Ok(_) => "ok",
            Err(CounterError::VersionMismatch(_)) => "version_mismatch",
            Err(CounterError::Contention) => "contention",
            Err(CounterError::Overflow { .. }) => "overflow",
            Err(CounterError::Zk(_)) => "zookeeper_error",
            Err(CounterError::ShuttingDown) => "shutting_down",
            Err(_) => "refused",
        };
        self.metrics.counter_operations.with_label_values(&[operation, outcome]).inc();
    }

    fn zk_deadline(&self) -> Instant {
        Instant::now() + self.session.request_timeout()
    }

    async fn zk(&self) -> Result<Zk, CounterError> {
        Ok(self.session.connected(self.zk_deadline()).await?)
    }

    /// Creates the node with the seed if it does not exist, as Curator's `start()` does.
    async fn ensure(&self, zk: &Zk) -> Result<(), CounterError> {
        match zk.create(&self.path, &encode(self.seed), NodeMode::Persistent).await {
            Ok(_) | Err(ZkError::NodeExists) => Ok(()),
            Err(ZkError::NoNode) => {
                if let Some((parent, _)) = self.path.rsplit_once('/')
                    && !parent.is_empty()
                {
                    zk.ensure_path(parent).await?;
                }
                match zk.create(&self.path, &encode(self.seed), NodeMode::Persistent).await {
                    Ok(_) | Err(ZkError::NodeExists) => Ok(()),
                    Err(err) => Err(err.into()),
                }
            },
            Err(err) => Err(err.into()),
        }
    }

    async fn read(&self, zk: &Zk) -> Result<Versioned, CounterError> {
        let (data, stat) = match zk.get_data(&self.path).await {
            Ok(found) => found,
            Err(ZkError::NoNode) => {
                self.ensure(zk).await?;
                zk.get_data(&self.path).await?
            },
            Err(err) => return Err(err.into()),
        };
        Ok(Versioned { value: decode(&data)?, version: stat.version })
    }

    /// The current value, read from ZooKeeper.
    async fn get(&self) -> Result<Versioned, CounterError> {
        let zk = self.zk().await?;
        self.read(&zk).await
    }

    /// The current value, but never one older than `floor` unless ZooKeeper confirms it.
    ///
    /// The client saw version `floor` somewhere (another zkq, a Curator client), perhaps through a
    /// server ahead of ours: our server may lag behind the leader. A version below `floor` is
    /// trusted only after a `sync` (our server has then applied everything the leader committed
    /// before it): below it still, the node really went back (deleted and created again).
    async fn get_at_least(&self, floor: i32) -> Result<Versioned, CounterError> {
        let zk = self.zk().await?;
        let current = self.read(&zk).await?;
        if current.version >= floor {
            return Ok(current);
        }
        // A read has no outcome to be unsure of: a `sync` without an answer means "cannot vouch now".
        zk.sync(&self.path).await.map_err(|err| match err {
            ZkError::OutcomeUnknown => ZkError::Unavailable,
            other => other,
        })?;
        self.read(&zk).await
    }

    /// Waits until the version is newer than `after_version` (or `wait` passes, or zkq drains),
    /// then answers the value. All waiters of a counter share one data watch.
    ///
    /// A watched copy at or below `after_version` is not a change: a lagging server shows an
    /// older version, and the wait goes on until the server catches up.
    async fn wait_for_change(self: &Arc<Self>, after_version: i32, wait: Duration) -> Result<Versioned, CounterError> {
        if self.shutdown.is_cancelled() {
            return Err(CounterError::ShuttingDown);
        }
        self.start_watching();
        let deadline = Instant::now() + wait;
        let mut rx = self.latest.subscribe();
        let _waiting = crate::metrics::GaugeGuard::new(self.metrics.counter_waiting_polls.clone());
        loop {
            let seen = *rx.borrow_and_update();
            if seen.is_some_and(|current| current.version > after_version) {
                // Confirm with a fresh read: never answer from a stale copy.
                let current = self.get_at_least(after_version).await?;
                if current.version != after_version {
                    return Ok(current);
                }
            }
            if Instant::now() >= deadline {
                return self.get_at_least(after_version).await;
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => return Err(CounterError::ShuttingDown),
                changed = tokio::time::timeout_at(deadline, rx.changed()) => {
                    if changed.is_err() {
                        return self.get_at_least(after_version).await;
                    }
                },
            }
        }
    }

    fn start_watching(self: &Arc<Self>) {
        {
            let mut watching = self.watching.lock().unwrap_or_else(|p| p.into_inner());
            if *watching {
                return;
            }
            *watching = true;
        }
        let counter = self.clone();
        let owner = format!("counter {}", self.name);
        self.tasks.spawn(supervise::until_shutdown(
            Task::CounterWatch,
            owner,
            self.metrics.clone(),
            self.shutdown.clone(),
            move || counter.clone().watch_loop(),
        ));
    }

    /// Keeps one data watch armed across reconnects and new sessions.
    async fn watch_loop(self: Arc<Self>) {
        loop {
            let far = Instant::now() + Duration::from_secs(3600);
            let zk = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                zk = self.session.connected(far) => zk,
            };
            let Ok(zk) = zk else { continue };
            let zk = zk.with_deadline(self.zk_deadline());
            let watched = match zk.get_and_watch_data(&self.path).await {
                Ok(found) => Ok(found),
                Err(ZkError::NoNode) => match self.ensure(&zk).await {
                    Ok(()) => continue,
                    Err(err) => Err(err),
                },
                Err(err) => Err(err.into()),
            };
            let (data, stat, watch) = match watched {
                Ok(found) => found,
                Err(_) => {
                    tokio::select! {
                        _ = self.shutdown.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                    }
                },
            };
            let value = decode(&data).ok().map(|value| Versioned { value, version: stat.version });
            self.latest.send_replace(value);
            let mut status = self.session.subscribe();
            let epoch = status.borrow_and_update().epoch;
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                event = watch.changed() => {
                    if event == WatchEvent::SessionEnded {
                        continue;
                    }
                },
                // A reconnect may have hidden a change: re-read.
                _ = async { while status.changed().await.is_ok() { if status.borrow_and_update().epoch != epoch { return } } } => {},
            }
        }
    }

    /// Sets the value unconditionally (Curator's `setCount`).
    async fn set(&self, value: i32) -> Result<Versioned, CounterError> {
        let zk = self.zk().await?;
        // Never overwrite data that is not a SharedCount.
        // Changed since our check: the last writer wins anyway, as with Curator's setCount, but
        // only over an int; so re-check and retry, a bounded number of times.
        for attempt in 0..ADD_ATTEMPTS {
            let current = self.read(&zk).await?;
            match zk.set_data(&self.path, &encode(value), Some(current.version)).await {
                Ok(stat) => return Ok(Versioned { value, version: stat.version }),
                Err(ZkError::BadVersion) => backoff(attempt).await,
                Err(err) => return Err(err.into()),
            }
        }
        Err(CounterError::Contention)
    }

    /// Compare-and-set (Curator's `trySetCount`): succeeds only if the version is `expected`.
    async fn compare_and_set(&self, expected: i32, value: i32) -> Result<Versioned, CounterError> {
        if expected == -1 {
            return Err(CounterError::VersionOverflow);
        }
        let zk = self.zk().await?;
        match zk.set_data(&self.path, &encode(value), Some(expected)).await {
            Ok(stat) => Ok(Versioned { value, version: stat.version }),
            Err(ZkError::BadVersion) => Err(CounterError::VersionMismatch(self.read(&zk).await?)),
            Err(ZkError::NoNode) => {
                self.ensure(&zk).await?;
                Err(CounterError::VersionMismatch(self.read(&zk).await?))
            },
            Err(err) => Err(err.into()),
        }
    }

    /// Adds atomically with a bounded compare-and-set loop.
    async fn add_with_retries(&self, delta: i32) -> Result<Versioned, CounterError> {
        let zk = self.zk().await?;
        for attempt in 0..ADD_ATTEMPTS {
            let current = self.read(&zk).await?;
            if current.version == -1 {
                return Err(CounterError::VersionOverflow);
            }
            let value =
                current.value.checked_add(delta).ok_or(CounterError::Overflow { value: current.value, delta })?;
            match zk.set_data(&self.path, &encode(value), Some(current.version)).await {
                Ok(stat) => return Ok(Versioned { value, version: stat.version }),
                Err(ZkError::BadVersion) => backoff(attempt).await,
                Err(err) => return Err(err.into()),
            }
        }
        Err(CounterError::Contention)
    }
}

/// Backs off a little after a lost compare-and-set (`attempt` from 0), more each time and fully
/// jittered, so contenders spread out: up to 1 ms, 2 ms, … 64 ms.
async fn backoff(attempt: u32) {
    const CONTENTION: Backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(64), 1.0);
    tokio::time::sleep(CONTENTION.delay(attempt.saturating_add(1))).await;
}

/// All counters of this process; dynamic ones are created on first use.
pub(crate) struct CounterService {
    config: Arc<Config>,
    session: ZkSession,
    metrics: Arc<Metrics>,
    counters: Mutex<HashMap<CounterName, Arc<Counter>>>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl CounterService {
    pub(crate) fn new(
        config: Arc<Config>,
        session: ZkSession,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
        tasks: TaskTracker,
    ) -> Arc<CounterService> {
        Arc::new(CounterService { config, session, metrics, counters: Mutex::new(HashMap::new()), shutdown, tasks })
    }

    /// The counter called `name` for a read: never creates anything. A dynamic counter this
    /// process has not open is opened only if its node exists (one `exists` read).
    pub(crate) async fn existing(&self, name: &CounterName) -> Result<Arc<Counter>, CounterError> {
        let known = self.config.counters.contains_key(name)
            || self.counters.lock().unwrap_or_else(|p| p.into_inner()).contains_key(name);
        if known || !self.config.counters_dynamic {
            return self.open(name);
        }
        let path = Layout::new(&self.config.zookeeper.root).counter(name);
        let zk = self.session.connected(Instant::now() + self.session.request_timeout()).await?;
        match zk.exists(&path).await? {
            Some(_) => self.open(name),
            None => Err(CounterError::NoSuchCounter(name.clone())),
        }
    }

    /// The counter called `name` for a write, opening it on first use (a dynamic counter's node
    /// is created with seed 0 by its first write).
    pub(crate) fn open(&self, name: &CounterName) -> Result<Arc<Counter>, CounterError> {
        let mut counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(counter) = counters.get(name) {
            return Ok(counter.clone());
        }
        let layout = Layout::new(&self.config.zookeeper.root);
        let (path, seed) = match self.config.counters.get(name) {
            Some(declared) => (declared.path.clone().unwrap_or_else(|| layout.counter(name)), declared.seed),
            None => {
                if !self.config.counters_dynamic {
                    return Err(CounterError::UnknownCounter(name.clone()));
                }
                let dynamic = counters.keys().filter(|n| !self.config.counters.contains_key(*n)).count();
                if dynamic >= self.config.max_dynamic_queues {
                    return Err(CounterError::TooManyCounters(self.config.max_dynamic_queues));
                }
                (layout.counter(name), 0)
            },
        };
        let counter = Arc::new(Counter {
            name: name.clone(),
            path,
            seed,
            session: self.session.clone(),
            latest: watch::channel(None).0,
            watching: Mutex::new(false),
            metrics: self.metrics.clone(),
            shutdown: self.shutdown.clone(),
            tasks: self.tasks.clone(),
        });
        self.metrics.counter_operations.with_label_values(&["open", "ok"]).inc();
        counters.insert(name.clone(), counter.clone());
        Ok(counter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_matches_curators_shared_count() {
        // docs/curator-format.md §6: seed 258 -> 00000102, setCount(-2) -> fffffffe.
        assert_eq!(encode(258), [0, 0, 1, 2]);
        assert_eq!(encode(-2), [0xff, 0xff, 0xff, 0xfe]);
        assert_eq!(decode(&[0xff, 0xff, 0xff, 0xfe]), Ok(-2));
        assert_eq!(decode(b"abc"), Err(CounterError::NotAnInt { len: 3 }));
        assert_eq!(decode(b"12345"), Err(CounterError::NotAnInt { len: 5 }));
    }
}
