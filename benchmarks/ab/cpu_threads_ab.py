"""Thread A/B of the split kernels (csrc/kernels/cpu_pool.h): copy (memcpy, and streaming stores
as into a peer's slot) and float32 SUM reduce, on 1 and N threads, alternating 1, N, 1, N ... so
that a slow stretch of the machine hits both; prints per size and kernel the median and best time
and GB/s (bytes moved: copy 2x the size, reduce 3x) and N threads' speedup over 1 (medians). The
same pool type a host communicator uses (``ringcomm._C._CpuPool``).

Each cell also says where the N-thread pool's workers ran against the calling thread: whether one
of them was on the caller's CPU at the cell's end, and the workers' voluntary / involuntary
context switches during the cell. Placement is decided per process: ``--procs P`` runs the whole
A/B in P fresh processes, one after the other, and ends with the cells where N threads were
slower than 1.

    python benchmarks/ab/cpu_threads_ab.py --threads 2 --sizes 256K,1M,64M --reps 15 [--json out.json]
    python benchmarks/ab/cpu_threads_ab.py --procs 10 --kernels reduce --sizes 1M --reps 25
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

KERNELS = ("reduce", "copy", "copy_stream")


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


def _tids() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def measure(threads: int, sizes: list[int], kernels: list[str], reps: int) -> list[dict]:
    """The A/B in this process: one row per (size, kernel, pool)."""
    from ringcomm._C import _CpuPool
    from ringcomm.core.tables import DTYPE_CODES, op_code
    f32, u8, sum_ = DTYPE_CODES["float32"], DTYPE_CODES["uint8"], op_code("sum")
    one = _CpuPool(1)
    before = _tids()
    many = _CpuPool(threads)
    workers = sorted(_tids() - before)
    caller = os.getpid()  # the main thread's id is the process id
    pools = {1: one, threads: many}
    rows = []
    for size in sizes:
        n = size // 4
        x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        y = np.random.default_rng(1).standard_normal(n).astype(np.float32)
        d = np.empty_like(x)
        calls = {
            "reduce": (lambda pool: pool.reduce(d, x, y, f32, sum_, 1.0, 0), 3),
            "copy": (lambda pool: pool.copy(d.view(np.uint8), x.view(np.uint8), u8, False, 0), 2),
            "copy_stream": (lambda pool: pool.copy(d.view(np.uint8), x.view(np.uint8), u8, True, 0), 2),
        }
        for name in kernels:
            fn, moved = calls[name]
            for pool in pools.values():
                fn(pool)  # warm: pages touched, workers started
            w0 = [_thread_state(t) for t in workers]
            times = {t: [] for t in pools}
            for _ in range(reps):
                for t, pool in pools.items():
                    t0 = time.perf_counter()
                    fn(pool)
                    times[t].append(time.perf_counter() - t0)
            w1, c1 = [_thread_state(t) for t in workers], _thread_state(caller)
            placement = {"one_cpu": any(w[2] == c1[2] for w in w1),
                         "vol": sum(b[0] - a[0] for a, b in zip(w0, w1)),
                         "invol": sum(b[1] - a[1] for a, b in zip(w0, w1))}
            med = {t: float(np.median(v)) for t, v in times.items()}
            for t in pools:
                rows.append({"size": size, "kernel": name, "threads": t, "median_s": med[t],
                             "best_s": min(times[t]), "gbps": moved * size / med[t] / 1e9,
                             "speedup": med[1] / med[t], **placement})
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sizes", default="256K,1M,64M")
    p.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated, of " + ", ".join(KERNELS))
    p.add_argument("--reps", type=int, default=15, help="alternating calls of each pool per cell")
    p.add_argument("--procs", type=int, default=0, help="run the A/B in this many fresh processes (0: in this one)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one of --procs: rows as JSON
    p.add_argument("--json")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    sizes = [parse_size(s) for s in a.sizes.split(",") if s]
    kernels = [k for k in a.kernels.split(",") if k]
    if not kernels or not set(kernels) <= set(KERNELS):
        p.error(f"--kernels {a.kernels!r}: each one of {', '.join(KERNELS)}")
    if a.threads < 2:
        p.error("--threads must be at least 2")
    if a.child:
        print(json.dumps(measure(a.threads, sizes, kernels, a.reps)))
        return 0
    out = {"cpus": sorted(os.sched_getaffinity(0)), "threads": a.threads, "rows": []}
    print(f"# CPUs {out['cpus']}; {a.reps} alternating reps per cell, {max(a.procs, 1)} process(es); "
          f"load average {os.getloadavg()[0]:.2f}; one CPU: a worker on the caller's CPU at the cell's "
          f"end; worker switches voluntary / involuntary in the cell")
    print(f"{'proc':>4} {'size':>10} {'kernel':>12} {'threads':>7} {'median ms':>10} {'best ms':>9} "
          f"{'GB/s':>7} {'speedup':>8} {'one CPU':>7} {'worker vol/invol':>16}")
    for proc in range(max(a.procs, 1)):
        if a.procs:
            args = [sys.executable, os.path.abspath(__file__), "--child", "--threads", str(a.threads),
                    "--sizes", ",".join(map(str, sizes)), "--kernels", ",".join(kernels), "--reps", str(a.reps)]
            res = subprocess.run(args, capture_output=True, text=True, timeout=600)
            if res.returncode != 0:
                print(res.stdout + res.stderr, file=sys.stderr)
                return 1
            rows = json.loads(res.stdout.strip().splitlines()[-1])
        else:
            rows = measure(a.threads, sizes, kernels, a.reps)
        for row in rows:
            row["proc"] = proc
            out["rows"].append(row)
            placed = f"{'yes' if row['one_cpu'] else 'no':>7} {row['vol']:>8}/{row['invol']:<7}" \
                if row["threads"] > 1 else f"{'':>7} {'':>16}"
            print(f"{proc:>4} {row['size']:>10} {row['kernel']:>12} {row['threads']:>7} "
                  f"{row['median_s'] * 1e3:>10.3f} {row['best_s'] * 1e3:>9.3f} {row['gbps']:>7.2f} "
                  f"{row['speedup']:>8.2f} {placed}".rstrip(), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    many = [r for r in out["rows"] if r["threads"] > 1]
    print(f"# {a.threads} threads slower than one in {sum(r['speedup'] < 1 for r in many)} of {len(many)} cells")
    return 0


if __name__ == "__main__":
    sys.exit(main())
