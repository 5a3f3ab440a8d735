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
  echo "==> installing Debian packages: ${missing[*]}" >&2
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# Prints a free TCP port on 127.0.0.1.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# The JVM classpath of Debian's ZooKeeper server.
zookeeper_classpath() {
  local jars=(zookeeper zookeeper-jute slf4j-api slf4j-simple netty-handler netty-common netty-buffer
    netty-transport netty-codec netty-resolver netty-transport-native-epoll netty-transport-native-unix-common)
  local cp=""
  for jar in "${jars[@]}"; do cp="$cp/usr/share/java/$jar.jar:"; done
  echo "${cp}/etc/zookeeper/conf"
}
