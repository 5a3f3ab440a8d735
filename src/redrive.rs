//! Message move tasks: dead letters moved back to a queue at a bounded rate (SQS's
//! `StartMessageMoveTask`, zkq's `POST /v1/queues/{queue}/redrive`).
//!
//! A task leases messages from its source queue (a dead-letter queue) and, for each, puts it to
//! its destination with an idempotency key made of the message's name and creation, then acks the
//! lease. So a message is never lost (it leaves the source only after the put is confirmed) and
//! never stored twice (a task that stops between put and ack leaves a lease that expires; whoever
//! moves the message again within the destination's idempotency window stores nothing new; a
//! destination whose window could end before the lease is refused at start). Bodies, attributes
//! and the traceparent move unaltered; a kind field moves where the destination's kind has it.
//!
//! One task runs per source queue on the whole ensemble: it holds the ephemeral node
//! `{root}/moves/{source}` (its JSON: handle, destination, rate, counts, refreshed every second),
//! so any zkq lists it. The node is the task's by its creation (`czxid`) and its handle, never by
//! its version alone: a node made anew starts at version 0 again. A running task's node is deleted
//! only once the task has ended: a cancel on another zkq marks it (`cancel_requested`), the task sees
//! that at once through a data watch, stops, writes how it ended, and the canceller deletes it;
//! so a cancel answers once the task has stopped, and a task never writes over another's node. A
//! node the next task finds there that is no running task's (one that ended, or one another
//! client wrote) is replaced. The task runs in the zkq that started it and ends with that zkq's
//! session or shutdown (its leases are released then). Each zkq remembers the last
//! [`FINISHED_REMEMBERED`] tasks it ran, for listing.

mod node;

use node::{Found, TaskNode, judge};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, QueueKind};
use crate::metrics::{ForeignNode, Metrics};
use crate::queue::Purpose;
use crate::queue::{ItemMeta, LeaseGrant, Message, NackMode, PutOptions, QueueError, QueueRef, QueueService};
use crate::types::{Backoff, Layout, QueueName, Retries, now_epoch_ms};
use crate::zk::{NodeMode, NodeStat, WatchEvent, Zk, ZkError, ZkSession};

/// The highest rate a task may ask for (as SQS's `MaxNumberOfMessagesPerSecond`).
pub(crate) const MAX_PER_SECOND: u32 = 500;
/// The rate of a task that asks for none.
pub(crate) const DEFAULT_PER_SECOND: u32 = 100;
/// Finished tasks each zkq remembers for listing.
pub(crate) const FINISHED_REMEMBERED: usize = 100;
/// How long a moved message's lease lasts: its put and ack have this long before it would be
/// leased again (and the idempotency key then stores nothing twice).
const MOVE_VISIBILITY: Duration = Duration::from_secs(60);
/// The shortest idempotency window a destination may have: three leases. A key is sure to be
/// remembered for half its window only (a zkq whose clock runs ahead sweeps it sooner), so half
/// the window covers a lease that expires after its message was stored, and the move again.
pub(crate) const MIN_DESTINATION_WINDOW: Duration = Duration::from_secs(3 * MOVE_VISIBILITY.as_secs());
/// How often a running task writes its counts to its node.
const REPORT_EVERY: Duration = Duration::from_secs(1);
/// Tries of a write to a task's node that another zkq changes meanwhile.
const ATTEMPTS: usize = 5;

/// Where a task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub(crate) enum TaskStatus {
    Running,
    Completed,
    Cancelled,
    Failed,
}

/// A task as it is listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TaskReport {
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
pub(crate) enum RedriveError {
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
pub(crate) struct Redrives {
    config: Arc<Config>,
    queues: Arc<QueueService>,
    session: ZkSession,
    metrics: Arc<Metrics>,
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
    /// Stops the task: a cancel here, shutdown, or what its node says (a cancel through it, or
    /// the node lost).
    cancel: CancellationToken,
    /// A cancel on another zkq asked through the node: that cancel deletes the node.
    cancel_requested: AtomicBool,
    /// Cancelled once the task has ended: its last move done, its end recorded and written.
    ended: CancellationToken,
    /// The transaction that created the task's node: which node is its own.
    czxid: i64,
    /// The session that owns the node (it is ephemeral): on any other, the node is gone.
    session: i64,
    /// Its node was seen gone or another's: the task never writes to that path again.
    lost: AtomicBool,
}

/// What the task's node says to the task that made it.
enum Seen {
    /// Still its own, at this version, not asked to stop.
    Running(i32),
    /// Its own, at this version, and a cancel asked it to stop.
    CancelRequested(i32),
    /// Gone, or another node now (the task's was deleted by a client that is not a task, or
    /// with the session).
    Lost,
}

impl Redrives {
    pub(crate) fn new(
        config: Arc<Config>,
        queues: Arc<QueueService>,
        session: ZkSession,
        metrics: Arc<Metrics>,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Arc<Redrives> {
        let layout = Layout::new(&config.zookeeper.root);
        Arc::new(Redrives {
            config,
            queues,
            session,
            metrics,
            layout,
            tasks,
            shutdown,
            running: Mutex::new(HashMap::new()),
            finished: Mutex::new(VecDeque::new()),
        })
    }

    /// Starts moving the messages of `source` to `destination` (default: the one queue whose
    /// dead-letter queue `source` is) at up to `max_per_second`. The task's handle.
    pub(crate) async fn start(
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
        let window = self.config.idempotency_window(destination.as_str());
        if window < MIN_DESTINATION_WINDOW {
            return Err(RedriveError::Invalid(format!(
                "queue {destination}'s idempotency window ({}) is under {}, three times a move's {} lease: a message \
                 moved again after its lease expired could be stored twice there; give it an idempotency_window of at \
                 least {}",
                humantime::format_duration(window),
                humantime::format_duration(MIN_DESTINATION_WINDOW),
                humantime::format_duration(MOVE_VISIBILITY),
                humantime::format_duration(MIN_DESTINATION_WINDOW),
            )));
        }
        let from = self.queues.queue(source, Purpose::Look).await?;
        from.check_leasable()?;
        if !self.queues.stored(&destination).await? {
            return Err(QueueError::NoSuchQueue(destination).into());
        }
        let to = self.queues.queue(&destination, Purpose::Put).await?;
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
        let data = TaskNode { report: report.clone(), cancel_requested: false }.bytes();
        let czxid = self.claim(&zk, &node, &data, source).await?;
        let session = zk.session_id();
        let running = Arc::new(Running {
            report: Mutex::new(report.clone()),
            moved: AtomicU64::new(0),
            cancel: self.shutdown.child_token(),
            cancel_requested: AtomicBool::new(false),
            ended: CancellationToken::new(),
            czxid,
            session,
            lost: AtomicBool::new(false),
        });
        self.lock_running().insert(source.to_string(), running.clone());
        let redrives = self.clone();
        let follower = (self.clone(), running.clone(), node.clone());
        self.tasks.spawn(async move { redrives.run(running, from, to, node).await });
        self.tasks.spawn(async move { follower.0.follow(follower.1, follower.2).await });
        tracing::info!(source = %report.source, destination = %report.destination, rate, to_move,
            "started a message move task");
        Ok(report)
    }

    /// Creates the task's node at `node`: the transaction that created it. A node there that is no
    /// running task's (one that ended, or one another client wrote: logged and counted) is
    /// replaced; a running task's is not.
    async fn claim(&self, zk: &Zk, node: &str, data: &[u8], source: &QueueName) -> Result<i64, RedriveError> {
        for _ in 0..ATTEMPTS {
            let existing = match zk.create_stat(node, data, NodeMode::Ephemeral).await {
                Ok(stat) if stat.czxid != 0 => return Ok(stat.czxid),
                // A server without create2 answered no stat: ask the node who it is.
                Ok(_) => match zk.get_data(node).await {
                    Ok((_, stat)) => return Ok(stat.czxid),
                    Err(err) => return Err(err.into()),
                },
                Err(ZkError::NoNode) => {
                    zk.ensure_path_as(&self.layout.moves_dir(), NodeMode::Persistent).await?;
                    continue;
                },
                Err(ZkError::NodeExists) => match zk.get_data(node).await {
                    Ok(existing) => existing,
                    Err(ZkError::NoNode) => continue,
                    Err(err) => return Err(err.into()),
                },
                Err(err) => return Err(err.into()),
            };
            let (data, stat) = existing;
            match judge(&data, &stat) {
                Found::Task(task) if task.report.status == TaskStatus::Running => {
                    return Err(RedriveError::Running(source.to_string()));
                },
                Found::Task(task) => {
                    tracing::debug!(source = %source, handle = %task.report.handle,
                        "replacing the node of a message move task that ended");
                },
                Found::Foreign(why) => {
                    self.metrics.foreign_node(ForeignNode::MoveTask).inc();
                    tracing::warn!(node, reason = %why,
                        "the message move task node of this queue holds no task (another client wrote it): replacing it");
                },
            }
            match zk.delete(node, Some(stat.version)).await {
                Ok(()) | Err(ZkError::NoNode | ZkError::BadVersion) => {},
                Err(err) => return Err(err.into()),
            }
        }
        Err(ZkError::Unavailable.into())
    }

    /// Every task of `source` this zkq knows (running here, finished here), and the one running
    /// on another zkq (from its node), newest first.
    pub(crate) async fn list(&self, source: &QueueName) -> Result<Vec<TaskReport>, RedriveError> {
        let deadline = Instant::now() + self.session.request_timeout();
        let zk = self.session.connected(deadline).await?.with_deadline(deadline);
        let here = self.lock_running().get(source.as_str()).cloned();
        let current = match (here, zk.get_data(&self.layout.moves(source.as_str())).await) {
            (Some(running), _) => Some(running.snapshot()),
            // Another zkq's task; a node that is no task's is left out, never guessed at.
            (None, Ok((data, stat))) => match judge(&data, &stat) {
                Found::Task(task) => Some(task.report),
                Found::Foreign(_) => None,
            },
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

    /// Cancels the running task `handle` (on any zkq) and answers once it has stopped: what it
    /// had moved. A task on another zkq is asked through its node and seen to stop there; if it
    /// has not said so within the request's deadline, the cancel still holds (it stops as it
    /// sees it) and the answer is its last count.
    pub(crate) async fn cancel(&self, handle: &str) -> Result<u64, RedriveError> {
        let source = handle.rsplit_once(':').map(|(source, _)| source).unwrap_or_default();
        let source: QueueName = source.parse().map_err(|_| RedriveError::NoSuchTask(handle.to_owned()))?;
        let deadline = Instant::now() + self.session.request_timeout();
        let here = self.lock_running().get(source.as_str()).cloned();
        if let Some(running) = here
            && running.snapshot().handle == handle
        {
            running.cancel.cancel();
            let _ = tokio::time::timeout_at(deadline, running.ended.cancelled()).await;
            return Ok(running.moved.load(Ordering::SeqCst));
        }
        let zk = self.session.connected(deadline).await?.with_deadline(deadline);
        let node = self.layout.moves(source.as_str());
        let no_such_task = || RedriveError::NoSuchTask(handle.to_owned());
        // Mark it, at the version read: its counts are rewritten once a second, so a few tries.
        let mut asked = None;
        for _ in 0..ATTEMPTS {
            let (data, stat) = match zk.get_data(&node).await {
                Ok(found) => found,
                Err(ZkError::NoNode) => return Err(no_such_task()),
                Err(err) => return Err(err.into()),
            };
            let Found::Task(mut task) = judge(&data, &stat) else { return Err(no_such_task()) };
            if task.report.handle != handle || task.report.status != TaskStatus::Running {
                return Err(no_such_task());
            }
            if task.cancel_requested {
                asked = Some((stat.czxid, task.report.moved));
                break;
            }
            task.cancel_requested = true;
            match zk.set_data(&node, &task.bytes(), Some(stat.version)).await {
                Ok(_) => {
                    asked = Some((stat.czxid, task.report.moved));
                    break;
                },
                Err(ZkError::BadVersion) => continue,
                Err(ZkError::NoNode) => return Err(no_such_task()),
                Err(err) => return Err(err.into()),
            }
        }
        let Some((czxid, mut moved)) = asked else { return Err(ZkError::Unavailable.into()) };
        // Wait for the task to write how it ended, then delete its node.
        loop {
            let watch = match zk.get_and_watch_data(&node).await {
                Ok((data, stat, watch)) => match judge(&data, &stat) {
                    Found::Task(task) if stat.czxid == czxid => {
                        moved = task.report.moved;
                        if task.report.status != TaskStatus::Running {
                            let _ = zk.delete(&node, Some(stat.version)).await;
                            return Ok(moved);
                        }
                        watch
                    },
                    // Gone with its zkq's session, or replaced: the task ended.
                    _ => return Ok(moved),
                },
                Err(ZkError::NoNode) => return Ok(moved),
                Err(ZkError::OutcomeUnknown) => break,
                Err(err) => return Err(err.into()),
            };
            tokio::select! {
                _ = watch.changed() => {},
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        tracing::warn!(
            handle,
            "a cancelled message move task has not confirmed it stopped yet; it stops as it sees the cancel"
        );
        Ok(moved)
    }

    fn lock_running(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Running>>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Follows the task's node with a data watch while the task runs, so that a cancel through
    /// it, or its loss, stops the task at once.
    async fn follow(self: Arc<Self>, running: Arc<Running>, node: String) {
        let mut waits = RETRY.retries();
        loop {
            let deadline = Instant::now() + self.session.request_timeout();
            let zk = tokio::select! {
                zk = self.session.connected(deadline) => zk,
                _ = running.cancel.cancelled() => return,
            };
            let read = match zk {
                Ok(zk) => zk.with_deadline(deadline).get_and_watch_data(&node).await,
                Err(err) => Err(err),
            };
            let watch = match read {
                Ok((data, stat, watch)) => match running.seen(&data, &stat) {
                    Seen::Running(_) => watch,
                    Seen::CancelRequested(_) => {
                        running.cancel_requested.store(true, Ordering::SeqCst);
                        running.cancel.cancel();
                        return;
                    },
                    Seen::Lost => {
                        running.lose();
                        return;
                    },
                },
                Err(ZkError::NoNode) => {
                    running.lose();
                    return;
                },
                Err(_) => {
                    pause(&mut waits, &running.cancel).await;
                    if running.cancel.is_cancelled() {
                        return;
                    }
                    continue;
                },
            };
            waits.reset();
            tokio::select! {
                event = watch.changed() => if event == WatchEvent::SessionEnded {
                    // The session, and with it the task's ephemeral node, is gone.
                    running.lose();
                    return;
                },
                _ = running.cancel.cancelled() => return,
            }
        }
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
        // The version of our node as we last wrote or read it (the node's identity is its czxid:
        // a node made anew starts at version 0 again).
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
                leased = from.lease_many(Duration::ZERO, MOVE_VISIBILITY, (batch, usize::MAX), crate::queue::PerGroup::One) => leased,
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
                if failed.is_none() && !running.cancel.is_cancelled() {
                    tokio::select! {
                        _ = tokio::time::sleep_until(next_at) => {},
                        _ = running.cancel.cancelled() => {},
                    }
                }
                // A cancel seen while waiting for the pace moves nothing more.
                if failed.is_some() || running.cancel.is_cancelled() {
                    let _ = from.nack(grant.receipt, NackMode::Keep, Duration::ZERO).await;
                    continue;
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
        // The follower stops with the task.
        running.cancel.cancel();
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
        {
            // Ours only: a task started here for the same source once our node was gone holds the
            // entry now.
            let mut running_here = self.lock_running();
            if running_here.get(&report.source).is_some_and(|entry| Arc::ptr_eq(entry, &running)) {
                running_here.remove(&report.source);
            }
        }
        {
            // Recorded before the node says it ended: whoever reads that here lists it.
            let mut finished = self.finished.lock().unwrap_or_else(|p| p.into_inner());
            finished.push_back(report.clone());
            while finished.len() > FINISHED_REMEMBERED {
                finished.pop_front();
            }
        }
        self.release(&running, &node, version, &report).await;
        running.ended.cancel();
        tracing::info!(source = %report.source, destination = %report.destination, moved = report.moved,
            status = ?report.status, failure = report.failure.as_deref().unwrap_or(""), "a message move task ended");
    }

    /// Writes how the task ended to its node, then deletes the node, unless a cancel through the
    /// node asked it to stop: that cancel deletes it once it read the end (or the next task
    /// started for the source replaces it). Never touches a node that is not the task's own.
    async fn release(&self, running: &Running, node: &str, mut version: i32, report: &TaskReport) {
        let Some(zk) = self.session.current() else { return };
        // A node seen gone may be another task's now, at any version: never written.
        if running.lost.load(Ordering::SeqCst) || zk.session_id() != running.session {
            return;
        }
        let zk = zk.with_deadline(Instant::now() + self.session.request_timeout());
        let mut written = false;
        for _ in 0..ATTEMPTS {
            let cancel_requested = running.cancel_requested.load(Ordering::SeqCst);
            let data = TaskNode { report: report.clone(), cancel_requested }.bytes();
            match zk.set_data(node, &data, Some(version)).await {
                Ok(stat) if stat.czxid == running.czxid => {
                    version = stat.version;
                    written = true;
                    break;
                },
                Ok(_) => {
                    tracing::error!(node, "a message move task wrote over a node that is not its own");
                    running.lost.store(true, Ordering::SeqCst);
                    return;
                },
                Err(ZkError::BadVersion) => match zk.get_data(node).await {
                    Ok((data, stat)) => match running.seen(&data, &stat) {
                        Seen::Running(now) => version = now,
                        Seen::CancelRequested(now) => {
                            running.cancel_requested.store(true, Ordering::SeqCst);
                            version = now;
                        },
                        Seen::Lost => {
                            running.lost.store(true, Ordering::SeqCst);
                            return;
                        },
                    },
                    Err(_) => return,
                },
                // Gone, or out of reach: the node goes with the session.
                Err(_) => return,
            }
        }
        if written && !running.cancel_requested.load(Ordering::SeqCst) {
            let _ = zk.delete(node, Some(version)).await;
        }
    }

    /// Writes the task's counts to its node at `version`: the node's new version, or `None` when
    /// the task is to stop (its node asked it, or is gone or another's).
    async fn report(&self, running: &Running, node: &str, version: i32) -> Result<Option<i32>, ZkError> {
        let zk = self.session.connected(Instant::now() + self.session.request_timeout()).await?;
        // The node is ephemeral: on another session it is gone, and the path may be another's.
        if running.lost.load(Ordering::SeqCst) || zk.session_id() != running.session {
            running.lose();
            return Ok(None);
        }
        let zk = zk.with_deadline(Instant::now() + self.session.request_timeout());
        let data = TaskNode { report: running.snapshot(), cancel_requested: false }.bytes();
        match zk.set_data(node, &data, Some(version)).await {
            Ok(stat) if stat.czxid == running.czxid => Ok(Some(stat.version)),
            Ok(_) => {
                tracing::error!(node, "a message move task wrote over a node that is not its own");
                running.lose();
                Ok(None)
            },
            Err(ZkError::NoNode) => {
                running.lose();
                Ok(None)
            },
            // Written by someone else since: a cancel, as a rule.
            Err(ZkError::BadVersion) => match zk.get_data(node).await {
                Ok((data, stat)) => match running.seen(&data, &stat) {
                    Seen::Running(now) => Ok(Some(now)),
                    Seen::CancelRequested(_) => {
                        running.cancel_requested.store(true, Ordering::SeqCst);
                        Ok(None)
                    },
                    Seen::Lost => {
                        running.lose();
                        Ok(None)
                    },
                },
                Err(ZkError::NoNode) => {
                    running.lose();
                    Ok(None)
                },
                Err(err) => Err(err),
            },
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
            // The key is the moved message's own (its name and creation): the same key, the same message.
            key_alone: false,
            key_scope: None,
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

    /// Its node is gone or another's: stop, and never write to the path again.
    fn lose(&self) {
        self.lost.store(true, Ordering::SeqCst);
        self.cancel.cancel();
    }

    /// What its node, read as `data` and `stat`, says to this task.
    fn seen(&self, data: &[u8], stat: &NodeStat) -> Seen {
        if stat.czxid != self.czxid {
            return Seen::Lost;
        }
        let handle = self.report.lock().unwrap_or_else(|p| p.into_inner()).handle.clone();
        match serde_json::from_slice::<TaskNode>(data) {
            Ok(node) if node.report.handle == handle && node.cancel_requested => Seen::CancelRequested(stat.version),
            // Its own node by its creation, whatever another client wrote into it: the next
            // report writes the task's own data back.
            _ => Seen::Running(stat.version),
        }
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
