"""The plain ringcomm API: a Communicator over numpy arrays and torch CPU tensors.

Policy lives here (argument validation with clear messages, array conversion, keeping arrays
alive while asynchronous work runs); the data movement is the C++ core's (ringcomm._C).
A rank whose arguments fail validation still takes part in the collective's header exchange as a
rejection, so every other rank raises MismatchError instead of waiting for it.
"""
from __future__ import annotations

import enum
import itertools
import os
import threading
from typing import Optional, Sequence

from . import _C
from .arrays import Buf, as_buf
from .config import default_timeout
from .arrays import any_cuda_array, is_cuda_array  # CUDA dispatch
from .errors import ClosedError, InvalidArgumentError, RingcommError, from_code
from .rendezvous import store_from_env, store_from_init_method

__all__ = ["ReduceOp", "Communicator", "Work", "init", "get_default", "set_default"]

_COLL = dict(_C.COLL_CODES)


class ReduceOp(enum.IntEnum):
    """Reduction operators (codes of rc::ReduceOp)."""
    SUM = 0
    PRODUCT = 1
    MIN = 2
    MAX = 3
    AVG = 4
    BAND = 5
    BOR = 6
    BXOR = 7


_OP_CACHE = {o: int(o) for o in ReduceOp}
_OP_CACHE.update({int(o): int(o) for o in ReduceOp})


def _op_code(op) -> int:
    code = _OP_CACHE.get(op) if not isinstance(op, bool) else None
    if code is not None:
        return code
    if isinstance(op, str):
        try:
            return int(ReduceOp[op.upper()])
        except KeyError:
            raise InvalidArgumentError(f"ringcomm: unknown reduce op {op!r}; use one of "
                                       f"{', '.join(o.name for o in ReduceOp)}") from None
    try:
        return int(ReduceOp(int(op)))
    except (ValueError, TypeError):
        raise InvalidArgumentError(f"ringcomm: unknown reduce op {op!r}") from None


class Work:
    """Handle on an asynchronous operation: wait(timeout=None), is_completed(), exception()."""

    __slots__ = ("_w", "_refs", "_result")

    def __init__(self, w, refs, result=None):
        self._w = w
        self._refs = refs      # arrays the C++ side reads/writes: alive until completion
        self._result = result

    def wait(self, timeout: Optional[float] = None):
        """Block until done (at most `timeout` seconds when given: ringcomm.TimeoutError after).
        Raises the operation's error. Returns the operation's result (output array or None)."""
        self._w.wait(-1.0 if timeout is None else float(timeout))
        self._refs = None
        return self._result

    def is_completed(self) -> bool:
        return self._w.is_completed()

    def exception(self) -> Optional[RingcommError]:
        """The error the operation failed with, None if it succeeded or is still running."""
        code = self._w.error_code()
        return from_code(code, self._w.error_message()) if code >= 0 else None

    @property
    def seq(self) -> int:
        return self._w.seq


class ArgChecks:
    """Argument checks shared by the communicators (host, CUDA, hierarchical). A failed check
    joins the collective's header exchange as a refusal through ``self._reject(coll, exc)``, which
    raises ``exc`` here and makes every peer raise too; needs ``self.world_size``."""

    def _same_dtype(self, coll, a, b):
        if a.dtype != b.dtype:
            self._reject(coll, InvalidArgumentError(
                f"ringcomm: {coll}: input dtype {a.dtype} and output dtype {b.dtype} differ"))

    def _root(self, coll, root) -> int:
        if not isinstance(root, int) or isinstance(root, bool) or not (0 <= root < self.world_size):
            self._reject(coll, InvalidArgumentError(
                f"ringcomm: {coll}: root {root!r} is out of range for world size {self.world_size}"))
        return root

    def _splits(self, coll, splits, count, what):
        try:
            return check_splits(coll, splits, count, self.world_size, what)
        except InvalidArgumentError as e:
            self._reject(coll, e)


class Communicator(ArgChecks):
    """A group of `world_size` processes on this host. Create with ringcomm.init()."""

    def __init__(self, core, prefix: str):
        self._c = core
        self.rank: int = core.rank
        self.world_size: int = core.world_size
        self.prefix = prefix
        self._inflight: list = []
        self._lock = threading.Lock()

    # -- helpers ---------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return self.world_size

    @property
    def timeout(self) -> float:
        return self._c.timeout

    @property
    def closed(self) -> bool:
        return self._c.closed

    def _check_open(self):
        if self._c.closed:
            raise ClosedError(f"ringcomm: the communicator (rank {self.rank}) is closed")

    def _reject(self, coll: str, exc: Exception):
        """Join the header exchange as a rejection (peers raise too), then raise exc here."""
        if not self._c.closed:
            self._c.reject(_COLL[coll])
        raise exc

    def _buf(self, coll, x, what, writeable=False) -> Buf:
        try:
            return as_buf(x, what, writeable)
        except RingcommError as e:
            # Name the call in the message (formatted only on this error path).
            msg = str(e).replace(f"ringcomm: {what}", f"ringcomm: {coll} {what}", 1)
            self._reject(coll, type(e)(msg))

    def _finish(self, w, refs, async_op, result=None):
        if not async_op:
            return None
        work = Work(w, refs, result)
        with self._lock:
            self._inflight = [x for x in self._inflight if not x.is_completed()]
            self._inflight.append(work)
        return work

    # -- collectives -----------------------------------------------------------------------
    def all_reduce(self, x, op=ReduceOp.SUM, async_op: bool = False, output=None):
        """Reduce x across ranks; the result lands in x (or in `output` when given)."""
        # ---- CUDA dispatch ----
        if any_cuda_array(x, output):
            cc = self._cuda_route("all_reduce", x, output)
            return cc.all_reduce(x, op=op, async_op=async_op, output=output)
        # ---- end CUDA dispatch ----
        self._check_open()
        opc = self._op("all_reduce", op)
        bi = self._buf("all_reduce", x, "input", writeable=output is None)
        bo = bi if output is None else self._buf("all_reduce", output, "output", writeable=True)
        if bo is not bi:
            self._same_dtype("all_reduce", bi, bo)
            if bo.count != bi.count:
                self._reject("all_reduce", InvalidArgumentError(
                    f"ringcomm: all_reduce: output has {bo.count} elements, input has {bi.count}"))
        w = self._c.all_reduce(bi.addr, bo.addr, bi.count, bi.code, opc, async_op)
        return self._finish(w, (x, output), async_op, output if output is not None else x)

    def reduce_scatter(self, output, input, op=ReduceOp.SUM, async_op: bool = False):
        """Reduce `input` across ranks and leave chunk `rank` of the result in `output`. Chunks
        split the input evenly; when the count is not divisible by world size, the first
        count % world_size chunks hold one extra element."""
        # ---- CUDA dispatch ----
        if any_cuda_array(output, input):
            cc = self._cuda_route("reduce_scatter", output, input)
            return cc.reduce_scatter(output, input, op=op, async_op=async_op)
        # ---- end CUDA dispatch ----
        self._check_open()
        opc = self._op("reduce_scatter", op)
        bi = self._buf("reduce_scatter", input, "input")
        bo = self._buf("reduce_scatter", output, "output", writeable=True)
        self._same_dtype("reduce_scatter", bi, bo)
        want = bi.count // self.world_size + (1 if self.rank < bi.count % self.world_size else 0)
        if bo.count != want:
            self._reject("reduce_scatter", InvalidArgumentError(
                f"ringcomm: reduce_scatter on rank {self.rank}: output has {bo.count} elements, its chunk of "
                f"the {bi.count}-element input has {want}"))
        w = self._c.reduce_scatter(bi.addr, bo.addr, bi.count, bi.code, opc, async_op)
        return self._finish(w, (input, output), async_op, output)

    def all_gather(self, output, input, async_op: bool = False):
        """Concatenate every rank's `input` (rank order) into `output` on every rank."""
        # ---- CUDA dispatch ----
        if any_cuda_array(output, input):
            return self._cuda_route("all_gather", output, input).all_gather(output, input, async_op=async_op)
        # ---- end CUDA dispatch ----
        self._check_open()
        bi = self._buf("all_gather", input, "input")
        bo = self._buf("all_gather", output, "output", writeable=True)
        self._same_dtype("all_gather", bi, bo)
        if bo.count < bi.count:
            self._reject("all_gather", InvalidArgumentError(
                f"ringcomm: all_gather: output has {bo.count} elements, fewer than the input's {bi.count}"))
        w = self._c.all_gather(bi.addr, bo.addr, bi.count, bo.count, bi.code, async_op)
        return self._finish(w, (input, output), async_op, output)

    def broadcast(self, x, root: int = 0, async_op: bool = False):
        """Copy root's x into x on every rank."""
        # ---- CUDA dispatch ----
        if any_cuda_array(x):
            return self._cuda_route("broadcast", x).broadcast(x, root=root, async_op=async_op)
        # ---- end CUDA dispatch ----
        self._check_open()
        b = self._buf("broadcast", x, "buffer", writeable=True)
        root = self._root("broadcast", root)
        w = self._c.broadcast(b.addr, b.count, b.code, root, async_op)
        return self._finish(w, (x,), async_op, x)

    def reduce(self, x, root: int = 0, op=ReduceOp.SUM, async_op: bool = False, output=None):
        """Reduce x across ranks onto root (into x, or into `output` on root when given)."""
        # ---- CUDA dispatch ----
        if any_cuda_array(x, output):
            cc = self._cuda_route("reduce", x, output)
            return cc.reduce(x, root=root, op=op, async_op=async_op, output=output)
        # ---- end CUDA dispatch ----
        self._check_open()
        opc = self._op("reduce", op)
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
        w = self._c.reduce(bi.addr, bo.addr if on_root else 0, bi.count, bi.code, opc, root, async_op)
        return self._finish(w, (x, output), async_op, (output if output is not None else x) if on_root else None)

    def barrier(self, async_op: bool = False):
        """Return once every rank has entered the barrier."""
        self._check_open()
        w = self._c.barrier(async_op)
        return self._finish(w, (), async_op)

    def all_to_all(self, output, input, output_splits: Optional[Sequence[int]] = None,
                   input_splits: Optional[Sequence[int]] = None, async_op: bool = False):
        """Block j of `input` goes to rank j; block i of `output` comes from rank i. Splits are in
        elements; without them the arrays split evenly by world size."""
        # ---- CUDA dispatch ----
        if any_cuda_array(output, input):
            cc = self._cuda_route("all_to_all", output, input)
            return cc.all_to_all(output, input, output_splits=output_splits, input_splits=input_splits,
                                 async_op=async_op)
        # ---- end CUDA dispatch ----
        self._check_open()
        bi = self._buf("all_to_all", input, "input")
        bo = self._buf("all_to_all", output, "output", writeable=True)
        self._same_dtype("all_to_all", bi, bo)
        sc = self._splits("all_to_all", input_splits, bi.count, "input")
        rc = self._splits("all_to_all", output_splits, bo.count, "output")
        src = input
        if bi.count and bo.count and _overlaps(bi, bo):
            # The exchange reads blocks after others were written: work from a copy of the input.
            src = _copy(input)
            bi = as_buf(src, "all_to_all input")
        w = self._c.all_to_all(bi.addr, bo.addr, sc, rc, bi.code, async_op)
        return self._finish(w, (src, output), async_op, output)

    def gather(self, output, input, root: int = 0, async_op: bool = False):
        """Concatenate every rank's `input` into root's `output` (other ranks pass output=None)."""
        # ---- CUDA dispatch ----
        if any_cuda_array(output, input):
            return self._cuda_route("gather", output, input).gather(output, input, root=root, async_op=async_op)
        # ---- end CUDA dispatch ----
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
        w = self._c.gather(bi.addr, addr_out, bi.count, bi.code, root, async_op)
        return self._finish(w, (input, output), async_op, output)

    def scatter(self, output, input=None, root: int = 0, async_op: bool = False):
        """Root's `input` is cut into world_size blocks; block i lands in rank i's `output`."""
        # ---- CUDA dispatch ----
        if any_cuda_array(output, input):
            return self._cuda_route("scatter", output, input).scatter(output, input, root=root, async_op=async_op)
        # ---- end CUDA dispatch ----
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
        w = self._c.scatter(addr_in, bo.addr, bo.count, bo.code, root, async_op)
        return self._finish(w, (input, output), async_op, output)

    # -- point to point --------------------------------------------------------------------
    def send(self, x, dst: int, async_op: bool = False, tag: int = 0):
        """Send x to rank dst. Messages between two ranks are matched in order; sizes must agree."""
        # ---- CUDA dispatch ----
        if any_cuda_array(x):
            return self._cuda_route(None, x).send(x, dst, async_op=async_op, tag=tag)
        # ---- end CUDA dispatch ----
        self._check_open()
        b = as_buf(x, "send buffer")
        w = self._c.send(b.addr, b.nbytes, self._peer("send", dst), int(tag), async_op)
        return self._finish(w, (x,), async_op)

    def recv(self, x, src: int, async_op: bool = False, tag: int = 0):
        """Receive into x from rank src."""
        # ---- CUDA dispatch ----
        if any_cuda_array(x):
            return self._cuda_route(None, x).recv(x, src, async_op=async_op, tag=tag)
        # ---- end CUDA dispatch ----
        self._check_open()
        b = as_buf(x, "recv buffer")
        if not b.writeable:
            raise InvalidArgumentError("ringcomm: recv buffer is read-only")
        w = self._c.recv(b.addr, b.nbytes, self._peer("recv", src), int(tag), async_op)
        return self._finish(w, (x,), async_op, x)

    def _peer(self, what, p) -> int:
        if not isinstance(p, int) or isinstance(p, bool) or not (0 <= p < self.world_size) or p == self.rank:
            raise InvalidArgumentError(
                f"ringcomm: {what}: peer {p!r} must be another rank in [0, {self.world_size}) (this is rank {self.rank})")
        return p

    def _op(self, coll, op) -> int:
        try:
            return _op_code(op)
        except RingcommError as e:
            self._reject(coll, e)

    # ---- CUDA dispatch ------------------------------------------------------------
    def _cuda_route(self, coll, *arrays):
        """The CUDA communicator (ringcomm.cuda) for a call whose arrays live on a CUDA device
        (any_cuda_array). Created on first use through this communicator's own collectives, so
        every rank must route the same call (pass CUDA arrays on every rank). Point-to-point calls
        (coll None) raise instead of rejecting: they have no header exchange."""
        cc = getattr(self, "_cuda_comm", None)
        if cc is not None and not cc.closed:
            return cc
        try:
            if not all(is_cuda_array(a) for a in arrays if a is not None):
                raise InvalidArgumentError(f"ringcomm: {coll or 'send/recv'}: some arrays are on a CUDA device "
                                           f"and some in host memory; pass all of them on one device")
            from . import cuda
            cuda._core()  # UnsupportedError ("CUDA unavailable: ...") before anything else
            dev = cuda.as_cuda_buf(next(a for a in arrays if a is not None)).device
            if coll is None:
                raise _cuda_p2p_needs_comm()
            self._check_open()
            cc = cuda.from_communicator(self, device=None if dev < 0 else dev)
        except RingcommError as e:
            if coll is None:
                raise
            self._reject(coll, e)
        self._cuda_comm = cc
        return cc
    # ---- end CUDA dispatch ------------------------------------------------------------------

    # -- lifetime --------------------------------------------------------------------------
    def close(self):
        """Finish queued work, release the shared memory. Idempotent."""
        # ---- CUDA dispatch ----
        cc = getattr(self, "_cuda_comm", None)
        if cc is not None:
            cc.close()
        # ---- end CUDA dispatch ----
        self._c.close()
        self._inflight = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        state = "closed" if self._c.closed else "open"
        return f"<ringcomm.Communicator rank={self.rank} world_size={self.world_size} {state}>"


# ---- CUDA dispatch ----
def _cuda_p2p_needs_comm():
    return InvalidArgumentError(
        "ringcomm: send/recv of CUDA arrays needs the CUDA communicator, which is created (collectively) by the "
        "first collective on CUDA arrays; run one first (e.g. barrier-like all_reduce of a 1-element CUDA "
        "tensor) or use ringcomm.cuda.init()")
# ---- end CUDA dispatch ----


def check_splits(coll: str, splits, count: int, world_size: int, what: str) -> list:
    """all_to_all split sizes (elements per rank) for an array of `count` elements: the given
    ones, validated, or an even split. Raises InvalidArgumentError."""
    n = world_size
    if splits is None:
        if count % n:
            raise InvalidArgumentError(
                f"ringcomm: {coll}: {what} has {count} elements, not divisible by world size {n}; pass "
                f"{what}_splits")
        return [count // n] * n
    s = [int(v) for v in splits]
    if len(s) != n or any(v < 0 for v in s) or sum(s) != count:
        raise InvalidArgumentError(
            f"ringcomm: {coll}: {what}_splits {s} must be {n} non-negative sizes summing to {count}")
    return s


def _overlaps(a: Buf, b: Buf) -> bool:
    return a.addr < b.addr + b.nbytes and b.addr < a.addr + a.nbytes


def _copy(x):
    return x.clone() if hasattr(x, "clone") else x.copy()


_default: Optional[Communicator] = None
_counter = itertools.count()


def init(rank: Optional[int] = None, world_size: Optional[int] = None, *, store=None,
         init_method: Optional[str] = None, timeout: Optional[float] = None,
         prefix: Optional[str] = None) -> Communicator:
    """Create a communicator.

    - ``init()``: from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun's environment).
    - ``init(rank=r, world_size=n, store=store)``: any store with set/get (torch's stores work).
    - ``init(rank=r, world_size=n, init_method="file:///tmp/rdzv")``: no torch needed.
    ``timeout`` (seconds) bounds every wait (default RINGCOMM_TIMEOUT or 300). ``prefix``
    namespaces the store keys (default: one per communicator created in this process, so every
    rank must create its communicators in the same order).
    The first communicator created becomes the default one used by ringcomm.all_reduce(...).
    """
    global _default
    if rank is None:
        rank = int(_env("RANK"))
    if world_size is None:
        world_size = int(_env("WORLD_SIZE"))
    if not (isinstance(world_size, int) and world_size >= 1):
        raise InvalidArgumentError(f"ringcomm.init: world_size must be >= 1, got {world_size!r}")
    if not (isinstance(rank, int) and 0 <= rank < world_size):
        raise InvalidArgumentError(f"ringcomm.init: rank {rank!r} out of range for world size {world_size}")
    t = float(timeout) if timeout is not None else default_timeout()
    if t <= 0:
        raise InvalidArgumentError(f"ringcomm.init: timeout must be > 0 s, got {t}")
    if prefix is None:
        prefix = f"ringcomm/{next(_counter)}"
    # ---- multi-node hook (ringcomm.hier): ranks spanning several nodes get a two-level communicator.
    if world_size > 1:
        from . import hier
        store, hcomm = hier.from_init(rank, world_size, store, init_method, prefix, t)
        if hcomm is not None:
            if _default is None or _default.closed:
                _default = hcomm
            return hcomm
    # ---- end of the multi-node hook: one node, the shared-memory communicator below.
    if store is None and world_size > 1:
        store = (store_from_init_method(init_method, rank, world_size, t) if init_method
                 else store_from_env(rank, world_size, t))
    comm = shm_communicator(rank, world_size, store, prefix, t)
    if _default is None or _default.closed:
        _default = comm
    return comm


def shm_communicator(rank: int, world_size: int, store, prefix: str, timeout: float) -> Communicator:
    """The shared-memory Communicator of `world_size` ranks on this host: create this rank's
    segment, publish its name under `{prefix}/shm/{rank}`, map every peer's (the segments are
    unlinked as soon as all ranks have mapped them)."""
    core = _C.Communicator(rank, world_size, timeout)
    name = core.create()
    try:
        if world_size == 1:
            names = [name]
        else:
            store.set(f"{prefix}/shm/{rank}", name)
            names = [_to_str(store.get(f"{prefix}/shm/{r}")) for r in range(world_size)]
        core.connect(names)
    except BaseException:
        core.close()
        raise
    return Communicator(core, prefix)


def _to_str(v) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


def _env(name: str) -> str:
    v = os.environ.get(name)
    if v is None:
        raise InvalidArgumentError(f"ringcomm.init(): {name} is not set; pass rank= and world_size= "
                                   f"(or launch with torchrun)")
    return v


def get_default() -> Communicator:
    if _default is None or _default.closed:
        raise RingcommError("ringcomm: no default communicator; call ringcomm.init() first")
    return _default


def set_default(comm: Communicator) -> None:
    global _default
    _default = comm
