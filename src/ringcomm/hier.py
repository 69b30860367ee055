"""Beyond one machine: topology discovery and the two-level (hierarchical) communicator.

Inside a node ringcomm keeps its shared-memory ring; between nodes it hands the node-level step
to an existing engine (torch.distributed's gloo for CPU tensors). ``ringcomm.init()`` calls
:func:`from_init` once the store is known: every rank publishes its node id, and when the ranks
span more than one node ``init()`` returns a :class:`HierarchicalCommunicator` (same methods and
attributes as :class:`ringcomm.Communicator`). With one node nothing here creates anything: the
cost is one store round trip (the node ids) and the import of this module.

Topology
    node id = ``RINGCOMM_NODE_ID`` if set (tests fake several nodes on one machine), else
    ``hostname:boot_id``. Nodes are ordered by their lowest global rank, local ranks by global
    rank. The grouping comes from the members of this communicator themselves (never from
    ``LOCAL_WORLD_SIZE``), so a sub-group whose members sit on one node is purely local.

Groups (N nodes, local sizes L_n)
    intra   one ringcomm shared-memory Communicator per node (store prefix ``{prefix}/node{n}``).
    column  per local rank l, the ranks with local rank l on every node that has one (gloo group,
            prefix ``{prefix}/inter/col{l}``; its rank = the node index when nodes are uniform).
            Column 0 is the leaders' group.
    world   one flat gloo group over all ranks (``{prefix}/inter/world``) for the paths that are
            correct rather than fast: all_to_all, gather, scatter, send/recv across nodes, and
            all_gather on uneven nodes.

Algorithms (uniform nodes, L ranks each; M elements)
    all_reduce      intra reduce-scatter (local rank l keeps shard l, M/L elements) -> all_reduce
                    of the shard in column l -> intra all-gather. Only shards cross nodes.
    reduce_scatter  chunk order: the input is permuted so that local rank l's intra block holds
                    the chunks of the column-l ranks (node order), intra reduce-scatter, then a
                    reduce-scatter in column l leaves chunk ``rank`` on every rank (as flat).
    all_gather      all-gather in column l (each rank's block crosses nodes once), intra
                    all-gather, un-permute into rank order. Contribution sizes are exchanged
                    first (one small all-gather), so unequal contributions work as in the flat API.
    broadcast       column of the root's local rank, then intra broadcast.  barrier: intra,
                    leaders, intra.  reduce: all_reduce into scratch (root keeps it).
    Uneven nodes (different local sizes) take leader paths: intra reduce to local rank 0,
    all_reduce among leaders, intra broadcast (reduce_scatter = that + slice; all_gather over
    the world group).
    AVG is SUM everywhere, divided by world_size once at the end (on the shard, before the
    all-gather). Ops and dtypes are those of the flat API, with the same UnsupportedError.

Byte accounting (``inter_stats()``)
    For every call into the inter-node engine the communicator counts the bytes it hands to the
    engine: the size of the buffer given to that call (all_reduce: the shard, M/L bytes per rank;
    reduce_scatter: the block, M/L; all_gather: the own contribution; broadcast: the buffer;
    send/recv: the message). That is the payload, not the wire: a bandwidth-optimal engine with
    n members then sends 2(n-1)/n x payload per rank for all_reduce ((n-1)/n in each of its
    reduce-scatter and all-gather phases), (n-1)/n x payload for reduce_scatter and (n-1) x
    payload for all_gather. ``tests/test_hier_netns.py`` checks the wire figure on a real veth.

Failures
    The inter-node engine has no header exchange, so a rank cannot tell the other nodes that it
    rejected a collective (bad arguments) or failed inside one. It therefore *aborts* the engine
    and closes its node communicator: every other rank fails promptly (PeerFailureError) instead
    of waiting out the timeout, and the communicator is unusable afterwards (like NCCL's
    ncclCommAbort). Argument errors are still raised on the calling rank synchronously.

Knobs
    RINGCOMM_NODE_ID   override this process's node identity (default hostname:boot_id).
    RINGCOMM_INTER     inter-node engine: auto (default: gloo for host memory) | gloo | mpi (mpi4py,
                       jobs started by mpiexec) | nccl (refused with UnsupportedError: NCCL moves
                       CUDA tensors, which this communicator does not take yet).
    RINGCOMM_HIER_SCRATCH_CACHE  bytes of temporaries per role kept between calls
                       (default 256 MiB). all_reduce in place needs M/local_size; reduce_scatter
                       and all_gather need about M more (the rank-order permutation), and 2M
                       for a reduce_scatter whose count is not divisible by world_size.
    GLOO_SOCKET_IFNAME gloo's own knob: the network interface the inter-node groups use.
"""
from __future__ import annotations

import collections
import datetime
import os
import socket
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from .api import ArgChecks
from .arrays import as_buf
from .config import knob, logger
from .errors import (ClosedError, InvalidArgumentError, PeerFailureError,
                     RingcommError, TimeoutError, UnsupportedError)

__all__ = ["Topology", "node_id", "discover", "from_init", "HierarchicalCommunicator",
           "HierWork", "fake_node_of", "fake_nodes_env", "ENV_NODE_ID", "ENV_INTER"]

ENV_NODE_ID = "RINGCOMM_NODE_ID"
ENV_INTER = "RINGCOMM_INTER"
_BOOT_ID = "/proc/sys/kernel/random/boot_id"
# Temporaries up to this many bytes per role are kept between calls (see _scratch).

# Codes of ringcomm.ReduceOp (api.ReduceOp), repeated here so that this module imports nothing
# heavy; checked against api.ReduceOp when a communicator is built.
_OP_NAMES = ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR")
_FLOATS = frozenset({"float32", "float64", "float16", "bfloat16"})
_INTS = frozenset({"int8", "uint8", "int32", "int64"})


# ---- topology -------------------------------------------------------------------------------------
def node_id() -> str:
    """This process's node identity: ``RINGCOMM_NODE_ID`` if set, else ``hostname:boot_id``
    (the boot id tells apart two machines or containers that share a hostname)."""
    v = (knob(ENV_NODE_ID) or "").strip()
    if v:
        return v
    host = socket.gethostname()
    try:
        with open(_BOOT_ID) as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{host}:{boot}" if boot else host


@dataclass(frozen=True)
class Topology:
    """Which rank sits on which node. ``nodes[n]`` lists node n's global ranks (ascending); nodes
    are ordered by their lowest global rank. Built from every rank's node id."""
    rank: int
    node_ids: tuple
    nodes: tuple = field(init=False)
    node_of: tuple = field(init=False)        # node index of every global rank
    local_rank_of: tuple = field(init=False)  # local rank of every global rank

    def __post_init__(self):
        first: dict = {}
        members: list = []
        for r, nid in enumerate(self.node_ids):
            if nid not in first:
                first[nid] = len(members)
                members.append([])
            members[first[nid]].append(r)
        node_of = [0] * len(self.node_ids)
        local_of = [0] * len(self.node_ids)
        for n, ranks in enumerate(members):
            for l, r in enumerate(ranks):
                node_of[r], local_of[r] = n, l
        object.__setattr__(self, "nodes", tuple(tuple(m) for m in members))
        object.__setattr__(self, "node_of", tuple(node_of))
        object.__setattr__(self, "local_rank_of", tuple(local_of))

    @property
    def world_size(self) -> int:
        return len(self.node_ids)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def node(self) -> int:
        return self.node_of[self.rank]

    @property
    def local_rank(self) -> int:
        return self.local_rank_of[self.rank]

    @property
    def local_size(self) -> int:
        return len(self.nodes[self.node])

    @property
    def local_sizes(self) -> tuple:
        return tuple(len(m) for m in self.nodes)

    @property
    def uniform(self) -> bool:
        """Every node has the same number of ranks."""
        return len(set(self.local_sizes)) == 1

    def global_rank(self, node: int, local_rank: int) -> int:
        return self.nodes[node][local_rank]

    def column(self, local_rank: int) -> tuple:
        """Global ranks with this local rank, one per node that has it, in node order."""
        return tuple(m[local_rank] for m in self.nodes if len(m) > local_rank)

    def permutation(self) -> list:
        """(uniform nodes) perm[l * N + n] = global rank of (node n, local rank l): the order in
        which the column-then-node composition holds the ranks' blocks."""
        N, L = self.num_nodes, self.local_size
        return [self.nodes[n][l] for l in range(L) for n in range(N)]


def discover(rank: int, world_size: int, store, prefix: str) -> Topology:
    """Publish this rank's node id under ``{prefix}/node/{rank}`` and read everyone's (one store
    round trip where the store has ``multi_get``, e.g. torch's TCPStore)."""
    store.set(f"{prefix}/node/{rank}", node_id())
    keys = [f"{prefix}/node/{r}" for r in range(world_size)]
    vals = None
    multi_get = getattr(store, "multi_get", None)
    if multi_get is not None:
        try:
            vals = multi_get(keys)
        except (NotImplementedError, AttributeError):
            vals = None
    if vals is None:
        vals = [store.get(k) for k in keys]
    ids = tuple(v.decode() if isinstance(v, (bytes, bytearray)) else str(v) for v in vals)
    return Topology(rank, ids)


def fake_node_of(rank: int, world_size: int, nodes: int) -> int:
    """Node index of ``rank`` when ``world_size`` ranks on one machine are faked as ``nodes``
    nodes: contiguous blocks, as torchrun numbers ranks (``rank * nodes // world_size``)."""
    if not (1 <= nodes <= world_size):
        raise InvalidArgumentError(f"ringcomm: nodes must be in 1..{world_size}, got {nodes}")
    if not (0 <= rank < world_size):
        raise InvalidArgumentError(f"ringcomm: rank {rank} out of range for world size {world_size}")
    return rank * nodes // world_size


def fake_nodes_env(rank: int, world_size: int, nodes: int, tag: str = "fake") -> dict:
    """The environment that makes ``rank`` believe it sits on fake node ``fake_node_of(...)``:
    ``{"RINGCOMM_NODE_ID": "<tag>-node<k>"}``. Apply it (``os.environ.update``) in the rank's
    process before ``ringcomm.init``; the benchmark harness's ``--nodes K`` calls this."""
    return {ENV_NODE_ID: f"{tag}-node{fake_node_of(rank, world_size, nodes)}"}


def from_init(rank: int, world_size: int, store, init_method, prefix: str, timeout: float):
    """The hook ``ringcomm.api.init`` calls (world_size > 1): resolve the store, discover the
    topology, and return ``(store, comm)`` where ``comm`` is a HierarchicalCommunicator when the
    ranks span several nodes, else None (init goes on with its shared-memory communicator)."""
    if store is None:
        from .rendezvous import store_from_env, store_from_init_method
        store = (store_from_init_method(init_method, rank, world_size, timeout) if init_method
                 else store_from_env(rank, world_size, timeout))
    topo = discover(rank, world_size, store, prefix)
    if topo.num_nodes == 1:
        return store, None
    return store, HierarchicalCommunicator(topo, store, prefix, timeout)


# ---- helpers --------------------------------------------------------------------------------------
def _op_name(op) -> str:
    from .api import _op_code
    return _OP_NAMES[_op_code(op)]


def _op_supported(name: str, dtype: str) -> bool:
    """The flat core's rule (reduce_cpu.cpp): bool takes MIN/MAX; AVG needs a floating dtype;
    the bitwise ops need an integer dtype."""
    if dtype == "bool":
        return name in ("MIN", "MAX")
    if name == "AVG":
        return dtype in _FLOATS
    if name in ("BAND", "BOR", "BXOR"):
        return dtype in _INTS
    return True


def _tensor(x):
    """A flat torch tensor sharing x's memory (x: numpy array or torch CPU tensor, already
    checked contiguous by as_buf)."""
    import torch
    if isinstance(x, torch.Tensor):
        return x.reshape(-1)
    a = x.reshape(-1)
    if a.dtype.name == "bfloat16":          # ml_dtypes.bfloat16: same bits as torch.bfloat16
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    with warnings.catch_warnings():         # read-only inputs: only ever read here
        warnings.simplefilter("ignore")
        return torch.from_numpy(a)


def _bytes(t):
    """A uint8 view of a flat contiguous tensor (data movement through gloo needs no dtype)."""
    import torch
    if t.numel() == 0:      # numpy's empty arrays may come with stride 0, which view() refuses
        return torch.empty(0, dtype=torch.uint8)
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def _overlaps(a, b) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def _balanced(count: int, parts: int, i: int) -> tuple:
    """(offset, length) of part i when count elements are split into parts: the first
    count % parts parts hold one extra element (the flat API's reduce_scatter rule)."""
    q, r = divmod(count, parts)
    return i * q + min(i, r), q + (1 if i < r else 0)


def _convert_error(e: BaseException, what: str) -> RingcommError:
    if isinstance(e, RingcommError):
        return e
    msg = f"{what}: {type(e).__name__}: {e}"
    text = str(e).lower()
    if "timed out" in text or "timeout" in text:
        return TimeoutError(msg)
    return PeerFailureError(msg)


# ---- the inter-node engine --------------------------------------------------------------------------
def _c10d_store(store):
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


class _GlooWork:
    """An inter-node point-to-point handle with the ringcomm Work interface."""
    __slots__ = ("_w", "_what")

    def __init__(self, w, what):
        self._w, self._what = w, what

    def wait(self, timeout=None):
        if timeout is not None:
            deadline = time.monotonic() + timeout
            delay = 1e-4
            while not self._w.is_completed():
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"ringcomm: {self._what} did not complete within {timeout} s")
                time.sleep(delay)
                delay = min(delay * 2, 0.01)
        try:
            self._w.wait()
        except Exception as e:  # noqa: BLE001 - gloo raises RuntimeError
            raise _convert_error(e, self._what) from e

    def is_completed(self):
        return self._w.is_completed()

    def exception(self):
        if not self._w.is_completed():
            return None
        try:
            self._w.wait()
        except Exception as e:  # noqa: BLE001
            return _convert_error(e, self._what)
        return None


class _GlooEngine:
    """torch.distributed gloo process groups, created directly (``ProcessGroupGloo`` on a
    ``PrefixStore`` of the communicator's store): the default process group, if the user has
    one, is neither used nor touched. Every call counts the bytes handed to gloo."""

    name = "gloo"

    def __init__(self, topo: Topology, store, prefix: str, timeout: float):
        import torch.distributed as dist
        self._dist = dist
        self._base = _c10d_store(store)   # keep the Python store object alive (pybind trampoline)
        td = datetime.timedelta(seconds=timeout)
        self.topo = topo
        self.stats: dict = collections.OrderedDict()
        self._groups: list = []
        l = topo.local_rank
        col = topo.column(l)
        self.col = None
        if len(col) > 1:
            self.col = self._group(f"{prefix}/inter/col{l}", col.index(topo.rank), len(col), td)
        self.lead = self.col if l == 0 else None
        self.world = self._group(f"{prefix}/inter/world", topo.rank, topo.world_size, td)
        R = dist.ReduceOp
        self._ops = {"SUM": R.SUM, "AVG": R.SUM, "PRODUCT": R.PRODUCT, "MIN": R.MIN,
                     "MAX": R.MAX, "BAND": R.BAND, "BOR": R.BOR, "BXOR": R.BXOR}

    def _group(self, prefix, rank, size, td):
        pg = self._dist.ProcessGroupGloo(self._dist.PrefixStore(prefix, self._base), rank, size, td)
        self._groups.append(pg)
        return pg

    def _count(self, op, nbytes):
        s = self.stats.get(op)
        if s is None:
            s = self.stats[op] = [0, 0]
        s[0] += 1
        s[1] += int(nbytes)

    @staticmethod
    def _nbytes(t):
        return t.numel() * t.element_size()

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
        g._allgather_base(_bytes(out), _bytes(inp)).wait()

    def broadcast(self, g, t, root: int):
        self._count("broadcast", self._nbytes(t))
        o = self._dist.BroadcastOptions()
        o.rootRank = root
        g.broadcast([_bytes(t)], o).wait()

    def barrier(self, g):
        self._count("barrier", 0)
        g.barrier().wait()

    def gather(self, out, inp, root: int):
        """out: the root's flat output (world_size blocks), None elsewhere."""
        self._count("gather", self._nbytes(inp))
        o = self._dist.GatherOptions()
        o.rootRank = root
        outs = [[_bytes(t) for t in out.view(self.topo.world_size, -1).unbind(0)]] \
            if out is not None else []
        self.world.gather(outs, [_bytes(inp)], o).wait()

    def scatter(self, out, inp, root: int):
        """inp: the root's flat input (world_size blocks), None elsewhere."""
        self._count("scatter", self._nbytes(out))
        o = self._dist.ScatterOptions()
        o.rootRank = root
        ins = [[_bytes(t) for t in inp.view(self.topo.world_size, -1).unbind(0)]] \
            if inp is not None else []
        self.world.scatter([_bytes(out)], ins, o).wait()

    def all_to_all(self, out, inp, out_splits, in_splits):
        self._count("all_to_all", self._nbytes(inp))
        self.world.alltoall_base(_bytes(out), _bytes(inp), out_splits, in_splits,
                                 self._dist.AllToAllOptions()).wait()

    # point to point (return a handle) ----------------------------------------------------------
    def send(self, t, dst: int, tag: int):
        self._count("send", self._nbytes(t))
        return _GlooWork(self.world.send([_bytes(t)], dst, tag),
                         f"ringcomm: inter-node send to rank {dst}")

    def recv(self, t, src: int, tag: int):
        self._count("recv", self._nbytes(t))
        return _GlooWork(self.world.recv([_bytes(t)], src, tag),
                         f"ringcomm: inter-node recv from rank {src}")

    # lifetime ----------------------------------------------------------------------------------------
    def abort(self):
        for pg in self._groups:
            try:
                pg.abort()
            except Exception:  # noqa: BLE001 - best effort: the point is to close the sockets
                pass
        self._groups = []

    def close(self):
        for pg in self._groups:
            try:
                pg.shutdown()
            except Exception:  # noqa: BLE001
                pass
        self._groups = []
        self.col = self.lead = self.world = None


class _MPIWork:
    """An MPI request with the ringcomm Work interface (waits poll MPI_Test up to a deadline)."""
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


class _MPIEngine:
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
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise UnsupportedError("ringcomm: RINGCOMM_INTER=mpi needs mpi4py (pip install mpi4py) "
                                   "and a job started by mpiexec") from e
        self.MPI = MPI
        self.topo = topo
        self.stats: dict = collections.OrderedDict()
        self._timeout = timeout
        wc = MPI.COMM_WORLD
        store.set(f"{prefix}/mpi/{topo.rank}", str(wc.Get_rank()))
        mranks = [int(_to_text(store.get(f"{prefix}/mpi/{r}"))) for r in range(topo.world_size)]
        if len(set(mranks)) != topo.world_size:
            raise InvalidArgumentError(
                f"ringcomm: RINGCOMM_INTER=mpi: the ranks map onto MPI ranks {mranks}; start every "
                f"rank as its own MPI process (mpiexec -n {topo.world_size} ...)")
        wgroup = wc.Get_group()
        self._comms: list = []

        def create(name, members):
            g = wgroup.Incl([mranks[r] for r in members])
            tag = zlib.crc32(f"{prefix}/{name}".encode()) % 32000 + 1
            c = wc.Create_group(g, tag)
            g.Free()
            self._comms.append(c)
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

    _count = _GlooEngine._count
    _nbytes = staticmethod(_GlooEngine._nbytes)

    def _wait(self, req, what, timeout=None):
        t = self._timeout if timeout is None else timeout
        deadline = time.monotonic() + t
        while not req.Test():
            if time.monotonic() > deadline:
                raise TimeoutError(f"ringcomm: inter-node (mpi) {what} did not complete within {t} s")
            time.sleep(0)       # let other threads run; MPI progresses inside Test

    @staticmethod
    def _np(t):
        return _bytes(t).numpy()

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
        return _MPIWork(self, self.world.Isend(self._np(t), dest=dst, tag=tag), f"send to rank {dst}")

    def recv(self, t, src, tag):
        self._count("recv", self._nbytes(t))
        return _MPIWork(self, self.world.Irecv(self._np(t), source=src, tag=tag),
                        f"recv from rank {src}")

    def abort(self):
        pass    # see the class docstring: other ranks fail at their timeout

    def close(self):
        for c in self._comms:
            try:
                c.Free()
            except Exception:  # noqa: BLE001
                pass
        self._comms = []
        self.col = self.lead = self.world = None


def _to_text(v) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


def _make_engine(topo: Topology, store, prefix: str, timeout: float):
    choice = knob(ENV_INTER)
    if choice in ("auto", "gloo"):
        try:
            import torch.distributed as dist
        except ImportError as e:
            raise UnsupportedError(
                "ringcomm: the ranks span several nodes and the inter-node engine (gloo) needs "
                "torch with torch.distributed: pip install torch") from e
        if not dist.is_available() or not dist.is_gloo_available():
            raise UnsupportedError("ringcomm: the ranks span several nodes and this torch build "
                                   "has no gloo backend (inter-node engine)")
        return _GlooEngine(topo, store, prefix, timeout)
    if choice == "nccl":
        raise UnsupportedError(
            "ringcomm: RINGCOMM_INTER=nccl: NCCL moves CUDA tensors, and this hierarchical "
            "communicator handles host memory; use RINGCOMM_INTER=gloo (or auto)")
    if choice == "mpi":
        return _MPIEngine(topo, store, prefix, timeout)
    raise InvalidArgumentError(f"ringcomm: RINGCOMM_INTER={choice!r}; use auto, gloo, nccl or mpi")


def _local_communicator(topo: Topology, store, prefix: str, timeout: float):
    """The node's shared-memory Communicator: the same steps as ``api.init``'s single-node path,
    for (local_rank, local_size) under the store prefix ``{prefix}/node{n}``."""
    from . import api
    return api.shm_communicator(topo.local_rank, topo.local_size, store, f"{prefix}/node{topo.node}", timeout)


# ---- asynchronous execution -------------------------------------------------------------------------
class HierWork:
    """Handle on an asynchronous hierarchical operation: wait(timeout=None), is_completed(),
    exception(), seq (the ringcomm Work interface)."""

    __slots__ = ("_done", "_handles", "_error", "_result", "seq", "_name")

    def __init__(self, name: str, seq: int, result=None):
        self._done = threading.Event()
        self._handles: tuple = ()
        self._error: Optional[BaseException] = None
        self._result = result
        self.seq = seq
        self._name = name

    def wait(self, timeout: Optional[float] = None):
        """Block until done (at most ``timeout`` seconds: ringcomm.TimeoutError after); raise the
        operation's error; return its result (the output array, or None)."""
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        if not self._done.wait(None if timeout is None else max(0.0, float(timeout))):
            raise TimeoutError(f"ringcomm: hierarchical {self._name} (seq {self.seq}) did not "
                               f"complete within {timeout} s")
        if self._error is not None:
            raise self._error
        for h in self._handles:
            h.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._result

    def is_completed(self) -> bool:
        if not self._done.is_set():
            return False
        return self._error is not None or all(h.is_completed() for h in self._handles)

    def exception(self) -> Optional[RingcommError]:
        if not self._done.is_set():
            return None
        if self._error is not None:
            return self._error
        for h in self._handles:
            e = h.exception()
            if e is not None:
                return e
        return None


class _Executor:
    """Runs a communicator's operations one at a time, in issue order. A synchronous call with
    nothing queued runs inline on the caller's thread; otherwise operations run on one worker
    thread (started on first use). Point-to-point operations only *issue* here and complete
    through their inner handles, so posting a send and then a recv never blocks the queue."""

    def __init__(self, name: str):
        self._name = name
        self._cv = threading.Condition()
        self._q: collections.deque = collections.deque()
        self._pending = 0                 # queued or running on the worker
        self._run_lock = threading.Lock()  # held while an operation runs (worker or inline)
        self._thread: Optional[threading.Thread] = None
        self._stop = False

    def submit(self, work: HierWork, fn, run, async_op: bool) -> None:
        with self._cv:
            if self._stop:
                raise ClosedError(f"ringcomm: the communicator ({self._name}) is closing")
            if not async_op and self._pending == 0:
                self._run_lock.acquire()
                inline = True
            else:
                inline = False
                self._pending += 1
                self._q.append((work, fn))
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, args=(run,), daemon=True,
                                                    name=f"ringcomm-hier-{self._name}")
                    self._thread.start()
                self._cv.notify()
        if inline:
            try:
                run(work, fn)
            finally:
                self._run_lock.release()

    def _loop(self, run):
        while True:
            with self._cv:
                while not self._q and not self._stop:
                    self._cv.wait()
                if not self._q:
                    return
                work, fn = self._q.popleft()
            with self._run_lock:
                run(work, fn)
            with self._cv:
                self._pending -= 1

    def close(self, timeout: float) -> None:
        """Let queued operations finish, then stop the worker."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
            t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)


# ---- the communicator --------------------------------------------------------------------------------
class HierarchicalCommunicator(ArgChecks):
    """A communicator whose ranks span several nodes: ringcomm shared memory inside each node,
    an existing engine (gloo) between nodes. Same methods and attributes as
    ``ringcomm.Communicator``; created by ``ringcomm.init()`` when the ranks span nodes.

    Extra attributes: ``topology`` (Topology), ``node``, ``num_nodes``, ``local_rank``,
    ``local_size``, ``intra`` (the node's Communicator), ``inter_backend`` ("gloo"), and
    ``inter_stats()`` / ``reset_inter_stats()`` (bytes handed to the inter-node engine)."""

    def __init__(self, topology: Topology, store, prefix: str, timeout: float):
        self.topology = topology
        self.rank: int = topology.rank
        self.world_size: int = topology.world_size
        self.prefix = prefix
        self.node = topology.node
        self.num_nodes = topology.num_nodes
        self.local_rank = topology.local_rank
        self.local_size = topology.local_size
        self._timeout = float(timeout)
        self._scratch_cache = knob("RINGCOMM_HIER_SCRATCH_CACHE")
        self._closed = False
        self._broken: Optional[RingcommError] = None
        self._seq = 0
        self._scratch_bufs: dict = {}
        self._perm = None
        self._identity_perm = False
        self.intra = _local_communicator(topology, store, prefix, timeout)
        try:
            self._inter = _make_engine(topology, store, prefix, timeout)
        except BaseException:
            self.intra.close()
            raise
        self.inter_backend = self._inter.name
        logger(self.rank, self.world_size).info(
            f"hierarchical: node {self.node}/{self.num_nodes}, local rank {self.local_rank}/{self.local_size}, "
            f"inter-node engine {self.inter_backend}")
        self._exec = _Executor(f"{prefix}/{self.rank}")
        if topology.uniform:
            import torch
            perm = topology.permutation()
            self._identity_perm = perm == list(range(self.world_size))
            self._perm = torch.tensor(perm, dtype=torch.int64)

    # -- attributes shared with Communicator ------------------------------------------------------
    @property
    def size(self) -> int:
        return self.world_size

    @property
    def timeout(self) -> float:
        return self._timeout

    @property
    def closed(self) -> bool:
        return self._closed

    def inter_stats(self) -> dict:
        """``{op: {"calls": c, "bytes": b}}``: calls into the inter-node engine by this rank and
        the bytes it handed to them (see the module docstring for what is counted)."""
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

    def _submit(self, name: str, fn, async_op: bool, result=None):
        self._check_open()
        self._seq += 1
        work = HierWork(name, self._seq, result)
        self._exec.submit(work, fn, self._run, async_op)
        if not async_op:
            work.wait()
            return None
        return work

    def _run(self, work: HierWork, fn):
        try:
            if self._broken is not None:
                raise PeerFailureError(f"ringcomm: hierarchical {work._name} not run: the "
                                       f"communicator failed earlier: {self._broken}")
            if self._closed and work._name != "reject":
                raise ClosedError(f"ringcomm: the communicator (rank {self.rank}) is closed")
            handles = fn()
            work._handles = tuple(handles) if handles else ()
        except BaseException as e:  # noqa: BLE001 - recorded on the work, raised by wait()
            work._error = self._fail(e, work._name)
        finally:
            work._done.set()

    def _fail(self, e: BaseException, name: str) -> RingcommError:
        """An operation failed on this rank: abort the inter-node engine and close the node
        communicator so that every other rank fails promptly (see the module docstring)."""
        if self._broken is not None and isinstance(e, PeerFailureError):
            return e
        err = _convert_error(e, f"ringcomm: hierarchical {name} failed on rank {self.rank} "
                                f"(node {self.node}, local rank {self.local_rank})")
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
        from .api import _COLL
        intra = self.intra

        def poison():
            if intra.world_size > 1 and not intra.closed:
                intra._c.reject(_COLL[coll])
            raise exc
        if not self._closed and self._broken is None:
            self._seq += 1
            self._exec.submit(HierWork("reject", self._seq), poison, self._run, True)
        raise exc

    def _buf(self, coll, x, what, writeable=False):
        try:
            b = as_buf(x, f"{coll} {what}")
        except RingcommError as e:
            self._reject(coll, e)
        if writeable and not b.writeable:
            self._reject(coll, InvalidArgumentError(
                f"ringcomm: {coll} {what} is read-only but the result is written into it"))
        return b

    def _op(self, coll, op, dtype) -> str:
        try:
            name = _op_name(op)
        except RingcommError as e:
            self._reject(coll, e)
        if not _op_supported(name, dtype):
            self._reject(coll, UnsupportedError(
                f"ringcomm: reduce op {name} is not supported for dtype {dtype}"))
        return name

    def _scratch(self, slot: str, count: int, dtype):
        """A per-slot temporary (operations run one at a time, so one buffer per role suffices).
        Buffers up to RINGCOMM_HIER_SCRATCH_CACHE bytes are kept for the next call (no page
        faults on every call); larger ones are allocated per call and freed after it."""
        import torch
        nbytes = count * dtype.itemsize
        buf = self._scratch_bufs.get(slot)
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(max(nbytes, 64), dtype=torch.uint8)
            if nbytes <= self._scratch_cache:
                self._scratch_bufs[slot] = buf
        return buf[:nbytes].view(dtype)

    # -- algorithms (run on the executor; tensors are flat torch views) ----------------------------
    def _ar(self, src, dst, op: str):
        """all_reduce src into dst (dst may be src)."""
        topo, intra, inter = self.topology, self.intra, self._inter
        rop = "SUM" if op == "AVG" else op
        M, L = src.numel(), self.local_size
        if M == 0:
            return
        if L == 1:
            if dst is not src:
                dst.copy_(src)
            inter.all_reduce(inter.col, dst, rop)
            if op == "AVG":
                dst.div_(self.world_size)
            return
        if topo.uniform:
            off, cnt = _balanced(M, L, self.local_rank)
            shard = self._scratch("ar", cnt, src.dtype) if dst is src else dst[off:off + cnt]
            intra.reduce_scatter(shard, src, op=rop)
            if cnt:
                inter.all_reduce(inter.col, shard, rop)
                if op == "AVG":
                    shard.div_(self.world_size)
            intra.all_gather(dst, shard)
            return
        # Uneven nodes: reduce to the leader, all_reduce among leaders, broadcast.
        leader = self.local_rank == 0
        intra.reduce(src, root=0, op=rop, output=dst if (leader and dst is not src) else None)
        if leader:
            inter.all_reduce(inter.lead, dst, rop)
            if op == "AVG":
                dst.div_(self.world_size)
        intra.broadcast(dst, root=0)

    def _rs(self, out, inp, op: str):
        """Flat reduce_scatter: chunk `rank` of the balanced split of inp lands in out."""
        import torch
        topo, intra, inter = self.topology, self.intra, self._inter
        W, N, L = self.world_size, self.num_nodes, self.local_size
        M = inp.numel()
        if M == 0:
            return
        rop = "SUM" if op == "AVG" else op
        off, cnt = _balanced(M, W, self.rank)
        if not topo.uniform:
            full = self._scratch("rs_full", M, inp.dtype)
            self._ar(inp, full, op)
            out.copy_(full[off:off + cnt])
            return
        c = -(-M // W)
        r = M % W
        if r == 0:
            padded = inp.view(W, c)
        else:   # rows of c elements: the first r chunks have c, the rest c - 1 (+ 1 pad)
            padded = self._scratch("rs_pad", W * c, inp.dtype).view(W, c)
            padded[:r] = inp[:r * c].view(r, c)
            padded[r:, :c - 1] = inp[r * c:].view(W - r, c - 1)
            padded[r:, c - 1:].zero_()
        if self._identity_perm:
            blocks = padded
        else:   # row l*N + n <- chunk of (node n, local rank l)
            blocks = self._scratch("rs_perm", W * c, inp.dtype).view(W, c)
            torch.index_select(padded, 0, self._perm, out=blocks)
        if L > 1:
            blk = self._scratch("rs_blk", N * c, inp.dtype)
            intra.reduce_scatter(blk, blocks.view(-1), op=rop)
        else:
            blk = blocks.view(-1)
        chunk = out if cnt == c else self._scratch("rs_chunk", c, inp.dtype)
        inter.reduce_scatter(inter.col, chunk, blk, rop)
        if op == "AVG":
            chunk.div_(W)
        if chunk is not out:
            out.copy_(chunk[:cnt])

    def _ag_equal(self, out, inp, what="all_gather"):
        """All-gather, every contribution inp.numel() elements."""
        topo, intra, inter = self.topology, self.intra, self._inter
        W, N, L = self.world_size, self.num_nodes, self.local_size
        m = inp.numel()
        if m == 0:
            return
        if not topo.uniform:
            src = inp.clone() if _overlaps(inp, out) else inp
            inter.all_gather(inter.world, out, src, what)
            return
        if L == 1:      # one rank per node: the column is everyone, in rank order
            inter.all_gather(inter.col, out, inp.clone() if _overlaps(inp, out) else inp, what)
            return
        col = self._scratch("ag_col", N * m, inp.dtype)
        inter.all_gather(inter.col, col, inp, what)
        if self._identity_perm:
            intra.all_gather(out, col)
            return
        tmp = self._scratch("ag_all", W * m, inp.dtype)
        intra.all_gather(tmp, col)
        out.view(W, m).index_copy_(0, self._perm, tmp.view(W, m))

    def _ag(self, out, inp):
        """All-gather with possibly unequal contributions: exchange the sizes first."""
        import torch
        W = self.world_size
        mine = torch.tensor([inp.numel()], dtype=torch.int64)
        counts = torch.empty(W, dtype=torch.int64)
        self._ag_equal(counts, mine, "all_gather_sizes")
        total = int(counts.sum())
        if out.numel() != total:
            raise InvalidArgumentError(
                f"ringcomm: all_gather on rank {self.rank}: output has {out.numel()} elements, the "
                f"contributions add up to {total} ({counts.tolist()})")
        cm = int(counts.max())
        if int(counts.min()) == cm:
            self._ag_equal(out, inp)
            return
        pin = self._scratch("agv_in", cm, inp.dtype)
        pin[:inp.numel()].copy_(inp)
        pout = self._scratch("agv_out", W * cm, inp.dtype).view(W, cm)
        self._ag_equal(pout.view(-1), pin)
        mask = torch.arange(cm).unsqueeze(0) < counts.unsqueeze(1)
        out.copy_(pout[mask])

    def _bcast(self, t, root: int):
        topo, intra, inter = self.topology, self.intra, self._inter
        if t.numel() == 0:
            return
        nr, lr = topo.node_of[root], topo.local_rank_of[root]
        L = self.local_size
        if topo.uniform:
            if self.local_rank == lr:
                inter.broadcast(inter.col, t, nr)
            if L > 1:
                intra.broadcast(t, root=lr)
            return
        if self.node == nr and L > 1:
            intra.broadcast(t, root=lr)
        if self.local_rank == 0:
            inter.broadcast(inter.lead, t, nr)
        if self.node != nr and L > 1:
            intra.broadcast(t, root=0)

    def _barrier(self):
        if self.local_size > 1:
            self.intra.barrier()
        if self.local_rank == 0:
            self._inter.barrier(self._inter.lead)
        if self.local_size > 1:
            self.intra.barrier()

    # -- collectives --------------------------------------------------------------------------------
    def all_reduce(self, x, op=0, async_op: bool = False, output=None):
        """Reduce x across ranks; the result lands in x (or in `output` when given)."""
        self._check_open()
        bi = self._buf("all_reduce", x, "input", writeable=output is None)
        name = self._op("all_reduce", op, bi.dtype)
        if output is not None:
            bo = self._buf("all_reduce", output, "output", writeable=True)
            self._same_dtype("all_reduce", bi, bo)
            if bo.count != bi.count:
                self._reject("all_reduce", InvalidArgumentError(
                    f"ringcomm: all_reduce: output has {bo.count} elements, input has {bi.count}"))
        src = _tensor(x)
        dst = src if output is None else _tensor(output)
        return self._submit("all_reduce", lambda: self._ar(src, dst, name), async_op,
                            output if output is not None else x)

    def reduce_scatter(self, output, input, op=0, async_op: bool = False):
        """Reduce `input` across ranks and leave chunk `rank` of the result in `output` (chunks
        split the input evenly; the first count % world_size chunks hold one extra element)."""
        self._check_open()
        bi = self._buf("reduce_scatter", input, "input")
        bo = self._buf("reduce_scatter", output, "output", writeable=True)
        self._same_dtype("reduce_scatter", bi, bo)
        name = self._op("reduce_scatter", op, bi.dtype)
        want = _balanced(bi.count, self.world_size, self.rank)[1]
        if bo.count != want:
            self._reject("reduce_scatter", InvalidArgumentError(
                f"ringcomm: reduce_scatter on rank {self.rank}: output has {bo.count} elements, its "
                f"chunk of the {bi.count}-element input has {want}"))
        src, dst = _tensor(input), _tensor(output)
        return self._submit("reduce_scatter", lambda: self._rs(dst, src, name), async_op, output)

    def all_gather(self, output, input, async_op: bool = False):
        """Concatenate every rank's `input` (rank order) into `output` on every rank."""
        self._check_open()
        bi = self._buf("all_gather", input, "input")
        bo = self._buf("all_gather", output, "output", writeable=True)
        self._same_dtype("all_gather", bi, bo)
        if bo.count < bi.count:
            self._reject("all_gather", InvalidArgumentError(
                f"ringcomm: all_gather: output has {bo.count} elements, fewer than the input's {bi.count}"))
        src, dst = _tensor(input), _tensor(output)
        return self._submit("all_gather", lambda: self._ag(dst, src), async_op, output)

    def broadcast(self, x, root: int = 0, async_op: bool = False):
        """Copy root's x into x on every rank."""
        self._check_open()
        self._buf("broadcast", x, "buffer", writeable=True)
        root = self._root("broadcast", root)
        t = _tensor(x)
        return self._submit("broadcast", lambda: self._bcast(t, root), async_op, x)

    def reduce(self, x, root: int = 0, op=0, async_op: bool = False, output=None):
        """Reduce x across ranks onto root (into x, or into `output` on root when given)."""
        self._check_open()
        root = self._root("reduce", root)
        on_root = self.rank == root
        bi = self._buf("reduce", x, "input", writeable=on_root and output is None)
        name = self._op("reduce", op, bi.dtype)
        if on_root and output is not None:
            bo = self._buf("reduce", output, "output", writeable=True)
            self._same_dtype("reduce", bi, bo)
            if bo.count != bi.count:
                self._reject("reduce", InvalidArgumentError(
                    f"ringcomm: reduce: output has {bo.count} elements, input has {bi.count}"))
        src = _tensor(x)
        if on_root:
            dst = src if output is None else _tensor(output)
            fn = lambda: self._ar(src, dst, name)  # noqa: E731
        else:
            fn = lambda: self._ar(src, self._scratch("reduce", src.numel(), src.dtype), name)  # noqa: E731
        result = (output if output is not None else x) if on_root else None
        return self._submit("reduce", fn, async_op, result)

    def barrier(self, async_op: bool = False):
        """Return once every rank has entered the barrier."""
        self._check_open()
        return self._submit("barrier", self._barrier, async_op)

    def all_to_all(self, output, input, output_splits: Optional[Sequence[int]] = None,
                   input_splits: Optional[Sequence[int]] = None, async_op: bool = False):
        """Block j of `input` goes to rank j; block i of `output` comes from rank i (splits in
        elements; without them the arrays split evenly). Runs over the inter-node engine's flat
        group (correct, not optimised)."""
        self._check_open()
        bi = self._buf("all_to_all", input, "input")
        bo = self._buf("all_to_all", output, "output", writeable=True)
        self._same_dtype("all_to_all", bi, bo)
        sc = self._splits("all_to_all", input_splits, bi.count, "input")
        rc = self._splits("all_to_all", output_splits, bo.count, "output")
        src, dst = _tensor(input), _tensor(output)
        size = src.element_size()

        def fn():
            s = src.clone() if _overlaps(src, dst) else src
            self._inter.all_to_all(dst, s, [v * size for v in rc], [v * size for v in sc])
        return self._submit("all_to_all", fn, async_op, output)

    def gather(self, output, input, root: int = 0, async_op: bool = False):
        """Concatenate every rank's `input` into root's `output` (other ranks pass output=None)."""
        self._check_open()
        root = self._root("gather", root)
        bi = self._buf("gather", input, "input")
        src = _tensor(input)
        dst = None
        if self.rank == root:
            if output is None:
                self._reject("gather", InvalidArgumentError("ringcomm: gather: the root needs an output array"))
            bo = self._buf("gather", output, "output", writeable=True)
            self._same_dtype("gather", bi, bo)
            if bo.count != bi.count * self.world_size:
                self._reject("gather", InvalidArgumentError(
                    f"ringcomm: gather: output has {bo.count} elements, needs world_size * {bi.count}"))
            dst = _tensor(output)

        def fn():
            if src.numel():
                s = src.clone() if dst is not None and _overlaps(src, dst) else src
                self._inter.gather(dst, s, root)
        return self._submit("gather", fn, async_op, output)

    def scatter(self, output, input=None, root: int = 0, async_op: bool = False):
        """Root's `input` is cut into world_size blocks; block i lands in rank i's `output`."""
        self._check_open()
        root = self._root("scatter", root)
        bo = self._buf("scatter", output, "output", writeable=True)
        dst = _tensor(output)
        full = None
        if self.rank == root:
            if input is None:
                self._reject("scatter", InvalidArgumentError("ringcomm: scatter: the root needs an input array"))
            bi = self._buf("scatter", input, "input")
            self._same_dtype("scatter", bi, bo)
            if bi.count != bo.count * self.world_size:
                self._reject("scatter", InvalidArgumentError(
                    f"ringcomm: scatter: input has {bi.count} elements, needs world_size * {bo.count}"))
            full = _tensor(input)

        def fn():
            if dst.numel():
                f = full.clone() if full is not None and _overlaps(full, dst) else full
                self._inter.scatter(dst, f, root)
        return self._submit("scatter", fn, async_op, output)

    # -- point to point ----------------------------------------------------------------------------
    def send(self, x, dst: int, async_op: bool = False, tag: int = 0):
        """Send x to rank dst (same node: shared memory; other node: the inter-node engine).
        Messages between two ranks are matched in order; sizes must agree."""
        self._check_open()
        as_buf(x, "send buffer")
        dst = self._peer("send", dst)
        t = _tensor(x)
        return self._submit("send", lambda: self._p2p("send", x, t, dst, int(tag)), async_op)

    def recv(self, x, src: int, async_op: bool = False, tag: int = 0):
        """Receive into x from rank src."""
        self._check_open()
        b = as_buf(x, "recv buffer")
        if not b.writeable:
            raise InvalidArgumentError("ringcomm: recv buffer is read-only")
        src = self._peer("recv", src)
        t = _tensor(x)
        return self._submit("recv", lambda: self._p2p("recv", x, t, src, int(tag)), async_op, x)

    def _p2p(self, what, x, t, peer, tag):
        topo = self.topology
        if topo.node_of[peer] == self.node:
            fn = self.intra.send if what == "send" else self.intra.recv
            return [fn(x, topo.local_rank_of[peer], async_op=True, tag=tag)]
        if t.numel() == 0:      # both sides know the size: an empty message is no message
            return []
        fn = self._inter.send if what == "send" else self._inter.recv
        return [fn(t, peer, tag)]

    def _peer(self, what, p) -> int:
        if not isinstance(p, int) or isinstance(p, bool) or not (0 <= p < self.world_size) or p == self.rank:
            raise InvalidArgumentError(
                f"ringcomm: {what}: peer {p!r} must be another rank in [0, {self.world_size}) (this is rank {self.rank})")
        return p

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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
