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
# and prints each as a ratio to native. Every answer is checked: the
# FunctionIO output byte for byte against the native run's, the v1
# response for its tag and the desired resource.
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

# Native, started ahead: the same command, fed once it waits on its stdin:
# the floor of a started call, with nothing of xfn's in it.
python3 "$(dirname "$0")/python/started.py" "$WORK/input.yaml" "$WORK/expect.yaml" \
    "$CALLS" $NATIVE >"$WORK/native-started.txt"

mkdir -p "$WORK/cache"
chown "$NONROOT:$NONROOT" "$WORK/cache"

# daemon NAME FLAGS...: `xfn start` as uid 65532 on an abstract socket of
# its own, paced calls, its figures into $WORK/NAME.txt.
daemon() {
    name=$1; shift
    socket="xfn-python-bench-$$-$name"
    $AS_NONROOT "$XFN" start --cache-dir "$WORK/cache" --address "@$socket" "$@" \
        2>"$WORK/$name.log" &
    XFN_PID=$!
    for _ in $(seq 300); do grep -q "@$socket\$" /proc/net/unix && break; sleep 0.1; done
    EXPECT="$WORK/expect.yaml" $AS_NONROOT "$LOAD" "$socket" "$IMAGE" "$WORK/input.yaml" \
        "$CALLS" 0 "" >"$WORK/$name.txt" 2>>"$WORK/$name.log" ||
        { cat "$WORK/$name.log" >&2; exit 1; }
    kill "$XFN_PID"; wait "$XFN_PID" 2>/dev/null || true; XFN_PID=
}

# adaptor NAME FLAGS...: `xfn adapt` of the image on a TCP port, likewise.
adaptor() {
    name=$1; shift
    $AS_NONROOT "$XFN" adapt --insecure --no-response-cache --cache-dir "$WORK/cache" \
        --image "$IMAGE" --address "127.0.0.1:$APORT" "$@" 2>"$WORK/$name.log" &
    XFN_PID=$!
    python3 - "$APORT" <<'PY'
import socket, sys, time
for _ in range(600):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.2).close()
        break
    except OSError:
        time.sleep(0.1)
PY
    $AS_NONROOT "$LOAD" "tcp:127.0.0.1:$APORT" - - "$CALLS" 0 "" >"$WORK/$name.txt" \
        2>>"$WORK/$name.log" || { cat "$WORK/$name.log" >&2; exit 1; }
    kill "$XFN_PID"; wait "$XFN_PID" 2>/dev/null || true; XFN_PID=
}

# ROWS (default: all six) names the rows to run, e.g. ROWS="start-started
# adapt-started" for the started calls alone, alternated between builds
# (XFN_BINARY) in a few minutes.
ROWS=${ROWS:-start-cold start-created start-started adapt-cold adapt-created adapt-started}
row() { case " $ROWS " in *" $1 "*) return 0 ;; esac; return 1; }
row start-cold && daemon start-cold --warm-pool 0
row start-created && daemon start-created --warm-pool-start created
row start-started && daemon start-started --warm-pool-start started
row adapt-cold && adaptor adapt-cold --warm-pool 0
row adapt-created && adaptor adapt-created --warm-pool-start created
row adapt-started && adaptor adapt-started --warm-pool-start started

python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
results = {r["command"]: r for r in json.load(open(f"{work}/native.json"))["results"]}
native = (results["native"]["median"] - results["shell"]["median"]) * 1000
print("python function, one caller paced (ms, p50; ratio to native)")
print(f"  native (chroot, no container)      {native:8.2f}  1.00x   (median of hyperfine, its feeding shell's {results['shell']['median']*1000:.2f} ms taken off)")
for name, label in [
    ("native-started", "native, started ahead (the floor)"),
    ("start-cold", "xfn start, cold (--warm-pool 0)"),
    ("start-created", "xfn start, warm created ahead"),
    ("start-started", "xfn start, warm started ahead"),
    ("adapt-cold", "xfn adapt, cold (--warm-pool 0)"),
    ("adapt-created", "xfn adapt, warm created ahead"),
    ("adapt-started", "xfn adapt, warm started ahead"),
]:
    try:
        lines = open(f"{work}/{name}.txt").readlines()
    except FileNotFoundError:
        continue  # not in ROWS
    figures = dict(line.strip().split("=", 1) for line in lines if "=" in line)
    p50, p99 = float(figures["paced_p50_ms"]), float(figures["paced_p99_ms"])
    print(f"  {label:<35}{p50:8.2f}  {p50/native:.2f}x   (p99 {p99:.2f})")
PY
