"""Tails with and without binding, in one run: alternates ``python -m ringcomm.bench --bind none``
and ``--bind core`` (all_reduce float32, out-of-place, no peers) ``--rounds`` times each and prints,
per size, the median and p90 of every round and p90/p50, unbound beside bound, then the mean of
p90/p50 over the rounds, bound's over unbound's, and the spread of the rounds' medians (slowest
over fastest: a slow state slows a whole cell). The order alternates (none first in odd
rounds, core first in even ones) so that a slow stretch of the machine does not favour one side.

    python scripts/bind_tails.py -np 2 --rounds 3 -b 1K -e 64K [--budget 0.3] [--arrival apart:50] [--load N] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile


def bench(world: int, bind: str, lo: str, hi: str, budget: float, arrival: str = "b2b", load: int = 0) -> dict:
    """{size: (p50_us, p90_us, calls)} of one bench run."""
    with tempfile.TemporaryDirectory(prefix="bind-tails-") as tmp:
        path = os.path.join(tmp, "b.json")
        cmd = [sys.executable, "-m", "ringcomm.bench", "-np", str(world), "--ops", "all_reduce",
               "-b", lo, "-e", hi, "--peers", "none", "--no-inplace", "--bind", bind,
               "--time-budget", str(budget), "--arrival", arrival, "--load", str(load),
               "--json", path]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(path) as f:
            data = json.load(f)
    out = {}
    for row in data["tables"][0]["rows"]:
        cell = row["libs"]["ringcomm/out-of-place"]
        out[row["size"]] = (cell["time_us"], cell["p90_us"], cell["iters"])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-np", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("-b", default="1K")
    p.add_argument("-e", default="64K")
    p.add_argument("--budget", type=float, default=0.3, help="seconds of timed calls per cell")
    p.add_argument("--arrival", default="b2b", help="the bench's --arrival: b2b, apart[:US] (calls that "
                   "arrive apart: a barrier and US us of compute before each), skew:US")
    p.add_argument("--load", type=int, default=0, help="the bench's --load: N busy processes beside the ranks")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args(argv)
    runs = {"none": [], "core": []}
    for r in range(a.rounds):
        for bind in (("none", "core") if r % 2 == 0 else ("core", "none")):
            runs[bind].append(bench(a.np, bind, a.b, a.e, a.budget, a.arrival, a.load))
            print(f"# round {r + 1} bind {bind} done", file=sys.stderr)
    sizes = sorted(runs["none"][0])
    print(f"# all_reduce float32 out-of-place, {a.np} ranks, {a.rounds} rounds, arrival {a.arrival}, load {a.load}; per cell "
          f"p50 / p90 us and p90/p50 (unbound | bound)")
    print(f"{'size':>8} {'round':>5} {'none p50':>9} {'p90':>8} {'p90/p50':>8} | "
          f"{'core p50':>9} {'p90':>8} {'p90/p50':>8}")
    summary = {}
    for s in sizes:
        rn, rc = [], []
        for r in range(a.rounds):
            n50, n90, _ = runs["none"][r][s]
            c50, c90, _ = runs["core"][r][s]
            rn.append(n90 / n50)
            rc.append(c90 / c50)
            print(f"{s:>8} {r + 1:>5} {n50:>9.2f} {n90:>8.2f} {n90 / n50:>8.2f} | "
                  f"{c50:>9.2f} {c90:>8.2f} {c90 / c50:>8.2f}")
        mn, mc = sum(rn) / len(rn), sum(rc) / len(rc)
        # A slow state holds a whole cell (every call slower), which a cell's own p90/p50 does not
        # show: the rounds' medians do (the slowest round's over the fastest's).
        sn = [runs["none"][r][s][0] for r in range(a.rounds)]
        sc = [runs["core"][r][s][0] for r in range(a.rounds)]
        summary[s] = {"none_p90_p50": mn, "core_p90_p50": mc, "core_over_none": mc / mn,
                      "none_p50_max_over_min": max(sn) / min(sn), "core_p50_max_over_min": max(sc) / min(sc),
                      "none_p50_median": sorted(sn)[len(sn) // 2], "core_p50_median": sorted(sc)[len(sc) // 2]}
        print(f"{s:>8} {'mean':>5} {'':>9} {'':>8} {mn:>8.2f} | {'':>9} {'':>8} {mc:>8.2f}   "
              f"bound/unbound {mc / mn:.2f}; rounds' p50 max/min: none {max(sn) / min(sn):.2f}, "
              f"core {max(sc) / min(sc):.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": {k: [{str(s): v for s, v in run.items()} for run in vs]
                                for k, vs in runs.items()}, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
