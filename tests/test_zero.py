"""ringcomm.zero: ZeRO stages 1, 2, 3 against single-process references.

One group of ranks per (backend, world size) runs every case (``_rank_cases``) and returns
numbers; the tests below only assert on them. World size 2 runs first and writes checkpoints that
the world-3 group loads (2 -> 3); the world-3 group also writes checkpoints that a two-rank
subgroup of it loads (3 -> 2, exercising ``process_group=``).

References are written out explicitly in this file:
* fp32: plain ``torch.optim.AdamW`` on the model, full batch, one process;
* bf16/fp16: the model in bf16/fp16, an fp32 master copy per parameter stepped by AdamW, the
  master copied back (rounded) into the model after each step; fp16 also applies the same
  dynamic loss-scaling rule (skip and halve on inf/nan, double after ``growth_interval`` good
  steps).

Tolerances: fp32 max |diff| <= 1e-6 on the master parameters after 5 AdamW steps (lr 1e-2;
observed ~3e-8). Mixed precision differs from its reference only by the order of the 16-bit
gradient sums (reduce-scatter of per-rank 16-bit gradients vs one 16-bit backward over the full
batch): bf16 <= 2e-3 (observed <= 4e-4) and fp16 <= 5e-4 (observed <= 1e-4) max |diff| on fp32
master parameters of magnitude ~0.3 (Adam moves each by ~1e-2 per step).

Adam is invariant to the scale of the gradient, so the AdamW comparisons alone would not notice a
missing division by the world size (or by the loss scale): the ``extras`` case also compares the
global gradient norm returned by ``clip_grad_norm_`` with torch's, and clips with it.
"""
from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
import traceback
import warnings

import pytest
import torch
from torch import nn

from mp_cases import max_abs_diff
from torch_ranks import BACKENDS, require_backend, run_ranks

import ringcomm.zero as zero
import ringcomm.zero.collectives as zero_collectives
from ringcomm.zero import DynamicLossScaler, ZeroOptimizer, ZeroStage3

STEPS = 5
BATCH = 12          # divisible by 2 and 3
LR = 1e-2
WD = 0.1
FP32_TOL = 1e-6
BF16_TOL = 2e-3
FP16_TOL = 5e-4
TINY_BUCKET_MB = 300 / (1024 * 1024)   # ~75 fp32 elements: several buckets in the MLP
CKPT_K, CKPT_M = 3, 3                   # steps before / after the checkpoint


# ----------------------------------------------------------------------------------------------
# models, data, references (imported by the spawned ranks too)
# ----------------------------------------------------------------------------------------------

def _mlp() -> nn.Module:
    # Units: 13*(10+1)=143, 13*11=143, 11*5=55; total 341. None is divisible by 2 or 3.
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 13), nn.Tanh(), nn.Linear(13, 11, bias=False), nn.Tanh(),
                         nn.Linear(11, 5, bias=False))


class _Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.fc1 = nn.Linear(d, d + 4)
        self.fc2 = nn.Linear(d + 4, d)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(x)))


class _ResNet(nn.Module):
    def __init__(self, recompute: bool):
        super().__init__()
        torch.manual_seed(1)
        self.inp = nn.Linear(10, 7)
        self.blocks = nn.ModuleList(_Block(7) for _ in range(3))
        self.out = nn.Linear(7, 5)
        self.recompute = recompute

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            if self.recompute:
                from ringcomm.recompute import checkpoint
                h = checkpoint(b, h)
            else:
                h = b(h)
        return self.out(h)


def _data(step: int):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, 10, generator=g), torch.randn(BATCH, 5, generator=g)


def _loss(out, y):
    return ((out.float() - y) ** 2).mean()


def _reference_fp32(model_fn, steps: int) -> dict:
    """Single process, full batch, plain AdamW."""
    model = model_fn()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    for step in range(steps):
        x, y = _data(step)
        _loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _reference_mixed(model_fn, steps: int, dtype, scaler: dict | None = None,
                     skip_steps=()) -> tuple[dict, list]:
    """Single process, full batch: 16-bit model (compute), fp32 masters stepped by AdamW,
    copied back rounded. With ``scaler`` ({"init", "interval"}): dynamic loss scaling; steps in
    ``skip_steps`` are the ones the distributed run overflows on (skipped, scale halved)."""
    model = model_fn()
    names = [n for n, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    masters = [nn.Parameter(p.detach().clone().float()) for p in params]
    opt = torch.optim.AdamW(masters, lr=LR, weight_decay=WD)
    for p, m in zip(params, masters):
        p.data = m.detach().to(dtype)
    scale = scaler["init"] if scaler else 1.0
    good = 0
    scales = []
    for step in range(steps):
        x, y = _data(step)
        loss = _loss(model(x.to(dtype)), y)
        if step in skip_steps:          # the distributed run sees inf here
            for p in params:
                p.grad = None
            scale *= 0.5
            good = 0
            scales.append(scale)
            continue
        (loss * scale).backward()
        for p, m in zip(params, masters):
            m.grad = p.grad.float() / scale
            p.grad = None
        opt.step()
        for p, m in zip(params, masters):
            p.data.copy_(m.detach())
        if scaler:
            good += 1
            if good == scaler["interval"]:
                scale *= 2.0
                good = 0
        scales.append(scale)
    return {n: m.detach().clone() for n, m in zip(names, masters)}, scales


# ----------------------------------------------------------------------------------------------
# the distributed side
# ----------------------------------------------------------------------------------------------

def _make(stage, model, group=None, **kw):
    """(forward callable, optimizer-like) for a stage."""
    kw.setdefault("lr", LR)
    kw.setdefault("weight_decay", WD)
    if stage == 3:
        z = ZeroStage3(model, torch.optim.AdamW, process_group=group, **kw)
        return z, z
    opt = ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=stage,
                        process_group=group, **kw)
    return model, opt


def _names(model):
    return [n for n, _ in model.named_parameters()]


def _masters(stage, opt, names) -> dict:
    """Full fp32 master parameters by name (collective)."""
    full = opt.full_parameters()
    if stage == 3:
        return full
    return {names[i]: t for i, t in full.items()}


def _train(fwd, opt, steps, start=0, group=None, inject=()):
    import torch.distributed as dist
    grank = dist.get_rank(group)
    gsize = dist.get_world_size(group)
    per = BATCH // gsize
    scales, skipped = [], []
    for step in range(start, start + steps):
        x, y = _data(step)
        x, y = x[grank * per:(grank + 1) * per], y[grank * per:(grank + 1) * per]
        loss = _loss(fwd(x.to(opt.compute_dtype)), y)
        if step in inject and grank == 1:
            loss = loss * float("inf")
        opt.scale_loss(loss).backward()
        opt.step()
        opt.zero_grad()
        scales.append(opt.loss_scale)
        skipped.append(opt.last_step_skipped)
    return scales, skipped


_REF_CACHE: dict = {}


def _ref(key, fn):
    if key not in _REF_CACHE:
        _REF_CACHE[key] = fn()
    return _REF_CACHE[key]


def _case_fp32(rank, ws, ctx, stage, bucket_cap_mb=None, collectives=None, patch_native=False):
    ref = _ref(("fp32", STEPS), lambda: _reference_fp32(_mlp, STEPS))
    if patch_native:  # a backend without native reduce-scatter / all-gather
        def refuse(*a, **k):
            raise RuntimeError("simulated: backend has no native reduce_scatter/all_gather")
        saved = zero_collectives._reduce_scatter_fn, zero_collectives._all_gather_fn
        zero_collectives._reduce_scatter_fn = zero_collectives._all_gather_fn = refuse
    try:
        model = _mlp()
        names = _names(model)
        kw = {"collectives": collectives}
        if bucket_cap_mb is not None:
            kw["bucket_cap_mb"] = bucket_cap_mb
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fwd, opt = _make(stage, model, **kw)
            _train(fwd, opt, STEPS)
            masters = _masters(stage, opt, names)
    finally:
        if patch_native:
            zero_collectives._reduce_scatter_fn, zero_collectives._all_gather_fn = saved
    out = {"master_diff": max_abs_diff(masters, ref),
           "collectives": opt.collectives_used,
           "fallback_warnings": sum("fallback" in str(w.message) for w in caught)}
    if stage != 3:   # the replicated model parameters themselves, on every rank
        out["param_diff"] = max_abs_diff({n: p.detach() for n, p in model.named_parameters()}, ref)
        out["buckets"] = len(opt._buckets)
    return out


def _case_mixed(rank, ws, ctx, stage, precision):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    ref, _ = _ref((precision, STEPS), lambda: _reference_mixed(_mlp, STEPS, dtype))
    model = _mlp()
    names = _names(model)
    fwd, opt = _make(stage, model, mixed_precision=precision, loss_scaler=False)
    _train(fwd, opt, STEPS)
    masters = _masters(stage, opt, names)
    out = {"master_diff": max_abs_diff(masters, ref), "compute_dtype": str(opt.compute_dtype)}
    if stage != 3:
        out["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    return out


def _case_fp16_scaling(rank, ws, ctx, stage):
    sc = {"init": 1024.0, "interval": 2}
    inject = (2,)
    ref, ref_scales = _ref(("fp16-scaled", STEPS), lambda: _reference_mixed(
        _mlp, STEPS, torch.float16, scaler=sc, skip_steps=inject))
    model = _mlp()
    names = _names(model)
    scaler = DynamicLossScaler(init_scale=sc["init"], growth_interval=sc["interval"])
    fwd, opt = _make(stage, model, mixed_precision="fp16", loss_scaler=scaler)
    scales, skipped = _train(fwd, opt, STEPS, inject=inject)
    masters = _masters(stage, opt, names)
    return {"master_diff": max_abs_diff(masters, ref), "scales": scales, "ref_scales": ref_scales,
            "skipped": skipped, "skipped_steps": opt.skipped_steps,
            "finite": all(bool(torch.isfinite(t).all()) for t in masters.values())}


def _state_elements(opt) -> int:
    """Elements of this rank's elementwise optimizer state (exp_avg + exp_avg_sq)."""
    return sum(v.numel() for st in opt.optimizer.state.values() for v in st.values()
               if torch.is_tensor(v) and v.dim() > 0)


def _case_memory(rank, ws, ctx, stage):
    model = _mlp()
    psi = sum(p.numel() for p in model.parameters())
    fwd, opt = _make(stage, model, bucket_cap_mb=TINY_BUCKET_MB) if stage != 3 else \
        _make(stage, model)
    groups = opt._groups
    shard_elems = sum(g.layout.shard_numel for g in groups)
    x, y = _data(0)
    per = BATCH // ws
    x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
    out = {"psi": psi, "ngroups": len(groups), "shard_elems": shard_elems,
           "padded_total": sum(g.layout.padded_numel for g in groups)}
    during = []
    if stage == 3:
        def probe(module, args, u=None):
            # runs after ZeroStage3's own pre-hook: only this layer may be gathered
            during.append([g.gathered for g in groups])
        for g in groups:
            g.module.register_forward_pre_hook(probe)
    loss = _loss(fwd(x), y)
    out["after_forward"] = opt.memory_breakdown()
    out["during_forward"] = during
    loss.backward()
    opt._finish_reduction()     # stage 2: wait for the in-flight reduce-scatters
    mb = opt.memory_breakdown()
    out["after_backward"] = mb
    if stage != 3:
        out["local_grad_elems"] = sum(p.grad.numel() for p in model.parameters()
                                      if p.grad is not None)
    out["grad_shard_elems"] = sum(g.grad_shard.numel() for g in groups
                                  if g.grad_shard is not None)
    opt.step()
    out["state_elems"] = _state_elements(opt)
    out["after_step"] = opt.memory_breakdown()
    opt.zero_grad()
    return out


def _case_checkpoint_save(rank, ws, ctx, stage, precision=None):
    """Train K steps, save (rank 0 writes the file), continue M steps (uninterrupted run); then
    a fresh instance on the same world loads the file and continues: bitwise the same."""
    import torch.distributed as dist
    kw = {"mixed_precision": precision}
    model = _mlp()
    names = _names(model)
    fwd, opt = _make(stage, model, **kw)
    _train(fwd, opt, CKPT_K)
    sd = opt.state_dict()
    tag = f"w{ws}_s{stage}_{precision or 'fp32'}"
    path = os.path.join(ctx["ckpt_dir"], f"{tag}.pt")
    if rank == 0:
        assert sd is not None and sd["world_size"] == ws
        torch.save(sd, path + ".tmp")
        os.replace(path + ".tmp", path)
    else:
        assert sd is None
    dist.barrier()
    _train(fwd, opt, CKPT_M, start=CKPT_K)
    uninterrupted = _masters(stage, opt, names)
    # resume on the same world size
    model2 = _mlp()
    fwd2, opt2 = _make(stage, model2, **kw)
    opt2.load_state_dict(torch.load(path, weights_only=False))
    _train(fwd2, opt2, CKPT_M, start=CKPT_K)
    resumed = _masters(stage, opt2, names)
    out = {"resume_same_world_diff": max_abs_diff(resumed, uninterrupted)}
    if precision is None:
        ref = _ref(("fp32", CKPT_K + CKPT_M),
                   lambda: _reference_fp32(_mlp, CKPT_K + CKPT_M))
        out["uninterrupted_vs_ref"] = max_abs_diff(uninterrupted, ref)
        if stage != 3:
            out["model_params_same_world"] = max_abs_diff(
                {n: p.detach() for n, p in model2.named_parameters()},
                {n: p.detach() for n, p in model.named_parameters()})
    return out


def _case_checkpoint_load(rank, ws, ctx, stage, from_ws, group=None):
    """Load a checkpoint written on ``from_ws`` ranks, continue M steps; compare with an
    uninterrupted K+M-step run (single-process reference and this world's own)."""
    path = os.path.join(ctx["ckpt_dir"], f"w{from_ws}_s{stage}_fp32.pt")
    if not os.path.exists(path):
        return {"error": f"checkpoint {path} was not written (did world {from_ws} fail?)"}
    model = _mlp()
    names = _names(model)
    fwd, opt = _make(stage, model, group=group)
    sd = torch.load(path, weights_only=False)
    assert sd["world_size"] == from_ws
    opt.load_state_dict(sd)
    _train(fwd, opt, CKPT_M, start=CKPT_K, group=group)
    resumed = _masters(stage, opt, names)
    ref = _ref(("fp32", CKPT_K + CKPT_M), lambda: _reference_fp32(_mlp, CKPT_K + CKPT_M))
    out = {"resumed_vs_ref": max_abs_diff(resumed, ref),
           "world_size": opt.world_size, "saved_world_size": sd["world_size"]}
    # this world's own uninterrupted K+M run
    model_u = _mlp()
    fwd_u, opt_u = _make(stage, model_u, group=group)
    _train(fwd_u, opt_u, CKPT_K + CKPT_M, group=group)
    out["resumed_vs_uninterrupted"] = max_abs_diff(resumed, _masters(stage, opt_u, names))
    # exp_avg / exp_avg_sq / step were re-sharded: the re-gathered checkpoint after loading
    # (before training) equals the saved one
    model_c = _mlp()
    _, opt_c = _make(stage, model_c, group=group)
    opt_c.load_state_dict(sd)
    again = opt_c.state_dict()
    if again is not None:
        diffs = [0.0]
        for key, st in sd["state"].items():
            for name, v in st.items():
                diffs.append(float((again["state"][key][name].float() - v.float()).abs().max()))
        diffs.append(max_abs_diff(again["params"], sd["params"]))
        out["regathered_diff"] = max(diffs)
    return out


def _case_recompute(rank, ws, ctx, stage):
    try:
        import ringcomm.recompute  # noqa: F401
    except ImportError as e:
        return {"skip": f"ringcomm.recompute not importable: {e}"}
    ref = _ref(("resnet", STEPS), lambda: _reference_fp32(lambda: _ResNet(False), STEPS))
    model = _ResNet(True)
    names = _names(model)
    fwd, opt = _make(stage, model, **({"bucket_cap_mb": TINY_BUCKET_MB} if stage == 2 else {}))
    _train(fwd, opt, STEPS)
    return {"master_diff": max_abs_diff(_masters(stage, opt, names), ref)}


def _mlp_inplace() -> nn.Module:
    torch.manual_seed(2)
    return nn.Sequential(nn.Linear(10, 13), nn.ReLU(inplace=True), nn.Linear(13, 11, bias=False),
                         nn.Tanh(), nn.Linear(11, 5, bias=False))


def _groups_of(model, stage):
    """Stages 1/2: two param groups (no decay and a doubled lr for biases)."""
    if stage == 3:
        return None
    decay = [p for n, p in model.named_parameters() if not n.endswith("bias")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0, "lr": 2 * LR}]


def _reference_extras(stage, steps, micro, max_norm):
    """fp32, full batch, split into ``micro`` micro-batches (loss / micro each), clipping,
    param groups (stages 1/2), StepLR."""
    model = _mlp_inplace()
    groups = _groups_of(model, stage) or model.parameters()
    opt = torch.optim.AdamW(groups, lr=LR, weight_decay=WD)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    norms = []
    for step in range(steps):
        x, y = _data(step)
        for xm, ym in zip(x.chunk(micro), y.chunk(micro)):
            (_loss(model(xm), ym) / micro).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        opt.step()
        sched.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}, norms


def _case_extras(rank, ws, ctx, stage, micro=2, max_norm=0.5):
    """Gradient accumulation over micro-batches, clip_grad_norm_, param groups, LR scheduler on
    ``opt.optimizer``, an in-place ReLU on a unit's output."""
    ref, ref_norms = _ref(("extras", stage), lambda: _reference_extras(stage, STEPS, micro,
                                                                       max_norm))
    model = _mlp_inplace()
    names = _names(model)
    if stage == 3:
        fwd, opt = _make(3, model)
    else:
        opt = ZeroOptimizer(_groups_of(model, stage), torch.optim.AdamW, stage=stage, lr=LR,
                            weight_decay=WD, bucket_cap_mb=TINY_BUCKET_MB)
        fwd = model
        # ZeroOptimizer's keys are indices in param-group order, as in torch.optim
        names = [n for n in names if not n.endswith("bias")] + \
                [n for n in names if n.endswith("bias")]
    sched = torch.optim.lr_scheduler.StepLR(opt.optimizer, step_size=2, gamma=0.5)
    per = BATCH // ws
    norms = []
    for step in range(STEPS):
        x, y = _data(step)
        x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
        for xm, ym in zip(x.chunk(micro), y.chunk(micro)):
            (_loss(fwd(xm), ym) / micro).backward()
        norms.append(float(opt.clip_grad_norm_(max_norm)))
        opt.step()
        sched.step()
        opt.zero_grad()
    return {"master_diff": max_abs_diff(_masters(stage, opt, names), ref),
            "norm_rel_diff": max(abs(a - b) / b for a, b in zip(norms, ref_norms)),
            "clipped": sum(b > max_norm for b in ref_norms)}


def _case_memory_budget(rank, ws, ctx, stage):
    """bf16: what a rank holds after step() (before zero_grad) vs the seeds' ZeRO table."""
    from ringcomm.memory import zero_memory_per_device
    model = _mlp()
    psi = sum(p.numel() for p in model.parameters())
    fwd, opt = _make(stage, model, mixed_precision="bf16")
    per = BATCH // ws
    x, y = _data(0)
    x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
    _loss(fwd(x.to(torch.bfloat16)), y).backward()
    opt.step()
    mb = opt.memory_breakdown()
    return {"measured": mb["total"], "expected": zero_memory_per_device(psi, ws, stage),
            "breakdown": mb, "ngroups": len(opt._groups), "psi": psi}


def _count_calls(opt) -> dict:
    """Count the collectives ``opt`` issues (wraps its ``_Collectives`` instance's methods)."""
    counts = {"reduce_scatter": 0, "all_gather": 0, "all_reduce": 0, "broadcast": 0}
    comm = opt._comm
    for attr, key in (("reduce_scatter_sum", "reduce_scatter"), ("all_gather", "all_gather"),
                      ("all_reduce_sum", "all_reduce"), ("broadcast", "broadcast")):
        def counting(*a, _f=getattr(comm, attr), _k=key, **k):
            counts[_k] += 1
            return _f(*a, **k)
        setattr(comm, attr, counting)
    return counts


def _backend_issues():
    """On the ringcomm backend: a list that its issue hook appends op names to, and a remover."""
    import torch.distributed as dist
    if dist.get_backend() != "ringcomm":
        return None, lambda: None
    import ringcomm.torch as rt
    ops: list = []

    def hook(op, group_name, seq, t):
        ops.append(op)
    rt.add_issue_hook(hook)
    return ops, lambda: rt.remove_issue_hook(hook)


def _case_no_sync(rank, ws, ctx, stage, micro=2, all_inside=False):
    """Gradient accumulation: ``micro`` micro-batches per step, the first micro-1 (or all) under
    ``no_sync()``; compared with one full batch per step in one process (plain AdamW)."""
    import contextlib
    ref = _ref(("fp32", STEPS), lambda: _reference_fp32(_mlp, STEPS))
    model = _mlp()
    names = _names(model)
    fwd, opt = _make(stage, model, **({"bucket_cap_mb": TINY_BUCKET_MB} if stage == 2 else {}))
    counts = _count_calls(opt)
    ops, remove = _backend_issues()
    per = BATCH // ws
    in_no_sync = {k: 0 for k in counts}
    backend_in_no_sync: list = []
    local_grad_elems = []
    try:
        for step in range(STEPS):
            x, y = _data(step)
            x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
            chunks = list(zip(x.chunk(micro), y.chunk(micro)))
            for i, (xm, ym) in enumerate(chunks):
                inside = all_inside or i < len(chunks) - 1
                before = dict(counts)
                n_ops = len(ops) if ops is not None else 0
                with opt.no_sync() if inside else contextlib.nullcontext():
                    (_loss(fwd(xm), ym) / micro).backward()
                if inside:
                    for k in counts:
                        in_no_sync[k] += counts[k] - before[k]
                    if ops is not None:
                        backend_in_no_sync += ops[n_ops:]
                    if stage != 3:
                        local_grad_elems.append(sum(p.grad.numel() for p in model.parameters()
                                                    if p.grad is not None))
            opt.step()
            opt.zero_grad()
    finally:
        remove()
    return {"master_diff": max_abs_diff(_masters(stage, opt, names), ref),
            "in_no_sync": in_no_sync, "backend_in_no_sync": sorted(set(backend_in_no_sync)),
            "backend_counted": ops is not None, "local_grad_elems": local_grad_elems,
            "psi": sum(p.numel() for p in _mlp().parameters())}


def _case_offload(rank, ws, ctx, stage, precision=None):
    """offload="cpu" against the same run without it: bitwise equal masters and checkpoints; the
    masters are host tensors separate from the compute parameters."""
    kw = {"mixed_precision": precision}
    model_a, model_b = _mlp(), _mlp()
    names = _names(model_a)
    fwd_a, opt_a = _make(stage, model_a, offload="cpu", **kw)
    fwd_b, opt_b = _make(stage, model_b, **kw)
    _train(fwd_a, opt_a, STEPS)
    _train(fwd_b, opt_b, STEPS)
    out = {"master_diff": max_abs_diff(_masters(stage, opt_a, names), _masters(stage, opt_b, names)),
           "offload": opt_a.offload, "plain_offload": opt_b.offload}
    if stage == 3:
        compute = [u.shard for u in opt_a._groups]
    else:
        compute = [b.flat_param for b in opt_a._groups]
        out["param_diff"] = max_abs_diff({n: p.detach() for n, p in model_a.named_parameters()},
                                      {n: p.detach() for n, p in model_b.named_parameters()})
    out["separate"] = all(g.master.untyped_storage().data_ptr() != c.untyped_storage().data_ptr()
                          for g, c in zip(opt_a._groups, compute))
    out["master_devices"] = sorted({g.master.device.type for g in opt_a._groups})
    mb = opt_a.memory_breakdown()
    out["offloaded"] = mb["offloaded"]
    out["host_expected"] = mb["optimizer_states"] + mb["master_weights"]
    out["plain_offloaded"] = opt_b.memory_breakdown()["offloaded"]
    sd_a, sd_b = opt_a.state_dict(), opt_b.state_dict()
    if sd_a is not None:
        diffs = [max_abs_diff(sd_a["params"], sd_b["params"])]
        for key, st in sd_b["state"].items():
            for name, v in st.items():
                diffs.append(float((sd_a["state"][key][name].float() - v.float()).abs().max()))
        out["checkpoint_diff"] = max(diffs)
    return out


def _case_volume(rank, ws, ctx):
    """Bytes per rank through each kind of collective during 2 training steps (fp32), counted by
    ringcomm.train.comm_volume: BucketedDDP's all-reduce vs ZeRO-1/2/3's reduce-scatter and
    all-gather."""
    from ringcomm.ddp import BucketedDDP
    from ringcomm.train.comm_volume import CommVolume
    steps = 2
    per = BATCH // ws
    out = {"psi": sum(p.numel() for p in _mlp().parameters()), "steps": steps}
    for name in ("ddp", "zero1", "zero2", "zero3"):
        model = _mlp()
        if name == "ddp":
            fwd = BucketedDDP(model, bucket_cap_mb=TINY_BUCKET_MB, first_bucket_mb=TINY_BUCKET_MB)
            opt = torch.optim.AdamW(fwd.parameters(), lr=LR, weight_decay=WD)
            padded = out["psi"]
        else:
            fwd, opt = _make(int(name[-1]), model,
                             **({"bucket_cap_mb": TINY_BUCKET_MB} if name != "zero3" else {}))
            padded = sum(g.layout.padded_numel for g in opt._groups)
        vol = CommVolume().install()
        try:
            vol.active = True
            for step in range(steps):
                x, y = _data(step)
                x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
                _loss(fwd(x), y).backward()
                opt.step()
                opt.zero_grad()
            vol.active = False
        finally:
            vol.uninstall()
        c = vol.counts()
        out[name] = {"counts": c, "padded": padded,
                     "ngroups": len(fwd.buckets) if name == "ddp" else len(opt._groups)}
    return out


def _rank_cases(rank, ws, ckpt_dir):
    """Every case, in a fixed order (all ranks run the same collectives in the same order)."""
    import torch.distributed as dist
    ctx = {"ckpt_dir": ckpt_dir}
    sub = dist.new_group([0, 1]) if ws == 3 else None
    cases = []
    for stage in (1, 2, 3):
        cases.append((f"fp32/{stage}", _case_fp32, {"stage": stage}))
    cases.append(("fp32/2/buckets", _case_fp32, {"stage": 2, "bucket_cap_mb": TINY_BUCKET_MB}))
    cases.append(("fp32/1/buckets", _case_fp32, {"stage": 1, "bucket_cap_mb": TINY_BUCKET_MB}))
    for stage in (1, 2, 3):
        cases.append((f"bf16/{stage}", _case_mixed, {"stage": stage, "precision": "bf16"}))
        cases.append((f"fp16-scaling/{stage}", _case_fp16_scaling, {"stage": stage}))
        cases.append((f"memory/{stage}", _case_memory, {"stage": stage}))
        cases.append((f"recompute/{stage}", _case_recompute, {"stage": stage}))
        cases.append((f"ckpt-save/{stage}", _case_checkpoint_save, {"stage": stage}))
        if ws == 3:
            cases.append((f"ckpt-2to3/{stage}", _case_checkpoint_load,
                          {"stage": stage, "from_ws": 2}))
    for stage in (1, 2, 3):
        cases.append((f"extras/{stage}", _case_extras, {"stage": stage}))
        cases.append((f"memory-budget/{stage}", _case_memory_budget, {"stage": stage}))
    for stage in (1, 2, 3):
        cases.append((f"no-sync/{stage}", _case_no_sync, {"stage": stage}))
        cases.append((f"no-sync-all/{stage}", _case_no_sync, {"stage": stage, "all_inside": True}))
        cases.append((f"offload/{stage}", _case_offload, {"stage": stage}))
    cases.append(("offload/2/bf16", _case_offload, {"stage": 2, "precision": "bf16"}))
    cases.append(("offload/3/bf16", _case_offload, {"stage": 3, "precision": "bf16"}))
    cases.append(("volume", _case_volume, {}))
    cases.append(("ckpt-save/2/fp16", _case_checkpoint_save, {"stage": 2, "precision": "fp16"}))
    cases.append(("ckpt-save/3/bf16", _case_checkpoint_save, {"stage": 3, "precision": "bf16"}))
    # the fallback collectives: forced, and switched to automatically when the backend raises
    for stage in (2, 3):
        cases.append((f"fallback/{stage}", _case_fp32,
                      {"stage": stage, "collectives": "fallback",
                       **({"bucket_cap_mb": TINY_BUCKET_MB} if stage == 2 else {})}))
    cases.append(("auto-fallback/1", _case_fp32, {"stage": 1, "patch_native": True}))
    cases.append(("auto-fallback/3", _case_fp32, {"stage": 3, "patch_native": True}))
    results = {}
    for name, fn, kw in cases:
        t0 = time.perf_counter()
        try:
            results[name] = fn(rank, ws, ctx, **kw)
        except Exception:  # noqa: BLE001 - reported by the test that reads this case
            results[name] = {"error": traceback.format_exc()}
        results[name]["seconds"] = time.perf_counter() - t0
    if ws == 3:  # 3 -> 2: ranks 0 and 1 form a two-rank group and load world 3's checkpoints
        for stage in (1, 2, 3):
            name = f"ckpt-3to2/{stage}"
            if rank < 2:
                try:
                    results[name] = _case_checkpoint_load(rank, ws, ctx, stage, from_ws=3,
                                                          group=sub)
                except Exception:  # noqa: BLE001
                    results[name] = {"error": traceback.format_exc()}
            else:
                results[name] = {"idle": True}
        dist.barrier()
    return results


# ----------------------------------------------------------------------------------------------
# pytest side: one group per (backend, world size), cached for the module
# ----------------------------------------------------------------------------------------------

_GROUPS: dict = {}
_TMP: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _ckpt_dir():
    _TMP["dir"] = tempfile.mkdtemp(prefix="ringcomm-zero-test-")
    yield _TMP["dir"]
    shutil.rmtree(_TMP.pop("dir"), ignore_errors=True)
    _GROUPS.clear()


def _group(backend: str, ws: int) -> list:
    require_backend(backend)
    key = (backend, ws)
    if key not in _GROUPS:
        if ws == 3 and (backend, 2) not in _GROUPS:
            try:
                _group(backend, 2)   # world 3 loads the checkpoints world 2 writes
            except BaseException:    # noqa: BLE001 - its own tests report it
                pass
        ckpt_dir = os.path.join(_TMP["dir"], backend)
        os.makedirs(ckpt_dir, exist_ok=True)
        try:
            _GROUPS[key] = run_ranks(_rank_cases, ws, backend=backend, args=(ckpt_dir,),
                                     timeout=150)
        except BaseException as e:  # noqa: BLE001
            _GROUPS[key] = e
    res = _GROUPS[key]
    if isinstance(res, BaseException):
        pytest.fail(f"the world-{ws} {backend} group failed: {res}")
    return res


def _case(backend: str, ws: int, name: str) -> list:
    per_rank = [r[name] for r in _group(backend, ws)]
    for rank, r in enumerate(per_rank):
        if "error" in r:
            pytest.fail(f"case {name!r}, rank {rank} of {ws} ({backend}):\n{r['error']}")
    return per_rank


params_bw = pytest.mark.parametrize("backend", BACKENDS)
params_ws = pytest.mark.parametrize("ws", [2, 3])
params_stage = pytest.mark.parametrize("stage", [1, 2, 3])


def per_backend(fn):
    """A test that reads the groups: the timeout covers starting them, one id per backend."""
    return pytest.mark.timeout(330)(params_bw(fn))


def per_group(fn):
    """A test that reads every (backend, world size) group."""
    return per_backend(params_ws(fn))


@per_group
@params_stage
def test_fp32_matches_single_process_adamw(backend, ws, stage):
    for r in _case(backend, ws, f"fp32/{stage}"):
        assert r["master_diff"] <= FP32_TOL
        if stage != 3:
            assert r["param_diff"] <= FP32_TOL
            assert r["buckets"] == 1   # default cap: one flat buffer
        assert r["collectives"]["reduce_scatter"] == {"native"}
        assert r["collectives"]["all_gather"] == {"native"}


@per_group
@pytest.mark.parametrize("stage", [1, 2])
def test_fp32_several_buckets(backend, ws, stage):
    for r in _case(backend, ws, f"fp32/{stage}/buckets"):
        assert r["buckets"] >= 3
        assert r["master_diff"] <= FP32_TOL and r["param_diff"] <= FP32_TOL


@per_group
@params_stage
def test_bf16_matches_mixed_precision_reference(backend, ws, stage):
    for r in _case(backend, ws, f"bf16/{stage}"):
        assert r["compute_dtype"] == "torch.bfloat16"
        if stage != 3:
            assert r["param_dtypes"] == ["torch.bfloat16"]
        assert r["master_diff"] <= BF16_TOL, r


@per_group
@params_stage
def test_fp16_loss_scaling_skips_inf_step(backend, ws, stage):
    for r in _case(backend, ws, f"fp16-scaling/{stage}"):
        # init 1024, growth after 2 good steps, inf injected at step 2 on rank 1 only
        assert r["skipped"] == [False, False, True, False, False]
        assert r["skipped_steps"] == 1
        assert r["scales"] == [1024.0, 2048.0, 1024.0, 1024.0, 2048.0]
        assert r["scales"] == r["ref_scales"]
        assert r["finite"]
        assert r["master_diff"] <= FP16_TOL, r


@per_group
@params_stage
def test_memory_is_sharded(backend, ws, stage):
    for rank, r in enumerate(_case(backend, ws, f"memory/{stage}")):
        psi, ngroups = r["psi"], r["ngroups"]
        # each flat group is split evenly: a rank's shard is psi/ws up to the padding
        assert abs(r["shard_elems"] - psi / ws) <= ngroups
        # optimizer state (exp_avg + exp_avg_sq) covers this rank's shards only: ~1/world
        assert r["state_elems"] == 2 * r["shard_elems"]
        assert r["state_elems"] <= 2 * (math.ceil(psi / ws) + ngroups)
        mb = r["after_step"]
        assert mb["optimizer_states"] >= 2 * 4 * r["shard_elems"]
        assert mb["optimizer_states"] <= 2 * 4 * r["shard_elems"] + 4 * 4 * ngroups  # + steps
        assert mb["master_weights"] in (0, 4 * r["shard_elems"])
        if stage == 2:
            # after backward, this rank holds only its gradient shards (~1/world)
            assert r["local_grad_elems"] == 0
            assert r["grad_shard_elems"] == r["shard_elems"]
            assert r["after_backward"]["grads"] == 4 * r["shard_elems"]
        if stage == 1:
            assert r["local_grad_elems"] == psi   # stage 1 keeps full local gradients
        if stage == 3:
            shard_bytes = 4 * r["shard_elems"]
            for when in ("after_forward", "after_backward", "after_step"):
                assert r[when]["gathered_params"] == 0, when
                assert r[when]["params"] == shard_bytes, when
            assert abs(r["after_forward"]["params"] / (4 * psi) - 1 / ws) < 0.05
            assert r["grad_shard_elems"] == r["shard_elems"]
            assert r["after_backward"]["grads"] == shard_bytes
            # inside each layer's forward, only that layer's full weights exist
            assert len(r["during_forward"]) == ngroups
            for i, gathered in enumerate(r["during_forward"]):
                assert gathered == [j == i for j in range(ngroups)], (i, gathered)


@per_group
@params_stage
def test_memory_matches_zero_table_bf16(backend, ws, stage):
    """bf16 params/grads + fp32 master/Adam: the seeds' 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N, up to the
    padding (< ws elements per flat group, 14 or 16 bytes each) and Adam's 4-byte step counters."""
    for r in _case(backend, ws, f"memory-budget/{stage}"):
        slack = r["ngroups"] * (16 * ws + 4)
        assert 0 <= r["measured"] - r["expected"] <= slack, r


@per_group
@params_stage
def test_accumulation_clipping_param_groups_scheduler(backend, ws, stage):
    for r in _case(backend, ws, f"extras/{stage}"):
        assert r["clipped"] >= 1            # the clipping was active in some step
        assert r["norm_rel_diff"] <= 1e-5
        assert r["master_diff"] <= FP32_TOL


@per_group
@params_stage
def test_checkpoint_resume_same_world_is_bitwise(backend, ws, stage):
    for r in _case(backend, ws, f"ckpt-save/{stage}"):
        assert r["resume_same_world_diff"] == 0.0
        assert r["uninterrupted_vs_ref"] <= FP32_TOL
        if stage != 3:
            assert r["model_params_same_world"] == 0.0


@per_backend
@pytest.mark.parametrize("name", ["ckpt-save/2/fp16", "ckpt-save/3/bf16"])
def test_checkpoint_resume_mixed_precision_is_bitwise(backend, name):
    for r in _case(backend, 2, name):
        assert r["resume_same_world_diff"] == 0.0


@per_backend
@params_stage
@pytest.mark.parametrize("direction", ["2to3", "3to2"])
def test_checkpoint_reshards_across_world_sizes(backend, stage, direction):
    per_rank = _case(backend, 3, f"ckpt-{direction}/{stage}")
    active = [r for r in per_rank if not r.get("idle")]
    assert len(active) == (3 if direction == "2to3" else 2)
    for r in active:
        assert r["saved_world_size"] == (2 if direction == "2to3" else 3)
        assert r["world_size"] == (3 if direction == "2to3" else 2)
        assert r["resumed_vs_ref"] <= FP32_TOL
        assert r["resumed_vs_uninterrupted"] <= FP32_TOL
    assert per_rank[0]["regathered_diff"] == 0.0


@per_group
@params_stage
def test_with_recompute_on_residual_network(backend, ws, stage):
    per_rank = _case(backend, ws, f"recompute/{stage}")
    if "skip" in per_rank[0]:
        pytest.skip(per_rank[0]["skip"])
    for r in per_rank:
        assert r["master_diff"] <= FP32_TOL


def _ran_on_fallback(backend: str, ws: int, name: str) -> list:
    """Case ``name``'s results, each checked to have used only the fallback collectives and to
    match the fp32 reference."""
    per_rank = _case(backend, ws, name)
    for r in per_rank:
        assert r["collectives"] == {"reduce_scatter": {"fallback"}, "all_gather": {"fallback"}}
        assert r["master_diff"] <= FP32_TOL
    return per_rank


@per_group
@pytest.mark.parametrize("stage", [2, 3])
def test_fallback_collectives_forced(backend, ws, stage):
    _ran_on_fallback(backend, ws, f"fallback/{stage}")


@per_group
@pytest.mark.parametrize("stage", [1, 3])
def test_fallback_used_when_backend_raises(backend, ws, stage):
    for r in _ran_on_fallback(backend, ws, f"auto-fallback/{stage}"):
        assert r["fallback_warnings"] == 2   # one per collective, then it sticks


@per_group
@params_stage
@pytest.mark.parametrize("variant", ["no-sync", "no-sync-all"])
def test_no_sync_accumulation_equals_one_big_batch(backend, ws, stage, variant):
    """k=2 micro-batches (loss / 2), the first (or both: step() reduces) under no_sync(): the same
    masters as one full batch in one process, and no gradient collective inside no_sync()."""
    for r in _case(backend, ws, f"{variant}/{stage}"):
        assert r["master_diff"] <= FP32_TOL, r
        c = r["in_no_sync"]
        assert c["reduce_scatter"] == 0 and c["all_reduce"] == 0 and c["broadcast"] == 0, c
        if stage == 3:
            assert c["all_gather"] > 0       # stage 3 must still gather its parameters
            if r["backend_counted"]:
                assert r["backend_in_no_sync"] == ["all_gather_into_tensor"], r
        else:
            assert c["all_gather"] == 0, c    # stages 1 and 2: nothing at all
            if r["backend_counted"]:
                assert r["backend_in_no_sync"] == [], r
            # the accumulated gradients stay local and full (stage 2 included)
            assert r["local_grad_elems"] and all(n == r["psi"] for n in r["local_grad_elems"])
        assert r["backend_counted"] == (backend == "ringcomm")


@per_group
@pytest.mark.parametrize("name", ["offload/1", "offload/2", "offload/3", "offload/2/bf16",
                                  "offload/3/bf16"])
def test_cpu_offload_is_bitwise_equal(backend, ws, name):
    for r in _case(backend, ws, name):
        assert r["offload"] == "cpu" and r["plain_offload"] is None
        assert r["master_diff"] == 0.0
        if "param_diff" in r:
            assert r["param_diff"] == 0.0
        assert r["separate"]                      # a host copy, not the compute tensor itself
        assert r["master_devices"] == ["cpu"]
        assert r["offloaded"] == r["host_expected"] > 0 and r["plain_offloaded"] == 0
        if "checkpoint_diff" in r:
            assert r["checkpoint_diff"] == 0.0


@per_group
def test_communication_volume_zero2_equals_ddp_zero3_is_1_5x(backend, ws):
    """Per rank, over 2 fp32 steps, ring bytes ((n-1)/n of the full tensor per reduce-scatter or
    all-gather, 2(n-1)/n per all-reduce): ZeRO-1/2 == BucketedDDP's all-reduce, ZeRO-3 == 1.5x,
    both exactly up to ZeRO's padding (< ws elements per flat group), and equal to
    ringcomm.memory.zero_communication_bytes. On ringcomm every byte is booked by the backend's
    issue hook, and equals the torch.distributed-level count."""
    from ringcomm.memory import zero_communication_bytes
    for r in _case(backend, ws, "volume"):
        psi, steps = r["psi"], r["steps"]
        f = (ws - 1) / ws
        ddp = r["ddp"]["counts"]
        assert ddp["all_reduce"]["calls"] == steps * r["ddp"]["ngroups"]
        assert ddp["all_reduce"]["wire"] == pytest.approx(steps * 2 * f * 4 * psi, rel=1e-12)
        assert ddp["reduce_scatter"]["calls"] == ddp["all_gather"]["calls"] == 0
        assert ddp["all_reduce"]["wire"] == pytest.approx(
            steps * zero_communication_bytes(4 * psi, ws, 0), rel=1e-12)
        for name, passes in (("zero1", 2), ("zero2", 2), ("zero3", 3)):
            z = r[name]
            c = z["counts"]
            assert c["all_reduce"]["calls"] == 0 and c["broadcast"]["calls"] == 0, (name, c)
            wire = c["reduce_scatter"]["wire"] + c["all_gather"]["wire"]
            assert wire == pytest.approx(steps * passes * f * 4 * z["padded"], rel=1e-12)
            assert c["all_gather"]["wire"] == pytest.approx(
                (passes - 1) * c["reduce_scatter"]["wire"], rel=1e-12)
            ratio = wire / ddp["all_reduce"]["wire"]
            pad = (z["padded"] - psi) / psi
            assert 0 <= pad <= z["ngroups"] * ws / psi
            assert ratio == pytest.approx(passes / 2 * (1 + pad), rel=1e-12), (name, ratio)
            formula = (zero_communication_bytes(4 * psi, ws, int(name[-1]))
                       / zero_communication_bytes(4 * psi, ws, 0))
            assert formula == passes / 2
            assert formula <= ratio <= formula * (1 + z["ngroups"] * ws / psi)
        for name in ("ddp", "zero1", "zero2", "zero3"):
            c = r[name]["counts"]
            if backend == "ringcomm":
                assert c["source"] == "issue_hook" and c["hook_unattributed"] == {}, c
                for kind in ("all_reduce", "reduce_scatter", "all_gather"):
                    assert c["hook"][kind] == c["dist"][kind], (name, kind)
            else:
                assert c["source"] == "dist"


# ----------------------------------------------------------------------------------------------
# single-process tests (no ranks)
# ----------------------------------------------------------------------------------------------

def test_dynamic_loss_scaler_rule():
    s = DynamicLossScaler(init_scale=8.0, growth_interval=3, min_scale=1.0)
    seq = []
    for found_inf in [False, False, False, True, False, True, True, True, True]:
        s.update(found_inf)
        seq.append(s.scale)
    assert seq == [8.0, 8.0, 16.0, 8.0, 8.0, 4.0, 2.0, 1.0, 1.0]
    t = DynamicLossScaler()
    t.load_state_dict(s.state_dict())
    assert t.scale == 1.0 and t.growth_interval == 3
    with pytest.raises(ValueError):
        DynamicLossScaler(backoff_factor=1.5)


def test_flat_layout_padding():
    lay = zero._FlatLayout([torch.Size([13, 11]), torch.Size([13]), torch.Size([])], 3)
    assert lay.numel == 143 + 13 + 1 == 157
    assert lay.padded_numel == 159 and lay.shard_numel == 53 and lay.pad == 2
    assert lay.offsets == [0, 143, 156]
    assert lay.shard_range(2) == (106, 159)
    ts = [torch.randn(13, 11), torch.randn(13), torch.tensor(3.0)]
    flat = lay.flatten(ts, torch.float32, "cpu")
    assert flat[-2:].eq(0).all()
    for a, b in zip(lay.unflatten(flat), ts):
        assert torch.equal(a, b)
    assert lay.split_sizes == [143, 13, 1, 2]


def test_argument_validation_without_process_group():
    p = [nn.Parameter(torch.zeros(3))]
    with pytest.raises(ValueError, match="stages 1 and 2"):
        ZeroOptimizer(p, torch.optim.AdamW, stage=3)
    with pytest.raises(ValueError, match="mixed_precision"):
        ZeroOptimizer(p, torch.optim.AdamW, mixed_precision="fp8")
    with pytest.raises(RuntimeError, match="init_process_group"):
        ZeroOptimizer(p, torch.optim.AdamW, stage=2)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ZeroStage3(nn.Linear(2, 2), torch.optim.AdamW)
    assert zero.FullyShardedModule is ZeroStage3


def test_zero_work_is_a_ringcomm_work():
    import ringcomm
    done = []
    w = zero_collectives._Work(None, lambda: done.append(1))   # synchronous: finished at once
    assert isinstance(w, ringcomm.Work) and done == [1]
    assert w.is_completed() and w.exception() is None and w.result() is None
    assert done == [1]                                            # finish runs once
