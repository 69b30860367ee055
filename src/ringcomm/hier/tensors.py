"""Flat torch views of the hierarchical communicator's arrays, and the arithmetic of splitting them."""
from __future__ import annotations

import warnings

import numpy as np

__all__ = ["as_tensor", "as_bytes", "overlaps", "balanced"]


def as_tensor(x):
    """A flat torch tensor sharing x's memory (x: numpy array or torch CPU tensor, already
    checked contiguous by as_buf)."""
    import torch
    if isinstance(x, torch.Tensor):
        return x.reshape(-1)
    a = x.reshape(-1)
    if a.dtype.name == "bfloat16":          # ml_dtypes.bfloat16: same bits as torch.bfloat16
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    with warnings.catch_warnings():         # read-only inputs: only ever read here
        warnings.simplefilter("ignore")
        return torch.from_numpy(a)


def as_bytes(t):
    """A uint8 view of a flat contiguous tensor (data movement through gloo needs no dtype)."""
    import torch
    if t.numel() == 0:      # numpy's empty arrays may come with stride 0, which view() refuses
        return torch.empty(0, dtype=torch.uint8)
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def overlaps(a, b) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def balanced(count: int, parts: int, i: int) -> tuple:
    """(offset, length) of part i when count elements are split into parts: the first
    count % parts parts hold one extra element (the flat API's reduce_scatter rule)."""
    q, r = divmod(count, parts)
    return i * q + min(i, r), q + (1 if i < r else 0)
