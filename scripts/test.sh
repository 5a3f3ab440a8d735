#!/usr/bin/env bash
# Installs what the tests need (ZooKeeper 3.8 and, for the three-server ensemble, ZooKeeper 3.9
# from Debian 13; the Curator jars, kazoo, Prometheus, openssl for the test certificates,
# schemathesis, the deploy-check tools) and runs the whole suite: the
# deployment checks, the image built and run (scripts/check-image.sh), then `cargo test` against real
# servers. Extra arguments go to `cargo test`
# (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

ensure_debs zookeeper libcurator-recipes-java libcurator-framework-java python3-kazoo prometheus openssl
bash tests/java/build.sh
ensure_zookeeper_39
# Python tools from PyPI, pinned, in a private virtualenv.
venv=target/tools-venv
if ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -q "4.32.5"; then
  echo "==> installing schemathesis into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check schemathesis==4.32.5
fi
# Deployment artefacts: Dockerfile, helm charts, rendered manifests (installs its own tools).
./scripts/check-deploy.sh
# The image built from the Dockerfile and run beside ZooKeeper, the demo chart's pod played with podman
# (reuses check-deploy's renders; skips, saying why, where containers cannot run).
./scripts/check-image.sh
# Four test threads on two cores: most tests wait on ZooKeeper, not the CPU.
# The integration tier needs the `integration` feature; ZKQ_INTEGRATION makes the guard in
# tests/tiers.rs fail should the feature ever be missing.
ZKQ_INTEGRATION=1 cargo test --locked --features integration --lib --bins --tests "$@" -- --test-threads="${ZKQ_TEST_THREADS:-4}"
