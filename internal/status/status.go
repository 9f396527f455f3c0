// Package status reports, per GPU, the vGPU containers of the node with
// their slices, memory limit, memory in use and SM share, from the host
// files the NRI plugin and the runtime wrapper write under run_dir (the
// limits files, container.json, the usage regions). It is `nri-vgpu status`.
//
// It runs as root and reads what containers can write (each usage region),
// so it follows no symbolic link below run_dir, never waits on a region's
// lock, and shows impossible usage counters as suspect instead of as
// usage. Limits always come from the limits files, never from a region.
package status

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/quantity"
	"github.com/nri-vgpu/nri-vgpu/pkg/region"
)

// Report is the node's vGPU state.
type Report struct {
	// Runtime is what the NRI plugin learned of the container runtime when
	// it last connected; nil when it never did (or the node runs Docker,
	// whose wrapper always confines).
	Runtime *hoststate.Runtime `json:"runtime,omitempty"`
	GPUs    []GPU              `json:"gpus"`
	// Warnings name container directories that could not be read fully.
	Warnings []string `json:"warnings,omitempty"`
}

// GPU is one physical GPU and the containers holding slices of it.
type GPU struct {
	Index  *int   `json:"index,omitempty"` // nil when the GPU is not in the inventory
	UUID   string `json:"uuid"`
	Name   string `json:"name,omitempty"`
	Memory uint64 `json:"memory,omitempty"` // total bytes
	// ServedElsewhere says why nri-vgpu does not share the GPU, for one it
	// leaves to another plugin: ServedElsewhereMIG. Empty for the GPUs
	// nri-vgpu serves.
	ServedElsewhere string      `json:"servedElsewhere,omitempty"`
	Containers      []Container `json:"containers"`
}

// ServedElsewhereMIG is GPU.ServedElsewhere for a GPU in MIG mode: NVIDIA's
// device plugin or DRA driver serves its MIG devices.
const ServedElsewhereMIG = "MIG mode"

// Container is one container's share of a GPU.
type Container struct {
	ID          string `json:"id"`
	Name        string `json:"name,omitempty"`
	Pod         string `json:"pod,omitempty"`
	Slices      int    `json:"slices,omitempty"` // 0 when unknown
	MemoryLimit uint64 `json:"memoryLimit"`      // bytes; 0 = no limit
	// MemoryUsed is what the container's processes hold on this GPU, from
	// its usage region (0 in the empty region the host writes at
	// provision); nil when there is no region (a record of the previous
	// release whose container has not used a GPU yet), the region cannot
	// be read, or its counters are suspect.
	MemoryUsed *uint64 `json:"memoryUsed,omitempty"`
	// MemoryPeak is the most bytes the container's processes have held on
	// this GPU at once, and ThrottledSeconds how long launches of its
	// processes waited on the SM limiter, summed over processes, both since
	// the region was made (or rebuilt after damage); nil where MemoryUsed
	// is, and for a region of an earlier shim (version 1), which has
	// neither.
	MemoryPeak       *uint64  `json:"memoryPeak,omitempty"`
	ThrottledSeconds *float64 `json:"throttledSeconds,omitempty"`
	// Suspect is set when the region's counters for this GPU cannot be
	// true (the container can write its region: a forgery, or damage);
	// SuspectReason says what is impossible.
	Suspect       bool   `json:"suspect,omitempty"`
	SuspectReason string `json:"suspectReason,omitempty"`
	Cores         int    `json:"cores"`
}

// UsageFunc reads the usage region of a record. A missing region (see
// hoststate.Record.Usage) returns an error wrapping fs.ErrNotExist.
type UsageFunc func(r *hoststate.Record) (*region.Usage, error)

// Collect builds the report from run_dir. devices is the node's inventory
// (nil when it cannot be read: GPUs then appear by UUID only), the GPUs in
// MIG mode (gpu.Device.MIG, served elsewhere) included; usage may be nil,
// leaving memory in use unknown.
func Collect(cfg *config.Config, devices []gpu.Device, usage UsageFunc) (*Report, error) {
	r := &Report{}
	if rt, err := hoststate.ReadRuntime(cfg); err == nil {
		r.Runtime = rt
	} else if !errors.Is(err, fs.ErrNotExist) {
		r.Warnings = append(r.Warnings, err.Error())
	}
	held := map[string][]Container{} // GPU UUID -> containers
	err := hoststate.New(cfg).Scan(func(rec *hoststate.Record) error {
		collectContainer(r, held, rec, usage)
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, d := range devices {
		idx := d.Index
		cs := held[d.UUID]
		if cs == nil {
			cs = []Container{} // "containers": [] in JSON, not null
		}
		g := GPU{Index: &idx, UUID: d.UUID, Name: d.Name, Memory: d.Memory, Containers: cs}
		if d.MIG {
			g.ServedElsewhere = ServedElsewhereMIG
		}
		r.GPUs = append(r.GPUs, g)
		delete(held, d.UUID)
	}
	slices.SortStableFunc(r.GPUs, func(a, b GPU) int { return cmp.Compare(*a.Index, *b.Index) })
	// GPUs named by limits files but not in the inventory (gone, or the
	// inventory could not be read), by UUID.
	for _, uuid := range slices.Sorted(maps.Keys(held)) {
		r.GPUs = append(r.GPUs, GPU{UUID: uuid, Containers: held[uuid]})
	}
	for i := range r.GPUs {
		slices.SortFunc(r.GPUs[i].Containers, func(a, b Container) int {
			return cmp.Or(cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.Name, b.Name), cmp.Compare(a.ID, b.ID))
		})
	}
	return r, nil
}

// collectContainer adds the share of each of its GPUs of the record rec
// (a container's or a claim's) to held.
func collectContainer(r *Report, held map[string][]Container, rec *hoststate.Record, usage UsageFunc) {
	id := rec.ID
	lf, err := rec.Limits()
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			r.Warnings = append(r.Warnings, fmt.Sprintf("container %s: %v", id, err))
		}
		return
	}
	c := Container{ID: id}
	slicesOf := map[string]int{}
	if info, err := rec.Info(); err == nil {
		c.Name, c.Pod = info.Names()
		for _, g := range info.GPUs {
			slicesOf[g.UUID] = g.Slices
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		r.Warnings = append(r.Warnings, fmt.Sprintf("container %s: %v", id, err))
	}
	var u *region.Usage
	if usage != nil {
		u, err = usage(rec)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			r.Warnings = append(r.Warnings, fmt.Sprintf("container %s: usage region: %v", id, err))
		}
	}
	for _, l := range lf.GPUs {
		cc := c
		cc.Slices, cc.MemoryLimit, cc.Cores = slicesOf[l.UUID], l.Memory, l.Cores
		if u != nil {
			if err := u.Check(l.UUID, l.Memory); err != nil {
				cc.Suspect, cc.SuspectReason = true, err.Error()
				r.Warnings = append(r.Warnings, fmt.Sprintf("container %s: usage region: %v", id, err))
			} else {
				for _, d := range u.Devices {
					if d.UUID != l.UUID {
						continue
					}
					used := d.Used
					cc.MemoryUsed = &used
					if u.HasPeakAndThrottle() {
						peak, throttled := d.Peak, float64(d.ThrottledNs)/1e9
						cc.MemoryPeak, cc.ThrottledSeconds = &peak, &throttled
					}
				}
			}
		}
		held[l.UUID] = append(held[l.UUID], cc)
	}
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report for people: one section per GPU.
func (r *Report) WriteTable(w io.Writer) error {
	// Each GPU's summary line stands on its own; only the container rows
	// under it form a table, so long UUIDs and names do not widen it.
	bw := bufio.NewWriter(w)
	if rt := r.Runtime; rt != nil {
		fmt.Fprintf(bw, "runtime %s %s (NRI %s): %s\n", rt.Name, rt.Version, cmp.Or(rt.NRIVersion, "unknown"), confinementLine(rt))
		if rt.DriverFiles != "" {
			fmt.Fprintf(bw, "driver files: %s\n", rt.DriverFiles)
		}
		fmt.Fprintln(bw)
	}
	if len(r.GPUs) == 0 {
		fmt.Fprintln(bw, "no GPUs and no vGPU containers")
	}
	for i, g := range r.GPUs {
		if i > 0 {
			fmt.Fprintln(bw)
		}
		idx := "?"
		if g.Index != nil {
			idx = strconv.Itoa(*g.Index)
		}
		total := "-"
		if g.Memory > 0 {
			total = quantity.FormatBytes(g.Memory)
		}
		used := 0
		for _, c := range g.Containers {
			used += c.Slices
		}
		if g.ServedElsewhere != "" && len(g.Containers) == 0 {
			fmt.Fprintf(bw, "GPU %s  %s  %s  %s  served elsewhere (%s): not shared by nri-vgpu\n", idx, g.UUID, cmp.Or(g.Name, "(not in the inventory)"), total, g.ServedElsewhere)
			continue
		}
		fmt.Fprintf(bw, "GPU %s  %s  %s  %s  containers: %d  slices in use: %d\n", idx, g.UUID, cmp.Or(g.Name, "(not in the inventory)"), total, len(g.Containers), used)
		if len(g.Containers) == 0 {
			continue
		}
		tw := tabwriter.NewWriter(bw, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "  CONTAINER\tPOD\tNAME\tSLICES\tMEMORY LIMIT\tMEMORY USED\tMEMORY PEAK\tCORES\tTHROTTLED")
		for _, c := range g.Containers {
			// Container IDs as crictl shortens them; a claim keeps its
			// prefix and the first group of its UID.
			id, width := c.ID, 12
			if strings.HasPrefix(id, hoststate.ClaimIDPrefix) {
				width = len(hoststate.ClaimIDPrefix) + 8
			}
			if len(id) > width {
				id = id[:width]
			}
			sl := "-"
			if c.Slices > 0 {
				sl = strconv.Itoa(c.Slices)
			}
			limit := "none"
			if c.MemoryLimit > 0 {
				limit = quantity.FormatBytes(c.MemoryLimit)
			}
			// "-": not known (no region, or one of an earlier shim
			// without peak and throttled time); suspect counters are
			// shown as suspect once, under MEMORY USED.
			usedMem, peak, throttled := "-", "-", "-"
			switch {
			case c.Suspect:
				usedMem = "suspect" // the reason is among the warnings
			case c.MemoryUsed != nil:
				usedMem = quantity.FormatBytes(*c.MemoryUsed)
			}
			if c.MemoryPeak != nil && !c.Suspect {
				peak = quantity.FormatBytes(*c.MemoryPeak)
			}
			if c.ThrottledSeconds != nil && !c.Suspect {
				throttled = strconv.FormatFloat(*c.ThrottledSeconds, 'f', 1, 64) + "s"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%d%%\t%s\n", id, cmp.Or(c.Pod, "-"), cmp.Or(c.Name, "-"), sl, limit, usedMem, peak, c.Cores, throttled)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, warn := range r.Warnings {
		fmt.Fprintf(bw, "warning: %s\n", warn)
	}
	return bw.Flush()
}

// confinementLine says whether GPU containers are confined on the runtime.
func confinementLine(rt *hoststate.Runtime) string {
	if rt.Confinement {
		return "GPU containers are confined"
	}
	what := "GPU containers run WITHOUT the confinement (nri.confinement = \"best-effort\")"
	if rt.ConfinementPolicy == config.ConfinementRequired {
		what = "GPU containers are REFUSED (nri.confinement = \"required\")"
	}
	return "confinement unavailable: " + rt.Reason + "; " + what
}

// RegionUsage is the UsageFunc over the usage regions the shim writes
// (Contract 5), read without following a link and without the region's
// lock (see hoststate.Record.Usage).
func RegionUsage(r *hoststate.Record) (*region.Usage, error) {
	return r.Usage()
}
