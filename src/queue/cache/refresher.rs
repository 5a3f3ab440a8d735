//! The refresher: the one task per queue that talks to ZooKeeper for the cache, and the lock
//! watches.
//!
//! It owns every read and watch so that takers never read the child list themselves: the list is
//! read once per (re)connection and once a minute, and between reads a persistent recursive
//! watch on the queue node keeps the state current. The client crate does not re-register
//! persistent watches after a reconnect, so they are added again on every connection, before
//! the read.
//!
//! The lock directory is watched as a tree only for a grouped queue, whose locked head holds its
//! group. Elsewhere a lease would cost every watching sidecar three more events (the lock's
//! creation, its write, its deletion) for nothing its takers need: a lock listed by a read gets
//! a watch of its own, so its item is offered again once it goes; a lock a claim meets gets one
//! too; and the claim of a candidate taken after another member's grace reads the lock first
//! (`acquire/claim.rs`), so a lease held past the grace costs a read, not a failed transaction.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ChildrenCache;
use super::state::Snapshot;
use crate::queue::catalog::Presence;
use crate::queue::names::ItemName;
use crate::types::now_epoch_ms;
use crate::zk::{ConnectionState, TreeEvent, WatchEvent, Zk, ZkError, ZkSession, ZkTreeWatch};

/// A one-shot watch on the queue node, kept until it fires.
type NodeWatch = std::pin::Pin<Box<dyn std::future::Future<Output = WatchEvent> + Send>>;

/// One full read: the queue's children, its node's stat, its locks, what its node says.
type FullRead = (Vec<String>, crate::zk::NodeStat, Vec<String>, Presence);

/// What the refresher keeps from one pass of its loop to the next.
#[derive(Default)]
struct Pass {
    /// The session generation for which the queue's directories were made.
    ensured_generation: u64,
    /// The one-shot watch on the queue node's own data while nobody here needs the queue.
    node_watch: Option<NodeWatch>,
    /// When the size of an unwatched queue is read next.
    parked_read_at: Option<Instant>,
}

/// How a pass of the refresher ended.
enum Flow {
    /// Watch (or park) and read again.
    Next,
    /// zkq shuts down, or the session is closed for good.
    Stop,
}

/// How often a live cache re-reads its child list anyway, in case an event was ever missed.
const RESYNC_EVERY: Duration = Duration::from_secs(60);
/// The shortest time between two reads of the child list of a queue this process does not
/// watch, when a scrape asks for one sooner ([`super::ChildrenCache::ask_reread`]).
const UNWATCHED_READ_GAP: Duration = Duration::from_secs(5);

/// The name of a direct child of `dir` from a full path below it.
fn child_of<'a>(dir: &str, path: &'a str) -> Option<&'a str> {
    let name = path.strip_prefix(dir)?.strip_prefix('/')?;
    (!name.is_empty() && !name.contains('/')).then_some(name)
}

impl ChildrenCache {
    /// Watches the lock a consumer holds on `item` and offers the item again once the lock is
    /// gone (released, or its session ended). One watch per locked item, however many takers.
    pub(crate) fn watch_lock(self: &Arc<Self>, zk: &Zk, item: ItemName, lock_dir: Option<&str>) {
        let Some(lock_dir) = lock_dir else { return };
        if !self.lock().watch_lock(&item.name) {
            return;
        }
        let lock = format!("{lock_dir}/{}", item.name);
        let owner = format!("queue {}", self.label);
        let (cache, zk) = (self.clone(), zk.clone());
        self.tasks.spawn(crate::supervise::until_done(
            crate::supervise::Task::LockWatcher,
            owner,
            self.metrics.clone(),
            self.shutdown.clone(),
            move || cache.clone().await_lock_release(zk.clone(), lock.clone(), item.clone()),
        ));
    }

    /// One run of a lock watch: waits until `lock` is gone, then offers `item` again. A restart
    /// after a panic starts over with a fresh read, so no release is missed.
    async fn await_lock_release(self: Arc<Self>, zk: Zk, lock: String, item: ItemName) {
        let released = async {
            loop {
                let zk = zk.with_deadline(Instant::now() + Duration::from_secs(10));
                match zk.watch_exists(&lock).await {
                    Ok((Some(_), watch)) => {
                        if watch.changed().await == WatchEvent::SessionEnded {
                            return;
                        }
                    },
                    Ok((None, _)) | Err(_) => return,
                }
            }
        };
        tokio::select! {
            _ = self.shutdown.cancelled() => return,
            _ = released => {},
        }
        self.lock().lock_watch_ended(&item.name);
        self.reoffer(item);
    }

    /// Watches each lock the last read listed that is not watched yet, where the lock directory's
    /// events are not followed: its item is offered again once the lock goes.
    fn watch_read_locks(self: &Arc<Self>, zk: &Zk, lock_dir: Option<&str>) {
        if lock_dir.is_none() {
            return;
        }
        let items = self.lock().locks_to_watch();
        for item in items {
            self.watch_lock(zk, item, lock_dir);
        }
    }

    /// Notes a refresh attempt that ZooKeeper refused for good (not a connection problem).
    fn refused(&self, err: &ZkError) {
        if err.is_transient() || *err == ZkError::NoNode {
            return;
        }
        self.lock().refused(err.clone());
        self.refusals.send_modify(|n| *n += 1);
    }

    /// Runs the barriers asked for so far as one: `sync`, then the events queued before its
    /// answer. Returns false when it failed (the `sync` failed, or the connection was lost before
    /// the events were applied): the barrier is then asked for again
    /// ([`super::waiters::Barriers::failed`]), and the refresher runs it again once the session
    /// is back (after watching and reading again when the connection was lost), as long as a
    /// caller still waits for it (503 only at their deadline).
    async fn run_barrier(
        &self,
        zk: &Zk,
        queue_watch: &mut ZkTreeWatch,
        locks: Option<(&str, &mut ZkTreeWatch)>,
    ) -> bool {
        let Some(want) = self.barriers.start() else { return true };
        let finished = self.barrier_steps(zk, queue_watch, locks).await;
        if finished {
            self.barriers.finish(want);
        } else {
            self.barriers.failed();
        }
        finished
    }

    async fn barrier_steps(
        &self,
        zk: &Zk,
        queue_watch: &mut ZkTreeWatch,
        locks: Option<(&str, &mut ZkTreeWatch)>,
    ) -> bool {
        if let Err(err) = zk.sync(&self.path).await {
            tracing::debug!(queue = %self.label, error = %err, "barrier sync failed; asked again once reconnected");
            return false;
        }
        if !self.apply_received(queue_watch) {
            return false;
        }
        if let Some((dir, watch)) = locks {
            while let Some(event) = watch.ready() {
                if event == TreeEvent::ConnectionLost {
                    self.invalidate();
                    return false;
                }
                self.on_lock_event(dir, &event);
            }
        }
        true
    }

    /// Applies the queue's events received so far, then lets the items put here join the
    /// candidates: their puts' answers came after those events. False when the connection was
    /// lost (the snapshot is invalidated).
    fn apply_received(&self, queue_watch: &mut ZkTreeWatch) -> bool {
        while let Some(event) = queue_watch.ready() {
            if event == TreeEvent::ConnectionLost {
                self.invalidate();
                return false;
            }
            self.on_queue_event(&event);
        }
        self.settle_local();
        true
    }

    pub(super) fn next_due(&self) -> Option<Instant> {
        self.lock().next_due()
    }

    /// Replaces the snapshot with a full read. `locks` (the lock directory's children) is given
    /// when the tree watches are live: from then on events keep the snapshot current.
    pub(super) fn apply_snapshot(&self, children: Vec<String>, num_children: i32, locks: Option<Vec<String>>) {
        let now = now_epoch_ms();
        let live = locks.is_some();
        let locked: HashSet<String> = locks.unwrap_or_default().into_iter().collect();
        // Parsed under the lock, sorted outside it.
        let (kind, items) = {
            let state = self.lock();
            (state.kind(), state.offerable(&children, &locked))
        };
        let snapshot = Snapshot::new(kind, items, children, num_children, locked, live, now);
        let mut state = self.lock();
        state.install(snapshot);
        self.publish_size(&mut state);
        drop(state);
        self.qm.children_reads.inc();
        self.room.notify_waiters();
        self.snapshots.send_modify(|n| *n += 1);
    }

    /// Applies one event of the queue node's tree watch.
    fn on_queue_event(&self, event: &TreeEvent) {
        self.qm.watch_events.inc();
        let mut state = self.lock();
        let effects = match event {
            TreeEvent::Created(path) => {
                let Some(name) = child_of(&self.path, path) else { return };
                state.child_created(name)
            },
            TreeEvent::Deleted(path) => {
                let Some(name) = child_of(&self.path, path) else { return };
                state.child_deleted(name)
            },
            TreeEvent::ConnectionLost | TreeEvent::DataChanged(_) | TreeEvent::Other => return,
        };
        self.apply(&mut state, effects);
        drop(state);
        if effects.room {
            self.room.notify_waiters();
        }
    }

    /// Applies one event of the lock directory's tree watch.
    fn on_lock_event(&self, lock_dir: &str, event: &TreeEvent) {
        self.qm.watch_events.inc();
        let mut state = self.lock();
        let effects = match event {
            TreeEvent::Created(path) => {
                let Some(name) = child_of(lock_dir, path) else { return };
                state.lock_created(name)
            },
            TreeEvent::Deleted(path) => {
                let Some(name) = child_of(lock_dir, path) else { return };
                state.lock_deleted(name)
            },
            TreeEvent::ConnectionLost | TreeEvent::DataChanged(_) | TreeEvent::Other => return,
        };
        self.apply(&mut state, effects);
    }

    fn invalidate(&self) {
        self.lock().invalidate();
    }

    /// The refresher: keeps the snapshot and the watch alive across reconnects and new sessions.
    ///
    /// It never creates the queue node: only a put does (a dynamic queue is created by its first
    /// put; a declared one is Curator's, or created by a put too). While the node does not exist
    /// (not created yet, deleted, or a Curator container ZooKeeper reaped once it emptied) the
    /// snapshot is empty and live: the tree watches, which ZooKeeper keeps on paths that do not
    /// exist, report the node and its children as they appear. Once per session, when the node
    /// exists, it ensures the lock directory, and on every new session the claim-marker directory
    /// (zkq's own, shared by every queue), so the first claim of a queue does not pay a failed
    /// transaction.
    pub(crate) async fn run(
        self: Arc<Self>,
        session: ZkSession,
        marker_dir: String,
        lock_dir: Option<String>,
        shutdown: CancellationToken,
    ) {
        let mut status_rx = session.subscribe();
        let dirs: Vec<String> = lock_dir.iter().cloned().collect();
        let watch_locks = self.lock().locks_watched();
        let mut pass = Pass::default();
        let mut markers_generation = 0;
        // A refusal repeats at every retry: log each distinct one once.
        let mut logged: Option<ZkError> = None;
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            let far = Instant::now() + Duration::from_secs(3600);
            let zk = tokio::select! {
                _ = shutdown.cancelled() => return,
                zk = session.connected(far) => zk,
            };
            let Ok(zk) = zk else {
                if session.status().state == ConnectionState::Closed {
                    return;
                }
                continue;
            };
            let epoch = session.status().epoch;
            // Creating it never brings a queue back: a failure here is paid by the first claim.
            if markers_generation != zk.generation() && zk.ensure_path(&marker_dir).await.is_ok() {
                markers_generation = zk.generation();
            }
            if !self.in_demand() {
                if let Flow::Stop =
                    self.park(&zk, &session, &mut pass, &mut status_rx, &shutdown, &dirs, lock_dir.as_deref()).await
                {
                    return;
                }
                continue;
            }
            pass.parked_read_at = None;
            // The watches first, then the reads: every change after a read arrives as an event,
            // and events already queued before it are harmless (they are applied idempotently).
            let watches = async {
                let queue_watch = zk.watch_tree(&self.path).await?;
                let lock_watch = match &lock_dir {
                    Some(dir) if watch_locks => Some(zk.watch_tree(dir).await?),
                    _ => None,
                };
                let read = self.read_children(&zk, lock_dir.as_deref()).await?;
                Ok::<_, ZkError>((queue_watch, lock_watch, read))
            };
            let (mut queue_watch, mut lock_watch) = match watches.await {
                Ok((queue_watch, lock_watch, read)) => {
                    if read.is_some() && pass.ensured_generation != zk.generation() {
                        match Self::ensure_dirs(&zk, &dirs).await {
                            Ok(()) => pass.ensured_generation = zk.generation(),
                            Err(err) => {
                                if logged.as_ref() != Some(&err) {
                                    tracing::warn!(queue = %self.label, error = %err, "cannot create the queue's lock or claim directory; will retry");
                                    logged = Some(err.clone());
                                }
                                self.refused(&err);
                                self.pause_until_status_change(&mut status_rx, &shutdown, Duration::from_secs(1)).await;
                                continue;
                            },
                        }
                    }
                    match &read {
                        Some((_, _, _, presence)) => self.set_presence(*presence),
                        None => self.set_presence(Presence::Absent),
                    }
                    // No queue node: nothing to deliver, and nothing here creates it.
                    let (children, num_children, locks) = read
                        .map_or((Vec::new(), 0, Vec::new()), |(children, stat, locks, _)| {
                            (children, stat.num_children, locks)
                        });
                    self.apply_snapshot(children, num_children, Some(locks));
                    self.watch_read_locks(&zk, lock_dir.as_deref());
                    if self.barriers.pending() {
                        // A barrier that failed (or was asked for while disconnected): run it now.
                        self.barriers.ask();
                    }
                    self.qm.watched.set(1);
                    (queue_watch, lock_watch)
                },
                Err(err) => {
                    if !err.is_transient() && logged.as_ref() != Some(&err) {
                        tracing::warn!(queue = %self.label, error = %err, "cannot read or watch the queue; will retry");
                        logged = Some(err.clone());
                    } else {
                        tracing::debug!(queue = %self.label, error = %err, "children read failed");
                    }
                    self.refused(&err);
                    self.pause_until_status_change(&mut status_rx, &shutdown, Duration::from_millis(200)).await;
                    continue;
                },
            };
            let watches = (&mut queue_watch, lock_watch.as_mut());
            let flow = self
                .follow(&zk, &session, epoch, &mut pass, watches, &mut status_rx, &shutdown, &dirs, lock_dir.as_deref())
                .await;
            if let Flow::Stop = flow {
                return;
            }
        }
    }

    /// One pass of the refresher while nobody here needs the queue: no watch on its children.
    #[allow(clippy::too_many_arguments, reason = "the refresher's fixed inputs, passed down from `run`")]
    async fn park(
        &self,
        zk: &Zk,
        session: &ZkSession,
        pass: &mut Pass,
        status_rx: &mut watch::Receiver<crate::zk::SessionStatus>,
        shutdown: &CancellationToken,
        dirs: &[String],
        lock_dir: Option<&str>,
    ) -> Flow {
        // Nobody here needs the queue: no watch on its children, so its messages cost
        // ZooKeeper nothing towards this sidecar. The first taker (or read) here brings
        // them back: watches, then one full read, before anyone is answered from the
        // cache. The node's own data (the catalog's mark) stays followed by one one-shot
        // watch, which fires only when the queue is deleted or made anew. That watch is
        // kept until it fires, never dropped unfired: dropping sends `RemoveWatches`,
        // which ZooKeeper before 3.9 applies to the persistent watches on the path too.
        self.invalidate();
        self.qm.watched.set(0);
        if let Some(watch) = pass.node_watch.as_mut()
            && futures::FutureExt::now_or_never(watch.as_mut()).is_some()
        {
            pass.node_watch = None;
        }
        let parked_zk = zk.with_deadline(Instant::now() + session.request_timeout());
        if pass.node_watch.is_none() {
            match self.follow_node(&parked_zk).await {
                Ok(watch) => pass.node_watch = Some(watch),
                Err(_) => {
                    // Unknown: requests ask ZooKeeper themselves until it is read.
                    self.forget_presence();
                    self.pause_until_status_change(status_rx, shutdown, Duration::from_millis(500)).await;
                    return Flow::Next;
                },
            }
        }
        // The queue's directories, once per session, as when watching; and its size
        // (for the child-list gauges and alerts) read once a minute, never offered.
        if self.presence() == Some(Presence::Live)
            && pass.ensured_generation != zk.generation()
            && Self::ensure_dirs(&parked_zk, dirs).await.is_ok()
        {
            pass.ensured_generation = zk.generation();
        }
        if pass.parked_read_at.is_none_or(|at| at <= Instant::now()) {
            if let Ok(read) = self.read_children(&parked_zk, lock_dir).await {
                let (children, num_children) = read.map_or((Vec::new(), 0), |(c, stat, _, _)| (c, stat.num_children));
                self.apply_snapshot(children, num_children, None);
                self.invalidate();
            }
            pass.parked_read_at = Some(Instant::now() + RESYNC_EVERY);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Flow::Stop,
            () = self.demand_changed() => {},
            _ = async { match pass.node_watch.as_mut() { Some(watch) => watch.as_mut().await, None => std::future::pending().await } } => {
                pass.node_watch = None;
            },
            _ = async { match pass.parked_read_at { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {},
            () = self.reread.notified() => {
                let soonest = pass.parked_read_at.map(|at| at - RESYNC_EVERY + UNWATCHED_READ_GAP);
                pass.parked_read_at = Some(soonest.map_or_else(Instant::now, |at| at.max(Instant::now())));
            },
        }
        Flow::Next
    }

    /// Keeps the snapshot current from the queue's events until a reason to watch and read
    /// again (`Flow::Next`: a lost connection, a new session, a stale snapshot, no demand here).
    #[allow(clippy::too_many_arguments, reason = "the refresher's fixed inputs, passed down from `run`")]
    async fn follow(
        self: &Arc<Self>,
        zk: &Zk,
        session: &ZkSession,
        epoch: u64,
        pass: &mut Pass,
        watches: (&mut ZkTreeWatch, Option<&mut ZkTreeWatch>),
        status_rx: &mut watch::Receiver<crate::zk::SessionStatus>,
        shutdown: &CancellationToken,
        dirs: &[String],
        lock_dir: Option<&str>,
    ) -> Flow {
        let (queue_watch, mut lock_watch) = watches;
        let mut resync_at = Instant::now() + RESYNC_EVERY;
        loop {
            let due = self.next_due();
            let unwatch_at = self.unwatch_at();
            let status_changed = async {
                loop {
                    if status_rx.changed().await.is_err() {
                        return;
                    }
                    let status = *status_rx.borrow_and_update();
                    if status.epoch != epoch || !status.state.is_connected() {
                        return;
                    }
                }
            };
            let lock_event = async {
                match lock_watch.as_mut() {
                    Some(watch) => watch.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return Flow::Stop,
                event = queue_watch.next() => {
                    if event == TreeEvent::ConnectionLost {
                        self.invalidate();
                        return Flow::Next;
                    }
                    if matches!(&event, TreeEvent::DataChanged(path) | TreeEvent::Created(path) if *path == self.path) {
                        // The queue's own node: the catalog's mark may have changed.
                        let zk = zk.with_deadline(Instant::now() + session.request_timeout());
                        match crate::queue::catalog::presence(&zk, &self.path).await {
                            Ok(presence) => self.set_presence(presence),
                            // Read again with the rest once the connection is back.
                            Err(_) => return Flow::Next,
                        }
                    }
                    if matches!(&event, TreeEvent::Deleted(path) if *path == self.path) {
                        self.set_presence(Presence::Absent);
                    }
                    if matches!(&event, TreeEvent::DataChanged(_)) {
                        continue;
                    }
                    if matches!(&event, TreeEvent::Created(path) if *path == self.path) {
                        // The queue node appeared (again). The watches were live all along, so
                        // its children arrive as events; its directories are made now.
                        if pass.ensured_generation != zk.generation() {
                            let zk = zk.with_deadline(Instant::now() + session.request_timeout());
                            if Self::ensure_dirs(&zk, dirs).await.is_ok() {
                                pass.ensured_generation = zk.generation();
                            }
                        }
                        continue;
                    }
                    self.on_queue_event(&event);
                },
                event = lock_event => {
                    if event == TreeEvent::ConnectionLost {
                        self.invalidate();
                        return Flow::Next;
                    }
                    // The item's own deletion (same transaction as an ack's lock delete) was
                    // sent first: apply it before deciding whether to offer the item again.
                    while let Some(queued) = queue_watch.ready() {
                        self.on_queue_event(&queued);
                    }
                    if let Some(dir) = lock_dir {
                        self.on_lock_event(dir, &event);
                    }
                },
                _ = self.barriers.asked() => {
                    let zk = zk.with_deadline(Instant::now() + session.request_timeout());
                    let locks = lock_dir.zip(lock_watch.as_deref_mut());
                    if !self.run_barrier(&zk, queue_watch, locks).await {
                        // Once the session is back (or after a pause), run it again: after
                        // watching and reading again if the connection was lost, else at once.
                        self.pause_until_status_change(status_rx, shutdown, Duration::from_millis(200)).await;
                        let status = session.status();
                        if status.epoch != epoch || !status.state.is_connected() || self.is_dirty() {
                            return Flow::Next;
                        }
                        if self.barriers.pending() {
                            self.barriers.ask();
                        }
                    }
                },
                _ = self.settle.notified() => {
                    if !self.apply_received(queue_watch) {
                        return Flow::Next;
                    }
                },
                _ = self.refresh.notified() => {
                    if self.is_dirty() {
                        return Flow::Next;
                    }
                    // Not dirty: the snapshot is current; count it as one anyway so the asker goes on.
                    self.snapshots.send_modify(|n| *n += 1);
                },
                _ = async { match due { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {
                    self.lock().fall_due();
                },
                // Nobody here needed the queue for a while: let go of its watches.
                _ = async { match unwatch_at { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {
                    if !self.in_demand() && self.unwatch_at().is_some_and(|at| at <= Instant::now()) {
                        tracing::debug!(queue = %self.label, "no demand here: the queue is no longer watched");
                        // ZooKeeper removes a persistent watch only with every watch of the
                        // path (ZOOKEEPER-4472): the client asks for that once this process
                        // holds none there, so the node's one-shot watch goes too (the parked
                        // loop sets it again). Else the server kept sending every event.
                        pass.node_watch = None;
                        return Flow::Next;
                    }
                },
                // A backstop: should an event ever be missed, a message is not stranded.
                _ = tokio::time::sleep_until(resync_at) => {
                    resync_at = Instant::now() + RESYNC_EVERY;
                    let zk = zk.with_deadline(Instant::now() + session.request_timeout());
                    match self.read_children(&zk, lock_dir).await {
                        Ok(Some((children, stat, locks, presence))) => {
                            self.set_presence(presence);
                            self.apply_snapshot(children, stat.num_children, Some(locks));
                            self.watch_read_locks(&zk, lock_dir);
                        },
                        Ok(None) => {
                            self.set_presence(Presence::Absent);
                            self.apply_snapshot(Vec::new(), 0, Some(Vec::new()));
                        },
                        Err(_) => {},
                    }
                },
                _ = status_changed => {
                    if !session.status().state.is_connected() {
                        self.invalidate();
                    }
                    return Flow::Next;
                },
            }
        }
    }

    /// Reads what the queue's node says (`queue::catalog`) with a one-shot watch that fires when
    /// its data changes, it is deleted, or (while it does not exist) it is created.
    async fn follow_node(&self, zk: &Zk) -> Result<NodeWatch, ZkError> {
        match zk.get_and_watch_data(&self.path).await {
            Ok((data, _, watch)) => {
                self.set_presence(Presence::of(Some(&data)));
                Ok(Box::pin(watch.changed()))
            },
            Err(ZkError::NoNode) => {
                let (stat, watch) = zk.watch_exists(&self.path).await?;
                // Made meanwhile: its data is read once this watch fires (now, for its creation).
                if stat.is_none() {
                    self.set_presence(Presence::Absent);
                }
                Ok(Box::pin(watch.changed()))
            },
            Err(err) => Err(err),
        }
    }

    /// Makes `dirs` (the lock directory, the claim-marker directory) where they are missing.
    async fn ensure_dirs(zk: &Zk, dirs: &[String]) -> Result<(), ZkError> {
        for dir in dirs {
            zk.ensure_path(dir).await?;
        }
        Ok(())
    }

    /// The queue node's children, the lock directory's (empty without one) and what the node's
    /// data says of the queue (`queue::catalog`); `None` when the queue node does not exist.
    async fn read_children(&self, zk: &Zk, lock_dir: Option<&str>) -> Result<Option<FullRead>, ZkError> {
        let (children, stat) = match zk.get_children(&self.path).await {
            Ok(read) => read,
            Err(ZkError::NoNode) => return Ok(None),
            Err(err) => return Err(err),
        };
        // Only data of the mark's length can be the mark: most nodes need no read.
        let presence = if usize::try_from(stat.data_length).ok() == Some(crate::queue::catalog::DELETED_MARK.len()) {
            crate::queue::catalog::presence(zk, &self.path).await?
        } else {
            Presence::Live
        };
        let locks = match lock_dir {
            Some(dir) => match zk.get_children(dir).await {
                Ok((locks, _)) => locks,
                Err(ZkError::NoNode) => Vec::new(),
                Err(err) => return Err(err),
            },
            None => Vec::new(),
        };
        Ok(Some((children, stat, locks, presence)))
    }

    async fn pause_until_status_change(
        &self,
        status_rx: &mut watch::Receiver<crate::zk::SessionStatus>,
        shutdown: &CancellationToken,
        at_most: Duration,
    ) {
        tokio::select! {
            _ = shutdown.cancelled() => {},
            _ = status_rx.changed() => {},
            _ = tokio::time::sleep(at_most) => {},
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{far, fifo_names, test_cache};
    use super::*;
    use crate::config::QueueKind;

    #[tokio::test(start_paused = true)]
    async fn an_item_this_process_released_is_the_head_again_before_the_lock_event_says_so() {
        let cache = test_cache(QueueKind::Fifo);
        cache.apply_snapshot(fifo_names(0..3), 3, Some(Vec::new()));
        let head = cache.pop(far()).expect("the head");
        assert_eq!(head.sequence, 0);
        cache.claim_ended(&head.name);
        // The lock this process created is seen; it deletes it (a release) and offers the item at
        // once, while the event of the lock's deletion is still on its way.
        cache.on_lock_event("/locks", &TreeEvent::Created("/locks/queue-0000000000".into()));
        cache.released_local(head);
        assert_eq!(cache.pop(far()).map(|i| i.sequence), Some(0), "a single consumer does not overtake it");
        // The late deletion event does not offer it twice.
        cache.on_lock_event("/locks", &TreeEvent::Deleted("/locks/queue-0000000000".into()));
        assert_eq!(cache.pop(far()).map(|i| i.sequence), Some(1));
        assert_eq!(cache.pop(far()).map(|i| i.sequence), Some(2));
        assert_eq!(cache.pop(far()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn events_prune_candidates_others_took_or_locked_and_offer_released_ones_again() {
        let cache = test_cache(QueueKind::Fifo);
        cache.apply_snapshot(fifo_names(0..4), 4, Some(Vec::new()));
        let drain = |c: &ChildrenCache| {
            let mut got: Vec<i64> = std::iter::from_fn(|| c.pop(far()).map(|i| i.sequence)).collect();
            got.sort_unstable();
            got
        };
        // Another consumer took item 0 and locks item 1: neither is tried.
        cache.on_queue_event(&TreeEvent::Deleted("/q/queue-0000000000".into()));
        cache.on_lock_event("/locks", &TreeEvent::Created("/locks/queue-0000000001".into()));
        assert_eq!(drain(&cache), [2, 3]);
        // Its lock released, item 1 is offered again; a new item shows up without a re-read.
        cache.on_lock_event("/locks", &TreeEvent::Deleted("/locks/queue-0000000001".into()));
        cache.on_queue_event(&TreeEvent::Created("/q/queue-0000000009".into()));
        assert_eq!(drain(&cache), [1, 9]);
        assert_eq!(cache.child_count(), 4, "0 deleted, 9 created");
    }
}
