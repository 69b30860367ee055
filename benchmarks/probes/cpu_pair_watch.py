"""Watch the machine's cross-CPU hand-off beside a collective, over time: every --every seconds,
one line with the time, the cross-CPU probe between CPUs A and B (``ringcomm._C._cpu_pair``: two
threads, a cache line's round trip and 256 KiB handed through two slots) and, in a fresh launch of
2 ranks pinned to those CPUs, the median of --calls back-to-back 1 MiB float32 all_reduces.

On a virtual machine whose host moves the vCPUs apart for a spell, the three figures move
together; a launch's memcpy inside one process does not.

    python benchmarks/probes/cpu_pair_watch.py --lines 20 [--every 5] [--cpus 0,1] [--json OUT]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "src"))


def _rank(rank: int, world: int, init: str, cpus: list, calls: int) -> float:
    import ringcomm
    os.sched_setaffinity(0, {cpus[rank]})
    comm = ringcomm.init(rank, world, init_method=init)
    x = np.ones(1 << 18, np.float32)
    for _ in range(10):
        comm.all_reduce(x)
    times = np.empty(calls)
    for i in range(calls):
        t0 = time.perf_counter()
        comm.all_reduce(x)
        times[i] = time.perf_counter() - t0
    comm.close()
    return float(np.median(times))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cpu_pair_watch.py")
    p.add_argument("--lines", type=int, default=20)
    p.add_argument("--every", type=float, default=5.0, help="seconds between lines' starts")
    p.add_argument("--cpus", default=None, help="A,B (default: the first two CPUs of the mask)")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--json", default=None)
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    from ringcomm import _C
    from ringcomm.core.launch import spawn
    cpus = [int(c) for c in a.cpus.split(",")] if a.cpus else sorted(os.sched_getaffinity(0))[:2]
    print(f"# cross-CPU probe between CPUs {cpus[0]} and {cpus[1]}; 2 ranks pinned to them, "
          f"median of {a.calls} 1 MiB all_reduces")
    print(f"# {'time (UTC)':<10} {'round trip (ns)':>16} {'hand-off (GB/s)':>16} "
          f"{'all_reduce 1 MiB (us)':>22}")
    rows = []
    for _ in range(a.lines):
        start = time.monotonic()
        pr = _C._cpu_pair(cpus[0], cpus[1], 256 << 10, 0.2)
        with tempfile.TemporaryDirectory() as d:
            med = max(spawn(_rank, 2, ("file://" + os.path.join(d, "r"), cpus, a.calls),
                            timeout=120))
        row = {"utc": datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S"), **pr,
               "all_reduce_1m_us": med * 1e6}
        rows.append(row)
        print(f"  {row['utc']:<10} {pr['round_trip_ns']:16.0f} {pr['handoff_gbps']:16.2f} "
              f"{row['all_reduce_1m_us']:22.1f}", flush=True)
        time.sleep(max(0.0, a.every - (time.monotonic() - start)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpus": cpus, "calls": a.calls, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
