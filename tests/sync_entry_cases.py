"""Ranks of tests/test_sync_entry.py (module-level so that spawn can pickle them)."""
import os
import sys


def plain_api_torch(comm):
    """A torch float32 and a bfloat16 tensor through the plain API: results, whether the
    synchronous entry took them (its counter), and what got imported or registered."""
    import torch
    import torch.distributed as dist

    from ringcomm import _C
    r, n = comm.rank, comm.world_size
    before = _C._sync_entry_stats()["all_reduce"]
    x = torch.full((256,), float(r + 1))
    comm.all_reduce(x)
    b = torch.full((512,), float(r + 1), dtype=torch.bfloat16)
    comm.all_reduce(b)
    y = torch.arange(6, dtype=torch.float32).reshape(2, 3) * (r + 1)
    comm.broadcast(y, root=n - 1)
    total = n * (n + 1) / 2
    return {
        "x_ok": bool(torch.equal(x, torch.full((256,), total))),
        "bf16_ok": bool(torch.equal(b, torch.full((512,), total, dtype=torch.bfloat16))),
        "bcast_ok": bool(torch.equal(y, torch.arange(6, dtype=torch.float32).reshape(2, 3) * n)),
        "entry_calls": _C._sync_entry_stats()["all_reduce"] - before,
        "torch_modules": sorted(m for m in sys.modules if m.startswith("ringcomm.torch")),
        "plugins": sorted(dist.Backend._plugins),
        "backend_list": list(dist.Backend.backend_list),
        "ext_dir": sorted(os.listdir(os.environ["TORCH_EXTENSIONS_DIR"])),
    }
