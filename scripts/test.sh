#!/usr/bin/env bash
# Installs what the tests need (ZooKeeper 3.8 and, for the three-server ensemble, ZooKeeper 3.9
# from Debian 13; the Curator jars, kazoo, Prometheus, openssl for the test certificates,
# schemathesis, boto3, Celery and the Rust AWS SDK for the SQS tests, the deploy-check tools) and runs the whole
# suite: the deployment checks, the image built and run (scripts/check-image.sh), then
# `cargo test` against real servers.
#
# Extra arguments go to `cargo test` (e.g. a test name filter), and then only cargo runs: once the
# tools are installed (target/test-tools.stamp records what they were installed from), a filtered
# run skips the installs, the deployment checks, the image and the release build. With no
# arguments (as CI runs it) everything runs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

# What the installs below depend on: when none of it changed since the stamp, they are done.
stamp=target/test-tools.stamp
tools_key=$( (cat scripts/test.sh scripts/lib.sh tests/java/CuratorTool.java tests/sqs/js/package-lock.json \
  tests/sqs/rust/Cargo.lock tests/sqs/rust/Cargo.toml; find tests/sqs/rust/src -type f -print0 | sort -z |
  xargs -0 cat) | sha256sum | cut -c1-16)
cargo_test() {
  # The unit and integration tiers, unless the arguments pick targets themselves (`--lib`, `--test it`).
  local targets=(--lib --bins --tests) cargo_args=() test_args=() seen=false arg
  for arg in "$@"; do
    if $seen; then test_args+=("$arg"); elif [ "$arg" = -- ]; then seen=true; else cargo_args+=("$arg"); fi
    case "$arg" in --lib | --bins | --bin | --bin=* | --test | --test=* | --tests) $seen || targets=() ;; esac
  done
  # Four test threads on two cores: most tests wait on ZooKeeper, not the CPU.
  # The integration tier needs the `integration` feature; ZKQ_INTEGRATION makes the guard in
  # tests/tiers.rs fail should the feature ever be missing.
  # No backtraces: a failing test's own message is what its report must show.
  RUST_BACKTRACE=0 ZKQ_INTEGRATION=1 exec cargo test --locked --features integration "${targets[@]}" "${cargo_args[@]}" \
    -- --test-threads="${ZKQ_TEST_THREADS:-4}" "${test_args[@]}"
}
if [ $# -gt 0 ] && [ "$(cat "$stamp" 2>/dev/null)" = "$tools_key" ]; then
  echo "==> test tools installed ($stamp); only cargo test $*" >&2
  cargo_test "$@"
fi

ensure_debs zookeeper libcurator-recipes-java libcurator-framework-java python3-kazoo prometheus openssl python3-boto3 awscli
bash tests/java/build.sh
ensure_zookeeper_39
# Python tools from PyPI, pinned, in a private virtualenv: schemathesis, and boto3 for the SQS tests.
venv=target/tools-venv
if ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -q "4.32.5"; then
  echo "==> installing schemathesis into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check schemathesis==4.32.5
fi
# boto3 of today speaks SQS's JSON protocol; Debian's python3-boto3 (botocore 1.29), the query protocol.
if ! "$venv/bin/python" -c 'import boto3; assert boto3.__version__ == "1.44.8"' 2>/dev/null; then
  echo "==> installing boto3 into $venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check boto3==1.44.8
fi
# Celery with kombu's SQS transport, for the test of a real worker with zkq as its broker. kombu's
# worker polls through pycurl: its manylinux wheel carries libcurl, so nothing is compiled
# (--only-binary says so rather than trying a build that needs libcurl's headers).
if ! "$venv/bin/python" -c 'import celery, kombu, pycurl
assert (celery.__version__, kombu.__version__) == ("5.7.0", "5.7.0"), "celery"
assert pycurl.version.startswith("PycURL/7.49.0 "), pycurl.version' 2>/dev/null; then
  echo "==> installing celery[sqs] into $venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check --only-binary=pycurl \
    'celery[sqs]==5.7.0' kombu==5.7.0 pycurl==7.49.0 boto3==1.44.8
fi
# The AWS SDK for JavaScript v3 (its SQS client checks every MD5 an answer carries), as its lock file pins it.
js=target/sqs-js
if [ ! -d "$js/node_modules" ] || ! cmp -s tests/sqs/js/package-lock.json "$js/package-lock.json"; then
  echo "==> installing the AWS SDK for JavaScript into $js" >&2
  mkdir -p "$js"
  cp tests/sqs/js/package.json tests/sqs/js/package-lock.json "$js/"
  (cd "$js" && npm ci --no-audit --no-fund --silent)
fi
# The Rust AWS SDK's SQS client (tests/sqs/rust, its own lock file), built apart from zkq.
with_progress target/sqs-rust.log "building the Rust SQS client (target/sqs-rust; the first time a few minutes)" \
  cargo build --locked --manifest-path tests/sqs/rust/Cargo.toml --target-dir target/sqs-rust
echo "$tools_key" > "$stamp"
if [ $# -gt 0 ]; then
  echo "==> tools installed; only cargo test $* (no deployment checks, no image)" >&2
  cargo_test "$@"
fi
# The image: local stand-ins for its base images, podman build of the Dockerfile (skips, saying why,
# where containers cannot run). Its binary is the one check-deploy then checks.
./scripts/check-image.sh --build-only
# Deployment artefacts: Dockerfile, helm charts, rendered manifests (installs its own tools; builds
# target/release/zkq itself when the image could not be built).
if [ -x target/image-check/zkq ]; then
  ZKQ_BIN=target/image-check/zkq ./scripts/check-deploy.sh
else
  ./scripts/check-deploy.sh
fi
# The image run beside ZooKeeper, the demo chart's pod played with podman (check-deploy's renders).
./scripts/check-image.sh
# The release build that dev.sh (the README's first command) makes, made here first, so that the
# test running dev.sh waits for zkq and not for a compiler on a loaded machine.
with_progress target/release-build.log "cargo build --release (the first time 9 to 27 min on 2 cores)" \
  cargo build --release --locked
cargo_test
