#!/bin/sh
# nri-vgpu post-install (deb postinst, rpm %post).
#
# Creates the state and runtime directories and tells a running systemd about
# the new units. It starts, stops, restarts and enables nothing: which
# services run is the administrator's choice (see
# /usr/share/doc/nri-vgpu/README.md).
#
# deb calls it as "postinst configure [old-version]" (and abort-* on
# failures), rpm as "%post N" (N = 1 on install, 2 on upgrade).
set -e

case "$1" in
configure | [0-9]*) ;;
*) exit 0 ;;
esac

# The allocation key lives here: root only, whatever the directory was.
mkdir -p /var/lib/nri-vgpu
chmod 0700 /var/lib/nri-vgpu

if [ -d /run/systemd/system ]; then
	systemd-tmpfiles --create /usr/lib/tmpfiles.d/nri-vgpu.conf || true
	systemctl daemon-reload || true
fi

upgrade=
case "$1" in
configure) [ -n "$2" ] && upgrade=1 ;;
[0-9]*) [ "$1" -ge 2 ] && upgrade=1 ;;
esac
if [ -n "$upgrade" ]; then
	echo "nri-vgpu: upgraded. Running daemons keep the old version until restarted:"
	echo "  systemctl try-restart nri-vgpu-device-plugin.service nri-vgpu.service"
	echo "  and, for the plugin containerd starts itself, a restart of containerd."
fi
exit 0
