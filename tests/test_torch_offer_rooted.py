"""dist.gather, dist.scatter, dist.barrier and dist.all_to_all_single with split sizes through the
c10d trampoline's offer point (bindings/torch/trampoline.cpp: offer_gather, offer_scatter,
offer_barrier, offer_all_to_all) into the synchronous entries (csrc/comm/sync_entry.h), checked
side by side with gloo in the same ranks: gloo is the default group, a ringcomm group holds the
same ranks, and every call runs on both with the same inputs; the results must be equal, for
every dtype both take, element counts 0, 1 and odd, every root, worlds 1 to 4, the root's list
as separate tensors (staged in C++) and as views of one tensor (handed over as it is). That the
offer point ran them: the Python half's sequence number does not move while the core's does, once
per call, and their works answer torch's Work contract as gloo's do. What the entry declines (a
strided tensor) and what the Python half refuses (a wrong list, split sizes that do not add up)
still reach the Python half, with its results and errors."""
from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from ranks import require_backend, run_ranks  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64]


def _seq_next(be) -> int:
    return int(re.search(r"\d+", repr(be._seq)).group())


def _vals(rank: int, n: int, dt, salt: int = 0):
    return ((torch.arange(n) * 3 + rank * 7 + salt) % 50).to(dt)


def _splits(i: int, j: int, n: int) -> int:
    """Rows rank i sends rank j for count n: 0 everywhere for n == 0, else 0-2 rows plus n % 2."""
    return 0 if n == 0 else (i + 2 * j + n) % 3 + n % 2


def _matrix(rank, world):
    rc = dist.new_group(backend="ringcomm")
    gl = dist.group.WORLD
    be = rc._get_backend(torch.device("cpu"))
    core = be._comm._c
    wrong, calls = [], 0
    py_before, core_before = _seq_next(be), core.next_seq()

    def both(tag, run):
        nonlocal calls
        a, b = run(rc), run(gl)
        calls += 1
        if len(a) != len(b) or any(x.dtype != y.dtype or not torch.equal(x, y) for x, y in zip(a, b)):
            wrong.append((tag, [x.tolist() for x in a], [y.tolist() for y in b]))

    for dt in DTYPES:
        for n in (0, 1, 2 * world + 3):
            for root in range(world):
                x = _vals(rank, n, dt)
                for flat in (False, True):
                    def gather(g, flat=flat):
                        if rank != root:
                            dist.gather(x, dst=root, group=g)
                            return [x]
                        if flat:
                            lst = list(torch.full((world, n), 99).to(dt).unbind(0))
                        else:
                            lst = [torch.full((n,), 99).to(dt) for _ in range(world)]
                        dist.gather(x, gather_list=lst, dst=root, group=g)
                        return lst
                    both(("gather", str(dt), n, root, flat), gather)

                    def scatter(g, flat=flat):
                        out = torch.full((n,), 99).to(dt)
                        if rank != root:
                            dist.scatter(out, src=root, group=g)
                            return [out]
                        if flat:
                            lst = list(torch.stack([_vals(j, n, dt, 5) for j in range(world)]).unbind(0))
                        else:
                            lst = [_vals(j, n, dt, 5) for j in range(world)]
                        dist.scatter(out, scatter_list=lst, src=root, group=g)
                        return [out, *lst]
                    both(("scatter", str(dt), n, root, flat), scatter)

            # all_to_all_single with split sizes on both sides, rows of two elements
            def a2a_v(g):
                ins = [_splits(rank, j, n) for j in range(world)]
                outs = [_splits(i, rank, n) for i in range(world)]
                i_t = _vals(rank, 2 * sum(ins), dt).reshape(-1, 2)
                o_t = torch.full((sum(outs), 2), 99).to(dt)
                dist.all_to_all_single(o_t, i_t, outs, ins, group=g)
                return [o_t]
            both(("all_to_all_v", str(dt), n), a2a_v)

            # split sizes on the input side only: every rank sends rank j (j + 1) * n rows
            def a2a_half(g):
                ins = [(j + 1) * n for j in range(world)]
                i_t = _vals(rank, sum(ins), dt)
                o_t = torch.full((world * (rank + 1) * n,), 99).to(dt)
                dist.all_to_all_single(o_t, i_t, None, ins, group=g)
                return [o_t]
            both(("all_to_all_half", str(dt), n), a2a_half)
        both(("barrier", str(dt)), lambda g: dist.barrier(group=g) or [])
    # torch's Work contract for a call the offer point ran (ProcessGroup's own methods, asyncOp
    # False), as gloo's work answers it: complete after wait(), its result and its future's
    # value the outputs, no exception
    def contract(name, g):
        if name == "gather":
            opts = dist.GatherOptions()
            opts.rootRank, opts.asyncOp = 0, False
            outs = [[torch.zeros(3) for _ in range(world)]] if rank == 0 else []
            ins = [_vals(rank, 3, torch.float32)]
            return g.gather(outs, ins, opts)
        if name == "scatter":
            opts = dist.ScatterOptions()
            opts.rootRank, opts.asyncOp = 0, False
            ins = [[_vals(j, 3, torch.float32) for j in range(world)]] if rank == 0 else []
            return g.scatter([torch.zeros(3)], ins, opts)
        opts = dist.BarrierOptions()
        opts.asyncOp = False
        return g.barrier(opts)

    works = {}
    for name in ("gather", "scatter", "barrier"):
        seen = []
        for g in (rc, gl):
            w = contract(name, g)
            w.wait()
            seen.append({"completed": w.is_completed(), "exception": w.exception() is None,
                         "result": [t.tolist() for t in w.result()],
                         "future": [t.tolist() for t in w.get_future().wait()]})
        works[name] = seen
    calls += 3
    out = {"wrong": wrong, "calls": calls, "works": works,
           "python_calls": _seq_next(be) - py_before, "core_calls": core.next_seq() - core_before}

    # what the offer point leaves to the Python half: still right, counted there
    py_before = _seq_next(be)
    col = (torch.arange(8, dtype=torch.float32).reshape(2, 4) + rank)[:, 1]  # strided: [1, 5] + rank
    lst = [torch.zeros(2) for _ in range(world)] if rank == 0 else None
    dist.gather(col, gather_list=lst, dst=0, group=rc)
    if rank == 0 and not all(torch.equal(lst[r], torch.tensor([1.0, 5.0]) + r) for r in range(world)):
        wrong.append(("strided gather", [t.tolist() for t in lst]))
    out["python_calls_left"] = [_seq_next(be) - py_before]
    dist.barrier(group=rc, async_op=True).wait()
    out["python_calls_left"].append(_seq_next(be) - py_before)
    # errors the Python half raises: a wrong list on the root (every rank raises), split sizes
    # that do not add up to the rows
    errs = []
    try:
        dist.gather(torch.ones(3), gather_list=[torch.zeros(3)] * (world + 1) if rank == 0 else None,
                    dst=0, group=rc)
        errs.append("no error")
    except Exception as e:  # noqa: BLE001
        errs.append(type(e).__name__)
    try:
        dist.all_to_all_single(torch.zeros(world), torch.zeros(world), [1] * world, [2] * world, group=rc)
        errs.append("no error")
    except Exception as e:  # noqa: BLE001
        errs.append(type(e).__name__)
    y = torch.full((3,), float(rank + 1))
    dist.all_reduce(y, group=rc)
    errs.append(bool(torch.equal(y, torch.full((3,), world * (world + 1) / 2))))
    out["errors"] = errs
    dist.destroy_process_group(rc)
    return out


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_rooted_and_split_collectives_through_the_offer_point_match_gloo(world):
    require_backend("ringcomm")
    res = run_ranks(_matrix, world, backend="gloo", timeout=540)
    per_dtype = 3 * (world * 2 * 2 + 2) + 1
    for r, out in enumerate(res):
        assert out["wrong"] == [], (r, out["wrong"][:5])
        assert out["calls"] == len(DTYPES) * per_dtype + 3, out
        for name, (ours, gloo) in out["works"].items():
            assert ours == gloo and ours["completed"] and ours["exception"], (name, ours, gloo)
        # every call ran in C++, once each: the Python half issued none, the core all of them
        assert out["python_calls"] == 0, out
        assert out["core_calls"] == out["calls"], out
        # the strided gather (declined by the entry) and the async barrier went to the Python half
        assert out["python_calls_left"] == [1, 2], out["python_calls_left"]
        # the Python half's errors on every rank (ValueError where it refused, MismatchError on
        # the peers it told), and the group usable after them
        assert "no error" not in out["errors"][:2] and out["errors"][2] is True, out
