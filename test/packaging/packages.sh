#!/usr/bin/env bash
# Installs the node packages the way an administrator would and checks the
# result (run by make test after make packages):
#
#   deb  dpkg -i into a fresh Debian root (debootstrap minbase), files, modes,
#        the packaged config, binaries that load there, manual pages, the
#        changelog; an upgrade keeps a locally edited config (also when the
#        new package changes it: the new default lands in
#        config.toml.dpkg-dist); removal leaves no binaries, purge leaves
#        nothing at all; with a (stand-in) running systemd the maintainer
#        scripts reload units but start, restart or enable nothing, and
#        removal stops the services and takes away the links that enabled
#        them; the debug symbols package holds the symbols of the stripped
#        binaries, found by build ID.
#   rpm  the file list, modes and flags (rpm -qlp, --qf), then rpm -i/-U/-e
#        into a fresh root: same checks, with config.toml.rpmnew/.rpmsave,
#        and the debuginfo package.
#
#   test/packaging/packages.sh [DIST]     packages from DIST (default dist/)
#
# The upgrades are built from the same inputs with hack/packages.sh and a
# higher version. Needs root (chroot); installs debootstrap and rpm when
# missing. The Debian root is cached as a tarball (NRI_VGPU_TEST_CACHE,
# default /var/cache/nri-vgpu-test): the first run takes about a minute more.
set -euo pipefail
cd "$(dirname "$0")/../.."

DIST=${1:-dist}
SUITE=${NRI_VGPU_TEST_SUITE:-bookworm}
MIRROR=${NRI_VGPU_TEST_MIRROR:-http://deb.debian.org/debian}
CACHE=${NRI_VGPU_TEST_CACHE:-/var/cache/nri-vgpu-test}

fails=0
log() { echo "packages-test: $*"; }
fail() {
	echo "packages-test: FAIL: $*" >&2
	fails=$((fails + 1))
}
die() {
	echo "packages-test: $*" >&2
	exit 1
}

if [ "$(id -u)" != 0 ]; then
	log "SKIP: installing packages into a chroot needs root"
	exit 0
fi

shopt -s nullglob
debs=("$DIST"/nri-vgpu_*.deb)
rpms=("$DIST"/nri-vgpu-[0-9]*.rpm)
dbgdebs=("$DIST"/nri-vgpu-dbgsym_*.deb)
dbgrpms=("$DIST"/nri-vgpu-debuginfo-*.rpm)
shopt -u nullglob
[ ${#debs[@]} = 1 ] && [ ${#rpms[@]} = 1 ] && [ ${#dbgdebs[@]} = 1 ] && [ ${#dbgrpms[@]} = 1 ] ||
	die "want exactly one nri-vgpu .deb and .rpm and one of each for its debug symbols in $DIST (make packages), found ${debs[*]:-no deb} ${rpms[*]:-no rpm} ${dbgdebs[*]:-no dbgsym deb} ${dbgrpms[*]:-no debuginfo rpm}"
deb1=$(realpath "${debs[0]}")
deps=$(dpkg-deb -f "$deb1" Depends)
rpm1=$(realpath "${rpms[0]}")
dbgdeb=$(realpath "${dbgdebs[0]}")
dbgrpm=$(realpath "${dbgrpms[0]}")

need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v rpm >/dev/null || need+=(rpm)
if ((${#need[@]})); then
	log "installing ${need[*]} from Debian's packages"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

work=$(mktemp -d /tmp/nri-vgpu-packages.XXXXXX)
trap 'rm -rf "$work"' EXIT

# --- inputs: the packages, and two upgrades ---------------------------------
version=$(dpkg-deb -f "$deb1" Version)
version=${version%-*} # without the package release
edited_default="$work/config-v3.toml"
dpkg-deb --fsys-tarfile "$deb1" | tar -xO ./etc/nri-vgpu/config.toml >"$edited_default"
echo "# A default that changed in the next release." >>"$edited_default"
log "building upgrades $version+t2 (same config) and $version+t3 (changed config)"
DIST="$work/v2" NRI_VGPU_VERSION="$version+t2" hack/packages.sh >"$work/build.log" 2>&1 ||
	{ cat "$work/build.log" >&2; die "building the upgrade package failed"; }
DIST="$work/v3" NRI_VGPU_VERSION="$version+t3" NODE_CONFIG="$edited_default" hack/packages.sh >"$work/build.log" 2>&1 ||
	{ cat "$work/build.log" >&2; die "building the second upgrade package failed"; }
deb2=$(echo "$work"/v2/nri-vgpu_*.deb) deb3=$(echo "$work"/v3/nri-vgpu_*.deb)
rpm2=$(echo "$work"/v2/nri-vgpu-[0-9]*.rpm) rpm3=$(echo "$work"/v3/nri-vgpu-[0-9]*.rpm)

# --- a fresh Debian root -----------------------------------------------------
tarball="$CACHE/$SUITE-minbase.tar"
if [ ! -f "$tarball" ]; then
	log "creating a $SUITE minbase root with debootstrap (cached in $tarball)"
	mkdir -p "$CACHE"
	tmp_root="$work/debootstrap"
	debootstrap --variant=minbase "$SUITE" "$tmp_root" "$MIRROR" >"$work/debootstrap.log" 2>&1 ||
		{ tail -20 "$work/debootstrap.log" >&2; die "debootstrap failed"; }
	tar -C "$tmp_root" -cf "$tarball.tmp" .
	mv "$tarball.tmp" "$tarball"
	rm -rf "$tmp_root"
fi
new_root() {
	local r
	r=$(mktemp -d "$work/root.XXXXXX")
	tar -C "$r" -xf "$tarball"
	echo "$r"
}

# run_in ROOT CMD...: run in the root, with the PATH maintainer scripts get.
run_in() {
	local r=$1
	shift
	chroot "$r" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
}

# --- checks ------------------------------------------------------------------
# What every install must have: path, type, mode, owner; deb_files and
# rpm_files what each format has besides.
expected_files=(
	"/usr/bin/nri-vgpu f 755"
	"/usr/bin/nri-vgpu-device-plugin f 755"
	"/usr/bin/nri-vgpu-runtime f 755"
	"/usr/bin/nri-vgpu-dra-driver f 755"
	"/usr/bin/kubectl-nri_vgpu f 755"
	"/usr/lib/nri-vgpu/libvgpu-shim.so f 644"
	"/etc/nri-vgpu/config.toml f 644"
	"/usr/lib/systemd/system/nri-vgpu-device-plugin.service f 644"
	"/usr/lib/systemd/system/nri-vgpu.service f 644"
	"/usr/lib/systemd/system/nri-vgpu-dra-driver.service f 644"
	"/usr/lib/tmpfiles.d/nri-vgpu.conf f 644"
	"/usr/share/doc/nri-vgpu/README.md f 644"
	"/usr/share/doc/nri-vgpu/config.toml.example f 644"
	"/usr/share/man/man1/nri-vgpu.1.gz f 644"
	"/usr/share/man/man1/nri-vgpu-device-plugin.1.gz f 644"
	"/usr/share/man/man1/nri-vgpu-runtime.1.gz f 644"
	"/usr/share/man/man1/nri-vgpu-dra-driver.1.gz f 644"
	"/usr/share/man/man1/kubectl-nri_vgpu.1.gz f 644"
	"/var/lib/nri-vgpu d 700"
)
deb_files=(
	"/usr/share/doc/nri-vgpu/copyright f 644"
	"/usr/share/doc/nri-vgpu/changelog.Debian.gz f 644"
	"/usr/share/lintian/overrides/nri-vgpu f 644"
)
rpm_files=(
	"/usr/share/licenses/nri-vgpu/LICENSE f 644"
)
binaries=(/usr/bin/nri-vgpu /usr/bin/nri-vgpu-device-plugin /usr/bin/nri-vgpu-runtime /usr/bin/nri-vgpu-dra-driver /usr/bin/kubectl-nri_vgpu /usr/lib/nri-vgpu/libvgpu-shim.so /opt/nri/plugins/10-nri-vgpu)
# The units, each of a daemon the package installs.
units=(nri-vgpu-device-plugin.service nri-vgpu-dra-driver.service nri-vgpu.service)

# check_installed ROOT WHAT [ENTRY...]: the expected files and ENTRYs.
check_installed() {
	local r=$1 what=$2 entry path type mode
	shift 2
	for entry in "${expected_files[@]}" "$@"; do
		read -r path type mode <<<"$entry"
		if [ ! -e "$r$path" ]; then
			fail "$what: $path missing"
			continue
		fi
		local got
		got=$(stat -c '%F %a %U:%G' "$r$path")
		case "$type" in
		f) [ "$got" = "regular file $mode root:root" ] || fail "$what: $path is '$got', want regular file $mode root:root" ;;
		d) [ "$got" = "directory $mode root:root" ] || fail "$what: $path is '$got', want directory $mode root:root" ;;
		esac
	done
	local target
	target=$(readlink "$r/opt/nri/plugins/10-nri-vgpu" || true)
	[ "$target" = /usr/bin/nri-vgpu ] || fail "$what: /opt/nri/plugins/10-nri-vgpu -> '$target', want /usr/bin/nri-vgpu"
	grep -qx 'backend = "nvml"' "$r/etc/nri-vgpu/config.toml" || fail "$what: the packaged config does not use backend = \"nvml\""
	! grep -q '^\[\[gpu.simulated\]\]' "$r/etc/nri-vgpu/config.toml" || fail "$what: the packaged config has simulated GPUs"
	# Every binary and the shim load in the fresh root: no missing library.
	local f out
	for f in /usr/bin/nri-vgpu /usr/bin/nri-vgpu-device-plugin /usr/bin/nri-vgpu-runtime /usr/bin/nri-vgpu-dra-driver /usr/bin/kubectl-nri_vgpu /usr/lib/nri-vgpu/libvgpu-shim.so; do
		if out=$(run_in "$r" ldd "$f" 2>&1) && grep -q 'not found' <<<"$out"; then
			fail "$what: $f has unresolved libraries in a fresh $SUITE: $out"
		fi
	done
	out=$(run_in "$r" /usr/bin/nri-vgpu version 2>&1) || fail "$what: nri-vgpu version failed in the fresh root: $out"
	out=$(run_in "$r" /usr/bin/nri-vgpu-dra-driver --version 2>&1) || fail "$what: nri-vgpu-dra-driver --version failed in the fresh root: $out"
	out=$(run_in "$r" /usr/bin/kubectl-nri_vgpu --version 2>&1) || fail "$what: kubectl-nri_vgpu --version failed in the fresh root: $out"
	# Each manual page is a page of its command (man itself is not in a
	# minbase root; lint.sh has lintian check the pages).
	local page title
	for page in 'nri-vgpu NRI\-VGPU' 'nri-vgpu-device-plugin NRI\-VGPU\-DEVICE\-PLUGIN' 'nri-vgpu-runtime NRI\-VGPU\-RUNTIME' \
		'nri-vgpu-dra-driver NRI\-VGPU\-DRA\-DRIVER' 'kubectl-nri_vgpu KUBECTL\-NRI_VGPU'; do
		read -r f title <<<"$page"
		out=$(gzip -dc "$r/usr/share/man/man1/$f.1.gz" 2>&1 | head -1) || true
		[[ $out == ".TH \"$title\" \"1\" "* ]] ||
			fail "$what: /usr/share/man/man1/$f.1.gz does not open with its .TH line (.TH \"$title\" \"1\" ...): $out"
	done
}

# check_debug_symbols ROOT WHAT: each binary is stripped, and its symbols
# are where a debugger looks for them, by build ID, with the debug
# information in them.
check_debug_symbols() {
	local r=$1 what=$2 f id dbg sections
	for f in /usr/bin/nri-vgpu /usr/bin/nri-vgpu-device-plugin /usr/bin/nri-vgpu-runtime /usr/bin/nri-vgpu-dra-driver /usr/bin/kubectl-nri_vgpu /usr/lib/nri-vgpu/libvgpu-shim.so; do
		sections=$(readelf -S --wide "$r$f")
		if grep -Eq '[[:space:]]\.(symtab|z?debug_info)[[:space:]]' <<<"$sections"; then
			fail "$what: $f is not stripped"
		fi
		id=$(readelf -n "$r$f" | sed -n 's/^[[:space:]]*Build ID: *\([0-9a-f]*\)$/\1/p' | head -1)
		if [ -z "$id" ]; then
			fail "$what: $f has no GNU build ID"
			continue
		fi
		dbg="/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug"
		if [ ! -f "$r$dbg" ]; then
			fail "$what: no debug symbols for $f at $dbg"
			continue
		fi
		# (readelf complains that a .debug file has no program
		# interpreter: it holds only the section headers of one.)
		sections=$(readelf -S --wide "$r$dbg" 2>/dev/null)
		grep -Eq '[[:space:]]\.z?debug_info[[:space:]]' <<<"$sections" ||
			fail "$what: $dbg holds no debug information"
		[ "$(readelf -n "$r$dbg" 2>/dev/null | sed -n 's/^[[:space:]]*Build ID: *\([0-9a-f]*\)$/\1/p' | head -1)" = "$id" ] ||
			fail "$what: $dbg is not the symbols of $f (build ID)"
	done
}

check_no_binaries() {
	local r=$1 what=$2 f
	for f in "${binaries[@]}" "${units[@]/#//usr/lib/systemd/system/}" /usr/lib/tmpfiles.d/nri-vgpu.conf; do
		if [ -e "$r$f" ] || [ -L "$r$f" ]; then fail "$what: $f is still there"; fi
	done
	for f in /usr/lib/nri-vgpu /usr/share/doc/nri-vgpu /usr/share/licenses/nri-vgpu /usr/share/man/man1/nri-vgpu.1.gz; do
		[ ! -e "$r$f" ] || fail "$what: $f is still there"
	done
}

edit_config() {
	local r=$1
	sed -i 's/^split_count = 10$/split_count = 7/' "$r/etc/nri-vgpu/config.toml"
	echo "# edited on this node" >>"$r/etc/nri-vgpu/config.toml"
	grep -qx 'split_count = 7' "$r/etc/nri-vgpu/config.toml" || die "the packaged config has no 'split_count = 10' line to edit"
}
check_edit_kept() {
	local r=$1 what=$2
	grep -qx 'split_count = 7' "$r/etc/nri-vgpu/config.toml" &&
		grep -qx '# edited on this node' "$r/etc/nri-vgpu/config.toml" ||
		fail "$what: the local edit of /etc/nri-vgpu/config.toml was lost"
}

# --- deb -----------------------------------------------------------------------
log "deb: install $(basename "$deb1") into a fresh $SUITE root"
r=$(new_root)
cp "$deb1" "$r/tmp/v1.deb"
cp "$deb2" "$r/tmp/v2.deb"
cp "$deb3" "$r/tmp/v3.deb"
run_in "$r" dpkg -i /tmp/v1.deb >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; die "dpkg -i failed"; }
check_installed "$r" "deb install" "${deb_files[@]}"
run_in "$r" dpkg-query -W -f='${Conffiles}\n' nri-vgpu | grep -q '^ /etc/nri-vgpu/config.toml ' ||
	fail "deb: /etc/nri-vgpu/config.toml is not a conffile"
# The changelog's entry is this very version, in Debian's format.
deb_version=$(dpkg-deb -f "$deb1" Version)
out=$(gzip -dc "$r/usr/share/doc/nri-vgpu/changelog.Debian.gz" | head -1)
[ "$out" = "nri-vgpu ($deb_version) unstable; urgency=medium" ] ||
	fail "deb: changelog.Debian.gz opens with '$out', want 'nri-vgpu ($deb_version) unstable; urgency=medium'"
out=$(rpm -qp --qf '%{CHANGELOGNAME}' "$rpm1" 2>/dev/null)
[[ $out == *" - $(rpm -qp --qf '%{VERSION}-%{RELEASE}' "$rpm1" 2>/dev/null)" ]] ||
	fail "rpm: the changelog's latest entry '$out' is not for the package's version"

# The dependency on the C library names the version the binaries need.
need_glibc=$(objdump -T "$r/usr/bin/nri-vgpu" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/^GLIBC_//' | sort -uV | tail -1)
[ "$deps" = "libc6 (>= $need_glibc)" ] || fail "deb: Depends is '$deps', want 'libc6 (>= $need_glibc)'"
rpm -qpR "$rpm1" 2>/dev/null | grep -qx "glibc >= $need_glibc" || fail "rpm: requires $(rpm -qpR "$rpm1" 2>/dev/null | tr '\n' ' '), want glibc >= $need_glibc"

# The units are valid for this machine's systemd (only their executables,
# installed in the root and not here, are missing).
if command -v systemd-analyze >/dev/null; then
	out=$(systemd-analyze verify "${units[@]/#/$r/usr/lib/systemd/system/}" 2>&1 |
		grep -v 'is not executable: No such file or directory' || true)
	[ -z "$out" ] || fail "systemd-analyze verify: $out"
fi
# The tmpfiles entry makes the directories and the preload file at boot,
# and closes a state directory opened by hand: it holds the allocation key.
if command -v systemd-tmpfiles >/dev/null; then
	chmod 0755 "$r/var/lib/nri-vgpu"
	systemd-tmpfiles --root="$r" --create nri-vgpu.conf
	[ "$(stat -c %a "$r/var/lib/nri-vgpu")" = 700 ] || fail "tmpfiles: /var/lib/nri-vgpu mode $(stat -c %a "$r/var/lib/nri-vgpu"), want 700"
	[ "$(cat "$r/run/nri-vgpu/ld.so.preload")" = /usr/local/nri-vgpu/libvgpu-shim.so ] ||
		fail "tmpfiles: /run/nri-vgpu/ld.so.preload holds '$(cat "$r/run/nri-vgpu/ld.so.preload")'"
	[ "$(stat -c %a "$r/run/nri-vgpu")" = 755 ] || fail "tmpfiles: /run/nri-vgpu mode $(stat -c %a "$r/run/nri-vgpu")"
	rm -rf "$r/run/nri-vgpu"
fi

log "deb: upgrade with a locally edited config"
edit_config "$r"
run_in "$r" dpkg -i /tmp/v2.deb >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; die "dpkg -i (upgrade) failed"; }
check_edit_kept "$r" "deb upgrade"
grep -q "nri-vgpu: upgraded" "$work/dpkg.log" || fail "deb upgrade: no note about restarting the daemons"
ls "$r"/etc/nri-vgpu/config.toml.dpkg-* >/dev/null 2>&1 && fail "deb upgrade: unchanged config left $(ls "$r"/etc/nri-vgpu/config.toml.dpkg-*)"
check_installed "$r" "deb upgrade" "${deb_files[@]}"

log "deb: upgrade to a package whose default config changed (keep mine, as apt -o Dpkg::Options::=--force-confold)"
run_in "$r" dpkg -i --force-confdef --force-confold /tmp/v3.deb >"$work/dpkg.log" 2>&1 ||
	{ cat "$work/dpkg.log" >&2; die "dpkg -i (upgrade with a new default config) failed"; }
check_edit_kept "$r" "deb upgrade, changed default"
grep -q '^# A default that changed' "$r/etc/nri-vgpu/config.toml.dpkg-dist" 2>/dev/null ||
	fail "deb upgrade, changed default: the new default is not in config.toml.dpkg-dist"

log "deb: remove, then purge"
echo "key" >"$r/var/lib/nri-vgpu/allocation.key" # as the daemons would leave it
run_in "$r" dpkg -r nri-vgpu >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; die "dpkg -r failed"; }
check_no_binaries "$r" "deb remove"
[ -f "$r/etc/nri-vgpu/config.toml" ] || fail "deb remove: the config went (only purge removes it)"
[ -f "$r/var/lib/nri-vgpu/allocation.key" ] || fail "deb remove: the state directory went (only purge removes it)"
run_in "$r" dpkg -P nri-vgpu >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; die "dpkg -P failed"; }
left=$(cd "$r" && find . -path ./proc -prune -o -path ./tmp -prune -o -name '*nri-vgpu*' -print -o -path ./opt/nri -print)
[ -z "$left" ] || fail "deb purge left: $left"

log "deb: maintainer scripts under a running systemd start, restart and enable nothing"
r=$(new_root)
cp "$deb1" "$r/tmp/v1.deb"
cp "$deb2" "$r/tmp/v2.deb"
mkdir -p "$r/run/systemd/system"
for tool in systemctl systemd-tmpfiles; do
	printf '#!/bin/sh\necho "%s $*" >>/tmp/systemd.log\n' "$tool" >"$r/usr/local/sbin/$tool"
	chmod 0755 "$r/usr/local/sbin/$tool"
done
run_in "$r" dpkg -i /tmp/v1.deb >/dev/null
run_in "$r" dpkg -i /tmp/v2.deb >/dev/null
calls=$(cat "$r/tmp/systemd.log")
grep -q '^systemctl daemon-reload$' <<<"$calls" || fail "systemd: install did not reload units: $calls"
grep -q '^systemd-tmpfiles --create /usr/lib/tmpfiles.d/nri-vgpu.conf$' <<<"$calls" || fail "systemd: install did not create the tmpfiles: $calls"
if grep -Eq 'start|restart|enable|stop|disable' <<<"$calls"; then fail "systemd: install or upgrade touched the services: $calls"; fi
wants="$r/etc/systemd/system/multi-user.target.wants"
# The administrator enables all, as systemctl enable does (WantedBy=).
mkdir -p "$wants"
for u in "${units[@]}"; do
	[ ! -e "$wants/$u" ] || fail "systemd: install or upgrade enabled $u"
	ln -s "/usr/lib/systemd/system/$u" "$wants/$u"
done
: >"$r/tmp/systemd.log"
run_in "$r" dpkg -r nri-vgpu >/dev/null
# deb-systemd-invoke stops through systemctl; deb-systemd-helper takes the
# links away itself.
grep -qx "systemctl stop ${units[*]}" "$r/tmp/systemd.log" ||
	fail "systemd: removal did not stop the services ${units[*]}: $(cat "$r/tmp/systemd.log")"
for u in "${units[@]}"; do
	[ ! -L "$wants/$u" ] || fail "systemd: removal left $u enabled"
done
run_in "$r" dpkg -P nri-vgpu >/dev/null
left=$(cd "$r" && find . -path ./proc -prune -o -path ./tmp -prune -o -name '*nri-vgpu*' -print)
[ -z "$left" ] || fail "systemd: purge left: $left"

log "deb: the debug symbols of $(basename "$deb1")"
debug_files=$(dpkg-deb --fsys-tarfile "$dbgdeb" | tar -t | sed -n 's|^\./\(.*\.debug\)$|/\1|p')
[ "$(wc -w <<<"$debug_files")" = 6 ] || fail "dbgsym: want the symbols of 6 binaries, the package has: $debug_files"
[ "$(dpkg-deb -f "$dbgdeb" Depends)" = "nri-vgpu (= $deb_version)" ] ||
	fail "dbgsym: Depends is '$(dpkg-deb -f "$dbgdeb" Depends)', want 'nri-vgpu (= $deb_version)'"
r=$(new_root)
cp "$deb1" "$r/tmp/v1.deb"
cp "$dbgdeb" "$r/tmp/dbgsym.deb"
run_in "$r" dpkg -i /tmp/v1.deb /tmp/dbgsym.deb >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; die "dpkg -i of the debug symbols failed"; }
check_debug_symbols "$r" "dbgsym"
run_in "$r" dpkg -P nri-vgpu-dbgsym nri-vgpu >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; die "dpkg -P of the debug symbols failed"; }
for f in $debug_files /usr/share/doc/nri-vgpu-dbgsym; do
	if [ -e "$r$f" ] || [ -L "$r$f" ]; then fail "dbgsym: purge left $f"; fi
done

# --- rpm -------------------------------------------------------------------------
log "rpm: file list and attributes of $(basename "$rpm1")"
want_list="/etc/nri-vgpu
/etc/nri-vgpu/config.toml
/opt/nri/plugins/10-nri-vgpu
/usr/bin/kubectl-nri_vgpu
/usr/bin/nri-vgpu
/usr/bin/nri-vgpu-device-plugin
/usr/bin/nri-vgpu-dra-driver
/usr/bin/nri-vgpu-runtime
/usr/lib/nri-vgpu
/usr/lib/nri-vgpu/libvgpu-shim.so
/usr/lib/systemd/system/nri-vgpu-device-plugin.service
/usr/lib/systemd/system/nri-vgpu-dra-driver.service
/usr/lib/systemd/system/nri-vgpu.service
/usr/lib/tmpfiles.d/nri-vgpu.conf
/usr/share/doc/nri-vgpu
/usr/share/doc/nri-vgpu/README.md
/usr/share/doc/nri-vgpu/config.toml.example
/usr/share/doc/nri-vgpu/design.md
/usr/share/licenses/nri-vgpu
/usr/share/licenses/nri-vgpu/LICENSE
/usr/share/man/man1/kubectl-nri_vgpu.1.gz
/usr/share/man/man1/nri-vgpu-device-plugin.1.gz
/usr/share/man/man1/nri-vgpu-dra-driver.1.gz
/usr/share/man/man1/nri-vgpu-runtime.1.gz
/usr/share/man/man1/nri-vgpu.1.gz"
got_list=$(rpm -qlp "$rpm1" 2>/dev/null)
[ "$got_list" = "$want_list" ] || fail "rpm -qlp: $(diff <(echo "$want_list") <(echo "$got_list") || true)"
attrs=$(rpm -qp --qf '[%{FILEMODES:perms} %{FILEFLAGS:fflags} %{FILEUSERNAME}:%{FILEGROUPNAME} %{FILENAMES}\n]' "$rpm1" 2>/dev/null)
grep -qx -- '-rw-r--r-- cn root:root /etc/nri-vgpu/config.toml' <<<"$attrs" ||
	fail "rpm: config.toml is not %config(noreplace) 0644: $(grep config.toml <<<"$attrs")"
grep -qx -- '-rwxr-xr-x  root:root /usr/bin/nri-vgpu' <<<"$attrs" || fail "rpm: /usr/bin/nri-vgpu attributes: $(grep 'bin/nri-vgpu$' <<<"$attrs")"
grep -qx -- '-rw-r--r-- l root:root /usr/share/licenses/nri-vgpu/LICENSE' <<<"$attrs" ||
	fail "rpm: LICENSE is not %license: $(grep LICENSE <<<"$attrs")"
grep -qx -- '-rw-r--r-- d root:root /usr/share/man/man1/nri-vgpu.1.gz' <<<"$attrs" ||
	fail "rpm: the manual page is not %doc: $(grep 'man1/nri-vgpu.1.gz' <<<"$attrs")"
scripts=$(rpm -qp --scripts "$rpm1" 2>/dev/null)
for s in postinstall preuninstall postuninstall; do
	grep -q "^$s scriptlet" <<<"$scripts" || fail "rpm: no $s scriptlet"
done

log "rpm: install, upgrade and erase in a fresh root"
r=$(new_root)
rpm --root "$r" --initdb
# rpm_in ARGS...: rpm on the root, its output logged. --force-debian: Debian's
# rpm otherwise warns that it is not the system's package manager; --nodeps:
# the root's C library belongs to dpkg, not to rpm's database.
rpm_in() {
	rpm --root "$r" --force-debian "$@" >>"$work/rpm.log" 2>&1 || { cat "$work/rpm.log" >&2; die "rpm $* failed"; }
}
rpm_in -i --nodeps "$rpm1"
check_installed "$r" "rpm install" "${rpm_files[@]}"
edit_config "$r"
rpm_in -U --nodeps "$rpm2"
check_edit_kept "$r" "rpm upgrade"
[ ! -e "$r/etc/nri-vgpu/config.toml.rpmnew" ] || fail "rpm upgrade: unchanged config left config.toml.rpmnew"
rpm_in -U --nodeps "$rpm3"
check_edit_kept "$r" "rpm upgrade, changed default"
grep -q '^# A default that changed' "$r/etc/nri-vgpu/config.toml.rpmnew" 2>/dev/null ||
	fail "rpm upgrade, changed default: the new default is not in config.toml.rpmnew"
rpm_in -e nri-vgpu
check_no_binaries "$r" "rpm erase"
[ -f "$r/etc/nri-vgpu/config.toml.rpmsave" ] || fail "rpm erase: the edited config was not kept as config.toml.rpmsave"

log "rpm: the debug symbols of $(basename "$rpm1")"
want="nri-vgpu = $(rpm -qp --qf '%{VERSION}-%{RELEASE}' "$rpm1" 2>/dev/null)"
rpm -qpR "$dbgrpm" 2>/dev/null | grep -qxF "$want" ||
	fail "debuginfo: requires $(rpm -qpR "$dbgrpm" 2>/dev/null | tr '\n' ' '), want $want"
r=$(new_root)
rpm --root "$r" --initdb
rpm_in -i --nodeps "$rpm1" "$dbgrpm"
check_debug_symbols "$r" "debuginfo"
rpm_in -e nri-vgpu-debuginfo nri-vgpu
for f in $debug_files; do
	[ ! -e "$r$f" ] || fail "debuginfo: erase left $f"
done

if ((fails)); then
	die "$fails check(s) failed"
fi
log "deb and rpm packages install, upgrade and remove as they should"
