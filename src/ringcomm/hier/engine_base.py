"""What every inter-node engine shares (the engine base class) and what an engine's failure
means on this rank. The engines (gloo_engine, mpi_engine) build on this module; engines.py, which
chooses one of them, sits above both."""
from __future__ import annotations

import builtins
import collections

from ..core.errors import PeerFailureError, RingcommError, TimeoutError

__all__ = ["EngineBase", "convert_error"]


class EngineBase:
    """What every inter-node engine shares, whatever moves its bytes: ``stats`` (per op: calls,
    bytes handed to the engine), the handles it created (``_handles``: process groups or
    communicators, released by ``_release``), and ``col`` / ``lead`` / ``world``, the groups of
    this rank's node column, of the node leaders (None on non-leaders) and of every rank."""

    def __init__(self):
        self.stats: dict = collections.OrderedDict()
        self._handles: list = []
        self.col = self.lead = self.world = None

    def _count(self, op, nbytes):
        s = self.stats.get(op)
        if s is None:
            s = self.stats[op] = [0, 0]
        s[0] += 1
        s[1] += int(nbytes)

    @staticmethod
    def _nbytes(t):
        return t.numel() * t.element_size()

    def _release(self, release, forget_groups: bool) -> None:
        """``release(h)`` on every handle (best effort: one that fails must not keep the others
        open), then forget them, and with ``forget_groups`` the groups too."""
        for h in self._handles:
            try:
                release(h)
            except Exception:  # noqa: BLE001
                pass
        self._handles = []
        if forget_groups:
            self.col = self.lead = self.world = None


def convert_error(e: BaseException, what: str, elapsed: float = 0.0, timeout: float = float("inf")) -> RingcommError:
    """The ringcomm error for an engine failure ``e`` raised ``elapsed`` seconds into an operation
    whose engine deadline is ``timeout`` seconds: ringcomm's own errors pass through; a Python
    TimeoutError, or a failure at (or past) the deadline — the engine gave up waiting — is a
    TimeoutError; anything earlier is a peer's failure (a closed or reset connection)."""
    if isinstance(e, RingcommError):
        return e
    msg = f"{what}: {type(e).__name__}: {e}"
    if isinstance(e, builtins.TimeoutError) or elapsed >= timeout:
        return TimeoutError(msg)
    return PeerFailureError(msg)
