#!/usr/bin/env bash
# Builds the bundle that hack/gpu-check.sh unpacks on a GPU machine (make
# gpu-bundle): everything the GPU check runs, for a machine that has a driver,
# Python and PyTorch but no containerd, runc, Go or network. Writes
#
#   gpu-bundle/nri-vgpu-gpu-bundle.tar.xz
#
# (and beside it the sha256 of the tar stream inside, to skip compressing the
# same files again),
# which unpacks to (the layout gpu-check --bundle reads):
#
#   bin/       containerd containerd-shim-runc-v2 ctr runc nri-vgpu
#              nri-vgpu-device-plugin nri-vgpu-hook gpu-check pause busybox
#   lib/       libvgpu-shim.so
#   fake/      libcuda.so.1 libnvidia-ml.so.1  (the fake driver: --mode simulated)
#   test/      the shim's test programs gpu-check uses (its README lists them)
#   scripts/   gpu-check's Python workloads (test/e2e/cmd/gpu-check/scripts)
#   validate/  a copy of shim/validate
#   MANIFEST   the version, where each part comes from, each file's size
#
# Sources: containerd and its runc shim of CONTAINERD_VERSION from the e2e
# cache (hack/e2e-deps.sh builds them when missing); runc RUNC_VERSION built
# here, static and with seccomp (cached next to containerd); the project's
# binaries and gpu-check built here without symbols; the shim, the fake driver
# and the test programs from `make -C shim`, stripped; Debian's static busybox.
#
# The bundle travels with the working tree to a lent GPU machine, and both
# together must stay under that machine's limit: the script prints the
# bundle's size and the tracked tree's and fails when together they reach
# LIMIT_MIB. Every dynamic binary is checked to need only glibc's libraries
# (and the driver's) at a glibc no newer than TARGET_GLIBC, the GPU machine's
# (Ubuntu 24.04).
#
# Environment: VERSION (default git describe), NRI_VGPU_E2E_CACHE (as
# hack/e2e-deps.sh), XZ_OPTIONS (default below).
set -euo pipefail
cd "$(dirname "$0")/.."

CONTAINERD_VERSION=v2.4.2
# The runc that containerd v2.4.2 is tested with (its script/setup/runc-version).
RUNC_VERSION=v1.5.2
TARGET_GLIBC=2.39
LIMIT_MIB=48
# A dictionary larger than the whole tar stream lets xz find what the Go
# binaries share (containerd, its shim and nri-vgpu hold many of the same
# packages); a fast preset keeps it short. On two busy cores, 174 MiB
# unpacked: this 30.8 MB in 79 s, -9 (64 MiB dictionary) 27.9 MB in 200 s;
# at 100 MiB (before ctr and gpu-check), -6 (8 MiB) gave 28.2 MB against
# this 20.5 MB. Unpacking needs 128 MiB of memory.
XZ_OPTIONS=${XZ_OPTIONS:---lzma2=preset=3,dict=128MiB}
MODULE=github.com/nri-vgpu/nri-vgpu
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}

out=gpu-bundle
tarball=$out/nri-vgpu-gpu-bundle.tar.xz

# The shim's test programs gpu-check runs (test/e2e/cmd/gpu-check/README.md),
# and those validate.sh's checks use (regiondump; dlsymlog.so for check 13).
TEST_PROGRAMS=(cudaprog nvmlprocs regiondump dlsymlog.so)

log() { echo "gpu-bundle: $*" >&2; }
die() {
	log "$*"
	exit 1
}

if [ -n "${NRI_VGPU_E2E_CACHE:-}" ]; then
	cache=$NRI_VGPU_E2E_CACHE
elif [ "$(id -u)" = 0 ]; then
	cache=/var/cache/nri-vgpu-e2e
else
	cache=${XDG_CACHE_HOME:-$HOME/.cache}/nri-vgpu-e2e
fi

stage=""
partial=""
cleanup() {
	[ -z "$stage" ] || rm -rf "$stage" "$stage.MANIFEST" "$stage.tar"
	[ -z "$partial" ] || rm -rf "$partial"
}
trap cleanup EXIT
stage=$(mktemp -d /tmp/nri-vgpu-gpu-bundle.XXXXXX)
mkdir -p "$stage"/{bin,lib,fake,test,scripts}

# --- runc: static, with seccomp ----------------------------------------------
# The GPU machine has no runc, and which libraries it has is not known: a
# static runc needs none. With seccomp, because a container's seccomp filter
# (the confinement check) is runc's to install; a runc built without it
# refuses configs that carry one.
# static BINARY: BINARY has no ELF interpreter (static or static-pie).
static() { ! readelf -l "$1" 2>/dev/null | grep -q 'program interpreter'; }
runc_ok() { # runc_ok BINARY: the pinned version, static, with seccomp
	local v
	v=$("$1" --version 2>/dev/null) || return 1
	grep -qx "runc version ${RUNC_VERSION#v}" <<<"$v" && grep -q '^libseccomp: ' <<<"$v" && static "$1"
}
runc_bin=$cache/runc-$RUNC_VERSION/runc
if ! runc_ok "$runc_bin"; then
	# libseccomp-golang finds libseccomp through pkg-config; the static link
	# needs the archive (Debian's libseccomp-dev).
	if ! pkg-config --exists libseccomp 2>/dev/null ||
		[ ! -e "$(gcc -print-file-name=libseccomp.a 2>/dev/null)" ]; then
		die "a static runc needs libseccomp.a and pkg-config: run hack/deps.sh as root (it installs libseccomp-dev and pkg-config)"
	fi
	log "building runc $RUNC_VERSION (static, seccomp) into $runc_bin"
	mkdir -p "$cache"
	tmp=$(mktemp -d "$cache/.runc.XXXXXX")
	partial=$tmp
	# The flags of runc's own `make static` (static-pie on amd64/arm64), with
	# its build tags less libpathrs (a Rust library Debian 12 lacks; runc
	# falls back to its Go path resolution), and without symbols. Outside any
	# module, so that no go.mod around is touched.
	case $(go env GOARCH) in
	amd64 | arm64) static_flags=(-buildmode=pie -ldflags "-s -w -X main.gitCommit=$RUNC_VERSION -linkmode external -extldflags -static-pie") ;;
	*) static_flags=(-ldflags "-s -w -X main.gitCommit=$RUNC_VERSION -extldflags -static") ;;
	esac
	(cd "$tmp" && GOBIN=$tmp CGO_ENABLED=1 GOFLAGS=-buildvcs=false GOWORK=off go install -trimpath \
		-tags "seccomp urfave_cli_no_docs netgo osusergo" "${static_flags[@]}" \
		"github.com/opencontainers/runc@$RUNC_VERSION")
	runc_ok "$tmp/runc" || die "the runc built is not $RUNC_VERSION, static, with seccomp: $("$tmp/runc" --version 2>&1 | tr '\n' ' ')"
	mkdir -p "$(dirname "$runc_bin")"
	mv -f "$tmp/runc" "$runc_bin"
	rm -rf "$tmp"
	partial=""
fi
cp "$runc_bin" "$stage/bin/runc"

# --- containerd ---------------------------------------------------------------
cbin=$(hack/e2e-deps.sh "$CONTAINERD_VERSION")
# ctr: gpu-check imports its images with it.
for b in containerd containerd-shim-runc-v2 ctr; do
	strip --strip-unneeded -o "$stage/bin/$b" "$cbin/$b"
done

# --- the project's binaries and the check program ---------------------------
log "building nri-vgpu, nri-vgpu-device-plugin, nri-vgpu-hook, gpu-check, pause ($VERSION)"
ldflags="-s -w -X $MODULE/internal/version.Version=$VERSION"
# As the Makefile builds them (PIE, cgo for NVML), without symbols.
go build -trimpath -buildmode=pie -ldflags "$ldflags" -o "$stage/bin/nri-vgpu" ./cmd/nri-vgpu
go build -trimpath -buildmode=pie -ldflags "$ldflags" -o "$stage/bin/nri-vgpu-device-plugin" ./cmd/device-plugin
# The hook by the Makefile's own rule (static: runc runs it on the host),
# stripped.
make -s "$PWD/bin/nri-vgpu-hook" VERSION="$VERSION" >&2
static bin/nri-vgpu-hook || die "bin/nri-vgpu-hook is not static (the Makefile's rule makes it so)"
strip --strip-unneeded -o "$stage/bin/nri-vgpu-hook" bin/nri-vgpu-hook
# Static: the pause image holds this one file.
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$stage/bin/pause" ./test/e2e/cmd/pause
[ -d test/e2e/cmd/gpu-check ] || die "test/e2e/cmd/gpu-check is missing: the bundle needs the check program"
# PIE and cgo as the daemons (it asks NVML through the device plugin's code).
go build -trimpath -buildmode=pie -ldflags "-s -w" -o "$stage/bin/gpu-check" ./test/e2e/cmd/gpu-check
[ -d test/e2e/cmd/gpu-check/scripts ] || die "test/e2e/cmd/gpu-check/scripts is missing: gpu-check's Python workloads"
cp -r test/e2e/cmd/gpu-check/scripts/. "$stage/scripts/"

# --- busybox ------------------------------------------------------------------
# The test images' shell: Debian's busybox-static (hack/e2e-deps.sh installs
# it); static, so an image needs nothing else.
static /bin/busybox || die "/bin/busybox is dynamically linked: run hack/e2e-deps.sh as root (busybox-static)"
cp /bin/busybox "$stage/bin/busybox"

# --- the shim, the fake driver, the test programs -----------------------------
make -s -C shim >&2
strip --strip-unneeded -o "$stage/lib/libvgpu-shim.so" shim/build/libvgpu-shim.so
for l in libcuda.so.1 libnvidia-ml.so.1; do
	strip --strip-unneeded -o "$stage/fake/$l" "shim/build/fake/$l"
done
for p in "${TEST_PROGRAMS[@]}"; do
	strip --strip-unneeded -o "$stage/test/$p" "shim/build/$p"
done
cp -r shim/validate "$stage/validate"

# --- checks on what the GPU machine will run ---------------------------------
# Dynamic ELF files may need glibc's libraries (every Linux has them) and the
# NVIDIA driver's (the test programs link libcuda); nothing else, and no glibc
# symbol version newer than the target's.
bad=()
while IFS= read -r -d '' f; do
	head -c 4 "$f" | grep -q $'^\x7fELF' || continue
	needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
	for n in $needed; do
		case $n in
		libc.so.6 | libm.so.6 | libpthread.so.0 | libdl.so.2 | librt.so.1 | ld-linux-x86-64.so.2) ;;
		libcuda.so.1 | libnvidia-ml.so.1) ;; # the driver's
		*) bad+=("${f#"$stage"/} needs $n") ;;
		esac
	done
	newest=$(objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1 || true)
	if [ -n "$newest" ] && [ "$(printf '%s\n%s\n' "$newest" "$TARGET_GLIBC" | sort -V | tail -n 1)" != "$TARGET_GLIBC" ]; then
		bad+=("${f#"$stage"/} needs glibc $newest (the GPU machine has $TARGET_GLIBC)")
	fi
done < <(find "$stage" -type f -print0)
((${#bad[@]} == 0)) || die "binaries the GPU machine could not run: ${bad[*]}"

# --- MANIFEST and the tarball -------------------------------------------------
{
	echo "nri-vgpu gpu bundle $VERSION"
	echo "containerd $CONTAINERD_VERSION ($cbin), stripped"
	echo "runc $("$stage/bin/runc" --version | sed -n 's/^runc version //p') static, libseccomp $("$stage/bin/runc" --version | sed -n 's/^libseccomp: //p')"
	echo "busybox $(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null || echo '(not from a package)')"
	echo "go $(go env GOVERSION)"
	echo "size path"
	(cd "$stage" && find . -type f -printf '%s %P\n' | sort -k2)
} >"$stage.MANIFEST"
mv "$stage.MANIFEST" "$stage/MANIFEST"

mkdir -p "$out"
# Owned by root, in name order, dated by the last commit: the same files give
# the same tar stream, and a stream already compressed is not compressed
# again (its sha256 is kept beside the tarball).
mtime=$(git log -1 --format=%ct 2>/dev/null || date +%s)
tar -C "$stage" --owner=0 --group=0 --numeric-owner --sort=name --mtime="@$mtime" -cf "$stage.tar" .
sum=$(sha256sum "$stage.tar" | cut -d' ' -f1)
stamp=$out/.nri-vgpu-gpu-bundle.tar.sha256
if [ -f "$tarball" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$sum" ]; then
	log "unchanged since the last build: $tarball kept"
else
	# A name of its own: two builds at once never write one file.
	partial=$(mktemp "$out/.nri-vgpu-gpu-bundle.XXXXXX")
	log "compressing (xz $XZ_OPTIONS)"
	xz -T0 "$XZ_OPTIONS" <"$stage.tar" >"$partial"
	chmod 644 "$partial" # mktemp made it private
	# The stamp goes first, so that it never names another tarball.
	rm -f "$stamp"
	mv -f "$partial" "$tarball"
	partial=""
	echo "$sum" >"$stamp"
fi

# --- size -----------------------------------------------------------------------
bundle_bytes=$(stat -c %s "$tarball")
# What travels besides carried paths: tracked files and untracked ones git
# does not ignore.
tree_bytes=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
unpacked_bytes=$(du -sb "$stage" | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
total=$((bundle_bytes + tree_bytes))
echo "gpu-bundle: $tarball $(mib "$bundle_bytes") ($(mib "$unpacked_bytes") unpacked) + tracked tree $(mib "$tree_bytes") = $(mib "$total") (limit $LIMIT_MIB MiB)"
if ((total >= LIMIT_MIB * 1048576)); then
	rm -f "$tarball" "$stamp"
	die "bundle and tree together reach $(mib "$total"), at or over $LIMIT_MIB MiB: the bundle was removed"
fi
