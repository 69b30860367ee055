"""Whether ringcomm's CUDA build can run here: loading ``ringcomm._C_cuda`` and asking the driver.

Nothing is loaded at import; the first question loads the extension (statically linked CUDA
runtime) once and caches the answer (and, when CUDA is unusable, the reason).
"""
from __future__ import annotations

import os
import threading

from ..core.errors import UnsupportedError

__all__ = ["is_available", "unavailable_reason", "device_count", "require", "default_device"]

_lock = threading.Lock()
_state: dict = {}


def _load():
    """The extension module, or None; caches the reason it is unusable."""
    with _lock:
        if "mod" in _state:
            return _state["mod"]
        mod, reason = None, ""
        try:
            from .. import _C_cuda as mod  # noqa: N813
        except ImportError as e:
            reason = (f"ringcomm was built without CUDA support (ringcomm._C_cuda: {e}); rebuild with "
                      f"RINGCOMM_CUDA=1 where nvcc is installed")
        if mod is not None:
            st = mod.runtime_status()
            if not st["available"]:
                reason = (f"no usable CUDA device ({st['error']}; CUDA runtime {st['runtime_version']}, "
                          f"driver {st['driver_version']})")
        _state["mod"], _state["reason"] = mod, reason
        return mod


def is_available() -> bool:
    """True when ringcomm's CUDA extension is built and a CUDA device is usable."""
    return _load() is not None and not _state["reason"]


def unavailable_reason() -> str:
    """Why CUDA cannot be used here ('' when it can)."""
    _load()
    return _state["reason"]


def device_count() -> int:
    mod = _load()
    return mod.runtime_status()["device_count"] if mod is not None else 0


def require():
    """The loaded extension module; UnsupportedError ("CUDA unavailable: <reason>") otherwise."""
    mod = _load()
    if mod is None or _state["reason"]:
        raise UnsupportedError(f"ringcomm: CUDA unavailable: {_state['reason']}")
    return mod


def default_device() -> int:
    """torch's or CuPy's current device, else LOCAL_RANK modulo the device count."""
    try:
        import torch
        if torch.cuda.is_available():
            return int(torch.cuda.current_device())
    except ImportError:
        pass
    try:
        import cupy
        return int(cupy.cuda.runtime.getDevice())
    except ImportError:
        pass
    n = device_count()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    return local % n if n else 0
