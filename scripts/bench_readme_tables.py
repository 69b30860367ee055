"""The all_reduce tables of docs/benchmarks.md ("The latest tables") from one
scripts/bench_tables.sh run.

    python scripts/bench_readme_tables.py DIR

DIR holds np2_b2b.json, np2_apart.json, np4_b2b.json, np4_apart.json and (optionally)
np2_b2b_load2.json, np2_apart_load2.json. Prints, per dtype, a markdown table of all_reduce times
(ringcomm in place, with MPICH / DeepSpeed / gloo in place beside it: µs, the median over timed
calls of the max over ranks). The runs are read by scripts/check_targets.py's ``load_runs``, the
reader ``python scripts/check_targets.py --runs DIR`` judges them with.
"""
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


if __name__ == "__main__":
    main(sys.argv[1])
