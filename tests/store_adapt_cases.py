"""Rank bodies for tests/test_store_adapt.py (RINGCOMM_STREAM=adapt)."""
import numpy as np

from mp_cases import init_under_env


def _exact_round(comm, rank, world, n):
    """all_reduce, reduce_scatter, all_gather and broadcast of n floats, checked bit for bit."""
    x = (np.arange(n, dtype=np.float32) % 97) * (rank + 1)
    comm.all_reduce(x)
    ok = x.tobytes() == ((np.arange(n, dtype=np.float32) % 97) * (world * (world + 1) // 2)).tobytes()
    per = n // world
    rs = np.zeros(per, np.float32)
    comm.reduce_scatter(rs, np.full(per * world, float(rank + 1), np.float32))
    ok = ok and bool((rs == world * (world + 1) / 2).all())
    g = np.zeros(per * world, np.float32)
    comm.all_gather(g, np.full(per, float(rank), np.float32))
    ok = ok and g.tobytes() == np.repeat(np.arange(world, dtype=np.float32), per).tobytes()
    b = np.arange(n, dtype=np.float32) if rank == 0 else np.zeros(n, np.float32)
    comm.broadcast(b, root=0)
    return ok and b.tobytes() == np.arange(n, dtype=np.float32).tobytes()


def adapt_case(rank, world, costs, calls, hooked):
    """`calls` rounds of 64 KiB collectives under RINGCOMM_STREAM=adapt (with this rank's faked
    costs in the test build); returns (exact, the policy's state after each round)."""
    if hooked:
        import hooked_build
        hooked_build.use()
    import os
    if costs:
        os.environ["RINGCOMM_TEST_STORE_COST"] = costs[rank]   # read at every call
    comm = init_under_env(rank, world, "adapt", {"RINGCOMM_STREAM": "adapt"})
    try:
        ok, states = True, []
        for i in range(calls):
            n = 16384 if i % 3 else 1000 * world       # 64 KiB, and small calls the policy skips
            ok = _exact_round(comm, rank, world, n) and ok
            states.append(comm.store_stats())
        return ok, states
    finally:
        comm.close()


def mismatch_then_go_on_case(rank, world):
    """A call whose sizes differ across ranks (one side eligible, the other not) raises on every
    rank; the policy's agreed state must not diverge, so the calls after it still run."""
    import ringcomm
    comm = init_under_env(rank, world, "adapt_mm", {"RINGCOMM_STREAM": "adapt"})
    try:
        x = np.ones(16384 if rank == 0 else 64, np.float32)
        try:
            comm.all_reduce(x)
            first = "no error"
        except ringcomm.MismatchError:
            first = "MismatchError"
        ok = all(_exact_round(comm, rank, world, 16384) for _ in range(140))
        return first, ok, comm.store_stats()
    finally:
        comm.close()


def cost_change_case(rank, world, phases):
    """The test build's costs change between phases (the knob is read at every call): `phases`
    is [(costs 'C,S', rounds)]; returns the policy's state after each phase."""
    import os
    import hooked_build
    hooked_build.use()
    comm = init_under_env(rank, world, "adapt_cc", {"RINGCOMM_STREAM": "adapt"})
    try:
        ok, states = True, []
        for costs, rounds in phases:
            os.environ["RINGCOMM_TEST_STORE_COST"] = costs
            for _ in range(rounds):
                ok = _exact_round(comm, rank, world, 16384) and ok
            states.append(comm.store_stats())
        return ok, states
    finally:
        comm.close()


def all_to_all_case(rank, world, costs, calls, small_rank):
    """`calls` all_to_alls under RINGCOMM_STREAM=adapt with this rank's faked costs: rank r sends
    (r + 1) * 4096 floats to every peer, except `small_rank`, which sends 8 (its input under
    RINGCOMM_STREAM_ADAPT_MIN_BYTES, the others' over it: the call is decided by the largest input
    in the headers, alike on every rank). Returns (exact, the policy's state after each call, the
    stores the last calls ran under, from the trace)."""
    import os
    import hooked_build
    hooked_build.use()
    os.environ["RINGCOMM_TEST_STORE_COST"] = costs[rank]
    comm = init_under_env(rank, world, "adapt_a2a", {"RINGCOMM_STREAM": "adapt", "RINGCOMM_TRACE": "8"})

    def block(r):
        return 8 if r == small_rank else (r + 1) * 4096
    try:
        ok, states = True, []
        x = np.concatenate([np.full(block(rank), rank * 100 + j, np.float32) for j in range(world)])
        want = np.concatenate([np.full(block(i), i * 100 + rank, np.float32) for i in range(world)])
        for _ in range(calls):
            out = np.zeros(want.size, np.float32)
            comm.all_to_all(out, x, output_splits=[block(i) for i in range(world)],
                            input_splits=[block(rank)] * world)
            ok = ok and out.tobytes() == want.tobytes()
            states.append(comm.store_stats())
        stores = [r["store"] for r in comm.trace() if r["collective"] == "all_to_all"]
        return ok, states, stores
    finally:
        comm.close()
