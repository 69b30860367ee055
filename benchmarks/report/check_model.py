"""Judge the all_reduce cost model by measurement: for each world size and message size, time every
forced algorithm (RINGCOMM_ALGO=ring|direct|two_shot|halving_doubling, and LL) and the model's own
choice (RINGCOMM_ALGO=auto with RINGCOMM_MODEL_MIN_WORLD=2, so the model decides at every world,
and RINGCOMM_PROFILE set), float32 SUM, out of place, and report the fraction of (size, world)
cells where the model's choice is within 15% of the best measured algorithm (the target: at least
90%).

    python benchmarks/report/check_model.py [--profile FILE] [-np 2,4,8] [-b 1K] [-e 16M] [-f 4] [--rounds 10] \
        [--out model_check.md] [--json model_check.json]
    python benchmarks/report/check_model.py --from RUN.json [RUN.json ...] [--rechoose] [--out model_check.md]

Without --profile the script runs ``python -m ringcomm.apps.tune`` first and judges that profile.
With --from it measures nothing and judges saved runs: by the choices saved with them (the model
of the ringcomm that measured them), or with --rechoose by the choices this ringcomm's model makes
from each run's saved profile (the same forced timings, judged for the current model).

The algorithms are compared side by side, in the same run: per world one group of spawned ranks
holds one communicator per configuration (each created under its own knobs), and for each size
the configurations take turns, --rounds rounds of a few calls each, in a rotated order. Every
configuration thus meets the same scheduling states (on ranks that outnumber the CPUs, a whole
run can land in a slow one). A configuration's time is the median of its calls (each rank's
median, the largest over the ranks). LL is forced through the size rule (RINGCOMM_MODEL_MIN_WORLD
above the world, sizes up to --ll-max). The model's choice is timed by its forced
configuration; "model" (the auto communicator) is shown beside them as a check.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from ringcomm.bench.spec import parse_size

FORCED = ["ring", "direct", "two_shot", "halving_doubling"]
TOLERANCE = 1.15


def size_name(b: int) -> str:
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1 << 10 else f"{b} B"


def calls_per_turn(nbytes: int) -> int:
    """Calls a configuration makes per turn: a few milliseconds of work at any size."""
    return max(3, min(50, (1 << 20) // max(nbytes, 1)))


def _paired_rank(rank: int, world: int, store: str, configs: list, sizes: list, rounds: int) -> dict:
    """This rank's median seconds per call {config: {size: median}}: every configuration's
    communicator on these ranks, taking turns per size (configs: (name, env, max_bytes))."""
    from ringcomm.apps.tune import _comm_under
    comms = {name: _comm_under(env, rank, world, f"{store}-{name}") for name, env, _ in configs}
    limit = {name: mx for name, _, mx in configs}
    out = {name: {} for name in comms}
    try:
        for size in sizes:
            x = np.zeros(size // 4, np.float32)
            y = np.empty_like(x)
            names = [n for n in comms if size <= limit[n]]
            k = calls_per_turn(size)
            per_call = {n: [] for n in names}
            for n in names:                       # warm-up: first-use channels, caches
                for _ in range(2):
                    comms[n].all_reduce(x, output=y)
            for r in range(rounds):
                for n in names[r % len(names):] + names[:r % len(names)]:
                    c = comms[n]
                    c.barrier()
                    for _ in range(k):
                        t0 = time.perf_counter()
                        c.all_reduce(x, output=y)
                        per_call[n].append(time.perf_counter() - t0)
            for n in names:
                out[n][size] = statistics.median(per_call[n])
    finally:
        for c in comms.values():
            c.close()
    return out


def paired(world: int, configs: list, sizes: list, rounds: int, timeout: float) -> dict:
    """{config: {size: (median_s, median_s)}}: the largest of the ranks' medians (the pair keeps the
    shape of runs saved by earlier versions, (median, min))."""
    from ringcomm.core.launch import spawn
    d = tempfile.mkdtemp(prefix="ringcomm-check-model-")
    res = spawn(_paired_rank, world, (os.path.join(d, "store"), configs, sizes, rounds), timeout=timeout)
    out = {}
    for name, _, _ in configs:
        for size in res[0][name]:
            med = max(r[name][size] for r in res)
            out.setdefault(name, {})[size] = (med, med)
    return out


def choice(world: int, size: int, env_extra: dict) -> str:
    """The selection auto makes under env_extra (the one selection, ringcomm._C._select)."""
    code = ("import sys; from ringcomm import _C; a, p, _ = _C._select('all_reduce', int(sys.argv[1]), "
            "int(sys.argv[2])); print(a + '/' + p)")
    r = subprocess.run([sys.executable, "-c", code, str(size), str(world)], env=dict(os.environ, **env_extra),
                       capture_output=True, text=True, check=True)
    return r.stdout.strip()


def current_choice(prof: dict, size: int, world: int, ll_bytes: int) -> str:
    """'algo/proto' this ringcomm's model picks for `prof` (a saved profile document) with the
    default piece sizes and outbox depth, the header in the first slot and LL up to `ll_bytes`."""
    from ringcomm import _C
    algo, proto = _C._model_choose(size, world, ll_bytes, True, params=prof["params"])
    return f"{algo}/{proto}"


def rechoose_ll_bytes(runs: dict) -> int:
    """The LL limit a saved world's choices are remade with: RINGCOMM_LL_MAX_BYTES as set here,
    but no more than the largest size the run timed LL at (a choice of LL must have LL's time)."""
    from ringcomm import _C
    limit = int(_C.knob("RINGCOMM_LL_MAX_BYTES"))
    return min(limit, max(map(int, runs["ll"]))) if runs.get("ll") else limit


def judge(raw: dict) -> list:
    """Cells of {world: {config: {size: (median_s, min_s)}}}. The model's choice is timed by its
    own forced runs (LL's by the "ll" runs; in runs saved without them, by the auto runs) and
    "best" is the least forced time: the same number of runs on both sides of the comparison."""
    cells = []
    for w in sorted(raw, key=int):
        runs = raw[w]
        for size in sorted(runs["model"], key=int):
            med = {k: runs[k][size][0] for k in runs if k != "choice" and size in runs[k]}
            picked = runs["choice"][size]
            algo, _, proto = picked.partition("/")
            # LL: its own forced runs where the run has them ("ll", sizes up to the LL limit),
            # else the auto runs' (older runs measured LL only through auto).
            ll_name = "ll" if "ll" in med else "model"
            model_s = med[ll_name] if proto == "ll" else med[algo]
            pool = {k: v for k, v in med.items() if k != "model"}
            if proto == "ll":
                pool[ll_name] = med[ll_name]
            best_name = min(pool, key=pool.get)
            cells.append({"world": int(w), "size": int(size), "model": picked, "median_s": med, "best": best_name,
                          "ratio": model_s / pool[best_name], "ok": model_s <= TOLERANCE * pool[best_name]})
    return cells


def render(cells: list, prof: dict, cmd: str, note: str) -> str:
    ok = sum(c["ok"] for c in cells)
    lines = ["# The cost model judged by measurement", "",
             f"Command: `{cmd}`. Generated by benchmarks/report/check_model.py; do not edit by hand.", "", note, "",
             f"Profile: hash `{prof['hash']}`, {prof.get('machine', {}).get('processor', '?')}, cpus "
             f"{prof['params']['cpus']:g}. Float32 SUM all_reduce, out of place; per world one group of ranks holds a "
             "communicator per column and they take turns per size (benchmarks/report/check_model.py); a cell is "
             "the median per call (the largest of the ranks' medians). The forced columns run one algorithm each, \"ll\" forces LL "
             "through the size rule; \"model\" is RINGCOMM_ALGO=auto with RINGCOMM_MODEL_MIN_WORLD=2 (the model "
             "decides at every world) and its choice is named. A cell counts when the chosen algorithm's forced time "
             "is within 15% of the least forced one. Times in microseconds; the least per row "
             "in bold.", "",
             f"**Model within 15% of the best: {ok}/{len(cells)} cells = {100 * ok / max(1, len(cells)):.0f}%**", ""]
    for n in sorted({c["world"] for c in cells}):
        mine = [c for c in cells if c["world"] == n]
        lines.append(f"- {n} ranks: {sum(c['ok'] for c in mine)}/{len(mine)}")
    lines.append("")
    names = FORCED + (["ll"] if any("ll" in c["median_s"] for c in cells) else []) + ["model"]
    lines.append("| ranks | size | model's choice | " + " | ".join(names) + " | choice / best |")
    lines.append("|---|---|---|" + "---|" * len(names) + "---|")
    for c in cells:
        best = min(c["median_s"].values())
        row = ["" if k not in c["median_s"] else f"**{c['median_s'][k] * 1e6:.0f}**"
               if c["median_s"][k] == best else f"{c['median_s'][k] * 1e6:.0f}" for k in names]
        lines.append(f"| {c['world']} | {size_name(c['size'])} | {c['model']} | " + " | ".join(row)
                     + f" | {c['ratio']:.2f}{'' if c['ok'] else ' (miss)'} |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", help="judge this profile (default: run python -m ringcomm.apps.tune first)")
    ap.add_argument("-np", "--worlds", default="2,4,8")
    ap.add_argument("-b", "--minbytes", default="1K")
    ap.add_argument("-e", "--maxbytes", default="16M")
    ap.add_argument("-f", "--stepfactor", type=int, default=4)
    ap.add_argument("--ll-max", default="4K", help="LL's limit (RINGCOMM_LL_MAX_BYTES): sizes up to it are "
                    "also timed with LL forced")
    ap.add_argument("--rounds", type=int, default=10, help="turns each configuration takes per size")
    ap.add_argument("--run-timeout", type=float, default=600)
    ap.add_argument("--out", default="model_check.md")
    ap.add_argument("--json", default="model_check.json")
    ap.add_argument("--from", dest="sources", nargs="+", metavar="JSON",
                    help="measure nothing: judge the runs saved in these JSON files (a later file's worlds "
                         "replace an earlier one's) and write --out")
    ap.add_argument("--rechoose", action="store_true",
                    help="with --from: the choices of this ringcomm's model from each run's saved profile "
                         "(default piece sizes; LL up to RINGCOMM_LL_MAX_BYTES as set here, at most the "
                         "largest size the run timed LL at), not the choices saved with the runs")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.sources:
        raw, notes = {}, []
        for path in a.sources:
            with open(path) as f:
                doc = json.load(f)
            for w, runs in doc["raw"].items():
                if a.rechoose:
                    ll_bytes = rechoose_ll_bytes(runs)
                    runs = dict(runs, choice={size: current_choice(doc["profile"], int(size), int(w), ll_bytes)
                                              for size in runs["choice"]})
                raw[w] = runs
            notes.append(f"`{path}` ({', '.join(sorted(doc['raw'], key=int))} ranks): `{doc['command']}`; {doc['note']}")
        if a.rechoose:
            notes.append("Choices: this ringcomm's model from each run's profile (--rechoose), not the runs' own.")
        cmd = "python benchmarks/report/check_model.py " + " ".join(argv if argv is not None else sys.argv[1:])
        text = render(judge(raw), doc["profile"], cmd.strip(), "Judged from saved runs: " + " ".join(notes))
        with open(a.out, "w") as f:
            f.write(text)
        print(text)
        return 0
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="ringcomm-check-model-")
    profile = a.profile
    if profile is None:
        profile = os.path.join(tmp, "profile.json")
        subprocess.run([sys.executable, "-m", "ringcomm.apps.tune", "-o", profile], check=True)
    with open(profile) as f:
        prof = json.load(f)
    auto_env = {"RINGCOMM_ALGO": "auto", "RINGCOMM_PROFILE": os.path.abspath(profile), "RINGCOMM_MODEL_MIN_WORLD": "2"}
    worlds = [int(w) for w in a.worlds.split(",")]
    sizes, size = [], parse_size(a.minbytes)
    while size <= parse_size(a.maxbytes):
        sizes.append(size)
        size *= a.stepfactor
    big = 1 << 62
    configs = [(algo, {"RINGCOMM_ALGO": algo}, big) for algo in FORCED] + [("model", auto_env, big)]
    ll_max = parse_size(a.ll_max)
    if ll_max >= sizes[0]:
        # LL, forced the only way it can be: the size rule (the model never decides below this
        # world) with LL up to ll_max, on the sizes LL takes.
        configs.append(("ll", {"RINGCOMM_ALGO": "auto", "RINGCOMM_MODEL_MIN_WORLD": str(1 << 30),
                               "RINGCOMM_LL_MAX_BYTES": str(ll_max)}, ll_max))
    raw = {}
    for n in worlds:
        runs = paired(n, configs, sizes, a.rounds, a.run_timeout)
        raw[str(n)] = {k: {str(s): v for s, v in r.items()} for k, r in runs.items()}
        raw[str(n)]["choice"] = {str(size): choice(n, size, auto_env) for size in sizes}
        print(f"world {n} done ({time.time() - t0:.0f} s)", file=sys.stderr)
    cmd = "python benchmarks/report/check_model.py " + " ".join(argv if argv is not None else sys.argv[1:])
    note = (f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in {time.time() - t0:.0f} s, "
            f"{a.rounds} rounds side by side.")
    cells = judge(raw)
    text = render(cells, prof, cmd.strip(), note)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    if a.json:
        os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"profile": prof, "cells": cells, "raw": raw, "note": note, "command": cmd.strip(),
                       "fraction_within_15pct": sum(c["ok"] for c in cells) / len(cells)}, f, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
