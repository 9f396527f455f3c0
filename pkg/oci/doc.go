// Package oci computes the edit set a vGPU container receives (Contract 3 of
// the design) and applies it either to an NRI container adjustment or to an
// OCI runtime spec. The edit set is computed once; both appliers must produce
// the same container.
//
// Compute gives a container its allocation, Hide takes GPU access away from a
// container that has none. The package writes nothing on the host: the host
// files the edits mount (the preload file, the limits file, the usage region
// directory) are provisioned by internal/hoststate, which hands their paths
// to Compute as HostFiles.
package oci
