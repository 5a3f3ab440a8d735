//! Group commit: writes that arrive while others are in flight go to ZooKeeper together, as one
//! transaction.
//!
//! A caller submits a *unit*: operations that must be applied all or none (one put is one create;
//! a batch put is many). While fewer than [`MAX_IN_FLIGHT`] transactions are in flight, a unit is
//! sent at once, alone (a lone `create` is sent as a plain `create`): no write waits for company.
//! Units that arrive while the limit is reached queue up, and the next transaction carries all of
//! them (up to [`MAX_BATCH_OPS`] operations and [`MAX_BATCH_BYTES`], well under the server's
//! `jute.maxbuffer`). A unit may carry tags (idempotent puts tag their messages' contents, so
//! that identical messages of different puts never share a transaction and each can be found by
//! its content after a lost answer): a pending unit sharing a tag with one already in the next
//! transaction keeps its place and goes in the one after. Each unit still gets its own answer, only
//! after ZooKeeper confirmed the transaction:
//!
//! - applied: every unit gets its results (each create its own node and sequence number);
//! - refused because of one operation (a missing parent, an existing node, a quota): the unit
//!   holding that operation gets the error, the others are sent again without it;
//! - outcome unknown (the connection was lost with the transaction sent): every unit gets
//!   `OutcomeUnknown`, exactly what a lone write would have got;
//! - never sent (no connection, or the unit's deadline passed while it queued): `Unavailable`,
//!   nothing was applied.
//!
//! Transactions run on tasks of the caller's tracker (the queues' background tracker, which
//! shutdown waits for), never on a request's future: a client that leaves cannot take the answers
//! of the other units with it. A unit whose caller left before it was sent is dropped unsent.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::{TxnError, TxnOp, TxnResult, Zk, ZkError};
use crate::metrics::Metrics;

/// Transactions in flight at once (each may carry many units).
pub const MAX_IN_FLIGHT: usize = 2;
/// Operations in one transaction.
pub const MAX_BATCH_OPS: usize = 1000;
/// Paths and data in one transaction: half of ZooKeeper's default `jute.maxbuffer` (1 MiB), so the
/// request with its framing stays well inside the server's limit.
pub const MAX_BATCH_BYTES: usize = 512 * 1024;

type Reply = oneshot::Sender<Result<Vec<TxnResult>, TxnError>>;

struct Unit {
    zk: Zk,
    deadline: Instant,
    ops: Vec<TxnOp>,
    bytes: usize,
    /// Never in one transaction with another unit sharing one of these.
    tags: Vec<u64>,
    reply: Reply,
}

#[derive(Default)]
struct State {
    pending: VecDeque<Unit>,
    in_flight: usize,
}

/// Shared by every queue of the process, so puts to different queues share transactions too.
pub struct GroupCommit {
    state: Mutex<State>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").finish_non_exhaustive()
    }
}

/// What one operation adds to a transaction's size.
fn op_bytes(op: &TxnOp) -> usize {
    // Path, data and a little framing per operation.
    const FRAMING: usize = 32;
    FRAMING
        + match op {
            TxnOp::Create { path, data, .. } | TxnOp::SetData { path, data, .. } => path.len() + data.len(),
            TxnOp::Delete { path, .. } | TxnOp::Check { path, .. } => path.len(),
        }
}

impl GroupCommit {
    pub fn new(metrics: Arc<Metrics>) -> Arc<GroupCommit> {
        Arc::new(GroupCommit { state: Mutex::new(State::default()), metrics })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing here can be left half-updated by a panic that matters: recover.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies `ops` all or none, possibly in one transaction with other callers' units, on
    /// `zk`'s session within its deadline. Errors are those of [`Zk::multi`]; the error's index
    /// is relative to `ops`.
    pub async fn submit(
        self: &Arc<Self>,
        tasks: &TaskTracker,
        zk: &Zk,
        ops: Vec<TxnOp>,
    ) -> Result<Vec<TxnResult>, TxnError> {
        self.submit_apart(tasks, zk, ops, Vec::new()).await
    }

    /// As [`GroupCommit::submit`], but never in one transaction with another unit that shares one
    /// of `tags`.
    pub async fn submit_apart(
        self: &Arc<Self>,
        tasks: &TaskTracker,
        zk: &Zk,
        ops: Vec<TxnOp>,
        tags: Vec<u64>,
    ) -> Result<Vec<TxnResult>, TxnError> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, answer) = oneshot::channel();
        let bytes = ops.iter().map(op_bytes).sum();
        let unit = Unit { zk: zk.clone(), deadline: zk.deadline(), ops, bytes, tags, reply };
        let start = {
            let mut state = self.state();
            state.pending.push_back(unit);
            if state.in_flight < MAX_IN_FLIGHT {
                state.in_flight += 1;
                true
            } else {
                false
            }
        };
        if start {
            let this = self.clone();
            tasks.spawn(async move { this.run().await });
        }
        // The runner always answers; a dropped sender means the runtime is going away.
        answer.await.unwrap_or(Err(TxnError { index: None, error: ZkError::OutcomeUnknown }))
    }

    /// Sends transactions until nothing is pending.
    async fn run(self: Arc<Self>) {
        loop {
            let batch = {
                let mut state = self.state();
                let batch = Self::next_batch(&mut state.pending);
                if batch.is_empty() {
                    state.in_flight -= 1;
                    return;
                }
                batch
            };
            self.send(batch).await;
        }
    }

    /// The next units to send together: the oldest pending unit, then more of the same session
    /// while they fit. A unit larger than the limits on its own is sent alone; a unit sharing a tag
    /// with one already taken is passed over and keeps its place.
    fn next_batch(pending: &mut VecDeque<Unit>) -> Vec<Unit> {
        let mut batch: Vec<Unit> = Vec::new();
        let (mut ops, mut bytes) = (0, 0);
        let mut tags: HashSet<u64> = HashSet::new();
        let mut index = 0;
        while let Some(unit) = pending.get(index) {
            if let Some(first) = batch.first() {
                let fits = ops + unit.ops.len() <= MAX_BATCH_OPS && bytes + unit.bytes <= MAX_BATCH_BYTES;
                if !fits || unit.zk.generation() != first.zk.generation() {
                    break;
                }
                if unit.tags.iter().any(|tag| tags.contains(tag)) {
                    index += 1;
                    continue;
                }
            }
            let Some(unit) = pending.remove(index) else { break };
            ops += unit.ops.len();
            bytes += unit.bytes;
            tags.extend(unit.tags.iter().copied());
            batch.push(unit);
        }
        batch
    }

    /// Sends `batch` as one transaction and answers every unit; a unit refused on its own is
    /// answered and the rest sent again.
    async fn send(&self, mut batch: Vec<Unit>) {
        let now = Instant::now();
        batch.retain_mut(|unit| {
            if unit.reply.is_closed() {
                return false; // its caller left before it was sent: nothing applied
            }
            if unit.deadline <= now {
                Self::answer(unit, Err(TxnError { index: None, error: ZkError::Unavailable }));
                return false;
            }
            true
        });
        while !batch.is_empty() {
            let deadline = batch.iter().map(|u| u.deadline).min().unwrap_or(now);
            let zk = batch[0].zk.with_deadline(deadline);
            self.metrics.group_commit_units.observe(batch.len() as f64);
            let result = match batch.as_slice() {
                [unit] if unit.ops.len() == 1 => Self::send_alone(&zk, &unit.ops[0]).await,
                _ => {
                    let ops: Vec<TxnOp> = batch.iter().flat_map(|u| u.ops.iter().cloned()).collect();
                    zk.multi(&ops).await
                },
            };
            match result {
                Ok(mut results) => {
                    for unit in batch.iter_mut() {
                        let rest = results.split_off(unit.ops.len().min(results.len()));
                        let mine = std::mem::replace(&mut results, rest);
                        Self::answer(unit, Ok(mine));
                    }
                    return;
                },
                Err(TxnError { index: Some(index), error }) if batch.len() > 1 => {
                    // One unit's operation was refused: that unit gets the error, the rest go again.
                    let mut start = 0;
                    let culprit = batch.iter().position(|unit| {
                        let end = start + unit.ops.len();
                        let found = index < end;
                        if !found {
                            start = end;
                        }
                        found
                    });
                    let Some(culprit) = culprit else {
                        for unit in batch.iter_mut() {
                            Self::answer(unit, Err(TxnError { index: None, error: error.clone() }));
                        }
                        return;
                    };
                    let mut unit = batch.remove(culprit);
                    Self::answer(&mut unit, Err(TxnError { index: Some(index - start), error }));
                },
                Err(err) => {
                    for unit in batch.iter_mut() {
                        Self::answer(unit, Err(err.clone()));
                    }
                    return;
                },
            }
        }
    }

    /// A lone operation without a transaction around it: a plain `create` costs the server less
    /// than a `multi` of one.
    async fn send_alone(zk: &Zk, op: &TxnOp) -> Result<Vec<TxnResult>, TxnError> {
        match op {
            TxnOp::Create { path, data, mode } => {
                zk.create(path, data, *mode).await.map(|created| vec![TxnResult::Created(created)]).map_err(|error| {
                    let definite = !matches!(error, ZkError::OutcomeUnknown | ZkError::Unavailable);
                    TxnError { index: definite.then_some(0), error }
                })
            },
            other => zk.multi(std::slice::from_ref(other)).await,
        }
    }

    fn answer(unit: &mut Unit, result: Result<Vec<TxnResult>, TxnError>) {
        let (reply, _) = oneshot::channel();
        let _ = std::mem::replace(&mut unit.reply, reply).send(result);
    }
}
