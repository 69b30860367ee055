"""Activation recomputation (gradient checkpointing) as a custom ``torch.autograd.Function``.

``y = checkpoint(fn, *args)`` runs ``fn(*args)`` without recording a graph and saves only the
tensor inputs. In the backward pass it restores the RNG state of the forward (CPU, and CUDA on the
devices of the inputs when CUDA is in use) and the autocast state, recomputes ``fn`` under
``enable_grad`` on detached copies of the inputs, and back-propagates the incoming gradients
through the recomputed graph. Gradients of the inputs are returned; gradients of parameters used
inside ``fn`` are accumulated into their ``.grad`` by that nested backward (which is also when
their post-accumulate-grad hooks fire, e.g. :class:`ringcomm.training.ddp.BucketedDDP`'s).

Arguments and outputs may be any mix of tensors and other values, nested in tuples, lists and
dicts (they are flattened with ``torch.utils._pytree``). Inputs need not require grad: if none
does, a dummy leaf that requires grad is passed along so that the output still requires grad and
parameters used inside ``fn`` still receive gradients.

Like every "reentrant" checkpoint, it supports ``loss.backward()`` / ``torch.autograd.backward``
but not ``torch.autograd.grad`` (the parameters' gradients go to ``.grad``).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = ["checkpoint"]


def checkpoint(fn: Callable[..., Any], *args: Any, preserve_rng_state: bool = True) -> Any:
    """Return ``fn(*args)``, saving only the inputs and recomputing ``fn`` during backward."""
    leaves, in_spec = tree_flatten(args)
    if not torch.is_grad_enabled():
        return fn(*args)
    needs_dummy = not any(isinstance(x, torch.Tensor) and x.requires_grad for x in leaves)
    dummy = torch.empty((), requires_grad=True) if needs_dummy else None
    out_holder: dict = {}
    outs = _Recompute.apply(fn, preserve_rng_state, in_spec, out_holder, dummy, *leaves)
    return tree_unflatten(list(outs), out_holder["spec"])


def _cuda_devices(tensors) -> list:
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return []
    return sorted({t.device.index if t.device.index is not None else torch.cuda.current_device()
                   for t in tensors if t.is_cuda})


class _Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, preserve_rng_state, in_spec, out_holder, dummy, *leaves):
        ctx.fn = fn
        ctx.in_spec = in_spec
        ctx.preserve = preserve_rng_state
        tensor_pos = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        ctx.tensor_pos = tensor_pos
        ctx.leaves = [None if isinstance(x, torch.Tensor) else x for x in leaves]
        tensors = [leaves[i] for i in tensor_pos]
        ctx.cuda_devices = _cuda_devices(tensors)
        if preserve_rng_state:
            ctx.cpu_rng = torch.get_rng_state()
            ctx.cuda_rng = [torch.cuda.get_rng_state(d) for d in ctx.cuda_devices]
        ctx.autocast = {dev: (torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev))
                        for dev in ("cpu", "cuda")}
        ctx.save_for_backward(*tensors)
        ctx.set_materialize_grads(False)
        with torch.no_grad():
            out = fn(*tree_unflatten(list(leaves), in_spec))
        out_leaves, out_spec = tree_flatten(out)
        out_holder["spec"] = out_spec
        return tuple(out_leaves)

    @staticmethod
    def backward(ctx, *grad_outputs):
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError(
                "ringcomm.training.recompute.checkpoint supports .backward()/torch.autograd.backward only, "
                "not torch.autograd.grad (parameters receive their gradients in .grad)")
        saved = ctx.saved_tensors
        leaves = list(ctx.leaves)
        detached = []
        for pos, t in zip(ctx.tensor_pos, saved):
            d = t.detach()
            d.requires_grad_(t.requires_grad)
            leaves[pos] = d
            detached.append(d)
        args = tree_unflatten(leaves, ctx.in_spec)

        with torch.random.fork_rng(devices=ctx.cuda_devices, enabled=ctx.preserve):
            if ctx.preserve:
                torch.set_rng_state(ctx.cpu_rng)
                for d, state in zip(ctx.cuda_devices, ctx.cuda_rng):
                    torch.cuda.set_rng_state(state, d)
            (cpu_on, cpu_dt), (cuda_on, cuda_dt) = ctx.autocast["cpu"], ctx.autocast["cuda"]
            with torch.enable_grad(), \
                    torch.autocast("cpu", enabled=cpu_on, dtype=cpu_dt), \
                    _cuda_autocast(cuda_on, cuda_dt):
                out = ctx.fn(*args)
        out_leaves = tree_flatten(out)[0]

        outputs, grads = [], []
        for o, g in zip(out_leaves, grad_outputs):
            if isinstance(o, torch.Tensor) and o.requires_grad and g is not None:
                outputs.append(o)
                grads.append(g)
        if outputs:
            torch.autograd.backward(outputs, grads)
        input_grads = [None] * len(leaves)
        for pos, d in zip(ctx.tensor_pos, detached):
            input_grads[pos] = d.grad if d.requires_grad else None
        return (None, None, None, None, None, *input_grads)


def _cuda_autocast(enabled: bool, dtype):
    if not enabled or not torch.cuda.is_available():
        return contextlib.nullcontext()
    return torch.autocast("cuda", enabled=True, dtype=dtype)
