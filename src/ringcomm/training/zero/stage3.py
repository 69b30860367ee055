"""ZeRO stage 3 (= FSDP): ``ZeroStage3``, parameters gathered just in time per leaf module, with
the forward / backward hooks whose order invariants the package docstring states."""
from __future__ import annotations

import weakref

import torch
from torch import nn
from torch.autograd.graph import register_multi_grad_hook
from torch.utils._pytree import tree_flatten, tree_unflatten

from .core import _ZeroCore
from .flat import _FlatGroup, _nbytes, _storage_nbytes
from .precision import DynamicLossScaler, _resolve_precision

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
        #: no_sync(): the sum of this unit's unreduced full gradients (padded), else None.
        self.acc_grad: torch.Tensor | None = None

    @property
    def gathered(self) -> bool:
        return self.flat_full.untyped_storage().nbytes() > 0


class ZeroStage3(_ZeroCore, nn.Module):
    """ZeRO stage 3 / fully sharded data parallel: parameters, gradients and optimizer states
    are all partitioned; each leaf module's parameters are gathered just in time (see the package
    docstring for the hooks and their order invariants).

    Args:
        module: the model (identical structure on every rank); its parameters are broadcast
            from rank 0, sharded, and removed from their modules (``module.weight`` is ``None``
            outside that module's forward).
        optimizer_class, process_group, mixed_precision, loss_scaler, collectives, offload,
            **optim_kwargs: as :class:`ZeroOptimizer` (with ``offload="cpu"`` the compute shard
            is a device copy of the host master, also in fp32).
        cast_forward_inputs: under mixed precision, cast floating-point tensor arguments of
            ``forward`` to the compute dtype (default True).

    Usage (every rank)::

        model = ZeroStage3(net, torch.optim.AdamW, lr=1e-3)
        loss = loss_fn(model(x), y);  model.scale_loss(loss).backward();  model.step()
        model.zero_grad()

    Gradient accumulation: backward passes inside ``with model.no_sync():`` sum each unit's full
    gradient locally (no reduce-scatter); the parameters are still gathered per unit.
    """

    def __init__(self, module: nn.Module, optimizer_class, process_group=None,
                 mixed_precision=None, *, loss_scaler: DynamicLossScaler | bool | None = None,
                 collectives: str | None = None, cast_forward_inputs: bool = True,
                 offload: str | None = None, **optim_kwargs):
        nn.Module.__init__(self)
        if not isinstance(module, nn.Module):
            raise TypeError(f"ZeroStage3 wraps an nn.Module, got {type(module).__name__}")
        _resolve_precision(mixed_precision)
        self._stage = 3
        self._core_init(process_group, mixed_precision, loss_scaler, collectives, offload)
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

    def gathered_weights(self) -> list:
        """Each unit's flat parameter of gathered weights (compute dtype, padded; its storage
        empty while the unit is freed), kept outside the module tree."""
        return [u.flat_full for u in self._units]

    @torch.no_grad()
    def _make_unit(self, m, prefix, names, params) -> _Unit:
        compute, master = self._dtypes_for(params[0].dtype)
        u = _Unit(m, prefix, names, params, self.world_size, self.rank, compute, master,
                  params[0].device)
        flat = u.layout.flatten([p.detach() for p in params], master, u.device)
        self._comm.broadcast(flat)
        u.init_master(flat, self.offload)
        if compute == master and self.offload is None:
            u.shard = u.master.detach()   # fp32: the shard is the master
        else:
            u.shard = u.master.detach().to(device=u.device, dtype=compute, copy=True)
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
        if grad is None:
            return
        grad = grad.contiguous().view(-1)
        if not self._sync_grads:  # no_sync(): keep the full gradient, reduce it later
            u.acc_grad = grad if u.acc_grad is None else u.acc_grad.add_(grad)
            return
        if u.acc_grad is not None:
            grad = u.acc_grad.add_(grad)
            u.acc_grad = None
        self._issue_reduce(u, grad, replace=False)

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
        # Gradients accumulated under no_sync() and not yet reduced (step() inside the context,
        # or a unit the last backward did not reach): reduce them now, in unit order, which
        # every rank running the same graph shares.
        for u in self._units:
            if u.acc_grad is not None:
                grad, u.acc_grad = u.acc_grad, None
                self._issue_reduce(u, grad, replace=False)
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
            u.acc_grad = None
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
        in fp32 where the shard is the master), ``total``, ``offloaded`` (host part)."""
        shard = sum(_nbytes(u.shard) for u in self._units)
        gathered = sum(_storage_nbytes(u.flat_full) for u in self._units)
        grads = sum(_nbytes(u.grad_shard) + _nbytes(u.flat_full.grad) + _nbytes(u.acc_grad)
                    for u in self._units)
        grads += sum(_nbytes(out) + _nbytes(flat) for _, _, out, flat, _ in self._pending)
        states = self._optimizer_state_bytes()[0]
        master = sum(_nbytes(u.master) for u in self._units
                     if u.shard.data_ptr() != u.master.data_ptr())
        out = {"params": shard + gathered, "grads": grads, "optimizer_states": states,
               "master_weights": master}
        out["total"] = sum(out.values())
        out["offloaded"] = states + master if self.offload else 0   # of the total, on the host
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
