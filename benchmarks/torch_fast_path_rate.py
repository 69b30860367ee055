"""dist.broadcast on backend "ringcomm" with the c10d trampoline's C++ fast path on and off, in
the same 2 processes: the mean µs per call of 20 000 synchronous calls (float32, root 0), the
slower rank's, two alternations of each mode per size.

    python benchmarks/torch_fast_path_rate.py

"off" disables the trampoline's fast path (``_set_fast_path(0, 0)``), so every call takes
the Python half (src/ringcomm/torch/collectives.py): the difference is what the C++ path saves
per call.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from torch_ranks import run_ranks  # noqa: E402

SIZES = (1024, 4096, 65536)
CALLS = 20000


def _rank(rank, world):
    be = dist.group.WORLD._get_backend(torch.device("cpu"))
    res = {}
    for nb in SIZES:
        x = torch.ones(nb // 4)
        for mode in ("on", "off", "on", "off"):
            if mode == "off":
                be._set_fast_path(0, 0)
                be._fast_native = False
            else:
                be._refresh_fast()
            for _ in range(2000):
                dist.broadcast(x, src=0)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(CALLS):
                dist.broadcast(x, src=0)
            res.setdefault(f"{nb} B, fast path {mode}", []).append((time.perf_counter() - t0) / CALLS * 1e6)
    return res


def main():
    out = run_ranks(_rank, 2, backend="ringcomm")
    for key in out[0]:
        print(f"dist.broadcast {key}: " + ", ".join(f"{max(a, b):.2f}" for a, b in zip(out[0][key], out[1][key]))
              + " us/call")


if __name__ == "__main__":
    main()
