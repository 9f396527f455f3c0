#!/usr/bin/env bash
# Lints the node packages the way distributions check theirs: lintian on the
# debs, rpmlint on the rpms (run by make test-packages after make packages).
# Fails on any error that has no written override: the deb's
# /usr/share/lintian/overrides/nri-vgpu (packaging/deb/lintian-overrides) and
# packaging/rpmlint.toml, each override with its reason. Warnings and
# lintian's informational tags are shown, and fail nothing.
#
#   test/packaging/lint.sh [DIST]     packages from DIST (default dist/)
#
# Installs lintian, rpmlint and rpm from Debian's packages when missing
# (root only).
set -euo pipefail
cd "$(dirname "$0")/../.."

DIST=${1:-dist}

log() { echo "lint: $*"; }
die() {
	echo "lint: $*" >&2
	exit 1
}

shopt -s nullglob
debs=("$DIST"/nri-vgpu_*.deb "$DIST"/nri-vgpu-dbgsym_*.deb)
rpms=("$DIST"/nri-vgpu-[0-9]*.rpm "$DIST"/nri-vgpu-debuginfo-*.rpm)
shopt -u nullglob
[ ${#debs[@]} = 2 ] && [ ${#rpms[@]} = 2 ] ||
	die "want nri-vgpu and its debug symbols as one .deb and one .rpm each in $DIST (make packages), found: ${debs[*]:-no deb} ${rpms[*]:-no rpm}"

need=()
command -v lintian >/dev/null || need+=(lintian)
command -v rpmlint >/dev/null || need+=(rpmlint)
command -v rpm >/dev/null || need+=(rpm)
if ((${#need[@]})); then
	[ "$(id -u)" = 0 ] || die "${need[*]} missing: apt-get install ${need[*]} (or run this as root, which installs them)"
	log "installing ${need[*]} from Debian's packages"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
lintian --version >/dev/null || die "lintian does not run"
rpmlint --version >/dev/null || die "rpmlint does not run"

work=$(mktemp -d /tmp/nri-vgpu-lint.XXXXXX)
trap 'rm -rf "$work"' EXIT
fails=0

# --- lintian -------------------------------------------------------------------
log "lintian ${debs[*]##*/}"
set +e
out=$(lintian --fail-on error --display-info "${debs[@]}" 2>&1)
rc=$?
set -e
# lintian's note on running as root is not about the packages.
out=$(grep -v '^running with root privileges is not recommended!$' <<<"$out" || true)
[ -z "$out" ] || echo "$out"
log "lintian: $(grep -c '^E: ' <<<"$out" || true) errors, $(grep -c '^W: ' <<<"$out" || true) warnings"
if [ "$rc" != 0 ]; then
	echo "lint: FAIL: lintian reports errors without an override (exit status $rc)" >&2
	fails=$((fails + 1))
fi

# --- rpmlint -------------------------------------------------------------------
# rpmlint unpacks a package with "rpm2cpio | cpio -id" in a temporary
# directory. nfpm (v2.45) writes the payload's names as absolute paths, which
# GNU cpio writes to / itself: over this machine's files, and with rpmlint
# then checking an empty directory. A cpio that refuses absolute names (and
# leaves a mark that it ran) stands in for the real one.
mkdir "$work/path"
cat >"$work/path/cpio" <<EOF
#!/bin/sh
: >"$work/cpio-ran"
exec $(command -v cpio) --no-absolute-filenames "\$@"
EOF
chmod 0755 "$work/path/cpio"

log "rpmlint ${rpms[*]##*/}"
set +e
out=$(PATH="$work/path:$PATH" rpmlint -c packaging/rpmlint.toml "${rpms[@]}" 2>&1)
rc=$?
set -e
# The report, without rpmlint's banner (its version and configuration).
if grep -q '^checks:' <<<"$out"; then
	sed -n '/^checks:/,$p' <<<"$out" | tail -n +2
else
	echo "$out"
fi
[ -e "$work/cpio-ran" ] || die "rpmlint did not unpack through $work/path/cpio: refusing to trust its report"
if [ "$rc" != 0 ]; then
	echo "lint: FAIL: rpmlint reports errors without a filter in packaging/rpmlint.toml (exit status $rc)" >&2
	fails=$((fails + 1))
fi

if ((fails)); then
	die "$fails linter(s) failed"
fi
log "lintian and rpmlint report no error without a written override"
