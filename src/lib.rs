//! zkq: a sidecar that serves durable, Curator-compatible ZooKeeper queues over HTTP.
//!
//! Data path: `http` (routes, errors) → `queue` (Curator names, envelope, cache, put/take)
//! → `zk` (the supervised session, the only user of the ZooKeeper client crate).
//! `config` is read once and validated before anything starts; `metrics` owns every metric.

pub mod app;
pub mod config;
pub mod counter;
pub mod http;
pub mod metrics;
pub mod queue;
pub mod shutdown;
pub mod supervise;
pub mod zk;
