"""``torch.distributed.Work`` objects for the ringcomm backend, and the threads that complete them.

Life of an asynchronous collective:

1. The group's ``<op>`` (``collectives.py``) validates, stages inputs if it must (flattening a list, scaling for
   PREMUL_SUM), calls ringcomm's API with ``async_op=True`` and gets back one or more *handles*,
   and wraps them in a ``RingcommWork``. The call returns.
2. When somebody asks for the work's future (DDP does at once), the work goes to the group's
   ``Waiter``: its thread waits on handles in that order (ringcomm releases the GIL while it
   waits), runs the work's *finisher* (copying a flat result back into the caller's list, ...),
   and marks the work done. A work nobody asks a future of costs no thread hop.
3. If anybody asked for ``get_future()``, completing that future is handed to a small
   ``_CompletionPool``. Future callbacks run on the thread that completes the future, and some
   callbacks (PowerSGD) issue a collective and block on it; were they run on the waiter thread, that
   thread could never observe the inner collective finish. The pool grows a thread whenever every
   thread it has is busy, so a blocked callback never starves the completion of another.

``Work.wait()`` waits on the handles itself (it does not queue behind the waiter thread), runs
the finisher if the waiter has not yet, and raises ringcomm's error on failure. Whichever thread
finishes a work first does it under the work's lock; the other finds it done.

torch's Work contract (gloo's and NCCL's behaviour, which DDP comm hooks and torchft rely on):
when ``wait()`` returns, the future is complete with the value and every callback chained on it
before then has run; when ``wait()`` raises, the future holds that same exception. So ``wait()``
returns only once the completion it handed to the pool has run (``_fut_set``), and a future asked
for after the work finished is completed before ``get_future()`` returns it (inline: no callback
can be attached to it yet, so nothing but the completion itself runs on the caller's thread).

A collective that the caller will wait on at once (``opts.asyncOp`` false, as ``dist.all_reduce``
sets without ``async_op=True``) is run synchronously instead and returns an already-finished work:
no thread hop on the latency-critical path.
"""
from __future__ import annotations

import datetime
import queue
import threading
import time
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from ringcomm.core.work import Work

__all__ = ["TorchWork", "RingcommWork", "DoneWork", "MultiWork", "Waiter", "timeout_seconds"]

# Cap on completion threads per process group. Each blocked PowerSGD-style callback holds one;
# nesting deeper than this would be a program with that many collectives blocked in callbacks.
_MAX_COMPLETION_THREADS = 16

# The works whose future this thread is completing right now (their callbacks are running here):
# a callback that waits on such a work must not wait for its own completion to end.
_completing = threading.local()


def timeout_seconds(timeout, default: float) -> float:
    """torch passes ``timedelta(0)`` or a negative timedelta for "unset": use the group's."""
    if timeout is None:
        return default
    if isinstance(timeout, datetime.timedelta):
        s = timeout.total_seconds()
    else:
        s = float(timeout)
    return default if s <= 0 else s


class _CompletionPool:
    """Threads that complete torch futures (and so run their callbacks)."""

    def __init__(self, name: str):
        self._name = name
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._closed = False

    def submit(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._closed:
                # Shutting down: complete inline so that no future is left pending forever.
                run_inline = True
            else:
                run_inline = False
                if self._idle == 0 and len(self._threads) < _MAX_COMPLETION_THREADS:
                    t = threading.Thread(target=self._run, daemon=True,
                                         name=f"ringcomm-complete-{self._name}-{len(self._threads)}")
                    self._threads.append(t)
                    self._idle += 1
                    t.start()
                self._idle -= 1
                self._q.put(fn)
        if run_inline:
            fn()

    def _run(self) -> None:
        while True:
            fn = self._q.get()
            if fn is None:
                return
            try:
                fn()
            except BaseException:  # noqa: BLE001 - a failing callback must not kill the pool
                pass
            with self._lock:
                self._idle += 1

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._q.put(None)
        me = threading.current_thread()
        for t in threads:
            if t is not me:
                t.join()


class Waiter:
    """One thread per process group that waits on its works in issue order."""

    def __init__(self, name: str):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self.pool = _CompletionPool(name)
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"ringcomm-wait-{name}")
        self._started = False
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, work: "RingcommWork") -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("ringcomm: the process group has been shut down")
            if not self._started:
                self._started = True
                self._thread.start()
            self._q.put(work)

    def _run(self) -> None:
        while True:
            work = self._q.get()
            if work is None:
                return
            work._wait_and_finish(None)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
            if started:
                self._q.put(None)
        if started and self._thread is not threading.current_thread():
            self._thread.join()
        self.pool.close()


class TorchWork(dist.Work, Work):
    """The torch.distributed.Work methods every ringcomm work answers the same way, from
    ``_outputs``, ``_source`` and ``_duration_ms`` (and its own ``wait``)."""

    _duration_ms = 0.0
    _exc: BaseException | None = None

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def exception(self):
        return self._exc

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._outputs

    def source_rank(self) -> int:
        # ``_source``: a rank, or (a receive from any source) a callable giving it once matched
        s = self._source
        return s() if callable(s) else s

    def _source_rank(self) -> int:
        return self.source_rank()

    def synchronize(self) -> None:
        self.wait()

    def block_current_stream(self) -> None:
        self.wait()

    def _get_duration(self) -> float:
        return self._duration_ms


class RingcommWork(TorchWork):
    """A collective issued on the ringcomm backend.

    ``handles``: ringcomm API handles (``wait(timeout)``, ``is_completed()``, ``exception()``).
    ``outputs``: the tensors the future's value carries (torch's convention for each op).
    ``finisher``: run once after every handle succeeded, before the work counts as done.
    """

    def __init__(self, op: str, seq: int, handles: Sequence, outputs: list[torch.Tensor],
                 finisher: Callable[[], None] | None, timeout_s: float,
                 waiter: "Waiter | None", source_rank: int = -1):
        super().__init__()
        self._op = op
        self._seq = seq
        self._handles = list(handles)
        self._outputs = outputs
        self._finisher = finisher
        self._timeout_s = timeout_s
        self._waiter = waiter
        self._pool = waiter.pool if waiter is not None else None
        self._source = source_rank
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._exc: BaseException | None = None
        self._fut: torch.futures.Future | None = None
        self._public_fut: torch.futures.Future | None = None
        # set once ``_fut`` holds the outcome and its callbacks (those attached by then) have run
        self._fut_set = threading.Event()
        self._start = time.perf_counter()
        self._duration_ms = -1.0

    @classmethod
    def finished(cls, op: str, seq: int, outputs: list[torch.Tensor],
                 exc: BaseException | None = None, source_rank: int = -1) -> "RingcommWork":
        """A work whose collective already ran (synchronous path) or failed before issue."""
        w = cls(op, seq, (), outputs, None, 0.0, None, source_rank)
        w._exc = exc
        w._duration_ms = 0.0
        w._done.set()
        return w

    def __repr__(self) -> str:
        state = "done" if self._done.is_set() else "pending"
        return f"RingcommWork(op={self._op}, seq={self._seq}, {state})"

    # ---- completion -------------------------------------------------------------------------
    def _wait_and_finish(self, timeout_s: float | None) -> None:
        """Wait on every handle, then finish. Never raises except when ``timeout_s`` (one deadline
        for all the handles together) expires first."""
        if self._done.is_set():
            return
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        exc = None
        for h in self._handles:
            try:
                if deadline is None:
                    h.wait()
                else:
                    h.wait(max(0.0, deadline - time.monotonic()))
            except BaseException as e:  # noqa: BLE001 - recorded, re-raised by wait()
                if deadline is not None and not h.is_completed():
                    # The wait's deadline expired; the collective is still running.
                    raise
                exc = exc or e
        self._finish(exc)

    def _finish(self, exc: BaseException | None) -> None:
        with self._lock:
            if self._done.is_set():
                return
            if exc is None and self._finisher is not None:
                try:
                    self._finisher()
                except BaseException as e:  # noqa: BLE001
                    exc = e
            self._exc = exc
            self._finisher = None
            self._duration_ms = (time.perf_counter() - self._start) * 1e3
            self._done.set()
            fut = self._fut
        if fut is not None:
            self._complete_future(fut)

    def _complete_future(self, fut: torch.futures.Future, inline: bool = False) -> None:
        exc, outputs = self._exc, self._outputs

        def complete() -> None:
            mine = getattr(_completing, "works", None)
            if mine is None:
                mine = _completing.works = set()
            mine.add(id(self))
            try:
                if exc is not None:
                    fut.set_exception(exc)
                else:
                    fut.set_result(outputs)
            finally:
                mine.discard(id(self))
                self._fut_set.set()

        if self._pool is not None and not inline:
            self._pool.submit(complete)
        else:
            complete()

    def _await_future(self) -> None:
        """Return once the future (if anybody asked for one) holds the outcome: the contract that
        ``wait()`` returns or raises only after the future is complete."""
        if self._fut is None or self._fut_set.is_set():
            return
        if id(self) in getattr(_completing, "works", ()):
            return  # a callback of this very future, running on its completing thread
        self._fut_set.wait()

    # ---- torch.distributed.Work API -----------------------------------------------------------
    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Block until done, at most ``timeout`` or, when none is given, the group's timeout at
        issue; raise on failure (ringcomm.TimeoutError when the deadline expires first)."""
        if not self._done.is_set():
            t = timeout_seconds(timeout, self._timeout_s)
            self._wait_and_finish(t if 0 < t < float("inf") else None)
            if not self._done.is_set():  # another thread is finishing it right now
                self._done.wait()
        self._await_future()
        if self._exc is not None:
            raise self._exc
        return True

    def get_future(self) -> torch.futures.Future:
        """A future whose value is the list of output tensors; completed off the progress thread."""
        with self._lock:
            if self._public_fut is None:
                self._fut = torch.futures.Future()
                # A C++ consumer (DDP's reducer) sees an error only if it arises inside a callback;
                # ``set_exception`` on the root alone reads as success there.
                self._public_fut = self._fut.then(_reraise)
                done = self._done.is_set()
            else:
                return self._public_fut
        if done:
            self._complete_future(self._fut, inline=True)
        elif self._waiter is not None:
            # Somebody must now complete the future even if nobody calls wait(): the group's
            # waiter thread takes it (works nobody asks a future of never cost a thread hop).
            self._waiter.submit(self)
        return self._public_fut

    def is_completed(self) -> bool:
        return self._done.is_set()


_WORK_INIT = dist.Work.__init__


class DoneWork(TorchWork):
    """The work of a collective that already ran synchronously (and succeeded): cheap to make,
    since the synchronous path is the latency-critical one."""

    def __init__(self, op: str, seq: int, outputs: list[torch.Tensor], source_rank: int = -1):
        _WORK_INIT(self)  # not super().__init__(): a third cheaper, and this runs once per call
        self._d = (op, seq, outputs, source_rank)

    @property
    def _outputs(self) -> list[torch.Tensor]:
        return self._d[2]

    @property
    def _source(self) -> int:
        return self._d[3]

    def __repr__(self) -> str:
        return f"RingcommWork(op={self._d[0]}, seq={self._d[1]}, done)"

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        fut = torch.futures.Future()
        fut.set_result(self._outputs)
        return fut

    def is_completed(self) -> bool:
        return True


class MultiWork(TorchWork):
    """Several works as one (``_end_coalescing``)."""

    _source = -1

    def __init__(self, works: list[RingcommWork]):
        super().__init__()
        self._works = works

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        for w in self._works:
            w.wait(timeout)
        return True

    def get_future(self) -> torch.futures.Future:
        futs = [w.get_future() for w in self._works]
        if not futs:
            f = torch.futures.Future()
            f.set_result([])
            return f
        return torch.futures.collect_all(futs).then(
            lambda f: [t for sub in f.value() for t in sub.value()])

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def exception(self):
        for w in self._works:
            if w.exception() is not None:
                return w.exception()
        return None

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return [t for w in self._works for t in w._outputs]


def _reraise(fut: torch.futures.Future):
    return fut.value()
