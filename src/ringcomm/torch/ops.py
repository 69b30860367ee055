"""``ringcomm.torch.all_reduce_``: a synchronous all_reduce of one CPU tensor of a ringcomm group
as one torch dispatcher op, ``torch.ops.ringcomm.all_reduce_(tensor, group_name, op)``.

Layer 0, a back end (part of ``ringcomm.torch``).

For latency-bound callers (tensor-parallel inference, a custom trainer's small reductions): it
skips ``dist.all_reduce``'s Python, the ProcessGroup's dispatch and the Work, and offers the call
straight to the communicator's synchronous entry (``bindings/torch/trampoline.cpp``); what the
entry declines runs as the group's own synchronous allreduce. The result, the errors and the
group's sequence number are those of ``dist.all_reduce(tensor, op, group)``. Ops: ``"sum"``,
``"product"``, ``"min"``, ``"max"``, ``"band"``, ``"bor"``, ``"bxor"`` (``dist.all_reduce`` takes
AVG and PREMUL_SUM). The trampoline extension registers the op when it loads (a ringcomm group's
creation loads it, and so does the first call here); a loop may then call
``torch.ops.ringcomm.all_reduce_`` with ``group.group_name`` directly.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["all_reduce_"]

_op = None   # torch.ops.ringcomm.all_reduce_, once the extension that registers it is loaded


def all_reduce_(tensor: torch.Tensor, group=None, op: str = "sum") -> torch.Tensor:
    """All-reduce ``tensor`` (a CPU tensor) in place over ``group`` (default: the default group)
    and return it; synchronous."""
    global _op
    if _op is None:
        from .extension import load
        load()
        _op = torch.ops.ringcomm.all_reduce_.default
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    elif group == dist.GroupMember.NON_GROUP_MEMBER:
        return tensor   # a rank outside the group takes no part, as in dist.all_reduce
    return _op(tensor, group.group_name, op)
