package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestSamePCIBusID(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"00000000:10:00.0", "0000:10:00.0", true}, // nvidia-smi vs the device plugin (Linux's form)
		{"00000000:1A:00.0", "0000:1a:00.0", true},
		{"00000000:10:00.0", "00000000:11:00.0", false},
		{"00000001:10:00.0", "0000:10:00.0", false},
		{"garbage", "garbage", false},
	} {
		if got := samePCIBusID(c.a, c.b); got != c.want {
			t.Errorf("samePCIBusID(%q, %q) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestCompareInventory(t *testing.T) {
	node := []hostGPU{{UUID: "GPU-1", Name: "NVIDIA H200", MemoryMiB: 143771, Minor: 0, PCIBusID: "00000000:18:00.0"}}
	good := `[{"index":0,"uuid":"GPU-1","name":"NVIDIA H200","memory_bytes":150754820096,"minor":0,"pci_bus_id":"0000:18:00.0","healthy":true}]`
	if _, seen, err := compareInventory([]byte(good), node); err != nil || !strings.Contains(seen, "GPU-1") {
		t.Errorf("a matching inventory: %q, %v", seen, err)
	}
	for name, raw := range map[string]string{
		"another name":  strings.Replace(good, `"NVIDIA H200"`, `"NVIDIA H100"`, 1),
		"another minor": strings.Replace(good, `"minor":0`, `"minor":1`, 1),
		"another bus":   strings.Replace(good, `0000:18:00.0`, `0000:19:00.0`, 1),
		"less memory":   strings.Replace(good, `150754820096`, `150753771520`, 1),
		"unhealthy":     strings.Replace(good, `"healthy":true`, `"healthy":false`, 1),
		"two GPUs":      strings.Replace(good, `}]`, `},{"uuid":"GPU-2"}]`, 1),
		"not JSON":      "inventory: no NVML",
	} {
		if _, _, err := compareInventory([]byte(raw), node); err == nil {
			t.Errorf("%s: the inventory passed", name)
		}
	}
}

func TestParseNVMLProcs(t *testing.T) {
	out := "used 3\nlist ComputeRunningProcesses 9:1 sum=1\nlist ComputeRunningProcesses_v3 31:268435456,7:1 sum=268435457\nown 31\n"
	if got, err := parseNVMLProcs(out); err != nil || !slices.Equal(got, []int{7, 31}) {
		t.Errorf("parseNVMLProcs = %v, %v; want [7 31] from the _v3 list", got, err)
	}
	if got, err := parseNVMLProcs("list ComputeRunningProcesses_v3 - sum=0\n"); err != nil || len(got) != 0 {
		t.Errorf("an empty list = %v, %v", got, err)
	}
	if _, err := parseNVMLProcs("FAIL: nvmlInit\n"); err == nil {
		t.Error("no list: no error")
	}
}

func TestParseSMIApps(t *testing.T) {
	got, err := parseSMIApps("app 45, 1034\napp 12, 900\nown 45\n")
	if err != nil || !slices.Equal(got, []int{12, 45}) {
		t.Errorf("parseSMIApps = %v, %v; want [12 45]", got, err)
	}
}

func TestParseRate(t *testing.T) {
	for out, want := range map[string]float64{
		"share 31.5\n": 31.5,
		"loading\n{\"iters_per_s\": 412.5, \"iters\": 8250, \"seconds\": 20.0}\n": 412.5,
	} {
		if got, err := parseRate(out); err != nil || got != want {
			t.Errorf("parseRate(%q) = %v, %v; want %v", out, got, err, want)
		}
	}
	if _, err := parseRate("Traceback ...\n"); err == nil {
		t.Error("no rate: no error")
	}
}

func TestParseFlagsNamesWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	var stderr bytes.Buffer
	_, err := parseFlags([]string{"--bundle", dir, "--mode", "simulated", "--logs", filepath.Join(dir, "logs")}, &stderr)
	if err == nil || !strings.Contains(err.Error(), "the bundle lacks bin/containerd") || !strings.Contains(err.Error(), "fake/libcuda.so.1") {
		t.Errorf("an empty bundle: %v", err)
	}
	if _, err := parseFlags([]string{"--bundle", dir, "--mode", "gpu", "--logs", dir}, &stderr); err == nil || !strings.Contains(err.Error(), `--mode "gpu"`) {
		t.Errorf("a bad mode: %v", err)
	}
	for _, f := range bundleFiles(modeSimulated) {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	o, err := parseFlags([]string{"--bundle", dir, "--mode", "simulated", "--logs", filepath.Join(dir, "logs")}, &stderr)
	if err != nil || o.mode != modeSimulated {
		t.Errorf("a complete bundle: %+v, %v", o, err)
	}
}

func TestPythonMounts(t *testing.T) {
	venv := pythonInfo{Prefix: "/opt/torch/.venv", BasePrefix: "/usr", Stdlib: "/usr/lib/python3.12", PlatStdlib: "/usr/lib/python3.12",
		Site: "/opt/torch/.venv/lib/python3.12/site-packages"}
	if got := venv.mounts(); !slices.Equal(got, []string{"/opt/torch/.venv", "/usr/lib/python3.12"}) {
		t.Errorf("a venv: mounts %v", got)
	}
	// No venv: the system's prefix (/usr) must not be mounted whole.
	system := pythonInfo{Prefix: "/usr", BasePrefix: "/usr", Stdlib: "/usr/lib/python3.12", PlatStdlib: "/usr/lib/python3.12",
		Site: "/usr/local/lib/python3.12/dist-packages"}
	if got := system.mounts(); !slices.Equal(got, []string{"/usr/lib/python3.12", "/usr/local/lib/python3.12/dist-packages"}) {
		t.Errorf("a system Python: mounts %v", got)
	}
}

func TestLinkChain(t *testing.T) {
	dir := t.TempDir()
	// venv/bin/python3 -> python -> <dir>/usr/bin/python3.12 (absolute),
	// as a venv made by uv links its interpreter.
	for _, d := range []string{"venv/bin", "usr/bin"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	real := filepath.Join(dir, "usr/bin/python3.12")
	if err := os.WriteFile(real, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(dir, "venv/bin/python")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("python", filepath.Join(dir, "venv/bin/python3")); err != nil {
		t.Fatal(err)
	}
	got, err := linkChain(filepath.Join(dir, "venv/bin/python3"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{filepath.Join(dir, "venv/bin/python3"): "python", filepath.Join(dir, "venv/bin/python"): real}
	if len(got) != len(want) || got[filepath.Join(dir, "venv/bin/python3")] != "python" || got[filepath.Join(dir, "venv/bin/python")] != real {
		t.Errorf("linkChain = %v, want %v", got, want)
	}
}
