# Sourced by validate.sh and probe.sh: builds the shim, checks the machine,
# and defines the helpers both use (limits, shimmed, result).
#   $1: the GPU index (default 0)
# Environment:
#   PYTHON      the Python with PyTorch (default python3)
#   SHIM        a libvgpu-shim.so built elsewhere (a machine without a
#               compiler, the GPU bundle): nothing is built here
#   SHIM_TOOLS  with SHIM, the directory of regiondump, dlsymlog.so, rtprog
#               and procreplay (default: SHIM's directory if regiondump is
#               there, else test/ beside validate/, as in the GPU bundle)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
gpu=${1:-0}
export PYTHON=${PYTHON:-python3}
if [ -n "${SHIM:-}" ]; then
	[ -f "$SHIM" ] || { echo "validate: SHIM=$SHIM is not a file" >&2; exit 1; }
	SHIM=$(realpath "$SHIM")
	if [ -z "${SHIM_TOOLS:-}" ]; then
		SHIM_TOOLS=$(dirname "$SHIM")
		[ -x "$SHIM_TOOLS/regiondump" ] || SHIM_TOOLS=$PWD/test
	fi
else
	make -s || exit 1
	SHIM=$PWD/build/libvgpu-shim.so
	SHIM_TOOLS=$PWD/build
fi
# Exported: the checks' inner shells (in pid namespaces) use it.
export SHIM_TOOLS
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
[ -e /run/nri-vgpu/limits ] && { echo "validate: /run/nri-vgpu/limits exists; overrides would be ignored" >&2; exit 1; }
command -v nvidia-smi >/dev/null || { echo "validate: nvidia-smi not found" >&2; exit 1; }
"$PYTHON" -c 'import torch; assert torch.cuda.is_available()' || { echo "validate: PyTorch with CUDA needed ($PYTHON)" >&2; exit 1; }

uuid=$(nvidia-smi -i "$gpu" --query-gpu=uuid --format=csv,noheader | tr -d ' ')
total_mib=$(nvidia-smi -i "$gpu" --query-gpu=memory.total --format=csv,noheader,nounits | tr -d ' ')
limit=$(( total_mib / 4 * 1048576 ))   # a quarter of the card
fails=0
result() { if [ "$1" = 0 ]; then echo "PASS $2"; else echo "FAIL $2"; fails=$((fails + 1)); fi; }

limits() { # limits MEMORY CORES: a new container (limits file and a region of its own)
	rm -rf "$W/region" && mkdir -p "$W/region"
	printf 'version=1\ngpu.0.uuid=%s\ngpu.0.memory=%s\ngpu.0.cores=%s\ncores.policy=hard\nlog.level=warn\n' \
		"$uuid" "$1" "$2" >"$W/limits"
}
shimmed() { CUDA_VISIBLE_DEVICES=$gpu NRI_VGPU_LIMITS=$W/limits NRI_VGPU_REGION_DIR=$W/region LD_PRELOAD=$SHIM "$@"; }
