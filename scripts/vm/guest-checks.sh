#!/bin/sh
# The checks, run inside the VM as the unprivileged user that owns the
# delegated cgroup subtree $CGROUP_BASE. Each check runs a container with
# rootless crun (its own user namespace mapping only this user's id, the
# cgroupfs manager, limits from linux.resources), reads what the kernel
# measured in the container's cgroup, and prints one line:
#   CHECK <name> PASS|FAIL <measured value>
# The host side parses these lines; anything else is commentary.
set -u

CG_ROOT=/sys/fs/cgroup
ROOTFS=/opt/rootfs
BUNDLES=$HOME/bundles
STATE=$HOME/crun-state
# Rootless crun: its state under the user's home, cgroups by plain cgroupfs.
crun_() { crun --root="$STATE" --cgroup-manager=cgroupfs "$@"; }
MY_UID=$(id -u)
MY_GID=$(id -g)
: "${CGROUP_BASE:?}" "${XFN_BIN:=}"

mkdir -p "$BUNDLES" "$STATE"
echo "checks: uid=$MY_UID gid=$MY_GID started in cgroup $(cat /proc/self/cgroup)"

# As any Delegate=yes service must: leave the delegated cgroup for a leaf
# (no internal processes once controllers are enabled), then enable the
# controllers for the children crun creates. Moving needs write access to
# cgroup.procs of the common ancestor: the delegated cgroup, ours.
delegated=$CG_ROOT$CGROUP_BASE
mkdir "$delegated/checks" && echo $$ >"$delegated/checks/cgroup.procs" ||
	echo "checks: could not move into $CGROUP_BASE/checks"
echo "+cpu +memory +pids" >"$delegated/cgroup.subtree_control" ||
	echo "checks: could not enable controllers in $CGROUP_BASE"
echo "checks: now in $(cat /proc/self/cgroup), $CGROUP_BASE enables [$(cat "$delegated/cgroup.subtree_control")]"

check() { # NAME PASS|FAIL VALUE
	echo "CHECK $1 $2 $3"
}

# bundle NAME ARGS_JSON RESOURCES_JSON [MOUNT_JSON]: writes
# $BUNDLES/NAME/config.json.
bundle() {
	mkdir -p "$BUNDLES/$1"
	cat >"$BUNDLES/$1/config.json" <<EOF
{
  "ociVersion": "1.0.2",
  "process": {
    "terminal": false,
    "user": {"uid": 0, "gid": 0},
    "args": $2,
    "env": ["PATH=/bin:/sbin:/usr/bin", "HOME=/"],
    "cwd": "/",
    "noNewPrivileges": true
  },
  "root": {"path": "$ROOTFS", "readonly": true},
  "hostname": "check",
  "mounts": [
    {"destination": "/proc", "type": "proc", "source": "proc"},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
     "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
    {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
     "options": ["nosuid", "nodev", "mode=1777"]}${4:+,
    $4}
  ],
  "linux": {
    "uidMappings": [{"containerID": 0, "hostID": $MY_UID, "size": 1}],
    "gidMappings": [{"containerID": 0, "hostID": $MY_GID, "size": 1}],
    "namespaces": [{"type": "user"}, {"type": "pid"}, {"type": "mount"},
                   {"type": "ipc"}, {"type": "uts"}, {"type": "network"}],
    "cgroupsPath": "$CGROUP_BASE/$1",
    "resources": $3
  }
}
EOF
}

# start NAME: creates and starts the container in the background (stdout and
# stderr to files in its bundle). The cgroup outlives the container's
# processes until `crun delete`, so its counters can be read after they end.
start() {
	b=$BUNDLES/$1
	crun_ create --bundle "$b" "$1" >"$b/out" 2>"$b/err" || {
		echo "$1: crun create failed: $(cat "$b/err")"
		return 1
	}
	crun_ start "$1" 2>>"$b/err" || {
		echo "$1: crun start failed: $(cat "$b/err")"
		return 1
	}
}

# wait_stopped NAME SECONDS: polls crun state until the container stopped.
wait_stopped() {
	deadline=$(($(date +%s) + $2))
	while [ "$(date +%s)" -le "$deadline" ]; do
		crun_ state "$1" 2>/dev/null | grep -q '"status": *"stopped"' && return 0
		sleep 0.2
	done
	echo "$1: container still running after $2 s"
	return 1
}

# field FILE KEY: the value of "KEY value" in a flat-keyed cgroup file.
field() {
	awk -v k="$2" '$1 == k { print $2 }' "$1" 2>/dev/null
}

finish() { # NAME: deletes the container; its cgroup must be gone after.
	crun_ delete -f "$1" >/dev/null 2>&1
	if [ -d "$CG_ROOT$CGROUP_BASE/$1" ]; then
		echo "$1: cgroup $CGROUP_BASE/$1 left behind after crun delete"
		return 1
	fi
}

# 1. memory: 32 MiB limit, a process that holds 64 MiB is OOM-killed.
check_memory() {
	# dd's buffer is one 64 MiB block, filled by read() from /dev/zero: every
	# page of it is touched and charged. (A pipe into tail, which holds its
	# input too, also works but crawls along the limit for half a minute.)
	bundle memory '["sh", "-c", "dd if=/dev/zero of=/dev/null bs=64M count=1; echo dd-status=$?"]' \
		'{"memory": {"limit": 33554432}}'
	start memory || { check memory FAIL "container-did-not-start"; return; }
	wait_stopped memory 60
	cg=$CG_ROOT$CGROUP_BASE/memory
	max=$(cat "$cg/memory.max")
	oom_kill=$(field "$cg/memory.events" oom_kill)
	status=$(sed -n 's/^dd-status=//p' "$BUNDLES/memory/out")
	echo "memory: out=[$(tr '\n' ' ' <"$BUNDLES/memory/out")] err=[$(tr '\n' ' ' <"$BUNDLES/memory/err")]"
	echo "memory: memory.max=$max memory.events: $(tr '\n' ' ' <"$cg/memory.events")"
	finish memory || oom_kill="left-behind"
	if [ "$max" = 33554432 ] && [ "${oom_kill:-0}" -ge 1 ] 2>/dev/null; then
		check memory PASS "oom_kill=$oom_kill memory.max=$max dd-status=$status"
	else
		check memory FAIL "oom_kill=${oom_kill:-missing} memory.max=$max dd-status=$status"
	fi
}

# 2. cpu: cpu.max 10000/100000 (100m), a busy loop for 2 s of wall time must
# get about 10% of it. The cgroup's total usage also holds crun's setup and
# every exec (slow under TCG), so the loop measures itself, from inside and
# without forking: the container sees its cgroup through a read-only bind of
# the delegated subtree at /cg, and the loop script through /check.
# Two bounds: the kernel's guarantee (no more than the quota per elapsed
# period, plus two of slack) and the brief's 10% of wall time within
# +-50%. The lower bound depends on the host: under TCG the guest clock is the
# host's, so a host too busy to run the VM makes the loop get less.
check_cpu() {
	mkdir -p "$BUNDLES/cpu"
	cat >"$BUNDLES/cpu/busy.sh" <<'EOF'
read_stat() {
	while read -r key value; do
		case "$key" in
		usage_usec) usage=$value ;;
		nr_periods) periods=$value ;;
		nr_throttled) throttled=$value ;;
		esac
	done </cg/cpu/cpu.stat
}
read_now() { # centiseconds of uptime
	read -r up _ </proc/uptime
	now=$((${up%.*} * 100 + 1${up#*.} - 100))
}
read_now; t0=$now; read_stat; u0=$usage; p0=$periods; th0=$throttled
while [ "$now" -lt $((t0 + 200)) ]; do read_now; done
read_stat
echo "wall_usec=$(((now - t0) * 10000)) loop_usec=$((usage - u0)) periods=$((periods - p0)) throttled=$((throttled - th0))"
EOF
	bundle cpu '["sh", "/check/busy.sh"]' \
		'{"cpu": {"quota": 10000, "period": 100000}}' \
		"{\"destination\": \"/cg\", \"type\": \"bind\", \"source\": \"$CG_ROOT$CGROUP_BASE\", \"options\": [\"rbind\", \"ro\"]},
    {\"destination\": \"/check\", \"type\": \"bind\", \"source\": \"$BUNDLES/cpu\", \"options\": [\"rbind\", \"ro\"]}"
	start cpu || { check cpu FAIL "container-did-not-start"; return; }
	wait_stopped cpu 60
	cg=$CG_ROOT$CGROUP_BASE/cpu
	cpumax=$(cat "$cg/cpu.max")
	total=$(field "$cg/cpu.stat" usage_usec)
	result=$(cat "$BUNDLES/cpu/out")
	wall=$(echo "$result" | sed -n 's/.*wall_usec=\([0-9]*\).*/\1/p')
	loop=$(echo "$result" | sed -n 's/.*loop_usec=\([0-9]*\).*/\1/p')
	periods=$(echo "$result" | sed -n 's/.*periods=\([0-9]*\).*/\1/p')
	throttled=$(echo "$result" | sed -n 's/.*throttled=\([0-9]*\).*/\1/p')
	echo "cpu: cpu.max=[$cpumax] out=[$result] err=[$(tr '\n' ' ' <"$BUNDLES/cpu/err")] cpu.stat: $(tr '\n' ' ' <"$cg/cpu.stat")"
	finish cpu || loop="left-behind"
	expected=$((${wall:-0} / 10))
	# + 2: the runtime left when the loop starts and one slice in flight.
	ceiling=$(((${periods:-0} + 2) * 10000))
	value="loop_usec=${loop:-missing} wall_usec=${wall:-missing} expected=$expected ceiling=$ceiling periods=$periods throttled=$throttled cgroup_usage_usec=$total"
	if [ "$cpumax" = "10000 100000" ] && [ "$expected" -gt 0 ] &&
		[ "$loop" -le "$ceiling" ] 2>/dev/null &&
		[ "$loop" -ge $((expected / 2)) ] && [ "$loop" -le $((expected * 3 / 2)) ]; then
		check cpu PASS "$value"
	else
		check cpu FAIL "$value cpu.max=$cpumax"
	fi
}

# 3. pids: pids.max 16, a loop that spawns 40 sleepers cannot pass it, and
# nothing is left in the cgroup once the container's init has gone.
check_pids() {
	# shellcheck disable=SC2016 # expanded by the container's shell
	bundle pids '["sh", "-c", "i=0; while [ $i -lt 40 ]; do sleep 60 & echo spawned; i=$((i+1)); done"]' \
		'{"pids": {"limit": 16}}'
	start pids || { check pids FAIL "container-did-not-start"; return; }
	wait_stopped pids 60
	cg=$CG_ROOT$CGROUP_BASE/pids
	pmax=$(cat "$cg/pids.max")
	events_max=$(field "$cg/pids.events" max)
	peak=$(cat "$cg/pids.peak" 2>/dev/null || echo n/a)
	spawned=$(grep -c spawned "$BUNDLES/pids/out")
	# The kernel kills the rest of the PID namespace when its init exits;
	# give it a moment to finish.
	i=0
	while [ -n "$(cat "$cg/cgroup.procs")" ] && [ "$i" -lt 50 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	left=$(wc -l <"$cg/cgroup.procs")
	echo "pids: pids.max=$pmax pids.events: $(tr '\n' ' ' <"$cg/pids.events") pids.peak=$peak spawned=$spawned err=[$(tr '\n' ' ' <"$BUNDLES/pids/err")]"
	finish pids || left="left-behind"
	value="pids.events.max=${events_max:-missing} pids.peak=$peak spawned=$spawned left=$left"
	if [ "$pmax" = 16 ] && [ "${events_max:-0}" -ge 1 ] 2>/dev/null && [ "$spawned" -le 15 ] &&
		[ "$left" = 0 ] && { [ "$peak" = n/a ] || [ "$peak" -le 16 ]; }; then
		check pids PASS "$value"
	else
		check pids FAIL "$value"
	fi
}

# 4. within limits: a container under all three limits runs normally.
check_within_limits() {
	bundle hello '["echo", "hello"]' \
		'{"memory": {"limit": 33554432}, "cpu": {"quota": 10000, "period": 100000}, "pids": {"limit": 16}}'
	out=$(timeout 60 crun --root="$STATE" --cgroup-manager=cgroupfs run --bundle "$BUNDLES/hello" hello 2>"$BUNDLES/hello/err")
	rc=$?
	[ -s "$BUNDLES/hello/err" ] && echo "hello: err=[$(tr '\n' ' ' <"$BUNDLES/hello/err")]"
	if [ "$rc" = 0 ] && [ "$out" = hello ] && [ ! -d "$CG_ROOT$CGROUP_BASE/hello" ]; then
		check within-limits PASS "stdout=$out exit=$rc"
	else
		check within-limits FAIL "stdout=$out exit=$rc"
	fi
}

# 5. the xfn binary, when one was given, starts in the VM as this user (all
# its shared libraries made it into the initramfs).
check_xfn_starts() {
	version=$("$XFN_BIN" --version 2>&1)
	rc=$?
	if [ "$rc" = 0 ]; then
		check xfn-starts PASS "$(echo "$version" | head -n 1 | tr ' ' '_')"
	else
		check xfn-starts FAIL "exit=$rc $(echo "$version" | head -n 1 | tr ' ' '_')"
	fi
}

# run_check NAME: announces the check (the host fails an announced check
# that never reports), runs check_NAME (dashes as underscores) and says how
# long it took in guest time.
run_check() {
	echo "EXPECT $1"
	read -r t0 _ </proc/uptime
	"check_$(echo "$1" | tr - _)"
	read -r t1 _ </proc/uptime
	echo "timing: $1 took $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')s"
}

run_check within-limits
run_check memory
run_check cpu
run_check pids
if [ -n "$XFN_BIN" ]; then
	run_check xfn-starts
else
	echo "xfn: no binary given, xfn checks not run"
fi

# Extra checks (XFN_VM_EXTRA_CHECKS on the host): each file defines
# check_NAME functions and calls run_check NAME, with everything above
# (bundle, start, wait_stopped, field, finish, check) at hand.
for extra in /opt/checks/extra/*.sh; do
	[ -e "$extra" ] || continue
	echo "checks: sourcing $(basename "$extra")"
	# shellcheck source=/dev/null
	. "$extra"
done
