#!/usr/bin/env bash
# The hostile-layer cases of tests/image_hostile.rs at docs/cache.md's sizes:
# a 64 MiB --max-image-size, --max-layer-entries 100000, bombs of gigabytes,
# headers of 300 MiB. `cargo test` runs the same cases small (an 8 MiB cap,
# 10,000 entries: the same properties at a fraction of the time a debug
# build takes to unpack 64 MiB); this is the run whose peak memory and
# bytes written docs/cache.md's bounds table quotes. One at a time, so each
# measurement has the machine to itself; prints one table row per case.
# Runs as root, as the tests do (they make a cache owned by uid 65532).
#
#   scripts/hostile.sh            # every case (about 15 minutes on 2 cores)
#   scripts/hostile.sh sparse     # the cases whose name contains "sparse"
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
status=0
# Test names as the `image` binary lists them (`image_hostile::…`).
XFN_HOSTILE_FULL=1 cargo test --test image -- --nocapture --test-threads=1 "${@:-image_hostile::}" \
    >"$out" 2>&1 || status=$?
echo "| case | outcome | cost |"
echo "|---|---|---|"
grep -oE '\| .* \|$' "$out" || true
grep -E '^test result|panicked|FAILED' "$out" || true
exit "$status"
