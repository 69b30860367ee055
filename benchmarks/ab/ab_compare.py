"""Compare A/B runs of benchmarks/ab/ab_bench.py: the median of the run medians per (collective,
size) for each side, new / old, and the verdict against the bounds (time within 10% at <= 64 KiB,
busbw - equivalently time - within 5% at >= 1 MiB).

    python benchmarks/ab/ab_compare.py old1.json old2.json ... -- new1.json new2.json ...
"""
from __future__ import annotations

import json
import statistics
import sys


def _load(paths):
    runs = [json.load(open(p))["medians_us"] for p in paths]
    out = {}
    for coll in runs[0]:
        out[coll] = {int(n): statistics.median(r[coll][n] for r in runs) for n in runs[0][coll]}
    return out


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def main(argv) -> int:
    if "--" not in argv or argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    i = argv.index("--")
    old, new = _load(argv[:i]), _load(argv[i + 1:])
    print(f"old runs: {i}, new runs: {len(argv) - i - 1}")
    print("| collective | size | old us | new us | new/old | bound |")
    print("|---|---:|---:|---:|---:|---|")
    worst_ok = True
    for coll in old:
        for n in sorted(old[coll]):
            r = new[coll][n] / old[coll][n]
            bound = 1.10 if n <= 64 << 10 else 1.05 if n >= 1 << 20 else None
            ok = bound is None or r <= bound
            worst_ok &= ok
            b = "-" if bound is None else (f"<= {bound:.2f}: " + ("ok" if ok else "OVER"))
            print(f"| {coll} | {_size(n)} | {old[coll][n]:.1f} | {new[coll][n]:.1f} | {r:.3f} | {b} |")
    return 0 if worst_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
