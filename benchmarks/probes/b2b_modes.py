"""Calls back to back in one pair of processes, window by window: the steady states a run settles in.

Two ranks calling one collective back to back do not run at one speed: the pair settles into a
steady state (the ranks entering together, or one a fraction of a call behind the other) that lasts
thousands of calls and then changes, and each state has its own time per call. A run's median is
then whichever state it met. Per window of calls this prints the call's median (from the first
rank's entry to the last rank's exit), each rank's own median, the median entry skew (rank 1's
entry minus rank 0's), and the cross-CPU probe (``ringcomm._C._cpu_pair``) read between windows
(the ranks wait at a barrier meanwhile). The last call's result is checked against numpy.

    python benchmarks/probes/b2b_modes.py --coll all_reduce --size 16K --calls 100000 --window 4000 --pin
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

COLLS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all")


def _size(s: str) -> int:
    s = s.strip().upper()
    return int(s.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)


def _rank(rank, world, store, coll, nbytes, calls, window, pin, env):
    import ringcomm
    from ringcomm import _C
    from ringcomm.bench.checked import CheckedCall
    from ringcomm.core.config import environment
    cpus = sorted(os.sched_getaffinity(0))
    if pin:
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    with environment(env):
        comm = ringcomm.init(rank=rank, world_size=world, init_method=f"file://{store}", prefix="b2b-modes",
                             timeout=120)
    try:
        count = max(world, nbytes // 4 - (nbytes // 4) % world)
        case = CheckedCall(coll, count, rank, world)
        call = case.bound(comm)
        case.fill()
        for _ in range(500):
            call()
        perf = time.perf_counter
        start, end = np.empty(calls), np.empty(calls)
        probes = []
        for w0 in range(0, calls, window):
            comm.barrier()
            if rank == 0:
                probes.append(_C._cpu_pair(cpus[0], cpus[1 % len(cpus)], seconds=0.01)["round_trip_ns"])
            comm.barrier()
            for i in range(w0, min(calls, w0 + window)):
                a = perf()
                call()
                start[i], end[i] = a, perf()
        case.fill()
        call()
        return start, end, probes, case.wrong()
    finally:
        comm.close()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--coll", choices=COLLS, default="all_reduce")
    ap.add_argument("--size", default="16K", help="bytes (1K, 4M, ...)")
    ap.add_argument("--calls", type=int, default=100000)
    ap.add_argument("--window", type=int, default=4000)
    ap.add_argument("--pin", action="store_true", help="rank r on CPU r")
    ap.add_argument("--env", default="", help="K=V,... for the communicator")
    ap.add_argument("--json", default=None)
    return ap


def main() -> int:
    a = build_parser().parse_args()
    from ringcomm.core.launch import spawn
    env = dict(kv.split("=", 1) for kv in a.env.split(",") if kv.strip())
    store = tempfile.mkdtemp(prefix="b2b-modes-")
    res = spawn(_rank, 2, (store, a.coll, _size(a.size), a.calls, a.window, a.pin, env), timeout=1200)
    (s0, e0, probes, w0), (s1, e1, _, w1) = res
    call = np.maximum(e0, e1) - np.minimum(s0, s1)
    print(f"# b2b_modes: {a.coll} {a.size}, 2 ranks{' pinned' if a.pin else ''}, {a.calls} calls in windows of "
          f"{a.window}; env {a.env or 'defaults'}")
    print("# command: python benchmarks/probes/b2b_modes.py " + " ".join(sys.argv[1:]))
    print("| calls from | call p50 us | rank 0 p50 us | rank 1 p50 us | entry skew p50 us | probe before, ns |")
    print("|---:|---:|---:|---:|---:|---:|")
    rows = []
    for k, w in enumerate(range(0, a.calls, a.window)):
        s = slice(w, min(a.calls, w + a.window))
        row = [w, np.median(call[s]) * 1e6, np.median(e0[s] - s0[s]) * 1e6, np.median(e1[s] - s1[s]) * 1e6,
               np.median(s1[s] - s0[s]) * 1e6, probes[k]]
        rows.append([float(v) for v in row])
        print(f"| {w} | {row[1]:.2f} | {row[2]:.2f} | {row[3]:.2f} | {row[4]:+.2f} | {row[5]:.0f} |")
    wrong = w0 + w1
    print(f"# check: {'ok' if wrong == 0 else f'FAIL ({wrong} wrong elements)'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": rows, "wrong": wrong}, f, indent=1)
    return 0 if wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
