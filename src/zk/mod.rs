//! Everything that touches the ZooKeeper client crate: the supervised session, calls with
//! deadlines, the classification of errors, and the session's settings from the configuration. No other module imports `zookeeper_client`.

#![allow(clippy::disallowed_types, clippy::disallowed_methods, reason = "src/zk/ owns the ZooKeeper client")]

mod client;
mod error;
mod group;
mod session;
mod settings;
mod tls;
mod wire;

pub(crate) use client::{NodeMode, NodeStat, TreeEvent, TxnError, TxnOp, TxnResult, WatchEvent, Zk, ZkTreeWatch};
pub(crate) use error::ZkError;
pub(crate) use group::{Booking, GroupCommit, MAX_BATCH_BYTES, Refusal, Twins};
pub(crate) use session::SaslCredentials;
pub use session::{ConnectionState, SessionSettings, SessionStatus, ZkSession};
pub use settings::load_secrets;
pub(crate) use settings::session_settings;
pub(crate) use tls::{TlsMaterial, TlsSettings};
pub use wire::max_request_bytes;
