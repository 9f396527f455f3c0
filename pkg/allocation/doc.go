// Package allocation holds the allocation of Contract 2: the GPUs granted
// to one container, signed by the device plugin into the container's
// annotation and verified by the NRI plugin, and the gate mount that makes
// a container nri-vgpu did not prepare fail. It signs and verifies; it reads
// and writes no file: the allocation key lives in internal/allockey.
package allocation
