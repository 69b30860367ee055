"""The part of ZeRO shared by every stage: the optimizer on master shards, gradient reduction,
step with loss scaling, gradient clipping, and full (unsharded) checkpoints."""
from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from .collectives import _Collectives, _require_dist
from .flat import _FlatGroup, _nbytes
from ...core.config import read
from .knobs import _MAX_INFLIGHT_ENV, _positive
from .precision import DynamicLossScaler, _resolve_precision

CHECKPOINT_FORMAT = "ringcomm.training.zero/1"


class _ZeroCore:
    """Mixin. Subclasses set ``self._groups`` (flat groups, in collective order), ``self._stage``,
    ``self._group_keys`` (param-group index -> its keys) and implement ``_finish_reduction``,
    ``_publish_params``, ``_load_compute_params`` and ``_clear_grads``."""

    _OFFLOADS = (None, "none", "cpu")

    def _core_init(self, process_group, mixed_precision, loss_scaler, collectives,
                   offload: str | None = None, knobs=None) -> None:
        """``knobs``: the optimizer's ``config.read()`` (read here when None)."""
        if knobs is None:
            knobs = read()
        if offload not in self._OFFLOADS:
            raise ValueError(f"offload must be None or 'cpu', got {offload!r}")
        #: "cpu": master shards and optimizer states live in host memory (see ``step``).
        self.offload = "cpu" if offload == "cpu" else None
        #: False inside ``no_sync()``: backward passes accumulate local gradients only.
        self._sync_grads = True
        self.compute_dtype_override = _resolve_precision(mixed_precision)
        self.mixed_precision = (None if self.compute_dtype_override is None else
                                {torch.bfloat16: "bf16", torch.float16: "fp16"}[
                                    self.compute_dtype_override])
        _require_dist()
        self.process_group = process_group
        self._comm = _Collectives(process_group, collectives, knobs.zero_collectives)
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
        self._max_inflight = int(_positive(_MAX_INFLIGHT_ENV, knobs.zero_max_inflight))
        self.last_step_skipped = False
        self.skipped_steps = 0

    def _dtypes_for(self, param_dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
        """(compute dtype, master dtype) for parameters of ``param_dtype``."""
        if not param_dtype.is_floating_point:
            raise TypeError(f"ringcomm.training.zero shards floating-point parameters only, got "
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
            raise ValueError("ringcomm.training.zero: no parameter that requires grad to optimize")
        self.optimizer = optimizer_class(groups, **optim_kwargs)
        self._inner_groups = [[g for g in flat] for _, flat in spec if flat]

    # -- public helpers ------------------------------------------------------------------------
    @property
    def padded_numel(self) -> int:
        """Elements of all the flat groups, each padded to a multiple of the world size."""
        return sum(g.layout.padded_numel for g in self._groups)

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

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradient accumulation: backward passes run inside this context issue no gradient
        collective; their gradients are summed locally (full, unsharded: stage 1 in ``.grad``
        as always, stage 2 in ``.grad``, stage 3 in one flat buffer per unit) and reduced
        together with the first backward outside the context (or at ``step()``). k micro-batches
        of loss / k, the first k-1 under ``no_sync()``, then ``step()``: the same update as one
        batch of k micro-batches. Stage 3 still all-gathers parameters in forward and backward
        (it holds shards only); stages 1 and 2 communicate nothing until the last micro-batch."""
        old = self._sync_grads
        self._sync_grads = False
        try:
            yield
        finally:
            self._sync_grads = old

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
                # (offload: the device -> host copy of this rank's gradient shard)
                grad = g.grad_shard.to(device=g.master.device, dtype=g.master_dtype, copy=True)
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
            self._comm.all_gather(full, g.master.detach().to(g.device))
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
            self._comm.all_gather(full, g.master.detach().to(g.device))
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
                                         device=g.device)
                    self._comm.all_gather(full_v, value.detach().to(g.device).contiguous())
                    if root:
                        for key, view in zip(g.keys, g.layout.unflatten(full_v)):
                            state_out.setdefault(key, {})[name] = view.clone()
                elif torch.is_tensor(value) and value.dim() != 0:
                    raise TypeError(f"ringcomm.training.zero: optimizer state {name!r} has shape "
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
            raise ValueError(f"not a ringcomm.training.zero checkpoint (expected format "
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
                        st[name] = flat_v[g.lo:g.hi].to(g.master.device, copy=True)
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
