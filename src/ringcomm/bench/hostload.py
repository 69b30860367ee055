"""The machine's state around a run, for the bench's header lines: the load average and the share
of the cores that other processes keep busy."""
from __future__ import annotations

import os
import time

__all__ = ["cpu_busy", "loadavg"]


def cpu_busy(interval: float = 0.5):
    """Fraction of all cores busy (with other processes: we sleep meanwhile) over `interval` s;
    None where /proc/stat cannot be read."""
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + (v[4] if len(v) > 4 else 0)
    try:
        t0, i0 = snap()
        time.sleep(interval)
        t1, i1 = snap()
    except (OSError, ValueError, IndexError):
        return None
    return None if t1 == t0 else 1.0 - (i1 - i0) / (t1 - t0)


def loadavg():
    """os.getloadavg(), or None where the platform has none."""
    try:
        return os.getloadavg()
    except OSError:
        return None
