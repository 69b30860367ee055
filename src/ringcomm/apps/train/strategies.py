"""The data-parallel strategies compared (single, torch DDP, BucketedDDP, ZeRO-1/2/3) and how
each wraps the model and builds its optimizer."""
from __future__ import annotations

import inspect

import torch
from torch import nn

STRATEGIES = ("single", "torch_ddp", "bucketed_ddp", "zero1", "zero2", "zero3")
PRECISIONS = ("fp32", "bf16")
# Loss curves vs the single process: max |loss - loss_single| / loss_single over all steps.
TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}


class _Notices(list):
    def add(self, msg):
        if msg not in self:
            self.append(msg)


def _zero_module():
    try:
        from ...training import zero
        return zero, ""
    except Exception as e:  # noqa: BLE001 - a missing or half-written module: skip with notice
        return None, f"{type(e).__name__}: {e}"


def _zero3_factory(zero):
    obj = getattr(zero, "ZeroStage3", None)
    return ("ZeroStage3", obj) if obj is not None else (None, None)


def _build(strategy: str, model: nn.Module, o: dict, precision: str = "fp32"):
    """Returns (forward module, optimizer, extra tensors for the memory count or None).

    The ZeRO configurations in bf16 use ZeRO's own mixed precision (bf16 parameters and
    gradients, fp32 master shards and Adam states: the 2 + 2 + 12 budget) under the same CPU
    autocast as the others; the other strategies keep fp32 parameters under autocast."""
    kw = dict(lr=o["lr"], weight_decay=o["weight_decay"])
    if strategy == "single":
        return model, torch.optim.AdamW(model.parameters(), **kw), None
    if strategy == "torch_ddp":
        from torch.nn.parallel import DistributedDataParallel
        ddp = DistributedDataParallel(model, bucket_cap_mb=o["bucket_cap_mb"],
                                      gradient_as_bucket_view=True)
        return ddp, torch.optim.AdamW(ddp.parameters(), **kw), None
    if strategy == "bucketed_ddp":
        from ...training.ddp import BucketedDDP
        ddp = BucketedDDP(model, bucket_cap_mb=o["bucket_cap_mb"],
                          first_bucket_mb=o["first_bucket_mb"])
        return ddp, torch.optim.AdamW(ddp.parameters(), **kw), {
            "grads": [b.buffer for b in ddp.buckets]}
    zero, err = _zero_module()
    if zero is None:
        raise RuntimeError(f"ringcomm.training.zero unavailable: {err}")
    mp = "bf16" if precision == "bf16" else None
    if strategy in ("zero1", "zero2"):
        zkw = dict(kw)
        if "bucket_cap_mb" in inspect.signature(zero.ZeroOptimizer).parameters:
            zkw["bucket_cap_mb"] = o["bucket_cap_mb"]   # the same buckets as the DDP variants
        opt = zero.ZeroOptimizer(model.parameters(), torch.optim.AdamW,
                                 stage=int(strategy[-1]), mixed_precision=mp, **zkw)
        return model, opt, None
    if strategy == "zero3":
        name, factory = _zero3_factory(zero)
        if factory is None:
            raise RuntimeError("ringcomm.training.zero has no stage-3 wrapper")
        wrapped = factory(model, torch.optim.AdamW, mixed_precision=mp, **kw)
        # ZeroStage3 is both the module and the optimizer (step(), zero_grad()).
        return wrapped, wrapped, None
    raise ValueError(f"unknown strategy {strategy!r}")
