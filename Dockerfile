# batond in a container: built from this checkout, run as a non-root user.
#
#   docker build -t baton .        (or: podman build -t baton .)
#   docker run --rm -p 7373:7373 baton
#
# A cluster node (the key file must be readable by uid 65532, mode 400/600):
#   docker run -d --name batond -p 7373:7373 \
#     -v /etc/baton/cluster.key:/run/secrets/cluster.key:ro baton \
#     --port 7373 --peers 10.0.0.1:7373,10.0.0.2:7373 \
#     --advertise 10.0.0.1:7373 --cluster-key-file /run/secrets/cluster.key
# (--peers holds the addresses the nodes and clients reach, not the
# container's own; so --advertise names this node's entry.)
#
# No .dockerignore: the top level of the repository stays small, and the
# COPY lines below take only what the build needs (Cargo.toml, Cargo.lock,
# src, and benches, which the manifest names). With BuildKit (the default
# builder) only those paths leave the checkout; the legacy builder sends
# the whole directory, target/ included, so run `cargo clean` first there.

# ---- build: the crate's rust-version (1.95: the locked parking_lot needs it)
FROM docker.io/library/rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY benches benches
RUN cargo build --release --locked --bin batond \
 && install -m 0755 target/release/batond /usr/local/bin/batond

# ---- run: glibc and libgcc only (what batond links), no shell, no root
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /usr/local/bin/batond /usr/local/bin/batond
# distroless's "nonroot" user, by number so that runtimes that refuse a
# named non-root user (Kubernetes runAsNonRoot) accept it.
USER 65532:65532
ENV RUST_LOG=info
EXPOSE 7373
# batond handles SIGTERM itself (a graceful handoff, then exit 0), also as
# PID 1. Give it 3 x --detect + 5 s before a SIGKILL: `docker stop -t 15`.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/batond"]
# Protected mode (docs/security.md) would refuse every client, since in a
# container they all come through its network: the image opens the node,
# and -p decides who reaches it (-p 127.0.0.1:7373:7373: the host only).
CMD ["--bind", "0.0.0.0", "--port", "7373"]
