"""The host back end: a Communicator over numpy arrays and torch CPU tensors in shared memory.

The checks are the front's (``front.CommunicatorBase``); this module issues validated buffers to
the C++ core (ringcomm._C), keeps arrays alive while asynchronous work runs, and routes CUDA
arrays to the communicator's CUDA twin (``ringcomm.cuda``), created collectively on first use.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from . import _C
from .arrays import TORCH_FAST, as_buf, is_cuda_array, maybe_cuda, torch_in_place
from .errors import InvalidArgumentError, PeerFailureError, RingcommError, from_code
from .front import _SUM, CoreBackEnd
from .rendezvous import exchange_segment_names, forget_segment_name
from .tables import OPS_FOR_DTYPE
from .work import CoreWork

__all__ = ["Communicator", "shm_communicator"]

_NDARRAY = np.ndarray
_TORCH = TORCH_FAST   # [torch.Tensor, ...] once torch is in use (arrays.py)
# Reduce op (as the API accepts it) -> code, for the dtypes' common ops; the C++ fast path
# checks the pair against the dtype itself.
_OP_CODES = dict(OPS_FOR_DTYPE[0])


class Communicator(CoreBackEnd):
    """A group of `world_size` processes on this host. Create with ringcomm.init()."""

    _adapt = staticmethod(as_buf)

    def __init__(self, core, prefix: str):
        self._c = core
        self.rank: int = core.rank
        self.world_size: int = core.world_size
        self.prefix = prefix
        self._inflight: list = []
        self._lock = threading.Lock()
        self._cuda_comm = None
        # The torch extension's TensorCalls on this communicator (trampoline.cpp), False where
        # it is not built or the communicator closed, None until the first torch tensor asks.
        self._tensor_calls = None

    def _load_tensor_calls(self):
        """TensorCalls of the c10d trampoline if that is built (``python -m ringcomm.torch
        --build``, or any torch backend use, builds it; this never does), else False."""
        tc = False
        if not self._c.closed:
            from .torch import extension
            mod = extension.load_built()
            if mod is not None and hasattr(mod, "TensorCalls"):
                tc = mod.TensorCalls(_C._fast_api(), self._c._fast_handle())
                tc = tc if tc.on else False
        self._tensor_calls = tc
        return tc

    def _finish(self, w, refs, result):
        work = CoreWork(w, refs, result)
        with self._lock:
            self._inflight = [x for x in self._inflight if not x.is_completed()]
            self._inflight.append(work)
        return work

    # -- the torch backend's entry ------------------------------------------------------------
    def _fast_all_reduce_entry(self):
        """The torch backend's small-message path: a callable ``f(in_addr, out_addr, count,
        dtype_code, op_code, async_op)`` that issues an all_reduce of already-validated memory
        (contiguous, on the CPU, a dtype and op of ``ringcomm.tables``) straight to the core,
        with no per-call Python layer. The core still exchanges the header (ranks that disagree
        raise MismatchError) and raises ClosedError once the communicator is closed. Fetched
        once per process group; the caller validates every call itself."""
        return self._c.all_reduce

    def all_reduce(self, x, op=_SUM, async_op: bool = False, output=None, stream=None):
        # A synchronous all_reduce of numpy arrays takes one C++ call that converts the arrays
        # and runs the collective (bindings/array_view_py.h): the per-call Python layer is
        # most of a small message's time. What that call does not take (another layout, dtype or
        # op, read-only memory) goes the general way, which explains the refusal.
        # A dense contiguous CPU torch tensor in place takes the core call directly: through the
        # torch extension's TensorCalls where it is built (the tensor's attributes read in C++,
        # see _load_tensor_calls), else after a few Python attribute reads; the core checks the
        # rest and exchanges the header.
        if not async_op and stream is None:
            tx = type(x)
            if tx is _NDARRAY and (output is None or type(output) is _NDARRAY):
                opc = _OP_CODES.get(op)
                if opc is not None and output is not x and self._c.all_reduce_array(x, output, opc):
                    return None
            elif tx is _TORCH[0] and (output is None or (type(output) is tx and output is not x)):
                tc = self._tensor_calls
                if tc is None:
                    tc = self._load_tensor_calls()
                if tc:
                    opc = _OP_CODES.get(op)
                    if opc is not None and tc.all_reduce(x, output, opc):
                        return None
                p = torch_in_place(x) if output is None else None
                if p is not None:
                    opc = OPS_FOR_DTYPE[p[2]].get(op)
                    if opc is not None:
                        self._c.all_reduce(p[0], p[0], p[1], p[2], opc, False)
                        return None
        return CoreBackEnd.all_reduce(self, x, op, async_op, output, stream)

    def broadcast(self, x, root: int = 0, async_op: bool = False, stream=None):
        # The synchronous broadcast's fast paths, as all_reduce's.
        if not async_op and stream is None:
            tx = type(x)
            if tx is _NDARRAY:
                if self._c.broadcast_array(x, root):
                    return None
            elif tx is _TORCH[0] and type(root) is int and 0 <= root < self.world_size:
                tc = self._tensor_calls
                if tc is None:
                    tc = self._load_tensor_calls()
                if tc and tc.broadcast(x, root):
                    return None
                p = torch_in_place(x)
                if p is not None:
                    self._c.broadcast(p[0], p[1], p[2], root, False)
                    return None
        return CoreBackEnd.broadcast(self, x, root, async_op, stream)

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
            from . import cuda
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
        self._tensor_calls = False   # drops its handle (a reference to the core communicator)
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


def shm_communicator(rank: int, world_size: int, store, prefix: str, timeout: float) -> Communicator:
    """The shared-memory Communicator of `world_size` ranks on this host: create this rank's
    segment, publish its name under `{prefix}/shm/{rank}`, map every peer's (the segments are
    unlinked as soon as all ranks have mapped them)."""
    key = f"{prefix}/shm/{rank}"
    started = time.time()
    core = None
    published = False
    try:
        core = _C.Communicator(rank, world_size, timeout)
        name = core.create()
        if world_size == 1:
            names = [name]
        else:
            published = True  # exchange_segment_names publishes first
            names = exchange_segment_names(_FailureAware(store, started), prefix, rank, world_size, name, timeout)
        core.connect(names)
    except BaseException as e:
        # Tell the peers at once instead of letting them wait out the timeout: a failure marker in
        # place of the segment name (peers still reading keys raise; the segment is unlinked
        # below, so a name read earlier reads as stale and is read again), and an abort posted in
        # the segment (peers that mapped it raise within a liveness slice).
        reason = f"rank {rank} failed during init: {type(e).__name__}: {e}"
        if world_size > 1:
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
    return Communicator(core, prefix)


_FAILED = "!failed: "
_MARKER_SLACK_S = 60.0  # ranks of one run start within this of each other


class _FailureAware:
    """The store as exchange_segment_names sees it: a peer's failure marker in place of its
    segment name raises PeerFailureError at once. A marker written more than _MARKER_SLACK_S
    before this rank's init started is an earlier run's (a reused store): it reads as a stale
    name, which the peer's own name replaces."""

    def __init__(self, store, started: float):
        self._store = store
        self._since = started - _MARKER_SLACK_S

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
