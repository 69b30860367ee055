"""Run a function in several local processes: the launcher behind ``ringcomm.core.launch`` and the
test harness.

``spawn(fn, world_size, args)`` starts ``world_size`` processes (multiprocessing's ``spawn``
start method, or ``forkserver`` where ``RINGCOMM_START_METHOD`` says so), calls
``fn(rank, world_size, *args)`` in each, and returns the results in rank order. A failure is
re-raised in the parent as ``LaunchError`` carrying the rank and the child's traceback: the
failure raised first, once the other ranks' reports have arrived (``collect``); the remaining
ranks are then killed. A run that exceeds ``timeout`` seconds is killed and
reported with the stack of every rank still running (dumped by ``faulthandler`` on SIGUSR1), so a
hang names where each rank was stuck. No child outlives the call.
"""
from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Sequence

__all__ = ["spawn", "spawn_with_store", "launch", "LaunchError", "reap", "collect", "collect_stacks"]


class LaunchError(RuntimeError):
    """A spawned rank failed (or the run timed out). ``rank`` is the failing rank (None on timeout)."""

    def __init__(self, message: str, rank: int | None = None, remote_traceback: str = "",
                 exc_type: str = ""):
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback
        self.exc_type = exc_type


def _child(fn, rank, world_size, args, env, queue, stack_path, environ=None):
    # Dump every thread's stack to a per-rank file on SIGUSR1: the parent asks for it on timeout.
    stack_file = open(stack_path, "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    if environ is not None:
        # A forkserver's child: the launching process's environment, not the server's.
        os.environ.clear()
        os.environ.update(environ)
    os.environ.update({k: str(v) for k, v in (env or {}).items()})
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ.setdefault("LOCAL_RANK", str(rank))
    os.environ.setdefault("LOCAL_WORLD_SIZE", str(world_size))
    try:
        result = fn(rank, world_size, *args)
        try:
            payload = pickle.dumps(result)
        except Exception as e:  # noqa: BLE001 - report what could not be returned
            raise TypeError(f"rank {rank}: result of {fn!r} is not picklable: {e}") from e
        queue.put((rank, True, payload, "", "", 0.0))
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
        raised_at = time.time()  # before the traceback is formatted: the order of failures
        queue.put((rank, False, b"", traceback.format_exc(), type(e).__name__, raised_at))
    finally:
        stack_file.flush()
        _finalize_mpi()


def _finalize_mpi():
    # A multiprocessing child ends in os._exit, which skips the interpreter's finalization, where
    # mpi4py calls MPI_Finalize. A rank that initialized MPI without mpiexec (Lightning's cluster
    # detection imports mpi4py.MPI) would leave MPICH's /dev/shm/mpich_shm_<pid>_0 behind.
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()


def spawn(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (), *,
          timeout: float = 300.0, env: dict | None = None, may_die: Sequence[int] = ()) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` fresh processes; return results.

    Ranks listed in ``may_die`` may exit without reporting (fault-injection tests): their result
    is None instead of an error."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    from .config import read
    method = read().start_method
    ctx = mp.get_context(method)
    # A spawned child inherits this process's environment as it is now; a forkserver's child
    # inherits the server's (as it was when the server started), so it is handed over.
    environ = dict(os.environ) if method == "forkserver" else None
    queue = ctx.Queue()
    stack_dir = tempfile.mkdtemp(prefix="ringcomm-launch-")
    stack_paths = [os.path.join(stack_dir, f"rank{r}.stack") for r in range(world_size)]
    procs = []
    for r in range(world_size):
        p = ctx.Process(target=_child, args=(fn, r, world_size, tuple(args), env, queue,
                                             stack_paths[r], environ), daemon=True)
        p.start()
        procs.append(p)
    results = None
    try:
        results = collect(queue, procs, timeout, "ringcomm.core.launch",
                          lambda ranks: collect_stacks(procs, ranks, stack_paths), may_die)
    finally:
        reap(procs, grace=5.0 if results is not None else 0.0)
        queue.close()
        for path in stack_paths:
            try:
                os.unlink(path)
            except OSError:
                pass
        try:
            os.rmdir(stack_dir)
        except OSError:
            pass
    return results


# After the first failure, how long the other ranks' reports are awaited: a failure in one rank
# makes its peers fail too (a dead or aborted peer, a missing segment), and the one raised first
# is the cause to report. Meanwhile the failing ranks release their shared memory themselves.
SETTLE_S = 3.0


def collect(reports, procs, timeout: float, who: str, stacks: Callable[[list], str],
            may_die: Sequence[int] = ()) -> list:
    """The results, in rank order, that ``procs`` put on ``reports`` as ``(rank, ok, payload,
    traceback, exception type, raised at)``, each rank once. A failure raises LaunchError: after
    it the other ranks' reports are awaited for up to SETTLE_S seconds, and the failure raised
    first (a rank that exited without reporting counts as failing when that was seen) is the one
    raised, naming the ranks that failed after it. Past ``timeout`` seconds: LaunchError with
    ``stacks(running ranks)``. Ranks in ``may_die`` may exit without reporting (result None)."""
    n = len(procs)
    results: list = [None] * n
    done = [False] * n
    failures = []  # (raised at, rank, exception type, traceback)
    deadline = time.monotonic() + timeout
    settle_until = None
    while not all(done):
        now = time.monotonic()
        if settle_until is not None and now >= settle_until:
            break
        if now >= deadline:
            if failures:
                break
            running = [r for r in range(n) if not done[r]]
            raise LaunchError(f"{who}: timed out after {timeout:.0f} s; ranks still running: "
                              f"{running}\n{stacks(running)}")
        limit = min(deadline, settle_until or deadline) - now
        try:
            rank, ok, payload, tb, exc_type, raised_at = reports.get(timeout=min(limit, 0.5))
        except Exception:  # queue.Empty: look for ranks that exited without reporting
            for r, p in enumerate(procs):
                if done[r] or p.exitcode is None:
                    continue
                if r in may_die:
                    done[r] = True
                    continue
                try:  # its report may still be in flight
                    rank, ok, payload, tb, exc_type, raised_at = reports.get(timeout=1.0)
                    break
                except Exception:
                    done[r] = True
                    failures.append((time.time(), r, f"exited with code {p.exitcode}", ""))
            else:
                if failures and settle_until is None:
                    settle_until = time.monotonic() + SETTLE_S
                continue
        done[rank] = True
        if ok:
            results[rank] = pickle.loads(payload)
        else:
            failures.append((raised_at, rank, exc_type, tb))
            if settle_until is None:
                settle_until = time.monotonic() + SETTLE_S
    if not failures:
        return results
    failures.sort(key=lambda f: f[0])
    _, rank, exc_type, tb = failures[0]
    if tb:
        text = f"{who}: rank {rank} failed with {exc_type}:\n{tb}"
    else:
        text = f"{who}: rank {rank} {exc_type} without reporting a result"
    if len(failures) > 1:
        # A traceback's last line is "Type: message".
        later = "; ".join(f"rank {r} ({(b.strip().splitlines() or [t])[-1] if b else t})"
                          for _, r, t, b in failures[1:])
        text += f"\n{who}: after it, these ranks failed too: {later}"
    raise LaunchError(text, rank=rank, remote_traceback=tb, exc_type=exc_type if tb else "")


def collect_stacks(procs, ranks, stack_paths, wait_s: float = 0.5) -> str:
    """Every still-running rank's stack, dumped by faulthandler on SIGUSR1 into its
    ``stack_paths`` file (``_child`` registers it), awaited ``wait_s`` seconds."""
    for r in ranks:
        if procs[r].is_alive():
            try:
                os.kill(procs[r].pid, signal.SIGUSR1)
            except OSError:
                pass
    time.sleep(wait_s)
    parts = []
    for r in ranks:
        try:
            with open(stack_paths[r]) as f:
                text = f.read()
        except OSError:
            text = ""
        parts.append(f"--- rank {r} stack ---\n{text.strip() or '(no stack dumped)'}")
    return "\n".join(parts)


def spawn_with_store(fn: Callable[..., Any], world_size: int,
                     args: Callable[[str], Sequence[Any]], *, timeout: float = 300.0,
                     prefix: str = "ringcomm-store-", env: dict | None = None) -> list:
    """``spawn(fn, world_size, args(store_path), ...)`` where ``store_path`` names a file in a fresh
    directory (for a ``file://`` store the ranks rendezvous on); the directory is removed when the
    ranks are done, whatever happened."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        return spawn(fn, world_size, tuple(args(os.path.join(tmp, "store"))), timeout=timeout,
                     env=env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def reap(procs, grace: float) -> None:
    """Wait up to ``grace`` seconds for children to exit, then kill the rest and reap them all."""
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=10)


def check_store_dir(path: str) -> None:
    """Raise RingcommError unless `path` is a directory (not a symlink) owned by this user that
    others cannot write: the file store's keys name shared-memory segments, so a directory
    others can write lets them redirect every rank."""
    import stat
    from .errors import RingcommError
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise RingcommError(
            f"ringcomm: the file store directory {path} is "
            f"{'a directory' if stat.S_ISDIR(st.st_mode) else 'not a directory'} owned by uid {st.st_uid} "
            f"with mode {stat.S_IMODE(st.st_mode):04o}; it must be a directory owned by this user "
            f"(uid {os.geteuid()}) that no other user can write")


def _launch_entry(rank, world_size, fn, args, init_kwargs, store_dir=None):
    # Imported here so that the launcher itself needs no compiled extension.
    from . import api
    if store_dir is not None:
        check_store_dir(store_dir)
    with api.init(rank=rank, world_size=world_size, **init_kwargs) as comm:
        return fn(comm, *args)


def launch(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (), *,
           timeout: float = 300.0, env: dict | None = None, bind: str | None = None,
           **init_kwargs) -> list:
    """Run ``fn(comm, *args)`` on ``world_size`` local processes, each with a ringcomm
    communicator, and return the results in rank order. The first failure is re-raised as
    ``LaunchError`` with its rank and traceback; the other ranks are killed.

    ``bind``: "core" (each rank pinned to a contiguous share of the CPUs this process may use),
    "numa" (to a NUMA node's), "none", or None (as the RINGCOMM_BIND knob says; default none).
    Ranks already placed by the user are never moved (``ringcomm.core.cpus``); ``comm.cpu_plan`` says
    where each runs."""
    if bind is not None:
        if str(bind).lower() not in ("core", "numa", "none"):
            raise ValueError(f"ringcomm.core.launch: bind must be 'core', 'numa', 'none' or None, got {bind!r}")
        env = dict(env or {}, RINGCOMM_BIND=str(bind).lower())
    if "init_method" not in init_kwargs and "store" not in init_kwargs:
        # mkdtemp creates the directory atomically, owned by us with mode 0700; every rank checks
        # it is still so before it trusts the keys in it.
        path = tempfile.mkdtemp(prefix="ringcomm-rdzv-")
        init_kwargs["init_method"] = "file://" + path
    else:
        path = None
    try:
        return spawn(_launch_entry, world_size, (fn, tuple(args), init_kwargs, path), timeout=timeout,
                     env=env)
    finally:
        if path is not None:
            _remove_file_store(path)


def _remove_file_store(path: str) -> None:
    import shutil
    shutil.rmtree(path, ignore_errors=True)
    try:
        os.unlink(path)
    except OSError:
        pass
