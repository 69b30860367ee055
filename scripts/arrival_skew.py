"""Where the tail of calls that arrive apart comes from, bound and unbound, in one run.

Each round launches ``-np`` ranks with ``bind=none`` and with ``bind=core`` (in the order of
bind_rounds.py). Every rank runs ``--calls`` all_reduces (float32 SUM,
out of place) per size, each after a separator (``--separator gloo``: torch.distributed gloo's
barrier, the bench's ``--arrival apart``; ``ringcomm``: the communicator's own barrier) and
``--spin-us`` of compute, and records the call's entry and exit on CLOCK_MONOTONIC (one clock
for every process of the machine). Per call:

  call   the bench's figure: the max over ranks of exit - entry (the first rank's time includes
         waiting for the last one to arrive)
  skew   the last rank's entry - the first rank's (the separator's release spread plus the compute)
  after  the last exit - the last entry: the collective once every rank has arrived

and per cell the p50 / p90 / p99 of each, with the rank's wait counters over the timed calls
(``comm.wait_stats()``: waits that slept on the futex, waits that found the peer on their CPU).

    python scripts/arrival_skew.py -np 2 --rounds 3 --sizes 1K,64K --calls 2000 [--separator gloo|ringcomm] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
from bind_rounds import run_alternating

from ringcomm.bench.harness import spin_us
from ringcomm.bench.spec import parse_size
from ringcomm.launch import launch


def _rank(comm, store_path: str, sizes: list[int], calls: int, sep: str, us: float) -> dict:
    """Entry and exit times (ns) of every timed call per size, and the wait counters' deltas."""
    barrier = comm.barrier
    dist = None
    if sep == "gloo":
        from datetime import timedelta

        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        dist.init_process_group("gloo", store=dist.FileStore(store_path, comm.size), rank=comm.rank,
                                world_size=comm.size, timeout=timedelta(seconds=120))
        barrier = dist.barrier
    clock = time.monotonic_ns
    out = {"plan": str(comm.cpu_plan), "sizes": {}}
    try:
        for nbytes in sizes:
            x = np.ones(nbytes // 4, np.float32)
            y = np.empty_like(x)
            for _ in range(100):
                barrier()
                comm.all_reduce(x, output=y)
            t_in = np.empty(calls, np.int64)
            t_out = np.empty(calls, np.int64)
            before = comm.wait_stats()
            for i in range(calls):
                barrier()
                spin_us(us)
                t_in[i] = clock()
                comm.all_reduce(x, output=y)
                t_out[i] = clock()
            after = comm.wait_stats()
            if not np.all(y == comm.size):
                raise RuntimeError(f"rank {comm.rank}: wrong all_reduce result at {nbytes} B")
            out["sizes"][nbytes] = {"in": t_in.tolist(), "out": t_out.tolist(),
                                    "waits": {k: after[k] - before.get(k, 0) for k in after}}
    finally:
        if dist is not None:
            dist.destroy_process_group()
    return out


def _quantiles(v: np.ndarray) -> list[float]:
    return [float(np.percentile(v, p)) for p in (50, 90, 99)]


def measure(world: int, bind: str, sizes: list[int], calls: int, sep: str, us: float) -> dict:
    """{size: {"call"|"skew"|"after": [p50, p90, p99] us, "waits": [per rank]}} of one launch."""
    with tempfile.TemporaryDirectory(prefix="arrival-skew-") as tmp:
        res = launch(_rank, world, args=(os.path.join(tmp, "store"), sizes, calls, sep, us),
                     bind=bind, timeout=600)
    cells = {}
    for nbytes in sizes:
        t_in = np.array([r["sizes"][nbytes]["in"] for r in res])
        t_out = np.array([r["sizes"][nbytes]["out"] for r in res])
        cells[nbytes] = {"call": _quantiles((t_out - t_in).max(axis=0) / 1e3),
                         "skew": _quantiles((t_in.max(axis=0) - t_in.min(axis=0)) / 1e3),
                         "after": _quantiles((t_out.max(axis=0) - t_in.max(axis=0)) / 1e3),
                         "waits": [r["sizes"][nbytes]["waits"] for r in res]}
    return {"plans": [r["plan"] for r in res], "cells": cells}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-np", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sizes", default="1K,4K,16K,64K")
    p.add_argument("--calls", type=int, default=2000, help="timed calls per cell")
    p.add_argument("--separator", choices=("gloo", "ringcomm"), default="gloo")
    p.add_argument("--spin-us", type=float, default=50.0, help="compute after the separator, us")
    p.add_argument("--json", help="write every figure here")
    a = p.parse_args(argv)
    sizes = [parse_size(s) for s in a.sizes.split(",") if s]
    runs = run_alternating(a.rounds, lambda bind: measure(a.np, bind, sizes, a.calls, a.separator, a.spin_us))
    print(f"# all_reduce float32 out-of-place, {a.np} ranks, {a.calls} calls a cell, separator "
          f"{a.separator} + {a.spin_us:g} us; p50 / p90 / p99 us; slept = futex sleeps (all ranks)")
    print(f"{'size':>7} {'round':>5} {'bind':>4} | {'call p50':>8} {'p90':>7} {'p99':>7} | "
          f"{'skew p50':>8} {'p90':>7} {'p99':>7} | {'after p50':>9} {'p90':>7} {'p99':>7} | {'slept':>5}")
    summary = {}
    for s in sizes:
        ratio = {}
        for bind in ("none", "core"):
            for r, run in enumerate(runs[bind]):
                c = run["cells"][s]
                slept = sum(w.get("slept", 0) for w in c["waits"])
                print(f"{s:>7} {r + 1:>5} {bind:>4} | {c['call'][0]:>8.1f} {c['call'][1]:>7.1f} "
                      f"{c['call'][2]:>7.1f} | {c['skew'][0]:>8.1f} {c['skew'][1]:>7.1f} "
                      f"{c['skew'][2]:>7.1f} | {c['after'][0]:>9.1f} {c['after'][1]:>7.1f} "
                      f"{c['after'][2]:>7.1f} | {slept:>5}")
            ratio[bind] = {k: float(np.mean([run["cells"][s][k][1] / run["cells"][s][k][0]
                                             for run in runs[bind]])) for k in ("call", "after")}
        summary[s] = {"mean_p90_over_p50": ratio,
                      "core_over_none": {k: ratio["core"][k] / ratio["none"][k] for k in ("call", "after")}}
        print(f"{s:>7} mean p90/p50: call none {ratio['none']['call']:.2f} core {ratio['core']['call']:.2f} "
              f"(core/none {summary[s]['core_over_none']['call']:.2f}); after none "
              f"{ratio['none']['after']:.2f} core {ratio['core']['after']:.2f} "
              f"(core/none {summary[s]['core_over_none']['after']:.2f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "runs": {k: [{"plans": run["plans"],
                                                       "cells": {str(s): c for s, c in run["cells"].items()}}
                                                      for run in v] for k, v in runs.items()},
                       "summary": {str(s): v for s, v in summary.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
