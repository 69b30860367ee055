"""Point-to-point with and without the rendezvous, in one run: ``-np`` ranks (3 or more: the
outbox layout), ranks 0 and 1 ping-pong float32 messages of each size (blocking send/recv, the
receive posted before the message comes) under RINGCOMM_P2P_EAGER_BYTES=256K (the default: larger
messages take the rendezvous) and =1T (every message eager), alternating the two ``--rounds``
times in fresh processes; prints per size the median one-way time (half a round trip) of each and
their ratio, and rank 0's peak RSS growth when rank 1 sends ``--unexpected`` MiB of large
messages before rank 0 posts a receive.

    python scripts/p2p_rendezvous_ab.py -np 3 --sizes 64K,256K,1M,4M,16M [--reps 30] [--rounds 3]
"""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time

import numpy as np

from ringcomm.launch import spawn


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    return int(t[:-1]) * units[t[-1]] if t[-1] in units else int(t)


def _rank(rank, world, store, sizes, reps, unexpected_mib):
    import ringcomm
    with ringcomm.init(rank=rank, world_size=world, init_method="file://" + store) as comm:
        out = {}
        for size in sizes:
            x = np.ones(size // 4, np.float32)
            times = []
            for i in range(reps + 3):
                comm.barrier()
                t0 = time.perf_counter()
                if rank == 0:
                    comm.send(x, 1)
                    comm.recv(x, 1)
                elif rank == 1:
                    comm.recv(x, 0)
                    comm.send(x, 0)
                if i >= 3:
                    times.append((time.perf_counter() - t0) / 2)
            out[size] = statistics.median(times)
        # Unexpected: rank 1 sends, rank 0 receives only after a pause.
        n = 4 << 20
        count = max(1, unexpected_mib * (1 << 20) // n)
        comm.barrier()
        grown = None
        if rank == 1:
            hs = [comm.send(np.ones(n // 4, np.float32), 0, tag=t, async_op=True) for t in range(count)]
            comm.barrier()
            for h in hs:
                h.wait()
        elif rank == 0:
            rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            time.sleep(0.5)
            comm.barrier()
            grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
            y = np.empty(n // 4, np.float32)
            for t in range(count):
                comm.recv(y, 1, tag=t)
        else:
            comm.barrier()
        comm.barrier()
        return out, grown


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-np", type=int, default=3)
    p.add_argument("--sizes", default="64K,256K,1M,4M,16M")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--unexpected", type=int, default=64, help="MiB rank 1 sends before rank 0 receives")
    a = p.parse_args(argv)
    if a.np < 3:
        p.error("-np must be at least 3 (the outbox layout)")
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    modes = {"rendezvous": "256K", "eager": "1T"}
    runs = {m: [] for m in modes}
    grown = {m: [] for m in modes}
    for r in range(a.rounds):
        for m in (modes if r % 2 == 0 else list(reversed(list(modes)))):
            with tempfile.TemporaryDirectory(prefix="p2p-rdv-") as tmp:
                got = spawn(_rank, a.np, (tmp, sizes, a.reps, a.unexpected), timeout=600,
                            env={"RINGCOMM_P2P_EAGER_BYTES": modes[m]})
            runs[m].append(got[0][0])
            grown[m].append(got[0][1])
    print(f"# {a.np} ranks, ranks 0 <-> 1 ping-pong, receive posted first; median one-way us over "
          f"{a.reps} round trips, median of {a.rounds} rounds (modes alternate)")
    print(f"{'size':>10} {'rendezvous':>11} {'eager':>9} {'rdv/eager':>10}")
    for s in sizes:
        med = {m: statistics.median(run[s] for run in runs[m]) * 1e6 for m in modes}
        print(f"{s:>10} {med['rendezvous']:>11.1f} {med['eager']:>9.1f} {med['rendezvous'] / med['eager']:>10.2f}")
    print(f"# rank 0's peak RSS growth while rank 1's {a.unexpected} MiB (4 MiB messages) wait for "
          f"its receives: rendezvous {max(grown['rendezvous']):.1f} MiB, eager {max(grown['eager']):.1f} MiB "
          f"(largest over rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
