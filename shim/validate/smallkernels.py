#!/usr/bin/env python3
"""The SM limiter's hardest load on a real GPU: 1-element PyTorch kernels (a
1-block launch each), launched one by one ("eager") or as a captured CUDA
graph of 50 of them ("graph"), as fast as the host can. Prints the time the
capture took, then the launch (eager) or replay (graph) rate of each window,
one line each:

    capture_ms 1.2
    23427
    ...

    smallkernels.py graph|eager SECONDS...   one window per SECONDS given
"""
import sys
import time

import torch

kind, windows = sys.argv[1], [float(a) for a in sys.argv[2:]]
x = torch.ones(1, device="cuda")
s = torch.cuda.Stream()
with torch.cuda.stream(s):  # warm-up off the default stream, as capture wants
    x.add_(1)
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
t = time.time()
with torch.cuda.graph(g):
    for _ in range(50):
        x.add_(1)
print(f"capture_ms {round((time.time() - t) * 1000, 1)}", flush=True)
run = g.replay if kind == "graph" else (lambda: x.add_(1))
for sec in windows:
    torch.cuda.synchronize()
    t, n = time.time(), 0
    while time.time() - t < sec:
        run()
        n += 1
    torch.cuda.synchronize()
    print(round(n / (time.time() - t)), flush=True)
