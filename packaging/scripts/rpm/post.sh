#!/bin/sh
# nri-vgpu %post (rpm calls it as "%post N": N = 1 on install, 2 on upgrade).
#
# Creates the state and runtime directories and tells a running systemd about
# the new units. It starts, stops, restarts and enables nothing: which
# services run is the administrator's choice (see
# /usr/share/doc/nri-vgpu/README.md). The Debian package does the same with
# Debian's helpers (packaging/scripts/deb).
set -e

# The allocation key lives here: root only, whatever the directory was.
mkdir -p /var/lib/nri-vgpu
chmod 0700 /var/lib/nri-vgpu

if [ -d /run/systemd/system ]; then
	systemd-tmpfiles --create /usr/lib/tmpfiles.d/nri-vgpu.conf || true
	systemctl daemon-reload || true
fi

if [ "${1:-1}" -ge 2 ]; then
	echo "nri-vgpu: upgraded. Running daemons keep the old version until restarted:"
	echo "  systemctl try-restart nri-vgpu-device-plugin.service nri-vgpu-dra-driver.service nri-vgpu.service"
	echo "  and, for the plugin containerd starts itself, a restart of containerd."
fi
exit 0
