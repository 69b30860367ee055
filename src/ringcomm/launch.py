"""Run a function in several local processes: the launcher behind ``ringcomm.launch`` and the
test harness.

``spawn(fn, world_size, args)`` starts ``world_size`` processes (multiprocessing's ``spawn``
start method, or ``forkserver`` where ``RINGCOMM_START_METHOD`` says so), calls
``fn(rank, world_size, *args)`` in each, and returns the results in rank order. The first
failure is re-raised in the parent as ``LaunchError`` carrying the rank and the child's
traceback; the remaining ranks are killed. A run that exceeds ``timeout`` seconds is killed and
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
import tempfile
import time
import traceback
from typing import Any, Callable, Sequence

__all__ = ["spawn", "spawn_with_store", "launch", "LaunchError", "reap"]


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
        queue.put((rank, True, payload, "", ""))
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
        queue.put((rank, False, b"", traceback.format_exc(), type(e).__name__))
    finally:
        stack_file.flush()


def spawn(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (), *,
          timeout: float = 300.0, env: dict | None = None, may_die: Sequence[int] = ()) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` fresh processes; return results.

    Ranks listed in ``may_die`` may exit without reporting (fault-injection tests): their result
    is None instead of an error."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    from .config import knob
    method = knob("RINGCOMM_START_METHOD")
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
    results: list = [None] * world_size
    done = [False] * world_size
    deadline = time.monotonic() + timeout
    error: LaunchError | None = None
    try:
        while not all(done):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                running = [r for r in range(world_size) if not done[r]]
                stacks = _collect_stacks(procs, running, stack_paths)
                error = LaunchError(
                    f"ringcomm.launch: timed out after {timeout:.0f} s; ranks still running: "
                    f"{running}\n{stacks}")
                break
            try:
                rank, ok, payload, tb, exc_type = queue.get(timeout=min(remaining, 0.5))
            except Exception:  # queue.Empty: check for ranks that died without reporting
                dead = [r for r, p in enumerate(procs) if not done[r] and p.exitcode is not None]
                for r in dead:
                    if r in may_die:
                        done[r] = True
                dead = [r for r in dead if r not in may_die]
                if dead:
                    # Give a report that may still be in flight a moment to arrive.
                    try:
                        rank, ok, payload, tb, exc_type = queue.get(timeout=1.0)
                    except Exception:
                        r = dead[0]
                        error = LaunchError(
                            f"ringcomm.launch: rank {r} exited with code {procs[r].exitcode} "
                            f"without reporting a result", rank=r)
                        break
                else:
                    continue
            done[rank] = True
            if ok:
                results[rank] = pickle.loads(payload)
            else:
                error = LaunchError(f"ringcomm.launch: rank {rank} failed with {exc_type}:\n{tb}",
                                    rank=rank, remote_traceback=tb, exc_type=exc_type)
                break
    finally:
        reap(procs, grace=0.0 if error else 5.0)
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
    if error is not None:
        raise error
    return results


def _collect_stacks(procs, ranks, stack_paths) -> str:
    for r in ranks:
        if procs[r].is_alive():
            try:
                os.kill(procs[r].pid, signal.SIGUSR1)
            except OSError:
                pass
    time.sleep(0.5)
    parts = []
    for r in ranks:
        try:
            with open(stack_paths[r]) as f:
                parts.append(f"--- rank {r} stack ---\n{f.read()}")
        except OSError:
            parts.append(f"--- rank {r}: no stack available ---")
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
    Ranks already placed by the user are never moved (``ringcomm.cpus``); ``comm.cpu_plan`` says
    where each runs."""
    if bind is not None:
        if str(bind).lower() not in ("core", "numa", "none"):
            raise ValueError(f"ringcomm.launch: bind must be 'core', 'numa', 'none' or None, got {bind!r}")
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
