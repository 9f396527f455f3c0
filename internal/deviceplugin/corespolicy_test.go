package deviceplugin

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-vgpu/nri-vgpu/internal/allockey"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

// limits.cores_policy is signed into every allocation; hard leaves the
// payload as it was before the policy existed.
func TestAllocateSignsCoresPolicy(t *testing.T) {
	tests := []struct {
		policy     string
		wantSigned string
		wantJSON   string // the payload's end
	}{
		{"burst", "burst", `"cores":100}],"cores_policy":"burst"}`},
		{"hard", "", `"cores":100}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.policy, func(t *testing.T) {
			cfg := testConfig(shortDir(t), simGPU(uuidA, "A", 16*gib, 0))
			cfg.DevicePlugin.SplitCount = 2
			cfg.Limits.CoresPolicy = tt.policy
			p, _ := newPlugin(t, cfg)
			resp, err := p.Allocate(context.Background(), &pluginapi.AllocateRequest{
				ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{uuidA + "::0", uuidA + "::1"}}},
			})
			if err != nil {
				t.Fatal(err)
			}
			value := resp.ContainerResponses[0].Annotations[allocation.AnnotationKey]
			key, err := allockey.Load(cfg.Paths.StateDir)
			if err != nil {
				t.Fatal(err)
			}
			a, err := allocation.Verify(key, value)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if a.CoresPolicy != tt.wantSigned {
				t.Errorf("signed cores policy %q, want %q", a.CoresPolicy, tt.wantSigned)
			}
			enc, _, _ := strings.Cut(value, ".")
			payload, err := base64.RawURLEncoding.DecodeString(enc)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(string(payload), tt.wantJSON) {
				t.Errorf("payload %s, want it to end in %s", payload, tt.wantJSON)
			}
		})
	}
}

// A Config built in code skips validation: New refuses a policy the shim
// would not know.
func TestNewRefusesUnknownCoresPolicy(t *testing.T) {
	dir := shortDir(t)
	cfg := testConfig(dir, simGPU(uuidA, "A", 16*gib, 0))
	cfg.Limits.CoresPolicy = "soft"
	sim, err := gpu.NewSimulated(cfg.GPU.Simulated)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	_, err = New(Options{Config: cfg, Backend: sim})
	want := `device plugin: unknown limits.cores_policy "soft" (want "hard" or "burst")`
	if err == nil || err.Error() != want {
		t.Fatalf("New error %v, want %q", err, want)
	}
}
