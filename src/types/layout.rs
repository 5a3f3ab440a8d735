//! Where zkq keeps its nodes under `zookeeper.root`: the one place these paths are written, so
//! that the tree a Curator application, kazoo or an operator sees is stated here once.
//!
//! ```text
//! {root}/queues/{queue}        a dynamic queue (or a declared one without its own `path`)
//! {root}/locks/{queue}         its lock directory (Curator's lockPath)
//! {root}/deliveries/{queue}    delivery counts of its leased messages
//! {root}/idempotency/{queue}   records of its idempotency keys
//! {root}/claims                claim markers: evidence for transactions whose answer was lost
//! {root}/counters/{counter}    a dynamic counter (Curator SharedCount)
//! ```

/// The paths under one `zookeeper.root`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    root: String,
}

impl Layout {
    pub fn new(root: &str) -> Layout {
        Layout { root: root.to_owned() }
    }

    pub fn root(&self) -> &str {
        &self.root
    }

    /// The parent of dynamic queues.
    pub fn queues(&self) -> String {
        format!("{}/queues", self.root)
    }

    pub fn queue(&self, queue: &str) -> String {
        format!("{}/queues/{queue}", self.root)
    }

    pub fn locks(&self, queue: &str) -> String {
        format!("{}/locks/{queue}", self.root)
    }

    pub fn deliveries(&self, queue: &str) -> String {
        format!("{}/deliveries/{queue}", self.root)
    }

    /// The parent of every queue's idempotency records.
    pub fn idempotency(&self) -> String {
        format!("{}/idempotency", self.root)
    }

    pub fn idempotency_of(&self, queue: &str) -> String {
        format!("{}/idempotency/{queue}", self.root)
    }

    pub fn claims(&self) -> String {
        format!("{}/claims", self.root)
    }

    pub fn counter(&self, counter: &str) -> String {
        format!("{}/counters/{counter}", self.root)
    }
}
