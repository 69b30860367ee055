"""The gloo inter-node engine: torch.distributed's ProcessGroupGloo groups between the nodes."""
from __future__ import annotations

import datetime
import os
import time

from ..core.work import Work, wait_until
from .engine_base import EngineBase, convert_error
from .tensors import as_bytes
from .topology import Topology

__all__ = ["GlooEngine", "c10d_store"]


def c10d_store(store):
    """torch.distributed needs a c10d Store; wrap a duck-typed one (ringcomm's FileStore, any
    object with set/get) in a Python subclass of ``torch.distributed.Store``. The caller must
    keep the returned object referenced while torch uses it (a pybind11 trampoline: the C++
    side does not keep the Python object alive)."""
    import torch.distributed as dist
    if isinstance(store, dist.Store):
        return store

    class _Adapter(dist.Store):
        def __init__(self, inner):
            super().__init__()
            self._inner = inner

        def set(self, key, value):
            self._inner.set(key, value)

        def get(self, key):
            v = self._inner.get(key)
            return v.encode() if isinstance(v, str) else bytes(v)

        def wait(self, keys, timeout=None):
            for k in keys:
                self._inner.get(k)

        def check(self, keys):
            chk = getattr(self._inner, "check", None)
            if chk is not None:
                return chk(keys)
            f = getattr(self._inner, "_file", None)
            return f is not None and all(os.path.exists(f(k)) for k in keys)

    return _Adapter(store)


class GlooWork(Work):
    """An inter-node point-to-point handle (gloo's send/recv work)."""
    __slots__ = ("_w", "_what", "_start", "_timeout")

    def __init__(self, w, what, timeout):
        self._w, self._what = w, what
        self._start, self._timeout = time.monotonic(), timeout

    def _error(self, e):
        return convert_error(e, self._what, time.monotonic() - self._start, self._timeout)

    def wait(self, timeout=None):
        wait_until(self._w.is_completed, timeout, self._what)
        try:
            self._w.wait()
        except Exception as e:  # noqa: BLE001 - gloo raises RuntimeError
            raise self._error(e) from e

    def is_completed(self):
        return self._w.is_completed()

    def exception(self):
        if not self._w.is_completed():
            return None
        try:
            self._w.wait()
        except Exception as e:  # noqa: BLE001
            return self._error(e)
        return None


class GlooEngine(EngineBase):
    """torch.distributed gloo process groups, created directly (``ProcessGroupGloo`` on a
    ``PrefixStore`` of the communicator's store): the default process group, if the user has
    one, is neither used nor touched. Every call counts the bytes handed to gloo."""

    name = "gloo"

    def __init__(self, topo: Topology, store, prefix: str, timeout: float):
        import torch.distributed as dist
        super().__init__()
        self._dist = dist
        self._base = c10d_store(store)   # keep the Python store object alive (pybind trampoline)
        td = datetime.timedelta(seconds=timeout)
        self.topo = topo
        self._timeout = timeout
        l = topo.local_rank
        col = topo.column(l)
        if len(col) > 1:
            self.col = self._group(f"{prefix}/inter/col{l}", col.index(topo.rank), len(col), td)
        self.lead = self.col if l == 0 else None
        self.world = self._group(f"{prefix}/inter/world", topo.rank, topo.world_size, td)
        # A gloo group is usable on one rank before its peers have finished connecting: the
        # rank that accepted a connection may return, fail a call locally and close its sockets
        # while the peer still reads the handshake ("Connection closed by peer"). One barrier
        # over the world group (created last) means every rank finished every group.
        self.world.barrier(dist.BarrierOptions()).wait()
        R = dist.ReduceOp
        self._ops = {"SUM": R.SUM, "AVG": R.SUM, "PRODUCT": R.PRODUCT, "MIN": R.MIN,
                     "MAX": R.MAX, "BAND": R.BAND, "BOR": R.BOR, "BXOR": R.BXOR}

    def _group(self, prefix, rank, size, td):
        pg = self._dist.ProcessGroupGloo(self._dist.PrefixStore(prefix, self._base), rank, size, td)
        self._handles.append(pg)
        return pg

    # collectives (block until done) ----------------------------------------------------------
    def all_reduce(self, g, t, op: str):
        self._count("all_reduce", self._nbytes(t))
        o = self._dist.AllreduceOptions()
        o.reduceOp = self._ops[op]
        g.allreduce([t], o).wait()

    def reduce_scatter(self, g, out, inp, op: str):
        self._count("reduce_scatter", self._nbytes(inp))
        o = self._dist.ReduceScatterOptions()
        o.reduceOp = self._ops[op]
        g._reduce_scatter_base(out, inp, o).wait()

    def all_gather(self, g, out, inp, what="all_gather"):
        self._count(what, self._nbytes(inp))
        g._allgather_base(as_bytes(out), as_bytes(inp)).wait()

    def _rooted(self, options, root: int):
        o = options()
        o.rootRank = root
        return o

    def _blocks(self, full) -> list:
        """The root's flat buffer of world_size blocks as gloo's [[block, ...]]; [] elsewhere."""
        if full is None:
            return []
        return [[as_bytes(t) for t in full.view(self.topo.world_size, -1).unbind(0)]]

    def broadcast(self, g, t, root: int):
        self._count("broadcast", self._nbytes(t))
        g.broadcast([as_bytes(t)], self._rooted(self._dist.BroadcastOptions, root)).wait()

    def barrier(self, g):
        self._count("barrier", 0)
        g.barrier().wait()

    def gather(self, out, inp, root: int):
        """out: the root's flat output (world_size blocks), None elsewhere."""
        self._count("gather", self._nbytes(inp))
        self.world.gather(self._blocks(out), [as_bytes(inp)],
                          self._rooted(self._dist.GatherOptions, root)).wait()

    def scatter(self, out, inp, root: int):
        """inp: the root's flat input (world_size blocks), None elsewhere."""
        self._count("scatter", self._nbytes(out))
        self.world.scatter([as_bytes(out)], self._blocks(inp),
                           self._rooted(self._dist.ScatterOptions, root)).wait()

    def all_to_all(self, out, inp, out_splits, in_splits):
        self._count("all_to_all", self._nbytes(inp))
        self.world.alltoall_base(as_bytes(out), as_bytes(inp), out_splits, in_splits,
                                 self._dist.AllToAllOptions()).wait()

    # point to point (return a handle) ----------------------------------------------------------
    def send(self, t, dst: int, tag: int):
        self._count("send", self._nbytes(t))
        return GlooWork(self.world.send([as_bytes(t)], dst, tag),
                        f"ringcomm: inter-node send to rank {dst}", self._timeout)

    def recv(self, t, src: int, tag: int):
        self._count("recv", self._nbytes(t))
        return GlooWork(self.world.recv([as_bytes(t)], src, tag),
                        f"ringcomm: inter-node recv from rank {src}", self._timeout)

    # lifetime ----------------------------------------------------------------------------------------
    def abort(self):
        self._release(lambda pg: pg.abort(), forget_groups=False)   # closes the sockets

    def close(self):
        self._release(lambda pg: pg.shutdown(), forget_groups=True)
