#!/usr/bin/env bash
# Installs everything xfn and its tests need on a fresh Debian bookworm machine.
# Idempotent: re-running it only checks.
set -euo pipefail

packages=(
  crun            # the OCI runtime xfn drives
  uidmap          # newuidmap/newgidmap (podman, the benchmark peer)
  docker-registry # the local registry the tests and the example push to
  busybox-static  # the base of every test and example image
  skopeo umoci    # the example image is built and pushed with them; the pull benchmark's peer
  podman          # the run benchmark's peer
  zstd            # zstd layers in the tests
  hyperfine       # the benchmarks
  util-linux      # setpriv/unshare: tests run xfn as an unprivileged user
  iproute2 curl ca-certificates
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Debian package starts a registry on :5000 where systemd runs; the tests
# start their own on random loopback ports, so that one is not needed.
command -v cargo >/dev/null || { echo "setup: cargo not found: install Rust (rustup) first" >&2; exit 1; }
