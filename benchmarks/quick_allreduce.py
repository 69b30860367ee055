"""Quick side-by-side: time per all_reduce (float32, SUM) for ringcomm and torch gloo, same
processes, same run. `python benchmarks/quick_allreduce.py [-np 2]` (the full harness is
`python -m ringcomm.bench`)."""
import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from ringcomm.launch import spawn

SIZES = [1 << 10, 64 << 20]


def _time(fn, iters):
    fn()
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def _rank(rank, world, store):
    import torch
    import torch.distributed as dist
    import ringcomm
    dist.init_process_group("gloo", init_method="file://" + store + ".gloo", rank=rank, world_size=world)
    comm = ringcomm.init(rank=rank, world_size=world, init_method="file://" + store + ".rc")
    out = []
    for nbytes in SIZES:
        n = nbytes // 4
        iters = 2000 if nbytes < 1 << 20 else 10
        x = torch.ones(n)
        comm.barrier()
        t_rc = _time(lambda: comm.all_reduce(x), iters)
        dist.barrier()
        t_gl = _time(lambda: dist.all_reduce(x), iters)
        out.append((nbytes, t_rc, t_gl))
    comm.close()
    dist.destroy_process_group()
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-np", type=int, default=2)
    a = p.parse_args()
    d = tempfile.mkdtemp()
    res = spawn(_rank, a.np, (os.path.join(d, "s"),), timeout=600)
    print(f"all_reduce float32 SUM, {a.np} processes, median time per call (max over ranks)")
    print(f"{'size':>10} {'ringcomm':>12} {'gloo':>12} {'speedup':>8}")
    for i, nbytes in enumerate(SIZES):
        rc = max(r[i][1] for r in res)
        gl = max(r[i][2] for r in res)
        size = f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"
        print(f"{size:>10} {rc * 1e6:>10.1f}us {gl * 1e6:>10.1f}us {gl / rc:>7.1f}x")


if __name__ == "__main__":
    main()
