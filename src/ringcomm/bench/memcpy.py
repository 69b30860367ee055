"""The ceiling: single-process memcpy bandwidth on this machine, per size, measured in the same
run as the collectives (``numpy.copyto`` into a preallocated buffer).

A shared-memory collective moves every byte through at least one copy, so large-message busbw
cannot beat this roof. Source and destination are page-aligned: with the same in-page offset
the copy never suffers 4K aliasing (with a destination a few bytes past the source modulo 4096
the CPU takes each load for one that depends on a recent store, and the roof would be that slowed
copy's). Both are allocated once at the largest size and touched before timing. Bandwidth = bytes copied / second (1e9).

``python -m ringcomm.bench.memcpy [-b 1K] [-e 256M] [-f 4]`` prints the table on its own.
"""
from __future__ import annotations

import time

import numpy as np

PAGE = 4096


def _aligned(nbytes: int, align: int = PAGE) -> np.ndarray:
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = (-raw.ctypes.data) % align
    buf = raw[start:start + nbytes]
    buf[...] = 1                                  # fault every page in before timing
    return buf


def measure_memcpy(sizes: list[int], budget: float = 0.05, max_iters: int = 200,
                   warmup: int = 2) -> dict[int, dict]:
    """{size: {"time_s": median, "min_s": min, "gbps": size / median / 1e9, "iters": n}}."""
    if not sizes:
        return {}
    top = max(sizes)
    src, dst = _aligned(top), _aligned(top)
    perf, copyto = time.perf_counter, np.copyto
    out = {}
    for size in sorted(set(sizes)):
        s, d = src[:size], dst[:size]
        t0 = perf()
        for _ in range(max(1, warmup)):
            copyto(d, s)
        est = (perf() - t0) / max(1, warmup)
        n = max(3, min(max_iters, int(budget / max(est, 1e-9))))
        times = np.empty(n)
        for i in range(n):
            t0 = perf()
            copyto(d, s)
            times[i] = perf() - t0
        med = float(np.median(times))
        out[size] = {"time_s": med, "min_s": float(times.min()), "gbps": size / med / 1e9,
                     "iters": n}
    return out


def main(argv=None) -> int:
    import argparse
    from .spec import format_size, parse_size, size_sweep
    p = argparse.ArgumentParser(prog="python -m ringcomm.bench.memcpy",
                                description="single-process memcpy bandwidth (the ceiling)")
    p.add_argument("-b", "--minbytes", default="1K")
    p.add_argument("-e", "--maxbytes", default="256M")
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    a = p.parse_args(argv)
    sizes = size_sweep(parse_size(a.minbytes), parse_size(a.maxbytes), a.stepfactor)
    print(f"# {'size':>12}  {'time(us)':>10}  {'GB/s':>7}")
    for size, r in measure_memcpy(sizes).items():
        print(f"  {size:>12}  {r['time_s'] * 1e6:10.2f}  {r['gbps']:7.2f}   # {format_size(size)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
