#!/bin/sh
# Warm `xfn run` against bare `crun run` of the same rootfs, side by side.
#
# Both sides pay what a fresh process pays: `xfn run` starts, enters its user
# and mount namespace, finds the cached image, mounts the per-run rootfs,
# writes the spec and runs crun; the bare side is `unshare` into a user+mount
# namespace, a tmpfs over /sys/fs/cgroup (this host is cgroup-hybrid) and
# `crun run` of a prepared bundle with xfn's own spec (captured once; the
# floor is built by scripts/lib/testbed.sh).
# The function is busybox `cat` of a small FunctionIO.
#
# Needs: hyperfine (apt-get install hyperfine), crun, docker-registry, umoci,
# skopeo, busybox-static. Run as root from the repository root:
#   cargo build && benches/run.sh            (debug binary)
#   cargo build --release && XFN=target/release/xfn benches/run.sh   (the numbers that matter)
set -eu
. "$(dirname "$0")/../scripts/lib/testbed.sh"

XFN=${XFN:-target/debug/xfn}
XFN=$(realpath "$XFN")
RUNS=${RUNS:-200}
WORK=$(mktemp -d /tmp/xfn-bench-XXXXXX)
chmod 755 "$WORK"
PORT=$(( 20000 + $$ % 20000 ))
REG_PID=

cleanup() {
    [ -n "$REG_PID" ] && kill "$REG_PID" 2>/dev/null || true
    if [ -n "${KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT INT TERM

# A registry on loopback.
start_registry

# The function image: busybox, entrypoint `cat`, built with umoci, pushed with skopeo.
new_busybox_image sh cat
push_image /bin/cat fn:v1

printf 'apiVersion: apiextensions.crossplane.io/v1alpha1\nkind: FunctionIO\nobserved: {}\ndesired: {}\n' >"$WORK/input.yaml"
CACHE="$WORK/cache"

# Warm the cache (pull + extract once) and check the function works.
"$XFN" run --cache-dir "$CACHE" "$IMAGE" "$WORK/input.yaml" >"$WORK/out.yaml"
cmp "$WORK/input.yaml" "$WORK/out.yaml"

# The bare floor (scripts/lib/testbed.sh): xfn's spec, captured from one
# run, over a copy of the same rootfs.
new_spec_capture
"$XFN" run --cache-dir "$CACHE" --runtime "$CAPTURE_RUNTIME" "$IMAGE" "$WORK/input.yaml" >/dev/null
new_bare_crun "$WORK/input.yaml"
$BARE_RUN >"$WORK/bare-out.yaml"
cmp "$WORK/input.yaml" "$WORK/bare-out.yaml"

hyperfine --warmup 10 --runs "$RUNS" --export-json "$WORK/result.json" -N \
    --command-name "bare crun run" "$BARE_RUN" \
    --command-name "xfn run (warm)" "$XFN run --cache-dir $CACHE $IMAGE $WORK/input.yaml"

python3 - "$WORK/result.json" <<'PY'
import json, sys
r = {x["command"]: x for x in json.load(open(sys.argv[1]))["results"]}
bare, xfn = r["bare crun run"], r["xfn run (warm)"]
for name, r_ in (("bare crun run ", bare), ("xfn run (warm)", xfn)):
    print(f"{name}: mean {r_['mean']*1000:.2f} ms ± {r_['stddev']*1000:.2f}, "
          f"median {r_['median']*1000:.2f} ms, min {r_['min']*1000:.2f} ms")
cpu = lambda r_: (r_["user"] + r_["system"]) * 1000
print(f"cpu (user+sys): bare {cpu(bare):.2f} ms, xfn {cpu(xfn):.2f} ms, "
      f"ratio {cpu(xfn)/cpu(bare):.2f} (less sensitive to a loaded machine)")
print(f"ratio xfn/bare: mean {xfn['mean']/bare['mean']:.2f}, "
      f"median {xfn['median']/bare['median']:.2f}, min {xfn['min']/bare['min']:.2f}")
PY
