//! Message move tasks: dead letters moved back to a queue at a bounded rate (SQS's
//! `StartMessageMoveTask`, zkq's `POST /v1/queues/{queue}/redrive`).
//!
//! A task leases messages from its source queue (a dead-letter queue) and, for each, puts it to
//! its destination with an idempotency key made of the message's name and creation, then acks the
//! lease. So a message is never lost (it leaves the source only after the put is confirmed) and
//! never stored twice (a task that stops between put and ack leaves a lease that expires; whoever
//! moves the message again within the destination's idempotency window stores nothing new).
//! Bodies, attributes and the traceparent move unaltered; a kind field moves where the
//! destination's kind has it.
//!
//! One task runs per source queue on the whole ensemble: it holds the ephemeral node
//! `{root}/moves/{source}` (its JSON: handle, destination, rate, counts, refreshed every second),
//! so any zkq lists it, and any zkq cancels it by deleting that node. The task runs in the zkq
//! that started it and ends with that zkq's session or shutdown (its leases are released then).
//! Each zkq remembers the last [`FINISHED_REMEMBERED`] tasks it ran, for listing.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, QueueKind};
use crate::queue::{ItemMeta, LeaseGrant, Message, NackMode, PutOptions, QueueError, QueueRef, QueueService};
use crate::types::{Backoff, Layout, QueueName, Retries, now_epoch_ms};
use crate::zk::{NodeMode, ZkError, ZkSession};

/// The highest rate a task may ask for (as SQS's `MaxNumberOfMessagesPerSecond`).
pub const MAX_PER_SECOND: u32 = 500;
/// The rate of a task that asks for none.
pub const DEFAULT_PER_SECOND: u32 = 100;
/// Finished tasks each zkq remembers for listing.
pub const FINISHED_REMEMBERED: usize = 100;
/// How long a moved message's lease lasts: its put and ack have this long before it would be
/// leased again (and the idempotency key then stores nothing twice).
const MOVE_VISIBILITY: Duration = Duration::from_secs(60);
/// How often a running task writes its counts to its node, and looks whether it was cancelled.
const REPORT_EVERY: Duration = Duration::from_secs(1);

/// Where a task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskStatus {
    Running,
    Completed,
    Cancelled,
    Failed,
}

/// A task as it is listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskReport {
    /// Opaque; names the source queue (`{source}:{random}`).
    pub handle: String,
    pub source: String,
    pub destination: String,
    pub max_per_second: u32,
    pub status: TaskStatus,
    pub moved: u64,
    /// The source's depth when the task started.
    pub to_move: u64,
    /// Epoch ms.
    pub started_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

/// Why a task cannot start, or be cancelled.
#[derive(Debug, thiserror::Error)]
pub enum RedriveError {
    #[error("{0}")]
    Invalid(String),
    #[error("a message move task is already running for queue {0:?}; cancel it or wait for it to end")]
    Running(String),
    #[error("no running message move task has handle {0:?}")]
    NoSuchTask(String),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

impl From<ZkError> for RedriveError {
    fn from(err: ZkError) -> RedriveError {
        RedriveError::Queue(QueueError::Zk(err))
    }
}

/// The message move tasks of this zkq, and the door to those of the others.
pub struct Redrives {
    queues: Arc<QueueService>,
    session: ZkSession,
    layout: Layout,
    tasks: TaskTracker,
    shutdown: CancellationToken,
    running: Mutex<HashMap<String, Arc<Running>>>,
    finished: Mutex<VecDeque<TaskReport>>,
}

/// A task running here.
struct Running {
    report: Mutex<TaskReport>,
    moved: AtomicU64,
    cancel: CancellationToken,
}

impl Redrives {
    pub fn new(
        config: Arc<Config>,
        queues: Arc<QueueService>,
        session: ZkSession,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Arc<Redrives> {
        let layout = Layout::new(&config.zookeeper.root);
        Arc::new(Redrives {
            queues,
            session,
            layout,
            tasks,
            shutdown,
            running: Mutex::new(HashMap::new()),
            finished: Mutex::new(VecDeque::new()),
        })
    }

    /// Starts moving the messages of `source` to `destination` (default: the one queue whose
    /// dead-letter queue `source` is) at up to `max_per_second`. The task's handle.
    pub async fn start(
        self: &Arc<Self>,
        source: &QueueName,
        destination: Option<QueueName>,
        max_per_second: Option<u32>,
    ) -> Result<TaskReport, RedriveError> {
        let rate = max_per_second.unwrap_or(DEFAULT_PER_SECOND);
        if rate == 0 || rate > MAX_PER_SECOND {
            return Err(RedriveError::Invalid(format!(
                "the rate must be 1 to {MAX_PER_SECOND} messages a second, not {rate}"
            )));
        }
        let destination = match destination {
            Some(destination) => destination,
            None => match self.queues.dead_letter_sources(source).await?.as_slice() {
                [only] => only.clone(),
                [] => {
                    return Err(RedriveError::Invalid(format!(
                        "no queue has {source} as its dead-letter queue: name the destination"
                    )));
                },
                _ => {
                    return Err(RedriveError::Invalid(format!(
                        "several queues have {source} as their dead-letter queue: name the destination"
                    )));
                },
            },
        };
        if destination == *source {
            return Err(RedriveError::Invalid("a queue's messages cannot be moved to itself".to_owned()));
        }
        let from = self
            .queues
            .existing(source, Duration::ZERO)
            .await?
            .ok_or_else(|| QueueError::NoSuchQueue(source.clone()))?;
        from.check_leasable()?;
        if !self.queues.stored(&destination).await? {
            return Err(QueueError::NoSuchQueue(destination).into());
        }
        let to = self.queues.open_for_put(&destination).await?;
        let to_move = u64::try_from(from.info().await?.depth).unwrap_or(0);
        let report = TaskReport {
            handle: format!("{source}:{:032x}", rand::random::<u128>()),
            source: source.to_string(),
            destination: destination.to_string(),
            max_per_second: rate,
            status: TaskStatus::Running,
            moved: 0,
            to_move,
            started_at: now_epoch_ms(),
            failure: None,
        };
        let deadline = Instant::now() + self.session.request_timeout();
        let zk = self.session.connected(deadline).await?.with_deadline(deadline);
        let node = self.layout.moves(source.as_str());
        let data = serde_json::to_vec(&report).unwrap_or_default();
        match zk.create(&node, &data, NodeMode::Ephemeral).await {
            Ok(_) => {},
            Err(ZkError::NoNode) => {
                zk.ensure_path_as(&self.layout.moves_dir(), NodeMode::Persistent).await?;
                match zk.create(&node, &data, NodeMode::Ephemeral).await {
                    Ok(_) => {},
                    Err(ZkError::NodeExists) => return Err(RedriveError::Running(source.to_string())),
                    Err(err) => return Err(err.into()),
                }
            },
            Err(ZkError::NodeExists) => return Err(RedriveError::Running(source.to_string())),
            Err(err) => return Err(err.into()),
        }
        let running = Arc::new(Running {
            report: Mutex::new(report.clone()),
            moved: AtomicU64::new(0),
            cancel: self.shutdown.child_token(),
        });
        self.lock_running().insert(source.to_string(), running.clone());
        let redrives = self.clone();
        self.tasks.spawn(async move { redrives.run(running, from, to, node).await });
        tracing::info!(source = %report.source, destination = %report.destination, rate, to_move,
            "started a message move task");
        Ok(report)
    }

    /// Every task of `source` this zkq knows (running here, finished here), and the one running
    /// on another zkq (from its node), newest first.
    pub async fn list(&self, source: &QueueName) -> Result<Vec<TaskReport>, RedriveError> {
        let deadline = Instant::now() + self.session.request_timeout();
        let zk = self.session.connected(deadline).await?.with_deadline(deadline);
        let here = self.lock_running().get(source.as_str()).cloned();
        let current = match (here, zk.get_data(&self.layout.moves(source.as_str())).await) {
            (Some(running), _) => Some(running.snapshot()),
            // Another zkq's task; a node that does not parse is left out, never guessed at.
            (None, Ok((data, _))) => serde_json::from_slice::<TaskReport>(&data).ok(),
            (None, Err(ZkError::NoNode)) => None,
            (None, Err(err)) => return Err(err.into()),
        };
        let finished: Vec<TaskReport> = {
            let finished = self.finished.lock().unwrap_or_else(|p| p.into_inner());
            finished.iter().rev().filter(|r| r.source == source.as_str()).cloned().collect()
        };
        // A task that ended while this look was under way is listed once, as it ended.
        let current = current.filter(|task| !finished.iter().any(|done| done.handle == task.handle));
        Ok(current.into_iter().chain(finished).collect())
    }

    /// Cancels the running task `handle` (on any zkq: its node is deleted, and the zkq running it
    /// stops within a second). What it had moved.
    pub async fn cancel(&self, handle: &str) -> Result<u64, RedriveError> {
        let source = handle.rsplit_once(':').map(|(source, _)| source).unwrap_or_default();
        let source: QueueName = source.parse().map_err(|_| RedriveError::NoSuchTask(handle.to_owned()))?;
        if let Some(running) = self.lock_running().get(source.as_str()).cloned()
            && running.snapshot().handle == handle
        {
            running.cancel.cancel();
            return Ok(running.moved.load(Ordering::SeqCst));
        }
        let deadline = Instant::now() + self.session.request_timeout();
        let zk = self.session.connected(deadline).await?.with_deadline(deadline);
        let node = self.layout.moves(source.as_str());
        // Read, check it is this task, delete that version; its counts may be rewritten meanwhile
        // (once a second), so a few tries.
        for _ in 0..5 {
            let (data, stat) = match zk.get_data(&node).await {
                Ok(found) => found,
                Err(ZkError::NoNode) => return Err(RedriveError::NoSuchTask(handle.to_owned())),
                Err(err) => return Err(err.into()),
            };
            let report: TaskReport =
                serde_json::from_slice(&data).map_err(|_| RedriveError::NoSuchTask(handle.to_owned()))?;
            if report.handle != handle {
                return Err(RedriveError::NoSuchTask(handle.to_owned()));
            }
            match zk.delete(&node, Some(stat.version)).await {
                Ok(()) | Err(ZkError::NoNode) => return Ok(report.moved),
                Err(ZkError::BadVersion) => continue,
                Err(err) => return Err(err.into()),
            }
        }
        Err(ZkError::Unavailable.into())
    }

    fn lock_running(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Running>>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The task: lease, put, ack, at the rate; ends when the source has no message left to lease,
    /// on a cancel, on shutdown, or on an error it cannot get past.
    async fn run(self: Arc<Self>, running: Arc<Running>, from: QueueRef, to: QueueRef, node: String) {
        let (rate, source) = {
            let report = running.snapshot();
            (report.max_per_second, report.source)
        };
        let pace = Duration::from_secs(1) / rate;
        let mut next_at = Instant::now();
        let mut waits = RETRY.retries();
        let mut next_report = Instant::now() + REPORT_EVERY;
        // The version of our node: a write or delete of another version is never ours to make
        // (a cancel deleted it, and another task may hold the name now).
        let mut version = 0;
        let outcome: Result<TaskStatus, String> = loop {
            if running.cancel.is_cancelled() {
                break Ok(TaskStatus::Cancelled);
            }
            if Instant::now() >= next_report {
                next_report = Instant::now() + REPORT_EVERY;
                match self.report(&running, &node, version).await {
                    Ok(Some(written)) => version = written,
                    Ok(None) => break Ok(TaskStatus::Cancelled),
                    Err(err) => tracing::debug!(source = %source, error = %err, "could not write a move task's counts"),
                }
            }
            let batch = usize::try_from(rate.min(10)).unwrap_or(10);
            let leased = tokio::select! {
                leased = from.lease_many(Duration::ZERO, MOVE_VISIBILITY, batch, usize::MAX) => leased,
                _ = running.cancel.cancelled() => break Ok(TaskStatus::Cancelled),
            };
            let leased = match leased {
                Ok(leased) if leased.is_empty() => break Ok(TaskStatus::Completed),
                Ok(leased) => leased,
                Err(err) if transient(&err) => {
                    pause(&mut waits, &running.cancel).await;
                    continue;
                },
                Err(err) => break Err(err.to_string()),
            };
            let mut failed = None;
            for (message, grant) in leased {
                if failed.is_some() || running.cancel.is_cancelled() {
                    let _ = from.nack(grant.receipt, NackMode::Keep, Duration::ZERO).await;
                    continue;
                }
                tokio::select! {
                    _ = tokio::time::sleep_until(next_at) => {},
                    _ = running.cancel.cancelled() => {},
                }
                next_at = next_at.max(Instant::now().checked_sub(pace).unwrap_or(next_at)) + pace;
                match self.move_one(&from, &to, message, &grant).await {
                    Ok(()) => {
                        running.moved.fetch_add(1, Ordering::SeqCst);
                    },
                    Err(err) => {
                        let _ = from.nack(grant.receipt, NackMode::Keep, Duration::ZERO).await;
                        failed = Some(err);
                    },
                }
            }
            match failed {
                Some(err) if !transient(&err) => break Err(err.to_string()),
                // ZooKeeper out of reach, the destination full, the source's leases at their
                // bound: wait, longer each time, then go on.
                Some(_) => pause(&mut waits, &running.cancel).await,
                None => waits.reset(),
            }
        };
        let (status, failure) = match outcome {
            Ok(status) => (status, None),
            Err(reason) => (TaskStatus::Failed, Some(reason)),
        };
        let report = {
            let mut report = running.report.lock().unwrap_or_else(|p| p.into_inner());
            report.status = status;
            report.failure = failure;
            report.moved = running.moved.load(Ordering::SeqCst);
            report.clone()
        };
        if let Some(zk) = self.session.current() {
            let zk = zk.with_deadline(Instant::now() + self.session.request_timeout());
            // Ours only: a cancel may have deleted it and another task made it anew.
            let _ = zk.delete(&node, Some(version)).await;
        }
        {
            // Ours only: a task started here for the same source once our node was gone holds the
            // entry now.
            let mut running_here = self.lock_running();
            if running_here.get(&report.source).is_some_and(|entry| Arc::ptr_eq(entry, &running)) {
                running_here.remove(&report.source);
            }
        }
        let mut finished = self.finished.lock().unwrap_or_else(|p| p.into_inner());
        finished.push_back(report.clone());
        while finished.len() > FINISHED_REMEMBERED {
            finished.pop_front();
        }
        tracing::info!(source = %report.source, destination = %report.destination, moved = report.moved,
            status = ?report.status, failure = report.failure.as_deref().unwrap_or(""), "a message move task ended");
    }

    /// Writes the task's counts to its node at `version`: the node's new version, or `None` when
    /// it is gone or is another's now (cancelled).
    async fn report(&self, running: &Running, node: &str, version: i32) -> Result<Option<i32>, ZkError> {
        let zk = self.session.connected(Instant::now() + self.session.request_timeout()).await?;
        let zk = zk.with_deadline(Instant::now() + self.session.request_timeout());
        let data = serde_json::to_vec(&running.snapshot()).unwrap_or_default();
        match zk.set_data(node, &data, Some(version)).await {
            Ok(stat) => Ok(Some(stat.version)),
            Err(ZkError::NoNode | ZkError::BadVersion) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Puts one leased message to the destination (keyed, so a second move stores nothing) and
    /// acks its lease.
    async fn move_one(
        &self,
        from: &QueueRef,
        to: &QueueRef,
        message: Message,
        grant: &LeaseGrant,
    ) -> Result<(), QueueError> {
        let key = {
            let mut hash = Sha256::new();
            hash.update(from.name().as_str().as_bytes());
            hash.update([0]);
            hash.update(message.message_id.as_bytes());
            hash.update(grant.created_at_ms.to_be_bytes());
            let digest = hash.finalize();
            let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
            format!("zkq-move-{hex}")
        };
        let simple = to.kind() == QueueKind::Simple;
        let options = PutOptions {
            priority: match (&message.meta, to.kind()) {
                (ItemMeta::Priority(p), QueueKind::Priority) => Some(*p),
                _ => None,
            },
            id: match (&message.meta, to.kind()) {
                (ItemMeta::Id(id), QueueKind::Id) => Some(id.clone()),
                (_, QueueKind::Id) => Some(from.name().to_string()),
                _ => None,
            },
            group: match &message.meta {
                ItemMeta::Id(group) if to.grouped() && to.kind() == QueueKind::Fifo => Some(group.clone()),
                _ => None,
            },
            deliver_at: None,
            // A simple queue keeps bare bodies: attributes and trace context stay behind.
            attributes: if simple { Default::default() } else { message.attributes },
            traceparent: if simple { None } else { message.traceparent },
            wait: Duration::ZERO,
            idempotency_key: Some(key),
        };
        to.put(&message.body, options).await?;
        from.ack(grant.receipt).await
    }
}

impl Running {
    fn snapshot(&self) -> TaskReport {
        let mut report = self.report.lock().unwrap_or_else(|p| p.into_inner()).clone();
        report.moved = self.moved.load(Ordering::SeqCst);
        report
    }
}

/// How a task waits after a transient failure: from 100 ms, doubling, to 5 s.
const RETRY: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5), 0.0);

/// Waits the next pause of `waits`, or until `cancel`.
async fn pause(waits: &mut Retries, cancel: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(waits.next_delay()) => {},
        _ = cancel.cancelled() => {},
    }
}

/// Whether the task waits and tries again (ZooKeeper out of reach, the destination full) rather
/// than failing.
fn transient(err: &QueueError) -> bool {
    match err {
        QueueError::Zk(err) => err.is_transient() || *err == ZkError::OutcomeUnknown,
        QueueError::Full { .. } | QueueError::TooManyLeases(_) => true,
        _ => false,
    }
}
