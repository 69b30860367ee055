"""What the separator between calls costs bound and unbound ranks: 2 ranks (``ringcomm.launch``,
``bind`` none and core), each call of all_reduce (float32, ``--size`` bytes, in place) preceded by
one of

  gloo     a torch.distributed gloo barrier (the bench's ``--arrival apart``), then 50 us of compute
  pipe     a barrier with no thread of its own: rank 0 computes 100 us and writes a byte into rank
           1's FIFO, on which rank 1 sleeps in read(); rank 1 writes one back; then 50 us of
           compute (every call starts from a wake-up, and no other thread shares a rank's CPU)
  ringcomm ringcomm's own barrier, then 50 us of compute
  sleep    ``--sleep`` us of time.sleep and no barrier (ranks idle between calls)

and prints per (separator, bind) the call time after the last rank's arrival (p50 / p90 us and
p90/p50: the last rank's end minus the last rank's start, as ``bench`` reports ``after``) and each
rank's context switches per call (voluntary, involuntary: getrusage over the timed calls).

    python scripts/bind_separator.py [--calls 3000] [--size 1024] [--sleep 200] [--separators gloo,pipe,ringcomm,sleep]
"""
from __future__ import annotations

import argparse
import os
import resource
import select
import shutil
import socket
import sys
import tempfile
import time

import numpy as np

import ringcomm


SEPARATORS = ("gloo", "pipe", "ringcomm", "sleep")
PIPE_TIMEOUT_S = 60.0


def _spin_us(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(comm, sep: str, calls: int, size: int, sleep_us: float, port: int, fifo_dir: str):
    if sep == "gloo":
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank,
                                world_size=comm.size)
        separate = lambda: (dist.barrier(), _spin_us(50))  # noqa: E731
    elif sep == "pipe":
        # O_RDWR: opening never blocks for the other end. Each rank is also a writer of its own
        # FIFO, so a dead peer gives no end of file: the wait for the peer's byte has a deadline.
        mine = os.open(os.path.join(fifo_dir, f"r{comm.rank}"), os.O_RDWR)
        peer = os.open(os.path.join(fifo_dir, f"r{1 - comm.rank}"), os.O_RDWR)

        def take():
            if not select.select([mine], [], [], PIPE_TIMEOUT_S)[0]:
                raise TimeoutError(f"bind_separator pipe: rank {comm.rank} had no byte from rank "
                                   f"{1 - comm.rank} in {PIPE_TIMEOUT_S} s")
            os.read(mine, 1)

        def separate():
            if comm.rank == 0:
                _spin_us(100)
                os.write(peer, b"x")
                take()
            else:
                take()
                os.write(peer, b"x")
            _spin_us(50)
    elif sep == "ringcomm":
        separate = lambda: (comm.barrier(), _spin_us(50))  # noqa: E731
    else:
        separate = lambda: time.sleep(sleep_us * 1e-6)  # noqa: E731
    x = np.ones(size // 4, np.float32)
    for _ in range(200):
        separate()
        comm.all_reduce(x)
    starts, ends = np.zeros(calls, np.int64), np.zeros(calls, np.int64)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    for i in range(calls):
        separate()
        starts[i] = time.monotonic_ns()
        comm.all_reduce(x)
        ends[i] = time.monotonic_ns()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    if sep == "gloo":
        import torch.distributed as dist
        dist.destroy_process_group()
    elif sep == "pipe":
        os.close(mine)
        os.close(peer)
    return starts, ends, (ru1.ru_nvcsw - ru0.ru_nvcsw) / calls, (ru1.ru_nivcsw - ru0.ru_nivcsw) / calls


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--sleep", type=float, default=200.0)
    p.add_argument("--separators", default=",".join(SEPARATORS), help="comma-separated, of " + ", ".join(SEPARATORS))
    a = p.parse_args(argv)
    seps = a.separators.split(",")
    if not seps or not set(seps) <= set(SEPARATORS):
        p.error(f"--separators {a.separators!r}: each one of {', '.join(SEPARATORS)}")
    print(f"# 2 ranks, all_reduce float32 {a.size} B; after the last arrival: p50 / p90 us, p90/p50; "
          f"context switches per call and rank (voluntary / involuntary); load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"{'separator':>9} {'bind':>5} {'p50':>8} {'p90':>8} {'p90/p50':>8}  switches per call")
    fifo_dir = tempfile.mkdtemp(prefix="bind-separator-") if "pipe" in seps else ""
    try:
        for r in (0, 1) if fifo_dir else ():
            os.mkfifo(os.path.join(fifo_dir, f"r{r}"))
        for sep in seps:
            for bind in ("none", "core"):
                got = ringcomm.launch(_rank, 2, (sep, a.calls, a.size, a.sleep, _free_port(), fifo_dir), bind=bind)
                s, e = np.array([g[0] for g in got]), np.array([g[1] for g in got])
                after = (e.max(axis=0) - s.max(axis=0)) / 1e3
                p50, p90 = np.percentile(after, [50, 90])
                sw = "  ".join(f"r{r} {g[2]:.1f} / {g[3]:.2f}" for r, g in enumerate(got))
                print(f"{sep:>9} {bind:>5} {p50:>8.2f} {p90:>8.2f} {p90 / p50:>8.2f}  {sw}", flush=True)
    finally:
        if fifo_dir:
            shutil.rmtree(fifo_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
