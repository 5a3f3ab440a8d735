//! The state every handler and guard of the native API reaches.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::{Config, Secret};
use crate::door::Door;
use crate::metrics::Metrics;

/// What every handler of the native API can reach: the core's door and the front's own settings.
#[derive(Clone)]
pub(crate) struct AppState {
    pub config: Arc<Config>,
    pub metrics: Arc<Metrics>,
    /// The core: queues, counters, message move tasks, the session's readiness.
    pub door: Door,
    /// Cancelled when shutdown starts: `/readyz` turns 503 at once.
    pub draining: CancellationToken,
    /// The token every API request must carry in `zkq-api-token` (`api.token_file`), if any.
    pub api_token: Option<Arc<Secret>>,
}
