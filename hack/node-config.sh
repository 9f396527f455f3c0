#!/usr/bin/env bash
# Writes, on stdout, the configuration the node packages install as
# /etc/nri-vgpu/config.toml, derived from the documented example
# (packaging/config.toml, given as $1) so that the two never drift apart:
#
#   - backend = "simulated" becomes backend = "nvml" (a GPU node's real GPUs);
#   - the [[gpu.simulated]] entries, and the comment that introduces them, go;
#   - the example's [[device_plugin.model]] overrides, [[nri.exempt]] and
#     [[nri.confinement_exempt]] entries are commented out: a node's
#     defaults split every model into split_count slices and exempt no pod
#     from hiding or from the confinement (an exemption trusts whoever may
#     create the pods it matches: the operator's choice);
#   - header paragraphs about the simulated example go, and a paragraph
#     saying what this file is takes their place.
#
# Every other key, value and comment is kept as it is.
set -euo pipefail
src=${1:?usage: hack/node-config.sh packaging/config.toml}
[ -r "$src" ] || { echo "node-config: cannot read $src" >&2; exit 1; }

awk '
function is_blank(s)   { return s ~ /^[ \t]*$/ }
function is_comment(s) { return s ~ /^[ \t]*#/ }
function is_header(s)  { return s ~ /^[ \t]*\[/ }
function is_sim(s)     { return s ~ /^[ \t]*\[\[[ \t]*gpu\.simulated[ \t]*\]\]/ }
function is_model(s)   { return s ~ /^[ \t]*\[\[[ \t]*(device_plugin\.model|nri\.exempt|nri\.confinement_exempt)[ \t]*\]\]/ }
function mentions_sim(p,  l) { l = tolower(p); return l ~ /simulated/ || l ~ /gpu node/ }
# Header paragraphs (comment lines before the first table, separated by
# "#" lines) are kept unless they are about the simulated example.
function flush_para() {
	if (para == "" || mentions_sim(para)) { para = ""; return }
	if (nparas++ > 0) print "#"
	printf "%s", para
	para = ""
	if (nparas == 1) {
		print "#"
		print "# This is the packaged configuration of a GPU node: backend = \"nvml\""
		print "# reads the node'"'"'s GPUs through the NVIDIA driver. Package upgrades keep"
		print "# local edits. The documented example is in /usr/share/doc/nri-vgpu."
	}
}
BEGIN { header = 1; insim = 0; inmodel = 0; pending = ""; para = ""; nparas = 0 }
header {
	if (is_header($0)) { flush_para(); print ""; header = 0 }
	else if (is_blank($0) || $0 ~ /^[ \t]*#[ \t]*$/) { flush_para(); next }
	else { para = para $0 "\n"; next }
}
is_blank($0) || is_comment($0) { pending = pending $0 "\n"; next }
is_sim($0) { insim = 1; inmodel = 0; pending = ""; next }
insim && !is_header($0) { pending = ""; next }
is_model($0) { inmodel = 1; insim = 0; printf "%s", pending; pending = ""; print "# " $0; next }
inmodel && !is_header($0) { printf "%s", pending; pending = ""; print "# " $0; next }
{
	if (is_header($0)) { insim = 0; inmodel = 0; section = $0; gsub(/[ \t\[\]]/, "", section) }
	if (section == "gpu" && $0 ~ /^[ \t]*backend[ \t]*=/) {
		sub(/=[ \t]*"simulated"/, "= \"nvml\"")
	}
	printf "%s", pending
	pending = ""
	print
}
END { printf "%s", pending }
' "$src"
