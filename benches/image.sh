#!/bin/sh
# The runner image as a sidecar against the same binary on the host, in one
# run:
#
#   image              size, and the time of `scripts/image.sh` (a rebuild
#                      reuses the base images and cargo's cache mounts)
#   cold start         `podman run -d` of the image (uid 65532,
#                      seccomp/runner.json, unmasked /proc, an empty /xfn
#                      volume) until the first RunFunction call is
#                      answered: container start, xfn start-up, the pull of
#                      the function from a registry on 127.0.0.1, the run
#   warm call          RunFunction p50 through the containerised sidecar vs
#                      the same call to `xfn start` on the host (the very
#                      binary copied out of the image, uid 65532, no
#                      capabilities): the ratio is what the container costs
#
# The function is busybox `cat` of a small FunctionIO; the client is
# benches/server_load.rs over the abstract socket (the container shares the
# host's network namespace, as Crossplane's container shares the pod's).
#
# Needs what scripts/image.sh and benches/server.sh need. Run as root from
# the repository root: benches/image.sh (BUILD=0 TAG=IMAGE: measure an
# image already built, without rebuilding it)
set -eu
. "$(dirname "$0")/../scripts/lib/testbed.sh"

TAG=${TAG:-localhost/xfn:bench}
LATENCY_CALLS=${LATENCY_CALLS:-300}
# The load generator's calls after idle gaps (6.5 s each) are not measured here.
export IDLE_CALLS=0
bench_work image
NAME="xfn-bench-$$"
podman_() { $PODMAN_NS sh -c "$PODMAN_PRELUDE && exec podman \"\$@\"" podman "$@"; }
bench_cleanup_more() {
    podman_ rm -f -t 0 "$NAME" >/dev/null 2>&1 || true
}

if [ "${BUILD:-1}" = 1 ]; then
    scripts/image.sh "$TAG" >"$WORK/image.out" 2>"$WORK/image.log" || { cat "$WORK/image.log" >&2; exit 1; }
    BUILT=$(tail -n1 "$WORK/image.out")
else
    BUILT="$TAG (not rebuilt): size $(podman image inspect --format '{{.Size}}' "$TAG") bytes"
fi

LOAD=$(server_load_binary dev)
cp "$LOAD" "$WORK/load"
LOAD="$WORK/load"
# The image's own xfn, for the host side.
ID=$(podman_ create "$TAG")
podman_ cp "$ID:/usr/local/bin/xfn" "$WORK/xfn" >/dev/null
podman_ rm "$ID" >/dev/null
chmod 755 "$WORK/xfn" "$LOAD"

start_registry
new_busybox_image sh cat
push_image /bin/cat fn:v1
printf 'apiVersion: apiextensions.crossplane.io/v1alpha1\nkind: FunctionIO\nobserved: {}\ndesired: {}\n' >"$WORK/input.yaml"
chmod 644 "$WORK/input.yaml"

# Polls with single calls until one is answered; prints the seconds since $1.
first_call() {
    while ! $AS_NONROOT "$LOAD" "$2" "$IMAGE" "$WORK/input.yaml" 1 1 1 >/dev/null 2>&1; do
        sleep 0.005
    done
    python3 -c "import time,sys; print(f'{time.time() - float(sys.argv[1]):.3f}')" "$1"
}

# The sidecar container, cold: an empty cache volume.
mkdir -p "$WORK/cache-container"
chown "$NONROOT:$NONROOT" "$WORK/cache-container"
SOCKET_C="xfn-image-bench/$$/container"
T0=$(python3 -c 'import time; print(time.time())')
podman_ run -d --name "$NAME" --network host $PODMAN_HOST_FLAGS \
    --read-only --read-only-tmpfs=false \
    --security-opt "seccomp=$PWD/seccomp/runner.json" --security-opt 'unmask=/proc/*' \
    -v "$WORK/cache-container:/xfn" "$TAG" start --allow-shared-uid --address "@$SOCKET_C" >/dev/null
COLD=$(first_call "$T0" "$SOCKET_C")

# The same binary on the host, as uid 65532.
mkdir -p "$WORK/cache-host"
chown "$NONROOT:$NONROOT" "$WORK/cache-host"
SOCKET_H="xfn-image-bench/$$/host"
T0=$(python3 -c 'import time; print(time.time())')
$AS_NONROOT "$WORK/xfn" start --allow-shared-uid --cache-dir "$WORK/cache-host" --address "@$SOCKET_H" 2>"$WORK/host.log" &
XFN_PID=$!
COLD_HOST=$(first_call "$T0" "$SOCKET_H")

# Warm, alternating: container, host, container, host.
for round in 1 2; do
    for side in container host; do
        case $side in container) S=$SOCKET_C ;; host) S=$SOCKET_H ;; esac
        $AS_NONROOT "$LOAD" "$S" "$IMAGE" "$WORK/input.yaml" "$LATENCY_CALLS" 1 1 \
            | sed -n 's/^paced_p50_ms=//p' >>"$WORK/$side.p50"
    done
done

python3 - "$WORK" "$COLD" "$COLD_HOST" "$BUILT" "$(nproc)" <<'PY'
import statistics, sys
work, cold, cold_host, built, cpus = sys.argv[1:]
c = statistics.median(float(x) for x in open(f"{work}/container.p50"))
h = statistics.median(float(x) for x in open(f"{work}/host.p50"))
print(f"CPUs: {cpus}; xfn: the image's release binary on both sides")
print(built)
print(f"cold start to first served call, container : {float(cold) * 1000:8.0f} ms  (incl. the pull)")
print(f"cold start to first served call, host      : {float(cold_host) * 1000:8.0f} ms  (incl. the pull)")
print(f"warm RunFunction p50, container            : {c:8.2f} ms")
print(f"warm RunFunction p50, host xfn start       : {h:8.2f} ms")
print(f"container / host                           : {c / h:8.2f}x")
PY
