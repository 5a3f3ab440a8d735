//! Every queue at once, for `GET /v1/queues?all=true`: the open ones from their own state, the
//! others from the survey's summary.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use tokio::time::Instant;

use super::{Detail, QueueLocation, QueueReport, SurveyLimits, examine, locate};
use crate::config::{Config, QueueKind};
use crate::queue::Queue;
use crate::zk::{Zk, ZkError};

/// What [`every_queue`] found of one queue.
pub(crate) enum Surveyed {
    /// A queue this sidecar has open: its own state describes it.
    Open(Arc<Queue>),
    /// A queue read from ZooKeeper (no node created, nothing opened), as zkq serves it: an
    /// undeclared queue is fifo, whatever its names say.
    Read { location: QueueLocation, kind: QueueKind, report: Box<QueueReport> },
}

/// Every queue: the ones `open` holds from their own state, the others read as summaries, at most
/// `in_flight` at a time before `deadline`; and how many were left out (beyond the limits, not
/// read in time, or their read failed). A queue removed since `{root}/queues` was read is left out.
pub(crate) async fn every_queue(
    zk: &Zk,
    config: &Config,
    open: &[Arc<Queue>],
    in_flight: usize,
    deadline: Instant,
) -> Result<(Vec<Surveyed>, usize), ZkError> {
    let limits = SurveyLimits::default();
    let located = locate(zk, config, &limits).await?;
    let open: HashMap<&str, &Arc<Queue>> = open.iter().map(|q| (q.name().as_str(), q)).collect();
    let answers: Vec<Option<Option<Surveyed>>> = futures::stream::iter(located.queues)
        .map(|location| {
            let (open, limits) = (&open, &limits);
            async move {
                if let Some(queue) = open.get(location.name.as_str()) {
                    return Some(Some(Surveyed::Open((*queue).clone())));
                }
                let kind = location.kind.unwrap_or(QueueKind::Fifo);
                let location = QueueLocation { kind: Some(kind), ..location };
                let report = examine(zk, &location, limits, Detail::Summary, deadline).await;
                if !report.errors.is_empty() {
                    // Not read before the deadline, or a read failed.
                    return None;
                }
                Some(report.exists.then_some(Surveyed::Read { location, kind, report: Box::new(report) }))
            }
        })
        .buffered(in_flight)
        .collect()
        .await;
    let late = answers.iter().filter(|answer| answer.is_none()).count();
    Ok((answers.into_iter().flatten().flatten().collect(), located.omitted + late))
}
