"""The README's benchmark tables from one scripts/bench_tables.sh run.

    python scripts/bench_readme_tables.py DIR

DIR holds np2_b2b.json, np2_apart.json, np4_b2b.json, np4_apart.json and (optionally)
np2_b2b_load2.json, np2_apart_load2.json. Prints, per dtype, a markdown table of all_reduce times
(ringcomm in place, with MPICH / DeepSpeed / gloo in place beside it: µs, the median over timed
calls of the max over ranks). ``python scripts/check_targets.py --runs DIR`` checks our targets
on the same runs.
"""
import json
import os
import sys

RUNS = ["np2_b2b", "np2_apart", "np4_b2b", "np4_apart", "np2_b2b_load2", "np2_apart_load2"]
PEERS = ["mpi", "deepspeed", "gloo"]


def load(d):
    out = {}
    for run in RUNS:
        p = os.path.join(d, run + ".json")
        if not os.path.exists(p):
            continue
        doc = json.load(open(p))
        for t in doc["tables"]:
            if t["op"] != "all_reduce":
                continue
            for row in t["rows"]:
                for name, cell in row["libs"].items():
                    lib, _, mode = name.partition("/")
                    if mode == "in-place" and "time_us" in cell:
                        out[(run, t["dtype"], row["size"], lib)] = cell
    return out


def size_name(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def fmt(v):
    if v is None:
        return "n/a"
    return f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def main(d):
    cells = load(d)
    t = lambda run, dt, size, lib: (cells.get((run, dt, size, lib)) or {}).get("time_us")
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
