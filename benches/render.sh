#!/bin/sh
# `xfn render` of a 3-step pipeline of container functions (create → label →
# results: example/render/ without its mark-ready step; spec.count 2)
# against 3 warm runs, side by side, in one run:
#
#   render (Docker)   three Functions (three names, one image: the static
#                     tests/fixtures/fn_server.rs), each served as a gRPC server for
#                     the render: all three start at once, three calls, then
#                     they are killed.
#   render (Exec)     the same steps as Exec Functions: one container run per
#                     step (tests/render/exec/{create,label,results}.sh).
#   3 xfn runs        three warm `xfn run`s of the Exec images in sequence,
#                     each fed the request its step gets in the pipeline.
#   3 bare crun runs  the floor (scripts/lib/testbed.sh): `crun run` of a
#                     prepared bundle per Exec image (its rootfs, xfn's spec)
#                     in a fresh user+mount namespace, three in sequence.
#   3 podman runs     `podman run --rm -i` of the three Exec images in
#                     sequence, as root (the peer).
#
# Everything is warm: images are pulled (xfn cache, podman store) before
# timing. Both renders' outputs are checked first (2 ConfigMaps labelled
# team=platform), as are the runs' and the floor's. It prints medians (RUNS
# runs of each, default 60, pooled from PASSES hyperfine passes, default 4,
# in alternating order) and ratios, no thresholds, and once the phases of
# one Docker render from its `-d` log.
#
# Needs: hyperfine, crun, podman, docker-registry, umoci, skopeo,
# busybox-static, python3 with PyYAML, and glibc's static libraries
# (libc6-dev) for the static fn_server. Run as root from the repo root:
#   cargo build --release && XFN=target/release/xfn benches/render.sh
# Another xfn beside it (a build made before, to compare), its two renders
# timed in the same pooled passes: XFN_BINARY=path/to/xfn benches/render.sh
#
# podman on this host: see PODMAN_RUN in scripts/lib/testbed.sh.
set -eu
. "$(dirname "$0")/../scripts/lib/testbed.sh"

XFN=${XFN:-target/debug/xfn}
XFN=$(realpath "$XFN")
BEFORE=${XFN_BINARY:+$(realpath "$XFN_BINARY")}
RUNS=${RUNS:-60}
PASSES=${PASSES:-4}
EXEC_DIR=$(realpath tests/render/exec)
WORK=$(mktemp -d /tmp/xfn-render-bench-XXXXXX)
chmod 755 "$WORK"
PORT=$(( 20000 + $$ % 20000 ))
REG_PID=
STEPS="create label results"

cleanup() {
    [ -n "$REG_PID" ] && kill "$REG_PID" 2>/dev/null || true
    for step in $STEPS; do
        podman rmi -f "127.0.0.1:$PORT/$step:v1" >/dev/null 2>&1 || true
    done
    if [ -n "${KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT INT TERM

fail() {
    echo "render bench: $*" >&2
    exit 1
}

# The static fn_server (scripts/lib/testbed.sh), unless FUNCTION_SERVER
# names one already built (the tests build one in
# target/debug/fn-server-static/), as benches/test.sh takes it.
if [ -z "${FUNCTION_SERVER:-}" ]; then
    echo "building the static fn_server (release)..." >&2
    build_function_server
fi
SERVER_BIN=$(realpath "$FUNCTION_SERVER")

start_registry

# Each image in its own directory (the testbed's helpers use $WORK/oci and
# $WORK/unpacked); each subshell prints the pushed reference, which is kept
# in $WORK/STEP.image.
TOP=$WORK
image_of() { cat "$TOP/$1.image"; }
SERVER_IMAGE=$(
    WORK=$TOP/fn-server
    mkdir "$WORK"
    new_busybox_image sh
    cp "$SERVER_BIN" "$WORK/unpacked/rootfs/fn_server"
    push_image /fn_server fn-server:v1
    echo "$IMAGE"
)
for step in $STEPS; do
    (
        WORK=$TOP/$step
        mkdir "$WORK"
        new_busybox_image sh cat echo printf sed awk
        cp "$EXEC_DIR/jget" "$WORK/unpacked/rootfs/bin/jget"
        cp "$EXEC_DIR/$step.sh" "$WORK/unpacked/rootfs/fn.sh"
        chmod 755 "$WORK/unpacked/rootfs/bin/jget" "$WORK/unpacked/rootfs/fn.sh"
        push_image /fn.sh "$step:v1"
        echo "$IMAGE"
    ) >"$WORK/$step.image"
done

# The README's worked example (example/render/), cut to three steps: its XR
# (spec.count 2) and its Composition without the mark-ready step, each step's
# functionRef named after its action (create, label, results). fn_server
# reads each step's `action`; the Exec scripts ignore it. One Composition,
# two Functions files: the same three Function names, as Docker (all three
# the fn_server image: three servers) or as Exec (the three scripts).
EXAMPLE=$(realpath example/render)
XR=$EXAMPLE/xr.yaml
python3 - "$EXAMPLE/composition.yaml" "$WORK/composition.yaml" $STEPS <<'PY'
import sys, yaml
composition = yaml.safe_load(open(sys.argv[1]))
steps = [s for s in composition["spec"]["pipeline"] if s["input"]["action"] in sys.argv[3:]]
for step in steps:
    step["functionRef"]["name"] = step["input"]["action"]
assert [s["functionRef"]["name"] for s in steps] == sys.argv[3:], steps
composition["spec"]["pipeline"] = steps
yaml.safe_dump(composition, open(sys.argv[2], "w"), sort_keys=False)
PY
# function_yaml NAME RUNTIME PACKAGE: one Function document.
function_yaml() {
    printf -- '---\napiVersion: pkg.crossplane.io/v1beta1\nkind: Function\n'
    printf 'metadata:\n  name: %s\n  annotations:\n    render.crossplane.io/runtime: %s\n' "$1" "$2"
    printf 'spec:\n  package: %s\n' "$3"
}
for step in $STEPS; do
    function_yaml "$step" Docker "$SERVER_IMAGE" >>"$WORK/docker.yaml"
    function_yaml "$step" Exec "$(image_of "$step")" >>"$WORK/exec.yaml"
done

CACHE="$WORK/cache"
RENDER="$XFN render --cache-dir $CACHE $XR $WORK/composition.yaml"

# 2 ConfigMaps, both labelled team=platform, in the render output $1.
check_render() {
    python3 - "$1" <<'PY' || fail "$1 is not 2 ConfigMaps labelled team=platform"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
cms = [d for d in docs if d.get("kind") == "ConfigMap"]
ok = len(cms) == 2 and all(
    (d.get("metadata") or {}).get("labels", {}).get("team") == "platform" for d in cms)
if not ok:
    print(open(sys.argv[1]).read(), file=sys.stderr)
sys.exit(0 if ok else 1)
PY
}

# Pull everything into the cache and check both renders.
$RENDER "$WORK/docker.yaml" >"$WORK/docker-out.yaml" 2>"$WORK/docker-first.log" ||
    { cat "$WORK/docker-first.log" >&2; fail "the Docker render failed"; }
check_render "$WORK/docker-out.yaml"
$RENDER "$WORK/exec.yaml" >"$WORK/exec-out.yaml" 2>"$WORK/exec-first.log" ||
    { cat "$WORK/exec-first.log" >&2; fail "the Exec render failed"; }
check_render "$WORK/exec-out.yaml"

# The requests each Exec step gets in the pipeline: create's is the XR, the
# next one's desired state is the previous one's output. Each run's output
# is checked as it goes; the last one must hold the labelled ConfigMaps.
python3 -c 'import json, sys, yaml
xr = yaml.safe_load(open(sys.argv[1]))
print(json.dumps({"observed": {"composite": {"resource": xr}}, "desired": {}, "input": {}}))' "$XR" >"$WORK/create.json"
prev=
for step in $STEPS; do
    [ -z "$prev" ] || python3 - "$WORK/$prev.json" "$WORK/$prev.out" "$WORK/$step.json" <<'PY'
import json, sys
req, out = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
req["desired"] = out["desired"]
json.dump(req, open(sys.argv[3], "w"), separators=(",", ":"))
PY
    "$XFN" run --cache-dir "$CACHE" "$(image_of "$step")" "$WORK/$step.json" >"$WORK/$step.out" ||
        fail "xfn run of $step failed"
    prev=$step
done
grep -q '"labels":{"team":"platform"}' "$WORK/results.out" || fail "xfn run of results: $(cat "$WORK/results.out")"

# The floor: per Exec image, xfn's spec captured from one run, over a copy
# of the same rootfs, fed the same request; each subshell prints the bare
# command, kept in $WORK/STEP.bare-run.
for step in $STEPS; do
    (
        WORK=$TOP/$step
        new_spec_capture
        "$XFN" run --cache-dir "$CACHE" --runtime "$CAPTURE_RUNTIME" "$(image_of "$step")" \
            "$TOP/$step.json" >/dev/null
        new_bare_crun "$TOP/$step.json"
        echo "$BARE_RUN"
    ) >"$WORK/$step.bare-run"
    $(cat "$WORK/$step.bare-run") >"$WORK/$step.bare" || fail "bare crun of $step failed"
    cmp -s "$WORK/$step.out" "$WORK/$step.bare" || fail "bare crun of $step: $(cat "$WORK/$step.bare")"
done

# podman, as root, on the same images from the same registry.
for step in $STEPS; do
    podman pull --quiet --tls-verify=false "$(image_of "$step")" >/dev/null
done

# The three sequences, one script each for hyperfine.
{
    echo '#!/bin/sh'
    echo 'set -e'
    for step in $STEPS; do
        echo "$XFN run --cache-dir $CACHE $(image_of "$step") $WORK/$step.json >/dev/null"
    done
} >"$WORK/xfn-runs"
{
    echo '#!/bin/sh'
    echo 'set -e'
    for step in $STEPS; do echo "$(cat "$WORK/$step.bare-run") >/dev/null"; done
} >"$WORK/bare-runs"
{
    echo '#!/bin/sh'
    echo 'set -e'
    echo "$PODMAN_PRELUDE"
    for step in $STEPS; do
        echo "$PODMAN_RUN $(image_of "$step") <$WORK/$step.json >$WORK/$step.podman"
    done
} >"$WORK/podman-runs"
chmod +x "$WORK/xfn-runs" "$WORK/bare-runs" "$WORK/podman-runs"
PODMAN_RUNS="$PODMAN_NS $WORK/podman-runs"
$PODMAN_RUNS || fail "podman runs failed"
for step in $STEPS; do
    cmp -s "$WORK/$step.out" "$WORK/$step.podman" || fail "podman run of $step: $(cat "$WORK/$step.podman")"
done

# One Docker render with -d, each stderr line stamped on arrival.
python3 - "$WORK/docker-phases.log" $RENDER "$WORK/docker.yaml" -d <<'PY'
import os, subprocess, sys, time
start = time.monotonic()
# RUST_LOG: -d leaves out HTTP/2 frames and connection pools; these
# phases are read from them.
env = dict(os.environ, RUST_LOG="debug")
p = subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
with open(sys.argv[1], "w") as log:
    for line in p.stderr:
        log.write(f"{(time.monotonic() - start) * 1000:9.1f} {line}")
    p.wait()
    log.write(f"{(time.monotonic() - start) * 1000:9.1f} exit {p.returncode}\n")
sys.exit(p.returncode)
PY

# The five commands, timed in PASSES hyperfine passes of RUNS/PASSES runs
# each, in alternating order, and pooled: hyperfine times one command after
# the other, so on a shared machine a change of load would otherwise fall on
# whichever command ran then.
printf '%s\t%s\n' \
    "render (Docker)" "$RENDER $WORK/docker.yaml" \
    "render (Exec)" "$RENDER $WORK/exec.yaml" \
    "3 xfn runs" "$WORK/xfn-runs" \
    "3 bare crun runs" "$WORK/bare-runs" \
    "3 podman runs" "$PODMAN_RUNS" >"$WORK/commands"
if [ -n "$BEFORE" ]; then
    BEFORE_RENDER="$BEFORE render --cache-dir $CACHE $XR $WORK/composition.yaml"
    for runtime in docker exec; do
        $BEFORE_RENDER "$WORK/$runtime.yaml" >"$WORK/$runtime-before.yaml" || fail "$BEFORE: the $runtime render failed"
        check_render "$WORK/$runtime-before.yaml"
    done
    printf '%s\t%s\n' \
        "render (Docker), XFN_BINARY" "$BEFORE_RENDER $WORK/docker.yaml" \
        "render (Exec), XFN_BINARY" "$BEFORE_RENDER $WORK/exec.yaml" >>"$WORK/commands"
fi

echo "xfn: $XFN${BEFORE:+; XFN_BINARY: $BEFORE}"
python3 "$(dirname "$0")/lib/pooled.py" "$WORK" "$RUNS" "$PASSES"
python3 - "$WORK" <<'PY'
import json, re, sys
work = sys.argv[1]
r = json.load(open(f"{work}/medians.json"))
docker, exec_, runs3 = r["render (Docker)"], r["render (Exec)"], r["3 xfn runs"]
bare, podman = r["3 bare crun runs"], r["3 podman runs"]
print(f"Docker render / 3 xfn runs : {docker / runs3:8.2f}")
print(f"Exec render / 3 xfn runs   : {exec_ / runs3:8.2f}")
print(f"Docker render / 3 bare crun: {docker / bare:8.2f}")
print(f"3 podman / Docker render   : {podman / docker:8.2f}")
for runtime, ours in (("Docker", docker), ("Exec", exec_)):
    before = r.get(f"render ({runtime}), XFN_BINARY")
    if before:
        print(f"{runtime} render / XFN_BINARY's: {ours / before:8.2f}")

# Phases of one Docker render (-d), in ms since xfn started, from its log
# lines as they arrived: the containers' start, each server listening (its
# own "serving" line, relayed from its stderr by xfn: it may arrive after
# xfn has connected), xfn's "function server started" (connected), the
# three calls (h2 connection bound → response's END_STREAM), the exit.
print("one Docker render, -d (ms since start):")
ansi = re.compile(r"\x1b\[[0-9;]*m")
lines = []
for line in open(f"{work}/docker-phases.log"):
    at, _, text = ansi.sub("", line).strip().partition(" ")
    lines.append((float(at), re.sub(r"^\S+Z\s+", "", text.strip())))
calls, call = [], None
for at, text in lines:
    container = re.search(r'container="?([\w-]+)', text)
    container = container.group(1) if container else "?"
    if "entered the user and mount namespace" in text:
        print(f"  {at:8.1f}  entered the user namespace")
    elif "served container started" in text:
        print(f"  {at:8.1f}  container {container} started (crun run)")
    elif "function: fn_server: serving" in text:
        print(f"  {at:8.1f}  container {container}: fn_server listening")
    elif "function server started" in text:
        fn = re.search(r"function=(\S+)", text).group(1)
        el = re.search(r"elapsed=(\S+)", text).group(1)
        print(f"  {at:8.1f}  function server started: {fn} (its start: {el})")
    elif "binding client connection" in text:
        call = at
    elif call is not None and "received frame=Headers" in text and "END_STREAM" in text:
        calls.append((call, at))
        print(f"  {call:8.1f}  call {len(calls)}: {at - call:.1f} ms")
        call = None
    elif text.startswith("exit "):
        end = f", teardown after the last call {at - calls[-1][1]:.1f} ms" if calls else ""
        print(f"  {at:8.1f}  xfn exited ({text[5:]}){end}")
PY
