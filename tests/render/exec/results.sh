#!/bin/sh
# Exec function: passes the desired state on and returns a Warning, or a
# Fatal when its input says `fatal`; passes the context on.
set -e
IN=$(cat)
DESIRED=$(echo "$IN" | jget desired)
FATAL=$(echo "$IN" | jget input | jget fatal || true)
CONTEXT=$(echo "$IN" | jget context) && CONTEXT=",\"context\":$CONTEXT" || CONTEXT=""
if [ -n "$FATAL" ]; then
  printf '{"desired":%s,"results":[{"severity":"SEVERITY_FATAL","message":%s}]%s}\n' "$DESIRED" "$FATAL" "$CONTEXT"
else
  printf '{"desired":%s,"results":[{"severity":"SEVERITY_WARNING","message":"almost out of buckets"}]%s}\n' "$DESIRED" "$CONTEXT"
fi
