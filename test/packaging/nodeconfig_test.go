package packaging

import (
	"os/exec"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// TestNodeConfig checks the configuration the packages install as
// /etc/nri-vgpu/config.toml: hack/node-config.sh derives it from the
// documented example, and it must differ from it only in using the node's
// real GPUs.
func TestNodeConfig(t *testing.T) {
	out, err := exec.Command("../../hack/node-config.sh", "../../packaging/config.toml").Output()
	if err != nil {
		t.Fatalf("hack/node-config.sh: %v", err)
	}
	node, err := config.Parse("node config.toml", out)
	if err != nil {
		t.Fatalf("the node config is invalid: %v\n%s", err, out)
	}
	example, err := config.Load("../../packaging/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	if node.GPU.Backend != config.BackendNVML {
		t.Errorf("backend = %q, want nvml", node.GPU.Backend)
	}
	if len(node.GPU.Simulated) != 0 {
		t.Errorf("the node config keeps %d simulated GPUs", len(node.GPU.Simulated))
	}
	if regexp.MustCompile(`(?m)^\s*\[\[\s*gpu\.simulated`).Match(out) {
		t.Errorf("the node config still has a [[gpu.simulated]] table:\n%s", out)
	}
	// The example's per-model split counts stay as commented-out
	// documentation: a node splits every model into split_count slices,
	// as the documented default says.
	if len(node.DevicePlugin.Models) != 0 {
		t.Errorf("the node config keeps per-model split counts: %+v", node.DevicePlugin.Models)
	}
	if len(example.DevicePlugin.Models) > 0 && !regexp.MustCompile(`(?m)^# \[\[device_plugin\.model\]\]$`).Match(out) {
		t.Errorf("the node config lost the commented-out [[device_plugin.model]] example:\n%s", out)
	}
	// Its exemptions too: exempting a namespace trusts whoever may create
	// pods there, which only the operator can judge.
	if len(node.NRI.Exempt) != 0 {
		t.Errorf("the node config exempts pods from hiding: %+v", node.NRI.Exempt)
	}
	if len(example.NRI.Exempt) > 0 && !regexp.MustCompile(`(?m)^# \[\[nri\.exempt\]\]$`).Match(out) {
		t.Errorf("the node config lost the commented-out [[nri.exempt]] example:\n%s", out)
	}
	if len(node.NRI.ConfinementExempt) != 0 {
		t.Errorf("the node config exempts pods from the confinement: %+v", node.NRI.ConfinementExempt)
	}
	if len(example.NRI.ConfinementExempt) > 0 && !regexp.MustCompile(`(?m)^# \[\[nri\.confinement_exempt\]\]$`).Match(out) {
		t.Errorf("the node config lost the commented-out [[nri.confinement_exempt]] example:\n%s", out)
	}
	// Everything else is the example's.
	node.GPU, example.GPU = config.GPU{}, config.GPU{}
	node.DevicePlugin.Models, example.DevicePlugin.Models = nil, nil
	node.NRI.Exempt, example.NRI.Exempt = nil, nil
	node.NRI.ConfinementExempt, example.NRI.ConfinementExempt = nil, nil
	node.Source, example.Source = "", ""
	if !reflect.DeepEqual(node, example) {
		t.Errorf("the node config differs from the example beyond [gpu]:\nnode:    %+v\nexample: %+v", node, example)
	}
	// The documentation of every other key is kept.
	for _, want := range []string{"# Number of slices each physical GPU is split into", "[device_plugin]", "[metrics]"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the node config lost %q", want)
		}
	}
}

func TestNodeConfigTransform(t *testing.T) {
	in := `# title
#
# This example describes two simulated GPUs.
#
# Other text.

[device_plugin]
split_count = 10

# Per-model split counts.
[[device_plugin.model]]
name = "NVIDIA H100 80GB HBM3"
split_count = 20

[gpu]
# what backend does
backend = "simulated"   # a comment

# Simulated GPUs.
[[gpu.simulated]]
uuid = "GPU-1"

# second one
[[gpu.simulated]]
uuid = "GPU-2"

# paths come next
[paths]
run_dir = "/run/nri-vgpu"
`
	want := `# title
#
# This is the packaged configuration of a GPU node: backend = "nvml"
# reads the node's GPUs through the NVIDIA driver. Package upgrades keep
# local edits. The documented example is in /usr/share/doc/nri-vgpu.
#
# Other text.

[device_plugin]
split_count = 10

# Per-model split counts.
# [[device_plugin.model]]
# name = "NVIDIA H100 80GB HBM3"
# split_count = 20

[gpu]
# what backend does
backend = "nvml"   # a comment

# paths come next
[paths]
run_dir = "/run/nri-vgpu"
`
	cmd := exec.Command("../../hack/node-config.sh", "/dev/stdin")
	cmd.Stdin = strings.NewReader(in)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/node-config.sh: %v", err)
	}
	if string(out) != want {
		t.Errorf("got:\n%s\nwant:\n%s", out, want)
	}
}
