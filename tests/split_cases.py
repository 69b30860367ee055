"""Rank bodies of test_torch_split.py: splitting a process group as torch 2.13 does it
(``dist.split_group``, DeviceMesh, the eager connect of ``init_process_group(device_id=...)``),
run the same on "gloo" and "ringcomm" at world 4, recording what a caller can observe.

torch takes its split paths only where an accelerator is present (``split_group`` asks
``torch.accelerator.is_available()`` and reads the parent's backend for
``torch.accelerator.current_accelerator()``; DeviceMesh splits only when the default group is
bound to a device, as ``init_process_group(device_id=...)`` binds it). This CPU-only torch has no
accelerator, so ``accelerator_gate`` lets torch take the CPU for one while a case runs and binds
the default group to ``cpu:0``: torch then makes exactly the calls it makes on a GPU host, where a
backend registered for "cpu" and "cuda" (gloo, ringcomm) is the same object for both devices.
"""
from __future__ import annotations

import contextlib
import datetime
import time

import torch
import torch.distributed as dist

CPU0 = torch.device("cpu", 0)


@contextlib.contextmanager
def accelerator_gate(default_pg):
    acc = torch.accelerator
    saved = acc.is_available, acc.current_accelerator
    acc.is_available = lambda: True
    acc.current_accelerator = lambda check_available=False: torch.device("cpu")
    default_pg.bound_device_id = CPU0
    try:
        yield
    finally:
        acc.is_available, acc.current_accelerator = saved
        default_pg.bound_device_id = None


def _use(group, rank: int) -> dict:
    """The collectives a caller runs on a new group, and what they give."""
    if group is None:
        return {"member": False}
    n = dist.get_world_size(group)
    x = torch.full((3,), float(rank + 1))
    dist.all_reduce(x, group=group)
    outs = [torch.zeros(1) for _ in range(n)]
    dist.all_gather(outs, torch.tensor([float(rank)]), group=group)
    y = torch.tensor([float(rank)])
    root = dist.get_global_rank(group, 0)
    dist.broadcast(y, src=root, group=group)
    w = dist.all_reduce(torch.ones(2), async_op=True, group=group)
    fut_value = w.get_future().wait()[0].tolist()
    return {"member": True, "rank": dist.get_rank(group), "size": n,
            "ranks": dist.get_process_group_ranks(group),
            "all_reduce": x.tolist(), "all_gather": [o.item() for o in outs],
            "broadcast": y.item(), "async_future": fut_value,
            "backend": dist.get_backend(group)}


def _split(backend: str, split_ranks, parent=None, timeout=None):
    """``dist.split_group(parent, split_ranks)``: this rank's new group, or None. gloo 2.13
    cannot split on CPU (its options cannot be copied, and given options its split groups do
    not connect), so for gloo this makes the groups torch documents split_group to make (the
    ranks of each inner list, numbered in sorted order, bound to the parent's device) with
    new_group, on every rank, and compares with that."""
    if backend != "gloo":
        return dist.split_group(parent_pg=parent, split_ranks=split_ranks, timeout=timeout)
    parent = parent or dist.group.WORLD
    world = dist.group.WORLD
    ranks = next((r for r in split_ranks if dist.get_rank(parent) in r), None)
    if ranks is None:
        return None
    bound, world.bound_device_id = world.bound_device_id, None   # new_group wants no cpu:0
    try:
        mine = dist.new_group([dist.get_global_rank(parent, r) for r in sorted(ranks)],
                              timeout=timeout, use_local_synchronization=True)
    finally:
        world.bound_device_id = bound
    mine.bound_device_id = bound
    return mine


def _mesh(mesh) -> dict:
    out = {}
    for dim in mesh.mesh_dim_names:
        g = mesh.get_group(dim)
        x = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(x, group=g)
        out[dim] = (dist.get_process_group_ranks(g), x.item())
    return out


def all_cases(rank: int, world: int, backend: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    out: dict = {}
    default = dist.group.WORLD
    be = default._get_backend(torch.device("cpu"))
    out["supports_splitting"] = be.supports_splitting
    # No accelerator: torch's split_group refuses before it reaches any backend.
    try:
        dist.split_group(split_ranks=[[0, 1], [2, 3]])
        out["no_accelerator"] = None
    except RuntimeError as e:
        out["no_accelerator"] = str(e)
    with accelerator_gate(default):
        # what _new_process_group_helper does for init_process_group(device_id=...)
        if be.supports_splitting:
            be.eager_connect_single_device(CPU0)
        out["eager_connect"] = True
        # split_group copies the parent backend's options unless given some
        try:
            dist.split_group(split_ranks=[[0, 2], [1, 3]])
            out["default_options"] = "split"
        except TypeError as e:
            out["default_options"] = str(e)
        pairs = _split(backend, [[0, 1], [2, 3]], timeout=datetime.timedelta(seconds=60))
        out["split_pairs"] = _use(pairs, rank)
        out["split_pairs_bound"] = str(pairs.bound_device_id)
        three = _split(backend, [[0, 1, 2]])       # rank 3 is in no split
        out["split_three"] = _use(three, rank)
        # a split of a split: every rank of `pairs` alone
        singles = _split(backend, [[0], [1]], parent=pairs)
        out["split_of_split"] = _use(singles, rank)
        # the parent is unaffected by its children
        x = torch.full((2,), float(rank))
        dist.all_reduce(x)
        out["parent_after"] = x.tolist()
        # DeviceMesh on a bound default group: one split_group call per mesh dimension
        try:
            mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("rep", "shard"))
            out["mesh_split"] = _mesh(mesh)
        except TypeError as e:   # the options copy above, which DeviceMesh makes too
            out["mesh_split"] = str(e)
    # DeviceMesh on an unbound default group: new_group per sub-group
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("rep", "shard"))
    out["mesh_new_group"] = _mesh(mesh)
    if backend == "ringcomm":
        out["ringcomm"] = ringcomm_only(rank, world)
    return out


def ringcomm_only(rank: int, world: int) -> dict:
    """What gloo does not offer to compare with: the split backend is a ringcomm communicator of
    its own (independent calls, abort and shutdown that leave the parent working), torch's
    split on every device type the backend serves gives one backend, and errors name the
    cause. torch's documented contract: ``abort()`` makes the group's pending and later calls
    fail on every rank; ``shutdown()`` releases the group; the parent is another group."""
    import ringcomm
    out: dict = {}
    default = dist.group.WORLD
    be = default._get_backend(torch.device("cpu"))
    with accelerator_gate(default):
        pairs = dist.split_group(split_ranks=[[0, 3], [1, 2]],
                                 timeout=datetime.timedelta(seconds=60))
    child = pairs._get_backend(torch.device("cpu"))
    out["child_type"] = type(child).__name__
    out["child_comm"] = (child.communicator.rank, child.communicator.world_size,
                         child.communicator is not be.communicator)
    out["cuda_is_cpu_backend"] = pairs._get_backend(torch.device("cuda")) is child
    # collectives on the child interleaved with the parent's, async, issued in opposite orders
    # on the two halves: they are separate communicators, so neither waits for the other
    a, b = torch.full((4,), float(rank)), torch.full((4,), float(rank))
    if rank % 2 == 0:
        wa = dist.all_reduce(a, async_op=True, group=pairs)
        wb = dist.all_reduce(b, async_op=True)
    else:
        wb = dist.all_reduce(b, async_op=True)
        wa = dist.all_reduce(a, async_op=True, group=pairs)
    wa.wait()
    wb.wait()
    out["interleaved"] = (a.tolist(), b.tolist())
    # what torch calls on a rank outside a new_group while the default group is bound to a
    # device (unreachable on a CPU-only torch: new_group then wants an accelerator device_id)
    out["nocolor"] = be.perform_nocolor_split(CPU0)
    # merging is not supported: torch's c10d::Backend says so
    try:
        default.merge_remote_group(dist.PrefixStore("merge/", default.get_group_store()), 1,
                                   datetime.timedelta(seconds=5))
        out["merge"] = None
    except RuntimeError as e:
        out["merge"] = str(e)
    # errors: ranks outside the group, a split of a shut-down group
    try:
        be.split(default.get_group_store(), [0, world + 3], None)
        out["bad_ranks"] = None
    except ValueError as e:
        out["bad_ranks"] = str(e)
    # abort on the child: the peer's pending call on the child raises within 1 s, naming the
    # aborting rank; the parent keeps working
    if rank in (0, 1):
        dist.barrier()                       # the peer (3 or 2) is now waiting on the child
        time.sleep(0.2)
        pairs.abort()                        # torch's ProcessGroup.abort: every backend of it
        out["abort"] = "aborted"
    else:
        w = dist.all_reduce(torch.ones(2), async_op=True, group=pairs)
        dist.barrier()
        t0 = time.monotonic()
        try:
            w.wait()
            out["abort"] = None
        except Exception as e:  # noqa: BLE001
            out["abort"] = (type(e).__name__, str(e), time.monotonic() - t0)
    x = torch.ones(2)
    dist.all_reduce(x)
    out["parent_after_abort"] = x.tolist()
    # shutdown of a second child: its calls raise ClosedError; the parent keeps working
    with accelerator_gate(default):
        second = dist.split_group(split_ranks=[[0, 1, 2, 3]])
    out["cuda_is_cpu_backend_2"] = (second._get_backend(torch.device("cuda"))
                                    is second._get_backend(torch.device("cpu")))
    sb = second._get_backend(torch.device("cpu"))
    y = torch.ones(1)
    dist.all_reduce(y, group=second)
    second.shutdown()                        # torch's ProcessGroup.shutdown
    try:
        dist.all_reduce(torch.ones(1), group=second)
        out["after_shutdown"] = None
    except Exception as e:  # noqa: BLE001
        out["after_shutdown"] = f"{type(e).__name__}: {e}"
    try:
        sb.split(default.get_group_store(), [0, 1], None)
        out["split_after_shutdown"] = None
    except Exception as e:  # noqa: BLE001
        out["split_after_shutdown"] = f"{type(e).__name__}: {e}"
    try:
        be.eager_connect_single_device(torch.device("cuda", 0))
        out["eager_cuda"] = "connected"
    except Exception as e:  # noqa: BLE001
        out["eager_cuda"] = f"{type(e).__name__}: {e}"
    z = torch.ones(1)
    dist.all_reduce(z)
    out["parent_last"] = z.item()
    out["isinstance_ringcomm_error"] = issubclass(ringcomm.ClosedError, ringcomm.RingcommError)
    return out
