"""Running a hierarchical communicator's operations in issue order, and their handles."""
from __future__ import annotations

import collections
import threading
import time
from typing import Optional

from ..core.errors import ClosedError, RingcommError, TimeoutError
from ..core.work import Work

__all__ = ["HierWork", "Executor"]


class HierWork(Work):
    """Handle on an asynchronous hierarchical operation: wait(timeout=None), is_completed(),
    exception(), seq. ``_done`` is set by the thread that ran the operation once ``_handles``
    (inner point-to-point handles) and ``_error`` are final."""

    __slots__ = ("_done", "_handles", "_error", "_result", "seq", "_name")

    def __init__(self, name: str, seq: int, result=None):
        self._done = threading.Event()
        self._handles: tuple = ()
        self._error: Optional[BaseException] = None
        self._result = result
        self.seq = seq
        self._name = name

    def wait(self, timeout: Optional[float] = None):
        """Block until done (at most ``timeout`` seconds: ringcomm.TimeoutError after); raise the
        operation's error; return its result (the output array, or None)."""
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        if not self._done.wait(None if timeout is None else max(0.0, float(timeout))):
            raise TimeoutError(f"ringcomm: hierarchical {self._name} (seq {self.seq}) did not "
                               f"complete within {timeout} s")
        if self._error is not None:
            raise self._error
        for h in self._handles:
            h.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._result

    def is_completed(self) -> bool:
        if not self._done.is_set():
            return False
        return self._error is not None or all(h.is_completed() for h in self._handles)

    def exception(self) -> Optional[RingcommError]:
        if not self._done.is_set():
            return None
        if self._error is not None:
            return self._error
        for h in self._handles:
            e = h.exception()
            if e is not None:
                return e
        return None


class Executor:
    """Runs a communicator's operations one at a time, in issue order. A synchronous call with
    nothing queued runs inline on the caller's thread; otherwise operations run on one worker
    thread (started on first use). Point-to-point operations only *issue* here and complete
    through their inner handles, so posting a send and then a recv never blocks the queue."""

    def __init__(self, name: str):
        self._name = name
        self._cv = threading.Condition()
        self._q: collections.deque = collections.deque()
        self._pending = 0                 # queued or running on the worker
        self._run_lock = threading.Lock()  # held while an operation runs (worker or inline)
        self._thread: Optional[threading.Thread] = None
        self._stop = False

    def submit(self, work: HierWork, fn, run, async_op: bool) -> None:
        with self._cv:
            if self._stop:
                raise ClosedError(f"ringcomm: the communicator ({self._name}) is closing")
            if not async_op and self._pending == 0:
                self._run_lock.acquire()
                inline = True
            else:
                inline = False
                self._pending += 1
                self._q.append((work, fn))
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, args=(run,), daemon=True,
                                                    name=f"ringcomm-hier-{self._name}")
                    self._thread.start()
                self._cv.notify()
        if inline:
            try:
                run(work, fn)
            finally:
                self._run_lock.release()

    def _loop(self, run):
        while True:
            with self._cv:
                while not self._q and not self._stop:
                    self._cv.wait()
                if not self._q:
                    return
                work, fn = self._q.popleft()
            with self._run_lock:
                run(work, fn)
            with self._cv:
                self._pending -= 1

    def close(self, timeout: float) -> None:
        """Let queued operations finish, then stop the worker."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
            t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
