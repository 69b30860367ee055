"""ringcomm as a torch.distributed backend.

Layer 0, a back end: imports the core and torch, never another back end; no core module imports
it (importing it is what registers the backend).

``import ringcomm.torch`` registers the backend ``"ringcomm"``; then::

    dist.init_process_group("ringcomm")          # torchrun, tcp://, file://, or store=
    dist.new_group([0, 1], backend="ringcomm")

and DDP, FSDP2 and every ``dist.*`` collective run over ringcomm's shared-memory rings. The
backend is a per-device c10d ``Backend`` (``"cpu:ringcomm,cuda:nccl"`` keeps NCCL for CUDA
tensors); ``RINGCOMM_TORCH_BACKEND`` chooses (see ``backend.py``); ``python -m ringcomm.torch
--build`` builds its trampoline ahead of time.
Registering loads nothing heavy: ringcomm's C extension is loaded when the first group is created.

``monitored_barrier(group=None, timeout=None, wait_all_ranks=False)``: gloo's monitored barrier
for ringcomm groups, the same as torch's ``group.monitored_barrier(timeout, wait_all_ranks)``
(the backend's c10d ``monitoredBarrier``); torch's ``dist.monitored_barrier`` accepts gloo groups
only.

``all_reduce_(tensor, group=None, op="sum")``: a synchronous all_reduce of one CPU tensor as one
torch op (``torch.ops.ringcomm.all_reduce_``), without ``dist.all_reduce``'s Python, dispatch and
Work: for latency-bound callers (``ops.py``).

``add_issue_hook(fn)`` / ``remove_issue_hook(fn)``: ``fn(op, group_name, seq, t)`` is called each
time the backend issues a collective (``t`` = ``time.perf_counter()``), for tests and tracing.
"""
from __future__ import annotations

from ._register import BACKEND_NAME, autoload, register

register()


def __getattr__(name):
    # The backend module (and with it torch.distributed's ProcessGroup subclass) loads on demand;
    # a name, once loaded, is a global of this module (later look-ups do not come here: a
    # latency-bound caller's ringcomm.torch.all_reduce_ is one dictionary look-up).
    if name == "monitored_barrier":
        from .monitored import monitored_barrier as value
    elif name == "all_reduce_":
        from .ops import all_reduce_ as value
    elif name in ("RingcommProcessGroup", "RingcommWork", "add_issue_hook", "remove_issue_hook",
                  "create_process_group", "create_backend", "backend_class", "backend_mode"):
        from . import backend
        value = getattr(backend, name)
    else:
        raise AttributeError(f"module 'ringcomm.torch' has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = ["BACKEND_NAME", "register", "autoload", "RingcommProcessGroup", "RingcommWork",
           "add_issue_hook", "remove_issue_hook", "create_process_group", "create_backend",
           "backend_class", "backend_mode", "monitored_barrier", "all_reduce_"]
