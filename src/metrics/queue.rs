//! The per-queue series: one vector of each, labelled by queue, and [`QueueMetrics`], one
//! queue's series resolved once when it opens.

use prometheus::{Gauge, GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};

use super::Registrar;
use crate::types::{NackMode, QueueName};

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

/// Every per-queue metric, labelled by `queue` (declared queues and at most
/// `max_dynamic_queues` dynamic ones).
pub(crate) struct QueueVecs {
    /// What moves through the queue: depth, puts, deliveries, leases, members.
    pub(crate) flow: FlowVecs,
    /// What it costs: the cache's reads and events, claims, settlements, idempotency records.
    pub(crate) work: WorkVecs,
}

pub(crate) struct FlowVecs {
    pub(crate) puts_in_flight: IntGaugeVec,
    pub(crate) queue_children: IntGaugeVec,
    pub(crate) oldest_message_age: GaugeVec,
    pub(crate) groups_in_flight: IntGaugeVec,
    pub(crate) group_blocked_messages: IntGaugeVec,
    pub(crate) messages_put: IntCounterVec,
    pub(crate) messages_taken: IntCounterVec,
    pub(crate) waiting_takers: IntGaugeVec,
    pub(crate) undecodable_messages: IntCounterVec,
    pub(crate) messages_leased: IntCounterVec,
    pub(crate) messages_acked: IntCounterVec,
    pub(crate) messages_nacked: IntCounterVec,
    pub(crate) messages_expired: IntCounterVec,
    pub(crate) messages_dead_lettered: IntCounterVec,
    pub(crate) messages_past_retention: IntCounterVec,
    pub(crate) leases_extended: IntCounterVec,
    pub(crate) leases_in_flight: IntGaugeVec,
    pub(crate) fleet_members: IntGaugeVec,
    pub(crate) fleet_standby: IntGaugeVec,
    pub(crate) watched: IntGaugeVec,
    pub(crate) help_calls: IntCounterVec,
}

impl FlowVecs {
    fn register(reg: &Registrar<'_>) -> Result<FlowVecs, prometheus::Error> {
        Ok(FlowVecs {
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
            messages_past_retention: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_messages_past_retention_total",
                    "Messages deleted because they were older than the queue's retention (never delivered).",
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
            fleet_standby: reg.add(IntGaugeVec::new(
                Opts::new(
                    "zkq_queue_fleet_standby",
                    "1 while this zkq stands by in the queue's fleet: other members watch the queue and own its \
                     new messages (queues_fleet_watchers), and its takers wait for a call for help or the end of \
                     their wait, when they read the queue once.",
                ),
                &["queue"],
            )?)?,
            watched: reg.add(IntGaugeVec::new(
                Opts::new(
                    "zkq_queue_watched",
                    "1 while this zkq watches the queue's children (and receives an event for each change there); \
                     0 while nobody here needs it (queues_watch_on_demand) or this zkq stands by in its fleet.",
                ),
                &["queue"],
            )?)?,
            help_calls: reg.add(IntCounterVec::new(
                Opts::new(
                    "zkq_queue_fleet_help_calls_total",
                    "Calls for help this zkq made to the queue's fleet: messages it owns waited unclaimed at two \
                     looks a second apart (a backlog), and every member watched the queue until none did for 5 s.",
                ),
                &["queue"],
            )?)?,
        })
    }
}

pub(crate) struct WorkVecs {
    pub(crate) children_reads: IntCounterVec,
    pub(crate) watch_events: IntCounterVec,
    pub(crate) children_bytes: IntGaugeVec,
    pub(crate) claim_attempts: IntCounterVec,
    pub(crate) candidates_pruned: IntCounterVec,
    pub(crate) put_outcome_unknown: IntCounterVec,
    pub(crate) settlements_given_up: IntCounterVec,
    pub(crate) idempotent_replays: IntCounterVec,
    pub(crate) idempotent_conflicts: IntCounterVec,
    pub(crate) idempotency_records: IntGaugeVec,
    pub(crate) idempotency_records_swept: IntCounterVec,
}

impl WorkVecs {
    fn register(reg: &Registrar<'_>) -> Result<WorkVecs, prometheus::Error> {
        Ok(WorkVecs {
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
        })
    }
}

impl QueueVecs {
    pub(super) fn register(reg: &Registrar<'_>) -> Result<QueueVecs, prometheus::Error> {
        // In this order: the reference lists metrics as they are registered.
        Ok(QueueVecs { flow: FlowVecs::register(reg)?, work: WorkVecs::register(reg)? })
    }

    /// The series of `queue`, each at 0 from now on.
    pub(super) fn of(&self, queue: &QueueName) -> QueueMetrics {
        let queue = queue.as_str();
        let q = &[queue];
        QueueMetrics {
            puts_in_flight: self.flow.puts_in_flight.with_label_values(q),
            queue_children: self.flow.queue_children.with_label_values(q),
            oldest_message_age: self.flow.oldest_message_age.with_label_values(q),
            children_bytes: self.work.children_bytes.with_label_values(q),
            waiting_takers: self.flow.waiting_takers.with_label_values(q),
            leases_in_flight: self.flow.leases_in_flight.with_label_values(q),
            fleet_members: self.flow.fleet_members.with_label_values(q),
            fleet_standby: self.flow.fleet_standby.with_label_values(q),
            watched: self.flow.watched.with_label_values(q),
            help_calls: self.flow.help_calls.with_label_values(q),
            messages_put: self.flow.messages_put.with_label_values(q),
            messages_taken: self.flow.messages_taken.with_label_values(q),
            undecodable_messages: self.flow.undecodable_messages.with_label_values(q),
            children_reads: self.work.children_reads.with_label_values(q),
            watch_events: self.work.watch_events.with_label_values(q),
            messages_leased: self.flow.messages_leased.with_label_values(q),
            messages_acked: self.flow.messages_acked.with_label_values(q),
            messages_expired: self.flow.messages_expired.with_label_values(q),
            messages_dead_lettered: self.flow.messages_dead_lettered.with_label_values(q),
            messages_past_retention: self.flow.messages_past_retention.with_label_values(q),
            leases_extended: self.flow.leases_extended.with_label_values(q),
            put_outcome_unknown: self.work.put_outcome_unknown.with_label_values(q),
            settlements_given_up: self.work.settlements_given_up.with_label_values(q),
            candidates_pruned: self.work.candidates_pruned.with_label_values(q),
            idempotent_replays: self.work.idempotent_replays.with_label_values(q),
            idempotent_conflicts: self.work.idempotent_conflicts.with_label_values(q),
            idempotency_records: self.work.idempotency_records.with_label_values(q),
            idempotency_records_swept: self.work.idempotency_records_swept.with_label_values(q),
            nacked: NackMode::ALL.map(|mode| self.flow.messages_nacked.with_label_values(&[queue, mode.as_str()])),
            claims: ClaimOutcome::ALL
                .map(|outcome| self.work.claim_attempts.with_label_values(&[queue, outcome.as_str()])),
        }
    }

    /// Drops every series of `queue`.
    pub(super) fn forget(&self, queue: &QueueName) {
        let queue = queue.as_str();
        for gauge in [
            &self.flow.puts_in_flight,
            &self.flow.queue_children,
            &self.flow.waiting_takers,
            &self.flow.leases_in_flight,
            &self.flow.fleet_members,
            &self.flow.fleet_standby,
            &self.flow.watched,
            &self.work.children_bytes,
            &self.work.idempotency_records,
            &self.flow.groups_in_flight,
            &self.flow.group_blocked_messages,
        ] {
            let _ = gauge.remove_label_values(&[queue]);
        }
        let _ = self.flow.oldest_message_age.remove_label_values(&[queue]);
        for counter in self.counters() {
            let _ = counter.remove_label_values(&[queue]);
        }
        let _ = self.work.candidates_pruned.remove_label_values(&[queue]);
        for mode in NackMode::ALL {
            let _ = self.flow.messages_nacked.remove_label_values(&[queue, mode.as_str()]);
        }
        for outcome in ClaimOutcome::ALL {
            let _ = self.work.claim_attempts.remove_label_values(&[queue, outcome.as_str()]);
        }
    }

    fn counters(&self) -> [&IntCounterVec; 17] {
        [
            &self.flow.help_calls,
            &self.flow.messages_put,
            &self.flow.messages_taken,
            &self.flow.undecodable_messages,
            &self.flow.messages_leased,
            &self.flow.messages_acked,
            &self.flow.messages_expired,
            &self.flow.messages_dead_lettered,
            &self.flow.messages_past_retention,
            &self.flow.leases_extended,
            &self.work.children_reads,
            &self.work.watch_events,
            &self.work.put_outcome_unknown,
            &self.work.settlements_given_up,
            &self.work.idempotent_replays,
            &self.work.idempotent_conflicts,
            &self.work.idempotency_records_swept,
        ]
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
    pub fleet_standby: IntGauge,
    pub watched: IntGauge,
    pub help_calls: IntCounter,
    pub messages_put: IntCounter,
    pub messages_taken: IntCounter,
    pub undecodable_messages: IntCounter,
    pub children_reads: IntCounter,
    pub watch_events: IntCounter,
    pub messages_leased: IntCounter,
    pub messages_acked: IntCounter,
    pub messages_expired: IntCounter,
    pub messages_dead_lettered: IntCounter,
    pub messages_past_retention: IntCounter,
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
