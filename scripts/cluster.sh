#!/usr/bin/env bash
# A real Crossplane control plane on this machine, with `xfn host` as the
# runtime of every Function (docs/host.md, "Against a real control plane"):
# etcd, kube-apiserver and a kube-controller-manager running only its
# garbage collector (no kubelet, no scheduler, no Deployment controller:
# nothing here can run a pod), Crossplane core started out of cluster with
# `--package-runtime=Function=External`, and `xfn host` replicas in
# controller mode. Everything is built from the Go module proxy at the
# pinned versions below into a cache (default /var/cache/xfn-test/cluster,
# or $XFN_CLUSTER_CACHE), as scripts/peers.sh builds the peers.
#
#   scripts/cluster.sh build          build what is missing (idempotent)
#   scripts/cluster.sh up             build, then start the control plane and
#                                     xfn host replica 1 (a no-op when up)
#   scripts/cluster.sh host start N   start xfn host replica N (1..9)
#   scripts/cluster.sh host stop N    SIGTERM it (it drains), wait for it
#   scripts/cluster.sh host kill N    SIGKILL it (a crash)
#   scripts/cluster.sh down           stop everything `up` started
#   scripts/cluster.sh env            the variables to talk to it (eval it)
#
# Run state lives in $XFN_CLUSTER_RUN (default /tmp/xfn-cluster): the PKI,
# the kubeconfigs, etcd's data, each process's pid and log. `down` stops
# every process by its recorded pid and removes the run directory. Two
# instances can run at once with distinct $XFN_CLUSTER_RUN and
# $XFN_CLUSTER_NET (the replicas' /24 on loopback, default 127.0.45).
# $XFN_HOST_ARGS: more flags for every replica started (`--server-idle 3s`).
#
# Names. Core dials a revision's `status.endpoint`, `dns:///NAME.NS:9443`.
# In a cluster, DNS answers a headless Service's name with the addresses of
# the ready pods it selects. Here the replicas listen on NET.N:9443 and
# a resolver loop of this script plays that DNS: every second it writes, for
# each headless Service in crossplane-system that selects xfn host's pods,
# `NAME`, `NAME.NS`, `NAME.NS.svc` and `NAME.NS.svc.cluster.local` mapped to
# each replica whose /readyz answers 200 (a ready endpoint), into a hosts
# file that is bind-mounted on /etc/hosts in core's own mount namespace
# only (Go's resolver reads /etc/hosts first and returns every address of a
# name, as DNS returns every A record). So a name resolves only once xfn's
# controller has made its Service, stops resolving when the Service goes,
# and a replica that stops drops out: what a cluster's DNS does. The
# machine's /etc/hosts is never touched. Lines of $run/hosts.extra (`IP
# NAME...`) are added as they are: endpoints served by something else than
# xfn host (benches/cluster.sh's native function servers).
set -euo pipefail

# name                     module                                version  main package
BUILDS="
etcd                       go.etcd.io/etcd/server/v3             v3.7.3   go.etcd.io/etcd/server/v3
kube-apiserver             k8s.io/kubernetes                     v1.37.2  k8s.io/kubernetes/cmd/kube-apiserver
kube-controller-manager    k8s.io/kubernetes                     v1.37.2  k8s.io/kubernetes/cmd/kube-controller-manager
kubectl                    k8s.io/kubernetes                     v1.37.2  k8s.io/kubernetes/cmd/kubectl
crossplane-core            github.com/crossplane/crossplane/v2   v2.4.0   ./cmd/crossplane
"
# k8s.io/kubernetes's go.mod replaces its k8s.io/* staging modules by
# ./staging directories its module zip leaves out: each becomes the
# published module at the matching v0 version.
K8S_STAGING_VERSION=v0.37.2
# Crossplane core: v2.4.0 is the newest release whose dependencies the proxy
# serves (v2.4.2's crossplane-runtime v2.4.2 and apis v2.4.2 are refused
# with 403; v2.4.1 itself is). It has `--package-runtime=Function=External`
# and PR #6567 (an External runtime's revisions get no runtimeConfigRef or
# TLS secret names from their Function). Its CRDs are the module's
# cluster/crds, which `crossplane core init` applies.

cache=${XFN_CLUSTER_CACHE:-/var/cache/xfn-test/cluster}
run=${XFN_CLUSTER_RUN:-/tmp/xfn-cluster}
repo=$(cd "$(dirname "$0")/.." && pwd)
xfn=${XFN:-$repo/target/debug/xfn}
ns=crossplane-system
net=${XFN_CLUSTER_NET:-127.0.45}
[[ $net =~ ^127\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || { echo "cluster: XFN_CLUSTER_NET must be 127.X.Y, not $net" >&2; exit 1; }
command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
bin=$cache/bin
kubectl() { "$bin/kubectl" --kubeconfig "$run/admin.kubeconfig" "$@"; }
log() { echo "cluster: $*" >&2; }
die() { log "$*"; exit 1; }

build() {
    command -v go >/dev/null || die "go not found: install Go (1.26) first"
    mkdir -p "$bin" "$cache/logs"
    exec 8>"$cache/.lock"
    flock 8
    export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" CGO_ENABLED=0 \
        GOTOOLCHAIN=local GOFLAGS="-modcacherw -mod=mod -trimpath"
    local built=0 name module version main dir
    while read -r name module version main; do
        [ -n "$name" ] || continue
        if [ -x "$bin/$name" ] && [ "$(cat "$bin/$name.version" 2>/dev/null)" = "$module@$version" ]; then
            continue
        fi
        log "building $name ($module@$version)"
        local start=$SECONDS
        dir=$cache/build/$name
        rm -rf "$dir" && mkdir -p "$dir"
        if [ "$module" = github.com/crossplane/crossplane/v2 ]; then
            # As scripts/peers.sh: the module itself, its `apis` replace
            # (a nested module the zip leaves out) made a requirement.
            local src
            src=$(go mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
            [ -n "$src" ] || die "the Go module proxy did not serve $module@$version"
            rm -rf "$dir" && cp -r "$src" "$dir" && chmod -R u+w "$dir"
            (cd "$dir" && go mod edit -dropreplace=github.com/crossplane/crossplane/apis/v2 \
                -require="github.com/crossplane/crossplane/apis/v2@$version")
            rm -rf "$cache/crds" && cp -r "$dir/cluster/crds" "$cache/crds"
        else
            # A module of its own requiring the one to build.
            printf 'module xfn-cluster/%s\n\ngo 1.26.0\n\nrequire %s %s\n' "$name" "$module" "$version" >"$dir/go.mod"
            if [ "$module" = k8s.io/kubernetes ]; then
                local k8s
                k8s=$(go mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
                [ -n "$k8s" ] || die "the Go module proxy did not serve $module@$version"
                {
                    echo "replace ("
                    sed -En "s#^\t(k8s\.io/[^ ]+) => \./staging/.*#\t\1 => \1 $K8S_STAGING_VERSION#p" "$k8s/go.mod"
                    echo ")"
                } >>"$dir/go.mod"
            fi
        fi
        (cd "$dir" && nice timeout 3600 go build -o "$bin/$name.tmp" "$main" >"$cache/logs/$name.log" 2>&1) || {
            grep -v '^go: downloading' "$cache/logs/$name.log" >&2
            die "go build of $name failed (log: $cache/logs/$name.log)"
        }
        mv "$bin/$name.tmp" "$bin/$name"
        echo "$module@$version" >"$bin/$name.version"
        built=1
        log "built $name in $((SECONDS - start)) s"
    done <<<"$BUILDS"
    [ -d "$cache/crds" ] || die "no Crossplane CRDs in $cache/crds: remove $bin/crossplane-core and build again"
    # The build cache (GBs) only speeds up a rebuild the stamps make
    # unneeded: dropped, as scripts/peers.sh does; the module cache is kept.
    ((built == 0)) || go clean -cache
    exec 8>&-
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start NAME COMMAND...: run in the background (own session), pid and log
# (appended: a restarted replica's log keeps the one before) under $run.
start() {
    local name=$1
    shift
    setsid "$@" >>"$run/log/$name.log" 2>&1 </dev/null &
    echo $! >"$run/pid/$name"
}

alive() { [ -f "$run/pid/$1" ] && kill -0 "$(cat "$run/pid/$1")" 2>/dev/null; }

# stop NAME [SIGNAL]: signal the recorded pid, wait up to 60 s, then kill.
stop() {
    local name=$1 signal=${2:-TERM} pid i
    [ -f "$run/pid/$name" ] || return 0
    pid=$(cat "$run/pid/$name")
    kill -"$signal" "$pid" 2>/dev/null || true
    for ((i = 0; i < 600; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$run/pid/$name"
}

wait_for() {
    local what=$1 i
    shift
    for ((i = 0; i < 1200; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    die "$what did not come up within 120 s (logs: $run/log/)"
}

# pki: a cluster CA, the API server's serving certificate, client
# certificates for the admin (system:masters: core, kubectl, the controller
# manager) and for xfn host (the user of its ServiceAccount, so the API
# server enforces deploy/host/xfn-host.yaml's RBAC on it), and the service
# account signing key.
pki() {
    local p=$run/pki
    mkdir -p "$p"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=xfn-cluster-ca \
        -keyout "$p/ca.key" -out "$p/ca.crt" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver -keyout "$p/apiserver.key" \
        -out "$p/apiserver.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n' >"$p/apiserver.ext"
    openssl x509 -req -in "$p/apiserver.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
        -days 3650 -extfile "$p/apiserver.ext" -out "$p/apiserver.crt" 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' >"$p/client.ext"
    local who subject
    for who in admin xfn-host; do
        subject=/O=system:masters/CN=admin
        [ "$who" = xfn-host ] && subject=/CN=system:serviceaccount:$ns:xfn-host
        openssl req -newkey rsa:2048 -nodes -subj "$subject" -keyout "$p/$who.key" -out "$p/$who.csr" 2>/dev/null
        openssl x509 -req -in "$p/$who.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
            -days 3650 -extfile "$p/client.ext" -out "$p/$who.crt" 2>/dev/null
        cat >"$run/$who.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: xfn-cluster
  cluster: {server: "https://127.0.0.1:$(cat "$run/apiserver-port")", certificate-authority: $p/ca.crt}
users:
- name: $who
  user: {client-certificate: $p/$who.crt, client-key: $p/$who.key}
contexts:
- name: xfn-cluster
  context: {cluster: xfn-cluster, user: $who}
current-context: xfn-cluster
EOF
    done
    # xfn host reads its kubeconfig's key inside its user namespace, where
    # root's 0600 files are not its own: readable, as a pod's projected
    # service account token is (0644).
    chmod 0644 "$p/xfn-host.key" "$run/xfn-host.kubeconfig"
    openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
    openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
}

# secret NAME DIR KEYS...: write a Secret's keys as files, as a pod mounts it.
secret() {
    local name=$1 dir=$2 key
    shift 2
    mkdir -p "$dir"
    for key in "$@"; do
        kubectl -n "$ns" get secret "$name" -o "jsonpath={.data.${key//./\\.}}" | base64 -d >"$dir/$key"
        [ -s "$dir/$key" ] || die "secret $name has no $key"
    done
}

# The resolver: the hosts file core sees (see the header).
resolve() {
    local base services ip n line
    base=$(grep -v "^${net//./\\.}\\." /etc/hosts)
    while :; do
        services=$(kubectl -n "$ns" get services -l app.kubernetes.io/managed-by=xfn-host \
            -o 'jsonpath={range .items[?(@.spec.clusterIP=="None")]}{.metadata.name}{"\n"}{end}' 2>/dev/null) || {
            sleep 1
            continue
        }
        local ready=()
        for n in 1 2 3 4 5 6 7 8 9; do
            alive "xfn-host-$n" || continue
            ip=$net.$n
            curl -sf -o /dev/null --max-time 1 "http://$ip:9090/readyz" && ready+=("$ip")
        done
        {
            echo "$base"
            for line in $services; do
                for ip in "${ready[@]}"; do
                    echo "$ip $line $line.$ns $line.$ns.svc $line.$ns.svc.cluster.local"
                done
            done
            [ ! -f "$run/hosts.extra" ] || cat "$run/hosts.extra"
        } >"$run/hosts.next"
        # In place: the bind mount holds this inode.
        cmp -s "$run/hosts.next" "$run/hosts" || cat "$run/hosts.next" >"$run/hosts"
        sleep 1
    done
}

host() {
    local verb=$1 n=$2
    [[ $n =~ ^[1-9]$ ]] || die "replica must be 1..9, not $n"
    case $verb in
    start)
        alive "xfn-host-$n" && return 0
        [ -x "$xfn" ] || die "no xfn binary at $xfn (cargo build, or set XFN)"
        mkdir -p "$run/xfn-host-$n"
        # shellcheck disable=SC2086 # $XFN_HOST_ARGS: flags, split on purpose
        start "xfn-host-$n" env KUBECONFIG="$run/xfn-host.kubeconfig" RUST_LOG="${RUST_LOG:-info}" \
            "$xfn" host --ca "$run/ca" --namespace "$ns" --address "$net.$n:9443" \
            --metrics-address "$net.$n:9090" --ready-when any --cache-dir "$run/xfn-host-$n/cache" ${XFN_HOST_ARGS:-}
        wait_for "xfn host replica $n" curl -sf "http://$net.$n:9090/readyz"
        log "xfn host replica $n serves on $net.$n:9443 (log: $run/log/xfn-host-$n.log)"
        ;;
    stop) stop "xfn-host-$n" TERM ;;
    kill) stop "xfn-host-$n" KILL ;;
    *) die "host start|stop|kill N" ;;
    esac
}

up() {
    build
    mkdir -p "$run/pid" "$run/log"
    if alive crossplane-core && alive kube-apiserver; then
        log "already up ($run)"
        host start 1
        return 0
    fi
    down_processes
    rm -rf "$run/etcd" "$run/pki" "$run/ca" "$run/core-tls" "$run/core-cache"
    local etcd_port peer_port
    etcd_port=$(free_port) peer_port=$(free_port)
    free_port >"$run/apiserver-port"
    pki
    start etcd "$bin/etcd" --data-dir "$run/etcd" --name xfn-cluster \
        --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
        --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
        --initial-cluster "xfn-cluster=http://127.0.0.1:$peer_port" --log-level warn
    wait_for etcd curl -sf "http://127.0.0.1:$etcd_port/health"
    local p=$run/pki
    start kube-apiserver "$bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
        --bind-address 127.0.0.1 --secure-port "$(cat "$run/apiserver-port")" \
        --tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" \
        --client-ca-file "$p/ca.crt" --authorization-mode RBAC \
        --service-account-key-file "$p/sa.pub" --service-account-signing-key-file "$p/sa.key" \
        --service-account-issuer https://kubernetes.default.svc --service-cluster-ip-range 10.96.0.0/16 \
        --enable-priority-and-fairness=false
    wait_for kube-apiserver kubectl get --raw /readyz
    # Only the garbage collector (owner references) and the namespace
    # controller: nothing that makes pods.
    start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig "$run/admin.kubeconfig" \
        --controllers garbagecollector,namespace --leader-elect=false --secure-port 0 \
        --use-service-account-credentials=false
    kubectl create namespace "$ns" >/dev/null
    # Core's ServiceAccount, whose image pull secrets its package fetcher reads.
    kubectl -n "$ns" create serviceaccount crossplane >/dev/null
    # Core's init: the CRDs, the CA secret and core's client certificate
    # (as the pod's init container, webhooks off), the lock, the default
    # DeploymentRuntimeConfig.
    # (Flags by their environment variables, as the chart sets them: kong
    # spells some flags oddly, `--cr-ds-path`.)
    # Its first run can fail right after applying the CRDs (its REST
    # mapping does not know them yet): tried again, as a pod's init
    # container would be restarted.
    local try
    for try in 1 2 3 4 5 6; do
        env KUBECONFIG="$run/admin.kubeconfig" POD_NAMESPACE="$ns" CRDS_PATH="$cache/crds" \
            ENABLE_WEBHOOKS=false TLS_CA_SECRET_NAME=crossplane-root-ca \
            TLS_CLIENT_SECRET_NAME=crossplane-tls-client \
            "$bin/crossplane-core" core init >>"$run/log/crossplane-init.log" 2>&1 && break
        ((try < 6)) || die "crossplane core init failed: $(tail -5 "$run/log/crossplane-init.log")"
        sleep 2
    done
    secret crossplane-root-ca "$run/ca" tls.crt tls.key
    secret crossplane-tls-client "$run/core-tls" ca.crt tls.crt tls.key
    # xfn host's ServiceAccount and RBAC, as deploy/host/xfn-host.yaml has
    # them (not its Deployment: no kubelet here).
    awk -v RS='\n---\n' '/\nkind: (ServiceAccount|ClusterRole|ClusterRoleBinding|Role|RoleBinding)\n/ {print "---"; print}' \
        "$repo/deploy/host/xfn-host.yaml" | kubectl apply -f - >/dev/null
    grep -v "^${net//./\\.}\\." /etc/hosts >"$run/hosts"
    start resolver "$0" resolve
    mkdir -p "$run/core-cache"
    local metrics health
    metrics=$(free_port) health=$(free_port)
    start crossplane-core unshare --mount --propagation private sh -c \
        'mount --bind "$1" /etc/hosts && shift && exec "$@"' sh "$run/hosts" \
        env KUBECONFIG="$run/admin.kubeconfig" POD_NAMESPACE="$ns" PACKAGE_RUNTIME=Function=External \
        ENABLE_WEBHOOKS=false TLS_CLIENT_CERTS_DIR="$run/core-tls" XPKG_CACHE_DIR="$run/core-cache" \
        METRICS_PORT="$metrics" HEALTH_PROBE_PORT="$health" \
        "$bin/crossplane-core" core start --poll-interval 10s --debug
    wait_for crossplane-core curl -sf "http://127.0.0.1:$health/readyz"
    host start 1
    log "up: KUBECONFIG=$run/admin.kubeconfig (logs: $run/log/)"
}

down_processes() {
    local name
    for name in xfn-host-9 xfn-host-8 xfn-host-7 xfn-host-6 xfn-host-5 xfn-host-4 xfn-host-3 \
        xfn-host-2 xfn-host-1 crossplane-core resolver kube-controller-manager kube-apiserver etcd; do
        stop "$name"
    done
}

down() {
    [ -d "$run" ] || return 0
    [ -d "$run/pid" ] && down_processes
    rm -rf "$run"
    log "down"
}

case ${1:-} in
build) build ;;
up) up ;;
down) down ;;
host) host "${2:-}" "${3:-}" ;;
resolve) resolve ;;
env) echo "export KUBECONFIG=$run/admin.kubeconfig PATH=$bin:\$PATH" ;;
*) die "usage: $0 build|up|down|host start|stop|kill N|env" ;;
esac
