"""``ringcomm.torch.all_reduce_(tensor, group=None, op="sum")``: a synchronous, in-place
all_reduce for latency-bound callers (tensor-parallel inference, a custom trainer's small
reductions), and the same call on CPU tensors as one torch dispatcher op,
``torch.ops.ringcomm.all_reduce_(tensor, group_name, op)``.

Layer 0, a back end (part of ``ringcomm.torch``).

On a group whose CPU backend is ringcomm's c10d backend, a tensor goes to the backend's direct
call (``_direct_all_reduce()``: one C call into the trampoline's offer point, without
``dist.all_reduce``'s Python, the ProcessGroup's dispatch, the dispatcher or a Work), learnt on
the group's first call and kept in ``hooks.direct_calls`` until the backend shuts down. The offer
point answers: the call ran there (the synchronous entry took it, or declined it and the
backend's Python half ran it, never offered again), or it was not offered (another device, a
complex tensor, the offer point off while an issue hook or coalescing needs the Python half), and
then ``dist.all_reduce`` runs it. Every other backend's group runs ``dist.all_reduce`` itself, so
the function serves any group (a gloo process never builds ringcomm's torch extension for it).
The result, the errors and the group's sequence number are those of
``dist.all_reduce(tensor, op, group)``. Ops: the lower-case names of ``RC_TORCH_OPS``
(``csrc/include/ringcomm/abi.h``: ``"sum"``, ``"product"``, ``"min"``, ``"max"``, ``"band"``,
``"bor"``, ``"bxor"``) or the ``dist.ReduceOp`` of one: the ops the trampoline offers to the
entry (``dist.all_reduce`` also takes AVG and PREMUL_SUM, which the backend's Python half
composes).

The op (``bindings/torch/trampoline.cpp``; registered when the extension loads, which a ringcomm
group's creation does) takes the same offer point, or runs the group's own synchronous
allreduce; it returns nothing and has a Meta kernel, so code that ``torch.compile`` traces calls
it (this function does so under compilation for CPU tensors, and ``dist.all_reduce`` for others).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ringcomm.core import tables

from . import extension
from .hooks import direct_calls

__all__ = ["all_reduce_"]

_compiling = torch.compiler.is_compiling
_RedOpType = dist.ReduceOp.RedOpType
# The names this function takes (the ops the trampoline offers, RC_TORCH_OPS, as its op takes
# them), and each one's dist.ReduceOp.
_NAMES = tuple(name.lower() for name in tables.TORCH_OPS)
_REDUCE_OPS = {name: getattr(dist.ReduceOp, name.upper()) for name in _NAMES}
# The entry's reduce-op code of each name (string keys only: no int or enum equals one), and of
# each such dist.ReduceOp.RedOpType.
_codes = {name: tables.op_code(name) for name in _NAMES}
_enum_codes = {rop: tables.op_code(name) for name, rop in _REDUCE_OPS.items()}


def all_reduce_(tensor: torch.Tensor, group=None, op="sum") -> torch.Tensor:
    """All-reduce ``tensor`` in place over ``group`` (default: the default group) and return it;
    synchronous. ``op``: a name (``"sum"``, ...) or the ``dist.ReduceOp`` of one."""
    if _compiling():
        return _traced(tensor, group, op)
    call = direct_calls.get(group)
    if call is not None:
        try:
            code = _codes.get(op)
        except TypeError:   # not hashable: the general path explains
            code = None
        if code is None and type(op) is _RedOpType:
            code = _enum_codes.get(op)
        if code is not None:
            # It ran in the offer point (the entry or the backend's Python half), or it raised;
            # otherwise (not offered) dist.all_reduce.
            if call(tensor, code):
                return tensor
            return _dist_all_reduce(tensor, group, op)
    return _general(tensor, group, op)


def _op_of(op):
    """(name, dist.ReduceOp.RedOpType) of ``op`` (a name, a RedOpType or a dist.ReduceOp holding
    one); ValueError for an op this function does not take."""
    if isinstance(op, dist.ReduceOp) and type(op) is not _RedOpType:
        op = op.op
    name = op.name.lower() if type(op) is _RedOpType else op
    rop = _REDUCE_OPS.get(name) if type(name) is str else None
    if rop is None:
        raise ValueError(f"ringcomm all_reduce_: op must be one of {', '.join(_NAMES)}; got {op!r} "
                         "(dist.all_reduce takes the others)")
    return name, rop


def _dist_all_reduce(tensor: torch.Tensor, group, op) -> torch.Tensor:
    """``dist.all_reduce`` itself (a non-member rank's call returns at once there)."""
    dist.all_reduce(tensor, op=_op_of(op)[1], group=group)
    return tensor


def _traced(tensor: torch.Tensor, group, op) -> torch.Tensor:
    """Under torch.compile: the op for CPU tensors where ringcomm's extension (which registers
    it) is loaded, ``dist.all_reduce`` otherwise; both trace."""
    name, rop = _op_of(op)
    if tensor.device.type == "cpu" and extension.loaded():
        if group is None:
            group = dist.distributed_c10d._get_default_group()
        torch.ops.ringcomm.all_reduce_(tensor, group.group_name, name)
    else:
        dist.all_reduce(tensor, op=rop, group=group)
    return tensor


def _general(tensor: torch.Tensor, group, op) -> torch.Tensor:
    """A call on a group without a learnt direct call: learns it where the group's CPU backend is
    ringcomm's and offers the call to it; dist.all_reduce for the rest."""
    if not isinstance(tensor, torch.Tensor):   # as dist.all_reduce
        raise TypeError(f"ringcomm.torch.all_reduce_: expected a torch.Tensor, got {type(tensor).__name__}")
    name, _ = _op_of(op)
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
            if backend._closed:   # shut down meanwhile (another thread): forget it here
                direct_calls.pop(key, None)
        # After shutdown this raises ClosedError, as the group's own allreduce does.
        if call(tensor, _codes[name]):
            return tensor
    return _dist_all_reduce(tensor, group, op)
