"""The all_reduce tables of docs/benchmarks.md ("The latest tables") from one
benchmarks/report/bench_tables.sh run.

    python benchmarks/report/bench_readme_tables.py DIR
    python benchmarks/report/bench_readme_tables.py --headline DIR   # the README's table: median / p90 / p99

DIR holds np2_b2b.json, np2_apart.json, np4_b2b.json, np4_apart.json and (optionally)
np2_b2b_load2.json, np2_apart_load2.json. Prints, per dtype, a markdown table of all_reduce times
(ringcomm in place, with MPICH / DeepSpeed / gloo in place beside it: µs, the median over timed
calls of the max over ranks). The runs are read by check_targets.py's ``load_runs`` (beside this
file), the reader ``python benchmarks/report/check_targets.py --runs DIR`` judges them with.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_targets import RUNS, load_runs, size_name  # noqa: E402

PEERS = ["mpi", "deepspeed", "gloo"]


def fmt(v):
    if v is None:
        return "n/a"
    return f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def main(d):
    # Every timed cell is printed, one whose check failed too (the run's own report flags it);
    # the targets leave such a cell out.
    cells = load_runs(d, keep_wrong=True)
    t = lambda run, dt, size, lib: (cells.get((run, dt, size, lib)) or {}).get("time_us")  # noqa: E731
    runs = [r for r in RUNS if any(k[0] == r for k in cells)]
    dtypes = sorted({k[1] for k in cells}, key=lambda x: x != "float32")
    sizes = sorted({k[2] for k in cells})
    for dt in dtypes:
        print(f"**all_reduce {dt}, time in µs: ringcomm (MPICH / DeepSpeed / gloo), all in place**\n")
        print("| size | " + " | ".join(r.replace("_", " ") for r in runs) + " |")
        print("|---:|" + "---|" * len(runs))
        for s in sizes:
            row = [f"{fmt(t(r, dt, s, 'ringcomm'))} ({' / '.join(fmt(t(r, dt, s, p)) for p in PEERS)})" for r in runs]
            print(f"| {size_name(s)} | " + " | ".join(row) + " |")
        print()


HEADLINE_LIBS = [("ringcomm", "ringcomm"), ("mpi", "MPICH"), ("deepspeed", "DeepSpeed"), ("gloo", "gloo")]


def spread(cell):
    """'median / p90 / p99' µs of one cell; p99 only where the cell timed >= 100 calls (the
    bench's rule: the JSON's p99 is null below that), else '-'."""
    if not cell:
        return "n/a"
    p99 = cell.get("p99_us")
    return f"{fmt(cell['time_us'])} / {fmt(cell['p90_us'])} / {'-' if p99 is None else fmt(p99)}"


def headline(d, dtype="float32", runs=("np2_b2b", "np2_apart")):
    """The README's headline table: float32 all_reduce in place, 2 ranks, per library and arrival
    mode the median / p90 / p99 µs, the best median per mode in bold."""
    cells = load_runs(d, keep_wrong=True)
    sizes = sorted({k[2] for k in cells if k[1] == dtype and k[0] in runs})
    cols = [(r, lib, f"{label} {r.split('_', 1)[1]}") for r in runs for lib, label in HEADLINE_LIBS
            if any(k[0] == r and k[3] == lib for k in cells)]
    print("| size | " + " | ".join(c[2] for c in cols) + " |")
    print("|---:|" + "---:|" * len(cols))
    for s in sizes:
        row = []
        for r, lib, _ in cols:
            cell = cells.get((r, dtype, s, lib))
            best = min((cells[(r, dtype, s, l)]["time_us"] for l, _ in HEADLINE_LIBS
                        if (r, dtype, s, l) in cells), default=None)
            text = spread(cell)
            if cell and cell["time_us"] == best:
                med, rest = text.split(" / ", 1)
                text = f"**{med}** / {rest}"
            row.append(text)
        print(f"| {size_name(s)} | " + " | ".join(row) + " |")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", metavar="DIR", help="a bench_tables.sh output folder")
    ap.add_argument("--headline", action="store_true", help="the README's table: median / p90 / p99")
    return ap


if __name__ == "__main__":
    a = build_parser().parse_args()
    if a.headline:
        headline(a.dir)
    else:
        main(a.dir)
