"""CUDA arrays as (device address, element count, dtype code) views, and the streams work goes on.

Torch CUDA tensors, CuPy arrays, ``__cuda_array_interface__`` objects and DLPack CUDA arrays are
described without copies; they must be contiguous. Streams are int handles, ``torch.cuda.Stream``
or ``cupy.cuda.Stream`` objects; without one, the array library's current stream is used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..core.arrays import Buf, is_cuda_array
from ..core.errors import InvalidArgumentError, UnsupportedError
from ..core.tables import DTYPE_CODES, SUPPORTED_DTYPES

__all__ = ["CudaBuf", "as_cuda_buf", "stream_handle", "current_stream"]


@dataclass
class CudaBuf(Buf):
    """A contiguous CUDA array's memory: a Buf, plus where it lives and who produced it."""
    device: int
    lib: str           # "torch", "cupy" or "cai"
    stream: Optional[int] = None  # the producer's stream (CUDA array interface v3), if it says


def _c_strides(shape, itemsize):
    st, acc = [], itemsize
    for d in reversed(shape):
        st.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(st))


def as_cuda_buf(x, what: str = "array") -> CudaBuf:
    """Describe a CUDA array's memory; InvalidArgumentError / UnsupportedError with a clear message."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        import torch
        if not isinstance(x, torch.Tensor) or not x.is_cuda:
            raise UnsupportedError(f"ringcomm: {what} ({type(x).__name__} on {getattr(x, 'device', '?')}) is not a "
                                   f"CUDA tensor")
        name = str(x.dtype).replace("torch.", "")
        if name not in DTYPE_CODES:
            raise UnsupportedError(f"ringcomm: {what} has dtype {x.dtype}, supported: {SUPPORTED_DTYPES}")
        if x.layout != torch.strided:
            raise UnsupportedError(f"ringcomm: {what} has layout {x.layout}; only dense tensors are supported")
        if not x.is_contiguous():
            raise InvalidArgumentError(f"ringcomm: {what} is not contiguous (shape {tuple(x.shape)}, stride "
                                       f"{x.stride()}); pass x.contiguous() and copy the result back")
        n = x.numel()
        return CudaBuf(x, x.data_ptr() if n else 0, int(n), name, DTYPE_CODES[name], int(n * x.element_size()),
                       True, int(x.device.index if x.device.index is not None else torch.cuda.current_device()),
                       "torch")
    if mod.startswith("cupy"):
        name = np.dtype(x.dtype).name
        if name not in DTYPE_CODES:
            raise UnsupportedError(f"ringcomm: {what} has dtype {x.dtype}, supported: {SUPPORTED_DTYPES}")
        if not x.flags.c_contiguous:
            raise InvalidArgumentError(f"ringcomm: {what} is not C-contiguous (shape {x.shape}, strides {x.strides}); "
                                       f"pass cupy.ascontiguousarray(...) and copy the result back")
        return CudaBuf(x, int(x.data.ptr) if x.size else 0, int(x.size), name, DTYPE_CODES[name], int(x.nbytes),
                       True, int(x.device.id), "cupy")
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        ptr, readonly = cai["data"]
        dt = np.dtype(cai["typestr"])
        name = dt.name
        if name not in DTYPE_CODES:
            raise UnsupportedError(f"ringcomm: {what} has dtype {cai['typestr']}, supported: {SUPPORTED_DTYPES}")
        shape = tuple(int(d) for d in cai["shape"])
        count = int(np.prod(shape)) if shape else 1
        strides = cai.get("strides")
        if strides is not None and count > 1 and tuple(strides) != _c_strides(shape, dt.itemsize):
            raise InvalidArgumentError(f"ringcomm: {what} is not C-contiguous (strides {strides})")
        if cai.get("mask") is not None:
            raise UnsupportedError(f"ringcomm: {what} is a masked array")
        # The device is not part of the interface: -1 here, the C++ side checks the pointer's device.
        return CudaBuf(x, int(ptr) if count else 0, count, name, DTYPE_CODES[name], count * dt.itemsize,
                       not readonly, -1, "cai", cai.get("stream"))
    if hasattr(x, "__dlpack__") and is_cuda_array(x):
        return as_cuda_buf(_from_dlpack(x), what)
    raise UnsupportedError(f"ringcomm: {what} of type {type(x).__name__} is not a CUDA array (torch CUDA tensors, "
                           f"CuPy arrays, __cuda_array_interface__ and DLPack CUDA arrays are)")


def _from_dlpack(x):
    """A torch / CuPy view of a DLPack CUDA array (same memory)."""
    try:
        import torch
        return torch.from_dlpack(x)
    except ImportError:
        pass
    try:
        import cupy
        return cupy.from_dlpack(x)
    except ImportError:
        raise UnsupportedError("ringcomm: DLPack CUDA arrays need torch or CuPy to be viewed") from None


def stream_handle(stream) -> Optional[int]:
    if stream is None:
        return None
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise InvalidArgumentError(f"ringcomm: stream {stream!r} is not a CUDA stream (an int handle, a "
                               f"torch.cuda.Stream or a cupy.cuda.Stream)")


def current_stream(buf: CudaBuf, device: int) -> int:
    if buf.lib == "torch":
        import torch
        return int(torch.cuda.current_stream(device).cuda_stream)
    if buf.lib == "cupy":
        import cupy
        return int(cupy.cuda.get_current_stream().ptr)
    if buf.stream is not None:
        return int(buf.stream)
    return 0  # the legacy default stream
