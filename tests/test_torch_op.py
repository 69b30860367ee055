"""``torch.ops.ringcomm.all_reduce_`` / ``ringcomm.torch.all_reduce_`` (bindings/torch/trampoline.cpp,
src/ringcomm/torch/ops.py): one synchronous all_reduce of one CPU tensor as one dispatcher op.

Checked in real ranks with gloo as the default group and a ringcomm group beside it, against gloo's
``dist.all_reduce`` of the same data (the independent reference): every dtype and op the entry
has, counts 0, 1, not divisible by the world size and many slots, 1-3 ranks. The fast path really
runs (the synchronous entry's counter moves); what the entry declines (a non-contiguous tensor)
behaves exactly as ``dist.all_reduce`` on the ringcomm group does; the group's sequence number
counts the op's calls as dist's; a bad op name is a ValueError on every rank before any exchange;
a dtype that differs across ranks is ringcomm's MismatchError on every rank, the group usable
after; and on a gloo group the op runs gloo's allreduce."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from ranks import run_ranks  # noqa: E402

OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR,
       "bxor": dist.ReduceOp.BXOR}
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64]


def _data(rank, n, dt, op):
    g = torch.Generator().manual_seed(1000 * rank + n)
    if dt.is_floating_point:
        if op == "product":
            return (1 + torch.rand(n, generator=g) / 8).to(dt)
        return (torch.randn(n, generator=g) * 4).to(dt)
    hi = 3 if op == "product" else 100
    return torch.randint(0, hi, (n,), generator=g).to(dt)


def _cases(rank, world):
    import ringcomm.torch
    from ringcomm import _C
    rc = dist.new_group(backend="ringcomm")
    wrong = []
    entry0 = _C._sync_entry_stats()["all_reduce"]
    calls = 0
    for dt in DTYPES:
        for op, rop in OPS.items():
            if op in ("band", "bor", "bxor") and dt.is_floating_point:
                continue
            for n in (0, 1, 7 * world + 3, 300_000):
                x = _data(rank, n, dt, op)
                ref = x.clone()
                dist.all_reduce(ref, op=rop)                 # gloo, the default group
                out = ringcomm.torch.all_reduce_(x, rc, op) if n % 2 else \
                    torch.ops.ringcomm.all_reduce_(x, rc.group_name, op)
                calls += n > 0
                if out.data_ptr() != x.data_ptr() or not torch.equal(x, ref):
                    wrong.append((str(dt), op, n))
    entry_calls = _C._sync_entry_stats()["all_reduce"] - entry0
    # the entry declines a non-contiguous tensor: the op then does what dist.all_reduce does
    outcomes = []
    for call in (lambda t: dist.all_reduce(t, group=rc), lambda t: ringcomm.torch.all_reduce_(t, rc)):
        base = torch.arange(20, dtype=torch.float32).reshape(4, 5) + rank
        t = base.t()
        try:
            call(t)
            outcomes.append(("ok", t.contiguous().tolist()))
        except Exception as e:   # noqa: BLE001 - compared across the two calls
            outcomes.append((type(e).__name__, str(e).split(":")[0]))
    # the sequence number counts the op's calls as dist's
    be = rc._get_backend(torch.device("cpu"))
    seq0 = be._get_sequence_number_for_group()
    ringcomm.torch.all_reduce_(torch.ones(3), rc)
    dist.all_reduce(torch.ones(3), group=rc)
    seq_step = be._get_sequence_number_for_group() - seq0
    # a bad op name: ValueError on every rank, nothing exchanged (the next call still agrees)
    try:
        ringcomm.torch.all_reduce_(torch.ones(3), rc, "avg")
        bad_op = None
    except ValueError as e:
        bad_op = str(e)
    # a dtype that differs across ranks: MismatchError everywhere, then the group still works
    try:
        ringcomm.torch.all_reduce_(torch.ones(5, dtype=torch.float32 if rank == 0 else torch.float64), rc)
        mismatch = None
    except Exception as e:   # noqa: BLE001
        mismatch = type(e).__name__
    after = torch.full((4,), float(rank + 1))
    ringcomm.torch.all_reduce_(after, rc)
    # on a gloo group: gloo's allreduce, synchronous
    g = torch.full((6,), float(rank + 1))
    ringcomm.torch.all_reduce_(g)           # the default group (gloo)
    return {"wrong": wrong, "entry_calls": entry_calls, "calls": calls, "outcomes": outcomes,
            "seq_step": seq_step, "bad_op": bad_op, "mismatch": mismatch,
            "after": after.tolist(), "gloo": g.tolist()}


def _gloo_only(rank, world):
    # No ringcomm group in this process: the first call loads the extension that registers the op.
    import ringcomm.torch
    x = torch.full((5,), float(rank + 1))
    ringcomm.torch.all_reduce_(x)
    return x.tolist()


def test_op_before_any_ringcomm_group_runs_the_groups_own_allreduce():
    res = run_ranks(_gloo_only, 2, backend="gloo", timeout=120)
    assert res == [[3.0] * 5, [3.0] * 5]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_op_matches_gloo_and_dist(world):
    res = run_ranks(_cases, world, backend="gloo", timeout=300)
    total = float(world * (world + 1) // 2)
    for r in res:
        assert r["wrong"] == [], r["wrong"][:10]
        if world > 1:
            # every call with elements went through the synchronous entry
            assert r["entry_calls"] >= r["calls"], (r["entry_calls"], r["calls"])
        assert r["outcomes"][0] == r["outcomes"][1], r["outcomes"]
        assert r["seq_step"] == 2
        assert r["bad_op"] is not None and "sum, product, min, max, band, bor, bxor" in r["bad_op"]
        assert r["after"] == [total] * 4
        assert r["gloo"] == [total] * 6
        if world > 1:
            assert r["mismatch"] == "MismatchError", r["mismatch"]
