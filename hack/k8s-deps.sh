#!/usr/bin/env bash
# Builds the Kubernetes and etcd binaries the cluster end-to-end tests and
# `make demo-cluster` run, from source, into a cache directory:
#
#   kubelet, kube-apiserver, kube-scheduler,   Kubernetes v1.37.2 and v1.36.3
#   kube-controller-manager, kubectl           (k8s.io/kubernetes from the Go
#                                              module proxy)
#   etcd                                       the version each Kubernetes release
#                                              requires (v3.7.0 for v1.37.2,
#                                              v3.6.8 for v1.36.3)
#   CNI plugins (bridge, host-local)           Debian's containernetworking-plugins:
#                                              the network of the cluster's pods
#
# Usage: hack/k8s-deps.sh [VERSION...]
#
# The Kubernetes versions are the arguments, else $NRI_VGPU_E2E_KUBERNETES
# (space-separated), else v1.37.2 and v1.36.3. Any release from v1.34.0 on
# builds the same way; v1.34.4 (etcd v3.6.4) is known to pass TestCluster
# and TestHelmChart (the DRA tests need 1.36 or newer: consumable capacity
# is off by default before).
#
# Idempotent: binaries in the cache that run and report the pinned versions
# are reused. Prints what it builds on stderr; stdout gets one line, the
# directory holding the binaries of the first version, for scripts that capture
# it (`bin=$(hack/k8s-deps.sh)`). The others are in the sibling directories
# $cache/kubernetes-<version>/bin.
#
# `go install k8s.io/kubernetes/cmd/kubelet@v…` is refused (kubernetes' go.mod
# replaces its staging modules by directories), so the build happens in a
# throwaway module that requires k8s.io/kubernetes and points each staging
# module at its published release (k8s.io/api v0.37.2 for v1.37.2, ...).
#
# Cold on 2 cores: 16 to 17 minutes per release on a busy shared machine
# (15.5 minutes of CPU for v1.37.2) and 2 GB of memory; warm: under a second.
#
# Environment:
#   NRI_VGPU_E2E_CACHE       cache directory (default /var/cache/nri-vgpu-e2e
#                            as root, else ${XDG_CACHE_HOME:-$HOME/.cache}/nri-vgpu-e2e)
#   NRI_VGPU_E2E_KUBERNETES  Kubernetes versions, when no arguments are given
set -euo pipefail

# The same versions as harness.KubernetesVersions, harness.KubernetesVersion
# first (test/e2e/harness checks it).
DEFAULT_VERSIONS=(v1.37.2 v1.36.3)

versions=()
if (($#)); then
	versions=("$@")
elif [ -n "${NRI_VGPU_E2E_KUBERNETES:-}" ]; then
	read -r -a versions <<<"${NRI_VGPU_E2E_KUBERNETES//,/ }"
fi
((${#versions[@]})) || versions=("${DEFAULT_VERSIONS[@]}")

if [ -n "${NRI_VGPU_E2E_CACHE:-}" ]; then
	cache=$NRI_VGPU_E2E_CACHE
elif [ "$(id -u)" = 0 ]; then
	cache=/var/cache/nri-vgpu-e2e
else
	cache=${XDG_CACHE_HOME:-$HOME/.cache}/nri-vgpu-e2e
fi

log() { echo "k8s-deps: $*" >&2; }

# Versions are checked before anything is built: the staging modules are
# published from 1.x.y as v0.x.y, and older minors lack what the kubelet
# needs on this cgroup v1 machine's configuration (failCgroupV1).
for v in "${versions[@]}"; do
	if ! [[ $v =~ ^v1\.(3[4-9]|[4-9][0-9])\.[0-9]+$ ]]; then
		log "Kubernetes version '$v': want v1.MINOR.PATCH, v1.34.0 or newer"
		exit 2
	fi
done

# --- CNI plugins (Debian) ---------------------------------------------------
# Checked by what the harness does with them: it runs the bridge plugin
# (with host-local addresses) from /usr/lib/cni, speaking CNI 1.0.0.
cni_works() {
	CNI_COMMAND=VERSION /usr/lib/cni/bridge 2>/dev/null | grep -q '"1.0.0"' &&
		[ -x /usr/lib/cni/host-local ]
}
if cni_works; then
	log "CNI plugins $(dpkg-query -W -f='${Version}' containernetworking-plugins 2>/dev/null || echo '(not from a package)') already installed"
else
	if [ "$(id -u)" != 0 ]; then
		log "missing the CNI plugins; install them as root: apt-get install containernetworking-plugins"
		exit 1
	fi
	log "installing containernetworking-plugins from Debian's packages (apt-get)"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends containernetworking-plugins >/dev/null
	cni_works || { log "/usr/lib/cni/bridge does not run after installing containernetworking-plugins"; exit 1; }
fi

# --- Kubernetes and etcd -----------------------------------------------------
if ! go version >/dev/null 2>&1; then
	log "Go is required to build Kubernetes (go 1.26 or newer on PATH)"
	exit 1
fi

# Package of each binary, relative to the module root it lives in.
declare -A pkgs=(
	[kubelet]=k8s.io/kubernetes/cmd/kubelet
	[kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
	[kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
	[kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
	[kubectl]=k8s.io/kubernetes/cmd/kubectl
	[etcd]=go.etcd.io/etcd/server/v3
)
k8s_bins=(kubelet kube-apiserver kube-scheduler kube-controller-manager kubectl)

# reported DIR BIN prints the version BIN in DIR reports, by running it.
reported() {
	local dir=$1 b=$2
	[ -x "$dir/$b" ] || return 1
	case $b in
	kubectl) "$dir/$b" version --client 2>/dev/null | awk '$1 == "Client" && $2 == "Version:" {print $3}' ;;
	etcd) "$dir/$b" --version 2>/dev/null | awk '$1 == "etcd" && $2 == "Version:" {print "v" $3}' ;;
	*) "$dir/$b" --version 2>/dev/null | awk '$1 == "Kubernetes" {print $2}' ;;
	esac
}

# cached DIR VERSION succeeds when every binary in DIR runs and reports
# VERSION (etcd: the version recorded next to it at build time).
cached() {
	local dir=$1 version=$2 b etcd_want
	for b in "${k8s_bins[@]}"; do
		[ "$(reported "$dir" "$b" || true)" = "$version" ] || return 1
	done
	etcd_want=$(cat "$dir/etcd.version" 2>/dev/null) || return 1
	[ -n "$etcd_want" ] && [ "$(reported "$dir" etcd || true)" = "$etcd_want" ]
}

# build VERSION DIR builds every binary of VERSION into DIR.
build() {
	local version=$1 dir=$2 staging info gomod minor etcd m
	minor=${version#v1.}
	minor=${minor%%.*}
	staging=v0.${version#v1.}
	if ! info=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$version"); then
		log "could not download k8s.io/kubernetes@$version: $(awk -F'"' '$2 == "Error" {print $4}' <<<"$info")"
		return 1
	fi
	gomod=$(awk -F'"' '$2 == "GoMod" {print $4}' <<<"$info")
	etcd=$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2}' "$gomod")
	if [ -z "$etcd" ]; then
		log "k8s.io/kubernetes@$version requires no go.etcd.io/etcd/server/v3 (read $gomod)"
		return 1
	fi
	mkdir -p "$dir/src"
	{
		echo "module nri-vgpu.test/k8s-build"
		echo
		echo "go 1.26"
		echo
		echo "require ("
		echo "	k8s.io/kubernetes $version"
		echo "	go.etcd.io/etcd/server/v3 $etcd"
		echo ")"
		echo
		echo "replace ("
		# Every staging module kubernetes replaces by a directory, at its
		# published version.
		awk '$2 == "=>" && $3 ~ /^\.\/staging\/src\// {print "\t" $1 " => " $1 " '"$staging"'"}' "$gomod"
		echo ")"
	} >"$dir/src/go.mod"
	{
		echo "//go:build tools"
		echo
		echo "package tools"
		echo
		echo "import ("
		for m in "${pkgs[@]}"; do
			echo "	_ \"$m\""
		done
		echo ")"
	} >"$dir/src/tools.go"
	(
		cd "$dir/src"
		GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 || GOFLAGS=-mod=mod go mod tidy
		local ldflags="-s -w"
		for m in gitVersion="$version" gitMajor=1 gitMinor="$minor" gitTreeState=clean; do
			ldflags+=" -X k8s.io/component-base/version.$m"
		done
		# Built one at a time at low priority: the machine is shared, and
		# kubelet and kube-apiserver each take a gigabyte or more.
		for b in "${!pkgs[@]}"; do
			log "  go build $b"
			CGO_ENABLED=0 GOFLAGS=-buildvcs=false nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$dir/$b" "${pkgs[$b]}"
		done
	)
	echo "v${etcd#v}" >"$dir/etcd.version"
}

tmp=""
trap '[ -z "$tmp" ] || rm -rf "$tmp"' EXIT
for version in "${versions[@]}"; do
	bin=$cache/kubernetes-$version/bin
	if cached "$bin" "$version"; then
		log "Kubernetes $version and etcd $(cat "$bin/etcd.version") already in $bin"
		continue
	fi
	log "building Kubernetes $version and etcd into $bin (about a quarter of an hour cold on 2 cores, 2 GB of memory)"
	mkdir -p "$cache"
	tmp=$(mktemp -d "$cache/.build.XXXXXX")
	# Build into a temp dir and move the binaries in only once all are
	# built, so an interrupted build never leaves a half-filled cache.
	build "$version" "$tmp"
	mkdir -p "$bin"
	for b in "${!pkgs[@]}" etcd.version; do
		mv -f "$tmp/$b" "$bin/$b"
	done
	rm -rf "$tmp"
	tmp=""
	for b in "${!pkgs[@]}"; do
		got=$(reported "$bin" "$b" || true)
		want=$version
		[ "$b" != etcd ] || want=$(cat "$bin/etcd.version")
		if [ "$got" != "$want" ]; then
			log "built $b reports version '$got', want $want"
			exit 1
		fi
	done
	log "installed ${!pkgs[*]} of Kubernetes $version (etcd $(cat "$bin/etcd.version")) in $bin"
done
echo "$cache/kubernetes-${versions[0]}/bin"
