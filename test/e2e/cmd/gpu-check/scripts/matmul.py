"""A matmul loop for a fixed time; prints {"iters_per_s", "iters", "seconds"} as one JSON line.

  matmul.py SECONDS WARMUP

8192 x 8192 fp16 matmuls (about 2 ms each on an H200), synchronised every 10, counted after
WARMUP seconds (the SM limiter settles and the clocks ramp up first).
"""
import json
import sys
import time

import torch

N = 8192
BATCH = 10


def main():
    secs, warm = float(sys.argv[1]), float(sys.argv[2])
    a = torch.randn(N, N, device="cuda", dtype=torch.float16)
    b = torch.randn(N, N, device="cuda", dtype=torch.float16)
    t_warm = time.monotonic() + warm
    while time.monotonic() < t_warm:
        for _ in range(BATCH):
            torch.mm(a, b)
        torch.cuda.synchronize()
    iters, t0 = 0, time.monotonic()
    while True:
        for _ in range(BATCH):
            torch.mm(a, b)
        torch.cuda.synchronize()
        iters += BATCH
        t = time.monotonic() - t0
        if t >= secs:
            break
    print(json.dumps({"iters_per_s": iters / t, "iters": iters, "seconds": t}))


if __name__ == "__main__":
    main()
