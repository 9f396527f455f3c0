#!/usr/bin/env python3
"""Driver facts the shim's host-pid discovery and context footprint rest on,
read from the driver and NVML directly (ctypes, no toolkit). Run without the
shim unless a mode says otherwise. One line per fact.

    nvmlprobe.py hold TAG MIB GO   a context holding MIB MiB; prints TAG, getpid()
                                   and NVML's compute-process list as this
                                   process sees it, once GO exists (then exits)
    nvmlprobe.py list TAG          NVML's compute-process list from here
    nvmlprobe.py timeline [DUMP REGION]
                                   this process's memory as NVML lists it (and
                                   cuMemGetInfo's used) after each step of a
                                   PyTorch start: context, first allocations,
                                   cuBLAS, cuDNN; with DUMP and REGION (run
                                   under the shim) also what the shim's slot
                                   in the usage region holds at that moment
"""
import ctypes as C
import os
import subprocess
import sys
import time

nvml = C.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0, "nvmlInit_v2"
dev = C.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, C.byref(dev)) == 0


class Proc(C.Structure):  # nvmlProcessInfo_t (v2/v3 layout)
    _fields_ = [("pid", C.c_uint), ("used", C.c_ulonglong), ("gi", C.c_uint), ("ci", C.c_uint)]


def procs():
    arr = (Proc * 256)()
    n = C.c_uint(256)
    rc = nvml.nvmlDeviceGetComputeRunningProcesses_v3(dev, C.byref(n), arr)
    if rc != 0:
        return f"rc={rc}"
    return " ".join(f"{arr[i].pid}:{arr[i].used >> 20}MiB" for i in range(n.value)) or "(none)"


def mine():
    arr = (Proc * 256)()
    n = C.c_uint(256)
    if nvml.nvmlDeviceGetComputeRunningProcesses_v3(dev, C.byref(n), arr) != 0:
        return -1
    for i in range(n.value):
        if arr[i].pid == os.getpid():
            return arr[i].used
    return -1


def context(mib):
    cu = C.CDLL("libcuda.so.1")
    assert cu.cuInit(0) == 0
    ctx, p = C.c_void_p(), C.c_uint64()
    assert cu.cuDevicePrimaryCtxRetain(C.byref(ctx), 0) == 0 and cu.cuCtxSetCurrent(ctx) == 0
    if mib:
        assert cu.cuMemAlloc_v2(C.byref(p), C.c_size_t(mib << 20)) == 0
    return cu


mode = sys.argv[1]
if mode == "hold":
    tag, mib, go = sys.argv[2], int(sys.argv[3]), sys.argv[4]
    context(mib)
    open(go + "." + tag, "w").close()
    for _ in range(600):
        if os.path.exists(go):
            break
        time.sleep(0.05)
    ns = os.readlink("/proc/self/ns/pid")
    print(f"{tag}: getpid={os.getpid()} pidns={ns} holds {mib} MiB; NVML lists: {procs()}", flush=True)
elif mode == "list":
    print(f"{sys.argv[2]}: NVML lists: {procs()}", flush=True)
elif mode == "timeline":
    dump = sys.argv[2:4] if len(sys.argv) >= 4 else None
    cu = None

    def slot():
        if not dump:
            return ""
        out = subprocess.run([dump[0], dump[1]], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith(f"proc pid={os.getpid()} "):
                used = [f for f in line.split() if f.startswith("used0=")]
                return f" shim slot {int(used[0][6:]) >> 20} MiB" if used else ""
        return " shim slot -"

    def used():
        if cu is None:
            return "-"
        f, t = C.c_size_t(), C.c_size_t()
        cu.cuMemGetInfo_v2(C.byref(f), C.byref(t))
        return f"{(t.value - f.value) >> 20} MiB"

    def step(what):
        m = mine()
        print(f"timeline: {what:34s} NVML {m >> 20 if m >= 0 else '-'} MiB, cuMemGetInfo used {used()}{slot()}",
              flush=True)

    cu = C.CDLL("libcuda.so.1")
    assert cu.cuInit(0) == 0
    step("cuInit")
    ctx = C.c_void_p()
    assert cu.cuDevicePrimaryCtxRetain(C.byref(ctx), 0) == 0 and cu.cuCtxSetCurrent(ctx) == 0
    step("primary context")
    time.sleep(0.5)
    step("primary context + 0.5 s")
    p = C.c_uint64()
    assert cu.cuMemAlloc_v2(C.byref(p), C.c_size_t(2 << 20)) == 0
    step("cuMemAlloc 2 MiB")
    q = C.c_uint64()
    assert cu.cuMemAlloc_v2(C.byref(q), C.c_size_t(64 << 20)) == 0
    step("cuMemAlloc 64 MiB more")
    import torch
    x = torch.ones(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    step("torch tensor 4 MiB (+ caching)")
    (x @ x).sum().item()
    step("matmul (cuBLAS)")
    torch.nn.functional.conv2d(x[None, None], x[None, None, :3, :3]).sum().item()
    step("conv2d (cuDNN)")
    time.sleep(1.2)
    step("1.2 s later")
else:
    sys.exit(f"nvmlprobe: unknown mode {mode}")
