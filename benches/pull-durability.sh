#!/usr/bin/env bash
# What making the cache crash-safe costs a cold pull: the same `xfn pull`
# (release) of the same image from a local docker-registry, with its
# durability step (every entry fsynced, or a layer tree syncfs'd, before the
# rename that publishes it, and its directory after) and without it
# (eatmydata: LD_PRELOAD turns fsync/fdatasync/syncfs/sync into no-ops),
# alternating in one run, each into an empty cache on disk. Two images: the
# ~50 MB, 3-layer image of benches/pull.sh (tests/image_bench.rs), and a
# small function image (busybox and a script, one layer).
#
# Usage: benches/pull-durability.sh [RUNS]   (default 5 per variant; medians)
#        XFN=path/to/xfn benches/pull-durability.sh   (that binary, no release build)
# Needs: docker-registry, umoci, skopeo, eatmydata (scripts/setup.sh), cargo.
#
# Read with care on a shared machine: syncfs flushes every dirty page of the
# filesystem, the other processes' too, so what a layer's publish costs
# there grows with what others are writing at the time.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}

for tool in docker-registry umoci skopeo eatmydata; do
  command -v "$tool" >/dev/null || { echo "benches/pull-durability.sh: $tool is missing (scripts/setup.sh)" >&2; exit 1; }
done

WORK=$(mktemp -d /var/tmp/xfn-bench.XXXXXX)
# xfn maps root to a subordinate uid in its user namespace: that uid must
# be able to reach the cache dir.
chmod 755 "$WORK"
REG_PID=
trap 'kill "$REG_PID" 2>/dev/null || true; rm -rf "$WORK"' EXIT
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
. scripts/lib/testbed.sh
start_registry

if [ -z "${XFN:-}" ]; then
  echo "== building xfn (release)" >&2
  cargo build --release --quiet --bin xfn
fi
xfn=$(realpath "${XFN:-target/release/xfn}")
echo "== pushing the images to 127.0.0.1:$PORT" >&2
XFN_BENCH_REGISTRY=127.0.0.1:$PORT cargo test --quiet --test image -- image_bench:: --ignored --nocapture 2>&1 \
  | grep '^pushed' >&2
big=127.0.0.1:$PORT/bench:v1
new_busybox_image sh cat sed head printf
install -m 0755 example/function/fn.sh "$WORK/unpacked/rootfs/fn.sh"
push_image /fn.sh bench/small:v1
small=$IMAGE

# pull IMAGE [eatmydata]: seconds for one cold pull into a fresh cache.
pull() {
  local cache=$WORK/cache t0 t1
  t0=$(date +%s.%N)
  ${2:-} "$xfn" pull --cache-dir "$cache" "$1" >/dev/null
  t1=$(date +%s.%N)
  rm -rf "$cache"
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", b - a }'
}
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

echo
echo "cold pull by $xfn, with the durability step (fsync/syncfs) vs without (eatmydata), median of $runs each, alternating"
for image in "$big" "$small"; do
  pull "$image" >/dev/null
  pull "$image" eatmydata >/dev/null
  : >"$WORK/durable" && : >"$WORK/bare"
  for _ in $(seq "$runs"); do
    pull "$image" >>"$WORK/durable"
    pull "$image" eatmydata >>"$WORK/bare"
  done
  durable=$(median <"$WORK/durable")
  bare=$(median <"$WORK/bare")
  printf '  %-40s durable %7ss   without %7ss   ratio %s\n' "$image" "$durable" "$bare" \
    "$(awk -v a="$durable" -v b="$bare" 'BEGIN { printf "%.2fx (+%.0f ms)", a / b, (a - b) * 1000 }')"
  echo "    runs (s): durable $(tr '\n' ' ' <"$WORK/durable")| without $(tr '\n' ' ' <"$WORK/bare")"
done
