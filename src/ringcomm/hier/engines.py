"""Choosing the inter-node engine (RINGCOMM_INTER), and what its failures mean on this rank."""
from __future__ import annotations

import builtins

from ..config import knob
from ..errors import InvalidArgumentError, PeerFailureError, RingcommError, TimeoutError, UnsupportedError
from .topology import Topology

__all__ = ["ENV_INTER", "make_engine", "convert_error"]

ENV_INTER = "RINGCOMM_INTER"


def make_engine(topo: Topology, store, prefix: str, timeout: float):
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
        from .gloo_engine import GlooEngine
        return GlooEngine(topo, store, prefix, timeout)
    if choice == "nccl":
        raise UnsupportedError(
            "ringcomm: RINGCOMM_INTER=nccl: NCCL moves CUDA tensors, and this hierarchical "
            "communicator handles host memory; use RINGCOMM_INTER=gloo (or auto)")
    if choice == "mpi":
        from .mpi_engine import MPIEngine
        return MPIEngine(topo, store, prefix, timeout)
    raise InvalidArgumentError(f"ringcomm: RINGCOMM_INTER={choice!r}; use auto, gloo, nccl or mpi")


def convert_error(e: BaseException, what: str, elapsed: float = 0.0, timeout: float = float("inf")) -> RingcommError:
    """The ringcomm error for an engine failure ``e`` raised ``elapsed`` seconds into an operation
    whose engine deadline is ``timeout`` seconds: ringcomm's own errors pass through; a Python
    TimeoutError, or a failure at (or past) the deadline — the engine gave up waiting — is a
    TimeoutError; anything earlier is a peer's failure (a closed or reset connection)."""
    if isinstance(e, RingcommError):
        return e
    msg = f"{what}: {type(e).__name__}: {e}"
    if isinstance(e, builtins.TimeoutError) or elapsed >= timeout:
        return TimeoutError(msg)
    return PeerFailureError(msg)
