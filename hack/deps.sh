#!/usr/bin/env bash
# Installs the Debian packages the build and the tests need, when missing.
# Idempotent; prints what it installs.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have gcc     || need+=(gcc)
have make    || need+=(make)
have objdump || need+=(binutils)
have git     || need+=(git)
have clang   || need+=(clang)   # the shim's libFuzzer target

if ((${#need[@]})); then
	if [ "$(id -u)" != 0 ]; then
		echo "deps: missing ${need[*]}; install them (as root: apt-get install ${need[*]})" >&2
		exit 1
	fi
	echo "deps: installing ${need[*]} from Debian's packages"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
if ! have go; then
	echo "deps: Go is required (go 1.26 or newer on PATH)" >&2
	exit 1
fi
