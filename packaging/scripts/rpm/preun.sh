#!/bin/sh
# nri-vgpu %preun (rpm calls it as "%preun N": N = 0 on removal, 1 on
# upgrade).
#
# On removal (not on upgrade) stops and disables the services, whose binaries
# and unit files are about to go: no dangling enablement links stay behind.
# This is what rpm's %systemd_preun macro does.
set -e

[ "${1:-0}" = 0 ] || exit 0

units="nri-vgpu-device-plugin.service nri-vgpu-dra-driver.service nri-vgpu.service"
if [ -d /run/systemd/system ]; then
	# shellcheck disable=SC2086 # three unit names
	systemctl disable --now $units >/dev/null 2>&1 || true
elif command -v systemctl >/dev/null 2>&1; then
	# No running systemd (a chroot, an image build): only the links.
	# shellcheck disable=SC2086
	systemctl disable $units >/dev/null 2>&1 || true
fi
exit 0
