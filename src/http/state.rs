//! The state every handler and guard reaches.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::{Config, Secret, SqsKeyPair};
use crate::counter::CounterService;
use crate::metrics::Metrics;
use crate::queue::QueueService;
use crate::zk::ZkSession;

/// What every handler can reach.
#[derive(Clone)]
pub(crate) struct AppState {
    pub config: Arc<Config>,
    pub session: ZkSession,
    pub metrics: Arc<Metrics>,
    pub queues: Arc<QueueService>,
    pub counters: Arc<CounterService>,
    /// Message move tasks (dead letters moved back).
    pub redrives: Arc<crate::redrive::Redrives>,
    /// Cancelled when shutdown starts: `/readyz` turns 503 at once.
    pub draining: CancellationToken,
    /// The token every API request must carry in `zkq-api-token` (`api.token_file`), if any.
    pub api_token: Option<Arc<Secret>>,
    /// The key pair SQS requests must be signed with (`sqs.access_key_id`), if any.
    pub sqs_key_pair: Option<Arc<SqsKeyPair>>,
}
