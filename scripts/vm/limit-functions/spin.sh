#!/bin/sh
# Busy for 2 s of wall time (by /proc/uptime, read without forking), then
# answers its input unchanged plus a comment with the wall time it measured.
input=$(cat)
read_now() { # centiseconds of uptime
	read -r up _ </proc/uptime
	now=$((${up%.*} * 100 + 1${up#*.} - 100))
}
read_now
t0=$now
while [ "$now" -lt $((t0 + 200)) ]; do read_now; done
printf '%s\n' "$input"
echo "# spin: wall_usec=$(((now - t0) * 10000))"
