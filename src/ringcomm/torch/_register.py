"""Registration of the "ringcomm" backend with torch.distributed.

Kept apart from ``backend.py`` so that registering is cheap and needs neither ringcomm's C
extension nor the backend module: the ``torch.backends`` entry point calls ``autoload()`` while
``import torch`` is still running. The extension is loaded only when a process group is created.
"""
from __future__ import annotations

BACKEND_NAME = "ringcomm"


def _create_backend(dist_opts, backend_options=None):
    # Imported here: creating a group is the first moment ringcomm's core is needed.
    from .backend import create_backend
    return create_backend(dist_opts, backend_options)


def register() -> bool:
    """Register backend "ringcomm" (devices ``["cpu", "cuda"]``). Idempotent; returns False when
    torch was built without distributed support."""
    import torch.distributed as dist
    if not dist.is_available():
        return False
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return True
    # "cuda": CUDA tensors are routed by ringcomm's Communicator to its CUDA build
    # (ringcomm.cuda); without a usable CUDA runtime they raise "CUDA unavailable" on use. The
    # creator returns a per-device c10d Backend (or, RINGCOMM_TORCH_BACKEND=group, one
    # ProcessGroup for every device): see backend.py.
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True,
                                  devices=["cpu", "cuda"])
    return True


def autoload() -> None:
    """The ``torch.backends`` entry point. Never raises: a failure here would make
    ``import torch`` fail for every user of this environment."""
    try:
        register()
    except Exception:  # noqa: BLE001 - see docstring; the backend simply stays unregistered
        pass
