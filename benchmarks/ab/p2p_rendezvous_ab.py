"""Point-to-point with and without the rendezvous, in one run: ``-np`` ranks (2: the pair's
channels; 3 or more: the outbox layout, where unreceived eager messages are held in private
memory), each holding one communicator per ``--eager`` value of RINGCOMM_P2P_EAGER_BYTES
(messages larger than it take the rendezvous; ``default``: the knob as the environment gives it;
the last value, 1024G by default, sends every message eager). Ranks 0 and 1 ping-pong float32
messages of each size back to back (blocking send, then recv), the communicators taking turns
``--rounds`` times per size; prints per size the median one-way time (half a round trip) under
each and its ratio to the last, then rank 0's resident memory growth while rank 1 sends
``--unexpected`` MiB of 4 MiB messages before rank 0 posts a receive (first and last value).

    python benchmarks/ab/p2p_rendezvous_ab.py -np 3 --sizes 64K,256K,1M,4M,16M [--eager default,1024G] [--reps 50] [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from ringcomm.bench.spec import parse_size
from ringcomm.core.launch import spawn


def _init(rank, world, store, eager):
    """A communicator whose engine reads RINGCOMM_P2P_EAGER_BYTES=eager (knobs are read at init;
    ``default``: as the environment says)."""
    import ringcomm
    from ringcomm.core.config import environment
    with environment({} if eager == "default" else {"RINGCOMM_P2P_EAGER_BYTES": eager}):
        return ringcomm.init(rank=rank, world_size=world, init_method=f"file://{store}/{eager}")


def _pingpong(comm, rank, x, reps):
    """Median one-way time of `reps` back-to-back round trips between ranks 0 and 1."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        if rank == 0:
            comm.send(x, 1)
            comm.recv(x, 1)
        elif rank == 1:
            comm.recv(x, 0)
            comm.send(x, 0)
        times.append((time.perf_counter() - t0) / 2)
    return statistics.median(times)


def _rss_mib():
    """This process's resident memory now (/proc/self/statm), in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def _unexpected(comm, rank, mib):
    """Rank 1 sends `mib` MiB in 4 MiB messages before rank 0 posts a receive; rank 0's resident
    memory growth meanwhile, in MiB (on rank 0)."""
    n = 4 << 20
    count = max(1, mib * (1 << 20) // n)
    comm.barrier()
    grown = None
    if rank == 1:
        hs = [comm.send(np.ones(n // 4, np.float32), 0, tag=t, async_op=True) for t in range(count)]
        comm.barrier()
        for h in hs:
            h.wait()
    elif rank == 0:
        rss0 = _rss_mib()
        time.sleep(0.5)
        comm.barrier()
        grown = _rss_mib() - rss0
        y = np.empty(n // 4, np.float32)
        for t in range(count):
            comm.recv(y, 1, tag=t)
    else:
        comm.barrier()
    comm.barrier()
    return grown


def _rank(rank, world, store, modes, sizes, reps, rounds, unexpected_mib):
    comms = {m: _init(rank, world, store, m) for m in modes}
    try:
        out = {m: {s: [] for s in sizes} for m in modes}
        for size in sizes:
            x = np.ones(size // 4, np.float32)
            for m, c in comms.items():  # warm: pages touched, buffers sized
                _pingpong(c, rank, x, 3)
            for r in range(rounds):
                for m in (modes if r % 2 == 0 else modes[::-1]):
                    out[m][size].append(_pingpong(comms[m], rank, x, reps))
            for c in comms.values():
                c.barrier()
        grown = {m: _unexpected(comms[m], rank, unexpected_mib) for m in (modes[-1], modes[0])}
        return out, grown
    finally:
        for c in comms.values():
            c.close()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-np", type=int, default=3)
    p.add_argument("--sizes", default="64K,256K,1M,4M,16M")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--eager", default="default,1024G", help="RINGCOMM_P2P_EAGER_BYTES values, comma-separated")
    p.add_argument("--unexpected", type=int, default=64, help="MiB rank 1 sends before rank 0 receives")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if a.np < 2:
        p.error("-np must be at least 2")
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    modes = a.eager.split(",")
    with tempfile.TemporaryDirectory(prefix="p2p-rdv-") as tmp:
        for m in modes:
            os.makedirs(os.path.join(tmp, m))
        runs, grown = spawn(_rank, a.np, (tmp, modes, sizes, a.reps, a.rounds, a.unexpected), timeout=600)[0]
    from ringcomm.core.config import knob
    names = [f"{m}={knob('RINGCOMM_P2P_EAGER_BYTES')}" if m == "default" else m for m in modes]
    print(f"# {a.np} ranks, ranks 0 <-> 1 back-to-back ping-pong (blocking send/recv), one communicator "
          f"per RINGCOMM_P2P_EAGER_BYTES value taking turns {a.rounds} times per size; median over "
          f"rounds of each round's median one-way us ({a.reps} round trips); ratio to {names[-1]}")
    print(f"{'size':>10} " + " ".join(f"{n:>16}" for n in names) + " " +
          " ".join(f"{'/' + names[-1]:>10}" for _ in names[:-1]))
    for s in sizes:
        med = [statistics.median(runs[m][s]) * 1e6 for m in modes]
        print(f"{s:>10} " + " ".join(f"{v:>16.1f}" for v in med) + " " +
              " ".join(f"{v / med[-1]:>10.2f}" for v in med[:-1]))
    print(f"# rank 0's resident memory growth while rank 1's {a.unexpected} MiB (4 MiB messages) wait for "
          f"its receives: {names[0]}: {grown[modes[0]]:.1f} MiB, {names[-1]}: {grown[modes[-1]]:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
