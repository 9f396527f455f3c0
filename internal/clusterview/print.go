package clusterview

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"sigs.k8s.io/yaml"

	"github.com/nri-vgpu/nri-vgpu/pkg/quantity"
)

// Output formats of -o.
const (
	OutputTable = ""
	OutputWide  = "wide"
	OutputJSON  = "json"
	OutputYAML  = "yaml"
)

// Write writes v in format (an Output* value).
func Write(w io.Writer, v *View, format string) error {
	switch format {
	case OutputJSON:
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = w.Write(append(b, '\n'))
		return err
	case OutputYAML:
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	case OutputTable, OutputWide:
		return writeTable(w, v, format == OutputWide)
	}
	return fmt.Errorf("unknown output format %q: want wide, json or yaml", format)
}

// absent is what a table shows for a value that is not known (a series the
// node does not serve, metrics not read) or does not apply.
const absent = "-"

// writeTable writes one row per node (its slices), per GPU (what it has
// handed out and what is in use), per container on a GPU, per claim on a
// GPU followed by its pods, and per container whose GPU is not known, in
// tree order.
func writeTable(w io.Writer, v *View, wide bool) error {
	var buf strings.Builder
	tw := tabwriter.NewWriter(&buf, 0, 8, 2, ' ', 0)
	// Every row has every cell, so that no short row splits a column.
	columns := 0
	row := func(cells ...string) {
		if columns == 0 {
			columns = len(cells)
		}
		for len(cells) < columns {
			cells = append(cells, "")
		}
		for i, c := range cells {
			cells[i] = printable(c)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if wide {
		row("NODE", "GPU", "UUID", "MODEL", "GPU MEMORY", "NAMESPACE", "POD", "CONTAINER", "CONTAINER ID", "SLICES",
			"MEMORY USED/LIMIT", "PEAK", "SM USED/LIMIT", "SHARE USED", "THROTTLED", "LAUNCHES", "PROCESSES", "SUSPECT")
	} else {
		row("NODE", "GPU", "NAMESPACE", "POD", "CONTAINER", "SLICES", "MEMORY USED/LIMIT", "PEAK", "SM USED/LIMIT", "THROTTLED")
	}
	// usage is the columns after SLICES of a container or claim.
	usage := func(u Usage, limitFallback *uint64, smFallback *float64) []string {
		used := fmtBytes(u.MemoryUsedBytes)
		if u.Suspect != nil && *u.Suspect {
			used = "suspect"
		}
		limit := u.MemoryLimitBytes
		if limit == nil {
			limit = limitFallback
		}
		sm := u.SMLimitRatio
		if sm == nil {
			sm = smFallback
		}
		mem := used + "/" + memLimit(limit)
		smCol := percent(u.SMUtilizationRatio) + "/" + percent(sm)
		if !wide {
			return []string{mem, fmtBytes(u.MemoryPeakBytes), smCol, seconds(u.SMThrottledSeconds)}
		}
		return []string{mem, fmtBytes(u.MemoryPeakBytes), smCol, percent(u.SMShareUtilizationRatio), seconds(u.SMThrottledSeconds),
			count(u.KernelLaunches), count(u.Processes), flag(u.Suspect)}
	}
	// lead is the columns before SLICES.
	lead := func(node, gpu string, g *GPU, ns, pod, ctr, id string) []string {
		if !wide {
			return []string{node, gpu, ns, pod, ctr}
		}
		uuid, model, total := absent, absent, absent
		if g != nil {
			uuid, model, total = g.UUID, orAbsent(g.Model), fmtBytes(g.MemoryTotalBytes)
		}
		return []string{node, gpu, uuid, model, total, ns, pod, ctr, id}
	}
	dashes := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = absent
		}
		return out
	}
	usageCols := 4
	if wide {
		usageCols = 8
	}
	for _, n := range v.Nodes {
		sl := absent
		for _, r := range n.Resources {
			sl = fmt.Sprintf("%d/%d", r.Requested, r.Allocatable)
		}
		row(append(append(lead(n.Name, absent, nil, absent, absent, absent, absent), sl), dashes(usageCols)...)...)
		for _, g := range n.GPUs {
			idx := "?"
			if g.Index != nil {
				idx = strconv.Itoa(*g.Index)
			}
			gpuUsage := []string{fmtBytes(g.MemoryUsedBytes) + "/" + fmtBytes(g.MemoryAllocatedBytes), absent,
				percent(g.SMUtilizationRatio) + "/" + percent(g.SMAllocatedRatio), absent}
			if wide {
				gpuUsage = append(gpuUsage[:3], absent, absent, absent, absent, absent)
			}
			row(append(append(lead(n.Name, idx, &g, absent, absent, absent, absent), absent), gpuUsage...)...)
			for _, c := range g.Containers {
				sl := absent
				if c.Slices > 0 {
					sl = strconv.FormatInt(c.Slices, 10)
				}
				row(append(append(lead(n.Name, idx, &g, orAbsent(c.Namespace), orAbsent(c.Pod), orAbsent(c.Container), shortID(c.ContainerID)), sl),
					usage(c.Usage, nil, nil)...)...)
			}
			for _, c := range g.Claims {
				row(append(append(lead(n.Name, idx, &g, c.Namespace, "claim/"+c.Name, absent, shortID(c.RecordID)), absent),
					usage(c.Usage, c.AllocatedMemoryBytes, c.AllocatedSMRatio)...)...)
				// The claim's pods share its quota and its use: their
				// rows have no numbers of their own.
				for _, p := range c.Pods {
					ctrs := strings.Join(p.Containers, ",")
					row(lead(n.Name, idx, &g, p.Namespace, p.Name, orAbsent(ctrs), "")...)
				}
			}
		}
		for _, c := range n.Unplaced {
			row(append(append(lead(n.Name, "?", nil, c.Namespace, c.Pod, c.Container, absent), strconv.FormatInt(c.Slices, 10)), dashes(usageCols)...)...)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// The blank cells of a claim's pods leave trailing padding.
	for line := range strings.Lines(buf.String()) {
		if _, err := io.WriteString(w, strings.TrimRight(line, " \n")+"\n"); err != nil {
			return err
		}
	}
	return nil
}

// WriteErrors writes each node's error, naming the node, one line each.
func WriteErrors(w io.Writer, prog string, v *View) {
	for _, n := range v.Nodes {
		if n.Error != "" {
			fmt.Fprintf(w, "%s: node %s: %s\n", prog, n.Name, n.Error)
		}
	}
}

// printable replaces control characters (a terminal's escape sequences, a
// tab that would split a cell) with "?": label values come from each node's
// metrics, which the table does not trust to be names.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '?'
		}
		return r
	}, s)
}

func orAbsent(s string) string {
	if s == "" {
		return absent
	}
	return s
}

func fmtBytes(p *uint64) string {
	if p == nil {
		return absent
	}
	return quantity.FormatBytes(*p)
}

func memLimit(p *uint64) string {
	if p != nil && *p == 0 {
		return "none"
	}
	return fmtBytes(p)
}

func percent(p *float64) string {
	if p == nil {
		return absent
	}
	return strconv.FormatFloat(*p*100, 'f', 0, 64) + "%"
}

func seconds(p *float64) string {
	if p == nil {
		return absent
	}
	return time.Duration(*p * float64(time.Second)).Round(100 * time.Millisecond).String()
}

func count(p *uint64) string {
	if p == nil {
		return absent
	}
	return strconv.FormatUint(*p, 10)
}

func flag(p *bool) string {
	switch {
	case p == nil:
		return absent
	case *p:
		return "yes"
	}
	return "no"
}

// shortID shortens a container ID as crictl does; a claim's record keeps its
// prefix and the first group of its UID.
func shortID(id string) string {
	if id == "" {
		return absent
	}
	width := 12
	if strings.HasPrefix(id, claimRecordPrefix) {
		width = len(claimRecordPrefix) + 8
	}
	if len(id) > width {
		return id[:width]
	}
	return id
}
