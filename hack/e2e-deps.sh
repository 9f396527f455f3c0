#!/usr/bin/env bash
# Installs what the end-to-end tests and `make demo` need, when missing:
#
#   containerd, ctr, containerd-shim-runc-v2  v2.4.2, built with `go install`
#                                             into a cache directory (Debian's
#                                             containerd 1.6 has no NRI)
#   runc                                      Debian's package
#   busybox (static)                          Debian's busybox-static, the shell
#                                             of the test image
#
# Idempotent: a cached containerd of the pinned version is reused. Prints what
# it installs and where; the last line of output is the directory holding the
# containerd binaries, for scripts that capture it.
#
# Environment:
#   NRI_VGPU_E2E_CACHE  cache directory (default /var/cache/nri-vgpu-e2e as
#                       root, else ${XDG_CACHE_HOME:-$HOME/.cache}/nri-vgpu-e2e)
set -euo pipefail

CONTAINERD_VERSION=v2.4.2
CONTAINERD_MODULE=github.com/containerd/containerd/v2

if [ -n "${NRI_VGPU_E2E_CACHE:-}" ]; then
	cache=$NRI_VGPU_E2E_CACHE
elif [ "$(id -u)" = 0 ]; then
	cache=/var/cache/nri-vgpu-e2e
else
	cache=${XDG_CACHE_HOME:-$HOME/.cache}/nri-vgpu-e2e
fi
bin=$cache/containerd-$CONTAINERD_VERSION/bin

log() { echo "e2e-deps: $*" >&2; }
have() { command -v "$1" >/dev/null 2>&1; }

# --- Debian packages -------------------------------------------------------
# busybox-static is checked by package, not by command: Debian's dynamic
# busybox also provides /bin/busybox but cannot be copied into an image alone.
pkgs=()
have runc || [ -x /usr/sbin/runc ] || pkgs+=(runc)
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || pkgs+=(busybox-static)
if ((${#pkgs[@]})); then
	if [ "$(id -u)" != 0 ]; then
		log "missing ${pkgs[*]}; install them as root: apt-get install ${pkgs[*]}"
		exit 1
	fi
	log "installing ${pkgs[*]} from Debian's packages (apt-get)"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
	for p in "${pkgs[@]}"; do
		log "  installed $p $(dpkg-query -W -f='${Version}' "$p")"
	done
else
	log "runc $(dpkg-query -W -f='${Version}' runc 2>/dev/null || echo '(not from a package)') and busybox-static already installed"
fi

# --- containerd ------------------------------------------------------------
if ! have go; then
	log "Go is required to build containerd (go 1.26 or newer on PATH)"
	exit 1
fi

# The module version recorded in the binary's build info (`containerd
# --version` prints "2.4.2+unknown" for a `go install` build).
cached_version() {
	local b v want=""
	for b in containerd ctr containerd-shim-runc-v2; do
		[ -x "$bin/$b" ] || return 1
		v=$(go version -m "$bin/$b" 2>/dev/null | awk '$1 == "mod" {print $3}')
		[ -n "$want" ] && [ "$v" != "$want" ] && return 1
		want=$v
	done
	echo "$want"
}

if [ "$(cached_version || true)" = "$CONTAINERD_VERSION" ]; then
	log "containerd $CONTAINERD_VERSION already in $bin"
else
	log "building containerd $CONTAINERD_VERSION with go install into $bin (a minute or two, ~800 MB of memory)"
	mkdir -p "$bin"
	tmp=$(mktemp -d "$cache/.build.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	# Build into a temp dir and move the binaries in only once all three are
	# built, so an interrupted build never leaves a half-filled cache behind.
	# no_btrfs: the btrfs snapshotter needs btrfs headers this image lacks.
	GOBIN=$tmp GOFLAGS=-buildvcs=false go install -tags no_btrfs \
		"$CONTAINERD_MODULE/cmd/containerd@$CONTAINERD_VERSION" \
		"$CONTAINERD_MODULE/cmd/ctr@$CONTAINERD_VERSION" \
		"$CONTAINERD_MODULE/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
	for b in containerd ctr containerd-shim-runc-v2; do
		mv -f "$tmp/$b" "$bin/$b"
	done
	got=$(cached_version || true)
	if [ "$got" != "$CONTAINERD_VERSION" ]; then
		log "built containerd reports version '$got', want $CONTAINERD_VERSION"
		exit 1
	fi
	log "installed containerd, ctr, containerd-shim-runc-v2 $CONTAINERD_VERSION in $bin"
fi
echo "$bin"
