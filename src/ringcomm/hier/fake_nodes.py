"""Several nodes faked on one machine: the per-rank RINGCOMM_NODE_ID that makes contiguous
blocks of ranks believe they sit on different nodes (the benchmark's ``--nodes K`` and the
tests' fake topologies)."""
from __future__ import annotations

from ..core.errors import InvalidArgumentError
from .topology import ENV_NODE_ID

__all__ = ["fake_node_of", "fake_nodes_env"]


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
