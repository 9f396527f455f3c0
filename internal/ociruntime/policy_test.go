package ociruntime

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

func TestRequestFromEnvCoresPolicy(t *testing.T) {
	got, err := RequestFromEnv([]string{"NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_CORES=30", "NRI_VGPU_CORES_POLICY=burst"})
	if err != nil {
		t.Fatal(err)
	}
	want := &Request{Devices: []string{"0"}, Cores: "30", CoresPolicy: "burst"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("RequestFromEnv = %+v, want %+v", got, want)
	}
	// Like the quotas, a policy for no GPU would silently do nothing.
	_, err = RequestFromEnv([]string{"NVIDIA_VISIBLE_DEVICES=void", "NRI_VGPU_CORES_POLICY=burst"})
	checkRequestError(t, err, "NRI_VGPU_CORES_POLICY")
}

// The allocation carries the policy as the device plugin signs it: "burst",
// or nothing for hard. The container's variable wins over the config.
func TestResolveCoresPolicy(t *testing.T) {
	tests := []struct {
		name    string
		env     string // NRI_VGPU_CORES_POLICY; "" = unset
		node    string // limits.cores_policy
		want    string
		wantErr string // with wantVar NRI_VGPU_CORES_POLICY
	}{
		{name: "unset on a hard node", node: "hard", want: ""},
		{name: "unset on a burst node", node: "burst", want: "burst"},
		{name: "burst on a hard node", env: "burst", node: "hard", want: "burst"},
		{name: "hard on a burst node", env: "hard", node: "burst", want: ""},
		{name: "unknown", env: "soft", node: "burst",
			wantErr: `NRI_VGPU_CORES_POLICY="soft": want "hard" (never more than NRI_VGPU_CORES) or "burst" (more while the GPU is otherwise idle)`},
		{name: "upper case", env: "Burst", node: "hard", wantErr: `NRI_VGPU_CORES_POLICY="Burst": want "hard"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Limits.CoresPolicy = tt.node
			req := Request{Devices: []string{"0"}, Cores: "30", CoresPolicy: tt.env}
			g, err := req.Resolve(testGPUs, cfg, "ctr-1", time.Unix(100, 0))
			if tt.wantErr != "" {
				checkRequestError(t, err, "NRI_VGPU_CORES_POLICY")
				if !strings.HasPrefix(err.Error(), tt.wantErr) {
					t.Errorf("error %q, want it to start with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if g.Allocation.CoresPolicy != tt.want {
				t.Errorf("allocation cores policy %q, want %q", g.Allocation.CoresPolicy, tt.want)
			}
		})
	}
}

// A Config built in code skips validation; its bad policy is an error that
// names the config key, not the container's variable.
func TestResolveBadConfigPolicy(t *testing.T) {
	cfg := config.Default()
	cfg.Limits.CoresPolicy = "soft"
	req := Request{Devices: []string{"0"}}
	_, err := req.Resolve(testGPUs, cfg, "ctr-1", time.Unix(100, 0))
	want := `config limits.cores_policy "soft": want "hard" or "burst"`
	if err == nil || err.Error() != want {
		t.Fatalf("Resolve error %v, want %q", err, want)
	}
}

// The policy and the node's log level reach the limits file of a Docker
// container, as the lines the shim reads.
func TestCreateWritesPolicyAndLogLevel(t *testing.T) {
	tests := []struct {
		name       string
		env        []string
		nodePolicy string
		wantPolicy string
	}{
		{"the container asks for burst", []string{"NRI_VGPU_CORES_POLICY=burst"}, "hard", "burst"},
		{"the node's burst", nil, "burst", "burst"},
		{"the container asks for hard on a burst node", []string{"NRI_VGPU_CORES_POLICY=hard"}, "burst", "hard"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, "none")
			e.cfg.Limits.CoresPolicy = tt.nodePolicy
			e.cfg.Limits.LogLevel = "debug"
			env := append([]string{"NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_MEMORY=1GiB", "NRI_VGPU_CORES=30"}, tt.env...)
			bundle, _ := writeBundle(t, baseSpec(env...))
			var rec execRecord
			if err := e.wrapper(&rec, "").Run(ParseArgs([]string{"x", "create", "--bundle", bundle, ctrID})); err != nil {
				t.Fatalf("Run: %v", err)
			}
			got, err := os.ReadFile(filepath.Join(hoststate.ContainerDir(e.cfg, ctrID), hoststate.LimitsFileName))
			if err != nil {
				t.Fatal(err)
			}
			want := "# written by nri-vgpu; read by libvgpu-shim.so\n" +
				"version=1\n" +
				"gpu.0.uuid=" + uuid0 + "\n" +
				"gpu.0.memory=1073741824\n" + // 1GiB
				"gpu.0.cores=30\n" +
				"cores.policy=" + tt.wantPolicy + "\n" +
				"log.level=debug\n" +
				"ledger.shards=64\n"
			if string(got) != want {
				t.Errorf("limits file\n%s\nwant\n%s", got, want)
			}
		})
	}
}

func TestCreateRefusesBadPolicy(t *testing.T) {
	e := newTestEnv(t, "none")
	bundle, _ := writeBundle(t, baseSpec("NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_CORES_POLICY=greedy"))
	var rec execRecord
	err := e.wrapper(&rec, "").Run(ParseArgs([]string{"x", "create", "--bundle", bundle, ctrID}))
	if err == nil || !strings.HasPrefix(err.Error(), `NRI_VGPU_CORES_POLICY="greedy": want "hard"`) {
		t.Fatalf("Run error %v, want one naming NRI_VGPU_CORES_POLICY", err)
	}
	if rec.called {
		t.Error("the next runtime was run for a refused container")
	}
	if _, err := os.Stat(hoststate.ContainerDir(e.cfg, ctrID)); !os.IsNotExist(err) {
		t.Errorf("container directory left for a refused container: %v", err)
	}
}
