#!/bin/sh
# The long soak: tests/server_soak.rs at bench size against the release
# build. `xfn start` with its default flags, as uid 65532 without
# capabilities, real crun, one cached busybox `cat` function; CALLS calls
# (default 10,000) from CALLERS concurrent callers (default 32), a
# connection each, as Crossplane's runner client dials per call. Every call
# must succeed; afterwards the test checks that nothing leaked (zombies,
# fds and threads of the daemon and its gatekeeper, bundles, crun state,
# rootfs dirs, tmp/, mounts, stray processes, RSS), allowing exactly what
# the warm containers alive at that moment hold. It prints calls/s, p50 and
# p99 latency (queueing included: 32 callers share the CPU count of run
# slots), RSS of the daemon and the gatekeeper before and after, fds,
# threads and warm containers before and after.
#
# Needs what `cargo test` needs (scripts/setup.sh). Run as root from the
# repository root:
#   benches/soak.sh                        (10,000 calls, release build)
#   CALLS=100000 CALLERS=64 benches/soak.sh
#   PROFILE=dev benches/soak.sh            (debug build)
set -eu
cd "$(dirname "$0")/.."

CALLS=${CALLS:-10000}
CALLERS=${CALLERS:-32}
PROFILE=${PROFILE:-release}
LOG=$(mktemp /tmp/xfn-soak-XXXXXX.log)

echo "xfn build profile: $PROFILE; CPUs: $(nproc); $CALLS calls from $CALLERS callers; xfn start with default flags"
if XFN_SOAK_CALLS=$CALLS XFN_SOAK_CALLERS=$CALLERS \
    cargo test --quiet --profile "$PROFILE" --test server -- server_soak:: --nocapture >"$LOG" 2>&1; then
    grep '^soak:' "$LOG"
    rm -f "$LOG"
else
    cat "$LOG" >&2
    echo "the soak failed; its log: $LOG" >&2
    exit 1
fi
