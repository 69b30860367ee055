"""Handles on asynchronous operations: the one ``Work`` interface every handle in ringcomm has.

``Work`` is the base of every handle class in the package (host and CUDA core handles, the
hierarchical communicator's, the inter-node engines', the torch backend's, the trainers'):
``wait(timeout=None)`` blocks (at most ``timeout`` seconds, then ``ringcomm.TimeoutError``) and
raises the operation's error, ``is_completed()`` polls, ``exception()`` returns the error (None
while running or after success), ``result()`` waits and returns what the operation produced.
It has no state of its own (empty ``__slots__``), so it mixes into extension types too
(``torch.distributed.Work``).
"""
from __future__ import annotations

import time
from typing import Optional

from .errors import TimeoutError, from_code

__all__ = ["Work", "CoreWork", "WrappedWork", "wait_until"]


class Work:
    """The interface of an asynchronous operation's handle."""

    __slots__ = ()

    def wait(self, timeout: Optional[float] = None):
        """Block until done (at most ``timeout`` seconds when given); raise the operation's error;
        return its result."""
        raise NotImplementedError

    def is_completed(self) -> bool:
        raise NotImplementedError

    def exception(self):
        """The error the operation failed with; None if it succeeded or is still running."""
        raise NotImplementedError

    def result(self):
        """Wait, then return the operation's result."""
        return self.wait()


class CoreWork(Work):
    """A handle of the C++ core (``ringcomm._C.Work`` or the CUDA core's): keeps the arrays the
    core reads and writes alive until the operation completes."""

    __slots__ = ("_w", "_refs", "_result")

    def __init__(self, w, refs, result=None):
        self._w = w
        self._refs = refs      # arrays the core reads/writes: alive until completion
        self._result = result

    def wait(self, timeout: Optional[float] = None):
        """Block until done (at most `timeout` seconds when given: ringcomm.TimeoutError after).
        Raises the operation's error. Returns the operation's result (output array or None)."""
        self._w.wait(-1.0 if timeout is None else float(timeout))
        self._refs = None
        return self._result

    def is_completed(self) -> bool:
        return self._w.is_completed()

    def exception(self):
        code = self._w.error_code()
        return from_code(code, self._w.error_message()) if code >= 0 else None

    @property
    def seq(self) -> int:
        return self._w.seq

    def source(self) -> int:
        """A receive's source rank once its message is matched (-1 before; -1 for other ops)."""
        return self._w.source()


class WrappedWork(Work):
    """A handle around another one (``inner``: any handle with ``wait``; None for an operation
    that has already completed): ``wait()`` waits on it (passing ``timeout`` through when
    given), then runs ``_after_wait()`` once; the other methods ask ``inner``. The base of the
    wrappers that add a step after a collective (copy a result out, time the wait)."""

    __slots__ = ("_inner", "_waited")

    def __init__(self, inner=None):
        self._inner = inner
        self._waited = False

    def _after_wait(self) -> None:
        """Runs once, after the inner operation completed successfully."""

    def wait(self, timeout=None):
        if self._waited:
            return None
        r = None
        if self._inner is not None:
            r = self._inner.wait() if timeout is None else self._inner.wait(timeout)
        self._waited = True
        self._after_wait()
        return r

    def is_completed(self) -> bool:
        return self._waited or self._inner is None or bool(self._inner.is_completed())

    def exception(self):
        return None if self._inner is None else self._inner.exception()


def wait_until(done, timeout: Optional[float], what: str, poll=time.sleep) -> None:
    """Poll ``done()`` with a growing sleep (0.1 ms .. 10 ms) until it is true; without a timeout
    return at once (the caller then blocks in its own wait). ringcomm.TimeoutError naming
    ``what`` after ``timeout`` seconds."""
    if timeout is None:
        return
    deadline = time.monotonic() + timeout
    delay = 1e-4
    while not done():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} did not complete within {timeout} s")
        poll(delay)
        delay = min(delay * 2, 0.01)
