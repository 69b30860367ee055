"""Our performance targets, checked on the JSON that ``python -m ringcomm.bench --json`` writes.

    python benchmarks/report/check_targets.py RUN.json [RUN.json ...]    # the targets of single runs
    python benchmarks/report/check_targets.py --runs DIR                 # bench_tables.sh's runs

The bench itself reports measurements only; the targets and their verdicts live here. Every
ratio compares cells of one run (one JSON file), medians over the timed calls of the max over
ranks, ringcomm taken in the peer's form of the collective (the JSON rows' ``speedup``).

Single runs (all_reduce float32 sum, by world size): 2 ranks, against gloo: >= 20x faster at
<= 64 KiB, busbw >= 4x at >= 1 MiB; against MPI: latency <= 1.5x MPI's at <= 4 KiB, busbw >= 1x at
>= 64 KiB and >= 1.5x at >= 16 MiB; 4 ranks, against gloo: busbw >= 4x at >= 1 MiB. Any world
size: reduce_scatter and all_gather busbw >= 0.8x all_reduce's (ringcomm out of place) at >= 1 MiB.

``--runs DIR`` reads np2_b2b.json, np2_apart.json, np4_b2b.json, np4_apart.json and, where
present, np2_b2b_load2.json and np2_apart_load2.json (all_reduce in place) and checks the
latency and bandwidth targets of ``check_runs`` on them (float32 and bfloat16): ringcomm against
MPICH, DeepSpeed and gloo, back to back, apart and beside busy processes.

Each target prints its worst size in its range and MET / NOT MET (or "not measured"). Exit
status: 0 if every measured target is met, 1 if one is not, 2 if none could be measured.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass

KiB, MiB = 1 << 10, 1 << 20


def size_name(b: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", KiB)):
        if b >= scale and b % scale == 0:
            return f"{b // scale} {unit}"
    return f"{b} B"


@dataclass(frozen=True)
class Target:
    kind: str            # "faster" | "busbw": speedup >= bound; "latency": 1 / speedup <= bound
    lo: int | None       # sizes >= lo
    hi: int | None       # sizes <= hi
    bound: float

    def range_text(self) -> str:
        return f"<= {size_name(self.hi)}" if self.hi is not None else f">= {size_name(self.lo)}"

    def holds(self, size: int) -> bool:
        return (self.lo is None or size >= self.lo) and (self.hi is None or size <= self.hi)


# world size -> peer -> targets on all_reduce float32 sum.
TARGETS = {
    2: {"gloo": [Target("faster", None, 64 * KiB, 20.0), Target("busbw", MiB, None, 4.0)],
        "mpi": [Target("latency", None, 4 * KiB, 1.5), Target("busbw", 64 * KiB, None, 1.0),
                Target("busbw", 16 * MiB, None, 1.5)]},
    4: {"gloo": [Target("busbw", MiB, None, 4.0)]},
}
RS_AG_BOUND = 0.8        # reduce_scatter / all_gather busbw >= 0.8 x all_reduce's at >= 1 MiB


def judge(speedups: list[tuple[int, float]], target: Target) -> dict:
    """The worst size of ``target``'s range among (size, speedup) pairs and whether it holds."""
    pairs = [(s, x) for s, x in speedups if x is not None and target.holds(s)]
    res = {"kind": target.kind, "range": target.range_text(), "bound": target.bound}
    if not pairs:
        return {**res, "value": None, "met": None}
    s, x = min(pairs, key=lambda p: p[1])            # the smallest speedup is the worst
    value = 1.0 / x if target.kind == "latency" else x
    met = value <= target.bound if target.kind == "latency" else value >= target.bound
    return {**res, "value": value, "worst_size": s, "met": met}


def verdict_text(j: dict, peer: str) -> str:
    if j["value"] is None:
        return f"not measured at {j['range']}"
    where = size_name(j["worst_size"])
    if j["kind"] == "latency":
        text = f"latency {j['value']:.2f}x {peer}'s at {j['range']} (worst at {where}; target <= {j['bound']:g}x)"
    else:
        what = "faster" if j["kind"] == "faster" else "busbw"
        text = f"{j['value']:.2f}x {what} at {j['range']} (worst at {where}; target >= {j['bound']:g}x)"
    return text + (": MET" if j["met"] else ": NOT MET")


def _table(doc: dict, op: str, dtype: str = "float32", redops=("sum",)):
    return next((t for t in doc["tables"] if t["op"] == op and t["dtype"] == dtype
                 and t["redop"] in redops), None)


def _cell(row: dict, name: str) -> dict | None:
    c = row["libs"].get(name)
    return c if c and "time_us" in c and not c.get("wrong") else None


def check_run(doc: dict) -> list[dict]:
    """The single-run targets of one bench JSON: [{"text", "met"}] (met None: not measured)."""
    world = doc["meta"]["world_size"]
    out = []
    ar = _table(doc, "all_reduce")
    if ar is not None:
        for peer, targets in TARGETS.get(world, {}).items():
            speedups = [(row["size"], row.get("speedup", {}).get(peer)) for row in ar["rows"]]
            for tg in targets:
                j = judge(speedups, tg)
                out.append({"text": f"all_reduce float32 sum vs {peer}: " + verdict_text(j, peer),
                            "met": j["met"]})
    for op in ("reduce_scatter", "all_gather"):
        other = _table(doc, op, redops=("sum", "-"))
        if ar is None or other is None:
            continue
        by_size = {row["size"]: row for row in ar["rows"]}
        ratios = []
        for row in other["rows"]:
            a = by_size.get(row["size"])
            ca = _cell(a, "ringcomm/out-of-place") if a else None
            cb = _cell(row, "ringcomm/out-of-place")
            if row["size"] >= MiB and ca and cb:
                ratios.append((row["size"], cb["busbw"] / ca["busbw"]))
        label = f"{op} busbw / all_reduce busbw (ringcomm out-of-place) at >= 1 MiB"
        if not ratios:
            out.append({"text": f"{label}: not measured", "met": None})
            continue
        s, v = min(ratios, key=lambda p: p[1])
        met = v >= RS_AG_BOUND
        out.append({"text": f"{label}: {v:.2f}x (worst at {size_name(s)}; target >= "
                            f"{RS_AG_BOUND:g}x): {'MET' if met else 'NOT MET'}", "met": met})
    return out


# ---------------------------------------------------------------------------------------------
# benchmarks/report/bench_tables.sh's runs.

RUNS = ["np2_b2b", "np2_apart", "np4_b2b", "np4_apart", "np2_b2b_load2", "np2_apart_load2"]


def load_runs(d: str, keep_wrong: bool = False) -> dict:
    """{(run, dtype, size, lib): cell} of all_reduce in place, for every run of RUNS whose JSON
    is in DIR; a cell is the bench JSON's (``time_us`` the median µs). Cells whose correctness
    check found wrong elements are left out unless ``keep_wrong``."""
    out = {}
    for run in RUNS:
        p = os.path.join(d, run + ".json")
        if not os.path.exists(p):
            continue
        with open(p) as f:
            doc = json.load(f)
        for t in doc["tables"]:
            if t["op"] != "all_reduce":
                continue
            for row in t["rows"]:
                for name, cell in row["libs"].items():
                    lib, _, mode = name.partition("/")
                    if mode != "in-place" or "time_us" not in cell:
                        continue
                    if keep_wrong or not cell.get("wrong"):
                        out[(run, t["dtype"], row["size"], lib)] = cell
    return out


def check_runs(d: str) -> list[dict]:
    cells = {k: cell["time_us"] for k, cell in load_runs(d).items()}
    t = lambda run, dt, size, lib: cells.get((run, dt, size, lib))  # noqa: E731
    dtypes = sorted({k[1] for k in cells}, key=lambda x: x != "float32")
    sizes = sorted({k[2] for k in cells})
    out = []

    def check(label, pairs, bound):
        """pairs: [(size, ringcomm µs, reference µs)]; ratio = ringcomm / reference <= bound."""
        pairs = [(s, a, b) for s, a, b in pairs if a is not None and b is not None]
        if not pairs:
            out.append({"text": f"{label}: not measured", "met": None})
            return
        ratio, s, a, b = max((a / b, s, a, b) for s, a, b in pairs)
        met = ratio <= bound
        out.append({"text": f"{label}: worst {size_name(s)}: {a:.1f} vs {b:.1f} us, {ratio:.2f}x "
                            f"(bound {bound:g}x): {'MET' if met else 'NOT MET'}", "met": met})

    for dt in dtypes:
        small = [s for s in sizes if s <= 64 * KiB]
        if dt == "float32":
            check(f"{dt} 2 ranks b2b <= 1.0x MPICH at <= 64 KiB",
                  [(s, t("np2_b2b", dt, s, "ringcomm"), t("np2_b2b", dt, s, "mpi")) for s in small], 1.0)
        check(f"{dt} 2 ranks b2b <= 1.0x DeepSpeed at every size",
              [(s, t("np2_b2b", dt, s, "ringcomm"), t("np2_b2b", dt, s, "deepspeed")) for s in sizes], 1.0)
        for peer in ("mpi", "deepspeed"):
            if dt != "float32" and peer == "mpi":
                continue
            check(f"{dt} 2 ranks b2b busbw >= 1.5x {peer} at >= 16 MiB (time <= 1/1.5)",
                  [(s, t("np2_b2b", dt, s, "ringcomm"), t("np2_b2b", dt, s, peer))
                   for s in sizes if s >= 16 * MiB], 1 / 1.5)
        check(f"{dt} 2 ranks apart <= 1.0x DeepSpeed from 1 KiB to 1 MiB",
              [(s, t("np2_apart", dt, s, "ringcomm"), t("np2_apart", dt, s, "deepspeed"))
               for s in sizes if KiB <= s <= MiB], 1.0)
        for arr in ("b2b", "apart"):
            check(f"{dt} 2 ranks {arr} --load 2 median <= 2x the quiet one at 1 KiB and 64 KiB",
                  [(s, t(f"np2_{arr}_load2", dt, s, "ringcomm"), t(f"np2_{arr}", dt, s, "ringcomm"))
                   for s in (KiB, 64 * KiB)], 2.0)
        for arr in ("b2b", "apart"):
            check(f"{dt} 4 ranks {arr} >= 4x gloo at every size (time <= 1/4)",
                  [(s, t(f"np4_{arr}", dt, s, "ringcomm"), t(f"np4_{arr}", dt, s, "gloo"))
                   for s in sizes], 0.25)
            if dt == "float32":
                check(f"{dt} 4 ranks {arr} never > 2x MPICH",
                      [(s, t(f"np4_{arr}", dt, s, "ringcomm"), t(f"np4_{arr}", dt, s, "mpi"))
                       for s in sizes], 2.0)
    return out


def status(results: list[dict]) -> int:
    measured = [r for r in results if r["met"] is not None]
    if not measured:
        return 2
    return 0 if all(r["met"] for r in measured) else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/report/check_targets.py",
                                description="ringcomm's performance targets on bench JSON files")
    p.add_argument("files", nargs="*", metavar="RUN.json", help="python -m ringcomm.bench --json output")
    p.add_argument("--runs", metavar="DIR", help="a benchmarks/report/bench_tables.sh output directory")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if not args.files and not args.runs:
        p.error("give RUN.json files or --runs DIR")
    results = []
    for path in args.files:
        with open(path) as f:
            doc = json.load(f)
        res = check_run(doc)
        print(f"{path} ({doc['meta']['world_size']} ranks):")
        for r in res or [{"text": "no target applies to this run", "met": None}]:
            print(f"  {r['text']}")
        results += res
    if args.runs:
        res = check_runs(args.runs)
        print(f"{args.runs} (benchmarks/report/bench_tables.sh runs; ratio = ringcomm time / the other's):")
        for r in res:
            print(f"  {r['text']}")
        results += res
    return status(results)


if __name__ == "__main__":
    sys.exit(main())
