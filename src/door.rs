//! The core's one door: what every front (the native API, the SQS API, push) holds to reach the
//! queues, the counters and the message move tasks, and to learn whether the ZooKeeper session
//! serves. A front opens a queue only through [`QueueService::queue`], which decides once whether
//! the use may create it ("only writes create"); nothing here speaks HTTP, and no front reaches the
//! session past it.

use std::sync::Arc;

use tokio::time::Instant;

use crate::config::Config;
use crate::counter::CounterService;
use crate::queue::survey::{self, Surveyed};
use crate::queue::tags::QueueTags;
use crate::queue::{QueueError, QueueService};
use crate::redrive::Redrives;
use crate::zk::{ConnectionState, ZkSession};

/// The services of the core, shared by every front.
#[derive(Clone)]
pub(crate) struct Door {
    config: Arc<Config>,
    queues: Arc<QueueService>,
    counters: Arc<CounterService>,
    moves: Arc<Redrives>,
    tags: Arc<QueueTags>,
    session: ZkSession,
}

/// Whether the session serves requests, as the fronts report it (`/readyz`, `zkq_ready`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Readiness {
    /// The connection's state, as `/readyz` names it (`connected`, `suspended`, …).
    pub(crate) state: &'static str,
    /// The current (or last) session's id, `0x…`.
    pub(crate) session: String,
    /// Why requests cannot be served now, or `None` while the session is connected.
    pub(crate) not_serving: Option<String>,
    /// Why the last attempt to open a session failed (a TLS handshake, refused credentials).
    pub(crate) last_error: Option<String>,
}

impl Door {
    pub(crate) fn new(
        config: Arc<Config>,
        queues: Arc<QueueService>,
        counters: Arc<CounterService>,
        moves: Arc<Redrives>,
        tags: Arc<QueueTags>,
        session: ZkSession,
    ) -> Door {
        Door { config, queues, counters, moves, tags, session }
    }

    /// The queues: [`QueueService::queue`] opens one for a use; the rest of its face lists,
    /// makes, deletes and sets queues.
    pub(crate) fn queues(&self) -> &QueueService {
        &self.queues
    }

    /// The shared counters.
    pub(crate) fn counters(&self) -> &CounterService {
        &self.counters
    }

    /// Message move tasks: dead letters moved back at a bounded rate.
    pub(crate) fn moves(&self) -> &Arc<Redrives> {
        &self.moves
    }

    /// The queues' tags, kept in ZooKeeper for every sidecar.
    pub(crate) fn tags(&self) -> &QueueTags {
        &self.tags
    }

    /// Every queue, the open ones from their own state and the others read from ZooKeeper, at most
    /// `in_flight` at a time within the request timeout; and how many were left out.
    pub(crate) async fn survey_every_queue(&self, in_flight: usize) -> Result<(Vec<Surveyed>, usize), QueueError> {
        let deadline = Instant::now() + self.session.request_timeout();
        let zk = self.session.connected(deadline).await?.with_deadline(deadline);
        let open = self.queues.opened();
        Ok(survey::every_queue(&zk, &self.config, &open, in_flight, deadline).await?)
    }

    /// Whether the session serves requests now, and why not.
    pub(crate) fn readiness(&self) -> Readiness {
        let status = self.session.status();
        let session = format!("{:#x}", status.session_id);
        let not_serving = match status.state {
            ConnectionState::Connected | ConnectionState::Reconnected => None,
            ConnectionState::Connecting => Some("no ZooKeeper session yet: connecting".to_owned()),
            ConnectionState::Suspended => {
                Some(format!("ZooKeeper connection suspended (session {session} may still be alive)"))
            },
            ConnectionState::Lost => Some(format!("ZooKeeper session {session} lost; opening a new one")),
            ConnectionState::ReadOnly => Some("connected to a read-only ZooKeeper server".to_owned()),
            ConnectionState::Closed => Some("ZooKeeper session closed".to_owned()),
        };
        Readiness { state: status.state.as_str(), session, not_serving, last_error: self.session.last_error() }
    }
}
