// Package docker holds the end-to-end tests of nri-vgpu-runtime with a real
// dockerd: Debian's docker.io, started by the tests in a temporary root
// (its own data-root, exec-root and socket; no iptables, no bridge), with
// the wrapper registered by `nri-vgpu configure docker`'s code, simulated
// GPUs over fake device nodes, and, when shim/build has them, the shim and
// its fake CUDA driver inside the container.
//
// The tests carry the build tag e2e and need root. They install docker.io
// and busybox-static with apt-get when missing, and skip only when that
// is impossible:
//
//	make -C shim && go test -tags e2e -count=1 -v ./test/docker/
package docker
