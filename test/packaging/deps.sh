#!/usr/bin/env bash
# hack/deps.sh on fresh Debian roots, as on a new machine that has Go and
# nothing else the build needs (run by make test):
#
#   clang  a minbase root with clang and make but not clang's fuzzer runtime
#          (and Debian's dynamic busybox): the shim's libFuzzer target does
#          not link there and hack/deps.sh --check names the runtime's
#          package; after hack/deps.sh the target links and fuzzes, and
#          /bin/busybox is static as the test images need
#   bare   a minbase root: no compiler, no make; the same after hack/deps.sh
#
# In both, a second hack/deps.sh finds everything working and installs
# nothing.
#
#   test/packaging/deps.sh
#
# Needs root (chroot, mounts) and debootstrap (make deps installs it). Go is
# this machine's, mounted read-only into the roots. The roots are cached as
# tarballs in NRI_VGPU_TEST_CACHE (default /var/cache/nri-vgpu-test; the
# minbase one is test/packaging/packages.sh's), with the packages the roots
# download and their Go build and module caches, so a second run downloads
# next to nothing. On 2 busy cores: 2 to 4 minutes warm, about 4 cold.
set -euo pipefail
cd "$(dirname "$0")/../.."

SUITE=${NRI_VGPU_TEST_SUITE:-bookworm}
MIRROR=${NRI_VGPU_TEST_MIRROR:-http://deb.debian.org/debian}
CACHE=${NRI_VGPU_TEST_CACHE:-/var/cache/nri-vgpu-test}

fails=0
log() { echo "deps-test: $*"; }
fail() {
	echo "deps-test: FAIL: $*" >&2
	fails=$((fails + 1))
}
die() {
	echo "deps-test: $*" >&2
	exit 1
}

if [ "$(id -u)" != 0 ]; then
	log "SKIP: running hack/deps.sh in a chroot needs root"
	exit 0
fi
command -v go >/dev/null || die "go is missing from PATH"
goroot=$(go env GOROOT)
host_ca=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
[ -s "$host_ca" ] || die "no certificates for Go at $host_ca (make deps installs ca-certificates)"

work=$(mktemp -d /tmp/nri-vgpu-deps-test.XXXXXX)
# remove DIR: rm -rf, unless something is mounted beneath it. The roots'
# mounts live in private mount namespaces that end with each command
# (in_root), so none is visible here; this refuses to remove a root if that
# ever stops being true (GOROOT and the caches are mounted there).
remove() {
	if grep -q " $1/" /proc/self/mountinfo; then
		echo "deps-test: mounts left under $1; not removing it" >&2
		return 1
	fi
	rm -rf "$1"
}
trap 'remove "$work"' EXIT

mkdir -p "$CACHE/deps/apt-archives/partial" "$CACHE/deps/go-build" "$CACHE/deps/go-mod"

# in_root ROOT CMD...: CMD in ROOT, as root with a clean environment, with
# /proc, this machine's Go (read-only) and the caches mounted in a private
# mount namespace that ends with CMD.
in_root() {
	local r=$1
	shift
	unshare --mount --propagation private /bin/bash -euc '
		r=$1 goroot=$2 cache=$3
		shift 3
		mount -t proc proc "$r/proc"
		mkdir -p "$r$goroot" "$r/root/.cache/go-build" "$r/root/go/pkg/mod"
		mount --bind "$goroot" "$r$goroot"
		mount -o remount,bind,ro "$r$goroot"
		mount --bind "$cache/deps/apt-archives" "$r/var/cache/apt/archives"
		mount --bind "$cache/deps/go-build" "$r/root/.cache/go-build"
		mount --bind "$cache/deps/go-mod" "$r/root/go/pkg/mod"
		exec chroot "$r" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
			PATH="$goroot/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
			GOTOOLCHAIN=local GOPROXY="$GOPROXY" GOSUMDB="$GOSUMDB" SSL_CERT_FILE=/etc/nri-vgpu-test-ca.crt "$@"
	' in_root "$r" "$goroot" "$CACHE" "$@"
}
export GOPROXY GOSUMDB
GOPROXY=$(go env GOPROXY)
GOSUMDB=$(go env GOSUMDB)

# new_root TARBALL: a fresh root from TARBALL that reaches the mirror and
# starts no services (policy-rc.d, as in any chroot).
new_root() {
	local r
	r=$(mktemp -d "$work/root.XXXXXX")
	tar -C "$r" -xf "$1"
	cp /etc/resolv.conf "$r/etc/resolv.conf"
	# Go in the root trusts what Go here trusts: a site may reach the module
	# proxy only through its own certificate authority.
	cp "$host_ca" "$r/etc/nri-vgpu-test-ca.crt"
	printf '#!/bin/sh\nexit 101\n' >"$r/usr/sbin/policy-rc.d"
	chmod 0755 "$r/usr/sbin/policy-rc.d"
	# A root thrown away after the test needs no fsync per file installed.
	echo force-unsafe-io >"$r/etc/dpkg/dpkg.cfg.d/nri-vgpu-test"
	echo "$r"
}

# save_tarball ROOT TARBALL: cache ROOT, atomically: another run may be
# reading the old one.
save_tarball() {
	local tmp
	tmp=$(mktemp "$2.XXXXXX")
	tar -C "$1" -cf "$tmp" .
	mv "$tmp" "$2"
}

# --- the roots ---------------------------------------------------------------
# The minbase root is the one test/packaging/packages.sh caches, made the
# same way.
minbase="$CACHE/$SUITE-minbase.tar"
if [ ! -f "$minbase" ]; then
	command -v debootstrap >/dev/null || die "debootstrap is missing (make deps installs it)"
	log "creating a $SUITE minbase root with debootstrap (cached in $minbase)"
	mkdir -p "$work/debootstrap"
	debootstrap --variant=minbase "$SUITE" "$work/debootstrap" "$MIRROR" >"$work/debootstrap.log" 2>&1 ||
		{ tail -20 "$work/debootstrap.log" >&2; die "debootstrap failed"; }
	save_tarball "$work/debootstrap" "$minbase"
	rm -rf "$work/debootstrap"
fi

# The machine of the report: clang (and make) installed the way apt-get
# does without recommends, which leaves out the fuzzer runtime; with
# Debian's busybox, which is not the static one the test images need. The
# tarball is named for what it holds.
preinstalled=(clang make busybox)
withclang="$CACHE/$SUITE-minbase+$(IFS=+; echo "${preinstalled[*]}").tar"
if [ ! -f "$withclang" ]; then
	log "creating a $SUITE root with ${preinstalled[*]} (cached in $withclang)"
	r=$(new_root "$minbase")
	in_root "$r" apt-get update -qq >"$work/apt.log" 2>&1 &&
		in_root "$r" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${preinstalled[@]}" >"$work/apt.log" 2>&1 ||
		{ tail -20 "$work/apt.log" >&2; die "installing ${preinstalled[*]} into the root failed"; }
	rm -f "$r/etc/resolv.conf" "$r/usr/sbin/policy-rc.d" "$r/etc/nri-vgpu-test-ca.crt" "$r/etc/dpkg/dpkg.cfg.d/nri-vgpu-test"
	save_tarball "$r" "$withclang"
	remove "$r"
fi

# The sources hack/deps.sh and the shim's build read, in /src.
sources="$work/src.tar"
tar -cf "$sources" --exclude=shim/build hack/deps.sh go.mod go.sum shim

# --- the checks ----------------------------------------------------------------
# deps_fixes NAME ROOT: hack/deps.sh makes ROOT build and run the shim's
# fuzz target, and a second run installs nothing.
deps_fixes() {
	local name=$1 r=$2 out
	log "$name: hack/deps.sh"
	if ! in_root "$r" /src/hack/deps.sh >"$work/$name-deps.log" 2>&1; then
		sed 's/^/    /' "$work/$name-deps.log" >&2
		fail "$name: hack/deps.sh failed"
		return
	fi
	sed -n 's/^deps: /    deps: /p' "$work/$name-deps.log"
	log "$name: the shim's fuzz target links and fuzzes"
	if ! out=$(in_root "$r" make -s -C /src/shim build/fuzz_limits 2>&1); then
		fail "$name: the fuzz target does not link after hack/deps.sh: $out"
		return
	fi
	# As make -C shim test runs it.
	if ! out=$(in_root "$r" make -s -C /src/shim fuzz FUZZTIME=2 2>&1) || ! grep -q 'Done [0-9]* runs' <<<"$out"; then
		fail "$name: the fuzz target does not fuzz after hack/deps.sh: $(tail -n 20 <<<"$out")"
	fi
	# ldd fails on a static executable.
	if in_root "$r" ldd /bin/busybox >/dev/null 2>&1; then
		fail "$name: /bin/busybox is not static after hack/deps.sh"
	fi
	log "$name: hack/deps.sh again"
	if ! out=$(in_root "$r" /src/hack/deps.sh 2>&1); then
		fail "$name: a second hack/deps.sh failed: $out"
	elif [ "$out" != "deps: every prerequisite works ($(go env GOVERSION))" ]; then
		fail "$name: a second hack/deps.sh did more than check: $out"
	fi
}

log "clang: a root with clang but not its fuzzer runtime"
r=$(new_root "$withclang")
tar -C "$r" -xf "$sources" --transform 's,^,src/,'
in_root "$r" ldd /bin/busybox >/dev/null 2>&1 ||
	fail "clang: /bin/busybox is not Debian's dynamic one before hack/deps.sh"
# What the report saw: the link fails for want of the runtime.
if out=$(in_root "$r" make -s -C /src/shim build/fuzz_limits 2>&1); then
	fail "clang: the fuzz target links before hack/deps.sh: the root is not the one of the report"
elif ! grep -q 'cannot find .*libclang_rt\.fuzzer' <<<"$out"; then
	fail "clang: the fuzz target fails to link for another reason than the missing runtime: $out"
fi
version=$(in_root "$r" clang -dumpversion) || die "clang -dumpversion failed in the root"
if out=$(in_root "$r" /src/hack/deps.sh --check 2>&1); then
	fail "clang: hack/deps.sh --check finds nothing missing"
elif ! grep -q "^deps: missing: .*libfuzzer.*installs .*libclang-rt-${version%%.*}-dev" <<<"$out"; then
	fail "clang: hack/deps.sh --check does not name libclang-rt-${version%%.*}-dev for libfuzzer: $out"
fi
deps_fixes clang "$r"
remove "$r"

log "bare: a minbase root"
r=$(new_root "$minbase")
tar -C "$r" -xf "$sources" --transform 's,^,src/,'
if in_root "$r" sh -c 'command -v clang || command -v gcc || command -v make' >/dev/null; then
	fail "bare: the minbase root already has a compiler or make"
fi
deps_fixes bare "$r"
remove "$r"

if ((fails)); then
	die "$fails check(s) failed"
fi
log "hack/deps.sh makes a bare root and one with clang alone build the shim's fuzz target"
