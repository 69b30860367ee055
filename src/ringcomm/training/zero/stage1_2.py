"""ZeRO stages 1 and 2: ``ZeroOptimizer`` (optimizer states, and at stage 2 gradients,
partitioned; parameters replicated as views into flat compute-dtype buckets)."""
from __future__ import annotations

import weakref

import torch

from .core import _ZeroCore
from .flat import _FlatGroup, _nbytes
from ...core.config import read
from .knobs import _BUCKET_MB_ENV, _MB, _positive
from .precision import DynamicLossScaler, _resolve_precision

class _Bucket(_FlatGroup):
    """A stage-1/2 flat group: ``params`` are views into ``flat_param`` (compute dtype)."""

    def __init__(self, index, params, keys, world_size, rank, compute_dtype, master_dtype,
                 device):
        super().__init__(keys, [p.shape for p in params], world_size, rank, compute_dtype,
                         master_dtype, device)
        self.index = index
        self.params = params
        self.flat_param: torch.Tensor | None = None
        self.ready: set = set()


def _normalize_param_groups(params) -> list[dict]:
    if isinstance(params, torch.Tensor):
        raise TypeError("params must be an iterable of tensors or of param-group dicts, "
                        "got a tensor")
    params = list(params)
    if not params:
        raise ValueError("ZeroOptimizer got an empty parameter list")
    groups = params if isinstance(params[0], dict) else [{"params": params}]
    out = []
    seen: set = set()
    for g in groups:
        if not isinstance(g, dict) or "params" not in g:
            raise TypeError("param groups must be dicts with a 'params' entry")
        ps = g["params"]
        ps = [ps] if isinstance(ps, torch.Tensor) else list(ps)
        for p in ps:
            if not isinstance(p, torch.Tensor) or not p.is_leaf:
                raise TypeError("ZeroOptimizer can only optimize leaf tensors (nn.Parameter)")
            if id(p) in seen:
                raise ValueError("a parameter appears more than once in ZeroOptimizer's params")
            seen.add(id(p))
        out.append(dict(g, params=ps))
    return out


class ZeroOptimizer(_ZeroCore):
    """ZeRO stage 1 (optimizer states partitioned) or 2 (+ gradients partitioned).

    Args:
        params: the model's parameters, or param-group dicts (as for ``torch.optim``). They are
            broadcast from the group's rank 0 and become views into flat compute-dtype buffers
            (their dtype changes to bf16/fp16 under mixed precision).
        optimizer_class: e.g. ``torch.optim.AdamW``; it steps each rank's fp32 master shards.
        stage: 1 or 2 (stage 3 is :class:`ZeroStage3`).
        process_group: the group to shard over (``None``: the default group).
        mixed_precision: ``None`` (parameters' own dtype throughout), ``"bf16"`` or ``"fp16"``.
        bucket_cap_mb: flat-group size cap in MiB of compute-dtype elements (default
            ``$RINGCOMM_ZERO_BUCKET_MB`` or 25); ``float("inf")`` = one flat buffer per param group.
        loss_scaler: a :class:`DynamicLossScaler` (default for fp16), or ``False`` for none.
        collectives: ``"auto"`` | ``"native"`` | ``"fallback"`` (default
            ``$RINGCOMM_ZERO_COLLECTIVES`` or ``"auto"``).
        offload: ``"cpu"``: keep the fp32 master shards and the optimizer states in host memory
            (page-locked for CUDA parameters) and run the optimizer there, as DeepSpeed's
            ``offload_optimizer: cpu``; ``step()`` copies the gradient shard to the host and the
            updated shard back. ``None`` (default): they live with the parameters.
        **optim_kwargs: passed to ``optimizer_class`` (lr, betas, weight_decay, ...).

    Usage (every rank)::

        opt = ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=2, lr=1e-3)
        loss = model(x).loss;  opt.scale_loss(loss).backward();  opt.step();  opt.zero_grad()

    Gradient accumulation over k micro-batches: run the first k-1 backward passes inside
    ``with opt.no_sync():`` (no communication), the k-th outside, then ``step()``.
    """

    def __init__(self, params, optimizer_class, stage: int = 1, process_group=None,
                 mixed_precision=None, *, bucket_cap_mb: float | None = None,
                 loss_scaler: DynamicLossScaler | bool | None = None,
                 collectives: str | None = None, offload: str | None = None, **optim_kwargs):
        if stage not in (1, 2):
            raise ValueError(f"ZeroOptimizer implements stages 1 and 2, got stage={stage!r} "
                             f"(stage 3 is ringcomm.training.zero.ZeroStage3)")
        _resolve_precision(mixed_precision)
        groups = _normalize_param_groups(params)
        knobs = read()
        cap_mb = _positive(_BUCKET_MB_ENV, knobs.zero_bucket_mb) if bucket_cap_mb is None \
            else float(bucket_cap_mb)
        if not cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb}")
        self._stage = stage
        self._core_init(process_group, mixed_precision, loss_scaler, collectives, offload, knobs)
        self.bucket_cap_bytes = cap_mb * _MB
        self._buckets: list[_Bucket] = []
        self._frozen: list[torch.Tensor] = []
        self._group_keys: list[list] = []
        spec = []
        key = 0
        with torch.no_grad():
            for g in groups:
                hp = {k: v for k, v in g.items() if k != "params"}
                keyed = list(zip(range(key, key + len(g["params"])), g["params"]))
                key += len(g["params"])
                trainable = [(k, p) for k, p in keyed if p.requires_grad]
                for _, p in keyed:
                    if not p.requires_grad:
                        self._frozen.append(p)
                        self._comm.broadcast(p.data)
                        if self.compute_dtype_override is not None and p.is_floating_point():
                            p.data = p.data.to(self.compute_dtype_override)
                flat_groups = [self._make_bucket(chunk) for chunk in self._chunks(trainable)]
                flat_groups = [b for b in flat_groups if b is not None]
                self._group_keys.append([k for k, _ in trainable
                                         if any(k in b.keys for b in flat_groups)])
                spec.append((hp, flat_groups))
        self._groups = self._buckets
        self._build_optimizer(optimizer_class, [s for s in spec if s[1]], optim_kwargs)
        self._group_keys = [k for k in self._group_keys if k]
        self._next_bucket = 0
        self._reduced = False
        self._hook_handles = []
        if stage == 2:
            ref = weakref.ref(self)
            for b in self._buckets:
                for i, p in enumerate(b.params):
                    self._hook_handles.append(p.register_post_accumulate_grad_hook(
                        _make_grad_ready_hook(ref, b.index, i)))

    def _chunks(self, trainable):
        """Buckets in reverse registration order (≈ backward order), split by dtype/device/cap;
        parameters inside a bucket in registration order."""
        chunks, cur, cur_bytes = [], [], 0
        for k, p in reversed(trainable):
            compute, _ = self._dtypes_for(p.dtype)
            nbytes = p.numel() * torch.empty((), dtype=compute).element_size()
            if cur and (p.dtype != cur[0][1].dtype or p.device != cur[0][1].device
                        or cur_bytes + nbytes > self.bucket_cap_bytes):
                chunks.append(cur[::-1])
                cur, cur_bytes = [], 0
            cur.append((k, p))
            cur_bytes += nbytes
        if cur:
            chunks.append(cur[::-1])
        return chunks

    def _make_bucket(self, chunk) -> _Bucket | None:
        keys = [k for k, _ in chunk]
        params = [p for _, p in chunk]
        compute, master = self._dtypes_for(params[0].dtype)
        b = _Bucket(len(self._buckets), params, keys, self.world_size, self.rank, compute,
                    master, params[0].device)
        if b.layout.numel == 0:
            return None
        flat = b.layout.flatten([p.detach() for p in params], master, b.device)
        self._comm.broadcast(flat)  # every replica starts from rank 0's parameters
        b.init_master(flat, self.offload)
        b.flat_param = flat if compute == master else flat.to(compute)
        for p, view in zip(params, b.layout.unflatten(b.flat_param)):
            p.data = view
        self._buckets.append(b)
        return b

    @property
    def stage(self) -> int:
        return self._stage

    @property
    def compute_dtype(self) -> torch.dtype:
        return self._buckets[0].compute_dtype

    # -- stage 2: reduce-scatter during backward -------------------------------------------------
    def _grad_ready(self, bucket_index: int, param_index: int) -> None:
        if not self._sync_grads:
            return  # no_sync(): the gradient stays accumulated in .grad
        self._buckets[bucket_index].ready.add(param_index)
        n = len(self._buckets)
        while self._next_bucket < n:
            b = self._buckets[self._next_bucket]
            if len(b.ready) < len(b.params):
                break
            self._reduce_bucket(b)
            self._next_bucket += 1
        if self._next_bucket == n:
            self._next_bucket = 0  # round complete: every bucket issued once

    def _flatten_grads(self, b: _Bucket, release: bool) -> torch.Tensor:
        flat = torch.zeros(b.layout.padded_numel, dtype=b.compute_dtype, device=b.device)
        for p, view in zip(b.params, b.layout.unflatten(flat)):
            if p.grad is not None:
                view.copy_(p.grad)
                if release:
                    p.grad = None
        return flat

    def _reduce_bucket(self, b: _Bucket) -> None:
        flat = self._flatten_grads(b, release=True)  # this rank now keeps only its shard
        b.ready.clear()
        self._issue_reduce(b, flat, replace=False)

    def _finish_reduction(self) -> None:
        if self._stage == 1:
            if not self._reduced:
                for b in self._buckets:
                    self._issue_reduce(b, self._flatten_grads(b, release=False), replace=True)
                self._wait_pending()
                self._reduced = True
            return
        # Stage 2: issue, in bucket order, every bucket still holding local gradients: buckets
        # that backward left incomplete (parameters without a gradient count as zero) and
        # buckets that received gradients after they were issued (e.g. a parameter used again
        # in a nested backward). A bucket in which no parameter got a gradient is not reduced
        # (its master shard is skipped by the optimizer, as torch skips a parameter whose grad
        # is None). All ranks take the same decisions when they run the same graph.
        for b in self._buckets:
            if any(p.grad is not None for p in b.params):
                self._reduce_bucket(b)
            b.ready.clear()
        self._next_bucket = 0
        self._wait_pending()

    def _after_step(self) -> None:
        if self._stage == 1:  # the local .grad stays the source of truth until zero_grad()
            for b in self._buckets:
                b.grad_shard = None
            self._reduced = False

    def _publish_params(self) -> None:
        works, keep = [], []
        for b in self._buckets:
            # (offload: the host -> device copy of the updated shard)
            src = b.master.detach().to(device=b.device, dtype=b.compute_dtype)
            keep.append(src)
            works.append(self._comm.all_gather(b.flat_param, src, async_op=True))
        for w in works:
            w.wait()

    def _load_compute_params(self, g: _Bucket, full_master: torch.Tensor) -> None:
        g.flat_param.copy_(full_master)

    def _clear_grads(self, set_to_none: bool) -> None:
        for b in self._buckets:
            for p in b.params:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()
            b.ready.clear()
            if set_to_none:
                b.grad_shard = None
            elif b.grad_shard is not None:
                b.grad_shard.zero_()
        self._next_bucket = 0
        self._reduced = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) the local gradients and this rank's gradient shards."""
        self._wait_pending()
        self._clear_grads(set_to_none)
        self._prepared = None

    # -- checkpoints / memory ------------------------------------------------------------------
    def state_dict(self) -> dict | None:
        """Collective. Rank 0 gets the full checkpoint (fp32 master params and unsharded states
        keyed by parameter index); the other ranks get ``None``."""
        return self._gather_checkpoint("ZeroOptimizer")

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a full checkpoint (from any world size; pass it on every rank). The model's
        parameters are set from its fp32 master parameters."""
        self._load_checkpoint(state_dict)

    def memory_breakdown(self) -> dict:
        """Bytes held by this rank: ``params`` (compute-dtype parameters), ``grads`` (local
        ``.grad`` + gradient shards + reductions in flight), ``optimizer_states`` (e.g. Adam's
        exp_avg/exp_avg_sq/step), ``master_weights`` (fp32 shards), ``total``, and
        ``offloaded`` (the part of the total in host memory under ``offload="cpu"``)."""
        params = sum(_nbytes(b.flat_param) for b in self._buckets)
        params += sum(_nbytes(p) for p in self._frozen)
        grads = sum(_nbytes(p.grad) for b in self._buckets for p in b.params)
        grads += sum(_nbytes(b.grad_shard) for b in self._buckets)
        grads += sum(_nbytes(out) + _nbytes(flat) for _, _, out, flat, _ in self._pending)
        states = self._optimizer_state_bytes()[0]
        master = sum(_nbytes(b.master) for b in self._buckets)
        out = {"params": params, "grads": grads, "optimizer_states": states,
               "master_weights": master}
        out["total"] = sum(out.values())
        out["offloaded"] = states + master if self.offload else 0   # of the total, on the host
        out["num_parameters"] = sum(b.layout.numel for b in self._buckets)
        out["padding_elements"] = sum(b.layout.pad for b in self._buckets)
        return out

    def remove_hooks(self) -> None:
        for h in self._hook_handles:
            h.remove()
        self._hook_handles = []

    def __repr__(self) -> str:
        return (f"ZeroOptimizer(stage={self._stage}, world_size={self.world_size}, "
                f"buckets={len(self._buckets)}, mixed_precision={self.mixed_precision!r}, "
                f"optimizer={type(self.optimizer).__name__})")


def _make_grad_ready_hook(ref, bucket_index: int, param_index: int):
    def hook(_param):
        owner = ref()
        if owner is not None:
            owner._grad_ready(bucket_index, param_index)
    return hook
