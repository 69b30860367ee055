"""Judge the all_reduce cost model by measurement: for each world size and message size, time every
forced algorithm (RINGCOMM_ALGO=ring|direct|two_shot|halving_doubling) and the model's own choice
(RINGCOMM_ALGO=auto with RINGCOMM_MODEL_MIN_WORLD=2, so the model decides at every world, and
RINGCOMM_PROFILE set) with ``python -m ringcomm.bench`` (short runs, float32 SUM, out of place),
and report the fraction of (size, world) cells where the model's choice is within 15% of the
best measured algorithm (the target: at least 90%).

    python scripts/check_model.py [--profile FILE] [-np 2,4,8] [-b 1K] [-e 16M] [-f 4] \
        [--out docs/model_check.md] [--json docs/bench/model_check.json]

Without --profile the script runs ``python -m ringcomm.tune`` first and judges that profile. A
cell's "model" time is the auto run's median; "best" is the least median among the forced runs
and the auto run (the LL protocol, which only auto runs, competes through it). Each bench run is
one process group per (world, algorithm); sizes within a run share it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

FORCED = ["ring", "direct", "two_shot", "halving_doubling"]
TOLERANCE = 1.15


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KMG" else s) * mult


def size_name(b: int) -> str:
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1 << 10 else f"{b} B"


def bench(world: int, env_extra: dict, a, tmp: str, tag: str) -> dict:
    """{size: (median_s, min_s)} of one bench run under env_extra."""
    path = os.path.join(tmp, f"{tag}_{world}.json")
    cmd = [sys.executable, "-m", "ringcomm.bench", "-np", str(world), "--ops", "all_reduce", "-b", a.minbytes,
           "-e", a.maxbytes, "-f", str(a.stepfactor), "--peers", "none", "--no-inplace",
           "--time-budget", str(a.time_budget), "--min-iters", "5", "--json", path]
    env = dict(os.environ, **env_extra)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.run_timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} ({env_extra}) failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    with open(path) as f:
        doc = json.load(f)
    out = {}
    for row in doc["tables"][0]["rows"]:
        res = row["libs"]["ringcomm/out-of-place"]
        out[row["size"]] = (res["time_s"], res["min_s"])
    return out


def choice(world: int, size: int, env_extra: dict) -> str:
    """The selection auto makes under env_extra (the one selection, ringcomm._C._select)."""
    code = ("import sys; from ringcomm import _C; a, p, _ = _C._select('all_reduce', int(sys.argv[1]), "
            "int(sys.argv[2])); print(a + '/' + p)")
    r = subprocess.run([sys.executable, "-c", code, str(size), str(world)], env=dict(os.environ, **env_extra),
                       capture_output=True, text=True, check=True)
    return r.stdout.strip()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", help="judge this profile (default: run python -m ringcomm.tune first)")
    ap.add_argument("-np", "--worlds", default="2,4,8")
    ap.add_argument("-b", "--minbytes", default="1K")
    ap.add_argument("-e", "--maxbytes", default="16M")
    ap.add_argument("-f", "--stepfactor", type=int, default=4)
    ap.add_argument("--time-budget", type=float, default=0.1, help="bench seconds of timed calls per size")
    ap.add_argument("--run-timeout", type=float, default=600)
    ap.add_argument("--out", default="docs/model_check.md")
    ap.add_argument("--json", default="docs/bench/model_check.json")
    a = ap.parse_args(argv)
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="ringcomm-check-model-")
    profile = a.profile
    if profile is None:
        profile = os.path.join(tmp, "profile.json")
        subprocess.run([sys.executable, "-m", "ringcomm.tune", "-o", profile], check=True)
    with open(profile) as f:
        prof = json.load(f)
    auto_env = {"RINGCOMM_ALGO": "auto", "RINGCOMM_PROFILE": os.path.abspath(profile), "RINGCOMM_MODEL_MIN_WORLD": "2"}
    worlds = [int(w) for w in a.worlds.split(",")]
    cells, raw = [], {}
    for n in worlds:
        runs = {algo: bench(n, {"RINGCOMM_ALGO": algo}, a, tmp, algo) for algo in FORCED}
        runs["model"] = bench(n, auto_env, a, tmp, "auto")
        raw[str(n)] = {k: {str(s): v for s, v in r.items()} for k, r in runs.items()}
        for size in sorted(runs["model"]):
            med = {k: runs[k][size][0] for k in runs}
            best_name = min(med, key=med.get)
            picked = choice(n, size, auto_env)
            cells.append({"world": n, "size": size, "model": picked, "median_s": med, "best": best_name,
                          "ratio": med["model"] / med[best_name], "ok": med["model"] <= TOLERANCE * med[best_name]})
        print(f"world {n} done ({time.time() - t0:.0f} s)", file=sys.stderr)
    ok = sum(c["ok"] for c in cells)
    frac = ok / len(cells)
    cmd = "python scripts/check_model.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = ["# The cost model judged by measurement", "",
             f"Command: `{cmd.strip()}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{time.time() - t0:.0f} s). Generated by scripts/check_model.py; do not edit by hand.", "",
             f"Profile: hash `{prof['hash']}`, {prof.get('machine', {}).get('processor', '?')}, cpus "
             f"{prof['params']['cpus']:g}. Float32 SUM all_reduce, out of place, median of each bench cell "
             f"(`python -m ringcomm.bench --time-budget {a.time_budget}`). \"model\" = RINGCOMM_ALGO=auto with "
             "RINGCOMM_MODEL_MIN_WORLD=2 (the model decides at every world; its choice in the column); the other "
             "columns force one algorithm each. Times in microseconds; the least per row in bold.", "",
             f"**Model within 15% of the best: {ok}/{len(cells)} cells = {100 * frac:.0f}%** (target >= 90%).", ""]
    names = FORCED + ["model"]
    lines.append("| ranks | size | model's choice | " + " | ".join(names) + " | model / best |")
    lines.append("|---|---|---|" + "---|" * len(names) + "---|")
    for c in cells:
        best = c["median_s"][c["best"]]
        row = [f"**{c['median_s'][k] * 1e6:.0f}**" if c["median_s"][k] == best else f"{c['median_s'][k] * 1e6:.0f}"
               for k in names]
        lines.append(f"| {c['world']} | {size_name(c['size'])} | {c['model']} | " + " | ".join(row)
                     + f" | {c['ratio']:.2f}{'' if c['ok'] else ' (miss)'} |")
    text = "\n".join(lines) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    if a.json:
        os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"profile": prof, "cells": cells, "raw": raw, "fraction_within_15pct": frac}, f, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
