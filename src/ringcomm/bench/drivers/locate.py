"""Where the peers' MPI and oneCCL files are, by explicit path, never by ``PATH`` order.

Each file is found through the pip distribution that installed it (its ``RECORD``) and accepted
only if its contents still hash to what that distribution recorded. The check matters because
wheels cannot install into anything but the environment's own ``bin/``, ``lib/`` and ``include/``,
and ``mpich`` and ``impi-rt`` (which ``oneccl-cpu`` requires) both ship ``bin/mpiexec``,
``bin/mpiexec.hydra``, ``bin/hydra_pmi_proxy``, ``lib/libmpi.so`` and ``lib/libmpi.so.12``
(and ``mpich`` and ``impi-devel`` both ``include/mpi.h``): whichever was installed last owns
those paths. What each peer needs:

- ``mpi`` (MPICH through mpi4py): MPICH's ``lib/libmpi.so.12`` (no other copy exists, so when
  Intel MPI's overwrote it the peer cannot run, and says how to restore it) and a launcher of
  MPICH's: ``bin/mpiexec.hydra``, or ``bin/mpiexec.gforker``, which only MPICH ships;
- ``impi``: Intel MPI's ``lib/libmpi.so.12.0.0`` (a copy under a name only Intel MPI ships), its
  ``lib/libfabric.so.1`` and providers, and a PMI launcher: Intel MPI's ``mpiexec.hydra`` with
  its proxies, else MPICH's (both speak the same PMI wire protocol);
- ``oneccl``: ``lib/libccl.so.1``, its headers (``oneccl-cpu-devel``) and Intel MPI's libfabric.

A distribution that is not installed at all is not an error here: ``None`` lets the caller
fall back (the ``mpi`` peer then uses whatever ``mpiexec`` and MPI mpi4py find, as before).
"""
from __future__ import annotations

import base64
import functools
import hashlib
import importlib.metadata as md
import os
from dataclasses import dataclass, field


class Missing(Exception):
    """A peer's file is absent or not the one its package installed; the message says why."""


@functools.lru_cache(maxsize=None)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def installed(dist: str) -> md.Distribution | None:
    try:
        return md.distribution(dist)
    except md.PackageNotFoundError:
        return None


def version(dist: str) -> str | None:
    d = installed(dist)
    return d.version if d is not None else None


def dist_file(dist: str, rel: str) -> str:
    """The absolute path of ``rel`` (e.g. ``lib/libmpi.so.12``, relative to the environment's
    prefix) as installed by ``dist``, checked against its recorded hash; raises ``Missing``."""
    d = installed(dist)
    if d is None:
        raise Missing(f"{dist} is not installed")
    for f in d.files or ():
        if ".." not in f.parts:          # the package's own modules, not its data files
            continue
        path = os.path.normpath(str(d.locate_file(f)))
        if not path.endswith(os.sep + rel):
            continue
        if not os.path.isfile(path):
            raise Missing(f"{dist}'s {rel} is missing ({path})")
        if f.hash is not None and f.hash.mode == "sha256":
            st = os.stat(path)
            if _digest(path, st.st_size, st.st_mtime_ns) != f.hash.value:
                raise Missing(f"{path} is no longer {dist} {d.version}'s (another package "
                              f"installed the same path after it)")
        return path
    raise Missing(f"{dist} {d.version} installed no {rel}")


def first(dist_rels: list[tuple[str, tuple[str, ...]]]) -> tuple[str, list[str]]:
    """The first (dist, files) whose files are all intact: (dist, their paths). Raises
    ``Missing`` with every reason when none is."""
    reasons = []
    for dist, rels in dist_rels:
        try:
            return dist, [dist_file(dist, r) for r in rels]
        except Missing as e:
            reasons.append(str(e))
    raise Missing("; ".join(reasons))


@dataclass
class Install:
    """What one peer's ranks load and how they are started (JSON-able: it travels in the
    bench's configuration)."""
    version: str
    preload: list[str] = field(default_factory=list)   # loaded with global symbols, in order
    env: dict = field(default_factory=dict)            # set in the ranks' environment
    launcher: list[str] = field(default_factory=list)  # argv prefix before "-n N"
    launcher_note: str = ""
    include: list[str] = field(default_factory=list)   # compile: -I
    link: list[str] = field(default_factory=list)      # compile: libraries linked by path
    headers: list[str] = field(default_factory=list)   # whose contents key the cached build


_RESTORE_MPICH = ("reinstall MPICH after it: pip install --force-reinstall --no-deps "
                  "mpich=={v}; Intel MPI keeps its copy lib/libmpi.so.12.0.0")


def mpich() -> Install | None:
    """MPICH from the ``mpich`` wheel, or None when that wheel is not installed."""
    v = version("mpich")
    if v is None:
        return None
    try:
        lib = dist_file("mpich", "lib/libmpi.so.12")
    except Missing as e:
        raise Missing(f"{e}: {_RESTORE_MPICH.format(v=v)}") from None
    dist, (launcher,) = first([("mpich", ("bin/mpiexec.hydra",)),
                               ("mpich", ("bin/mpiexec.gforker",))])
    # mpi4py dlopens MPI4PY_LIBMPI first; MPICH's shared objects then resolve to it by soname.
    # MPICH's libmpi finds its libfabric by run path $ORIGIN before $ORIGIN/mpich, and $ORIGIN
    # holds Intel MPI's older libfabric.so.1 when impi-rt is installed: LD_LIBRARY_PATH, searched
    # before any run path, names MPICH's own.
    fabric_dir = os.path.dirname(dist_file("mpich", "lib/mpich/libfabric.so.1"))
    search = os.pathsep.join([fabric_dir] + [p for p in os.environ.get(
        "LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    return Install(version=f"MPICH {v}", env={"MPI4PY_LIBMPI": lib, "LD_LIBRARY_PATH": search},
                   launcher=[launcher], launcher_note=os.path.basename(launcher))


def _intel_fabric() -> tuple[str, dict]:
    fabric = dist_file("impi-rt", "lib/libfabric.so.1")
    shm = dist_file("impi-rt", "lib/libshm-fi.so")
    return fabric, {"FI_PROVIDER_PATH": os.path.dirname(shm)}


def impi() -> Install:
    v = version("impi-rt")
    if v is None:
        raise Missing("impi-rt is not installed (pip install 'ringcomm[peers]')")
    lib = dist_file("impi-rt", "lib/libmpi.so.12.0.0")
    fabric, env = _intel_fabric()
    try:
        dist, paths = first([("impi-rt", ("bin/mpiexec.hydra", "bin/hydra_pmi_proxy",
                                          "bin/hydra_bstrap_proxy")),
                             ("mpich", ("bin/mpiexec.hydra", "bin/hydra_pmi_proxy"))])
        note = "Intel MPI's mpiexec.hydra" if dist == "impi-rt" else \
            "MPICH's mpiexec.hydra (Intel MPI's was overwritten by the mpich wheel)"
    except Missing:
        dist, paths = first([("mpich", ("bin/mpiexec.gforker",))])
        note = "MPICH's mpiexec.gforker (both packages' mpiexec.hydra were overwritten)"
    try:
        hdist, (header,) = first([("impi-devel", ("include/mpi.h",)),
                                  ("mpich", ("include/mpi.h",))])
    except Missing as e:
        raise Missing(f"no MPICH-ABI mpi.h to compile the driver against ({e}); "
                      f"pip install 'ringcomm[peers]'") from None
    if hdist != "impi-devel":
        note += ("; compiled against MPICH's mpi.h (impi-devel's was overwritten), which names "
                 "no bfloat16 or float16 of Intel MPI's")
    return Install(version=f"Intel MPI {v}", preload=[fabric, lib], env=env,
                   launcher=[paths[0]], launcher_note=note,
                   include=[os.path.dirname(header)], headers=[header])


def oneccl() -> Install:
    v = version("oneccl-cpu")
    if v is None:
        raise Missing("oneccl-cpu is not installed (pip install 'ringcomm[peers]')")
    lib = dist_file("oneccl-cpu", "lib/libccl.so.1")
    header = dist_file("oneccl-cpu-devel", "include/oneapi/ccl.hpp")
    fabric, env = _intel_fabric()
    return Install(version=f"oneCCL {v}", preload=[fabric, lib], env=env,
                   include=[os.path.dirname(os.path.dirname(header))], link=[lib],
                   headers=[header, os.path.join(os.path.dirname(header), "ccl", "config.h")])


LOCATE = {"impi": impi, "oneccl": oneccl}
