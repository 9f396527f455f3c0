package draclaim

import (
	"errors"
	"strings"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
)

func TestClaimDeviceName(t *testing.T) {
	tests := []struct {
		uuid, want, err string
	}{
		{"GPU-8e1c3f5a-0d2b-4c6e-9f71-2a3b4c5d6e7f", "gpu-8e1c3f5a-0d2b-4c6e-9f71-2a3b4c5d6e7f", ""},
		{"GPU-ABCD_ef.01", "gpu-abcd-ef-01", ""},
		{"MIG-GPU-1/2/3", "gpu-mig-gpu-1-2-3", ""},
		{"GPU-" + strings.Repeat("a", 60), "", "not a valid device name"},
	}
	for _, tt := range tests {
		got, err := DeviceName(tt.uuid)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("DeviceName(%q) = %q, %v; want an error with %q", tt.uuid, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("DeviceName(%q) = %q, %v; want %q", tt.uuid, got, err, tt.want)
		}
	}
}

func TestParseClaimMarker(t *testing.T) {
	const (
		prefix = "/proc/nri-vgpu/container-not-prepared-by-the-nri-vgpu-plugin/claim-"
		uid    = "11111111-1111-4111-8111-111111111111"
		dev    = "gpu-8e1c3f5a"
	)
	tests := []struct {
		path          string
		uid, device   string
		marker, isErr bool
	}{
		{prefix + uid + "/" + dev, uid, dev, true, false},
		{allocation.GateContainerPath, "", "", false, false},
		{"/dev/shm", "", "", false, false},
		{prefix + uid, "", "", true, true},
		{prefix + uid + "/", "", "", true, true},
		{prefix + "/" + dev, "", "", true, true},
		{prefix + "../../x/" + dev, "", "", true, true},
		{prefix + uid + "/" + dev + "/x", "", "", true, true},
		{prefix + uid + "/GPU-A", "", "", true, true},
		{prefix + "not-a-uuid/" + dev, "", "", true, true},
	}
	for _, tt := range tests {
		u, d, marker, err := ParseMarker(tt.path)
		if u != tt.uid || d != tt.device || marker != tt.marker || (err != nil) != tt.isErr {
			t.Errorf("ParseMarker(%q) = %q, %q, %v, %v; want %q, %q, %v, error %v", tt.path, u, d, marker, err, tt.uid, tt.device, tt.marker, tt.isErr)
		}
		if err != nil && !errors.Is(err, ErrRejected) {
			t.Errorf("ParseMarker(%q): %v does not wrap ErrRejected", tt.path, err)
		}
	}
	if got := MarkerPath(uid, dev); got != prefix+uid+"/"+dev {
		t.Errorf("MarkerPath = %q", got)
	}
}
