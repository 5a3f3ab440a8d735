//! What follows a keyed put's transaction: the message's name written into its record, and a lost
//! answer settled. The name is known only once the multi has answered (the server appends the
//! sequence), so a versioned `setData` writes it next, through group commit as well (the names of
//! puts in flight together go in one transaction), and the put answers only once it applied: a
//! client that got 201 gets the same id from every replay, also after the message was consumed; a
//! put whose name could not be written in time answers 504.
//!
//! A lost answer is settled by evidence only: our token in the record (after `sync`) means applied;
//! not there means not applied, but only within half a window of the attempt. A record without a
//! name (zkq died between the two steps, or could not write it in time) is resolved among the nodes
//! created by the transaction whose zxid is the record's `mzxid` (every operation of a multi has the
//! same zxid): the one with the record's content (a hash of the node's name prefix and data), and of
//! `copies` identical nodes in the record's unit, the `copy`-th in sequence order. After a lost
//! answer the put knows more: group commit tells it where its creates stood among all the multi's
//! identical creates ([`Twins`]), so identical messages of other puts in the same multi are told
//! apart too. A replay after a crash between the steps knows only the record's unit: an identical
//! node another put stored in the same multi leaves the name untold. A message consumed before it
//! is found has no name left to tell. Either way the answer says so (`message_id: null`), never
//! guesses.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::protocol::{RecordWrite, Slot, Unit, Written, receipts};
use super::record::{Copy, Record, content_of, created_prefix, pick};
use crate::queue::QueueError;
use crate::queue::message::PutReceipt;
use crate::queue::names::{self, ItemName};
use crate::queue::put::Puts;
use crate::zk::{NodeStat, Twins, TxnOp, Zk, ZkError};

/// How long a replay waits for the put in flight to record its message's name before it looks
/// for the message itself.
const NAME_WAIT: Duration = Duration::from_secs(1);
/// Nodes read at most while looking for those one transaction created (a unit holds at most
/// 1,000 ops; the rest allows for nodes consumed since).
const MAX_BLOCK_READS: usize = 2_048;

impl Puts {
    /// The receipts of a unit that applied, its messages named `names` (in the order of its
    /// members), once each record holds its message's name ([`Puts::record_name`], all at once,
    /// within a request timeout): a replay then answers the same id, also after the message was
    /// consumed. The cache and the counter learn of the messages at once, as they are stored
    /// whatever happens next; a name that could not be written in time answers 504
    /// `outcome_unknown` (a retry with the key replays: the message is found by its zxid).
    pub(super) async fn unit_stored(
        &self,
        unit: Unit,
        names: Vec<Option<String>>,
        mut slots: Vec<Slot>,
    ) -> Result<Vec<PutReceipt>, QueueError> {
        if unit.evidence().is_some() {
            self.idempotency.holds_records.store(true, Ordering::SeqCst);
        }
        let mut writes = Vec::new();
        for (member, name) in unit.members.iter().zip(names) {
            let message_id = name.map(|name| self.stored(&name));
            if let (Some(write), Some(name)) = (&member.write, &message_id) {
                writes.push((write, name.clone()));
            }
            if let Some(slot) = slots.get_mut(member.slot) {
                *slot = Slot::Done(PutReceipt { message_id, replay: false });
            }
        }
        let deadline = Instant::now() + self.ctx.session.request_timeout();
        let named =
            futures::future::join_all(writes.iter().map(|(write, name)| self.record_name(write, name, deadline))).await;
        if let Some(err) = named.into_iter().find_map(Result::err) {
            tracing::warn!(queue = %self.ctx.name, error = %err,
                "stored a keyed message but could not write its name into its key's record in time; answering 504");
            self.ctx.qm.put_outcome_unknown.inc();
            return Err(match err {
                err if err.is_transient() => ZkError::OutcomeUnknown,
                err => err,
            }
            .into());
        }
        Ok(receipts(slots))
    }

    /// Writes `name` into the record `write` left, at the version that transaction left it (so
    /// never over a newer record), through group commit: the names of puts in flight together go
    /// in one transaction. A write whose answer was lost is sent again; one refused because the
    /// record moved on is checked: named already (our lost write applied, or a replay found the
    /// name), or no longer ours (renewed or removed since), there is nothing left to write.
    async fn record_name(&self, write: &RecordWrite, name: &str, deadline: Instant) -> Result<(), ZkError> {
        let mut version = write.version;
        let mut pause = Duration::from_millis(10);
        loop {
            let named = write.record.named(name);
            let op = TxnOp::SetData { path: write.path.clone(), data: named.to_bytes(), version: Some(version) };
            let zk = self.ctx.session.connected(deadline).await?;
            let error = match self.ctx.group.submit(&self.ctx.background, &zk, vec![op]).await {
                Ok(_) => return Ok(()),
                Err(err) => err.error,
            };
            match error {
                ZkError::BadVersion | ZkError::NoNode => {
                    let path = write.path.as_str();
                    let read = self
                        .ctx
                        .session
                        .retrying(deadline, |zk| async move {
                            match zk.get_data(path).await {
                                Ok((data, stat)) => Ok(Some((Record::parse(&data), stat))),
                                Err(ZkError::NoNode) => Ok(None),
                                Err(err) => Err(err),
                            }
                        })
                        .await?;
                    match read {
                        // Ours, and still without a name (it cannot be, but writing it is right).
                        Some((Some(record), stat))
                            if record.token == write.record.token && record.message_id.is_none() =>
                        {
                            version = stat.version;
                        },
                        _ => return Ok(()),
                    }
                },
                err if err.is_transient() => {
                    if Instant::now() >= deadline {
                        return Err(err);
                    }
                    tokio::time::sleep_until((Instant::now() + pause).min(deadline)).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                },
                err => return Err(err),
            }
        }
    }

    /// The names of a unit's messages after its answer was lost and its record showed it applied
    /// in transaction `zxid`: found among the nodes that transaction created, by content and, among
    /// identical ones, by the rank group commit reported (`twins`, per op of the unit: the server
    /// names sequential nodes in the order of the operations). A name that cannot be told (the
    /// message consumed since, or ZooKeeper not answering until `deadline`) is `None`: stored,
    /// name unknown.
    pub(super) async fn names_created_by(
        &self,
        unit: &Unit,
        twins: &Twins,
        zxid: i64,
        deadline: Instant,
    ) -> Vec<Option<String>> {
        let block = self.ctx.session.retrying(deadline, |zk| async move { self.created_by(&zk, zxid).await }).await;
        let block = block.unwrap_or_else(|err| {
            tracing::debug!(queue = %self.ctx.name, error = %err, "could not find the names of messages stored by a lost answer");
            Vec::new()
        });
        unit.members
            .iter()
            .map(|member| {
                let copy = match twins.get(member.create_op) {
                    Some(&(copy, copies)) => Copy { content: member.copy.content.clone(), copy, copies },
                    None => member.copy.clone(),
                };
                pick(&block, &copy)
            })
            .collect()
    }

    /// The message name a record stands for: the one it holds, else (the put that wrote it has
    /// not recorded it yet, or never will) the node created by the same transaction with the
    /// record's content and copy, found by its zxid. `None` when that message is gone. `wait`:
    /// give the put in flight up to [`NAME_WAIT`] to record the name first.
    pub(super) async fn name_of(
        &self,
        zk: &Zk,
        hash: &str,
        mut record: Record,
        mut stat: NodeStat,
        deadline: Instant,
        wait: bool,
    ) -> Result<Option<String>, ZkError> {
        let path = self.idempotency.record_path(hash);
        let waited_until = (Instant::now() + NAME_WAIT).min(deadline);
        while wait && record.message_id.is_none() && Instant::now() < waited_until {
            let (data, latest, watch) = match zk.get_and_watch_data(&path).await {
                Ok(read) => read,
                Err(ZkError::NoNode) => break,
                Err(err) => return Err(err),
            };
            match Record::parse(&data) {
                Some(latest_record) if latest_record.token == record.token => {
                    (record, stat) = (latest_record, latest);
                    if record.message_id.is_some() {
                        break;
                    }
                },
                _ => break, // renewed or replaced: look for the message of what we read
            }
            tokio::select! {
                _ = watch.changed() => {},
                _ = tokio::time::sleep_until(waited_until) => break,
            }
        }
        if let Some(name) = record.message_id.as_ref().filter(|name| names::is_item_name(self.ctx.naming, name)) {
            return Ok(Some(name.clone()));
        }
        let copy = Copy { content: record.content.clone(), copy: record.copy, copies: record.copies };
        let found = pick(&self.created_by(zk, stat.mzxid).await?, &copy);
        if let Some(name) = &found {
            // Later replays need no search; a newer record (another version) is left alone.
            let named = record.named(name);
            let _ = zk.set_data(&path, &named.to_bytes(), Some(stat.version)).await;
        }
        Ok(found)
    }

    /// The children of the queue created by transaction `zxid`, in sequence order, with their
    /// contents ([`content_of`]). A binary search over the children sorted by their sequence
    /// suffix (the server hands suffixes out in the order it applies operations, so their czxids
    /// ascend with them), one `exists` per probe, finds one; its neighbours with the same czxid
    /// are the rest (one transaction's nodes under one parent have adjacent sequences). Nodes
    /// split from a putMulti node (named, not sequential) are left out.
    async fn created_by(&self, zk: &Zk, zxid: i64) -> Result<Vec<(String, String)>, ZkError> {
        let children = match zk.get_children(&self.ctx.path).await {
            Ok((children, _)) => children,
            Err(ZkError::NoNode) => return Ok(Vec::new()),
            Err(err) => return Err(err),
        };
        let mut items: Vec<ItemName> = children
            .iter()
            .filter_map(|name| names::parse(self.ctx.naming, name))
            .filter(|item| item.sequence != i64::MAX && !names::is_split(&item.name))
            .collect();
        items.sort_by_key(|item| item.sequence);
        let (mut low, mut high) = (0, items.len());
        let mut found = None;
        while low < high {
            let middle = low + (high - low) / 2;
            let Some(item) = items.get(middle) else { break };
            match zk.exists(&format!("{}/{}", self.ctx.path, item.name)).await? {
                None => {
                    items.remove(middle);
                    high -= 1;
                },
                Some(stat) if stat.czxid == zxid => {
                    found = Some(middle);
                    break;
                },
                Some(stat) if stat.czxid < zxid => low = middle + 1,
                Some(_) => high = middle,
            }
        }
        let Some(found) = found else { return Ok(Vec::new()) };
        let mut block = std::collections::VecDeque::new();
        let mut reads = 0;
        for item in items.iter().take(found + 1).rev() {
            match self.created_node(zk, item, zxid, &mut reads).await? {
                Some(Some(node)) => block.push_front(node),
                Some(None) => {}, // gone: its neighbours may still be ours
                None => break,
            }
        }
        for item in items.iter().skip(found + 1) {
            match self.created_node(zk, item, zxid, &mut reads).await? {
                Some(Some(node)) => block.push_back(node),
                Some(None) => {},
                None => break,
            }
        }
        Ok(block.into())
    }

    /// Reads `item` for [`Puts::created_by`]: `Some(Some((name, content)))` when transaction
    /// `zxid` created it, `Some(None)` when it is gone, `None` when another transaction created it
    /// (or [`MAX_BLOCK_READS`] were made: the search ends there).
    async fn created_node(
        &self,
        zk: &Zk,
        item: &ItemName,
        zxid: i64,
        reads: &mut usize,
    ) -> Result<Option<Option<(String, String)>>, ZkError> {
        *reads += 1;
        if *reads > MAX_BLOCK_READS {
            return Ok(None);
        }
        match zk.get_data(&format!("{}/{}", self.ctx.path, item.name)).await {
            Err(ZkError::NoNode) => Ok(Some(None)),
            Err(err) => Err(err),
            Ok((data, stat)) if stat.czxid == zxid => {
                Ok(Some(created_prefix(&item.name).map(|prefix| (item.name.clone(), content_of(prefix, &data)))))
            },
            Ok(_) => Ok(None),
        }
    }

    /// Whether the unit holding `write`, whose answer was lost, applied: after a `sync`, our
    /// record (its token) is there or not. Asked again after every transient failure until
    /// `deadline`.
    pub(super) async fn written(&self, write: &RecordWrite, deadline: Instant) -> Written {
        let path = write.path.as_str();
        let token = write.record.token.as_str();
        let mine = self
            .ctx
            .session
            .retrying(deadline, |zk| async move {
                match zk.sync(path).await {
                    Ok(()) | Err(ZkError::NoNode) => {},
                    Err(err) => return Err(err),
                }
                match zk.get_data(path).await {
                    Ok((data, stat)) => Ok(Record::parse(&data).filter(|r| r.token == token).map(|_| stat)),
                    Err(ZkError::NoNode) => Ok(None),
                    Err(err) => Err(err),
                }
            })
            .await;
        match mine {
            Ok(Some(stat)) => Written::Applied(stat),
            // Within half a window our record cannot have expired and been replaced or swept
            // (allowing for clocks half a window apart; the window is at least 10 s): not there
            // means not applied. The read ended before this check, so the rule holds for it too.
            Ok(None) if write.started.elapsed() < self.idempotency.window / 2 => Written::NotApplied,
            Ok(None) | Err(_) => Written::Unknown,
        }
    }
}
