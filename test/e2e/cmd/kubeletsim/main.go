// Command kubeletsim is the kubelet simulator of the end-to-end tests as a
// program: it serves kubelet's device plugin Registration socket, prints each
// device plugin that registers and the devices it advertises (grouped by
// GPU, with their health), and prints the list again on every ListAndWatch
// update, until interrupted. With --allocate N it then admits a pod of one
// container asking for N devices, the way kubelet does
// (GetPreferredAllocation, then Allocate), prints what the plugin returned
// with its annotations decoded, and exits.
//
// With the device plugin, as root:
//
//	go run ./test/e2e/cmd/kubeletsim &
//	bin/nri-vgpu-device-plugin --config packaging/config.toml
//
// Both use kubelet's /var/lib/kubelet/device-plugins by default; on a node
// where kubelet runs, point both at another directory (--socket-dir here,
// device_plugin.socket_dir in the config).
package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/pkg/quantity"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/kubeletsim"
)

const name = "kubeletsim"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the command line.
type options struct {
	socketDir string
	resource  string
	allocate  int
	wait      time.Duration
	verbose   bool
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: %s [flags]

Serves kubelet's device plugin Registration socket (<socket-dir>/kubelet.sock),
prints every device plugin that registers and the devices it advertises, and
follows ListAndWatch until interrupted. With --allocate N it then allocates N
devices of --resource to one container, as kubelet admits a pod, prints what
the plugin returned, and exits.

Flags:
`, name)
		fs.PrintDefaults()
	}
	def := config.Default().DevicePlugin
	fs.StringVar(&o.socketDir, "socket-dir", def.SocketDir,
		"directory of kubelet.sock and the plugins' sockets (the device plugin's device_plugin.socket_dir)")
	fs.StringVar(&o.resource, "resource", def.ResourceName, "extended resource that --allocate asks for")
	fs.IntVar(&o.allocate, "allocate", 0, "allocate this many devices of --resource to one container, print the result and exit (0: only watch)")
	fs.DurationVar(&o.wait, "wait", 30*time.Second, "how long --allocate waits for a plugin with enough healthy devices")
	fs.BoolVar(&o.verbose, "v", false, "log every gRPC exchange to stderr")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.allocate < 0 {
		return nil, fmt.Errorf("--allocate %d: want a number of devices, 0 or more", o.allocate)
	}
	if o.wait <= 0 {
		return nil, fmt.Errorf("--wait %v: want a positive duration", o.wait)
	}
	return o, nil
}

// run is the whole program; it returns the exit status: 0 when interrupted
// while watching or after an allocation, 1 on a failure, 2 for bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	logger := slog.New(slog.DiscardHandler)
	if o.verbose {
		logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	// kubeletsim replaces a stale kubelet.sock; a live one is a kubelet's
	// (or another kubeletsim's), which must not be taken over.
	sock := filepath.Join(o.socketDir, kubeletsim.SocketName)
	if conn, err := net.DialTimeout("unix", sock, time.Second); err == nil {
		conn.Close()
		fmt.Fprintf(stderr, "%s: a kubelet already serves %s; stop it or use another --socket-dir\n", name, sock)
		return 1
	}
	// No pod runs here, so the pod log directory is never written; pointing
	// it at the socket directory keeps New from creating one next to it.
	k, err := kubeletsim.New(kubeletsim.Options{SocketDir: o.socketDir, PodLogDir: o.socketDir, Logger: logger})
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	defer k.Close()
	fmt.Fprintf(stdout, "%s: serving Registration on %s; waiting for device plugins (Ctrl-C to stop)\n", name, k.SocketPath())

	w := &watcher{k: k, out: stdout, seen: map[string]kubeletsim.Snapshot{}}
	if o.allocate == 0 {
		w.follow(ctx, nil)
		return 0
	}
	wctx, cancel := context.WithTimeout(ctx, o.wait)
	defer cancel()
	ready := func() bool {
		s := k.Snapshot(o.resource)
		return s.Registered && s.Healthy() >= o.allocate
	}
	if !w.follow(wctx, ready) {
		s := k.Snapshot(o.resource)
		fmt.Fprintf(stderr, "%s: no plugin for %s with %d healthy devices within %v (registered: %v, %d devices, %d healthy)\n",
			name, o.resource, o.allocate, o.wait, s.Registered, len(s.Devices), s.Healthy())
		return 1
	}
	if err := allocate(ctx, k, o.resource, o.allocate, stdout); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}

// watcher prints what changes in the simulated kubelet's view of the device
// plugins.
type watcher struct {
	k    *kubeletsim.Kubelet
	out  io.Writer
	seen map[string]kubeletsim.Snapshot // by resource, as last printed
}

// follow prints every change until ctx ends (returning false) or until done
// reports true after a change has been printed (returning true).
func (w *watcher) follow(ctx context.Context, done func() bool) bool {
	for {
		changed := w.k.Changed()
		for _, res := range w.k.Resources() {
			w.report(res, w.k.Snapshot(res))
		}
		if done != nil && done() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		}
	}
}

// report prints what differs between s and the state last printed for res:
// a (new) registration, a new device list, the end of ListAndWatch.
func (w *watcher) report(res string, s kubeletsim.Snapshot) {
	last := w.seen[res]
	w.seen[res] = s
	if s.Registrations > last.Registrations {
		pref := "no"
		if s.PreferredAllocation {
			pref = "yes"
		}
		fmt.Fprintf(w.out, "\n%s: device plugin registered, endpoint %s (GetPreferredAllocation: %s)\n", res, s.Endpoint, pref)
	}
	if s.Updates > last.Updates && s.Registered {
		fmt.Fprintf(w.out, "%s: ListAndWatch: %d devices, %d healthy\n", res, len(s.Devices), s.Healthy())
		writeDevices(w.out, s.Devices)
	}
	if last.Registered && !s.Registered {
		fmt.Fprintf(w.out, "%s: ListAndWatch ended; its %d devices are unhealthy until the plugin registers again\n", res, len(s.Devices))
	}
}

// deviceGroup is the devices of one GPU: nri-vgpu's device IDs are
// "<GPU-UUID>::<slice>" (Contract 1). IDs of another form are listed each on
// its own.
type deviceGroup struct {
	gpu     string // "" for a device ID not of nri-vgpu's form
	ids     []string
	healthy int
}

func groupDevices(devs []kubeletsim.Device) []deviceGroup {
	var groups []deviceGroup
	index := map[string]int{}
	for _, d := range devs {
		key, _, err := limits.ParseDeviceID(d.ID)
		if err != nil {
			key = ""
		}
		i, ok := index[key]
		if !ok || key == "" {
			i = len(groups)
			groups = append(groups, deviceGroup{gpu: key})
			if key != "" {
				index[key] = i
			}
		}
		groups[i].ids = append(groups[i].ids, d.ID)
		if d.Healthy {
			groups[i].healthy++
		}
	}
	return groups
}

// writeDevices prints one line per GPU: its UUID, how many slices it
// advertises and how many are healthy.
func writeDevices(out io.Writer, devs []kubeletsim.Device) {
	tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	for _, g := range groupDevices(devs) {
		if g.gpu == "" {
			fmt.Fprintf(tw, "  %s\tdevice\t%s\n", g.ids[0], health(g.healthy, 1))
			continue
		}
		fmt.Fprintf(tw, "  %s\t%d slices\t%s\n", g.gpu, len(g.ids), health(g.healthy, len(g.ids)))
	}
	_ = tw.Flush()
}

func health(healthy, n int) string {
	switch {
	case healthy == n && n == 1:
		return "healthy"
	case healthy == 0 && n == 1:
		return "unhealthy"
	case healthy == n:
		return "all healthy"
	case healthy == 0:
		return "all unhealthy"
	default:
		return fmt.Sprintf("%d healthy, %d unhealthy", healthy, n-healthy)
	}
}

// allocate admits a pod of one container asking for n devices of res,
// prints what the plugin returned, and frees the devices again.
func allocate(ctx context.Context, k *kubeletsim.Kubelet, res string, n int, out io.Writer) error {
	pod := &kubeletsim.Pod{Name: "kubeletsim-allocate", UID: kubeletsim.NewUID(),
		Containers: []kubeletsim.Container{{Name: "main", Limits: map[string]int{res: n}}}}
	fmt.Fprintf(out, "\n%s: allocating %d to one container (GetPreferredAllocation, then Allocate)\n", res, n)
	allocs, err := k.Allocate(ctx, pod)
	if err != nil {
		return err
	}
	defer k.Release(pod.UID)
	a := allocs["main"]
	writeResponse(out, a.DeviceIDs[res], a.Responses[res])
	return nil
}

// writeResponse prints the devices kubelet chose and the plugin's Allocate
// response for one container, decoding annotations that are signed JSON
// payloads ("<base64url(json)>.<base64url(mac)>", Contract 2).
func writeResponse(out io.Writer, ids []string, resp *pluginapi.ContainerAllocateResponse) {
	fmt.Fprintf(out, "  devices: %s\n", strings.Join(ids, " "))
	var other []string
	if n := len(resp.GetEnvs()); n > 0 {
		other = append(other, fmt.Sprintf("%d envs", n))
	}
	if n := len(resp.GetMounts()); n > 0 {
		other = append(other, fmt.Sprintf("%d mounts", n))
	}
	if n := len(resp.GetDevices()); n > 0 {
		other = append(other, fmt.Sprintf("%d device nodes", n))
	}
	if n := len(resp.GetCdiDevices()); n > 0 {
		other = append(other, fmt.Sprintf("%d CDI devices", n))
	}
	if len(other) == 0 {
		fmt.Fprintln(out, "  envs, mounts, device nodes, CDI devices: none")
	} else {
		fmt.Fprintf(out, "  also: %s\n", strings.Join(other, ", "))
		for _, key := range slices.Sorted(maps.Keys(resp.GetEnvs())) {
			fmt.Fprintf(out, "    env %s=%s\n", key, resp.Envs[key])
		}
		for _, m := range resp.GetMounts() {
			ro := ""
			if m.ReadOnly {
				ro = " (read-only)"
			}
			fmt.Fprintf(out, "    mount %s at %s%s\n", m.HostPath, m.ContainerPath, ro)
		}
	}
	annotations := resp.GetAnnotations()
	if len(annotations) == 0 {
		fmt.Fprintln(out, "  annotations: none")
		return
	}
	for _, key := range slices.Sorted(maps.Keys(annotations)) {
		v := annotations[key]
		fmt.Fprintf(out, "  annotation %s (%d bytes)\n", key, len(v))
		payload, ok := decodeSigned(v)
		if !ok {
			fmt.Fprintf(out, "    %s\n", v)
			continue
		}
		var pretty bytes.Buffer
		if err := json.Indent(&pretty, payload, "    ", "  "); err != nil {
			pretty.Reset()
			pretty.Write(payload)
		}
		fmt.Fprintf(out, "    payload (signature not checked here; nri-vgpu checks it with the node's key):\n    %s\n", pretty.String())
		if key == allocation.AnnotationKey {
			writeAllocation(out, payload)
		}
	}
}

// decodeSigned returns the JSON payload of "<base64url(json)>.<base64url(mac)>".
func decodeSigned(v string) ([]byte, bool) {
	enc, mac, ok := strings.Cut(v, ".")
	if !ok || enc == "" || mac == "" {
		return nil, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil || !json.Valid(payload) {
		return nil, false
	}
	return payload, true
}

// writeAllocation summarizes an allocation payload per GPU.
func writeAllocation(out io.Writer, payload []byte) {
	var a allocation.Allocation
	if err := json.Unmarshal(payload, &a); err != nil {
		return
	}
	for _, g := range a.GPUs {
		fmt.Fprintf(out, "  => %s (minor %d): %d slices, %s of GPU memory, %d%% of SM time\n",
			g.UUID, g.Minor, g.Slices, quantity.FormatBytes(g.Memory), g.Cores)
	}
}
