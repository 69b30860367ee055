"""The two shapes of the "ringcomm" torch.distributed backend, over one implementation
(``collectives.Collectives``), and the creator torch calls.

* ``RingcommBackend`` (``RINGCOMM_TORCH_BACKEND=c10d``, and ``auto`` when the trampoline builds):
  a c10d ``Backend`` per device. The creator returns it and torch registers it for the devices the
  backend string gives it (``_new_process_group_helper``: ``pg._register_backend(device, CUSTOM,
  backend)``), inside torch's own ``ProcessGroup``: ``"cpu:gloo,cuda:ringcomm"`` keeps gloo for
  CPU tensors, ``"cpu:ringcomm,cuda:nccl"`` keeps NCCL for CUDA tensors, and
  ``group._get_backend(torch.device("cpu"))`` is this object. Its base class is the JIT-built
  trampoline (``extension.py``); torch holds it from C++ only, so ``live_groups`` keeps the
  Python half alive until ``shutdown()``.
* ``RingcommProcessGroup`` (``group``, and ``auto`` when the trampoline cannot be built): a
  ``dist.ProcessGroup`` subclass, which torch puts in place of the whole group, every device
  included.
"""
from __future__ import annotations

import threading
import warnings

import torch.distributed as dist

from .collectives import Collectives
from .core import BACKEND_NAME
from .hooks import add_issue_hook, remove_issue_hook
from .staging import SUPPORTED_DTYPES
from .work import RingcommWork

__all__ = ["RingcommProcessGroup", "RingcommWork", "backend_class", "backend_mode",
           "create_process_group", "create_backend", "add_issue_hook", "remove_issue_hook",
           "SUPPORTED_DTYPES", "BACKEND_NAME"]


class RingcommProcessGroup(Collectives, dist.ProcessGroup):
    """torch.distributed process group whose collectives run on a ringcomm Communicator."""

    _kind = "RingcommProcessGroup"

    # Sequence numbers as gloo's (the per-device backend keeps its count in the trampoline, where
    # its native fast path also counts): the calls issued on this group; every rank starts a new
    # group at 0, so setting it needs no exchange.
    def _get_sequence_number_for_group(self) -> int:
        return self._issued

    def _set_sequence_number_for_group(self) -> None:
        pass


_lock = threading.Lock()
_backend_class: type | None = None
_fallback_warned = False


def backend_class() -> type:
    """``RingcommBackend``: ``Collectives`` on the c10d Backend trampoline. Builds (or loads the
    cached build of) the trampoline the first time; raises what the build raised."""
    global _backend_class
    with _lock:
        if _backend_class is None:
            from .extension import load
            trampoline = load().Trampoline
            _backend_class = type("RingcommBackend", (Collectives, trampoline), {
                "__doc__": "A per-device torch.distributed c10d Backend over a ringcomm "
                           "Communicator.",
                "__module__": __name__,
                "_kind": "RingcommBackend",
            })
        return _backend_class


def backend_mode() -> str:
    """``RINGCOMM_TORCH_BACKEND``, lower case: ``auto``, ``c10d`` or ``group``."""
    from ringcomm.core.config import read
    return read().torch_backend.lower()


def _per_device_class() -> type | None:
    """The class the creator makes: RingcommBackend, or None for the whole-group fallback."""
    global _fallback_warned
    mode = backend_mode()
    if mode == "group":
        return None
    if mode == "c10d":
        return backend_class()
    try:
        return backend_class()
    except Exception as e:  # noqa: BLE001 - auto: fall back, saying why, once per process
        if not _fallback_warned:
            _fallback_warned = True
            warnings.warn(
                f"ringcomm: the per-device c10d backend is unavailable ({type(e).__name__}: "
                f"{str(e).strip().splitlines()[-1] if str(e).strip() else e!r}); using one "
                f"ProcessGroup for every device instead (RINGCOMM_TORCH_BACKEND=group does so "
                f"silently, =c10d makes this an error)", RuntimeWarning, stacklevel=3)
        return None


def create_process_group(dist_opts, backend_options=None) -> RingcommProcessGroup:
    """The whole-group creator (``RINGCOMM_TORCH_BACKEND=group``)."""
    return RingcommProcessGroup(dist_opts.store, dist_opts.group_rank, dist_opts.group_size,
                                dist_opts.timeout, group_name=dist_opts.group_id)


def create_backend(dist_opts, backend_options=None):
    """Backend creator registered with ``torch.distributed`` (extended API): a per-device
    ``RingcommBackend``, or a ``RingcommProcessGroup`` (see ``backend_mode``)."""
    cls = _per_device_class()
    if cls is None:
        return create_process_group(dist_opts, backend_options)
    return cls(dist_opts.store, dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout,
               group_name=dist_opts.group_id)
