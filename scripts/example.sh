#!/usr/bin/env bash
# xfn's main job on a built-in example, on a fresh machine: installs what is
# needed, builds xfn, builds an example function image (busybox + a shell
# function, with umoci: no Docker), pushes it to a registry it starts on
# 127.0.0.1, and runs the function with xfn on example/functionio.yaml.
#
# `scripts/example.sh render` instead renders example/render/ with the
# `Docker` runtime: it builds an image of a gRPC function server
# (tests/fixtures/fn_server.rs, linked statically, on busybox), pushes it, and runs
# `xfn render`, which serves that image rootless for the render; the output
# is example/render/expected.yaml.
set -euo pipefail
mode=${1:-run}
case $mode in
run | render) ;;
*)
    echo "usage: scripts/example.sh [run|render]" >&2
    exit 2
    ;;
esac
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --quiet
xfn="$PWD/target/release/xfn"

work=$(mktemp -d)
# As root, xfn maps container root to host uid 100000, which must be able to
# reach the cache dir.
chmod 755 "$work"
REG_PID=
trap 'kill "$REG_PID" 2>/dev/null || true; rm -rf "$work"' EXIT
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
WORK=$work
. scripts/lib/testbed.sh
start_registry

if [ "$mode" = render ]; then
    build_function_server
    new_busybox_image
    install -m 0755 "$FUNCTION_SERVER" "$work/unpacked/rootfs/fn_server"
    push_image /fn_server example/function-server:v1
    sed "s|IMAGE|$IMAGE|" example/render/functions-docker.yaml >"$work/functions.yaml"
    echo "# xfn render example/render/xr.yaml example/render/composition.yaml functions.yaml -r  (Function package: $IMAGE)" >&2
    "$xfn" render --cache-dir "$work/cache" \
        example/render/xr.yaml example/render/composition.yaml "$work/functions.yaml" -r
    exit 0
fi

# The image: a busybox-static layer and the function script.
new_busybox_image sh cat sed head printf
install -m 0755 example/function/fn.sh "$work/unpacked/rootfs/fn.sh"
push_image /fn.sh example/add-bucket:v1
image=$IMAGE

echo "# xfn run $image example/functionio.yaml" >&2
"$xfn" run --cache-dir "$work/cache" "$image" example/functionio.yaml
