"""The torch entry points of the ringcomm backend: every collective and point-to-point call torch
makes, by torch's method names, each mapped onto ringcomm's Python API (see the table in the
README, "Use with PyTorch"). Tensors are handed to ringcomm in place; a copy is made only where
torch's call shape differs from ringcomm's (a list of tensors where ringcomm takes one flat tensor,
a non-contiguous tensor, a PREMUL_SUM factor applied to an input that must stay unchanged). Those
compositions are whole-tensor operations in Python; nothing loops over elements or chunks.
"""
from __future__ import annotations

import torch
from torch._C import _distributed_c10d as _c10d

from .core import GroupCore
from .monitored import run_monitored_barrier
from .staging import (avg_divide, cat, check_tensors, contig, copy_out, flat_view, int_avg,
                      invalid, one, reduce_op, reducible, same_dtype, then, unsupported, writeback)
from .sparse import check_sparse, sparse_all_reduce
from .steps import BarrierHandle, DoneHandle, Step, collective
from .work import timeout_seconds

__all__ = ["Collectives"]


class Collectives(GroupCore):
    """Every torch collective and point-to-point call, on a ``GroupCore``."""

    _ringcomm_backend = True  # the marker monitored.py recognises a ringcomm backend by

    # ---- all-reduce ------------------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None, offered: bool = False):
        """c10d ``allreduce``. ``offered``: the c10d trampoline's offer point offered this call
        to the synchronous entry, which declined it (the trampoline passes it; torch's own calls
        of the whole-group ProcessGroup never do): it then takes the general path and is never
        offered again (``GroupCore._runner``)."""
        if len(tensors) == 1 and tensors[0].layout == torch.sparse_coo:
            return self.allreduce_sparse(tensors, opts)  # the whole-group ProcessGroup's route
        return self._allreduce_general(tensors, opts, offered)

    @collective("all_reduce")
    def _allreduce_general(self, tensors, opts=None, offered: bool = False):
        opts = opts if opts is not None else _c10d.AllreduceOptions()
        t = one("allreduce", tensors)
        check_tensors("allreduce", (t,))
        return self._run("allreduce", opts,
                         [self._allreduce_step(t, opts.reduceOp, "allreduce", offered)],
                         [t])

    @collective("all_gather")
    def allreduce_sparse(self, tensors, opts=None):
        # Three dependent all_gathers (sparse.py): run where it is issued, also for async_op
        # (the returned work is then already complete).
        opts = opts if opts is not None else _c10d.AllreduceOptions()
        t = one("allreduce_sparse", tensors)
        check_sparse(t, opts.reduceOp)
        comm, world = self._comm, self._size

        def launch(async_op):
            sparse_all_reduce(comm, t, world)
            return DoneHandle() if async_op else None
        return self._run("allreduce_sparse", opts, [Step(launch)], [t])

    @collective("all_reduce")
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
    def _rooted(self, coll: str, tensors, opts):
        """The one tensor and the root rank of a rooted call (broadcast, reduce)."""
        t = one(coll, tensors)
        check_tensors(coll, (t,))
        if opts.rootTensor != 0:
            raise unsupported(f"{coll} with rootTensor != 0")
        return t, opts.rootRank

    @collective("broadcast")
    def broadcast(self, tensors, opts=None, offered: bool = False):
        """c10d ``broadcast``; ``offered`` as for ``allreduce``."""
        opts = opts if opts is not None else _c10d.BroadcastOptions()
        t, root = self._rooted("broadcast", tensors, opts)
        buf, staged = contig(t)
        comm = self._runner(offered)
        step = Step(lambda a: comm.broadcast(buf, root=root, async_op=a),
                     writeback(t, buf) if staged and self._rank != root else None)
        return self._run("broadcast", opts, [step], [t])

    @collective("reduce")
    def reduce(self, tensors, opts=None, offered: bool = False):
        """c10d ``reduce``; ``offered`` as for ``allreduce``."""
        opts = opts if opts is not None else _c10d.ReduceOptions()
        t, root = self._rooted("reduce", tensors, opts)
        rop, factor = reduce_op(opts.reduceOp, t.dtype)
        buf, staged = contig(t)
        if factor is not None:
            if self._rank == root:
                buf.mul_(factor)
            else:
                buf = buf * factor
                staged = False
        comm = self._runner(offered)
        rbuf = reducible(buf, rop)
        on_root = self._rank == root
        step = Step(lambda a: comm.reduce(rbuf, root=root, op=rop, async_op=a),
                     then(avg_divide(buf, self._size)
                          if on_root and int_avg(opts.reduceOp, t.dtype) else None,
                          writeback(t, buf) if staged and on_root else None))
        return self._run("reduce", opts, [step], [t])

    @collective("all_gather")
    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        outs = list(one("allgather", output_tensors, "output list"))
        inp = one("allgather", input_tensors)
        return self._run("allgather", opts, [self._allgather_list_step(outs, inp, "allgather")],
                         outs)

    @collective("all_gather")
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
        step = Step(lambda a: comm.all_gather(flat_out, flat_in, async_op=a),
                     lambda: copy_out(flat_out, outs))
        return self._run(coll, opts, [step], outs)

    @collective("all_gather")
    def all_gather_single(self, output, input, opts=None):
        opts = opts if opts is not None else _c10d.AllgatherOptions()
        return self._run("all_gather_into_tensor", opts,
                         [self._all_gather_single_step(output, input, "all_gather_into_tensor")],
                         [output])

    _allgather_base = all_gather_single

    @collective("all_gather")
    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        coll = "all_gather_into_tensor_coalesced"
        return self._pairwise(coll, opts if opts is not None else _c10d.AllgatherOptions(),
                              outputs, inputs,
                              lambda o, i: self._all_gather_single_step(o, i, coll))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # ---- reduce-scatter --------------------------------------------------------------------------------
    @collective("reduce_scatter")
    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        out = one("reduce_scatter", output_tensors)
        ins = list(one("reduce_scatter", input_lists, "input list"))
        self._check_per_rank("reduce_scatter", out, ins, "input", "output")
        flat = flat_view(ins)
        flat = cat(ins) if flat is None else flat
        step = self._reduce_scatter_single_step(out, flat, opts.reduceOp, "reduce_scatter")
        return self._run("reduce_scatter", opts, [step], [out])

    @collective("reduce_scatter")
    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        step = self._reduce_scatter_single_step(output, input, opts.reduceOp,
                                                "reduce_scatter_tensor")
        return self._run("reduce_scatter_tensor", opts, [step], [output])

    _reduce_scatter_base = reduce_scatter_single

    @collective("reduce_scatter")
    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        coll = "reduce_scatter_tensor_coalesced"
        opts = opts if opts is not None else _c10d.ReduceScatterOptions()
        return self._pairwise(coll, opts, outputs, inputs,
                              lambda o, i: self._reduce_scatter_single_step(o, i, opts.reduceOp,
                                                                            coll))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ---- all-to-all ------------------------------------------------------------------------------------
    @collective("all_to_all")
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None,
                          offered: bool = False):
        """c10d ``alltoall_base``; ``offered`` as for ``allreduce``."""
        opts = opts if opts is not None else _c10d.AllToAllOptions()
        coll = "all_to_all_single"
        check_tensors(coll, (output, input))
        same_dtype(coll, (output, input))
        obuf, staged = contig(output)
        ibuf, _ = contig(input)
        comm = self._runner(offered)
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
        step = Step(launch, writeback(output, obuf) if staged else None)
        return self._run(coll, opts, [step], [output])

    alltoall_base = all_to_all_single

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
        step = Step(lambda a: comm.all_to_all(oflat, iflat, output_splits=oe, input_splits=ie,
                                               async_op=a),
                     lambda: copy_out(oflat, outs))
        return self._run(coll, opts, [step], outs)

    # ---- gather / scatter -----------------------------------------------------------------------------
    def _root_list(self, coll: str, single: torch.Tensor, lists, listed: str,
                   other: str) -> list[torch.Tensor]:
        """The root's list (``lists[0]``) of one tensor per rank, each of ``single``'s size."""
        per_rank = list(one(coll, lists, f"{listed} list"))
        check_tensors(coll, [single, *per_rank])
        same_dtype(coll, [single, *per_rank])
        if len(per_rank) != self._size or any(t.numel() != single.numel() for t in per_rank):
            raise invalid(f"{coll}: the root needs {self._size} {listed} tensors of the "
                           f"{other}'s size ({single.numel()} elements)")
        return per_rank

    @staticmethod
    def _no_list_off_root(coll: str, lists, root: int) -> None:
        if lists and len(lists[0]) > 0:
            raise invalid(f"{coll}: only the root (rank {root}) may pass a {coll} list")

    @collective("gather")
    def gather(self, output_tensors, input_tensors, opts=None, offered: bool = False):
        """c10d ``gather``; ``offered`` as for ``allreduce``."""
        opts = opts if opts is not None else _c10d.GatherOptions()
        inp, root, comm = one("gather", input_tensors), opts.rootRank, self._runner(offered)
        ibuf, _ = contig(inp)
        if self._rank != root:
            self._no_list_off_root("gather", output_tensors, root)
            check_tensors("gather", (inp,))
            step = Step(lambda a: comm.gather(None, ibuf, root=root, async_op=a))
            return self._run("gather", opts, [step], [])
        outs = self._root_list("gather", inp, output_tensors, "output", "input")
        flat = flat_view(outs)
        finish = None
        if flat is None:
            flat = torch.empty(inp.numel() * self._size, dtype=inp.dtype, device=inp.device)
            finish = lambda: copy_out(flat, outs)  # noqa: E731
        step = Step(lambda a: comm.gather(flat, ibuf, root=root, async_op=a), finish)
        return self._run("gather", opts, [step], outs)

    @collective("scatter")
    def scatter(self, output_tensors, input_tensors, opts=None, offered: bool = False):
        """c10d ``scatter``; ``offered`` as for ``allreduce``."""
        opts = opts if opts is not None else _c10d.ScatterOptions()
        out, root, comm = one("scatter", output_tensors), opts.rootRank, self._runner(offered)
        obuf, staged = contig(out)
        flat = None
        if self._rank == root:
            ins = self._root_list("scatter", out, input_tensors, "input", "output")
            flat = flat_view(ins)
            flat = cat(ins) if flat is None else flat
        else:
            self._no_list_off_root("scatter", input_tensors, root)
            check_tensors("scatter", (out,))
        step = Step(lambda a: comm.scatter(obuf, flat, root=root, async_op=a),
                    writeback(out, obuf) if staged else None)
        return self._run("scatter", opts, [step], [out])

    # ---- barrier ---------------------------------------------------------------------------------------
    @collective("barrier")
    def barrier(self, opts=None, offered: bool = False):
        """``opts.timeout`` (``dist.barrier(timeout=)``; unset: the group's timeout) bounds the
        wait: past it, ``ringcomm.TimeoutError`` naming the barrier. The barrier itself stays
        issued, so a late rank still completes it and the ranks' collective order stays aligned.
        ``offered`` as for ``allreduce``."""
        opts = opts if opts is not None else _c10d.BarrierOptions()
        comm = self._runner(offered)
        limit = timeout_seconds(getattr(opts, "timeout", None), 0.0)
        if limit <= 0 or limit >= self._timeout_s:
            return self._run("barrier", opts, [Step(lambda a: comm.barrier(async_op=a))], [])

        def launch(async_op):
            h = BarrierHandle(comm.barrier(async_op=True), limit, self._rank, self._size)
            if async_op:
                return h
            h.wait()
            return None
        return self._run("barrier", opts, [Step(launch)], [])

    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier (c10d ``monitoredBarrier``): see ``monitored.py``.
        ``timeout``: a timedelta or seconds; None or negative (unset): the group's; zero: none
        (rank 0 raises unless every rank has arrived)."""
        run_monitored_barrier(self, timeout, wait_all_ranks)

    def _monitored_barrier(self, timeout, wait_all_ranks: bool) -> None:
        # The trampoline's target for c10d monitoredBarrier (``ProcessGroup.monitored_barrier``
        # from torch reaches the CPU backend here): BarrierOptions.timeout, negative when unset.
        self.monitored_barrier(timeout, wait_all_ranks)

    # ---- point to point ---------------------------------------------------------------------------------
    def _check_p2p(self, coll: str, tensors, peer: int | None, tag: int) -> torch.Tensor:
        """The one tensor of a point-to-point call; peer None: a receive from any source."""
        t = one(coll, tensors)
        check_tensors(coll, (t,))
        if tag < 0:
            raise invalid(f"{coll}: tag must be >= 0, got {tag}")
        if peer is not None and (not 0 <= peer < self._size or peer == self._rank):
            raise invalid(f"{coll}: invalid peer rank {peer} (group rank {self._rank} of "
                           f"{self._size})")
        return t

    def send(self, tensors, dstRank: int, tag: int = 0):
        t = self._check_p2p("send", tensors, dstRank, tag)
        buf, _ = contig(t)
        comm = self._comm
        return self._run("send", None, [Step(lambda a: comm.send(buf, dstRank, async_op=a, tag=tag))],
                         [t])

    def recv(self, tensors, srcRank: int, tag: int = 0):
        t = self._check_p2p("recv", tensors, srcRank, tag)
        buf, staged = contig(t)
        comm = self._comm
        step = Step(lambda a: comm.recv(buf, srcRank, async_op=a, tag=tag),
                     writeback(t, buf) if staged else None)
        return self._run("recv", None, [step], [t], source_rank=srcRank)

    def recv_anysource(self, tensors, tag: int = 0):
        # The sender is known once the message is matched: the work's source rank is read from
        # the ringcomm handle (async) or the call's return value (sync) after the wait.
        t = self._check_p2p("recv_anysource", tensors, None, tag)
        buf, staged = contig(t)
        comm = self._comm
        got: list = []

        def launch(a):
            r = comm.recv(buf, None, async_op=a, tag=tag)
            got.append(r)
            return r if a else None

        def source() -> int:
            if not got:
                return -1
            r = got[0]
            return r if isinstance(r, int) else r.source()
        step = Step(launch, writeback(t, buf) if staged else None)
        return self._run("recv_anysource", None, [step], [t], source_rank=source)

