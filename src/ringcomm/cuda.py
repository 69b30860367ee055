"""ringcomm on CUDA: ring collectives on torch CUDA tensors and CuPy arrays.

    import ringcomm.cuda
    if ringcomm.cuda.is_available():
        comm = ringcomm.cuda.init(rank=r, world_size=n, init_method="file:///tmp/rdzv")
        comm.all_reduce(x)            # x: a torch CUDA tensor, a CuPy array, any __cuda_array_interface__
                                      # or DLPack CUDA array; enqueued on the current stream

The plain API routes CUDA arrays here by itself: ``ringcomm.init()`` returns a host communicator
whose methods forward CUDA arrays to a CUDA communicator created (collectively) on first use.

Semantics (the CUDA communicator, csrc/comm/communicator_cuda.h):
- Collectives are enqueued on the caller's CUDA stream — ``stream=`` (an int handle, a
  ``torch.cuda.Stream`` or a ``cupy.cuda.Stream``), else the array library's current stream — and
  return without synchronising the host: later work on that stream sees the result. The call
  returns once every rank has entered the collective and its work is enqueued.
- ``async_op=True`` returns a :class:`Work` whose ``wait()`` blocks the host until the GPU work is
  done (bounded by the timeout, checking that peers are alive) and whose ``wait_stream()`` makes a
  stream wait for it. ``async_op=False`` returns None.
- send/recv progress on a helper stream; they complete (host-side) in ``wait()``; with
  ``async_op=False`` the call returns when the transfer is done.
- Buffers: contiguous, on the communicator's device. Dtypes: float32, float64, float16, bfloat16,
  int8, uint8, int32, int64, bool; reduce ops as on the CPU (ringcomm.ReduceOp).

Importing this module creates nothing and loads no CUDA library; ``is_available()`` loads the
``ringcomm._C_cuda`` extension (statically linked CUDA runtime) and asks the driver for devices.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from .api import Work as _ApiWork
from .api import ArgChecks
from .arrays import is_cuda_array
from .config import default_timeout
from .errors import (ClosedError, InvalidArgumentError, RingcommError, UnsupportedError)

__all__ = ["is_available", "unavailable_reason", "is_cuda_array", "init", "from_communicator",
           "CudaCommunicator", "Work", "device_count"]

# Codes of rc::DType (csrc/common/dtype.h) and rc::Coll (csrc/comm/communicator.h). Never renumber.
DTYPE_CODES = {
    "float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int8": 4, "uint8": 5, "int32": 6,
    "int64": 7, "bool": 8,
}
_COLL = {"all_reduce": 1, "reduce_scatter": 2, "all_gather": 3, "broadcast": 4, "reduce": 5, "barrier": 6,
         "all_to_all": 7, "gather": 8, "scatter": 9}
_lock = threading.Lock()
_state: dict = {}


# ---- availability ------------------------------------------------------------------------------
def _load():
    """The extension module, or None; caches the reason it is unusable."""
    with _lock:
        if "mod" in _state:
            return _state["mod"]
        mod, reason = None, ""
        try:
            from . import _C_cuda as mod  # noqa: N813
        except ImportError as e:
            reason = (f"ringcomm was built without CUDA support (ringcomm._C_cuda: {e}); rebuild with "
                      f"RINGCOMM_CUDA=1 where nvcc is installed")
        if mod is not None:
            st = mod.runtime_status()
            if not st["available"]:
                reason = (f"no usable CUDA device ({st['error']}; CUDA runtime {st['runtime_version']}, "
                          f"driver {st['driver_version']})")
        _state["mod"], _state["reason"] = mod, reason
        return mod


def is_available() -> bool:
    """True when ringcomm's CUDA extension is built and a CUDA device is usable."""
    return _load() is not None and not _state["reason"]


def unavailable_reason() -> str:
    """Why CUDA cannot be used here ('' when it can)."""
    _load()
    return _state["reason"]


def device_count() -> int:
    mod = _load()
    return mod.runtime_status()["device_count"] if mod is not None else 0


def _core():
    mod = _load()
    if mod is None or _state["reason"]:
        raise UnsupportedError(f"ringcomm: CUDA unavailable: {_state['reason']}")
    return mod


# ---- array adapters ------------------------------------------------------------------------------
@dataclass
class CudaBuf:
    """A contiguous CUDA array's memory."""
    obj: Any
    addr: int
    count: int
    dtype: str
    code: int
    nbytes: int
    writeable: bool
    device: int
    lib: str           # "torch", "cupy" or "cai"
    stream: Optional[int] = None  # the producer's stream (CUDA array interface v3), if it says


def _c_strides(shape, itemsize):
    st, acc = [], itemsize
    for d in reversed(shape):
        st.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(st))


def as_cuda_buf(x, what: str = "array") -> CudaBuf:
    """Describe a CUDA array's memory; InvalidArgumentError / UnsupportedError with a clear message."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        import torch
        if not isinstance(x, torch.Tensor) or not x.is_cuda:
            raise UnsupportedError(f"ringcomm: {what} ({type(x).__name__} on {getattr(x, 'device', '?')}) is not a "
                                   f"CUDA tensor")
        name = str(x.dtype).replace("torch.", "")
        if name not in DTYPE_CODES:
            raise UnsupportedError(f"ringcomm: {what} has dtype {x.dtype}, supported: {', '.join(DTYPE_CODES)}")
        if x.layout != torch.strided:
            raise UnsupportedError(f"ringcomm: {what} has layout {x.layout}; only dense tensors are supported")
        if not x.is_contiguous():
            raise InvalidArgumentError(f"ringcomm: {what} is not contiguous (shape {tuple(x.shape)}, stride "
                                       f"{x.stride()}); pass x.contiguous() and copy the result back")
        n = x.numel()
        return CudaBuf(x, x.data_ptr() if n else 0, int(n), name, DTYPE_CODES[name], int(n * x.element_size()),
                       True, int(x.device.index if x.device.index is not None else torch.cuda.current_device()),
                       "torch")
    if mod.startswith("cupy"):
        name = np.dtype(x.dtype).name
        if name not in DTYPE_CODES:
            raise UnsupportedError(f"ringcomm: {what} has dtype {x.dtype}, supported: {', '.join(DTYPE_CODES)}")
        if not x.flags.c_contiguous:
            raise InvalidArgumentError(f"ringcomm: {what} is not C-contiguous (shape {x.shape}, strides {x.strides}); "
                                       f"pass cupy.ascontiguousarray(...) and copy the result back")
        return CudaBuf(x, int(x.data.ptr) if x.size else 0, int(x.size), name, DTYPE_CODES[name], int(x.nbytes),
                       True, int(x.device.id), "cupy")
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        ptr, readonly = cai["data"]
        dt = np.dtype(cai["typestr"])
        name = dt.name
        if name not in DTYPE_CODES:
            raise UnsupportedError(f"ringcomm: {what} has dtype {cai['typestr']}, supported: {', '.join(DTYPE_CODES)}")
        shape = tuple(int(d) for d in cai["shape"])
        count = int(np.prod(shape)) if shape else 1
        strides = cai.get("strides")
        if strides is not None and count > 1 and tuple(strides) != _c_strides(shape, dt.itemsize):
            raise InvalidArgumentError(f"ringcomm: {what} is not C-contiguous (strides {strides})")
        if cai.get("mask") is not None:
            raise UnsupportedError(f"ringcomm: {what} is a masked array")
        # The device is not part of the interface: -1 here, the C++ side checks the pointer's device.
        return CudaBuf(x, int(ptr) if count else 0, count, name, DTYPE_CODES[name], count * dt.itemsize,
                       not readonly, -1, "cai", cai.get("stream"))
    if hasattr(x, "__dlpack__") and is_cuda_array(x):
        return as_cuda_buf(_from_dlpack(x), what)
    raise UnsupportedError(f"ringcomm: {what} of type {type(x).__name__} is not a CUDA array (torch CUDA tensors, "
                           f"CuPy arrays, __cuda_array_interface__ and DLPack CUDA arrays are)")


def _from_dlpack(x):
    """A torch / CuPy view of a DLPack CUDA array (same memory)."""
    try:
        import torch
        return torch.from_dlpack(x)
    except ImportError:
        pass
    try:
        import cupy
        return cupy.from_dlpack(x)
    except ImportError:
        raise UnsupportedError("ringcomm: DLPack CUDA arrays need torch or CuPy to be viewed") from None


def _stream_handle(stream) -> Optional[int]:
    if stream is None:
        return None
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise InvalidArgumentError(f"ringcomm: stream {stream!r} is not a CUDA stream (an int handle, a "
                               f"torch.cuda.Stream or a cupy.cuda.Stream)")


def _current_stream(buf: CudaBuf, device: int) -> int:
    if buf.lib == "torch":
        import torch
        return int(torch.cuda.current_stream(device).cuda_stream)
    if buf.lib == "cupy":
        import cupy
        return int(cupy.cuda.get_current_stream().ptr)
    if buf.stream is not None:
        return int(buf.stream)
    return 0  # the legacy default stream


# ---- work --------------------------------------------------------------------------------------
class Work(_ApiWork):
    """Handle on an asynchronous CUDA operation: wait(timeout=None) blocks the host,
    wait_stream(stream=None) makes a stream wait; is_completed(), exception() as ringcomm.Work."""

    __slots__ = ("_comm",)

    def __init__(self, w, refs, result, comm):
        super().__init__(w, refs, result)   # refs: arrays the GPU reads/writes, alive until completion
        self._comm = comm                   # the communicator must outlive its pending work

    def wait_stream(self, stream=None):
        """Make ``stream`` (default: the current stream of the result's library) wait for the work,
        without blocking the host."""
        s = _stream_handle(stream)
        if s is None:
            s = self._comm._default_stream()
        self._w.stream_wait(s)
        return self._result


# ---- the communicator -----------------------------------------------------------------------------
class CudaCommunicator(ArgChecks):
    """A group of ``world_size`` processes on this host, each driving one CUDA device (several may
    share one). Same methods as ringcomm.Communicator, plus ``stream=`` on each collective."""

    def __init__(self, core, prefix: str):
        self._c = core
        self.rank: int = core.rank
        self.world_size: int = core.world_size
        self.device: int = core.device
        self.prefix = prefix
        self._last_lib = "torch"

    # -- helpers ---------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return self.world_size

    @property
    def timeout(self) -> float:
        return self._c.timeout

    @property
    def closed(self) -> bool:
        return self._c.closed

    def channels(self) -> str:
        """The transport's channel kinds ('0->1:ipc 1->0:ipc ...')."""
        return self._c.channels()

    def _check_open(self):
        if self._c.closed:
            raise ClosedError(f"ringcomm: the CUDA communicator (rank {self.rank}) is closed")

    def _reject(self, coll: str, exc: Exception):
        if not self._c.closed:
            self._c.reject(_COLL[coll])
        raise exc

    def _buf(self, coll, x, what, writeable=False) -> CudaBuf:
        try:
            b = as_cuda_buf(x, f"{coll} {what}")
            if writeable and not b.writeable:
                raise InvalidArgumentError(f"ringcomm: {coll} {what} is read-only but the result is written into it")
            if b.count and b.device >= 0 and b.device != self.device:
                raise InvalidArgumentError(f"ringcomm: {coll} {what} is on CUDA device {b.device} but this "
                                           f"communicator uses device {self.device}")
            return b
        except RingcommError as e:
            self._reject(coll, e)

    def _op(self, coll, op) -> int:
        from .api import _op_code
        try:
            return _op_code(op)
        except RingcommError as e:
            self._reject(coll, e)

    def _stream(self, coll, stream, buf: Optional[CudaBuf], objs=()) -> int:
        try:
            s = _stream_handle(stream)
        except RingcommError as e:
            self._reject(coll, e)
        if buf is not None:
            self._last_lib = buf.lib
        if s is None:
            s = _current_stream(buf, self.device) if buf is not None else self._default_stream()
        elif stream is not None and not isinstance(stream, int):
            # The caller's stream differs from the allocation stream: tell torch's caching
            # allocator not to reuse the tensors' memory before that stream is done with them.
            for o in objs:
                rs = getattr(o, "record_stream", None)
                if rs is not None and type(stream).__module__.startswith("torch"):
                    rs(stream)
        return s

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

    def _finish(self, w, refs, async_op, result=None):
        if not async_op:
            return None
        return Work(w, refs, result, self)

    # -- collectives -------------------------------------------------------------------------------
    def all_reduce(self, x, op=None, async_op: bool = False, output=None, stream=None):
        """Reduce x across ranks; the result lands in x (or in ``output``)."""
        self._check_open()
        opc = self._op("all_reduce", 0 if op is None else op)
        bi = self._buf("all_reduce", x, "input", writeable=output is None)
        bo = bi if output is None else self._buf("all_reduce", output, "output", writeable=True)
        if bo is not bi:
            self._same_dtype("all_reduce", bi, bo)
            if bo.count != bi.count:
                self._reject("all_reduce", InvalidArgumentError(
                    f"ringcomm: all_reduce: output has {bo.count} elements, input has {bi.count}"))
        s = self._stream("all_reduce", stream, bi, (x, output))
        w = self._c.all_reduce(bi.addr, bo.addr, bi.count, bi.code, opc, s)
        return self._finish(w, (x, output), async_op, output if output is not None else x)

    def reduce_scatter(self, output, input, op=None, async_op: bool = False, stream=None):
        """Reduce ``input`` across ranks; chunk ``rank`` of the result lands in ``output`` (chunks as on the CPU)."""
        self._check_open()
        opc = self._op("reduce_scatter", 0 if op is None else op)
        bi = self._buf("reduce_scatter", input, "input")
        bo = self._buf("reduce_scatter", output, "output", writeable=True)
        self._same_dtype("reduce_scatter", bi, bo)
        want = bi.count // self.world_size + (1 if self.rank < bi.count % self.world_size else 0)
        if bo.count != want:
            self._reject("reduce_scatter", InvalidArgumentError(
                f"ringcomm: reduce_scatter on rank {self.rank}: output has {bo.count} elements, its chunk of "
                f"the {bi.count}-element input has {want}"))
        s = self._stream("reduce_scatter", stream, bi, (input, output))
        w = self._c.reduce_scatter(bi.addr, bo.addr, bi.count, bi.code, opc, s)
        return self._finish(w, (input, output), async_op, output)

    def all_gather(self, output, input, async_op: bool = False, stream=None):
        """Concatenate every rank's ``input`` (rank order) into ``output`` on every rank."""
        self._check_open()
        bi = self._buf("all_gather", input, "input")
        bo = self._buf("all_gather", output, "output", writeable=True)
        self._same_dtype("all_gather", bi, bo)
        if bo.count < bi.count:
            self._reject("all_gather", InvalidArgumentError(
                f"ringcomm: all_gather: output has {bo.count} elements, fewer than the input's {bi.count}"))
        s = self._stream("all_gather", stream, bi, (input, output))
        w = self._c.all_gather(bi.addr, bo.addr, bi.count, bo.count, bi.code, s)
        return self._finish(w, (input, output), async_op, output)

    def broadcast(self, x, root: int = 0, async_op: bool = False, stream=None):
        """Copy root's x into x on every rank."""
        self._check_open()
        b = self._buf("broadcast", x, "buffer", writeable=True)
        root = self._root("broadcast", root)
        s = self._stream("broadcast", stream, b, (x,))
        w = self._c.broadcast(b.addr, b.count, b.code, root, s)
        return self._finish(w, (x,), async_op, x)

    def reduce(self, x, root: int = 0, op=None, async_op: bool = False, output=None, stream=None):
        """Reduce x across ranks onto root (into x, or into ``output`` on root)."""
        self._check_open()
        opc = self._op("reduce", 0 if op is None else op)
        root = self._root("reduce", root)
        on_root = self.rank == root
        bi = self._buf("reduce", x, "input", writeable=on_root and output is None)
        bo = bi
        if on_root and output is not None:
            bo = self._buf("reduce", output, "output", writeable=True)
            self._same_dtype("reduce", bi, bo)
            if bo.count != bi.count:
                self._reject("reduce", InvalidArgumentError(
                    f"ringcomm: reduce: output has {bo.count} elements, input has {bi.count}"))
        s = self._stream("reduce", stream, bi, (x, output))
        w = self._c.reduce(bi.addr, bo.addr if on_root else 0, bi.count, bi.code, opc, root, s)
        return self._finish(w, (x, output), async_op, (output if output is not None else x) if on_root else None)

    def barrier(self, async_op: bool = False, stream=None):
        """Return once every rank has entered the barrier (a host barrier; the Work's event follows
        the work enqueued on ``stream`` before it)."""
        self._check_open()
        s = self._stream("barrier", stream, None)
        w = self._c.barrier(s)
        return self._finish(w, (), async_op)

    def all_to_all(self, output, input, output_splits: Optional[Sequence[int]] = None,
                   input_splits: Optional[Sequence[int]] = None, async_op: bool = False, stream=None):
        """Block j of ``input`` goes to rank j; block i of ``output`` comes from rank i (splits in elements)."""
        self._check_open()
        bi = self._buf("all_to_all", input, "input")
        bo = self._buf("all_to_all", output, "output", writeable=True)
        self._same_dtype("all_to_all", bi, bo)
        sc = self._splits("all_to_all", input_splits, bi.count, "input")
        rc = self._splits("all_to_all", output_splits, bo.count, "output")
        src = input
        if bi.count and bo.count and bi.addr < bo.addr + bo.nbytes and bo.addr < bi.addr + bi.nbytes:
            src = input.clone() if hasattr(input, "clone") else input.copy()
            bi = as_cuda_buf(src, "all_to_all input")
        s = self._stream("all_to_all", stream, bi, (src, output))
        w = self._c.all_to_all(bi.addr, bo.addr, sc, rc, bi.code, s)
        return self._finish(w, (src, output), async_op, output)

    def gather(self, output, input, root: int = 0, async_op: bool = False, stream=None):
        """Concatenate every rank's ``input`` into root's ``output`` (other ranks pass output=None)."""
        self._check_open()
        root = self._root("gather", root)
        bi = self._buf("gather", input, "input")
        addr_out = 0
        if self.rank == root:
            if output is None:
                self._reject("gather", InvalidArgumentError("ringcomm: gather: the root needs an output array"))
            bo = self._buf("gather", output, "output", writeable=True)
            self._same_dtype("gather", bi, bo)
            if bo.count != bi.count * self.world_size:
                self._reject("gather", InvalidArgumentError(
                    f"ringcomm: gather: output has {bo.count} elements, needs world_size * {bi.count}"))
            addr_out = bo.addr
        s = self._stream("gather", stream, bi, (input, output))
        w = self._c.gather(bi.addr, addr_out, bi.count, bi.code, root, s)
        return self._finish(w, (input, output), async_op, output)

    def scatter(self, output, input=None, root: int = 0, async_op: bool = False, stream=None):
        """Root's ``input`` is cut into world_size blocks; block i lands in rank i's ``output``."""
        self._check_open()
        root = self._root("scatter", root)
        bo = self._buf("scatter", output, "output", writeable=True)
        addr_in = 0
        if self.rank == root:
            if input is None:
                self._reject("scatter", InvalidArgumentError("ringcomm: scatter: the root needs an input array"))
            bi = self._buf("scatter", input, "input")
            self._same_dtype("scatter", bi, bo)
            if bi.count != bo.count * self.world_size:
                self._reject("scatter", InvalidArgumentError(
                    f"ringcomm: scatter: input has {bi.count} elements, needs world_size * {bo.count}"))
            addr_in = bi.addr
        s = self._stream("scatter", stream, bo, (input, output))
        w = self._c.scatter(addr_in, bo.addr, bo.count, bo.code, root, s)
        return self._finish(w, (input, output), async_op, output)

    # -- point to point ------------------------------------------------------------------------
    def send(self, x, dst: int, async_op: bool = False, tag: int = 0, stream=None):
        """Send x to rank dst (matched in order per pair of ranks; sizes must agree)."""
        self._check_open()
        b = as_cuda_buf(x, "send buffer")
        s = _stream_handle(stream)
        s = _current_stream(b, self.device) if s is None else s
        w = self._c.send(b.addr, b.nbytes, self._peer("send", dst), int(tag), s)
        work = Work(w, (x,), None, self)
        return work if async_op else work.wait()

    def recv(self, x, src: int, async_op: bool = False, tag: int = 0, stream=None):
        """Receive into x from rank src."""
        self._check_open()
        b = as_cuda_buf(x, "recv buffer")
        if not b.writeable:
            raise InvalidArgumentError("ringcomm: recv buffer is read-only")
        s = _stream_handle(stream)
        s = _current_stream(b, self.device) if s is None else s
        w = self._c.recv(b.addr, b.nbytes, self._peer("recv", src), int(tag), s)
        work = Work(w, (x,), x, self)
        if async_op:
            return work
        work.wait()
        return None

    def _peer(self, what, p) -> int:
        if not isinstance(p, int) or isinstance(p, bool) or not (0 <= p < self.world_size) or p == self.rank:
            raise InvalidArgumentError(f"ringcomm: {what}: peer {p!r} must be another rank in "
                                       f"[0, {self.world_size}) (this is rank {self.rank})")
        return p

    # -- lifetime --------------------------------------------------------------------------------
    def close(self):
        """Let enqueued work finish (bounded), then release the device memory and IPC handles.
        Idempotent."""
        self._c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

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


def _default_device() -> int:
    try:
        import torch
        if torch.cuda.is_available():
            return int(torch.cuda.current_device())
    except ImportError:
        pass
    try:
        import cupy
        return int(cupy.cuda.runtime.getDevice())
    except ImportError:
        pass
    n = device_count()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    return local % n if n else 0


def _connect(rank: int, world_size: int, device: int, timeout: float, prefix: str, ex: Exchange) -> CudaCommunicator:
    mod = _core()
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
    from .api import _env
    from .rendezvous import store_from_env, store_from_init_method
    _core()
    if rank is None:
        rank = int(_env("RANK"))
    if world_size is None:
        world_size = int(_env("WORLD_SIZE"))
    if not (isinstance(world_size, int) and world_size >= 1):
        raise InvalidArgumentError(f"ringcomm.cuda.init: world_size must be >= 1, got {world_size!r}")
    if not (isinstance(rank, int) and 0 <= rank < world_size):
        raise InvalidArgumentError(f"ringcomm.cuda.init: rank {rank!r} out of range for world size {world_size}")
    t = float(timeout) if timeout is not None else default_timeout()
    if t <= 0:
        raise InvalidArgumentError(f"ringcomm.cuda.init: timeout must be > 0 s, got {t}")
    if prefix is None:
        prefix = f"ringcomm-cuda/{next(_counter)}"
    dev = _default_device() if device is None else int(device)
    if world_size > 1 and store is None:
        store = (store_from_init_method(init_method, rank, world_size, t) if init_method
                 else store_from_env(rank, world_size, t))
    return _connect(rank, world_size, dev, t, prefix, _store_exchange(store, prefix, rank, world_size))


def from_communicator(comm, device: Optional[int] = None) -> CudaCommunicator:
    """A CUDA communicator over the same ranks as host communicator ``comm``, set up through
    ``comm``'s own collectives (collective: every rank calls it, in the same order)."""
    _core()
    dev = _default_device() if device is None else int(device)
    return _connect(comm.rank, comm.world_size, dev, comm.timeout, f"{comm.prefix}/cuda",
                    _comm_exchange(comm))
