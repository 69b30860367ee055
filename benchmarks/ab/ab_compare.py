"""Compare A/B runs of benchmarks/ab/ab_bench.py: the median of the run medians per (collective,
size) for each side, new / old, and the verdict against the bounds (time within 10% up to 256 KiB,
busbw - equivalently time - within 5% at >= 1 MiB).

    python benchmarks/ab/ab_compare.py old1.json old2.json ... -- new1.json new2.json ...
    python benchmarks/ab/ab_compare.py --paired old1.json ... -- new1.json ...

--paired: the runs were taken in pairs (old_k and new_k one right after the other, as many of
each): the verdict is on the median over the pairs of new_k / old_k, which a machine whose speed
drifts between states that last several runs moves far less than the ratio of the two sides'
medians (a run in a slow state and its partner share it). Both ratios are printed.

--near NS (with --paired): judge only the pairs whose two runs read the cross-CPU probe at most NS
ns before and after (``probe_ns`` in ab_bench.py's JSON): on a VM whose host moves the vCPUs
apart for spells, a pair whose sides met different placements compares the placements.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys


def _load(paths):
    return [json.load(open(p)) for p in paths]


def _near(run, ns) -> bool:
    probes = run.get("probe_ns") or [None]
    return all(p is not None and p <= ns for p in probes)


def _median(runs):
    return {coll: {int(n): statistics.median(r[coll][n] for r in runs) for n in runs[0][coll]}
            for coll in runs[0]}


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


class _Sides(argparse.Action):
    """OLD.json ... -- NEW.json ...: the runs before and after the ``--``, at least one each."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values.count("--") != 1 or values[0] == "--" or values[-1] == "--":
            parser.error("give the runs as OLD.json ... -- NEW.json ...")
        i = values.index("--")
        namespace.old, namespace.new = values[:i], values[i + 1:]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                usage="%(prog)s [--paired] OLD.json ... -- NEW.json ...")
    p.add_argument("--paired", action="store_true",
                   help="the runs were taken in pairs (old_k, new_k): judge the median of the pairs' ratios")
    p.add_argument("--near", type=float, default=None, metavar="NS",
                   help="with --paired: only the pairs whose runs read the cross-CPU probe at most NS ns at both ends")
    p.add_argument("runs", nargs=argparse.REMAINDER, action=_Sides, metavar="OLD.json ... -- NEW.json ...")
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    paired = a.paired
    old_json, new_json = _load(a.old), _load(a.new)
    if paired and len(old_json) != len(new_json):
        print(f"--paired needs as many old runs as new ones ({len(old_json)} and {len(new_json)})")
        return 2
    if a.near is not None:
        if not paired:
            print("--near needs --paired")
            return 2
        kept = [(o, n) for o, n in zip(old_json, new_json) if _near(o, a.near) and _near(n, a.near)]
        print(f"pairs near at both ends of both runs (probe <= {a.near:g} ns): {len(kept)} of {len(old_json)}")
        if not kept:
            return 2
        old_json, new_json = [o for o, _ in kept], [n for _, n in kept]
    old_runs, new_runs = [r["medians_us"] for r in old_json], [r["medians_us"] for r in new_json]
    old, new = _median(old_runs), _median(new_runs)
    print(f"old runs: {len(old_runs)}, new runs: {len(new_runs)}" + (" (paired)" if paired else ""))
    print("| collective | size | old us | new us | new/old | " + ("pairs' median new/old | " if paired else "")
          + "bound |")
    print("|---|---:|---:|---:|---:|" + ("---:|" if paired else "") + "---|")
    worst_ok = True
    for coll in old:
        for n in sorted(old[coll]):
            r = new[coll][n] / old[coll][n]
            pr = statistics.median(b[coll][str(n)] / a[coll][str(n)] for a, b in zip(old_runs, new_runs)) \
                if paired else None
            judged = pr if paired else r
            bound = 1.10 if n <= 256 << 10 else 1.05
            ok = bound is None or judged <= bound
            worst_ok &= ok
            b = "-" if bound is None else (f"<= {bound:.2f}: " + ("ok" if ok else "OVER"))
            print(f"| {coll} | {_size(n)} | {old[coll][n]:.1f} | {new[coll][n]:.1f} | {r:.3f} | "
                  + (f"{pr:.3f} | " if paired else "") + f"{b} |")
    return 0 if worst_ok else 1


if __name__ == "__main__":
    sys.exit(main())
