//! Queue semantics, without HTTP: Curator node names and envelope, the children cache and its
//! waiters, put, take, peek and remove.

mod cache;
mod claims;
pub mod envelope;
mod lease;
pub mod names;
mod ops;
mod take;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use cache::ChildrenCache;
pub use cache::now_epoch_ms;
use claims::ClaimMarkers;
use lease::LeaseTable;
pub use lease::{DeadLetter, LeaseGrant, NackMode};
pub use names::ItemMeta;
pub use ops::{Message, PeekedItem, PutOptions, PutReceipt, QueueInfo};

use crate::config::{Config, QueueKind, check_name};
use crate::metrics::Metrics;
use crate::supervise::{self, Task};
use crate::zk::{ZkError, ZkSession};

/// Why a queue operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueError {
    InvalidName(String),
    UnknownQueue(String),
    TooManyQueues(usize),
    InvalidParameter(String),
    NotForKind(String),
    TooLarge {
        size: usize,
        max: usize,
    },
    Full {
        max_items: u32,
    },
    MessageNotFound(String),
    /// The lease is no longer held (expired, acked, nacked, its session lost, another zkq).
    LeaseLost(String),
    /// The receipt is malformed or was never issued.
    LeaseNotFound(String),
    /// The queue has `lease.max_per_queue` leases out.
    TooManyLeases(usize),
    ShuttingDown,
    Zk(ZkError),
}

impl From<ZkError> for QueueError {
    fn from(err: ZkError) -> Self {
        QueueError::Zk(err)
    }
}

/// One queue: where it lives, how its nodes are named, and its cache.
pub struct Queue {
    pub name: String,
    pub kind: QueueKind,
    pub path: String,
    pub lock_path: Option<String>,
    pub max_items: Option<u32>,
    pub declared: bool,
    pub dead_letter: Option<DeadLetter>,
    /// Where delivery counts of leased messages live: `{root}/deliveries/{queue}`.
    deliveries_path: String,
    max_message_bytes: usize,
    max_peek_bytes: usize,
    max_leases: usize,
    session: ZkSession,
    metrics: Arc<Metrics>,
    cache: Arc<ChildrenCache>,
    leases: LeaseTable,
    /// Evidence for transactions whose answer was lost (shared by every queue of the process).
    markers: Arc<ClaimMarkers>,
    /// Claims and their settlement (put-backs, unknown outcomes); shutdown waits for these
    /// before it closes the session.
    background: TaskTracker,
    shutdown: CancellationToken,
}

struct QueueLayout {
    kind: QueueKind,
    path: String,
    lock_path: Option<String>,
}

/// All queues this process serves; dynamic ones are created on first use.
pub struct QueueService {
    config: Arc<Config>,
    session: ZkSession,
    metrics: Arc<Metrics>,
    queues: Mutex<HashMap<String, Arc<Queue>>>,
    dynamic_count: Mutex<usize>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    markers: Arc<ClaimMarkers>,
    background: TaskTracker,
}

impl QueueService {
    pub fn new(
        config: Arc<Config>,
        session: ZkSession,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
        tasks: TaskTracker,
    ) -> Arc<QueueService> {
        let markers = Arc::new(ClaimMarkers::new(&config.zookeeper.root, session.clone()));
        tasks.spawn({
            let markers = markers.clone();
            async move { markers.run_flusher().await }
        });
        tasks.spawn({
            let (markers, shutdown) = (markers.clone(), shutdown.clone());
            async move { markers.run_stale_sweeper(shutdown).await }
        });
        let service = Arc::new(QueueService {
            config,
            session,
            metrics,
            queues: Mutex::new(HashMap::new()),
            dynamic_count: Mutex::new(0),
            shutdown,
            tasks,
            markers,
            background: TaskTracker::new(),
        });
        // Declared queues start their caches at once, so their metrics exist from the start.
        let declared: Vec<String> = service.config.queues.keys().cloned().collect();
        for name in declared {
            if let Err(err) = service.get(&name) {
                tracing::error!(queue = %name, error = ?err, "cannot open declared queue");
            }
        }
        service
    }

    /// The queue called `name`, opening it on first use.
    pub fn get(&self, name: &str) -> Result<Arc<Queue>, QueueError> {
        check_name(name).map_err(|why| QueueError::InvalidName(format!("queue name {name:?} {why}")))?;
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(queue) = queues.get(name) {
            return Ok(queue.clone());
        }
        let declared = self.config.queues.contains_key(name);
        if !declared {
            if !self.config.queues_dynamic {
                return Err(QueueError::UnknownQueue(name.to_owned()));
            }
            let mut dynamic = self.dynamic_count.lock().unwrap_or_else(|p| p.into_inner());
            if *dynamic >= self.config.max_dynamic_queues {
                return Err(QueueError::TooManyQueues(self.config.max_dynamic_queues));
            }
            *dynamic += 1;
        }
        let layout = self.layout(name);
        let (kind, path, lock_path) = (layout.kind, layout.path, layout.lock_path);
        let declared_config = self.config.queues.get(name);
        let max_items = declared_config.and_then(|q| q.max_items);
        let dead_letter = declared_config.and_then(|q| q.dead_letter.as_ref()).map(|target| {
            let target_layout = self.layout(target);
            DeadLetter {
                max_deliveries: declared_config.and_then(|q| q.max_deliveries),
                name: target.clone(),
                kind: target_layout.kind,
                path: target_layout.path,
            }
        });
        let cache = ChildrenCache::new(
            kind,
            path.clone(),
            name.to_owned(),
            self.metrics.clone(),
            self.shutdown.clone(),
            self.tasks.clone(),
        );
        let queue = Arc::new(Queue {
            name: name.to_owned(),
            kind,
            path,
            lock_path: lock_path.clone(),
            max_items,
            declared,
            dead_letter,
            deliveries_path: format!("{}/deliveries/{name}", self.config.zookeeper.root),
            max_message_bytes: self.config.api.max_message_bytes,
            max_peek_bytes: self.config.api.max_peek_bytes,
            max_leases: self.config.lease.max_per_queue,
            session: self.session.clone(),
            metrics: self.metrics.clone(),
            cache: cache.clone(),
            leases: LeaseTable::default(),
            markers: self.markers.clone(),
            background: self.background.clone(),
            shutdown: self.shutdown.clone(),
        });
        self.metrics.touch_queue(name);
        let (session, shutdown, metrics, owner) =
            (self.session.clone(), self.shutdown.clone(), self.metrics.clone(), format!("queue {name}"));
        self.tasks.spawn(supervise::until_shutdown(
            Task::CacheRefresher,
            owner.clone(),
            metrics.clone(),
            shutdown.clone(),
            {
                let (cache, session, shutdown) = (cache.clone(), session.clone(), shutdown.clone());
                let dirs: Vec<String> = lock_path.iter().cloned().chain([self.markers.dir().to_owned()]).collect();
                move || cache.clone().run(session.clone(), dirs.clone(), shutdown.clone())
            },
        ));
        self.tasks.spawn(supervise::until_shutdown(
            Task::LeaseReaper,
            owner.clone(),
            metrics.clone(),
            shutdown.clone(),
            {
                let (queue, session, shutdown) = (queue.clone(), session.clone(), shutdown.clone());
                move || queue.clone().run_lease_reaper(session.clone(), shutdown.clone())
            },
        ));
        self.tasks.spawn(supervise::until_shutdown(Task::DeliveryCountSweeper, owner, metrics, shutdown.clone(), {
            let queue = queue.clone();
            move || queue.clone().run_delivery_count_sweeper(shutdown.clone())
        }));
        queues.insert(name.to_owned(), queue.clone());
        Ok(queue)
    }

    /// Kind, path and lock path of a queue, declared or not.
    fn layout(&self, name: &str) -> QueueLayout {
        let root = &self.config.zookeeper.root;
        match self.config.queues.get(name) {
            Some(declared) => QueueLayout {
                kind: declared.kind,
                path: declared.path.clone().unwrap_or_else(|| format!("{root}/queues/{name}")),
                lock_path: match (&declared.lock_path, declared.kind) {
                    (Some(lock_path), _) => Some(lock_path.clone()),
                    (None, QueueKind::Simple) => None,
                    (None, _) if declared.path.is_none() => Some(format!("{root}/locks/{name}")),
                    // An attached Curator queue without a lock path: its consumers use none.
                    (None, _) => None,
                },
            },
            None => QueueLayout {
                kind: QueueKind::Fifo,
                path: format!("{root}/queues/{name}"),
                lock_path: Some(format!("{root}/locks/{name}")),
            },
        }
    }

    /// Waits (until `deadline`) for claims still running and for put-backs and settlements of
    /// lost answers, then deletes the claim markers they left; true if all finished in time.
    /// Shutdown calls this before it closes the session.
    pub async fn settle(&self, deadline: tokio::time::Instant) -> bool {
        self.background.close();
        let settled = tokio::time::timeout_at(deadline, self.background.wait()).await.is_ok();
        if !settled {
            tracing::error!("shutdown grace ended with takes still being settled; see the errors above");
        }
        let _ = tokio::time::timeout_at(deadline, self.markers.flush_now()).await;
        settled
    }

    /// Releases every lease of every queue (shutdown).
    pub async fn release_all_leases(&self) -> usize {
        let mut released = 0;
        for queue in self.opened() {
            released += queue.release_all_leases().await;
        }
        released
    }

    /// Sets `zkq_queue_children` of every open queue to its node's current `numChildren`: one
    /// `exists` per queue, all at once, within `budget`. A queue whose read fails or is late keeps
    /// its last value. Called by every `/metrics` scrape, so the gauge is as fresh as the scrape.
    pub async fn sample_depths(&self, budget: Duration) {
        let Some(zk) = self.session.current() else { return };
        let zk = zk.with_deadline(tokio::time::Instant::now() + budget);
        let reads = self.opened().into_iter().map(|queue| {
            let zk = zk.clone();
            async move {
                if let Ok(Some(stat)) = zk.exists(&queue.path).await {
                    self.metrics.queue_children.with_label_values(&[&queue.name]).set(i64::from(stat.num_children));
                }
            }
        });
        let _ = tokio::time::timeout(budget, futures::future::join_all(reads)).await;
    }

    /// Queues opened so far (declared ones always), sorted by name.
    pub fn opened(&self) -> Vec<Arc<Queue>> {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<Arc<Queue>> = queues.values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }
}
