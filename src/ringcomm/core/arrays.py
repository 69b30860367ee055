"""Array adapters of the general path: numpy arrays and torch CPU tensors as (address, element
count, dtype code) views of their memory, or the typed error that says why an array is refused.
No copies: the collective reads and writes the array's own memory, which must be contiguous.
(A synchronous all_reduce or broadcast first offers its arrays to the core's synchronous entry,
csrc/comm/sync_entry.h, which describes them in C++; only what it declines comes here.)"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _C
from .errors import InvalidArgumentError, UnsupportedError
from .tables import DTYPE_CODES, DTYPE_NAMES, DTYPES, ITEMSIZE, SUPPORTED_DTYPES, torch_dtype_codes

SUPPORTED = SUPPORTED_DTYPES
_NP_CODES = {np.dtype(d.np_name): d.code for d in DTYPES if d.np_name is not None}
_BF16 = DTYPE_CODES["bfloat16"]
_TORCH_CODES: dict = {}   # filled on the first torch tensor (torch is never imported eagerly)
_ESIZE = ITEMSIZE


@dataclass
class Buf:
    """A contiguous array's memory: address, element count, dtype name/code, bytes."""
    __slots__ = ("obj", "addr", "count", "dtype", "code", "nbytes", "writeable")
    obj: Any
    addr: int
    count: int
    dtype: str
    code: int
    nbytes: int
    writeable: bool


_NAMES = DTYPE_NAMES


def _numpy_buf(x: np.ndarray, what: str, writeable: bool) -> Buf:
    code = _NP_CODES.get(x.dtype)
    if code is None:
        if x.dtype.name == "bfloat16":      # ml_dtypes.bfloat16
            code = _BF16
        else:
            raise UnsupportedError(f"ringcomm: {what} has dtype {x.dtype}, supported: {SUPPORTED}")
    # One buffer-protocol request checks contiguity (and writability when the result lands here).
    info = _C.buffer_address(x, writeable)
    if info is None:
        if not x.flags.c_contiguous:
            raise InvalidArgumentError(
                f"ringcomm: {what} is not contiguous (shape {x.shape}, strides {x.strides}); "
                f"pass np.ascontiguousarray(...) and copy the result back")
        raise InvalidArgumentError(f"ringcomm: {what} is read-only but the result is written into it")
    addr, nbytes = info
    return Buf(x, addr, nbytes // _ESIZE[code], _NAMES[code], code, nbytes, True if writeable else x.flags.writeable)


def _torch_codes():
    _TORCH_CODES.update(torch_dtype_codes())
    return _TORCH_CODES


def _torch_buf(x, what: str) -> Buf:
    codes = _TORCH_CODES or _torch_codes()
    code = codes.get(x.dtype)
    if code is None:
        raise UnsupportedError(f"ringcomm: {what} has dtype {x.dtype}, supported: {SUPPORTED}")
    if not x.is_cpu:
        raise UnsupportedError(
            f"ringcomm: {what} is on device {x.device}; this communicator moves host memory "
            f"(CUDA tensors need ringcomm's CUDA build: ringcomm.cuda)")
    try:
        contiguous = x.is_contiguous()
    except RuntimeError as e:   # sparse and other layouts without strides
        raise UnsupportedError(f"ringcomm: {what} has layout {x.layout}; only dense tensors are supported") from e
    if not contiguous:
        raise InvalidArgumentError(
            f"ringcomm: {what} is not contiguous (shape {tuple(x.shape)}, stride {x.stride()}); "
            f"pass x.contiguous() and copy the result back")
    n = x.numel()
    return Buf(x, x.data_ptr() if n else 0, n, _NAMES[code], code, n * _ESIZE[code], True)


def as_buf(x, what: str = "array", writeable: bool = False) -> Buf:
    """Describe x's memory (writeable=True: the result is written into it). Raises
    InvalidArgumentError / UnsupportedError with a clear message."""
    if type(x) is np.ndarray or isinstance(x, np.ndarray):
        return _numpy_buf(x, what, writeable)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _torch_buf(x, what)
    if hasattr(x, "__cuda_array_interface__"):
        raise UnsupportedError(
            f"ringcomm: {what} is a GPU array ({type(x).__name__}); this communicator moves host memory")
    raise UnsupportedError(
        f"ringcomm: {what} of type {type(x).__name__} is not supported (numpy arrays and torch CPU tensors are)")


# ---- telling CUDA arrays apart (the host communicator routes them to ringcomm.cuda) ----
_KDL_CUDA, _KDL_CUDA_MANAGED = 2, 13
_NDARRAY = np.ndarray


def is_cuda_array(x) -> bool:
    """True for torch CUDA tensors, CuPy arrays, __cuda_array_interface__ objects and DLPack arrays
    on a CUDA device: the arrays ringcomm.Communicator forwards to ringcomm.cuda."""
    if x is None or isinstance(x, np.ndarray):
        return False
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return x.is_cuda
    if hasattr(x, "__cuda_array_interface__"):
        return True
    dl = getattr(x, "__dlpack_device__", None)
    if dl is not None:
        try:
            return int(dl()[0]) in (_KDL_CUDA, _KDL_CUDA_MANAGED)
        except Exception:  # noqa: BLE001 - no usable DLPack device: not a CUDA array
            return False
    return False


def maybe_cuda(x) -> bool:
    """is_cuda_array(x) for a non-None, non-numpy x; torch tensors answer directly."""
    c = getattr(x, "is_cuda", None)
    return c is True if c is not None else is_cuda_array(x)
