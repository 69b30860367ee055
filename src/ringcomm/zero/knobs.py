"""The ``RINGCOMM_ZERO_*`` knobs of ringcomm.zero: names, defaults, and their parsing."""
from __future__ import annotations

import os

_MB = 1024 * 1024
#: Knob: bucket cap (MiB of compute-dtype gradients) of ZeroOptimizer, default 25 (as torch DDP).
_BUCKET_MB_ENV = "RINGCOMM_ZERO_BUCKET_MB"
_BUCKET_MB_DEFAULT = 25.0
#: Knob: how many asynchronous gradient reduce-scatters may be in flight during backward.
_MAX_INFLIGHT_ENV = "RINGCOMM_ZERO_MAX_INFLIGHT"
_MAX_INFLIGHT_DEFAULT = 2
#: Knob: collective policy, "auto" | "native" | "fallback" (see the package docstring).
_COLLECTIVES_ENV = "RINGCOMM_ZERO_COLLECTIVES"


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {raw!r}")
    return value
