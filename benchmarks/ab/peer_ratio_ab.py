"""Same-run ratios for an A/B of two builds, each run beside a peer: per (collective, size),
ringcomm's median (in the form the peer runs in, as benchmarks/report/peers_table.py takes it) /
the peer's median in the same run, per run, then the median over the runs of each side.

    python benchmarks/ab/peer_ratio_ab.py --peer impi --old old_r*.json --new new_r*.json
"""
from __future__ import annotations

import argparse
import json
import statistics

from ringcomm.bench.spec import NATIVE_MODE, format_size


def ratios(path: str, peer: str) -> dict[tuple[str, int], float]:
    doc = json.load(open(path))
    out = {}
    for tab in doc["tables"]:
        native = "in-place" if NATIVE_MODE[tab["op"]] == "ip" else "out-of-place"
        for row in tab["rows"]:
            libs = row["libs"]
            ours = libs.get(f"ringcomm/{native}") or next((e for k, e in libs.items() if k.startswith("ringcomm/")), None)
            theirs = next((e for k, e in libs.items() if k.split("/")[0] == peer), None)
            if ours and theirs and not ours.get("wrong") and not theirs.get("wrong") and "time_us" in ours \
                    and "time_us" in theirs:
                out[(tab["op"], row["size"])] = ours["time_us"] / theirs["time_us"]
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peer", default="impi", help="the peer library's name in the bench JSON (default impi)")
    p.add_argument("--old", nargs="+", required=True, help="the old build's runs (bench --json files)")
    p.add_argument("--new", nargs="+", required=True, help="the new build's runs (bench --json files)")
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    sides = {"old": [ratios(f, a.peer) for f in a.old], "new": [ratios(f, a.peer) for f in a.new]}
    keys = sorted(set.intersection(*(set(r) for runs in sides.values() for r in runs)),
                  key=lambda k: (k[0], k[1]))
    print(f"| collective | size | old: ringcomm / {a.peer} (runs) | median | new: ringcomm / {a.peer} (runs) | median |")
    print("|---|---|---|---|---|---|")
    for op, size in keys:
        cols = []
        for side in ("old", "new"):
            rs = [r[(op, size)] for r in sides[side]]
            cols += [", ".join(f"{x:.2f}" for x in rs), f"{statistics.median(rs):.2f}"]
        print(f"| {op} | {format_size(size)} | " + " | ".join(cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
