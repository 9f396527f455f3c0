package packaging

import (
	"path"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// The device plugin writes device_plugin.feature_file, which Node Feature
// Discovery reads on the host: its directory must be mounted from the
// host at the same path, writable.
func TestManifestsFeatureFile(t *testing.T) {
	m := loadManifests(t)
	cfg, err := config.Parse("ConfigMap config.toml", []byte(m.configMaps[0].Data["config.toml"]))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DevicePlugin.FeatureFile == "" {
		t.Fatal("the chart's config turns the feature file off")
	}
	dir := path.Dir(cfg.DevicePlugin.FeatureFile)
	spec := m.daemonSets["device-plugin"].Spec.Template.Spec
	vm, ok := hostMounts(spec, containerNamed(t, spec.Containers, "device-plugin"))[dir]
	if !ok || vm.MountPath != dir || vm.ReadOnly {
		t.Errorf("device-plugin must mount host %s at %s read-write, has %+v", dir, dir, vm)
	}
}
