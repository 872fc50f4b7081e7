# Shared by scripts/example.sh and benches/*.sh (POSIX sh; source it):
# a docker-registry on loopback and a busybox function image built with umoci
# and pushed with skopeo — no Docker anywhere.
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
# $WORK/unpacked/rootfs, then call push_image.
new_busybox_image() {
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
