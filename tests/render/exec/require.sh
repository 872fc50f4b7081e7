#!/bin/sh
# Exec function: requires ConfigMap `settings` (every call, as the caller
# re-runs a step until its requirements settle); once given, adds a
# ConfigMap `from-settings` with its data. Passes the context on.
set -e
IN=$(cat)
DESIRED=$(echo "$IN" | jget desired || echo '{}')
CONTEXT=$(echo "$IN" | jget context) && CONTEXT=",\"context\":$CONTEXT" || CONTEXT=""
REQUIREMENTS='"requirements":{"resources":{"settings":{"apiVersion":"v1","kind":"ConfigMap","matchName":"settings"}}}'
ITEMS=$(echo "$IN" | jget requiredResources | jget settings | jget items || true)
ITEM=${ITEMS#\[}
ITEM=${ITEM%\]}
if [ -n "$ITEM" ]; then
  DATA=$(echo "$ITEM" | jget resource | jget data)
  RESOURCES=$(echo "$DESIRED" | jget resources || echo '{}')
  INNER=${RESOURCES#\{}
  INNER=${INNER%\}}
  COMPOSITE=$(echo "$DESIRED" | jget composite) && COMPOSITE="\"composite\":$COMPOSITE," || COMPOSITE=""
  DESIRED="{$COMPOSITE\"resources\":{$INNER${INNER:+,}\"from-settings\":{\"resource\":{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{},\"data\":$DATA}}}}"
fi
printf '{"desired":%s,%s%s}\n' "$DESIRED" "$REQUIREMENTS" "$CONTEXT"
