"""ringcomm.training.pp against the unsplit model in one process, on spawned CPU ranks.

The schedules themselves are checked without processes (every micro-batch once forward, then
backward; at most ``p - s`` in flight under 1F1B; a slot-by-slot simulation of the stages gives
seed 001's bubble). One group of 4 ranks per backend (shared with ``test_tp.py``:
``tp_pp_group``) then runs every pipeline case: 4 stages on the default group and 2 stages on the
sub-groups {0, 1} and {2, 3} at the same time.

References: each rank builds the unsplit model from the same seed, runs the whole batch through
it, and compares the loss (on the last stage) and the gradients of its own stage's parameters.
Tolerances: with m = 1 the pipeline runs the same ops in the same order as the unsplit model, so
loss and gradients must be bitwise equal; with m > 1 the gradients are sums over micro-batches
instead of one sum over the batch, so they agree to fp32 roundoff: max |diff| / max |ref| <= 1e-6
(observed ~1e-7).

The bubble is measured on stages whose forward and backward each sleep ``SLOT_S`` (the time per
slot is then the same on every stage, as the formula assumes, and does not depend on how busy the
2 cores are). The formula counts no time for messages; each hop between stages here costs a wake-up
of the receiving process, ~1 ms on a quiet machine and up to ~5 ms with a load average of 12 on the
2 cores (observed: measured - formula = +0.03 .. +0.11 then). So the measured idle fraction must lie
in ``[formula - BUBBLE_BELOW, formula + BUBBLE_ABOVE]`` and stay well below the idle fraction
without micro-batch overlap, ``(p - 1) / p`` (0.5 for p = 2, 0.75 for p = 4).
"""
from __future__ import annotations

import copy
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import tp_pp_group

from ringcomm.training import pp
from ringcomm.apps import simulate

WORLD = tp_pp_group.WORLD
D = 8
BATCH = 8
GRAD_TOL = 1e-6
SLOT_S = 0.03
BUBBLE_BELOW = 0.03     # sleeps never end early; only the clock's granularity
BUBBLE_ABOVE = 0.15     # wake-up latency per hop on a loaded machine (see above)
MS = (1, 3, 8)
BUBBLE_CONFIGS = ((2, 3), (4, 8))   # (p, m): seed 001's 1/4 and 3/11


# ----------------------------------------------------------------------------- schedules (pure)
@pytest.mark.parametrize("kind", pp.SCHEDULES)
@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (2, 3), (4, 3), (4, 8), (3, 5)])
def test_schedule_orders(kind, p, m):
    for s in range(p):
        ops = pp.schedule(kind, p, s, m)
        assert sorted(ops) == sorted([("F", k) for k in range(m)] + [("B", k) for k in range(m)])
        assert [k for op, k in ops if op == "F"] == list(range(m))
        assert [k for op, k in ops if op == "B"] == list(range(m))
        inflight, peak = 0, 0
        for op, _ in ops:
            inflight += 1 if op == "F" else -1
            peak = max(peak, inflight)
        assert peak == (m if kind == "gpipe" else min(p - s, m))


def _simulate_slots(kind, p, m):
    """Unit-time slots, forward and backward alike: an op starts when its stage is free and its
    input is there (F(s, k) after F(s-1, k); B(s, k) after B(s+1, k), or after F(s, k) on the last
    stage). Returns (makespan, busy slots per stage, forward start slots)."""
    ops = {s: list(pp.schedule(kind, p, s, m)) for s in range(p)}
    done, free, starts = {}, [0] * p, {}
    pending = sum(len(v) for v in ops.values())
    while pending:
        progressed = False
        for s in range(p):
            if not ops[s]:
                continue
            op, k = ops[s][0]
            dep = (("F", s - 1, k) if s > 0 else None) if op == "F" else \
                  (("B", s + 1, k) if s < p - 1 else ("F", s, k))
            if dep is not None and dep not in done:
                continue
            t = max(free[s], done[dep] if dep else 0)
            starts[(op, s, k)] = t
            done[(op, s, k)] = free[s] = t + 1
            ops[s].pop(0)
            pending -= 1
            progressed = True
        assert progressed, "schedule deadlocks"
    return max(free), starts


@pytest.mark.parametrize("kind", pp.SCHEDULES)
@pytest.mark.parametrize("p,m", [(2, 3), (4, 8), (4, 32), (3, 1), (4, 2)])
def test_schedule_bubble_matches_seed_formula(kind, p, m):
    makespan, starts = _simulate_slots(kind, p, m)
    assert makespan == 2 * (m + p - 1)
    idle = (makespan - 2 * m) / makespan
    assert idle == pytest.approx(simulate.pipeline_bubble_fraction(p, m))
    assert idle == pytest.approx(pp.bubble_fraction(p, m))
    if kind == "gpipe":   # forward micro-batch k at stage s in slot s + k (seed 001's table)
        table = simulate.gpipe_schedule(p, m)
        for s in range(p):
            for k in range(m):
                assert starts[("F", s, k)] == s + k and table[s][s + k] == k


def test_bad_arguments():
    with pytest.raises(ValueError):
        pp.schedule("interleaved", 2, 0, 4)
    with pytest.raises(ValueError):
        pp.schedule("gpipe", 2, 2, 4)


# ----------------------------------------------------------------------------- models
def _dense(seed=3):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, 2 * D), nn.Tanh(), nn.Unflatten(1, (2, D)),   # 0..2
                         nn.Linear(D, D), nn.Tanh(), nn.Flatten(1),                  # 3..5
                         nn.Linear(2 * D, D), nn.Tanh(),                             # 6..7
                         nn.Linear(D, 3))                                            # 8


# Stage boundaries in _dense: 2 stages send a (n, 2, D) activation (shape header: 3 dims).
CUTS = {1: [0, 9], 2: [0, 3, 9], 4: [0, 3, 6, 8, 9]}


def _stages(model, p):
    c = CUTS[p]
    return [model[c[i]:c[i + 1]] for i in range(p)]


def _batch(seed=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, D, generator=g), torch.randn(BATCH, 3, generator=g)


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        time.sleep(SLOT_S)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        time.sleep(SLOT_S)
        return g


class SleepStage(nn.Module):
    """A stage whose forward and backward each take SLOT_S (plus a tiny linear layer)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x):
        return _Sleep.apply(self.lin(x))


# ----------------------------------------------------------------------------- cases (in ranks)
def _equality_case(group, p, m, kind):
    s = dist.get_rank(group)
    x, y = _batch()
    ref = _dense()
    ref_loss = F.mse_loss(ref(x), y)
    ref_loss.backward()
    model = copy.deepcopy(_dense())
    pipe = pp.Pipeline(_stages(model, p), schedule=kind, microbatches=m, loss_fn=F.mse_loss,
                       group=group, measure=False)
    loss = pipe.step(x if s == 0 else None, y if s == p - 1 else None)
    c = CUTS[p]
    ref_params = list(ref[c[s]:c[s + 1]].parameters())
    mine = list(pipe.module.parameters())
    errs = [float((a.grad - b.grad).abs().max() / b.grad.abs().max()) for a, b in
            zip(mine, ref_params)]
    exact = all(torch.equal(a.grad, b.grad) for a, b in zip(mine, ref_params))
    out = {"stage": s, "n_params": len(mine), "n_ref": len(ref_params), "grad_err": max(errs),
           "grad_exact": exact, "inflight": pipe.stats.get("peak_inflight"),
           "is_loss": loss is not None}
    if loss is not None:
        out["loss"] = float(loss)
        out["ref_loss"] = float(ref_loss.detach())
        out["loss_exact"] = bool(torch.equal(loss, ref_loss.detach()))
    # a second step on zeroed gradients gives the same gradients (no state left behind)
    g1 = [q.grad.clone() for q in mine]
    pipe.module.zero_grad(set_to_none=True)
    pipe.step(x if s == 0 else None, y if s == p - 1 else None)
    out["repeatable"] = all(torch.equal(a, q.grad) for a, q in zip(g1, mine))
    return out


def _bubble_case(group, p, m, kind):
    torch.manual_seed(5)
    stages = [SleepStage() for _ in range(p)]
    pipe = pp.Pipeline(stages, schedule=kind, microbatches=m,
                       loss_fn=lambda out, t: (out - t).pow(2).mean(), group=group)
    x, y = torch.randn(m * 2, D), torch.randn(m * 2, D)
    best = None
    for _ in range(2):   # the first step also pays for first-call costs; keep the smaller
        pipe.step(x, y)
        st = torch.tensor([pipe.stats["bubble"]], dtype=torch.float64)
        dist.all_reduce(st, group=group)       # mean over stages
        mean = float(st) / p
        if best is None or mean < best[0]:
            best = (mean, dict(pipe.stats))
    return {"mean_bubble": best[0], "stats": best[1]}


def _memory_case(group, p, m, kind):
    torch.manual_seed(6)
    model = _dense()
    pipe = pp.Pipeline(_stages(model, p), schedule=kind, microbatches=m, loss_fn=F.mse_loss,
                       group=group, measure=False)
    x, y = _batch()
    pipe.step(x, y)
    return {k: pipe.stats[k] for k in ("stage", "peak_inflight", "peak_saved_bytes")}


def _rank_cases(rank, world_size):
    pair = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
    cases = {}
    for p, grp in ((2, pair), (4, None)):
        for kind in pp.SCHEDULES:
            for m in MS:
                cases[f"eq/{p}/{m}/{kind}"] = \
                    lambda g=grp, p=p, m=m, k=kind: _equality_case(g, p, m, k)
            cases[f"mem/{p}/{kind}"] = lambda g=grp, p=p, k=kind: _memory_case(g, p, 8, k)
    for p, m in BUBBLE_CONFIGS:
        for kind in pp.SCHEDULES:
            grp = pair if p == 2 else None
            cases[f"bubble/{p}/{m}/{kind}"] = \
                lambda g=grp, p=p, m=m, k=kind: _bubble_case(g, p, m, k)
    return tp_pp_group.run_cases(cases)


# ----------------------------------------------------------------------------- pytest side
def _case(backend, name):
    return tp_pp_group.case(backend, "pp/" + name)


def _by_stage(per_rank, p):
    """Each pipeline's ranks: p=4 -> one pipeline; p=2 -> the pairs {0, 1} and {2, 3}."""
    return [per_rank[i:i + p] for i in range(0, WORLD, p)]


params_kind = pytest.mark.parametrize("kind", pp.SCHEDULES)


@tp_pp_group.group_test
@params_kind
@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("m", MS)
def test_pipeline_equals_unsplit_model(backend, kind, p, m):
    for pipe in _by_stage(_case(backend, f"eq/{p}/{m}/{kind}"), p):
        assert [r["stage"] for r in pipe] == list(range(p))
        assert [r["is_loss"] for r in pipe] == [False] * (p - 1) + [True]
        last = pipe[-1]
        assert last["loss"] == pytest.approx(last["ref_loss"], rel=1e-6, abs=0)
        for r in pipe:
            assert r["n_params"] == r["n_ref"] > 0
            assert r["grad_err"] <= GRAD_TOL
            assert r["repeatable"]
            if m == 1:
                assert r["grad_exact"]
        if m == 1:
            assert last["loss_exact"]


@tp_pp_group.group_test
@pytest.mark.parametrize("p", [2, 4])
def test_1f1b_holds_at_most_p_microbatches(backend, p):
    m = 8
    for g, o in zip(_by_stage(_case(backend, f"mem/{p}/gpipe"), p),
                    _by_stage(_case(backend, f"mem/{p}/1f1b"), p)):
        for rg, r1 in zip(g, o):
            s = r1["stage"]
            assert rg["peak_inflight"] == m
            assert r1["peak_inflight"] == min(p - s, m) <= p
            # Every micro-batch saves the same tensors on a stage: the 1F1B peak is (p - s) of
            # GPipe's m micro-batches' worth.
            assert rg["peak_saved_bytes"] > 0
            assert r1["peak_saved_bytes"] * m == rg["peak_saved_bytes"] * min(p - s, m)


@tp_pp_group.group_test
@params_kind
@pytest.mark.parametrize("p,m", BUBBLE_CONFIGS)
def test_measured_bubble_matches_formula(backend, kind, p, m):
    expected = (p - 1) / (m + p - 1)
    for pipe in _by_stage(_case(backend, f"bubble/{p}/{m}/{kind}"), p):
        r = pipe[0]
        assert r["stats"]["expected_bubble"] == pytest.approx(expected)
        measured = r["mean_bubble"]
        assert expected - BUBBLE_BELOW <= measured <= expected + BUBBLE_ABOVE, (measured, expected)
        assert measured <= (p - 1) / p - 0.1
        # the busy time covers this stage's 2 m slots; no upper bound: a sleep overruns by as
        # much as a busy machine makes it, and the bubble's bounds above are the point
        assert 2 * m * SLOT_S <= r["stats"]["busy_s"]


# ----------------------------------------------------------------------------- the demo's split
def test_demo_stages_compose_to_the_model():
    """ringcomm.apps.parallel_demo's stages of ringcomm.apps.train.TinyLM, run in sequence, give the
    model's own loss bitwise (the same ops in the same order)."""
    from ringcomm.apps import parallel_demo as demo
    from ringcomm.apps.train import TinyLM
    torch.manual_seed(0)
    lm = TinyLM(32, 16, 4, 2, 8)
    g = torch.Generator().manual_seed(1)
    idx, tgt = torch.randint(32, (3, 8), generator=g), torch.randint(32, (3, 8), generator=g)
    with torch.no_grad():
        ref = lm(idx, tgt)
        for p in (1, 2, 4):
            h = idx
            for st in demo.pipeline_stages(lm, p):
                h = st(h)
            assert torch.equal(demo._lm_loss(h, tgt), ref)
    with pytest.raises(ValueError):
        demo.pipeline_stages(lm, 3)


def test_demo_layouts():
    from ringcomm.apps.parallel_demo import parse_layout
    assert parse_layout("tp=2") == {"dp": 1, "tp": 2, "pp": 1}
    assert parse_layout("dp=2,tp=2") == {"dp": 2, "tp": 2, "pp": 1}
    assert parse_layout("pp=4") == {"dp": 1, "tp": 1, "pp": 4}
    for bad in ("tp", "xp=2", "tp=0", "pp=2,tp=2"):
        with pytest.raises(ValueError):
            parse_layout(bad)
