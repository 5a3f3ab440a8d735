# Shared helpers for scripts/*.sh (sourced, not run).

# Runs a command as root (directly when we are root, else with sudo).
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Installs Debian packages that are missing; runs apt-get update once, only when needed.
ensure_debs() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local log
  log=$(mktemp -t zkq-apt.XXXXXX.log)
  echo "==> installing Debian packages: ${missing[*]} (log: $log)" >&2
  # dpkg's lines go to the log alone: on success nothing else is printed, on failure its end.
  if ! { as_root apt-get update -qq &&
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
    > "$log" 2>&1; then
    tail -30 "$log" >&2
    echo "installing ${missing[*]} failed (log: $log)" >&2
    return 1
  fi
  rm -f "$log"
}

# Runs COMMAND... with its output in LOG; says so at once, and every ZKQ_PROGRESS_SECS (default 60)
# seconds prints how long it has run, where its log is and the log's last line, so a long build is
# never silent. Returns the command's status; on failure prints the log's end.
# Usage: with_progress LOG WHAT COMMAND...
with_progress() {
  local log=$1 what=$2 start=$SECONDS status=0
  shift 2
  echo "  ... $what (log: $log)" >&2
  (
    while sleep "${ZKQ_PROGRESS_SECS:-60}" > /dev/null 2>&1; do
      echo "  ... $what: $((SECONDS - start)) s so far (log: $log): $(tail -n 1 "$log" 2> /dev/null | cut -c1-120)" >&2
    done
  ) &
  local ticker=$!
  "$@" > "$log" 2>&1 || status=$?
  kill "$ticker" 2> /dev/null || true
  wait "$ticker" 2> /dev/null || true
  if [ "$status" -ne 0 ]; then
    tail -40 "$log" >&2
    echo "  $what failed (exit $status; log: $log)" >&2
  fi
  return "$status"
}

# Prints a free TCP port on 127.0.0.1.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# Prints a ZooKeeper server's answer to a four-letter word (e.g. `ruok`) on 127.0.0.1:PORT, or
# nothing, within 2 seconds. Bounded because ZooKeeper 3.8.0 can leave the command's socket open
# forever: a command that arrives while the server still loads its database fails to close it (a
# NullPointerException in ServerCnxn.cleanupWriterSocket), so a plain read would never end.
zk_four_letter() {
  timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf "%s" "$2" >&3 && cat <&3' _ "$1" "$2" 2>/dev/null
}

# The JVM classpath of Debian's ZooKeeper server.
zookeeper_classpath() {
  local jars=(zookeeper zookeeper-jute slf4j-api slf4j-simple netty-handler netty-common netty-buffer
    netty-transport netty-codec netty-resolver netty-transport-native-epoll netty-transport-native-unix-common)
  local cp=""
  for jar in "${jars[@]}"; do cp="$cp/usr/share/java/$jar.jar:"; done
  echo "${cp}/etc/zookeeper/conf"
}

# The Debian archive this machine's apt is configured with (its own mirror, or a private one),
# as apt itself reads its sources: the entry of the release the machine runs, component main.
debian_mirror() {
  local codename uri
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  uri=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' 2>/dev/null |
    awk -v release="$codename" '$2 == release && $3 == "main" { print $1; exit }')
  if [ -z "$uri" ]; then
    echo "no Debian archive for '$codename' (main) in this machine's apt sources" >&2
    return 1
  fi
  echo "$uri"
}

# ZooKeeper 3.9 from Debian 13 (trixie), for the three-server ensemble of the fault tests:
# Debian 12's 3.8.0 can lose committed transactions when its leader is killed (ZOOKEEPER-4712,
# fixed in 3.9.3), which no client can survive. Only the package's two jars are used, unpacked
# into target/zookeeper-3.9/ with Debian 12's netty and slf4j beside them; apt checks the
# download against the signed index. The archive is this machine's configured Debian mirror
# (`debian_mirror`), asked for the next release's suite. Idempotent: does nothing once the jars are there.
ensure_zookeeper_39() {
  local dir=target/zookeeper-3.9
  [ -f "$dir/zookeeper.jar" ] && [ -f "$dir/zookeeper-jute.jar" ] && return 0
  echo "==> fetching ZooKeeper 3.9 (Debian 13's libzookeeper-java) into $dir" >&2
  local apt_dir
  apt_dir="$(pwd)/target/apt-trixie"
  rm -rf "$apt_dir"
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$dir"
  local mirror
  mirror=$(debian_mirror) || return 1
  echo "deb $mirror trixie main" > "$apt_dir/sources.list"
  local opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=-"
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o "APT::Sandbox::User=root")
  as_root apt-get "${opts[@]}" update -qq
  (cd "$apt_dir" && as_root apt-get "${opts[@]}" download -qq libzookeeper-java)
  dpkg-deb -x "$apt_dir"/libzookeeper-java_3.9.*_all.deb "$apt_dir/unpacked"
  local repo="$apt_dir/unpacked/usr/share/maven-repo/org/apache/zookeeper"
  cp "$(ls "$repo"/zookeeper/3.9.*/zookeeper-3.9.*.jar | head -1)" "$dir/zookeeper.jar"
  cp "$(ls "$repo"/zookeeper-jute/3.9.*/zookeeper-jute-3.9.*.jar | head -1)" "$dir/zookeeper-jute.jar"
}
