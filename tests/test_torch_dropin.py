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

from torch_battery import battery_test, registry  # noqa: E402

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
LATE_S = 1.6


@case
def case_barrier_timeout(ctx):
    import ringcomm
    late = ctx.ws - 1
    # everyone on time: a timeout changes nothing
    dist.barrier(group=ctx.rc, timeout=datetime.timedelta(seconds=10))
    dist.barrier(group=ctx.rc, async_op=True, timeout=datetime.timedelta(seconds=10)).wait()
    # the last rank arrives LATE_S late, past the bound the others' 0.5 s timeout is held to
    if ctx.rank == late:
        time.sleep(LATE_S)
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
            raise AssertionError(f"barrier(timeout=0.5 s) returned although a rank was {LATE_S} s late")
    # the same through an async work
    if ctx.rank == late:
        time.sleep(LATE_S)
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


# ---- no deprecation warning whose origin is ringcomm's code --------------------------------------
def _ringcomm_dir() -> str:
    import ringcomm
    return os.path.dirname(os.path.abspath(ringcomm.__file__)) + os.sep


class RingcommDeprecations:
    """Inside: a deprecation warning attributed to a ringcomm module (the warning's own location)
    raises at once (``simplefilter("error")`` filtered by module), and every other one is recorded
    with the Python stack at the point it was issued; ``found`` lists those issued while one of
    ringcomm's files was on that stack, i.e. from a call ringcomm's code made (torch's
    ``@deprecated`` wrappers attribute the warning to their own file, so the location alone
    cannot tell whose call it was)."""

    def __enter__(self):
        import traceback
        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        root = _ringcomm_dir()
        tests = os.path.dirname(os.path.abspath(__file__)) + os.sep
        self.found = []
        warnings.simplefilter("always")
        for category in _DEPRECATIONS:
            warnings.filterwarnings("error", category=category, module=r"ringcomm(\.|$)")
        previous = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, _DEPRECATIONS):
                # the innermost frame of this project's code (ringcomm's or the tests') on the
                # stack made the call that warned; ringcomm's launcher sits at the bottom of
                # every spawned rank's stack, so "any ringcomm frame" would not do
                stack = [os.path.abspath(f.filename) for f in traceback.extract_stack()[:-1]]
                ours = [f for f in stack if f.startswith((root, tests))]
                caller = ours[-1] if ours else ""
                if caller.startswith(root) or os.path.abspath(filename).startswith(root):
                    self.found.append(f"{category.__name__} {filename}:{lineno}: {message} "
                                      f"[called from {caller}]")
                    return
            if not issubclass(category, _DEPRECATIONS):
                previous(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        return self

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


def _control_checks() -> None:
    """The detector itself: a deprecation warning from code whose file is one of ringcomm's is
    caught both ways (raised when its module is ringcomm's, recorded when only its file is)."""
    path = os.path.join(_ringcomm_dir(), "torch", "backend.py")
    code = compile("import warnings\nwarnings.warn('old name', DeprecationWarning)\n", path, "exec")
    with RingcommDeprecations() as probe:
        try:
            exec(code, {"__name__": "ringcomm.torch.backend"})
        except DeprecationWarning:
            pass
        else:
            raise AssertionError("a DeprecationWarning from a ringcomm module did not raise")
        exec(code, {"__name__": "elsewhere"})
        warnings.warn("not ringcomm's", FutureWarning)     # from the test's own file
    assert len(probe.found) == 1 and "old name" in probe.found[0], probe.found


@case
def case_no_deprecation_from_ringcomm(ctx):
    """Every kind of call torch makes into ringcomm, and the training wrappers of ringcomm's own
    that call torch.distributed (BucketedDDP, ZeRO 1/2 and 3), with deprecation warnings from
    ringcomm's files turned into errors; every result checked against a local value."""
    import ringcomm.torch as rct
    from ringcomm.training.ddp import BucketedDDP
    from ringcomm.training.zero import ZeroOptimizer, ZeroStage3
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    _control_checks()
    ws, r, g = ctx.ws, ctx.rank, ctx.rc
    total = float(ws * (ws + 1) // 2)
    with RingcommDeprecations() as probe:
        for async_op in (False, True):
            for dtype in (torch.float32, torch.int64, torch.bfloat16):
                t = torch.full((1000,), r + 1, dtype=dtype)
                wait(dist.all_reduce(t, group=g, async_op=async_op), async_op)
                assert_equal(t, torch.full((1000,), total, dtype=dtype), f"all_reduce {dtype}")
            t = torch.full((5,), float(r))
            wait(dist.all_reduce(t, op=dist.ReduceOp.AVG, group=g, async_op=async_op), async_op)
            assert_equal(t, torch.full((5,), (total - ws) / ws), "all_reduce AVG")
            t = torch.full((3,), float(r))
            wait(dist.broadcast(t, src=ws - 1, group=g, async_op=async_op), async_op)
            assert_equal(t, torch.full((3,), float(ws - 1)), "broadcast")
            t = torch.full((3,), float(r + 1))
            wait(dist.reduce(t, dst=0, group=g, async_op=async_op), async_op)
            if r == 0:
                assert_equal(t, torch.full((3,), total), "reduce")
            outs = [torch.empty(2) for _ in range(ws)]
            wait(dist.all_gather(outs, torch.full((2,), float(r)), group=g, async_op=async_op),
                 async_op)
            assert_equal(torch.stack(outs), torch.arange(ws, dtype=torch.float32)[:, None]
                         .expand(ws, 2), "all_gather")
            flat = torch.empty(2 * ws)
            wait(dist.all_gather_into_tensor(flat, torch.full((2,), float(r)), group=g,
                                             async_op=async_op), async_op)
            assert_equal(flat, torch.arange(ws, dtype=torch.float32).repeat_interleave(2),
                         "all_gather_into_tensor")
            rs = torch.empty(2)
            wait(dist.reduce_scatter(rs, [torch.full((2,), float(q + r)) for q in range(ws)],
                                     group=g, async_op=async_op), async_op)
            assert_equal(rs, torch.full((2,), float(ws * r) + total - ws), "reduce_scatter")
            wait(dist.reduce_scatter_tensor(rs, torch.ones(2 * ws), group=g, async_op=async_op),
                 async_op)
            assert_equal(rs, torch.full((2,), float(ws)), "reduce_scatter_tensor")
            a2a = torch.empty(ws)
            wait(dist.all_to_all_single(a2a, torch.full((ws,), float(r)), group=g,
                                        async_op=async_op), async_op)
            assert_equal(a2a, torch.arange(ws, dtype=torch.float32), "all_to_all_single")
            outs = [torch.empty(1) for _ in range(ws)]
            wait(dist.all_to_all(outs, [torch.full((1,), float(10 * r + q)) for q in range(ws)],
                                 group=g, async_op=async_op), async_op)
            assert_equal(torch.cat(outs), torch.tensor([10.0 * q + r for q in range(ws)]),
                         "all_to_all")
            gl = [torch.empty(1) for _ in range(ws)] if r == 0 else None
            wait(dist.gather(torch.full((1,), float(r)), gl, dst=0, group=g, async_op=async_op),
                 async_op)
            if r == 0:
                assert_equal(torch.cat(gl), torch.arange(ws, dtype=torch.float32), "gather")
            sc = torch.empty(1)
            wait(dist.scatter(sc, [torch.full((1,), float(q)) for q in range(ws)] if r == 0
                              else None, src=0, group=g, async_op=async_op), async_op)
            assert_equal(sc, torch.full((1,), float(r)), "scatter")
            wait(dist.barrier(group=g, async_op=async_op), async_op)
        # torch 2.13's preferred single-tensor spellings
        out = torch.empty(ws * 3)
        dist.all_gather_single(out, torch.full((3,), float(r)), group=g)
        assert_equal(out, torch.arange(ws, dtype=torch.float32).repeat_interleave(3),
                     "all_gather_single")
        rs = torch.empty(2)
        dist.reduce_scatter_single(rs, torch.ones(2 * ws), group=g)
        assert_equal(rs, torch.full((2,), float(ws)), "reduce_scatter_single")
        # point-to-point, tags and any source
        nxt, prv = (r + 1) % ws, (r - 1) % ws
        got = torch.empty(4)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((4,), float(r)), nxt,
                                                  group=g, tag=2),
                                       dist.P2POp(dist.irecv, got, prv, group=g, tag=2)])
        for w in reqs:
            w.wait()
        assert_equal(got, torch.full((4,), float(prv)), "batch_isend_irecv")
        if r == 0:
            srcs = sorted(dist.recv(torch.empty(1), group=g, tag=4) for _ in range(ws - 1))
            assert srcs == list(range(1, ws)), srcs
        else:
            dist.send(torch.full((1,), float(r)), dst=0, group=g, tag=4)
        # sparse all-reduce, object collectives, monitored barrier, a sub-group
        sp = torch.sparse_coo_tensor(torch.tensor([[r]]), torch.tensor([1.0]), [ws])
        dist.all_reduce(sp, group=g)
        assert_equal(sp.to_dense(), torch.ones(ws), "sparse all_reduce")
        objs = [None] * ws
        dist.all_gather_object(objs, ("r", r), group=g)
        assert objs == [("r", q) for q in range(ws)], objs
        lst = [r]
        dist.broadcast_object_list(lst, src=0, group=g)
        assert lst == [0], lst
        rct.monitored_barrier(g, timeout=20)
        sub = dist.new_group([0, 1], backend="ringcomm")
        if r < 2:
            t = torch.full((2,), float(r + 1))
            dist.all_reduce(t, group=sub)
            assert_equal(t, torch.full((2,), 3.0), "sub-group all_reduce")
        dist.destroy_process_group(sub)
        # torch's DDP and FSDP2, DTensor, and ringcomm's own wrappers, one step each
        x = torch.full((3, 4), float(r))
        torch.manual_seed(0)
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2), process_group=g)
        ddp(x).sum().backward()
        mesh = init_device_mesh("cpu", (ws,))
        torch.manual_seed(0)
        fs = torch.nn.Linear(4, 2)
        fully_shard(fs, mesh=mesh)
        fs(x).sum().backward()
        dt = distribute_tensor(torch.arange(2.0 * ws), mesh, [Shard(0)])
        assert_equal(dt.redistribute(mesh, [Replicate()]).to_local(), torch.arange(2.0 * ws),
                     "DTensor redistribute")
        torch.manual_seed(0)
        bd = BucketedDDP(torch.nn.Linear(4, 2), process_group=g)
        bd(x).sum().backward()
        bd.finish_gradient_synchronization()
        for stage in (1, 2):
            torch.manual_seed(0)
            m = torch.nn.Linear(4, 2)
            zo = ZeroOptimizer(m.parameters(), torch.optim.SGD, stage=stage, process_group=g,
                               lr=0.1)
            m(x).sum().backward()
            zo.step()
        torch.manual_seed(0)
        z3 = ZeroStage3(torch.nn.Linear(4, 2), torch.optim.SGD, process_group=g, lr=0.1)
        z3(x).sum().backward()
        z3.step()
    assert not probe.found, "deprecation warnings from ringcomm's code:\n" + "\n".join(probe.found)
    # the gradients of one step: the mean over ranks of each rank's (equal by construction)
    # gradient, the same in torch's DDP, FSDP2 and ringcomm's BucketedDDP
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 2)
    sum(ref(torch.full((3, 4), float(q))).sum() for q in range(ws)).backward()
    for name, params in (("DDP", list(ddp.parameters())),
                         ("BucketedDDP", list(bd.module.parameters()))):
        for p, q in zip(params, ref.parameters()):
            assert torch.allclose(p.grad, q.grad / ws, atol=1e-6), (name, p.grad, q.grad / ws)
    for p, q in zip(fs.parameters(), ref.parameters()):
        assert torch.allclose(p.grad.full_tensor(), q.grad / ws, atol=1e-6), ("FSDP2", p.grad)


# ---- the spawned battery ----------------------------------------------------------------------
test_dropin = battery_test(__name__, CASES, WORLD_SIZES, "ringcomm-dropin-test-", BATTERY_TIMEOUT_S,
                           GROUP_TIMEOUT_S)
