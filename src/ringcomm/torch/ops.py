"""``ringcomm.torch.all_reduce_``: a synchronous all_reduce of one CPU tensor for latency-bound
callers (tensor-parallel inference, a custom trainer's small reductions), and the same call as one
torch dispatcher op, ``torch.ops.ringcomm.all_reduce_(tensor, group_name, op)``.

Layer 0, a back end (part of ``ringcomm.torch``).

Both skip ``dist.all_reduce``'s Python, the ProcessGroup's dispatch and the Work, and offer the
call straight to the communicator's synchronous entry (``bindings/torch/trampoline.cpp``); what
the entry declines runs as the group's own synchronous allreduce. ``all_reduce_`` also skips the
dispatcher: on a group whose CPU backend is ringcomm's c10d backend it calls the backend's direct
call (``_direct_all_reduce()``, one C call, learnt on the group's first call and kept in
``hooks.direct_calls`` until the backend shuts down), and takes the op only for what that
declines. The result, the errors and the group's sequence number are those of
``dist.all_reduce(tensor, op, group)``. Ops: ``"sum"``, ``"product"``, ``"min"``, ``"max"``,
``"band"``, ``"bor"``, ``"bxor"`` or the ``dist.ReduceOp`` of one (``dist.all_reduce`` takes AVG
and PREMUL_SUM). The trampoline
extension registers the op when it loads (a ringcomm group's creation loads it, and so does the
first call here); code that is traced (``torch.compile``) calls the op with ``group.group_name``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .hooks import direct_calls

__all__ = ["all_reduce_"]

_compiling = torch.compiler.is_compiling
_op = None      # torch.ops.ringcomm.all_reduce_, once the extension that registers it is loaded
_codes = None   # the entry's reduce-op code by name (the extension's REDUCE_OPS) and by ReduceOp


def all_reduce_(tensor: torch.Tensor, group=None, op="sum") -> torch.Tensor:
    """All-reduce ``tensor`` (a CPU tensor) in place over ``group`` (default: the default group)
    and return it; synchronous. ``op``: a name (``"sum"``, ...) or the ``dist.ReduceOp`` of one."""
    if _compiling():   # traced: the op (the extension is loaded by the group's creation)
        if group is None:
            group = dist.distributed_c10d._get_default_group()
        torch.ops.ringcomm.all_reduce_(tensor, group.group_name, _op_name(op))
        return tensor
    call = direct_calls.get(group)
    if call is not None:
        try:
            code = _codes.get(op)
        except TypeError:   # not hashable: the op's general path explains
            code = None
        # The entry ran it, or it raised; otherwise (the fast path off, a tensor or an op the entry
        # does not take) the op's general path, which explains what it refuses.
        if code is not None and call(tensor, code):
            return tensor
    return _general(tensor, group, op)


def _general(tensor: torch.Tensor, group, op) -> torch.Tensor:
    """The op, and the group's direct call learnt for the next calls."""
    global _op, _codes
    if _op is None:
        from .extension import load
        codes = dict(load().REDUCE_OPS)
        _codes = {**codes, **{getattr(dist.ReduceOp, name.upper()): code for name, code in codes.items()}}
        _op = torch.ops.ringcomm.all_reduce_.default
    if not isinstance(tensor, torch.Tensor):   # as dist.all_reduce
        raise TypeError(f"ringcomm.torch.all_reduce_: expected a torch.Tensor, got {type(tensor).__name__}")
    key = group
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    elif group == dist.GroupMember.NON_GROUP_MEMBER:
        return tensor   # a rank outside the group takes no part, as in dist.all_reduce
    try:
        backend = group._get_backend(torch.device("cpu"))
    except (RuntimeError, ValueError):
        backend = None
    if hasattr(backend, "_direct_all_reduce"):   # ringcomm's c10d backend
        call = backend._direct_all_reduce()
        if not getattr(backend, "_closed", True):   # open (shut down, its Python half is gone)
            direct_calls[key] = call   # its shutdown() forgets it
        try:
            code = _codes.get(op)
        except TypeError:
            code = None
        # After shutdown this raises ClosedError, as the group's own allreduce does.
        if code is not None and call(tensor, code):
            return tensor
    _op(tensor, group.group_name, _op_name(op))
    return tensor


def _op_name(op):
    """The op's name for a ``dist.ReduceOp`` (the op refuses the names it does not take)."""
    return op.name.lower() if isinstance(op, dist.ReduceOp.RedOpType) else op
