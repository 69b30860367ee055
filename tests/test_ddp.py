"""BucketedDDP against single-process AdamW on the full batch, on spawned CPU ranks.

One group of ranks per (world size, backend) runs every case (``_ddp_cases``) and returns plain
numbers; the tests below assert on them. The reference single-process run is computed inside each
rank on the full global batch from rank 0's initial weights (each rank initialises differently, so
the construction-time broadcast is exercised too).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mp_cases import max_abs_diff
import ranks
from ranks import BACKENDS, require_backend, run_ranks

WORLD_SIZES = [2, 3]
STEPS = 5
# AdamW divides by sqrt(v) + eps, so a gradient component near zero turns float32 rounding
# differences (the full batch summed at once vs per-rank shards summed by all_reduce, ~1e-9 here)
# into update differences of up to lr * delta_g / eps. With torch's default eps=1e-8 that reaches
# ~3e-6 after 5 steps on some seeds even between two single-process runs, so the 1e-6 bar is
# tested with lr=1e-3 and eps=1e-5 (worst seen over 31 data seeds: 3e-7).
LR = 1e-3
EPS = 1e-5
LOCAL_BATCH = 4
# (name, bucket_cap_mb, first_bucket_mb): one bucket, one parameter per bucket, a few buckets.
BUCKET_CONFIGS = [("default", 25, 1), ("tiny", 1e-6, 1e-6), ("small", 0.004, 0.002)]


# ----------------------------------------------------------------------------- models
def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 48), nn.Tanh(),
                         nn.Linear(48, 32), nn.Tanh(), nn.Linear(32, 6))


class _Branchy(nn.Module):
    """``extra`` is used only when asked; ``never`` is never used."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(12, 16)
        self.extra = nn.Linear(16, 16)
        self.never = nn.Linear(16, 16)
        self.head = nn.Linear(16, 6)

    def forward(self, x, use_extra=True):
        h = torch.tanh(self.body(x))
        if use_extra:
            h = h + torch.tanh(self.extra(h))
        return self.head(h)


class _ResBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class _ResNet(nn.Module):
    def __init__(self, d=16, depth=3, checkpointed=False):
        super().__init__()
        self.inp = nn.Linear(12, d)
        self.blocks = nn.ModuleList(_ResBlock(d) for _ in range(depth))
        self.out = nn.Linear(d, 6)
        self.checkpointed = checkpointed

    def forward(self, x):
        from ringcomm.training.recompute import checkpoint
        h = self.inp(x)
        for blk in self.blocks:
            h = checkpoint(blk, h) if self.checkpointed else blk(h)
        return self.out(h)


# ----------------------------------------------------------------------------- helpers
def _batches(world_size, steps, seed=1234):
    g = torch.Generator().manual_seed(seed)
    n = LOCAL_BATCH * world_size
    return [(torch.randn(n, 12, generator=g), torch.randn(n, 6, generator=g)) for _ in range(steps)]


def _shard(t, rank, world_size):
    b = t.shape[0] // world_size
    return t[rank * b:(rank + 1) * b]


def _init(make, rank):
    torch.manual_seed(100 + rank)   # deliberately different per rank: construction must broadcast
    return make()


def _reference(make, batches, world_size, accumulate=False, use_extra_per_rank=None,
               weight_decay=0.01):
    """Single process, rank 0's initial weights, AdamW on the full global batch."""
    model = _init(make, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS, weight_decay=weight_decay)
    for x, y in batches:
        opt.zero_grad()
        if use_extra_per_rank is not None:
            # The mean of the per-rank losses, each rank's shard with its own branch choice.
            loss = sum(F.mse_loss(model(_shard(x, r, world_size), use_extra_per_rank[r]),
                                  _shard(y, r, world_size)) for r in range(world_size)) / world_size
        else:
            loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return model


def _train_ddp(ddp, batches, rank, world_size, accumulate=False, set_to_none=True,
               use_extra=None, weight_decay=0.01):
    opt = torch.optim.AdamW(ddp.parameters(), lr=LR, eps=EPS, weight_decay=weight_decay)
    for x, y in batches:
        opt.zero_grad(set_to_none=set_to_none)
        xs, ys = _shard(x, rank, world_size), _shard(y, rank, world_size)
        kw = {} if use_extra is None else {"use_extra": use_extra}
        if accumulate:
            # Two micro-batches: the first only accumulates, the second synchronises the sum.
            h = xs.shape[0] // 2
            with ddp.no_sync():
                (F.mse_loss(ddp(xs[:h], **kw), ys[:h]) / 2).backward()
            (F.mse_loss(ddp(xs[h:], **kw), ys[h:]) / 2).backward()
        else:
            F.mse_loss(ddp(xs, **kw), ys).backward()
        opt.step()
    return ddp.module


# ----------------------------------------------------------------------------- the rank program
def _ddp_cases(rank, world_size):
    from ringcomm.training.ddp import BucketedDDP
    torch.manual_seed(0)
    out: dict = {}
    batches = _batches(world_size, STEPS)
    ref = _reference(_mlp, batches, world_size)

    # Construction broadcasts rank 0's parameters.
    m = _init(_mlp, rank)
    BucketedDDP(m)
    out["broadcast_diff"] = max_abs_diff(m, _init(_mlp, 0))

    # 1. Match single-process AdamW, several bucket layouts, grads set to None / zeroed.
    for name, cap, first in BUCKET_CONFIGS:
        ddp = BucketedDDP(_init(_mlp, rank), bucket_cap_mb=cap, first_bucket_mb=first)
        out[f"nbuckets/{name}"] = len(ddp.buckets)
        out[f"first_bucket_bytes/{name}"] = ddp.buckets[0].nbytes
        out[f"first_bucket_nparams/{name}"] = len(ddp.buckets[0].params)
        out[f"match/{name}"] = max_abs_diff(_train_ddp(ddp, batches, rank, world_size), ref)
    ddp = BucketedDDP(_init(_mlp, rank), bucket_cap_mb=0.004, first_bucket_mb=0.002)
    out["match/zero_grad_keep"] = max_abs_diff(
        _train_ddp(ddp, batches, rank, world_size, set_to_none=False), ref)
    out["nparams"] = len(list(ref.parameters()))

    # 2. no_sync() accumulation.
    ddp = BucketedDDP(_init(_mlp, rank), bucket_cap_mb=0.004, first_bucket_mb=0.002)
    out["match/no_sync"] = max_abs_diff(
        _train_ddp(ddp, batches, rank, world_size, accumulate=True), ref)

    # 3. find_unused_parameters=True: 'never' is unused everywhere, 'extra' only on rank 0.
    use = [r == 0 for r in range(world_size)]
    ref_b = _reference(_Branchy, batches, world_size, use_extra_per_rank=use, weight_decay=0.0)
    ddp = BucketedDDP(_init(_Branchy, rank), find_unused_parameters=True, bucket_cap_mb=1e-6,
                      first_bucket_mb=1e-6)
    out["match/find_unused"] = max_abs_diff(
        _train_ddp(ddp, batches, rank, world_size, use_extra=use[rank], weight_decay=0.0), ref_b)

    # 4. find_unused_parameters=False with an unused parameter: a clear error, then usable.
    ddp = BucketedDDP(_init(_Branchy, rank), bucket_cap_mb=1e-6, first_bucket_mb=1e-6)
    x, y = (_shard(t, rank, world_size) for t in batches[0])
    try:
        F.mse_loss(ddp(x), y).backward()
        out["unused_error"] = None
    except RuntimeError as e:
        out["unused_error"] = str(e)
    # Every rank raised at the same point, so the collectives are still paired: a new wrapper on
    # the same group must work.
    ddp2 = BucketedDDP(_init(_mlp, rank), bucket_cap_mb=1e-6, first_bucket_mb=1e-6)
    xm, ym = (_shard(t, rank, world_size) for t in batches[1])
    F.mse_loss(ddp2(xm), ym).backward()
    out["after_error_ok"] = all(p.grad is not None for p in ddp2.parameters())

    # 5. Overlap: intercept dist.all_reduce; it must be called with async_op=True while backward
    #    is still running (before the first layer's gradient exists and before backward returns).
    ddp = BucketedDDP(_init(_mlp, rank), bucket_cap_mb=1e-6, first_bucket_mb=1e-6)
    events: list = []
    buffers = {b.buffer.data_ptr(): b.buffer.numel() for b in ddp.buckets}
    original = dist.all_reduce

    def recording_all_reduce(tensor, *args, **kwargs):
        async_op = kwargs.get("async_op", args[2] if len(args) > 2 else False)
        events.append(("all_reduce", bool(async_op),
                       buffers.get(tensor.data_ptr()) == tensor.numel()))
        return original(tensor, *args, **kwargs)

    first_layer = ddp.module[0].weight
    first_layer.register_post_accumulate_grad_hook(lambda p: events.append(("first_layer_grad",)))
    x, y = (_shard(t, rank, world_size) for t in batches[0])
    loss = F.mse_loss(ddp(x), y)
    dist.all_reduce = recording_all_reduce
    try:
        loss.backward()
        events.append(("backward_returned",))
    finally:
        dist.all_reduce = original
    out["overlap_events"] = events
    out["overlap_nbuckets"] = len(ddp.buckets)

    # 6. Buckets: every .grad is a view inside its bucket's flat buffer (checked after a step,
    #    after zero_grad(set_to_none=True) and the next backward).
    ddp = BucketedDDP(_init(_mlp, rank), bucket_cap_mb=0.004, first_bucket_mb=0.002)
    opt = torch.optim.AdamW(ddp.parameters(), lr=LR, eps=EPS)
    inside = []
    for x, y in batches[:3]:
        opt.zero_grad()
        xs, ys = _shard(x, rank, world_size), _shard(y, rank, world_size)
        F.mse_loss(ddp(xs), ys).backward()
        for b in ddp.buckets:
            lo = b.buffer.data_ptr()
            hi = lo + b.buffer.numel() * b.buffer.element_size()
            for p, off in zip(b.params, b.offsets):
                g = p.grad
                inside.append(lo <= g.data_ptr() and g.data_ptr() + g.numel() * g.element_size()
                              <= hi and g.data_ptr() == lo + off * b.buffer.element_size()
                              and g.untyped_storage().data_ptr()
                              == b.buffer.untyped_storage().data_ptr())
        opt.step()
    out["grads_are_views"] = inside
    out["bucket_param_count"] = sum(len(b.params) for b in ddp.buckets)
    # ... and the buckets are slices, in bucket order, of one contiguous buffer
    (flat,) = ddp.flat_buffers.values()
    base, esz = flat.data_ptr(), flat.element_size()
    starts = [(b.buffer.data_ptr() - base) // esz for b in ddp.buckets]
    out["one_buffer"] = {
        "same_storage": all(b.buffer.untyped_storage().data_ptr()
                            == flat.untyped_storage().data_ptr() for b in ddp.buckets),
        "ordered": all(s0 + b.buffer.numel() <= s1 for s0, s1, b in
                       zip(starts, starts[1:], ddp.buckets)),
        "aligned": all(s % 64 == 0 for s in starts),
        "fits": starts[-1] + ddp.buckets[-1].buffer.numel() <= flat.numel(),
        "nbuckets": len(ddp.buckets),
        "slack": flat.numel() - sum(b.buffer.numel() for b in ddp.buckets)}

    # 7. BucketedDDP + checkpoint on a residual network vs single process.
    make_ck = lambda: _ResNet(checkpointed=True)   # noqa: E731
    ref_res = _reference(_ResNet, batches, world_size)
    ddp = BucketedDDP(_init(make_ck, rank), bucket_cap_mb=0.004, first_bucket_mb=0.002)
    out["match/checkpoint_resnet"] = max_abs_diff(_train_ddp(ddp, batches, rank, world_size), ref_res)
    out["checkpoint_resnet_issued_in_backward"] = ddp.buckets_issued_in_backward
    out["checkpoint_resnet_nbuckets"] = len(ddp.buckets)
    return out


# ----------------------------------------------------------------------------- the tests
def _results(world_size, backend):
    require_backend(backend)
    return ranks.once(("ddp", world_size, backend),
                      lambda: run_ranks(_ddp_cases, world_size, backend=backend, timeout=150),
                      f"the world-{world_size} {backend} group")


params = pytest.mark.parametrize("world_size,backend",
                                 [(n, b) for b in BACKENDS for n in WORLD_SIZES])


@pytest.mark.timeout(180)
@params
def test_matches_single_process_adamw(world_size, backend):
    for r in _results(world_size, backend):
        assert r["broadcast_diff"] == 0.0
        for name, _, _ in BUCKET_CONFIGS:
            assert r[f"match/{name}"] <= 1e-6, (name, r[f"match/{name}"])
        assert r["match/zero_grad_keep"] <= 1e-6
        # the layouts really differ: one bucket, one per parameter, a few
        assert r["nbuckets/default"] == 1
        assert r["nbuckets/tiny"] == r["nparams"]
        assert 1 < r["nbuckets/small"] < r["nparams"]
        # the first bucket is capped at first_bucket_mb (unless a single parameter exceeds it)
        assert (r["first_bucket_bytes/small"] <= 0.002 * 2**20
                or r["first_bucket_nparams/small"] == 1)


@pytest.mark.timeout(180)
@params
def test_no_sync_accumulation_matches(world_size, backend):
    for r in _results(world_size, backend):
        assert r["match/no_sync"] <= 1e-6


@pytest.mark.timeout(180)
@params
def test_find_unused_parameters(world_size, backend):
    for r in _results(world_size, backend):
        assert r["match/find_unused"] <= 1e-6
        msg = r["unused_error"]
        assert msg is not None, "an unused parameter must raise with find_unused_parameters=False"
        assert "never.weight" in msg and "never.bias" in msg, msg
        assert "find_unused_parameters=True" in msg, msg
        assert r["after_error_ok"]


@pytest.mark.timeout(180)
@params
def test_all_reduce_is_async_and_fired_during_backward(world_size, backend):
    for r in _results(world_size, backend):
        ev = r["overlap_events"]
        names = [e[0] for e in ev]
        calls = [e for e in ev if e[0] == "all_reduce"]
        assert len(calls) == r["overlap_nbuckets"] > 1
        assert all(async_op for _, async_op, _ in calls), "all_reduce must use async_op=True"
        returned = names.index("backward_returned")
        assert max(i for i, n in enumerate(names) if n == "all_reduce") < returned
        # the first all-reduce starts before backward has even reached the first layer
        assert names.index("all_reduce") < names.index("first_layer_grad")


@pytest.mark.timeout(180)
@params
def test_grads_are_views_into_flat_bucket_buffers(world_size, backend):
    for r in _results(world_size, backend):
        assert r["grads_are_views"] and all(r["grads_are_views"])
        assert r["bucket_param_count"] == r["nparams"]
        # the tensor handed to all_reduce is the bucket's own buffer: no concatenation copy
        assert all(is_buffer for _, _, is_buffer in
                   (e for e in r["overlap_events"] if e[0] == "all_reduce"))
        ob = r["one_buffer"]
        assert ob["nbuckets"] >= 2 and ob["same_storage"] and ob["ordered"] and ob["aligned"]
        assert ob["fits"] and 0 <= ob["slack"] < 64 * ob["nbuckets"]


@pytest.mark.timeout(180)
@params
def test_bucketed_ddp_with_checkpoint_matches_single_process(world_size, backend):
    for r in _results(world_size, backend):
        assert r["match/checkpoint_resnet"] <= 1e-6
        # buckets are still issued from inside the (nested) backward
        assert r["checkpoint_resnet_issued_in_backward"] == r["checkpoint_resnet_nbuckets"]
