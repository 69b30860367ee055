"""Train a small MLP with PyTorch DDP on the ringcomm backend.

    torchrun --nproc-per-node 4 examples/ddp_mlp.py [--steps 50] [--backend ringcomm|gloo]

Each process trains on its own shard of a synthetic regression problem; DDP all-reduces the
gradients over ringcomm's shared-memory rings while the backward pass runs. Rank 0 prints the
loss and, at the end, a checksum of the parameters (identical on every rank).
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringcomm.torch  # noqa: F401  registers backend "ringcomm" (automatic when installed
#                                   with its torch.backends entry point; harmless either way)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=64, help="per-process batch size")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--backend", default="ringcomm")
    return p


def main() -> None:
    p = build_parser()
    args = p.parse_args()

    dist.init_process_group(args.backend)          # RANK, WORLD_SIZE, MASTER_* from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)                           # same initial weights everywhere (DDP also
    #                                                broadcasts rank 0's at construction)
    model = nn.Sequential(nn.Linear(32, args.hidden), nn.GELU(),
                          nn.Linear(args.hidden, args.hidden), nn.GELU(),
                          nn.Linear(args.hidden, 1))
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)

    gen = torch.Generator().manual_seed(1234 + rank)   # this rank's shard of the data
    w_true = torch.randn(32, 1, generator=torch.Generator().manual_seed(7))
    t0 = time.perf_counter()
    for step in range(args.steps):
        x = torch.randn(args.batch, 32, generator=gen)
        y = x @ w_true + 0.01 * torch.randn(args.batch, 1, generator=gen)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()                            # gradients all-reduced here, overlapped
        opt.step()
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.5f}", flush=True)
    elapsed = time.perf_counter() - t0

    checksum = torch.stack([q.detach().double().sum() for q in model.parameters()]).sum()
    all_sums = [None] * world
    dist.all_gather_object(all_sums, float(checksum))
    if rank == 0:
        same = all(s == all_sums[0] for s in all_sums)
        print(f"backend {dist.get_backend()}  world {world}  {args.steps} steps in {elapsed:.2f} s"
              f"  params checksum {all_sums[0]:.10f}  identical on all ranks: {same}", flush=True)
        if not same:
            raise SystemExit("parameters differ across ranks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
