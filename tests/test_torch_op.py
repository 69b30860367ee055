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

import re
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
    rc = dist.new_group(backend="ringcomm")
    be = rc._get_backend(torch.device("cpu"))
    core = be._comm._c          # its next_seq() steps once per collective, whoever issued it

    def python_seq():           # the Python half's count of the collectives it ran
        return int(re.search(r"\d+", repr(be._seq)).group())
    wrong = []
    core0, python0 = core.next_seq(), python_seq()
    calls = 0
    for dt in DTYPES:
        for op, rop in OPS.items():
            if op in ("band", "bor", "bxor") and dt.is_floating_point:
                continue
            for n in (0, 1, 7 * world + 3, 300_000):
                x = _data(rank, n, dt, op)
                ref = x.clone()
                dist.all_reduce(ref, op=rop)                 # gloo, the default group
                if n % 2:
                    out = ringcomm.torch.all_reduce_(x, rc, op)
                else:
                    out = torch.ops.ringcomm.all_reduce_(x, rc.group_name, op)   # returns nothing
                    out = x if out is None else out
                calls += n > 0
                if out is not x or not torch.equal(x, ref):
                    wrong.append((str(dt), op, n))
    # the collectives the synchronous entry ran: every one the core counted that Python did not run
    entry_calls = (core.next_seq() - core0) - (python_seq() - python0)
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
    # a bad op name, or a ReduceOp it does not take: ValueError on every rank, nothing exchanged
    # (the next call still agrees)
    bad_op = []
    for op in ("avg", dist.ReduceOp.AVG):
        try:
            ringcomm.torch.all_reduce_(torch.ones(3), rc, op)
            bad_op.append(None)
        except ValueError as e:
            bad_op.append(str(e))
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
    # No ringcomm group in this process: gloo's allreduce runs, and ringcomm's torch extension is
    # neither built nor loaded for it.
    import sys
    import ringcomm.torch
    x = torch.full((5,), float(rank + 1))
    ringcomm.torch.all_reduce_(x)
    y = torch.full((5,), float(rank + 1))
    ringcomm.torch.all_reduce_(y, op=dist.ReduceOp.MAX)
    loaded = sorted(m for m in sys.modules if m.startswith("ringcomm_c10d"))
    return {"x": x.tolist(), "y": y.tolist(), "loaded": loaded}


def test_a_gloo_group_runs_gloos_allreduce_without_the_extension():
    res = run_ranks(_gloo_only, 2, backend="gloo", timeout=120)
    assert res == [{"x": [3.0] * 5, "y": [2.0] * 5, "loaded": []}] * 2, res


def _names(rank, world):
    # The op's names (the extension's table) are the function's, with the same entry codes.
    from ringcomm.core import tables
    from ringcomm.torch import ops
    from ringcomm.torch.extension import load
    return {"op": dict(load().REDUCE_OPS), "fn": {n: tables.op_code(n) for n in ops._NAMES}}


def test_the_op_and_the_function_take_the_same_names():
    r = run_ranks(_names, 1, backend="gloo", timeout=240)[0]
    assert r["op"] == r["fn"] and len(r["fn"]) == 7, r


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
        for msg in r["bad_op"]:
            assert msg is not None and "sum, product, min, max, band, bor, bxor" in msg, r["bad_op"]
        assert r["after"] == [total] * 4
        assert r["gloo"] == [total] * 6
        if world > 1:
            assert r["mismatch"] == "MismatchError", r["mismatch"]


def _direct(rank, world):
    # ringcomm.torch.all_reduce_ on a ringcomm group: after the group's first call (which learns
    # the group's direct call) every call the entry takes goes straight to the entry,
    # dist.all_reduce never called; what the entry declines runs in the backend's Python half,
    # dist.all_reduce not called either (it would offer the call again); every call while an
    # issue hook needs the Python half takes dist.all_reduce; destroying the group forgets its
    # direct call, and a call on it then raises ClosedError.
    import ringcomm.torch
    from ringcomm.torch import hooks
    rc = dist.new_group(backend="ringcomm")
    default_is_ringcomm = dist.get_backend() == "ringcomm"
    total = float(world * (world + 1) // 2)
    ringcomm.torch.all_reduce_(torch.ones(2), rc)
    learnt = rc in hooks.direct_calls
    real_all_reduce, op_calls = dist.all_reduce, []

    def counting_all_reduce(t, *a, **k):   # the general path's dist.all_reduce
        op_calls.append(t.shape)
        return real_all_reduce(t, *a, **k)

    dist.all_reduce = counting_all_reduce
    wrong = []
    try:
        for n in (1, 5, 1000, 70_000):
            x = torch.full((n,), float(rank + 1))
            if ringcomm.torch.all_reduce_(x, rc) is not x or not bool(torch.all(x == total)):
                wrong.append(n)
            for rop in (dist.ReduceOp.MAX, dist.ReduceOp(dist.ReduceOp.MAX)):   # a dist.ReduceOp names it too
                x = torch.full((n,), float(rank + 1))
                if ringcomm.torch.all_reduce_(x, rc, rop) is not x or not bool(torch.all(x == world)):
                    wrong.append(("max", n))
        direct_ops = len(op_calls)
        t = (torch.arange(6.0).reshape(2, 3) + rank).t()      # declined: not contiguous
        ringcomm.torch.all_reduce_(t, rc)
        declined_ops = len(op_calls) - direct_ops
        seen = []
        hook = lambda op, name, seq, t: seen.append(op)  # noqa: E731
        ringcomm.torch.add_issue_hook(hook)
        try:
            h = torch.full((3,), float(rank + 1))
            ringcomm.torch.all_reduce_(h, rc)
        finally:
            ringcomm.torch.remove_issue_hook(hook)
        hook_ops = len(op_calls) - direct_ops - declined_ops
        d = None
        if default_is_ringcomm:
            d = []
            for _ in range(2):                                    # the default group: learnt under None
                x = torch.full((4,), float(rank + 1))
                ringcomm.torch.all_reduce_(x)
                d.append(x.tolist())
    finally:
        dist.all_reduce = real_all_reduce
    # an int is not an op, learnt group or not (an enum's value is not its name)
    int_op = []
    for g in (rc, dist.new_group(backend="ringcomm")):
        try:
            ringcomm.torch.all_reduce_(torch.ones(2), g, 0)
            int_op.append(None)
        except ValueError:
            int_op.append("ValueError")
    # not a tensor: a TypeError, as dist.all_reduce raises
    try:
        ringcomm.torch.all_reduce_([1.0, 2.0], rc)
        not_tensor = None
    except Exception as e:   # noqa: BLE001
        not_tensor = type(e).__name__
    default_learnt = None in hooks.direct_calls
    dist.destroy_process_group(rc)
    forgotten = rc not in hooks.direct_calls
    errors = []
    for call in (lambda x: dist.all_reduce(x, group=rc), lambda x: ringcomm.torch.all_reduce_(x, rc)):
        try:
            call(torch.ones(2))
            errors.append(None)
        except Exception as e:   # noqa: BLE001 - compared across the two calls
            errors.append(type(e).__name__)
    return {"learnt": learnt, "wrong": wrong, "direct_ops": direct_ops, "declined_ops": declined_ops,
            "t": t.contiguous().tolist(), "hook_saw": seen, "hook_ops": hook_ops, "forgotten": forgotten,
            "errors": errors, "default": d, "default_learnt": default_learnt, "not_tensor": not_tensor,
            "int_op": int_op,
            "default_is_ringcomm": default_is_ringcomm}


@pytest.mark.parametrize("world,backend", [(1, "gloo"), (2, "gloo"), (3, "gloo"), (2, "ringcomm")])
def test_direct_call_skips_the_op_and_falls_back_to_it(world, backend):
    res = run_ranks(_direct, world, backend=backend, timeout=240)
    total = float(world * (world + 1) // 2)
    want_t = (sum(torch.arange(6.0).reshape(2, 3) + r for r in range(world))).t().tolist()
    for r in res:
        assert r["learnt"] and r["wrong"] == []
        assert r["direct_ops"] == 0                 # every contiguous call went straight to the entry
        assert r["declined_ops"] == 0 and r["t"] == want_t   # the Python half, not dist.all_reduce
        assert r["hook_ops"] == 1 and r["hook_saw"] == ["allreduce"]
        assert r["forgotten"] and r["not_tensor"] == "TypeError", r["not_tensor"]
        assert r["int_op"] == ["ValueError", "ValueError"], r["int_op"]
        # dist.all_reduce raises the backend's ClosedError, which torch's logging wrapper masks
        # with a ValueError of its own as it names the group's backend
        assert r["errors"][0] is not None and r["errors"][1] == "ClosedError", r["errors"]
        if r["default_is_ringcomm"]:
            assert r["default"] == [[total] * 4] * 2 and r["default_learnt"]


def _compiled(rank, world):
    # torch.compile traces both calls into one graph (fullgraph: no break), functionalizes the
    # op's mutation and runs it: the all_reduce happens inside the compiled code.
    import ringcomm.torch
    rc = dist.new_group(backend="ringcomm")
    name = rc.group_name

    def through_op(x):
        y = x * 2
        torch.ops.ringcomm.all_reduce_(y, name, "sum")
        return y + 1

    def through_fn(x):
        y = x * 2
        ringcomm.torch.all_reduce_(y, rc, "max")
        return y + 1

    out = {}
    for fn in (through_op, through_fn):
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        out[fn.__name__] = compiled(torch.full((5,), float(rank + 1))).tolist()
    return out


def test_op_and_fn_compile_into_one_graph():
    res = run_ranks(_compiled, 2, backend="gloo", timeout=240)
    for r in res:
        assert r["through_op"] == [2.0 * (1 + 2) + 1] * 5     # sum of 2(rank + 1), plus 1
        assert r["through_fn"] == [2.0 * 2 + 1] * 5           # max of 2(rank + 1), plus 1


def _compiled_gloo_only(rank, world):
    # No ringcomm group, so no ringcomm extension and no op: under torch.compile the function is
    # dist.all_reduce, which dynamo traces; the extension stays unloaded.
    import sys
    import ringcomm.torch

    def fn(x):
        y = x * 2
        ringcomm.torch.all_reduce_(y)
        return y + 1

    out = torch.compile(fn, backend="aot_eager", fullgraph=True)(torch.full((3,), float(rank + 1)))
    return {"out": out.tolist(), "loaded": sorted(m for m in sys.modules if m.startswith("ringcomm_c10d"))}


def test_fn_compiles_in_a_gloo_only_process():
    res = run_ranks(_compiled_gloo_only, 2, backend="gloo", timeout=240)
    assert res == [{"out": [2.0 * (1 + 2) + 1] * 3, "loaded": []}] * 2, res
