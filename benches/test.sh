#!/bin/sh
# `xfn test` of a suite of 30 test cases against the same 30 cases run as
# xprin runs them: one `xfn render` process per case, then the same checks,
# side by side in one run.
#
#   xfn test      one process: the suite read, the Function's server (a
#                 Docker-runtime Function: the static tests/fixtures/fn_server.rs
#                 in a busybox image) started once, 30 renders over it, the
#                 checks (Count and FieldValue) in-process.
#   30 renders    30 `xfn render` invocations in sequence, each starting and
#                 stopping that server as `crossplane render` starts a
#                 container per render, then one python3 reading all 30
#                 outputs for the same checks (in one process, so the
#                 baseline does not pay an interpreter per case).
#
# With VALIDATE=1 each case also validates its render against the XRD
# (an XRD with a type, a bound and a CEL rule), as xprin runs `crossplane beta validate`
# after each render when a test gives `crds`: the suite gets `crds:`, the
# render side runs `xfn validate` per case.
#
# Then xprin itself (issue 44; skip with XPRIN=0): the same 30 cases as
# one suite run by `xfn test` and by xprin v0.2.0, which forks `crossplane
# render` (CLI v2.5.0, Crossplane's render engine: no Docker) per test;
# both over one fn_server process started here (the Function annotated
# `Development`, so both call the same server). Not with VALIDATE=1:
# `crossplane beta validate` knows Kubernetes' own kinds and refuses the
# suite's Deployment fields, xfn has no schema for them.
#
# Both sides must agree: all 30 cases pass on each (the checks are the
# suite's assertions). Prints the wall time of each (median of RUNS, default
# 3) and the ratios; no threshold. The image is pulled before timing.
#
# Needs: crun, docker-registry, umoci, skopeo, busybox-static, python3 with
# PyYAML, glibc's static libraries (libc6-dev); xprin, crossplane and
# crossplane-core from scripts/peers.sh (PEERS, default
# /var/cache/xfn-test/peers). Run as root from the repo root:
#   cargo build && benches/test.sh   (target/release/xfn when built, else
#                                     target/debug/xfn; XFN= to choose)
# Another xfn beside it (a build made before, to compare): XFN_BINARY=path
# times its `xfn test` and its 30 renders in the same runs, the two
# binaries alternating which goes first.
set -eu
. "$(dirname "$0")/../scripts/lib/testbed.sh"

if [ -z "${XFN:-}" ]; then
    XFN=target/debug/xfn
    [ -x target/release/xfn ] && XFN=target/release/xfn
fi
XFN=$(realpath "$XFN")
BEFORE=${XFN_BINARY:+$(realpath "$XFN_BINARY")}
RUNS=${RUNS:-3}
CASES=30
WORK=$(mktemp -d /tmp/xfn-test-bench-XXXXXX)
chmod 755 "$WORK"
PORT=$(( 20000 + $$ % 20000 ))
REG_PID=
DEV_PID=
DATA=$(realpath tests/suite/data)

cleanup() {
    [ -n "$REG_PID" ] && kill "$REG_PID" 2>/dev/null || true
    [ -n "$DEV_PID" ] && kill "$DEV_PID" 2>/dev/null || true
    if [ -n "${KEEP:-}" ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT INT TERM
fail() { echo "test bench: $*" >&2; exit 1; }

# FUNCTION_SERVER: a static fn_server already built (the tests build one in
# target/debug/fn-server-static/); else it is built here, for release.
if [ -z "${FUNCTION_SERVER:-}" ]; then
    echo "building the static fn_server (release)..." >&2
    build_function_server
fi
FUNCTION_SERVER=$(realpath "$FUNCTION_SERVER")
start_registry
TOP=$WORK
SERVER_IMAGE=$(
    WORK=$TOP/fn-server
    mkdir "$WORK"
    new_busybox_image sh
    cp "$FUNCTION_SERVER" "$WORK/unpacked/rootfs/fn_server"
    push_image /fn_server fn-server:v1
    echo "$IMAGE"
)
WORK=$TOP

# The suite's Composition (4 steps, one Function "fn"), as a Docker Function.
cp "$DATA/composition.yaml" "$WORK/composition.yaml"
printf -- '---\napiVersion: pkg.crossplane.io/v1beta1\nkind: Function\nmetadata:\n  name: fn\n  annotations:\n    render.crossplane.io/runtime: Docker\nspec:\n  package: %s\n' \
    "$SERVER_IMAGE" >"$WORK/functions.yaml"

# 30 XRs (spec.count 1..5), a suite of 30 tests asserting on each.
SUITE=$WORK/bench_xprin.yaml
VALIDATE=${VALIDATE:-0}
# The XRD: spec.count typed and bounded, with a CEL rule (the fields
# Crossplane adds to an XR's spec are kept).
cat >"$WORK/xrd.yaml" <<'YAML'
apiVersion: apiextensions.crossplane.io/v1
kind: CompositeResourceDefinition
metadata: {name: xbuckets.example.org}
spec:
  group: example.org
  names: {kind: XBucket, plural: xbuckets}
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
            x-kubernetes-preserve-unknown-fields: true
            x-kubernetes-validations:
            - {rule: "self.count <= 5", message: at most 5 buckets}
            properties:
              count: {type: integer, minimum: 1}
YAML
CRDS=
[ "$VALIDATE" = 1 ] && CRDS=', crds: [xrd.yaml]'
printf 'common:\n  inputs: {composition: composition.yaml, functions: functions.yaml%s}\ntests:\n' "$CRDS" >"$SUITE"
i=1
while [ "$i" -le "$CASES" ]; do
    count=$(( i % 5 + 1 ))
    sed -e "s/name: demo/name: demo-$i/" -e "s/count: 2/count: $count/" "$DATA/xr.yaml" >"$WORK/xr-$i.yaml"
    cat >>"$SUITE" <<YAML
- name: case $i
  inputs: {xr: xr-$i.yaml}
  assertions:
    xprin:
    - {name: buckets, type: Count, resource: ConfigMap, value: $count}
    - {name: replicas, type: FieldValue, resource: Deployment/my-app, field: spec.replicas, operator: "==", value: 3}
YAML
    i=$(( i + 1 ))
done

CACHE=$WORK/cache
"$XFN" pull --cache-dir "$CACHE" "$SERVER_IMAGE" >/dev/null

now() { date +%s.%N; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# The same checks over the 30 render outputs, in one python3.
check_renders() {
    python3 - "$WORK" "$CASES" <<'PY'
import sys, yaml
work, cases = sys.argv[1], int(sys.argv[2])
passed = 0
for i in range(1, cases + 1):
    docs = [d for d in yaml.safe_load_all(open(f"{work}/out-{i}.yaml")) if d]
    count = i % 5 + 1
    cms = [d for d in docs if d.get("kind") == "ConfigMap"]
    deps = [d for d in docs if d.get("kind") == "Deployment" and d["metadata"]["name"] == "my-app"]
    if len(cms) == count and deps and all(d["spec"]["replicas"] == 3 for d in deps):
        passed += 1
    else:
        print(f"case {i} failed", file=sys.stderr)
print(passed)
PY
}

# time_suite XFN NAME: one `xfn test` of the suite by XFN, its wall time
# added to NAME.times; every case must pass.
time_suite() {
    start=$(now)
    "$1" test --cache-dir "$CACHE" -v "$SUITE" >"$WORK/suite.out" 2>&1 || { cat "$WORK/suite.out" >&2; fail "$1 test failed"; }
    end=$(now)
    echo "$end - $start" | bc >>"$WORK/$2.times"
    suite_passed=$(grep -c -- '^--- PASS: case ' "$WORK/suite.out" || true)
    [ "$suite_passed" = "$CASES" ] || fail "$1 test passed $suite_passed of $CASES"
}

# time_renders XFN NAME: the 30 renders by XFN and the checks, their wall
# time added to NAME.times; every check must pass.
time_renders() {
    start=$(now)
    i=1
    while [ "$i" -le "$CASES" ]; do
        "$1" render --cache-dir "$CACHE" -x "$WORK/xr-$i.yaml" "$WORK/composition.yaml" "$WORK/functions.yaml" \
            >"$WORK/out-$i.yaml" 2>"$WORK/render.err" || { cat "$WORK/render.err" >&2; fail "render of case $i failed"; }
        if [ "$VALIDATE" = 1 ]; then
            "$1" validate "$WORK/xrd.yaml" "$WORK/out-$i.yaml" >"$WORK/validate.out" 2>&1 \
                || { cat "$WORK/validate.out" >&2; fail "validation of case $i failed"; }
        fi
        i=$(( i + 1 ))
    done
    passed=$(check_renders)
    end=$(now)
    echo "$end - $start" | bc >>"$WORK/$2.times"
    [ "$passed" = "$CASES" ] || fail "$1: the renders' checks passed $passed of $CASES"
}

: >"$WORK/suite.times"
: >"$WORK/render.times"
: >"$WORK/suite-before.times"
: >"$WORK/render-before.times"
run=1
while [ "$run" -le "$RUNS" ]; do
    # With XFN_BINARY, it goes first in odd runs.
    if [ -n "$BEFORE" ] && [ $(( run % 2 )) = 1 ]; then
        time_suite "$BEFORE" suite-before
        time_suite "$XFN" suite
        time_renders "$BEFORE" render-before
        time_renders "$XFN" render
    elif [ -n "$BEFORE" ]; then
        time_suite "$XFN" suite
        time_suite "$BEFORE" suite-before
        time_renders "$XFN" render
        time_renders "$BEFORE" render-before
    else
        time_suite "$XFN" suite
        time_renders "$XFN" render
    fi
    run=$(( run + 1 ))
done

SUITE_S=$(median <"$WORK/suite.times")
RENDER_S=$(median <"$WORK/render.times")
printf '%d cases, both sides %d/%d passed (median of %d runs, validation %s; load %s)\n' "$CASES" "$CASES" "$CASES" "$RUNS" \
    "$([ "$VALIDATE" = 1 ] && echo on || echo off)" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf '  xfn test (one process)          %8.3f s\n' "$SUITE_S"
printf '  %d xfn render + the same checks %8.3f s\n' "$CASES" "$RENDER_S"
printf '  ratio                           %8.1fx\n' "$(echo "$RENDER_S / $SUITE_S" | bc -l)"
if [ -n "$BEFORE" ]; then
    printf '  XFN_BINARY (%s):\n' "$BEFORE"
    printf '    xfn test (one process)        %8.3f s\n' "$(median <"$WORK/suite-before.times")"
    printf '    %d xfn render + the checks    %8.3f s\n' "$CASES" "$(median <"$WORK/render-before.times")"
fi

[ "${XPRIN:-1}" = 0 ] && exit 0
[ "$VALIDATE" = 1 ] && { echo "xprin: not with VALIDATE=1 (see the header)"; exit 0; }
PEERS=${PEERS:-/var/cache/xfn-test/peers}
for peer in xprin crossplane crossplane-core; do
    [ -x "$PEERS/bin/$peer" ] || fail "peer $peer is missing: no $PEERS/bin/$peer; run scripts/peers.sh (or XPRIN=0)"
done

# One fn_server for both, a Development Function pointing at it.
DEV_PORT=$(( PORT + 1 ))
"$FUNCTION_SERVER" --insecure --address "127.0.0.1:$DEV_PORT" >"$WORK/fn-server.log" 2>&1 &
DEV_PID=$!
python3 - "$DEV_PORT" <<'PY' || fail "the fn_server did not listen"
import socket, sys, time
for _ in range(200):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.1).close(); sys.exit(0)
    except OSError:
        time.sleep(0.05)
sys.exit(1)
PY
printf -- '---\napiVersion: pkg.crossplane.io/v1beta1\nkind: Function\nmetadata:\n  name: fn\n  annotations:\n    render.crossplane.io/runtime: Development\n    render.crossplane.io/runtime-development-target: 127.0.0.1:%s\nspec:\n  package: %s\n' \
    "$DEV_PORT" "$SERVER_IMAGE" >"$WORK/functions-dev.yaml"
sed 's/functions: functions.yaml/functions: functions-dev.yaml/' "$SUITE" >"$WORK/dev_xprin.yaml"
# xprin's configuration: crossplane render with Crossplane's engine.
mkdir -p "$WORK/validate-cache/xpkg.crossplane.io/crossplane/crossplane@stable"
cat >"$WORK/xprin.yaml" <<YAML
dependencies:
  crossplane: $PEERS/bin/crossplane
subcommands:
  render: render --include-full-xr --crossplane-binary $PEERS/bin/crossplane-core
  validate: resource validate --error-on-missing-schemas --cache-dir $WORK/validate-cache
YAML

: >"$WORK/ours.times"
: >"$WORK/xprin.times"
run=1
while [ "$run" -le "$RUNS" ]; do
    start=$(now)
    "$XFN" test -c "$WORK/xprin.yaml" --cache-dir "$CACHE" -v "$WORK/dev_xprin.yaml" >"$WORK/ours.out" 2>&1 \
        || { cat "$WORK/ours.out" >&2; fail "xfn test (Development) failed"; }
    end=$(now)
    echo "$end - $start" | bc >>"$WORK/ours.times"

    start=$(now)
    PATH="$PEERS/bin:$PATH" "$PEERS/bin/xprin" -c "$WORK/xprin.yaml" test -v "$WORK/dev_xprin.yaml" >"$WORK/xprin.out" 2>&1 \
        || { cat "$WORK/xprin.out" >&2; fail "xprin failed"; }
    end=$(now)
    echo "$end - $start" | bc >>"$WORK/xprin.times"
    run=$(( run + 1 ))
done
for side in ours xprin; do
    n=$(grep -c -- '^--- PASS: case ' "$WORK/$side.out" || true)
    [ "$n" = "$CASES" ] || fail "$side passed $n of $CASES"
done
OURS_S=$(median <"$WORK/ours.times")
XPRIN_S=$(median <"$WORK/xprin.times")
printf '%d cases as one suite, one Development fn_server, both sides %d/%d passed (median of %d runs)\n' \
    "$CASES" "$CASES" "$CASES" "$RUNS"
printf '  xfn test                        %8.3f s   (%s)\n' "$OURS_S" "$XFN"
printf '  xprin (crossplane render each)  %8.3f s\n' "$XPRIN_S"
printf '  ratio                           %8.1fx\n' "$(echo "$XPRIN_S / $OURS_S" | bc -l)"
