#!/bin/sh
# `xfn host` against the function servers it hosts, run without it, side
# by side in one run (docs/host.md, "Measured"):
#
#   warm call     one caller, paced PACE_MS apart, alternating ROUNDS
#                 rounds of ROUND_CALLS calls between the function server
#                 called directly (plaintext TCP, as `crossplane render`
#                 calls one) and the same server through `xfn host` (TLS
#                 with a client certificate and the SNI of the function's
#                 Service name, as Crossplane calls one): p50 and p99, and
#                 the median round's p50 difference (benches/host_load.rs).
#                 Beside them, the same server behind two peers doing xfn
#                 host's hop (TLS with a verified client certificate in
#                 front of the plaintext server), where installed: haproxy
#                 (HTTP/2, routed by SNI, as xfn host routes) and socat (a
#                 byte-level TLS proxy, one process per connection: the
#                 floor of a TLS-terminating hop). With XFN_BINARY_BEFORE,
#                 a second `xfn host` of that build beside them (`before`),
#                 to compare two builds in the same rounds.
#   count         what the same warm calls cost each hop, counted rather
#                 than timed (counts do not move with the machine's load):
#                 per call, xfn's own processes (not its function server)
#                 against each peer's: CPU, context switches, wake-ups,
#                 syscalls by kind, libc allocations (perf stat, perf probe
#                 on libc's malloc/calloc/realloc; CPU and switches in a
#                 pass of their own, as a probe's trap costs CPU), bytes
#                 read and written (strace), each less the same processes'
#                 idle counts over as long (benches/host_load.rs `count`), and each
#                 xfn's ratio to haproxy's. COUNT_CALLS calls (300) per side.
#   from zero     the first call to a function with no server running
#                 (`xfn host --server-idle 1s`, each call after the last
#                 server was stopped and, where xfn does, the next one's
#                 container created ahead, on a TLS connection kept open)
#                 against the same server started natively for each call:
#                 `unshare` into a user namespace, `chroot` into a copy of
#                 the image's rootfs, exec, connect as soon as it listens
#                 (tried every millisecond), call; COLD_CALLS each, in
#                 COLD_ROUNDS rounds alternating native, xfn and (with
#                 XFN_BINARY_BEFORE) the xfn built before: the median round's p50.
#   memory        FUNCTIONS functions hosted, all scaled to zero (their
#                 packages pulled, no server): the RSS of xfn's processes,
#                 against FUNCTIONS native servers each called once (as
#                 FUNCTIONS pods would run them: the sum of their RSS); then
#                 (and, scaled to zero, of xfn's whole tree: the containers
#                 created ahead with it, within --prepared-idle (PREPARED_IDLE
#                 seconds, 20) and past it; with XFN_BINARY_BEFORE, the same
#                 of the build before); then
#                 every hosted function called once: the RSS of xfn's whole
#                 process tree (xfn, its PID namespace's init, every
#                 container's processes), against the native servers' sum
#                 plus xfn's idle RSS. RSS counts a shared page (the
#                 server's binary, mapped by each) once per process on both
#                 sides alike; PSS, which shares it out, is printed beside.
#
# for two functions: xfn's Rust test server (tests/fixtures/fn_server.rs,
# static, in busybox) and, where scripts/setup.sh built its Debian trixie
# root (/var/cache/xfn-test/function-pythonic-0.6.3), function-pythonic
# 0.6.3 (Crossplane's Python SDK, grpcio) as an image of that root. Every
# answer is checked (the request's tag and the desired resource it
# composes). xfn runs as uid 65532 without capabilities.
#
# Needs: crun, docker-registry, umoci, skopeo, busybox-static, openssl,
# python3 (apt-get packages; scripts/setup.sh); for the peers, haproxy and
# socat (PEERS="haproxy socat" by default; PEERS= for none); for the
# count part, perf (linux-perf) and strace. Run as root from the
# repository root:
#   benches/host.sh                  (release build, niced)
#   PROFILE=dev benches/host.sh      (debug build)
# More samples: ROUNDS=10 ROUND_CALLS=200 COLD_CALLS=30 benches/host.sh
# One function: ONLY=pythonic benches/host.sh
# Another xfn (a build made before, to compare): XFN_BINARY=path benches/host.sh
# Two builds side by side (every part): XFN_BINARY_BEFORE=path benches/host.sh
# Some rows: PARTS="warm cold" benches/host.sh (of warm, count, cold, memory)
# The hop alone: QUIET_SERVER=1 benches/host.sh (neither server logs a
#   line per call, natively or hosted: the Rust server by FN_SERVER_QUIET,
#   function-pythonic by `--logger-level =WARNING`; xfn then reads no
#   output per call, which a Kubernetes node's container runtime, not
#   haproxy, would read)
set -eu
. "$(dirname "$0")/../scripts/lib/testbed.sh"

PROFILE=${PROFILE:-release}
export ROUNDS=${ROUNDS:-5} ROUND_CALLS=${ROUND_CALLS:-100} PACE_MS=${PACE_MS:-20}
COLD_CALLS=${COLD_CALLS:-10}
COUNT_CALLS=${COUNT_CALLS:-300}
COLD_ROUNDS=${COLD_ROUNDS:-3}
FUNCTIONS=${FUNCTIONS:-10}
PYTHONIC_ROOT=${PYTHONIC_ROOT:-/var/cache/xfn-test/function-pythonic-0.6.3}
NS=crossplane-system
bench_work host
NATIVE_PIDS=
PEER_PIDS=
BEFORE_PID=
PROBES=
bench_cleanup_more() {
    for pid in $NATIVE_PIDS $PEER_PIDS $BEFORE_PID; do kill "$pid" 2>/dev/null || true; done
    [ -z "$PROBES" ] || perf probe -q -d 'probe_libc:*' 2>/dev/null || true
    # LOGS=DIR keeps xfn's logs (XFN_ENV=RUST_LOG=xfn=trace: each start's
    # steps, benches/PROFILE.md).
    [ -n "${LOGS:-}" ] && mkdir -p "$LOGS" && cp "$WORK"/*.log "$LOGS"/ 2>/dev/null
    true
}

# Build xfn, the client and the static test server, niced (the machine's
# CPUs are shared); the measurements run at the usual priority.
export CARGO_INCREMENTAL=0
renice -n 10 -p $$ >/dev/null
cargo build --quiet --profile "$PROFILE" --bin xfn
LOAD=$(cargo build --quiet --profile "$PROFILE" --bench host_load --message-format=json |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "host_load" and m.get("executable"):
        print(m["executable"])')
build_function_server
renice -n 0 -p $$ >/dev/null
case "$PROFILE" in dev) XFN=target/debug/xfn ;; *) XFN=target/$PROFILE/xfn ;; esac
XFN=${XFN_BINARY:-$XFN} # a build made before, to compare (as benches/server.sh)
cp "$(realpath "$XFN")" "$WORK/xfn"
cp "$LOAD" "$WORK/host_load"
chmod 755 "$WORK/xfn" "$WORK/host_load"
if [ -n "${XFN_BINARY_BEFORE:-}" ]; then
    # Named xfn too: host_load tells xfn's own processes by their command.
    mkdir -p "$WORK/before"
    cp "$(realpath "$XFN_BINARY_BEFORE")" "$WORK/before/xfn"
    chmod 755 "$WORK/before" "$WORK/before/xfn"
fi
XFN="$WORK/xfn"
LOAD="$WORK/host_load"
# The variants of xfn from zero and idle: label=binary.
VARIANTS="after=$XFN"
[ -n "${XFN_BINARY_BEFORE:-}" ] && VARIANTS="$VARIANTS before=$WORK/before/xfn"
# PREPARE_OFF=1: this build with --prepare-servers=false too (label off).
[ -n "${PREPARE_OFF:-}" ] && VARIANTS="$VARIANTS off=$XFN"

start_registry

# The test server's image: busybox and /fn_server.
new_busybox_image sh
cp "$FUNCTION_SERVER" "$WORK/unpacked/rootfs/fn_server"
push_image /fn_server fn-server:v1
if [ -n "${QUIET_SERVER:-}" ]; then
    umoci config --image "$WORK/oci:fn" --config.env FN_SERVER_QUIET=1 >/dev/null
    skopeo copy --quiet --dest-tls-verify=false "oci:$WORK/oci:fn" "docker://$IMAGE"
fi
FN_IMAGE=$IMAGE
mv "$WORK/unpacked/rootfs" "$WORK/root-fn"
rm -rf "$WORK/oci" "$WORK/unpacked"

# function-pythonic's image: its trixie root, byte-compiled first so that
# neither side compiles at start.
KINDS=fn_server
if [ -d "$PYTHONIC_ROOT/opt/function-pythonic/crossplane_function_pythonic-0.6.3.dist-info" ]; then
    KINDS="fn_server pythonic"
    umoci init --layout "$WORK/oci" >/dev/null
    umoci new --image "$WORK/oci:fn" >/dev/null
    umoci unpack --rootless --image "$WORK/oci:fn" "$WORK/unpacked" >/dev/null
    (cd "$PYTHONIC_ROOT" && tar --exclude=./proc/* --exclude=./sys/* --exclude=./dev/* -cf - .) |
        tar -C "$WORK/unpacked/rootfs" -xf -
    chroot "$WORK/unpacked/rootfs" python3 -m compileall -q /opt/function-pythonic /usr/lib/python3 >/dev/null 2>&1 || true
    umoci repack --image "$WORK/oci:fn" "$WORK/unpacked" >/dev/null
    umoci config --image "$WORK/oci:fn" --config.entrypoint /usr/bin/python3 \
        --config.entrypoint -m --config.entrypoint crossplane.pythonic --config.entrypoint grpc \
        ${QUIET_SERVER:+--config.entrypoint --logger-level --config.entrypoint =WARNING} \
        --config.env PATH=/usr/local/bin:/usr/bin:/bin --config.env PYTHONPATH=/opt/function-pythonic \
        --config.workingdir /tmp >/dev/null
    PY_IMAGE="127.0.0.1:$PORT/function-pythonic:v0.6.3"
    skopeo copy --quiet --dest-tls-verify=false "oci:$WORK/oci:fn" "docker://$PY_IMAGE"
    mv "$WORK/unpacked/rootfs" "$WORK/root-py"
    # What a container's /dev gives it (grpcio reads /dev/urandom), for
    # the native side's chroot.
    cp -a /dev/null /dev/zero /dev/random /dev/urandom "$WORK/root-py/dev/"
    rm -rf "$WORK/oci" "$WORK/unpacked"
else
    echo "NOTE: no function-pythonic root at $PYTHONIC_ROOT (scripts/setup.sh builds it): the test server only" >&2
fi

# ONLY=fn_server or ONLY=pythonic runs one of them; PARTS some rows.
KINDS=${ONLY:-$KINDS}
PARTS=${PARTS:-warm count cold memory}
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

# native_command KIND PORT: the server of KIND on 127.0.0.1:PORT, run from
# its image's rootfs with no container.
native_command() {
    case $1 in
        fn_server) echo "env ${QUIET_SERVER:+FN_SERVER_QUIET=1} unshare --user --map-root-user chroot $WORK/root-fn /fn_server --insecure --address 127.0.0.1:$2" ;;
        pythonic) echo "unshare --user --map-root-user chroot $WORK/root-py /usr/bin/env PYTHONPATH=/opt/function-pythonic HOME=/tmp /usr/bin/python3 -m crossplane.pythonic grpc ${QUIET_SERVER:+--logger-level =WARNING} --insecure --address 127.0.0.1:$2" ;;
    esac
}
image_of() { case $1 in fn_server) echo "$FN_IMAGE" ;; pythonic) echo "$PY_IMAGE" ;; esac; }
prefix_of() { case $1 in fn_server) echo fn ;; pythonic) echo py ;; esac; }

# A CA as Crossplane's `crossplane-root-ca` holds it and a client
# certificate it signed (as tests/host_e2e.rs makes them).
mkdir -p "$WORK/certs/ca"
(
    cd "$WORK/certs"
    openssl genrsa -traditional -out ca/tls.key 2048 2>/dev/null
    openssl req -x509 -new -key ca/tls.key -out ca/tls.crt -days 2 -subj "/O=Crossplane/CN=Crossplane Root CA" 2>/dev/null
    openssl genrsa -traditional -out client.key 2048 2>/dev/null
    openssl req -new -key client.key -out client.csr -subj "/O=Crossplane/CN=crossplane" 2>/dev/null
    printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >client.ext
    openssl x509 -req -in client.csr -CA ca/tls.crt -CAkey ca/tls.key -CAcreateserial -out client.crt -days 2 -extfile client.ext 2>/dev/null
    # The peers' server certificate, for every Service name the bench dials.
    openssl genrsa -traditional -out peer.key 2048 2>/dev/null
    openssl req -new -key peer.key -out peer.csr -subj "/CN=peer" 2>/dev/null
    printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:fn.%s,DNS:py.%s\n' "$NS" "$NS" >peer.ext
    openssl x509 -req -in peer.csr -CA ca/tls.crt -CAkey ca/tls.key -CAcreateserial -out peer.crt -days 2 -extfile peer.ext 2>/dev/null
    cat peer.crt peer.key >peer.pem
)
chown -R "$NONROOT:$NONROOT" "$WORK/certs"
export CERTS="$WORK/certs"

# functions_file FILE NAME=IMAGE...: Crossplane Function objects.
functions_file() {
    file=$1; shift
    for pair; do
        printf -- '---\napiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: %s\nspec:\n  package: %s\n' "${pair%%=*}" "${pair#*=}"
    done >"$file"
    chmod 644 "$file"
}

mkdir -p "$WORK/cache"
chown "$NONROOT:$NONROOT" "$WORK/cache"
HPORT=$((PORT + 1))
MPORT=$((PORT + 2))
NPORT=$((PORT + 3))
# The peers' ports, past the memory rows' native servers.
APORT=$((PORT + FUNCTIONS + 10))
SPORT=$((PORT + FUNCTIONS + 11))
# The before build's ports (XFN_BINARY_BEFORE).
BPORT=$((PORT + FUNCTIONS + 12))
BMPORT=$((PORT + FUNCTIONS + 13))
PEERS=${PEERS-haproxy socat}
PEER_PIDS=

# peers_up PREFIX: each installed peer of PEERS in front of the native
# server on $NPORT, as uid 65532; sets PEER_ARGS, host_load's peer targets.
peers_up() {
    PEER_ARGS=
    PEER_ENV=
    for peer in $PEERS; do
        command -v "$peer" >/dev/null || { echo "NOTE: $peer is not installed: not measured" >&2; continue; }
        case $peer in
            haproxy)
                cat >"$WORK/haproxy.cfg" <<EOF
global
    log stderr format raw local0 err
defaults
    mode http
    timeout connect 5s
    timeout client 120s
    timeout server 120s
frontend functions
    bind 127.0.0.1:$APORT ssl crt $WORK/certs/peer.pem ca-file $WORK/certs/ca/tls.crt verify required alpn h2
    use_backend function if { ssl_fc_sni -i $1.$NS }
backend function
    server native 127.0.0.1:$NPORT proto h2
EOF
                $AS_NONROOT haproxy -db -f "$WORK/haproxy.cfg" >"$WORK/haproxy.log" 2>&1 &
                port=$APORT ;;
            socat)
                $AS_NONROOT socat "OPENSSL-LISTEN:$SPORT,bind=127.0.0.1,reuseaddr,fork,cert=$WORK/certs/peer.pem,cafile=$WORK/certs/ca/tls.crt,verify=1" \
                    "TCP:127.0.0.1:$NPORT,nodelay" >"$WORK/socat.log" 2>&1 &
                port=$SPORT ;;
            *) echo "PEERS: $peer is not one of haproxy, socat" >&2; exit 1 ;;
        esac
        PEER_PIDS="$PEER_PIDS $!"
        PEER_ENV="$PEER_ENV $(echo "$peer" | tr a-z A-Z)_PID=$!"
        for _ in $(seq 100); do
            /usr/bin/python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2).close()" 2>/dev/null && break
            sleep 0.1
        done
        PEER_ARGS="$PEER_ARGS $peer=tls:127.0.0.1:$port/$1.$NS"
    done
}
peers_down() {
    for pid in $PEER_PIDS; do kill "$pid" 2>/dev/null || true; done
    for pid in $PEER_PIDS; do wait "$pid" 2>/dev/null || true; done
    PEER_PIDS=
}

# up NAME FUNCTIONS_FILE FLAGS...: `xfn host` as uid 65532 on $HPORT
# (metrics on $MPORT), its log in $WORK/NAME.log; waits until it listens
# and every function's package is ready. UP_XFN, UP_PORT, UP_MPORT and
# UP_CACHE (when set) run another build on other ports instead.
up() {
    name=$1 file=$2; shift 2
    $AS_NONROOT env ${XFN_ENV:-} "${UP_XFN:-$XFN}" host --functions "$file" --ca "$WORK/certs/ca" \
        --cache-dir "${UP_CACHE:-$WORK/cache}" --address "127.0.0.1:${UP_PORT:-$HPORT}" \
        --metrics-address "127.0.0.1:${UP_MPORT:-$MPORT}" "$@" 2>"$WORK/$name.log" &
    XFN_PID=$!
    want=$(grep -c '^kind: Function' "$file")
    for _ in $(seq 1200); do
        [ "$(grep -c 'function package ready' "$WORK/$name.log")" -ge "$want" ] && return 0
        kill -0 "$XFN_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "xfn host ($name) did not get its packages ready:" >&2
    tail -20 "$WORK/$name.log" >&2
    exit 1
}
down() {
    kill -TERM "$XFN_PID"
    wait "$XFN_PID" || true
    XFN_PID=
}
# before_up FUNCTIONS_FILE: the XFN_BINARY_BEFORE build's `xfn host` on
# $BPORT, as a peer named `before` (BEFORE_PID); before_down stops it.
before_up() {
    [ -n "${XFN_BINARY_BEFORE:-}" ] || return 0
    after_pid=$XFN_PID
    mkdir -p "$WORK/cache-before"
    chown "$NONROOT:$NONROOT" "$WORK/cache-before"
    UP_XFN="$WORK/before/xfn" UP_PORT=$BPORT UP_MPORT=$BMPORT UP_CACHE="$WORK/cache-before"
    up "$kind-before" "$1"
    unset UP_XFN UP_PORT UP_MPORT UP_CACHE
    BEFORE_PID=$XFN_PID
    XFN_PID=$after_pid
    PEER_ENV="$PEER_ENV BEFORE_PID=$BEFORE_PID"
    PEER_ARGS="$PEER_ARGS before=tls:127.0.0.1:$BPORT/$prefix.$NS"
}
before_down() {
    [ -n "$BEFORE_PID" ] || return 0
    kill -TERM "$BEFORE_PID"
    wait "$BEFORE_PID" || true
    BEFORE_PID=
}
# count_side SIDE TARGET PID: `host_load count` of one side, its lines
# prefixed `SIDE.` (as root: perf's tracepoints and strace need it). With
# COUNT_PROFILE=DIR, also where each side's CPU goes (perf report) in
# DIR/KIND-SIDE.txt, its perf data beside it (.txt.data).
count_side() {
    profile=
    [ -z "${COUNT_PROFILE:-}" ] || profile="$COUNT_PROFILE/$kind-$1.txt"
    env CERTS="$CERTS" ${profile:+COUNT_PROFILE="$profile"} "$LOAD" count "$2" "$COUNT_CALLS" "$3" | sed "s/^/$1./" >>"$out"
}

# native_up KIND PORT: a native server, listening; its pid added to NATIVE_PIDS.
native_up() {
    # shellcheck disable=SC2046 # the command's words
    setsid $(native_command "$1" "$2") >"$WORK/native-$2.log" 2>&1 &
    pid=$!
    NATIVE_PID=$pid
    NATIVE_PIDS="$NATIVE_PIDS $pid"
    for _ in $(seq 600); do
        /usr/bin/python3 -c "import socket; socket.create_connection(('127.0.0.1', $2), 0.2).close()" 2>/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "the native $1 never listened on $2:" >&2
    cat "$WORK/native-$2.log" >&2
    exit 1
}
natives_down() {
    for pid in $NATIVE_PIDS; do kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true; done
    for pid in $NATIVE_PIDS; do wait "$pid" 2>/dev/null || true; done
    NATIVE_PIDS=
}

# tree_kb PID [Rss|Pss]: kB of the process PID and all its descendants;
# own_kb PID [Rss|Pss]: of xfn's own processes under PID (those whose
# command is `xfn host`), not of the functions it runs.
tree_kb() { "$LOAD" memory "$1" "${2:-Rss}" all; }
own_kb() { "$LOAD" memory "$1" "${2:-Rss}" own; }
# settled CMD...: the median of five readings of CMD a second apart.
settled() {
    for _ in 1 2 3 4 5; do "$@"; sleep 1; done | sort -n | sed -n 3p
}

for kind in $KINDS; do
    export FUNCTION_KIND=$kind
    image=$(image_of "$kind")
    prefix=$(prefix_of "$kind")
    out="$WORK/$kind.txt"
    : >"$out"

    # Warm: the native server and xfn host's, called in alternating rounds.
    functions_file "$WORK/one.yaml" "$prefix=$image"
    if part warm || part count; then
        up "$kind-warm" "$WORK/one.yaml"
        native_up "$kind" "$NPORT"
        peers_up "$prefix"
        before_up "$WORK/one.yaml"
        if part warm; then
            # shellcheck disable=SC2086 # one word per peer
            $AS_NONROOT env CERTS="$CERTS" XFN_PID="$XFN_PID" DIRECT_PID="$NATIVE_PID" $PEER_ENV "$LOAD" warm "tcp:127.0.0.1:$NPORT" "tls:127.0.0.1:$HPORT/$prefix.$NS" $PEER_ARGS >>"$out"
        fi
        if part count && ! { command -v perf && command -v strace; } >/dev/null; then
            echo "NOTE: perf or strace is not installed: the count part is not measured" >&2
        elif part count; then
            if [ -z "$PROBES" ] && perf probe -q -x "$(ldconfig -p | awk '/libc.so.6 .*x86-64/ {print $NF; exit}')" \
                --add malloc --add calloc --add realloc 2>/dev/null; then
                PROBES=1
            fi
            count_side xfn "tls:127.0.0.1:$HPORT/$prefix.$NS" "$XFN_PID"
            for side in $PEER_ENV; do
                name=$(echo "${side%%_PID=*}" | tr A-Z a-z)
                port=$(echo "$PEER_ARGS" | tr ' ' '\n' | sed -n "s|^$name=tls:127.0.0.1:\([0-9]*\)/.*|\1|p")
                count_side "$name" "tls:127.0.0.1:$port/$prefix.$NS" "${side#*_PID=}"
            done
        fi
        before_down
        peers_down
        natives_down
        down
    fi

    # From zero, natively and through each variant, in alternating rounds.
    if part cold; then
        for round in $(seq "$COLD_ROUNDS"); do
            # shellcheck disable=SC2046 # the command's words
            "$LOAD" cold-native "$COLD_CALLS" "$NPORT" -- $(native_command "$kind" "$NPORT") |
                sed "s/^/r${round}_/" >>"$out"
            for variant in $VARIANTS; do
                label=${variant%%=*}
                flags=
                [ "$label" = off ] && flags=--prepare-servers=false
                # shellcheck disable=SC2086 # none or one flag
                UP_XFN=${variant#*=} up "$kind-cold-$label" "$WORK/one.yaml" --server-idle 1s $flags
                # The build before has no containers created ahead to wait for.
                prepared=0
                [ "$label" = after ] && prepared=1
                $AS_NONROOT env CERTS="$CERTS" PREPARED=$prepared "$LOAD" cold-host "tls:127.0.0.1:$HPORT/$prefix" "$MPORT" "$prefix" "$COLD_CALLS" |
                    sed "s/^host_cold/r${round}_${label}_cold/" >>"$out"
                down
            done
        done
    fi

    # Memory: FUNCTIONS hosted, idle; FUNCTIONS native servers; all hosted warm.
    if part memory; then
        pairs=
        for i in $(seq "$FUNCTIONS"); do pairs="$pairs $prefix-$i=$image"; done
        # shellcheck disable=SC2086 # one word per function
        functions_file "$WORK/many.yaml" $pairs
        for variant in $VARIANTS; do
            label=${variant%%=*}
            [ "$label" = before ] || continue
            UP_XFN=${variant#*=} up "$kind-memory-$label" "$WORK/many.yaml"
            sleep 17
            echo "${label}_xfn_idle_rss_kb=$(settled own_kb "$XFN_PID")" >>"$out"
            echo "${label}_idle_tree_rss_kb=$(settled tree_kb "$XFN_PID")" >>"$out"
            echo "${label}_idle_tree_pss_kb=$(settled tree_kb "$XFN_PID" Pss)" >>"$out"
            down
        done
        # --prepared-idle PREPARED_IDLE (20 s; the default is 10 min): the
        # containers created ahead at hosting are removed within it and a
        # sweep (a quarter of it) of no call.
        up "$kind-memory" "$WORK/many.yaml" --prepared-idle "${PREPARED_IDLE:-20}s"
        # Within the window: xfn's whole tree with the containers created
        # ahead (made at the first sweep once the packages are ready).
        sleep 8
        echo "window_tree_rss_kb=$(settled tree_kb "$XFN_PID")" >>"$out"
        echo "window_tree_pss_kb=$(settled tree_kb "$XFN_PID" Pss)" >>"$out"
        # Past the window and three of xfn::resident's looks (5 s): scaled
        # to zero for long, as between rare calls.
        sleep $(( ${PREPARED_IDLE:-20} * 5 / 4 + 4 ))
        echo "xfn_idle_rss_kb=$(settled own_kb "$XFN_PID")" >>"$out"
        echo "xfn_idle_pss_kb=$(settled own_kb "$XFN_PID" Pss)" >>"$out"
        echo "idle_tree_rss_kb=$(settled tree_kb "$XFN_PID")" >>"$out"
        echo "idle_tree_pss_kb=$(settled tree_kb "$XFN_PID" Pss)" >>"$out"
        for i in $(seq "$FUNCTIONS"); do
            $AS_NONROOT env CERTS="$CERTS" "$LOAD" once "tls:127.0.0.1:$HPORT/$prefix-$i" >/dev/null
        done
        running=$(grep -c "function server started" "$WORK/$kind-memory.log")
        [ "$running" -eq "$FUNCTIONS" ] || { echo "$running servers started, not $FUNCTIONS" >&2; exit 1; }
        sleep 17
        echo "hosted_warm_rss_kb=$(settled tree_kb "$XFN_PID")" >>"$out"
        echo "hosted_warm_pss_kb=$(settled tree_kb "$XFN_PID" Pss)" >>"$out"
        echo "hosted_warm_own_rss_kb=$(settled own_kb "$XFN_PID")" >>"$out"
        down
        native_total=0
        native_pss=0
        for i in $(seq "$FUNCTIONS"); do native_up "$kind" $((NPORT + i)); done
        for i in $(seq "$FUNCTIONS"); do
            "$LOAD" once "tcp:127.0.0.1:$((NPORT + i))" >/dev/null
        done
        sleep 2
        for pid in $NATIVE_PIDS; do
            native_total=$((native_total + $(tree_kb "$pid")))
            native_pss=$((native_pss + $(tree_kb "$pid" Pss)))
        done
        echo "native_rss_kb=$native_total" >>"$out"
        echo "native_pss_kb=$native_pss" >>"$out"
        natives_down
    fi
done

python3 - "$WORK" "$PROFILE" "$FUNCTIONS" $KINDS <<'PY'
import sys
work, profile, n, kinds = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
print(f"xfn build profile: {profile}; xfn as uid 65532; {n} functions for the memory rows")
for kind in kinds:
    f = dict(l.strip().split("=", 1) for l in open(f"{work}/{kind}.txt") if "=" in l)
    g = lambda k: float(f[k])
    mb = lambda k: g(k) / 1024
    print(f"{kind}:")
    if "overhead_p50_ms" in f:
        print(f"  warm call p50 (ms)        direct {g('direct_p50_ms'):7.3f}  via xfn host {g('hosted_p50_ms'):7.3f}"
              f"  overhead {g('overhead_p50_ms'):+.3f} ms (median round; target <= 0.3)")
        print(f"  warm call p99 (ms)        direct {g('direct_p99_ms'):7.3f}  via xfn host {g('hosted_p99_ms'):7.3f}")
        print(f"  the hop alone p50 (ms)    {g('hop_p50_ms'):7.3f}  (gRPC health check through xfn host's TLS and HTTP/2, no function)")
        print(f"  CPU per call (us)         direct server {g('direct_cpu_us_per_call'):7.1f}  xfn host and its server {g('hosted_cpu_us_per_call'):7.1f}"
              f"  (xfn alone {g('xfn_cpu_us_per_call'):.1f}; {g('xfn_idle_cpu_us_per_s'):.1f} us a second idle)")
        if "before_overhead_p50_ms" in f:
            print(f"  before (XFN_BINARY_BEFORE) direct {g('direct_p50_ms'):7.3f}  via xfn host {g('before_p50_ms'):7.3f}"
                  f"  overhead {g('before_overhead_p50_ms'):+.3f} ms; CPU per call, xfn alone {g('before_xfn_cpu_us_per_call'):.1f} us"
                  f" (and its server {g('before_cpu_us_per_call'):.1f})")
            if "before_cpu_ratio_median" in f:
                print(f"  xfn's hop CPU / before's, round by round: median {g('before_cpu_ratio_median'):.2f}x"
                      f" (rounds {g('before_cpu_ratio_min'):.2f}x to {g('before_cpu_ratio_max'):.2f}x)")
        for peer in ("haproxy", "socat"):
            if f"{peer}_overhead_p50_ms" in f:
                print(f"  peer {peer:8} p50 (ms)    direct {g('direct_p50_ms'):7.3f}  via {peer:8} {g(peer + '_p50_ms'):7.3f}"
                      f"  overhead {g(peer + '_overhead_p50_ms'):+.3f} ms; xfn host's is {g('overhead_p50_ms') / g(peer + '_overhead_p50_ms'):.2f}x {peer}'s;"
                      f" its CPU per call {g(peer + '_cpu_us_per_call'):.1f} us")
                if f"{peer}_cpu_ratio_median" in f:
                    print(f"  xfn's hop CPU / {peer}'s, round by round: median {g(peer + '_cpu_ratio_median'):.2f}x"
                          f" (rounds {g(peer + '_cpu_ratio_min'):.2f}x to {g(peer + '_cpu_ratio_max'):.2f}x; target <= 1.00x)")
    import re
    hop = {}
    for k, v in f.items():
        m = re.fullmatch(r"round(\d+)_(\w+?)_hop_cpu_us", k)
        if m:
            hop.setdefault(m.group(2), []).append((int(m.group(1)), float(v)))
    if hop:
        print("  the hop's CPU per call in each round (us; xfn's own processes, a peer's):")
        for side in ("hosted", "before", "haproxy", "socat"):
            if side in hop:
                name = "xfn" if side == "hosted" else side
                print(f"    {name:10}" + " ".join(f"{v:6.1f}" for _, v in sorted(hop[side])))
    sides = [s for s in ("xfn", "before", "haproxy", "socat") if f"{s}.count_task_clock" in f]
    if sides:
        print(f"  per warm call, counted (xfn: its own processes; less idle):")
        print(f"    {'':28}" + "".join(f"{s:>10}" for s in sides) + ("   xfn/haproxy" if "haproxy" in sides else ""))
        keys = []
        for k in f:
            side, _, key = k.partition(".")
            if side in sides and key not in keys and not key.endswith("_idle_per_s") and key != "count_pids":
                keys.append(key)
        for key in keys:
            label = key.replace("count_syscalls_sys_enter_", "").replace("count_", "").replace("raw_syscalls_sys_enter", "syscalls")
            label = label.replace("task_clock", "CPU (ms)").replace("probe_libc_", "")
            cells = "".join(f"{float(f.get(s + '.' + key, 'nan')):10.2f}" for s in sides)
            ratio = ""
            if "haproxy" in sides and float(f.get("haproxy." + key, 0)) > 0.005:
                ratio = f"   {float(f.get('xfn.' + key, 0)) / float(f['haproxy.' + key]):.2f}x"
            print(f"    {label:28}{cells}{ratio}")
    def rounds(name, stat):
        import re, statistics
        values = [float(v) for k, v in f.items() if re.fullmatch(rf"r\d+_{name}_cold_{stat}_ms", k)]
        if not values:
            return None
        return statistics.median(values) if stat == "p50" else min(values)
    native = rounds("native", "p50")
    if native is not None:
        print(f"  first call from zero, median round's p50 (min) over {len([k for k in f if k.endswith('native_cold_p50_ms')])} rounds:")
        print(f"    native                  {native:8.1f} ms ({rounds('native', 'min'):.1f})")
        for label in ("before", "off", "after"):
            p50 = rounds(label, "p50")
            if p50 is not None:
                target = "target <= 1.05x" if kind == "pythonic" else "target <= +5 ms"
                print(f"    via xfn host ({label:6}) {p50:8.1f} ms ({rounds(label, 'min'):.1f})"
                      f"  {p50 / native:.2f}x native, {p50 - native:+.1f} ms ({target})")
    if "native_rss_kb" in f:
        for label in ("before",):
            if f"{label}_xfn_idle_rss_kb" in f:
                print(f"  {n} idle, build {label} (MB)  xfn's own RSS {mb(label + '_xfn_idle_rss_kb'):6.1f}"
                      f"  its whole tree RSS {mb(label + '_idle_tree_rss_kb'):6.1f} PSS {mb(label + '_idle_tree_pss_kb'):6.1f}")
        if "window_tree_rss_kb" in f:
            print(f"  {n} idle, this build (MB)  within --prepared-idle: whole tree RSS {mb('window_tree_rss_kb'):6.1f}"
                  f" PSS {mb('window_tree_pss_kb'):6.1f} (with the containers created ahead)")
        if "idle_tree_rss_kb" in f:
            print(f"  {n} idle, this build (MB)  past it: xfn's own RSS {mb('xfn_idle_rss_kb'):6.1f} PSS {mb('xfn_idle_pss_kb'):6.1f}"
                  f"  its whole tree RSS {mb('idle_tree_rss_kb'):6.1f} PSS {mb('idle_tree_pss_kb'):6.1f}")
        idle = g('native_rss_kb') / g('xfn_idle_rss_kb')
        print(f"  {n} idle (MB RSS)          {n} native servers {mb('native_rss_kb'):7.1f}  xfn host, scaled to zero {mb('xfn_idle_rss_kb'):6.1f}"
              f"  {idle:.1f}x less (target >= 10x)  [PSS {mb('native_pss_kb'):.1f} vs {mb('xfn_idle_pss_kb'):.1f}]")
        warm = g('hosted_warm_rss_kb') / (g('native_rss_kb') + g('xfn_idle_rss_kb'))
        print(f"  {n} warm (MB RSS)          native + xfn idle {(g('native_rss_kb') + g('xfn_idle_rss_kb')) / 1024:7.1f}"
              f"  xfn host tree {mb('hosted_warm_rss_kb'):7.1f} (xfn's own {mb('hosted_warm_own_rss_kb'):.1f})"
              f"  {warm:.2f}x (target <= 1.1x)  [PSS {(g('native_pss_kb') + g('xfn_idle_pss_kb')) / 1024:.1f} vs {mb('hosted_warm_pss_kb'):.1f}]")
PY
