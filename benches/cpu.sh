#!/bin/sh
# CPU per call and calls/s of two xfn binaries side by side, on one image in
# one run, for a change meant to lower what a call costs:
#
#   benches/cpu.sh BEFORE_XFN AFTER_XFN [ROUNDS]
#
# Each round starts `xfn start` (default flags: the warm pool, functions
# started ahead) from each binary in turn, alternating which goes first,
# and drives it with 16 callers (benches/server_load.rs) for CALLS calls
# (env, default 2000) of busybox `cat` of a small FunctionIO. For each it
# prints calls/s and the CPU per call of the daemon and of every process it
# reaped (crun, the containers, so the function too), read from
# /proc/<daemon>/stat around the load: on a machine shared with other
# work that is the figure to compare, not wall time, which moves with the
# neighbours' load. The medians over the rounds close the report, and the
# load average before each round says how busy the machine was.
#
# With PERF_DATA=FILE, one more run of the AFTER binary, not counted, is
# sampled by `perf record -g -a` (the whole machine: read the daemon's,
# crun's, the containers' and the load generator's shares) into FILE
# (`perf report -i FILE --sort comm,dso`).
#
# Both daemons run as uid 65532 without capabilities (the realistic
# sidecar). Needs what benches/server.sh needs but hyperfine and podman.
# Run as root from the repository root, with binaries built by `cargo build
# --release` (keep a copy of the "before" one out of target/).
set -eu
. "$(dirname "$0")/../scripts/lib/testbed.sh"

[ $# -ge 2 ] || { echo "usage: $0 BEFORE_XFN AFTER_XFN [ROUNDS]" >&2; exit 2; }
ROUNDS=${3:-3}
CALLS=${CALLS:-2000}
CALLERS=${CALLERS:-16}
bench_work cpu

# The load generator (LOAD_BINARY: one built already).
LOAD=${LOAD_BINARY:-}
[ -n "$LOAD" ] || LOAD=$(server_load_binary release)
# World-readable copies for uid 65532.
cp "$1" "$WORK/before"
cp "$2" "$WORK/after"
cp "$LOAD" "$WORK/load"
chmod 755 "$WORK/before" "$WORK/after" "$WORK/load"

start_registry
new_busybox_image sh cat
push_image /bin/cat fn:v1
printf 'apiVersion: apiextensions.crossplane.io/v1alpha1\nkind: FunctionIO\nobserved: {}\ndesired: {}\n' >"$WORK/input.yaml"
chmod 644 "$WORK/input.yaml"

# xfn_of PID: the daemon under the process `xfn start` was started as (see
# benches/server.sh): the one that reaps crun and the containers.
xfn_of() {
    for child in $(cat "/proc/$1/task/$1/children"); do
        if grep -q '^NSpid:.*[[:space:]]1$' "/proc/$child/status"; then
            # shellcheck disable=SC2046 # one pid, without the file's trailing space
            echo $(cat "/proc/$child/task/$child/children")
            return
        fi
    done
    echo "$1"
}

# cpu_ticks PID: user + system time of PID and of the children it reaped.
cpu_ticks() {
    awk '{print $14 + $15 + $16 + $17}' "/proc/$1/stat"
}

# measure NAME ROUND: one daemon of binary NAME, CALLS calls from CALLERS
# callers; appends "NAME ROUND calls/s cpu_ms_per_call" to results.
measure() {
    socket="xfn-cpu-bench/$$/$1-$2"
    cache="$WORK/cache-$1-$2"
    mkdir -p "$cache"
    chown "$NONROOT:$NONROOT" "$cache"
    $AS_NONROOT "$WORK/$1" start --allow-shared-uid --cache-dir "$cache" --address "@$socket" \
        --max-queued-runs 64 2>"$WORK/xfn-$1-$2.log" &
    XFN_PID=$!
    sleep 1
    # Pull, and warm the pool, before counting.
    $AS_NONROOT env IDLE_CALLS=0 "$WORK/load" "$socket" "$IMAGE" "$WORK/input.yaml" 0 200 "$CALLERS" >/dev/null
    sleep 1
    daemon=$(xfn_of "$XFN_PID")
    perf=
    if [ "$2" = perf ]; then
        perf record -q -g -a -o "$PERF_DATA" &
        perf=$!
        sleep 1
    fi
    before=$(cpu_ticks "$daemon")
    rate=$($AS_NONROOT env IDLE_CALLS=0 "$WORK/load" "$socket" "$IMAGE" "$WORK/input.yaml" 0 "$CALLS" "$CALLERS" |
        sed -n 's/^throughput_[0-9]*_callers_per_s=//p')
    if [ -n "$perf" ]; then kill -INT "$perf" || true; wait "$perf" || true; fi
    # The 10 calls the load generator makes before it counts, too.
    ticks=$(( $(cpu_ticks "$daemon") - before ))
    kill -TERM "$XFN_PID"
    wait "$XFN_PID"
    XFN_PID=
    [ "$2" != perf ] || return 0
    echo "$1 $2 $rate $(echo "$ticks $(getconf CLK_TCK) $CALLS" | awk '{printf "%.2f", $1 * 1000 / $2 / ($3 + 10)}')" >>"$WORK/results"
}

for round in $(seq "$ROUNDS"); do
    echo "round $round: load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    if [ $((round % 2)) -eq 1 ]; then
        measure before "$round"
        measure after "$round"
    else
        measure after "$round"
        measure before "$round"
    fi
done

[ -z "${PERF_DATA:-}" ] || measure after perf

python3 - "$WORK/results" "$CALLERS" "$CALLS" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
print(f"{sys.argv[3]} calls from {sys.argv[2]} callers per daemon and round (busybox cat, pooled, uid 65532)")
print("round  before: calls/s  CPU ms/call   after: calls/s  CPU ms/call")
rounds = sorted({int(r[1]) for r in rows})
get = lambda name, rnd: next(r for r in rows if r[0] == name and int(r[1]) == rnd)
for rnd in rounds:
    b, a = get("before", rnd), get("after", rnd)
    print(f"{rnd:>5}  {float(b[2]):15.1f}  {float(b[3]):11.2f}  {float(a[2]):15.1f}  {float(a[3]):11.2f}")
med = lambda name, i: statistics.median(float(r[i]) for r in rows if r[0] == name)
print(f"median {med('before', 2):15.1f}  {med('before', 3):11.2f}  {med('after', 2):15.1f}  {med('after', 3):11.2f}")
print(f"after / before: calls/s {med('after', 2) / med('before', 2):.3f}, CPU per call {med('after', 3) / med('before', 3):.3f}")
PY
