# xfn-level checks, sourced by guest-checks.sh (as the unprivileged user, in
# the VM) when an xfn binary was given. The image comes from the VM's own
# docker-registry on 127.0.0.1:5000, serving the storage xfn-image.sh made on
# the host; /opt/xfn/functionio.yaml is example/functionio.yaml.
# shellcheck shell=sh

XFN_IMAGE=127.0.0.1:5000/example/add-bucket:v1

start_registry() {
	cp -r /opt/xfn/registry "$HOME/registry"
	cat >"$HOME/registry.yml" <<EOF
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $HOME/registry}}
http: {addr: 127.0.0.1:5000}
EOF
	docker-registry serve "$HOME/registry.yml" >"$HOME/registry.log" 2>&1 &
	registry_pid=$!
	deadline=$(($(date +%s) + 30))
	while [ "$(date +%s)" -le "$deadline" ]; do
		wget -q -O /dev/null http://127.0.0.1:5000/v2/ 2>/dev/null && return 0
		sleep 0.2
	done
	echo "xfn: registry did not start: $(cat "$HOME/registry.log")"
	return 1
}

# xfn_in_leaf ARGS...: runs xfn in a fresh leaf cgroup of its own under the
# delegated subtree, as a service would start it. xfn moves itself into
# <leaf>/supervisor and runs functions in <leaf>/xfn-run-*; afterwards
# $leftover lists run cgroups xfn left behind (there must be none), and the
# leaf is removed.
xfn_in_leaf() {
	xfn_leaves=$((${xfn_leaves:-0} + 1))
	leaf=$CG_ROOT$CGROUP_BASE/xfn-$xfn_leaves
	mkdir "$leaf" || return 1
	# shellcheck disable=SC2016 # expanded by the inner shell
	timeout 300 sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$leaf" "$XFN_BIN" "$@"
	rc=$?
	remove_leaf "$leaf"
	return "$rc"
}

# remove_leaf LEAF: sets $leftover to the run cgroups xfn left in LEAF,
# kills and removes them, then removes LEAF.
remove_leaf() {
	leftover=""
	for run in "$1"/xfn-run-*; do
		[ -d "$run" ] || continue
		leftover="$leftover$(basename "$run") "
		echo 1 >"$run/cgroup.kill"
		sleep 0.5
		rmdir "$run"/* "$run" 2>/dev/null
	done
	rmdir "$1/supervisor" "$1" 2>/dev/null
}

# xfn run of the example function: the whole xfn stack (pull from a
# registry, unpack, user namespace, crun) on a pure cgroup v2 kernel.
check_xfn_run() {
	# Only IMAGE and INPUT: the CLI's flags are still moving; the cache goes
	# to XFN_CACHE_DIR where xfn reads it, else its default under $HOME.
	out=$(XFN_CACHE_DIR=$HOME/xfn-cache xfn_in_leaf run "$XFN_IMAGE" /opt/xfn/functionio.yaml \
		2>"$HOME/xfn-run.err")
	rc=$?
	echo "xfn: run exit=$rc stderr=[$(tail -n 5 "$HOME/xfn-run.err" | tr '\n' ' ')]"
	echo "xfn: run output names: $(echo "$out" | grep 'name:' | tr -s ' \n' ' ')"
	if [ "$rc" = 0 ] && echo "$out" | grep -q 'kind: Bucket'; then
		check xfn-run PASS "exit=0 output-has=kind:_Bucket"
	else
		check xfn-run FAIL "exit=$rc output=$(echo "$out" | head -c 200 | tr '\n ' '|_')"
	fi
}

LIMITS_IMAGE=127.0.0.1:5000/example/limits

# xfn_limited NAME ARGS...: `xfn run --require-limits ARGS` in its own leaf
# with JSON logs; stdout to $HOME/NAME.out, logs to $HOME/NAME.err. Sets rc,
# $cpu_usec, $oom_kills and $pids_hits from xfn's "function run used" line,
# and $error (xfn's last error line).
xfn_limited() {
	name=$1
	shift
	XFN_CACHE_DIR=$HOME/xfn-cache xfn_in_leaf --log-format json run --require-limits "$@" \
		>"$HOME/$name.out" 2>"$HOME/$name.err"
	rc=$?
	used=$(grep '"function run used"' "$HOME/$name.err" | tail -n 1)
	cpu_usec=$(echo "$used" | sed -n 's/.*"cpu_usec":\([0-9]*\).*/\1/p')
	oom_kills=$(echo "$used" | sed -n 's/.*"oom_kills":\([0-9]*\).*/\1/p')
	pids_hits=$(echo "$used" | sed -n 's/.*"pids_limit_hits":\([0-9]*\).*/\1/p')
	peak=$(echo "$used" | sed -n 's/.*"memory_peak_bytes":\([0-9]*\).*/\1/p')
	error=$(grep -v '^{' "$HOME/$name.err" | tail -n 1)
	echo "xfn: $name exit=$rc used=[$used] error=[$error] leftover=[$leftover]"
}

# Within limits: the example function under 100m/32Mi/64 pids answers
# exactly what it answers anywhere.
check_xfn_within_limits() {
	xfn_limited within --cpu 100m --memory 32Mi --pids-limit 64 "$XFN_IMAGE" /opt/xfn/functionio.yaml
	value="exit=$rc cpu_usec=${cpu_usec:-missing} memory_peak_bytes=${peak:-missing} leftover=[${leftover}]"
	if [ "$rc" = 0 ] && cmp -s "$HOME/within.out" /opt/xfn/expected-output.yaml &&
		[ -n "$cpu_usec" ] && [ -z "$leftover" ]; then
		check xfn-within-limits PASS "$value output=expected"
	else
		echo "xfn: within-limits output: $(head -c 300 "$HOME/within.out" | tr '\n' '|')"
		check xfn-within-limits FAIL "$value"
	fi
}

# Memory: 64 MiB held under a 32Mi limit; the error names the limit, and
# the next run (same cache, same delegated subtree) still succeeds.
check_xfn_oom() {
	xfn_limited oom --memory 32Mi "$LIMITS_IMAGE:oom" /opt/xfn/functionio.yaml
	oom_rc=$rc oom_error=$error oom_leftover=$leftover oom_killed=$oom_kills oom_peak=$peak
	xfn_limited after-oom --memory 32Mi "$XFN_IMAGE" /opt/xfn/functionio.yaml
	value="exit=$oom_rc oom_kills=${oom_killed:-missing} memory_peak_bytes=${oom_peak:-missing} next-run-exit=$rc leftover=[${oom_leftover}${leftover}] error=$(echo "$oom_error" | cut -c1-160 | tr ' ' '_')"
	if [ "$oom_rc" != 0 ] && echo "$oom_error" | grep -q 'exceeded its memory limit of 32Mi' &&
		[ "$rc" = 0 ] && cmp -s "$HOME/after-oom.out" /opt/xfn/expected-output.yaml &&
		[ -z "$oom_leftover$leftover" ]; then
		check xfn-oom PASS "$value"
	else
		check xfn-oom FAIL "$value"
	fi
}

# CPU: busy for 2 s of wall time under 100m; xfn's log line says how much
# CPU the run's cgroup used. That usage also holds what every run costs
# inside its cgroup before the function's code runs (crun's setup: mounts,
# the seccomp filter; the shell's start), a lot under TCG (0.1-0.3 s, itself
# throttled to 100m), so an identical run without the loop (idle.sh) is
# measured first and subtracted: the loop's share must be 10% of 2 s, +-50%.
check_xfn_cpu() {
	# The baseline is noisy (under TCG a busy host inflates guest CPU time):
	# the mean of two runs.
	xfn_limited idle --cpu 100m "$LIMITS_IMAGE:idle" /opt/xfn/functionio.yaml
	idle_rc=$rc idle1=${cpu_usec:-0} idle_leftover=$leftover
	xfn_limited idle --cpu 100m "$LIMITS_IMAGE:idle" /opt/xfn/functionio.yaml
	[ "$rc" = 0 ] || idle_rc=$rc
	idle_leftover=$idle_leftover$leftover
	idle_usec=$(((idle1 + ${cpu_usec:-0}) / 2))
	echo "xfn: cpu: idle runs used $idle1 and ${cpu_usec:-missing} usec"
	xfn_limited spin --cpu 100m "$LIMITS_IMAGE:spin" /opt/xfn/functionio.yaml
	wall=$(sed -n 's/^# spin: wall_usec=//p' "$HOME/spin.out")
	net=$((${cpu_usec:-0} - ${idle_usec:-0}))
	value="net_cpu_usec=$net spin_cpu_usec=${cpu_usec:-missing} idle_cpu_usec=${idle_usec:-missing} loop_wall_usec=${wall:-missing} expected=200000+-50% exit=$rc/$idle_rc leftover=[${idle_leftover}${leftover}]"
	if [ "$rc" = 0 ] && [ "$idle_rc" = 0 ] && [ -n "$cpu_usec" ] && [ "$idle1" -gt 0 ] &&
		[ "$net" -ge 100000 ] && [ "$net" -le 300000 ] && [ -z "$idle_leftover$leftover" ]; then
		check xfn-cpu PASS "$value"
	else
		check xfn-cpu FAIL "$value"
	fi
}

# pids: a fork loop under --pids-limit 32 fails (the shell gives up when a
# fork is refused, or the timeout kills it); nothing is left: no run cgroup,
# no sleeper.
check_xfn_pids() {
	xfn_limited forkbomb --pids-limit 32 --timeout 30s "$LIMITS_IMAGE:forkbomb" /opt/xfn/functionio.yaml
	sleepers=$(pgrep -f 'sleep 600' | wc -l)
	value="exit=$rc pids_limit_hits=${pids_hits:-missing} sleepers-left=$sleepers leftover=[${leftover}] error=$(echo "$error" | cut -c1-160 | tr ' ' '_')"
	# The refusal shows as the shell's "can't fork" in the error (stderr
	# tail). pids.events counts it in the container's own cgroup, which crun
	# has removed; the run cgroup's counts it too only on kernels whose
	# pids.events is hierarchical (6.12+?), so either proves the limit.
	refused=no
	if [ "${pids_hits:-0}" -ge 1 ] || grep -q "can't fork\|Resource temporarily unavailable" "$HOME/forkbomb.err"; then
		refused=yes
	fi
	value="$value refused=$refused"
	if [ "$rc" != 0 ] && [ "$refused" = yes ] && [ "$sleepers" = 0 ] && [ -z "$leftover" ]; then
		check xfn-pids PASS "$value"
	else
		check xfn-pids FAIL "$value"
	fi
}

# Timeout: a run killed at its timeout leaves no run cgroup and no process.
check_xfn_timeout_cleanup() {
	xfn_limited timeout --cpu 100m --timeout 1s "$LIMITS_IMAGE:spin" /opt/xfn/functionio.yaml
	spinners=$(pgrep -f '/spin.sh' | wc -l)
	value="exit=$rc spinners-left=$spinners leftover=[${leftover}] error=$(echo "$error" | cut -c1-120 | tr ' ' '_')"
	if [ "$rc" != 0 ] && echo "$error" | grep -q 'timed out' && [ "$spinners" = 0 ] && [ -z "$leftover" ]; then
		check xfn-timeout-cleanup PASS "$value"
	else
		check xfn-timeout-cleanup FAIL "$value"
	fi
}

# Restart: an xfn killed (SIGKILL) mid-run leaves its run cgroup with the
# container in it; the next xfn started by whatever restarts it (a wrapper
# that shared xfn's cgroup, which the first xfn moved into its supervisor
# leaf with itself) kills it and removes the cgroup before serving. (A
# restart by systemd or the kubelet gets a fresh cgroup instead: they kill
# the whole old subtree.)
check_xfn_stale_swept() {
	xfn_leaves=$((${xfn_leaves:-0} + 1))
	leaf=$CG_ROOT$CGROUP_BASE/xfn-$xfn_leaves
	mkdir "$leaf" || { check xfn-stale-swept FAIL "cannot-create-leaf"; return; }
	# shellcheck disable=SC2016 # expanded by the inner shell
	XFN_CACHE_DIR=$HOME/xfn-cache sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$leaf" \
		"$XFN_BIN" run --cpu 100m --timeout 300s "$LIMITS_IMAGE:hang" /opt/xfn/functionio.yaml \
		>/dev/null 2>"$HOME/stale-first.err" &
	first=$!
	stale=""
	i=0
	while [ -z "$stale" ] && [ "$i" -lt 600 ]; do
		for run in "$leaf"/xfn-run-*; do
			# (cgroup files have no size: read them)
			[ -n "$(cat "$run/container/cgroup.procs" 2>/dev/null)" ] && stale=$run
		done
		sleep 0.2
		i=$((i + 1))
	done
	kill -9 "$first"
	wait "$first" 2>/dev/null
	if [ -z "$stale" ]; then
		echo "xfn: stale: the first run never started: $(tail -n 3 "$HOME/stale-first.err" | tr '\n' ' ')"
		remove_leaf "$leaf"
		check xfn-stale-swept FAIL "first-run-never-started"
		return
	fi
	before=$(wc -l <"$stale/container/cgroup.procs")
	# shellcheck disable=SC2016 # expanded by the inner shell
	XFN_CACHE_DIR=$HOME/xfn-cache timeout 300 sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$leaf/supervisor" \
		"$XFN_BIN" --log-format json run --require-limits "$XFN_IMAGE" /opt/xfn/functionio.yaml \
		>"$HOME/stale-second.out" 2>"$HOME/stale-second.err"
	rc=$?
	swept=yes
	[ -d "$stale" ] && swept=no
	hangers=$(pgrep -f 'sleep 3600' | wc -l)
	said=$(grep -c 'left by an earlier xfn' "$HOME/stale-second.err")
	remove_leaf "$leaf"
	value="stale=$(basename "$stale") procs-before=$before swept=$swept hangers-left=$hangers log-lines=$said next-run-exit=$rc leftover=[$leftover]"
	echo "xfn: stale: $value second-xfn-stderr=[$(grep -v '"function run used"' "$HOME/stale-second.err" | tail -n 4 | tr '\n' ' ')]"
	if [ "$swept" = yes ] && [ "$hangers" = 0 ] && [ "$rc" = 0 ] && [ -z "$leftover" ] &&
		cmp -s "$HOME/stale-second.out" /opt/xfn/expected-output.yaml; then
		check xfn-stale-swept PASS "$value"
	else
		check xfn-stale-swept FAIL "$value"
	fi
}

# What crun wrote: the limits xfn put in the spec, as the kernel shows them
# in the container's cgroup while the function runs; then SIGTERM to xfn
# (the cancel path) must leave no run cgroup and no process.
check_xfn_limits_written() {
	xfn_leaves=$((${xfn_leaves:-0} + 1))
	leaf=$CG_ROOT$CGROUP_BASE/xfn-$xfn_leaves
	mkdir "$leaf" || { check xfn-limits-written FAIL "cannot-create-leaf"; return; }
	# shellcheck disable=SC2016 # expanded by the inner shell
	XFN_CACHE_DIR=$HOME/xfn-cache sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$leaf" \
		"$XFN_BIN" run --require-limits --cpu 100m --memory 32Mi --pids-limit 64 --timeout 300s \
		"$LIMITS_IMAGE:hang" /opt/xfn/functionio.yaml >/dev/null 2>"$HOME/written.err" &
	xfn_pid=$!
	container=""
	i=0
	while [ -z "$container" ] && [ "$i" -lt 600 ]; do
		for run in "$leaf"/xfn-run-*; do
			[ -n "$(cat "$run/container/cgroup.procs" 2>/dev/null)" ] && container=$run/container
		done
		sleep 0.2
		i=$((i + 1))
	done
	if [ -n "$container" ]; then
		written="cpu.max=$(tr ' ' / <"$container/cpu.max") memory.max=$(cat "$container/memory.max") memory.swap.max=$(cat "$container/memory.swap.max") pids.max=$(cat "$container/pids.max")"
	else
		written="container-never-started"
	fi
	kill -TERM "$xfn_pid"
	wait "$xfn_pid"
	rc=$?
	hangers=$(pgrep -f 'sleep 3600' | wc -l)
	remove_leaf "$leaf"
	value="$written xfn-exit-after-SIGTERM=$rc hangers-left=$hangers leftover=[$leftover]"
	echo "xfn: written: $value stderr=[$(tail -n 2 "$HOME/written.err" | tr '\n' ' ')]"
	if [ "$written" = "cpu.max=10000/100000 memory.max=33554432 memory.swap.max=0 pids.max=64" ] &&
		[ "$hangers" = 0 ] && [ -z "$leftover" ]; then
		check xfn-limits-written PASS "$value"
	else
		check xfn-limits-written FAIL "$value"
	fi
}

# xfn render with the Docker runtime (example/render/, docs/render.md's worked
# example): the function image served as a gRPC server in a container with
# its own run cgroup in the delegated subtree, called inside its network
# namespace, and gone afterwards, cgroup included.
check_xfn_render_docker() {
	sed "s|IMAGE|127.0.0.1:5000/example/function-server:v1|" \
		/opt/xfn/render/functions-docker.yaml >"$HOME/functions-docker.yaml"
	XFN_CACHE_DIR=$HOME/xfn-cache xfn_in_leaf render /opt/xfn/render/xr.yaml \
		/opt/xfn/render/composition.yaml "$HOME/functions-docker.yaml" -r \
		>"$HOME/render.out" 2>"$HOME/render.err"
	rc=$?
	hangers=$(cat /proc/[0-9]*/comm 2>/dev/null | grep -cx fn_server)
	value="exit=$rc same-as-expected=$(cmp -s "$HOME/render.out" /opt/xfn/render/expected.yaml && echo yes || echo no) servers-left=$hangers leftover=[$leftover]"
	echo "xfn: render-docker: $value stderr=[$(tail -n 3 "$HOME/render.err" | tr '\n' ' ')]"
	if [ "$rc" = 0 ] && cmp -s "$HOME/render.out" /opt/xfn/render/expected.yaml &&
		[ "$hangers" = 0 ] && [ -z "$leftover" ]; then
		check xfn-render-docker PASS "$value"
	else
		check xfn-render-docker FAIL "$value"
	fi
}

# xfn host with two Functions of the same package (the test function
# server, tests/fixtures/fn_server.rs): `big` limited to 64Mi by the
# DeploymentRuntimeConfig its runtimeConfigRef names, `other` under the
# defaults. A call that makes big's server hold 128 MiB gets it OOM-killed:
# the caller gets RESOURCE_EXHAUSTED naming the function and the limit;
# `other`, on the same host, still answers, and so does big's next call (a
# new server). Calls go through `xfn render`'s Development runtime, routed
# by the :authority host (--insecure), which /etc/hosts maps to 127.0.0.1.
# SIGTERM then leaves no run cgroup and no server.
check_xfn_host_oom() {
	cat >"$HOME/host-functions.yaml" <<EOF
apiVersion: pkg.crossplane.io/v1
kind: Function
metadata: {name: big}
spec:
  package: 127.0.0.1:5000/example/function-server:v1
  runtimeConfigRef: {apiVersion: pkg.crossplane.io/v1beta1, kind: DeploymentRuntimeConfig, name: small}
---
apiVersion: pkg.crossplane.io/v1
kind: Function
metadata: {name: other}
spec:
  package: 127.0.0.1:5000/example/function-server:v1
---
apiVersion: pkg.crossplane.io/v1beta1
kind: DeploymentRuntimeConfig
metadata: {name: small}
spec:
  deploymentTemplate:
    spec:
      selector: {}
      template:
        spec:
          containers:
            - name: package-runtime
              resources:
                limits: {memory: 64Mi}
EOF
	cat >"$HOME/host-render-functions.yaml" <<EOF
apiVersion: pkg.crossplane.io/v1
kind: Function
metadata:
  name: big
  annotations:
    render.crossplane.io/runtime: Development
    render.crossplane.io/runtime-development-target: dns:///big:9443
---
apiVersion: pkg.crossplane.io/v1
kind: Function
metadata:
  name: other
  annotations:
    render.crossplane.io/runtime: Development
    render.crossplane.io/runtime-development-target: dns:///other:9443
EOF
	host_composition big "action: allocate, mebibytes: 128" >"$HOME/host-big.yaml"
	host_composition big "action: allocate, mebibytes: 8" >"$HOME/host-big-small.yaml"
	host_composition other "action: create" >"$HOME/host-other.yaml"
	xfn_leaves=$((${xfn_leaves:-0} + 1))
	leaf=$CG_ROOT$CGROUP_BASE/xfn-$xfn_leaves
	mkdir "$leaf" || { check xfn-host-oom FAIL "cannot-create-leaf"; return; }
	# shellcheck disable=SC2016 # expanded by the inner shell
	XFN_CACHE_DIR=$HOME/xfn-cache sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$leaf" \
		"$XFN_BIN" --log-format json host --functions "$HOME/host-functions.yaml" --insecure \
		--address 127.0.0.1:9443 --require-limits >/dev/null 2>"$HOME/host.err" &
	host_pid=$!
	i=0
	while ! grep -q 'serving the function API' "$HOME/host.err" && [ "$i" -lt 600 ]; do
		sleep 0.2
		i=$((i + 1))
	done
	host_render big
	big_rc=$rc big_said=$said
	host_render other
	other_rc=$rc
	other_out=no
	grep -q 'bucket-0' "$HOME/host-other.out" && other_out=yes
	host_render big-small
	again_rc=$rc
	again_out=no
	# (render prints the XR, not the context the call answered with: its
	# exit 0 says the step's call succeeded)
	grep -q 'kind: XBucket' "$HOME/host-big-small.out" && again_out=yes
	kill -TERM "$host_pid"
	wait "$host_pid"
	host_rc=$?
	servers=$(cat /proc/[0-9]*/comm 2>/dev/null | grep -cx fn_server)
	remove_leaf "$leaf"
	enforced=$(grep -c 'cpu/memory/pids limits are enforced' "$HOME/host.err")
	value="big-exit=$big_rc other-exit=$other_rc other-output=$other_out big-again-exit=$again_rc big-again-output=$again_out host-exit-after-SIGTERM=$host_rc enforced-said=$enforced servers-left=$servers leftover=[$leftover] big-error=$(echo "$big_said" | cut -c1-220 | tr ' ' '_')"
	echo "xfn: host: $value host-stderr=[$(grep -v '"DEBUG"' "$HOME/host.err" | tail -n 4 | tr '\n' ' ')]"
	if [ "$big_rc" != 0 ] &&
		echo "$big_said" | grep -q 'ResourceExhausted: function big: its server was killed during the call: the function exceeded its memory limit of 64Mi' &&
		[ "$other_rc" = 0 ] && [ "$other_out" = yes ] && [ "$again_rc" = 0 ] && [ "$again_out" = yes ] &&
		[ "$host_rc" = 0 ] && [ "$enforced" -ge 1 ] && [ "$servers" = 0 ] && [ -z "$leftover" ]; then
		check xfn-host-oom PASS "$value"
	else
		echo "xfn: host: its warnings and errors: $(grep -E '"(WARN|ERROR)"' "$HOME/host.err" | tail -n 8 | tr '\n' ' ')"
		check xfn-host-oom FAIL "$value"
	fi
}

# host_composition FUNCTION INPUT: a one-step Pipeline Composition calling
# FUNCTION with the input fields INPUT.
host_composition() {
	cat <<EOF
apiVersion: apiextensions.crossplane.io/v1
kind: Composition
metadata: {name: host-$1}
spec:
  compositeTypeRef: {apiVersion: example.org/v1, kind: XBucket}
  mode: Pipeline
  pipeline:
  - step: one
    functionRef: {name: $1}
    input: {apiVersion: example.org/v1, kind: Input, $2}
EOF
}

# host_render NAME: renders the XR through $HOME/host-NAME.yaml with the
# host's functions; sets rc, and $said to the last line of its stderr.
host_render() {
	# A cold start of a debug build under TCG takes far longer than the
	# render's default minute.
	timeout 600 "$XFN_BIN" render --timeout 300s /opt/xfn/render/xr.yaml "$HOME/host-$1.yaml" \
		"$HOME/host-render-functions.yaml" >"$HOME/host-$1.out" 2>"$HOME/host-$1.err"
	rc=$?
	said=$(tail -n 1 "$HOME/host-$1.err")
	echo "xfn: host $1 exit=$rc stderr=[$(tail -n 5 "$HOME/host-$1.err" | tr '\n' ' ')]"
}

if start_registry; then
	run_check xfn-run
	run_check xfn-render-docker
	run_check xfn-host-oom
	for limit_check in xfn-within-limits xfn-oom xfn-cpu xfn-pids xfn-timeout-cleanup xfn-stale-swept xfn-limits-written; do
		run_check "$limit_check"
	done
	kill "$registry_pid" 2>/dev/null
else
	echo "EXPECT xfn-run"
	check xfn-run FAIL registry-did-not-start
fi
