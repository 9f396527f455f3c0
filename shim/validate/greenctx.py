"""A process that uses only green contexts, for validate.sh check 13 (and the shim tests, on the
fake driver).

    greenctx.py SIZE

Makes a green context of all the device's SMs (cuDeviceGetDevResource, cuDevResourceGenerateDesc,
cuGreenCtxCreate), makes it current (cuCtxFromGreenCtx, cuCtxSetCurrent) and prints what
cuMemGetInfo says is used then ("made"), after allocating SIZE bytes ("allocated"), and, after
cuGreenCtxDestroy and a second green context ("again"): one line "green made allocated again", in
bytes. With no other reference to the primary context, destroying the green context destroys it
with what was allocated in it. Each step the driver refuses ends the process with a message naming
the call and its result.
"""
import ctypes
import sys
from ctypes import POINTER, byref, c_int, c_size_t, c_uint, c_uint64, c_void_p

size = int(sys.argv[1])
cu = ctypes.CDLL("libcuda.so.1")
CU_DEV_RESOURCE_TYPE_SM = 1
# CUdevResource is 144 bytes in CUDA 12.4 (type, 92 bytes of padding, a 48-byte union); room for
# a later driver's larger one.
RESOURCE_BYTES = 4096

cu.cuDeviceGetDevResource.argtypes = [c_int, c_void_p, c_int]
cu.cuDevResourceGenerateDesc.argtypes = [POINTER(c_void_p), c_void_p, c_uint]
cu.cuGreenCtxCreate.argtypes = [POINTER(c_void_p), c_void_p, c_int, c_uint]
cu.cuGreenCtxDestroy.argtypes = [c_void_p]
cu.cuCtxFromGreenCtx.argtypes = [POINTER(c_void_p), c_void_p]
cu.cuCtxSetCurrent.argtypes = [c_void_p]
cu.cuMemAlloc_v2.argtypes = [POINTER(c_uint64), c_size_t]


def call(name, *args):
    rc = getattr(cu, name)(*args)
    if rc != 0:
        sys.exit(f"greenctx: {name} returned {rc}")


def used():
    f, t = c_size_t(), c_size_t()
    call("cuMemGetInfo_v2", byref(f), byref(t))
    return t.value - f.value


def green(dev):
    res = ctypes.create_string_buffer(RESOURCE_BYTES)
    call("cuDeviceGetDevResource", dev, res, CU_DEV_RESOURCE_TYPE_SM)
    desc, g, ctx = c_void_p(), c_void_p(), c_void_p()
    call("cuDevResourceGenerateDesc", byref(desc), res, 1)
    call("cuGreenCtxCreate", byref(g), desc, dev, 0)
    call("cuCtxFromGreenCtx", byref(ctx), g)
    call("cuCtxSetCurrent", ctx)
    return g


call("cuInit", 0)
dev = c_int()
call("cuDeviceGet", byref(dev), 0)
g = green(dev.value)
made = used()
p = c_uint64()
call("cuMemAlloc_v2", byref(p), size)
allocated = used()
call("cuGreenCtxDestroy", g)
green(dev.value)
print(f"green {made} {allocated} {used()}")
