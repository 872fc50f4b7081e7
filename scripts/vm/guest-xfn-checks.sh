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
# delegated subtree, as a service would start it.
xfn_in_leaf() {
	xfn_leaves=$((${xfn_leaves:-0} + 1))
	leaf=$CG_ROOT$CGROUP_BASE/xfn-$xfn_leaves
	mkdir "$leaf" || return 1
	# shellcheck disable=SC2016 # expanded by the inner shell
	timeout 300 sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$leaf" "$XFN_BIN" "$@"
	rc=$?
	rmdir "$leaf" 2>/dev/null
	return "$rc"
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

# Not a check yet (issue 5 makes it one): what xfn says today when asked to
# enforce limits on a host that has a delegated cgroup v2 subtree.
probe_xfn_limits() {
	if ! "$XFN_BIN" run --help 2>/dev/null | grep -q -- '--require-limits'; then
		echo "xfn: limits probe: this xfn has no --require-limits"
		return
	fi
	XFN_CACHE_DIR=$HOME/xfn-cache xfn_in_leaf run --require-limits --memory 32Mi --cpu 100m \
		"$XFN_IMAGE" /opt/xfn/functionio.yaml >/dev/null 2>"$HOME/xfn-limits.err"
	echo "xfn: limits probe (--require-limits --memory 32Mi --cpu 100m): exit=$? stderr=[$(tail -n 3 "$HOME/xfn-limits.err" | tr '\n' ' ')]"
}

if start_registry; then
	run_check xfn-run
	probe_xfn_limits
	kill "$registry_pid" 2>/dev/null
else
	echo "EXPECT xfn-run"
	check xfn-run FAIL registry-did-not-start
fi
