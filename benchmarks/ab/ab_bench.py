"""A/B harness: times all_reduce, reduce_scatter and all_gather of one ringcomm build through
the public API only, so the same script drives an old and a new build (select the build with
PYTHONPATH). Prints one JSON object: {coll: {bytes: median_us}} where each value is the median
over timed calls of the max over ranks.

    PYTHONPATH=/path/to/old/site python benchmarks/ab/ab_bench.py -np 2 --json old1.json
    python benchmarks/ab/ab_compare.py old*.json -- new*.json      # the medians of the run medians

Sizes are the full tensor (all_reduce's buffer; reduce_scatter's input; all_gather's output).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

SIZES = [1 << k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB, factor 4
COLLS = ("all_reduce", "reduce_scatter", "all_gather")


def _calls(nbytes: int) -> tuple[int, int]:
    """(warm-up calls, timed calls) for one size: at least 20 timed, more for small sizes."""
    timed = max(20, min(400, (64 << 20) // max(nbytes, 1) // 4))
    return max(5, timed // 10), timed


def _rank(comm, sizes, colls, pin):
    world = comm.size  # a property
    if pin:  # rank r on CPU r mod n: both builds see the same placement, never two ranks on one CPU
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[comm.rank % len(cpus)]})
    out = {}
    for coll in colls:
        out[coll] = {}
        for nbytes in sizes:
            count = nbytes // 4
            count -= count % world
            if coll == "all_reduce":
                x = np.ones(count, np.float32)
                call = lambda: comm.all_reduce(x)  # noqa: E731
            elif coll == "reduce_scatter":
                x = np.ones(count, np.float32)
                y = np.empty(count // world, np.float32)
                call = lambda: comm.reduce_scatter(y, x)  # noqa: E731
            else:
                x = np.ones(count // world, np.float32)
                y = np.empty(count, np.float32)
                call = lambda: comm.all_gather(y, x)  # noqa: E731
            warm, timed = _calls(nbytes)
            for _ in range(warm):
                call()
            ts = np.empty(timed)
            for i in range(timed):
                t0 = time.perf_counter()
                call()
                ts[i] = time.perf_counter() - t0
            out[coll][nbytes] = ts.tolist()
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-np", type=int, default=2)
    ap.add_argument("--json", required=True)
    ap.add_argument("--colls", default=",".join(COLLS))
    ap.add_argument("--no-pin", action="store_true", help="leave the ranks unpinned")
    return ap


def main() -> None:
    ap = build_parser()
    a = ap.parse_args()
    import ringcomm
    res = ringcomm.launch(_rank, a.np, args=(SIZES, a.colls.split(","), not a.no_pin), timeout=900)
    report = {"ringcomm": ringcomm.__file__, "np": a.np, "medians_us": {}}
    for coll in a.colls.split(","):
        report["medians_us"][coll] = {
            str(n): float(np.median(np.max(np.array([r[coll][n] for r in res]), axis=0)) * 1e6)
            for n in SIZES}
    with open(a.json, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report["medians_us"]))


if __name__ == "__main__":
    main()
