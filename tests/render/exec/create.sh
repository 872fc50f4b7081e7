#!/bin/sh
# Exec function: one ConfigMap per spec.count of the XR (bucket-0, ...),
# added to the desired resources so far; a Normal result; the context is
# passed on (as the SDKs' response.to does).
set -e
IN=$(cat)
COUNT=$(echo "$IN" | jget observed | jget composite | jget resource | jget spec | jget count)
COUNT=${COUNT%.0}
DESIRED=$(echo "$IN" | jget desired || echo '{}')
EXISTING=$(echo "$DESIRED" | jget resources || echo '{}')
EXISTING=${EXISTING#\{}
EXISTING=${EXISTING%\}}
R=$EXISTING
CONTEXT=$(echo "$IN" | jget context) && CONTEXT=",\"context\":$CONTEXT" || CONTEXT=""
i=0
while [ "$i" -lt "$COUNT" ]; do
  R="$R${R:+,}\"bucket-$i\":{\"resource\":{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{},\"data\":{\"index\":\"$i\"}}}"
  i=$((i + 1))
done
printf '{"desired":{"resources":{%s}},"results":[{"severity":"SEVERITY_NORMAL","message":"created %s buckets"}]%s}\n' "$R" "$COUNT" "$CONTEXT"
