"""The do-nothing c10d backend "ringcomm_null": every ``all_reduce`` returns a completed Work at
once and leaves the tensor as it was. Its ``dist.all_reduce`` is the floor every c10d backend pays
(torch's Python front, the ProcessGroup's dispatch, a Work and ``wait()``), on the same C++
trampoline module as the "ringcomm" backend (``bindings/torch/trampoline.cpp``, ``NullBackend``).

Registered only by ``register()`` (the probes' ``null`` peer), never by ``import ringcomm.torch``:
it computes nothing, so a group that used it by mistake would return wrong sums.
"""
from __future__ import annotations

NULL_BACKEND_NAME = "ringcomm_null"


def _create(dist_opts, backend_options=None):
    from .extension import load
    return load().NullBackend(dist_opts.group_rank, dist_opts.group_size)


def register() -> bool:
    """Register backend "ringcomm_null" (CPU). Idempotent; False when torch has no distributed
    support."""
    import torch.distributed as dist
    if not dist.is_available():
        return False
    if NULL_BACKEND_NAME.upper() in dist.Backend._plugins:
        return True
    dist.Backend.register_backend(NULL_BACKEND_NAME, _create, extended_api=True, devices=["cpu"])
    return True
