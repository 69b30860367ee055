"""torch.distributed on ringcomm beyond the plain collectives: tagged point-to-point messages
received in another order than they were sent, checked against gloo and the locally known
payloads.

One spawned group of ranks per world size runs every case (``torch_battery``); each case runs the
same calls on the ringcomm group and on a gloo group over the same ranks and checks both.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from torch_battery import (  # noqa: E402
    fail_on_error, init_world, registry, run_cases, spawn_battery)

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


@case
def case_tags_isend_irecv_reordered(ctx):
    r = ctx.rank
    for name, g in (("ringcomm", ctx.rc), ("gloo", ctx.gloo)):
        recv_order = list(reversed(TAGS))
        bufs = {(p, t): torch.empty(SIZES[t], dtype=torch.float64) for p in peers(ctx) for t in TAGS}
        rw = [(p, t, dist.irecv(bufs[p, t], src=p, group=g, tag=t))
              for p in peers(ctx) for t in recv_order]
        sw = [dist.isend(payload(r, p, t), dst=p, group=g, tag=t) for p in peers(ctx) for t in TAGS]
        for w in sw:
            w.wait()
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
        for w in sw:
            w.wait()


@case
def case_tags_batch_isend_irecv(ctx):
    r = ctx.rank
    for name, g in (("ringcomm", ctx.rc), ("gloo", ctx.gloo)):
        bufs = {(p, t): torch.empty(SIZES[t], dtype=torch.float64) for p in peers(ctx) for t in TAGS}
        ops = [dist.P2POp(dist.irecv, bufs[p, t], p, group=g, tag=t)
               for p in peers(ctx) for t in (11, 0, 3, 7)]
        ops += [dist.P2POp(dist.isend, payload(r, p, t), p, group=g, tag=t)
                for p in peers(ctx) for t in TAGS]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
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
        for w in sw:
            w.wait()


# ---- the battery ----------------------------------------------------------------------------------
def _battery(rank, ws, file_path):
    import ringcomm.torch  # noqa: F401 - registers the backend
    torch.set_num_threads(1)
    ctx = init_world(rank, ws, file_path, CASE_TIMEOUT_S)
    results = {name: err for name, (err, _, _) in run_cases(ctx, CASES).items()}
    dist.destroy_process_group()
    return results


_results: dict = {}


def battery_results(ws: int) -> dict:
    if ws not in _results:
        per_rank, failure = spawn_battery(_battery, ws, "ringcomm-torch-p2p-", BATTERY_TIMEOUT_S)
        if per_rank is None:
            _results[ws] = {"__launch__": failure}
        else:
            _results[ws] = {name: "\n".join(e for e in (res[name] for res in per_rank) if e) or None
                            for name in CASES}
    return _results[ws]


@pytest.mark.timeout(BATTERY_TIMEOUT_S + 60)
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_torch_extras(ws, name):
    fail_on_error(battery_results(ws), ws, name)
