//! The test kit, under the name the test modules use.

pub use zkq_testkit::*;
