"""One side of a block shared between two processes, for validate.sh check 10.

    ipcshare.py MODE ROLE DIR SIZE

MODE  ipc:  cuIpcGetMemHandle in the exporter, cuIpcOpenMemHandle / cuIpcCloseMemHandle in
            the importer.
      pool: a stream-ordered pool shared as a POSIX file descriptor (sent over a Unix socket),
            its block by cuMemPoolExportPointer / cuMemPoolImportPointer, freed in the importer
            with cuMemFree.
ROLE  export or import. The two step through files in DIR:
      exporter: allocates SIZE bytes and exports them, writes "exported"; at "go_free" frees
                them (pool: and trims the pool to nothing), writes "freed"; ends at "done".
      importer: imports, writes "opened" (what cuMemGetInfo says is used); at "freed", 0.5 s
                later, "measured"; at "go_close" closes (or frees) the import, and 0.5 s later
                writes "closed"; ends at "done".
Each step the driver refuses ends the process with a message naming the call and its result.
"""
import ctypes
import os
import socket
import sys
import time
from ctypes import POINTER, byref, c_int, c_size_t, c_uint, c_uint64, c_ulonglong, c_void_p

mode, role, w, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cu = ctypes.CDLL("libcuda.so.1")


def call(name, *args):
    rc = getattr(cu, name)(*args)
    if rc != 0:
        sys.exit(f"  {role}: {name} returned {rc}")


def wait(name):
    while not os.path.exists(os.path.join(w, name)):
        time.sleep(0.05)


def mark(name, text=""):
    with open(os.path.join(w, name + ".tmp"), "w") as f:
        f.write(text)
    os.rename(os.path.join(w, name + ".tmp"), os.path.join(w, name))


def used():
    f, t = c_size_t(), c_size_t()
    cu.cuMemGetInfo_v2(byref(f), byref(t))
    return t.value - f.value


class Handle(ctypes.Structure):  # CUipcMemHandle and CUmemPoolPtrExportData: 64 opaque bytes
    _fields_ = [("reserved", ctypes.c_char * 64)]


class PoolProps(ctypes.Structure):  # CUmemPoolProps: 88 bytes
    _fields_ = [("allocType", c_int), ("handleTypes", c_int), ("locType", c_int), ("locId", c_int),
                ("win32SecurityAttributes", c_void_p), ("maxSize", c_size_t), ("usage", ctypes.c_ushort),
                ("reserved", ctypes.c_ubyte * 54)]


assert ctypes.sizeof(PoolProps) == 88
POSIX_FD = 1
cu.cuIpcOpenMemHandle_v2.argtypes = [POINTER(c_uint64), Handle, c_uint]
cu.cuMemPoolCreate.argtypes = [POINTER(c_void_p), POINTER(PoolProps)]
cu.cuMemPoolExportToShareableHandle.argtypes = [POINTER(c_int), c_void_p, c_int, c_ulonglong]
cu.cuMemPoolImportFromShareableHandle.argtypes = [POINTER(c_void_p), c_void_p, c_int, c_ulonglong]
cu.cuMemAllocFromPoolAsync.argtypes = [POINTER(c_uint64), c_size_t, c_void_p, c_void_p]
cu.cuMemPoolExportPointer.argtypes = [POINTER(Handle), c_uint64]
cu.cuMemPoolImportPointer.argtypes = [POINTER(c_uint64), c_void_p, POINTER(Handle)]
cu.cuMemPoolTrimTo.argtypes = [c_void_p, c_size_t]
cu.cuMemFreeAsync.argtypes = [c_uint64, c_void_p]
cu.cuMemFree_v2.argtypes = [c_uint64]
cu.cuStreamSynchronize.argtypes = [c_void_p]

call("cuInit", 0)
dev, ctx = c_int(), c_void_p()
call("cuDeviceGet", byref(dev), 0)
call("cuDevicePrimaryCtxRetain", byref(ctx), dev)
call("cuCtxSetCurrent", ctx)
sock_path = os.path.join(w, "pool.sock")

if role == "export":
    p, h = c_uint64(), Handle()
    if mode == "ipc":
        call("cuMemAlloc_v2", byref(p), c_size_t(size))
        call("cuIpcGetMemHandle", byref(h), p)
    else:
        pool, fd = c_void_p(), c_int(-1)
        props = PoolProps(allocType=1, handleTypes=POSIX_FD, locType=1, locId=dev.value)  # pinned, on the device
        call("cuMemPoolCreate", byref(pool), byref(props))
        call("cuMemPoolExportToShareableHandle", byref(fd), pool, POSIX_FD, 0)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(sock_path)
        srv.listen(1)
        call("cuMemAllocFromPoolAsync", byref(p), c_size_t(size), pool, None)
        call("cuStreamSynchronize", None)
        call("cuMemPoolExportPointer", byref(h), p)
    with open(os.path.join(w, "handle"), "wb") as f:
        f.write(bytes(h))
    mark("exported")
    if mode == "pool":
        conn, _ = srv.accept()
        socket.send_fds(conn, [b"p"], [fd.value])
        conn.close()
    wait("go_free")
    if mode == "ipc":
        print(f"  exporter: cuMemFree rc={cu.cuMemFree_v2(p)}")
    else:
        rc = cu.cuMemFreeAsync(p, None)
        call("cuStreamSynchronize", None)
        print(f"  exporter: cuMemFreeAsync rc={rc}, cuMemPoolTrimTo rc={cu.cuMemPoolTrimTo(pool, 0)}")
    mark("freed")
    wait("done")
else:
    wait("exported")
    with open(os.path.join(w, "handle"), "rb") as f:
        h = Handle.from_buffer_copy(f.read())
    p = c_uint64()
    if mode == "ipc":
        rc = cu.cuIpcOpenMemHandle_v2(byref(p), h, 1)  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
        print(f"  importer: cuIpcOpenMemHandle rc={rc}")
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock_path)
        _, fds, _, _ = socket.recv_fds(s, 1, 1)
        s.close()
        if not fds:
            sys.exit("  importer: no pool descriptor came")
        pool = c_void_p()
        call("cuMemPoolImportFromShareableHandle", byref(pool), c_void_p(fds[0]), POSIX_FD, 0)
        rc = cu.cuMemPoolImportPointer(byref(p), pool, byref(h))
        print(f"  importer: cuMemPoolImportPointer rc={rc}")
    mark("opened", str(used()))
    wait("freed")
    time.sleep(0.5)
    mark("measured", str(used()))
    wait("go_close")
    if mode == "ipc":
        print(f"  importer: cuIpcCloseMemHandle rc={cu.cuIpcCloseMemHandle(p)}")
    else:
        print(f"  importer: cuMemFree rc={cu.cuMemFree_v2(p)}")
    time.sleep(0.5)
    mark("closed", str(used()))
    wait("done")
