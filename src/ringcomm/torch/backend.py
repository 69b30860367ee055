"""The "ringcomm" torch.distributed backend: a ``ProcessGroup`` subclass over ringcomm's Communicator.

Every torch call is mapped onto ringcomm's Python API (see the table in the README, "Use with
PyTorch"). Tensors are handed to ringcomm in place; a copy is made only where torch's call shape
differs from ringcomm's (a list of tensors where ringcomm takes one flat tensor, a non-contiguous
tensor, a PREMUL_SUM factor applied to an input that must stay unchanged). Those compositions are
whole-tensor operations in Python; nothing loops over elements or chunks.

Threads per group: one *waiter* that observes completions in issue order, and a small completion
pool that completes ``torch.futures.Future`` objects (see ``work.py`` for why two). Both are joined
in ``shutdown()`` (called by ``destroy_process_group``) and at interpreter exit.
"""
from __future__ import annotations

import datetime
import itertools
import math
import time
from typing import Callable

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

import ringcomm
from ringcomm.tables import DTYPE_CODES, torch_dtype_codes

from .hooks import add_issue_hook, issue_hooks, live_groups, remove_issue_hook
from .staging import (SUPPORTED_DTYPES, avg_divide, cat, check_tensors, contig, copy_out, flat_view,
                      int_avg, invalid, one, reduce_op, reducible, same_dtype, then, unsupported,
                      writeback)
from .work import DoneWork, MultiWork, RingcommWork, Waiter, timeout_seconds

__all__ = ["RingcommProcessGroup", "RingcommWork", "create_process_group", "add_issue_hook",
           "remove_issue_hook", "SUPPORTED_DTYPES"]

BACKEND_NAME = "ringcomm"

# The allreduce fast path's table: torch dtype -> core dtype code (bool excluded: its bitwise ops
# need the uint8 view of the general path).
_FAST_CODES = {t: c for t, c in torch_dtype_codes().items() if c != DTYPE_CODES["bool"]}
_SUM = dist.ReduceOp.SUM
_STRIDED = torch.strided

def _collective(coll: str):
    """Decorate a torch entry point that maps onto ringcomm collective ``coll``.

    An argument this rank refuses (raised before anything was issued) is reported to the other
    ranks through ringcomm's header exchange (``reject``), so they raise MismatchError instead of
    waiting for this rank until the timeout. Errors raised by ringcomm itself have done that
    already and pass through."""
    def deco(method):
        def wrapper(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 - re-raised below
                if getattr(e, "_ringcomm_issued", False) or self._closed:
                    raise
                self._reject(coll, e)
                raise
        wrapper.__name__ = method.__name__
        wrapper.__qualname__ = method.__qualname__
        wrapper.__doc__ = method.__doc__
        return wrapper
    return deco


class _Step:
    """One ringcomm call of a (possibly composed) torch collective."""
    __slots__ = ("launch", "finish")

    def __init__(self, launch: Callable[[bool], object], finish: Callable[[], None] | None = None):
        self.launch = launch   # launch(async_op) -> handle (async) / None (sync)
        self.finish = finish   # run after success (copy a staged result out)


class _BarrierHandle:
    """A barrier's ringcomm handle whose wait is bounded by the barrier's own timeout."""
    __slots__ = ("_h", "_limit", "_rank", "_size")

    def __init__(self, h, limit: float, rank: int, size: int):
        self._h, self._limit, self._rank, self._size = h, limit, rank, size

    def wait(self, timeout: float | None = None):
        t = self._limit if timeout is None else min(float(timeout), self._limit)
        try:
            return self._h.wait(t)
        except ringcomm.TimeoutError as e:
            if self._h.is_completed():
                raise
            raise ringcomm.TimeoutError(
                f"ringcomm barrier: not every rank of the group (size {self._size}) arrived "
                f"within the barrier's timeout of {self._limit:g} s (waiting on rank "
                f"{self._rank})") from e

    def is_completed(self) -> bool:
        return self._h.is_completed()

    def exception(self):
        return self._h.exception()


# ---- the process group -----------------------------------------------------------------------------------
class RingcommProcessGroup(dist.ProcessGroup):
    """torch.distributed process group whose collectives run on a ringcomm Communicator."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta | float,
                 group_name: str = "", group_desc: str = "undefined"):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._timeout_s = timeout_seconds(timeout, 1800.0)
        self._group_name = str(group_name)
        self._group_desc = str(group_desc)
        # A group name restarts after destroy_process_group + re-init on the same store: number
        # this group's incarnations so that every one gets fresh keys (and shm names).
        n = int(store.add("ringcomm/incarnations", 1))
        self._incarnation = (n - 1) // size
        self._prefix = f"ringcomm/{self._group_name or 'pg'}/{self._incarnation}"
        self._comm = ringcomm.init(rank=rank, world_size=size, store=store,
                                   timeout=self._timeout_s, prefix=self._prefix)
        # allreduce's fast path: the host communicator's sanctioned entry (see
        # host.Communicator._fast_all_reduce_entry); None for a hierarchical one (several
        # nodes), which always takes the general path.
        entry = getattr(self._comm, "_fast_all_reduce_entry", None)
        self._fast_ar = entry() if entry is not None else None
        self._waiter = Waiter(f"{self._group_name or 'pg'}.{self._incarnation}")
        self._seq = itertools.count(1)  # next() is atomic under the GIL
        self._coalescing: list[RingcommWork] | None = None
        self._closed = False
        live_groups.add(self)

    # ---- identity ------------------------------------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND_NAME

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = str(name)

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = str(desc)

    def __repr__(self) -> str:
        return (f"RingcommProcessGroup(name={self._group_name!r}, rank={self._rank}, "
                f"size={self._size}, incarnation={self._incarnation})")

    @property
    def communicator(self):
        """The ringcomm Communicator this group runs on."""
        return self._comm

    def _reject(self, coll: str, exc: Exception) -> None:
        """Join collective ``coll``'s header exchange as a refusal; every rank then raises."""
        reject = getattr(self._comm, "_reject", None)
        if reject is not None and not self._comm.closed:
            try:
                reject(coll, exc)  # raises exc after the exchange
            except Exception as e:  # noqa: BLE001
                if e is not exc:
                    raise exc from e
        raise exc

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._timeout_s = timeout_seconds(timeout, self._timeout_s)

    # ---- issuing ------------------------------------------------------------------------------------
    def _run(self, op: str, opts, steps: list[_Step], outputs: list[torch.Tensor],
             source_rank: int = -1) -> RingcommWork:
        if self._closed:
            raise ringcomm.ClosedError(f"ringcomm: {op} on a process group that was shut down")
        seq = next(self._seq)
        if issue_hooks:
            t = time.perf_counter()
            for hook in list(issue_hooks):
                hook(op, self._group_name, seq, t)
        async_op = getattr(opts, "asyncOp", True) if opts is not None else True
        try:
            if not async_op and self._coalescing is None:
                # The caller waits at once (dist.* without async_op=True): run inline, no
                # thread hop on the latency-critical path.
                for s in steps:
                    s.launch(False)
                for s in steps:
                    if s.finish is not None:
                        s.finish()
                return DoneWork(op, seq, outputs, source_rank)
            handles = [s.launch(True) for s in steps]
        except Exception as e:
            e._ringcomm_issued = True  # ringcomm has told the other ranks (see _collective)
            raise
        finishers = [s.finish for s in steps if s.finish is not None]
        if not finishers:
            finisher = None
        elif len(finishers) == 1:
            finisher = finishers[0]
        else:
            def finisher():
                for f in finishers:
                    f()
        work = RingcommWork(op, seq, handles, outputs, finisher, self._timeout_s, self._waiter,
                            source_rank)
        if self._coalescing is not None:
            self._coalescing.append(work)
        return work

    # ---- step builders (one ringcomm call each) -----------------------------------------------------
    def _allreduce_step(self, t: torch.Tensor, op, coll: str) -> _Step:
        rop, factor = reduce_op(op, t.dtype)
        buf, staged = contig(t)
        buf = reducible(buf, rop)
        if factor is not None:
            buf.mul_(factor)  # in place: the all-reduce overwrites the tensor anyway
        comm = self._comm
        return _Step(lambda a: comm.all_reduce(buf, op=rop, async_op=a),
                     then(avg_divide(buf, self._size) if int_avg(op, t.dtype) else None,
                          writeback(t, buf) if staged else None))

    def _all_gather_single_step(self, out: torch.Tensor, inp: torch.Tensor, coll: str) -> _Step:
        check_tensors(coll, (out, inp))
        same_dtype(coll, (out, inp))
        if out.numel() != inp.numel() * self._size:
            raise invalid(f"{coll}: output has {out.numel()} elements, expected world_size "
                           f"({self._size}) x input ({inp.numel()})")
        obuf, staged = contig(out)
        ibuf, _ = contig(inp)
        comm = self._comm
        return _Step(lambda a: comm.all_gather(obuf, ibuf, async_op=a),
                     writeback(out, obuf) if staged else None)

    def _reduce_scatter_single_step(self, out: torch.Tensor, inp: torch.Tensor, op,
                                    coll: str) -> _Step:
        check_tensors(coll, (out, inp))
        same_dtype(coll, (out, inp))
        if inp.numel() != out.numel() * self._size:
            raise invalid(f"{coll}: input has {inp.numel()} elements, expected world_size "
                           f"({self._size}) x output ({out.numel()})")
        rop, factor = reduce_op(op, inp.dtype)
        ibuf, _ = contig(inp)
        if factor is not None:
            ibuf = ibuf * factor  # a scaled copy: the input must stay unchanged
        obuf, staged = contig(out)
        comm = self._comm
        ri, ro = reducible(ibuf, rop), reducible(obuf, rop)
        return _Step(lambda a: comm.reduce_scatter(ro, ri, op=rop, async_op=a),
                     then(avg_divide(obuf, self._size) if int_avg(op, inp.dtype) else None,
                          writeback(out, obuf) if staged else None))

    # ---- all-reduce ------------------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        # Fast path, the latency-critical call (dist.all_reduce without async_op, what most
        # training loops issue): one contiguous dense CPU tensor of a numeric dtype, a plain
        # reduce op, no coalescing block, no issue hooks. Straight into the core, no step objects;
        # anything else takes the general path below, which validates and composes.
        fast_ar = self._fast_ar
        if (fast_ar is not None and opts is not None and not getattr(opts, "asyncOp", True)
                and len(tensors) == 1 and self._coalescing is None and not issue_hooks
                and not self._closed):
            t = tensors[0]
            code = _FAST_CODES.get(t.dtype)
            # SUM only: comparing with the ReduceOp constant costs a third of reading .op.value
            if (code is not None and opts.reduceOp == _SUM and t.is_cpu and t.layout is _STRIDED
                    and t.is_contiguous()):
                n = t.numel()
                try:
                    addr = t.data_ptr() if n else 0
                except Exception:  # noqa: BLE001 - no storage: the general path rejects it for all ranks
                    addr = None
                if addr is not None:
                    seq = next(self._seq)
                    try:
                        fast_ar(addr, addr, n, code, 0, False)  # 0: SUM
                    except Exception as e:
                        e._ringcomm_issued = True  # raised by the core: every rank has been told
                        raise
                    return DoneWork("allreduce", seq, [t])
        return self._allreduce_general(tensors, opts)

    @_collective("all_reduce")
    def _allreduce_general(self, tensors, opts=None):
        opts = opts if opts is not None else _c10d.AllreduceOptions()
        t = one("allreduce", tensors)
        check_tensors("allreduce", (t,))
        return self._run("allreduce", opts, [self._allreduce_step(t, opts.reduceOp, "allreduce")],
                         [t])

    @_collective("all_reduce")
    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else _c10d.AllreduceCoalescedOptions()
        tensors = list(tensors)
        if not tensors:
            return self._run("allreduce_coalesced", opts, [], [])
        check_tensors("allreduce_coalesced", tensors)
        if len(tensors) == 1 or any(t.dtype != tensors[0].dtype for t in tensors):
            steps = [self._allreduce_step(t, opts.reduceOp, "allreduce_coalesced")
                     for t in tensors]
            return self._run("allreduce_coalesced", opts, steps, tensors)
        # One all-reduce over the concatenation, then copy back.
        flat = cat(tensors)
        step = self._allreduce_step(flat, opts.reduceOp, "allreduce_coalesced")
        step.finish = then(step.finish, lambda: copy_out(flat, tensors))
        return self._run("allreduce_coalesced", opts, [step], tensors)

    # ---- broadcast / reduce -------------------------------------------------------------------------
    @_collective("broadcast")
    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else _c10d.BroadcastOptions()
        t = one("broadcast", tensors)
        check_tensors("broadcast", (t,))
        if opts.rootTensor != 0:
            raise unsupported("broadcast with rootTensor != 0")
        root = opts.rootRank
        buf, staged = contig(t)
        comm = self._comm
        step = _Step(lambda a: comm.broadcast(buf, root=root, async_op=a),
                     writeback(t, buf) if staged and self._rank != root else None)
        return self._run("broadcast", opts, [step], [t])

    @_collective("reduce")
    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else _c10d.ReduceOptions()
        t = one("reduce", tensors)
        check_tensors("reduce", (t,))
        if opts.rootTensor != 0:
            raise unsupported("reduce with rootTensor != 0")
        root = opts.rootRank
        rop, factor = reduce_op(opts.reduceOp, t.dtype)
        buf, staged = contig(t)
        if factor is not None:
            if self._rank == root:
                buf.mul_(factor)
            else:
                buf = buf * factor
                staged = False
        comm = self._comm
        rbuf = reducible(buf, rop)
        on_root = self._rank == root
        step = _Step(lambda a: comm.reduce(rbuf, root=root, op=rop, async_op=a),
                     then(avg_divide(buf, self._size)
                          if on_root and int_avg(opts.reduceOp, t.dtype) else None,
                          writeback(t, buf) if staged and on_root else None))
        return self._run("reduce", opts, [step], [t])

    # ---- all-gather ------------------------------------------------------------------------------------
    def _allgather_list_step(self, outs: list[torch.Tensor], inp: torch.Tensor, coll: str) -> _Step:
        check_tensors(coll, [inp, *outs])
        same_dtype(coll, [inp, *outs])
        if len(outs) != self._size:
            raise invalid(f"{coll}: output list has {len(outs)} tensors, world size is "
                           f"{self._size}")
        for o in outs:
            if o.numel() != inp.numel():
                raise invalid(f"{coll}: every output tensor must have the input's size "
                               f"({inp.numel()} elements); got {o.numel()}")
        ibuf, _ = contig(inp)
        flat = flat_view(outs)
        finish = None
        if flat is None:
            flat = torch.empty(inp.numel() * self._size, dtype=inp.dtype, device=inp.device)
            finish = lambda: copy_out(flat, outs)  # noqa: E731
        comm = self._comm
        return _Step(lambda a: comm.all_gather(flat, ibuf, async_op=a), finish)

    @_collective("all_gather")
    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        outs = list(one("allgather", output_tensors, "output list"))
        inp = one("allgather", input_tensors)
        return self._run("allgather", opts, [self._allgather_list_step(outs, inp, "allgather")],
                         outs)

    @_collective("all_gather")
    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        """torch's layout (as gloo): ``output_lists[r][i]`` receives rank r's ``input_tensors[i]``.
        One all-gather of the concatenated inputs; rank r's block of the result holds its inputs
        back to back, copied out to ``output_lists[r]``."""
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        coll = "allgather_coalesced"
        ins = list(input_tensors)
        lists = [list(o) for o in output_lists]
        if len(lists) != self._size:
            raise invalid(f"{coll}: one output list per rank is required ({self._size}); got "
                           f"{len(lists)}")
        outs = [t for o in lists for t in o]
        check_tensors(coll, [*ins, *outs])
        same_dtype(coll, [*ins, *outs])
        for r, o in enumerate(lists):
            if len(o) != len(ins) or any(x.numel() != i.numel() for x, i in zip(o, ins)):
                raise invalid(f"{coll}: output list {r} must hold one tensor per input, of the "
                               f"inputs' sizes {[i.numel() for i in ins]}; got "
                               f"{[x.numel() for x in o]}")
        if not ins:
            return self._run(coll, opts, [], [])
        flat_in = cat(ins)
        flat_out = torch.empty(flat_in.numel() * self._size, dtype=flat_in.dtype,
                               device=flat_in.device)
        comm = self._comm
        step = _Step(lambda a: comm.all_gather(flat_out, flat_in, async_op=a),
                     lambda: copy_out(flat_out, outs))
        return self._run(coll, opts, [step], outs)

    @_collective("all_gather")
    def all_gather_single(self, output, input, opts=None):
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        return self._run("all_gather_into_tensor", opts,
                         [self._all_gather_single_step(output, input, "all_gather_into_tensor")],
                         [output])

    def _allgather_base(self, output, input, opts=None):
        return self.all_gather_single(output, input, opts)

    @_collective("all_gather")
    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        if len(outputs) != len(inputs):
            raise invalid("all_gather_into_tensor_coalesced: as many outputs as inputs needed")
        steps = [self._all_gather_single_step(o, i, "all_gather_into_tensor_coalesced")
                 for o, i in zip(outputs, inputs)]
        return self._run("all_gather_into_tensor_coalesced", opts, steps, list(outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # ---- reduce-scatter --------------------------------------------------------------------------------
    @_collective("reduce_scatter")
    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        out = one("reduce_scatter", output_tensors)
        ins = list(one("reduce_scatter", input_lists, "input list"))
        check_tensors("reduce_scatter", [out, *ins])
        same_dtype("reduce_scatter", [out, *ins])
        if len(ins) != self._size:
            raise invalid(f"reduce_scatter: input list has {len(ins)} tensors, world size is "
                           f"{self._size}")
        for t in ins:
            if t.numel() != out.numel():
                raise invalid(f"reduce_scatter: every input tensor must have the output's size "
                               f"({out.numel()} elements); got {t.numel()}")
        flat = flat_view(ins)
        flat = cat(ins) if flat is None else flat
        step = self._reduce_scatter_single_step(out, flat, opts.reduceOp, "reduce_scatter")
        return self._run("reduce_scatter", opts, [step], [out])

    @_collective("reduce_scatter")
    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        step = self._reduce_scatter_single_step(output, input, opts.reduceOp,
                                                "reduce_scatter_tensor")
        return self._run("reduce_scatter_tensor", opts, [step], [output])

    def _reduce_scatter_base(self, output, input, opts=None):
        return self.reduce_scatter_single(output, input, opts)

    @_collective("reduce_scatter")
    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        if len(outputs) != len(inputs):
            raise invalid("reduce_scatter_tensor_coalesced: as many outputs as inputs needed")
        steps = [self._reduce_scatter_single_step(o, i, opts.reduceOp,
                                                  "reduce_scatter_tensor_coalesced")
                 for o, i in zip(outputs, inputs)]
        return self._run("reduce_scatter_tensor_coalesced", opts, steps, list(outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ---- all-to-all ------------------------------------------------------------------------------------
    @_collective("all_to_all")
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts if opts is not None else _c10d.AllToAllOptions()
        coll = "all_to_all_single"
        check_tensors(coll, (output, input))
        same_dtype(coll, (output, input))
        obuf, staged = contig(output)
        ibuf, _ = contig(input)
        comm = self._comm
        out_splits = list(output_split_sizes or [])
        in_splits = list(input_split_sizes or [])
        if not out_splits and not in_splits:
            if output.numel() != input.numel() or input.numel() % self._size:
                raise invalid(f"{coll}: without split sizes, input and output need the same "
                               f"number of elements, divisible by the world size ({self._size}); "
                               f"got {input.numel()} and {output.numel()}")
            launch = lambda a: comm.all_to_all(obuf, ibuf, async_op=a)  # noqa: E731
        else:
            ie = self._split_elements(coll, "input", input, in_splits)
            oe = self._split_elements(coll, "output", output, out_splits)
            launch = lambda a: comm.all_to_all(obuf, ibuf, output_splits=oe,  # noqa: E731
                                               input_splits=ie, async_op=a)
        step = _Step(launch, writeback(output, obuf) if staged else None)
        return self._run(coll, opts, [step], [output])

    alltoall_base = all_to_all_single

    def _split_elements(self, coll: str, which: str, t: torch.Tensor,
                        splits: list[int]) -> list[int]:
        """torch's split sizes count rows of dim 0; ringcomm's count elements."""
        if t.dim() == 0:
            raise invalid(f"{coll}: {which} must have at least one dimension")
        row = math.prod(t.shape[1:])
        if not splits:
            if t.size(0) % self._size:
                raise invalid(f"{coll}: {which} dim 0 ({t.size(0)}) is not divisible by the "
                               f"world size ({self._size}) and no split sizes were given")
            return [t.size(0) // self._size * row] * self._size
        if len(splits) != self._size or any(s < 0 for s in splits) or sum(splits) != t.size(0):
            raise invalid(f"{coll}: {which} split sizes {splits} must be {self._size} "
                           f"non-negative numbers adding up to dim 0 ({t.size(0)})")
        return [int(s) * row for s in splits]

    @_collective("all_to_all")
    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else _c10d.AllToAllOptions()
        coll = "all_to_all"
        outs, ins = list(output_tensors), list(input_tensors)
        if len(outs) != self._size or len(ins) != self._size:
            raise invalid(f"{coll}: input and output lists need world size ({self._size}) "
                           f"tensors; got {len(ins)} and {len(outs)}")
        check_tensors(coll, [*outs, *ins])
        same_dtype(coll, [*outs, *ins])
        iflat = flat_view(ins) if len({t.numel() for t in ins}) == 1 else None
        iflat = cat(ins) if iflat is None else iflat
        oflat = torch.empty(sum(o.numel() for o in outs), dtype=outs[0].dtype, device=outs[0].device)
        ie = [t.numel() for t in ins]
        oe = [t.numel() for t in outs]
        comm = self._comm
        step = _Step(lambda a: comm.all_to_all(oflat, iflat, output_splits=oe, input_splits=ie,
                                               async_op=a),
                     lambda: copy_out(oflat, outs))
        return self._run(coll, opts, [step], outs)

    # ---- gather / scatter -----------------------------------------------------------------------------
    @_collective("gather")
    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else _c10d.GatherOptions()
        coll = "gather"
        inp = one(coll, input_tensors)
        root = opts.rootRank
        comm = self._comm
        ibuf, _ = contig(inp)
        if self._rank == root:
            outs = list(one(coll, output_tensors, "output list"))
            check_tensors(coll, [inp, *outs])
            same_dtype(coll, [inp, *outs])
            if len(outs) != self._size or any(o.numel() != inp.numel() for o in outs):
                raise invalid(f"{coll}: the root needs {self._size} output tensors of the "
                               f"input's size ({inp.numel()} elements)")
            flat = flat_view(outs)
            finish = None
            if flat is None:
                flat = torch.empty(inp.numel() * self._size, dtype=inp.dtype, device=inp.device)
                finish = lambda: copy_out(flat, outs)  # noqa: E731
            step = _Step(lambda a: comm.gather(flat, ibuf, root=root, async_op=a), finish)
            return self._run(coll, opts, [step], outs)
        if output_tensors and len(output_tensors[0]) > 0:
            raise invalid(f"{coll}: only the root (rank {root}) may pass a gather list")
        check_tensors(coll, (inp,))
        step = _Step(lambda a: comm.gather(None, ibuf, root=root, async_op=a))
        return self._run(coll, opts, [step], [])

    @_collective("scatter")
    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else _c10d.ScatterOptions()
        coll = "scatter"
        out = one(coll, output_tensors)
        root = opts.rootRank
        comm = self._comm
        obuf, staged = contig(out)
        finish = writeback(out, obuf) if staged else None
        if self._rank == root:
            ins = list(one(coll, input_tensors, "input list"))
            check_tensors(coll, [out, *ins])
            same_dtype(coll, [out, *ins])
            if len(ins) != self._size or any(t.numel() != out.numel() for t in ins):
                raise invalid(f"{coll}: the root needs {self._size} input tensors of the "
                               f"output's size ({out.numel()} elements)")
            flat = flat_view(ins)
            flat = cat(ins) if flat is None else flat
            step = _Step(lambda a: comm.scatter(obuf, flat, root=root, async_op=a), finish)
        else:
            if input_tensors and len(input_tensors[0]) > 0:
                raise invalid(f"{coll}: only the root (rank {root}) may pass a scatter list")
            check_tensors(coll, (out,))
            step = _Step(lambda a: comm.scatter(obuf, None, root=root, async_op=a), finish)
        return self._run(coll, opts, [step], [out])

    # ---- barrier ---------------------------------------------------------------------------------------
    @_collective("barrier")
    def barrier(self, opts=None):
        """``opts.timeout`` (``dist.barrier(timeout=)``; unset: the group's timeout) bounds the
        wait: past it, ``ringcomm.TimeoutError`` naming the barrier. The barrier itself stays
        issued, so a late rank still completes it and the ranks' collective order stays aligned."""
        opts = opts if opts is not None else _c10d.BarrierOptions()
        comm = self._comm
        limit = timeout_seconds(getattr(opts, "timeout", None), 0.0)
        if limit <= 0 or limit >= self._timeout_s:
            return self._run("barrier", opts, [_Step(lambda a: comm.barrier(async_op=a))], [])

        def launch(async_op):
            h = _BarrierHandle(comm.barrier(async_op=True), limit, self._rank, self._size)
            if async_op:
                return h
            h.wait()
            return None
        return self._run("barrier", opts, [_Step(launch)], [])

    def monitored_barrier(self, *args, **kwargs):
        raise unsupported("monitored_barrier (torch implements it for gloo only); use barrier()")

    # ---- point to point ---------------------------------------------------------------------------------
    def _check_p2p(self, coll: str, tensors, peer: int, tag: int) -> torch.Tensor:
        t = one(coll, tensors)
        check_tensors(coll, (t,))
        if tag != 0:
            raise unsupported(f"message tags ({coll} with tag={tag}); messages between two "
                               f"ranks match in the order they are issued")
        if not 0 <= peer < self._size or peer == self._rank:
            raise invalid(f"{coll}: invalid peer rank {peer} (group rank {self._rank} of "
                           f"{self._size})")
        return t

    def send(self, tensors, dstRank: int, tag: int = 0):
        t = self._check_p2p("send", tensors, dstRank, tag)
        buf, _ = contig(t)
        comm = self._comm
        return self._run("send", None, [_Step(lambda a: comm.send(buf, dstRank, async_op=a))],
                         [t])

    def recv(self, tensors, srcRank: int, tag: int = 0):
        t = self._check_p2p("recv", tensors, srcRank, tag)
        buf, staged = contig(t)
        comm = self._comm
        step = _Step(lambda a: comm.recv(buf, srcRank, async_op=a),
                     writeback(t, buf) if staged else None)
        return self._run("recv", None, [step], [t], source_rank=srcRank)

    def recv_anysource(self, tensors, tag: int = 0):
        raise unsupported("recv from any source (pass src=)")

    # ---- coalescing (dist._coalescing_manager with a device) ---------------------------------------------
    def _start_coalescing(self, device=None) -> None:
        if self._coalescing is not None:
            raise RuntimeError("ringcomm: coalescing already started on this group")
        self._coalescing = []

    def _end_coalescing(self, device=None):
        works, self._coalescing = self._coalescing or [], None
        return MultiWork(works)

    start_coalescing = _start_coalescing
    end_coalescing = _end_coalescing

    # ---- teardown ---------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop this group's threads and close its communicator (idempotent)."""
        if self._closed:
            return
        self._closed = True
        live_groups.discard(self)
        # Close the communicator first: it fails whatever is still pending, so the waiter thread
        # (possibly blocked on such a handle) can drain and be joined.
        try:
            self._comm.close()
        finally:
            self._waiter.close()

    def abort(self) -> None:
        self.shutdown()


def create_process_group(dist_opts, backend_options=None) -> RingcommProcessGroup:
    """Backend creator registered with ``torch.distributed`` (extended API)."""
    return RingcommProcessGroup(dist_opts.store, dist_opts.group_rank, dist_opts.group_size,
                                dist_opts.timeout, group_name=dist_opts.group_id)

