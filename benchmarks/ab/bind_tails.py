"""Tails with and without binding, in one run: alternates ``python -m ringcomm.bench --bind none``
and ``--bind core`` (all_reduce float32, out-of-place, no peers) ``--rounds`` times each, in the
order of bind_rounds.py, and prints, per size and round, the median and p90 of the bench's
figures unbound beside bound:

  call   the bench's figure: per call, the max over ranks of the call's time (with ``--arrival
         apart|skew`` an early rank's time includes its wait for the last one to arrive)
  after  with ``--arrival apart|skew`` only: the last rank's end minus the last rank's start
         (what the library adds once every rank has arrived; ``harness.after_arrival``)

then per figure the mean over the rounds of p90/p50, bound's over unbound's, and the spread of
the rounds' call medians (slowest over fastest: a slow state slows a whole cell).

    python benchmarks/ab/bind_tails.py -np 2 --rounds 3 -b 1K -e 64K [--budget 0.3] [--arrival apart:50] [--load N] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from bind_rounds import run_alternating

FIGURES = {"call": ("time_us", "p90_us"), "after": ("after_p50_us", "after_p90_us")}


def bench(world: int, bind: str, lo: str, hi: str, budget: float, arrival: str = "b2b", load: int = 0) -> dict:
    """{size: {"call": (p50_us, p90_us), "after": (p50_us, p90_us) or absent, "calls": n}} of one
    bench run."""
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
        out[row["size"]] = {"calls": cell["iters"], **{
            fig: (cell[k50], cell[k90]) for fig, (k50, k90) in FIGURES.items() if cell.get(k50) is not None}}
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
    runs = run_alternating(a.rounds, lambda bind: bench(a.np, bind, a.b, a.e, a.budget, a.arrival, a.load))
    sizes = sorted(runs["none"][0])
    figures = [f for f in FIGURES if f in runs["none"][0][sizes[0]]]
    print(f"# all_reduce float32 out-of-place, {a.np} ranks, {a.rounds} rounds, arrival {a.arrival}, "
          f"load {a.load}; per cell p50 / p90 us and p90/p50 (unbound | bound)")
    summary = {}
    for fig in figures:
        print(f"# {fig}")
        print(f"{'size':>8} {'round':>5} {'none p50':>9} {'p90':>8} {'p90/p50':>8} | "
              f"{'core p50':>9} {'p90':>8} {'p90/p50':>8}")
        for s in sizes:
            ratios = {"none": [], "core": []}
            for r in range(a.rounds):
                cells = []
                for bind in ("none", "core"):
                    p50, p90 = runs[bind][r][s][fig]
                    ratios[bind].append(p90 / p50)
                    cells.append(f"{p50:>9.2f} {p90:>8.2f} {p90 / p50:>8.2f}")
                print(f"{s:>8} {r + 1:>5} " + " | ".join(cells))
            mn, mc = (sum(ratios[b]) / len(ratios[b]) for b in ("none", "core"))
            # A slow state holds a whole cell (every call slower), which a cell's own p90/p50 does
            # not show: the rounds' medians do (the slowest round's over the fastest's).
            med = {b: [runs[b][r][s][fig][0] for r in range(a.rounds)] for b in ("none", "core")}
            spread = {b: max(v) / min(v) for b, v in med.items()}
            summary.setdefault(s, {})[fig] = {
                "none_p90_p50": mn, "core_p90_p50": mc, "core_over_none": mc / mn,
                "none_p50_max_over_min": spread["none"], "core_p50_max_over_min": spread["core"],
                "none_p50_median": sorted(med["none"])[len(med["none"]) // 2],
                "core_p50_median": sorted(med["core"])[len(med["core"]) // 2]}
            print(f"{s:>8} {'mean':>5} {'':>9} {'':>8} {mn:>8.2f} | {'':>9} {'':>8} {mc:>8.2f}   "
                  f"bound/unbound {mc / mn:.2f}; rounds' p50 max/min: none {spread['none']:.2f}, "
                  f"core {spread['core']:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "runs": {k: [{str(s): v for s, v in run.items()} for run in vs]
                                                 for k, vs in runs.items()},
                       "summary": {str(s): v for s, v in summary.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
