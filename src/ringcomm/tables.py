"""The codes ringcomm's layers agree on: dtypes, reduce ops and collectives.

This is the one place they are written down on the Python side. The values are part of the C++
core's wire header (csrc/common/dtype.h: rc::DType, rc::ReduceOp; csrc/comm/communicator.h:
rc::Coll), so they are never renumbered; ``tests/test_tables.py`` checks every entry against what
``ringcomm._C`` does with it. Importing this module loads neither the C extension nor torch.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

from .errors import InvalidArgumentError

__all__ = ["DType", "DTYPES", "DTYPE_CODES", "DTYPE_NAMES", "ITEMSIZE", "SUPPORTED_DTYPES",
           "FLOATING", "INTEGER", "ReduceOp", "OP_NAMES", "op_code", "op_supported",
           "COLL_CODES", "coll_code", "torch_dtype_codes"]


@dataclass(frozen=True)
class DType:
    """One element type: its core code, byte size, and name in numpy (None: numpy has none)."""
    name: str
    code: int
    itemsize: int
    np_name: Optional[str]
    is_float: bool
    is_int: bool


# rc::DType, in code order. bfloat16 has no numpy dtype (ml_dtypes' bfloat16 is accepted by name).
DTYPES = tuple(DType(*row) for row in (
    ("float32", 0, 4, "float32", True, False),
    ("float64", 1, 8, "float64", True, False),
    ("float16", 2, 2, "float16", True, False),
    ("bfloat16", 3, 2, None, True, False),
    ("int8", 4, 1, "int8", False, True),
    ("uint8", 5, 1, "uint8", False, True),
    ("int32", 6, 4, "int32", False, True),
    ("int64", 7, 8, "int64", False, True),
    ("bool", 8, 1, "bool", False, False),
))
DTYPE_CODES = {d.name: d.code for d in DTYPES}
DTYPE_NAMES = tuple(d.name for d in DTYPES)          # indexed by code
ITEMSIZE = tuple(d.itemsize for d in DTYPES)          # indexed by code
SUPPORTED_DTYPES = ", ".join(DTYPE_NAMES)
FLOATING = frozenset(d.name for d in DTYPES if d.is_float)
INTEGER = frozenset(d.name for d in DTYPES if d.is_int)


class ReduceOp(enum.IntEnum):
    """Reduction operators (codes of rc::ReduceOp)."""
    SUM = 0
    PRODUCT = 1
    MIN = 2
    MAX = 3
    AVG = 4
    BAND = 5
    BOR = 6
    BXOR = 7


OP_NAMES = tuple(o.name for o in ReduceOp)           # indexed by code

# op (a ReduceOp or its int code) -> code: the per-call lookup, no enum construction.
_OP_CACHE = {o: int(o) for o in ReduceOp}
_OP_CACHE.update({int(o): int(o) for o in ReduceOp})


def op_code(op) -> int:
    """The code of ``op``: a ReduceOp, its int code or its (case-insensitive) name.
    InvalidArgumentError for anything else."""
    code = _OP_CACHE.get(op) if not isinstance(op, bool) else None
    if code is not None:
        return code
    if isinstance(op, str):
        try:
            return int(ReduceOp[op.upper()])
        except KeyError:
            raise InvalidArgumentError(f"ringcomm: unknown reduce op {op!r}; use one of "
                                       f"{', '.join(OP_NAMES)}") from None
    try:
        return int(ReduceOp(int(op)))
    except (ValueError, TypeError):
        raise InvalidArgumentError(f"ringcomm: unknown reduce op {op!r}") from None


def _supported_mask(d: DType) -> int:
    """Bit ``op`` set when the core reduces dtype ``d`` with ``op`` (reduce_cpu.cpp's rule):
    bool takes MIN/MAX only; AVG needs a floating dtype; the bitwise ops an integer dtype."""
    if d.name == "bool":
        ops = (ReduceOp.MIN, ReduceOp.MAX)
    else:
        ops = [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX]
        if d.is_float:
            ops.append(ReduceOp.AVG)
        if d.is_int:
            ops += [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
    mask = 0
    for o in ops:
        mask |= 1 << int(o)
    return mask


# Indexed by dtype code: a bit mask of the op codes the core reduces that dtype with.
OPS_SUPPORTED = tuple(_supported_mask(d) for d in DTYPES)


# Indexed by dtype code: {op: code} for the ops (ReduceOp members and their int codes) the core
# reduces that dtype with; the per-call lookup (anything else takes op_code's slow path).
OPS_FOR_DTYPE = tuple({k: v for k, v in _OP_CACHE.items() if m >> v & 1} for m in OPS_SUPPORTED)


def op_supported(op: int, dtype_code: int) -> bool:
    """Whether the core reduces dtype ``dtype_code`` with op code ``op``."""
    return bool(OPS_SUPPORTED[dtype_code] >> op & 1)


def unsupported_op_message(op: int, dtype_code: int) -> str:
    """The core's own message for an unsupported (op, dtype) pair (reduce_cpu.cpp)."""
    return f"ringcomm: reduce op {OP_NAMES[op]} is not supported for dtype {DTYPE_NAMES[dtype_code]}"


# rc::Coll: the collective named in the header exchange (and in a rejection).
COLL_CODES = {"all_reduce": 1, "reduce_scatter": 2, "all_gather": 3, "broadcast": 4, "reduce": 5,
              "barrier": 6, "all_to_all": 7, "gather": 8, "scatter": 9}


def coll_code(coll: str) -> int:
    return COLL_CODES[coll]


_TORCH_CODES: dict = {}


def torch_dtype_codes() -> dict:
    """``{torch.dtype: code}`` for every dtype of the table (imports torch on first call)."""
    if not _TORCH_CODES:
        import torch
        for d in DTYPES:
            _TORCH_CODES[getattr(torch, d.name)] = d.code
    return _TORCH_CODES
