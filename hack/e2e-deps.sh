#!/usr/bin/env bash
# Installs what the end-to-end tests and `make demo` need, when missing:
#
#   containerd, ctr, containerd-shim-runc-v2  v2.4.2 and v1.7.35, built with Go
#                                             into a cache directory (Debian's
#                                             containerd 1.6 has no NRI)
#   runc                                      Debian's package
#   busybox (static)                          Debian's busybox-static, the shell
#                                             of the test image
#
# Usage: hack/e2e-deps.sh [VERSION...]
#
# The containerd versions are the arguments, else $NRI_VGPU_E2E_CONTAINERD
# (space-separated), else both of the above: 2.x has NRI on by default, 1.7
# has it off until the config turns it on, and the tests run against each.
#
# Idempotent: a cached containerd of a pinned version is reused. Prints what it
# installs and where on stderr; stdout gets one line, the directory holding the
# binaries of the first version (v2.4.2 by default), for scripts that capture
# it (`bin=$(hack/e2e-deps.sh)`). The others are in the sibling directories
# $cache/containerd-<version>/bin.
#
# Environment:
#   NRI_VGPU_E2E_CACHE       cache directory (default /var/cache/nri-vgpu-e2e
#                            as root, else ${XDG_CACHE_HOME:-$HOME/.cache}/nri-vgpu-e2e)
#   NRI_VGPU_E2E_CONTAINERD  containerd versions, when no arguments are given
set -euo pipefail

# The same list, in the same order, as harness.ContainerdVersions
# (test/e2e/harness checks it).
DEFAULT_VERSIONS=(v2.4.2 v1.7.35)

versions=()
if (($#)); then
	versions=("$@")
elif [ -n "${NRI_VGPU_E2E_CONTAINERD:-}" ]; then
	read -r -a versions <<<"${NRI_VGPU_E2E_CONTAINERD//,/ }"
fi
((${#versions[@]})) || versions=("${DEFAULT_VERSIONS[@]}")

if [ -n "${NRI_VGPU_E2E_CACHE:-}" ]; then
	cache=$NRI_VGPU_E2E_CACHE
elif [ "$(id -u)" = 0 ]; then
	cache=/var/cache/nri-vgpu-e2e
else
	cache=${XDG_CACHE_HOME:-$HOME/.cache}/nri-vgpu-e2e
fi

log() { echo "e2e-deps: $*" >&2; }
have() { command -v "$1" >/dev/null 2>&1; }

# Versions are checked before anything is installed. NRI came with 1.7.
for v in "${versions[@]}"; do
	if ! [[ $v =~ ^v(1\.([7-9]|[1-9][0-9])|([2-9]|[1-9][0-9]+)\.[0-9]+)\.[0-9]+$ ]]; then
		log "containerd version '$v': want vMAJOR.MINOR.PATCH, v1.7.0 or newer (NRI)"
		exit 2
	fi
done

# --- Debian packages -------------------------------------------------------
# Checked by what the tests do with them: the harness runs runc from PATH,
# else /usr/sbin/runc; the test images get /bin/busybox alone, so it must be
# static (Debian's busybox package is dynamic) and provide a shell.
runc_works() {
	local runc
	runc=$(command -v runc || echo /usr/sbin/runc)
	"$runc" --version >/dev/null 2>&1
}
static_busybox() {
	local applets
	applets=$(/bin/busybox --list 2>/dev/null) && grep -qx sh <<<"$applets" &&
		! ldd /bin/busybox >/dev/null 2>&1
}
pkgs=()
runc_works || pkgs+=(runc)
static_busybox || pkgs+=(busybox-static)
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
	runc_works || { log "runc does not run after installing it"; exit 1; }
	static_busybox || { log "/bin/busybox is not a static busybox after installing busybox-static"; exit 1; }
else
	log "runc $(dpkg-query -W -f='${Version}' runc 2>/dev/null || echo '(not from a package)') and busybox-static already installed"
fi

# --- containerd ------------------------------------------------------------
if ! have go; then
	log "Go is required to build containerd (go 1.26 or newer on PATH)"
	exit 1
fi

bins=(containerd ctr containerd-shim-runc-v2)

# reported_version DIR prints the version all three binaries in DIR report
# ("2.4.2+unknown" from a `go install` build, "1.7.35" from a source build),
# or fails if one is missing or they disagree.
reported_version() {
	local dir=$1 b v want=""
	for b in "${bins[@]}"; do
		[ -x "$dir/$b" ] || return 1
		case $b in
		containerd-shim-runc-v2) v=$("$dir/$b" -v 2>/dev/null | awk '$1 == "Version:" {print $2}') ;;
		*) v=$("$dir/$b" --version 2>/dev/null | awk '{print $3}') ;;
		esac
		[ -n "$v" ] || return 1
		[ -n "$want" ] && [ "$v" != "$want" ] && return 1
		want=$v
	done
	echo "$want"
}

# is_version REPORTED VERSION: REPORTED ("2.4.2+unknown", "v1.7.35") is VERSION.
is_version() {
	local got=${1#v}
	[ "${got%%+*}" = "${2#v}" ]
}

# build VERSION DIR builds the three binaries of VERSION into DIR.
build() {
	local version=$1 dir=$2 b
	# no_btrfs: the btrfs snapshotter needs btrfs headers this image lacks.
	case $version in
	v1.*)
		# go install refuses a module whose go.mod has exclude directives,
		# as every 1.7 release's has; building inside the module's source
		# (the module cache) is the way. The version is stamped as a release
		# build does.
		local module=github.com/containerd/containerd info src
		# From the (empty) build dir: outside any module, so that no go.mod
		# or go.sum around the caller is touched.
		if ! info=$(cd "$dir" && go mod download -json "$module@$version"); then
			log "could not download $module@$version: $(awk -F'"' '$2 == "Error" {print $4}' <<<"$info")"
			return 1
		fi
		src=$(awk -F'"' '$2 == "Dir" {print $4}' <<<"$info")
		if [ ! -d "$src" ]; then
			log "go mod download $module@$version gave no source directory"
			return 1
		fi
		(cd "$src" && GOFLAGS=-buildvcs=false go build -tags no_btrfs -trimpath \
			-ldflags "-X $module/version.Version=${version#v}" \
			-o "$dir/" ./cmd/containerd ./cmd/ctr ./cmd/containerd-shim-runc-v2)
		;;
	*)
		local module=github.com/containerd/containerd/v2
		GOBIN=$dir GOFLAGS=-buildvcs=false go install -tags no_btrfs \
			"$module/cmd/containerd@$version" \
			"$module/cmd/ctr@$version" \
			"$module/cmd/containerd-shim-runc-v2@$version"
		;;
	esac
}

tmp=""
trap '[ -z "$tmp" ] || rm -rf "$tmp"' EXIT
for version in "${versions[@]}"; do
	bin=$cache/containerd-$version/bin
	if is_version "$(reported_version "$bin" || true)" "$version"; then
		log "containerd $version already in $bin"
		continue
	fi
	log "building containerd $version into $bin (a minute or two, ~800 MB of memory)"
	mkdir -p "$cache"
	tmp=$(mktemp -d "$cache/.build.XXXXXX")
	# Build into a temp dir and move the binaries in only once all three are
	# built, so an interrupted build never leaves a half-filled cache behind.
	build "$version" "$tmp"
	mkdir -p "$bin"
	for b in "${bins[@]}"; do
		mv -f "$tmp/$b" "$bin/$b"
	done
	rm -rf "$tmp"
	tmp=""
	got=$(reported_version "$bin" || true)
	if ! is_version "$got" "$version"; then
		log "built containerd reports version '$got', want $version"
		exit 1
	fi
	log "installed containerd, ctr, containerd-shim-runc-v2 $version in $bin"
done
echo "$cache/containerd-${versions[0]}/bin"
