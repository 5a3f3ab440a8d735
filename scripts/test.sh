#!/usr/bin/env bash
# Installs what the tests need (ZooKeeper, the Curator jars, kazoo, Prometheus) and runs the
# whole suite against real servers. Extra arguments go to `cargo test` (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

ensure_debs zookeeper libcurator-recipes-java libcurator-framework-java python3-kazoo prometheus
bash tests/java/build.sh
# Four test threads on two cores: most tests wait on ZooKeeper, not the CPU.
cargo test --locked --all-targets "$@" -- --test-threads="${ZKQ_TEST_THREADS:-4}"
