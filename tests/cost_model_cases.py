"""Cases of tests/test_cost_model.py that run inside spawned ranks (module-level so that spawn can
pickle them; torch is imported only by the bfloat16 cases, through mp_cases)."""
import numpy as np
from mp_cases import (ESIZE, TINY, close_enough, counts_of, init_under_env, make, pairs, reference,
                      thinned)
from order_ref import order_sensitive, ordered_sum
from rank_checks import AllReduceChecks

CONFIGS = {
    "hd_tiny": {"RINGCOMM_ALGO": "halving_doubling", "RINGCOMM_TRACE": "2", **TINY},
    "hd": {"RINGCOMM_ALGO": "halving_doubling", "RINGCOMM_TRACE": "2"},
    "ring": {"RINGCOMM_ALGO": "ring"},
}


def hd_cases(rank, world):
    """halving_doubling (tiny and default slots) against numpy and bit for bit against the ring:
    every dtype x op, counts 0, 1, odd, multi-unit, in place and out of place; order-sensitive
    floats for SUM, AVG, PRODUCT, MIN, MAX; a multi-iteration float32 SUM against the order model.
    From 16 ranks each dtype x op pair takes every third count, starting at its own offset: every
    pair and every count still runs (8 ranks run every pair at every count). Returns the failures."""
    stride = 3 if world >= 16 else 1
    with AllReduceChecks(rank, world, CONFIGS) as checks:
        comms, check, run = checks.comms, checks.check, checks.run
        for p, (dt, op) in enumerate(pairs()):
            lib = "torch" if dt == "bfloat16" else "numpy"
            for i, count in thinned(counts_of(world, ESIZE[dt], extra=(1001,)), p, stride):
                ins = [make(dt, count, r, 5, op) for r in range(world)]
                ref = reference(ins, dt, op, world)
                in_place = i % 2 == 0
                tag = f"{dt} {op} n={count} {'in place' if in_place else 'out of place'}"
                got = {}
                for name in ("hd_tiny", "hd", "ring"):
                    got[name], y = run(comms[name], ins[rank], op, in_place, dt, lib)
                    check(f"{name} all_reduce {tag}", close_enough(y, ref, dt, op))
                for name in ("hd_tiny", "hd"):
                    check(f"{name} differs bitwise from the ring, {tag}", got[name] == got["ring"])
                    if count > 0:
                        algo = comms[name].trace()[-1]["algorithm"]
                        check(f"{name} ran {algo}, {tag}", algo == "halving_doubling")
        for dt in ("float16", "float32", "float64", "bfloat16"):
            lib = "torch" if dt == "bfloat16" else "numpy"
            npdt = np.float32 if dt == "bfloat16" else np.dtype(dt)
            for count in (1, 3, 5 * world + 1, 3 * world * 128 // ESIZE[dt] + 1, 3001):
                for op in ("SUM", "AVG", "PRODUCT", "MIN", "MAX"):
                    x = order_sensitive(count, rank, npdt)
                    if op == "PRODUCT":
                        x = (1 + x / 1e4).astype(npdt)
                    got = {name: run(comms[name], x, op, op != "MAX", dt, lib)[0]
                           for name in ("hd_tiny", "ring")}
                    check(f"hd_tiny differs bitwise from the ring, order-sensitive {dt} {op} n={count}",
                          got["hd_tiny"] == got["ring"])
                    if op == "SUM" and lib == "numpy":
                        want = ordered_sum([order_sensitive(count, p, npdt) for p in range(world)]).tobytes()
                        check(f"hd_tiny differs from the order model, {dt} n={count}", got["hd_tiny"] == want)
        # Many iterations at the default geometry (32 KiB units): chunks of several units.
        count = world * (3 << 13) + 17
        x = order_sensitive(count, rank, np.float32)
        want = ordered_sum([order_sensitive(count, p, np.float32) for p in range(world)]).tobytes()
        check(f"hd differs from the order model at n={count}", run(comms["hd"], x, "SUM", True, "float32", "numpy")[0] == want)
    return checks.failures


def profile_init_case(rank, world, paths, sub):
    """Init with RINGCOMM_PROFILE=paths[rank] (None: unset): ("ok", hash) or (error type, message)."""
    env = {"RINGCOMM_PROFILE": paths[rank] or ""}
    try:
        comm = init_under_env(rank, world, sub, env)
    except Exception as e:  # noqa: BLE001 - the test compares what every rank saw
        return (type(e).__name__, str(e))
    try:
        return ("ok", comm._c.profile_hash)
    finally:
        comm.close()


def model_auto_case(rank, world, path, sizes):
    """With a shared profile and RINGCOMM_MODEL_MIN_WORLD=2, auto's all_reduce runs the model's
    choice (the trace names it) and equals the ring's bit for bit. Returns [(bytes, algo, proto,
    equal)]."""
    env = {"RINGCOMM_PROFILE": path, "RINGCOMM_MODEL_MIN_WORLD": "2", "RINGCOMM_TRACE": "2"}
    auto = init_under_env(rank, world, "auto", env)
    ring = init_under_env(rank, world, "ring", {"RINGCOMM_ALGO": "ring"})
    out = []
    try:
        for nbytes in sizes:
            x = order_sensitive(nbytes // 4, rank, np.float32)
            a, b = x.copy(), x.copy()
            auto.all_reduce(a)
            ring.all_reduce(b)
            t = auto.trace()[-1]
            out.append((nbytes, t["algorithm"], t["protocol"], a.tobytes() == b.tobytes()))
    finally:
        auto.close()
        ring.close()
    return out

