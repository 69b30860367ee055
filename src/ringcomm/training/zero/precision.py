"""Mixed precision of ringcomm.training.zero: the accepted ``mixed_precision`` names and the fp16
dynamic loss scaler."""
from __future__ import annotations

import torch

_PRECISIONS = {
    None: None, "fp32": None, "float32": None,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, torch.bfloat16: torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    torch.float16: torch.float16,
}


def _resolve_precision(mixed_precision) -> torch.dtype | None:
    try:
        return _PRECISIONS[mixed_precision]
    except (KeyError, TypeError):
        raise ValueError(f"mixed_precision must be None, 'bf16' or 'fp16', got "
                         f"{mixed_precision!r}") from None


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
