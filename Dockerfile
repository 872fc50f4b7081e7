# syntax=docker/dockerfile:1
# The xfn runner image: Crossplane's function-runner sidecar (`xfn start`,
# the default command) and the base of every adaptor image `xfn wrap` builds.
#
#   docker build -t xfn .        # anywhere with Docker Hub and crates.io
#   scripts/image.sh             # with no registry at all: makes both base
#                                # images from Debian's packages and builds
#                                # this same file with podman (README "Deploy")
#
# What a build may substitute, and nothing else:
#   --build-arg RUST_IMAGE=...   the build stage: Debian bookworm with cargo
#                                and a C compiler (bookworm, so that xfn links
#                                against the glibc of the runtime stage)
#   --build-arg BASE_IMAGE=...   the runtime stage: Debian bookworm-slim
#   --build-context crates=DIR   crates for a build without crates.io: DIR
#                                holds `cargo vendor`'s output in vendor/ and
#                                a config.toml pointing cargo at /crates/vendor

ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim

# Empty unless the build passes --build-context crates=DIR: then cargo
# fetches from crates.io.
FROM scratch AS crates

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
# --locked: exactly the crates of Cargo.lock. The target dir and cargo's
# registry are cache mounts, so a rebuild compiles only what changed.
RUN --mount=type=bind,from=crates,target=/crates \
    --mount=type=cache,id=xfn-target,target=/src/target \
    --mount=type=cache,id=xfn-cargo-registry,target=/usr/local/cargo/registry \
    set -eu; \
    if [ -f /crates/config.toml ]; then set -- --config /crates/config.toml; fi; \
    cargo build --release --locked --bin xfn "$@"; \
    install -D -m 0755 target/release/xfn /out/xfn

# bookworm-slim, not distroless or scratch: crun is a dynamically linked
# Debian package (libseccomp, libyajl, libcap), installed and pinned by
# apt from Debian's archive, which needs a Debian userland.
FROM ${BASE_IMAGE}
COPY runtime/install.sh /usr/local/lib/xfn/install-runtime.sh
RUN /usr/local/lib/xfn/install-runtime.sh
COPY --from=build /out/xfn /usr/local/bin/xfn
# /xfn is xfn's default cache dir when it exists (Crossplane's sidecar
# mounts an emptyDir there); 65532 is the sidecar's user (distroless
# nonroot), which owns it.
RUN mkdir -p /xfn && chown 65532:65532 /xfn && chmod 0700 /xfn
# The cache of the shared-uid fallbacks (deploy/): xfn as 65532 cannot use
# an emptyDir, root's and mode 0777, that other uids can rename entries in.
RUN mkdir -p /var/cache/xfn && chown 65532:65532 /var/cache/xfn && chmod 0700 /var/cache/xfn
VOLUME /xfn
USER 65532:65532
ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin
ENTRYPOINT ["xfn"]
CMD ["start"]

ARG XFN_VERSION=0.1.0
# Where the source lives: scripts/image.sh passes the git remote (or the
# path of the checkout) and the commit.
ARG XFN_SOURCE=unknown
ARG XFN_REVISION=unknown
LABEL org.opencontainers.image.title="xfn" \
      org.opencontainers.image.description="A rootless OCI container function runner for Crossplane Composition Functions" \
      org.opencontainers.image.source="${XFN_SOURCE}" \
      org.opencontainers.image.version="${XFN_VERSION}" \
      org.opencontainers.image.revision="${XFN_REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
