//! The sweepers: expired records go with their index entries, a bucket at a time, by the queue's
//! own sweeper while the queue is open here, and by each process's sweep of the queues it does not
//! have open. The sweeper lists only the bucket names and the buckets whose end has passed; it
//! never lists or reads a live record.
//!
//! It deletes a record only with its index entry, in one transaction, at the version it read as
//! expired. The entry is a fence: a sweeper working from a stale read fails on the entry another
//! sweeper already deleted, so it never deletes a record that was swept and created again; a
//! renewed record has a new version, so it is never deleted either.

use crate::types::Layout;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Idempotency;
use super::record::{Record, bucket_end};
use crate::queue::put::Puts;
use crate::types::now_epoch_ms;
use crate::zk::{TxnOp, Zk, ZkError};

/// Records (with their index entries) deleted per sweep transaction.
const SWEEP_BATCH: usize = 64;
/// How often a queue whose idempotency directory this process found empty looks again (records
/// another zkq wrote and could not sweep, because it stopped), and how often each process sweeps
/// the records of queues it does not have open.
pub(in crate::queue) const IDLE_CHECK: Duration = Duration::from_secs(600);
/// Queues one pass of the sweep of queues not open here looks at, at most (a random run of them
/// when there are more: every one is reached over the passes).
const ORPHANS_PER_PASS: usize = 100;
/// Children of `{root}/idempotency` listed at most (more would not fit one ZooKeeper answer).
const MAX_ORPHAN_LIST: i32 = 50_000;

impl Puts {
    /// Deletes expired records of this queue, in batches: every period (a tenth of the window,
    /// between 1 s and 1 min) while records may exist, else every [`IDLE_CHECK`].
    pub(in crate::queue) async fn run_idempotency_sweeper(self: std::sync::Arc<Self>, stop: CancellationToken) {
        let period = (self.idempotency.window / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
        let queue = &self;
        self.ctx
            .session
            .periodically(period, &stop, |zk| async move {
                if !queue.idempotency.sweep_due() {
                    return;
                }
                let mut swept = 0;
                let result = queue.idempotency.sweep(&zk, &mut swept).await;
                queue.ctx.qm.idempotency_records_swept.inc_by(swept as u64);
                match result {
                    Ok(()) if swept == 0 => {},
                    Ok(()) => tracing::debug!(queue = %queue.ctx.name, swept, "swept expired idempotency records"),
                    Err(err) => tracing::debug!(queue = %queue.ctx.name, error = %err, "idempotency sweep failed"),
                }
            })
            .await;
    }
}

impl Idempotency {
    /// One sweep: the buckets whose end has passed, oldest first. Counts the records it deleted
    /// into `swept`, also when it fails part way.
    async fn sweep(&self, zk: &Zk, swept: &mut usize) -> Result<(), ZkError> {
        let buckets = match zk.get_children(&self.expiry_dir()).await {
            Ok((buckets, _)) => buckets,
            Err(ZkError::NoNode) => Vec::new(),
            Err(err) => return Err(err),
        };
        *self.listed_at() = Some(Instant::now());
        self.holds_records.store(!buckets.is_empty(), Ordering::SeqCst);
        let now = now_epoch_ms();
        let mut due: Vec<(i64, String)> = buckets
            .into_iter()
            .filter_map(|b| bucket_end(&b).map(|end| (end, b)))
            .filter(|(end, _)| *end <= now)
            .collect();
        due.sort();
        for (_, bucket) in due {
            self.sweep_bucket(zk, &bucket, now, swept).await?;
        }
        Ok(())
    }

    /// Deletes the records of one expired bucket with their entries, then the bucket.
    async fn sweep_bucket(&self, zk: &Zk, bucket: &str, now: i64, swept: &mut usize) -> Result<(), ZkError> {
        let bucket_path = format!("{}/{bucket}", self.expiry_dir());
        let hashes = match zk.get_children(&bucket_path).await {
            Ok((hashes, _)) => hashes,
            Err(ZkError::NoNode) => return Ok(()),
            Err(err) => return Err(err),
        };
        for chunk in hashes.chunks(SWEEP_BATCH) {
            let paths: Vec<String> = chunk.iter().map(|hash| self.record_path(hash)).collect();
            let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
            let reads = zk.get_data_many(&refs).await?;
            // Each group is deleted whole or not at all; `true`: it deletes a record.
            let mut groups: Vec<(Vec<TxnOp>, bool)> = Vec::with_capacity(chunk.len());
            for ((hash, path), read) in chunk.iter().zip(&paths).zip(reads) {
                let entry = TxnOp::Delete { path: self.entry_path(bucket, hash), version: None };
                match read {
                    Err(ZkError::NoNode) => groups.push((vec![entry], false)),
                    Err(err) => return Err(err),
                    Ok((data, stat)) => match Record::parse(&data) {
                        // Renewed since (its entry is in a later bucket): only this entry goes.
                        Some(record) if record.expires_at > now && record.bucket != bucket => {
                            groups.push((vec![entry], false));
                        },
                        Some(record) if record.expires_at > now => {},
                        _ => groups.push((
                            vec![TxnOp::Delete { path: path.clone(), version: Some(stat.version) }, entry],
                            true,
                        )),
                    },
                }
            }
            *swept += delete_groups(zk, groups).await?;
        }
        // Empty now, unless a group lost a race: the next sweep finds it again.
        match zk.delete(&bucket_path, None).await {
            Ok(()) | Err(ZkError::NoNode | ZkError::NotEmpty) => Ok(()),
            Err(err) => Err(err),
        }
    }
}

/// Deletes `groups` in one transaction; a group that fails (a put renewed its record, or another
/// sweeper was first) is dropped and the rest tried again. Answers how many records went.
async fn delete_groups(zk: &Zk, mut groups: Vec<(Vec<TxnOp>, bool)>) -> Result<usize, ZkError> {
    while !groups.is_empty() {
        let ops: Vec<TxnOp> = groups.iter().flat_map(|(ops, _)| ops.iter().cloned()).collect();
        match zk.multi(&ops).await {
            Ok(_) => return Ok(groups.iter().filter(|(_, record)| *record).count()),
            Err(err) if matches!(err.error, ZkError::NoNode | ZkError::BadVersion) => {
                let Some(index) = err.index else { return Ok(0) };
                let mut first = 0;
                let failed = groups.iter().position(|(ops, _)| {
                    first += ops.len();
                    index < first
                });
                match failed {
                    Some(group) => {
                        groups.remove(group);
                    },
                    None => return Ok(0),
                }
            },
            Err(err) => return Err(err.error),
        }
    }
    Ok(0)
}

/// One pass over the queues under `{root}/idempotency` that this process does not have open
/// (`is_open`): each one's expired records are swept, as its own sweeper would if it were open.
/// So records of a dynamic queue nobody opens again do not stay forever. Cheap and bounded: one
/// `exists` and one child list of `{root}/idempotency` (skipped past [`MAX_ORPHAN_LIST`]
/// children), then at most [`ORPHANS_PER_PASS`] queues (a run starting at random when there are
/// more), each with its own request timeout; a queue without due buckets costs one child list.
/// Many processes doing this at once stay safe: every delete is fenced like the sweeper's (by the
/// record's version and its index entry). Answers how many records went.
pub(in crate::queue) async fn sweep_queues_not_open(
    zk: &Zk,
    layout: &Layout,
    request_timeout: Duration,
    is_open: impl Fn(&str) -> bool,
    stop: &CancellationToken,
) -> Result<usize, ZkError> {
    let dir = layout.idempotency();
    let zk_now = zk.with_deadline(Instant::now() + request_timeout);
    match zk_now.exists(&dir).await? {
        None => return Ok(0),
        Some(stat) if stat.num_children > MAX_ORPHAN_LIST => {
            tracing::warn!(dir = %dir, queues = stat.num_children,
                "too many queues hold idempotency records to look for those no zkq has open; their own sweepers still run");
            return Ok(0);
        },
        Some(_) => {},
    }
    let mut queues: Vec<String> = match zk_now.get_children(&dir).await {
        Ok((queues, _)) => queues.into_iter().filter(|queue| !is_open(queue)).collect(),
        Err(ZkError::NoNode) => return Ok(0),
        Err(err) => return Err(err),
    };
    queues.sort();
    if queues.len() > ORPHANS_PER_PASS {
        let start = rand::random_range(0..queues.len());
        queues.rotate_left(start);
        queues.truncate(ORPHANS_PER_PASS);
    }
    let mut swept = 0;
    for queue in queues {
        if stop.is_cancelled() {
            break;
        }
        // The window only matters to puts; the sweep reads each record's own expiry.
        let records = Idempotency::new(layout, &queue, Duration::ZERO);
        let zk = zk.with_deadline(Instant::now() + request_timeout);
        if let Err(err) = records.sweep(&zk, &mut swept).await {
            tracing::debug!(queue = %queue, error = %err, "sweep of the idempotency records of a queue not open here failed");
        }
    }
    Ok(swept)
}
