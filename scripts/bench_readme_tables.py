"""The README's benchmark tables and the latency targets' verdicts from one scripts/bench_tables.sh run.

    python scripts/bench_readme_tables.py DIR

DIR holds np2_b2b.json, np2_apart.json, np4_b2b.json, np4_apart.json and (optionally)
np2_b2b_load2.json, np2_apart_load2.json. Prints, per dtype, a markdown table of all_reduce times
(ringcomm in place, with MPICH / DeepSpeed / gloo in place beside it: µs, the median over timed
calls of the max over ranks), then each target of the latency issue, checked on these numbers
(float32 and bfloat16; ratios within one run), with the worst size.
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

    def check(label, pairs, bound, better="lower"):
        """pairs: [(size, ringcomm value, reference value)]; ratio = rc / ref must be <= bound."""
        pairs = [(s, a, b) for s, a, b in pairs if a is not None and b is not None]
        if not pairs:
            print(f"- {label}: not measured")
            return
        ratios = [(a / b, s, a, b) for s, a, b in pairs]
        worst = max(ratios)
        ok = worst[0] <= bound
        print(f"- {label}: {'met' if ok else 'NOT met'} (worst {size_name(worst[1])}: "
              f"{fmt(worst[2])} vs {fmt(worst[3])} µs, {worst[0]:.2f}x; bound {bound:g}x)")

    print("Targets (ratio = ringcomm time / the other's, in one run):\n")
    for dt in dtypes:
        small = [s for s in sizes if s <= 64 << 10]
        if dt == "float32":
            check(f"{dt} 2 ranks b2b <= 1.0x MPICH at <= 64 KiB",
                  [(s, t("np2_b2b", dt, s, "ringcomm"), t("np2_b2b", dt, s, "mpi")) for s in small], 1.0)
        check(f"{dt} 2 ranks b2b <= 1.0x DeepSpeed at every size",
              [(s, t("np2_b2b", dt, s, "ringcomm"), t("np2_b2b", dt, s, "deepspeed")) for s in sizes], 1.0)
        for peer in ("mpi", "deepspeed"):
            if dt != "float32" and peer == "mpi":
                continue
            check(f"{dt} 2 ranks b2b busbw >= 1.5x {peer} at >= 16 MiB (time <= 1/1.5)",
                  [(s, t("np2_b2b", dt, s, "ringcomm"), t("np2_b2b", dt, s, peer)) for s in sizes if s >= 16 << 20],
                  1 / 1.5)
        check(f"{dt} 2 ranks apart <= 1.0x DeepSpeed from 1 KiB to 1 MiB",
              [(s, t("np2_apart", dt, s, "ringcomm"), t("np2_apart", dt, s, "deepspeed")) for s in sizes
               if 1 << 10 <= s <= 1 << 20], 1.0)
        for arr in ("b2b", "apart"):
            check(f"{dt} 2 ranks {arr} --load 2 median <= 2x the quiet one at 1 KiB and 64 KiB",
                  [(s, t(f"np2_{arr}_load2", dt, s, "ringcomm"), t(f"np2_{arr}", dt, s, "ringcomm"))
                   for s in (1 << 10, 64 << 10)], 2.0)
        for arr in ("b2b", "apart"):
            check(f"{dt} 4 ranks {arr} >= 4x gloo at every size (time <= 1/4)",
                  [(s, t(f"np4_{arr}", dt, s, "ringcomm"), t(f"np4_{arr}", dt, s, "gloo")) for s in sizes], 0.25)
            if dt == "float32":
                check(f"{dt} 4 ranks {arr} never > 2x MPICH",
                      [(s, t(f"np4_{arr}", dt, s, "ringcomm"), t(f"np4_{arr}", dt, s, "mpi")) for s in sizes], 2.0)


if __name__ == "__main__":
    main(sys.argv[1])
