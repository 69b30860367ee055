"""The one communicator front: every public collective, with its argument checks written once.

``CommunicatorBase`` holds the public methods (all_reduce, reduce_scatter, all_gather, broadcast,
reduce, barrier, all_to_all, gather, scatter, send, recv, close, the context manager). Each one
validates its arguments (dtype, reduce op and its support for the dtype, root, split sizes,
element counts, contiguity and writability through the back end's array adapter, overlapping
all_to_all buffers) and then calls the back end's issuing method ``_issue_<collective>``. The
back ends — host shared memory (``host.Communicator``), CUDA (``cuda.CudaCommunicator``) and
hierarchical (``hier.HierarchicalCommunicator``) — implement only:

- ``_adapt(x, what, writeable)``: the array adapter (a Buf with addr, count, code, dtype, nbytes,
  writeable, obj), raising InvalidArgumentError / UnsupportedError;
- ``_reject(coll, exc)``: join the collective's header exchange as a refusal (so every peer
  raises instead of waiting for this rank), then raise ``exc``;
- ``_check_open()``, ``closed``, ``timeout``, ``close()``;
- ``_issue_<collective>(..., async_op, stream)``: start the operation on validated buffers and
  return the back end's handle (None for a synchronous call that has completed);
- ``_finish(handle, refs, result)``: the ``ringcomm.Work`` of an asynchronous call (``refs``:
  arrays to keep alive until completion);
- ``_route(coll, a, b)``: the back end that takes these arrays (default: this one; the host
  communicator answers its CUDA twin for CUDA arrays). It is the only routing point.

A rank whose arguments fail validation still takes part in the collective's header exchange as a
rejection, so every other rank raises MismatchError instead of waiting for it. Point-to-point
calls have no header exchange: their argument errors are raised on the calling rank only.
"""
from __future__ import annotations

from typing import Optional, Sequence

from .errors import ClosedError, InvalidArgumentError, RingcommError, UnsupportedError
from .tables import OP_TYPES, OPS_FOR_DTYPE, OPS_SUPPORTED, ReduceOp, integer, op_code, unsupported_op_message

__all__ = ["CommunicatorBase", "CoreBackEnd", "check_splits", "chunk_count"]

_SUM = ReduceOp.SUM


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


def chunk_count(count: int, parts: int, i: int) -> int:
    """Elements of part i when count elements are split into parts: the first count % parts parts
    hold one extra element (reduce_scatter's rule)."""
    return count // parts + (1 if i < count % parts else 0)


def _overlaps(a, b) -> bool:
    return a.addr < b.addr + b.nbytes and b.addr < a.addr + a.nbytes


def _copy(x):
    return x.clone() if hasattr(x, "clone") else x.copy()


class CommunicatorBase:
    """The public interface of every ringcomm communicator (see the module docstring for what a
    back end provides). Needs ``rank`` and ``world_size`` attributes."""

    rank: int
    world_size: int
    _streams = False     # whether the back end takes stream= (CUDA)
    _any_source_recv = False   # whether recv(src=None) is supported

    # -- attributes -------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return self.world_size

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def trace(self) -> list:
        """The per-phase timestamps of this rank's last ``RINGCOMM_TRACE`` collectives, oldest
        first: one dict each with ``seq``, ``collective``, ``algorithm``, ``bytes``, ``ok`` and the
        phases ``entry``, ``header_posted``, ``header_seen``, ``first_slot``, ``last_slot``,
        ``exit`` (CLOCK_MONOTONIC ns, the clock of ``time.monotonic_ns()``; None for a phase the
        call did not have). Empty when the knob is 0 (the default) or the back end keeps none."""
        records = getattr(getattr(self, "_c", None), "trace", None)
        return list(records()) if records is not None else []

    def wait_stats(self) -> dict:
        """Counters of this rank's waits on shared memory since it connected: ``slept`` (waits
        that went to the futex sleep), ``yields_lost`` (sched_yields that lost the CPU to another
        process's task for a scheduler slice; each stops the yielding for
        ``RINGCOMM_YIELD_BACKOFF_MS``), ``colocated`` (waits that found the awaited peer on their own
        CPU and gave it up at once), ``descheduled`` (spins of synchronous calls on a CPU of their
        own, ``RINGCOMM_WAIT=auto``, that lost the CPU to another task and slept at once),
        ``unpinned_spins`` (waits of ranks not pinned apart that took that spin:
        ``RINGCOMM_SPIN_UNPINNED_US``), ``load_over`` (load checks that found more runnable threads
        on the node than usable CPUs: ``RINGCOMM_LOAD_CHECK_MS``), ``unpinned_backoffs`` (waits of
        ranks not pinned apart that skipped that spin because one lost its CPU within
        ``RINGCOMM_UNPINNED_BACKOFF_MS``). Empty for back ends without a shared-memory wait."""
        stats = getattr(getattr(self, "_c", None), "wait_stats", None)
        return dict(stats()) if stats is not None else {}

    def store_stats(self) -> dict:
        """``RINGCOMM_STREAM=adapt``'s state on this rank: ``current`` (the store of the calls it
        decides now: ``cached`` or ``streaming``), ``eligible`` (the calls it decided: at least
        ``RINGCOMM_STREAM_ADAPT_MIN_BYTES`` through slots), ``explorations`` (those run under the
        other store to measure it again) and ``switches``. The same on every rank after every call.
        Empty where the policy does not run (another ``RINGCOMM_STREAM``, one rank, a back end
        without streaming stores)."""
        stats = getattr(getattr(self, "_c", None), "store_stats", None)
        got = stats() if stats is not None else None
        return dict(got) if got is not None else {}

    # -- recovery (torchft-style); back ends that support it override these -----------------------
    def abort(self, reason: str = "") -> None:
        """From any thread: every pending and future call on this communicator raises promptly,
        here and on every peer that can be reached. Create a new communicator to go on."""
        raise UnsupportedError(f"ringcomm: {type(self).__name__} does not support abort()")

    def errored(self) -> Optional[RingcommError]:
        """The first error that made this communicator unusable (a failure while data moved, or
        abort()), or None."""
        raise UnsupportedError(f"ringcomm: {type(self).__name__} does not support errored()")

    def set_timeout(self, seconds: float) -> None:
        """Bound every wait that starts from now on by `seconds` (> 0; inf: no bound)."""
        raise UnsupportedError(f"ringcomm: {type(self).__name__} does not support set_timeout()")

    # -- for the layers above: refusals, the general path, the synchronous entries' C ABI -----------
    def reject(self, coll: str, exc: Exception) -> None:
        """Refuse collective ``coll`` on this rank with ``exc``, for a caller that checks a call
        before it reaches the communicator: this rank joins the collective's header exchange as
        a refusal (every peer's matching call raises MismatchError instead of waiting), then
        ``exc`` is raised here."""
        self._reject(coll, exc)

    def general(self) -> "CommunicatorBase":
        """This communicator with every collective on the general path (validated here, then
        issued), never offered to a synchronous entry: for a caller whose call such an entry has
        declined already. A back end without synchronous entries is its own general path."""
        return self

    def sync_entry_handle(self) -> Optional[tuple]:
        """``(table, handle)``: the address of ringcomm._C's ``RcFastApi`` table and a new
        handle of this communicator, through which a C extension runs its synchronous entries
        without Python (csrc/include/ringcomm/abi.h); the receiver owns the handle and releases
        it through the table. None for a back end without synchronous entries."""
        return None

    # -- back-end hooks with defaults ---------------------------------------------------------
    def _route(self, coll, a, b=None) -> "CommunicatorBase":
        return self

    # -- shared checks (raise through _reject: every peer raises too) ------------------------
    def _buf(self, coll, x, what, writeable=False):
        """The back end's Buf of ``x`` (``writeable``: the adapter refuses read-only memory)."""
        try:
            return self._adapt(x, what, writeable)
        except RingcommError as e:
            # Name the call in the message (formatted only on this error path).
            msg = str(e).replace(f"ringcomm: {what}", f"ringcomm: {coll} {what}", 1)
            self._reject(coll, type(e)(msg))

    def _op(self, coll, op) -> int:
        try:
            return op_code(op)
        except RingcommError as e:
            self._reject(coll, e)

    def _op_for(self, coll, op, b) -> int:
        """The code of reduce op ``op``, checked against buffer ``b``'s dtype."""
        opc = OPS_FOR_DTYPE[b.code].get(op) if op.__class__ in OP_TYPES else None
        if opc is None:
            opc = self._op(coll, op)
            if not OPS_SUPPORTED[b.code] >> opc & 1:
                self._reject(coll, UnsupportedError(unsupported_op_message(opc, b.code)))
        return opc

    def _same_dtype(self, coll, a, b):
        if a.dtype != b.dtype:
            self._reject(coll, InvalidArgumentError(
                f"ringcomm: {coll}: input dtype {a.dtype} and output dtype {b.dtype} differ"))

    def _root(self, coll, root) -> int:
        r = integer(root)
        if r is None:
            self._reject(coll, InvalidArgumentError(
                f"ringcomm: {coll}: root {root!r} ({type(root).__name__}) is not a rank: pass an integer"))
        if not 0 <= r < self.world_size:
            self._reject(coll, InvalidArgumentError(
                f"ringcomm: {coll}: root {root!r} is out of range for world size {self.world_size}"))
        return r

    def _splits(self, coll, splits, count, what):
        try:
            return check_splits(coll, splits, count, self.world_size, what)
        except InvalidArgumentError as e:
            self._reject(coll, e)

    def _stream_ok(self, coll, stream):
        if stream is not None and not self._streams:
            self._reject(coll, InvalidArgumentError(
                f"ringcomm: {coll}: stream= applies to CUDA arrays; these arrays are in host memory"))

    def _peer(self, what, p) -> int:
        r = integer(p)
        if r is None or not (0 <= r < self.world_size) or r == self.rank:
            raise InvalidArgumentError(
                f"ringcomm: {what}: peer {p!r} must be another rank in [0, {self.world_size}) "
                f"(this is rank {self.rank})")
        return r

    def _same_count(self, coll, bi, bo):
        self._same_dtype(coll, bi, bo)
        if bo.count != bi.count:
            self._reject(coll, InvalidArgumentError(
                f"ringcomm: {coll}: output has {bo.count} elements, input has {bi.count}"))

    def _in_out(self, coll, output, input, stream):
        """(back end, input Buf, output Buf) of a collective that takes both, of one dtype."""
        be = self._route(coll, output, input)
        be._check_open()
        if stream is not None:
            be._stream_ok(coll, stream)
        bi = be._buf(coll, input, "input")
        bo = be._buf(coll, output, "output", True)
        be._same_dtype(coll, bi, bo)
        return be, bi, bo

    # -- collectives ----------------------------------------------------------------------------
    def all_reduce(self, x, op=_SUM, async_op: bool = False, output=None, stream=None):
        """Reduce x across ranks; the result lands in x (or in `output` when given)."""
        be = self._route("all_reduce", x, output)
        be._check_open()
        if stream is not None:
            be._stream_ok("all_reduce", stream)
        bi = be._buf("all_reduce", x, "input", output is None)
        if output is None:
            bo = bi
        else:
            bo = be._buf("all_reduce", output, "output", True)
            be._same_count("all_reduce", bi, bo)
        opc = OPS_FOR_DTYPE[bi.code].get(op) if op.__class__ in OP_TYPES else None  # _op_for, inlined
        if opc is None:
            opc = be._op_for("all_reduce", op, bi)
        h = be._issue_all_reduce(bi, bo, opc, async_op, stream)
        return be._finish(h, (x, output), x if output is None else output) if async_op else None

    def reduce_scatter(self, output, input, op=_SUM, async_op: bool = False, stream=None):
        """Reduce `input` across ranks and leave chunk `rank` of the result in `output`. Chunks
        split the input evenly; when the count is not divisible by world size, the first
        count % world_size chunks hold one extra element."""
        be, bi, bo = self._in_out("reduce_scatter", output, input, stream)
        opc = be._op_for("reduce_scatter", op, bi)
        want = chunk_count(bi.count, be.world_size, be.rank)
        if bo.count != want:
            be._reject("reduce_scatter", InvalidArgumentError(
                f"ringcomm: reduce_scatter on rank {be.rank}: output has {bo.count} elements, its chunk "
                f"of the {bi.count}-element input has {want}"))
        h = be._issue_reduce_scatter(bi, bo, opc, async_op, stream)
        return be._finish(h, (input, output), output) if async_op else None

    def all_gather(self, output, input, async_op: bool = False, stream=None):
        """Concatenate every rank's `input` (rank order) into `output` on every rank."""
        be, bi, bo = self._in_out("all_gather", output, input, stream)
        if bo.count < bi.count:
            be._reject("all_gather", InvalidArgumentError(
                f"ringcomm: all_gather: output has {bo.count} elements, fewer than the input's {bi.count}"))
        h = be._issue_all_gather(bi, bo, async_op, stream)
        return be._finish(h, (input, output), output) if async_op else None

    def broadcast(self, x, root: int = 0, async_op: bool = False, stream=None):
        """Copy root's x into x on every rank."""
        be = self._route("broadcast", x)
        be._check_open()
        if stream is not None:
            be._stream_ok("broadcast", stream)
        b = be._buf("broadcast", x, "buffer", True)
        root = be._root("broadcast", root)
        h = be._issue_broadcast(b, root, async_op, stream)
        return be._finish(h, (x,), x) if async_op else None

    def reduce(self, x, root: int = 0, op=_SUM, async_op: bool = False, output=None, stream=None):
        """Reduce x across ranks onto root (into x, or into `output` on root when given)."""
        be, root = self._rooted("reduce", x, output, root, stream)
        on_root = be.rank == root
        bi = be._buf("reduce", x, "input", on_root and output is None)
        bo = bi if on_root else None
        if on_root and output is not None:
            bo = be._buf("reduce", output, "output", True)
            be._same_count("reduce", bi, bo)
        opc = be._op_for("reduce", op, bi)
        h = be._issue_reduce(bi, bo, opc, root, async_op, stream)
        result = (x if output is None else output) if on_root else None
        return be._finish(h, (x, output), result) if async_op else None

    def barrier(self, async_op: bool = False, stream=None):
        """Return once every rank has entered the barrier."""
        be = self._route("barrier", None)
        be._check_open()
        if stream is not None:
            be._stream_ok("barrier", stream)
        h = be._issue_barrier(async_op, stream)
        return be._finish(h, (), None) if async_op else None

    def all_to_all(self, output, input, output_splits: Optional[Sequence[int]] = None,
                   input_splits: Optional[Sequence[int]] = None, async_op: bool = False, stream=None):
        """Block j of `input` goes to rank j; block i of `output` comes from rank i. Splits are in
        elements; without them the arrays split evenly by world size."""
        be, bi, bo = self._in_out("all_to_all", output, input, stream)
        sc = be._splits("all_to_all", input_splits, bi.count, "input")
        rc = be._splits("all_to_all", output_splits, bo.count, "output")
        src = input
        if bi.count and bo.count and _overlaps(bi, bo):
            # The exchange reads blocks after others were written: work from a copy of the input.
            src = _copy(input)
            bi = be._adapt(src, "all_to_all input", False)
        h = be._issue_all_to_all(bi, bo, sc, rc, async_op, stream)
        return be._finish(h, (src, output), output) if async_op else None

    def _full_on_root(self, coll, root, block, full, what):
        """gather's output / scatter's input on the root (``what``): world_size blocks of
        ``block``'s size and dtype. Its Buf on the root, None on the other ranks."""
        if self.rank != root:
            return None
        if full is None:
            self._reject(coll, InvalidArgumentError(f"ringcomm: {coll}: the root needs an {what} array"))
        bf = self._buf(coll, full, what, what == "output")
        if what == "output":
            self._same_dtype(coll, block, bf)
        else:
            self._same_dtype(coll, bf, block)
        if bf.count != block.count * self.world_size:
            self._reject(coll, InvalidArgumentError(
                f"ringcomm: {coll}: {what} has {bf.count} elements, needs world_size * {block.count}"))
        return bf

    def _rooted(self, coll, a, b, root, stream):
        be = self._route(coll, a, b)
        be._check_open()
        if stream is not None:
            be._stream_ok(coll, stream)
        return be, be._root(coll, root)

    def gather(self, output, input, root: int = 0, async_op: bool = False, stream=None):
        """Concatenate every rank's `input` into root's `output` (other ranks pass output=None)."""
        be, root = self._rooted("gather", output, input, root, stream)
        bi = be._buf("gather", input, "input")
        bo = be._full_on_root("gather", root, bi, output, "output")
        h = be._issue_gather(bi, bo, root, async_op, stream)
        return be._finish(h, (input, output), output) if async_op else None

    def scatter(self, output, input=None, root: int = 0, async_op: bool = False, stream=None):
        """Root's `input` is cut into world_size blocks; block i lands in rank i's `output`."""
        be, root = self._rooted("scatter", output, input, root, stream)
        bo = be._buf("scatter", output, "output", True)
        bi = be._full_on_root("scatter", root, bo, input, "input")
        h = be._issue_scatter(bi, bo, root, async_op, stream)
        return be._finish(h, (input, output), output) if async_op else None

    # -- point to point (no header exchange: errors are raised here only) ----------------------
    def _p2p_args(self, what, x, stream):
        """(back end, buffer) of a point-to-point call."""
        be = self._route(None, x)
        be._check_open()
        if stream is not None and not be._streams:
            raise InvalidArgumentError(f"ringcomm: {what}: stream= applies to CUDA arrays")
        return be, be._adapt(x, f"{what} buffer", False)

    def send(self, x, dst: int, async_op: bool = False, tag: int = 0, stream=None):
        """Send x to rank dst. Messages between two ranks are matched in order; sizes must agree."""
        be, b = self._p2p_args("send", x, stream)
        h = be._issue_send(b, be._peer("send", dst), int(tag), async_op, stream)
        return be._finish(h, (x,), None) if async_op else None

    def recv(self, x, src: Optional[int], async_op: bool = False, tag: int = 0, stream=None):
        """Receive into x from rank src. ``src=None``: from any rank; the first message with this
        tag to arrive from any peer matches (order rule: csrc/comm/p2p_engine.h), and the call
        returns the sender's rank (async: the handle's ``source()`` after ``wait()``)."""
        be, b = self._p2p_args("recv", x, stream)
        if not b.writeable:
            raise InvalidArgumentError("ringcomm: recv buffer is read-only")
        if src is None:
            if not be._any_source_recv:
                raise UnsupportedError(f"ringcomm: recv from any source (src=None) is not "
                                       f"supported by {type(be).__name__}; pass src=")
            peer = -1
        else:
            peer = be._peer("recv", src)
        h = be._issue_recv(b, peer, int(tag), async_op, stream)
        if async_op:
            return be._finish(h, (x,), x)
        return h.source() if src is None else None


class CoreBackEnd(CommunicatorBase):
    """A back end over one C++ core communicator ``self._c`` (host shared memory or CUDA): the
    core exchanges a header before every collective, so a refusal is a header of its own."""

    # recv(src=None): the core's point-to-point engine matches receives from any source
    _any_source_recv = True

    _what = "communicator"

    @property
    def timeout(self) -> float:
        return self._c.timeout

    @property
    def closed(self) -> bool:
        return self._c.closed

    def _check_open(self):
        if self._c.closed:
            raise ClosedError(getattr(self._c, "closed_reason", "")
                              or f"ringcomm: the {self._what} (rank {self.rank}) is closed")

    def _reject(self, coll: str, exc: Exception):
        """Join the header exchange as a rejection (peers raise too), then raise exc here."""
        if not self._c.closed:
            self._c.reject()
        raise exc
