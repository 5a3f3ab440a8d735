//! The push delivery series (`src/push/`), labelled by queue: only declared queues push, so the
//! set is bounded.

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};

use super::{Metrics, Registrar};
use crate::types::QueueName;

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
    pub(super) fn new(reg: &Registrar<'_>) -> Result<PushVecs, prometheus::Error> {
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
