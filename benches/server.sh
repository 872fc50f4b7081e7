#!/bin/sh
# The sidecar against its floor and against podman, on one image in one run:
#
#   bare crun run      `crun run` of a prepared bundle (the same rootfs, the
#                      spec xfn writes) in a fresh user+mount namespace: the
#                      floor any runner pays per call.
#   xfn cold path      one call to a running `xfn start --warm-pool 0` over
#                      its abstract socket, image cached: every call creates
#                      and starts its container, p50 and p99.
#   xfn pooled         the same against `xfn start` as it runs by default:
#                      calls are served by containers created and started
#                      ahead of them (src/lifecycle/pool.rs).
#                      Both one caller at a time three ways
#                      (benches/server_load.rs): paced 50 ms apart (a warm
#                      call on a quiet daemon, as hyperfine runs the floor),
#                      back to back (one caller saturating the daemon), and
#                      the first call after 6.5 s idle (code paged back in).
#   podman run         `podman run --rm -i` of the same image (pulled from
#                      the same registry), as root.
#   throughput         RunFunction calls/s with 1, 4, 16 and 32 concurrent
#                      callers, for both daemons.
#   RSS                xfn's processes together (the daemon, its gatekeeper,
#                      the supervisor and PID 1 of its PID namespace), idle
#                      (the median of 5 readings from 17 s after one call:
#                      xfn gives code pages back after 5 s without calls,
#                      src/resident.rs), right after the throughput levels
#                      and idle again after them, as
#                      the sum of their RSS (which counts a page of the
#                      binary once per process mapping it) and of their PSS
#                      (which shares it out); for the pooled daemon also its
#                      waiting containers.
#
# The function is busybox `cat` of a small FunctionIO. The daemon and the load
# generator run as uid 65532 with no capabilities (the realistic sidecar).
#
# Needs: hyperfine, crun, podman, docker-registry, umoci, skopeo,
# busybox-static, python3 (all apt-get packages). Run as root from the
# repository root:
#   benches/server.sh                  (debug build)
#   PROFILE=release benches/server.sh  (release build)
#   XFN_BINARY=path/to/xfn LOAD_BINARY=path/to/server_load benches/server.sh
#                                      (builds made before, to compare)
#
# podman on this host: see PODMAN_RUN in scripts/lib/testbed.sh.
set -eu
. "$(dirname "$0")/../scripts/lib/testbed.sh"

PROFILE=${PROFILE:-dev}
RUNS=${RUNS:-200}
LATENCY_CALLS=${LATENCY_CALLS:-500}
CALLS_PER_LEVEL=${CALLS_PER_LEVEL:-400}
bench_work server
bench_cleanup_more() {
    podman rmi -f "127.0.0.1:$PORT/fn:v1" >/dev/null 2>&1 || true
}

# Build xfn and the load generator (unless XFN_BINARY and LOAD_BINARY
# name builds already made, e.g. a kept copy of an earlier xfn to
# compare, as benches/python.sh); find their paths.
[ -n "${XFN_BINARY:-}" ] || cargo build --quiet --profile "$PROFILE" --bin xfn
LOAD=${LOAD_BINARY:-}
[ -n "$LOAD" ] || LOAD=$(server_load_binary "$PROFILE")
case "$PROFILE" in dev) XFN=target/debug/xfn ;; *) XFN=target/$PROFILE/xfn ;; esac
XFN=$(realpath "${XFN_BINARY:-$XFN}")
cp "$XFN" "$WORK/xfn" # world-readable copies for uid 65532
cp "$LOAD" "$WORK/"
chmod 755 "$WORK/xfn" "$WORK/$(basename "$LOAD")"
LOAD="$WORK/$(basename "$LOAD")"
XFN="$WORK/xfn"

# A registry on loopback.
start_registry

# The function image: busybox, entrypoint `cat`, built with umoci, pushed with skopeo.
new_busybox_image sh cat
push_image /bin/cat fn:v1
printf 'apiVersion: apiextensions.crossplane.io/v1alpha1\nkind: FunctionIO\nobserved: {}\ndesired: {}\n' >"$WORK/input.yaml"
chmod 644 "$WORK/input.yaml"

# The bare floor (scripts/lib/testbed.sh): xfn's spec, captured from one
# run (as root), over a copy of the same rootfs.
new_spec_capture
"$XFN" run --cache-dir "$WORK/cache-run" --runtime "$CAPTURE_RUNTIME" "$IMAGE" "$WORK/input.yaml" >/dev/null
new_bare_crun "$WORK/input.yaml"
$BARE_RUN >"$WORK/bare-out.yaml"
cmp "$WORK/input.yaml" "$WORK/bare-out.yaml"

# podman, as root, on the same image from the same registry.
podman pull --quiet --tls-verify=false "$IMAGE" >/dev/null
cat > "$WORK/podman-run" <<SH
#!/bin/sh
$PODMAN_PRELUDE
exec $PODMAN_RUN "$IMAGE" <"$WORK/input.yaml"
SH
chmod +x "$WORK/podman-run"
$PODMAN_NS "$WORK/podman-run" >"$WORK/podman-out.yaml"
cmp "$WORK/input.yaml" "$WORK/podman-out.yaml"

hyperfine --warmup 5 --runs "$RUNS" --export-json "$WORK/fork.json" -N \
    --command-name "bare crun run" "$BARE_RUN" \
    --command-name "podman run" "$PODMAN_NS $WORK/podman-run" >"$WORK/hyperfine.log"

# The sidecar, as uid 65532 without capabilities, on an abstract socket:
# once with every call on the cold path, once as it runs by default.
# rss_of NEEDLE [Rss|Pss]: kB of resident memory (default) or of its
# proportional share of the processes whose command line contains NEEDLE.
rss_of() {
    total=0
    for dir in /proc/[0-9]*; do
        if tr '\0' ' ' 2>/dev/null <"$dir/cmdline" | grep -qF -- "$1"; then
            kb=$(awk -v field="${2:-Rss}:" '$1 == field {print $2}' "$dir/smaps_rollup" 2>/dev/null)
            total=$((total + ${kb:-0}))
        fi
    done
    echo "$total"
}

# rss_containers CACHE: kB of resident memory of the containers of the xfn
# on CACHE, whatever their state (created, or started ahead and running
# the function): the processes whose root mount is an overlay of CACHE's
# layers (the test kit's proc::processes_rooted_under, in shell).
rss_containers() {
    total=0
    for dir in /proc/[0-9]*; do
        if awk -v cache="$1" '$5 == "/" && index($0, cache) { found = 1 } END { exit !found }' \
            "$dir/mountinfo" 2>/dev/null; then
            kb=$(awk '$1 == "Rss:" {print $2}' "$dir/smaps_rollup" 2>/dev/null)
            total=$((total + ${kb:-0}))
        fi
    done
    echo "$total"
}

# rss_settled NEEDLE [Rss|Pss]: the median of five rss_of readings a second
# apart (an idle daemon's background work, such as the warm pool's clock,
# brings a little code back between its releases).
rss_settled() {
    for _ in 1 2 3 4 5; do rss_of "$@"; sleep 1; done | sort -n | sed -n 3p
}

# xfn_of PID: the xfn daemon under the process `xfn start` was started as
# (src/pidns.rs: that one stays outside as a supervisor, its child PID 1 of
# xfn's own PID namespace, whose child is xfn; the gatekeeper is the
# supervisor's other child). The daemon reaps crun and the containers.
xfn_of() {
    for child in $(cat "/proc/$1/task/$1/children"); do
        if grep -q '^NSpid:.*[[:space:]]1$' "/proc/$child/status"; then
            # shellcheck disable=SC2046 # one pid, without the file's trailing space
            echo $(cat "/proc/$child/task/$child/children")
            return
        fi
    done
    echo "$1" # as PID 1 already: no namespace of its own
}

# cpu_ticks PID: user + system time of PID and of the children it reaped.
cpu_ticks() {
    awk '{print $14 + $15 + $16 + $17}' "/proc/$1/stat"
}

# measure_daemon NAME FLAGS...: starts `xfn start FLAGS`, records its RSS
# idle, runs the load generator, records RSS after, stops it (SIGTERM).
measure_daemon() {
    name=$1
    shift
    socket="xfn-bench/$$/$name"
    cache="$WORK/cache-$name"
    mkdir -p "$cache"
    chown "$NONROOT:$NONROOT" "$cache"
    $AS_NONROOT "$XFN" start --allow-shared-uid --cache-dir "$cache" --address "@$socket" \
        --max-queued-runs 64 "$@" 2>"$WORK/xfn-$name.log" &
    XFN_PID=$!
    sleep 1
    # Pull once, then let the daemon settle before its idle figure.
    $AS_NONROOT env IDLE_CALLS=0 "$LOAD" "$socket" "$IMAGE" "$WORK/input.yaml" 1 1 1 >/dev/null
    # Idle: past three of xfn::resident's looks (IDLE_AFTER, 5 s), so the
    # daemon and the gatekeeper have given the calls' code pages back.
    sleep 17
    echo "rss_idle_kb=$(rss_settled "@$socket ")" >"$WORK/load-$name.txt"
    echo "pss_idle_kb=$(rss_settled "@$socket " Pss)" >>"$WORK/load-$name.txt"
    # CPU of the daemon and every process it reaped (crun, containers), per
    # call: what bounds throughput on this machine's cores.
    daemon=$(xfn_of "$XFN_PID")
    ticks_before=$(cpu_ticks "$daemon")
    $AS_NONROOT "$LOAD" "$socket" "$IMAGE" "$WORK/input.yaml" "$LATENCY_CALLS" "$CALLS_PER_LEVEL" 1,4,16,32 >>"$WORK/load-$name.txt"
    calls=$((10 + 2 * LATENCY_CALLS + 3 + 4 * CALLS_PER_LEVEL))
    echo "cpu_ms_per_call=$(( ($(cpu_ticks "$daemon") - ticks_before) * 1000 / $(getconf CLK_TCK) * 100 / calls ))e-2" >>"$WORK/load-$name.txt"
    echo "rss_after_kb=$(rss_of "@$socket ")" >>"$WORK/load-$name.txt"
    echo "pss_after_kb=$(rss_of "@$socket " Pss)" >>"$WORK/load-$name.txt"
    echo "rss_containers_kb=$(rss_containers "$cache/")" >>"$WORK/load-$name.txt"
    sleep 17
    echo "rss_settled_kb=$(rss_settled "@$socket ")" >>"$WORK/load-$name.txt"
    echo "pss_settled_kb=$(rss_settled "@$socket " Pss)" >>"$WORK/load-$name.txt"
    kill -TERM "$XFN_PID"
    wait "$XFN_PID"
    XFN_PID=
    left=$(find "$cache/run/bundles" "$cache/run/crun" "$cache/run/rootfs" -mindepth 1 -maxdepth 1 | wc -l)
    [ "$left" -eq 0 ] || { echo "$name: $left run state entries left after SIGTERM" >&2; exit 1; }
}
measure_daemon cold --warm-pool 0
measure_daemon pooled

# Where a call's time goes: the same daemons with -d, whose log gives each
# call's phases, 100 sequential calls each (not counted above: logging
# costs a little).
measure_phases() {
    name=$1
    shift
    socket="xfn-bench/$$/phases-$name"
    cache="$WORK/cache-phases-$name"
    mkdir -p "$cache"
    chown "$NONROOT:$NONROOT" "$cache"
    $AS_NONROOT "$XFN" -d start --allow-shared-uid --cache-dir "$cache" --address "@$socket" "$@" 2>"$WORK/phases-$name.log" &
    XFN_PID=$!
    sleep 1
    $AS_NONROOT env IDLE_CALLS=0 PACE_MS=0 "$LOAD" "$socket" "$IMAGE" "$WORK/input.yaml" 100 1 1 >/dev/null
    kill -TERM "$XFN_PID"
    wait "$XFN_PID"
    XFN_PID=
}
measure_phases cold --warm-pool 0
measure_phases pooled

python3 - "$WORK/fork.json" "$WORK/load-cold.txt" "$WORK/load-pooled.txt" "$(nproc)" "$PROFILE" "$WORK/phases-cold.log" "$WORK/phases-pooled.log" <<'PY'
import json, re, statistics, sys
r = {x["command"]: x for x in json.load(open(sys.argv[1]))["results"]}
def load(path):
    return dict(line.strip().split("=", 1) for line in open(path) if "=" in line)
cold, pooled = load(sys.argv[2]), load(sys.argv[3])
bare = r["bare crun run"]["median"] * 1000
podman = r["podman run"]["median"] * 1000
print(f"xfn build profile: {sys.argv[5]}; CPUs: {sys.argv[4]}; max-concurrent-runs: default (CPUs)")
print(f"bare crun run (median)       : {bare:8.2f} ms")
print(f"podman run --rm -i (median)  : {podman:8.2f} ms   ({podman / bare:.2f}x bare crun)")
print("xfn, one caller (ms)          p50 (x bare crun; podman x slower)      p99 (x bare crun)")
for name, l in [("cold path", cold), ("pooled", pooled)]:
    for kind, label in [("paced", "paced (50 ms apart)"), ("b2b", "back to back"), ("idle", "first call after idle")]:
        if f"{kind}_p50_ms" not in l:
            continue
        p50, p99 = float(l[f"{kind}_p50_ms"]), float(l[f"{kind}_p99_ms"])
        print(f"  {name + ', ' + label:<33}: {p50:7.2f} ({p50 / bare:.2f}x; {podman / p50:5.1f}x)   {p99:7.2f} ({p99 / bare:.2f}x)")
print(f"CPU per call (daemon + reaped): {float(cold['cpu_ms_per_call']):6.2f} ms cold, {float(pooled['cpu_ms_per_call']):.2f} ms pooled"
      f" (at most {1000 * int(sys.argv[4]) / float(pooled['cpu_ms_per_call']):.0f} calls/s on {sys.argv[4]} CPUs pooled)")
print("throughput (calls/s)          cold   pooled")
for key in [k for k in pooled if k.startswith("throughput_")]:
    callers = key.split("_")[1]
    print(f"  {callers:>2} callers                 : {float(cold[key]):6.1f}   {float(pooled[key]):6.1f}")
print("xfn's processes (MB)          cold   pooled")
for key, label in [("rss_idle_kb", "RSS idle"), ("rss_after_kb", "RSS right after the load"),
                   ("rss_settled_kb", "RSS idle after the load"),
                   ("pss_idle_kb", "PSS idle"), ("pss_after_kb", "PSS right after the load"),
                   ("pss_settled_kb", "PSS idle after the load")]:
    print(f"  {label:<27}: {int(cold[key]) / 1024:6.1f}   {int(pooled[key]) / 1024:6.1f}")
print(f"  waiting containers, after   :    -     {int(pooled['rss_containers_kb']) / 1024:6.1f}")
def duration_ms(text):
    value, unit = re.fullmatch(r"([0-9.]+)(ns|µs|us|ms|s)", text).groups()
    return float(value) * {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
def phases(path, message):
    rows = {}
    for line in open(path):
        if message in line:
            for key, value in re.findall(r"(\w+_at)=([0-9.]+(?:ns|µs|us|ms|s))", line):
                rows.setdefault(key, []).append(duration_ms(value))
    return {k: statistics.median(v) for k, v in rows.items()}
print("where a call's time goes (median ms from the call's start in the runner, cumulative; 100 calls with -d)")
for name, path, messages in [("cold", sys.argv[6], ["run phases (cumulative)"]),
                             ("pooled", sys.argv[7], ["warm run phases", "container feed phases"])]:
    for message in messages:
        row = phases(path, message)
        print(f"  {name:<6} {message:<30}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()))
PY
