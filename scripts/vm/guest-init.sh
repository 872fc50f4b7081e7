#!/bin/sh
# /init of the check VM (busybox sh, PID 1, root). It sets the machine up as a
# systemd host with a pure cgroup v2 hierarchy would, delegates a subtree to an
# unprivileged user (systemd's Delegate=yes), runs guest-checks.sh as that
# user, and powers off. It never exits on its own: PID 1 exiting panics the
# kernel, and with panic=-1 and -no-reboot that ends qemu, which the host side
# reports as "the VM did not finish".
# busybox-static runs its own applets before looking at PATH: real binaries
# that must win over an applet (setpriv) are called by full path.
export PATH=/usr/bin:/usr/sbin:/bin:/sbin

CHECK_UID=1000
CHECK_GID=1000

say() { echo "vm-init: $*"; }
die() {
	say "FATAL: $*"
	echo "VM-INIT-FAILED"
	poweroff -f
	sleep 10
}

# Stage 1: the initramfs root ("rootfs") cannot be pivot_root'ed away from,
# which crun needs for its containers, so copy everything into a tmpfs and
# switch_root into it (the initramfs memory is freed on the way).
if [ "$1" != "--stage2" ]; then
	mount -t proc proc /proc || die "mount /proc"
	mkdir -p /newroot
	mount -t tmpfs -o mode=0755 tmpfs /newroot || die "mount tmpfs /newroot"
	for d in /*; do
		case "$d" in /newroot | /proc | /sys | /dev) continue ;; esac
		cp -a "$d" /newroot/ || die "copy $d into the tmpfs root"
	done
	mkdir -p /newroot/proc /newroot/sys /newroot/dev
	umount /proc
	# shellcheck disable=SC2093 # reached only when switch_root fails
	exec switch_root /newroot /init --stage2
	die "switch_root failed"
fi

mount -t proc proc /proc || die "mount /proc"
mount -t sysfs sysfs /sys || die "mount /sys"
mount -t devtmpfs devtmpfs /dev || die "mount /dev"
mkdir -p /dev/pts /dev/shm /tmp /run
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=0755 tmpfs /run
hostname xfn-vm
ip link set lo up # a registry on 127.0.0.1 serves the xfn checks' image

say "kernel $(uname -r), $(nproc) cpus, uptime $(cut -d' ' -f1 /proc/uptime)s"

# Modules the Debian kernel builds as modules (listed by the builder).
while read -r m; do
	insmod "$m" || die "insmod $m"
done </etc/vm-modules

# Pure cgroup v2: the cmdline (cgroup_no_v1=all) keeps v1 from claiming
# controllers, so all of them show up in the v2 root.
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup || die "mount cgroup2"
say "cgroup controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
cg=/sys/fs/cgroup
echo "+cpu +memory +pids" >"$cg/cgroup.subtree_control" || die "enable controllers at the root"

# Processes may only live in leaves once controllers are enabled below: init
# itself moves into init.scope, as systemd does.
mkdir -p "$cg/init.scope"
echo $$ >"$cg/init.scope/cgroup.procs" || die "move init into init.scope"

# The delegated subtree: user.slice/xfn owned by the user, with the files
# systemd chowns on Delegate=yes. As under systemd, the user's first process
# starts in the delegated cgroup itself; moving into leaves below it before
# enabling controllers there is the delegatee's job (guest-checks.sh does it,
# and so must xfn).
mkdir -p "$cg/user.slice/xfn"
echo "+cpu +memory +pids" >"$cg/user.slice/cgroup.subtree_control" || die "enable controllers in user.slice"
chown "$CHECK_UID:$CHECK_GID" "$cg/user.slice/xfn" "$cg/user.slice/xfn/cgroup.procs" \
	"$cg/user.slice/xfn/cgroup.subtree_control" "$cg/user.slice/xfn/cgroup.threads" || die "chown delegated subtree"
say "delegated $cg/user.slice/xfn to uid $CHECK_UID"

# Debian's knob for unprivileged user namespaces (on by default; say so).
say "unprivileged_userns_clone=$(cat /proc/sys/kernel/unprivileged_userns_clone 2>/dev/null || echo n/a)"

mkdir -p /home/check
chown "$CHECK_UID:$CHECK_GID" /home/check

xfn_bin=""
[ -x /opt/xfn/bin/xfn ] && xfn_bin=/opt/xfn/bin/xfn

say "starting checks at uptime $(cut -d' ' -f1 /proc/uptime)s"
# The shell that becomes the user's enters the delegated cgroup first.
sh -c "echo \$\$ > $cg/user.slice/xfn/cgroup.procs && exec /usr/bin/setpriv \
	--reuid=$CHECK_UID --regid=$CHECK_GID --clear-groups --inh-caps=-all --bounding-set=-all \
	env -i HOME=/home/check PATH=$PATH XFN_BIN=$xfn_bin CGROUP_BASE=/user.slice/xfn \
	sh /opt/checks/guest-checks.sh"
say "checks exited with $?"
echo "VM-CHECKS-DONE uptime=$(cut -d' ' -f1 /proc/uptime)"
sync
poweroff -f
sleep 10
