#!/usr/bin/env bash
# The peers xfn is checked against, built from the Go module proxy at pinned
# versions into a cache (default /var/cache/xfn-test/peers, or
# $XFN_TEST_PEERS_DIR): the `crossplane` CLI, xprin, and Crossplane's
# composition functions. Nothing of theirs is in this repository: each enters
# by module path and version only (`go mod download`), and is built from its
# module zip with the module's own go.mod/go.sum (`go build` in the module's
# directory: `go install module/cmd@version` would do the same, but it first
# asks the proxy for the module's version list to look for a deprecation,
# which the proxy here refuses for every one of these modules).
#
# Each function is kept as what a test needs to run it natively
# (`Development` runtime) and to make its image (`Docker` runtime) in the
# test's own registry (testkit's `peers` module): under functions/NAME/,
#   function      the static binary (CGO_ENABLED=0, as its Dockerfile builds it)
#   package.yaml  package/crossplane.yaml and package/input/*.yaml, one YAML
#                 stream, as `crossplane xpkg build` makes the metadata layer
#   example/      the module's example/ (or examples/) directory: the inputs
#                 its README gives `crossplane render`
#   VERSION       module@version, written last: a second run is a no-op.
# A module the proxy does not serve is named on stderr and in NOT-SERVED (the
# tests that need it fail naming this script); the script still exits 0, so
# that setup goes on. Any other failure stops it.
#
# Idempotent; GOMODCACHE, GOCACHE and the binaries all live in the cache.
set -euo pipefail

# name                          module                                                   version  main package
PEERS="
crossplane                      github.com/crossplane/cli/v2                              v2.5.0   ./cmd/crossplane
crossplane-core                 github.com/crossplane/crossplane/v2                       v2.3.4   ./cmd/crossplane
xprin                           github.com/crossplane-contrib/xprin                       v0.2.0   ./cmd/xprin
function-patch-and-transform    github.com/crossplane-contrib/function-patch-and-transform v0.10.7 .
function-go-templating          github.com/crossplane-contrib/function-go-templating      v0.12.2  .
function-auto-ready             github.com/crossplane/function-auto-ready                 v0.7.0   .
function-environment-configs    github.com/crossplane-contrib/function-environment-configs v0.7.1  .
function-extra-resources        github.com/crossplane-contrib/function-extra-resources    v0.3.0   .
"
# `crossplane render` (CLI 2.x) runs Crossplane's own render engine,
# `crossplane internal render` of the core binary, in Docker or, with
# `--crossplane-binary`, from a local one: crossplane-core is that binary, at
# the core's latest stable release (the CLI's default image tag `stable`).
# The versions are each repository's latest release tag on 2026-11-29 (the
# CLI's latest 2.x), but for function-patch-and-transform: its v0.10.8 is not
# served; v0.10.7 is the newest that is. function-go-templating (v0.12.2 to
# v0.11.9 tried) and function-auto-ready (module
# github.com/crossplane/function-auto-ready, v0.7.0 to v0.6.5 tried) are not
# served at all that day.

cache=${XFN_TEST_PEERS_DIR:-/var/cache/xfn-test/peers}
# The Go of the machine image (a tarball's /usr/local/go) when not on PATH.
command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || { echo "peers: go not found: install Go (1.26) first" >&2; exit 1; }
mkdir -p "$cache/bin" "$cache/functions"
# One run at a time (setup in two shells): the second waits, then finds all built.
exec 9>"$cache/.lock"
flock 9
export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" CGO_ENABLED=0
not_served=()
built=0

# fetch MODULE VERSION: the module's directory in GOMODCACHE on stdout; an
# empty line when the proxy does not serve it.
fetch() {
    local out
    if out=$(timeout 600 go mod download -json "$1@$2" 2>&1); then
        sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$out"
    elif grep -q 'not available\|404 Not Found\|410 Gone\|403 Forbidden' <<<"$out"; then
        echo
    else
        echo "peers: go mod download $1@$2 failed:" >&2
        echo "$out" >&2
        return 1
    fi
}

while read -r name module version main; do
    [ -n "$name" ] || continue
    case $name in
    function-*) dest="$cache/functions/$name" binary="$dest/function" ;;
    *) dest="$cache/bin" binary="$cache/bin/$name" ;;
    esac
    stamp="$dest/VERSION"
    [ "$dest" = "$cache/bin" ] && stamp="$cache/bin/$name.version"
    if [ -x "$binary" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$module@$version" ]; then
        continue
    fi
    dir=$(fetch "$module" "$version")
    if [ -z "$dir" ]; then
        echo "peers: NOT SERVED by the Go module proxy: $module@$version ($name); a test that needs it fails naming this script" >&2
        not_served+=("$name $module@$version")
        continue
    fi
    echo "peers: building $name ($module@$version)" >&2
    start=$SECONDS
    rm -f "$stamp"
    mkdir -p "$dest"
    # A module zip leaves out its nested modules: a `replace` of one by its
    # directory (Crossplane's core: `apis/v2 => ./apis`) becomes a
    # requirement of the nested module at the same version, in a writable
    # copy of the module.
    mode=readonly
    if grep -Eq '=> \./' "$dir/go.mod"; then
        mode=mod
        rm -rf "$cache/src/$name" && mkdir -p "$cache/src" && cp -r "$dir" "$cache/src/$name"
        dir="$cache/src/$name" && chmod -R u+w "$dir"
        while read -r path target; do
            [ -e "$dir/$target" ] || (cd "$dir" && go mod edit -dropreplace="$path" -require="$path@$version")
        done < <(sed -En 's/^(replace)?[[:space:]]*([^[:space:]]+)[[:space:]]+=>[[:space:]]+(\.\/[^[:space:]]*)[[:space:]]*$/\2 \3/p' "$dir/go.mod")
    fi
    (cd "$dir" && GOFLAGS="-mod=$mode -trimpath" timeout 1800 go build -o "$binary.tmp" "$main" >"$cache/$name.log" 2>&1) || {
        echo "peers: go build of $name failed:" >&2
        grep -v '^go: downloading' "$cache/$name.log" >&2
        exit 1
    }
    mv "$binary.tmp" "$binary"
    if [ "$dest" != "$cache/bin" ]; then
        rm -rf "$dest/example" "$dest/package.yaml"
        for sub in example examples; do
            [ -d "$dir/$sub" ] && cp -r "$dir/$sub" "$dest/example"
        done
        chmod -R u+w "$dest/example"
        # The package's metadata layer: crossplane.yaml first, then its input CRDs.
        for f in "$dir/package/crossplane.yaml" $(find "$dir/package" -name '*.yaml' ! -path "$dir/package/crossplane.yaml" | sort); do
            case $(head -c 3 "$f") in ---) ;; *) echo "---" ;; esac
            cat "$f"
        done >"$dest/package.yaml"
    fi
    echo "$module@$version" >"$stamp"
    built=1
    echo "peers: built $name in $((SECONDS - start)) s" >&2
done <<<"$PEERS"

# h2spec, the HTTP/2 conformance suite xfn's own HTTP/2 server
# (src/grpc/http2.rs) is held to (tests/server_http2.rs). Its module has no
# go.mod (`+incompatible`), so it is built by `go install` from the proxy.
h2spec_version=v2.2.1+incompatible
if ! [ -x "$cache/bin/h2spec" ] || [ "$(cat "$cache/bin/h2spec.version" 2>/dev/null)" != "$h2spec_version" ]; then
    echo "peers: building h2spec (github.com/summerwind/h2spec@$h2spec_version)" >&2
    mkdir -p "$cache/bin"
    GOBIN="$cache/bin" GOFLAGS=-trimpath timeout 900 go install "github.com/summerwind/h2spec/cmd/h2spec@$h2spec_version"
    echo "$h2spec_version" >"$cache/bin/h2spec.version"
    built=1
fi

# The client shaped as Crossplane core dials a Function (tests/peers/dial:
# xfn's own test code, not a peer's), built beside the peers from the same
# module cache; stamped with its sources' hash.
dial_src="$(cd "$(dirname "$0")/.." && pwd)/tests/peers/dial"
dial_stamp=$(cat "$dial_src/go.mod" "$dial_src/go.sum" "$dial_src"/*.go | sha256sum | cut -c1-16)
if ! [ -x "$cache/bin/core-dial" ] || [ "$(cat "$cache/bin/core-dial.version" 2>/dev/null)" != "$dial_stamp" ]; then
    echo "peers: building core-dial (tests/peers/dial)" >&2
    (cd "$dial_src" && GOFLAGS="-mod=readonly -trimpath" timeout 1800 go build -o "$cache/bin/core-dial.tmp" . >"$cache/core-dial.log" 2>&1) || {
        echo "peers: go build of tests/peers/dial failed:" >&2
        grep -v '^go: downloading' "$cache/core-dial.log" >&2
        exit 1
    }
    mv "$cache/bin/core-dial.tmp" "$cache/bin/core-dial"
    echo "$dial_stamp" >"$cache/bin/core-dial.version"
    built=1
fi

# The build cache (~4 GB) only speeds up a rebuild of the same modules,
# which the stamps make unneeded: dropped; the module cache (~4 GB, the
# downloads) is kept for a version bump.
((built == 0)) || go clean -cache
if ((${#not_served[@]})); then
    printf '%s\n' "${not_served[@]}" >"$cache/NOT-SERVED"
else
    rm -f "$cache/NOT-SERVED"
fi
