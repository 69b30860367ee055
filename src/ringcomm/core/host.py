"""The host back end: a Communicator over numpy arrays and torch CPU tensors in shared memory.

The checks are the front's (``front.CommunicatorBase``); this module issues validated buffers to
the C++ core (ringcomm._C), keeps arrays alive while asynchronous work runs, and routes CUDA
arrays to the communicator's CUDA twin (``ringcomm.cuda``), created collectively on first use.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from .. import _C
from . import config
from .arrays import as_buf, is_cuda_array, maybe_cuda
from .cpus import node_ranks, place_rank
from .errors import InvalidArgumentError, MismatchError, PeerFailureError, RingcommError, from_code
from .front import _SUM, CoreBackEnd
from .rendezvous import GenerationSuperseded, exchange_segment_names, forget_segment_name
from .tables import OP_TYPES, op_codes_by_value
from .work import CoreWork

__all__ = ["Communicator", "GeneralPath", "shm_communicator"]

_NDARRAY = np.ndarray
# Reduce op (a ReduceOp or its int code) -> code; the synchronous entry checks the pair against
# the dtype itself. Looked up only for an op of OP_TYPES (tables.py); any other goes the general
# way, which names what is wrong with it.
_OP_CODES = op_codes_by_value()


class Communicator(CoreBackEnd):
    """A group of `world_size` processes on this host. Create with ringcomm.init()."""

    _adapt = staticmethod(as_buf)

    def __init__(self, core, prefix: str, cpu_plan=None):
        self._c = core
        #: Where this rank runs (a ``cpus.BindPlan``: the CPUs, whether ringcomm pinned them and
        #: why not, the local ranks sharing them); None for a communicator made without one.
        self.cpu_plan = cpu_plan
        self.rank: int = core.rank
        self.world_size: int = core.world_size
        self.prefix = prefix
        self._inflight: list = []
        self._lock = threading.Lock()
        self._cuda_comm = None

    # The binding, and its synchronous entries bound once: a bound method made on every call costs
    # about a tenth of a 1 KiB call. Setting _c (tests put a recording wrapper there) binds them anew.
    @property
    def _c(self):
        return self._core

    @_c.setter
    def _c(self, core) -> None:
        self._core = core
        self._sync_all_reduce = core.sync_all_reduce
        self._sync_broadcast = core.sync_broadcast
        self._sync_reduce_scatter = core.sync_reduce_scatter
        self._sync_all_gather = core.sync_all_gather
        self._sync_reduce = core.sync_reduce
        self._sync_all_to_all = core.sync_all_to_all
        self._sync_gather = core.sync_gather
        self._sync_scatter = core.sync_scatter
        self._sync_barrier = core.sync_barrier

    @property
    def cpu_threads(self) -> int:
        """The threads this rank's copies and reductions of large arrays run on."""
        return self._c.cpu_threads

    def _finish(self, w, refs, result):
        work = CoreWork(w, refs, result)
        with self._lock:
            self._inflight = [x for x in self._inflight if not x.is_completed()]
            self._inflight.append(work)
        return work

    # -- the synchronous entries ---------------------------------------------------------------
    # Every synchronous collective with no stream (all_reduce, broadcast, reduce_scatter,
    # all_gather, reduce, all_to_all, gather, scatter, barrier) first offers its arrays to the
    # core's synchronous entry (csrc/comm/sync_entry.h, through the bindings
    # Communicator.sync_<collective>): numpy arrays and torch tensors are described in C++ from
    # their own fields (a tensor through its DLPack capsule) and the one eligibility rule decides;
    # what it takes runs there with the GIL released. What it declines (another layout, dtype, op
    # or device, read-only memory, a root that is not a rank, counts or split sizes that do not
    # fit, all_to_all buffers that overlap) goes the general way, which explains the refusal or
    # routes the call (CUDA arrays). ``general()`` is this communicator without the offers, for a
    # caller whose call the entry has declined already; ``sync_entry_handle()`` hands the same
    # entries to a C extension (the torch c10d trampoline).
    def general(self) -> "GeneralPath":
        # A new view each time (the caller keeps it): cached here it would make a reference
        # cycle, and a dropped communicator would wait for the garbage collector.
        return GeneralPath(self)

    def sync_entry_handle(self) -> tuple:
        return _C._fast_api(), self._c._fast_handle()

    def all_reduce(self, x, op=_SUM, async_op: bool = False, output=None, stream=None):
        if not async_op and stream is None and output is not x:
            opc = _OP_CODES.get(op) if op.__class__ in OP_TYPES else None
            if opc is not None and self._sync_all_reduce(x, output, opc):
                return None
        return CoreBackEnd.all_reduce(self, x, op, async_op, output, stream)

    def broadcast(self, x, root: int = 0, async_op: bool = False, stream=None):
        if not async_op and stream is None and self._sync_broadcast(x, root):
            return None
        return CoreBackEnd.broadcast(self, x, root, async_op, stream)

    def reduce_scatter(self, output, input, op=_SUM, async_op: bool = False, stream=None):
        if not async_op and stream is None:
            opc = _OP_CODES.get(op) if op.__class__ in OP_TYPES else None
            if opc is not None and self._sync_reduce_scatter(output, input, opc):
                return None
        return CoreBackEnd.reduce_scatter(self, output, input, op, async_op, stream)

    def all_gather(self, output, input, async_op: bool = False, stream=None):
        if not async_op and stream is None and self._sync_all_gather(output, input):
            return None
        return CoreBackEnd.all_gather(self, output, input, async_op, stream)

    def reduce(self, x, root: int = 0, op=_SUM, async_op: bool = False, output=None, stream=None):
        if not async_op and stream is None and output is not x:
            opc = _OP_CODES.get(op) if op.__class__ in OP_TYPES else None
            if opc is not None and self._sync_reduce(x, output, opc, root):
                return None
        return CoreBackEnd.reduce(self, x, root, op, async_op, output, stream)

    def all_to_all(self, output, input, output_splits=None, input_splits=None, async_op: bool = False,
                   stream=None):
        if (not async_op and stream is None
                and self._sync_all_to_all(output, input, output_splits, input_splits)):
            return None
        return CoreBackEnd.all_to_all(self, output, input, output_splits, input_splits, async_op, stream)

    def gather(self, output, input, root: int = 0, async_op: bool = False, stream=None):
        if not async_op and stream is None and self._sync_gather(output, input, root):
            return None
        return CoreBackEnd.gather(self, output, input, root, async_op, stream)

    def scatter(self, output, input=None, root: int = 0, async_op: bool = False, stream=None):
        if not async_op and stream is None and self._sync_scatter(output, input, root):
            return None
        return CoreBackEnd.scatter(self, output, input, root, async_op, stream)

    def barrier(self, async_op: bool = False, stream=None):
        if not async_op and stream is None and self._sync_barrier():
            return None
        return CoreBackEnd.barrier(self, async_op, stream)

    # -- issuing (arguments validated by CommunicatorBase) ------------------------------------
    def _issue_all_reduce(self, bi, bo, opc, async_op, stream):
        return self._c.all_reduce(bi.addr, bo.addr, bi.count, bi.code, opc, async_op)

    def _issue_reduce_scatter(self, bi, bo, opc, async_op, stream):
        return self._c.reduce_scatter(bi.addr, bo.addr, bi.count, bi.code, opc, async_op)

    def _issue_all_gather(self, bi, bo, async_op, stream):
        return self._c.all_gather(bi.addr, bo.addr, bi.count, bo.count, bi.code, async_op)

    def _issue_broadcast(self, b, root, async_op, stream):
        return self._c.broadcast(b.addr, b.count, b.code, root, async_op)

    def _issue_reduce(self, bi, bo, opc, root, async_op, stream):
        return self._c.reduce(bi.addr, bo.addr if bo is not None else 0, bi.count, bi.code, opc, root,
                              async_op)

    def _issue_barrier(self, async_op, stream):
        return self._c.barrier(async_op)

    def _issue_all_to_all(self, bi, bo, sc, rc, async_op, stream):
        return self._c.all_to_all(bi.addr, bo.addr, sc, rc, bi.code, async_op)

    def _issue_gather(self, bi, bo, root, async_op, stream):
        return self._c.gather(bi.addr, bo.addr if bo is not None else 0, bi.count, bi.code, root, async_op)

    def _issue_scatter(self, bi, bo, root, async_op, stream):
        return self._c.scatter(bi.addr if bi is not None else 0, bo.addr, bo.count, bo.code, root, async_op)

    def _issue_send(self, b, peer, tag, async_op, stream):
        return self._c.send(b.addr, b.nbytes, peer, tag, async_op)

    def _issue_recv(self, b, peer, tag, async_op, stream):
        return self._c.recv(b.addr, b.nbytes, peer, tag, async_op)

    # -- routing of CUDA arrays -------------------------------------------------------------------
    def _route(self, coll, a, b=None):
        """This communicator, or its CUDA twin when an array lives on a CUDA device (the test
        runs on every call: ~0.07 us for numpy arrays, ~0.15 us for torch tensors)."""
        if ((type(a) is _NDARRAY or a is None or not maybe_cuda(a))
                and (b is None or type(b) is _NDARRAY or not maybe_cuda(b))):
            return self
        return self._cuda_twin(coll, a, b)

    def _cuda_twin(self, coll, *arrays):
        """The CUDA communicator (ringcomm.cuda) over the same ranks. Created on first use through
        this communicator's own collectives, so every rank must route the same call (pass CUDA
        arrays on every rank). Point-to-point calls (coll None) raise instead of rejecting: they
        have no header exchange."""
        cc = self._cuda_comm
        if cc is not None and not cc.closed:
            return cc
        try:
            if not all(is_cuda_array(a) for a in arrays if a is not None):
                raise InvalidArgumentError(f"ringcomm: {coll or 'send/recv'}: some arrays are on a CUDA device "
                                           f"and some in host memory; pass all of them on one device")
            from .. import cuda
            cuda.require()  # UnsupportedError ("CUDA unavailable: ...") before anything else
            dev = cuda.as_cuda_buf(next(a for a in arrays if a is not None)).device
            if coll is None:
                raise InvalidArgumentError(
                    "ringcomm: send/recv of CUDA arrays needs the CUDA communicator, which is created "
                    "(collectively) by the first collective on CUDA arrays; run one first (e.g. "
                    "barrier-like all_reduce of a 1-element CUDA tensor) or use ringcomm.cuda.init()")
            self._check_open()
            cc = cuda.from_communicator(self, device=None if dev < 0 else dev)
        except RingcommError as e:
            if coll is None:
                raise
            self._reject(coll, e)
        self._cuda_comm = cc
        return cc

    # -- lifetime --------------------------------------------------------------------------
    def close(self):
        """Finish queued work, release the shared memory (and the CUDA twin's). Idempotent."""
        if self._cuda_comm is not None:
            self._cuda_comm.close()
        self._c.close()
        self._inflight = []

    # -- recovery ------------------------------------------------------------------------------
    def abort(self, reason: str = "") -> None:
        self._c.abort(str(reason))

    def errored(self):
        e = self._c.errored()
        return None if e is None else from_code(*e)

    def set_timeout(self, seconds: float) -> None:
        self._c.set_timeout(float(seconds))

    def __repr__(self):
        state = "closed" if self._c.closed else "open"
        return f"<ringcomm.Communicator rank={self.rank} world_size={self.world_size} {state}>"


class GeneralPath:
    """A host communicator whose collectives (all_reduce, broadcast, reduce_scatter, all_gather,
    reduce, all_to_all, gather, scatter, barrier) take the general path (``CoreBackEnd``'s:
    validate, route, issue) without the synchronous entry's offer (``Communicator.general()``);
    every other attribute is the communicator's own."""

    _COLLECTIVES = ("all_reduce", "broadcast", "reduce_scatter", "all_gather", "reduce", "all_to_all",
                    "gather", "scatter", "barrier")
    __slots__ = ("communicator",) + _COLLECTIVES

    def __init__(self, communicator: Communicator):
        self.communicator = communicator
        for name in self._COLLECTIVES:
            setattr(self, name, getattr(CoreBackEnd, name).__get__(communicator))

    def general(self) -> "GeneralPath":
        return self

    def __getattr__(self, name):
        return getattr(self.communicator, name)

    def __repr__(self):
        return f"<general path of {self.communicator!r}>"


def shm_communicator(rank: int, world_size: int, store, prefix: str, timeout: float,
                     abandoned=None, knobs=None) -> Communicator:
    """The shared-memory Communicator of `world_size` ranks on this host: create this rank's
    segment, publish its name under `{prefix}/shm/{rank}`, map every peer's (the segments are
    unlinked as soon as all ranks have mapped them). ``abandoned``: see
    ``rendezvous.exchange_segment_names`` (init's generations). ``knobs``: the caller's
    ``config.read()`` (read here when None), which the placement and the C++ core both use."""
    key = f"{prefix}/shm/{rank}"
    started = time.time()
    core = None
    published = False
    try:
        # Placement first: threads started from here on inherit the mask, and the segment's pages
        # are first touched (allocated) by this rank on its own CPUs, hence its NUMA node.
        if knobs is None:
            knobs = config.read()
        plan, threads, min_bytes = place_rank(rank, world_size, knobs)
        core = _C.Communicator(rank, world_size, timeout, knobs)
        # The wait policy counts the ranks on this rank's CPUs from every rank's affinity mask; the
        # plan's count adds what the masks of this group cannot show (other groups' ranks), but
        # only where ringcomm pinned the ranks (otherwise it is a guess).
        core.set_cpus(threads, min_bytes, plan.describe(threads, min_bytes),
                      plan.ranks_sharing if plan.applied else 0, node_ranks(rank, world_size))
        name = core.create()
        if world_size == 1:
            names = [name]
        else:
            # The profile's key goes first: a peer reads it only after connect(), which needs this
            # rank's segment name, published next; so it is this run's value, never a stale one.
            store.set(f"{prefix}/profile/{rank}", f"{core.profile_hash} {core.profile_source}")
            published = True  # exchange_segment_names publishes first
            aware = _FailureAware(store, started)
            names = exchange_segment_names(aware, prefix, rank, world_size, name, timeout, abandoned)
        try:
            core.connect(names)
        except PeerFailureError:
            # A peer whose init failed wrote its marker before releasing its segment: its reason
            # is the cause, this rank's missing segment (or the peer's abort) only the effect.
            cause = None if world_size == 1 else _peer_marker(aware, prefix, rank, world_size)
            if cause is None:
                raise
            raise cause
        if world_size > 1:
            _check_profiles(store, prefix, rank, world_size)
    except BaseException as e:
        # Tell the peers at once instead of letting them wait out the timeout: a failure marker in
        # place of the segment name (peers still reading keys raise; the segment is unlinked
        # below, so a name read earlier reads as stale and is read again), and an abort posted in
        # the segment (peers that mapped it raise within a liveness slice).
        reason = f"rank {rank} failed during init: {type(e).__name__}: {e}"
        # A superseded generation is left without a marker: the peers still waiting in it find
        # it abandoned themselves and move to the newest one; a marker would fail them instead.
        if world_size > 1 and not isinstance(e, GenerationSuperseded):
            try:
                store.set(key, f"{_FAILED}{time.time():.3f} {reason}")
            except BaseException:  # noqa: BLE001 - the original error is the one to raise
                pass
        if core is not None:
            if published:
                core.abort(reason)
            core.close()
        raise
    if world_size > 1:
        # connect() returned: every peer has mapped this rank's segment, so its key is read.
        forget_segment_name(store, prefix, rank)
    return Communicator(core, prefix, plan)


def _check_profiles(store, prefix: str, rank: int, world_size: int) -> None:
    """Every rank's cost-model profile (RINGCOMM_PROFILE's hash and path, published before its
    segment name) must be the same: the all_reduce algorithm is the model's choice, so ranks whose
    profiles differ could choose differently for one call. Every rank reads every rank's key and
    so raises the same MismatchError."""
    seen = []
    for r in range(world_size):
        v = store.get(f"{prefix}/profile/{r}")
        seen.append((v.decode() if isinstance(v, (bytes, bytearray)) else str(v)).partition(" "))
    if len({h for h, _, _ in seen}) > 1:
        listed = ", ".join(f"rank {r}: {h} ({src})" for r, (h, _, src) in enumerate(seen))
        raise MismatchError(f"ringcomm: init: the ranks loaded different cost-model profiles (RINGCOMM_PROFILE; "
                            f"hash and source per rank: {listed}); every rank of a communicator must load the "
                            f"same profile file (python -m ringcomm.apps.tune writes one)")


_FAILED = "!failed: "
_MARKER_SLACK_S = 60.0  # ranks of one run start within this of each other


def _peer_marker(store: "_FailureAware", prefix: str, rank: int, world_size: int):
    """The PeerFailureError of the first peer whose key holds a fresh failure marker now, else
    None (never waits: only a store with ``check`` is asked)."""
    if store.check is None:
        return None
    for r in range(world_size):
        key = f"{prefix}/shm/{r}"
        try:
            if r != rank and store.check([key]):
                store.get(key)
        except PeerFailureError as e:
            return e
        except Exception:  # noqa: BLE001 - the store's own failure: keep the original error
            return None
    return None


class _FailureAware:
    """The store as exchange_segment_names sees it: a peer's failure marker in place of its
    segment name raises PeerFailureError at once. A marker written more than _MARKER_SLACK_S
    before this rank's init started is an earlier run's (a reused store): it reads as a stale
    name, which the peer's own name replaces."""

    def __init__(self, store, started: float):
        self._store = store
        self._since = started - _MARKER_SLACK_S
        self.check = getattr(store, "check", None)  # the poll's existence test, where the store has one

    def set(self, key, value):
        self._store.set(key, value)

    def get(self, key):
        v = self._store.get(key)
        text = v.decode(errors="replace") if isinstance(v, (bytes, bytearray)) else str(v)
        if text.startswith(_FAILED):
            stamp, _, reason = text[len(_FAILED):].partition(" ")
            try:
                fresh = float(stamp) >= self._since
            except ValueError:
                fresh = False
            if fresh:
                raise PeerFailureError(f"ringcomm: init: {reason}")
        return v
