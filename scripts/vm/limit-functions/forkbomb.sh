#!/bin/sh
# Forks without end: sleepers in the background until a fork fails (the
# shell then gives up) or the run is killed.
cat >/dev/null
while :; do
	sleep 600 &
done
