package deviceplugin

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

const featureHeader = `# Node labels of nri-vgpu-device-plugin (Node Feature Discovery local source);
# rewritten when the GPUs change, removed when the plugin stops.
`

// waitFeatureFile waits until the feature file holds want.
func (h *harness) waitFeatureFile(want string) {
	h.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		got, err := os.ReadFile(h.cfg.DevicePlugin.FeatureFile)
		if err == nil && string(got) == want {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("feature file %s: %v\n%s\nwant\n%s", h.cfg.DevicePlugin.FeatureFile, err, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A node of two A100s split 7 ways (a model override) and an H100 the DRA
// driver serves: the labels describe the two GPUs the plugin advertises,
// in our names, and GFD's names only when asked, with GFD's "-SHARED"
// product; adding a GPU rewrites the file, and stopping removes it.
func TestFeatureFile(t *testing.T) {
	const a100 = "NVIDIA A100-SXM4-40GB"
	for _, tt := range []struct {
		name   string
		nvidia bool
		want   string
	}{
		{"own labels", false, featureHeader + `nri-vgpu.io/gpu.count=2
nri-vgpu.io/gpu.memory=40960
nri-vgpu.io/gpu.product=NVIDIA-A100-SXM4-40GB
nri-vgpu.io/gpu.replicas=7
nri-vgpu.io/gpu.sharing-strategy=time-slicing
`},
		{"and GFD's", true, featureHeader + `nri-vgpu.io/gpu.count=2
nri-vgpu.io/gpu.memory=40960
nri-vgpu.io/gpu.product=NVIDIA-A100-SXM4-40GB
nri-vgpu.io/gpu.replicas=7
nri-vgpu.io/gpu.sharing-strategy=time-slicing
nvidia.com/gpu.count=2
nvidia.com/gpu.memory=40960
nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB-SHARED
nvidia.com/gpu.replicas=7
nvidia.com/gpu.sharing-strategy=time-slicing
`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(shortDir(t),
				simGPU(uuidA, a100, 40*gib, 0), simGPU(uuidB, a100, 40*gib, 1), simGPU(uuidC, "NVIDIA H100", 80*gib, 2))
			cfg.DevicePlugin.Models = []config.ModelOverride{{Name: a100, SplitCount: 7}}
			cfg.DevicePlugin.FeatureNVIDIALabels = tt.nvidia
			cfg.DRA = config.DRA{Enabled: true, GPUs: []string{uuidC}}
			h := start(t, cfg)
			h.waitFeatureFile(tt.want)

			// A GPU added by a reload of the simulated backend.
			h.sim.Update(append(cfg.GPU.Simulated, simGPU("GPU-d0000000-0000-0000-0000-00000000000d", a100, 40*gib, 3)))
			h.waitFeatureFile(replaceCount(tt.want, "3"))

			h.cancel()
			if err := <-h.runErr; err != nil {
				t.Fatal(err)
			}
			h.runErr <- nil // for the cleanup
			if _, err := os.Stat(cfg.DevicePlugin.FeatureFile); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("feature file after a clean stop: %v", err)
			}
		})
	}
}

// replaceCount is want with every gpu.count label at n.
func replaceCount(want, n string) string {
	lines := strings.SplitAfter(want, "\n")
	for i, l := range lines {
		if name, _, ok := strings.Cut(l, "="); ok && strings.HasSuffix(name, "/gpu.count") {
			lines[i] = name + "=" + n + "\n"
		}
	}
	return strings.Join(lines, "")
}

// A GPU of one slice is not shared: GFD's "none", and no "-SHARED"; a
// renamed resource does not get "-SHARED" either (GFD's rule), and a
// product name is made a valid label value.
func TestFeatureFileValues(t *testing.T) {
	p, _ := newPlugin(t, testConfig(shortDir(t)))
	p.cfg.FeatureNVIDIALabels = true
	inv := &inventory{gpus: []gpuState{{Split: 1}}}
	inv.gpus[0].Name = "Tesla T4 (rev. a1)"
	inv.gpus[0].Memory = 15360 << 20
	want := featureHeader + `nri-vgpu.io/gpu.count=1
nri-vgpu.io/gpu.memory=15360
nri-vgpu.io/gpu.product=Tesla-T4-rev.-a1
nri-vgpu.io/gpu.replicas=1
nri-vgpu.io/gpu.sharing-strategy=none
nvidia.com/gpu.count=1
nvidia.com/gpu.memory=15360
nvidia.com/gpu.product=Tesla-T4-rev.-a1
nvidia.com/gpu.replicas=1
nvidia.com/gpu.sharing-strategy=none
`
	if got := string(p.featureFile(inv)); got != want {
		t.Errorf("one slice:\n%s\nwant\n%s", got, want)
	}

	inv.gpus[0].Split = 4
	p.cfg.ResourceName = "example.com/vgpu"
	if got := string(p.featureFile(inv)); !containsLine(got, "nvidia.com/gpu.product=Tesla-T4-rev.-a1") ||
		!containsLine(got, "nvidia.com/gpu.sharing-strategy=time-slicing") {
		t.Errorf("renamed resource, 4 slices:\n%s", got)
	}

	if got := string(p.featureFile(&inventory{})); got != featureHeader+"nri-vgpu.io/gpu.count=0\n" {
		t.Errorf("no GPU:\n%s", got)
	}

	long := "--NVIDIA Graphics Device With A Name Much Longer Than Sixty-Three Characters."
	if got := labelValue(long); got != "NVIDIA-Graphics-Device-With-A-Name-Much-Longer-Than-Sixty-Three" {
		t.Errorf("labelValue(%q) = %q", long, got)
	}
}

func containsLine(s, line string) bool {
	return slices.Contains(strings.Split(s, "\n"), line)
}
