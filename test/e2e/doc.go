// Package e2e holds the end-to-end tests: a real containerd with runc and
// NRI, nri-vgpu pre-registered as an NRI plugin, the device plugin on the
// simulated GPU backend behind a kubelet simulator, and the shim's fake
// driver, each scenario asserted from inside the running containers.
//
// The tests carry the build tag e2e and need root, what hack/e2e-deps.sh
// installs, and the shim with its test programs (make -C shim); they build
// nri-vgpu's binaries and the test images themselves:
//
//	hack/e2e-deps.sh && make -C shim && go test -tags e2e -count=1 -v ./test/e2e/
//
// Each scenario runs once per containerd version, v2.4.2 and v1.7.35 by
// default; NRI_VGPU_E2E_CONTAINERD="v2.4.2" (space- or comma-separated)
// selects fewer.
//
// Every test runs its own containerd in a temporary root and removes it,
// with the pods, mounts and processes it started, whether it passes or not.
package e2e
