"""The MPI inter-node engine (RINGCOMM_INTER=mpi): mpi4py communicators between the nodes."""
from __future__ import annotations

import time

import numpy as np

from ..core.errors import InvalidArgumentError, TimeoutError, UnsupportedError
from ..core.work import Work
from .engine_base import EngineBase
from .tensors import as_bytes
from .topology import Topology

__all__ = ["MPIEngine"]


class MPIWork(Work):
    """An MPI request (waits poll MPI_Test up to a deadline)."""
    __slots__ = ("_eng", "_req", "_what", "_done")

    def __init__(self, eng, req, what):
        self._eng, self._req, self._what, self._done = eng, req, what, False

    def wait(self, timeout=None):
        if not self._done:
            self._eng._wait(self._req, self._what, timeout)
            self._done = True

    def is_completed(self):
        if not self._done:
            self._done = bool(self._req.Test())
        return self._done

    def exception(self):
        return None


class MPIEngine(EngineBase):
    """mpi4py between the nodes (RINGCOMM_INTER=mpi): for jobs started by mpiexec/mpirun whose
    MPI world contains every rank of this communicator. The groups are built with
    ``MPI_Comm_create_group`` (only their members take part), so sub-communicators work.

    Every call is non-blocking and polled with MPI_Test up to the communicator's timeout
    (ringcomm.TimeoutError after). MPI cannot abort one communicator without ending the job, so
    after a failure on one rank the other ranks fail at their timeout, not at once. Reductions
    of float16/bfloat16 run in float32 (MPI has no portable half types); data movement is bytes."""

    name = "mpi"

    def __init__(self, topo: Topology, store, prefix: str, timeout: float):
        import zlib
        super().__init__()
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise UnsupportedError("ringcomm: RINGCOMM_INTER=mpi needs mpi4py (pip install mpi4py) "
                                   "and a job started by mpiexec") from e
        self.MPI = MPI
        self.topo = topo
        self._timeout = timeout
        wc = MPI.COMM_WORLD
        store.set(f"{prefix}/mpi/{topo.rank}", str(wc.Get_rank()))
        mranks = [int(_text(store.get(f"{prefix}/mpi/{r}"))) for r in range(topo.world_size)]
        if len(set(mranks)) != topo.world_size:
            raise InvalidArgumentError(
                f"ringcomm: RINGCOMM_INTER=mpi: the ranks map onto MPI ranks {mranks}; start every "
                f"rank as its own MPI process (mpiexec -n {topo.world_size} ...)")
        wgroup = wc.Get_group()

        def create(name, members):
            g = wgroup.Incl([mranks[r] for r in members])
            tag = zlib.crc32(f"{prefix}/{name}".encode()) % 32000 + 1
            c = wc.Create_group(g, tag)
            g.Free()
            self._handles.append(c)
            return c

        l = topo.local_rank
        col = topo.column(l)
        self.col = create(f"col{l}", col) if len(col) > 1 else None
        self.lead = self.col if l == 0 else None
        self.world = create("world", range(topo.world_size))   # rank = ringcomm rank
        wgroup.Free()
        M = MPI
        self._ops = {"SUM": M.SUM, "AVG": M.SUM, "PRODUCT": M.PROD, "MIN": M.MIN, "MAX": M.MAX,
                     "BAND": M.BAND, "BOR": M.BOR, "BXOR": M.BXOR}

    def _wait(self, req, what, timeout=None):
        t = self._timeout if timeout is None else timeout
        deadline = time.monotonic() + t
        while not req.Test():
            if time.monotonic() > deadline:
                raise TimeoutError(f"ringcomm: inter-node (mpi) {what} did not complete within {t} s")
            time.sleep(0)       # let other threads run; MPI progresses inside Test

    @staticmethod
    def _np(t):
        return as_bytes(t).numpy()

    def _reduce_view(self, t, op):
        """(numpy array to reduce, MPI op, copy-back or None)."""
        import torch
        if t.dtype in (torch.float16, torch.bfloat16):
            f = t.float()
            return f.numpy(), self._ops[op], (lambda: t.copy_(f))
        if t.dtype == torch.bool:
            return t.numpy(), (self.MPI.LAND if op == "MIN" else self.MPI.LOR), None
        return t.numpy(), self._ops[op], None

    def all_reduce(self, g, t, op):
        self._count("all_reduce", self._nbytes(t))
        a, mop, back = self._reduce_view(t, op)
        self._wait(g.Iallreduce(self.MPI.IN_PLACE, a, op=mop), "all_reduce")
        if back:
            back()

    def reduce_scatter(self, g, out, inp, op):
        self._count("reduce_scatter", self._nbytes(inp))
        a, mop, _ = self._reduce_view(inp, op)
        b, _, back = self._reduce_view(out, op)
        self._wait(g.Ireduce_scatter_block(a, b, op=mop), "reduce_scatter")
        if back:
            back()

    def all_gather(self, g, out, inp, what="all_gather"):
        self._count(what, self._nbytes(inp))
        self._wait(g.Iallgather(self._np(inp), self._np(out)), what)

    def broadcast(self, g, t, root):
        self._count("broadcast", self._nbytes(t))
        self._wait(g.Ibcast(self._np(t), root=root), "broadcast")

    def barrier(self, g):
        self._count("barrier", 0)
        self._wait(g.Ibarrier(), "barrier")

    def gather(self, out, inp, root):
        self._count("gather", self._nbytes(inp))
        self._wait(self.world.Igather(self._np(inp), self._np(out) if out is not None else None,
                                      root=root), "gather")

    def scatter(self, out, inp, root):
        self._count("scatter", self._nbytes(out))
        self._wait(self.world.Iscatter(self._np(inp) if inp is not None else None, self._np(out),
                                       root=root), "scatter")

    def all_to_all(self, out, inp, out_splits, in_splits):
        self._count("all_to_all", self._nbytes(inp))
        W = self.topo.world_size
        if not in_splits:
            in_splits = [self._nbytes(inp) // W] * W
        if not out_splits:
            out_splits = [self._nbytes(out) // W] * W
        sd = np.concatenate([[0], np.cumsum(in_splits)[:-1]]).tolist()
        rd = np.concatenate([[0], np.cumsum(out_splits)[:-1]]).tolist()
        self._wait(self.world.Ialltoallv([self._np(inp), (list(in_splits), sd)],
                                         [self._np(out), (list(out_splits), rd)]), "all_to_all")

    def send(self, t, dst, tag):
        self._count("send", self._nbytes(t))
        return MPIWork(self, self.world.Isend(self._np(t), dest=dst, tag=tag), f"send to rank {dst}")

    def recv(self, t, src, tag):
        self._count("recv", self._nbytes(t))
        return MPIWork(self, self.world.Irecv(self._np(t), source=src, tag=tag),
                        f"recv from rank {src}")

    def abort(self):
        pass    # see the class docstring: other ranks fail at their timeout

    def close(self):
        self._release(lambda c: c.Free(), forget_groups=True)


def _text(v) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)
