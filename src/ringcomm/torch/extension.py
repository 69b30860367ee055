"""The c10d Backend trampoline (``bindings/torch/trampoline.cpp``, which the build copies into the
package as ``ringcomm/_data/torch/trampoline.cpp``), built just in time with
``torch.utils.cpp_extension`` and cached under ``TORCH_EXTENSIONS_DIR`` (default
``~/.cache/torch_extensions``). It includes ``ringcomm/abi.h`` (the codes and the C ABI, copied
into ``ringcomm/_data/include``: ``ringcomm.core.tables.ABI_INCLUDE``). The extension's name carries
the torch version, the Python tag and a hash of the source, the header and the flags, so a torch
upgrade or a changed source or header builds a new one and never loads a stale one. Ranks that
build at once are serialized by cpp_extension's lock on the build directory; once built, loading imports the cached library directly (no compiler needed).

``python -m ringcomm.torch --build`` builds it ahead of time and prints where it is.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import threading

from ringcomm.core.tables import ABI_HEADER as HEADER
from ringcomm.core.tables import ABI_INCLUDE as INCLUDE
from ringcomm.core.tables import DATA_DIR

__all__ = ["SOURCE", "OFFER_POINT", "INCLUDE", "HEADER", "CFLAGS", "extension_name", "build_directory", "load"]

SOURCE = os.path.join(DATA_DIR, "torch", "trampoline.cpp")
# The header SOURCE includes (beside it): its bytes are part of the extension's name too.
OFFER_POINT = os.path.join(DATA_DIR, "torch", "offer_point.h")
# -O1 and no debug info keep the first build short (the trampoline only forwards calls).
CFLAGS = ["-O1", "-g0"]

_lock = threading.Lock()
_module = None


def extension_name() -> str:
    import torch
    h = hashlib.sha256()
    for path in (SOURCE, OFFER_POINT, HEADER):
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(" ".join(CFLAGS).encode())
    digest = h.hexdigest()[:10]
    version = re.sub(r"[^0-9A-Za-z]+", "_", torch.__version__)
    return (f"ringcomm_c10d_torch{version}_cp{sys.version_info.major}{sys.version_info.minor}_"
            f"{digest}")


def build_directory() -> str:
    from torch.utils.cpp_extension import _get_build_directory
    return _get_build_directory(extension_name(), verbose=False)


def _import_built(name: str, directory: str):
    """The cached library, or None when it has not been built."""
    from importlib.machinery import EXTENSION_SUFFIXES
    for suffix in [".so", *EXTENSION_SUFFIXES]:
        path = os.path.join(directory, name + suffix)
        if os.path.exists(path):
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    return None


def loaded() -> bool:
    """Whether the module is loaded in this process (its op, torch.ops.ringcomm.all_reduce_, is
    registered then); never loads it."""
    return _module is not None


def load(verbose: bool = False):
    """The trampoline module (attribute ``Trampoline``), built first if it is not cached."""
    global _module
    with _lock:
        if _module is None:
            import torch.distributed  # noqa: F401 - registers the types the module refers to
            name = extension_name()
            directory = build_directory()
            module = _import_built(name, directory)
            if module is None:
                from torch.utils.cpp_extension import load as jit_load
                module = jit_load(name=name, sources=[SOURCE], extra_cflags=CFLAGS,
                                  extra_include_paths=[INCLUDE], build_directory=directory,
                                  verbose=verbose)
            _module = module
        return _module
