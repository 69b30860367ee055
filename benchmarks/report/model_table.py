"""The cost model's all_reduce choice per (size, world), at the compiled-in default profile and at
a tuned one, as markdown; with --write, replaces the table between the markers in
docs/algorithms.md.

    python benchmarks/report/model_table.py --profile results/2026-12-02/model_check/profile_vm.json --write docs/algorithms.md

The choice is ringcomm._C._model_choose (csrc/comm/cost_model.cpp) at the host communicator's
default geometry (LL up to 4 KiB, 256 KiB ring slots, 32 KiB far slots, header in slot): what
RINGCOMM_ALGO=auto picks from RINGCOMM_MODEL_MIN_WORLD ranks up (5 by default; below it, the
measured size thresholds)."""
from __future__ import annotations

import argparse
import json
import sys

from ringcomm import _C

# The begin marker is found by its first words (MARKER), so a marker naming another command is
# replaced by BEGIN.
MARKER = "<!-- model-table:begin"
BEGIN = MARKER + " (python benchmarks/report/model_table.py --write docs/algorithms.md) -->"
END = "<!-- model-table:end -->"
SIZES = [1 << k for k in range(10, 25, 2)] + [64 << 20]
WORLDS = [2, 3, 4, 5, 8, 16, 32, 64, 128]
SHORT = {("direct", "ll"): "LL", ("direct", "header_in_slot"): "1shot", ("direct", "simple"): "1shot",
         ("two_shot", "simple"): "2shot", ("ring", "header_in_slot"): "ring", ("ring", "simple"): "ring",
         ("halving_doubling", "simple"): "HD"}


def size_name(b: int) -> str:
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def table(params: dict | None, ll_bytes: int = 4096) -> str:
    head = "| ranks | " + " | ".join(size_name(s) for s in SIZES) + " |"
    rows = [head, "|" + "---|" * (len(SIZES) + 1)]
    for n in WORLDS:
        cells = [SHORT[_C._model_choose(s, n, ll_bytes, True, params=params)] for s in SIZES]
        rows.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def render(profile_path: str | None) -> str:
    dflt = _C._default_profile()
    out = [BEGIN, "",
           f"Default profile (hash `{dflt['hash']}`: {fmt(dflt['params'])}):", "", table(dflt["params"]), ""]
    if profile_path:
        tuned = _C._load_profile(profile_path)
        with open(profile_path) as f:
            doc = json.load(f)
        where = doc.get("machine", {})
        out += [f"The tuned profile (`{profile_path}`, hash `{tuned['hash']}`, "
                f"{where.get('processor', '?')}: {fmt(tuned['params'])}):",
                "", table(tuned["params"]), ""]
    out += ["LL = direct/ll, 1shot = direct (header in slot), 2shot = two_shot, HD = halving_doubling.", "", END]
    return "\n".join(out)


def fmt(p: dict) -> str:
    return (f"alpha {p['alpha_s'] * 1e6:.2f} us, alpha on a shared CPU {p['alpha_shared_s'] * 1e6:.2f} us, "
            f"slot {p['slot_s'] * 1e6:.2f} us, copy {p['copy_Bps'] / 1e9:.1f} GB/s, reduce {p['reduce_Bps'] / 1e9:.1f} GB/s, "
            f"LL {p['ll_Bps'] / 1e9:.1f} GB/s, cpus {p['cpus']:g}")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", help="a profile written by python -m ringcomm.apps.tune")
    ap.add_argument("--write", metavar="MD", help="replace the table between the markers in this file")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    text = render(a.profile)
    if not a.write:
        print(text)
        return 0
    with open(a.write) as f:
        doc = f.read()
    i = doc.find(MARKER)
    j = doc.find(END, i)
    if i < 0 or j < 0:
        print(f"{a.write}: no model-table markers", file=sys.stderr)
        return 1
    with open(a.write, "w") as f:
        f.write(doc[:i] + text + doc[j + len(END):])
    return 0


if __name__ == "__main__":
    sys.exit(main())
