"""The inputs, single-process references and collective cases of the torch backend's battery
(tests/test_torch_backend.py, which adds the point-to-point, object, coalesced, future, group and
error cases to the same ``CASES`` and runs them all): every collective, sync and async, on
ringcomm, on gloo where gloo supports it, and against the result computed locally from every
rank's (deterministic) input. Module-level, so that the spawned ranks import it."""
from __future__ import annotations

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import mp_cases  # noqa: E402
from mp_cases import to_np  # noqa: E402
from torch_battery import registry  # noqa: E402

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
