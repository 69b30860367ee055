"""Rank bodies for tests/test_footprint.py (spawned processes import them from here)."""
import traceback

import numpy as np

from mp_cases import init_under_env


def eight_rank_cases(rank, world):
    """all_reduce (direct and ring sizes), all_to_all, gather, scatter and point-to-point between
    non-neighbours with the default slot geometry, checked against numpy. Returns failures and
    this rank's segment bytes as the transport reports them."""
    comm = init_under_env(rank, world, "s", timeout=120)
    failures = []

    def data(r, n, salt):
        return ((np.arange(n, dtype=np.int64) * 7 + r * 131 + salt) % 1000).astype(np.float32)

    def check(name, ok):
        if not ok:
            failures.append(f"rank {rank}: {name}")

    try:
        # 1000 floats: bytes x (world-1) under RINGCOMM_DIRECT_MAX_BYTES (direct); 20000: the ring.
        # 20000 floats are 80 KB: several far (32 KiB) pieces and one full (256 KiB) ring piece.
        for n in (0, 1, 1000, 20000, 70001):
            x = data(rank, n, 1)
            comm.all_reduce(x)
            check(f"all_reduce {n}", np.array_equal(x, sum(data(r, n, 1) for r in range(world))))
        blk = 9000  # 36 KB per peer: two far pieces
        send = data(rank, blk * world, 2)
        out = np.zeros(blk * world, np.float32)
        comm.all_to_all(out, send)
        exp = np.concatenate([data(s, blk * world, 2)[rank * blk:(rank + 1) * blk] for s in range(world)])
        check("all_to_all", np.array_equal(out, exp))
        for root in (0, 5):
            g = np.zeros(blk * world, np.float32) if rank == root else None
            comm.gather(g, data(rank, blk, 3), root=root)
            if rank == root:
                check(f"gather root={root}", np.array_equal(g, np.concatenate([data(r, blk, 3) for r in range(world)])))
            src = data(root, blk * world, 4) if rank == root else None
            y = np.zeros(blk, np.float32)
            comm.scatter(y, src, root=root)
            check(f"scatter root={root}", np.array_equal(y, data(root, blk * world, 4)[rank * blk:(rank + 1) * blk]))
        # point-to-point across the ring (rank r to r+4): far channels on the p2p lane
        peer = (rank + world // 2) % world
        y = np.zeros(blk, np.float32)
        hs = comm.send(data(rank, blk, 5), peer, async_op=True)
        hr = comm.recv(y, peer, async_op=True)
        hs.wait(); hr.wait()
        check("send/recv across", np.array_equal(y, data(peer, blk, 5)))
        comm.barrier()
    except Exception:
        failures.append(f"rank {rank}: exception\n{traceback.format_exc()}")
    finally:
        comm.close()
    return failures


def info_rank(rank, world):
    """Create and close one communicator (its RINGCOMM_DEBUG=INFO line goes to stderr)."""
    comm = init_under_env(rank, world, "s", timeout=60)
    x = np.ones(10, np.float32)
    comm.all_reduce(x)
    comm.close()
    return bool(np.all(x == world))
