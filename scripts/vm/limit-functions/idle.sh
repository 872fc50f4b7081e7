#!/bin/sh
# spin.sh without the busy loop: what a run of that shape costs in CPU
# besides the loop (crun's setup inside the cgroup, the shell, cat).
input=$(cat)
read -r up _ </proc/uptime
printf '%s\n' "$input"
echo "# idle: uptime=$up"
