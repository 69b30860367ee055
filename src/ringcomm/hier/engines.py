"""Choosing the inter-node engine (RINGCOMM_INTER): gloo_engine or mpi_engine, both built on
engine_base."""
from __future__ import annotations

from ..core.errors import InvalidArgumentError, UnsupportedError
from .gloo_engine import GlooEngine
from .mpi_engine import MPIEngine
from .topology import Topology

__all__ = ["ENV_INTER", "make_engine"]

ENV_INTER = "RINGCOMM_INTER"


def make_engine(topo: Topology, store, prefix: str, timeout: float, choice: str):
    """The inter-node engine ``choice`` (RINGCOMM_INTER's value, ``knobs.inter``) names."""
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
        return GlooEngine(topo, store, prefix, timeout)
    if choice == "mpi":
        return MPIEngine(topo, store, prefix, timeout)
    raise InvalidArgumentError(f"ringcomm: RINGCOMM_INTER={choice!r}; use auto, gloo or mpi")
