"""Memory counted on the tensors actually held: activations saved for backward
(``ActivationMeter``) and parameters / gradients / optimizer states (``model_state_bytes``)."""
from __future__ import annotations

import torch
from torch import nn

from ...training.saved_tensors import SavedTensorMeter, _storage


class ActivationMeter(SavedTensorMeter):
    """Peak bytes alive among tensors saved for backward (unique storages, parameters excluded).

    ``with meter: loss = model(...); loss.backward()`` -- autograd frees a saved tensor when its
    node is released, which drops our holder and decrements the live count.
    """

    def __init__(self, exclude: nn.Module | None = None):
        super().__init__(exclude)
        # ZeroStage3 keeps each unit's gathered weights in a flat parameter outside the module
        # tree: the views forward saves of it are weights, not activations.
        for w in exclude.gathered_weights() if hasattr(exclude, "gathered_weights") else ():
            self.exclude.add(_storage(w)[0])


_OPT_ATTRS = ("optimizer", "optim", "inner", "_optimizer", "base_optimizer", "inner_optimizer")


def _optimizers(opt):
    seen, stack = [], [opt]
    while stack:
        o = stack.pop()
        if o is None or any(o is s for s in seen):
            continue
        seen.append(o)
        for a in _OPT_ATTRS:
            sub = getattr(o, a, None)
            if isinstance(sub, torch.optim.Optimizer):
                stack.append(sub)
    return seen


def _tensors(obj, depth=0):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 4 and isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v, depth + 1)
    elif depth < 4 and isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v, depth + 1)


def model_state_bytes(module: nn.Module, optimizer=None, extra: dict | None = None) -> dict:
    """Bytes of parameters, gradients and optimizer states, counting each storage once.

    ``extra`` maps a category to more tensors to count (e.g. gradient buckets). An optimizer (or
    wrapper) with ``memory_breakdown()`` (``ringcomm.training.zero``) reports its own sharded tensors; its
    fp32 ``master_weights`` count as optimizer states, as in the 2 + 2 + 12 budget.
    """
    for obj in (optimizer, module):
        if hasattr(obj, "memory_breakdown"):
            mb = obj.memory_breakdown()
            return {"params": int(mb.get("params", 0)), "grads": int(mb.get("grads", 0)),
                    "optimizer_states": int(mb.get("optimizer_states", 0))
                    + int(mb.get("master_weights", 0))}
    out = {"params": 0, "grads": 0, "optimizer_states": 0}
    seen: set = set()

    def add(cat, t):
        if not isinstance(t, torch.Tensor):
            return
        key, nbytes = _storage(t)
        if key in seen:
            return
        seen.add(key)
        out[cat] += nbytes

    for p in module.parameters():
        add("params", p)
    for p in module.parameters():
        add("grads", p.grad)
    for cat, ts in (extra or {}).items():
        for t in _tensors(ts):
            add(cat, t)
    for opt in _optimizers(optimizer):
        for group in getattr(opt, "param_groups", []):
            for p in group["params"]:
                add("grads", p.grad)
        for group in getattr(opt, "param_groups", []):
            for p in group["params"]:
                add("optimizer_states", p)   # a master copy, if not the module's own storage
        for state in getattr(opt, "state", {}).values():
            for t in _tensors(state):
                add("optimizer_states", t)
    return out
