#!/bin/sh
# Alpha function: passes desired state and results on and adds a Warning, or
# a Fatal when its config has `fatal: MESSAGE`.
set -e
IN=$(cat)
FATAL=$(echo "$IN" | yamlsec config | sed -n 's/^  fatal: //p')
echo "desired:"
echo "$IN" | yamlsec desired
echo "results:"
echo "$IN" | yamlsec results
if [ -n "$FATAL" ]; then
  printf -- '- severity: Fatal\n  message: %s\n' "$FATAL"
else
  printf -- '- severity: Warning\n  message: almost out of buckets\n'
fi
