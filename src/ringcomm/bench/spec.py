"""What a benchmark measurement is named by, shared by every part of the bench (the runners,
the harness, the report, the CLI): the collectives and their forms, the dtypes, sizes and their
parsing, element counts and nccl-tests' bus-bandwidth factors. Pure data and arithmetic: it
imports nothing from the rest of the bench.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..core.tables import DTYPES as _TABLE_DTYPES

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")
REDUCING = frozenset({"all_reduce", "reduce_scatter", "reduce"})
# Collectives whose full tensor is split into world_size equal chunks.
CHUNKED = frozenset({"reduce_scatter", "all_gather", "all_to_all"})
REDOPS = ("sum", "prod", "min", "max", "avg")
MODES = ("oop", "ip")
MODE_LABEL = {"oop": "out-of-place", "ip": "in-place"}
# The form each peer is measured in (torch.distributed's own: all_reduce/broadcast/reduce work in
# place, reduce_scatter_tensor/all_gather_into_tensor/all_to_all_single out of place). Ratios
# compare ringcomm in the same form, so they are like for like.
NATIVE_MODE = {"all_reduce": "ip", "reduce_scatter": "oop", "all_gather": "oop",
               "broadcast": "ip", "reduce": "ip", "all_to_all": "oop"}
ROOT = 0


def bus_factor(op: str, world: int) -> float:
    """nccl-tests' bus-bandwidth factors (busbw = algbw * factor)."""
    if op == "all_reduce":
        return 2.0 * (world - 1) / world
    if op in ("reduce_scatter", "all_gather", "all_to_all"):
        return (world - 1) / world
    if op in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


@dataclass(frozen=True)
class DType:
    name: str
    itemsize: int
    np_name: str | None      # None: numpy has no such dtype (bfloat16)
    is_int: bool


DTYPES = {d.name: DType(d.name, d.itemsize, d.np_name, d.is_int)
          for d in _TABLE_DTYPES if d.name != "bool"}
DTYPE_ALIASES = {"float": "float32", "fp32": "float32", "f32": "float32", "double": "float64",
                 "fp64": "float64", "f64": "float64", "half": "float16", "fp16": "float16",
                 "f16": "float16", "bf16": "bfloat16", "int": "int32", "char": "int8",
                 "long": "int64"}
REDOP_ALIASES = {"product": "prod", "mean": "avg"}


def parse_dtype(name: str) -> DType:
    key = DTYPE_ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)}")
    return DTYPES[key]


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """'8', '1K', '64M', '1G', '4KiB', '256MB' -> bytes (K/M/G are powers of 1024, as in nccl-tests)."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"cannot parse size {text!r} (examples: 8, 1K, 64M, 1G)")
    scale = 1024 ** " kmgt".index(m.group(2).lower() or " ")
    return int(float(m.group(1)) * scale)


def format_size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def size_sweep(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    if minbytes < 1 or maxbytes < minbytes:
        raise ValueError(f"need 1 <= -b ({minbytes}) <= -e ({maxbytes})")
    if factor < 2:
        raise ValueError(f"-f must be >= 2, got {factor}")
    sizes, s = [], minbytes
    while s <= maxbytes:
        sizes.append(s)
        s *= factor
    if sizes[-1] != maxbytes:        # always end at -e (8 B..256 MiB by 4 ends 128M, 256M)
        sizes.append(maxbytes)
    return sizes


def element_count(op: str, nbytes: int, dtype: DType, world: int) -> int:
    """Elements of the full tensor for a nominal size (nccl-tests: the chunked collectives'
    count is rounded down to a multiple of world_size). 0 means "too small for this op"."""
    count = nbytes // dtype.itemsize
    if op in CHUNKED:
        count -= count % world
    return count
