#!/usr/bin/env python3
"""Reads, from the driver itself, the CUDA driver / NVML ABI facts that the
shim's notes mark as inferred: what cuGetProcAddress(_v2) answers for a name
it does not know and for a version above the driver's own, which exported
function a base name resolves to at a given version, the width of the pre-3.2
cuDeviceTotalMem, which symbols libcuda exports. Run it without the shim: it
describes the driver, not us. One line per fact, "abi: <fact> <what was seen>".

    python3 shim/validate/abiprobe.py
"""
import ctypes as C
import ctypes.util
import sys

cu = C.CDLL("libcuda.so.1")
out = []


def say(fact, seen):
    out.append(f"abi: {fact}: {seen}")
    print(out[-1], flush=True)


def sym(name):
    """The address the loader gives for an exported name, or None."""
    try:
        return C.cast(getattr(cu, name), C.c_void_p).value
    except AttributeError:
        return None


def name_of(addr, candidates):
    if not addr:
        return "NULL"
    for n in candidates:
        if sym(n) == addr:
            return n
    return f"{addr:#x} (none of {', '.join(candidates)})"


ver = C.c_int()
cu.cuDriverGetVersion(C.byref(ver))
say("cuDriverGetVersion", ver.value)

# cuGetProcAddress before cuInit, for a name nobody exports.
pfn = C.c_void_p(0xDEAD)
gpa = cu.cuGetProcAddress
gpa.argtypes = [C.c_char_p, C.POINTER(C.c_void_p), C.c_int, C.c_uint64]
rc = gpa(b"cuNoSuchEntryPoint", C.byref(pfn), 11030, 0)
say("cuGetProcAddress (4-arg) unknown name at 11030 before cuInit", f"rc={rc} pfn={pfn.value}")

assert cu.cuInit(0) == 0, "cuInit failed"

gpa2 = cu.cuGetProcAddress_v2
gpa2.argtypes = [C.c_char_p, C.POINTER(C.c_void_p), C.c_int, C.c_uint64, C.POINTER(C.c_int)]


def lookup(name, version, flags=0):
    p, st = C.c_void_p(0xDEAD), C.c_int(-1)
    rc = gpa2(name.encode(), C.byref(p), version, flags, C.byref(st))
    return rc, p.value, st.value


for v in (11030, 12000):
    p = C.c_void_p(0xDEAD)
    rc = gpa(b"cuNoSuchEntryPoint", C.byref(p), v, 0)
    say(f"cuGetProcAddress (4-arg) unknown name at {v}", f"rc={rc} pfn={p.value}")
for v in (11030, 12000):
    rc, p, st = lookup("cuNoSuchEntryPoint", v)
    say(f"cuGetProcAddress_v2 unknown name at {v}", f"rc={rc} pfn={p} status={st}")
rc, p, st = lookup("cuMemAllocAsync", 11000)
say("cuGetProcAddress_v2 cuMemAllocAsync (11020) asked at 11000", f"rc={rc} pfn={p} status={st}")
rc, p, st = lookup("cuMemAlloc", ver.value + 1000)
say(f"cuGetProcAddress_v2 cuMemAlloc at {ver.value + 1000} (above the driver)", f"rc={rc} pfn={'set' if p else p} status={st}")

for base, versions, names in (
    ("cuGraphInstantiate", (10000, 11000, 11039, 11040, 12000),
     ["cuGraphInstantiate", "cuGraphInstantiate_v2", "cuGraphInstantiateWithFlags"]),
    ("cuCtxCreate", (3020, 11040, 12050, 13000),
     ["cuCtxCreate", "cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4"]),
    ("cuDevicePrimaryCtxRelease", (7000, 11000),
     ["cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2"]),
    ("cuMemAlloc", (2000, 3020), ["cuMemAlloc", "cuMemAlloc_v2"]),
    ("cuLaunchKernelEx", (11060, 12000), ["cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"]),
    ("cuLaunchKernel", (7000,), ["cuLaunchKernel", "cuLaunchKernel_ptsz"]),
):
    for v in versions:
        for flags in (0, 2):
            rc, p, st = lookup(base, v, flags)
            say(f"cuGetProcAddress_v2 {base} at {v} flags {flags}", f"rc={rc} status={st} -> {name_of(p, names)}")

for n in ("cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4", "cuMemAlloc", "cuDeviceTotalMem",
          "cuMemGetInfo", "cuGetProcAddress", "cuGetProcAddress_v2", "cuGraphInstantiate_v2",
          "cuMemGetDefaultMemPool", "cuMemGetMemPool", "cuMemSetMemPool", "cuCtxGetDevice_v2",
          "cuCtxSynchronize_v2"):
    say(f"exported {n}", "yes" if sym(n) else "no")

# Pre-3.2 cuDeviceTotalMem: how many bytes of the out-parameter it writes.
buf = (C.c_ubyte * 8)(*([0xAB] * 8))
dev = C.c_int()
cu.cuDeviceGet(C.byref(dev), 0)
rc = cu.cuDeviceTotalMem(buf, dev)
say("cuDeviceTotalMem (bare) bytes written", f"rc={rc} {sum(b != 0xAB for b in bytes(buf))} of 8, value {bytes(buf).hex()}")

# NVML: the v1 process list's record size (16 or 24 bytes) with this process holding a context.
nvml = C.CDLL("libnvidia-ml.so.1")
ctx, p = C.c_void_p(), C.c_uint64()
cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev)
cu.cuCtxSetCurrent(ctx)
cu.cuMemAlloc_v2(C.byref(p), C.c_size_t(64 << 20))
assert nvml.nvmlInit_v2() == 0
h = C.c_void_p()
nvml.nvmlDeviceGetHandleByIndex_v2(0, C.byref(h))
for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2",
           "nvmlDeviceGetComputeRunningProcesses_v3"):
    raw = (C.c_ubyte * 256)(*([0xAB] * 256))
    n = C.c_uint(4)
    try:
        f = getattr(nvml, fn)
    except AttributeError:
        say(f"{fn}", "not exported")
        continue
    rc = f(h, C.byref(n), raw)
    b = bytes(raw)
    last = max((i for i in range(256) if b[i] != 0xAB), default=-1)
    say(f"{fn} with 4 slots", f"rc={rc} count={n.value} bytes written up to offset {last}; first 32: {b[:32].hex()}")
raw = (C.c_ubyte * 64)()
rc = nvml.nvmlDeviceGetMemoryInfo(h, raw)
say("nvmlDeviceGetMemoryInfo (v1: total, free, used)", f"rc={rc} {[int.from_bytes(bytes(raw)[i:i+8], 'little') for i in (0, 8, 16)]}")

if len(sys.argv) > 1:
    open(sys.argv[1], "w").write("\n".join(out) + "\n")
