"""gloo's monitored barrier on ringcomm groups: the c10d ``monitoredBarrier`` of the backend
(``Collectives.monitored_barrier``, reached from torch's ``ProcessGroup.monitored_barrier`` through
the trampoline's ``monitoredBarrier``) runs ``run_monitored_barrier`` below, the one
implementation. ``monitored_barrier(group, timeout, wait_all_ranks)`` is the same call by way of
torch's ProcessGroup, for code that would call ``dist.monitored_barrier``: torch 2.13's refuses
every backend but gloo before any backend is called (torch/distributed/distributed_c10d.py, in
``monitored_barrier``: ``if get_backend(group) != Backend.GLOO: raise ValueError(...)``).

Protocol (gloo's): every rank but 0 sends a message to group rank 0 and waits for rank 0's
reply; rank 0 receives from ranks 1..n-1 in rank order, each wait bounded by what is left of the
timeout, and replies to all once every rank arrived. A rank that did not arrive in time makes
rank 0 raise naming it (the first such rank in rank order, or with ``wait_all_ranks=True`` every
such rank); the other ranks then time out waiting for the reply. Without ``wait_all_ranks``,
rank 0 that finds the time used up before it looks at a rank whose message has not come raises
"Rank 0 timed out in monitoredBarrier" instead (a zero timeout does so at once). The timeout is
torch's ``BarrierOptions.timeout``: negative (unset) or None means the group's, zero means zero.
Messages are gloo's, word for word. The messages carry a tag no
torch call can carry (torch's tags are 32-bit), so they never match a user's send or recv.
"""
from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

import ringcomm

from .work import timeout_seconds

__all__ = ["monitored_barrier", "run_monitored_barrier", "MONITORED_BARRIER_TAG"]

MONITORED_BARRIER_TAG = 1 << 40


def _is_ringcomm(obj) -> bool:
    """Whether ``obj`` is a ringcomm backend (``Collectives`` sets the marker; this module is
    below it, so it does not import it)."""
    return getattr(type(obj), "_ringcomm_backend", False) is True


def monitored_barrier(group=None, timeout=None, wait_all_ranks: bool = False) -> None:
    """A barrier that names the ranks that did not reach it within ``timeout`` (a timedelta or
    seconds; default the group's timeout): ``group.monitored_barrier(timeout, wait_all_ranks)``
    on torch's ProcessGroup, which reaches the ringcomm backend's c10d ``monitoredBarrier``.
    Raises ``ringcomm.TimeoutError`` (a RuntimeError) on group rank 0 with gloo's message,
    ``"[Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms"`` (``"Ranks 1, 2 ..."`` with
    ``wait_all_ranks=True``); the other ranks raise ``ringcomm.TimeoutError`` when rank 0 does
    not release them in time."""
    pg = group if group is not None else dist.group.WORLD
    if not _is_ringcomm(pg):
        try:
            be = pg._get_backend(torch.device("cpu"))
        except Exception as e:  # noqa: BLE001
            raise ValueError("ringcomm.torch.monitored_barrier: the group has no CPU backend "
                             f"({e})") from e
        if not _is_ringcomm(be):
            raise ValueError("ringcomm.torch.monitored_barrier: the group's CPU backend is "
                             f"{type(be).__name__}, not ringcomm (use dist.monitored_barrier for "
                             "gloo)")
    if timeout is None:
        pg.monitored_barrier(wait_all_ranks=wait_all_ranks)
    else:
        if not isinstance(timeout, datetime.timedelta):
            timeout = datetime.timedelta(seconds=float(timeout))
        pg.monitored_barrier(timeout=timeout, wait_all_ranks=wait_all_ranks)


def run_monitored_barrier(be, timeout, wait_all_ranks: bool) -> None:
    """The protocol above on ringcomm group ``be`` (a ``Collectives``)."""
    comm, rank, size = be._comm, be._rank, be._size
    zero = timeout is not None and (timeout.total_seconds() if isinstance(
        timeout, datetime.timedelta) else float(timeout)) == 0
    limit = 0.0 if zero else timeout_seconds(timeout, be._timeout_s)
    ms = int(round(limit * 1000))
    if size == 1:
        return
    deadline = time.monotonic() + limit
    token = torch.zeros(1, dtype=torch.uint8)
    tag = MONITORED_BARRIER_TAG
    if rank != 0:
        reply = torch.zeros(1, dtype=torch.uint8)
        r = comm.recv(reply, 0, async_op=True, tag=tag)
        s = comm.send(token, 0, async_op=True, tag=tag)
        try:
            s.wait(max(limit, 0.0))
            r.wait(max(deadline - time.monotonic(), 0.0))
        except ringcomm.TimeoutError as e:
            raise ringcomm.TimeoutError(
                f"Rank {rank} successfully reached monitoredBarrier, but received errors while "
                f"waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank."
            ) from e
        return
    bufs = {p: torch.zeros(1, dtype=torch.uint8) for p in range(1, size)}
    recvs = {p: comm.recv(bufs[p], p, async_op=True, tag=tag) for p in range(1, size)}
    missing, processed = [], []
    for p in range(1, size):
        if (not wait_all_ranks and time.monotonic() >= deadline
                and not recvs[p].is_completed()):
            info = (f"Successfully processed ranks: {', '.join(map(str, processed))}"
                    if processed else "No ranks successfully processed in monitoredBarrier.")
            raise ringcomm.TimeoutError(
                f"Rank {rank} timed out in monitoredBarrier after {ms} ms.\n{info}")
        try:
            recvs[p].wait(max(deadline - time.monotonic(), 0.0))
        except ringcomm.TimeoutError:
            if recvs[p].is_completed():
                raise
            missing.append(p)
            if not wait_all_ranks:
                raise ringcomm.TimeoutError(
                    f"[Rank 0]: Rank {p} failed to pass monitoredBarrier in {ms} ms") from None
            continue
        processed.append(p)
    if missing:
        raise ringcomm.TimeoutError(
            f"[Rank 0]: Ranks {', '.join(map(str, missing))} failed to pass monitoredBarrier in "
            f"{ms} ms")
    for w in [comm.send(token, p, async_op=True, tag=tag) for p in range(1, size)]:
        w.wait()
