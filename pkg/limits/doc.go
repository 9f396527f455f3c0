// Package limits holds what a container's limits are made of and the format
// that carries them to the shim: what slices of a GPU are worth and the
// device IDs that name them (Contract 1), and the limits file (Contract 4).
// It computes, encodes and parses; it reads and writes no file: the limits
// files of containers live in internal/hoststate.
package limits
