"""The bench runner of a compiled peer driver (``oneccl``, ``impi``): the same small interface as
``peers.Runner``, over the driver's C ABI (``driver.h``) through ctypes.

Buffers are numpy arrays (bfloat16 as int16 arrays of its bits: the bench has no int16 dtype, so
an int16 buffer always means bfloat16). Each measurement's call is prepared once (the driver keeps
the pointers, counts and types) and run through a one-argument call, so the per-call cost outside
the library is one ctypes call, as mpi4py's is for the ``mpi`` peer.

The run's configuration carries, per peer, ``cfg["native"][peer]``: the driver's path, the
libraries to load first (by path, with global symbols, so the driver and the libraries' own
``dlopen`` calls resolve to them by soname), the environment (the peer's fixed settings and the
waiting setting under test) and the rendezvous file.
"""
from __future__ import annotations

import ctypes
import functools
import os

import numpy as np

from ..peers import NumpyBuffers, Runner
from ..spec import DType

_ARGS = {
    "rcd_error": ([], ctypes.c_char_p), "rcd_version": ([], ctypes.c_char_p),
    "rcd_init": ([ctypes.c_int, ctypes.c_int, ctypes.c_char_p], ctypes.c_int),
    "rcd_check": ([ctypes.c_char_p] * 3, ctypes.c_char_p),
    "rcd_prepare": ([ctypes.c_char_p] * 3 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                             ctypes.c_int], ctypes.c_long),
    "rcd_run": ([ctypes.c_long], ctypes.c_int), "rcd_barrier": ([], ctypes.c_int),
    "rcd_max": ([ctypes.c_double], ctypes.c_double), "rcd_finalize": ([], ctypes.c_int),
}
LABEL = {"oneccl": "oneCCL", "impi": "Intel MPI"}


def load(spec: dict):
    for k, v in spec["env"].items():
        os.environ[k] = str(v)
    for path in spec["preload"]:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(spec["driver"])
    for name, (args, res) in _ARGS.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


class NativeRunner(Runner, NumpyBuffers):
    def __init__(self, name: str, rank: int, world: int, cfg: dict):
        self.name = name
        self.spec = spec = cfg["native"][name]
        self.lib = lib = load(spec)
        if lib.rcd_init(rank, world, spec.get("rendezvous", "").encode()) != 0:
            raise RuntimeError(f"{name}: cannot start: {self._error()}")
        self.rank, self.world = rank, world

    def _error(self) -> str:
        return (self.lib.rcd_error() or b"").decode(errors="replace")

    def describe(self) -> str:
        return (f"{self.lib.rcd_version().decode(errors='replace').strip()} (driver "
                f"{os.path.basename(self.spec['driver'])}; {self.spec['note']}; "
                f"{settings_text(self.spec['settings'])})")

    def array(self, count, dtype: DType):
        return np.empty(count, dtype=np.int16 if dtype.name == "bfloat16" else dtype.np_name)

    def unsupported(self, op, dtype, redop, mode):
        why = self.lib.rcd_check(op.encode(), dtype.name.encode(), redop.encode())
        return f"{self.name}: {why.decode()}" if why else None

    def op_fn(self, op, mode, inp, out, redop, root):
        dname = "bfloat16" if inp.dtype == np.int16 else inp.dtype.name
        count = out.size if op == "all_gather" else inp.size
        h = self.lib.rcd_prepare(op.encode(), dname.encode(), redop.encode(), inp.ctypes.data,
                                 out.ctypes.data, count, root)
        if h < 0:
            raise RuntimeError(f"{self.name}: {self._error()}")
        return functools.partial(self._run, self.lib.rcd_run, h)

    def _run(self, run, h):
        if run(h) != 0:
            raise RuntimeError(f"{self.name}: {self._error()}")

    def barrier(self):
        if self.lib.rcd_barrier() != 0:
            raise RuntimeError(f"{self.name}: barrier: {self._error()}")

    def agree_max(self, x):
        v = self.lib.rcd_max(float(x))
        if v != v:
            raise RuntimeError(f"{self.name}: max over ranks: {self._error()}")
        return v

    def close(self):
        self.lib.rcd_finalize()


def settings_text(settings: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in settings.items()) or "the library's defaults"
