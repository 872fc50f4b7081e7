#!/bin/sh
# Back-to-back `xfn render`s of one 3-step pipeline (create → label →
# results, example/render/ without its mark-ready step) through one Docker
# Function, side by side in one run:
#
#   fresh   the default (runtime-docker-cleanup: Remove): every render
#           starts the function server and removes it afterwards.
#   kept    runtime-docker-cleanup: Orphan with runtime-docker-name: every
#           render after the first reuses the kept server through its
#           keeper's socket (and enters no namespace at all).
#
# The function is the static fn_server (tests/fixtures/fn_server.rs) on busybox, pushed to a
# registry on 127.0.0.1. Both renders' outputs are checked first (2
# ConfigMaps labelled team=platform). Prints medians of RUNS renders each
# (default 40; hyperfine, alternating passes) and the ratio; no thresholds.
# The kept server is stopped at the end (`xfn render-servers stop --all`).
#
# Needs: hyperfine, crun, docker-registry, umoci, skopeo, busybox-static,
# python3 with PyYAML, glibc's static libraries. Run as root from the repo
# root: cargo build --release && XFN=target/release/xfn benches/render-kept.sh
# (FUNCTION_SERVER=path/to/static/fn_server skips building it.)
set -eu
. "$(dirname "$0")/../scripts/lib/testbed.sh"

XFN=${XFN:-target/debug/xfn}
XFN=$(realpath "$XFN")
RUNS=${RUNS:-40}
PASSES=${PASSES:-4}
WORK=$(mktemp -d /tmp/xfn-render-kept-XXXXXX)
chmod 755 "$WORK"
PORT=$(( 20000 + $$ % 20000 ))
REG_PID=
CACHE="$WORK/cache"

cleanup() {
    "$XFN" render-servers stop --all --cache-dir "$CACHE" >/dev/null 2>&1 || true
    [ -n "$REG_PID" ] && kill "$REG_PID" 2>/dev/null || true
    if [ -n "${KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT INT TERM

fail() {
    echo "render-kept bench: $*" >&2
    exit 1
}

if [ -z "${FUNCTION_SERVER:-}" ]; then
    echo "building the static fn_server (release)..." >&2
    build_function_server
fi
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

EXAMPLE=$(realpath example/render)
python3 - "$EXAMPLE/composition.yaml" "$WORK/composition.yaml" <<'PY'
import sys, yaml
composition = yaml.safe_load(open(sys.argv[1]))
steps = [s for s in composition["spec"]["pipeline"]
         if s["input"]["action"] in ("create", "label", "results")]
for step in steps:
    step["functionRef"]["name"] = "fn"
composition["spec"]["pipeline"] = steps
yaml.safe_dump(composition, open(sys.argv[2], "w"), sort_keys=False)
PY
function_yaml() {
    printf -- 'apiVersion: pkg.crossplane.io/v1beta1\nkind: Function\n'
    printf 'metadata:\n  name: fn\n  annotations:\n    render.crossplane.io/runtime: Docker\n%s' "$1"
    printf 'spec:\n  package: %s\n' "$SERVER_IMAGE"
}
function_yaml "" >"$WORK/fresh.yaml"
function_yaml "    render.crossplane.io/runtime-docker-cleanup: Orphan
    render.crossplane.io/runtime-docker-name: bench-fn
" >"$WORK/kept.yaml"

RENDER="$XFN render --cache-dir $CACHE $EXAMPLE/xr.yaml $WORK/composition.yaml"
check_render() {
    python3 - "$1" <<'PY' || fail "$1 is not 2 ConfigMaps labelled team=platform"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
cms = [d for d in docs if d.get("kind") == "ConfigMap"]
sys.exit(0 if len(cms) == 2 and all(
    d["metadata"]["labels"].get("team") == "platform" for d in cms) else 1)
PY
}
for mode in fresh kept; do
    $RENDER "$WORK/$mode.yaml" >"$WORK/$mode.out" 2>"$WORK/$mode.log" ||
        { cat "$WORK/$mode.log" >&2; fail "the $mode render failed"; }
    check_render "$WORK/$mode.out"
done
cmp -s "$WORK/fresh.out" "$WORK/kept.out" || fail "fresh and kept renders differ"
"$XFN" render-servers ls --cache-dir "$CACHE" | grep -q bench-fn || fail "no kept server"

printf '%s\t%s\n' fresh "$RENDER $WORK/fresh.yaml" kept "$RENDER $WORK/kept.yaml" >"$WORK/commands"
python3 "$(dirname "$0")/lib/pooled.py" "$WORK" "$RUNS" "$PASSES"
python3 - "$WORK" <<'PY'
import json, sys
median = json.load(open(f"{sys.argv[1]}/medians.json"))
print(f"kept / fresh: {median['kept'] / median['fresh']:.2f}  "
      f"(fresh / kept: {median['fresh'] / median['kept']:.1f}x)")
PY
