#!/usr/bin/env bash
# Cold pull + unpack of a ~50 MB, 3-layer gzip image (incompressible data)
# from a local docker-registry, side by side:
#   xfn pull                      (download, verify, extract every layer)
#   skopeo copy docker:// oci:  +  umoci unpack --rootless
#
# Usage: benches/pull.sh [RUNS]        (default 3 runs each; medians shown)
# Needs: docker-registry, skopeo, umoci (Debian packages of those names),
# cargo. Builds xfn with --release and pushes the image with the ignored test
# tests/image_bench.rs. Each run starts from an empty cache / empty OCI dir;
# the registry's files are in the page cache for both tools (one warm-up
# run of each is discarded).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}

for tool in docker-registry skopeo umoci; do
  command -v "$tool" >/dev/null || { echo "benches/pull.sh: $tool is missing" >&2; exit 1; }
done

work=$(mktemp -d /tmp/xfn-bench.XXXXXX)
# xfn maps root to a subordinate uid in its user namespace: that uid must
# be able to reach the cache dir.
chmod 755 "$work"
reg_pid=
cleanup() {
  [ -n "$reg_pid" ] && kill "$reg_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

port=
for candidate in $(shuf -i 20000-60000 -n 50); do
  if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then port=$candidate; break; fi
done
[ -n "$port" ] || { echo "no free port" >&2; exit 1; }
registry=127.0.0.1:$port

mkdir -p "$work/storage"
cat >"$work/registry.yml" <<YAML
version: 0.1
log: {level: error, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: $work/storage}}
http: {addr: $registry}
YAML
docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
reg_pid=$!
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done

echo "== building xfn (release) and pushing the benchmark image to $registry" >&2
cargo build --release --quiet --bin xfn
XFN_BENCH_REGISTRY=$registry cargo test --quiet --test image -- image_bench:: --ignored --nocapture 2>&1 \
  | grep '^pushed' >&2
image=$registry/bench:v1
xfn=target/release/xfn

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f\n", b - a }'; }
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

run_xfn() {
  local dir=$work/xfn-$1 t0 t1
  t0=$(now)
  "$xfn" pull --cache-dir "$dir" "$image" >/dev/null
  t1=$(now)
  rm -rf "$dir"
  elapsed "$t0" "$t1"
}

run_skopeo_umoci() {
  local oci=$work/oci-$1 bundle=$work/bundle-$1 t0 t1 t2
  t0=$(now)
  skopeo copy --quiet --src-tls-verify=false "docker://$image" "oci:$oci:bench"
  t1=$(now)
  umoci unpack --rootless --image "$oci:bench" "$bundle" >/dev/null
  t2=$(now)
  rm -rf "$oci" "$bundle"
  echo "$(elapsed "$t0" "$t1") $(elapsed "$t1" "$t2") $(elapsed "$t0" "$t2")"
}

run_xfn warmup >/dev/null
run_skopeo_umoci warmup >/dev/null
: >"$work/xfn.times"
: >"$work/other.times"
for i in $(seq "$runs"); do
  run_xfn "$i" >>"$work/xfn.times"
  run_skopeo_umoci "$i" >>"$work/other.times"
done

xfn_med=$(median <"$work/xfn.times")
copy_med=$(awk '{ print $1 }' "$work/other.times" | median)
unpack_med=$(awk '{ print $2 }' "$work/other.times" | median)
total_med=$(awk '{ print $3 }' "$work/other.times" | median)

echo
echo "cold pull + unpack of $image (~50 MB, 3 gzip layers), median of $runs runs"
printf '  %-34s %8ss\n' "xfn pull" "$xfn_med"
printf '  %-34s %8ss  (copy %ss + unpack %ss)\n' "skopeo copy + umoci unpack" "$total_med" "$copy_med" "$unpack_med"
awk -v a="$xfn_med" -v b="$total_med" 'BEGIN { printf "  speed-up: %.1fx\n", b / a }'
echo "  all runs (s): xfn: $(tr '\n' ' ' <"$work/xfn.times")"
echo "                skopeo+umoci (copy unpack total): $(tr '\n' ';' <"$work/other.times")"
