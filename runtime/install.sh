#!/bin/sh
# Installs what the runner image needs besides xfn, from Debian's archive,
# pinned: the Dockerfile's runtime stage runs it (see runtime/README.md).
# To bump crun: change CRUN_VERSION to the version Debian ships (apt-cache
# policy crun), keep it at or above xfn's MIN_CRUN (src/sandbox/crun.rs; a
# unit test compares them), rebuild the image and run its tests.
set -eu

# The OCI runtime xfn drives. Debian bookworm's, the version xfn is tested
# with on the build and CI hosts.
CRUN_VERSION=1.8.1-1+deb12u1

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# ca-certificates: xfn verifies registries against the system's roots
# (rustls-platform-verifier reads /etc/ssl/certs).
apt-get install -y -qq --no-install-recommends "crun=$CRUN_VERSION" ca-certificates >/dev/null
# The pin is exact: a different version means the archive moved, and the
# build fails here rather than ship an untested runtime.
installed=$(dpkg-query -W -f='${Version}' crun)
[ "$installed" = "$CRUN_VERSION" ] || {
    echo "runtime/install.sh: crun $installed installed, $CRUN_VERSION pinned" >&2
    exit 1
}
crun --version | head -n1
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/debconf/*-old /var/log/apt /var/log/dpkg.log
