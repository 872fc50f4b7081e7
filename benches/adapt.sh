#!/bin/sh
# Warm calls through `xfn adapt` (gRPC client → adapt → per-run rootfs →
# crun → back) against bare `crun run` of the same rootfs and spec.
#
# The adapt side is sequential v1 RunFunction calls from the published
# Python SDK's stubs over plaintext TCP, response cache off, timed in the
# client. The bare side is the floor benches/run.sh times too (built by
# scripts/lib/testbed.sh): `unshare` into a user+mount namespace, a tmpfs over
# /sys/fs/cgroup (this host is cgroup-hybrid) and `crun run` of a prepared
# bundle with xfn's own spec.
# The function reads the request and answers `{}`.
#
# Needs: hyperfine, crun, docker-registry, umoci, skopeo, busybox-static,
# python3 with crossplane-function-sdk-python. Run as root from the repo root:
#   cargo build && benches/adapt.sh
set -eu
. "$(dirname "$0")/../scripts/lib/testbed.sh"

XFN=${XFN:-target/debug/xfn}
XFN=$(realpath "$XFN")
RUNS=${RUNS:-200}
WORK=$(mktemp -d /tmp/xfn-bench-XXXXXX)
chmod 755 "$WORK"
PORT=$(( 20000 + $$ % 20000 ))
APORT=$(( PORT + 1 ))
REG_PID=
ADAPT_PID=

cleanup() {
    [ -n "$ADAPT_PID" ] && kill "$ADAPT_PID" 2>/dev/null || true
    [ -n "$REG_PID" ] && kill "$REG_PID" 2>/dev/null || true
    if [ -n "${KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT INT TERM

start_registry

new_busybox_image sh cat
printf '#!/bin/sh\ncat >/dev/null\necho {}\n' > "$WORK/unpacked/rootfs/fn"
chmod 755 "$WORK/unpacked/rootfs/fn"
push_image /fn fn:v1
CACHE="$WORK/cache"
printf '{"meta":{"tag":"bench"}}' > "$WORK/input.json"

# The bare floor (scripts/lib/testbed.sh): xfn's spec, captured from one
# call through `xfn adapt`, over a copy of the same rootfs.
new_spec_capture
"$XFN" adapt --insecure --no-response-cache --cache-dir "$CACHE" --image "$IMAGE" \
    --address "127.0.0.1:$APORT" --runtime "$CAPTURE_RUNTIME" 2>"$WORK/adapt-capture.log" &
ADAPT_PID=$!
cat > "$WORK/client.py" <<'PY'
import statistics, sys, time
import grpc
from crossplane.function.proto.v1 import run_function_pb2 as fnv1
from crossplane.function.proto.v1 import run_function_pb2_grpc as grpcv1
address, runs = sys.argv[1], int(sys.argv[2])
for _ in range(600):
    try:
        with grpc.insecure_channel(address) as ch:
            grpc.channel_ready_future(ch).result(timeout=0.2)
        break
    except Exception:
        time.sleep(0.1)
with grpc.insecure_channel(address) as ch:
    stub = grpcv1.FunctionRunnerServiceStub(ch)
    req = fnv1.RunFunctionRequest(meta=fnv1.RequestMeta(tag="bench"))
    for _ in range(min(runs, 10)):
        stub.RunFunction(req, timeout=60)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        r = stub.RunFunction(req, timeout=60)
        times.append(time.perf_counter() - t)
        assert r.meta.tag == "bench"
print(f"{statistics.mean(times)} {statistics.median(times)} {min(times)}")
PY
python3 "$WORK/client.py" "127.0.0.1:$APORT" 1 >/dev/null
kill "$ADAPT_PID"; wait "$ADAPT_PID" 2>/dev/null || true
new_bare_crun "$WORK/input.json"
[ "$($BARE_RUN)" = "{}" ]

hyperfine --warmup 10 --runs "$RUNS" --export-json "$WORK/bare.json" -N \
    --command-name "bare crun run" "$BARE_RUN" >/dev/null

"$XFN" adapt --insecure --no-response-cache --cache-dir "$CACHE" --image "$IMAGE" \
    --address "127.0.0.1:$APORT" --max-concurrent-runs 1 2>"$WORK/adapt.log" &
ADAPT_PID=$!
python3 "$WORK/client.py" "127.0.0.1:$APORT" "$RUNS" > "$WORK/adapt.txt"

python3 - "$WORK/bare.json" "$WORK/adapt.txt" <<'PY'
import json, sys
bare = json.load(open(sys.argv[1]))["results"][0]
mean, median, low = map(float, open(sys.argv[2]).read().split())
print(f"bare crun run     : mean {bare['mean']*1000:.2f} ms, median {bare['median']*1000:.2f} ms, min {bare['min']*1000:.2f} ms")
print(f"xfn adapt (warm)  : mean {mean*1000:.2f} ms, median {median*1000:.2f} ms, min {low*1000:.2f} ms")
print(f"ratio adapt/bare: mean {mean/bare['mean']:.2f}, median {median/bare['median']:.2f}, min {low/bare['min']:.2f}")
PY
