# Shared by scripts/setup.sh and scripts/example.sh (bash; source it): the
# Debian packages the example needs, and installing the missing ones of a
# list. The example's are a part of the tests' (scripts/setup.sh adds the
# rest), so that `scripts/example.sh` installs only what it uses.

# What `scripts/example.sh` uses, in every mode: the runtime, the registry,
# the image's base, the image tools (no Docker), and glibc's libc.a and
# readelf for `render`'s static function server.
EXAMPLE_PACKAGES=(
  crun            # the OCI runtime xfn drives
  docker-registry # the local registry the tests and the example push to
  busybox-static  # the base of every test and example image
  skopeo umoci    # the example image is built and pushed with them; the pull benchmark's peer
  libc6-dev binutils # the static function server (tests/fixtures/fn_server.rs) links glibc's libc.a; readelf checks it
  wget ca-certificates
)

# apt_install PACKAGE...: installs those not installed yet (one apt-get
# update first, only then), with sudo unless root.
apt_install() {
  local missing=() p sudo=""
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
