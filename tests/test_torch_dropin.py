"""torch backend "ringcomm" where torch callers expect NCCL's or gloo's exact behaviour: integer
AVG (sum, then division truncating toward zero), the coalesced collectives in torch 2.13's layout,
``barrier(timeout=)``, and torch's preferred op names without a deprecation warning from ringcomm.

As in test_torch_backend.py, each world size spawns ONE group of ranks that runs every case in
turn; each rank has a ringcomm world group and a gloo group over the same ranks, and every result
is compared with gloo's and with a value computed locally from all ranks' inputs.
"""
from __future__ import annotations

import datetime
import os
import time
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from torch_battery import battery_results, fail_on_error, registry  # noqa: E402

WORLD_SIZES = [2, 3]
GROUP_TIMEOUT_S = 30
BATTERY_TIMEOUT_S = 150

CASES, case = registry()


INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]


def int_input(rank: int, n: int, dtype) -> "torch.Tensor":
    """Values whose sum over <= 3 ranks fits every dtype; negative ones for signed dtypes, so
    truncation toward zero differs from floor division."""
    v = (torch.arange(n, dtype=torch.int64) * 3 + rank * 5) % 11
    if dtype != torch.uint8:
        v = v - 5
    return v.to(dtype)


def trunc_avg(tensors: list) -> "torch.Tensor":
    """NCCL's integer AVG, computed locally: exact sum, then C's ``/`` (toward zero)."""
    s = torch.stack([t.to(torch.int64) for t in tensors]).sum(0)
    q = torch.div(s, len(tensors), rounding_mode="trunc")
    return q.to(tensors[0].dtype)


def assert_equal(got, want, what: str) -> None:
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(f"{what}: got {got.dtype}{tuple(got.shape)} {got.flatten()[:8]}, "
                             f"expected {want.dtype}{tuple(want.shape)} {want.flatten()[:8]}")


def gloo_avg(ctx, t: "torch.Tensor") -> "torch.Tensor":
    """gloo has no AVG: SUM over gloo, then the same truncating division."""
    s = t.clone()
    dist.all_reduce(s, group=ctx.gloo)
    return torch.div(s.to(torch.int64), ctx.ws, rounding_mode="trunc").to(t.dtype)


def wait(w, async_op):
    if async_op:
        w.wait()
    else:
        assert w is None


# ---- integer AVG ----------------------------------------------------------------------------
@case
def case_int_avg_all_reduce(ctx):
    for dtype in INTS:
        for n in (7, 40_003):
            want = trunc_avg([int_input(r, n, dtype) for r in range(ctx.ws)])
            assert_equal(gloo_avg(ctx, int_input(ctx.rank, n, dtype)), want, "gloo reference")
            for async_op in (False, True):
                t = int_input(ctx.rank, n, dtype)
                wait(dist.all_reduce(t, op=dist.ReduceOp.AVG, group=ctx.rc, async_op=async_op),
                     async_op)
                assert_equal(t, want, f"all_reduce AVG {dtype} n={n} async={async_op}")
    # a non-contiguous tensor (staged copy, divided, written back)
    base = torch.stack([int_input(ctx.rank, 6, torch.int32)] * 2, 1)
    t = base[:, 0]
    assert not t.is_contiguous()
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=ctx.rc)
    assert_equal(t, trunc_avg([int_input(r, 6, torch.int32) for r in range(ctx.ws)]),
                 "all_reduce AVG non-contiguous")
    assert_equal(base[:, 1], int_input(ctx.rank, 6, torch.int32), "untouched column")
    # coalesced: one flat all-reduce, divided, then copied out
    ts = [int_input(ctx.rank, 5, torch.int64), int_input(ctx.rank, 3, torch.int64)]
    dist.all_reduce_coalesced(ts, op=dist.ReduceOp.AVG, group=ctx.rc)
    assert_equal(ts[0], trunc_avg([int_input(r, 5, torch.int64) for r in range(ctx.ws)]),
                 "all_reduce_coalesced AVG 0")
    assert_equal(ts[1], trunc_avg([int_input(r, 3, torch.int64) for r in range(ctx.ws)]),
                 "all_reduce_coalesced AVG 1")
    # floats keep the true average
    t = torch.full((4,), float(ctx.rank))
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=ctx.rc)
    assert_equal(t, torch.full((4,), sum(range(ctx.ws)) / ctx.ws), "float AVG")


@case
def case_int_avg_reduce(ctx):
    for dtype in INTS:
        want = trunc_avg([int_input(r, 9, dtype) for r in range(ctx.ws)])
        for root in range(ctx.ws):
            for async_op in (False, True):
                t = int_input(ctx.rank, 9, dtype)
                wait(dist.reduce(t, dst=root, op=dist.ReduceOp.AVG, group=ctx.rc,
                                 async_op=async_op), async_op)
                if ctx.rank == root:
                    assert_equal(t, want, f"reduce AVG {dtype} root={root}")
                # gloo: SUM at the root, then the same division
                g = int_input(ctx.rank, 9, dtype)
                dist.reduce(g, dst=root, group=ctx.gloo)
                if ctx.rank == root:
                    g = torch.div(g.to(torch.int64), ctx.ws, rounding_mode="trunc").to(dtype)
                    assert_equal(t, g, f"reduce AVG {dtype} vs gloo")


@case
def case_int_avg_reduce_scatter(ctx):
    ws, r = ctx.ws, ctx.rank
    for dtype in INTS:
        n = 4
        full = [int_input(q, n * ws, dtype) for q in range(ws)]
        want = trunc_avg(full)[r * n:(r + 1) * n]
        g = int_input(r, n * ws, dtype).clone()
        dist.all_reduce(g, group=ctx.gloo)
        g = torch.div(g.to(torch.int64)[r * n:(r + 1) * n], ws, rounding_mode="trunc").to(dtype)
        assert_equal(g, want, "gloo reference")
        for async_op in (False, True):
            out = torch.empty(n, dtype=dtype)
            wait(dist.reduce_scatter_tensor(out, int_input(r, n * ws, dtype),
                                            op=dist.ReduceOp.AVG, group=ctx.rc,
                                            async_op=async_op), async_op)
            assert_equal(out, want, f"reduce_scatter_tensor AVG {dtype} async={async_op}")
            out = torch.empty(n, dtype=dtype)
            ins = list(int_input(r, n * ws, dtype).chunk(ws))
            wait(dist.reduce_scatter(out, ins, op=dist.ReduceOp.AVG, group=ctx.rc,
                                     async_op=async_op), async_op)
            assert_equal(out, want, f"reduce_scatter AVG {dtype} async={async_op}")


# ---- coalesced collectives in torch's layout ----------------------------------------------------
def _coalesced_inputs(rank: int):
    """Shapes of torch's own test: a matrix, a scalar-sized and an empty tensor among them."""
    return [torch.full((2, 2), float(rank + 1)), torch.full((1,), 10.0 * rank),
            torch.empty(0), torch.arange(3, dtype=torch.float32) + rank]


@case
def case_all_gather_coalesced(ctx):
    ins = _coalesced_inputs(ctx.rank)
    results = {}
    for name, group in (("ringcomm", ctx.rc), ("gloo", ctx.gloo)):
        for async_op in (False, True) if name == "ringcomm" else (False,):
            outs = [[torch.full_like(t, -1.0) for t in ins] for _ in range(ctx.ws)]
            fut = dist.all_gather_coalesced(outs, ins, group=group, async_op=async_op)
            if async_op:
                fut.wait()
            results[(name, async_op)] = outs
    for key, outs in results.items():
        assert len(outs) == ctx.ws
        for src in range(ctx.ws):
            for i, want in enumerate(_coalesced_inputs(src)):
                assert_equal(outs[src][i], want, f"all_gather_coalesced {key} [{src}][{i}]")
                assert_equal(outs[src][i], results[("gloo", False)][src][i], f"vs gloo {key}")
    # int64, on a subgroup of ranks 0 and 1 only
    sub = dist.new_group([0, 1], backend="ringcomm")
    if ctx.rank < 2:
        ins = [torch.full((3,), ctx.rank, dtype=torch.int64), torch.arange(2) * (ctx.rank + 1)]
        outs = [[torch.empty_like(t) for t in ins] for _ in range(2)]
        dist.all_gather_coalesced(outs, ins, group=sub)
        for src in range(2):
            assert_equal(outs[src][0], torch.full((3,), src, dtype=torch.int64), "sub 0")
            assert_equal(outs[src][1], torch.arange(2) * (src + 1), "sub 1")
    dist.destroy_process_group(sub)
    # a wrong layout (one list per input) is refused on every rank, not a hang
    bad = [[torch.empty(2) for _ in range(ctx.ws)]] * (ctx.ws + 1)
    try:
        dist.all_gather_coalesced(bad, [torch.ones(2)], group=ctx.rc)
    except ValueError as e:
        assert "one output list per rank" in str(e), e
    else:
        raise AssertionError("wrong all_gather_coalesced layout accepted")


def _agit_inputs(rank: int, dtypes):
    return [torch.full((4,), rank, dtype=dtypes[0]), (torch.arange(3) * (rank + 1)).to(dtypes[1]),
            torch.full((2,), -rank, dtype=dtypes[2])]


@case
def case_allgather_into_tensor_coalesced(ctx):
    ws, r = ctx.ws, ctx.rank
    # gloo's coalesced all_gather_into_tensor needs one dtype (mixed ones come back garbled):
    # compared with gloo on float32, with the local reference on mixed dtypes
    for dtypes in ([torch.float32] * 3, [torch.float32, torch.float64, torch.int32]):
        ins = _agit_inputs(r, dtypes)
        wants = [torch.cat([_agit_inputs(q, dtypes)[i] for q in range(ws)]) for i in range(3)]
        groups = [("ringcomm", ctx.rc)]
        if len(set(dtypes)) == 1:
            groups.append(("gloo", ctx.gloo))
        for name, group in groups:
            outs = [torch.empty(ws * t.numel(), dtype=t.dtype) for t in ins]
            with dist._coalescing_manager(group=group, async_ops=True) as cm:
                for o, i in zip(outs, ins):
                    dist.all_gather_into_tensor(o, i, group=group)
            cm.wait()
            for i in range(3):
                assert_equal(outs[i], wants[i], f"coalesced all_gather_into_tensor {name} {i}")
        # the ProcessGroup entry point torch's coalescing manager reaches
        outs = [torch.empty(ws * t.numel(), dtype=t.dtype) for t in ins]
        ctx.rc.allgather_into_tensor_coalesced(outs, ins).wait()
        for i in range(3):
            assert_equal(outs[i], wants[i], f"allgather_into_tensor_coalesced {i}")


@case
def case_allreduce_coalesced(ctx):
    r = ctx.rank
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT]
    for op in ops:
        got = {}
        for name, group in (("ringcomm", ctx.rc), ("gloo", ctx.gloo)):
            ts = [torch.full((2, 3), float(r + 1)), torch.arange(5, dtype=torch.float32) - r,
                  torch.full((1,), 2.0 + r)]
            dist.all_reduce_coalesced(ts, op=op, group=group)
            got[name] = ts
        for a, b in zip(got["ringcomm"], got["gloo"]):
            assert_equal(a, b, f"all_reduce_coalesced {op} vs gloo")
    # int64 through the async path
    ts = [torch.full((3,), r, dtype=torch.int64), torch.ones(2, dtype=torch.int64)]
    dist.all_reduce_coalesced(ts, group=ctx.rc, async_op=True).wait()
    assert_equal(ts[0], torch.full((3,), sum(range(ctx.ws)), dtype=torch.int64), "int 0")
    assert_equal(ts[1], torch.full((2,), ctx.ws, dtype=torch.int64), "int 1")


# ---- barrier(timeout=) ------------------------------------------------------------------------
@case
def case_barrier_timeout(ctx):
    import ringcomm
    late = ctx.ws - 1
    # everyone on time: a timeout changes nothing
    dist.barrier(group=ctx.rc, timeout=datetime.timedelta(seconds=10))
    dist.barrier(group=ctx.rc, async_op=True, timeout=datetime.timedelta(seconds=10)).wait()
    # the last rank arrives 2.5 s late; the others wait 0.5 s at most
    if ctx.rank == late:
        time.sleep(2.5)
        dist.barrier(group=ctx.rc, timeout=datetime.timedelta(seconds=10))
    else:
        t0 = time.perf_counter()
        try:
            dist.barrier(group=ctx.rc, timeout=datetime.timedelta(seconds=0.5))
        except ringcomm.TimeoutError as e:
            took = time.perf_counter() - t0
            assert "barrier" in str(e), e
            assert 0.4 < took < 1.5, f"barrier timeout raised after {took:.2f} s"
        else:
            raise AssertionError("barrier(timeout=0.5 s) returned although a rank was 2.5 s late")
    # the same through an async work
    if ctx.rank == late:
        time.sleep(2.5)
        dist.barrier(group=ctx.rc, timeout=datetime.timedelta(seconds=10))
    else:
        w = dist.barrier(group=ctx.rc, async_op=True, timeout=datetime.timedelta(seconds=0.5))
        t0 = time.perf_counter()
        try:
            w.wait()
        except ringcomm.TimeoutError as e:
            assert "barrier" in str(e), e
            assert time.perf_counter() - t0 < 1.5
        else:
            raise AssertionError("async barrier(timeout=0.5 s) completed although a rank was late")
    # the timed-out barriers still completed when the late rank arrived: the group is usable
    t = torch.full((3,), float(ctx.rank))
    dist.all_reduce(t, group=ctx.rc)
    assert_equal(t, torch.full((3,), float(sum(range(ctx.ws)))), "all_reduce after timeouts")


# ---- torch's preferred names, no deprecation warning from ringcomm ----------------------------
_DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


@case
def case_preferred_names_no_warnings(ctx):
    """Only torch 2.13's preferred spellings are called, so ANY deprecation warning raised inside
    (torch's ``@deprecated`` wrappers report their own file, not the caller's, so the warning's
    location cannot tell whose call it was) comes from ringcomm's code path."""
    ws, r = ctx.ws, ctx.rank
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.empty(ws * 3)
        dist.all_gather_single(out, torch.full((3,), float(r)), group=ctx.rc)
        assert_equal(out, torch.arange(ws, dtype=torch.float32).repeat_interleave(3),
                     "dist.all_gather_single")
        dist.all_gather_single(out, torch.full((3,), float(r + 1)), group=ctx.rc,
                               async_op=True).wait()
        assert_equal(out, torch.arange(1, ws + 1, dtype=torch.float32).repeat_interleave(3),
                     "dist.all_gather_single async")
        ctx.rc.all_gather_single(out, torch.full((3,), float(r))).wait()
        assert_equal(out, torch.arange(ws, dtype=torch.float32).repeat_interleave(3),
                     "ProcessGroup.all_gather_single")
        rs = torch.empty(2)
        dist.reduce_scatter_single(rs, torch.ones(2 * ws), group=ctx.rc)
        assert_equal(rs, torch.full((2,), float(ws)), "dist.reduce_scatter_single")
        dist.reduce_scatter_single(rs, torch.full((2 * ws,), float(r)), op=dist.ReduceOp.MAX,
                                   group=ctx.rc, async_op=True).wait()
        assert_equal(rs, torch.full((2,), float(ws - 1)), "dist.reduce_scatter_single MAX")
        ctx.rc.reduce_scatter_single(rs, torch.ones(2 * ws)).wait()
        assert_equal(rs, torch.full((2,), float(ws)), "ProcessGroup.reduce_scatter_single")
        ctx.rc.reduce_scatter_tensor_coalesced([rs], [torch.ones(2 * ws)]).wait()
        assert_equal(rs, torch.full((2,), float(ws)), "reduce_scatter_tensor_coalesced")
        a2a = torch.empty(ws)
        dist.all_to_all_single(a2a, torch.full((ws,), float(r)), group=ctx.rc)
        assert_equal(a2a, torch.arange(ws, dtype=torch.float32), "all_to_all_single")
        t = torch.ones(4)
        dist.all_reduce(t, group=ctx.rc)
        dist.broadcast(t, src=0, group=ctx.rc)
        dist.barrier(group=ctx.rc)
        objs = [None] * ws
        dist.all_gather_object(objs, {"rank": r}, group=ctx.rc)
        assert objs == [{"rank": q} for q in range(ws)], objs
        # one DDP training step
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2),
                                                          process_group=ctx.rc)
        loss = model(torch.full((3, 4), float(r))).sum()
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
    deprecations = [f"{w.category.__name__} {w.filename}:{w.lineno}: {w.message}"
                    for w in caught if issubclass(w.category, _DEPRECATIONS)]
    assert not deprecations, "deprecation warnings:\n" + "\n".join(deprecations)
    # the DDP gradients equal gloo's
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2),
                                                      process_group=ctx.gloo)
    model(torch.full((3, 4), float(r))).sum().backward()
    for a, p in zip(grads, model.parameters()):
        assert torch.equal(a, p.grad), (a, p.grad)


# ---- the spawned battery ----------------------------------------------------------------------
@pytest.mark.timeout(BATTERY_TIMEOUT_S + 60)
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_dropin(ws, name):
    fail_on_error(battery_results(__name__, CASES, ws, "ringcomm-dropin-test-", BATTERY_TIMEOUT_S,
                                  GROUP_TIMEOUT_S), ws, name)
