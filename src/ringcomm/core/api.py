"""The plain ringcomm API: ``init()`` and the default communicator.

``init()`` returns the host shared-memory Communicator (``host.py``) when every rank sits on this
node, and a HierarchicalCommunicator (``hier/``) when the ranks span several nodes; both have the
methods of ``front.CommunicatorBase``. CUDA arrays given to either are routed to ringcomm.cuda.
"""
from __future__ import annotations

import itertools
import time
from typing import Optional

from . import config
from .errors import RingcommError
from .front import CommunicatorBase, check_splits
from .host import Communicator, shm_communicator
from . import rendezvous as rdzv
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
    ``timeout`` (seconds) bounds every wait (default RINGCOMM_TIMEOUT or 300); a peer that does
    not arrive within it raises ringcomm.TimeoutError naming the ranks that never arrived.
    ``prefix`` namespaces the store keys. Without it, on a store with ``add`` and ``check``
    (torch's stores, tcp://, env://, file://) the ranks meet in a generation kept on the store:
    every rank must create its communicators in the same order, and survivors of a failure that
    call ``init()`` again meet a replacement process calling it for the first time
    (``rendezvous.claim_generation``); on a store with only set/get the prefix numbers the
    communicators this process created. A sub-communicator of a larger launched job must pass a
    prefix (``rendezvous.default_prefix``).
    The first communicator created becomes the default one used by ringcomm.all_reduce(...).
    """
    global _default
    knobs = config.read()  # every layer below takes its knobs from this one reading
    rank, world_size, t = init_args("ringcomm.init", rank, world_size, timeout, knobs)
    if prefix is None and world_size > 1:
        rdzv.refuse_sub_communicator_default(rank, world_size)
    store = resolve_store(store, init_method, rank, world_size, t)
    if world_size == 1:
        # A single rank meets nobody through the store: it takes no number and no generation.
        comm = shm_communicator(rank, world_size, store, prefix or "ringcomm/single", t, knobs=knobs)
    elif prefix is not None:
        comm = _connect(rank, world_size, store, prefix, t, t, knobs)
    elif rdzv.supports_generations(store):
        comm = _join_generation(rank, world_size, store, t, knobs)
    else:
        comm = _connect(rank, world_size, store, default_prefix(next(_counter), rank, world_size), t, t, knobs)
    if _default is None or _default.closed:
        _default = comm
    return comm


def _connect(rank, world_size, store, prefix, timeout, wait_s, knobs, abandoned=None) -> CommunicatorBase:
    """Wait (``wait_s``) until every rank arrived under ``prefix``, then build the communicator:
    the two-level one when the ranks span several nodes (one store round trip), else shared
    memory. ``timeout`` bounds the communicator's waits; ``abandoned`` (init's generations) is
    called while a key is missing and raises when the generation cannot complete; ``knobs``:
    init's ``config.read()``."""
    rdzv.await_arrivals(store, prefix, rank, world_size, wait_s, abandoned, timeout)
    from .. import hier
    comm = hier.from_init(rank, world_size, store, prefix, timeout, knobs)
    if comm is None:
        comm = shm_communicator(rank, world_size, store, prefix, timeout, abandoned, knobs)
    rdzv.forget_arrival(store, prefix, rank)
    return comm


def _join_generation(rank, world_size, store, timeout, knobs) -> CommunicatorBase:
    """Claim a generation on the store and connect in it; while a needed key is missing and a
    later generation was opened, claim the newest one and wait there instead, all within
    ``timeout`` from now. A failure here closes the generation: the ranks waiting in it raise the
    same cause, and no later process joins it."""
    root = rdzv.generation_root()
    deadline = time.monotonic() + timeout
    while True:
        g = rdzv.claim_generation(store, root, rank)
        try:
            return _connect(rank, world_size, store, f"{root}/{g}", timeout,
                            max(deadline - time.monotonic(), 0.001), knobs,
                            lambda g=g: rdzv.check_generation(store, root, g, rank))
        except rdzv.GenerationSuperseded:
            continue
        except BaseException as e:
            rdzv.close_generation(store, root, g, e, rank)
            raise


def get_default() -> CommunicatorBase:
    if _default is None or _default.closed:
        raise RingcommError("ringcomm: no default communicator; call ringcomm.init() first")
    return _default


def set_default(comm: CommunicatorBase) -> None:
    global _default
    _default = comm
