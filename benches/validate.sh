#!/bin/sh
# `xfn validate` on the whole validate corpus (tests/validate/: every set's
# extensions/ and its cases.yaml or rendered.yaml, and the original
# extensions/ with valid.yaml and invalid.yaml) against the same work done
# three other ways, side by side in one run:
#
#   xfn, one run        one `xfn validate` of every resource against every
#                       extension (the extensions comma-separated, the
#                       resources in one stream)
#   xfn, per case       one `xfn validate` per resource, same extensions
#   crossplane, one run `crossplane resource validate` (CLI v2.5.0, built by
#                       scripts/peers.sh), offline: a fresh --cache-dir,
#                       no Crossplane image
#   crossplane, per case
#
# Prints the wall time of each (median of RUNS, default 3), the per-case /
# one-run ratio of each tool and the crossplane / xfn ratio of each mode; no
# threshold. Exit codes are not compared here (tests/validate_peers.rs does
# that); every run must end 0 or 1 (a verdict), not in an error.
#
# XFN_BASE=PATH (an xfn built from an earlier commit) adds it side by side:
# each pass of each mode runs XFN_BASE then XFN, alternated, so both meet
# the same load; it prints both and XFN / XFN_BASE.
#
# Needs: the crossplane CLI (scripts/peers.sh; CROSSPLANE overrides it),
# python3. Run from the repo root:
#   cargo build && benches/validate.sh     (XFN=target/release/xfn for release)
set -eu

XFN=$(realpath "${XFN:-target/debug/xfn}")
XFN_BASE=${XFN_BASE:+$(realpath "$XFN_BASE")}
CROSSPLANE=${CROSSPLANE:-/var/cache/xfn-test/peers/bin/crossplane}
RUNS=${RUNS:-3}
DATA=$(realpath tests/validate)
[ -x "$XFN" ] || { echo "validate bench: no $XFN (cargo build first)" >&2; exit 1; }
[ -x "$CROSSPLANE" ] || {
    echo "validate bench: no $CROSSPLANE: run scripts/peers.sh (scripts/setup.sh runs it)" >&2
    exit 1
}
WORK=$(mktemp -d /tmp/xfn-validate-bench-XXXXXX)
trap 'rm -rf "$WORK"' EXIT INT TERM

# The corpus: extensions comma-separated, every resource one document of
# all.yaml and one file of cases/.
EXTENSIONS=$DATA/extensions
RESOURCES="$DATA/valid.yaml $DATA/invalid.yaml"
for set in "$DATA"/*/; do
    [ -d "$set/extensions" ] || continue
    EXTENSIONS="$EXTENSIONS,${set}extensions"
    for f in cases.yaml rendered.yaml; do
        [ -f "$set$f" ] && RESOURCES="$RESOURCES $set$f"
    done
done
mkdir "$WORK/cases"
# shellcheck disable=SC2086 # RESOURCES is a list of paths without spaces
python3 - "$WORK" $RESOURCES <<'EOF'
import sys, re
work, files = sys.argv[1], sys.argv[2:]
docs = []
for f in files:
    for doc in re.split(r"(?m)^---\s*$", open(f, encoding="utf-8").read()):
        if re.search(r"(?m)^\s*[{]?\s*\"?kind\"?\s*:", doc) or '"kind"' in doc:
            docs.append(doc.strip() + "\n")
with open(f"{work}/all.yaml", "w", encoding="utf-8") as out:
    out.write("---\n".join(docs))
for i, doc in enumerate(docs):
    with open(f"{work}/cases/{i:05}.yaml", "w", encoding="utf-8") as out:
        out.write(doc)
print(len(docs), file=open(f"{work}/count", "w"))
EOF
CASES=$(cat "$WORK/count")

# run TOOL RESOURCES: one validation, its exit code 0 or 1.
run() {
    set +e
    if [ "$1" = xfn ]; then
        "$XFN" validate "$EXTENSIONS" "$2" >/dev/null 2>"$WORK/err"
    elif [ "$1" = base ]; then
        "$XFN_BASE" validate "$EXTENSIONS" "$2" >/dev/null 2>"$WORK/err"
    else
        rm -rf "$WORK/cache"
        "$CROSSPLANE" resource validate --crossplane-image= --cache-dir "$WORK/cache" \
            "$EXTENSIONS" "$2" >/dev/null 2>"$WORK/err"
    fi
    code=$?
    set -e
    [ "$code" -le 1 ] || { echo "validate bench: $1 on $2 exited $code:" >&2; cat "$WORK/err" >&2; exit 1; }
}

# time_of TOOL MODE: the wall time of one pass, in seconds.
time_of() {
    start=$(date +%s.%N)
    if [ "$2" = one ]; then
        run "$1" "$WORK/all.yaml"
    else
        for case in "$WORK"/cases/*.yaml; do run "$1" "$case"; done
    fi
    end=$(date +%s.%N)
    echo "$end - $start" | bc
}

# median TOOL MODE: of RUNS passes.
median() {
    i=0
    while [ "$i" -lt "$RUNS" ]; do time_of "$1" "$2"; i=$((i + 1)); done |
        sort -n | awk '{ t[NR] = $1 } END { print t[int((NR + 1) / 2)] }'
}

# alternated MODE: "BASE_MEDIAN XFN_MEDIAN" of RUNS passes, base then xfn
# in each round.
alternated() {
    i=0
    : >"$WORK/rounds"
    while [ "$i" -lt "$RUNS" ]; do
        echo "$(time_of base "$1") $(time_of xfn "$1")" >>"$WORK/rounds"
        i=$((i + 1))
    done
    mid=$(((RUNS + 1) / 2))
    echo "$(cut -d' ' -f1 "$WORK/rounds" | sort -n | sed -n "${mid}p")" \
        "$(cut -d' ' -f2 "$WORK/rounds" | sort -n | sed -n "${mid}p")"
}

if [ -n "$XFN_BASE" ]; then
    echo "xfn base: $XFN_BASE; xfn: $XFN; $CASES resources; median of $RUNS alternated rounds; $(uptime)"
    printf '%-10s %12s %12s %14s\n' "" "base" "xfn" "xfn / base"
    for mode in one each; do
        set -- $(alternated "$mode")
        printf '%-10s %11.3fs %11.3fs %13.2fx\n' "$mode" "$1" "$2" "$(echo "$2 / $1" | bc -l)"
    done
fi

echo "validate corpus: $CASES resources, $(echo "$EXTENSIONS" | tr ',' '\n' | wc -l) extension sets; median of $RUNS"
echo "xfn: $XFN"
echo "crossplane: $CROSSPLANE ($(cat "$CROSSPLANE.version" 2>/dev/null || echo version unknown))"
XFN_ONE=$(median xfn one)
XFN_EACH=$(median xfn each)
CP_ONE=$(median crossplane one)
CP_EACH=$(median crossplane each)
printf '%-12s %12s %12s %16s\n' "" "one run" "per case" "per case / one"
printf '%-12s %11.3fs %11.3fs %15.1fx\n' xfn "$XFN_ONE" "$XFN_EACH" "$(echo "$XFN_EACH / $XFN_ONE" | bc -l)"
printf '%-12s %11.3fs %11.3fs %15.1fx\n' crossplane "$CP_ONE" "$CP_EACH" "$(echo "$CP_EACH / $CP_ONE" | bc -l)"
printf '%-12s %11.1fx %11.1fx\n' "crossplane / xfn" "$(echo "$CP_ONE / $XFN_ONE" | bc -l)" "$(echo "$CP_EACH / $XFN_EACH" | bc -l)"
