"""torchft process groups on ringcomm (``pip install 'ringcomm[ft]'``), public as
``ringcomm.torchft``::

    from ringcomm.torchft import ProcessGroupRingcomm          # or ProcessGroupRingcommC10d
    pg = ProcessGroupRingcomm(timeout=timedelta(seconds=10))
    manager = torchft.Manager(pg=pg, ...)        # in place of torchft.ProcessGroupGloo()

Two routes, one reconfiguring contract (torchft calls ``configure()`` once per new quorum, with a
store address whose path is unique to that quorum):

* ``ProcessGroupRingcomm``: on ringcomm's plain API, without torch.distributed's dispatcher. Each
  ``configure()`` aborts and closes the previous communicator and creates a fresh one with
  ``ringcomm.init(store=..., prefix=<the quorum's path>)``. ``abort()`` is the communicator's
  abort: every pending and later call raises promptly here and on every peer. A dead peer makes
  the pending call raise ``ringcomm.PeerFailureError`` within a liveness slice; ``errored()`` then
  returns it, which torchft's Manager reads before committing a step. Works follow torch's
  contract: when ``wait()`` returns, ``get_future()`` is complete with the output tensors (gloo's
  value: the flat list of outputs); when it raises, the future holds that error. A future asked
  for before ``wait()`` is completed by the group's completion thread.
* ``ProcessGroupRingcommC10d``: the "ringcomm" torch.distributed backend, built the way torchft
  0.2.0 builds its gloo group. torchft's ``ProcessGroupWrapper`` does the reconfiguring: each
  ``configure()`` aborts the group of the previous quorum and calls ``_create_pg`` with a store
  client under the quorum's unique path; here ``_create_pg`` makes a torch ``ProcessGroup`` whose
  CPU (and CUDA) backend is the "ringcomm" backend's creator output, as
  ``torch.distributed.new_group(backend="ringcomm")`` would register it. Every collective then
  goes through torch's dispatcher to that backend; its Works keep torch's contract (``work.py``).
  On top of torchft's wrapper: ``errored()`` returns the error that made the current group's
  communicator unusable (a dead or aborting peer), and ``shutdown()`` shuts the group down
  (closes its communicator, joins its threads) instead of only dropping it.

The module imports without torchft; constructing either group then raises ImportError saying
what to install.
"""
from __future__ import annotations

import threading
from datetime import timedelta
from typing import List, Optional

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _DistributedBackendOptions

from ringcomm.core.api import init
from ringcomm.core.errors import ClosedError, InvalidArgumentError, RingcommError, UnsupportedError
from ringcomm.core.errors import TimeoutError as _WaitTimeout
from ringcomm.core.tables import ReduceOp

from .work import Waiter

__all__ = ["ProcessGroupRingcomm", "ProcessGroupRingcommC10d", "parse_store_addr"]

try:
    from torchft.process_group import ProcessGroup as _TorchftProcessGroup
    from torchft.process_group import ProcessGroupWrapper as _TorchftWrapper
except ImportError as e:  # torchft missing: the classes below refuse construction
    _IMPORT_ERROR: Optional[ImportError] = e
    _TorchftProcessGroup = _TorchftWrapper = object
else:
    _IMPORT_ERROR = None


def _require_torchft() -> None:
    if _IMPORT_ERROR is not None:
        raise ImportError(
            "ringcomm.torchft needs torchft 0.2.0: pip install 'ringcomm[ft]' "
            f"(import failed: {_IMPORT_ERROR})") from _IMPORT_ERROR


def parse_store_addr(store_addr: str):
    """torchft's store address ``host:port/prefix/path`` -> (host, port, prefix). The host may be
    a bracketed IPv6 address; the port is the field after the last colon (as torchft parses it)."""
    addr, _, prefix = store_addr.partition("/")
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise InvalidArgumentError(
            f"ringcomm.torchft: store address {store_addr!r} is not host:port/prefix")
    return host.strip("[]"), int(port), prefix


def _seconds(timeout) -> float:
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


def _ring_op(op) -> ReduceOp:
    """torch ReduceOp (or AllreduceOptions' reduceOp) -> ringcomm.ReduceOp, by name."""
    kind = getattr(op, "op", op)  # ReduceOp -> its RedOpType
    name = getattr(kind, "name", None)
    try:
        return ReduceOp[name]
    except KeyError:
        raise UnsupportedError(f"ringcomm.torchft: reduce op {op} is not supported; use one of "
                               f"{', '.join(m.name for m in ReduceOp)}") from None


# ---- the plain-API route -----------------------------------------------------------------------
class _Op:
    """One torch call: the ringcomm handles it issued, then (after they all complete) copies of
    results into outputs that ringcomm could not write in place, and the future's value."""

    __slots__ = ("handles", "copies", "value", "keep")

    def __init__(self, value, keep=()):
        self.handles = []
        self.copies = []     # (destination tensor, source tensor), done after the handles
        self.value = value   # the future's result: gloo's flat list of output tensors
        self.keep = keep     # tensors the handles read or write: alive until completion


class _Work(dist._Work):
    """torch Work of one ringcomm call. Invariant: the future is completed exactly once, under
    ``_lock``, after every handle completed and the copies ran (or with the first error); both
    ``wait()`` and the group's completion thread may be the one that completes it. The lock is
    reentrant: then() callbacks run inside it (on the completing thread) and may ask this work
    for its future again."""

    def __init__(self, group: "ProcessGroupRingcomm", op: _Op):
        super().__init__()
        self._group = group
        self._op = op
        self._fut = torch.futures.Future()
        self._lock = threading.RLock()
        self._queued = False
        self._error: Optional[BaseException] = None

    def _run(self, timeout: Optional[float]) -> None:
        """Wait for every handle (``timeout``: ringcomm.TimeoutError after, the call still
        pending), then complete the future; a failed call completes it with the error."""
        try:
            for h in self._op.handles:
                h.wait(timeout)
        except RingcommError as e:
            if isinstance(e, _WaitTimeout) and timeout is not None and not self._op_failed():
                raise  # this wait's bound, not the call's failure: the call is still pending
            self._complete(e)
            raise
        self._complete(None)

    def _op_failed(self) -> bool:
        return any(h.exception() is not None for h in self._op.handles)

    def _complete(self, error: Optional[BaseException]) -> None:
        with self._lock:
            if self._fut.done():
                return
            if error is None:
                for dst, src in self._op.copies:
                    dst.copy_(src)
                value = self._op.value
                self._op.handles = []
                self._op.keep = ()
                self._op.copies = []
                self._fut.set_result(value)  # runs then() callbacks on this thread
            else:
                self._error = error
                self._fut.set_exception(error)

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        if self._fut.done():
            if self._error is not None:
                raise self._error
            return True
        self._run(None if timeout is None or _seconds(timeout) <= 0 else _seconds(timeout))
        return True

    def get_future(self):
        with self._lock:
            pending = not self._fut.done() and not self._queued
            self._queued = self._queued or pending
        if pending:
            self._group._waiter.submit(self)
        return self._fut

    def _wait_and_finish(self, _timeout) -> None:
        # The group's Waiter, in issue order; each wait is bounded by the communicator's own
        # timeout, and an aborted or closed communicator fails it promptly.
        try:
            self._run(None)
        except BaseException:  # noqa: BLE001 - the error is in the work's future
            pass

    def is_completed(self) -> bool:
        return self._fut.done() or all(h.is_completed() for h in self._op.handles)

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def exception(self):
        if self._error is not None:
            return self._error
        return next((e for e in (h.exception() for h in self._op.handles) if e is not None), None)

    def result(self):
        self.wait()
        return self._fut.value()

    def synchronize(self) -> None:
        self.wait()


def _abort_and_close(comm, reason: str) -> None:
    """Abort ``comm`` (its peers' waits raise naming ``reason``) and close it, unless closed."""
    if not comm.closed:
        comm.abort(reason)
        comm.close()


def _flat(t):
    return t if t.is_contiguous() else t.contiguous()


class ProcessGroupRingcomm(_TorchftProcessGroup):
    """A reconfigurable torchft ProcessGroup on ringcomm's shared-memory communicator: the
    replicas of a quorum must share a host (ringcomm's hierarchical back end takes over when
    ``init()`` sees several). ``timeout`` bounds init and every wait of the communicator."""

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        _require_torchft()
        super().__init__(0, 1)
        self._timeout = timeout
        self._comm = None
        self._waiter = Waiter("torchft")   # completes the futures asked for before wait()
        self._quorum_id: Optional[int] = None

    # -- lifecycle ------------------------------------------------------------------------------
    def configure(self, store_addr: str, replica_id: str, rank: int, world_size: int,
                  quorum_id: Optional[int] = None, group_rank: Optional[int] = None,
                  group_world_size: Optional[int] = None,
                  global_ranks: Optional[List[int]] = None) -> None:
        """Abort and close the current communicator (peers still in it raise), then create a
        fresh one of ``world_size`` ranks on the store at ``store_addr``, its keys under the
        address's path (unique per quorum)."""
        host, port, prefix = parse_store_addr(store_addr)
        self._drop("ringcomm.torchft: reconfigured for a new quorum")
        store = dist.TCPStore(host_name=host, port=port, is_master=False,
                              wait_for_workers=False, timeout=self._timeout)
        self._comm = init(rank=rank, world_size=world_size, store=store,
                          prefix=f"{prefix}/ringcomm" if prefix else "ringcomm/torchft",
                          timeout=_seconds(self._timeout))
        self._quorum_id = quorum_id

    def _drop(self, reason: str) -> None:
        comm, self._comm = self._comm, None
        if comm is not None:
            _abort_and_close(comm, reason)

    def abort(self, errored: bool = True) -> None:
        """The communicator's abort: every pending and later call raises, here and on every peer
        that shares it. ``errored()`` then returns the abort error until the next configure()."""
        comm = self._comm  # kept (unlike _drop) so that errored() reports the abort
        if comm is not None:
            _abort_and_close(comm, f"ringcomm.torchft: process group aborted on rank {comm.rank}")

    def shutdown(self) -> None:
        """Close the communicator (after its queued work) and stop the completion thread."""
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.close()
        self._waiter.close()
        self._waiter = Waiter("torchft")    # a later configure() runs again; it starts lazily

    def errored(self) -> Optional[Exception]:
        comm = self._comm
        return None if comm is None else comm.errored()

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout
        if self._comm is not None and not self._comm.closed:
            self._comm.set_timeout(_seconds(timeout))

    def size(self) -> int:
        return self._c.world_size

    def getBackendName(self) -> str:
        return "torchft-ringcomm"

    def __repr__(self) -> str:
        return f"ProcessGroupRingcomm(comm={self._comm!r}, quorum_id={self._quorum_id})"

    @property
    def _c(self):
        comm = self._comm
        if comm is None:
            raise ClosedError("ringcomm.torchft: the process group is not configured "
                              "(call configure(), as torchft's Manager does on each quorum)")
        return comm

    # -- collectives ----------------------------------------------------------------------------
    def _work(self, op: _Op) -> _Work:
        return _Work(self, op)

    def allreduce(self, tensors, opts) -> _Work:
        rop = _ring_op(opts.reduceOp if isinstance(opts, dist.AllreduceOptions) else opts)
        return self._all_reduce(tensors, rop)

    def allreduce_coalesced(self, tensors, opts) -> _Work:
        rop = _ring_op(getattr(opts, "reduceOp", opts))
        return self._all_reduce(tensors, rop)

    def _all_reduce(self, tensors, rop) -> _Work:
        return self._in_place(tensors, lambda x: self._c.all_reduce(x, op=rop, async_op=True))

    def _in_place(self, tensors, start) -> _Work:
        """One in-place call per tensor: ``start(x)`` on its contiguous flat view (a copy when
        the tensor is not contiguous, copied back into it when the work completes)."""
        op = _Op(list(tensors), keep=tensors)
        for t in tensors:
            x = _flat(t)
            op.handles.append(start(x))
            if x is not t:
                op.copies.append((t, x))
        return self._work(op)

    def allgather(self, output_tensors, input_tensor, opts=None) -> _Work:
        c = self._c
        op = _Op([t for outs in output_tensors for t in outs])
        for outs, inp in zip(output_tensors, input_tensor):
            if len(outs) != c.world_size:
                raise InvalidArgumentError(f"ringcomm.torchft: allgather needs {c.world_size} "
                                           f"output tensors per input, got {len(outs)}")
            x = _flat(inp)
            full = torch.empty((c.world_size,) + tuple(x.shape), dtype=x.dtype, device=x.device)
            op.handles.append(c.all_gather(full, x, async_op=True))
            op.copies.extend((o, full[i]) for i, o in enumerate(outs))
            op.keep += (x, full)
        return self._work(op)

    def allgather_into_tensor_coalesced(self, output_tensors, input_tensors, opts=None) -> _Work:
        return self._into(output_tensors, input_tensors,
                          lambda y, x: self._c.all_gather(y, x, async_op=True))

    def _into(self, output_tensors, input_tensors, start) -> _Work:
        """One call per (output, input) pair: ``start(y, x)`` on their contiguous flat views (a
        non-contiguous output is copied back into when the work completes)."""
        op = _Op(list(output_tensors))
        for out, inp in zip(output_tensors, input_tensors):
            x, y = _flat(inp), _flat(out)
            op.handles.append(start(y, x))
            if y is not out:
                op.copies.append((out, y))
            op.keep += (x, y)
        return self._work(op)

    def broadcast(self, tensor_list, opts) -> _Work:
        root = opts.rootRank if isinstance(opts, dist.BroadcastOptions) else int(opts)
        return self._in_place(tensor_list, lambda x: self._c.broadcast(x, root=root, async_op=True))

    def barrier(self, opts=None) -> _Work:
        op = _Op([])
        op.handles.append(self._c.barrier(async_op=True))
        return self._work(op)

    def reduce_scatter(self, output_tensors, input_tensors, opts) -> _Work:
        c = self._c
        rop = _ring_op(opts.reduceOp)
        op = _Op(list(output_tensors))
        for out, ins in zip(output_tensors, input_tensors):
            if len(ins) != c.world_size:
                raise InvalidArgumentError(f"ringcomm.torchft: reduce_scatter needs {c.world_size} "
                                           f"input tensors per output, got {len(ins)}")
            full = torch.stack([i.reshape(out.shape) for i in ins])
            y = _flat(out)
            op.handles.append(c.reduce_scatter(y, full, op=rop, async_op=True))
            if y is not out:
                op.copies.append((out, y))
            op.keep += (full, y)
        return self._work(op)

    def reduce_scatter_tensor_coalesced(self, output_tensors, input_tensors, opts) -> _Work:
        rop = _ring_op(opts.reduceOp)
        return self._into(output_tensors, input_tensors,
                          lambda y, x: self._c.reduce_scatter(y, x, op=rop, async_op=True))

    def alltoall_base(self, output_buffer, input_buffer, output_split_sizes,
                      input_split_sizes, opts=None) -> _Work:
        c = self._c

        def elements(splits, t):
            # torch's splits count rows of dim 0; ringcomm's count elements
            row = t.numel() // t.shape[0] if t.dim() and t.shape[0] else 1
            return [s * row for s in splits] if splits else None

        x, y = _flat(input_buffer), _flat(output_buffer)
        op = _Op([output_buffer], keep=(x, y))
        op.handles.append(c.all_to_all(y, x, output_splits=elements(output_split_sizes, y),
                                       input_splits=elements(input_split_sizes, x), async_op=True))
        if y is not output_buffer:
            op.copies.append((output_buffer, y))
        return self._work(op)

    def send(self, tensors, dst_rank: int, tag: int) -> _Work:
        c = self._c
        op = _Op(list(tensors))
        for t in tensors:
            x = _flat(t)
            op.handles.append(c.send(x, dst_rank, tag=tag, async_op=True))
            op.keep += (x,)
        return self._work(op)

    def recv(self, tensors, src_rank: int, tag: int) -> _Work:
        c = self._c
        op = _Op(list(tensors), keep=tensors)
        for t in tensors:
            x = _flat(t)
            op.handles.append(c.recv(x, src_rank, tag=tag, async_op=True))
            if x is not t:
                op.copies.append((t, x))
        return self._work(op)


# ---- the c10d route ----------------------------------------------------------------------------
class ProcessGroupRingcommC10d(_TorchftWrapper):
    """A reconfigurable torch ``ProcessGroup`` on the "ringcomm" backend (torchft's
    ``ProcessGroupGloo`` with ringcomm in place of gloo). The replicas of a quorum must share a
    host. ``timeout`` bounds the store client, init and every wait of the communicator."""

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        _require_torchft()
        super().__init__(timeout=timeout)

    def _create_pg(self, store, rank: int, world_size: int) -> dist.ProcessGroup:
        from .backend import create_backend   # the backend's classes load with the first group
        opts = _DistributedBackendOptions()
        opts.store = store          # torchft's PrefixStore under the quorum's path
        opts.group_rank = rank
        opts.group_size = world_size
        opts.timeout = self._timeout
        # the same on every rank of the quorum's group; the store prefix already keeps two
        # quorums' keys apart
        opts.group_id = f"torchft_quorum_{self._quorum_id}"
        opts.global_ranks_in_group = list(self._global_ranks or range(world_size))
        backend = create_backend(opts)
        if isinstance(backend, dist.ProcessGroup):
            # RINGCOMM_TORCH_BACKEND=group: the backend is the whole group, every device included
            return backend
        pg = dist.ProcessGroup(store, rank, world_size)
        pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, backend)
        if torch.cuda.is_available():
            pg._register_backend(torch.device("cuda"), dist.ProcessGroup.BackendType.CUSTOM,
                                 backend)
        return pg

    def _backend(self):
        """The current group's ringcomm backend (per-device or whole-group), or None."""
        pg = self._pg
        if pg is None:
            return None
        if hasattr(pg, "communicator"):
            return pg
        try:
            return pg._get_backend(torch.device("cpu"))
        except RuntimeError:
            return None

    def errored(self) -> Optional[Exception]:
        """The error that made the current group's communicator unusable, or None. torchft's
        Manager reads it before committing a step."""
        backend = self._backend()
        comm = getattr(backend, "communicator", None)
        return None if comm is None else comm.errored()

    def shutdown(self) -> None:
        """Shut the current group down: its communicator closes (after its queued work) and its
        threads are joined."""
        pg, self._pg = self._pg, None
        if pg is not None:
            pg.shutdown()

    def getBackendName(self) -> str:
        return "torchft-ringcomm-c10d"
