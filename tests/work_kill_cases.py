"""Rank bodies of test_torch_work_contract.py's killed-peer part: torch's Work contract when the
peer process is killed (SIGKILL) before or during a call, the same code on "gloo" and
"ringcomm".

Spawned *driver* processes (torch and the backends imported once each) share the cases and run
them side by side, each driver its cases in turn. Per case it forks two processes that form a fresh world-2 group on a file store of their own: the
*survivor* (rank 0, the root of rooted calls) issues the call and records what a caller can observe;
the *victim* (rank 1) joins the group and then only sleeps, so the survivor's call waits on it,
until the driver kills it:

* ``before``: the survivor asks, and the driver kills the victim and reaps it before the call;
* ``during``: the survivor says it is about to call, and the driver kills the victim
  ``DURING_DELAY_S`` later, while the call waits on it.

Forks of the driver cost milliseconds where a spawned process importing torch costs seconds. The
survivor writes its observations to a file and leaves with ``os._exit`` (a group whose peer died
has nothing to tear down that a later case could trip over; ringcomm unlinks its shared memory
once every rank has mapped it, so a killed rank leaves none behind).
"""
from __future__ import annotations

import datetime
import os
import pickle
import select
import shutil
import signal
import tempfile
import threading
import time

import torch
import torch.distributed as dist

from work_contract_cases import _NO_FUTURE_IN_GLOO, _future_wait_obs, _ops

DURING_DELAY_S = 0.3
OPS = ["allreduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather",
       "scatter", "barrier", "send", "recv"]
MODES = ["sync", "async"]
WHENS = ["before", "during"]
# works gloo 2.13 gives no future ("Work::getFuture not implemented"): only the work's own
# methods are observed for these
NO_FUTURE = set(_NO_FUTURE_IN_GLOO) | {"send", "recv"}


def _issue(op: str, async_op: bool):
    """Issue `op` on rank 0 of the default world-2 group."""
    if op == "send":
        x = torch.ones(4)
        return dist.isend(x, 1) if async_op else dist.send(x, 1)
    if op == "recv":
        x = torch.zeros(4)
        return dist.irecv(x, 1) if async_op else dist.recv(x, 1)
    return _ops(0, 2)[op](async_op)[0]


def _err(e: BaseException) -> dict:
    return {"runtime_error": isinstance(e, RuntimeError)}


def _observe(op: str, mode: str, t_kill) -> dict:
    """Issue the call (the victim is dead, or dies while the call waits) and record what the
    caller can observe. ``t_kill()``: when the victim was, or will be, killed."""
    obs: dict = {}
    t0 = time.monotonic()
    if mode == "sync":
        try:
            _issue(op, False)
            obs["raised"] = False
        except Exception as e:  # noqa: BLE001
            obs.update(raised=True, **_err(e))
        obs["seconds"] = time.monotonic() - max(t0, t_kill())
        return obs
    try:
        w = _issue(op, True)
    except Exception as e:  # noqa: BLE001
        obs.update(issue_raised=True, **_err(e))
        obs["seconds"] = time.monotonic() - max(t0, t_kill())
        return obs
    obs["issue_raised"] = False
    fut = chained = None
    seen: list = []
    if op not in NO_FUTURE:
        fut = w.get_future()

        def callback(f):
            try:
                f.value()
                seen.append("value")
            except Exception:  # noqa: BLE001
                seen.append("error")
                raise
        chained = fut.then(callback)
    try:
        w.wait()
        obs["raised"] = False
        msg = None
    except Exception as e:  # noqa: BLE001
        obs.update(raised=True, **_err(e))
        msg = str(e)
    obs["seconds"] = time.monotonic() - max(t0, t_kill())
    obs["is_completed"] = w.is_completed()
    obs["is_success"] = w.is_success()
    obs["exception_set"] = w.exception() is not None
    if fut is None:
        return obs
    obs["fut_done_at_raise"] = fut.done()
    obs.update(_future_wait_obs(fut, msg, "fut_raised", "fut_same_message"))
    try:
        chained.wait()
        obs["chained_raised"] = False
    except Exception:  # noqa: BLE001
        obs["chained_raised"] = True
    obs["callback_saw"] = list(seen)
    late = w.get_future()
    obs["late_fut_done"] = late.done()
    obs.update(_future_wait_obs(late, msg, "late_fut_raised", "late_same_message"))
    return obs


def _child(role: int, backend: str, store_path: str, timeout_s: float, case, ctl_w: int,
           ctl_r: int, out_path: str) -> None:
    """A forked survivor (role 0) or victim (role 1); never returns."""
    code = 0
    try:
        op, mode, when = case
        dist.init_process_group(backend, store=dist.FileStore(store_path, 2), rank=role,
                                world_size=2, timeout=datetime.timedelta(seconds=timeout_s))
        if role == 1:
            os.write(ctl_w, b"r")   # joined (its shared memory unlinked): the driver may kill it
            while True:
                time.sleep(60)
        kill_at = [float("inf")]
        if when == "before":
            os.write(ctl_w, b"k")
            if os.read(ctl_r, 1) != b"d":
                raise RuntimeError("the driver did not kill the victim")
            kill_at[0] = time.monotonic()
        else:
            os.write(ctl_w, b"i")
            kill_at[0] = time.monotonic() + DURING_DELAY_S
        obs = _observe(op, mode, lambda: kill_at[0])
        if op == "send" and not (obs.get("raised") or obs.get("issue_raised")):
            # a send may complete without its receiver (buffered): the next call that needs
            # the dead peer must raise
            t0 = time.monotonic()
            try:
                dist.barrier()
                obs["next_call_raised"] = False
            except Exception as e:  # noqa: BLE001
                obs.update(next_call_raised=True, next_call_runtime_error=isinstance(
                    e, RuntimeError))
            obs["next_call_seconds"] = time.monotonic() - max(t0, kill_at[0])
        with open(out_path, "wb") as f:
            pickle.dump(obs, f)
    except BaseException as e:  # noqa: BLE001
        with open(out_path, "wb") as f:
            pickle.dump({"case_error": f"{type(e).__name__}: {e}"}, f)
        code = 1
    finally:
        os._exit(code)


def _run_case(backend: str, case, timeout_s: float, tmp: str, deadline_s: float) -> dict:
    store_path = os.path.join(tmp, "store")
    out_path = os.path.join(tmp, "out")
    for p in (store_path, out_path):
        if os.path.exists(p):
            os.unlink(p)
    s2d_r, s2d_w = os.pipe()
    d2s_r, d2s_w = os.pipe()
    v2d_r, v2d_w = os.pipe()
    pids = []
    try:
        for role in (1, 0):
            pid = os.fork()
            if pid == 0:
                for fd in (s2d_r, d2s_w, v2d_r):
                    os.close(fd)
                _child(role, backend, store_path, timeout_s, case,
                       v2d_w if role else s2d_w, d2s_r, out_path)
            pids.append(pid)
        victim, survivor = pids
        for fd in (s2d_w, d2s_r, v2d_w):
            os.close(fd)
        s2d_w = d2s_r = v2d_w = -1
        end = time.monotonic() + deadline_s
        ready, _, _ = select.select([v2d_r], [], [], deadline_s)
        if not ready or os.read(v2d_r, 1) != b"r":
            return {"case_error": "the victim did not join"}
        while True:
            ready, _, _ = select.select([s2d_r], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                return {"case_error": f"the survivor ran past {deadline_s} s"}
            b = os.read(s2d_r, 1)
            if b == b"":            # the survivor has exited
                break
            if b == b"i":
                time.sleep(DURING_DELAY_S)
            os.kill(victim, signal.SIGKILL)
            os.waitpid(victim, 0)
            pids.remove(victim)
            if b == b"k":
                os.write(d2s_w, b"d")
        os.waitpid(survivor, 0)
        pids.remove(survivor)
        with open(out_path, "rb") as f:
            return pickle.load(f)
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
        for fd in (s2d_r, s2d_w, d2s_r, d2s_w, v2d_r, v2d_w):
            if fd >= 0:
                os.close(fd)


def kill_cases(rank: int, world: int, backends, timeout_s: float, deadline_s: float) -> dict:
    """A driver: its share of the (backend, op, mode, when) cases, every ``world``-th from its
    rank's, so the drivers' cases run side by side (a case mostly waits for the kill)."""
    mine = [(b, op, mode, when) for b in backends for op in OPS for mode in MODES
            for when in WHENS][rank::world]
    import ringcomm.torch  # noqa: F401 - registers the backend
    if any(c[0] == "ringcomm" for c in mine):
        from ringcomm.torch.backend import backend_class
        backend_class()     # load the c10d trampoline once, before any fork
    torch.set_num_threads(1)
    assert threading.active_count() == 1, "the driver must fork from a single thread"
    out = {}
    tmp = tempfile.mkdtemp(prefix="ringcomm-kill-")
    try:
        for backend, op, mode, when in mine:
            out[(backend, op, mode, when)] = _run_case(backend, (op, mode, when), timeout_s, tmp,
                                                      deadline_s)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
