"""Back-to-back calls of one collective at 2 ranks, with what each rank spent: the bench's
per-call figure (median over calls of the max over ranks), each rank's wall time per call over
the whole loop (its throughput), its CPU time per call, its context switches per call and its
wait counters (comm.wait_stats(): colocated waits, sleeps, lost yields). Where the ranks share a
CPU (start it under `taskset -c 1`) the two figures part: a rank whose wait hands the CPU to its
peer lets the peer run several calls, so each of its waiting calls spans them.

    taskset -c 1 python benchmarks/probes/shared_cpu_calls.py --coll reduce --bytes 1024 --calls 3000
"""
from __future__ import annotations

import argparse
import resource
import sys
import time

import numpy as np

COLLS = ("all_reduce", "reduce", "broadcast", "all_to_all")


def _rank(comm, coll, nbytes, calls):
    n = max(2, nbytes // 4 - (nbytes // 4) % 2)
    x = np.ones(n, np.float32)
    y = np.empty(n, np.float32)
    f = {"all_reduce": lambda: comm.all_reduce(x), "reduce": lambda: comm.reduce(x, root=0),
         "broadcast": lambda: comm.broadcast(x, root=0), "all_to_all": lambda: comm.all_to_all(y, x)}[coll]
    for _ in range(200):
        f()
    s0 = comm.wait_stats()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    ts = np.empty(calls)
    w0, c0 = time.perf_counter(), time.process_time()
    for i in range(calls):
        t = time.perf_counter()
        f()
        ts[i] = time.perf_counter() - t
    wall, cpu = (time.perf_counter() - w0) / calls, (time.process_time() - c0) / calls
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    s1 = comm.wait_stats()
    waits = {k: s1[k] - s0[k] for k in s1 if isinstance(s1[k], int)}
    return {"times": ts, "wall_us": wall * 1e6, "cpu_us": cpu * 1e6, "waits": waits,
            "switches": (r1.ru_nvcsw - r0.ru_nvcsw + r1.ru_nivcsw - r0.ru_nivcsw) / calls}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--coll", choices=COLLS, required=True)
    ap.add_argument("--bytes", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=3000)
    return ap


def main() -> int:
    a = build_parser().parse_args()
    import ringcomm
    res = ringcomm.launch(_rank, 2, args=(a.coll, a.bytes, a.calls), timeout=600)
    per_call = np.max(np.stack([r["times"] for r in res]), axis=0)
    print(f"# {a.coll} {a.bytes} B, 2 ranks, {a.calls} calls back to back; "
          "command: python benchmarks/probes/shared_cpu_calls.py " + " ".join(sys.argv[1:]))
    print(f"per-call median (max over ranks): {np.median(per_call) * 1e6:.1f} us")
    for k, r in enumerate(res):
        print(f"rank {k}: wall/call {r['wall_us']:.1f} us, cpu/call {r['cpu_us']:.1f} us, "
              f"switches/call {r['switches']:.2f}, waits {r['waits']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
