#!/bin/sh
# Holds 64 MiB at once: dd's one 64 MiB block, every page of it touched by
# read() from /dev/zero. Under a 32Mi limit the OOM killer ends it; exec, so
# the function's own process is the one killed.
cat >/dev/null
exec dd if=/dev/zero of=/dev/null bs=64M count=1
