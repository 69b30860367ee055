"""The hierarchical back end: a communicator whose ranks span several nodes.

The checks are the front's (``front.CommunicatorBase``); this module turns validated buffers into
flat torch views and runs the two-level algorithms (``algorithms.py``) on its executor, in issue
order. A failure on one rank aborts the inter-node engine and closes the node's communicator so
that every other rank fails promptly (see the package docstring).
"""
from __future__ import annotations

import time
from typing import Optional

from ..core.arrays import as_buf
from ..core.config import logger, read
from ..core.errors import ClosedError, PeerFailureError, RingcommError
from ..core.front import CommunicatorBase
from ..core.host import shm_communicator
from ..core.tables import OP_NAMES
from .algorithms import TwoLevelAlgorithms
from .engine_base import convert_error
from .engines import make_engine
from .executor import Executor, HierWork
from .tensors import as_tensor, overlaps
from .topology import Topology, discover

__all__ = ["HierarchicalCommunicator", "from_init"]


def from_init(rank: int, world_size: int, store, prefix: str, timeout: float, knobs=None):
    """The hook ``ringcomm.init`` calls (world_size > 1, store resolved): discover the topology
    and return a HierarchicalCommunicator when the ranks span several nodes, else None (init
    goes on with its shared-memory communicator). ``knobs``: init's ``config.read()`` (read here
    when None)."""
    if knobs is None:
        knobs = read()
    topo = discover(rank, world_size, store, prefix, knobs)
    if topo.num_nodes == 1:
        return None
    return HierarchicalCommunicator(topo, store, prefix, timeout, knobs)


class HierarchicalCommunicator(TwoLevelAlgorithms, CommunicatorBase):
    """A communicator whose ranks span several nodes: ringcomm shared memory inside each node,
    an existing engine (gloo) between nodes. Same methods and attributes as
    ``ringcomm.Communicator``; created by ``ringcomm.init()`` when the ranks span nodes.

    Extra attributes: ``topology`` (Topology), ``node``, ``num_nodes``, ``local_rank``,
    ``local_size``, ``intra`` (the node's Communicator), ``inter_backend`` ("gloo"), and
    ``inter_stats()`` / ``reset_inter_stats()`` (bytes handed to the inter-node engine)."""

    _adapt = staticmethod(as_buf)

    def __init__(self, topology: Topology, store, prefix: str, timeout: float, knobs=None):
        if knobs is None:
            knobs = read()
        self.topology = topology
        self.rank: int = topology.rank
        self.world_size: int = topology.world_size
        self.prefix = prefix
        self.node = topology.node
        self.num_nodes = topology.num_nodes
        self.local_rank = topology.local_rank
        self.local_size = topology.local_size
        self._timeout = float(timeout)
        self._scratch_cache = knobs.hier_scratch_cache
        self._closed = False
        self._broken: Optional[RingcommError] = None
        self._seq = 0
        self._scratch_bufs: dict = {}
        self._perm = None
        self._identity_perm = False
        # The node's shared-memory communicator: init's single-node path for (local rank,
        # local size) under the store prefix {prefix}/node{n}.
        self.intra = shm_communicator(topology.local_rank, topology.local_size, store,
                                      f"{prefix}/node{topology.node}", timeout, knobs=knobs)
        try:
            self._inter = make_engine(topology, store, prefix, timeout, knobs.inter)
        except BaseException:
            self.intra.close()
            raise
        self.inter_backend = self._inter.name
        logger(self.rank, self.world_size, knobs).info(
            f"hierarchical: node {self.node}/{self.num_nodes}, local rank {self.local_rank}/{self.local_size}, "
            f"inter-node engine {self.inter_backend}")
        self._exec = Executor(f"{prefix}/{self.rank}")
        if topology.uniform:
            import torch
            perm = topology.permutation()
            self._identity_perm = perm == list(range(self.world_size))
            self._perm = torch.tensor(perm, dtype=torch.int64)

    # -- attributes ---------------------------------------------------------------------------
    @property
    def timeout(self) -> float:
        return self._timeout

    @property
    def closed(self) -> bool:
        return self._closed

    def inter_stats(self) -> dict:
        """``{op: {"calls": c, "bytes": b}}``: calls into the inter-node engine by this rank and
        the bytes it handed to them (see the package docstring for what is counted)."""
        return {k: {"calls": v[0], "bytes": v[1]} for k, v in self._inter.stats.items()}

    def reset_inter_stats(self) -> None:
        self._inter.stats.clear()

    def __repr__(self):
        state = "closed" if self._closed else ("broken" if self._broken else "open")
        return (f"<ringcomm.HierarchicalCommunicator rank={self.rank} world_size={self.world_size} "
                f"node={self.node}/{self.num_nodes} local_rank={self.local_rank}/{self.local_size} "
                f"inter={self.inter_backend} {state}>")

    # -- plumbing ---------------------------------------------------------------------------------
    def _check_open(self):
        if self._closed:
            raise ClosedError(f"ringcomm: the communicator (rank {self.rank}) is closed")
        if self._broken is not None:
            raise PeerFailureError(f"ringcomm: this hierarchical communicator (rank {self.rank}) "
                                   f"failed earlier and cannot be used: {self._broken}")

    def _submit(self, name: str, fn, async_op: bool):
        """Run ``fn`` in issue order: the HierWork when async_op, else None once it is done."""
        self._check_open()
        self._seq += 1
        work = HierWork(name, self._seq)
        self._exec.submit(work, fn, self._run, async_op)
        if not async_op:
            work.wait()
            return None
        return work

    def _finish(self, work: HierWork, refs, result):
        work._result = result
        return work

    def _run(self, work: HierWork, fn):
        start = time.monotonic()
        try:
            if self._broken is not None:
                raise PeerFailureError(f"ringcomm: hierarchical {work._name} not run: the "
                                       f"communicator failed earlier: {self._broken}")
            if self._closed and work._name != "reject":
                raise ClosedError(f"ringcomm: the communicator (rank {self.rank}) is closed")
            handles = fn()
            work._handles = tuple(handles) if handles else ()
        except BaseException as e:  # noqa: BLE001 - recorded on the work, raised by wait()
            work._error = self._fail(e, work._name, time.monotonic() - start)
        finally:
            work._done.set()

    def _fail(self, e: BaseException, name: str, elapsed: float) -> RingcommError:
        """An operation failed on this rank: abort the inter-node engine and close the node
        communicator so that every other rank fails promptly (see the package docstring)."""
        if self._broken is not None and isinstance(e, PeerFailureError):
            return e
        err = convert_error(e, f"ringcomm: hierarchical {name} failed on rank {self.rank} "
                               f"(node {self.node}, local rank {self.local_rank})",
                            elapsed, self._timeout)
        if self._broken is None:
            self._broken = err
            self._inter.abort()
            try:
                self.intra.close()
            except Exception:  # noqa: BLE001
                pass
        return err

    def _reject(self, coll: str, exc: Exception):
        """Bad arguments on this rank: raise here; tell the node (the peers' shared-memory step
        raises MismatchError) and the other nodes (engine aborted) in issue order."""
        intra = self.intra

        def poison():
            if intra.world_size > 1 and not intra.closed:
                intra.reject(coll, exc)
            raise exc
        if not self._closed and self._broken is None:
            self._seq += 1
            self._exec.submit(HierWork("reject", self._seq), poison, self._run, True)
        raise exc

    # -- issuing (arguments validated by CommunicatorBase) ----------------------------------------
    def _issue_all_reduce(self, bi, bo, opc, async_op, stream):
        src = as_tensor(bi.obj)
        dst = src if bo is bi else as_tensor(bo.obj)
        name = OP_NAMES[opc]
        return self._submit("all_reduce", lambda: self._ar(src, dst, name), async_op)

    def _issue_reduce_scatter(self, bi, bo, opc, async_op, stream):
        src, dst = as_tensor(bi.obj), as_tensor(bo.obj)
        name = OP_NAMES[opc]
        return self._submit("reduce_scatter", lambda: self._rs(dst, src, name), async_op)

    def _issue_all_gather(self, bi, bo, async_op, stream):
        src, dst = as_tensor(bi.obj), as_tensor(bo.obj)
        return self._submit("all_gather", lambda: self._ag(dst, src), async_op)

    def _issue_broadcast(self, b, root, async_op, stream):
        t = as_tensor(b.obj)
        return self._submit("broadcast", lambda: self._bcast(t, root), async_op)

    def _issue_reduce(self, bi, bo, opc, root, async_op, stream):
        src = as_tensor(bi.obj)
        name = OP_NAMES[opc]
        if bo is not None:
            dst = src if bo is bi else as_tensor(bo.obj)
            fn = lambda: self._ar(src, dst, name)  # noqa: E731
        else:
            fn = lambda: self._ar(src, self._scratch("reduce", src.numel(), src.dtype), name)  # noqa: E731
        return self._submit("reduce", fn, async_op)

    def _issue_barrier(self, async_op, stream):
        return self._submit("barrier", self._barrier, async_op)

    def _issue_all_to_all(self, bi, bo, sc, rc, async_op, stream):
        """Over the inter-node engine's flat group (correct, not optimised)."""
        src, dst = as_tensor(bi.obj), as_tensor(bo.obj)
        size = src.element_size()
        ob, ib = [v * size for v in rc], [v * size for v in sc]
        return self._submit("all_to_all", lambda: self._inter.all_to_all(dst, src, ob, ib), async_op)

    def _inter_rooted(self, name, out, inp, block, root, async_op):
        """gather / scatter over the inter-node engine's world group. ``block`` (this rank's
        part, on every rank) is ``inp`` or ``out``; the other is the root's world_size blocks, None
        elsewhere. Nothing moves when the block is empty; an input that overlaps the output is
        copied first (the engine writes the output while it still reads the input)."""
        call = getattr(self._inter, name)

        def fn():
            if block.numel():
                i = inp.clone() if inp is not None and out is not None and overlaps(inp, out) \
                    else inp
                call(out, i, root)
        return self._submit(name, fn, async_op)

    def _issue_gather(self, bi, bo, root, async_op, stream):
        src = as_tensor(bi.obj)
        dst = as_tensor(bo.obj) if bo is not None else None
        return self._inter_rooted("gather", dst, src, src, root, async_op)

    def _issue_scatter(self, bi, bo, root, async_op, stream):
        dst = as_tensor(bo.obj)
        full = as_tensor(bi.obj) if bi is not None else None
        return self._inter_rooted("scatter", dst, full, dst, root, async_op)

    def _issue_send(self, b, peer, tag, async_op, stream):
        """Same node: shared memory; other node: the inter-node engine."""
        t = as_tensor(b.obj)
        return self._submit("send", lambda: self._p2p("send", b.obj, t, peer, tag), async_op)

    def _issue_recv(self, b, peer, tag, async_op, stream):
        t = as_tensor(b.obj)
        return self._submit("recv", lambda: self._p2p("recv", b.obj, t, peer, tag), async_op)

    def _p2p(self, what, x, t, peer, tag):
        topo = self.topology
        if topo.node_of[peer] == self.node:
            fn = self.intra.send if what == "send" else self.intra.recv
            return [fn(x, topo.local_rank_of[peer], async_op=True, tag=tag)]
        if t.numel() == 0:      # both sides know the size: an empty message is no message
            return []
        fn = self._inter.send if what == "send" else self._inter.recv
        return [fn(t, peer, tag)]

    # -- lifetime ----------------------------------------------------------------------------------
    def close(self):
        """Finish queued work, then release the node's shared memory and the inter-node groups.
        Idempotent."""
        if self._closed:
            return
        self._exec.close(self._timeout)
        self._closed = True
        try:
            self._inter.close()
        finally:
            self.intra.close()
            self._scratch_bufs = {}
