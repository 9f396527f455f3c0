// Package limits holds the arithmetic and the formats that separate parts of
// nri-vgpu agree on: slices and device IDs (Contract 1), the signed allocation
// annotation (Contract 2), quantities, and the limits file's format
// (Contract 4). It computes, encodes, parses and signs; it reads and writes
// no file: the allocation key lives in internal/allockey, the limits files
// of containers in internal/hoststate.
package limits
