"""The pieces every torch entry point of the ringcomm backend is made of: the ``collective``
decorator (a refused argument is reported to the other ranks), ``Step`` (one ringcomm call of a
possibly composed torch collective) and ``BarrierHandle`` (a barrier bounded by its own timeout)."""
from __future__ import annotations

from typing import Callable

import ringcomm

__all__ = ["collective", "Step", "BarrierHandle", "DoneHandle"]


def collective(coll: str):
    """Decorate a torch entry point that maps onto ringcomm collective ``coll``.

    An argument this rank refuses (raised before anything was issued) is reported to the other
    ranks through ringcomm's header exchange (``reject``), so they raise MismatchError instead of
    waiting for this rank until the timeout. Errors raised by ringcomm itself have done that
    already and pass through."""
    def deco(method):
        def wrapper(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 - re-raised below
                if getattr(e, "_ringcomm_issued", False) or self._closed:
                    raise
                self._reject(coll, e)
                raise
        wrapper.__name__ = method.__name__
        wrapper.__qualname__ = method.__qualname__
        wrapper.__doc__ = method.__doc__
        return wrapper
    return deco


class Step:
    """One ringcomm call of a (possibly composed) torch collective."""
    __slots__ = ("launch", "finish")

    def __init__(self, launch: Callable[[bool], object], finish: Callable[[], None] | None = None):
        self.launch = launch   # launch(async_op) -> handle (async) / None (sync)
        self.finish = finish   # run after success (copy a staged result out)


class DoneHandle:
    """The handle of a step that ran to completion inside its launch (nothing left to wait for)."""
    __slots__ = ()

    def wait(self, timeout: float | None = None):
        return None

    def is_completed(self) -> bool:
        return True

    def exception(self):
        return None


class BarrierHandle:
    """A barrier's ringcomm handle whose wait is bounded by the barrier's own timeout."""
    __slots__ = ("_h", "_limit", "_rank", "_size")

    def __init__(self, h, limit: float, rank: int, size: int):
        self._h, self._limit, self._rank, self._size = h, limit, rank, size

    def wait(self, timeout: float | None = None):
        t = self._limit if timeout is None else min(float(timeout), self._limit)
        try:
            return self._h.wait(t)
        except ringcomm.TimeoutError as e:
            if self._h.is_completed():
                raise
            raise ringcomm.TimeoutError(
                f"ringcomm barrier: not every rank of the group (size {self._size}) arrived "
                f"within the barrier's timeout of {self._limit:g} s (waiting on rank "
                f"{self._rank})") from e

    def is_completed(self) -> bool:
        return self._h.is_completed()

    def exception(self):
        return self._h.exception()

