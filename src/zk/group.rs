//! Group commit: writes that arrive while others are in flight go to ZooKeeper together, as one
//! transaction.
//!
//! A caller submits a *unit*: operations that must be applied all or none (one put is one create;
//! a batch put is many). While fewer than [`MAX_IN_FLIGHT`] transactions are in flight, a unit is
//! sent at once, alone (a lone `create` or `setData` is sent as a plain one): no write waits for
//! company.
//! Units that arrive while the limit is reached queue up, and the next transaction carries all of
//! them (up to [`MAX_BATCH_OPS`] operations and [`MAX_BATCH_BYTES`], well under the server's
//! `jute.maxbuffer`). Each unit still gets its own answer, only after ZooKeeper confirmed the
//! transaction:
//!
//! - applied: every unit gets its results (each create its own node and sequence number);
//! - refused because of one operation (a missing parent, an existing node, a quota): the unit
//!   holding that operation gets the error, the others are sent again without it;
//! - outcome unknown (the connection was lost with the transaction sent): every unit gets
//!   `OutcomeUnknown`, exactly what a lone write would have got. [`GroupCommit::submit_twins`]
//!   also tells the unit where each of its creates stood among the transaction's identical creates
//!   (same path, same data): the server names sequential nodes in the order of the operations, so
//!   a caller that finds the transaction's nodes can tell which of identical ones are its own;
//! - never sent (no connection, or the unit's deadline passed while it queued): `Unavailable`,
//!   nothing was applied.
//!
//! A unit's deadline bounds its own wait, never the transaction: a transaction runs until the
//! latest deadline among its units, and a unit whose deadline passes while it is in flight is
//! answered `OutcomeUnknown` at that moment (with its twins), exactly as a lone write would be,
//! while the others wait for the transaction's answer. One late unit (a put that waited for room
//! almost to its deadline) cannot change the answer of another.
//!
//! Transactions run on tasks of the caller's tracker (the queues' background tracker, which
//! shutdown waits for), never on a request's future: a client that leaves cannot take the answers
//! of the other units with it. The one exception carries no other unit:
//! [`GroupCommit::submit_here`] lets a caller that runs to its end send its unit alone on its own
//! task when a slot is free. A unit whose caller left before it was sent is dropped unsent. What
//! must follow a unit that applied whether or not its caller still waits (a put's counter and
//! cache) is its [`Booking`] ([`GroupCommit::submit_booked`]): the transaction's task runs it
//! once the unit applied, before answering, also for a caller that left or whose deadline passed.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::{TxnError, TxnOp, TxnResult, Zk, ZkError};
use crate::metrics::Metrics;

/// Transactions in flight at once (each may carry many units).
pub(super) const MAX_IN_FLIGHT: usize = 2;
/// Operations in one transaction.
pub(super) const MAX_BATCH_OPS: usize = 1000;
/// Encoded bytes of one transaction that carries several units: half of ZooKeeper's default
/// `jute.maxbuffer` (1 MiB). A unit larger than this is sent alone (and must itself fit
/// [`Zk::max_request_bytes`]).
pub(crate) const MAX_BATCH_BYTES: usize = 512 * 1024;

/// Per operation of a unit: its rank among the transaction's identical creates (same path, same
/// data; in the order of the operations) and how many there are. `(0, 1)` for any other operation.
pub(crate) type Twins = Vec<(u32, u32)>;

/// Why a unit was not applied, or may not have been: the error, and with `OutcomeUnknown` the
/// unit's [`Twins`] in the transaction that was sent (empty otherwise).
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    pub error: TxnError,
    pub twins: Twins,
}

impl From<TxnError> for Refusal {
    fn from(error: TxnError) -> Refusal {
        Refusal { error, twins: Vec::new() }
    }
}

type Reply = oneshot::Sender<Result<Vec<TxnResult>, Refusal>>;

/// What follows a unit that applied, given the unit's results; run by the transaction's task.
pub(crate) type Booking = Box<dyn FnOnce(&[TxnResult]) + Send>;

struct Unit {
    zk: Zk,
    deadline: Instant,
    ops: Vec<TxnOp>,
    bytes: usize,
    reply: Reply,
    booking: Option<Booking>,
}

/// Who sends a unit's transaction when a slot is free.
#[derive(Clone, Copy)]
enum Runner {
    /// A runner task of the caller's tracker (the caller may be dropped at any moment).
    Task,
    /// The caller's own task (it runs to its end).
    Caller,
}

/// A slot for a transaction in flight held by a caller that sends its own unit: once that is
/// done (or the caller dropped), the slot goes to a runner for the units that queued meanwhile,
/// or is given back.
struct Slot {
    group: Arc<GroupCommit>,
    tasks: TaskTracker,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.group.state();
        if state.pending.is_empty() || tokio::runtime::Handle::try_current().is_err() {
            state.in_flight -= 1;
            return;
        }
        drop(state);
        let group = self.group.clone();
        self.tasks.spawn(async move { group.run().await });
    }
}

#[derive(Default)]
struct State {
    pending: VecDeque<Unit>,
    in_flight: usize,
}

/// Shared by every queue of the process, so puts to different queues share transactions too.
pub(crate) struct GroupCommit {
    state: Mutex<State>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").finish_non_exhaustive()
    }
}

impl GroupCommit {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Arc<GroupCommit> {
        Arc::new(GroupCommit { state: Mutex::new(State::default()), metrics })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing here can be left half-updated by a panic that matters: recover.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies `ops` all or none, possibly in one transaction with other callers' units, on
    /// `zk`'s session within its deadline. Errors are those of [`Zk::multi`]; the error's index
    /// is relative to `ops`.
    pub(crate) async fn submit(
        self: &Arc<Self>,
        tasks: &TaskTracker,
        zk: &Zk,
        ops: Vec<TxnOp>,
    ) -> Result<Vec<TxnResult>, TxnError> {
        self.submit_twins(tasks, zk, ops).await.map_err(|refusal| refusal.error)
    }

    /// As [`GroupCommit::submit`]; when the answer was lost, the error comes with the unit's
    /// [`Twins`].
    pub(crate) async fn submit_twins(
        self: &Arc<Self>,
        tasks: &TaskTracker,
        zk: &Zk,
        ops: Vec<TxnOp>,
    ) -> Result<Vec<TxnResult>, Refusal> {
        self.submit_unit(tasks, zk, ops, None).await
    }

    /// As [`GroupCommit::submit`], and once the unit applied, `booking` runs with its results,
    /// whether or not the caller still waits for them.
    pub(crate) async fn submit_booked(
        self: &Arc<Self>,
        tasks: &TaskTracker,
        zk: &Zk,
        ops: Vec<TxnOp>,
        booking: Booking,
    ) -> Result<Vec<TxnResult>, TxnError> {
        self.submit_unit(tasks, zk, ops, Some(booking)).await.map_err(|refusal| refusal.error)
    }

    /// As [`GroupCommit::submit`], but when a transaction can be sent at once, the caller's own
    /// task sends it (the unit alone) instead of a runner task: no hand-off between tasks.
    /// For callers that run to their end whatever their client does (a lease step, run by
    /// `queue::finish`): a caller dropped while its transaction is in flight loses only its own
    /// answer, since such a transaction carries its unit alone; the units that queued meanwhile
    /// are handed to a runner.
    pub(crate) async fn submit_here(
        self: &Arc<Self>,
        tasks: &TaskTracker,
        zk: &Zk,
        ops: Vec<TxnOp>,
    ) -> Result<Vec<TxnResult>, TxnError> {
        self.submit_unit_on(tasks, zk, ops, None, Runner::Caller).await.map_err(|refusal| refusal.error)
    }

    async fn submit_unit(
        self: &Arc<Self>,
        tasks: &TaskTracker,
        zk: &Zk,
        ops: Vec<TxnOp>,
        booking: Option<Booking>,
    ) -> Result<Vec<TxnResult>, Refusal> {
        self.submit_unit_on(tasks, zk, ops, booking, Runner::Task).await
    }

    async fn submit_unit_on(
        self: &Arc<Self>,
        tasks: &TaskTracker,
        zk: &Zk,
        ops: Vec<TxnOp>,
        booking: Option<Booking>,
        runner: Runner,
    ) -> Result<Vec<TxnResult>, Refusal> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let bytes = zk.request_bytes(&ops);
        if bytes > zk.max_request_bytes() {
            let max = zk.max_request_bytes();
            return Err(TxnError { index: None, error: ZkError::TooLarge { size: bytes, max } }.into());
        }
        let (reply, answer) = oneshot::channel();
        let unit = Unit { zk: zk.clone(), deadline: zk.deadline(), ops, bytes, reply, booking };
        let here = {
            let mut state = self.state();
            let start = state.in_flight < MAX_IN_FLIGHT;
            if start {
                state.in_flight += 1;
            }
            match runner {
                // Nothing is pending when a slot is free (a runner leaves only once nothing is):
                // this transaction carries this unit alone.
                Runner::Caller if start => Some(unit),
                Runner::Caller | Runner::Task => {
                    state.pending.push_back(unit);
                    if start {
                        let this = self.clone();
                        tasks.spawn(async move { this.run().await });
                    }
                    None
                },
            }
        };
        if let Some(unit) = here {
            let slot = Slot { group: self.clone(), tasks: tasks.clone() };
            self.send(vec![unit]).await;
            drop(slot);
        }
        // The runner always answers; a dropped sender means the runtime is going away.
        answer.await.unwrap_or(Err(TxnError { index: None, error: ZkError::OutcomeUnknown }.into()))
    }

    /// Sends transactions until nothing is pending, then gives its slot back.
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
    /// while they fit. A unit larger than the limits on its own is sent alone.
    fn next_batch(pending: &mut VecDeque<Unit>) -> Vec<Unit> {
        let mut batch: Vec<Unit> = Vec::new();
        let (mut ops, mut bytes) = (0, 0);
        while let Some(unit) = pending.front() {
            if let Some(first) = batch.first() {
                let fits = ops + unit.ops.len() <= MAX_BATCH_OPS && bytes + unit.bytes <= MAX_BATCH_BYTES;
                if !fits || unit.zk.generation() != first.zk.generation() {
                    break;
                }
            }
            let Some(unit) = pending.pop_front() else { break };
            ops += unit.ops.len();
            bytes += unit.bytes;
            batch.push(unit);
        }
        batch
    }

    /// Sends `batch` as one transaction and answers every unit; a unit refused on its own is
    /// answered and the rest sent again.
    ///
    /// The transaction runs until the latest deadline of its units, not the earliest: a unit
    /// whose own deadline passes while it is in flight is answered `OutcomeUnknown` then (with its
    /// [`Twins`]), and the others still get the transaction's answer. One late unit (a put that
    /// waited for room almost to its deadline) never turns the answers of the others into
    /// `OutcomeUnknown`.
    async fn send(&self, mut batch: Vec<Unit>) {
        while !batch.is_empty() {
            let now = Instant::now();
            batch.retain_mut(|unit| {
                if unit.reply.is_closed() {
                    return false; // its caller left (or it was answered) before it was sent: nothing applied
                }
                if unit.deadline <= now {
                    Self::answer(unit, Err(TxnError { index: None, error: ZkError::Unavailable }.into()));
                    return false;
                }
                true
            });
            let Some(deadline) = batch.iter().map(|u| u.deadline).max() else { return };
            let zk = batch[0].zk.with_deadline(deadline);
            self.metrics.group_commit_units.observe(batch.len() as f64);
            let ops: Vec<TxnOp> = batch.iter().flat_map(|u| u.ops.iter().cloned()).collect();
            let request = async move {
                match ops.as_slice() {
                    [op] => Self::send_alone(&zk, op).await,
                    _ => zk.multi(&ops).await,
                }
            };
            let result = Self::await_within_unit_deadlines(&mut batch, request).await;
            match result {
                Ok(mut results) => {
                    for unit in batch.iter_mut() {
                        let rest = results.split_off(unit.ops.len().min(results.len()));
                        let mine = std::mem::replace(&mut results, rest);
                        // Also for a unit whose caller left or was answered at its deadline.
                        if let Some(booking) = unit.booking.take() {
                            booking(&mine);
                        }
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
                            Self::answer(unit, Err(TxnError { index: None, error: error.clone() }.into()));
                        }
                        return;
                    };
                    let mut unit = batch.remove(culprit);
                    Self::answer(&mut unit, Err(TxnError { index: Some(index - start), error }.into()));
                },
                Err(err) => {
                    let twins = if err.error == ZkError::OutcomeUnknown {
                        twins(&batch.iter().map(|unit| unit.ops.as_slice()).collect::<Vec<_>>())
                    } else {
                        vec![Vec::new(); batch.len()]
                    };
                    for (unit, twins) in batch.iter_mut().zip(twins) {
                        Self::answer(unit, Err(Refusal { error: err.clone(), twins }));
                    }
                    return;
                },
            }
        }
    }

    /// Awaits `request` (the transaction of `batch`, already sent when it is first polled) and
    /// meanwhile answers each unit whose own deadline passes `OutcomeUnknown`, as a lone write
    /// would have been: its caller stops waiting, the transaction goes on for the others. A unit
    /// answered so is skipped by every later answer (its reply is closed).
    async fn await_within_unit_deadlines(
        batch: &mut [Unit],
        request: impl Future<Output = Result<Vec<TxnResult>, TxnError>>,
    ) -> Result<Vec<TxnResult>, TxnError> {
        let mut request = std::pin::pin!(request);
        let mut all_twins: Option<Vec<Twins>> = None;
        loop {
            let next = batch.iter().filter(|unit| !unit.reply.is_closed()).map(|unit| unit.deadline).min();
            let passed = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                result = &mut request => return result,
                () = passed => {},
            }
            let now = Instant::now();
            let all_twins = all_twins
                .get_or_insert_with(|| twins(&batch.iter().map(|unit| unit.ops.as_slice()).collect::<Vec<_>>()));
            for (unit, twins) in batch.iter_mut().zip(all_twins.iter()) {
                if unit.deadline <= now && !unit.reply.is_closed() {
                    let late = Refusal {
                        error: TxnError { index: None, error: ZkError::OutcomeUnknown },
                        twins: twins.clone(),
                    };
                    Self::answer(unit, Err(late));
                }
            }
        }
    }

    /// A lone operation without a transaction around it: a plain `create` or `setData` costs the
    /// server less than a `multi` of one.
    async fn send_alone(zk: &Zk, op: &TxnOp) -> Result<Vec<TxnResult>, TxnError> {
        let alone = |error: ZkError| {
            let definite = !matches!(error, ZkError::OutcomeUnknown | ZkError::Unavailable);
            TxnError { index: definite.then_some(0), error }
        };
        match op {
            TxnOp::Create { path, data, mode } => {
                zk.create(path, data, *mode).await.map(|created| vec![TxnResult::Created(created)]).map_err(alone)
            },
            TxnOp::SetData { path, data, version } => {
                zk.set_data(path, data, *version).await.map(|stat| vec![TxnResult::DataSet(stat)]).map_err(alone)
            },
            other => zk.multi(std::slice::from_ref(other)).await,
        }
    }

    fn answer(unit: &mut Unit, result: Result<Vec<TxnResult>, Refusal>) {
        let (reply, _) = oneshot::channel();
        let _ = std::mem::replace(&mut unit.reply, reply).send(result);
    }
}

/// The [`Twins`] of every unit (its ops) of one transaction, in order.
fn twins(units: &[&[TxnOp]]) -> Vec<Twins> {
    let create = |op: &TxnOp| match op {
        TxnOp::Create { path, data, .. } => Some((path.clone(), data.clone())),
        _ => None,
    };
    let mut counts: HashMap<(String, Vec<u8>), u32> = HashMap::new();
    for op in units.iter().flat_map(|ops| ops.iter()) {
        if let Some(key) = create(op) {
            *counts.entry(key).or_default() += 1;
        }
    }
    let mut seen: HashMap<(String, Vec<u8>), u32> = HashMap::new();
    units
        .iter()
        .map(|ops| {
            ops.iter()
                .map(|op| match create(op) {
                    Some(key) => {
                        let count = counts.get(&key).copied().unwrap_or(1);
                        let rank = seen.entry(key).or_default();
                        let twin = (*rank, count);
                        *rank += 1;
                        twin
                    },
                    None => (0, 1),
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zk::NodeMode;

    fn create(path: &str, data: &[u8]) -> TxnOp {
        TxnOp::Create { path: path.to_owned(), data: data.to_vec(), mode: NodeMode::PersistentSequential }
    }

    #[test]
    fn twins_rank_identical_creates_across_units_in_the_order_of_the_transaction() {
        let record = TxnOp::SetData { path: "/r".into(), data: b"x".to_vec(), version: None };
        let first = [record.clone(), create("/q/queue-", b"same"), create("/q/queue-", b"other")];
        let second = [create("/q/queue-", b"same")];
        let third = [create("/p/queue-", b"same"), record, create("/q/queue-", b"same")];
        let twins = twins(&[&first, &second, &third]);
        assert_eq!(twins[0], [(0, 1), (0, 3), (0, 1)]);
        assert_eq!(twins[1], [(1, 3)]);
        assert_eq!(twins[2], [(0, 1), (0, 1), (2, 3)], "another parent is another node; a setData is no create");
    }
}
