//! The ground floor: the vocabulary every other module speaks, checked once where it enters.
//!
//! Invariant: nothing here imports anything else of zkq, so any module may use these types and
//! no import circle can pass through them.

pub mod acl;
mod app_url;
mod backoff;
mod clock;
mod layout;
mod nack_mode;
mod name;
mod queue_kind;
mod secret;
mod task;
mod traceparent;
mod znode;

pub use app_url::{AppUrl, MAX_PUSH_URL_LEN};
pub use backoff::{Backoff, Retries};
pub use clock::now_epoch_ms;
pub use layout::Layout;
pub use nack_mode::NackMode;
pub use name::{CounterName, MAX_NAME_LEN, NameError, QueueName, name_pattern};
pub use queue_kind::QueueKind;
pub use secret::Secret;
pub use task::Task;
pub use traceparent::{MAX_TRACEPARENT_LEN, Traceparent};
pub use znode::{JUTE_MAXBUFFER_BYTES, refused_char, zookeeper_refuses};
