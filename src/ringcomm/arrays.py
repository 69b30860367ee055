"""Array adapters: numpy arrays and torch CPU tensors (CuPy / CUDA tensors: see ringcomm.cuda)
as (address, element count, dtype code) views of their memory. No copies: the collective reads
and writes the array's own memory, which must be contiguous."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import InvalidArgumentError, UnsupportedError

# Codes of rc::DType (csrc/common/dtype.h). Never renumber.
DTYPE_CODES = {
    "float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int8": 4, "uint8": 5, "int32": 6,
    "int64": 7, "bool": 8,
}
SUPPORTED = ", ".join(DTYPE_CODES)


@dataclass
class Buf:
    """A contiguous array's memory: address, element count, dtype name/code, bytes."""
    obj: Any
    addr: int
    count: int
    dtype: str
    code: int
    nbytes: int
    writeable: bool
    device: str = "cpu"


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def as_buf(x, what: str = "array") -> Buf:
    """Describe x's memory. Raises InvalidArgumentError / UnsupportedError with a clear message."""
    if isinstance(x, np.ndarray):
        name = x.dtype.name
        if name not in DTYPE_CODES:
            raise UnsupportedError(f"ringcomm: {what} has dtype {x.dtype}, supported: {SUPPORTED}")
        if not x.flags.c_contiguous:
            raise InvalidArgumentError(
                f"ringcomm: {what} is not contiguous (shape {x.shape}, strides {x.strides}); "
                f"pass np.ascontiguousarray(...) and copy the result back")
        return Buf(x, x.ctypes.data if x.size else 0, int(x.size), name, DTYPE_CODES[name],
                   int(x.nbytes), bool(x.flags.writeable))
    if _is_torch(x):
        import torch
        if not isinstance(x, torch.Tensor):
            raise UnsupportedError(f"ringcomm: {what} of type {type(x).__name__} is not supported")
        name = str(x.dtype).replace("torch.", "")
        if name not in DTYPE_CODES:
            raise UnsupportedError(f"ringcomm: {what} has dtype {x.dtype}, supported: {SUPPORTED}")
        if x.device.type != "cpu":
            raise UnsupportedError(
                f"ringcomm: {what} is on device {x.device}; this call path handles CPU tensors "
                f"(CUDA tensors need ringcomm's CUDA build)")
        if x.is_sparse or x.layout != torch.strided:
            raise UnsupportedError(f"ringcomm: {what} has layout {x.layout}; only dense tensors are supported")
        if not x.is_contiguous():
            raise InvalidArgumentError(
                f"ringcomm: {what} is not contiguous (shape {tuple(x.shape)}, stride {x.stride()}); "
                f"pass x.contiguous() and copy the result back")
        n = x.numel()
        return Buf(x, x.data_ptr() if n else 0, int(n), name, DTYPE_CODES[name],
                   int(n * x.element_size()), True)
    if hasattr(x, "__cuda_array_interface__"):
        raise UnsupportedError(
            f"ringcomm: {what} is a GPU array ({type(x).__name__}); this call path handles host memory")
    raise UnsupportedError(
        f"ringcomm: {what} of type {type(x).__name__} is not supported (numpy arrays and torch CPU tensors are)")
