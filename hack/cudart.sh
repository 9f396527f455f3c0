#!/usr/bin/env bash
# NVIDIA's own CUDA runtime libraries for the shim's tests (make -C shim
# test): libcudart 11.8.89 (Debian bookworm non-free, libcudart11.0) and
# 12.4.127 (trixie non-free, libcudart12), fetched as .deb with apt-get
# download and unpacked with dpkg -x into a cache. Nothing is installed and
# the machine's apt configuration is neither read for sources nor changed:
# apt works on a sources list, package lists and archive cache of its own in
# a temporary directory (apt still checks the archive's signatures with
# Debian's keyring).
#
#   hack/cudart.sh     prints the cache directory, which then holds
#                      11.8.89/libcudart.so.11.8.89 and
#                      12.4.127/libcudart.so.12.4.127
#
# Idempotent: a version already in the cache that loads and reports its
# version is not fetched again. Each version is unpacked under a temporary
# name and renamed into place, under a lock, so concurrent runs are safe.
#
# Environment:
#   NRI_VGPU_CUDART_CACHE   the cache (default /var/cache/nri-vgpu-cudart)
#   NRI_VGPU_DEBIAN_MIRROR  the Debian archive (default: the first
#                           .../debian URI in this machine's apt sources,
#                           else http://deb.debian.org/debian)
set -euo pipefail

cache=${NRI_VGPU_CUDART_CACHE:-/var/cache/nri-vgpu-cudart}
keyring=/usr/share/keyrings/debian-archive-keyring.gpg

# version package suite
wanted=(
	"11.8.89 libcudart11.0 bookworm"
	"12.4.127 libcudart12 trixie"
)

die() {
	echo "cudart: $*" >&2
	exit 1
}

command -v python3 >/dev/null || die "python3 is not installed (hack/deps.sh installs what the tests need)"

# ok DIR VERSION: the unpacked library loads and answers a call that needs
# no driver (11.8's cudaRuntimeGetVersion does need one).
ok() {
	[ -f "$1/libcudart.so.$2" ] || return 1
	python3 - "$1/libcudart.so.$2" <<-'EOF' 2>/dev/null
		import ctypes, sys
		lib = ctypes.CDLL(sys.argv[1])
		lib.cudaGetErrorName.restype = ctypes.c_char_p
		sys.exit(0 if lib.cudaGetErrorName(2) == b"cudaErrorMemoryAllocation" else 1)
	EOF
}

missing=()
for w in "${wanted[@]}"; do
	read -r ver pkg suite <<<"$w"
	ok "$cache/$ver" "$ver" || missing+=("$w")
done
if [ ${#missing[@]} -eq 0 ]; then
	echo "$cache"
	exit 0
fi

# Only a fetch needs apt and Debian's keyring: a filled cache copied to a
# machine without them (or without a network) is used as it is.
for cmd in apt-get dpkg flock; do
	command -v "$cmd" >/dev/null || die "$cmd is not installed (hack/deps.sh installs what the tests need)"
done
[ -r "$keyring" ] || die "$keyring is missing: install debian-archive-keyring"
mkdir -p "$cache" 2>/dev/null || die "cannot create the cache $cache (set NRI_VGPU_CUDART_CACHE to a writable directory)"
[ -w "$cache" ] || die "the cache $cache is not writable (set NRI_VGPU_CUDART_CACHE to a writable directory)"
exec 9>"$cache/.lock"
flock 9

mirror=${NRI_VGPU_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
	mirror=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
		grep -oE 'https?://[^ ]*/debian/?( |$)' | head -n 1 | tr -d ' ') || true
	mirror=${mirror%/}
	mirror=${mirror:-http://deb.debian.org/debian}
fi

tmp=$(mktemp -d "$cache/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lists/partial" "$tmp/archives/partial" "$tmp/debs"
: >"$tmp/sources.list"
for s in bookworm trixie; do
	echo "deb [signed-by=$keyring] $mirror $s non-free" >>"$tmp/sources.list"
done
apt_opts=(
	-o "Dir::Etc::SourceList=$tmp/sources.list"
	-o Dir::Etc::SourceParts=/dev/null
	-o "Dir::State::Lists=$tmp/lists"
	-o "Dir::Cache=$tmp"
	-o "Dir::Cache::archives=$tmp/archives"
	-o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=
	-o APT::Sandbox::User=root
	-o Acquire::Languages=none
	-o Debug::NoLocking=1
)
if ! apt-get "${apt_opts[@]}" -q --error-on=any update >"$tmp/update.log" 2>&1; then
	cat "$tmp/update.log" >&2
	die "apt-get update of Debian's non-free lists from $mirror failed (set NRI_VGPU_DEBIAN_MIRROR to a reachable Debian mirror)"
fi

for w in "${missing[@]}"; do
	read -r ver pkg suite <<<"$w"
	# The candidate from the suite named: its upstream version must be ours.
	debver=$(apt-cache "${apt_opts[@]}" madison "$pkg" | awk -F'|' -v s="$suite/non-free" \
		'index($3, s) { gsub(/ /, "", $2); print $2; exit }')
	[ -n "$debver" ] || die "$pkg is not in $suite non-free at $mirror"
	case "$debver" in
	"$ver"~*) ;;
	*) die "$pkg in $suite is $debver, not cudart $ver: the tests' request tables (shim/test/cudart/) were recorded for $ver" ;;
	esac
	if ! (cd "$tmp/debs" && apt-get "${apt_opts[@]}" -q download "$pkg=$debver") >"$tmp/download.log" 2>&1; then
		cat "$tmp/download.log" >&2
		die "apt-get download $pkg=$debver failed"
	fi
	deb=$(ls "$tmp/debs/${pkg}_"*.deb)
	rm -rf "$tmp/x"
	dpkg -x "$deb" "$tmp/x" || die "dpkg -x $deb failed"
	lib=$(find "$tmp/x" -name "libcudart.so.$ver" -type f | head -n 1)
	[ -n "$lib" ] || die "$deb holds no libcudart.so.$ver"
	mkdir -p "$tmp/$ver"
	cp "$lib" "$tmp/$ver/"
	ok "$tmp/$ver" "$ver" || die "the unpacked libcudart.so.$ver from $deb does not load, or its cudaGetErrorName does not answer"
	rm -rf "${cache:?}/$ver"
	mv "$tmp/$ver" "$cache/$ver"
	echo "cudart: $pkg $debver unpacked into $cache/$ver" >&2
done
echo "$cache"
