//! Background work of the leases of one queue: the reaper (visibility timeouts, delayed nacks,
//! leases of lost sessions) and the delivery-count sweeper. Both are owned by the queue
//! service's task tracker and end at shutdown.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::super::catalog::Presence;
use super::super::names;
use super::super::{QueueError, envelope};
use super::Leases;
use super::{Step, due_leases};

/// How often the reaper tries to settle leases of a lost session while ZooKeeper cannot say.
const SETTLE_EVERY: Duration = Duration::from_secs(1);
use crate::zk::{Zk, ZkError, ZkSession};

impl Leases {
    /// Expires leases whose visibility passed, and forgets leases of a lost session.
    pub(in crate::queue) async fn run_lease_reaper(self: Arc<Self>, session: ZkSession, shutdown: CancellationToken) {
        let mut status = session.subscribe();
        let mut presence = self.cache.presence_changes();
        loop {
            let next = {
                let state = self.table.lock();
                let now = Instant::now();
                // A lease already due wakes the reaper at once; otherwise the next expiry does,
                // or, while leases of a lost session wait to be settled, a second.
                let next = match due_leases(state.live.iter().map(|(t, l)| (*t, l.expires_at)), now) {
                    (due, _) if !due.is_empty() => Some(now),
                    (_, next) => next,
                };
                match (state.settling.is_empty(), next) {
                    (true, next) => next,
                    (false, next) => Some(next.map_or(now + SETTLE_EVERY, |at| at.min(now + SETTLE_EVERY))),
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.table.changed.notified() => continue,
                changed = status.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let generation = status.borrow_and_update().generation;
                    self.forget_older_sessions(generation);
                    continue;
                },
                changed = presence.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let now = *presence.borrow_and_update();
                    if matches!(now, Some(Presence::Deleted)) {
                        self.forget_deleted().await;
                    }
                    continue;
                },
                _ = async { match next { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {},
            }
            // Leases of a lost session: stop at the first that ZooKeeper cannot settle yet (the
            // others would wait as long), and try again in a second.
            let settling: Vec<u128> = self.table.lock().settling.keys().copied().collect();
            for token in settling {
                if !self.settle(token, Instant::now() + self.ctx.session.request_timeout()).await {
                    break;
                }
            }
            let now = Instant::now();
            let due = {
                let state = self.table.lock();
                due_leases(state.live.iter().map(|(t, l)| (*t, l.expires_at)), now).0
            };
            for token in due {
                match self.run_step(token, Step::Expire).await {
                    Ok(()) | Err(QueueError::LeaseLost(_)) => {},
                    Err(err) => {
                        // No ZooKeeper now: keep the lease (its receipt is spent) and try again soon.
                        tracing::debug!(queue = %self.ctx.name, error = %err, "could not release an expired lease; retrying");
                        self.update_lease(token, |lease| lease.expires_at = Instant::now() + Duration::from_secs(1));
                    },
                }
            }
        }
    }

    /// Moves undecodable `queue-` nodes to the dead-letter queue as soon as a snapshot shows
    /// them (the cache of a queue with a dead-letter queue re-reads on every change): one read
    /// of each node this process did not put itself, no client request needed.
    pub(in crate::queue) async fn run_undecodable_mover(self: Arc<Self>, shutdown: CancellationToken) {
        let Some(target) = self.ctx.dead_letter.clone() else { return };
        let mut snapshots = self.cache.subscribe_snapshots();
        let mut pending: Vec<String> = Vec::new();
        loop {
            pending.extend(self.cache.take_unchecked());
            if pending.is_empty() {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    changed = snapshots.changed() => if changed.is_err() { return },
                }
                continue;
            }
            let Some(zk) = self.ctx.session.current() else {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {},
                }
                continue;
            };
            let zk = zk.with_deadline(Instant::now() + self.ctx.session.request_timeout());
            while let Some(name) = pending.pop() {
                let Some(item) = names::parse(self.ctx.naming, &name) else { continue };
                let (data, stat) = match zk.get_data(&format!("{}/{}", self.ctx.path, name)).await {
                    Ok(found) => found,
                    Err(ZkError::NoNode) => continue,
                    Err(_) => {
                        pending.push(name); // no ZooKeeper now: try again with the next session
                        break;
                    },
                };
                if envelope::decode(&data).is_ok_and(|items| !items.is_empty()) {
                    continue;
                }
                let counter = self.counter_path(&name);
                if let Err(err) = self.dead_letter(&zk, &item, &data, stat.version, Some(&counter), &target).await {
                    tracing::debug!(queue = %self.ctx.name, node = %name, error = %err,
                        "could not move an undecodable node to the dead-letter queue; a lease will");
                }
            }
            if !pending.is_empty() {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {},
                }
            }
        }
    }

    /// Forgets the leases of sessions older than `generation`: their locks are gone. A lease
    /// whose last step's answer was lost is kept to be settled by that step's claim marker.
    fn forget_older_sessions(&self, generation: u64) {
        let mut state = self.table.lock();
        let stale: Vec<u128> =
            state.live.iter().filter(|(_, lease)| lease.zk.generation() < generation).map(|(t, _)| *t).collect();
        for token in &stale {
            if let Some(lease) = state.live.remove(token)
                && lease.unresolved.as_ref().is_some_and(|u| u.marker.is_some())
            {
                state.settling.insert(*token, lease);
            }
        }
        let stale = stale.len();
        drop(state);
        if stale > 0 {
            self.ctx.qm.leases_in_flight.sub(i64::try_from(stale).unwrap_or(0));
            tracing::warn!(queue = %self.ctx.name, leases = stale, "session lost: its leases are void");
        }
    }

    /// Ends the leases of a queue seen deleted (on any sidecar) whose messages went with it: a
    /// receipt of one then answers that the lease is no longer held. Nothing is written, and
    /// only evidence ends a lease: one whose message node still exists is kept. No name of a
    /// deleted incarnation is ever one of a later one (`queue::catalog`), so an existing node of
    /// a lease's name is its own message: leased after the queue was made anew (the mark seen
    /// here may be older than the put that revived the queue), or not yet removed by a delete
    /// still running, which then removes it and its lock.
    async fn forget_deleted(&self) {
        let Some(zk) = self.ctx.session.current() else { return };
        let zk = zk.with_deadline(Instant::now() + self.ctx.session.request_timeout());
        let leased: Vec<(u128, String)> = {
            let state = self.table.lock();
            state.live.iter().map(|(token, lease)| (*token, format!("{}/{}", self.ctx.path, lease.item.name))).collect()
        };
        if leased.is_empty() {
            return;
        }
        zk.sync(&self.ctx.path).await.ok();
        let mut ended = 0usize;
        for (token, path) in leased {
            // A failed read proves nothing: the lease stays, to expire or be settled as any.
            if let Ok(None) = zk.exists(&path).await
                && self.table.lock().live.remove(&token).is_some()
            {
                ended += 1;
            }
        }
        if ended > 0 {
            self.ctx.qm.leases_in_flight.sub(i64::try_from(ended).unwrap_or(0));
            tracing::info!(queue = %self.ctx.name, leases = ended, "queue deleted: its leases ended");
        }
        self.table.changed.notify_waiters();
    }

    /// Removes delivery counts whose message is gone: once when the queue opens, then every minute.
    pub(in crate::queue) async fn run_delivery_count_sweeper(self: Arc<Self>, shutdown: CancellationToken) {
        let queue = &self;
        self.ctx
            .session
            .periodically(Duration::from_secs(60), &shutdown, |zk| async move {
                match queue.sweep_delivery_counts(&zk).await {
                    Ok(0) => {},
                    Ok(n) => tracing::debug!(queue = %queue.ctx.name, removed = n, "removed stale delivery counts"),
                    Err(err) => tracing::debug!(queue = %queue.ctx.name, error = %err, "delivery count sweep failed"),
                }
            })
            .await;
    }

    /// Delivery counts whose message is gone (consumed by Curator, removed by hand) are removed,
    /// so nothing accumulates.
    async fn sweep_delivery_counts(&self, zk: &Zk) -> Result<usize, ZkError> {
        let counted = match zk.get_children(&self.ctx.deliveries_path).await {
            Ok((children, _)) => children,
            Err(ZkError::NoNode) => return Ok(0),
            Err(err) => return Err(err),
        };
        let held: HashSet<String> = self.table.lock().live.values().map(|l| l.item.name.clone()).collect();
        let mut removed = 0;
        for name in counted {
            if held.contains(&name) {
                continue;
            }
            if zk.exists(&format!("{}/{}", self.ctx.path, name)).await?.is_none()
                && zk.delete(&self.counter_path(&name), None).await.is_ok()
            {
                removed += 1;
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{counter_bytes, read_counter};

    #[test]
    fn delivery_counts_are_big_endian() {
        assert_eq!(counter_bytes(258), vec![0, 0, 1, 2]);
        assert_eq!(read_counter(&[0, 0, 1, 2]), 258);
        assert_eq!(read_counter(&[1]), 0);
    }
}
