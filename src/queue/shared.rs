//! What the protocols of one queue share: its [`Context`] and its stateful components (children
//! cache, lease table, idempotency records).
//!
//! The protocols (put, keyed put, take, lease claim, lease steps, browse) are methods of
//! [`Shared`] in their own files. What only the facade needs (who uses the queue, when it was last
//! used, the watches it keeps, its stop token) is not here: it lives in `facade.rs`, private to it.

use std::sync::Arc;

use super::browse::Browse;
use super::cache::ChildrenCache;
use super::context::Context;
use super::lease::Leases;
use super::put::Puts;

/// One queue's context and components, shared by its protocols.
pub(super) struct Shared {
    pub(super) ctx: Arc<Context>,
    pub(super) cache: Arc<ChildrenCache>,
    pub(super) leases: Arc<Leases>,
    pub(super) puts: Arc<Puts>,
    pub(super) browse: Browse,
}
