// Package limits holds the arithmetic and the formats that separate parts of
// nri-vgpu agree on: slices and device IDs (Contract 1), the signed allocation
// annotation (Contract 2), quantities, and the limits file (Contract 4).
package limits
