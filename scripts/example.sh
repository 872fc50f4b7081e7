#!/usr/bin/env bash
# xfn's main job on a built-in example, on a fresh machine: installs what it
# needs (scripts/lib/apt.sh's EXAMPLE_PACKAGES, not all of scripts/setup.sh), builds xfn, builds an example function image (busybox + a shell
# function, with umoci: no Docker), pushes it to a registry it starts on
# 127.0.0.1, and runs the function with xfn on example/functionio.yaml.
#
# It installs the built xfn as `xfn` on PATH (~/.cargo/bin, as `cargo
# install` would), so the README's commands run as written after it.
#
# `scripts/example.sh registry` leaves a registry running on 127.0.0.1:5000
# (detached; it prints the pid to stop it) holding the example function as
# 127.0.0.1:5000/fn:v1 (the README's `xfn run` and `xfn adapt` lines), a v1
# gRPC function server as fn-server:v1 (`xfn host`) and a base holding xfn
# and crun as xfn:v1 (`xfn wrap`).
#
# `scripts/example.sh render` instead renders example/render/ with the
# `Docker` runtime: it builds an image of a gRPC function server
# (tests/fixtures/fn_server.rs, linked statically, on busybox), pushes it, and runs
# `xfn render`, which serves that image rootless for the render; the output
# is example/render/expected.yaml.
set -euo pipefail
mode=${1:-run}
case $mode in
run | render | registry) ;;
*)
    echo "usage: scripts/example.sh [run|render|registry]" >&2
    exit 2
    ;;
esac
cd "$(dirname "$0")/.."
# Only what the example uses (not the tests' Debian root, Python packages and
# peers: scripts/setup.sh).
. scripts/lib/apt.sh
apt_install "${EXAMPLE_PACKAGES[@]}"
command -v cargo >/dev/null || { echo "example: cargo not found: install Rust (rustup) first" >&2; exit 1; }
cargo build --release --quiet
xfn="$PWD/target/release/xfn"
bin="${CARGO_HOME:-$HOME/.cargo}/bin"
install -D -m 0755 "$xfn" "$bin/xfn"
case ":$PATH:" in
*":$bin:"*) ;;
*) echo "# xfn is installed at $bin/xfn; add $bin to PATH to run it as \`xfn\`" >&2 ;;
esac

if [ "$mode" = registry ]; then
    # A registry that outlives this script, with the example image as fn:v1.
    WORK=/tmp/xfn-example-registry
    PORT=5000
    if wget -q -O - "http://127.0.0.1:$PORT/v2/xfn/tags/list" 2>/dev/null | grep -q '"v1"'; then
        echo "# a registry on 127.0.0.1:$PORT already holds fn:v1, fn-server:v1 and xfn:v1" >&2
        exit 0
    fi
    if wget -q -O /dev/null "http://127.0.0.1:$PORT/v2/" 2>/dev/null; then
        echo "127.0.0.1:$PORT already serves a registry without xfn:v1; stop it first" >&2
        exit 1
    fi
    rm -rf "$WORK" && mkdir -p "$WORK" && chmod 755 "$WORK"
    . scripts/lib/testbed.sh
    start_registry
    new_busybox_image sh cat sed head printf
    install -m 0755 example/function/fn.sh "$WORK/unpacked/rootfs/fn.sh"
    push_image /fn.sh fn:v1
    # The README's `xfn host` line hosts fn-server:v1 (a v1 gRPC function).
    build_function_server
    new_busybox_image
    install -m 0755 "$FUNCTION_SERVER" "$WORK/unpacked/rootfs/fn_server"
    push_image /fn_server fn-server:v1
    # The README's `xfn wrap` line takes xfn:v1 as its base: busybox, this
    # xfn and the host's crun, with the shared libraries they link.
    new_busybox_image sh
    for program in "$xfn" "$(command -v crun)"; do
        install -D -m 0755 "$program" "$WORK/unpacked/rootfs/bin/$(basename "$program")"
        for lib in $(ldd "$program" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
            install -D -m 0755 "$lib" "$WORK/unpacked/rootfs$lib"
        done
    done
    push_image /bin/xfn xfn:v1
    echo "# 127.0.0.1:$PORT serves fn:v1, fn-server:v1 and xfn:v1 (stop it: kill $REG_PID)" >&2
    exit 0
fi

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
