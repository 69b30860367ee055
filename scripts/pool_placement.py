"""Where the split kernels' worker runs, and what it costs: in each of ``--procs`` fresh processes
(placement is decided per process), a two-thread CpuPool (``ringcomm._C._CpuPool``, the pool a
host communicator uses) and a one-thread one alternate float32 SUM reduces of ``--size`` bytes,
``--calls`` of each per round, ``--rounds`` rounds. Per round it prints the median time of the
two-thread and the one-thread calls, whether the worker thread and the calling thread were on one
CPU at the round's end, and the worker's voluntary / involuntary context switches in the round;
then a summary: the rounds whose two-thread median is above the one-thread median.

    python scripts/pool_placement.py [--procs 10] [--rounds 5] [--calls 25] [--size 1M]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from ringcomm.bench.spec import parse_size


def _thread_state(tid: int) -> tuple[int, int, int]:
    """(voluntary switches, involuntary switches, last CPU) of one thread of this process."""
    ctx = {}
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if "ctxt_switches" in line:
                k, v = line.split(":")
                ctx[k.strip()] = int(v)
    with open(f"/proc/self/task/{tid}/stat") as f:
        cpu = int(f.read().rsplit(")", 1)[1].split()[36])
    return ctx["voluntary_ctxt_switches"], ctx["nonvoluntary_ctxt_switches"], cpu


def child(size: int, rounds: int, calls: int) -> None:
    from ringcomm._C import _CpuPool
    from ringcomm.tables import DTYPE_CODES, op_code
    f32, sum_ = DTYPE_CODES["float32"], op_code("sum")
    tids = lambda: {int(t) for t in os.listdir("/proc/self/task")}  # noqa: E731
    one = _CpuPool(1)
    before = tids()
    two = _CpuPool(2)
    worker = (tids() - before).pop()
    caller = os.getpid()  # the main thread's id is the process id
    a = np.ones(size // 4, np.float32)
    b, out = a.copy(), a.copy()
    rows = []
    for _ in range(rounds):
        w0 = _thread_state(worker)
        t1, t2 = [], []
        for _ in range(calls):
            t = time.perf_counter()
            one.reduce(out, a, b, f32, sum_, 1.0, 0)
            t1.append(time.perf_counter() - t)
            t = time.perf_counter()
            two.reduce(out, a, b, f32, sum_, 1.0, 0)
            t2.append(time.perf_counter() - t)
        w1, c1 = _thread_state(worker), _thread_state(caller)
        rows.append({"two_us": float(np.median(t2)) * 1e6, "one_us": float(np.median(t1)) * 1e6,
                     "one_cpu": w1[2] == c1[2], "vol": w1[0] - w0[0], "invol": w1[1] - w0[1]})
    print(json.dumps(rows))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=25)
    p.add_argument("--size", default="1M")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    size = parse_size(a.size)
    if a.child:
        child(size, a.rounds, a.calls)
        return 0
    if len(os.sched_getaffinity(0)) < 2:
        p.error("needs at least 2 CPUs")
    print(f"# {a.procs} processes x {a.rounds} rounds x {a.calls} calls of each pool; float32 SUM "
          f"reduce of {size} B; load average {os.getloadavg()[0]:.2f}")
    print(f"{'proc':>4} {'round':>5} {'2 threads us':>12} {'1 thread us':>11} {'one CPU':>7} "
          f"{'worker vol/invol':>16}")
    slower, total, two_all = 0, 0, []
    for i in range(a.procs):
        res = subprocess.run([sys.executable, __file__, "--child", "--size", str(size), "--rounds",
                              str(a.rounds), "--calls", str(a.calls)], capture_output=True,
                             text=True, timeout=300)
        if res.returncode != 0:
            print(res.stdout + res.stderr, file=sys.stderr)
            return 1
        for r, row in enumerate(json.loads(res.stdout.strip().splitlines()[-1])):
            total += 1
            slower += row["two_us"] > row["one_us"]
            two_all.append(row["two_us"])
            print(f"{i:>4} {r:>5} {row['two_us']:>12.1f} {row['one_us']:>11.1f} "
                  f"{'yes' if row['one_cpu'] else 'no':>7} {row['vol']:>8}/{row['invol']:<7}")
    print(f"# two threads slower than one in {slower} of {total} rounds; median of the two-thread "
          f"round medians {np.median(two_all):.1f} us, max {max(two_all):.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
