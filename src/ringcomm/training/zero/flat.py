"""Flat buffers: parameters laid end to end and padded to a multiple of the world size, and the
per-group state (master shard, gradient shard) common to every stage."""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _storage_nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


class _FlatLayout:
    """Parameters laid end to end, padded with zeros to a multiple of ``world_size``."""

    def __init__(self, shapes: Iterable[torch.Size], world_size: int):
        self.shapes = [torch.Size(s) for s in shapes]
        self.numels = [s.numel() for s in self.shapes]
        self.offsets = []
        total = 0
        for n in self.numels:
            self.offsets.append(total)
            total += n
        self.numel = total
        self.padded_numel = -(-total // world_size) * world_size
        self.shard_numel = self.padded_numel // world_size
        self.pad = self.padded_numel - total

    def shard_range(self, rank: int) -> tuple[int, int]:
        return rank * self.shard_numel, (rank + 1) * self.shard_numel

    @property
    def split_sizes(self) -> list[int]:
        return self.numels + ([self.pad] if self.pad else [])

    def unflatten(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [flat[o:o + n].view(s) for o, n, s in zip(self.offsets, self.numels, self.shapes)]

    def flatten(self, tensors, dtype, device) -> torch.Tensor:
        flat = torch.zeros(self.padded_numel, dtype=dtype, device=device)
        for view, t in zip(self.unflatten(flat), tensors):
            if t is not None:
                view.copy_(t.reshape(view.shape))
        return flat


class _FlatGroup:
    """State common to a stage-1/2 bucket and a stage-3 unit (see the ringcomm.training.zero package
    docstring)."""

    def __init__(self, keys: list, shapes: list, world_size: int, rank: int,
                 compute_dtype: torch.dtype, master_dtype: torch.dtype, device):
        self.keys = keys
        self.layout = _FlatLayout(shapes, world_size)
        self.lo, self.hi = self.layout.shard_range(rank)
        self.compute_dtype = compute_dtype
        self.master_dtype = master_dtype
        self.device = device
        self.master: nn.Parameter | None = None
        self.grad_shard: torch.Tensor | None = None

    def init_master(self, flat_full_master: torch.Tensor, offload: str | None = None) -> None:
        """The master shard: a copy of this rank's slice; with ``offload="cpu"`` it lives in host
        memory (page-locked when the parameters are on a CUDA device, so that the copies to and
        from the device are DMA transfers)."""
        shard = flat_full_master[self.lo:self.hi]
        if offload == "cpu":
            host = shard.to("cpu", copy=True)
            if shard.is_cuda:
                host = host.pin_memory()
            self.master = nn.Parameter(host)
        else:
            self.master = nn.Parameter(shard.clone())

    def add_grad(self, reduced: torch.Tensor) -> None:
        if self.grad_shard is None:
            self.grad_shard = reduced
        else:
            self.grad_shard.add_(reduced)
