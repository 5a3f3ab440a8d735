#!/usr/bin/env bash
# Builds the shipped Dockerfile for real and runs what it produces: the image beside a ZooKeeper
# container, then the zkq-demo chart's pod.
#
#   scripts/check-image.sh     # build, run, report; idempotent, cached under target/image-check/
#   scripts/check-image.sh --build-only   # steps 1 and 2 alone (test.sh: check-deploy then checks
#                              # target/image-check/zkq, the image's binary, instead of building its own)
#
#   ZKQ_IMAGE_CHECK=skip       # skip at once (prints why)
#   ZKQ_IMAGE_CHECK=require    # a missing container capability fails instead of skipping
#
# 1. Local stand-ins for the Dockerfile's base images, which are build arguments (RUST_IMAGE,
#    RUNTIME_IMAGE), made from Debian packages only: a debootstrapped bookworm (Debian's own
#    archive, as this machine's apt is configured); on it the Rust stand-in (gcc, libc6-dev, make, this
#    machine's Rust toolchain, i.e. what `rustc` runs here, copied in under /usr/local/rustup with
#    cargo and rustc on PATH in /usr/local/cargo/bin, as in the rust image) and a ZooKeeper
#    image (Debian's `zookeeper` package, the 3.8 the test suite runs); the distroless/cc stand-in is
#    a FROM-scratch image holding the files of libc6, libgcc-s1, libgomp1, libstdc++6, libssl3,
#    tzdata, netbase and base-files, Debian's CA bundle, /etc/passwd with root, nobody and nonroot
#    (65532), USER 65532 and WORKDIR /home/nonroot. Each stand-in is tagged with a hash of its
#    inputs and rebuilt only when they change.
# 2. `podman build` of the Dockerfile, unchanged in its stages, with the stand-ins as build
#    arguments and `--format docker` (the OCI format has no HEALTHCHECK). Its RUN steps use the host
#    network (`--network host`) and this machine's CA bundle, which the Rust stand-in carries, so
#    `cargo install cargo-chef` and the crate downloads of `cargo chef cook` go wherever this
#    machine's cargo goes (nothing is preinstalled: the Dockerfile's own step installs cargo-chef).
#    The image's layers are cached in target/image-check/storage (a source edit rebuilds zkq alone).
#    The image's /usr/local/bin/zkq is copied to target/image-check/zkq.
# 3. The image, in one pod with the ZooKeeper container (they share the pod's loopback; requests go
#    from the host into the pod's network namespace with nsenter, nothing is published): user 65532,
#    `--read-only`, `--cap-drop=all`; /readyz turns 200 (time printed); the README's curl
#    quickstart; `podman healthcheck run` healthy, then unhealthy while ZooKeeper is stopped, then
#    healthy again; `podman stop` (SIGTERM) answers a waiting long-poll, ends within the grace and
#    exits 0; size and layer count.
# 4. The zkq-demo chart, as scripts/check-deploy.sh rendered it (target/deploy-check/<case>/; runs
#    check-deploy.sh first when the renders are missing), played with `podman kube play`, for the
#    default case (native sidecar) and plain-container (zkq as a regular container). What podman
#    cannot model is rewritten in a copy of the manifest and the output says so: a native sidecar
#    (an initContainer with restartPolicy: Always) becomes the first regular container; the
#    cluster DNS name of ZooKeeper becomes a hostAliases entry for the ZooKeeper container's address;
#    the probes are taken out of the copy (podman turns an httpGet probe into a curl inside the
#    container, and distroless has no curl) and the script runs each declared probe itself, from
#    the pod's network namespace, against the declared port and path.
#
# Needs root (rootful podman, nsenter), Debian packages it installs when missing (podman, runc,
# catatonit, debootstrap, curl), the machine's Debian archive and Rust registry, and the renders of
# scripts/check-deploy.sh (its venv's python reads them). Podman runs with runc and a private
# configuration (target/image-check/containers.conf: no default ulimits, cgroupfs, file events),
# private storage (target/image-check/storage) and resource names prefixed zkq-image-check.
# When containers cannot run here (no user or network namespaces, cgroups refused, packages not
# installable) it prints why and exits 0 with "check-image: SKIPPED".
#
# `cond && ok ... || fail ...` is intended: ok only prints.
# shellcheck disable=SC2015
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

work="$PWD/target/image-check"
prefix="zkq-image-check"
t_begin=$(date +%s)
build_only=false
for arg in "$@"; do
  case "$arg" in
    --build-only) build_only=true ;;
    -h | --help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "check-image.sh: unknown argument $arg (try --help)" >&2; exit 2 ;;
  esac
done
# No binary from an earlier run may stand for this one's (test.sh hands it to check-deploy).
rm -f "$work/zkq"

skip() {
  echo "check-image: SKIPPED: $*"
  if [ "${ZKQ_IMAGE_CHECK:-}" = require ]; then
    echo "check-image: ZKQ_IMAGE_CHECK=require, so a skip is a failure" >&2
    exit 1
  fi
  exit 0
}
fail() {
  echo "  FAIL  $*"
  echo "check-image: FAILED" >&2
  exit 1
}
ok() { echo "  ok    $*"; }
note() { echo "  note  $*"; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
secs_since() { awk -v a="$1" -v b="$(now_ms)" 'BEGIN { printf "%.2f", (b - a) / 1000 }'; }

# Polls `cmd` (every 0.2 s) until it succeeds or `deadline_s` passed; returns 1 on timeout.
wait_until() {
  local deadline_s=$1
  shift
  local end=$(($(now_ms) + deadline_s * 1000))
  until "$@"; do
    [ "$(now_ms)" -lt "$end" ] || return 1
    sleep 0.2
  done
}

[ "${ZKQ_IMAGE_CHECK:-}" = skip ] && skip "ZKQ_IMAGE_CHECK=skip"
[ "$(id -u)" -eq 0 ] || skip "needs root (rootful podman, nsenter into a pod's network namespace)"

# --- tools and podman's private configuration --------------------------------------------------
ensure_debs podman runc catatonit debootstrap curl ||
  skip "could not install podman, runc, catatonit, debootstrap, curl with apt"

mkdir -p "$work"
cat > "$work/containers.conf" <<'CONF'
# scripts/check-image.sh: podman with runc, no default rlimits (this kind of VM refuses to raise
# them), cgroupfs and file events (no systemd needed).
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
# Storage keyed by this checkout, so that two checkouts on one machine never share state.
runroot="/run/$prefix-$(echo "$work" | sha256sum | cut -c1-12)"
cat > "$work/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$work/storage"
runroot = "$runroot"
CONF
export CONTAINERS_CONF="$work/containers.conf" CONTAINERS_STORAGE_CONF="$work/storage.conf"

echo "==> $(podman --version), $(runc --version | head -1), storage $work/storage"

# Can containers run here at all? A throw-away rootfs with dash and its libraries, in a pod.
probe="$work/probe-rootfs"
rm -rf "$probe"
mkdir -p "$probe"
mapfile -t libs < <(ldd /bin/dash | grep -o '/[^ ]*')
cp --parents -L /bin/dash "${libs[@]}" "$probe/"
podman pod rm -f "$prefix-probe" > /dev/null 2>&1 || true
if ! out=$(podman pod create --name "$prefix-probe" 2>&1 &&
  podman run --rm --pod "$prefix-probe" --rootfs "$probe" /bin/dash -c 'exit 0' 2>&1); then
  podman pod rm -f "$prefix-probe" > /dev/null 2>&1 || true
  skip "podman cannot run a container in a pod here: $(echo "$out" | tail -3 | tr '\n' ' ')"
fi
podman pod rm -f "$prefix-probe" > /dev/null
ok "podman runs a container in a pod (runc, cgroupfs)"

# Removes this script's pods (its own names, and the demo chart's release "demo"), e.g. after a failure.
cleanup() {
  for pod in $(podman pod ls --format '{{.Name}}' 2> /dev/null | grep -E "^($prefix-|demo-zkq-demo)" || true); do
    podman pod rm -f -t 0 "$pod" > /dev/null 2>&1 || true
  done
}
trap cleanup EXIT
cleanup

# --- 1. stand-ins -------------------------------------------------------------------------------
echo
echo "==> local stand-ins for the base images (from Debian packages)"
t_standins=$(now_ms)
stand_in=localhost/$prefix

# A Containerfile, its context and a key: builds TAG unless TAG-KEY exists already.
# Usage: build_stand_in TAG CONTEXT_DIR [podman build options...]  (Containerfile in CONTEXT_DIR)
build_stand_in() {
  local tag=$1 context=$2
  shift 2
  local key
  key=$( (cat "$context"/*; printf '%s\n' "$@") | sha256sum | cut -c1-16)
  if podman image exists "$tag-$key"; then
    podman tag "$tag-$key" "$tag"
    ok "$tag (cached, inputs $key)"
    return 0
  fi
  local t0
  t0=$(now_ms)
  if ! with_progress "$work/stand-in.log" "building stand-in $tag" nice -n 10 podman build --quiet --pull=never \
    --network host --format docker "$@" -t "$tag-$key" -t "$tag" "$context"; then
    fail "building stand-in $tag (log: $work/stand-in.log)"
  fi
  ok "$tag built in $(secs_since "$t0")s (inputs $key)"
}

# bookworm minbase from Debian's archive, as this machine's apt reaches it.
mirror=$(debian_mirror) || skip "no Debian archive configured for apt"
include=ca-certificates,curl
base_key=$(printf 'bookworm minbase %s %s v1\n' "$include" "$mirror" | sha256sum | cut -c1-16)
base=$stand_in/debian:bookworm
if podman image exists "$base-$base_key"; then
  ok "$base (cached, inputs $base_key)"
else
  t0=$(now_ms)
  rootfs="$work/debootstrap"
  rm -rf "$rootfs"
  if ! with_progress "$work/debootstrap.log" "debootstrap bookworm" \
    nice -n 10 debootstrap --variant=minbase --include="$include" bookworm "$rootfs" "$mirror"; then
    fail "debootstrap bookworm (log: $work/debootstrap.log)"
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import --quiet \
    --change 'CMD ["/bin/bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - "$base-$base_key" > /dev/null
  rm -rf "$rootfs"
  ok "$base debootstrapped in $(secs_since "$t0")s (inputs $base_key)"
fi
podman tag "$base-$base_key" "$base"

# The Rust stand-in: the toolchain `rustc` runs on this machine, without its docs.
sysroot=$(rustc --print sysroot)
rust_version=$(rustc --version | awk '{print $2}')
toolchain="$rust_version-x86_64-unknown-linux-gnu"
ctx="$work/stand-in/rust"
rm -rf "$ctx"
mkdir -p "$ctx"
# This machine's CA bundle: RUN steps reach the Rust registry the way this machine's cargo does.
cp /etc/ssl/certs/ca-certificates.crt "$ctx/ca-certificates.crt"
cat > "$ctx/Containerfile" <<CF
# Stand-in for rust:1-bookworm: Debian bookworm, gcc, libc6-dev, make, Rust $rust_version (from the host).
FROM $base-$base_key
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
      gcc libc6-dev make > /dev/null && rm -rf /var/lib/apt/lists/*
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo \\
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    RUST_VERSION=$rust_version
RUN mkdir -p /usr/local/rustup/toolchains/$toolchain /usr/local/cargo/bin \\
 && cp -a /host-toolchain/bin /host-toolchain/lib /host-toolchain/libexec /usr/local/rustup/toolchains/$toolchain/ \\
 && for b in /usr/local/rustup/toolchains/$toolchain/bin/*; do ln -s "\$b" /usr/local/cargo/bin/; done \\
 && chmod -R a+w /usr/local/cargo && cargo --version && rustc --version
# (inputs: $(rustc -vV | tr '\n' ' '))
CF
build_stand_in "$stand_in/rust:1-bookworm" "$ctx" -v "$sysroot:/host-toolchain:ro"

# The distroless/cc stand-in: the files of the packages distroless cc-debian12 is made of.
ctx="$work/stand-in/distroless"
rm -rf "$ctx"
mkdir -p "$ctx"
cat > "$ctx/Containerfile" <<CF
# Stand-in for gcr.io/distroless/cc-debian12:nonroot, from Debian bookworm's packages.
FROM $base-$base_key AS files
WORKDIR /debs
RUN apt-get update -qq \\
 && apt-get download -qq libc6 libgcc-s1 libgomp1 libstdc++6 libssl3 tzdata netbase base-files \\
 && mkdir /rootfs && for d in ./*.deb; do dpkg-deb -x "\$d" /rootfs; done \\
 && rm -rf /rootfs/usr/share/doc /rootfs/usr/share/man /rootfs/usr/share/info /rootfs/usr/share/lintian \\
 && mkdir -p /rootfs/etc/ssl/certs /rootfs/home/nonroot /rootfs/tmp /rootfs/root \\
 && cp /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/ \\
 && printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > /rootfs/etc/passwd \\
 && printf 'root:x:0:\nnobody:x:65534:\ntty:x:5:\nstaff:x:50:\nnonroot:x:65532:\n' > /rootfs/etc/group \\
 && printf 'hosts: files dns\n' > /rootfs/etc/nsswitch.conf \\
 && chown 65532:65532 /rootfs/home/nonroot && chmod 1777 /rootfs/tmp && chmod 700 /rootfs/root \\
 && rm -rf /var/lib/apt/lists/*
FROM scratch
COPY --from=files /rootfs /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
WORKDIR /home/nonroot
CF
build_stand_in "$stand_in/distroless-cc-debian12:nonroot" "$ctx"

# ZooKeeper: Debian's package, the 3.8 the test suite runs, standalone on port 2181.
ctx="$work/stand-in/zookeeper"
rm -rf "$ctx"
mkdir -p "$ctx"
cat > "$ctx/Containerfile" <<CF
# ZooKeeper from Debian bookworm's zookeeper package, one standalone server on :2181.
FROM $base-$base_key
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
      zookeeper > /dev/null && rm -rf /var/lib/apt/lists/* \\
 && mkdir -p /data && printf '%s\n' tickTime=1000 dataDir=/data clientPort=2181 admin.enableServer=false \\
      '4lw.commands.whitelist=*' maxClientCnxns=0 > /zoo.cfg
CMD ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Dzookeeper.jmx.log4j.disable=true", \\
     "-cp", "$(zookeeper_classpath)", "org.apache.zookeeper.server.quorum.QuorumPeerMain", "/zoo.cfg"]
CF
build_stand_in "$stand_in/zookeeper:3.8" "$ctx"

# The demo's app container (curlimages/curl): any image with sh and curl; the Debian base has both.
podman tag "$base" "$stand_in/curl:8.11.1"
ok "$stand_in/curl:8.11.1 = $base (sh and curl)"
echo "  stand-ins ready in $(secs_since "$t_standins")s"

# --- 2. the Dockerfile --------------------------------------------------------------------------
echo
echo "==> podman build of the Dockerfile (stages unchanged; base images from the stand-ins)"
image=localhost/zkq:check
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
t0=$(now_ms)
# From a clean cache this takes over 15 minutes on 2 cores: with_progress says every minute how far.
if ! with_progress "$work/build.log" "podman build (from a clean cache about 17 min on 2 cores)" \
  nice -n 10 podman build --pull=never --network host --format docker \
  --build-arg RUST_IMAGE="$stand_in/rust:1-bookworm" \
  --build-arg RUNTIME_IMAGE="$stand_in/distroless-cc-debian12:nonroot" \
  --build-arg REVISION="$(git rev-parse HEAD 2> /dev/null || echo unknown)" \
  -t "$image" -t "localhost/zkq:$version" -f Dockerfile .; then
  fail "podman build (log: $work/build.log)"
fi
build_s=$(secs_since "$t0")
ok "built $image in ${build_s}s (log: $work/build.log)"

# Facts about the image: size, layers and the runtime stage's settings.
size=$(podman image inspect -f '{{.Size}}' "$image")
layers=$(podman image inspect -f '{{len .RootFS.Layers}}' "$image")
base_layers=$(podman image inspect -f '{{len .RootFS.Layers}}' "$stand_in/distroless-cc-debian12:nonroot")
base_size=$(podman image inspect -f '{{.Size}}' "$stand_in/distroless-cc-debian12:nonroot")
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "  image $image: $(mib "$size") ($(mib "$base_size") of it the runtime base), $layers layers ($base_layers from the runtime base)"
cfg() { podman image inspect -f "$1" "$image"; }
[ "$(cfg '{{.Config.User}}')" = 65532:65532 ] && ok "USER 65532:65532" || fail "image user: $(cfg '{{.Config.User}}')"
[ "$(cfg '{{.Config.StopSignal}}')" = SIGTERM ] && ok "STOPSIGNAL SIGTERM" || fail "stop signal: $(cfg '{{.Config.StopSignal}}')"
[ "$(cfg '{{json .Config.Entrypoint}}')" = '["/usr/local/bin/zkq"]' ] && [ "$(cfg '{{json .Config.Cmd}}')" = '["run"]' ] &&
  ok 'ENTRYPOINT ["/usr/local/bin/zkq"], CMD ["run"]' || fail "entrypoint/cmd: $(cfg '{{json .Config.Entrypoint}} {{json .Config.Cmd}}')"
hc=$(cfg '{{json .HealthCheck}}')
echo "$hc" | grep -q '"Test":\["CMD","/usr/local/bin/zkq","healthcheck"\]' &&
  ok "HEALTHCHECK $hc" || fail "healthcheck: $hc"
labels=$(cfg '{{json .Labels}}')
for key in title description version revision source licenses base.name; do
  echo "$labels" | grep -q "\"org.opencontainers.image.$key\"" || fail "label org.opencontainers.image.$key missing: $labels"
done
[ "$(cfg '{{index .Labels "org.opencontainers.image.version"}}')" = "$version" ] &&
  [ "$(cfg '{{index .Labels "org.opencontainers.image.base.name"}}')" = "$stand_in/distroless-cc-debian12:nonroot" ] &&
  ok "OCI labels (version $version, revision $(cfg '{{index .Labels "org.opencontainers.image.revision"}}' | cut -c1-12), base.name = the runtime base)" ||
  fail "labels: $labels"

# The image's binary, for scripts/check-deploy.sh (ZKQ_BIN): the build the Dockerfile ships.
cid=$(podman create "$image")
podman cp "$cid:/usr/local/bin/zkq" "$work/zkq"
podman rm "$cid" > /dev/null 2>&1
ok "the image's binary copied to $work/zkq ($("$work/zkq" --version))"
if $build_only; then
  echo "check-image: image built (--build-only) in $(($(date +%s) - t_begin))s"
  exit 0
fi

# --- 3. the image beside ZooKeeper --------------------------------------------------------------
echo
echo "==> the image run beside a ZooKeeper container, in one pod (shared loopback, nothing published)"
pod=$prefix-run
zk=$prefix-zk
zkq=$prefix-zkq

# The pod's network namespace: requests from the host enter it with nsenter.
pod_netns() {
  local infra
  infra=$(podman pod inspect -f '{{.InfraContainerID}}' "$1")
  echo "/proc/$(podman inspect -f '{{.State.Pid}}' "$infra")/ns/net"
}
in_pod() { nsenter --net="$netns" "$@"; }
# HTTP status of GET url from inside the pod ("000" when nothing answers).
status_of() { in_pod curl -s -o /dev/null -w '%{http_code}' --max-time 2 --noproxy '*' "$1" || true; }
is_status() { [ "$(status_of "$2")" = "$1" ]; }
zk_serving() {
  in_pod timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/2181 && printf ruok >&3 && cat <&3' 2> /dev/null | grep -q imok
}
health_status() { podman inspect -f '{{.State.Health.Status}}' "$zkq"; }
# `podman healthcheck run` exits 0 when the check passes, else 1 and prints the state.
healthcheck_passes() { podman healthcheck run "$zkq" > /dev/null 2>&1; }

# Podman schedules the periodic health checks with systemd timers; without systemd it says so on
# stderr (kept in $podman_log) and the checks run only when asked (`podman healthcheck run`).
podman_log="$work/podman.log"
: > "$podman_log"
podman pod create --name "$pod" > /dev/null
t0=$(now_ms)
podman run -d --pod "$pod" --name "$zk" --ulimit host "$stand_in/zookeeper:3.8" > /dev/null
netns=$(pod_netns "$pod") # the pod's infra container runs once the pod has a container
wait_until 120 zk_serving || { podman logs --tail 20 "$zk"; fail "ZooKeeper did not answer ruok within 120s"; }
ok "ZooKeeper (Debian's 3.8) serving on the pod's 127.0.0.1:2181 after $(secs_since "$t0")s"

# zkq with its built-in defaults: ZooKeeper on 127.0.0.1:2181, API on 127.0.0.1:8080, admin on :9090.
t0=$(now_ms)
podman run -d --pod "$pod" --name "$zkq" --read-only --cap-drop=all --security-opt no-new-privileges \
  --ulimit host "$image" > /dev/null 2>> "$podman_log"
if ! wait_until 60 is_status 200 http://127.0.0.1:9090/readyz; then
  podman logs --tail 20 "$zkq"
  fail "/readyz did not turn 200 within 60s (last: $(status_of http://127.0.0.1:9090/readyz))"
fi
ready_s=$(secs_since "$t0")
ok "/readyz 200 ${ready_s}s after podman run"

pid=$(podman inspect -f '{{.State.Pid}}' "$zkq")
ids=$(awk '/^(Uid|Gid):/ { printf "%s %s %s %s ", $2, $3, $4, $5 }' "/proc/$pid/status")
[ "$ids" = "65532 65532 65532 65532 65532 65532 65532 65532 " ] &&
  ok "the process runs as uid 65532, gid 65532 ($(podman top "$zkq" user group | tail -1 | xargs))" ||
  fail "process ids: $ids"
caps=$(awk '/^Cap(Inh|Prm|Eff|Bnd|Amb):/ { printf "%s=%s ", $1, $2 }' "/proc/$pid/status")
! echo "$caps" | grep -q '=0*[1-9a-f]' &&
  ok "no capabilities (${caps% })" || fail "capabilities: $caps"
grep -q '^NoNewPrivs:[[:space:]]*1' "/proc/$pid/status" && ok "no_new_privs set" || fail "no_new_privs not set"
root_opts=$(awk '$5 == "/" { print $6 }' "/proc/$pid/mountinfo")
[ "$(podman inspect -f '{{.HostConfig.ReadonlyRootfs}}' "$zkq")" = true ] && [[ ",$root_opts," == *,ro,* ]] &&
  ok "root filesystem read-only (mounted $root_opts)" || fail "root filesystem: $root_opts"

# The README's quickstart, as written there, from inside the pod.
echo "  \$ curl -X POST --data-binary 'hello' localhost:8080/v1/queues/orders/messages"
put=$(in_pod curl -sS --noproxy '*' -X POST --data-binary 'hello' localhost:8080/v1/queues/orders/messages)
echo "  $put"
[[ "$put" == '{"queue":"orders","message_id":"queue-'* ]] || fail "put answered: $put"
echo "  \$ curl -X POST 'localhost:8080/v1/queues/orders/take?wait=20s'"
took=$(in_pod curl -sS --noproxy '*' -w ' (%{http_code})' -X POST 'localhost:8080/v1/queues/orders/take?wait=20s')
echo "  $took"
[ "$took" = "hello (200)" ] || fail "take answered: $took"
ok "README quickstart: put 'hello', took it back"

# HEALTHCHECK: healthy; unhealthy while ZooKeeper is stopped; healthy again once it is back.
t0=$(now_ms)
wait_until 60 healthcheck_passes || fail "podman healthcheck run: $(podman healthcheck run "$zkq" 2>&1)"
ok "podman healthcheck run: passes, state $(health_status)"
[ -d /run/systemd/system ] || note "no systemd here: podman's periodic health check timer cannot run, so the script runs each check with podman healthcheck run"
podman stop -t 10 "$zk" > /dev/null
t0=$(now_ms)
wait_until 60 is_status 503 http://127.0.0.1:9090/readyz || fail "/readyz still $(status_of http://127.0.0.1:9090/readyz) without ZooKeeper"
ok "ZooKeeper stopped: /readyz 503 after $(secs_since "$t0")s"
# The image's start period (30s) and retries (3) decide when the state turns unhealthy.
! healthcheck_passes || fail "podman healthcheck run passes without ZooKeeper"
ok "podman healthcheck run fails without ZooKeeper (prints $(podman healthcheck run "$zkq" 2>&1); state $(health_status) until 3 failures past the start period)"
until_unhealthy() { healthcheck_passes || true; [ "$(health_status)" = unhealthy ]; }
wait_until 120 until_unhealthy || fail "health state still $(health_status) 120s after ZooKeeper stopped"
ok "health state unhealthy $(secs_since "$t0")s after ZooKeeper stopped (failing streak $(podman inspect -f '{{.State.Health.FailingStreak}}' "$zkq"))"
podman start "$zk" > /dev/null
t0=$(now_ms)
wait_until 120 healthcheck_passes || fail "not healthy again: $(podman healthcheck run "$zkq" 2>&1)"
ok "ZooKeeper started again: podman healthcheck run passes after $(secs_since "$t0")s, state $(health_status)"

# SIGTERM drains: a long-poll waiting on the queue is answered, the container exits 0 in the grace.
grace=$(podman run --rm --read-only "$image" check-config 2> /dev/null | sed -n '/^\[shutdown\]/,/^\[/ s/^grace = "\(.*\)s"/\1/p')
in_pod curl -s --noproxy '*' -o /dev/null -w '%{http_code}' -X POST \
  'http://127.0.0.1:8080/v1/queues/orders/take?wait=20s' > "$work/longpoll.code" &
longpoll=$!
waiting() { in_pod curl -s --noproxy '*' http://127.0.0.1:8080/v1/queues/orders | grep -q '"waiting_takers":1'; }
wait_until 10 waiting || fail "the long-poll take is not waiting"
t0=$(now_ms)
podman stop -t $((grace + 15)) "$zkq" > /dev/null 2>> "$podman_log"
drain_s=$(secs_since "$t0")
code=$(podman inspect -f '{{.State.ExitCode}}' "$zkq")
wait "$longpoll" || true
lp=$(cat "$work/longpoll.code")
[ "$lp" = 503 ] && ok "the waiting long-poll was answered 503 (shutting_down) at SIGTERM" || fail "long-poll answered $lp"
[ "$code" = 0 ] && awk -v d="$drain_s" -v g="$grace" 'BEGIN { exit !(d <= g + 1) }' &&
  ok "podman stop (SIGTERM): drained in ${drain_s}s (grace ${grace}s), exit code $code" ||
  fail "podman stop: ${drain_s}s, exit code $code (grace ${grace}s)"
podman pod rm -f -t 0 "$pod" > /dev/null 2>> "$podman_log"

# --- 4. the zkq-demo chart's pod ----------------------------------------------------------------
echo
echo "==> the zkq-demo chart's pod with podman kube play (renders of scripts/check-deploy.sh)"
renders=target/deploy-check
cases=(default plain-container)
for case in "${cases[@]}"; do
  if [ ! -f "$renders/$case/manifests.yaml" ] || [ ! -x target/deploy-venv/bin/python ]; then
    echo "  (no render in $renders/$case: running scripts/check-deploy.sh first)"
    ./scripts/check-deploy.sh > "$work/check-deploy.log" 2>&1 || { tail -20 "$work/check-deploy.log"; fail "scripts/check-deploy.sh"; }
  fi
done
py=target/deploy-venv/bin/python

# ZooKeeper as its own pod on kube play's network; the demo pod reaches it by address.
zkpod=$prefix-kube-zk
cat > "$work/kube-zk.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $zkpod
spec:
  containers:
    - name: zookeeper
      image: $stand_in/zookeeper:3.8
YAML
podman kube play "$work/kube-zk.yaml" > "$work/kube-zk.log" 2>&1 || { cat "$work/kube-zk.log"; fail "kube play of ZooKeeper"; }
netns=$(pod_netns "$zkpod")
wait_until 120 zk_serving || fail "ZooKeeper pod did not answer ruok within 120s"
zk_ip=$(podman inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' \
  "$(podman pod inspect -f '{{.InfraContainerID}}' "$zkpod")")
ok "ZooKeeper pod $zkpod serving on $zk_ip:2181"

# The app waits for zkq (the app puts and takes a job every 5 s; a put that fails is retried).
app_took() { podman logs "$app" 2>&1 | grep -q "^app: took 'job"; }
probe_passes() { is_status 200 "http://127.0.0.1:$1$2"; }
kube_summary=""
for case in "${cases[@]}"; do
  echo "  -- case $case ($renders/$case/manifests.yaml)"
  out="$work/kube-$case"
  mkdir -p "$out"
  "$py" scripts/deploy/kube_play_manifest.py "$renders/$case/manifests.yaml" "$out/play.yaml" "$out/probes.json" \
    --zk-ip "$zk_ip" --image-map "curlimages/curl:8.11.1=$stand_in/curl:8.11.1" | sed 's/^/  note  /'
  t0=$(now_ms)
  podman kube play "$out/play.yaml" > "$out/play.log" 2>&1 || { cat "$out/play.log"; fail "podman kube play ($case)"; }
  kpod=$(podman pod ls --format '{{.Name}}' | grep '^demo-zkq-demo' | head -1)
  app=$kpod-app
  kzkq=$kpod-zkq
  for c in "$kzkq" "$app"; do
    [ "$(podman inspect -f '{{.State.Status}}' "$c")" = running ] || { podman logs --tail 20 "$c"; fail "$c is not running"; }
  done
  ok "pod $kpod: containers zkq and app running"
  netns=$(pod_netns "$kpod")
  # Each probe the chart declares for zkq, as the kubelet would run it: the startup probe within
  # its failureThreshold x periodSeconds, then readiness and liveness.
  while IFS=$'\t' read -r container kind port path period failures timeout; do
    deadline=$((period * failures))
    [ "$kind" = startupProbe ] || deadline=$((timeout + 1))
    wait_until "$deadline" probe_passes "$port" "$path" ||
      { podman logs --tail 20 "$kpod-$container"; fail "$container $kind GET :$port$path: $(status_of "http://127.0.0.1:$port$path") within ${deadline}s"; }
    ok "$container $kind GET :$port$path -> 200 ($(secs_since "$t0")s after kube play)"
    [ "$kind" = startupProbe ] && kube_summary+=" $case: started ${container} in $(secs_since "$t0")s;"
  done < <("$py" -c 'import json, sys
for p in json.load(open(sys.argv[1])):
    print("\t".join(str(p[k]) for k in ("container", "kind", "port", "path", "period", "failures", "timeout")))' "$out/probes.json")
  pid=$(podman inspect -f '{{.State.Pid}}' "$kzkq")
  grep -q '^Uid:[[:space:]]*65532' "/proc/$pid/status" && [[ ",$(awk '$5 == "/" { print $6 }' "/proc/$pid/mountinfo")," == *,ro,* ]] &&
    ok "zkq runs as uid 65532 on a read-only root (the chart's securityContext)" || fail "zkq's securityContext not applied"
  wait_until 60 app_took || { podman logs --tail 20 "$app"; fail "the app did not take a job from zkq within 60s"; }
  ok "the app reached zkq on 127.0.0.1:8080: $(podman logs "$app" 2>&1 | grep -m1 '^app: put') / $(podman logs "$app" 2>&1 | grep -m1 "^app: took")"
  t0=$(now_ms)
  podman pod stop -t 30 "$kpod" > /dev/null
  codes="zkq $(podman inspect -f '{{.State.ExitCode}}' "$kzkq"), app $(podman inspect -f '{{.State.ExitCode}}' "$app")"
  [ "$codes" = "zkq 0, app 0" ] && ok "pod stopped in $(secs_since "$t0")s, exit codes $codes" || fail "pod stop: exit codes $codes"
  podman pod rm -f -t 0 "$kpod" > /dev/null
done
podman pod rm -f -t 0 "$zkpod" > /dev/null

echo
echo "check-image: all checks passed in $(($(date +%s) - t_begin))s"
echo "  image: built in ${build_s}s, $(mib "$size"), $layers layers; /readyz 200 ${ready_s}s after podman run;"
echo "  health: healthy, unhealthy without ZooKeeper, healthy again; SIGTERM drained in ${drain_s}s, exit 0"
echo "  kube play:${kube_summary} probes passed, the app reached zkq, exit codes 0"
