#!/usr/bin/env bash
# Runs zkq for real. Without ZKQ__ZOOKEEPER__CONNECT or --zk-connect it installs Debian's ZooKeeper
# if needed and starts a private standalone server on loopback (data under target/dev-zookeeper);
# Ctrl-C stops zkq and that server. Extra arguments go to zkq (e.g. --config zkq.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

external=false
[ -n "${ZKQ__ZOOKEEPER__CONNECT:-}" ] && external=true
for arg in "$@"; do [[ "$arg" == --zk-connect* ]] && external=true; done

echo "==> building zkq (release)" >&2
cargo build --release --locked --quiet

if $external; then
  exec target/release/zkq "$@"
fi

ensure_debs zookeeper
port=2181
dir="$PWD/target/dev-zookeeper"
if ! python3 -c "import socket,sys; s=socket.socket(); s.bind(('127.0.0.1', $port))" 2>/dev/null; then
  # 2181 is taken (another dev.sh, or a system ZooKeeper): a private server on another port and dir.
  port=$(free_port)
  dir="$PWD/target/dev-zookeeper-$port"
fi
mkdir -p "$dir/data"
cat > "$dir/zoo.cfg" <<CFG
tickTime=2000
dataDir=$dir/data
clientPort=$port
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,stat,mntr
CFG
echo "==> starting ZooKeeper on 127.0.0.1:$port (log: $dir/server.log)" >&2
java -Xmx256m -cp "$(zookeeper_classpath)" org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg" \
  >"$dir/server.log" 2>&1 &
zk_pid=$!
cleanup() {
  kill "$zk_pid" 2>/dev/null || true
  wait "$zk_pid" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
for _ in $(seq 1 100); do
  [ "$(zk_four_letter "$port" ruok)" = imok ] && break
  kill -0 "$zk_pid" 2>/dev/null || { echo "ZooKeeper failed to start; see $dir/server.log" >&2; exit 1; }
  sleep 0.2
done
echo "==> zkq: API http://127.0.0.1:8080  admin http://127.0.0.1:9090 (Ctrl-C stops both)" >&2
set +e
target/release/zkq --zk-connect "127.0.0.1:$port" "$@" &
zkq_pid=$!
trap 'kill -TERM "$zkq_pid" 2>/dev/null' INT TERM
wait "$zkq_pid"
status=$?
wait "$zkq_pid" 2>/dev/null
exit $status
