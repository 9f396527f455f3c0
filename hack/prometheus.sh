#!/usr/bin/env bash
# Debian's Prometheus and promtool, pinned, unpacked into a cache without
# installing the package (whose scripts would start a service).
#
#   hack/prometheus.sh            print the directory holding prometheus and promtool
#   hack/prometheus.sh promtool   print the path of promtool
#   hack/prometheus.sh prometheus print the path of prometheus
#
# Both are static Go binaries: nothing else of the package is needed. The
# .deb comes from the machine's apt sources (apt-get download), so the
# version below must be one they serve.
set -euo pipefail

PROMETHEUS_DEB_VERSION=2.42.0+ds-5+deb12u1
CACHE=${NRI_VGPU_E2E_CACHE:-/var/cache/nri-vgpu-e2e}
DIR=$CACHE/prometheus-$PROMETHEUS_DEB_VERSION

# Checked by running both: a cache left half-written is unpacked again.
works() {
	"$DIR/promtool" --version >/dev/null 2>&1 && "$DIR/prometheus" --version >/dev/null 2>&1
}

if ! works; then
	echo "prometheus: unpacking Debian's prometheus $PROMETHEUS_DEB_VERSION into $DIR" >&2
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	if ! (cd "$tmp" && apt-get download "prometheus=$PROMETHEUS_DEB_VERSION" >/dev/null 2>"$tmp/apt.log"); then
		# A stale package list does not know the version yet.
		apt-get update >/dev/null 2>&1 || true
		(cd "$tmp" && apt-get download "prometheus=$PROMETHEUS_DEB_VERSION" >/dev/null 2>"$tmp/apt.log") || {
			cat "$tmp/apt.log" >&2
			echo "prometheus: apt-get download prometheus=$PROMETHEUS_DEB_VERSION failed" >&2
			exit 1
		}
	fi
	dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/root"
	mkdir -p "$DIR.new"
	install -m 0755 "$tmp/root/usr/bin/prometheus" "$tmp/root/usr/bin/promtool" "$DIR.new/"
	rm -rf "$DIR"
	mv "$DIR.new" "$DIR"
	works || { echo "prometheus: the unpacked binaries do not run" >&2; exit 1; }
fi

case "${1:-}" in
"") echo "$DIR" ;;
promtool | prometheus) echo "$DIR/$1" ;;
*)
	echo "usage: hack/prometheus.sh [promtool|prometheus]" >&2
	exit 2
	;;
esac
