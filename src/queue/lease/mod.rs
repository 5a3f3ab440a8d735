//! Leases: lock-path safe consumption over HTTP (ack, nack, extend, visibility timeout, fenced
//! receipts, delivery counts, dead letters).
//!
//! A lease is Curator's lock node `<lockPath>/<item>` (EPHEMERAL) held by zkq's session, whose
//! data is a claim id unique to that lease. Files:
//! - `receipt.rs`: the receipts clients hold (a MAC'd token, bound to the session).
//! - `claim.rs`: leasing a candidate: read it, then one transaction that locks it only if it is
//!   unchanged and counts the delivery, so a failed attempt writes nothing.
//! - `steps.rs`: ack, nack, extend, expiry and release: one completion path, one step at a time
//!   per lease, a lost answer resolved by the lock's evidence before anything else happens.
//! - `dead_letter.rs`: moving poison and undecodable messages to the dead-letter queue.
//! - `background.rs`: the reaper (visibility timeouts, lost sessions) and the delivery-count sweeper.
//!
//! Invariants:
//! - Every step of a lease runs on the session that created its lock, so it is fenced: once that
//!   session is gone, its lock is gone and every call on it fails, and a newer session refuses
//!   older receipts (CURATOR-605 is the bug this prevents).
//! - A step that changes the message (ack, nack) creates a claim marker in its transaction: after
//!   a lost answer the marker alone says whether it applied, also once the session (and the lock)
//!   is gone. "Our lock is gone" is never read as "our ack applied": a Curator consumer's retried
//!   delete can remove our lock. Only a release is judged by the lock (gone: its goal is met).
//! - Steps of one lease never overlap, so a retried step never races another step of the lease.
//! - zkq never deletes a lock it does not hold: its locks have version [`LOCK_VERSION`] (written
//!   once in the claim's transaction) and every step deletes or checks them at that version.
//! - Delivery counts live in `{root}/deliveries/{queue}/{item}` (4-byte big-endian), a tree
//!   Curator readers never look at; they survive restarts and are removed with the message.
//! - A delivery counts once it is handed out: the claim writes the count (so a consumer that
//!   crashes on a message still counts), and a claim no client received (its client left, or
//!   its outcome was unknown and it is released later) takes the count back in the transaction
//!   that deletes its lock, while the lock still keeps every other claim away.

mod background;
mod claim;
mod dead_letter;
mod memory;
mod receipt;

pub(super) use memory::{LeaseMemories, LeaseMemory};

pub(crate) use receipt::{MalformedReceipt, Receipt};
mod steps;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::QueueError;
use super::cache::ChildrenCache;
use super::context::Context;
use super::names::ItemName;
pub(crate) use crate::types::NackMode;
use crate::types::now_epoch_ms;
use crate::zk::{TxnOp, Zk, ZkError};

pub(super) use claim::LeasePrepared;

/// What a client gets with a leased message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseGrant {
    /// The opaque receipt for ack, nack and extend.
    pub receipt: Receipt,
    pub expires_at_ms: i64,
    pub delivery_count: u32,
    /// When the message's node was created (ZooKeeper's `ctime`, epoch ms, by the server's clock):
    /// its put, or for an item split from a Curator `putMulti` node, the split. The same on every
    /// delivery of the node.
    pub created_at_ms: i64,
    /// When the message was first delivered (epoch ms, by ZooKeeper's clock; by zkq's when the
    /// claim's answer was lost): the creation of its delivery count, which its first claim wrote.
    pub first_delivered_at_ms: i64,
    /// Larger than the token of every earlier lease of every message on the ensemble.
    pub fencing_token: FencingToken,
}

/// A lease's fencing token: every lease granted later, of any message of any queue on the
/// ensemble, by any zkq, carries a larger one, across leader elections. An application passes it
/// to its own store (`… WHERE fence < :token`), so that a consumer whose lease was lost cannot
/// overwrite the work of the one that got the redelivery.
///
/// It is `zxid × 1024 + place`: `zxid` is the transaction that claimed the lease (ZooKeeper
/// numbers committed transactions in increasing order, the election epoch in the high half, so a
/// later claim always has a larger one, whichever server led it), `place` the lease's place among
/// those that transaction claimed together (a `?max=` lease claims at most `api.max_batch` ≤ 1000
/// at once). The lease's lock is created by that transaction, so after a lost answer its `czxid`
/// gives the same token. It stays below 2⁶³ (a signed 64-bit column) while the ensemble's epoch is
/// below 2²¹ elections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct FencingToken(u64);

impl FencingToken {
    /// Places among one transaction's leases.
    const PLACES: u64 = 1024;

    /// The token of the lease at `place` among those claimed by transaction `zxid`.
    pub(super) fn new(zxid: i64, place: usize) -> FencingToken {
        let zxid = u64::try_from(zxid).unwrap_or(0);
        let place = u64::try_from(place).unwrap_or(u64::MAX).min(Self::PLACES - 1);
        FencingToken(zxid.saturating_mul(Self::PLACES).saturating_add(place))
    }

    pub(crate) fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for FencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// What happens when a lease's time is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnExpiry {
    /// Visibility timeout: release the lock, the message keeps its place.
    Release,
    /// A nack with `delay` on a queue whose names cannot carry a time: requeue then.
    Requeue,
    /// A lease no client received, whose release could not be sent at once: release it and take
    /// back its delivery count.
    Return,
}

/// A step that ends a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Ack,
    Nack {
        mode: NackMode,
        delay: Duration,
    },
    /// The visibility (or a nack's delay) passed: what `on_expiry` says.
    Expire,
    /// The client left before the lease was handed over: released, its delivery not counted.
    Abandon,
    /// zkq is stopping: release so the message is delivered again at once.
    Shutdown,
}

#[derive(Clone)]
struct Lease {
    item: ItemName,
    lock: String,
    /// The lock node's data, unique to this lease: the evidence that the lock is ours.
    claim_id: Vec<u8>,
    counter: String,
    /// The operation that takes back the delivery count the claim wrote (for a lease no client
    /// received).
    uncount: TxnOp,
    /// The session that created the lock; every later step goes through it.
    zk: Zk,
    /// The node's data when leased (one item: a putMulti node is split when it is leased), for
    /// a requeue with the same bytes.
    data: Vec<u8>,
    data_version: i32,
    delivery_count: u32,
    expires_at: Instant,
    on_expiry: OnExpiry,
    /// Still usable by the client (false once a delayed nack took it over, or it is being released).
    open: bool,
    /// One step at a time per lease.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// A step whose answer was lost; resolved before anything else happens to the lease.
    unresolved: Option<Unresolved>,
}

/// A step whose answer was lost, and its claim marker when its transaction created one (every
/// step that changes the message does): the marker outlives the session, the lock does not.
#[derive(Clone, Debug)]
struct Unresolved {
    step: Step,
    marker: Option<String>,
    /// When the step's transaction was sent: a missing marker says "not applied" only within the
    /// marker age of it ([`ClaimMarkers::outcome`](super::claims::ClaimMarkers::outcome)).
    sent: Instant,
}

impl Lease {
    fn item_path(&self, queue_path: &str) -> String {
        format!("{queue_path}/{}", self.item.name)
    }

    fn view(&self) -> LeaseView {
        LeaseView { open: self.open, expires_at: self.expires_at, unresolved: self.unresolved.is_some() }
    }
}

/// What a receipt check needs to know of a live lease of the receipt's session.
#[derive(Debug, Clone, Copy)]
struct LeaseView {
    open: bool,
    expires_at: Instant,
    unresolved: bool,
}

/// Why a receipt cannot take a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReceiptRefused {
    /// Nacked with a delay, or expired and being released (409).
    BeingReleased,
    /// Its visibility passed (409).
    Expired,
    /// Issued here, and ended (409).
    Ended,
    /// Malformed, or never issued by this process (404).
    NotFound,
}

impl ReceiptRefused {
    fn into_error(self, receipt: Receipt) -> QueueError {
        let lost = |why: &str| QueueError::LeaseLost(why.to_owned());
        match self {
            ReceiptRefused::BeingReleased => lost("the lease was nacked or expired and is being released"),
            ReceiptRefused::Expired => lost("the lease's visibility timeout passed"),
            ReceiptRefused::Ended => lost("the lease ended: it was acked, nacked or expired, or its session was lost"),
            ReceiptRefused::NotFound => QueueError::LeaseNotFound(receipt.to_string()),
        }
    }
}

/// Whether a receipt may take a step now: `lease` is its live lease (of the receipt's session),
/// `issued` whether this process issued the receipt at all.
fn receipt_check(lease: Option<LeaseView>, issued: bool, now: Instant) -> Result<(), ReceiptRefused> {
    match lease {
        // A step whose answer was lost may be retried whatever happened since.
        Some(lease) if lease.unresolved => Ok(()),
        Some(lease) if !lease.open => Err(ReceiptRefused::BeingReleased),
        Some(lease) if lease.expires_at <= now => Err(ReceiptRefused::Expired),
        Some(_) => Ok(()),
        None if issued => Err(ReceiptRefused::Ended),
        None => Err(ReceiptRefused::NotFound),
    }
}

/// The leases whose time is up at `now`, and when the next one is.
fn due_leases<'a>(leases: impl Iterator<Item = (u128, Instant)> + 'a, now: Instant) -> (Vec<u128>, Option<Instant>) {
    let mut due = Vec::new();
    let mut next: Option<Instant> = None;
    for (token, expires_at) in leases {
        if expires_at <= now {
            due.push(token);
        } else {
            next = Some(next.map_or(expires_at, |n| n.min(expires_at)));
        }
    }
    (due, next)
}

/// The version of every lock zkq creates for a lease: created and written once in the claim's
/// transaction. A Curator consumer never writes its lock (version 0), so a step that deletes our
/// lock at this version never removes a lock someone else created under the same name (after a
/// Curator consumer's retried guaranteed delete removed ours).
pub(super) const LOCK_VERSION: i32 = 1;

#[derive(Default)]
struct TableState {
    live: HashMap<u128, Lease>,
    /// Items this process is leasing right now (transaction in flight, not yet in `live`).
    claiming: HashSet<String>,
    /// Leases of a lost session whose last step's answer was lost: its claim marker says whether
    /// it applied. Settled by the reaper as soon as ZooKeeper answers (or by the client's retry);
    /// at most the leases that were out.
    settling: HashMap<u128, Lease>,
}

/// The leases of one queue.
pub(super) struct LeaseTable {
    state: Mutex<TableState>,
    changed: Notify,
    /// Every waiter is woken when a lease leaves the table.
    ended: Notify,
    /// What outlives the queue (receipt key, numbering, remembered completions and items).
    memory: Arc<LeaseMemory>,
}

impl LeaseTable {
    pub(super) fn new(memory: Arc<LeaseMemory>) -> LeaseTable {
        LeaseTable { state: Mutex::default(), changed: Notify::new(), ended: Notify::new(), memory }
    }

    fn lock(&self) -> MutexGuard<'_, TableState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new token for a lease of `session_id`.
    fn issue(&self, session_id: i64) -> u128 {
        self.memory.key.token(session_id, self.memory.next_sequence())
    }

    /// Whether this process issued `token` for `session_id` (on this queue).
    fn issued(&self, session_id: i64, token: u128) -> bool {
        self.memory.key.issued(session_id, token)
    }

    /// Lock data no other lease (of any process) ever writes.
    fn claim_id(&self, zk: &Zk) -> Vec<u8> {
        format!("zkq-{:016x}-{}", zk.session_id(), self.memory.next_claim()).into_bytes()
    }
}

/// The leases of one queue and their protocol: leasing a candidate (`claim.rs`), the steps that
/// end or extend a lease (`steps.rs`), the reaper and the delivery-count sweeper
/// (`background.rs`), dead letters (`dead_letter.rs`). Its fields are private to `lease/`: the
/// rest of the queue reaches a lease only through these methods.
pub(super) struct Leases {
    ctx: Arc<Context>,
    cache: Arc<ChildrenCache>,
    table: LeaseTable,
}

impl Leases {
    pub(super) fn new(ctx: Arc<Context>, cache: Arc<ChildrenCache>, table: LeaseTable) -> Leases {
        Leases { ctx, cache, table }
    }

    /// Marks `item` as being leased by this process while the [`Claiming`] lives, within
    /// `lease.max_per_queue` (see [`Claiming::begin`]).
    pub(super) fn claiming(&self, item: &str) -> Result<Claiming<'_>, NotNow> {
        Claiming::begin(&self.table, item, self.ctx.max_leases)
    }
}

/// Marks an item as being leased by this process for as long as it lives.
pub(super) struct Claiming<'a> {
    table: &'a LeaseTable,
    item: String,
}

/// Why an item cannot be claimed for a lease now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NotNow {
    /// Another request of this process is leasing it.
    BeingClaimed,
    /// The queue has `lease.max_per_queue` leases out or being claimed.
    Full,
}

impl<'a> Claiming<'a> {
    /// Marks `item` as being leased, unless another request is leasing it or the queue already
    /// has `max` leases out or being claimed: checked and counted under the table's lock, so
    /// concurrent requests can never pass `lease.max_per_queue` together.
    pub(super) fn begin(table: &'a LeaseTable, item: &str, max: usize) -> Result<Claiming<'a>, NotNow> {
        let mut state = table.lock();
        if state.claiming.contains(item) {
            return Err(NotNow::BeingClaimed);
        }
        if state.live.len() + state.claiming.len() >= max {
            return Err(NotNow::Full);
        }
        state.claiming.insert(item.to_owned());
        Ok(Claiming { table, item: item.to_owned() })
    }
}

impl Drop for Claiming<'_> {
    fn drop(&mut self) {
        self.table.lock().claiming.remove(&self.item);
    }
}

fn counter_bytes(count: u32) -> Vec<u8> {
    count.to_be_bytes().to_vec()
}

/// The operation that undoes a claim's write of delivery count `count` to `counter`, whose
/// version before the claim was `read_version` (`None`: the claim created it).
fn uncount_op(counter: &str, count: u32, read_version: Option<i32>) -> TxnOp {
    match read_version {
        Some(version) => TxnOp::SetData {
            path: counter.to_owned(),
            data: counter_bytes(count.saturating_sub(1)),
            version: Some(version.saturating_add(1)),
        },
        None => TxnOp::Delete { path: counter.to_owned(), version: Some(0) },
    }
}

/// Deletes a lock of ours and, in the same transaction, takes back the delivery count its claim
/// wrote (`uncount`). A count changed since (by hand) is left as it is: the lock is deleted
/// alone. Errors are the lock's.
async fn release_uncounted(zk: &Zk, lock: &str, uncount: &TxnOp) -> Result<(), ZkError> {
    let ops = [TxnOp::Delete { path: lock.to_owned(), version: Some(LOCK_VERSION) }, uncount.clone()];
    match zk.multi(&ops).await {
        Ok(_) => Ok(()),
        Err(err) if err.index == Some(1) && matches!(err.error, ZkError::NoNode | ZkError::BadVersion) => {
            zk.delete(lock, Some(LOCK_VERSION)).await
        },
        Err(err) => Err(err.error),
    }
}

pub(crate) fn read_counter(data: &[u8]) -> u32 {
    data.get(..4).and_then(|b| b.try_into().ok()).map_or(0, u32::from_be_bytes)
}

fn epoch_ms_after(duration: Duration) -> i64 {
    now_epoch_ms().saturating_add(i64::try_from(duration.as_millis()).unwrap_or(i64::MAX))
}

/// Whether `lock` is the lock of claim `claim_id` on `zk`'s session, read after a sync so a
/// lagging server cannot answer with the past. `SessionLost` when that session has ended.
pub(super) async fn lock_is_ours(zk: &Zk, lock: &str, claim_id: &[u8]) -> Result<bool, ZkError> {
    Ok(our_lock_created_at(zk, lock, claim_id).await?.is_some())
}

/// As [`lock_is_ours`], answering the transaction that created the lock (its `czxid`) when it
/// is ours.
pub(super) async fn our_lock_created_at(zk: &Zk, lock: &str, claim_id: &[u8]) -> Result<Option<i64>, ZkError> {
    match zk.sync(lock).await {
        Ok(()) | Err(ZkError::NoNode) => {},
        Err(err) => return Err(err),
    }
    match zk.get_data(lock).await {
        Ok((data, stat)) => Ok((data == claim_id && stat.ephemeral_owner == zk.session_id()).then_some(stat.czxid)),
        Err(ZkError::NoNode) => Ok(None),
        Err(err) => Err(err),
    }
}

impl Leases {
    fn lock_dir(&self) -> Result<&str, QueueError> {
        self.ctx.lock_path.as_deref().ok_or_else(|| {
            QueueError::NotForKind(format!(
                "queue {:?} has no lock path, so it cannot lease (simple queues never lock); use take",
                self.ctx.name
            ))
        })
    }

    /// Whether leases of a lost session wait to be settled (the queue stays open for its reaper).
    pub(super) fn settling_leases(&self) -> bool {
        !self.table.lock().settling.is_empty()
    }

    /// Leases out and being claimed.
    pub(super) fn leases_out(&self) -> usize {
        let state = self.table.lock();
        state.live.len() + state.claiming.len()
    }

    /// Checks that leases are possible on this queue, and that it has fewer than
    /// `lease.max_per_queue` out (leases being claimed count too).
    pub(super) fn check_leasable(&self) -> Result<(), QueueError> {
        self.lock_dir()?;
        if self.leases_out() >= self.ctx.max_leases {
            return Err(QueueError::TooManyLeases(self.ctx.max_leases));
        }
        Ok(())
    }

    pub(super) fn counter_path(&self, item: &str) -> String {
        format!("{}/{}", self.ctx.deliveries_path, item)
    }

    /// Looks up a receipt: the lease if it can take a step, else 409 (ended, or from an older
    /// session of this process) or 404 (never issued by this process).
    fn open_lease(&self, receipt: Receipt) -> Result<u128, QueueError> {
        let Receipt { session_id, token } = receipt;
        let state = self.table.lock();
        let lease = state.live.get(&token).filter(|lease| lease.zk.session_id() == session_id).map(Lease::view);
        receipt_check(lease, self.table.issued(session_id, token), Instant::now())
            .map(|()| token)
            .map_err(|check| check.into_error(receipt))
    }

    /// Ends a lease in the table (its lock is gone or about to be), or the settlement of a lease
    /// of a lost session.
    fn end_lease(&self, token: u128) -> Option<Lease> {
        let lease = {
            let mut state = self.table.lock();
            state.settling.remove(&token);
            state.live.remove(&token)
        };
        if let Some(lease) = &lease {
            self.ctx.qm.leases_in_flight.dec();
            self.table.memory.remember_item(token, &lease.item.name);
            self.table.ended.notify_waiters();
        }
        lease
    }

    /// The message an ended lease of `receipt` held (once the lease has left the table: an
    /// expired one is released first), if this process issued the receipt and still remembers
    /// it; `None` also when the lease did not end within the request timeout.
    pub(crate) async fn ended_item(&self, receipt: Receipt) -> Option<String> {
        if !self.table.issued(receipt.session_id, receipt.token) {
            return None;
        }
        let deadline = Instant::now() + self.ctx.session.request_timeout();
        loop {
            let ended = self.table.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            let live = {
                let state = self.table.lock();
                state.live.contains_key(&receipt.token) || state.settling.contains_key(&receipt.token)
            };
            if !live {
                return self.table.memory.item_of(receipt.token);
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return None;
            }
        }
    }

    /// The receipt of the lease of this process that holds the message an ended lease `receipt`
    /// held, if one does (the message was leased again here); `None` otherwise.
    pub(crate) async fn current_lease_of(&self, receipt: Receipt) -> Option<Receipt> {
        let name = self.ended_item(receipt).await?;
        let state = self.table.lock();
        state
            .live
            .iter()
            .find(|(_, lease)| lease.open && lease.item.name == name)
            .map(|(token, lease)| Receipt::new(lease.zk.session_id(), *token))
    }

    /// A copy of a live lease, to work on while it stays in the table (so a step that fails for
    /// want of ZooKeeper can be retried with the same receipt).
    fn lease_snapshot(&self, token: u128) -> Result<Lease, QueueError> {
        self.table.lock().live.get(&token).cloned().ok_or_else(|| QueueError::LeaseLost("the lease ended".to_owned()))
    }

    /// Changes a live lease in place; false when it has ended.
    fn update_lease(&self, token: u128, change: impl FnOnce(&mut Lease)) -> bool {
        let changed = self.table.lock().live.get_mut(&token).map(change).is_some();
        if changed {
            self.table.changed.notify_one();
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_fencing_token_orders_leases_by_their_claim_then_by_their_place_in_it() {
        let token = |zxid, place| FencingToken::new(zxid, place).get();
        assert_eq!(token(5, 0), 5 * 1024);
        assert_eq!(token(5, 3), 5 * 1024 + 3);
        assert!(token(5, 999) < token(6, 0), "a later claim outranks every place of an earlier one");
        let new_epoch = 2_i64 << 32;
        assert!(token(new_epoch, 0) > token(new_epoch - 1, 999), "a new epoch outranks the old one");
        assert_eq!(token(5, 5000), 5 * 1024 + 1023, "a place never reaches into the next zxid");
        assert_eq!(token(-1, 0), 0, "no zxid is negative; none gives the lowest token");
    }

    fn live(open: bool, expires_in: Duration, unresolved: bool) -> Option<LeaseView> {
        Some(LeaseView { open, expires_at: Instant::now() + expires_in, unresolved })
    }

    #[tokio::test(start_paused = true)]
    async fn a_receipt_steps_while_its_lease_is_open_and_visible_or_a_lost_answer_awaits_its_retry() {
        let visible = live(true, Duration::from_secs(30), false);
        assert_eq!(receipt_check(visible, true, Instant::now()), Ok(()));
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(receipt_check(visible, true, Instant::now()), Err(ReceiptRefused::Expired), "visibility passed");
        assert_eq!(
            receipt_check(live(false, Duration::from_secs(30), false), true, Instant::now()),
            Err(ReceiptRefused::BeingReleased)
        );
        // An ack whose answer was lost is retried with the same receipt even after its visibility.
        let unresolved = live(true, Duration::from_secs(1), true);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(receipt_check(unresolved, true, Instant::now()), Ok(()));
        assert_eq!(receipt_check(None, true, Instant::now()), Err(ReceiptRefused::Ended), "issued here, ended: 409");
        assert_eq!(receipt_check(None, false, Instant::now()), Err(ReceiptRefused::NotFound), "never issued: 404");
    }

    #[tokio::test(start_paused = true)]
    async fn the_reaper_sees_exactly_the_leases_whose_time_is_up_and_when_the_next_one_is() {
        let start = Instant::now();
        let leases = [
            (1, start + Duration::from_secs(10)),
            (2, start + Duration::from_secs(5)),
            (3, start + Duration::from_secs(20)),
        ];
        assert_eq!(due_leases(leases.into_iter(), Instant::now()), (vec![], Some(start + Duration::from_secs(5))));
        tokio::time::advance(Duration::from_secs(10)).await;
        let (mut due, next) = due_leases(leases.into_iter(), Instant::now());
        due.sort_unstable();
        assert_eq!((due, next), (vec![1, 2], Some(start + Duration::from_secs(20))));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(due_leases(leases.into_iter(), Instant::now()).1, None);
    }
}
