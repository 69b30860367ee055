"""Cases of tests/test_two_shot.py that run INSIDE spawned ranks (module-level so that spawn can
pickle them; torch is imported only by the bfloat16 cases, through mp_cases)."""
import os

import numpy as np
import ringcomm
import ringcomm.core.config
from mp_cases import (ESIZE, FLOAT, TINY, close_enough, counts_of, init_under_env, make, pairs,
                      reference)
from order_ref import order_sensitive, ordered_sum
from rank_checks import AllReduceChecks

SENTINEL = -7

# The communicators the correctness cases compare: the two-shot (default and tiny slots), the
# ring (the reference order), the one-shot (default and tiny slots) and auto.
CONFIGS = {
    "two_shot": {"RINGCOMM_ALGO": "two_shot", "RINGCOMM_TRACE": "4"},
    "two_shot_tiny": {"RINGCOMM_ALGO": "two_shot", "RINGCOMM_TRACE": "4", **TINY},
    "ring": {"RINGCOMM_ALGO": "ring", "RINGCOMM_TRACE": "4"},
    "direct": {"RINGCOMM_ALGO": "direct", "RINGCOMM_TRACE": "4"},
    "direct_tiny": {"RINGCOMM_ALGO": "direct", "RINGCOMM_TRACE": "4", **TINY},
    "auto": {"RINGCOMM_TRACE": "4"},
}


def auto_expected(world, nbytes):
    """The algorithm RINGCOMM_ALGO=auto picks at the default knobs (csrc/comm/selection.cpp; the LL
    protocol runs the direct algorithm)."""
    knob = ringcomm.core.config.knob
    if world > 1 and 0 < nbytes <= int(knob("RINGCOMM_LL_MAX_BYTES")):
        return "direct"
    if nbytes * (world - 1) <= int(knob("RINGCOMM_DIRECT_MAX_BYTES")):
        return "direct"
    if world >= int(ringcomm.core.config.knob("RINGCOMM_TWO_SHOT_MIN_WORLD")) and nbytes <= int(knob("RINGCOMM_TWO_SHOT_MAX_BYTES")):
        return "two_shot"
    return "ring"


def correctness_cases(rank, world):
    with AllReduceChecks(rank, world, CONFIGS) as checks:
        comms, check, run = checks.comms, checks.check, checks.run
        ran = {}
        # Every dtype x op, exact data (small integers): against numpy, and bit for bit across
        # the algorithms; each algorithm checked to have run (the trace names it).
        for dt, op in pairs():
            lib = "torch" if dt == "bfloat16" else "numpy"
            for count in counts_of(world, ESIZE[dt], extra=(5, 1000)):
                ins = [make(dt, count, r, 3, op) for r in range(world)]
                ref = reference(ins, dt, op, world)
                for in_place in (True, False):
                    tag = f"{dt} {op} n={count} {'in place' if in_place else 'out of place'}"
                    got = {}
                    for name, comm in comms.items():
                        got[name], y = run(comm, ins[rank], op, in_place, dt, lib)
                        check(f"{name} all_reduce {tag}", close_enough(y, ref, dt, op))
                        if count > 0:
                            algo = comm.trace()[-1]["algorithm"]
                            want = (auto_expected(world, count * ESIZE[dt]) if name == "auto"
                                    else CONFIGS[name]["RINGCOMM_ALGO"])
                            check(f"{name} ran {algo}, expected {want}, {tag}", algo == want)
                            ran[name] = ran.get(name, 0) + 1
                    for name in comms:
                        check(f"{name} differs bitwise from the ring, {tag}", got[name] == got["ring"])
        check(f"some algorithm never ran: {ran}", all(ran.get(name, 0) > 0 for name in comms))

        # Order-sensitive floating data, every op: bit for bit the ring and the one-shot (and,
        # for SUM, the order model of tests/order_ref.py).
        algos = ("two_shot", "two_shot_tiny", "direct", "direct_tiny")
        for dt in ("float16", "float32", "float64", "bfloat16"):
            lib = "torch" if dt == "bfloat16" else "numpy"
            npdt = np.float32 if dt == "bfloat16" else np.dtype(dt)
            for count in (1, 2, 3, 7, 5 * world + 1, 3 * world * 128 // ESIZE[dt] + 1, 3001):
                for op in ("SUM", "AVG", "PRODUCT", "MIN", "MAX"):
                    x = order_sensitive(count, rank, npdt)
                    if op == "PRODUCT":
                        x = (1 + x / 1e4).astype(npdt)
                    got = {name: run(comms[name], x, op, op != "MAX", dt, lib)[0] for name in (*algos, "ring")}
                    for name in algos:
                        check(f"{name} differs bitwise from the ring, order-sensitive {dt} {op} n={count}",
                              got[name] == got["ring"])
                    if op == "SUM" and lib == "numpy":
                        want = ordered_sum([order_sensitive(count, p, npdt) for p in range(world)]).tobytes()
                        check(f"two_shot differs from the order model, {dt} n={count}", got["two_shot"] == want)

        # auto's choice around its two thresholds (one-shot / two-shot / ring), float32 SUM: the
        # trace names the algorithm, the result equals the ring's bit for bit. The documented
        # defaults: the two-shot only with 4 or more ranks, up to 128 KiB.
        knob = ringcomm.core.config.knob
        thr = int(knob("RINGCOMM_DIRECT_MAX_BYTES")) // (4 * (world - 1))
        top = int(knob("RINGCOMM_TWO_SHOT_MAX_BYTES")) // 4
        seen = {}
        for count in sorted({thr, thr + 1, top, top + 1, 32768 // 4}):
            x = order_sensitive(count, rank, np.float32)
            got = {name: run(comms[name], x, "SUM", True, "float32", "numpy")[0] for name in ("auto", "ring")}
            algo = comms["auto"].trace()[-1]["algorithm"]
            seen[count * 4] = algo
            check(f"auto ran {algo} at {count * 4} B, expected {auto_expected(world, count * 4)}",
                  algo == auto_expected(world, count * 4))
            check(f"auto differs bitwise from the ring at {count * 4} B", got["auto"] == got["ring"])
        if not any(ringcomm.core.config.knob_is_set(k) for k in ("RINGCOMM_DIRECT_MAX_BYTES", "RINGCOMM_TWO_SHOT_MAX_BYTES",
                                                              "RINGCOMM_TWO_SHOT_MIN_WORLD")):
            check(f"auto's choices {seen}", (world < 4 or seen[32768] == "two_shot")
                  and seen[(thr + 1) * 4] == ("two_shot" if world >= 4 else "ring")
                  and seen[(top + 1) * 4] == "ring" and seen[thr * 4] == "direct")

        # Past 2n segments of 1 MiB the all-reduce chunks are runs of several segments.
        count = (2 * world << 20) // 4 + 12345
        x = order_sensitive(count, rank, np.float32)
        want = ordered_sum([order_sensitive(count, p, np.float32) for p in range(world)]).tobytes()
        for name in ("two_shot", "ring"):
            check(f"{name} differs from the order model at n={count}", run(comms[name], x, "SUM", True, "float32", "numpy")[0] == want)
    return checks.failures


def _attempt(fn):
    try:
        fn()
        return ("no error", "")
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e))


def mismatch_cases(rank, world):
    """Rank 0 forces the two-shot, the others another algorithm (the ring; the one-shot, whose
    first piece travels with the header; the one-shot with tiny slots). Returns per scenario
    (name, rank, outcome, message, output untouched, the communicator usable afterwards)."""
    out = []
    for other in ("ring", "direct", "direct_tiny"):
        env = dict(CONFIGS["two_shot"] if rank == 0 else CONFIGS[other])
        if other == "direct_tiny":
            env.update(TINY)
        comm = init_under_env(rank, world, f"mix-{other}", env)
        try:
            for count in (1, 40, 3000):
                x = np.full(count, rank + 1.0, np.float32)
                y = np.full(count, SENTINEL, np.float32)
                res = _attempt(lambda: comm.all_reduce(x, output=y))
                untouched = bool((y == SENTINEL).all() and (x == rank + 1.0).all())
                # usable afterwards: the collectives whose algorithm RINGCOMM_ALGO does not choose
                # (broadcast follows all_reduce's direct choice, reduce_scatter the forced value) run and
                # give the right results
                comm.barrier()
                g = np.zeros(world * count, np.float32)
                comm.all_gather(g, np.full(count, rank + 1.0, np.float32))
                a_in = np.full(world * 5, rank + 1.0, np.float32)
                a_out = np.zeros(world * 5, np.float32)
                comm.all_to_all(a_out, a_in)
                usable = bool((g == np.repeat(np.arange(1.0, world + 1), count)).all()
                              and (a_out == np.repeat(np.arange(1.0, world + 1), 5)).all())
                out.append((f"two_shot vs {other} n={count}", rank, res[0], res[1], untouched, usable))
        finally:
            comm.close()
    return out
