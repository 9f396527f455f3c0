#!/usr/bin/env bash
# Builds the node packages, dist/nri-vgpu_<version>-1_<arch>.deb and
# dist/nri-vgpu-<version>-1.<arch>.rpm, with nfpm (pinned below, installed
# into .tools/ on first use) from packaging/nfpm.yaml, and the packages of
# their debug symbols, dist/nri-vgpu-dbgsym_<version>-1_<arch>.deb and
# dist/nri-vgpu-debuginfo-<version>-1.<arch>.rpm (packaging/nfpm-dbgsym.yaml),
# and the release archive of kubectl nri-vgpu for operators' machines,
# dist/kubectl-nri_vgpu_<version>_linux_<arch>.tar.gz (the stripped binary,
# LICENSE and README.md, as krew installs a plugin) with its .sha256.
# The binaries in bin/ and the shim in shim/build/ must be built first, with
# their debug information (make packages does that); BIN, SHIM and DIST
# override those places, NODE_CONFIG the packaged config.
#
# Made here for the packages: stripped copies of the binaries, their debug
# information split off and filed by build ID (as Debian's dh_strip and
# rpm's find-debuginfo do), the manual pages (hack/manpage, from the
# commands' doc comments and -h) and a changelog entry for the version.
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
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
arch=${GOARCH:-$(go env GOARCH)}

missing=()
for f in "$BIN/nri-vgpu" "$BIN/nri-vgpu-device-plugin" "$BIN/nri-vgpu-runtime" "$BIN/nri-vgpu-dra-driver" "$BIN/kubectl-nri_vgpu" "$SHIM"; do
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
# out: it runs inside containers, not on the host; kubectl-nri_vgpu is
# statically linked.
glibc=$(for f in "$BIN/nri-vgpu" "$BIN/nri-vgpu-device-plugin" "$BIN/nri-vgpu-runtime" "$BIN/nri-vgpu-dra-driver"; do
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
maintainer="nri-vgpu maintainers <maintainers@nri-vgpu.io>"

# --- debug symbols: split off, filed by build ID --------------------------------
debug="$stage/debug"
build_ids=()
# split_debug FILE [STRIP-FLAG...]: moves FILE's debug information to
# $debug/usr/lib/debug/.build-id/NN/REST.debug and strips FILE.
split_debug() {
	local f=$1 id dbg sections
	shift
	id=$(readelf -n "$f" | sed -n 's/^[[:space:]]*Build ID: *\([0-9a-f]*\)$/\1/p' | head -1)
	if [ -z "$id" ]; then
		echo "packages: $f has no GNU build ID to file its debug symbols under (link with --build-id; Go: -ldflags=-B=gobuildid)" >&2
		exit 1
	fi
	# (Into a variable first: grep -q would stop reading, and pipefail
	# report readelf's broken pipe.)
	sections=$(readelf -S --wide "$f")
	if ! grep -Eq '[[:space:]]\.z?debug_info[[:space:]]' <<<"$sections"; then
		echo "packages: $f has no debug information (.debug_info): build it without -s -w (Go) or with -g (C), as make build does" >&2
		exit 1
	fi
	dbg="$debug/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug"
	mkdir -p "$(dirname "$dbg")"
	objcopy --only-keep-debug --compress-debug-sections "$f" "$dbg"
	chmod 0644 "$dbg"
	strip --remove-section=.comment --remove-section=.note "$@" "$f"
	objcopy --add-gnu-debuglink="$dbg" "$f"
	build_ids+=("$id")
}
mkdir -p "$stage/bin" "$stage/lib"
for f in nri-vgpu nri-vgpu-device-plugin nri-vgpu-runtime nri-vgpu-dra-driver kubectl-nri_vgpu; do
	cp "$BIN/$f" "$stage/bin/$f"
	split_debug "$stage/bin/$f"
done
cp "$SHIM" "$stage/lib/libvgpu-shim.so"
# A shared library keeps the symbols others link against.
split_debug "$stage/lib/libvgpu-shim.so" --strip-unneeded

# --- manual pages ------------------------------------------------------------------
# hack/manpage runs the commands for their -h: when bin/ holds binaries for
# another architecture, the same commands built for this machine stand in.
helpbin=$BIN
if [ "$arch" != "$(go env GOHOSTARCH)" ]; then
	helpbin="$stage/helpbin"
	for cmd in nri-vgpu:nri-vgpu nri-vgpu-device-plugin:device-plugin nri-vgpu-runtime:nri-vgpu-runtime nri-vgpu-dra-driver:dra-driver kubectl-nri_vgpu:kubectl-nri_vgpu; do
		GOOS= GOARCH= go build -o "$helpbin/${cmd%%:*}" "./cmd/${cmd#*:}"
	done
fi
mkdir -p "$stage/man"
go run ./hack/manpage -bin "$helpbin" -out "$stage/man" -version "$version" \
	-date "$(date -u -d "@$SOURCE_DATE_EPOCH" +%F)"
gzip -9n "$stage"/man/*.1

# --- changelog: one entry, this version (nfpm writes it in each format) -----------
cat >"$stage/changelog.yml" <<CHANGELOG
- semver: "$version-1"
  date: $(date -u -d "@$SOURCE_DATE_EPOCH" +%FT%TZ)
  packager: "$maintainer"
  deb:
    urgency: medium
    distributions: [unstable]
  changes:
    - note: "Built from the nri-vgpu source at commit $commit."
CHANGELOG

export SOURCE_DATE_EPOCH NRI_VGPU_VERSION="$version" NRI_VGPU_ARCH="$arch" NRI_VGPU_STAGE="$stage" \
	NRI_VGPU_BIN="$stage/bin" NRI_VGPU_SHIM="$stage/lib/libvgpu-shim.so" NRI_VGPU_GLIBC="$glibc" \
	NRI_VGPU_MAINTAINER="$maintainer" NRI_VGPU_DEBUG_DIR="$debug"

# package CONFIG PACKAGER [YAML-LINE...]: nfpm on CONFIG with the lines added
# (what a fixed file cannot hold: the changelog's path, the build IDs).
package() {
	local config=$1 packager=$2 conf out
	shift 2
	conf="$stage/$(basename "$config" .yaml)-$packager.yaml"
	{
		cat "$config"
		printf '%s\n' "$@"
	} >"$conf"
	if ! out=$("$NFPM" package --config "$conf" --packager "$packager" --target "$DIST/" 2>&1); then
		echo "$out" >&2
		echo "packages: nfpm failed to build the $packager package of $config" >&2
		exit 1
	fi
}

mkdir -p "$DIST"
rm -f "$DIST"/nri-vgpu_*.deb "$DIST"/nri-vgpu-[0-9]*.rpm "$DIST"/nri-vgpu-dbgsym_*.deb "$DIST"/nri-vgpu-debuginfo-*.rpm \
	"$DIST"/kubectl-nri_vgpu_*.tar.gz "$DIST"/kubectl-nri_vgpu_*.tar.gz.sha256
package packaging/nfpm.yaml deb "changelog: $stage/changelog.yml"
package packaging/nfpm.yaml rpm "changelog: $stage/changelog.yml"
# Debian's debug packages are marked as such and list the build IDs they
# hold (as dh_strip makes them); they share the main package's changelog.
NRI_VGPU_DEBUG_NAME=nri-vgpu-dbgsym package packaging/nfpm-dbgsym.yaml deb \
	"deb:" "  compression: xz" "  fields:" "    Auto-Built-Package: debug-symbols" "    Build-Ids: ${build_ids[*]}"
NRI_VGPU_DEBUG_NAME=nri-vgpu-debuginfo package packaging/nfpm-dbgsym.yaml rpm "changelog: $stage/changelog.yml"

# --- kubectl nri-vgpu's release archive -------------------------------------------
# Reproducible as the packages are: fixed times, owners and order.
plugin="kubectl-nri_vgpu_${version}_linux_${arch}.tar.gz"
mkdir -p "$stage/plugin"
cp "$stage/bin/kubectl-nri_vgpu" LICENSE README.md "$stage/plugin/"
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner --mode=go-w \
	-C "$stage/plugin" -cf - kubectl-nri_vgpu LICENSE README.md | gzip -9n >"$DIST/$plugin"
(cd "$DIST" && sha256sum "$plugin" >"$plugin.sha256")

ls -1 "$DIST"/nri-vgpu_*.deb "$DIST"/nri-vgpu-dbgsym_*.deb "$DIST"/nri-vgpu-[0-9]*.rpm "$DIST"/nri-vgpu-debuginfo-*.rpm \
	"$DIST/$plugin" "$DIST/$plugin.sha256"
