"""What PyTorch sees of the GPU; prints one JSON line.

  torchmem.py count          {"device_count": N}: never touches a device
  torchmem.py fill           {"device_count", "name", "free", "total", "allocated", "error"}:
                             mem_get_info, then 256 MiB tensors until PyTorch refuses one
                             ("error" is the exception's type name, "" if none came)
  torchmem.py hold BYTES S   allocates BYTES, prints {"pid", "held"} and keeps them S seconds
"""
import json
import os
import sys
import time

import torch

CHUNK = 256 << 20


def main():
    what = sys.argv[1]
    if what == "count":
        print(json.dumps({"device_count": torch.cuda.device_count()}))
        return
    if what == "hold":
        n, secs = int(sys.argv[2]), float(sys.argv[3])
        x = torch.empty(n, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        print(json.dumps({"pid": os.getpid(), "held": x.numel()}), flush=True)
        time.sleep(secs)
        return
    free, total = torch.cuda.mem_get_info()
    out = {"device_count": torch.cuda.device_count(), "name": torch.cuda.get_device_name(0),
           "free": free, "total": total, "allocated": 0, "error": ""}
    keep = []
    try:
        while True:
            keep.append(torch.empty(CHUNK, dtype=torch.uint8, device="cuda"))
            out["allocated"] += CHUNK
    except Exception as e:  # torch.cuda.OutOfMemoryError expected; anything else is reported
        out["error"] = type(e).__name__
        out["message"] = str(e).splitlines()[0][:160]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
