"""Staging between torch's call shapes and ringcomm's: tensor checks, reduce-op mapping, and the
whole-tensor copies a composed collective needs (flattening a list, writing a contiguous copy
back). Nothing here loops over elements or chunks."""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist

import ringcomm
from ringcomm.core.tables import torch_dtype_codes

__all__ = ["SUPPORTED_DTYPES", "unsupported", "invalid", "reduce_op", "int_avg", "avg_divide",
           "then", "reducible", "check_tensors",
           "same_dtype", "one", "contig", "writeback", "flat_view", "copy_out", "cat"]

# dtypes ringcomm's core reduces and moves (the API contract). Checked here so that the message
# names the torch dtype and the collective.
SUPPORTED_DTYPES = frozenset(torch_dtype_codes())

_RT = dist.ReduceOp.RedOpType
# torch RedOpType value -> ringcomm.ReduceOp (keyed by int: hashing the pybind enum is slower)
_OPS = {int(getattr(_RT, name).value): getattr(ringcomm.ReduceOp, name)
        for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")}
_PREMUL_SUM = int(_RT.PREMUL_SUM.value)
_AVG = int(_RT.AVG.value)
_INT_DTYPES = frozenset({torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
                         torch.uint16, torch.uint32, torch.uint64}) & SUPPORTED_DTYPES

# ---- helpers ------------------------------------------------------------------------------------------
def unsupported(what: str) -> Exception:
    return ringcomm.UnsupportedError(f"ringcomm does not support {what}")


def invalid(msg: str) -> Exception:
    return ringcomm.InvalidArgumentError(f"ringcomm: {msg}")


def reduce_op(op, dtype=None) -> tuple[object, object | None]:
    """torch ReduceOp -> (ringcomm.ReduceOp, PREMUL_SUM factor or None)."""
    kind = getattr(op, "op", op)
    code = kind.value
    if code == _AVG and dtype in _INT_DTYPES:
        return ringcomm.ReduceOp.SUM, None  # the caller divides afterwards: see int_avg
    rop = _OPS.get(code)
    if rop is not None:
        return rop, None
    if code == _PREMUL_SUM:
        if dtype is not None and not dtype.is_floating_point:
            raise unsupported(f"PREMUL_SUM on {dtype} tensors (floating point only)")
        return ringcomm.ReduceOp.SUM, op.factor
    raise unsupported(f"reduce op {kind}")


def int_avg(op, dtype) -> bool:
    """True for ReduceOp.AVG on an integer dtype, which the torch backend runs as NCCL does:
    a SUM (wrapping in the dtype, like every integer sum), then each element divided by the
    group size with C's integer ``/`` (truncation toward zero; NCCL's ncclAvg on integer types
    is its "sum, then post-divide" reduction, ``FuncSumPostDiv``, which applies ``x / nranks``
    in the element type). ``reduce_op`` maps it to SUM; the plain ``ringcomm`` API keeps
    refusing AVG on integers (UnsupportedError), so only torch callers get this rounding."""
    return dtype in _INT_DTYPES and getattr(op, "op", op).value == _AVG


def avg_divide(buf: torch.Tensor, size: int) -> Callable[[], None]:
    """The post-division of an integer AVG: in place on the reduced buffer."""
    return lambda: buf.div_(size, rounding_mode="trunc")


def then(*fns) -> Callable[[], None] | None:
    """The finish steps ``fns`` (None entries skipped) in order, as one callable (or None)."""
    fns = [f for f in fns if f is not None]
    if not fns:
        return None
    if len(fns) == 1:
        return fns[0]

    def run():
        for f in fns:
            f()
    return run


_BITWISE = frozenset({ringcomm.ReduceOp.BAND, ringcomm.ReduceOp.BOR, ringcomm.ReduceOp.BXOR})


def reducible(buf: torch.Tensor, rop) -> torch.Tensor:
    """ringcomm reduces bool with MIN/MAX only; a bool's bytes are 0/1, so bitwise ops run on
    them as uint8 and leave valid bools."""
    if buf.dtype == torch.bool and rop in _BITWISE:
        return buf.view(torch.uint8)
    return buf


def check_tensors(coll: str, tensors: Sequence[torch.Tensor]) -> None:
    """Same device for all, CPU or CUDA, strided, a supported dtype: else a clear exception."""
    if len(tensors) > 1:
        dev = tensors[0].device
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"ringcomm {coll}: expected a torch.Tensor, got "
                                f"{type(t).__name__}")
            if t.device != dev:
                raise invalid(f"{coll}: all tensors must be on one device; got {dev} and "
                               f"{t.device}")
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"ringcomm {coll}: expected a torch.Tensor, got {type(t).__name__}")
        if t.is_cpu and t.layout == torch.strided and t.dtype in SUPPORTED_DTYPES:
            continue  # the common case, checked cheaply
        if t.device.type == "cuda" and t.layout == torch.strided and t.dtype in SUPPORTED_DTYPES:
            continue  # routed to ringcomm.cuda by the Communicator (CUDA unavailable -> it raises)
        if t.device.type not in ("cpu", "cuda"):
            raise unsupported(f"tensors on device '{t.device}' ({coll}); ringcomm's torch backend "
                               f"handles CPU tensors (and CUDA tensors through ringcomm.cuda)")
        if t.layout != torch.strided:
            raise unsupported(f"{t.layout} tensors ({coll})")
        if t.dtype not in SUPPORTED_DTYPES:
            raise unsupported(f"dtype {t.dtype} ({coll}); supported: "
                               + ", ".join(sorted(str(d).replace("torch.", "")
                                                  for d in SUPPORTED_DTYPES)))


def same_dtype(coll: str, tensors: Sequence[torch.Tensor]) -> None:
    d = tensors[0].dtype
    for t in tensors:
        if t.dtype != d:
            raise invalid(f"{coll}: all tensors must have one dtype; got {d} and {t.dtype}")


def one(coll: str, tensors: Sequence, what: str = "tensor"):
    if len(tensors) != 1:
        raise unsupported(f"{coll} with {len(tensors)} {what}s per call (one per process)")
    return tensors[0]


def contig(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(t, False) when t is contiguous, else (a contiguous copy, True). ringcomm counts
    elements, not shapes, so any contiguous shape is handed over as it is."""
    if t.is_contiguous():
        return t, False
    return t.contiguous(), True


def writeback(t: torch.Tensor, buf: torch.Tensor) -> Callable[[], None]:
    return lambda: t.copy_(buf.view(t.shape))


def flat_view(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """One 1-D tensor over ``tensors`` when they lie back to back in one storage, else None."""
    t0 = tensors[0]
    n = t0.numel()
    if n == 0:
        return None
    base = t0.data_ptr()
    step = n * t0.element_size()
    storage = t0.untyped_storage().data_ptr()
    for i, t in enumerate(tensors):
        if (not t.is_contiguous() or t.dtype != t0.dtype or t.numel() != n
                or t.data_ptr() != base + i * step
                or t.untyped_storage().data_ptr() != storage):
            return None
    return t0.as_strided((n * len(tensors),), (1,), t0.storage_offset())


def copy_out(flat: torch.Tensor, outs: Sequence[torch.Tensor]) -> None:
    offset = 0
    for o in outs:
        n = o.numel()
        o.copy_(flat[offset:offset + n].view(o.shape))
        offset += n


def cat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    if len(tensors) == 1:
        return tensors[0].reshape(-1).clone()
    return torch.cat([t.reshape(-1) for t in tensors])
