//go:build e2e

package docker

import (
	"maps"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/image"
)

// TestTenantCannotMoveTheLimiterAway plays root in a Docker vGPU container:
// renaming a directory on the way to a mount of nri-vgpu's, or removing
// the preload, fails with EBUSY (the wrapper's pin hook made each a mount
// point), and afterwards a fresh process still loads the shim and is
// refused past its 1 GiB.
func TestTenantCannotMoveTheLimiterAway(t *testing.T) {
	ctx := setup(t)
	if !env.haveShim {
		t.Skip("shim/build lacks the shim, its fake driver or cudaprog: run make -C shim")
	}
	attacks := []string{
		"mv /usr/local/nri-vgpu /usr/local/x",
		"mv /run/nri-vgpu /run/x",
		"mv /etc /etc.x",
		"rm /etc/ld.so.preload",
		"mv /usr /usr.x",
		"mv /usr/local /usr/local.x",
		"mv /run /run.x",
	}
	var script strings.Builder
	for _, a := range attacks {
		script.WriteString("if " + a + " 2>/tmp/err; then echo 'SUCCEEDED: " + a + "'; else echo \"failed: " + a + ": $(cat /tmp/err)\"; fi\n")
	}
	script.WriteString(cudaprogDir + "/cudaprog init alloc:768MiB alloc:512MiB:2\n")
	fake := []string{"LD_LIBRARY_PATH=" + cudaprogDir + "/fake", "FAKECUDA_DEVICES=" + uuid0 + ":4GiB:108"}
	out := docker(t, ctx, vgpuRun(append(fake, "NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_MEMORY=1GiB"), "sh", "-c", script.String())...)
	for _, a := range attacks {
		line := "failed: " + a + ": "
		i := strings.Index(out, line)
		if i < 0 || !strings.Contains(strings.SplitN(out[i:], "\n", 2)[0], "busy") {
			t.Errorf("%q did not fail with EBUSY:\n%s", a, out)
		}
	}
	for _, want := range []string{"GPU memory quota exceeded", "ok\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("after the attacks, cudaprog's output lacks %q:\n%s", want, out)
		}
	}
}

// TestImageLinkRefusesDockerRun: `docker run` of a vGPU container from an
// image whose /etc/ld.so.preload is a symbolic link fails with the hook's
// message naming the path.
func TestImageLinkRefusesDockerRun(t *testing.T) {
	ctx := setup(t)
	applets, err := image.BusyboxApplets(harness.BusyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	links := maps.Clone(applets)
	links["/etc/ld.so.preload"] = "/tmp/preload"
	const ref = "nri-vgpu.test/docker-link:e2e"
	tarball := filepath.Join(t.TempDir(), "link.tar")
	if err := image.Write(tarball, image.Spec{
		Ref:      ref,
		Files:    []image.File{{Src: harness.BusyboxPath, Dst: "/bin/busybox", Mode: 0o755}},
		Symlinks: links, Dirs: []string{"/tmp", "/etc", "/dev", "/proc", "/sys", "/run"},
		Env: []string{"PATH=/bin"},
	}); err != nil {
		t.Fatal(err)
	}
	docker(t, ctx, "load", "-i", tarball)
	out, err := env.d.docker(ctx, "run", "--rm", "--network", "none", "--runtime", runtimeName,
		"-e", "NVIDIA_VISIBLE_DEVICES=0", "-e", "NRI_VGPU_MEMORY=1GiB", ref, "true")
	const want = "nri-vgpu-runtime: /etc/ld.so.preload in the image is a symbolic link; refusing"
	if err == nil || !strings.Contains(out, want) {
		t.Errorf("docker run of the link image: %v\n%s\nwant a failure with %q", err, out, want)
	} else {
		t.Logf("docker run says: %s", strings.TrimSpace(out))
	}
	// Without a vGPU request the wrapper adds nothing: the image runs.
	docker(t, ctx, "run", "--rm", "--network", "none", "--runtime", runtimeName, ref, "true")
}
