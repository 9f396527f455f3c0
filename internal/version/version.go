// Package version holds the build's version, set by the linker from git.
package version

// Version is overwritten at link time (-X) with `git describe` output.
var Version = "dev"
