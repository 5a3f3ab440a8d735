//! Curator `putMulti` nodes: one node holding many items, split into nodes of one item each the
//! first time zkq claims it, so that each later item costs one small node instead of a rewrite of
//! the whole node.
//!
//! The claim that hands out the first item creates the other items' nodes in its own
//! transaction. When those creates would pass ZooKeeper's request limit (a node of 8,000 small
//! items is one 840 KB node but 1.5 MB of creates), the node is first made smaller: transactions
//! that each move a run of items from its tail into nodes of their own and rewrite the node
//! without them (version-checked, and under Curator's lock node when the queue has a lock path,
//! exactly as a claim), each measured by its encoded size. Every such step leaves a consistent
//! queue (the items are in the node or in their split nodes, never both, never neither), so a
//! lost answer is settled by reading the node again: its version says whether a step applied,
//! whoever applied it. Curator consumers stay safe: a plain consumer deletes the node with the
//! version it read, so it fails on a node rewritten since; a lock-safe one holds the lock.
//!
//! Names: item `i` of node `n` becomes `n-{i}` (`names::split_name`), which sorts right after the
//! node and before the next one. A node split in one transaction pads the index to the width of
//! its count (at least 4); a node split in several, or rewritten by zkq before (version > 0),
//! pads every index to [`names::WIDEST_SPLIT_INDEX`], so all its splits sort in item order.

use tokio::time::Instant;

use super::Claims;
use crate::config::QueueKind;
use crate::queue::context::Context;
use crate::queue::envelope;
use crate::queue::names::{self, ItemName};
use crate::zk::{NodeMode, NodeStat, TxnOp, Zk, ZkError};

/// A candidate node made ready for a claim by [`Claims::fit_for_claim`].
pub(super) enum Fit {
    /// The node as it is now: its claim's transaction fits.
    Ready(Vec<u8>, NodeStat),
    /// It was consumed meanwhile.
    Gone,
    /// A consumer holds its lock.
    Locked,
    /// Not even one item can be moved out within the request limit (a node within a few hundred
    /// bytes of it): left in place for Curator consumers, like an undecodable node.
    Unsplittable,
}

impl Context {
    /// The creates that split `rest`, the items after the first of node `name` at `version`, into
    /// single-item nodes (Curator's envelope). They run in the transaction that claims the first.
    pub(in crate::queue) fn split_ops(
        &self,
        name: &str,
        rest: &[Vec<u8>],
        version: i32,
    ) -> (Vec<TxnOp>, Vec<ItemName>) {
        let width = if version > 0 { names::WIDEST_SPLIT_INDEX } else { names::split_width(rest.len()) };
        self.split_creates(name, rest.iter().enumerate().map(|(at, item)| (at + 1, item.as_slice())), width)
    }

    fn split_creates<'a>(
        &self,
        name: &str,
        items: impl Iterator<Item = (usize, &'a [u8])>,
        width: usize,
    ) -> (Vec<TxnOp>, Vec<ItemName>) {
        let (mut ops, mut split) = (Vec::new(), Vec::new());
        for (index, item) in items {
            let split_name = names::split_name_with_width(name, index, width);
            ops.push(TxnOp::Create {
                path: format!("{}/{split_name}", self.path),
                data: envelope::encode([item]),
                mode: NodeMode::Persistent,
            });
            split.extend(names::parse(self.naming, &split_name));
        }
        (ops, split)
    }
}

impl Claims {
    /// Makes node `name` (read as `data` at `stat`) small enough that its claim fits one request:
    /// while `claim_bytes(items, version)`, the encoded size of the claim the caller would send,
    /// is over [`Zk::max_request_bytes`], moves the largest run of tail items that fits one request
    /// into nodes of their own, then reads the node again. Gives up at `zk`'s deadline (the error
    /// of the call that passed it).
    pub(super) async fn fit_for_claim(
        &self,
        zk: &Zk,
        name: &str,
        (mut data, mut stat): (Vec<u8>, NodeStat),
        claim_bytes: impl Fn(&[Vec<u8>], i32) -> usize,
    ) -> Result<Fit, ZkError> {
        let path = format!("{}/{name}", self.ctx.path);
        let lock = self.ctx.lock_path.as_ref().map(|dir| format!("{dir}/{name}"));
        loop {
            let items = match envelope::decode(&data) {
                Ok(items) if self.ctx.kind != QueueKind::Simple => items,
                // Not a putMulti node: nothing to split, the claim judges it.
                _ => return Ok(Fit::Ready(data, stat)),
            };
            if items.len() < 2 || claim_bytes(&items, stat.version) <= zk.max_request_bytes() {
                return Ok(Fit::Ready(data, stat));
            }
            let Some((ops, split)) = self.tail_step(zk, &path, lock.as_deref(), name, &items, stat.version) else {
                if self.cache.mark_undecodable(name) {
                    tracing::warn!(queue = %self.ctx.name, node = %name, bytes = data.len(),
                        "skipping a putMulti node that cannot be split within ZooKeeper's request limit \
                         (left in place for Curator consumers)");
                }
                return Ok(Fit::Unsplittable);
            };
            let parents: Vec<(usize, String)> = self.ctx.lock_path.iter().map(|dir| (0, dir.clone())).collect();
            match self.ctx.apply_txn(zk, &ops, &parents).await {
                Ok(_) => {
                    tracing::info!(queue = %self.ctx.name, node = %name, moved = split.len(), left = items.len() - split.len(),
                        "moved items of a large putMulti node into nodes of their own");
                    for item in split {
                        self.cache.insert_split(item);
                    }
                },
                Err(err) if err.error == ZkError::NodeExists && err.index == Some(0) && lock.is_some() => {
                    return Ok(Fit::Locked);
                },
                // Changed, consumed, or the answer lost: the node as it is now says what happened.
                Err(err) if matches!(err.error, ZkError::BadVersion | ZkError::NoNode | ZkError::OutcomeUnknown) => {},
                Err(err) => return Err(err.error),
            }
            if zk.deadline() <= Instant::now() {
                return Err(ZkError::Unavailable);
            }
            match zk.get_data(&path).await {
                Ok(read) => (data, stat) = read,
                Err(ZkError::NoNode) => return Ok(Fit::Gone),
                Err(err) => return Err(err),
            }
        }
    }

    /// One step of [`Claims::fit_for_claim`]: the transaction that moves the largest run of tail
    /// items that fits one request out of the node (at `version`) into nodes of their own, and
    /// the split items; `None` when not even one item fits.
    fn tail_step(
        &self,
        zk: &Zk,
        path: &str,
        lock: Option<&str>,
        name: &str,
        items: &[Vec<u8>],
        version: i32,
    ) -> Option<(Vec<TxnOp>, Vec<ItemName>)> {
        let lock_ops = |data: &[u8]| {
            lock.map(|lock| {
                [
                    TxnOp::Create { path: lock.to_owned(), data: data.to_vec(), mode: NodeMode::Ephemeral },
                    TxnOp::Delete { path: lock.to_owned(), version: None },
                ]
            })
        };
        // The size of moving `moved` items, from the sizes of its parts: everything but the
        // rewritten node and the creates, then the node without them, then each create.
        let fixed = zk.request_bytes(lock_ops(b"").iter().flatten())
            + zk.op_bytes(&TxnOp::SetData { path: path.to_owned(), data: Vec::new(), version: None });
        // The node's data as it would be kept, shrinking as items move out.
        let mut kept_data = envelope::encoded_len(items.iter().map(Vec::len));
        let create = |index: usize, item: &[u8]| {
            zk.op_bytes(&TxnOp::Create {
                path: format!(
                    "{}/{}",
                    self.ctx.path,
                    names::split_name_with_width(name, index, names::WIDEST_SPLIT_INDEX)
                ),
                data: Vec::new(),
                mode: NodeMode::Persistent,
            }) + envelope::encoded_len([item.len()])
        };
        let mut creates = 0;
        let mut moved = 0;
        // At least the first item stays in the node: the claim hands it out.
        for (index, item) in items.iter().enumerate().skip(1).rev() {
            let item_bytes = envelope::encoded_len([item.len()]) - envelope::encoded_len([]);
            let (next_creates, next_kept) = (creates + create(index, item), kept_data - item_bytes);
            if fixed + next_kept + next_creates > zk.max_request_bytes() {
                break;
            }
            (creates, kept_data) = (next_creates, next_kept);
            moved += 1;
        }
        if moved == 0 {
            return None;
        }
        let kept = items.len() - moved;
        let mut ops: Vec<TxnOp> = Vec::with_capacity(moved + 3);
        let lock_pair = lock_ops(b"");
        if let Some([create_lock, _]) = &lock_pair {
            ops.push(create_lock.clone());
        }
        ops.push(TxnOp::SetData {
            path: path.to_owned(),
            data: envelope::encode(items.iter().take(kept).map(Vec::as_slice)),
            version: Some(version),
        });
        let tail = items.iter().enumerate().skip(kept).map(|(index, item)| (index, item.as_slice()));
        let (creates, split) = self.ctx.split_creates(name, tail, names::WIDEST_SPLIT_INDEX);
        ops.extend(creates);
        if let Some([_, delete_lock]) = lock_pair {
            ops.push(delete_lock);
        }
        Some((ops, split))
    }
}
