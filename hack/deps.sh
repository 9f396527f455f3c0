#!/usr/bin/env bash
# Makes this Debian machine able to run every target of `make test` (make
# deps runs it first). Go is the one prerequisite it leaves to the user:
# Debian's Go is too old. Everything else is checked by doing what the build
# does with it, never by looking for a command: a command can be there
# without what it needs (clang without its libFuzzer runtime links nothing
# with -fsanitize=fuzzer). What fails is installed from Debian's packages and
# checked again.
#
#   hack/deps.sh           check; as root install what is missing; check again
#   hack/deps.sh --check   check only: exit 1 naming what is missing
#
# What is checked, for which targets, and the packages that provide it:
#   ca-bundle   Go verifies the module proxy's certificate (go install of
#               staticcheck, helm, nfpm, containerd)          ca-certificates
#   go-modules  the module's dependencies download (every Go target)
#   c-shared    gcc builds a shared library like the shim's and objdump -T
#               lists its symbols (build, test-shim)      gcc libc6-dev binutils
#   cgo-race    a cgo program builds with -race and runs (test-go, lint, build)
#                                                             gcc libc6-dev
#   make        make runs a makefile (build, test-shim, test-go)         make
#   git         git lists a work tree's files (lint, fuzz, packages)     git
#   libfuzzer   clang links a libFuzzer target with the shim's sanitizers and
#               it runs (test-shim)            clang libclang-rt-<N>-dev
#   python3     python3 runs with what the shim tests import (test-shim)
#                                                                     python3
#   patch       patch applies a unified diff (test-go)                  patch
#   strace      strace follows a program's threads and counts their system
#               calls (test-shim)                                      strace
#   debootstrap debootstrap knows the test roots' suite (test-packages)
#                                                                debootstrap
#   rpm         rpm initialises and queries a root (test-packages)        rpm
#   dpkg-deb    dpkg-deb builds and reads a package (test-packages)      dpkg
#   lintian     lintian lints a package (test-packages)               lintian
#   rpmlint     rpmlint runs (test-packages)                          rpmlint
#   runc        runc runs (test-e2e)                                     runc
#   busybox     a static /bin/busybox for the test images (test-e2e,
#               test-docker)                                   busybox-static
#   docker      /usr/sbin/dockerd and /usr/bin/docker run (test-docker)
#                                                                   docker.io
#   libseccomp  gcc links a static program with libseccomp found through
#               pkg-config, as the GPU bundle's static runc (gpu-bundle,
#               test-gpu-check)                    libseccomp-dev pkg-config
#
# Environment: NRI_VGPU_TEST_SUITE, the Debian suite of the package tests'
# roots (default bookworm), as test/packaging/packages.sh reads it.
set -euo pipefail
cd "$(dirname "$0")/.."

check_only=false
case "${1:-}" in
"") ;;
--check) check_only=true ;;
*)
	echo "deps: unknown argument '$1' (usage: hack/deps.sh [--check])" >&2
	exit 2
	;;
esac

log() { echo "deps: $*" >&2; }

if ! command -v go >/dev/null 2>&1; then
	log "Go is the one prerequisite: put go 1.26 or newer on PATH (https://go.dev/dl/)"
	exit 1
fi

tmp=$(mktemp -d /tmp/nri-vgpu-deps.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# Each check_<name> returns 0 when the capability works. Otherwise it sets
# NEED to the Debian packages that provide it (empty when no package would:
# its log then says why). Its output goes to $tmp/<name>.log.
NEED=""

# have CMD: CMD is on PATH; says so in the log when not.
have() {
	command -v "$1" >/dev/null && return 0
	echo "$1: not on PATH"
	return 1
}

# The certificates Go trusts: SSL_CERT_FILE, else the file it reads first on
# Debian (ca-certificates').
ca_bundle=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}

check_ca_bundle() {
	[ -s "$ca_bundle" ] && return 0
	echo "$ca_bundle is missing or empty"
	NEED=ca-certificates
	return 1
}

check_go_modules() {
	# Also leaves the module cache filled, so the build needs no network.
	go mod download && return 0
	NEED=""
	[ -s "$ca_bundle" ] || NEED=ca-certificates
	return 1
}

check_c_shared() {
	local d=$tmp/c-shared
	mkdir -p "$d"
	cat >"$d/lib.c" <<-'EOF'
		#include <dlfcn.h>
		#include <pthread.h>
		__attribute__((visibility("default"))) int nri_vgpu_probe(void) {
			return dlsym(RTLD_DEFAULT, "pthread_self") != 0;
		}
	EOF
	# The shim's link: shared, no undefined symbols, libdl and libpthread by name.
	NEED="gcc libc6-dev"
	gcc -std=gnu11 -O2 -fPIC -fvisibility=hidden -shared -Wl,-z,defs -Wl,--no-as-needed \
		-o "$d/libprobe.so" "$d/lib.c" -l:libdl.so.2 -l:libpthread.so.0 || return 1
	NEED=binutils
	local symbols
	symbols=$(objdump -T "$d/libprobe.so") || return 1
	grep -q ' nri_vgpu_probe$' <<<"$symbols"
}

check_cgo_race() {
	local d=$tmp/cgo-race
	mkdir -p "$d"
	printf 'module probe\n\ngo 1.21\n' >"$d/go.mod"
	cat >"$d/main.go" <<-'EOF'
		package main

		// static int answer(void) { return 42; }
		import "C"

		import "fmt"

		func main() { fmt.Println(C.answer()) }
	EOF
	NEED="gcc libc6-dev"
	# GOFLAGS and GOWORK from the caller could point at files the probe lacks.
	(cd "$d" && CGO_ENABLED=1 GOFLAGS= GOWORK=off go build -race -o probe .) || return 1
	[ "$("$d/probe")" = 42 ] || return 1
}

check_make() {
	printf 'all:\n\t@echo made\n' >"$tmp/Makefile"
	NEED=make
	[ "$(make -s -f "$tmp/Makefile")" = made ]
}

check_git() {
	local d=$tmp/git
	mkdir -p "$d"
	touch "$d/tracked"
	NEED=git
	git -C "$d" init -q && git -C "$d" add tracked &&
		[ "$(git -C "$d" ls-files -co --exclude-standard)" = tracked ]
}

check_libfuzzer() {
	local d=$tmp/libfuzzer
	mkdir -p "$d"
	cat >"$d/fuzz.c" <<-'EOF'
		#include <stddef.h>
		#include <stdint.h>
		int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
			return size > 0 && data[0] == 0xff ? 0 : 0;
		}
	EOF
	NEED=clang
	have clang || return 1
	# The flags of shim/Makefile's fuzz_limits rule.
	if ! clang -g -O1 -fsanitize=fuzzer,address,undefined -o "$d/fuzz" "$d/fuzz.c"; then
		# The sanitizer and fuzzer runtimes come apart from clang in Debian,
		# in the package named for clang's major version.
		local version
		version=$(clang -dumpversion) || return 1
		NEED=libclang-rt-${version%%.*}-dev
		return 1
	fi
	NEED=""
	"$d/fuzz" -runs=1
}

check_python3() {
	NEED=python3
	[ "$(python3 -c 'import fcntl, os, struct, sys, time; print(struct.calcsize("q"))')" = 8 ]
}

check_strace() {
	NEED=strace
	strace -f -o /dev/null -e trace=fcntl true
}

check_patch() {
	local d=$tmp/patch
	mkdir -p "$d"
	printf 'a\n' >"$d/f"
	printf -- '--- f\n+++ f\n@@ -1 +1 @@\n-a\n+b\n' >"$d/f.diff"
	NEED=patch
	(cd "$d" && patch -s -p0 <f.diff) && [ "$(cat "$d/f")" = b ]
}

check_debootstrap() {
	local suite=${NRI_VGPU_TEST_SUITE:-bookworm}
	NEED=debootstrap
	have debootstrap || return 1
	# An older debootstrap has no script for a newer suite.
	[ -e "${DEBOOTSTRAP_DIR:-/usr/share/debootstrap}/scripts/$suite" ] ||
		{ echo "debootstrap has no script for $suite"; return 1; }
}

check_rpm() {
	NEED=rpm
	rpm --root "$tmp/rpmroot" --initdb && rpm --root "$tmp/rpmroot" -qa >/dev/null
}

# probe_deb: a minimal package in $tmp/deb/probe.deb.
probe_deb() {
	local d=$tmp/deb
	[ -f "$d/probe.deb" ] && return 0
	mkdir -p "$d/pkg/DEBIAN"
	printf 'Package: probe\nVersion: 1\nArchitecture: all\nMaintainer: probe <probe@localhost>\nDescription: probe\n' >"$d/pkg/DEBIAN/control"
	dpkg-deb --root-owner-group -b "$d/pkg" "$d/probe.deb" >/dev/null
}

check_dpkg_deb() {
	NEED=dpkg
	probe_deb && [ "$(dpkg-deb -f "$tmp/deb/probe.deb" Package)" = probe ]
}

check_lintian() {
	probe_deb || return 1
	NEED=lintian
	# Tags are expected on so bare a package; a run that cannot lint fails.
	lintian --fail-on none "$tmp/deb/probe.deb"
}

check_rpmlint() {
	NEED=rpmlint
	rpmlint --version
}

check_runc() {
	NEED=runc
	# The e2e harness takes runc from PATH, else Debian's /usr/sbin/runc.
	local runc
	runc=$(command -v runc || echo /usr/sbin/runc)
	"$runc" --version
}

check_busybox() {
	# The test images get /bin/busybox and nothing else: it must be static
	# (Debian's busybox package is dynamic) and provide a shell.
	NEED=busybox-static
	local applets
	applets=$(/bin/busybox --list) && grep -qx sh <<<"$applets" || return 1
	if ldd /bin/busybox; then
		echo "/bin/busybox is dynamically linked"
		return 1
	fi
	return 0
}

check_docker() {
	# The paths test/docker runs.
	NEED=docker.io
	local b
	for b in /usr/sbin/dockerd /usr/bin/docker; do
		[ -x "$b" ] || { echo "$b: not installed"; return 1; }
		"$b" --version || return 1
	done
}

check_libseccomp() {
	local d=$tmp/libseccomp flags
	mkdir -p "$d"
	cat >"$d/probe.c" <<-'EOF'
		#include <seccomp.h>
		#include <stdio.h>
		int main(void) {
			const struct scmp_version *v = seccomp_version();
			printf("%u\n", v->major);
			return 0;
		}
	EOF
	NEED="libseccomp-dev pkg-config"
	flags=$(pkg-config --cflags --libs libseccomp) || return 1
	# shellcheck disable=SC2086 # $flags is several words
	gcc -static -o "$d/probe" "$d/probe.c" $flags || return 1
	[ "$("$d/probe")" = 2 ]
}

checks=(ca_bundle go_modules c_shared cgo_race make git libfuzzer python3 patch strace debootstrap rpm dpkg_deb lintian rpmlint runc busybox docker libseccomp)

# run_checks sets failed to the checks that fail, needed to the packages
# they ask for and need_of[check] to each one's.
failed=()
needed=()
declare -A need_of
run_checks() {
	failed=() needed=() need_of=()
	local c p
	for c in "${checks[@]}"; do
		NEED=""
		if ! "check_$c" >"$tmp/$c.log" 2>&1; then
			failed+=("$c")
			need_of[$c]=$NEED
			for p in $NEED; do
				[[ " ${needed[*]} " == *" $p "* ]] || needed+=("$p")
			done
		fi
	done
}

report_failures() {
	local c
	for c in "${failed[@]}"; do
		log "${c//_/-} does not work:"
		tail -n 15 "$tmp/$c.log" | sed 's/^/    /' >&2
	done
}

updated=false
installed=()
# Installing can make the next round ask for more: the libFuzzer runtime's
# package is known only once clang is there. Each round installs something
# new or ends.
for _ in 1 2 3; do
	run_checks
	if ((${#failed[@]} == 0)); then
		if ((${#installed[@]})); then
			log "installed ${installed[*]}; every prerequisite works now"
		else
			log "every prerequisite works ($(go env GOVERSION))"
		fi
		exit 0
	fi
	new=()
	for p in "${needed[@]}"; do
		[[ " ${installed[*]} " == *" $p "* ]] || new+=("$p")
	done
	if $check_only; then
		report_failures
		log "missing: ${failed[*]//_/-}; hack/deps.sh as root installs ${needed[*]:-nothing that would help}"
		exit 1
	fi
	if ((${#new[@]} == 0)); then
		break
	fi
	if [ "$(id -u)" != 0 ]; then
		report_failures
		log "missing: ${failed[*]//_/-}; install them as root: apt-get install ${new[*]}"
		exit 1
	fi
	if ! command -v apt-get >/dev/null; then
		report_failures
		log "missing: ${failed[*]//_/-}; there is no apt-get here to install ${new[*]}"
		exit 1
	fi
	if ! $updated; then
		log "apt-get update"
		apt-get -o DPkg::Lock::Timeout=600 update -qq
		updated=true
	fi
	for c in "${failed[@]}"; do
		[ -z "${need_of[$c]}" ] || log "${c//_/-} does not work: missing ${need_of[$c]}"
	done
	log "installing ${new[*]} from Debian's packages"
	# RUNLEVEL=1 keeps invoke-rc.d from starting what it installs (docker.io).
	DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get -o DPkg::Lock::Timeout=600 \
		install -y -qq --no-install-recommends "${new[@]}" >"$tmp/apt.log" 2>&1 ||
		{ tail -n 20 "$tmp/apt.log" >&2; log "apt-get install ${new[*]} failed"; exit 1; }
	installed+=("${new[@]}")
done
report_failures
log "still missing after installing ${installed[*]:-nothing}: ${failed[*]//_/-}"
exit 1
