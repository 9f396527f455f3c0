package harness

import (
	"flag"
	"fmt"
	"path/filepath"
)

// ChainFlags are where a demo command finds the chain it runs: the project's
// binaries, the shim's build, containerd and runc.
type ChainFlags struct {
	BinDir        string // nri-vgpu, nri-vgpu-device-plugin
	ShimBuild     string // libvgpu-shim.so, cudaprog, fake/
	ContainerdBin string
	Runc          string
}

// Register adds -bin, -shim, -containerd-bin and -runc to fs, with the
// defaults of a checkout at root built by make build and hack/e2e-deps.sh.
func (c *ChainFlags) Register(fs *flag.FlagSet, root string) {
	fs.StringVar(&c.BinDir, "bin", filepath.Join(root, "bin"), "directory of nri-vgpu and nri-vgpu-device-plugin (make build)")
	fs.StringVar(&c.ShimBuild, "shim", filepath.Join(root, "shim", "build"), "the shim's build directory: libvgpu-shim.so, cudaprog, fake/ (make build)")
	fs.StringVar(&c.ContainerdBin, "containerd-bin", DefaultBinDir(), "directory of containerd, ctr and containerd-shim-runc-v2 (hack/e2e-deps.sh)")
	fs.StringVar(&c.Runc, "runc", DefaultRunc(), "runc binary")
}

// ParseAll parses args into fs and refuses any argument left over: the
// commands take flags only.
func ParseAll(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return nil
}
