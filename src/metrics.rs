//! Every Prometheus metric zkq exports, registered in one place.
//!
//! Other modules receive an `Arc<Metrics>` and update fields; none of them registers anything.
//! Label values are bounded: `queue` takes only configured names plus at most
//! `max_dynamic_queues` dynamic ones, and everything else is a fixed set.

#![allow(clippy::disallowed_types, reason = "src/metrics.rs owns the metrics registry")]

use crate::types::{NackMode, QueueName};
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

/// The labels of `zkq_zookeeper_connection_state`, one series each.
pub(crate) const CONNECTION_STATES: [&str; 5] = ["connected", "suspended", "reconnected", "lost", "read_only"];

/// The `outcome` label of `zkq_claim_attempts_total`: how one attempt to claim a candidate ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// Claimed: handed out (taken or leased).
    Won,
    /// Someone else changed or consumed it between the read and the claim.
    Lost,
    /// It was already gone when read.
    Gone,
    /// A consumer held its lock.
    Locked,
}

impl ClaimOutcome {
    /// Every outcome, in the order of the label's series.
    pub const ALL: [ClaimOutcome; 4] =
        [ClaimOutcome::Won, ClaimOutcome::Lost, ClaimOutcome::Gone, ClaimOutcome::Locked];

    pub fn as_str(self) -> &'static str {
        match self {
            ClaimOutcome::Won => "won",
            ClaimOutcome::Lost => "lost",
            ClaimOutcome::Gone => "gone",
            ClaimOutcome::Locked => "locked",
        }
    }
}

/// The `node` label of `zkq_foreign_nodes_total`: which kind of node held what zkq cannot read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForeignNode {
    /// An SQS queue's tags node (`{root}/sqs/tags/{queue}`).
    Tags,
    /// A source queue's message move task node (`{root}/moves/{source}`).
    MoveTask,
}

impl ForeignNode {
    /// Every kind, in the order of the label's series.
    pub const ALL: [ForeignNode; 2] = [ForeignNode::Tags, ForeignNode::MoveTask];

    pub fn as_str(self) -> &'static str {
        match self {
            ForeignNode::Tags => "tags",
            ForeignNode::MoveTask => "move_task",
        }
    }
}

/// Buckets for ZooKeeper round trips and HTTP handling, in seconds.
const LATENCY_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

pub struct Metrics {
    registry: Registry,
    /// Every metric registered below, in registration order (the process collector aside).
    catalogue: Vec<MetricDoc>,

    pub build_info: IntGaugeVec,
    pub ready: IntGauge,
    pub zk_connection_state: IntGaugeVec,
    pub zk_session_expirations: IntCounter,
    pub zk_reconnects: IntCounter,
    pub zk_requests: IntCounterVec,
    pub zk_request_duration: HistogramVec,

    pub http_requests: IntCounterVec,
    pub http_request_duration: HistogramVec,
    pub http_connections_open: IntGaugeVec,
    pub http_connections_reclaimed: IntCounterVec,
    pub sqs_requests: IntCounterVec,
    pub sqs_refused_bodies: IntCounter,
    pub settings_refused: IntCounter,
    foreign_nodes: IntCounterVec,

    pub puts_in_flight: IntGaugeVec,
    pub queue_children: IntGaugeVec,
    pub oldest_message_age: GaugeVec,
    pub groups_in_flight: IntGaugeVec,
    pub group_blocked_messages: IntGaugeVec,
    pub messages_put: IntCounterVec,
    pub messages_taken: IntCounterVec,
    pub waiting_takers: IntGaugeVec,
    pub undecodable_messages: IntCounterVec,
    pub messages_leased: IntCounterVec,
    pub messages_acked: IntCounterVec,
    pub messages_nacked: IntCounterVec,
    pub messages_expired: IntCounterVec,
    pub messages_dead_lettered: IntCounterVec,
    pub leases_extended: IntCounterVec,
    pub leases_in_flight: IntGaugeVec,
    pub fleet_members: IntGaugeVec,
    pub children_reads: IntCounterVec,
    pub watch_events: IntCounterVec,
    pub children_bytes: IntGaugeVec,
    pub claim_attempts: IntCounterVec,
    pub candidates_pruned: IntCounterVec,
    pub put_outcome_unknown: IntCounterVec,
    pub settlements_given_up: IntCounterVec,
    pub idempotent_replays: IntCounterVec,
    pub idempotent_conflicts: IntCounterVec,
    pub idempotency_records: IntGaugeVec,
    pub idempotency_records_swept: IntCounterVec,
    pub shutdown_duration: Histogram,
    pub group_commit_units: Histogram,
    pub counter_operations: IntCounterVec,
    pub counter_waiting_polls: IntGauge,
    pub background_task_restarts: IntCounterVec,
    /// Push delivery (`src/push/`).
    pub push: PushVecs,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// The series of one queue (see [`Metrics::queue`]).
#[derive(Clone)]
pub struct QueueMetrics {
    pub puts_in_flight: IntGauge,
    pub queue_children: IntGauge,
    pub oldest_message_age: Gauge,
    pub children_bytes: IntGauge,
    pub waiting_takers: IntGauge,
    pub leases_in_flight: IntGauge,
    pub fleet_members: IntGauge,
    pub messages_put: IntCounter,
    pub messages_taken: IntCounter,
    pub undecodable_messages: IntCounter,
    pub children_reads: IntCounter,
    pub watch_events: IntCounter,
    pub messages_leased: IntCounter,
    pub messages_acked: IntCounter,
    pub messages_expired: IntCounter,
    pub messages_dead_lettered: IntCounter,
    pub leases_extended: IntCounter,
    pub put_outcome_unknown: IntCounter,
    pub settlements_given_up: IntCounter,
    pub candidates_pruned: IntCounter,
    pub idempotent_replays: IntCounter,
    pub idempotent_conflicts: IntCounter,
    pub idempotency_records: IntGauge,
    pub idempotency_records_swept: IntCounter,
    nacked: [IntCounter; 3],
    claims: [IntCounter; 4],
}

impl QueueMetrics {
    /// `zkq_messages_nacked_total` of `mode`.
    pub fn nacked(&self, mode: NackMode) -> &IntCounter {
        &self.nacked[mode as usize]
    }

    /// `zkq_claim_attempts_total` of `outcome`.
    pub fn claim(&self, outcome: ClaimOutcome) -> &IntCounter {
        &self.claims[outcome as usize]
    }
}

/// Registers each metric the moment it is made, so no second list has to agree with the first,
/// and notes it in the catalogue the metrics reference is printed from.
struct Registrar<'a> {
    registry: &'a Registry,
    catalogue: std::cell::RefCell<Vec<MetricDoc>>,
}

impl Registrar<'_> {
    fn add<M: prometheus::core::Collector + Clone + 'static>(&self, metric: M) -> Result<M, prometheus::Error> {
        self.registry.register(Box::new(metric.clone()))?;
        let labels: Vec<String> = metric.desc().iter().flat_map(|desc| desc.variable_labels.clone()).collect();
        for family in metric.collect() {
            let kind = match family.get_field_type() {
                prometheus::proto::MetricType::COUNTER => "counter",
                prometheus::proto::MetricType::GAUGE => "gauge",
                prometheus::proto::MetricType::HISTOGRAM => "histogram",
                prometheus::proto::MetricType::SUMMARY => "summary",
                prometheus::proto::MetricType::UNTYPED => "untyped",
            };
            let (name, help) = (family.name().to_owned(), family.help().to_owned());
            self.catalogue.borrow_mut().push(MetricDoc { name, kind, labels: labels.clone(), help });
        }
        Ok(metric)
    }
}

/// One metric as the reference lists it: name, type, label names and help text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricDoc {
    pub name: String,
    pub kind: &'static str,
    pub labels: Vec<String>,
    pub help: String,
}

impl Metrics {
    /// Creates and registers every metric. Fails only on a programming error (duplicate name).
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        #[cfg(target_os = "linux")]
        registry.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))?;
        let reg = Registrar { registry: &registry, catalogue: Default::default() };

        let build_info = reg.add(IntGaugeVec::new(
            Opts::new("zkq_build_info", "Always 1; the version label says which zkq is running."),
            &["version"],
        )?)?;
        build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);

        let zk_connection_state = reg.add(IntGaugeVec::new(
            Opts::new(
                "zkq_zookeeper_connection_state",
                "1 for the current ZooKeeper connection state (Curator's model: connected, suspended, reconnected, \
                 lost, read_only), 0 for the others; all 0 before the first session.",
            ),
            &["state"],
        )?)?;
        for state in CONNECTION_STATES {
            zk_connection_state.with_label_values(&[state]).set(0);
        }

        let background_task_restarts = reg.add(IntCounterVec::new(
            Opts::new(
                "zkq_background_task_restarts_total",
                format!(
                    "Background tasks restarted after a panic or an unexpected end, or (lock_watcher) after a panic \
                     before their work was done; anything above 0 is a bug worth reporting. Tasks: {}.",
                    crate::types::Task::ALL.map(|task| task.as_str()).join(", ")
                ),
            ),
            &["task"],
        )?)?;
        for task in crate::types::Task::ALL {
            background_task_restarts.with_label_values(&[task.as_str()]);
        }

        let metrics = Metrics {
            background_task_restarts,
            build_info,
            ready: reg.add(IntGauge::new(
                "zkq_ready",
                "1 while /readyz answers 200 (ZooKeeper session connected, not shutting down), else 0; set at every \
                 scrape.",
            )?)?,
            zk_connection_state,
            zk_session_expirations: reg.add(IntCounter::new(
                "zkq_zookeeper_session_expirations_total",
                "ZooKeeper sessions lost (expired or closed by the server); their ephemeral nodes are gone.",
            )?)?,
            zk_reconnects: reg.add(IntCounter::new(
                "zkq_zookeeper_reconnects_total",
                "Times the connection came back to the same session after a suspension.",
            )?)?,
            zk_requests: reg.add(IntCounterVec::new(
                Opts::new("zkq_zookeeper_requests_total", "ZooKeeper requests by operation and outcome."),
                &["operation", "outcome"],
            )?)?,
            zk_request_duration: reg.add(HistogramVec::new(
                HistogramOpts::new("zkq_zookeeper_request_duration_seconds", "ZooKeeper request latency by operation.")
                    .buckets(LATENCY_BUCKETS.to_vec()),
                &["operation"],
            )?)?,
            http_requests: reg.add(IntCounterVec::new(
                Opts::new("zkq_http_requests_total", "HTTP requests by route template (unmatched for any unknown path), method (the nine standard \
                     ones; other for any other token) and status; status 499 counts requests whose client left \
                     before the answer (what zkq had started still finishes)."),
                &["route", "method", "status"],
            )?)?,
            http_request_duration: reg.add(HistogramVec::new(
                HistogramOpts::new(
                    "zkq_http_request_duration_seconds",
                    "HTTP request latency by route template and method.",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["route", "method"],
            )?)?,
            http_connections_open: reg.add(IntGaugeVec::new(
                Opts::new(
                    "zkq_http_connections_open",
                    "Connections a listener (api, admin, sqs) is serving now: each holds one of its \
                     max_connections slots.",
                ),
                &["listener"],
            )?)?,
            http_connections_reclaimed: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_http_connections_reclaimed_total",
                    "Connections a listener closed to give their slot to a new connection while all \
                     max_connections were held, by state: silent (no byte sent yet), head (a request head begun \
                     and not finished), idle (between requests after a response). A connection with a request \
                     in flight is never reclaimed.",
                ),
                &["listener", "state"],
            )?)?,
            sqs_requests: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_sqs_requests_total",
                    "Requests to the SQS-compatible listener by action (`other` for actions zkq does not serve, and \
                     requests refused for their signature) and outcome (`ok`, or the SQS error code answered).",
                ),
                &["action", "code"],
            )?)?,
            sqs_refused_bodies: reg.add(IntCounter::new(
                "zkq_sqs_refused_bodies_total",
                "Messages ReceiveMessage did not hand out because their body is not SQS text, on a queue whose \
                 sqs_binary_bodies is `refuse` (each was released at once for other consumers).",
            )?)?,
            settings_refused: reg.add(IntCounter::new(
                "zkq_queue_settings_refused_total",
                "Reads of a dynamic queue's settings node that did not hold valid settings (written by another \
                 client); the queue was served with the defaults meanwhile.",
            )?)?,
            foreign_nodes: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_foreign_nodes_total",
                    "Reads of a node zkq keeps that held what zkq cannot read (written by another client), by node: \
                     tags (an SQS queue's tags, listed as none and written over by the next TagQueue or UntagQueue), \
                     move_task (a source queue's move task node, replaced by the next task started for it).",
                ),
                &["node"],
            )?)?,
            puts_in_flight: reg.add(IntGaugeVec::new(
                Opts::new("zkq_puts_in_flight", "Curator's putCount: puts started and not yet confirmed by ZooKeeper."),
                &["queue"],
            )?)?,
            queue_children: reg.add(IntGaugeVec::new(
                Opts::new(
                    "zkq_queue_children",
                    "Children of the queue node (its depth, foreign nodes included): read at every scrape (one exists per \
                     open queue, all at once, within 1 s; a queue whose read fails keeps its last value) and kept \
                     current from events in between.",
                ),
                &["queue"],
            )?)?,
            oldest_message_age: reg.add(GaugeVec::new(
                Opts::new(
                    "zkq_queue_oldest_message_age_seconds",
                    "How long the next message to deliver (due, not locked) has waited (since its creation, or since it \
                     became due in a delay queue); 0 when none is waiting. Read at every scrape, with one exists of \
                     the head when it changed since the last scrape.",
                ),
                &["queue"],
            )?)?,
            groups_in_flight: reg.add(IntGaugeVec::new(
                Opts::new(
                    "zkq_queue_groups_in_flight",
                    "Grouped queues only: groups whose first message is being consumed (leased, or being taken), as \
                     this zkq sees the queue: set at every scrape.",
                ),
                &["queue"],
            )?)?,
            group_blocked_messages: reg.add(IntGaugeVec::new(
                Opts::new(
                    "zkq_queue_group_blocked_messages",
                    "Grouped queues only: messages that wait behind their group's first message while it is being \
                     consumed (not deliverable before it is acked or released): set at every scrape.",
                ),
                &["queue"],
            )?)?,
            messages_put: reg.add(IntCounterVec::new(
                Opts::new("zkq_messages_put_total", "Messages stored in ZooKeeper by a put."),
                &["queue"],
            )?)?,
            messages_taken: reg.add(IntCounterVec::new(
                Opts::new("zkq_messages_taken_total", "Messages removed from the queue and handed out by a take."),
                &["queue"],
            )?)?,
            waiting_takers: reg.add(IntGaugeVec::new(
                Opts::new("zkq_waiting_takers", "Long-polls (takes, leases, push workers) currently waiting for a message."),
                &["queue"],
            )?)?,
            undecodable_messages: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_undecodable_messages_total",
                    "queue- nodes skipped because they do not hold Curator's envelope (never deleted).",
                ),
                &["queue"],
            )?)?,
            messages_leased: reg.add(IntCounterVec::new(
                Opts::new("zkq_messages_leased_total", "Messages handed out under a lease (deliveries)."),
                &["queue"],
            )?)?,
            messages_acked: reg.add(IntCounterVec::new(
                Opts::new("zkq_messages_acked_total", "Leased messages acknowledged and removed."),
                &["queue"],
            )?)?,
            messages_nacked: reg.add(IntCounterVec::new(
                Opts::new("zkq_messages_nacked_total", "Leased messages nacked, by mode (requeue, delete, keep)."),
                &["queue", "mode"],
            )?)?,
            messages_expired: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_messages_expired_total",
                    "Leases whose visibility timeout passed; their messages are delivered again.",
                ),
                &["queue"],
            )?)?,
            messages_dead_lettered: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_messages_dead_lettered_total",
                    "Messages moved to the dead-letter queue (past max_deliveries, or undecodable).",
                ),
                &["queue"],
            )?)?,
            leases_extended: reg.add(IntCounterVec::new(
                Opts::new("zkq_leases_extended_total", "Lease extensions (heartbeats)."),
                &["queue"],
            )?)?,
            leases_in_flight: reg.add(IntGaugeVec::new(
                Opts::new("zkq_leases_in_flight", "Leases held by this zkq: messages being processed."),
                &["queue"],
            )?)?,
            fleet_members: reg.add(IntGaugeVec::new(
                Opts::new(
                    "zkq_queue_fleet_members",
                    "Sidecars taking from the queue, as this zkq sees them, while it is one of them: each new \
                     message is claimed first by one of them (its owner), the others only after a grace. 0 while \
                     this zkq has no taker there, or is the only one.",
                ),
                &["queue"],
            )?)?,
            children_reads: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_queue_children_reads_total",
                    "Full getChildren reads of a queue (cache refreshes): one per (re)connection and one a minute as a \
                     backstop; events keep the cache current in between. Compare with messages taken.",
                ),
                &["queue"],
            )?)?,
            watch_events: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_queue_watch_events_total",
                    "Events of a queue's children and locks this zkq received from ZooKeeper. With \
                     queues_watch_on_demand a zkq watches a queue only while it has a taker there (and for 30 s \
                     after): one that only puts receives none.",
                ),
                &["queue"],
            )?)?,
            children_bytes: reg.add(IntGaugeVec::new(
                Opts::new(
                    "zkq_queue_children_bytes",
                    "Size in bytes of the queue's child list as a getChildren reply (4 + name length per child); \
                     Curator's consumers fail once it exceeds jute.maxbuffer (1 MiB by default).",
                ),
                &["queue"],
            )?)?,
            claim_attempts: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_claim_attempts_total",
                    "Claims of a candidate by takes and leases, by outcome: won, lost (another consumer changed \
                     it first), gone (already removed), locked (a consumer holds its lock).",
                ),
                &["queue", "outcome"],
            )?)?,
            candidates_pruned: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_queue_candidates_pruned_total",
                    "Cached candidates dropped because a ZooKeeper event said another consumer removed or locked \
                     them (each one a claim not tried).",
                ),
                &["queue"],
            )?)?,
            put_outcome_unknown: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_put_outcome_unknown_total",
                    "Puts answered 504 outcome_unknown: the connection dropped mid-request and the outcome could not be \
                     determined.",
                ),
                &["queue"],
            )?)?,
            settlements_given_up: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_settlements_given_up_total",
                    "Lost answers of a take or a put-back that zkq stopped settling because ZooKeeper could not be asked \
                     before a missing claim marker stopped proving anything (take.claim_marker_age): a message may be \
                     lost.",
                ),
                &["queue"],
            )?)?,
            idempotent_replays: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_idempotent_replays_total",
                    "Puts answered with the message an earlier put with the same Idempotency-Key stored (nothing new stored).",
                ),
                &["queue"],
            )?)?,
            idempotent_conflicts: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_idempotent_conflicts_total",
                    "Puts refused (409 idempotency_key_reused): their Idempotency-Key was used within the window for a \
                     different body, priority or id.",
                ),
                &["queue"],
            )?)?,
            idempotency_records: reg.add(IntGaugeVec::new(
                Opts::new(
                    "zkq_idempotency_records",
                    "Idempotency-key records of the queue in ZooKeeper (expired ones not yet swept included), read at \
                     every scrape.",
                ),
                &["queue"],
            )?)?,
            idempotency_records_swept: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_idempotency_records_swept_total",
                    "Expired idempotency-key records deleted by this zkq's sweeper of the queue (records of queues it does \
                     not have open are swept too, and logged, not counted).",
                ),
                &["queue"],
            )?)?,
            counter_operations: reg.add(IntCounterVec::new(
                Opts::new("zkq_counter_operations_total", "Shared counter operations by operation and outcome."),
                &["operation", "outcome"],
            )?)?,
            counter_waiting_polls: reg.add(IntGauge::new(
                "zkq_shared_count_polls_waiting",
                "Counter long-polls (GET with wait and after_version) waiting for a change.",
            )?)?,
            shutdown_duration: reg.add(Histogram::with_opts(
                HistogramOpts::new("zkq_shutdown_duration_seconds", "Time the last graceful shutdown took.")
                    .buckets(vec![0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0]),
            )?)?,
            group_commit_units: reg.add(Histogram::with_opts(
                HistogramOpts::new(
                    "zkq_group_commit_units",
                    "Writes (a put, a batch put, an ack or nack) sent to ZooKeeper together in one transaction: _count is \
                     transactions, _sum writes.",
                )
                .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1000.0]),
            )?)?,
            push: PushVecs::new(&reg)?,
            catalogue: reg.catalogue.take(),
            registry,
        };
        for node in ForeignNode::ALL {
            metrics.foreign_node(node);
        }
        Ok(metrics)
    }

    /// `zkq_foreign_nodes_total` of `node`.
    pub fn foreign_node(&self, node: ForeignNode) -> IntCounter {
        self.foreign_nodes.with_label_values(&[node.as_str()])
    }

    /// The series of `queue`, resolved once when the queue opens; each exists (at 0) from then
    /// on, so `rate()` and absent-series alerts work before the first event.
    pub fn queue(&self, queue: &QueueName) -> QueueMetrics {
        let queue = queue.as_str();
        let q = &[queue];
        QueueMetrics {
            puts_in_flight: self.puts_in_flight.with_label_values(q),
            queue_children: self.queue_children.with_label_values(q),
            oldest_message_age: self.oldest_message_age.with_label_values(q),
            children_bytes: self.children_bytes.with_label_values(q),
            waiting_takers: self.waiting_takers.with_label_values(q),
            leases_in_flight: self.leases_in_flight.with_label_values(q),
            fleet_members: self.fleet_members.with_label_values(q),
            messages_put: self.messages_put.with_label_values(q),
            messages_taken: self.messages_taken.with_label_values(q),
            undecodable_messages: self.undecodable_messages.with_label_values(q),
            children_reads: self.children_reads.with_label_values(q),
            watch_events: self.watch_events.with_label_values(q),
            messages_leased: self.messages_leased.with_label_values(q),
            messages_acked: self.messages_acked.with_label_values(q),
            messages_expired: self.messages_expired.with_label_values(q),
            messages_dead_lettered: self.messages_dead_lettered.with_label_values(q),
            leases_extended: self.leases_extended.with_label_values(q),
            put_outcome_unknown: self.put_outcome_unknown.with_label_values(q),
            settlements_given_up: self.settlements_given_up.with_label_values(q),
            candidates_pruned: self.candidates_pruned.with_label_values(q),
            idempotent_replays: self.idempotent_replays.with_label_values(q),
            idempotent_conflicts: self.idempotent_conflicts.with_label_values(q),
            idempotency_records: self.idempotency_records.with_label_values(q),
            idempotency_records_swept: self.idempotency_records_swept.with_label_values(q),
            nacked: NackMode::ALL.map(|mode| self.messages_nacked.with_label_values(&[queue, mode.as_str()])),
            claims: ClaimOutcome::ALL.map(|outcome| self.claim_attempts.with_label_values(&[queue, outcome.as_str()])),
        }
    }

    /// Drops every per-queue series of `queue` (its queue was closed), so names that come and
    /// go do not grow the export.
    pub fn forget_queue(&self, queue: &QueueName) {
        let queue = queue.as_str();
        for gauge in [
            &self.puts_in_flight,
            &self.queue_children,
            &self.waiting_takers,
            &self.leases_in_flight,
            &self.fleet_members,
            &self.children_bytes,
            &self.idempotency_records,
            &self.groups_in_flight,
            &self.group_blocked_messages,
        ] {
            let _ = gauge.remove_label_values(&[queue]);
        }
        let _ = self.oldest_message_age.remove_label_values(&[queue]);
        for counter in self.queue_counters() {
            let _ = counter.remove_label_values(&[queue]);
        }
        let _ = self.candidates_pruned.remove_label_values(&[queue]);
        for mode in NackMode::ALL {
            let _ = self.messages_nacked.remove_label_values(&[queue, mode.as_str()]);
        }
        for outcome in ClaimOutcome::ALL {
            let _ = self.claim_attempts.remove_label_values(&[queue, outcome.as_str()]);
        }
    }

    fn queue_counters(&self) -> [&IntCounterVec; 15] {
        [
            &self.messages_put,
            &self.messages_taken,
            &self.undecodable_messages,
            &self.messages_leased,
            &self.messages_acked,
            &self.messages_expired,
            &self.messages_dead_lettered,
            &self.leases_extended,
            &self.children_reads,
            &self.watch_events,
            &self.put_outcome_unknown,
            &self.settlements_given_up,
            &self.idempotent_replays,
            &self.idempotent_conflicts,
            &self.idempotency_records_swept,
        ]
    }

    /// Sets the connection-state gauge: 1 for `current` (if any), 0 for every other state.
    pub fn set_connection_state(&self, current: Option<&str>) {
        for state in CONNECTION_STATES {
            self.zk_connection_state.with_label_values(&[state]).set(i64::from(Some(state) == current));
        }
    }

    /// Every metric zkq registers (the standard `process_*` metrics aside), in registration order.
    pub fn catalogue(&self) -> &[MetricDoc] {
        &self.catalogue
    }

    /// Renders the Prometheus text exposition format.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        String::from_utf8(buf).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}

/// The metrics reference page (`docs/reference/metrics.md`), as `zkq reference metrics` prints it.
pub(crate) fn metrics_markdown() -> Result<String, prometheus::Error> {
    let metrics = Metrics::new()?;
    let mut catalogue = metrics.catalogue().to_vec();
    catalogue.sort_by(|a, b| a.name.cmp(&b.name));
    let mut page = String::from(
        "# Metrics\n\n\
         <!-- Generated by `zkq reference metrics` from src/metrics.rs; do not edit. -->\n\n\
         The admin listener serves these on `GET /metrics` (Prometheus text format), beside the standard \
         `process_*` metrics. Label values are bounded: `queue` takes declared names and at most \
         `max_dynamic_queues` dynamic ones, every other label a fixed set. Every per-queue series (counters, \
         gauges, each nack `mode`, each claim `outcome`) exists at 0 from the moment the queue opens (declared \
         queues: at start), so `rate()` and absent-series alerts work before the first event; a dynamic queue \
         that closes drops its series. The [runbook](../operations.md) says which alert watches what.\n\n\
         | metric | type | labels | meaning |\n| --- | --- | --- | --- |\n",
    );
    for metric in catalogue {
        let labels = metric.labels.iter().map(|label| format!("`{label}`")).collect::<Vec<_>>().join(", ");
        let help = metric.help.replace('|', "\\|");
        page.push_str(&format!("| `{}` | {} | {labels} | {help} |\n", metric.name, metric.kind));
    }
    Ok(page)
}

/// A gauge held up while a value lives: `inc` now, `dec` on drop (also when a handler is dropped).
pub(crate) struct GaugeGuard(IntGauge);

impl GaugeGuard {
    pub(crate) fn new(gauge: IntGauge) -> GaugeGuard {
        gauge.inc();
        GaugeGuard(gauge)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The `outcome` labels of `zkq_push_deliveries_total` (`push::Outcome::as_str`).
pub(crate) const PUSH_OUTCOMES: [&str; 10] = [
    "success",
    "drop",
    "retry",
    "retry_after",
    "rejected",
    "server_error",
    "timeout",
    "unreachable",
    "lease_lost",
    "released",
];

/// The `outcome` labels of `zkq_push_app_probes_total`.
pub(crate) const PUSH_PROBE_OUTCOMES: [&str; 2] = ["up", "down"];

/// Buckets for a delivery to the app, which may work for a while: seconds.
const PUSH_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

/// The push delivery metrics, labelled by queue (only declared queues push, so the set is bounded).
pub struct PushVecs {
    pub deliveries: IntCounterVec,
    pub delivery_duration: HistogramVec,
    pub in_flight: IntGaugeVec,
    pub app_available: IntGaugeVec,
    pub app_probes: IntCounterVec,
}

impl PushVecs {
    fn new(reg: &Registrar<'_>) -> Result<PushVecs, prometheus::Error> {
        Ok(PushVecs {
            deliveries: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_push_deliveries_total",
                    "Deliveries pushed to the app, by how they ended: success, drop, retry (Dapr's RETRY or an unknown \
                     status), retry_after (429 or 503 with Retry-After), rejected (another status below 500), \
                     server_error (5xx), timeout, unreachable (a refused or broken connection), lease_lost (the \
                     lease ended first, e.g. the session was lost), released (at shutdown).",
                ),
                &["queue", "outcome"],
            )?)?,
            delivery_duration: reg.add(HistogramVec::new(
                HistogramOpts::new(
                    "zkq_push_delivery_duration_seconds",
                    "Time from sending a delivery to the app to its complete answer.",
                )
                .buckets(PUSH_BUCKETS.to_vec()),
                &["queue"],
            )?)?,
            in_flight: reg.add(IntGaugeVec::new(
                Opts::new(
                    "zkq_push_in_flight",
                    "Deliveries leased and not yet settled (at most the concurrency; a message waiting out its \
                     backoff counts).",
                ),
                &["queue"],
            )?)?,
            app_available: reg.add(IntGaugeVec::new(
                Opts::new(
                    "zkq_push_app_available",
                    "1 while the app can be reached (and answers its readiness URL, if one is set), else 0.",
                ),
                &["queue"],
            )?)?,
            app_probes: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_push_app_probes_total",
                    "Connection attempts and readiness probes to the app, by outcome (up, down).",
                ),
                &["queue", "outcome"],
            )?)?,
        })
    }
}

/// The push series of one queue, resolved once when its subscription starts; each exists at 0
/// from then on.
#[derive(Clone)]
pub struct PushMetrics {
    pub delivery_duration: Histogram,
    pub in_flight: IntGauge,
    pub app_available: IntGauge,
    pub probes_up: IntCounter,
    pub probes_down: IntCounter,
    deliveries: [IntCounter; 10],
}

impl PushMetrics {
    /// `zkq_push_deliveries_total` of an outcome in [`PUSH_OUTCOMES`].
    pub fn delivered(&self, outcome: &str) -> &IntCounter {
        let index = PUSH_OUTCOMES.iter().position(|o| *o == outcome).unwrap_or(0);
        &self.deliveries[index]
    }
}

impl Metrics {
    /// The push series of `queue`.
    pub fn push(&self, queue: &QueueName) -> PushMetrics {
        let queue = queue.as_str();
        let q = &[queue];
        let probes = &self.push.app_probes;
        PushMetrics {
            delivery_duration: self.push.delivery_duration.with_label_values(q),
            in_flight: self.push.in_flight.with_label_values(q),
            app_available: self.push.app_available.with_label_values(q),
            probes_up: probes.with_label_values(&[queue, PUSH_PROBE_OUTCOMES[0]]),
            probes_down: probes.with_label_values(&[queue, PUSH_PROBE_OUTCOMES[1]]),
            deliveries: PUSH_OUTCOMES.map(|outcome| self.push.deliveries.with_label_values(&[queue, outcome])),
        }
    }
}
