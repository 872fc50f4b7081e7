#!/bin/sh
# Alpha function: one ConfigMap per spec.count of the XR (bucket-0, ...)
# appended to the desired resources; passes results on and adds one.
set -e
IN=$(cat)
COUNT=$(echo "$IN" | yamlsec observed | yamlsec composite 2 | yamlsec resource 4 | yamlsec spec 6 | sed -n 's/^ *count: //p')
EXISTING=$(echo "$IN" | yamlsec desired | yamlsec resources 2)
RESULTS=$(echo "$IN" | yamlsec results)
echo "desired:"
echo "  resources:"
[ -z "$EXISTING" ] || echo "$EXISTING"
i=0
while [ "$i" -lt "$COUNT" ]; do
  printf '  - name: bucket-%s\n    resource:\n      apiVersion: v1\n      kind: ConfigMap\n      metadata:\n        labels:\n          created-by: xfn\n      data:\n        index: "%s"\n' "$i" "$i"
  i=$((i + 1))
done
echo "results:"
[ -z "$RESULTS" ] || echo "$RESULTS"
printf -- '- severity: Normal\n  message: created %s buckets\n' "$COUNT"
