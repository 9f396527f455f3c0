package deviceplugin

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/nri-vgpu/nri-vgpu/internal/atomicfile"
)

// The node labels of the feature file (docs/design.md, "Node labels"):
// ours always, GPU Feature Discovery's with feature_nvidia_labels.
const (
	ownLabelPrefix    = "nri-vgpu.io/gpu."
	nvidiaLabelPrefix = "nvidia.com/gpu."
	// nvidiaResource is the resource GFD labels; serving another name is
	// what GFD calls renaming, after which "-SHARED" is not appended.
	nvidiaResource = "nvidia.com/gpu"
)

// Sharing strategies, GFD's values: "time-slicing" is how the containers
// sharing a GPU through nri-vgpu run on it (the GPU switches between their
// contexts; nri-vgpu adds the memory limit and the SM-time share), and a
// GPU of one slice is not shared.
const (
	sharingNone        = "none"
	sharingTimeSlicing = "time-slicing"
)

// featureFile is the content of the feature file for inv: a header and
// name=value lines sorted by name. The GPU the labels describe, when GPUs
// differ, is the one of the lowest index, as one label can have one value.
func (p *Plugin) featureFile(inv *inventory) []byte {
	labels := map[string]string{ownLabelPrefix + "count": strconv.Itoa(len(inv.gpus))}
	if len(inv.gpus) > 0 {
		g := inv.gpus[0]
		strategy := sharingNone
		if g.Split > 1 {
			strategy = sharingTimeSlicing
		}
		product := labelValue(g.Name)
		memory := strconv.FormatUint(g.Memory>>20, 10)
		for k, v := range map[string]string{
			"replicas": strconv.Itoa(g.Split), "sharing-strategy": strategy, "count": strconv.Itoa(len(inv.gpus)),
			"product": product, "memory": memory,
		} {
			labels[ownLabelPrefix+k] = v
			if p.cfg.FeatureNVIDIALabels {
				labels[nvidiaLabelPrefix+k] = v
			}
		}
		// GFD marks a shared GPU's product unless the resource is renamed.
		if p.cfg.FeatureNVIDIALabels && g.Split > 1 && p.cfg.ResourceName == nvidiaResource {
			labels[nvidiaLabelPrefix+"product"] = labelValue(g.Name + "-SHARED")
		}
	}
	var b strings.Builder
	b.WriteString("# Node labels of nri-vgpu-device-plugin (Node Feature Discovery local source);\n")
	b.WriteString("# rewritten when the GPUs change, removed when the plugin stops.\n")
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		fmt.Fprintf(&b, "%s=%s\n", k, labels[k])
	}
	return []byte(b.String())
}

var (
	notLabelChars = regexp.MustCompile(`[^A-Za-z0-9._ -]`)
	labelEnds     = regexp.MustCompile(`^[^A-Za-z0-9]+|[^A-Za-z0-9]+$`)
)

// labelValue is name as GFD writes a product (characters other than
// letters, digits, "-", "_", "." and blanks dropped, blanks runs made
// "-"), cut to what a label value may hold: 63 characters, starting and
// ending with a letter or digit.
func labelValue(name string) string {
	v := labelEnds.ReplaceAllString(strings.Join(strings.Fields(notLabelChars.ReplaceAllString(name, "")), "-"), "")
	if len(v) > 63 {
		v = labelEnds.ReplaceAllString(v[:63], "")
	}
	return v
}

// startFeatures makes the plugin keep the feature file while it serves
// its socket, and writes it now. A second instance waiting for the
// socket does not write it: the first one's stop would remove it.
func (p *Plugin) startFeatures() {
	if p.cfg.FeatureFile == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.featuresOn = true
	p.writeFeatures(p.inv)
}

// stopFeatures removes the feature file: a stopped plugin advertises no
// slice, so the labels describing them go too. p.mu must not be held.
func (p *Plugin) stopFeatures() {
	if p.cfg.FeatureFile == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.featuresOn {
		return
	}
	p.featuresOn = false
	p.featuresWritten = nil
	if err := os.Remove(p.cfg.FeatureFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		p.log.Warn("cannot remove the feature file; Node Feature Discovery keeps its labels", "path", p.cfg.FeatureFile, "err", err)
		return
	}
	p.log.Info("removed the feature file", "path", p.cfg.FeatureFile)
}

// writeFeatures rewrites the feature file if its content for inv differs
// from what was written. A failure is logged once and not fatal: it costs
// node labels, not GPUs; the next change tries again. p.mu must be held.
func (p *Plugin) writeFeatures(inv *inventory) {
	if !p.featuresOn {
		return
	}
	data := p.featureFile(inv)
	if slices.Equal(data, p.featuresWritten) {
		return
	}
	err := os.MkdirAll(filepath.Dir(p.cfg.FeatureFile), 0o755)
	if err == nil {
		err = atomicfile.Write(p.cfg.FeatureFile, data, 0o644)
	}
	if err != nil {
		if msg := err.Error(); msg != p.featuresErr {
			p.log.Warn("cannot write the feature file; the node's GPU labels are not published", "path", p.cfg.FeatureFile, "err", err)
			p.featuresErr = msg
		}
		return
	}
	p.featuresWritten, p.featuresErr = data, ""
	p.log.Info("wrote the feature file", "path", p.cfg.FeatureFile)
}
