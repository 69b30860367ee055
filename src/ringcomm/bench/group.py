"""A persistent group of local ranks for in-process benchmarking (the pytest-benchmark suites in
``benchmarks/suites/``): rank 0 runs in the calling process, so a timer there (pytest-benchmark's) can
wrap single collective calls; ranks 1..N-1 are spawned followers (``ringcomm.core.launch.spawn``)
that mirror every call. Same runners, buffers and correctness check as the CLI's sweep.

    g = LocalGroup(2, ["ringcomm", "gloo"])
    m = g.start("ringcomm", "all_reduce", "ip", "float32", "sum", 1 << 20, budget=0.5)
    assert m.wrong == 0
    for _ in range(m.calls): m.fn()        # exactly m.calls calls (e.g. through benchmark.pedantic)
    g.finish(m)
    g.close()

Rank 0's per-call time is what a timer in this process sees; in a ring every call ends within
a hand-off of the slowest rank, so it tracks the CLI's max-over-ranks figure closely.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import queue
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass

from .harness import Case
from .spec import DTYPES, element_count


def _follower(r, _n, world, cfg, libs, cmd_qs, ack_q):
    from .peers import make_runner
    rank = r + 1
    runners = {}
    try:
        for lib in libs:
            runners[lib] = make_runner(lib, rank, world, cfg)
        q = cmd_qs[r]
        while True:
            cmd = q.get()
            if cmd[0] == "stop":
                break
            _, lib, op, mode, dname, redop, count = cmd
            runner = runners[lib]
            case = Case(runner, op, mode, DTYPES[dname], redop, count, rank, world)
            case.prepare()
            runner.barrier()
            case.fn()
            wrong = case.check()
            calls = int(runner.agree_max(0.0))       # rank 0 chooses the number of calls
            runner.barrier()
            for _ in range(calls):
                case.fn()
            del case
            ack_q.put((rank, wrong))
    finally:
        for runner in reversed(list(runners.values())):
            with contextlib.suppress(Exception):
                runner.close()


@dataclass
class Measurement:
    fn: object            # zero-argument callable: one collective call on rank 0
    calls: int            # rank 0 must make exactly this many calls before finish()
    wrong: int            # wrong elements on rank 0 (followers' counts arrive with finish())
    size: int             # bytes of the full tensor
    count: int
    case: Case


class LocalGroup:
    def __init__(self, world: int, libs, timeout: float = 900.0, op_timeout: float = 120.0):
        from ringcomm.core.launch import spawn

        from .peers import make_runner
        if world < 2:
            raise ValueError("LocalGroup needs world >= 2")
        self.world, self.libs = world, list(libs)
        self._tmp = tempfile.mkdtemp(prefix="ringcomm-benchgroup-")
        self.cfg = {"world_size": world, "rc_init": f"file://{self._tmp}/rc_rdzv",
                    "torch_store": f"{self._tmp}/torch_store", "op_timeout": op_timeout}
        ctx = mp.get_context("spawn")
        self._cmd_qs = [ctx.Queue() for _ in range(world - 1)]
        self._ack_q = ctx.Queue()
        self.error: BaseException | None = None

        def run():
            try:
                spawn(_follower, world - 1,
                      (world, self.cfg, self.libs, self._cmd_qs, self._ack_q), timeout=timeout)
            except BaseException as e:  # noqa: BLE001 - surfaced by finish()/close()
                self.error = e
        self._thread = threading.Thread(target=run, name="ringcomm-bench-followers", daemon=True)
        self._thread.start()
        self.runners = {}
        for lib in self.libs:                   # same order as the followers: rendezvous pairs up
            self.runners[lib] = make_runner(lib, 0, world, self.cfg)

    def start(self, lib, op, mode, dtype, redop, nbytes, budget=0.5, min_calls=5,
              max_calls=2000) -> Measurement:
        """Build the case on every rank, run the checked call, agree on the call count."""
        dt = DTYPES[dtype]
        count = element_count(op, nbytes, dt, self.world)
        for q in self._cmd_qs:
            q.put(("case", lib, op, mode, dtype, redop, count))
        runner = self.runners[lib]
        case = Case(runner, op, mode, dt, redop, count, 0, self.world)
        case.prepare()
        runner.barrier()
        t0 = time.perf_counter()
        case.fn()
        t = time.perf_counter() - t0
        wrong = case.check()
        calls = max(min_calls, min(max_calls, int(budget / max(t, 1e-7))))
        calls = int(runner.agree_max(float(calls)))
        runner.barrier()
        return Measurement(case.fn, calls, wrong, count * dt.itemsize, count, case)

    def finish(self, m: Measurement, calls_made: int | None = None, timeout: float = 300.0) -> int:
        """Top up to m.calls calls if the timer made fewer (e.g. --benchmark-disable), collect the
        followers' check results; returns the total number of wrong elements."""
        if calls_made is not None:
            for _ in range(max(0, m.calls - calls_made)):
                m.fn()
        wrong, deadline = m.wrong, time.monotonic() + timeout
        for _ in range(self.world - 1):
            while True:
                if self.error is not None:
                    raise RuntimeError(f"benchmark follower ranks failed: {self.error}")
                try:
                    _, w = self._ack_q.get(timeout=0.5)
                    break
                except queue.Empty:
                    if time.monotonic() > deadline:
                        raise TimeoutError("benchmark follower ranks did not finish") from None
            wrong += w
        m.case = None
        return wrong

    def close(self) -> None:
        for q in self._cmd_qs:
            with contextlib.suppress(Exception):
                q.put(("stop",))
        for runner in reversed(list(self.runners.values())):
            with contextlib.suppress(Exception):
                runner.close()
        self._thread.join(timeout=60)
        shutil.rmtree(self._tmp, ignore_errors=True)
        if self.error is not None:
            raise RuntimeError(f"benchmark follower ranks failed: {self.error}")
