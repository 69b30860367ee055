"""Every peer side by side, from bench JSON files (``python -m ringcomm.bench --json F``): one
markdown table per collective and dtype, a row per size, a column per library with its median
time in µs (ringcomm in the form the peers are measured in, ``spec.NATIVE_MODE``), the lowest of
the row in bold, then ringcomm's median / the best peer's. Cells that were not measured say
n/a; a cell whose check failed says FAIL. The settings each peer ran with (``meta.peer_settings``)
follow the tables.

    python benchmarks/report/peers_table.py results/2026-12-07/peers/2ranks_b2b_float32.json

With --runs, the files are runs of one command (their commands may differ only in --json; other
files are refused) and make one set of tables: per cell, each library's median over the runs
that measured it (``(k of n)`` when some did not, FAIL when a check failed in any), and
ringcomm / best peer as the median of the runs' ratios, each run's ratio taken against its own
best peer, counting only runs in which ringcomm and every peer measured in the cell ran; then in
how many of those runs ringcomm was slower than the best peer.

    python benchmarks/report/peers_table.py --runs run1.json run2.json run3.json

With --near NS, each library's figure of a cell is the median over only the rounds of a
``--rounds`` run whose launch of that library read the cross-CPU probe at most NS ns before and
after (``meta.launches``): on a VM that moves the vCPUs apart for spells, libraries are then
compared in the same placement. A library with no such round shows n/a; the rounds kept are
listed before the tables.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics

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


def row_cells(row: dict, libs: list, native: str) -> dict:
    """Each library's (text, median µs or None) in one row; ringcomm in the native mode."""
    got = {}
    for key, entry in row["libs"].items():
        lib, _, mode = key.partition("/")
        if lib != "ringcomm" or mode == native or "ringcomm" not in got:
            got[lib] = entry
    return {lib: cell(got.get(lib)) for lib in libs}


def table_libs(tabs: list) -> list:
    return [lib for lib in ORDER if any(k.split("/")[0] == lib for tab in tabs for r in tab["rows"]
                                        for k in r["libs"])]


def native_mode(tab: dict) -> str:
    return "in-place" if NATIVE_MODE[tab["op"]] == "ip" else "out-of-place"


def bold_lowest(texts: dict) -> list:
    times = [t for _, t in texts.values() if t is not None]
    best = min(times) if times else None
    return [f"**{s}**" if t is not None and t == best else s for s, t in texts.values()]


def table(tab: dict) -> str:
    libs = table_libs([tab])
    out = ["| size | " + " | ".join(LABEL[lib] for lib in libs) + " | ringcomm / best peer |",
           "|---" * (len(libs) + 2) + "|"]
    for row in tab["rows"]:
        texts = row_cells(row, libs, native_mode(tab))
        times = {lib: t for lib, (_, t) in texts.items() if t is not None}
        peers = [t for lib, t in times.items() if lib != "ringcomm"]
        ratio = f"{times['ringcomm'] / min(peers):.2f}" if "ringcomm" in times and peers else "-"
        out.append(f"| {format_size(row['size'])} | " + " | ".join(bold_lowest(texts)) + f" | {ratio} |")
    return "\n".join(out)


def runs_table(tabs: list) -> str:
    """One table from the same table of several runs (see the module's --runs)."""
    libs, n = table_libs(tabs), len(tabs)
    out = ["| size | " + " | ".join(LABEL[lib] for lib in libs)
           + " | ringcomm / best peer, median of the runs' | runs ringcomm lost |",
           "|---" * (len(libs) + 3) + "|"]
    for rows in zip(*(tab["rows"] for tab in tabs)):
        per_run = [row_cells(row, libs, native_mode(tabs[0])) for row in rows]
        texts = {}
        for lib in libs:
            runs = [r[lib] for r in per_run]
            times = [t for _, t in runs if t is not None]
            if any(s == "FAIL" for s, _ in runs):
                texts[lib] = ("FAIL", None)
            elif times:
                med = statistics.median(times)
                text = cell({"time_us": med})[0] + (f" ({len(times)} of {n})" if len(times) < n else "")
                texts[lib] = (text, med)
            else:
                texts[lib] = runs[0]
        measured = [lib for lib in libs if any(r[lib][1] is not None for r in per_run)]
        peers = [lib for lib in measured if lib != "ringcomm"]
        ratios = [r["ringcomm"][1] / min(r[p][1] for p in peers) for r in per_run
                  if "ringcomm" in measured and peers and all(r[lib][1] is not None for lib in measured)]
        if ratios:
            counted = f" ({len(ratios)} of {n})" if len(ratios) < n else ""
            ratio = f"{statistics.median(ratios):.2f}{counted}"
            lost = f"{sum(x > 1 for x in ratios)} of {len(ratios)}"
        else:
            ratio = lost = "-"
        out.append(f"| {format_size(rows[0]['size'])} | " + " | ".join(bold_lowest(texts))
                   + f" | {ratio} | {lost} |")
    return "\n".join(out)


def near_rounds(meta: dict, ns: float) -> dict:
    """{library: [round numbers]} of the launches whose probe read at most `ns` at both ends."""
    kept: dict = {}
    for launch in meta.get("launches") or []:
        probes = [launch.get("probe_before"), launch.get("probe_after")]
        near = launch.get("ran", True) and all(p is not None and p["round_trip_ns"] <= ns for p in probes)
        for lib in launch["libs"].split("+"):
            kept.setdefault(lib, [])
            if near:
                kept[lib].append(launch["round"])
    return kept


def keep_near(doc: dict, ns: float) -> str:
    """Rewrite every entry's time to the median of its near rounds (see --near); a summary line."""
    kept = near_rounds(doc["meta"], ns)
    for tab in doc["tables"]:
        for row in tab["rows"]:
            for key, entry in list(row["libs"].items()):
                per_round = entry.get("round_time_s")
                if per_round is None or entry.get("na"):
                    continue
                times = [per_round[r - 1] for r in kept.get(key.split("/")[0], []) if r - 1 < len(per_round)]
                if times:
                    entry["time_us"] = statistics.median(times) * 1e6
                else:
                    row["libs"][key] = {"na": True}
    rounds = len({launch["round"] for launch in doc["meta"].get("launches") or []})
    return ", ".join(f"{lib} {len(r)} of {rounds}" for lib, r in kept.items())


def command_key(command: str) -> list:
    """A run's command without its --json argument (where the run was written)."""
    words = shlex.split(command)
    cut = {i for i, w in enumerate(words) if w == "--json"}
    return [w for i, w in enumerate(words) if not ({i, i - 1} & cut or w.startswith("--json="))]


def settings_lines(metas: list) -> list:
    """The settings each peer ran with: one line per peer and distinct setting, with its runs."""
    lines = []
    peers = list(dict.fromkeys(p for m in metas for p in m.get("peer_settings", {})))
    for peer in peers:
        seen: dict[str, list[int]] = {}
        for k, m in enumerate(metas, 1):
            rec = m.get("peer_settings", {}).get(peer)
            if rec is None:
                continue
            used = " ".join(f"{key}={v}" for key, v in {**rec["fixed"], **rec["used"]}.items())
            tried = len(rec["tried"])
            text = f"{used or 'none set'} ({rec['chosen_by']}" + (f"; {tried} tried" if tried else "") + ")"
            seen.setdefault(text, []).append(k)
        for text, runs in seen.items():
            which = "" if len(metas) == 1 else f" [run{'s' if len(runs) > 1 else ''} {','.join(map(str, runs))}]"
            lines.append(f"- {LABEL.get(peer, peer)}: {text}{which}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="+")
    p.add_argument("--runs", action="store_true",
                   help="the files are runs of one command: medians over them, the median of the runs' ratios")
    p.add_argument("--near", type=float, default=None, metavar="NS",
                   help="each library's rounds whose launch read the cross-CPU probe at most NS ns at both ends only")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    docs = []
    for path in args.json:
        with open(path) as f:
            docs.append(json.load(f))
    if args.near is not None:
        for path, doc in zip(args.json, docs):
            if not doc["meta"].get("launches"):
                p.error(f"{path} records no launches (a run without --rounds): --near has nothing to keep")
            print(f"<!-- {path}: rounds whose launch read the probe at most {args.near:g} ns at both ends: "
                  f"{keep_near(doc, args.near)} -->")
    if not args.runs:
        for path, doc in zip(args.json, docs):
            print(f"<!-- {path}: {doc['meta']['command']} -->")
            for tab in doc["tables"]:
                print(f"\n**{tab['op']} {tab['dtype']}**, median µs per call\n")
                print(table(tab))
            print()
            print("\n".join(settings_lines([doc["meta"]])))
            print()
        return 0
    key = command_key(docs[0]["meta"]["command"])
    for path, doc in zip(args.json, docs):
        if command_key(doc["meta"]["command"]) != key:
            p.error(f"{path} is a run of another command: {doc['meta']['command']!r} "
                    f"(the first: {docs[0]['meta']['command']!r})")
    shape = lambda d: [(t["op"], t["dtype"], [r["size"] for r in t["rows"]]) for t in d["tables"]]  # noqa: E731
    for path, doc in zip(args.json, docs):
        if shape(doc) != shape(docs[0]):
            p.error(f"{path} has other tables or sizes than {args.json[0]}")
    print(f"<!-- {len(docs)} runs of: {' '.join(shlex.quote(w) for w in key)} -->")
    for k, path in enumerate(args.json, 1):
        print(f"<!-- run {k}: {path} -->")
    for tabs in zip(*(doc["tables"] for doc in docs)):
        print(f"\n**{tabs[0]['op']} {tabs[0]['dtype']}**, median over {len(docs)} runs of the median µs per call\n")
        print(runs_table(list(tabs)))
    print()
    print("\n".join(settings_lines([doc["meta"] for doc in docs])))
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
