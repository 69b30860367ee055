"""Run under torchrun on one or several hosts: ringcomm.init() discovers the nodes; with more than
one node every collective is two-level (shared memory inside a node, gloo between nodes).

    torchrun --nnodes 2 --nproc-per-node 2 --node-rank 0 --master-addr HOST_A --master-port 29500 \
        examples/hier_allreduce.py                 # on host A; --node-rank 1 on host B
    examples/two_nodes.sh --fake                   # the same on one machine (2 fake nodes)

With --torch the same collective runs through torch.distributed's "ringcomm" backend.
"""
import sys

import torch

import ringcomm


def main():
    use_torch = "--torch" in sys.argv
    n = 1 << 20
    if use_torch:
        import importlib

        import torch.distributed as dist
        importlib.import_module("ringcomm.torch")   # registers the "ringcomm" backend
        dist.init_process_group("ringcomm")
        rank, world = dist.get_rank(), dist.get_world_size()
        x = torch.full((n,), float(rank))
        dist.all_reduce(x)
        desc = "torch.distributed backend 'ringcomm'"
    else:
        comm = ringcomm.init()           # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun)
        rank, world = comm.rank, comm.world_size
        x = torch.full((n,), float(rank))
        comm.all_reduce(x)
        desc = repr(comm)
        if hasattr(comm, "inter_stats"):
            desc += f" bytes handed to the inter-node engine: {comm.inter_stats()}"
    ok = bool(torch.all(x == sum(range(world))))
    print(f"rank {rank}/{world}: all_reduce of {4 * n} bytes {'ok' if ok else 'WRONG'}; {desc}",
          flush=True)
    if use_torch:
        dist.destroy_process_group()
    else:
        comm.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
