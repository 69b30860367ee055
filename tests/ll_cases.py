"""Cases of tests/test_ll.py that run inside spawned ranks (module-level so that spawn can pickle
them)."""
import os
import random
import time
import traceback

import numpy as np
import ringcomm
from mp_cases import init_under_env



def path(rec):
    """'algorithm/protocol' of a trace record."""
    return f"{rec['algorithm']}/{rec['protocol']}"


def reuse_cases(rank, world, calls, seed):
    """A long random sequence of LL and non-LL collectives, synchronous and asynchronous, with
    random delays before calls on random ranks, every result checked against the exact value: a
    rank that rewrote its outbox while a peer still read it (the reuse rule in
    csrc/transport/shm_board.h) would show up as a wrong result or a diverged stream."""
    from ringcomm.core.front import chunk_count
    fails = []
    comm = init_under_env(rank, world, "reuse", {"RINGCOMM_LL_MAX_BYTES": "1K", "RINGCOMM_TRACE": "8"})
    rng = random.Random(seed)            # the same sequence of calls on every rank
    delay = random.Random(seed * 31 + rank)  # each rank's own arrival noise
    algos = set()
    try:
        pending = []
        for i in range(calls):
            kind = rng.choice(["ar", "ar", "ar_async", "bcast", "reduce", "rs", "big", "barrier", "ag"])
            count = rng.choice([1, 5, 6, 14, 100, 249, 250, 256])   # 250 float32: 1000 B (LL), 256: 1 KiB
            if delay.random() < 0.1:
                time.sleep(delay.random() * 0.002)
            if kind in ("ar", "ar_async"):
                x = np.full(count, float(rank + 1 + i % 7), np.float32)
                want = sum(r + 1 + i % 7 for r in range(world))
                if kind == "ar":
                    comm.all_reduce(x)
                    if not (x == want).all():
                        fails.append(f"rank {rank} call {i}: all_reduce({count}) gave {x[:4]} want {want}")
                    algos.add(path(comm.trace()[-1]))
                else:
                    pending.append((i, x, want, comm.all_reduce(x, async_op=True)))
            elif kind == "bcast":
                root = rng.randrange(world)
                x = np.arange(count, dtype=np.float32) * (i + 1) if rank == root else np.zeros(count, np.float32)
                comm.broadcast(x, root=root)
                if not (x == np.arange(count, dtype=np.float32) * (i + 1)).all():
                    fails.append(f"rank {rank} call {i}: broadcast({count}, root {root}) wrong")
            elif kind == "reduce":
                root = rng.randrange(world)
                x = np.full(count, float(rank + 1 + i % 5), np.float32)
                comm.reduce(x, root=root)
                want = sum(r + 1 + i % 5 for r in range(world))
                if rank == root and not (x == want).all():
                    fails.append(f"rank {rank} call {i}: reduce({count}, root {root}) gave {x[:4]} want {want}")
                if rank != root and not (x == float(rank + 1 + i % 5)).all():
                    fails.append(f"rank {rank} call {i}: reduce({count}, root {root}) wrote a non-root's input")
                algos.add(path(comm.trace()[-1]))
            elif kind == "rs":
                total = count * world + i % world   # chunks of unequal size, LL up to 1 KiB
                x = np.arange(total, dtype=np.float32) + rank
                off = sum(chunk_count(total, world, k) for k in range(rank))
                out = np.zeros(chunk_count(total, world, rank), np.float32)
                comm.reduce_scatter(out, x)
                want = world * np.arange(off, off + len(out), dtype=np.float32) + sum(range(world))
                if not (out == want).all():
                    fails.append(f"rank {rank} call {i}: reduce_scatter({total}) gave {out[:4]} want {want[:4]}")
                algos.add(path(comm.trace()[-1]))
            elif kind == "big":
                x = np.full(3000 + count, float(rank), np.float32)   # above the outbox: direct or ring
                comm.all_reduce(x)
                if not (x == sum(range(world))).all():
                    fails.append(f"rank {rank} call {i}: all_reduce({3000 + count}) wrong")
                algos.add(path(comm.trace()[-1]))
            elif kind == "barrier":
                comm.barrier()
            else:
                x = np.full(count, float(rank), np.float32)
                out = np.zeros(count * world, np.float32)
                comm.all_gather(out, x)
                if not (out == np.repeat(np.arange(world, dtype=np.float32), count)).all():
                    fails.append(f"rank {rank} call {i}: all_gather({count}) wrong")
            if len(pending) > 3 or (pending and rng.random() < 0.3):
                for j, x, want, work in pending:
                    work.wait()
                    if not (x == want).all():
                        fails.append(f"rank {rank} call {j}: async all_reduce gave {x[:4]} want {want}")
                pending = []
        for j, x, want, work in pending:
            work.wait()
            if not (x == want).all():
                fails.append(f"rank {rank} call {j}: async all_reduce gave {x[:4]} want {want}")
    except Exception:  # noqa: BLE001
        fails.append(f"rank {rank}: " + traceback.format_exc())
    finally:
        comm.close()
    return fails, sorted(algos)


def knob_mismatch_case(rank, world):
    """Ranks with different RINGCOMM_LL_MAX_BYTES: init fails on every rank, naming the knob."""
    try:
        c = init_under_env(rank, world, "knob", {"RINGCOMM_LL_MAX_BYTES": "1K" if rank == 0 else "2K"})
        c.close()
        return ("no error", "")
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e))


def reduce_order_case(rank, world):
    """The LL reduce (outbox) against the chain reduce (RINGCOMM_LL_MAX_BYTES=0) on order-sensitive
    data, every root, dtype and op: the root's results must agree bit for bit (the chain combines
    x[root+1], then x[root+2] (op) that, ..., x[root] last), and no other rank's buffer changes."""
    from order_ref import order_sensitive
    fails = []
    ll = init_under_env(rank, world, "ll", {"RINGCOMM_TRACE": "2"}, prefix="red-ll")
    chain = init_under_env(rank, world, "chain", {"RINGCOMM_LL_MAX_BYTES": "0", "RINGCOMM_TRACE": "2"},
                           prefix="red-chain")
    try:
        for dt in (np.float16, np.float32, np.float64):
            for count in (1, 7, 13, 250, 4096 // np.dtype(dt).itemsize):
                for op in ("SUM", "AVG", "MAX", "PRODUCT"):
                    x = order_sensitive(count, rank, dt)
                    if op == "PRODUCT":
                        x = (1 + x / 1e4).astype(dt)
                    for root in range(world):
                        a, b = x.copy(), x.copy()
                        ll.reduce(a, root=root, op=op)
                        got_ll = path(ll.trace()[-1])
                        chain.reduce(b, root=root, op=op)
                        got_chain = path(chain.trace()[-1])
                        tag = f"{np.dtype(dt).name} n={count} {op} root {root}"
                        if (got_ll, got_chain) != ("direct/ll", "chain/header_in_slot"):
                            fails.append(f"rank {rank}: {tag} ran {got_ll} and {got_chain}")
                        if rank == root and a.tobytes() != b.tobytes():
                            bad = int(np.flatnonzero(a != b)[0])
                            fails.append(f"rank {rank}: LL and chain reduce differ, {tag}, first at {bad}")
                        if rank != root and a.tobytes() != x.tobytes():
                            fails.append(f"rank {rank}: the LL reduce wrote a non-root's input, {tag}")
    except Exception:  # noqa: BLE001
        fails.append(f"rank {rank}: " + traceback.format_exc())
    finally:
        ll.close()
        chain.close()
    return fails


def reduce_scatter_order_case(rank, world):
    """Every reduce_scatter path against the ring's (RINGCOMM_ALGO=ring) on order-sensitive data:
    the LL outbox, the direct exchange with the header in the first slot and without it, and the
    direct exchange in pieces of 256 bytes; every float dtype and op, counts not divisible by the
    world size, 0 and 1 element per rank, out of place and in place (the output this rank's own
    chunk of the input). Results must agree bit for bit (every path combines chunk k as x[k+1],
    then x[k+2] (op) that, ..., x[k] last), and the input outside the output must not change."""
    import torch
    from order_ref import order_sensitive
    from ringcomm.core.front import chunk_count
    fails = []
    configs = {
        "ll": ({"RINGCOMM_LL_MAX_BYTES": "64K"}, "direct/ll"),
        "inslot": ({"RINGCOMM_LL_MAX_BYTES": "0", "RINGCOMM_DIRECT_MAX_BYTES": "1M"}, "direct/header_in_slot"),
        "board": ({"RINGCOMM_LL_MAX_BYTES": "0", "RINGCOMM_DIRECT_MAX_BYTES": "1M", "RINGCOMM_HEADER_IN_SLOT": "off"},
                  "direct/simple"),
        "tiny": ({"RINGCOMM_ALGO": "direct", "RINGCOMM_SLOT_BYTES": "256", "RINGCOMM_FAR_SLOT_BYTES": "256",
                  "RINGCOMM_NSLOTS": "2", "RINGCOMM_LL_MAX_BYTES": "0"}, "direct/header_in_slot"),
    }
    comms = {name: init_under_env(rank, world, "rs-" + name, dict(env, RINGCOMM_TRACE="2"))
             for name, (env, _) in configs.items()}
    ring = init_under_env(rank, world, "rs-ring", {"RINGCOMM_ALGO": "ring", "RINGCOMM_TRACE": "2"})
    try:
        for dt in ("float16", "bfloat16", "float32", "float64"):
            es = 2 if dt == "bfloat16" else np.dtype(dt).itemsize
            for count in (0, 1, world - 1, world, world + 1, 7 * world + 3, 4096 // es + 1, 65536 // es):
                for op in ("SUM", "AVG", "MAX", "PRODUCT"):
                    x = order_sensitive(count, rank, np.float32 if dt == "bfloat16" else dt)
                    if op == "PRODUCT":
                        x = (1 + x / 1e4).astype(x.dtype)
                    if dt == "bfloat16":
                        x = torch.from_numpy(x).to(torch.bfloat16)

                    def raw(t):
                        return t.view(torch.int16).numpy().tobytes() if dt == "bfloat16" else t.tobytes()

                    def copy(t):
                        return t.clone() if dt == "bfloat16" else t.copy()
                    off = sum(chunk_count(count, world, k) for k in range(rank))
                    cnt = chunk_count(count, world, rank)
                    want = copy(x[:cnt])
                    ring.reduce_scatter(want, x)
                    got_ring = path(ring.trace()[-1])
                    if got_ring != ("ring/header_in_slot" if count > 0 else "ring/simple"):
                        fails.append(f"rank {rank}: {dt} n={count} {op} ran {got_ring} on the ring's communicator")
                    for name, comm in comms.items():
                        tag = f"{name} {dt} n={count} {op}"
                        expect = configs[name][1] if count > 0 else "direct/simple"
                        a, inp = copy(x[:cnt]), copy(x)
                        comm.reduce_scatter(a, inp)
                        got = path(comm.trace()[-1])
                        comm.reduce_scatter(inp[off:off + cnt], inp)  # in place
                        got_inplace = path(comm.trace()[-1])
                        if (got, got_inplace) != (expect, expect):
                            fails.append(f"rank {rank}: {tag} ran {got} and {got_inplace} in place, want {expect}")
                        if raw(a) != raw(want):
                            fails.append(f"rank {rank}: {tag}: differs from the ring's")
                        if raw(inp[off:off + cnt]) != raw(want):
                            fails.append(f"rank {rank}: {tag}: in place differs from the ring's")
                        if raw(inp[:off]) + raw(inp[off + cnt:]) != raw(x[:off]) + raw(x[off + cnt:]):
                            fails.append(f"rank {rank}: {tag}: in place wrote outside its chunk")
    except Exception:  # noqa: BLE001
        fails.append(f"rank {rank}: " + traceback.format_exc())
    finally:
        for comm in comms.values():
            comm.close()
        ring.close()
    return fails
