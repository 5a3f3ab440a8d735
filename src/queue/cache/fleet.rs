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

/// A member's call for help is its ephemeral node `help-{session}` beside the members' nodes.
const HELP_PREFIX: &str = "help-";

/// How often a watching member looks at its own candidates: found at two looks in a row, they
/// are a backlog its takers do not keep up with, and the member asks the fleet for help (every
/// member then watches the queue and owns a share of it).
pub(super) const HELP_AFTER: Duration = Duration::from_secs(1);

/// How long a call for help stays after the last look that found a message waiting.
pub(super) const HELP_LINGER: Duration = Duration::from_secs(5);

/// The members directory as this process follows it.
#[derive(Debug, Default)]
struct Directory {
    /// The members' session ids.
    members: BTreeSet<String>,
    /// The session ids of the members that ask for help.
    asking: BTreeSet<String>,
}

impl Directory {
    /// Applies a child's creation or deletion; false for a name that is neither a member nor a
    /// call for help.
    fn apply(&mut self, name: &str, created: bool) -> bool {
        if name.is_empty() || name.contains('/') {
            return false;
        }
        let (set, id) = match name.strip_prefix(HELP_PREFIX) {
            Some(id) => (&mut self.asking, id),
            None => (&mut self.members, name),
        };
        if id.is_empty() {
            return false;
        }
        if created {
            set.insert(id.to_owned());
        } else {
            set.remove(id);
        }
        true
    }
}

/// What a look at the front of the candidates asks this member to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Ask,
    End,
}

/// Whether this member asks for help, from looks at its own candidates.
#[derive(Debug)]
struct Help {
    asking: bool,
    /// Whether the last look found a candidate this member owns waiting.
    waiting_before: bool,
    /// Since when no look found one, while asking.
    quiet_since: Option<Instant>,
}

impl Help {
    fn new(asking: bool) -> Help {
        Help { asking, waiting_before: false, quiet_since: None }
    }

    /// One look (`None`: this member does not look now; else whether a candidate it owns waits
    /// unclaimed): a call to make or to end. Candidates of its own at two looks in a row mean
    /// its takers are all busy, or gone, while messages come: a backlog.
    fn look(&mut self, waiting: Option<bool>) -> Option<Step> {
        let waiting = waiting.unwrap_or(false);
        let backlog = waiting && self.waiting_before;
        self.waiting_before = waiting;
        if backlog {
            self.quiet_since = None;
            return (!self.asking).then_some(Step::Ask);
        }
        if !self.asking {
            return None;
        }
        let since = *self.quiet_since.get_or_insert_with(Instant::now);
        (since.elapsed() >= HELP_LINGER).then(|| {
            self.quiet_since = None;
            Step::End
        })
    }
}

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

    /// What the members are now, as this process (`me`) sees them, with the members that ask
    /// for help (then every member watches).
    fn see_fleet(&self, me: &str, dir: &Directory) {
        let watchers = if dir.asking.is_empty() { self.watchers } else { 0 };
        let fleet = Fleet::watched_by(me, dir.members.iter().cloned().collect(), &self.path, watchers);
        self.set_fleet(fleet);
    }

    pub(super) fn set_fleet(&self, fleet: Option<Fleet>) {
        let mut state = self.lock();
        state.set_fleet(fleet);
        self.qm.fleet_members.set(i64::try_from(state.fleet_size()).unwrap_or(i64::MAX));
        let standby = state.stands_by();
        self.qm.fleet_standby.set(i64::from(standby));
        drop(state);
        {
            let mut since = self.standby_since.lock().unwrap_or_else(|p| p.into_inner());
            if !standby {
                *since = None;
            } else if since.is_none() {
                *since = Some(Instant::now());
            }
        }
        self.standby.send_if_modified(|now| std::mem::replace(now, standby) != standby);
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

    /// One membership on one connection: registers, follows the members, asks for help while a
    /// message waits here unclaimed, and leaves when no taker came for [`MEMBER_LINGER`]
    /// (deleting its nodes) or the connection changed.
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
        let help_node = format!("{dir}/{HELP_PREFIX}{me}");
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
        let mut directory = Directory::default();
        for child in &children {
            directory.apply(child, true);
        }
        self.see_fleet(&me, &directory);
        let mut help = Help::new(directory.asking.contains(&me));
        let mut looks = tokio::time::interval(HELP_AFTER);
        looks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
                    if !directory.apply(name, created) {
                        continue;
                    }
                    if !created && name == me {
                        // Deleted by someone else while this process still takes: again.
                        if let Err(err) = Self::register(&call(), dir, &node).await {
                            tracing::debug!(queue = %self.label, error = %err, "cannot rejoin the queue's fleet");
                            return Left::Rejoin;
                        }
                        directory.apply(name, true);
                    }
                    if !created && name.strip_prefix(HELP_PREFIX) == Some(me.as_str()) {
                        help.asking = false;
                    }
                    self.see_fleet(&me, &directory);
                },
                _ = looks.tick(), if self.watchers > 0 => {
                    // A member that watches while others stand by looks; so does one asking.
                    let waiting = {
                        let state = self.lock();
                        let looking = help.asking || (state.fleet_has_standby() && !state.stands_by());
                        looking.then(|| state.owns_candidates())
                    };
                    match help.look(waiting) {
                        Some(Step::Ask) => match call().create(&help_node, b"", NodeMode::Ephemeral).await {
                            Ok(_) | Err(ZkError::NodeExists) => {
                                tracing::debug!(queue = %self.label, "messages this process owns wait unclaimed: the fleet is asked for help");
                                self.qm.help_calls.inc();
                                help.asking = true;
                            },
                            // Asked again at the next look.
                            Err(err) => tracing::debug!(queue = %self.label, error = %err, "cannot ask the fleet for help"),
                        },
                        Some(Step::End) => match call().delete(&help_node, None).await {
                            Ok(()) | Err(ZkError::NoNode) => help.asking = false,
                            Err(err) => tracing::debug!(queue = %self.label, error = %err, "cannot end the call for help"),
                        },
                        None => {},
                    }
                },
                changed = takers.changed() => if changed.is_err() { return Left::Shutdown },
                _ = async { match leave_at { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {
                    // No taker here for a while: leave, so no message waits for this process.
                    self.set_fleet(None);
                    let mut gone = call().delete(&node, None).await;
                    if help.asking && matches!(gone, Ok(()) | Err(ZkError::NoNode)) {
                        gone = call().delete(&help_node, None).await;
                    }
                    if let Err(err) = gone
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_tells_members_from_calls_for_help() {
        let mut dir = Directory::default();
        for name in ["00000000000000a1", "help-00000000000000a1", "00000000000000b2", "help-", "", "x/y"] {
            dir.apply(name, true);
        }
        assert_eq!(
            dir.members.iter().map(String::as_str).collect::<Vec<_>>(),
            ["00000000000000a1", "00000000000000b2"]
        );
        assert_eq!(dir.asking.iter().map(String::as_str).collect::<Vec<_>>(), ["00000000000000a1"]);
        assert!(dir.apply("help-00000000000000a1", false));
        assert!(dir.asking.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn help_is_asked_when_own_candidates_wait_at_two_looks_and_ended_once_none_did_for_a_while() {
        let mut help = Help::new(false);
        assert_eq!(help.look(Some(true)), None, "waiting once: it may just have come");
        assert_eq!(help.look(Some(false)), None, "claimed meanwhile");
        assert_eq!(help.look(Some(true)), None);
        assert_eq!(help.look(Some(true)), Some(Step::Ask), "waiting at two looks in a row: a backlog");
        help.asking = true;
        assert_eq!(help.look(Some(false)), None, "quiet, but not for long enough");
        tokio::time::advance(HELP_LINGER).await;
        assert_eq!(help.look(Some(false)), Some(Step::End), "quiet for the linger: the call ends");
        help.asking = false;
        assert_eq!(help.look(None), None, "not looking: nothing");
    }
}
