"""Sparse COO all-reduce (``dist.all_reduce`` of a ``torch.sparse_coo`` tensor, SUM only), as
gloo does it: all-gather every rank's nnz, then every rank's indices and values (ringcomm's
all_gather takes a different size per rank), build one tensor of all of them and coalesce it.
Every rank ends with the same coalesced tensor, written into the input (``copy_``)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from .staging import SUPPORTED_DTYPES, invalid, unsupported

__all__ = ["check_sparse", "sparse_all_reduce"]


def check_sparse(t: torch.Tensor, op) -> None:
    """A CPU sparse COO tensor of a dtype ringcomm moves, and SUM: else a clear exception."""
    if t.layout != torch.sparse_coo:
        raise invalid(f"allreduce_sparse: a sparse COO tensor is required, got {t.layout}")
    if t.device.type != "cpu":
        raise unsupported(f"sparse all_reduce of {t.device.type} tensors (CPU only)")
    if t.dtype not in SUPPORTED_DTYPES:
        raise unsupported(f"sparse all_reduce of {t.dtype}")
    kind = getattr(op, "op", op)
    if int(kind.value) != int(dist.ReduceOp.SUM.value):
        raise unsupported(f"sparse all_reduce with {kind} (SUM only, as gloo)")


def sparse_all_reduce(comm, t: torch.Tensor, world: int) -> torch.Tensor:
    """The coalesced sum of every rank's ``t`` (same shape on every rank), written into ``t``.
    Three all_gathers: nnz, indices (nnz x sparse_dim, rank-major), values (nnz x dense shape)."""
    nnz = torch.tensor([t._nnz()], dtype=torch.int64)
    counts = torch.empty(world, dtype=torch.int64)
    comm.all_gather(counts, nnz)
    total = int(counts.sum())
    idx = t._indices().t().contiguous()               # this rank's (nnz, sparse_dim)
    vals = t._values().contiguous()                   # this rank's (nnz, *dense)
    all_idx = torch.empty((total, idx.shape[1]), dtype=torch.int64)
    all_vals = torch.empty((total,) + tuple(vals.shape[1:]), dtype=vals.dtype)
    comm.all_gather(all_idx, idx)
    comm.all_gather(all_vals, vals)
    out = torch.sparse_coo_tensor(all_idx.t(), all_vals, t.shape).coalesce()
    t.copy_(out)
    return out
