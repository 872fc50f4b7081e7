#!/usr/bin/env bash
# Host side of the xfn-level VM checks: builds the example function image
# (busybox + example/function/fn.sh, with umoci: no Docker) and pushes it to
# a registry started on 127.0.0.1 whose storage lands in OUTDIR/registry. The
# VM serves that storage with its own docker-registry on its loopback, so
# xfn pulls over a real registry API inside the VM with no network.
# Usage: xfn-image.sh OUTDIR
# The image is 127.0.0.1:5000/example/add-bucket:v1 in the VM.
set -euo pipefail

out=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
rm -rf "$out"
mkdir -p "$out"
tmp=$(mktemp -d)
registry_pid=""
cleanup() {
	[ -z "$registry_pid" ] || kill "$registry_pid" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$tmp/registry.yml" <<YAML
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $out/registry}}
http: {addr: 127.0.0.1:$port}
YAML
docker-registry serve "$tmp/registry.yml" >"$tmp/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 100); do
	curl -fs "http://127.0.0.1:$port/v2/" >/dev/null && break
	sleep 0.1
done
curl -fs "http://127.0.0.1:$port/v2/" >/dev/null || {
	echo "xfn-image: registry did not start: $(cat "$tmp/registry.log")" >&2
	exit 1
}

umoci init --layout "$tmp/oci" >/dev/null
umoci new --image "$tmp/oci:fn" >/dev/null
umoci unpack --rootless --image "$tmp/oci:fn" "$tmp/bundle" >/dev/null
rootfs=$tmp/bundle/rootfs
mkdir -p "$rootfs/bin"
cp /bin/busybox "$rootfs/bin/busybox"
for applet in sh cat sed head printf dd sleep; do ln -s busybox "$rootfs/bin/$applet"; done
install -m 0755 "$repo/example/function/fn.sh" "$rootfs/fn.sh"
# The limit checks' functions (same image, other entrypoints).
install -m 0755 "$here/limit-functions/"*.sh "$rootfs/"
umoci repack --image "$tmp/oci:fn" "$tmp/bundle" >/dev/null
umoci config --image "$tmp/oci:fn" --config.entrypoint /fn.sh --config.env PATH=/bin >/dev/null
skopeo copy --quiet --dest-tls-verify=false "oci:$tmp/oci:fn" "docker://127.0.0.1:$port/example/add-bucket:v1"
tags=""
for fn in "$here"/limit-functions/*.sh; do
	name=$(basename "$fn" .sh)
	tags="$tags $name"
	umoci config --image "$tmp/oci:fn" --tag "$name" --config.entrypoint "/$name.sh" --config.env PATH=/bin >/dev/null
	skopeo copy --quiet --dest-tls-verify=false "oci:$tmp/oci:$name" "docker://127.0.0.1:$port/example/limits:$name"
done
# The render check's function: tests/fixtures/fn_server.rs (a gRPC composition
# function server, linked statically) on busybox, served by xfn render's
# Docker runtime in the VM.
# XFN_VM_FUNCTION_SERVER: one already built (static), else a release build.
if [ -n "${XFN_VM_FUNCTION_SERVER:-}" ]; then
	cp "$XFN_VM_FUNCTION_SERVER" "$tmp/fn_server"
else
	(
		cd "$repo"
		WORK=$tmp
		# shellcheck source=../lib/testbed.sh
		. scripts/lib/testbed.sh
		build_function_server
		cp "$FUNCTION_SERVER" "$tmp/fn_server"
	)
fi
umoci new --image "$tmp/oci:server" >/dev/null
umoci unpack --rootless --image "$tmp/oci:server" "$tmp/server" >/dev/null
mkdir -p "$tmp/server/rootfs/bin"
cp /bin/busybox "$tmp/server/rootfs/bin/busybox"
ln -s busybox "$tmp/server/rootfs/bin/sh"
install -m 0755 "$tmp/fn_server" "$tmp/server/rootfs/fn_server"
umoci repack --image "$tmp/oci:server" "$tmp/server" >/dev/null
umoci config --image "$tmp/oci:server" --config.entrypoint /fn_server >/dev/null
skopeo copy --quiet --dest-tls-verify=false "oci:$tmp/oci:server" "docker://127.0.0.1:$port/example/function-server:v1"
# What the example function must answer to example/functionio.yaml, byte for
# byte (the checks compare xfn's output with it).
sh "$repo/example/function/fn.sh" <"$repo/example/functionio.yaml" >"$out/expected-output.yaml"
echo "xfn-image: example/add-bucket:v1, example/limits:{$tags } and example/function-server:v1 in $out/registry" >&2
