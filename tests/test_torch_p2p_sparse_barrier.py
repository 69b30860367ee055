"""torch.distributed on ringcomm beyond the plain collectives: tagged point-to-point messages
received in another order than they were sent, receives from any source, sparse COO all-reduce
and ringcomm.torch.monitored_barrier; checked against gloo and locally computed results.

One spawned group of ranks per world size runs every case (``torch_battery``); each case runs the
same calls on the ringcomm group and on a gloo group over the same ranks and checks both.
"""
from __future__ import annotations

import datetime
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from torch_battery import battery_test, registry  # noqa: E402

WORLD_SIZES = [2, 3]
CASE_TIMEOUT_S = 30
BATTERY_TIMEOUT_S = 200

CASES, case = registry()

# Tags in the order they are sent; each receiver posts them in another order. Sizes differ per tag
# (one spans many shared-memory slots), so a message matched to the wrong receive fails its size
# or its payload check.
TAGS = [3, 11, 7, 0]
SIZES = {3: 5, 11: 250_000, 7: 1, 0: 17}


def payload(src: int, dst: int, tag: int) -> "torch.Tensor":
    n = SIZES[tag]
    return torch.arange(n, dtype=torch.float64) + (src * 1000 + dst * 100 + tag)


def check(got: "torch.Tensor", src: int, dst: int, tag: int, what: str) -> None:
    want = payload(src, dst, tag)
    if not torch.equal(got, want):
        raise AssertionError(f"{what}: message from {src} to {dst} with tag {tag} holds "
                             f"{got[:4].tolist()}..., expected {want[:4].tolist()}...")


def peers(ctx):
    return [p for p in range(ctx.ws) if p != ctx.rank]


def wait_works(works) -> None:
    for w in works:
        w.wait()


@case
def case_tags_isend_irecv_reordered(ctx):
    r = ctx.rank
    for name, g in (("ringcomm", ctx.rc), ("gloo", ctx.gloo)):
        recv_order = list(reversed(TAGS))
        bufs = {(p, t): torch.empty(SIZES[t], dtype=torch.float64) for p in peers(ctx) for t in TAGS}
        rw = [(p, t, dist.irecv(bufs[p, t], src=p, group=g, tag=t))
              for p in peers(ctx) for t in recv_order]
        sw = [dist.isend(payload(r, p, t), dst=p, group=g, tag=t) for p in peers(ctx) for t in TAGS]
        wait_works(sw)
        for p, t, w in rw:
            w.wait()
            check(bufs[p, t], p, r, t, f"{name} irecv")


@case
def case_tags_blocking_recv_reordered(ctx):
    r = ctx.rank
    for name, g in (("ringcomm", ctx.rc), ("gloo", ctx.gloo)):
        sw = [dist.isend(payload(r, p, t), dst=p, group=g, tag=t) for p in peers(ctx) for t in TAGS]
        # every rank sends before it receives: a blocking recv of the last-sent tag first makes
        # the earlier messages of that peer wait (buffered) for their own receives
        for p in peers(ctx):
            for t in (7, 0, 11, 3):
                got = torch.empty(SIZES[t], dtype=torch.float64)
                src = dist.recv(got, src=p, group=g, tag=t)
                assert src == p, (name, src, p)
                check(got, p, r, t, f"{name} recv")
        wait_works(sw)


@case
def case_tags_batch_isend_irecv(ctx):
    r = ctx.rank
    for name, g in (("ringcomm", ctx.rc), ("gloo", ctx.gloo)):
        bufs = {(p, t): torch.empty(SIZES[t], dtype=torch.float64) for p in peers(ctx) for t in TAGS}
        ops = [dist.P2POp(dist.irecv, bufs[p, t], p, group=g, tag=t)
               for p in peers(ctx) for t in (11, 0, 3, 7)]
        ops += [dist.P2POp(dist.isend, payload(r, p, t), p, group=g, tag=t)
                for p in peers(ctx) for t in TAGS]
        wait_works(dist.batch_isend_irecv(ops))
        for (p, t), b in bufs.items():
            check(b, p, r, t, f"{name} batch_isend_irecv")


@case
def case_tags_same_tag_in_order(ctx):
    # several messages with one tag from one peer arrive in the order they were sent, even when
    # another tag's messages are interleaved and received first
    r = ctx.rank
    for name, g in (("ringcomm", ctx.rc), ("gloo", ctx.gloo)):
        sw = []
        for p in peers(ctx):
            for i in range(3):
                sw.append(dist.isend(torch.full((4,), float(i + 10 * r)), dst=p, group=g, tag=5))
                sw.append(dist.isend(torch.full((4,), float(-i - 10 * r)), dst=p, group=g, tag=9))
        for p in peers(ctx):
            for tag, sign in ((9, -1.0), (5, 1.0)):
                for i in range(3):
                    got = torch.empty(4)
                    dist.recv(got, src=p, group=g, tag=tag)
                    want = torch.full((4,), sign * (i + 10 * p))
                    assert torch.equal(got, want), (name, p, tag, i, got.tolist(), want.tolist())
        wait_works(sw)


@case
def case_recv_any_source(ctx):
    # every rank but 0 sends to 0 (two tags); rank 0 receives from any source, tag 8 first:
    # dist.recv returns each sender once, and each buffer holds that sender's message
    r = ctx.rank
    for name, g in (("ringcomm", ctx.rc), ("gloo", ctx.gloo)):
        if r == 0:
            srcs = []
            for tag in (8, 3):
                for _ in range(ctx.ws - 1):
                    got = torch.empty(SIZES[tag] if tag in SIZES else 9, dtype=torch.float64)
                    src = dist.recv(got, group=g, tag=tag)
                    check_any(got, src, tag, name)
                    srcs.append((tag, src))
            assert sorted(srcs) == sorted((t, p) for t in (8, 3) for p in range(1, ctx.ws)), \
                (name, srcs)
            dist.barrier(group=g)
            # async: irecv without src; the work's source after wait (rank 1 sends after the
            # barrier)
            got = torch.empty(9, dtype=torch.float64)
            w = dist.irecv(got, group=g, tag=8)
            w.wait()
            assert w._source_rank() == 1, (name, w._source_rank())
            check_any(got, 1, 8, name)
        else:
            ws = [dist.isend(any_payload(r, 3), dst=0, group=g, tag=3),
                  dist.isend(any_payload(r, 8), dst=0, group=g, tag=8)]
            wait_works(ws)
            dist.barrier(group=g)
            if r == 1:
                dist.send(any_payload(r, 8), dst=0, group=g, tag=8)


def any_payload(src: int, tag: int) -> "torch.Tensor":
    n = SIZES.get(tag, 9)
    return torch.arange(n, dtype=torch.float64) * (src + 1) + tag


def check_any(got, src, tag, name):
    if not torch.equal(got, any_payload(src, tag)):
        raise AssertionError(f"{name}: recv(src=None, tag={tag}) returned {src} but holds "
                             f"{got[:4].tolist()}...")


def sparse_input(rank: int, ws: int, sparse_dims: int, dense_dims: int, dtype):
    """torch's simple_sparse_reduce_tests shape: rows 0..rank set (overlapping between ranks),
    plus a duplicate index on odd ranks (an uncoalesced input)."""
    idx = torch.arange(rank + 1).reshape(1, rank + 1)
    shape = [ws] + [ws] * (sparse_dims - 1) + [2] * dense_dims
    for _ in range(sparse_dims - 1):
        idx = torch.cat((idx, torch.zeros(1, rank + 1, dtype=torch.int64)))
    vals = (torch.arange(rank + 1).reshape([rank + 1] + [1] * dense_dims)
            + torch.ones([rank + 1] + [2] * dense_dims) * (rank + 1)).to(dtype)
    if rank % 2 == 1:
        idx = torch.cat((idx, idx[:, :1]), dim=1)
        vals = torch.cat((vals, vals[:1]))
    return torch.sparse_coo_tensor(idx, vals, shape)


@case
def case_sparse_all_reduce(ctx):
    r, ws = ctx.rank, ctx.ws
    for sd, dd, dtype in ((1, 0, torch.float32), (2, 0, torch.float64), (3, 0, torch.float32),
                          (1, 1, torch.float32), (1, 2, torch.int64), (2, 3, torch.float32)):
        want = sparse_input(0, ws, sd, dd, dtype)
        for p in range(1, ws):
            want = want + sparse_input(p, ws, sd, dd, dtype)
        want = want.coalesce()
        results = {}
        for name, g, async_op in (("ringcomm", ctx.rc, False), ("ringcomm", ctx.rc, True),
                                  ("gloo", ctx.gloo, False)):
            t = sparse_input(r, ws, sd, dd, dtype)
            w = dist.all_reduce(t, dist.ReduceOp.SUM, group=g, async_op=async_op)
            if async_op:
                w.wait()
            results[name, async_op] = t
            got = t.coalesce()
            if not (torch.equal(got.indices(), want.indices())
                    and torch.equal(got.values(), want.values())):
                raise AssertionError(f"{name} sparse all_reduce sd={sd} dd={dd} {dtype}: "
                                     f"{got} vs {want}")
        g_, rc_ = results["gloo", False].coalesce(), results["ringcomm", False].coalesce()
        assert torch.equal(g_.to_dense(), rc_.to_dense()), (sd, dd, "ringcomm != gloo")
    # a rank with nothing set (nnz 0)
    t = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.int64), torch.zeros(0), [ws]) \
        if r == 0 else torch.sparse_coo_tensor(torch.tensor([[r]]), torch.tensor([float(r)]), [ws])
    dist.all_reduce(t, group=ctx.rc)
    assert torch.equal(t.to_dense(), torch.arange(ws, dtype=torch.float32)), t.to_dense()
    # MAX is refused on every rank
    try:
        dist.all_reduce(sparse_input(r, ws, 1, 0, torch.float32), dist.ReduceOp.MAX,
                        group=ctx.rc)
    except RuntimeError as e:
        assert "SUM only" in str(e) or "MismatchError" in type(e).__name__ or \
            "mismatch" in str(e).lower(), str(e)
    else:
        raise AssertionError("sparse all_reduce with MAX did not raise")


@case
def case_monitored_barrier(ctx):
    import ringcomm
    import ringcomm.torch as rct
    r, ws = ctx.rank, ctx.ws
    rct.monitored_barrier(ctx.rc, timeout=datetime.timedelta(seconds=20))
    rct.monitored_barrier(timeout=20)  # the default group
    # the barrier waits: rank 0 arrives late, the others do not return before it
    if r == 0:
        time.sleep(0.5)
    t0 = time.perf_counter()
    rct.monitored_barrier(ctx.rc, timeout=20)
    if r != 0:
        assert time.perf_counter() - t0 > 0.2, "monitored_barrier returned before rank 0 came"
    # the last rank does not come: rank 0 names it (gloo's message); the others time out
    for wait_all in (False, True):
        # a fresh group per attempt: a failed monitored barrier leaves rank 0's receives posted
        g = dist.new_group(backend="ringcomm", timeout=ctx.timeout)
        missing = list(range(1, ws)) if wait_all else [ws - 1]
        if r in missing and (wait_all or r == ws - 1):
            msg = None
        else:
            try:
                rct.monitored_barrier(g, timeout=1.0, wait_all_ranks=wait_all)
                msg = "no error"
            except ringcomm.TimeoutError as e:
                msg = str(e)
        if r == 0:
            if wait_all:
                want = (f"[Rank 0]: Ranks {', '.join(map(str, missing))} failed to pass "
                        f"monitoredBarrier in 1000 ms")
            else:
                want = f"[Rank 0]: Rank {ws - 1} failed to pass monitoredBarrier in 1000 ms"
            assert msg == want, (msg, want)
        elif msg is not None:
            assert msg != "no error" and "received errors while waiting for send/recv from rank 0" \
                in msg, msg
        dist.barrier(group=ctx.gloo)
        dist.destroy_process_group(g)
    # the same failure on gloo gives the same message on rank 0
    if ws == 2:
        gl = dist.new_group(backend="gloo", timeout=ctx.timeout)
        if r == 0:
            try:
                dist.monitored_barrier(gl, timeout=datetime.timedelta(seconds=1))
                msg = "no error"
            except RuntimeError as e:
                msg = str(e)
            assert "Rank 1 failed to pass monitoredBarrier in 1000 ms" in msg, msg
        dist.barrier(group=ctx.gloo)
        dist.destroy_process_group(gl)
    # torch's own monitored_barrier refuses a ringcomm group (the reason this function exists)
    try:
        dist.monitored_barrier(ctx.rc)
    except ValueError as e:
        assert "only implemented for GLOO" in str(e), str(e)
    else:
        raise AssertionError("dist.monitored_barrier accepted a ringcomm group")


# ---- the battery ----------------------------------------------------------------------------------
test_torch_extras = battery_test(__name__, CASES, WORLD_SIZES, "ringcomm-torch-p2p-", BATTERY_TIMEOUT_S,
                                 CASE_TIMEOUT_S)
