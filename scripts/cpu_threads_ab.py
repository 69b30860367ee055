"""Thread A/B of the split kernels (csrc/kernels/cpu_pool.h) in one process: copy (memcpy, and
streaming stores as into a peer's slot) and float32 SUM reduce, on 1 and N threads, alternating
1, N, 1, N ... so that a slow stretch of the machine hits both; prints per size and kernel the
median and best time and GB/s (bytes moved: copy 2x the size, reduce 3x) and N threads' speedup
over 1 (medians). The same pool type a host communicator uses (``ringcomm._C._CpuPool``).

    python scripts/cpu_threads_ab.py --threads 2 --sizes 256K,1M,64M --reps 15 [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from ringcomm._C import _CpuPool
from ringcomm.bench.spec import parse_size
from ringcomm.tables import DTYPE_CODES, op_code

F32, U8, SUM = DTYPE_CODES["float32"], DTYPE_CODES["uint8"], op_code("sum")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sizes", default="256K,1M,64M")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--json")
    a = p.parse_args(argv)
    pools = {1: _CpuPool(1), a.threads: _CpuPool(a.threads)}
    out = {"cpus": sorted(os.sched_getaffinity(0)), "threads": a.threads, "rows": []}
    print(f"# one process on CPUs {out['cpus']}; {a.reps} alternating reps per cell; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'size':>10} {'kernel':>12} {'threads':>7} {'median ms':>10} {'best ms':>9} "
          f"{'GB/s':>7} {'speedup':>8}")
    for size in [parse_size(s) for s in a.sizes.split(",")]:
        n = size // 4
        x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        y = np.random.default_rng(1).standard_normal(n).astype(np.float32)
        d = np.empty_like(x)
        kernels = {
            "reduce": (lambda pool: pool.reduce(d, x, y, F32, SUM, 1.0, 0), 3),
            "copy": (lambda pool: pool.copy(d.view(np.uint8), x.view(np.uint8), U8, False, 0), 2),
            "copy_stream": (lambda pool: pool.copy(d.view(np.uint8), x.view(np.uint8), U8, True, 0), 2),
        }
        for name, (fn, moved) in kernels.items():
            times = {t: [] for t in pools}
            for t, pool in pools.items():
                fn(pool)  # warm: pages touched, workers started
            for _ in range(a.reps):
                for t, pool in pools.items():
                    t0 = time.perf_counter()
                    fn(pool)
                    times[t].append(time.perf_counter() - t0)
            med = {t: float(np.median(v)) for t, v in times.items()}
            for t in pools:
                row = {"size": size, "kernel": name, "threads": t, "median_s": med[t],
                       "best_s": min(times[t]), "gbps": moved * size / med[t] / 1e9,
                       "speedup": med[1] / med[t]}
                out["rows"].append(row)
                print(f"{size:>10} {name:>12} {t:>7} {med[t] * 1e3:>10.3f} {min(times[t]) * 1e3:>9.3f} "
                      f"{row['gbps']:>7.2f} {row['speedup']:>8.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
