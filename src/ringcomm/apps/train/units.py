"""Human-readable quantities for the training tables and the report page."""
from __future__ import annotations

__all__ = ["format_bytes"]


def format_bytes(n) -> str:
    """``n`` bytes in the largest binary unit (up to GiB) under 1024 of it; ``-`` for None."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
