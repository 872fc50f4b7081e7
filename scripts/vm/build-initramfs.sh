#!/usr/bin/env bash
# Builds the check VM's initramfs (cpio newc, gzip).
# Usage: build-initramfs.sh KERNEL_DIR OUTPUT [XFN_BINARY]
#   KERNEL_DIR  an unpacked Debian linux-image package (boot/, lib/modules/)
#   OUTPUT      the initramfs to write
#   XFN_BINARY  optional; copied in (debug info stripped) with its libraries
# Environment (both optional, space-separated):
#   XFN_VM_EXTRA_CHECKS  guest check scripts, to /opt/checks/extra/
#   XFN_VM_INCLUDE       HOST_PATH:GUEST_PATH pairs copied in as they are
#                        (e.g. an image store made on the host); executables
#                        among them need their libraries: list them in
#                        XFN_VM_BINARIES instead
#   XFN_VM_BINARIES      HOST_PATH:GUEST_PATH pairs of programs, copied in
#                        with every shared library ldd lists
# Every dynamically linked host binary goes in with the shared libraries ldd
# names and the dynamic loader, at the paths ldd gives, so it runs unchanged.
set -euo pipefail

kernel_dir=$1
output=$2
xfn_bin=${3:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Modules the checks need; each is taken only when the kernel's config builds
# it as a module (=m); built-in (=y) needs nothing, missing (unset) fails.
# overlay: xfn mounts image layers with overlayfs inside its user namespace.
wanted_modules=(OVERLAY_FS:overlay)

root=$(mktemp -d "${TMPDIR:-/tmp}/xfn-vm-root.XXXXXX")
trap 'rm -rf "$root"' EXIT

# copy_with_libs BINARY DEST: BINARY to $root/DEST, plus everything ldd lists.
copy_with_libs() {
	local bin=$1 dest=$2 lib
	install -D -m 0755 "$bin" "$root$dest"
	if ! ldd "$bin" >/dev/null 2>&1; then
		return 0 # static: ldd says "not a dynamic executable" and fails
	fi
	# "libx.so => /path (0x...)" and "/lib64/ld-linux-x86-64.so.2 (0x...)";
	# linux-vdso has no file.
	ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' |
		while read -r lib; do
			[ -e "$root$lib" ] || install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
		done
	if ldd "$bin" | grep -q "not found"; then
		echo "build-initramfs: $bin has missing libraries:" >&2
		ldd "$bin" | grep "not found" >&2
		exit 1
	fi
}

# busybox_tree DIR: busybox-static with a symlink per applet.
busybox_tree() {
	local dir=$1 applet
	install -D -m 0755 /bin/busybox "$dir/bin/busybox"
	for applet in $(/bin/busybox --list-full); do
		[ "$applet" = bin/busybox ] && continue
		mkdir -p "$dir/$(dirname "$applet")"
		ln -sf /bin/busybox "$dir/$applet"
	done
}

# The VM's own userland: busybox, then real binaries where busybox's applet
# lacks what is needed (setpriv: --reuid/--regid/--clear-groups).
busybox_tree "$root"
mkdir -p "$root"/{proc,sys,dev,tmp,run,etc,home,opt,lib/modules}
copy_with_libs "$(command -v crun)" /usr/bin/crun
rm -f "$root/bin/setpriv" "$root/usr/bin/setpriv"
copy_with_libs "$(command -v setpriv)" /usr/bin/setpriv
# The system CA bundle, as on any host: TLS clients (xfn's registry client)
# may refuse to start without one, even for a plain-HTTP loopback registry.
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
	install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
fi
cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
check:x:1000:1000:check:/home/check:/bin/sh
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
check:x:1000:
EOF

# Kernel modules, decided by the package's own config.
config=$(echo "$kernel_dir"/boot/config-*)
: >"$root/etc/vm-modules"
for entry in "${wanted_modules[@]}"; do
	option=${entry%%:*} module=${entry#*:}
	setting=$(sed -n "s/^CONFIG_$option=//p" "$config")
	case "$setting" in
	y) ;;
	m)
		ko=$(find "$kernel_dir/lib/modules" -name "$module.ko*" | head -n 1)
		[ -n "$ko" ] || { echo "build-initramfs: $module.ko not in the package" >&2; exit 1; }
		case "$ko" in
		*.xz) xz -dc "$ko" >"$root/lib/modules/$module.ko" ;;
		*.zst) zstd -qdc "$ko" >"$root/lib/modules/$module.ko" ;;
		*) cp "$ko" "$root/lib/modules/$module.ko" ;;
		esac
		deps=$(modinfo -F depends "$root/lib/modules/$module.ko" 2>/dev/null || true)
		[ -z "$deps" ] || { echo "build-initramfs: $module needs $deps, not handled" >&2; exit 1; }
		echo "/lib/modules/$module.ko" >>"$root/etc/vm-modules"
		;;
	*) echo "build-initramfs: CONFIG_$option is '${setting:-unset}' in $config" >&2; exit 1 ;;
	esac
done

# The test image: a busybox rootfs the containers run.
busybox_tree "$root/opt/rootfs"
# cg, check: mount points for the cpu check (its cgroup, read-only; its script).
mkdir -p "$root/opt/rootfs"/{proc,dev,tmp,etc,sys,cg,check}
echo "root:x:0:0:root:/:/bin/sh" >"$root/opt/rootfs/etc/passwd"

# The checks and init.
install -D -m 0755 "$here/guest-checks.sh" "$root/opt/checks/guest-checks.sh"
install -m 0755 "$here/guest-init.sh" "$root/init"

if [ -n "$xfn_bin" ]; then
	copy_with_libs "$xfn_bin" /opt/xfn/bin/xfn
	# Debug builds carry hundreds of MiB of DWARF; the VM holds all of it in RAM.
	if command -v objcopy >/dev/null; then
		objcopy --strip-debug "$root/opt/xfn/bin/xfn"
	fi
fi

for script in ${XFN_VM_EXTRA_CHECKS:-}; do
	install -D -m 0644 "$script" "$root/opt/checks/extra/$(basename "$script")"
done
for pair in ${XFN_VM_INCLUDE:-}; do
	mkdir -p "$root$(dirname "${pair#*:}")"
	cp -a "${pair%%:*}" "$root${pair#*:}"
done
for pair in ${XFN_VM_BINARIES:-}; do
	copy_with_libs "${pair%%:*}" "${pair#*:}"
done

(cd "$root" && find . -print0 | cpio --null -o -H newc --owner=0:0 --quiet) | gzip -1 >"$output"
echo "build-initramfs: $output ($(du -h "$output" | cut -f1))" >&2
