"""One group of ranks per world size for the whole test session, running many jobs.

Spawning a rank costs ~1 s of interpreter start-up and imports on a 2-core machine, and seconds
more when it imports torch (the import, the first collective's lazy set-up, the exit), while most
tests need only a few seconds of work in their ranks. ``run(fn, world_size, args)`` therefore
hands ``fn(rank, world_size, *args)`` to a pool of ``world_size`` processes (forks of the
session's fork server, which imported torch once) that stay up between calls, and returns the
results in rank order, as ``ringcomm.launch.spawn`` would:

* every job starts from the environment the caller has at the call (``os.environ`` as it is in
  the parent, then ``env``, then RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE), and the rank's
  environment and ringcomm.torch's issue hooks are put back when the job ends, so a job sees no
  setting a previous job made;
* a failure is raised as ``LaunchError`` with the traceback of the rank that failed first; a job that
  runs past ``timeout`` is reported with every still-running rank's stack (faulthandler on
  SIGUSR1); either way the pool is killed (its ranks may be inside a half-done collective) and the
  next call starts a new one;
* a job must leave nothing behind that a later job could trip over: it destroys the process groups
  it created and closes its communicators (the callers here do, in ``finally`` blocks). Jobs that
  kill or fork ranks, expect a rank to die, read a knob the library caches per process (the log
  level) or leave a process group initialised keep ``ringcomm.launch.spawn``'s fresh processes.

The pool's processes are daemons of the pytest process; conftest's leak check counts them as the
harness's (``owns``), and ``close_all`` ends them when the session finishes.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

from ringcomm.launch import LaunchError, collect, collect_stacks
from ringcomm.launch import _child as _launch_child

__all__ = ["run", "close_all", "owns", "LaunchError"]

# Imported once by the fork server, so every rank forked from it holds them (by each pool rank
# itself where the platform has no fork server). torch imports torch._dynamo at the first call of
# a function it guards against compilation (an optimizer's constructor, DDP's forward), which
# every rank that trains would otherwise pay again.
PRELOAD = ("numpy", "torch", "torch.distributed", "torch._dynamo")


def _serve(rank: int, world_size: int, jobs, results, stack_path: str) -> None:
    """A pool rank: run jobs from `jobs` until None arrives, each through ``ringcomm.launch``'s
    own child body (faulthandler stacks on SIGUSR1, RANK / WORLD_SIZE, the result or the failure
    put on `results` as ``ringcomm.launch.collect`` reads them)."""
    import importlib
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:       # torch is optional: the tests that need it skip without it
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    while True:
        job = jobs.get()
        if job is None:
            return
        fn, args, environ = job
        saved_env = dict(os.environ)
        hooks = _issue_hooks()
        saved_hooks = list(hooks) if hooks is not None else None
        os.environ.clear()
        os.environ.update(environ)
        try:
            _launch_child(fn, rank, world_size, args, None, results, stack_path)
        finally:
            os.environ.clear()
            os.environ.update(saved_env)
            hooks = _issue_hooks()
            if hooks is not None:
                hooks[:] = saved_hooks or []


def _issue_hooks():
    """ringcomm.torch's list of issue hooks if a job has imported it (a hook left registered
    would also turn its fast path off for every later job), else None."""
    mod = sys.modules.get("ringcomm.torch.hooks")
    return None if mod is None else mod.issue_hooks


def start_forkserver() -> bool:
    """Start multiprocessing's fork server now, with the session's environment and PRELOAD
    imported once: the pools' ranks and the ranks ``ringcomm.launch`` starts (conftest sets
    ``RINGCOMM_START_METHOD=forkserver`` for the session) are forks of it, each given its own
    environment by the job or the launch. Called by conftest at session start, so the server's
    environment is never a test's. False where the platform has no fork server."""
    if "forkserver" not in mp.get_all_start_methods():
        return False
    from multiprocessing import forkserver
    mp.set_forkserver_preload(list(PRELOAD))
    forkserver.ensure_running()   # a no-op once the server runs
    return True


def _context():
    """The pools' start method: forkserver (a rank starts as a fork of an interpreter that holds
    torch but has run nothing: no thread pool, no communicator, no process group), or spawn where
    the platform has none."""
    return mp.get_context("forkserver" if start_forkserver() else "spawn")


class _Pool:
    def __init__(self, world_size: int):
        ctx = _context()
        self.world_size = world_size
        self.results = ctx.Queue()
        self.jobs = [ctx.SimpleQueue() for _ in range(world_size)]
        self.stack_dir = tempfile.mkdtemp(prefix="ringcomm-pool-")
        self.stack_paths = [os.path.join(self.stack_dir, f"rank{r}.stack")
                            for r in range(world_size)]
        self.procs = []
        for r in range(world_size):
            p = ctx.Process(target=_serve, args=(r, world_size, self.jobs[r], self.results,
                                                 self.stack_paths[r]), daemon=True)
            p.start()
            self.procs.append(p)

    def run(self, fn: Callable, args: tuple, env: dict | None, timeout: float) -> list:
        # A pool that raised is never used again, so every report on `results` is this job's.
        environ = dict(os.environ)
        environ.update({k: str(v) for k, v in (env or {}).items()})
        for q in self.jobs:
            q.put((fn, tuple(args), environ))
        return collect(self.results, self.procs, timeout, "rank pool", self._stacks)

    def _stacks(self, ranks) -> str:
        return collect_stacks(self.procs, ranks, self.stack_paths, wait_s=1.0)

    def close(self, grace: float) -> None:
        for q, p in zip(self.jobs, self.procs):
            if p.is_alive() and grace > 0:
                try:
                    q.put(None)
                except OSError:
                    pass
        deadline = time.monotonic() + grace
        for p in self.procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=10)
        self.results.close()
        for path in self.stack_paths:
            try:
                os.unlink(path)
            except OSError:
                pass
        try:
            os.rmdir(self.stack_dir)
        except OSError:
            pass


_pools: dict[int, _Pool] = {}


def run(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (), *,
        timeout: float = 300.0, env: dict | None = None) -> list:
    """``fn(rank, world_size, *args)`` on the session's pool of ``world_size`` ranks (started on
    first use); the results in rank order. Raises ``LaunchError`` (and drops the pool) on a
    failure or a timeout."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    pool = _pools.get(world_size)
    if pool is not None and not all(p.is_alive() for p in pool.procs):   # a rank died idle
        _pools.pop(world_size)
        pool.close(grace=0.0)
        pool = None
    if pool is None:
        pool = _pools[world_size] = _Pool(world_size)
    ok = False
    try:
        out = pool.run(fn, tuple(args), env, timeout)
        ok = True
        return out
    finally:
        if not ok:  # a failure, a timeout, or the caller interrupted: the ranks' state is unknown
            _pools.pop(world_size, None)
            pool.close(grace=0.0)


def owns(process) -> bool:
    """Whether `process` (a multiprocessing child) is one of the pools' ranks."""
    return any(process.pid == p.pid for pool in _pools.values() for p in pool.procs)


def close_all() -> None:
    """End every pool (their ranks exit after the job they run)."""
    while _pools:
        _, pool = _pools.popitem()
        pool.close(grace=10.0)
