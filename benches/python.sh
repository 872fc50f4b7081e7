#!/bin/sh
# A real interpreter through xfn, side by side in one run: a Python
# function (benches/python/fn.py: imports json and PyYAML, reads its input,
# adds a desired resource, writes the answer) on Debian's python3 and
# python3-yaml, run
#
#   native             the same rootfs without a container: `unshare` into
#                      a user namespace, `chroot` into the image's rootfs,
#                      the interpreter started per input (hyperfine).
#   native, started    the same command started ahead and fed once it waits
#                      on its stdin (benches/python/started.py), paced: the
#                      floor of a started call for `xfn start`'s FunctionIO,
#                      with nothing of xfn's in it.
#   xfn start          RunFunction with a FunctionIO over the abstract
#                      socket of `xfn start` as uid 65532, one caller paced
#                      PACE_MS apart (benches/server_load.rs), three ways:
#                      cold (`--warm-pool 0`), warm containers created ahead
#                      (`--warm-pool-start created`) and started ahead
#                      (`--warm-pool-start started`, the default).
#   xfn adapt          v1 RunFunction (a RunFunctionRequest as JSON on the
#                      function's stdin) over TCP to `xfn adapt --image`,
#                      the same three ways, paced likewise.
#
# and prints each as a ratio to native. The started rows, which the
# targets are about, are timed in ROUNDS short rounds beside native and the
# floor, and each ratio is to the same round's native (see below). Every
# answer is checked: the FunctionIO output byte for byte against the native
# run's, the v1 response for its tag and the desired resource.
#
# The image is the host's Debian python3.11 (from Debian's packages, as
# scripts/setup.sh installs python3-yaml): the interpreter, its standard
# library and lib-dynload, PyYAML with its libyaml extension and the shared
# libraries they link, copied with their mtimes (`cp -a`), so that the
# compiled modules in __pycache__ stay valid and Python does not recompile
# them at each start.
#
# Needs: hyperfine, crun, docker-registry, umoci, skopeo, busybox-static,
# python3-yaml (all apt-get packages, scripts/setup.sh). Run as root from
# the repository root:
#   benches/python.sh                  (debug build)
#   PROFILE=release benches/python.sh  (release build: the numbers that matter)
set -eu
. "$(dirname "$0")/../scripts/lib/testbed.sh"

PROFILE=${PROFILE:-dev}
RUNS=${RUNS:-100}
CALLS=${CALLS:-200}
export PACE_MS=${PACE_MS:-100}
export IDLE_CALLS=0
bench_work python
APORT=$(( PORT + 1 ))
PY=/usr/bin/python3.11

[ -x "$PY" ] && $PY -c 'import yaml' || {
    echo "needs Debian's python3.11 with python3-yaml (scripts/setup.sh)" >&2
    exit 1
}

# Build xfn and the load generator (unless XFN_BINARY and LOAD_BINARY
# name builds already made, e.g. a kept copy of an earlier xfn to
# compare); world-readable copies for uid 65532.
[ -n "${XFN_BINARY:-}" ] || cargo build --quiet --profile "$PROFILE" --bin xfn
LOAD=${LOAD_BINARY:-}
[ -n "$LOAD" ] || LOAD=$(server_load_binary "$PROFILE")
case "$PROFILE" in dev) XFN=target/debug/xfn ;; *) XFN=target/$PROFILE/xfn ;; esac
XFN=${XFN_BINARY:-$XFN}
cp "$(realpath "$XFN")" "$WORK/xfn"
cp "$LOAD" "$WORK/"
XFN="$WORK/xfn"
LOAD="$WORK/$(basename "$LOAD")"
chmod 755 "$XFN" "$LOAD"

start_registry

# The image: busybox for a shell, Debian's python3 and PyYAML.
new_busybox_image sh
ROOT="$WORK/unpacked/rootfs"
# Merged /usr, as Debian's: /lib and /lib64 are links into /usr.
mkdir -p "$ROOT/usr/lib" "$ROOT/usr/lib64" "$ROOT/usr/bin"
ln -s usr/lib "$ROOT/lib"
ln -s usr/lib64 "$ROOT/lib64"
# Copies the given absolute paths (a link as a link) with their mtimes and
# their parents' into the rootfs.
copy() { for path; do (cd / && cp -a --parents "${path#/}" "$ROOT/"); done; }
copy "$PY" /usr/lib/python3.11 /usr/lib/python3/dist-packages/yaml \
    /usr/lib/python3/dist-packages/_yaml
ln -s python3.11 "$ROOT/usr/bin/python3"
for object in "$PY" /usr/lib/python3.11/lib-dynload/*.so /usr/lib/python3/dist-packages/yaml/*.so; do
    ldd "$object" | awk '/=> \// { print $3 } /^\t\/lib/ { print $1 }'
done | sed 's,^/lib,/usr/lib,' | sort -u | while read -r lib; do
    copy "$lib" "$(realpath "$lib")"
done
cp -a "$(dirname "$0")/python/fn.py" "$ROOT/fn.py"
umoci repack --image "$WORK/oci:fn" "$WORK/unpacked" >/dev/null
umoci config --image "$WORK/oci:fn" --config.entrypoint /usr/bin/python3 \
    --config.cmd /fn.py --config.env PATH=/usr/bin:/bin >/dev/null
IMAGE="127.0.0.1:$PORT/python-fn:v1"
skopeo copy --quiet --dest-tls-verify=false "oci:$WORK/oci:fn" "docker://$IMAGE"

printf 'apiVersion: apiextensions.crossplane.io/v1alpha1\nkind: FunctionIO\nobserved: {}\ndesired: {}\n' >"$WORK/input.yaml"
chmod 644 "$WORK/input.yaml"

# Native: the same rootfs, no container.
NATIVE="unshare --user --map-root-user chroot $ROOT /usr/bin/python3 /fn.py"
$NATIVE <"$WORK/input.yaml" >"$WORK/expect.yaml"
grep -q 'kind: Bucket' "$WORK/expect.yaml"
chmod 644 "$WORK/expect.yaml"
cat > "$WORK/native" <<SH
#!/bin/sh
exec $NATIVE <"$WORK/input.yaml" >/dev/null
SH
chmod +x "$WORK/native"
# The shell that feeds its input costs the native side a fork and exec:
# timed alone, it is taken off.
cat > "$WORK/shell" <<SH
#!/bin/sh
exec true <"$WORK/input.yaml" >/dev/null
SH
chmod +x "$WORK/shell"
hyperfine --warmup 10 --runs "$RUNS" --export-json "$WORK/native.json" -N \
    --command-name native "$WORK/native" --command-name shell "$WORK/shell" >/dev/null

mkdir -p "$WORK/cache"
chown "$NONROOT:$NONROOT" "$WORK/cache"

# up_start NAME FLAGS...: `xfn start` as uid 65532 on the abstract socket
# xfn-python-bench-$$-NAME, its log into $WORK/NAME.log; its pid in XFN_PID.
up_start() {
    name=$1; shift
    socket="xfn-python-bench-$$-$name"
    $AS_NONROOT "$XFN" start --allow-shared-uid --cache-dir "$WORK/cache" --address "@$socket" "$@" \
        2>"$WORK/$name.log" &
    XFN_PID=$!
    for _ in $(seq 300); do grep -q "@$socket\$" /proc/net/unix && break; sleep 0.1; done
}

# up_adapt NAME FLAGS...: `xfn adapt` of the image on TCP port $APORT, its
# log into $WORK/NAME.log; its pid in ADAPT_PID.
ADAPT_PID=
bench_cleanup_more() {
    [ -n "$ADAPT_PID" ] && kill "$ADAPT_PID" 2>/dev/null && wait "$ADAPT_PID" 2>/dev/null || true
}
up_adapt() {
    name=$1; shift
    $AS_NONROOT "$XFN" adapt --insecure --no-response-cache --cache-dir "$WORK/cache" \
        --image "$IMAGE" --address "127.0.0.1:$APORT" "$@" 2>"$WORK/$name.log" &
    ADAPT_PID=$!
    python3 - "$APORT" <<'PY'
import socket, sys, time
for _ in range(600):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.2).close()
        break
    except OSError:
        time.sleep(0.1)
PY
}

# calls NAME N OUT [ENV...]: N calls paced PACE_MS apart (after the load
# generator's ten warm-up calls) to the daemon of row NAME, its figures
# into OUT; ENV (e.g. HEALTH=1) for the load generator.
calls() {
    case "$1" in
        start-*) target="xfn-python-bench-$$-$1"; image=$IMAGE ;;
        adapt-*) target="tcp:127.0.0.1:$APORT"; image=- ;;
    esac
    name=$1 count=$2 out=$3; shift 3
    env EXPECT="$WORK/expect.yaml" B2B_CALLS=0 "$@" $AS_NONROOT "$LOAD" "$target" "$image" \
        "$WORK/input.yaml" "$count" 0 "" >"$out" 2>>"$WORK/$name.log" ||
        { cat "$WORK/$name.log" >&2; exit 1; }
}

down() {
    kill "$1"; wait "$1" 2>/dev/null || true
}

# ROWS (default: all six) names the rows to run, e.g. ROWS="start-started
# adapt-started" for the started calls alone, alternated between builds
# (XFN_BINARY) in a few minutes.
ROWS=${ROWS:-start-cold start-created start-started adapt-cold adapt-created adapt-started}
row() { case " $ROWS " in *" $1 "*) return 0 ;; esac; return 1; }

# The cold and created rows: one daemon each, CALLS paced calls.
for name in start-cold start-created adapt-cold adapt-created; do
    row $name || continue
    case $name in *cold) flags="--warm-pool 0" ;; *) flags="--warm-pool-start created" ;; esac
    case $name in
        start-*) up_start $name $flags ;;
        adapt-*) up_adapt $name $flags ;;
    esac
    calls $name "$CALLS" "$WORK/$name.txt"
    case $name in
        start-*) down "$XFN_PID"; XFN_PID= ;;
        adapt-*) down "$ADAPT_PID"; ADAPT_PID= ;;
    esac
done

# The started rows, against native and the floor, in ROUNDS rounds of
# about fifteen seconds: in each, native (hyperfine, ROUND_RUNS runs), the
# floor (the same command started ahead and fed once it waits on its
# stdin, ROUND_CALLS calls: benches/python/started.py, nothing of xfn's)
# and ROUND_CALLS paced calls to each started daemon, one after another;
# then as many health checks to `xfn start` (`grpc.health.v1.Health/Check`
# from the same client over the same socket kind: a gRPC round trip with
# no function). The floor plus that round trip is as close as any gRPC
# runner could come.
# This machine's speed drifts over minutes (a VM on a host we do not see:
# benches/PROFILE.md), and a ratio of two figures taken minutes apart
# measures the drift as much as the function; so each round's ratios
# compare figures taken within seconds of each other, and the summary
# gives every round and the median of their ratios. The daemons stay up
# between rounds; their started functions sleep on their stdin.
ROUNDS=${ROUNDS:-8}
ROUND_CALLS=${ROUND_CALLS:-40}
ROUND_RUNS=${ROUND_RUNS:-20}
row start-started && up_start start-started --warm-pool-start started
row adapt-started && up_adapt adapt-started --warm-pool-start started
for round in $(seq "$ROUNDS"); do
    hyperfine --warmup 3 --runs "$ROUND_RUNS" --export-json "$WORK/round$round-native.json" -N \
        --command-name native "$WORK/native" --command-name shell "$WORK/shell" >/dev/null
    python3 "$(dirname "$0")/python/started.py" "$WORK/input.yaml" "$WORK/expect.yaml" \
        "$ROUND_CALLS" $NATIVE >"$WORK/round$round-floor.txt"
    row start-started && calls start-started "$ROUND_CALLS" "$WORK/round$round-start-started.txt"
    row adapt-started && calls adapt-started "$ROUND_CALLS" "$WORK/round$round-adapt-started.txt"
    row start-started && calls start-started "$ROUND_CALLS" "$WORK/round$round-rtt.txt" HEALTH=1
done
[ -n "$XFN_PID" ] && { down "$XFN_PID"; XFN_PID=; }
[ -n "$ADAPT_PID" ] && { down "$ADAPT_PID"; ADAPT_PID=; }

python3 - "$WORK" "$ROUNDS" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])

def native_ms(path):
    """hyperfine's median of native, its feeding shell's taken off."""
    results = {r["command"]: r for r in json.load(open(path))["results"]}
    return (results["native"]["median"] - results["shell"]["median"]) * 1000

def figures(path):
    try:
        lines = open(path).readlines()
    except FileNotFoundError:
        return None  # not in ROWS
    return dict(line.strip().split("=", 1) for line in lines if "=" in line)

native = native_ms(f"{work}/native.json")
print("python function, one caller paced (ms, p50; ratio to native)")
print(f"  native (chroot, no container)      {native:8.2f}  1.00x   (median of hyperfine, its feeding shell taken off)")
for name, label in [
    ("start-cold", "xfn start, cold (--warm-pool 0)"),
    ("start-created", "xfn start, warm created ahead"),
    ("adapt-cold", "xfn adapt, cold (--warm-pool 0)"),
    ("adapt-created", "xfn adapt, warm created ahead"),
]:
    found = figures(f"{work}/{name}.txt")
    if found:
        p50, p99 = float(found["paced_p50_ms"]), float(found["paced_p99_ms"])
        print(f"  {label:<35}{p50:8.2f}  {p50/native:.2f}x   (p99 {p99:.2f})")

rows = [("floor", "floor"), ("rtt", "gRPC round trip"), ("start-started", "xfn start"),
        ("adapt-started", "xfn adapt")]
print(f"started ahead, in {rounds} rounds (ms, p50; ratio to the same round's native)")
print(f"  {'round':<6}{'native':>8}" + "".join(f"{label:>22}" for _, label in rows))
ratios = {name: [] for name, _ in rows}
for r in range(1, rounds + 1):
    base = native_ms(f"{work}/round{r}-native.json")
    cells = ""
    for name, _ in rows:
        found = figures(f"{work}/round{r}-{name}.txt")
        if found is None:
            cells += f"{'-':>22}"
            continue
        p50 = float(found["paced_p50_ms"])
        ratios[name].append(p50 / base)
        cells += f"{p50:>14.2f} ({p50/base:.2f}x)"
    print(f"  {r:<6}{base:>8.2f}{cells}")
print("  median of the rounds' ratios: " + ", ".join(
    f"{label} {statistics.median(ratios[name]):.3f}x" for name, label in rows if ratios[name]))
if ratios["rtt"]:
    print("  median of the rounds' floor + gRPC round trip: "
          f"{statistics.median(f + r for f, r in zip(ratios['floor'], ratios['rtt'])):.3f}x")
PY
