#!/bin/sh
# Warm calls through `xfn adapt` (gRPC client → adapt → per-run rootfs →
# crun → back) against bare `crun run` of the same rootfs and spec.
#
# The adapt side is sequential v1 RunFunction calls from the published
# Python SDK's stubs over plaintext TCP, response cache off, timed in the
# client. The bare side is what benches/run.sh times: `unshare` into a
# user+mount namespace, a tmpfs over /sys/fs/cgroup (this host is
# cgroup-hybrid) and `crun run` of a prepared bundle with xfn's own spec.
# The function reads the request and answers `{}`.
#
# Needs: hyperfine, crun, docker-registry, umoci, skopeo, busybox-static,
# python3 with crossplane-function-sdk-python. Run as root from the repo root:
#   cargo build && benches/adapt.sh
set -eu

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

mkdir -p "$WORK/registry"
cat > "$WORK/registry/config.yml" <<YAML
version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: $WORK/registry/storage
http:
  addr: 127.0.0.1:$PORT
YAML
docker-registry serve "$WORK/registry/config.yml" >"$WORK/registry/log" 2>&1 &
REG_PID=$!
for _ in $(seq 50); do
    wget -q -O /dev/null "http://127.0.0.1:$PORT/v2/" 2>/dev/null && break || sleep 0.1
done

umoci init --layout "$WORK/oci" >/dev/null
umoci new --image "$WORK/oci:fn" >/dev/null
umoci unpack --rootless --image "$WORK/oci:fn" "$WORK/unpacked" >/dev/null
mkdir -p "$WORK/unpacked/rootfs/bin"
cp /bin/busybox "$WORK/unpacked/rootfs/bin/busybox"
for applet in sh cat; do ln -s busybox "$WORK/unpacked/rootfs/bin/$applet"; done
printf '#!/bin/sh\ncat >/dev/null\necho {}\n' > "$WORK/unpacked/rootfs/fn"
chmod 755 "$WORK/unpacked/rootfs/fn"
umoci repack --image "$WORK/oci:fn" "$WORK/unpacked" >/dev/null
umoci config --image "$WORK/oci:fn" --config.entrypoint /fn --config.env PATH=/bin >/dev/null
skopeo copy --quiet --dest-tls-verify=false "oci:$WORK/oci:fn" "docker://127.0.0.1:$PORT/fn:v1"
IMAGE="127.0.0.1:$PORT/fn:v1"
CACHE="$WORK/cache"
printf '{"meta":{"tag":"bench"}}' > "$WORK/input.json"

# Capture the spec xfn writes (through a crun wrapper), for the bare bundle.
mkdir -p "$WORK/bare" "$WORK/capture"
chmod 1777 "$WORK/capture"
cat > "$WORK/crun-capture" <<SH
#!/bin/sh
for a; do case "\$prev" in --bundle) cp "\$a/config.json" "$WORK/capture/config.json";; esac; prev=\$a; done
exec crun "\$@"
SH
chmod +x "$WORK/crun-capture"
"$XFN" adapt --insecure --no-response-cache --cache-dir "$CACHE" --image "$IMAGE" \
    --address "127.0.0.1:$APORT" --runtime "$WORK/crun-capture" 2>"$WORK/adapt-capture.log" &
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
cp "$WORK/capture/config.json" "$WORK/bare/config.json"
cp -a "$WORK/unpacked/rootfs" "$WORK/bare/rootfs"
python3 - "$WORK/bare/config.json" <<'PY'
import json, sys
path = sys.argv[1]
spec = json.load(open(path))
spec["root"]["path"] = "rootfs"
json.dump(spec, open(path, "w"))
PY
cat > "$WORK/bare-run" <<SH
#!/bin/sh
mount -t tmpfs tmpfs /sys/fs/cgroup
exec crun --root "$WORK/bare-state" --cgroup-manager=disabled run --no-new-keyring --bundle "$WORK/bare" "bare-\$\$" <"$WORK/input.json"
SH
chmod +x "$WORK/bare-run"
[ "$(unshare --user --map-root-user --mount --propagation private "$WORK/bare-run")" = "{}" ]

hyperfine --warmup 10 --runs "$RUNS" --export-json "$WORK/bare.json" -N \
    --command-name "bare crun run" "unshare --user --map-root-user --mount --propagation private $WORK/bare-run" >/dev/null

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
