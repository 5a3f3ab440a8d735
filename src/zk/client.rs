//! [`Zk`]: calls on one ZooKeeper session, each with a deadline, a metric and a classified error.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client as zkc;

use super::ZkError;
use super::wire::RequestSizer;
use crate::metrics::Metrics;

/// The parts of a znode's `Stat` that zkq uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStat {
    pub version: i32,
    pub cversion: i32,
    pub num_children: i32,
    pub ephemeral_owner: i64,
    pub data_length: i32,
    /// Creation time, epoch milliseconds (by the clock of the server that led the ensemble then).
    pub ctime: i64,
    /// Time of the last write of the node's data (its creation if none since), epoch ms.
    pub mtime: i64,
    /// The transaction that created the node (every operation of one `multi` shares it).
    pub czxid: i64,
    /// The transaction that last wrote the node's data (its creation if none since).
    pub mzxid: i64,
}

impl From<&zkc::Stat> for NodeStat {
    fn from(stat: &zkc::Stat) -> Self {
        NodeStat {
            version: stat.version,
            cversion: stat.cversion,
            num_children: stat.num_children,
            ephemeral_owner: stat.ephemeral_owner,
            data_length: stat.data_length,
            ctime: stat.ctime,
            mtime: stat.mtime,
            czxid: stat.czxid,
            mzxid: stat.mzxid,
        }
    }
}

/// How a node is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeMode {
    Persistent,
    PersistentSequential,
    Ephemeral,
    Container,
}

impl NodeMode {
    /// The create options of this mode with the session's ACL (see `zookeeper.acl`).
    fn options(self, acl: &[zkc::Acl]) -> zkc::CreateOptions<'_> {
        let mode = match self {
            NodeMode::Persistent => zkc::CreateMode::Persistent,
            NodeMode::PersistentSequential => zkc::CreateMode::PersistentSequential,
            NodeMode::Ephemeral => zkc::CreateMode::Ephemeral,
            NodeMode::Container => zkc::CreateMode::Container,
        };
        mode.with_acls(zkc::Acls::new(acl))
    }
}

/// One operation of a transaction ([`Zk::multi`]).
#[derive(Debug, Clone)]
pub enum TxnOp {
    Create { path: String, data: Vec<u8>, mode: NodeMode },
    Delete { path: String, version: Option<i32> },
    SetData { path: String, data: Vec<u8>, version: Option<i32> },
    Check { path: String, version: i32 },
}

/// The result of one successful transaction operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnResult {
    /// The created path (with the sequence suffix for sequential nodes).
    Created(String),
    Deleted,
    DataSet(NodeStat),
    Checked,
}

/// A transaction that failed as a whole: nothing was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnError {
    /// Index of the operation that failed, when the server said which.
    pub index: Option<usize>,
    pub error: ZkError,
}

/// What woke a one-shot watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEvent {
    /// The watched node (or its children) changed.
    NodeChanged,
    /// The session ended; the watch will never fire. Re-arm on the next session.
    SessionEnded,
}

/// A one-shot watch. The client re-registers it on reconnect to the same session.
pub struct ZkWatch(zkc::OneshotWatcher);

impl ZkWatch {
    pub async fn changed(self) -> WatchEvent {
        let event = self.0.changed().await;
        if event.event_type == zkc::EventType::Session { WatchEvent::SessionEnded } else { WatchEvent::NodeChanged }
    }
}

/// One event of a persistent recursive watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeEvent {
    /// A node under the watched path was created (its full path).
    Created(String),
    /// A node under the watched path was deleted (its full path).
    Deleted(String),
    /// A node's data changed (its full path): for a queue, its own node's (the catalog's mark).
    DataChanged(String),
    /// The connection was lost or the session ended. The client crate does not re-register
    /// persistent watches after a reconnect: add the watch again and re-read.
    ConnectionLost,
    /// Anything else: nothing to do.
    Other,
}

/// A persistent recursive watch: one event per created or deleted node below its path, without
/// re-reads. Valid until [`TreeEvent::ConnectionLost`]; drop it after adding its replacement.
pub struct ZkTreeWatch {
    watcher: zkc::PersistentWatcher,
    ended: bool,
}

impl ZkTreeWatch {
    /// The next event; after [`TreeEvent::ConnectionLost`] it never answers again (the client
    /// crate panics when asked after the session ended).
    pub async fn next(&mut self) -> TreeEvent {
        if self.ended {
            return std::future::pending().await;
        }
        // The crate's receiver panics (an `unwrap` on a closed channel) when the client goes
        // away without a session event, e.g. closed while this waits: that is the end too.
        let changed = std::panic::AssertUnwindSafe(self.watcher.changed());
        let Ok(event) = futures::FutureExt::catch_unwind(changed).await else {
            self.ended = true;
            return TreeEvent::ConnectionLost;
        };
        match event.event_type {
            zkc::EventType::NodeCreated => TreeEvent::Created(event.path),
            zkc::EventType::NodeDeleted => TreeEvent::Deleted(event.path),
            zkc::EventType::NodeDataChanged => TreeEvent::DataChanged(event.path),
            zkc::EventType::Session if event.session_state == zkc::SessionState::SyncConnected => TreeEvent::Other,
            zkc::EventType::Session => {
                self.ended = true;
                TreeEvent::ConnectionLost
            },
            _ => TreeEvent::Other,
        }
    }

    /// An event already received, if any, without waiting.
    pub fn ready(&mut self) -> Option<TreeEvent> {
        use futures::FutureExt;
        self.next().now_or_never()
    }
}

/// Calls on one session. Cheap to clone; a clone made with [`Zk::with_deadline`] bounds every call.
#[derive(Clone)]
pub struct Zk {
    client: zkc::Client,
    generation: u64,
    request_timeout: Duration,
    deadline: Option<Instant>,
    metrics: Arc<Metrics>,
    /// The ACL of every node this session creates.
    acl: Arc<[zkc::Acl]>,
    /// How large the requests of this session are on the wire (its ACL, its chroot).
    sizer: RequestSizer,
    /// The largest request this session sends ([`super::wire::max_request_bytes`]).
    max_request: usize,
}

impl std::fmt::Debug for Zk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Zk").field("session", &self.session_id()).field("generation", &self.generation).finish()
    }
}

impl Zk {
    pub(super) fn new(
        client: zkc::Client,
        generation: u64,
        request_timeout: Duration,
        metrics: Arc<Metrics>,
        acl: Arc<[zkc::Acl]>,
        max_request: usize,
    ) -> Zk {
        let chroot = client.path();
        let chroot_len = if chroot == "/" { 0 } else { chroot.len() };
        let sizer = RequestSizer::new(acl.iter().map(|entry| (entry.scheme().len(), entry.id().len())), chroot_len);
        Zk { client, generation, request_timeout, deadline: None, metrics, acl, sizer, max_request }
    }

    /// What one operation adds to a transaction of this session, encoded (see [`super::wire`]).
    pub fn op_bytes(&self, op: &TxnOp) -> usize {
        self.sizer.op_bytes(op)
    }

    /// The largest request this session sends: `zookeeper.jute_maxbuffer` less room for the
    /// servers' log entry. A transaction over it is refused before it is sent
    /// ([`ZkError::TooLarge`]).
    pub fn max_request_bytes(&self) -> usize {
        self.max_request
    }

    /// The encoded size of a transaction of `ops` on this session: at most
    /// [`Zk::max_request_bytes`] may be sent.
    pub fn request_bytes<'a>(&self, ops: impl IntoIterator<Item = &'a TxnOp>) -> usize {
        self.sizer.multi_bytes(ops)
    }

    /// The same session with every call bounded by `deadline` (and by the request timeout).
    pub fn with_deadline(&self, deadline: Instant) -> Zk {
        Zk { deadline: Some(deadline), ..self.clone() }
    }

    /// The session's generation (see [`super::SessionStatus::generation`]).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn session_id(&self) -> i64 {
        self.client.session_id().0
    }

    /// When calls on this handle give up: its deadline, or the request timeout from now.
    pub fn deadline(&self) -> Instant {
        self.call_deadline()
    }

    fn call_deadline(&self) -> Instant {
        let by_timeout = Instant::now() + self.request_timeout;
        self.deadline.map_or(by_timeout, |d| d.min(by_timeout))
    }

    /// Runs one call: the request is already sent when `fut` is made, so a deadline that passes
    /// means the outcome is unknown, never "not applied".
    async fn call<T, E>(&self, operation: &'static str, fut: impl Future<Output = Result<T, E>>) -> Result<T, ZkError>
    where
        ZkError: From<E>,
    {
        let started = Instant::now();
        let result = match tokio::time::timeout_at(self.call_deadline(), fut).await {
            Ok(result) => result.map_err(ZkError::from),
            Err(_) => Err(ZkError::OutcomeUnknown),
        };
        let outcome = match &result {
            Ok(_) => "ok",
            Err(err) => err.outcome_label(),
        };
        self.metrics.zk_requests.with_label_values(&[operation, outcome]).inc();
        self.metrics.zk_request_duration.with_label_values(&[operation]).observe(started.elapsed().as_secs_f64());
        result
    }

    pub async fn get_data(&self, path: &str) -> Result<(Vec<u8>, NodeStat), ZkError> {
        let (data, stat) = self.call("get_data", self.client.get_data(path)).await?;
        Ok((data, NodeStat::from(&stat)))
    }

    /// Reads several nodes in one round trip (a multi-read); each answer on its own.
    pub async fn get_data_many(&self, paths: &[&str]) -> Result<Vec<Result<(Vec<u8>, NodeStat), ZkError>>, ZkError> {
        let mut reader = self.client.new_multi_reader();
        for path in paths {
            reader.add_get_data(path).map_err(ZkError::from)?;
        }
        let results = self.call("multi_read", reader.commit()).await?;
        Ok(results
            .into_iter()
            .map(|r| match r {
                zkc::MultiReadResult::Data { data, stat } => Ok((data, NodeStat::from(&stat))),
                zkc::MultiReadResult::Error { err } => Err(ZkError::from(err)),
                _ => Err(ZkError::Rejected("unexpected multi-read answer".to_owned())),
            })
            .collect())
    }

    pub async fn get_and_watch_data(&self, path: &str) -> Result<(Vec<u8>, NodeStat, ZkWatch), ZkError> {
        let (data, stat, watch) = self.call("get_data", self.client.get_and_watch_data(path)).await?;
        Ok((data, NodeStat::from(&stat), ZkWatch(watch)))
    }

    pub async fn exists(&self, path: &str) -> Result<Option<NodeStat>, ZkError> {
        let stat = self.call("exists", self.client.check_stat(path)).await?;
        Ok(stat.as_ref().map(NodeStat::from))
    }

    pub async fn watch_exists(&self, path: &str) -> Result<(Option<NodeStat>, ZkWatch), ZkError> {
        let (stat, watch) = self.call("exists", self.client.check_and_watch_stat(path)).await?;
        Ok((stat.as_ref().map(NodeStat::from), ZkWatch(watch)))
    }

    pub async fn get_children(&self, path: &str) -> Result<(Vec<String>, NodeStat), ZkError> {
        let (children, stat) = self.call("get_children", self.client.get_children(path)).await?;
        Ok((children, NodeStat::from(&stat)))
    }

    pub async fn get_and_watch_children(&self, path: &str) -> Result<(Vec<String>, NodeStat, ZkWatch), ZkError> {
        let (children, stat, watch) = self.call("get_children", self.client.get_and_watch_children(path)).await?;
        Ok((children, NodeStat::from(&stat), ZkWatch(watch)))
    }

    /// Adds a persistent recursive watch on `path` (ZooKeeper 3.6+).
    pub async fn watch_tree(&self, path: &str) -> Result<ZkTreeWatch, ZkError> {
        let watcher = self.call("add_watch", self.client.watch(path, zkc::AddWatchMode::PersistentRecursive)).await?;
        Ok(ZkTreeWatch { watcher, ended: false })
    }

    /// Creates a node; returns its full path (with the sequence suffix for sequential nodes).
    pub async fn create(&self, path: &str, data: &[u8], mode: NodeMode) -> Result<String, ZkError> {
        let options = mode.options(&self.acl);
        let (_, sequence) = self.call("create", self.client.create(path, data, &options)).await?;
        Ok(if mode == NodeMode::PersistentSequential { format!("{path}{sequence}") } else { path.to_owned() })
    }

    /// Creates a node; returns its stat, which says who it is (`czxid`): a node deleted and made
    /// anew at the same path starts at version 0 again, its creation never repeats. A server
    /// older than 3.5 answers no stat (all zeros).
    pub async fn create_stat(&self, path: &str, data: &[u8], mode: NodeMode) -> Result<NodeStat, ZkError> {
        let options = mode.options(&self.acl);
        let (stat, _) = self.call("create", self.client.create(path, data, &options)).await?;
        Ok(NodeStat::from(&stat))
    }

    /// Makes the server this session is connected to catch up with the leader, so a read that
    /// follows sees every write committed before it (a lost answer is judged on current data).
    pub async fn sync(&self, path: &str) -> Result<(), ZkError> {
        self.call("sync", self.client.sync(path)).await
    }

    pub async fn delete(&self, path: &str, version: Option<i32>) -> Result<(), ZkError> {
        self.call("delete", self.client.delete(path, version)).await
    }

    pub async fn set_data(&self, path: &str, data: &[u8], version: Option<i32>) -> Result<NodeStat, ZkError> {
        let stat = self.call("set_data", self.client.set_data(path, data, version)).await?;
        Ok(NodeStat::from(&stat))
    }

    /// Runs `ops` as one transaction: all are applied or none.
    pub async fn multi(&self, ops: &[TxnOp]) -> Result<Vec<TxnResult>, TxnError> {
        let bytes = self.request_bytes(ops);
        if bytes > self.max_request {
            // Never sent: the server would close the connection, losing every answer in flight.
            return Err(TxnError { index: None, error: ZkError::TooLarge { size: bytes, max: self.max_request } });
        }
        let mut writer = self.client.new_multi_writer();
        for op in ops {
            let added = match op {
                TxnOp::Create { path, data, mode } => writer.add_create(path, data, &mode.options(&self.acl)),
                TxnOp::Delete { path, version } => writer.add_delete(path, *version),
                TxnOp::SetData { path, data, version } => writer.add_set_data(path, data, *version),
                TxnOp::Check { path, version } => writer.add_check_version(path, *version),
            };
            added.map_err(|e| TxnError { index: None, error: ZkError::from(e) })?;
        }
        let failed_at = std::sync::Mutex::new(None);
        let commit = async {
            writer.commit().await.inspect_err(|err| {
                if let zkc::MultiWriteError::OperationFailed { index, .. } = err
                    && let Ok(mut slot) = failed_at.lock()
                {
                    *slot = Some(*index);
                }
            })
        };
        let results = self
            .call("multi", commit)
            .await
            .map_err(|error| TxnError { index: failed_at.lock().ok().and_then(|i| *i), error })?;
        Ok(results
            .into_iter()
            .map(|r| match r {
                zkc::MultiWriteResult::Create { path, .. } => TxnResult::Created(path),
                zkc::MultiWriteResult::Delete => TxnResult::Deleted,
                zkc::MultiWriteResult::SetData { stat } => TxnResult::DataSet(NodeStat::from(&stat)),
                _ => TxnResult::Checked,
            })
            .collect())
    }

    /// Deletes `path` and everything under it, deepest nodes first, in transactions that fit
    /// the request limit; a node another client creates meanwhile is deleted too (its parent's
    /// delete fails `NotEmpty`, and that level is listed again). The number of nodes deleted, and
    /// whether `path` is gone: `false` when the handle's deadline came first (what was deleted
    /// stays deleted; calling again goes on). A missing `path` is gone already.
    pub async fn delete_tree(&self, path: &str) -> Result<(usize, bool), ZkError> {
        self.delete_tree_as(path, true, &|_| true).await
    }

    /// As [`Zk::delete_tree`], but `path` itself stays (emptied): a queue's node, which keeps
    /// its sequence across a delete (`queue::catalog`). `true` once it has no child left.
    pub async fn delete_below(&self, path: &str) -> Result<(usize, bool), ZkError> {
        self.delete_tree_as(path, false, &|_| true).await
    }

    /// As [`Zk::delete_below`], for the children of `path` whose names `doomed` picks (and
    /// everything under them); `true` once none of those is left.
    pub async fn delete_below_where(
        &self,
        path: &str,
        doomed: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<(usize, bool), ZkError> {
        self.delete_tree_as(path, false, doomed).await
    }

    async fn delete_tree_as(
        &self,
        path: &str,
        with_root: bool,
        doomed: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<(usize, bool), ZkError> {
        /// At most this many deletes per transaction (and within the request limit).
        const PER_TXN: usize = 500;
        let mut deleted = 0;
        // Depth-first: a node is deleted once its children are; a level whose delete finds a
        // child again is listed again.
        let mut stack = vec![path.to_owned()];
        while let Some(node) = stack.last().cloned() {
            if Instant::now() >= self.call_deadline() {
                return Ok((deleted, false));
            }
            let children = match self.get_children(&node).await {
                Ok((children, _)) => children,
                Err(ZkError::NoNode) => {
                    stack.pop();
                    continue;
                },
                Err(_) if Instant::now() >= self.call_deadline() => return Ok((deleted, false)),
                Err(err) => return Err(err),
            };
            let prefix = node.trim_end_matches('/');
            let at_root = stack.len() == 1;
            let children = children
                .into_iter()
                .filter(|child| !at_root || doomed(child))
                .map(|child| format!("{prefix}/{child}"))
                .collect();
            let (gone, parents) = match self.delete_leaves(children, PER_TXN).await {
                Ok(done) => done,
                // Out of time: what was sent may or may not be applied; deleting again goes on.
                Err(_) if Instant::now() >= self.call_deadline() => return Ok((deleted, false)),
                Err(err) => return Err(err),
            };
            deleted += gone;
            if !parents.is_empty() {
                // Children with children of their own: each is emptied first, then this level.
                stack.extend(parents);
                continue;
            }
            if !with_root && stack.len() == 1 {
                // The kept root: its children are gone as of this listing.
                stack.pop();
                continue;
            }
            match self.delete(&node, None).await {
                Ok(()) => {
                    deleted += 1;
                    stack.pop();
                },
                Err(ZkError::NoNode) => {
                    stack.pop();
                },
                // A child appeared (a put, a lock): list this level again.
                Err(ZkError::NotEmpty) => {},
                Err(_) if Instant::now() >= self.call_deadline() => return Ok((deleted, false)),
                Err(err) => return Err(err),
            }
        }
        Ok((deleted, true))
    }

    /// Deletes `nodes` in transactions of up to `per_txn` within the request limit, as if each
    /// had no child; one gone already is left out, one that has children is set aside, and the
    /// rest sent again. How many were deleted, and the nodes set aside.
    async fn delete_leaves(&self, nodes: Vec<String>, per_txn: usize) -> Result<(usize, Vec<String>), ZkError> {
        let mut deleted = 0;
        let mut parents = Vec::new();
        let mut ops: Vec<TxnOp> = nodes.into_iter().map(|path| TxnOp::Delete { path, version: None }).collect();
        while !ops.is_empty() {
            let mut take = ops.len().min(per_txn);
            while take > 1 && self.request_bytes(&ops[..take]) > self.max_request / 2 {
                take /= 2;
            }
            match self.multi(&ops[..take]).await {
                Ok(_) => {
                    deleted += take;
                    ops.drain(..take);
                },
                Err(TxnError { index: Some(index), error }) if index < take => match (error, ops.remove(index)) {
                    (ZkError::NotEmpty, TxnOp::Delete { path, .. }) => parents.push(path),
                    (ZkError::NoNode, _) => {},
                    (error, _) => return Err(error),
                },
                Err(err) => return Err(err.error),
            }
        }
        Ok((deleted, parents))
    }

    /// Creates `path` as a persistent node and its missing parents as containers, the way
    /// Curator's `creatingParentContainersIfNeeded()` does; an existing node is fine.
    pub async fn ensure_path(&self, path: &str) -> Result<(), ZkError> {
        self.ensure_path_as(path, NodeMode::Persistent).await
    }

    /// As [`Zk::ensure_path`], with `path` itself created in `mode` (persistent or container).
    pub async fn ensure_path_as(&self, path: &str, mode: NodeMode) -> Result<(), ZkError> {
        match self.create(path, b"", mode).await {
            Ok(_) | Err(ZkError::NodeExists) => return Ok(()),
            Err(ZkError::NoNode) => {},
            Err(err) => return Err(err),
        }
        let mut prefix = String::new();
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        for segment in &segments[..segments.len().saturating_sub(1)] {
            prefix.push('/');
            prefix.push_str(segment);
            match self.create(&prefix, b"", NodeMode::Container).await {
                Ok(_) | Err(ZkError::NodeExists) => {},
                Err(err) => return Err(err),
            }
        }
        match self.create(path, b"", mode).await {
            Ok(_) | Err(ZkError::NodeExists) => Ok(()),
            Err(err) => Err(err),
        }
    }
}
