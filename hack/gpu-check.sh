#!/usr/bin/env bash
# Runs the whole nri-vgpu chain on this machine from the bundle `make
# gpu-bundle` wrote, and checks it (test/e2e/cmd/gpu-check/README.md): on a
# GPU machine with the NVIDIA driver (gpu.backend = "nvml"), or with
# --simulated on the fake driver (make test). Needs root, tar and xz (or
# Python), overlayfs and cgroups; not Go, a network or containerd.
#
#   hack/gpu-check.sh [--simulated] [--logs DIR] [-- GPU-CHECK-FLAGS...]
#
# --logs DIR      where gpu-check writes its logs (default
#                 ./gpu-check-logs-<date>); the only place written besides
#                 a temporary directory, so the working tree may be read-only
# GPU-CHECK-FLAGS passed on to gpu-check (--python, --driver-root, --timeout)
#
# The bundle is unpacked into a temporary directory; on every exit, SIGINT
# and SIGTERM included, gpu-check is stopped (it stops what it started), then
# whatever still runs from that directory or in a container whose state is
# there is killed, the containers' cgroups and shim sockets removed, what is
# mounted under the directory unmounted, and the directory removed. The exit status is
# gpu-check's (1 also when something could not be cleaned up).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tarball=$root/gpu-bundle/nri-vgpu-gpu-bundle.tar.xz

log() { echo "gpu-check.sh: $*" >&2; }
die() {
	log "$*"
	exit 2
}

mode=nvml
logs=""
while (($#)); do
	case $1 in
	--simulated) mode=simulated ;;
	--logs)
		(($# >= 2)) || die "--logs needs a directory"
		logs=$2
		shift
		;;
	--logs=*) logs=${1#--logs=} ;;
	--) shift && break ;;
	*) die "unknown argument '$1' (usage: hack/gpu-check.sh [--simulated] [--logs DIR] [-- GPU-CHECK-FLAGS...])" ;;
	esac
	shift
done
extra=("$@")

# --- what the run needs, by capability ----------------------------------------
[ -f "$tarball" ] || die "$tarball is missing: build it with 'make gpu-bundle' (and carry gpu-bundle/ to the GPU machine)"
[ "$(id -u)" = 0 ] || die "needs root: it runs containerd, runc and mounts"
# containerd's overlayfs snapshotter; the module may need loading first.
grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null || true
grep -qw overlay /proc/filesystems || die "the kernel has no overlayfs (not in /proc/filesystems, modprobe overlay failed): containerd needs it"
# runc places every container in cgroups: v2 (a cgroup.controllers file) or v1
# hierarchies.
if [ ! -e /sys/fs/cgroup/cgroup.controllers ] && ! grep -q '^[^ ]* /sys/fs/cgroup/[^ ]* cgroup ' /proc/mounts; then
	die "no cgroup file system under /sys/fs/cgroup (neither cgroup v2 nor v1 hierarchies): runc needs one"
fi
# Unpacking: tar with xz, else Python's tarfile (lzma is in its standard library).
if command -v tar >/dev/null && command -v xz >/dev/null; then
	unpack() { xz -dc "$tarball" | tar -C "$1" -xf -; }
elif python3 -c 'import lzma, tarfile' 2>/dev/null; then
	unpack() { python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' "$tarball" "$1"; }
else
	die "cannot unpack $tarball: needs tar and xz, or python3 with its lzma module"
fi

[ -n "$logs" ] || logs=$PWD/gpu-check-logs-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$logs" 2>/dev/null && [ -w "$logs" ] || die "cannot write the logs directory $logs (pass --logs DIR)"
logs=$(cd "$logs" && pwd)

# --- the temporary directory and its cleanup -----------------------------------
tmp=""
pid=""
# under: every process whose program, root or working directory lies under
# the temporary directory (the bundle's daemons), by pid.
under() {
	local p f t
	for p in /proc/[0-9]*; do
		[ "${p#/proc/}" != $$ ] || continue
		for f in exe root cwd; do
			t=$(readlink "$p/$f" 2>/dev/null) || continue
			if [ "$t" = "$tmp" ] || [[ $t == "$tmp"/* ]]; then
				echo "${p#/proc/}"
				break
			fi
		done
	done
}
# ids: the containers (and sandboxes) containerd still has tasks for, by the
# directories of its runtime state under the temporary directory. Only
# descends the temporary directory's own file system, not the containers'.
ids() {
	local d
	find "$tmp" -xdev -type d -name io.containerd.runtime.v2.task 2>/dev/null | while read -r d; do
		find "$d" -mindepth 2 -maxdepth 2 -type d -printf '%f\n'
	done
}
# cgroups ID...: the cgroup directories runc made for these containers (named
# by the id), deepest first. A container's processes run in their own mount
# namespace, where no path of ours shows: they are found by their cgroups.
cgroups() {
	(($#)) || return 0
	local args=() id
	for id in "$@"; do args+=(-o -name "$id"); done
	find /sys/fs/cgroup -mindepth 1 -maxdepth 8 -depth -type d \( "${args[@]:1}" \) 2>/dev/null
}
# mounts: mount points under the temporary directory, the last mounted first.
mounts() {
	local mp
	while read -r _ _ _ _ mp _; do
		mp=$(printf '%b' "$mp") # mountinfo escapes spaces as \040
		if [ "$mp" = "$tmp" ] || [[ $mp == "$tmp"/* ]]; then echo "$mp"; fi
	done </proc/self/mountinfo | tac
}
cleanup() {
	local rc=$? left="" round p m c s known=()
	trap '' INT TERM HUP
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		# gpu-check stops what it started on SIGTERM; give it the time its
		# cleanup takes, then kill its process group.
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
		kill -KILL -- "-$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	if [ -n "$tmp" ]; then
		# Read before the state is unmounted or removed.
		mapfile -t known < <(ids)
		for round in 1 2 3 4 5; do
			p=$(under)
			for c in $(cgroups "${known[@]}"); do p="$p $(cat "$c/cgroup.procs" 2>/dev/null)"; done
			p=$(printf '%s\n' $p | sort -un | tr '\n' ' ') # a pid is in one cgroup per v1 hierarchy
			p=${p% }
			m=$(mounts)
			[ -z "$p$m" ] && break
			[ -z "$p" ] || { log "killing what still runs from $tmp: $p"; kill -KILL $p 2>/dev/null || true; sleep 0.5; }
			for m in $m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
		done
		# Empty now: removed (deepest first), as runc's delete would.
		for c in $(cgroups "${known[@]}"); do rmdir "$c" 2>/dev/null || left="$left cgroup $c"; done
		# containerd's shims bind their sockets in /run/containerd/s whatever
		# the configuration says; a killed shim leaves its socket there. Those
		# made during the run that nothing listens on any more are ours.
		for s in /run/containerd/s/*; do
			[ -S "$s" ] && [[ " ${sockets_before[*]} " != *" $s "* ]] || continue
			grep -qF " $s" /proc/net/unix || rm -f "$s"
		done
		p=$(under)
		m=$(mounts)
		if [ -z "$p$m" ]; then
			# One file system: never through a mount that is still there.
			rm -rf --one-file-system "$tmp" || left="$left files in $tmp"
		else
			left="$left${p:+ processes $(echo $p)}${m:+ mounts $(echo $m)}"
		fi
	fi
	if [ -n "$left" ]; then
		log "could not clean up: $left"
		((rc != 0)) || rc=1
	fi
	log "logs in $logs"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# The shim sockets already there are not ours (the cleanup's rule).
sockets_before=(/run/containerd/s/*)
# A short name in /tmp, whatever TMPDIR says: gpu-check puts containerd's
# state two directories further down, and a unix socket's path may not be
# longer than 104 bytes.
tmp=$(mktemp -d /tmp/gck.XXXXXX)
bundle=$tmp/bundle
mkdir "$bundle"
log "unpacking $tarball into $bundle"
unpack "$bundle" || die "could not unpack $tarball"
"$bundle/bin/busybox" true 2>/dev/null || die "$bundle/bin/busybox does not run: is /tmp mounted noexec?"
head -n 1 "$bundle/MANIFEST" >&2

# --- the run ---------------------------------------------------------------------
# In a process group of its own (job control), so that the cleanup can kill
# all of it; the shell waits and forwards signals through the traps above.
# TMPDIR: gpu-check keeps its state (containerd's root too) under the
# temporary directory, where the cleanup looks.
set -m
TMPDIR=$tmp "$bundle/bin/gpu-check" --bundle "$bundle" --mode "$mode" --logs "$logs" "${extra[@]}" &
pid=$!
set +m
rc=0
wait "$pid" || rc=$?
pid=""
exit "$rc"
