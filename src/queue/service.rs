//! [`QueueService`]: every queue this process serves, opened on first use and closed when idle,
//! and where a queue lives ([`queue_layout`]).

mod start;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::catalog::{self, Presence};
use super::claims::ClaimMarkers;
use super::facade::{Queue, QueueRef};
use super::lease::LeaseMemories;
use super::names;
use super::put::idempotency;
use super::settings::DeadLetter;
use super::settings::{Current, QueueSettings};
use super::spec::QueueSpec;
use super::{HeadAge, QueueError};
use crate::config::{Config, QueueKind};
use crate::metrics::Metrics;
use crate::supervise::{self, Task};
use crate::types::{Layout, QueueName, now_epoch_ms};
use crate::zk::{GroupCommit, ZkSession};

/// Where a queue lives and how its nodes are named.
pub(crate) struct QueueLayout {
    pub kind: QueueKind,
    pub path: String,
    pub lock_path: Option<String>,
    /// Its messages carry groups (`queues.NAME.grouped`).
    pub grouped: bool,
}

/// Kind, path and lock path of a queue, declared or not: a declared queue's own settings, else
/// a fifo queue at `{root}/queues/{name}` locked at `{root}/locks/{name}`.
pub(crate) fn queue_layout(config: &Config, name: &str) -> QueueLayout {
    let layout = Layout::new(&config.zookeeper.root);
    match config.queues.get(name) {
        Some(declared) => QueueLayout {
            kind: declared.kind,
            path: declared.path.clone().unwrap_or_else(|| layout.queue(name)),
            lock_path: match (&declared.lock_path, declared.kind) {
                (Some(lock_path), _) => Some(lock_path.clone()),
                (None, QueueKind::Simple) => None,
                (None, _) if declared.path.is_none() => Some(layout.locks(name)),
                // An attached Curator queue without a lock path: its consumers use none.
                (None, _) => None,
            },
            grouped: declared.grouped,
        },
        // A dynamic queue named `*.fifo` is grouped, as an SQS FIFO queue is: the name says so
        // to every sidecar alike.
        None => QueueLayout {
            kind: QueueKind::Fifo,
            path: layout.queue(name),
            lock_path: Some(layout.locks(name)),
            grouped: config.queues_dynamic_grouped || name.ends_with(".fifo"),
        },
    }
}

/// The most settings nodes a look for dead-letter sources reads.
const MAX_SETTINGS_READ: usize = 1000;

/// Where dead letters go, when they go to `target` after `max_deliveries`.
pub(super) fn dead_letter_of(config: &Config, target: &QueueName, max_deliveries: Option<u32>) -> DeadLetter {
    let layout = queue_layout(config, target);
    DeadLetter {
        max_deliveries,
        name: target.clone(),
        kind: names::naming(layout.kind, layout.grouped),
        path: layout.path,
    }
}

/// When a queue's present incarnation began and last changed (epoch ms, ZooKeeper's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueTimes {
    pub created_ms: i64,
    pub modified_ms: i64,
}

/// What [`QueueService::create`] found or did.
#[derive(Debug, Clone)]
pub(crate) struct Created {
    /// Whether this call made the queue; `false`: it existed (a declared queue always does).
    pub made: bool,
    /// A dynamic queue's own settings, as ZooKeeper holds them (a declared queue's are its
    /// configuration: none here).
    pub settings: QueueSettings,
}

/// What a front does with a queue it opens ([`QueueService::queue`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// Storing a message (zkq's put, a batch put, a redrive's destination): the queue is opened,
    /// made to exist again first if it was deleted, and the put creates its node.
    Put,
    /// Reading the queue or its messages (info, browse, settings, every SQS action on a queue):
    /// never creates; a dynamic queue without a node is no such queue.
    Look,
    /// A step of a lease (extend, ack, release, nack): a queue this process has open, or leased
    /// from since it closed idle (its lease memory answers a late retry). Touches nothing.
    Step,
    /// Serving a queue the caller has just made or checked (SQS `CreateQueue`, which writes the
    /// queue's node itself): opened here, nothing written.
    Serve,
}

/// All queues this process serves; dynamic ones are created on first use.
pub(crate) struct QueueService {
    config: Arc<Config>,
    session: ZkSession,
    metrics: Arc<Metrics>,
    queues: Mutex<HashMap<QueueName, Arc<Queue>>>,
    dynamic_count: Mutex<usize>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    markers: Arc<ClaimMarkers>,
    group: Arc<GroupCommit>,
    background: TaskTracker,
    /// What each queue's leases leave behind, kept when an idle dynamic queue closes.
    lease_memories: LeaseMemories,
}

impl QueueService {
    pub(crate) fn new(
        config: Arc<Config>,
        session: ZkSession,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
        tasks: TaskTracker,
    ) -> Arc<QueueService> {
        let markers = Arc::new(ClaimMarkers::new(
            &Layout::new(&config.zookeeper.root),
            session.clone(),
            config.take.claim_marker_age,
        ));
        tasks.spawn({
            let markers = markers.clone();
            async move { markers.run_flusher().await }
        });
        tasks.spawn({
            let (markers, shutdown) = (markers.clone(), shutdown.clone());
            async move { markers.run_stale_sweeper(shutdown).await }
        });
        let group = GroupCommit::new(metrics.clone());
        let service = Arc::new(QueueService {
            config,
            session,
            metrics,
            queues: Mutex::new(HashMap::new()),
            dynamic_count: Mutex::new(0),
            shutdown: shutdown.clone(),
            tasks: tasks.clone(),
            markers,
            group,
            background: TaskTracker::new(),
            lease_memories: LeaseMemories::default(),
        });
        tasks.spawn({
            let service = Arc::downgrade(&service);
            async move { QueueService::run_idle_closer(service, shutdown).await }
        });
        // Declared queues start their caches at once, so their metrics exist from the start.
        let declared: Vec<QueueName> = service.config.queues.keys().cloned().collect();
        for name in declared {
            if let Err(err) = service.open(&name) {
                tracing::error!(queue = %name, error = %err, "cannot open declared queue");
            }
        }
        tasks.spawn(supervise::until_shutdown(
            Task::IdempotencySweeper,
            "idempotency records of queues not open here".to_owned(),
            service.metrics.clone(),
            service.shutdown.clone(),
            {
                let (service, shutdown) = (Arc::downgrade(&service), service.shutdown.clone());
                move || QueueService::run_orphan_sweeper(service.clone(), shutdown.clone())
            },
        ));
        service
    }

    /// Sweeps the expired idempotency records of queues this process does not have open, at once
    /// and then every 10 minutes (`idempotency::sweep_queues_not_open`): a queue's own sweeper
    /// runs only while some process has it open, and a dynamic queue nobody opens again would keep
    /// its records forever.
    async fn run_orphan_sweeper(service: std::sync::Weak<QueueService>, shutdown: CancellationToken) {
        let Some(session) = service.upgrade().map(|s| s.session.clone()) else { return };
        let service = &service;
        session
            .periodically(idempotency::IDLE_CHECK, &shutdown, |zk| async move {
                let Some(service) = service.upgrade() else { return };
                let is_open =
                    |queue: &str| service.queues.lock().unwrap_or_else(|p| p.into_inner()).contains_key(queue);
                let layout = Layout::new(&service.config.zookeeper.root);
                let timeout = service.session.request_timeout();
                match idempotency::sweep_queues_not_open(&zk, &layout, timeout, is_open, &service.shutdown).await {
                    Ok(0) => {},
                    Ok(swept) => tracing::info!(swept, "swept expired idempotency records of queues not open here"),
                    Err(err) => {
                        tracing::debug!(error = %err, "could not look for idempotency records of queues not open here")
                    },
                }
            })
            .await;
    }

    /// The one door every front opens a queue through: what it does with the queue (`purpose`)
    /// decides here, once, whether opening it may create anything. Only a put writes the queue
    /// into being; a look, a take and a lease step never create (see [`Purpose`]).
    pub(crate) async fn queue(&self, name: &QueueName, purpose: Purpose) -> Result<QueueRef, QueueError> {
        match purpose {
            Purpose::Put => self.open_for_put(name).await,
            Purpose::Look => {
                self.existing(name, Duration::ZERO).await?.ok_or_else(|| QueueError::NoSuchQueue(name.clone()))
            },
            Purpose::Step => self.open_only(name),
            Purpose::Serve => self.open(name),
        }
    }

    /// The queue called `name` to take or lease from, waiting up to `wait` for it: `None` for a
    /// dynamic queue whose node is not made yet, which is empty to a taker (nothing is created).
    pub(crate) async fn queue_to_take(&self, name: &QueueName, wait: Duration) -> Result<Option<QueueRef>, QueueError> {
        self.existing(name, wait).await
    }

    /// A declared queue to serve (push delivery starts before any request): it is in the
    /// configuration, so opening it decides nothing.
    pub(crate) fn declared(&self, name: &QueueName) -> Result<QueueRef, QueueError> {
        if !self.config.queues.contains_key(name) {
            return Err(QueueError::UnknownQueue(name.to_owned()));
        }
        self.open(name)
    }

    /// The queue called `name` for a write (a put), opening it on first use: the put creates the
    /// queue's node when it does not exist (nothing else does).
    fn open(&self, name: &QueueName) -> Result<QueueRef, QueueError> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(queue) = queues.get(name) {
            return Ok(queue.used());
        }
        let queue = self.start_queue(QueueSpec::resolve(&self.config, name))?;
        let used = queue.used();
        queues.insert(name.clone(), queue);
        Ok(used)
    }

    /// Makes queue `name` exist with `settings` (an SQS `CreateQueue`), or finds it existing:
    /// a dynamic queue's node and its settings node are written in one transaction
    /// (`catalog::create`), so nothing is left behind by a call that fails and no sidecar ever
    /// serves the new queue without its settings. `settings` are checked first (a dead-letter
    /// queue must exist). What the queue has is returned with whether this call made it; a
    /// declared queue exists with its configuration.
    pub(crate) async fn create(
        &self,
        name: &QueueName,
        settings: QueueSettings,
    ) -> Result<(QueueRef, Created), QueueError> {
        let queue = self.open(name)?;
        if queue.declared() {
            return Ok((queue, Created { made: false, settings: QueueSettings::default() }));
        }
        settings.check(name).map_err(QueueError::InvalidParameter)?;
        if let Some(target) = &settings.dead_letter
            && !self.stored(target).await?
        {
            return Err(QueueError::InvalidParameter(format!("the dead-letter queue {target} does not exist")));
        }
        let settings_path = Layout::new(&self.config.zookeeper.root).settings(name);
        let data = (settings != QueueSettings::default()).then(|| serde_json::to_vec(&settings).unwrap_or_default());
        let deadline = Instant::now() + self.session.request_timeout();
        let zk = self.session.connected(deadline).await?.with_deadline(deadline);
        let created = match catalog::create(&zk, queue.path(), &settings_path, data.as_deref()).await? {
            catalog::Creation::Made => Created { made: true, settings },
            catalog::Creation::Existed(data) => {
                let settings = match data {
                    None => QueueSettings::default(),
                    Some(data) => QueueSettings::read_node(&data, name).unwrap_or_else(|err| {
                        tracing::warn!(queue = %name, node = %settings_path, error = %err,
                            "the queue's settings node does not hold valid zkq settings; serving the defaults");
                        self.metrics.settings_refused.inc();
                        QueueSettings::default()
                    }),
                };
                Created { made: false, settings }
            },
        };
        queue.seen_live();
        let dead_letter = created
            .settings
            .dead_letter
            .as_ref()
            .map(|target| Arc::new(self.dead_letter_of(target, created.settings.max_deliveries)));
        queue.settings_written(Current { settings: created.settings.clone(), dead_letter });
        Ok((queue, created))
    }

    /// The queue called `name` for a put (zkq's own API, push, a redrive's destination): opened
    /// as [`QueueService::open`] does, and, when it was deleted, made to exist again first, so
    /// that a put never stores a message in a deleted queue (`catalog`). A queue this process
    /// has read since it opened costs nothing more; one it has not, one read.
    async fn open_for_put(&self, name: &QueueName) -> Result<QueueRef, QueueError> {
        let queue = self.open(name)?;
        // Absent needs nothing: the put creates the node.
        if matches!(queue.presence(), None | Some(Presence::Deleted)) && !queue.declared() {
            let deadline = Instant::now() + self.session.request_timeout();
            let zk = self.session.connected(deadline).await?.with_deadline(deadline);
            catalog::revive(&zk, queue.path()).await?;
            queue.seen_live();
        }
        self.settings_loaded(&queue).await?;
        Ok(queue)
    }

    /// The queue called `name` if this process has it open (declared queues always are), or a
    /// dynamic queue closed idle since it leased here (opened again with its lease memory); for
    /// lease steps, which only such a queue can have. Touches nothing in ZooKeeper.
    fn open_only(&self, name: &QueueName) -> Result<QueueRef, QueueError> {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        match queues.get(name) {
            Some(queue) => Ok(queue.used()),
            None if self.config.queues.contains_key(name) => {
                drop(queues);
                self.open(name)
            },
            // A dynamic queue closed idle since it leased: open it again with its lease memory,
            // so a late retry of a step answers as the step did.
            None if self.config.queues_dynamic && self.lease_memories.remembers(name) => {
                drop(queues);
                self.open(name)
            },
            None if !self.config.queues_dynamic => Err(QueueError::UnknownQueue(name.to_owned())),
            None => Err(QueueError::NoSuchQueue(name.to_owned())),
        }
    }

    /// The queue called `name` for a read, a take or a lease: never creates anything in
    /// ZooKeeper. A dynamic queue this process has not open is served once its node exists
    /// (another sidecar or a Curator producer created it): without a wait, after a `sync` and one
    /// read (`None`: no such queue); with one (a take or lease that waits), the queue is opened
    /// here and served at once: its takers wait in its cache, which follows the node's
    /// appearance with the refresher's one watch, and to whom a queue not made yet is empty.
    ///
    /// Two rules keep its answers honest:
    /// - "No such queue" is trusted only after a `sync`: a lagging server may not have applied the
    ///   put that created the queue on another sidecar, acknowledged before this request arrived.
    /// - No one-shot watch is ever set on a queue's path: beside the cache's persistent watch it
    ///   breaks that watch on ZooKeeper before 3.9 (ZOOKEEPER-4466): see [`Self::await_live`].
    async fn existing(&self, name: &QueueName, wait: Duration) -> Result<Option<QueueRef>, QueueError> {
        let queue = self.find_existing(name, wait).await?;
        if let Some(queue) = &queue {
            self.settings_loaded(queue).await?;
        }
        Ok(queue)
    }

    /// Waits until `queue` serves with its own settings (read from ZooKeeper when it opened):
    /// a queue is never served with the defaults in their place. 503 when they cannot be read
    /// within a request's timeout.
    async fn settings_loaded(&self, queue: &QueueRef) -> Result<(), QueueError> {
        if queue.settings_loaded(Instant::now() + self.session.request_timeout()).await {
            Ok(())
        } else {
            Err(QueueError::Zk(crate::zk::ZkError::Unavailable))
        }
    }

    async fn find_existing(&self, name: &QueueName, wait: Duration) -> Result<Option<QueueRef>, QueueError> {
        match self.open_only(name) {
            Err(QueueError::NoSuchQueue(_)) => {},
            // Open here, but its node was seen deleted: ZooKeeper says whether it was made anew.
            // (Not yet read, or no node yet: served as an open queue is, from its cache, which
            // waits for the node through an outage too.)
            Ok(queue) if !queue.declared() && queue.presence() == Some(Presence::Deleted) => {
                return self.await_live(queue, wait, true).await;
            },
            other => return other.map(Some),
        }
        if self.shutdown.is_cancelled() {
            return Err(QueueError::ShuttingDown);
        }
        if wait.is_zero() {
            let path = self.layout(name).path;
            let zk = self.session.connected(Instant::now() + self.session.request_timeout()).await?;
            let zk = zk.with_deadline(Instant::now() + self.session.request_timeout());
            zk.sync(&path).await?;
            return match catalog::presence(&zk, &path).await? {
                Presence::Live => self.open_live(name).map(Some),
                Presence::Absent | Presence::Deleted => Ok(None),
            };
        }
        // A taker that waits for a queue not made yet waits in the queue's own cache: it is
        // opened here, its refresher's one persistent watch sees the node and its first message
        // appear for every such taker at once, and the put wakes the longest-waiting one, first
        // come first served, not every one. To a taker a queue not made yet is empty.
        self.open(name).map(Some)
    }

    /// An open queue served once it is live, waiting up to `wait`: as its refresher follows the
    /// node (its persistent watch), and after a `sync` and a read of its own first when
    /// `read_first` (a queue seen deleted) and once more when the wait is over (an answer "no
    /// such queue" is trusted only then). It never adds a watch of its own: a one-shot watch
    /// beside the refresher's persistent watch on the same path makes ZooKeeper before 3.9 drop
    /// the persistent watch's data part (ZOOKEEPER-4466), and with it every later creation
    /// event of the queue's messages.
    async fn await_live(
        &self,
        queue: QueueRef,
        wait: Duration,
        read_first: bool,
    ) -> Result<Option<QueueRef>, QueueError> {
        let wait_until = Instant::now() + wait;
        let answer_by = wait_until.max(Instant::now() + self.session.request_timeout());
        let mut changes = queue.presence_changes();
        let (mut read, mut last) = (read_first || wait.is_zero(), wait.is_zero());
        loop {
            if read {
                let zk = self.session.connected(answer_by).await?;
                let zk = zk.with_deadline(Instant::now() + self.session.request_timeout());
                zk.sync(queue.path()).await?;
                if catalog::presence(&zk, queue.path()).await?.is_live() {
                    queue.seen_live();
                    return Ok(Some(queue));
                }
                if last {
                    return Ok(None);
                }
                read = false;
            }
            if changes.borrow_and_update().is_some_and(Presence::is_live) {
                return Ok(Some(queue));
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return Err(QueueError::ShuttingDown) },
                // Its wait is over: one more read says, whatever the refresher saw.
                _ = tokio::time::sleep_until(wait_until) => (read, last) = (true, true),
                _ = self.shutdown.cancelled() => return Err(QueueError::ShuttingDown),
            }
        }
    }

    /// Opens queue `name`, whose node ZooKeeper just showed live.
    fn open_live(&self, name: &QueueName) -> Result<QueueRef, QueueError> {
        let queue = self.open(name)?;
        queue.seen_live();
        Ok(queue)
    }

    /// Closes dynamic queues nobody used for `queue_idle_close`: their tasks end, their cache is
    /// freed, their metric series are dropped and their slot under `max_dynamic_queues` is
    /// released. A queue with a request, a waiting taker or a lease out is never closed; the
    /// next request opens it again.
    async fn run_idle_closer(service: std::sync::Weak<QueueService>, shutdown: CancellationToken) {
        let Some(idle) = service.upgrade().map(|s| s.config.queue_idle_close) else { return };
        let every = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(every) => {},
            }
            let Some(service) = service.upgrade() else { return };
            service.close_idle(idle);
        }
    }

    fn close_idle(&self, idle: Duration) {
        // Under the map lock: `open` counts a new user under it too, so no request can start
        // using a queue between the check and its removal.
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let idle_names: Vec<QueueName> =
            queues.values().filter(|q| !q.declared() && q.idle_for(idle)).map(|q| q.name().clone()).collect();
        for name in idle_names {
            self.close_locked(&mut queues, &name);
            tracing::debug!(queue = %name, "closed an idle dynamic queue");
        }
    }

    /// Writes dynamic queue `name`'s own settings (SQS's `SetQueueAttributes`), applied to every
    /// field given (`change` gets the current ones and returns the new); every sidecar with the
    /// queue open follows. A declared queue is refused: its configuration is its settings.
    pub(crate) async fn set_settings(
        &self,
        name: &QueueName,
        change: impl Fn(QueueSettings) -> Result<QueueSettings, String>,
    ) -> Result<QueueSettings, QueueError> {
        if self.config.queues.contains_key(name) {
            return Err(QueueError::Declared(name.clone()));
        }
        let path = Layout::new(&self.config.zookeeper.root).settings(name);
        let deadline = Instant::now() + self.session.request_timeout();
        let zk = self.session.connected(deadline).await?.with_deadline(deadline);
        let written = loop {
            let (current, version) = match zk.get_data(&path).await {
                // A node that does not parse is replaced by what the client says now.
                Ok((data, stat)) => (QueueSettings::parse(&data).unwrap_or_default(), Some(stat.version)),
                Err(crate::zk::ZkError::NoNode) => (QueueSettings::default(), None),
                Err(err) => return Err(err.into()),
            };
            let new = change(current).map_err(QueueError::InvalidParameter)?;
            new.check(name).map_err(QueueError::InvalidParameter)?;
            if let Some(target) = &new.dead_letter
                && !self.stored(target).await?
            {
                return Err(QueueError::InvalidParameter(format!("the dead-letter queue {target} does not exist")));
            }
            let data = serde_json::to_vec(&new).unwrap_or_default();
            let result = match version {
                Some(version) => zk.set_data(&path, &data, Some(version)).await.map(|_| ()),
                None => match zk.create(&path, &data, crate::zk::NodeMode::Persistent).await {
                    Err(crate::zk::ZkError::NoNode) => {
                        zk.ensure_path(&Layout::new(&self.config.zookeeper.root).settings_dir()).await?;
                        continue;
                    },
                    other => other.map(|_| ()),
                },
            };
            match result {
                Ok(()) => break new,
                // Another writer came first: read again and apply the change to what it wrote.
                Err(crate::zk::ZkError::BadVersion | crate::zk::ZkError::NodeExists) => continue,
                Err(err) => return Err(err.into()),
            }
        };
        let open = self.queues.lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned();
        if let Some(queue) = open {
            let dead_letter = written
                .dead_letter
                .as_ref()
                .map(|target| Arc::new(self.dead_letter_of(target, written.max_deliveries)));
            queue.settings_written(Current { settings: written.clone(), dead_letter });
        }
        Ok(written)
    }

    /// The queues whose dead letters go to `name`: declared ones, and dynamic ones whose
    /// settings say so (their settings nodes read, at most [`MAX_SETTINGS_READ`]).
    pub(crate) async fn dead_letter_sources(&self, name: &QueueName) -> Result<Vec<QueueName>, QueueError> {
        let mut sources: Vec<QueueName> = self
            .config
            .queues
            .iter()
            .filter(|(_, q)| q.dead_letter.as_ref() == Some(name))
            .map(|(source, _)| source.clone())
            .collect();
        let dir = Layout::new(&self.config.zookeeper.root).settings_dir();
        let deadline = Instant::now() + self.session.request_timeout();
        let zk = self.session.connected(deadline).await?.with_deadline(deadline);
        let children = match zk.get_children(&dir).await {
            Ok((children, _)) => children,
            Err(crate::zk::ZkError::NoNode) => Vec::new(),
            Err(err) => return Err(err.into()),
        };
        let paths: Vec<String> = children.iter().take(MAX_SETTINGS_READ).map(|c| format!("{dir}/{c}")).collect();
        let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
        for (child, read) in children.iter().zip(zk.get_data_many(&refs).await?) {
            let Ok((data, _)) = read else { continue };
            let Ok(settings) = QueueSettings::parse(&data) else { continue };
            if settings.dead_letter.as_ref() == Some(name)
                && let Ok(source) = child.parse::<QueueName>()
                && !self.config.queues.contains_key(&source)
            {
                sources.push(source);
            }
        }
        sources.sort();
        Ok(sources)
    }

    /// Whether queue `name` exists now: declared, or its node is in ZooKeeper (after a `sync`,
    /// so a queue another sidecar created or deleted is seen as it is).
    pub(crate) async fn stored(&self, name: &QueueName) -> Result<bool, QueueError> {
        if self.config.queues.contains_key(name) {
            return Ok(true);
        }
        let path = self.layout(name).path;
        let deadline = Instant::now() + self.session.request_timeout();
        let zk = self.session.connected(deadline).await?.with_deadline(deadline);
        zk.sync(&path).await?;
        Ok(catalog::presence(&zk, &path).await?.is_live())
    }

    /// When queue `name`'s present incarnation began and when it or its settings last changed,
    /// from ZooKeeper's own clocks: the queue node's last write (its creation, or the put or
    /// `CreateQueue` that made a deleted queue anew; nothing else writes a queue node's data),
    /// and its settings node's last write. `None` while it has no node (a declared queue nothing
    /// wrote to yet; a dynamic queue that does not exist).
    pub(crate) async fn timestamps(&self, name: &QueueName) -> Result<Option<QueueTimes>, QueueError> {
        let path = self.layout(name).path;
        let settings = Layout::new(&self.config.zookeeper.root).settings(name);
        let deadline = Instant::now() + self.session.request_timeout();
        let zk = self.session.connected(deadline).await?.with_deadline(deadline);
        let Some(queue) = zk.exists(&path).await? else { return Ok(None) };
        let settings_written = zk.exists(&settings).await?.map_or(queue.mtime, |s| s.mtime);
        Ok(Some(QueueTimes { created_ms: queue.mtime, modified_ms: queue.mtime.max(settings_written) }))
    }

    /// Deletes dynamic queue `name` (SQS's `DeleteQueue`): its node marked deleted (and kept),
    /// then its messages, held or not, their locks, its delivery counts, its idempotency records
    /// and its tags, so a retried put with an old idempotency key stores anew and a stale
    /// receipt is refused. Closed here once nothing uses it; on other sidecars it closes when
    /// idle. A put to it afterwards creates it anew; a message such a put stores while the
    /// delete still runs is not deleted, nor its lock, count or idempotency record (only what
    /// was made before the mark is: `catalog::ended_incarnation`). `complete: false` when the request's deadline came first: deleting again goes on.
    /// A declared queue is refused; a queue whose node does not exist is no such queue.
    pub(crate) async fn delete(&self, name: &QueueName) -> Result<super::Purged, QueueError> {
        if self.config.queues.contains_key(name) {
            return Err(QueueError::Declared(name.clone()));
        }
        if !self.config.queues_dynamic {
            return Err(QueueError::UnknownQueue(name.clone()));
        }
        let layout = self.layout(name);
        let paths = Layout::new(&self.config.zookeeper.root);
        let deadline = Instant::now() + self.session.request_timeout();
        let zk = self.session.connected(deadline).await?.with_deadline(deadline);
        zk.sync(&layout.path).await?;
        // The mark first: from then on no sidecar serves the queue (each ends its leases as it
        // sees it), and the node, kept, goes on numbering its children, so nothing named in
        // this incarnation is ever named in the next (`catalog`). Then the messages, held or
        // not: the locks, counts, records, tags and settings then describe nothing. A delete
        // cut short by its deadline is finished by the next one.
        let (was, mark) = catalog::mark_deleted(&zk, &layout.path, &paths.settings(name)).await?;
        let existed = was == Presence::Live;
        self.seen_deleted(name);
        // Only the deleted incarnation's messages and locks: a put may make the queue anew while
        // this runs, and its message and a lease's lock are no part of this delete.
        let ended = match mark {
            Some(zxid) => catalog::ended_incarnation(&zk, &layout.path, zxid).await?,
            None => catalog::Ended::ALL,
        };
        let doomed = |child: &str| ended.holds(child);
        let (removed, complete) = zk.delete_below_where(&layout.path, &doomed).await?;
        if !complete {
            return Ok(super::Purged { removed, complete });
        }
        let mut leftovers = 0;
        if let Some(lock_path) = &layout.lock_path {
            // The lock directory stays, as the queue's node does: claims expect it.
            let (gone, complete) = zk.delete_below_where(lock_path, &doomed).await?;
            leftovers += gone;
            if !complete {
                return Ok(super::Purged { removed, complete: false });
            }
        }
        // The delivery counts of the deleted incarnation's messages (named as they are): a
        // lease of a message of the queue made anew acks with its count, which must stay.
        let (gone, complete) = zk.delete_below_where(&paths.deliveries(name), &doomed).await?;
        leftovers += gone;
        if !complete {
            return Ok(super::Purged { removed, complete: false });
        }
        // The keys of the deleted incarnation's puts: a put made while this runs keeps its own.
        let (gone, complete) = match mark {
            Some(zxid) => idempotency::forget_written_before(&zk, &paths, name, zxid).await?,
            None => zk.delete_tree(&paths.idempotency_of(name)).await?,
        };
        leftovers += gone;
        if !complete {
            return Ok(super::Purged { removed, complete: false });
        }
        // The settings went with the mark.
        let (gone, complete) = zk.delete_tree(&paths.tags(name)).await?;
        leftovers += gone;
        if !complete {
            return Ok(super::Purged { removed, complete: false });
        }
        if !existed && removed == 0 && leftovers == 0 {
            return Err(QueueError::NoSuchQueue(name.clone()));
        }
        self.close_deleted(name);
        tracing::info!(queue = %name, removed, "deleted a dynamic queue");
        Ok(super::Purged { removed, complete: true })
    }

    /// Tells queue `name`, if open here, that it was deleted (its refresher would see the mark a
    /// moment later): its leases end and nothing here serves it as live.
    fn seen_deleted(&self, name: &QueueName) {
        let open = self.queues.lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned();
        if let Some(queue) = open {
            queue.seen_deleted();
        }
    }

    /// Closes deleted queue `name` here when nothing uses it any more: no request (a long-poll),
    /// and no lease. A lease still out may be one of the queue made anew by a put while the
    /// delete ran: closed with it, its lock would hold its message for as long as the session
    /// lives. Such a queue closes when idle. Its lease memory is forgotten with it.
    fn close_deleted(&self, name: &QueueName) {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        if queues.get(name).is_some_and(|q| q.idle_for(Duration::ZERO)) {
            self.close_locked(&mut queues, name);
            self.lease_memories.forget(name);
        }
    }

    /// Closes dynamic queue `name`, under the map's lock.
    fn close_locked(&self, queues: &mut HashMap<QueueName, Arc<Queue>>, name: &QueueName) {
        let Some(queue) = queues.remove(name) else { return };
        queue.close();
        self.metrics.forget_queue(name);
        self.lease_memories.closed(name);
        let mut dynamic = self.dynamic_count.lock().unwrap_or_else(|p| p.into_inner());
        *dynamic = dynamic.saturating_sub(1);
    }

    /// Where dead letters of a queue go, when they go to `target`.
    fn dead_letter_of(&self, target: &QueueName, max_deliveries: Option<u32>) -> DeadLetter {
        dead_letter_of(&self.config, target, max_deliveries)
    }

    /// Kind, path and lock path of a queue, declared or not.
    fn layout(&self, name: &str) -> QueueLayout {
        queue_layout(&self.config, name)
    }

    /// Waits (until `deadline`) for claims still running and for put-backs and settlements of
    /// lost answers, then deletes the claim markers they left; true if all finished in time.
    /// Shutdown calls this before it closes the session.
    pub(crate) async fn settle(&self, deadline: tokio::time::Instant) -> bool {
        self.background.close();
        let settled = tokio::time::timeout_at(deadline, self.background.wait()).await.is_ok();
        if !settled {
            tracing::error!("shutdown grace ended with takes still being settled; see the errors above");
        }
        let _ = tokio::time::timeout_at(deadline, self.markers.flush_now()).await;
        settled
    }

    /// Releases every lease of every queue (shutdown).
    pub(crate) async fn release_all_leases(&self) -> usize {
        let mut released = 0;
        for queue in self.opened() {
            released += queue.release_all_leases().await;
        }
        released
    }

    /// Sets `zkq_queue_children` and `zkq_queue_oldest_message_age_seconds` of every open queue
    /// from ZooKeeper, and `zkq_idempotency_records` from its records' directory: one `exists` of
    /// the queue node and one of its records' directory per queue, plus one of its head when the
    /// head changed since the last scrape, all at once, within `budget`. A queue whose read fails
    /// or is late keeps its last values. Called by every `/metrics` scrape, so the gauges are as
    /// fresh as the scrape.
    pub(crate) async fn sample_for_scrape(&self, budget: Duration) {
        let Some(zk) = self.session.current() else { return };
        let zk = zk.with_deadline(tokio::time::Instant::now() + budget);
        let reads = self.opened().into_iter().map(|queue| {
            let zk = zk.clone();
            async move {
                let keys = queue.records_dir();
                let (depth, records) = futures::join!(zk.exists(queue.path()), zk.exists(&keys));
                let qm = queue.metrics();
                if let Some(groups) = queue.group_stats() {
                    let q = &[queue.name().as_str()];
                    let as_i64 = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
                    self.metrics.queues.flow.groups_in_flight.with_label_values(q).set(as_i64(groups.in_flight));
                    self.metrics.queues.flow.group_blocked_messages.with_label_values(q).set(as_i64(groups.blocked));
                }
                let empty = matches!(&depth, Ok(None)) || matches!(&depth, Ok(Some(stat)) if stat.num_children == 0);
                if let Ok(Some(stat)) = depth {
                    qm.queue_children.set(i64::from(stat.num_children));
                }
                if let Ok(stat) = records {
                    qm.idempotency_records.set(stat.map_or(0, |s| i64::from(s.num_children)));
                }
                let head = if empty { Ok(HeadAge::NoneWaiting) } else { queue.head_waiting_since(&zk).await };
                match head {
                    Ok(HeadAge::Since(since)) => {
                        let age_ms = (now_epoch_ms() - since).max(0);
                        qm.oldest_message_age.set(age_ms as f64 / 1000.0);
                    },
                    Ok(HeadAge::NoneWaiting) => qm.oldest_message_age.set(0.0),
                    // Not known: the gauge keeps its last value.
                    Ok(HeadAge::NotKnownYet) | Err(_) => {},
                }
            }
        });
        let _ = tokio::time::timeout(budget, futures::future::join_all(reads)).await;
    }

    /// Queues opened so far (declared ones always), sorted by name.
    pub(crate) fn opened(&self) -> Vec<Arc<Queue>> {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<Arc<Queue>> = queues.values().cloned().collect();
        all.sort_by(|a, b| a.name().cmp(b.name()));
        all
    }
}
