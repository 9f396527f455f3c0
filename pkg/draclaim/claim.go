package draclaim

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
)

// A claim's marker (Contract 8) is the one edit of the CDI devices the DRA
// driver returns for a claim: a read-only mount of GateHostPath at
// MarkerPath(claim UID, device). It tells the NRI plugin which claim
// and GPUs a container was given, and, lying in /proc below the gate, it
// makes runc refuse the container unless nri-vgpu removed it.
const MarkerPrefix = allocation.GateContainerPath + "/claim-"

// ErrRejected is wrapped by the errors about a claim or a claim
// marker that must not be honoured; their messages name the reason.
var ErrRejected = errors.New("claim rejected")

// MarkerPath is the container path of the marker of one device of a
// claim.
func MarkerPath(claimUID, device string) string {
	return MarkerPrefix + claimUID + "/" + device
}

// ParseMarker returns the claim UID and device a marker path names; ok
// is false for any other path. A path that starts like a marker but does
// not name exactly a claim and a device is an error wrapping
// ErrRejected.
func ParseMarker(path string) (claimUID, device string, ok bool, err error) {
	rest, found := strings.CutPrefix(path, MarkerPrefix)
	if !found {
		return "", "", false, nil
	}
	claimUID, device, found = strings.Cut(rest, "/")
	if !found || !claimUIDPattern.MatchString(claimUID) || !dnsLabel.MatchString(device) {
		return "", "", true, fmt.Errorf("%w: malformed claim marker %q", ErrRejected, path)
	}
	return claimUID, device, true, nil
}

// Kubernetes UIDs are RFC 4122 UUIDs; anything else cannot come from the
// API server, and this one can name a directory.
var claimUIDPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// ValidUID reports whether uid is a UID the API server could have
// given a claim.
func ValidUID(uid string) bool { return claimUIDPattern.MatchString(uid) }

// dnsLabel is what Kubernetes accepts as a device name.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// DeviceName is the name the DRA driver publishes a GPU under: "gpu-"
// and its UUID lower-cased without "GPU-", other characters than [a-z0-9-]
// as "-". It stays the same across reboots, where NVML indices may not.
func DeviceName(uuid string) (string, error) {
	s := strings.ToLower(strings.TrimPrefix(uuid, "GPU-"))
	s = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, s)
	name := "gpu-" + strings.Trim(s, "-")
	if !dnsLabel.MatchString(name) {
		return "", fmt.Errorf("GPU %s: %q is not a valid device name (a DNS label of at most 63 characters)", uuid, name)
	}
	return name, nil
}
