"""The tests' one rank-spawning harness.

Spawning a rank costs ~1 s of interpreter start-up and imports on a 2-core machine, and seconds
more when it imports torch (the import, the first collective's lazy set-up, the exit), while most
tests need only a few seconds of work in their ranks. So:

* ``run(fn, world_size, args)`` hands ``fn(rank, world_size, *args)`` to the session's group of
  ``world_size`` ranks (forks of the session's fork server, which imported torch once) that stay up
  between calls, and returns the results in rank order, as ``ringcomm.core.launch.spawn`` would;
* ``run_ranks(fn, world_size, backend)`` does the same with ``torch.distributed`` initialised on
  ``backend`` in every rank around ``fn``;
* ``once(key, start, what)`` runs a group ONCE per key for the session, so that one group runs many
  cases and the tests only read its results (``case_of`` picks one case out of them);
* ``run_with_dev_shm(size, ...)`` runs a case's ranks as forks inside a private mount namespace
  whose /dev/shm is a tmpfs of ``size`` (this file is also the script that forks them there).

Jobs that kill or fork ranks, expect a rank to die, read a knob the library caches per process (the
log level) or leave a process group initialised keep ``ringcomm.core.launch.spawn``'s fresh processes.

The group's contract, ``run``:

* every job starts from the environment the caller has at the call (``os.environ`` as it is in
  the parent, then ``env``, then RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE), and the rank's
  environment and ringcomm.torch's issue hooks are put back when the job ends, so a job sees no
  setting a previous job made;
* a failure is raised as ``LaunchError`` with the traceback of the rank that failed first; a job that
  runs past ``timeout`` is reported with every still-running rank's stack (faulthandler on
  SIGUSR1); either way the group is killed (its ranks may be inside a half-done collective) and the
  next call starts a new one;
* a job must leave nothing behind that a later job could trip over: it destroys the process groups
  it created and closes its communicators (the callers here do, in ``finally`` blocks).

The groups' processes are daemons of the pytest process; conftest's leak check counts them as the
harness's (``owns``), and ``close_all`` ends them when the session finishes.
"""
from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

from ringcomm.core.launch import LaunchError, collect, collect_stacks
from ringcomm.core.launch import _child as _launch_child

__all__ = ["run", "run_ranks", "once", "case_of", "temp_dir", "run_in_dir", "run_with_dev_shm", "close_all",
           "owns", "start_forkserver", "shm_segments", "lasting", "BACKENDS", "backend_available",
           "require_backend", "run_on_gloo_and_ringcomm", "LaunchError"]

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

# Imported once by the fork server, so every rank forked from it holds them (by each group rank
# itself where the platform has no fork server). torch imports torch._dynamo at the first call of
# a function it guards against compilation (an optimizer's constructor, DDP's forward), which
# every rank that trains would otherwise pay again.
PRELOAD = ("numpy", "torch", "torch.distributed", "torch._dynamo")


# ---- the session's groups of ranks -----------------------------------------------------------------

def _serve(rank: int, world_size: int, jobs, results, stack_path: str) -> None:
    """A group rank: run jobs from `jobs` until None arrives, each through ``ringcomm.core.launch``'s
    own child body (faulthandler stacks on SIGUSR1, RANK / WORLD_SIZE, the result or the failure
    put on `results` as ``ringcomm.core.launch.collect`` reads them)."""
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
    imported once: the groups' ranks and the ranks ``ringcomm.core.launch`` starts (conftest sets
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
    """The groups' start method: forkserver (a rank starts as a fork of an interpreter that holds
    torch but has run nothing: no thread pool, no communicator, no process group), or spawn where
    the platform has none."""
    return mp.get_context("forkserver" if start_forkserver() else "spawn")


class _Group:
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
        # A group that raised is never used again, so every report on `results` is this job's.
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


_groups: dict[int, _Group] = {}


def run(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (), *,
        timeout: float = 300.0, env: dict | None = None) -> list:
    """``fn(rank, world_size, *args)`` on the session's group of ``world_size`` ranks (started on
    first use); the results in rank order. Raises ``LaunchError`` (and drops the group) on a
    failure or a timeout."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    group = _groups.get(world_size)
    if group is not None and not all(p.is_alive() for p in group.procs):   # a rank died idle
        _groups.pop(world_size)
        group.close(grace=0.0)
        group = None
    if group is None:
        group = _groups[world_size] = _Group(world_size)
    ok = False
    try:
        out = group.run(fn, tuple(args), env, timeout)
        ok = True
        return out
    finally:
        if not ok:  # a failure, a timeout, or the caller interrupted: the ranks' state is unknown
            _groups.pop(world_size, None)
            group.close(grace=0.0)


def owns(process) -> bool:
    """Whether `process` (a multiprocessing child) is one of the groups' ranks."""
    return any(process.pid == p.pid for group in _groups.values() for p in group.procs)


def close_all() -> None:
    """End every group (their ranks exit after the job they run)."""
    while _groups:
        _, group = _groups.popitem()
        group.close(grace=10.0)


@contextlib.contextmanager
def temp_dir(prefix: str):
    """A fresh directory (a file store's home, RC_TEST_STORE), removed with its contents after."""
    d = tempfile.mkdtemp(prefix=prefix)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_in_dir(fn: Callable[..., Any], world_size: int, prefix: str, args: Sequence[Any] = (), *,
               timeout: float, env: dict | None = None) -> list:
    """``fn(rank, world_size, d, *args)`` on the session's group of ``world_size`` ranks, ``d`` a
    fresh directory (``temp_dir(prefix)``) shared by the ranks and removed after."""
    with temp_dir(prefix) as d:
        return run(fn, world_size, (d, *args), timeout=timeout, env=env)


# ---- one group, many cases, many tests -------------------------------------------------------------

_once: dict = {}


def once(key, start: Callable[[], Any], what: str) -> Any:
    """``start()``'s value, computed once per ``key`` for the session: a group of ranks that runs
    many cases, read by many tests. A failure is kept too, and fails every test that reads the key
    with "``what`` failed: ...", so that each of them reports it."""
    if key not in _once:
        try:
            _once[key] = (True, start())
        except BaseException as e:  # noqa: BLE001 - every test that reads the key reports it
            _once[key] = (False, e)
    ok, value = _once[key]
    if not ok:
        import pytest
        pytest.fail(f"{what} failed: {value}")
    return value


def assert_no_failures(per_rank: list, shown: int = 30) -> None:
    """Every rank returned a list of failure descriptions: all of them empty, else the first `shown`."""
    fails = [f for fs in per_rank for f in fs]
    assert not fails, f"{len(fails)} failures:\n" + "\n".join(fails[:shown])


def case_of(per_rank: list, name: str, what: str) -> list:
    """Every rank's result of case ``name`` out of a group's per-rank ``{case: result}`` dicts; a
    rank's ``{"error": traceback}`` fails the calling test (``what`` names the group)."""
    import pytest
    out = [r[name] for r in per_rank]
    for rank, r in enumerate(out):
        if "error" in r:
            pytest.fail(f"case {name!r}, rank {rank} ({what}):\n{r['error']}")
    return out


# ---- shared-memory segments ------------------------------------------------------------------------

def _ringcomm_segment(name: str) -> bool:
    """ringcomm's segments, and MPICH's (mpich_shm_*) that no process maps any more: a process
    that initialized MPI and ended without MPI_Finalize left it."""
    if name.startswith("ringcomm-"):
        return True
    return name.startswith("mpich_shm_") and not _mapped(f"/dev/shm/{name}")


def _mapped(path: str) -> bool:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/maps") as f:
                    if path in f.read():
                        return True
            except OSError:
                pass
    return False


def shm_segments(match: Callable[[str], bool] = _ringcomm_segment) -> set:
    """The entries of /dev/shm that `match` (by default ringcomm's segments)."""
    try:
        return {f for f in os.listdir("/dev/shm") if match(f)}
    except OSError:
        return set()


def lasting(new: set, match: Callable[[str], bool] = _ringcomm_segment, wait_s: float = 3.0) -> set:
    """Those of the /dev/shm entries `new` still there after up to ``wait_s``: segments are unlinked
    within milliseconds of creation, and another test run on the same machine may have one in
    flight, so only a segment that stays is a leak."""
    deadline = time.monotonic() + wait_s
    left = set(new)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left &= shm_segments(match)
    return left


# ---- torch.distributed ranks -----------------------------------------------------------------------

# A busy process beside a rank: `python -c BUSY_LOOP <parent pid>` spins on pure-Python arithmetic
# until its parent is gone (the tests that start it also kill it).
BUSY_LOOP = ("import os,sys\nparent=int(sys.argv[1])\nx=0\nwhile os.getppid()==parent:\n"
             "    for i in range(20000): x=(x*1103515245+i)&0xFFFFFFFF\n")

BACKENDS = ["gloo", "ringcomm"]

_PROBED: dict = {}


def backend_available(backend: str) -> tuple[bool, str]:
    """(True, "") if ``backend`` can be used for ``init_process_group``, else (False, reason).

    For ``"ringcomm"``: ``import ringcomm.torch`` must succeed, and (checked once per session, in
    this process) a one-rank process group on it must initialise, so that a half-landed backend
    skips with its error instead of failing every spawned rank.
    """
    if backend != "ringcomm":
        return True, ""
    if backend in _PROBED:
        return _PROBED[backend]
    try:
        import ringcomm.torch  # noqa: F401  (registers the "ringcomm" backend)
    except Exception as e:  # noqa: BLE001 - any import failure means "not available yet"
        result = (False, f"ringcomm torch backend not importable: {type(e).__name__}: {e}")
    else:
        result = _probe_one_rank(backend)
    _PROBED[backend] = result
    return result


def _probe_one_rank(backend: str) -> tuple[bool, str]:
    import torch.distributed as dist
    if dist.is_initialized():
        return True, ""
    try:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    except Exception as e:  # noqa: BLE001
        return False, (f"ringcomm torch backend imports but cannot create a process group: "
                       f"{type(e).__name__}: {e}")
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    return True, ""


def require_backend(backend: str) -> None:
    """Skip the calling pytest test if ``backend`` is not available."""
    ok, reason = backend_available(backend)
    if not ok:
        import pytest
        pytest.skip(reason)


def _torch_rank(rank: int, world_size: int, fn: Callable, backend: str, store_path: str,
                args: tuple, num_threads: int | None) -> Any:
    import torch
    import torch.distributed as dist
    if num_threads:
        torch.set_num_threads(num_threads)
    if backend == "ringcomm":
        import ringcomm.torch  # noqa: F401
    dist.init_process_group(backend, init_method="file://" + store_path, rank=rank,
                            world_size=world_size)
    try:
        return fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world_size: int, backend: str = "gloo",
              args: Sequence[Any] = (), timeout: float = 180, env: dict | None = None,
              num_threads: int | None = 1) -> list:
    """``run`` with ``torch.distributed`` initialised on ``backend`` (a fresh file store) in every
    rank: ``init_process_group`` -> ``fn(rank, world_size, *args)`` -> ``destroy_process_group``;
    the results in rank order (raises ``LaunchError``)."""
    ok, reason = backend_available(backend)
    if not ok:
        raise RuntimeError(reason)
    with temp_dir("ringcomm-torch-ranks-") as tmp:
        return run(_torch_rank, world_size,
                   (fn, backend, os.path.join(tmp, "store"), tuple(args), num_threads),
                   timeout=timeout, env=env)


def run_on_gloo_and_ringcomm(fn: Callable[..., Any], world_size: int,
                             args_for: Callable[[str], Sequence[Any]], timeout: float = 180) -> dict:
    """{backend: run_ranks(fn, ...)} for gloo and ringcomm, the same code side by side
    (``args_for(backend)`` gives fn's arguments); skips the calling test if either is missing."""
    observed = {}
    for backend in ("gloo", "ringcomm"):
        require_backend(backend)
        observed[backend] = run_ranks(fn, world_size, backend=backend, args=args_for(backend),
                                      timeout=timeout)
    return observed


# ---- ranks under a small /dev/shm ------------------------------------------------------------------

def run_with_dev_shm(size: str, module: str, function: str, world: int, store: str, tmp_path,
                     deadline_s: float, timeout_s: float) -> dict:
    """``module.function(rank, world)`` on ``world`` ranks with /dev/shm a tmpfs of ``size``: a
    private mount namespace (unshare -m) mounts it and this file, run as a script there, forks the
    ranks (``_forked_ranks``). Skips the calling test where unshare(1) or private mount namespaces
    are not available. {"status": [per rank "exit N" | "signal N" | "hung"], "results": [per rank
    JSON or None], "stderr": the script's stderr's tail}."""
    import pytest
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1)")
    mount = f"mount -t tmpfs -o size={size} tmpfs /dev/shm"
    probe = subprocess.run([unshare, "-m", "sh", "-c", mount], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip("private mount namespaces are not permitted here: " + probe.stderr.decode(errors="replace"))
    out_dir = tmp_path / "results"
    out_dir.mkdir()
    r = subprocess.run([unshare, "-m", "sh", "-c", mount + ' && exec "$0" "$@"', sys.executable,
                        os.path.abspath(__file__), TESTS_DIR, store, str(out_dir), str(world),
                        module, function, str(deadline_s)],
                       capture_output=True, text=True, timeout=timeout_s)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    got = json.loads(lines[-1][len("RESULT "):])
    got["stderr"] = r.stderr[-3000:]
    return got


def _forked_ranks(argv) -> None:
    """Run ``world`` ranks of a case as fork()ed children of this process and print one line
    ``RESULT {"status": [...], "results": [...]}``. fork(), not multiprocessing: its queues and
    semaphores live in /dev/shm, so in a full /dev/shm the harness itself would fail before any
    rank reports. Each rank writes its result (JSON) to a file under ``out_dir``, outside
    /dev/shm; the parent reports every child's exit status (a signal such as SIGBUS as such) and
    kills the ranks still running after ``deadline_s``.

        python ranks.py TESTS_DIR STORE OUT_DIR WORLD MODULE FUNCTION DEADLINE_S
    """
    import importlib
    tests_dir, store, out_dir, world, module, function, deadline_s = argv
    world, deadline_s = int(world), float(deadline_s)
    sys.path.insert(0, tests_dir)
    os.environ["RC_TEST_STORE"] = store
    case = getattr(importlib.import_module(module), function)
    pids = {}
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                res = case(rank, world)
                with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
                    json.dump(res, f)
                code = 0
            finally:
                os._exit(code)
        pids[pid] = rank
    status = {}
    t_end = time.monotonic() + deadline_s
    while pids and time.monotonic() < t_end:
        pid, st = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            time.sleep(0.05)
            continue
        rank = pids.pop(pid)
        status[rank] = ("signal %d" % os.WTERMSIG(st)) if os.WIFSIGNALED(st) else "exit %d" % os.WEXITSTATUS(st)
    for pid, rank in pids.items():
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        status[rank] = "hung"
    results = []
    for rank in range(world):
        path = os.path.join(out_dir, "rank%d.json" % rank)
        results.append(json.load(open(path)) if os.path.exists(path) else None)
    print("RESULT " + json.dumps({"status": [status[r] for r in range(world)], "results": results}))


if __name__ == "__main__":
    _forked_ranks(sys.argv[1:])
