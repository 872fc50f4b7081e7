#!/bin/sh
# Exec function: labels every desired resource team=platform; passes the
# context on.
set -e
IN=$(cat)
DESIRED=$(echo "$IN" | jget desired)
CONTEXT=$(echo "$IN" | jget context) && CONTEXT=",\"context\":$CONTEXT" || CONTEXT=""
echo "{\"desired\":$DESIRED$CONTEXT}" | sed 's/"metadata":{/"metadata":{"labels":{"team":"platform"},/g; s/"labels":{"team":"platform"},}/"labels":{"team":"platform"}}/g'
