"""A torch intra-op pool started before the rank is pinned (as a model built before the
communicator starts it), each rank on its ``bind=core`` share of the CPUs, timed two ways in
separate processes, alternating ``--rounds`` times:

  kept    the rank pinned by ``ringcomm.core.cpus.apply_affinity`` alone: the pool keeps its size
          (every CPU of the machine's worth of threads, now all on the rank's share)
  ringcomm  the rank pinned by ``ringcomm.init`` under ``RINGCOMM_BIND=core``, which also caps
          the pool at the rank's share (``ringcomm.core.cpus.cap_torch_threads``)

and prints per rank the pool's threads and the median us per float32 matmul (N x N, ``--reps``).

    python benchmarks/ab/bind_torch_pool.py -np 2 [--n 256] [--reps 200] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def _start_pool(threads: int) -> None:
    import torch
    torch.set_num_threads(threads)
    torch.mm(torch.ones(64, 64), torch.ones(64, 64))


def _time_mm(n: int, reps: int) -> float:
    import torch
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(5):
        torch.mm(a, b)
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b)
    return (time.perf_counter() - t0) / reps * 1e6


def _kept(rank, world, n, reps, threads):
    import torch
    from ringcomm.core.cpus import apply_affinity, core_share
    _start_pool(threads)
    apply_affinity(core_share(sorted(os.sched_getaffinity(0)), rank, world))
    return torch.get_num_threads(), _time_mm(n, reps)


def _ringcomm(rank, world, n, reps, threads, store):
    import torch
    import ringcomm
    _start_pool(threads)
    with ringcomm.init(rank=rank, world_size=world, init_method="file://" + store):
        return torch.get_num_threads(), _time_mm(n, reps)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-np", type=int, default=2)
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    return p


def main(argv=None) -> int:
    from ringcomm.core.launch import spawn
    p = build_parser()
    a = p.parse_args(argv)
    threads = len(os.sched_getaffinity(0))
    runs: dict[str, list] = {"kept": [], "ringcomm": []}
    for _ in range(a.rounds):
        runs["kept"].append(spawn(_kept, a.np, (a.n, a.reps, threads), timeout=300))
        with tempfile.TemporaryDirectory(prefix="bind-torch-pool-") as tmp:
            reg = os.path.join(tmp, "reg")
            runs["ringcomm"].append(spawn(_ringcomm, a.np, (a.n, a.reps, threads, tmp), timeout=300,
                                          env={"RINGCOMM_BIND": "core", "RINGCOMM_BIND_REGISTRY": reg}))
    print(f"# float32 matmul {a.n}x{a.n}, {a.np} ranks on their bind=core share, torch pool of "
          f"{threads} threads started before the pinning; median us per matmul over {a.rounds} "
          f"rounds of {a.reps}")
    for r in range(a.np):
        cells = []
        for how, rounds in runs.items():
            us = sorted(got[r][1] for got in rounds)[len(rounds) // 2]
            cells.append(f"{how}: {rounds[0][r][0]} threads {us:.1f} us")
        print(f"rank {r}: " + "  |  ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
