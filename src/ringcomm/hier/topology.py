"""Which rank sits on which node: node identities and the Topology built from them."""
from __future__ import annotations

import socket
from dataclasses import dataclass, field

from ..core.config import read

__all__ = ["ENV_NODE_ID", "node_id", "Topology", "discover"]

ENV_NODE_ID = "RINGCOMM_NODE_ID"
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def node_id(knobs=None) -> str:
    """This process's node identity: ``RINGCOMM_NODE_ID`` (``knobs.node_id``; the knobs read now
    when None) if set, else ``hostname:boot_id`` (the boot id tells apart two machines or
    containers that share a hostname)."""
    v = (read() if knobs is None else knobs).node_id.strip()
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


def discover(rank: int, world_size: int, store, prefix: str, knobs=None) -> Topology:
    """Publish this rank's node id (:func:`node_id` of ``knobs``) under ``{prefix}/node/{rank}``
    and read everyone's (one store round trip where the store has ``multi_get``, e.g. torch's
    TCPStore)."""
    store.set(f"{prefix}/node/{rank}", node_id(knobs))
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
