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


def scatter_gather(comm):
    """reduce_scatter and all_gather through the synchronous entry (numpy and torch) against the
    general path (async_op=True) on the same data; the entry's counters; a rank whose output the
    entry declines gets the general path's own error while the others raise MismatchError."""
    import numpy as np
    import torch

    import ringcomm
    from ringcomm import _C
    from ringcomm.core.front import chunk_count
    r, n = comm.rank, comm.world_size
    wrong, calls = [], 0
    before = _C._sync_entry_stats()
    for dt in (np.float32, np.float64, np.int32, np.uint8, np.float16):
        for count in (0, 1, 7 * n + 3, 70000):
            x = ((np.arange(count) * (r + 3)) % 5 + 1).astype(dt)
            mine = chunk_count(count, n, r)
            for wrap in (np.asarray, torch.from_numpy):
                fast, slow = np.zeros(mine, dt), np.zeros(mine, dt)
                comm.reduce_scatter(wrap(fast), wrap(x), op=ringcomm.ReduceOp.MAX)
                comm.reduce_scatter(slow, x, op=ringcomm.ReduceOp.MAX, async_op=True).wait()
                if fast.tobytes() != slow.tobytes():
                    wrong.append(("reduce_scatter", np.dtype(dt).name, count, wrap.__name__))
                fast, slow = np.zeros(count * n, dt), np.zeros(count * n, dt)
                comm.all_gather(wrap(fast), wrap(x))
                comm.all_gather(slow, x, async_op=True).wait()
                if fast.tobytes() != slow.tobytes():
                    wrong.append(("all_gather", np.dtype(dt).name, count, wrap.__name__))
                calls += 1
    after = _C._sync_entry_stats()
    taken = {k: after[k] - before[k] for k in ("reduce_scatter", "all_gather")}
    x = np.ones(4 * n, np.float32)
    out = np.zeros(5 if r == n - 1 else 4, np.float32)       # the last rank's output is wrong
    try:
        comm.reduce_scatter(out, x)
        outcome = "no error"
    except ringcomm.InvalidArgumentError:
        outcome = "own error"
    except ringcomm.MismatchError:
        outcome = "mismatch"
    return wrong, taken, calls, outcome
