//! What a queue's delete forgets of its keys: the records its deleted incarnation's puts wrote.
//!
//! A record's index entry is created (or moved) by the very transaction that stores or renews
//! its key with a message, so the entry's `czxid` says when that put was. Written before the
//! delete's mark, the record goes, with its entry, and a retry of that put stores anew; written
//! after it (a put that made the queue anew while the delete ran, or one through a sidecar that
//! had not seen the mark yet, whose message the delete keeps too), it stays, and a retry of that
//! put is still answered as the duplicate it is.

use futures::future::join_all;
use tokio::time::Instant;

use super::record::Record;
use crate::types::Layout;
use crate::zk::{TxnError, TxnOp, Zk, ZkError};

/// Records read (and deleted) at once.
const AT_ONCE: usize = 64;

/// Deletes the records of queue `queue` written before the transaction `mark_zxid` (a delete's
/// mark), each with its index entry, then the directories left empty (ZooKeeper deletes no node
/// that has a child, so a record written meanwhile keeps its own; a put recreates a missing
/// directory). How many nodes went, and `false` when the handle's deadline came first (what went
/// stays gone; calling again goes on).
pub(in crate::queue) async fn forget_written_before(
    zk: &Zk,
    layout: &Layout,
    queue: &str,
    mark_zxid: i64,
) -> Result<(usize, bool), ZkError> {
    let dir = layout.idempotency_of(queue);
    let hashes = match zk.get_children(&format!("{dir}/keys")).await {
        Ok((hashes, _)) => hashes,
        Err(ZkError::NoNode) => return Ok((0, true)),
        Err(_) if Instant::now() >= zk.deadline() => return Ok((0, false)),
        Err(err) => return Err(err),
    };
    let mut forgotten = 0;
    for chunk in hashes.chunks(AT_ONCE) {
        for result in join_all(chunk.iter().map(|hash| forget_if_older(zk, &dir, hash, mark_zxid))).await {
            match result {
                Ok(gone) => forgotten += usize::from(gone),
                Err(_) if Instant::now() >= zk.deadline() => return Ok((forgotten, false)),
                Err(err) => return Err(err),
            }
        }
    }
    let buckets = match zk.get_children(&format!("{dir}/expiry")).await {
        Ok((buckets, _)) => buckets.into_iter().map(|bucket| format!("{dir}/expiry/{bucket}")).collect(),
        Err(ZkError::NoNode) => Vec::new(),
        Err(_) if Instant::now() >= zk.deadline() => return Ok((forgotten, false)),
        Err(err) => return Err(err),
    };
    for bucket in buckets {
        forgotten += usize::from(delete_if_empty(zk, &bucket).await?);
    }
    for path in [format!("{dir}/keys"), format!("{dir}/expiry"), dir] {
        forgotten += usize::from(delete_if_empty(zk, &path).await?);
    }
    Ok((forgotten, true))
}

/// Deletes `path` unless it has a child (or is gone); whether it did.
async fn delete_if_empty(zk: &Zk, path: &str) -> Result<bool, ZkError> {
    match zk.delete(path, None).await {
        Ok(()) => Ok(true),
        Err(ZkError::NoNode | ZkError::NotEmpty) => Ok(false),
        Err(err) => Err(err),
    }
}

/// Deletes record `hash` of the records at `dir` (with its index entry) when its put came
/// before `mark_zxid`; whether it did.
async fn forget_if_older(zk: &Zk, dir: &str, hash: &str, mark_zxid: i64) -> Result<bool, ZkError> {
    let record_path = format!("{dir}/keys/{hash}");
    let (data, stat) = match zk.get_data(&record_path).await {
        Ok(found) => found,
        Err(ZkError::NoNode) => return Ok(false),
        Err(err) => return Err(err),
    };
    let entry_path = Record::parse(&data).map(|record| format!("{dir}/expiry/{}/{hash}", record.bucket));
    let (written_at, entry) = match &entry_path {
        Some(path) => match zk.exists(path).await? {
            Some(entry) => (entry.czxid, Some(path.clone())),
            // No entry (removed by hand, or swept just now): the record's own creation says.
            None => (stat.czxid, None),
        },
        // Not a record zkq wrote: its last write says.
        None => (stat.mzxid, None),
    };
    if written_at >= mark_zxid {
        return Ok(false);
    }
    // At the version read: a put that renewed the record meanwhile wrote a newer one, kept.
    let record = TxnOp::Delete { path: record_path, version: Some(stat.version) };
    let ops: Vec<TxnOp> =
        std::iter::once(record.clone()).chain(entry.map(|path| TxnOp::Delete { path, version: None })).collect();
    match zk.multi(&ops).await {
        Ok(_) => Ok(true),
        Err(TxnError { error: ZkError::NoNode, index: Some(1) }) => match zk.multi(&[record]).await {
            Ok(_) => Ok(true),
            Err(TxnError { error: ZkError::NoNode | ZkError::BadVersion, .. }) => Ok(false),
            Err(TxnError { error, .. }) => Err(error),
        },
        Err(TxnError { error: ZkError::NoNode | ZkError::BadVersion, .. }) => Ok(false),
        Err(TxnError { error, .. }) => Err(error),
    }
}
