"""torch.distributed backend "ringcomm": every operation, sync and async, against gloo and a
single-process reference.

Spawning a rank that imports torch costs seconds on small machines, so each world size starts ONE
group of ranks which runs every case below in turn (``_battery``) and reports, per case, ``None``
or the failing rank's traceback. The pytest tests then only look the results up. Each rank builds
a ringcomm world group and a gloo group over the same ranks; each case runs the operation on
ringcomm, the same operation on gloo where gloo supports it, and compares both with the result
computed locally from every rank's (deterministic) input.
"""
from __future__ import annotations

import datetime
import os
import time
import traceback

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import mp_cases  # noqa: E402
from mp_cases import free_port, to_np  # noqa: E402
from torch_battery import (  # noqa: E402
    fail_on_error, init_world, registry, run_cases, spawn_battery)

WORLD_SIZES = [2, 3]
CASE_TIMEOUT_S = 30        # ringcomm/gloo group timeout inside the battery: a desync fails fast
BATTERY_TIMEOUT_S = 200    # the whole spawned battery for one world size

CASES, case = registry()


# ---- inputs and references ----------------------------------------------------------------------
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8]
SIZES = [7, 40_003]  # odd small; large enough for several ring steps / slots


def make_input(rank: int, n: int, dtype, op: str = "SUM") -> "torch.Tensor":
    """Small integer values: every sum/product/average below is exact in every dtype."""
    base = torch.arange(n, dtype=torch.int64)
    if dtype == torch.bool:
        return ((base + rank) % 2 == 0)
    if op == "PRODUCT":
        v = (base + rank) % 2 + 1          # 1 or 2: products of <= 3 stay exact
    elif op in ("BAND", "BOR", "BXOR"):
        v = (base * 7 + rank * 13) % 64
    else:
        v = (base * 3 + rank * 5) % 11     # 0..10
    return v.to(dtype)


def reference(op: str, tensors: list, factor: float = 1.0) -> "torch.Tensor":
    """mp_cases.reference (numpy) of one tensor per rank, as a tensor of their dtype."""
    dt = str(tensors[0].dtype).removeprefix("torch.")
    r = mp_cases.reference([to_np(t) for t in tensors], dt, op, len(tensors), factor)
    return torch.from_numpy(np.asarray(r)).to(tensors[0].dtype)


def torch_op(op: str, factor: float = 1.0):
    if op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(factor)
    return getattr(dist.ReduceOp, op)


FLOAT_TOL = {torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7),
             torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}


def assert_same(actual, expected, what: str) -> None:
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        raise AssertionError(f"{what}: got {actual.dtype}{tuple(actual.shape)}, expected "
                             f"{expected.dtype}{tuple(expected.shape)}")
    if actual.is_floating_point():
        # (torch.testing.assert_close costs seconds on first use: checked by hand)
        rtol, atol = FLOAT_TOL[actual.dtype]
        if not torch.allclose(actual, expected, rtol=rtol, atol=atol):
            diff = (actual.double() - expected.double()).abs()
            i = int(diff.argmax())
            raise AssertionError(f"{what}: max abs diff {diff.max().item():.3g} at {i}: "
                                 f"{actual.flatten()[i].item()} vs {expected.flatten()[i].item()}")
    elif not torch.equal(actual, expected):
        bad = (actual != expected).nonzero()[:5].flatten().tolist()
        raise AssertionError(f"{what}: differs at {bad}: {actual.flatten()[bad].tolist()} vs "
                             f"{expected.flatten()[bad].tolist()}")


def run_both(ctx, fn, *, gloo: bool = True):
    """fn(group, async_op) -> result; run sync and async on ringcomm (and on gloo)."""
    out = {}
    for async_op in (False, True):
        out[("ringcomm", async_op)] = fn(ctx.rc, async_op)
    if gloo:
        out[("gloo", False)] = fn(ctx.gloo, False)
    return out


def finish(work, async_op):
    """Wait on a work returned by an async call; check is_completed and the future."""
    if not async_op:
        assert work is None, f"a synchronous call returned {work!r}"
        return None
    assert work is not None
    value = work.get_future().wait()
    assert isinstance(value, list), f"future value is {type(value)}"
    assert work.wait() is True
    assert work.is_completed()
    assert work.exception() is None
    return value


# ---- cases --------------------------------------------------------------------------------------
OPS_FLOAT = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM"]
OPS_INT = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
GLOO_OPS = {"SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"}


@case
def case_all_reduce(ctx):
    for dtype in FLOATS + INTS:
        ops = OPS_FLOAT if dtype.is_floating_point else OPS_INT
        for op in ops:
            # every dtype x op at a small size; the multi-step size for a representative few
            big = dtype in (torch.float32, torch.bfloat16, torch.int64) and op in (
                "SUM", "AVG", "MAX", "PREMUL_SUM", "BXOR")
            for n in SIZES if big else SIZES[:1]:
                factor = 0.5
                expect = reference(op, [make_input(r, n, dtype, op) for r in range(ctx.ws)],
                                   factor)

                def fn(group, async_op):
                    t = make_input(ctx.rank, n, dtype, op)
                    w = dist.all_reduce(t, op=torch_op(op, factor), group=group,
                                        async_op=async_op)
                    v = finish(w, async_op)
                    if v is not None:
                        assert v[0] is t or v[0].data_ptr() == t.data_ptr()
                    return t

                res = run_both(ctx, fn, gloo=op in GLOO_OPS and dtype != torch.bfloat16)
                for key, got in res.items():
                    assert_same(got, expect, f"all_reduce {op} {dtype} n={n} {key}")


@case
def case_all_reduce_bool(ctx):
    n = 9
    for op, ref in (("MAX", "BOR"), ("MIN", "BAND"), ("BOR", "BOR"), ("BAND", "BAND")):
        ins = [make_input(r, n, torch.bool) for r in range(ctx.ws)]
        expect = ins[0].clone()
        for t in ins[1:]:
            expect = expect | t if ref == "BOR" else expect & t
        t = make_input(ctx.rank, n, torch.bool)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=ctx.rc)
        assert_same(t, expect, f"all_reduce bool {op}")


@case
def case_all_reduce_premul_tensor_factor(ctx):
    t = make_input(ctx.rank, 10, torch.float32)
    factor = torch.tensor([0.25])
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor), group=ctx.rc)
    expect = reference("PREMUL_SUM", [make_input(r, 10, torch.float32) for r in range(ctx.ws)],
                       0.25)
    assert_same(t, expect, "PREMUL_SUM tensor factor")


@case
def case_all_reduce_noncontiguous(ctx):
    base = torch.stack([make_input(ctx.rank, 12, torch.float32)] * 2, 1)  # (12, 2)
    t = base[:, 1]
    assert not t.is_contiguous()
    dist.all_reduce(t, group=ctx.rc)
    expect = reference("SUM", [make_input(r, 12, torch.float32) for r in range(ctx.ws)])
    assert_same(t.contiguous(), expect, "non-contiguous all_reduce")
    assert_same(base[:, 0].contiguous(), make_input(ctx.rank, 12, torch.float32),
                "untouched column")


@case
def case_all_reduce_complex(ctx):
    t = torch.complex(make_input(ctx.rank, 5, torch.float32), torch.ones(5))
    dist.all_reduce(t, group=ctx.rc)
    assert_same(torch.view_as_real(t)[:, 1].contiguous(), torch.full((5,), float(ctx.ws)),
                "complex imag")


@case
def case_broadcast(ctx):
    for dtype in FLOATS + INTS + [torch.bool]:
        for root in range(ctx.ws):
            n = 1001
            expect = make_input(root, n, dtype)

            def fn(group, async_op):
                t = make_input(ctx.rank, n, dtype)
                finish(dist.broadcast(t, src=root, group=group, async_op=async_op), async_op)
                return t

            for key, got in run_both(ctx, fn).items():
                assert_same(got, expect, f"broadcast {dtype} root={root} {key}")


@case
def case_reduce(ctx):
    for dtype, op in ((torch.float32, "SUM"), (torch.float64, "MAX"), (torch.int64, "PRODUCT"),
                      (torch.float16, "MIN"), (torch.float32, "AVG"),
                      (torch.float32, "PREMUL_SUM"), (torch.int32, "BXOR")):
        for root in range(ctx.ws):
            n = 513
            expect = reference(op, [make_input(r, n, dtype, op) for r in range(ctx.ws)], 0.5)

            def fn(group, async_op):
                t = make_input(ctx.rank, n, dtype, op)
                finish(dist.reduce(t, dst=root, op=torch_op(op, 0.5), group=group,
                                   async_op=async_op), async_op)
                return t

            for key, got in run_both(ctx, fn, gloo=op in GLOO_OPS).items():
                if ctx.rank == root:
                    assert_same(got, expect, f"reduce {op} {dtype} root={root} {key}")


@case
def case_all_gather(ctx):
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool):
        for n in (1, 3000):
            expect = [make_input(r, n, dtype) for r in range(ctx.ws)]
            for layout in ("separate", "views"):
                def fn(group, async_op):
                    if layout == "views":
                        outs = list(torch.empty(ctx.ws, n, dtype=dtype).unbind(0))
                    else:
                        outs = [torch.empty(n, dtype=dtype) for _ in range(ctx.ws)]
                    w = dist.all_gather(outs, make_input(ctx.rank, n, dtype), group=group,
                                        async_op=async_op)
                    finish(w, async_op)
                    return outs

                for key, got in run_both(ctx, fn).items():
                    for r in range(ctx.ws):
                        assert_same(got[r], expect[r], f"all_gather {dtype} n={n} {layout} {key}")


@case
def case_all_gather_into_tensor(ctx):
    for dtype in (torch.float32, torch.float16, torch.int32):
        n = 777
        expect = torch.cat([make_input(r, n, dtype) for r in range(ctx.ws)])
        for shape in ((ctx.ws * n,), (ctx.ws, n)):
            def fn(group, async_op):
                out = torch.empty(shape, dtype=dtype)
                w = dist.all_gather_into_tensor(out, make_input(ctx.rank, n, dtype), group=group,
                                                async_op=async_op)
                v = finish(w, async_op)
                if v is not None:
                    assert v[0].data_ptr() == out.data_ptr()
                return out.reshape(-1)

            # (gloo insists on a 1-D output here)
            for key, got in run_both(ctx, fn, gloo=len(shape) == 1).items():
                assert_same(got, expect, f"all_gather_into_tensor {dtype} {shape} {key}")
        # the internal name torch (and older FSDP) still call
        out = torch.empty(ctx.ws * n, dtype=dtype)
        ctx.rc._allgather_base(out, make_input(ctx.rank, n, dtype)).wait()
        assert_same(out, expect, "_allgather_base")


@case
def case_reduce_scatter(ctx):
    for dtype, op in ((torch.float32, "SUM"), (torch.float32, "AVG"), (torch.float64, "MAX"),
                      (torch.int64, "SUM"), (torch.float16, "SUM"),
                      (torch.float32, "PREMUL_SUM"), (torch.bfloat16, "MIN")):
        n = 1234
        ins_all = [[make_input(r * 10 + c, n, dtype, op) for c in range(ctx.ws)]
                   for r in range(ctx.ws)]
        expect = reference(op, [ins_all[r][ctx.rank] for r in range(ctx.ws)], 0.5)

        def fn(group, async_op):
            out = torch.empty(n, dtype=dtype)
            ins = [t.clone() for t in ins_all[ctx.rank]]
            w = dist.reduce_scatter(out, ins, op=torch_op(op, 0.5), group=group,
                                    async_op=async_op)
            finish(w, async_op)
            for c in range(ctx.ws):  # inputs unchanged
                assert_same(ins[c], ins_all[ctx.rank][c], "reduce_scatter input")
            return out

        for key, got in run_both(ctx, fn, gloo=op in GLOO_OPS and dtype != torch.bfloat16
                                 ).items():
            assert_same(got, expect, f"reduce_scatter {op} {dtype} {key}")


@case
def case_reduce_scatter_tensor(ctx):
    for dtype, op in ((torch.float32, "SUM"), (torch.float32, "AVG"), (torch.int32, "MAX"),
                      (torch.bfloat16, "SUM"), (torch.float32, "PREMUL_SUM")):
        n = 2049
        full = [make_input(r, ctx.ws * n, dtype, op) for r in range(ctx.ws)]
        expect = reference(op, [f[ctx.rank * n:(ctx.rank + 1) * n] for f in full], 0.5)
        for shape in ((ctx.ws * n,), (ctx.ws, n)):
            def fn(group, async_op):
                out = torch.empty(n, dtype=dtype)
                inp = full[ctx.rank].clone().reshape(shape)
                w = dist.reduce_scatter_tensor(out, inp, op=torch_op(op, 0.5), group=group,
                                               async_op=async_op)
                finish(w, async_op)
                assert_same(inp.reshape(-1), full[ctx.rank], "reduce_scatter_tensor input")
                return out

            for key, got in run_both(ctx, fn, gloo=op in GLOO_OPS and len(shape) == 1).items():
                assert_same(got, expect, f"reduce_scatter_tensor {op} {dtype} {shape} {key}")
    out = torch.empty(5)
    ctx.rc._reduce_scatter_base(out, torch.ones(5 * ctx.ws)).wait()
    assert_same(out, torch.full((5,), float(ctx.ws)), "_reduce_scatter_base")


def a2a_reference(ctx, in_splits_of, rows_of, row):
    """What rank ctx.rank receives: from each src, the block src sent to ctx.rank."""
    parts = []
    for src in range(ctx.ws):
        data = torch.arange(rows_of(src) * row, dtype=torch.float32).reshape(-1, row) + 1000 * src
        splits = in_splits_of(src)
        start = sum(splits[:ctx.rank])
        parts.append(data[start:start + splits[ctx.rank]])
    return torch.cat(parts)


@case
def case_all_to_all_single(ctx):
    ws, row = ctx.ws, 3
    # equal split
    def equal(group, async_op):
        inp = torch.arange(ws * 4 * row, dtype=torch.float32).reshape(-1, row) + 1000 * ctx.rank
        out = torch.empty_like(inp)
        finish(dist.all_to_all_single(out, inp, group=group, async_op=async_op), async_op)
        return out

    expect = a2a_reference(ctx, lambda s: [4] * ws, lambda s: ws * 4, row)
    for key, got in run_both(ctx, equal).items():
        assert_same(got, expect, f"all_to_all_single equal {key}")

    # uneven splits, including empty blocks: src sends (src + dst) % 3 rows to dst
    def in_splits_of(src):
        return [(src + dst) % 3 for dst in range(ws)]

    def splits(group, async_op):
        ins = in_splits_of(ctx.rank)
        outs = [in_splits_of(src)[ctx.rank] for src in range(ws)]
        inp = torch.arange(sum(ins) * row, dtype=torch.float32).reshape(-1, row) + 1000 * ctx.rank
        out = torch.empty(sum(outs), row)
        w = dist.all_to_all_single(out, inp, output_split_sizes=outs, input_split_sizes=ins,
                                   group=group, async_op=async_op)
        finish(w, async_op)
        return out

    expect = a2a_reference(ctx, in_splits_of, lambda s: sum(in_splits_of(s)), row)
    for key, got in run_both(ctx, splits).items():
        assert_same(got, expect, f"all_to_all_single splits {key}")


@case
def case_all_to_all_list(ctx):
    ws = ctx.ws
    for even in (True, False):
        size = (lambda a, b: 4) if even else (lambda a, b: a + b + 1)

        def fn(group, async_op):
            ins = [torch.full((size(ctx.rank, dst),), float(10 * ctx.rank + dst))
                   for dst in range(ws)]
            outs = [torch.empty(size(src, ctx.rank)) for src in range(ws)]
            finish(dist.all_to_all(outs, ins, group=group, async_op=async_op), async_op)
            return outs

        # (gloo's all_to_all takes equal sizes only)
        for key, got in run_both(ctx, fn, gloo=even).items():
            for src in range(ws):
                assert_same(got[src], torch.full((size(src, ctx.rank),), float(10 * src + ctx.rank)),
                            f"all_to_all even={even} from {src} {key}")


@case
def case_gather(ctx):
    for root in range(ctx.ws):
        for dtype in (torch.float32, torch.int64):
            def fn(group, async_op):
                outs = ([torch.empty(100, dtype=dtype) for _ in range(ctx.ws)]
                        if ctx.rank == root else None)
                w = dist.gather(make_input(ctx.rank, 100, dtype), outs, dst=root, group=group,
                                async_op=async_op)
                finish(w, async_op)
                return outs

            for key, got in run_both(ctx, fn).items():
                if ctx.rank == root:
                    for r in range(ctx.ws):
                        assert_same(got[r], make_input(r, 100, dtype), f"gather {key}")


@case
def case_scatter(ctx):
    for root in range(ctx.ws):
        def fn(group, async_op):
            ins = ([make_input(10 + r, 300, torch.float32) for r in range(ctx.ws)]
                   if ctx.rank == root else None)
            out = torch.empty(300)
            finish(dist.scatter(out, ins, src=root, group=group, async_op=async_op), async_op)
            return out

        for key, got in run_both(ctx, fn).items():
            assert_same(got, make_input(10 + ctx.rank, 300, torch.float32), f"scatter {key}")


@case
def case_barrier(ctx):
    dist.barrier(group=ctx.rc)
    w = dist.barrier(group=ctx.rc, async_op=True)
    w.wait()
    assert w.is_completed()
    # a barrier really waits: rank 0 arrives late
    if ctx.rank == 0:
        time.sleep(0.6)
    t0 = time.perf_counter()
    dist.barrier(group=ctx.rc)
    if ctx.rank != 0:
        assert time.perf_counter() - t0 > 0.2, "barrier returned before rank 0 arrived"


@case
def case_send_recv(ctx):
    ws, r = ctx.ws, ctx.rank
    nxt, prv = (r + 1) % ws, (r - 1) % ws
    for n in (5, 300_000):
        # isend / irecv around the ring
        out = torch.empty(n)
        rw = dist.irecv(out, src=prv, group=ctx.rc)
        sw = dist.isend(torch.full((n,), float(r)), dst=nxt, group=ctx.rc)
        sw.wait()
        rw.wait()
        assert_same(out, torch.full((n,), float(prv)), f"irecv n={n}")
        # blocking send/recv, ordered so that it cannot deadlock
        out = torch.empty(n, dtype=torch.int64)
        if r % 2 == 0:
            dist.send(torch.full((n,), r, dtype=torch.int64), dst=nxt, group=ctx.rc)
            src = dist.recv(out, src=prv, group=ctx.rc)
        else:
            src = dist.recv(out, src=prv, group=ctx.rc)
            dist.send(torch.full((n,), r, dtype=torch.int64), dst=nxt, group=ctx.rc)
        assert src == prv, src
        assert_same(out, torch.full((n,), prv, dtype=torch.int64), f"recv n={n}")
    # receive into a non-contiguous tensor
    base = torch.zeros(6, 2)
    w1 = dist.irecv(base[:, 0], src=prv, group=ctx.rc)
    dist.isend(torch.arange(6, dtype=torch.float32), dst=nxt, group=ctx.rc).wait()
    w1.wait()
    assert_same(base[:, 0].contiguous(), torch.arange(6, dtype=torch.float32), "recv strided")
    assert_same(base[:, 1].contiguous(), torch.zeros(6), "recv strided untouched")


@case
def case_batch_isend_irecv(ctx):
    ws, r = ctx.ws, ctx.rank
    nxt, prv = (r + 1) % ws, (r - 1) % ws
    for n in (16, 250_000):
        from_prv, from_nxt = torch.empty(n), torch.empty(n)
        ops = [dist.P2POp(dist.isend, torch.full((n,), float(r)), nxt, group=ctx.rc),
               dist.P2POp(dist.isend, torch.full((n,), float(-r)), prv, group=ctx.rc),
               dist.P2POp(dist.irecv, from_prv, prv, group=ctx.rc),
               dist.P2POp(dist.irecv, from_nxt, nxt, group=ctx.rc)]
        # With 2 ranks next == prev: the peer's two messages match our two irecvs in issue order.
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        assert_same(from_prv, torch.full((n,), float(prv)), "batch ring from prev")
        assert_same(from_nxt, torch.full((n,), float(-nxt)), "batch ring from next")


@case
def case_object_collectives(ctx):
    r, ws = ctx.rank, ctx.ws
    big = "x" * (9 << 20) if r == 0 else ""  # > TCPStore's 8 MiB value limit: data never goes via the store
    objs = [None] * ws
    dist.all_gather_object(objs, {"rank": r, "big": len(big)}, group=ctx.rc)
    assert objs == [{"rank": i, "big": (9 << 20) if i == 0 else 0} for i in range(ws)], objs
    lst = [big, {"k": [1, 2, 3]}, None] if r == 0 else [None, None, None]
    dist.broadcast_object_list(lst, src=0, group=ctx.rc)
    assert len(lst[0]) == 9 << 20 and lst[1] == {"k": [1, 2, 3]} and lst[2] is None
    for root in range(ws):
        g = [None] * ws if r == root else None
        dist.gather_object(("r", r), g, dst=root, group=ctx.rc)
        if r == root:
            assert g == [("r", i) for i in range(ws)], g
        out = [None]
        dist.scatter_object_list(out, [f"to{i}" for i in range(ws)] if r == root else None,
                                 src=root, group=ctx.rc)
        assert out == [f"to{r}"], out


@case
def case_coalesced(ctx):
    ws, r = ctx.ws, ctx.rank
    ts = [torch.full((3,), float(r)), torch.full((5, 2), float(r + 1)), torch.full((1,), 2.0)]
    with dist._coalescing_manager(group=ctx.rc):
        for t in ts:
            dist.all_reduce(t, group=ctx.rc)
    s = sum(range(ws))
    assert_same(ts[0], torch.full((3,), float(s)), "coalesced all_reduce 0")
    assert_same(ts[1], torch.full((5, 2), float(s + ws)), "coalesced all_reduce 1")
    assert_same(ts[2], torch.full((1,), 2.0 * ws), "coalesced all_reduce 2")
    # async coalescing manager over all_gather_into_tensor and reduce_scatter_tensor
    outs = [torch.empty(ws * 4), torch.empty(ws * 2, dtype=torch.float64)]
    with dist._coalescing_manager(group=ctx.rc, async_ops=True) as cm:
        dist.all_gather_into_tensor(outs[0], torch.full((4,), float(r)), group=ctx.rc)
        dist.all_gather_into_tensor(outs[1], torch.full((2,), float(r), dtype=torch.float64),
                                    group=ctx.rc)
    cm.wait()
    assert_same(outs[0], torch.arange(ws).repeat_interleave(4).float(), "coalesced ag 0")
    assert_same(outs[1], torch.arange(ws).repeat_interleave(2).double(), "coalesced ag 1")
    rs_out = [torch.empty(3), torch.empty(2)]
    with dist._coalescing_manager(group=ctx.rc, async_ops=True) as cm:
        dist.reduce_scatter_tensor(rs_out[0], torch.ones(3 * ws), op=dist.ReduceOp.AVG,
                                   group=ctx.rc)
        dist.reduce_scatter_tensor(rs_out[1], torch.full((2 * ws,), float(r)),
                                   op=dist.ReduceOp.AVG, group=ctx.rc)
    cm.wait()  # (torch's coalescing manager applies the first op to all: no mixing)
    assert_same(rs_out[0], torch.ones(3), "coalesced rs AVG 0")
    assert_same(rs_out[1], torch.full((2,), sum(range(ws)) / ws), "coalesced rs AVG 1")
    # with a device, torch brackets the ops with the group's _start/_end_coalescing
    ts = [torch.full((4,), float(r)), torch.full((6,), 1.0)]
    with dist._coalescing_manager(group=ctx.rc, device=torch.device("cpu"),
                                  async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.rc)
    cm.wait()
    assert_same(ts[0], torch.full((4,), float(ws - 1)), "device coalescing 0")
    assert_same(ts[1], torch.ones(6), "device coalescing 1")
    # the deprecated entry points still reach the backend
    ts = [torch.ones(4), torch.ones(2, 3)]
    dist.all_reduce_coalesced(ts, group=ctx.rc)
    assert_same(ts[0], torch.full((4,), float(ws)), "all_reduce_coalesced 0")
    assert_same(ts[1], torch.full((2, 3), float(ws)), "all_reduce_coalesced 1")
    # torch's layout: outl[src][i] receives rank src's input i
    outl = [[torch.empty(2), torch.empty(3)] for _ in range(ws)]
    dist.all_gather_coalesced(outl, [torch.full((2,), float(r)), torch.full((3,), -float(r))],
                              group=ctx.rc)
    for src in range(ws):
        assert_same(outl[src][0], torch.full((2,), float(src)), "all_gather_coalesced 0")
        assert_same(outl[src][1], torch.full((3,), -float(src)), "all_gather_coalesced 1")


@case
def case_futures(ctx):
    ws = ctx.ws
    t = torch.ones(1000)
    fut = dist.all_reduce(t, group=ctx.rc, async_op=True).get_future()
    chained = fut.then(lambda f: f.value()[0] * 2)
    assert_same(chained.wait(), torch.full((1000,), 2.0 * ws), "then()")
    # a collective issued and waited on inside a future callback (what PowerSGD does) completes
    t2 = torch.ones(10)
    inner = fut.then(lambda f: dist.all_reduce(t2, group=ctx.rc, async_op=True)
                     .get_future().wait()[0])
    assert_same(inner.wait(), torch.full((10,), float(ws)), "collective inside callback")
    # many in flight at once, waited in reverse order
    ts = [torch.full((257,), float(i)) for i in range(20)]
    works = [dist.all_reduce(x, group=ctx.rc, async_op=True) for x in ts]
    for w in reversed(works):
        w.wait()
    for i, x in enumerate(ts):
        assert_same(x, torch.full((257,), float(i * ws)), f"in flight {i}")
    w = dist.all_reduce(torch.ones(3), group=ctx.rc, async_op=True)
    w.wait(timeout=datetime.timedelta(seconds=10))
    assert w.is_success() and w.result()[0].sum().item() == 3 * ws


@case
def case_subgroups(ctx):
    ws, r = ctx.ws, ctx.rank
    g_all = dist.new_group(list(range(ws)), backend="ringcomm")
    g_pair = dist.new_group([0, 1], backend="ringcomm")
    g_tail = dist.new_group([ws - 2, ws - 1], backend="ringcomm")
    # two (three) groups at once: interleave async operations on all of them
    works, tensors = [], []
    for i in range(10):
        a = torch.full((100,), float(r + i))
        works.append(dist.all_reduce(a, group=g_all, async_op=True))
        tensors.append(("all", i, a))
        if r in (0, 1):
            b = torch.full((50,), float(r * 2 + i))
            works.append(dist.all_reduce(b, group=g_pair, async_op=True))
            tensors.append(("pair", i, b))
        if r in (ws - 2, ws - 1):
            c = torch.full((70,), float(r + 100 * i))
            works.append(dist.all_reduce(c, group=g_tail, async_op=True))
            tensors.append(("tail", i, c))
    for w in works:
        w.wait()
    for kind, i, x in tensors:
        if kind == "all":
            exp = sum(q + i for q in range(ws))
        elif kind == "pair":
            exp = (0 * 2 + i) + (1 * 2 + i)
        else:
            exp = (ws - 2 + 100 * i) + (ws - 1 + 100 * i)
        assert_same(x, torch.full_like(x, float(exp)), f"group {kind} step {i}")
    if r in (0, 1):
        assert dist.get_rank(g_pair) == r and dist.get_world_size(g_pair) == 2
        t = torch.tensor([float(r)])
        dist.broadcast(t, src=1, group=g_pair)  # global rank 1 is the source
        assert t.item() == 1.0
    if r in (0, 1):
        assert g_all.group_name != g_pair.group_name
    for g in (g_pair, g_tail):
        if g is not dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)
    dist.destroy_process_group(g_all)


@case
def case_group_name_and_backend(ctx):
    pg = ctx.rc
    assert dist.get_backend(pg) == "ringcomm"
    if os.environ.get("RINGCOMM_TORCH_BACKEND", "auto").lower() == "group":
        assert pg.name() == "ringcomm"
        assert type(pg).__name__ == "RingcommProcessGroup"
    else:
        # per-device c10d Backend: torch's own ProcessGroup (which names every plugin's group
        # "custom") holds ringcomm's Backend for each device
        assert type(pg) is dist.ProcessGroup, type(pg)
        assert pg.name() == "custom", pg.name()
        for device in ("cpu", "cuda"):
            be = pg._get_backend(torch.device(device))
            assert be.name() == "ringcomm"
            assert type(be).__name__ == "RingcommBackend", type(be)
    assert pg.group_name, "group name not set"
    # functional collectives resolve the group by its name
    import torch.distributed._functional_collectives as funcol
    out = funcol.all_reduce(torch.ones(4), "sum", pg)
    assert_same(funcol.wait_tensor(out) if hasattr(funcol, "wait_tensor") else out,
                torch.full((4,), float(ctx.ws)), "functional all_reduce")


@case
def case_issue_hook(ctx):
    import ringcomm.torch as rct
    seen = []
    hook = lambda op, name, seq, t: seen.append((op, name, seq))  # noqa: E731
    rct.add_issue_hook(hook)
    try:
        dist.all_reduce(torch.ones(2), group=ctx.rc)
        dist.broadcast(torch.ones(2), src=0, group=ctx.rc)
    finally:
        rct.remove_issue_hook(hook)
    assert [s[0] for s in seen] == ["allreduce", "broadcast"], seen
    assert seen[1][2] == seen[0][2] + 1


@case
def case_bad_input(ctx):
    import ringcomm
    rc = ctx.rc

    def expect_error(fn, exc, words, what):
        try:
            fn()
        except exc as e:
            msg = str(e)
            for w in words:
                assert w in msg, f"{what}: message {msg!r} lacks {w!r}"
            return
        except BaseException as e:  # noqa: BLE001
            raise AssertionError(f"{what}: raised {type(e).__name__}: {e}") from e
        raise AssertionError(f"{what}: no exception")

    # tensors not on the CPU (a CPU-only build has no CUDA tensors; "meta" stands in). With the
    # per-device c10d Backend torch dispatches by device and runs its own meta kernels, so a
    # meta tensor never reaches a backend: ringcomm's checks are called on the Backend directly.
    if os.environ.get("RINGCOMM_TORCH_BACKEND", "auto").lower() == "group":
        meta_all_reduce = lambda: dist.all_reduce(torch.empty(4, device="meta"), group=rc)  # noqa: E731
        mixed_all_gather = lambda: dist.all_gather_into_tensor(  # noqa: E731
            torch.empty(4 * ctx.ws, device="meta"), torch.ones(4), group=rc)
    else:
        be = rc._get_backend(torch.device("cpu"))
        meta_all_reduce = lambda: be.allreduce([torch.empty(4, device="meta")],  # noqa: E731
                                               dist.distributed_c10d.AllreduceOptions())
        mixed_all_gather = lambda: be._allgather_base(  # noqa: E731
            torch.empty(4 * ctx.ws, device="meta"), torch.ones(4), dist.distributed_c10d.AllgatherOptions())
    expect_error(meta_all_reduce, RuntimeError, ["ringcomm does not support", "meta"],
                 "meta tensor")
    # tensors on different devices
    expect_error(mixed_all_gather, RuntimeError, ["one device"], "mixed devices")
    # unsupported dtype
    expect_error(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16), group=rc),
                 RuntimeError, ["ringcomm does not support", "int16"], "int16")
    expect_error(lambda: dist.broadcast(torch.empty(4, dtype=torch.float8_e4m3fn), src=0,
                                        group=rc),
                 RuntimeError, ["ringcomm does not support", "float8"], "float8")
    # unsupported op for the dtype (bitwise on floating point): raised on every rank
    expect_error(lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND, group=rc),
                 RuntimeError, [], "BAND on float32")
    expect_error(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int64),
                                         op=dist._make_nccl_premul_sum(0.5), group=rc),
                 RuntimeError, ["ringcomm does not support", "PREMUL_SUM"], "PREMUL_SUM int")
    # unsupported operations
    # wrong sizes
    expect_error(lambda: dist.all_gather_into_tensor(torch.empty(3), torch.ones(2), group=rc),
                 ValueError, ["all_gather_into_tensor"], "all_gather size")
    expect_error(lambda: dist.all_to_all_single(torch.empty(4), torch.empty(4), [1] * ctx.ws,
                                                [9] * ctx.ws, group=rc),
                 ValueError, ["split sizes"], "bad splits")
    # the group still works after all that
    t = torch.ones(3)
    dist.all_reduce(t, group=rc)
    assert_same(t, torch.full((3,), float(ctx.ws)), "after bad input")
    assert isinstance(ringcomm.UnsupportedError("x"), RuntimeError)


@case
def case_mismatched_collectives(ctx):
    """Different collectives / sizes on different ranks: an exception on every rank, no hang."""
    import ringcomm
    g = dist.new_group(backend="ringcomm", timeout=datetime.timedelta(seconds=10))
    t0 = time.perf_counter()
    errors = []
    for attempt in ("size", "kind"):
        try:
            if attempt == "size":
                dist.all_reduce(torch.ones(4 + ctx.rank), group=g)
            elif ctx.rank == 0:
                dist.broadcast(torch.ones(4), src=0, group=g)
            else:
                dist.all_reduce(torch.ones(4), group=g)
            errors.append(None)
        except RuntimeError as e:
            errors.append(e)
        if errors[-1] is not None:
            break  # a failed communicator may stay failed; one detected mismatch is the point
    dist.destroy_process_group(g)
    assert errors[0] is not None or (len(errors) > 1 and errors[1] is not None), \
        "mismatched collectives raised nothing"
    assert isinstance([e for e in errors if e][0], ringcomm.RingcommError)
    assert time.perf_counter() - t0 < 25, "mismatch took the whole timeout to surface"


# ---- the spawned battery ------------------------------------------------------------------------
INIT_CASES = ["threads_joined", "init_tcp", "init_store", "reinit_same_store"]


def _ringcomm_threads() -> list:
    import threading
    return [t.name for t in threading.enumerate() if t.name.startswith("ringcomm-")]


def _check_world(ws):
    t = torch.full((5,), float(dist.get_rank()))
    dist.all_reduce(t)
    assert_same(t, torch.full((5,), float(sum(range(ws)))), "world all_reduce")
    g = dist.new_group(backend="ringcomm")
    t = torch.ones(2)
    dist.all_reduce(t, group=g)
    assert_same(t, torch.full((2,), float(ws)), "subgroup after re-init")


def _battery(rank, ws, file_path, tcp_port, store_port):
    import ringcomm.torch  # noqa: F401 - registers the backend
    torch.set_num_threads(1)  # ranks outnumber cores: intra-op thread pools would only fight
    ctx = init_world(rank, ws, file_path, CASE_TIMEOUT_S)
    timeout = ctx.timeout
    assert dist.get_backend() == "ringcomm"
    results = {name: (err, seconds)
               for name, (err, _, seconds) in run_cases(ctx, CASES).items()}
    threads_before = _ringcomm_threads()
    dist.destroy_process_group()
    left = _ringcomm_threads()
    results["threads_joined"] = (
        None if threads_before and not left else
        f"rank {rank}: ringcomm threads before destroy {threads_before}, after {left}", 0.0)

    def attempt(name, fn):
        t0 = time.perf_counter()
        try:
            fn()
            results[name] = (None, time.perf_counter() - t0)
        except BaseException:  # noqa: BLE001
            results[name] = (f"rank {rank}:\n{traceback.format_exc()}", 0.0)
            if dist.is_initialized():
                dist.destroy_process_group()

    def tcp():
        dist.init_process_group("ringcomm", init_method=f"tcp://127.0.0.1:{tcp_port}",
                                rank=rank, world_size=ws, timeout=timeout)
        _check_world(ws)
        dist.destroy_process_group()

    store = dist.TCPStore("127.0.0.1", store_port, ws, is_master=rank == 0, timeout=timeout)

    def with_store():
        dist.init_process_group("ringcomm", store=store, rank=rank, world_size=ws,
                                timeout=timeout)
        _check_world(ws)
        dist.destroy_process_group()

    attempt("init_tcp", tcp)
    attempt("init_store", with_store)
    attempt("reinit_same_store", with_store)  # group names restart: incarnation keys differ
    del store
    return results


def _shm_entries() -> set:
    try:
        return {e for e in os.listdir("/dev/shm") if "ringcomm" in e.lower() or e.startswith("rc")}
    except OSError:
        return set()


_results: dict = {}
# RINGCOMM_TEST_CASES=all_reduce,barrier runs only those cases in the battery (debugging aid).


def battery_results(ws: int) -> dict:
    if ws not in _results:
        before = _shm_entries()
        per_rank, failure = spawn_battery(_battery, ws, "ringcomm-torch-test-", BATTERY_TIMEOUT_S,
                                          args=(free_port(), free_port()))
        leaked = _shm_entries() - before
        # Another test run on the machine may have a segment in flight (unlinked within
        # milliseconds of creation): only one that stays is a leak.
        deadline = time.monotonic() + 3.0
        while leaked and time.monotonic() < deadline:
            time.sleep(0.05)
            leaked &= _shm_entries()
        if per_rank is None:
            _results[ws] = {"__launch__": failure}
        else:
            merged = {}
            for name in list(CASES) + INIT_CASES:
                errs = [res[name][0] for res in per_rank if res.get(name, (None,))[0]]
                merged[name] = "\n".join(errs) if errs else None
            merged["__timings__"] = {name: max(res[name][1] for res in per_rank)
                                     for name in per_rank[0]}
            merged["__shm_leak__"] = sorted(leaked)
            _results[ws] = merged
    return _results[ws]


@pytest.mark.timeout(BATTERY_TIMEOUT_S + 60)
@pytest.mark.parametrize("name", list(CASES) + INIT_CASES)
@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_backend(ws, name):
    fail_on_error(battery_results(ws), ws, name)


@pytest.mark.timeout(BATTERY_TIMEOUT_S + 60)
@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_no_shm_left_behind(ws):
    res = battery_results(ws)
    if "__launch__" in res:
        pytest.fail(res["__launch__"])
    assert res["__shm_leak__"] == [], f"/dev/shm entries left behind: {res['__shm_leak__']}"


@pytest.mark.timeout(60)
def test_import_registers_without_loading_core():
    """`import ringcomm` does not import torch; `import ringcomm.torch` registers the backend
    without creating anything."""
    import subprocess
    import sys
    code = ("import sys, ringcomm; assert 'torch' not in sys.modules, 'ringcomm imported torch'\n"
            "import ringcomm.torch, torch.distributed as dist\n"
            "assert 'ringcomm' in dist.Backend.backend_list\n"
            "assert dist.Backend.backend_capability['ringcomm'] == ['cpu', 'cuda']\n"
            "assert 'ringcomm.torch.backend' not in sys.modules\n"
            "assert dist.is_backend_available('ringcomm')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert r.returncode == 0, r.stderr


@pytest.mark.timeout(60)
def test_torch_backends_entry_point(tmp_path):
    """With the package's ``torch.backends`` entry point installed, ``import torch`` alone
    registers "ringcomm". The entry point is simulated with a dist-info on PYTHONPATH."""
    import subprocess
    import sys
    info = tmp_path / "ringcomm_entry_point_probe-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ringcomm-entry-point-probe\n"
                                   "Version: 0.0\n")
    (info / "entry_points.txt").write_text(
        "[torch.backends]\nringcomm = ringcomm.torch._register:autoload\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path)] + [p for p in sys.path if p])
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    code = ("import sys, torch, torch.distributed as dist\n"
            "assert 'ringcomm' in dist.Backend.backend_list, dist.Backend.backend_list\n"
            "assert 'ringcomm.torch.backend' not in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50,
                       env=env)
    assert r.returncode == 0, r.stderr
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    code = "import torch.distributed as dist; assert 'ringcomm' not in dist.Backend.backend_list"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50,
                       env=env)
    assert r.returncode == 0, r.stderr


EXIT_SCRIPT = r"""
import sys, tempfile, torch, torch.distributed as dist
import ringcomm.torch
d = tempfile.mkdtemp()
dist.init_process_group("ringcomm", init_method=f"file://{d}/store", rank=0, world_size=1)
t = torch.ones(8)
dist.all_reduce(t)                                   # world size 1: every op is local
assert torch.equal(t, torch.ones(8))
out = [torch.empty(8)]
dist.all_gather(out, t)
g = dist.new_group([0], backend="ringcomm")
futs = [dist.all_reduce(torch.ones(100), group=g, async_op=True).get_future().then(
        lambda f: f.value()[0].sum()) for _ in range(10)]
w = dist.all_reduce(torch.ones(4), async_op=True)   # never waited on
assert all(f.wait().item() == 100 for f in futs)
print("ok", flush=True)
# exits with the groups (and their threads) still alive: the backend shuts them down at exit
"""


@pytest.mark.timeout(60)
def test_exit_without_destroy():
    """A process that never calls destroy_process_group still exits cleanly (threads joined at
    interpreter exit: no SIGABRT) and leaves no shared memory behind."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True,
                       timeout=50)
    assert r.returncode == 0 and "ok" in r.stdout, (r.returncode, r.stdout, r.stderr[-3000:])
    assert "terminate called" not in r.stderr, r.stderr[-3000:]
