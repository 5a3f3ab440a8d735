//! zkq's test kit: what the integration tests (`tests/it`) and the benchmarks (`benches/`) share.
//! Real ZooKeeper servers on free loopback ports, zkq in-process or as the real binary, Curator as
//! a child process, a ZooKeeper-aware fault proxy, one typed API client, and waiting for
//! conditions instead of sleeping. Nothing here is a mock: every piece drives the real thing.
//!
//! - [`server`]: ZooKeeper servers ([`ZkServer`]) and a direct client to check what zkq wrote.
//! - [`instance`]: [`TestZkq`] (in-process), [`ChildZkq`] (the binary), [`test_config`].
//! - [`api`]: [`Api`], the typed client, and its [`Answer`].
//! - [`proxy`]: [`proxy::ZkProxy`], lost answers and held requests placed by opcode.
//! - [`curator`]: [`Curator`], the real Curator 5.4.0 recipes.
//! - [`wait`]: [`eventually`], a condition awaited instead of a fixed sleep.
//! - [`metrics`], [`load`], [`process`]: Prometheus text, shared workloads, processes and ports.
//! - [`workload`]: the benchmarks' HTTP workloads (puts, drains by take and lease+ack) and their
//!   exactly-once check.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a failed expectation is a failed test")]
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "the kit drives ZooKeeper, HTTP and child processes directly, as a user would"
)]

pub mod api;
pub mod curator;
pub mod instance;
pub mod load;
pub mod metrics;
pub mod process;
pub mod proxy;
pub mod server;
pub mod wait;
pub mod workload;

pub use api::{Answer, Api, raw_request};
pub use curator::{Curator, CuratorChild, hex, unhex};
pub use instance::{ChildZkq, TestZkq, declare, test_config, unique_root};
pub use load::{Confirmed, await_all_processed, body, confirming_putters, restart_zookeeper_during};
pub use metrics::{metric, metric_sum, metric_value, promtool_accepts};
pub use process::{
    exists, free_addr, free_addrs, free_port, process_cpu_time, raise_open_files, repo_file, repo_root, rss_kib,
    spawn_supervised, stable_port, zkq_binary,
};
pub use server::{
    ConnectTarget, JavaTarget, ServerOptions, ZkServer, children, ensemble_classpath, four_letter,
    prepare_idempotency_buckets, zk_client, zookeeper_classpath,
};
pub use wait::eventually;
pub use workload::{
    Endpoint, assert_exactly_once, assert_exactly_these, bench_http, drain_leases, drain_takes, put_batches,
    put_singles,
};
