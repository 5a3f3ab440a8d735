//! The ground floor: the vocabulary every other module speaks, checked once where it enters.
//!
//! Invariant: nothing here imports anything else of zkq, so any module may use these types and
//! no import circle can pass through them.

pub(crate) mod acl;
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

pub use app_url::AppUrl;
pub(crate) use backoff::{Backoff, Retries};
pub use clock::now_epoch_ms;
pub(crate) use layout::Layout;
pub(crate) use nack_mode::NackMode;
pub(crate) use name::{CounterName, MAX_NAME_LEN, NameError, QueueName, name_pattern};
pub use queue_kind::QueueKind;
pub use secret::Secret;
pub(crate) use task::Task;
pub(crate) use traceparent::{MAX_TRACEPARENT_LEN, Traceparent};
pub(crate) use znode::{JUTE_MAXBUFFER_BYTES, refused_char};
