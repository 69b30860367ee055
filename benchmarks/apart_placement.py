"""Where the slow calls of ``--arrival apart`` come from: 2 ranks, each call of a 1 KiB float32
all_reduce (in place) preceded by a torch.distributed gloo barrier, with the CPU each rank is on
when it enters the call (``sched_getcpu``) recorded beside the call's time.

    python benchmarks/apart_placement.py [CALLS]

Prints the median of the max over ranks for the calls whose two ranks entered on the same CPU
and for the others, with their counts, and each rank's ``comm.wait_stats()``.
"""
import ctypes
import os
import sys
import tempfile
import time

import numpy as np

_libc = ctypes.CDLL(None)
_libc.sched_getcpu.restype = ctypes.c_int


def _rank(comm, store_path, calls):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, comm.world_size), rank=comm.rank,
                            world_size=comm.world_size)
    x = np.ones(256, np.float32)
    for _ in range(50):
        dist.barrier()
        comm.all_reduce(x)
    rec = []
    for _ in range(calls):
        dist.barrier()
        cpu = _libc.sched_getcpu()
        t0 = time.perf_counter()
        comm.all_reduce(x)
        rec.append((cpu, (time.perf_counter() - t0) * 1e6))
    stats = comm.wait_stats()
    dist.destroy_process_group()
    return rec, stats


def main(argv):
    from ringcomm.launch import launch
    calls = int(argv[1]) if len(argv) > 1 else 300
    with tempfile.TemporaryDirectory() as d:
        (r0, s0), (r1, s1) = launch(_rank, 2, args=(os.path.join(d, "store"), calls), timeout=600)
    same = [max(a[1], b[1]) for a, b in zip(r0, r1) if a[0] == b[0]]
    other = [max(a[1], b[1]) for a, b in zip(r0, r1) if a[0] != b[0]]

    def med(v):
        return f"{np.median(v):.1f} us" if v else "-"
    print(f"one CPU at entry: {len(same)} calls, median {med(same)}; "
          f"two CPUs: {len(other)} calls, median {med(other)}; all: {med(same + other)}")
    print(f"wait_stats rank 0 {s0}, rank 1 {s1}")


if __name__ == "__main__":
    main(sys.argv)
