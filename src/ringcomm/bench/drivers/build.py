"""The peers' drivers (``oneccl.cpp``, ``impi.cpp`` beside this file), compiled on first use with
the system's C++ compiler and cached under the user's cache directory
(``$XDG_CACHE_HOME/ringcomm/bench-drivers``, default ``~/.cache/...``), keyed by the sources'
and the library headers' contents, the library's version and the compile command: a new source, library or compiler flag
builds anew, anything else loads the cached object. The object is written under a temporary name
and renamed into place, so ranks or runs building at once never load a partial one.
"""
from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile

from .locate import Install

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = {"oneccl": "oneccl.cpp", "impi": "impi.cpp"}
HEADER = "driver.h"


class BuildError(RuntimeError):
    pass


def cache_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ringcomm", "bench-drivers")


def compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")


def command(peer: str, inst: Install, cxx: str, out: str) -> list[str]:
    cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-I" + HERE]
    cmd += ["-I" + d for d in inst.include]
    cmd += [os.path.join(HERE, SOURCES[peer]), "-o", out]
    for lib in inst.link:        # by path, with the directory as run path for its own needs
        cmd += [lib, "-Wl,-rpath," + os.path.dirname(lib)]
    return cmd


def target(peer: str, inst: Install, cxx: str) -> str:
    """Where the driver built from these sources, headers, library and command is cached."""
    h = hashlib.sha256()
    for path in [os.path.join(HERE, SOURCES[peer]), os.path.join(HERE, HEADER)] + inst.headers:
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(inst.version.encode())
    h.update(" ".join(command(peer, inst, cxx, "OUT")).encode())
    return os.path.join(cache_root(), f"{peer}-{h.hexdigest()[:16]}.so")


def driver(peer: str, inst: Install) -> str:
    """The compiled driver's path (built now if not cached); raises ``BuildError``."""
    cxx = compiler()
    if cxx is None:
        raise BuildError("no C++ compiler (set CXX or install g++)")
    path = target(peer, inst, cxx)
    root = os.path.dirname(path)
    if os.path.exists(path):
        return path
    os.makedirs(root, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{peer}-", suffix=".so", dir=root)
    os.close(fd)
    cmd = command(peer, inst, cxx, tmp)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if "error" in ln] or \
                proc.stderr.splitlines() or ["(no output)"]
            raise BuildError(f"compiling the {peer} driver failed: {lines[0][:200]} "
                             f"(command: {' '.join(shlex.quote(c) for c in cmd)})")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
