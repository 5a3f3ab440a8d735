#!/usr/bin/env bash
# Runs zkq for real. Without ZKQ__ZOOKEEPER__CONNECT or --zk-connect it installs Debian's ZooKeeper
# if needed and starts a standalone server on loopback: 127.0.0.1:2181 with its data under
# target/dev-zookeeper, kept across restarts. When 2181 belongs to someone else (a system
# ZooKeeper, or another dev.sh of this checkout), a private server on another port, with its data
# under target/dev-zookeeper-private, also kept across restarts (it says which). Ctrl-C is one
# graceful stop: zkq drains (waiting long-polls answer 503, leases are released), then the server
# stops. A second Ctrl-C makes zkq exit at once. Extra arguments go to zkq (e.g. --config zkq.toml).
#
# ZKQ_DEV_ZK_PORT (default 2181) and ZKQ_DEV_DIR (default target) move the server's preferred port
# and the directory its data lives under; the tests use them to keep away from a developer's server.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

external=false
[ -n "${ZKQ__ZOOKEEPER__CONNECT:-}" ] && external=true
for arg in "$@"; do [[ "$arg" == --zk-connect* ]] && external=true; done

# cargo's own progress bar and lines: the first build takes minutes (see the README).
echo "==> building zkq (release; the first build takes several minutes)" >&2
cargo build --release --locked

if $external; then
  exec target/release/zkq "$@"
fi

ensure_debs zookeeper
base="${ZKQ_DEV_DIR:-$PWD/target}"
mkdir -p "$base"
base="$(cd "$base" && pwd)"

# Takes the data directory DIR for this run: an exclusive lock on DIR/lock, held by this script
# and inherited by its server, so two runs never share one data directory.
take_dir() {
  mkdir -p "$1/data"
  exec {lock_fd}>"$1/lock"
  flock -n "$lock_fd" && return 0
  exec {lock_fd}>&-
  return 1
}

# Whether 127.0.0.1:PORT can be listened on, as ZooKeeper listens (SO_REUSEADDR): the previous run's
# connections in TIME_WAIT do not make the port look taken; another process's listener does.
port_free() {
  python3 -c "import socket,sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', int(sys.argv[1])))" "$1" 2>/dev/null
}

# A server of an earlier run that outlived its script (killed with SIGKILL, say) is recognised by
# its pid file and its command line, and stopped: its data directory is this run's again.
stop_leftover() {
  local pid
  pid=$(cat "$1/zookeeper.pid" 2>/dev/null || true)
  [ -n "$pid" ] && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF "$1/zoo.cfg" || return 0
  echo "==> stopping a ZooKeeper left running by an earlier dev.sh (pid $pid)" >&2
  kill "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
}

port="${ZKQ_DEV_ZK_PORT:-2181}"
dir="$base/dev-zookeeper"
why=""
if take_dir "$dir"; then
  stop_leftover "$dir"
  if ! port_free "$port"; then
    why="127.0.0.1:$port is in use by another process"
    exec {lock_fd}>&-
  fi
else
  why="another dev.sh of this checkout uses $dir"
fi
if [ -z "$why" ]; then
  echo "==> ZooKeeper on 127.0.0.1:$port, data in $dir (kept across restarts)" >&2
else
  dir="$base/dev-zookeeper-private"
  if take_dir "$dir"; then
    stop_leftover "$dir"
    # The private server keeps its port across restarts while that port stays free.
    saved=$(cat "$dir/port" 2>/dev/null || true)
    if [ -n "$saved" ] && port_free "$saved"; then port=$saved; else port=$(free_port); fi
    echo "$port" > "$dir/port"
    echo "==> $why: a private ZooKeeper on 127.0.0.1:$port, data in $dir (kept across restarts)" >&2
  else
    # A third run at once: a throwaway server.
    port=$(free_port)
    dir="$base/dev-zookeeper-$port"
    take_dir "$dir"
    echo "==> $why, and $base/dev-zookeeper-private is in use too: a throwaway ZooKeeper on 127.0.0.1:$port, data in $dir" >&2
  fi
fi
cat > "$dir/zoo.cfg" <<CFG
tickTime=2000
dataDir=$dir/data
clientPort=$port
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr
CFG
echo "==> starting ZooKeeper (log: $dir/server.log)" >&2
zk_pid=""
zkq_pid=""
cleanup() {
  if [ -n "$zkq_pid" ]; then kill -TERM "$zkq_pid" 2>/dev/null || true; fi
  if [ -n "$zk_pid" ]; then
    kill "$zk_pid" 2>/dev/null || true
    # Not a child's `wait`: the server runs in a session of its own (see below).
    while kill -0 "$zk_pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$dir/zookeeper.pid" "$dir/zkq.pid"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
# The server and zkq run in sessions of their own (setsid), out of the terminal's process group: a
# Ctrl-C reaches this script alone, which turns it into one SIGTERM for zkq, and the server keeps
# serving while zkq drains.
setsid java -Xmx256m -cp "$(zookeeper_classpath)" org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg" \
  >"$dir/server.log" 2>&1 {lock_fd}>&- &
zk_pid=$!
echo "$zk_pid" > "$dir/zookeeper.pid"
# Ready means serving sessions: `ruok` answers imok as soon as the port is open, before the server
# has loaded its database and accepts sessions; `srvr` answers "Mode: standalone" only then.
until zk_four_letter "$port" srvr | grep -q '^Mode: '; do
  kill -0 "$zk_pid" 2>/dev/null || { echo "ZooKeeper failed to start; see $dir/server.log" >&2; exit 1; }
  sleep 0.2
done
echo "==> zkq: API http://127.0.0.1:8080, admin (/readyz, /livez, /metrics) http://127.0.0.1:9090 (the defaults; its \"zkq started\" line says where it listens); Ctrl-C stops both" >&2
set +e
setsid target/release/zkq --zk-connect "127.0.0.1:$port" "$@" {lock_fd}>&- &
zkq_pid=$!
echo "$zkq_pid" > "$dir/zkq.pid"
# Every INT, TERM or HUP to this script is one SIGTERM to zkq: the first starts its drain, a second
# makes it exit at once.
trap 'kill -TERM "$zkq_pid" 2>/dev/null; signalled=true' INT TERM HUP
# A trap interrupts `wait` (which then returns 128+signal): wait again, until `wait` returns zkq's
# own status. zkq may have ended (and bash collected it) meanwhile: bash keeps that status for the
# next `wait`, and answers 127 once it has handed it out.
status=0
while :; do
  signalled=false
  wait "$zkq_pid"
  rc=$?
  [ "$rc" -eq 127 ] && break
  status=$rc
  $signalled || break
done
zkq_pid=""
exit $status
