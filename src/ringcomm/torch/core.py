"""The core of the ringcomm torch backend shared by both ways torch may hold it (a whole
``ProcessGroup`` or a per-device c10d ``Backend``, see ``backend.py``): the group's state, issuing
a torch call as one or more ringcomm calls (``_run``), the step builders several entry points
share, coalescing blocks and teardown.

Threads per group: one *waiter* that observes completions in issue order, and a small completion
pool that completes ``torch.futures.Future`` objects (see ``work.py`` for why two). Both are joined
in ``shutdown()`` (called by ``destroy_process_group``) and at interpreter exit.
"""
from __future__ import annotations

import datetime
import itertools
import math
import time

import torch
from torch._C._distributed_c10d import Backend as _C10dBackend

import ringcomm

from .hooks import forget_direct_calls, issue_hooks, live_groups
from .staging import (avg_divide, check_tensors, contig, copy_out, flat_view, int_avg, invalid,
                      reduce_op, reducible, same_dtype, then, writeback)
from .steps import Step
from .work import DoneWork, MultiWork, RingcommWork, Waiter, timeout_seconds

__all__ = ["GroupCore", "RingcommOptions", "BACKEND_NAME"]

BACKEND_NAME = "ringcomm"


class RingcommOptions(_C10dBackend.Options):
    """c10d ``Backend.Options`` of a ringcomm group (backend name, timeout, group name and
    description), copyable as torch's ``split_group`` copies its parent's options (the base
    class has no ``__deepcopy__``)."""

    def __init__(self, timeout: datetime.timedelta = datetime.timedelta(minutes=30)):
        super().__init__(BACKEND_NAME, timeout)

    def __deepcopy__(self, memo):
        o = RingcommOptions(self._timeout)
        o.group_name = self.group_name
        o.group_desc = self.group_desc
        o.global_ranks_in_group = list(self.global_ranks_in_group)
        return o


# ---- the group core ------------------------------------------------------------------------------
class GroupCore:
    """The state of one ringcomm group (its Communicator, waiter thread, sequence numbers,
    coalescing block) and how a torch call is issued on it. Mixed in before a torch base that
    takes ``(rank, size)``: ``dist.ProcessGroup`` or the c10d Backend trampoline."""

    _kind = "RingcommGroup"

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta | float,
                 group_name: str = "", group_desc: str = "undefined", meet: str = ""):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._timeout_s = timeout_seconds(timeout, 1800.0)
        self._group_name = str(group_name)
        self._group_desc = str(group_desc)
        # A group name restarts after destroy_process_group + re-init on the same store: number
        # this group's incarnations so that every one gets fresh keys (and shm names).
        n = int(store.add("ringcomm/incarnations", 1))
        self._incarnation = (n - 1) // size
        # ``meet``: the key the ranks meet under when the group's name may differ between them
        # (a split group, see split()); the group's name otherwise.
        self._prefix = f"ringcomm/{meet or self._group_name or 'pg'}/{self._incarnation}"
        self._store = store     # shrink() makes the smaller group's communicator on it
        self._shrinks = 0       # groups shrink() made from this one
        self._split_children: dict = {}   # group name -> the backend split() made for it
        self._split_counts: dict = {}     # sorted member ranks -> splits made into them
        self._options: RingcommOptions | None = None   # made by _backend_options()
        self._comm = ringcomm.init(rank=rank, world_size=size, store=store,
                                   timeout=self._timeout_s, prefix=self._prefix)
        # The communicator's general path, which offers nothing to the synchronous entry: it
        # runs what the c10d trampoline's offer point has offered already (the trampoline says
        # so: ``offered`` of allreduce and broadcast).
        self._general = self._comm.general()
        self._waiter = Waiter(f"{self._group_name or 'pg'}.{self._incarnation}")
        self._seq = itertools.count(1)  # next() is atomic under the GIL
        self._issued = 0                # the last number _seq gave: calls issued so far
        self._coalescing: list[RingcommWork] | None = None
        self._closed = False
        self._fast_native = False   # the trampoline's offer point is on (its _set_fast_path said so)
        live_groups.add(self)
        self._refresh_fast()

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
        return (f"{self._kind}(name={self._group_name!r}, rank={self._rank}, "
                f"size={self._size}, incarnation={self._incarnation})")

    @property
    def communicator(self):
        """The ringcomm Communicator this group runs on."""
        return self._comm

    def _reject(self, coll: str, exc: Exception) -> None:
        """Join collective ``coll``'s header exchange as a refusal; every rank then raises."""
        if not self._comm.closed:
            try:
                self._comm.reject(coll, exc)  # raises exc after the exchange
            except Exception as e:  # noqa: BLE001
                if e is not exc:
                    raise exc from e
        raise exc

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        """The group's timeout for works issued from now on, and the communicator's bound on
        every wait that starts from now on (c10d ``setTimeout``)."""
        self._timeout_s = timeout_seconds(timeout, self._timeout_s)
        if not self._closed:
            self._comm.set_timeout(self._timeout_s)

    def get_error(self):
        """c10d ``getError``: torch's ``ErrorType`` of the first error that made this group's
        communicator unusable: SUCCESS (none), TIMEOUT (a wait ran past its timeout),
        REMOTE_ERROR (a peer failed or aborted), COMM_ERROR (anything else, this rank's own
        abort included)."""
        from torch._C._distributed_c10d import ErrorType
        e = self._comm.errored()
        if e is None:
            return ErrorType.SUCCESS
        if isinstance(e, ringcomm.TimeoutError):
            return ErrorType.TIMEOUT
        if isinstance(e, ringcomm.PeerFailureError):
            return ErrorType.REMOTE_ERROR
        return ErrorType.COMM_ERROR

    # ---- issuing ------------------------------------------------------------------------------------
    def _run(self, op: str, opts, steps: list[Step], outputs: list[torch.Tensor],
             source_rank: int = -1) -> RingcommWork:
        if self._closed:
            raise ringcomm.ClosedError(f"ringcomm: {op} on a process group that was shut down")
        seq = next(self._seq)
        self._issued = seq
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
            e._ringcomm_issued = True  # ringcomm has told the other ranks (see steps.collective)
            raise
        finisher = then(*[s.finish for s in steps])
        work = RingcommWork(op, seq, handles, outputs, finisher, self._timeout_s, self._waiter,
                            source_rank)
        if self._coalescing is not None:
            self._coalescing.append(work)
        return work

    # ---- step builders (one ringcomm call each) -----------------------------------------------------
    def _runner(self, offered: bool):
        """What runs a call that reached Python: the general path when the c10d trampoline's
        offer point has offered it to the synchronous entry (which declined it), so it is never
        offered again; otherwise the communicator, whose synchronous entry is offered what it
        runs synchronously (once: nothing offered it before)."""
        return self._general if offered else self._comm

    def _allreduce_step(self, t: torch.Tensor, op, coll: str, offered: bool = False) -> Step:
        rop, factor = reduce_op(op, t.dtype)
        buf, staged = contig(t)
        buf = reducible(buf, rop)
        if factor is not None:
            buf.mul_(factor)  # in place: the all-reduce overwrites the tensor anyway
        comm = self._runner(offered)
        return Step(lambda a: comm.all_reduce(buf, op=rop, async_op=a),
                     then(avg_divide(buf, self._size) if int_avg(op, t.dtype) else None,
                          writeback(t, buf) if staged else None))

    def _all_gather_single_step(self, out: torch.Tensor, inp: torch.Tensor, coll: str) -> Step:
        check_tensors(coll, (out, inp))
        same_dtype(coll, (out, inp))
        if out.numel() != inp.numel() * self._size:
            raise invalid(f"{coll}: output has {out.numel()} elements, expected world_size "
                           f"({self._size}) x input ({inp.numel()})")
        obuf, staged = contig(out)
        ibuf, _ = contig(inp)
        comm = self._comm
        return Step(lambda a: comm.all_gather(obuf, ibuf, async_op=a),
                     writeback(out, obuf) if staged else None)

    def _reduce_scatter_single_step(self, out: torch.Tensor, inp: torch.Tensor, op,
                                    coll: str) -> Step:
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
        return Step(lambda a: comm.reduce_scatter(ro, ri, op=rop, async_op=a),
                     then(avg_divide(obuf, self._size) if int_avg(op, inp.dtype) else None,
                          writeback(out, obuf) if staged else None))

    def _check_per_rank(self, coll: str, single: torch.Tensor, per_rank: list[torch.Tensor],
                        listed: str, other: str) -> None:
        """A list of one tensor per rank (the ``listed`` side), each of ``single``'s size."""
        check_tensors(coll, [single, *per_rank])
        same_dtype(coll, [single, *per_rank])
        if len(per_rank) != self._size:
            raise invalid(f"{coll}: {listed} list has {len(per_rank)} tensors, world size is "
                           f"{self._size}")
        for t in per_rank:
            if t.numel() != single.numel():
                raise invalid(f"{coll}: every {listed} tensor must have the {other}'s size "
                               f"({single.numel()} elements); got {t.numel()}")

    def _pairwise(self, coll: str, opts, outputs, inputs, step) -> "RingcommWork":
        """A coalesced call of single-tensor collectives: ``step(output, input)`` for each pair."""
        if len(outputs) != len(inputs):
            raise invalid(f"{coll}: as many outputs as inputs needed")
        return self._run(coll, opts, [step(o, i) for o, i in zip(outputs, inputs)], list(outputs))

    def _allgather_list_step(self, outs: list[torch.Tensor], inp: torch.Tensor, coll: str) -> Step:
        self._check_per_rank(coll, inp, outs, "output", "input")
        ibuf, _ = contig(inp)
        flat = flat_view(outs)
        finish = None
        if flat is None:
            flat = torch.empty(inp.numel() * self._size, dtype=inp.dtype, device=inp.device)
            finish = lambda: copy_out(flat, outs)  # noqa: E731
        comm = self._comm
        return Step(lambda a: comm.all_gather(flat, ibuf, async_op=a), finish)

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

    # ---- the trampoline's allreduce / broadcast fast path (trampoline.cpp) -----------------------------
    @property
    def _trampoline(self) -> bool:
        """Whether this group is the per-device c10d Backend (the trampoline's subclass)."""
        return hasattr(self, "_set_fast_path")

    def _refresh_fast(self) -> None:
        """Turn the c10d trampoline's offer point on (``_set_fast_path``: the synchronous
        entries' table and a handle of this group's communicator) exactly while nothing needs
        the Python half: a communicator with synchronous entries (the host's), not coalescing,
        no issue hooks, not shut down; off otherwise, when the trampoline offers nothing.
        Which calls it offers is the trampoline's to decide (trampoline.cpp, the offer point).
        Called whenever one of those conditions changes."""
        if not self._trampoline:   # the whole-group ProcessGroup shape
            return
        want = not self._closed and self._coalescing is None and not issue_hooks
        if want == self._fast_native:
            return
        if want:
            fast = self._comm.sync_entry_handle()   # None: no synchronous entry (several nodes)
            self._fast_native = fast is not None and bool(self._set_fast_path(*fast))
        else:
            self._set_fast_path(0, 0)
            self._fast_native = False

    # ---- coalescing (dist._coalescing_manager with a device) ---------------------------------------------
    def _start_coalescing(self, device=None) -> None:
        if self._coalescing is not None:
            raise RuntimeError("ringcomm: coalescing already started on this group")
        self._coalescing = []
        self._refresh_fast()

    def _end_coalescing(self, device=None):
        works, self._coalescing = self._coalescing or [], None
        self._refresh_fast()
        return MultiWork(works)

    start_coalescing = _start_coalescing
    end_coalescing = _end_coalescing

    # ---- splitting (dist.split_group, DeviceMesh, eager connect) -----------------------------------------
    supports_splitting = True

    def _backend_options(self):
        """c10d ``getBackendOptions`` (the ``options`` property torch's ``split_group`` copies):
        the backend name, this group's timeout, name and description. The same object each
        time (its Python half, which ``copy.deepcopy`` needs, lives as long as this group)."""
        opts = self._options
        if opts is None:
            opts = self._options = RingcommOptions()
        opts._timeout = datetime.timedelta(seconds=min(self._timeout_s, 10 * 365 * 86400))
        opts.group_name = self._group_name
        opts.group_desc = self._group_desc
        return opts

    @property
    def options(self):
        """The backend's options, as torch's ``split_group`` reads them (``parent.options``)."""
        return self._backend_options()

    def split(self, store, ranks, opts=None):
        """c10d ``split`` (torch's ``ProcessGroup.split_group``, which ``dist.split_group`` and
        DeviceMesh call on the ranks of this group): a new backend of this group's ranks
        ``ranks`` (group ranks, numbered in sorted order) on a communicator of its own, or None
        on a rank outside ``ranks``. The new communicator shares nothing with this one (its
        calls, sequence numbers, abort and shutdown are its own). ``opts``: torch's options
        for it (timeout, group name and description).

        Where the new ranks meet: on this group's store, under ``split/<ranks>/<k>/`` (the k-th
        split of this group into exactly these ranks), not under torch's ``store`` argument,
        which is prefixed with the group's name: torch 2.13 hashes that name from the ranks and
        the number of groups the calling process has registered, which differs between ranks
        once a split has left some rank out (that rank registers nothing). Every member enters
        the same splits in the same order (split_group's contract), so k agrees on all of them,
        and the ranks outside need not take part.

        torch asks once per device type the backend serves (cpu and cuda) with the same options:
        a second call for a group name this group has split into, still open, returns the same
        backend."""
        members = sorted(int(r) for r in ranks)
        if not members or len(set(members)) != len(members) or any(
                not 0 <= r < self._size for r in members):
            raise ValueError(f"ringcomm: split of process group {self._group_name or 'pg'!r} "
                             f"(size {self._size}) into ranks {list(ranks)}: the ranks must be "
                             f"distinct group ranks in [0, {self._size})")
        if self._closed:
            raise ringcomm.ClosedError(f"ringcomm: split of process group "
                                       f"{self._group_name or 'pg'!r}, which was shut down")
        if self._rank not in members:
            return None
        name = str(getattr(opts, "group_name", "") or "") if opts is not None else ""
        desc = str(getattr(opts, "group_desc", "") or "") if opts is not None else ""
        timeout = self._timeout_s
        if opts is not None:
            timeout = timeout_seconds(opts._timeout, self._timeout_s)
        if not name:
            name = f"{self._group_name or 'pg'}:split:{members}"
        child = self._split_children.get(name)
        if child is not None and not child._closed:
            return child
        key = tuple(members)
        k = self._split_counts.get(key, 0)
        self._split_counts[key] = k + 1
        import torch.distributed as dist
        meet = dist.PrefixStore(f"split/{'_'.join(map(str, members))}/{k}/", self._store)
        child = type(self)(meet, members.index(self._rank), len(members), timeout,
                           group_name=name, group_desc=desc or f"{self._group_desc}:split",
                           meet="split")
        self._split_children[name] = child
        return child

    def perform_nocolor_split(self, device=None) -> None:
        """What torch calls (``_new_process_group_helper``) on a rank outside a new group while
        the default group is bound to a device: nothing to do here, since a new ringcomm group's
        ranks meet on the group's own store keys without the others."""

    def eager_connect_single_device(self, device=None) -> None:
        """c10d ``eagerConnectSingleDevice`` (torch calls it when ``init_process_group`` gets a
        ``device_id``): every rank connects now rather than on the first call. The host
        communicator connected every rank in the constructor; a CUDA device creates the CUDA
        communicator now, with a one-element all-reduce on that device (collective: every rank
        passes the same device type)."""
        if self._closed:
            raise ringcomm.ClosedError("ringcomm: eager_connect_single_device on a process group "
                                       "that was shut down")
        if device is None:
            return
        device = torch.device(device)
        if device.type == "cpu":
            return
        if device.type != "cuda":
            raise ValueError(f"ringcomm: eager connect to device {device}: the backend serves "
                             f"'cpu' and 'cuda' devices")
        if not torch.cuda.is_available():
            raise ringcomm.UnsupportedError("ringcomm: CUDA unavailable: torch reports no CUDA "
                                            "device for the eager connect")
        self._comm.all_reduce(torch.zeros(1, device=device))

    # ---- shrinking (dist.shrink_group) -------------------------------------------------------------------
    supports_shrinking = True

    def shrink(self, ranks_to_exclude, shrink_flags: int = 0, opts_override=None):
        """c10d ``shrink``: a new backend of this group's ranks but ``ranks_to_exclude`` (group
        ranks), numbered in order, on a fresh communicator. Every remaining rank calls it (torch's
        ``shrink_group``); an excluded rank must not. ``shrink_flags & SHRINK_ABORT`` aborts this
        group's communicator first, so that calls still pending on it (say, waiting on an
        excluded rank that died) raise at once. This group itself stays until torch destroys it.

        The new communicator meets on this group's store under a prefix of its own
        (``shrink<k>/``, the k-th shrink of this group, the same on every remaining rank since
        they shrink in the same order): its ranks meet without any word from the excluded ones."""
        excluded = sorted({int(r) for r in ranks_to_exclude})
        if any(not 0 <= r < self._size for r in excluded) or self._rank in excluded:
            raise ValueError(f"ringcomm: shrink excluding ranks {excluded} of a group of "
                             f"{self._size} called on rank {self._rank}")
        remaining = [r for r in range(self._size) if r not in excluded]
        if not remaining:
            raise ValueError("ringcomm: shrink would exclude every rank")
        if shrink_flags & 0x01 and not self._closed:   # SHRINK_ABORT
            self._comm.abort(f"rank {self._rank} shrinks process group "
                             f"{self._group_name or 'pg'!r}, excluding ranks {excluded}")
        k = self._shrinks
        self._shrinks += 1
        import torch.distributed as dist
        store = dist.PrefixStore(f"shrink{k}/", self._store)
        return type(self)(store, remaining.index(self._rank), len(remaining), self._timeout_s,
                          group_name=f"{self._group_name or 'pg'}:shrink{k}",
                          group_desc=f"{self._group_desc}:shrunk")

    # ---- teardown ---------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop this group's threads and close its communicator (idempotent)."""
        if self._closed:
            return
        self._closed = True
        live_groups.discard(self)
        forget_direct_calls(self)
        self._refresh_fast()
        # Close the communicator first: it fails whatever is still pending, so the waiter thread
        # (possibly blocked on such a handle) can drain and be joined.
        try:
            self._comm.close()
        finally:
            self._waiter.close()

    def abort(self) -> None:
        """c10d ``abort``: the communicator's abort, which every peer sees (their pending and
        next calls raise, naming this rank), then this group's teardown. Idempotent."""
        if not self._closed:
            self._comm.abort(f"rank {self._rank} aborted process group "
                             f"{self._group_name or 'pg'!r}")
        self.shutdown()

