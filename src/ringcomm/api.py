"""The plain ringcomm API: ``init()`` and the default communicator.

``init()`` returns the host shared-memory Communicator (``host.py``) when every rank sits on this
node, and a HierarchicalCommunicator (``hier/``) when the ranks span several nodes; both have the
methods of ``front.CommunicatorBase``. CUDA arrays given to either are routed to ringcomm.cuda.
"""
from __future__ import annotations

import itertools
from typing import Optional

from .errors import RingcommError
from .front import CommunicatorBase, check_splits
from .host import Communicator, shm_communicator
from .rendezvous import default_prefix, init_args, resolve_store
from .tables import ReduceOp
from .work import Work

__all__ = ["ReduceOp", "Communicator", "CommunicatorBase", "Work", "init", "get_default",
           "set_default", "shm_communicator", "check_splits"]

_default: Optional[CommunicatorBase] = None
_counter = itertools.count()


def init(rank: Optional[int] = None, world_size: Optional[int] = None, *, store=None,
         init_method: Optional[str] = None, timeout: Optional[float] = None,
         prefix: Optional[str] = None) -> CommunicatorBase:
    """Create a communicator.

    - ``init()``: from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun's environment).
    - ``init(rank=r, world_size=n, store=store)``: any store with set/get (torch's stores work).
    - ``init(rank=r, world_size=n, init_method="file:///tmp/rdzv")``: no torch needed.
    ``timeout`` (seconds) bounds every wait (default RINGCOMM_TIMEOUT or 300). ``prefix``
    namespaces the store keys (default: one per multi-rank communicator created in this process,
    so every rank must create its communicators in the same order; a sub-communicator of a larger
    launched job must pass one, see ``rendezvous.default_prefix``).
    The first communicator created becomes the default one used by ringcomm.all_reduce(...).
    """
    global _default
    rank, world_size, t = init_args("ringcomm.init", rank, world_size, timeout)
    if prefix is None:
        # A single rank meets nobody through the store: it takes no number, so that processes
        # which create different numbers of 1-rank communicators still number the others alike.
        prefix = "ringcomm/single" if world_size == 1 else default_prefix(next(_counter), rank, world_size)
    store = resolve_store(store, init_method, rank, world_size, t)
    comm = None
    if world_size > 1:
        # Ranks spanning several nodes get a two-level communicator (one store round trip).
        from . import hier
        comm = hier.from_init(rank, world_size, store, prefix, t)
    if comm is None:
        comm = shm_communicator(rank, world_size, store, prefix, t)
    if _default is None or _default.closed:
        _default = comm
    return comm


def get_default() -> CommunicatorBase:
    if _default is None or _default.closed:
        raise RingcommError("ringcomm: no default communicator; call ringcomm.init() first")
    return _default


def set_default(comm: CommunicatorBase) -> None:
    global _default
    _default = comm
