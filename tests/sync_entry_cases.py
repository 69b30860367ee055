"""Ranks of tests/test_sync_entry.py (module-level so that spawn can pickle them), and EntrySpy."""
import os
import sys

ENTRIES = ("all_reduce", "broadcast", "reduce_scatter", "all_gather")


class EntrySpy:
    """Stands in for a host communicator's core (``comm._c``) inside ``with``: records every offer
    the library makes to a synchronous entry (``sync_all_reduce``, ...) and the entry's answer
    (True: it ran the call; False: declined, nothing done); every other attribute is the core's."""

    def __init__(self, comm):
        self.comm, self.core, self.offers = comm, comm._c, []

    def __enter__(self):
        self.comm._c = self
        return self

    def __exit__(self, *exc):
        self.comm._c = self.core

    def __getattr__(self, name):
        attr = getattr(self.core, name)
        if not name.startswith("sync_"):
            return attr

        def offer(*args, **kwargs):
            answer = attr(*args, **kwargs)
            self.offers.append((name[len("sync_"):], answer))
            return answer
        return offer

    def taken(self):
        """{entry: calls it ran} over the offers so far."""
        return {e: sum(1 for n, answer in self.offers if n == e and answer is True) for e in ENTRIES}


def plain_api_torch(comm):
    """A torch float32 and a bfloat16 tensor through the plain API: results, whether the
    synchronous entry took them (its counter), and what got imported or registered."""
    import torch
    import torch.distributed as dist

    r, n = comm.rank, comm.world_size
    with EntrySpy(comm) as spy:
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
        "entry_calls": spy.taken()["all_reduce"],
        "torch_modules": sorted(m for m in sys.modules if m.startswith("ringcomm.torch")),
        "plugins": sorted(dist.Backend._plugins),
        "backend_list": list(dist.Backend.backend_list),
        "ext_dir": sorted(os.listdir(os.environ["TORCH_EXTENSIONS_DIR"])),
    }


def scatter_gather(comm):
    """reduce_scatter and all_gather through the synchronous entry (numpy and torch) against the
    general path (async_op=True) on the same data; the calls the entry ran (EntrySpy); a rank whose output the
    entry declines gets the general path's own error while the others raise MismatchError."""
    import numpy as np
    import torch

    import ringcomm
    from ringcomm.core.front import chunk_count
    r, n = comm.rank, comm.world_size
    wrong, calls = [], 0
    with EntrySpy(comm) as spy:
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
    taken = {k: spy.taken()[k] for k in ("reduce_scatter", "all_gather")}
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
