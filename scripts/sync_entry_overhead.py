"""Per-call time of a synchronous 1 KiB all_reduce (in place, back to back) through the plain
API, by array type: a numpy float32 array, a torch float32 tensor and a torch bfloat16 tensor.
Each rank times `--iters` calls after a warm-up, `--repeats` times; the median of rank 0's
per-repeat means is printed per array type. `--world 1` leaves out the peer: what remains is the
front's cost (Python, the binding, the description, the rule) and the core's entry. Run in a
fresh TORCH_EXTENSIONS_DIR to see what a user without the torch backend's trampoline gets:

    TORCH_EXTENSIONS_DIR=$(mktemp -d) python scripts/sync_entry_overhead.py --world 2
"""
import argparse
import statistics
import time

import numpy as np


def _rank(comm, iters, repeats, pin):
    import os

    import torch
    if pin:
        os.sched_setaffinity(0, {comm.rank % os.cpu_count()})
    cases = {"numpy float32": np.ones(256, np.float32),
             "torch float32": torch.ones(256),
             "torch bfloat16": torch.ones(512, dtype=torch.bfloat16)}
    out = {}
    for name, x in cases.items():
        means = []
        for _ in range(repeats):
            for _ in range(200):
                comm.all_reduce(x)
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                comm.all_reduce(x)
            means.append((time.perf_counter() - t0) / iters * 1e6)
        out[name] = means
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--pin", action="store_true", help="pin rank r to CPU r")
    a = ap.parse_args()
    from ringcomm.launch import launch
    res = launch(_rank, a.world, args=(a.iters, a.repeats, a.pin))
    for name, means in res[0].items():
        print(f"{name:16s} median {statistics.median(means):6.2f} us  min {min(means):6.2f}  "
              f"max {max(means):6.2f}  ({a.repeats} x {a.iters} calls)")


if __name__ == "__main__":
    main()
