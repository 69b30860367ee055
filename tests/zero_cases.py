"""The ranks' side of tests/test_zero.py (module-level, so that the spawned ranks import it): the
models, the data, the single-process references, and every ZeRO case, run in a fixed order by
``_rank_cases`` in one group of ranks per (backend, world size)."""
from __future__ import annotations

import os
import time
import traceback
import warnings

import torch
from torch import nn

from mp_cases import max_abs_diff

import ringcomm.training.zero.collectives as zero_collectives
from ringcomm.training.zero import DynamicLossScaler, ZeroOptimizer, ZeroStage3

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
                from ringcomm.training.recompute import checkpoint
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
        import ringcomm.training.recompute  # noqa: F401
    except ImportError as e:
        return {"skip": f"ringcomm.training.recompute not importable: {e}"}
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
    from ringcomm.training.memory import zero_memory_per_device
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
    ringcomm.apps.train.comm_volume: BucketedDDP's all-reduce vs ZeRO-1/2/3's reduce-scatter and
    all-gather."""
    from ringcomm.training.ddp import BucketedDDP
    from ringcomm.apps.train.comm_volume import CommVolume
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
