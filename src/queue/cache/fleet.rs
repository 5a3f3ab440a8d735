//! This process's membership in a queue's fleet: the sidecars that take from it now.
//!
//! While a taker waits here (and for [`MEMBER_LINGER`] after the last), this process holds one
//! ephemeral node, named by its session id, in the queue's members directory
//! (`{root}/members/{queue}`), and follows the directory with one persistent watch. Every member
//! thus sees the same members, and `state/owners.rs` decides from them which member claims each
//! candidate first. The directory changes only when a sidecar starts or stops taking from the
//! queue (or its session ends), never per message: it costs ZooKeeper O(membership changes). A
//! member that dies keeps its node until its session expires; meanwhile the next member in each
//! of its candidates' order claims them after one grace.
//!
//! Nothing here is needed for correctness: without a view (not connected, not registered yet,
//! or alone) this process claims every candidate at once, as a lone sidecar does.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ChildrenCache;
use super::state::Fleet;
use crate::zk::{ConnectionState, NodeMode, TreeEvent, Zk, ZkError, ZkSession, ZkTreeWatch};

/// How long this process stays a member after its last taker left: a consumer's loop of
/// long-polls keeps one membership, not one per request.
pub(super) const MEMBER_LINGER: Duration = Duration::from_secs(10);

/// Held by a taker while it waits in the acquire loop (see [`ChildrenCache::taking`]).
pub(crate) struct Taking<'a>(&'a ChildrenCache);

impl Drop for Taking<'_> {
    fn drop(&mut self) {
        self.0.takers.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Why a membership ended.
enum Left {
    /// No taker for [`MEMBER_LINGER`]: wait for the next one.
    Idle,
    /// The connection or the session changed, or a call failed: join again.
    Rejoin,
    Shutdown,
}

impl ChildrenCache {
    /// Counts a taker of this process until the guard drops: while any is counted (and for
    /// [`MEMBER_LINGER`] after), this process is a member of the queue's fleet.
    pub(crate) fn taking(&self) -> Taking<'_> {
        self.takers.send_modify(|n| *n += 1);
        Taking(self)
    }

    /// What the members are now, as this process (`me`) sees them.
    fn see_fleet(&self, me: &str, members: &BTreeSet<String>) {
        let fleet = Fleet::new(me, members.iter().cloned().collect());
        self.set_fleet(fleet);
    }

    pub(super) fn set_fleet(&self, fleet: Option<Fleet>) {
        let mut state = self.lock();
        state.set_fleet(fleet);
        self.qm.fleet_members.set(i64::try_from(state.fleet_size()).unwrap_or(i64::MAX));
        drop(state);
        // Deferred candidates have new dues: the refresher re-arms its timer.
        self.refresh.notify_one();
    }

    /// The membership task of one queue: joins the fleet while this process has takers there,
    /// leaves it [`MEMBER_LINGER`] after the last, and joins again on every new connection.
    pub(crate) async fn run_membership(self: Arc<Self>, session: ZkSession, dir: String, shutdown: CancellationToken) {
        let mut takers = self.takers.subscribe();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                waited = takers.wait_for(|n| *n > 0) => if waited.is_err() { return },
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
            let left = self.member(&session, &zk, &dir, &mut takers, &shutdown).await;
            self.set_fleet(None);
            match left {
                Left::Shutdown => return,
                Left::Idle => {},
                Left::Rejoin => {
                    let mut status = session.subscribe();
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = status.changed() => {},
                        _ = tokio::time::sleep(Duration::from_millis(500)) => {},
                    }
                },
            }
        }
    }

    /// One membership on one connection: registers, follows the members, and leaves when no
    /// taker came for [`MEMBER_LINGER`] (deleting its node) or the connection changed.
    async fn member(
        &self,
        session: &ZkSession,
        zk: &Zk,
        dir: &str,
        takers: &mut tokio::sync::watch::Receiver<usize>,
        shutdown: &CancellationToken,
    ) -> Left {
        let epoch = session.status().epoch;
        let me = format!("{:016x}", zk.session_id());
        let node = format!("{dir}/{me}");
        let call = || zk.with_deadline(Instant::now() + session.request_timeout());
        // The watch first, then the node, then the read: every change after the read arrives
        // as an event.
        let joined = async {
            let watch = call().watch_tree(dir).await?;
            Self::register(&call(), dir, &node).await?;
            let (children, _) = call().get_children(dir).await?;
            Ok::<(ZkTreeWatch, Vec<String>), ZkError>((watch, children))
        };
        let (mut watch, children) = match joined.await {
            Ok(joined) => joined,
            Err(err) => {
                tracing::debug!(queue = %self.label, error = %err, "cannot join the queue's fleet; will retry");
                return Left::Rejoin;
            },
        };
        let mut members: BTreeSet<String> = children.into_iter().collect();
        self.see_fleet(&me, &members);
        let mut status_rx = session.subscribe();
        let mut idle_since: Option<Instant> = None;
        loop {
            if *takers.borrow_and_update() > 0 {
                idle_since = None;
            } else if idle_since.is_none() {
                idle_since = Some(Instant::now());
            }
            let leave_at = idle_since.map(|since| since + MEMBER_LINGER);
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
            tokio::select! {
                _ = shutdown.cancelled() => return Left::Shutdown,
                event = watch.next() => {
                    let (created, path) = match event {
                        TreeEvent::Created(path) => (true, path),
                        TreeEvent::Deleted(path) => (false, path),
                        TreeEvent::ConnectionLost => return Left::Rejoin,
                        TreeEvent::DataChanged(_) | TreeEvent::Other => continue,
                    };
                    let Some(name) = path.strip_prefix(dir).and_then(|p| p.strip_prefix('/')) else { continue };
                    if name.is_empty() || name.contains('/') {
                        continue;
                    }
                    if created {
                        members.insert(name.to_owned());
                    } else {
                        members.remove(name);
                        if name == me {
                            // Deleted by someone else while this process still takes: again.
                            if let Err(err) = Self::register(&call(), dir, &node).await {
                                tracing::debug!(queue = %self.label, error = %err, "cannot rejoin the queue's fleet");
                                return Left::Rejoin;
                            }
                        }
                    }
                    self.see_fleet(&me, &members);
                },
                changed = takers.changed() => if changed.is_err() { return Left::Shutdown },
                _ = async { match leave_at { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {
                    // No taker here for a while: leave, so no message waits for this process.
                    self.set_fleet(None);
                    if let Err(err) = call().delete(&node, None).await
                        && err != ZkError::NoNode
                    {
                        // Its session's end removes it; until then others claim its share after a grace.
                        tracing::debug!(queue = %self.label, error = %err, "cannot leave the queue's fleet");
                        return Left::Rejoin;
                    }
                    return Left::Idle;
                },
                _ = status_changed => return Left::Rejoin,
            }
        }
    }

    /// Creates this process's ephemeral member node (and the directory, a container ZooKeeper
    /// removes once the last member left); an existing node is this session's own.
    async fn register(zk: &Zk, dir: &str, node: &str) -> Result<(), ZkError> {
        match zk.create(node, b"", NodeMode::Ephemeral).await {
            Ok(_) | Err(ZkError::NodeExists) => Ok(()),
            Err(ZkError::NoNode) => {
                zk.ensure_path_as(dir, NodeMode::Container).await?;
                match zk.create(node, b"", NodeMode::Ephemeral).await {
                    Ok(_) | Err(ZkError::NodeExists) => Ok(()),
                    Err(err) => Err(err),
                }
            },
            Err(err) => Err(err),
        }
    }
}
