#!/usr/bin/env bash
# Proves cgroup v2 limits on a real, pure-v2 kernel: boots a small qemu VM
# (Debian's kernel, an initramfs built here), runs the checks in
# guest-checks.sh as an unprivileged user with a delegated cgroup subtree,
# and reports.
#
# Usage: scripts/vm/run-checks.sh [XFN_BINARY]
#   XFN_BINARY  optional; copied into the VM (with its shared libraries) and
#               checked there. Without it only the crun-level checks run.
# Environment:
#   XFN_VM_WORKDIR  cache for the kernel and build outputs (default target/vm)
#   XFN_VM_ACCEL    qemu accelerator (default tcg; kvm where /dev/kvm works)
#   XFN_VM_TIMEOUT  seconds before the VM is given up on (default 300, 600
#                   with an xfn binary)
#   XFN_VM_FUNCTION_SERVER
#                   a static tests/fixtures/fn_server.rs binary for the
#                   image of the render and host checks (default: built for
#                   release by xfn-image.sh)
#   XFN_VM_EXTRA_CHECKS, XFN_VM_INCLUDE, XFN_VM_BINARIES
#                   more guest checks and what they need: see
#                   build-initramfs.sh
#
# Prints one "CHECK <name> PASS|FAIL <value>" line per check, then
# "vmchecks: N passed, M failed". Exits non-zero if any check failed, none
# ran, or the VM did not finish.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
xfn_bin=${1:-}
work=${XFN_VM_WORKDIR:-$repo/target/vm}
accel=${XFN_VM_ACCEL:-tcg}
# xfn run under TCG (pull, unpack, crun) takes a minute or more with a debug
# build on a busy machine: more room when an xfn binary is given.
vm_timeout=${XFN_VM_TIMEOUT:-$([ -n "$xfn_bin" ] && echo 600 || echo 300)}

if [ -n "$xfn_bin" ]; then
	[ -x "$xfn_bin" ] || { echo "vmchecks: $xfn_bin is not an executable file" >&2; exit 2; }
	xfn_bin=$(readlink -f "$xfn_bin")
fi
mkdir -p "$work"
# One run at a time per work dir: the kernel, initramfs and log live there.
exec 9>"$work/lock"
flock 9

# 1. Host packages (checked, installed only when missing).
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
packages=(qemu-system-x86 busybox-static crun cpio util-linux binutils ca-certificates)
# The xfn-level checks' image is built and served with these.
[ -z "$xfn_bin" ] || packages+=(umoci skopeo docker-registry curl python3)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "vmchecks: installing ${missing[*]}" >&2
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. The guest kernel: Debian's, unpacked into the work dir, never installed
# as the host's. linux-image-amd64 is a metapackage; its one dependency is
# the versioned image package that holds vmlinuz, config and modules.
kernel_dir=$work/kernel
if ! compgen -G "$kernel_dir/boot/vmlinuz-*" >/dev/null; then
	rm -rf "$work/debs" "$kernel_dir"
	mkdir -p "$work/debs"
	(
		cd "$work/debs"
		apt-get download linux-image-amd64 2>/dev/null || {
			$sudo apt-get update -qq
			apt-get download linux-image-amd64
		}
		image_pkg=$(dpkg-deb -f linux-image-amd64_*.deb Depends | grep -o 'linux-image-[0-9][^ ,(]*-amd64' | head -n 1)
		[ -n "$image_pkg" ] || { echo "vmchecks: no linux-image dependency in linux-image-amd64" >&2; exit 1; }
		apt-get download "$image_pkg"
	) 2> >(grep -v "unsandboxed" >&2)
	image_debs=("$work"/debs/linux-image-[0-9]*.deb)
	dpkg-deb -x "${image_debs[0]}" "$kernel_dir"
	rm -rf "$work/debs"
fi
vmlinuzes=("$kernel_dir"/boot/vmlinuz-*)
vmlinuz=${vmlinuzes[0]}

# 3. With an xfn binary: the example function's image in registry storage
# the VM serves itself, the input, and the xfn-level checks.
if [ -n "$xfn_bin" ]; then
	"$here/xfn-image.sh" "$work/xfn-image"
	# The xfn host check dials its functions by name (the :authority routes
	# a call), resolved from /etc/hosts alone.
	printf '127.0.0.1 localhost big other\n' >"$work/hosts"
	printf 'hosts: files\n' >"$work/nsswitch.conf"
	export XFN_VM_INCLUDE="${XFN_VM_INCLUDE:-} $work/xfn-image/registry:/opt/xfn/registry $repo/example/functionio.yaml:/opt/xfn/functionio.yaml $work/xfn-image/expected-output.yaml:/opt/xfn/expected-output.yaml $repo/example/render:/opt/xfn/render $work/hosts:/etc/hosts $work/nsswitch.conf:/etc/nsswitch.conf"
	XFN_VM_BINARIES="${XFN_VM_BINARIES:-} /usr/bin/docker-registry:/usr/bin/docker-registry"
	export XFN_VM_BINARIES
	export XFN_VM_EXTRA_CHECKS="$here/guest-xfn-checks.sh ${XFN_VM_EXTRA_CHECKS:-}"
fi

# The initramfs, rebuilt every run (cheap; the xfn binary changes).
initramfs=$work/initramfs.gz
"$here/build-initramfs.sh" "$kernel_dir" "$initramfs" "$xfn_bin"

# 4. Boot. Serial console to a log; init powers off when the checks are done.
log=$work/console.log
cmdline="console=ttyS0 quiet panic=-1 systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all"
echo "vmchecks: booting $(basename "$vmlinuz") (accel=$accel, timeout ${vm_timeout}s, host load $(cut -d" " -f1-3 /proc/loadavg))" >&2
start=$(date +%s.%N)
set +e
timeout "$vm_timeout" qemu-system-x86_64 -accel "$accel" -m 1024 -smp 2 -nographic -no-reboot \
	-kernel "$vmlinuz" -initrd "$initramfs" -append "$cmdline" </dev/null >"$log" 2>&1
qemu_rc=$?
set -e
elapsed=$(awk -v a="$(date +%s.%N)" -v b="$start" 'BEGIN { printf "%.1f", a - b }')

# 5. Results.
tr -d '\r' <"$log" >"$log.clean"
grep -E '^(vm-init|checks|timing|memory|cpu|pids|hello|xfn):' "$log.clean" >&2 || true
checks=$(grep -E '^CHECK [^ ]+ (PASS|FAIL)( |$)' "$log.clean" || true)
[ -n "$checks" ] && echo "$checks"
passed=$(grep -c ' PASS' <<<"$checks" || true)
failed=$(grep -c ' FAIL' <<<"$checks" || true)
# A check that printed nothing (the guest script died half-way) is a failure:
# the built-in ones, and every other one the guest announced.
expected=(within-limits memory cpu pids)
[ -z "$xfn_bin" ] || expected+=(xfn-starts xfn-run xfn-within-limits xfn-oom xfn-cpu xfn-pids xfn-timeout-cleanup xfn-stale-swept xfn-limits-written)
mapfile -t -O "${#expected[@]}" expected < <(sed -n 's/^EXPECT \([^ ]*\)$/\1/p' "$log.clean")
for name in $(printf '%s\n' "${expected[@]}" | sort -u); do
	if ! grep -q "^CHECK $name " <<<"$checks"; then
		echo "CHECK $name FAIL did-not-report"
		failed=$((failed + 1))
	fi
done
done_line=$(grep -o 'VM-CHECKS-DONE uptime=[0-9.]*' "$log.clean" || true)
echo "vmchecks: qemu exited $qemu_rc after ${elapsed}s wall; guest ${done_line:-did not finish}" >&2

status=0
if [ -z "$done_line" ]; then
	echo "vmchecks: the VM did not finish; console log ($log):" >&2
	tail -n 60 "$log.clean" >&2
	status=1
elif [ -z "$checks" ]; then
	echo "vmchecks: no check ran; console log: $log" >&2
	status=1
elif [ "$failed" -gt 0 ]; then
	status=1
fi
echo "vmchecks: $passed passed, $failed failed"
exit "$status"
