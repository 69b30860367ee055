"""ZeRO (Zero Redundancy Optimizer) stages 1, 2 and 3, written against ``torch.distributed`` calls.

The memory model is the seeds' (ZeRO paper, seed 000 / seed 001): mixed-precision Adam holds
2 bytes of 16-bit parameters + 2 bytes of 16-bit gradients + 12 bytes of fp32 optimizer state
(master weights 4, momentum 4, variance 4) per parameter, and ZeRO partitions them N ways:

=====  ===========================  ==================  ====================================
stage  partitioned                  bytes per device    class
=====  ===========================  ==================  ====================================
1      optimizer states             4Ψ + 12Ψ/N          ``ZeroOptimizer(..., stage=1)``
2      + gradients                  2Ψ + 14Ψ/N          ``ZeroOptimizer(..., stage=2)``
3      + parameters (= FSDP)        16Ψ/N               ``ZeroStage3(module, ...)``
=====  ===========================  ==================  ====================================

``memory_breakdown()`` on either class reports what this rank actually holds, to print beside
:func:`ringcomm.memory.zero_memory_per_device`.

Only ``dist.reduce_scatter_single`` / ``reduce_scatter_tensor``, ``dist.all_gather_single`` /
``all_gather_into_tensor``, ``dist.all_reduce`` and ``dist.broadcast`` are used (SUM only, never
AVG), so any backend works, ``"gloo"`` and ``"ringcomm"`` included. If a backend raises for a
reduce-scatter or all-gather (an unsupported dtype, say), the call is replaced, for the rest of
the run, by an exact ``all_reduce``-based fallback (``_Collectives``); the environment variable
``RINGCOMM_ZERO_COLLECTIVES`` = ``auto`` (default) | ``native`` (never fall back) | ``fallback``
(always) selects the policy, and so does the ``collectives=`` argument.

Flat-buffer layout (every stage)
--------------------------------
Parameters are grouped into *flat groups*: a stage-1/2 *bucket* (parameters of one param group,
one dtype and device, at most ``bucket_cap_mb``; with the default cap a small model is ONE flat
buffer per param group) or a stage-3 *unit* (the direct parameters of one leaf module). A group's
parameters are laid end to end in registration order (``offsets[i]``), then padded with zeros to
``padded = ceil(numel / N) * N`` elements, so that it splits into N equal shards of
``S = padded / N`` elements; rank r owns ``[r*S, (r+1)*S)``. The padding (at most N-1 elements
per group) is always zero: its gradient is zero, so Adam keeps it at zero, and it is dropped when
a checkpoint is written. Rank r keeps, per group:

* ``master``: the fp32 master copy of its shard (an ``nn.Parameter`` of S elements): this is
  what ``optimizer_class`` steps, so its Adam states are S elements too (1/N of the model);
* ``grad_shard``: the SUM over ranks of the gradient of its shard, in the compute dtype (2 bytes
  per element under mixed precision, as in the 2+2+12 budget), still multiplied by the loss
  scale; ``step()`` divides by N and by the loss scale in fp32 just before the update.

Stage 1 keeps full parameters (the model's parameters become views into one compute-dtype flat
buffer per bucket) and full local gradients (ordinary ``.grad``); ``step()`` reduce-scatters each
bucket's gradients into the shard, steps the master shard and all-gathers the updated shards
straight into the flat parameter buffer. Stage 2 reduce-scatters during backward: a
``register_post_accumulate_grad_hook`` per parameter marks it ready; when a bucket is complete
(and all the buckets before it have been issued: buckets are issued in a fixed order so that all
ranks issue the same collectives in the same order) its gradients are copied into a temporary
flat buffer, their ``.grad`` set to ``None`` at once, and an asynchronous reduce-scatter is issued
(at most ``RINGCOMM_ZERO_MAX_INFLIGHT`` in flight). Each rank therefore holds ~1/N of the
gradients once backward is over. Buckets left incomplete by backward (some parameter without a
gradient) are reduced at ``step()`` with zeros for the missing gradients (treated as zero, as
DeepSpeed does; Adam still decays them); a bucket in which no parameter got a gradient is not
reduced and its master shard is skipped by the optimizer. Every rank must produce gradients for
the same parameters in the same order, as with DDP.

Stage 3 (``ZeroStage3``): hooks and their order invariants
---------------------------------------------------------
Each unit's parameters are removed from their module; the unit keeps its shard (``S`` elements in
the compute dtype; in fp32 it *is* the master) and a ``flat_full`` ``nn.Parameter`` of ``padded``
elements whose storage is resized to 0 bytes whenever the full weights are not needed.

1. *Forward pre-hook* (module): all-gather the shards into ``flat_full``'s storage (resized back
   to ``padded`` elements), then set the module's attributes (``weight``, ``bias``, ...) to views
   of ``flat_full`` made with ``torch.split`` (so autograd routes every view's gradient to
   ``flat_full`` through one ``SplitBackward``, i.e. one concatenation).
2. *Forward post-hook* (module): the attributes are set back to ``None`` and the storage is
   resized to 0 (unless a backward of this unit is in progress: recomputation), so between layers
   a rank holds only shards. The views that autograd saved for backward keep referencing the
   storage object, not its bytes. A multi-grad hook (``register_multi_grad_hook(mode="any")``)
   is put on the outputs that require grad.
3. *Pre-backward* (that hook): it fires when the gradient of the module's output has been
   computed, i.e. before any backward op of the module runs: the storage is re-gathered (no-op if
   still full), which restores the saved views' bytes. The collective writes through
   ``flat_full.data`` (a separate version counter), so autograd's saved-tensor version checks are
   not tripped.
4. *Post-backward* (``register_post_accumulate_grad_hook`` on ``flat_full``): it fires after all
   contributions to the unit's gradient have been summed, i.e. after the last backward op that
   needs the full weights; the storage is freed, ``flat_full.grad`` is reduce-scattered
   (asynchronously) into the grad shard and set to ``None``.

Collectives are issued in autograd's execution order, which is the same on every rank when every
rank runs the same graph (same modules, same order, no data-dependent control flow). A reentrant
recomputation (:func:`ringcomm.recompute.checkpoint`) fits: its no-grad forward gathers and frees;
its recomputation in backward gathers again (step 1), frees (2), and its nested backward runs 3
and 4. A parameter may belong to one module only (no tied weights), every parameter must require
grad, and a module's parameters must only be used inside that module's forward.

Mixed precision and loss scaling
--------------------------------
``mixed_precision="bf16"`` or ``"fp16"``: parameters and gradients are bf16/fp16 (compute and
communication), master weights and optimizer states fp32. ``ZeroOptimizer`` changes the model's
parameters' dtype in place (feed it inputs of ``compute_dtype``); ``ZeroStage3`` casts floating
inputs for you. With fp16 a :class:`DynamicLossScaler` is used by default: ``opt.scale_loss(loss)``
(or ``loss * opt.loss_scale``) before ``backward()``; ``step()`` checks every rank's gradient shard
for inf/NaN (one all-reduce of a flag), skips the update and multiplies the scale by
``backoff_factor`` (0.5) on overflow, and multiplies it by ``growth_factor`` (2) after
``growth_interval`` consecutive good steps.

Checkpoints
-----------
``state_dict()`` is collective: every rank must call it; rank 0 receives the full checkpoint (and
the other ranks ``None``): fp32 master parameters and unsharded optimizer states per parameter
(``ZeroOptimizer``: keyed by parameter index as in ``torch.optim``; ``ZeroStage3``: by qualified
parameter name), the param groups' hyper-parameters and the loss scaler. ``load_state_dict(sd)``
is given the full checkpoint on every rank (e.g. ``torch.load`` on each), on ANY world size: each
rank slices its own shards out of it, without communication.
"""
from __future__ import annotations

import copy
import warnings
import weakref
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.graph import register_multi_grad_hook
from torch.utils._pytree import tree_flatten, tree_unflatten

from .config import knob

__all__ = ["ZeroOptimizer", "ZeroStage3", "FullyShardedModule", "DynamicLossScaler",
           "CHECKPOINT_FORMAT"]

CHECKPOINT_FORMAT = "ringcomm.zero/1"

_MB = 1024 * 1024
#: Knob: bucket cap (MiB of compute-dtype gradients) of ZeroOptimizer, default 25 (as torch DDP).
_BUCKET_MB_ENV = "RINGCOMM_ZERO_BUCKET_MB"
#: Knob: how many asynchronous gradient reduce-scatters may be in flight during backward.
_MAX_INFLIGHT_ENV = "RINGCOMM_ZERO_MAX_INFLIGHT"
#: Knob: collective policy, "auto" | "native" | "fallback" (see module docstring).
_COLLECTIVES_ENV = "RINGCOMM_ZERO_COLLECTIVES"

_PRECISIONS = {
    None: None, "fp32": None, "float32": None,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, torch.bfloat16: torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    torch.float16: torch.float16,
}

# torch >= 2.10 renamed the "into tensor" collectives; the old names warn. Same semantics.
_reduce_scatter_fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather_fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _resolve_precision(mixed_precision) -> torch.dtype | None:
    try:
        return _PRECISIONS[mixed_precision]
    except (KeyError, TypeError):
        raise ValueError(f"mixed_precision must be None, 'bf16' or 'fp16', got "
                         f"{mixed_precision!r}") from None


def _env_float(name: str) -> float:
    value = float(knob(name))
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def _require_dist() -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("ringcomm.zero needs an initialised torch.distributed process group "
                           "(call torch.distributed.init_process_group first)")


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _storage_nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


# ---------------------------------------------------------------------------------------------
# collectives with an exact fallback
# ---------------------------------------------------------------------------------------------

class _Work:
    """A collective in flight: ``wait()`` waits for it and then runs ``finish`` (once). A
    synchronous call is passed ``work=None`` and finishes at once."""

    __slots__ = ("_work", "_finish", "_done")

    def __init__(self, work, finish: Callable[[], None] | None = None):
        self._work = work
        self._finish = finish
        self._done = False
        if work is None:
            self.wait()

    def wait(self) -> None:
        if self._done:
            return
        if self._work is not None:
            self._work.wait()
        if self._finish is not None:
            self._finish()
        self._done = True


class _Collectives:
    """The four collectives ZeRO needs, on one process group, with ranks and the global rank of
    the group's rank 0. ``reduce_scatter_sum`` and ``all_gather`` try the backend's native call;
    if it raises (and the policy is ``auto``) they switch, for good, to an exact fallback built
    on ``all_reduce`` (a sum with zeros is exact, so the all-gather fallback is bitwise equal)."""

    # What "the backend does not support this call" raises: c10d errors are RuntimeError
    # subclasses; ringcomm.UnsupportedError is a TypeError.
    _CATCH = (RuntimeError, NotImplementedError, TypeError)

    def __init__(self, group, policy: str | None):
        policy = policy if policy is not None else knob(_COLLECTIVES_ENV)
        if policy not in ("auto", "native", "fallback"):
            raise ValueError(f"collectives policy must be 'auto', 'native' or 'fallback', got "
                             f"{policy!r} (argument collectives= or ${_COLLECTIVES_ENV})")
        self.group = group
        self.policy = policy
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if self.rank < 0:
            raise ValueError("ringcomm.zero: this process is not a member of process_group")
        self.src = dist.get_global_rank(group if group is not None else dist.group.WORLD, 0)
        self.native = {"reduce_scatter": policy != "fallback", "all_gather": policy != "fallback"}
        #: which implementations actually ran, per op ("native" / "fallback"): for tests.
        self.used: dict[str, set] = {"reduce_scatter": set(), "all_gather": set()}

    def _give_up_native(self, op: str, err: BaseException) -> None:
        if self.policy == "native":
            raise err
        backend = dist.get_backend(self.group)
        warnings.warn(f"ringcomm.zero: backend {backend!r} raised {type(err).__name__}: {err} "
                      f"for {op}; using the all_reduce-based fallback for the rest of this run",
                      RuntimeWarning, stacklevel=3)
        self.native[op] = False

    def reduce_scatter_sum(self, out: torch.Tensor, inp: torch.Tensor,
                           async_op: bool = False) -> _Work:
        """``out`` (S elements) = this rank's slice of the SUM of every rank's ``inp`` (N*S).
        The fallback reduces ``inp`` in place."""
        if self.native["reduce_scatter"]:
            try:
                work = _reduce_scatter_fn(out, inp, op=dist.ReduceOp.SUM, group=self.group,
                                          async_op=async_op)
                self.used["reduce_scatter"].add("native")
                return _Work(work)
            except self._CATCH as e:
                self._give_up_native("reduce_scatter", e)
        return self.reduce_scatter_sum_fallback(out, inp, async_op)

    def reduce_scatter_sum_fallback(self, out, inp, async_op=False) -> _Work:
        """Fallback: all_reduce(SUM) of the whole input, then keep this rank's slice."""
        self.used["reduce_scatter"].add("fallback")
        lo = self.rank * out.numel()
        work = dist.all_reduce(inp, op=dist.ReduceOp.SUM, group=self.group, async_op=async_op)
        return _Work(work if async_op else None, lambda: out.copy_(inp[lo:lo + out.numel()]))

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool = False) -> _Work:
        """``out`` (N*S elements) = the concatenation of every rank's ``inp`` (S) in rank order."""
        if self.native["all_gather"]:
            try:
                work = _all_gather_fn(out, inp, group=self.group, async_op=async_op)
                self.used["all_gather"].add("native")
                return _Work(work)
            except self._CATCH as e:
                self._give_up_native("all_gather", e)
        return self.all_gather_fallback(out, inp, async_op)

    def all_gather_fallback(self, out, inp, async_op=False) -> _Work:
        """Fallback: zeros everywhere but this rank's slice, then all_reduce(SUM): exact."""
        self.used["all_gather"].add("fallback")
        lo = self.rank * inp.numel()
        out.zero_()
        out[lo:lo + inp.numel()].copy_(inp)
        work = dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group, async_op=async_op)
        return _Work(work if async_op else None)

    def all_reduce_sum(self, t: torch.Tensor) -> None:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)

    def broadcast(self, t: torch.Tensor) -> None:
        """Broadcast from the group's rank 0."""
        dist.broadcast(t, src=self.src, group=self.group)


# ---------------------------------------------------------------------------------------------
# flat layout, flat groups, loss scaler
# ---------------------------------------------------------------------------------------------

class _FlatLayout:
    """Parameters laid end to end, padded with zeros to a multiple of ``world_size``."""

    def __init__(self, shapes: Iterable[torch.Size], world_size: int):
        self.shapes = [torch.Size(s) for s in shapes]
        self.numels = [s.numel() for s in self.shapes]
        self.offsets = []
        total = 0
        for n in self.numels:
            self.offsets.append(total)
            total += n
        self.numel = total
        self.padded_numel = -(-total // world_size) * world_size
        self.shard_numel = self.padded_numel // world_size
        self.pad = self.padded_numel - total

    def shard_range(self, rank: int) -> tuple[int, int]:
        return rank * self.shard_numel, (rank + 1) * self.shard_numel

    @property
    def split_sizes(self) -> list[int]:
        return self.numels + ([self.pad] if self.pad else [])

    def unflatten(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [flat[o:o + n].view(s) for o, n, s in zip(self.offsets, self.numels, self.shapes)]

    def flatten(self, tensors, dtype, device) -> torch.Tensor:
        flat = torch.zeros(self.padded_numel, dtype=dtype, device=device)
        for view, t in zip(self.unflatten(flat), tensors):
            if t is not None:
                view.copy_(t.reshape(view.shape))
        return flat


class _FlatGroup:
    """State common to a stage-1/2 bucket and a stage-3 unit (see the module docstring)."""

    def __init__(self, keys: list, shapes: list, world_size: int, rank: int,
                 compute_dtype: torch.dtype, master_dtype: torch.dtype, device):
        self.keys = keys
        self.layout = _FlatLayout(shapes, world_size)
        self.lo, self.hi = self.layout.shard_range(rank)
        self.compute_dtype = compute_dtype
        self.master_dtype = master_dtype
        self.device = device
        self.master: nn.Parameter | None = None
        self.grad_shard: torch.Tensor | None = None

    def init_master(self, flat_full_master: torch.Tensor) -> None:
        self.master = nn.Parameter(flat_full_master[self.lo:self.hi].clone())

    def add_grad(self, reduced: torch.Tensor) -> None:
        if self.grad_shard is None:
            self.grad_shard = reduced
        else:
            self.grad_shard.add_(reduced)


class DynamicLossScaler:
    """Dynamic loss scaling for fp16 (as ``torch.amp.GradScaler``, without its tensors).

    ``scale`` starts at ``init_scale`` (2**15 by default: 2**16 overflows an fp16 loss's own
    gradient); an overflow multiplies it by ``backoff_factor`` (never below ``min_scale``) and
    the step is skipped; ``growth_interval`` consecutive good steps multiply it by
    ``growth_factor`` (never above ``max_scale``).
    """

    def __init__(self, init_scale: float = 2.0 ** 15, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 min_scale: float = 1.0, max_scale: float = 2.0 ** 24):
        if not init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {init_scale}")
        if not growth_factor > 1:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor}")
        if not 0 < backoff_factor < 1:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor}")
        if int(growth_interval) < 1:
            raise ValueError(f"growth_interval must be >= 1, got {growth_interval}")
        self.scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.min_scale = float(min_scale)
        self.max_scale = float(max_scale)
        self.good_steps = 0

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale = min(self.scale * self.growth_factor, self.max_scale)
            self.good_steps = 0

    def state_dict(self) -> dict:
        return dict(vars(self))

    def load_state_dict(self, sd: dict) -> None:
        for k, v in sd.items():
            if k in vars(self):
                setattr(self, k, v)

    def __repr__(self) -> str:
        return (f"DynamicLossScaler(scale={self.scale}, good_steps={self.good_steps}, "
                f"growth_interval={self.growth_interval})")


# ---------------------------------------------------------------------------------------------
# the part shared by every stage: optimizer on master shards, step, scaling, checkpoints
# ---------------------------------------------------------------------------------------------

class _ZeroCore:
    """Mixin. Subclasses set ``self._groups`` (flat groups, in collective order), ``self._stage``,
    ``self._group_keys`` (param-group index -> its keys) and implement ``_finish_reduction``,
    ``_publish_params``, ``_load_compute_params`` and ``_clear_grads``."""

    def _core_init(self, process_group, mixed_precision, loss_scaler, collectives) -> None:
        self.compute_dtype_override = _resolve_precision(mixed_precision)
        self.mixed_precision = (None if self.compute_dtype_override is None else
                                {torch.bfloat16: "bf16", torch.float16: "fp16"}[
                                    self.compute_dtype_override])
        _require_dist()
        self.process_group = process_group
        self._comm = _Collectives(process_group, collectives)
        self.world_size = self._comm.world_size
        self.rank = self._comm.rank
        if loss_scaler is None:
            loss_scaler = DynamicLossScaler() if self.mixed_precision == "fp16" else None
        elif loss_scaler is False:
            loss_scaler = None
        elif not isinstance(loss_scaler, DynamicLossScaler):
            raise TypeError(f"loss_scaler must be a DynamicLossScaler, None or False, got "
                            f"{type(loss_scaler).__name__}")
        self._scaler: DynamicLossScaler | None = loss_scaler
        self._pending: list = []
        self._prepared: bool | None = None
        self._max_inflight = int(_env_float(_MAX_INFLIGHT_ENV))
        self.last_step_skipped = False
        self.skipped_steps = 0

    def _dtypes_for(self, param_dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
        """(compute dtype, master dtype) for parameters of ``param_dtype``."""
        if not param_dtype.is_floating_point:
            raise TypeError(f"ringcomm.zero shards floating-point parameters only, got "
                            f"{param_dtype}")
        if self.compute_dtype_override is None:
            return param_dtype, param_dtype
        return self.compute_dtype_override, torch.float32

    def _build_optimizer(self, optimizer_class, spec: list, optim_kwargs: dict) -> None:
        """``spec``: list of (hyper-parameters, flat groups) per param group."""
        if not callable(optimizer_class):
            raise TypeError(f"optimizer_class must be a torch.optim.Optimizer class, got "
                            f"{optimizer_class!r}")
        groups = [dict(hp, params=[g.master for g in flat]) for hp, flat in spec if flat]
        if not groups:
            raise ValueError("ringcomm.zero: no parameter that requires grad to optimize")
        self.optimizer = optimizer_class(groups, **optim_kwargs)
        self._inner_groups = [[g for g in flat] for _, flat in spec if flat]

    # -- public helpers ------------------------------------------------------------------------
    @property
    def param_groups(self) -> list:
        """The inner optimizer's param groups (hyper-parameters; attach LR schedulers to
        ``self.optimizer``)."""
        return self.optimizer.param_groups

    @property
    def loss_scale(self) -> float:
        return self._scaler.scale if self._scaler is not None else 1.0

    @property
    def loss_scaler(self) -> DynamicLossScaler | None:
        return self._scaler

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` (in fp32) times the current loss scale; call ``backward()`` on the result."""
        if self._scaler is None:
            return loss
        return loss.float() * self._scaler.scale

    @property
    def collectives_used(self) -> dict:
        """Which implementation ran per collective ({"reduce_scatter": {"native"}, ...})."""
        return {k: set(v) for k, v in self._comm.used.items()}

    # -- gradient reduction ----------------------------------------------------------------------
    def _issue_reduce(self, group: _FlatGroup, flat_grad: torch.Tensor, replace: bool) -> None:
        """Reduce-scatter ``flat_grad`` asynchronously into ``group``'s grad shard (replace or
        accumulate when it completes); keep at most ``max_inflight`` in flight."""
        out = torch.empty(group.layout.shard_numel, dtype=flat_grad.dtype, device=flat_grad.device)
        work = self._comm.reduce_scatter_sum(out, flat_grad, async_op=True)
        self._pending.append((work, group, out, flat_grad, replace))
        while len(self._pending) > self._max_inflight:
            self._complete_oldest()

    def _complete_oldest(self) -> None:
        work, group, out, _flat, replace = self._pending.pop(0)
        work.wait()
        if replace:
            group.grad_shard = out
        else:
            group.add_grad(out)

    def _wait_pending(self) -> None:
        while self._pending:
            self._complete_oldest()

    def _prepare_grads(self) -> bool:
        """Finish the reduction, check for overflow (loss scaling), and set every master shard's
        fp32 ``.grad`` = grad_shard / world_size / loss_scale. Idempotent until ``step()``.
        Returns ``found_inf`` (always False without a loss scaler)."""
        if self._prepared is not None:
            return self._prepared
        self._finish_reduction()
        found_inf = False
        if self._scaler is not None:
            flag = torch.zeros(1, dtype=torch.float32)
            for g in self._groups:
                if g.grad_shard is not None and not bool(torch.isfinite(g.grad_shard).all()):
                    flag.fill_(1.0)
                    break
            self._comm.all_reduce_sum(flag)  # any rank's overflow is every rank's overflow
            found_inf = bool(flag.item() > 0)
        if not found_inf:
            scale = self.loss_scale
            for g in self._groups:
                if g.grad_shard is None:
                    g.master.grad = None
                    continue
                grad = g.grad_shard.to(g.master_dtype, copy=True)
                grad.div_(self.world_size)
                if scale != 1.0:
                    grad.div_(scale)
                g.master.grad = grad
        self._prepared = found_inf
        return found_inf

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the (averaged, unscaled) gradient's global norm to ``max_norm`` before the next
        ``step()``; returns the norm (inf on an overflowed fp16 step). Collective."""
        if norm_type not in (2.0, float("inf")):
            raise ValueError(f"norm_type must be 2.0 or inf, got {norm_type}")
        if self._prepare_grads():
            return torch.tensor(float("inf"))
        grads = [g.master.grad for g in self._groups if g.master.grad is not None]
        local = torch.zeros(1, dtype=torch.float64)
        if norm_type == 2.0:
            for t in grads:
                local += t.double().pow(2).sum()
            self._comm.all_reduce_sum(local)
            total = local.sqrt()
        else:
            for t in grads:
                local = torch.maximum(local, t.double().abs().max().reshape(1))
            dist.all_reduce(local, op=dist.ReduceOp.MAX, group=self.process_group)
            total = local
        total = total.float().reshape(())
        coef = float(max_norm) / (float(total) + 1e-6)
        if coef < 1.0:
            for t in grads:
                t.mul_(coef)
        return total

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """Reduce the gradients (if not done yet), update this rank's master shards with the
        inner optimizer, and publish the new parameters. With a loss scaler, a step whose
        gradients overflowed on any rank is skipped (``last_step_skipped``) and the scale backs
        off. Collective: every rank must call it."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = self._prepare_grads()
        if self._scaler is not None:
            self._scaler.update(found_inf)
        self.last_step_skipped = found_inf
        if found_inf:
            self.skipped_steps += 1
            for g in self._groups:  # the overflowed gradients are useless: drop them
                g.grad_shard = None
        else:
            self.optimizer.step()
            self._publish_params()
        for g in self._groups:
            g.master.grad = None
        self._after_step()
        self._prepared = None
        return loss

    def _after_step(self) -> None:
        pass

    # -- memory ---------------------------------------------------------------------------------
    def _optimizer_state_bytes(self) -> tuple[int, int]:
        """(bytes, elements) of the inner optimizer's state tensors on this rank."""
        nbytes = numel = 0
        for st in self.optimizer.state.values():
            for v in st.values():
                if torch.is_tensor(v):
                    nbytes += _nbytes(v)
                    numel += v.numel()
        return nbytes, numel

    def optimizer_state_numel(self) -> int:
        """Elements in this rank's optimizer state tensors (exp_avg, exp_avg_sq, step, ...)."""
        return self._optimizer_state_bytes()[1]

    @torch.no_grad()
    def full_parameters(self) -> dict:
        """Collective: every rank gets {key: full master parameter} (fp32 under mixed
        precision); keys are parameter indices (ZeroOptimizer) or qualified names (ZeroStage3)."""
        self._wait_pending()
        out = {}
        for g in self._groups:
            full = torch.empty(g.layout.padded_numel, dtype=g.master_dtype, device=g.device)
            self._comm.all_gather(full, g.master.detach())
            for k, v in zip(g.keys, g.layout.unflatten(full)):
                out[k] = v.clone()
        return out

    # -- checkpoints ---------------------------------------------------------------------------
    def _gather_checkpoint(self, kind: str) -> dict | None:
        """Collective: rank 0 gets {"params", "state", "param_groups", ...} (full, unsharded)."""
        self._wait_pending()
        root = self.rank == 0
        params_out: dict = {}
        state_out: dict = {}
        sharded_keys: set = set()
        for g in self._groups:
            full = torch.empty(g.layout.padded_numel, dtype=g.master_dtype, device=g.device)
            self._comm.all_gather(full, g.master.detach())
            if root:
                for key, view in zip(g.keys, g.layout.unflatten(full)):
                    params_out[key] = view.clone()
            st = self.optimizer.state.get(g.master, {})
            for name in sorted(st):
                value = st[name]
                if torch.is_tensor(value) and value.dim() == 1 and \
                        value.numel() == g.layout.shard_numel:
                    sharded_keys.add(name)
                    full_v = torch.empty(g.layout.padded_numel, dtype=value.dtype,
                                         device=value.device)
                    self._comm.all_gather(full_v, value.detach().contiguous())
                    if root:
                        for key, view in zip(g.keys, g.layout.unflatten(full_v)):
                            state_out.setdefault(key, {})[name] = view.clone()
                elif torch.is_tensor(value) and value.dim() != 0:
                    raise TypeError(f"ringcomm.zero: optimizer state {name!r} has shape "
                                    f"{tuple(value.shape)}; only elementwise (shape of the "
                                    f"shard) and scalar states can be checkpointed")
                elif root:  # a scalar, identical on every rank (e.g. Adam's "step")
                    for key in g.keys:
                        state_out.setdefault(key, {})[name] = (
                            value.detach().clone() if torch.is_tensor(value)
                            else copy.deepcopy(value))
        if not root:
            return None
        param_groups = []
        for keys, inner in zip(self._group_keys, self.optimizer.param_groups):
            hp = {k: copy.deepcopy(v) for k, v in inner.items() if k != "params"}
            hp["params"] = list(keys)
            param_groups.append(hp)
        return {
            "format": CHECKPOINT_FORMAT,
            "kind": kind,
            "stage": self._stage,
            "world_size": self.world_size,
            "mixed_precision": self.mixed_precision,
            "params": params_out,
            "state": state_out,
            "sharded_state_keys": sorted(sharded_keys),
            "param_groups": param_groups,
            "loss_scaler": None if self._scaler is None else self._scaler.state_dict(),
            "skipped_steps": self.skipped_steps,
        }

    @torch.no_grad()
    def _load_checkpoint(self, sd: dict) -> None:
        """Every rank passes the full checkpoint; each slices its shards (no communication)."""
        if not isinstance(sd, dict) or sd.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"not a ringcomm.zero checkpoint (expected format "
                             f"{CHECKPOINT_FORMAT!r}); every rank must pass the full checkpoint "
                             f"returned by state_dict() on rank 0")
        self._wait_pending()
        params = sd["params"]
        expected = [k for keys in self._group_keys for k in keys]
        missing = [k for k in expected if k not in params]
        unexpected = [k for k in params if k not in set(expected)]
        if missing or unexpected:
            raise ValueError(f"checkpoint does not match: missing parameters {missing[:10]}, "
                             f"unexpected {unexpected[:10]}")
        if len(sd["param_groups"]) != len(self._group_keys):
            raise ValueError(f"checkpoint has {len(sd['param_groups'])} param groups, this "
                             f"optimizer {len(self._group_keys)}")
        for i, (saved, keys) in enumerate(zip(sd["param_groups"], self._group_keys)):
            if set(saved["params"]) != set(keys):
                raise ValueError(f"param group {i} holds different parameters in the checkpoint")
        sharded_keys = set(sd.get("sharded_state_keys", ()))
        saved_state = sd.get("state", {})
        inner_state: dict = {}
        index = 0
        for flat in self._inner_groups:
            for g in flat:
                for key, shape in zip(g.keys, g.layout.shapes):
                    if tuple(params[key].shape) != tuple(shape):
                        raise ValueError(f"parameter {key!r}: checkpoint shape "
                                         f"{tuple(params[key].shape)} != {tuple(shape)}")
                full = g.layout.flatten([params[k] for k in g.keys], g.master_dtype, g.device)
                g.master.copy_(full[g.lo:g.hi])
                self._load_compute_params(g, full)
                per_param = [saved_state.get(k) for k in g.keys]
                names = sorted({n for s in per_param if s for n in s})
                st = {}
                for name in names:
                    if name in sharded_keys:
                        ref = next(s[name] for s in per_param if s and name in s)
                        flat_v = g.layout.flatten(
                            [s[name] if s and name in s else None for s in per_param],
                            ref.dtype, g.device)
                        st[name] = flat_v[g.lo:g.hi].clone()
                    else:
                        value = next(s[name] for s in per_param if s and name in s)
                        st[name] = value.clone() if torch.is_tensor(value) else \
                            copy.deepcopy(value)
                if st:
                    inner_state[index] = st
                index += 1
        inner_groups = []
        index = 0
        for saved, flat in zip(sd["param_groups"], self._inner_groups):
            hp = {k: copy.deepcopy(v) for k, v in saved.items() if k != "params"}
            hp["params"] = list(range(index, index + len(flat)))
            index += len(flat)
            inner_groups.append(hp)
        self.optimizer.load_state_dict({"state": inner_state, "param_groups": inner_groups})
        if self._scaler is not None and sd.get("loss_scaler"):
            self._scaler.load_state_dict(sd["loss_scaler"])
        for g in self._groups:
            g.grad_shard = None
            g.master.grad = None
        self._clear_grads(set_to_none=True)
        self._prepared = None


# ---------------------------------------------------------------------------------------------
# stages 1 and 2
# ---------------------------------------------------------------------------------------------

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
        **optim_kwargs: passed to ``optimizer_class`` (lr, betas, weight_decay, ...).

    Usage (every rank)::

        opt = ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=2, lr=1e-3)
        loss = model(x).loss;  opt.scale_loss(loss).backward();  opt.step();  opt.zero_grad()
    """

    def __init__(self, params, optimizer_class, stage: int = 1, process_group=None,
                 mixed_precision=None, *, bucket_cap_mb: float | None = None,
                 loss_scaler: DynamicLossScaler | bool | None = None,
                 collectives: str | None = None, **optim_kwargs):
        if stage not in (1, 2):
            raise ValueError(f"ZeroOptimizer implements stages 1 and 2, got stage={stage!r} "
                             f"(stage 3 is ringcomm.zero.ZeroStage3)")
        _resolve_precision(mixed_precision)
        groups = _normalize_param_groups(params)
        cap_mb = _env_float(_BUCKET_MB_ENV) if bucket_cap_mb is None \
            else float(bucket_cap_mb)
        if not cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb}")
        self._stage = stage
        self._core_init(process_group, mixed_precision, loss_scaler, collectives)
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
        b.init_master(flat)
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
            src = b.master.detach()
            if b.compute_dtype != b.master_dtype:
                src = src.to(b.compute_dtype)
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
        exp_avg/exp_avg_sq/step), ``master_weights`` (fp32 shards) and ``total``."""
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


# ---------------------------------------------------------------------------------------------
# stage 3
# ---------------------------------------------------------------------------------------------

class _Unit(_FlatGroup):
    """A stage-3 flat group: the direct parameters of one module."""

    def __init__(self, module, prefix, names, params, world_size, rank, compute_dtype,
                 master_dtype, device):
        keys = [f"{prefix}.{n}" if prefix else n for n in names]
        super().__init__(keys, [p.shape for p in params], world_size, rank, compute_dtype,
                         master_dtype, device)
        self.module = module
        self.names = names
        self.shard: torch.Tensor | None = None       # compute dtype, S elements (is master in fp32)
        self.flat_full: nn.Parameter | None = None   # compute dtype, padded; storage 0 when freed
        self.in_backward = False

    @property
    def gathered(self) -> bool:
        return self.flat_full.untyped_storage().nbytes() > 0


class ZeroStage3(_ZeroCore, nn.Module):
    """ZeRO stage 3 / fully sharded data parallel: parameters, gradients and optimizer states
    are all partitioned; each leaf module's parameters are gathered just in time (see the module
    docstring for the hooks and their order invariants).

    Args:
        module: the model (identical structure on every rank); its parameters are broadcast
            from rank 0, sharded, and removed from their modules (``module.weight`` is ``None``
            outside that module's forward).
        optimizer_class, process_group, mixed_precision, loss_scaler, collectives,
            **optim_kwargs: as :class:`ZeroOptimizer`.
        cast_forward_inputs: under mixed precision, cast floating-point tensor arguments of
            ``forward`` to the compute dtype (default True).

    Usage (every rank)::

        model = ZeroStage3(net, torch.optim.AdamW, lr=1e-3)
        loss = loss_fn(model(x), y);  model.scale_loss(loss).backward();  model.step()
        model.zero_grad()
    """

    def __init__(self, module: nn.Module, optimizer_class, process_group=None,
                 mixed_precision=None, *, loss_scaler: DynamicLossScaler | bool | None = None,
                 collectives: str | None = None, cast_forward_inputs: bool = True,
                 **optim_kwargs):
        nn.Module.__init__(self)
        if not isinstance(module, nn.Module):
            raise TypeError(f"ZeroStage3 wraps an nn.Module, got {type(module).__name__}")
        _resolve_precision(mixed_precision)
        self._stage = 3
        self._core_init(process_group, mixed_precision, loss_scaler, collectives)
        self.cast_forward_inputs = cast_forward_inputs
        self.module = module
        self._units: list[_Unit] = []
        seen: dict[int, str] = {}
        for prefix, m in module.named_modules():
            names = [n for n, p in m._parameters.items() if p is not None]
            if not names:
                continue
            params = [m._parameters[n] for n in names]
            for n, p in zip(names, params):
                qual = f"{prefix}.{n}" if prefix else n
                if id(p) in seen:
                    raise ValueError(f"ZeroStage3: parameter {qual!r} is shared with "
                                     f"{seen[id(p)]!r}; shared (tied) parameters are not "
                                     f"supported")
                seen[id(p)] = qual
                if not p.requires_grad:
                    raise ValueError(f"ZeroStage3: parameter {qual!r} does not require grad; "
                                     f"frozen parameters are not supported")
                if p.dtype != params[0].dtype or p.device != params[0].device:
                    raise TypeError(f"ZeroStage3: the parameters of module {prefix!r} mix "
                                    f"dtypes or devices")
            self._units.append(self._make_unit(m, prefix, names, params))
        if not self._units:
            raise ValueError("ZeroStage3: the module has no parameters")
        with torch.no_grad():
            for b in module.buffers():
                self._comm.broadcast(b)
        self._groups = self._units
        self._group_keys = [[k for u in self._units for k in u.keys]]
        self._build_optimizer(optimizer_class, [({}, self._units)], optim_kwargs)
        ref = weakref.ref(self)
        self._hook_handles = []
        for u in self._units:
            self._hook_handles += [
                u.module.register_forward_pre_hook(_make_unit_hook(ref, u, "pre_forward")),
                u.module.register_forward_hook(_make_unit_hook(ref, u, "post_forward")),
                u.flat_full.register_post_accumulate_grad_hook(
                    _make_unit_hook(ref, u, "post_backward")),
            ]

    @torch.no_grad()
    def _make_unit(self, m, prefix, names, params) -> _Unit:
        compute, master = self._dtypes_for(params[0].dtype)
        u = _Unit(m, prefix, names, params, self.world_size, self.rank, compute, master,
                  params[0].device)
        flat = u.layout.flatten([p.detach() for p in params], master, u.device)
        self._comm.broadcast(flat)
        u.init_master(flat)
        u.shard = u.master.detach() if compute == master else u.master.detach().to(compute)
        u.flat_full = nn.Parameter(torch.empty(u.layout.padded_numel, dtype=compute,
                                               device=u.device))
        self._free(u)
        for n in names:
            del m._parameters[n]
            setattr(m, n, None)
        return u

    @property
    def stage(self) -> int:
        return 3

    @property
    def compute_dtype(self) -> torch.dtype:
        return self._units[0].compute_dtype

    # -- gather / free ---------------------------------------------------------------------------
    def _gather(self, u: _Unit) -> None:
        if u.gathered:
            return
        u.flat_full.untyped_storage().resize_(u.layout.padded_numel * u.flat_full.element_size())
        # .data: a separate version counter, so autograd's saved views are not "modified".
        self._comm.all_gather(u.flat_full.data, u.shard)

    @staticmethod
    def _free(u: _Unit) -> None:
        u.flat_full.untyped_storage().resize_(0)

    # -- hooks -----------------------------------------------------------------------------------
    def _pre_forward(self, u: _Unit, module, args) -> None:
        self._gather(u)
        views = torch.split(u.flat_full, u.layout.split_sizes)
        for n, v, shape in zip(u.names, views, u.layout.shapes):
            setattr(module, n, v.view(shape))

    def _post_forward(self, u: _Unit, module, args, output):
        for n in u.names:
            setattr(module, n, None)
        if not u.in_backward:  # in a recomputation inside backward the weights stay until used
            self._free(u)
        if not torch.is_grad_enabled():
            return None
        leaves, _ = tree_flatten(output)
        tensors = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
        if tensors:
            ref = weakref.ref(self)
            register_multi_grad_hook(tensors, _make_pre_backward_hook(ref, u), mode="any")
        return None

    def _pre_backward(self, u: _Unit) -> None:
        u.in_backward = True
        self._gather(u)

    def _post_backward(self, u: _Unit, param: nn.Parameter) -> None:
        grad = param.grad
        param.grad = None
        u.in_backward = False
        self._free(u)
        if grad is not None:
            self._issue_reduce(u, grad.contiguous().view(-1), replace=False)

    def forward(self, *args, **kwargs):
        for u in self._units:  # a backward that never reached a unit's parameters
            if u.in_backward:
                u.in_backward = False
                self._free(u)
        if self.cast_forward_inputs and self.compute_dtype_override is not None:
            dtype = self.compute_dtype_override

            def cast(x):
                return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
            leaves, spec = tree_flatten((args, kwargs))
            args, kwargs = tree_unflatten([cast(x) for x in leaves], spec)
        return self.module(*args, **kwargs)

    # -- optimizer side ----------------------------------------------------------------------------
    def _finish_reduction(self) -> None:
        self._wait_pending()

    def _publish_params(self) -> None:
        for u in self._units:
            if u.shard.data_ptr() != u.master.data_ptr():
                u.shard.copy_(u.master)

    def _load_compute_params(self, u: _Unit, full_master: torch.Tensor) -> None:
        if u.shard.data_ptr() != u.master.data_ptr():
            u.shard.copy_(u.master)

    def _clear_grads(self, set_to_none: bool) -> None:
        for u in self._units:
            u.flat_full.grad = None
            if set_to_none:
                u.grad_shard = None
            elif u.grad_shard is not None:
                u.grad_shard.zero_()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) this rank's gradient shards."""
        self._wait_pending()
        self._clear_grads(set_to_none)
        self._prepared = None

    def state_dict(self, *args, **kwargs) -> dict | None:  # noqa: D401 - see below
        """Collective. Rank 0 gets the full checkpoint: fp32 master parameters and unsharded
        optimizer states keyed by qualified parameter name, plus the module's buffers; the other
        ranks get ``None``. (ZeroStage3 must be the root module: no nn.Module arguments.)"""
        if args or kwargs:
            raise TypeError("ZeroStage3.state_dict() takes no arguments: it gathers the full "
                            "checkpoint (ZeroStage3 must be the root module)")
        sd = self._gather_checkpoint("ZeroStage3")
        if sd is not None:
            sd["buffers"] = {n: b.detach().clone() for n, b in self.module.named_buffers()}
        return sd

    def load_state_dict(self, state_dict: dict, strict: bool = True, assign: bool = False):
        """Load a full checkpoint (from any world size; pass it on every rank)."""
        self._load_checkpoint(state_dict)
        buffers = dict(self.module.named_buffers())
        with torch.no_grad():
            for n, b in state_dict.get("buffers", {}).items():
                if n in buffers:
                    buffers[n].copy_(b)
                elif strict:
                    raise ValueError(f"checkpoint buffer {n!r} not in the module")

    def memory_breakdown(self) -> dict:
        """Bytes held by this rank: ``params`` (compute-dtype shards + any gathered full weights,
        the latter also in ``gathered_params``), ``grads`` (shards + unreduced),
        ``optimizer_states``, ``master_weights`` (fp32 shards kept besides the compute shard; 0
        in fp32 where the shard is the master), ``total``."""
        shard = sum(_nbytes(u.shard) for u in self._units)
        gathered = sum(_storage_nbytes(u.flat_full) for u in self._units)
        grads = sum(_nbytes(u.grad_shard) + _nbytes(u.flat_full.grad) for u in self._units)
        grads += sum(_nbytes(out) + _nbytes(flat) for _, _, out, flat, _ in self._pending)
        states = self._optimizer_state_bytes()[0]
        master = sum(_nbytes(u.master) for u in self._units
                     if u.shard.data_ptr() != u.master.data_ptr())
        out = {"params": shard + gathered, "grads": grads, "optimizer_states": states,
               "master_weights": master}
        out["total"] = sum(out.values())
        out["gathered_params"] = gathered
        out["num_parameters"] = sum(u.layout.numel for u in self._units)
        out["padding_elements"] = sum(u.layout.pad for u in self._units)
        return out

    def unit_summary(self) -> list[dict]:
        """One dict per unit: name keys, numel, padded numel, shard numel, gathered."""
        return [{"keys": list(u.keys), "numel": u.layout.numel,
                 "padded_numel": u.layout.padded_numel, "shard_numel": u.layout.shard_numel,
                 "gathered": u.gathered} for u in self._units]

    def extra_repr(self) -> str:
        return (f"world_size={self.world_size}, units={len(self._units)}, "
                f"mixed_precision={self.mixed_precision!r}, "
                f"optimizer={type(self.optimizer).__name__}")


def _make_unit_hook(ref, unit: _Unit, which: str):
    def hook(*args):
        owner = ref()
        if owner is None:
            return None
        return getattr(owner, "_" + which)(unit, *args)
    return hook


def _make_pre_backward_hook(ref, unit: _Unit):
    def hook(_grad):
        owner = ref()
        if owner is not None:
            owner._pre_backward(unit)
    return hook


#: FSDP-style alias.
FullyShardedModule = ZeroStage3
