"""The codes ringcomm's layers agree on: dtypes, reduce ops and collectives.

They are written once, in the C header ``csrc/include/ringcomm/abi.h``, which the C++ core, the
bindings and the torch trampoline include; the build copies it into the package
(``ringcomm/_data/include/ringcomm/abi.h``, see setup.py), and this module parses that copy's
X-macro lists when it is imported. The values are part of the C++ core's wire
header, so they are never renumbered; ``tests/test_tables.py`` checks every entry against what
``ringcomm._C`` was compiled with and does with it. Importing this module loads neither the C
extension nor torch.
"""
from __future__ import annotations

import enum
import operator
import os
import re
from dataclasses import dataclass
from typing import Optional

from .errors import InvalidArgumentError

__all__ = ["DType", "DTYPES", "DTYPE_CODES", "DTYPE_NAMES", "ITEMSIZE", "SUPPORTED_DTYPES",
           "FLOATING", "INTEGER", "ReduceOp", "OP_NAMES", "OP_TYPES", "TORCH_OPS", "integer", "op_code", "op_supported",
           "COLL_CODES", "coll_code", "torch_dtype_codes", "DATA_DIR", "ABI_INCLUDE", "ABI_HEADER"]

#: The package data the build copies beside the modules (setup.py, CMakeLists.txt): the header
#: under ``include/``, the torch trampoline's source under ``torch/``.
DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_data")
#: The include folder that holds ``ringcomm/abi.h`` (the torch trampoline's build includes it).
ABI_INCLUDE = os.path.join(DATA_DIR, "include")
ABI_HEADER = os.path.join(ABI_INCLUDE, "ringcomm", "abi.h")


def _parse_abi(path: str) -> tuple[dict, dict]:
    """``({list name: [argument tuples]}, {constant name: value})``: the header's X-macro lists
    (``#define RC_X(X)`` followed by one ``X(...)`` entry per line) with the ``RC_KIND_*`` /
    ``RC_DL_*`` constants evaluated (an argument may be ``A | B``) and string arguments
    unquoted, and those constants."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ImportError(f"ringcomm: the package data {path} is missing: the build copies it "
                          f"there (pip install ., pip install -e ., or the CMake build with "
                          f"CMAKE_LIBRARY_OUTPUT_DIRECTORY set to the package folder)") from None
    names = {m[1]: int(m[2]) for m in re.finditer(r"^#define (RC_(?:KIND|DL)_\w+) (\d+)$", text, re.M)}

    def value(arg: str):
        arg = arg.strip()
        if arg.startswith('"'):
            return arg.strip('"')
        if re.fullmatch(r"-?\d+", arg):
            return int(arg)
        if re.fullmatch(r"[A-Z]\w*", arg) and arg not in names:
            return arg                               # an enumerator name
        out = 0
        for part in arg.split("|"):
            out |= names[part.strip()]
        return out

    lists = {}
    for m in re.finditer(r"^#define (RC_\w+)\(X\)((?:.*\\\n)*.*)$", text, re.M):
        rows = re.findall(r"X\(([^)]*)\)", m[2])
        lists[m[1]] = [tuple(value(a) for a in row.split(",")) for row in rows]
    return lists, names


_ABI, _CONSTANTS = _parse_abi(ABI_HEADER)
_KIND_FLOAT, _KIND_INT, _KIND_BOOL = (_CONSTANTS[f"RC_KIND_{k}"] for k in ("FLOAT", "INT", "BOOL"))


@dataclass(frozen=True)
class DType:
    """One element type: its core code, byte size, and name in numpy (None: numpy has none)."""
    name: str
    code: int
    itemsize: int
    np_name: Optional[str]
    is_float: bool
    is_int: bool


# rc::DType, in code order (RC_DTYPES: enumerator, code, bytes, name, kind, DLPack code). numpy
# has no dtype of DLPack's bfloat kind (ml_dtypes' is accepted by name): np_name None.
DTYPES = tuple(DType(name, code, size, None if dl == _CONSTANTS["RC_DL_BFLOAT"] else name,
                     kind == _KIND_FLOAT, kind == _KIND_INT)
               for _enum, code, size, name, kind, dl in _ABI["RC_DTYPES"])
DTYPE_CODES = {d.name: d.code for d in DTYPES}
DTYPE_NAMES = tuple(d.name for d in DTYPES)          # indexed by code
ITEMSIZE = tuple(d.itemsize for d in DTYPES)          # indexed by code
SUPPORTED_DTYPES = ", ".join(DTYPE_NAMES)
FLOATING = frozenset(d.name for d in DTYPES if d.is_float)
INTEGER = frozenset(d.name for d in DTYPES if d.is_int)


# rc::ReduceOp (RC_REDUCE_OPS: enumerator, code, name, the kinds it reduces).
ReduceOp = enum.IntEnum("ReduceOp", [(name, code) for _enum, code, name, _k in _ABI["RC_REDUCE_OPS"]],
                        module=__name__, qualname="ReduceOp")
ReduceOp.__doc__ = "Reduction operators (codes of rc::ReduceOp)."
_OP_KINDS = {code: kinds for _enum, code, _name, kinds in _ABI["RC_REDUCE_OPS"]}


OP_NAMES = tuple(o.name for o in ReduceOp)           # indexed by code

#: The reduce ops the torch front offers to the synchronous entries (RC_TORCH_OPS), by name: the
#: torch.distributed op of each name means the entry's op of that name on every dtype.
TORCH_OPS = tuple(name for (name,) in _ABI["RC_TORCH_OPS"])

# op (a ReduceOp or its int code) -> code: the per-call lookup, no enum construction. Only
# values of OP_TYPES may be looked up: a bool or a float equals an int key (True would find
# PRODUCT), and an array or a list is not hashable.
_OP_CACHE = {o: int(o) for o in ReduceOp}
_OP_CACHE.update({int(o): int(o) for o in ReduceOp})
OP_TYPES = frozenset((ReduceOp, int))


def integer(v) -> Optional[int]:
    """``v`` as a Python int where it is an integer (a Python or numpy integer, anything with
    ``__index__``), else None: a bool, a float or a string is not one (ranks, op codes)."""
    if isinstance(v, bool):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def op_codes_by_value() -> dict:
    """A new ``{op: code}`` for every ReduceOp member and its int code (the per-call lookup)."""
    return dict(_OP_CACHE)


def op_code(op) -> int:
    """The code of ``op``: a ReduceOp, its int code (a Python or numpy integer) or its
    (case-insensitive) name. InvalidArgumentError for anything else: a bool, a float, an array."""
    code = _OP_CACHE.get(op) if op.__class__ in OP_TYPES else None
    if code is not None:
        return code
    if isinstance(op, str):
        try:
            return int(ReduceOp[op.upper()])
        except KeyError:
            raise InvalidArgumentError(f"ringcomm: unknown reduce op {op!r}; use one of "
                                       f"{', '.join(OP_NAMES)}") from None
    try:
        return int(ReduceOp(integer(op)))
    except ValueError:
        raise InvalidArgumentError(f"ringcomm: unknown reduce op {op!r} ({type(op).__name__}); use a "
                                   f"ringcomm.ReduceOp, its code or its name") from None


def _supported_mask(d: DType) -> int:
    """Bit ``op`` set when op ``op`` reduces dtype ``d``: the header's rule (rc_op_supported),
    an op names the kinds of dtype it reduces."""
    kind = _KIND_FLOAT if d.is_float else _KIND_INT if d.is_int else _KIND_BOOL
    mask = 0
    for code, kinds in _OP_KINDS.items():
        if kinds & kind:
            mask |= 1 << code
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
COLL_CODES = {name: code for _enum, code, name, _reduces in _ABI["RC_COLLECTIVES"]}


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
