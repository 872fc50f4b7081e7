#!/usr/bin/env bash
# Installs everything xfn and its tests need on a fresh Debian bookworm machine
# (scripts/example.sh installs only the part the example needs): Debian
# packages, Python packages, a Debian trixie root for function-pythonic, and
# the peers the tests compare xfn with (scripts/peers.sh).
# Idempotent: re-running it only checks.
set -euo pipefail

cd "$(dirname "$0")/.."
. scripts/lib/apt.sh
# The example's packages (scripts/lib/apt.sh), and the tests' and benchmarks'.
packages=(
  "${EXAMPLE_PACKAGES[@]}"
  uidmap          # newuidmap/newgidmap (podman, the benchmark peer; subordinate ids and `unshare --map-users` in the tests)
  podman          # the run benchmark's peer
  zstd            # zstd layers in the tests
  hyperfine       # the benchmarks
  util-linux      # setpriv/unshare: tests run xfn as an unprivileged user, and as a pod's root (run_pod_shape.rs)
  strace          # tests/image_cache.rs checks each cache entry is fsynced before its rename
  eatmydata       # benches/pull-durability.sh: a pull without its fsyncs, for the ratio
  openssl hostname # the TLS registry tests make a CA; they need a non-loopback address
  iproute2 curl
  python3-yaml    # benches/render.sh reads the renders it checks; tests/deploy/validate.py
  mmdebstrap      # scripts/image.sh: the runner image's base images from Debian's packages
)
apt_install "${packages[@]}"

# Crossplane's published Python function SDK: the render tests drive a real
# function written with it (Development runtime).
if ! python3 -c 'import crossplane.function' 2>/dev/null; then
  echo "setup: installing crossplane-function-sdk-python" >&2
  # Debian's own python3 comes without pip.
  python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
  python3 -m pip install --quiet --disable-pip-version-check crossplane-function-sdk-python==0.15.1 \
    || python3 -m pip install --quiet --break-system-packages crossplane-function-sdk-python==0.15.1
fi

# grpcio (gRPC C-core's Python client): tests/server_lifecycle.rs calls
# `xfn start` on its default socket with it. The SDK above brings it along.
python3 -c 'import grpc' 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check grpcio \
  || python3 -m pip install --quiet --break-system-packages grpcio

# kubernetes-validate: tests/deploy/validate.py checks deploy/ against the
# Kubernetes schemas offline.
if ! python3 -c 'import kubernetes_validate' 2>/dev/null; then
  echo "setup: installing kubernetes-validate" >&2
  python3 -m pip install --quiet --disable-pip-version-check kubernetes-validate==1.37.0 \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages kubernetes-validate==1.37.0
fi

# junitparser: tests/suite.rs reads `xfn test --junit`'s report back with it.
if ! python3 -c 'import junitparser' 2>/dev/null; then
  echo "setup: installing junitparser" >&2
  python3 -m pip install --quiet --disable-pip-version-check junitparser==3.2.0 \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages junitparser==3.2.0
fi

# The Debian package starts a registry on :5000 where systemd runs; the tests
# start their own on random loopback ports, so that one is not needed.
command -v cargo >/dev/null || { echo "setup: cargo not found: install Rust (rustup) first" >&2; exit 1; }

# function-pythonic 0.6.3 (tests/render_pythonic.rs: its own renderer against
# xfn render) needs Python >= 3.12; bookworm has 3.11. A Debian trixie root
# with python3 (mmdebstrap, ~15 s, ~170 MB), the wheels downloaded on the
# host (registries' certificates are not trusted inside a chroot) for
# CPython 3.13, run by chroot (root only: skipped otherwise, and the test
# says so).
pythonic_root=/var/cache/xfn-test/function-pythonic-0.6.3
if [ "$(id -u)" = 0 ] && [ ! -d "$pythonic_root/opt/function-pythonic/crossplane_function_pythonic-0.6.3.dist-info" ]; then
  echo "setup: building $pythonic_root (Debian trixie python3 + function-pythonic 0.6.3)" >&2
  rm -rf "$pythonic_root.tmp"
  mkdir -p "$(dirname "$pythonic_root")"
  timeout 600 mmdebstrap --quiet --variant=minbase --include=python3 trixie "$pythonic_root.tmp" http://deb.debian.org/debian
  python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
  timeout 300 python3 -m pip install --quiet --disable-pip-version-check --ignore-requires-python \
    --target "$pythonic_root.tmp/opt/function-pythonic" --python-version 3.13 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --only-binary=:all: \
    crossplane-function-pythonic==0.6.3
  chroot "$pythonic_root.tmp" env PYTHONPATH=/opt/function-pythonic python3 -m crossplane.pythonic version
  rm -rf "$pythonic_root"
  mv "$pythonic_root.tmp" "$pythonic_root"
fi
# crossplane-function-sdk-python (tests/host_e2e.rs: a function written
# against the SDK, packaged with this root as its image) beside it in
# /opt/function-sdk, its wheels fetched on the host as above.
sdk_version=0.15.1
if [ "$(id -u)" = 0 ] && [ -d "$pythonic_root/opt/function-pythonic" ] \
  && [ ! -d "$pythonic_root/opt/function-sdk/crossplane_function_sdk_python-$sdk_version.dist-info" ]; then
  echo "setup: adding crossplane-function-sdk-python $sdk_version to $pythonic_root" >&2
  rm -rf "$pythonic_root/opt/function-sdk.tmp"
  timeout 300 python3 -m pip install --quiet --disable-pip-version-check --ignore-requires-python \
    --target "$pythonic_root/opt/function-sdk.tmp" --python-version 3.13 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --only-binary=:all: \
    "crossplane-function-sdk-python==$sdk_version"
  chroot "$pythonic_root" env PYTHONPATH=/opt/function-sdk.tmp python3 -c 'import crossplane.function.cli'
  rm -rf "$pythonic_root/opt/function-sdk"
  mv "$pythonic_root/opt/function-sdk.tmp" "$pythonic_root/opt/function-sdk"
fi

# The crossplane CLI, its render engine, xprin and Crossplane's functions,
# built from the Go module proxy into /var/cache/xfn-test/peers
# (tests/render_peers.rs renders with them).
scripts/peers.sh
