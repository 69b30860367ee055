"""Ranks of tests/test_sync_entry.py (module-level so that spawn can pickle them), EntrySpy and issued()."""
import os
import sys

ENTRIES = ("all_reduce", "broadcast", "reduce_scatter", "all_gather", "reduce", "all_to_all", "gather", "scatter",
           "barrier")


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


def issued(comm, f):
    """(what f returned, the collectives comm's core issued meanwhile: its next_seq()'s step)."""
    before = comm._c.next_seq()
    got = f()
    return got, comm._c.next_seq() - before


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


def rooted_and_all_to_all(comm):
    """reduce, all_to_all, gather, scatter and barrier through the synchronous entry (numpy and
    torch, every root) against the general path (async_op=True) on the same data; the calls the
    entry ran (EntrySpy); an overlapping all_to_all (declined, copied by the general path); and a
    rank whose arguments the entry declines, which gets the general path's own error while the
    others raise MismatchError."""
    import numpy as np
    import torch

    import ringcomm
    r, n = comm.rank, comm.world_size
    wrong, calls = [], {e: 0 for e in ENTRIES}

    def same(what, fast, slow):
        if fast.tobytes() != slow.tobytes():
            wrong.append(what)

    with EntrySpy(comm) as spy:
        for dt in (np.float32, np.float64, np.int32, np.uint8, np.float16):
            for count in (0, 3, 4099):
                x = ((np.arange(count * n) * (r + 3)) % 5 + 1).astype(dt)
                for wrap in (np.asarray, torch.from_numpy):
                    tag = (np.dtype(dt).name, count, wrap.__name__)
                    for root in range(n):
                        fast, slow = x[:count].copy(), x[:count].copy()
                        comm.reduce(wrap(fast), root=root, op=ringcomm.ReduceOp.MAX)
                        comm.reduce(slow, root=root, op=ringcomm.ReduceOp.MAX, async_op=True).wait()
                        same(("reduce", root) + tag, fast, slow)
                        fo, so = np.zeros(count, dt), np.zeros(count, dt)
                        comm.reduce(wrap(x[:count]), root=root, output=wrap(fo) if r == root else None)
                        comm.reduce(x[:count], root=root, output=so if r == root else None, async_op=True).wait()
                        same(("reduce out", root) + tag, fo, so)
                        fo, so = np.zeros(count * n, dt), np.zeros(count * n, dt)
                        comm.gather(wrap(fo) if r == root else None, wrap(x[:count]), root=root)
                        comm.gather(so if r == root else None, x[:count], root=root, async_op=True).wait()
                        same(("gather", root) + tag, fo, so)
                        fo, so = np.zeros(count, dt), np.zeros(count, dt)
                        comm.scatter(wrap(fo), wrap(x) if r == root else None, root=root)
                        comm.scatter(so, x if r == root else None, root=root, async_op=True).wait()
                        same(("scatter", root) + tag, fo, so)
                        for e in ("reduce", "gather", "scatter"):
                            calls[e] += 1
                        calls["reduce"] += 1
                    fo, so = np.zeros(count * n, dt), np.zeros(count * n, dt)
                    comm.all_to_all(wrap(fo), wrap(x))
                    comm.all_to_all(so, x, async_op=True).wait()
                    same(("all_to_all",) + tag, fo, so)
                    calls["all_to_all"] += 1
                    comm.barrier()
                    calls["barrier"] += 1
                    # given split sizes, uneven: rank i sends (3i + j) % 4 * count elements to j
                    sc = [(3 * r + j) % 4 * count for j in range(n)]
                    rcv = [(3 * i + r) % 4 * count for i in range(n)]
                    xs = x[:sum(sc)] if sum(sc) <= x.size else np.resize(x, sum(sc))
                    fo, so = np.zeros(sum(rcv), dt), np.zeros(sum(rcv), dt)
                    comm.all_to_all(wrap(fo), wrap(xs), output_splits=rcv, input_splits=sc)
                    comm.all_to_all(so, xs, output_splits=rcv, input_splits=sc, async_op=True).wait()
                    same(("all_to_all splits",) + tag, fo, so)
                    calls["all_to_all"] += 1
        taken = spy.taken()
        # In place: the entry declines (the buffers overlap) and the general path copies the input.
        buf = np.arange(4 * n, dtype=np.float32) + 100 * r
        want = np.zeros(4 * n, np.float32)
        comm.all_to_all(want, buf.copy(), async_op=True).wait()
        before = len(spy.offers)
        comm.all_to_all(buf, buf)
        overlap = (spy.offers[before:], bool((buf == want).all()))
    outcomes = []
    last = r == n - 1
    bad = [
        ("all_to_all", lambda: comm.all_to_all(np.zeros(4 * n, np.float64 if last else np.float32),
                                               np.ones(4 * n, np.float32))),
        ("reduce", lambda: comm.reduce(np.ones(4, np.float32), root=0,
                                       op=ringcomm.ReduceOp.BAND if last else ringcomm.ReduceOp.SUM)),
        ("gather", lambda: comm.gather(np.zeros(4 * n + (1 if last else 0), np.float32) if r == n - 1 else None,
                                       np.ones(4, np.float32), root=n - 1)),
        ("scatter", lambda: comm.scatter(np.zeros(4, np.float32) if not last else np.zeros(4, np.float32)[::2],
                                         np.ones(4 * n, np.float32) if r == 0 else None, root=0)),
    ]
    for name, f in bad:
        try:
            f()
            outcomes.append((name, "no error"))
        except ringcomm.MismatchError:
            outcomes.append((name, "mismatch"))
        except ringcomm.RingcommError as e:
            outcomes.append((name, type(e).__name__))
    return wrong, {k: taken[k] for k in calls if k in ("reduce", "all_to_all", "gather", "scatter", "barrier")}, \
        {k: v for k, v in calls.items() if v}, overlap, outcomes
