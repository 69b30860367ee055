"""Every peer side by side, from bench JSON files (``python -m ringcomm.bench --json F``): one
markdown table per collective and dtype, a row per size, a column per library with its median
time in µs (ringcomm in the form the peers are measured in, ``spec.NATIVE_MODE``), the lowest of
the row in bold, then ringcomm's median / the best peer's. Cells that were not measured say
n/a; a cell whose check failed says FAIL. The settings each peer ran with (``meta.peer_settings``)
follow the tables.

    python benchmarks/report/peers_table.py results/2026-12-07/peers/2ranks_b2b_float32.json
"""
from __future__ import annotations

import argparse
import json

from ringcomm.bench.spec import NATIVE_MODE, format_size

ORDER = ("ringcomm", "mpi", "impi", "oneccl", "deepspeed", "gloo", "nccl")
LABEL = {"ringcomm": "ringcomm", "mpi": "MPICH", "impi": "Intel MPI", "oneccl": "oneCCL",
         "deepspeed": "DeepSpeed", "gloo": "gloo", "nccl": "NCCL"}


def cell(entry: dict | None) -> tuple[str, float | None]:
    if entry is None or entry.get("na"):
        return "n/a", None
    if entry.get("error"):
        return "error", None
    if entry.get("wrong"):
        return "FAIL", None
    t = entry["time_us"]
    return (f"{t:.1f}" if t < 1000 else f"{t:,.0f}"), t


def table(tab: dict) -> str:
    libs = [lib for lib in ORDER if any(k.split("/")[0] == lib for r in tab["rows"]
                                        for k in r["libs"])]
    native = "in-place" if NATIVE_MODE[tab["op"]] == "ip" else "out-of-place"
    out = ["| size | " + " | ".join(LABEL[lib] for lib in libs) + " | ringcomm / best peer |",
           "|---" * (len(libs) + 2) + "|"]
    for row in tab["rows"]:
        got = {}
        for key, entry in row["libs"].items():
            lib, _, mode = key.partition("/")
            if lib != "ringcomm" or mode == native or "ringcomm" not in got:
                got[lib] = entry
        texts = {lib: cell(got.get(lib)) for lib in libs}
        times = {lib: t for lib, (_, t) in texts.items() if t is not None}
        best = min(times.values()) if times else None
        cols = [f"**{s}**" if t is not None and t == best else s for s, t in texts.values()]
        peers = [t for lib, t in times.items() if lib != "ringcomm"]
        ratio = f"{times['ringcomm'] / min(peers):.2f}" if "ringcomm" in times and peers else "-"
        out.append(f"| {format_size(row['size'])} | " + " | ".join(cols) + f" | {ratio} |")
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="+")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    for path in args.json:
        doc = json.load(open(path))
        print(f"<!-- {path}: {doc['meta']['command']} -->")
        for tab in doc["tables"]:
            print(f"\n**{tab['op']} {tab['dtype']}**, median µs per call\n")
            print(table(tab))
        print()
        for peer, rec in doc["meta"].get("peer_settings", {}).items():
            used = " ".join(f"{k}={v}" for k, v in {**rec["fixed"], **rec["used"]}.items())
            tried = len(rec["tried"])
            print(f"- {LABEL.get(peer, peer)}: {used or 'none set'} ({rec['chosen_by']}"
                  + (f"; {tried} tried" if tried else "") + ")")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
