//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

// images are the tarballs built once for every test.
var images struct {
	dir     string
	pause   string
	busybox string
	// cudaLike sets NVIDIA_VISIBLE_DEVICES=all, as CUDA base images do.
	cudaLike string
	// cudaTest holds the shim's test programs; cudaTestErr says why it
	// could not be built (the tests that need it fail with that).
	cudaTest    string
	cudaTestErr error
}

// cudaLikeImage is the reference of images.cudaLike.
const cudaLikeImage = "nri-vgpu.test/cuda-like:e2e"

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

// containerdVersions are the containerd versions every scenario runs
// against: $NRI_VGPU_E2E_CONTAINERD, else harness.ContainerdVersions.
var containerdVersions []string

func run(m *testing.M) int {
	var err error
	if containerdVersions, err = harness.SelectedContainerdVersions(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	for _, v := range containerdVersions {
		if err := harness.Preflight(harness.BinDir(v), harness.DefaultRunc()); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: containerd %s: %v\n", v, err)
			return 1
		}
	}
	swept, err := harness.SweepStale(harness.DefaultRunc())
	for _, d := range swept {
		fmt.Fprintln(os.Stderr, "e2e: removed", d, "left behind by an earlier run")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: cleaning up after earlier runs:", err)
	}
	dir, err := harness.MkdirTemp("images")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	images.dir = dir
	if images.pause, err = harness.BuildPauseImage(ctx, dir); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	if images.busybox, err = harness.BuildBusyboxImage(dir, harness.BusyboxImage, nil); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	if images.cudaLike, err = harness.BuildBusyboxImage(dir, cudaLikeImage,
		[]string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"}); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	// A failed build fails the tests that need it, not the others.
	images.cudaTest, images.cudaTestErr = buildCudaTestImage(dir)
	buildBinaries(ctx, dir)
	return m.Run()
}

// forEachContainerd runs test as a subtest of t, named after the version,
// for each containerd version selected.
func forEachContainerd(t *testing.T, test func(t *testing.T, containerd string)) {
	t.Helper()
	for _, v := range containerdVersions {
		t.Run(v, func(t *testing.T) { test(t, v) })
	}
}

// startContainerd starts containerd version for t with the given NRI plugins
// and the base images, and tears it down when t ends; on failure the tail of
// containerd's log and of each plugin's log is printed first. nriSocket ""
// leaves the NRI socket in containerd's directory.
func startContainerd(t *testing.T, version, nriSocket string, plugins ...harness.NRIPlugin) *harness.Containerd {
	t.Helper()
	return startContainerdWith(t, version, harness.Options{NRISocket: nriSocket, NRIPlugins: plugins})
}

// startContainerdWith is startContainerd with more of harness.Options: the
// version, images, sandbox image and logger are filled in.
func startContainerdWith(t *testing.T, version string, opts harness.Options) *harness.Containerd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	imgs := []string{images.pause, images.busybox, images.cudaLike}
	if images.cudaTestErr == nil {
		imgs = append(imgs, images.cudaTest)
	}
	opts.Version, opts.Images, opts.SandboxImage, opts.Logf = version, imgs, harness.PauseImage, t.Logf
	plugins := opts.NRIPlugins
	c, err := harness.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("containerd log (tail):\n%s", c.LogTail(40))
			for _, p := range plugins {
				t.Logf("NRI plugin %s log (tail):\n%s", p.Name, harness.Tail(c.PluginLog(p.Name), 40))
			}
		}
		if err := c.Close(); err != nil {
			t.Errorf("cleaning up containerd: %v", err)
		}
	})
	return c
}

func testContext(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
