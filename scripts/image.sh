#!/usr/bin/env bash
# Builds the runner image from the repository's Dockerfile with podman, with
# no container registry at all: the two images the Dockerfile starts FROM
# are made here from Debian's packages (mmdebstrap, over Debian's HTTP
# mirror, whose packages apt verifies by signature) and imported into
# podman, and the crates come from the host (`cargo vendor`), because a
# build chroot has neither a registry nor the host's proxy certificates.
# Elsewhere, `docker build .` builds the same file unchanged.
#
#   scripts/image.sh [TAG]      # default TAG: localhost/xfn:dev
#
# Made once and reused (delete them to remake them):
#   localhost/xfn-base:bookworm-slim   Debian bookworm minbase, without docs,
#                                       man pages and locales (BASE_IMAGE)
#   localhost/xfn-builder:RUSTC        that plus gcc and libc6-dev, and the
#                                       host's Rust toolchain (RUST_IMAGE)
# Env: XFN_IMAGE_WORK (default /var/tmp/xfn-image): the Debian package cache
# and the vendored crates; MIRROR (default http://deb.debian.org).
# Prints the image's size and how long its build took.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=${1:-localhost/xfn:dev}
WORK=${XFN_IMAGE_WORK:-/var/tmp/xfn-image}
MIRROR=${MIRROR:-http://deb.debian.org}
BASE=localhost/xfn-base:bookworm-slim
SYSROOT=$(rustc --print sysroot)
BUILDER=localhost/xfn-builder:$(rustc --version | awk '{print $2}')
mkdir -p "$WORK/debs"

for tool in mmdebstrap podman cargo; do
    command -v "$tool" >/dev/null || { echo "image.sh: $tool not found (scripts/setup.sh installs it)" >&2; exit 1; }
done

# debootstrap-like images from bookworm, bookworm-updates and
# bookworm-security, as debian:bookworm-slim is; .debs are kept in
# $WORK/debs so the second image downloads nothing the first did.
debian_tar() { # OUT.tar [mmdebstrap options...]
    local out=$1; shift
    mmdebstrap --quiet --variant=minbase --format=tar \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --skip=download/empty --skip=essential/unlink \
        --setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
        --setup-hook="sync-in $WORK/debs/ /var/cache/apt/archives/" \
        --customize-hook="sync-out /var/cache/apt/archives/ $WORK/debs/" \
        --customize-hook='rm -f "$1"/var/cache/apt/archives/*.deb' \
        "$@" bookworm "$out" \
        "deb $MIRROR/debian bookworm main" \
        "deb $MIRROR/debian bookworm-updates main" \
        "deb $MIRROR/debian-security bookworm-security main"
}

if ! podman image exists "$BASE"; then
    echo "image.sh: making $BASE with mmdebstrap" >&2
    debian_tar "$WORK/base.tar"
    podman import --quiet --change 'CMD ["/bin/bash"]' "$WORK/base.tar" "$BASE" >/dev/null
    rm -f "$WORK/base.tar"
fi

if ! podman image exists "$BUILDER"; then
    echo "image.sh: making $BUILDER (Debian + gcc + the host's Rust toolchain at /usr/local/rust)" >&2
    debian_tar "$WORK/builder.tar" --include=gcc,libc6-dev,ca-certificates \
        --customize-hook="mkdir -p \"\$1/usr/local/rust\" && tar -C '$SYSROOT' --exclude=./share -c . | tar -C \"\$1/usr/local/rust\" -x"
    podman import --quiet \
        --change 'ENV PATH=/usr/local/rust/bin:/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV CARGO_HOME=/usr/local/cargo' \
        "$WORK/builder.tar" "$BUILDER" >/dev/null
    rm -f "$WORK/builder.tar"
fi

# The crates of Cargo.lock, for the Dockerfile's `crates` build context.
# Vendored again only when Cargo.lock changed: fresh copies have new mtimes,
# which re-run the dependencies' build scripts and so rebuild every crate
# in the build's target cache.
lock=$(sha256sum Cargo.lock | cut -d' ' -f1)
if [ "$(cat "$WORK/crates/lock.sha256" 2>/dev/null)" != "$lock" ]; then
    echo "image.sh: vendoring the crates of Cargo.lock" >&2
    rm -rf "$WORK/crates"
    mkdir -p "$WORK/crates"
    cargo vendor --quiet --locked --versioned-dirs "$WORK/crates/vendor" >/dev/null
    echo "$lock" >"$WORK/crates/lock.sha256"
fi
cat > "$WORK/crates/config.toml" <<'TOML'
[source.crates-io]
replace-with = "vendored-sources"

[source.vendored-sources]
directory = "/crates/vendor"
TOML

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
SOURCE=$(git remote get-url origin 2>/dev/null || echo "file://$PWD")
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
echo "image.sh: podman build -t $TAG ." >&2
start=$(date +%s.%N)
# chroot isolation: no nested container runtime (and no cgroups, which are
# hybrid on the development hosts); host network: the runtime stage's apt
# reaches Debian's mirror.
podman build --isolation chroot --network host \
    --build-arg "RUST_IMAGE=$BUILDER" --build-arg "BASE_IMAGE=$BASE" \
    --build-context "crates=$WORK/crates" \
    --build-arg "XFN_VERSION=$VERSION" --build-arg "XFN_SOURCE=$SOURCE" --build-arg "XFN_REVISION=$REVISION" \
    --tag "$TAG" .
end=$(date +%s.%N)
awk -v tag="$TAG" -v s="$start" -v e="$end" \
    -v size="$(podman image inspect --format '{{.Size}}' "$TAG")" \
    -v base="$(podman image inspect --format '{{.Size}}' "$BASE")" \
    'BEGIN { printf "image.sh: %s built in %.0f s; size %.1f MB (base %.1f MB)\n", tag, e - s, size / 1e6, base / 1e6 }'
