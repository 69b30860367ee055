"""What a report says about the machine it ran on (read from the OS, nothing measured)."""
from __future__ import annotations

import platform

__all__ = ["cpu_model", "cpu_flags"]


def _cpuinfo_field(name: str) -> str | None:
    """The value of the first ``name`` line of ``/proc/cpuinfo``; None where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(name):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; else what ``platform`` knows)."""
    return _cpuinfo_field("model name") or platform.processor() or "unknown CPU"


def cpu_flags() -> set[str]:
    """This CPU's feature flags (the first ``flags`` line of ``/proc/cpuinfo``); empty where there
    is none to read."""
    return set((_cpuinfo_field("flags") or "").split())
