#!/bin/sh
# Exec function: marks bucket-0 ready and adds `readied` to the context.
set -e
IN=$(cat)
DESIRED=$(echo "$IN" | jget desired)
CONTEXT=$(echo "$IN" | jget context || echo '{}')
INNER=${CONTEXT#\{}
INNER=${INNER%\}}
DESIRED=$(echo "$DESIRED" | sed 's/"bucket-0":{/"bucket-0":{"ready":"READY_TRUE",/')
printf '{"desired":%s,"context":{%s%s"readied":"bucket-0"}}\n' "$DESIRED" "$INNER" "${INNER:+,}"
