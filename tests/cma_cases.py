"""Cases of tests/test_cma.py that run inside spawned ranks (module-level so that spawn can
pickle them)."""
import os
import time
import traceback

import numpy as np
import ringcomm
from mp_cases import init_under_env

DTYPES = ["float32", "float64", "float16", "int8", "uint8", "int32", "int64", "bool"]


def _path(comm):
    rec = comm.trace()[-1]
    return f"{rec['algorithm']}/{rec['protocol']}"


def _values(dtype, n, seed):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, n).astype(bool)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(n).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, n, endpoint=True).astype(dtype)


def exact_cases(rank, world, env):
    """all_to_all (even and uneven splits), all_gather (out of place, in place, unequal
    contributions) and broadcast (every root) of every dtype, at sizes each side of
    RINGCOMM_CMA_MIN_BYTES, every result compared bit for bit with numpy's. Returns the failures
    and the set of algorithm/protocol pairs each collective ran."""
    fails, paths = [], {}
    comm = init_under_env(rank, world, "exact", dict(env, RINGCOMM_TRACE="4"))
    info = comm.describe() if hasattr(comm, "describe") else ""

    def note(name):
        paths.setdefault(name, set()).add(_path(comm))

    try:
        for di, dtype in enumerate(DTYPES):
            es = np.dtype(dtype).itemsize
            # Messages below the threshold (64 KiB), at it or above, and blocks no world size divides.
            for block_bytes in (4096, 65536 // world, 65536 * 3 + 8):
                block = max(1, block_bytes // es)
                seed = 1000 * di + block
                # all_to_all, even splits: rank r's input is block-by-block from a seeded source.
                ins = [_values(dtype, block * world, seed + r) for r in range(world)]
                out = np.zeros(block * world, dtype)
                comm.all_to_all(out, ins[rank].copy())
                want = np.concatenate([ins[p][rank * block:(rank + 1) * block] for p in range(world)])
                if out.tobytes() != want.tobytes():
                    fails.append(f"rank {rank}: all_to_all {dtype} block {block}")
                note("all_to_all")
                # uneven splits: rank p sends (p + q + 1) * block // 2 elements to q.
                split = lambda p, q: (p + q + 1) * block // 2
                uin = [_values(dtype, sum(split(p, q) for q in range(world)), seed + 7 + p) for p in range(world)]
                uout = np.zeros(sum(split(p, rank) for p in range(world)), dtype)
                comm.all_to_all(uout, uin[rank].copy(), output_splits=[split(p, rank) for p in range(world)],
                                input_splits=[split(rank, q) for q in range(world)])
                parts = []
                for p in range(world):
                    off = sum(split(p, q) for q in range(rank))
                    parts.append(uin[p][off:off + split(p, rank)])
                if uout.tobytes() != np.concatenate(parts).tobytes():
                    fails.append(f"rank {rank}: all_to_all uneven {dtype} block {block}")
                note("all_to_all_uneven")
                # all_gather, equal contributions: out of place, then in place.
                mine = ins[rank][:block].copy()
                out = np.zeros(block * world, dtype)
                comm.all_gather(out, mine)
                want = np.concatenate([ins[p][:block] for p in range(world)])
                if out.tobytes() != want.tobytes():
                    fails.append(f"rank {rank}: all_gather {dtype} block {block}")
                note("all_gather")
                buf = np.zeros(block * world, dtype)
                buf[rank * block:(rank + 1) * block] = ins[rank][:block]
                comm.all_gather(buf, buf[rank * block:(rank + 1) * block])
                if buf.tobytes() != want.tobytes():
                    fails.append(f"rank {rank}: all_gather in place {dtype} block {block}")
                # broadcast from every root, of a count no world size divides.
                for root in range(world):
                    msg = np.concatenate([ins[root], ins[root][:3]])
                    x = msg.copy() if rank == root else np.zeros(msg.size, dtype)
                    comm.broadcast(x, root=root)
                    if x.tobytes() != msg.tobytes():
                        fails.append(f"rank {rank}: broadcast {dtype} {block * world} root {root}")
                    note("broadcast")
        # Asynchronous calls back to back: each rank's buffer stays read until its peers are done.
        works, wants = [], []
        for i in range(6):
            x = np.full(70001, float(rank * 10 + i), np.float32)
            o = np.zeros(70001 * world, np.float32)
            works.append((comm.all_gather(o, x, async_op=True), o))
            wants.append(np.concatenate([np.full(70001, float(p * 10 + i), np.float32) for p in range(world)]))
        for (w, o), want in zip(works, wants):
            w.wait()
            if o.tobytes() != want.tobytes():
                fails.append(f"rank {rank}: async all_gather wrong")
    except Exception:
        fails.append(f"rank {rank}: " + traceback.format_exc())
    finally:
        comm.close()
    return fails, {k: sorted(v) for k, v in paths.items()}


def non_contiguous_case(rank, world, env):
    """A strided input is refused as on the slot path (the front's check, before any data moves)."""
    comm = init_under_env(rank, world, "strided", env)
    try:
        x = np.zeros(2 * 65536 * world, np.float32)[::2]
        out = np.zeros(65536 * world, np.float32)
        try:
            comm.all_to_all(out, x)
            return "no error"
        except Exception as e:  # noqa: BLE001 - the kind is the result
            return type(e).__name__
    finally:
        comm.close()


def deny_case(rank, world, deny_rank):
    """The test build's RINGCOMM_TEST_CMA_DENY on one rank: that rank's probe fails as under EPERM,
    so every rank falls back to the slots (the INFO line says why) and results stay exact."""
    import hooked_build
    hooked_build.use()
    env = {"RINGCOMM_CMA_MIN_BYTES": "64K", "RINGCOMM_CMA_BROADCAST_MIN_BYTES": "64K", "RINGCOMM_TRACE": "4"}
    if rank == deny_rank:
        env["RINGCOMM_TEST_CMA_DENY"] = "1"
    comm = init_under_env(rank, world, "deny", env)
    try:
        n = 65536
        x = np.arange(n * world, dtype=np.float32) + rank * 1e6
        out = np.zeros(n * world, np.float32)
        comm.all_to_all(out, x.copy())
        want = np.concatenate([np.arange(n * world, dtype=np.float32)[rank * n:(rank + 1) * n] + p * 1e6
                               for p in range(world)])
        ok = out.tobytes() == want.tobytes()
        a2a = _path(comm)
        g = np.zeros(n * world, np.float32)
        comm.all_gather(g, np.full(n, float(rank), np.float32))
        ok = ok and g.tobytes() == np.repeat(np.arange(world, dtype=np.float32), n).tobytes()
        ag = _path(comm)
        b = np.arange(n * 4, dtype=np.float32) if rank == 0 else np.zeros(n * 4, np.float32)
        comm.broadcast(b, root=0)
        ok = ok and b.tobytes() == np.arange(n * 4, dtype=np.float32).tobytes()
        return ok, [a2a, ag, _path(comm)]
    finally:
        comm.close()


def dies_mid_call_case(rank, world, env):
    """The last rank exits (the test build's RINGCOMM_TEST_CMA_EXIT) once it has read its peers'
    buffers, before it says it is done: the others, waiting for it to finish reading their buffers
    (or reading its own), raise PeerFailureError well within the deadline, not a hang."""
    import hooked_build
    hooked_build.use()
    comm = init_under_env(rank, world, "dies", env, timeout=30)
    if rank == world - 1:
        os.environ["RINGCOMM_TEST_CMA_EXIT"] = "1"  # read when the call's reads are done
    n = 1 << 18
    t0 = time.monotonic()
    try:
        out = np.zeros(n * world, np.float32)
        comm.all_gather(out, np.ones(n, np.float32))
        return "no error", time.monotonic() - t0
    except Exception as e:  # noqa: BLE001 - the kind is the result
        return type(e).__name__, time.monotonic() - t0
