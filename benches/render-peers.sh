#!/bin/sh
# `xfn render` against `crossplane render` itself (issue 44), side by side in
# one run, both with function-patch-and-transform's own example/ and the
# function run natively (`Development` runtime: both renderers call the same
# gRPC server process, started once):
#
#   1 XR     one render of the example's XR by each.
#   20 XRs   the XR under 20 names: 20 `crossplane render`s (it renders one
#            XR per run) against 20 `xfn render`s, and against one `xfn
#            render` of a 20-document XR file (xfn renders each in turn).
#
# `crossplane render` is crossplane/cli with Crossplane's render engine
# (`--crossplane-binary`, its `internal render`), both from
# scripts/peers.sh. Both outputs are compared byte for byte first. Prints
# medians (RUNS runs each, default 20, pooled from PASSES hyperfine passes,
# default 2, in alternating order) and ratios; no thresholds.
#
# Needs: scripts/peers.sh's peers, hyperfine, python3. Run from the repo root:
#   cargo build --release && XFN=target/release/xfn benches/render-peers.sh
set -eu
XFN=$(realpath "${XFN:-target/debug/xfn}")
BENCHES=$(realpath "$(dirname "$0")")
RUNS=${RUNS:-20}
PASSES=${PASSES:-2}
PEERS=${XFN_TEST_PEERS_DIR:-/var/cache/xfn-test/peers}
CLI=$PEERS/bin/crossplane
CORE=$PEERS/bin/crossplane-core
PNT=$PEERS/functions/function-patch-and-transform
for need in "$CLI" "$CORE" "$PNT/function"; do
    [ -x "$need" ] || { echo "render-peers bench: $need missing: run scripts/peers.sh" >&2; exit 1; }
done
WORK=$(mktemp -d /tmp/xfn-render-peers-XXXXXX)
SERVER_PID=
cleanup() {
    [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null || true
    if [ -n "${KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT INT TERM

cp -r "$PNT/example/." "$WORK/"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$PNT/function" --insecure --address "127.0.0.1:$PORT" >"$WORK/function.log" 2>&1 &
SERVER_PID=$!
python3 - "$PORT" <<'PY'
import socket, sys, time
for _ in range(500):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.1).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.02)
sys.exit("function-patch-and-transform never listened")
PY
ANNOTATE="-a render.crossplane.io/runtime=Development -a render.crossplane.io/runtime-development-target=127.0.0.1:$PORT"
CP="$CLI render xr.yaml composition.yaml functions.yaml --crossplane-binary $CORE $ANNOTATE"
XR="$XFN render --cache-dir $WORK/cache xr.yaml composition.yaml functions.yaml $ANNOTATE"
cd "$WORK"
$CP >cp.out 2>cp.err || { cat cp.err >&2; exit 1; }
$XR >xfn.out 2>xfn.err || { cat xfn.err >&2; exit 1; }
cmp -s cp.out xfn.out || { diff cp.out xfn.out >&2; echo "outputs differ" >&2; exit 1; }

# The XR under 20 names: one file each (for the CLI), and one stream (xfn).
python3 - <<'PY'
import yaml
xr = yaml.safe_load(open("xr.yaml"))
docs = []
for i in range(20):
    xr["metadata"]["name"] = f"example-xr-{i}"
    text = yaml.safe_dump(xr, sort_keys=False)
    open(f"xr-{i}.yaml", "w").write(text)
    docs.append(text)
open("xrs.yaml", "w").write("---\n".join(docs))
PY
{
    echo '#!/bin/sh'
    echo 'set -e'
    for i in $(seq 0 19); do echo "$CLI render xr-$i.yaml composition.yaml functions.yaml --crossplane-binary $CORE $ANNOTATE >/dev/null"; done
} >cp-20
{
    echo '#!/bin/sh'
    echo 'set -e'
    for i in $(seq 0 19); do echo "$XFN render --cache-dir $WORK/cache xr-$i.yaml composition.yaml functions.yaml $ANNOTATE >/dev/null"; done
} >xfn-20
chmod +x cp-20 xfn-20
[ "$(./xfn-20 && $XFN render --cache-dir "$WORK/cache" xrs.yaml composition.yaml functions.yaml $ANNOTATE | grep -c '^kind: XR$')" = 20 ] ||
    { echo "xfn's 20-XR render did not render 20 XRs" >&2; exit 1; }

printf '%s\t%s\n' \
    "crossplane render, 1 XR" "$CP" \
    "xfn render, 1 XR" "$XR" \
    "crossplane render x20" "$WORK/cp-20" \
    "xfn render x20" "$WORK/xfn-20" \
    "xfn render, 20 XRs in 1" "$XFN render --cache-dir $WORK/cache xrs.yaml composition.yaml functions.yaml $ANNOTATE" \
    >commands

echo "xfn: $XFN"
python3 "$BENCHES/lib/pooled.py" "$WORK" "$RUNS" "$PASSES" 1
python3 - "$WORK" <<'PY'
import json, sys
r = json.load(open(f"{sys.argv[1]}/medians.json"))
print(f"crossplane / xfn, 1 XR            : {r['crossplane render, 1 XR'] / r['xfn render, 1 XR']:9.2f}")
print(f"crossplane / xfn, 20 renders      : {r['crossplane render x20'] / r['xfn render x20']:9.2f}")
print(f"crossplane x20 / xfn 20 XRs in 1  : {r['crossplane render x20'] / r['xfn render, 20 XRs in 1']:9.2f}")
PY
