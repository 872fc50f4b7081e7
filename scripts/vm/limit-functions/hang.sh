#!/bin/sh
# Runs until killed.
cat >/dev/null
exec sleep 3600
