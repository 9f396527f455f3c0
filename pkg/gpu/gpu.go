// Package gpu is the inventory of the node's NVIDIA GPUs, from NVML or from
// the simulated backend described in config.
package gpu
