"""The knobs of ringcomm.training.zero (RINGCOMM_ZERO_BUCKET_MB, RINGCOMM_ZERO_MAX_INFLIGHT,
RINGCOMM_ZERO_COLLECTIVES; read through ``ringcomm.core.config.read()`` as ``zero_bucket_mb``,
``zero_max_inflight``, ``zero_collectives``): their names for the messages (the registry, with
defaults and parsing rules, is ``ringcomm.core.config``) and the positive-number check ZeRO adds."""
from __future__ import annotations

_MB = 1024 * 1024
#: Knob: bucket cap (MiB of compute-dtype gradients) of ZeroOptimizer, default 25 (as torch DDP).
_BUCKET_MB_ENV = "RINGCOMM_ZERO_BUCKET_MB"
#: Knob: how many asynchronous gradient reduce-scatters may be in flight during backward.
_MAX_INFLIGHT_ENV = "RINGCOMM_ZERO_MAX_INFLIGHT"
#: Knob: collective policy, "auto" | "native" | "fallback" (see the package docstring).
_COLLECTIVES_ENV = "RINGCOMM_ZERO_COLLECTIVES"


def _positive(name: str, value) -> float:
    """Knob ``name``'s parsed ``value`` as a float; ValueError naming the knob unless > 0."""
    value = float(value)
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value
