"""reduce_scatter and all_gather busbw against all_reduce's, measured in the same processes.

    python benchmarks/probes/rs_ag_ratio.py BYTES [ITERS] [WORLD]

Each iteration runs, after a barrier each, all_reduce (in place and out of place),
reduce_scatter and all_gather (each out of place and in place) of BYTES bytes of float32, so the
five collectives see the same machine state; prints the median time of each (max over ranks) and
its busbw (nccl-tests' factors: all_reduce 2(n-1)/n, the others (n-1)/n of the full tensor) as a
fraction of all_reduce's busbw in the same form (in place against in place).
"""
import argparse
import multiprocessing as mp
import os
import tempfile
import time

import numpy as np


def _rank(rank, world, path, nbytes, iters, q):
    import ringcomm

    comm = ringcomm.init(rank=rank, world_size=world, init_method="file://" + path)
    cnt = nbytes // 4
    per = cnt // world
    x = np.ones(cnt, np.float32)
    z = np.empty(cnt, np.float32)
    y = np.ones(cnt, np.float32)
    rs_out = np.empty(per, np.float32)
    ag_in = np.ones(per, np.float32)
    own = y[rank * per:(rank + 1) * per]
    calls = {
        "all_reduce ip": lambda: comm.all_reduce(x),
        "all_reduce oop": lambda: comm.all_reduce(x, output=z),
        "reduce_scatter oop": lambda: comm.reduce_scatter(rs_out, y),
        "reduce_scatter ip": lambda: comm.reduce_scatter(own, y),
        "all_gather oop": lambda: comm.all_gather(y, ag_in),
        "all_gather ip": lambda: comm.all_gather(y, own),
    }
    times = {k: [] for k in calls}
    for it in range(iters + 3):
        for k, f in calls.items():
            comm.barrier()
            t0 = time.perf_counter_ns()
            f()
            if it >= 3:
                times[k].append(time.perf_counter_ns() - t0)
    comm.close()
    q.put({k: float(np.median(v)) for k, v in times.items()})


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("nbytes", type=int, metavar="BYTES")
    p.add_argument("iters", type=int, nargs="?", default=20, metavar="ITERS")
    p.add_argument("world", type=int, nargs="?", default=2, metavar="WORLD")
    return p


def main(argv=None):
    p = build_parser()
    a = p.parse_args(argv)
    nbytes, iters, world = a.nbytes, a.iters, a.world
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "store")
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        ps = [ctx.Process(target=_rank, args=(r, world, path, nbytes, iters, q)) for r in range(world)]
        for p in ps:
            p.start()
        res = [q.get(timeout=600) for _ in ps]
        for p in ps:
            p.join(timeout=60)
    med = {k: max(r[k] for r in res) for k in res[0]}  # ns
    f = (world - 1) / world
    bw = {k: (2 if k.startswith("all_reduce") else 1) * f * nbytes / med[k] for k in med}  # GB/s
    print(f"# {nbytes} B float32, world {world}, {iters} iterations; time = median of the max over ranks")
    for k in med:
        base = bw["all_reduce " + k.split()[1]]
        print(f"{k:20s} {med[k] / 1e3:10.1f} us  busbw {bw[k]:6.2f} GB/s  {bw[k] / base:5.2f}x all_reduce's")


if __name__ == "__main__":
    main()
