#!/bin/sh
# nri-vgpu post-remove (deb postrm, rpm %postun).
#
# deb "postrm purge" also deletes the state directory (the allocation key);
# rpm has no purge and keeps it. /run/nri-vgpu is left alone: running
# containers may still mount from it, and it is a tmpfs that goes at the next
# boot. deb calls it as "postrm remove|purge|upgrade|...", rpm as "%postun N"
# (N = 0 on removal, 1 on upgrade).
set -e

case "$1" in
purge) rm -rf /var/lib/nri-vgpu ;;
remove | 0) ;;
*) exit 0 ;;
esac

if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
exit 0
