"""Rank bodies of test_torch_backend_features.py: the c10d Backend features torch calls beyond the
collectives (sequence numbers, monitoredBarrier, setTimeout; on ringcomm also abort, getError,
shutdown), run the same way on "gloo" and "ringcomm" where gloo has the feature."""
from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

CPU = torch.device("cpu")


def _be(group=None):
    return (group or dist.group.WORLD)._get_backend(CPU)


def sequence_numbers(rank: int, world: int) -> dict:
    """The group's sequence number after each kind of call, as torch's desync tooling reads it."""
    be = _be()
    be._set_sequence_number_for_group()
    seen = [("start", be._get_sequence_number_for_group())]
    t = torch.ones(4)
    calls = [
        ("all_reduce", lambda: dist.all_reduce(t)),
        ("all_reduce_max", lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX)),
        ("all_reduce_async", lambda: dist.all_reduce(t, async_op=True).wait()),
        ("broadcast", lambda: dist.broadcast(t, 0)),
        ("barrier", lambda: dist.barrier()),
        ("all_gather", lambda: dist.all_gather([torch.zeros(4) for _ in range(world)], t)),
        ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(torch.zeros(4 * world), t)),
        ("reduce_scatter_tensor",
         lambda: dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(4 * world))),
        ("all_to_all_single",
         lambda: dist.all_to_all_single(torch.zeros(4 * world), torch.ones(4 * world))),
        ("reduce", lambda: dist.reduce(t, 0)),
        ("sendrecv", lambda: (dist.send(t, 1) if rank == 0 else dist.recv(t, 0))),
    ]
    for name, call in calls:
        call()
        seen.append((name, be._get_sequence_number_for_group()))
    g = dist.new_group(list(range(world)))
    gb = _be(g)
    fresh = gb._get_sequence_number_for_group()
    dist.all_reduce(torch.ones(2), group=g)
    seen.append(("new_group", (fresh, gb._get_sequence_number_for_group())))
    dist.destroy_process_group(g)
    return {"seq": seen}


def monitored(rank: int, world: int, timeout_s: float) -> dict:
    """torch's ProcessGroup.monitored_barrier (c10d monitoredBarrier) passing, and failing on
    rank 0 with the other ranks absent, with and without wait_all_ranks."""
    out = {}
    td = datetime.timedelta(seconds=timeout_s)
    dist.group.WORLD.monitored_barrier(datetime.timedelta(seconds=30))
    dist.group.WORLD.monitored_barrier(datetime.timedelta(seconds=30), wait_all_ranks=True)
    out["pass"] = True
    helper = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=60))
    for wait_all in (False, True):
        g = dist.new_group(list(range(world)))
        if rank == 0:
            t0 = time.monotonic()
            try:
                g.monitored_barrier(td, wait_all_ranks=wait_all)
                out[wait_all] = "no error"
            except RuntimeError as e:
                out[wait_all] = str(e).strip().splitlines()[0]
                out[(wait_all, "in_time")] = time.monotonic() - t0 < timeout_s + 3
        dist.barrier(group=helper)
    return out


def monitored_zero(rank: int, world: int) -> str | None:
    """monitoredBarrier with a zero timeout (not "unset") on rank 0 while the others stay away:
    rank 0 raises at once. The first line of its message on rank 0, None elsewhere."""
    helper = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=60))
    g = dist.new_group(list(range(world)))
    msg = None
    if rank == 0:
        try:
            g.monitored_barrier(datetime.timedelta(0))
            msg = "no error"
        except RuntimeError as e:
            msg = str(e).strip().splitlines()[0]
    dist.barrier(group=helper)
    return msg


def set_timeout(rank: int, world: int, timeout_s: float) -> dict:
    """ProcessGroup.set_timeout (c10d setTimeout) shortens a group made with a long timeout: a
    collective the other ranks never join fails after the new timeout."""
    out = {}
    helper = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=60))
    g = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=120))
    g.set_timeout(datetime.timedelta(seconds=timeout_s))
    if rank == 0:
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4), group=g)
            out["raised"] = False
        except RuntimeError:
            out["raised"] = True
        out["in_time"] = time.monotonic() - t0 < timeout_s + 3
    dist.barrier(group=helper)
    return out


def ringcomm_abort(rank: int, world: int) -> dict:
    """ringcomm only (gloo 2.13's abort does not reach peers): rank 0 aborts a group while rank 1
    waits in a collective on it; rank 1's pending and next calls raise within 1 s naming rank 0.
    getError reads SUCCESS before, REMOTE_ERROR on the peer, and a timed-out group reads
    TIMEOUT."""
    from torch._C._distributed_c10d import ErrorType
    out = {}
    helper = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=60))
    g = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=60))
    gb = _be(g)
    dist.all_reduce(torch.ones(4), group=g)
    out["error_before"] = gb.get_error() == ErrorType.SUCCESS
    dist.barrier(group=helper)
    if rank == 0:
        time.sleep(0.3)             # rank 1 is waiting in its all_reduce by now
        g.abort()                   # torch's ProcessGroup.abort -> the backend's c10d abort
    else:
        w = dist.all_reduce(torch.ones(4), group=g, async_op=True)
        t0 = time.monotonic()
        try:
            w.wait()
            out["pending"] = "no error"
        except RuntimeError as e:
            out["pending"] = str(e)
        out["pending_s"] = time.monotonic() - t0 - 0.3
        out["error_after"] = int(gb.get_error())
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4), group=g)
            out["next"] = "no error"
        except RuntimeError as e:
            out["next"] = str(e)
        out["next_s"] = time.monotonic() - t0
    dist.barrier(group=helper)
    dist.destroy_process_group(g)
    # a collective that runs past its timeout: getError reads TIMEOUT
    g = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=0.5))
    if rank == 0:
        try:
            dist.all_reduce(torch.ones(4), group=g)
        except RuntimeError:
            pass
        out["error_timeout"] = int(_be(g).get_error())
    dist.barrier(group=helper)
    # shutdown: the group's next call raises at once
    g2 = dist.new_group(list(range(world)))
    g2.shutdown()
    try:
        dist.all_reduce(torch.ones(4), group=g2)
        out["after_shutdown"] = "no error"
    except RuntimeError as e:
        out["after_shutdown"] = f"{type(e).__name__}: {e}"
    return out


def detail_debug(rank: int, world: int, timeout_s: float) -> dict:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL: torch wraps new groups' backends in its ProcessGroupWrapper,
    which reads the backend's sequence number and checks each collective first (torch's
    DistributedTest runs test_all_gather_object_subgroup and test_barrier_timeout_full_group so)."""
    out = {}
    helper = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=60))
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    try:
        g = dist.new_group(list(range(world)))
        objs = [None] * world
        dist.all_gather_object(objs, {"rank": rank, "x": [rank] * 3}, group=g)
        out["objects"] = objs
        t = torch.full((4,), float(rank))
        dist.all_reduce(t, group=g)
        out["all_reduce"] = t.tolist()
        gt = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=timeout_s))
        if rank == 0:
            try:
                dist.barrier(group=gt)
                out["barrier"] = "no error"
            except RuntimeError as e:
                out["barrier"] = "failed to pass monitoredBarrier" in str(e)
    finally:
        dist.set_debug_level(dist.DebugLevel.OFF)
    dist.barrier(group=helper)
    return out


def all_cases(rank: int, world: int, timeout_s: float, backend: str) -> dict:
    out = {"seq": sequence_numbers(rank, world),
           "detail": detail_debug(rank, world, timeout_s),
           "monitored": monitored(rank, world, timeout_s),
           "monitored_zero": monitored_zero(rank, world),
           "set_timeout": set_timeout(rank, world, timeout_s)}
    if backend == "ringcomm":
        out["abort"] = ringcomm_abort(rank, world)
    return out


def ringcomm_shrink(rank: int, world: int) -> dict:
    """torch's shrink_group on a ringcomm group (gloo 2.13 does not shrink): the last rank is
    excluded; the others get a group of world - 1 ranks that runs collectives. With SHRINK_ABORT,
    collectives pending on the old group (waiting on the excluded rank) raise at once."""
    from torch.distributed.distributed_c10d import SHRINK_ABORT
    out = {}
    last = world - 1
    helper = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=60))
    g = dist.new_group(list(range(world)))
    out["supports"] = bool(_be(g).supports_shrinking)
    dist.all_reduce(torch.ones(2), group=g)
    if rank != last:
        ng = dist.shrink_group([last], group=g)
        t = torch.full((3,), float(rank + 1))
        dist.all_reduce(t, group=ng)
        out["shrunk"] = (ng.rank(), ng.size(), t.tolist())
        dist.destroy_process_group(ng)
    else:
        dist.destroy_process_group(g)
    dist.barrier(group=helper)
    g2 = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=60))
    if rank != last:
        w = dist.all_reduce(torch.ones(2), group=g2, async_op=True)   # the last rank never joins
        time.sleep(0.2)
        t0 = time.monotonic()
        ng = dist.shrink_group([last], group=g2, shrink_flags=SHRINK_ABORT)
        try:
            w.wait()
            out["pending"] = "no error"
        except RuntimeError as e:
            out["pending"] = str(e)
        out["pending_s"] = time.monotonic() - t0
        t = torch.full((3,), float(rank + 1))
        dist.all_reduce(t, group=ng)
        out["after_abort"] = t.tolist()
        dist.destroy_process_group(ng)
    dist.barrier(group=helper)
    if rank == last:
        dist.destroy_process_group(g2)   # only now: its closing would fail the survivors' call
    return out
