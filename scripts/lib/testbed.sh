# Shared by scripts/example.sh and benches/*.sh (POSIX sh; source it):
# a docker-registry on loopback and a busybox function image built with umoci
# and pushed with skopeo — no Docker anywhere; and, for the benchmarks, the
# "bare crun" floor they compare xfn against.
#
# Expects WORK (a directory the caller removes) and PORT (a free loopback
# port) to be set.

# Starts a registry on 127.0.0.1:$PORT storing under $WORK/registry; sets
# REG_PID (the caller kills it) and waits until it answers.
start_registry() {
    mkdir -p "$WORK/registry"
    cat > "$WORK/registry/config.yml" <<YAML
version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: $WORK/registry/storage
http:
  addr: 127.0.0.1:$PORT
YAML
    docker-registry serve "$WORK/registry/config.yml" >"$WORK/registry/log" 2>&1 &
    REG_PID=$!
    for _ in $(seq 50); do
        wget -q -O /dev/null "http://127.0.0.1:$PORT/v2/" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "the registry on 127.0.0.1:$PORT did not answer; its log:" >&2
    cat "$WORK/registry/log" >&2
    return 1
}

# Unpacks a new image $WORK/oci:fn at $WORK/unpacked holding busybox-static
# and the given applets as /bin symlinks; add files under
# $WORK/unpacked/rootfs, then call push_image. Replaces the one made before.
new_busybox_image() {
    rm -rf "$WORK/oci" "$WORK/unpacked"
    umoci init --layout "$WORK/oci" >/dev/null
    umoci new --image "$WORK/oci:fn" >/dev/null
    umoci unpack --rootless --image "$WORK/oci:fn" "$WORK/unpacked" >/dev/null
    mkdir -p "$WORK/unpacked/rootfs/bin"
    cp /bin/busybox "$WORK/unpacked/rootfs/bin/busybox"
    for applet in "$@"; do ln -s busybox "$WORK/unpacked/rootfs/bin/$applet"; done
}

# push_image ENTRYPOINT NAME:TAG: repacks $WORK/unpacked with ENTRYPOINT and
# PATH=/bin, pushes it to the registry and sets IMAGE to its reference.
push_image() {
    umoci repack --image "$WORK/oci:fn" "$WORK/unpacked" >/dev/null
    umoci config --image "$WORK/oci:fn" --config.entrypoint "$1" --config.env PATH=/bin >/dev/null
    IMAGE="127.0.0.1:$PORT/$2"
    skopeo copy --quiet --dest-tls-verify=false "oci:$WORK/oci:fn" "docker://$IMAGE"
}

# build_function_server: builds tests/fixtures/fn_server.rs (a gRPC composition
# function server, the Rust twin of tests/render/function.py) for release,
# linked statically so that it runs on busybox with no libc, and sets
# FUNCTION_SERVER to the binary (copied out of target/: `cargo test` builds
# a dynamic one at the same path). Run from the repository root.
build_function_server() {
    cargo rustc --quiet --release --example fn_server -- \
        -C target-feature=+crt-static -C strip=debuginfo
    mkdir -p "$WORK/fn-server-bin"
    FUNCTION_SERVER="$WORK/fn-server-bin/fn_server"
    cp "${CARGO_TARGET_DIR:-target}/release/examples/fn_server" "$FUNCTION_SERVER"
    if readelf -l "$FUNCTION_SERVER" | grep -q INTERP; then
        echo "target/release/examples/fn_server is not static (another cargo rebuilt it?): run again" >&2
        return 1
    fi
}

# The peer, podman as root on this host: cgroups are hybrid, so podman runs
# in a private mount namespace with /sys/fs/cgroup covered by a tmpfs and
# --cgroups=disabled (crun 1.8.1 refuses hybrid cgroups otherwise), and with
# explicit --ulimit values (its defaults exceed the hard limits here).
# A script of podman runs starts with PODMAN_PRELUDE (after `#!/bin/sh`),
# runs `$PODMAN_RUN IMAGE`, and is started under PODMAN_NS. PODMAN_HOST_FLAGS
# are the flags any `podman run` needs on this host (tests/image_e2e.rs and
# benches/image.sh run the runner image with them).
PODMAN_PRELUDE="mount -t tmpfs tmpfs /sys/fs/cgroup"
PODMAN_HOST_FLAGS="--cgroups=disabled --ulimit nofile=1024:1024 --ulimit nproc=1024:1024"
PODMAN_RUN="podman run --rm -i --network none $PODMAN_HOST_FLAGS"
PODMAN_NS="unshare --mount --propagation private"

# The "bare crun" floor the benchmarks set xfn against: the least any runner
# pays per call for this function. A fresh process `unshare`s into a
# user+mount namespace (its root is the caller), covers /sys/fs/cgroup with a
# tmpfs (this host's cgroups are hybrid, which crun 1.8.1 refuses; xfn does
# the same) and runs `crun run --cgroup-manager=disabled --no-new-keyring` of
# a prepared bundle. The bundle is xfn's own: the config.json xfn writes,
# captured from a real xfn run through a crun wrapper, so that both sides run
# the same container (seccomp, masked paths, capabilities, mounts), over a
# copy of the same rootfs ($WORK/unpacked/rootfs) with root.path rewritten to
# it. What xfn costs above the floor is then its own work: starting, entering
# its namespaces, finding the cached image, the per-run rootfs and the spec.
#
# Two steps, with one xfn run in between that starts a container:
#   new_spec_capture       # sets CAPTURE_RUNTIME
#   "$XFN" run --runtime "$CAPTURE_RUNTIME" ...
#   new_bare_crun INPUT    # sets BARE_RUN

# Writes a crun wrapper that copies the config.json of each bundle it runs to
# $WORK/capture/config.json, then execs crun; sets CAPTURE_RUNTIME to it. The
# capture directory is world-writable: xfn's mapped root writes there.
new_spec_capture() {
    mkdir -p "$WORK/capture"
    chmod 1777 "$WORK/capture"
    CAPTURE_RUNTIME="$WORK/crun-capture"
    cat > "$CAPTURE_RUNTIME" <<SH
#!/bin/sh
for a; do case "\$prev" in --bundle) cp "\$a/config.json" "$WORK/capture/config.json";; esac; prev=\$a; done
exec crun "\$@"
SH
    chmod +x "$CAPTURE_RUNTIME"
}

# new_bare_crun INPUT: builds the bundle $WORK/bare from the captured spec and
# a copy of $WORK/unpacked/rootfs, and a script $WORK/bare-run that runs it
# once with INPUT on stdin; sets BARE_RUN to the floor's command line (one
# string, for hyperfine; unquoted, for the shell). The caller checks its
# output.
new_bare_crun() {
    [ -s "$WORK/capture/config.json" ] || {
        echo "no spec captured in $WORK/capture: run xfn with --runtime \$CAPTURE_RUNTIME first" >&2
        return 1
    }
    mkdir -p "$WORK/bare"
    cp -a "$WORK/unpacked/rootfs" "$WORK/bare/rootfs"
    python3 - "$WORK/capture/config.json" "$WORK/bare/config.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["root"]["path"] = "rootfs"
# Each run has a user namespace of its own mapping xfn's ids one to one,
# from xfn's id 1 (its own id 0 is never a function's): the floor's
# namespace (--map-root-user) maps one id, its 0, so its run maps that one.
for key in ("uidMappings", "gidMappings"):
    for m in spec.get("linux", {}).get(key, []):
        m["hostID"] = 0
        m["size"] = 1
json.dump(spec, open(sys.argv[2], "w"))
PY
    cat > "$WORK/bare-run" <<SH
#!/bin/sh
mount -t tmpfs tmpfs /sys/fs/cgroup
exec crun --root "$WORK/bare-state" --cgroup-manager=disabled run --no-new-keyring --bundle "$WORK/bare" "bare-\$\$" <"$1"
SH
    chmod +x "$WORK/bare-run"
    BARE_RUN="unshare --user --map-root-user --mount --propagation private $WORK/bare-run"
}

# --- For the benchmarks that drive `xfn start` (benches/cpu.sh, image.sh,
# python.sh, server.sh): run as root, they run xfn as the sidecar's
# unprivileged user (no ids for functions: they pass --allow-shared-uid).

# The sidecar's uid, and the prefix that runs a command as it with no
# capabilities.
NONROOT=65532
AS_NONROOT="setpriv --reuid=$NONROOT --regid=$NONROOT --clear-groups --inh-caps=-all --bounding-set=-all"

# bench_work NAME: sets WORK (a fresh directory under /tmp that uid
# $NONROOT can read), PORT (for the registry), and a trap that on exit
# stops the daemon ($XFN_PID) and the registry ($REG_PID), runs
# `bench_cleanup_more` if the bench defines it, and removes WORK.
bench_work() {
    WORK=$(mktemp -d "/tmp/xfn-$1-bench-XXXXXX")
    chmod 755 "$WORK"
    PORT=$(( 20000 + $$ % 20000 ))
    REG_PID=
    XFN_PID=
    trap bench_cleanup EXIT INT TERM
}

bench_cleanup() {
    [ -n "$XFN_PID" ] && kill "$XFN_PID" 2>/dev/null && wait "$XFN_PID" 2>/dev/null || true
    [ -n "$REG_PID" ] && kill "$REG_PID" 2>/dev/null || true
    if command -v bench_cleanup_more >/dev/null 2>&1; then bench_cleanup_more; fi
    rm -rf "$WORK"
}

# server_load_binary PROFILE: builds the load generator
# (benches/server_load.rs) for the cargo profile PROFILE and prints its
# path. Run from the repository root.
server_load_binary() {
    cargo build --quiet --profile "$1" --bench server_load --message-format=json |
        python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "server_load" and m.get("executable"):
        print(m["executable"])'
}
