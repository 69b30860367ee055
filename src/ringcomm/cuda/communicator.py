"""The CUDA back end: ring collectives on CUDA arrays, enqueued on the caller's stream.

The checks are the front's (``front.CommunicatorBase``); this module issues validated device
buffers to the CUDA core (``ringcomm._C_cuda.Communicator``) on a stream, and sets communicators
up (through a store, or through a host communicator's own collectives).
"""
from __future__ import annotations

from typing import Callable, List, Optional

import numpy as np

from ..core.errors import InvalidArgumentError
from ..core.front import CoreBackEnd
from ..core.rendezvous import default_prefix, init_args, resolve_store
from ..core.work import CoreWork
from .buffers import CudaBuf, as_cuda_buf, current_stream, stream_handle
from .inflight import StreamGuard
from .runtime import default_device, require

__all__ = ["CudaCommunicator", "Work", "init", "from_communicator"]


class Work(CoreWork):
    """Handle on an asynchronous CUDA operation: wait(timeout=None) blocks the host,
    wait_stream(stream=None) makes a stream wait; is_completed(), exception() as ringcomm.Work."""

    __slots__ = ("_comm",)

    def __init__(self, w, refs, result, comm):
        super().__init__(w, refs, result)   # refs: arrays the GPU reads/writes, alive until completion
        self._comm = comm                   # the communicator must outlive its pending work

    def wait_stream(self, stream=None):
        """Make ``stream`` (default: the current stream of the result's library) wait for the work,
        without blocking the host."""
        s = stream_handle(stream)
        if s is None:
            s = self._comm._default_stream()
        self._w.stream_wait(s)
        return self._result


class CudaCommunicator(CoreBackEnd):
    """A group of ``world_size`` processes on this host, each driving one CUDA device (several may
    share one). Same methods as ringcomm.Communicator, plus ``stream=`` on each call: collectives
    are enqueued on that stream (default: the array library's current stream) and return without
    synchronising the host; ``async_op=True`` returns a Work whose ``wait()`` blocks the host and
    whose ``wait_stream()`` makes a stream wait. send/recv with ``async_op=False`` return once the
    transfer is done.

    Arrays used on a stream other than the caller's current one — send/recv (the internal
    stream) and collectives given ``stream=`` — are guarded until the GPU is done with them
    (``inflight.StreamGuard``): torch tensors are marked with ``record_stream`` for that stream,
    and every array stays referenced here, so no allocator hands their memory out early even
    when the caller drops the array and the Work at once."""

    _streams = True
    _what = "CUDA communicator"

    def __init__(self, core, prefix: str):
        self._c = core
        self.rank: int = core.rank
        self.world_size: int = core.world_size
        self.device: int = core.device
        self.prefix = prefix
        self._last_lib = "torch"
        self._guard = StreamGuard(self.device)

    def channels(self) -> str:
        """The transport's channel kinds ('0->1:ipc 1->0:ipc ...')."""
        return self._c.channels()

    def _adapt(self, x, what, writeable=False) -> CudaBuf:
        b = as_cuda_buf(x, what)
        if writeable and not b.writeable:
            raise InvalidArgumentError(f"ringcomm: {what} is read-only but the result is written into it")
        if b.count and b.device >= 0 and b.device != self.device:
            raise InvalidArgumentError(f"ringcomm: {what} is on CUDA device {b.device} but this "
                                       f"communicator uses device {self.device}")
        return b

    def _stream(self, coll, stream, buf: Optional[CudaBuf]) -> int:
        """The stream handle a call is enqueued on."""
        try:
            s = stream_handle(stream)
        except InvalidArgumentError as e:
            self._reject(coll, e)
        if buf is not None:
            self._last_lib = buf.lib
        if s is None:
            s = current_stream(buf, self.device) if buf is not None else self._default_stream()
        return s

    def _on_stream(self, w, objs, s: int, stream):
        """A collective's core handle ``w``: when the caller chose the stream (``stream=``, handle
        ``s``), its arrays are guarded until the GPU is done with them there. While ``s`` is being
        captured into a CUDA graph nothing is queried (a query would end the capture); a captured
        call's arrays belong to the graph, which the caller keeps alive for its replays."""
        if stream is not None:
            self._guard.guard(w, objs, s, lambda: self._stream_idle(s), given=stream, capturing=self._capturing(s))
        return w

    def _capturing(self, s: int) -> bool:
        """Whether stream ``s`` is being captured (cudaStreamIsCapturing, which a capture allows;
        also for a ``stream=`` that is not the library's current stream)."""
        return bool(self._c.stream_capturing(s))

    def device_setup(self) -> dict:
        """The device ring's setup (``RINGCOMM_CUDA_P2P=device``, ``device-flags``, ``device-spin``):
        ``setup`` (separate GPUs, one GPU shared under MPS or without), ``signalling`` (flags or
        spin), the grid's ``blocks``, ``nslots`` x ``slot_bytes``, the SM ``budget`` and ``why``;
        ``setup`` is '' without a device ring."""
        return dict(self._c.device_setup())

    def _stream_idle(self, s: int) -> bool:
        """Every piece of work enqueued on stream ``s`` so far has finished."""
        return bool(require()._stream_idle(s, self.device))

    def _on_p2p_stream(self, w, b):
        """A send/recv handle: its copies run on the internal stream, enqueued by the p2p thread."""
        self._guard.guard(w, (b.obj,), self._c.p2p_stream, self._c.p2p_idle)
        return w

    def _default_stream(self) -> int:
        if self._last_lib == "cupy":
            try:
                import cupy
                return int(cupy.cuda.get_current_stream().ptr)
            except ImportError:
                return 0
        try:
            import torch
            if torch.cuda.is_available():
                return int(torch.cuda.current_stream(self.device).cuda_stream)
        except ImportError:
            pass
        return 0

    def _finish(self, w, refs, result):
        return Work(w, refs, result, self)

    # -- issuing (arguments validated by CommunicatorBase) ----------------------------------------
    def _issue_all_reduce(self, bi, bo, opc, async_op, stream):
        s = self._stream("all_reduce", stream, bi)
        return self._on_stream(self._c.all_reduce(bi.addr, bo.addr, bi.count, bi.code, opc, s),
                               (bi.obj, bo.obj), s, stream)

    def _issue_reduce_scatter(self, bi, bo, opc, async_op, stream):
        s = self._stream("reduce_scatter", stream, bi)
        return self._on_stream(self._c.reduce_scatter(bi.addr, bo.addr, bi.count, bi.code, opc, s),
                               (bi.obj, bo.obj), s, stream)

    def _issue_all_gather(self, bi, bo, async_op, stream):
        s = self._stream("all_gather", stream, bi)
        return self._on_stream(self._c.all_gather(bi.addr, bo.addr, bi.count, bo.count, bi.code, s),
                               (bi.obj, bo.obj), s, stream)

    def _issue_broadcast(self, b, root, async_op, stream):
        s = self._stream("broadcast", stream, b)
        return self._on_stream(self._c.broadcast(b.addr, b.count, b.code, root, s), (b.obj,), s, stream)

    def _issue_reduce(self, bi, bo, opc, root, async_op, stream):
        s = self._stream("reduce", stream, bi)
        return self._on_stream(self._c.reduce(bi.addr, bo.addr if bo is not None else 0, bi.count, bi.code, opc,
                                              root, s),
                               (bi.obj,) if bo is None else (bi.obj, bo.obj), s, stream)

    def _issue_barrier(self, async_op, stream):
        """A host barrier; the Work's event follows the work enqueued on ``stream`` before it."""
        return self._c.barrier(self._stream("barrier", stream, None))

    def _issue_all_to_all(self, bi, bo, sc, rc, async_op, stream):
        s = self._stream("all_to_all", stream, bi)
        return self._on_stream(self._c.all_to_all(bi.addr, bo.addr, sc, rc, bi.code, s), (bi.obj, bo.obj), s,
                               stream)

    def _issue_gather(self, bi, bo, root, async_op, stream):
        s = self._stream("gather", stream, bi)
        return self._on_stream(self._c.gather(bi.addr, bo.addr if bo is not None else 0, bi.count, bi.code, root, s),
                               (bi.obj,) if bo is None else (bi.obj, bo.obj), s, stream)

    def _issue_scatter(self, bi, bo, root, async_op, stream):
        s = self._stream("scatter", stream, bo)
        return self._on_stream(self._c.scatter(bi.addr if bi is not None else 0, bo.addr, bo.count, bo.code, root, s),
                               (bo.obj,) if bi is None else (bi.obj, bo.obj), s, stream)

    def _p2p_stream(self, b, stream) -> int:
        s = stream_handle(stream)
        return current_stream(b, self.device) if s is None else s

    def _issue_send(self, b, peer, tag, async_op, stream):
        w = self._on_p2p_stream(self._c.send(b.addr, b.nbytes, peer, tag, self._p2p_stream(b, stream)), b)
        if not async_op:
            Work(w, (b.obj,), None, self).wait()
        return w

    def _issue_recv(self, b, peer, tag, async_op, stream):
        w = self._on_p2p_stream(self._c.recv(b.addr, b.nbytes, peer, tag, self._p2p_stream(b, stream)), b)
        if not async_op:
            Work(w, (b.obj,), None, self).wait()
        return w

    # -- lifetime --------------------------------------------------------------------------------
    def close(self):
        """Let enqueued work finish (bounded), then release the device memory and IPC handles.
        Idempotent. Arrays of work the drain could not finish stay referenced by this object."""
        self._c.close()
        self._guard.refs.prune()

    def __repr__(self):
        state = "closed" if self._c.closed else "open"
        return (f"<ringcomm.cuda.CudaCommunicator rank={self.rank} world_size={self.world_size} "
                f"device={self.device} {state}>")


# ---- setup ---------------------------------------------------------------------------------------
Exchange = Callable[[str, bytes], List[bytes]]


def _store_exchange(store, prefix: str, rank: int, world_size: int) -> Exchange:
    def ex(tag: str, data: bytes) -> List[bytes]:
        store.set(f"{prefix}/cuda/{tag}/{rank}", data)
        return [bytes(store.get(f"{prefix}/cuda/{tag}/{r}")) for r in range(world_size)]
    return ex


def _comm_exchange(comm) -> Exchange:
    """Exchange bytes with the host communicator's all_gather (no store needed)."""
    def ex(tag: str, data: bytes) -> List[bytes]:
        n = comm.world_size
        mine = np.array([len(data)], np.int64)
        sizes = np.zeros(n, np.int64)
        comm.all_gather(sizes, mine)
        buf = np.frombuffer(data, np.uint8).copy() if data else np.zeros(0, np.uint8)
        out = np.zeros(int(sizes.sum()), np.uint8)
        comm.all_gather(out, buf)
        offs = np.concatenate([[0], np.cumsum(sizes)])
        return [out[offs[r]:offs[r + 1]].tobytes() for r in range(n)]
    return ex


def _connect(rank: int, world_size: int, device: int, timeout: float, prefix: str, ex: Exchange) -> CudaCommunicator:
    mod = require()
    core = mod.Communicator(rank, world_size, device, timeout)
    try:
        info = core.local_info()
        infos = [info] if world_size == 1 else ex("info", info)
        blob = core.create(infos)
        blobs = [blob] if world_size == 1 else ex("handles", blob)
        core.connect(blobs)
    except BaseException:
        core.close()
        raise
    return CudaCommunicator(core, prefix)


_counter = iter(range(1 << 62))


def init(rank: Optional[int] = None, world_size: Optional[int] = None, *, store=None,
         init_method: Optional[str] = None, timeout: Optional[float] = None, prefix: Optional[str] = None,
         device: Optional[int] = None) -> CudaCommunicator:
    """Create a CUDA communicator (collectively: every rank calls it).

    Arguments as ringcomm.init (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, ``store=`` or
    ``init_method=``), plus ``device`` (default: torch's or CuPy's current device, else
    LOCAL_RANK modulo the device count). Raises UnsupportedError when CUDA is unavailable."""
    require()
    rank, world_size, t = init_args("ringcomm.cuda.init", rank, world_size, timeout)
    if prefix is None:   # refused for a sub-communicator of a larger job, as ringcomm.init's
        prefix = default_prefix(next(_counter), rank, world_size, root="ringcomm-cuda")
    dev = default_device() if device is None else int(device)
    store = resolve_store(store, init_method, rank, world_size, t)
    return _connect(rank, world_size, dev, t, prefix, _store_exchange(store, prefix, rank, world_size))


def from_communicator(comm, device: Optional[int] = None) -> CudaCommunicator:
    """A CUDA communicator over the same ranks as host communicator ``comm``, set up through
    ``comm``'s own collectives (collective: every rank calls it, in the same order)."""
    require()
    dev = default_device() if device is None else int(device)
    return _connect(comm.rank, comm.world_size, dev, comm.timeout, f"{comm.prefix}/cuda",
                    _comm_exchange(comm))
