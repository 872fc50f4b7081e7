#!/usr/bin/env bash
# xfn's main job on a built-in example, on a fresh machine: installs what is
# needed, builds xfn, builds an example function image (busybox + a shell
# function, with umoci: no Docker), pushes it to a registry it starts on
# 127.0.0.1, and runs the function with xfn on example/functionio.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --quiet
xfn="$PWD/target/release/xfn"

work=$(mktemp -d)
trap 'kill "$registry_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$work/registry.yml" <<YAML
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $work/registry}}
http: {addr: 127.0.0.1:$port}
YAML
docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 50); do curl -fs "http://127.0.0.1:$port/v2/" >/dev/null && break; sleep 0.1; done

# The image: a busybox-static layer and the function script.
umoci init --layout "$work/oci" >/dev/null
umoci new --image "$work/oci:fn" >/dev/null
umoci unpack --rootless --image "$work/oci:fn" "$work/bundle" >/dev/null
rootfs="$work/bundle/rootfs"
mkdir -p "$rootfs/bin"
cp /bin/busybox "$rootfs/bin/busybox"
for applet in sh cat sed head printf; do ln -s busybox "$rootfs/bin/$applet"; done
install -m 0755 example/function/fn.sh "$rootfs/fn.sh"
umoci repack --image "$work/oci:fn" "$work/bundle" >/dev/null
umoci config --image "$work/oci:fn" --config.entrypoint /fn.sh --config.env PATH=/bin >/dev/null
image="127.0.0.1:$port/example/add-bucket:v1"
skopeo copy --quiet --dest-tls-verify=false "oci:$work/oci:fn" "docker://$image"

echo "# xfn run $image example/functionio.yaml" >&2
"$xfn" run --cache-dir "$work/cache" "$image" example/functionio.yaml
