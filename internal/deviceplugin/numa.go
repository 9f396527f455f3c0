package deviceplugin

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// numaNode returns the NUMA node of the PCI device busID as sysfs under
// sysfsRoot reports it, and false when it is unknown (no such device, no
// NUMA, or a single-node machine reporting -1).
//
// NVML writes bus IDs with an 8-digit domain and upper-case hex
// ("00000000:3B:00.0"); sysfs uses a 4-digit domain in lower case
// ("0000:3b:00.0").
func numaNode(sysfsRoot, busID string) (int, bool) {
	if busID == "" {
		return 0, false
	}
	id := strings.ToLower(busID)
	if domain, rest, ok := strings.Cut(id, ":"); ok && len(domain) > 4 {
		id = domain[len(domain)-4:] + ":" + rest
	}
	if strings.ContainsAny(id, "/") {
		return 0, false
	}
	data, err := os.ReadFile(filepath.Join(sysfsRoot, "bus", "pci", "devices", id, "numa_node"))
	if err != nil {
		return 0, false
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}
