"""Where the tail of a small collective comes from, bound and unbound, in one run: calls back to
back or arriving apart, on a quiet machine or beside busy processes.

Each round launches ``-np`` ranks with each of ``--binds`` (``bind=none`` and ``bind=core`` by
default; ``none`` first in odd rounds, ``core`` first in even ones, so that a slow stretch of the
machine does not favour one side), beside ``--load`` busy processes (pure compute, not pinned, as
the bench's ``--load``). Every rank runs ``--calls`` all_reduces (float32 SUM, out of place) per
size, each after a separator and ``--spin-us`` of compute, and records the call's entry and exit
on CLOCK_MONOTONIC (one clock for every process of the machine) and the CPU it entered on. The
separators:

  none      nothing: calls back to back (the bench's ``--arrival b2b``)
  gloo      torch.distributed gloo's barrier (the bench's ``--arrival apart``)
  ringcomm  the communicator's own barrier
  pipe      a barrier with no thread of its own (2 ranks): rank 0 computes 100 us and writes a
            byte into rank 1's FIFO, on which rank 1 sleeps in read(); rank 1 writes one back
            (every call starts from a wake-up, and no other thread shares a rank's CPU)
  sleep     ``--sleep-us`` of time.sleep and no barrier (ranks idle between calls)

Per call:

  call   the bench's figure: the max over ranks of exit - entry (the first rank's time includes
         waiting for the last one to arrive)
  skew   the last rank's entry - the first rank's (the separator's release spread plus the compute)
  after  the last exit - the last entry: the collective once every rank has arrived

and per cell the p50 / p90 / p99 of each and the calls over 2 ms (a scheduler slice lost); the
calls whose ranks entered with two of them on one CPU (``sched_getcpu``), their count and median
call time beside the others'; each rank's
context switches per call (voluntary, involuntary: getrusage over the timed calls) and its wait
counters over the timed calls (``comm.wait_stats()``: waits that slept on the futex, waits that
found the peer on their CPU). Per size and figure the summary gives the mean over rounds of
p90/p50 per bind, bound's over unbound's, and the spread of the rounds' p50 (slowest over fastest:
a slow state of the machine slows a whole cell, which a cell's own p90/p50 does not show).

    python benchmarks/ab/arrival_skew.py -np 2 --rounds 3 --sizes 1K,64K --calls 2000 \\
        [--separator none|gloo|ringcomm|pipe|sleep] [--spin-us US] [--sleep-us 200] [--load N] \\
        [--binds none,core] [--json out.json]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import select
import sys
import tempfile
import time

import numpy as np

from ringcomm.bench.harness import spin_us
from ringcomm.bench.load import BusyLoad
from ringcomm.bench.spec import parse_size
from ringcomm.core.launch import launch

SEPARATORS = ("none", "gloo", "ringcomm", "pipe", "sleep")
BINDS = ("none", "core")
PIPE_TIMEOUT_S = 60.0
SLOW_US = 2000.0        # a call this long lost a scheduler slice


def alternating(rounds: int, binds) -> list[tuple[int, str]]:
    """(round, bind) in run order: ``binds`` in order in odd rounds, reversed in even ones."""
    return [(r, b) for r in range(rounds) for b in (binds if r % 2 == 0 else binds[::-1])]


def _pipe_barrier(rank: int, fifo_dir: str):
    """The pipe separator of 2 ranks and its closer. O_RDWR: opening never blocks for the other
    end. Each rank is also a writer of its own FIFO, so a dead peer gives no end of file: the
    wait for the peer's byte has a deadline."""
    mine = os.open(os.path.join(fifo_dir, f"r{rank}"), os.O_RDWR)
    peer = os.open(os.path.join(fifo_dir, f"r{1 - rank}"), os.O_RDWR)

    def take():
        if not select.select([mine], [], [], PIPE_TIMEOUT_S)[0]:
            raise TimeoutError(f"arrival_skew pipe: rank {rank} had no byte from rank {1 - rank} "
                               f"in {PIPE_TIMEOUT_S} s")
        os.read(mine, 1)

    def barrier():
        if rank == 0:
            spin_us(100)
            os.write(peer, b"x")
            take()
        else:
            take()
            os.write(peer, b"x")

    def close():
        os.close(mine)
        os.close(peer)
    return barrier, close


def _rank(comm, store_path: str, sizes: list[int], calls: int, sep: str, us: float, sleep_us: float,
          fifo_dir: str) -> dict:
    """Entry and exit times (ns) and entry CPUs of every timed call per size, the context switches
    per call and the wait counters' deltas."""
    getcpu = ctypes.CDLL(None).sched_getcpu
    barrier, close = comm.barrier, None
    dist = None
    if sep == "gloo":
        from datetime import timedelta

        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        dist.init_process_group("gloo", store=dist.FileStore(store_path, comm.size), rank=comm.rank,
                                world_size=comm.size, timeout=timedelta(seconds=120))
        barrier = dist.barrier
    elif sep == "pipe":
        barrier, close = _pipe_barrier(comm.rank, fifo_dir)
    elif sep == "sleep":
        barrier = lambda: time.sleep(sleep_us * 1e-6)  # noqa: E731
    elif sep == "none":
        barrier = lambda: None  # noqa: E731
    clock = time.monotonic_ns
    out = {"plan": str(comm.cpu_plan), "sizes": {}}
    try:
        for nbytes in sizes:
            x = np.ones(nbytes // 4, np.float32)
            y = np.empty_like(x)
            for _ in range(100):
                barrier()
                comm.all_reduce(x, output=y)
            t_in = np.empty(calls, np.int64)
            t_out = np.empty(calls, np.int64)
            cpu = np.empty(calls, np.int32)
            before = comm.wait_stats()
            ru0 = resource.getrusage(resource.RUSAGE_SELF)
            for i in range(calls):
                barrier()
                spin_us(us)
                cpu[i] = getcpu()
                t_in[i] = clock()
                comm.all_reduce(x, output=y)
                t_out[i] = clock()
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            after = comm.wait_stats()
            if not np.all(y == comm.size):
                raise RuntimeError(f"rank {comm.rank}: wrong all_reduce result at {nbytes} B")
            out["sizes"][nbytes] = {"in": t_in.tolist(), "out": t_out.tolist(), "cpu": cpu.tolist(),
                                    "switches": [(ru1.ru_nvcsw - ru0.ru_nvcsw) / calls,
                                                 (ru1.ru_nivcsw - ru0.ru_nivcsw) / calls],
                                    "waits": {k: after[k] - before.get(k, 0) for k in after}}
    finally:
        if dist is not None:
            dist.destroy_process_group()
        if close is not None:
            close()
    return out


def _quantiles(v: np.ndarray) -> list[float]:
    return [float(np.percentile(v, p)) for p in (50, 90, 99)]


def _median(v: np.ndarray) -> float | None:
    return float(np.median(v)) if v.size else None


def measure(world: int, bind: str, sizes: list[int], calls: int, sep: str, us: float,
            sleep_us: float, load: int) -> dict:
    """{size: {"call"|"skew"|"after": [p50, p90, p99] us, "slow": calls over SLOW_US, "shared":
    {...}, "switches" and "waits": [per rank]}} of one launch."""
    with tempfile.TemporaryDirectory(prefix="arrival-skew-") as tmp:
        fifo_dir = ""
        if sep == "pipe":
            fifo_dir = tmp
            for r in range(world):
                os.mkfifo(os.path.join(fifo_dir, f"r{r}"))
        with BusyLoad(load):
            res = launch(_rank, world, args=(os.path.join(tmp, "store"), sizes, calls, sep, us, sleep_us, fifo_dir),
                         bind=bind, timeout=600)
    cells = {}
    for nbytes in sizes:
        t_in = np.array([r["sizes"][nbytes]["in"] for r in res])
        t_out = np.array([r["sizes"][nbytes]["out"] for r in res])
        cpu = np.array([r["sizes"][nbytes]["cpu"] for r in res])
        call = (t_out - t_in).max(axis=0) / 1e3
        # two ranks entered on one CPU: fewer distinct CPUs than ranks at entry
        shared = np.array([len(set(col)) < world for col in cpu.T])
        cells[nbytes] = {"call": _quantiles(call), "slow": int((call > SLOW_US).sum()),
                         "skew": _quantiles((t_in.max(axis=0) - t_in.min(axis=0)) / 1e3),
                         "after": _quantiles((t_out.max(axis=0) - t_in.max(axis=0)) / 1e3),
                         "shared": {"calls": int(shared.sum()), "call_p50": _median(call[shared]),
                                    "other_call_p50": _median(call[~shared])},
                         "switches": [r["sizes"][nbytes]["switches"] for r in res],
                         "waits": [r["sizes"][nbytes]["waits"] for r in res]}
    return {"plans": [r["plan"] for r in res], "cells": cells}


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-np", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sizes", default="1K,4K,16K,64K")
    p.add_argument("--calls", type=int, default=2000, help="timed calls per cell")
    p.add_argument("--separator", choices=SEPARATORS, default="gloo")
    p.add_argument("--spin-us", type=float, help="compute after the separator, us (default 50; 0 with none)")
    p.add_argument("--sleep-us", type=float, default=200.0, help="the sleep separator's sleep, us")
    p.add_argument("--load", type=int, default=0, help="busy processes beside the ranks")
    p.add_argument("--binds", default=",".join(BINDS), help="bind values, comma-separated (none, core)")
    p.add_argument("--json", help="write every figure here")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if a.spin_us is None:
        a.spin_us = 0.0 if a.separator == "none" else 50.0
    sizes = [parse_size(s) for s in a.sizes.split(",") if s]
    binds = [b for b in a.binds.split(",") if b]
    if not binds or not set(binds) <= set(BINDS):
        p.error(f"--binds {a.binds!r}: each one of {', '.join(BINDS)}")
    if a.separator == "pipe" and a.np != 2:
        p.error("--separator pipe needs -np 2")
    runs: dict[str, list[dict]] = {b: [] for b in binds}
    for r, bind in alternating(a.rounds, binds):
        runs[bind].append(measure(a.np, bind, sizes, a.calls, a.separator, a.spin_us, a.sleep_us, a.load))
        print(f"# round {r + 1} bind {bind} done", file=sys.stderr)
    print(f"# all_reduce float32 out-of-place, {a.np} ranks, {a.calls} calls a cell, separator "
          f"{a.separator} + {a.spin_us:g} us, load {a.load}; p50 / p90 / p99 us; slow = calls over "
          f"{SLOW_US:g} us; shared = calls entered with two ranks on one CPU, their call p50 | the others'; "
          f"vcs / ivcs = context switches per call (all ranks); slept = futex sleeps (all ranks); load "
          f"average {os.getloadavg()[0]:.2f}")
    print(f"{'size':>7} {'round':>5} {'bind':>4} | {'call p50':>8} {'p90':>7} {'p99':>7} {'slow':>4} | "
          f"{'skew p50':>8} {'p90':>7} {'p99':>7} | {'after p50':>9} {'p90':>7} {'p99':>7} | "
          f"{'shared':>6} {'p50':>7} {'other':>7} | {'vcs':>5} {'ivcs':>5} {'slept':>5}")
    summary = {}
    for s in sizes:
        ratio, spread = {}, {}
        for bind in binds:
            cells = [run["cells"][s] for run in runs[bind]]
            for r, c in enumerate(cells):
                slept = sum(w.get("slept", 0) for w in c["waits"])
                vcs, ivcs = (sum(sw[k] for sw in c["switches"]) for k in (0, 1))
                sh = c["shared"]
                print(f"{s:>7} {r + 1:>5} {bind:>4} | {c['call'][0]:>8.1f} {c['call'][1]:>7.1f} "
                      f"{c['call'][2]:>7.1f} {c['slow']:>4} | {c['skew'][0]:>8.1f} {c['skew'][1]:>7.1f} "
                      f"{c['skew'][2]:>7.1f} | {c['after'][0]:>9.1f} {c['after'][1]:>7.1f} "
                      f"{c['after'][2]:>7.1f} | {sh['calls']:>6} {_us(sh['call_p50']):>7} "
                      f"{_us(sh['other_call_p50']):>7} | {vcs:>5.2f} {ivcs:>5.2f} {slept:>5}")
            ratio[bind] = {k: float(np.mean([c[k][1] / c[k][0] for c in cells])) for k in ("call", "after")}
            spread[bind] = {k: max(c[k][0] for c in cells) / min(c[k][0] for c in cells) for k in ("call", "after")}
        summary[s] = {"mean_p90_over_p50": ratio, "p50_max_over_min": spread}
        line = f"{s:>7} mean p90/p50: " + "; ".join(
            f"{k} " + " ".join(f"{b} {ratio[b][k]:.2f}" for b in binds) for k in ("call", "after"))
        if set(BINDS) <= set(binds):
            summary[s]["core_over_none"] = {k: ratio["core"][k] / ratio["none"][k] for k in ("call", "after")}
            line += " (core/none: " + ", ".join(f"{k} {v:.2f}" for k, v in summary[s]["core_over_none"].items()) + ")"
        line += "; rounds' p50 max/min: " + "; ".join(
            f"{k} " + " ".join(f"{b} {spread[b][k]:.2f}" for b in binds) for k in ("call", "after"))
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "runs": {k: [{"plans": run["plans"],
                                                       "cells": {str(s): c for s, c in run["cells"].items()}}
                                                      for run in v] for k, v in runs.items()},
                       "summary": {str(s): v for s, v in summary.items()}}, f, indent=1)
    return 0

if __name__ == "__main__":
    sys.exit(main())
