#!/bin/sh
# nri-vgpu %postun (rpm calls it as "%postun N": N = 0 on removal, 1 on
# upgrade).
#
# rpm has no purge: the state directory (the allocation key) stays.
# /run/nri-vgpu is left alone: running containers may still mount from it,
# and it is a tmpfs that goes at the next boot.
set -e

[ "${1:-0}" = 0 ] || exit 0

if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
exit 0
