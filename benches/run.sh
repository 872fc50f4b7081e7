#!/bin/sh
# Warm `xfn run` against bare `crun run` of the same rootfs, side by side.
#
# Both sides pay what a fresh process pays: `xfn run` starts, enters its user
# and mount namespace, finds the cached image, mounts the per-run rootfs,
# writes the spec and runs crun; the bare side is `unshare` into a user+mount
# namespace, a tmpfs over /sys/fs/cgroup (this host is cgroup-hybrid) and
# `crun run` of a prepared bundle with xfn's own spec (captured once).
# The function is busybox `cat` of a small FunctionIO.
#
# Needs: hyperfine (apt-get install hyperfine), crun, docker-registry, umoci,
# skopeo, busybox-static. Run as root from the repository root:
#   cargo build && benches/run.sh            (debug binary)
#   cargo build --release && XFN=target/release/xfn benches/run.sh   (the numbers that matter)
set -eu

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
    wget -q -O /dev/null "http://127.0.0.1:$PORT/v2/" 2>/dev/null && break || sleep 0.1
done

# The function image: busybox, entrypoint `cat`, built with umoci, pushed with skopeo.
umoci init --layout "$WORK/oci" >/dev/null
umoci new --image "$WORK/oci:fn" >/dev/null
umoci unpack --rootless --image "$WORK/oci:fn" "$WORK/unpacked" >/dev/null
mkdir -p "$WORK/unpacked/rootfs/bin"
cp /bin/busybox "$WORK/unpacked/rootfs/bin/busybox"
for applet in sh cat; do ln -s busybox "$WORK/unpacked/rootfs/bin/$applet"; done
umoci repack --image "$WORK/oci:fn" "$WORK/unpacked" >/dev/null
umoci config --image "$WORK/oci:fn" --config.entrypoint /bin/cat --config.env PATH=/bin >/dev/null
skopeo copy --quiet --dest-tls-verify=false "oci:$WORK/oci:fn" "docker://127.0.0.1:$PORT/fn:v1"
IMAGE="127.0.0.1:$PORT/fn:v1"

printf 'apiVersion: apiextensions.crossplane.io/v1alpha1\nkind: FunctionIO\nobserved: {}\ndesired: {}\n' >"$WORK/input.yaml"
CACHE="$WORK/cache"

# Warm the cache (pull + extract once) and check the function works.
"$XFN" run --cache-dir "$CACHE" "$IMAGE" "$WORK/input.yaml" >"$WORK/out.yaml"
cmp "$WORK/input.yaml" "$WORK/out.yaml"

# The bare bundle: the same rootfs, the spec xfn writes (captured from a run
# through a crun wrapper), as the namespace's root.
mkdir -p "$WORK/bare" "$WORK/capture"
chmod 1777 "$WORK/capture" # written by xfn's mapped root
cat > "$WORK/crun-capture" <<SH
#!/bin/sh
for a; do case "\$prev" in --bundle) cp "\$a/config.json" "$WORK/capture/config.json";; esac; prev=\$a; done
exec crun "\$@"
SH
chmod +x "$WORK/crun-capture"
"$XFN" run --cache-dir "$CACHE" --runtime "$WORK/crun-capture" "$IMAGE" "$WORK/input.yaml" >/dev/null
cp "$WORK/capture/config.json" "$WORK/bare/config.json"
cp -a "$WORK/unpacked/rootfs" "$WORK/bare/rootfs"
python3 - "$WORK/bare/config.json" <<'PY'
import json, sys
path = sys.argv[1]
spec = json.load(open(path))
spec["root"]["path"] = "rootfs"
json.dump(spec, open(path, "w"))
PY
cat > "$WORK/bare-run" <<SH
#!/bin/sh
mount -t tmpfs tmpfs /sys/fs/cgroup
exec crun --root "$WORK/bare-state" --cgroup-manager=disabled run --no-new-keyring --bundle "$WORK/bare" "bare-\$\$" <"$WORK/input.yaml"
SH
chmod +x "$WORK/bare-run"
unshare --user --map-root-user --mount --propagation private "$WORK/bare-run" >"$WORK/bare-out.yaml"
cmp "$WORK/input.yaml" "$WORK/bare-out.yaml"

hyperfine --warmup 10 --runs "$RUNS" --export-json "$WORK/result.json" -N \
    --command-name "bare crun run" "unshare --user --map-root-user --mount --propagation private $WORK/bare-run" \
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
