"""Two settings of ringcomm's knobs compared in the same processes, call round by call round, so
that both meet the same machine state (a 2-vCPU machine shared with other jobs moves between
states that last whole runs, which separate A/B runs then mistake for a difference).

Each rank holds two communicators, A created under --env-a and B under --env-b (knobs are read
at creation). Per size and round, A and B each run --calls timed calls back to back (B first in
odd rounds); a call's time is the max over ranks. Per size the report gives both medians over
all calls and the median over rounds of B's round median / A's (the paired figure). Every result
is checked against numpy.

    python benchmarks/probes/knob_ab.py --coll all_to_all --sizes 4M,64M \
        --env-a RINGCOMM_SLOT_BYTES=32K --env-b "" --rounds 8 --calls 10 [--pin] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

COLLS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all")


def _size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s.rstrip("KMG")) * mult


def _env(s: str) -> dict:
    return dict(kv.split("=", 1) for kv in s.split(",") if kv.strip())


def _rank(rank, world, store, coll, sizes, env_a, env_b, rounds, calls, pin):
    import ringcomm
    from ringcomm.bench.checked import CheckedCall
    from ringcomm.core.config import environment
    if pin:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    comms = {}
    for side, env in (("A", env_a), ("B", env_b)):
        with environment(env):
            comms[side] = ringcomm.init(rank=rank, world_size=world, init_method=f"file://{store}/{side}",
                                        prefix=f"knob-ab-{side}", timeout=120)
    out, wrong = {}, 0
    try:
        for nbytes in sizes:
            count = max(world, nbytes // 4 - (nbytes // 4) % world)
            case = CheckedCall(coll, count, rank, world)
            bound = {side: case.bound(c) for side, c in comms.items()}

            def call(side):
                case.fill()
                t0 = time.perf_counter()
                bound[side]()
                t = time.perf_counter() - t0
                return t, case.wrong()

            times = {"A": [], "B": []}
            for side in ("A", "B"):   # warm-up
                for _ in range(max(2, calls // 2)):
                    call(side)
            for k in range(rounds):
                for side in (("B", "A") if k % 2 else ("A", "B")):
                    ts = []
                    for _ in range(calls):
                        t, w = call(side)
                        ts.append(t)
                        wrong += w
                    times[side].append(ts)
            out[nbytes] = times
    finally:
        for c in comms.values():
            c.close()
    return out, wrong


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-np", type=int, default=2)
    ap.add_argument("--coll", choices=COLLS, required=True)
    ap.add_argument("--sizes", required=True, help="bytes, comma-separated (1K, 4M, ...)")
    ap.add_argument("--env-a", default="", help="K=V,... for communicator A")
    ap.add_argument("--env-b", default="", help="K=V,... for communicator B")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--pin", action="store_true", help="rank r on CPU r mod n")
    ap.add_argument("--json", default=None)
    return ap


def main() -> int:
    a = build_parser().parse_args()
    import tempfile

    from ringcomm.core.launch import spawn
    sizes = [_size(s) for s in a.sizes.split(",")]
    store = tempfile.mkdtemp(prefix="knob-ab-")
    res = spawn(_rank, a.np, (store, a.coll, sizes, _env(a.env_a), _env(a.env_b), a.rounds, a.calls, a.pin),
                timeout=1800)
    wrong = sum(w for _, w in res)
    print(f"# knob_ab: {a.coll}, {a.np} ranks{' pinned' if a.pin else ''}, A = {a.env_a or 'defaults'}, "
          f"B = {a.env_b or 'defaults'}, {a.rounds} rounds x {a.calls} calls each, alternated")
    print("# command: python benchmarks/probes/knob_ab.py " + " ".join(sys.argv[1:]))
    print("| size | A median us | B median us | B/A (medians) | B/A (median of rounds' ratios) |")
    print("|---:|---:|---:|---:|---:|")
    report = {"args": vars(a), "sizes": {}, "wrong": wrong}
    for n in sizes:
        per = {s: np.max(np.stack([np.asarray(r[n][s]) for r, _ in res]), axis=0) for s in ("A", "B")}
        ma, mb = float(np.median(per["A"])) * 1e6, float(np.median(per["B"])) * 1e6
        ratios = np.median(per["B"], axis=1) / np.median(per["A"], axis=1)
        label = f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1024 else f"{n} B"
        print(f"| {label} | {ma:.1f} | {mb:.1f} | {mb / ma:.3f} | {float(np.median(ratios)):.3f} |")
        report["sizes"][n] = {"A_us": ma, "B_us": mb, "round_ratios": ratios.tolist()}
    print(f"# check: {'ok' if wrong == 0 else f'FAIL ({wrong} wrong elements)'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
