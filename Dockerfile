# syntax=docker/dockerfile:1
#
# zkq container image: the release binary on distroless/cc, running as non-root.
#
#   docker build -t zkq:0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" .
#   docker run --rm -p 127.0.0.1:8080:8080 -p 127.0.0.1:9090:9090 \
#     -e ZKQ__ZOOKEEPER__CONNECT=zk:2181 -e ZKQ__API__LISTEN=0.0.0.0:8080 zkq:0.1.0
#
# (The API listens on 127.0.0.1 by default, which is right for a sidecar: only containers of the
# same pod reach it. Outside a pod, publish it as above, on the host's loopback only.)
#
# Stages: chef (rust + cargo-chef) -> planner (dependency recipe) -> build (dependencies cooked in
# their own layer, then the source) -> runtime (distroless, smoke-tested during the build).
# Dependencies are rebuilt only when Cargo.toml/Cargo.lock change; a source edit rebuilds zkq alone.
# The binary links only glibc, libm and libgcc_s, which distroless/cc provides.
#
# The two base images are build arguments, so that a registry mirror (or a local stand-in: see
# scripts/check-image.sh) can take their place without editing this file:
#   --build-arg RUST_IMAGE=mirror.example/rust:1-bookworm
#   --build-arg RUNTIME_IMAGE=mirror.example/distroless/cc-debian12:nonroot
ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${RUST_IMAGE} AS chef
ARG CARGO_CHEF_VERSION=0.1.78
ENV CARGO_TERM_COLOR=never \
    CARGO_INCREMENTAL=0
RUN cargo install cargo-chef --locked --version "${CARGO_CHEF_VERSION}"
WORKDIR /src

# The recipe holds only what determines the dependency build (manifests, lock file, target list).
FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS build
COPY --from=planner /src/recipe.json recipe.json
RUN cargo chef cook --release --locked --recipe-path recipe.json
COPY . .
# Smoke test of the freshly built binary: it starts, knows its version and accepts its built-in
# default configuration.
RUN cargo build --release --locked --bin zkq \
 && /src/target/release/zkq --version \
 && /src/target/release/zkq check-config > /dev/null

FROM ${RUNTIME_IMAGE} AS runtime
ARG RUNTIME_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=""
LABEL org.opencontainers.image.title="zkq" \
      org.opencontainers.image.description="Sidecar daemon serving durable, Curator-compatible ZooKeeper queues over HTTP" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${RUNTIME_IMAGE}"
COPY --from=build /src/target/release/zkq /usr/local/bin/zkq
# 65532 is distroless's `nonroot` user. The numeric form lets Kubernetes verify runAsNonRoot
# (a user *name* in the image makes the kubelet refuse runAsNonRoot without an explicit runAsUser).
USER 65532:65532
# Smoke test inside the runtime image itself: the binary finds every shared library it needs in
# distroless, runs as the non-root user and loads its default configuration. Exec form, because
# distroless has no shell.
RUN ["/usr/local/bin/zkq", "check-config"]
# API (loopback by default: the app in the same pod is the client) and admin (/livez, /readyz, /metrics).
EXPOSE 8080 9090
# zkq drains on SIGTERM (readyz turns 503, long-polls are answered, puts finish, leases are released)
# for at most shutdown.grace, then exits 0.
STOPSIGNAL SIGTERM
# Docker/Podman only (Kubernetes ignores HEALTHCHECK and uses the chart's probes): GET /readyz on the
# configured admin.listen port; exit 0 on 200, else 1. No shell or curl needed. It sees the container's
# environment (-e included) but not its arguments: move the admin port with ZKQ__ADMIN__LISTEN, not
# only in a --config file, or the health check looks at 9090.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["/usr/local/bin/zkq", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/zkq"]
CMD ["run"]
