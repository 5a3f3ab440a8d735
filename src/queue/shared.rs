//! What the protocols of one queue share: its [`Context`] and its stateful components (children
//! cache, lease table, idempotency records).
//!
//! The protocols (put, keyed put, take, lease claim, lease steps, browse) are methods of
//! [`Shared`] in their own files. What only the facade needs (who uses the queue, when it was last
//! used, the watches it keeps, its stop token) is not here: it lives in `facade.rs`, private to it.

use std::sync::{Arc, Mutex};

use super::cache::ChildrenCache;
use super::context::Context;
use super::idempotency::Idempotency;
use super::lease::Leases;

/// One queue's context and components, shared by its protocols.
pub(super) struct Shared {
    pub(super) ctx: Arc<Context>,
    pub(super) cache: Arc<ChildrenCache>,
    pub(super) leases: Arc<Leases>,
    /// Records of idempotency keys: `{root}/idempotency/{queue}`.
    pub(super) idempotency: Idempotency,
    /// The head seen by the last age reading and since when it waits (epoch ms).
    pub(super) head_seen: Mutex<Option<(String, i64)>>,
}
