"""Calls per second of a small collective back to back, ringcomm beside MPICH, 2 ranks: the mean
µs per call of CALLS calls in a loop (one clock read around the whole loop, so the root of an
eager broadcast cannot look faster than the loop it is part of).

    python benchmarks/probes/loop_rate.py OP BYTES CALLS [WORLD]     # OP: broadcast | all_reduce

Runs ringcomm's ranks (``ringcomm.core.launch``), then the same loop under ``mpiexec`` with mpi4py
(skipped with a notice when either is missing); prints one line per library with every rank's
mean. float32 arrays, in place, root 0.
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

import numpy as np


def _loop(f, calls):
    for _ in range(2000):
        f()
    t0 = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - t0) / calls * 1e6


def _ringcomm_rank(comm, op, nbytes, calls):
    x = np.ones(nbytes // 4, np.float32)
    f = (lambda: comm.broadcast(x, root=0)) if op == "broadcast" else (lambda: comm.all_reduce(x))
    comm.barrier()
    return _loop(f, calls)


def _mpi_main(op, nbytes, calls):
    from mpi4py import MPI
    c = MPI.COMM_WORLD
    x = np.ones(nbytes // 4, np.float32)
    f = (lambda: c.Bcast(x, root=0)) if op == "broadcast" else (lambda: c.Allreduce(MPI.IN_PLACE, x))
    c.Barrier()
    us = _loop(f, calls)
    res = c.gather(us, root=0)
    if c.rank == 0:
        print(" ".join(f"{v:.2f}" for v in res))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("op", choices=("broadcast", "all_reduce"))
    p.add_argument("nbytes", type=int, metavar="BYTES")
    p.add_argument("calls", type=int, metavar="CALLS")
    p.add_argument("world", type=int, nargs="?", default=2, metavar="WORLD")
    p.add_argument("--mpi", action="store_true", help=argparse.SUPPRESS)  # one mpiexec rank
    return p


def main(argv=None):
    p = build_parser()
    a = p.parse_args(argv)
    op, nbytes, calls, world = a.op, a.nbytes, a.calls, a.world
    if a.mpi:
        return _mpi_main(op, nbytes, calls)
    from ringcomm.core.launch import launch
    res = launch(_ringcomm_rank, world, args=(op, nbytes, calls), timeout=600)
    print(f"ringcomm {op} {nbytes} B, {world} ranks: " + " ".join(f"{v:.2f}" for v in res) + " us/call")
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        print("mpi: skipped (no mpiexec)")
        return
    try:
        out = subprocess.run([mpiexec, "-n", str(world), sys.executable, os.path.abspath(__file__), "--mpi",
                              op, str(nbytes), str(calls)], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        print("mpi: skipped (timed out)")
        return
    if out.returncode != 0:
        print(f"mpi: skipped ({out.stderr.strip().splitlines()[-1:] or out.returncode})")
        return
    print(f"mpi {op} {nbytes} B, {world} ranks: {out.stdout.strip()} us/call")


if __name__ == "__main__":
    main()
