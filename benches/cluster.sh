#!/usr/bin/env bash
# XR creation to Ready on a real Crossplane control plane (scripts/cluster.sh:
# etcd, kube-apiserver, Crossplane core v2.4.0 with Function=External), two
# Functions served by `xfn host` against the same two run as native
# processes at the endpoints core dials, as one pod per Function would run
# them; and the memory of each side. Both sides in one run, on one cluster
# (docs/host.md, "Measured"; benches/PROFILE.md):
#
#   xfn       Functions `xfn-one` and `xfn-two`, hosted by one `xfn host`
#             replica in controller mode (`--server-idle $IDLE`): `first`,
#             the first XR (xfn pulls a package at its first call); `zero`,
#             each XR created once xfn runs no server (scaled to zero, the
#             packages pulled); `warm`, XRs one after another; `batch`, BATCH
#             XRs created at once.
#   native    xfn host stopped; Functions `native-one` and `native-two` (the
#             same packages): their revisions' status written as core's
#             Deployment runtime writes it (`endpoint` `dns:///NAME.NS:9443`,
#             the server Secret, RuntimeHealthy); the name resolved (the
#             script's hosts file, as a headless Service's DNS) to the
#             function's binary run on the host with that Secret's
#             certificate for NAME, NAME.NS, NAME.NS.svc from
#             `crossplane-root-ca` (`--tls-certs-dir`, mTLS, as its pod runs
#             it); `warm` and `batch` as above (a pod is never scaled to zero).
#
# Both Functions are function-patch-and-transform v0.10.7 (scripts/peers.sh)
# as real xpkgs: its binary in an OCI image (umoci), `crossplane xpkg build
# --embed-runtime-image-tarball` with its package.yaml, `crossplane xpkg
# push` to a local docker-registry. Only `xfn-one`'s package carries the
# function's CRD (one package may own it); the others are the same runtime
# image with the metadata alone. The Composition: step one composes a
# ConfigMap, step two a second one, each patched from the XR's spec.region
# and ready at once (readinessChecks None), so the XR is Ready when core
# has run both functions and applied what they return.
#
# Each XR is timed by a watch of the API from its create to Ready=True
# (benches/lib/xr_ready.py); a poll every POLL seconds beside it shows what a
# `kubectl get` loop would add. Memory: Rss and Pss of xfn's process tree
# (xfn, its containers' processes) against the native servers' sum.
#
# Needs: scripts/cluster.sh build, scripts/peers.sh's function and CLI,
# crun, docker-registry, umoci, skopeo, openssl, python3. Run as root from
# the repository root (about 4 minutes; it brings up its own cluster on
# XFN_CLUSTER_NET, default 127.0.47, and takes it down):
#   benches/cluster.sh                       (release build, niced)
#   ZERO=5 WARM=10 BATCH=10 POLL=1 IDLE=4s benches/cluster.sh
#   XFN_BINARY=target/release/xfn benches/cluster.sh   (a build made already)
#   LOGS=DIR benches/cluster.sh       (keeps the processes' logs and samples)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
PROFILE=${PROFILE:-release}
ZERO=${ZERO:-5} WARM=${WARM:-10} BATCH=${BATCH:-10} POLL=${POLL:-1} IDLE=${IDLE:-4s}
PEERS=${XFN_TEST_PEERS_DIR:-/var/cache/xfn-test/peers}
PT=$PEERS/functions/function-patch-and-transform
CLI=$PEERS/bin/crossplane
NATIVE_NET=${NATIVE_NET:-127.0.48}
NS=crossplane-system
for need in "$PT/function" "$PT/package.yaml" "$CLI"; do
    [ -e "$need" ] || { echo "missing $need: run scripts/peers.sh" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/xfn-cluster-bench-XXXXXX)
chmod 755 "$WORK"
PORT=$((20000 + $$ % 20000))
REG_PID=
NATIVE_PIDS=
export XFN_CLUSTER_RUN=$WORK/run XFN_CLUSTER_NET=${XFN_CLUSTER_NET:-127.0.47} XFN=$WORK/xfn
export XFN_HOST_ARGS="--server-idle $IDLE"
cleanup() {
    for pid in $NATIVE_PIDS; do kill "$pid" 2>/dev/null || true; done
    if [ -n "${LOGS:-}" ]; then
        mkdir -p "$LOGS"
        cp -r "$XFN_CLUSTER_RUN/log" "$LOGS/" 2>/dev/null || true
        cp "$WORK"/*.json "$WORK"/native-*.log "$LOGS/" 2>/dev/null || true
    fi
    scripts/cluster.sh down 2>/dev/null || true
    [ -z "$REG_PID" ] || kill "$REG_PID" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
# shellcheck source=../scripts/lib/testbed.sh
. scripts/lib/testbed.sh

if [ -n "${XFN_BINARY:-}" ]; then
    cp "$XFN_BINARY" "$XFN"
else
    export CARGO_INCREMENTAL=0
    renice -n 10 -p $$ >/dev/null
    cargo build --quiet --profile "$PROFILE" --bin xfn
    renice -n 0 -p $$ >/dev/null
    case "$PROFILE" in dev) cp target/debug/xfn "$XFN" ;; *) cp "target/$PROFILE/xfn" "$XFN" ;; esac
fi
chmod 755 "$XFN"

# The packages. The runtime image: the binary at /function, its Dockerfile's
# user and port (distroless' nonroot), as a `docker save` tarball.
start_registry
REG=127.0.0.1:$PORT
umoci init --layout "$WORK/oci" >/dev/null
umoci new --image "$WORK/oci:fn" >/dev/null
umoci unpack --rootless --image "$WORK/oci:fn" "$WORK/unpacked" >/dev/null
cp "$PT/function" "$WORK/unpacked/rootfs/function"
umoci repack --image "$WORK/oci:fn" "$WORK/unpacked" >/dev/null
umoci config --image "$WORK/oci:fn" --config.entrypoint /function --config.user 65532:65532 \
    --config.exposedports 9443/tcp >/dev/null
skopeo copy --quiet "oci:$WORK/oci:fn" "docker-archive:$WORK/runtime.tar:function:v0.10.7"
rm -rf "$WORK/oci" "$WORK/unpacked"
mkdir -p "$WORK/pkg-crd" "$WORK/pkg-meta"
cp "$PT/package.yaml" "$WORK/pkg-crd/crossplane.yaml"
awk 'NR > 1 && /^---$/ { exit } { print }' "$PT/package.yaml" >"$WORK/pkg-meta/crossplane.yaml"
for pkg in crd meta; do
    "$CLI" xpkg build --package-root "$WORK/pkg-$pkg" \
        --embed-runtime-image-tarball "$WORK/runtime.tar" -o "$WORK/$pkg.xpkg" >/dev/null
done
rm "$WORK/runtime.tar"
push() { "$CLI" xpkg push -f "$WORK/$1.xpkg" "$REG/$2:v0.10.7" >/dev/null; }
push crd xfn-one
for name in xfn-two native-one native-two; do push meta "$name"; done

function_yaml() {
    printf 'apiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: %s\nspec:\n  package: %s\n' \
        "$1" "$REG/$1:v0.10.7"
}
composition_yaml() { # NAME FUNCTION-ONE FUNCTION-TWO
    cat <<EOF
apiVersion: apiextensions.crossplane.io/v1
kind: Composition
metadata: {name: $1}
spec:
  compositeTypeRef: {apiVersion: bench.xfn.io/v1, kind: XBench}
  mode: Pipeline
  pipeline:
EOF
    local step fn
    for step in one two; do
        fn=$2
        [ "$step" = two ] && fn=$3
        cat <<EOF
    - step: $step
      functionRef: {name: $fn}
      input:
        apiVersion: pt.fn.crossplane.io/v1beta1
        kind: Resources
        resources:
          - name: map-$step
            base: {apiVersion: v1, kind: ConfigMap, data: {step: $step}}
            patches:
              - {type: FromCompositeFieldPath, fromFieldPath: spec.region, toFieldPath: data.region}
            readinessChecks: [{type: None}]
EOF
    done
}
xrd_yaml() {
    cat <<EOF
apiVersion: apiextensions.crossplane.io/v2
kind: CompositeResourceDefinition
metadata: {name: xbenches.bench.xfn.io}
spec:
  group: bench.xfn.io
  names: {kind: XBench, plural: xbenches}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      referenceable: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                region: {type: string}
EOF
}

scripts/cluster.sh up
eval "$(scripts/cluster.sh env)"
k() { kubectl "$@"; }
# until WHAT COMMAND...: the command succeeds within 240 s, or the bench fails.
until_ok() {
    local what=$1 i
    shift
    for ((i = 0; i < 1200; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    echo "cluster bench: $what not within 240 s (logs: $XFN_CLUSTER_RUN/log/)" >&2
    tail -20 "$XFN_CLUSTER_RUN"/log/crossplane-core.log >&2
    exit 1
}
condition() { # KIND NAME TYPE: the condition is True
    [ "$(k get "$1" "$2" -o "jsonpath={.status.conditions[?(@.type==\"$3\")].status}")" = True ]
}
resolves() { grep -q " $1.$NS " "$XFN_CLUSTER_RUN/hosts"; }

{ function_yaml xfn-one; echo ---; function_yaml xfn-two; } | k apply -f - >/dev/null
xrd_yaml | k apply -f - >/dev/null
until_ok "the XRD established" condition compositeresourcedefinition xbenches.bench.xfn.io Established
for fn in xfn-one xfn-two; do
    until_ok "Function $fn healthy" condition function "$fn" Healthy
    until_ok "$fn resolving to xfn host" resolves "$fn"
done
# composed NAME ONE TWO: the Composition applied and its revision made (an
# XR created before the revision waits for a requeue).
composed() {
    composition_yaml "$1" "$2" "$3" | k apply -f - >/dev/null
    until_ok "Composition $1's revision" sh -c \
        "$(command -v kubectl) get compositionrevisions -l crossplane.io/composition-name=$1 -o name | grep -q ."
}
composed via-xfn xfn-one xfn-two
METRICS=http://$XFN_CLUSTER_NET.1:9090/metrics
CORE_METRICS=http://127.0.0.1$(sed -n 's/.*Serving metrics server.*"bindAddress": "\([^"]*\)".*/\1/p' \
    "$XFN_CLUSTER_RUN/log/crossplane-core.log" | tail -1)/metrics
XFN_PID=$(cat "$XFN_CLUSTER_RUN/pid/xfn-host-1")
python3 benches/lib/xr_ready.py "$KUBECONFIG" "$WORK/xfn.json" via-xfn --zero "$ZERO" --warm "$WARM" \
    --batch "$BATCH" --poll "$POLL" --metrics "$METRICS" --core-metrics "$CORE_METRICS" --tree "$XFN_PID"

# The native side: xfn host gone, its names resolve to nothing.
scripts/cluster.sh host stop 1
{ function_yaml native-one; echo ---; function_yaml native-two; } | k apply -f - >/dev/null
: >"$WORK/hosts.extra"
n=0
for fn in native-one native-two; do
    n=$((n + 1))
    until_ok "Function $fn installed" condition function "$fn" Installed
    rev=$(k get functionrevisions -l "pkg.crossplane.io/package=$fn" -o 'jsonpath={.items[0].metadata.name}')
    # The server certificate core's Deployment runtime issues its pod, in
    # the Secret it names on the revision.
    certs=$WORK/certs-$fn
    mkdir -p "$certs"
    cp "$XFN_CLUSTER_RUN/ca/tls.crt" "$certs/ca.crt"
    openssl req -newkey rsa:2048 -nodes -subj "/CN=$fn" -keyout "$certs/tls.key" -out "$certs/tls.csr" 2>/dev/null
    printf 'subjectAltName=DNS:%s,DNS:%s.%s,DNS:%s.%s.svc\nextendedKeyUsage=serverAuth\n' \
        "$fn" "$fn" "$NS" "$fn" "$NS" >"$certs/ext"
    openssl x509 -req -in "$certs/tls.csr" -CA "$XFN_CLUSTER_RUN/ca/tls.crt" -CAkey "$XFN_CLUSTER_RUN/ca/tls.key" \
        -CAcreateserial -CAserial "$certs/serial" -days 1 -extfile "$certs/ext" -out "$certs/tls.crt" 2>/dev/null
    k -n "$NS" create secret generic "$fn-tls-server" --from-file="$certs/tls.crt" \
        --from-file="$certs/tls.key" --from-file="$certs/ca.crt" >/dev/null
    # What the Deployment runtime writes once its Deployment serves (and xfn's
    # controller writes for its own): the endpoint, the Secret, the runtime
    # conditions core's package manager reads for Healthy.
    now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    k apply --server-side --subresource=status --field-manager=native-runtime -f - >/dev/null <<EOF
apiVersion: pkg.crossplane.io/v1
kind: FunctionRevision
metadata: {name: $rev}
status:
  endpoint: dns:///$fn.$NS:9443
  tlsServerSecretName: $fn-tls-server
  conditions:
    - {type: RuntimeHealthy, status: "True", reason: HealthyPackageRevision, lastTransitionTime: "$now"}
    - {type: RuntimeActive, status: "True", reason: ActiveRuntime, lastTransitionTime: "$now"}
EOF
    setsid "$PT/function" --tls-certs-dir "$certs" --address "$NATIVE_NET.$n:9443" \
        >"$WORK/$fn.log" 2>&1 </dev/null &
    NATIVE_PIDS="$NATIVE_PIDS $!"
    echo "$NATIVE_NET.$n $fn $fn.$NS $fn.$NS.svc $fn.$NS.svc.cluster.local" >>"$WORK/hosts.extra"
done
cp "$WORK/hosts.extra" "$XFN_CLUSTER_RUN/hosts.extra"
for fn in native-one native-two; do
    until_ok "Function $fn healthy" condition function "$fn" Healthy
    until_ok "$fn resolving to its server" resolves "$fn"
done
composed via-native native-one native-two
NATIVE_PIDS=${NATIVE_PIDS# }
python3 benches/lib/xr_ready.py "$KUBECONFIG" "$WORK/native.json" via-native --warm "$WARM" \
    --batch "$BATCH" --poll "$POLL" --core-metrics "$CORE_METRICS" --pids "${NATIVE_PIDS// /,}"

python3 - "$WORK/xfn.json" "$WORK/native.json" "$POLL" <<'EOF'
import json, statistics, sys
x, n = (json.load(open(p)) for p in sys.argv[1:3])
poll = sys.argv[3]
ms = lambda samples, k="watch": statistics.median(s[k] for s in samples) * 1000
rows = [("first XR (xfn pulls the packages)", ms(x["samples"]["first"]), None),
        ("XR to Ready, from zero (median)", ms(x["samples"]["zero"]), None),
        ("XR to Ready, warm (median)", ms(x["samples"]["warm"]), ms(n["samples"]["warm"])),
        (f"  the same seen by a {poll} s poll", ms(x["samples"]["warm"], "poll"), ms(n["samples"]["warm"], "poll")),
        (f"{len(x['samples']['batch'])} XRs at once, each (median)", ms(x["samples"]["batch"]), ms(n["samples"]["batch"])),
        (f"{len(x['samples']['batch'])} XRs at once, all", x["batch_all"] * 1000, n["batch_all"] * 1000)]
print(f"\n{'':40} {'xfn host':>12} {'native':>12} {'xfn/native':>10}")
for name, a, b in rows:
    ratio = f"{a / b:.2f}x" if b else ""
    print(f"{name:40} {a:9.0f} ms {b or 0:9.0f} ms {ratio:>10}" if b else f"{name:40} {a:9.0f} ms {'—':>12}")
mb = lambda m, f="Rss": m[f] / 1024
for when, label in (("idle", "idle, before any XR"), ("warm", "after the warm XRs"), ("after", "after the batch")):
    a, b = x["memory"][when], n["memory"][when]
    print(f"{'memory ' + label + ', Rss':40} {mb(a):9.1f} MB {mb(b):9.1f} MB {mb(a) / mb(b):9.2f}x"
          f"   (Pss {mb(a, 'Pss'):.1f} / {mb(b, 'Pss'):.1f} MB; {a['processes']} / {b['processes']} processes)")
z = x["memory"]["zero"]
print(f"{'memory scaled to zero (xfn), Rss':40} {mb(z):9.1f} MB   (Pss {mb(z, 'Pss'):.1f} MB; {z['processes']} processes)")
print(f"processes counted, by name: xfn's tree [{' '.join(x['memory']['after']['commands'])}]; native [{' '.join(n['memory']['after']['commands'])}]")
print("\nWhat an XR cost up to Ready, per XR (core's metrics; xfn's own count of calls):")
print(f"{'':22} {'XR to Ready':>12} {'reconciles':>10} {'their time':>11} {'queued':>9} "
      f"{'RunFunction':>11} {'their time':>11} {'xfn calls':>9}")
for side, r in (("xfn", x), ("native", n)):
    for kind, c in r["counts"].items():
        own = f"{c['xfn_calls']:.1f}" if "xfn_calls" in c else "—"
        print(f"{side + ' ' + kind:22} {ms(r['samples'][kind]):9.0f} ms {c['reconciles']:10.1f} "
              f"{c['reconcile_seconds'] * 1000:8.0f} ms {c['queue_seconds'] * 1000:6.0f} ms {c['fn_calls']:11.1f} "
              f"{c['fn_seconds'] * 1000:8.1f} ms {own:>9}")
print("load (1/5/15 min) at each phase: xfn " + "; ".join(f"{k} {v}" for k, v in x["load"].items())
      + " | native " + "; ".join(f"{k} {v}" for k, v in n["load"].items()))
EOF
