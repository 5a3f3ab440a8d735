//! Every Prometheus metric zkq exports, registered in one place.
//!
//! Other modules receive an `Arc<Metrics>` and update fields; none of them registers anything.
//! Label values are bounded: `queue` takes only configured names plus at most
//! `max_dynamic_queues` dynamic ones, and everything else is a fixed set.

#![allow(clippy::disallowed_types, reason = "src/metrics/ owns the metrics registry")]

mod push;
mod queue;

#[cfg(test)]
pub(crate) use push::PUSH_OUTCOMES;
pub(crate) use push::{PushMetrics, PushVecs};
use queue::QueueVecs;
pub(crate) use queue::{ClaimOutcome, QueueMetrics};

use crate::types::QueueName;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// The labels of `zkq_zookeeper_connection_state`, one series each.
pub(crate) const CONNECTION_STATES: [&str; 5] = ["connected", "suspended", "reconnected", "lost", "read_only"];

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

    pub shutdown_duration: Histogram,
    pub group_commit_units: Histogram,
    /// The per-queue series (`queue/`).
    pub(crate) queues: QueueVecs,
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
            queues: QueueVecs::register(&reg)?,
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
        self.queues.of(queue)
    }

    /// Drops every per-queue series of `queue` (its queue was closed), so names that come and
    /// go do not grow the export.
    pub fn forget_queue(&self, queue: &QueueName) {
        self.queues.forget(queue);
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
         <!-- Generated by `zkq reference metrics` from src/metrics/; do not edit. -->\n\n\
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
