// Package oci computes the edit set a vGPU container receives (Contract 3 of
// the design) and applies it either to an NRI container adjustment or to an
// OCI runtime spec. The edit set is computed once; both appliers must produce
// the same container.
//
// Compute gives a container its allocation, Hide takes GPU access away from a
// container that has none, and Prepare writes the host files the edits point
// at (the preload file, the limits file, the usage region directory).
package oci
