//! Integration tests against real ZooKeeper servers (Debian's package) and the real Curator jars.
//! One test binary: each module is one area.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "tests drive ZooKeeper and read their environment directly"
)] // a failed expectation is a failed test

mod abandoned;
mod batch;
mod cache;
mod catalog;
mod chaos;
mod claim_bounds;
mod cli;
mod contract;
mod counters;
mod curator;
mod dev;
mod docs;
mod dynamic;
mod ensemble;
mod exactly_once;
mod fleet;
mod groups;
mod hardening;
mod idempotency;
mod lease_evidence;
mod leases;
mod listener_slots;
mod opskit;
mod push;
mod queues;
mod redrive;
mod request_limit;
mod secure;
mod session;
mod shutdown;
mod sqs;
mod weather;
