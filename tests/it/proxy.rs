//! The fault proxy, under the name the test modules use.

pub use zkq_testkit::proxy::*;
