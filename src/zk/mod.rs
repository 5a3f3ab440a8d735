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

pub use client::{NodeMode, NodeStat, TreeEvent, TxnError, TxnOp, TxnResult, WatchEvent, Zk, ZkTreeWatch, ZkWatch};
pub use error::ZkError;
pub use group::{Booking, GroupCommit, MAX_BATCH_BYTES, Refusal, Twins};
pub use session::{ConnectionState, SaslCredentials, SessionSettings, SessionSetupError, SessionStatus, ZkSession};
pub use settings::{Secrets, load_secrets, session_settings};
pub use tls::{TlsFileError, TlsMaterial, TlsSettings};
pub use wire::{JUTE_MAX_BUFFER, MAX_REQUEST_BYTES, RequestSizer};
