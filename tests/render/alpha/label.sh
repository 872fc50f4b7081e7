#!/bin/sh
# Alpha function: labels every desired resource team=platform; passes the
# rest of the desired state and the results on.
set -e
IN=$(cat)
echo "desired:"
echo "$IN" | yamlsec desired | sed 's/^        labels:$/        labels:\n          team: platform/'
echo "results:"
echo "$IN" | yamlsec results
