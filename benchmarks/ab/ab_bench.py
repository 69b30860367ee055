"""A/B harness: times all_reduce, reduce_scatter and all_gather (or any of those, reduce,
broadcast and all_to_all: --colls) of one ringcomm build through the public API only, so the same script drives an old and a new build (select the build with
PYTHONPATH). Prints one JSON object: {coll: {bytes: median_us}} where each value is the median
over timed calls of the max over ranks.

    PYTHONPATH=/path/to/old/site python benchmarks/ab/ab_bench.py -np 2 --json old1.json
    python benchmarks/ab/ab_compare.py old*.json -- new*.json      # the medians of the run medians

Sizes are the full tensor (all_reduce's, reduce's and broadcast's buffer, root 0, in place;
reduce_scatter's input; all_gather's output; all_to_all's input and output), 1 KiB to 64 MiB by 4
or --sizes.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

SIZES = [1 << k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB, factor 4
COLLS = ("all_reduce", "reduce_scatter", "all_gather")
ALL_COLLS = COLLS + ("reduce", "broadcast", "all_to_all")


def _parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s.rstrip("KMG")) * mult


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
            elif coll == "reduce":
                x = np.ones(count, np.float32)
                call = lambda: comm.reduce(x, root=0)  # noqa: E731
            elif coll == "broadcast":
                x = np.ones(count, np.float32)
                call = lambda: comm.broadcast(x, root=0)  # noqa: E731
            elif coll == "all_to_all":
                x = np.ones(count, np.float32)
                y = np.empty(count, np.float32)
                call = lambda: comm.all_to_all(y, x)  # noqa: E731
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


def _probe():
    """The cross-CPU probe's round trip (ns) between the first two CPUs this process may run on
    (ranks 0 and 1 when pinned), or None where there is one CPU or the build has no probe."""
    cpus = sorted(os.sched_getaffinity(0))
    try:
        from ringcomm import _C
        return float(_C._cpu_pair(cpus[0], cpus[1])["round_trip_ns"]) if len(cpus) > 1 else None
    except (AttributeError, RuntimeError, OSError):
        return None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-np", type=int, default=2)
    ap.add_argument("--json", required=True)
    ap.add_argument("--colls", default=",".join(COLLS))
    ap.add_argument("--no-pin", action="store_true", help="leave the ranks unpinned")
    ap.add_argument("--sizes", default=None, help="bytes, comma-separated (1K, 4M, ...)")
    return ap


def main() -> None:
    ap = build_parser()
    a = ap.parse_args()
    import ringcomm
    colls = a.colls.split(",")
    bad = [c for c in colls if c not in ALL_COLLS]
    if bad:
        ap.error(f"--colls: unknown {', '.join(bad)} (known: {', '.join(ALL_COLLS)})")
    sizes = [_parse_size(s) for s in a.sizes.split(",")] if a.sizes else SIZES
    before = _probe()
    res = ringcomm.launch(_rank, a.np, args=(sizes, colls, not a.no_pin), timeout=900)
    # The host may move the vCPUs nearer and farther apart between and during runs
    # (docs/benchmarks.md); ab_compare.py --near keeps the pairs run near at both ends.
    report = {"ringcomm": ringcomm.__file__, "np": a.np, "probe_ns": [before, _probe()], "medians_us": {}}
    for coll in colls:
        report["medians_us"][coll] = {
            str(n): float(np.median(np.max(np.array([r[coll][n] for r in res]), axis=0)) * 1e6)
            for n in sizes}
    with open(a.json, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report["medians_us"]))


if __name__ == "__main__":
    main()
