"""Tensor parallelism (Megatron-LM style) over ``torch.distributed`` collectives.

    from ringcomm.training import tp
    mlp = tp.from_dense(dense_mlp)              # nn.Sequential(Linear, GELU, Linear), any group
    y = mlp(x)                                  # one all-reduce forward, one backward

Every rank of the tensor-parallel group holds one slice of each weight:

* :class:`ColumnParallelLinear` splits the *output* features: rank ``r`` holds rows
  ``[r*o/n, (r+1)*o/n)`` of the ``(out, in)`` weight and its slice of the bias, and computes its
  slice of the output. ``gather_output=True`` all-gathers the slices into the full output.
* :class:`RowParallelLinear` splits the *input* features: rank ``r`` holds columns
  ``[r*i/n, (r+1)*i/n)`` of the weight; each rank's product is a partial output of the full shape,
  and one all-reduce adds them up. The bias is replicated and added once, after the all-reduce.
* :class:`ParallelMLP` is column then row (``act`` in between works entry by entry, so the column
  slices never need to meet): exactly one all-reduce in forward and one in backward.
* :class:`ParallelSelfAttention` splits by heads: ``qkv`` is column parallel with each of q, k and
  v split by heads, ``proj`` row parallel.

The communication is autograd-correct, with Megatron's conjugate operators: the forward of
:func:`copy_to_group` is the identity and its backward an all-reduce (``f``); the forward of
:func:`reduce_from_group` is an all-reduce and its backward the identity (``g``); gathering along
the last dimension has a split as its backward and vice versa. Every rank of the group must run
the same forward and backward (they see the same replicated inputs).

Parameters are initialised like the dense ``nn.Linear`` of the full shape, drawing from the
current RNG, then sliced: with the same seed on every rank the shards are exactly the slices of
``nn.Linear(in, out)`` created with that seed. A dense checkpoint loads directly:
``load_state_dict`` accepts each weight either at its full (dense) shape, which is sliced to this
rank's shard, or at the shard's shape.

All communication goes through ``torch.distributed`` (looked up at call time), on ``group``
(``None``: the default group); the two all-reduces through ``ringcomm.torch.all_reduce_``, which
on a ringcomm group hands a CPU tensor straight to the communicator (tensor parallelism's calls
are small and on the critical path) and is ``dist.all_reduce`` on any other group or device.
:func:`make_groups` builds the sub-groups of a data x tensor layout.
"""
from __future__ import annotations

from collections import namedtuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ringcomm.torch.ops import all_reduce_

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "ParallelSelfAttention",
           "from_dense", "make_groups", "Groups", "copy_to_group", "reduce_from_group",
           "gather_from_group", "scatter_to_group"]


# ============================================================================ group helpers
def _size(group) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def _rank(group) -> int:
    return dist.get_rank(group) if dist.is_initialized() else 0


def _divide(n: int, parts: int, what: str) -> int:
    if n % parts:
        raise ValueError(f"{what} ({n}) must be divisible by the tensor-parallel size ({parts})")
    return n // parts


Groups = namedtuple("Groups", "tp dp tp_rank dp_rank")


def make_groups(tp: int) -> Groups:
    """Sub-groups of a data x tensor layout over the default group (call it on every rank).

    Ranks ``[k*tp, (k+1)*tp)`` form tensor-parallel group ``k`` (neighbours share a layer's
    shards); ranks with the same ``rank % tp`` form a data-parallel group (replicas of the same
    shard). Returns this rank's ``Groups(tp, dp, tp_rank, dp_rank)``.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    if tp < 1 or world % tp:
        raise ValueError(f"the world size ({world}) must be a multiple of tp ({tp})")
    mine_tp = mine_dp = None
    # new_group is collective over the default group: every rank creates every group, in order.
    for k in range(world // tp):
        g = dist.new_group(list(range(k * tp, (k + 1) * tp)))
        if rank // tp == k:
            mine_tp = g
    for j in range(tp):
        g = dist.new_group(list(range(j, world, tp)))
        if rank % tp == j:
            mine_dp = g
    return Groups(mine_tp, mine_dp, rank % tp, rank // tp)


# ============================================================================ autograd operators
class _CopyToGroup(torch.autograd.Function):
    """Forward: identity. Backward: all-reduce (sum) of the gradient over the group."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        if _size(ctx.group) == 1:
            return g, None
        g = g.contiguous().clone()
        all_reduce_(g, ctx.group)
        return g, None


class _ReduceFromGroup(torch.autograd.Function):
    """Forward: all-reduce (sum) over the group. Backward: identity."""

    @staticmethod
    def forward(ctx, x, group):
        if _size(group) == 1:
            return x.view_as(x)
        y = x.contiguous().clone()
        all_reduce_(y, group)
        return y

    @staticmethod
    def backward(ctx, g):
        return g, None


def _split_last(x, group):
    n = _size(group)
    return x.chunk(n, dim=-1)[_rank(group)].contiguous()


def _gather_last(x, group):
    n = _size(group)
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


class _GatherFromGroup(torch.autograd.Function):
    """Forward: all-gather along the last dimension (rank order). Backward: keep own slice."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x) if _size(group) == 1 else _gather_last(x, group)

    @staticmethod
    def backward(ctx, g):
        return (g if _size(ctx.group) == 1 else _split_last(g, ctx.group)), None


class _ScatterToGroup(torch.autograd.Function):
    """Forward: keep own slice of the last dimension. Backward: all-gather along it."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        if _size(group) == 1:
            return x.view_as(x)
        _divide(x.shape[-1], _size(group), "the last dimension")
        return _split_last(x, group)

    @staticmethod
    def backward(ctx, g):
        return (g if _size(ctx.group) == 1 else _gather_last(g, ctx.group)), None


def copy_to_group(x, group=None):
    """Megatron's ``f``: identity forward, all-reduce of the gradient backward."""
    return _CopyToGroup.apply(x, group)


def reduce_from_group(x, group=None):
    """Megatron's ``g``: all-reduce forward, identity backward."""
    return _ReduceFromGroup.apply(x, group)


def gather_from_group(x, group=None):
    """All-gather slices along the last dimension; backward keeps this rank's slice."""
    return _GatherFromGroup.apply(x, group)


def scatter_to_group(x, group=None):
    """This rank's slice of the last dimension; backward all-gathers the gradient."""
    return _ScatterToGroup.apply(x, group)


# ============================================================================ layers
def _dense_init(out_features, in_features, bias, dtype, device):
    """Full-shape weight and bias drawn exactly as ``nn.Linear.reset_parameters`` draws them."""
    ref = nn.Linear(in_features, out_features, bias=bias, dtype=dtype, device=device)
    return ref.weight.detach(), (ref.bias.detach() if bias else None)


class _ShardedLinear(nn.Module):
    """Common part: a local ``weight`` shard, the full shape, and dense-checkpoint loading."""

    # Set by each subclass, with _shard_weight / _shard_bias (full tensor -> this rank's slice).
    full_weight_shape: tuple
    full_bias_shape: tuple | None

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # A tensor at the dense shape is sliced to this rank's shard before the usual loading,
        # which then checks the (shard) shape as for any module.
        w, b = prefix + "weight", prefix + "bias"
        if w in state_dict and tuple(state_dict[w].shape) == self.full_weight_shape \
                and self.full_weight_shape != tuple(self.weight.shape):
            state_dict[w] = self._shard_weight(state_dict[w])
        if self.bias is not None and b in state_dict \
                and tuple(state_dict[b].shape) == self.full_bias_shape \
                and self.full_bias_shape != tuple(self.bias.shape):
            state_dict[b] = self._shard_bias(state_dict[b])
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    @torch.no_grad()
    def load_dense(self, dense: nn.Linear) -> "_ShardedLinear":
        """Copy this rank's shard of a dense ``nn.Linear`` of the full shape."""
        if tuple(dense.weight.shape) != self.full_weight_shape:
            raise ValueError(f"dense weight shape {tuple(dense.weight.shape)} != "
                             f"{self.full_weight_shape}")
        if (dense.bias is None) != (self.bias is None):
            raise ValueError("the dense layer and the parallel layer disagree on the bias")
        self.weight.copy_(self._shard_weight(dense.weight))
        if self.bias is not None:
            self.bias.copy_(self._shard_bias(dense.bias))
        return self


class ColumnParallelLinear(_ShardedLinear):
    """``y = x A^T + b`` with the output features split across ``group``.

    ``weight``: ``(out_features / n, in_features)``, rank ``r``'s rows. ``segments=k`` splits
    each of ``k`` equal consecutive blocks of the output separately (the fused q/k/v projection:
    rank ``r`` holds its heads of q, of k and of v, concatenated in that order).
    ``gather_output=True`` returns the full output (all-gather); ``False`` returns this rank's
    slice, for a following :class:`RowParallelLinear` with ``input_is_parallel=True``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 gather_output: bool = True, group=None, segments: int = 1, dtype=None,
                 device=None):
        super().__init__()
        self.group = group
        self.tp_size, self.tp_rank = _size(group), _rank(group)
        if gather_output and segments != 1:
            raise ValueError("gather_output=True needs segments=1 (a gathered fused output "
                             "would come out in rank order, not in segment order)")
        seg = _divide(out_features, segments, "out_features / segments")
        _divide(seg, self.tp_size, "out_features / segments")
        self.in_features, self.out_features = in_features, out_features
        self.segments, self.gather_output = segments, gather_output
        self.full_weight_shape = (out_features, in_features)
        self.full_bias_shape = (out_features,) if bias else None
        w, b = _dense_init(out_features, in_features, bias, dtype, device)
        self.weight = nn.Parameter(self._shard_weight(w))
        self.bias = nn.Parameter(self._shard_bias(b)) if bias else None

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        seg = self.out_features // self.segments
        per = seg // self.tp_size
        lo = self.tp_rank * per
        return torch.cat([t[s * seg + lo:s * seg + lo + per] for s in range(self.segments)])

    def _shard_weight(self, w):
        return self._rows(w.detach()).clone()

    def _shard_bias(self, b):
        return self._rows(b.detach()).clone()

    def forward(self, x):
        y = F.linear(copy_to_group(x, self.group), self.weight, self.bias)
        return gather_from_group(y, self.group) if self.gather_output else y

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(local {self.weight.shape[0]}), bias={self.bias is not None}, "
                f"gather_output={self.gather_output}, segments={self.segments}, "
                f"tp={self.tp_size}")


class RowParallelLinear(_ShardedLinear):
    """``y = x A^T + b`` with the input features split across ``group``; one all-reduce.

    ``weight``: ``(out_features, in_features / n)``, rank ``r``'s columns. With
    ``input_is_parallel=True`` ``x`` is already this rank's slice of the input features (the
    output of a :class:`ColumnParallelLinear` with ``gather_output=False``); otherwise the full
    ``x`` is sliced here (backward: all-gather). The bias is replicated and added after the
    all-reduce, so it counts once.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 input_is_parallel: bool = False, group=None, dtype=None, device=None):
        super().__init__()
        self.group = group
        self.tp_size, self.tp_rank = _size(group), _rank(group)
        self.local_in = _divide(in_features, self.tp_size, "in_features")
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel = input_is_parallel
        self.full_weight_shape = (out_features, in_features)
        self.full_bias_shape = (out_features,) if bias else None
        w, b = _dense_init(out_features, in_features, bias, dtype, device)
        self.weight = nn.Parameter(self._shard_weight(w))
        self.bias = nn.Parameter(b.clone()) if bias else None

    def _shard_weight(self, w):
        lo = self.tp_rank * self.local_in
        return w.detach()[:, lo:lo + self.local_in].clone()

    def _shard_bias(self, b):
        return b.detach().clone()

    def forward(self, x):
        if not self.input_is_parallel:
            x = scatter_to_group(x, self.group)
        y = reduce_from_group(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias

    def extra_repr(self):
        return (f"in_features={self.in_features} (local {self.local_in}), "
                f"out_features={self.out_features}, bias={self.bias is not None}, "
                f"input_is_parallel={self.input_is_parallel}, tp={self.tp_size}")


_ACTIVATIONS = (nn.GELU, nn.ReLU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Identity, nn.Dropout)


class ParallelMLP(nn.Sequential):
    """``fc2(act(fc1(x)))`` with ``fc1`` column parallel and ``fc2`` row parallel.

    An ``nn.Sequential`` of ``[ColumnParallelLinear, act, RowParallelLinear]``: its state-dict keys
    (``0.weight``, ``0.bias``, ``2.weight``, ``2.bias``) are those of the dense
    ``nn.Sequential(nn.Linear(d, h), act, nn.Linear(h, d_out))``, whose checkpoint loads directly.
    Forward: one all-reduce (``fc2``'s). Backward: one all-reduce (``fc1``'s input gradient).
    """

    def __init__(self, d_model: int, d_hidden: int, d_out: int | None = None, bias: bool = True,
                 activation: nn.Module | None = None, group=None, dtype=None, device=None):
        act = activation if activation is not None else nn.GELU()
        if not isinstance(act, _ACTIVATIONS):
            raise ValueError(f"the activation must work entry by entry ({_ACTIVATIONS}), "
                             f"got {type(act).__name__}")
        super().__init__(
            ColumnParallelLinear(d_model, d_hidden, bias=bias, gather_output=False, group=group,
                                 dtype=dtype, device=device),
            act,
            RowParallelLinear(d_hidden, d_out or d_model, bias=bias, input_is_parallel=True,
                              group=group, dtype=dtype, device=device))

    @property
    def fc1(self) -> ColumnParallelLinear:
        return self[0]

    @property
    def fc2(self) -> RowParallelLinear:
        return self[2]


class ParallelSelfAttention(nn.Module):
    """Multi-head self-attention split by heads: each rank computes ``n_heads / n`` heads.

    The same parameters and math as a dense block with ``qkv = nn.Linear(d, 3d)`` (q, k, v
    consecutive, each ``n_heads`` heads of ``d / n_heads``) and ``proj = nn.Linear(d, d)``:
    ``softmax(q k^T / sqrt(d_head)) v`` per head (causal when ``causal``), heads concatenated in
    order, then ``proj``. ``qkv`` is column parallel by heads (``segments=3``) and ``proj`` row
    parallel, so a dense ``qkv.*``/``proj.*`` checkpoint loads. One all-reduce each way.
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True, causal: bool = True,
                 group=None, dtype=None, device=None):
        super().__init__()
        n = _size(group)
        _divide(d_model, n_heads, "d_model / n_heads")
        self.local_heads = _divide(n_heads, n, "n_heads")
        self.d_model, self.n_heads, self.causal = d_model, n_heads, causal
        self.head_dim = d_model // n_heads
        self.qkv = ColumnParallelLinear(d_model, 3 * d_model, bias=bias, gather_output=False,
                                        group=group, segments=3, dtype=dtype, device=device)
        self.proj = RowParallelLinear(d_model, d_model, bias=bias, input_is_parallel=True,
                                      group=group, dtype=dtype, device=device)

    def forward(self, x):
        b, t, _ = x.shape
        local = self.local_heads * self.head_dim
        q, k, v = self.qkv(x).split(local, dim=-1)
        q, k, v = (z.view(b, t, self.local_heads, self.head_dim).transpose(1, 2)
                   for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(att.transpose(1, 2).reshape(b, t, local))

    def load_dense(self, dense: nn.Module) -> "ParallelSelfAttention":
        """Copy this rank's heads from a dense module with ``qkv`` and ``proj`` ``nn.Linear``s."""
        self.qkv.load_dense(dense.qkv)
        self.proj.load_dense(dense.proj)
        return self


# ============================================================================ from a dense module
def _is_mlp(module: nn.Module) -> bool:
    if not isinstance(module, nn.Sequential):
        return False
    items = list(module)
    return (len(items) == 3 and isinstance(items[0], nn.Linear)
            and isinstance(items[1], _ACTIVATIONS) and isinstance(items[2], nn.Linear)
            and items[0].out_features == items[2].in_features
            and (items[0].bias is None) == (items[2].bias is None))


def from_dense(module: nn.Module, group=None, style: str = "column") -> nn.Module:
    """Shard a dense module across ``group``; the result computes the same function.

    * ``nn.Sequential(nn.Linear, act, nn.Linear)`` (act entry by entry) -> :class:`ParallelMLP`;
    * ``nn.Linear`` -> :class:`ColumnParallelLinear` (``gather_output=True``) for
      ``style="column"``, or :class:`RowParallelLinear` (``input_is_parallel=False``) for
      ``style="row"``.

    The weights are this rank's slices of the dense module's (which may come from a checkpoint),
    on its dtype and device; the state-dict keys are unchanged.
    """
    if _is_mlp(module):
        fc1, act, fc2 = list(module)
        w = fc1.weight
        out = ParallelMLP(fc1.in_features, fc1.out_features, fc2.out_features,
                          bias=fc1.bias is not None, activation=act, group=group,
                          dtype=w.dtype, device=w.device)
        out.fc1.load_dense(fc1)
        out.fc2.load_dense(fc2)
        return out
    if isinstance(module, nn.Linear):
        w = module.weight
        kw = dict(bias=module.bias is not None, group=group, dtype=w.dtype, device=w.device)
        if style == "column":
            layer = ColumnParallelLinear(module.in_features, module.out_features,
                                         gather_output=True, **kw)
        elif style == "row":
            layer = RowParallelLinear(module.in_features, module.out_features,
                                      input_is_parallel=False, **kw)
        else:
            raise ValueError(f"style must be 'column' or 'row', got {style!r}")
        return layer.load_dense(module)
    raise TypeError(f"from_dense shards nn.Linear and nn.Sequential(Linear, activation, Linear), "
                    f"got {type(module).__name__}")
