# Judges a replay of a runtime's cuGetProcAddress requests (test/procreplay)
# through the shim against the same replay without it:
#
#   awk -v info=FILE -f requests.awk HOOKS DIRECT SHIMMED
#
# HOOKS: "EXPORT BASE" for each LIB_CUDA row of src/hooks.def. Prints one
# line per request that is wrong, nothing when all are right:
#  - a pointer to a hooked export must come back as the shim's wrapper of
#    that export;
#  - a request for an allocation or launch entry (a base name hooks.def
#    lists, other than the context and lookup ones) must reach a hooked
#    export at all; so must one for an entry that ends what a context holds
#    or starts its footprint (primary context retain, release and reset,
#    context create and destroy);
#  - every other answer must pass through unchanged.
# Requests for any other context entry that lands on an export the shim does
# not wrap are written to the file info. Fewer than 20 allocation/launch
# requests checked is an error too (a replay that found nothing).
FILENAME == ARGV[1] { export[$1] = 1; base[$2] = 1; next }
FILENAME == ARGV[2] { d[FNR] = $6 " " $7; next }
{
	req = $2 "@" $3 " flags=" $4
	s = $6 " " $7
	split(d[FNR], dd, " ")
	life = $2 ~ /^(cuDevicePrimaryCtx(Retain|Release|Reset)|cuCtxCreate|cuCtxDestroy)$/
	alloc = ($2 in base) && ($2 !~ /^(cuCtx|cuDevicePrimaryCtx|cuGetProcAddress$)/ || life)
	if (dd[2] in export) {
		if (s != "libvgpu-shim.so " dd[2])
			print req ": the driver answers " dd[2] ", hooked, but through the shim it is " s
		else if (alloc)
			n++
	} else if (alloc && dd[2] == "-") {
		print req ": the driver has no ABI for it (for the fake: add it to fakecuda.c's table)"
	} else if (alloc) {
		print req ": reaches " dd[2] ", which the shim does not hook"
	} else if (s != d[FNR]) {
		print req ": not hooked, yet the shim changed " d[FNR] " to " s
	} else if (($2 in base) && info != "") {
		print req " -> " dd[2] " (a context entry the shim does not wrap)" > info
	}
}
END { if (n < 20) print "only " n " allocation/launch requests reached the shim's wrappers" }
