//! A read-only look at the queues in ZooKeeper: every declared queue and every child of
//! `{root}/queues`, what each holds, who holds its locks, which messages came back more than once
//! and which nodes are not Curator's. `zkq inspect` prints it; `GET /v1/queues?all=true` lists
//! its summaries.
//!
//! It never writes and its cost is bounded: [`SurveyLimits`] caps the queues examined, the child
//! lists read (by the `numChildren` of a stat taken first) and the nodes read per queue, node data
//! is read at most [`READS_IN_FLIGHT`] nodes at a time and dropped once looked at, and a deadline
//! bounds the time: a read that would start after it is not made, and the report says what is
//! missing. Everything read is untrusted: names and data that do not parse are reported, never
//! trusted.

use crate::types::Layout;
use std::collections::{BTreeMap, HashMap, HashSet};

use futures::StreamExt;
use serde::Serialize;
use tokio::time::Instant;

use crate::config::{Config, JUTE_MAXBUFFER_BYTES, QueueKind};
use crate::queue::names::{self, ItemName, QUEUE_PREFIX, SIMPLE_PREFIX};
use crate::queue::{envelope, queue_layout, read_counter};
use crate::types::{QueueName, now_epoch_ms};
use crate::zk::{Zk, ZkError};

mod every;
pub(crate) use every::{Surveyed, every_queue};

/// Node reads in flight at once, per queue: with nodes of at most 1 MiB, the data held at any time.
pub(crate) const READS_IN_FLIGHT: usize = 8;

/// At most this many entries of each list in a report (undecodable nodes, redelivered messages).
const LISTED: usize = 20;

/// Bytes of a message body shown in a report.
const PREVIEW_BYTES: usize = 64;

/// What one survey may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct SurveyLimits {
    /// Queues examined; declared ones first, then the children of `{root}/queues` by name.
    pub max_queues: usize,
    /// A child list (of `{root}/queues`, a queue, its lock directory or its delivery counts) is
    /// read only when the node has at most this many children.
    pub max_list: usize,
    /// Nodes whose data is read per queue: messages checked for Curator's envelope, and delivery
    /// counts.
    pub max_reads: usize,
    /// Lock nodes per queue whose owner (session) is looked up.
    pub max_lock_owners: usize,
}

impl Default for SurveyLimits {
    fn default() -> Self {
        SurveyLimits { max_queues: 1000, max_list: 100_000, max_reads: 100, max_lock_owners: 100 }
    }
}

/// How much of a queue to look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Detail {
    /// Depth, locks held, child list size, kind and the age of the head (`GET /v1/queues?all=true`).
    Summary,
    /// Everything, with the first `messages` messages of the queue.
    Full { messages: usize },
}

/// A queue the survey found: declared, or a child of `{root}/queues`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueLocation {
    pub name: String,
    pub declared: bool,
    /// The declared kind; `None` for a found queue (inferred from its child names).
    pub kind: Option<QueueKind>,
    pub path: String,
    pub lock_path: Option<String>,
    /// Where zkq keeps the queue's delivery counts.
    pub deliveries_path: String,
    /// Declared grouped (`queues.NAME.grouped`).
    pub grouped: bool,
}

/// The queues to examine, and how many more there are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Located {
    pub queues: Vec<QueueLocation>,
    /// Queues not examined: beyond `max_queues`, or in a `{root}/queues` list too long to read.
    pub omitted: usize,
    /// Why some were omitted, if any were.
    pub note: Option<String>,
}

/// The location of the queue called `name`, declared or not.
pub(crate) fn location(config: &Config, name: &str) -> QueueLocation {
    let layout = queue_layout(config, name);
    let declared = config.queues.contains_key(name);
    QueueLocation {
        name: name.to_owned(),
        declared,
        kind: declared.then_some(layout.kind),
        path: layout.path,
        lock_path: layout.lock_path,
        deliveries_path: Layout::new(&config.zookeeper.root).deliveries(name),
        grouped: layout.grouped,
    }
}

/// Every declared queue and every child of `{root}/queues` (one stat and one child list), sorted
/// by name, at most `limits.max_queues` (declared ones first).
pub(crate) async fn locate(zk: &Zk, config: &Config, limits: &SurveyLimits) -> Result<Located, ZkError> {
    let mut names: Vec<String> = config.queues.keys().map(QueueName::to_string).collect();
    let mut declared_paths: HashSet<String> = names.iter().map(|n| location(config, n).path).collect();
    let directory = Layout::new(&config.zookeeper.root).queues();
    let mut found = Vec::new();
    let mut omitted = 0;
    let mut note = None;
    if let Some(stat) = zk.exists(&directory).await? {
        let children = usize::try_from(stat.num_children).unwrap_or(0);
        if children > limits.max_list {
            omitted = children;
            note = Some(format!(
                "{directory} has {children} children, more than the {} a survey reads: only declared queues are shown",
                limits.max_list
            ));
        } else {
            match zk.get_children(&directory).await {
                Ok((children, _)) => found = children,
                Err(ZkError::NoNode) => {},
                Err(err) => return Err(err),
            }
        }
    }
    found.sort();
    for name in found {
        let path = format!("{directory}/{name}");
        // A declared queue can live at the default path of its name: list it once.
        if declared_paths.insert(path) && !config.queues.contains_key(name.as_str()) {
            names.push(name);
        }
    }
    let declared = config.queues.len();
    if names.len() > limits.max_queues.max(declared) {
        let extra = names.len() - limits.max_queues.max(declared);
        omitted += extra;
        names.truncate(limits.max_queues.max(declared));
        note.get_or_insert_with(|| format!("{extra} queues beyond the first {} are not shown", limits.max_queues));
    }
    let mut queues: Vec<QueueLocation> = names.iter().map(|n| location(config, n)).collect();
    queues.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Located { queues, omitted, note })
}

/// The kind of Curator queue whose recipe wrote `names`, for a queue that is not declared:
/// `qn-` names are a `simple` queue; `queue-` names a `fifo`, `priority` (sign digit and eight
/// hex digits before the sequence), `delay` (upper-case hex epoch between `|`) or `id` queue.
/// `None` when no name is an item. A priority queue's requeued items have plain names, so one
/// priority name decides; an id that looks like a hex epoch is taken for a delay queue.
pub(crate) fn infer_kind<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<QueueKind> {
    let mut votes: BTreeMap<u8, usize> = BTreeMap::new();
    for name in names {
        let Some(kind) = kind_of_name(name) else { continue };
        if kind == QueueKind::Priority {
            return Some(QueueKind::Priority);
        }
        *votes.entry(kind_rank(kind)).or_default() += 1;
    }
    let (rank, _) = votes.into_iter().max_by_key(|(rank, count)| (*count, std::cmp::Reverse(*rank)))?;
    KINDS.get(usize::from(rank)).copied()
}

const KINDS: [QueueKind; 5] =
    [QueueKind::Fifo, QueueKind::Priority, QueueKind::Delay, QueueKind::Id, QueueKind::Simple];

fn kind_rank(kind: QueueKind) -> u8 {
    match kind {
        QueueKind::Fifo => 0,
        QueueKind::Priority => 1,
        QueueKind::Delay => 2,
        QueueKind::Id => 3,
        QueueKind::Simple => 4,
    }
}

/// The kind whose recipe writes a child called `name`, if any.
fn kind_of_name(name: &str) -> Option<QueueKind> {
    let digits = |t: &str, n: usize| t.len() == n && t.bytes().all(|b| b.is_ascii_digit());
    let upper_hex = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b));
    // A node split from a putMulti node ends in `-` and 4 to 9 digits after its sequence.
    let unsplit = |t: &'_ str| -> String {
        match t.rsplit_once('-') {
            Some((base, index)) if (4..=9).contains(&index.len()) && digits(index, index.len()) => base.to_owned(),
            _ => t.to_owned(),
        }
    };
    if let Some(rest) = name.strip_prefix(SIMPLE_PREFIX) {
        return digits(rest, 10).then_some(QueueKind::Simple);
    }
    let rest = unsplit(name.strip_prefix(QUEUE_PREFIX)?);
    if let Some(tagged) = rest.strip_prefix('|') {
        let (tag, sequence) = tagged.rsplit_once('|')?;
        if !digits(sequence, 10) || tag.is_empty() {
            return None;
        }
        let hex_epoch = !tag.contains('|') && upper_hex(tag) && (8..=16).contains(&tag.len());
        return Some(if hex_epoch { QueueKind::Delay } else { QueueKind::Id });
    }
    if digits(&rest, 10) {
        return Some(QueueKind::Fifo);
    }
    let (encoded, sequence) = (rest.get(..9)?, rest.get(9..)?);
    let sign_ok = encoded.starts_with('0') || encoded.starts_with('1');
    (sign_ok && upper_hex(encoded.get(1..)?) && digits(sequence, 10)).then_some(QueueKind::Priority)
}

/// One queue, as the survey saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct QueueReport {
    pub name: String,
    /// Declared in the configuration (false: found under `{root}/queues`).
    pub declared: bool,
    /// `fifo`, `priority`, `delay`, `id` or `simple`; `null` when a found queue's names say nothing.
    pub kind: Option<&'static str>,
    /// The kind was inferred from the child names (the queue is not declared).
    pub kind_inferred: bool,
    /// Declared grouped: one message of a group in flight at a time, in put order.
    pub grouped: bool,
    /// Grouped queues: the groups with a message present, when the child list was read.
    pub groups: Option<usize>,
    pub path: String,
    pub lock_path: Option<String>,
    /// The queue node exists.
    pub exists: bool,
    /// Children of the queue node (`numChildren`; foreign nodes included).
    pub depth: i64,
    /// The child list was read (false: more than `max_list` children, or no time left).
    pub child_list_read: bool,
    /// Size of the child list as a `getChildren` reply; Java clients refuse more than
    /// `jute.maxbuffer` (1,048,575 bytes by default).
    pub child_list_bytes: Option<i64>,
    /// Children that are not items of the queue's kind (never touched by zkq or Curator).
    pub foreign_nodes: Option<usize>,
    /// Items not yet due (delay queues).
    pub not_yet_due: Option<usize>,
    /// The next message to deliver: the first item in delivery order that is due and not locked.
    pub oldest_message: Option<String>,
    /// How long it has waited: since its creation, or since it became due (delay queues).
    pub oldest_message_age_ms: Option<i64>,
    /// The child list was read and the head looked up: `oldest_message_age_ms` is null only when no
    /// message is waiting.
    pub oldest_message_age_known: bool,
    pub locks: Option<LockReport>,
    pub deliveries: Option<DeliveryReport>,
    pub envelopes: Option<EnvelopeReport>,
    /// The first messages in delivery order (`zkq inspect --queue`).
    pub messages: Option<Vec<MessageReport>>,
    /// Reads that failed or were not made (deadline), in order.
    pub errors: Vec<String>,
}

/// The lock directory of a queue: messages a consumer holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct LockReport {
    /// Lock nodes (`numChildren` of the lock directory).
    pub held: i64,
    /// Sessions holding the locks looked up (at most `max_lock_owners`), most locks first.
    pub owners: Vec<LockOwner>,
    /// Locks whose owner was looked up.
    pub looked_up: usize,
    /// Locks whose message is not in the queue (a consumer between its lock and its delete).
    pub without_message: usize,
}

/// A ZooKeeper session holding locks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct LockOwner {
    /// The session id, as ZooKeeper's `ephemeralOwner` (hex).
    pub session: String,
    pub locks: usize,
}

/// zkq's delivery counts of a queue (`{root}/deliveries/{queue}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct DeliveryReport {
    /// Messages with a delivery count (leased at least once and not yet acked).
    pub counted: i64,
    /// Counts read (at most `max_reads`).
    pub read: usize,
    /// Of those, delivered more than once.
    pub redelivered: usize,
    /// The messages delivered most often (at most 20), most first.
    pub most: Vec<Redelivered>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Redelivered {
    pub message_id: String,
    pub deliveries: u32,
}

/// The first nodes of a queue checked for Curator's envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct EnvelopeReport {
    /// Nodes read, in delivery order (at most `max_reads`).
    pub checked: usize,
    /// Of those, not Curator's envelope (at most 20 listed).
    pub undecodable: Vec<Undecodable>,
    pub undecodable_count: usize,
    /// Nodes holding several items (Curator's `putMulti`).
    pub multi_item_nodes: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Undecodable {
    pub message_id: String,
    pub reason: String,
}

/// One of the first messages of a queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct MessageReport {
    pub message_id: String,
    /// Time since the node was created.
    pub age_ms: i64,
    pub priority: Option<i32>,
    /// Delay queues: not delivered before this time (epoch ms).
    pub deliver_at: Option<i64>,
    pub id: Option<String>,
    /// Bytes of the node's data (the envelope included).
    pub size: usize,
    /// Items in the node (several for Curator's `putMulti`); `null` when it does not decode.
    pub items: Option<usize>,
    /// Why it does not decode, when it does not.
    pub undecodable: Option<String>,
    /// The session holding its lock, if a consumer holds it.
    pub locked_by: Option<String>,
    /// zkq's delivery count, if it was leased.
    pub deliveries: Option<u32>,
    /// The first bytes of its (first) body, escaped: printable ASCII as is, anything else as `\xNN`.
    pub body_preview: String,
}

/// ZooKeeper's `ephemeralOwner` as it prints session ids.
pub(crate) fn session_hex(session: i64) -> String {
    format!("{:#x}", u64::from_ne_bytes(session.to_ne_bytes()))
}

/// Reads of one queue under a deadline; what could not be read is noted in `errors`.
struct Examiner<'a> {
    zk: &'a Zk,
    limits: &'a SurveyLimits,
    deadline: Instant,
    errors: Vec<String>,
}

impl Examiner<'_> {
    /// False (noting it once) when the deadline has passed: the next read is not made.
    fn time_left(&mut self, what: &str) -> bool {
        if Instant::now() < self.deadline {
            return true;
        }
        let note = format!("{what}: not read, the deadline passed");
        if !self.errors.iter().any(|e| e.ends_with("the deadline passed")) {
            self.errors.push(note);
        }
        false
    }

    fn failed(&mut self, what: &str, err: &ZkError) {
        self.errors.push(format!("{what}: {err}"));
    }

    /// The children of `path` when it has at most `max_list`: `Ok(None)` when it does not exist,
    /// `Err(num_children)` when the list is too long (or could not be read: then -1).
    async fn list(&mut self, what: &str, path: &str) -> Result<Option<(Vec<String>, i64)>, i64> {
        if !self.time_left(what) {
            return Err(-1);
        }
        let stat = match self.zk.exists(path).await {
            Ok(Some(stat)) => stat,
            Ok(None) => return Ok(None),
            Err(err) => {
                self.failed(what, &err);
                return Err(-1);
            },
        };
        let count = i64::from(stat.num_children);
        if usize::try_from(stat.num_children).unwrap_or(0) > self.limits.max_list {
            return Err(count);
        }
        if !self.time_left(what) {
            return Err(count);
        }
        match self.zk.get_children(path).await {
            Ok((children, stat)) => Ok(Some((children, i64::from(stat.num_children)))),
            Err(ZkError::NoNode) => Ok(None),
            Err(err) => {
                self.failed(what, &err);
                Err(count)
            },
        }
    }

    /// The data of each of `paths` (`None` for a node that is gone), `READS_IN_FLIGHT` at a time,
    /// handed to `look` one by one and dropped after.
    async fn read_each(
        &mut self,
        what: &str,
        paths: Vec<String>,
        mut look: impl FnMut(usize, Option<(Vec<u8>, crate::zk::NodeStat)>),
    ) {
        if !self.time_left(what) {
            return;
        }
        let zk = self.zk;
        let deadline = self.deadline;
        let mut reads = futures::stream::iter(paths.into_iter().enumerate())
            .map(|(index, path)| async move {
                if Instant::now() >= deadline {
                    return (index, Err(None));
                }
                match zk.get_data(&path).await {
                    Ok(read) => (index, Ok(Some(read))),
                    Err(ZkError::NoNode) => (index, Ok(None)),
                    Err(err) => (index, Err(Some(err))),
                }
            })
            .buffered(READS_IN_FLIGHT);
        let mut late = false;
        while let Some((index, read)) = reads.next().await {
            match read {
                Ok(read) => look(index, read),
                Err(Some(err)) => self.failed(what, &err),
                Err(None) => late = true,
            }
        }
        if late {
            self.time_left(what);
        }
    }
}

/// Looks at one queue. `Summary` costs at most two stats and two child lists plus one stat of its
/// head; `Full` adds the lock owners, the delivery counts and the first nodes' data (each bounded
/// by `limits`).
pub(crate) async fn examine(
    zk: &Zk,
    location: &QueueLocation,
    limits: &SurveyLimits,
    detail: Detail,
    deadline: Instant,
) -> QueueReport {
    let mut ex = Examiner { zk, limits, deadline, errors: Vec::new() };
    let mut report = QueueReport {
        name: location.name.clone(),
        declared: location.declared,
        kind: location.kind.map(QueueKind::as_str),
        kind_inferred: false,
        grouped: location.grouped,
        groups: None,
        path: location.path.clone(),
        lock_path: location.lock_path.clone(),
        exists: false,
        depth: 0,
        child_list_read: false,
        child_list_bytes: None,
        foreign_nodes: None,
        not_yet_due: None,
        oldest_message: None,
        oldest_message_age_ms: None,
        oldest_message_age_known: false,
        locks: None,
        deliveries: None,
        envelopes: None,
        messages: None,
        errors: Vec::new(),
    };
    // A dynamic queue deleted through zkq keeps its node, marked (`queue::catalog`): no queue.
    if !location.declared && crate::queue::is_deleted_queue_node(zk, &location.path).await {
        return report;
    }
    let children = match ex.list("queue node", &location.path).await {
        Ok(Some((children, depth))) => {
            report.exists = true;
            report.depth = depth;
            Some(children)
        },
        Ok(None) => None,
        Err(depth) => {
            report.exists = depth >= 0;
            report.depth = depth.max(0);
            None
        },
    };
    let kind = match (location.kind, &children) {
        (Some(kind), _) => Some(kind),
        (None, Some(children)) => {
            let inferred = infer_kind(children.iter().map(String::as_str));
            report.kind = inferred.map(QueueKind::as_str);
            report.kind_inferred = inferred.is_some();
            inferred
        },
        (None, None) => None,
    };
    // How zkq would read it: a found queue whose names say nothing is served as fifo.
    let parse_kind = names::naming(kind.unwrap_or(QueueKind::Fifo), location.grouped);

    let mut order: Vec<ItemName> = Vec::new();
    if let Some(children) = &children {
        report.child_list_read = true;
        report.child_list_bytes = Some(children.iter().map(|c| 4 + i64::try_from(c.len()).unwrap_or(0)).sum());
        order = children.iter().filter_map(|c| names::parse(parse_kind, c)).collect();
        report.foreign_nodes = Some(children.len() - order.len());
        order.sort_by(|a, b| names::compare(parse_kind, a, b));
        if location.grouped {
            report.groups = Some(order.iter().filter_map(names::group_of).collect::<HashSet<_>>().len());
        }
    }
    let present: HashSet<&str> = order.iter().map(|i| i.name.as_str()).collect();

    // Locks: how many, and (in full) whose.
    let mut locked_by: HashMap<String, i64> = HashMap::new();
    let mut locked: HashSet<String> = HashSet::new();
    if let Some(lock_path) = &location.lock_path {
        match ex.list("lock directory", lock_path).await {
            Ok(Some((locks, held))) => {
                let without_message = locks.iter().filter(|l| !present.contains(l.as_str())).count();
                let mut looked_up = 0;
                if let Detail::Full { .. } = detail {
                    let mut sorted = locks.clone();
                    sorted.sort();
                    sorted.truncate(limits.max_lock_owners);
                    for lock in sorted {
                        if !ex.time_left("lock owners") {
                            break;
                        }
                        match zk.exists(&format!("{lock_path}/{lock}")).await {
                            Ok(Some(stat)) => {
                                looked_up += 1;
                                locked_by.insert(lock, stat.ephemeral_owner);
                            },
                            Ok(None) => {},
                            Err(err) => ex.failed("lock owners", &err),
                        }
                    }
                }
                let mut owners: HashMap<i64, usize> = HashMap::new();
                for owner in locked_by.values() {
                    *owners.entry(*owner).or_default() += 1;
                }
                let mut owners: Vec<(i64, usize)> = owners.into_iter().collect();
                owners.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                report.locks = Some(LockReport {
                    held,
                    owners: owners
                        .into_iter()
                        .map(|(session, locks)| LockOwner { session: session_hex(session), locks })
                        .collect(),
                    looked_up,
                    without_message: if children.is_some() { without_message } else { 0 },
                });
                locked = locks.into_iter().collect();
            },
            Ok(None) => {
                report.locks = Some(LockReport { held: 0, owners: Vec::new(), looked_up: 0, without_message: 0 });
            },
            Err(held) if held >= 0 => {
                report.locks = Some(LockReport { held, owners: Vec::new(), looked_up: 0, without_message: 0 });
            },
            Err(_) => {},
        }
    }

    // The head: the first item in delivery order that is due and not locked.
    if children.is_some() {
        let now = now_epoch_ms();
        if parse_kind == QueueKind::Delay {
            report.not_yet_due = Some(order.iter().filter(|i| names::due_time(i) > now).count());
        }
        let head = order.iter().find(|i| names::due_time(i) <= now && !locked.contains(&i.name));
        report.oldest_message_age_known = head.is_none();
        if let Some(head) = head
            && ex.time_left("oldest message")
        {
            match zk.exists(&format!("{}/{}", location.path, head.name)).await {
                Ok(Some(stat)) => {
                    let since = stat.ctime.max(names::due_time(head));
                    report.oldest_message = Some(head.name.clone());
                    report.oldest_message_age_ms = Some((now - since).max(0));
                    report.oldest_message_age_known = true;
                },
                Ok(None) => {},
                Err(err) => ex.failed("oldest message", &err),
            }
        }
    }

    if let Detail::Full { messages } = detail {
        let counts = delivery_counts(&mut ex, location, &present).await;
        if let Some((report_counts, _)) = &counts {
            report.deliveries = Some(report_counts.clone());
        }
        let count_of = counts.map(|(_, all)| all).unwrap_or_default();
        if children.is_some() {
            if parse_kind != QueueKind::Simple {
                report.envelopes = Some(check_envelopes(&mut ex, location, &order).await);
            }
            if messages > 0 {
                let first: Vec<&ItemName> = order.iter().take(messages).collect();
                report.messages =
                    Some(first_messages(&mut ex, location, parse_kind, &first, &locked_by, &count_of).await);
            }
        }
    }
    report.errors = ex.errors;
    report
}

/// The delivery counts of a queue's messages still present: the report, and every count read.
async fn delivery_counts(
    ex: &mut Examiner<'_>,
    location: &QueueLocation,
    present: &HashSet<&str>,
) -> Option<(DeliveryReport, HashMap<String, u32>)> {
    let (mut counted, total) = match ex.list("delivery counts", &location.deliveries_path).await {
        Ok(Some(listed)) => listed,
        Ok(None) => {
            return Some((DeliveryReport { counted: 0, read: 0, redelivered: 0, most: Vec::new() }, HashMap::new()));
        },
        Err(total) if total >= 0 => {
            let report = DeliveryReport { counted: total, read: 0, redelivered: 0, most: Vec::new() };
            return Some((report, HashMap::new()));
        },
        Err(_) => return None,
    };
    // Counts of messages still in the queue first (the others await the sweeper).
    counted.sort_by_key(|name| (!present.contains(name.as_str()), name.clone()));
    counted.truncate(ex.limits.max_reads);
    let paths = counted.iter().map(|name| format!("{}/{name}", location.deliveries_path)).collect();
    let mut all: HashMap<String, u32> = HashMap::new();
    let mut read = 0;
    ex.read_each("delivery counts", paths, |index, data| {
        if let (Some(name), Some((data, _))) = (counted.get(index), data) {
            read += 1;
            all.insert(name.clone(), read_counter(&data));
        }
    })
    .await;
    let mut most: Vec<Redelivered> = all
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(name, n)| Redelivered { message_id: name.clone(), deliveries: *n })
        .collect();
    most.sort_by(|a, b| b.deliveries.cmp(&a.deliveries).then_with(|| a.message_id.cmp(&b.message_id)));
    let redelivered = most.len();
    most.truncate(LISTED);
    Some((DeliveryReport { counted: total, read, redelivered, most }, all))
}

/// Reads the first `max_reads` nodes in delivery order and checks each is Curator's envelope.
async fn check_envelopes(ex: &mut Examiner<'_>, location: &QueueLocation, order: &[ItemName]) -> EnvelopeReport {
    let names: Vec<&str> = order.iter().take(ex.limits.max_reads).map(|i| i.name.as_str()).collect();
    let paths = names.iter().map(|name| format!("{}/{name}", location.path)).collect();
    let mut report = EnvelopeReport { checked: 0, undecodable: Vec::new(), undecodable_count: 0, multi_item_nodes: 0 };
    ex.read_each("envelopes", paths, |index, data| {
        let (Some(name), Some((data, _))) = (names.get(index), data) else { return };
        report.checked += 1;
        match envelope::decode(&data) {
            Ok(items) if items.len() > 1 => report.multi_item_nodes += 1,
            Ok(_) => {},
            Err(err) => {
                report.undecodable_count += 1;
                if report.undecodable.len() < LISTED {
                    report.undecodable.push(Undecodable { message_id: (*name).to_owned(), reason: err.to_string() });
                }
            },
        }
    })
    .await;
    report
}

/// The first messages in delivery order, each read once.
async fn first_messages(
    ex: &mut Examiner<'_>,
    location: &QueueLocation,
    kind: QueueKind,
    first: &[&ItemName],
    locked_by: &HashMap<String, i64>,
    counts: &HashMap<String, u32>,
) -> Vec<MessageReport> {
    let paths = first.iter().map(|i| format!("{}/{}", location.path, i.name)).collect();
    let now = now_epoch_ms();
    let mut out: Vec<(usize, MessageReport)> = Vec::new();
    ex.read_each("first messages", paths, |index, data| {
        let (Some(item), Some((data, stat))) = (first.get(index), data) else { return };
        let decoded = if kind == QueueKind::Simple { Ok(vec![data.clone()]) } else { envelope::decode(&data) };
        let (items, undecodable, body) = match decoded {
            Ok(bodies) => (Some(bodies.len()), None, bodies.into_iter().next().unwrap_or_default()),
            Err(err) => (None, Some(err.to_string()), data.clone()),
        };
        out.push((
            index,
            MessageReport {
                message_id: item.name.clone(),
                age_ms: (now - stat.ctime).max(0),
                priority: match item.meta {
                    names::ItemMeta::Priority(p) => Some(p),
                    _ => None,
                },
                deliver_at: match item.meta {
                    names::ItemMeta::DeliverAt(at) => Some(at),
                    _ => None,
                },
                id: match &item.meta {
                    names::ItemMeta::Id(id) => Some(id.clone()),
                    _ => None,
                },
                size: data.len(),
                items,
                undecodable,
                locked_by: locked_by.get(&item.name).map(|s| session_hex(*s)),
                deliveries: counts.get(&item.name).copied(),
                body_preview: preview(&body),
            },
        ));
    })
    .await;
    out.sort_by_key(|(index, _)| *index);
    out.into_iter().map(|(_, m)| m).collect()
}

/// The first [`PREVIEW_BYTES`] of a body, printable ASCII as is and anything else escaped.
pub(crate) fn preview(body: &[u8]) -> String {
    let shown: String = body.iter().take(PREVIEW_BYTES).flat_map(|b| b.escape_ascii()).map(char::from).collect();
    if body.len() > PREVIEW_BYTES { format!("{shown}...") } else { shown }
}

/// Whether a child list of this size is beyond what Java clients read by default.
pub(crate) fn over_java_limit(bytes: i64) -> bool {
    bytes > i64::try_from(JUTE_MAXBUFFER_BYTES).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_inferred_from_the_names_curator_writes() {
        let fifo = ["queue-0000000000", "queue-0000000001", "queue-0000000001-0001"];
        assert_eq!(infer_kind(fifo), Some(QueueKind::Fifo));
        // A requeued priority item has a plain name: one priority name decides.
        let priority = ["queue-0000000000", "queue-1000000050000000001", "queue-0FFFFFFFF0000000002"];
        assert_eq!(infer_kind(priority), Some(QueueKind::Priority));
        assert_eq!(infer_kind(["queue-|18BCFE56800|0000000000", "queue-|00000005|0000000001"]), Some(QueueKind::Delay));
        assert_eq!(infer_kind(["queue-|a_b_c|0000000000", "queue-|z|0000000001"]), Some(QueueKind::Id));
        assert_eq!(infer_kind(["qn-0000000000", "qn-0000000007"]), Some(QueueKind::Simple));
        assert_eq!(infer_kind(["lock", "queue-x", "qn-12", "queue-|x|y"]), None, "nothing is an item");
        assert_eq!(infer_kind([]), None);
        // The majority wins over stray nodes of another recipe.
        assert_eq!(infer_kind(["qn-0000000000", "queue-0000000001", "queue-0000000002"]), Some(QueueKind::Fifo));
    }

    #[test]
    fn inference_is_total_on_any_name() {
        use proptest::prelude::*;
        proptest!(crate::test_support::proptest_config(), |(names in proptest::collection::vec(".{0,40}", 0..8))| {
            let _ = infer_kind(names.iter().map(String::as_str));
        });
    }

    #[test]
    fn previews_escape_and_cut() {
        assert_eq!(preview(b"hello"), "hello");
        assert_eq!(preview(&[0, 0x41, 0xff, b'\n']), "\\x00A\\xff\\n");
        assert!(preview(&[b'a'; 100]).ends_with("..."));
        assert_eq!(session_hex(-1), "0xffffffffffffffff");
    }
}
