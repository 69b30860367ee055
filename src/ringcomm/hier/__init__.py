"""Beyond one machine: topology discovery and the two-level (hierarchical) communicator.

Layer 0, a back end: imports the core (and torch.distributed or mpi4py for the engines between
nodes), never another back end; the core's ``ringcomm.init()`` imports it when ranks span nodes.

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
                       CUDA tensors, which this communicator does not take).
    RINGCOMM_HIER_SCRATCH_CACHE  bytes of temporaries per role kept between calls
                       (default 256 MiB). all_reduce in place needs M/local_size; reduce_scatter
                       and all_gather need about M more (the rank-order permutation), and 2M
                       for a reduce_scatter whose count is not divisible by world_size.
    GLOO_SOCKET_IFNAME gloo's own knob: the network interface the inter-node groups use.

Modules
    topology (node ids, Topology), fake_nodes (several nodes faked on one machine), engine_base
    (what every engine shares, engine failures), gloo_engine, mpi_engine, engines (RINGCOMM_INTER
    chooses one), executor (issue-order execution, HierWork), algorithms (the two-level
    schedules), tensors (flat torch views), communicator.
"""
from __future__ import annotations

from .communicator import HierarchicalCommunicator, from_init
from .engines import ENV_INTER
from .executor import HierWork
from .fake_nodes import fake_node_of, fake_nodes_env
from .gloo_engine import c10d_store
from .topology import ENV_NODE_ID, Topology, discover, node_id

__all__ = ["Topology", "node_id", "discover", "from_init", "HierarchicalCommunicator",
           "HierWork", "fake_node_of", "fake_nodes_env", "c10d_store", "ENV_NODE_ID", "ENV_INTER"]
