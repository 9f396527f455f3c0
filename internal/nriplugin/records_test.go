package nriplugin

import (
	"os"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
)

// recordIDs returns the IDs of the records under run_dir; none when it
// cannot be listed.
func recordIDs(cfg *config.Config) []string {
	var ids []string
	_ = hoststate.New(cfg).Scan(func(r *hoststate.Record) error {
		ids = append(ids, r.ID)
		return nil
	})
	return ids
}

// recordLimits reads the limits file of record id.
func recordLimits(t *testing.T, cfg *config.Config, id string) *limits.LimitsFile {
	t.Helper()
	files, err := hoststate.New(cfg).Files(id)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(files.Limits)
	if err != nil {
		t.Fatal(err)
	}
	lf, err := limits.ParseLimits(data)
	if err != nil {
		t.Fatal(err)
	}
	return lf
}
