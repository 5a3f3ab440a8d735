//! The catalog's mark on a dynamic queue's node: whether the queue exists, or was deleted.
//!
//! A deleted dynamic queue keeps its node, emptied, with [`DELETED_MARK`] as its data. ZooKeeper
//! numbers a node's sequential children from its own counter, which lives as long as the node:
//! were the node deleted and made again, the next message would be `queue-0000000000` again, and
//! a lease, lock or receipt of the old incarnation (on any sidecar) would name the new message.
//! Kept, the node goes on numbering, so no name of one incarnation is ever a name of another,
//! and a stale receipt's ack finds no node to delete.
//!
//! Curator's consumers and producers never read or write a queue node's own data (Curator's
//! `start()` creates it with its client's default data, the host's address), so the mark is
//! invisible to them; a queue node whose data is anything but the mark is a live queue.
//!
//! The mark is untrusted input like every node: only its exact bytes mean "deleted".

use super::names;
use crate::zk::{NodeMode, TxnError, TxnOp, TxnResult, Zk, ZkError};

/// The data of a deleted dynamic queue's node.
pub(crate) const DELETED_MARK: &[u8] = b"{\"zkq\":\"queue deleted\"}";

/// What a queue's node says about the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Presence {
    /// No node: never made (or removed by another client).
    Absent,
    /// The node holds the catalog's mark: deleted, until a put or a `CreateQueue` makes it anew.
    Deleted,
    /// A queue that exists.
    Live,
}

impl Presence {
    /// What a node's data (`None`: no node) says.
    pub(crate) fn of(data: Option<&[u8]>) -> Presence {
        match data {
            None => Presence::Absent,
            Some(DELETED_MARK) => Presence::Deleted,
            Some(_) => Presence::Live,
        }
    }

    pub(crate) fn is_live(self) -> bool {
        self == Presence::Live
    }
}

/// Reads what the node at `path` says (no `sync`: the caller decides how fresh it must be).
pub(crate) async fn presence(zk: &Zk, path: &str) -> Result<Presence, ZkError> {
    Ok(read(zk, path).await?.0)
}

/// Whether the node at `path` is a deleted dynamic queue's (for the read-only survey, which
/// reports such a queue as not existing); a failed read says no, and the survey's own reads
/// report the failure.
pub(crate) async fn is_deleted_queue_node(zk: &Zk, path: &str) -> bool {
    matches!(presence(zk, path).await, Ok(Presence::Deleted))
}

/// What the node at `path` says, with its data version (for the write that changes it).
async fn read(zk: &Zk, path: &str) -> Result<(Presence, i32), ZkError> {
    match zk.get_data(path).await {
        Ok((data, stat)) => Ok((Presence::of(Some(&data)), stat.version)),
        Err(ZkError::NoNode) => Ok((Presence::Absent, 0)),
        Err(err) => Err(err),
    }
}

/// Makes a deleted queue exist again: its mark replaced by empty data, at the version read, so
/// of two sidecars reviving it one writes and the other reads it live. `Ok` once it is live.
pub(crate) async fn revive(zk: &Zk, path: &str) -> Result<(), ZkError> {
    loop {
        match read(zk, path).await? {
            (Presence::Live | Presence::Absent, _) => return Ok(()),
            (Presence::Deleted, version) => match zk.set_data(path, b"", Some(version)).await {
                Ok(_) | Err(ZkError::NoNode) => return Ok(()),
                Err(ZkError::BadVersion) => continue,
                Err(err) => return Err(err),
            },
        }
    }
}

/// Marks the queue at `path` deleted (its node kept), unless it is deleted already or has no
/// node, and removes its settings node (`settings_path`) in the same transaction: a
/// `CreateQueue` that makes the queue anew afterwards writes its own, which nothing of this
/// delete touches. Returns what it was before, and the transaction that wrote the mark (this
/// call's, or, marked already, the one it read): what the deleted incarnation holds was made
/// before it ([`ended_incarnation`]), and a message put afterwards, by a sidecar that had not
/// seen the mark yet or once the queue was made anew while the delete goes on, is never part of it.
pub(crate) async fn mark_deleted(zk: &Zk, path: &str, settings_path: &str) -> Result<(Presence, Option<i64>), ZkError> {
    loop {
        let (presence, stat) = match zk.get_data(path).await {
            Ok((data, stat)) => (Presence::of(Some(&data)), stat),
            Err(ZkError::NoNode) => return Ok((Presence::Absent, None)),
            Err(err) => return Err(err),
        };
        if presence == Presence::Deleted {
            // Marked already (a delete cut short, or two at once): the node's data is the mark,
            // so its last write is the mark's.
            return Ok((presence, Some(stat.mzxid)));
        }
        if presence != Presence::Live {
            return Ok((presence, None));
        }
        let mut ops =
            vec![TxnOp::SetData { path: path.to_owned(), data: DELETED_MARK.to_vec(), version: Some(stat.version) }];
        if let Some(settings) = zk.exists(settings_path).await? {
            ops.push(TxnOp::Delete { path: settings_path.to_owned(), version: Some(settings.version) });
        }
        match zk.multi(&ops).await {
            Ok(results) => match results.first() {
                Some(TxnResult::DataSet(marked)) => return Ok((Presence::Live, Some(marked.mzxid))),
                // ZooKeeper answers a transaction's operations in order: not reached.
                _ => return Err(ZkError::OutcomeUnknown),
            },
            // Changed meanwhile (the queue's node or its settings): read again.
            Err(TxnError { error: ZkError::BadVersion | ZkError::NoNode, .. }) => continue,
            Err(TxnError { error, .. }) => return Err(error),
        }
    }
}

/// Which children of a deleted queue's node (messages, and the locks and delivery counts named as
/// they are) belong to the incarnation the delete ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ended {
    /// Numbered children below this sequence were made before the mark; `None`: none listed was.
    below: Option<i64>,
}

impl Ended {
    /// Every child: the queue had no node to mark.
    pub(crate) const ALL: Ended = Ended { below: Some(i64::MAX) };

    /// Whether child `name` is the deleted incarnation's. A foreign name (no sequence) is.
    pub(crate) fn holds(self, name: &str) -> bool {
        match names::sequence_of(name) {
            None => true,
            Some(sequence) => self.below.is_some_and(|below| sequence < below),
        }
    }
}

/// How many children the search for the boundary reads at once.
const BOUNDARY_READS: usize = 16;

/// Where the incarnation that the mark written by transaction `mark_zxid` ended stops among the
/// children of the queue node at `path`. ZooKeeper numbers sequential children in the order it
/// creates them, so creation transactions (`czxid`) grow with the sequence: read from the newest
/// down (a few at a time), the first child made before the mark bounds the old incarnation, and
/// the messages made after it, by puts while the delete runs, are only the few read before it.
/// A child gone meanwhile is passed over; a split node (made later than its base's number says)
/// proves nothing and is not read.
pub(crate) async fn ended_incarnation(zk: &Zk, path: &str, mark_zxid: i64) -> Result<Ended, ZkError> {
    let children = match zk.get_children(path).await {
        Ok((children, _)) => children,
        Err(ZkError::NoNode) => return Ok(Ended { below: None }),
        Err(err) => return Err(err),
    };
    let mut numbered: Vec<(i64, String)> = children
        .into_iter()
        .filter(|name| !names::is_split(name))
        .filter_map(|name| names::sequence_of(&name).map(|sequence| (sequence, name)))
        .collect();
    numbered.sort_unstable_by(|a, b| b.cmp(a));
    let mut lowest_later = None;
    for chunk in numbered.chunks(BOUNDARY_READS) {
        let reads = chunk.iter().map(|(_, name)| {
            let child = format!("{path}/{name}");
            async move { zk.exists(&child).await }
        });
        let stats = futures::future::join_all(reads).await;
        for ((sequence, _), stat) in chunk.iter().zip(stats) {
            match stat? {
                Some(stat) if stat.czxid < mark_zxid => return Ok(Ended { below: Some(sequence.saturating_add(1)) }),
                // Made after the mark: what is below it may still be older.
                Some(_) => lowest_later = Some(*sequence),
                None => {},
            }
        }
    }
    // None listed (or left) was made before the mark: what was older is gone already, and
    // anything numbered below the oldest later one is older.
    Ok(Ended { below: lowest_later })
}

/// What [`create`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Creation {
    /// This call made the queue (it had no node, or a deleted one), with the settings it gave.
    Made,
    /// The queue exists: the data of its settings node (`None`: it has none), as ZooKeeper
    /// holds it after a `sync`.
    Existed(Option<Vec<u8>>),
}

/// Makes the dynamic queue at `path` exist with `settings` as the data of its settings node at
/// `settings_path` (`None`: no node), in one transaction: no other client ever sees the queue
/// without its settings, and a transaction refused leaves nothing behind. Of concurrent calls,
/// one makes the queue and the others find it existing. An answer lost with the connection is
/// settled by reading again: the queue then exists, with the settings some call gave it, and
/// the caller compares them with its own.
pub(crate) async fn create(
    zk: &Zk,
    path: &str,
    settings_path: &str,
    settings: Option<&[u8]>,
) -> Result<Creation, ZkError> {
    loop {
        zk.sync(path).await?;
        let (presence, version) = read(zk, path).await?;
        let queue_op = match presence {
            Presence::Live => {
                return match zk.get_data(settings_path).await {
                    Ok((data, _)) => Ok(Creation::Existed(Some(data))),
                    Err(ZkError::NoNode) => Ok(Creation::Existed(None)),
                    Err(err) => Err(err),
                };
            },
            Presence::Absent => TxnOp::Create { path: path.to_owned(), data: Vec::new(), mode: NodeMode::Persistent },
            Presence::Deleted => TxnOp::SetData { path: path.to_owned(), data: Vec::new(), version: Some(version) },
        };
        // A settings node left without a live queue (another client wrote it) is replaced.
        let settings_op = match (zk.exists(settings_path).await?, settings) {
            (None, None) => None,
            (None, Some(data)) => {
                Some(TxnOp::Create { path: settings_path.to_owned(), data: data.to_vec(), mode: NodeMode::Persistent })
            },
            (Some(stat), Some(data)) => Some(TxnOp::SetData {
                path: settings_path.to_owned(),
                data: data.to_vec(),
                version: Some(stat.version),
            }),
            (Some(stat), None) => Some(TxnOp::Delete { path: settings_path.to_owned(), version: Some(stat.version) }),
        };
        let ops: Vec<TxnOp> = std::iter::once(queue_op).chain(settings_op).collect();
        match zk.multi(&ops).await {
            Ok(_) => return Ok(Creation::Made),
            // A parent is missing: made, then the transaction again.
            Err(TxnError { error: ZkError::NoNode, index }) => {
                let missing = if index == Some(0) { path } else { settings_path };
                if let Some((parent, _)) = missing.rsplit_once('/')
                    && !parent.is_empty()
                {
                    zk.ensure_path(parent).await?;
                }
            },
            // Another call came first, or the answer was lost: what ZooKeeper holds now says.
            Err(TxnError { error: ZkError::NodeExists | ZkError::BadVersion | ZkError::OutcomeUnknown, .. }) => {},
            Err(TxnError { error, .. }) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_mark_means_deleted() {
        assert_eq!(Presence::of(None), Presence::Absent);
        assert_eq!(Presence::of(Some(DELETED_MARK)), Presence::Deleted);
        // Curator's default data (the host's address), zkq's empty data, near misses: live.
        for live in [b"".as_slice(), b"10.0.0.7", b"{\"zkq\":\"queue deleted\"} ", b"{\"zkq\":\"deleted\"}"] {
            assert_eq!(Presence::of(Some(live)), Presence::Live, "{live:?}");
        }
        assert!(Presence::Live.is_live());
        assert!(!Presence::Deleted.is_live() && !Presence::Absent.is_live());
    }
}
