// Package cdihook runs NVIDIA's CDI hooks (update-ldcache, create-symlinks,
// disable-device-node-modification, enable-cuda-compat, ...) inside
// nri-vgpu's own binaries, for the container edits nri-vgpu generates from
// the driver root (driver.injection = "generate", pkg/oci): nodes without
// the NVIDIA container toolkit have no nvidia-cdi-hook, so the generated
// hooks name nri-vgpu's hook binary (paths.hook_path, or nri-vgpu itself)
// with argv[0] "nvidia-cdi-hook", and that binary runs the toolkit's own
// hook commands (github.com/NVIDIA/nvidia-container-toolkit, the version
// pkg/nvcdi generates for), as nvidia-cdi-hook would.
//
// Importing this package also registers update-ldcache's re-executed
// child (moby reexec, argv[0] "reexec-update-ldcache"), which runs from the
// package's init before main.
package cdihook

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"

	"github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook/commands"
	cli "github.com/urfave/cli/v3"

	"github.com/nri-vgpu/nri-vgpu/internal/nvidialog"
)

// Name is the argv[0] with which a binary of nri-vgpu runs the hook
// commands: the name of NVIDIA's binary, which the generated hooks'
// arguments would start with anyway.
const Name = "nvidia-cdi-hook"

// Invoked reports whether argv0 asks for the hook commands.
func Invoked(argv0 string) bool {
	return filepath.Base(argv0) == Name
}

// Main runs one hook command as nvidia-cdi-hook does (args[0] is the
// program's name) and returns the exit status; diagnostics go to stderr,
// which runc shows when a hook fails.
func Main(args []string, stderr io.Writer) int {
	log := nvidialog.New(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), slog.LevelWarn)
	cmd := commands.ConfigureCDIHookCommand(log, &cli.Command{
		Name:      Name,
		Usage:     "NVIDIA's CDI hooks, run by the container runtime for the container edits nri-vgpu generates",
		Writer:    stderr,
		ErrWriter: stderr,
	})
	if err := cmd.Run(context.Background(), args); err != nil {
		log.Errorf("%v", err)
		return 1
	}
	return 0
}
