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

use crate::zk::{Zk, ZkError};

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
pub async fn is_deleted_queue_node(zk: &Zk, path: &str) -> bool {
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
/// node. Returns what it was before.
pub(crate) async fn mark_deleted(zk: &Zk, path: &str) -> Result<Presence, ZkError> {
    loop {
        match read(zk, path).await? {
            (Presence::Live, version) => match zk.set_data(path, DELETED_MARK, Some(version)).await {
                Ok(_) => return Ok(Presence::Live),
                Err(ZkError::BadVersion) => continue,
                Err(ZkError::NoNode) => return Ok(Presence::Absent),
                Err(err) => return Err(err),
            },
            (other, _) => return Ok(other),
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
