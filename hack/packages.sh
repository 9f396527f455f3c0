#!/usr/bin/env bash
# Builds the node packages, dist/nri-vgpu_<version>-1_<arch>.deb and
# dist/nri-vgpu-<version>-1.<arch>.rpm, with nfpm (pinned below, installed
# into .tools/ on first use) from packaging/nfpm.yaml. The binaries in bin/
# and the shim in shim/build/ must be built first (make packages does that);
# BIN, SHIM and DIST override those places, NODE_CONFIG the packaged config.
#
#   hack/packages.sh             build both packages
#   hack/packages.sh --version   print the package version and exit
#
# The version comes from git, in a form that dpkg and rpm both order
# correctly (override with NRI_VGPU_VERSION):
#   tag v1.2.3                          1.2.3
#   3 commits after v1.2.3              1.2.3+git3.g<sha>
#   tag v1.3.0-rc.1                     1.3.0~rc.1     (sorts before 1.3.0)
#   no tag                              0.0.0~git<commit date>.<sha>
#   uncommitted changes                 ... .dirty appended
set -euo pipefail
cd "$(dirname "$0")/.."

NFPM_VERSION=v2.45.2
NFPM=${NFPM:-$PWD/.tools/nfpm-$NFPM_VERSION/nfpm}
DIST=${DIST:-$PWD/dist}
# Inputs (the test suite points them elsewhere to build an upgrade).
BIN=${BIN:-$PWD/bin}
SHIM=${SHIM:-$PWD/shim/build/libvgpu-shim.so}
# The file shipped as /etc/nri-vgpu/config.toml; empty: the node variant of
# packaging/config.toml (a site may ship its own defaults this way).
NODE_CONFIG=${NODE_CONFIG:-}

package_version() {
	if [ -n "${NRI_VGPU_VERSION:-}" ]; then
		echo "$NRI_VGPU_VERSION"
		return
	fi
	local v desc
	if desc=$(git describe --tags --match 'v[0-9]*' 2>/dev/null); then
		desc=${desc#v}
		local ahead=""
		if [[ $desc =~ ^(.*)-([0-9]+)-g([0-9a-f]+)$ ]]; then
			desc=${BASH_REMATCH[1]}
			ahead="+git${BASH_REMATCH[2]}.g${BASH_REMATCH[3]}"
		fi
		# A pre-release suffix sorts before the release: "~" in both
		# formats; rpm allows no "-" in a version at all.
		desc=${desc/-/\~}
		v=${desc//-/.}$ahead
	else
		local date sha
		date=$(git log -1 --format=%cd --date=format:%Y%m%d) ||
			{ echo "packages: not a git checkout; set NRI_VGPU_VERSION" >&2; return 1; }
		sha=$(git rev-parse --short=7 HEAD)
		v="0.0.0~git$date.$sha"
	fi
	if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
		v="$v.dirty"
	fi
	echo "$v"
}

if [ "${1:-}" = "--version" ]; then
	package_version
	exit 0
fi

version=$(package_version)
arch=${GOARCH:-$(go env GOARCH)}

missing=()
for f in "$BIN/nri-vgpu" "$BIN/nri-vgpu-device-plugin" "$BIN/nri-vgpu-runtime" "$SHIM"; do
	[ -f "$f" ] || missing+=("$f")
done
if ((${#missing[@]})); then
	echo "packages: missing ${missing[*]}: run make build first (make packages does)" >&2
	exit 1
fi

if [ ! -x "$NFPM" ]; then
	echo "packages: installing nfpm $NFPM_VERSION into $(dirname "$NFPM")"
	GOBIN=$(dirname "$NFPM") go install "github.com/goreleaser/nfpm/v2/cmd/nfpm@$NFPM_VERSION"
fi

# The C library the host binaries need: the highest GLIBC_x.y symbol version
# they use (Go's cgo binaries built on Debian 12 need 2.34). The shim is left
# out: it runs inside containers, not on the host.
glibc=$(for f in "$BIN/nri-vgpu" "$BIN/nri-vgpu-device-plugin" "$BIN/nri-vgpu-runtime"; do
	objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' || true
done | sed 's/^GLIBC_//' | sort -uV | tail -1)
glibc=${glibc:-2.2.5}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
if [ -n "$NODE_CONFIG" ]; then
	cp "$NODE_CONFIG" "$stage/config.toml"
else
	hack/node-config.sh packaging/config.toml >"$stage/config.toml"
fi

# Reproducible archives: file times from the commit, not from the build.
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
export SOURCE_DATE_EPOCH NRI_VGPU_VERSION="$version" NRI_VGPU_ARCH="$arch" NRI_VGPU_STAGE="$stage" \
	NRI_VGPU_BIN="$BIN" NRI_VGPU_SHIM="$SHIM" NRI_VGPU_GLIBC="$glibc"

mkdir -p "$DIST"
rm -f "$DIST"/nri-vgpu_*.deb "$DIST"/nri-vgpu-*.rpm
for packager in deb rpm; do
	if ! out=$("$NFPM" package --config packaging/nfpm.yaml --packager "$packager" --target "$DIST/" 2>&1); then
		echo "$out" >&2
		echo "packages: nfpm failed to build the $packager package" >&2
		exit 1
	fi
done
ls -1 "$DIST"/nri-vgpu_*.deb "$DIST"/nri-vgpu-*.rpm
