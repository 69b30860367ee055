"""Rank bodies for tests/test_slot_walk.py."""
import numpy as np

from mp_cases import init_under_env


def exact_rounds(rank, world, env, rounds):
    """`rounds` rounds of every collective at sizes around the walk's steps (one page, pieces
    that fit the span 2 to 32 times, pieces too large to walk), checked bit for bit; returns the
    number of wrong results."""
    comm = init_under_env(rank, world, "walk", env)
    wrong = 0
    try:
        for k in range(rounds):
            for n in (1, 1000, 1024, 2048 + 3, 4096, 8192 + 5, 16384, 65536 + 7):
                n -= n % world if n >= world else 0
                base = (np.arange(n, dtype=np.float32) + 7 * k) % 97
                x = base * (rank + 1)
                comm.all_reduce(x)
                wrong += int((x != base * (world * (world + 1) // 2)).sum())
                per = n // world
                if per:
                    rs = np.zeros(per, np.float32)
                    comm.reduce_scatter(rs, np.tile(base[:per], world) * (rank + 1))
                    wrong += int((rs != base[:per] * (world * (world + 1) // 2)).sum())
                    g = np.zeros(per * world, np.float32)
                    comm.all_gather(g, base[:per] + rank)
                    wrong += int((g != np.concatenate([base[:per] + r for r in range(world)])).sum())
                    a = np.zeros(per * world, np.float32)
                    comm.all_to_all(a, np.concatenate([base[:per] + 100 * rank + j for j in range(world)]))
                    wrong += int((a != np.concatenate([base[:per] + 100 * r + rank for r in range(world)])).sum())
                b = base.copy() if rank == k % world else np.zeros(n, np.float32)
                comm.broadcast(b, root=k % world)
                wrong += int((b != base).sum())
                r = base * (rank + 1)
                comm.reduce(r, root=0)
                if rank == 0:
                    wrong += int((r != base * (world * (world + 1) // 2)).sum())
        return wrong
    finally:
        comm.close()
